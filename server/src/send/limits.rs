//! The velocity and quota stage: the counters a send takes (in the order they are
//! checked), the refusal a full one gives, and the counters a send really follows once
//! its reservation placed it among the concurrent sends.

use super::{SendError, Sender};
use crate::store::{Customer, Instance, LimitHit, PacingScopes, Reservation};
use gateway_policy_model as model;

pub(super) const DAY_MS: i64 = 24 * 60 * 60 * 1000;
const MINUTE_MS: i64 = 60 * 1000;
const HOUR_MS: i64 = 60 * MINUTE_MS;

impl Sender {
    /// Velocity (instance, recipient) and quota (day, plan period) counters of a send,
    /// in the order they are checked.
    pub(super) fn reservations(
        &self,
        customer: &Customer,
        instance: &Instance,
        to: &str,
        new_recipient: bool,
        now: i64,
    ) -> Vec<Reservation> {
        let plan = customer.plan.as_deref().and_then(|p| self.config.plan(p)).unwrap_or(&self.config.plans.starter);
        let o = &customer.overrides;
        let per_instance =
            o.instance_per_minute.or(plan.instance_per_minute).unwrap_or(self.config.limits.instance_per_minute);
        let per_recipient =
            o.recipient_per_minute.or(plan.recipient_per_minute).unwrap_or(self.config.limits.recipient_per_minute);
        let minute = now - now.rem_euclid(MINUTE_MS);
        let hour = now - now.rem_euclid(HOUR_MS);
        let day = now - now.rem_euclid(DAY_MS);
        let period_start = customer.plan_period_start.unwrap_or(day);
        let period_end = customer.plan_period_end.unwrap_or(day + DAY_MS);
        let mut reservations = vec![
            Reservation {
                scope: format!("inst:{}", instance.id),
                window_start: minute,
                expires_at: minute + 2 * MINUTE_MS,
                limit: per_instance.max(1),
            },
            Reservation {
                scope: format!("rcpt:{}:{}", instance.id, to),
                window_start: minute,
                expires_at: minute + 2 * MINUTE_MS,
                limit: per_recipient.max(1),
            },
            Reservation {
                scope: format!("day:{}", customer.id),
                window_start: day,
                expires_at: day + 2 * DAY_MS,
                limit: o.daily.unwrap_or(plan.daily_messages).max(1),
            },
            Reservation {
                scope: format!("month:{}", customer.id),
                window_start: period_start,
                expires_at: period_end + DAY_MS,
                limit: o.monthly.unwrap_or(plan.monthly_messages).max(1),
            },
            // Not limits: what the pacing policy reads (see `PacingScopes`).
            Reservation {
                scope: format!("{}{}", PacingScopes::INSTANCE_DAY, instance.id),
                window_start: day,
                expires_at: day + 2 * DAY_MS,
                limit: i64::MAX,
            },
            Reservation {
                scope: format!("{}{}:{to}", PacingScopes::RECIPIENT_HOUR, instance.id),
                window_start: hour,
                expires_at: hour + DAY_MS + HOUR_MS,
                limit: i64::MAX,
            },
        ];
        if new_recipient {
            reservations.push(Reservation {
                scope: format!("{}{}:{to}", PacingScopes::FIRST_CONTACT, instance.id),
                window_start: day,
                expires_at: day + 2 * DAY_MS,
                limit: 1,
            });
            reservations.push(Reservation {
                scope: format!("{}{}", PacingScopes::NEW_RECIPIENT_DAY, instance.id),
                window_start: day,
                expires_at: day + 2 * DAY_MS,
                limit: i64::MAX,
            });
        }
        reservations
    }
}

/// The counters a send really follows, from the values its reservation left (its place
/// among every send that took them): what it would have seen had the sends run one
/// after another.
pub(super) fn exact_counters(
    seen: &model::Counters,
    seen_hour: u32,
    rs: &[Reservation],
    counts: &[i64],
) -> model::Counters {
    let before = |prefix: &str| {
        rs.iter()
            .position(|r| r.scope.starts_with(prefix))
            .and_then(|i| counts.get(i))
            .map(|c| (c - 1).clamp(0, u32::MAX as i64) as u32)
    };
    let mut exact = seen.clone();
    if let Some(n) = before(PacingScopes::INSTANCE_DAY) {
        exact.sent_today = n;
    }
    if let Some(n) = before(PacingScopes::RECIPIENT_HOUR) {
        exact.to_recipient_24h = seen.to_recipient_24h.saturating_sub(seen_hour).saturating_add(n);
    }
    if let Some(n) = before(PacingScopes::NEW_RECIPIENT_DAY) {
        exact.new_recipients_today = n;
    }
    exact
}

/// The 429 of a full counter.
pub(super) fn limit_error(reservations: &[Reservation], hit: LimitHit, now: i64) -> SendError {
    let r = &reservations[hit.index];
    match hit.index {
        0 | 1 => SendError::Throttled {
            scope: if hit.index == 0 { "instance" } else { "recipient" },
            limit: r.limit,
            retry_after_seconds: ((r.window_start + MINUTE_MS - now + 999) / 1000).max(1),
        },
        2 => {
            let resets_at = r.window_start + DAY_MS;
            let retry_after_seconds = ((resets_at - now + 999) / 1000).max(1);
            SendError::DailyLimit { limit: r.limit, used: hit.used, resets_at, retry_after_seconds }
        }
        _ => {
            let resets_at = r.expires_at - DAY_MS;
            let retry_after_seconds = ((resets_at - now + 999) / 1000).max(1);
            SendError::MonthlyLimit { limit: r.limit, used: hit.used, resets_at, retry_after_seconds }
        }
    }
}

//! `/dashboard`: the customer's plan, usage against its limits, and how its sending is
//! going: sends per day for 30 days by outcome, delivered and read rates, refusals by
//! rule (charts from `charts`, each with its numbers as a table).

use super::charts::{self, Meter, MeterState, Series};
use super::roles::Action;
use super::session::{self, Viewer};
use super::views::{self, Notice};
use super::{Ctx, DashError, html, page, when};
use crate::config::PlanLimits;
use crate::store::{Customer, PlanStatus, now_ms};
use dropshot::{Body, HttpError, endpoint};
use http::{Response, StatusCode};
use maud::{Markup, html};

const DAY_MS: i64 = 24 * 3_600_000;

/// The limits in force for a customer: plan values unless an operator raised them.
pub struct Limits {
    pub plan: Option<PlanLimits>,
    pub daily: i64,
    pub monthly: i64,
    pub instance_per_minute: i64,
    pub recipient_per_minute: i64,
}

/// The limits of `customer` under `config` (what the send pipeline applies).
pub fn limits(config: &crate::config::Config, customer: &Customer) -> Limits {
    let plan = customer.plan.as_deref().and_then(|p| config.plan(p)).cloned();
    let base = plan.clone().unwrap_or_else(|| config.plans.starter.clone());
    let o = &customer.overrides;
    Limits {
        daily: o.daily.unwrap_or(base.daily_messages),
        monthly: o.monthly.unwrap_or(base.monthly_messages),
        instance_per_minute: o
            .instance_per_minute
            .or(base.instance_per_minute)
            .unwrap_or(config.limits.instance_per_minute),
        recipient_per_minute: o
            .recipient_per_minute
            .or(base.recipient_per_minute)
            .unwrap_or(config.limits.recipient_per_minute),
        plan,
    }
}

/// The 30 UTC days ending today, as chart labels ("11-25") and their start times.
pub fn last_days(now: i64, days: i64) -> Vec<(String, i64)> {
    let today = now - now.rem_euclid(DAY_MS);
    (0..days)
        .rev()
        .map(|back| {
            let day = today - back * DAY_MS;
            let label = chrono::DateTime::from_timestamp_millis(day).map(|t| t.format("%m-%d").to_string());
            (label.unwrap_or_default(), day)
        })
        .collect()
}

/// Sends per day by outcome, delivered and read rates, refusals by rule.
async fn activity(rqctx: &Ctx, customer_id: &str, now: i64) -> Result<Markup, DashError> {
    let store = &rqctx.context().store;
    let days = last_days(now, 30);
    let since = days[0].1;
    // Kept days and today's rows (`store::customer_days`), not 30 days of the log.
    // A day that retention could reach while the overview shows it is never kept.
    let retention = &rqctx.context().config.retention;
    let keep_from = now - (retention.message_log_days.min(retention.inbound_days) - 1) * DAY_MS;
    let activity = store.activity(customer_id, since, now, keep_from, 10).await?;
    let counts = &activity.days;
    let of = |pick: fn(&crate::store::insight::DayCounts) -> u64| -> Vec<u64> {
        days.iter().map(|(_, day)| counts.iter().find(|c| c.day == *day).map_or(0, pick)).collect()
    };
    let series = [
        Series { name: "sent".into(), class: "sent".into(), values: of(|c| c.sent) },
        Series { name: "refused".into(), class: "refused".into(), values: of(|c| c.refused) },
        Series { name: "failed".into(), class: "failed".into(), values: of(|c| c.failed) },
        Series { name: "unknown or pending".into(), class: "pending".into(), values: of(|c| c.unknown) },
    ];
    let labels: Vec<String> = days.iter().map(|(l, _)| l.clone()).collect();
    let delivery = &activity.delivery;
    let rate = |part: u64| if delivery.sent == 0 { 0.0 } else { part as f64 / delivery.sent as f64 };
    let rate_meter = |label: &str, part: u64| Meter {
        label: label.to_string(),
        value: rate(part) * 100.0,
        max: 100.0,
        display: format!(
            "{} ({} of {})",
            charts::percent(rate(part)),
            charts::thousands(part),
            charts::thousands(delivery.sent)
        ),
        state: MeterState::Ok,
        words: charts::LIMIT_WORDS,
    };
    let refusals = &activity.refusals;
    let total: u64 = series.iter().flat_map(|s| s.values.iter()).sum();
    Ok(html! {
        h2 { "The last 30 days" }
        div.grid.charts {
            (charts::stacked_columns("sends-per-day", "Send attempts per day",
                &format!("{} attempts in 30 days, per UTC day, by outcome: sent, refused, failed, unknown or pending.", charts::thousands(total)),
                &labels, &series))
            (charts::meters("delivery-rates", "Delivered and read",
                &format!("Of {} messages sent in 30 days, the share the network reported delivered and read.", charts::thousands(delivery.sent)),
                &[rate_meter("Delivered", delivery.delivered), rate_meter("Read", delivery.read)]))
            (charts::horizontal_bars("refusals-by-rule", "Refusals by rule",
                "Refused attempts in 30 days by the check or policy rule that refused them, most first.",
                refusals))
        }
    })
}

/// Status label of a plan.
pub fn plan_badge(status: PlanStatus) -> Markup {
    match status {
        PlanStatus::Active => views::badge("active", "ok"),
        PlanStatus::PendingApproval => views::badge("waiting for approval", "warn"),
        PlanStatus::Expired => views::badge("expired", "bad"),
        PlanStatus::None => views::badge("no plan", "muted"),
    }
}

async fn render(rqctx: &Ctx, viewer: &Viewer) -> Result<Markup, DashError> {
    let state = rqctx.context();
    let customer = viewer.customer()?;
    let now = now_ms();
    let day = now - now.rem_euclid(DAY_MS);
    let usage = state.store.usage(&customer.id, day, customer.plan_period_start.unwrap_or(day)).await?;
    let limits = limits(&state.config, customer);
    let status = customer.plan_status(now);
    let notice = (status != PlanStatus::Active).then(|| {
        Notice::Error(
            match status {
                PlanStatus::PendingApproval => {
                    "Your plan waits for an operator's approval; sends are refused until then."
                }
                PlanStatus::Expired => "Your plan period ended; sends are refused until it is renewed.",
                _ => "Your account has no plan yet; sends are refused until one is assigned.",
            }
            .to_string(),
        )
    });
    let instance_cap = limits.plan.as_ref().map(|p| p.instances).unwrap_or(0);
    let activity = activity(rqctx, &customer.id, now).await?;
    Ok(views::page(
        viewer,
        "/dashboard",
        "Overview",
        notice.as_ref(),
        html! {
            section.card {
                dl.facts {
                    dt { "Plan" } dd { (customer.plan.as_deref().unwrap_or("none")) " " (plan_badge(status)) }
                    @if let Some(end) = customer.plan_period_end { dt { "Current period ends" } dd { (when(end)) } }
                    dt { "Modules" } dd {
                        "api " (if customer.module_api { views::badge("on", "ok") } else { views::badge("off", "muted") })
                        " · pbx " (if customer.module_pbx { views::badge("on", "ok") } else { views::badge("off", "muted") })
                    }
                    dt { "Velocity" } dd { (limits.instance_per_minute) " sends a minute per instance, " (limits.recipient_per_minute) " a minute to one recipient" }
                }
            }
            div #usage {
                (charts::meters("usage-meters", "Usage against your limits",
                    "Messages today (UTC; resets at midnight UTC) against the daily limit, messages this 30-day plan period against the period limit, and paired phone numbers against the plan's instances.",
                    &[
                        Meter::usage("Messages today", usage.today.max(0) as u64, limits.daily.max(0) as u64),
                        Meter::usage("Messages this period", usage.period.max(0) as u64, limits.monthly.max(0) as u64),
                        Meter::usage("Instances", usage.instances.max(0) as u64, instance_cap.max(0) as u64),
                    ]))
            }
            p.hint { "Only messages the network accepted count. Need more? Operators raise limits after a review of your use case; see the " a href="/docs/responsible-messaging" { "guide" } "." }
            (activity)
        },
    ))
}

/// The overview page.
#[endpoint { method = GET, path = "/dashboard", unpublished = true }]
async fn overview_get(rqctx: Ctx) -> Result<Response<Body>, HttpError> {
    page(&rqctx, async {
        let viewer = session::viewer(&rqctx).await?;
        if viewer.customer.is_none() {
            return Ok(super::redirect("/operator"));
        }
        viewer.require(Action::Read)?;
        Ok(html(StatusCode::OK, render(&rqctx, &viewer).await?))
    })
    .await
}

pub fn register(api: &mut dropshot::ApiDescription<std::sync::Arc<crate::state::AppState>>) -> Result<(), String> {
    api.register(overview_get).map_err(|e| e.to_string())
}

//! What the dashboard's charts show, read from the tables the gateway keeps anyway
//! (message log, delivery states, contacts, counters, webhook attempts, outbox): sends
//! per day by outcome, delivered and read rates, refusals by rule, an instance's
//! ban-risk signals, webhook attempts by hour, and the operator's fleet. Read-only and
//! bounded by a time window; aggregated in SQL where both databases agree, in Rust
//! where a rule sits inside the policy trace.

use super::{Cols, FromCols, Store, StoreError};
use sqlx::Row;
use std::collections::BTreeMap;

const DAY_MS: i64 = 24 * 3_600_000;
const HOUR_MS: i64 = 3_600_000;

/// Send attempts of one UTC day, by what became of them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DayCounts {
    pub day: i64,
    pub sent: u64,
    pub refused: u64,
    pub failed: u64,
    /// Pending, or an outcome the provider never settled.
    pub unknown: u64,
}

/// Of the messages sent in a window, how many the provider reported delivered and read.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DeliveryCounts {
    pub sent: u64,
    pub delivered: u64,
    pub read: u64,
}

impl FromCols for DeliveryCounts {
    fn from_cols(r: &impl Cols) -> Result<DeliveryCounts, StoreError> {
        Ok(DeliveryCounts { sent: count(r, "sent")?, delivered: count(r, "delivered")?, read: count(r, "read_n")? })
    }
}

/// An instance's ban-risk signals over the last 7 days, and today's pacing counters.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RiskSignals {
    pub sends: u64,
    pub refused: u64,
    /// Recipients messaged in the window, and how many of them ever replied.
    pub recipients: u64,
    pub replied: u64,
    /// Recipients first messaged in the window.
    pub new_recipients: u64,
    /// Messages in the window to recipients who never replied.
    pub to_never_replied: u64,
    /// Today's sends and new recipients (the counters the pacing policy reads).
    pub sent_today: u64,
    pub new_today: u64,
}

/// Webhook delivery attempts of one hour.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HourAttempts {
    pub hour: i64,
    pub delivered: u64,
    pub failed: u64,
    pub p50_ms: u64,
    pub max_ms: u64,
}

/// The operator's view of the whole service.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Fleet {
    /// Sends per minute over the last hour, oldest first (60 values).
    pub sends_per_minute: Vec<(i64, u64)>,
    pub paused_instances: u64,
    pub review_pending: u64,
    pub review_oldest_at: Option<i64>,
    pub outbox_pending: u64,
    pub outbox_oldest_at: Option<i64>,
}

/// The text of a query of one customer's log rows (`customer_id = $1`, found through
/// the log's customer index) and of everyone's (`$1` is then ''), `$2` the start of the
/// window. One text for both, with `($1 = '' OR customer_id = $1)`, kept either database
/// from using that index: a customer's overview read 30 days of every customer's rows
/// (BENCHMARKS.md, "Flat as the data grows").
macro_rules! of_customer {
    ($columns:literal, $condition:literal, $tail:literal) => {
        [
            concat!($columns, " WHERE customer_id = $1 AND ", $condition, " ", $tail),
            concat!($columns, " WHERE $1 = '' AND ", $condition, " ", $tail),
        ]
    };
}

impl DayCounts {
    /// Counts `n` attempts of `decision` and `status` in their outcome: refused, sent,
    /// failed, or else unknown (pending too).
    pub fn add(&mut self, decision: &str, status: &str, n: u64) {
        match (decision, status) {
            ("refused", _) => self.refused += n,
            (_, "sent") => self.sent += n,
            (_, "failed") => self.failed += n,
            _ => self.unknown += n,
        }
    }
}

/// Rules by count, most first (ties by name), at most `limit`.
pub(super) fn top_rules(rules: BTreeMap<String, u64>, limit: usize) -> Vec<(String, u64)> {
    let mut rules: Vec<(String, u64)> = rules.into_iter().collect();
    rules.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    rules.truncate(limit);
    rules
}

pub(super) fn count(row: &impl Cols, column: &str) -> Result<u64, StoreError> {
    Ok(row.col::<Option<i64>>(column)?.unwrap_or(0).max(0) as u64)
}

/// The rule a refusal names: its error code, and for a policy's refusal the code the
/// policy gave (from the attempt's policy trace; a shadow's verdict never decided).
pub fn refusal_rule(error_code: Option<&str>, policy_trace: Option<&str>) -> String {
    let code = error_code.unwrap_or("unknown");
    if matches!(code, "policy_violation" | "message_purpose_not_allowed") {
        let trace: Vec<serde_json::Value> = policy_trace.and_then(|t| serde_json::from_str(t).ok()).unwrap_or_default();
        let rule = trace
            .iter()
            .find(|t| t["decision"] != "allow" && t["mode"] != "shadow")
            .and_then(|t| t["code"].as_str().or(t["fault"].as_str()).map(str::to_string));
        if let Some(rule) = rule {
            return format!("{code}: {rule}");
        }
    }
    code.to_string()
}

impl Store {
    /// The rows of an `of_customer!` query for `customer_id` (or everyone) since `since`.
    async fn log_rows_since(
        &self,
        texts: [&'static str; 2],
        customer_id: Option<&str>,
        since: i64,
    ) -> Result<Vec<sqlx::any::AnyRow>, StoreError> {
        let sql = if customer_id.is_some() { texts[0] } else { texts[1] };
        Ok(sqlx::query(sql).bind(customer_id.unwrap_or("")).bind(since).fetch_all(&self.read).await?)
    }

    /// Send attempts per UTC day since `since`, of one customer or of every one.
    pub async fn sends_per_day(&self, customer_id: Option<&str>, since: i64) -> Result<Vec<DayCounts>, StoreError> {
        const SQL: [&str; 2] = of_customer!(
            "SELECT created_at - (created_at % 86400000) AS day, decision, status, COUNT(*) AS n FROM message_log",
            "created_at >= $2",
            "GROUP BY 1, 2, 3"
        );
        let rows = self.log_rows_since(SQL, customer_id, since).await?;
        let mut days: BTreeMap<i64, DayCounts> = BTreeMap::new();
        for row in &rows {
            let day: i64 = row.try_get("day")?;
            let decision: String = row.try_get("decision")?;
            let status: String = row.try_get("status")?;
            let n = count(row, "n")?;
            days.entry(day).or_insert_with(|| DayCounts { day, ..DayCounts::default() }).add(&decision, &status, n);
        }
        Ok(days.into_values().collect())
    }

    /// Of a customer's messages sent since `since`, how many were delivered and read.
    pub async fn delivery_counts(&self, customer_id: &str, since: i64) -> Result<DeliveryCounts, StoreError> {
        let row = sqlx::query(
            "SELECT COUNT(*) AS sent, COUNT(s.delivered_at) AS delivered, COUNT(s.read_at) AS read_n \
             FROM message_log m LEFT JOIN message_status s \
             ON s.instance_id = m.instance_id AND s.external_message_id = m.provider_message_id \
             WHERE m.customer_id = $1 AND m.created_at >= $2 AND m.decision = 'allowed' AND m.status = 'sent'",
        )
        .bind(customer_id)
        .bind(since)
        .fetch_one(&self.read)
        .await?;
        DeliveryCounts::from_cols(&row)
    }

    /// Refusals since `since` by rule, most first (at most `limit` rules), of one
    /// customer or of every one.
    pub async fn refusals_by_rule(
        &self,
        customer_id: Option<&str>,
        since: i64,
        limit: usize,
    ) -> Result<Vec<(String, u64)>, StoreError> {
        const SQL: [&str; 2] = of_customer!(
            "SELECT error_code, policy_trace, COUNT(*) AS n FROM message_log",
            "created_at >= $2 AND decision = 'refused'",
            "GROUP BY error_code, policy_trace"
        );
        let rows = self.log_rows_since(SQL, customer_id, since).await?;
        let mut rules: BTreeMap<String, u64> = BTreeMap::new();
        for row in &rows {
            let code: Option<String> = row.try_get("error_code")?;
            let trace: Option<String> = row.try_get("policy_trace")?;
            *rules.entry(refusal_rule(code.as_deref(), trace.as_deref())).or_default() += count(row, "n")?;
        }
        Ok(top_rules(rules, limit))
    }

    /// An instance's ban-risk signals over the 7 days before `now`.
    pub async fn risk_signals(&self, instance_id: &str, now: i64) -> Result<RiskSignals, StoreError> {
        let since = now - 7 * DAY_MS;
        let day = now - now.rem_euclid(DAY_MS);
        let log = sqlx::query(
            "SELECT COUNT(CASE WHEN m.decision = 'allowed' THEN 1 END) AS sends, \
             COUNT(CASE WHEN m.decision = 'refused' THEN 1 END) AS refused, \
             COUNT(DISTINCT CASE WHEN m.decision = 'allowed' THEN m.recipient END) AS recipients, \
             COUNT(CASE WHEN m.decision = 'allowed' AND c.replies_total = 0 THEN 1 END) AS to_never_replied \
             FROM message_log m LEFT JOIN contacts c ON c.instance_id = m.instance_id AND c.phone = m.recipient \
             WHERE m.customer_id = (SELECT customer_id FROM instances WHERE id = $1) AND m.instance_id = $1 \
             AND m.created_at >= $2",
        )
        .bind(instance_id)
        .bind(since)
        .fetch_one(&self.read)
        .await?;
        let contacts = sqlx::query(
            "SELECT COUNT(CASE WHEN replies_total > 0 THEN 1 END) AS replied, \
             COUNT(CASE WHEN first_sent_at >= $2 THEN 1 END) AS new_recipients \
             FROM contacts WHERE instance_id = $1 AND last_sent_at >= $2",
        )
        .bind(instance_id)
        .bind(since)
        .fetch_one(&self.read)
        .await?;
        let counter = |scope: String| async move {
            let row = sqlx::query("SELECT count FROM usage_counters WHERE scope = $1 AND window_start = $2")
                .bind(scope)
                .bind(day)
                .fetch_optional(&self.read)
                .await?;
            Ok::<u64, StoreError>(row.map(|r| r.try_get::<i64, _>("count")).transpose()?.unwrap_or(0).max(0) as u64)
        };
        Ok(RiskSignals {
            sends: count(&log, "sends")?,
            refused: count(&log, "refused")?,
            recipients: count(&log, "recipients")?,
            replied: count(&contacts, "replied")?,
            new_recipients: count(&contacts, "new_recipients")?,
            to_never_replied: count(&log, "to_never_replied")?,
            sent_today: counter(format!("{}{instance_id}", super::PacingScopes::INSTANCE_DAY)).await?,
            new_today: counter(format!("{}{instance_id}", super::PacingScopes::NEW_RECIPIENT_DAY)).await?,
        })
    }

    /// Webhook attempts to an instance's endpoint per hour since `since`, oldest first,
    /// with their median and longest answer time.
    pub async fn webhook_hours(&self, instance_id: &str, since: i64) -> Result<Vec<HourAttempts>, StoreError> {
        let rows = sqlx::query(
            "SELECT attempted_at, succeeded, latency_ms FROM webhook_attempts \
             WHERE instance_id = $1 AND attempted_at >= $2 ORDER BY attempted_at LIMIT 100000",
        )
        .bind(instance_id)
        .bind(since)
        .fetch_all(&self.read)
        .await?;
        let mut hours: BTreeMap<i64, (HourAttempts, Vec<u64>)> = BTreeMap::new();
        for row in &rows {
            let at: i64 = row.try_get("attempted_at")?;
            let hour = at - at.rem_euclid(HOUR_MS);
            let (entry, latencies) =
                hours.entry(hour).or_insert_with(|| (HourAttempts { hour, ..HourAttempts::default() }, Vec::new()));
            if row.try_get::<Option<i64>, _>("succeeded")?.unwrap_or(0) != 0 {
                entry.delivered += 1;
            } else {
                entry.failed += 1;
            }
            latencies.push(row.try_get::<Option<i64>, _>("latency_ms")?.unwrap_or(0).max(0) as u64);
        }
        Ok(hours
            .into_values()
            .map(|(mut entry, mut latencies)| {
                latencies.sort_unstable();
                entry.p50_ms = latencies.get(latencies.len() / 2).copied().unwrap_or(0);
                entry.max_ms = latencies.last().copied().unwrap_or(0);
                entry
            })
            .collect())
    }

    /// Events waiting for an instance's endpoint, and the oldest one's time.
    pub async fn instance_backlog(&self, instance_id: &str) -> Result<(u64, Option<i64>), StoreError> {
        let row = sqlx::query(
            "SELECT COUNT(*) AS n, MIN(created_at) AS oldest FROM outbox WHERE instance_id = $1 AND delivered_at IS NULL",
        )
        .bind(instance_id)
        .fetch_one(&self.read)
        .await?;
        Ok((count(&row, "n")?, row.try_get("oldest")?))
    }

    /// The whole service at `now`: sends a minute over the last hour, paused
    /// instances, the review queue and the webhook backlog.
    pub async fn fleet(&self, now: i64) -> Result<Fleet, StoreError> {
        let minute = now - now.rem_euclid(60_000);
        let since = minute - 59 * 60_000;
        let rows = sqlx::query(
            "SELECT created_at - (created_at % 60000) AS minute, COUNT(*) AS n FROM message_log \
             WHERE created_at >= $1 AND decision = 'allowed' GROUP BY 1",
        )
        .bind(since)
        .fetch_all(&self.read)
        .await?;
        let mut per_minute: BTreeMap<i64, u64> = (0..60).map(|i| (since + i * 60_000, 0)).collect();
        for row in &rows {
            let m: i64 = row.try_get("minute")?;
            if let Some(n) = per_minute.get_mut(&m) {
                *n += count(row, "n")?;
            }
        }
        let paused = sqlx::query("SELECT COUNT(*) AS n FROM instances WHERE paused <> 0").fetch_one(&self.read).await?;
        let review =
            sqlx::query("SELECT COUNT(*) AS n, MIN(created_at) AS oldest FROM review_queue WHERE status = 'pending'")
                .fetch_one(&self.read)
                .await?;
        let (pending, oldest) = self.outbox_backlog().await?;
        Ok(Fleet {
            sends_per_minute: per_minute.into_iter().collect(),
            paused_instances: count(&paused, "n")?,
            review_pending: count(&review, "n")?,
            review_oldest_at: review.try_get("oldest")?,
            outbox_pending: pending.max(0) as u64,
            outbox_oldest_at: oldest,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_policy_refusal_is_named_by_the_rule_in_its_trace() {
        let trace = r#"[{"module":"purpose","decision":"allow"},{"module":"content","decision":"deny","code":"marketing_content"}]"#;
        assert_eq!(refusal_rule(Some("policy_violation"), Some(trace)), "policy_violation: marketing_content");
        assert_eq!(refusal_rule(Some("recipient_suppressed"), Some(trace)), "recipient_suppressed");
        assert_eq!(refusal_rule(Some("policy_violation"), None), "policy_violation");
        assert_eq!(refusal_rule(None, None), "unknown");
    }
}

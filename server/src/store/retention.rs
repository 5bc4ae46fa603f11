//! Retention: every table that grows with traffic loses its rows past their time, in
//! one place ([`Store::run_retention`]), run by a background job on every gateway and
//! by `gateway retention run`. Deletes go in batches ([`BATCH`] rows on PostgreSQL; on
//! SQLite as many as take about [`SQLITE_HOLD`], with a pause after each), so a large
//! backlog never holds the database's write lock for long (replicas and the SQLite
//! writer keep going between batches); running on several replicas at once is
//! harmless (a row is deleted once).
//!
//! Never deleted here: a message-log row whose attempt is still `pending` (the orphan
//! sweep settles it first), an undelivered webhook event, a review item waiting for a
//! decision, a suppression (an opt-out is kept for as long as the customer exists).

use super::writer::{Exec, Statement};
use super::{Backend, Store, StoreError};
use rusqlite::types::Value as SqlValue;
use serde::Serialize;
use std::sync::LazyLock;
use std::time::Duration;

/// Rows deleted per statement (PostgreSQL).
pub const BATCH: i64 = 5_000;
/// How long one batch of deletes may hold SQLite's write lock, which every send's write
/// needs. Batches of 5,000 rows and then of 500 (rows of the message log take their
/// seven indexes with them) stopped sends for 100 to 300 ms, then 40 to 280 ms, while a
/// day of a 1 M-row log went (p99 at 1,000 req/s; BENCHMARKS.md). Each batch is now
/// sized from the last one's time to take about this long, and retention then waits
/// [`SQLITE_PAUSE`] times as long, so that sends' writes get the lock at least four
/// fifths of the time.
pub const SQLITE_HOLD: Duration = Duration::from_millis(2);
/// The pause after a SQLite batch, in multiples of the time the batch took.
pub const SQLITE_PAUSE: u32 = 4;
/// The first SQLite batch, and the bounds of every other.
const SQLITE_ROWS: (i64, i64, i64) = (50, 10, 500);

/// The cut-off times of one run (Unix ms): rows older than these go.
#[derive(Clone, Debug)]
pub struct RetentionPlan {
    pub now: i64,
    pub message_log_before: i64,
    pub inbound_before: i64,
    pub provider_events_applied_before: i64,
    pub provider_events_failed_before: i64,
    pub review_before: i64,
    pub contacts_before: i64,
    pub webhooks_before: i64,
    pub pbx_events_before: i64,
    /// Replayed PBX signatures are remembered this far back.
    pub pbx_signatures_before_seconds: i64,
    /// What the policy modules saw of each send (`[policies] input_retention_days`).
    pub policy_inputs_before: i64,
}

/// The delete of one batch of a step's rows (`$1` the cut-off, `$2` how many), on SQLite
/// and on PostgreSQL, made once (the writer takes its statements as `&'static str`).
static DELETES: LazyLock<Vec<[String; 2]>> = LazyLock::new(|| {
    let delete = |table: &str, condition: &str, key: &str| {
        format!("DELETE FROM {table} WHERE ({key}) IN (SELECT {key} FROM {table} WHERE {condition} LIMIT $2)")
    };
    STEPS
        .iter()
        .map(|(table, condition, _)| {
            // SQLite's tables without a rowid are named by their primary key.
            let sqlite_key = if *table == "pbx_seen_signatures" { "ts, integration_id, signature" } else { "rowid" };
            [delete(table, condition, sqlite_key), delete(table, condition, "ctid")]
        })
        .collect()
});

/// Rows one run deleted from one table.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct Pruned {
    pub table: &'static str,
    pub rows: u64,
}

/// (table, condition on its rows, the plan's cut-off bound to `$1`).
type Step = (&'static str, &'static str, fn(&RetentionPlan) -> i64);

/// Every table that grows with traffic, and when its rows go.
const STEPS: &[Step] = &[
    ("policy_inputs", "created_at < $1", |p| p.policy_inputs_before.max(p.message_log_before)),
    ("message_log", "created_at < $1 AND status <> 'pending'", |p| p.message_log_before),
    ("inbound_messages", "received_at < $1", |p| p.inbound_before),
    ("message_status", "updated_at < $1", |p| p.inbound_before),
    ("calls", "seen_at < $1", |p| p.inbound_before),
    ("provider_events", "received_at < $1 AND processed_at IS NOT NULL AND error IS NULL", |p| {
        p.provider_events_applied_before
    }),
    ("provider_events", "received_at < $1 AND (processed_at IS NULL OR error IS NOT NULL)", |p| {
        p.provider_events_failed_before
    }),
    ("review_queue", "status <> 'pending' AND decided_at < $1", |p| p.review_before),
    (
        "contacts",
        "last_sent_at < $1 AND NOT EXISTS (SELECT 1 FROM contact_activity a WHERE a.instance_id = contacts.instance_id \
         AND a.phone = contacts.phone AND a.last_inbound_at >= $1)",
        |p| p.contacts_before,
    ),
    (
        "contact_activity",
        "last_inbound_at < $1 AND NOT EXISTS (SELECT 1 FROM contacts c WHERE c.instance_id = contact_activity.instance_id \
         AND c.phone = contact_activity.phone AND c.last_sent_at >= $1)",
        |p| p.contacts_before,
    ),
    ("lid_map", "learned_at < $1", |p| p.contacts_before),
    ("webhook_attempts", "attempted_at < $1", |p| p.webhooks_before),
    ("outbox", "delivered_at IS NOT NULL AND delivered_at < $1", |p| p.webhooks_before),
    ("pbx_events", "created_at < $1", |p| p.pbx_events_before),
    ("pbx_seen_signatures", "ts < $1", |p| p.pbx_signatures_before_seconds),
    ("pbx_cooldowns", "until_at < $1", |p| p.now),
    ("rate_limits", "expires_at < $1", |p| p.now),
    ("usage_counters", "expires_at < $1", |p| p.now),
    ("idempotency_keys", "expires_at < $1", |p| p.now),
    ("dashboard_login_throttle", "window_start < $1 AND next_allowed_at < $1", |p| {
        p.now - crate::store::THROTTLE_WINDOW_MS
    }),
    ("dashboard_sessions", "expires_at < $1", |p| p.now),
    ("dashboard_invitations", "expires_at < $1", |p| p.now),
    ("policy_commands", "created_at < $1", |p| p.now - 24 * 3_600_000),
    ("policy_gateways", "heartbeat_at < $1", |p| p.now - 24 * 3_600_000),
];

/// The size of the next SQLite batch: the last one's, scaled to take [`SQLITE_HOLD`]
/// (at most twice as many at a time), within `bounds`.
fn next_sqlite_batch(size: i64, took: Duration, (fewest, most): (i64, i64)) -> i64 {
    let scaled = size as f64 * SQLITE_HOLD.as_secs_f64() / took.as_secs_f64().max(1e-6);
    (scaled as i64).min(size * 2).clamp(fewest, most)
}

/// The tables retention keeps short, each named once.
pub fn tables() -> Vec<&'static str> {
    let mut tables: Vec<&'static str> = STEPS.iter().map(|(t, _, _)| *t).collect();
    tables.dedup();
    tables
}

impl Store {
    /// Deletes every row past its time; what each table lost.
    pub async fn run_retention(&self, plan: &RetentionPlan) -> Result<Vec<Pruned>, StoreError> {
        let mut report: Vec<Pruned> = Vec::new();
        let (first, fewest, most) = SQLITE_ROWS;
        let mut size = match self.backend {
            Backend::Sqlite => first,
            Backend::Postgres => BATCH,
        };
        for ((table, _, cut_off), [sqlite, postgres]) in STEPS.iter().zip(DELETES.iter()) {
            let at = cut_off(plan);
            let mut rows = 0;
            loop {
                let started = tokio::time::Instant::now();
                let done = match self.backend {
                    // On SQLite through the store's writer, between the sends' writes:
                    // from another connection each batch waited for the lock, and the
                    // writer then slept in SQLite's busy handler.
                    Backend::Sqlite => {
                        let params = vec![SqlValue::Integer(at), SqlValue::Integer(size)];
                        let delete = Statement { sql: sqlite.as_str(), params };
                        self.write(Exec(vec![delete])).await?.first().copied().unwrap_or(0)
                    }
                    Backend::Postgres => {
                        sqlx::query(postgres).bind(at).bind(size).execute(&self.write).await?.rows_affected()
                    }
                };
                rows += done;
                if done < size as u64 {
                    break;
                }
                match self.backend {
                    Backend::Sqlite => {
                        let took = started.elapsed();
                        size = next_sqlite_batch(size, took, (fewest, most));
                        tokio::time::sleep((took * SQLITE_PAUSE).max(Duration::from_millis(1))).await;
                    }
                    Backend::Postgres => tokio::task::yield_now().await,
                }
            }
            match report.iter_mut().find(|p| p.table == *table) {
                Some(p) => p.rows += rows,
                None => report.push(Pruned { table, rows }),
            }
        }
        Ok(report)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sqlite_batch_is_sized_to_hold_the_lock_about_two_milliseconds() {
        let ms = Duration::from_millis;
        // Twice as long as it should: half as many next time.
        assert_eq!(next_sqlite_batch(100, ms(4), (10, 500)), 50);
        // Quick: more, but never more than twice as many at once.
        assert_eq!(next_sqlite_batch(100, Duration::from_micros(1500), (10, 500)), 133);
        assert_eq!(next_sqlite_batch(100, Duration::from_micros(10), (10, 500)), 200);
        // Within the bounds, whatever the clock said.
        assert_eq!(next_sqlite_batch(10, ms(400), (10, 500)), 10);
        assert_eq!(next_sqlite_batch(400, Duration::ZERO, (10, 500)), 500);
    }
}

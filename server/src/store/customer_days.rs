//! A customer's days, counted once (issue 22, item 3: counters kept rather than counted
//! on read; docs/architecture.md, "A customer's days, counted once").
//!
//! The dashboard's overview shows a customer's last 30 UTC days: send attempts by
//! outcome, how many of those sent were reported delivered and read, and refusals by
//! rule. Counted from the message log at every view, it grew with the customer's rows
//! (831 ms on PostgreSQL for a customer holding a million). Now a day is counted from its
//! rows once it has closed and kept in `customer_days`; a view reads the kept days and
//! counts from the log only the others (today, and a day not kept yet).
//!
//! A day is kept once it ended [`CLOSED_AFTER_MS`] ago with none of its sends pending:
//! its outcomes are settled then, but for what the provider tells later. Each such later
//! change keeps the kept day exact, in the change's own transaction:
//! - a delivery or read report, or an echo that settles a send whose outcome was unknown
//!   (`store::ingress::apply`): [`apply_changes`] adds the send's difference to its kept day;
//! - a person's erasure (`store::privacy`): [`forget`] drops the customer's kept days;
//! - retention drops the days whose rows or reports it deletes (`store::retention`),
//!   before it deletes them; and a view never keeps a day that retention could reach
//!   while the overview shows it (`keep_from`).
//!
//! Each change also moves a generation on (`customer_day_changes`: the day's, or for an
//! erasure the customer's), and a count is kept only if the generations read before it
//! was counted still hold when it is written. Every transaction that moves a generation
//! or keeps a day first locks the customer's own row of that table (day -1), and takes
//! no other lock after it but those of this module's rows (a post applies its changes
//! last, an erasure forgets last): so on PostgreSQL, too, no change can commit between a
//! keep's check and its commit, and the lock closes no cycle. On PostgreSQL the posts
//! about one message of a closed day are also applied one at a time (an advisory lock,
//! `store::ingress::apply`), so that each counts its difference from what the last one
//! left. A change that commits while a day is being counted makes that count be dropped,
//! never kept stale.

use super::insight::{DayCounts, DeliveryCounts, count, refusal_rule, top_rules};
use super::{Backend, Store, StoreError};
use sqlx::{Any, Row, Transaction};
use std::collections::BTreeMap;

const DAY_MS: i64 = 86_400_000;

/// How long after its end a day is counted and kept: longer than any send of it takes to
/// settle, and than the clocks of gateways sharing a store differ (a change to a send
/// moves its day's generation on from the moment the day ended by the changer's clock).
pub const CLOSED_AFTER_MS: i64 = 3_600_000;

/// The generation of the customer's as a whole (moved on by an erasure).
const CUSTOMER: i64 = -1;

/// One day of a customer's send attempts, counted.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Day {
    counts: DayCounts,
    delivered: u64,
    read: u64,
    refusals: BTreeMap<String, u64>,
    /// Sends of the day still pending: a day with any is not kept.
    pending: u64,
}

/// A customer's last days, as the overview shows them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Activity {
    /// Each day of the window, oldest first.
    pub days: Vec<DayCounts>,
    /// Of the window's sent messages, how many were reported delivered and read.
    pub delivery: DeliveryCounts,
    /// Refusals by rule, most first.
    pub refusals: Vec<(String, u64)>,
}

/// What one send counts for in its customer's day (`apply_changes`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(in crate::store) struct SendCount {
    pub customer_id: String,
    pub created_at: i64,
    pub decision: String,
    pub status: String,
    /// Its provider's report: delivered, read.
    pub delivered: bool,
    pub read: bool,
}

impl Day {
    fn empty(day: i64) -> Day {
        Day { counts: DayCounts { day, ..DayCounts::default() }, ..Day::default() }
    }
}

impl SendCount {
    /// (sent, refused, failed, unknown, delivered, read), as the overview counts it.
    fn columns(&self) -> [i64; 6] {
        let mut c = DayCounts::default();
        c.add(&self.decision, &self.status, 1);
        let sent = c.sent == 1;
        [c.sent, c.refused, c.failed, c.unknown, u64::from(sent && self.delivered), u64::from(sent && self.read)]
            .map(|n| n as i64)
    }
}

fn day_of(at: i64) -> i64 {
    at - at.rem_euclid(DAY_MS)
}

/// Moves a closed day's generation on (or the customer's: [`CUSTOMER`]), in a change's
/// transaction (which, for a day, holds the customer's lock already).
async fn move_on(tx: &mut Transaction<'static, Any>, customer_id: &str, day: i64) -> Result<(), StoreError> {
    sqlx::query(
        "INSERT INTO customer_day_changes (customer_id, day, gen) VALUES ($1, $2, 1) \
         ON CONFLICT (customer_id, day) DO UPDATE SET gen = customer_day_changes.gen + 1",
    )
    .bind(customer_id)
    .bind(day)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// Whether a send of `created_at` is of a UTC day that has closed by `now`.
pub(in crate::store) fn closed(created_at: i64, now: i64) -> bool {
    day_of(created_at) + DAY_MS <= now
}

/// Sends of days that have closed (by `now`) changed from `.0` to `.1`, in `tx`, whose
/// other locks are all taken: each kept day counts the difference, and each such day's
/// generation moves on, the customer's lock taken first. Sends of today change nothing
/// here (today is never kept).
pub(in crate::store) async fn apply_changes(
    tx: &mut Transaction<'static, Any>,
    changes: &[(SendCount, SendCount)],
    now: i64,
) -> Result<(), StoreError> {
    let mut days: BTreeMap<(&str, i64), [i64; 6]> = BTreeMap::new();
    for (before, after) in changes.iter().filter(|(_, after)| closed(after.created_at, now)) {
        let sum = days.entry((after.customer_id.as_str(), day_of(after.created_at))).or_default();
        for ((sum, is), was) in sum.iter_mut().zip(after.columns()).zip(before.columns()) {
            *sum += is - was;
        }
    }
    days.retain(|_, sum| sum.iter().any(|n| *n != 0));
    let mut locked = None;
    for ((customer_id, day), sum) in days {
        if locked != Some(customer_id) {
            locked_generation(tx, customer_id).await?;
            locked = Some(customer_id);
        }
        move_on(tx, customer_id, day).await?;
        let mut update = sqlx::query(
            "UPDATE customer_days SET sent = sent + $3, refused = refused + $4, failed = failed + $5, \
             unknown = unknown + $6, delivered = delivered + $7, read_n = read_n + $8 \
             WHERE customer_id = $1 AND day = $2",
        )
        .bind(customer_id)
        .bind(day);
        for n in sum {
            update = update.bind(n);
        }
        update.execute(&mut **tx).await?;
    }
    Ok(())
}

/// Drops a customer's kept days (an erasure changed rows of any of them), in its
/// transaction: each is counted again from the log at the next view.
pub(in crate::store) async fn forget(tx: &mut Transaction<'static, Any>, customer_id: &str) -> Result<(), StoreError> {
    move_on(tx, customer_id, CUSTOMER).await?;
    sqlx::query("DELETE FROM customer_days WHERE customer_id = $1").bind(customer_id).execute(&mut **tx).await?;
    Ok(())
}

/// The counts of a customer's rows from `from` to `to` (whole days), by day, in three
/// statements (outcomes, delivery reports, refusals). On SQLite, which keeps no
/// statistics, each reads the customer's index from the first id of the range on (found
/// in the time index, which holds each row's id), so that neither the customer's whole
/// log nor every customer's rows of the range are read; PostgreSQL plans by its own.
const OUTCOMES: [&str; 2] = [
    "SELECT created_at - (created_at % 86400000) AS day, decision, status, COUNT(*) AS n FROM message_log \
     WHERE customer_id = $1 AND id >= $4 AND +created_at >= $2 AND +created_at < $3 GROUP BY 1, 2, 3",
    "SELECT created_at - (created_at % 86400000) AS day, decision, status, COUNT(*) AS n FROM message_log \
     WHERE customer_id = $1 AND created_at >= $2 AND created_at < $3 GROUP BY 1, 2, 3",
];
/// The reports of the rows, on SQLite; on PostgreSQL for more than [`SHORT`] (a join,
/// which it makes by hashing every report); and for the rest (a report looked up a row: a
/// hash of every report took 130 ms for a day of 7,330 rows against 21 ms).
const REPORTS: [&str; 3] = [
    "SELECT m.created_at - (m.created_at % 86400000) AS day, COUNT(s.delivered_at) AS delivered, \
     COUNT(s.read_at) AS read_n FROM message_log m LEFT JOIN message_status s \
     ON s.instance_id = m.instance_id AND s.external_message_id = m.provider_message_id \
     WHERE m.customer_id = $1 AND m.id >= $4 AND +m.created_at >= $2 AND +m.created_at < $3 \
     AND m.decision = 'allowed' AND m.status = 'sent' GROUP BY 1",
    "SELECT m.created_at - (m.created_at % 86400000) AS day, COUNT(s.delivered_at) AS delivered, \
     COUNT(s.read_at) AS read_n FROM message_log m LEFT JOIN message_status s \
     ON s.instance_id = m.instance_id AND s.external_message_id = m.provider_message_id \
     WHERE m.customer_id = $1 AND m.created_at >= $2 AND m.created_at < $3 \
     AND m.decision = 'allowed' AND m.status = 'sent' GROUP BY 1",
    "SELECT m.created_at - (m.created_at % 86400000) AS day, COUNT(s.delivered_at) AS delivered, \
     COUNT(s.read_at) AS read_n FROM message_log m LEFT JOIN LATERAL (SELECT x.delivered_at, x.read_at \
     FROM message_status x WHERE x.instance_id = m.instance_id AND x.external_message_id = m.provider_message_id \
     LIMIT 1) s ON true WHERE m.customer_id = $1 AND m.created_at >= $2 AND m.created_at < $3 \
     AND m.decision = 'allowed' AND m.status = 'sent' GROUP BY 1",
];
/// A range of days short enough that PostgreSQL looks each row's report up.
const SHORT: i64 = 2 * DAY_MS;
const REFUSALS: [&str; 2] = [
    "SELECT created_at - (created_at % 86400000) AS day, error_code, policy_trace, COUNT(*) AS n FROM message_log \
     WHERE customer_id = $1 AND id >= $4 AND +created_at >= $2 AND +created_at < $3 AND decision = 'refused' \
     GROUP BY 1, 2, 3",
    "SELECT created_at - (created_at % 86400000) AS day, error_code, policy_trace, COUNT(*) AS n FROM message_log \
     WHERE customer_id = $1 AND created_at >= $2 AND created_at < $3 AND decision = 'refused' GROUP BY 1, 2, 3",
];
/// The first id of a range of time, read from the time index alone (`id + 0` keeps
/// SQLite from walking the table in id order instead).
const FIRST_ID: &str = "SELECT MIN(id + 0) AS lo FROM message_log WHERE created_at >= $1 AND created_at < $2";

impl Store {
    /// A customer's send attempts by day from `since` (rounded down to its UTC day) to
    /// `now`, with the delivery reports and refusals of that window: the kept days as
    /// kept, the others counted from the log (and kept, those that have closed and start
    /// at or after `keep_from`: retention may be deleting the rows of an older one).
    pub async fn activity(
        &self,
        customer_id: &str,
        since: i64,
        now: i64,
        keep_from: i64,
        limit: usize,
    ) -> Result<Activity, StoreError> {
        let since = day_of(since);
        let today = day_of(now);
        // The generations before the count: the count is kept only if they still hold.
        let generations = self.generations(customer_id, since).await?;
        let mut days = self.kept_days(customer_id, since).await?;
        let all: Vec<i64> = (0..=(today - since) / DAY_MS).map(|n| since + n * DAY_MS).collect();
        if let Some(&from) = all.iter().find(|d| !days.contains_key(d)) {
            let mut counted = self.count_days(customer_id, from, today + DAY_MS).await?;
            let mut keep = Vec::new();
            for &day in all.iter().filter(|d| **d >= from) {
                if days.contains_key(&day) {
                    continue;
                }
                let counted = counted.remove(&day).unwrap_or_else(|| Day::empty(day));
                if day >= keep_from && day + DAY_MS + CLOSED_AFTER_MS <= now && counted.pending == 0 {
                    keep.push(counted.clone());
                }
                days.insert(day, counted);
            }
            // The answer is counted either way: a keep that fails (the store busy, say)
            // is tried again at the next view.
            if !keep.is_empty() {
                let _ = self.keep_days(customer_id, &generations, &keep).await;
            }
        }
        let mut activity = Activity::default();
        let mut refusals: BTreeMap<String, u64> = BTreeMap::new();
        for day in days.into_values() {
            activity.delivery.sent += day.counts.sent;
            activity.delivery.delivered += day.delivered;
            activity.delivery.read += day.read;
            for (rule, n) in day.refusals {
                *refusals.entry(rule).or_default() += n;
            }
            activity.days.push(day.counts);
        }
        activity.refusals = top_rules(refusals, limit);
        Ok(activity)
    }

    /// The generations of the customer and of its days from `since` (none: 0).
    async fn generations(&self, customer_id: &str, since: i64) -> Result<BTreeMap<i64, i64>, StoreError> {
        sqlx::query("SELECT day, gen FROM customer_day_changes WHERE customer_id = $1 AND (day = $2 OR day >= $3)")
            .bind(customer_id)
            .bind(CUSTOMER)
            .bind(since)
            .fetch_all(&self.read)
            .await?
            .iter()
            .map(|r| Ok((r.try_get("day")?, r.try_get("gen")?)))
            .collect()
    }

    /// The customer's kept days from `since`.
    async fn kept_days(&self, customer_id: &str, since: i64) -> Result<BTreeMap<i64, Day>, StoreError> {
        let rows = sqlx::query(
            "SELECT day, sent, refused, failed, unknown, delivered, read_n, refusals FROM customer_days \
             WHERE customer_id = $1 AND day >= $2",
        )
        .bind(customer_id)
        .bind(since)
        .fetch_all(&self.read)
        .await?;
        let mut days = BTreeMap::new();
        for r in &rows {
            let day: i64 = r.try_get("day")?;
            let refusals: String = r.try_get("refusals")?;
            let kept = Day {
                counts: DayCounts {
                    day,
                    sent: count(r, "sent")?,
                    refused: count(r, "refused")?,
                    failed: count(r, "failed")?,
                    unknown: count(r, "unknown")?,
                },
                delivered: count(r, "delivered")?,
                read: count(r, "read_n")?,
                refusals: serde_json::from_str(&refusals).unwrap_or_default(),
                pending: 0,
            };
            days.insert(day, kept);
        }
        Ok(days)
    }

    /// A customer's rows from `from` to `to`, counted by day.
    async fn count_days(&self, customer_id: &str, from: i64, to: i64) -> Result<BTreeMap<i64, Day>, StoreError> {
        let (which, first) = match self.backend {
            Backend::Sqlite => {
                let lo: Option<i64> = sqlx::query(FIRST_ID)
                    .bind(from)
                    .bind(to)
                    .fetch_one(&self.read)
                    .await?
                    .try_get::<Option<i64>, _>("lo")?;
                let Some(lo) = lo else {
                    return Ok(BTreeMap::new());
                };
                (0, lo)
            }
            Backend::Postgres => (1, 0),
        };
        let run = |sql: &'static str| {
            let query = sqlx::query(sql).bind(customer_id).bind(from).bind(to);
            let query = if which == 0 { query.bind(first) } else { query };
            query.fetch_all(&self.read)
        };
        let mut days: BTreeMap<i64, Day> = BTreeMap::new();
        for r in &run(OUTCOMES[which]).await? {
            let day: i64 = r.try_get("day")?;
            let decision: String = r.try_get("decision")?;
            let status: String = r.try_get("status")?;
            let n = count(r, "n")?;
            let d = days.entry(day).or_insert_with(|| Day::empty(day));
            d.counts.add(&decision, &status, n);
            if status == "pending" {
                d.pending += n;
            }
        }
        let reports = if which == 1 && to - from <= SHORT { REPORTS[2] } else { REPORTS[which] };
        for r in &run(reports).await? {
            let day: i64 = r.try_get("day")?;
            if let Some(d) = days.get_mut(&day) {
                d.delivered += count(r, "delivered")?;
                d.read += count(r, "read_n")?;
            }
        }
        for r in &run(REFUSALS[which]).await? {
            let day: i64 = r.try_get("day")?;
            let code: Option<String> = r.try_get("error_code")?;
            let trace: Option<String> = r.try_get("policy_trace")?;
            if let Some(d) = days.get_mut(&day) {
                *d.refusals.entry(refusal_rule(code.as_deref(), trace.as_deref())).or_default() += count(r, "n")?;
            }
        }
        Ok(days)
    }

    /// Keeps the closed days counted, each only if its generation and the customer's
    /// are still those read before the count (`generations`): read again under the
    /// customer's lock, which every change takes first.
    async fn keep_days(
        &self,
        customer_id: &str,
        generations: &BTreeMap<i64, i64>,
        days: &[Day],
    ) -> Result<(), StoreError> {
        let held = |seen: i64, day: i64| seen == generations.get(&day).copied().unwrap_or(0);
        let mut tx = super::ingress::write_transaction(&self.write).await?;
        if !held(locked_generation(&mut tx, customer_id).await?, CUSTOMER) {
            return Ok(());
        }
        let first = days.iter().map(|d| d.counts.day).min().unwrap_or(0);
        let now: BTreeMap<i64, i64> =
            sqlx::query("SELECT day, gen FROM customer_day_changes WHERE customer_id = $1 AND day >= $2")
                .bind(customer_id)
                .bind(first)
                .fetch_all(&mut *tx)
                .await?
                .iter()
                .map(|r| Ok((r.try_get("day")?, r.try_get("gen")?)))
                .collect::<Result<_, StoreError>>()?;
        for day in days.iter().filter(|d| held(now.get(&d.counts.day).copied().unwrap_or(0), d.counts.day)) {
            let c = &day.counts;
            sqlx::query(
                "INSERT INTO customer_days (customer_id, day, sent, refused, failed, unknown, delivered, read_n, \
                 refusals) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) ON CONFLICT (customer_id, day) DO NOTHING",
            )
            .bind(customer_id)
            .bind(c.day)
            .bind(c.sent as i64)
            .bind(c.refused as i64)
            .bind(c.failed as i64)
            .bind(c.unknown as i64)
            .bind(day.delivered as i64)
            .bind(day.read as i64)
            .bind(serde_json::to_string(&day.refusals).unwrap_or_else(|_| "{}".into()))
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(())
    }
}

/// The customer's own generation, its row locked until `tx` ends (made at 0 if
/// missing): the lock every change to the customer's days and every keep takes first.
async fn locked_generation(tx: &mut Transaction<'static, Any>, customer_id: &str) -> Result<i64, StoreError> {
    Ok(sqlx::query(
        "INSERT INTO customer_day_changes (customer_id, day, gen) VALUES ($1, $2, 0) \
         ON CONFLICT (customer_id, day) DO UPDATE SET gen = customer_day_changes.gen RETURNING gen",
    )
    .bind(customer_id)
    .bind(CUSTOMER)
    .fetch_one(&mut **tx)
    .await?
    .try_get("gen")?)
}

#[cfg(test)]
#[path = "customer_days_tests.rs"]
mod tests;

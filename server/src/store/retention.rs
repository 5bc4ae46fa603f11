//! Retention: every table that grows with traffic loses its rows past their time, in
//! one place ([`Store::run_retention`]), run by a background job on every gateway and
//! by `gateway retention run`. Deletes go in batches, each sized to take about a set
//! time ([`Pace`]) and followed by a pause, so a large backlog never holds SQLite's write
//! lock for long nor takes more than a fifth of a PostgreSQL backend (replicas and the
//! SQLite writer keep going between batches); running on several replicas at once is
//! harmless (a row is deleted once).
//!
//! The pause is as long as the rows past their time allow ([`Pace::pause`]): a run first
//! counts them ([`Store::retention_backlog`]) and, from [`SPREAD_FROM`] rows, spreads
//! their batches over [`BUDGET`], with a pause of at most the store's `gentle` times the
//! batch (and its `longest`) and at least [`PAUSE`] times, however far behind it is.
//! What a delete costs the sends beside it is its rate, not how long it holds the lock:
//! on SQLite every row deleted rewrites a page in each of its table's indexes, on
//! PostgreSQL the first change to a page after a checkpoint writes the whole page to
//! the WAL, and the sends' commits share the disk (and the WAL) with those writes. A
//! day of a 1 M-row log (11,000 rows) at a fifth of the store's time went in 7 to 10 s
//! on SQLite, and the p99 of sends beside it was 1.6 to 2.1 times that of sends alone;
//! spread over 200 s it was 1.1 to 1.3 times (BENCHMARKS.md, issue 22, twenty-third
//! session; PostgreSQL: [`Pace`]). A run can be stopped before a batch or in a pause
//! ([`Store::run_retention_until`]).
//!
//! Each batch finds its rows by a range of an index on the step's time, so the last
//! batch of a table, which finds fewer rows than it asks for, reads no more than the
//! first: without one it read the whole table while it held SQLite's write lock (250
//! ms for an outbox of a million events; migrations `0016_retention_ranges` on SQLite
//! and `0023` on PostgreSQL). The few steps still allowed to read their table are
//! listed in this module's test.
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

/// How retention paces its deletes on one store: each batch is sized from the time of
/// the one before to take about `hold` (at most twice as many rows at a time, within
/// `rows`), and retention then pauses ([`Pace::pause`]), at most `gentle` times as long
/// as the batch took and at most `longest`.
///
/// On SQLite a batch holds the one write lock that every send's write needs. Batches of
/// 5,000 rows and then of 500 (rows of the message log take their seven indexes with
/// them) stopped sends for 100 to 300 ms, then 40 to 280 ms, while a day of a 1 M-row log
/// went (p99 at 1,000 req/s; BENCHMARKS.md); batches of about 2 ms took it to 1.5 times
/// that of sends alone. On PostgreSQL a delete blocks no insert and touches no index,
/// so a row goes tens of times as fast as on SQLite (5,000 rows of the message log in
/// 9 ms), but the first change of a page after a checkpoint writes the whole page to the
/// WAL that every send's commit flushes (those 5,000 rows: 1.5 MB). At SQLite's pauses,
/// a day of a 1 M-row store went in 3 s there, and the median 3-second slice of sends
/// beside it had a p99 0.76 to 9.7 times that of the slices alone (1.43 at the median
/// round); in batches of at most 500 rows and with pauses ten times as long, the rows
/// go at about SQLite's rate, and that ratio was 0.68 to 1.20 (1.06 at the median
/// round; BENCHMARKS.md, issue 22, twenty-fourth session).
#[derive(Clone, Copy, Debug)]
pub struct Pace {
    pub hold: Duration,
    /// (the first batch, the fewest, the most)
    pub rows: (i64, i64, i64),
    /// The longest pause, in multiples of the time the batch took: retention takes this
    /// share of the store's time (plus one) when its rows can go within [`BUDGET`] at
    /// that pace.
    pub gentle: u32,
    /// The longest pause `gentle` gives: a batch that met a stall of the disk (and took
    /// long) is not followed by a pause many times as long.
    pub longest: Duration,
}

/// SQLite's pace: a hundredth of the store's time, a second at most.
pub const SQLITE: Pace =
    Pace { hold: Duration::from_millis(2), rows: (50, 10, 500), gentle: 99, longest: Duration::from_secs(1) };
/// PostgreSQL's pace: a thousandth of the backend's time, two seconds at most.
pub const POSTGRES: Pace =
    Pace { hold: Duration::from_millis(2), rows: (50, 10, 500), gentle: 999, longest: Duration::from_secs(2) };
/// The shortest pause after a batch, in multiples of the time the batch took: sends keep
/// the store at least four fifths of the time, however far behind retention is.
pub const PAUSE: u32 = 4;
/// How long a run may take at a pace gentler than [`PAUSE`]: half the job's interval,
/// so that a run ends before the next one starts.
pub const BUDGET: Duration = Duration::from_secs(300);
/// A run of fewer rows goes at the shortest pause: it is over in a second or two on
/// either store, too short to move a minute's p99 of sends.
pub const SPREAD_FROM: i64 = 2_000;
/// Rows counted a step at most, before a run ([`Store::retention_backlog`]). While a step
/// with as many runs, the rows left are not known, and its pause is [`PAUSE`] times the
/// batch (a million of the message log's rows take about a quarter of an hour at that
/// pace on SQLite, far past [`BUDGET`]).
const COUNTED: i64 = 1_000_000;

impl Pace {
    /// The pause after a batch of `size` rows that took `took`, with `left` rows still
    /// to go and `budget` left of [`BUDGET`]: the longest, up to `gentle` times `took`
    /// and `longest`, at which batches like this one delete `left` within `budget`;
    /// [`PAUSE`] times `took` if none does. At least a millisecond.
    pub fn pause(self, size: i64, took: Duration, left: i64, budget: Duration) -> Duration {
        let batches = (left as f64 / size.max(1) as f64).max(1.0);
        let took_s = took.as_secs_f64().max(1e-6);
        let times = (budget.as_secs_f64() / (batches * took_s) - 1.0).clamp(f64::from(PAUSE), f64::from(self.gentle));
        took.mul_f64(times).min(self.longest.max(took * PAUSE)).max(Duration::from_millis(1))
    }

    /// The size of the next batch, after one of `size` rows took `took`.
    fn next(self, size: i64, took: Duration) -> i64 {
        let scaled = size as f64 * self.hold.as_secs_f64() / took.as_secs_f64().max(1e-6);
        (scaled as i64).min(size * 2).clamp(self.rows.1, self.rows.2)
    }
}

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

/// A step's statements, made once (the writer takes its statements as `&'static str`).
struct StepSql {
    /// The delete of one batch of its rows (`$1` the cut-off, `$2` how many), on SQLite
    /// and on PostgreSQL.
    delete: [String; 2],
    /// The count of its rows past their time (`$1` the cut-off), up to [`COUNTED`], on
    /// either store.
    count: String,
}

/// Each step's statements, in the order of `STEPS`.
static SQL: LazyLock<Vec<StepSql>> = LazyLock::new(|| {
    let delete = |table: &str, condition: &str, key: &str| {
        format!("DELETE FROM {table} WHERE ({key}) IN (SELECT {key} FROM {table} WHERE {condition} LIMIT $2)")
    };
    STEPS
        .iter()
        .map(|(table, condition, _)| {
            // SQLite's tables without a rowid are named by their primary key.
            let sqlite_key = if *table == "pbx_seen_signatures" { "ts, integration_id, signature" } else { "rowid" };
            StepSql {
                delete: [delete(table, condition, sqlite_key), delete(table, condition, "ctid")],
                count: format!("SELECT COUNT(*) FROM (SELECT 1 FROM {table} WHERE {condition} LIMIT {COUNTED}) past"),
            }
        })
        .collect()
});

/// Tables of the SQLite store alone (`pbx_signature_log`: SQLite's replay check, see
/// `store::pbx::admit`).
const SQLITE_ONLY: &[&str] = &["pbx_signature_log"];

/// Whether `table`'s steps run on `backend`.
fn runs_on(backend: Backend, table: &str) -> bool {
    backend == Backend::Sqlite || !SQLITE_ONLY.contains(&table)
}

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
    // A customer's kept days whose rows or delivery reports go (`store::customer_days`;
    // a report is never older than its send), before those rows: a kept day never
    // counts rows already gone.
    ("customer_days", "day < $1", |p| p.message_log_before.max(p.inbound_before)),
    ("customer_day_changes", "day >= 0 AND day < $1", |p| p.message_log_before.max(p.inbound_before)),
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
    ("pbx_signature_log", "ts < $1", |p| p.pbx_signatures_before_seconds),
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

/// The tables retention keeps short on `backend`, each named once.
pub fn tables(backend: Backend) -> Vec<&'static str> {
    let mut tables: Vec<&'static str> = STEPS.iter().map(|(t, _, _)| *t).filter(|t| runs_on(backend, t)).collect();
    tables.dedup();
    tables
}

/// Adds `rows` to `table`'s line of `report` (a table of two steps has one line).
fn add(report: &mut Vec<Pruned>, table: &'static str, rows: u64) {
    match report.iter_mut().find(|p| p.table == table) {
        Some(p) => p.rows += rows,
        None => report.push(Pruned { table, rows }),
    }
}

impl Store {
    /// The steps of this store's backend, each with its place in `STEPS`.
    fn retention_steps(&self) -> impl Iterator<Item = (usize, &'static Step)> {
        let backend = self.backend;
        STEPS.iter().enumerate().filter(move |(_, (table, _, _))| runs_on(backend, table))
    }

    /// The rows that a run with `plan` would delete now, by table, each step's counted
    /// up to [`COUNTED`]. Read without the write lock (SQLite) and outside the writer.
    pub async fn retention_backlog(&self, plan: &RetentionPlan) -> Result<Vec<Pruned>, StoreError> {
        let mut report = Vec::new();
        for (table, rows) in self.retention_counts(plan).await? {
            add(&mut report, table, rows as u64);
        }
        Ok(report)
    }

    /// Each step's rows past their time, up to [`COUNTED`], in the order of the steps.
    async fn retention_counts(&self, plan: &RetentionPlan) -> Result<Vec<(&'static str, i64)>, StoreError> {
        let mut counts = Vec::new();
        for (i, (table, _, cut_off)) in self.retention_steps() {
            let rows: i64 = sqlx::query_scalar(&SQL[i].count).bind(cut_off(plan)).fetch_one(&self.read).await?;
            counts.push((*table, rows));
        }
        Ok(counts)
    }

    /// Deletes every row past its time; what each table lost.
    pub async fn run_retention(&self, plan: &RetentionPlan) -> Result<Vec<Pruned>, StoreError> {
        self.run_retention_until(plan, std::future::pending()).await
    }

    /// Deletes every row past its time, unless `stop` resolves first: the run then ends,
    /// in a pause or before its next batch (each batch is its own transaction), and what
    /// is left goes at the next run. What each table it reached lost.
    pub async fn run_retention_until(
        &self,
        plan: &RetentionPlan,
        stop: impl Future<Output = ()>,
    ) -> Result<Vec<Pruned>, StoreError> {
        self.run_retention_paced(plan, stop, Pace::pause).await
    }

    /// [`Store::run_retention_until`], with `pause` giving each batch's pause (a test
    /// gives one long enough that only a stop can end it).
    async fn run_retention_paced(
        &self,
        plan: &RetentionPlan,
        stop: impl Future<Output = ()>,
        pause: fn(Pace, i64, Duration, i64, Duration) -> Duration,
    ) -> Result<Vec<Pruned>, StoreError> {
        tokio::pin!(stop);
        let started = tokio::time::Instant::now();
        let counts = tokio::select! {
            biased;
            _ = &mut stop => return Ok(Vec::new()),
            counts = self.retention_counts(plan) => counts?,
        };
        // The rows of the steps after the one in progress.
        let mut later: i64 = counts.iter().map(|(_, rows)| rows).sum();
        let budget = if later < SPREAD_FROM { Duration::ZERO } else { BUDGET };
        let mut report: Vec<Pruned> = Vec::new();
        let pace = match self.backend {
            Backend::Sqlite => SQLITE,
            Backend::Postgres => POSTGRES,
        };
        let mut size = pace.rows.0;
        'steps: for ((i, (table, _, cut_off)), (_, counted)) in self.retention_steps().zip(&counts) {
            let [sqlite, postgres] = &SQL[i].delete;
            let at = cut_off(plan);
            later -= counted;
            // A step counted to its limit has more; how many is not known.
            let mut this = if *counted >= COUNTED { i64::MAX / 2 } else { *counted };
            add(&mut report, table, 0);
            loop {
                if stopped(&mut stop).await {
                    break 'steps;
                }
                let batch = tokio::time::Instant::now();
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
                add(&mut report, table, done);
                this -= done as i64;
                if done < size as u64 {
                    break;
                }
                let took = batch.elapsed();
                // Rows past their time since the count (a send settled late) leave `this`
                // below zero.
                let pause = pause(pace, size, took, this.max(0) + later, budget.saturating_sub(started.elapsed()));
                tokio::select! {
                    biased;
                    _ = &mut stop => break 'steps,
                    _ = tokio::time::sleep(pause) => {}
                }
                size = pace.next(size, took);
            }
        }
        Ok(report)
    }
}

/// Whether `stop` has resolved, without waiting for it.
async fn stopped(stop: &mut std::pin::Pin<&mut impl Future<Output = ()>>) -> bool {
    tokio::select! {
        biased;
        _ = stop => true,
        _ = std::future::ready(()) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Steps that may still read their whole table: a row a call, a contact's inbound
    /// activity or `@lid`, a reviewed refusal, a sign-in address or invitation, a policy
    /// command or replica, a customer's kept day. These tables grow with calls, contacts,
    /// operators and customers' days, not with sends; an index on their time is left
    /// until one of them is measured to need it.
    const READ_WHOLE: &[&str] = &[
        "calls",
        "customer_days",
        "customer_day_changes",
        "review_queue",
        "contact_activity",
        "lid_map",
        "dashboard_login_throttle",
        "dashboard_invitations",
        "policy_commands",
        "policy_gateways",
    ];

    /// Every step's batch, and its count before a run, finds its rows by a range of an
    /// index, so its last batch (which finds fewer rows than it asks for) reads no table
    /// whole, on either store: SQLite's plan has no `SCAN` of any table; PostgreSQL's,
    /// with sequential scans, hash and merge joins priced out (as the batch functions
    /// run), has no sequential scan and no index scan without a condition, in its custom
    /// plan or its generic one (what a prepared statement runs after five executions).
    #[tokio::test]
    async fn each_step_reads_its_old_rows_by_an_index() {
        let (_dir, conn) = super::super::test_postgres::migrated_sqlite("retention.db").await;
        let mut whole = Vec::new();
        for ((table, _, _), sql) in STEPS.iter().zip(SQL.iter()) {
            for (what, sql, params) in [("delete", &sql.delete[0], &[0i64, 10][..]), ("count", &sql.count, &[0][..])] {
                let mut plan = conn.prepare(&format!("EXPLAIN QUERY PLAN {sql}")).unwrap();
                let lines: Vec<String> = plan
                    .query_map(rusqlite::params_from_iter(params), |r| r.get(3))
                    .unwrap()
                    .collect::<Result<_, _>>()
                    .unwrap();
                // `past`: the count's subquery, read as it is made.
                let scan = |line: &String| line.starts_with("SCAN ") && line != "SCAN past";
                if !READ_WHOLE.contains(table) && lines.iter().any(scan) {
                    whole.push(format!("{table} ({what}): {lines:?}"));
                }
            }
        }
        assert_eq!(whole, Vec::<String>::new(), "SQLite: steps that read a table whole");

        let Some((store, admin, db)) = super::super::test_postgres::postgres_store("retention_plans").await else {
            return;
        };
        let whole = postgres_whole_reads(&store).await;
        super::super::test_postgres::drop_database(store, &admin, &db).await;
        assert_eq!(whole.unwrap(), Vec::<String>::new(), "PostgreSQL: steps that read a table whole");
    }

    /// Each PostgreSQL step's plans, as in the test above: the steps (with the plan's
    /// nodes) that read a table whole.
    async fn postgres_whole_reads(store: &Store) -> Result<Vec<String>, sqlx::Error> {
        let mut conn = store.write.acquire().await?;
        for setting in ["enable_seqscan", "enable_hashjoin", "enable_mergejoin"] {
            sqlx::query(&format!("SET {setting} = off")).execute(&mut *conn).await?;
        }
        let mut reads = Vec::new();
        for (i, (table, _, _)) in store.retention_steps() {
            if READ_WHOLE.contains(table) {
                continue;
            }
            let sql = &SQL[i];
            sqlx::query(&format!("PREPARE delete{i}(bigint, bigint) AS {}", sql.delete[1])).execute(&mut *conn).await?;
            sqlx::query(&format!("PREPARE count{i}(bigint) AS {}", sql.count)).execute(&mut *conn).await?;
            for (mode, what) in ["force_custom_plan", "force_generic_plan"]
                .into_iter()
                .flat_map(|mode| [(mode, format!("delete{i}(0, 10)")), (mode, format!("count{i}(0)"))])
            {
                sqlx::query(&format!("SET plan_cache_mode = {mode}")).execute(&mut *conn).await?;
                let rows = sqlx::query(&format!("EXPLAIN EXECUTE {what}")).fetch_all(&mut *conn).await?;
                let lines = rows.iter().map(|r| sqlx::Row::try_get(r, 0)).collect::<Result<Vec<String>, _>>()?;
                // A node is its line (the first, or one with `->`) and the lines under it.
                let mut nodes: Vec<(String, bool)> = Vec::new();
                for line in &lines {
                    if nodes.is_empty() || line.trim_start().starts_with("->") {
                        nodes.push((line.trim().to_string(), false));
                    } else if line.trim_start().starts_with("Index Cond:") {
                        nodes.last_mut().expect("a node").1 = true;
                    }
                }
                let whole: Vec<&String> = nodes
                    .iter()
                    .filter(|(node, cond)| {
                        node.contains("Seq Scan on ")
                            || (node.contains("Index Scan using ") || node.contains("Index Only Scan using ")) && !cond
                    })
                    .map(|(node, _)| node)
                    .collect();
                if !whole.is_empty() {
                    reads.push(format!("{table} ({what}, {mode}): {whole:?}"));
                }
            }
        }
        Ok(reads)
    }

    /// A run told to stop ends before its next batch, with what it deleted until then; a
    /// run left alone deletes every row past its time, in batches.
    #[tokio::test]
    async fn a_stopped_run_ends_before_its_next_batch() {
        let dir = tempfile::tempdir().unwrap();
        let store = lapsed_store(&dir).await;
        let plan = lapsed_plan();
        let backlog = store.retention_backlog(&plan).await.unwrap();
        assert_eq!(rate_limits(&backlog), Some(300));

        let stopped = store.run_retention_until(&plan, std::future::ready(())).await.unwrap();
        assert!(stopped.iter().all(|p| p.rows == 0), "{stopped:?}");
        assert_eq!(rate_limits(&stopped), None, "the run ended before it reached the table");
        assert_eq!(store.retention_backlog(&plan).await.unwrap(), backlog, "nothing was deleted");

        let run = store.run_retention(&plan).await.unwrap();
        assert_eq!(run, backlog);
        assert!(store.retention_backlog(&plan).await.unwrap().iter().all(|p| p.rows == 0));
        store.close().await;
    }

    /// A run told to stop while it pauses between two batches ends then, not when the
    /// pause is over: with pauses of an hour, the run ends with its first batch deleted.
    #[tokio::test]
    async fn a_run_stopped_in_its_pause_ends_then() {
        let dir = tempfile::tempdir().unwrap();
        let store = lapsed_store(&dir).await;
        let plan = lapsed_plan();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let hour = |_: Pace, _: i64, _: Duration, _: i64, _: Duration| Duration::from_secs(3_600);
        let run = tokio::spawn({
            let (store, plan) = (store.clone(), plan.clone());
            async move { store.run_retention_paced(&plan, async move { stopped.await.unwrap_or(()) }, hour).await }
        });
        // The first batch is gone: the run is in its pause (or it failed, and says how).
        let first = tokio::time::timeout(Duration::from_secs(60), async {
            loop {
                let left = rate_limits(&store.retention_backlog(&plan).await.unwrap()).unwrap();
                if left < 300 || run.is_finished() {
                    break 300 - left;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
        .expect("the run's first batch within a minute");
        assert_eq!(first, SQLITE.rows.0 as u64);
        stop.send(()).unwrap();
        let report = tokio::time::timeout(Duration::from_secs(60), run)
            .await
            .expect("the run ended at its stop, not after its hour's pause")
            .unwrap()
            .unwrap();
        assert_eq!(rate_limits(&report), Some(first));
        assert_eq!(rate_limits(&store.retention_backlog(&plan).await.unwrap()), Some(300 - first));
        store.close().await;
    }

    /// A SQLite store in `dir` with 300 lapsed rate limits.
    async fn lapsed_store(dir: &tempfile::TempDir) -> Store {
        let store =
            Store::open(&format!("sqlite://{}?mode=rwc", dir.path().join("r.db").display()), 2, None).await.unwrap();
        let lapsed = |n: i64| Statement {
            sql: "INSERT INTO rate_limits (key, tat, expires_at) VALUES ($1, 0, 1)",
            params: vec![SqlValue::Text(format!("lapsed-{n}"))],
        };
        store.write(Exec((0..300).map(lapsed).collect())).await.unwrap();
        store
    }

    /// The rate limits' line of a report.
    fn rate_limits(report: &[Pruned]) -> Option<u64> {
        report.iter().find(|p| p.table == "rate_limits").map(|p| p.rows)
    }

    /// A plan under which only the rows that lapse by the clock (rate limits and the
    /// like) are past their time.
    fn lapsed_plan() -> RetentionPlan {
        RetentionPlan {
            now: crate::store::now_ms(),
            message_log_before: 0,
            inbound_before: 0,
            provider_events_applied_before: 0,
            provider_events_failed_before: 0,
            review_before: 0,
            contacts_before: 0,
            webhooks_before: 0,
            pbx_events_before: 0,
            pbx_signatures_before_seconds: 0,
            policy_inputs_before: 0,
        }
    }

    #[test]
    fn the_pause_spreads_what_is_left_over_the_budget_within_its_bounds() {
        let ms = Duration::from_millis;
        let s = Duration::from_secs;
        // Within a microsecond (the multiple is a float).
        let is = |got: Duration, want: Duration| {
            assert!(got.abs_diff(want) < Duration::from_micros(1), "{got:?}, not {want:?}")
        };
        let pause = |size, took, left, budget| SQLITE.pause(size, took, left, budget);
        // 10,000 rows left in batches of 10 taking 2 ms: 2 s of deletes, and 100 s left,
        // so a pause of 98 ms a batch (each batch with its pause a tenth of a second).
        is(pause(10, ms(2), 10_000, s(100)), ms(98));
        // A handful left and all the time in the world: at most `gentle` times the batch.
        is(pause(10, ms(2), 30, BUDGET), ms(2) * SQLITE.gentle);
        is(pause(10, ms(2), 0, BUDGET), ms(2) * SQLITE.gentle);
        // Behind: the budget cannot hold them at any pace, or it is spent. At least PAUSE.
        is(pause(10, ms(2), 1_000_000, s(100)), ms(2) * PAUSE);
        is(pause(10, ms(2), 100, Duration::ZERO), ms(2) * PAUSE);
        // Never under a millisecond, whatever the clock said.
        is(pause(10, Duration::ZERO, 1_000_000, Duration::ZERO), ms(1));
        // A batch that met a stall: a second at most, unless PAUSE times it is longer.
        is(pause(10, ms(100), 30, BUDGET), SQLITE.longest);
        is(pause(10, ms(400), 1_000_000, s(100)), ms(1600));
        // PostgreSQL: up to a thousand times the batch, two seconds at most; behind, the
        // same PAUSE times it as SQLite.
        is(POSTGRES.pause(500, ms(1), 30, BUDGET), ms(999));
        is(POSTGRES.pause(500, ms(5), 30, BUDGET), POSTGRES.longest);
        // 30,000 rows in batches of 500 taking 2 ms over 300 s: 5 s a batch, held to 999
        // times the batch.
        is(POSTGRES.pause(500, ms(2), 30_000, BUDGET), ms(1998));
        // 300,000 rows: 600 batches, 0.5 s each, and so 498 ms of pause.
        is(POSTGRES.pause(500, ms(2), 300_000, BUDGET), ms(498));
        is(POSTGRES.pause(500, ms(2), 100_000_000, BUDGET), ms(2) * PAUSE);
    }

    #[test]
    fn a_batch_is_sized_to_take_about_its_pace() {
        let ms = Duration::from_millis;
        // About 2 ms (both stores). Twice as long as it should: half as many next time.
        assert_eq!(SQLITE.next(100, ms(4)), 50);
        // Quick: more, but never more than twice as many at once.
        assert_eq!(SQLITE.next(100, Duration::from_micros(1500)), 133);
        assert_eq!(SQLITE.next(100, Duration::from_micros(10)), 200);
        // Within the bounds, whatever the clock said.
        assert_eq!(SQLITE.next(10, ms(400)), 10);
        assert_eq!(SQLITE.next(400, Duration::ZERO), 500);
        // PostgreSQL, about 2 ms too (it was 20 ms, 100 to 5,000 rows), 10 to 500 rows.
        assert_eq!(POSTGRES.next(500, ms(20)), 50);
        assert_eq!(POSTGRES.next(500, ms(1)), 500);
        assert_eq!(POSTGRES.next(200, ms(1)), 400);
        assert_eq!(POSTGRES.next(100, ms(1_000)), 10);
    }
}

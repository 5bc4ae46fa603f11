//! Group commit of the send path's writes.
//!
//! A send writes twice: it reserves its limit counters before the provider call, and it
//! records its log row (and event) after. Run one transaction each, those writes
//! serialise on SQLite's single writer and pay one commit (an fsync on PostgreSQL)
//! apiece. Here one writer owns the writes: it takes every write queued at that moment
//! (up to `MAX_BATCH`), runs them in order in one transaction, commits once, and only
//! then answers each caller. The semantics of each write are those of running it
//! alone, because writes in a batch run one after another in the same transaction:
//! a reservation that finds a counter full undoes its own increments before the next
//! write runs. If the batch fails as a whole (a constraint error, a PostgreSQL deadlock
//! between replicas), nothing was answered yet, so the writes are retried one
//! transaction each and every caller gets its own result.
//!
//! On SQLite the writer is a thread that owns a plain `rusqlite` connection. sqlx's
//! SQLite driver runs each statement on a worker thread and hands it over twice; under
//! load those handoffs were 60 % of the gateway's CPU (measured with perf, see
//! BENCHMARKS.md) while SQLite itself was 2 %. One thread that does a whole batch
//! costs one handoff per batch instead. On PostgreSQL the writer is a task that sends
//! the whole batch as one call of the `gateway_write_batch` function (migration 0002):
//! one round trip and one commit per batch, where a statement per write cost a round
//! trip each and kept the writer busy (measured in BENCHMARKS.md).

use super::attempts::{self, Began, Begin, Finish, IdemOwner, KeyFate};
use super::counters::{LimitHit, Reservation};
use super::messages::{LogEntry, OutboxEvent, Recorded, ReviewItem};
use super::pbx::{Admission, PbxAdmit, PbxEvent};
use super::{StoreError, bind_dollar};
use rusqlite::types::Value as SqlValue;
use sqlx::{AnyPool, Row};
use std::path::PathBuf;
use tokio::sync::{mpsc, oneshot};

/// Largest number of writes in one transaction.
const MAX_BATCH: usize = 256;

type Reply<T> = oneshot::Sender<Result<T, StoreError>>;

/// One write of the send path.
pub(super) enum WriteOp {
    Reserve {
        reservations: Vec<Reservation>,
        reply: Reply<Result<(), LimitHit>>,
    },
    Release {
        reservations: Vec<Reservation>,
        reply: Reply<()>,
    },
    /// A log row written whole (a refusal), with its event, review and, for a request
    /// with an idempotency key, the answer to keep.
    Record {
        entry: Box<LogEntry>,
        event: Option<Box<OutboxEvent>>,
        review: Option<Box<ReviewItem>>,
        answer: Option<Box<(IdemOwner, KeyFate)>>,
        reply: Reply<Recorded>,
    },
    /// The counters and pending row of an allowed send (see `attempts`).
    Begin {
        begin: Box<Begin>,
        reply: Reply<Began>,
    },
    /// The provider's answer to an attempt (see `attempts`).
    Finish {
        finish: Box<Finish>,
        reply: Reply<bool>,
    },
    PbxAdmit {
        admit: Box<PbxAdmit>,
        reply: Reply<Admission>,
    },
    /// Plain statements run in order inside the batch; answers rows affected by each.
    /// On PostgreSQL, `finish` (when given) is sent to `gateway_webhook_finish`
    /// (migration 0004) with the batch's one statement instead, which does the same
    /// writes; then the answer is empty.
    Exec {
        statements: Vec<Statement>,
        finish: Option<serde_json::Value>,
        reply: Reply<Vec<u64>>,
    },
}

/// One statement of an `Exec` write: SQL with `$n` parameters and their values.
#[derive(Clone, Debug)]
pub(super) struct Statement {
    pub sql: &'static str,
    pub params: Vec<SqlValue>,
}

/// The result of one write, held until the batch commits.
enum Done {
    Reserve(Result<(), LimitHit>),
    Release,
    Record(Recorded),
    Began(Began),
    Finished(bool),
    PbxAdmit(Admission),
    Exec(Vec<u64>),
}

const RELEASE_SQL: &str =
    "UPDATE usage_counters SET count = count - 1 WHERE scope = $1 AND window_start = $2 AND count > 0";
pub(super) const COUNT_SQL: &str = "SELECT count FROM usage_counters WHERE scope = $1 AND window_start = $2";
const INSERT_LOG_SQL: &str = "INSERT INTO message_log (customer_id, instance_id, api_key_id, source, purpose, \
     recipient, message_type, decision, error_code, policy, reason, provider_message_id, status, created_at, \
     policy_trace) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15) RETURNING id";
/// A message that went (or may have gone) out counts toward its recipient's contact.
const CONTACT_SENT_SQL: &str = "INSERT INTO contacts (instance_id, phone, first_sent_at, last_sent_at, sent_total) \
     VALUES ($1, $2, $3, $3, 1) ON CONFLICT (instance_id, phone) DO UPDATE SET \
     first_sent_at = COALESCE(contacts.first_sent_at, excluded.first_sent_at), \
     last_sent_at = excluded.last_sent_at, sent_total = contacts.sent_total + 1";
const INSERT_REVIEW_SQL: &str = "INSERT INTO review_queue (log_id, customer_id, instance_id, source, purpose, \
     recipient, message_type, text, policy, reason, risk_score, created_at) \
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)";
const COUNT_REVIEWS_SQL: &str = "SELECT COUNT(*) FROM review_queue WHERE instance_id = $1 AND created_at >= $2";
const PAUSE_SQL: &str = "UPDATE instances SET paused = 1, paused_reason = $2 WHERE id = $1 AND paused = 0";
const INSERT_OUTBOX_SQL: &str = "INSERT INTO outbox (customer_id, instance_id, event_type, payload, created_at, \
     available_at) VALUES ($1, $2, $3, $4, $5, $5)";

/// One conditional upsert for `n` counters; returns the scopes it took.
fn reserve_sql(n: usize) -> String {
    let values: Vec<String> =
        (0..n).map(|i| format!("(${}, ${}, 1, ${}, ${})", 4 * i + 1, 4 * i + 2, 4 * i + 3, 4 * i + 4)).collect();
    format!(
        "INSERT INTO usage_counters (scope, window_start, count, expires_at, lim) VALUES {} \
         ON CONFLICT (scope, window_start) DO UPDATE SET count = usage_counters.count + 1, lim = excluded.lim \
         WHERE usage_counters.count < excluded.lim RETURNING scope, count",
        values.join(", ")
    )
}

/// Which reservation was full, given the scopes the upsert took; and the ones to undo.
fn first_full(rs: &[Reservation], taken: &[String]) -> Option<(usize, Vec<Reservation>)> {
    if taken.len() == rs.len() {
        return None;
    }
    let index = rs.iter().position(|r| !taken.contains(&r.scope)).unwrap_or(0);
    Some((index, rs.iter().filter(|r| taken.contains(&r.scope)).cloned().collect()))
}

pub(super) fn log_values(e: &LogEntry) -> Vec<SqlValue> {
    let text = |s: &Option<String>| s.clone().map_or(SqlValue::Null, SqlValue::Text);
    vec![
        SqlValue::Text(e.customer_id.clone()),
        text(&e.instance_id),
        text(&e.api_key_id),
        SqlValue::Text(e.source.clone()),
        text(&e.purpose),
        text(&e.recipient),
        text(&e.message_type),
        SqlValue::Text(e.decision.clone()),
        text(&e.error_code),
        text(&e.policy),
        text(&e.reason),
        text(&e.provider_message_id),
        SqlValue::Text(e.status.clone()),
        SqlValue::Integer(e.created_at),
        text(&e.policy_trace),
    ]
}

/// Whether an attempt's message went out, or may have.
fn went_out(e: &LogEntry) -> bool {
    e.decision == "allowed" && matches!(e.status.as_str(), "sent" | "unknown")
}

fn outbox_values(e: &OutboxEvent) -> Vec<SqlValue> {
    vec![
        SqlValue::Text(e.customer_id.clone()),
        e.instance_id.clone().map_or(SqlValue::Null, SqlValue::Text),
        SqlValue::Text(e.event_type.clone()),
        SqlValue::Text(e.payload.to_string()),
        SqlValue::Integer(e.created_at),
    ]
}

fn answer(op: WriteOp, result: Result<Done, StoreError>) {
    // A caller that went away (request cancelled) simply gets no answer.
    match (op, result) {
        (WriteOp::Reserve { reply, .. }, Ok(Done::Reserve(r))) => drop(reply.send(Ok(r))),
        (WriteOp::Release { reply, .. }, Ok(Done::Release)) => drop(reply.send(Ok(()))),
        (WriteOp::Record { reply, .. }, Ok(Done::Record(r))) => drop(reply.send(Ok(r))),
        (WriteOp::Reserve { reply, .. }, Err(e)) => drop(reply.send(Err(e))),
        (WriteOp::Release { reply, .. }, Err(e)) => drop(reply.send(Err(e))),
        (WriteOp::Record { reply, .. }, Err(e)) => drop(reply.send(Err(e))),
        (WriteOp::Begin { reply, .. }, Ok(Done::Began(b))) => drop(reply.send(Ok(b))),
        (WriteOp::Begin { reply, .. }, Err(e)) => drop(reply.send(Err(e))),
        (WriteOp::Finish { reply, .. }, Ok(Done::Finished(f))) => drop(reply.send(Ok(f))),
        (WriteOp::Finish { reply, .. }, Err(e)) => drop(reply.send(Err(e))),
        (WriteOp::PbxAdmit { reply, .. }, Ok(Done::PbxAdmit(a))) => drop(reply.send(Ok(a))),
        (WriteOp::PbxAdmit { reply, .. }, Err(e)) => drop(reply.send(Err(e))),
        (WriteOp::Exec { reply, .. }, Ok(Done::Exec(rows))) => drop(reply.send(Ok(rows))),
        (WriteOp::Exec { reply, .. }, Err(e)) => drop(reply.send(Err(e))),
        (_, Ok(_)) => unreachable!("each write yields its own kind of result"),
    }
}

/// Takes whatever else is queued, up to a full batch.
fn fill(rx: &mut mpsc::Receiver<WriteOp>, batch: &mut Vec<WriteOp>) {
    while batch.len() < MAX_BATCH {
        match rx.try_recv() {
            Ok(op) => batch.push(op),
            Err(_) => break,
        }
    }
}

fn log_batch(log: &Option<slog::Logger>, writes: usize, ok: bool, started: std::time::Instant) {
    if let Some(log) = log {
        slog::debug!(log, "write batch"; "writes" => writes, "ok" => ok,
                     "elapsed_us" => started.elapsed().as_micros() as u64);
    }
}

/// The file of a `sqlite:` URL.
pub(super) fn sqlite_path(url: &str) -> Option<PathBuf> {
    let rest = url.strip_prefix("sqlite://").or_else(|| url.strip_prefix("sqlite:"))?;
    let path = rest.split('?').next().unwrap_or_default();
    (!path.is_empty() && !path.starts_with(":memory:")).then(|| PathBuf::from(path))
}

/// Starts the SQLite writer thread on the database file `path`.
pub(super) fn spawn_sqlite(
    path: PathBuf,
    options: super::StoreOptions,
    log: Option<slog::Logger>,
) -> Result<mpsc::Sender<WriteOp>, StoreError> {
    let mut conn = rusqlite::Connection::open(&path)?;
    conn.execute_batch(&options.sqlite_pragmas())?;
    let (tx, mut rx) = mpsc::channel::<WriteOp>(4 * MAX_BATCH);
    std::thread::Builder::new()
        .name("sqlite-writer".into())
        .spawn(move || {
            let mut batch = Vec::with_capacity(MAX_BATCH);
            while let Some(first) = rx.blocking_recv() {
                batch.push(first);
                fill(&mut rx, &mut batch);
                let started = std::time::Instant::now();
                let outcome = sqlite_batch(&mut conn, &batch);
                log_batch(&log, batch.len(), outcome.is_ok(), started);
                match outcome {
                    Ok(results) => batch.drain(..).zip(results).for_each(|(op, done)| answer(op, Ok(done))),
                    // Another process holds the file: every write would wait as long
                    // again, so the whole batch fails now (503) instead of one by one.
                    Err(StoreError::Sqlite(e)) if super::is_sqlite_busy(&e) => {
                        batch.drain(..).for_each(|op| answer(op, Err(StoreError::Unavailable(e.to_string()))));
                    }
                    Err(_) => {
                        for op in batch.drain(..) {
                            let result = sqlite_batch(&mut conn, std::slice::from_ref(&op)).map(|mut r| r.remove(0));
                            answer(op, result);
                        }
                    }
                }
            }
        })
        .map_err(|e| StoreError::Conflict(format!("starting the SQLite writer: {e}")))?;
    Ok(tx)
}

fn sqlite_batch(conn: &mut rusqlite::Connection, batch: &[WriteOp]) -> Result<Vec<Done>, StoreError> {
    let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
    let mut results = Vec::with_capacity(batch.len());
    for op in batch {
        results.push(match op {
            WriteOp::Reserve { reservations, .. } => Done::Reserve(sqlite_reserve(&tx, reservations)?.map(|_| ())),
            WriteOp::Release { reservations, .. } => {
                sqlite_release(&tx, reservations)?;
                Done::Release
            }
            WriteOp::Record { entry, event, review, answer, .. } => {
                let recorded = sqlite_record(&tx, entry, event.as_deref(), review.as_deref())?;
                if let Some((idem, fate)) = answer.as_deref() {
                    let (sql, values) = attempts::refusal_key(idem, fate, recorded.log_id);
                    let mut settle = tx.prepare_cached(sql)?;
                    bind_dollar(&mut settle, &values)?;
                    settle.raw_execute()?;
                }
                Done::Record(recorded)
            }
            WriteOp::Begin { begin, .. } => Done::Began(attempts::sqlite_begin(&tx, begin)?),
            WriteOp::Finish { finish, .. } => Done::Finished(attempts::sqlite_finish(&tx, finish)?),
            WriteOp::PbxAdmit { admit, .. } => Done::PbxAdmit(sqlite_pbx_admit(&tx, admit)?),
            WriteOp::Exec { statements, .. } => {
                let mut rows = Vec::with_capacity(statements.len());
                for st in statements {
                    let mut stmt = tx.prepare_cached(st.sql)?;
                    bind_dollar(&mut stmt, &st.params)?;
                    rows.push(stmt.raw_execute()? as u64);
                }
                Done::Exec(rows)
            }
        });
    }
    tx.commit()?;
    Ok(results)
}

fn sqlite_record(
    tx: &rusqlite::Transaction<'_>,
    entry: &LogEntry,
    event: Option<&OutboxEvent>,
    review: Option<&ReviewItem>,
) -> Result<Recorded, StoreError> {
    let mut insert = tx.prepare_cached(INSERT_LOG_SQL)?;
    bind_dollar(&mut insert, &log_values(entry))?;
    let log_id: i64 = insert.raw_query().next()?.ok_or(rusqlite::Error::QueryReturnedNoRows)?.get(0)?;
    if let Some(event) = event {
        sqlite_outbox(tx, event)?;
    }
    if went_out(entry)
        && let (Some(instance), Some(phone)) = (&entry.instance_id, &entry.recipient)
    {
        sqlite_contact(tx, instance, phone, entry.created_at)?;
    }
    let mut paused = false;
    if let (Some(review), Some(instance)) = (review, &entry.instance_id) {
        let mut insert = tx.prepare_cached(INSERT_REVIEW_SQL)?;
        bind_dollar(&mut insert, &review_values(log_id, entry, review))?;
        insert.raw_execute()?;
        let recent: i64 = tx
            .prepare_cached(COUNT_REVIEWS_SQL)?
            .query_row(rusqlite::params![instance, entry.created_at - review.window_ms], |r| r.get(0))?;
        if recent >= review.pause_threshold {
            let mut pause = tx.prepare_cached(PAUSE_SQL)?;
            bind_dollar(&mut pause, &[SqlValue::Text(instance.clone()), SqlValue::Text(review.pause_reason.clone())])?;
            paused = pause.raw_execute()? > 0;
        }
    }
    Ok(Recorded { log_id, paused })
}

/// Writes an outbox event.
pub(super) fn sqlite_outbox(tx: &rusqlite::Transaction<'_>, event: &OutboxEvent) -> Result<(), StoreError> {
    let mut insert = tx.prepare_cached(INSERT_OUTBOX_SQL)?;
    bind_dollar(&mut insert, &outbox_values(event))?;
    insert.raw_execute()?;
    Ok(())
}

/// Counts a message that went (or may have gone) out toward its recipient's contact.
pub(super) fn sqlite_contact(
    tx: &rusqlite::Transaction<'_>,
    instance: &str,
    phone: &str,
    at: i64,
) -> Result<(), StoreError> {
    tx.prepare_cached(CONTACT_SENT_SQL)?.execute(rusqlite::params![instance, phone, at])?;
    Ok(())
}

fn review_values(log_id: i64, e: &LogEntry, r: &ReviewItem) -> Vec<SqlValue> {
    let text = |s: &Option<String>| s.clone().map_or(SqlValue::Null, SqlValue::Text);
    vec![
        SqlValue::Integer(log_id),
        SqlValue::Text(e.customer_id.clone()),
        text(&e.instance_id),
        SqlValue::Text(e.source.clone()),
        text(&e.purpose),
        text(&e.recipient),
        text(&e.message_type),
        text(&r.text),
        SqlValue::Text(r.policy.clone()),
        SqlValue::Text(r.reason.clone()),
        SqlValue::Integer(i64::from(r.risk_score)),
        SqlValue::Integer(e.created_at),
    ]
}

/// Takes every reservation or none: the counters' values after this send's increment
/// (in the order of `rs`), or the first that was full.
pub(super) fn sqlite_reserve(
    tx: &rusqlite::Transaction<'_>,
    rs: &[Reservation],
) -> Result<Result<Vec<i64>, LimitHit>, StoreError> {
    if rs.is_empty() {
        return Ok(Ok(Vec::new()));
    }
    let params: Vec<SqlValue> = rs
        .iter()
        .flat_map(|r| {
            [
                SqlValue::Text(r.scope.clone()),
                SqlValue::Integer(r.window_start),
                SqlValue::Integer(r.expires_at),
                SqlValue::Integer(r.limit),
            ]
        })
        .collect();
    let mut stmt = tx.prepare_cached(&reserve_sql(rs.len()))?;
    bind_dollar(&mut stmt, &params)?;
    let mut taken = Vec::with_capacity(rs.len());
    let mut counts = std::collections::HashMap::with_capacity(rs.len());
    let mut rows = stmt.raw_query();
    while let Some(row) = rows.next()? {
        let scope = row.get::<_, String>(0)?;
        counts.insert(scope.clone(), row.get::<_, i64>(1)?);
        taken.push(scope);
    }
    drop(rows);
    drop(stmt);
    let Some((index, undo)) = first_full(rs, &taken) else {
        return Ok(Ok(rs.iter().map(|r| counts.get(&r.scope).copied().unwrap_or(1)).collect()));
    };
    sqlite_release(tx, &undo)?;
    let used: Option<i64> = tx
        .prepare_cached(COUNT_SQL)?
        .query_map(rusqlite::params![rs[index].scope, rs[index].window_start], |row| row.get(0))?
        .next()
        .transpose()?;
    Ok(Err(LimitHit { index, used: used.unwrap_or(rs[index].limit) }))
}

fn sqlite_pbx_admit(tx: &rusqlite::Transaction<'_>, a: &PbxAdmit) -> Result<Admission, StoreError> {
    use super::pbx::{INSERT_EVENT_SQL, RATE_SQL, SEEN_SQL, TAT_SQL, event_values};
    if let Some(signature) = &a.signature {
        let mut stmt = tx.prepare_cached(SEEN_SQL)?;
        bind_dollar(
            &mut stmt,
            &[
                SqlValue::Integer(a.signature_ts),
                SqlValue::Integer(a.integration_id),
                SqlValue::Text(signature.clone()),
            ],
        )?;
        if stmt.raw_execute()? == 0 {
            return Ok(Admission::Replayed);
        }
    }
    let mut rate_limited_for_ms = None;
    if let Some(rate) = &a.rate {
        let now = super::now_ms();
        let mut stmt = tx.prepare_cached(RATE_SQL)?;
        bind_dollar(
            &mut stmt,
            &[
                SqlValue::Text(rate.key.clone()),
                SqlValue::Integer(now),
                SqlValue::Integer(rate.interval_ms),
                SqlValue::Integer(rate.tolerance_ms),
            ],
        )?;
        let allowed = stmt.raw_query().next()?.is_some();
        if !allowed {
            let tat: i64 = tx.prepare_cached(TAT_SQL)?.query_row([&rate.key], |row| row.get(0))?;
            rate_limited_for_ms = Some(tat - now - rate.tolerance_ms);
        }
    }
    let mut log_id = None;
    if let Some(log) = &a.log {
        let log = admitted_log(log, rate_limited_for_ms);
        let mut insert = tx.prepare_cached(INSERT_EVENT_SQL)?;
        bind_dollar(&mut insert, &event_values(&log))?;
        log_id = Some(insert.raw_query().next()?.ok_or(rusqlite::Error::QueryReturnedNoRows)?.get(0)?);
    }
    Ok(Admission::Admitted { rate_limited_for_ms, log_id })
}

/// The log row of an admitted event: as given, or `rate_limited` when the limit refused.
fn admitted_log(log: &PbxEvent, rate_limited_for_ms: Option<i64>) -> PbxEvent {
    match rate_limited_for_ms {
        None => log.clone(),
        Some(_) => PbxEvent {
            action: "rate_limited".into(),
            status_code: 429,
            error_code: Some("webhook_rate_limited".into()),
            response: None,
            ..log.clone()
        },
    }
}

pub(super) fn sqlite_release(tx: &rusqlite::Transaction<'_>, rs: &[Reservation]) -> Result<(), StoreError> {
    for r in rs {
        tx.prepare_cached(RELEASE_SQL)?.execute(rusqlite::params![r.scope, r.window_start])?;
    }
    Ok(())
}

/// Starts the PostgreSQL writer task over `pool`; it ends when every sender is dropped.
pub(super) fn spawn_sqlx(
    pool: AnyPool,
    timeout: std::time::Duration,
    log: Option<slog::Logger>,
) -> mpsc::Sender<WriteOp> {
    let (tx, mut rx) = mpsc::channel::<WriteOp>(4 * MAX_BATCH);
    tokio::spawn(async move {
        let mut batch = Vec::with_capacity(MAX_BATCH);
        while let Some(first) = rx.recv().await {
            batch.push(first);
            fill(&mut rx, &mut batch);
            let started = std::time::Instant::now();
            // A batch PostgreSQL does not answer in time fails as a whole (its connection
            // is dropped with the future): the writer never hangs on a lost database.
            let outcome = match tokio::time::timeout(timeout, sqlx_batch(&pool, &batch)).await {
                Ok(outcome) => outcome,
                Err(_) => Err(StoreError::Unavailable(format!("no answer within {} ms", timeout.as_millis()))),
            };
            log_batch(&log, batch.len(), outcome.is_ok(), started);
            match outcome {
                Ok(results) => batch.drain(..).zip(results).for_each(|(op, done)| answer(op, Ok(done))),
                Err(e) if e.is_unavailable() => {
                    let why = e.to_string();
                    batch.drain(..).for_each(|op| answer(op, Err(StoreError::Unavailable(why.clone()))));
                }
                Err(_) => {
                    for op in batch.drain(..) {
                        let alone = tokio::time::timeout(timeout, sqlx_batch(&pool, std::slice::from_ref(&op))).await;
                        let result = alone
                            .unwrap_or_else(|_| Err(StoreError::Unavailable("no answer in time".into())))
                            .map(|mut r| r.remove(0));
                        answer(op, result);
                    }
                }
            }
        }
    });
    tx
}

/// Runs a batch on PostgreSQL: one call of `gateway_write_batch` (migration 0002),
/// which applies the writes in order in the statement's own transaction.
/// PBX admissions go to `gateway_pbx_admit` and webhook attempts to
/// `gateway_webhook_finish` (migrations 0003 and 0004) in the same statement. Other
/// `Exec` writes run after that statement, in order, in the same transaction.
async fn sqlx_batch(pool: &AnyPool, batch: &[WriteOp]) -> Result<Vec<Done>, StoreError> {
    let is_pbx = |op: &&WriteOp| matches!(op, WriteOp::PbxAdmit { .. });
    let is_send = |op: &&WriteOp| matches!(op, WriteOp::Begin { .. } | WriteOp::Finish { .. });
    let is_finish = |op: &&WriteOp| matches!(op, WriteOp::Exec { finish: Some(_), .. });
    let is_exec = |op: &&WriteOp| matches!(op, WriteOp::Exec { finish: None, .. });
    let has_answer = |op: &&WriteOp| matches!(op, WriteOp::Record { answer: Some(_), .. });
    let ops: Vec<serde_json::Value> =
        batch.iter().filter(|op| !is_pbx(op) && !is_send(op) && !is_exec(op) && !is_finish(op)).map(op_json).collect();
    let pbx: Vec<serde_json::Value> = batch.iter().filter(is_pbx).map(op_json).collect();
    let send: Vec<serde_json::Value> = batch.iter().filter(is_send).map(op_json).collect();
    let finishes: Vec<serde_json::Value> = batch
        .iter()
        .filter_map(|op| match op {
            WriteOp::Exec { finish: Some(f), .. } => Some(f.clone()),
            _ => None,
        })
        .collect();
    // Without plain `Exec` writes (or kept answers) the batch is one statement: one
    // round trip, its own transaction. With them, a transaction around that statement
    // and theirs.
    let mut tx = if batch.iter().any(|op| is_exec(&op) || has_answer(&op)) { Some(pool.begin().await?) } else { None };
    let (mut results, mut pbx_results, mut send_results) =
        if ops.is_empty() && pbx.is_empty() && finishes.is_empty() && send.is_empty() {
            (Vec::new().into_iter(), Vec::new().into_iter(), Vec::new().into_iter())
        } else {
            let query = sqlx::query(
                "SELECT gateway_write_batch($1::jsonb)::text AS r, gateway_pbx_admit($2::jsonb)::text AS p, \
                 gateway_webhook_finish($3::jsonb)::text AS w, gateway_send_ops($4::jsonb)::text AS s",
            )
            .bind(serde_json::Value::Array(ops).to_string())
            .bind(serde_json::Value::Array(pbx).to_string())
            .bind(serde_json::Value::Array(finishes).to_string())
            .bind(serde_json::Value::Array(send).to_string());
            let row = match tx.as_mut() {
                Some(tx) => query.fetch_one(&mut **tx).await?,
                None => query.fetch_one(pool).await?,
            };
            let parse = |column: &str| -> Result<Vec<serde_json::Value>, StoreError> {
                let text: String = row.try_get(column)?;
                serde_json::from_str(&text).map_err(|e| StoreError::Conflict(format!("write batch answer: {e}")))
            };
            (parse("r")?.into_iter(), parse("p")?.into_iter(), parse("s")?.into_iter())
        };
    let mut done = Vec::with_capacity(batch.len());
    for op in batch {
        match op {
            WriteOp::Exec { finish: Some(_), .. } => {
                done.push(Done::Exec(Vec::new()));
                continue;
            }
            WriteOp::Exec { statements, finish: None, .. } => {
                let tx = tx.as_mut().ok_or_else(|| StoreError::Conflict("no transaction for a write".into()))?;
                let mut rows = Vec::with_capacity(statements.len());
                for st in statements {
                    let result = super::bind_all(sqlx::query(st.sql), st.params.clone()).execute(&mut **tx).await?;
                    rows.push(result.rows_affected());
                }
                done.push(Done::Exec(rows));
                continue;
            }
            _ => {}
        }
        let r = if is_pbx(&op) {
            pbx_results.next()
        } else if is_send(&op) {
            send_results.next()
        } else {
            results.next()
        };
        let r = r.ok_or_else(|| StoreError::Conflict("write batch answered fewer writes".into()))?;
        let result = done_from_json(op, &r)?;
        if let (WriteOp::Record { answer: Some(answer), .. }, Done::Record(recorded)) = (op, &result) {
            let (idem, fate) = answer.as_ref();
            let tx = tx.as_mut().ok_or_else(|| StoreError::Conflict("no transaction for a write".into()))?;
            let (sql, values) = attempts::refusal_key(idem, fate, recorded.log_id);
            super::bind_all(sqlx::query(sql), values).execute(&mut **tx).await?;
        }
        done.push(result);
    }
    if let Some(tx) = tx {
        tx.commit().await?;
    }
    Ok(done)
}

pub(super) fn reservations_json(rs: &[Reservation]) -> serde_json::Value {
    rs.iter()
        .map(|r| {
            serde_json::json!({"scope": r.scope, "window_start": r.window_start,
                               "expires_at": r.expires_at, "limit": r.limit})
        })
        .collect()
}

fn op_json(op: &WriteOp) -> serde_json::Value {
    match op {
        WriteOp::Reserve { reservations, .. } => {
            serde_json::json!({"op": "reserve", "r": reservations_json(reservations)})
        }
        WriteOp::Release { reservations, .. } => {
            serde_json::json!({"op": "release", "r": reservations_json(reservations)})
        }
        WriteOp::Record { entry, event, review, .. } => {
            let log = log_json(entry);
            let review = review.as_ref().map(|r| {
                serde_json::json!({
                    "text": r.text, "policy": r.policy, "reason": r.reason, "risk_score": r.risk_score,
                    "pause_threshold": r.pause_threshold, "window_ms": r.window_ms,
                    "pause_reason": r.pause_reason,
                })
            });
            let event = event.as_deref().map(outbox_json);
            serde_json::json!({"op": "record", "log": log, "event": event, "review": review})
        }
        WriteOp::Begin { begin, .. } => attempts::begin_json(begin),
        WriteOp::Finish { finish, .. } => attempts::finish_json(finish),
        WriteOp::PbxAdmit { admit, .. } => {
            let a = admit;
            let log = a.log.as_ref().map(|l| {
                serde_json::json!({
                    "integration_id": l.integration_id, "customer_id": l.customer_id, "event_type": l.event_type,
                    "action": l.action, "status_code": l.status_code, "error_code": l.error_code,
                    "phone": l.phone, "message_id": l.message_id, "external_message_id": l.external_message_id,
                    "response": l.response, "created_at": l.created_at,
                })
            });
            let rate = a
                .rate
                .as_ref()
                .map(|r| serde_json::json!({"key": r.key, "interval": r.interval_ms, "tolerance": r.tolerance_ms}));
            serde_json::json!({"integration_id": a.integration_id, "signature": a.signature,
                               "signature_ts": a.signature_ts, "rate": rate, "log": log})
        }
        WriteOp::Exec { .. } => serde_json::Value::Null,
    }
}

/// A log row as the batch functions read it.
pub(super) fn log_json(e: &LogEntry) -> serde_json::Value {
    serde_json::json!({
        "customer_id": e.customer_id, "instance_id": e.instance_id, "api_key_id": e.api_key_id,
        "source": e.source, "purpose": e.purpose, "recipient": e.recipient,
        "message_type": e.message_type, "decision": e.decision, "error_code": e.error_code,
        "policy": e.policy, "reason": e.reason, "provider_message_id": e.provider_message_id,
        "status": e.status, "created_at": e.created_at, "policy_trace": e.policy_trace,
        "went_out": went_out(e),
    })
}

/// An outbox event as the batch functions read it.
pub(super) fn outbox_json(v: &OutboxEvent) -> serde_json::Value {
    serde_json::json!({
        "customer_id": v.customer_id, "instance_id": v.instance_id, "event_type": v.event_type,
        "payload": v.payload.to_string(), "created_at": v.created_at,
    })
}

fn done_from_json(op: &WriteOp, r: &serde_json::Value) -> Result<Done, StoreError> {
    let bad = || StoreError::Conflict(format!("unexpected write batch answer {r}"));
    Ok(match op {
        WriteOp::Reserve { .. } if r["ok"] == true => Done::Reserve(Ok(())),
        WriteOp::Reserve { .. } => Done::Reserve(Err(LimitHit {
            index: r["index"].as_u64().ok_or_else(bad)? as usize,
            used: r["used"].as_i64().ok_or_else(bad)?,
        })),
        WriteOp::Release { .. } => Done::Release,
        WriteOp::Begin { .. } => Done::Began(attempts::began_from_json(r).ok_or_else(bad)?),
        WriteOp::Finish { .. } => Done::Finished(r["applied"] == true),
        WriteOp::Record { .. } => {
            Done::Record(Recorded { log_id: r["id"].as_i64().ok_or_else(bad)?, paused: r["paused"] == true })
        }
        WriteOp::PbxAdmit { .. } if r["replay"] == true => Done::PbxAdmit(Admission::Replayed),
        WriteOp::PbxAdmit { .. } => Done::PbxAdmit(Admission::Admitted {
            rate_limited_for_ms: r["rate_limited_for_ms"].as_i64(),
            log_id: r["log_id"].as_i64(),
        }),
        WriteOp::Exec { .. } => return Err(bad()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sqlite_urls_name_their_file() {
        assert_eq!(sqlite_path("sqlite://gateway.db?mode=rwc"), Some(PathBuf::from("gateway.db")));
        assert_eq!(sqlite_path("sqlite:///tmp/x/g.db?mode=rwc"), Some(PathBuf::from("/tmp/x/g.db")));
        assert_eq!(sqlite_path("sqlite:g.db"), Some(PathBuf::from("g.db")));
        assert_eq!(sqlite_path("sqlite::memory:"), None);
        assert_eq!(sqlite_path("postgres://x/y"), None);
    }

    #[test]
    fn first_full_reservation_is_named_and_the_others_undone() {
        let r = |scope: &str| Reservation { scope: scope.into(), window_start: 0, expires_at: 1, limit: 1 };
        let rs = vec![r("a"), r("b"), r("c")];
        assert!(first_full(&rs, &["a".into(), "b".into(), "c".into()]).is_none());
        let (index, undo) = first_full(&rs, &["a".into(), "c".into()]).unwrap();
        assert_eq!(index, 1);
        assert_eq!(undo, vec![r("a"), r("c")]);
    }
}

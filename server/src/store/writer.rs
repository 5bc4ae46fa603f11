//! Group commit of the send path's writes.
//!
//! A send writes twice: it reserves its limit counters before the provider call, and it
//! records its log row (and event) after. Run one transaction each, those writes
//! serialise on SQLite's single writer and pay one commit (an fsync on PostgreSQL)
//! apiece. Here one task owns the writes: it takes every write queued at that moment
//! (up to `MAX_BATCH`), runs them in order in one transaction, commits once, and only
//! then answers each caller. The semantics of each write are those of running it
//! alone, because writes in a batch run one after another in the same transaction:
//! a reservation that finds a counter full undoes its own increments before the next
//! write runs. If the batch fails as a whole (a constraint error, a PostgreSQL deadlock
//! between replicas), nothing was answered yet, so the writes are retried one
//! transaction each and every caller gets its own result.

use super::StoreError;
use super::counters::{LimitHit, Reservation};
use super::messages::{LogEntry, OutboxEvent};
use sqlx::{Any, AnyPool, Row, Transaction};
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
    Record {
        entry: Box<LogEntry>,
        event: Option<Box<OutboxEvent>>,
        reply: Reply<i64>,
    },
}

/// The result of one write, held until the batch commits.
enum Done {
    Reserve(Result<(), LimitHit>),
    Release,
    Record(i64),
}

/// Starts the writer task over `pool`; it ends when every sender is dropped.
pub(super) fn spawn(pool: AnyPool) -> mpsc::Sender<WriteOp> {
    let (tx, mut rx) = mpsc::channel::<WriteOp>(4 * MAX_BATCH);
    tokio::spawn(async move {
        let mut batch = Vec::with_capacity(MAX_BATCH);
        while let Some(first) = rx.recv().await {
            batch.push(first);
            while batch.len() < MAX_BATCH {
                match rx.try_recv() {
                    Ok(op) => batch.push(op),
                    Err(_) => break,
                }
            }
            match run_batch(&pool, &batch).await {
                Ok(results) => {
                    for (op, done) in batch.drain(..).zip(results) {
                        answer(op, Ok(done));
                    }
                }
                Err(_) => {
                    for op in batch.drain(..) {
                        let result = run_batch(&pool, std::slice::from_ref(&op))
                            .await
                            .map(|mut r| r.remove(0));
                        answer(op, result);
                    }
                }
            }
        }
    });
    tx
}

fn answer(op: WriteOp, result: Result<Done, StoreError>) {
    // A caller that went away (request cancelled) simply gets no answer.
    match (op, result) {
        (WriteOp::Reserve { reply, .. }, Ok(Done::Reserve(r))) => drop(reply.send(Ok(r))),
        (WriteOp::Release { reply, .. }, Ok(Done::Release)) => drop(reply.send(Ok(()))),
        (WriteOp::Record { reply, .. }, Ok(Done::Record(id))) => drop(reply.send(Ok(id))),
        (WriteOp::Reserve { reply, .. }, Err(e)) => drop(reply.send(Err(e))),
        (WriteOp::Release { reply, .. }, Err(e)) => drop(reply.send(Err(e))),
        (WriteOp::Record { reply, .. }, Err(e)) => drop(reply.send(Err(e))),
        (_, Ok(_)) => unreachable!("each write yields its own kind of result"),
    }
}

async fn run_batch(pool: &AnyPool, batch: &[WriteOp]) -> Result<Vec<Done>, StoreError> {
    let mut tx = pool.begin().await?;
    let mut results = Vec::with_capacity(batch.len());
    for op in batch {
        results.push(match op {
            WriteOp::Reserve { reservations, .. } => {
                Done::Reserve(reserve(&mut tx, reservations).await?)
            }
            WriteOp::Release { reservations, .. } => {
                release(&mut tx, reservations).await?;
                Done::Release
            }
            WriteOp::Record { entry, event, .. } => {
                Done::Record(record(&mut tx, entry, event.as_deref()).await?)
            }
        });
    }
    tx.commit().await?;
    Ok(results)
}

/// Increments every counter below its limit in one statement; if any was full, undoes
/// the increments that were made and names the first full one.
async fn reserve(
    tx: &mut Transaction<'_, Any>,
    rs: &[Reservation],
) -> Result<Result<(), LimitHit>, StoreError> {
    if rs.is_empty() {
        return Ok(Ok(()));
    }
    let values: Vec<String> = (0..rs.len())
        .map(|i| {
            format!(
                "(${}, ${}, 1, ${}, ${})",
                4 * i + 1,
                4 * i + 2,
                4 * i + 3,
                4 * i + 4
            )
        })
        .collect();
    let sql = format!(
        "INSERT INTO usage_counters (scope, window_start, count, expires_at, lim) VALUES {} \
         ON CONFLICT (scope, window_start) DO UPDATE SET count = usage_counters.count + 1, lim = excluded.lim \
         WHERE usage_counters.count < excluded.lim RETURNING scope",
        values.join(", ")
    );
    let mut query = sqlx::query(&sql);
    for r in rs {
        query = query
            .bind(&r.scope)
            .bind(r.window_start)
            .bind(r.expires_at)
            .bind(r.limit);
    }
    let taken: Vec<String> = query
        .fetch_all(&mut **tx)
        .await?
        .iter()
        .map(|row| row.try_get("scope"))
        .collect::<Result<_, _>>()?;
    if taken.len() == rs.len() {
        return Ok(Ok(()));
    }
    let index = rs
        .iter()
        .position(|r| !taken.contains(&r.scope))
        .unwrap_or(0);
    let undo: Vec<Reservation> = rs
        .iter()
        .filter(|r| taken.contains(&r.scope))
        .cloned()
        .collect();
    release(tx, &undo).await?;
    let used: i64 =
        sqlx::query("SELECT count FROM usage_counters WHERE scope = $1 AND window_start = $2")
            .bind(&rs[index].scope)
            .bind(rs[index].window_start)
            .fetch_optional(&mut **tx)
            .await?
            .map(|row| row.try_get("count"))
            .transpose()?
            .unwrap_or(rs[index].limit);
    Ok(Err(LimitHit { index, used }))
}

async fn release(tx: &mut Transaction<'_, Any>, rs: &[Reservation]) -> Result<(), StoreError> {
    for r in rs {
        sqlx::query("UPDATE usage_counters SET count = count - 1 WHERE scope = $1 AND window_start = $2 AND count > 0")
            .bind(&r.scope)
            .bind(r.window_start)
            .execute(&mut **tx)
            .await?;
    }
    Ok(())
}

async fn record(
    tx: &mut Transaction<'_, Any>,
    entry: &LogEntry,
    event: Option<&OutboxEvent>,
) -> Result<i64, StoreError> {
    let id: i64 = sqlx::query(
        "INSERT INTO message_log (customer_id, instance_id, api_key_id, source, purpose, recipient, message_type, \
         decision, error_code, policy, reason, provider_message_id, status, created_at) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14) RETURNING id",
    )
    .bind(&entry.customer_id)
    .bind(&entry.instance_id)
    .bind(&entry.api_key_id)
    .bind(&entry.source)
    .bind(&entry.purpose)
    .bind(&entry.recipient)
    .bind(&entry.message_type)
    .bind(&entry.decision)
    .bind(&entry.error_code)
    .bind(&entry.policy)
    .bind(&entry.reason)
    .bind(&entry.provider_message_id)
    .bind(&entry.status)
    .bind(entry.created_at)
    .fetch_one(&mut **tx)
    .await?
    .try_get("id")?;
    if let Some(event) = event {
        sqlx::query(
            "INSERT INTO outbox (customer_id, instance_id, event_type, payload, created_at, available_at) \
             VALUES ($1, $2, $3, $4, $5, $5)",
        )
        .bind(&event.customer_id)
        .bind(&event.instance_id)
        .bind(&event.event_type)
        .bind(event.payload.to_string())
        .bind(event.created_at)
        .execute(&mut **tx)
        .await?;
    }
    Ok(id)
}

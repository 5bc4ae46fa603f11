//! The PostgreSQL writer: each lane (below) is a task that sends a whole batch as one
//! statement calling each batch function that has writes (`gateway_write_batch`,
//! `gateway_pbx_admit`, `gateway_webhook_finish`, `gateway_send_ops`: migrations 0002
//! to 0008) with its array: one round trip and one commit per batch, where a statement
//! per write cost a round trip each and kept the writer busy (measured in
//! BENCHMARKS.md). Writes that are plain statements run after
//! it in the same transaction. Each batch's statement also writes its lane's receipt,
//! so that a batch whose connection was lost can be told committed or not, and run
//! again if not (`Receipts`, `run_batch`).
//!
//! PostgreSQL runs concurrent transactions, so its writer is several lanes, each a
//! task with its own queue and its own batch in flight: the main lane takes every write
//! that takes or gives back counters, claims keys or changes shared rows; the settle
//! lane takes the outcomes of sends that give nothing back (their own row, an event,
//! the contact, the key's answer); the delivery lane takes the outcomes of webhook
//! deliveries. One serial writer kept one PostgreSQL backend busy while the machine was
//! half idle (BENCHMARKS.md). A send's own writes keep their order (its settle is
//! queued after its begin committed); writes of different lanes are concurrent ones
//! whose order never mattered. Should two lanes' batches ever wait for each other's
//! rows, PostgreSQL ends one (a deadlock) and its writes are retried one transaction
//! each, as after any failed batch. SQLite has one writer, whatever the lane.

use super::{MAX_BATCH, PgAnswer, Postgres, Queued, fill, lane, log_batch};
use crate::store::{StoreError, bind_all, dropped_connection, now_ms};
use sqlx::pool::PoolConnection;
use sqlx::{AnyPool, Row};
use std::time::Duration;
use tokio::sync::mpsc;

/// Starts the PostgreSQL writer's lanes over `pool`, one task each (the senders in lane
/// order); each ends when its senders are dropped.
pub(in crate::store) fn spawn_sqlx(
    pool: AnyPool,
    timeout: Duration,
    log: Option<slog::Logger>,
) -> Vec<mpsc::Sender<Queued>> {
    let process = uuid::Uuid::new_v4().simple().to_string();
    tokio::spawn(forget_old_receipts(pool.clone()));
    let hold = pool.options().get_max_connections() as usize >= HOLD_FROM;
    (0..lane::COUNT).map(|n| spawn_lane(pool.clone(), Receipts::new(&process, n), hold, timeout, log.clone())).collect()
}

/// The smallest pool in which each lane keeps a connection of its own from batch to
/// batch (half of it at most, the rest for reads and everything else); in a smaller
/// one a lane takes a connection for each batch and gives it back. Kept, a connection
/// costs a batch no wait for the pool and no round trip when it is given back (sqlx
/// asks every connection it is given back): PostgreSQL sends 1.05 to 1.27x, and the
/// batches at 1,000 sends a second 564 to 1,044 µs against 838 to 1,024 (BENCHMARKS.md,
/// issue 22).
const HOLD_FROM: usize = 2 * lane::COUNT;

/// One lane of the PostgreSQL writer. A batch the database does not answer within
/// `timeout` fails as a whole (its connection is dropped with it): the writer never
/// hangs on a lost database.
fn spawn_lane(
    pool: AnyPool,
    mut receipts: Receipts,
    hold: bool,
    timeout: Duration,
    log: Option<slog::Logger>,
) -> mpsc::Sender<Queued> {
    let (tx, mut rx) = mpsc::channel::<Queued>(4 * MAX_BATCH);
    tokio::spawn(async move {
        // The lane's connection, kept from batch to batch if `hold` (given back to the
        // pool after an error or a timeout, when its state is unknown, and when the pool
        // closes: closing waits for every connection to come back).
        let mut held = None;
        let mut closed = std::pin::pin!(pool.close_event());
        let mut open = true;
        let mut batch = Vec::with_capacity(MAX_BATCH);
        loop {
            let first = tokio::select! {
                first = rx.recv() => match first {
                    Some(first) => first,
                    None => break,
                },
                () = &mut closed, if open => {
                    open = false;
                    held = None;
                    continue;
                }
            };
            batch.push(first);
            fill(&mut rx, &mut batch);
            let started = std::time::Instant::now();
            let outcome = timed(timeout, run_batch(&pool, &mut held, &mut batch, &mut receipts, &log)).await;
            log_batch(&log, batch.len(), outcome.is_ok(), started);
            match outcome {
                Ok(()) => batch.drain(..).for_each(|unit| unit.reply(None)),
                Err(e) if e.is_unavailable() => {
                    let why = e.to_string();
                    batch.drain(..).for_each(|unit| unit.reply(Some(StoreError::Unavailable(why.clone()))));
                }
                Err(_) => {
                    for mut unit in batch.drain(..) {
                        let alone = timed(
                            timeout,
                            run_batch(&pool, &mut held, std::slice::from_mut(&mut unit), &mut receipts, &log),
                        )
                        .await;
                        unit.reply(alone.err());
                    }
                }
            }
            if !hold {
                held = None;
            }
        }
    });
    tx
}

/// Removes the receipts of writers not heard of for a day (processes that stopped); once
/// per process, at start.
async fn forget_old_receipts(pool: AnyPool) {
    let day_ago = now_ms() - 86_400_000;
    let _ = sqlx::query("DELETE FROM writer_receipts WHERE at < $1").bind(day_ago).execute(&pool).await;
}

/// A lane's receipts: a token each of its batches writes in `writer_receipts` (migration
/// 0017) before anything else, in its own transaction, and only over a smaller one. A
/// batch whose connection was lost can then be told committed or not, and one not
/// committed can be kept from ever committing (`Receipts::fence`), so that running it
/// again cannot write it twice (`run_batch`).
struct Receipts {
    /// This process's lane: a name no other process or lane has.
    writer: String,
    /// The last token given out.
    token: i64,
}

/// The head of a batch's statement: the receipt, written only over a smaller token; the
/// batch's calls are made once per row it returns, so a fenced batch makes none.
const RECEIPT_CTE: &str = "WITH receipt AS (INSERT INTO writer_receipts (writer, token, at) VALUES ($1, $2, $3) \
     ON CONFLICT (writer) DO UPDATE SET token = excluded.token, at = excluded.at \
     WHERE writer_receipts.token < excluded.token RETURNING 1) ";

/// After a lost batch (`$4` its token): a new token (`$2`) over any other, or nothing if
/// the receipt holds the lost batch's token. The statement waits for a transaction that
/// still holds the row (the lost batch, still running on a server that did not see the
/// connection go), so it answers what that batch became.
const FENCE_SQL: &str = "INSERT INTO writer_receipts (writer, token, at) VALUES ($1, $2, $3) \
     ON CONFLICT (writer) DO UPDATE SET token = excluded.token, at = excluded.at \
     WHERE writer_receipts.token <> $4 RETURNING token";

impl Receipts {
    fn new(process: &str, lane: usize) -> Receipts {
        Receipts { writer: format!("{process}/{lane}"), token: 0 }
    }

    fn next(&mut self) -> i64 {
        self.token += 1;
        self.token
    }

    /// Whether the batch that wrote `lost` committed; if it did not, it never will: the
    /// receipt now holds a newer token. Asked until the database answers (a restart takes
    /// it away for a while); the lane's timeout bounds the wait.
    async fn fence(&mut self, pool: &AnyPool, lost: i64) -> Result<bool, StoreError> {
        let mut pause = Duration::from_millis(5);
        loop {
            let token = self.next();
            let asked = async {
                let mut conn = live_connection(pool).await?;
                let fenced = sqlx::query(FENCE_SQL)
                    .bind(&self.writer)
                    .bind(token)
                    .bind(now_ms())
                    .bind(lost)
                    .fetch_optional(&mut *conn)
                    .await?;
                Ok::<_, StoreError>(fenced.is_none())
            };
            match asked.await {
                Err(e) if e.is_unavailable() => {
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_millis(200));
                }
                answer => return answer,
            }
        }
    }
}

/// Runs a batch on PostgreSQL on a pooled connection, asked nothing first. If the
/// connection is lost on the way (the database restarted while it sat in the pool, or
/// ended it meanwhile), the lane's receipt says whether the batch committed. If it did
/// not, it is fenced off and runs again on another connection (as often as the pool has
/// connections: a restart ends them all); if it did, its answer was lost with the
/// connection, and the batch answers 503. Before, the lane asked every connection (a
/// ping, one round trip) before every batch: 150 µs of each batch's 800 µs at 1,000
/// sends a second, and a batch in flight at a restart answered 503 (BENCHMARKS.md,
/// issue 22).
async fn run_batch(
    pool: &AnyPool,
    held: &mut Option<PoolConnection<sqlx::Any>>,
    batch: &mut [Queued],
    receipts: &mut Receipts,
    log: &Option<slog::Logger>,
) -> Result<(), StoreError> {
    let mut tries = pool.options().get_max_connections();
    loop {
        let token = receipts.next();
        let mut conn = match held.take() {
            Some(conn) => conn,
            None => pool.acquire().await?,
        };
        match sqlx_batch(&mut conn, batch, &receipts.writer, token).await {
            Ok(()) => {
                *held = Some(conn);
                return Ok(());
            }
            Err(StoreError::Database(e)) if tries > 0 && dropped_connection(&e) => {
                conn.close_on_drop();
                drop(conn);
                tries -= 1;
                // Unless the fence answers, the batch may have committed: 503 for the
                // whole batch, never its writes run again one by one.
                let committed = receipts
                    .fence(pool, token)
                    .await
                    .map_err(|f| StoreError::Unavailable(format!("{e}; asking whether the batch committed: {f}")))?;
                if let Some(log) = log {
                    slog::warn!(log, "a write batch lost its database connection";
                                "error" => %e, "writes" => batch.len(), "committed" => committed);
                }
                if committed {
                    return Err(StoreError::Unavailable(format!("{e} (after the batch committed)")));
                }
            }
            // The connection goes back to the pool, which makes it ready for others.
            Err(e) => return Err(e),
        }
    }
}

/// `batch`'s outcome, or out of reach (`StoreError::Unavailable`) when it has not
/// answered within `timeout`: a statement never hangs on a database that went silent
/// (the writer's batches, the send path's batched reads).
pub(in crate::store) async fn timed<T>(
    timeout: Duration,
    batch: impl std::future::Future<Output = Result<T, StoreError>>,
) -> Result<T, StoreError> {
    match tokio::time::timeout(timeout, batch).await {
        Ok(outcome) => outcome,
        Err(_) => Err(StoreError::Unavailable(format!("no answer within {} ms", timeout.as_millis()))),
    }
}

/// Runs a batch on PostgreSQL: one statement that writes the lane's receipt (`writer`,
/// `token`) and calls each batch function with the array of its writes (each function
/// applies them in order and answers an array in the same order), then the statement
/// writes, in one transaction.
async fn sqlx_batch(
    conn: &mut sqlx::AnyConnection,
    batch: &mut [Queued],
    writer: &str,
    token: i64,
) -> Result<(), StoreError> {
    let mut forms: Vec<Postgres> = batch.iter().map(|unit| unit.postgres()).collect();
    // Each function once, with its writes in batch order; where each write's answer is.
    let mut calls: Vec<(&'static str, Vec<serde_json::Value>)> = Vec::new();
    let mut places = Vec::with_capacity(forms.len());
    for form in &mut forms {
        places.push(match form {
            Postgres::Call { function, arg } => {
                let f = match calls.iter().position(|(name, _)| name == function) {
                    Some(f) => f,
                    None => {
                        calls.push((function, Vec::new()));
                        calls.len() - 1
                    }
                };
                calls[f].1.push(std::mem::take(arg));
                Some((f, calls[f].1.len() - 1))
            }
            Postgres::Statements(_) => None,
        });
    }
    // A single call is its own transaction: one round trip. Anything more needs one.
    let explicit = forms.iter().any(|f| matches!(f, Postgres::Statements(_))) || batch.iter().any(|u| u.has_then());
    if explicit {
        let mut tx: sqlx::Transaction<'_, sqlx::Any> = sqlx::Transaction::begin(conn, None).await?;
        apply(&mut tx, batch, forms, calls, places, writer, token).await?;
        tx.commit().await?;
        Ok(())
    } else {
        apply(conn, batch, forms, calls, places, writer, token).await
    }
}

/// The batch's statements on `conn` (its transaction, when it has statements of its own):
/// the receipt and the calls in one statement, then each write's statements.
async fn apply(
    conn: &mut sqlx::AnyConnection,
    batch: &mut [Queued],
    forms: Vec<Postgres>,
    calls: Vec<(&'static str, Vec<serde_json::Value>)>,
    places: Vec<Option<(usize, usize)>>,
    writer: &str,
    token: i64,
) -> Result<(), StoreError> {
    let mut columns: Vec<String> =
        calls.iter().enumerate().map(|(i, (f, _))| format!("{f}(${}::jsonb)::text AS a{i}", i + 4)).collect();
    if columns.is_empty() {
        columns.push("NULL".into());
    }
    let sql = format!("{RECEIPT_CTE}SELECT {} FROM receipt", columns.join(", "));
    let mut query = sqlx::query(&sql).bind(writer).bind(token).bind(now_ms());
    for (_, args) in &calls {
        query = query.bind(serde_json::to_string(args).map_err(|e| StoreError::Conflict(e.to_string()))?);
    }
    let row = query
        .fetch_optional(&mut *conn)
        .await?
        .ok_or_else(|| StoreError::Conflict(format!("write batch {token} of {writer} was fenced off")))?;
    let mut answers: Vec<Vec<serde_json::Value>> = Vec::with_capacity(calls.len());
    for i in 0..calls.len() {
        let text: String = row.try_get(i)?;
        let answer: Vec<serde_json::Value> =
            serde_json::from_str(&text).map_err(|e| StoreError::Conflict(format!("write batch answer: {e}")))?;
        answers.push(answer);
    }
    for ((unit, form), place) in batch.iter_mut().zip(forms).zip(places) {
        let answer = match (form, place) {
            (Postgres::Call { .. }, Some((f, i))) => PgAnswer::Value(
                answers[f]
                    .get_mut(i)
                    .map(std::mem::take)
                    .ok_or_else(|| StoreError::Conflict("write batch answered fewer writes".into()))?,
            ),
            (Postgres::Statements(statements), _) => {
                let mut rows = Vec::with_capacity(statements.len());
                for st in statements {
                    rows.push(bind_all(sqlx::query(st.sql), st.params).execute(&mut *conn).await?.rows_affected());
                }
                PgAnswer::Rows(rows)
            }
            (Postgres::Call { .. }, None) => unreachable!("every call has its place"),
        };
        for st in unit.read_postgres(answer)? {
            bind_all(sqlx::query(st.sql), st.params).execute(&mut *conn).await?;
        }
    }
    Ok(())
}

/// A pooled connection that answered a `ping` (one round trip), passing over connections
/// the database dropped (a restart drops them all at once): where a lane asks whether a
/// batch committed (`Receipts::fence`).
async fn live_connection(pool: &AnyPool) -> Result<sqlx::pool::PoolConnection<sqlx::Any>, StoreError> {
    // Every connection the pool holds may have been dropped at once (a restart).
    let mut tries = pool.options().get_max_connections();
    loop {
        let mut conn = pool.acquire().await?;
        match sqlx::Connection::ping(&mut *conn).await {
            Ok(()) => return Ok(conn),
            Err(e) => {
                conn.close_on_drop();
                if tries == 0 {
                    return Err(e.into());
                }
                tries -= 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Exec, Pending, Statement};
    use super::*;
    use crate::store::test_postgres::{drop_database, postgres_store};
    use rusqlite::types::Value as SqlValue;
    use tokio::sync::oneshot;

    /// A write that inserts `n` into the test's table `probe`.
    fn probe(n: i64) -> Queued {
        let write = Exec(vec![Statement { sql: "INSERT INTO probe VALUES ($1)", params: vec![SqlValue::Integer(n)] }]);
        Box::new(Pending { write, output: None, reply: oneshot::channel().0 })
    }

    async fn probes(pool: &AnyPool) -> Vec<i64> {
        let rows = sqlx::query("SELECT n::bigint AS n FROM probe ORDER BY n").fetch_all(pool).await.unwrap();
        rows.iter().map(|r| r.get::<i64, _>("n")).collect()
    }

    /// The lane's receipt tells a lost batch that committed from one that did not, and
    /// keeps one that did not from ever committing afterwards, so running it again cannot
    /// write it twice (`run_batch`). A batch still running on another connection is
    /// waited for. PostgreSQL only: SQLite's writer has no connection to lose.
    #[tokio::test]
    async fn a_lost_batch_is_told_committed_or_is_fenced_off_for_good() {
        let Some((store, admin, db)) = postgres_store("receipts").await else { return };
        let pool = store.write.clone();
        sqlx::query("CREATE TABLE probe (n INT)").execute(&pool).await.unwrap();
        let mut receipts = Receipts::new("test", 0);

        // Committed: the receipt holds its token.
        run_batch(&pool, &mut None, &mut [probe(1)], &mut receipts, &None).await.unwrap();
        let last = receipts.token;
        assert!(receipts.fence(&pool, last).await.unwrap(), "the batch committed");

        // Never arrived: fenced off, and when it arrives late it writes nothing.
        let lost = receipts.next();
        assert!(!receipts.fence(&pool, lost).await.unwrap(), "the lost batch did not commit");
        let late = sqlx_batch(&mut pool.acquire().await.unwrap(), &mut [probe(2)], &receipts.writer, lost).await;
        assert!(matches!(late, Err(StoreError::Conflict(_))), "{late:?}");
        assert_eq!(probes(&pool).await, [1]);

        // Still running elsewhere: the fence waits for its end and says what it became.
        for (n, commits) in [(3, true), (4, false)] {
            let token = receipts.next();
            let mut running = pool.begin().await.unwrap();
            sqlx::query(&format!("{RECEIPT_CTE}INSERT INTO probe SELECT $4 FROM receipt"))
                .bind(&receipts.writer)
                .bind(token)
                .bind(now_ms())
                .bind(n)
                .execute(&mut *running)
                .await
                .unwrap();
            let (pool2, mut asking) = (pool.clone(), Receipts { writer: receipts.writer.clone(), token });
            let fence = tokio::spawn(async move { (asking.fence(&pool2, token).await.unwrap(), asking.token) });
            tokio::time::sleep(Duration::from_millis(300)).await;
            assert!(!fence.is_finished(), "the fence waits for the running batch");
            if commits {
                running.commit().await.unwrap();
            } else {
                running.rollback().await.unwrap();
            }
            let (committed, token) = fence.await.unwrap();
            assert_eq!(committed, commits);
            receipts.token = token;
        }
        assert_eq!(probes(&pool).await, [1, 3]);

        // And the lane goes on.
        run_batch(&pool, &mut None, &mut [probe(5)], &mut receipts, &None).await.unwrap();
        assert_eq!(probes(&pool).await, [1, 3, 5]);

        // The server ends every connection while they sit in the pool (a restart): the
        // next batch meets one, is told it did not commit, and runs again, once.
        for _ in 0..3 {
            sqlx::query("SELECT 1").execute(&pool).await.unwrap();
        }
        // A connection comes back to the pool after sqlx has asked it (a round trip).
        for _ in 0..100 {
            if pool.num_idle() > 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let idle = pool.num_idle();
        let mut conn = <sqlx::AnyConnection as sqlx::Connection>::connect(&admin).await.unwrap();
        let ended = sqlx::query(
            "SELECT count(*) AS n FROM (SELECT pg_terminate_backend(pid, 1000) FROM pg_stat_activity \
             WHERE datname = $1) AS t",
        )
        .bind(&db)
        .fetch_one(&mut conn)
        .await
        .unwrap()
        .get::<i64, _>("n");
        assert!(ended >= 1 && idle >= 1, "{ended} connections ended, {idle} idle");
        run_batch(&pool, &mut None, &mut [probe(6)], &mut receipts, &None).await.unwrap();
        assert_eq!(probes(&pool).await, [1, 3, 5, 6]);
        drop(pool);
        drop_database(store, &admin, &db).await;
    }
}

//! Group commit: one writer runs every queued write of the store in one transaction.
//!
//! Run one transaction each, the writes of a busy gateway serialise on SQLite's single
//! writer and pay one commit (an fsync) apiece. Here one writer owns the writes: it
//! takes every write queued at that moment (up to `MAX_BATCH`), runs them in order in
//! one transaction, commits once, and only then answers each caller. The semantics of
//! each write are those of running it alone, because writes in a batch run one after
//! another in the same transaction: a reservation that finds a counter full undoes its
//! own increments before the next write runs. If the batch fails as a whole (a
//! constraint error, a PostgreSQL deadlock between replicas), nothing was answered
//! yet, so the writes are retried one transaction each and every caller gets its own
//! result. A database that is locked or does not answer in time fails the whole batch
//! at once (`StoreError::Unavailable`): retrying one by one would wait as long again
//! for each.
//!
//! The writer knows no domain. A write is a `Write`: the domain module that owns it
//! says how it runs on SQLite (statements in the writer's transaction) and how it runs
//! on PostgreSQL (one element of the JSON array a batch function takes, or plain
//! statements), and reads its own answer. Adding a write never touches this file.
//!
//! On SQLite the writer is a thread that owns a plain `rusqlite` connection. sqlx's
//! SQLite driver runs each statement on a worker thread and hands it over twice; under
//! load those handoffs were 60 % of the gateway's CPU (measured with perf, see
//! BENCHMARKS.md) while SQLite itself was 2 %. One thread that does a whole batch
//! costs one handoff per batch instead. On PostgreSQL the writer is a task that sends
//! the whole batch as one statement calling each batch function that has writes
//! (`gateway_write_batch`, `gateway_pbx_admit`, `gateway_webhook_finish`,
//! `gateway_send_ops`: migrations 0002 to 0008) with its array: one round trip and one
//! commit per batch, where a statement per write cost a round trip each and kept the
//! writer busy (measured in BENCHMARKS.md). Writes that are plain statements run after
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

use super::{StoreError, bind_dollar};
use rusqlite::types::Value as SqlValue;
use sqlx::pool::PoolConnection;
use sqlx::{AnyPool, Row};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};

/// Largest number of writes in one transaction.
pub(super) const MAX_BATCH: usize = 256;

/// The PostgreSQL writer's lanes (see the header).
pub(super) mod lane {
    /// Counters, keys, and every write not named below.
    pub const MAIN: usize = 0;
    /// The outcome of a send that gives no counter back.
    pub const SETTLE: usize = 1;
    /// The outcome of a webhook delivery.
    pub const DELIVERY: usize = 2;
    /// How many there are.
    pub const COUNT: usize = 3;
}

/// One write the writer runs for a caller, defined by the module that owns it.
pub(super) trait Write: Send + 'static {
    /// What the caller gets once the batch committed.
    type Output: Send + 'static;

    /// Runs the write in the SQLite writer's transaction.
    fn sqlite(&self, tx: &rusqlite::Transaction<'_>) -> Result<Self::Output, StoreError>;

    /// How the write runs on PostgreSQL.
    fn postgres(&self) -> Postgres;

    /// The output, from the write's answer on PostgreSQL.
    fn read_postgres(&self, answer: PgAnswer) -> Result<Self::Output, StoreError>;

    /// Statements that follow on PostgreSQL in the same transaction, given the output.
    fn postgres_then(&self, _output: &Self::Output) -> Vec<Statement> {
        Vec::new()
    }

    /// Whether `postgres_then` may give statements (the batch then runs in an explicit
    /// transaction).
    fn has_then(&self) -> bool {
        false
    }

    /// The PostgreSQL lane that runs it (see `lane`).
    fn lane(&self) -> usize {
        lane::MAIN
    }
}

/// How a write runs on PostgreSQL.
pub(super) enum Postgres {
    /// One element of the JSON array that `function` takes; the write's answer is the
    /// element at the same place in the array the function returns.
    Call { function: &'static str, arg: serde_json::Value },
    /// Plain statements, after the batch's calls, in its transaction; the answer is the
    /// rows each affected.
    Statements(Vec<Statement>),
}

/// A write's answer on PostgreSQL.
pub(super) enum PgAnswer {
    Value(serde_json::Value),
    Rows(Vec<u64>),
}

/// One statement: SQL with `$n` parameters and their values.
#[derive(Clone, Debug)]
pub(super) struct Statement {
    pub sql: &'static str,
    pub params: Vec<SqlValue>,
}

/// Plain statements run in order; answers the rows affected by each.
pub(super) struct Exec(pub Vec<Statement>);

impl Write for Exec {
    type Output = Vec<u64>;

    fn sqlite(&self, tx: &rusqlite::Transaction<'_>) -> Result<Vec<u64>, StoreError> {
        self.0.iter().map(|st| sqlite_exec(tx, st)).collect()
    }

    fn postgres(&self) -> Postgres {
        Postgres::Statements(self.0.clone())
    }

    fn read_postgres(&self, answer: PgAnswer) -> Result<Vec<u64>, StoreError> {
        match answer {
            PgAnswer::Rows(rows) => Ok(rows),
            PgAnswer::Value(v) => Err(unexpected(&v)),
        }
    }
}

/// Runs one statement in a SQLite transaction; the rows it changed.
pub(super) fn sqlite_exec(tx: &rusqlite::Transaction<'_>, st: &Statement) -> Result<u64, StoreError> {
    let mut stmt = tx.prepare_cached(st.sql)?;
    bind_dollar(&mut stmt, &st.params)?;
    Ok(stmt.raw_execute()? as u64)
}

/// An answer a write did not expect.
pub(super) fn unexpected(v: &serde_json::Value) -> StoreError {
    StoreError::Conflict(format!("unexpected write batch answer {v}"))
}

/// A queued write with its result so far and its caller.
pub(super) type Queued = Box<dyn Unit>;

/// A write with its types erased, as the writer holds it.
pub(super) trait Unit: Send {
    fn sqlite(&mut self, tx: &rusqlite::Transaction<'_>) -> Result<(), StoreError>;
    fn postgres(&self) -> Postgres;
    fn has_then(&self) -> bool;
    /// Takes the answer; the statements that follow.
    fn read_postgres(&mut self, answer: PgAnswer) -> Result<Vec<Statement>, StoreError>;
    /// Answers the caller: the output, or `failure`.
    fn reply(self: Box<Self>, failure: Option<StoreError>);
}

/// A write and the caller waiting for its output.
pub(super) struct Pending<W: Write> {
    pub write: W,
    pub output: Option<W::Output>,
    pub reply: oneshot::Sender<Result<W::Output, StoreError>>,
}

impl<W: Write> Unit for Pending<W> {
    fn sqlite(&mut self, tx: &rusqlite::Transaction<'_>) -> Result<(), StoreError> {
        self.output = Some(self.write.sqlite(tx)?);
        Ok(())
    }

    fn postgres(&self) -> Postgres {
        self.write.postgres()
    }

    fn has_then(&self) -> bool {
        self.write.has_then()
    }

    fn read_postgres(&mut self, answer: PgAnswer) -> Result<Vec<Statement>, StoreError> {
        let output = self.write.read_postgres(answer)?;
        let then = self.write.postgres_then(&output);
        self.output = Some(output);
        Ok(then)
    }

    fn reply(self: Box<Self>, failure: Option<StoreError>) {
        let result = match (failure, self.output) {
            (Some(e), _) => Err(e),
            (None, Some(output)) => Ok(output),
            (None, None) => Err(StoreError::Conflict("a write gave no result".into())),
        };
        // A caller that went away (request cancelled) simply gets no answer.
        let _ = self.reply.send(result);
    }
}

/// Takes whatever else is queued, up to a full batch.
fn fill(rx: &mut mpsc::Receiver<Queued>, batch: &mut Vec<Queued>) {
    while batch.len() < MAX_BATCH {
        match rx.try_recv() {
            Ok(op) => batch.push(op),
            Err(_) => break,
        }
    }
}

/// What the writers of this process have done: batches, writes in them, and time
/// spent running them (read into the metrics at each scrape).
static BATCHES: AtomicU64 = AtomicU64::new(0);
static WRITES: AtomicU64 = AtomicU64::new(0);
static BUSY_US: AtomicU64 = AtomicU64::new(0);

/// `(batches, writes, microseconds running them)` since the process started.
pub fn stats() -> (u64, u64, u64) {
    (BATCHES.load(Ordering::Relaxed), WRITES.load(Ordering::Relaxed), BUSY_US.load(Ordering::Relaxed))
}

/// Upper bounds, in microseconds, of the buckets batches are counted in by how long each
/// took (the last bucket, past them all, is not listed): its transaction and its commit,
/// SQLite's checkpoints and the disk's syncs included. The mean hides what an operator
/// needs to see here: a batch that stalls holds every send queued behind it (BENCHMARKS.md,
/// issue 22, seventeenth session).
pub const BATCH_BOUNDS_US: [u64; 13] =
    [100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000, 1_000_000];
static BATCH_BUCKETS: [AtomicU64; BATCH_BOUNDS_US.len() + 1] = [const { AtomicU64::new(0) }; BATCH_BOUNDS_US.len() + 1];

/// The batches since the process started, by how long each took: the count of each
/// bucket of `BATCH_BOUNDS_US` alone (not cumulative), the last one past them all.
pub fn batch_durations() -> [u64; BATCH_BOUNDS_US.len() + 1] {
    std::array::from_fn(|i| BATCH_BUCKETS[i].load(Ordering::Relaxed))
}

/// The bucket of a batch that took `us` microseconds.
fn batch_bucket(us: u64) -> usize {
    BATCH_BOUNDS_US.partition_point(|bound| *bound < us)
}

fn log_batch(log: &Option<slog::Logger>, writes: usize, ok: bool, started: std::time::Instant) {
    // Rounded up, so that a batch just past a bound is not counted within it.
    let took_us = started.elapsed().as_nanos().div_ceil(1_000) as u64;
    // Its bucket first: a scrape reads the batches counted, then the buckets, so these
    // hold at least every batch that counter does.
    BATCH_BUCKETS[batch_bucket(took_us)].fetch_add(1, Ordering::Relaxed);
    BATCHES.fetch_add(1, Ordering::Relaxed);
    WRITES.fetch_add(writes as u64, Ordering::Relaxed);
    BUSY_US.fetch_add(took_us, Ordering::Relaxed);
    if let Some(log) = log {
        slog::debug!(log, "write batch"; "writes" => writes, "ok" => ok,
                     "elapsed_us" => took_us);
    }
}

/// The file of a `sqlite:` URL.
pub(super) fn sqlite_path(url: &str) -> Option<PathBuf> {
    let rest = url.strip_prefix("sqlite://").or_else(|| url.strip_prefix("sqlite:"))?;
    let path = rest.split('?').next().unwrap_or_default();
    (!path.is_empty() && !path.starts_with(":memory:")).then(|| PathBuf::from(path))
}

/// The writer's connection to the SQLite file `path`: the store's pragmas, the replay
/// check's table (see `pbx::admit`), the lock's polling (`busy`), and room for every
/// statement the gateway writes with (`SQLITE_STATEMENTS_KEPT`).
pub(super) fn sqlite_writer_connection(
    path: &std::path::Path,
    options: super::StoreOptions,
) -> Result<rusqlite::Connection, StoreError> {
    let conn = rusqlite::Connection::open(path)?;
    conn.execute_batch(&options.sqlite_pragmas())?;
    conn.execute_batch(super::pbx::SQLITE_WRITER_SETUP)?;
    conn.busy_handler(Some(busy::poll))?;
    conn.set_prepared_statement_cache_capacity(super::SQLITE_STATEMENTS_KEPT);
    Ok(conn)
}

/// Starts the SQLite writer thread on the database file `path`.
pub(super) fn spawn_sqlite(
    path: PathBuf,
    options: super::StoreOptions,
    log: Option<slog::Logger>,
) -> Result<mpsc::Sender<Queued>, StoreError> {
    let mut conn = sqlite_writer_connection(&path, options)?;
    let (tx, mut rx) = mpsc::channel::<Queued>(4 * MAX_BATCH);
    std::thread::Builder::new()
        .name("sqlite-writer".into())
        .spawn(move || {
            busy::LIMIT.set(options.timeout);
            let mut batch = Vec::with_capacity(MAX_BATCH);
            while let Some(first) = rx.blocking_recv() {
                batch.push(first);
                fill(&mut rx, &mut batch);
                let started = std::time::Instant::now();
                let outcome = sqlite_batch(&mut conn, &mut batch);
                log_batch(&log, batch.len(), outcome.is_ok(), started);
                match outcome {
                    Ok(()) => batch.drain(..).for_each(|unit| unit.reply(None)),
                    // Another process holds the file: every write would wait as long
                    // again, so the whole batch fails now (503) instead of one by one.
                    Err(StoreError::Sqlite(e)) if super::is_sqlite_busy(&e) => {
                        batch.drain(..).for_each(|unit| unit.reply(Some(StoreError::Unavailable(e.to_string()))));
                    }
                    Err(_) => {
                        for mut unit in batch.drain(..) {
                            let alone = sqlite_batch(&mut conn, std::slice::from_mut(&mut unit));
                            unit.reply(alone.err());
                        }
                    }
                }
            }
        })
        .map_err(|e| StoreError::Conflict(format!("starting the SQLite writer: {e}")))?;
    Ok(tx)
}

/// The SQLite writer's busy handler. SQLite's own (what `busy_timeout` installs) sleeps
/// 1, 2, 5, 10, ... up to 100 ms between tries, so a writer that meets a short
/// transaction of another connection (the dispatcher's claim, a `gateway retention run`
/// batch from another process) slept up to twice as long as the lock was held, and
/// every send queued behind it waited as long (BENCHMARKS.md, issue 22). The writer
/// tries again every quarter of a millisecond instead, then every 2 ms after the first
/// second, until the store's timeout (`StoreOptions::timeout`) has passed.
mod busy {
    use std::cell::Cell;
    use std::time::{Duration, Instant};

    thread_local! {
        /// How long one statement may wait for the lock (set by the writer thread).
        pub static LIMIT: Cell<Duration> = const { Cell::new(Duration::from_secs(10)) };
        static SINCE: Cell<Option<Instant>> = const { Cell::new(None) };
    }

    /// Called by SQLite with the number of tries so far; false gives up (SQLITE_BUSY).
    pub fn poll(tries: i32) -> bool {
        let now = Instant::now();
        if tries == 0 {
            SINCE.set(Some(now));
        }
        let waited = now - SINCE.get().unwrap_or(now);
        if waited >= LIMIT.get() {
            return false;
        }
        let step = if waited < Duration::from_secs(1) { Duration::from_micros(250) } else { Duration::from_millis(2) };
        std::thread::sleep(step);
        true
    }
}

thread_local! {
    /// The serial of the transaction the SQLite writer thread runs or ran last (0 on
    /// any other thread).
    static TRANSACTION: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Which transaction of the SQLite writer this thread is in: a serial that changes with
/// each transaction, retries of a failed batch's writes included; 0 on any other thread,
/// where a caller must take each transaction for a new one. A write whose work is needed
/// once a transaction rather than once a write (the PBX replay check's catch-up with what
/// other processes appended, which cannot change while the writer holds the lock) keeps
/// the serial it last did it in.
pub(super) fn sqlite_transaction() -> u64 {
    TRANSACTION.get()
}

fn sqlite_batch(conn: &mut rusqlite::Connection, batch: &mut [Queued]) -> Result<(), StoreError> {
    TRANSACTION.set(TRANSACTION.get() + 1);
    let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
    for unit in batch.iter_mut() {
        unit.sqlite(&tx)?;
    }
    tx.commit()?;
    Ok(())
}

/// Starts the PostgreSQL writer's lanes over `pool`, one task each (the senders in lane
/// order); each ends when its senders are dropped.
pub(super) fn spawn_sqlx(pool: AnyPool, timeout: Duration, log: Option<slog::Logger>) -> Vec<mpsc::Sender<Queued>> {
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
    let day_ago = super::now_ms() - 86_400_000;
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
                    .bind(super::now_ms())
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
            Err(StoreError::Database(e)) if tries > 0 && super::dropped_connection(&e) => {
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

async fn timed(
    timeout: Duration,
    batch: impl std::future::Future<Output = Result<(), StoreError>>,
) -> Result<(), StoreError> {
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
    let mut query = sqlx::query(&sql).bind(writer).bind(token).bind(super::now_ms());
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
                    rows.push(
                        super::bind_all(sqlx::query(st.sql), st.params).execute(&mut *conn).await?.rows_affected(),
                    );
                }
                PgAnswer::Rows(rows)
            }
            (Postgres::Call { .. }, None) => unreachable!("every call has its place"),
        };
        for st in unit.read_postgres(answer)? {
            super::bind_all(sqlx::query(st.sql), st.params).execute(&mut *conn).await?;
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
    use super::*;
    use crate::store::test_postgres::{drop_database, postgres_store};

    /// Whether `conn` still holds the first of 100 statements compiled and run one after
    /// the other: a statement compiled again has not run yet.
    fn keeps_a_hundred_statements(conn: &rusqlite::Connection) -> bool {
        let sql = |n: usize| format!("SELECT {n}");
        for n in 0..100 {
            conn.prepare_cached(&sql(n)).unwrap().query_row([], |_| Ok(())).unwrap();
        }
        conn.prepare_cached(&sql(0)).unwrap().get_status(rusqlite::StatementStatus::Run) == 1
    }

    #[test]
    fn the_writer_and_the_readers_keep_the_statements_they_compiled() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("kept.db");
        let writer = sqlite_writer_connection(&path, super::super::StoreOptions::default()).unwrap();
        assert!(keeps_a_hundred_statements(&writer), "the writer's connection");
        let readers = super::super::SqliteReaders { path, idle: Default::default() };
        assert!(keeps_a_hundred_statements(&readers.open().unwrap()), "a reader's connection");
        // What rusqlite keeps by itself: the sixteen most recently used.
        let plain = rusqlite::Connection::open_in_memory().unwrap();
        assert!(!keeps_a_hundred_statements(&plain));
    }

    #[test]
    fn a_batch_is_counted_in_the_first_bucket_whose_bound_it_does_not_pass() {
        assert_eq!(batch_bucket(0), 0);
        assert_eq!(batch_bucket(100), 0, "a bound is inclusive, as Prometheus's `le`");
        assert_eq!(batch_bucket(101), 1);
        assert_eq!(batch_bucket(4_999), 5);
        assert_eq!(batch_bucket(1_000_000), BATCH_BOUNDS_US.len() - 1);
        assert_eq!(batch_bucket(1_000_001), BATCH_BOUNDS_US.len(), "past every bound");
        assert!(BATCH_BOUNDS_US.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn sqlite_urls_name_their_file() {
        assert_eq!(sqlite_path("sqlite://gateway.db?mode=rwc"), Some(PathBuf::from("gateway.db")));
        assert_eq!(sqlite_path("sqlite:///tmp/x/g.db?mode=rwc"), Some(PathBuf::from("/tmp/x/g.db")));
        assert_eq!(sqlite_path("sqlite:g.db"), Some(PathBuf::from("g.db")));
        assert_eq!(sqlite_path("sqlite::memory:"), None);
        assert_eq!(sqlite_path("postgres://x/y"), None);
    }

    #[test]
    fn the_writer_polls_for_the_lock_until_the_store_timeout_and_then_gives_up() {
        super::busy::LIMIT.set(std::time::Duration::from_millis(50));
        let started = std::time::Instant::now();
        let mut tries = 0;
        while super::busy::poll(tries) {
            tries += 1;
        }
        let waited = started.elapsed();
        assert!(waited >= std::time::Duration::from_millis(50), "gave up after {waited:?}");
        // A quarter of a millisecond a try (SQLite's own handler: 1, 2, 5, 10 ms, ...).
        assert!(tries >= 8, "only {tries} tries in {waited:?}");
        // A new wait starts its clock again.
        assert!(super::busy::poll(0));
    }

    /// A write that answers the transaction it ran in (or fails).
    struct Serial(bool);

    impl Write for Serial {
        type Output = u64;

        fn sqlite(&self, _tx: &rusqlite::Transaction<'_>) -> Result<u64, StoreError> {
            if self.0 { Err(StoreError::Conflict("this write fails".into())) } else { Ok(sqlite_transaction()) }
        }

        fn postgres(&self) -> Postgres {
            Postgres::Statements(Vec::new())
        }

        fn read_postgres(&self, _answer: PgAnswer) -> Result<u64, StoreError> {
            Ok(0)
        }
    }

    /// Runs `fails` (one write each) as one batch on `conn`; the serial each write saw.
    fn serials(conn: &mut rusqlite::Connection, fails: &[bool]) -> Vec<Option<u64>> {
        let (mut batch, mut answers) = (Vec::new(), Vec::new());
        for fail in fails {
            let (reply, answer) = oneshot::channel();
            batch.push(Box::new(Pending { write: Serial(*fail), output: None, reply }) as Queued);
            answers.push(answer);
        }
        let failure = sqlite_batch(conn, &mut batch).err();
        for unit in batch {
            unit.reply(failure.as_ref().map(|e| StoreError::Conflict(e.to_string())));
        }
        answers.into_iter().map(|mut a| a.try_recv().unwrap().ok()).collect()
    }

    /// The writes of one transaction see one serial; the next transaction another,
    /// whether the last committed or failed (a failed batch's transaction used its
    /// serial up, so each of its writes run again alone gets a new one). What the PBX
    /// replay check's catch-up, once a transaction, relies on.
    #[test]
    fn each_sqlite_transaction_has_a_serial_of_its_own() {
        let first = std::thread::spawn(|| {
            let mut conn = rusqlite::Connection::open_in_memory().unwrap();
            let outside = sqlite_transaction();
            let one = serials(&mut conn, &[false, false]);
            let two = serials(&mut conn, &[false, true]);
            let three = serials(&mut conn, &[false]);
            (outside, one, two, three)
        });
        let (outside, one, two, three) = first.join().unwrap();
        assert_eq!(outside, 0, "no transaction yet on this thread");
        let s = one[0].unwrap();
        assert!(s > 0);
        assert_eq!(one, [Some(s), Some(s)], "one batch, one transaction");
        assert_eq!(two, [None, None], "a failed batch answers nothing");
        assert_eq!(three, [Some(s + 2)], "the failed transaction had its own serial");
        assert_eq!(sqlite_transaction(), 0, "another thread's serial is its own");
    }

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
                .bind(super::super::now_ms())
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

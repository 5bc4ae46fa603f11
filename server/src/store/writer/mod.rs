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
//! On SQLite the writer is a thread that owns a plain connection (`sqlite`); on
//! PostgreSQL it is several lanes, tasks that send each batch as one statement
//! (`postgres`). Each file's header says why.

use super::StoreError;
use rusqlite::types::Value as SqlValue;
use std::sync::atomic::{AtomicU64, Ordering};
use tokio::sync::{mpsc, oneshot};

pub(super) mod checkpoints;
mod postgres;
mod sqlite;

pub(super) use postgres::{spawn_sqlx, timed};
pub(super) use sqlite::{spawn_sqlite, sqlite_exec, sqlite_on_rollback, sqlite_path, sqlite_transaction};
#[cfg(test)]
pub(super) use sqlite::{sqlite_batch, sqlite_writer_connection};

/// Largest number of writes in one transaction.
pub(super) const MAX_BATCH: usize = 256;

/// The PostgreSQL writer's lanes (see `postgres`).
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

#[cfg(test)]
mod tests {
    use super::*;

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
}

//! The SQLite writer: a thread that owns a plain `rusqlite` connection and runs each
//! batch in one transaction. sqlx's SQLite driver runs each statement on a worker thread
//! and hands it over twice; under load those handoffs were 60 % of the gateway's CPU
//! (measured with perf, see BENCHMARKS.md) while SQLite itself was 2 %. One thread that
//! does a whole batch costs one handoff per batch instead.

use super::{MAX_BATCH, Queued, Statement, checkpoints, fill, log_batch};
use crate::store::{StoreError, StoreOptions, bind_dollar, is_sqlite_busy};
use std::path::PathBuf;
use tokio::sync::mpsc;

/// Runs one statement in a SQLite transaction; the rows it changed.
pub(in crate::store) fn sqlite_exec(tx: &rusqlite::Transaction<'_>, st: &Statement) -> Result<u64, StoreError> {
    let mut stmt = tx.prepare_cached(st.sql)?;
    bind_dollar(&mut stmt, &st.params)?;
    Ok(stmt.raw_execute()? as u64)
}

/// The file of a `sqlite:` URL.
pub(in crate::store) fn sqlite_path(url: &str) -> Option<PathBuf> {
    let rest = url.strip_prefix("sqlite://").or_else(|| url.strip_prefix("sqlite:"))?;
    let path = rest.split('?').next().unwrap_or_default();
    (!path.is_empty() && !path.starts_with(":memory:")).then(|| PathBuf::from(path))
}

/// The writer's connection to the SQLite file `path`: the store's pragmas, temporary
/// tables in memory, the lock's polling (`busy`), and room for every statement the
/// gateway writes with (`SQLITE_STATEMENTS_KEPT`).
pub(in crate::store) fn sqlite_writer_connection(
    path: &std::path::Path,
    options: StoreOptions,
) -> Result<rusqlite::Connection, StoreError> {
    let conn = rusqlite::Connection::open(path)?;
    conn.execute_batch(&options.sqlite_pragmas())?;
    // The statements' own temporary tables (`RETURNING`'s, sorts) kept off the disk.
    conn.execute_batch("PRAGMA temp_store = MEMORY")?;
    conn.busy_handler(Some(busy::poll))?;
    conn.set_prepared_statement_cache_capacity(crate::store::SQLITE_STATEMENTS_KEPT);
    Ok(conn)
}

/// Starts the SQLite writer thread on the database file `path`.
pub(in crate::store) fn spawn_sqlite(
    path: PathBuf,
    options: StoreOptions,
    log: Option<slog::Logger>,
) -> Result<mpsc::Sender<Queued>, StoreError> {
    let mut conn = sqlite_writer_connection(&path, options)?;
    let (tx, mut rx) = mpsc::channel::<Queued>(4 * MAX_BATCH);
    std::thread::Builder::new()
        .name("sqlite-writer".into())
        .spawn(move || {
            busy::LIMIT.set(options.timeout);
            let mut batch = Vec::with_capacity(MAX_BATCH);
            checkpoints::set(&conn, checkpoints::QUIET_FRAMES, &log);
            let mut pacing = checkpoints::Pacing::new(std::time::Instant::now());
            while let Some(first) = rx.blocking_recv() {
                batch.push(first);
                fill(&mut rx, &mut batch);
                let started = std::time::Instant::now();
                let outcome = sqlite_batch(&mut conn, &mut batch);
                log_batch(&log, batch.len(), outcome.is_ok(), started);
                if let Some(frames) = pacing.after_batch(batch.len(), std::time::Instant::now()) {
                    checkpoints::set(&conn, frames, &log);
                }
                match outcome {
                    Ok(()) => batch.drain(..).for_each(|unit| unit.reply(None)),
                    // Another process holds the file: every write would wait as long
                    // again, so the whole batch fails now (503) instead of one by one.
                    Err(StoreError::Sqlite(e)) if is_sqlite_busy(&e) => {
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

/// What a write undoes when its transaction rolls back: memory of its own that it
/// changed beside the database (see `sqlite_on_rollback`).
type Undo = Box<dyn FnOnce()>;

thread_local! {
    /// The serial of the transaction the SQLite writer thread runs or ran last.
    static SERIAL: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
    /// Whether this thread is running a writer's transaction (`sqlite_batch`).
    static RUNNING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    /// What the transaction in progress undoes if it rolls back, in the order registered.
    static UNDO: std::cell::RefCell<Vec<Undo>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Which transaction of the SQLite writer this thread is in: a serial that changes with
/// each transaction, retries of a failed batch's writes included; 0 outside the writer's
/// transactions (on any other thread, or between two batches), where a caller must take
/// each transaction for a new one. A write whose work is needed once a transaction rather
/// than once a write (the PBX replay check's catch-up with what other processes appended,
/// which cannot change while the writer holds the lock) keeps the serial it last did it
/// in.
pub(in crate::store) fn sqlite_transaction() -> u64 {
    if RUNNING.get() { SERIAL.get() } else { 0 }
}

/// Runs `undo` if the writer's transaction in progress rolls back (a write of its batch
/// failed, or its commit did), after SQLite has undone the rows; nothing if it commits.
/// For a write that keeps memory of its own beside the rows it writes (the PBX replay
/// check's signatures), so that the memory rolls back with them. Only inside the
/// writer's transactions (`sqlite_transaction` is not 0); elsewhere nothing is
/// registered and nothing is undone.
pub(in crate::store) fn sqlite_on_rollback(undo: impl FnOnce() + 'static) {
    if RUNNING.get() {
        UNDO.with_borrow_mut(|list| list.push(Box::new(undo)));
    }
}

/// Runs a batch in one transaction on the writer's connection; if it fails, what its
/// writes registered with `sqlite_on_rollback` is undone, last first.
pub(in crate::store) fn sqlite_batch(conn: &mut rusqlite::Connection, batch: &mut [Queued]) -> Result<(), StoreError> {
    SERIAL.set(SERIAL.get() + 1);
    RUNNING.set(true);
    let ran = run_transaction(conn, batch);
    RUNNING.set(false);
    let undo = UNDO.take();
    if ran.is_err() {
        undo.into_iter().rev().for_each(|undo| undo());
    }
    ran
}

/// The batch's writes in one transaction: rolled back (the transaction dropped) on the
/// first that fails, and when the commit fails.
fn run_transaction(conn: &mut rusqlite::Connection, batch: &mut [Queued]) -> Result<(), StoreError> {
    let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
    for unit in batch.iter_mut() {
        unit.sqlite(&tx)?;
    }
    tx.commit()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::{Pending, PgAnswer, Postgres, Write};
    use super::*;
    use tokio::sync::oneshot;

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
        let writer = sqlite_writer_connection(&path, StoreOptions::default()).unwrap();
        assert!(keeps_a_hundred_statements(&writer), "the writer's connection");
        let readers = crate::store::SqliteReaders::new(path);
        assert!(keeps_a_hundred_statements(&readers.open().unwrap()), "a reader's connection");
        // What rusqlite keeps by itself: the sixteen most recently used.
        let plain = rusqlite::Connection::open_in_memory().unwrap();
        assert!(!keeps_a_hundred_statements(&plain));
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

    thread_local! {
        /// The marks of the `Marks` writes undone on this thread, in the order undone.
        static UNDONE: std::cell::RefCell<Vec<u32>> = const { std::cell::RefCell::new(Vec::new()) };
    }

    /// A write that registers an undo that notes its mark (`UNDONE`).
    struct Marks(u32);

    impl Write for Marks {
        type Output = ();

        fn sqlite(&self, _tx: &rusqlite::Transaction<'_>) -> Result<(), StoreError> {
            let mark = self.0;
            sqlite_on_rollback(move || UNDONE.with_borrow_mut(|undone| undone.push(mark)));
            Ok(())
        }

        fn postgres(&self) -> Postgres {
            Postgres::Statements(Vec::new())
        }

        fn read_postgres(&self, _answer: PgAnswer) -> Result<(), StoreError> {
            Ok(())
        }
    }

    /// Runs the writes marked `marks`, then a write that fails if `fail`, as one batch.
    fn marked(conn: &mut rusqlite::Connection, marks: &[u32], fail: bool) {
        let mut batch: Vec<Queued> = marks
            .iter()
            .map(|&mark| Box::new(Pending { write: Marks(mark), output: None, reply: oneshot::channel().0 }) as Queued)
            .collect();
        if fail {
            batch.push(Box::new(Pending { write: Serial(true), output: None, reply: oneshot::channel().0 }));
        }
        assert_eq!(sqlite_batch(conn, &mut batch).is_err(), fail);
    }

    /// What the writes of a batch register is undone, last first, when the batch fails,
    /// and dropped when it commits; outside the writer's transactions nothing is
    /// registered. What the PBX replay check's memory relies on.
    #[test]
    fn a_failed_batch_undoes_what_its_writes_registered_last_first() {
        std::thread::spawn(|| {
            let undone = || UNDONE.with_borrow(|undone| undone.clone());
            sqlite_on_rollback(|| UNDONE.with_borrow_mut(|undone| undone.push(0)));
            assert_eq!(UNDO.with_borrow(Vec::len), 0, "outside a transaction nothing is registered");
            let mut conn = rusqlite::Connection::open_in_memory().unwrap();
            marked(&mut conn, &[1, 2], false);
            assert_eq!(undone(), [0u32; 0], "a committed batch undoes nothing, nor what came before it");
            marked(&mut conn, &[3, 4, 5], true);
            assert_eq!(undone(), [5, 4, 3]);
            marked(&mut conn, &[6], false);
            marked(&mut conn, &[], true);
            assert_eq!(undone(), [5, 4, 3], "each batch undoes only what its own writes registered");
        })
        .join()
        .unwrap();
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
            (outside, one, two, three, sqlite_transaction())
        });
        let (outside, one, two, three, between) = first.join().unwrap();
        assert_eq!(outside, 0, "no transaction yet on this thread");
        assert_eq!(between, 0, "none between two batches");
        let s = one[0].unwrap();
        assert!(s > 0);
        assert_eq!(one, [Some(s), Some(s)], "one batch, one transaction");
        assert_eq!(two, [None, None], "a failed batch answers nothing");
        assert_eq!(three, [Some(s + 2)], "the failed transaction had its own serial");
        assert_eq!(sqlite_transaction(), 0, "another thread's serial is its own");
    }
}

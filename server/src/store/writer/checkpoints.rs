//! When the SQLite writer lets SQLite checkpoint. A commit that leaves the WAL longer
//! than `wal_autocheckpoint` frames copies them into the database file before the writer
//! takes its next batch, and every write queued meanwhile waits.
//!
//! A quiet writer keeps SQLite's default, 1,000 frames (about 4 MiB): short checkpoints,
//! which the p99 at an offered 1,000 sends a second needs. A busy one lets the WAL grow
//! to 10,000 frames (about 40 MiB, the size the `-wal` file then keeps: SQLite reuses
//! it). The pages that every commit dirties again (each index's last leaf, the
//! counters) are then copied once a checkpoint rather than ten times (BENCHMARKS.md,
//! issue 22, "SQLite's checkpoints paced by the writer's load"). Busy is a mean of at
//! least [`BUSY_BATCH`] writes a batch over a [`WINDOW`]: 1.5 at 1,000 sends a second,
//! 8 to 11 at saturation. The first quiet commit after a busy spell copies what the busy
//! writer left, up to 10,000 frames, once.
//!
//! Every connection starts with the busy setting (`StoreOptions::sqlite_pragmas`), so
//! that the process's other connections that write (the lease's renewal, the write pool)
//! never checkpoint in the middle of the writer's long WAL; the writer gives its own the
//! quiet one when it starts. A CLI process that writes (`gateway retention run`) has a
//! writer of its own, paced alike: its single writes keep it quiet, so it checkpoints at
//! 1,000 frames, as every process did before.

use std::time::{Duration, Instant};

/// SQLite's default, kept while the writer is quiet.
pub const QUIET_FRAMES: i64 = 1_000;
/// While the writer is busy, and on every other connection.
pub const BUSY_FRAMES: i64 = 10_000;
/// The mean writes a batch from which the writer counts as busy.
pub const BUSY_BATCH: u64 = 4;
/// How often the writer looks again.
pub const WINDOW: Duration = Duration::from_millis(100);

/// The writer's batches since the window began, and the setting last given.
pub struct Pacing {
    frames: i64,
    since: Instant,
    batches: u64,
    writes: u64,
}

impl Pacing {
    /// Quiet, from `now` (the caller gives the connection [`QUIET_FRAMES`]).
    pub fn new(now: Instant) -> Pacing {
        Pacing { frames: QUIET_FRAMES, since: now, batches: 0, writes: 0 }
    }

    /// Counts a batch of `writes`; at the end of a window, the setting to give the
    /// connection if it changed.
    pub fn after_batch(&mut self, writes: usize, now: Instant) -> Option<i64> {
        self.batches += 1;
        self.writes += writes as u64;
        if now.duration_since(self.since) < WINDOW {
            return None;
        }
        let frames = if self.writes >= BUSY_BATCH * self.batches { BUSY_FRAMES } else { QUIET_FRAMES };
        let changed = frames != self.frames;
        *self = Pacing { frames, ..Pacing::new(now) };
        changed.then_some(frames)
    }
}

/// Gives the writer's connection `frames`. A failure (which SQLite has no reason for)
/// leaves the last setting until the load changes again, and is logged.
pub fn set(conn: &rusqlite::Connection, frames: i64, log: &Option<slog::Logger>) {
    let outcome = conn.pragma_update(None, "wal_autocheckpoint", frames);
    match (log, outcome) {
        (Some(log), Err(e)) => {
            slog::warn!(log, "could not pace SQLite's checkpoints"; "wal_frames" => frames, "error" => %e)
        }
        (Some(log), Ok(())) => slog::debug!(log, "checkpoint pacing"; "wal_frames" => frames),
        (None, _) => {}
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Pending, PgAnswer, Postgres, Queued, Write, spawn_sqlite, sqlite_writer_connection};
    use super::*;
    use crate::store::{StoreError, StoreOptions};
    use tokio::sync::oneshot;

    /// The pacing's windows: busy from a mean of four writes a batch over a tenth of a
    /// second, quiet below it, and a change only at the end of a window.
    #[test]
    fn checkpoints_are_paced_by_the_mean_batch_of_each_window() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let mut p = Pacing::new(t0);
        assert_eq!(p.after_batch(40, at(10)), None, "not before the window ends");
        assert_eq!(p.after_batch(1, at(100)), Some(BUSY_FRAMES), "41 writes in 2 batches");
        assert_eq!(p.after_batch(7, at(150)), None);
        assert_eq!(p.after_batch(1, at(200)), None, "4 writes a batch is still busy: no change");
        assert_eq!(p.after_batch(5, at(250)), None);
        assert_eq!(p.after_batch(2, at(300)), Some(QUIET_FRAMES), "3.5 writes a batch");
        assert_eq!(p.after_batch(1, at(5_000)), None, "an idle pause is a quiet window");
    }

    /// A write that holds the writer until it is let go (`None`: it does not wait).
    struct Held(Option<std::sync::Mutex<std::sync::mpsc::Receiver<()>>>);

    /// What the writer's connection has for `wal_autocheckpoint`, read in its transaction.
    struct Frames;

    impl Write for Held {
        type Output = ();

        fn sqlite(&self, _tx: &rusqlite::Transaction<'_>) -> Result<(), StoreError> {
            if let Some(wait) = &self.0 {
                let _ = wait.lock().unwrap().recv();
            }
            Ok(())
        }

        fn postgres(&self) -> Postgres {
            Postgres::Statements(Vec::new())
        }

        fn read_postgres(&self, _answer: PgAnswer) -> Result<(), StoreError> {
            Ok(())
        }
    }

    impl Write for Frames {
        type Output = i64;

        fn sqlite(&self, tx: &rusqlite::Transaction<'_>) -> Result<i64, StoreError> {
            Ok(tx.pragma_query_value(None, "wal_autocheckpoint", |r| r.get(0))?)
        }

        fn postgres(&self) -> Postgres {
            Postgres::Statements(Vec::new())
        }

        fn read_postgres(&self, _answer: PgAnswer) -> Result<i64, StoreError> {
            Ok(0)
        }
    }

    /// Queues `write` on the writer `tx`; its answer, to wait for.
    fn queue<W: Write>(
        tx: &tokio::sync::mpsc::Sender<Queued>,
        write: W,
    ) -> oneshot::Receiver<Result<W::Output, StoreError>> {
        let (reply, answer) = oneshot::channel();
        tx.blocking_send(Box::new(Pending { write, output: None, reply })).map_err(|_| ()).unwrap();
        answer
    }

    /// The writer thread's own connection: quiet at start, busy after a window with a
    /// batch of 64 writes, quiet again after a window of single writes; another
    /// connection starts busy. Each step is tried up to five times: a machine that
    /// stalls the test for a tenth of a second can end a window early.
    #[test]
    fn the_writer_thread_paces_its_connections_checkpoints() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("paced.db");
        let other = sqlite_writer_connection(&path, StoreOptions::default()).unwrap();
        let frames: i64 = other.pragma_query_value(None, "wal_autocheckpoint", |r| r.get(0)).unwrap();
        assert_eq!(frames, BUSY_FRAMES, "a connection other than the writer's");
        let tx = spawn_sqlite(path, StoreOptions::default(), None).unwrap();
        let frames = || queue(&tx, Frames).blocking_recv().unwrap().unwrap();
        let alone = || queue(&tx, Held(None)).blocking_recv().unwrap().unwrap();
        assert_eq!(frames(), QUIET_FRAMES, "the writer starts quiet");
        let busy = (0..5).any(|_| {
            // A first write holds the writer while 63 more queue behind it; then, a
            // window later, a single write ends the window.
            let (go, wait) = std::sync::mpsc::channel();
            let held = queue(&tx, Held(Some(wait.into())));
            let mut queued: Vec<_> = (0..63).map(|_| queue(&tx, Held(None))).collect();
            let last = queued.pop().unwrap();
            go.send(()).unwrap();
            held.blocking_recv().unwrap().unwrap();
            last.blocking_recv().unwrap().unwrap();
            std::thread::sleep(WINDOW);
            alone();
            frames() == BUSY_FRAMES
        });
        assert!(busy, "a window of large batches makes the writer busy");
        let quiet = (0..5).any(|_| {
            std::thread::sleep(WINDOW);
            alone();
            frames() == QUIET_FRAMES
        });
        assert!(quiet, "a window of single writes makes it quiet again");
    }
}

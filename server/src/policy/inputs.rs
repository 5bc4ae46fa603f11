//! Keeping what the policy modules saw of each send, for `gateway policy backtest`
//! (`[policies] input_retention_days`; `store::policy_inputs`).
//!
//! The send pipeline hands over the context its modules were first asked with once the
//! send's row is written; a background job (`policy inputs`) writes them in batches, on
//! PostgreSQL each gathered for a tenth of a second (`GATHER`). The send never waits:
//! when the queue is full, or the store refuses a batch, those inputs are not kept and
//! `gateway_policy_inputs_dropped_total` counts them. A crash loses at most what the job
//! was gathering and the batch in flight (a fraction of a second). The context holds
//! the message's text: it is never logged.

use crate::store::{Backend, Store};
use crate::tasks::{Shutdown, Tasks};
use gateway_policy_model::Context;
use slog::{Logger, warn};
use std::future::Future;
use std::time::Duration;
use tokio::sync::mpsc;

/// Inputs waiting to be written.
const QUEUE: usize = 8_192;
/// Inputs written in one store write at most.
const BATCH: usize = 512;
/// How long the writer gathers inputs after the first one before it writes them, on
/// PostgreSQL. Writing whatever had queued during the write before made batches of about
/// six inputs at 1,200 sends a second, each its own statement and commit beside the
/// writer's lanes (BENCHMARKS.md, "Policy inputs gathered"); the inputs of a tenth of a
/// second go in one. A crash loses at most these and the batch in flight. SQLite writes
/// each input as a statement of its own in the writer's transactions whatever the batch,
/// so there the job gathers nothing: a tenth of a second's inputs in one write only held
/// the sends queued behind it (BENCHMARKS.md).
const GATHER: Duration = Duration::from_millis(100);

/// Where the send pipeline hands its inputs.
#[derive(Clone)]
pub struct Inputs {
    queue: mpsc::Sender<(i64, Context)>,
}

impl Inputs {
    /// Starts the writer as the job `policy inputs` of `tasks`; at shutdown it writes
    /// what is queued and stops.
    pub fn start(store: Store, tasks: &mut Tasks, log: Logger) -> Inputs {
        let (queue, inbox) = mpsc::channel::<(i64, Context)>(QUEUE);
        let pause = match store.backend() {
            Backend::Postgres => GATHER,
            Backend::Sqlite => Duration::ZERO,
        };
        tasks.spawn("policy inputs", move |stop| {
            run(inbox, stop, pause, move |batch| {
                let (store, log) = (store.clone(), log.clone());
                async move { write(&store, batch, &log).await }
            })
        });
        Inputs { queue }
    }

    /// Keeps `ctx` as what the modules saw of the send of row `log_id` (never waits).
    pub fn keep(&self, log_id: i64, ctx: Context) {
        if self.queue.try_send((log_id, ctx)).is_err() {
            crate::metrics::get().policy_inputs_dropped.inc();
        }
    }
}

/// The job: takes what is queued, gathers what else comes within `pause` (nothing when it
/// is zero; at most `BATCH` in all), and hands the batch to `write`. At the stop it
/// writes what it gathered and everything still queued, then ends; it also ends when
/// every sender is gone.
async fn run<W, F>(mut inbox: mpsc::Receiver<(i64, Context)>, mut stop: Shutdown, pause: Duration, mut write: W)
where
    W: FnMut(Vec<(i64, Context)>) -> F,
    F: Future<Output = ()>,
{
    let mut batch = Vec::with_capacity(BATCH);
    loop {
        let received = tokio::select! {
            n = inbox.recv_many(&mut batch, BATCH) => n,
            _ = stop.stopped() => {
                inbox.close();
                while inbox.recv_many(&mut batch, BATCH).await > 0 {
                    write(std::mem::take(&mut batch)).await;
                }
                return;
            }
        };
        if received == 0 {
            return;
        }
        let until = tokio::time::Instant::now() + pause;
        while batch.len() < BATCH && !pause.is_zero() {
            let room = BATCH - batch.len();
            tokio::select! {
                n = inbox.recv_many(&mut batch, room) => if n == 0 { break },
                () = tokio::time::sleep_until(until) => break,
                () = stop.stopped() => break,
            }
        }
        write(std::mem::take(&mut batch)).await;
    }
}

async fn write(store: &Store, batch: Vec<(i64, Context)>, log: &Logger) {
    let count = batch.len() as u64;
    let rows: Vec<(i64, String)> = batch
        .into_iter()
        .filter_map(|(log_id, ctx)| serde_json::to_string(&ctx).ok().map(|json| (log_id, json)))
        .collect();
    if let Err(e) = store.keep_policy_inputs(rows).await {
        crate::metrics::get().policy_inputs_dropped.inc_by(count);
        warn!(log, "keeping policy inputs failed"; "inputs" => count, "error" => %e);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};
    use std::time::Instant;
    use tokio::time::sleep;

    type Written = Arc<Mutex<Vec<Vec<i64>>>>;

    /// Starts the job with a writer that records each batch's log ids.
    fn job(tasks: &mut Tasks, pause: Duration) -> (mpsc::Sender<(i64, Context)>, Written) {
        let (queue, inbox) = mpsc::channel(QUEUE);
        let written = Written::default();
        let w = written.clone();
        tasks.spawn("policy inputs", move |stop| {
            run(inbox, stop, pause, move |batch| {
                w.lock().unwrap().push(batch.iter().map(|(id, _)| *id).collect());
                async {}
            })
        });
        (queue, written)
    }

    fn tasks() -> Tasks {
        Tasks::new(Logger::root(slog::Discard, slog::o!()))
    }

    fn sizes(written: &Written) -> Vec<usize> {
        written.lock().unwrap().iter().map(Vec::len).collect()
    }

    /// Waits up to 5 s for `n` batches to be written.
    async fn batches(written: &Written, n: usize) {
        let deadline = Instant::now() + Duration::from_secs(5);
        while written.lock().unwrap().len() < n && Instant::now() < deadline {
            sleep(Duration::from_millis(5)).await;
        }
    }

    /// The inputs of one pause go in one write, however they trickle in (each here comes
    /// after the job took the one before); the next input after it starts the next.
    #[tokio::test]
    async fn inputs_that_come_within_the_pause_are_written_together() {
        let mut tasks = tasks();
        let pause = Duration::from_secs(2);
        let (queue, written) = job(&mut tasks, pause);
        let first = Instant::now();
        for id in 1..=3 {
            queue.send((id, Context::default())).await.unwrap();
            sleep(Duration::from_millis(30)).await;
        }
        let early = written.lock().unwrap().clone();
        if first.elapsed() < pause {
            assert!(early.is_empty(), "written before the pause ended: {early:?}");
        }
        batches(&written, 1).await;
        assert_eq!(*written.lock().unwrap(), [vec![1, 2, 3]]);
        queue.send((4, Context::default())).await.unwrap();
        batches(&written, 2).await;
        assert_eq!(*written.lock().unwrap(), [vec![1, 2, 3], vec![4]]);
        assert!(tasks.close(Duration::from_secs(5)).await.is_empty());
    }

    /// With no pause, each write takes what had queued: inputs apart go in writes apart.
    #[tokio::test]
    async fn with_no_pause_each_write_takes_what_is_queued() {
        let mut tasks = tasks();
        let (queue, written) = job(&mut tasks, Duration::ZERO);
        for id in 1..=3 {
            queue.send((id, Context::default())).await.unwrap();
            batches(&written, id as usize).await;
        }
        assert_eq!(*written.lock().unwrap(), [vec![1], vec![2], vec![3]]);
        assert!(tasks.close(Duration::from_secs(5)).await.is_empty());
    }

    /// A full batch is written at once, without waiting out the pause; the stop writes
    /// what is still queued.
    #[tokio::test]
    async fn a_full_batch_does_not_wait_for_the_pause() {
        let mut tasks = tasks();
        let (queue, written) = job(&mut tasks, Duration::from_secs(60));
        for id in 0..BATCH as i64 + 1 {
            queue.send((id, Context::default())).await.unwrap();
        }
        batches(&written, 1).await;
        assert_eq!(sizes(&written), [BATCH]);
        assert!(tasks.close(Duration::from_secs(5)).await.is_empty());
        assert_eq!(sizes(&written), [BATCH, 1]);
    }

    /// The stop does not wait out the pause: what was gathered is written at once.
    #[tokio::test]
    async fn the_stop_writes_what_was_gathered_without_waiting_out_the_pause() {
        let mut tasks = tasks();
        let (queue, written) = job(&mut tasks, Duration::from_secs(60));
        queue.send((1, Context::default())).await.unwrap();
        sleep(Duration::from_millis(20)).await;
        assert!(written.lock().unwrap().is_empty());
        let stopping = Instant::now();
        assert!(tasks.close(Duration::from_secs(5)).await.is_empty(), "the job ended within the bound");
        assert!(stopping.elapsed() < Duration::from_secs(5), "{:?}", stopping.elapsed());
        assert_eq!(*written.lock().unwrap(), [vec![1]]);
    }
}

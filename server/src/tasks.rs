//! The gateway's background work in one place: every periodic job of a running server
//! (the orphan sweep, retention, the provider watch, the cache invalidation, the policy
//! reload, the webhook dispatcher) is spawned by a [`Tasks`] runner under a name, with
//! a [`Shutdown`] signal.
//!
//! A job looks at its signal between iterations (retention, whose run is spread over
//! minutes, also between the batches of a run), so a stop lets the work in progress
//! finish (a sweep's update, a delivery batch, a retention batch) and the job then
//! returns. [`Tasks::close`] signals every job and waits for them within a bound;
//! a job still running after it is named in a warning and aborted. [`Tasks::stop`]
//! does the same for one job, for a server that stops its jobs in an order.
//!
//! The runner knows nothing of the gateway (no `crate::` import): the store, the
//! policy host and the webhook dispatcher all take its signal.

use slog::{Logger, debug, warn};
use std::future::Future;
use std::time::Duration;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::{Instant, Interval};

/// A job's signal to stop, given by its runner. A runner dropped without closing never
/// signals (its jobs run on, as detached tasks do).
#[derive(Clone, Debug)]
pub struct Shutdown(watch::Receiver<bool>);

impl Shutdown {
    /// Whether the job was told to stop.
    pub fn is_stopping(&self) -> bool {
        *self.0.borrow()
    }

    /// Resolves once the job is told to stop (at once if it already was). Cancel-safe:
    /// made to be one branch of a `select!` that waits for the next iteration.
    pub async fn stopped(&mut self) {
        if self.0.wait_for(|stop| *stop).await.is_err() {
            // The runner is gone without a close: nothing will ever signal.
            std::future::pending::<()>().await;
        }
    }

    /// Waits for `interval`'s next tick: `true` to run an iteration, `false` once the
    /// job is told to stop (the stop wins over a tick that is due).
    pub async fn tick(&mut self, interval: &mut Interval) -> bool {
        tokio::select! {
            biased;
            _ = self.stopped() => false,
            _ = interval.tick() => true,
        }
    }
}

/// One job of a runner.
struct Job {
    name: &'static str,
    /// `None`: a task spawned elsewhere that takes no signal (aborted at once).
    stop: Option<watch::Sender<bool>>,
    handle: JoinHandle<()>,
}

/// The background jobs of one server.
pub struct Tasks {
    jobs: Vec<Job>,
    log: Logger,
}

impl Tasks {
    pub fn new(log: Logger) -> Tasks {
        Tasks { jobs: Vec::new(), log }
    }

    /// Spawns `job` under `name` with its own shutdown signal. The job should return
    /// soon after the signal, having finished the iteration it was in.
    pub fn spawn<F, Fut>(&mut self, name: &'static str, job: F)
    where
        F: FnOnce(Shutdown) -> Fut,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let (stop, stopped) = watch::channel(false);
        let handle = tokio::spawn(job(Shutdown(stopped)));
        self.jobs.push(Job { name, stop: Some(stop), handle });
    }

    /// Takes in a task spawned elsewhere that takes no shutdown signal: it has no
    /// iteration to finish, and `close` aborts it at once.
    pub fn adopt(&mut self, name: &'static str, handle: JoinHandle<()>) {
        self.jobs.push(Job { name, stop: None, handle });
    }

    /// The names of the jobs, in the order they were registered.
    #[cfg(test)]
    fn names(&self) -> Vec<&'static str> {
        self.jobs.iter().map(|j| j.name).collect()
    }

    /// Stops the job `name` alone (signals it, waits up to `limit`, aborts it then).
    /// Whether it finished in time (`true` when there is no such job).
    pub async fn stop(&mut self, name: &str, limit: Duration) -> bool {
        let Some(at) = self.jobs.iter().position(|j| j.name == name) else {
            return true;
        };
        let job = self.jobs.remove(at);
        signal(&job);
        finish(&self.log, job, Instant::now() + limit, limit).await
    }

    /// Signals every job at once, waits for them until `limit` has passed, and aborts
    /// those still running, each named in a warning. Returns the names of those
    /// aborted after the bound (not those that take no signal).
    pub async fn close(self, limit: Duration) -> Vec<&'static str> {
        self.jobs.iter().for_each(signal);
        let deadline = Instant::now() + limit;
        let mut late = Vec::new();
        for job in self.jobs {
            let name = job.name;
            if !finish(&self.log, job, deadline, limit).await {
                late.push(name);
            }
        }
        late
    }
}

fn signal(job: &Job) {
    if let Some(stop) = &job.stop {
        let _ = stop.send(true);
    }
}

/// Waits for a signalled `job` until `deadline`, then aborts it. Whether it finished
/// by itself (a job that takes no signal is aborted at once and counts as finished).
async fn finish(log: &Logger, mut job: Job, deadline: Instant, limit: Duration) -> bool {
    if job.stop.is_none() {
        job.handle.abort();
        debug!(log, "background job stopped"; "job" => job.name);
        return true;
    }
    match tokio::time::timeout_at(deadline, &mut job.handle).await {
        Ok(Ok(())) => {
            debug!(log, "background job stopped"; "job" => job.name);
            true
        }
        Ok(Err(e)) => {
            warn!(log, "background job failed"; "job" => job.name, "error" => %e);
            true
        }
        Err(_) => {
            // Not awaited after the abort: a job stuck outside an await point would
            // hold the shutdown up again.
            job.handle.abort();
            warn!(log, "background job did not finish in time; aborted";
                  "job" => job.name, "limit_ms" => limit.as_millis() as u64);
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex};

    /// A logger that keeps each record's message and key-values as one line.
    #[derive(Clone, Default)]
    struct Lines(Arc<Mutex<Vec<String>>>);

    impl slog::Drain for Lines {
        type Ok = ();
        type Err = slog::Never;
        fn log(&self, record: &slog::Record<'_>, values: &slog::OwnedKVList) -> Result<(), slog::Never> {
            struct Text(String);
            impl slog::Serializer for Text {
                fn emit_arguments(&mut self, key: slog::Key, value: &std::fmt::Arguments<'_>) -> slog::Result {
                    self.0.push_str(&format!(" {key}={value}"));
                    Ok(())
                }
            }
            let mut text = Text(format!("{} {}", record.level().as_short_str(), record.msg()));
            let _ = slog::KV::serialize(&record.kv(), record, &mut text);
            let _ = slog::KV::serialize(values, record, &mut text);
            self.0.lock().unwrap().push(text.0);
            Ok(())
        }
    }

    impl Lines {
        fn logger(&self) -> Logger {
            Logger::root(self.clone(), slog::o!())
        }
        fn warnings(&self) -> Vec<String> {
            self.0.lock().unwrap().iter().filter(|l| l.starts_with("WARN")).cloned().collect()
        }
    }

    /// Sets its flag when dropped: tells that an aborted job's future is gone.
    struct DropFlag(Arc<AtomicBool>);

    impl Drop for DropFlag {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }

    #[tokio::test]
    async fn a_job_mid_iteration_finishes_it_before_close_returns() {
        let lines = Lines::default();
        let mut tasks = Tasks::new(lines.logger());
        let (started, finished) = (Arc::new(tokio::sync::Notify::new()), Arc::new(AtomicUsize::new(0)));
        let (s, f) = (started.clone(), finished.clone());
        tasks.spawn("sweep", move |mut stop| async move {
            let mut interval = tokio::time::interval(Duration::from_millis(10));
            while stop.tick(&mut interval).await {
                s.notify_one();
                // The iteration: longer than the test waits before it closes.
                tokio::time::sleep(Duration::from_millis(200)).await;
                f.fetch_add(1, Ordering::SeqCst);
            }
        });
        started.notified().await;
        assert_eq!(finished.load(Ordering::SeqCst), 0, "mid-iteration");
        let late = tasks.close(Duration::from_secs(10)).await;
        assert!(late.is_empty(), "{late:?}");
        assert_eq!(finished.load(Ordering::SeqCst), 1, "the iteration in progress finished, and no other began");
        assert!(lines.warnings().is_empty(), "{:?}", lines.warnings());
    }

    #[tokio::test]
    async fn a_job_stuck_past_the_bound_is_named_and_aborted() {
        let lines = Lines::default();
        let mut tasks = Tasks::new(lines.logger());
        let dropped = Arc::new(AtomicBool::new(false));
        let flag = DropFlag(dropped.clone());
        // Ignores its signal: never returns by itself.
        tasks.spawn("stuck", move |_stop| async move {
            let _flag = flag;
            std::future::pending::<()>().await;
        });
        tasks.spawn("quick", |mut stop| async move { stop.stopped().await });
        let started = Instant::now();
        let late = tasks.close(Duration::from_millis(100)).await;
        assert!(started.elapsed() < Duration::from_secs(5));
        assert_eq!(late, vec!["stuck"]);
        let warnings = lines.warnings();
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert!(warnings[0].contains("did not finish in time") && warnings[0].contains("job=stuck"), "{warnings:?}");
        let deadline = Instant::now() + Duration::from_secs(5);
        while !dropped.load(Ordering::SeqCst) {
            assert!(Instant::now() < deadline, "the stuck job was never aborted");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    #[tokio::test]
    async fn stop_ends_one_job_and_close_the_others_and_adopted_tasks_are_aborted_quietly() {
        let lines = Lines::default();
        let mut tasks = Tasks::new(lines.logger());
        let (first, second) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicBool::new(false)));
        let (a, b) = (first.clone(), second.clone());
        tasks.spawn("dispatcher", move |mut stop| async move {
            stop.stopped().await;
            a.store(true, Ordering::SeqCst);
        });
        tasks.spawn("retention", move |mut stop| async move {
            stop.stopped().await;
            b.store(true, Ordering::SeqCst);
        });
        let dropped = Arc::new(AtomicBool::new(false));
        let flag = DropFlag(dropped.clone());
        tasks.adopt(
            "lease",
            tokio::spawn(async move {
                let _flag = flag;
                std::future::pending::<()>().await;
            }),
        );
        assert_eq!(tasks.names(), ["dispatcher", "retention", "lease"]);
        assert!(tasks.stop("dispatcher", Duration::from_secs(5)).await);
        assert!(first.load(Ordering::SeqCst) && !second.load(Ordering::SeqCst));
        assert!(tasks.stop("no such job", Duration::from_secs(5)).await);
        assert_eq!(tasks.names(), ["retention", "lease"]);
        assert!(tasks.close(Duration::from_secs(5)).await.is_empty());
        assert!(second.load(Ordering::SeqCst));
        let deadline = Instant::now() + Duration::from_secs(5);
        while !dropped.load(Ordering::SeqCst) {
            assert!(Instant::now() < deadline, "the adopted task was never aborted");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert!(lines.warnings().is_empty(), "{:?}", lines.warnings());
    }
}

//! Bounded password work: every argon2id hash and check runs on one of a fixed number
//! of threads (about one per core), fed by a short queue. A request that finds the
//! queue full is refused at once (the sign-in page answers 429 with `Retry-After`)
//! before any hashing, so a flood of sign-ins costs at most `slots` × 19 MiB of hash
//! memory and `slots` cores, whatever its size.
//!
//! Dedicated threads rather than tokio's blocking pool: the pool grows to hundreds of
//! threads under a flood, and each thread's allocator arena keeps the 19 MiB blocks it
//! once held (3.5 GiB resident after 200 concurrent sign-ins). A fixed set of threads
//! bounds the arenas too. Unknown emails are checked against a dummy hash on the same
//! threads, so inside the slots they cost what a known email costs.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, mpsc};
use std::time::Duration;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, oneshot};

/// A job for a hashing thread.
type Job = Box<dyn FnOnce() + Send + 'static>;

/// The pool was full: nothing was hashed. Try again after `retry_after`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("password work is at capacity; try again in {} s", retry_after.as_secs())]
pub struct Busy {
    pub retry_after: Duration,
}

/// How long a refused caller is told to wait.
pub const RETRY_AFTER: Duration = Duration::from_secs(1);

const BUSY: Busy = Busy { retry_after: RETRY_AFTER };

/// The hashing threads and their queue.
pub struct PasswordWork {
    queue: Mutex<mpsc::SyncSender<Job>>,
    /// One permit per thread and per queue place: holding one guarantees a place.
    places: Arc<Semaphore>,
    slots: usize,
    queue_len: usize,
    refused: AtomicU64,
}

/// A reserved place in the pool: the work it runs is never refused.
pub struct Ticket<'a> {
    pool: &'a PasswordWork,
    permit: OwnedSemaphorePermit,
}

impl PasswordWork {
    /// Starts `slots` threads (at least one) behind a queue of `queue_len` jobs.
    pub fn start(slots: usize, queue_len: usize) -> PasswordWork {
        let slots = slots.max(1);
        let (tx, rx) = mpsc::sync_channel::<Job>(slots + queue_len);
        let rx = Arc::new(Mutex::new(rx));
        for n in 0..slots {
            let rx = rx.clone();
            std::thread::Builder::new()
                .name(format!("password-{n}"))
                .spawn(move || {
                    loop {
                        let job = match rx.lock() {
                            Ok(rx) => rx.recv(),
                            Err(_) => return,
                        };
                        match job {
                            Ok(job) => job(),
                            Err(_) => return,
                        }
                    }
                })
                .expect("a password thread starts");
        }
        PasswordWork {
            queue: Mutex::new(tx),
            places: Arc::new(Semaphore::new(slots + queue_len)),
            slots,
            queue_len,
            refused: AtomicU64::new(0),
        }
    }

    /// Threads hashing at once.
    pub fn slots(&self) -> usize {
        self.slots
    }

    /// Jobs that may wait for a thread.
    pub fn queue_len(&self) -> usize {
        self.queue_len
    }

    /// Requests refused because the pool was full, since start.
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    /// Takes a place for one piece of work, or `Busy` at once when every thread is
    /// busy and the queue is full. Take it before other work the request would waste
    /// (a throttle write), and run with it.
    pub fn reserve(&self) -> Result<Ticket<'_>, Busy> {
        match self.places.clone().try_acquire_owned() {
            Ok(permit) => Ok(Ticket { pool: self, permit }),
            Err(_) => {
                self.refused.fetch_add(1, Ordering::Relaxed);
                crate::metrics::get().password_work.with_label_values(&["busy"]).inc();
                Err(BUSY)
            }
        }
    }

    /// Runs `work` on a hashing thread, or refuses at once (see [`reserve`](Self::reserve)).
    pub async fn run<T: Send + 'static>(&self, work: impl FnOnce() -> T + Send + 'static) -> Result<T, Busy> {
        self.reserve()?.run(work).await
    }
}

impl Ticket<'_> {
    /// Runs `work` on a hashing thread in the reserved place.
    pub async fn run<T: Send + 'static>(self, work: impl FnOnce() -> T + Send + 'static) -> Result<T, Busy> {
        let (tx, rx) = oneshot::channel();
        let permit = self.permit;
        let job: Job = Box::new(move || {
            let _ = tx.send(work());
            drop(permit);
        });
        // The channel holds as many jobs as there are places, so this never blocks.
        let sent = self.pool.queue.lock().map_err(|_| BUSY)?.try_send(job);
        if sent.is_err() {
            return Err(BUSY);
        }
        crate::metrics::get().password_work.with_label_values(&["done"]).inc();
        // A thread that panicked dropped the sender: treat it as busy, not a crash.
        rx.await.map_err(|_| BUSY)
    }
}

static POOL: OnceLock<PasswordWork> = OnceLock::new();

/// The process's pool: `slots` threads (0: one per core) and a queue of `queue_len`
/// (0: twice the slots). The first call decides; later calls return the same pool.
pub fn init(slots: usize, queue_len: usize) -> &'static PasswordWork {
    POOL.get_or_init(|| {
        let slots = if slots == 0 { std::thread::available_parallelism().map_or(1, |n| n.get()) } else { slots };
        let queue_len = if queue_len == 0 { 2 * slots } else { queue_len };
        PasswordWork::start(slots, queue_len)
    })
}

/// The process's pool (started with the defaults if `init` was not called).
pub fn pool() -> &'static PasswordWork {
    init(0, 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    #[tokio::test]
    async fn at_most_slots_run_and_a_full_queue_refuses_at_once() {
        let pool = Arc::new(PasswordWork::start(2, 3));
        let running = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        let started = Arc::new(AtomicUsize::new(0));
        let gate = Arc::new(std::sync::Barrier::new(3)); // two workers + this test
        let mut tasks = Vec::new();
        for _ in 0..5 {
            let (pool, running, most, gate) = (pool.clone(), running.clone(), most.clone(), gate.clone());
            let started = started.clone();
            tasks.push(tokio::spawn(async move {
                pool.run(move || {
                    let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::SeqCst);
                    if started.fetch_add(1, Ordering::SeqCst) < 2 {
                        gate.wait();
                    }
                    std::thread::sleep(Duration::from_millis(20));
                    running.fetch_sub(1, Ordering::SeqCst);
                })
                .await
            }));
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // Two running (held at the gate) and three queued: the sixth is refused at once.
        let refused = pool.run(|| ()).await;
        assert_eq!(refused, Err(BUSY));
        assert!(pool.reserve().is_err(), "no place to reserve either");
        assert_eq!(pool.refused(), 2);
        tokio::task::spawn_blocking(move || gate.wait()).await.unwrap();
        for task in tasks {
            assert!(task.await.unwrap().is_ok());
        }
        assert_eq!(most.load(Ordering::SeqCst), 2, "never more than the slots at once");
        assert!(pool.run(|| 7).await == Ok(7), "free again once the queue drained");
    }
}

//! Settling an attempt, whatever happens to the request that began it.
//!
//! From the moment an attempt row is written (`Store::begin_attempt`) its process owns
//! it (the row names the process's lease), and only that process settles it while it
//! lives: the orphan sweep never takes a live owner's row. So the owner must settle it
//! whatever happens to the request: an `Armed` guard holds the `Finish` to write, from
//! the begin until the settle is written. It is dropped with the request's future in
//! every case (a settle that failed, a request cancelled at the provider by the
//! handler's backstop): if it still holds a `Finish` then, that `Finish` is written in
//! the background, retried until the store takes it (a settle is idempotent: it applies
//! to a pending row only).
//!
//! The answer never waits on that retry: once the provider took a message, the client
//! is told it was sent (a 503 with `Retry-After` would invite an unkeyed duplicate).
//! `Settling` counts the settles still retrying, so that a clean stop can wait for them
//! before it gives its lease up.

use super::{SendError, Sent};
use crate::provider::ProviderError;
use crate::store::{Answer, Finish, KeyFate, Store};
use slog::{Logger, info, warn};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

/// The settles still retrying in the background.
#[derive(Default)]
pub struct Settling {
    running: AtomicUsize,
    idle: tokio::sync::Notify,
}

impl Settling {
    /// How many settles are still retrying.
    pub fn running(&self) -> usize {
        self.running.load(Ordering::Acquire)
    }

    /// Waits until no settle is retrying, at most `limit`; true when none is left.
    pub async fn drained(&self, limit: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let idle = self.idle.notified();
            if self.running() == 0 {
                return true;
            }
            if tokio::time::timeout_at(deadline, idle).await.is_err() {
                return self.running() == 0;
            }
        }
    }
}

/// Whether a request's attempt row is written: from then on, its answer must never
/// invite a retry that could send the message again. Shared with the handler, whose
/// backstop answers by it.
#[derive(Clone, Debug, Default)]
pub struct Progress(Arc<AtomicBool>);

impl Progress {
    pub fn begun(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }

    pub(super) fn mark_begun(&self) {
        self.0.store(true, Ordering::Release);
    }
}

/// How a request's answer is rendered for its idempotency key (`super::Idempotency`).
type Render = fn(&Result<Sent, SendError>) -> Answer;

/// The `Finish` an attempt's owner still has to write (see the module's header).
pub(super) struct Armed {
    finish: Option<Finish>,
    /// While `finish` is the unknown outcome it was armed with: how its key's answer is
    /// rendered (only if it is ever needed: most attempts settle).
    render_unknown: Option<Render>,
    store: Store,
    settling: Arc<Settling>,
    log: Logger,
}

impl Armed {
    /// Armed with `unknown`, the outcome written if the request goes away before it
    /// settles; `render` renders its key's answer, for a request with a key.
    pub(super) fn new(
        unknown: Finish,
        render: Option<Render>,
        store: Store,
        settling: Arc<Settling>,
        log: Logger,
    ) -> Armed {
        Armed { finish: Some(unknown), render_unknown: render, store, settling, log }
    }

    /// Writes `finish`, waiting for it at most `wait`; if it is not written by then
    /// (the store failed or is slow), it is left to the background. Never fails.
    pub(super) async fn settle(mut self, finish: Finish, wait: Duration) {
        self.render_unknown = None;
        let log_id = finish.log_id;
        self.finish = Some(finish.clone());
        match tokio::time::timeout(wait, self.store.settle_attempt(finish)).await {
            Ok(Ok(applied)) => {
                self.finish = None;
                if !applied {
                    warn!(self.log, "the attempt was settled already (swept as an orphan)"; "log_id" => log_id);
                }
            }
            Ok(Err(e)) => warn!(self.log, "settling the attempt failed; retrying in the background";
                                "log_id" => log_id, "error" => %e),
            Err(_) => warn!(self.log, "settling the attempt is slow; finishing it in the background";
                            "log_id" => log_id, "waited_ms" => wait.as_millis() as u64),
        }
    }
}

impl Drop for Armed {
    fn drop(&mut self) {
        let Some(mut finish) = self.finish.take() else { return };
        if let Some(render) = self.render_unknown.take() {
            let unknown = ProviderError::OutcomeUnknown(super::CANCELLED_REASON.into());
            finish.answer = Some(KeyFate::Keep(render(&Err(SendError::Provider(unknown)))));
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            warn!(self.log, "an attempt was left pending: no runtime to settle it"; "log_id" => finish.log_id);
            return;
        };
        let (store, settling, log) = (self.store.clone(), self.settling.clone(), self.log.clone());
        settling.running.fetch_add(1, Ordering::AcqRel);
        runtime.spawn(async move {
            retry(&store, finish, &log).await;
            if settling.running.fetch_sub(1, Ordering::AcqRel) == 1 {
                settling.idle.notify_waiters();
            }
        });
    }
}

/// Writes `finish` until the store takes it, backing off from 50 ms to 5 s.
async fn retry(store: &Store, finish: Finish, log: &Logger) {
    let mut pause = Duration::from_millis(50);
    let mut tries = 0u32;
    loop {
        tries += 1;
        match store.settle_attempt(finish.clone()).await {
            Ok(_) => {
                info!(log, "attempt settled in the background"; "log_id" => finish.log_id, "status" => &finish.status,
                      "tries" => tries);
                return;
            }
            Err(e) => {
                if tries == 1 || tries.is_power_of_two() {
                    warn!(log, "settling an attempt failed; retrying"; "log_id" => finish.log_id, "tries" => tries,
                          "error" => %e);
                }
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(5));
            }
        }
    }
}

//! Keeping what the policy modules saw of each send, for `gateway policy backtest`
//! (`[policies] input_retention_days`; `store::policy_inputs`).
//!
//! The send pipeline hands over the context its modules were first asked with once the
//! send's row is written; a background job (`policy inputs`) writes them in batches.
//! The send never waits: when the queue is full, or the store refuses a batch, those
//! inputs are not kept and `gateway_policy_inputs_dropped_total` counts them. A crash
//! loses at most the batch in flight (a fraction of a second). The context holds the
//! message's text: it is never logged.

use crate::store::Store;
use crate::tasks::Tasks;
use gateway_policy_model::Context;
use slog::{Logger, warn};
use tokio::sync::mpsc;

/// Inputs waiting to be written.
const QUEUE: usize = 8_192;
/// Inputs written in one store write at most.
const BATCH: usize = 512;

/// Where the send pipeline hands its inputs.
#[derive(Clone)]
pub struct Inputs {
    queue: mpsc::Sender<(i64, Context)>,
}

impl Inputs {
    /// Starts the writer as the job `policy inputs` of `tasks`; at shutdown it writes
    /// what is queued and stops.
    pub fn start(store: Store, tasks: &mut Tasks, log: Logger) -> Inputs {
        let (queue, mut inbox) = mpsc::channel::<(i64, Context)>(QUEUE);
        tasks.spawn("policy inputs", move |mut stop| async move {
            let mut batch = Vec::with_capacity(BATCH);
            loop {
                let received = tokio::select! {
                    n = inbox.recv_many(&mut batch, BATCH) => n,
                    _ = stop.stopped() => {
                        inbox.close();
                        while inbox.recv_many(&mut batch, BATCH).await > 0 {
                            write(&store, std::mem::take(&mut batch), &log).await;
                        }
                        return;
                    }
                };
                if received == 0 {
                    return;
                }
                write(&store, std::mem::take(&mut batch), &log).await;
            }
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

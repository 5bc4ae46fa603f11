//! The dispatcher of one process: it claims due events from the outbox ahead of its
//! delivery slots, delivers each to its instance's endpoint (`post_checked`), and
//! records every attempt with the event's next state. The policy it follows (schedule,
//! timeout, slots, the SSRF guard) is described in the module above.

use super::{CheckedUrl, attempt_row, event_id, http_client, post_checked, schedule};
use crate::config::WebhookSettings;
use crate::net::guarded;
use crate::store::{ClaimedEvent, EndpointChange, EventState, Store, WebhookEndpoint, now_ms};
use crate::tasks::{Shutdown, Tasks};
use slog::{Logger, debug, error, info, warn};
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

/// An instance's endpoint as one claim delivers to it: read once, its URL checked once.
struct Destination {
    endpoint: WebhookEndpoint,
    url: CheckedUrl,
}

/// The dispatcher of one process.
pub struct Dispatcher {
    store: Store,
    client: reqwest::Client,
    settings: WebhookSettings,
    allow_loopback: bool,
    log: Logger,
}

/// The dispatcher's name in the server's task runner (`crate::tasks`), which stops it
/// before the other jobs.
pub const JOB: &str = "webhook dispatcher";

impl Dispatcher {
    pub fn new(store: Store, settings: WebhookSettings, allow_loopback: bool, log: Logger) -> Arc<Dispatcher> {
        let client = http_client(&settings, allow_loopback);
        Arc::new(Dispatcher { store, client, settings, allow_loopback, log })
    }

    /// Starts the claim loop as the job [`JOB`] of `tasks`. Told to stop, it stops
    /// claiming, gives back at once the events it claimed and did not start, lets
    /// deliveries in flight finish within the grace period (`shutdown_grace_ms`, which
    /// bounds all of this), and gives back the claims of those that did not.
    pub fn spawn(self: Arc<Self>, tasks: &mut Tasks) {
        tasks.spawn(JOB, move |stop| self.run(stop));
    }

    async fn run(self: Arc<Self>, mut stopped: Shutdown) {
        let concurrency = self.settings.concurrency.max(1);
        let batch = concurrency.div_ceil(4);
        let permits = Arc::new(Semaphore::new(concurrency));
        // The pipeline (BENCHMARKS.md, issue 22): the next claim runs while the claimed
        // events are delivered, up to one claim's worth ahead (`queue`); a delivery gives
        // its slot back when its HTTP request is done and its record is written after;
        // at most `unrecorded` deliveries are in flight or waiting for their record.
        let unrecorded = concurrency.saturating_mul(RECORDS_PER_SLOT);
        let freed = Arc::new(tokio::sync::Notify::new());
        let mut queue: VecDeque<(Instant, ClaimedEvent, Arc<Destination>)> = VecDeque::new();
        let mut claiming: Option<tokio::task::JoinHandle<Claimed>> = None;
        let mut idle_until: Option<tokio::time::Instant> = None;
        let mut in_flight: JoinSet<i64> = JoinSet::new();
        let mut running: std::collections::HashSet<i64> = std::collections::HashSet::new();
        let lease_ms = self.settings.timeout_ms as i64 + 30_000;
        let poll = Duration::from_millis(self.settings.poll_interval_ms.max(10));
        info!(self.log, "webhook dispatcher started"; "concurrency" => concurrency);
        loop {
            if stopped.is_stopping() {
                break;
            }
            while let Some(done) = in_flight.try_join_next() {
                if let Ok(id) = done {
                    running.remove(&id);
                }
            }
            let mut late = Vec::new();
            while !queue.is_empty() && in_flight.len() < unrecorded {
                let Ok(permit) = permits.clone().try_acquire_owned() else { break };
                let (claimed_at, event, destination) = queue.pop_front().expect("the queue is not empty");
                if claimed_at.elapsed() > START_WITHIN {
                    // Too late to finish within its lease (the slots were held by slow
                    // endpoints): given back, due again at once, never started.
                    late.push(event.id);
                    continue;
                }
                running.insert(event.id);
                let this = self.clone();
                let slot = Slot { permit: Some(permit), freed: freed.clone() };
                in_flight.spawn(async move {
                    let id = event.id;
                    this.deliver(event, &destination, slot).await;
                    id
                });
            }
            if !late.is_empty() {
                let this = self.clone();
                tokio::spawn(async move {
                    if let Err(e) = this.store.release_events(&late).await {
                        // The claims end with their lease; the events are due again then.
                        warn!(this.log, "giving back webhook events claimed too long ago failed";
                              "events" => late.len(), "error" => %e);
                    }
                });
            }
            // Claim in batches (one claim statement for many events, not one each):
            // when a quarter of the slots' worth of room is left in the queue.
            let room = concurrency.saturating_sub(queue.len());
            if claiming.is_none() && room >= batch && idle_until.is_none_or(|t| t <= tokio::time::Instant::now()) {
                idle_until = None;
                let this = self.clone();
                claiming = Some(tokio::spawn(async move { this.claim(room, lease_ms).await }));
            }
            let idle = async {
                match idle_until {
                    Some(t) => tokio::time::sleep_until(t).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                claimed = async { claiming.as_mut().expect("guarded").await }, if claiming.is_some() => {
                    claiming = None;
                    let Claimed { at, rows, deliver: claimed } = claimed.unwrap_or_else(|_| Claimed::none());
                    if rows == 0 {
                        idle_until = Some(tokio::time::Instant::now() + poll);
                    }
                    queue.extend(claimed.into_iter().map(|(event, destination)| (at, event, destination)));
                }
                done = in_flight.join_next(), if !in_flight.is_empty() => {
                    if let Some(Ok(id)) = done {
                        running.remove(&id);
                    }
                }
                _ = freed.notified(), if !queue.is_empty() && in_flight.len() < unrecorded => {}
                _ = idle, if claiming.is_none() => {}
                _ = stopped.stopped() => {}
            }
        }
        // Graceful shutdown, within the grace period: what was claimed and not started is
        // given back at once, while what is in flight finishes.
        let deadline = tokio::time::Instant::now() + Duration::from_millis(self.settings.shutdown_grace_ms);
        let mut unstarted: Vec<i64> = queue.drain(..).map(|(_, event, _)| event.id).collect();
        if let Some(mut claim) = claiming.take() {
            match tokio::time::timeout_at(deadline, &mut claim).await {
                Ok(Ok(claimed)) => unstarted.extend(claimed.deliver.into_iter().map(|(event, _)| event.id)),
                Ok(Err(_)) => {}
                // Its events, if it claims any, end with their lease.
                Err(_) => claim.abort(),
            }
        }
        let mut given_back = unstarted.is_empty();
        let finished = tokio::time::timeout_at(deadline, async {
            let give_back = async {
                if !given_back {
                    given_back = self.store.release_events(&unstarted).await.is_ok();
                }
            };
            let drain = async {
                while let Some(done) = in_flight.join_next().await {
                    if let Ok(id) = done {
                        running.remove(&id);
                    }
                }
            };
            tokio::join!(give_back, drain);
        })
        .await;
        if !unstarted.is_empty() {
            info!(self.log, "webhook events claimed and not started were given back";
                  "events" => unstarted.len(), "released" => given_back);
        }
        if finished.is_err() {
            in_flight.abort_all();
            while in_flight.join_next().await.is_some() {}
        }
        // What did not finish, and what was not given back yet: given back now; if this
        // fails too, the claims end with their lease.
        let stopped_count = running.len();
        let mut ids: Vec<i64> = running.into_iter().collect();
        if !given_back {
            ids.extend(unstarted);
        }
        if !ids.is_empty() {
            let released = self.store.release_events(&ids).await;
            if stopped_count > 0 {
                warn!(self.log, "webhook deliveries still running at shutdown were stopped and given back";
                      "events" => stopped_count, "released" => released.is_ok());
            }
        }
        info!(self.log, "webhook dispatcher stopped");
    }

    /// Claims up to `limit` due events, reads each instance's endpoint and checks its
    /// URL once for all its events, and records those that need no delivery in one
    /// write; returns the events to deliver, each with its destination.
    async fn claim(&self, limit: usize, lease_ms: i64) -> Claimed {
        let at = Instant::now();
        let now = now_ms();
        let claimed = match self.store.claim_events(now, now.saturating_add(lease_ms), limit as i64).await {
            Ok(claimed) => claimed,
            Err(e) => {
                error!(self.log, "claiming webhook events failed"; "error" => %e);
                return Claimed::none();
            }
        };
        let rows = claimed.len();
        let mut endpoints: HashMap<String, Result<Option<Arc<Destination>>, ()>> = HashMap::new();
        for instance in claimed.iter().filter_map(|e| e.instance_id.as_deref()) {
            if !endpoints.contains_key(instance) {
                let destination = self.store.webhook(instance).await.map_err(|e| {
                    error!(self.log, "reading a webhook endpoint failed"; "instance_id" => instance, "error" => %e);
                });
                let destination = destination.map(|endpoint| {
                    endpoint.map(|endpoint| {
                        let url = guarded::check_url(&endpoint.url, self.allow_loopback);
                        Arc::new(Destination { endpoint, url })
                    })
                });
                endpoints.insert(instance.to_string(), destination);
            }
        }
        // Events that need no delivery are done in one write for the whole claim, not
        // one each (BENCHMARKS.md, issue 22).
        let mut skipped = Vec::new();
        let mut deliver = Vec::with_capacity(claimed.len());
        for event in claimed {
            let endpoint = match event.instance_id.as_deref().map(|i| endpoints[i].clone()) {
                Some(Ok(endpoint)) => endpoint,
                None => None,
                // The claim ends with its lease; the event is tried again then.
                Some(Err(())) => continue,
            };
            match target(endpoint, &event.event_type) {
                Ok(destination) => deliver.push((event, destination)),
                Err(outcome) => skipped.push((event.id, outcome)),
            }
        }
        if let Err(e) = self.store.skip_events(&skipped).await {
            // The claims end with their lease; the events are looked at again then.
            error!(self.log, "recording skipped webhook events failed"; "events" => skipped.len(), "error" => %e);
        }
        Claimed { at, rows, deliver }
    }

    /// Delivers one claimed event (scheduled attempt) to its instance's endpoint, gives
    /// its slot back, and records the result.
    async fn deliver(&self, event: ClaimedEvent, destination: &Destination, slot: Slot) {
        if let Err(e) = self.deliver_inner(&event, destination, slot).await {
            // The claim ends with its lease; the event is tried again then.
            error!(self.log, "recording a webhook attempt failed"; "event_id" => event.id, "error" => %e);
        }
    }

    async fn deliver_inner(
        &self,
        event: &ClaimedEvent,
        Destination { endpoint, url }: &Destination,
        slot: Slot,
    ) -> Result<(), crate::store::StoreError> {
        let attempt_number = event.attempts + 1;
        let result =
            post_checked(&self.client, endpoint, url, &event.event_type, &event_id(event.id), event.payload.as_bytes())
                .await;
        // The request is done: the slot serves the next delivery while this one's
        // record waits for its commit (the event stays claimed until then).
        drop(slot);
        let now = now_ms();
        let succeeded = result.succeeded();
        let outcome = match result.status {
            _ if succeeded => "delivered",
            Some(410) => "gone",
            Some(_) => "rejected",
            None => "error",
        };
        crate::metrics::get().webhook_attempts.with_label_values(&[outcome]).inc();
        let disable_after_ms = crate::bounds::hours_ms(self.settings.disable_after_hours.max(0));
        let (state, change) = if succeeded {
            (EventState::Done("delivered"), EndpointChange::Succeeded)
        } else if result.status == Some(410) {
            (EventState::Done("gone"), EndpointChange::Disable("the endpoint answered 410 Gone".into()))
        } else {
            let next = schedule::next_delay(
                &self.settings.schedule_ms,
                attempt_number as usize,
                self.settings.jitter,
                rand::random::<f64>() * 2.0 - 1.0,
                result.retry_after.filter(|_| matches!(result.status, Some(429 | 503))),
            );
            let state = match next {
                Some(delay) => {
                    EventState::Retry { at: now.saturating_add(i64::try_from(delay.as_millis()).unwrap_or(i64::MAX)) }
                }
                None => EventState::Done("failed"),
            };
            let failing_for = endpoint.failing_since.map(|since| now - since);
            let change = match failing_for {
                Some(ms) if ms >= disable_after_ms => EndpointChange::Disable(format!(
                    "every delivery failed for {} hours",
                    self.settings.disable_after_hours
                )),
                _ => EndpointChange::Failed,
            };
            (state, change)
        };
        if let EndpointChange::Disable(reason) = &change {
            warn!(self.log, "webhook endpoint disabled"; "instance_id" => &endpoint.instance_id,
                  "customer_id" => &endpoint.customer_id, "reason" => reason);
        }
        debug!(self.log, "webhook attempt"; "event_id" => event.id, "status" => result.status,
               "succeeded" => succeeded, "latency_ms" => result.latency_ms);
        let attempt = attempt_row(event, endpoint, "scheduled", attempt_number, &result);
        self.store.finish_attempt(Some(event.id), Some(&attempt), state, change).await
    }
}

/// How many deliveries not yet recorded a slot may stand for, its request in flight
/// included: the bound of [`Dispatcher::run`]'s deliveries in flight or waiting for
/// their record.
const RECORDS_PER_SLOT: usize = 4;

/// What a claim gave.
struct Claimed {
    /// When it started: its events' leases run from then.
    at: Instant,
    /// How many rows it claimed (those done undelivered included); none: nothing is due.
    rows: usize,
    /// The events to deliver, each with its destination.
    deliver: Vec<(ClaimedEvent, Arc<Destination>)>,
}

impl Claimed {
    /// A claim that found nothing (or failed).
    fn none() -> Claimed {
        Claimed { at: Instant::now(), rows: 0, deliver: Vec::new() }
    }
}

/// How long after its claim a queued event may still start: its lease is the timeout
/// and 30 s, so one started this late still finishes, with a margin, inside it. One
/// that waited longer (every slot held by slow endpoints) is given back unstarted.
const START_WITHIN: Duration = Duration::from_secs(25);

/// A delivery slot held while its HTTP request runs; giving it back wakes the claim
/// loop.
struct Slot {
    permit: Option<tokio::sync::OwnedSemaphorePermit>,
    freed: Arc<tokio::sync::Notify>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        // The permit is released before the loop is woken, so it sees the slot free.
        drop(self.permit.take());
        self.freed.notify_one();
    }
}

/// The endpoint an event goes to, or the outcome it is done with undelivered: no
/// endpoint, a disabled one, or one that did not select the event's type.
fn target(destination: Option<Arc<Destination>>, event_type: &str) -> Result<Arc<Destination>, &'static str> {
    match destination {
        None => Err("skipped_no_endpoint"),
        Some(d) if d.endpoint.disabled_at.is_some() => Err("skipped_disabled"),
        Some(d) if !d.endpoint.wants(event_type) => Err("skipped_not_subscribed"),
        Some(d) => Ok(d),
    }
}

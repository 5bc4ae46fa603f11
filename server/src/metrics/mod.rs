//! Prometheus metrics, in the text format, on a listener of their own
//! (`GATEWAY_METRICS_LISTEN`; off when unset, never on the public listener).
//!
//! Counters and histograms live in one process-wide registry that the parts update as
//! they work: the send pipeline (sends by decision and error, policy evaluation and
//! provider request times), the webhook dispatcher, the PBX webhook, the provider
//! ingress and the TLS certificate's reloads. HTTP requests are counted from
//! Dropshot's own "request completed" log record ([`HttpDrain`]): Dropshot has no
//! middleware, and that record is the one place that sees every answer, a router 404
//! or an extractor's 400 included. The outbox backlog and the instances by state are
//! read from the store at each scrape.

use crate::store::{Store, StoreError, now_ms};
use dropshot::{Body, HttpError, RequestContext, endpoint};
use prometheus::{
    Encoder, Gauge, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
    TextEncoder,
};
use std::sync::{Arc, LazyLock};

mod batch_seconds;
mod http_requests;
pub use http_requests::{HttpDrain, Routes, UNMATCHED};

/// Every metric of the process.
pub struct Metrics {
    registry: Registry,
    pub http_requests: IntCounterVec,
    pub http_duration: HistogramVec,
    pub sends: IntCounterVec,
    pub policy_evaluation: HistogramVec,
    pub policy_shadow_changes: IntCounterVec,
    pub policy_inputs_dropped: IntCounter,
    pub provider_request: HistogramVec,
    pub webhook_attempts: IntCounterVec,
    pub pbx_events: IntCounterVec,
    pub ingress_events: IntCounterVec,
    pub password_work: IntCounterVec,
    pub signin_refused: IntCounterVec,
    pub tls_reloads: IntCounter,
    pub tls_reload_failures: IntCounter,
    pub log_records_dropped: IntCounter,
    send_stages: HistogramVec,
    outbox_pending: IntGauge,
    outbox_oldest_age: Gauge,
    instances: IntGaugeVec,
    webhook_endpoints: IntGaugeVec,
    write_batches: IntCounter,
    writes: IntCounter,
    write_seconds: prometheus::Counter,
    write_sync: std::sync::Mutex<()>,
    send_read_batches: IntCounter,
    send_reads: IntCounter,
}

fn counter(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    let c = IntCounterVec::new(Opts::new(name, help), labels).expect("a valid counter");
    registry.register(Box::new(c.clone())).expect("registered once");
    c
}

fn plain_counter(registry: &Registry, name: &str, help: &str) -> IntCounter {
    let c = IntCounter::new(name, help).expect("a valid counter");
    registry.register(Box::new(c.clone())).expect("registered once");
    c
}

fn histogram(registry: &Registry, name: &str, help: &str, labels: &[&str], buckets: &[f64]) -> HistogramVec {
    let h =
        HistogramVec::new(HistogramOpts::new(name, help).buckets(buckets.to_vec()), labels).expect("a valid histogram");
    registry.register(Box::new(h.clone())).expect("registered once");
    h
}

/// Every label `gateway_policy_shadow_changes_total` can carry for a module: how a
/// shadow's verdict compares with what decided, or `error` when the shadow failed.
pub const SHADOW_CHANGES: [&str; 8] =
    ["same", "allow->deny", "allow->review", "deny->allow", "deny->review", "review->allow", "review->deny", "error"];

/// Request and provider times: 1 ms to 30 s.
const SECONDS: &[f64] = &[0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0];
/// A send's stages: 10 µs to 1 s.
const STAGE_SECONDS: &[f64] =
    &[0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.1, 1.0];
/// Policy evaluations: 10 µs to 100 ms.
const POLICY_SECONDS: &[f64] = &[0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.01, 0.1];

impl Metrics {
    fn new() -> Metrics {
        let registry = Registry::new();
        let build = IntGaugeVec::new(
            Opts::new("gateway_build_info", "The running gateway's version (always 1)."),
            &["version"],
        )
        .expect("a valid gauge");
        build.with_label_values(&[env!("CARGO_PKG_VERSION")]).set(1);
        registry.register(Box::new(build)).expect("registered once");
        let outbox_pending =
            IntGauge::new("gateway_outbox_pending", "Events not yet delivered to a webhook.").expect("a valid gauge");
        registry.register(Box::new(outbox_pending.clone())).expect("registered once");
        let outbox_oldest_age = Gauge::new(
            "gateway_outbox_oldest_age_seconds",
            "Age of the oldest event not yet delivered (0 when none is waiting).",
        )
        .expect("a valid gauge");
        registry.register(Box::new(outbox_oldest_age.clone())).expect("registered once");
        let instances = IntGaugeVec::new(
            Opts::new("gateway_instances", "Instances by connection state and whether they are paused."),
            &["connection_state", "paused"],
        )
        .expect("a valid gauge");
        registry.register(Box::new(instances.clone())).expect("registered once");
        let webhook_endpoints = IntGaugeVec::new(
            Opts::new(
                "gateway_webhook_endpoints",
                "Webhook endpoints by state: ok, failing (since their last success), disabled.",
            ),
            &["state"],
        )
        .expect("a valid gauge");
        registry.register(Box::new(webhook_endpoints.clone())).expect("registered once");
        let write_seconds = prometheus::Counter::new(
            "gateway_store_write_seconds_total",
            "Time the store's writer spent running batches (a batch is one transaction and one commit), summed over its lanes (PostgreSQL runs three at once).",
        )
        .expect("a valid counter");
        registry.register(Box::new(write_seconds.clone())).expect("registered once");
        registry.register(Box::new(batch_seconds::WriteBatches::new())).expect("registered once");
        Metrics {
            write_batches: plain_counter(
                &registry,
                "gateway_store_write_batches_total",
                "Transactions the store's writer committed (group commit: every write queued at the time).",
            ),
            writes: plain_counter(
                &registry,
                "gateway_store_writes_total",
                "Writes the store's writer ran, in all its batches.",
            ),
            write_seconds,
            write_sync: std::sync::Mutex::new(()),
            send_read_batches: plain_counter(
                &registry,
                "gateway_store_send_read_batches_total",
                "Statements that ran the send path's reads on PostgreSQL (the reads of concurrent sends go in one).",
            ),
            send_reads: plain_counter(
                &registry,
                "gateway_store_send_reads_total",
                "The send path's reads that those statements answered (PostgreSQL; 0 on SQLite).",
            ),
            http_requests: counter(
                &registry,
                "gateway_http_requests_total",
                "HTTP requests answered, by route and status.",
                &["route", "status"],
            ),
            http_duration: histogram(
                &registry,
                "gateway_http_request_duration_seconds",
                "Time to answer an HTTP request, by route.",
                &["route"],
                SECONDS,
            ),
            sends: counter(
                &registry,
                "gateway_sends_total",
                "Send attempts by decision (allowed, refused) and error code (empty when sent).",
                &["decision", "error"],
            ),
            policy_evaluation: histogram(
                &registry,
                "gateway_policy_evaluation_seconds",
                "Time one policy module took to evaluate a send, by module.",
                &["module"],
                POLICY_SECONDS,
            ),
            policy_shadow_changes: counter(
                &registry,
                "gateway_policy_shadow_changes_total",
                "Shadow module evaluations by module and how the shadow's verdict compares with what decided (same, allow->deny, ..., error when the shadow failed).",
                &["module", "change"],
            ),
            policy_inputs_dropped: plain_counter(
                &registry,
                "gateway_policy_inputs_dropped_total",
                "Policy inputs not kept for backtesting because their queue was full or the store refused the batch; a send never waits on them.",
            ),
            provider_request: histogram(
                &registry,
                "gateway_provider_request_seconds",
                "Time a provider took to answer a send, by provider and outcome.",
                &["provider", "outcome"],
                SECONDS,
            ),
            webhook_attempts: counter(
                &registry,
                "gateway_webhook_attempts_total",
                "Webhook delivery attempts by outcome.",
                &["outcome"],
            ),
            password_work: counter(
                &registry,
                "gateway_password_work_total",
                "Password hashes and checks (sign-in, invitations, recovery codes): done, or busy (refused at once: every hashing slot and the queue were taken).",
                &["outcome"],
            ),
            signin_refused: counter(
                &registry,
                "gateway_signin_refused_total",
                "Sign-in attempts refused before any password work, by reason (source: too many from one address; account: too many on one email; busy: no hashing slot).",
                &["reason"],
            ),
            tls_reloads: plain_counter(
                &registry,
                "gateway_tls_reloads_total",
                "TLS certificate and key pairs loaded again (SIGHUP) and served to new connections.",
            ),
            tls_reload_failures: plain_counter(
                &registry,
                "gateway_tls_reload_failures_total",
                "TLS certificate and key pairs refused on reload (SIGHUP): unreadable, not PEM, no certificate or key, or a key that is not the certificate's; the current pair stays.",
            ),
            log_records_dropped: plain_counter(
                &registry,
                "gateway_log_records_dropped_total",
                "Log records dropped because the log's queue was full (the writer fell behind); a request never waits on the log.",
            ),
            send_stages: histogram(
                &registry,
                "gateway_send_stage_seconds",
                "Time a send spent in each stage of its pipeline (see Stage).",
                &["stage"],
                STAGE_SECONDS,
            ),
            pbx_events: counter(
                &registry,
                "gateway_pbx_events_total",
                "PBX webhook events by outcome (the action taken, or the error code).",
                &["outcome"],
            ),
            ingress_events: counter(
                &registry,
                "gateway_ingress_events_total",
                "Provider events received, by outcome.",
                &["outcome"],
            ),
            outbox_pending,
            outbox_oldest_age,
            instances,
            webhook_endpoints,
            registry,
        }
    }

    /// Makes a series at 0 for every label value known before the first request, so a
    /// rate or an alert has something to read from the start (Prometheus's
    /// instrumentation guidance: avoid missing metrics). The values the metrics
    /// themselves define are made here; the rest come from the parts that own them.
    pub fn declare(&self, known: &Known<'_>) {
        for (route, status, published) in &known.routes {
            self.http_requests.with_label_values(&[route, &status.to_string()]);
            if *published {
                self.http_duration.with_label_values(&[route]);
            }
        }
        self.http_requests.with_label_values(&[UNMATCHED, "404"]);
        self.http_duration.with_label_values(&[UNMATCHED]);
        LazyLock::force(&STAGES);
        self.sends.with_label_values(&["allowed", ""]);
        for (decision, code) in known.send_codes {
            self.sends.with_label_values(&[decision, code]);
        }
        for module in &known.modules {
            self.policy_evaluation.with_label_values(&[module]);
            for change in SHADOW_CHANGES {
                self.policy_shadow_changes.with_label_values(&[module, change]);
            }
        }
        for provider in known.providers {
            for outcome in ["sent", "failed", "unknown"] {
                self.provider_request.with_label_values(&[provider, outcome]);
            }
        }
        for outcome in known.pbx_outcomes {
            self.pbx_events.with_label_values(&[outcome]);
        }
        for outcome in ["delivered", "rejected", "error", "gone"] {
            self.webhook_attempts.with_label_values(&[outcome]);
        }
        for outcome in ["applied", "failed", "unauthorized", "too_large", "unreadable"] {
            self.ingress_events.with_label_values(&[outcome]);
        }
        for outcome in ["done", "busy"] {
            self.password_work.with_label_values(&[outcome]);
        }
        for reason in ["source", "account", "busy"] {
            self.signin_refused.with_label_values(&[reason]);
        }
    }

    /// Reads the gauges the store holds, then renders every metric.
    pub async fn render(&self, store: &Store) -> Result<String, StoreError> {
        let (pending, oldest) = store.outbox_backlog().await?;
        self.outbox_pending.set(pending);
        self.outbox_oldest_age.set(oldest.map_or(0.0, |at| (now_ms() - at).max(0) as f64 / 1000.0));
        self.instances.reset();
        for state in ["open", "connecting", "close"] {
            for paused in ["true", "false"] {
                self.instances.with_label_values(&[state, paused]).set(0);
            }
        }
        for (state, paused, count) in store.instance_states().await? {
            self.instances.with_label_values(&[state.as_str(), if paused { "true" } else { "false" }]).set(count);
        }
        self.webhook_endpoints.reset();
        for state in ["ok", "failing", "disabled"] {
            self.webhook_endpoints.with_label_values(&[state]).set(0);
        }
        for (state, count) in store.webhook_endpoint_states().await? {
            self.webhook_endpoints.with_label_values(&[state.as_str()]).set(count);
        }
        {
            // The writer keeps its own totals (the store does not know the metrics);
            // each scrape adds what is new, one scrape at a time.
            let _one = self.write_sync.lock().unwrap_or_else(|e| e.into_inner());
            let (batches, writes, busy_us) = crate::store::write_stats();
            self.write_batches.inc_by(batches.saturating_sub(self.write_batches.get()));
            self.writes.inc_by(writes.saturating_sub(self.writes.get()));
            self.write_seconds.inc_by((busy_us as f64 / 1e6 - self.write_seconds.get()).max(0.0));
            let (read_batches, reads) = crate::store::send_read_stats();
            self.send_read_batches.inc_by(read_batches.saturating_sub(self.send_read_batches.get()));
            self.send_reads.inc_by(reads.saturating_sub(self.send_reads.get()));
        }
        let mut out = Vec::new();
        TextEncoder::new()
            .encode(&self.registry.gather(), &mut out)
            .map_err(|e| StoreError::Conflict(e.to_string()))?;
        Ok(String::from_utf8_lossy(&out).into_owned())
    }
}

/// The label values [`Metrics::declare`] makes at 0, from the parts that own them.
#[derive(Default)]
pub struct Known<'a> {
    /// Each route template, the status it answers on success, and whether it is in
    /// the published contract (those also get their duration histogram).
    pub routes: Vec<(String, u16, bool)>,
    /// `(decision, error code)` of the send pipeline's outcomes.
    pub send_codes: &'a [(&'a str, &'a str)],
    /// The policy modules loaded at start.
    pub modules: Vec<String>,
    pub providers: &'a [&'a str],
    pub pbx_outcomes: &'a [&'a str],
}

static METRICS: LazyLock<Metrics> = LazyLock::new(Metrics::new);

/// The process's metrics.
pub fn get() -> &'static Metrics {
    &METRICS
}

/// A stage of the send pipeline, timed into `gateway_send_stage_seconds`: where a
/// send's time goes, read off a running gateway (mean = `_sum / _count`).
#[derive(Clone, Copy, Debug)]
pub enum Stage {
    /// The handler from its start to the pipeline: the API key (and idempotency key)
    /// looked up, the body read and parsed.
    Auth,
    /// The request checked against the schema, the phone number parsed.
    Schema,
    /// The per-send read (customer, instance, key, suppression, counters, contact).
    Read,
    /// The policy modules (both stages, and again when the counters moved).
    Policies,
    /// The attempt's write: counters and the pending row.
    Begin,
    /// The provider call.
    Provider,
    /// The outcome's write (log row, event, contact, key's answer).
    Settle,
    /// The whole handler, from the start to the answer.
    Handler,
}

impl Stage {
    const ALL: [Stage; 8] = [
        Stage::Auth,
        Stage::Schema,
        Stage::Read,
        Stage::Policies,
        Stage::Begin,
        Stage::Provider,
        Stage::Settle,
        Stage::Handler,
    ];

    fn name(self) -> &'static str {
        match self {
            Stage::Auth => "auth",
            Stage::Schema => "schema",
            Stage::Read => "read",
            Stage::Policies => "policies",
            Stage::Begin => "begin",
            Stage::Provider => "provider",
            Stage::Settle => "settle",
            Stage::Handler => "handler",
        }
    }
}

static STAGES: LazyLock<Vec<prometheus::Histogram>> =
    LazyLock::new(|| Stage::ALL.iter().map(|s| get().send_stages.with_label_values(&[s.name()])).collect());

/// Records the time since `started` as `stage`'s, and returns now (the next stage's
/// start).
pub fn stage(stage: Stage, started: std::time::Instant) -> std::time::Instant {
    let now = std::time::Instant::now();
    stage_took(stage, now.duration_since(started));
    now
}

/// Records `took` as `stage`'s time (a stage in several parts).
pub fn stage_took(stage: Stage, took: std::time::Duration) {
    STAGES[stage as usize].observe(took.as_secs_f64());
}

/// A send attempt's outcome.
pub fn send_outcome(decision: &str, error: &str) {
    get().sends.with_label_values(&[decision, error]).inc();
}

/// What the metrics listener serves.
pub struct MetricsContext {
    pub store: Store,
}

/// The metrics, in the Prometheus text format.
#[endpoint { method = GET, path = "/metrics" }]
async fn metrics_get(rqctx: RequestContext<Arc<MetricsContext>>) -> Result<http::Response<Body>, HttpError> {
    let text = get()
        .render(&rqctx.context().store)
        .await
        .map_err(|e| HttpError::for_unavail(None, format!("reading the store for the metrics failed: {e}")))?;
    http::Response::builder()
        .header(http::header::CONTENT_TYPE, TextEncoder::new().format_type())
        .body(Body::from(text))
        .map_err(|e| HttpError::for_internal_error(e.to_string()))
}

/// The metrics listener's API.
pub fn api() -> Result<dropshot::ApiDescription<Arc<MetricsContext>>, String> {
    let mut api = dropshot::ApiDescription::new();
    api.register(metrics_get).map_err(|e| e.to_string())?;
    Ok(api)
}

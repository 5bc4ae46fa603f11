//! The Gateway server: a messaging gateway that checks every send (purpose, content,
//! suppression, fair-use limits) before delivery.
//!
//! `start_server` is what the `gateway` binary and every test call: it opens the store
//! (applying migrations), builds the send pipeline over a provider and a policy engine,
//! starts the HTTP server and the background jobs (registered with one task runner,
//! `tasks`), and returns a `RunningServer` that owns them all. `main` only parses,
//! loads, logs and waits for a signal.

pub mod apikey;
pub mod bounds;
pub mod config;
pub mod dashboard;
pub mod http;
pub mod ingress;
pub mod logging;
pub mod media;
pub mod metrics;
pub mod net;
pub mod ops;
pub mod pbx;
pub mod phone;
pub mod policy;
pub mod provider;
pub mod send;
pub mod state;
pub mod store;
pub mod tasks;
pub mod tls;
pub mod trace;
pub mod webhooks;

pub use logging::make_logger;

use config::Config;
use dropshot::{ConfigDropshot, HandlerTaskMode, ServerBuilder};
use slog::{Logger, info, warn};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use store::Store;
use tasks::{Shutdown, Tasks};

/// How the store connects (durability and the database timeout), from the
/// configuration: the store knows no configuration of its own.
pub fn store_options(config: &Config) -> store::StoreOptions {
    store::StoreOptions {
        durability: store::Durability::parse(&config.sqlite_synchronous).unwrap_or_default(),
        timeout: Duration::from_millis(config.database_timeout_ms),
    }
}

/// What retention deletes at `now` under `config`: each table's cut-off as a plain
/// time (PBX signatures are remembered for twice their tolerance).
pub fn retention_plan(config: &Config, now: i64) -> store::retention::RetentionPlan {
    use bounds::{days_ms, hours_ms};
    let r = &config.retention;
    store::retention::RetentionPlan {
        now,
        message_log_before: now.saturating_sub(days_ms(r.message_log_days)),
        inbound_before: now.saturating_sub(days_ms(r.inbound_days)),
        provider_events_applied_before: now.saturating_sub(hours_ms(r.provider_events_hours)),
        provider_events_failed_before: now.saturating_sub(days_ms(r.failed_provider_events_days)),
        review_before: now.saturating_sub(days_ms(r.review_days)),
        contacts_before: now.saturating_sub(days_ms(r.contacts_days)),
        webhooks_before: now.saturating_sub(days_ms(config.webhooks.retention_days)),
        pbx_events_before: now.saturating_sub(days_ms(config.pbx.event_retention_days)),
        pbx_signatures_before_seconds: (now / 1000).saturating_sub(store::SIGNATURE_MEMORY_SECONDS),
        policy_inputs_before: now.saturating_sub(days_ms(config.policies.input_retention_days)),
    }
}

/// A server could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Store(#[from] store::StoreError),
    #[error("building the API description: {0}")]
    Api(String),
    #[error(transparent)]
    Tls(#[from] tls::TlsError),
    #[error("starting the HTTP server: {0}")]
    Http(String),
    #[error("starting the metrics listener: {0}")]
    Metrics(String),
    #[error("the {0} provider is not available (evolution needs evolution_url and evolution_api_key)")]
    Provider(String),
    #[error(transparent)]
    PolicyHost(#[from] policy::host::HostError),
    #[error(transparent)]
    Policies(#[from] policy::reload::ReloadError),
}

/// The provider and the policy engine a server sends through: what the configuration
/// asks for (`Parts::from_config`), or a test's own (a scripted provider, a fixed
/// policy engine).
pub struct Parts {
    pub provider: Arc<dyn provider::Provider>,
    /// `None`: the WebAssembly policy host with the bundled policies and
    /// `policies_dir`, hot-reloaded (the production engine).
    pub policy: Option<Arc<dyn policy::PolicyEngine>>,
}

impl Parts {
    /// The parts `config` asks for.
    pub fn from_config(config: &Config) -> Result<Parts, StartError> {
        let evolution = crate::provider::evolution::Evolution::from_config(config);
        match config.provider.as_str() {
            "simulator" => {}
            "evolution" if evolution.is_some() => {}
            other => return Err(StartError::Provider(other.to_string())),
        }
        let router = provider::Router { simulator: provider::Simulator, evolution };
        Ok(Parts { provider: Arc::new(router), policy: None })
    }
}

/// A running gateway: HTTP server, store and background jobs.
pub struct RunningServer {
    http: dropshot::HttpServer<Arc<state::AppState>>,
    metrics: Option<dropshot::HttpServer<Arc<metrics::MetricsContext>>>,
    tls: Option<tls::TlsFiles>,
    store: Store,
    /// Every background job, the webhook dispatcher among them.
    tasks: Tasks,
    /// How long the dispatcher gets to stop: its grace, and time for a claim in
    /// progress and the give-back of what it stopped to reach the database.
    dispatcher_limit: Duration,
    policies: Option<policy::reload::PolicyControl>,
    /// Settles still retrying in the background (see `send::settle`).
    settling: Arc<send::settle::Settling>,
    log: Logger,
}

impl RunningServer {
    /// The address the server listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.http.local_addr()
    }

    /// Reads the certificate and key files again and serves them to new connections;
    /// connections already open keep theirs. A pair that does not load (see
    /// [`tls::TlsFiles::load`]) is refused, logged and counted
    /// (`gateway_tls_reload_failures_total`), and the current one stays.
    pub async fn reload_tls(&self) -> Result<(), tls::TlsError> {
        let files = self.tls.as_ref().ok_or(tls::TlsError::NotConfigured)?;
        let result = match files.load_guarded().await {
            // Dropshot takes a finished configuration as is (its `TryFrom` returns
            // `Dynamic` unchanged): nothing left for it to refuse, or panic on.
            Ok(loaded) => self
                .http
                .refresh_tls(&dropshot::ConfigTls::Dynamic(loaded.config))
                .await
                .map(|()| loaded.sha256)
                .map_err(tls::TlsError::Refresh),
            Err(e) => Err(e),
        };
        let m = metrics::get();
        match result {
            Ok(sha256) => {
                m.tls_reloads.inc();
                info!(self.log, "TLS certificate reloaded"; "cert_file" => %files.cert.display(), "sha256" => sha256);
                Ok(())
            }
            Err(e) => {
                m.tls_reload_failures.inc();
                warn!(self.log, "TLS certificate refused; the current one stays"; "error" => %e);
                Err(e)
            }
        }
    }

    /// The store the server uses.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// The policy host's control (reload, rollback, status), unless a test replaced
    /// the policy engine.
    pub fn policies(&self) -> Option<&policy::reload::PolicyControl> {
        self.policies.as_ref()
    }

    /// Stops accepting and lets requests in flight finish; lets the webhook deliveries
    /// in flight finish (within `webhooks.shutdown_grace_ms`) and the settles requests
    /// left to the background (for up to 10 s); stops the other background jobs, each
    /// after the iteration it is in (for up to `JOBS_LIMIT`); gives the process's lease
    /// up (what is still pending is then orphaned at once); closes the store.
    pub async fn close(mut self) -> Result<(), String> {
        let result = self.http.close().await;
        if let Some(metrics) = self.metrics {
            let _ = metrics.close().await;
        }
        self.tasks.stop(webhooks::JOB, self.dispatcher_limit).await;
        if !self.settling.drained(Duration::from_secs(10)).await {
            warn!(self.log, "settles still failing at shutdown; their rows become unknown";
                  "count" => self.settling.running());
        }
        // The lease's renewal stops here too: nothing is begun under it any more.
        self.tasks.close(JOBS_LIMIT).await;
        if let Err(e) = self.store.release_lease().await {
            warn!(self.log, "giving the process lease up failed"; "error" => %e);
        }
        self.store.close().await;
        info!(self.log, "gateway stopped");
        result
    }

    /// Resolves when the HTTP server stops by itself.
    pub async fn wait_for_shutdown(&self) -> Result<(), String> {
        self.http.wait_for_shutdown().await
    }
}

/// The HTTP routes to label answers by, and every metric series known before the first
/// request made at 0 (see `metrics::Metrics::declare`).
fn declare_metrics(modules: Vec<String>) -> Result<Arc<metrics::Routes>, StartError> {
    let router = http::api_description().map_err(StartError::Api)?.into_router();
    let routes: Vec<(String, u16, bool)> = router
        .endpoints(None)
        .map(|(path, _, endpoint)| (path, endpoint.response.success.map_or(200, |s| s.as_u16()), endpoint.visible))
        .collect();
    let labels = Arc::new(metrics::Routes::new(routes.iter().map(|(path, ..)| path.as_str())));
    metrics::get().declare(&metrics::Known {
        routes,
        send_codes: send::OUTCOMES,
        modules,
        providers: provider::NAMES,
        pbx_outcomes: pbx::OUTCOMES,
    });
    Ok(labels)
}

/// Starts the gateway described by `config` with its default parts.
pub async fn start_server(log: Logger, config: &Config) -> Result<RunningServer, StartError> {
    let parts = Parts::from_config(config)?;
    start_server_with(log, config, parts).await
}

/// Starts the gateway with the given parts.
pub async fn start_server_with(log: Logger, config: &Config, parts: Parts) -> Result<RunningServer, StartError> {
    let config = Arc::new(config.clone());
    // Checked first: a pair that does not load stops the start before anything else.
    let tls = config.tls.files();
    let tls_loaded = match &tls {
        Some(files) => Some(files.load_guarded().await?),
        None => None,
    };
    if config.allow_loopback_targets {
        warn!(
            log,
            "GATEWAY_ALLOW_LOOPBACK_TARGETS is on: webhook and media URLs may point at loopback; \
                    use this for development and tests only"
        );
    }
    let store_log = log.new(slog::o!("component" => "store"));
    let options = store_options(&config);
    let store =
        Store::open_with(&config.database_url, config.database_max_connections, Some(store_log), options).await?;
    let mut tasks = Tasks::new(log.new(slog::o!("component" => "tasks")));
    // The lease first: every attempt this process begins names it (see store::leases).
    // Its renewal takes no shutdown signal: the runner aborts it at close.
    tasks.adopt("process lease", store.hold_lease(log.new(slog::o!("component" => "lease"))).await?);
    let (engine, policies, modules): (Arc<dyn policy::PolicyEngine>, _, _) = match parts.policy {
        Some(engine) => (engine, None, Vec::new()),
        None => {
            let log = log.new(slog::o!("component" => "policy"));
            let host = Arc::new(policy::host::PolicyHost::new(&config.policies, log.clone())?);
            let dir = config.policies_dir.as_deref().filter(|d| !d.is_empty()).map(std::path::PathBuf::from);
            let control =
                policy::reload::start(host.clone(), &config.policies, dir, Some(store.clone()), &mut tasks, log)
                    .await?;
            let modules = host.current().modules.iter().map(|m| m.metadata.name.clone()).collect();
            (Arc::new(host), Some(control), modules)
        }
    };
    let send_log = log.new(slog::o!("component" => "send"));
    let mut sender = send::Sender::new(store.clone(), parts.provider, engine, config.clone(), send_log);
    if config.policies.input_retention_days > 0 {
        let log = log.new(slog::o!("component" => "policy inputs"));
        sender.keep_inputs(policy::inputs::Inputs::start(store.clone(), &mut tasks, log));
    }
    let settling = sender.settling();
    let mut state = state::AppState::new(store.clone(), sender, config.clone());
    state.policies = policies.clone();
    let state = Arc::new(state);
    // The dummy hash unknown emails are checked against, made before the first sign-in.
    dashboard::auth::prepare().await;
    // libphonenumber's rules, read before the first send instead of during it.
    phone::prepare().await;
    let api = http::api_description().map_err(StartError::Api)?;
    let routes = declare_metrics(modules)?;
    let dropshot_config = ConfigDropshot {
        bind_address: config.listen,
        default_request_body_max_bytes: 64 * 1024,
        default_handler_task_mode: HandlerTaskMode::Detached,
        // Every log line of a request carries Dropshot's `req_id` and, beside it, the
        // caller's `X-Correlation-Id` (as `hdr_x_correlation_id`).
        log_headers: vec![trace::CORRELATION_HEADER.to_string()],
        ..Default::default()
    };
    // Every answer is counted from Dropshot's "request completed" record (see metrics).
    let http_log = log.new(slog::o!("component" => "http"));
    // The send's handler writes its request's one line (see `http::message_send`).
    let quiet = vec![("POST", "/api/send-message")];
    let http_log = Logger::root(metrics::HttpDrain::new(routes, quiet, http_log), slog::o!());
    let sha256 = tls_loaded.as_ref().map(|l| l.sha256.clone());
    let http = ServerBuilder::new(api, state, http_log)
        .config(dropshot_config)
        .tls(tls_loaded.map(|l| dropshot::ConfigTls::Dynamic(l.config)))
        .start()
        .map_err(|e| StartError::Http(e.to_string()))?;
    let metrics = match config.metrics_listen {
        Some(address) => {
            let api = metrics::api().map_err(StartError::Metrics)?;
            let context = Arc::new(metrics::MetricsContext { store: store.clone() });
            let config = ConfigDropshot { bind_address: address, ..Default::default() };
            let server = ServerBuilder::new(api, context, log.new(slog::o!("component" => "metrics")))
                .config(config)
                .start()
                .map_err(|e| StartError::Metrics(e.to_string()))?;
            info!(log, "metrics listening"; "address" => %server.local_addr());
            Some(server)
        }
        None => None,
    };
    let (s, c, l) = (store.clone(), config.clone(), log.new(slog::o!("component" => "retention")));
    tasks.spawn("retention", move |stop| retention(s, c, l, stop));
    let (s, c, l) = (store.clone(), config.clone(), log.new(slog::o!("component" => "ingress")));
    tasks.spawn("provider watch", move |stop| provider_watch(s, c, l, stop));
    let (s, l) = (store.clone(), log.new(slog::o!("component" => "send")));
    tasks.spawn("orphan sweep", move |stop| orphan_sweep(s, l, stop));
    store.spawn_cache_invalidation(&mut tasks, log.new(slog::o!("component" => "cache")));
    if config.webhooks.dispatch {
        let log = log.new(slog::o!("component" => "webhooks"));
        webhooks::Dispatcher::new(store.clone(), config.webhooks.clone(), config.allow_loopback_targets, log)
            .spawn(&mut tasks);
    }
    let dispatcher_limit = Duration::from_millis(config.webhooks.shutdown_grace_ms + 2 * config.database_timeout_ms)
        + Duration::from_secs(1);
    info!(log, "gateway listening"; "address" => %http.local_addr(), "backend" => ?store.backend(),
          "provider" => &config.provider, "https" => tls.is_some(), "certificate_sha256" => sha256);
    Ok(RunningServer { http, metrics, tls, store, tasks, dispatcher_limit, policies, settling, log })
}

/// How long the background jobs other than the dispatcher get at shutdown to finish
/// the iteration they are in; one still running then is named in a warning and aborted.
const JOBS_LIMIT: Duration = Duration::from_secs(10);

/// Tells customers of connection changes once they have held for the debounce period,
/// and fails messages the provider never acknowledged as delivered (watchdog).
async fn provider_watch(store: Store, config: Arc<Config>, log: Logger, mut stop: Shutdown) {
    let debounce = config.connection_debounce_ms as i64;
    let ack_timeout = config.delivery_ack_timeout_ms as i64;
    let tick = Duration::from_millis((config.connection_debounce_ms / 2).clamp(50, 1_000));
    let mut interval = tokio::time::interval(tick);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The watchdog's window: the whole day before the cut-off at start and every
    // WATCHDOG_FULL_EVERY (a message settled late is still found), else only what
    // crossed the cut-off since the last run that succeeded, with a margin: every
    // second it read the whole day's sends, which grows with the traffic.
    let mut covered: Option<i64> = None;
    let mut last_full = tokio::time::Instant::now();
    while stop.tick(&mut interval).await {
        let now = store::now_ms();
        if let Err(e) = store.emit_settled_connections(now - debounce).await {
            warn!(log, "writing connection events failed"; "error" => %e);
        }
        if let Err(e) = store.close_conversations(now).await {
            warn!(log, "closing conversation windows failed"; "error" => %e);
        }
        let cutoff = now - ack_timeout;
        let full = covered.is_none() || last_full.elapsed() >= WATCHDOG_FULL_EVERY;
        let since = match covered {
            Some(done) if !full => done - WATCHDOG_MARGIN_MS,
            _ => cutoff - 24 * 3_600_000,
        };
        match store.flag_unacknowledged(cutoff, since).await {
            Ok(n) => {
                covered = Some(cutoff);
                if full {
                    last_full = tokio::time::Instant::now();
                }
                if n > 0 {
                    info!(log, "messages never acknowledged as delivered"; "count" => n);
                }
            }
            Err(e) => warn!(log, "the delivery watchdog failed"; "error" => %e),
        }
    }
}

/// How often the delivery watchdog reads the whole day before its cut-off.
const WATCHDOG_FULL_EVERY: Duration = Duration::from_secs(600);
/// How far before the last run's cut-off the watchdog's next window starts (a message
/// settled up to a minute after its cut-off passed is found at once; a later one by the
/// next whole-day read).
const WATCHDOG_MARGIN_MS: i64 = 60_000;

/// Attempts left pending by a process that stopped while the provider call was in
/// flight (its lease lapsed: see `store::leases`) become `unknown` (they may have been
/// sent), and their idempotency keys get that answer: at start and every second, by
/// whichever replica gets there first (the update is conditional, so replicas never
/// settle one row twice).
async fn orphan_sweep(store: Store, log: Logger, mut stop: Shutdown) {
    let mut tick = tokio::time::interval(ORPHAN_SWEEP_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    while stop.tick(&mut tick).await {
        match store.sweep_orphans(store::now_ms(), send::answer::orphan_answer()).await {
            Ok(n) if n > 0 => warn!(log, "attempts orphaned by a stopped process are now unknown"; "count" => n),
            Ok(_) => {}
            Err(e) => warn!(log, "settling orphaned attempts failed"; "error" => %e),
        }
    }
}

/// How often attempts of stopped processes are looked for.
const ORPHAN_SWEEP_INTERVAL: Duration = Duration::from_secs(1);

/// Deletes rows past their retention (`store::retention`) every 10 minutes, the first
/// time a minute after start. A run spreads its batches over minutes, so a stop ends it
/// at once, in a pause or before its next batch (each batch is its own transaction; the
/// rest goes at the next start), and what it deleted until then is logged.
async fn retention(store: Store, config: Arc<Config>, log: Logger, mut stop: Shutdown) {
    let start = tokio::time::Instant::now() + Duration::from_secs(60);
    let mut tick = tokio::time::interval_at(start, Duration::from_secs(600));
    while stop.tick(&mut tick).await {
        let (plan, started) = (retention_plan(&config, store::now_ms()), tokio::time::Instant::now());
        match store.run_retention_until(&plan, stop.stopped()).await {
            Ok(report) => {
                let pruned: Vec<String> =
                    report.iter().filter(|p| p.rows > 0).map(|p| format!("{} {}", p.table, p.rows)).collect();
                if !pruned.is_empty() {
                    info!(log, "retention: rows deleted"; "tables" => pruned.join(", "),
                          "seconds" => started.elapsed().as_secs());
                }
            }
            Err(e) => warn!(log, "retention run failed"; "error" => %e),
        }
    }
}

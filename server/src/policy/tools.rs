//! What `gateway policy ...` does: build, check, evaluate and test modules in the same
//! sandbox the server uses, and see and change what running gateways use.
//!
//! `build`, `check`, `eval` and `test` need no database: a policy author runs them on
//! their own machine. `eval` and `test` also take the core module cargo builds (it is
//! componentized in memory), so an author can try a rule before building the artifact.

use super::host::PolicyHost;
use super::module::{self, LoadError, LoadedModule, Metadata};
use crate::config::PolicySettings;
use crate::store::{NewModule, Rollout, RolloutMode, Store, StoreError, StoredModule, now_ms};
use gateway_policy_model::{Context, Report};
use serde_json::{Value, json};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A tool failed.
#[derive(Debug, thiserror::Error)]
pub enum ToolError {
    #[error("{path}: {error}")]
    Read { path: String, error: std::io::Error },
    #[error(transparent)]
    Load(#[from] LoadError),
    #[error("{0}")]
    Invalid(String),
    #[error(transparent)]
    Host(#[from] super::host::HostError),
    #[error(transparent)]
    Store(#[from] StoreError),
}

fn read(path: &Path) -> Result<Vec<u8>, ToolError> {
    std::fs::read(path).map_err(|error| ToolError::Read { path: path.display().to_string(), error })
}

fn read_text(path: &Path) -> Result<String, ToolError> {
    std::fs::read_to_string(path).map_err(|error| ToolError::Read { path: path.display().to_string(), error })
}

/// A host for the tools, in the server's sandbox configuration.
pub fn host(settings: &PolicySettings) -> Result<PolicyHost, ToolError> {
    Ok(PolicyHost::new(settings, slog::Logger::root(slog::Discard, slog::o!()))?)
}

/// What `policy build` is told besides the input.
#[derive(Clone, Debug, Default)]
pub struct BuildOptions {
    pub fixtures: Option<std::path::PathBuf>,
    pub name: Option<String>,
    pub version: Option<String>,
    pub stages: Option<String>,
}

/// Builds the artifact the gateway loads from `input` (a core module built with the
/// SDK, or a component), writes it to `output`, and reports what it is. The result is
/// validated as the server would: metadata, interface version, compile, imports,
/// bindings, and (when given) every fixture in the sandbox.
pub fn build(host: &PolicyHost, input: &Path, output: &Path, options: &BuildOptions) -> Result<Value, ToolError> {
    let bytes = read(input)?;
    let (component, found) = module::componentize(&bytes)?;
    let mut metadata = match found {
        Some(m) => m,
        None => Metadata::unstamped(options.name.clone().ok_or_else(|| {
            ToolError::Invalid(
                "the module has no gateway-policy metadata (export it with gateway_policy::export_policy!) and no \
                 --name was given"
                    .into(),
            )
        })?),
    };
    if let Some(name) = &options.name {
        metadata.name = name.clone();
    }
    if let Some(version) = &options.version {
        metadata.version = version.clone();
    }
    if let Some(stages) = &options.stages {
        metadata.stages = stages.clone();
    }
    if let Some(path) = &options.fixtures {
        metadata.fixtures = module::fixtures_from_json(&read_text(path)?)
            .map_err(|e| ToolError::Invalid(format!("{}: {e}", path.display())))?;
    }
    let artifact = module::with_metadata(&component, &metadata)?;
    let has_fixtures = !metadata.fixtures.is_empty();
    let loaded = host.load(&artifact, &output.display().to_string(), has_fixtures)?;
    std::fs::write(output, &artifact).map_err(|error| ToolError::Read { path: output.display().to_string(), error })?;
    let mut out = describe(&loaded);
    out["fixtures"] = match has_fixtures {
        true => json!(format!("{} passed, 0 failed", metadata.fixtures.len())),
        false => json!("none: the gateway refuses to serve a module without fixtures (build with --fixtures FILE)"),
    };
    Ok(out)
}

fn describe(m: &LoadedModule) -> Value {
    json!({
        "name": m.metadata.name,
        "version": m.metadata.version,
        "interface": m.interface(),
        "stages": m.stages.iter().map(|s| s.as_str()).collect::<Vec<_>>(),
        "size": m.size,
        "sha256": m.sha256,
        "compile_ms": m.compile_ms,
        "file": m.source,
    })
}

/// A module to try: a built artifact, or a core module made a component in memory
/// (named after its file if it has no metadata).
fn load_for_trying(host: &PolicyHost, path: &Path) -> Result<LoadedModule, ToolError> {
    let bytes = read(path)?;
    let (component, found) = module::componentize(&bytes)?;
    let metadata = found.unwrap_or_else(|| {
        Metadata::unstamped(
            path.file_stem()
                .map(|s| s.to_string_lossy().to_ascii_lowercase().replace(|c: char| !c.is_ascii_alphanumeric(), "-"))
                .unwrap_or_else(|| "module".into()),
        )
    });
    let artifact = module::with_metadata(&component, &metadata)?;
    Ok(host.load(&artifact, &path.display().to_string(), false)?)
}

/// Everything about a built module, and whether a gateway would serve it.
pub fn check(host: &PolicyHost, path: &Path) -> Result<Value, ToolError> {
    let bytes = read(path)?;
    let loaded = host.load(&bytes, &path.display().to_string(), false)?;
    let mut out = describe(&loaded);
    let limits = host.limits();
    out["sandbox"] = json!({"fuel": limits.fuel, "memory_bytes": limits.memory_bytes, "imports": "types only"});
    let report = loaded.run_fixtures(&loaded.metadata.fixtures, limits);
    let max_fuel = report.results.iter().filter_map(|r| r.fuel).max();
    out["fixtures"] = json!({"count": report.results.len(), "passed": report.passed(), "failed": report.failed(),
                             "max_fuel": max_fuel});
    out["servable"] = match host.load(&bytes, "check", true) {
        Ok(_) => json!(true),
        Err(e) => json!(e.to_string()),
    };
    Ok(out)
}

/// Evaluates one context in the sandbox: the verdict, or the fault; fuel and time.
pub fn eval(host: &PolicyHost, module_path: &Path, context_path: &Path) -> Result<(bool, Value), ToolError> {
    let module = load_for_trying(host, module_path)?;
    let ctx = Context::from_json(&read_text(context_path)?).map_err(ToolError::Invalid)?;
    let e = module.evaluate(&module.convert(&ctx), host.limits());
    let mut out = match &e.outcome {
        Ok(verdict) => serde_json::to_value(verdict).unwrap_or_default(),
        Err(fault) => json!({"fault": fault.kind(), "error": fault.to_string()}),
    };
    out["module"] = json!(module.label());
    out["stage"] = json!(ctx.stage.as_str());
    out["fuel"] = json!(e.fuel);
    out["micros"] = json!(e.micros);
    Ok((e.outcome.is_ok(), out))
}

/// Runs a fixture file in the sandbox (`max_fuel`: a budget for every fixture that
/// sets none).
pub fn test(
    host: &PolicyHost,
    module_path: &Path,
    fixtures: &Path,
    max_fuel: Option<u64>,
) -> Result<Report, ToolError> {
    let module = load_for_trying(host, module_path)?;
    let mut fixtures = module::fixtures_from_json(&read_text(fixtures)?)
        .map_err(|e| ToolError::Invalid(format!("{}: {e}", fixtures.display())))?;
    if let Some(max) = max_fuel {
        fixtures.iter_mut().filter(|f| f.max_fuel.is_none()).for_each(|f| f.max_fuel = Some(max));
    }
    Ok(module.run_fixtures(&fixtures, host.limits()))
}

/// A gateway that reported within this long is live.
const LIVE_MS: i64 = 30_000;

/// What each gateway on this store runs (reported in the last hour).
pub async fn list(store: &Store) -> Result<Value, ToolError> {
    let now = now_ms();
    let gateways = store.policy_gateways(now - 3_600_000).await?;
    let rows: Vec<Value> = gateways
        .iter()
        .map(|g| {
            let status: Value = serde_json::from_str(&g.status).unwrap_or(Value::Null);
            json!({
                "gateway_id": g.gateway_id, "host": g.host, "pid": g.pid,
                "started_at": g.started_at, "heartbeat_at": g.heartbeat_at,
                "live": now - g.heartbeat_at <= LIVE_MS,
                "generation": status["generation"], "modules": status["modules"],
                "refused": status["refused"], "last_command": status["last_command"],
            })
        })
        .collect();
    Ok(json!({"gateways": rows}))
}

/// Queues `reload` or `rollback NAME` for every running gateway and waits up to
/// `wait` for each live one to carry it out. `Ok((all done and succeeded, report))`.
pub async fn command(
    store: &Store,
    command: &str,
    name: Option<&str>,
    wait: Duration,
) -> Result<(bool, Value), ToolError> {
    let id = store.add_policy_command(command, name).await?;
    await_command(store, id, command, name, wait).await
}

/// Waits up to `wait` for every live gateway to carry out command `id`.
async fn await_command(
    store: &Store,
    id: i64,
    command: &str,
    name: Option<&str>,
    wait: Duration,
) -> Result<(bool, Value), ToolError> {
    let deadline = Instant::now() + wait;
    loop {
        let now = now_ms();
        let live = store.policy_gateways(now - LIVE_MS).await?;
        let done = live.iter().all(|g| g.command_seen >= id);
        if done || Instant::now() >= deadline {
            let mut ok = done && !live.is_empty();
            let gateways: Vec<Value> = live
                .iter()
                .map(|g| {
                    let status: Value = serde_json::from_str(&g.status).unwrap_or(Value::Null);
                    let result = &status["last_command"];
                    let carried_out = g.command_seen >= id && result["id"] == json!(id);
                    if !(carried_out && result["ok"] == true) {
                        ok = false;
                    }
                    json!({
                        "gateway_id": g.gateway_id, "host": g.host, "pid": g.pid,
                        "done": carried_out, "ok": result["ok"], "result": result["message"],
                        "modules": status["modules"], "refused": status["refused"],
                    })
                })
                .collect();
            let note = if live.is_empty() {
                Some("no gateway reported in the last 30 s; running gateways load the directory when they start")
            } else {
                None
            };
            return Ok((
                ok,
                json!({"command_id": id, "command": command, "name": name, "gateways": gateways, "note": note}),
            ));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Checks a module as a reload does (compile, sandbox, every fixture) and, only if a
/// gateway would serve it, stores it: every replica on the store loads it within a
/// few seconds. A refused module is never stored.
pub async fn install(
    store: &Store,
    host: Arc<PolicyHost>,
    bytes: Vec<u8>,
    by: &str,
) -> Result<(LoadedModule, StoredModule), ToolError> {
    install_as(store, host, bytes, by, Rollout::default()).await
}

/// `install`, as a shadow, a canary or for some customers or plans (`rollout`).
pub async fn install_as(
    store: &Store,
    host: Arc<PolicyHost>,
    bytes: Vec<u8>,
    by: &str,
    rollout: Rollout,
) -> Result<(LoadedModule, StoredModule), ToolError> {
    let checked = tokio::task::spawn_blocking(move || host.load(&bytes, "install", true).map(|m| (m, bytes)))
        .await
        .map_err(|e| ToolError::Invalid(format!("checking the module panicked: {e}")))?;
    let (module, bytes) = checked?;
    let new = NewModule {
        name: &module.metadata.name,
        version: &module.metadata.version,
        sha256: &module.sha256,
        bytes: &bytes,
        installed_by: by,
        rollout,
    };
    let stored = store.install_policy_module(&new).await?;
    Ok((module, stored))
}

/// How `policy install` is told to run a module: at most one of a shadow, a canary
/// share (1 to 99 %) and a scope (customers and/or plans, which must exist).
pub async fn rollout(
    store: &Store,
    shadow: bool,
    canary: Option<u8>,
    customers: &[String],
    plans: &[String],
) -> Result<Rollout, ToolError> {
    let scoped = !customers.is_empty() || !plans.is_empty();
    if [shadow, canary.is_some(), scoped].iter().filter(|b| **b).count() > 1 {
        return Err(ToolError::Invalid("--shadow, --canary and --customers/--plans do not combine".into()));
    }
    let mode = match canary {
        Some(p) if !(1..=99).contains(&p) => {
            return Err(ToolError::Invalid(format!("--canary {p}: a share of 1 to 99 percent")));
        }
        Some(p) => RolloutMode::Canary(p),
        None if shadow => RolloutMode::Shadow,
        None => RolloutMode::Live,
    };
    for plan in plans {
        if !crate::config::PLAN_NAMES.contains(&plan.as_str()) {
            return Err(ToolError::Invalid(format!("--plans: no plan {plan:?} (starter, scale)")));
        }
    }
    for customer in customers {
        match store.customer(customer).await {
            Ok(_) => {}
            Err(StoreError::NotFound(_)) => {
                return Err(ToolError::Invalid(format!("--customers: no customer {customer:?}")));
            }
            Err(e) => return Err(e.into()),
        }
    }
    let sorted = |items: &[String]| {
        let mut items = items.to_vec();
        items.sort();
        items.dedup();
        items
    };
    Ok(Rollout { mode, customers: sorted(customers), plans: sorted(plans) })
}

/// `policy install FILE`: installs (as `rollout` says), then waits up to `wait` for
/// every live gateway to run it. `Ok((every live gateway runs it, report))`.
pub async fn install_file(
    store: &Store,
    settings: &PolicySettings,
    path: &Path,
    rollout: Rollout,
    wait: Duration,
) -> Result<(bool, Value), ToolError> {
    let bytes = read(path)?;
    let (module, stored) = install_as(store, Arc::new(host(settings)?), bytes, "cli", rollout).await?;
    let (ok, gateways) = await_module(store, &module.sha256, wait).await?;
    let mut out = describe(&module);
    out["file"] = json!(path.display().to_string());
    out["stored_id"] = json!(stored.id);
    out["mode"] = json!(stored.rollout.mode_label());
    out["scope"] = json!(stored.rollout.scope_label());
    out["fixtures"] = json!(format!("{} passed, 0 failed", module.metadata.fixtures.len()));
    out["gateways"] = gateways;
    Ok((ok, out))
}

/// `policy promote NAME`: the shadow or canary of NAME becomes its live module on every
/// replica (the live module before it is kept for `rollback`); waits up to `wait`.
pub async fn promote(store: &Store, name: &str, by: &str, wait: Duration) -> Result<(bool, Value), ToolError> {
    let Some((trial, live)) = store.promote_policy_module(name, by).await? else {
        return Err(ToolError::Invalid(format!(
            "no shadow or canary of {name:?} runs: install one with --shadow or --canary"
        )));
    };
    let (ok, gateways) = await_promoted(store, name, &live.sha256, wait).await?;
    Ok((
        ok,
        json!({"name": name, "version": live.version, "sha256": live.sha256, "stored_id": live.id,
               "was": trial.rollout.mode_label(), "gateways": gateways}),
    ))
}

/// Waits until every live gateway runs `sha256` as the live module of `name` and no
/// trial of it.
async fn await_promoted(store: &Store, name: &str, sha256: &str, wait: Duration) -> Result<(bool, Value), ToolError> {
    let deadline = Instant::now() + wait;
    loop {
        let live = store.policy_gateways(now_ms() - LIVE_MS).await?;
        let states: Vec<bool> = live
            .iter()
            .map(|g| {
                let status: Value = serde_json::from_str(&g.status).unwrap_or(Value::Null);
                let modules = status["modules"].as_array().cloned().unwrap_or_default();
                let mine: Vec<&Value> = modules.iter().filter(|m| m["name"] == name).collect();
                mine.iter().any(|m| m["sha256"] == sha256 && m["mode"] == "live")
                    && mine.iter().all(|m| m["mode"] == "live")
            })
            .collect();
        if states.iter().all(|s| *s) || Instant::now() >= deadline {
            let ok = !live.is_empty() && states.iter().all(|s| *s);
            let gateways: Vec<Value> = live
                .iter()
                .zip(&states)
                .map(|(g, runs)| json!({"gateway_id": g.gateway_id, "host": g.host, "pid": g.pid, "live": runs}))
                .collect();
            return Ok((ok, json!(gateways)));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// `policy backtest FILE`: the module (built, or a core module made a component in
/// memory) asked about the kept inputs of `window`, with progress on stderr.
pub async fn backtest_file(
    store: &Store,
    settings: &PolicySettings,
    path: &Path,
    window: &super::backtest::Window,
) -> Result<Value, ToolError> {
    if settings.input_retention_days == 0 {
        return Err(ToolError::Invalid(
            "backtesting is off: [policies] input_retention_days is 0, so no inputs are kept".into(),
        ));
    }
    let host = Arc::new(host(settings)?);
    let module = Arc::new(load_for_trying(&host, path)?);
    let started = Instant::now();
    let report = super::backtest::backtest(store, &host, module, window, |n| {
        eprintln!("backtest: {n} sends evaluated ({:.1} s)", started.elapsed().as_secs_f64())
    })
    .await?;
    Ok(report)
}

/// Waits up to `wait` until every live gateway runs the module with `sha256` or has
/// refused it; reports each.
pub async fn await_module(store: &Store, sha256: &str, wait: Duration) -> Result<(bool, Value), ToolError> {
    let deadline = Instant::now() + wait;
    loop {
        let live = store.policy_gateways(now_ms() - LIVE_MS).await?;
        let states: Vec<(bool, Option<Value>)> = live
            .iter()
            .map(|g| {
                let status: Value = serde_json::from_str(&g.status).unwrap_or(Value::Null);
                let runs = status["modules"].as_array().is_some_and(|m| m.iter().any(|m| m["sha256"] == sha256));
                let refused = status["refused"]
                    .as_array()
                    .and_then(|r| r.iter().find(|r| r["sha256"] == sha256).map(|r| r["error"].clone()));
                (runs, refused)
            })
            .collect();
        let settled = states.iter().all(|(runs, refused)| *runs || refused.is_some());
        if settled || Instant::now() >= deadline {
            let ok = !live.is_empty() && states.iter().all(|(runs, _)| *runs);
            let gateways: Vec<Value> = live
                .iter()
                .zip(&states)
                .map(|(g, (runs, refused))| {
                    json!({"gateway_id": g.gateway_id, "host": g.host, "pid": g.pid, "live": runs,
                           "refused": refused})
                })
                .collect();
            return Ok((ok, json!(gateways)));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// `policy rollback NAME`: a module installed in the store is retired there, so the
/// one before it is live again on every replica alike; any other module goes back to
/// the version each gateway ran before (a command every gateway carries out).
pub async fn rollback(store: &Store, name: &str, wait: Duration) -> Result<(bool, Value), ToolError> {
    let (id, retired) = request_rollback(store, name).await?;
    let command = if retired.is_some() { "reload" } else { "rollback" };
    let (ok, mut out) = await_command(store, id, command, Some(name), wait).await?;
    if let Some(r) = retired {
        out["retired"] = json!({"name": r.name, "version": r.version, "sha256": r.sha256, "stored_id": r.id,
                                "mode": r.rollout.mode_label(), "scope": r.rollout.scope_label()});
    }
    Ok((ok, out))
}

/// Starts a rollback of `name` (see `rollback`): the command id every gateway carries
/// out, and the stored module it retired, if any.
pub async fn request_rollback(store: &Store, name: &str) -> Result<(i64, Option<StoredModule>), StoreError> {
    match store.retire_policy_module(name).await? {
        Some(retired) => Ok((store.add_policy_command("reload", None).await?, Some(retired))),
        None => Ok((store.add_policy_command("rollback", Some(name)).await?, None)),
    }
}

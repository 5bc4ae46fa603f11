//! Hot reload: which modules are live, and changing that while the gateway serves.
//!
//! One task owns the reload state. It loads the bundled modules once, then the
//! policies directory, then the modules installed in the store (`policy install`,
//! see `stored`); a module of a later source replaces the module of the same name of
//! an earlier one, or is added. It swaps the live set when:
//! - the store's modules changed (asked every second, so an install from any machine
//!   is live on every replica within a few seconds);
//! - the directory changed and then stayed unchanged for `debounce_ms` (polled every
//!   `poll_interval_ms`: a file being copied in is not read half-written; writing a
//!   temporary name and renaming is still the safe way to drop a file in);
//! - `SIGHUP` (the binary calls [`PolicyControl::reload`]), or `gateway policy reload`
//!   (a command row in the store, which every gateway on that store polls);
//! - `gateway policy rollback NAME`: for a module installed in the store, the CLI
//!   retires its newest row (the one before it, or the directory's or bundled module,
//!   is live again on every replica alike); otherwise the previous version this
//!   replica ran becomes live again and stays so until NAME's file or stored module
//!   changes.
//!
//! A new module goes live only after it compiles, passes the sandbox checks and every
//! one of its own fixtures (`LoadedModule::load`); otherwise the module it would have
//! replaced stays live, and the refusal is logged and shown by `gateway policy list`.
//! Each gateway writes what it runs (name, version, hash, source) to the store every
//! few seconds and after every change; `policy list` reads that.

use super::bundled;
use super::host::PolicyHost;
use super::module::LoadedModule;
use super::rollout::Variant;
pub use super::status::{CommandResult, HostStatus, ModuleStatus, Refusal};
use super::stored::StoredSource;
use crate::config::PolicySettings;
use crate::store::{Rollout, Store, now_ms};
use crate::tasks::Tasks;
use slog::{Logger, info, warn};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};
use tokio::sync::{mpsc, oneshot};

/// How often a gateway writes its status when nothing changes.
const HEARTBEAT: Duration = Duration::from_secs(5);

/// How often the store is asked which modules it holds (a change is live on every
/// replica within this plus the time to compile the module).
const STORE_POLL: Duration = Duration::from_secs(1);

/// A policy host could not start.
#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    #[error("bundled policy {file} refused: {error}")]
    Bundled { file: String, error: String },
    #[error("{0}")]
    Command(String),
}

enum Request {
    Reload(oneshot::Sender<Result<String, String>>),
    Rollback(String, oneshot::Sender<Result<String, String>>),
}

/// Handle to the reload task.
#[derive(Clone)]
pub struct PolicyControl {
    host: Arc<PolicyHost>,
    requests: mpsc::Sender<Request>,
    status: Arc<Mutex<HostStatus>>,
}

impl PolicyControl {
    /// The host.
    pub fn host(&self) -> &Arc<PolicyHost> {
        &self.host
    }

    /// Reads the directory now (no debounce) and swaps in what changed; an error says
    /// which new files were refused (what they would have replaced stays live).
    pub async fn reload(&self) -> Result<String, String> {
        let (reply, answer) = oneshot::channel();
        self.requests.send(Request::Reload(reply)).await.map_err(|_| "the policy host stopped".to_string())?;
        answer.await.map_err(|_| "the policy host stopped".to_string())?
    }

    /// Makes the previous version of `name` live again.
    pub async fn rollback(&self, name: &str) -> Result<String, String> {
        let (reply, answer) = oneshot::channel();
        let request = Request::Rollback(name.to_string(), reply);
        self.requests.send(request).await.map_err(|_| "the policy host stopped".to_string())?;
        answer.await.map_err(|_| "the policy host stopped".to_string())?
    }

    /// What runs now.
    pub fn status(&self) -> HostStatus {
        self.status.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// A file of the directory, as last read.
struct FileEntry {
    sha256: String,
    /// The module name its metadata gives, if readable.
    name: Option<String>,
    /// The last version of this file that loaded (what stays live when a newer one is
    /// refused).
    loaded: Option<Arc<LoadedModule>>,
    error: Option<Refusal>,
}

struct Pin {
    module: Arc<LoadedModule>,
    /// The directory file's hash for that name when pinned; a different hash unpins.
    dir_sha256: Option<String>,
}

type Snapshot = BTreeMap<PathBuf, (u64, Option<SystemTime>)>;

struct Reloader {
    host: Arc<PolicyHost>,
    dir: Option<PathBuf>,
    bundled: Vec<Arc<LoadedModule>>,
    files: BTreeMap<PathBuf, FileEntry>,
    previous: HashMap<String, Arc<LoadedModule>>,
    pinned: HashMap<String, Pin>,
    snapshot: Snapshot,
    changed_at: Option<Instant>,
    status: Arc<Mutex<HostStatus>>,
    last_reload_at: Option<i64>,
    last_command: Option<CommandResult>,
    /// The status changed since it was last written to the store.
    unreported: bool,
    /// Modules installed in the store (`gateway policy install`).
    stored: Option<StoredSource>,
    last_sync: Instant,
    log: Logger,
}

/// Store side of a running gateway: its identity, and the command cursor.
struct Presence {
    store: Store,
    gateway_id: String,
    host_name: String,
    started_at: i64,
    command_seen: i64,
}

/// Loads the bundled modules and the directory, makes them live, and starts the
/// reload task as the job `policy reload` of `tasks` (at shutdown it finishes the
/// reload, request or poll in progress and stops). Fails if a bundled module is
/// refused (the gateway must not start without its defaults); a refused directory
/// module is only reported.
pub async fn start(
    host: Arc<PolicyHost>,
    settings: &PolicySettings,
    dir: Option<PathBuf>,
    store: Option<Store>,
    tasks: &mut Tasks,
    log: Logger,
) -> Result<PolicyControl, ReloadError> {
    let mut bundled = Vec::new();
    if settings.bundled {
        for (name, bytes) in bundled::MODULES {
            if bytes.is_empty() {
                let error = "not built into this gateway: run scripts/build-policies.sh and rebuild".to_string();
                return Err(ReloadError::Bundled { file: name.to_string(), error });
            }
            let module = load_off_thread(&host, bytes.to_vec(), "bundled".into())
                .await
                .map_err(|error| ReloadError::Bundled { file: name.to_string(), error })?;
            bundled.push(Arc::new(module));
        }
    }
    let status = Arc::new(Mutex::new(HostStatus::default()));
    let mut reloader = Reloader {
        host: host.clone(),
        dir,
        bundled,
        files: BTreeMap::new(),
        previous: HashMap::new(),
        pinned: HashMap::new(),
        snapshot: Snapshot::new(),
        changed_at: None,
        status: status.clone(),
        last_reload_at: None,
        last_command: None,
        unreported: true,
        stored: store.clone().map(StoredSource::new),
        last_sync: Instant::now(),
        log,
    };
    reloader.snapshot = reloader.scan();
    // A refused directory or stored module is reported, not fatal: the bundled one stays.
    let _ = reloader.reload_dir().await;
    let mut presence = match store {
        Some(store) => {
            let command_seen = store.latest_policy_command().await.unwrap_or(0);
            Some(Presence {
                store,
                gateway_id: crate::store::new_id("gw"),
                host_name: host_name(),
                started_at: now_ms(),
                command_seen,
            })
        }
        None => None,
    };
    if let Some(p) = presence.as_mut() {
        reloader.report(p).await;
    }
    let (requests, mut inbox) = mpsc::channel(16);
    let tick = Duration::from_millis(settings.poll_interval_ms.max(10));
    let debounce = Duration::from_millis(settings.debounce_ms);
    tasks.spawn("policy reload", move |mut stop| async move {
        let mut interval = tokio::time::interval(tick);
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last_report = Instant::now();
        loop {
            tokio::select! {
                _ = stop.stopped() => return,
                request = inbox.recv() => match request {
                    Some(Request::Reload(reply)) => {
                        let _ = reply.send(reloader.reload_dir().await);
                    }
                    Some(Request::Rollback(name, reply)) => {
                        let _ = reply.send(reloader.rollback(&name));
                    }
                    None => return,
                },
                _ = interval.tick() => {
                    reloader.watch(debounce).await;
                    if reloader.last_sync.elapsed() >= STORE_POLL {
                        reloader.follow_store().await;
                    }
                    if let Some(p) = presence.as_mut() {
                        reloader.run_commands(p).await;
                    }
                }
            }
            if let Some(p) = presence.as_mut()
                && (last_report.elapsed() >= HEARTBEAT || reloader.unreported)
            {
                reloader.report(p).await;
                reloader.unreported = false;
                last_report = Instant::now();
            }
        }
    });
    Ok(PolicyControl { host, requests, status })
}

pub(super) async fn load_off_thread(
    host: &Arc<PolicyHost>,
    bytes: Vec<u8>,
    source: String,
) -> Result<LoadedModule, String> {
    let host = host.clone();
    tokio::task::spawn_blocking(move || host.load(&bytes, &source, true).map_err(|e| e.to_string()))
        .await
        .map_err(|e| format!("loading panicked: {e}"))?
}

impl Reloader {
    /// The `.wasm` files of the directory with their size and modification time.
    fn scan(&self) -> Snapshot {
        let Some(dir) = &self.dir else {
            return Snapshot::new();
        };
        let Ok(entries) = std::fs::read_dir(dir) else {
            return Snapshot::new();
        };
        entries
            .filter_map(Result::ok)
            .filter(|e| {
                let name = e.file_name();
                let name = name.to_string_lossy();
                name.ends_with(".wasm") && !name.starts_with('.')
            })
            .filter_map(|e| {
                let meta = e.metadata().ok().filter(|m| m.is_file())?;
                Some((e.path(), (meta.len(), meta.modified().ok())))
            })
            .collect()
    }

    /// Reloads once the directory changed and then held still for `debounce`.
    async fn watch(&mut self, debounce: Duration) {
        let snapshot = self.scan();
        if snapshot != self.snapshot {
            self.snapshot = snapshot;
            self.changed_at = Some(Instant::now());
        } else if self.changed_at.is_some_and(|at| at.elapsed() >= debounce) {
            self.changed_at = None;
            // Refusals are logged and kept in the status.
            let _ = self.reload_dir().await;
        }
    }

    /// Reads every file of the directory, loads those whose content changed, and swaps
    /// in the resulting set. Returns a one-line summary; an error when a new file was
    /// refused (what it would have replaced stays live).
    async fn reload_dir(&mut self) -> Result<String, String> {
        self.sync_store().await;
        let snapshot = self.scan();
        self.files.retain(|path, _| snapshot.contains_key(path));
        let mut loaded = Vec::new();
        let mut refused = Vec::new();
        for path in snapshot.keys() {
            // One byte over the limit is enough for the loader to refuse it as too big.
            let bytes = match read_limited(path, self.host.max_module_bytes()) {
                Ok(bytes) => bytes,
                Err(e) => {
                    warn!(self.log, "policy file unreadable"; "file" => %path.display(), "error" => &e);
                    continue;
                }
            };
            let sha256 = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(&bytes));
            if self.files.get(path).is_some_and(|f| f.sha256 == sha256) {
                continue;
            }
            let name = super::module::read_metadata(&bytes).ok().flatten().map(|m| m.name);
            let source = path.display().to_string();
            let previous = self.files.remove(path).and_then(|f| f.loaded);
            let entry = match load_off_thread(&self.host, bytes, source.clone()).await {
                Ok(module) => {
                    info!(self.log, "policy module loaded"; "module" => module.label(), "sha256" => module.short_hash(),
                          "file" => &source, "compile_ms" => module.compile_ms);
                    loaded.push(module.label());
                    FileEntry { sha256, name, loaded: Some(Arc::new(module)), error: None }
                }
                Err(error) => {
                    warn!(self.log, "policy module refused; the live version stays"; "file" => &source,
                          "sha256" => &sha256[..12], "error" => &error);
                    refused.push(format!("{source}: {error}"));
                    let error = Some(Refusal { source, sha256: sha256.clone(), error, at: now_ms() });
                    FileEntry { sha256, name, loaded: previous, error }
                }
            };
            self.files.insert(path.clone(), entry);
        }
        self.unpin_changed();
        let generation = self.swap();
        self.last_reload_at = Some(now_ms());
        self.publish();
        let mut summary = format!("generation {generation}");
        if !loaded.is_empty() {
            summary.push_str(&format!("; loaded {}", loaded.join(", ")));
        }
        if !refused.is_empty() {
            summary.push_str(&format!("; refused {}", refused.join("; ")));
            return Err(summary);
        }
        Ok(summary)
    }

    /// Loads what changed in the store; a name whose stored module changed is no
    /// longer pinned by a rollback.
    async fn sync_store(&mut self) -> bool {
        self.last_sync = Instant::now();
        let Some(stored) = self.stored.as_mut() else {
            return false;
        };
        match stored.sync(&self.host, &self.log).await {
            Ok(changed) => {
                changed.iter().for_each(|name| _ = self.pinned.remove(name));
                !changed.is_empty()
            }
            Err(e) => {
                warn!(self.log, "reading the stored policy modules failed"; "error" => e);
                false
            }
        }
    }

    /// Swaps in what changed in the store since the last look.
    async fn follow_store(&mut self) {
        if self.sync_store().await {
            self.swap();
            self.last_reload_at = Some(now_ms());
            self.publish();
        }
    }

    /// Drops the pin of every name whose directory file changed since the rollback
    /// and now loads.
    fn unpin_changed(&mut self) {
        let files = &self.files;
        self.pinned.retain(|name, pin| {
            let current = files
                .values()
                .filter(|f| f.name.as_deref() == Some(name.as_str()))
                .filter(|f| f.loaded.as_ref().is_some_and(|m| m.sha256 == f.sha256))
                .map(|f| f.sha256.clone())
                .next_back();
            match current {
                Some(sha) => pin.dir_sha256.as_deref() == Some(sha.as_str()),
                None => true,
            }
        });
    }

    /// The set the sources give: bundled, then the directory (replacing by name), then
    /// pins; bundled names keep their place, added modules follow by name. Beside it,
    /// the store's shadows, canaries and scoped installs.
    fn compose(&self) -> (Vec<Arc<LoadedModule>>, Vec<Variant>) {
        let mut by_name: BTreeMap<String, (usize, Arc<LoadedModule>)> = BTreeMap::new();
        for (rank, module) in self.bundled.iter().enumerate() {
            by_name.insert(module.metadata.name.clone(), (rank, module.clone()));
        }
        for entry in self.files.values() {
            if let Some(module) = &entry.loaded {
                let rank = by_name.get(&module.metadata.name).map_or(usize::MAX, |(r, _)| *r);
                by_name.insert(module.metadata.name.clone(), (rank, module.clone()));
            }
        }
        for module in self.stored.iter().flat_map(|s| s.modules()) {
            let rank = by_name.get(&module.metadata.name).map_or(usize::MAX, |(r, _)| *r);
            by_name.insert(module.metadata.name.clone(), (rank, module.clone()));
        }
        for (name, pin) in &self.pinned {
            let rank = by_name.get(name).map_or(usize::MAX, |(r, _)| *r);
            by_name.insert(name.clone(), (rank, pin.module.clone()));
        }
        let mut modules: Vec<(usize, String, Arc<LoadedModule>)> =
            by_name.into_iter().map(|(name, (rank, m))| (rank, name, m)).collect();
        modules.sort_by(|a, b| (a.0, &a.1).cmp(&(b.0, &b.1)));
        let variants = self.stored.as_ref().map(|s| s.variants()).unwrap_or_default();
        (modules.into_iter().map(|(_, _, m)| m).collect(), variants)
    }

    /// Installs the composed set if it differs from the live one; remembers each
    /// replaced module as its name's previous version.
    fn swap(&mut self) -> u64 {
        let (next, variants) = self.compose();
        let live = self.host.current();
        let same = live.modules.len() == next.len()
            && live.modules.iter().zip(&next).all(|(a, b)| a.sha256 == b.sha256 && a.source == b.source)
            && live.variants.len() == variants.len()
            && live.variants.iter().zip(&variants).all(|(a, b)| {
                a.module.sha256 == b.module.sha256 && a.module.source == b.module.source && a.rollout == b.rollout
            });
        if same {
            return live.generation;
        }
        for old in &live.modules {
            let replaced = next.iter().any(|m| m.metadata.name == old.metadata.name && m.sha256 != old.sha256);
            if replaced {
                self.previous.insert(old.metadata.name.clone(), old.clone());
            }
        }
        let labels: Vec<String> = next
            .iter()
            .map(|m| format!("{} ({})", m.label(), m.short_hash()))
            .chain(variants.iter().map(|v| {
                format!(
                    "{} ({}, {}, {})",
                    v.module.label(),
                    v.module.short_hash(),
                    v.rollout.mode_label(),
                    v.rollout.scope_label()
                )
            }))
            .collect();
        // A shadow's counters exist at 0 from the moment it runs, so a rate has a start.
        for v in variants.iter().filter(|v| v.rollout.mode == crate::store::RolloutMode::Shadow) {
            for change in crate::metrics::SHADOW_CHANGES {
                crate::metrics::get().policy_shadow_changes.with_label_values(&[&v.module.metadata.name, change]);
            }
        }
        let generation = self.host.install_with(next, variants);
        info!(self.log, "policy set swapped"; "generation" => generation, "modules" => labels.join(", "));
        generation
    }

    fn rollback(&mut self, name: &str) -> Result<String, String> {
        let live = self.host.current();
        let current = live
            .modules
            .iter()
            .find(|m| m.metadata.name == name)
            .cloned()
            .ok_or_else(|| format!("no live module is named {name:?}"))?;
        let previous = self
            .previous
            .get(name)
            .cloned()
            .ok_or_else(|| format!("no previous version of {name:?} is kept (it was never replaced)"))?;
        let dir_sha256 =
            self.files.values().filter(|f| f.name.as_deref() == Some(name)).map(|f| f.sha256.clone()).next_back();
        self.pinned.insert(name.to_string(), Pin { module: previous.clone(), dir_sha256 });
        let generation = self.swap();
        self.previous.insert(name.to_string(), current.clone());
        self.last_reload_at = Some(now_ms());
        self.publish();
        let message = format!(
            "{name}: {} ({}) is live again instead of {} ({}); generation {generation}",
            previous.metadata.version,
            previous.short_hash(),
            current.metadata.version,
            current.short_hash()
        );
        info!(self.log, "policy rolled back"; "module" => name, "now" => previous.label(), "was" => current.label());
        Ok(message)
    }

    /// Updates the status `policy list` and the control handle show.
    fn publish(&mut self) {
        self.unreported = true;
        let live = self.host.current();
        let status = |m: &LoadedModule, rollout: Option<&Rollout>| ModuleStatus {
            name: m.metadata.name.clone(),
            version: m.metadata.version.clone(),
            sha256: m.sha256.clone(),
            stages: m.stages.iter().map(|s| s.as_str().to_string()).collect(),
            interface: m.interface().to_string(),
            source: m.source.clone(),
            size: m.size,
            fixtures: m.metadata.fixtures.len(),
            previous: match rollout {
                None => {
                    self.previous.get(&m.metadata.name).map(|p| format!("{} ({})", p.metadata.version, p.short_hash()))
                }
                Some(_) => None,
            },
            pinned: rollout.is_none() && self.pinned.contains_key(&m.metadata.name),
            mode: rollout.map_or_else(|| "live".to_string(), Rollout::mode_label),
            customers: rollout.map(|r| r.customers.clone()).unwrap_or_default(),
            plans: rollout.map(|r| r.plans.clone()).unwrap_or_default(),
        };
        let modules = live
            .modules
            .iter()
            .map(|m| status(m, None))
            .chain(live.variants.iter().map(|v| status(&v.module, Some(&v.rollout))))
            .collect();
        let stored = self.stored.iter().flat_map(|s| s.refusals()).cloned();
        let refused = self.files.values().filter_map(|f| f.error.clone()).chain(stored).collect();
        let mut status = self.status.lock().unwrap_or_else(|p| p.into_inner());
        *status = HostStatus {
            generation: live.generation,
            modules,
            refused,
            last_reload_at: self.last_reload_at,
            last_command: self.last_command.clone(),
        };
    }

    /// Carries out `policy reload` and `policy rollback` commands from the store.
    async fn run_commands(&mut self, p: &mut Presence) {
        let commands = match p.store.policy_commands_after(p.command_seen).await {
            Ok(commands) => commands,
            Err(e) => {
                warn!(self.log, "reading policy commands failed"; "error" => %e);
                return;
            }
        };
        for (id, command, name) in commands {
            let result = match (command.as_str(), name) {
                ("reload", _) => self.reload_dir().await,
                ("rollback", Some(name)) => self.rollback(&name),
                (other, _) => Err(format!("unknown policy command {other:?}")),
            };
            let (ok, message) = match result {
                Ok(m) => (true, m),
                Err(m) => (false, m),
            };
            info!(self.log, "policy command"; "id" => id, "command" => &command, "ok" => ok, "result" => &message);
            self.last_command = Some(CommandResult { id, command, ok, message });
            p.command_seen = id;
        }
        self.publish();
    }

    /// Writes this gateway's status row.
    async fn report(&self, p: &Presence) {
        let status = self.status.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let json = serde_json::to_string(&status).unwrap_or_default();
        let row = crate::store::PolicyGateway {
            gateway_id: p.gateway_id.clone(),
            host: p.host_name.clone(),
            pid: std::process::id() as i64,
            started_at: p.started_at,
            heartbeat_at: now_ms(),
            command_seen: p.command_seen,
            status: json,
        };
        if let Err(e) = p.store.put_policy_gateway(&row).await {
            warn!(self.log, "writing the policy status failed"; "error" => %e);
        }
    }
}

/// Reads at most `max` bytes of a file (one more shows it is too big).
fn read_limited(path: &Path, max: usize) -> Result<Vec<u8>, String> {
    use std::io::Read;
    let file = std::fs::File::open(path).map_err(|e| e.to_string())?;
    let mut bytes = Vec::new();
    file.take((max as u64).saturating_add(1)).read_to_end(&mut bytes).map_err(|e| e.to_string())?;
    Ok(bytes)
}

fn host_name() -> String {
    std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok())
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "unknown".into())
}

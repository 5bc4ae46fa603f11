//! The store as a source of policy modules (see `store::modules`): which modules it
//! holds, loaded in this replica's sandbox. The reload task asks it to `sync` about
//! once a second and after every reload command, so a module installed from any
//! machine is live on every replica within a few seconds.

use super::host::PolicyHost;
use super::module::LoadedModule;
use super::reload::{Refusal, load_off_thread};
use crate::store::{Store, now_ms};
use slog::{Logger, info, warn};
use std::collections::BTreeMap;
use std::sync::Arc;

/// A stored module as this replica last saw it.
struct Entry {
    id: i64,
    /// What loaded (the previous row's module stays when a new row is refused here).
    loaded: Option<Arc<LoadedModule>>,
    error: Option<Refusal>,
}

/// The store's modules, by name.
pub(super) struct StoredSource {
    store: Store,
    entries: BTreeMap<String, Entry>,
}

impl StoredSource {
    pub(super) fn new(store: Store) -> Self {
        StoredSource { store, entries: BTreeMap::new() }
    }

    /// Reads which modules the store holds and loads the rows this replica has not.
    /// Returns the names whose module changed (or `Err` when the store did not answer:
    /// what is loaded stays).
    pub(super) async fn sync(&mut self, host: &Arc<PolicyHost>, log: &Logger) -> Result<Vec<String>, String> {
        let live = self.store.live_policy_modules().await.map_err(|e| e.to_string())?;
        let mut changed: Vec<String> =
            self.entries.keys().filter(|name| !live.iter().any(|m| &m.name == *name)).cloned().collect();
        self.entries.retain(|name, _| !changed.contains(name));
        for row in live {
            if self.entries.get(&row.name).is_some_and(|e| e.id == row.id) {
                continue;
            }
            let source = format!("store #{} ({})", row.id, row.installed_by);
            let previous = self.entries.remove(&row.name).and_then(|e| e.loaded);
            let loaded = match self.store.policy_module_bytes(row.id).await {
                Ok(bytes) => load_off_thread(host, bytes, source.clone()).await,
                Err(e) => Err(e.to_string()),
            };
            let entry = match loaded {
                Ok(module) if module.sha256 == row.sha256 => {
                    info!(log, "policy module loaded from the store"; "module" => module.label(),
                          "sha256" => module.short_hash(), "id" => row.id);
                    Entry { id: row.id, loaded: Some(Arc::new(module)), error: None }
                }
                outcome => {
                    let error = match outcome {
                        Ok(_) => "the stored bytes do not match the recorded hash".to_string(),
                        Err(e) => e,
                    };
                    warn!(log, "stored policy module refused; the live version stays"; "id" => row.id,
                          "module" => &row.name, "error" => &error);
                    let refusal = Refusal { source, sha256: row.sha256.clone(), error, at: now_ms() };
                    Entry { id: row.id, loaded: previous, error: Some(refusal) }
                }
            };
            self.entries.insert(row.name.clone(), entry);
            changed.push(row.name);
        }
        Ok(changed)
    }

    /// The modules that loaded, by name.
    pub(super) fn modules(&self) -> impl Iterator<Item = &Arc<LoadedModule>> {
        self.entries.values().filter_map(|e| e.loaded.as_ref())
    }

    /// Rows this replica refused.
    pub(super) fn refusals(&self) -> impl Iterator<Item = &Refusal> {
        self.entries.values().filter_map(|e| e.error.as_ref())
    }
}

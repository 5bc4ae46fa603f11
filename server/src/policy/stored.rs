//! The store as a source of policy modules (see `store::modules`): which modules it
//! runs (live, shadow, canary, scoped), loaded in this replica's sandbox. The reload
//! task asks it to `sync` about once a second and after every reload command, so a
//! module installed from any machine runs on every replica within a few seconds.

use super::host::PolicyHost;
use super::module::LoadedModule;
use super::reload::{Refusal, load_off_thread};
use super::rollout::Variant;
use crate::store::{Rollout, Store, StoredModule, now_ms};
use slog::{Logger, info, warn};
use std::collections::BTreeMap;
use std::sync::Arc;

/// A stored module as this replica last saw it.
struct Entry {
    id: i64,
    rollout: Rollout,
    /// What loaded (the previous row's module stays when a new row is refused here).
    loaded: Option<Arc<LoadedModule>>,
    error: Option<Refusal>,
}

/// Where a stored row runs: its name's live module, its name's trial (shadow or
/// canary), or its name for one scope. A new row replaces the row of its slot.
type Slot = (String, String);

fn slot(row: &StoredModule) -> Slot {
    let kind = if row.rollout.is_trial() {
        "trial".to_string()
    } else if row.rollout.is_scoped() {
        format!("scope {}|{}", row.rollout.customers.join(","), row.rollout.plans.join(","))
    } else {
        "live".to_string()
    };
    (row.name.clone(), kind)
}

/// The store's modules, by slot.
pub(super) struct StoredSource {
    store: Store,
    entries: BTreeMap<Slot, Entry>,
}

impl StoredSource {
    pub(super) fn new(store: Store) -> Self {
        StoredSource { store, entries: BTreeMap::new() }
    }

    /// Reads which modules the store runs and loads the rows this replica has not.
    /// Returns the names whose modules changed (or `Err` when the store did not answer:
    /// what is loaded stays).
    pub(super) async fn sync(&mut self, host: &Arc<PolicyHost>, log: &Logger) -> Result<Vec<String>, String> {
        let rows = self.store.live_policy_modules().await.map_err(|e| e.to_string())?;
        let slots: Vec<Slot> = rows.iter().map(slot).collect();
        let mut changed: Vec<String> =
            self.entries.keys().filter(|s| !slots.contains(s)).map(|(name, _)| name.clone()).collect();
        self.entries.retain(|s, _| slots.contains(s));
        for (row, at) in rows.into_iter().zip(slots) {
            if self.entries.get(&at).is_some_and(|e| e.id == row.id) {
                continue;
            }
            let source = format!("store #{} ({})", row.id, row.installed_by);
            let previous = self.entries.remove(&at).and_then(|e| e.loaded);
            let loaded = match self.store.policy_module_bytes(row.id).await {
                Ok(bytes) => load_off_thread(host, bytes, source.clone()).await,
                Err(e) => Err(e.to_string()),
            };
            let entry = match loaded {
                Ok(module) if module.sha256 == row.sha256 => {
                    info!(log, "policy module loaded from the store"; "module" => module.label(),
                          "sha256" => module.short_hash(), "id" => row.id, "mode" => row.rollout.mode_label(),
                          "scope" => row.rollout.scope_label());
                    Entry { id: row.id, rollout: row.rollout, loaded: Some(Arc::new(module)), error: None }
                }
                outcome => {
                    let error = match outcome {
                        Ok(_) => "the stored bytes do not match the recorded hash".to_string(),
                        Err(e) => e,
                    };
                    warn!(log, "stored policy module refused; the live version stays"; "id" => row.id,
                          "module" => &row.name, "error" => &error);
                    let refusal = Refusal { source, sha256: row.sha256.clone(), error, at: now_ms() };
                    Entry { id: row.id, rollout: row.rollout, loaded: previous, error: Some(refusal) }
                }
            };
            self.entries.insert(at, entry);
            changed.push(row.name);
        }
        Ok(changed)
    }

    /// The live modules for everyone that loaded, by name.
    pub(super) fn modules(&self) -> impl Iterator<Item = &Arc<LoadedModule>> {
        self.entries.iter().filter(|((_, kind), _)| kind == "live").filter_map(|(_, e)| e.loaded.as_ref())
    }

    /// The shadows, canaries and scoped installs that loaded, oldest row first.
    pub(super) fn variants(&self) -> Vec<Variant> {
        let mut variants: Vec<(i64, Variant)> = self
            .entries
            .iter()
            .filter(|((_, kind), _)| kind != "live")
            .filter_map(|(_, e)| {
                e.loaded.as_ref().map(|m| (e.id, Variant { module: m.clone(), rollout: e.rollout.clone() }))
            })
            .collect();
        variants.sort_by_key(|(id, _)| *id);
        variants.into_iter().map(|(_, v)| v).collect()
    }

    /// Rows this replica refused.
    pub(super) fn refusals(&self) -> impl Iterator<Item = &Refusal> {
        self.entries.values().filter_map(|e| e.error.as_ref())
    }
}

//! The send path's lookups that rarely change, held in memory per replica: API keys by
//! hash (known and unknown), the id of a customer's instance by the id or name a
//! request gave, and PBX integrations by id. An unkeyed send skips the API-key read,
//! and its one query reads the customer and instance by primary key; a PBX event
//! skips the integration's read, and its admission write checks that the integration
//! is still as it was used (`store::pbx::admit`).
//!
//! The cache saves lookups; it never decides. The send's query reads the customer, the
//! instance and the API key's revocation as stored now, so an action that stops
//! sending (a revoked key, a paused instance, a plan or module change) holds for the
//! first request that starts after it returns, on every replica (see
//! `Store::send_context`). A stale entry can only cost a lookup again.
//!
//! Staleness is bounded twice. Every change to `api_keys`, `customers` or `instances`,
//! by any process, is announced by a trigger (PostgreSQL `NOTIFY gateway_cache`; on
//! SQLite a row of `cache_changes`), and `invalidation` evicts what it names, usually
//! within milliseconds. And no entry is used after `TTL`, so a change is seen by every
//! replica within `TTL` even when an announcement is lost (a listener reconnecting
//! also clears everything). A read that raced an eviction does not put its possibly
//! older answer back (the generation check).

use super::keys::ApiKeyRecord;
use super::pbx::PbxIntegration;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The longest an entry is used.
pub const TTL: Duration = Duration::from_millis(1_500);

/// Entries kept per map; a map that would grow past it is emptied (a flood of unknown
/// keys costs reads, not memory).
const MAX_ENTRIES: usize = 50_000;

/// (customer id, instance id or name as the request gave it).
type ContextKey = (String, String);

struct Entry<T> {
    value: T,
    at: Instant,
}

/// What the cache holds.
#[derive(Default)]
pub(crate) struct Cache {
    keys: Mutex<HashMap<String, Entry<Option<ApiKeyRecord>>>>,
    /// Instance ids by (customer, id or name as the request gave it).
    contexts: Mutex<HashMap<ContextKey, Entry<String>>>,
    /// PBX integrations by id, as last read (only found ones: an unknown id is read).
    integrations: Mutex<HashMap<i64, Entry<Arc<PbxIntegration>>>>,
    /// Bumped by every eviction; a read inserts only if it did not move meanwhile.
    generation: AtomicU64,
}

fn fresh<T: Clone>(entry: Option<&Entry<T>>) -> Option<T> {
    entry.filter(|e| e.at.elapsed() < TTL).map(|e| e.value.clone())
}

fn put<K: std::hash::Hash + Eq, T>(map: &mut HashMap<K, Entry<T>>, key: K, value: T) {
    if map.len() >= MAX_ENTRIES {
        map.clear();
    }
    map.insert(key, Entry { value, at: Instant::now() });
}

impl Cache {
    /// The generation a read starts at.
    pub(crate) fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// The key with this hash (`Some(None)`: known not to exist), if fresh.
    pub(crate) fn key(&self, hash: &str) -> Option<Option<ApiKeyRecord>> {
        fresh(self.keys.lock().unwrap_or_else(|p| p.into_inner()).get(hash))
    }

    pub(crate) fn put_key(&self, hash: &str, record: Option<ApiKeyRecord>, read_at: u64) {
        let mut keys = self.keys.lock().unwrap_or_else(|p| p.into_inner());
        if self.generation() == read_at {
            put(&mut keys, hash.to_string(), record);
        }
    }

    /// The id of the customer's instance of this id or name, if fresh.
    pub(crate) fn instance_id(&self, customer_id: &str, instance_ref: &str) -> Option<String> {
        let contexts = self.contexts.lock().unwrap_or_else(|p| p.into_inner());
        fresh(contexts.get(&(customer_id.to_string(), instance_ref.to_string())))
    }

    pub(crate) fn put_instance_id(&self, customer_id: &str, instance_ref: &str, id: &str, read_at: u64) {
        let mut contexts = self.contexts.lock().unwrap_or_else(|p| p.into_inner());
        if self.generation() == read_at {
            put(&mut contexts, (customer_id.to_string(), instance_ref.to_string()), id.to_string());
        }
    }

    /// The PBX integration `id`, if fresh.
    pub(crate) fn integration(&self, id: i64) -> Option<Arc<PbxIntegration>> {
        fresh(self.integrations.lock().unwrap_or_else(|p| p.into_inner()).get(&id))
    }

    /// Keeps an integration as read; a stale one is only ever a read again, since the
    /// admission write checks what was used and a refusal is read again.
    pub(crate) fn put_integration(&self, integration: Arc<PbxIntegration>) {
        let mut integrations = self.integrations.lock().unwrap_or_else(|p| p.into_inner());
        put(&mut integrations, integration.id, integration);
    }

    /// Forgets the integration `id`.
    pub(crate) fn forget_integration(&self, id: i64) {
        self.integrations.lock().unwrap_or_else(|p| p.into_inner()).remove(&id);
    }

    /// Forgets what a change announces: `api_keys` (by key hash), `customers` (by id)
    /// or `instances` (by customer id); anything else forgets everything.
    pub(crate) fn evict(&self, table: &str, key: &str) {
        let mut keys = self.keys.lock().unwrap_or_else(|p| p.into_inner());
        let mut contexts = self.contexts.lock().unwrap_or_else(|p| p.into_inner());
        self.generation.fetch_add(1, Ordering::AcqRel);
        match table {
            "api_keys" => {
                keys.remove(key);
            }
            "customers" | "instances" => {
                contexts.retain(|(customer, _), _| customer != key);
                let mut integrations = self.integrations.lock().unwrap_or_else(|p| p.into_inner());
                integrations.retain(|_, e| e.value.customer_id != key);
            }
            _ => {
                keys.clear();
                contexts.clear();
                self.integrations.lock().unwrap_or_else(|p| p.into_inner()).clear();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(id: &str) -> ApiKeyRecord {
        ApiKeyRecord {
            id: id.into(),
            customer_id: "cus_1".into(),
            name: "k".into(),
            prefix: "gw_live_ab".into(),
            created_at: 0,
            revoked_at: None,
            last_used_at: None,
        }
    }

    #[test]
    fn an_eviction_wins_over_a_read_that_started_before_it() {
        let cache = Cache::default();
        let before = cache.generation();
        cache.evict("api_keys", "h1");
        cache.put_key("h1", Some(record("key_1")), before);
        assert!(cache.key("h1").is_none(), "the older read is not kept");
        let now = cache.generation();
        cache.put_key("h1", Some(record("key_1")), now);
        assert_eq!(cache.key("h1").unwrap().unwrap().id, "key_1");
        cache.evict("api_keys", "h1");
        assert!(cache.key("h1").is_none());
        cache.put_key("h2", None, cache.generation());
        assert_eq!(cache.key("h2").map(|k| k.is_none()), Some(true), "an unknown key is remembered as unknown");
        cache.evict("*", "");
        assert!(cache.key("h2").is_none());
    }
}

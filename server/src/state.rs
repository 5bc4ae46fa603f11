//! The state every handler shares, the public API's and the dashboard's alike: the
//! store, the send pipeline, the configuration, the dashboard's own state and the policy
//! host's control. It lives here, not in `http` or `dashboard`, so neither imports the
//! other for it.

use crate::config::Config;
use crate::send::Sender;
use crate::store::{Store, now_ms};
use slog::{Logger, error};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// How often `last_used_at` of a key is written at most.
const KEY_TOUCH_INTERVAL_MS: i64 = 60_000;

/// State shared by every handler.
pub struct AppState {
    pub store: Store,
    pub sender: Sender,
    pub config: Arc<Config>,
    /// The dashboard's own state (see `crate::dashboard`).
    pub dashboard: crate::dashboard::DashState,
    /// The policy host's control, when this gateway runs one (the operator console's
    /// policy pages check uploaded modules with it).
    pub policies: Option<crate::policy::reload::PolicyControl>,
    /// When each key's `last_used_at` was last written.
    key_touched: Mutex<HashMap<String, i64>>,
    /// The operator's proxies, behind which `X-Forwarded-For` names the client.
    trusted_proxies: Vec<ipnet::IpNet>,
}

impl AppState {
    /// State over a store and a pipeline.
    pub fn new(store: Store, sender: Sender, config: Arc<Config>) -> Self {
        AppState {
            dashboard: crate::dashboard::DashState::new(&config),
            trusted_proxies: crate::net::client_addr::parse_trusted(&config.trusted_proxies).unwrap_or_default(),
            store,
            sender,
            config,
            policies: None,
            key_touched: Mutex::new(HashMap::new()),
        }
    }

    /// The client's address: the connection's `peer`, or behind the operator's trusted
    /// proxies the nearest untrusted hop of `X-Forwarded-For` (`net::client_addr`).
    pub fn client_ip(&self, peer: std::net::IpAddr, headers: &http::HeaderMap) -> std::net::IpAddr {
        let forwarded = headers.get_all("x-forwarded-for");
        crate::net::client_addr::client_ip(
            peer,
            forwarded.iter().filter_map(|v| v.to_str().ok()),
            &self.trusted_proxies,
        )
    }

    /// Writes `last_used_at` at most once a minute per key, off the request path.
    pub fn touch_key(self: &Arc<Self>, key_id: &str, log: &Logger) {
        let now = now_ms();
        {
            let mut touched = self.key_touched.lock().unwrap_or_else(|p| p.into_inner());
            if touched.get(key_id).is_some_and(|at| now - at < KEY_TOUCH_INTERVAL_MS) {
                return;
            }
            touched.insert(key_id.to_string(), now);
        }
        let (state, key_id, log) = (self.clone(), key_id.to_string(), log.clone());
        tokio::spawn(async move {
            if let Err(e) = state.store.touch_api_key(&key_id, now).await {
                error!(log, "recording API key use failed"; "key_id" => key_id, "error" => %e);
            }
        });
    }
}

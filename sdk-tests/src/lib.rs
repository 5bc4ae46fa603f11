//! Test harness: a real gateway on `127.0.0.1:0` with its own store, a tenant, and a
//! `gateway_client::Client` for it.
//!
//! The store is a SQLite file in a per-test temp dir, or, when
//! `GATEWAY_TEST_DATABASE_URL` names a PostgreSQL server, a fresh database created for
//! the test on it and dropped afterwards, so tests never see each other's rows.

use gateway_server::config::Config;
use gateway_server::store::{LimitOverrides, Store};
use gateway_server::{Parts, RunningServer, ops, start_server_with};
use sqlx::{Connection, Executor};
use std::sync::Arc;

pub use gateway_client;

pub mod browser;
pub mod dashboard;
pub mod fake_evolution;
pub mod receiver;
pub mod tls;
pub mod wasm;

/// A tenant of the test gateway.
#[derive(Clone, Debug)]
pub struct Tenant {
    pub customer_id: String,
    pub instance_id: String,
    pub instance_name: String,
    pub api_key: String,
    pub api_key_id: String,
}

/// One running gateway for one test.
pub struct TestContext {
    pub server: RunningServer,
    pub config: Config,
    pub base_url: String,
    /// The default tenant: Starter plan, connected instance `main`, one key.
    pub tenant: Tenant,
    pub client: gateway_client::Client,
    pub http: reqwest::Client,
    postgres: Option<(String, String)>,
    _dir: tempfile::TempDir,
}

impl TestContext {
    /// A gateway with the default configuration (provider timeout 300 ms).
    pub async fn new(name: &str) -> TestContext {
        TestContext::with(name, |_| {}, None).await
    }

    /// A gateway with a changed configuration and, optionally, other parts.
    pub async fn with(name: &str, change: impl FnOnce(&mut Config), parts: Option<Parts>) -> TestContext {
        // The daily quotas and counters are windows of the UTC day, which tests read and
        // fill with one day in mind: none starts in the last two minutes of a day.
        room_in_the_window(86_400_000, 120_000).await;
        let dir = tempfile::Builder::new().prefix(&format!("gw-{name}-")).tempdir().expect("temp dir");
        let mut config = Config {
            listen: "127.0.0.1:0".parse().unwrap(),
            provider_timeout_ms: 300,
            // Tests that count events turn the simulator's status reports on themselves.
            simulator_status_delay_ms: 0,
            log_file: Some(dir.path().join("gateway.log").display().to_string()),
            log_level: "debug".into(),
            ..Config::default()
        };
        // Compiled policy modules are cached across tests (debug builds compile slowly).
        config.policies.cache_dir = std::env::temp_dir().join("gateway-test-wasm-cache").display().to_string();
        let postgres = match std::env::var("GATEWAY_TEST_DATABASE_URL") {
            Ok(admin) if !admin.is_empty() => {
                let db = format!(
                    "gw_{}_{}",
                    name.replace(|c: char| !c.is_ascii_alphanumeric(), "_"),
                    &uuid::Uuid::new_v4().simple().to_string()[..8]
                )
                .to_ascii_lowercase();
                sqlx::any::install_default_drivers();
                let mut conn =
                    sqlx::AnyConnection::connect(&admin).await.expect("connect to GATEWAY_TEST_DATABASE_URL");
                conn.execute(format!("CREATE DATABASE {db}").as_str()).await.expect("create test database");
                conn.close().await.ok();
                config.database_url = replace_database(&admin, &db);
                Some((admin, db))
            }
            _ => {
                config.database_url = format!("sqlite://{}?mode=rwc", dir.path().join("gateway.db").display());
                None
            }
        };
        change(&mut config);
        let log = gateway_server::make_logger(&config).expect("logger");
        let parts = match parts {
            Some(parts) => parts,
            None => Parts::from_config(&config).expect("parts"),
        };
        let server = start_server_with(log, &config, parts).await.expect("gateway starts");
        let scheme = if config.tls.files().is_some() { "https" } else { "http" };
        let base_url = format!("{scheme}://{}", server.local_addr());
        // Providers reach this gateway at its real port (the configured one is 0).
        if config.public_url.is_none() {
            config.public_url = Some(base_url.clone());
        }
        let tenant = create_tenant(server.store(), &config, "Test customer", Some("starter")).await;
        let client = gateway_client::Client::with_api_key(&base_url, &tenant.api_key);
        TestContext { server, config, base_url, tenant, client, http: reqwest::Client::new(), postgres, _dir: dir }
    }

    /// The store of the running gateway.
    pub fn store(&self) -> &Store {
        self.server.store()
    }

    /// A client for another key.
    pub fn client_with_key(&self, key: &str) -> gateway_client::Client {
        gateway_client::Client::with_api_key(&self.base_url, key)
    }

    /// Raises velocity limits out of the way of a test about something else.
    pub async fn lift_velocity(&self, customer_id: &str) {
        let limits = LimitOverrides {
            instance_per_minute: Some(1_000_000),
            recipient_per_minute: Some(1_000_000),
            ..LimitOverrides::default()
        };
        ops::set_limits(self.store(), customer_id, &limits).await.expect("set limits");
    }

    /// POSTs raw bytes to send-message with these headers; returns status and JSON body.
    pub async fn raw_send(
        &self,
        body: impl Into<reqwest::Body>,
        headers: &[(&str, &[u8])],
    ) -> (u16, serde_json::Value) {
        let mut request = self.http.post(format!("{}/api/send-message", self.base_url)).body(body);
        for (name, value) in headers {
            request = request.header(*name, reqwest::header::HeaderValue::from_bytes(value).expect("header value"));
        }
        let response = request.send().await.expect("request reaches the gateway");
        let status = response.status().as_u16();
        let text = response.text().await.expect("body");
        let json = serde_json::from_str(&text).unwrap_or_else(|e| panic!("body is not JSON ({e}): {text}"));
        (status, json)
    }

    /// POSTs a JSON value as the default tenant.
    pub async fn send_json(&self, body: &serde_json::Value) -> (u16, serde_json::Value) {
        let auth = format!("Bearer {}", self.tenant.api_key);
        self.raw_send(body.to_string(), &[("authorization", auth.as_bytes()), ("content-type", b"application/json")])
            .await
    }

    /// `send_json` taking its body, for many requests at once.
    pub async fn send_json_owned(&self, body: serde_json::Value) -> (u16, serde_json::Value) {
        self.send_json(&body).await
    }

    /// A second gateway on this context's store, with a policies directory of its own,
    /// as a replica on another machine is.
    pub async fn second_replica(&self, policies_dir: &std::path::Path) -> RunningServer {
        let mut config = self.config.clone();
        config.listen = "127.0.0.1:0".parse().expect("a loopback address");
        config.policies_dir = Some(policies_dir.display().to_string());
        let log = gateway_server::make_logger(&config).expect("a logger");
        gateway_server::start_server(log, &config).await.expect("the second replica starts")
    }

    /// Stops the gateway and drops its PostgreSQL database.
    pub async fn teardown(self) {
        self.server.close().await.expect("clean shutdown");
        if let Some((admin, db)) = self.postgres
            && let Ok(mut conn) = sqlx::AnyConnection::connect(&admin).await
        {
            let _ = conn.execute(format!("DROP DATABASE IF EXISTS {db} WITH (FORCE)").as_str()).await;
        }
    }
}

/// A customer with a connected instance `main` and an API key. The instance's number
/// has been in use for 30 days, so the pacing policy's warm-up of new numbers stays out
/// of tests about other things (tests of the warm-up make a new instance).
pub async fn create_tenant(store: &Store, config: &Config, name: &str, plan: Option<&str>) -> Tenant {
    let customer = ops::create_customer(store, name, plan, true).await.expect("customer");
    let instance = ops::create_instance(store, config, &customer.id, "main", true).await.expect("instance");
    let instance = store.set_instance_age(&instance.id, 30).await.expect("instance age");
    let key = ops::create_key(store, &customer.id, "test").await.expect("key");
    Tenant {
        customer_id: customer.id,
        instance_id: instance.id,
        instance_name: instance.name,
        api_key: key["api_key"].as_str().unwrap().to_string(),
        api_key_id: key["id"].as_str().unwrap().to_string(),
    }
}

/// `postgres://u@h:p/old?x` with the database replaced.
fn replace_database(url: &str, db: &str) -> String {
    let (base, query) = url.split_once('?').map_or((url, None), |(b, q)| (b, Some(q)));
    let scheme_end = base.find("://").map_or(0, |i| i + 3);
    let base = match base[scheme_end..].find('/') {
        Some(i) => &base[..scheme_end + i],
        None => base,
    };
    match query {
        Some(q) => format!("{base}/{db}?{q}"),
        None => format!("{base}/{db}"),
    }
}

/// Parts with this provider and the default policy host.
pub fn parts_with_provider(provider: Arc<dyn gateway_server::provider::Provider>) -> Parts {
    Parts { provider, policy: None }
}

/// Waits, when less than `room_ms` is left of the current window of the UTC clock
/// (`window_ms` long: a minute, a day), until the next window has begun.
async fn room_in_the_window(window_ms: i64, room_ms: i64) {
    let left = window_ms - chrono::Utc::now().timestamp_millis().rem_euclid(window_ms);
    if left < room_ms {
        tokio::time::sleep(std::time::Duration::from_millis(left as u64 + 50)).await;
    }
}

/// Waits, when fewer than `seconds` are left of the current UTC minute, until the next
/// one has begun. A test whose sends must fall in one calendar minute (the per-minute
/// limits) calls it first, so that a minute's end never splits them.
pub async fn room_in_the_minute(seconds: i64) {
    room_in_the_window(60_000, seconds * 1000).await;
}

#[cfg(test)]
mod tests {
    #[tokio::test]
    async fn a_window_is_entered_with_room_left() {
        // Three reads 370 ms apart: without the wait, at least one of them would find less
        // than 700 ms of its second left.
        for _ in 0..3 {
            super::room_in_the_window(1_000, 700).await;
            let left = 1_000 - chrono::Utc::now().timestamp_millis().rem_euclid(1_000);
            assert!(left >= 700, "{left} ms left");
            tokio::time::sleep(std::time::Duration::from_millis(370)).await;
        }
    }

    #[test]
    fn database_is_replaced() {
        assert_eq!(
            super::replace_database("postgres://root@127.0.0.1:5432/test", "x"),
            "postgres://root@127.0.0.1:5432/x"
        );
        assert_eq!(
            super::replace_database("postgres://127.0.0.1/test?sslmode=disable", "x"),
            "postgres://127.0.0.1/x?sslmode=disable"
        );
        assert_eq!(super::replace_database("postgres://127.0.0.1", "x"), "postgres://127.0.0.1/x");
    }
}

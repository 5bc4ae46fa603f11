//! Typed configuration: TOML file (optional) plus `GATEWAY_` environment overrides.
//!
//! Defaults make `gateway serve` work with no file at all: 127.0.0.1:8080, SQLite in the
//! working directory, the simulator provider, 30 sends a minute per instance and 5 per
//! recipient, and the starter and scale plans.
//! The names operators rely on (`GATEWAY_DATABASE_URL`, `GATEWAY_LISTEN`, ...) are
//! top-level keys, so the variable is the key in upper case with the prefix; a nested
//! key is reached with a double underscore (`GATEWAY_LIMITS__INSTANCE_PER_MINUTE`).
//! `server/examples/config.toml` documents every key and a test parses it.
//!
//! This file holds `Config` (the top-level keys), its loading and the environment
//! overrides; each `[section]` has its own file, and `numbers` the range of every number.

mod dashboard;
mod limits;
mod media;
mod numbers;
mod pbx;
mod policies;
mod retention;
mod tls;
mod webhooks;

pub use dashboard::DashboardSettings;
pub use limits::{PLAN_NAMES, PlanLimits, Plans, VelocityLimits};
pub use media::MediaLimits;
pub use pbx::PbxSettings;
pub use policies::PolicySettings;
pub use retention::RetentionSettings;
pub use tls::TlsSettings;
pub use webhooks::WebhookSettings;

use serde::{Deserialize, Deserializer};
use std::{collections::BTreeMap, net::SocketAddr, path::Path, time::Duration};

/// Everything the gateway reads at start.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// `sqlite://PATH?mode=rwc` or `postgres://...`.
    pub database_url: String,
    /// Largest number of pooled database connections (PostgreSQL; SQLite readers).
    pub database_max_connections: u32,
    /// SQLite's `synchronous` setting: `full` (default: an acknowledged send survives
    /// an OS crash or power loss) or `normal` (faster; the last commits before a power
    /// loss may be lost, never corrupted). Ignored on PostgreSQL.
    pub sqlite_synchronous: String,
    /// How long one database operation may take (getting a connection, a write batch,
    /// waiting for a locked SQLite file) before the request is answered 503.
    pub database_timeout_ms: u64,
    /// Address the HTTP server binds.
    pub listen: SocketAddr,
    /// The gateway's own base URL as providers reach it; `http://{listen}` when unset.
    pub public_url: Option<String>,
    /// Address of the Prometheus metrics listener (`GET /metrics`); off when unset.
    /// Never the public listener: bind it where only the scraper reaches it.
    pub metrics_listen: Option<SocketAddr>,
    /// HTTPS on the public listener.
    pub tls: TlsSettings,
    /// Provider for new instances: `simulator` (built in) or `evolution`.
    pub provider: String,
    /// Base URL of the Evolution-compatible provider.
    pub evolution_url: Option<String>,
    /// Global API key of the Evolution-compatible provider.
    pub evolution_api_key: Option<String>,
    /// How long a provider may take to accept a send before it is a failure.
    pub provider_timeout_ms: u64,
    /// How long a connection change must hold before customers are told (flapping
    /// connections do not spam them).
    pub connection_debounce_ms: u64,
    /// The simulator reports a sent message delivered after this long, and read after
    /// twice this (0: it reports nothing).
    pub simulator_status_delay_ms: u64,
    /// A message the provider accepted but never acknowledged as delivered within this
    /// time gets `message.failed` with error `no_delivery_ack`.
    pub delivery_ack_timeout_ms: u64,
    /// Directory of policy modules watched for hot reload; its modules are added to,
    /// or replace by name, the bundled defaults.
    pub policies_dir: Option<String>,
    /// Lets webhook and media URLs point at loopback addresses (development, tests).
    #[serde(deserialize_with = "flexible_bool")]
    pub allow_loopback_targets: bool,
    /// `json` (bunyan JSON lines on stderr) or `pretty` (human-readable on stderr).
    pub log_format: String,
    /// `trace`, `debug`, `info`, `warn`, `error` or `critical`.
    pub log_level: String,
    /// Write logs to this file instead of stderr (JSON).
    pub log_file: Option<String>,
    /// Velocity control.
    pub limits: VelocityLimits,
    /// Plan definitions.
    pub plans: Plans,
    /// Media size caps, in bytes of decoded content.
    pub media: MediaLimits,
    /// PBX webhook defaults (each integration may override the rate and cooldown).
    pub pbx: PbxSettings,
    /// Customer webhook delivery.
    pub webhooks: WebhookSettings,
    /// The policy host: sandbox limits, fail mode, reload and review pause.
    pub policies: PolicySettings,
    /// The dashboard's sign-in: work bounds before authentication.
    pub dashboard: DashboardSettings,
    /// How long rows that grow with traffic are kept.
    pub retention: RetentionSettings,
    /// Load balancers and proxies in front of the gateway (addresses or CIDR networks,
    /// a list or comma-separated): behind them the client is read from
    /// `X-Forwarded-For`. Empty: the connection's peer is the client.
    #[serde(deserialize_with = "list_or_csv")]
    pub trusted_proxies: Vec<String>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            database_url: "sqlite://gateway.db?mode=rwc".to_string(),
            database_max_connections: 8,
            sqlite_synchronous: "full".to_string(),
            database_timeout_ms: 5_000,
            listen: "127.0.0.1:8080".parse().unwrap(),
            public_url: None,
            metrics_listen: None,
            tls: TlsSettings::default(),
            provider: "simulator".to_string(),
            evolution_url: None,
            evolution_api_key: None,
            provider_timeout_ms: 15_000,
            connection_debounce_ms: 10_000,
            delivery_ack_timeout_ms: 120_000,
            simulator_status_delay_ms: 1_000,
            policies_dir: None,
            allow_loopback_targets: false,
            log_format: "json".to_string(),
            log_level: "info".to_string(),
            log_file: None,
            limits: VelocityLimits::default(),
            plans: Plans::default(),
            media: MediaLimits::default(),
            pbx: PbxSettings::default(),
            webhooks: WebhookSettings::default(),
            policies: PolicySettings::default(),
            dashboard: DashboardSettings::default(),
            retention: RetentionSettings::default(),
            trusted_proxies: Vec::new(),
        }
    }
}

/// A configuration that could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("reading {path}: {source}")]
    Read { path: String, source: std::io::Error },
    #[error("parsing {path}: {source}")]
    Parse { path: String, source: toml::de::Error },
    #[error("invalid configuration: {0}")]
    Invalid(String),
}

impl Config {
    /// Reads `file` (if any), then applies `GATEWAY_*` variables from `env`.
    pub fn load(file: Option<&Path>, env: impl IntoIterator<Item = (String, String)>) -> Result<Config, ConfigError> {
        let mut table = match file {
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .map_err(|source| ConfigError::Read { path: path.display().to_string(), source })?;
                text.parse::<toml::Table>()
                    .map_err(|source| ConfigError::Parse { path: path.display().to_string(), source })?
            }
            None => toml::Table::new(),
        };
        let overrides: BTreeMap<String, String> = env
            .into_iter()
            .filter_map(|(k, v)| k.strip_prefix("GATEWAY_").map(|k| (k.to_ascii_lowercase(), v)))
            .filter(|(k, _)| !k.starts_with("test_"))
            .collect();
        for (key, value) in overrides {
            let mut parts: Vec<&str> = key.split("__").collect();
            let leaf = parts.pop().unwrap_or_default();
            let mut at = &mut table;
            for part in parts {
                at = at
                    .entry(part.to_string())
                    .or_insert_with(|| toml::Value::Table(toml::Table::new()))
                    .as_table_mut()
                    .ok_or_else(|| ConfigError::Invalid(format!("GATEWAY_{key}: {part} is not a section")))?;
            }
            at.insert(leaf.to_string(), env_value(&value));
        }
        let config: Config = toml::Value::Table(table)
            .try_into()
            .map_err(|source| ConfigError::Parse { path: "configuration".to_string(), source })?;
        config.validate()?;
        Ok(config)
    }

    /// Parses a TOML text (no environment).
    pub fn from_toml(text: &str) -> Result<Config, ConfigError> {
        let config: Config =
            toml::from_str(text).map_err(|source| ConfigError::Parse { path: "configuration".to_string(), source })?;
        config.validate()?;
        Ok(config)
    }

    fn validate(&self) -> Result<(), ConfigError> {
        if !matches!(self.provider.as_str(), "simulator" | "evolution") {
            return Err(ConfigError::Invalid(format!(
                "provider must be simulator or evolution, not {:?}",
                self.provider
            )));
        }
        if !matches!(self.sqlite_synchronous.as_str(), "full" | "normal") {
            return Err(ConfigError::Invalid(format!(
                "sqlite_synchronous must be full or normal, not {:?}",
                self.sqlite_synchronous
            )));
        }
        let (cert, key) = (&self.tls.cert_file, &self.tls.key_file);
        if cert.as_deref().is_some_and(|c| !c.is_empty()) != key.as_deref().is_some_and(|k| !k.is_empty()) {
            return Err(ConfigError::Invalid("tls: set both cert_file and key_file, or neither".to_string()));
        }
        if self.metrics_listen.is_some_and(|m| m == self.listen) {
            return Err(ConfigError::Invalid("metrics_listen must differ from listen".to_string()));
        }
        if !matches!(self.log_format.as_str(), "json" | "pretty") {
            return Err(ConfigError::Invalid(format!("log_format must be json or pretty, not {:?}", self.log_format)));
        }
        numbers::check(self).map_err(ConfigError::Invalid)?;
        crate::net::client_addr::parse_trusted(&self.trusted_proxies).map_err(ConfigError::Invalid)?;
        let p = &self.policies;
        if !matches!(p.fail_mode.as_str(), "deny" | "review" | "allow") {
            return Err(ConfigError::Invalid(format!(
                "policies.fail_mode must be deny, review or allow, not {:?}",
                p.fail_mode
            )));
        }
        Ok(())
    }

    /// The gateway's base URL as providers reach it: `public_url`, else `http://{listen}`.
    pub fn public_base_url(&self) -> String {
        self.public_url.clone().filter(|u| !u.is_empty()).unwrap_or_else(|| format!("http://{}", self.listen))
    }

    /// The provider timeout as a duration.
    pub fn provider_timeout(&self) -> Duration {
        Duration::from_millis(self.provider_timeout_ms)
    }

    /// The limits of `plan` (`starter` or `scale`).
    pub fn plan(&self, plan: &str) -> Option<&PlanLimits> {
        match plan {
            "starter" => Some(&self.plans.starter),
            "scale" => Some(&self.plans.scale),
            _ => None,
        }
    }
}

/// An environment value as TOML: integers and booleans keep their type, the rest is text.
fn env_value(value: &str) -> toml::Value {
    if let Ok(n) = value.parse::<i64>() {
        return toml::Value::Integer(n);
    }
    if let Ok(x) = value.parse::<f64>() {
        return toml::Value::Float(x);
    }
    // An array in TOML syntax, e.g. GATEWAY_WEBHOOKS__SCHEDULE_MS="[0, 5000]".
    if value.trim_start().starts_with('[')
        && let Ok(mut table) = toml::from_str::<toml::Table>(&format!("v = {value}"))
        && let Some(array) = table.remove("v")
    {
        return array;
    }
    match value {
        "true" => toml::Value::Boolean(true),
        "false" => toml::Value::Boolean(false),
        _ => toml::Value::String(value.to_string()),
    }
}

/// A list of strings, or one string of comma-separated items (as an environment
/// variable gives it).
fn list_or_csv<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum ListOrCsv {
        List(Vec<String>),
        Csv(String),
    }
    Ok(match ListOrCsv::deserialize(d)? {
        ListOrCsv::List(list) => list,
        ListOrCsv::Csv(text) => text.split(',').map(str::trim).filter(|s| !s.is_empty()).map(String::from).collect(),
    })
}

/// `true`/`false`, `1`/`0`, or those as text.
fn flexible_bool<'de, D: Deserializer<'de>>(d: D) -> Result<bool, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Flexible {
        Bool(bool),
        Int(i64),
        Text(String),
    }
    match Flexible::deserialize(d)? {
        Flexible::Bool(b) => Ok(b),
        Flexible::Int(n) => Ok(n != 0),
        Flexible::Text(s) => match s.as_str() {
            "1" | "true" | "yes" | "on" => Ok(true),
            "0" | "false" | "no" | "off" | "" => Ok(false),
            other => Err(serde::de::Error::custom(format!("not a boolean: {other:?}"))),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn example_config_parses_and_documents_every_key() {
        let text = include_str!("../../examples/config.toml");
        let config = Config::from_toml(text).expect("examples/config.toml parses");
        assert_eq!(config.listen.to_string(), "127.0.0.1:8080");
        // Every top-level key of the struct appears in the example.
        for key in [
            "database_url",
            "database_max_connections",
            "sqlite_synchronous",
            "database_timeout_ms",
            "listen",
            "public_url",
            "metrics_listen",
            "[tls]",
            "cert_file",
            "key_file",
            "provider",
            "evolution_url",
            "evolution_api_key",
            "provider_timeout_ms",
            "policies_dir",
            "allow_loopback_targets",
            "log_format",
            "log_level",
            "log_file",
            "[limits]",
            "instance_per_minute",
            "recipient_per_minute",
            "[plans.starter]",
            "[plans.scale]",
            "daily_messages",
            "monthly_messages",
            "[media]",
            "max_image_bytes",
            "max_document_bytes",
            "max_audio_bytes",
            "[policies]",
            "fail_mode",
            "fuel",
            "memory_bytes",
            "max_module_bytes",
            "workers",
            "debounce_ms",
            "cache_dir",
            "review_pause_threshold",
            "review_window_hours",
            "input_retention_days",
            "trusted_proxies",
            "[dashboard]",
            "signin_per_minute",
            "signin_burst",
            "password_slots",
            "password_queue",
        ] {
            assert!(text.contains(key), "examples/config.toml does not document {key}");
        }
    }

    #[test]
    fn defaults_need_no_file() {
        let c = Config::load(None, Vec::new()).unwrap();
        assert_eq!(c.database_url, "sqlite://gateway.db?mode=rwc");
        assert_eq!(c.listen.to_string(), "127.0.0.1:8080");
        assert_eq!(c.provider, "simulator");
        assert_eq!((c.limits.instance_per_minute, c.limits.recipient_per_minute), (30, 5));
        assert_eq!((c.plans.starter.daily_messages, c.plans.starter.monthly_messages), (100, 2000));
        assert_eq!((c.plans.scale.instances, c.plans.scale.daily_messages), (10, 1500));
    }

    #[test]
    fn environment_overrides_the_file() {
        let env = [
            ("GATEWAY_LISTEN", "127.0.0.1:9999"),
            ("GATEWAY_ALLOW_LOOPBACK_TARGETS", "1"),
            ("GATEWAY_LIMITS__INSTANCE_PER_MINUTE", "7"),
            ("GATEWAY_TEST_DATABASE_URL", "postgres://ignored"),
            ("OTHER", "x"),
        ]
        .map(|(k, v)| (k.to_string(), v.to_string()));
        let c = Config::load(None, env).unwrap();
        assert_eq!(c.listen.to_string(), "127.0.0.1:9999");
        assert!(c.allow_loopback_targets);
        assert_eq!(c.limits.instance_per_minute, 7);
    }

    #[test]
    fn unknown_keys_and_bad_values_are_refused() {
        assert!(Config::from_toml("listne = \"127.0.0.1:1\"").is_err());
        assert!(Config::from_toml("provider = \"carrier-pigeon\"").is_err());
        assert!(Config::from_toml("[limits]\ninstance_per_minute = 0").is_err());
    }
}

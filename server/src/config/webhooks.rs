//! `[webhooks]`: delivery of customer webhooks (schedule, timeout, concurrency,
//! retention, shutdown grace).

use super::flexible_bool;
use serde::Deserialize;

/// Delivery of customer webhooks: by default attempts after 0 s, 5 s, 5 min, 30 min,
/// 2 h, 5 h, 10 h, 10 h with ±20 % jitter; a 15 s timeout; disabled after 5 days of
/// failures.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WebhookSettings {
    /// Whether this process delivers (an API-only replica may leave it to others).
    #[serde(deserialize_with = "flexible_bool")]
    pub dispatch: bool,
    /// Delay before each attempt, in milliseconds; its length is the number of attempts.
    pub schedule_ms: Vec<u64>,
    /// Each delay varies by up to this fraction either way.
    pub jitter: f64,
    /// How long an endpoint has to answer.
    pub timeout_ms: u64,
    /// Deliveries in flight at once (per process).
    pub concurrency: usize,
    /// How often the dispatcher looks for due events when it found none.
    pub poll_interval_ms: u64,
    /// An endpoint with only failures for this long is disabled.
    pub disable_after_hours: i64,
    /// Days the attempt log (and finished events) are kept.
    pub retention_days: i64,
    /// How long a shutdown waits for deliveries in flight.
    pub shutdown_grace_ms: u64,
}

impl Default for WebhookSettings {
    fn default() -> Self {
        WebhookSettings {
            dispatch: true,
            schedule_ms: vec![0, 5_000, 300_000, 1_800_000, 7_200_000, 18_000_000, 36_000_000, 36_000_000],
            jitter: 0.2,
            timeout_ms: 15_000,
            concurrency: 64,
            poll_interval_ms: 200,
            disable_after_hours: 120,
            retention_days: 30,
            shutdown_grace_ms: 20_000,
        }
    }
}

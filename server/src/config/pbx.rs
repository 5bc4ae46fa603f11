//! `[pbx]`: defaults of the PBX webhook (rate, burst, cooldown, event retention).

use serde::Deserialize;

/// Defaults of the PBX webhook: 60 a minute with a burst of 20; a 15-minute cooldown
/// per integration, event type and phone.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PbxSettings {
    /// Sustained requests a minute per integration.
    pub rate_per_minute: i64,
    /// Requests an idle integration may send at once.
    pub burst: i64,
    /// Minutes during which a caller is not messaged again for the same event type.
    pub cooldown_minutes: i64,
    /// Days the received-event log is kept.
    pub event_retention_days: i64,
}

impl Default for PbxSettings {
    fn default() -> Self {
        PbxSettings { rate_per_minute: 60, burst: 20, cooldown_minutes: 15, event_retention_days: 30 }
    }
}

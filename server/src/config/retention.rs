//! `[retention]`: how long each table that grows with traffic keeps its rows.

use serde::Deserialize;

/// How long each table that grows with traffic keeps its rows (the PBX event log and
/// the webhook attempt log have theirs in `[pbx]` and `[webhooks]`). Enforced by a
/// background job on every gateway and by `gateway retention run`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RetentionSettings {
    /// Days the message log keeps a send attempt (with its delivery states).
    pub message_log_days: i64,
    /// Days received messages, delivery reports, calls and connection changes are kept.
    pub inbound_days: i64,
    /// Hours a provider's raw event is kept once applied (for a replay by an operator).
    pub provider_events_hours: i64,
    /// Days a provider's raw event that failed to apply is kept (to reprocess it).
    pub failed_provider_events_days: i64,
    /// Days a decided review item is kept.
    pub review_days: i64,
    /// Days a recipient's contact record (first and last message, replies, the `@lid`
    /// it was seen as) is kept after the last message either way. The pacing policy's
    /// "new recipient" and "never replied" read it: a recipient forgotten is new again.
    pub contacts_days: i64,
}

impl Default for RetentionSettings {
    fn default() -> Self {
        RetentionSettings {
            message_log_days: 90,
            inbound_days: 90,
            provider_events_hours: 24,
            failed_provider_events_days: 7,
            review_days: 90,
            contacts_days: 365,
        }
    }
}

//! `[policies]`: the policy host's sandbox limits, fail mode, reload timing and review
//! pause.

use super::flexible_bool;
use serde::Deserialize;

/// The policy host: a fresh instance per evaluation, fuel, a memory cap, no imports; a
/// fault applies the fail mode, by default deny with `policy_violation`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PolicySettings {
    /// Load the default purpose, content and pacing modules built into the gateway.
    #[serde(deserialize_with = "flexible_bool")]
    pub bundled: bool,
    /// What a module's fault (trap, out of fuel, out of memory, bad answer) decides:
    /// `deny` (refuse, 403 `policy_violation`), `review` (refuse and queue) or `allow`
    /// (skip the module; not recommended).
    pub fail_mode: String,
    /// Fuel (about one unit per WebAssembly instruction) one evaluation may use.
    pub fuel: u64,
    /// Linear memory one evaluation may grow to, in bytes.
    pub memory_bytes: usize,
    /// Largest module accepted, in bytes.
    pub max_module_bytes: usize,
    /// Evaluations running at once (0: one per CPU).
    pub workers: usize,
    /// How often the policies directory is looked at, and the store for `policy reload`
    /// and `policy rollback` commands (ms).
    pub poll_interval_ms: u64,
    /// A changed directory is reloaded once it has stayed unchanged this long (ms).
    pub debounce_ms: u64,
    /// Where compiled modules are cached, so a restart does not recompile ("" disables).
    pub cache_dir: String,
    /// This many review decisions for one instance within `review_window_hours` pause it.
    pub review_pause_threshold: i64,
    pub review_window_hours: i64,
    /// Days the inputs every send's modules saw (the message context, text included)
    /// are kept for `gateway policy backtest` (0: none are kept, and backtesting is off).
    pub input_retention_days: i64,
}

impl Default for PolicySettings {
    fn default() -> Self {
        PolicySettings {
            bundled: true,
            fail_mode: "deny".to_string(),
            fuel: 10_000_000,
            memory_bytes: 16 << 20,
            max_module_bytes: 1 << 20,
            workers: 0,
            poll_interval_ms: 500,
            debounce_ms: 1_000,
            cache_dir: "gateway-cache".to_string(),
            review_pause_threshold: 3,
            review_window_hours: 24,
            input_retention_days: 7,
        }
    }
}

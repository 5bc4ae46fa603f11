//! `[dashboard]`: the bounds on the work an unauthenticated sign-in can cause.

use serde::Deserialize;

/// Bounds on the work an unauthenticated sign-in can cause: a throttle per source
/// address (beside the one per email), and a fixed number of threads that hash
/// passwords behind a short queue; beyond them, 429 with `Retry-After` before any
/// hashing.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DashboardSettings {
    /// Sign-in attempts a minute per source address (IPv4 address, IPv6 /64), after
    /// the burst.
    pub signin_per_minute: i64,
    /// Sign-in attempts one source address may make at once.
    pub signin_burst: i64,
    /// Threads hashing passwords, each holding 19 MiB while it hashes (0: one per core).
    pub password_slots: i64,
    /// Password jobs that may wait for a thread (0: twice the slots).
    pub password_queue: i64,
}

impl Default for DashboardSettings {
    fn default() -> Self {
        DashboardSettings { signin_per_minute: 10, signin_burst: 30, password_slots: 0, password_queue: 0 }
    }
}

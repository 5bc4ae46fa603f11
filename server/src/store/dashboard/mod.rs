//! Dashboard accounts: users and operators, one-time sign-in links, recovery codes,
//! sessions, sign-in throttling, known browsers, and server-side keys.
//!
//! Only hashes of tokens are stored (session ids, invitation tokens, device cookies:
//! SHA-256 of 256 random bits; recovery codes: argon2id). The checks that must hold
//! under concurrency are single conditional statements: a TOTP step is accepted only
//! if it is later than the last one, a recovery code or an invitation is spent only
//! once, and a sign-in attempt is admitted only when its throttle bucket allows it.
//!
//! `users` holds the accounts (roles, password, second factor), `sessions` what a
//! browser holds (sessions, invitations, known browsers), `throttle` the sign-in
//! throttle; here are the server-side keys.

mod sessions;
mod throttle;
mod users;

pub use sessions::{DashSession, Invitation};
pub use throttle::{THROTTLE_WINDOW_MS, Throttled};
pub use users::DashUser;

use super::{Store, StoreError};
use sqlx::Row;

impl Store {
    /// A server-side key: the stored one, or `fresh` stored now (first start). Replicas
    /// on one database agree on it.
    pub async fn dashboard_setting_or(&self, name: &str, fresh: &str) -> Result<String, StoreError> {
        sqlx::query("INSERT INTO dashboard_settings (name, value) VALUES ($1, $2) ON CONFLICT (name) DO NOTHING")
            .bind(name)
            .bind(fresh)
            .execute(&self.write)
            .await?;
        Ok(sqlx::query("SELECT value FROM dashboard_settings WHERE name = $1")
            .bind(name)
            .fetch_one(&self.write)
            .await?
            .try_get("value")?)
    }
}

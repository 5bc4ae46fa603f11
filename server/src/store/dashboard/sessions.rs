//! What a browser holds: sessions (each with its stage of the sign-in), one-time
//! sign-in links, and the browsers that completed a sign-in before.

use super::super::{Cols, FromCols, Store, StoreError, now_ms};
use super::users::{DashUser, USER_COLUMNS};
use sqlx::Row;

/// A session with its account.
#[derive(Clone, Debug)]
pub struct DashSession {
    pub id_hash: String,
    /// `mfa`, `enroll` or `full`.
    pub stage: String,
    pub csrf_token: String,
    pub pending_totp: Option<String>,
    pub created_at: i64,
    pub last_seen_at: i64,
    pub expires_at: i64,
    pub user: DashUser,
}

/// From the columns of `Store::session`: the session's (its `created_at` as
/// `s_created_at`) and its account's.
impl FromCols for DashSession {
    fn from_cols(r: &impl Cols) -> Result<DashSession, StoreError> {
        Ok(DashSession {
            id_hash: r.col("id_hash")?,
            stage: r.col("stage")?,
            csrf_token: r.col("csrf_token")?,
            pending_totp: r.col("pending_totp")?,
            created_at: r.col("s_created_at")?,
            last_seen_at: r.col("last_seen_at")?,
            expires_at: r.col("expires_at")?,
            user: DashUser::from_cols(r)?,
        })
    }
}

/// An invitation (one-time sign-in link) and its account.
#[derive(Clone, Debug)]
pub struct Invitation {
    pub user: DashUser,
    pub expires_at: i64,
    pub used_at: Option<i64>,
}

impl Store {
    /// Stores a one-time sign-in link for an account (earlier unused ones stop working).
    pub async fn create_invitation(&self, user_id: &str, token_hash: &str, expires_at: i64) -> Result<(), StoreError> {
        let mut tx = self.write.begin().await?;
        sqlx::query("DELETE FROM dashboard_invitations WHERE user_id = $1 AND used_at IS NULL")
            .bind(user_id)
            .execute(&mut *tx)
            .await?;
        sqlx::query(
            "INSERT INTO dashboard_invitations (token_hash, user_id, created_at, expires_at) VALUES ($1, $2, $3, $4)",
        )
        .bind(token_hash)
        .bind(user_id)
        .bind(now_ms())
        .bind(expires_at)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(())
    }

    /// The invitation with this token hash.
    pub async fn invitation(&self, token_hash: &str) -> Result<Option<Invitation>, StoreError> {
        let row = sqlx::query("SELECT user_id, expires_at, used_at FROM dashboard_invitations WHERE token_hash = $1")
            .bind(token_hash)
            .fetch_optional(&self.write)
            .await?;
        let Some(row) = row else { return Ok(None) };
        let user_id: String = row.try_get("user_id")?;
        let Some(user) = self.dashboard_user(&user_id).await? else { return Ok(None) };
        Ok(Some(Invitation { user, expires_at: row.try_get("expires_at")?, used_at: row.try_get("used_at")? }))
    }

    /// Spends an invitation that is unused and unexpired at `now`; whether it was.
    pub async fn spend_invitation(&self, token_hash: &str, now: i64) -> Result<bool, StoreError> {
        let done = sqlx::query(
            "UPDATE dashboard_invitations SET used_at = $2 WHERE token_hash = $1 AND used_at IS NULL AND expires_at > $2",
        )
        .bind(token_hash)
        .bind(now)
        .execute(&self.write)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// Starts a session (and drops every expired session of every account).
    pub async fn create_session(
        &self,
        id_hash: &str,
        user_id: &str,
        stage: &str,
        csrf_token: &str,
        expires_at: i64,
        idle_cutoff: i64,
    ) -> Result<(), StoreError> {
        let now = now_ms();
        sqlx::query("DELETE FROM dashboard_sessions WHERE expires_at <= $1 OR last_seen_at <= $2")
            .bind(now)
            .bind(idle_cutoff)
            .execute(&self.write)
            .await?;
        sqlx::query(
            "INSERT INTO dashboard_sessions (id_hash, user_id, stage, csrf_token, created_at, last_seen_at, expires_at) \
             VALUES ($1, $2, $3, $4, $5, $5, $6)",
        )
        .bind(id_hash)
        .bind(user_id)
        .bind(stage)
        .bind(csrf_token)
        .bind(now)
        .bind(expires_at)
        .execute(&self.write)
        .await?;
        Ok(())
    }

    /// The session with this id hash and its account.
    pub async fn session(&self, id_hash: &str) -> Result<Option<DashSession>, StoreError> {
        let user_cols: Vec<String> = USER_COLUMNS.split(", ").map(|c| format!("u.{c}")).collect();
        let row = sqlx::query(&format!(
            "SELECT s.id_hash, s.stage, s.csrf_token, s.pending_totp, s.created_at AS s_created_at, \
             s.last_seen_at, s.expires_at, {} FROM dashboard_sessions s JOIN dashboard_users u ON u.id = s.user_id \
             WHERE s.id_hash = $1",
            user_cols.join(", ")
        ))
        .bind(id_hash)
        .fetch_optional(&self.read)
        .await?;
        row.as_ref().map(DashSession::from_cols).transpose()
    }

    /// Records activity on a session.
    pub async fn touch_session(&self, id_hash: &str, at: i64) -> Result<(), StoreError> {
        sqlx::query("UPDATE dashboard_sessions SET last_seen_at = $2 WHERE id_hash = $1")
            .bind(id_hash)
            .bind(at)
            .execute(&self.write)
            .await?;
        Ok(())
    }

    /// Keeps an enrolment seed on a session until a code confirms it.
    pub async fn set_pending_totp(&self, id_hash: &str, secret: &str) -> Result<(), StoreError> {
        sqlx::query("UPDATE dashboard_sessions SET pending_totp = $2 WHERE id_hash = $1")
            .bind(id_hash)
            .bind(secret)
            .execute(&self.write)
            .await?;
        Ok(())
    }

    /// Ends a session.
    pub async fn delete_session(&self, id_hash: &str) -> Result<(), StoreError> {
        sqlx::query("DELETE FROM dashboard_sessions WHERE id_hash = $1").bind(id_hash).execute(&self.write).await?;
        Ok(())
    }

    /// Ends every session of an account (its password was replaced).
    pub async fn delete_user_sessions(&self, user_id: &str) -> Result<(), StoreError> {
        sqlx::query("DELETE FROM dashboard_sessions WHERE user_id = $1").bind(user_id).execute(&self.write).await?;
        Ok(())
    }

    /// Whether a session row exists (tests and sign-out checks).
    pub async fn session_exists(&self, id_hash: &str) -> Result<bool, StoreError> {
        let row = sqlx::query("SELECT id_hash FROM dashboard_sessions WHERE id_hash = $1")
            .bind(id_hash)
            .fetch_optional(&self.write)
            .await?;
        Ok(row.is_some())
    }

    /// Remembers a browser that completed a sign-in.
    pub async fn add_device(&self, token_hash: &str, user_id: &str) -> Result<(), StoreError> {
        let now = now_ms();
        sqlx::query(
            "INSERT INTO dashboard_devices (token_hash, user_id, created_at, last_used_at) VALUES ($1, $2, $3, $3) \
             ON CONFLICT (token_hash) DO UPDATE SET last_used_at = excluded.last_used_at",
        )
        .bind(token_hash)
        .bind(user_id)
        .bind(now)
        .execute(&self.write)
        .await?;
        Ok(())
    }

    /// The account a known browser signed in to, if it was created after `since`.
    pub async fn device_user(&self, token_hash: &str, since: i64) -> Result<Option<String>, StoreError> {
        let row = sqlx::query("SELECT user_id FROM dashboard_devices WHERE token_hash = $1 AND created_at > $2")
            .bind(token_hash)
            .bind(since)
            .fetch_optional(&self.read)
            .await?;
        Ok(row.map(|r| r.try_get("user_id")).transpose()?)
    }
}

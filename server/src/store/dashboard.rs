//! Dashboard accounts: users and operators, one-time sign-in links, recovery codes,
//! sessions, sign-in throttling, known browsers, and server-side keys.
//!
//! Only hashes of tokens are stored (session ids, invitation tokens, device cookies:
//! SHA-256 of 256 random bits; recovery codes: argon2id). The checks that must hold
//! under concurrency are single conditional statements: a TOTP step is accepted only
//! if it is later than the last one, a recovery code or an invitation is spent only
//! once, and a sign-in attempt is admitted only when its throttle bucket allows it.

use super::{Cols, FromCols, Store, StoreError, new_id, now_ms};
use sqlx::Row;

/// A dashboard account.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DashUser {
    pub id: String,
    /// `None` for operators.
    pub customer_id: Option<String>,
    pub email: String,
    /// `owner`, `admin`, `developer`, `viewer` or `operator`.
    pub role: String,
    pub password_hash: Option<String>,
    pub totp_secret: Option<String>,
    pub totp_last_step: Option<i64>,
    pub created_by: Option<String>,
    pub created_at: i64,
    pub last_sign_in_at: Option<i64>,
    pub disabled_at: Option<i64>,
}

impl FromCols for DashUser {
    fn from_cols(r: &impl Cols) -> Result<Self, StoreError> {
        Ok(DashUser {
            id: r.col("id")?,
            customer_id: r.col("customer_id")?,
            email: r.col("email")?,
            role: r.col("role")?,
            password_hash: r.col("password_hash")?,
            totp_secret: r.col("totp_secret")?,
            totp_last_step: r.col("totp_last_step")?,
            created_by: r.col("created_by")?,
            created_at: r.col("created_at")?,
            last_sign_in_at: r.col("last_sign_in_at")?,
            disabled_at: r.col("disabled_at")?,
        })
    }
}

const USER_COLUMNS: &str = "id, customer_id, email, role, password_hash, totp_secret, totp_last_step, created_by, \
     created_at, last_sign_in_at, disabled_at";

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

/// An invitation (one-time sign-in link) and its account.
#[derive(Clone, Debug)]
pub struct Invitation {
    pub user: DashUser,
    pub expires_at: i64,
    pub used_at: Option<i64>,
}

/// Why a sign-in attempt was not admitted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Throttled {
    /// When the next attempt is allowed (Unix ms).
    pub until: i64,
}

/// Length of the throttle's observation window.
pub const THROTTLE_WINDOW_MS: i64 = 3_600_000;

/// The condition, on the row of `dashboard_users` being changed, that the change keeps
/// an active owner: the row is not an active owner, or another active owner exists.
const KEEPS_AN_OWNER: &str = "(role <> 'owner' OR disabled_at IS NOT NULL OR EXISTS (SELECT 1 FROM dashboard_users o \
     WHERE o.customer_id = dashboard_users.customer_id AND o.role = 'owner' AND o.disabled_at IS NULL \
     AND o.id <> dashboard_users.id))";

impl Store {
    /// Creates an account (no password yet). Conflict when the email already has an
    /// account in this customer (operators: among operators). An email may have an
    /// account in other customers: that is never told here (no existence oracle), and
    /// only one of an email's accounts can get a password ([`set_password_hash`]).
    pub async fn create_dashboard_user(
        &self,
        customer_id: Option<&str>,
        email: &str,
        role: &str,
        created_by: &str,
    ) -> Result<DashUser, StoreError> {
        if let Some(customer_id) = customer_id {
            self.customer(customer_id).await?;
        }
        let taken = || StoreError::Conflict(format!("{email} already has an account here"));
        let same = sqlx::query("SELECT 1 FROM dashboard_users WHERE email = $1 AND COALESCE(customer_id, '') = $2")
            .bind(email)
            .bind(customer_id.unwrap_or(""))
            .fetch_optional(&self.write)
            .await?;
        if same.is_some() {
            return Err(taken());
        }
        let id = new_id("usr");
        sqlx::query(
            "INSERT INTO dashboard_users (id, customer_id, email, role, created_by, created_at) \
             VALUES ($1, $2, $3, $4, $5, $6)",
        )
        .bind(&id)
        .bind(customer_id)
        .bind(email)
        .bind(role)
        .bind(created_by)
        .bind(now_ms())
        .execute(&self.write)
        .await
        .map_err(|e| match e {
            sqlx::Error::Database(d) if d.is_unique_violation() => taken(),
            other => other.into(),
        })?;
        self.dashboard_user(&id).await?.ok_or_else(|| StoreError::NotFound(format!("user {id}")))
    }

    /// Whether another account of `email` than `user_id` can sign in (has a password):
    /// then this one can never get one.
    pub async fn email_signs_in_elsewhere(&self, email: &str, user_id: &str) -> Result<bool, StoreError> {
        let row =
            sqlx::query("SELECT 1 FROM dashboard_users WHERE email = $1 AND id <> $2 AND password_hash IS NOT NULL")
                .bind(email)
                .bind(user_id)
                .fetch_optional(&self.write)
                .await?;
        Ok(row.is_some())
    }

    /// One account by id.
    pub async fn dashboard_user(&self, id: &str) -> Result<Option<DashUser>, StoreError> {
        let row = sqlx::query(&format!("SELECT {USER_COLUMNS} FROM dashboard_users WHERE id = $1"))
            .bind(id)
            .fetch_optional(&self.write)
            .await?;
        row.as_ref().map(DashUser::from_cols).transpose()
    }

    /// One account by (lower-case) email.
    pub async fn dashboard_user_by_email(&self, email: &str) -> Result<Option<DashUser>, StoreError> {
        // The account that signs in (the one with a password), else the newest.
        let row = sqlx::query(&format!(
            "SELECT {USER_COLUMNS} FROM dashboard_users WHERE email = $1 \
             ORDER BY CASE WHEN password_hash IS NULL THEN 1 ELSE 0 END, created_at DESC LIMIT 1"
        ))
        .bind(email)
        .fetch_optional(&self.write)
        .await?;
        row.as_ref().map(DashUser::from_cols).transpose()
    }

    /// A customer's accounts, oldest first (a page), and how many there are.
    pub async fn customer_users(
        &self,
        customer_id: &str,
        limit: i64,
        offset: i64,
    ) -> Result<(Vec<DashUser>, i64), StoreError> {
        let rows = sqlx::query(&format!(
            "SELECT {USER_COLUMNS} FROM dashboard_users WHERE customer_id = $1 \
             ORDER BY created_at, id LIMIT $2 OFFSET $3"
        ))
        .bind(customer_id)
        .bind(limit)
        .bind(offset)
        .fetch_all(&self.read)
        .await?;
        let total: i64 = sqlx::query("SELECT COUNT(*) AS n FROM dashboard_users WHERE customer_id = $1")
            .bind(customer_id)
            .fetch_one(&self.read)
            .await?
            .try_get("n")?;
        Ok((rows.iter().map(DashUser::from_cols).collect::<Result<_, _>>()?, total))
    }

    /// How many active owners a customer has.
    pub async fn active_owner_count(&self, customer_id: &str) -> Result<i64, StoreError> {
        Ok(sqlx::query(
            "SELECT COUNT(*) AS n FROM dashboard_users WHERE customer_id = $1 AND role = 'owner' \
             AND disabled_at IS NULL",
        )
        .bind(customer_id)
        .fetch_one(&self.write)
        .await?
        .try_get("n")?)
    }

    /// Changes an account's role; `false` (nothing changed) when it would leave the
    /// customer without an active owner. Exact under concurrency: on PostgreSQL the
    /// customer's row is locked first, so two owners demoting each other at once take
    /// turns and the second sees the first's change; on SQLite the one statement runs
    /// alone.
    pub async fn set_user_role(&self, id: &str, role: &str) -> Result<bool, StoreError> {
        let mut tx = self.write.begin().await?;
        self.lock_customer_of_user(&mut tx, id).await?;
        let done = sqlx::query(&format!(
            "UPDATE dashboard_users SET role = $2 WHERE id = $1 AND ($2 = 'owner' OR {KEEPS_AN_OWNER})"
        ))
        .bind(id)
        .bind(role)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(done.rows_affected() > 0)
    }

    /// Disables an account: its sessions, unused links and known browsers end at once.
    /// `false` (nothing changed) when it is the customer's last active owner.
    pub async fn disable_user(&self, id: &str) -> Result<bool, StoreError> {
        let mut tx = self.write.begin().await?;
        self.lock_customer_of_user(&mut tx, id).await?;
        let done = sqlx::query(&format!(
            "UPDATE dashboard_users SET disabled_at = COALESCE(disabled_at, $2) WHERE id = $1 AND {KEEPS_AN_OWNER}"
        ))
        .bind(id)
        .bind(now_ms())
        .execute(&mut *tx)
        .await?;
        if done.rows_affected() == 0 {
            return Ok(false);
        }
        for sql in [
            "DELETE FROM dashboard_sessions WHERE user_id = $1",
            "DELETE FROM dashboard_invitations WHERE user_id = $1 AND used_at IS NULL",
            "DELETE FROM dashboard_devices WHERE user_id = $1",
        ] {
            sqlx::query(sql).bind(id).execute(&mut *tx).await?;
        }
        tx.commit().await?;
        Ok(true)
    }

    /// PostgreSQL: locks the row of the user's customer until the transaction ends
    /// (SQLite writes one at a time already).
    async fn lock_customer_of_user(
        &self,
        tx: &mut sqlx::Transaction<'_, sqlx::Any>,
        id: &str,
    ) -> Result<(), StoreError> {
        if self.backend == super::Backend::Postgres {
            sqlx::query(
                "SELECT id FROM customers WHERE id = (SELECT customer_id FROM dashboard_users WHERE id = $1) FOR UPDATE",
            )
            .bind(id)
            .fetch_optional(&mut **tx)
            .await?;
        }
        Ok(())
    }

    /// Sets the password hash.
    pub async fn set_password_hash(&self, id: &str, hash: &str) -> Result<(), StoreError> {
        sqlx::query("UPDATE dashboard_users SET password_hash = $2 WHERE id = $1")
            .bind(id)
            .bind(hash)
            .execute(&self.write)
            .await
            .map_err(|e| match e {
                sqlx::Error::Database(d) if d.is_unique_violation() => {
                    StoreError::Conflict("another account of this email can sign in".into())
                }
                other => other.into(),
            })?;
        Ok(())
    }

    /// Forgets the authenticator and recovery codes (re-enrolment at the next sign-in),
    /// and ends every session: the operator's answer to a lost second factor.
    pub async fn reset_mfa(&self, id: &str) -> Result<(), StoreError> {
        let mut tx = self.write.begin().await?;
        sqlx::query("UPDATE dashboard_users SET totp_secret = NULL, totp_last_step = NULL WHERE id = $1")
            .bind(id)
            .execute(&mut *tx)
            .await?;
        for sql in [
            "DELETE FROM dashboard_recovery_codes WHERE user_id = $1",
            "DELETE FROM dashboard_sessions WHERE user_id = $1",
        ] {
            sqlx::query(sql).bind(id).execute(&mut *tx).await?;
        }
        tx.commit().await?;
        Ok(())
    }

    /// Enrols an authenticator: its seed, the step of the code that confirmed it, and
    /// the hashes of new recovery codes (replacing any old ones), in one transaction.
    pub async fn enroll_totp(
        &self,
        id: &str,
        secret: &str,
        step: i64,
        recovery_hashes: &[String],
    ) -> Result<(), StoreError> {
        let mut tx = self.write.begin().await?;
        sqlx::query("UPDATE dashboard_users SET totp_secret = $2, totp_last_step = $3 WHERE id = $1")
            .bind(id)
            .bind(secret)
            .bind(step)
            .execute(&mut *tx)
            .await?;
        sqlx::query("DELETE FROM dashboard_recovery_codes WHERE user_id = $1").bind(id).execute(&mut *tx).await?;
        for hash in recovery_hashes {
            sqlx::query("INSERT INTO dashboard_recovery_codes (user_id, code_hash) VALUES ($1, $2)")
                .bind(id)
                .bind(hash)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    /// Accepts a TOTP step if it is later than the last accepted one (each code works
    /// once, even under concurrent attempts); whether it was accepted.
    pub async fn accept_totp_step(&self, id: &str, step: i64) -> Result<bool, StoreError> {
        let done = sqlx::query(
            "UPDATE dashboard_users SET totp_last_step = $2 \
             WHERE id = $1 AND (totp_last_step IS NULL OR totp_last_step < $2)",
        )
        .bind(id)
        .bind(step)
        .execute(&self.write)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// The unused recovery codes of an account: (id, hash).
    pub async fn unused_recovery_codes(&self, user_id: &str) -> Result<Vec<(i64, String)>, StoreError> {
        let rows = sqlx::query(
            "SELECT id, code_hash FROM dashboard_recovery_codes WHERE user_id = $1 AND used_at IS NULL ORDER BY id",
        )
        .bind(user_id)
        .fetch_all(&self.write)
        .await?;
        rows.iter().map(|r| Ok((r.try_get("id")?, r.try_get("code_hash")?))).collect()
    }

    /// Spends a recovery code; false when it was already spent.
    pub async fn spend_recovery_code(&self, id: i64) -> Result<bool, StoreError> {
        let done = sqlx::query("UPDATE dashboard_recovery_codes SET used_at = $2 WHERE id = $1 AND used_at IS NULL")
            .bind(id)
            .bind(now_ms())
            .execute(&self.write)
            .await?;
        Ok(done.rows_affected() == 1)
    }

    /// Records a completed sign-in.
    pub async fn record_sign_in(&self, id: &str) -> Result<(), StoreError> {
        sqlx::query("UPDATE dashboard_users SET last_sign_in_at = $2 WHERE id = $1")
            .bind(id)
            .bind(now_ms())
            .execute(&self.write)
            .await?;
        Ok(())
    }

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
        let Some(r) = row else { return Ok(None) };
        Ok(Some(DashSession {
            id_hash: r.col("id_hash")?,
            stage: r.col("stage")?,
            csrf_token: r.col("csrf_token")?,
            pending_totp: r.col("pending_totp")?,
            created_at: r.col("s_created_at")?,
            last_seen_at: r.col("last_seen_at")?,
            expires_at: r.col("expires_at")?,
            user: DashUser::from_cols(&r)?,
        }))
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

    /// Admits a sign-in attempt in `bucket` at `now`, counting it as a failure until
    /// [`Store::clear_throttle`] says it succeeded. The check and the count are one
    /// statement, so concurrent attempts cannot all slip through: while the delay of
    /// the new count is not yet written the bucket is closed for `max_delay_ms`.
    /// Returns the failures in the window including this attempt.
    pub async fn admit_attempt(
        &self,
        bucket: &str,
        now: i64,
        max_delay_ms: i64,
        delay_ms: impl Fn(i64) -> i64,
    ) -> Result<Result<i64, Throttled>, StoreError> {
        let row = sqlx::query(
            "INSERT INTO dashboard_login_throttle (bucket, failures, window_start, next_allowed_at) \
             VALUES ($1, 1, $2, $3) \
             ON CONFLICT (bucket) DO UPDATE SET \
             failures = CASE WHEN dashboard_login_throttle.window_start <= $2 - $4 THEN 1 \
                        ELSE dashboard_login_throttle.failures + 1 END, \
             window_start = CASE WHEN dashboard_login_throttle.window_start <= $2 - $4 THEN $2 \
                            ELSE dashboard_login_throttle.window_start END, \
             next_allowed_at = $3 \
             WHERE dashboard_login_throttle.next_allowed_at <= $2 \
             RETURNING failures",
        )
        .bind(bucket)
        .bind(now)
        .bind(now + max_delay_ms)
        .bind(THROTTLE_WINDOW_MS)
        .fetch_optional(&self.write)
        .await?;
        let Some(row) = row else {
            let until: i64 = sqlx::query("SELECT next_allowed_at FROM dashboard_login_throttle WHERE bucket = $1")
                .bind(bucket)
                .fetch_one(&self.write)
                .await?
                .try_get("next_allowed_at")?;
            return Ok(Err(Throttled { until }));
        };
        let failures: i64 = row.try_get("failures")?;
        sqlx::query("UPDATE dashboard_login_throttle SET next_allowed_at = $2 WHERE bucket = $1")
            .bind(bucket)
            .bind(now + delay_ms(failures))
            .execute(&self.write)
            .await?;
        Ok(Ok(failures))
    }

    /// Forgets a bucket's failures (a successful sign-in).
    pub async fn clear_throttle(&self, bucket: &str) -> Result<(), StoreError> {
        sqlx::query("DELETE FROM dashboard_login_throttle WHERE bucket = $1").bind(bucket).execute(&self.write).await?;
        Ok(())
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

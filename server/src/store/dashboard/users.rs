//! Dashboard accounts: who they are (users of a customer, or operators), their role
//! (a customer always keeps an active owner), password, and second factor (TOTP and
//! recovery codes).

use super::super::{Cols, FromCols, Store, StoreError, new_id, now_ms};
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

pub(super) const USER_COLUMNS: &str = "id, customer_id, email, role, password_hash, totp_secret, totp_last_step, created_by, \
     created_at, last_sign_in_at, disabled_at";

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
        if self.backend == super::super::Backend::Postgres {
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
}

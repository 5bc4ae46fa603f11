//! PBX integrations: settings, templates, the received-event log (which is also the
//! idempotency record of `external_message_id`), seen signatures, cooldowns, and the
//! GCRA rate limiters.
//!
//! The admission of a webhook request (replay check, rate limit, and for an event that
//! needs no send its log row) is one write of the group-commit writer (`writer`), so a
//! burst of signed events costs one transaction per batch, not three per request: that
//! write is `admit`; here are the integrations and what they keep.

mod admit;

pub use admit::{Admission, PbxAdmit, RateCheck, SIGNATURE_MEMORY_SECONDS};

use super::{Cols, Forget, FromCols, Store, StoreError, flag, now_ms};
use rusqlite::types::Value as SqlValue;
use sqlx::Row;
use std::sync::Arc;

/// An integration as the webhook needs it, with its customer's PBX module flag.
#[derive(Clone, Debug)]
pub struct PbxIntegration {
    pub id: i64,
    pub customer_id: String,
    pub instance_id: String,
    pub secret_hash: String,
    pub secret_prefix: String,
    /// The signing key; `None` when HMAC signing is off.
    pub hmac_secret: Option<String>,
    pub business_name: Option<String>,
    pub rate_per_minute: Option<i64>,
    pub burst: Option<i64>,
    pub cooldown_seconds: Option<i64>,
    pub strict_window_hours: Option<i64>,
    pub ip_allowlist: Option<String>,
    pub created_at: i64,
    pub secret_rotated_at: Option<i64>,
    /// The customer's `pbx` module.
    pub module_pbx: bool,
}

impl FromCols for PbxIntegration {
    fn from_cols(r: &impl Cols) -> Result<Self, StoreError> {
        Ok(PbxIntegration {
            id: r.col("id")?,
            customer_id: r.col("customer_id")?,
            instance_id: r.col("instance_id")?,
            secret_hash: r.col("secret_hash")?,
            secret_prefix: r.col("secret_prefix")?,
            hmac_secret: r.col("hmac_secret")?,
            business_name: r.col("business_name")?,
            rate_per_minute: r.col("rate_per_minute")?,
            burst: r.col("burst")?,
            cooldown_seconds: r.col("cooldown_seconds")?,
            strict_window_hours: r.col("strict_window_hours")?,
            ip_allowlist: r.col("ip_allowlist")?,
            created_at: r.col("created_at")?,
            secret_rotated_at: r.col("secret_rotated_at")?,
            module_pbx: flag(r.col("module_pbx")?),
        })
    }
}

const INTEGRATION_SQL: &str = "SELECT p.id, p.customer_id, p.instance_id, p.secret_hash, p.secret_prefix, \
     p.hmac_secret, p.business_name, p.rate_per_minute, p.burst, p.cooldown_seconds, p.strict_window_hours, \
     p.ip_allowlist, p.created_at, p.secret_rotated_at, c.module_pbx \
     FROM pbx_integrations p JOIN customers c ON c.id = p.customer_id WHERE p.id = $1";

/// A message template of one event type.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PbxTemplate {
    pub event_type: String,
    pub body: String,
    pub purpose: String,
}

impl FromCols for PbxTemplate {
    fn from_cols(r: &impl Cols) -> Result<Self, StoreError> {
        Ok(PbxTemplate { event_type: r.col("event_type")?, body: r.col("body")?, purpose: r.col("purpose")? })
    }
}

/// One received event: what it was, what was done, what was answered.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PbxEvent {
    pub id: i64,
    pub integration_id: i64,
    pub customer_id: String,
    pub event_type: String,
    pub action: String,
    pub status_code: i64,
    pub error_code: Option<String>,
    pub phone: Option<String>,
    pub message_id: Option<String>,
    pub external_message_id: Option<String>,
    /// The answered body (JSON text).
    pub response: Option<String>,
    pub created_at: i64,
    /// While pending: the lease of the process that claimed its `external_message_id`
    /// (see `leases`).
    pub owner_lease: Option<i64>,
}

impl FromCols for PbxEvent {
    fn from_cols(r: &impl Cols) -> Result<Self, StoreError> {
        Ok(PbxEvent {
            id: r.col("id")?,
            integration_id: r.col("integration_id")?,
            customer_id: r.col("customer_id")?,
            event_type: r.col("event_type")?,
            action: r.col("action")?,
            status_code: r.col("status_code")?,
            error_code: r.col("error_code")?,
            phone: r.col("phone")?,
            message_id: r.col("message_id")?,
            external_message_id: r.col("external_message_id")?,
            response: r.col("response")?,
            created_at: r.col("created_at")?,
            owner_lease: r.col("owner_lease")?,
        })
    }
}

pub(super) const EVENT_COLUMNS: &str = "id, integration_id, customer_id, event_type, action, status_code, error_code, phone, \
     message_id, external_message_id, response, created_at, owner_lease";

/// An event's log row; `RETURNING id` where sqlx runs it, not in the SQLite writer
/// ([`insert_event_sqlite`]).
macro_rules! insert_event_sql {
    () => {
        "INSERT INTO pbx_events (integration_id, customer_id, event_type, \
         action, status_code, error_code, phone, message_id, external_message_id, response, created_at) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)"
    };
}
const INSERT_EVENT_SQL: &str = concat!(insert_event_sql!(), " RETURNING id");

/// Writes an event's log row in the SQLite writer's transaction, its id.
fn insert_event_sqlite(tx: &rusqlite::Transaction<'_>, event: &PbxEvent) -> Result<i64, StoreError> {
    super::sqlite_insert(tx, insert_event_sql!(), &event_values(event), "an event's log row")
}

/// Values of `INSERT_EVENT_SQL`.
fn event_values(e: &PbxEvent) -> Vec<SqlValue> {
    let text = |s: &Option<String>| s.clone().map_or(SqlValue::Null, SqlValue::Text);
    vec![
        SqlValue::Integer(e.integration_id),
        SqlValue::Text(e.customer_id.clone()),
        SqlValue::Text(e.event_type.clone()),
        SqlValue::Text(e.action.clone()),
        SqlValue::Integer(e.status_code),
        text(&e.error_code),
        text(&e.phone),
        text(&e.message_id),
        text(&e.external_message_id),
        text(&e.response),
        SqlValue::Integer(e.created_at),
    ]
}

/// Changes to an integration's settings; `None` leaves a setting as it is.
#[derive(Clone, Debug, Default)]
pub struct PbxSettingsUpdate {
    pub business_name: Option<Option<String>>,
    pub rate_per_minute: Option<Option<i64>>,
    pub burst: Option<Option<i64>>,
    pub cooldown_seconds: Option<Option<i64>>,
    pub strict_window_hours: Option<Option<i64>>,
    pub ip_allowlist: Option<Option<String>>,
}

impl Store {
    /// Creates an integration bound to one of the customer's instances.
    #[allow(clippy::too_many_arguments)]
    pub async fn create_pbx_integration(
        &self,
        customer_id: &str,
        instance_id: &str,
        secret_hash: &str,
        secret_prefix: &str,
        hmac_secret: Option<&str>,
        business_name: Option<&str>,
    ) -> Result<i64, StoreError> {
        let owned = sqlx::query("SELECT id FROM instances WHERE id = $1 AND customer_id = $2")
            .bind(instance_id)
            .bind(customer_id)
            .fetch_optional(&self.write)
            .await?;
        if owned.is_none() {
            return Err(StoreError::NotFound(format!("instance {instance_id} of customer {customer_id}")));
        }
        let row = sqlx::query(
            "INSERT INTO pbx_integrations (customer_id, instance_id, secret_hash, secret_prefix, hmac_secret, \
             business_name, created_at) VALUES ($1, $2, $3, $4, $5, $6, $7) RETURNING id",
        )
        .bind(customer_id)
        .bind(instance_id)
        .bind(secret_hash)
        .bind(secret_prefix)
        .bind(hmac_secret.map(str::to_string))
        .bind(business_name.map(str::to_string))
        .bind(now_ms())
        .fetch_one(&self.write)
        .await?;
        Ok(row.try_get("id")?)
    }

    /// The integration `id` with its customer's PBX module flag.
    pub async fn pbx_integration(&self, id: i64) -> Result<Option<PbxIntegration>, StoreError> {
        self.read_one(INTEGRATION_SQL, vec![SqlValue::Integer(id)]).await
    }

    /// The integration `id` for the webhook: as read within `cache::TTL` by this process
    /// unless `fresh`, else read now (and kept). The webhook may authenticate against a
    /// cached one because its admission checks it is unchanged (`PbxAdmit::used`) and a
    /// refusal is checked again against a fresh read. The flag says it came from the cache.
    pub async fn pbx_integration_for_webhook(
        &self,
        id: i64,
        fresh: bool,
    ) -> Result<Option<(Arc<PbxIntegration>, bool)>, StoreError> {
        if !fresh && let Some(integration) = self.cache.integration(id) {
            return Ok(Some((integration, true)));
        }
        match self.pbx_integration(id).await? {
            Some(integration) => {
                let integration = Arc::new(integration);
                self.cache.put_integration(integration.clone());
                Ok(Some((integration, false)))
            }
            None => {
                self.cache.forget_integration(id);
                Ok(None)
            }
        }
    }

    /// Replaces the webhook secret, and the signing key when `hmac_secret` is given
    /// (`Some(None)` turns HMAC signing off). The old secret stops working at once.
    pub async fn rotate_pbx_secret(
        &self,
        id: i64,
        secret_hash: &str,
        secret_prefix: &str,
        hmac_secret: Option<Option<&str>>,
    ) -> Result<(), StoreError> {
        let update = sqlx::query(
            "UPDATE pbx_integrations SET secret_hash = $1, secret_prefix = $2, secret_rotated_at = $3, \
             hmac_secret = CASE WHEN $4 = 1 THEN $5 ELSE hmac_secret END WHERE id = $6",
        )
        .bind(secret_hash)
        .bind(secret_prefix)
        .bind(now_ms())
        .bind(i64::from(hmac_secret.is_some()))
        .bind(hmac_secret.flatten().map(str::to_string))
        .bind(id);
        self.update_one(update, Forget::Nothing, || format!("PBX integration {id}")).await?;
        self.cache.forget_integration(id);
        Ok(())
    }

    /// Applies a settings change.
    pub async fn update_pbx_settings(&self, id: i64, u: &PbxSettingsUpdate) -> Result<(), StoreError> {
        let current =
            self.pbx_integration(id).await?.ok_or_else(|| StoreError::NotFound(format!("PBX integration {id}")))?;
        sqlx::query(
            "UPDATE pbx_integrations SET business_name = $1, rate_per_minute = $2, burst = $3, \
             cooldown_seconds = $4, strict_window_hours = $5, ip_allowlist = $6 WHERE id = $7",
        )
        .bind(u.business_name.clone().unwrap_or(current.business_name))
        .bind(u.rate_per_minute.unwrap_or(current.rate_per_minute))
        .bind(u.burst.unwrap_or(current.burst))
        .bind(u.cooldown_seconds.unwrap_or(current.cooldown_seconds))
        .bind(u.strict_window_hours.unwrap_or(current.strict_window_hours))
        .bind(u.ip_allowlist.clone().unwrap_or(current.ip_allowlist))
        .bind(id)
        .execute(&self.write)
        .await?;
        self.cache.forget_integration(id);
        Ok(())
    }

    /// Sets (or replaces) the template of one event type.
    pub async fn set_pbx_template(
        &self,
        id: i64,
        event_type: &str,
        body: &str,
        purpose: &str,
    ) -> Result<(), StoreError> {
        self.pbx_integration(id).await?.ok_or_else(|| StoreError::NotFound(format!("PBX integration {id}")))?;
        sqlx::query(
            "INSERT INTO pbx_templates (integration_id, event_type, body, purpose, updated_at) \
             VALUES ($1, $2, $3, $4, $5) ON CONFLICT (integration_id, event_type) \
             DO UPDATE SET body = excluded.body, purpose = excluded.purpose, updated_at = excluded.updated_at",
        )
        .bind(id)
        .bind(event_type)
        .bind(body)
        .bind(purpose)
        .bind(now_ms())
        .execute(&self.write)
        .await?;
        Ok(())
    }

    /// Removes the template of one event type; whether there was one.
    pub async fn remove_pbx_template(&self, id: i64, event_type: &str) -> Result<bool, StoreError> {
        let done = sqlx::query("DELETE FROM pbx_templates WHERE integration_id = $1 AND event_type = $2")
            .bind(id)
            .bind(event_type)
            .execute(&self.write)
            .await?;
        Ok(done.rows_affected() > 0)
    }

    /// The template of one event type, if set.
    pub async fn pbx_template(&self, id: i64, event_type: &str) -> Result<Option<PbxTemplate>, StoreError> {
        self.read_one(
            "SELECT event_type, body, purpose FROM pbx_templates WHERE integration_id = $1 AND event_type = $2",
            vec![SqlValue::Integer(id), SqlValue::Text(event_type.to_string())],
        )
        .await
    }

    /// Every template of an integration, by event type.
    pub async fn pbx_templates(&self, id: i64) -> Result<Vec<PbxTemplate>, StoreError> {
        let rows = sqlx::query(
            "SELECT event_type, body, purpose FROM pbx_templates WHERE integration_id = $1 ORDER BY event_type",
        )
        .bind(id)
        .fetch_all(&self.read)
        .await?;
        rows.iter().map(PbxTemplate::from_cols).collect()
    }

    /// Writes an event's log row; its id.
    pub async fn insert_pbx_event(&self, event: &PbxEvent) -> Result<i64, StoreError> {
        let row = super::bind_all(sqlx::query(INSERT_EVENT_SQL), event_values(event)).fetch_one(&self.write).await?;
        Ok(row.try_get("id")?)
    }

    /// Claims `event.external_message_id` for this integration by writing a `pending`
    /// row under this process's lease: `Ok(id)` when claimed, `Err(existing)` when
    /// another request has it.
    pub async fn claim_pbx_external_id(&self, event: &PbxEvent) -> Result<Result<i64, PbxEvent>, StoreError> {
        const SQL: &str = "INSERT INTO pbx_events (integration_id, customer_id, event_type, \
             action, status_code, error_code, phone, message_id, external_message_id, response, created_at, \
             owner_lease) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12) \
             ON CONFLICT (integration_id, external_message_id) DO NOTHING RETURNING id";
        let mut values = event_values(event);
        values.push(self.lease().map_or(SqlValue::Null, SqlValue::Integer));
        let row = super::bind_all(sqlx::query(SQL), values).fetch_optional(&self.write).await?;
        if let Some(row) = row {
            return Ok(Ok(row.try_get("id")?));
        }
        let external = event.external_message_id.clone().unwrap_or_default();
        let existing = self.pbx_event_by_external_id(event.integration_id, &external).await?;
        existing.map(Err).ok_or_else(|| StoreError::Conflict("the external_message_id row vanished".into()))
    }

    /// The event row of an external message id.
    pub async fn pbx_event_by_external_id(&self, id: i64, external: &str) -> Result<Option<PbxEvent>, StoreError> {
        let row = sqlx::query(&format!(
            "SELECT {EVENT_COLUMNS} FROM pbx_events WHERE integration_id = $1 AND external_message_id = $2"
        ))
        .bind(id)
        .bind(external)
        .fetch_optional(&self.write)
        .await?;
        row.as_ref().map(PbxEvent::from_cols).transpose()
    }

    /// Completes a claimed row with the result.
    pub async fn finish_pbx_event(&self, row_id: i64, event: &PbxEvent) -> Result<(), StoreError> {
        sqlx::query(
            "UPDATE pbx_events SET action = $1, status_code = $2, error_code = $3, phone = $4, message_id = $5, \
             response = $6 WHERE id = $7",
        )
        .bind(&event.action)
        .bind(event.status_code)
        .bind(event.error_code.clone())
        .bind(event.phone.clone())
        .bind(event.message_id.clone())
        .bind(event.response.clone())
        .bind(row_id)
        .execute(&self.write)
        .await?;
        Ok(())
    }

    /// Drops a claimed row (the request failed unexpectedly; a repeat may try again).
    pub async fn release_pbx_event(&self, row_id: i64) -> Result<(), StoreError> {
        sqlx::query("DELETE FROM pbx_events WHERE id = $1 AND status_code = 0")
            .bind(row_id)
            .execute(&self.write)
            .await?;
        Ok(())
    }

    /// The latest received events of an integration, newest first.
    pub async fn recent_pbx_events(&self, id: i64, limit: i64) -> Result<Vec<PbxEvent>, StoreError> {
        let rows = sqlx::query(&format!(
            "SELECT {EVENT_COLUMNS} FROM pbx_events WHERE integration_id = $1 ORDER BY id DESC LIMIT $2"
        ))
        .bind(id)
        .bind(limit)
        .fetch_all(&self.read)
        .await?;
        rows.iter().map(PbxEvent::from_cols).collect()
    }

    /// Starts the cooldown of (integration, event type, phone) until `until`, unless one
    /// is running at `now`; whether it was started.
    pub async fn claim_pbx_cooldown(
        &self,
        id: i64,
        event_type: &str,
        phone: &str,
        now: i64,
        until: i64,
    ) -> Result<bool, StoreError> {
        let row = sqlx::query(
            "INSERT INTO pbx_cooldowns (integration_id, event_type, phone, until_at) VALUES ($1, $2, $3, $4) \
             ON CONFLICT (integration_id, event_type, phone) DO UPDATE SET until_at = excluded.until_at \
             WHERE pbx_cooldowns.until_at <= $5 RETURNING until_at",
        )
        .bind(id)
        .bind(event_type)
        .bind(phone)
        .bind(until)
        .bind(now)
        .fetch_optional(&self.write)
        .await?;
        Ok(row.is_some())
    }

    /// Ends a cooldown this request started (its message did not go out).
    pub async fn release_pbx_cooldown(
        &self,
        id: i64,
        event_type: &str,
        phone: &str,
        until: i64,
    ) -> Result<(), StoreError> {
        sqlx::query(
            "DELETE FROM pbx_cooldowns WHERE integration_id = $1 AND event_type = $2 AND phone = $3 AND until_at = $4",
        )
        .bind(id)
        .bind(event_type)
        .bind(phone)
        .bind(until)
        .execute(&self.write)
        .await?;
        Ok(())
    }

    /// Records that `phone` wrote to `instance_id` at `at` (provider ingress).
    pub async fn record_contact_activity(&self, instance_id: &str, phone: &str, at: i64) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO contact_activity (instance_id, phone, last_inbound_at) VALUES ($1, $2, $3) \
             ON CONFLICT (instance_id, phone) DO UPDATE SET last_inbound_at = excluded.last_inbound_at \
             WHERE contact_activity.last_inbound_at < excluded.last_inbound_at",
        )
        .bind(instance_id)
        .bind(phone)
        .bind(at)
        .execute(&self.write)
        .await?;
        Ok(())
    }

    /// When `phone` last wrote to `instance_id`.
    pub async fn last_inbound_at(&self, instance_id: &str, phone: &str) -> Result<Option<i64>, StoreError> {
        #[derive(Debug)]
        struct At(i64);
        impl FromCols for At {
            fn from_cols(r: &impl Cols) -> Result<Self, StoreError> {
                Ok(At(r.col("last_inbound_at")?))
            }
        }
        let at: Option<At> = self
            .read_one(
                "SELECT last_inbound_at FROM contact_activity WHERE instance_id = $1 AND phone = $2",
                vec![SqlValue::Text(instance_id.to_string()), SqlValue::Text(phone.to_string())],
            )
            .await?;
        Ok(at.map(|a| a.0))
    }
}

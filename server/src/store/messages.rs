//! The message log (one row per send attempt) and the event outbox.

use super::writer::WriteOp;
use super::{Store, StoreError};
use sqlx::Row;

/// One send attempt, allowed or refused.
#[derive(Clone, Debug, Default)]
pub struct LogEntry {
    pub customer_id: String,
    pub instance_id: Option<String>,
    pub api_key_id: Option<String>,
    /// `api`, `pbx` or `dashboard`.
    pub source: String,
    pub purpose: Option<String>,
    pub recipient: Option<String>,
    pub message_type: Option<String>,
    /// `allowed` or `refused`.
    pub decision: String,
    pub error_code: Option<String>,
    /// Policy that decided, e.g. `builtin/purpose@1.0.0`.
    pub policy: Option<String>,
    pub reason: Option<String>,
    pub provider_message_id: Option<String>,
    /// `sent`, `failed` or `refused`.
    pub status: String,
    pub created_at: i64,
}

/// An event to deliver to the customer's webhook.
#[derive(Clone, Debug)]
pub struct OutboxEvent {
    pub customer_id: String,
    pub instance_id: Option<String>,
    pub event_type: String,
    /// The whole event body.
    pub payload: serde_json::Value,
    pub created_at: i64,
}

impl Store {
    /// Writes the log row and, in the same transaction, the event it causes.
    /// Returns the log id.
    pub async fn record_attempt(&self, entry: &LogEntry, event: Option<&OutboxEvent>) -> Result<i64, StoreError> {
        let entry = Box::new(entry.clone());
        let event = event.cloned().map(Box::new);
        self.write_op(|reply| WriteOp::Record { entry, event, reply }).await
    }

    /// The log row with this id, as JSON (for tests and the CLI).
    pub async fn log_entry(&self, id: i64) -> Result<LogEntry, StoreError> {
        let r = sqlx::query(
            "SELECT customer_id, instance_id, api_key_id, source, purpose, recipient, message_type, decision, \
             error_code, policy, reason, provider_message_id, status, created_at FROM message_log WHERE id = $1",
        )
        .bind(id)
        .fetch_optional(&self.read)
        .await?
        .ok_or_else(|| StoreError::NotFound(format!("message log {id}")))?;
        Ok(LogEntry {
            customer_id: r.try_get("customer_id")?,
            instance_id: r.try_get("instance_id")?,
            api_key_id: r.try_get("api_key_id")?,
            source: r.try_get("source")?,
            purpose: r.try_get("purpose")?,
            recipient: r.try_get("recipient")?,
            message_type: r.try_get("message_type")?,
            decision: r.try_get("decision")?,
            error_code: r.try_get("error_code")?,
            policy: r.try_get("policy")?,
            reason: r.try_get("reason")?,
            provider_message_id: r.try_get("provider_message_id")?,
            status: r.try_get("status")?,
            created_at: r.try_get("created_at")?,
        })
    }

    /// Log rows of a customer, newest first: (id, entry).
    pub async fn recent_log(&self, customer_id: &str, limit: i64) -> Result<Vec<(i64, LogEntry)>, StoreError> {
        let ids: Vec<i64> = sqlx::query("SELECT id FROM message_log WHERE customer_id = $1 ORDER BY id DESC LIMIT $2")
            .bind(customer_id)
            .bind(limit)
            .fetch_all(&self.read)
            .await?
            .iter()
            .map(|r| r.try_get("id"))
            .collect::<Result<_, _>>()?;
        let mut out = Vec::with_capacity(ids.len());
        for id in ids {
            out.push((id, self.log_entry(id).await?));
        }
        Ok(out)
    }

    /// Events of a customer in the outbox, oldest first: (event type, payload).
    pub async fn outbox_events(&self, customer_id: &str) -> Result<Vec<(String, serde_json::Value)>, StoreError> {
        let rows = sqlx::query("SELECT event_type, payload FROM outbox WHERE customer_id = $1 ORDER BY id")
            .bind(customer_id)
            .fetch_all(&self.read)
            .await?;
        rows.iter()
            .map(|r| {
                let payload: String = r.try_get("payload")?;
                Ok((r.try_get("event_type")?, serde_json::from_str(&payload).unwrap_or(serde_json::Value::Null)))
            })
            .collect()
    }
}

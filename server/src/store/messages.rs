//! The message log (one row per send attempt) and the event outbox.

use super::attempts::{IdemOwner, KeyFate};
use super::writer::WriteOp;
use super::{Cols, FromCols, Store, StoreError};
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
    /// `sent`, `failed`, `unknown` or `refused`.
    pub status: String,
    pub created_at: i64,
    /// Every policy module's verdict, fuel and time (JSON array), when policies ran.
    pub policy_trace: Option<String>,
}

/// A send a policy sent to review: queued for an operator with the attempt's log row,
/// in the same transaction; enough of them for one instance pause it.
#[derive(Clone, Debug)]
pub struct ReviewItem {
    /// The message or caption, for the reviewer.
    pub text: Option<String>,
    pub policy: String,
    pub reason: String,
    pub risk_score: u8,
    /// This many reviews of the instance within `window_ms` of the attempt (this one
    /// included) pause it.
    pub pause_threshold: i64,
    pub window_ms: i64,
    /// Why the instance is paused, if this review pauses it.
    pub pause_reason: String,
}

/// A recorded attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Recorded {
    pub log_id: i64,
    /// The attempt's review paused the instance.
    pub paused: bool,
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

pub(super) const LOG_COLUMNS: &str = "customer_id, instance_id, api_key_id, source, purpose, recipient, \
     message_type, decision, error_code, policy, reason, provider_message_id, status, created_at, policy_trace";

impl FromCols for LogEntry {
    fn from_cols(r: &impl Cols) -> Result<LogEntry, StoreError> {
        Ok(LogEntry {
            customer_id: r.col("customer_id")?,
            instance_id: r.col("instance_id")?,
            api_key_id: r.col("api_key_id")?,
            source: r.col("source")?,
            purpose: r.col("purpose")?,
            recipient: r.col("recipient")?,
            message_type: r.col("message_type")?,
            decision: r.col("decision")?,
            error_code: r.col("error_code")?,
            policy: r.col("policy")?,
            reason: r.col("reason")?,
            provider_message_id: r.col("provider_message_id")?,
            status: r.col("status")?,
            created_at: r.col("created_at")?,
            policy_trace: r.col("policy_trace")?,
        })
    }
}

impl Store {
    /// Writes the log row and, in the same transaction, the event it causes.
    /// Returns the log id.
    pub async fn record_attempt(&self, entry: &LogEntry, event: Option<&OutboxEvent>) -> Result<i64, StoreError> {
        self.record_reviewed(entry, event, None).await.map(|r| r.log_id)
    }

    /// Writes the log row, its event, and (for a review decision) the review-queue item
    /// with the pause it may cause, in one transaction. A sent (or possibly sent)
    /// message also counts toward its recipient's contact record.
    pub async fn record_reviewed(
        &self,
        entry: &LogEntry,
        event: Option<&OutboxEvent>,
        review: Option<&ReviewItem>,
    ) -> Result<Recorded, StoreError> {
        self.record_answered(entry, event, review, None).await
    }

    /// `record_reviewed`, keeping the request's answer for its idempotency key in the
    /// same transaction.
    pub async fn record_answered(
        &self,
        entry: &LogEntry,
        event: Option<&OutboxEvent>,
        review: Option<&ReviewItem>,
        answer: Option<(IdemOwner, KeyFate)>,
    ) -> Result<Recorded, StoreError> {
        let entry = Box::new(entry.clone());
        let event = event.cloned().map(Box::new);
        let review = review.cloned().map(Box::new);
        let answer = answer.map(Box::new);
        self.write_op(|reply| WriteOp::Record { entry, event, review, answer, reply }).await
    }

    /// The log row with this id.
    pub async fn log_entry(&self, id: i64) -> Result<LogEntry, StoreError> {
        let sql = format!("SELECT {LOG_COLUMNS} FROM message_log WHERE id = $1");
        let row = sqlx::query(&sql).bind(id).fetch_optional(&self.read).await?;
        row.map(|r| LogEntry::from_cols(&r))
            .transpose()?
            .ok_or_else(|| StoreError::NotFound(format!("message log {id}")))
    }

    /// Log rows of a customer, newest first: (id, entry), in one query.
    pub async fn recent_log(&self, customer_id: &str, limit: i64) -> Result<Vec<(i64, LogEntry)>, StoreError> {
        let sql = format!("SELECT id, {LOG_COLUMNS} FROM message_log WHERE customer_id = $1 ORDER BY id DESC LIMIT $2");
        let rows = sqlx::query(&sql).bind(customer_id).bind(limit).fetch_all(&self.read).await?;
        rows.iter().map(|r| Ok((r.col("id")?, LogEntry::from_cols(r)?))).collect()
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
                let payload = serde_json::from_str(&payload)
                    .map_err(|e| StoreError::Conflict(format!("outbox payload is not JSON: {e}")))?;
                Ok((r.try_get("event_type")?, payload))
            })
            .collect()
    }
}

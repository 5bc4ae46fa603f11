//! The message log (one row per send attempt) and the event outbox.

use super::idempotency::{IdemOwner, KeyFate, refusal_key};
use super::writer::{PgAnswer, Postgres, Statement, Write, unexpected};
use super::{Bound, Cols, FromCols, Store, StoreError, bind_dollar, bound_int, bound_opt, bound_text};
use rusqlite::types::Value as SqlValue;
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
    /// The request that made the row (`x-request-id`) and the caller's
    /// `X-Correlation-Id`.
    pub request_id: Option<String>,
    pub correlation_id: Option<String>,
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
    /// The whole event body, as JSON text (rendered once, where the event is made).
    pub payload: String,
    pub created_at: i64,
}

pub(super) const LOG_COLUMNS: &str = "customer_id, instance_id, api_key_id, source, purpose, recipient, \
     message_type, decision, error_code, policy, reason, provider_message_id, status, created_at, policy_trace, \
     request_id, correlation_id";

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
            request_id: r.col("request_id")?,
            correlation_id: r.col("correlation_id")?,
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
        let recorded =
            self.write(Record { entry: entry.clone(), event: event.cloned(), review: review.cloned(), answer }).await?;
        if recorded.paused {
            self.forget_cached();
        }
        Ok(recorded)
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

/// A log row written whole (a refusal, a request that could not be read), with its
/// event, its review and, for a request with an idempotency key, the key's fate.
struct Record {
    entry: LogEntry,
    event: Option<OutboxEvent>,
    review: Option<ReviewItem>,
    answer: Option<(IdemOwner, KeyFate)>,
}

impl Write for Record {
    type Output = Recorded;

    fn sqlite(&self, tx: &rusqlite::Transaction<'_>) -> Result<Recorded, StoreError> {
        let recorded = sqlite_record(tx, &self.entry, self.event.as_ref(), self.review.as_ref())?;
        if let Some((idem, fate)) = &self.answer {
            let (sql, values) = refusal_key(idem, fate, recorded.log_id, self.entry.created_at);
            let mut settle = tx.prepare_cached(sql)?;
            bind_dollar(&mut settle, &values)?;
            settle.raw_execute()?;
        }
        Ok(recorded)
    }

    fn postgres(&self) -> Postgres {
        let (entry, review) = (&self.entry, self.review.as_ref());
        let log = log_json(entry);
        let review = review.map(|r| {
            serde_json::json!({
                "text": r.text, "policy": r.policy, "reason": r.reason, "risk_score": r.risk_score,
                "pause_threshold": r.pause_threshold, "window_ms": r.window_ms,
                "pause_reason": r.pause_reason,
            })
        });
        // The event names the row, whose id the function makes: it follows the call
        // (`postgres_then`), so the function's own event insert is not used.
        let arg = serde_json::json!({"op": "record", "log": log, "event": null, "review": review});
        Postgres::Call { function: "gateway_write_batch", arg }
    }

    fn read_postgres(&self, answer: PgAnswer) -> Result<Recorded, StoreError> {
        let PgAnswer::Value(r) = answer else { return Err(StoreError::Conflict("a record had no answer".into())) };
        Ok(Recorded { log_id: r["id"].as_i64().ok_or_else(|| unexpected(&r))?, paused: r["paused"] == true })
    }

    /// The event and the key's fate need the row's id, so they follow the batch
    /// function.
    fn postgres_then(&self, recorded: &Recorded) -> Vec<Statement> {
        let mut then = Vec::new();
        if let Some(event) = &self.event {
            let params = outbox_values(event, Some(recorded.log_id)).into_iter().map(super::owned).collect();
            then.push(Statement { sql: INSERT_OUTBOX_SQL, params });
        }
        if let Some((idem, fate)) = &self.answer {
            let (sql, params) = refusal_key(idem, fate, recorded.log_id, self.entry.created_at);
            then.push(Statement { sql, params });
        }
        then
    }

    fn has_then(&self) -> bool {
        self.answer.is_some() || self.event.is_some()
    }
}

const INSERT_LOG_SQL: &str = "INSERT INTO message_log (customer_id, instance_id, api_key_id, source, purpose, \
     recipient, message_type, decision, error_code, policy, reason, provider_message_id, status, created_at, \
     policy_trace, request_id, correlation_id) \
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17)";
/// A message that went (or may have gone) out counts toward its recipient's contact.
const CONTACT_SENT_SQL: &str = "INSERT INTO contacts (instance_id, phone, first_sent_at, last_sent_at, sent_total) \
     VALUES ($1, $2, $3, $3, 1) ON CONFLICT (instance_id, phone) DO UPDATE SET \
     first_sent_at = COALESCE(contacts.first_sent_at, excluded.first_sent_at), \
     last_sent_at = excluded.last_sent_at, sent_total = contacts.sent_total + 1";
const INSERT_REVIEW_SQL: &str = "INSERT INTO review_queue (log_id, customer_id, instance_id, source, purpose, \
     recipient, message_type, text, policy, reason, risk_score, created_at) \
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)";
const COUNT_REVIEWS_SQL: &str = "SELECT COUNT(*) FROM review_queue WHERE instance_id = $1 AND created_at >= $2";
const PAUSE_SQL: &str = "UPDATE instances SET paused = 1, paused_reason = $2 WHERE id = $1 AND paused = 0";
/// An event about the log row `$6`. One of an instance without a webhook endpoint needs
/// no delivery: it is written done, as `skipped_no_endpoint`, by the endpoints this
/// statement sees, so no dispatcher claims it and skips it later (two writes more an
/// event: BENCHMARKS.md, issue 22). Every event the gateway's own statements write goes
/// through here; PostgreSQL's batch functions write theirs by the same rule, a trigger
/// (migration 0022). The integers are cast: in a `SELECT` PostgreSQL takes a parameter's
/// type from how it is bound, and the writer binds a NULL as text.
pub(super) const INSERT_OUTBOX_SQL: &str = "INSERT INTO outbox (customer_id, instance_id, event_type, payload, \
     created_at, available_at, log_id, delivered_at, outcome) \
     SELECT $1, $2, $3, $4, CAST($5 AS BIGINT), CAST($5 AS BIGINT), CAST($6 AS BIGINT), \
     CASE WHEN e.instance_id IS NULL THEN CAST($5 AS BIGINT) END, \
     CASE WHEN e.instance_id IS NULL THEN 'skipped_no_endpoint' END \
     FROM (SELECT 1) AS one LEFT JOIN webhook_endpoints e ON e.instance_id = $2";

pub(super) fn log_values(e: &LogEntry) -> Vec<Bound<'_>> {
    vec![
        bound_text(&e.customer_id),
        bound_opt(&e.instance_id),
        bound_opt(&e.api_key_id),
        bound_text(&e.source),
        bound_opt(&e.purpose),
        bound_opt(&e.recipient),
        bound_opt(&e.message_type),
        bound_text(&e.decision),
        bound_opt(&e.error_code),
        bound_opt(&e.policy),
        bound_opt(&e.reason),
        bound_opt(&e.provider_message_id),
        bound_text(&e.status),
        bound_int(Some(e.created_at)),
        bound_opt(&e.policy_trace),
        bound_opt(&e.request_id),
        bound_opt(&e.correlation_id),
    ]
}

/// Whether an attempt's message went out, or may have.
fn went_out(e: &LogEntry) -> bool {
    e.decision == "allowed" && matches!(e.status.as_str(), "sent" | "unknown")
}

/// The values of `INSERT_OUTBOX_SQL`: the event, naming the log row `log_id`.
fn outbox_values(e: &OutboxEvent, log_id: Option<i64>) -> [Bound<'_>; 6] {
    [
        bound_text(&e.customer_id),
        bound_opt(&e.instance_id),
        bound_text(&e.event_type),
        bound_text(&e.payload),
        bound_int(Some(e.created_at)),
        bound_int(log_id),
    ]
}

fn sqlite_record(
    tx: &rusqlite::Transaction<'_>,
    entry: &LogEntry,
    event: Option<&OutboxEvent>,
    review: Option<&ReviewItem>,
) -> Result<Recorded, StoreError> {
    let log_id = super::sqlite_insert(tx, INSERT_LOG_SQL, &log_values(entry), "a log row")?;
    if let Some(event) = event {
        sqlite_outbox(tx, event, Some(log_id))?;
    }
    if went_out(entry)
        && let (Some(instance), Some(phone)) = (&entry.instance_id, &entry.recipient)
    {
        sqlite_contact(tx, instance, phone, entry.created_at)?;
    }
    let mut paused = false;
    if let (Some(review), Some(instance)) = (review, &entry.instance_id) {
        let mut insert = tx.prepare_cached(INSERT_REVIEW_SQL)?;
        bind_dollar(&mut insert, &review_values(log_id, entry, review))?;
        insert.raw_execute()?;
        let recent: i64 = tx
            .prepare_cached(COUNT_REVIEWS_SQL)?
            .query_row(rusqlite::params![instance, entry.created_at.saturating_sub(review.window_ms)], |r| r.get(0))?;
        if recent >= review.pause_threshold {
            let mut pause = tx.prepare_cached(PAUSE_SQL)?;
            bind_dollar(&mut pause, &[SqlValue::Text(instance.clone()), SqlValue::Text(review.pause_reason.clone())])?;
            paused = pause.raw_execute()? > 0;
        }
    }
    Ok(Recorded { log_id, paused })
}

/// Writes an outbox event about the log row `log_id`.
pub(super) fn sqlite_outbox(
    tx: &rusqlite::Transaction<'_>,
    event: &OutboxEvent,
    log_id: Option<i64>,
) -> Result<(), StoreError> {
    let mut insert = tx.prepare_cached(INSERT_OUTBOX_SQL)?;
    bind_dollar(&mut insert, &outbox_values(event, log_id))?;
    insert.raw_execute()?;
    Ok(())
}

/// Counts a message that went (or may have gone) out toward its recipient's contact.
pub(super) fn sqlite_contact(
    tx: &rusqlite::Transaction<'_>,
    instance: &str,
    phone: &str,
    at: i64,
) -> Result<(), StoreError> {
    tx.prepare_cached(CONTACT_SENT_SQL)?.execute(rusqlite::params![instance, phone, at])?;
    Ok(())
}

fn review_values(log_id: i64, e: &LogEntry, r: &ReviewItem) -> Vec<SqlValue> {
    let text = |s: &Option<String>| s.clone().map_or(SqlValue::Null, SqlValue::Text);
    vec![
        SqlValue::Integer(log_id),
        SqlValue::Text(e.customer_id.clone()),
        text(&e.instance_id),
        SqlValue::Text(e.source.clone()),
        text(&e.purpose),
        text(&e.recipient),
        text(&e.message_type),
        text(&r.text),
        SqlValue::Text(r.policy.clone()),
        SqlValue::Text(r.reason.clone()),
        SqlValue::Integer(i64::from(r.risk_score)),
        SqlValue::Integer(e.created_at),
    ]
}

/// A log row as the batch functions read it.
pub(super) fn log_json(e: &LogEntry) -> serde_json::Value {
    serde_json::json!({
        "customer_id": e.customer_id, "instance_id": e.instance_id, "api_key_id": e.api_key_id,
        "source": e.source, "purpose": e.purpose, "recipient": e.recipient,
        "message_type": e.message_type, "decision": e.decision, "error_code": e.error_code,
        "policy": e.policy, "reason": e.reason, "provider_message_id": e.provider_message_id,
        "status": e.status, "created_at": e.created_at, "policy_trace": e.policy_trace,
        "request_id": e.request_id, "correlation_id": e.correlation_id, "went_out": went_out(e),
    })
}

/// An outbox event as the batch functions read it.
pub(super) fn outbox_json(v: &OutboxEvent) -> serde_json::Value {
    serde_json::json!({
        "customer_id": v.customer_id, "instance_id": v.instance_id, "event_type": v.event_type,
        "payload": v.payload, "created_at": v.created_at,
    })
}

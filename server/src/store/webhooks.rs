//! Customer webhook endpoints, the delivery state of outbox events, and the attempt log.
//!
//! Claiming: a due row (`delivered_at IS NULL AND available_at <= now`) is claimed by
//! moving its `available_at` to the end of a lease, in one statement; on PostgreSQL the
//! candidate rows are locked with `FOR UPDATE SKIP LOCKED`, so two replicas never claim
//! the same row, and on SQLite the single writer serialises claims. A claim that is
//! never finished (crash) becomes due again when its lease ends. Finishing an attempt
//! (its log row, the event's next state, the endpoint's failure clock) is one write of
//! the group-commit writer.

use super::writer::{Exec, PgAnswer, Postgres, Statement, Write, sqlite_exec};
use super::{Backend, Cols, Forget, FromCols, Store, StoreError, flag, now_ms};
use rusqlite::types::Value as SqlValue;
use sqlx::Row;

/// A customer's webhook destination for one instance.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WebhookEndpoint {
    pub instance_id: String,
    pub instance_name: String,
    pub customer_id: String,
    pub url: String,
    pub events: Vec<String>,
    pub secret: Option<String>,
    pub previous_secret: Option<String>,
    pub previous_secret_until: Option<i64>,
    pub disabled_at: Option<i64>,
    pub disabled_reason: Option<String>,
    pub failing_since: Option<i64>,
    pub created_at: i64,
    pub updated_at: i64,
}

impl WebhookEndpoint {
    /// Whether the endpoint wants this event.
    pub fn wants(&self, event_type: &str) -> bool {
        self.events.iter().any(|e| e == event_type)
    }

    /// The secrets that sign a delivery at `now`: the current one, and the previous one
    /// during its overlap.
    pub fn signing_secrets(&self, now: i64) -> Vec<&str> {
        let mut secrets: Vec<&str> = self.secret.as_deref().into_iter().collect();
        if let (Some(old), Some(until)) = (&self.previous_secret, self.previous_secret_until)
            && until > now
        {
            secrets.push(old);
        }
        secrets
    }
}

impl FromCols for WebhookEndpoint {
    fn from_cols(r: &impl Cols) -> Result<Self, StoreError> {
        let events: String = r.col("events")?;
        Ok(WebhookEndpoint {
            instance_id: r.col("instance_id")?,
            instance_name: r.col("instance_name")?,
            customer_id: r.col("customer_id")?,
            url: r.col("url")?,
            events: events.split(',').filter(|e| !e.is_empty()).map(str::to_string).collect(),
            secret: r.col("secret")?,
            previous_secret: r.col("previous_secret")?,
            previous_secret_until: r.col("previous_secret_until")?,
            disabled_at: r.col("disabled_at")?,
            disabled_reason: r.col("disabled_reason")?,
            failing_since: r.col("failing_since")?,
            created_at: r.col("created_at")?,
            updated_at: r.col("updated_at")?,
        })
    }
}

const ENDPOINT_SQL: &str = "SELECT w.instance_id, i.name AS instance_name, w.customer_id, w.url, w.events, \
     w.secret, w.previous_secret, w.previous_secret_until, w.disabled_at, w.disabled_reason, w.failing_since, \
     w.created_at, w.updated_at FROM webhook_endpoints w JOIN instances i ON i.id = w.instance_id \
     WHERE w.instance_id = $1";

/// An outbox event claimed for delivery.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClaimedEvent {
    pub id: i64,
    pub customer_id: String,
    pub instance_id: Option<String>,
    pub event_type: String,
    /// The body to deliver (JSON text, as written with the change that caused it).
    pub payload: String,
    /// Attempts made before this one.
    pub attempts: i64,
    pub created_at: i64,
    pub delivered_at: Option<i64>,
    pub outcome: Option<String>,
}

impl FromCols for ClaimedEvent {
    fn from_cols(r: &impl Cols) -> Result<Self, StoreError> {
        Ok(ClaimedEvent {
            id: r.col("id")?,
            customer_id: r.col("customer_id")?,
            instance_id: r.col("instance_id")?,
            event_type: r.col("event_type")?,
            payload: r.col("payload")?,
            attempts: r.col("attempts")?,
            created_at: r.col("created_at")?,
            delivered_at: r.col("delivered_at")?,
            outcome: r.col("outcome")?,
        })
    }
}

const EVENT_COLUMNS: &str =
    "id, customer_id, instance_id, event_type, payload, attempts, created_at, delivered_at, outcome";

/// The claim, up to the end of its subquery: `$1` the lease's end, `$2` now, `$3` how many.
const CLAIM_SQL: &str = "UPDATE outbox SET available_at = $1, locked_until = $1 WHERE id IN (SELECT id FROM outbox \
     WHERE delivered_at IS NULL AND available_at <= $2 ORDER BY available_at LIMIT $3";

/// The claim on SQLite, as the store's writer runs it (see `Store::claim_events`).
struct Claim {
    now: i64,
    lease_until: i64,
    limit: i64,
}

impl Write for Claim {
    type Output = Vec<ClaimedEvent>;

    fn sqlite(&self, tx: &rusqlite::Transaction<'_>) -> Result<Vec<ClaimedEvent>, StoreError> {
        static SQL: std::sync::LazyLock<String> =
            std::sync::LazyLock::new(|| format!("{CLAIM_SQL}) RETURNING {EVENT_COLUMNS}"));
        let mut stmt = tx.prepare_cached(&SQL)?;
        let params = [SqlValue::Integer(self.lease_until), SqlValue::Integer(self.now), SqlValue::Integer(self.limit)];
        super::bind_dollar(&mut stmt, &params)?;
        let mut rows = stmt.raw_query();
        let mut events = Vec::new();
        while let Some(row) = rows.next()? {
            events.push(ClaimedEvent::from_cols(row)?);
        }
        Ok(events)
    }

    /// Never asked: PostgreSQL claims on a connection of the pool (`FOR UPDATE SKIP LOCKED`).
    fn postgres(&self) -> Postgres {
        Postgres::Statements(Vec::new())
    }

    fn read_postgres(&self, _answer: PgAnswer) -> Result<Vec<ClaimedEvent>, StoreError> {
        Err(StoreError::Conflict("the SQLite claim of webhook events ran on PostgreSQL".into()))
    }
}

/// One delivery attempt as logged.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WebhookAttempt {
    pub id: i64,
    pub outbox_id: Option<i64>,
    pub customer_id: String,
    pub instance_id: String,
    pub event_type: String,
    pub url: String,
    /// `scheduled`, `manual` or `test`.
    pub trigger: String,
    pub attempt: i64,
    pub attempted_at: i64,
    pub status_code: Option<i64>,
    pub latency_ms: i64,
    pub response_body: Option<String>,
    pub error: Option<String>,
    pub succeeded: bool,
}

impl FromCols for WebhookAttempt {
    fn from_cols(r: &impl Cols) -> Result<Self, StoreError> {
        Ok(WebhookAttempt {
            id: r.col("id")?,
            outbox_id: r.col("outbox_id")?,
            customer_id: r.col("customer_id")?,
            instance_id: r.col("instance_id")?,
            event_type: r.col("event_type")?,
            url: r.col("url")?,
            trigger: r.col("trigger_kind")?,
            attempt: r.col("attempt")?,
            attempted_at: r.col("attempted_at")?,
            status_code: r.col("status_code")?,
            latency_ms: r.col("latency_ms")?,
            response_body: r.col("response_body")?,
            error: r.col("error")?,
            succeeded: flag(r.col("succeeded")?),
        })
    }
}

pub(super) const ATTEMPT_COLUMNS: &str = "id, outbox_id, customer_id, instance_id, event_type, url, trigger_kind, attempt, \
     attempted_at, status_code, latency_ms, response_body, error, succeeded";

/// The nullable integers are cast: a NULL parameter travels as text, which PostgreSQL
/// would not put in a BIGINT column.
const INSERT_ATTEMPT_SQL: &str = "INSERT INTO webhook_attempts (outbox_id, customer_id, instance_id, event_type, \
     url, trigger_kind, attempt, attempted_at, status_code, latency_ms, response_body, error, succeeded) \
     VALUES (CAST($1 AS BIGINT), $2, $3, $4, $5, $6, $7, $8, CAST($9 AS BIGINT), $10, $11, $12, $13)";

/// What becomes of an event after an attempt (or without one).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EventState {
    /// Finished with this outcome (`delivered`, `failed`, `gone`, `skipped_...`).
    Done(&'static str),
    /// Try again at this time.
    Retry { at: i64 },
    /// Leave the event's state as it is (a manual or test attempt on a finished event).
    Unchanged,
}

/// What an attempt does to its endpoint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EndpointChange {
    None,
    /// A success: the failure clock stops.
    Succeeded,
    /// A failure: the failure clock starts (if it is not running).
    Failed,
    /// Disable the endpoint, with the reason shown to its owner.
    Disable(String),
}

impl Store {
    /// Creates or replaces the endpoint of an instance (enabled, failure clock reset;
    /// the previous secret stops signing).
    pub async fn set_webhook(
        &self,
        instance_id: &str,
        url: &str,
        events: &[String],
        secret: Option<&str>,
    ) -> Result<WebhookEndpoint, StoreError> {
        let row = sqlx::query("SELECT customer_id FROM instances WHERE id = $1")
            .bind(instance_id)
            .fetch_optional(&self.write)
            .await?
            .ok_or_else(|| StoreError::NotFound(format!("instance {instance_id}")))?;
        let customer_id: String = row.try_get("customer_id")?;
        let now = now_ms();
        sqlx::query(
            "INSERT INTO webhook_endpoints (instance_id, customer_id, url, events, secret, created_at, updated_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $6) ON CONFLICT (instance_id) DO UPDATE SET url = excluded.url, \
             events = excluded.events, secret = excluded.secret, previous_secret = NULL, \
             previous_secret_until = NULL, disabled_at = NULL, disabled_reason = NULL, failing_since = NULL, \
             updated_at = excluded.updated_at",
        )
        .bind(instance_id)
        .bind(&customer_id)
        .bind(url)
        .bind(events.join(","))
        .bind(secret.map(str::to_string))
        .bind(now)
        .execute(&self.write)
        .await?;
        self.webhook(instance_id).await?.ok_or_else(|| StoreError::NotFound(format!("webhook of {instance_id}")))
    }

    /// The endpoint of an instance.
    pub async fn webhook(&self, instance_id: &str) -> Result<Option<WebhookEndpoint>, StoreError> {
        self.read_one(ENDPOINT_SQL, vec![SqlValue::Text(instance_id.to_string())]).await
    }

    /// Replaces the signing secret; the old one keeps signing until `previous_until`.
    pub async fn rotate_webhook_secret(
        &self,
        instance_id: &str,
        secret: &str,
        previous_until: i64,
    ) -> Result<(), StoreError> {
        let update = sqlx::query(
            "UPDATE webhook_endpoints SET previous_secret = secret, previous_secret_until = CASE WHEN secret IS NULL \
             THEN NULL ELSE $1 END, secret = $2, updated_at = $3 WHERE instance_id = $4",
        )
        .bind(previous_until)
        .bind(secret)
        .bind(now_ms())
        .bind(instance_id);
        self.update_one(update, Forget::Nothing, || format!("webhook of instance {instance_id}")).await?;
        Ok(())
    }

    /// Re-enables a disabled endpoint and resets its failure clock.
    pub async fn enable_webhook(&self, instance_id: &str) -> Result<(), StoreError> {
        let update = sqlx::query(
            "UPDATE webhook_endpoints SET disabled_at = NULL, disabled_reason = NULL, failing_since = NULL, \
             updated_at = $1 WHERE instance_id = $2",
        )
        .bind(now_ms())
        .bind(instance_id);
        self.update_one(update, Forget::Nothing, || format!("webhook of instance {instance_id}")).await?;
        Ok(())
    }

    /// Claims up to `limit` due events until `lease_until`, oldest due first.
    ///
    /// On SQLite the claim runs in the store's writer, between the other writes: on a
    /// connection of its own it took the write lock beside the writer, and each side
    /// that met the other slept in SQLite's busy handler (BENCHMARKS.md, issue 22).
    pub async fn claim_events(&self, now: i64, lease_until: i64, limit: i64) -> Result<Vec<ClaimedEvent>, StoreError> {
        let mut events = if self.backend == Backend::Sqlite {
            self.write(Claim { now, lease_until, limit }).await?
        } else {
            let sql = format!("{CLAIM_SQL} FOR UPDATE SKIP LOCKED) RETURNING {EVENT_COLUMNS}");
            let rows = sqlx::query(&sql).bind(lease_until).bind(now).bind(limit).fetch_all(&self.write).await?;
            rows.iter().map(ClaimedEvent::from_cols).collect::<Result<Vec<_>, _>>()?
        };
        events.sort_by_key(|e| e.id);
        Ok(events)
    }

    /// Makes claimed events due again at once (a graceful shutdown gives back what it
    /// did not start).
    pub async fn release_events(&self, ids: &[i64]) -> Result<(), StoreError> {
        let now = now_ms();
        let statements = ids
            .iter()
            .map(|id| Statement {
                sql: "UPDATE outbox SET available_at = $1, locked_until = NULL WHERE id = $2 AND delivered_at IS NULL",
                params: vec![SqlValue::Integer(now), SqlValue::Integer(*id)],
            })
            .collect();
        self.write(Exec(statements)).await.map(|_| ())
    }

    /// Claimed events done undelivered (`skipped_...`), each with its outcome, in one
    /// write: one statement per outcome, the ids as a JSON array.
    pub async fn skip_events(&self, skipped: &[(i64, &'static str)]) -> Result<(), StoreError> {
        if skipped.is_empty() {
            return Ok(());
        }
        let now = now_ms();
        let mut by_outcome: std::collections::BTreeMap<&str, Vec<i64>> = std::collections::BTreeMap::new();
        for (id, outcome) in skipped {
            by_outcome.entry(outcome).or_default().push(*id);
        }
        let sql = match self.backend {
            Backend::Sqlite => SKIP_SQLITE,
            Backend::Postgres => SKIP_POSTGRES,
        };
        let statements = by_outcome
            .into_iter()
            .map(|(outcome, ids)| Statement {
                sql,
                params: vec![
                    SqlValue::Integer(now),
                    SqlValue::Text(outcome.to_string()),
                    SqlValue::Text(serde_json::Value::from(ids).to_string()),
                ],
            })
            .collect();
        self.write(SkipEvents(Exec(statements))).await.map(|_| ())
    }

    /// One outbox event.
    pub async fn outbox_event(&self, id: i64) -> Result<Option<ClaimedEvent>, StoreError> {
        let row = sqlx::query(&format!("SELECT {EVENT_COLUMNS} FROM outbox WHERE id = $1"))
            .bind(id)
            .fetch_optional(&self.write)
            .await?;
        row.as_ref().map(ClaimedEvent::from_cols).transpose()
    }

    /// Records an attempt (when there was one) with the event's next state and the
    /// endpoint's change, in one transaction.
    pub async fn finish_attempt(
        &self,
        event_id: Option<i64>,
        attempt: Option<&WebhookAttempt>,
        state: EventState,
        endpoint: EndpointChange,
    ) -> Result<(), StoreError> {
        let now = now_ms();
        let mut statements = Vec::with_capacity(3);
        // The statements serve SQLite; PostgreSQL gets the same writes as one JSON
        // object for `gateway_webhook_finish` (see `finish_json`).
        if let Some(a) = attempt {
            let text = |s: &Option<String>| s.clone().map_or(SqlValue::Null, SqlValue::Text);
            statements.push(Statement {
                sql: INSERT_ATTEMPT_SQL,
                params: vec![
                    a.outbox_id.map_or(SqlValue::Null, SqlValue::Integer),
                    SqlValue::Text(a.customer_id.clone()),
                    SqlValue::Text(a.instance_id.clone()),
                    SqlValue::Text(a.event_type.clone()),
                    SqlValue::Text(a.url.clone()),
                    SqlValue::Text(a.trigger.clone()),
                    SqlValue::Integer(a.attempt),
                    SqlValue::Integer(a.attempted_at),
                    a.status_code.map_or(SqlValue::Null, SqlValue::Integer),
                    SqlValue::Integer(a.latency_ms),
                    text(&a.response_body),
                    text(&a.error),
                    SqlValue::Integer(i64::from(a.succeeded)),
                ],
            });
        }
        if let Some(id) = event_id {
            let counted = i64::from(attempt.is_some_and(|a| a.trigger == "scheduled"));
            match &state {
                EventState::Done(outcome) => statements.push(Statement {
                    sql: "UPDATE outbox SET attempts = attempts + $1, delivered_at = $2, outcome = $3, \
                          locked_until = NULL WHERE id = $4",
                    params: vec![
                        SqlValue::Integer(counted),
                        SqlValue::Integer(now),
                        SqlValue::Text(outcome.to_string()),
                        SqlValue::Integer(id),
                    ],
                }),
                EventState::Retry { at } => statements.push(Statement {
                    sql: "UPDATE outbox SET attempts = attempts + $1, available_at = $2, locked_until = NULL \
                          WHERE id = $3",
                    params: vec![SqlValue::Integer(counted), SqlValue::Integer(*at), SqlValue::Integer(id)],
                }),
                EventState::Unchanged => {}
            }
        }
        if let Some(a) = attempt {
            let instance = SqlValue::Text(a.instance_id.clone());
            match &endpoint {
                EndpointChange::None => {}
                EndpointChange::Succeeded => statements.push(Statement {
                    sql: "UPDATE webhook_endpoints SET failing_since = NULL WHERE instance_id = $1 \
                          AND failing_since IS NOT NULL",
                    params: vec![instance],
                }),
                EndpointChange::Failed => statements.push(Statement {
                    sql: "UPDATE webhook_endpoints SET failing_since = $1 WHERE instance_id = $2 \
                          AND failing_since IS NULL",
                    params: vec![SqlValue::Integer(a.attempted_at), instance],
                }),
                EndpointChange::Disable(reason) => statements.push(Statement {
                    sql: "UPDATE webhook_endpoints SET disabled_at = $1, disabled_reason = $2, \
                          failing_since = COALESCE(failing_since, $1) WHERE instance_id = $3",
                    params: vec![SqlValue::Integer(now), SqlValue::Text(reason.clone()), instance],
                }),
            }
        }
        if statements.is_empty() {
            return Ok(());
        }
        if self.backend == Backend::Postgres {
            let finish = finish_json(event_id, attempt, &state, &endpoint, now);
            return self.write(FinishDelivery { statements, finish }).await;
        }
        self.write(Exec(statements)).await.map(|_| ())
    }

    /// Attempts of one event, oldest first.
    pub async fn attempts_of_event(&self, outbox_id: i64) -> Result<Vec<WebhookAttempt>, StoreError> {
        let rows =
            sqlx::query(&format!("SELECT {ATTEMPT_COLUMNS} FROM webhook_attempts WHERE outbox_id = $1 ORDER BY id"))
                .bind(outbox_id)
                .fetch_all(&self.write)
                .await?;
        rows.iter().map(WebhookAttempt::from_cols).collect()
    }

    /// The latest attempts to an instance's endpoint, newest first.
    pub async fn recent_attempts(&self, instance_id: &str, limit: i64) -> Result<Vec<WebhookAttempt>, StoreError> {
        let rows = sqlx::query(&format!(
            "SELECT {ATTEMPT_COLUMNS} FROM webhook_attempts WHERE instance_id = $1 ORDER BY id DESC LIMIT $2"
        ))
        .bind(instance_id)
        .bind(limit)
        .fetch_all(&self.write)
        .await?;
        rows.iter().map(WebhookAttempt::from_cols).collect()
    }

    /// Makes the instance's events since `since` that were not delivered (failed, gone,
    /// skipped while the endpoint was disabled) due again with a fresh schedule; how many.
    pub async fn recover_events(&self, instance_id: &str, since: i64) -> Result<u64, StoreError> {
        let done = sqlx::query(
            "UPDATE outbox SET delivered_at = NULL, outcome = NULL, attempts = 0, available_at = $1, \
             locked_until = NULL WHERE instance_id = $2 AND created_at >= $3 \
             AND outcome IN ('failed', 'gone', 'skipped_disabled')",
        )
        .bind(now_ms())
        .bind(instance_id)
        .bind(since)
        .execute(&self.write)
        .await?;
        Ok(done.rows_affected())
    }
}

/// The writes of `finish_attempt` as `gateway_webhook_finish` reads them.
fn finish_json(
    event_id: Option<i64>,
    attempt: Option<&WebhookAttempt>,
    state: &EventState,
    endpoint: &EndpointChange,
    now: i64,
) -> serde_json::Value {
    let attempt = attempt.map(|a| {
        serde_json::json!({
            "outbox_id": a.outbox_id, "customer_id": a.customer_id, "instance_id": a.instance_id,
            "event_type": a.event_type, "url": a.url, "trigger": a.trigger, "attempt": a.attempt,
            "attempted_at": a.attempted_at, "status_code": a.status_code, "latency_ms": a.latency_ms,
            "response_body": a.response_body, "error": a.error, "succeeded": i64::from(a.succeeded),
        })
    });
    let counted = i64::from(attempt.as_ref().is_some_and(|a| a["trigger"] == "scheduled"));
    let (state, outcome, at) = match state {
        EventState::Done(outcome) => ("done", Some(*outcome), None),
        EventState::Retry { at } => ("retry", None, Some(*at)),
        EventState::Unchanged => ("none", None, None),
    };
    let (change, reason) = match endpoint {
        EndpointChange::None => ("none", None),
        EndpointChange::Succeeded => ("succeeded", None),
        EndpointChange::Failed => ("failed", None),
        EndpointChange::Disable(reason) => ("disable", Some(reason.as_str())),
    };
    serde_json::json!({
        "event_id": event_id, "attempt": attempt, "state": state, "outcome": outcome, "at": at,
        "counted": counted, "change": change, "reason": reason, "now": now,
    })
}

/// Events done without an attempt (`Store::skip_events`); `$3` is a JSON array of ids.
/// On PostgreSQL the ids are one array the primary key is searched with: as `id IN
/// (SELECT ...)` the planner guessed 100 ids and read the whole outbox with a hash semi
/// join until the outbox was large (`BENCHMARKS.md`, issue 22). SQLite looks each up by
/// its rowid either way.
pub const SKIP_SQLITE: &str = "UPDATE outbox SET delivered_at = $1, outcome = $2, locked_until = NULL \
     WHERE id IN (SELECT value FROM json_each($3))";
pub const SKIP_POSTGRES: &str = "UPDATE outbox SET delivered_at = $1, outcome = $2, locked_until = NULL \
     WHERE id = ANY (ARRAY(SELECT jsonb_array_elements_text($3::jsonb)::bigint))";

/// `skip_events`' statements: plain statements (`Exec`), in the delivery lane with the
/// other outcomes of the dispatcher.
struct SkipEvents(Exec);

impl Write for SkipEvents {
    type Output = Vec<u64>;

    fn sqlite(&self, tx: &rusqlite::Transaction<'_>) -> Result<Vec<u64>, StoreError> {
        self.0.sqlite(tx)
    }

    fn postgres(&self) -> Postgres {
        self.0.postgres()
    }

    fn read_postgres(&self, answer: PgAnswer) -> Result<Vec<u64>, StoreError> {
        self.0.read_postgres(answer)
    }

    fn lane(&self) -> usize {
        super::writer::lane::DELIVERY
    }
}

/// The end of a delivery attempt: its statements on SQLite; on PostgreSQL one element of
/// `gateway_webhook_finish` (migration 0004), which does the same writes.
struct FinishDelivery {
    statements: Vec<Statement>,
    finish: serde_json::Value,
}

impl Write for FinishDelivery {
    type Output = ();

    fn sqlite(&self, tx: &rusqlite::Transaction<'_>) -> Result<(), StoreError> {
        self.statements.iter().try_for_each(|st| sqlite_exec(tx, st).map(|_| ()))
    }

    fn postgres(&self) -> Postgres {
        Postgres::Call { function: "gateway_webhook_finish", arg: self.finish.clone() }
    }

    fn read_postgres(&self, _: PgAnswer) -> Result<(), StoreError> {
        Ok(())
    }

    fn lane(&self) -> usize {
        super::writer::lane::DELIVERY
    }
}

#[cfg(test)]
#[path = "webhooks_tests.rs"]
mod tests;

//! What the policy modules saw of each send (the context, text and counters included),
//! kept `[policies] input_retention_days` so that `gateway policy backtest` can ask a
//! new module about the recent past exactly as the live modules were asked, and the
//! message-log rows whose traces carry shadow verdicts (`gateway policy shadow`).
//!
//! The inputs are written after their send's row, in batches (`policy::inputs`): a row
//! is only written while its message-log row exists and is not erased, so an erasure
//! that ran first is never undone by a late batch.

use super::privacy::ERASED;
use super::writer::{Exec, Statement};
use super::{Backend, Cols, FromCols, Store, StoreError};
use rusqlite::types::Value as SqlValue;

/// One kept input with what its send became.
#[derive(Clone, Debug)]
pub struct KeptInput {
    pub log_id: i64,
    pub customer_id: String,
    pub created_at: i64,
    /// The context as JSON (`gateway_policy_model::Context`), at the purpose stage.
    pub context: String,
    /// The send's row: `allowed` or `refused`.
    pub decision: String,
    pub status: String,
    pub error_code: Option<String>,
    pub policy: Option<String>,
    pub policy_trace: Option<String>,
}

impl FromCols for KeptInput {
    fn from_cols(r: &impl Cols) -> Result<KeptInput, StoreError> {
        Ok(KeptInput {
            log_id: r.col("log_id")?,
            customer_id: r.col("customer_id")?,
            created_at: r.col("created_at")?,
            context: r.col("context")?,
            decision: r.col("decision")?,
            status: r.col("status")?,
            error_code: r.col("error_code")?,
            policy: r.col("policy")?,
            policy_trace: r.col("policy_trace")?,
        })
    }
}

/// Which kept inputs (or traced rows) to read: newest first, below `before` (a log id).
#[derive(Clone, Debug)]
pub struct PolicyInputQuery {
    /// The oldest log id to read (`Store::first_log_id_since`).
    pub from: i64,
    pub before: i64,
    pub customer_id: Option<String>,
    pub limit: i64,
}

/// Keeps one input on SQLite: `$1` the log id, `$2` the context, `$3` the erased mark.
pub const KEEP_SQL: &str = "INSERT INTO policy_inputs (log_id, customer_id, created_at, context) \
     SELECT id, customer_id, created_at, $2 FROM message_log WHERE id = $1 \
     AND (recipient IS NULL OR recipient <> $3) ON CONFLICT (log_id) DO NOTHING";

/// The same for a whole batch on PostgreSQL, in one statement and one round trip (`$1`
/// a JSON list of `{log_id, context}`, `$2` the erased mark). Each input finds its row
/// by the primary key: the `LIMIT 1` keeps the lookup a lateral subquery the planner
/// cannot turn into a join. As a join, it counted the batch as 100 rows (any
/// set-returning function's guess) and read the whole message log with a hash join
/// while the log was under some tens of thousands of rows: the first cost of a
/// PostgreSQL send (`BENCHMARKS.md`, issue 22).
pub const KEEP_BATCH_POSTGRES: &str = "INSERT INTO policy_inputs (log_id, customer_id, created_at, context) \
     SELECT m.id, m.customer_id, m.created_at, i.context FROM jsonb_to_recordset($1::jsonb) AS i(log_id BIGINT, context TEXT) \
     CROSS JOIN LATERAL (SELECT id, customer_id, created_at FROM message_log \
       WHERE id = i.log_id AND (recipient IS NULL OR recipient <> $2) LIMIT 1) m \
     ON CONFLICT (log_id) DO NOTHING";

impl Store {
    /// Keeps `(log id, context JSON)` pairs, in one write; the rows written. On SQLite
    /// through the writer (one statement each, prepared once, in one transaction); on
    /// PostgreSQL as one statement on a connection of its own, beside the writer's lanes
    /// (a statement per input there would hold the main lane for a round trip each).
    pub async fn keep_policy_inputs(&self, inputs: Vec<(i64, String)>) -> Result<u64, StoreError> {
        match self.backend {
            Backend::Sqlite => {
                let statements = inputs
                    .into_iter()
                    .map(|(log_id, context)| Statement {
                        sql: KEEP_SQL,
                        params: vec![SqlValue::Integer(log_id), SqlValue::Text(context), SqlValue::Text(ERASED.into())],
                    })
                    .collect();
                Ok(self.write(Exec(statements)).await?.iter().sum())
            }
            Backend::Postgres => {
                let rows: Vec<serde_json::Value> = inputs
                    .into_iter()
                    .map(|(log_id, context)| serde_json::json!({"log_id": log_id, "context": context}))
                    .collect();
                let done = sqlx::query(KEEP_BATCH_POSTGRES)
                    .bind(serde_json::Value::Array(rows).to_string())
                    .bind(ERASED)
                    .execute(&self.write)
                    .await?;
                Ok(done.rows_affected())
            }
        }
    }

    /// The first message-log id written at or after `since` (Unix ms), or one past the
    /// newest when there is none.
    pub async fn first_log_id_since(&self, since: i64) -> Result<i64, StoreError> {
        let row = sqlx::query(
            "SELECT COALESCE((SELECT MIN(id) FROM message_log WHERE created_at >= $1), \
             (SELECT COALESCE(MAX(id), 0) + 1 FROM message_log)) AS id",
        )
        .bind(since)
        .fetch_one(&self.read)
        .await?;
        row.col("id")
    }

    /// Kept inputs with their sends' rows, newest first.
    pub async fn policy_inputs_page(&self, q: &PolicyInputQuery) -> Result<Vec<KeptInput>, StoreError> {
        let customer = if q.customer_id.is_some() { " AND p.customer_id = $4" } else { "" };
        let sql = format!(
            "SELECT p.log_id, p.customer_id, p.created_at, p.context, m.decision, m.status, m.error_code, m.policy, \
             m.policy_trace FROM policy_inputs p JOIN message_log m ON m.id = p.log_id \
             WHERE p.log_id >= $1 AND p.log_id < $2{customer} ORDER BY p.log_id DESC LIMIT $3"
        );
        let mut query = sqlx::query(&sql).bind(q.from).bind(q.before).bind(q.limit);
        if let Some(customer) = &q.customer_id {
            query = query.bind(customer.clone());
        }
        let rows = query.fetch_all(&self.read).await?;
        rows.iter().map(KeptInput::from_cols).collect()
    }

    /// Message-log rows whose trace holds a shadow verdict, newest first, as
    /// `KeptInput`s without a context.
    pub async fn shadow_traced_page(&self, q: &PolicyInputQuery) -> Result<Vec<KeptInput>, StoreError> {
        let customer = if q.customer_id.is_some() { " AND customer_id = $4" } else { "" };
        let sql = format!(
            "SELECT id AS log_id, customer_id, created_at, '' AS context, decision, status, error_code, policy, \
             policy_trace FROM message_log WHERE id >= $1 AND id < $2 AND policy_trace LIKE '%\"mode\":\"shadow\"%'\
             {customer} ORDER BY id DESC LIMIT $3"
        );
        let mut query = sqlx::query(&sql).bind(q.from).bind(q.before).bind(q.limit);
        if let Some(customer) = &q.customer_id {
            query = query.bind(customer.clone());
        }
        let rows = query.fetch_all(&self.read).await?;
        rows.iter().map(KeptInput::from_cols).collect()
    }
}

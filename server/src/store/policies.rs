//! The policy engine's records: what each running gateway's policy host runs, the
//! `policy reload`/`rollback` commands they carry out, and the review queue.

use super::{Cols, Forget, FromCols, Store, StoreError, now_ms};
use sqlx::Row;

/// A running gateway's policy status row.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PolicyGateway {
    pub gateway_id: String,
    pub host: String,
    pub pid: i64,
    pub started_at: i64,
    pub heartbeat_at: i64,
    /// The last command id it carried out (or skipped as older than its start).
    pub command_seen: i64,
    /// Its `HostStatus`, as JSON.
    pub status: String,
}

impl FromCols for PolicyGateway {
    fn from_cols(r: &impl Cols) -> Result<PolicyGateway, StoreError> {
        Ok(PolicyGateway {
            gateway_id: r.col("gateway_id")?,
            host: r.col("host")?,
            pid: r.col("pid")?,
            started_at: r.col("started_at")?,
            heartbeat_at: r.col("heartbeat_at")?,
            command_seen: r.col("command_seen")?,
            status: r.col("status")?,
        })
    }
}

/// A send waiting for (or done with) an operator's review.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReviewEntry {
    pub id: i64,
    pub log_id: i64,
    pub customer_id: String,
    pub instance_id: String,
    pub source: String,
    pub purpose: Option<String>,
    pub recipient: Option<String>,
    pub message_type: Option<String>,
    pub text: Option<String>,
    pub policy: String,
    pub reason: String,
    pub risk_score: i64,
    /// `pending`, `dismissed` (not abuse) or `confirmed` (abuse).
    pub status: String,
    pub created_at: i64,
    pub decided_at: Option<i64>,
    pub decided_by: Option<String>,
    pub note: Option<String>,
}

const REVIEW_COLUMNS: &str = "id, log_id, customer_id, instance_id, source, purpose, recipient, message_type, text, \
     policy, reason, risk_score, status, created_at, decided_at, decided_by, note";

impl FromCols for ReviewEntry {
    fn from_cols(r: &impl Cols) -> Result<ReviewEntry, StoreError> {
        Ok(ReviewEntry {
            id: r.col("id")?,
            log_id: r.col("log_id")?,
            customer_id: r.col("customer_id")?,
            instance_id: r.col("instance_id")?,
            source: r.col("source")?,
            purpose: r.col("purpose")?,
            recipient: r.col("recipient")?,
            message_type: r.col("message_type")?,
            text: r.col("text")?,
            policy: r.col("policy")?,
            reason: r.col("reason")?,
            risk_score: r.col("risk_score")?,
            status: r.col("status")?,
            created_at: r.col("created_at")?,
            decided_at: r.col("decided_at")?,
            decided_by: r.col("decided_by")?,
            note: r.col("note")?,
        })
    }
}

impl Store {
    /// Writes (or refreshes) a gateway's policy status row.
    pub async fn put_policy_gateway(&self, g: &PolicyGateway) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO policy_gateways (gateway_id, host, pid, started_at, heartbeat_at, command_seen, status) \
             VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (gateway_id) DO UPDATE SET \
             heartbeat_at = excluded.heartbeat_at, command_seen = excluded.command_seen, status = excluded.status",
        )
        .bind(&g.gateway_id)
        .bind(&g.host)
        .bind(g.pid)
        .bind(g.started_at)
        .bind(g.heartbeat_at)
        .bind(g.command_seen)
        .bind(&g.status)
        .execute(&self.write)
        .await?;
        Ok(())
    }

    /// Gateways that reported since `since`, newest first.
    pub async fn policy_gateways(&self, since: i64) -> Result<Vec<PolicyGateway>, StoreError> {
        let rows = sqlx::query(
            "SELECT gateway_id, host, pid, started_at, heartbeat_at, command_seen, status FROM policy_gateways \
             WHERE heartbeat_at >= $1 ORDER BY started_at DESC",
        )
        .bind(since)
        .fetch_all(&self.read)
        .await?;
        rows.iter().map(PolicyGateway::from_cols).collect()
    }

    /// Queues a command for every running gateway; returns its id.
    pub async fn add_policy_command(&self, command: &str, name: Option<&str>) -> Result<i64, StoreError> {
        let row =
            sqlx::query("INSERT INTO policy_commands (command, name, created_at) VALUES ($1, $2, $3) RETURNING id")
                .bind(command)
                .bind(name)
                .bind(now_ms())
                .fetch_one(&self.write)
                .await?;
        Ok(row.try_get("id")?)
    }

    /// The newest command id (0 without any).
    pub async fn latest_policy_command(&self) -> Result<i64, StoreError> {
        let row = sqlx::query("SELECT MAX(id) AS id FROM policy_commands").fetch_one(&self.read).await?;
        Ok(row.try_get::<Option<i64>, _>("id")?.unwrap_or(0))
    }

    /// Commands after `id`, oldest first: (id, command, name).
    pub async fn policy_commands_after(&self, id: i64) -> Result<Vec<(i64, String, Option<String>)>, StoreError> {
        let rows = sqlx::query("SELECT id, command, name FROM policy_commands WHERE id > $1 ORDER BY id")
            .bind(id)
            .fetch_all(&self.read)
            .await?;
        rows.iter().map(|r| Ok((r.try_get("id")?, r.try_get("command")?, r.try_get("name")?))).collect()
    }

    /// Review items with this status (all when `None`), newest first.
    pub async fn review_queue(
        &self,
        status: Option<&str>,
        customer_id: Option<&str>,
        limit: i64,
        before_id: Option<i64>,
    ) -> Result<Vec<ReviewEntry>, StoreError> {
        let sql = format!(
            "SELECT {REVIEW_COLUMNS} FROM review_queue WHERE ($1 IS NULL OR status = $1) \
             AND ($2 IS NULL OR customer_id = $2) AND ($3 IS NULL OR id < $3) ORDER BY id DESC LIMIT $4"
        );
        let rows =
            sqlx::query(&sql).bind(status).bind(customer_id).bind(before_id).bind(limit).fetch_all(&self.read).await?;
        rows.iter().map(ReviewEntry::from_cols).collect()
    }

    /// One review item.
    pub async fn review_entry(&self, id: i64) -> Result<ReviewEntry, StoreError> {
        let sql = format!("SELECT {REVIEW_COLUMNS} FROM review_queue WHERE id = $1");
        let row = sqlx::query(&sql).bind(id).fetch_optional(&self.read).await?;
        row.as_ref()
            .map(ReviewEntry::from_cols)
            .transpose()?
            .ok_or_else(|| StoreError::NotFound(format!("review {id}")))
    }

    /// Records an operator's decision on a pending item: `dismissed` (the policy was
    /// wrong) or `confirmed` (abuse).
    pub async fn decide_review(
        &self,
        id: i64,
        verdict: &str,
        by: &str,
        note: Option<&str>,
    ) -> Result<ReviewEntry, StoreError> {
        if !matches!(verdict, "dismissed" | "confirmed") {
            return Err(StoreError::Conflict(format!("a review is dismissed or confirmed, not {verdict:?}")));
        }
        let done = sqlx::query(
            "UPDATE review_queue SET status = $2, decided_at = $3, decided_by = $4, note = $5 \
             WHERE id = $1 AND status = 'pending'",
        )
        .bind(id)
        .bind(verdict)
        .bind(now_ms())
        .bind(by)
        .bind(note)
        .execute(&self.write)
        .await?;
        let entry = self.review_entry(id).await?;
        if done.rows_affected() == 0 {
            return Err(StoreError::Conflict(format!("review {id} was already {}", entry.status)));
        }
        Ok(entry)
    }

    /// Sets the purposes a customer is approved for (`None`: all five).
    pub async fn set_approved_purposes(
        &self,
        customer_id: &str,
        purposes: Option<&[String]>,
    ) -> Result<(), StoreError> {
        let joined = purposes.map(|p| p.join(","));
        let update =
            sqlx::query("UPDATE customers SET approved_purposes = $2 WHERE id = $1").bind(customer_id).bind(joined);
        self.update_one(update, Forget::Cache, || format!("customer {customer_id}")).await?;
        Ok(())
    }
}

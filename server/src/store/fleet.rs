//! What an operator watches across all customers: the webhook backlog, the instances
//! and the webhook endpoints by state (read by the metrics at each scrape).

use super::{Store, StoreError};
use sqlx::Row;

impl Store {
    /// Events not yet delivered, and when the oldest of them was created.
    pub async fn outbox_backlog(&self) -> Result<(i64, Option<i64>), StoreError> {
        let row = sqlx::query("SELECT COUNT(*) AS n, MIN(created_at) AS oldest FROM outbox WHERE delivered_at IS NULL")
            .fetch_one(&self.read)
            .await?;
        Ok((row.try_get("n")?, row.try_get("oldest")?))
    }

    /// Instances counted by (connection state, paused).
    pub async fn instance_states(&self) -> Result<Vec<(String, bool, i64)>, StoreError> {
        let rows = sqlx::query(
            "SELECT connection_state, paused, COUNT(*) AS n FROM instances GROUP BY connection_state, paused",
        )
        .fetch_all(&self.read)
        .await?;
        rows.iter()
            .map(|r| {
                let paused: i64 = r.try_get("paused")?;
                Ok((r.try_get("connection_state")?, paused != 0, r.try_get("n")?))
            })
            .collect()
    }

    /// Webhook endpoints counted by state: `disabled`, `failing` (every delivery since
    /// the last success failed) or `ok`.
    pub async fn webhook_endpoint_states(&self) -> Result<Vec<(String, i64)>, StoreError> {
        let rows = sqlx::query(
            "SELECT CASE WHEN disabled_at IS NOT NULL THEN 'disabled' WHEN failing_since IS NOT NULL \
             THEN 'failing' ELSE 'ok' END AS state, COUNT(*) AS n FROM webhook_endpoints GROUP BY 1",
        )
        .fetch_all(&self.read)
        .await?;
        rows.iter().map(|r| Ok((r.try_get("state")?, r.try_get("n")?))).collect()
    }
}

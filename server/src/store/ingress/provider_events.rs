//! Provider posts as received: the secret that admits them, each post stored raw
//! before it is applied (so a post that fails to apply is kept, with its error), and
//! the inbound messages posts left.

use super::super::{Store, StoreError, now_ms};
use sqlx::Row;

impl Store {
    /// The hash of an instance's ingress secret.
    pub async fn ingress_secret_hash(&self, instance_id: &str) -> Result<Option<String>, StoreError> {
        let row = sqlx::query("SELECT ingress_secret_hash FROM instances WHERE id = $1")
            .bind(instance_id)
            .fetch_optional(&self.read)
            .await?;
        Ok(row.map(|r| r.try_get::<Option<String>, _>("ingress_secret_hash")).transpose()?.flatten())
    }

    /// Sets the hash of an instance's ingress secret.
    pub async fn set_ingress_secret_hash(&self, instance_id: &str, hash: &str) -> Result<(), StoreError> {
        sqlx::query("UPDATE instances SET ingress_secret_hash = $1 WHERE id = $2")
            .bind(hash)
            .bind(instance_id)
            .execute(&self.write)
            .await?;
        self.forget_cached();
        Ok(())
    }

    /// Stores a provider post as received; its id.
    pub async fn store_provider_event(&self, instance_id: &str, event: &str, payload: &str) -> Result<i64, StoreError> {
        let row = sqlx::query(
            "INSERT INTO provider_events (instance_id, event, payload, received_at) VALUES ($1, $2, $3, $4) RETURNING id",
        )
        .bind(instance_id)
        .bind(event)
        .bind(payload)
        .bind(now_ms())
        .fetch_one(&self.write)
        .await?;
        Ok(row.try_get("id")?)
    }

    /// How many stored posts could not be applied.
    pub async fn provider_event_failures(&self) -> Result<i64, StoreError> {
        let row = sqlx::query("SELECT COUNT(*) AS n FROM provider_events WHERE error IS NOT NULL")
            .fetch_one(&self.read)
            .await?;
        Ok(row.try_get("n")?)
    }

    /// Records the outcome of applying a stored post.
    pub async fn finish_provider_event(&self, id: i64, error: Option<&str>) -> Result<(), StoreError> {
        sqlx::query("UPDATE provider_events SET processed_at = $1, error = $2 WHERE id = $3")
            .bind(now_ms())
            .bind(error.map(str::to_string))
            .bind(id)
            .execute(&self.write)
            .await?;
        Ok(())
    }

    /// Received messages of a customer, newest first: (sender, text, external id).
    pub async fn recent_inbound(
        &self,
        customer_id: &str,
        limit: i64,
    ) -> Result<Vec<(String, Option<String>, String)>, StoreError> {
        let rows = sqlx::query(
            "SELECT sender, text, external_message_id FROM inbound_messages WHERE customer_id = $1 ORDER BY id DESC LIMIT $2",
        )
        .bind(customer_id)
        .bind(limit)
        .fetch_all(&self.read)
        .await?;
        rows.iter().map(|r| Ok((r.try_get("sender")?, r.try_get("text")?, r.try_get("external_message_id")?))).collect()
    }
}

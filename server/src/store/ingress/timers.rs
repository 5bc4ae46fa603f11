//! What the ingress timers write: conversations whose 24-hour window ended, and the
//! delivery watchdog's failures of sends the provider never acknowledged.

use super::super::{Store, StoreError, now_ms};
use super::{Applied, CONVERSATION_WINDOW_MS, instance_in, write_transaction};
use sqlx::Row;

impl Store {
    /// Reports `conversation.updated` (closed) for every conversation whose window
    /// ended (no message from the contact for 24 hours at `now`); how many.
    pub async fn close_conversations(&self, now: i64) -> Result<usize, StoreError> {
        let mut tx = write_transaction(&self.write).await?;
        let rows = sqlx::query(
            "SELECT instance_id, phone, last_inbound_at FROM contact_activity WHERE last_inbound_at <= $1 \
             AND (window_closed_at IS NULL OR window_closed_at < last_inbound_at) LIMIT 500",
        )
        .bind(now - CONVERSATION_WINDOW_MS)
        .fetch_all(&mut *tx)
        .await?;
        let mut applied = Applied::default();
        for row in &rows {
            let instance_id: String = row.try_get("instance_id")?;
            let phone: String = row.try_get("phone")?;
            let last: i64 = row.try_get("last_inbound_at")?;
            let instance = instance_in(&mut tx, &instance_id).await?;
            let conversation_id = Some(phone.clone());
            emit!(
                &mut tx,
                &instance,
                last + CONVERSATION_WINDOW_MS,
                &mut applied,
                ConversationUpdated { conversation_id, conversation_state: Some("closed".into()) }
            )
            .await?;
            sqlx::query("UPDATE contact_activity SET window_closed_at = $1 WHERE instance_id = $2 AND phone = $3")
                .bind(now)
                .bind(&instance_id)
                .bind(&phone)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(rows.len())
    }

    /// Delivery watchdog: every message an Evolution instance sent before `cutoff`
    /// (and after `since`) that the provider never acknowledged as delivered gets a
    /// `message.failed` with error `no_delivery_ack`, once; how many.
    ///
    /// The rows are looked for without the write lock (on SQLite, a scan under it
    /// stopped every send for as long as it ran, every second: BENCHMARKS.md); each is
    /// then marked by a conditional update that checks again that it is still
    /// unacknowledged and unmarked, and gets its event only if the update took it, in
    /// one transaction, so a report arriving meanwhile, or another replica, wins cleanly.
    pub async fn flag_unacknowledged(&self, cutoff: i64, since: i64) -> Result<usize, StoreError> {
        let rows = sqlx::query(
            "SELECT m.id, m.recipient, m.purpose, m.instance_id FROM message_log m \
             JOIN instances i ON i.id = m.instance_id AND i.provider = 'evolution' \
             WHERE m.status = 'sent' AND m.ack_checked_at IS NULL AND m.created_at <= $1 AND m.created_at > $2 \
             AND m.provider_message_id IS NOT NULL AND NOT EXISTS (SELECT 1 FROM message_status s \
             WHERE s.instance_id = m.instance_id AND s.external_message_id = m.provider_message_id \
             AND s.status_rank >= 2) LIMIT 500",
        )
        .bind(cutoff)
        .bind(since)
        .fetch_all(&self.read)
        .await?;
        if rows.is_empty() {
            return Ok(0);
        }
        let mut tx = write_transaction(&self.write).await?;
        let now = now_ms();
        let mut applied = Applied::default();
        let mut flagged = 0;
        for row in &rows {
            let id: i64 = row.try_get("id")?;
            let taken = sqlx::query(
                "UPDATE message_log SET ack_checked_at = $1 WHERE id = $2 AND status = 'sent' \
                 AND ack_checked_at IS NULL AND NOT EXISTS (SELECT 1 FROM message_status s \
                 WHERE s.instance_id = message_log.instance_id \
                 AND s.external_message_id = message_log.provider_message_id AND s.status_rank >= 2)",
            )
            .bind(now)
            .bind(id)
            .execute(&mut *tx)
            .await?
            .rows_affected();
            if taken == 0 {
                continue;
            }
            let instance_id: String = row.try_get("instance_id")?;
            let instance = instance_in(&mut tx, &instance_id).await?;
            let to: String = row.try_get::<Option<String>, _>("recipient")?.unwrap_or_default();
            let message_purpose: String = row.try_get::<Option<String>, _>("purpose")?.unwrap_or_default();
            emit!(
                &mut tx,
                &instance,
                now,
                &mut applied,
                log = Some(id),
                MessageFailed { to, message_purpose, error: "no_delivery_ack".into() }
            )
            .await?;
            flagged += 1;
        }
        tx.commit().await?;
        Ok(flagged)
    }
}

//! An instance's connection state and pairing QR. A new state is stored at once
//! (sends read it) and recorded as a change; the customer event of a change is written
//! once it has held (`emit_settled_connections`), so a connection that flaps back gets
//! none.

use super::super::{Instance, Store, StoreError, now_ms};
use super::{Applied, instance_in, write_transaction};
use gateway_api::events;
use sqlx::{Any, Row, Transaction};

impl Store {
    /// The latest QR the provider sent for an instance (a data URL, `None` once it
    /// stopped issuing codes) and when.
    pub async fn latest_qr(&self, instance_id: &str) -> Result<(Option<String>, Option<i64>), StoreError> {
        let row = sqlx::query("SELECT qr_code, qr_updated_at FROM instances WHERE id = $1")
            .bind(instance_id)
            .fetch_optional(&self.read)
            .await?
            .ok_or_else(|| StoreError::NotFound(format!("instance {instance_id}")))?;
        Ok((row.try_get("qr_code")?, row.try_get("qr_updated_at")?))
    }

    /// An instance's lifecycle state: `created` (never paired), `qr_pending`,
    /// `connected`, `disconnected`, or `ban_suspected` (closed with a disconnect code
    /// that means the network refuses the number).
    pub async fn lifecycle(&self, instance: &Instance) -> Result<&'static str, StoreError> {
        let change = sqlx::query("SELECT reported FROM connection_changes WHERE instance_id = $1")
            .bind(&instance.id)
            .fetch_optional(&self.read)
            .await?;
        let reported: Option<String> = change.map(|r| r.try_get("reported")).transpose()?;
        Ok(match (instance.connection_state.as_str(), reported.as_deref()) {
            ("open", _) => "connected",
            ("connecting", _) => "qr_pending",
            (_, Some("ban_suspected")) => "ban_suspected",
            (_, Some(_)) => "disconnected",
            (_, None) => "created",
        })
    }

    /// Stores (or clears) an instance's current pairing QR.
    pub async fn store_qr(&self, instance_id: &str, qr: Option<&str>) -> Result<(), StoreError> {
        sqlx::query("UPDATE instances SET qr_code = $1, qr_updated_at = $2 WHERE id = $3")
            .bind(qr.map(str::to_string))
            .bind(now_ms())
            .bind(instance_id)
            .execute(&self.write)
            .await?;
        self.forget_cached();
        Ok(())
    }

    /// Records a connection state read from the provider outside its events (pairing
    /// commands): stored at once, told to customers like any other change.
    pub async fn observe_connection(&self, instance_id: &str, reported: &str) -> Result<(), StoreError> {
        let stored = match reported {
            "open" => "open",
            "connecting" => "connecting",
            _ => "close",
        };
        let mut tx = write_transaction(&self.write).await?;
        let instance = instance_in(&mut tx, instance_id).await?;
        let mut state = instance.connection_state.clone();
        let mut applied = Applied::default();
        change_state(&mut tx, &instance, stored, reported, now_ms(), &mut state, &mut applied).await?;
        tx.commit().await?;
        Ok(())
    }

    /// Writes the `instance.*` event of every connection change that has held since
    /// `settled_before` and differs from what customers were last told; how many.
    /// A connection that flapped back within the period gets no event at all.
    pub async fn emit_settled_connections(&self, settled_before: i64) -> Result<usize, StoreError> {
        let mut tx = write_transaction(&self.write).await?;
        let rows = sqlx::query(
            "SELECT instance_id, state, reported, changed_at FROM connection_changes \
             WHERE changed_at <= $1 AND (emitted_state IS NULL OR emitted_state <> state)",
        )
        .bind(settled_before)
        .fetch_all(&mut *tx)
        .await?;
        let mut applied = Applied::default();
        for row in &rows {
            let instance_id: String = row.try_get("instance_id")?;
            let instance = instance_in(&mut tx, &instance_id).await?;
            let stored: String = row.try_get("state")?;
            let at: i64 = row.try_get("changed_at")?;
            let fields = events::ConnectionFields { connection_state: Some(row.try_get("reported")?) };
            match stored.as_str() {
                "open" => emit!(&mut tx, &instance, at, &mut applied, InstanceConnected { connection: fields }).await?,
                "close" => {
                    emit!(&mut tx, &instance, at, &mut applied, InstanceDisconnected { connection: fields }).await?
                }
                _ => {
                    emit!(&mut tx, &instance, at, &mut applied, InstanceConnectionUpdated { connection: fields })
                        .await?
                }
            }
            sqlx::query(
                "UPDATE connection_changes SET emitted_state = state WHERE instance_id = $1 AND changed_at = $2",
            )
            .bind(&instance.id)
            .bind(at)
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(rows.len())
    }
}

async fn set_state(tx: &mut Transaction<'static, Any>, instance: &Instance, state: &str) -> Result<(), StoreError> {
    sqlx::query("UPDATE instances SET connection_state = $1 WHERE id = $2")
        .bind(state)
        .bind(&instance.id)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

/// Stores a new connection state at once (sends use it) and records the change for
/// the customer event, which `emit_settled_connections` writes once it has held.
pub(super) async fn change_state(
    tx: &mut Transaction<'static, Any>,
    instance: &Instance,
    stored: &str,
    reported: &str,
    at: i64,
    state: &mut String,
    applied: &mut Applied,
) -> Result<(), StoreError> {
    if stored == state.as_str() {
        applied.skipped += 1;
        return Ok(());
    }
    set_state(tx, instance, stored).await?;
    // The first change of an instance starts from the state it had, as if told.
    let previous = std::mem::replace(state, stored.to_string());
    sqlx::query(
        "INSERT INTO connection_changes (instance_id, state, reported, changed_at, emitted_state) \
         VALUES ($1, $2, $3, $4, $5) ON CONFLICT (instance_id) DO UPDATE SET state = excluded.state, \
         reported = excluded.reported, changed_at = excluded.changed_at",
    )
    .bind(&instance.id)
    .bind(stored)
    .bind(reported)
    .bind(at)
    .bind(previous)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

//! Provider events: stored raw, then applied in one transaction (see `ingress`).
//!
//! `provider_events` keeps the posts as received (and the secret that admits them);
//! `apply` holds the domain rules each fact of a post brings; `connection` the
//! instance's connection state and pairing QR, stored at once and told to customers
//! once a change has held; `timers` what the periodic tasks write (conversations whose
//! window closed, sends never acknowledged). Here is what they share: the transaction
//! that takes the write lock first, the outbox event every rule writes, and an
//! instance read inside a transaction.

use super::customer_days::SendCount;
use super::{FromCols, Instance, StoreError, now_ms};
use gateway_api::events;
use serde_json::Value;
use sqlx::{Any, Transaction};

/// Writes the outbox event of type `events::$ty` with these fields (and the base);
/// `log = id` names the message-log row it is about, when there is one.
macro_rules! emit {
    ($tx:expr, $instance:expr, $at:expr, $applied:expr, $ty:ident { $($fields:tt)* }) => {
        emit!($tx, $instance, $at, $applied, log = None, $ty { $($fields)* })
    };
    ($tx:expr, $instance:expr, $at:expr, $applied:expr, log = $log:expr, $ty:ident { $($fields:tt)* }) => {
        $crate::store::ingress::event(
            $tx,
            $instance,
            $at,
            $log,
            ::gateway_api::events::$ty::NAME,
            |base| serde_json::to_value(::gateway_api::events::$ty { base, $($fields)* }),
            $applied,
        )
    };
}

mod apply;
mod connection;
#[cfg(test)]
pub(in crate::store) use apply::LOST_SEND;
mod provider_events;
mod timers;

/// How long a conversation window stays open after the contact's last message.
pub const CONVERSATION_WINDOW_MS: i64 = 24 * 3_600_000;

/// What applying one post did (for the log and the tests).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Applied {
    /// Customer events written to the outbox, by name.
    pub events: Vec<String>,
    /// Facts skipped as duplicates or stale.
    pub skipped: usize,
    /// Sends the post changed, before and after, for their customers' kept days: applied
    /// at the end of the post's transaction (`store::customer_days::apply_changes`).
    pub(in crate::store) days: Vec<(SendCount, SendCount)>,
}

fn timestamp(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms).unwrap_or_default().to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

/// A transaction that holds the write lock from its first statement. On SQLite a
/// transaction that reads first and writes later cannot wait for the lock when the
/// send path's writer committed in between (it fails at once with SQLITE_BUSY); a
/// write first makes it wait like any writer. On PostgreSQL the statement is a no-op.
pub(super) async fn write_transaction(pool: &sqlx::AnyPool) -> Result<Transaction<'static, Any>, StoreError> {
    let mut tx = pool.begin().await?;
    sqlx::query("UPDATE provider_events SET error = error WHERE 1 = 0").execute(&mut *tx).await?;
    Ok(tx)
}

async fn event(
    tx: &mut Transaction<'static, Any>,
    instance: &Instance,
    at: i64,
    log_id: Option<i64>,
    name: &str,
    body: impl FnOnce(events::EventBase) -> serde_json::Result<Value>,
    applied: &mut Applied,
) -> Result<(), StoreError> {
    let base = events::EventBase {
        event: name.to_string(),
        instance_id: instance.id.clone(),
        instance_name: instance.name.clone(),
        timestamp: timestamp(at),
    };
    let payload = body(base).map_err(|e| StoreError::Conflict(format!("event body: {e}")))?;
    let now = now_ms();
    sqlx::query(super::messages::INSERT_OUTBOX_SQL)
        .bind(&instance.customer_id)
        .bind(&instance.id)
        .bind(name)
        .bind(payload.to_string())
        .bind(now)
        .bind(log_id)
        .execute(&mut **tx)
        .await?;
    applied.events.push(name.to_string());
    Ok(())
}

const INSTANCE_SQL: &str = "SELECT id, customer_id, name, provider, connection_state, paused, paused_reason, created_at FROM instances \
     WHERE id = $1";

async fn instance_in(tx: &mut Transaction<'static, Any>, id: &str) -> Result<Instance, StoreError> {
    let row = sqlx::query(INSTANCE_SQL).bind(id).fetch_one(&mut **tx).await?;
    Instance::from_cols(&row)
}

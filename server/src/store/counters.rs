//! Limit counters: velocity (per minute) and quota (per day, per plan period).
//!
//! A reservation increments its counters only while each is below its limit, in one
//! statement (`INSERT ... ON CONFLICT DO UPDATE ... WHERE count < lim RETURNING`, see
//! `writer`). On PostgreSQL a conflicting row is locked and the `WHERE` sees its latest
//! value, so two replicas cannot both take the last unit; on SQLite the single writer
//! serialises. The counters of one send are taken all or none.

use super::writer::WriteOp;
use super::{Store, StoreError, now_ms};
use sqlx::Row;

/// One counter to increment for a send.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reservation {
    /// What is counted, e.g. `day:cus_...`.
    pub scope: String,
    /// Start of the counting window (Unix ms).
    pub window_start: i64,
    /// When the row may be deleted (Unix ms).
    pub expires_at: i64,
    /// Largest allowed count (at least 1).
    pub limit: i64,
}

/// A reservation that would have passed its limit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LimitHit {
    /// Index of the reservation in the request.
    pub index: usize,
    /// The counter's value.
    pub used: i64,
}

impl Store {
    /// Takes every reservation or none. `Ok(Err(hit))` names the first that is full.
    pub async fn reserve(&self, reservations: &[Reservation]) -> Result<Result<(), LimitHit>, StoreError> {
        let reservations = reservations.to_vec();
        self.write_op(|reply| WriteOp::Reserve { reservations, reply }).await
    }

    /// Gives reservations back (the send did not go out).
    pub async fn release(&self, reservations: &[Reservation]) -> Result<(), StoreError> {
        if reservations.is_empty() {
            return Ok(());
        }
        let reservations = reservations.to_vec();
        self.write_op(|reply| WriteOp::Release { reservations, reply }).await
    }

    /// The value of one counter (0 when absent).
    pub async fn counter(&self, scope: &str, window_start: i64) -> Result<i64, StoreError> {
        let row =
            sqlx::query(super::writer::COUNT_SQL).bind(scope).bind(window_start).fetch_optional(&self.read).await?;
        Ok(row.map(|r| r.try_get("count")).transpose()?.unwrap_or(0))
    }

    /// Deletes counters whose window is long over; returns how many.
    pub async fn prune_counters(&self) -> Result<u64, StoreError> {
        let done =
            sqlx::query("DELETE FROM usage_counters WHERE expires_at < $1").bind(now_ms()).execute(&self.write).await?;
        Ok(done.rows_affected())
    }
}

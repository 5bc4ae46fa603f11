//! Limit counters: velocity (per minute) and quota (per day, per plan period).
//!
//! A reservation increments a counter only while it is below its limit, in one
//! statement (`INSERT ... ON CONFLICT DO UPDATE ... WHERE count < limit RETURNING`).
//! On PostgreSQL the conflicting row is locked and the `WHERE` sees its latest value, so
//! two replicas cannot both take the last unit; on SQLite the single writer serialises.
//! All reservations of one send are taken in one transaction: all or none.

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
    pub async fn reserve(
        &self,
        reservations: &[Reservation],
    ) -> Result<Result<(), LimitHit>, StoreError> {
        let mut tx = self.write.begin().await?;
        for (index, r) in reservations.iter().enumerate() {
            let taken = sqlx::query(
                "INSERT INTO usage_counters (scope, window_start, count, expires_at) VALUES ($1, $2, 1, $3) \
                 ON CONFLICT (scope, window_start) DO UPDATE SET count = usage_counters.count + 1 \
                 WHERE usage_counters.count < $4 RETURNING count",
            )
            .bind(&r.scope)
            .bind(r.window_start)
            .bind(r.expires_at)
            .bind(r.limit)
            .fetch_optional(&mut *tx)
            .await?;
            if taken.is_none() {
                let used: i64 = sqlx::query(
                    "SELECT count FROM usage_counters WHERE scope = $1 AND window_start = $2",
                )
                .bind(&r.scope)
                .bind(r.window_start)
                .fetch_optional(&mut *tx)
                .await?
                .map(|row| row.try_get("count"))
                .transpose()?
                .unwrap_or(r.limit);
                tx.rollback().await?;
                return Ok(Err(LimitHit { index, used }));
            }
        }
        tx.commit().await?;
        Ok(Ok(()))
    }

    /// Gives reservations back (the send did not go out).
    pub async fn release(&self, reservations: &[Reservation]) -> Result<(), StoreError> {
        let mut tx = self.write.begin().await?;
        for r in reservations {
            sqlx::query(
                "UPDATE usage_counters SET count = count - 1 WHERE scope = $1 AND window_start = $2 AND count > 0",
            )
            .bind(&r.scope)
            .bind(r.window_start)
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    /// The value of one counter (0 when absent).
    pub async fn counter(&self, scope: &str, window_start: i64) -> Result<i64, StoreError> {
        let row =
            sqlx::query("SELECT count FROM usage_counters WHERE scope = $1 AND window_start = $2")
                .bind(scope)
                .bind(window_start)
                .fetch_optional(&self.read)
                .await?;
        Ok(row.map(|r| r.try_get("count")).transpose()?.unwrap_or(0))
    }

    /// Deletes counters whose window is long over; returns how many.
    pub async fn prune_counters(&self) -> Result<u64, StoreError> {
        let done = sqlx::query("DELETE FROM usage_counters WHERE expires_at < $1")
            .bind(now_ms())
            .execute(&self.write)
            .await?;
        Ok(done.rows_affected())
    }
}

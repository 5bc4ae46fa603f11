//! The sign-in throttle: failures counted per bucket in a window, each attempt admitted
//! only once the delay of the last failure has passed, checked and counted in one
//! statement.

use super::super::{Store, StoreError};
use sqlx::Row;

/// Why a sign-in attempt was not admitted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Throttled {
    /// When the next attempt is allowed (Unix ms).
    pub until: i64,
}

/// Length of the throttle's observation window.
pub const THROTTLE_WINDOW_MS: i64 = 3_600_000;

impl Store {
    /// Admits a sign-in attempt in `bucket` at `now`, counting it as a failure until
    /// [`Store::clear_throttle`] says it succeeded. The check and the count are one
    /// statement, so concurrent attempts cannot all slip through: while the delay of
    /// the new count is not yet written the bucket is closed for `max_delay_ms`.
    /// Returns the failures in the window including this attempt.
    pub async fn admit_attempt(
        &self,
        bucket: &str,
        now: i64,
        max_delay_ms: i64,
        delay_ms: impl Fn(i64) -> i64,
    ) -> Result<Result<i64, Throttled>, StoreError> {
        let row = sqlx::query(
            "INSERT INTO dashboard_login_throttle (bucket, failures, window_start, next_allowed_at) \
             VALUES ($1, 1, $2, $3) \
             ON CONFLICT (bucket) DO UPDATE SET \
             failures = CASE WHEN dashboard_login_throttle.window_start <= $2 - $4 THEN 1 \
                        ELSE dashboard_login_throttle.failures + 1 END, \
             window_start = CASE WHEN dashboard_login_throttle.window_start <= $2 - $4 THEN $2 \
                            ELSE dashboard_login_throttle.window_start END, \
             next_allowed_at = $3 \
             WHERE dashboard_login_throttle.next_allowed_at <= $2 \
             RETURNING failures",
        )
        .bind(bucket)
        .bind(now)
        .bind(now + max_delay_ms)
        .bind(THROTTLE_WINDOW_MS)
        .fetch_optional(&self.write)
        .await?;
        let Some(row) = row else {
            let until: i64 = sqlx::query("SELECT next_allowed_at FROM dashboard_login_throttle WHERE bucket = $1")
                .bind(bucket)
                .fetch_one(&self.write)
                .await?
                .try_get("next_allowed_at")?;
            return Ok(Err(Throttled { until }));
        };
        let failures: i64 = row.try_get("failures")?;
        sqlx::query("UPDATE dashboard_login_throttle SET next_allowed_at = $2 WHERE bucket = $1")
            .bind(bucket)
            .bind(now + delay_ms(failures))
            .execute(&self.write)
            .await?;
        Ok(Ok(failures))
    }

    /// Forgets a bucket's failures (a successful sign-in).
    pub async fn clear_throttle(&self, bucket: &str) -> Result<(), StoreError> {
        sqlx::query("DELETE FROM dashboard_login_throttle WHERE bucket = $1").bind(bucket).execute(&self.write).await?;
        Ok(())
    }
}

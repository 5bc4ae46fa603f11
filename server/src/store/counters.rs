//! Limit counters: velocity (per minute) and quota (per day, per plan period).
//!
//! A reservation increments its counters only while each is below its limit, in one
//! statement (`INSERT ... ON CONFLICT DO UPDATE ... WHERE count < lim RETURNING`, see
//! `writer`). On PostgreSQL a conflicting row is locked and the `WHERE` sees its latest
//! value, so two replicas cannot both take the last unit; on SQLite the single writer
//! serialises. The counters of one send are taken all or none.

use super::{Store, StoreError, bind_dollar};
use rusqlite::types::Value as SqlValue;
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
    /// The value of one counter (0 when absent).
    pub async fn counter(&self, scope: &str, window_start: i64) -> Result<i64, StoreError> {
        let row = sqlx::query(COUNT_SQL).bind(scope).bind(window_start).fetch_optional(&self.read).await?;
        Ok(row.map(|r| r.try_get("count")).transpose()?.unwrap_or(0))
    }
}

/// Gives one counter back (`$1` its scope, `$2` its window).
pub const RELEASE_SQL: &str =
    "UPDATE usage_counters SET count = count - 1 WHERE scope = $1 AND window_start = $2 AND count > 0";
const COUNT_SQL: &str = "SELECT count FROM usage_counters WHERE scope = $1 AND window_start = $2";

/// One conditional upsert for `n` counters; returns the scopes it took.
fn reserve_sql(n: usize) -> String {
    let values: Vec<String> =
        (0..n).map(|i| format!("(${}, ${}, 1, ${}, ${})", 4 * i + 1, 4 * i + 2, 4 * i + 3, 4 * i + 4)).collect();
    format!(
        "INSERT INTO usage_counters (scope, window_start, count, expires_at, lim) VALUES {} \
         ON CONFLICT (scope, window_start) DO UPDATE SET count = usage_counters.count + 1, lim = excluded.lim \
         WHERE usage_counters.count < excluded.lim RETURNING scope, count",
        values.join(", ")
    )
}

/// Which reservation was full, given the scopes the upsert took; and the ones to undo.
fn first_full(rs: &[Reservation], taken: &[String]) -> Option<(usize, Vec<Reservation>)> {
    if taken.len() == rs.len() {
        return None;
    }
    let index = rs.iter().position(|r| !taken.contains(&r.scope)).unwrap_or(0);
    Some((index, rs.iter().filter(|r| taken.contains(&r.scope)).cloned().collect()))
}

/// Takes every reservation or none: the counters' values after this send's increment
/// (in the order of `rs`), or the first that was full.
pub(super) fn sqlite_reserve(
    tx: &rusqlite::Transaction<'_>,
    rs: &[Reservation],
) -> Result<Result<Vec<i64>, LimitHit>, StoreError> {
    if rs.is_empty() {
        return Ok(Ok(Vec::new()));
    }
    let params: Vec<SqlValue> = rs
        .iter()
        .flat_map(|r| {
            [
                SqlValue::Text(r.scope.clone()),
                SqlValue::Integer(r.window_start),
                SqlValue::Integer(r.expires_at),
                SqlValue::Integer(r.limit),
            ]
        })
        .collect();
    let mut stmt = tx.prepare_cached(&reserve_sql(rs.len()))?;
    bind_dollar(&mut stmt, &params)?;
    let mut taken = Vec::with_capacity(rs.len());
    let mut counts = std::collections::HashMap::with_capacity(rs.len());
    let mut rows = stmt.raw_query();
    while let Some(row) = rows.next()? {
        let scope = row.get::<_, String>(0)?;
        counts.insert(scope.clone(), row.get::<_, i64>(1)?);
        taken.push(scope);
    }
    drop(rows);
    drop(stmt);
    let Some((index, undo)) = first_full(rs, &taken) else {
        return Ok(Ok(rs.iter().map(|r| counts.get(&r.scope).copied().unwrap_or(1)).collect()));
    };
    sqlite_release(tx, &undo)?;
    let used: Option<i64> = tx
        .prepare_cached(COUNT_SQL)?
        .query_map(rusqlite::params![rs[index].scope, rs[index].window_start], |row| row.get(0))?
        .next()
        .transpose()?;
    Ok(Err(LimitHit { index, used: used.unwrap_or(rs[index].limit) }))
}

pub(super) fn sqlite_release(tx: &rusqlite::Transaction<'_>, rs: &[Reservation]) -> Result<(), StoreError> {
    for r in rs {
        tx.prepare_cached(RELEASE_SQL)?.execute(rusqlite::params![r.scope, r.window_start])?;
    }
    Ok(())
}

pub(super) fn reservations_json(rs: &[Reservation]) -> serde_json::Value {
    rs.iter()
        .map(|r| {
            serde_json::json!({"scope": r.scope, "window_start": r.window_start,
                               "expires_at": r.expires_at, "limit": r.limit})
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_full_reservation_is_named_and_the_others_undone() {
        let r = |scope: &str| Reservation { scope: scope.into(), window_start: 0, expires_at: 1, limit: 1 };
        let rs = vec![r("a"), r("b"), r("c")];
        assert!(first_full(&rs, &["a".into(), "b".into(), "c".into()]).is_none());
        let (index, undo) = first_full(&rs, &["a".into(), "c".into()]).unwrap();
        assert_eq!(index, 1);
        assert_eq!(undo, vec![r("a"), r("c")]);
    }
}

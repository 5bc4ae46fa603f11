//! Limit counters: velocity (per minute) and quota (per day, per plan period).
//!
//! A reservation increments its counters only while each is below its limit, in one
//! statement (`INSERT ... ON CONFLICT DO UPDATE ... WHERE count < lim RETURNING`, see
//! `writer`). On PostgreSQL a conflicting row is locked and the `WHERE` sees its latest
//! value, so two replicas cannot both take the last unit; on SQLite the single writer
//! serialises. The counters of one send are taken all or none.

use super::{Store, StoreError};
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

/// One conditional upsert for `n` counters; returns the scopes it took. Its parameters
/// are numbered in the order they appear (`$k` is the statement's k-th), which
/// `sqlite_reserve` binds by.
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

/// `reserve_sql` for up to this many counters is made once (a send names six, eight to a
/// new recipient: `send::limits`); the writer took a dozen allocations a send making it
/// again (BENCHMARKS.md, issue 22). More counters than this still work, made each time.
const RESERVE_SQL_KEPT: usize = 12;

/// `reserve_sql(n)`, made once for each `n` up to `RESERVE_SQL_KEPT`.
fn reserve_sql_kept(n: usize) -> std::borrow::Cow<'static, str> {
    static KEPT: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();
    match KEPT.get_or_init(|| (1..=RESERVE_SQL_KEPT).map(reserve_sql).collect()).get(n.wrapping_sub(1)) {
        Some(sql) => std::borrow::Cow::Borrowed(sql.as_str()),
        None => std::borrow::Cow::Owned(reserve_sql(n)),
    }
}

/// Which reservation was full, given each one's count as the upsert returned it (none:
/// no row came back for its scope) and how many rows came back; and the ones to undo.
fn first_full(rs: &[Reservation], counts: &[Option<i64>], rows: usize) -> Option<(usize, Vec<Reservation>)> {
    if rows == rs.len() {
        return None;
    }
    let index = counts.iter().position(Option::is_none).unwrap_or(0);
    Some((index, rs.iter().zip(counts).filter(|(_, c)| c.is_some()).map(|(r, _)| r.clone()).collect()))
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
    // Each reservation's count as the upsert returned it (none: not taken), matched by
    // scope; the values are bound where they are, not copied.
    let mut counts: Vec<Option<i64>> = vec![None; rs.len()];
    let mut rows_back = 0;
    {
        let mut stmt = tx.prepare_cached(&reserve_sql_kept(rs.len()))?;
        for (i, r) in rs.iter().enumerate() {
            stmt.raw_bind_parameter(4 * i + 1, r.scope.as_str())?;
            stmt.raw_bind_parameter(4 * i + 2, r.window_start)?;
            stmt.raw_bind_parameter(4 * i + 3, r.expires_at)?;
            stmt.raw_bind_parameter(4 * i + 4, r.limit)?;
        }
        let mut rows = stmt.raw_query();
        while let Some(row) = rows.next()? {
            rows_back += 1;
            let scope = row.get_ref(0)?.as_str().map_err(rusqlite::Error::from)?;
            let count = row.get::<_, i64>(1)?;
            for (r, c) in rs.iter().zip(counts.iter_mut()) {
                if r.scope == scope {
                    *c = Some(count);
                }
            }
        }
    }
    let Some((index, undo)) = first_full(rs, &counts, rows_back) else {
        return Ok(Ok(counts.into_iter().map(|c| c.unwrap_or(1)).collect()));
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
        assert!(first_full(&rs, &[Some(1), Some(1), Some(1)], 3).is_none());
        let (index, undo) = first_full(&rs, &[Some(1), None, Some(1)], 2).unwrap();
        assert_eq!(index, 1);
        assert_eq!(undo, vec![r("a"), r("c")]);
    }

    /// `sqlite_reserve` binds `reserve_sql`'s parameters by position: `$k` must be the
    /// statement's k-th parameter, and the kept statements must be the ones made.
    #[test]
    fn the_reserve_statement_numbers_its_parameters_in_order() {
        let conn = rusqlite::Connection::open_in_memory().unwrap();
        conn.execute_batch(
            "CREATE TABLE usage_counters (scope TEXT, window_start BIGINT, count BIGINT, expires_at BIGINT, \
             lim BIGINT, PRIMARY KEY (scope, window_start))",
        )
        .unwrap();
        for n in 1..=RESERVE_SQL_KEPT + 2 {
            assert_eq!(reserve_sql_kept(n), reserve_sql(n));
            let stmt = conn.prepare(&reserve_sql(n)).unwrap();
            assert_eq!(stmt.parameter_count(), 4 * n);
            for k in 1..=4 * n {
                assert_eq!(stmt.parameter_name(k), Some(format!("${k}").as_str()));
            }
        }
    }
}

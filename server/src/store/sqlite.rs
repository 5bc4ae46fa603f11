//! SQLite's own connections: the send path's readers, the statements each connection
//! keeps, `$n` parameters bound by their number, and values bound where they lie. The
//! writer's connection is `writer::sqlite`'s, and `Store::backup_to` opens one for its
//! `VACUUM INTO`; sqlx's pools serve everything else.

use super::StoreError;
use rusqlite::types::Value as SqlValue;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

/// SQLITE_BUSY or SQLITE_LOCKED: another process holds the file.
pub(crate) fn is_sqlite_busy(e: &rusqlite::Error) -> bool {
    matches!(e.sqlite_error_code(), Some(rusqlite::ErrorCode::DatabaseBusy) | Some(rusqlite::ErrorCode::DatabaseLocked))
}

/// How many compiled statements a SQLite connection keeps (`prepare_cached`), by their
/// text; rusqlite keeps 16 and evicts the least recently used. The writer runs every
/// write of the gateway: a keyed send's begin and settle, a PBX event's admission and the
/// periodic jobs' writes are more than 16 statements, so under a mixed load the writer
/// compiled statements again and again (BENCHMARKS.md, issue 22, twentieth session).
/// The gateway's statements are a fixed set of a few dozen (each a constant, but for
/// the counters' upsert, one for each number of counters), so none is compiled twice.
pub(crate) const SQLITE_STATEMENTS_KEPT: usize = 256;

/// Idle read-only SQLite connections. A send path read is an indexed point lookup of a
/// few microseconds that a WAL reader never waits for, so it runs inline on the calling
/// task: sqlx's SQLite driver would hand each query to a worker thread and back, which
/// costs more than the query.
pub(super) struct SqliteReaders {
    pub(super) path: PathBuf,
    idle: Mutex<Vec<rusqlite::Connection>>,
}

impl SqliteReaders {
    const MAX_IDLE: usize = 8;

    /// Readers of the file `path`, each opened when first needed.
    pub(super) fn new(path: PathBuf) -> SqliteReaders {
        SqliteReaders { path, idle: Mutex::new(Vec::new()) }
    }

    /// A new reader connection.
    pub(super) fn open(&self) -> Result<rusqlite::Connection, StoreError> {
        let flags = rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let conn = rusqlite::Connection::open_with_flags(&self.path, flags)?;
        conn.busy_timeout(Duration::from_secs(10))?;
        conn.set_prepared_statement_cache_capacity(SQLITE_STATEMENTS_KEPT);
        Ok(conn)
    }

    /// Runs `f` on an idle reader (or a new one), then keeps it for the next, up to
    /// `MAX_IDLE`.
    pub(super) fn with<T>(
        &self,
        f: impl FnOnce(&rusqlite::Connection) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let idle = self.idle.lock().unwrap_or_else(|p| p.into_inner()).pop();
        let conn = match idle {
            Some(conn) => conn,
            None => self.open()?,
        };
        let result = f(&conn);
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        if idle.len() < Self::MAX_IDLE {
            idle.push(conn);
        }
        result
    }
}

/// Inserts one row in a SQLite transaction (`sql` with `$n` parameters, no `RETURNING`)
/// and gives its id, the rowid of a table keyed by `INTEGER PRIMARY KEY`. Not read with
/// `RETURNING`: SQLite gathers a statement's returned rows in a table of their own, about
/// 2.7 µs a statement on the writer's hot path (BENCHMARKS.md, issue 22, eighteenth
/// session). `what` names the row in the error when none was written.
pub(crate) fn sqlite_insert<V: rusqlite::ToSql>(
    tx: &rusqlite::Transaction<'_>,
    sql: &str,
    values: &[V],
    what: &str,
) -> Result<i64, StoreError> {
    let mut insert = tx.prepare_cached(sql)?;
    bind_dollar(&mut insert, values)?;
    if insert.raw_execute()? != 1 {
        return Err(StoreError::Conflict(format!("{what} was not written")));
    }
    Ok(tx.last_insert_rowid())
}

/// A value for `bind_dollar` that borrows its text where it lies: the send path's
/// writes bind their rows' fields this way rather than copying each into a `SqlValue`
/// (a dozen allocations a write on the SQLite writer's thread: BENCHMARKS.md, issue 22).
pub(crate) type Bound<'a> = rusqlite::types::ToSqlOutput<'a>;

/// Text bound where it lies.
pub(crate) fn bound_text(s: &str) -> Bound<'_> {
    Bound::Borrowed(rusqlite::types::ValueRef::Text(s.as_bytes()))
}

/// Text bound where it lies, or NULL.
pub(crate) fn bound_opt(s: &Option<String>) -> Bound<'_> {
    s.as_deref().map_or(Bound::Borrowed(rusqlite::types::ValueRef::Null), bound_text)
}

/// An integer, or NULL.
pub(crate) fn bound_int(n: Option<i64>) -> Bound<'static> {
    n.map_or(Bound::Borrowed(rusqlite::types::ValueRef::Null), |n| Bound::Owned(SqlValue::Integer(n)))
}

/// A bound value as an owned one (for a `Statement` that outlives what it was read from).
pub(crate) fn owned(b: Bound<'_>) -> SqlValue {
    match b {
        Bound::Borrowed(v) => v.into(),
        Bound::Owned(v) => v,
        // `ToSqlOutput`'s other forms (zero blobs, arrays, ...) are made by none of
        // the functions above.
        _ => SqlValue::Null,
    }
}

/// Binds `values[i]` to `$i+1` by name. SQLite numbers `$n` parameters in the order
/// they first appear in the text, not by `n`, so positional binding would be wrong for
/// a query that mentions `$3` before `$1`. Each parameter's name is read back from the
/// statement and parsed: looking each `$n` up by a formatted name cost 7 % of the
/// SQLite writer's time (BENCHMARKS.md, issue 22).
pub(crate) fn bind_dollar<V: rusqlite::ToSql>(
    stmt: &mut rusqlite::Statement<'_>,
    values: &[V],
) -> Result<(), StoreError> {
    let mut bound = 0;
    for index in 1..=stmt.parameter_count() {
        let n = stmt.parameter_name(index).and_then(|name| name.strip_prefix('$')?.parse::<usize>().ok());
        if let Some(value) = n.and_then(|n| values.get(n.checked_sub(1)?)) {
            stmt.raw_bind_parameter(index, value)?;
            bound += 1;
        }
    }
    // Names are distinct (SQLite gives a repeated name its first index), so every value
    // found its parameter exactly when as many were bound as there are values.
    if bound != values.len() {
        return Err(StoreError::Conflict(format!("query has {bound} of the {} parameters given", values.len())));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `$n` is bound to `values[n-1]` wherever it first appears and however often it
    /// is repeated; a value without its parameter is an error.
    #[test]
    fn dollar_parameters_are_bound_by_their_number_not_their_place() {
        let conn = rusqlite::Connection::open_in_memory().unwrap();
        let mut stmt = conn.prepare("SELECT $3, $1, $3 || $2").unwrap();
        let values = [SqlValue::Text("a".into()), SqlValue::Text("b".into()), SqlValue::Text("c".into())];
        bind_dollar(&mut stmt, &values).unwrap();
        let mut rows = stmt.raw_query();
        let row = rows.next().unwrap().unwrap();
        let got: (String, String, String) = (row.get(0).unwrap(), row.get(1).unwrap(), row.get(2).unwrap());
        assert_eq!(got, ("c".into(), "a".into(), "cb".into()));
        drop(rows);
        let mut short = conn.prepare("SELECT $1, $2").unwrap();
        assert!(bind_dollar(&mut short, &values).is_err(), "$3 has no parameter");
    }

    /// SQLite as `.cargo/config.toml` builds it: no memory statistics and no shared page
    /// cache (both a process-wide mutex every connection took; BENCHMARKS.md), and no
    /// STAT4 (the next test). A build that lost the flags (another `LIBSQLITE3_FLAGS`, a
    /// system SQLite) fails here.
    #[test]
    fn sqlite_is_built_without_process_wide_locks_on_memory() {
        let conn = rusqlite::Connection::open_in_memory().unwrap();
        let mut stmt = conn.prepare("PRAGMA compile_options").unwrap();
        let options: Vec<String> = stmt.query_map([], |r| r.get(0)).unwrap().map(Result::unwrap).collect();
        assert!(options.iter().any(|o| o == "DEFAULT_MEMSTATUS=0"), "{options:?}");
        assert!(!options.iter().any(|o| o == "ENABLE_MEMORY_MANAGEMENT"), "{options:?}");
        assert!(!options.iter().any(|o| o == "ENABLE_STAT4"), "{options:?}");
    }

    /// A store an operator ran `ANALYZE` on keeps its statements compiled: a statement
    /// whose parameter meets an indexed column is not compiled again for each value bound
    /// to it (with SQLite's STAT4 statistics it was, for every send; `.cargo/config.toml`).
    #[test]
    fn statistics_do_not_make_a_statement_compile_again_for_each_value() {
        let conn = rusqlite::Connection::open_in_memory().unwrap();
        conn.execute_batch(
            "CREATE TABLE t (k TEXT NOT NULL, v INTEGER NOT NULL); CREATE INDEX t_k ON t (k);
             WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 2000)
             INSERT INTO t SELECT CASE WHEN i % 10 = 0 THEN 'k' || i ELSE 'common' END, i FROM n;
             ANALYZE;",
        )
        .unwrap();
        let mut stmt = conn.prepare_cached("SELECT COUNT(*) FROM t WHERE k = $1").unwrap();
        for (k, n) in [("common", 1800), ("k10", 1), ("common", 1800), ("absent", 0)] {
            assert_eq!(stmt.query_row([k], |r| r.get::<_, i64>(0)).unwrap(), n);
        }
        assert_eq!(stmt.get_status(rusqlite::StatementStatus::RePrepare), 0);
    }
}

//! How the store reads rows and changes one: a result row of either driver read by
//! column name (`Cols`), a record built from one row (`FromCols`, the one way rows
//! become records), and the update of one row that must exist (`Store::update_one`).

use super::{Store, StoreError};
use sqlx::any::{AnyArguments, AnyRow};
use sqlx::{Any, Row};

/// A result row of either driver, read by column name.
pub(crate) trait Cols {
    fn col<T: ColType>(&self, name: &str) -> Result<T, StoreError>;
}

/// A column type both drivers decode.
pub(crate) trait ColType: for<'r> sqlx::Decode<'r, Any> + sqlx::Type<Any> + rusqlite::types::FromSql {}
impl<T: for<'r> sqlx::Decode<'r, Any> + sqlx::Type<Any> + rusqlite::types::FromSql> ColType for T {}

impl Cols for AnyRow {
    fn col<T: ColType>(&self, name: &str) -> Result<T, StoreError> {
        Ok(self.try_get(name)?)
    }
}

impl Cols for rusqlite::Row<'_> {
    fn col<T: ColType>(&self, name: &str) -> Result<T, StoreError> {
        Ok(self.get(name)?)
    }
}

/// A SQLite row whose columns are found by name through a map of its statement's columns.
/// rusqlite finds a name by comparing it with each column's name in turn, and the send's
/// one read has about 45 columns: finding them was a fifth of that read's CPU. A map
/// built for each row with the standard library's SipHash, and the lookups in it, were
/// still a quarter of it (BENCHMARKS.md, issue 22, thirtieth session), so each thread
/// keeps the map of each statement it reads rows of, made at its first row
/// ([`Columns::of`]; not for a statement that selects `*`, whose columns can move with
/// the schema).
pub(super) struct Named<'r, 's> {
    row: &'r rusqlite::Row<'s>,
    columns: std::rc::Rc<Columns>,
}

/// The columns of one statement: each name's place (of two columns with one name, the
/// first, as rusqlite finds it).
pub(super) struct Columns(rustc_hash::FxHashMap<Box<str>, usize>);

/// How many statements' maps a thread keeps; past it the oldest is made again when used.
const COLUMNS_KEPT: usize = 32;

thread_local! {
    /// The maps of the statements this thread read rows of, by their SQL, newest last.
    static KEPT: std::cell::RefCell<Vec<(Box<str>, std::rc::Rc<Columns>)>> = const { std::cell::RefCell::new(Vec::new()) };
}

impl Columns {
    fn new(stmt: &rusqlite::Statement<'_>) -> Columns {
        let mut places = rustc_hash::FxHashMap::default();
        for i in 0..stmt.column_count() {
            if let Ok(name) = stmt.column_name(i) {
                places.entry(name.into()).or_insert(i);
            }
        }
        Columns(places)
    }

    /// The map of `row`'s statement, whose SQL is `sql`: the one this thread keeps, or
    /// made now (and kept, unless the statement selects `*`).
    fn of(sql: &str, row: &rusqlite::Row<'_>) -> std::rc::Rc<Columns> {
        KEPT.with_borrow_mut(|kept| {
            if let Some((_, columns)) = kept.iter().find(|(kept_sql, _)| **kept_sql == *sql) {
                return columns.clone();
            }
            let columns = std::rc::Rc::new(Columns::new(row.as_ref()));
            if !selects_star(sql) {
                if kept.len() >= COLUMNS_KEPT {
                    kept.remove(0);
                }
                kept.push((sql.into(), columns.clone()));
            }
            columns
        })
    }
}

/// Whether `sql` may select `*` (or `t.*`): any `*` but `COUNT(*)`'s (a product too,
/// which costs only the keeping of its map). When a schema change makes SQLite compile
/// such a statement again, its columns are the tables' new ones, which can keep their
/// number and change their places (a column dropped, another added), so its map is made
/// for each row. A statement that names its columns has them where its text puts them
/// for as long as it compiles.
pub(super) fn selects_star(sql: &str) -> bool {
    sql.match_indices('*').any(|(at, _)| !sql[..at].ends_with('('))
}

impl<'r, 's> Named<'r, 's> {
    /// `row`, a row of the statement whose SQL is `sql`.
    pub(super) fn new(sql: &str, row: &'r rusqlite::Row<'s>) -> Named<'r, 's> {
        Named { row, columns: Columns::of(sql, row) }
    }
}

impl Cols for Named<'_, '_> {
    fn col<T: ColType>(&self, name: &str) -> Result<T, StoreError> {
        match self.columns.0.get(name) {
            Some(&i) => Ok(self.row.get(i)?),
            // Names differing only in case, as rusqlite matches them.
            None => Ok(self.row.get(name)?),
        }
    }
}

/// The columns of `row` named `{prefix}{name}`, read by their names without it (a
/// record's columns under the prefix a join gave them). One buffer makes each name.
pub(super) struct Prefixed<'a, C> {
    row: &'a C,
    prefix: &'a str,
    name: std::cell::RefCell<String>,
}

impl<'a, C: Cols> Prefixed<'a, C> {
    pub(super) fn new(row: &'a C, prefix: &'a str) -> Prefixed<'a, C> {
        Prefixed { row, prefix, name: std::cell::RefCell::new(String::with_capacity(prefix.len() + 24)) }
    }
}

impl<C: Cols> Cols for Prefixed<'_, C> {
    fn col<T: ColType>(&self, name: &str) -> Result<T, StoreError> {
        let mut full = self.name.borrow_mut();
        full.clear();
        full.push_str(self.prefix);
        full.push_str(name);
        self.row.col(&full)
    }
}

/// A record built from one result row.
pub(crate) trait FromCols: Sized {
    fn from_cols(row: &impl Cols) -> Result<Self, StoreError>;
}

/// Whether an update changes what the send path caches (customers and instances):
/// then this process's cache forgets (see `Store::forget_cached`) once the update ran,
/// whether or not it found its row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Forget {
    Cache,
    Nothing,
}

impl Store {
    /// Runs `update` on the writer: an update of one row that must exist, so matching
    /// none is `NotFound(what())`. The caller reads the row again when it answers with it.
    pub(crate) async fn update_one<'q>(
        &self,
        update: sqlx::query::Query<'q, Any, AnyArguments<'q>>,
        forget: Forget,
        what: impl FnOnce() -> String,
    ) -> Result<(), StoreError> {
        let done = update.execute(&self.write).await?;
        if forget == Forget::Cache {
            self.forget_cached();
        }
        if done.rows_affected() == 0 {
            return Err(StoreError::NotFound(what()));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_named_row_finds_columns_as_rusqlite_does() {
        let conn = rusqlite::Connection::open_in_memory().unwrap();
        let sql = "SELECT 1 AS a, 2 AS a, 'x' AS Mixed, NULL AS n, 5 AS i_a";
        let mut stmt = conn.prepare(sql).unwrap();
        let mut rows = stmt.query([]).unwrap();
        let row = rows.next().unwrap().unwrap();
        let named = Named::new(sql, row);
        for (name, expected) in [("a", Some(1_i64)), ("n", None)] {
            assert_eq!(named.col::<Option<i64>>(name).unwrap(), expected, "{name}");
            assert_eq!(row.col::<Option<i64>>(name).unwrap(), expected, "{name}");
        }
        assert_eq!(named.col::<String>("mixed").unwrap(), "x");
        assert!(named.col::<i64>("missing").is_err());
        let prefixed = Prefixed::new(&named, "i_");
        assert_eq!(prefixed.col::<i64>("a").unwrap(), 5);
        assert_eq!(prefixed.col::<i64>("A").unwrap(), 5);
        assert!(prefixed.col::<i64>("n").is_err());
    }

    /// A thread keeps one map a statement: a row of another statement gets its own, and
    /// a row of the first again finds the first's columns where they are.
    #[test]
    fn each_statement_keeps_its_own_columns() {
        let conn = rusqlite::Connection::open_in_memory().unwrap();
        let first = "SELECT 1 AS a, 2 AS b";
        let second = "SELECT 3 AS b, 4 AS a";
        let value = |sql: &str, name: &str| -> i64 {
            let mut stmt = conn.prepare(sql).unwrap();
            let mut rows = stmt.query([]).unwrap();
            Named::new(sql, rows.next().unwrap().unwrap()).col(name).unwrap()
        };
        for _ in 0..2 {
            assert_eq!((value(first, "a"), value(first, "b")), (1, 2));
            assert_eq!((value(second, "a"), value(second, "b")), (4, 3));
        }
        let many: Vec<String> = (0..COLUMNS_KEPT + 3).map(|n| format!("SELECT {n} AS n{n}, 7 AS a")).collect();
        for sql in &many {
            assert_eq!(value(sql, "a"), 7, "{sql}");
        }
        assert_eq!(KEPT.with_borrow(Vec::len), COLUMNS_KEPT);
        assert_eq!((value(first, "a"), value(second, "a")), (1, 4));
    }

    /// A `*` read again after the schema changed (a column dropped, another added: as
    /// many columns, in other places) finds each column where it is now.
    #[test]
    fn a_statement_of_star_finds_its_columns_after_the_schema_changed() {
        let conn = rusqlite::Connection::open_in_memory().unwrap();
        conn.execute_batch("CREATE TABLE t (a INTEGER, b INTEGER, c INTEGER); INSERT INTO t VALUES (1, 2, 3)").unwrap();
        let sql = "SELECT * FROM t";
        let value = |name: &str| -> Result<Option<i64>, StoreError> {
            let mut stmt = conn.prepare_cached(sql).unwrap();
            let mut rows = stmt.query([]).unwrap();
            Named::new(sql, rows.next().unwrap().unwrap()).col(name)
        };
        assert_eq!(value("c").unwrap(), Some(3));
        conn.execute_batch("ALTER TABLE t DROP COLUMN b; ALTER TABLE t ADD COLUMN d INTEGER").unwrap();
        assert_eq!(value("c").unwrap(), Some(3));
        assert_eq!(value("d").unwrap(), None);
        assert!(value("b").is_err());
    }

    #[test]
    fn star_is_told_from_count() {
        assert!(selects_star("SELECT * FROM t"));
        assert!(selects_star("SELECT t.*, COUNT(*) FROM t"));
        assert!(!selects_star("SELECT a, (SELECT COUNT(*) FROM u) AS n FROM t"));
    }
}

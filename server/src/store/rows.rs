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

/// A SQLite row whose columns are found by name through a map built once. rusqlite
/// finds a name by comparing it with each column's name in turn, and the send's one
/// read has about 45 columns: finding them was a fifth of that read's CPU (BENCHMARKS.md).
pub(super) struct Named<'r, 's> {
    row: &'r rusqlite::Row<'s>,
    index: std::collections::HashMap<&'r str, usize>,
}

impl<'r, 's> Named<'r, 's> {
    pub(super) fn new(row: &'r rusqlite::Row<'s>) -> Named<'r, 's> {
        let stmt = row.as_ref();
        let mut index = std::collections::HashMap::with_capacity(stmt.column_count());
        for i in 0..stmt.column_count() {
            // Of two columns with one name, the first (as rusqlite finds it).
            if let Ok(name) = stmt.column_name(i) {
                index.entry(name).or_insert(i);
            }
        }
        Named { row, index }
    }
}

impl Cols for Named<'_, '_> {
    fn col<T: ColType>(&self, name: &str) -> Result<T, StoreError> {
        match self.index.get(name) {
            Some(&i) => Ok(self.row.get(i)?),
            // Names differing only in case, as rusqlite matches them.
            None => Ok(self.row.get(name)?),
        }
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
        let mut stmt = conn.prepare("SELECT 1 AS a, 2 AS a, 'x' AS Mixed, NULL AS n").unwrap();
        let mut rows = stmt.query([]).unwrap();
        let row = rows.next().unwrap().unwrap();
        let named = Named::new(row);
        for (name, expected) in [("a", Some(1_i64)), ("n", None)] {
            assert_eq!(named.col::<Option<i64>>(name).unwrap(), expected, "{name}");
            assert_eq!(row.col::<Option<i64>>(name).unwrap(), expected, "{name}");
        }
        assert_eq!(named.col::<String>("mixed").unwrap(), "x");
        assert!(named.col::<i64>("missing").is_err());
    }
}

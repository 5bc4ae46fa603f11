//! Policy modules held in the store, so every replica, on any machine, runs the same
//! ones: `gateway policy install` and the console's upload add a row after the module
//! passed the same checks a reload makes; each replica's policy host loads the newest
//! unretired row of each name; `policy rollback NAME` retires the newest.

use super::{Cols, FromCols, Store, StoreError, now_ms};
use sqlx::Row;

/// A stored module, without its bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredModule {
    pub id: i64,
    pub name: String,
    pub version: String,
    pub sha256: String,
    pub size: i64,
    pub installed_at: i64,
    pub installed_by: String,
}

impl FromCols for StoredModule {
    fn from_cols(r: &impl Cols) -> Result<StoredModule, StoreError> {
        Ok(StoredModule {
            id: r.col("id")?,
            name: r.col("name")?,
            version: r.col("version")?,
            sha256: r.col("sha256")?,
            size: r.col("size")?,
            installed_at: r.col("installed_at")?,
            installed_by: r.col("installed_by")?,
        })
    }
}

/// What `install_policy_module` is given.
pub struct NewModule<'a> {
    pub name: &'a str,
    pub version: &'a str,
    pub sha256: &'a str,
    pub bytes: &'a [u8],
    pub installed_by: &'a str,
}

const COLUMNS: &str = "id, name, version, sha256, size, installed_at, installed_by";

impl Store {
    /// Adds a module (checked by the caller); it becomes its name's live stored module.
    pub async fn install_policy_module(&self, m: &NewModule<'_>) -> Result<StoredModule, StoreError> {
        let sql = format!(
            "INSERT INTO policy_modules (name, version, sha256, module, size, installed_at, installed_by) \
             VALUES ($1, $2, $3, $4, $5, $6, $7) RETURNING {COLUMNS}"
        );
        let row = sqlx::query(&sql)
            .bind(m.name)
            .bind(m.version)
            .bind(m.sha256)
            .bind(m.bytes.to_vec())
            .bind(m.bytes.len() as i64)
            .bind(now_ms())
            .bind(m.installed_by)
            .fetch_one(&self.write)
            .await?;
        StoredModule::from_cols(&row)
    }

    /// The live stored module of each name (its newest unretired row), by name.
    pub async fn live_policy_modules(&self) -> Result<Vec<StoredModule>, StoreError> {
        let sql = format!(
            "SELECT {COLUMNS} FROM policy_modules m WHERE retired_at IS NULL AND id = \
             (SELECT MAX(id) FROM policy_modules n WHERE n.name = m.name AND n.retired_at IS NULL) ORDER BY name"
        );
        let rows = sqlx::query(&sql).fetch_all(&self.read).await?;
        rows.iter().map(StoredModule::from_cols).collect()
    }

    /// A stored module's bytes.
    pub async fn policy_module_bytes(&self, id: i64) -> Result<Vec<u8>, StoreError> {
        let row = sqlx::query("SELECT module FROM policy_modules WHERE id = $1")
            .bind(id)
            .fetch_optional(&self.read)
            .await?
            .ok_or_else(|| StoreError::NotFound(format!("policy module {id}")))?;
        Ok(row.try_get("module")?)
    }

    /// Retires the live stored module of `name`; returns it, or `None` when the store
    /// holds no live module of that name.
    pub async fn retire_policy_module(&self, name: &str) -> Result<Option<StoredModule>, StoreError> {
        let sql = format!(
            "UPDATE policy_modules SET retired_at = $2 WHERE id = \
             (SELECT MAX(id) FROM policy_modules WHERE name = $1 AND retired_at IS NULL) RETURNING {COLUMNS}"
        );
        let row = sqlx::query(&sql).bind(name).bind(now_ms()).fetch_optional(&self.write).await?;
        row.as_ref().map(StoredModule::from_cols).transpose()
    }
}

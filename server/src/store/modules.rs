//! Policy modules held in the store, so every replica, on any machine, runs the same
//! ones: `gateway policy install` and the console's upload add a row after the module
//! passed the same checks a reload makes. Each row has a rollout (`Rollout`): `live`
//! (the newest unscoped live row of a name decides its sends), `shadow` or `canary`
//! (one per name, beside the live module), or live for some customers or plans only
//! (scoped). Each replica's policy host loads the rows that run (`running_policy_modules`);
//! `policy promote NAME` copies the shadow or canary as a new live row; `policy rollback
//! NAME` retires the shadow or canary if one runs, else the newest row of the name.

use super::{Cols, FromCols, Store, StoreError, now_ms};
use sqlx::Row;

/// How a stored module runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Decides the sends of its name (those of its scope, when it has one).
    Live,
    /// Evaluated beside the live module of its name on every send; never decides.
    Shadow,
    /// Decides this percentage of the sends (a stable hash of each send chooses), the
    /// live module the rest.
    Canary(u8),
}

/// A stored module's mode and scope.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Rollout {
    pub mode: Mode,
    /// Only these customers' sends (empty: no customer scope).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub customers: Vec<String>,
    /// Only the sends of customers on these plans (empty: no plan scope).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub plans: Vec<String>,
}

impl Default for Rollout {
    fn default() -> Self {
        Rollout { mode: Mode::Live, customers: Vec::new(), plans: Vec::new() }
    }
}

impl Rollout {
    /// Limited to some customers or plans.
    pub fn is_scoped(&self) -> bool {
        !self.customers.is_empty() || !self.plans.is_empty()
    }

    /// A shadow or a canary: the one trial of its name.
    pub fn is_trial(&self) -> bool {
        self.mode != Mode::Live
    }

    /// The mode as `policy list` shows it: `live`, `shadow`, `canary 10 %`.
    pub fn mode_label(&self) -> String {
        match self.mode {
            Mode::Live => "live".into(),
            Mode::Shadow => "shadow".into(),
            Mode::Canary(p) => format!("canary {p} %"),
        }
    }

    /// The scope as one line (`customers c1,c2; plans starter`), or `everyone`.
    pub fn scope_label(&self) -> String {
        let mut parts = Vec::new();
        if !self.customers.is_empty() {
            parts.push(format!("customers {}", self.customers.join(",")));
        }
        if !self.plans.is_empty() {
            parts.push(format!("plans {}", self.plans.join(",")));
        }
        if parts.is_empty() { "everyone".into() } else { parts.join("; ") }
    }

    fn mode_column(&self) -> (&'static str, Option<i64>) {
        match self.mode {
            Mode::Live => ("live", None),
            Mode::Shadow => ("shadow", None),
            Mode::Canary(p) => ("canary", Some(p as i64)),
        }
    }
}

/// A comma-separated list column: `None` for an empty list.
fn list_column(items: &[String]) -> Option<String> {
    (!items.is_empty()).then(|| items.join(","))
}

fn list_of(column: Option<String>) -> Vec<String> {
    column.map(|c| c.split(',').filter(|s| !s.is_empty()).map(str::to_string).collect()).unwrap_or_default()
}

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
    pub rollout: Rollout,
}

impl FromCols for StoredModule {
    fn from_cols(r: &impl Cols) -> Result<StoredModule, StoreError> {
        let mode: String = r.col("mode")?;
        let percent: Option<i64> = r.col("canary_percent")?;
        let mode = match mode.as_str() {
            "shadow" => Mode::Shadow,
            "canary" => Mode::Canary(percent.unwrap_or(0).clamp(0, 100) as u8),
            _ => Mode::Live,
        };
        Ok(StoredModule {
            id: r.col("id")?,
            name: r.col("name")?,
            version: r.col("version")?,
            sha256: r.col("sha256")?,
            size: r.col("size")?,
            installed_at: r.col("installed_at")?,
            installed_by: r.col("installed_by")?,
            rollout: Rollout {
                mode,
                customers: list_of(r.col("scope_customers")?),
                plans: list_of(r.col("scope_plans")?),
            },
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
    pub rollout: Rollout,
}

const COLUMNS: &str =
    "id, name, version, sha256, size, installed_at, installed_by, mode, canary_percent, scope_customers, scope_plans";

/// The rows a gateway runs: each name's newest unscoped live row, its trial, and its
/// scoped rows.
const RUNNING: &str = "retired_at IS NULL AND (mode <> 'live' OR scope_customers IS NOT NULL OR scope_plans IS NOT NULL \
     OR id = (SELECT MAX(id) FROM policy_modules n WHERE n.name = m.name AND n.retired_at IS NULL AND n.mode = 'live' \
     AND n.scope_customers IS NULL AND n.scope_plans IS NULL))";

impl Store {
    /// Adds a module (checked by the caller). A live unscoped one becomes its name's
    /// live stored module; a shadow or canary replaces the trial of its name that runs;
    /// a scoped one replaces the install of its name with the same scope.
    pub async fn install_policy_module(&self, m: &NewModule<'_>) -> Result<StoredModule, StoreError> {
        let (mode, percent) = m.rollout.mode_column();
        let (customers, plans) = (list_column(&m.rollout.customers), list_column(&m.rollout.plans));
        let now = now_ms();
        let mut tx = self.write.begin().await?;
        if m.rollout.is_trial() {
            sqlx::query(
                "UPDATE policy_modules SET retired_at = $2 WHERE name = $1 AND retired_at IS NULL AND mode <> 'live'",
            )
            .bind(m.name)
            .bind(now)
            .execute(&mut *tx)
            .await?;
        } else if m.rollout.is_scoped() {
            sqlx::query(
                "UPDATE policy_modules SET retired_at = $2 WHERE name = $1 AND retired_at IS NULL AND mode = 'live' \
                 AND COALESCE(scope_customers, '') = $3 AND COALESCE(scope_plans, '') = $4",
            )
            .bind(m.name)
            .bind(now)
            .bind(customers.clone().unwrap_or_default())
            .bind(plans.clone().unwrap_or_default())
            .execute(&mut *tx)
            .await?;
        }
        let sql = format!(
            "INSERT INTO policy_modules (name, version, sha256, module, size, installed_at, installed_by, mode, \
             canary_percent, scope_customers, scope_plans) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11) RETURNING {COLUMNS}"
        );
        let row = sqlx::query(&sql)
            .bind(m.name)
            .bind(m.version)
            .bind(m.sha256)
            .bind(m.bytes.to_vec())
            .bind(m.bytes.len() as i64)
            .bind(now)
            .bind(m.installed_by)
            .bind(mode)
            .bind(percent)
            .bind(customers)
            .bind(plans)
            .fetch_one(&mut *tx)
            .await?;
        let stored = StoredModule::from_cols(&row)?;
        tx.commit().await?;
        Ok(stored)
    }

    /// The stored modules every gateway runs (see `RUNNING`), by name and id.
    pub async fn live_policy_modules(&self) -> Result<Vec<StoredModule>, StoreError> {
        let sql = format!("SELECT {COLUMNS} FROM policy_modules m WHERE {RUNNING} ORDER BY name, id");
        let rows = sqlx::query(&sql).fetch_all(&self.read).await?;
        rows.iter().map(StoredModule::from_cols).collect()
    }

    /// The shadow or canary of `name` that runs, if any.
    pub async fn policy_trial(&self, name: &str) -> Result<Option<StoredModule>, StoreError> {
        let sql = format!(
            "SELECT {COLUMNS} FROM policy_modules WHERE name = $1 AND retired_at IS NULL AND mode <> 'live' \
             ORDER BY id DESC LIMIT 1"
        );
        let row = sqlx::query(&sql).bind(name).fetch_optional(&self.read).await?;
        row.as_ref().map(StoredModule::from_cols).transpose()
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

    /// Makes the shadow or canary of `name` its live module: a new live row with the
    /// same bytes (the live row before it stays, for `rollback`), the trial retired, in
    /// one transaction. `(the trial, the new live row)`, or `None` when no trial runs.
    pub async fn promote_policy_module(
        &self,
        name: &str,
        by: &str,
    ) -> Result<Option<(StoredModule, StoredModule)>, StoreError> {
        let now = now_ms();
        let mut tx = self.write.begin().await?;
        let sql = format!(
            "UPDATE policy_modules SET retired_at = $2 WHERE id = (SELECT MAX(id) FROM policy_modules \
             WHERE name = $1 AND retired_at IS NULL AND mode <> 'live') RETURNING {COLUMNS}"
        );
        let Some(trial) = sqlx::query(&sql).bind(name).bind(now).fetch_optional(&mut *tx).await? else {
            return Ok(None);
        };
        let trial = StoredModule::from_cols(&trial)?;
        let sql = format!(
            "INSERT INTO policy_modules (name, version, sha256, module, size, installed_at, installed_by, mode) \
             SELECT name, version, sha256, module, size, $2, $3, 'live' FROM policy_modules WHERE id = $1 \
             RETURNING {COLUMNS}"
        );
        let row = sqlx::query(&sql).bind(trial.id).bind(now).bind(by).fetch_one(&mut *tx).await?;
        let live = StoredModule::from_cols(&row)?;
        tx.commit().await?;
        Ok(Some((trial, live)))
    }

    /// Retires the shadow or canary of `name` if one runs, else its newest stored row
    /// (the one before it, or the directory's or bundled module, runs again); returns
    /// it, or `None` when the store holds no unretired module of that name.
    pub async fn retire_policy_module(&self, name: &str) -> Result<Option<StoredModule>, StoreError> {
        let sql = format!(
            "UPDATE policy_modules SET retired_at = $2 WHERE id = COALESCE(\
             (SELECT MAX(id) FROM policy_modules WHERE name = $1 AND retired_at IS NULL AND mode <> 'live'), \
             (SELECT MAX(id) FROM policy_modules WHERE name = $1 AND retired_at IS NULL)) RETURNING {COLUMNS}"
        );
        let row = sqlx::query(&sql).bind(name).bind(now_ms()).fetch_optional(&self.write).await?;
        row.as_ref().map(StoredModule::from_cols).transpose()
    }
}

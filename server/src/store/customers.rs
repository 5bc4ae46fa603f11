//! Customers (plan, modules, limit overrides) and their instances.

use super::{Cols, Forget, FromCols, Store, StoreError, flag, new_id, now_ms};
use sqlx::Row;

/// Length of a plan period.
pub const PLAN_PERIOD_MS: i64 = 30 * 24 * 60 * 60 * 1000;

/// Where a customer's plan stands right now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PlanStatus {
    None,
    PendingApproval,
    Active,
    Expired,
}

impl PlanStatus {
    /// The name printed by the CLI.
    pub fn as_str(self) -> &'static str {
        match self {
            PlanStatus::None => "none",
            PlanStatus::PendingApproval => "pending_approval",
            PlanStatus::Active => "active",
            PlanStatus::Expired => "expired",
        }
    }
}

/// An operator's reviewed override of the plan's limits (None: the plan's value).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LimitOverrides {
    pub daily: Option<i64>,
    pub monthly: Option<i64>,
    pub instance_per_minute: Option<i64>,
    pub recipient_per_minute: Option<i64>,
}

/// A customer (tenant).
#[derive(Clone, Debug)]
pub struct Customer {
    pub id: String,
    pub name: String,
    pub plan: Option<String>,
    stored_status: String,
    pub plan_period_start: Option<i64>,
    pub plan_period_end: Option<i64>,
    pub module_api: bool,
    pub module_pbx: bool,
    pub overrides: LimitOverrides,
    /// Purposes the operator approved (`None`: all five).
    pub approved_purposes: Option<Vec<String>>,
    pub created_at: i64,
}

impl Customer {
    /// The plan's status at `now` (an active plan past its period is expired).
    pub fn plan_status(&self, now: i64) -> PlanStatus {
        match self.stored_status.as_str() {
            "active" if self.plan_period_end.is_some_and(|end| now >= end) => PlanStatus::Expired,
            "active" => PlanStatus::Active,
            "pending_approval" => PlanStatus::PendingApproval,
            _ => PlanStatus::None,
        }
    }
}

impl FromCols for Customer {
    fn from_cols(r: &impl Cols) -> Result<Customer, StoreError> {
        Ok(Customer {
            id: r.col("id")?,
            name: r.col("name")?,
            plan: r.col("plan")?,
            stored_status: r.col("plan_status")?,
            plan_period_start: r.col("plan_period_start")?,
            plan_period_end: r.col("plan_period_end")?,
            module_api: flag(r.col("module_api")?),
            module_pbx: flag(r.col("module_pbx")?),
            overrides: LimitOverrides {
                daily: r.col("daily_limit")?,
                monthly: r.col("monthly_limit")?,
                instance_per_minute: r.col("instance_per_minute")?,
                recipient_per_minute: r.col("recipient_per_minute")?,
            },
            approved_purposes: r
                .col::<Option<String>>("approved_purposes")?
                .map(|p| p.split(',').filter(|s| !s.is_empty()).map(str::to_string).collect()),
            created_at: r.col("created_at")?,
        })
    }
}

/// A connected (or connectable) phone number of a customer.
#[derive(Clone, Debug)]
pub struct Instance {
    pub id: String,
    pub customer_id: String,
    pub name: String,
    pub provider: String,
    pub connection_state: String,
    pub paused: bool,
    pub paused_reason: Option<String>,
    pub created_at: i64,
}

impl FromCols for Instance {
    fn from_cols(r: &impl Cols) -> Result<Instance, StoreError> {
        Ok(Instance {
            id: r.col("id")?,
            customer_id: r.col("customer_id")?,
            name: r.col("name")?,
            provider: r.col("provider")?,
            connection_state: r.col("connection_state")?,
            paused: flag(r.col("paused")?),
            paused_reason: r.col("paused_reason")?,
            created_at: r.col("created_at")?,
        })
    }
}

impl Instance {
    /// Reads the instance columns named `{prefix}{column}`.
    pub(super) fn from_prefixed_row(r: &impl Cols, prefix: &str) -> Result<Instance, StoreError> {
        Instance::from_cols(&super::rows::Prefixed::new(r, prefix))
    }
}

/// The stored status and period of a newly assigned plan.
fn plan_columns(plan: Option<&str>, approve: bool, now: i64) -> (&'static str, Option<i64>, Option<i64>) {
    match plan {
        None => ("none", None, None),
        Some("scale") if !approve => ("pending_approval", None, None),
        Some(_) => ("active", Some(now), Some(now + PLAN_PERIOD_MS)),
    }
}

pub(super) const CUSTOMER_COLUMNS: &str = "id, name, plan, plan_status, plan_period_start, plan_period_end, \
     module_api, module_pbx, daily_limit, monthly_limit, instance_per_minute, recipient_per_minute, approved_purposes, \
     created_at";
pub(super) const INSTANCE_COLUMNS: &str =
    "id, customer_id, name, provider, connection_state, paused, paused_reason, created_at";

impl Store {
    /// Creates a customer with the `api` module on and `pbx` off. A Scale plan starts
    /// pending approval unless `approve`.
    pub async fn create_customer(&self, name: &str, plan: Option<&str>, approve: bool) -> Result<Customer, StoreError> {
        let now = now_ms();
        let id = new_id("cus");
        let (status, start, end) = plan_columns(plan, approve, now);
        sqlx::query(
            "INSERT INTO customers (id, name, plan, plan_status, plan_period_start, plan_period_end, created_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7)",
        )
        .bind(&id)
        .bind(name)
        .bind(plan)
        .bind(status)
        .bind(start)
        .bind(end)
        .bind(now)
        .execute(&self.write)
        .await?;
        self.customer(&id).await
    }

    /// One customer.
    pub async fn customer(&self, id: &str) -> Result<Customer, StoreError> {
        let row = sqlx::query(&format!("SELECT {CUSTOMER_COLUMNS} FROM customers WHERE id = $1"))
            .bind(id)
            .fetch_optional(&self.read)
            .await?
            .ok_or_else(|| StoreError::NotFound(format!("customer {id}")))?;
        Customer::from_cols(&row)
    }

    /// The oldest customer with this name, if any.
    pub async fn customer_by_name(&self, name: &str) -> Result<Option<Customer>, StoreError> {
        let row = sqlx::query(&format!(
            "SELECT {CUSTOMER_COLUMNS} FROM customers WHERE name = $1 ORDER BY created_at, id LIMIT 1"
        ))
        .bind(name)
        .fetch_optional(&self.read)
        .await?;
        row.as_ref().map(Customer::from_cols).transpose()
    }

    /// Turns modules on or off (None leaves one as it is).
    pub async fn set_modules(&self, id: &str, api: Option<bool>, pbx: Option<bool>) -> Result<Customer, StoreError> {
        let update = sqlx::query(
            "UPDATE customers SET module_api = COALESCE($2, module_api), module_pbx = COALESCE($3, module_pbx) \
             WHERE id = $1",
        )
        .bind(id)
        .bind(api.map(i64::from))
        .bind(pbx.map(i64::from));
        self.update_one(update, Forget::Cache, || format!("customer {id}")).await?;
        self.customer(id).await
    }

    /// Assigns a plan and starts a new 30-day period (Scale waits for approval unless
    /// `approve`).
    pub async fn assign_plan(&self, id: &str, plan: &str, approve: bool) -> Result<Customer, StoreError> {
        let (status, start, end) = plan_columns(Some(plan), approve, now_ms());
        let update = sqlx::query(
            "UPDATE customers SET plan = $2, plan_status = $3, plan_period_start = $4, plan_period_end = $5 \
             WHERE id = $1",
        )
        .bind(id)
        .bind(plan)
        .bind(status)
        .bind(start)
        .bind(end);
        self.update_one(update, Forget::Cache, || format!("customer {id}")).await?;
        self.customer(id).await
    }

    /// Sets the given limit overrides (others unchanged).
    pub async fn set_limits(&self, id: &str, limits: &LimitOverrides) -> Result<Customer, StoreError> {
        let update = sqlx::query(
            "UPDATE customers SET daily_limit = COALESCE($2, daily_limit), \
             monthly_limit = COALESCE($3, monthly_limit), \
             instance_per_minute = COALESCE($4, instance_per_minute), \
             recipient_per_minute = COALESCE($5, recipient_per_minute) WHERE id = $1",
        )
        .bind(id)
        .bind(limits.daily)
        .bind(limits.monthly)
        .bind(limits.instance_per_minute)
        .bind(limits.recipient_per_minute);
        self.update_one(update, Forget::Cache, || format!("customer {id}")).await?;
        self.customer(id).await
    }

    /// Creates an instance. While the plan is active, its instance cap applies
    /// (`plan_cap`); a customer without an active plan may get instances ahead of
    /// approval.
    pub async fn create_instance(
        &self,
        customer_id: &str,
        name: &str,
        provider: &str,
        connected: bool,
        plan_cap: Option<i64>,
    ) -> Result<Instance, StoreError> {
        let mut tx = self.write.begin().await?;
        // Take the write lock first (SQLite) so the count below cannot go stale.
        let touched =
            sqlx::query("UPDATE customers SET name = name WHERE id = $1").bind(customer_id).execute(&mut *tx).await?;
        if touched.rows_affected() == 0 {
            return Err(StoreError::NotFound(format!("customer {customer_id}")));
        }
        if let Some(cap) = plan_cap {
            let count: i64 = sqlx::query("SELECT COUNT(*) AS n FROM instances WHERE customer_id = $1")
                .bind(customer_id)
                .fetch_one(&mut *tx)
                .await?
                .try_get("n")?;
            if count >= cap {
                return Err(StoreError::InstanceCap { cap, count });
            }
        }
        let taken = sqlx::query("SELECT id FROM instances WHERE customer_id = $1 AND name = $2")
            .bind(customer_id)
            .bind(name)
            .fetch_optional(&mut *tx)
            .await?;
        if taken.is_some() {
            return Err(StoreError::Conflict(format!("the customer already has an instance named {name:?}")));
        }
        let id = new_id("ins");
        sqlx::query(
            "INSERT INTO instances (id, customer_id, name, provider, connection_state, created_at) \
             VALUES ($1, $2, $3, $4, $5, $6)",
        )
        .bind(&id)
        .bind(customer_id)
        .bind(name)
        .bind(provider)
        .bind(if connected { "open" } else { "close" })
        .bind(now_ms())
        .execute(&mut *tx)
        .await?;
        self.forget_cached();
        tx.commit().await?;
        self.instance(&id).await
    }

    /// Removes an instance that nothing refers to yet (its creation at the provider
    /// failed).
    pub async fn delete_instance(&self, id: &str) -> Result<(), StoreError> {
        sqlx::query("DELETE FROM instances WHERE id = $1").bind(id).execute(&self.write).await?;
        self.forget_cached();
        Ok(())
    }

    /// One instance by id.
    pub async fn instance(&self, id: &str) -> Result<Instance, StoreError> {
        let row = sqlx::query(&format!("SELECT {INSTANCE_COLUMNS} FROM instances WHERE id = $1"))
            .bind(id)
            .fetch_optional(&self.read)
            .await?
            .ok_or_else(|| StoreError::NotFound(format!("instance {id}")))?;
        Instance::from_cols(&row)
    }

    /// The customer's instance with this id or, failing that, this name.
    pub async fn find_instance(&self, customer_id: &str, id_or_name: &str) -> Result<Option<Instance>, StoreError> {
        let row = sqlx::query(&format!(
            "SELECT {INSTANCE_COLUMNS} FROM instances WHERE customer_id = $1 AND (id = $2 OR name = $2) \
             ORDER BY CASE WHEN id = $2 THEN 0 ELSE 1 END LIMIT 1"
        ))
        .bind(customer_id)
        .bind(id_or_name)
        .fetch_optional(&self.read)
        .await?;
        row.as_ref().map(Instance::from_cols).transpose()
    }

    /// Pauses an instance for review, or resumes it.
    pub async fn set_paused(&self, id: &str, paused: bool, reason: Option<&str>) -> Result<Instance, StoreError> {
        let update = sqlx::query("UPDATE instances SET paused = $2, paused_reason = $3 WHERE id = $1")
            .bind(id)
            .bind(i64::from(paused))
            .bind(if paused { reason } else { None });
        self.update_one(update, Forget::Cache, || format!("instance {id}")).await?;
        self.instance(id).await
    }

    /// Declares how long the instance's number has been in use (its age is what the
    /// pacing policy's warm-up reads): a number moved from elsewhere is not new.
    pub async fn set_instance_age(&self, id: &str, days: i64) -> Result<Instance, StoreError> {
        let created_at = now_ms().saturating_sub(crate::bounds::days_ms(days.max(0)));
        let update = sqlx::query("UPDATE instances SET created_at = $2 WHERE id = $1").bind(id).bind(created_at);
        self.update_one(update, Forget::Cache, || format!("instance {id}")).await?;
        self.instance(id).await
    }

    /// Adds (or updates the reason of) a suppressed recipient.
    pub async fn add_suppression(
        &self,
        customer_id: &str,
        phone: &str,
        reason: &str,
        source: &str,
    ) -> Result<(), StoreError> {
        self.customer(customer_id).await?;
        sqlx::query(
            "INSERT INTO suppressed_recipients (customer_id, phone, reason, source, created_at) \
             VALUES ($1, $2, $3, $4, $5) \
             ON CONFLICT (customer_id, phone) DO UPDATE SET reason = excluded.reason, source = excluded.source",
        )
        .bind(customer_id)
        .bind(phone)
        .bind(reason)
        .bind(source)
        .bind(now_ms())
        .execute(&self.write)
        .await?;
        Ok(())
    }

    /// Removes a suppressed recipient; false when it was not there.
    pub async fn remove_suppression(&self, customer_id: &str, phone: &str) -> Result<bool, StoreError> {
        let done = sqlx::query("DELETE FROM suppressed_recipients WHERE customer_id = $1 AND phone = $2")
            .bind(customer_id)
            .bind(phone)
            .execute(&self.write)
            .await?;
        Ok(done.rows_affected() > 0)
    }
}

//! Customers and their plans: creation, plans, limits, modules and approved purposes.

use super::{OpsError, in_range, rfc3339};
use crate::bounds;
use crate::store::{Customer, LimitOverrides, Store, now_ms};
use serde_json::{Value, json};

/// A customer as printed.
pub fn customer_json(c: &Customer) -> Value {
    let now = now_ms();
    json!({
        "id": c.id,
        "name": c.name,
        "plan": c.plan,
        "plan_status": c.plan_status(now).as_str(),
        "plan_period_start": c.plan_period_start.and_then(rfc3339),
        "plan_period_end": c.plan_period_end.and_then(rfc3339),
        "modules": {"api": c.module_api, "pbx": c.module_pbx},
        "limit_overrides": {
            "daily": c.overrides.daily,
            "monthly": c.overrides.monthly,
            "instance_per_minute": c.overrides.instance_per_minute,
            "recipient_per_minute": c.overrides.recipient_per_minute,
        },
        "approved_purposes": match &c.approved_purposes {
            Some(p) => json!(p),
            None => json!(gateway_policy_model::PURPOSES),
        },
    })
}

fn check_plan(plan: &str) -> Result<(), OpsError> {
    match crate::config::PLAN_NAMES.contains(&plan) {
        true => Ok(()),
        false => Err(OpsError::Invalid(format!("plan must be starter or scale, not {plan:?}"))),
    }
}

/// Creates a customer; `plan` None means no plan yet.
pub async fn create_customer(
    store: &Store,
    name: &str,
    plan: Option<&str>,
    approve: bool,
) -> Result<Customer, OpsError> {
    if name.trim().is_empty() {
        return Err(OpsError::Invalid("the name must not be empty".into()));
    }
    if let Some(plan) = plan {
        check_plan(plan)?;
    }
    Ok(store.create_customer(name.trim(), plan, approve).await?)
}

/// One customer.
pub async fn customer(store: &Store, id: &str) -> Result<Customer, OpsError> {
    Ok(store.customer(id).await?)
}

/// Assigns (or renews) a plan.
pub async fn assign_plan(store: &Store, customer_id: &str, plan: &str, approve: bool) -> Result<Customer, OpsError> {
    check_plan(plan)?;
    Ok(store.assign_plan(customer_id, plan, approve).await?)
}

/// Sets an operator's reviewed limit overrides.
pub async fn set_limits(store: &Store, customer_id: &str, limits: &LimitOverrides) -> Result<Customer, OpsError> {
    in_range("the daily limit", limits.daily, &bounds::DAILY_MESSAGES)?;
    in_range("the monthly limit", limits.monthly, &bounds::MONTHLY_MESSAGES)?;
    in_range("sends a minute per instance", limits.instance_per_minute, &bounds::INSTANCE_PER_MINUTE)?;
    in_range("sends a minute per recipient", limits.recipient_per_minute, &bounds::RECIPIENT_PER_MINUTE)?;
    Ok(store.set_limits(customer_id, limits).await?)
}

/// Turns the api and pbx modules on or off (`None` leaves one as it is).
pub async fn set_modules(
    store: &Store,
    customer_id: &str,
    api: Option<bool>,
    pbx: Option<bool>,
) -> Result<Customer, OpsError> {
    Ok(store.set_modules(customer_id, api, pbx).await?)
}

/// Sets the purposes the customer is approved for (`None`: all five).
pub async fn set_purposes(store: &Store, customer_id: &str, purposes: Option<&[String]>) -> Result<Customer, OpsError> {
    store.set_approved_purposes(customer_id, purposes).await?;
    Ok(store.customer(customer_id).await?)
}

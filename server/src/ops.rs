//! Operator actions: what the `gateway` CLI (and, later, the operator console) does to
//! customers, instances, keys and suppression. Each returns a JSON record to print.

use crate::apikey;
use crate::config::Config;
use crate::send::phone;
use crate::store::{ApiKeyRecord, Customer, Instance, LimitOverrides, PlanStatus, Store, StoreError, now_ms};
use serde_json::{Value, json};

/// An operator action that could not be done.
#[derive(Debug, thiserror::Error)]
pub enum OpsError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("{0}")]
    Invalid(String),
}

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
    })
}

/// An instance as printed.
pub fn instance_json(i: &Instance) -> Value {
    json!({
        "id": i.id,
        "customer_id": i.customer_id,
        "name": i.name,
        "provider": i.provider,
        "connection_state": i.connection_state,
        "paused": i.paused,
        "paused_reason": i.paused_reason,
    })
}

/// A key as printed (never the key itself; see [`create_key`]).
pub fn key_json(k: &ApiKeyRecord) -> Value {
    json!({
        "id": k.id,
        "customer_id": k.customer_id,
        "name": k.name,
        "prefix": k.prefix,
        "revoked": k.revoked_at.is_some(),
        "revoked_at": k.revoked_at.and_then(rfc3339),
        "last_used_at": k.last_used_at.and_then(rfc3339),
    })
}

fn rfc3339(ms: i64) -> Option<String> {
    chrono::DateTime::from_timestamp_millis(ms).map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
}

fn check_plan(plan: &str) -> Result<(), OpsError> {
    match plan {
        "starter" | "scale" => Ok(()),
        other => Err(OpsError::Invalid(format!("plan must be starter or scale, not {other:?}"))),
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

/// Assigns (or renews) a plan.
pub async fn assign_plan(store: &Store, customer_id: &str, plan: &str, approve: bool) -> Result<Customer, OpsError> {
    check_plan(plan)?;
    Ok(store.assign_plan(customer_id, plan, approve).await?)
}

/// Sets an operator's reviewed limit overrides.
pub async fn set_limits(store: &Store, customer_id: &str, limits: &LimitOverrides) -> Result<Customer, OpsError> {
    let all = [limits.daily, limits.monthly, limits.instance_per_minute, limits.recipient_per_minute];
    if all.iter().flatten().any(|n| *n < 1) {
        return Err(OpsError::Invalid("limits must be at least 1".into()));
    }
    Ok(store.set_limits(customer_id, limits).await?)
}

/// Creates an instance, within the plan's instance cap while the plan is active.
pub async fn create_instance(
    store: &Store,
    config: &Config,
    customer_id: &str,
    name: &str,
    connected: bool,
) -> Result<Instance, OpsError> {
    let name = name.trim();
    if name.is_empty() || name.len() > 64 {
        return Err(OpsError::Invalid("the name must be 1 to 64 characters".into()));
    }
    let customer = store.customer(customer_id).await?;
    let cap = match customer.plan_status(now_ms()) {
        PlanStatus::Active => customer.plan.as_deref().and_then(|p| config.plan(p)).map(|p| p.instances),
        _ => None,
    };
    Ok(store.create_instance(customer_id, name, &config.provider, connected, cap).await?)
}

/// Creates an API key; the returned JSON holds the key, shown this once.
pub async fn create_key(store: &Store, customer_id: &str, name: &str) -> Result<Value, OpsError> {
    let new = apikey::generate();
    let record = store.insert_api_key(customer_id, name, &new.prefix, &new.hash).await?;
    let mut out = key_json(&record);
    out["api_key"] = Value::String(new.plaintext);
    Ok(out)
}

/// Normalises a phone given on the command line.
pub fn phone_arg(raw: &str) -> Result<String, OpsError> {
    phone::normalize(raw)
        .map(|p| p.e164)
        .ok_or_else(|| OpsError::Invalid(format!("{raw:?} is not a valid number in international format")))
}

/// Name of the demo customer.
pub const DEMO_CUSTOMER: &str = "Demo customer";

/// The demo tenant: a Starter customer, a connected simulated instance named `demo`,
/// and a new API key. Running it again reuses the customer and the instance (renewing
/// an expired plan) and prints a fresh key.
pub async fn demo(store: &Store, config: &Config) -> Result<Value, OpsError> {
    let customer = match store.customer_by_name(DEMO_CUSTOMER).await? {
        Some(c) if c.plan_status(now_ms()) == PlanStatus::Active => c,
        Some(c) => store.assign_plan(&c.id, "starter", true).await?,
        None => store.create_customer(DEMO_CUSTOMER, Some("starter"), true).await?,
    };
    let instance = match store.find_instance(&customer.id, "demo").await? {
        Some(i) => i,
        None => create_instance(store, config, &customer.id, "demo", true).await?,
    };
    let key = create_key(store, &customer.id, "demo").await?;
    Ok(json!({
        "customer_id": customer.id,
        "instance_id": instance.id,
        "instance_name": instance.name,
        "api_key_id": key["id"],
        "api_key": key["api_key"],
    }))
}

//! The demo tenant.

use super::OpsError;
use super::instances::create_instance;
use super::keys::create_key;
use crate::config::Config;
use crate::store::{PlanStatus, Store, now_ms};
use serde_json::{Value, json};

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

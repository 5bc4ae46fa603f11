//! Suppressed recipients: a customer's numbers that are never messaged.

use super::{OpsError, phone_arg};
use crate::store::Store;
use serde_json::{Value, json};

/// Suppresses a recipient (any form of number the API accepts) for a customer, or
/// updates the reason of one already suppressed.
pub async fn add_suppression(store: &Store, customer_id: &str, phone: &str, reason: &str) -> Result<Value, OpsError> {
    let phone = phone_arg(phone)?;
    store.add_suppression(customer_id, &phone, reason, "manual").await?;
    Ok(json!({"customer_id": customer_id, "phone": phone, "suppressed": true, "reason": reason}))
}

/// Removes a suppressed recipient; `removed` says whether it was there.
pub async fn remove_suppression(store: &Store, customer_id: &str, phone: &str) -> Result<Value, OpsError> {
    let phone = phone_arg(phone)?;
    let removed = store.remove_suppression(customer_id, &phone).await?;
    Ok(json!({"customer_id": customer_id, "phone": phone, "suppressed": false, "removed": removed}))
}

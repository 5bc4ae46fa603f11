//! The data as a whole: migrations, backups, retention and data-subject erasure.

use super::{OpsError, phone_arg};
use crate::config::Config;
use crate::store::{Store, now_ms};
use serde_json::{Value, json};
use std::path::Path;

/// What `migrate` prints once the store is open (opening it applied the migrations).
pub fn migrated(store: &Store) -> Value {
    json!({"migrated": true, "backend": format!("{:?}", store.backend()).to_lowercase()})
}

/// Copies a SQLite store, consistently, while it serves, to `to` (which must not exist).
pub async fn backup(store: &Store, to: &Path) -> Result<Value, OpsError> {
    let bytes = store.backup_to(to).await?;
    Ok(json!({"backup": to.display().to_string(), "bytes": bytes}))
}

/// The retention in force, as `retention run` prints it.
pub fn retention_json(config: &Config) -> Value {
    let r = &config.retention;
    json!({
        "message_log_days": r.message_log_days, "inbound_days": r.inbound_days,
        "provider_events_hours": r.provider_events_hours,
        "failed_provider_events_days": r.failed_provider_events_days, "review_days": r.review_days,
        "contacts_days": r.contacts_days, "webhook_attempts_days": config.webhooks.retention_days,
        "pbx_events_days": config.pbx.event_retention_days,
        "policy_inputs_days": config.policies.input_retention_days,
    })
}

/// Deletes every row past its retention now: the rows deleted per table, and the
/// retention in force.
pub async fn run_retention(store: &Store, config: &Config) -> Result<Value, OpsError> {
    let report = store.run_retention(&crate::retention_plan(config, now_ms())).await?;
    let pruned: serde_json::Map<String, Value> = report.iter().map(|p| (p.table.to_string(), json!(p.rows))).collect();
    Ok(json!({"pruned": pruned, "retention": retention_json(config)}))
}

/// Removes or redacts what the gateway holds about one phone number (any form the API
/// accepts) for one customer; a suppression is kept. Prints the tables it touched.
pub async fn erase_person(store: &Store, customer_id: &str, phone: &str) -> Result<Value, OpsError> {
    let phone = phone_arg(phone)?;
    let report = store.erase_person(customer_id, &phone).await?;
    let touched: Vec<Value> = report
        .iter()
        .filter(|e| e.rows > 0 || e.action == "kept")
        .map(|e| json!({"table": e.table, "action": e.action, "rows": e.rows}))
        .collect();
    Ok(json!({"customer_id": customer_id, "phone": phone, "touched": touched}))
}

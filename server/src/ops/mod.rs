//! Operator actions: what the `gateway` CLI and the operator console (and the customer
//! dashboard, where a customer may do the same) run on customers, instances, keys,
//! suppressions, PBX integrations, webhooks, the review queue and the data. Each
//! resource has its file, with the JSON renderers of what its operations print beside
//! them; an operation returns a record or a JSON document to print.
//!
//! `ops` sits under the CLI and the dashboard: it imports neither the dashboard nor
//! `http` (docs/architecture.md).

pub mod customers;
pub mod data;
pub mod demo;
pub mod instances;
pub mod keys;
pub mod pbx;
pub mod reviews;
pub mod suppression;
pub mod users;
pub mod webhooks;

use crate::bounds;
use crate::phone;
use crate::store::StoreError;

// The operations the dashboard and the SDK tests call by their flat names.
pub use customers::{assign_plan, create_customer, set_limits};
pub use instances::{
    confirm_pairing, create_instance, create_instance_with, instance_qr, logout_instance, sync_instance_state,
};
pub use keys::create_key;
pub use pbx::{cooldown_seconds, create_pbx, rotate_pbx_secret, set_pbx_template, update_pbx};
pub use webhooks::{SecretChoice, rotate_webhook_secret, set_webhook, webhook_attempt_now, webhook_json};

/// An operator action that could not be done.
#[derive(Debug, thiserror::Error)]
pub enum OpsError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("{0}")]
    Invalid(String),
}

/// Normalises a phone given on the command line.
pub fn phone_arg(raw: &str) -> Result<String, OpsError> {
    phone::normalize(raw)
        .map(|p| p.e164)
        .ok_or_else(|| OpsError::Invalid(format!("{raw:?} is not a valid number in international format")))
}

/// A comma-separated list of purposes, each one of the five.
pub fn purposes_arg(raw: &str) -> anyhow::Result<Vec<String>> {
    let purposes: Vec<String> = raw.split(',').map(|p| p.trim().to_string()).filter(|p| !p.is_empty()).collect();
    if let Some(bad) = purposes.iter().find(|p| !gateway_policy_model::PURPOSES.contains(&p.as_str())) {
        anyhow::bail!("{bad:?} is not a purpose (use {})", gateway_policy_model::PURPOSES.join(", "));
    }
    Ok(purposes)
}

/// A time as printed: RFC 3339, in whole seconds, UTC.
fn rfc3339(ms: i64) -> Option<String> {
    chrono::DateTime::from_timestamp_millis(ms).map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
}

/// Checks `value` (when given) against its documented range.
fn in_range(name: &str, value: Option<i64>, range: &std::ops::RangeInclusive<i64>) -> Result<(), OpsError> {
    match value {
        Some(v) => bounds::within(name, v, range).map(|_| ()).map_err(OpsError::Invalid),
        None => Ok(()),
    }
}

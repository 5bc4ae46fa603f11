//! API keys: created (the key shown once) and revoked.

use super::{OpsError, rfc3339};
use crate::apikey;
use crate::store::{ApiKeyRecord, Store};
use serde_json::{Value, json};

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

/// Creates an API key; the returned JSON holds the key, shown this once.
pub async fn create_key(store: &Store, customer_id: &str, name: &str) -> Result<Value, OpsError> {
    let new = apikey::generate();
    let record = store.insert_api_key(customer_id, name, &new.prefix, &new.hash).await?;
    let mut out = key_json(&record);
    out["api_key"] = Value::String(new.plaintext);
    Ok(out)
}

/// Revokes an API key (it stops working on the next request; revoking twice keeps the
/// first time).
pub async fn revoke_key(store: &Store, key_id: &str) -> Result<ApiKeyRecord, OpsError> {
    Ok(store.revoke_api_key(key_id).await?)
}

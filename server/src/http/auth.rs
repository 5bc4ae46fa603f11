//! Bearer API key authentication of the public endpoints.

use crate::apikey;
use crate::store::{ApiKeyRecord, Store};
use gateway_api::ApiError;
use http::HeaderMap;
use http::header::AUTHORIZATION;

fn invalid() -> ApiError {
    ApiError::new(401, "invalid_api_key", "a valid API key is required (Authorization: Bearer <API_KEY>)")
}

/// The key presented in `Authorization: Bearer <key>`, checked against the store
/// (through its cache: see `Store::api_key_for_request`; the send's own read sees a
/// revocation the cache has not yet).
/// Missing, malformed or unknown: 401 `invalid_api_key`; revoked: 401 `revoked_api_key`.
pub async fn authenticate(store: &Store, headers: &HeaderMap) -> Result<ApiKeyRecord, ApiError> {
    let mut values = headers.get_all(AUTHORIZATION).iter();
    let (Some(value), None) = (values.next(), values.next()) else {
        return Err(invalid());
    };
    let value = value.to_str().map_err(|_| invalid())?;
    let (scheme, key) = value.trim().split_once(' ').ok_or_else(invalid)?;
    if !scheme.eq_ignore_ascii_case("bearer") {
        return Err(invalid());
    }
    let key = key.trim();
    if !apikey::well_formed(key) {
        return Err(invalid());
    }
    let hash = apikey::hash(key);
    let record = store.api_key_for_request(&hash).await?.ok_or_else(invalid)?;
    if record.revoked_at.is_some() {
        return Err(revoked(&record));
    }
    Ok(record)
}

/// 401 `revoked_api_key` for this key (also when the send's own read finds it revoked
/// after the lookup: see `Store::send_context`).
pub fn revoked(record: &ApiKeyRecord) -> ApiError {
    ApiError::new(401, "revoked_api_key", "this API key has been revoked")
        .with_detail("key_prefix", record.prefix.clone())
}

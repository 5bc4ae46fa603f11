//! Bearer API key authentication of the public endpoints.

use crate::apikey;
use crate::store::{ApiKeyRecord, Store};
use gateway_api::ApiError;
use http::HeaderMap;
use http::header::AUTHORIZATION;

fn invalid() -> ApiError {
    ApiError::new(401, "invalid_api_key", "a valid API key is required (Authorization: Bearer <API_KEY>)")
}

/// The key presented in `Authorization: Bearer <key>`, checked against the store.
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
    let record = store.api_key_by_hash(&apikey::hash(key)).await?.ok_or_else(invalid)?;
    if record.revoked_at.is_some() {
        return Err(ApiError::new(401, "revoked_api_key", "this API key has been revoked")
            .with_detail("key_prefix", record.prefix.clone()));
    }
    Ok(record)
}

//! Store errors as wire errors: a database out of reach is 503 `service_unavailable`,
//! anything else 500. The send pipeline's errors and kept answers are rendered in its
//! own room (`send/answer.rs`). Internal detail (database errors, provider messages)
//! goes to the log, never to the caller.

use crate::store::StoreError;
use gateway_api::ApiError;

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> ApiError {
        ApiError::from(&e)
    }
}

impl From<&StoreError> for ApiError {
    fn from(e: &StoreError) -> ApiError {
        if e.is_unavailable() { unavailable(e.to_string()) } else { ApiError::internal(e.to_string()) }
    }
}

/// 503 `service_unavailable`: the database is out of reach for now; a retry may pass.
pub fn unavailable(internal: impl Into<String>) -> ApiError {
    ApiError::new(503, "service_unavailable", "the gateway cannot reach its database right now; retry shortly")
        .with_detail("retry_after_seconds", 1)
        .with_internal(internal)
}

//! The error body of every error response of the public endpoints.
//!
//! `ApiError` serialises as the specification's error body and is the error type of
//! every endpoint in the trait, so Dropshot's extractor failures also pass through
//! `From<HttpError>` and come out in the same shape. Domain errors are mapped onto it in
//! one place in the server (`http/error.rs`); this type only carries the result.

use dropshot::{ErrorStatusCode, HttpError, HttpResponseError};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::fmt;

/// The wire form of an error: `{success:false, error, message, details}`.
///
/// Open to additive fields (no `deny_unknown_fields`): generated clients must not break
/// when a later version adds one.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
pub struct ErrorBody {
    /// Always `false`.
    pub success: bool,
    /// Stable error code, for example `invalid_api_key` or `sending_throttled`.
    pub error: String,
    /// Human-readable text; may change between versions.
    pub message: String,
    /// Structured facts about the error: `field` for validation errors; `limit`,
    /// `used` and `resets_at` for quota errors; `retry_after_seconds` for throttling;
    /// `policy`, `reason`, `action` and `risk_score` for policy denials.
    pub details: Map<String, Value>,
}

/// An error answered by a public endpoint.
#[derive(Clone, Debug)]
pub struct ApiError {
    /// HTTP status (4xx or 5xx).
    pub status: ErrorStatusCode,
    /// Stable error code of the specification.
    pub code: &'static str,
    /// External, human-readable message.
    pub message: String,
    /// The `details` object.
    pub details: Map<String, Value>,
    /// Internal context for the log; never sent to the caller.
    pub internal: Option<String>,
}

/// Marker that carries our own code and details through Dropshot's `HttpError`.
const DETAILS_PREFIX: &str = "gateway-details:";

impl ApiError {
    /// A new error with an empty `details` object.
    pub fn new(status: u16, code: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status: ErrorStatusCode::from_u16(status).unwrap_or(ErrorStatusCode::INTERNAL_SERVER_ERROR),
            code,
            message: message.into(),
            details: Map::new(),
            internal: None,
        }
    }

    /// Adds one entry to `details`.
    pub fn with_detail(mut self, key: &str, value: impl Into<Value>) -> Self {
        self.details.insert(key.to_string(), value.into());
        self
    }

    /// Adds internal context for the log.
    pub fn with_internal(mut self, internal: impl Into<String>) -> Self {
        self.internal = Some(internal.into());
        self
    }

    /// 500 `internal_error` with a generic external message.
    pub fn internal(internal: impl Into<String>) -> Self {
        ApiError::new(500, "internal_error", "an unexpected error occurred").with_internal(internal)
    }

    /// The wire body.
    pub fn body(&self) -> ErrorBody {
        ErrorBody {
            success: false,
            error: self.code.to_string(),
            message: self.message.clone(),
            details: self.details.clone(),
        }
    }

    /// An error answered before and stored (an idempotent repeat): the stored body
    /// with its status. A code this version does not know becomes `internal_error`.
    pub fn from_stored(status: u16, body: ErrorBody) -> ApiError {
        let code = KNOWN_CODES.iter().find(|k| **k == body.error.as_str()).copied().unwrap_or("internal_error");
        ApiError { details: body.details, ..ApiError::new(status, code, body.message) }
    }

    /// Carries this error through an `HttpError` without loss (for extractors, which
    /// must return `HttpError`).
    pub fn into_http_error(self) -> HttpError {
        let details = Value::Object(self.details).to_string();
        HttpError {
            status_code: self.status,
            error_code: Some(self.code.to_string()),
            external_message: self.message,
            internal_message: format!("{DETAILS_PREFIX}{details}"),
            headers: None,
        }
    }
}

/// Codes of the specification, so that a code carried through `HttpError` comes back
/// as the same `&'static str`.
const KNOWN_CODES: &[&str] = &[
    "invalid_json",
    "invalid_api_key",
    "revoked_api_key",
    "module_not_enabled",
    "active_plan_required",
    "recipient_suppressed",
    "policy_violation",
    "invalid_instance",
    "unsupported_media_type",
    "validation_error",
    "message_purpose_required",
    "message_purpose_not_allowed",
    "missing_phone",
    "missing_message_text",
    "instance_paused_for_review",
    "daily_message_limit_exceeded",
    "monthly_message_limit_exceeded",
    "sending_throttled",
    "gateway_send_failed",
    "internal_error",
    "invalid_pbx_webhook",
    "payload_too_large",
    "webhook_rate_limited",
];

impl From<HttpError> for ApiError {
    fn from(e: HttpError) -> Self {
        if let (Some(code), Some(json)) = (&e.error_code, e.internal_message.strip_prefix(DETAILS_PREFIX))
            && let Some(code) = KNOWN_CODES.iter().find(|k| **k == code.as_str())
        {
            let details = match serde_json::from_str(json) {
                Ok(Value::Object(map)) => map,
                _ => Map::new(),
            };
            return ApiError { status: e.status_code, code, message: e.external_message, details, internal: None };
        }
        // Dropshot's own extractor and serialisation failures.
        let m = e.external_message.as_str();
        let (status, code): (u16, &'static str) = match e.status_code.as_u16() {
            400 if m.starts_with("request body exceeded maximum size") => (413, "payload_too_large"),
            400 if m.starts_with("unable to parse JSON body") => (400, "invalid_json"),
            400 if m.starts_with("error processing headers") => (422, "validation_error"),
            400 if m.starts_with("unable to parse query string") => (422, "validation_error"),
            400 if m.starts_with("bad parameter in URL path") => (422, "validation_error"),
            400 => (400, "invalid_json"),
            401 => (401, "invalid_api_key"),
            404 => (404, "invalid_instance"),
            413 => (413, "payload_too_large"),
            415 => (415, "unsupported_media_type"),
            422 => (422, "validation_error"),
            429 => (429, "sending_throttled"),
            _ => (500, "internal_error"),
        };
        let message = if status == 500 { "an unexpected error occurred".to_string() } else { e.external_message };
        ApiError::new(status, code, message).with_internal(e.internal_message)
    }
}

impl Serialize for ApiError {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.body().serialize(s)
    }
}

impl JsonSchema for ApiError {
    fn schema_name() -> String {
        "ErrorBody".to_string()
    }

    fn json_schema(g: &mut schemars::r#gen::SchemaGenerator) -> schemars::schema::Schema {
        ErrorBody::json_schema(g)
    }
}

impl HttpResponseError for ApiError {
    fn status_code(&self) -> ErrorStatusCode {
        self.status
    }
}

impl fmt::Display for ApiError {
    // What Dropshot logs for a failed request: code, message and internal context,
    // never request bodies.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.code, self.message)?;
        if let Some(internal) = &self.internal {
            write!(f, " ({internal})")?;
        }
        Ok(())
    }
}

impl std::error::Error for ApiError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn code_and_details_survive_the_trip_through_http_error() {
        let e = ApiError::new(429, "sending_throttled", "slow down").with_detail("retry_after_seconds", 7);
        let back = ApiError::from(e.into_http_error());
        assert_eq!(back.status.as_u16(), 429);
        assert_eq!(back.code, "sending_throttled");
        assert_eq!(back.details["retry_after_seconds"], 7);
    }

    #[test]
    fn dropshot_body_limit_error_becomes_413() {
        let e = HttpError::for_bad_request(None, "request body exceeded maximum size of 10 bytes".into());
        let back = ApiError::from(e);
        assert_eq!((back.status.as_u16(), back.code), (413, "payload_too_large"));
    }

    #[test]
    fn unknown_code_is_not_trusted() {
        let mut e = ApiError::new(400, "invalid_json", "x").into_http_error();
        e.error_code = Some("made_up".into());
        assert_eq!(ApiError::from(e).code, "invalid_json");
    }
}

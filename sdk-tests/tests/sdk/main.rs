//! End-to-end tests: the real gateway driven through `gateway-client`, and through raw
//! HTTP where the client cannot express the bad input. One binary, so it links once.
//! Runs on SQLite, and on PostgreSQL when `GATEWAY_TEST_DATABASE_URL` is set.

mod browser;
mod browser_insight;
mod contract;
mod dashboard;
mod errors;
mod evolution;
mod health;
mod https;
mod idempotency;
mod ingress;
mod insight;
mod limits;
mod pbx;
mod policies;
mod privacy;
mod replicas;
mod rollout;
mod sending;
mod store;
mod webhooks;

use gateway_client::types::{ErrorBody, MessagePurpose, SendMessageRequest, SendMessageResponse};
use gateway_client::{Error, ErrorExt};

/// A text send request through the typed client.
pub fn text(instance: &str, phone: &str, message: &str) -> SendMessageRequest {
    SendMessageRequest {
        instance_id: instance.to_string(),
        phone: phone.to_string(),
        message_purpose: MessagePurpose::Transactional,
        message: Some(message.to_string()),
        caption: None,
        file_name: None,
        media: None,
        media_type: None,
        mime_type: None,
    }
}

/// Asserts a typed error with this status and code, and the error body's shape.
pub fn expect_error(
    result: Result<gateway_client::ResponseValue<SendMessageResponse>, Error<ErrorBody>>,
    status: u16,
    code: &str,
) -> ErrorBody {
    match result {
        Err(Error::ErrorResponse(rv)) => {
            assert_eq!(rv.status().as_u16(), status, "status of {code}: {:?}", rv.as_ref());
            assert_eq!(rv.error, code);
            assert!(!rv.success);
            assert!(!rv.message.is_empty());
            rv.into_inner()
        }
        other => panic!("expected {status} {code}, got {other:?}"),
    }
}

/// Asserts a raw response is the error body with this status and code.
pub fn expect_raw(response: (u16, serde_json::Value), status: u16, code: &str) -> serde_json::Value {
    let (got, body) = response;
    assert_eq!(got, status, "status for {code}: {body}");
    assert_eq!(body["success"], false, "{body}");
    assert_eq!(body["error"], code, "{body}");
    assert!(body["message"].as_str().is_some_and(|m| !m.is_empty()), "{body}");
    assert!(body["details"].is_object(), "{body}");
    assert_eq!(body.as_object().unwrap().len(), 4, "exactly the four fields: {body}");
    body
}

/// Whether a typed error is retryable, and its code is readable through the helper.
pub fn retryable(e: &Error<ErrorBody>) -> bool {
    assert!(e.error_code().is_some(), "the gateway answered with its error body: {e:?}");
    e.is_retryable()
}

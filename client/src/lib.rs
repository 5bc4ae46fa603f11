//! Typed Rust client for the Gateway v1 API.
//!
//! Everything under [`generated`] (re-exported at the crate root) is produced by
//! Progenitor from `openapi/openapi.json` at build time; this file adds only what the
//! contract cannot say: bearer authentication ([`Client::with_api_key`]) and
//! [`ErrorExt::error_body`] / [`ErrorExt::error_code`] on the typed error
//! (`Error::is_retryable` comes with progenitor-client).
//!
//! ```no_run
//! # async fn run() -> Result<(), gateway_client::Error<gateway_client::types::ErrorBody>> {
//! use gateway_client::{Client, types::{MessagePurpose, SendMessageRequest}};
//! let client = Client::with_api_key("http://127.0.0.1:8080", "gw_live_...");
//! let sent = client
//!     .message_send(&SendMessageRequest {
//!         instance_id: "demo".into(),
//!         phone: "+14155550123".into(),
//!         message_purpose: MessagePurpose::Transactional,
//!         message: Some("Your order has shipped".into()),
//!         caption: None, file_name: None, media: None, media_type: None, mime_type: None,
//!     })
//!     .await?;
//! println!("sent {} (log {})", sent.message_id, sent.log_id);
//! # Ok(()) }
//! ```

#[allow(clippy::all, unused_imports, dead_code, missing_docs, unreachable_patterns)]
mod generated {
    include!(concat!(env!("OUT_DIR"), "/codegen.rs"));
}

pub use generated::*;
pub use progenitor_client::{Error, ResponseValue};

/// Credentials the generated client attaches to each request.
#[derive(Clone, Debug, Default)]
pub struct Auth {
    api_key: Option<String>,
}

impl Auth {
    /// Sends `Authorization: Bearer <api_key>`.
    pub fn bearer(api_key: impl Into<String>) -> Self {
        Auth { api_key: Some(api_key.into()) }
    }

    /// Sends no credentials.
    pub fn none() -> Self {
        Auth::default()
    }
}

impl progenitor_client::ClientHooks<Auth> for Client {
    async fn pre<E>(
        &self,
        request: &mut reqwest::Request,
        _info: &progenitor_client::OperationInfo,
    ) -> Result<(), Error<E>> {
        if let Some(key) = &self.inner().api_key {
            let value = reqwest::header::HeaderValue::from_str(&format!("Bearer {key}"))
                .map_err(|e| Error::InvalidRequest(format!("API key is not a valid header value: {e}")))?;
            request.headers_mut().insert(reqwest::header::AUTHORIZATION, value);
        }
        Ok(())
    }
}

impl Client {
    /// A client for the gateway at `base_url` that authenticates with `api_key`.
    pub fn with_api_key(base_url: &str, api_key: impl Into<String>) -> Self {
        Client::new(base_url, Auth::bearer(api_key))
    }
}

/// The gateway's error body on a failed call.
///
/// Retrying a send: with an idempotency key every answer may be retried
/// (`Client::message_send_exactly_once`); without one, only an answer that proves
/// nothing was sent (`retry_without_key_is_safe`). progenitor-client's own
/// `Error::is_retryable` (transport failures, 408, 429, 502, 503, 504) is not a safe
/// test for an unkeyed send: a lost answer or a 502 `provider_outcome_unknown` may mean
/// the message is out.
pub trait ErrorExt {
    /// The error body, when the gateway answered with one.
    fn error_body(&self) -> Option<&types::ErrorBody>;
    /// The error code (`invalid_api_key`, `sending_throttled`, ...), when the gateway
    /// answered with the error body.
    fn error_code(&self) -> Option<&str> {
        self.error_body().map(|b| b.error.as_str())
    }
}

impl ErrorExt for Error<types::ErrorBody> {
    fn error_body(&self) -> Option<&types::ErrorBody> {
        match self {
            Error::ErrorResponse(rv) => Some(rv.as_ref()),
            _ => None,
        }
    }
}

/// Typed bodies of the 16 webhook events, generated from `openapi/events.schema.json`.
///
/// Pick the type by the `X-Gateway-Event` header (or the body's `event` field):
/// `message.sent` is [`events::MessageSent`], `recipient.opted_out` is
/// [`events::RecipientOptedOut`], and so on. Unknown fields are accepted, so a newer
/// gateway that adds one does not break an older receiver.
#[allow(clippy::all, unused_imports, dead_code, missing_docs)]
pub mod events {
    include!(concat!(env!("OUT_DIR"), "/events.rs"));
}

mod retry;
pub use retry::{
    IDEMPOTENCY_KEY_HEADER, REPLAYED_HEADER, RetryPolicy, new_idempotency_key, retry_without_key_is_safe, was_replayed,
};

mod webhook;
pub use webhook::{SignatureError, sign_for_tests, verify_signature, verify_signature_at};

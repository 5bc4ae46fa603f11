//! Typed Rust client for the Gateway v1 API.
//!
//! Everything under [`generated`] (re-exported at the crate root) is produced by
//! Progenitor from `openapi/openapi.json` at build time; this file adds only what the
//! contract cannot say: bearer authentication ([`Client::with_api_key`]), and
//! [`ErrorExt::is_retryable`] / [`ErrorExt::error_body`] on the typed error.
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

/// What a caller wants to know of a failed call.
pub trait ErrorExt {
    /// The gateway's error body, when the gateway answered with one.
    fn error_body(&self) -> Option<&types::ErrorBody>;
    /// Whether the same request may succeed later unchanged: throttling and quota
    /// (429), provider failures (502), server errors (500, 503, 504), and transport
    /// failures (connection refused or reset, timeouts). Client mistakes (4xx other
    /// than 429) are not retryable.
    fn is_retryable(&self) -> bool;
}

impl ErrorExt for Error<types::ErrorBody> {
    fn error_body(&self) -> Option<&types::ErrorBody> {
        match self {
            Error::ErrorResponse(rv) => Some(rv.as_ref()),
            _ => None,
        }
    }

    fn is_retryable(&self) -> bool {
        match self {
            Error::ErrorResponse(rv) => retryable_status(rv.status().as_u16()),
            Error::UnexpectedResponse(r) => retryable_status(r.status().as_u16()),
            Error::CommunicationError(e) => e.is_connect() || e.is_timeout() || e.is_request(),
            Error::ResponseBodyError(_) => true,
            _ => false,
        }
    }
}

fn retryable_status(status: u16) -> bool {
    matches!(status, 429 | 500 | 502 | 503 | 504)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_transient_statuses_are_retryable() {
        for s in [429, 500, 502, 503, 504] {
            assert!(retryable_status(s), "{s}");
        }
        for s in [400, 401, 403, 404, 413, 415, 422, 423] {
            assert!(!retryable_status(s), "{s}");
        }
    }
}

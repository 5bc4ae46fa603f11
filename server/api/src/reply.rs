//! The answer of send-message as exact bytes, with headers.
//!
//! The contract documents send-message's 200 as `SendMessageResponse` and its errors
//! as the error body. The server answers with bytes it renders once, because an
//! answer kept for an idempotency key must be replayed byte for byte, and because a
//! refusal may need headers (`Retry-After` on 429 and 503, `Idempotent-Replayed`) that
//! Dropshot 0.18 cannot add to an error type. `SendReply` documents itself exactly as
//! `HttpResponseOk<SendMessageResponse>`, so the contract does not change, and carries
//! any status, body and headers.

use crate::SendMessageResponse;
use dropshot::{ApiEndpointResponse, Body, HttpError, HttpResponse, HttpResponseOk};
use http::{Response, StatusCode, header};

/// A rendered answer: status, JSON body bytes and extra headers.
#[derive(Clone, Debug)]
pub struct SendReply {
    pub status: u16,
    pub body: String,
    pub headers: Vec<(&'static str, String)>,
}

impl SendReply {
    /// An answer with no extra headers.
    pub fn new(status: u16, body: String) -> SendReply {
        SendReply { status, body, headers: Vec::new() }
    }

    /// Adds a header.
    pub fn with_header(mut self, name: &'static str, value: impl Into<String>) -> SendReply {
        self.headers.push((name, value.into()));
        self
    }
}

impl HttpResponse for SendReply {
    fn to_result(self) -> Result<Response<Body>, HttpError> {
        let mut builder = Response::builder()
            .status(StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR))
            .header(header::CONTENT_TYPE, "application/json");
        for (name, value) in self.headers {
            builder = builder.header(name, value);
        }
        builder.body(Body::from(self.body)).map_err(|e| HttpError::for_internal_error(e.to_string()))
    }

    fn response_metadata() -> ApiEndpointResponse {
        HttpResponseOk::<SendMessageResponse>::response_metadata()
    }

    fn status_code(&self) -> StatusCode {
        StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
    }
}

//! An endpoint's answer as exact bytes, with headers.
//!
//! The contract documents each endpoint's 200 body (`SendMessageResponse`,
//! `PbxWebhookResponse`) and its errors as the error body. The server may answer with
//! bytes it renders once: an answer kept for an idempotency key must be replayed byte
//! for byte, and a refusal may need headers (`Retry-After` on 429 and 503,
//! `Idempotent-Replayed`) that Dropshot 0.18 cannot add to an error type. `JsonReply<T>`
//! documents itself exactly as `HttpResponseOk<T>`, so the contract does not change, and
//! carries any status, body and headers.

use crate::{PbxWebhookResponse, SendMessageResponse};
use dropshot::{ApiEndpointResponse, Body, HttpError, HttpResponse, HttpResponseOk};
use http::{Response, StatusCode, header};
use std::marker::PhantomData;

/// A rendered answer documented as a 200 with body `T`: status, JSON body bytes and
/// extra headers.
#[derive(Debug)]
pub struct JsonReply<T> {
    pub status: u16,
    pub body: String,
    pub headers: Vec<(&'static str, String)>,
    documented: PhantomData<fn() -> T>,
}

/// The answer of send-message.
pub type SendReply = JsonReply<SendMessageResponse>;
/// The answer of the PBX webhook.
pub type PbxReply = JsonReply<PbxWebhookResponse>;

impl<T> JsonReply<T> {
    /// An answer with no extra headers.
    pub fn new(status: u16, body: String) -> JsonReply<T> {
        JsonReply { status, body, headers: Vec::new(), documented: PhantomData }
    }

    /// Adds a header.
    pub fn with_header(mut self, name: &'static str, value: impl Into<String>) -> JsonReply<T> {
        self.headers.push((name, value.into()));
        self
    }
}

impl<T> HttpResponse for JsonReply<T>
where
    T: schemars::JsonSchema + serde::Serialize + Send + Sync + 'static,
{
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
        HttpResponseOk::<T>::response_metadata()
    }

    fn status_code(&self) -> StatusCode {
        StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
    }
}

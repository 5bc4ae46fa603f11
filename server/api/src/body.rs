//! `JsonBody<T>`: a JSON request body that is read only when the handler asks for it.
//!
//! Dropshot's `TypedBody` answers every body problem with 400, accepts trailing bytes
//! and a missing `Content-Type`, and runs before the handler, so it would answer a bad
//! body before the API key is checked. The specification orders the checks auth (401),
//! content type (415), JSON (400), schema (422), so this extractor only captures the
//! request; the handler authenticates and then calls [`JsonBody::parse`]. An
//! unauthenticated caller therefore never gets its body read at all.
//!
//! The OpenAPI request body is exactly `TypedBody<T>`'s (its `metadata` is delegated),
//! so the contract keeps the request schema.

use crate::error::ApiError;
use bytes::{BufMut, BytesMut};
use dropshot::{
    ApiEndpointBodyContentType, ExclusiveExtractor, ExtractorMetadata, HttpError, RequestContext, ServerContext,
    TypedBody,
};
use http::header::{CONTENT_LENGTH, CONTENT_TYPE};
use http_body_util::BodyExt;
use schemars::JsonSchema;
use serde::de::DeserializeOwned;
use serde_json::error::Category;
use std::marker::PhantomData;

/// Past the limit we keep reading (and discarding) up to this much, so that a client
/// that is still uploading reads our 413 rather than a reset connection.
const MAX_DRAIN: usize = 8 * 1024 * 1024;

/// A JSON request body of type `T`, parsed on demand.
pub struct JsonBody<T> {
    content_type: Result<String, ()>,
    declared_length: Option<usize>,
    limit: usize,
    body: dropshot::Body,
    _type: PhantomData<fn() -> T>,
}

/// `application/json` or `application/<something>+json`, with any parameters.
pub fn is_json_content_type(value: &str) -> bool {
    let essence = value.split(';').next().unwrap_or("").trim().to_ascii_lowercase();
    match essence.split_once('/') {
        Some(("application", sub)) => sub == "json" || sub.ends_with("+json"),
        _ => false,
    }
}

impl<T: DeserializeOwned> JsonBody<T> {
    /// Checks the content type (415), reads the body within the endpoint's limit (413),
    /// parses the JSON (400) and maps it onto `T` (422 `validation_error`, with
    /// `details.field`).
    pub async fn parse(self) -> Result<T, ApiError> {
        let content_type = match &self.content_type {
            Ok(ct) if is_json_content_type(ct) => ct.clone(),
            Ok(ct) => {
                return Err(ApiError::new(415, "unsupported_media_type", "Content-Type must be application/json")
                    .with_detail("content_type", ct.as_str()));
            }
            Err(()) => {
                return Err(ApiError::new(415, "unsupported_media_type", "Content-Type must be application/json")
                    .with_detail("content_type", "(not visible ASCII)"));
            }
        };
        let _ = content_type;
        let bytes = self.read().await?;
        parse_json(&bytes)
    }

    async fn read(self) -> Result<BytesMut, ApiError> {
        let cap = self.limit;
        if self.declared_length.is_some_and(|n| n > cap + MAX_DRAIN) {
            return Err(too_large(cap));
        }
        let mut over = self.declared_length.is_some_and(|n| n > cap);
        let mut buf = BytesMut::with_capacity(self.declared_length.unwrap_or(1024).min(cap));
        let mut seen = 0usize;
        let mut body = self.body;
        while let Some(data) = next_data(&mut body).await {
            let data = data?;
            seen += data.len();
            if over || seen > cap {
                over = true;
                if seen > cap + MAX_DRAIN {
                    break;
                }
                continue;
            }
            buf.put(data);
        }
        if over {
            return Err(too_large(cap));
        }
        Ok(buf)
    }
}

/// 413 `payload_too_large` for a body over `cap` bytes.
fn too_large(cap: usize) -> ApiError {
    ApiError::new(413, "payload_too_large", format!("request body is larger than {cap} bytes"))
        .with_detail("limit_bytes", cap as u64)
}

/// The next data frame of a body (trailers are skipped); `None` at its end.
async fn next_data(body: &mut dropshot::Body) -> Option<Result<bytes::Bytes, ApiError>> {
    loop {
        match body.frame().await? {
            Err(e) => {
                return Some(Err(
                    ApiError::new(400, "invalid_json", "request body could not be read").with_internal(e.to_string())
                ));
            }
            Ok(frame) => {
                if let Ok(data) = frame.into_data() {
                    return Some(Ok(data));
                }
            }
        }
    }
}

/// Parses `bytes` as exactly one JSON value of type `T`, with the contract's statuses.
pub fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(ApiError::new(400, "invalid_json", "request body is empty"));
    }
    // serde reads a struct from an array too (positionally); a request body is an
    // object, so a well-formed array is a 422 on the whole body.
    let is_array = bytes.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'[');
    let not_object = || {
        ApiError::new(422, "validation_error", "the request body must be a JSON object")
            .with_detail("field", "body")
            .with_detail("reason", "expected an object")
    };
    let de = &mut serde_json::Deserializer::from_slice(bytes);
    match serde_path_to_error::deserialize::<_, T>(&mut *de) {
        Ok(value) => {
            de.end().map_err(|e| syntax_error(&e))?;
            if is_array {
                return Err(not_object());
            }
            Ok(value)
        }
        // serde stops at the first wrong value, before it has seen the whole text: a
        // type error in malformed JSON is still malformed JSON (400).
        Err(e) if e.inner().classify() == Category::Data && !is_json(bytes) => {
            Err(syntax_error(&serde_json::from_slice::<serde::de::IgnoredAny>(bytes).expect_err("not JSON")))
        }
        Err(e) if is_array && e.inner().classify() == Category::Data => Err(not_object()),
        Err(e) => {
            let path = e.path().to_string();
            let inner = e.into_inner();
            match inner.classify() {
                Category::Data => {
                    let reason = inner.to_string();
                    let field = unknown_field_name(&reason)
                        .map(str::to_string)
                        .unwrap_or_else(|| if path == "." { "body".to_string() } else { path });
                    let reason = reason.split(" at line ").next().unwrap_or_default().to_string();
                    Err(ApiError::new(422, "validation_error", format!("invalid value for {field}"))
                        .with_detail("field", field)
                        .with_detail("reason", reason))
                }
                _ => Err(syntax_error(&inner)),
            }
        }
    }
}

fn is_json(bytes: &[u8]) -> bool {
    serde_json::from_slice::<serde::de::IgnoredAny>(bytes).is_ok()
}

fn syntax_error(e: &serde_json::Error) -> ApiError {
    ApiError::new(400, "invalid_json", "request body is not valid JSON")
        .with_detail("line", e.line() as u64)
        .with_detail("column", e.column() as u64)
}

/// serde's message for an unknown property is "unknown field `name`, expected ...".
fn unknown_field_name(reason: &str) -> Option<&str> {
    let rest = reason.strip_prefix("unknown field `")?;
    rest.split_once('`').map(|(name, _)| name)
}

#[async_trait::async_trait]
impl<T: JsonSchema + DeserializeOwned + Send + Sync + 'static> ExclusiveExtractor for JsonBody<T> {
    async fn from_request<C: ServerContext>(
        rqctx: &RequestContext<C>,
        request: http::Request<dropshot::Body>,
    ) -> Result<Self, HttpError> {
        let (parts, body) = request.into_parts();
        let content_type = match parts.headers.get(CONTENT_TYPE) {
            None => Ok(String::new()),
            Some(v) => v.to_str().map(str::to_string).map_err(|_| ()),
        };
        let declared_length =
            parts.headers.get(CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<usize>().ok());
        Ok(JsonBody { content_type, declared_length, limit: rqctx.request_body_max_bytes(), body, _type: PhantomData })
    }

    fn metadata(content_type: ApiEndpointBodyContentType) -> ExtractorMetadata {
        <TypedBody<T> as ExclusiveExtractor>::metadata(content_type)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Deserialize, Debug)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Probe {
        a: Option<String>,
    }

    #[test]
    fn json_content_types() {
        assert!(is_json_content_type("application/json"));
        assert!(is_json_content_type("Application/JSON; charset=utf-8"));
        assert!(is_json_content_type("application/problem+json"));
        assert!(!is_json_content_type(""));
        assert!(!is_json_content_type("text/plain"));
        assert!(!is_json_content_type("application/x-www-form-urlencoded"));
        assert!(!is_json_content_type("application/jsonp"));
    }

    #[test]
    fn statuses_by_kind_of_problem() {
        let code = |b: &str| parse_json::<Probe>(b.as_bytes()).unwrap_err();
        assert_eq!(code("").code, "invalid_json");
        assert_eq!(code("{\"a\":").code, "invalid_json");
        assert_eq!(code("{} x").code, "invalid_json");
        let unknown = code("{\"b\":1}");
        assert_eq!((unknown.status.as_u16(), unknown.code), (422, "validation_error"));
        assert_eq!(unknown.details["field"], "b");
        let wrong = code("{\"a\":1}");
        assert_eq!(wrong.details["field"], "a");
        assert_eq!(code("[]").details["field"], "body");
        assert_eq!(code("[1, 2]").details["field"], "body");
        assert_eq!(code("[\"x\"]").details["field"], "body");
        assert_eq!(code("[1, 2").code, "invalid_json");
        assert_eq!(code("{\"a\": 1, ").code, "invalid_json");
        assert_eq!(code("{\"b\": 1} }").code, "invalid_json");
        assert!(parse_json::<Probe>(b" {\"a\":\"x\"} \n").is_ok());
    }
}

#[cfg(test)]
mod properties {
    use super::*;
    use crate::SendMessageRequest;
    use proptest::prelude::*;

    proptest! {
        /// Whatever the bytes, the parser answers (never panics) with the contract's
        /// statuses: a value, 400 `invalid_json` or 422 `validation_error`.
        #[test]
        fn any_bytes_get_a_contract_answer(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            match parse_json::<SendMessageRequest>(&bytes) {
                Ok(_) => {}
                Err(e) => prop_assert!(matches!((e.status.as_u16(), e.code), (400, "invalid_json") | (422, "validation_error")), "{e:?}"),
            }
        }

        /// Any object of known text fields parses to exactly those fields.
        #[test]
        fn known_text_fields_round_trip(phone in ".{0,40}", message in ".{0,200}", purpose in "[a-z_]{0,20}") {
            let body = serde_json::json!({"instance_id": "main", "phone": phone, "message": message, "message_purpose": purpose});
            let parsed = parse_json::<SendMessageRequest>(body.to_string().as_bytes()).unwrap();
            prop_assert_eq!(parsed.phone.as_deref(), Some(phone.as_str()));
            prop_assert_eq!(parsed.message.as_deref(), Some(message.as_str()));
            prop_assert_eq!(parsed.message_purpose.as_deref(), Some(purpose.as_str()));
        }

        /// Anything but whitespace after a valid body is 400, never accepted.
        #[test]
        fn trailing_bytes_are_refused(tail in "[^ \t\r\n]{1,10}") {
            let body = format!("{{\"phone\":\"+14155550123\"}}{tail}");
            let e = parse_json::<SendMessageRequest>(body.as_bytes()).unwrap_err();
            prop_assert_eq!((e.status.as_u16(), e.code), (400, "invalid_json"));
        }

        /// An unknown property is always named in `details.field`.
        #[test]
        fn unknown_properties_are_named(name in "[a-z]{1,12}_x") {
            let body = format!("{{\"{name}\": 1}}");
            let e = parse_json::<SendMessageRequest>(body.as_bytes()).unwrap_err();
            prop_assert_eq!(e.code, "validation_error");
            prop_assert_eq!(e.details["field"].as_str(), Some(name.as_str()));
        }
    }
}

/// The raw request of the PBX webhook: its headers and its body, read on demand.
///
/// The body is read before anything else (the size check comes first, DESIGN.md) and
/// kept as bytes, because the signature covers the exact bytes. Over the limit the
/// reading stops at once: nothing past the limit is read (a declared length over it is
/// refused before the first byte). The contract shows the JSON schema of
/// `PbxWebhookRequest` and the three headers.
pub struct PbxBody {
    headers: http::HeaderMap,
    declared_length: Option<usize>,
    limit: usize,
    body: dropshot::Body,
}

impl PbxBody {
    /// The request's headers.
    pub fn headers(&self) -> &http::HeaderMap {
        &self.headers
    }

    /// Reads the whole body, or 413 `payload_too_large` as soon as it passes the limit.
    pub async fn read(&mut self) -> Result<bytes::Bytes, ApiError> {
        let cap = self.limit;
        if self.declared_length.is_some_and(|n| n > cap) {
            return Err(too_large(cap));
        }
        let mut buf = BytesMut::with_capacity(self.declared_length.unwrap_or(1024).min(cap));
        let mut body = std::mem::replace(&mut self.body, dropshot::Body::empty());
        while let Some(data) = next_data(&mut body).await {
            let data = data?;
            if buf.len() + data.len() > cap {
                return Err(too_large(cap));
            }
            buf.put(data);
        }
        Ok(buf.freeze())
    }
}

#[async_trait::async_trait]
impl ExclusiveExtractor for PbxBody {
    async fn from_request<C: ServerContext>(
        rqctx: &RequestContext<C>,
        request: http::Request<dropshot::Body>,
    ) -> Result<Self, HttpError> {
        let (parts, body) = request.into_parts();
        let declared_length =
            parts.headers.get(CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<usize>().ok());
        Ok(PbxBody { headers: parts.headers, declared_length, limit: rqctx.request_body_max_bytes(), body })
    }

    fn metadata(content_type: ApiEndpointBodyContentType) -> ExtractorMetadata {
        let mut metadata = <TypedBody<crate::PbxWebhookRequest> as ExclusiveExtractor>::metadata(content_type.clone());
        let headers =
            <dropshot::Header<crate::PbxHeaders> as dropshot::SharedExtractor>::metadata(content_type).parameters;
        metadata.parameters.extend(headers);
        metadata
    }
}

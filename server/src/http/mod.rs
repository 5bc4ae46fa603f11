//! HTTP layer: the `GatewayApi` implementation and the unpublished informational routes.
//!
//! Handlers stay thin: authenticate, read the body, hand over to the send pipeline,
//! map the result. A panic anywhere below a handler is caught here and answered as 500
//! `internal_error` (Dropshot would drop the connection).

mod auth;
pub mod error;
mod health;

pub use crate::state::AppState;

use crate::pbx::{Webhook, WebhookRequest};
use crate::provider::ProviderError;
use crate::send::idempotency::{self, Decided};
use crate::send::{Idempotency, SendError, SendInput, answer};
use crate::store::{Answer, now_ms};
use dropshot::{Body, HttpError, Path, RequestContext, endpoint};
use futures::FutureExt;
use gateway_api::{
    ApiError, GatewayApi, JsonBody, JsonReply, PbxBody, PbxPath, PbxReply, SendMessageRequest, SendReply,
};
use http::{HeaderMap, Response, StatusCode, header};
use slog::{Logger, error, info};
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

/// The implementation of the public API.
pub enum GatewayApiImpl {}

impl GatewayApi for GatewayApiImpl {
    type Context = Arc<AppState>;

    async fn message_send(
        rqctx: RequestContext<Self::Context>,
        body: JsonBody<SendMessageRequest>,
    ) -> Result<SendReply, ApiError> {
        let state = rqctx.context().clone();
        let headers = rqctx.request.headers().clone();
        let trace = crate::trace::Trace::new(&rqctx.request_id, &headers);
        let log = rqctx.log.new(slog::o!("component" => "send"));
        // A backstop: whatever hangs below (a database that stopped answering), the
        // caller gets the error body within the provider timeout plus three database
        // timeouts. Before the attempt row, nothing was sent: 503 with Retry-After. After
        // it, the provider may have the message: the unknown outcome (502, never to be
        // retried as a new message), which is also what its row and key become (see
        // `send::settle`).
        let budget = state.config.provider_timeout() + 3 * Duration::from_millis(state.config.database_timeout_ms);
        let progress = crate::send::settle::Progress::default();
        let started = std::time::Instant::now();
        let handled =
            catch_panics(&log, send_message(state, headers, trace, body, progress.clone(), log.clone(), started));
        match tokio::time::timeout(budget, handled).await {
            Ok(Err(e)) if e.status.as_u16() == 503 => Ok(reply(answer::error_answer(&e))),
            Ok(result) => result,
            Err(_) if progress.begun() => {
                error!(log, "send did not finish in time; its outcome is unknown"; "budget_ms" => budget.as_millis() as u64);
                let unknown = ProviderError::OutcomeUnknown(crate::send::CANCELLED_REASON.into());
                Ok(reply(answer::send_answer(&Err(SendError::Provider(unknown)))))
            }
            Err(_) => {
                error!(log, "send did not finish in time"; "budget_ms" => budget.as_millis() as u64);
                Ok(reply(answer::error_answer(&error::unavailable("the request did not finish in time"))))
            }
        }
    }

    async fn pbx_webhook(
        rqctx: RequestContext<Self::Context>,
        path: Path<PbxPath>,
        body: PbxBody,
    ) -> Result<PbxReply, ApiError> {
        let state = rqctx.context().clone();
        let remote = state.client_ip(rqctx.request.remote_addr().ip(), rqctx.request.headers());
        let log = rqctx.log.new(slog::o!("component" => "pbx"));
        let integration_id = path.into_inner().integration_id;
        let handled = async {
            let mut body = body;
            let bytes = match body.read().await {
                Ok(bytes) => bytes,
                Err(e) => {
                    info!(log, "pbx webhook refused"; "error" => e.code);
                    return Err(e);
                }
            };
            let webhook = Webhook {
                store: &state.store,
                sender: &state.sender,
                settings: &state.config.pbx,
                pending_wait: state.config.provider_timeout() + std::time::Duration::from_secs(5),
                log: &log,
                trace: crate::trace::Trace::new(&rqctx.request_id, body.headers()),
            };
            let request =
                WebhookRequest { integration_id: &integration_id, headers: body.headers(), body: &bytes, remote };
            webhook.handle(&request).await
        };
        // 409, 429 and 503 carry Retry-After; the answer is the same body either way.
        let result = catch_panics(&log, handled).await;
        let outcome = match &result {
            Ok(answer) => answer.action.as_str(),
            Err(e) => e.code,
        };
        crate::metrics::get().pbx_events.with_label_values(&[outcome]).inc();
        match result {
            Ok(answer) => Ok(PbxReply::new(200, serde_json::to_string(&answer).unwrap_or_default())),
            Err(e) if matches!(e.status.as_u16(), 409 | 429 | 503) => {
                let answer = answer::error_answer(&e);
                Ok(with_retry_after(PbxReply::new(answer.status, answer.body)))
            }
            Err(e) => Err(e),
        }
    }
}

async fn send_message(
    state: Arc<AppState>,
    headers: HeaderMap,
    trace: crate::trace::Trace,
    body: JsonBody<SendMessageRequest>,
    progress: crate::send::settle::Progress,
    log: Logger,
    started: std::time::Instant,
) -> Result<SendReply, ApiError> {
    // The send's one line (Dropshot's "request completed" is counted, not written, for
    // this route: see `metrics::HttpDrain`): the decision, the status, the time.
    let us = || started.elapsed().as_micros() as u64;
    // A malformed idempotency key is refused after the body is read (415, 400 and 422
    // keep their order); the key's state is read by the pipeline, with the send's own
    // read (see `send::idempotency`).
    let idem_key = idempotency::key_from(headers.get(idempotency::HEADER).map(|v| v.as_bytes()));
    let key = match auth::authenticate(&state.store, &headers).await {
        Ok(found) => found,
        Err(e) => {
            info!(log, "send refused"; "error" => e.code, "status" => e.status.as_u16(), "latency_us" => us());
            return Err(e);
        }
    };
    state.touch_key(&key.id, &log);
    let log = log.new(slog::o!("customer_id" => key.customer_id.clone(), "key_prefix" => key.prefix.clone()));
    let request = match body.parse().await {
        Ok(request) => request,
        Err(e) => {
            info!(log, "send refused"; "error" => e.code, "status" => e.status.as_u16(), "latency_us" => us());
            state.sender.record_unreadable(&key.customer_id, &key.id, e.code, &e.message, &trace).await?;
            return Err(e);
        }
    };
    let idem_key = idem_key.map_err(|e| {
        info!(log, "send refused"; "error" => "validation_error", "status" => 422, "latency_us" => us());
        answer::key_refusal("validation_error", e)
    })?;
    let idempotency = idem_key.map(|idem_key| Idempotency {
        owner: idempotency::owner(&key.customer_id, idem_key, &request),
        render: answer::send_answer,
        claimed: false,
    });
    let input = SendInput {
        customer_id: key.customer_id.clone(),
        api_key_id: Some(key.id.clone()),
        source: "api",
        body: request,
        idempotency,
        trace,
        progress,
    };
    crate::metrics::stage(crate::metrics::Stage::Auth, started);
    let result = state.sender.send(&input).await;
    crate::metrics::stage(crate::metrics::Stage::Handler, started);
    let answer = match &result {
        Err(SendError::Keyed(Decided::Replay(answer))) => {
            info!(log, "send replayed"; "status" => answer.status, "latency_us" => us());
            return Ok(reply(answer.clone()).with_header(idempotency::REPLAYED_HEADER, "true"));
        }
        Ok(sent) => {
            info!(log, "send accepted"; "log_id" => sent.log_id, "message_id" => &sent.message_id,
                  "type" => &sent.message_type, "status" => 200, "latency_us" => us());
            answer::send_answer(&result)
        }
        Err(SendError::KeyRevoked) => {
            info!(log, "send refused"; "error" => "revoked_api_key", "status" => 401, "latency_us" => us());
            answer::error_answer(&auth::revoked(&key))
        }
        Err(e) => {
            let api = ApiError::from(e);
            if api.status.as_u16() >= 500 {
                error!(log, "send failed"; "error" => api.code, "internal" => api.internal.as_deref().unwrap_or(""),
                       "status" => api.status.as_u16(), "latency_us" => us());
            } else {
                info!(log, "send refused"; "error" => api.code, "status" => api.status.as_u16(), "latency_us" => us());
            }
            answer::error_answer(&api)
        }
    };
    Ok(reply(answer))
}

/// The reply for an answer: its bytes, with `Retry-After` (whole seconds, from
/// `details.retry_after_seconds`) on a 409, 429 or 503.
fn reply(answer: Answer) -> SendReply {
    with_retry_after(SendReply::new(answer.status, answer.body))
}

/// Adds `Retry-After` (whole seconds, from `details.retry_after_seconds`) to a 409, 429
/// or 503.
fn with_retry_after<T>(reply: JsonReply<T>) -> JsonReply<T> {
    let retry_after = matches!(reply.status, 409 | 429 | 503)
        .then(|| serde_json::from_str::<serde_json::Value>(&reply.body).ok())
        .flatten()
        .and_then(|body| body["details"]["retry_after_seconds"].as_i64());
    match retry_after {
        Some(seconds) => reply.with_header("retry-after", seconds.max(1).to_string()),
        None => reply,
    }
}

/// Runs a handler body; a panic becomes 500 `internal_error`.
pub async fn catch_panics<T>(
    log: &Logger,
    fut: impl std::future::Future<Output = Result<T, ApiError>>,
) -> Result<T, ApiError> {
    match AssertUnwindSafe(fut).catch_unwind().await {
        Ok(result) => result,
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".to_string());
            error!(log, "handler panicked"; "panic" => &what);
            Err(ApiError::internal(format!("handler panicked: {what}")))
        }
    }
}

/// Serves the committed contract, byte for byte.
#[endpoint { method = GET, path = "/openapi.json", unpublished = true }]
async fn openapi_get(_rqctx: RequestContext<Arc<AppState>>) -> Result<Response<Body>, HttpError> {
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::ETAG, format!("\"{}\"", gateway_contract::openapi_sha256()))
        .body(Body::from(gateway_contract::OPENAPI_JSON))
        .map_err(|e| HttpError::for_internal_error(e.to_string()))
}

/// Path of the provider ingress.
#[derive(serde::Deserialize, schemars::JsonSchema)]
struct IngressPath {
    instance_id: String,
}

/// Largest provider event accepted (events carry no media: `base64` is off).
pub const INGRESS_MAX_BYTES: usize = 1024 * 1024;

/// Where the provider posts an instance's events (see `crate::ingress`). Unpublished.
///
/// The secret is checked before a byte of the body is read, and the body is read only
/// up to [`INGRESS_MAX_BYTES`] (413 beyond; the rest is never read): an
/// unauthenticated post costs a header comparison. Dropshot's own cap is set above
/// ours so that it never drains an oversize body.
#[endpoint {
    method = POST,
    path = "/internal/provider/evolution/{instance_id}",
    unpublished = true,
    request_body_max_bytes = 2 * INGRESS_MAX_BYTES,
}]
async fn provider_ingress(
    rqctx: RequestContext<Arc<AppState>>,
    path: Path<IngressPath>,
    body: dropshot::StreamingBody,
) -> Result<Response<Body>, HttpError> {
    let state = rqctx.context().clone();
    let log = rqctx.log.new(slog::o!("component" => "ingress"));
    let instance_id = path.into_inner().instance_id;
    let presented = rqctx.request.headers().get(crate::ingress::SECRET_HEADER).and_then(|v| v.to_str().ok());
    let stored = state
        .store
        .ingress_secret_hash(&instance_id)
        .await
        .map_err(|e| HttpError::for_internal_error(e.to_string()))?;
    let cause = match (presented, stored) {
        (_, None) => Some("unknown instance or no ingress secret"),
        (None, Some(_)) => Some("missing secret"),
        (Some(secret), Some(hash)) => {
            let presented = crate::pbx::auth::hash_secret(secret);
            (!bool::from(subtle::ConstantTimeEq::ct_eq(presented.as_bytes(), hash.as_bytes())))
                .then_some("wrong secret")
        }
    };
    if let Some(cause) = cause {
        let id: String = instance_id.chars().take(64).collect();
        slog::warn!(log, "provider event refused"; "cause" => cause, "instance_id" => id,
                    "remote" => %rqctx.request.remote_addr());
        crate::metrics::get().ingress_events.with_label_values(&["unauthorized"]).inc();
        return Err(HttpError::for_client_error(
            None,
            dropshot::ClientErrorStatusCode::UNAUTHORIZED,
            "unauthorized".into(),
        ));
    }
    let declared = rqctx
        .request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    let too_large = || {
        crate::metrics::get().ingress_events.with_label_values(&["too_large"]).inc();
        HttpError::for_client_error(
            None,
            dropshot::ClientErrorStatusCode::PAYLOAD_TOO_LARGE,
            format!("a provider event is at most {INGRESS_MAX_BYTES} bytes"),
        )
    };
    if declared.is_some_and(|n| n > INGRESS_MAX_BYTES) {
        return Err(too_large());
    }
    let mut buffer = Vec::with_capacity(declared.unwrap_or(8 * 1024).min(INGRESS_MAX_BYTES));
    let stream = body.into_stream();
    futures::pin_mut!(stream);
    while let Some(chunk) = futures::StreamExt::next(&mut stream).await {
        let chunk = chunk?;
        if buffer.len() + chunk.len() > INGRESS_MAX_BYTES {
            return Err(too_large());
        }
        buffer.extend_from_slice(&chunk);
    }
    let bytes = buffer.as_slice();
    let parsed: Option<serde_json::Value> = serde_json::from_slice(bytes).ok();
    let event_name = parsed
        .as_ref()
        .and_then(|v| v["event"].as_str())
        .unwrap_or("(unreadable)")
        .chars()
        .take(64)
        .collect::<String>();
    // Stored before anything else: what is acknowledged is never lost.
    let text = String::from_utf8_lossy(bytes);
    let stored_id = state
        .store
        .store_provider_event(&instance_id, &event_name, &text)
        .await
        .map_err(|e| HttpError::for_internal_error(e.to_string()))?;
    let Some(envelope) = parsed else {
        let _ = state.store.finish_provider_event(stored_id, Some("not JSON")).await;
        crate::metrics::get().ingress_events.with_label_values(&["unreadable"]).inc();
        return Err(HttpError::for_bad_request(None, "the body is not JSON".into()));
    };
    let outcome = async {
        let instance = state.store.instance(&instance_id).await?;
        let facts = crate::ingress::evolution::parse(&envelope);
        state.store.apply_facts(&instance, &facts, now_ms()).await
    }
    .await;
    let counted = if outcome.is_ok() { "applied" } else { "failed" };
    crate::metrics::get().ingress_events.with_label_values(&[counted]).inc();
    match outcome {
        Ok(applied) => {
            slog::debug!(log, "provider event"; "event" => &event_name, "events" => applied.events.len(),
                         "skipped" => applied.skipped);
            let _ = state.store.finish_provider_event(stored_id, None).await;
        }
        Err(e) => {
            // Kept in provider_events with its error, for a later replay.
            slog::error!(log, "applying a provider event failed"; "event" => &event_name, "stored_id" => stored_id,
                         "error" => %e);
            let _ = state.store.finish_provider_event(stored_id, Some(&e.to_string())).await;
        }
    }
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(r#"{"received":true}"#))
        .map_err(|e| HttpError::for_internal_error(e.to_string()))
}

/// Every route the server serves: the public API plus unpublished routes.
pub fn api_description() -> Result<dropshot::ApiDescription<Arc<AppState>>, String> {
    let mut api = gateway_api::gateway_api_mod::api_description::<GatewayApiImpl>().map_err(|e| e.to_string())?;
    api.register(openapi_get).map_err(|e| e.to_string())?;
    api.register(provider_ingress).map_err(|e| e.to_string())?;
    api.register(health::health_live).map_err(|e| e.to_string())?;
    api.register(health::health_ready).map_err(|e| e.to_string())?;
    crate::dashboard::register(&mut api)?;
    Ok(api)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unpublished_routes_stay_out_of_the_contract() {
        let mut served = Vec::new();
        api_description()
            .unwrap()
            .openapi(gateway_api::CONTRACT_TITLE, gateway_api::CONTRACT_VERSION)
            .write(&mut served)
            .unwrap();
        let mut stub = Vec::new();
        gateway_api::gateway_api_mod::stub_api_description()
            .unwrap()
            .openapi(gateway_api::CONTRACT_TITLE, gateway_api::CONTRACT_VERSION)
            .write(&mut stub)
            .unwrap();
        assert_eq!(String::from_utf8(served).unwrap(), String::from_utf8(stub).unwrap());
    }

    #[test]
    fn served_contract_is_the_committed_file() {
        let committed = include_str!("../../../openapi/openapi.json");
        assert_eq!(gateway_contract::OPENAPI_JSON, committed);
    }

    #[tokio::test]
    async fn a_panic_becomes_internal_error() {
        let log = Logger::root(slog::Discard, slog::o!());
        let result: Result<(), ApiError> = catch_panics(&log, async { panic!("boom") }).await;
        let e = result.unwrap_err();
        assert_eq!((e.status.as_u16(), e.code), (500, "internal_error"));
        assert_eq!(e.message, "an unexpected error occurred");
    }
}

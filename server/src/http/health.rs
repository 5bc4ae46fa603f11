//! Health for load balancers and orchestrators (unpublished routes of the main
//! listener).
//!
//! `GET /health/live`: the process serves requests (200). `GET /health/ready`: this
//! replica can take traffic: the store answers within the database timeout, every
//! migration this build knows is applied, and the policy modules are loaded. 200 with
//! each check's result, or 503 with the same body naming what is not ready.

use super::AppState;
use dropshot::{Body, HttpError, RequestContext, endpoint};
use http::{Response, StatusCode, header};
use serde_json::{Map, Value, json};
use std::sync::Arc;
use std::time::Duration;

/// The process is up.
#[endpoint { method = GET, path = "/health/live", unpublished = true }]
pub async fn health_live(_rqctx: RequestContext<Arc<AppState>>) -> Result<Response<Body>, HttpError> {
    json_response(StatusCode::OK, &json!({"status": "live"}))
}

/// This replica is ready for traffic (see the module docs).
#[endpoint { method = GET, path = "/health/ready", unpublished = true }]
pub async fn health_ready(rqctx: RequestContext<Arc<AppState>>) -> Result<Response<Body>, HttpError> {
    let state = rqctx.context();
    let mut checks = Map::new();
    let timeout = Duration::from_millis(state.config.database_timeout_ms);
    let (store, migrations) = match tokio::time::timeout(timeout, state.store.migrations_current()).await {
        Ok(Ok(Ok(()))) => ("ok".to_string(), "ok".to_string()),
        Ok(Ok(Err(behind))) => ("ok".to_string(), behind),
        Ok(Err(e)) => (format!("the store does not answer: {e}"), "unknown".to_string()),
        Err(_) => (format!("the store did not answer within {} ms", timeout.as_millis()), "unknown".to_string()),
    };
    checks.insert("store".into(), Value::String(store));
    checks.insert("migrations".into(), Value::String(migrations));
    // An engine given by the embedder (no policy host) is ready as given.
    let policies = match &state.policies {
        Some(control) if control.status().last_reload_at.is_none() => {
            "the policy modules are not loaded yet".to_string()
        }
        _ => "ok".to_string(),
    };
    checks.insert("policies".into(), Value::String(policies));
    let ready = checks.values().all(|v| v == "ok");
    let (status, word) = if ready { (StatusCode::OK, "ready") } else { (StatusCode::SERVICE_UNAVAILABLE, "not_ready") };
    if !ready {
        slog::warn!(rqctx.log, "not ready"; "checks" => Value::Object(checks.clone()).to_string());
    }
    json_response(status, &json!({"status": word, "checks": checks}))
}

fn json_response(status: StatusCode, body: &Value) -> Result<Response<Body>, HttpError> {
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::CACHE_CONTROL, "no-store")
        .body(Body::from(body.to_string()))
        .map_err(|e| HttpError::for_internal_error(e.to_string()))
}

//! The customer dashboard and the operator console: server-rendered HTML (maud) on
//! unpublished Dropshot routes, so the contract never sees them.
//!
//! Shape: every handler is `page(rqctx, async { ... })`, which turns a [`DashError`]
//! into an HTML error page and a panic into a 500 page. A handler first gets its
//! [`session::Viewer`] (signed in, second factor done), checks the role for what it is
//! about to do ([`roles::Action`]) and, for any object named in the path or the form,
//! that it belongs to the viewer's customer; objects of other customers are answered
//! exactly as missing ones (404), so ids cannot be probed. State changes are POSTs of
//! `application/x-www-form-urlencoded` forms that carry the session's synchronizer
//! token (`csrf`), and a POST that a browser marks `Sec-Fetch-Site: cross-site` (or
//! `same-site`) is refused before anything else (see `csrf`). A signed-in POST handler
//! starts with [`session::post_form`], which makes these checks in a fixed order.
//!
//! Pages work without JavaScript; one small script (`assets/dashboard.js`) polls
//! `/instances/{id}/status.json` on the instance page so the QR and the connection
//! state update live, and fills the invitation code from the link's fragment.
//!
//! Rejected alternatives: a JSON API plus a single-page app (a second contract to keep,
//! and a framework the issue rules out); askama templates (a second file per page, with
//! escaping rules of their own): maud checks markup and escaping at compile time.

pub mod accounts;
mod assets;
pub mod auth;
mod charts;
mod csrf;
mod export;
mod inbound;
mod instance_health;
mod instance_webhook;
mod instances;
mod keys;
mod login;
mod message_log;
mod operator;
mod operator_fleet;
mod overview;
pub mod password_work;
mod pbx;
mod policies;
mod policy_rollout;
mod public;
pub mod roles;
pub mod session;
mod source_throttle;
mod suppressions;
pub mod totp;
mod users;
mod views;

use crate::ops::OpsError;
use crate::state::AppState;
use crate::store::StoreError;
use dropshot::{Body, HttpError, RequestContext};
use futures::FutureExt;
use http::{HeaderValue, Response, StatusCode, header};
use maud::Markup;
use slog::{error, info, warn};
use std::panic::AssertUnwindSafe;
use std::sync::Arc;

/// The request context of every dashboard handler.
pub type Ctx = RequestContext<Arc<AppState>>;

/// Rows on one page of every list.
pub const PAGE_SIZE: i64 = 50;

/// Dashboard state shared by the handlers (part of `AppState`).
pub struct DashState {
    /// Key of the sign-in forms' CSRF tokens, loaded from the store on first use.
    login_key: tokio::sync::OnceCell<Vec<u8>>,
    /// Sign-in attempts per source address.
    signin_sources: source_throttle::SourceThrottle,
}

impl DashState {
    /// The dashboard's state for `config` (validated: its numbers are in range).
    pub fn new(config: &crate::config::Config) -> DashState {
        let d = &config.dashboard;
        let small = |n: i64| u32::try_from(n).unwrap_or(1);
        password_work::init(
            usize::try_from(d.password_slots).unwrap_or(0),
            usize::try_from(d.password_queue).unwrap_or(0),
        );
        DashState {
            login_key: Default::default(),
            signin_sources: source_throttle::SourceThrottle::new(small(d.signin_per_minute), small(d.signin_burst)),
        }
    }
}

/// The address `rqctx` came from, behind the operator's trusted proxies.
pub fn client_ip(rqctx: &Ctx) -> std::net::IpAddr {
    rqctx.context().client_ip(rqctx.request.remote_addr().ip(), rqctx.request.headers())
}

/// Why a dashboard request was not served; each becomes an HTML page.
#[derive(Debug, thiserror::Error)]
pub enum DashError {
    #[error("sign-in required")]
    SignIn,
    #[error("this account may not do that")]
    Forbidden,
    #[error("not found")]
    NotFound,
    #[error("the form could not be verified")]
    Csrf,
    #[error("{0}")]
    BadRequest(String),
    #[error("the form must be sent as application/x-www-form-urlencoded")]
    UnsupportedForm,
    #[error("too many attempts")]
    Throttled { wait_seconds: i64 },
    /// Every password-hashing slot and the queue were taken: refused before any work.
    #[error("busy")]
    Busy { wait_seconds: i64 },
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("{0}")]
    Internal(String),
}

impl From<OpsError> for DashError {
    fn from(e: OpsError) -> DashError {
        match e {
            OpsError::Invalid(reason) => DashError::BadRequest(reason),
            OpsError::Store(s) => s.into(),
        }
    }
}

impl DashError {
    fn status(&self) -> StatusCode {
        match self {
            DashError::SignIn => StatusCode::SEE_OTHER,
            DashError::Forbidden | DashError::Csrf => StatusCode::FORBIDDEN,
            DashError::NotFound | DashError::Store(StoreError::NotFound(_)) => StatusCode::NOT_FOUND,
            DashError::BadRequest(_) | DashError::Store(StoreError::Conflict(_) | StoreError::InstanceCap { .. }) => {
                StatusCode::BAD_REQUEST
            }
            DashError::UnsupportedForm => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            DashError::Throttled { .. } | DashError::Busy { .. } => StatusCode::TOO_MANY_REQUESTS,
            DashError::Store(_) | DashError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// What the person is told (internal detail stays in the log).
    fn public_text(&self) -> String {
        match self {
            DashError::Store(StoreError::NotFound(_)) | DashError::NotFound => {
                "There is nothing here, or it belongs to another account.".into()
            }
            DashError::Store(e @ (StoreError::Conflict(_) | StoreError::InstanceCap { .. })) => e.to_string(),
            DashError::Store(_) | DashError::Internal(_) => {
                "Something went wrong on our side. It has been logged; please try again.".into()
            }
            DashError::Forbidden => "Your role does not allow this. Ask an owner or admin of the account.".into(),
            DashError::Csrf => "This form could not be verified (it expired, or it was sent from another site). \
                                Go back, reload the page and try again."
                .into(),
            DashError::Throttled { wait_seconds } => {
                format!("Too many attempts. Wait {wait_seconds} seconds, then try again.")
            }
            DashError::Busy { wait_seconds } => {
                format!("Sign-in is busy right now. Wait {wait_seconds} seconds, then try again.")
            }
            other => other.to_string(),
        }
    }
}

/// Runs a handler body: errors become HTML pages, panics a 500 page.
async fn page(
    rqctx: &Ctx,
    fut: impl std::future::Future<Output = Result<Response<Body>, DashError>>,
) -> Result<Response<Body>, HttpError> {
    let log = &rqctx.log;
    let outcome = AssertUnwindSafe(fut).catch_unwind().await;
    let error = match outcome {
        Ok(Ok(response)) => return Ok(response),
        Ok(Err(e)) => e,
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".to_string());
            error!(log, "dashboard handler panicked"; "panic" => what);
            DashError::Internal("panic".into())
        }
    };
    match &error {
        DashError::SignIn => return Ok(redirect("/login")),
        DashError::Store(StoreError::NotFound(_) | StoreError::Conflict(_) | StoreError::InstanceCap { .. }) => {}
        DashError::Store(e) => error!(log, "dashboard store error"; "error" => %e),
        DashError::Internal(e) => error!(log, "dashboard error"; "error" => %e),
        DashError::Forbidden | DashError::Csrf => {
            warn!(log, "dashboard request refused"; "reason" => %error, "path" => rqctx.request.uri().path())
        }
        _ => info!(log, "dashboard request refused"; "reason" => %error),
    }
    let mut response = html(error.status(), views::error_page(error.status(), &error.public_text()));
    if let Some(wait) = error.retry_after() {
        with_retry_after(&mut response, wait);
    }
    Ok(response)
}

impl DashError {
    /// Whole seconds a 429 asks the browser to wait.
    pub fn retry_after(&self) -> Option<i64> {
        match self {
            DashError::Throttled { wait_seconds } | DashError::Busy { wait_seconds } => Some((*wait_seconds).max(1)),
            _ => None,
        }
    }
}

impl From<password_work::Busy> for DashError {
    fn from(busy: password_work::Busy) -> DashError {
        DashError::Busy { wait_seconds: busy.retry_after.as_secs().max(1) as i64 }
    }
}

/// Adds `Retry-After: seconds` to a 429 page.
pub fn with_retry_after(response: &mut Response<Body>, seconds: i64) {
    if let Ok(value) = HeaderValue::from_str(&seconds.max(1).to_string()) {
        response.headers_mut().insert(header::RETRY_AFTER, value);
    }
}

/// An HTML response with the dashboard's security headers; never cached.
pub fn html(status: StatusCode, markup: Markup) -> Response<Body> {
    let mut response = Response::new(Body::from(markup.into_string()));
    *response.status_mut() = status;
    let h = response.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/html; charset=utf-8"));
    security_headers(h);
    response
}

/// Headers every dashboard answer carries.
fn security_headers(h: &mut http::HeaderMap) {
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; \
             form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
        ),
    );
    h.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(header::REFERRER_POLICY, HeaderValue::from_static("same-origin"));
}

/// A 303 to `location` (after a POST, or to the sign-in page).
pub fn redirect(location: &str) -> Response<Body> {
    let mut response = Response::new(Body::empty());
    *response.status_mut() = StatusCode::SEE_OTHER;
    let h = response.headers_mut();
    if let Ok(value) = HeaderValue::from_str(location) {
        h.insert(header::LOCATION, value);
    }
    security_headers(h);
    response
}

/// Adds `Set-Cookie` headers.
pub fn with_cookies(mut response: Response<Body>, cookies: &[String]) -> Response<Body> {
    for cookie in cookies {
        if let Ok(value) = HeaderValue::from_str(cookie) {
            response.headers_mut().append(header::SET_COOKIE, value);
        }
    }
    response
}

/// The request's query string as a map (unknown keys ignored; repeated keys: the last).
pub fn query(rqctx: &Ctx) -> std::collections::HashMap<String, String> {
    let raw = rqctx.request.uri().query().unwrap_or("");
    serde_urlencoded::from_str::<Vec<(String, String)>>(raw).unwrap_or_default().into_iter().collect()
}

/// A posted form: `application/x-www-form-urlencoded` only.
pub struct Form(std::collections::HashMap<String, String>);

impl Form {
    /// Parses the body of a POST.
    pub fn parse(rqctx: &Ctx, body: &dropshot::UntypedBody) -> Result<Form, DashError> {
        let content_type = rqctx.request.headers().get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok());
        Form::from_body(content_type.unwrap_or(""), body.as_bytes())
    }

    /// Parses a body sent with this `Content-Type` (the fuzz target's entry point).
    pub fn from_body(content_type: &str, bytes: &[u8]) -> Result<Form, DashError> {
        let content_type = content_type.split(';').next().unwrap_or("").trim().to_ascii_lowercase();
        if content_type != "application/x-www-form-urlencoded" {
            return Err(DashError::UnsupportedForm);
        }
        let pairs: Vec<(String, String)> = serde_urlencoded::from_bytes(bytes)
            .map_err(|_| DashError::BadRequest("the form could not be read".into()))?;
        Ok(Form(pairs.into_iter().collect()))
    }

    /// A field, trimmed ("" when absent).
    pub fn get(&self, name: &str) -> &str {
        self.0.get(name).map(|s| s.trim()).unwrap_or("")
    }

    /// A field as sent (untrimmed; passwords).
    pub fn raw(&self, name: &str) -> &str {
        self.0.get(name).map(String::as_str).unwrap_or("")
    }

    /// A non-empty field, or None.
    pub fn opt(&self, name: &str) -> Option<&str> {
        Some(self.get(name)).filter(|s| !s.is_empty())
    }

    /// Every field whose name starts with `prefix` and whose value is `on` (checkboxes),
    /// without the prefix.
    pub fn checked(&self, prefix: &str) -> Vec<String> {
        let mut names: Vec<String> = self
            .0
            .iter()
            .filter(|(k, v)| k.starts_with(prefix) && v.as_str() == "on")
            .map(|(k, _)| k[prefix.len()..].to_string())
            .collect();
        names.sort();
        names
    }
}

/// A page number from the query (`page`, from 1).
pub fn page_number(q: &std::collections::HashMap<String, String>) -> i64 {
    q.get("page").and_then(|p| p.parse::<i64>().ok()).filter(|p| *p >= 1 && *p <= 100_000).unwrap_or(1)
}

/// A key from the query (`before`, a positive id).
pub fn before_id(q: &std::collections::HashMap<String, String>) -> Option<i64> {
    q.get("before").and_then(|p| p.parse::<i64>().ok()).filter(|p| *p > 0)
}

/// Time as shown: `2026-11-20 14:03:07 UTC`.
pub fn when(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .map(|t| t.format("%Y-%m-%d %H:%M:%S UTC").to_string())
        .unwrap_or_default()
}

/// Every dashboard route (all unpublished).
pub fn register(api: &mut dropshot::ApiDescription<Arc<AppState>>) -> Result<(), String> {
    public::register(api)?;
    assets::register(api)?;
    login::register(api)?;
    overview::register(api)?;
    instances::register(api)?;
    keys::register(api)?;
    suppressions::register(api)?;
    message_log::register(api)?;
    inbound::register(api)?;
    pbx::register(api)?;
    users::register(api)?;
    operator::register(api)?;
    operator_fleet::register(api)?;
    policies::register(api)?;
    policy_rollout::register(api)?;
    Ok(())
}

//! Sessions (ASVS 7 and 3.3): a 256-bit id from the OS generator in a
//! `__Host-gw_session` cookie (`Secure; HttpOnly; SameSite=Lax; Path=/`, no Max-Age);
//! the store keeps only its SHA-256. A new id at every step of a sign-in (password,
//! then second factor), so a planted id never becomes a signed-in one. A session ends
//! after 30 minutes without a request or 12 hours after the sign-in, whichever comes
//! first, when its account is disabled, and at sign-out (the row is deleted).
//!
//! A session is `mfa` (password checked, code next) or `enroll` (first sign-in:
//! authenticator next) for at most 10 minutes, then `full`. Only `full` sessions reach
//! the pages; the role is read from the account on every request, so a role change or
//! a removal takes effect at once.

use super::roles::{Action, Role};
use super::{Ctx, DashError, Form, csrf};
use crate::store::{Customer, DashSession, DashUser, now_ms};
use dropshot::UntypedBody;
use http::header;
use std::collections::HashMap;

/// The session cookie.
pub const SESSION_COOKIE: &str = "__Host-gw_session";
/// The pre-session cookie of the sign-in forms' CSRF tokens.
pub const PRE_COOKIE: &str = "__Host-gw_pre";
/// The known-browser cookie (sign-in throttling, see `auth`).
pub const DEVICE_COOKIE: &str = "__Host-gw_device";

/// Idle expiry.
pub const IDLE_MS: i64 = 30 * 60_000;
/// Absolute expiry.
pub const ABSOLUTE_MS: i64 = 12 * 3_600_000;
/// Lifetime of a half-done sign-in.
pub const PARTIAL_MS: i64 = 10 * 60_000;
/// A known browser stays known this long after its sign-in.
pub const DEVICE_MS: i64 = 180 * 24 * 3_600_000;
/// Activity is written at most this often per session.
const TOUCH_MS: i64 = 60_000;

/// The cookies of a request.
pub fn cookies(rqctx: &Ctx) -> HashMap<String, String> {
    let mut out = HashMap::new();
    for value in rqctx.request.headers().get_all(header::COOKIE) {
        let Ok(text) = value.to_str() else { continue };
        for pair in text.split(';') {
            if let Some((name, value)) = pair.trim().split_once('=') {
                out.entry(name.trim().to_string()).or_insert_with(|| value.trim().to_string());
            }
        }
    }
    out
}

/// `Set-Cookie` of a `__Host-` cookie for the browser session.
pub fn cookie(name: &str, value: &str) -> String {
    format!("{name}={value}; Path=/; Secure; HttpOnly; SameSite=Lax")
}

/// `Set-Cookie` of a `__Host-` cookie kept `max_age_seconds`.
pub fn lasting_cookie(name: &str, value: &str, max_age_seconds: i64) -> String {
    format!("{name}={value}; Path=/; Max-Age={max_age_seconds}; Secure; HttpOnly; SameSite=Lax")
}

/// `Set-Cookie` that deletes a cookie.
pub fn clear_cookie(name: &str) -> String {
    format!("{name}=; Path=/; Max-Age=0; Secure; HttpOnly; SameSite=Lax")
}

/// The request's live session (any stage), if any. An expired one is deleted.
pub async fn current(rqctx: &Ctx) -> Result<Option<DashSession>, DashError> {
    let Some(id) = cookies(rqctx).remove(SESSION_COOKIE) else { return Ok(None) };
    let store = &rqctx.context().store;
    let hash = super::auth::token_hash(&id);
    let Some(session) = store.session(&hash).await? else { return Ok(None) };
    let now = now_ms();
    if now >= session.expires_at || now - session.last_seen_at >= IDLE_MS || session.user.disabled_at.is_some() {
        store.delete_session(&hash).await?;
        return Ok(None);
    }
    if now - session.last_seen_at >= TOUCH_MS {
        store.touch_session(&hash, now).await?;
    }
    Ok(Some(session))
}

/// Starts a session for `user` at `stage`; the `Set-Cookie` to send. A session the
/// request came with is ended first (a new id at every step).
pub async fn start(rqctx: &Ctx, user: &DashUser, stage: &str) -> Result<String, DashError> {
    let store = &rqctx.context().store;
    if let Some(old) = cookies(rqctx).remove(SESSION_COOKIE) {
        store.delete_session(&super::auth::token_hash(&old)).await?;
    }
    let id = super::auth::random_token();
    let csrf_token = super::auth::random_token();
    let now = now_ms();
    let lifetime = if stage == "full" { ABSOLUTE_MS } else { PARTIAL_MS };
    store
        .create_session(&super::auth::token_hash(&id), &user.id, stage, &csrf_token, now + lifetime, now - IDLE_MS)
        .await?;
    Ok(cookie(SESSION_COOKIE, &id))
}

/// A signed-in person (second factor done).
#[derive(Clone, Debug)]
pub struct Viewer {
    pub user: DashUser,
    pub role: Role,
    pub session_hash: String,
    /// The session's synchronizer token, put in every form.
    pub csrf: String,
    /// The customer of a customer user; None for operators.
    pub customer: Option<Customer>,
}

impl Viewer {
    /// Refuses unless the role allows `action`.
    pub fn require(&self, action: Action) -> Result<(), DashError> {
        if self.role.may(action) { Ok(()) } else { Err(DashError::Forbidden) }
    }

    /// The customer of a customer user (operators have no customer pages).
    pub fn customer(&self) -> Result<&Customer, DashError> {
        self.customer.as_ref().ok_or(DashError::Forbidden)
    }

    /// The customer's id.
    pub fn customer_id(&self) -> Result<&str, DashError> {
        Ok(&self.customer()?.id)
    }
}

/// The signed-in person of a page, or [`DashError::SignIn`].
pub async fn viewer(rqctx: &Ctx) -> Result<Viewer, DashError> {
    let session = current(rqctx).await?.filter(|s| s.stage == "full").ok_or(DashError::SignIn)?;
    let role = Role::parse(&session.user.role).ok_or(DashError::Forbidden)?;
    let customer = match &session.user.customer_id {
        Some(id) => Some(rqctx.context().store.customer(id).await?),
        None => None,
    };
    Ok(Viewer { role, session_hash: session.id_hash, csrf: session.csrf_token, customer, user: session.user })
}

/// The signed-in person of a customer page that needs `action`.
pub async fn customer_viewer(rqctx: &Ctx, action: Action) -> Result<Viewer, DashError> {
    let viewer = viewer(rqctx).await?;
    viewer.customer()?;
    viewer.require(action)?;
    Ok(viewer)
}

/// The form of a signed-in person's POST and that person, checked in this order: the
/// form's type and encoding (415, 400), fetch metadata (403), the session (to the
/// sign-in page), its synchronizer token (403), the role's permission for `action` (403).
pub async fn post_form(rqctx: &Ctx, body: &UntypedBody, action: Action) -> Result<(Form, Viewer), DashError> {
    let form = Form::parse(rqctx, body)?;
    csrf::check_fetch_site(rqctx)?;
    let viewer = viewer(rqctx).await?;
    if !csrf::same_token(&viewer.csrf, form.raw("csrf")) {
        return Err(DashError::Csrf);
    }
    viewer.require(action)?;
    Ok((form, viewer))
}

//! Signing in: password (`/login`), then the authenticator code or a recovery code
//! (`/login/mfa`), or at the first sign-in the authenticator's enrolment
//! (`/login/enroll`, QR plus ten recovery codes shown once); accepting an invitation
//! (`/invite`, choose a password); signing out (`/logout`).
//!
//! Each step has its own session (a new id each time), the sign-in forms carry a CSRF
//! token bound to a pre-session cookie, and every password or code attempt goes
//! through the throttles (per source address, `source_throttle`; per email, `auth`).
//! Every hash runs on the bounded hashing threads (`password_work`). Wrong email and
//! wrong password read the same and take the same time.

use super::auth::{self, MAX_DELAY_MS};
use super::session::{self, DEVICE_COOKIE, DEVICE_MS, PRE_COOKIE};
use super::views::{self, Notice};
use super::{
    Ctx, DashError, Form, client_ip, csrf, html, page, password_work, redirect, totp, with_cookies, with_retry_after,
};
use crate::net::client_addr;
use crate::store::{DashSession, DashUser, now_ms};
use dropshot::{Body, HttpError, UntypedBody, endpoint};
use http::{Response, StatusCode};
use maud::{Markup, html};
use slog::{info, warn};

/// Where a signed-in account starts.
pub fn home(user: &DashUser) -> &'static str {
    if user.role == "operator" { "/operator" } else { "/dashboard" }
}

/// The pre-session value of this request (a new one when it has none) and the cookie
/// to set for a new one.
fn pre_session(rqctx: &Ctx) -> (String, Option<String>) {
    match session::cookies(rqctx).remove(PRE_COOKIE).filter(|v| v.len() >= 32) {
        Some(value) => (value, None),
        None => {
            let value = auth::random_token();
            let cookie = session::cookie(PRE_COOKIE, &value);
            (value, Some(cookie))
        }
    }
}

/// The form of a POST before there is a session (sign-in, invitation), checked in this
/// order: its type and encoding (415, 400), fetch metadata, then its token against the
/// pre-session cookie (403).
async fn pre_session_form(rqctx: &Ctx, body: &UntypedBody) -> Result<Form, DashError> {
    let form = Form::parse(rqctx, body)?;
    csrf::check_fetch_site(rqctx)?;
    let pre = session::cookies(rqctx).remove(PRE_COOKIE).ok_or(DashError::Csrf)?;
    let expected = csrf::login_token(&csrf::login_key(rqctx).await?, &pre);
    if csrf::same_token(&expected, form.raw("csrf")) { Ok(form) } else { Err(DashError::Csrf) }
}

/// A sign-in form page with a fresh or kept pre-session.
async fn sign_in_page(
    rqctx: &Ctx,
    status: StatusCode,
    title: &str,
    notice: Option<&Notice>,
    form: impl FnOnce(&str) -> Markup,
) -> Result<Response<Body>, DashError> {
    let (pre, cookie) = pre_session(rqctx);
    let token = csrf::login_token(&csrf::login_key(rqctx).await?, &pre);
    let response = html(status, views::bare(title, notice, form(&token)));
    Ok(with_cookies(response, &cookie.into_iter().collect::<Vec<_>>()))
}

fn login_form(token: &str, email: &str) -> Markup {
    html! {
        form.stack.card method="post" action="/login" {
            (views::csrf_field(token))
            label for="email" { "Email" }
            input #email type="email" name="email" value=(email) autocomplete="username" required autofocus;
            label for="password" { "Password" }
            input #password type="password" name="password" autocomplete="current-password" required;
            button type="submit" { "Continue" }
        }
        p.hint { "New here? Use the one-time sign-in link you were given. Every account uses an authenticator app as a second step." }
    }
}

/// The sign-in page.
#[endpoint { method = GET, path = "/login", unpublished = true }]
async fn login_get(rqctx: Ctx) -> Result<Response<Body>, HttpError> {
    page(&rqctx, async {
        if let Some(s) = session::current(&rqctx).await? {
            match s.stage.as_str() {
                "full" => return Ok(redirect(home(&s.user))),
                "mfa" => return Ok(redirect("/login/mfa")),
                _ => return Ok(redirect("/login/enroll")),
            }
        }
        sign_in_page(&rqctx, StatusCode::OK, "Sign in", None, |t| login_form(t, "")).await
    })
    .await
}

/// The throttle bucket of attempts on `email` by this browser.
async fn bucket(rqctx: &Ctx, email: &str, user: Option<&DashUser>) -> Result<String, DashError> {
    let device = session::cookies(rqctx).remove(DEVICE_COOKIE).map(|t| auth::token_hash(&t));
    let known = match (&device, user) {
        (Some(hash), Some(user)) => {
            rqctx.context().store.device_user(hash, now_ms() - DEVICE_MS).await?.is_some_and(|id| id == user.id)
        }
        _ => false,
    };
    Ok(auth::throttle_bucket(email, if known { device.as_deref() } else { None }))
}

/// Admits one attempt in `bucket`, or says how long to wait.
async fn admit(rqctx: &Ctx, bucket: &str) -> Result<(), DashError> {
    let now = now_ms();
    match rqctx.context().store.admit_attempt(bucket, now, MAX_DELAY_MS, auth::delay_ms).await? {
        Ok(_) => Ok(()),
        Err(throttled) => Err(DashError::Throttled { wait_seconds: ((throttled.until - now + 999) / 1000).max(1) }),
    }
}

/// The sign-in page again, 429 with `Retry-After`, saying why.
async fn refused_page(rqctx: &Ctx, refusal: DashError, email: &str) -> Result<Response<Body>, DashError> {
    let notice = Notice::Error(refusal.public_text());
    let mut page =
        sign_in_page(rqctx, StatusCode::TOO_MANY_REQUESTS, "Sign in", Some(&notice), |t| login_form(t, email)).await?;
    if let Some(wait) = refusal.retry_after() {
        with_retry_after(&mut page, wait);
    }
    Ok(page)
}

/// Checks email and password; on success the next step's session.
///
/// Bounded before any password work, cheapest first: the source address's throttle
/// (memory), a place among the hashing threads (`password_work`), then the email's
/// throttle (a store write). Each refusal is 429 with `Retry-After`.
#[endpoint { method = POST, path = "/login", unpublished = true }]
async fn login_post(rqctx: Ctx, body: UntypedBody) -> Result<Response<Body>, HttpError> {
    page(&rqctx, async {
        let form = pre_session_form(&rqctx, &body).await?;
        let email = form.get("email").to_lowercase();
        let metrics = crate::metrics::get();
        let source = client_addr::source_key(client_ip(&rqctx));
        if let Err(wait) = rqctx.context().dashboard.signin_sources.admit(&source, std::time::Instant::now()) {
            metrics.signin_refused.with_label_values(&["source"]).inc();
            info!(rqctx.log, "sign-in refused"; "reason" => "source throttle", "source" => &source);
            let wait_seconds = wait.as_secs_f64().ceil() as i64;
            return refused_page(&rqctx, DashError::Throttled { wait_seconds }, &email).await;
        }
        let ticket = match password_work::pool().reserve() {
            Ok(ticket) => ticket,
            Err(busy) => {
                metrics.signin_refused.with_label_values(&["busy"]).inc();
                return refused_page(&rqctx, busy.into(), &email).await;
            }
        };
        let store = &rqctx.context().store;
        let user = store.dashboard_user_by_email(&email).await?;
        let bucket = bucket(&rqctx, &email, user.as_ref()).await?;
        if let Err(throttled) = admit(&rqctx, &bucket).await {
            metrics.signin_refused.with_label_values(&["account"]).inc();
            return refused_page(&rqctx, throttled, &email).await;
        }
        let usable = user.as_ref().filter(|u| u.disabled_at.is_none());
        let hash = usable.and_then(|u| u.password_hash.clone());
        let password = form.raw("password").to_string();
        let ok = ticket.run(move || auth::check_blocking(hash.as_deref(), &password)).await?;
        let Some(user) = usable.filter(|_| ok) else {
            info!(rqctx.log, "sign-in failed"; "step" => "password", "user_id" => user.as_ref().map(|u| u.id.clone()));
            let notice = Notice::Error("The email or the password is wrong.".into());
            return sign_in_page(&rqctx, StatusCode::UNAUTHORIZED, "Sign in", Some(&notice), |t| login_form(t, &email))
                .await;
        };
        let (stage, next) =
            if user.totp_secret.is_some() { ("mfa", "/login/mfa") } else { ("enroll", "/login/enroll") };
        let cookie = session::start(&rqctx, user, stage).await?;
        info!(rqctx.log, "password accepted"; "user_id" => &user.id, "next" => stage);
        Ok(with_cookies(redirect(next), &[cookie]))
    })
    .await
}

/// The session of a half-done sign-in at `stage`.
async fn partial(rqctx: &Ctx, stage: &str) -> Result<Option<DashSession>, DashError> {
    Ok(session::current(rqctx).await?.filter(|s| s.stage == stage))
}

/// The form of a half-done sign-in's POST and its session, checked in this order: the
/// form's type and encoding (415, 400), fetch metadata (403), the session at `stage`
/// (None: the caller starts over at `/login`), its synchronizer token (403).
async fn partial_post(rqctx: &Ctx, body: &UntypedBody, stage: &str) -> Result<Option<(Form, DashSession)>, DashError> {
    let form = Form::parse(rqctx, body)?;
    csrf::check_fetch_site(rqctx)?;
    let Some(s) = partial(rqctx, stage).await? else { return Ok(None) };
    if !csrf::same_token(&s.csrf_token, form.raw("csrf")) {
        return Err(DashError::Csrf);
    }
    Ok(Some((form, s)))
}

fn mfa_form(csrf: &str) -> Markup {
    html! {
        form.stack.card method="post" action="/login/mfa" {
            (views::csrf_field(csrf))
            label for="code" { "Code from your authenticator app" }
            input #code type="text" name="code" inputmode="numeric" autocomplete="one-time-code" required autofocus;
            p.hint { "Lost your phone? Enter one of your recovery codes instead (each works once)." }
            button type="submit" { "Sign in" }
        }
    }
}

/// Second step: the authenticator code.
#[endpoint { method = GET, path = "/login/mfa", unpublished = true }]
async fn mfa_get(rqctx: Ctx) -> Result<Response<Body>, HttpError> {
    page(&rqctx, async {
        let Some(s) = partial(&rqctx, "mfa").await? else { return Ok(redirect("/login")) };
        Ok(html(StatusCode::OK, views::bare("Two-step sign-in", None, mfa_form(&s.csrf_token))))
    })
    .await
}

/// Ends a half-done sign-in: a full session (new id), a known-browser cookie.
async fn complete_sign_in(rqctx: &Ctx, user: &DashUser) -> Result<Vec<String>, DashError> {
    let store = &rqctx.context().store;
    let cookie = session::start(rqctx, user, "full").await?;
    let device = auth::random_token();
    store.add_device(&auth::token_hash(&device), &user.id).await?;
    store.record_sign_in(&user.id).await?;
    info!(rqctx.log, "signed in"; "user_id" => &user.id, "role" => &user.role);
    Ok(vec![cookie, session::lasting_cookie(DEVICE_COOKIE, &device, DEVICE_MS / 1000)])
}

/// Checks the code (or a recovery code) of a half-done sign-in.
#[endpoint { method = POST, path = "/login/mfa", unpublished = true }]
async fn mfa_post(rqctx: Ctx, body: UntypedBody) -> Result<Response<Body>, HttpError> {
    page(&rqctx, async {
        let Some((form, s)) = partial_post(&rqctx, &body, "mfa").await? else { return Ok(redirect("/login")) };
        let store = &rqctx.context().store;
        let user = &s.user;
        let bucket = bucket(&rqctx, &user.email, Some(user)).await?;
        if let Err(DashError::Throttled { wait_seconds }) = admit(&rqctx, &bucket).await {
            let notice = Notice::Error(format!("Too many attempts. Wait {wait_seconds} seconds, then try again."));
            return Ok(html(
                StatusCode::TOO_MANY_REQUESTS,
                views::bare("Two-step sign-in", Some(&notice), mfa_form(&s.csrf_token)),
            ));
        }
        let typed = form.get("code");
        let digits: String = typed.chars().filter(|c| !c.is_whitespace()).collect();
        let accepted = if digits.len() == totp::DIGITS && digits.bytes().all(|b| b.is_ascii_digit()) {
            let secret = user.totp_secret.clone().unwrap_or_default();
            match totp::verify(&secret, &digits, now_ms() / 1000, user.totp_last_step) {
                Some(step) => store.accept_totp_step(&user.id, step).await?,
                None => {
                    if totp::verify(&secret, &digits, now_ms() / 1000, None).is_some() {
                        warn!(rqctx.log, "a used authenticator code was presented again"; "user_id" => &user.id);
                    }
                    false
                }
            }
        } else {
            spend_recovery_code(&rqctx, user, typed).await?
        };
        if !accepted {
            info!(rqctx.log, "sign-in failed"; "step" => "code", "user_id" => &user.id);
            let notice = Notice::Error("That code is not right, or it was already used.".into());
            return Ok(html(
                StatusCode::UNAUTHORIZED,
                views::bare("Two-step sign-in", Some(&notice), mfa_form(&s.csrf_token)),
            ));
        }
        store.clear_throttle(&bucket).await?;
        let cookies = complete_sign_in(&rqctx, user).await?;
        Ok(with_cookies(redirect(home(user)), &cookies))
    })
    .await
}

/// Spends the recovery code `typed` if it is one of the account's unused codes.
async fn spend_recovery_code(rqctx: &Ctx, user: &DashUser, typed: &str) -> Result<bool, DashError> {
    let code = auth::normalize_recovery_code(typed);
    if code.len() != 12 {
        return Ok(false);
    }
    let store = &rqctx.context().store;
    let codes = store.unused_recovery_codes(&user.id).await?;
    let matched =
        auth::run(move || codes.into_iter().find(|(_, hash)| auth::verify_blocking(hash, &code)).map(|(id, _)| id))
            .await?;
    match matched {
        Some(id) if store.spend_recovery_code(id).await? => {
            let left = store.unused_recovery_codes(&user.id).await?.len();
            warn!(rqctx.log, "signed in with a recovery code"; "user_id" => &user.id, "codes_left" => left);
            Ok(true)
        }
        _ => Ok(false),
    }
}

fn enroll_form(s: &DashSession, secret: &str) -> Result<Markup, DashError> {
    let url = totp::otpauth_url("Gateway", &s.user.email, secret);
    let code = qrcode::QrCode::new(url.as_bytes()).map_err(|e| DashError::Internal(format!("QR: {e}")))?;
    let svg = code.render::<qrcode::render::svg::Color<'_>>().min_dimensions(220, 220).build();
    let grouped: Vec<String> = secret.as_bytes().chunks(4).map(|c| String::from_utf8_lossy(c).into_owned()).collect();
    Ok(html! {
        section.card {
            p { "Every account signs in with an authenticator app (Google Authenticator, Authy, 1Password, FreeOTP, ...). Scan this code with it:" }
            div.qr aria-label="Authenticator QR code" { (views::trusted_svg(&svg)) }
            p.hint { "Cannot scan? Add it by hand: " code #totp-secret { (grouped.join(" ")) } " (time-based, 6 digits, 30 seconds)." }
            form.stack method="post" action="/login/enroll" {
                (views::csrf_field(&s.csrf_token))
                label for="code" { "Code shown by the app" }
                input #code type="text" name="code" inputmode="numeric" autocomplete="one-time-code" required autofocus;
                button type="submit" { "Confirm and continue" }
            }
        }
    })
}

/// First sign-in: enrol an authenticator.
#[endpoint { method = GET, path = "/login/enroll", unpublished = true }]
async fn enroll_get(rqctx: Ctx) -> Result<Response<Body>, HttpError> {
    page(&rqctx, async {
        let Some(s) = partial(&rqctx, "enroll").await? else { return Ok(redirect("/login")) };
        let secret = match &s.pending_totp {
            Some(secret) => secret.clone(),
            None => {
                let secret = totp::new_secret();
                rqctx.context().store.set_pending_totp(&s.id_hash, &secret).await?;
                secret
            }
        };
        Ok(html(StatusCode::OK, views::bare("Set up two-step sign-in", None, enroll_form(&s, &secret)?)))
    })
    .await
}

/// Confirms the enrolment with a code; shows the recovery codes once.
#[endpoint { method = POST, path = "/login/enroll", unpublished = true }]
async fn enroll_post(rqctx: Ctx, body: UntypedBody) -> Result<Response<Body>, HttpError> {
    page(&rqctx, async {
        let Some((form, s)) = partial_post(&rqctx, &body, "enroll").await? else { return Ok(redirect("/login")) };
        let Some(secret) = s.pending_totp.clone() else { return Ok(redirect("/login/enroll")) };
        let store = &rqctx.context().store;
        let bucket = bucket(&rqctx, &s.user.email, Some(&s.user)).await?;
        admit(&rqctx, &bucket).await?;
        let Some(step) = totp::verify(&secret, form.get("code"), now_ms() / 1000, None) else {
            let notice = Notice::Error("That code is not right. Check the phone's clock and try the next code.".into());
            return Ok(html(
                StatusCode::UNAUTHORIZED,
                views::bare("Set up two-step sign-in", Some(&notice), enroll_form(&s, &secret)?),
            ));
        };
        let codes: Vec<String> = (0..auth::RECOVERY_CODES).map(|_| auth::new_recovery_code()).collect();
        let normalized: Vec<String> = codes.iter().map(|c| auth::normalize_recovery_code(c)).collect();
        let hashes = auth::run(move || normalized.iter().map(|c| auth::hash_blocking(c)).collect::<Vec<String>>()).await?;
        store.enroll_totp(&s.user.id, &secret, step, &hashes).await?;
        store.clear_throttle(&bucket).await?;
        info!(rqctx.log, "authenticator enrolled"; "user_id" => &s.user.id);
        let cookies = complete_sign_in(&rqctx, &s.user).await?;
        let body = html! {
            section.card {
                p { "Two-step sign-in is on. If you lose your phone, each of these recovery codes signs you in once. Store them somewhere safe, such as a password manager. They are shown only now." }
                ol.codes #recovery-codes { @for c in &codes { li { (c) } } }
                p { a href=(home(&s.user)) { "I saved them: continue" } }
            }
        };
        Ok(with_cookies(html(StatusCode::OK, views::bare("Save your recovery codes", None, body)), &cookies))
    })
    .await
}

fn invite_form(token: &str, code: &str) -> Markup {
    html! {
        form.stack.card method="post" action="/invite" {
            (views::csrf_field(token))
            label for="invite-token" { "Invitation code" }
            input #invite-token type="text" name="token" value=(code) autocomplete="off" required;
            p.hint { "Filled in from your link. Without JavaScript, paste the part of the link after the #." }
            label for="password" { "Choose a password" }
            input #password type="password" name="password" autocomplete="new-password" minlength=(auth::MIN_PASSWORD_CHARS) required;
            label for="password2" { "The same password again" }
            input #password2 type="password" name="password2" autocomplete="new-password" required;
            p.hint { "At least " (auth::MIN_PASSWORD_CHARS) " characters; a few unrelated words work well. Next you set up an authenticator app." }
            button type="submit" { "Set password" }
        }
    }
}

/// Accepting an invitation (the one-time sign-in link, `/invite#CODE`).
#[endpoint { method = GET, path = "/invite", unpublished = true }]
async fn invite_get(rqctx: Ctx) -> Result<Response<Body>, HttpError> {
    page(&rqctx, async { sign_in_page(&rqctx, StatusCode::OK, "Welcome", None, |t| invite_form(t, "")).await }).await
}

/// Sets the password of an invited account and continues to the second step.
#[endpoint { method = POST, path = "/invite", unpublished = true }]
async fn invite_post(rqctx: Ctx, body: UntypedBody) -> Result<Response<Body>, HttpError> {
    page(&rqctx, async {
        let form = pre_session_form(&rqctx, &body).await?;
        let store = &rqctx.context().store;
        let code = form.get("token").trim_start_matches('#').to_string();
        let token_hash = auth::token_hash(&code);
        let now = now_ms();
        let invitation = store.invitation(&token_hash).await?;
        let invalid =
            || Notice::Error("This invitation is not valid: it was used, it expired, or the code is wrong.".into());
        let Some(invitation) =
            invitation.filter(|i| i.used_at.is_none() && i.expires_at > now && i.user.disabled_at.is_none())
        else {
            return sign_in_page(&rqctx, StatusCode::BAD_REQUEST, "Welcome", Some(&invalid()), |t| invite_form(t, ""))
                .await;
        };
        let user = invitation.user;
        // The email already signs in to an account of another customer: this one can
        // never be activated. Answered as any invalid link, so the link tells nothing
        // about other customers; the log says why.
        if store.email_signs_in_elsewhere(&user.email, &user.id).await? {
            warn!(rqctx.log, "invitation refused: the email signs in to another account"; "user_id" => &user.id);
            return sign_in_page(&rqctx, StatusCode::BAD_REQUEST, "Welcome", Some(&invalid()), |t| invite_form(t, ""))
                .await;
        }
        let password = form.raw("password");
        let problem = if password != form.raw("password2") {
            Some("The two passwords differ.".to_string())
        } else {
            auth::password_problem(password, &user.email)
        };
        if let Some(problem) = problem {
            return sign_in_page(&rqctx, StatusCode::BAD_REQUEST, "Welcome", Some(&Notice::Error(problem)), |t| {
                invite_form(t, &code)
            })
            .await;
        }
        let hash = auth::hash(password.to_string()).await?;
        if !store.spend_invitation(&token_hash, now).await? {
            return Err(DashError::BadRequest("This invitation was just used.".into()));
        }
        if user.password_hash.is_some() {
            // A new password from a new link: sessions signed in with the old one end.
            store.delete_user_sessions(&user.id).await?;
        }
        store.set_password_hash(&user.id, &hash).await?;
        let (stage, next) =
            if user.totp_secret.is_some() { ("mfa", "/login/mfa") } else { ("enroll", "/login/enroll") };
        let cookie = session::start(&rqctx, &user, stage).await?;
        info!(rqctx.log, "invitation accepted"; "user_id" => &user.id);
        Ok(with_cookies(redirect(next), &[cookie]))
    })
    .await
}

/// Signs out: the session is deleted on the server and the cookie cleared.
#[endpoint { method = POST, path = "/logout", unpublished = true }]
async fn logout_post(rqctx: Ctx, body: UntypedBody) -> Result<Response<Body>, HttpError> {
    page(&rqctx, async {
        let form = Form::parse(&rqctx, &body)?;
        csrf::check_fetch_site(&rqctx)?;
        if let Some(s) = session::current(&rqctx).await? {
            if !csrf::same_token(&s.csrf_token, form.raw("csrf")) {
                return Err(DashError::Csrf);
            }
            rqctx.context().store.delete_session(&s.id_hash).await?;
            info!(rqctx.log, "signed out"; "user_id" => &s.user.id);
        }
        Ok(with_cookies(redirect("/login"), &[session::clear_cookie(session::SESSION_COOKIE)]))
    })
    .await
}

pub fn register(api: &mut dropshot::ApiDescription<std::sync::Arc<crate::state::AppState>>) -> Result<(), String> {
    for result in [
        api.register(login_get),
        api.register(login_post),
        api.register(mfa_get),
        api.register(mfa_post),
        api.register(enroll_get),
        api.register(enroll_post),
        api.register(invite_get),
        api.register(invite_post),
        api.register(logout_post),
    ] {
        result.map_err(|e| e.to_string())?;
    }
    Ok(())
}

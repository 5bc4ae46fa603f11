//! The dashboard over HTTP, as a browser uses it: sign-in (password, TOTP, recovery
//! codes, enrolment), sessions (cookie flags, new ids, idle and absolute expiry,
//! sign-out), the throttle, CSRF (token and fetch metadata), roles on every
//! state-changing route, no cross-tenant access by guessing ids on any route, the
//! operator console, and the pages' own work (suppressions CSV, message log filters,
//! users, PBX, pagination).

use gateway_sdk_tests::dashboard::{DashClient, PASSWORD, Page, signed_in};
use gateway_sdk_tests::{Tenant, TestContext, create_tenant};
use gateway_server::dashboard::auth::token_hash;
use gateway_server::dashboard::roles::Role;
use gateway_server::dashboard::session::SESSION_COOKIE;
use gateway_server::ops;
use gateway_server::store::now_ms;

async fn person(cx: &TestContext, customer: Option<&str>, email: &str, role: Role) -> DashClient {
    signed_in(cx.store(), &cx.config, &cx.base_url, customer, email, role).await
}

async fn owner(cx: &TestContext) -> DashClient {
    person(cx, Some(&cx.tenant.customer_id), "owner@a.example", Role::Owner).await
}

fn assert_sign_in_redirect(page: &Page, what: &str) {
    assert_eq!((page.status, page.location.as_deref()), (303, Some("/login")), "{what}: {}", page.body);
}

/// Every customer and operator page.
const PAGES: &[&str] = &[
    "/dashboard",
    "/instances",
    "/messages",
    "/inbound-logs",
    "/suppressed-recipients",
    "/suppressed-recipients/export",
    "/api-keys",
    "/integrations/pbx",
    "/users",
    "/operator",
    "/operator/instances",
    "/operator/reviews",
    "/operator/policies",
];

#[tokio::test]
async fn pages_need_a_completed_sign_in() {
    let cx = TestContext::new("dash_pages_need_sign_in").await;
    let anonymous = DashClient::new(&cx.base_url);
    for path in PAGES {
        assert_sign_in_redirect(&anonymous.get(path).await, path);
    }
    let manage = format!("/instances/{}/manage", cx.tenant.instance_id);
    assert_sign_in_redirect(&anonymous.get(&manage).await, &manage);
    // Public pages are public.
    for path in ["/", "/acceptable-use", "/docs/responsible-messaging", "/login", "/invite"] {
        let page = anonymous.get(path).await;
        assert_eq!(page.status, 200, "{path}");
        assert!(page.content_type.starts_with("text/html"), "{path}");
    }
    // A password alone (no second step yet) reaches no page.
    let full = owner(&cx).await;
    let half = DashClient::new(&cx.base_url);
    let csrf = half.get("/login").await.csrf();
    let step = half.post("/login", &[("csrf", &csrf), ("email", &full.email), ("password", PASSWORD)]).await;
    assert_eq!(step.location.as_deref(), Some("/login/mfa"));
    for path in PAGES {
        assert_sign_in_redirect(&half.get(path).await, path);
    }
    cx.teardown().await;
}

#[tokio::test]
async fn sign_in_needs_password_and_a_code_that_works_once() {
    let cx = TestContext::new("dash_sign_in_totp").await;
    let ana = owner(&cx).await;
    assert_eq!(ana.get("/dashboard").await.status, 200, "signed in after enrolment");
    // Sign out, then in again: the enrolment's code is spent.
    ana.sign_out().await;
    assert_sign_in_redirect(&ana.get("/dashboard").await, "after sign-out");
    ana.password_step().await;
    let enrolled = ana.last_step();
    let reused = ana.code_step(&ana.code_at_step(enrolled)).await;
    assert_eq!(reused.status, 401, "a code is accepted once: {}", reused.body);
    let fresh = ana.code_step(&ana.fresh_code().await).await;
    assert_eq!((fresh.status, fresh.location.as_deref()), (303, Some("/dashboard")), "{}", fresh.body);
    // That code again, in a new sign-in: refused (it is still inside the time window).
    ana.sign_out().await;
    ana.password_step().await;
    assert_eq!(ana.code_step(&ana.code_at_step(ana.last_step())).await.status, 401);
    // A recovery code works once (case and dashes do not matter).
    let code = ana.recovery_codes[3].clone();
    let with_recovery = ana.code_step(&code.to_uppercase().replace('-', " ")).await;
    assert_eq!(with_recovery.location.as_deref(), Some("/dashboard"), "{}", with_recovery.body);
    ana.sign_out().await;
    ana.password_step().await;
    assert_eq!(ana.code_step(&code).await.status, 401, "a spent recovery code");
    // A wrong password reads like an unknown email.
    let fresh = DashClient::new(&cx.base_url);
    let csrf = fresh.get("/login").await.csrf();
    let wrong =
        fresh.post("/login", &[("csrf", &csrf), ("email", "owner@a.example"), ("password", "nope nope nope")]).await;
    let unknown =
        fresh.post("/login", &[("csrf", &csrf), ("email", "who@a.example"), ("password", "nope nope nope")]).await;
    assert_eq!((wrong.status, unknown.status), (401, 401));
    let text = "The email or the password is wrong.";
    assert!(wrong.body.contains(text) && unknown.body.contains(text));
    cx.teardown().await;
}

#[tokio::test]
async fn session_cookie_is_host_only_secure_and_new_at_each_step() {
    let cx = TestContext::new("dash_session_cookie").await;
    let ana = owner(&cx).await;
    let planted = "planted-session-id-planted-session-id-12345";
    ana.set_cookie(SESSION_COOKIE, planted);
    let csrf = ana.get("/login").await.csrf();
    let first = ana.post("/login", &[("csrf", &csrf), ("email", &ana.email), ("password", PASSWORD)]).await;
    let cookie = first.set_cookies.iter().find(|c| c.starts_with(SESSION_COOKIE)).expect("a session cookie");
    for flag in ["; Path=/", "; Secure", "; HttpOnly", "; SameSite=Lax"] {
        assert!(cookie.contains(flag), "{cookie} lacks {flag}");
    }
    assert!(!cookie.contains("Domain="), "__Host- cookies have no Domain: {cookie}");
    let half_id = ana.cookie(SESSION_COOKIE).unwrap();
    assert_ne!(half_id, planted, "a planted id is never kept");
    assert!(half_id.len() >= 43, "at least 256 bits of base62: {half_id}");
    let done = ana.code_step(&ana.fresh_code().await).await;
    assert_eq!(done.location.as_deref(), Some("/dashboard"), "{}", done.body);
    let full_id = ana.cookie(SESSION_COOKIE).unwrap();
    assert_ne!(full_id, half_id, "a new id once the second step is done");
    assert!(!cx.store().session_exists(&token_hash(&half_id)).await.unwrap());
    // Sign-out deletes the session on the server: the old cookie is dead.
    let csrf = ana.get("/dashboard").await.csrf();
    let out = ana.post("/logout", &[("csrf", &csrf)]).await;
    assert!(out.set_cookies.iter().any(|c| c.starts_with(&format!("{SESSION_COOKIE}=;")) && c.contains("Max-Age=0")));
    assert!(!cx.store().session_exists(&token_hash(&full_id)).await.unwrap());
    ana.set_cookie(SESSION_COOKIE, &full_id);
    assert_sign_in_redirect(&ana.get("/dashboard").await, "a signed-out session id");
    cx.teardown().await;
}

#[tokio::test]
async fn sessions_end_after_30_idle_minutes_or_12_hours() {
    let cx = TestContext::new("dash_session_expiry").await;
    let ana = owner(&cx).await;
    let id = ana.cookie(SESSION_COOKIE).unwrap();
    let hash = token_hash(&id);
    let now = now_ms();
    cx.store().touch_session(&hash, now - 29 * 60_000).await.unwrap();
    assert_eq!(ana.get("/dashboard").await.status, 200, "29 idle minutes are fine");
    cx.store().touch_session(&hash, now - 31 * 60_000).await.unwrap();
    assert_sign_in_redirect(&ana.get("/dashboard").await, "31 idle minutes");
    assert!(!cx.store().session_exists(&hash).await.unwrap(), "an expired session is deleted");
    // Absolute: a session whose 12 hours are over, however active.
    let user = cx.store().dashboard_user_by_email("owner@a.example").await.unwrap().unwrap();
    let old = "absolute-expiry-session-id-0123456789abcdefgh";
    cx.store().create_session(&token_hash(old), &user.id, "full", "tok", now - 1, now - 60_000).await.unwrap();
    ana.set_cookie(SESSION_COOKIE, old);
    assert_sign_in_redirect(&ana.get("/dashboard").await, "past the absolute expiry");
    cx.teardown().await;
}

#[tokio::test]
async fn throttle_slows_guessing_without_locking_out_a_known_browser() {
    let cx = TestContext::new("dash_throttle").await;
    let ana = owner(&cx).await; // this browser completed a sign-in: it is known
    ana.sign_out().await;
    let attacker = DashClient::new(&cx.base_url);
    let csrf = attacker.get("/login").await.csrf();
    for attempt in 1..=4 {
        let page =
            attacker.post("/login", &[("csrf", &csrf), ("email", &ana.email), ("password", "wrong guess here")]).await;
        assert_eq!(page.status, 401, "attempt {attempt} is checked");
    }
    // The fifth comes too soon: refused without checking, even with the right password.
    let early = attacker.post("/login", &[("csrf", &csrf), ("email", &ana.email), ("password", PASSWORD)]).await;
    assert_eq!(early.status, 429, "{}", early.body);
    assert!(early.body.contains("Too many attempts"));
    // The owner's own browser is throttled apart.
    let own_csrf = ana.get("/login").await.csrf();
    let own = ana.post("/login", &[("csrf", &own_csrf), ("email", &ana.email), ("password", PASSWORD)]).await;
    assert_eq!(own.location.as_deref(), Some("/login/mfa"), "known browser: {}", own.body);
    // After the delay the attacker's bucket admits again (no lockout).
    tokio::time::sleep(std::time::Duration::from_millis(1_100)).await;
    let later = attacker.post("/login", &[("csrf", &csrf), ("email", &ana.email), ("password", PASSWORD)]).await;
    assert_eq!(later.location.as_deref(), Some("/login/mfa"), "{} {}", later.status, later.body);
    cx.teardown().await;
}

#[tokio::test]
async fn posts_need_the_session_token_and_a_same_origin_fetch() {
    let cx = TestContext::new("dash_csrf").await;
    let ana = owner(&cx).await;
    let csrf = ana.get("/api-keys").await.csrf();
    let keys_before = cx.store().api_keys_page(&cx.tenant.customer_id, 100, 0).await.unwrap().1;
    let no_token = ana.post("/api-keys", &[("name", "x")]).await;
    let wrong_token = ana.post("/api-keys", &[("csrf", "0123456789"), ("name", "x")]).await;
    let cross_site =
        ana.post_with("/api-keys", &[("csrf", &csrf), ("name", "x")], &[("sec-fetch-site", "cross-site")]).await;
    let same_site =
        ana.post_with("/api-keys", &[("csrf", &csrf), ("name", "x")], &[("sec-fetch-site", "same-site")]).await;
    let foreign_origin =
        ana.post_with("/api-keys", &[("csrf", &csrf), ("name", "x")], &[("origin", "https://evil.example")]).await;
    for (what, page) in [
        ("no token", &no_token),
        ("wrong token", &wrong_token),
        ("cross-site", &cross_site),
        ("same-site", &same_site),
        ("foreign origin", &foreign_origin),
    ] {
        assert_eq!(page.status, 403, "{what}: {}", page.body);
    }
    // The sign-in form is protected too (its token is bound to a pre-session cookie).
    let other = DashClient::new(&cx.base_url);
    let refused = other.post("/login", &[("csrf", &csrf), ("email", &ana.email), ("password", PASSWORD)]).await;
    assert_eq!(refused.status, 403);
    // A form that is not urlencoded is refused.
    let json = ana.post_raw("/api-keys", "application/json", &format!("{{\"csrf\":\"{csrf}\",\"name\":\"x\"}}")).await;
    assert_eq!(json.status, 415);
    assert_eq!(
        cx.store().api_keys_page(&cx.tenant.customer_id, 100, 0).await.unwrap().1,
        keys_before,
        "no key was made"
    );
    // State changes are POST only: GET on a POST route is not served.
    let key = &cx.tenant.api_key_id;
    assert!(matches!(ana.get(&format!("/api-keys/{key}/revoke")).await.status, 404 | 405));
    // With everything right it works (and no metadata at all, like curl, is accepted).
    let ok = ana.post_with("/api-keys", &[("csrf", &csrf), ("name", "ok")], &[]).await;
    assert_eq!(ok.status, 200, "{}", ok.body);
    cx.teardown().await;
}

/// Every state-changing route of the customer side, for objects of `t`'s customer.
fn customer_posts(
    t: &Tenant,
    key_id: &str,
    user_id: &str,
    integration: i64,
    event: i64,
) -> Vec<(String, Vec<(&'static str, String)>)> {
    let i = &t.instance_id;
    let p = integration.to_string();
    vec![
        ("/instances".into(), vec![("name", "new-one".into())]),
        (format!("/instances/{i}/pair"), vec![]),
        (format!("/instances/{i}/confirm-pairing"), vec![]),
        (format!("/instances/{i}/logout"), vec![]),
        (
            format!("/instances/{i}/test-send"),
            vec![("phone", "+14155550123".into()), ("purpose", "support".into()), ("message", "hi".into())],
        ),
        (
            format!("/instances/{i}/webhook"),
            vec![("url", "http://127.0.0.1:9/x".into()), ("ev_message.sent", "on".into())],
        ),
        (format!("/instances/{i}/webhook/rotate-secret"), vec![]),
        (format!("/instances/{i}/webhook/enable"), vec![]),
        (format!("/instances/{i}/webhook/test"), vec![]),
        (format!("/instances/{i}/webhook/resend"), vec![("event", event.to_string())]),
        ("/api-keys".into(), vec![("name", "x".into())]),
        (format!("/api-keys/{key_id}/revoke"), vec![]),
        ("/suppressed-recipients".into(), vec![("phone", "+14155550177".into())]),
        ("/suppressed-recipients/remove".into(), vec![("phone", "+14155550166".into())]),
        ("/suppressed-recipients/import".into(), vec![("csv", "+14155550155,x".into())]),
        ("/integrations/pbx".into(), vec![("instance", i.clone())]),
        ("/integrations/pbx/settings".into(), vec![("integration", p.clone()), ("business_name", "X".into())]),
        (
            "/integrations/pbx/template".into(),
            vec![
                ("integration", p.clone()),
                ("event", "missed_call".into()),
                ("text", "hi".into()),
                ("purpose", "support".into()),
            ],
        ),
        ("/integrations/pbx/template/remove".into(), vec![("integration", p.clone()), ("event", "missed_call".into())]),
        ("/integrations/pbx/rotate-secret".into(), vec![("integration", p)]),
        ("/users".into(), vec![("email", "new@x.example".into()), ("role", "viewer".into())]),
        (format!("/users/{user_id}/role"), vec![("role", "viewer".into())]),
        (format!("/users/{user_id}/link"), vec![]),
        (format!("/users/{user_id}/remove"), vec![]),
    ]
}

/// A second customer with a user, a PBX integration, a webhook, a suppression and an
/// outbox event: (tenant, user id, integration id, event id).
async fn other_customer(cx: &TestContext) -> (Tenant, String, i64, i64) {
    let store = cx.store();
    let b = create_tenant(store, &cx.config, "Other customer", Some("starter")).await;
    let (user, _) = gateway_server::dashboard::accounts::create(
        store,
        &cx.config,
        Some(&b.customer_id),
        "bob@b.example",
        Role::Developer,
        "test",
    )
    .await
    .unwrap();
    let pbx = ops::create_pbx(store, &b.customer_id, "main", false, None).await.unwrap();
    let integration = pbx["integration_id"].as_i64().unwrap();
    ops::set_pbx_template(store, integration, "missed_call", "sorry", "support").await.unwrap();
    ops::set_webhook(store, &cx.config, &b.instance_id, "http://127.0.0.1:9/hook", "all", ops::SecretChoice::Keep)
        .await
        .unwrap();
    store.add_suppression(&b.customer_id, "+14155550166", "b's reason", "manual").await.unwrap();
    let client = cx.client_with_key(&b.api_key);
    client.message_send(&crate::text("main", "+14155550100", "B's message")).await.unwrap();
    let mut event = 0;
    for id in 1..50 {
        if let Some(e) = store.outbox_event(id).await.unwrap()
            && e.customer_id == b.customer_id
        {
            event = id;
            break;
        }
    }
    assert!(event > 0, "B has an outbox event");
    (b, user.id, integration, event)
}

#[tokio::test]
async fn no_route_reaches_another_customers_objects() {
    let cx = TestContext::with("dash_cross_tenant", |c| c.allow_loopback_targets = true, None).await;
    let (b, b_user, b_integration, b_event) = other_customer(&cx).await;
    let ana = owner(&cx).await;
    let csrf = ana.get("/dashboard").await.csrf();
    // Reads of B's objects by id.
    let i = &b.instance_id;
    for path in [
        format!("/instances/{i}/manage"),
        format!("/instances/{i}/manage?tab=webhook"),
        format!("/instances/{i}/status.json"),
    ] {
        let page = ana.get(&path).await;
        assert_eq!(page.status, 404, "{path}: {}", page.body);
        assert!(!page.body.contains(i.as_str()), "{path} leaks the id");
    }
    // Every state change aimed at B's objects: 404 (except routes that name no object,
    // which act on the viewer's own customer).
    for (path, fields) in customer_posts(&b, &b.api_key_id, &b_user, b_integration, b_event) {
        if matches!(
            path.as_str(),
            "/instances" | "/api-keys" | "/suppressed-recipients" | "/suppressed-recipients/import" | "/users"
        ) {
            continue;
        }
        let mut all: Vec<(&str, &str)> = vec![("csrf", &csrf)];
        all.extend(fields.iter().map(|(k, v)| (*k, v.as_str())));
        let page = ana.post(&path, &all).await;
        assert_eq!(page.status, 404, "{path} on B's object: {}", page.body);
    }
    // A resend of B's event through A's own instance: 404 too.
    let own = format!("/instances/{}/webhook/resend", cx.tenant.instance_id);
    assert_eq!(ana.post(&own, &[("csrf", &csrf), ("event", &b_event.to_string())]).await.status, 404);
    // B's objects are untouched.
    let store = cx.store();
    assert!(store.api_key(&b.api_key_id).await.unwrap().unwrap().revoked_at.is_none());
    let bob = store.dashboard_user(&b_user).await.unwrap().unwrap();
    assert_eq!((bob.role.as_str(), bob.disabled_at), ("developer", None));
    assert_eq!(store.pbx_templates(b_integration).await.unwrap().len(), 1);
    assert!(store.pbx_integration(b_integration).await.unwrap().unwrap().business_name.is_none());
    assert_eq!(store.suppressions_page(&b.customer_id, None, 10, 0).await.unwrap().1, 1);
    assert!(store.webhook(&b.instance_id).await.unwrap().unwrap().previous_secret.is_none());
    let attempts = store.attempts_page(&b.instance_id, None, 10).await.unwrap();
    assert!(attempts.iter().all(|a| a.trigger == "scheduled"), "no manual or test attempt: {attempts:?}");
    // Lists show nothing of B, whatever the query says.
    for path in [
        "/dashboard".to_string(),
        "/instances".into(),
        "/api-keys".into(),
        "/users".into(),
        "/suppressed-recipients".into(),
        "/suppressed-recipients/export".into(),
        format!("/messages?instance={i}"),
        format!("/inbound-logs?instance={i}"),
        "/integrations/pbx".into(),
    ] {
        let page = ana.get(&path).await;
        assert_eq!(page.status, 200, "{path}");
        for marker in [i.as_str(), "bob@b.example", "+14155550166", "+14155550100", &b.api_key[..12]] {
            assert!(!page.body.contains(marker), "{path} shows {marker}");
        }
        assert!(!page.body.contains(&format!("/integrations/pbx/webhook/{b_integration}<")), "{path}");
    }
    cx.teardown().await;
}

#[tokio::test]
async fn viewers_change_nothing_and_developers_manage_neither_keys_nor_users() {
    let cx = TestContext::with("dash_roles", |c| c.allow_loopback_targets = true, None).await;
    let store = cx.store();
    let t = cx.tenant.clone();
    let pbx = ops::create_pbx(store, &t.customer_id, "main", false, None).await.unwrap();
    let integration = pbx["integration_id"].as_i64().unwrap();
    ops::set_pbx_template(store, integration, "missed_call", "sorry", "support").await.unwrap();
    ops::set_webhook(store, &cx.config, &t.instance_id, "http://127.0.0.1:9/hook", "all", ops::SecretChoice::Keep)
        .await
        .unwrap();
    store.add_suppression(&t.customer_id, "+14155550166", "reason", "manual").await.unwrap();
    cx.client.message_send(&crate::text("main", "+14155550100", "hello")).await.unwrap();
    let (colleague, _) = gateway_server::dashboard::accounts::create(
        store,
        &cx.config,
        Some(&t.customer_id),
        "dev2@a.example",
        Role::Developer,
        "test",
    )
    .await
    .unwrap();
    let viewer = person(&cx, Some(&t.customer_id), "viewer@a.example", Role::Viewer).await;
    let csrf = viewer.get("/dashboard").await.csrf();
    let log_before = store.message_log_page(&t.customer_id, &Default::default(), None, 100).await.unwrap().len();
    for (path, fields) in customer_posts(&t, &t.api_key_id, &colleague.id, integration, 1) {
        let mut all: Vec<(&str, &str)> = vec![("csrf", &csrf)];
        all.extend(fields.iter().map(|(k, v)| (*k, v.as_str())));
        let page = viewer.post(&path, &all).await;
        assert_eq!(page.status, 403, "viewer may not POST {path}: {}", page.body);
    }
    // Nothing changed.
    assert!(store.api_key(&t.api_key_id).await.unwrap().unwrap().revoked_at.is_none());
    assert_eq!(store.api_keys_page(&t.customer_id, 100, 0).await.unwrap().1, 1);
    assert_eq!(store.suppressions_page(&t.customer_id, None, 10, 0).await.unwrap().1, 1);
    assert_eq!(store.instances_page(&t.customer_id, 10, 0).await.unwrap().1, 1);
    assert_eq!(store.pbx_integration_ids(&t.customer_id).await.unwrap().len(), 1);
    assert_eq!(store.pbx_templates(integration).await.unwrap().len(), 1);
    assert_eq!(store.customer_users(&t.customer_id, 10, 0).await.unwrap().1, 2);
    let attempts = store.attempts_page(&t.instance_id, None, 10).await.unwrap();
    assert!(attempts.iter().all(|a| a.trigger == "scheduled"), "no manual or test attempt: {attempts:?}");
    assert_eq!(
        store.message_log_page(&t.customer_id, &Default::default(), None, 100).await.unwrap().len(),
        log_before,
        "no test send"
    );
    // A viewer's pages offer no forms that change anything (only sign-out).
    for path in [
        "/instances",
        "/api-keys",
        "/suppressed-recipients",
        "/users",
        "/integrations/pbx",
        &format!("/instances/{}/manage", t.instance_id),
        &format!("/instances/{}/manage?tab=webhook", t.instance_id),
    ] {
        let page = viewer.get(path).await;
        assert_eq!(page.status, 200, "{path}");
        assert_eq!(page.body.matches("method=\"post\"").count(), 1, "{path} offers a viewer a form");
    }
    // A developer configures but manages neither keys nor users.
    let dev = person(&cx, Some(&t.customer_id), "dev@a.example", Role::Developer).await;
    let csrf = dev.get("/dashboard").await.csrf();
    assert_eq!(dev.post("/api-keys", &[("csrf", &csrf), ("name", "x")]).await.status, 403);
    assert_eq!(dev.post("/users", &[("csrf", &csrf), ("email", "z@a.example"), ("role", "viewer")]).await.status, 403);
    assert_eq!(
        dev.post("/integrations/pbx/rotate-secret", &[("csrf", &csrf), ("integration", &integration.to_string())])
            .await
            .status,
        403
    );
    assert_eq!(dev.post("/suppressed-recipients", &[("csrf", &csrf), ("phone", "+14155550111")]).await.status, 303);
    // An admin cannot make owners.
    let admin = person(&cx, Some(&t.customer_id), "admin@a.example", Role::Admin).await;
    let csrf = admin.get("/dashboard").await.csrf();
    assert_eq!(
        admin.post("/users", &[("csrf", &csrf), ("email", "o2@a.example"), ("role", "owner")]).await.status,
        403
    );
    cx.teardown().await;
}

#[tokio::test]
async fn operators_and_customers_keep_to_their_side() {
    let cx = TestContext::new("dash_operator").await;
    let store = cx.store();
    let ana = owner(&cx).await;
    let ops_user = person(&cx, None, "ops@gateway.example", Role::Operator).await;
    // Sides.
    for path in [
        "/operator",
        "/operator/instances",
        "/operator/reviews",
        "/operator/policies",
        &format!("/operator/customers/{}", cx.tenant.customer_id),
    ] {
        assert_eq!(ana.get(path).await.status, 403, "customer on {path}");
    }
    for path in ["/instances", "/api-keys", "/messages", "/users"] {
        assert_eq!(ops_user.get(path).await.status, 403, "operator on {path}");
    }
    let csrf = ana.get("/dashboard").await.csrf();
    let id = &cx.tenant.instance_id;
    assert_eq!(ana.post(&format!("/operator/instances/{id}/pause"), &[("csrf", &csrf)]).await.status, 403);
    for path in ["/operator/policies/reload", "/operator/policies/rollback", "/operator/reviews/1/decide"] {
        assert_eq!(ana.post(path, &[("csrf", &csrf), ("name", "content"), ("verdict", "dismissed")]).await.status, 403);
    }
    // Approve a Scale plan.
    let scale = ops::create_customer(store, "Scaler", Some("scale"), false).await.unwrap();
    let list = ops_user.get("/operator?pending=1").await;
    assert!(list.body.contains("Scaler") && !list.body.contains("Test customer"), "pending filter");
    let csrf = list.csrf();
    let approved = ops_user.post(&format!("/operator/customers/{}/approve", scale.id), &[("csrf", &csrf)]).await;
    assert_eq!(approved.status, 303, "{}", approved.body);
    assert_eq!(store.customer(&scale.id).await.unwrap().plan_status(now_ms()).as_str(), "active");
    // Pause and resume: the API sees it.
    ops_user.post(&format!("/operator/instances/{id}/pause"), &[("csrf", &csrf), ("reason", "complaints")]).await;
    let paused = cx.client.message_send(&crate::text("main", "+14155550123", "hi")).await;
    crate::expect_error(paused, 423, "instance_paused_for_review");
    let manage = ana.get(&format!("/instances/{id}/manage")).await;
    assert!(manage.body.contains("Paused for review") && manage.body.contains("complaints"));
    ops_user.post(&format!("/operator/instances/{id}/resume"), &[("csrf", &csrf)]).await;
    cx.client.message_send(&crate::text("main", "+14155550123", "hi")).await.unwrap();
    // Raise limits.
    let c = &cx.tenant.customer_id;
    let raised = ops_user
        .post(&format!("/operator/customers/{c}/limits"), &[("csrf", &csrf), ("daily", "500"), ("monthly", "")])
        .await;
    assert_eq!(raised.status, 303);
    assert_eq!(store.customer(c).await.unwrap().overrides.daily, Some(500));
    assert!(ana.get("/dashboard").await.body.contains(" of 500"), "the customer sees the raised limit");
    cx.teardown().await;
}

#[tokio::test]
async fn suppressions_add_import_export_and_refuse_sends() {
    let cx = TestContext::new("dash_suppressions").await;
    let ana = owner(&cx).await;
    let added = ana
        .submit(
            "/suppressed-recipients",
            "/suppressed-recipients",
            &[("phone", "+1 415 555 0123"), ("reason", "=asked us to stop")],
        )
        .await;
    assert_eq!(added.status, 303, "{}", added.body);
    let refused = cx.client.message_send(&crate::text("main", "+14155550123", "hello")).await;
    crate::expect_error(refused, 403, "recipient_suppressed");
    let mut csv = String::from("phone,reason\n");
    for n in 0..55 {
        csv.push_str(&format!("+1415555{:04},import test\n", 1000 + n));
    }
    csv.push_str("garbage,x\n");
    let imported = ana.submit("/suppressed-recipients", "/suppressed-recipients/import", &[("csv", &csv)]).await;
    assert!(imported.body.contains("Imported 55 row(s): 55 new"), "{}", imported.body);
    assert!(imported.body.contains("line 57"), "the bad line is reported");
    // Paginated: 56 rows, 50 a page.
    let first = ana.get("/suppressed-recipients").await;
    assert!(first.body.contains("Page 1 of 2") && first.body.contains("rel=\"next\""));
    let second = ana.get("/suppressed-recipients?page=2").await;
    assert_eq!(second.body.matches("<tr><td><code>").count(), 6);
    // Export: every row, with reason and source; the formulas are neutralised, those
    // behind a space or in fullwidth form too.
    cx.store().add_suppression(&cx.tenant.customer_id, "+14155550125", " =asked", "manual").await.unwrap();
    cx.store().add_suppression(&cx.tenant.customer_id, "+14155550126", "\u{FF1D}asked", "manual").await.unwrap();
    let export = ana.get("/suppressed-recipients/export").await;
    assert!(export.content_type.starts_with("text/csv"));
    assert_eq!(export.body.lines().count(), 59);
    assert!(export.body.contains("+14155550123,'=asked us to stop,manual,"), "{}", &export.body[..200]);
    assert!(export.body.contains("+14155550125,' =asked,manual,"), "{}", &export.body[..300]);
    assert!(export.body.contains("+14155550126,'\u{FF1D}asked,manual,"), "{}", &export.body[..300]);
    assert!(export.body.contains("+14155551000,import test,import,"));
    // Remove: sends go through again.
    let removed =
        ana.submit("/suppressed-recipients", "/suppressed-recipients/remove", &[("phone", "+14155550123")]).await;
    assert_eq!(removed.status, 303);
    cx.client.message_send(&crate::text("main", "+14155550123", "hello")).await.unwrap();
    cx.teardown().await;
}

#[tokio::test]
async fn message_log_shows_each_decision_and_filters() {
    let cx = TestContext::new("dash_message_log").await;
    let ana = owner(&cx).await;
    cx.client.message_send(&crate::text("main", "+14155550123", "ok")).await.unwrap();
    cx.store().add_suppression(&cx.tenant.customer_id, "+14155550124", "x", "manual").await.unwrap();
    let _ = cx.client.message_send(&crate::text("main", "+14155550124", "no")).await;
    // A test send from the dashboard goes through the same pipeline, source dashboard.
    let page = format!("/instances/{}/manage", cx.tenant.instance_id);
    let send = format!("/instances/{}/test-send", cx.tenant.instance_id);
    let sent =
        ana.submit(&page, &send, &[("phone", "+14155550125"), ("purpose", "support"), ("message", "test")]).await;
    assert!(sent.body.contains("Sent: message SIM"), "{}", sent.body);
    let all = ana.get("/messages").await;
    assert_eq!(all.body.matches("<tr><td>").count(), 3);
    let refused = ana.get("/messages?decision=refused").await;
    assert_eq!(refused.body.matches("<tr><td>").count(), 1);
    assert!(refused.body.contains("recipient_suppressed") && refused.body.contains("gateway/suppression"));
    let dashboard = ana.get("/messages?source=dashboard").await;
    assert_eq!(dashboard.body.matches("<tr><td>").count(), 1);
    assert!(dashboard.body.contains("+14155550125"));
    let by_phone = ana.get("/messages?recipient=%2B14155550123").await;
    assert_eq!(by_phone.body.matches("<tr><td>").count(), 1);
    cx.teardown().await;
}

/// The sign-in link shown on a page.
pub fn shown_link(body: &str) -> Option<String> {
    let at = body.find("/invite#")?;
    let start = body[..at].rfind('>')? + 1;
    let end = at + body[at..].find('<')?;
    Some(body[start..end].to_string())
}

#[tokio::test]
async fn users_are_invited_with_a_one_time_link_and_removal_ends_their_sessions() {
    let cx = TestContext::new("dash_users").await;
    let ana = owner(&cx).await;
    let invited = ana.submit("/users", "/users", &[("email", "Dev@A.example"), ("role", "developer")]).await;
    assert_eq!(invited.status, 200, "{}", invited.body);
    let link = shown_link(&invited.body).expect("the link is shown");
    let mut dev = DashClient::new(&cx.base_url);
    dev.email = "dev@a.example".into();
    dev.accept_link(&link).await;
    assert_eq!(dev.get("/instances").await.status, 200);
    // The link worked once.
    let again = DashClient::new(&cx.base_url);
    let csrf = again.get("/invite").await.csrf();
    let code = link.split_once('#').unwrap().1;
    let reused = again
        .post("/invite", &[("csrf", &csrf), ("token", code), ("password", PASSWORD), ("password2", PASSWORD)])
        .await;
    assert_eq!(reused.status, 400);
    // A new link (a forgotten password) sets a new password and ends the old sessions;
    // the authenticator stays.
    let relinked = ana
        .submit(
            "/users",
            &format!("/users/{}/link", cx.store().dashboard_user_by_email("dev@a.example").await.unwrap().unwrap().id),
            &[],
        )
        .await;
    let new_link = shown_link(&relinked.body).expect("a new link is shown");
    let other_browser = DashClient::new(&cx.base_url);
    let csrf = other_browser.get("/invite").await.csrf();
    let code = new_link.split_once('#').unwrap().1;
    let reset = other_browser
        .post("/invite", &[("csrf", &csrf), ("token", code), ("password", PASSWORD), ("password2", PASSWORD)])
        .await;
    assert_eq!(reset.location.as_deref(), Some("/login/mfa"), "the authenticator stays: {}", reset.body);
    assert_sign_in_redirect(&dev.get("/instances").await, "a session from before the new password");
    dev.password_step().await;
    assert_eq!(dev.code_step(&dev.fresh_code().await).await.location.as_deref(), Some("/dashboard"));
    // Removing the user ends their session at once.
    let user = cx.store().dashboard_user_by_email("dev@a.example").await.unwrap().unwrap();
    let removed = ana.submit("/users", &format!("/users/{}/remove", user.id), &[]).await;
    assert_eq!(removed.status, 303);
    assert_sign_in_redirect(&dev.get("/instances").await, "a removed user's session");
    // The last owner stays.
    let me = cx.store().dashboard_user_by_email("owner@a.example").await.unwrap().unwrap();
    let admin = person(&cx, Some(&cx.tenant.customer_id), "admin@a.example", Role::Admin).await;
    let csrf = admin.get("/users").await.csrf();
    assert_eq!(
        admin.post(&format!("/users/{}/remove", me.id), &[("csrf", &csrf)]).await.status,
        403,
        "admins do not touch owners"
    );
    cx.teardown().await;
}

#[tokio::test]
async fn inviting_an_email_of_another_customer_tells_nothing_about_it() {
    let cx = TestContext::new("dash_oracle").await;
    let other = create_tenant(cx.store(), &cx.config, "Other customer", Some("starter")).await;
    // b@b.example signs in to the other customer.
    let bea = person(&cx, Some(&other.customer_id), "b@b.example", Role::Owner).await;
    let ana = owner(&cx).await;
    let taken = ana.submit("/users", "/users", &[("email", "b@b.example"), ("role", "developer")]).await;
    let fresh = ana.submit("/users", "/users", &[("email", "new@b.example"), ("role", "developer")]).await;
    assert_eq!((taken.status, fresh.status), (200, 200), "{}", taken.body);
    let link = shown_link(&taken.body).expect("a link is shown as for anyone");
    assert!(shown_link(&fresh.body).is_some());
    // The two answers say the same, and the list shows both invitees alike.
    assert!(taken.body.contains("b@b.example is invited as developer."), "{}", taken.body);
    assert!(fresh.body.contains("new@b.example is invited as developer."));
    for word in ["exist", "another", "already", "taken"] {
        assert!(!taken.body.to_lowercase().contains(word), "the answer says {word:?}: {}", taken.body);
    }
    let list = ana.get("/users").await.body;
    let row = |email: &str| {
        let at = list.find(email).unwrap();
        let end = at + list[at..].find("</tr>").unwrap();
        list[at..end].replace(email, "EMAIL").chars().filter(|c| !c.is_ascii_hexdigit()).collect::<String>()
    };
    assert_eq!(row("b@b.example"), row("new@b.example"), "the two invitees are listed alike");
    // The link of the one that exists elsewhere is refused as any invalid link, and the
    // other customer's account is untouched.
    let browser = DashClient::new(&cx.base_url);
    let csrf = browser.get("/invite").await.csrf();
    let code = link.split_once('#').unwrap().1;
    let tried = browser
        .post("/invite", &[("csrf", &csrf), ("token", code), ("password", PASSWORD), ("password2", PASSWORD)])
        .await;
    assert_eq!(tried.status, 400);
    assert!(tried.body.contains("This invitation is not valid"), "{}", tried.body);
    assert_eq!(bea.get("/dashboard").await.status, 200);
    let signs_in = cx.store().dashboard_user_by_email("b@b.example").await.unwrap().unwrap();
    assert_eq!(signs_in.customer_id.as_deref(), Some(other.customer_id.as_str()), "the email signs in where it did");
    // Inviting an email twice into one customer is refused: that one is visible anyway.
    let twice = ana.submit("/users", "/users", &[("email", "new@b.example"), ("role", "viewer")]).await;
    assert_eq!(twice.status, 400);
    cx.teardown().await;
}

#[tokio::test]
async fn pbx_page_shows_secrets_once_and_saves_templates() {
    let cx = TestContext::new("dash_pbx").await;
    let ana = owner(&cx).await;
    let created = ana
        .submit(
            "/integrations/pbx",
            "/integrations/pbx",
            &[("instance", &cx.tenant.instance_id), ("hmac", "on"), ("business_name", "Acme")],
        )
        .await;
    assert_eq!(created.status, 200, "{}", created.body);
    assert!(created.body.contains("pbx_") && created.body.contains("pbxsig_"), "both secrets shown once");
    let id = cx.store().pbx_integration_ids(&cx.tenant.customer_id).await.unwrap()[0];
    let page = ana.get("/integrations/pbx").await;
    assert!(!page.body.contains("pbxsig_"), "never shown again");
    let bad = ana
        .submit(
            "/integrations/pbx",
            "/integrations/pbx/template",
            &[
                ("integration", &id.to_string()),
                ("event", "missed_call"),
                ("text", "hi {{nope}}"),
                ("purpose", "support"),
            ],
        )
        .await;
    assert_eq!(bad.status, 400, "unknown placeholder refused");
    let good = ana
        .submit(
            "/integrations/pbx",
            "/integrations/pbx/template",
            &[
                ("integration", &id.to_string()),
                ("event", "missed_call"),
                ("text", "{{business_name}}: we missed your call"),
                ("purpose", "support"),
            ],
        )
        .await;
    assert_eq!(good.status, 303);
    assert_eq!(cx.store().pbx_templates(id).await.unwrap().len(), 1);
    let settings = ana
        .submit(
            "/integrations/pbx",
            "/integrations/pbx/settings",
            &[
                ("integration", &id.to_string()),
                ("business_name", "Acme Dental"),
                ("rate_per_minute", "30"),
                ("burst", "5"),
                ("cooldown_minutes", "0"),
                ("strict_window_hours", ""),
                ("ip_allowlist", ""),
            ],
        )
        .await;
    assert_eq!(settings.status, 303, "{}", settings.body);
    let saved = cx.store().pbx_integration(id).await.unwrap().unwrap();
    assert_eq!(
        (saved.business_name.as_deref(), saved.rate_per_minute, saved.cooldown_seconds),
        (Some("Acme Dental"), Some(30), Some(0))
    );
    cx.teardown().await;
}

#[tokio::test]
async fn evolution_pairing_page_follows_the_providers_qr_and_connection() {
    use gateway_sdk_tests::fake_evolution::FakeEvolution;
    let fake = FakeEvolution::start("global-key-for-tests").await;
    let cx = TestContext::with("dash_evolution_pairing", |c| fake.configure(c), None).await;
    let ana = owner(&cx).await;
    let id = cx.tenant.instance_id.clone();
    let status = || async {
        serde_json::from_str::<serde_json::Value>(&ana.get(&format!("/instances/{id}/status.json")).await.body).unwrap()
    };
    assert_eq!(status().await["lifecycle"], "created");
    let page = format!("/instances/{id}/manage");
    let paired = ana.submit(&page, &format!("/instances/{id}/pair"), &[]).await;
    assert_eq!(paired.status, 303, "{}", paired.body);
    let first = status().await;
    assert_eq!(first["lifecycle"], "qr_pending");
    let first_qr = first["qr"].as_str().expect("the provider's QR is shown").to_string();
    assert!(first_qr.starts_with("data:image/png;base64,"));
    assert!(ana.get(&page).await.body.contains(&first_qr), "the page shows it");
    // The provider refreshes the QR: the poll sees the new one.
    let refreshed = "data:image/png;base64,UkVGUkVTSEVE";
    let event = serde_json::json!({"event": "qrcode.updated", "instance": id, "data": {"qrcode": {"instance": id,
        "pairingCode": null, "code": "2@refreshed", "base64": refreshed}}});
    assert_eq!(fake.emit(&id, &event).await, 200);
    assert_eq!(status().await["qr"], refreshed);
    // A pairing code for a number, shown on the page.
    let with_number = ana.submit(&page, &format!("/instances/{id}/pair"), &[("number", "+55 11 99999 9999")]).await;
    assert!(with_number.body.contains("WZYEH1YY"), "{}", with_number.body);
    // The phone connects: the poll says so, and the QR is gone.
    let open = serde_json::json!({"event": "connection.update", "instance": id, "data": {"instance": id, "state": "open", "statusReason": 200}});
    assert_eq!(fake.emit(&id, &open).await, 200);
    let now = status().await;
    assert_eq!((now["lifecycle"].as_str(), now["qr"].is_null()), (Some("connected"), true));
    cx.teardown().await;
}

#[tokio::test]
async fn root_is_json_for_monitors_and_a_page_for_browsers() {
    let cx = TestContext::new("dash_root").await;
    let json: serde_json::Value = cx.http.get(&cx.base_url).send().await.unwrap().json().await.unwrap();
    assert_eq!(json["status"], "ok");
    let page = DashClient::new(&cx.base_url).get("/").await;
    assert!(page.content_type.starts_with("text/html") && page.body.contains("The gateway is reachable."));
    assert!(page.body.contains("HTTP (local)"), "plain HTTP on loopback is said to be plain");
    cx.teardown().await;
}

#[tokio::test]
async fn webhook_tab_shows_a_disabled_endpoint_and_resends_an_event() {
    use gateway_sdk_tests::receiver::{Behaviour, Receiver};
    let cx = TestContext::with(
        "dash_webhook_disabled",
        |c| {
            c.allow_loopback_targets = true;
            c.webhooks.poll_interval_ms = 20;
        },
        None,
    )
    .await;
    let receiver = Receiver::start().await;
    receiver.script([Behaviour::status(410)]);
    let dev = person(&cx, Some(&cx.tenant.customer_id), "dev@a.example", Role::Developer).await;
    let id = cx.tenant.instance_id.clone();
    let tab = format!("/instances/{id}/manage?tab=webhook");
    let saved = dev
        .submit(&tab, &format!("/instances/{id}/webhook"), &[("url", &receiver.url("/h")), ("ev_message.sent", "on")])
        .await;
    assert!(saved.body.contains("whsec_"), "a new endpoint's secret is shown once");
    assert_eq!(cx.store().webhook(&id).await.unwrap().unwrap().events, vec!["message.sent".to_string()]);
    cx.client.message_send(&crate::text("main", "+14155550123", "hi")).await.unwrap();
    receiver.wait_for(1, std::time::Duration::from_secs(5)).await;
    // 410 disabled the endpoint: the tab says so, with the reason.
    let started = std::time::Instant::now();
    let page = loop {
        let page = dev.get(&tab).await;
        if page.body.contains("id=\"webhook-disabled\"") || started.elapsed().as_secs() > 5 {
            break page;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    assert!(page.body.contains("Deliveries to this endpoint are disabled"), "{}", page.body);
    assert!(!page.body.contains("whsec_"), "the secret is never shown again");
    // Enable it, then resend the event that got the 410 (one manual attempt, now 200).
    let enabled = dev.submit(&tab, &format!("/instances/{id}/webhook/enable"), &[]).await;
    assert_eq!(enabled.status, 303);
    assert!(!dev.get(&tab).await.body.contains("id=\"webhook-disabled\""));
    let event = cx.store().attempts_page(&id, None, 10).await.unwrap()[0].outbox_id.unwrap();
    let resent = dev.submit(&tab, &format!("/instances/{id}/webhook/resend"), &[("event", &event.to_string())]).await;
    assert!(resent.body.contains(&format!("Event evt_{event} delivered: 200")), "{}", resent.body);
    let attempts = cx.store().attempts_page(&id, None, 10).await.unwrap();
    assert_eq!((attempts[0].trigger.as_str(), attempts[0].succeeded), ("manual", true));
    assert_eq!(receiver.received().len(), 2);
    cx.teardown().await;
}

//! The dashboard in a real browser (headless Chromium through chromedriver): first
//! sign-in from a one-time link with TOTP enrolment, a later sign-in with a code,
//! pairing an instance with the simulator while the page follows live, an API key
//! created, used and revoked, a webhook configured with a test delivery seen, a
//! suppression that refuses a send, a viewer who can change nothing, and posts without
//! the CSRF token refused. With `GATEWAY_SCREENSHOTS=DIR` the main pages are saved.

use gateway_sdk_tests::browser::Browser;
use gateway_sdk_tests::dashboard::{DashClient, PASSWORD, signed_in};
use gateway_sdk_tests::receiver::Receiver;
use gateway_sdk_tests::{TestContext, create_tenant};
use gateway_server::dashboard::accounts;
use gateway_server::dashboard::roles::Role;
use gateway_server::ops;
use std::time::Duration;

/// Signs in through the pages: email and password, then a fresh code.
pub async fn sign_in(b: &Browser, cx: &TestContext, person: &DashClient) {
    b.goto(&format!("{}/login", cx.base_url)).await;
    b.fill("#email", &person.email).await;
    b.fill("#password", PASSWORD).await;
    b.submit("/login").await;
    b.find("#code").await;
    b.fill("#code", &person.fresh_code().await).await;
    b.submit("/login/mfa").await;
    b.find("header .me").await;
}

/// `fetch` a POST from the page; the answer's status.
async fn fetch_post(b: &Browser, path: &str, body: &str) -> u16 {
    let script = r#"
        const [path, body, done] = arguments;
        fetch(path, { method: "POST", credentials: "same-origin", body: new URLSearchParams(body),
                      redirect: "manual" })
          .then(r => done(r.status)).catch(e => done(-1));
    "#;
    let status = b.client.execute_async(script, vec![path.into(), body.into()]).await.unwrap();
    status.as_u64().unwrap_or(0) as u16
}

#[tokio::test]
async fn browser_first_sign_in_with_totp_and_live_pairing() {
    let cx = TestContext::new("browser_sign_in_pairing").await;
    let store = cx.store();
    let tenant = create_tenant(store, &cx.config, "Browser Co", Some("scale")).await;
    let (_, link) =
        accounts::create(store, &cx.config, Some(&tenant.customer_id), "owner@browser.example", Role::Owner, "test")
            .await
            .unwrap();
    let b = Browser::start().await;
    // The one-time link: the script copies the code from the fragment into the form.
    b.goto(&link).await;
    let code_field = b.find("#invite-token").await;
    assert_eq!(code_field.prop("value").await.unwrap().as_deref(), Some(link.split_once('#').unwrap().1));
    assert!(!b.client.current_url().await.unwrap().as_str().contains('#'), "the code leaves the address bar");
    b.fill("#password", PASSWORD).await;
    b.fill("#password2", PASSWORD).await;
    b.submit("/invite").await;
    // Enrolment: a QR and the seed; the app's code confirms it.
    let secret: String = b.text_of("#totp-secret").await.split_whitespace().collect();
    b.find(".qr svg").await;
    b.screenshot("02-enrol-authenticator").await;
    let mut person = DashClient::new(&cx.base_url);
    person.email = "owner@browser.example".into();
    let step = DashClient::now_step();
    person.enrolled(&secret, step);
    b.fill("#code", &person.code_at_step(step)).await;
    b.submit("/login/enroll").await;
    b.wait_for_text("Save your recovery codes").await;
    let codes = b.client.find_all(fantoccini::Locator::Css("#recovery-codes li")).await.unwrap();
    assert_eq!(codes.len(), 10);
    b.click("main a").await;
    b.wait_for_text("Usage against your limits").await;
    // Sign out, and in again with password and code.
    b.click("header form[action=\"/logout\"] button").await;
    b.find("#email").await;
    b.screenshot("01-sign-in").await;
    sign_in(&b, &cx, &person).await;
    assert_eq!(b.path().await, "/dashboard");
    // Pair a new instance: the QR appears, the phone "scans", the page follows.
    b.goto(&format!("{}/instances", cx.base_url)).await;
    b.fill("input[name=name]", "front-desk").await;
    b.submit("/instances").await;
    b.wait_for_text("Not paired yet").await;
    let path = b.path().await;
    let instance_id = path.trim_start_matches("/instances/").trim_end_matches("/manage").to_string();
    b.click(&format!("form[action=\"/instances/{instance_id}/pair\"] button")).await;
    b.find("img.qr-image").await;
    b.wait_for_text("Waiting for the phone to scan").await;
    b.screenshot("04-pairing-qr").await;
    ops::confirm_pairing(store, &instance_id).await.unwrap(); // the phone scanned it
    b.wait_for_text("Connected").await; // the page's poll saw it, without a click
    assert_eq!(b.path().await, format!("/instances/{instance_id}/manage"));
    assert_eq!(store.instance(&instance_id).await.unwrap().connection_state, "open");
    b.close().await;
    cx.teardown().await;
}

#[tokio::test]
async fn browser_api_key_created_used_revoked_and_csrf_less_posts_refused() {
    let cx = TestContext::new("browser_api_keys").await;
    let owner = signed_in(
        cx.store(),
        &cx.config,
        &cx.base_url,
        Some(&cx.tenant.customer_id),
        "owner@keys.example",
        Role::Owner,
    )
    .await;
    let b = Browser::start().await;
    sign_in(&b, &cx, &owner).await;
    b.goto(&format!("{}/api-keys", cx.base_url)).await;
    b.fill("input[name=name]", "billing").await;
    b.submit("/api-keys").await;
    let key = b.text_of("#new-key code.copy").await;
    assert!(key.starts_with("gw_live_"), "{key}");
    b.screenshot("05-api-keys").await;
    let client = cx.client_with_key(&key);
    client.message_send(&crate::text("main", "+14155550123", "Your order shipped")).await.expect("the new key sends");
    // A post without the token is refused, from the dashboard's own page.
    let keys = cx.store().api_keys_page(&cx.tenant.customer_id, 100, 0).await.unwrap().1;
    assert_eq!(fetch_post(&b, "/api-keys", "name=sneaky").await, 403);
    assert_eq!(cx.store().api_keys_page(&cx.tenant.customer_id, 100, 0).await.unwrap().1, keys);
    // Revoke it: the next request fails.
    b.goto(&format!("{}/api-keys", cx.base_url)).await;
    let id = cx
        .store()
        .api_keys_page(&cx.tenant.customer_id, 100, 0)
        .await
        .unwrap()
        .0
        .into_iter()
        .find(|k| k.name == "billing")
        .unwrap()
        .id;
    b.click(&format!("form[action=\"/api-keys/{id}/revoke\"] button")).await;
    b.wait_for_text("The key is revoked").await;
    let refused = client.message_send(&crate::text("main", "+14155550123", "again")).await;
    crate::expect_error(refused, 401, "revoked_api_key");
    b.close().await;
    cx.teardown().await;
}

#[tokio::test]
async fn browser_webhook_configured_and_its_test_attempt_shown() {
    let cx = TestContext::with("browser_webhook", |c| c.allow_loopback_targets = true, None).await;
    let receiver = Receiver::start().await;
    let owner = signed_in(
        cx.store(),
        &cx.config,
        &cx.base_url,
        Some(&cx.tenant.customer_id),
        "dev@hooks.example",
        Role::Developer,
    )
    .await;
    let b = Browser::start().await;
    sign_in(&b, &cx, &owner).await;
    let id = &cx.tenant.instance_id;
    b.goto(&format!("{}/instances/{id}/manage?tab=webhook", cx.base_url)).await;
    b.fill("#url", &receiver.url("/hooks")).await;
    b.submit(&format!("/instances/{id}/webhook")).await;
    b.wait_for_text("Endpoint saved.").await;
    let secret = b.text_of(".secret code.copy").await;
    assert!(secret.starts_with("whsec_"), "{secret}");
    b.click(&format!("form[action=\"/instances/{id}/webhook/test\"] button")).await;
    b.wait_for_text("Test event delivered: 200").await;
    let row = b.text_of("#attempts tbody tr").await;
    assert!(row.contains("webhook.test") && row.contains("test") && row.contains("200"), "{row}");
    b.screenshot("06-webhook").await;
    let got = receiver.wait_for(1, Duration::from_secs(5)).await;
    assert_eq!(got[0].header("x-gateway-event"), Some("webhook.test"));
    assert!(got[0].header("x-gateway-signature").is_some_and(|s| s.starts_with("sha256=")));
    b.close().await;
    cx.teardown().await;
}

#[tokio::test]
async fn browser_suppression_refuses_the_send() {
    let cx = TestContext::new("browser_suppression").await;
    let owner = signed_in(
        cx.store(),
        &cx.config,
        &cx.base_url,
        Some(&cx.tenant.customer_id),
        "admin@supp.example",
        Role::Admin,
    )
    .await;
    let b = Browser::start().await;
    sign_in(&b, &cx, &owner).await;
    b.goto(&format!("{}/suppressed-recipients", cx.base_url)).await;
    b.fill("#phone", "+14155550123").await;
    b.fill("#reason", "asked us to stop").await;
    b.submit("/suppressed-recipients").await;
    b.wait_for_text("Suppressed: sends to this number are refused.").await;
    assert!(b.text_of("#suppressions").await.contains("asked us to stop"));
    // A CSV file chosen in the page is read into the import form.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("optouts.csv");
    std::fs::write(&file, "phone,reason\n+14155550124,complaint\n+442071838750,asked by phone\n").unwrap();
    b.find("#csv-file").await.send_keys(&file.display().to_string()).await.unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while b.find("#csv").await.prop("value").await.unwrap().unwrap_or_default().is_empty() {
        assert!(std::time::Instant::now() < deadline, "the file was not read into the form");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    b.submit("/suppressed-recipients/import").await;
    b.wait_for_text("Imported 2 row(s): 2 new").await;
    b.screenshot("07-suppressed-recipients").await;
    // The dashboard's own test send is refused, through the real pipeline.
    let id = &cx.tenant.instance_id;
    b.goto(&format!("{}/instances/{id}/manage", cx.base_url)).await;
    b.fill("#phone", "+14155550123").await;
    b.submit(&format!("/instances/{id}/test-send")).await;
    b.wait_for_text("Refused: recipient_suppressed").await;
    // And so is the API's.
    let refused = cx.client.message_send(&crate::text("main", "+14155550123", "hello")).await;
    crate::expect_error(refused, 403, "recipient_suppressed");
    b.goto(&format!("{}/messages?decision=refused", cx.base_url)).await;
    let log = b.text_of("#message-log").await;
    assert!(log.contains("gateway/suppression") && log.contains("dashboard") && log.contains("api"), "{log}");
    b.screenshot("08-message-log").await;
    b.close().await;
    cx.teardown().await;
}

#[tokio::test]
async fn browser_viewer_cannot_change_anything() {
    let cx = TestContext::new("browser_viewer").await;
    let viewer = signed_in(
        cx.store(),
        &cx.config,
        &cx.base_url,
        Some(&cx.tenant.customer_id),
        "viewer@ro.example",
        Role::Viewer,
    )
    .await;
    let b = Browser::start().await;
    sign_in(&b, &cx, &viewer).await;
    for path in
        ["/api-keys", "/suppressed-recipients", "/users", &format!("/instances/{}/manage", cx.tenant.instance_id)]
    {
        b.goto(&format!("{}{path}", cx.base_url)).await;
        b.find("main h1").await;
        let forms = b.client.find_all(fantoccini::Locator::Css("main form[method=post]")).await.unwrap();
        assert!(forms.is_empty(), "{path} offers a viewer {} form(s)", forms.len());
    }
    // Even with the session's own token, the role is checked on the server.
    let token = b.find("header form[action=\"/logout\"] input[name=csrf]").await.prop("value").await.unwrap().unwrap();
    assert_eq!(fetch_post(&b, "/api-keys", &format!("csrf={token}&name=x")).await, 403);
    let form = format!("csrf={token}&phone=%2B14155550123");
    assert_eq!(fetch_post(&b, "/suppressed-recipients", &form).await, 403);
    assert_eq!(cx.store().api_keys_page(&cx.tenant.customer_id, 100, 0).await.unwrap().1, 1);
    assert_eq!(cx.store().suppressions_page(&cx.tenant.customer_id, None, 10, 0).await.unwrap().1, 0);
    b.goto(&format!("{}/docs/responsible-messaging", cx.base_url)).await;
    b.wait_for_text("Opt-out keywords").await;
    b.screenshot("10-responsible-messaging").await;
    // The operator console, for the pictures.
    b.click("header form[action=\"/logout\"] button").await;
    b.find("#email").await;
    ops::create_customer(cx.store(), "Waiting Scale customer", Some("scale"), false).await.unwrap();
    let operator = signed_in(cx.store(), &cx.config, &cx.base_url, None, "ops@gateway.example", Role::Operator).await;
    sign_in(&b, &cx, &operator).await;
    b.wait_for_text("wait for plan approval").await;
    b.screenshot("09-operator-console").await;
    // A message held for review, and the policy modules.
    let held = serde_json::json!({"instance_id": "main", "phone": "+14155550190", "message_purpose": "authentication",
                                  "message": "Your code is 123456. Use coupon SAVE10"});
    assert_eq!(cx.send_json(&held).await.0, 403);
    b.goto(&format!("{}/operator/reviews", cx.base_url)).await;
    b.wait_for_text("Use coupon SAVE10").await;
    b.screenshot("11-review-queue").await;
    b.goto(&format!("{}/operator/policies", cx.base_url)).await;
    b.wait_for_text("content").await;
    b.screenshot("12-policy-modules").await;
    b.close().await;
    cx.teardown().await;
}

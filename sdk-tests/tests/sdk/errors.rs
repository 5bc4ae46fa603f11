//! Every error code and status of `POST /api/send-message`, one test per case, and the
//! order in which the checks run.

use crate::{expect_error, expect_raw, retryable, text};
use gateway_sdk_tests::{TestContext, create_tenant, parts_with_provider};
use gateway_server::ops;
use gateway_server::provider::{OutboundMessage, Provider, ProviderError, ProviderReceipt, SendingInstance};
use serde_json::json;
use std::sync::Arc;

const OK_PHONE: &str = "+14155550123";

fn body(cx: &TestContext) -> serde_json::Value {
    json!({"instance_id": cx.tenant.instance_name, "phone": OK_PHONE, "message_purpose": "transactional", "message": "Your code is 123456"})
}

fn bearer(key: &str) -> Vec<u8> {
    format!("Bearer {key}").into_bytes()
}

// ---- 401 ----

#[tokio::test]
async fn missing_api_key_is_401_invalid_api_key() {
    let cx = TestContext::new("missing_key").await;
    let r = cx.raw_send(body(&cx).to_string(), &[("content-type", b"application/json")]).await;
    expect_raw(r, 401, "invalid_api_key");
    cx.teardown().await;
}

#[tokio::test]
async fn unknown_malformed_or_non_bearer_keys_are_401_invalid_api_key() {
    let cx = TestContext::new("bad_keys").await;
    let unknown = gateway_server::apikey::generate().plaintext;
    let cases: Vec<Vec<u8>> = vec![
        bearer(&unknown),
        bearer("gw_live_nope"),
        bearer(&cx.tenant.api_key[..cx.tenant.api_key.len() - 1]),
        format!("Basic {}", cx.tenant.api_key).into_bytes(),
        b"Bearer".to_vec(),
        b"Bearer \xff\xfe".to_vec(), // not UTF-8: a bad header is still 401
    ];
    for auth in cases {
        let r = cx
            .raw_send(body(&cx).to_string(), &[("authorization", &auth), ("content-type", b"application/json")])
            .await;
        expect_raw(r, 401, "invalid_api_key");
    }
    let e = expect_error(
        cx.client_with_key(&unknown).message_send(&text("main", OK_PHONE, "x")).await,
        401,
        "invalid_api_key",
    );
    assert!(e.details.is_empty());
    cx.teardown().await;
}

#[tokio::test]
async fn revoked_key_is_401_revoked_api_key_at_once() {
    let cx = TestContext::new("revoked_key").await;
    cx.client.message_send(&text("main", OK_PHONE, "before")).await.expect("key works before revocation");
    cx.store().revoke_api_key(&cx.tenant.api_key_id).await.unwrap();
    let e = cx.client.message_send(&text("main", OK_PHONE, "after")).await;
    let e = expect_error(e, 401, "revoked_api_key");
    assert!(!e.details.is_empty());
    cx.teardown().await;
}

#[tokio::test]
async fn auth_is_checked_before_content_type_and_json() {
    let cx = TestContext::new("auth_first").await;
    let r = cx.raw_send("{not json", &[("content-type", b"text/plain")]).await;
    expect_raw(r, 401, "invalid_api_key");
    cx.teardown().await;
}

// ---- 415 ----

#[tokio::test]
async fn wrong_missing_or_garbled_content_type_is_415() {
    let cx = TestContext::new("content_type").await;
    let auth = bearer(&cx.tenant.api_key);
    for ct in [&b"text/plain"[..], b"application/x-www-form-urlencoded", b"application/jsonp", b"application/\xffjson"]
    {
        let r = cx.raw_send(body(&cx).to_string(), &[("authorization", &auth), ("content-type", ct)]).await;
        expect_raw(r, 415, "unsupported_media_type");
    }
    let r = cx.raw_send(body(&cx).to_string(), &[("authorization", &auth)]).await;
    let b = expect_raw(r, 415, "unsupported_media_type");
    assert_eq!(b["details"]["content_type"], "");
    // Parameters are fine.
    let r = cx
        .raw_send(
            body(&cx).to_string(),
            &[("authorization", &auth), ("content-type", b"application/json; charset=utf-8")],
        )
        .await;
    assert_eq!(r.0, 200, "{}", r.1);
    cx.teardown().await;
}

#[tokio::test]
async fn content_type_is_checked_before_json() {
    let cx = TestContext::new("ct_before_json").await;
    let r =
        cx.raw_send("{oops", &[("authorization", &bearer(&cx.tenant.api_key)), ("content-type", b"text/plain")]).await;
    expect_raw(r, 415, "unsupported_media_type");
    cx.teardown().await;
}

// ---- 400 ----

#[tokio::test]
async fn malformed_json_trailing_bytes_and_empty_body_are_400_invalid_json() {
    let cx = TestContext::new("invalid_json").await;
    let auth = bearer(&cx.tenant.api_key);
    let headers: [(&str, &[u8]); 2] = [("authorization", &auth), ("content-type", b"application/json")];
    let trailing = format!("{} x", body(&cx));
    let two_values = format!("{}{}", body(&cx), body(&cx));
    for input in ["{\"instance_id\":", "", "   ", "nul", &trailing, &two_values, "{'a':1}"] {
        let r = cx.raw_send(input.to_string(), &headers).await;
        expect_raw(r, 400, "invalid_json");
    }
    let r = cx.raw_send(vec![0xff, 0xfe, b'{'], &headers).await;
    expect_raw(r, 400, "invalid_json");
    cx.teardown().await;
}

// ---- 413 ----

#[tokio::test]
async fn body_over_the_limit_is_413() {
    let cx = TestContext::new("too_large").await;
    let auth = bearer(&cx.tenant.api_key);
    let big = format!("{{\"message\":\"{}\"}}", "a".repeat(gateway_api_limit() + 1));
    let r = cx.raw_send(big, &[("authorization", &auth), ("content-type", b"application/json")]).await;
    let b = expect_raw(r, 413, "payload_too_large");
    assert_eq!(b["details"]["limit_bytes"], gateway_api_limit() as u64);
    cx.teardown().await;
}

fn gateway_api_limit() -> usize {
    23 * 1024 * 1024
}

// ---- 422 ----

#[tokio::test]
async fn unknown_property_is_422_naming_the_field() {
    let cx = TestContext::new("unknown_field").await;
    let mut b = body(&cx);
    b["priority"] = json!("high");
    let r = expect_raw(cx.send_json(&b).await, 422, "validation_error");
    assert_eq!(r["details"]["field"], "priority");
    cx.teardown().await;
}

#[tokio::test]
async fn wrong_types_are_422_naming_the_field() {
    let cx = TestContext::new("wrong_types").await;
    for (field, value) in
        [("phone", json!(14155550123u64)), ("message", json!(["a"])), ("instance_id", json!({"a": 1}))]
    {
        let mut b = body(&cx);
        b[field] = value;
        let r = expect_raw(cx.send_json(&b).await, 422, "validation_error");
        assert_eq!(r["details"]["field"], field);
    }
    let r = expect_raw(cx.send_json(&json!([1, 2])).await, 422, "validation_error");
    assert_eq!(r["details"]["field"], "body");
    cx.teardown().await;
}

#[tokio::test]
async fn missing_fields_have_their_own_codes() {
    let cx = TestContext::new("missing_fields").await;
    let without = |field: &str| {
        let mut b = body(&cx);
        b.as_object_mut().unwrap().remove(field);
        b
    };
    let r = expect_raw(cx.send_json(&without("phone")).await, 422, "missing_phone");
    assert_eq!(r["details"]["field"], "phone");
    expect_raw(cx.send_json(&without("message")).await, 422, "missing_message_text");
    expect_raw(cx.send_json(&without("message_purpose")).await, 422, "message_purpose_required");
    let r = expect_raw(cx.send_json(&without("instance_id")).await, 422, "validation_error");
    assert_eq!(r["details"]["field"], "instance_id");
    let mut blank = body(&cx);
    blank["message"] = json!("   ");
    expect_raw(cx.send_json(&blank).await, 422, "missing_message_text");
    blank = body(&cx);
    blank["phone"] = json!(null);
    expect_raw(cx.send_json(&blank).await, 422, "missing_phone");
    cx.teardown().await;
}

#[tokio::test]
async fn invalid_phone_is_422_validation_error() {
    let cx = TestContext::new("invalid_phone").await;
    for phone in ["12", "+999123456789", "call me", "+1415555012x"] {
        let mut b = body(&cx);
        b["phone"] = json!(phone);
        let r = expect_raw(cx.send_json(&b).await, 422, "validation_error");
        assert_eq!(r["details"]["field"], "phone");
    }
    cx.teardown().await;
}

#[tokio::test]
async fn purpose_outside_the_allowed_set_is_422_message_purpose_not_allowed() {
    let cx = TestContext::new("purpose_not_allowed").await;
    for purpose in ["marketing", "political", "bulk"] {
        let mut b = body(&cx);
        b["message_purpose"] = json!(purpose);
        let r = expect_raw(cx.send_json(&b).await, 422, "message_purpose_not_allowed");
        assert_eq!(r["details"]["policy"], "purpose@1.0.0");
        assert_eq!(r["details"]["rule"], "unknown_purpose");
        assert_eq!(r["details"]["field"], "message_purpose");
        assert_eq!(r["details"]["action"], "block");
        assert_eq!(r["details"]["risk_score"], 90);
    }
    cx.teardown().await;
}

#[tokio::test]
async fn media_problems_are_422_naming_media_or_mime_type() {
    let cx = TestContext::new("media_problems").await;
    let media = |mt: &str, mime: &str, m: &str| {
        json!({"instance_id": "main", "phone": OK_PHONE, "message_purpose": "support",
               "media_type": mt, "mime_type": mime, "file_name": "f.bin", "media": m})
    };
    let png = "iVBORw0KGgoAAAANSUhEUg==";
    for (b, field) in [
        (media("image", "application/pdf", png), "mime_type"),
        (media("image", "image/jpeg", png), "media"),
        (media("image", "image/png", "%%% not base64 %%%"), "media"),
        (media("image", "image/png", "http://example.com/a.png"), "media"),
        (media("image", "image/png", "https://127.0.0.1/a.png"), "media"),
        (media("image", "image/png", "https://localhost/a.png"), "media"),
        (media("image", "image/png", "https://169.254.169.254/latest/meta-data"), "media"),
        // IPv4 carried in IPv6 (compatible, translated, NAT64, 6to4), the 6to4 relay.
        (media("image", "image/png", "https://[::127.0.0.1]/a.png"), "media"),
        (media("image", "image/png", "https://[::ffff:0:127.0.0.1]/a.png"), "media"),
        (media("image", "image/png", "https://[64:ff9b::a9fe:a9fe]/a.png"), "media"),
        (media("image", "image/png", "https://[2002:7f00:1::]/a.png"), "media"),
        (media("image", "image/png", "https://192.88.99.1/a.png"), "media"),
        (media("video", "video/mp4", png), "media_type"),
        (media("image", "image/png", &format!("data:image/jpeg;base64,{png}")), "mime_type"),
    ] {
        let r = expect_raw(cx.send_json(&b).await, 422, "validation_error");
        assert_eq!(r["details"]["field"], field, "{b}");
        // A refusal says what is wrong with the URL, never where a name pointed.
        let message = r["message"].as_str().unwrap();
        assert!(!message.contains("127.0.0.1") && !message.contains("::1"), "{message}");
    }
    let mut missing = media("image", "image/png", png);
    missing.as_object_mut().unwrap().remove("file_name");
    let r = expect_raw(cx.send_json(&missing).await, 422, "validation_error");
    assert_eq!(r["details"]["field"], "file_name");
    cx.teardown().await;
}

// ---- 404 ----

#[tokio::test]
async fn unknown_or_foreign_instance_is_404() {
    let cx = TestContext::new("invalid_instance").await;
    expect_error(cx.client.message_send(&text("nope", OK_PHONE, "x")).await, 404, "invalid_instance");
    let other = create_tenant(cx.store(), &cx.config, "Other", Some("starter")).await;
    expect_error(cx.client.message_send(&text(&other.instance_id, OK_PHONE, "x")).await, 404, "invalid_instance");
    // By id works as well as by name.
    cx.client.message_send(&text(&cx.tenant.instance_id, OK_PHONE, "x")).await.expect("send by instance id");
    cx.teardown().await;
}

// ---- 403 ----

#[tokio::test]
async fn customer_without_active_plan_is_403_active_plan_required() {
    let cx = TestContext::new("no_plan").await;
    // No plan at all; an operator may still create its instance ahead of approval.
    let none = create_tenant(cx.store(), &cx.config, "No plan", None).await;
    let e = expect_error(
        cx.client_with_key(&none.api_key).message_send(&text("main", OK_PHONE, "x")).await,
        403,
        "active_plan_required",
    );
    assert_eq!(e.details["plan_status"], "none");
    // Scale waits for approval.
    let pending = ops::create_customer(cx.store(), "Pending", Some("scale"), false).await.unwrap();
    ops::create_instance(cx.store(), &cx.config, &pending.id, "main", true).await.unwrap();
    let key = ops::create_key(cx.store(), &pending.id, "k").await.unwrap();
    let client = cx.client_with_key(key["api_key"].as_str().unwrap());
    let e = expect_error(client.message_send(&text("main", OK_PHONE, "x")).await, 403, "active_plan_required");
    assert_eq!(e.details["plan_status"], "pending_approval");
    ops::assign_plan(cx.store(), &pending.id, "scale", true).await.unwrap();
    client.message_send(&text("main", OK_PHONE, "x")).await.expect("approved Scale sends");
    cx.teardown().await;
}

#[tokio::test]
async fn disabled_api_module_is_403_module_not_enabled() {
    let cx = TestContext::new("module_off").await;
    cx.store().set_modules(&cx.tenant.customer_id, Some(false), None).await.unwrap();
    let e = expect_error(cx.client.message_send(&text("main", OK_PHONE, "x")).await, 403, "module_not_enabled");
    assert_eq!(e.details["module"], "api");
    cx.teardown().await;
}

#[tokio::test]
async fn suppressed_recipient_is_403() {
    let cx = TestContext::new("suppressed").await;
    cx.store().add_suppression(&cx.tenant.customer_id, OK_PHONE, "asked to stop", "manual").await.unwrap();
    // Any written form of the number is the same recipient.
    expect_error(cx.client.message_send(&text("main", "+1 (415) 555-0123", "x")).await, 403, "recipient_suppressed");
    cx.store().remove_suppression(&cx.tenant.customer_id, OK_PHONE).await.unwrap();
    cx.client.message_send(&text("main", OK_PHONE, "x")).await.expect("unsuppressed");
    cx.teardown().await;
}

// ---- 423 ----

#[tokio::test]
async fn paused_instance_is_423() {
    let cx = TestContext::new("paused").await;
    cx.store().set_paused(&cx.tenant.instance_id, true, Some("review")).await.unwrap();
    expect_error(cx.client.message_send(&text("main", OK_PHONE, "x")).await, 423, "instance_paused_for_review");
    cx.store().set_paused(&cx.tenant.instance_id, false, None).await.unwrap();
    cx.client.message_send(&text("main", OK_PHONE, "x")).await.expect("resumed");
    cx.teardown().await;
}

#[tokio::test]
async fn checks_run_in_the_documented_order() {
    let cx = TestContext::new("check_order").await;
    let mut b = body(&cx);
    // schema before instance
    b["instance_id"] = json!("nope");
    b.as_object_mut().unwrap().remove("phone");
    expect_raw(cx.send_json(&b).await, 422, "missing_phone");
    // instance before plan
    cx.store().set_modules(&cx.tenant.customer_id, Some(false), None).await.unwrap();
    b["phone"] = json!(OK_PHONE);
    expect_raw(cx.send_json(&b).await, 404, "invalid_instance");
    // module before paused
    cx.store().set_paused(&cx.tenant.instance_id, true, None).await.unwrap();
    b["instance_id"] = json!("main");
    expect_raw(cx.send_json(&b).await, 403, "module_not_enabled");
    // paused before purpose policy
    cx.store().set_modules(&cx.tenant.customer_id, Some(true), None).await.unwrap();
    b["message_purpose"] = json!("marketing");
    expect_raw(cx.send_json(&b).await, 423, "instance_paused_for_review");
    // purpose policy before suppression
    cx.store().set_paused(&cx.tenant.instance_id, false, None).await.unwrap();
    cx.store().add_suppression(&cx.tenant.customer_id, OK_PHONE, "x", "manual").await.unwrap();
    expect_raw(cx.send_json(&b).await, 422, "message_purpose_not_allowed");
    // suppression before velocity and quota
    ops::set_limits(
        cx.store(),
        &cx.tenant.customer_id,
        &gateway_server::store::LimitOverrides { daily: Some(1), ..Default::default() },
    )
    .await
    .unwrap();
    cx.client.message_send(&text("main", "+14155550199", "uses the day's one message")).await.unwrap();
    b["message_purpose"] = json!("support");
    expect_raw(cx.send_json(&b).await, 403, "recipient_suppressed");
    cx.teardown().await;
}

// ---- 502 ----

#[tokio::test]
async fn provider_refusal_is_502_and_consumes_no_quota() {
    let cx = TestContext::new("provider_refused").await;
    let e = cx.client.message_send(&text("main", "+15005550001", "x")).await;
    assert!(retryable(e.as_ref().unwrap_err()));
    let e = expect_error(e, 502, "gateway_send_failed");
    assert_eq!(e.details["reason"], "provider_rejected");
    let events = cx.store().outbox_events(&cx.tenant.customer_id).await.unwrap();
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].0, "message.failed");
    assert_eq!(events[0].1["to"], "+15005550001");
    assert_eq!(events[0].1["error"], "provider_rejected");
    let day = chrono_day_start();
    assert_eq!(cx.store().counter(&format!("day:{}", cx.tenant.customer_id), day).await.unwrap(), 0);
    let log = cx.store().recent_log(&cx.tenant.customer_id, 1).await.unwrap();
    assert_eq!((log[0].1.decision.as_str(), log[0].1.status.as_str()), ("allowed", "failed"));
    cx.teardown().await;
}

#[tokio::test]
async fn provider_timeout_is_502_after_the_provider_timeout() {
    let cx = TestContext::new("provider_timeout").await;
    let started = std::time::Instant::now();
    let e = expect_error(cx.client.message_send(&text("main", "+15005550002", "x")).await, 502, "gateway_send_failed");
    assert_eq!(e.details["reason"], "provider_outcome_unknown");
    assert_eq!(e.details["cause"], "provider_timeout");
    assert!(started.elapsed() >= std::time::Duration::from_millis(300), "waited for the configured timeout");
    // The message may have gone out: recorded as unknown, quota kept, no message.failed.
    let log = cx.store().recent_log(&cx.tenant.customer_id, 1).await.unwrap();
    assert_eq!((log[0].1.decision.as_str(), log[0].1.status.as_str()), ("allowed", "unknown"));
    assert!(cx.store().outbox_events(&cx.tenant.customer_id).await.unwrap().is_empty());
    assert_eq!(cx.store().counter(&format!("day:{}", cx.tenant.customer_id), chrono_day_start()).await.unwrap(), 1);
    cx.teardown().await;
}

// ---- 500 ----

struct PanickingProvider;

#[async_trait::async_trait]
impl Provider for PanickingProvider {
    fn name(&self) -> &'static str {
        "panicking"
    }
    async fn send(&self, _: &SendingInstance, _: &OutboundMessage) -> Result<ProviderReceipt, ProviderError> {
        panic!("provider bug")
    }
}

#[tokio::test]
async fn a_panic_is_500_internal_error_with_the_error_body() {
    let cx = TestContext::with("panic", |_| {}, Some(parts_with_provider(Arc::new(PanickingProvider)))).await;
    let r = expect_raw(cx.send_json(&body(&cx)).await, 500, "internal_error");
    assert_eq!(r["message"], "an unexpected error occurred");
    // The server keeps serving.
    expect_raw(cx.send_json(&json!({})).await, 422, "validation_error");
    cx.teardown().await;
}

fn chrono_day_start() -> i64 {
    let now = gateway_server::store::now_ms();
    now - now.rem_euclid(86_400_000)
}

#[tokio::test]
async fn client_errors_are_typed_and_only_transient_ones_retryable() {
    let cx = TestContext::new("typed_errors").await;
    let refused = cx.client.message_send(&text("nope", OK_PHONE, "x")).await.unwrap_err();
    assert!(!retryable(&refused));
    assert_eq!(gateway_client::ErrorExt::error_code(&refused), Some("invalid_instance"));
    let failed = cx.client.message_send(&text("main", "+15005550001", "x")).await.unwrap_err();
    assert!(retryable(&failed));
    // Nothing listens here: a transport failure, retryable, with no error body.
    let gone = gateway_client::Client::with_api_key("http://127.0.0.1:9", &cx.tenant.api_key);
    let e = gone.message_send(&text("main", OK_PHONE, "x")).await.unwrap_err();
    assert!(e.is_retryable());
    assert!(gateway_client::ErrorExt::error_body(&e).is_none());
    cx.teardown().await;
}

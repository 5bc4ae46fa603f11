//! The PBX webhook end to end: authentication (every 401 cause, one body), signatures,
//! the replay window, the size limit, the rate limit, each event type and action,
//! templates, cooldown, idempotency, and the send pipeline's checks on the result.

use crate::expect_raw;
use gateway_client::types::{PbxEventType, PbxWebhookRequest};
use gateway_client::{Error, ErrorExt};
use gateway_sdk_tests::{TestContext, parts_with_provider};
use gateway_server::Parts;
use gateway_server::ops;
use gateway_server::policy::{Context, Decision, PolicyEngine, Stage, StageOutcome};
use gateway_server::provider::{OutboundMessage, Provider, ProviderError, ProviderReceipt, SendingInstance, Simulator};
use gateway_server::store::{PbxSettingsUpdate, Store, now_ms};
use hmac::{Hmac, Mac};
use serde_json::{Value, json};
use sha2::Sha256;
use std::sync::{Arc, Mutex};

/// An integration of the test tenant.
struct Pbx {
    id: i64,
    secret: String,
    hmac: Option<String>,
}

async fn integration(cx: &TestContext, hmac: bool) -> Pbx {
    cx.store().set_modules(&cx.tenant.customer_id, None, Some(true)).await.unwrap();
    let created = ops::create_pbx(cx.store(), &cx.tenant.customer_id, "main", hmac, Some("Acme Dental")).await.unwrap();
    Pbx {
        id: created["integration_id"].as_i64().unwrap(),
        secret: created["webhook_secret"].as_str().unwrap().to_string(),
        hmac: created["hmac_secret"].as_str().map(str::to_string),
    }
}

/// HMAC-SHA256 of timestamp + "." + body, computed here independently of the server.
fn sign(key: &str, timestamp: &str, body: &[u8]) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(key.as_bytes()).unwrap();
    mac.update(format!("{timestamp}.").as_bytes());
    mac.update(body);
    hex::encode(mac.finalize().into_bytes())
}

fn now_s() -> i64 {
    now_ms() / 1000
}

/// POSTs raw bytes to the webhook of `id` with these headers.
async fn post(cx: &TestContext, id: &str, body: impl Into<reqwest::Body>, headers: &[(&str, String)]) -> (u16, Value) {
    let (status, _, body) = post_with_headers(cx, id, body, headers).await;
    (status, body)
}

/// `post`, with the answer's headers.
async fn post_with_headers(
    cx: &TestContext,
    id: &str,
    body: impl Into<reqwest::Body>,
    headers: &[(&str, String)],
) -> (u16, reqwest::header::HeaderMap, Value) {
    let mut request = cx.http.post(format!("{}/integrations/pbx/webhook/{id}", cx.base_url)).body(body);
    for (name, value) in headers {
        request = request.header(*name, value);
    }
    let response = request.send().await.expect("request reaches the gateway");
    let status = response.status().as_u16();
    let answer_headers = response.headers().clone();
    let text = response.text().await.unwrap();
    (status, answer_headers, serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}")))
}

/// `event` (no HMAC), with the answer's headers.
async fn event_with_headers(cx: &TestContext, pbx: &Pbx, body: &Value) -> (u16, reqwest::header::HeaderMap, Value) {
    let headers = vec![("x-gateway-3cx-secret", pbx.secret.clone())];
    post_with_headers(cx, &pbx.id.to_string(), body.to_string().into_bytes(), &headers).await
}

/// Posts `body` with the secret and, for an HMAC integration, a fresh signature.
async fn event(cx: &TestContext, pbx: &Pbx, body: &Value) -> (u16, Value) {
    let bytes = body.to_string().into_bytes();
    let mut headers = vec![("x-gateway-3cx-secret", pbx.secret.clone())];
    if let Some(key) = &pbx.hmac {
        let ts = now_s().to_string();
        headers.push(("x-gateway-signature", format!("sha256={}", sign(key, &ts, &bytes))));
        headers.push(("x-gateway-timestamp", ts));
    }
    post(cx, &pbx.id.to_string(), bytes, &headers).await
}

fn ok(response: (u16, Value), action: &str) -> Value {
    let (status, body) = response;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["success"], true, "{body}");
    assert_eq!(body["status"], "processed", "{body}");
    assert_eq!(body["action"], action, "{body}");
    body
}

/// Records what the provider was asked to deliver (and delivers it with the simulator).
#[derive(Default)]
struct Recording {
    sent: Mutex<Vec<OutboundMessage>>,
}

#[async_trait::async_trait]
impl Provider for Recording {
    fn name(&self) -> &'static str {
        "recording"
    }
    async fn send(
        &self,
        instance: &SendingInstance,
        message: &OutboundMessage,
    ) -> Result<ProviderReceipt, ProviderError> {
        self.sent.lock().unwrap().push(message.clone());
        Simulator.send(instance, message).await
    }
}

impl Recording {
    fn texts(&self) -> Vec<(String, String)> {
        self.sent.lock().unwrap().iter().map(|m| (m.to.clone(), m.text.clone().unwrap_or_default())).collect()
    }
}

async fn recording_context(name: &str) -> (TestContext, Arc<Recording>) {
    let provider = Arc::new(Recording::default());
    let cx = TestContext::with(name, |_| {}, Some(parts_with_provider(provider.clone()))).await;
    (cx, provider)
}

// ---- test events, both ways in ----

#[tokio::test]
async fn a_test_event_is_received_through_raw_http_and_the_generated_client() {
    let cx = TestContext::new("pbx_test_event").await;
    let pbx = integration(&cx, false).await;
    let (status, body) = event(&cx, &pbx, &json!({"event_type": "test"})).await;
    assert_eq!(status, 200);
    assert_eq!(body, json!({"success": true, "status": "processed", "event_type": "test", "action": "received"}));

    let request = PbxWebhookRequest {
        event_type: PbxEventType::Test,
        agent_extension: None,
        call_time: None,
        conversation_id: None,
        customer_phone: None,
        external_message_id: None,
        message_purpose: None,
        message_text: None,
        queue: None,
        to: None,
    };
    let client = gateway_client::Client::new(&cx.base_url, gateway_client::Auth::none());
    let answer = client.pbx_webhook(pbx.id as u64, Some(&pbx.secret), None, None, &request).await.unwrap();
    assert_eq!(
        (answer.action.as_str(), answer.event_type.as_str(), answer.message_id.clone()),
        ("received", "test", None)
    );

    // A signed integration through the client: the client sends serde_json's bytes.
    let signed = integration(&cx, true).await;
    let bytes = serde_json::to_vec(&request).unwrap();
    let ts = now_s().to_string();
    let sig = sign(signed.hmac.as_deref().unwrap(), &ts, &bytes);
    let answer =
        client.pbx_webhook(signed.id as u64, Some(&signed.secret), Some(&sig), Some(&ts), &request).await.unwrap();
    assert_eq!(answer.action, "received");
    let e = client.pbx_webhook(signed.id as u64, Some(&signed.secret), None, None, &request).await.unwrap_err();
    assert_eq!((e.status().map(|s| s.as_u16()), e.error_code()), (Some(401), Some("invalid_pbx_webhook")));
    assert!(matches!(e, Error::ErrorResponse(_)));

    let logged = cx.store().recent_pbx_events(pbx.id, 10).await.unwrap();
    assert_eq!(logged.len(), 2);
    assert!(logged.iter().all(|e| e.event_type == "test" && e.action == "received" && e.status_code == 200));
    cx.teardown().await;
}

// ---- authentication ----

#[tokio::test]
async fn every_authentication_failure_is_the_same_401() {
    let cx = TestContext::new("pbx_401").await;
    let pbx = integration(&cx, true).await;
    let key = pbx.hmac.clone().unwrap();
    let body = br#"{"event_type":"test"}"#.to_vec();
    let ts = now_s().to_string();
    let good_sig = format!("sha256={}", sign(&key, &ts, &body));
    let secret = ("x-gateway-3cx-secret", pbx.secret.clone());
    let id = pbx.id.to_string();
    // Well outside the window either way, so that a second ticking during the test
    // cannot bring them back in (the exact ±300/±301 edges are unit-tested with a fixed
    // clock in pbx::auth).
    let stale_ts = (now_s() - 310).to_string();
    let stale_sig = format!("sha256={}", sign(&key, &stale_ts, &body));
    let future_ts = (now_s() + 310).to_string();
    let future_sig = sign(&key, &future_ts, &body);
    type Case<'a> = (&'a str, String, Vec<(&'a str, String)>);
    let cases: Vec<Case> = vec![
        ("unknown id", "999999".into(), vec![secret.clone()]),
        ("malformed id", "abc".into(), vec![secret.clone()]),
        ("negative id", "-1".into(), vec![secret.clone()]),
        (
            "missing secret",
            id.clone(),
            vec![("x-gateway-timestamp", ts.clone()), ("x-gateway-signature", good_sig.clone())],
        ),
        (
            "wrong secret",
            id.clone(),
            vec![
                ("x-gateway-3cx-secret", "pbx_wrong".into()),
                ("x-gateway-timestamp", ts.clone()),
                ("x-gateway-signature", good_sig.clone()),
            ],
        ),
        ("missing timestamp", id.clone(), vec![secret.clone(), ("x-gateway-signature", good_sig.clone())]),
        ("missing signature", id.clone(), vec![secret.clone(), ("x-gateway-timestamp", ts.clone())]),
        (
            "bad signature",
            id.clone(),
            vec![secret.clone(), ("x-gateway-timestamp", ts.clone()), ("x-gateway-signature", "sha256=00ff".into())],
        ),
        (
            "signature of another key",
            id.clone(),
            vec![
                secret.clone(),
                ("x-gateway-timestamp", ts.clone()),
                ("x-gateway-signature", sign("pbxsig_other", &ts, &body)),
            ],
        ),
        (
            "stale timestamp",
            id.clone(),
            vec![secret.clone(), ("x-gateway-timestamp", stale_ts), ("x-gateway-signature", stale_sig)],
        ),
        (
            "future timestamp",
            id.clone(),
            vec![secret.clone(), ("x-gateway-timestamp", future_ts), ("x-gateway-signature", future_sig)],
        ),
    ];
    let mut bodies = Vec::new();
    for (what, id, headers) in cases {
        let (status, answer) = post(&cx, &id, body.clone(), &headers).await;
        assert_eq!(status, 401, "{what}: {answer}");
        bodies.push((what, answer));
    }
    // A replay of a request that was accepted.
    let accepted = vec![secret.clone(), ("x-gateway-timestamp", ts.clone()), ("x-gateway-signature", good_sig.clone())];
    assert_eq!(post(&cx, &id, body.clone(), &accepted).await.0, 200);
    let (status, answer) = post(&cx, &id, body.clone(), &accepted).await;
    assert_eq!(status, 401, "replay: {answer}");
    bodies.push(("replay", answer));
    // An address outside the allowlist.
    let plain = integration(&cx, false).await;
    let update = PbxSettingsUpdate { ip_allowlist: Some(Some("192.0.2.0/24".into())), ..Default::default() };
    ops::update_pbx(cx.store(), plain.id, &update).await.unwrap();
    let (status, answer) = event(&cx, &plain, &json!({"event_type": "test"})).await;
    assert_eq!(status, 401, "allowlist: {answer}");
    bodies.push(("allowlist", answer));

    let first = expect_raw((401, bodies[0].1.clone()), 401, "invalid_pbx_webhook");
    for (what, answer) in &bodies {
        assert_eq!(answer, &first, "{what} must be indistinguishable");
    }
    // The log says which; the caller never did. (Log lines are written asynchronously.)
    let log_file = cx.config.log_file.clone().unwrap();
    let causes = [
        "unknown_integration",
        "malformed_integration_id",
        "missing_secret",
        "wrong_secret",
        "missing_timestamp",
        "missing_signature",
        "bad_signature",
        "timestamp_outside_window",
        "replayed_signature",
        "address_not_allowed",
    ];
    let mut log = String::new();
    for _ in 0..50 {
        log = std::fs::read_to_string(&log_file).unwrap();
        if causes.iter().all(|c| log.contains(&format!("\"cause\":\"{c}\""))) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    for cause in causes {
        assert!(log.contains(&format!("\"cause\":\"{cause}\"")), "{cause} is logged");
    }
    assert!(!log.contains(&pbx.secret) && !log.contains(&key), "secrets are never logged");
    // Unauthenticated requests leave no event rows.
    assert_eq!(cx.store().recent_pbx_events(pbx.id, 10).await.unwrap().len(), 1);
    // Allowed from loopback once the list says so.
    let update = PbxSettingsUpdate { ip_allowlist: Some(Some("127.0.0.0/8, ::1".into())), ..Default::default() };
    ops::update_pbx(cx.store(), plain.id, &update).await.unwrap();
    ok(event(&cx, &plain, &json!({"event_type": "test"})).await, "received");
    cx.teardown().await;
}

#[tokio::test]
async fn both_signature_forms_and_the_window_edges() {
    let cx = TestContext::new("pbx_signature").await;
    let pbx = integration(&cx, true).await;
    let key = pbx.hmac.clone().unwrap();
    let id = pbx.id.to_string();
    let mut n = 0;
    let mut signed = |offset: i64, prefixed: bool| {
        n += 1;
        // A different body each time, so no two requests share a signature.
        let body = json!({"event_type": "test", "conversation_id": format!("c{n}")}).to_string();
        let ts = (now_s() + offset).to_string();
        let sig = sign(&key, &ts, body.as_bytes());
        let sig = if prefixed { format!("sha256={sig}") } else { sig };
        let headers = vec![
            ("x-gateway-3cx-secret", pbx.secret.clone()),
            ("x-gateway-timestamp", ts),
            ("x-gateway-signature", sig),
        ];
        (body, headers)
    };
    for (offset, prefixed, expected) in
        [(0, true, 200), (0, false, 200), (300, true, 200), (-300, false, 200), (301, true, 401), (-301, false, 401)]
    {
        // A second may tick between signing and checking, moving the offset one second
        // down: +300 is sent as +299 (still inside if it ticks), +301 as +302 (still
        // outside if it ticks); -300 and -301 only move further out, so -300 is sent as
        // -299. The exact edges are unit-tested with a fixed clock in pbx::auth.
        let offset = match offset {
            300 => 299,
            301 => 302,
            -300 => -299,
            o => o,
        };
        let (body, headers) = signed(offset, prefixed);
        let (status, answer) = post(&cx, &id, body, &headers).await;
        assert_eq!(status, expected, "offset {offset}, prefixed {prefixed}: {answer}");
    }
    // The signature covers the body: the same headers on other bytes fail.
    let (_, headers) = signed(0, true);
    assert_eq!(post(&cx, &id, r#"{"event_type":"test","queue":"x"}"#, &headers).await.0, 401);
    cx.teardown().await;
}

// ---- size ----

#[tokio::test]
async fn a_body_of_256_kib_is_read_and_one_byte_more_is_413() {
    let cx = TestContext::new("pbx_size").await;
    let pbx = integration(&cx, true).await;
    let key = pbx.hmac.clone().unwrap();
    let id = pbx.id.to_string();
    let sized = |len: usize| {
        let head = r#"{"event_type":"test","padding":""#;
        let tail = r#""}"#;
        format!("{head}{}{tail}", "x".repeat(len - head.len() - tail.len()))
    };
    let headers_for = |body: &str| {
        let ts = now_s().to_string();
        vec![
            ("x-gateway-3cx-secret", pbx.secret.clone()),
            ("x-gateway-signature", sign(&key, &ts, body.as_bytes())),
            ("x-gateway-timestamp", ts),
        ]
    };
    let exact = sized(256 * 1024);
    assert_eq!(exact.len(), 262_144);
    ok(post(&cx, &id, exact.clone(), &headers_for(&exact)).await, "received");
    let over = sized(256 * 1024 + 1);
    let r = expect_raw(post(&cx, &id, over.clone(), &headers_for(&over)).await, 413, "payload_too_large");
    assert_eq!(r["details"]["limit_bytes"], 262_144);
    // Size comes before authentication, and holds without a Content-Length too.
    expect_raw(post(&cx, "999999", over.clone(), &[]).await, 413, "payload_too_large");
    let chunks: Vec<Result<Vec<u8>, std::io::Error>> = over.as_bytes().chunks(10_000).map(|c| Ok(c.to_vec())).collect();
    let streamed = reqwest::Body::wrap_stream(futures::stream::iter(chunks));
    expect_raw(post(&cx, &id, streamed, &headers_for(&over)).await, 413, "payload_too_large");
    cx.teardown().await;
}

// ---- payload, module, order ----

#[tokio::test]
async fn payload_errors_are_400_naming_the_field_and_come_before_the_module() {
    let cx = TestContext::new("pbx_payload").await;
    let pbx = integration(&cx, false).await;
    let secret = vec![("x-gateway-3cx-secret", pbx.secret.clone())];
    let id = pbx.id.to_string();
    expect_raw(post(&cx, &id, "{not json", &secret).await, 400, "invalid_json");
    expect_raw(post(&cx, &id, "", &secret).await, 400, "invalid_json");
    for (body, field) in [
        (json!({}), "event_type"),
        (json!({"event_type": "fax"}), "event_type"),
        (json!({"event_type": 5}), "event_type"),
        (json!({"event_type": "outbound_message", "message_text": "hi"}), "to"),
        (json!({"event_type": "outbound_message", "to": "12", "message_text": "hi"}), "to"),
        (json!({"event_type": "outbound_message", "to": "+14155550123"}), "message_text"),
        (
            json!({"event_type": "outbound_message", "to": "+14155550123", "message_text": "hi",
                   "message_purpose": "marketing"}),
            "message_purpose",
        ),
        (json!({"event_type": "test", "queue": "q".repeat(129)}), "queue"),
        // As the contract states it: an event type exactly, a purpose of the five on any
        // event, a caller's number that is a number when one is given.
        (json!({"event_type": " test "}), "event_type"),
        (json!({"event_type": "test", "message_purpose": "marketing"}), "message_purpose"),
        (
            json!({"event_type": "outbound_message", "to": "+14155550123", "message_text": "hi", "message_purpose": ""}),
            "message_purpose",
        ),
        (json!({"event_type": "call_ended", "customer_phone": "call me"}), "customer_phone"),
    ] {
        let r = expect_raw(event(&cx, &pbx, &body).await, 400, "validation_error");
        assert_eq!(r["details"]["field"], field, "{body}: {r}");
    }
    // A field a phone system adds is ignored.
    ok(event(&cx, &pbx, &json!({"event_type": "test", "pbx_version": "20.0"})).await, "received");
    // Module off: 403, but a bad payload is still 400 (payload before module).
    cx.store().set_modules(&cx.tenant.customer_id, None, Some(false)).await.unwrap();
    let r = expect_raw(event(&cx, &pbx, &json!({"event_type": "test"})).await, 403, "module_not_enabled");
    assert_eq!(r["details"]["module"], "pbx");
    expect_raw(event(&cx, &pbx, &json!({"event_type": "fax"})).await, 400, "validation_error");
    // Refusals are logged with their status.
    let logged = cx.store().recent_pbx_events(pbx.id, 1).await.unwrap();
    assert_eq!((logged[0].status_code, logged[0].error_code.as_deref()), (400, Some("validation_error")));
    cx.teardown().await;
}

// ---- rate limit ----

#[tokio::test]
async fn the_rate_limit_allows_the_burst_then_429_with_retry_after() {
    let cx = TestContext::new("pbx_rate").await;
    let pbx = integration(&cx, false).await;
    let update = PbxSettingsUpdate { rate_per_minute: Some(Some(60)), burst: Some(Some(3)), ..Default::default() };
    ops::update_pbx(cx.store(), pbx.id, &update).await.unwrap();
    for _ in 0..3 {
        ok(event(&cx, &pbx, &json!({"event_type": "test"})).await, "received");
    }
    let limited = cx
        .http
        .post(format!("{}/integrations/pbx/webhook/{}", cx.base_url, pbx.id))
        .header("x-gateway-3cx-secret", &pbx.secret)
        .body(json!({"event_type": "test"}).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(limited.headers().get("retry-after").and_then(|v| v.to_str().ok()), Some("1"));
    let r = expect_raw((limited.status().as_u16(), limited.json().await.unwrap()), 429, "webhook_rate_limited");
    assert_eq!(r["details"]["retry_after_seconds"], 1, "one token a second at 60 a minute: {r}");
    // Bad payloads and bad credentials do not spend tokens, and come first.
    expect_raw(event(&cx, &pbx, &json!({"event_type": "fax"})).await, 400, "validation_error");
    let logged = cx.store().recent_pbx_events(pbx.id, 10).await.unwrap();
    assert_eq!(logged.iter().filter(|e| e.action == "rate_limited" && e.status_code == 429).count(), 1);
    // A token comes back after the interval.
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    ok(event(&cx, &pbx, &json!({"event_type": "test"})).await, "received");
    cx.teardown().await;
}

#[tokio::test]
async fn a_limit_raised_out_of_the_way_refuses_nothing_under_concurrency() {
    // At a rate so high that the interval is 0 ms, the limiter has no tolerance at
    // all: only a clock that never goes back between its writes lets every request
    // through (requests stamped before a later one was written must not be refused).
    let cx = TestContext::new("pbx_rate_unlimited").await;
    let pbx = integration(&cx, false).await;
    let update = PbxSettingsUpdate {
        rate_per_minute: Some(Some(60_000)),
        burst: Some(Some(1_000_000_000)),
        ..Default::default()
    };
    ops::update_pbx(cx.store(), pbx.id, &update).await.unwrap();
    let test = json!({"event_type": "test"});
    let answers = futures::future::join_all((0..200).map(|_| event(&cx, &pbx, &test))).await;
    assert!(answers.iter().all(|(status, _)| *status == 200), "{:?}", answers.iter().find(|a| a.0 != 200));
    cx.teardown().await;
}

#[tokio::test]
async fn two_gateways_on_one_store_share_the_rate_limit() {
    let cx = TestContext::new("pbx_rate_replicas").await;
    let pbx = integration(&cx, true).await;
    let update = PbxSettingsUpdate { rate_per_minute: Some(Some(1)), burst: Some(Some(6)), ..Default::default() };
    ops::update_pbx(cx.store(), pbx.id, &update).await.unwrap();
    let mut config = cx.config.clone();
    config.listen = "127.0.0.1:0".parse().unwrap();
    let second = gateway_server::start_server(slog::Logger::root(slog::Discard, slog::o!()), &config).await.unwrap();
    let second_url = format!("http://{}", second.local_addr());
    let key = pbx.hmac.clone().unwrap();
    let posts = (0..20).map(|i| {
        let base = if i % 2 == 0 { cx.base_url.clone() } else { second_url.clone() };
        let body = json!({"event_type": "test", "conversation_id": format!("c{i}")}).to_string();
        let ts = now_s().to_string();
        let sig = sign(&key, &ts, body.as_bytes());
        let request = cx
            .http
            .post(format!("{base}/integrations/pbx/webhook/{}", pbx.id))
            .header("x-gateway-3cx-secret", &pbx.secret)
            .header("x-gateway-timestamp", ts)
            .header("x-gateway-signature", sig)
            .body(body);
        async move { request.send().await.unwrap().status().as_u16() }
    });
    let statuses = futures::future::join_all(posts).await;
    assert_eq!(statuses.iter().filter(|s| **s == 200).count(), 6, "{statuses:?}");
    assert_eq!(statuses.iter().filter(|s| **s == 429).count(), 14, "{statuses:?}");
    second.close().await.unwrap();
    cx.teardown().await;
}

// ---- actions ----

#[tokio::test]
async fn outbound_message_sends_through_the_pipeline_with_support_by_default() {
    let (cx, provider) = recording_context("pbx_outbound").await;
    let pbx = integration(&cx, true).await;
    let body = json!({"event_type": "outbound_message", "to": "+1 415 555 0100", "message_text": "Your ticket #42 is resolved"});
    let r = ok(event(&cx, &pbx, &body).await, "message_sent");
    assert_eq!(r["event_type"], "outbound_message");
    let message_id = r["message_id"].as_str().unwrap();
    assert_eq!(provider.texts(), vec![("+14155550100".to_string(), "Your ticket #42 is resolved".to_string())]);
    let log = cx.store().recent_log(&cx.tenant.customer_id, 1).await.unwrap();
    assert_eq!(log[0].1.source, "pbx");
    assert_eq!(log[0].1.purpose.as_deref(), Some("support"));
    assert_eq!(log[0].1.provider_message_id.as_deref(), Some(message_id));
    let body = json!({"event_type": "outbound_message", "to": "+14155550101", "message_text": "Code 123456",
                      "message_purpose": "authentication"});
    ok(event(&cx, &pbx, &body).await, "message_sent");
    let log = cx.store().recent_log(&cx.tenant.customer_id, 1).await.unwrap();
    assert_eq!(log[0].1.purpose.as_deref(), Some("authentication"));
    let events = cx.store().outbox_events(&cx.tenant.customer_id).await.unwrap();
    assert_eq!(events.iter().filter(|(t, _)| t == "message.sent").count(), 2);
    cx.teardown().await;
}

#[tokio::test]
async fn call_events_send_the_rendered_template_or_are_ignored() {
    let (cx, provider) = recording_context("pbx_templates").await;
    let pbx = integration(&cx, false).await;
    let call = |event_type: &str, phone: &str| {
        json!({"event_type": event_type, "customer_phone": phone, "agent_extension": "204", "queue": "Billing",
               "call_time": "2026-11-21 09:15"})
    };
    // No template yet: every call event is ignored, even without a phone.
    for event_type in [
        "missed_call",
        "voicemail",
        "after_hours",
        "queue_callback",
        "call_started",
        "call_ended",
        "queue_event",
        "inbound_reply",
    ] {
        ok(event(&cx, &pbx, &json!({"event_type": event_type})).await, "ignored");
    }
    assert!(provider.texts().is_empty());
    let text = "{{business_name}}: sorry we missed your call at {{call_time}} ({{queue}}, ext {{agent_extension}}). \
                We will call {{customer_phone}} back.";
    for event_type in ["missed_call", "voicemail", "after_hours", "queue_callback", "call_ended"] {
        ops::set_pbx_template(cx.store(), pbx.id, event_type, text, "support").await.unwrap();
    }
    let mut phone = 200;
    for event_type in ["missed_call", "voicemail", "after_hours", "queue_callback", "call_ended"] {
        phone += 1;
        let r = ok(event(&cx, &pbx, &call(event_type, &format!("+1415555{phone:04}"))).await, "message_sent");
        assert!(r["message_id"].is_string());
    }
    let texts = provider.texts();
    assert_eq!(texts.len(), 5);
    assert_eq!(texts[0].0, "+14155550201");
    assert_eq!(
        texts[0].1,
        "Acme Dental: sorry we missed your call at 2026-11-21 09:15 (Billing, ext 204). We will call +14155550201 back."
    );
    // call_started still has no template.
    ok(event(&cx, &pbx, &call("call_started", "+14155550299")).await, "ignored");
    // With a template, the phone is required and checked.
    let r = expect_raw(event(&cx, &pbx, &json!({"event_type": "missed_call"})).await, 400, "validation_error");
    assert_eq!(r["details"]["field"], "customer_phone");
    let r = expect_raw(event(&cx, &pbx, &call("missed_call", "101")).await, 400, "validation_error");
    assert_eq!(r["details"]["field"], "customer_phone");
    // Unknown placeholders and event types without templates are refused when saved.
    assert!(ops::set_pbx_template(cx.store(), pbx.id, "missed_call", "Hi {{name}}", "support").await.is_err());
    assert!(ops::set_pbx_template(cx.store(), pbx.id, "test", "Hi", "support").await.is_err());
    assert!(ops::set_pbx_template(cx.store(), pbx.id, "missed_call", "Hi", "marketing").await.is_err());
    cx.teardown().await;
}

#[tokio::test]
async fn the_cooldown_stops_repeat_messages_per_event_type_and_phone() {
    let (cx, provider) = recording_context("pbx_cooldown").await;
    let pbx = integration(&cx, false).await;
    ops::set_pbx_template(cx.store(), pbx.id, "missed_call", "We missed your call", "support").await.unwrap();
    ops::set_pbx_template(cx.store(), pbx.id, "voicemail", "We got your voicemail", "support").await.unwrap();
    let call = |t: &str, p: &str| json!({"event_type": t, "customer_phone": p});
    ok(event(&cx, &pbx, &call("missed_call", "+14155550301")).await, "message_sent");
    let again = ok(event(&cx, &pbx, &call("missed_call", "+1 415 555 0301")).await, "cooldown");
    assert!(again.get("message_id").is_none());
    ok(event(&cx, &pbx, &call("missed_call", "+14155550302")).await, "message_sent");
    ok(event(&cx, &pbx, &call("voicemail", "+14155550301")).await, "message_sent");
    assert_eq!(provider.texts().len(), 3);
    // A send that fails gives the cooldown back: the next call tries again.
    cx.store().add_suppression(&cx.tenant.customer_id, "+14155550303", "test", "manual").await.unwrap();
    expect_raw(event(&cx, &pbx, &call("missed_call", "+14155550303")).await, 403, "recipient_suppressed");
    cx.store().remove_suppression(&cx.tenant.customer_id, "+14155550303").await.unwrap();
    ok(event(&cx, &pbx, &call("missed_call", "+14155550303")).await, "message_sent");
    // A cooldown of zero turns it off.
    let update = PbxSettingsUpdate { cooldown_seconds: Some(Some(0)), ..Default::default() };
    ops::update_pbx(cx.store(), pbx.id, &update).await.unwrap();
    ok(event(&cx, &pbx, &call("missed_call", "+14155550301")).await, "message_sent");
    cx.teardown().await;
}

#[tokio::test]
async fn a_repeated_external_message_id_gets_the_first_answer_and_sends_nothing() {
    let (cx, provider) = recording_context("pbx_idempotent").await;
    // Without HMAC: a signed repeat inside the same second would carry the same
    // signature and be refused as a replay (401) before idempotency is looked at.
    let pbx = integration(&cx, false).await;
    let update = PbxSettingsUpdate { burst: Some(Some(100)), ..Default::default() };
    ops::update_pbx(cx.store(), pbx.id, &update).await.unwrap();
    let body = json!({"event_type": "outbound_message", "to": "+14155550400", "message_text": "On our way",
                      "external_message_id": "3cx-msg-1"});
    let first = ok(event(&cx, &pbx, &body).await, "message_sent");
    let second = ok(event(&cx, &pbx, &body).await, "message_sent");
    assert_eq!(first, second);
    assert_eq!(provider.texts().len(), 1);
    // Twenty at once with a new id: one message; every other answer is the first's, or
    // (while the first runs) 409 `idempotency_request_in_progress` at once, never a wait.
    let body = json!({"event_type": "outbound_message", "to": "+14155550401", "message_text": "Hello",
                      "external_message_id": "3cx-msg-2"});
    let answers = futures::future::join_all((0..20).map(|_| event(&cx, &pbx, &body))).await;
    let sent: Vec<_> = answers.iter().filter(|a| a.0 == 200).collect();
    assert!(!sent.is_empty() && sent.iter().all(|a| *a == sent[0]), "{answers:?}");
    assert_eq!(sent[0].1["action"], "message_sent");
    for (status, answer) in answers.iter().filter(|a| a.0 != 200) {
        assert_eq!((*status, answer["error"].as_str()), (409, Some("idempotency_request_in_progress")), "{answer}");
    }
    assert_eq!(&ok(event(&cx, &pbx, &body).await, "message_sent"), &sent[0].1, "a later repeat: the first answer");
    assert_eq!(provider.texts().len(), 2);
    // A refused first answer is repeated too (and still sends nothing).
    cx.store().add_suppression(&cx.tenant.customer_id, "+14155550402", "test", "manual").await.unwrap();
    let body = json!({"event_type": "outbound_message", "to": "+14155550402", "message_text": "x",
                      "external_message_id": "3cx-msg-3"});
    let refused = expect_raw(event(&cx, &pbx, &body).await, 403, "recipient_suppressed");
    cx.store().remove_suppression(&cx.tenant.customer_id, "+14155550402").await.unwrap();
    assert_eq!(expect_raw(event(&cx, &pbx, &body).await, 403, "recipient_suppressed"), refused);
    assert_eq!(provider.texts().len(), 2);
    cx.teardown().await;
}

#[tokio::test]
async fn an_external_message_id_orphaned_by_a_dead_process_gets_a_definite_answer_at_once() {
    use gateway_server::store::{Began, Begin, IdemOwner, LogEntry, PbxEvent};
    let (cx, provider) = recording_context("pbx_orphan").await;
    let pbx = integration(&cx, false).await;
    let past = now_ms() - 60_000;
    // The process that claims below holds a lease and dies (its lease is gone) before
    // the repeats: however recent its claims, they are orphans at once.
    let dead = Store::connect(&cx.config.database_url, 2, None).await.unwrap();
    dead.take_lease().await.unwrap();
    let orphan = |external: &str| PbxEvent {
        integration_id: pbx.id,
        customer_id: cx.tenant.customer_id.clone(),
        event_type: "outbound_message".into(),
        action: "pending".into(),
        phone: Some("+14155550410".into()),
        external_message_id: Some(external.into()),
        created_at: past,
        ..PbxEvent::default()
    };
    // Alive: a repeat is told at once that the first request is in progress.
    assert!(cx.store().claim_pbx_external_id(&orphan("3cx-live")).await.unwrap().is_ok());
    let body = json!({"event_type": "outbound_message", "to": "+14155550409", "message_text": "On our way",
                      "external_message_id": "3cx-live"});
    let started = std::time::Instant::now();
    let (status, headers, answer) = event_with_headers(&cx, &pbx, &body).await;
    assert_eq!((status, answer["error"].as_str()), (409, Some("idempotency_request_in_progress")), "{answer}");
    assert_eq!(headers.get("retry-after").and_then(|v| v.to_str().ok()), Some("1"));
    assert!(started.elapsed() < std::time::Duration::from_secs(2), "no wait for a live request");

    // Killed before its send: nothing went out, so the repeat runs the event itself.
    assert!(dead.claim_pbx_external_id(&orphan("3cx-dead-1")).await.unwrap().is_ok());
    dead.release_lease().await.unwrap();
    let body = json!({"event_type": "outbound_message", "to": "+14155550410", "message_text": "On our way",
                      "external_message_id": "3cx-dead-1"});
    let started = std::time::Instant::now();
    ok(event(&cx, &pbx, &body).await, "message_sent");
    assert!(started.elapsed() < std::time::Duration::from_secs(3), "no wait for a dead request");
    assert_eq!(provider.texts().len(), 1);
    ok(event(&cx, &pbx, &body).await, "message_sent");
    assert_eq!(provider.texts().len(), 1, "the repeat of the new answer sends nothing");

    // Killed at the provider: its attempt row is pending, so the outcome is unknown.
    dead.take_lease().await.unwrap();
    assert!(dead.claim_pbx_external_id(&orphan("3cx-dead-2")).await.unwrap().is_ok());
    let key = IdemOwner {
        customer_id: cx.tenant.customer_id.clone(),
        key: format!("pbx:{}:3cx-dead-2", pbx.id),
        owner: "req_dead".into(),
        request_hash: "pbx".into(),
    };
    dead.claim_idempotency(&key, past).await.unwrap();
    let entry = LogEntry {
        customer_id: cx.tenant.customer_id.clone(),
        instance_id: Some(cx.tenant.instance_id.clone()),
        source: "pbx".into(),
        recipient: Some("+14155550411".into()),
        decision: "allowed".into(),
        status: "pending".into(),
        created_at: past,
        ..LogEntry::default()
    };
    let begin =
        Begin { reservations: Vec::new(), entry, deadline_at: past + 1_000, idem: Some(key), owner_lease: None };
    assert!(matches!(dead.begin_attempt(begin).await.unwrap(), Began::Written { .. }));
    dead.release_lease().await.unwrap();
    let body = json!({"event_type": "outbound_message", "to": "+14155550411", "message_text": "On our way",
                      "external_message_id": "3cx-dead-2"});
    let started = std::time::Instant::now();
    let unknown = expect_raw(event(&cx, &pbx, &body).await, 502, "gateway_send_failed");
    assert_eq!(unknown["details"]["reason"], "provider_outcome_unknown");
    assert!(started.elapsed() < std::time::Duration::from_secs(3));
    assert_eq!(expect_raw(event(&cx, &pbx, &body).await, 502, "gateway_send_failed"), unknown);
    assert_eq!(provider.texts().len(), 1, "never sent again");
    let log = cx.store().recent_log(&cx.tenant.customer_id, 10).await.unwrap();
    assert!(log.iter().any(|(_, e)| e.source == "pbx" && e.status == "unknown"));
    cx.teardown().await;
}

/// Denies, at the content stage, any text with "SALE" in it.
struct NoSales;

#[async_trait::async_trait]
impl PolicyEngine for NoSales {
    async fn evaluate(&self, ctx: &Context) -> StageOutcome {
        let decision = match ctx.stage {
            Stage::Content if ctx.text.as_deref().is_some_and(|t| t.contains("SALE")) => Decision::Deny {
                policy: "test/no-sales@1.0.0".into(),
                code: "promotional".into(),
                reason: "promotional wording".into(),
                risk_score: 90,
                fault: false,
            },
            _ => Decision::Allow,
        };
        StageOutcome { decision, trace: Vec::new() }
    }
}

#[tokio::test]
async fn policy_suppression_quota_pause_and_provider_apply_to_the_resulting_send() {
    let provider = Arc::new(Recording::default());
    let parts = Parts { provider: provider.clone(), policy: Some(Arc::new(NoSales)) };
    let cx = TestContext::with("pbx_pipeline", |_| {}, Some(parts)).await;
    let pbx = integration(&cx, false).await;
    let send = |to: &str, text: &str| json!({"event_type": "outbound_message", "to": to, "message_text": text});
    let r = expect_raw(event(&cx, &pbx, &send("+14155550500", "Big SALE today")).await, 403, "policy_violation");
    assert_eq!(r["details"]["policy"], "test/no-sales@1.0.0");
    assert_eq!(r["details"]["risk_score"], 90);
    ops::set_pbx_template(cx.store(), pbx.id, "missed_call", "SALE: call us", "support").await.unwrap();
    let call = json!({"event_type": "missed_call", "customer_phone": "+14155550501"});
    expect_raw(event(&cx, &pbx, &call).await, 403, "policy_violation");
    cx.store().add_suppression(&cx.tenant.customer_id, "+14155550502", "opted out", "manual").await.unwrap();
    expect_raw(event(&cx, &pbx, &send("+14155550502", "hello")).await, 403, "recipient_suppressed");
    let r = expect_raw(event(&cx, &pbx, &send("+15005550001", "hello")).await, 502, "gateway_send_failed");
    assert_eq!(r["details"]["reason"], "provider_rejected");
    cx.store().set_paused(&cx.tenant.instance_id, true, Some("review")).await.unwrap();
    expect_raw(event(&cx, &pbx, &send("+14155550503", "hello")).await, 403, "instance_paused_for_review");
    cx.store().set_paused(&cx.tenant.instance_id, false, None).await.unwrap();
    let limits = gateway_server::store::LimitOverrides { daily: Some(1), ..Default::default() };
    ops::set_limits(cx.store(), &cx.tenant.customer_id, &limits).await.unwrap();
    ok(event(&cx, &pbx, &send("+14155550504", "hello")).await, "message_sent");
    expect_raw(event(&cx, &pbx, &send("+14155550505", "hello")).await, 429, "daily_message_limit_exceeded");
    assert_eq!(provider.texts().len(), 2, "only the allowed send and the provider refusal reached it");
    // Each attempt left a message-log row from source pbx.
    let log = cx.store().recent_log(&cx.tenant.customer_id, 20).await.unwrap();
    assert_eq!(log.iter().filter(|(_, e)| e.source == "pbx").count(), 7);
    cx.teardown().await;
}

#[tokio::test]
async fn the_strict_conversation_window_messages_only_recent_writers() {
    let (cx, provider) = recording_context("pbx_window").await;
    let pbx = integration(&cx, false).await;
    ops::set_pbx_template(cx.store(), pbx.id, "missed_call", "We missed your call", "support").await.unwrap();
    let update = PbxSettingsUpdate { strict_window_hours: Some(Some(24)), ..Default::default() };
    ops::update_pbx(cx.store(), pbx.id, &update).await.unwrap();
    let call = |p: &str| json!({"event_type": "missed_call", "customer_phone": p});
    ok(event(&cx, &pbx, &call("+14155550601")).await, "outside_conversation_window");
    let store = cx.store();
    store.record_contact_activity(&cx.tenant.instance_id, "+14155550602", now_ms() - 25 * 3_600_000).await.unwrap();
    ok(event(&cx, &pbx, &call("+14155550602")).await, "outside_conversation_window");
    store.record_contact_activity(&cx.tenant.instance_id, "+14155550602", now_ms() - 3_600_000).await.unwrap();
    ok(event(&cx, &pbx, &call("+14155550602")).await, "message_sent");
    assert_eq!(provider.texts().len(), 1);
    cx.teardown().await;
}

#[tokio::test]
async fn a_rotated_secret_replaces_the_old_one_at_once() {
    let cx = TestContext::new("pbx_rotate").await;
    let mut pbx = integration(&cx, true).await;
    ok(event(&cx, &pbx, &json!({"event_type": "test"})).await, "received");
    let rotated = ops::rotate_pbx_secret(cx.store(), pbx.id, true).await.unwrap();
    let old = std::mem::replace(&mut pbx.secret, rotated["webhook_secret"].as_str().unwrap().to_string());
    let old_key = pbx.hmac.replace(rotated["hmac_secret"].as_str().unwrap().to_string());
    ok(event(&cx, &pbx, &json!({"event_type": "test", "queue": "1"})).await, "received");
    let stale = Pbx { id: pbx.id, secret: old, hmac: old_key };
    expect_raw(event(&cx, &stale, &json!({"event_type": "test", "queue": "2"})).await, 401, "invalid_pbx_webhook");
    // The stored record never holds the webhook secret itself.
    let stored = cx.store().pbx_integration(pbx.id).await.unwrap().unwrap();
    assert_ne!(stored.secret_hash, pbx.secret);
    assert!(pbx.secret.starts_with(&stored.secret_prefix));
    cx.teardown().await;
}

#[tokio::test]
async fn a_change_by_another_process_holds_for_the_next_event() {
    // The webhook takes its integration from the cache; the admission checks it is
    // unchanged. Another process (the CLI, a replica) changes the integration without
    // touching this process's cache, so only that check can see it.
    let cx = TestContext::new("pbx_cached").await;
    let mut pbx = integration(&cx, true).await;
    ok(event(&cx, &pbx, &json!({"event_type": "test", "queue": "0"})).await, "received");
    let other = Store::connect(&cx.config.database_url, 2, None).await.unwrap();
    let events = |cx: &TestContext| {
        let store = cx.store().clone();
        let id = pbx.id;
        async move { store.recent_pbx_events(id, 100).await.unwrap().len() }
    };
    let logged = events(&cx).await;

    // A rotated secret: the old one is refused at once, the new one works at once.
    let rotated = ops::rotate_pbx_secret(&other, pbx.id, true).await.unwrap();
    let old = std::mem::replace(&mut pbx.secret, rotated["webhook_secret"].as_str().unwrap().to_string());
    let old_key = pbx.hmac.replace(rotated["hmac_secret"].as_str().unwrap().to_string());
    let stale = Pbx { id: pbx.id, secret: old, hmac: old_key };
    expect_raw(event(&cx, &stale, &json!({"event_type": "test", "queue": "1"})).await, 401, "invalid_pbx_webhook");
    assert_eq!(events(&cx).await, logged, "a request checked against the old secret wrote nothing");
    ok(event(&cx, &pbx, &json!({"event_type": "test", "queue": "2"})).await, "received");

    // An allowlist that leaves the caller out, and then none again.
    let only =
        |list: Option<&str>| PbxSettingsUpdate { ip_allowlist: Some(list.map(str::to_string)), ..Default::default() };
    ops::update_pbx(&other, pbx.id, &only(Some("192.0.2.7"))).await.unwrap();
    expect_raw(event(&cx, &pbx, &json!({"event_type": "test", "queue": "3"})).await, 401, "invalid_pbx_webhook");
    ops::update_pbx(&other, pbx.id, &only(None)).await.unwrap();
    ok(event(&cx, &pbx, &json!({"event_type": "test", "queue": "4"})).await, "received");

    // The customer's PBX module turned off, and on again.
    other.set_modules(&cx.tenant.customer_id, None, Some(false)).await.unwrap();
    expect_raw(event(&cx, &pbx, &json!({"event_type": "test", "queue": "5"})).await, 403, "module_not_enabled");
    other.set_modules(&cx.tenant.customer_id, None, Some(true)).await.unwrap();
    ok(event(&cx, &pbx, &json!({"event_type": "test", "queue": "6"})).await, "received");

    // The limit lowered to one a minute with no burst: of the next two events, the
    // second is limited at once (the first too, if the earlier ones left no room). With
    // the cached limit (60 a minute, a burst of 20) both would pass.
    let update = PbxSettingsUpdate { rate_per_minute: Some(Some(1)), burst: Some(Some(1)), ..Default::default() };
    ops::update_pbx(&other, pbx.id, &update).await.unwrap();
    let first = event(&cx, &pbx, &json!({"event_type": "test", "queue": "7"})).await.0;
    let second = event(&cx, &pbx, &json!({"event_type": "test", "queue": "8"})).await;
    assert!(first == 200 || first == 429, "{first}");
    expect_raw(second, 429, "webhook_rate_limited");
    other.close().await;
    cx.teardown().await;
}

#[tokio::test]
async fn an_admission_against_a_changed_integration_writes_nothing() {
    use gateway_server::store::{Admission, PbxAdmit};
    let cx = TestContext::new("pbx_stale_admit").await;
    let pbx = integration(&cx, true).await;
    let used = cx.store().pbx_integration(pbx.id).await.unwrap().unwrap();
    // One timestamp: it is part of what a replay repeats.
    let signed_at = now_s();
    let admit = |used| PbxAdmit {
        used: std::sync::Arc::new(used),
        signature: Some("ab".repeat(32)),
        signature_ts: signed_at,
        rate: None,
        log: None,
    };
    let changed = gateway_server::store::PbxIntegration { business_name: Some("Other".into()), ..used.clone() };
    assert_eq!(cx.store().pbx_admit(admit(changed)).await.unwrap(), Admission::Stale);
    let off = gateway_server::store::PbxIntegration { module_pbx: false, ..used.clone() };
    assert_eq!(cx.store().pbx_admit(admit(off)).await.unwrap(), Admission::Stale);
    // The stale admissions did not remember the signature: it is admitted once, then a replay.
    assert!(matches!(cx.store().pbx_admit(admit(used.clone())).await.unwrap(), Admission::Admitted { .. }));
    assert_eq!(cx.store().pbx_admit(admit(used)).await.unwrap(), Admission::Replayed);
    cx.teardown().await;
}

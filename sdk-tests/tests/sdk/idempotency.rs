//! Exactly once: idempotency keys on send-message, unknown provider outcomes, orphaned
//! attempts, and `Retry-After`.

use crate::{expect_error, text};
use gateway_client::{RetryPolicy, was_replayed};
use gateway_sdk_tests::TestContext;
use gateway_server::store::{Answer, Began, Begin, IdemOwner, LogEntry, now_ms};
use serde_json::{Value, json};

const PHONE: &str = "+14155550123";

/// One raw answer: status, headers, exact body.
struct Raw {
    status: u16,
    headers: reqwest::header::HeaderMap,
    body: String,
}

impl Raw {
    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body))
    }

    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

async fn send_keyed(cx: &TestContext, key: Option<&str>, body: &Value) -> Raw {
    let mut request = cx
        .http
        .post(format!("{}/api/send-message", cx.base_url))
        .bearer_auth(&cx.tenant.api_key)
        .header("content-type", "application/json")
        .body(body.to_string());
    if let Some(key) = key {
        request = request.header("Idempotency-Key", key);
    }
    let response = request.send().await.expect("the gateway answers");
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    Raw { status, headers, body: response.text().await.unwrap() }
}

fn message(cx: &TestContext, phone: &str, text: &str) -> Value {
    json!({"instance_id": cx.tenant.instance_name, "phone": phone, "message_purpose": "transactional", "message": text})
}

async fn rows(cx: &TestContext) -> Vec<LogEntry> {
    cx.store().recent_log(&cx.tenant.customer_id, 1000).await.unwrap().into_iter().map(|(_, e)| e).collect()
}

async fn sent_rows(cx: &TestContext) -> usize {
    rows(cx).await.iter().filter(|e| e.status == "sent").count()
}

async fn day_count(cx: &TestContext) -> i64 {
    let now = now_ms();
    cx.store().counter(&format!("day:{}", cx.tenant.customer_id), now - now.rem_euclid(86_400_000)).await.unwrap()
}

async fn events(cx: &TestContext, kind: &str) -> usize {
    cx.store().outbox_events(&cx.tenant.customer_id).await.unwrap().iter().filter(|(t, _)| t == kind).count()
}

#[tokio::test]
async fn the_same_key_and_body_replay_the_first_answer_byte_for_byte() {
    let cx = TestContext::new("idem_replay").await;
    let body = message(&cx, PHONE, "Your code is 123456");
    let first = send_keyed(&cx, Some("order-42"), &body).await;
    assert_eq!(first.status, 200, "{}", first.body);
    assert_eq!(first.header("idempotent-replayed"), None);
    // Spacing differs; the fields are the same.
    let again = send_keyed(&cx, Some("order-42"), &serde_json::from_str::<Value>(&body.to_string()).unwrap()).await;
    assert_eq!(again.status, 200);
    assert_eq!(again.body, first.body, "byte for byte");
    assert_eq!(again.header("idempotent-replayed"), Some("true"));
    // Nothing sent, counted or emitted twice.
    assert_eq!(sent_rows(&cx).await, 1);
    assert_eq!(day_count(&cx).await, 1);
    assert_eq!(events(&cx, "message.sent").await, 1);
    // Another key is another message; the key is per customer.
    assert_eq!(send_keyed(&cx, Some("order-43"), &body).await.status, 200);
    assert_eq!(sent_rows(&cx).await, 2);
    // Through the client: the same key replays, and the client says so.
    let request = text("main", PHONE, "Your code is 123456");
    let a = cx.client.message_send_with_key("sdk-1", &request).await.unwrap();
    let b = cx.client.message_send_with_key("sdk-1", &request).await.unwrap();
    assert_eq!((a.log_id, was_replayed(&a)), (b.log_id, !was_replayed(&b)));
    assert_eq!(sent_rows(&cx).await, 3);
    cx.teardown().await;
}

#[tokio::test]
async fn another_body_with_the_key_is_422_and_bad_keys_are_refused() {
    let cx = TestContext::new("idem_reuse").await;
    assert_eq!(send_keyed(&cx, Some("k1"), &message(&cx, PHONE, "one")).await.status, 200);
    let reused = send_keyed(&cx, Some("k1"), &message(&cx, PHONE, "two")).await;
    assert_eq!(reused.status, 422);
    assert_eq!(reused.json()["error"], "idempotency_key_reused");
    assert_eq!(reused.json()["details"]["field"], "Idempotency-Key");
    for bad in [String::new(), "k".repeat(256), "tab\tkey".into()] {
        let r = send_keyed(&cx, Some(&bad), &message(&cx, PHONE, "three")).await;
        assert_eq!((r.status, r.json()["error"].as_str()), (422, Some("validation_error")), "{bad:?}");
    }
    assert_eq!(sent_rows(&cx).await, 1);
    cx.teardown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn twenty_concurrent_retries_with_one_key_send_one_message() {
    let cx = TestContext::new("idem_concurrent").await;
    let body = message(&cx, PHONE, "Your parcel is on its way");
    let answers = futures::future::join_all((0..20).map(|_| send_keyed(&cx, Some("retry-storm"), &body))).await;
    let fresh: Vec<&Raw> =
        answers.iter().filter(|a| a.status == 200 && a.header("idempotent-replayed").is_none()).collect();
    assert_eq!(fresh.len(), 1, "exactly one request ran: {:?}", answers.iter().map(|a| a.status).collect::<Vec<_>>());
    for a in &answers {
        match a.status {
            200 => assert_eq!(a.body, fresh[0].body),
            409 => {
                assert_eq!(a.json()["error"], "idempotency_request_in_progress");
                assert_eq!(a.header("retry-after"), Some("1"));
            }
            other => panic!("unexpected {other}: {}", a.body),
        }
    }
    assert_eq!(sent_rows(&cx).await, 1);
    assert_eq!(rows(&cx).await.len(), 1, "no other row");
    assert_eq!(day_count(&cx).await, 1);
    assert_eq!(events(&cx, "message.sent").await, 1);
    cx.teardown().await;
}

#[tokio::test]
async fn a_refusal_is_kept_but_throttling_frees_the_key() {
    let cx = TestContext::new("idem_refusal").await;
    cx.store().add_suppression(&cx.tenant.customer_id, PHONE, "asked to stop", "manual").await.unwrap();
    let first = send_keyed(&cx, Some("s1"), &message(&cx, PHONE, "hello")).await;
    assert_eq!((first.status, first.json()["error"].as_str()), (403, Some("recipient_suppressed")));
    cx.store().remove_suppression(&cx.tenant.customer_id, PHONE).await.unwrap();
    // The first answer stands for the key, though the recipient is no longer suppressed.
    let again = send_keyed(&cx, Some("s1"), &message(&cx, PHONE, "hello")).await;
    assert_eq!((again.status, again.body.as_str()), (403, first.body.as_str()));
    assert_eq!(again.header("idempotent-replayed"), Some("true"));
    assert_eq!(rows(&cx).await.len(), 1, "a replay writes no row");

    // 429 says "try again": the key stays free, with Retry-After from the details.
    // The throttle is a calendar minute's: what follows must fall in one.
    gateway_sdk_tests::room_in_the_minute(10).await;
    let limits = gateway_server::store::LimitOverrides { recipient_per_minute: Some(1), ..Default::default() };
    gateway_server::ops::set_limits(cx.store(), &cx.tenant.customer_id, &limits).await.unwrap();
    let other = "+14155550199";
    assert_eq!(send_keyed(&cx, None, &message(&cx, other, "a")).await.status, 200);
    let throttled = send_keyed(&cx, Some("t1"), &message(&cx, other, "b")).await;
    assert_eq!(throttled.status, 429, "{}", throttled.body);
    let seconds = throttled.json()["details"]["retry_after_seconds"].as_i64().unwrap();
    assert_eq!(throttled.header("retry-after"), Some(seconds.to_string().as_str()));
    let retried = send_keyed(&cx, Some("t1"), &message(&cx, other, "b")).await;
    assert_eq!(retried.status, 429);
    assert_eq!(retried.header("idempotent-replayed"), None, "ran again");
    cx.teardown().await;
}

/// The key decides before any check: a schema refusal's key is read alone, and a media
/// send's key before its media is fetched; every other send's key is read with the
/// send's own read.
#[tokio::test]
async fn the_key_decides_before_the_schema_check_and_before_media_is_fetched() {
    let cx = TestContext::with("idem_first", |c| c.allow_loopback_targets = true, None).await;
    cx.lift_velocity(&cx.tenant.customer_id).await;
    // A schema refusal is kept for its key and replayed; another body with the key is
    // refused as a reused key, whether it would pass the schema check or not.
    let no_phone = json!({"instance_id": cx.tenant.instance_name, "message_purpose": "transactional", "message": "hi"});
    let first = send_keyed(&cx, Some("v1"), &no_phone).await;
    assert_eq!((first.status, first.json()["error"].as_str()), (422, Some("missing_phone")));
    let again = send_keyed(&cx, Some("v1"), &no_phone).await;
    assert_eq!((again.status, again.body.as_str()), (422, first.body.as_str()));
    assert_eq!(again.header("idempotent-replayed"), Some("true"));
    let no_text = json!({"instance_id": cx.tenant.instance_name, "phone": PHONE, "message_purpose": "transactional"});
    for other in [message(&cx, PHONE, "hi"), no_text] {
        let reused = send_keyed(&cx, Some("v1"), &other).await;
        assert_eq!((reused.status, reused.json()["error"].as_str()), (422, Some("idempotency_key_reused")));
    }
    // A sent message's key refuses a schema-invalid body the same way.
    assert_eq!(send_keyed(&cx, Some("s1"), &message(&cx, PHONE, "hello")).await.status, 200);
    let reused = send_keyed(&cx, Some("s1"), &json!({"instance_id": cx.tenant.instance_name})).await;
    assert_eq!(reused.json()["error"], "idempotency_key_reused", "{}", reused.body);
    assert_eq!(rows(&cx).await.len(), 2, "a refused schema and a send; replays and reuses write no row");

    // A media URL is fetched once: the retry is answered by its key before any fetch.
    let files = gateway_sdk_tests::receiver::Receiver::start().await;
    let pdf = json!({"instance_id": cx.tenant.instance_name, "phone": PHONE, "message_purpose": "support",
                     "media_type": "document", "mime_type": "application/pdf", "file_name": "a.pdf",
                     "media": files.url("/a.pdf")});
    files.script([gateway_sdk_tests::receiver::Behaviour::Answer(
        200,
        vec![("content-type".into(), "application/pdf".into())],
        "%PDF-1.7\n".into(),
    )]);
    let sent = send_keyed(&cx, Some("m1"), &pdf).await;
    assert_eq!(sent.status, 200, "{}", sent.body);
    let replayed = send_keyed(&cx, Some("m1"), &pdf).await;
    assert_eq!((replayed.status, replayed.body.as_str()), (200, sent.body.as_str()));
    assert_eq!(replayed.header("idempotent-replayed"), Some("true"));
    assert_eq!(files.received().len(), 1, "the media was fetched once");
    assert_eq!(sent_rows(&cx).await, 2);
    cx.teardown().await;
}

#[tokio::test]
async fn a_broken_connection_after_the_provider_took_it_is_unknown_and_replayed() {
    let cx = TestContext::new("idem_unknown").await;
    let body = message(&cx, "+15005550003", "hello");
    let first = send_keyed(&cx, Some("u1"), &body).await;
    assert_eq!(first.status, 502);
    assert_eq!(first.json()["details"]["reason"], "provider_outcome_unknown");
    let log = rows(&cx).await;
    assert_eq!((log[0].decision.as_str(), log[0].status.as_str()), ("allowed", "unknown"));
    assert_eq!(day_count(&cx).await, 1, "the quota is kept: it may have been sent");
    assert_eq!(events(&cx, "message.failed").await, 0);
    // A retry must not send it again: the unknown answer is replayed.
    let again = send_keyed(&cx, Some("u1"), &body).await;
    assert_eq!((again.status, again.body.as_str()), (502, first.body.as_str()));
    assert_eq!(again.header("idempotent-replayed"), Some("true"));
    assert_eq!(day_count(&cx).await, 1);
    // A refusal the provider proved (nothing sent) frees the key and gives the quota back.
    let refused = message(&cx, "+15005550001", "hello");
    assert_eq!(send_keyed(&cx, Some("r1"), &refused).await.status, 502);
    let again = send_keyed(&cx, Some("r1"), &refused).await;
    assert_eq!((again.status, again.header("idempotent-replayed")), (502, None));
    assert_eq!(day_count(&cx).await, 1);
    assert_eq!(events(&cx, "message.failed").await, 2);
    cx.teardown().await;
}

#[tokio::test]
async fn a_key_in_flight_is_409_then_the_answer() {
    let cx = TestContext::with("idem_in_flight", |c| c.provider_timeout_ms = 3_000, None).await;
    let body = message(&cx, "+15005550002", "hello");
    let first = send_keyed(&cx, Some("slow"), &body);
    let second = async {
        // Once the first waits at the provider (its attempt row is written).
        while !rows(&cx).await.iter().any(|e| e.status == "pending") {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        send_keyed(&cx, Some("slow"), &body).await
    };
    let (first, second) = tokio::join!(first, second);
    assert_eq!(second.status, 409, "{}", second.body);
    assert_eq!(second.header("retry-after"), Some("1"));
    assert_eq!(first.status, 502);
    let third = send_keyed(&cx, Some("slow"), &body).await;
    assert_eq!((third.status, third.body.as_str()), (502, first.body.as_str()));
    cx.teardown().await;
}

#[tokio::test]
async fn an_attempt_orphaned_by_a_dead_process_becomes_unknown_and_answers_its_key() {
    let cx = TestContext::new("idem_orphan").await;
    let body = message(&cx, PHONE, "orphan");
    // What a process killed at the provider leaves: a claimed key, and its attempt row
    // pending under its lease, which then lapses (here: is gone). Its deadline (the
    // provider timeout) has not passed: the lease alone decides.
    let request: gateway_api::SendMessageRequest = serde_json::from_value(body.clone()).unwrap();
    let hash = gateway_server::send::idempotency::request_hash(&request);
    let owner = IdemOwner {
        customer_id: cx.tenant.customer_id.clone(),
        key: "dead".into(),
        owner: "req_dead".into(),
        request_hash: hash,
    };
    let past = now_ms() - 1_000;
    let dead = gateway_server::store::Store::connect(&cx.config.database_url, 2, None).await.unwrap();
    dead.take_lease().await.unwrap();
    dead.claim_idempotency(&owner, past).await.unwrap();
    let entry = LogEntry {
        customer_id: cx.tenant.customer_id.clone(),
        instance_id: Some(cx.tenant.instance_id.clone()),
        source: "api".into(),
        recipient: Some(PHONE.into()),
        decision: "allowed".into(),
        status: "pending".into(),
        created_at: past,
        ..LogEntry::default()
    };
    let deadline_at = past + 3_600_000;
    let begin = Begin { reservations: Vec::new(), entry, deadline_at, idem: Some(owner), owner_lease: None };
    assert!(matches!(dead.begin_attempt(begin.clone()).await.unwrap(), Began::Written { .. }));
    // While its process is alive, the retry is told to wait.
    let wait = send_keyed(&cx, Some("dead"), &body).await;
    assert_eq!((wait.status, wait.header("retry-after")), (409, Some("1")), "{}", wait.body);
    dead.release_lease().await.unwrap();
    // The retry is answered at once with the attempt's outcome, never 409 for ever.
    let retry = send_keyed(&cx, Some("dead"), &body).await;
    assert_eq!(retry.status, 502, "{}", retry.body);
    assert_eq!(retry.json()["details"]["reason"], "provider_outcome_unknown");
    assert_eq!(retry.header("idempotent-replayed"), Some("true"));
    let log = rows(&cx).await;
    assert_eq!((log.len(), log[0].status.as_str()), (1, "unknown"));
    assert_eq!(log[0].reason.as_deref(), Some(gateway_server::store::ORPHAN_REASON));
    // The sweep leaves live attempts alone, however long past their deadline: one of
    // the serving process (its lease holds), swept by another process.
    let mut live = begin;
    live.idem = None;
    live.deadline_at = past - 60_000;
    assert!(matches!(cx.store().begin_attempt(live).await.unwrap(), Began::Written { .. }));
    let answer = Answer { status: 502, body: "{}".into() };
    assert_eq!(dead.sweep_orphans(now_ms(), &answer).await.unwrap(), 0);
    assert_eq!(rows(&cx).await.iter().filter(|r| r.status == "pending").count(), 1);
    dead.close().await;
    cx.teardown().await;
}

#[tokio::test]
async fn the_retrying_client_sends_once_through_a_throttle() {
    let cx = TestContext::new("idem_client_retry").await;
    // The throttle is a calendar minute's: what follows must fall in one.
    gateway_sdk_tests::room_in_the_minute(10).await;
    let limits = gateway_server::store::LimitOverrides { recipient_per_minute: Some(1), ..Default::default() };
    gateway_server::ops::set_limits(cx.store(), &cx.tenant.customer_id, &limits).await.unwrap();
    cx.client.message_send(&text("main", PHONE, "first")).await.unwrap();
    // Throttled for the rest of the minute: a policy that will not wait that long
    // returns the 429 without retrying past its limit.
    let short = RetryPolicy {
        max_attempts: 3,
        base_delay: std::time::Duration::from_millis(10),
        max_delay: std::time::Duration::from_millis(50),
    };
    let e = cx.client.message_send_exactly_once(&text("main", PHONE, "second"), &short).await;
    expect_error(e, 429, "sending_throttled");
    // A refusal that no retry can change is returned at once.
    let e = cx.client.message_send_exactly_once(&text("nope", PHONE, "x"), &RetryPolicy::default()).await;
    expect_error(e, 404, "invalid_instance");
    // A send that goes through: one message.
    let sent = cx.client.message_send_exactly_once(&text("main", "+14155550100", "hi"), &RetryPolicy::default()).await;
    assert!(sent.is_ok());
    assert_eq!(sent_rows(&cx).await, 2);
    cx.teardown().await;
}

#[tokio::test]
async fn only_an_answer_that_proves_nothing_was_sent_is_safe_to_retry_without_a_key() {
    use gateway_client::retry_without_key_is_safe;
    use gateway_server::provider::simulator::{DROPPED_NUMBER, REFUSED_NUMBER};
    let cx = TestContext::new("idem_unkeyed").await;
    let main = cx.tenant.instance_name.clone();
    // The provider refused it: nothing is out.
    let refused = cx.client.message_send(&text(&main, REFUSED_NUMBER, "x")).await.unwrap_err();
    assert!(retry_without_key_is_safe(&refused), "{refused:?}");
    // The provider may have it: only a keyed retry is safe.
    let dropped = cx.client.message_send(&text(&main, DROPPED_NUMBER, "x")).await.unwrap_err();
    assert!(!retry_without_key_is_safe(&dropped), "{dropped:?}");
    // Throttled: nothing is out.
    // The throttle is a calendar minute's: what follows must fall in one.
    gateway_sdk_tests::room_in_the_minute(10).await;
    let limits = gateway_server::store::LimitOverrides { recipient_per_minute: Some(1), ..Default::default() };
    gateway_server::ops::set_limits(cx.store(), &cx.tenant.customer_id, &limits).await.unwrap();
    cx.client.message_send(&text(&main, PHONE, "first")).await.unwrap();
    let throttled = cx.client.message_send(&text(&main, PHONE, "second")).await.unwrap_err();
    assert!(retry_without_key_is_safe(&throttled), "{throttled:?}");
    // A refusal no retry changes, and a lost answer: not safe.
    let missing = cx.client.message_send(&text("nope", PHONE, "x")).await.unwrap_err();
    assert!(!retry_without_key_is_safe(&missing), "{missing:?}");
    let lost = gateway_client::Client::with_api_key("http://127.0.0.1:9", &cx.tenant.api_key)
        .message_send(&text(&main, PHONE, "x"))
        .await
        .unwrap_err();
    assert!(!retry_without_key_is_safe(&lost), "{lost:?}");
    cx.teardown().await;
}

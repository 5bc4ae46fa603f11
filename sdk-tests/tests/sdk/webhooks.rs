//! Customer webhooks end to end, against a receiver double on its own port: headers and
//! signature (recomputed here), retries on the schedule with jitter bounds, Retry-After,
//! no redirects, timeouts, resets, 410, disabling, attempt rows, resend, recover, test
//! events, rotation, and two dispatchers on one store never delivering an event twice.

use crate::text;
use gateway_client::events::{MessageFailed, MessageSent};
use gateway_sdk_tests::TestContext;
use gateway_sdk_tests::receiver::{Behaviour, Receiver};
use gateway_server::config::Config;
use gateway_server::ops::{self, SecretChoice};
use hmac::{Hmac, Mac};
use sha2::Sha256;
use std::time::Duration;

const SECRET: &str = "whsec_test_secret_0123456789";
const WAIT: Duration = Duration::from_secs(10);

/// Short schedule (0, 200, 300, 400 ms), quick polling, a 1 s timeout, loopback allowed.
fn fast(config: &mut Config) {
    config.allow_loopback_targets = true;
    config.webhooks.schedule_ms = vec![0, 200, 300, 400];
    config.webhooks.poll_interval_ms = 20;
    config.webhooks.timeout_ms = 1_000;
}

async fn context(name: &str, change: impl FnOnce(&mut Config)) -> TestContext {
    TestContext::with(
        name,
        |c| {
            fast(c);
            change(c);
        },
        None,
    )
    .await
}

async fn endpoint(cx: &TestContext, url: &str, events: &str) {
    let secret = SecretChoice::Given(SECRET.into());
    ops::set_webhook(cx.store(), &cx.config, &cx.tenant.instance_id, url, events, secret).await.unwrap();
}

async fn send(cx: &TestContext, phone: &str) {
    let _ = cx.client.message_send(&text("main", phone, "Your order has shipped")).await;
}

fn hmac_hex(secret: &str, timestamp: &str, body: &[u8]) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret.as_bytes()).unwrap();
    mac.update(format!("{timestamp}.").as_bytes());
    mac.update(body);
    hex::encode(mac.finalize().into_bytes())
}

/// Waits for an event's row to reach a final outcome.
async fn outcome(cx: &TestContext, event_id: i64) -> String {
    let started = std::time::Instant::now();
    loop {
        let event = cx.store().outbox_event(event_id).await.unwrap().unwrap();
        if let Some(outcome) = event.outcome {
            return outcome;
        }
        assert!(started.elapsed() < WAIT, "event {event_id} never finished");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The instance's logged attempts, newest first, once there are at least `n` (or at WAIT).
async fn attempts_at_least(cx: &TestContext, n: usize) -> Vec<gateway_server::store::WebhookAttempt> {
    let started = std::time::Instant::now();
    loop {
        let attempts = cx.store().recent_attempts(&cx.tenant.instance_id, 10).await.unwrap();
        if attempts.len() >= n || started.elapsed() > WAIT {
            return attempts;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn event_number(header: Option<&str>) -> i64 {
    header.unwrap().strip_prefix("evt_").unwrap().parse().unwrap()
}

#[tokio::test]
async fn an_event_arrives_signed_with_the_spec_headers_and_a_typed_body() {
    let cx = context("wh_200", |_| {}).await;
    let receiver = Receiver::start().await;
    endpoint(&cx, &receiver.url("/hooks"), "message.sent,message.failed").await;
    send(&cx, "+14155550123").await;
    let got = receiver.wait_for(1, WAIT).await;
    let r = &got[0];
    assert_eq!(r.path, "/hooks");
    assert_eq!(r.header("content-type"), Some("application/json"));
    assert_eq!(r.header("x-gateway-event"), Some("message.sent"));
    let ts = r.header("x-gateway-timestamp").unwrap();
    let now = gateway_server::store::now_ms() / 1000;
    assert!((now - ts.parse::<i64>().unwrap()).abs() <= 5);
    // The signature, recomputed independently, and through the client helper.
    let expected = format!("sha256={}", hmac_hex(SECRET, ts, &r.body));
    assert_eq!(r.header("x-gateway-signature"), Some(expected.as_str()));
    gateway_client::verify_signature(SECRET, ts, &r.body, &expected, Duration::from_secs(300)).unwrap();
    assert!(
        gateway_client::verify_signature("whsec_wrong_secret_000", ts, &r.body, &expected, Duration::from_secs(300))
            .is_err()
    );
    // The body: base fields and the event's own, as the typed client event.
    let sent: MessageSent = serde_json::from_slice(&r.body).unwrap();
    assert_eq!((sent.event.as_str(), sent.to.as_str()), ("message.sent", "+14155550123"));
    assert_eq!((sent.instance_id.as_str(), sent.instance_name.as_str()), (cx.tenant.instance_id.as_str(), "main"));
    assert_eq!(sent.message_purpose, "transactional");
    assert!(sent.message_id.as_deref().is_some_and(|id| id.starts_with("SIM")));
    // The row and its attempt.
    let id = event_number(r.header("x-gateway-event-id"));
    assert_eq!(outcome(&cx, id).await, "delivered");
    let attempts = cx.store().attempts_of_event(id).await.unwrap();
    assert_eq!(attempts.len(), 1);
    let a = &attempts[0];
    assert_eq!((a.status_code, a.succeeded, a.attempt, a.trigger.as_str()), (Some(200), true, 1, "scheduled"));
    assert_eq!(a.response_body.as_deref(), Some("answer 200"));
    assert_eq!(a.url, receiver.url("/hooks"));
    // A failed send's event too, typed.
    send(&cx, "+15005550001").await;
    let got = receiver.wait_for(2, WAIT).await;
    let failed: MessageFailed = serde_json::from_slice(&got[1].body).unwrap();
    assert_eq!((failed.event.as_str(), failed.error.as_str()), ("message.failed", "provider_rejected"));
    cx.teardown().await;
}

#[tokio::test]
async fn a_500_is_retried_on_the_schedule_with_the_same_event_id() {
    let cx = context("wh_retry", |_| {}).await;
    let receiver = Receiver::start().await;
    receiver.script([Behaviour::status(500), Behaviour::status(502)]);
    endpoint(&cx, &receiver.url("/"), "all").await;
    send(&cx, "+14155550124").await;
    let got = receiver.wait_for(3, WAIT).await;
    let ids: Vec<_> = got.iter().map(|r| r.header("x-gateway-event-id").unwrap().to_string()).collect();
    assert!(ids.iter().all(|i| i == &ids[0]), "one id across retries: {ids:?}");
    // Delays 200 ms then 300 ms, each at least 80 % of itself; the upper bound allows
    // for polling and a loaded machine (the exact bounds are unit-tested in schedule).
    let gap1 = got[1].at - got[0].at;
    let gap2 = got[2].at - got[1].at;
    assert!(gap1 >= Duration::from_millis(160) && gap1 < Duration::from_millis(240 + 600), "{gap1:?}");
    assert!(gap2 >= Duration::from_millis(240) && gap2 < Duration::from_millis(360 + 600), "{gap2:?}");
    // Each attempt is signed with its own timestamp.
    for r in &got {
        let ts = r.header("x-gateway-timestamp").unwrap();
        assert_eq!(r.header("x-gateway-signature").unwrap(), format!("sha256={}", hmac_hex(SECRET, ts, &r.body)));
    }
    let id = event_number(Some(&ids[0]));
    assert_eq!(outcome(&cx, id).await, "delivered");
    let attempts = cx.store().attempts_of_event(id).await.unwrap();
    let statuses: Vec<_> = attempts.iter().map(|a| (a.attempt, a.status_code, a.succeeded)).collect();
    assert_eq!(statuses, [(1, Some(500), false), (2, Some(502), false), (3, Some(200), true)]);
    assert_eq!(attempts[0].response_body.as_deref(), Some("answer 500"));
    // The endpoint's failure clock stopped with the success.
    assert_eq!(cx.store().webhook(&cx.tenant.instance_id).await.unwrap().unwrap().failing_since, None);
    cx.teardown().await;
}

#[tokio::test]
async fn the_schedule_ends_and_the_event_is_failed() {
    let cx = context("wh_exhausted", |_| {}).await;
    let receiver = Receiver::start().await;
    receiver.script((0..10).map(|_| Behaviour::status(500)));
    endpoint(&cx, &receiver.url("/"), "all").await;
    send(&cx, "+14155550125").await;
    let got = receiver.wait_for(4, WAIT).await;
    let id = event_number(got[0].header("x-gateway-event-id"));
    assert_eq!(outcome(&cx, id).await, "failed");
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(receiver.received().len(), 4, "four attempts: the length of the schedule");
    let endpoint = cx.store().webhook(&cx.tenant.instance_id).await.unwrap().unwrap();
    assert!(endpoint.failing_since.is_some() && endpoint.disabled_at.is_none());
    cx.teardown().await;
}

#[tokio::test]
async fn retry_after_of_a_429_is_honoured_within_d_and_2d() {
    let cx = context("wh_429", |_| {}).await;
    let receiver = Receiver::start().await;
    let slow_down = Behaviour::Answer(429, vec![("Retry-After".into(), "30".into())], "slow down".into());
    receiver.script([slow_down]);
    endpoint(&cx, &receiver.url("/"), "all").await;
    send(&cx, "+14155550126").await;
    let got = receiver.wait_for(2, WAIT).await;
    // Asked for 30 s; the schedule's d is 200 ms ±20 %: the retry comes at 2d.
    let gap = got[1].at - got[0].at;
    assert!(gap >= Duration::from_millis(320) && gap < Duration::from_millis(480 + 600), "{gap:?}");
    cx.teardown().await;
}

#[tokio::test]
async fn a_redirect_is_never_followed() {
    let cx = context("wh_302", |_| {}).await;
    let receiver = Receiver::start().await;
    let internal = Receiver::start().await;
    let redirect = Behaviour::Answer(302, vec![("Location".into(), internal.url("/metadata"))], String::new());
    receiver.script([redirect]);
    endpoint(&cx, &receiver.url("/"), "all").await;
    send(&cx, "+14155550127").await;
    let got = receiver.wait_for(2, WAIT).await;
    let id = event_number(got[0].header("x-gateway-event-id"));
    assert_eq!(outcome(&cx, id).await, "delivered");
    assert!(internal.received().is_empty(), "the redirect target was never called");
    let attempts = cx.store().attempts_of_event(id).await.unwrap();
    assert_eq!((attempts[0].status_code, attempts[0].succeeded), (Some(302), false));
    cx.teardown().await;
}

#[tokio::test]
async fn a_hang_past_the_timeout_and_a_reset_connection_are_failed_attempts() {
    let cx = context("wh_hang", |c| c.webhooks.timeout_ms = 300).await;
    let receiver = Receiver::start().await;
    receiver.script([Behaviour::Hang(Duration::from_secs(3)), Behaviour::Reset]);
    endpoint(&cx, &receiver.url("/"), "all").await;
    send(&cx, "+14155550128").await;
    let got = receiver.wait_for(3, WAIT).await;
    let id = event_number(got[0].header("x-gateway-event-id"));
    assert_eq!(outcome(&cx, id).await, "delivered");
    let attempts = cx.store().attempts_of_event(id).await.unwrap();
    assert_eq!(attempts.len(), 3);
    let hang = &attempts[0];
    assert_eq!(hang.status_code, None);
    assert!(hang.error.as_deref().unwrap().contains("timed out"), "{:?}", hang.error);
    assert!(hang.latency_ms >= 280 && hang.latency_ms < 2_000, "{}", hang.latency_ms);
    let reset = &attempts[1];
    assert_eq!(reset.status_code, None);
    assert!(reset.error.is_some(), "{reset:?}");
    assert!(attempts[2].succeeded);
    cx.teardown().await;
}

#[tokio::test]
async fn a_410_disables_the_endpoint_until_it_is_enabled_and_recover_redelivers() {
    let cx = context("wh_410", |_| {}).await;
    let receiver = Receiver::start().await;
    receiver.script([Behaviour::status(410)]);
    endpoint(&cx, &receiver.url("/"), "all").await;
    send(&cx, "+14155550129").await;
    let got = receiver.wait_for(1, WAIT).await;
    let first = event_number(got[0].header("x-gateway-event-id"));
    assert_eq!(outcome(&cx, first).await, "gone");
    let endpoint_now = cx.store().webhook(&cx.tenant.instance_id).await.unwrap().unwrap();
    assert!(endpoint_now.disabled_at.is_some());
    assert_eq!(endpoint_now.disabled_reason.as_deref(), Some("the endpoint answered 410 Gone"));
    // While disabled, events are not delivered.
    let since = gateway_server::store::now_ms() - 60_000;
    send(&cx, "+14155550130").await;
    let events = cx.store().outbox_events(&cx.tenant.customer_id).await.unwrap();
    assert_eq!(events.len(), 2);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(receiver.received().len(), 1);
    // Enable, then recover since a minute ago: both events arrive.
    cx.store().enable_webhook(&cx.tenant.instance_id).await.unwrap();
    assert_eq!(cx.store().recover_events(&cx.tenant.instance_id, since).await.unwrap(), 2);
    let got = receiver.wait_for(3, WAIT).await;
    let ids: std::collections::BTreeSet<_> =
        got[1..].iter().map(|r| event_number(r.header("x-gateway-event-id"))).collect();
    assert_eq!(ids.len(), 2);
    assert!(ids.contains(&first));
    assert_eq!(outcome(&cx, first).await, "delivered");
    cx.teardown().await;
}

#[tokio::test]
async fn an_endpoint_failing_past_the_limit_is_disabled_and_its_owner_told() {
    // With the limit at 0 hours, the second failure finds the endpoint failing "long
    // enough" (the clock started at the first).
    let cx = context("wh_disable", |c| c.webhooks.disable_after_hours = 0).await;
    let receiver = Receiver::start().await;
    receiver.script((0..10).map(|_| Behaviour::status(503)));
    endpoint(&cx, &receiver.url("/"), "all").await;
    send(&cx, "+14155550131").await;
    receiver.wait_for(2, WAIT).await;
    let started = std::time::Instant::now();
    let endpoint_now = loop {
        let e = cx.store().webhook(&cx.tenant.instance_id).await.unwrap().unwrap();
        if e.disabled_at.is_some() || started.elapsed() > WAIT {
            break e;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(endpoint_now.disabled_reason.as_deref(), Some("every delivery failed for 0 hours"));
    let shown = ops::webhook_json(&endpoint_now);
    assert_eq!(shown["enabled"], false);
    let log_file = cx.config.log_file.clone().unwrap();
    let mut logged = false;
    for _ in 0..50 {
        logged = std::fs::read_to_string(&log_file).unwrap().contains("webhook endpoint disabled");
        if logged {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(logged, "an operator log line");
    cx.teardown().await;
}

#[tokio::test]
async fn only_selected_events_are_delivered_and_others_are_marked_skipped() {
    let cx = context("wh_select", |_| {}).await;
    let receiver = Receiver::start().await;
    endpoint(&cx, &receiver.url("/"), "message.failed").await;
    send(&cx, "+14155550132").await; // message.sent: not selected
    send(&cx, "+15005550001").await; // message.failed
    let got = receiver.wait_for(1, WAIT).await;
    assert_eq!(got[0].header("x-gateway-event"), Some("message.failed"));
    let failed_id = event_number(got[0].header("x-gateway-event-id"));
    assert_eq!(outcome(&cx, failed_id - 1).await, "skipped_not_subscribed");
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(receiver.received().len(), 1);
    // Unknown event names are refused when saved.
    let bad = ops::set_webhook(
        cx.store(),
        &cx.config,
        &cx.tenant.instance_id,
        &receiver.url("/"),
        "message.sent,nope",
        SecretChoice::None,
    )
    .await;
    assert!(bad.is_err());
    cx.teardown().await;
}

/// An event of an instance without an endpoint is written done (`skipped_no_endpoint`)
/// in the transaction that writes it: no dispatcher claims it. The dispatcher here polls
/// once an hour, after its first claim at start, so an event left to it stays pending.
#[tokio::test]
async fn events_of_an_instance_without_an_endpoint_are_written_done_as_skipped() {
    use sqlx::Connection;
    let cx = context("wh_none", |c| c.webhooks.poll_interval_ms = 3_600_000).await;
    cx.lift_velocity(&cx.tenant.customer_id).await;
    // Sent and failed, several at once, so that they share the writer's batches.
    let phones = ["+14155550141", "+14155550142", "+14155550143", "+14155550144", "+15005550001"];
    futures::future::join_all(phones.iter().map(|p| send(&cx, p))).await;
    sqlx::any::install_default_drivers();
    let mut conn = sqlx::AnyConnection::connect(&cx.config.database_url).await.unwrap();
    let sql = format!("SELECT id FROM outbox WHERE customer_id = '{}' ORDER BY id", cx.tenant.customer_id);
    let ids: Vec<i64> = sqlx::query_scalar(sql.as_str()).fetch_all(&mut conn).await.unwrap();
    assert_eq!(ids.len(), phones.len(), "one event a send");
    for &id in &ids {
        let event = cx.store().outbox_event(id).await.unwrap().unwrap();
        assert_eq!(event.outcome.as_deref(), Some("skipped_no_endpoint"), "event {id} is done as it is written");
        assert_eq!(event.delivered_at, Some(event.created_at), "done when written");
        assert_eq!(event.attempts, 0, "no attempt was made");
        assert!(cx.store().attempts_of_event(id).await.unwrap().is_empty());
    }
    // With an endpoint, the next event is the dispatcher's (pending until it claims it).
    endpoint(&cx, "http://127.0.0.1:9/", "all").await;
    send(&cx, "+14155550145").await;
    let sql = format!("SELECT MAX(id) FROM outbox WHERE customer_id = '{}'", cx.tenant.customer_id);
    let last: i64 = sqlx::query_scalar(sql.as_str()).fetch_one(&mut conn).await.unwrap();
    assert!(last > ids[ids.len() - 1]);
    let event = cx.store().outbox_event(last).await.unwrap().unwrap();
    assert_eq!(event.outcome, None, "an event with an endpoint waits for the dispatcher");
    conn.close().await.unwrap();
    cx.teardown().await;
}

#[tokio::test]
async fn during_a_rotation_both_secrets_sign() {
    let cx = context("wh_rotate", |_| {}).await;
    let receiver = Receiver::start().await;
    endpoint(&cx, &receiver.url("/"), "all").await;
    let rotated = ops::rotate_webhook_secret(cx.store(), &cx.tenant.instance_id).await.unwrap();
    let new_secret = rotated["secret"].as_str().unwrap().to_string();
    assert!(new_secret.starts_with("whsec_"));
    assert!(rotated["previous_secret_signs_until"].is_string());
    send(&cx, "+14155550133").await;
    let got = receiver.wait_for(1, WAIT).await;
    let r = &got[0];
    let ts = r.header("x-gateway-timestamp").unwrap();
    let header = r.header("x-gateway-signature").unwrap();
    assert_eq!(
        header,
        format!("sha256={},sha256={}", hmac_hex(&new_secret, ts, &r.body), hmac_hex(SECRET, ts, &r.body))
    );
    let tolerance = Duration::from_secs(300);
    gateway_client::verify_signature(&new_secret, ts, &r.body, header, tolerance).unwrap();
    gateway_client::verify_signature(SECRET, ts, &r.body, header, tolerance).unwrap();
    // Shown once: `webhook show` has no secret.
    let shown = ops::webhook_json(&cx.store().webhook(&cx.tenant.instance_id).await.unwrap().unwrap());
    assert!(!shown.to_string().contains(&new_secret) && !shown.to_string().contains(SECRET));
    cx.teardown().await;
}

#[tokio::test]
async fn resend_and_test_events_are_single_logged_attempts() {
    let cx = context("wh_resend", |_| {}).await;
    let receiver = Receiver::start().await;
    endpoint(&cx, &receiver.url("/"), "all").await;
    send(&cx, "+14155550134").await;
    let got = receiver.wait_for(1, WAIT).await;
    let id = event_number(got[0].header("x-gateway-event-id"));
    assert_eq!(outcome(&cx, id).await, "delivered");
    let resent = ops::webhook_attempt_now(cx.store(), &cx.config, None, Some(id)).await.unwrap();
    assert_eq!((resent["trigger"].as_str(), resent["succeeded"].as_bool()), (Some("manual"), Some(true)));
    let got = receiver.wait_for(2, WAIT).await;
    assert_eq!(got[1].body, got[0].body, "the same body");
    assert_eq!(got[1].header("x-gateway-event-id"), got[0].header("x-gateway-event-id"));
    let test = ops::webhook_attempt_now(cx.store(), &cx.config, Some(&cx.tenant.instance_id), None).await.unwrap();
    assert_eq!(test["trigger"], "test");
    let got = receiver.wait_for(3, WAIT).await;
    assert_eq!(got[2].header("x-gateway-event"), Some("webhook.test"));
    assert_eq!(got[2].json()["test"], true);
    let attempts = cx.store().recent_attempts(&cx.tenant.instance_id, 10).await.unwrap();
    let triggers: Vec<_> = attempts.iter().map(|a| a.trigger.as_str()).collect();
    assert_eq!(triggers, ["test", "manual", "scheduled"]);
    cx.teardown().await;
}

#[tokio::test]
async fn a_destination_that_resolves_to_loopback_is_refused_without_the_development_flag() {
    let cx = context("wh_ssrf", |c| c.allow_loopback_targets = false).await;
    let receiver = Receiver::start().await;
    for url in [
        receiver.url("/"),
        format!("https://localhost:{}/", receiver.port),
        format!("https://2130706433:{}/", receiver.port),
        format!("https://0177.0.0.1:{}/", receiver.port),
        format!("https://[::ffff:127.0.0.1]:{}/", receiver.port),
        "https://169.254.169.254/latest/meta-data".to_string(),
    ] {
        let saved =
            ops::set_webhook(cx.store(), &cx.config, &cx.tenant.instance_id, &url, "all", SecretChoice::None).await;
        assert!(saved.is_err(), "{url} is refused at save time");
    }
    // At connect time too: an endpoint stored when the name was public (written
    // directly here) whose name now resolves to loopback is never connected to.
    let url = format!("https://localhost:{}/", receiver.port);
    cx.store().set_webhook(&cx.tenant.instance_id, &url, &["message.sent".into()], None).await.unwrap();
    send(&cx, "+14155550135").await;
    let attempts = attempts_at_least(&cx, 1).await;
    assert_eq!(attempts[0].status_code, None);
    let error = attempts[0].error.as_deref().unwrap();
    assert!(error.contains("refused address"), "{error}");
    // A literal loopback address stored the same way is refused by the form check, which
    // the dispatcher makes once per endpoint per claim: the next claim reads the endpoint
    // again, so the changed URL is the one checked.
    let url = format!("https://127.0.0.1:{}/", receiver.port);
    cx.store().set_webhook(&cx.tenant.instance_id, &url, &["message.sent".into()], None).await.unwrap();
    send(&cx, "+14155550136").await;
    let attempts = attempts_at_least(&cx, 2).await;
    let literal = attempts.iter().find(|a| a.url == url).expect("an attempt for the literal address");
    assert_eq!(literal.status_code, None);
    let error = literal.error.as_deref().unwrap();
    assert!(error.starts_with("refused by the SSRF guard"), "{error}");
    assert!(receiver.received().is_empty(), "no connection reached the receiver");
    cx.teardown().await;
}

#[tokio::test]
async fn two_dispatchers_on_one_store_deliver_each_event_once() {
    let cx = context("wh_replicas", |_| {}).await;
    cx.lift_velocity(&cx.tenant.customer_id).await;
    let limits = gateway_server::store::LimitOverrides { daily: Some(1000), ..Default::default() };
    ops::set_limits(cx.store(), &cx.tenant.customer_id, &limits).await.unwrap();
    let receiver = Receiver::start().await;
    endpoint(&cx, &receiver.url("/"), "all").await;
    let mut config = cx.config.clone();
    config.listen = "127.0.0.1:0".parse().unwrap();
    let second = gateway_server::start_server(slog::Logger::root(slog::Discard, slog::o!()), &config).await.unwrap();
    let sends = (0..60).map(|i| {
        let client = cx.client.clone();
        async move { client.message_send(&text("main", &format!("+1415555{:04}", 2000 + i), "x")).await }
    });
    assert!(futures::future::join_all(sends).await.iter().all(|r| r.is_ok()));
    let got = receiver.wait_for(60, WAIT).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let got_all = receiver.received();
    assert_eq!(got_all.len(), 60, "no event twice (got {})", got.len());
    let ids: std::collections::BTreeSet<_> =
        got_all.iter().map(|r| r.header("x-gateway-event-id").unwrap().to_string()).collect();
    assert_eq!(ids.len(), 60);
    second.close().await.unwrap();
    cx.teardown().await;
}

/// A test context whose own server does not dispatch (grace 300 ms, timeout 5 s), and
/// the configuration of a server that does, on the same store, with `slots` slots.
async fn stopping_context(name: &str, slots: usize) -> (TestContext, Config) {
    let cx = context(name, |c| {
        c.webhooks.dispatch = false;
        c.webhooks.timeout_ms = 5_000;
        c.webhooks.shutdown_grace_ms = 300;
        c.webhooks.concurrency = slots;
    })
    .await;
    let mut config = cx.config.clone();
    config.listen = "127.0.0.1:0".parse().unwrap();
    config.webhooks.dispatch = true;
    (cx, config)
}

/// How many undelivered events are claimed: due only when a lease (35 s here) ends.
async fn leased(cx: &TestContext) -> i64 {
    use sqlx::{Connection, Row};
    sqlx::any::install_default_drivers();
    let mut conn = sqlx::AnyConnection::connect(&cx.config.database_url).await.unwrap();
    let soon = chrono::Utc::now().timestamp_millis() + 20_000;
    let sql = format!("SELECT count(*) FROM outbox WHERE delivered_at IS NULL AND available_at > {soon}");
    sqlx::query(&sql).fetch_one(&mut conn).await.unwrap().try_get::<i64, _>(0).unwrap()
}

fn quiet() -> slog::Logger {
    slog::Logger::root(slog::Discard, slog::o!())
}

#[tokio::test]
async fn a_shutdown_finishes_or_gives_back_what_is_in_flight() {
    // Grace 300 ms, timeout 5 s: a delivery hanging at shutdown is stopped and its
    // event made due again at once (not only when its lease ends). The test context's
    // own server does not dispatch; `first` and `next` do, on the same store.
    let (cx, config) = stopping_context("wh_shutdown", 64).await;
    let first = gateway_server::start_server(quiet(), &config).await.unwrap();
    let receiver = Receiver::start().await;
    receiver.script([Behaviour::Hang(Duration::from_secs(10))]);
    endpoint(&cx, &receiver.url("/"), "all").await;
    send(&cx, "+14155550140").await;
    let got = receiver.wait_for(1, WAIT).await;
    let id = event_number(got[0].header("x-gateway-event-id"));
    let started = std::time::Instant::now();
    first.close().await.unwrap();
    assert!(started.elapsed() < Duration::from_secs(3), "the grace period bounds the shutdown");
    let event = cx.store().outbox_event(id).await.unwrap().unwrap();
    assert_eq!((event.delivered_at, event.attempts), (None, 0), "not finished, not counted");
    assert!(cx.store().attempts_of_event(id).await.unwrap().is_empty());
    // The next process delivers it at once, without waiting for the lease (35 s).
    let next = gateway_server::start_server(quiet(), &config).await.unwrap();
    let got = receiver.wait_for(2, Duration::from_secs(3)).await;
    assert_eq!(got[1].header("x-gateway-event-id"), got[0].header("x-gateway-event-id"));
    assert_eq!(outcome(&cx, id).await, "delivered");
    next.close().await.unwrap();
    cx.teardown().await;
}

#[tokio::test]
async fn a_shutdown_gives_back_at_once_what_was_claimed_and_not_started() {
    // Two slots, both held by hanging deliveries; the dispatcher has claimed the next
    // events ahead of the slots. At shutdown those are given back with the ones in
    // flight, so the next process delivers every event at once (their leases would
    // run 35 s).
    let (cx, config) = stopping_context("wh_claimed_ahead", 2).await;
    let receiver = Receiver::start().await;
    receiver.script([Behaviour::Hang(Duration::from_secs(10)), Behaviour::Hang(Duration::from_secs(10))]);
    endpoint(&cx, &receiver.url("/"), "all").await;
    for i in 0..5 {
        send(&cx, &format!("+1415555{:04}", 150 + i)).await;
    }
    let first = gateway_server::start_server(quiet(), &config).await.unwrap();
    receiver.wait_for(2, WAIT).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(receiver.received().len(), 2, "no more requests in flight than slots");
    assert_eq!(leased(&cx).await, 4, "two in flight and two claimed ahead of the slots");
    first.close().await.unwrap();
    assert_eq!(leased(&cx).await, 0, "every claim given back at the stop");
    let next = gateway_server::start_server(quiet(), &config).await.unwrap();
    let got = receiver.wait_for(7, Duration::from_secs(3)).await;
    let ids: std::collections::BTreeSet<_> = got.iter().map(|r| r.header("x-gateway-event-id").unwrap()).collect();
    assert_eq!(ids.len(), 5, "every event, the two stopped ones twice");
    next.close().await.unwrap();
    cx.teardown().await;
}

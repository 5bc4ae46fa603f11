//! The Evolution adapter against a fake Evolution server (sdk-tests/src/fake_evolution.rs)
//! on its own port: the instance calls and the error envelope, then sends through the
//! gateway end to end (text, media, not on the network, closed connection, and a 5xx
//! after the message went out, which is an unknown outcome, not a failure).

use crate::{expect_error, text};
use gateway_sdk_tests::TestContext;
use gateway_sdk_tests::fake_evolution::FakeEvolution;
use gateway_server::ops;
use gateway_server::provider::evolution::{Connect, Evolution, EvolutionError, WebhookTarget};
use std::time::Duration;

const KEY: &str = "global-key-for-tests";

#[tokio::test]
async fn instance_calls_and_the_error_envelope() {
    let fake = FakeEvolution::start(KEY).await;
    let evolution = Evolution::new(&fake.url(), KEY, Duration::from_secs(2));
    let hook = WebhookTarget {
        url: "https://gw.example/ingress".into(),
        header: "x-gateway-ingress".into(),
        secret: "s3cret".into(),
    };
    let created = evolution.create_instance("ins_a", Some(&hook)).await.unwrap();
    assert!(created.token.is_some());
    assert_eq!(created.qr, None, "a QR of count 0 is no QR");
    let stored = fake.instance("ins_a").unwrap();
    assert_eq!(stored.webhook.as_ref().unwrap()["headers"]["x-gateway-ingress"], "s3cret");
    assert_eq!(stored.webhook.as_ref().unwrap()["events"].as_array().unwrap().len(), 8);
    // Pairing: a QR, then a pairing code for a number, then connected.
    let Connect::Qr(qr) = evolution.connect("ins_a", None).await.unwrap() else { panic!("a QR") };
    assert!(qr.base64.as_deref().unwrap().starts_with("data:image/png;base64,"));
    assert_eq!(qr.pairing_code, None);
    let Connect::Qr(qr) = evolution.connect("ins_a", Some("+5511999999999")).await.unwrap() else { panic!("a QR") };
    assert_eq!(qr.pairing_code.as_deref(), Some("WZYEH1YY"));
    assert_eq!(evolution.connection_state("ins_a").await.unwrap(), "connecting");
    fake.open("ins_a");
    assert_eq!(evolution.connect("ins_a", None).await.unwrap(), Connect::Open);
    assert_eq!(evolution.connection_state("ins_a").await.unwrap(), "open");
    evolution.set_webhook("ins_a", &hook).await.unwrap();
    evolution.logout("ins_a").await.unwrap();
    assert_eq!(evolution.connection_state("ins_a").await.unwrap(), "close");
    assert!(matches!(evolution.logout("ins_a").await, Err(EvolutionError::Rejected { status: 400, .. })));
    assert!(matches!(
        evolution.create_instance("ins_a", None).await,
        Err(EvolutionError::Rejected { status: 403, .. })
    ));
    let wrong = Evolution::new(&fake.url(), "not-the-key", Duration::from_secs(2));
    assert_eq!(wrong.connection_state("ins_a").await, Err(EvolutionError::Unauthorized));
    assert_eq!(wrong.create_instance("ins_b", None).await.unwrap_err(), EvolutionError::Unauthorized);
    evolution.delete("ins_a").await.unwrap();
    assert_eq!(evolution.connection_state("ins_a").await, Err(EvolutionError::NotFound));
    // Nothing listening: unreachable, not a provider answer.
    let nowhere = Evolution::new("http://127.0.0.1:9", KEY, Duration::from_secs(2));
    assert!(matches!(nowhere.connection_state("x").await, Err(EvolutionError::Unreachable(_))));
}

async fn evolution_context(name: &str, fake: &FakeEvolution) -> TestContext {
    let cx = TestContext::with(
        name,
        |c| {
            fake.configure(c);
            c.provider_timeout_ms = 2_000;
            // Media URLs on loopback (a receiver of the test's) are fetched.
            c.allow_loopback_targets = true;
        },
        None,
    )
    .await;
    // The default tenant's instance was created at the provider; pair it.
    fake.open(&cx.tenant.instance_id);
    let synced = ops::sync_instance_state(cx.store(), &cx.config, &cx.tenant.instance_id).await.unwrap();
    assert_eq!((synced.provider.as_str(), synced.connection_state.as_str()), ("evolution", "open"));
    cx
}

#[tokio::test]
async fn sends_go_through_evolution_with_typed_failures() {
    let fake = FakeEvolution::start(KEY).await;
    let cx = evolution_context("evo_send", &fake).await;
    let sent = cx.client.message_send(&text("main", "+1 415 555 0150", "Your order has shipped")).await.unwrap();
    let calls = fake.sent();
    assert_eq!(calls.len(), 1);
    let (instance, route, body) = &calls[0];
    assert_eq!((instance.as_str(), route.as_str()), (cx.tenant.instance_id.as_str(), "sendText"));
    assert_eq!((body["number"].as_str(), body["text"].as_str()), (Some("14155550150"), Some("Your order has shipped")));
    assert_eq!(sent.message_id.len(), 20, "the provider's key.id: {}", sent.message_id);
    assert_eq!(sent.status, "sent");

    // Not on the network: a clean failure (quota given back, message.failed).
    fake.not_on_network("14155550151");
    let e = expect_error(cx.client.message_send(&text("main", "+14155550151", "x")).await, 502, "gateway_send_failed");
    assert_eq!(e.details["reason"], "recipient_not_on_network");
    let events = cx.store().outbox_events(&cx.tenant.customer_id).await.unwrap();
    let failed: Vec<_> = events.iter().filter(|(t, _)| t == "message.failed").collect();
    assert_eq!(failed.len(), 1);
    assert_eq!(failed[0].1["error"], "recipient_not_on_network");

    // A 5xx after the message went out: unknown, not failed.
    fake.fail_after_send("14155550152");
    let e = expect_error(cx.client.message_send(&text("main", "+14155550152", "x")).await, 502, "gateway_send_failed");
    assert_eq!(e.details["reason"], "provider_outcome_unknown");
    assert_eq!(fake.sent().len(), 2, "the fake did send it");
    let log = cx.store().recent_log(&cx.tenant.customer_id, 1).await.unwrap();
    assert_eq!((log[0].1.decision.as_str(), log[0].1.status.as_str()), ("allowed", "unknown"));
    let events = cx.store().outbox_events(&cx.tenant.customer_id).await.unwrap();
    assert_eq!(events.iter().filter(|(t, _)| t == "message.failed").count(), 1, "no message.failed for it");

    // A document with its file name, as base64.
    let body = serde_json::json!({"instance_id": "main", "phone": "+14155550153", "message_purpose": "transactional",
        "media_type": "document", "mime_type": "application/pdf", "file_name": "invoice.pdf",
        "media": "JVBERi0xLjcKMSAwIG9iago8PD4+CmVuZG9iago=", "caption": "Invoice 2041"});
    let (status, answer) = cx.send_json(&body).await;
    assert_eq!(status, 200, "{answer}");
    let (_, route, sent_body) = fake.sent().pop().unwrap();
    assert_eq!(route, "sendMedia");
    assert_eq!(
        (sent_body["mediatype"].as_str(), sent_body["fileName"].as_str(), sent_body["caption"].as_str()),
        (Some("document"), Some("invoice.pdf"), Some("Invoice 2041"))
    );
    assert_eq!(sent_body["media"], "JVBERi0xLjcKMSAwIG9iago8PD4+CmVuZG9iago=");

    // A media URL is fetched by the gateway, through its guard, and the provider gets
    // the content: it never resolves the name itself.
    let files = gateway_sdk_tests::receiver::Receiver::start().await;
    files.script([gateway_sdk_tests::receiver::Behaviour::Answer(200, Vec::new(), "%PDF-1.7\nfetched".into())]);
    let body = serde_json::json!({"instance_id": "main", "phone": "+14155550153", "message_purpose": "transactional",
        "media_type": "document", "mime_type": "application/pdf", "file_name": "statement.pdf",
        "media": files.url("/statement.pdf")});
    let (status, answer) = cx.send_json(&body).await;
    assert_eq!(status, 200, "{answer}");
    let (_, _, sent_body) = fake.sent().pop().unwrap();
    assert_eq!(sent_body["media"], "JVBERi0xLjcKZmV0Y2hlZA==", "base64 of the fetched bytes, not the URL");

    // Logged out (by the operator): the provider refuses (Connection Closed), a clean failure.
    let out = ops::logout_instance(cx.store(), &cx.config, &cx.tenant.instance_id).await.unwrap();
    assert_eq!(out.connection_state, "close");
    assert_eq!(fake.instance(&cx.tenant.instance_id).unwrap().state, "close");
    let e = expect_error(cx.client.message_send(&text("main", "+14155550154", "x")).await, 502, "gateway_send_failed");
    assert_eq!(e.details["reason"], "provider_rejected");
    cx.teardown().await;
}

#[tokio::test]
async fn pairing_shows_the_qr_or_says_it_expired_and_creation_failures_keep_nothing() {
    let fake = FakeEvolution::start(KEY).await;
    let cx = evolution_context("evo_qr", &fake).await;
    let customer = cx.tenant.customer_id.clone();
    ops::set_limits(cx.store(), &customer, &Default::default()).await.unwrap();
    let scale = ops::assign_plan(cx.store(), &customer, "scale", true).await.unwrap();
    assert_eq!(scale.plan.as_deref(), Some("scale"));
    let second = ops::create_instance(cx.store(), &cx.config, &customer, "second", false).await.unwrap();
    assert_eq!((second.provider.as_str(), second.connection_state.as_str()), ("evolution", "close"));
    assert!(fake.instance(&second.id).is_some(), "created at the provider under the gateway's id");
    let qr = ops::instance_qr(cx.store(), &cx.config, &second.id, None).await.unwrap();
    assert_eq!(qr["state"], "qr_pending");
    assert!(qr["qr"].as_str().unwrap().starts_with("data:image/png;base64,"));
    assert_eq!(cx.store().instance(&second.id).await.unwrap().connection_state, "connecting");
    let paired = ops::instance_qr(cx.store(), &cx.config, &second.id, Some("+5511999999999")).await.unwrap();
    assert_eq!(paired["pairing_code"], "WZYEH1YY");
    // The provider returns {"count": 0}: asked again, then reported as expired.
    fake.qr_count_zero(true);
    let expired = ops::instance_qr(cx.store(), &cx.config, &second.id, None).await.unwrap();
    assert_eq!(expired["state"], "qr_expired");
    fake.qr_count_zero(false);
    fake.open(&second.id);
    let open = ops::instance_qr(cx.store(), &cx.config, &second.id, None).await.unwrap();
    assert_eq!(open["state"], "open");
    assert_eq!(cx.store().instance(&second.id).await.unwrap().connection_state, "open");
    // A creation the provider refuses leaves no instance behind.
    let mut config = cx.config.clone();
    config.evolution_api_key = Some("wrong".into());
    let refused = ops::create_instance(cx.store(), &config, &customer, "third", false).await;
    assert!(refused.unwrap_err().to_string().contains("did not create"));
    assert!(cx.store().find_instance(&customer, "third").await.unwrap().is_none());
    // A connected simulator instance needs no QR.
    let sim = ops::create_instance_with(cx.store(), &cx.config, &customer, "sim", "simulator", true).await.unwrap();
    assert_eq!(ops::instance_qr(cx.store(), &cx.config, &sim.id, None).await.unwrap()["state"], "open");
    cx.teardown().await;
}

#[tokio::test]
async fn the_simulator_pairs_with_a_real_qr_and_the_operators_confirmation() {
    let cx = TestContext::with("sim_pairing", |c| c.connection_debounce_ms = 50, None).await;
    let customer = cx.tenant.customer_id.clone();
    ops::assign_plan(cx.store(), &customer, "scale", true).await.unwrap();
    let sim = ops::create_instance(cx.store(), &cx.config, &customer, "front-desk", false).await.unwrap();
    assert!(ops::confirm_pairing(cx.store(), &sim.id).await.is_err(), "no QR shown yet");
    let qr = ops::instance_qr(cx.store(), &cx.config, &sim.id, None).await.unwrap();
    assert_eq!(qr["state"], "qr_pending");
    let data_url = qr["qr"].as_str().unwrap();
    let svg = {
        use base64::Engine;
        let b64 = data_url.strip_prefix("data:image/svg+xml;base64,").unwrap();
        String::from_utf8(base64::engine::general_purpose::STANDARD.decode(b64).unwrap()).unwrap()
    };
    assert!(svg.contains("<svg") && svg.contains("<path"), "a real QR image");
    assert!(qr["qr_code"].as_str().unwrap().starts_with("SIMPAIR-"));
    assert_eq!(cx.store().latest_qr(&sim.id).await.unwrap().0.as_deref(), Some(data_url));
    let paired = ops::confirm_pairing(cx.store(), &sim.id).await.unwrap();
    assert_eq!(paired.connection_state, "open");
    assert_eq!(cx.store().latest_qr(&sim.id).await.unwrap().0, None);
    // Customers hear of it once it held.
    let mut connected = Vec::new();
    for _ in 0..100 {
        connected = cx
            .store()
            .outbox_events(&customer)
            .await
            .unwrap()
            .into_iter()
            .filter(|(t, _)| t == "instance.connected")
            .collect();
        if !connected.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(connected.len(), 1);
    assert_eq!(connected[0].1["instance_id"], sim.id.as_str());
    cx.teardown().await;
}

/// A support ticket quotes the `x-request-id` the caller got (or its own
/// `X-Correlation-Id`): the same id is on every log line of the request, in the
/// message-log row and in the provider's request.
#[tokio::test]
async fn a_request_is_followed_by_its_id_from_the_caller_to_the_provider_and_the_log() {
    let fake = FakeEvolution::start(KEY).await;
    let cx = evolution_context("evo_trace", &fake).await;
    let body = serde_json::json!({"instance_id": "main", "phone": "+14155550160",
                                  "message_purpose": "transactional", "message": "Your order has shipped"});
    let response = cx
        .http
        .post(format!("{}/api/send-message", cx.base_url))
        .bearer_auth(&cx.tenant.api_key)
        .header("x-correlation-id", "ticket-4711")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let request_id = response.headers()["x-request-id"].to_str().unwrap().to_string();
    assert!(!request_id.is_empty());
    assert_eq!(fake.request_ids(), [Some(request_id.clone())], "the provider got the id");
    let (_, row) = cx.store().recent_log(&cx.tenant.customer_id, 1).await.unwrap().remove(0);
    assert_eq!((row.request_id.as_deref(), row.correlation_id.as_deref()), (Some(&*request_id), Some("ticket-4711")));
    // A refusal before the body is read keeps them too.
    let refused = cx
        .http
        .post(format!("{}/api/send-message", cx.base_url))
        .bearer_auth(&cx.tenant.api_key)
        .header("x-correlation-id", "ticket-4712")
        .header("content-type", "application/json")
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 400);
    let refused_id = refused.headers()["x-request-id"].to_str().unwrap().to_string();
    let (_, row) = cx.store().recent_log(&cx.tenant.customer_id, 1).await.unwrap().remove(0);
    assert_eq!((row.request_id.as_deref(), row.correlation_id.as_deref()), (Some(&*refused_id), Some("ticket-4712")));
    // The send writes one JSON log line (its decision, status and time), with the
    // request id and, beside it, the correlation id. The log is written by a thread of
    // its own: read until the line is there.
    let mut lines: Vec<serde_json::Value> = Vec::new();
    for _ in 0..100 {
        let log = std::fs::read_to_string(cx.config.log_file.as_deref().unwrap()).unwrap();
        lines = log
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|l| l["req_id"] == request_id.as_str())
            .collect();
        if !lines.is_empty() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(lines.len(), 1, "the request's lines: {lines:?}");
    assert_eq!(lines[0]["msg"], "send accepted", "{lines:?}");
    assert_eq!(
        (lines[0]["status"].as_u64(), lines[0]["hdr_x_correlation_id"].as_str()),
        (Some(200), Some("ticket-4711"))
    );
    assert!(lines[0]["latency_us"].as_u64().is_some() && lines[0]["uri"] == "/api/send-message", "{lines:?}");
    // The customer finds the row in the dashboard by either id.
    use gateway_sdk_tests::dashboard::signed_in;
    use gateway_server::dashboard::roles::Role;
    let owner =
        signed_in(cx.store(), &cx.config, &cx.base_url, Some(&cx.tenant.customer_id), "owner@t.example", Role::Owner)
            .await;
    for id in [request_id.as_str(), "ticket-4711"] {
        let page = owner.get(&format!("/messages?request={id}")).await;
        assert_eq!(page.status, 200);
        assert!(page.body.contains("+14155550160") && !page.body.contains("ticket-4712"), "{}", page.body);
    }
    cx.teardown().await;
}

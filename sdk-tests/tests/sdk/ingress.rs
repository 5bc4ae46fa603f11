//! The provider ingress: Evolution-shaped posts (reference §1.5) to the unpublished
//! route, and the customer events, inbound log, opt-outs and states they lead to.

use crate::{expect_error, text};
use gateway_sdk_tests::TestContext;
use gateway_sdk_tests::fake_evolution::FakeEvolution;
use gateway_server::ops;
use serde_json::{Value, json};

const KEY: &str = "global-key-for-tests";

struct Setup {
    cx: TestContext,
    fake: FakeEvolution,
    secret: String,
}

async fn setup(name: &str) -> Setup {
    setup_with(name, |_| {}).await
}

/// Connection changes told after 100 ms; the delivery watchdog out of the way.
async fn setup_with(name: &str, change: impl FnOnce(&mut gateway_server::config::Config)) -> Setup {
    let fake = FakeEvolution::start(KEY).await;
    let cx = TestContext::with(
        name,
        |c| {
            fake.configure(c);
            c.connection_debounce_ms = 100;
            c.delivery_ack_timeout_ms = 3_600_000;
            change(c);
        },
        None,
    )
    .await;
    fake.open(&cx.tenant.instance_id);
    ops::sync_instance_state(cx.store(), &cx.config, &cx.tenant.instance_id).await.unwrap();
    // The gateway gave the provider the ingress URL and secret when it created the
    // instance; the fake kept them.
    let webhook = fake.instance(&cx.tenant.instance_id).unwrap().webhook.unwrap();
    assert!(
        webhook["url"].as_str().unwrap().ends_with(&format!("/internal/provider/evolution/{}", cx.tenant.instance_id))
    );
    let secret = webhook["headers"]["x-gateway-ingress"].as_str().unwrap().to_string();
    let s = Setup { cx, fake, secret };
    // Pairing was told to customers, once it held.
    s.wait_events("instance.connected", 1).await;
    s
}

impl Setup {
    /// The fake provider posts the event to the webhook the gateway gave it.
    async fn post(&self, envelope: &Value) -> u16 {
        self.fake.emit(&self.cx.tenant.instance_id, envelope).await
    }

    async fn post_as(&self, instance: &str, secret: Option<&str>, envelope: &Value) -> u16 {
        let mut request =
            self.cx.http.post(format!("{}/internal/provider/evolution/{instance}", self.cx.base_url)).json(envelope);
        if let Some(secret) = secret {
            request = request.header("x-gateway-ingress", secret);
        }
        request.send().await.unwrap().status().as_u16()
    }

    async fn events(&self) -> Vec<(String, Value)> {
        self.cx.store().outbox_events(&self.cx.tenant.customer_id).await.unwrap()
    }

    async fn events_named(&self, name: &str) -> Vec<Value> {
        self.events().await.into_iter().filter(|(t, _)| t == name).map(|(_, p)| p).collect()
    }

    /// Waits until `n` events of this name are in the outbox (written by a worker).
    async fn wait_events(&self, name: &str, n: usize) -> Vec<Value> {
        for _ in 0..200 {
            let events = self.events_named(name).await;
            if events.len() >= n {
                return events;
            }
            tokio::time::sleep(std::time::Duration::from_millis(25)).await;
        }
        panic!("fewer than {n} {name} events: {:?}", self.events().await);
    }
}

fn upsert(remote: &str, id: &str, text: &str, extra_key: Value) -> Value {
    let mut key = json!({"remoteJid": remote, "fromMe": false, "id": id});
    if let (Some(k), Value::Object(extra)) = (key.as_object_mut(), extra_key) {
        k.extend(extra);
    }
    json!({"event": "messages.upsert", "instance": "x", "data": {"key": key, "pushName": "Ana", "status": "DELIVERY_ACK",
           "message": {"conversation": text}, "messageType": "conversation", "messageTimestamp": 1763771103,
           "instanceId": "uuid", "source": "android"},
           "destination": "…", "date_time": "2025-11-21T21:25:03.966Z", "sender": "5511888888888@s.whatsapp.net",
           "server_url": "http://evo:8080", "apikey": null})
}

fn status(id: &str, remote: &str, status: &str) -> Value {
    json!({"event": "messages.update", "instance": "x", "data": {"keyId": id, "remoteJid": remote, "fromMe": true,
           "participant": null, "status": status, "pollUpdates": null, "instanceId": "uuid"}})
}

/// The ingress's events of an instance without a webhook endpoint are written done
/// (`skipped_no_endpoint`), as a send's are (`webhooks.rs`): with a dispatcher that
/// polls once an hour, none is left pending.
#[tokio::test]
async fn events_of_an_instance_without_an_endpoint_are_written_done() {
    use sqlx::Connection;
    let s = setup_with("ing_noend", |c| c.webhooks.poll_interval_ms = 3_600_000).await;
    assert_eq!(s.post(&upsert("5511999990002@s.whatsapp.net", "B1", "hi", json!({}))).await, 200);
    s.wait_events("message.received", 1).await;
    sqlx::any::install_default_drivers();
    let mut conn = sqlx::AnyConnection::connect(&s.cx.config.database_url).await.unwrap();
    let sql = format!("SELECT id FROM outbox WHERE customer_id = '{}' ORDER BY id", s.cx.tenant.customer_id);
    let ids: Vec<i64> = sqlx::query_scalar(sql.as_str()).fetch_all(&mut conn).await.unwrap();
    assert!(ids.len() >= 2, "instance.connected and message.received, at least");
    for id in ids {
        let event = s.cx.store().outbox_event(id).await.unwrap().unwrap();
        assert_eq!(event.outcome.as_deref(), Some("skipped_no_endpoint"), "{}", event.event_type);
        assert_eq!(event.delivered_at, Some(event.created_at));
    }
    conn.close().await.unwrap();
    s.cx.teardown().await;
}

#[tokio::test]
async fn only_the_instance_secret_gets_in_and_accepted_posts_are_stored() {
    let s = setup("ing_auth").await;
    let body = upsert("5511999990001@s.whatsapp.net", "A1", "hello", json!({}));
    assert_eq!(s.post_as(&s.cx.tenant.instance_id, None, &body).await, 401);
    assert_eq!(s.post_as(&s.cx.tenant.instance_id, Some("ing_wrong"), &body).await, 401);
    assert_eq!(s.post_as("ins_unknown", Some(&s.secret), &body).await, 401);
    let before = s.events().await.len();
    assert_eq!(before, 1, "only the pairing's instance.connected, nothing from refused posts");
    assert_eq!(s.post(&body).await, 200);
    assert_eq!(s.events_named("message.received").await.len(), 1);

    // The secret is checked before the body is read: a wrong secret with a body the
    // sender never finishes is answered 401 at once. A right one with an oversize
    // body is 413, at once when its length is declared.
    let url = format!("{}/internal/provider/evolution/{}", s.cx.base_url, s.cx.tenant.instance_id);
    let endless = futures::stream::repeat_with(|| Ok::<_, std::io::Error>(bytes::Bytes::from(vec![b' '; 64 * 1024])));
    let unfinished =
        s.cx.http
            .post(&url)
            .header("x-gateway-ingress", "ing_wrong")
            .header("content-type", "application/json")
            .body(reqwest::Body::wrap_stream(endless))
            .timeout(std::time::Duration::from_secs(10))
            .send()
            .await;
    assert_eq!(unfinished.map(|r| r.status().as_u16()).ok(), Some(401), "answered without reading the body");
    let big = vec![b' '; 2 * 1024 * 1024];
    let oversize = s.cx.http.post(&url).header("x-gateway-ingress", &s.secret).body(big.clone()).send().await.unwrap();
    assert_eq!(oversize.status(), 413);
    let streamed = futures::stream::iter(
        big.chunks(64 * 1024).map(|c| Ok::<_, std::io::Error>(bytes::Bytes::copy_from_slice(c))).collect::<Vec<_>>(),
    );
    let chunked =
        s.cx.http
            .post(&url)
            .header("x-gateway-ingress", &s.secret)
            .body(reqwest::Body::wrap_stream(streamed))
            .send()
            .await;
    assert!(chunked.is_err() || chunked.unwrap().status() == 413, "no declared length: refused once past the cap");
    s.cx.teardown().await;
}

#[tokio::test]
async fn an_inbound_message_is_logged_once_and_becomes_message_received() {
    let s = setup("ing_inbound").await;
    let body = upsert("5511999990002@s.whatsapp.net", "3AE99D6A1DBF3F9A0578", "Is my order ready?", json!({}));
    assert_eq!(s.post(&body).await, 200);
    assert_eq!(s.post(&body).await, 200, "the provider repeats itself");
    let received = s.events_named("message.received").await;
    assert_eq!(received.len(), 1, "one event for a duplicate post");
    let e = &received[0];
    assert_eq!((e["from"].as_str(), e["message_text"].as_str()), (Some("+5511999990002"), Some("Is my order ready?")));
    assert_eq!(e["external_message_id"], "3AE99D6A1DBF3F9A0578");
    assert_eq!(e["instance_id"], s.cx.tenant.instance_id.as_str());
    assert_eq!(e["timestamp"], "2025-11-22T00:25:03.000Z", "the message's own time, not date_time");
    let typed: gateway_client::events::MessageReceived = serde_json::from_value(e.clone()).unwrap();
    assert_eq!(typed.message_type.as_deref(), Some("conversation"));
    let inbound = s.cx.store().recent_inbound(&s.cx.tenant.customer_id, 10).await.unwrap();
    assert_eq!(
        inbound,
        vec![("+5511999990002".into(), Some("Is my order ready?".into()), "3AE99D6A1DBF3F9A0578".into())]
    );
    // Our own messages, status broadcasts and echoes are not inbound messages.
    let mine = json!({"event": "messages.upsert", "data": {"key": {"remoteJid": "5511@s.whatsapp.net", "fromMe": true, "id": "B"}}});
    assert_eq!(s.post(&mine).await, 200);
    assert_eq!(s.post(&upsert("status@broadcast", "C", "story", json!({}))).await, 200);
    assert_eq!(s.events_named("message.received").await.len(), 1);
    s.cx.teardown().await;
}

#[tokio::test]
async fn a_lid_sender_is_resolved_through_the_learned_map() {
    let s = setup("ing_lid").await;
    let first = upsert(
        "13718@lid",
        "L1",
        "Oi",
        json!({"remoteJidAlt": "5511999990003@s.whatsapp.net", "addressingMode": "lid"}),
    );
    assert_eq!(s.post(&first).await, 200);
    // Later messages carry only the @lid id.
    assert_eq!(s.post(&upsert("13718@lid", "L2", "Tudo bem?", json!({}))).await, 200);
    let received = s.events_named("message.received").await;
    assert_eq!(received.len(), 2);
    assert!(received.iter().all(|e| e["from"] == "+5511999990003"), "{received:?}");
    // An unknown @lid stays as it is rather than being guessed.
    assert_eq!(s.post(&upsert("99999@lid", "L3", "?", json!({}))).await, 200);
    assert_eq!(s.events_named("message.received").await[2]["from"], "99999@lid");
    s.cx.teardown().await;
}

#[tokio::test]
async fn stop_suppresses_the_sender_and_start_lifts_only_an_opt_out() {
    let s = setup("ing_optout").await;
    assert_eq!(s.post(&upsert("5511999990004@s.whatsapp.net", "S1", "  Stop ", json!({}))).await, 200);
    let opted = s.events_named("recipient.opted_out").await;
    assert_eq!(opted.len(), 1);
    assert_eq!(
        (opted[0]["from"].as_str(), opted[0]["reason"].as_str()),
        (Some("+5511999990004"), Some("opt_out_keyword"))
    );
    let e = expect_error(
        s.cx.client.message_send(&text("main", "+5511999990004", "hi")).await,
        403,
        "recipient_suppressed",
    );
    assert_eq!(e.error, "recipient_suppressed");
    assert_eq!(s.post(&upsert("5511999990004@s.whatsapp.net", "S2", "START", json!({}))).await, 200);
    assert!(s.cx.client.message_send(&text("main", "+5511999990004", "hi")).await.is_ok(), "START lifted the opt-out");
    // Arabic, and a manual suppression that START does not lift.
    assert_eq!(s.post(&upsert("5511999990005@s.whatsapp.net", "S3", "إلغاء", json!({}))).await, 200);
    assert_eq!(s.events_named("recipient.opted_out").await.len(), 2);
    s.cx.store().add_suppression(&s.cx.tenant.customer_id, "+5511999990006", "asked by phone", "manual").await.unwrap();
    assert_eq!(s.post(&upsert("5511999990006@s.whatsapp.net", "S4", "start", json!({}))).await, 200);
    expect_error(s.cx.client.message_send(&text("main", "+5511999990006", "hi")).await, 403, "recipient_suppressed");
    // "stop please" is a message, not a keyword.
    assert_eq!(s.post(&upsert("5511999990007@s.whatsapp.net", "S5", "stop please", json!({}))).await, 200);
    assert_eq!(s.events_named("recipient.opted_out").await.len(), 2);
    s.cx.teardown().await;
}

#[tokio::test]
async fn statuses_never_go_back_and_duplicates_are_dropped() {
    let s = setup("ing_status").await;
    let remote = "5511999990008@s.whatsapp.net";
    assert_eq!(s.post(&status("M1", remote, "READ")).await, 200);
    assert_eq!(s.post(&status("M1", remote, "DELIVERY_ACK")).await, 200, "out of order");
    assert_eq!(s.post(&status("M1", remote, "READ")).await, 200, "duplicate");
    assert_eq!(s.post(&status("M1", remote, "PLAYED")).await, 200, "played after read");
    assert_eq!(s.events_named("message.read").await.len(), 1);
    assert!(s.events_named("message.delivered").await.is_empty(), "never back from read to delivered");
    assert_eq!(s.post(&status("M2", remote, "SERVER_ACK")).await, 200);
    assert_eq!(s.post(&status("M2", remote, "DELIVERY_ACK")).await, 200);
    let delivered = s.events_named("message.delivered").await;
    assert_eq!(delivered.len(), 1);
    assert_eq!(
        (delivered[0]["from"].as_str(), delivered[0]["status"].as_str()),
        (Some("+5511999990008"), Some("DELIVERY_ACK"))
    );
    assert_eq!(s.events_named("message.status_updated").await.len(), 1, "SERVER_ACK");
    s.cx.teardown().await;
}

#[tokio::test]
async fn the_providers_echo_settles_a_send_whose_outcome_was_unknown() {
    let fake = FakeEvolution::start(KEY).await;
    let s = {
        let cx = TestContext::with(
            "ing_settle",
            |c| {
                fake.configure(c);
            },
            None,
        )
        .await;
        fake.open(&cx.tenant.instance_id);
        ops::sync_instance_state(cx.store(), &cx.config, &cx.tenant.instance_id).await.unwrap();
        let secret = fake.instance(&cx.tenant.instance_id).unwrap().webhook.unwrap()["headers"]["x-gateway-ingress"]
            .as_str()
            .unwrap()
            .to_string();
        Setup { cx, fake, secret }
    };
    s.fake.fail_after_send("5511999990009");
    let e = expect_error(
        s.cx.client.message_send(&text("main", "+5511999990009", "Your code")).await,
        502,
        "gateway_send_failed",
    );
    assert_eq!(e.details["reason"], "provider_outcome_unknown");
    assert!(s.events_named("message.sent").await.is_empty());
    let echo = json!({"event": "send.message", "instance": "x", "data": {
        "key": {"remoteJid": "5511999990009@s.whatsapp.net", "fromMe": true, "id": "BAE5FAB1846ED6FE"},
        "pushName": "", "status": "PENDING", "message": {"conversation": "Your code"}, "messageType": "conversation"}});
    assert_eq!(s.post(&echo).await, 200);
    let sent = s.events_named("message.sent").await;
    assert_eq!(sent.len(), 1);
    assert_eq!(
        (sent[0]["to"].as_str(), sent[0]["message_id"].as_str()),
        (Some("+5511999990009"), Some("BAE5FAB1846ED6FE"))
    );
    assert_eq!(sent[0]["message_purpose"], "transactional");
    let log = s.cx.store().recent_log(&s.cx.tenant.customer_id, 1).await.unwrap();
    assert_eq!((log[0].1.status.as_str(), log[0].1.provider_message_id.as_deref()), ("sent", Some("BAE5FAB1846ED6FE")));
    // A second echo settles nothing more.
    assert_eq!(s.post(&echo).await, 200);
    assert_eq!(s.events_named("message.sent").await.len(), 1);
    s.cx.teardown().await;
}

#[tokio::test]
async fn connection_qr_call_and_group_events() {
    let s = setup("ing_lifecycle").await;
    let connection = |state: &str, reason: i64| json!({"event": "connection.update", "instance": "x", "data": {"instance": "x", "state": state, "statusReason": reason}});
    // Already open (paired in setup): no change, no event.
    assert_eq!(s.post(&connection("open", 200)).await, 200);
    // A close with 401 is a logout; it is told once it has held (100 ms here).
    assert_eq!(s.post(&connection("close", 401)).await, 200);
    assert_eq!(s.cx.store().instance(&s.cx.tenant.instance_id).await.unwrap().connection_state, "close", "at once");
    let down = s.wait_events("instance.disconnected", 1).await;
    assert_eq!(down[0]["connection_state"], "logged_out");
    assert_eq!(s.post(&connection("connecting", 200)).await, 200);
    s.wait_events("instance.connection_updated", 1).await;
    assert_eq!(s.post(&connection("open", 200)).await, 200);
    s.wait_events("instance.connected", 2).await;
    assert_eq!(s.cx.store().instance(&s.cx.tenant.instance_id).await.unwrap().connection_state, "open");
    let qr = json!({"event": "qrcode.updated", "instance": "x", "data": {"qrcode": {"instance": "x", "pairingCode": null,
                    "code": "2@y8fQ", "base64": "data:image/png;base64,iVBORw0KGgo"}}});
    assert_eq!(s.post(&qr).await, 200);
    let limit = json!({"event": "qrcode.updated", "data": {"message": "QR code limit reached, please login again", "statusCode": 500}});
    assert_eq!(s.post(&limit).await, 200);
    let qrs = s.events_named("instance.qr_updated").await;
    assert_eq!((qrs[0]["qr_available"].as_bool(), qrs[1]["qr_available"].as_bool()), (Some(true), Some(false)));
    // The dashboard reads the latest QR: gone once the provider stopped issuing codes.
    let (latest, at) = s.cx.store().latest_qr(&s.cx.tenant.instance_id).await.unwrap();
    assert_eq!((latest, at.is_some()), (None, true));
    assert_eq!(s.post(&qr).await, 200);
    let (latest, _) = s.cx.store().latest_qr(&s.cx.tenant.instance_id).await.unwrap();
    assert_eq!(latest.as_deref(), Some("data:image/png;base64,iVBORw0KGgo"));
    let call = |status: &str| {
        json!({"event": "call", "instance": "x", "data": {"chatId": "5511999990010@s.whatsapp.net",
               "from": "5511999990010@s.whatsapp.net", "callerPn": "5511999990010@s.whatsapp.net", "isGroup": false,
               "id": "A1B2C3", "date": "2025-11-21T21:30:00.000Z", "isVideo": false, "status": status}})
    };
    assert_eq!(s.post(&call("offer")).await, 200);
    assert_eq!(s.post(&call("timeout")).await, 200);
    let received = s.events_named("call.received").await;
    assert_eq!(
        (received[0]["from"].as_str(), received[0]["call_status"].as_str()),
        (Some("+5511999990010"), Some("offer"))
    );
    assert_eq!(s.events_named("call.missed").await.len(), 1);
    let groups = json!({"event": "groups.upsert", "data": [{"id": "120363041967849074@g.us", "subject": "Ops Team"},
                                                          {"id": "120363041967849075@g.us", "subject": "Sales"}]});
    assert_eq!(s.post(&groups).await, 200);
    assert_eq!(s.events_named("group.updated").await.len(), 2);
    let group_message =
        upsert("120363041967849074@g.us", "G1", "shift swap?", json!({"participant": "5511999990011@s.whatsapp.net"}));
    assert_eq!(s.post(&group_message).await, 200);
    let g = s.events_named("group.message_received").await;
    assert_eq!(
        (g[0]["group_id"].as_str(), g[0]["from"].as_str()),
        (Some("120363041967849074@g.us"), Some("+5511999990011"))
    );
    assert!(s.events_named("message.received").await.is_empty(), "a group message is not a direct one");
    let logout = json!({"event": "logout.instance", "data": null});
    assert_eq!(s.post(&logout).await, 200);
    s.wait_events("instance.disconnected", 2).await;
    s.cx.teardown().await;
}

#[tokio::test]
async fn a_flapping_connection_is_not_told_and_a_refused_number_is_a_suspected_ban() {
    let s = setup_with("ing_flap", |c| c.connection_debounce_ms = 600).await;
    let connection = |state: &str, reason: i64| json!({"event": "connection.update", "instance": "x", "data": {"instance": "x", "state": state, "statusReason": reason}});
    // Auto-reconnect: open → connecting → open within the debounce period.
    for _ in 0..3 {
        assert_eq!(s.post(&connection("connecting", 428)).await, 200);
        assert_eq!(s.post(&connection("open", 200)).await, 200);
    }
    tokio::time::sleep(std::time::Duration::from_millis(900)).await;
    let told: Vec<_> = s.events().await.into_iter().filter(|(t, _)| t.starts_with("instance.")).collect();
    assert_eq!(told.len(), 1, "only the pairing, no event for a flap: {told:?}");
    let instance = || async { s.cx.store().instance(&s.cx.tenant.instance_id).await.unwrap() };
    assert_eq!(s.cx.store().lifecycle(&instance().await).await.unwrap(), "connected");
    // A close with 403: the network refuses the number.
    assert_eq!(s.post(&connection("close", 403)).await, 200);
    let down = s.wait_events("instance.disconnected", 1).await;
    assert_eq!(down[0]["connection_state"], "ban_suspected");
    assert_eq!(s.cx.store().lifecycle(&instance().await).await.unwrap(), "ban_suspected");
    // Pairing again until the QR limit: refused, told as such.
    assert_eq!(s.post(&connection("connecting", 200)).await, 200);
    s.wait_events("instance.connection_updated", 1).await;
    assert_eq!(s.cx.store().lifecycle(&instance().await).await.unwrap(), "qr_pending");
    let limit = json!({"event": "qrcode.updated", "data": {"message": "QR code limit reached, please login again", "statusCode": 500}});
    assert_eq!(s.post(&limit).await, 200);
    assert_eq!(s.post(&connection("refused", 500)).await, 200);
    let down = s.wait_events("instance.disconnected", 2).await;
    assert_eq!(down[1]["connection_state"], "refused");
    assert_eq!(s.cx.store().lifecycle(&instance().await).await.unwrap(), "disconnected");
    s.cx.teardown().await;
}

#[tokio::test]
async fn a_message_never_acknowledged_as_delivered_fails_with_no_delivery_ack() {
    // The acknowledgement follows its send at once, well inside the timeout even on a
    // slow machine; the other send is never acknowledged.
    let s = setup_with("ing_watchdog", |c| c.delivery_ack_timeout_ms = 1_000).await;
    let acked = s.cx.client.message_send(&text("main", "+5511999990020", "one")).await.unwrap();
    assert_eq!(s.post(&status(&acked.message_id, "5511999990020@s.whatsapp.net", "DELIVERY_ACK")).await, 200);
    let pending = s.cx.client.message_send(&text("main", "+5511999990021", "two")).await.unwrap();
    let failed = s.wait_events("message.failed", 1).await;
    assert_eq!(
        (failed[0]["to"].as_str(), failed[0]["error"].as_str()),
        (Some("+5511999990021"), Some("no_delivery_ack"))
    );
    tokio::time::sleep(std::time::Duration::from_millis(1_500)).await;
    assert_eq!(s.events_named("message.failed").await.len(), 1, "once, and not for the acknowledged one");
    assert_ne!(acked.message_id, pending.message_id);
    s.cx.teardown().await;
}

#[tokio::test]
async fn the_rest_of_the_mapping_table() {
    let s = setup("ing_mapping").await;
    let call = |id: &str, status: &str| {
        json!({"event": "call", "instance": "x", "data": {"chatId": "5511999990030@s.whatsapp.net",
               "from": "5511999990030@s.whatsapp.net", "isGroup": false, "id": id, "isVideo": false, "status": status}})
    };
    // Ended without anyone answering: missed. Answered, then ended: not missed.
    for (id, statuses) in [
        ("C1", vec!["offer", "terminate"]),
        ("C2", vec!["offer", "accept", "terminate"]),
        ("C3", vec!["offer", "reject"]),
    ] {
        for status in statuses {
            assert_eq!(s.post(&call(id, status)).await, 200);
        }
    }
    assert_eq!(s.post(&call("C1", "terminate")).await, 200, "a repeat");
    assert_eq!(s.events_named("call.received").await.len(), 3);
    assert_eq!(s.events_named("call.missed").await.len(), 2, "C1 and C3");
    // A status ERROR for a message we sent: message.failed with its recipient and purpose.
    let sent = s.cx.client.message_send(&text("main", "+5511999990031", "hello")).await.unwrap();
    assert_eq!(s.post(&status(&sent.message_id, "5511999990031@s.whatsapp.net", "ERROR")).await, 200);
    let failed = s.events_named("message.failed").await;
    assert_eq!(
        (failed[0]["to"].as_str(), failed[0]["message_purpose"].as_str(), failed[0]["error"].as_str()),
        (Some("+5511999990031"), Some("transactional"), Some("provider_error"))
    );
    // Participants changed: group.updated.
    let participants = json!({"event": "group-participants.update", "data": {"id": "120363041967849076@g.us",
        "participants": ["5511999990032@s.whatsapp.net"], "action": "add"}});
    assert_eq!(s.post(&participants).await, 200);
    assert_eq!(s.events_named("group.updated").await[0]["group_id"], "120363041967849076@g.us");
    // status.instance closed (a permanent close): disconnected.
    let closed = json!({"event": "status.instance", "data": {"instance": "x", "status": "closed",
        "disconnectionAt": "2025-11-21T21:30:00.000Z", "disconnectionReasonCode": 401}});
    assert_eq!(s.post(&closed).await, 200);
    s.wait_events("instance.disconnected", 1).await;
    s.cx.teardown().await;
}

#[tokio::test]
async fn a_conversation_window_opens_with_a_message_and_closes_after_a_day() {
    let s = setup("ing_window").await;
    let now_s = gateway_server::store::now_ms() / 1000;
    let at = |id: &str, text: &str, t: i64| {
        let mut body = upsert("5511999990040@s.whatsapp.net", id, text, json!({}));
        body["data"]["messageTimestamp"] = json!(t);
        body
    };
    assert_eq!(s.post(&at("W1", "hi", now_s - 60)).await, 200);
    assert_eq!(s.post(&at("W2", "still there?", now_s)).await, 200);
    let opened = s.events_named("conversation.updated").await;
    assert_eq!(opened.len(), 1, "one window for both messages");
    assert_eq!(
        (opened[0]["conversation_id"].as_str(), opened[0]["conversation_state"].as_str()),
        (Some("+5511999990040"), Some("open"))
    );
    // Not yet closed; a day after the last message it is reported closed, once.
    let now = gateway_server::store::now_ms();
    assert_eq!(s.cx.store().close_conversations(now).await.unwrap(), 0);
    let day_later = now + 24 * 3_600_000 + 1_000;
    assert_eq!(s.cx.store().close_conversations(day_later).await.unwrap(), 1);
    assert_eq!(s.cx.store().close_conversations(day_later).await.unwrap(), 0);
    let updates = s.events_named("conversation.updated").await;
    assert_eq!(updates[1]["conversation_state"], "closed");
    s.cx.teardown().await;
}

#[tokio::test]
async fn posts_apply_while_sends_are_written_at_the_same_time() {
    // On SQLite the ingress and the send path's writer share one database file: a post
    // must wait for the lock, never fail because a send committed meanwhile.
    let s = setup("ing_concurrent").await;
    s.cx.lift_velocity(&s.cx.tenant.customer_id).await;
    let limits = gateway_server::store::LimitOverrides { daily: Some(1000), ..Default::default() };
    ops::set_limits(s.cx.store(), &s.cx.tenant.customer_id, &limits).await.unwrap();
    let sends = (0..40).map(|i| {
        let client = s.cx.client.clone();
        async move { client.message_send(&text("main", &format!("+55119999{:05}", 50000 + i), "x")).await.is_ok() }
    });
    let setup = &s;
    // Inbound messages, and statuses (whose apply reads before it writes).
    let posts = (0..80).map(|i| {
        let body = if i % 2 == 0 {
            upsert(&format!("55119999{:05}@s.whatsapp.net", 60000 + i), &format!("P{i}"), "hi", json!({}))
        } else {
            status(&format!("S{i}"), "5511999960000@s.whatsapp.net", "DELIVERY_ACK")
        };
        async move { setup.post(&body).await }
    });
    let (sent, posted) =
        futures::future::join(futures::future::join_all(sends), futures::future::join_all(posts)).await;
    assert!(sent.iter().all(|ok| *ok));
    assert!(posted.iter().all(|status| *status == 200));
    assert_eq!(s.cx.store().provider_event_failures().await.unwrap(), 0, "every post applied");
    assert_eq!(s.events_named("message.received").await.len(), 40);
    assert_eq!(s.events_named("message.delivered").await.len(), 40);
    s.cx.teardown().await;
}

#[tokio::test]
async fn a_reply_lifts_the_cap_on_messages_to_someone_who_never_replied() {
    let s = setup("ing_reply_lifts_cap").await;
    s.cx.lift_velocity(&s.cx.tenant.customer_id).await;
    let to = "+5511999990077";
    let body = |n: u32| {
        json!({"instance_id": "main", "phone": to, "message_purpose": "support",
                               "message": format!("Update {n} about your ticket")})
    };
    for n in 0..10 {
        assert_eq!(s.cx.send_json(&body(n)).await.0, 200, "send {n}");
    }
    let r = crate::expect_raw(s.cx.send_json(&body(10)).await, 403, "policy_violation");
    assert_eq!(r["details"]["rule"], "unreplied_recipient_limit");
    // They write back through the provider: a conversation, no longer a cold contact.
    assert_eq!(s.post(&upsert("5511999990077@s.whatsapp.net", "R1", "thanks!", json!({}))).await, 200);
    assert_eq!(s.cx.send_json(&body(11)).await.0, 200);
    s.cx.teardown().await;
}

#[tokio::test]
async fn the_inbound_log_exports_as_csv_with_the_instance_filter() {
    let s = setup("ing_inbound_csv").await;
    let hostile = [" =1+1", "\n=1+1", "\t@SUM(A1)", "\u{FF1D}1+1", "\u{FF0B}1+1", "\u{FF0D}1+1", "\u{FF20}SUM(A1)"];
    let texts = ["Is my order ready?", "=HYPERLINK(\"http://127.0.0.1/\",\"click\")"];
    for (i, text) in texts.iter().chain(&hostile).enumerate() {
        let body =
            upsert(&format!("551199999000{i}@s.whatsapp.net"), &format!("3AE99D6A1DBF3F9A057{i}"), text, json!({}));
        assert_eq!(s.post(&body).await, 200);
    }
    let cx = &s.cx;
    let owner = gateway_sdk_tests::dashboard::signed_in(
        cx.store(),
        &cx.config,
        &cx.base_url,
        Some(&cx.tenant.customer_id),
        "owner@inbound.example",
        gateway_server::dashboard::roles::Role::Owner,
    )
    .await;
    let page = owner.get(&format!("/inbound-logs?instance={}", cx.tenant.instance_id)).await;
    assert!(page.body.contains(&format!("href=\"/exports/inbound.csv?instance={}\"", cx.tenant.instance_id)));
    let csv = owner.get(&format!("/exports/inbound.csv?instance={}", cx.tenant.instance_id)).await;
    assert_eq!(csv.status, 200);
    assert!(csv.content_type.starts_with("text/csv"));
    let mut reader = csv::Reader::from_reader(csv.body.as_bytes());
    let header: Vec<String> = reader.headers().unwrap().iter().map(str::to_string).collect();
    let rows: Vec<Vec<String>> = reader.records().map(|r| r.unwrap().iter().map(str::to_string).collect()).collect();
    assert_eq!(rows.len(), 2 + hostile.len(), "{}", csv.body);
    let text = header.iter().position(|h| h == "text").expect("a text column");
    let from = header.iter().position(|h| h == "from").expect("a from column");
    let mut exported: Vec<&str> = rows.iter().map(|r| r[text].as_str()).collect();
    exported.sort();
    let mut expected: Vec<String> = hostile.iter().map(|t| format!("'{t}")).collect();
    expected.extend(["'=HYPERLINK(\"http://127.0.0.1/\",\"click\")".to_string(), "Is my order ready?".to_string()]);
    expected.sort();
    assert_eq!(exported, expected, "every formula is defused, behind whitespace or in fullwidth form too");
    assert!(rows.iter().any(|r| r[from] == "+5511999990000"));
    s.cx.teardown().await;
}

/// The provider's echo of a send (`send.message`) settles the `unknown` send it belongs
/// to: the row that holds its id if one does, else, by recipient, the instance's own
/// send logged closest before the provider took the message, and never another
/// instance's (the provider's instance is the one it posts for).
#[tokio::test]
async fn an_echo_settles_the_send_it_belongs_to_and_never_another_instances() {
    use gateway_server::ingress::evolution::Fact;
    use gateway_server::store::now_ms;
    use sqlx::{Connection, Executor};
    const LOST: &str = "+15005550003"; // the simulator takes it, then the connection breaks
    let cx = TestContext::new("ing_echo_match").await;
    let (store, customer) = (cx.store(), cx.tenant.customer_id.clone());
    ops::assign_plan(store, &customer, "scale", true).await.unwrap();
    cx.lift_velocity(&customer).await;
    let second = ops::create_instance(store, &cx.config, &customer, "second", true).await.unwrap();
    store.set_instance_age(&second.id, 30).await.unwrap();
    let lost = |instance: &str| json!({"instance_id": instance, "phone": LOST, "message_purpose": "transactional", "message": "Your code"});
    // Two sends of `main` and one of `second` to the same recipient: outcome unknown.
    let mut ids = Vec::new();
    for instance in ["main", "main", "second"] {
        let (status, body) = cx.send_json(&lost(instance)).await;
        assert_eq!(status, 502, "{body}");
        assert_eq!(body["details"]["reason"], "provider_outcome_unknown");
        ids.push(store.recent_log(&customer, 1).await.unwrap()[0].0);
    }
    let (a, b, c) = (ids[0], ids[1], ids[2]);
    // Logged 60 s, 20 s and 10 s ago.
    sqlx::any::install_default_drivers();
    let mut conn = sqlx::AnyConnection::connect(&cx.config.database_url).await.unwrap();
    let now = now_ms();
    for (id, ago) in [(a, 60_000), (b, 20_000), (c, 10_000)] {
        conn.execute(format!("UPDATE message_log SET created_at = {} WHERE id = {id}", now - ago).as_str())
            .await
            .unwrap();
    }
    let main = store.instance(&cx.tenant.instance_id).await.unwrap();
    let second = store.instance(&second.id).await.unwrap();
    let echo = |id: &str, seconds_ago: Option<i64>| Fact::SentEcho {
        external_id: id.into(),
        remote_jid: "15005550003@s.whatsapp.net".into(),
        timestamp: seconds_ago.map(|s| (now_ms() - s * 1000) / 1000),
    };
    let row = |id: i64| async move {
        let e = store.log_entry(id).await.unwrap();
        (e.status, e.provider_message_id)
    };
    let unknown = ("unknown".to_string(), None);

    // The provider took E1 59 s ago: `main`'s send of 60 s ago, not its newer one, and
    // not `second`'s (closer in time, another instance).
    let applied = store.apply_facts(&main, &[echo("E1", Some(59))], now_ms()).await.unwrap();
    assert_eq!(applied.events, ["message.sent"]);
    assert_eq!(row(a).await, ("sent".to_string(), Some("E1".to_string())));
    assert_eq!((row(b).await, row(c).await), (unknown.clone(), unknown.clone()));
    // E1 again: the row that holds the id is its send; nothing else is touched.
    let again = store.apply_facts(&main, &[echo("E1", None)], now_ms()).await.unwrap();
    assert_eq!((again.events.len(), again.skipped), (0, 1));
    assert_eq!(row(b).await, unknown, "a duplicate echo never settles another send");
    // The echo of a send that was answered (its row holds the id) settles nothing.
    let (status, sent) = cx
        .send_json(&json!({"instance_id": "main", "phone": "+14155550177", "message_purpose": "transactional",
                           "message": "Your code"}))
        .await;
    assert_eq!(status, 200, "{sent}");
    let answered = sent["message_id"].as_str().unwrap();
    let applied = store.apply_facts(&main, &[echo(answered, None)], now_ms()).await.unwrap();
    assert_eq!((applied.events.len(), applied.skipped), (0, 1));
    assert_eq!(row(b).await, unknown);
    // No time given: the one logged last before the echo came, `main`'s other send.
    let applied = store.apply_facts(&main, &[echo("E2", None)], now_ms()).await.unwrap();
    assert_eq!(applied.events, ["message.sent"]);
    assert_eq!(row(b).await, ("sent".to_string(), Some("E2".to_string())));
    // `main` has no unknown send left: its echo never settles `second`'s.
    let applied = store.apply_facts(&main, &[echo("E3", None)], now_ms()).await.unwrap();
    assert_eq!((applied.events.len(), applied.skipped), (0, 1));
    assert_eq!(row(c).await, unknown, "never across instances");
    let applied = store.apply_facts(&second, &[echo("E4", Some(9))], now_ms()).await.unwrap();
    assert_eq!(applied.events, ["message.sent"]);
    assert_eq!(row(c).await, ("sent".to_string(), Some("E4".to_string())));

    // A send still in flight (pending) logged after an unknown one: an echo without a
    // time is most likely the in-flight send's (its answer will name it), so the
    // unknown send is left alone; an echo timed before the in-flight send settles it.
    let (status, _) = cx.send_json(&lost("main")).await;
    assert_eq!(status, 502);
    let d = store.recent_log(&customer, 1).await.unwrap()[0].0;
    let (status, _) = cx.send_json(&lost("main")).await;
    assert_eq!(status, 502);
    let pending = store.recent_log(&customer, 1).await.unwrap()[0].0;
    conn.execute(format!("UPDATE message_log SET created_at = {} WHERE id = {d}", now_ms() - 30_000).as_str())
        .await
        .unwrap();
    conn.execute(
        format!("UPDATE message_log SET status = 'pending', created_at = {} WHERE id = {pending}", now_ms() - 5_000)
            .as_str(),
    )
    .await
    .unwrap();
    let applied = store.apply_facts(&main, &[echo("E5", None)], now_ms()).await.unwrap();
    assert_eq!((applied.events.len(), applied.skipped), (0, 1));
    assert_eq!(row(d).await, unknown);
    let applied = store.apply_facts(&main, &[echo("E6", Some(29))], now_ms()).await.unwrap();
    assert_eq!(applied.events, ["message.sent"]);
    assert_eq!(row(d).await, ("sent".to_string(), Some("E6".to_string())));
    // Each settled send's event names its row.
    let linked: i64 = sqlx::query_scalar(
        format!("SELECT COUNT(*) FROM outbox WHERE event_type = 'message.sent' AND log_id IN ({a}, {b}, {c}, {d})")
            .as_str(),
    )
    .fetch_one(&mut conn)
    .await
    .unwrap();
    assert_eq!(linked, 4);
    conn.close().await.ok();
    cx.teardown().await;
}

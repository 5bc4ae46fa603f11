//! Successful sends: text and each media form, the log row and the outbox event.

use crate::text;
use gateway_client::types::{MediaType, MessagePurpose, SendMessageRequest};
use gateway_sdk_tests::TestContext;
use gateway_sdk_tests::receiver::{Behaviour, Receiver};

const PNG: &[u8] = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR\0\0\0\x01";
const PDF: &[u8] = b"%PDF-1.7\n1 0 obj\n<<>>\nendobj\n";
const OGG: &[u8] = b"OggS\0\x02\0\0\0\0\0\0\0\0";

fn b64(bytes: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

fn media(media_type: MediaType, mime: &str, name: &str, media: String, caption: Option<&str>) -> SendMessageRequest {
    SendMessageRequest {
        instance_id: "main".into(),
        phone: "+5511987654321".into(),
        message_purpose: MessagePurpose::Support,
        message: Some("fallback caption".into()),
        caption: caption.map(str::to_string),
        file_name: Some(name.into()),
        media: Some(media),
        media_type: Some(media_type),
        mime_type: Some(mime.into()),
    }
}

#[tokio::test]
async fn text_send_returns_the_success_body_logs_it_and_writes_message_sent() {
    let cx = TestContext::new("text_send").await;
    let sent = cx.client.message_send(&text("main", "+1 415 555 0123", "Your order has shipped")).await.unwrap();
    assert_eq!(sent.status(), 200);
    assert!(sent.success);
    assert_eq!(sent.status, "sent");
    assert!(sent.message_id.starts_with("SIM"));
    assert_eq!(sent.message_type.as_deref(), Some("text"));
    let row = cx.store().log_entry(sent.log_id).await.unwrap();
    assert_eq!(row.decision, "allowed");
    assert_eq!(row.status, "sent");
    assert_eq!(row.recipient.as_deref(), Some("+14155550123"));
    assert_eq!(row.purpose.as_deref(), Some("transactional"));
    assert_eq!(row.provider_message_id.as_deref(), Some(sent.message_id.as_str()));
    assert_eq!(row.instance_id.as_deref(), Some(cx.tenant.instance_id.as_str()));
    let events = cx.store().outbox_events(&cx.tenant.customer_id).await.unwrap();
    assert_eq!(events.len(), 1);
    let (kind, event) = &events[0];
    assert_eq!(kind, "message.sent");
    assert_eq!(event["event"], "message.sent");
    assert_eq!(event["instance_id"], cx.tenant.instance_id);
    assert_eq!(event["instance_name"], "main");
    assert_eq!(event["to"], "+14155550123");
    assert_eq!(event["message_purpose"], "transactional");
    assert_eq!(event["message_id"], sent.message_id);
    assert!(chrono::DateTime::parse_from_rfc3339(event["timestamp"].as_str().unwrap()).is_ok());
    cx.teardown().await;
}

#[tokio::test]
async fn base64_data_url_and_https_url_media_are_sent() {
    let cx = TestContext::with("media_send", |c| c.allow_loopback_targets = true, None).await;
    cx.lift_velocity(&cx.tenant.customer_id).await;
    // The gateway fetches a media URL itself (loopback only because the test sets the
    // development flag), following a redirect.
    let files = Receiver::start().await;
    let pdf = String::from_utf8(PDF.to_vec()).unwrap();
    files.script([
        Behaviour::Answer(302, vec![("location".into(), "/files/b.pdf".into())], String::new()),
        Behaviour::Answer(200, vec![("content-type".into(), "application/pdf".into())], pdf),
    ]);
    let cases = [
        media(MediaType::Image, "image/png", "a.png", b64(PNG), Some("Receipt")),
        media(
            MediaType::Document,
            "application/pdf",
            "invoice.pdf",
            format!("data:application/pdf;base64,{}", b64(PDF)),
            None,
        ),
        media(MediaType::Audio, "audio/ogg", "note.ogg", b64(OGG), None),
        media(MediaType::Document, "application/pdf", "b.pdf", files.url("/b.pdf"), None),
    ];
    for request in cases {
        let expected = request.media_type.unwrap().to_string();
        let sent = cx.client.message_send(&request).await.unwrap_or_else(|e| panic!("{expected}: {e:?}"));
        assert_eq!(sent.message_type.as_deref(), Some(expected.as_str()));
        let row = cx.store().log_entry(sent.log_id).await.unwrap();
        assert_eq!(row.message_type.as_deref(), Some(expected.as_str()));
    }
    let fetched: Vec<String> = files.received().iter().map(|r| format!("{} {}", r.method, r.path)).collect();
    assert_eq!(fetched, ["GET /b.pdf", "GET /files/b.pdf"]);
    cx.teardown().await;
}

#[tokio::test]
async fn every_attempt_leaves_one_log_row() {
    let cx = TestContext::new("log_rows").await;
    let key = format!("Bearer {}", cx.tenant.api_key);
    cx.client.message_send(&text("main", "+14155550123", "ok")).await.unwrap();
    let _ = cx.client.message_send(&text("nope", "+14155550123", "x")).await;
    let _ = cx.client.message_send(&text("main", "+15005550001", "x")).await;
    let _ = cx.raw_send("{bad", &[("authorization", key.as_bytes()), ("content-type", b"application/json")]).await;
    let rows = cx.store().recent_log(&cx.tenant.customer_id, 10).await.unwrap();
    let codes: Vec<Option<&str>> = rows.iter().rev().map(|(_, r)| r.error_code.as_deref()).collect();
    assert_eq!(codes, [None, Some("invalid_instance"), Some("gateway_send_failed"), Some("invalid_json")]);
    let decisions: Vec<&str> = rows.iter().rev().map(|(_, r)| r.decision.as_str()).collect();
    assert_eq!(decisions, ["allowed", "refused", "allowed", "refused"]);
    assert_eq!(rows[2].1.policy.as_deref(), Some("gateway/instance"));
    cx.teardown().await;
}

#[tokio::test]
async fn last_used_at_is_recorded() {
    let cx = TestContext::new("last_used").await;
    cx.client.message_send(&text("main", "+14155550123", "ok")).await.unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let key = cx.store().api_key_by_hash(&gateway_server::apikey::hash(&cx.tenant.api_key)).await.unwrap().unwrap();
        if key.last_used_at.is_some() {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "timed out waiting for last_used_at to be written");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    cx.teardown().await;
}

#[tokio::test]
async fn the_simulator_reports_delivered_then_read_like_a_network() {
    let cx = TestContext::with("sim_statuses", |c| c.simulator_status_delay_ms = 50, None).await;
    let sent = cx.client.message_send(&text("main", "+14155550190", "Your order has shipped")).await.unwrap();
    let mut names = Vec::new();
    for _ in 0..100 {
        let events = cx.store().outbox_events(&cx.tenant.customer_id).await.unwrap();
        names = events.iter().map(|(t, _)| t.clone()).collect::<Vec<_>>();
        if names.len() >= 3 {
            let read = &events[2].1;
            assert_eq!(read["external_message_id"], sent.message_id.as_str());
            assert_eq!(read["from"], "+14155550190");
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert_eq!(names, ["message.sent", "message.delivered", "message.read"]);
    cx.teardown().await;
}

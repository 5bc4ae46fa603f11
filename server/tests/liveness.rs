//! A crash costs seconds, not a provider timeout; no request waits on another; and once
//! the provider took a message, no answer invites a retry that sends it twice. With the
//! real binary (SIGKILL, a second replica, a store that goes away under a settle), on
//! SQLite and on PostgreSQL when `GATEWAY_TEST_DATABASE_URL` is set.

mod common;

use common::{Db, free_port, run_json};
use gateway_server::store::{LogEntry, ORPHAN_REASON, Store};
use serde_json::{Value, json};
use std::collections::HashMap;
use std::process::Command;
use std::time::{Duration, Instant};

/// The simulator never answers for this number (a provider that hangs).
const HANGS: &str = "+15005550002";
/// The simulator takes the message and answers after 2 s.
const SLOW: &str = "+15005550004";

fn gateway(url: &str, args: &[&str], env: &[(&str, &str)]) -> Command {
    let mut command = common::gateway(url, args, env);
    command.env("GATEWAY_POLICIES__BUNDLED", "0");
    command
}

/// A demo tenant with limits out of the way and the PBX module on, and a PBX integration
/// (no HMAC): (API key, customer id, integration id, PBX secret).
fn tenant(url: &str) -> (String, String, String, String) {
    let demo = run_json(gateway(url, &["demo"], &[]));
    let customer = demo["customer_id"].as_str().unwrap().to_string();
    let lift = "1000000";
    let limits = ["customer", "limits", "--customer", &customer, "--daily", lift, "--monthly", lift];
    let rates = ["--instance-per-minute", lift, "--recipient-per-minute", lift];
    run_json(gateway(url, &[&limits[..], &rates[..]].concat(), &[]));
    run_json(gateway(url, &["customer", "modules", "--customer", &customer, "--pbx", "on"], &[]));
    let pbx = run_json(gateway(url, &["pbx", "create", "--customer", &customer, "--instance", "demo"], &[]));
    let integration = pbx["integration_id"].to_string();
    let secret = pbx["webhook_secret"].as_str().unwrap().to_string();
    (demo["api_key"].as_str().unwrap().to_string(), customer, integration, secret)
}

async fn serve(url: &str, env: &[(&str, &str)]) -> (common::Served, u16) {
    let port = free_port();
    let mut all = vec![("GATEWAY_WEBHOOKS__DISPATCH", "false"), ("GATEWAY_SIMULATOR_STATUS_DELAY_MS", "0")];
    all.extend_from_slice(env);
    (common::serve(gateway(url, &[], &all), port).await, port)
}

fn kill(mut child: common::Served) {
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
}

/// An answer: status, `Retry-After`, body.
type Answer = (u16, Option<String>, Value);

async fn answer(response: reqwest::Response) -> Answer {
    let status = response.status().as_u16();
    let retry_after = response.headers().get("retry-after").and_then(|v| v.to_str().ok()).map(str::to_string);
    (status, retry_after, response.json().await.unwrap_or(Value::Null))
}

async fn send(port: u16, key: &str, idem: Option<&str>, phone: &str) -> Option<Answer> {
    let body = json!({"instance_id": "demo", "phone": phone, "message_purpose": "transactional",
                      "message": "Your code is 123456"});
    let mut request =
        reqwest::Client::new().post(format!("http://127.0.0.1:{port}/api/send-message")).bearer_auth(key).json(&body);
    if let Some(idem) = idem {
        request = request.header("Idempotency-Key", idem);
    }
    Some(answer(request.send().await.ok()?).await)
}

async fn pbx_message(port: u16, integration: &str, secret: &str, external: &str, phone: &str) -> Option<Answer> {
    let body = json!({"event_type": "outbound_message", "to": phone, "message_text": "We are on our way",
                      "external_message_id": external});
    let request = reqwest::Client::new()
        .post(format!("http://127.0.0.1:{port}/integrations/pbx/webhook/{integration}"))
        .header("x-gateway-3cx-secret", secret)
        .json(&body);
    Some(answer(request.send().await.ok()?).await)
}

/// The test's own view of the store (one handle, so that polling is quick).
async fn store(url: &str) -> Store {
    Store::connect(url, 2, None).await.unwrap()
}

async fn log_rows(store: &Store, customer: &str) -> HashMap<i64, LogEntry> {
    store.recent_log(customer, 1_000).await.unwrap().into_iter().collect()
}

async fn wait_for_pending(store: &Store, customer: &str, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while log_rows(store, customer).await.values().filter(|r| r.status == "pending").count() < n {
        assert!(Instant::now() < deadline, "{n} sends reached the provider");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn assert_in_progress(answer: &Answer, what: &str) {
    let (status, retry_after, body) = answer;
    assert_eq!(*status, 409, "{what}: {body}");
    assert_eq!(body["error"], "idempotency_request_in_progress", "{what}: {body}");
    assert_eq!(retry_after.as_deref(), Some("1"), "{what}");
}

fn assert_unknown(answer: &Answer, what: &str) {
    let (status, _, body) = answer;
    assert_eq!(*status, 502, "{what}: {body}");
    assert_eq!(body["error"], "gateway_send_failed", "{what}: {body}");
    assert_eq!(body["details"]["reason"], "provider_outcome_unknown", "{what}: {body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn after_a_kill_a_retry_gets_its_definite_answer_within_seconds_with_a_60_s_provider_timeout() {
    let db = Db::new("liveness_kill").await;
    let (key, customer, integration, secret) = tenant(&db.url);
    let view = store(&db.url).await;
    let env = [("GATEWAY_PROVIDER_TIMEOUT_MS", "60000")];
    let (first, port) = serve(&db.url, &env).await;
    // A keyed send and a PBX message with an external_message_id, both at a provider
    // that hangs.
    let (k, i, s) = (key.clone(), integration.clone(), secret.clone());
    let api = tokio::spawn(async move { send(port, &k, Some("order-1"), HANGS).await });
    let pbx = tokio::spawn(async move { pbx_message(port, &i, &s, "3cx-1", HANGS).await });
    wait_for_pending(&view, &customer, 2).await;

    // While the first requests live, a repeat is told so at once; nobody waits.
    let started = Instant::now();
    assert_in_progress(&send(port, &key, Some("order-1"), HANGS).await.unwrap(), "a keyed retry");
    assert_in_progress(&pbx_message(port, &integration, &secret, "3cx-1", HANGS).await.unwrap(), "a PBX repeat");
    assert!(started.elapsed() < Duration::from_secs(2), "answered at once: {:?}", started.elapsed());

    kill(first);
    assert!(api.await.unwrap().is_none() && pbx.await.unwrap().is_none(), "no answer before the kill");
    let killed = Instant::now();
    let (second, port) = serve(&db.url, &env).await;
    // Retried as a client obeying Retry-After would: the definite answer comes once the
    // dead process's lease lapses (5 s), never after the provider timeout (60 s).
    let (mut api_answer, mut pbx_answer) = (None, None);
    while api_answer.is_none() || pbx_answer.is_none() {
        if api_answer.is_none() {
            let a = send(port, &key, Some("order-1"), HANGS).await.unwrap();
            if a.0 == 409 {
                assert_in_progress(&a, "a keyed retry while the lease holds");
            } else {
                api_answer = Some((a, killed.elapsed()));
            }
        }
        if pbx_answer.is_none() {
            let a = pbx_message(port, &integration, &secret, "3cx-1", HANGS).await.unwrap();
            if a.0 == 409 {
                assert_in_progress(&a, "a PBX repeat while the lease holds");
            } else {
                pbx_answer = Some((a, killed.elapsed()));
            }
        }
        assert!(killed.elapsed() < Duration::from_secs(20), "a definite answer within seconds");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let (api_answer, api_took) = api_answer.unwrap();
    let (pbx_answer, pbx_took) = pbx_answer.unwrap();
    eprintln!("definite answers after the kill: send-message {api_took:?}, PBX {pbx_took:?}");
    assert_unknown(&api_answer, "the keyed retry");
    assert_unknown(&pbx_answer, "the PBX repeat");
    assert_eq!(api_answer.1, None, "a definite answer: no Retry-After");
    // Later repeats get the same answer; nothing was sent again.
    assert_eq!(send(port, &key, Some("order-1"), HANGS).await.unwrap().2, api_answer.2);
    assert_eq!(pbx_message(port, &integration, &secret, "3cx-1", HANGS).await.unwrap().2, pbx_answer.2);
    let rows = log_rows(&view, &customer).await;
    assert_eq!(rows.len(), 2, "{rows:?}");
    assert!(rows.values().all(|r| r.status == "unknown" && r.reason.as_deref() == Some(ORPHAN_REASON)), "{rows:?}");
    kill(second);
    view.close().await;
    db.drop_it().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_send_whose_process_lives_is_never_swept_however_long_its_provider_call() {
    let db = Db::new("liveness_live").await;
    let (key, customer, _, _) = tenant(&db.url);
    let view = store(&db.url).await;
    // A provider timeout past the lease's lapse time (5 s), so that only liveness can
    // keep the row from another replica's sweep.
    let env = [("GATEWAY_PROVIDER_TIMEOUT_MS", "9000")];
    let ((a, port_a), (b, port_b)) = (serve(&db.url, &env).await, serve(&db.url, &env).await);
    let k = key.clone();
    let first = tokio::spawn(async move { send(port_a, &k, Some("long-1"), HANGS).await });
    wait_for_pending(&view, &customer, 1).await;
    tokio::time::sleep(Duration::from_secs(7)).await;
    let rows = log_rows(&view, &customer).await;
    assert!(rows.values().all(|r| r.status == "pending"), "the other replica swept a live send: {rows:?}");
    assert_in_progress(&send(port_b, &key, Some("long-1"), HANGS).await.unwrap(), "a retry on the other replica");
    // The owner settles it itself, by its provider timeout.
    let answer = first.await.unwrap().expect("the first request is answered");
    assert_unknown(&answer, "the first request");
    assert_eq!(answer.2["details"]["cause"], "provider_timeout", "{}", answer.2);
    let rows = log_rows(&view, &customer).await;
    let row = rows.values().next().unwrap();
    assert_eq!(row.status, "unknown");
    assert_ne!(row.reason.as_deref(), Some(ORPHAN_REASON), "settled by its owner, not swept");
    assert_eq!(send(port_b, &key, Some("long-1"), HANGS).await.unwrap().2, answer.2, "the retry replays it");
    kill(a);
    kill(b);
    view.close().await;
    db.drop_it().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_settle_the_store_refuses_still_answers_that_the_message_was_sent() {
    let db = Db::new("liveness_settle").await;
    // PostgreSQL through a proxy the test cuts; SQLite locked by another connection.
    let (url, proxy) = db.through_proxy().await;
    let (key, customer, _, _) = tenant(&url);
    let view = store(&db.url).await;
    let env = [("GATEWAY_DATABASE_TIMEOUT_MS", "1500")];
    let (server, port) = serve(&url, &env).await;
    let k = key.clone();
    // Unkeyed: the client that would send twice if told to retry.
    let sent = tokio::spawn(async move { send(port, &k, None, SLOW).await });
    wait_for_pending(&view, &customer, 1).await;
    // The store goes away while the provider takes the message.
    let lock = match &proxy {
        Some(proxy) => {
            proxy.cut();
            None
        }
        None => {
            let path = url.trim_start_matches("sqlite://").split('?').next().unwrap().to_string();
            let conn = rusqlite::Connection::open(path).unwrap();
            conn.execute_batch("BEGIN EXCLUSIVE").unwrap();
            Some(conn)
        }
    };
    let (status, retry_after, body) = sent.await.unwrap().expect("an answer");
    assert_eq!(status, 200, "the provider took it: the client is told so, never 503: {body}");
    assert_eq!(retry_after, None);
    let message_id = body["message_id"].as_str().expect("its message id").to_string();
    match (&proxy, lock) {
        (Some(proxy), _) => proxy.restore(),
        (None, Some(conn)) => conn.execute_batch("COMMIT").unwrap(),
        (None, None) => unreachable!(),
    }
    // The settle lands once the store is back: the row is sent, with its one event.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let rows = log_rows(&view, &customer).await;
        let row = rows.values().next().unwrap();
        if row.status == "sent" {
            assert_eq!(row.provider_message_id.as_deref(), Some(message_id.as_str()));
            break;
        }
        assert_eq!(row.status, "pending", "never swept while its process lives: {row:?}");
        assert!(Instant::now() < deadline, "the settle landed: {row:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let events = view.outbox_events(&customer).await.unwrap();
    let sent_events =
        events.iter().filter(|(kind, p)| kind == "message.sent" && p["message_id"] == message_id.as_str());
    assert_eq!(sent_events.count(), 1);
    view.close().await;
    kill(server);
    db.drop_it().await;
}

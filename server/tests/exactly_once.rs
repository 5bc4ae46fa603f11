//! Exactly once, with the real binary: SIGKILL under a load of sends, SIGKILL while
//! sends wait on the provider, and one idempotency key sent concurrently to two
//! replicas of one store. On SQLite, and on PostgreSQL when `GATEWAY_TEST_DATABASE_URL`
//! is set (a fresh database per test).

mod common;

use common::{Db, free_port, run_json};
use gateway_server::store::{LogEntry, Store};
use serde_json::{Value, json};
use std::collections::HashMap;
use std::process::Command;
use std::time::Duration;

/// The binary, without the bundled policies: these tests are about exactly once, not
/// the warm-up of a new number.
fn gateway(url: &str, args: &[&str], env: &[(&str, &str)]) -> Command {
    let mut command = common::gateway(url, args, env);
    command.env("GATEWAY_POLICIES__BUNDLED", "0");
    command
}

/// A demo tenant with limits out of the way; (API key, customer id).
fn tenant(url: &str) -> (String, String) {
    let demo = run_json(gateway(url, &["demo"], &[]));
    let customer = demo["customer_id"].as_str().expect("demo prints its customer").to_string();
    let lift = ["1000000"; 4];
    run_json(gateway(
        url,
        &[
            "customer",
            "limits",
            "--customer",
            &customer,
            "--daily",
            lift[0],
            "--monthly",
            lift[1],
            "--instance-per-minute",
            lift[2],
            "--recipient-per-minute",
            lift[3],
        ],
        &[],
    ));
    (demo["api_key"].as_str().unwrap().to_string(), customer)
}

async fn serve(url: &str, port: u16, env: &[(&str, &str)]) -> common::Served {
    let mut all = vec![("GATEWAY_WEBHOOKS__DISPATCH", "false"), ("GATEWAY_SIMULATOR_STATUS_DELAY_MS", "0")];
    all.extend_from_slice(env);
    common::serve(gateway(url, &[], &all), port).await
}

fn kill(mut child: common::Served) {
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
}

/// One send; status and body, or `None` when the connection failed.
async fn send(http: &reqwest::Client, port: u16, key: &str, idem: Option<&str>, phone: &str) -> Option<(u16, Value)> {
    let body = json!({"instance_id": "demo", "phone": phone, "message_purpose": "transactional", "message": "Your code is 123456"});
    let mut request = http.post(format!("http://127.0.0.1:{port}/api/send-message")).bearer_auth(key).json(&body);
    if let Some(idem) = idem {
        request = request.header("Idempotency-Key", idem);
    }
    let response = request.send().await.ok()?;
    let status = response.status().as_u16();
    let body = response.json().await.ok()?;
    Some((status, body))
}

async fn log_rows(url: &str, customer: &str) -> HashMap<i64, LogEntry> {
    let store = Store::open(url, 2, None).await.unwrap();
    let rows = store.recent_log(customer, 100_000).await.unwrap().into_iter().collect();
    store.close().await;
    rows
}

async fn sent_event_ids(url: &str, customer: &str) -> Vec<String> {
    let store = Store::open(url, 2, None).await.unwrap();
    let events = store.outbox_events(customer).await.unwrap();
    store.close().await;
    events
        .into_iter()
        .filter(|(kind, _)| kind == "message.sent")
        .map(|(_, payload)| payload["message_id"].as_str().unwrap_or_default().to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_kill_under_load_leaves_every_answered_send_with_its_row_and_event() {
    let db = Db::new("kill_load").await;
    let (key, customer) = tenant(&db.url);
    let port = free_port();
    let server = serve(&db.url, port, &[]).await;
    let http = reqwest::Client::new();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let progress = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut workers = Vec::new();
    for w in 0..8 {
        let (http, key, stop, progress) = (http.clone(), key.clone(), stop.clone(), progress.clone());
        workers.push(tokio::spawn(async move {
            let mut answered = Vec::new();
            for i in 0..10_000 {
                if stop.load(std::sync::atomic::Ordering::Relaxed) {
                    break;
                }
                let phone = format!("+1415555{:04}", (w * 1000 + i) % 10_000);
                match send(&http, port, &key, None, &phone).await {
                    Some((200, body)) => {
                        answered.push(body);
                        progress.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                    Some((status, body)) => panic!("unexpected {status}: {body}"),
                    None => break, // the process is gone
                }
            }
            answered
        }));
    }
    // Kill once the load has really run (a loaded CI machine answers slower than a
    // fixed sleep assumes), and at least a moment after it started.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while progress.load(std::sync::atomic::Ordering::Relaxed) < 40 && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    kill(server); // mid-load: requests in flight at every stage
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut answered = Vec::new();
    for w in workers {
        answered.extend(w.await.unwrap());
    }
    assert!(answered.len() > 20, "the load ran ({} answered)", answered.len());
    let rows = log_rows(&db.url, &customer).await;
    let events = sent_event_ids(&db.url, &customer).await;
    for body in &answered {
        let id = body["log_id"].as_i64().unwrap();
        let row = rows.get(&id).unwrap_or_else(|| panic!("the answered send {body} has its row"));
        assert_eq!(row.status, "sent");
        assert_eq!(row.provider_message_id.as_deref(), body["message_id"].as_str());
        assert!(events.iter().any(|m| Some(m.as_str()) == body["message_id"].as_str()), "and its event");
    }
    // Every row is settled or still pending (a request the kill cut mid-call), and every
    // sent row has exactly one event: they were written in one transaction.
    assert!(rows.values().all(|r| r.status == "sent" || r.status == "pending"));
    assert_eq!(rows.values().filter(|r| r.status == "sent").count(), events.len());
    db.drop_it().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_kill_while_sends_wait_on_the_provider_leaves_each_unknown_never_missing() {
    let db = Db::new("kill_wait").await;
    let (key, customer) = tenant(&db.url);
    let port = free_port();
    let env = [("GATEWAY_PROVIDER_TIMEOUT_MS", "3000")];
    let server = serve(&db.url, port, &env).await;
    let http = reqwest::Client::new();
    // +15005550002: the simulator never answers, as a provider that hangs.
    let pending: Vec<_> = (0..5)
        .map(|i| {
            let (http, key) = (http.clone(), key.clone());
            tokio::spawn(async move { send(&http, port, &key, Some(&format!("wait-{i}")), "+15005550002").await })
        })
        .collect();
    // Kill once all five wait at the provider (their attempt rows are written).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while log_rows(&db.url, &customer).await.values().filter(|r| r.status == "pending").count() < 5 {
        assert!(tokio::time::Instant::now() < deadline, "the five sends reached the provider");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    kill(server);
    for p in pending {
        assert!(p.await.unwrap().is_none(), "no answer came before the kill");
    }
    let rows = log_rows(&db.url, &customer).await;
    assert_eq!(rows.len(), 5, "every request the provider may have seen is in the log");
    assert!(rows.values().all(|r| r.status == "pending"));

    // The next process settles them as unknown once the provider timeout and margin pass.
    let port = free_port();
    let server = serve(&db.url, port, &env).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(45);
    loop {
        let rows = log_rows(&db.url, &customer).await;
        if rows.values().all(|r| r.status == "unknown") {
            assert!(rows.values().all(|r| r.reason.as_deref() == Some(gateway_server::store::ORPHAN_REASON)));
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "orphans settled: {rows:?}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    // A retry with its key gets the outcome at once, and nothing is sent again.
    for i in 0..5 {
        let (status, body) = send(&http, port, &key, Some(&format!("wait-{i}")), "+15005550002").await.unwrap();
        assert_eq!((status, body["details"]["reason"].as_str()), (502, Some("provider_outcome_unknown")));
    }
    assert_eq!(log_rows(&db.url, &customer).await.len(), 5);
    kill(server);
    db.drop_it().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_key_sent_twenty_times_to_two_replicas_sends_one_message() {
    let db = Db::new("two_replicas").await;
    let (key, customer) = tenant(&db.url);
    let ports = [free_port(), free_port()];
    let a = serve(&db.url, ports[0], &[]).await;
    let b = serve(&db.url, ports[1], &[]).await;
    let http = reqwest::Client::new();
    let answers = futures::future::join_all(
        (0..20).map(|i| send(&http, ports[i % 2], &key, Some("one-logical-message"), "+14155550123")),
    )
    .await;
    let answers: Vec<(u16, Value)> = answers.into_iter().map(|a| a.expect("an answer")).collect();
    assert!(answers.iter().all(|(s, _)| *s == 200 || *s == 409), "{answers:?}");
    let ids: std::collections::HashSet<i64> =
        answers.iter().filter(|(s, _)| *s == 200).map(|(_, b)| b["log_id"].as_i64().unwrap()).collect();
    assert_eq!(ids.len(), 1, "every 200 is the one message: {answers:?}");
    let rows = log_rows(&db.url, &customer).await;
    assert_eq!(rows.len(), 1);
    assert_eq!(sent_event_ids(&db.url, &customer).await.len(), 1);
    kill(a);
    kill(b);
    db.drop_it().await;
}

//! Two replicas behind a real HAProxy (Debian's), on one store: a policy module
//! installed from the CLI reaches both; then clients that retry with idempotency keys
//! send through the load balancer while one replica is killed with SIGKILL. Health
//! checks take it out; every message is sent at most once, each answered 200 exactly
//! once, the daily limit holds exactly, and each webhook event is delivered once.
//! PostgreSQL in CI (`GATEWAY_TEST_DATABASE_URL`); SQLite otherwise.

mod common;

use common::{Db, free_port, gateway, run_json};
use gateway_client::types::{MessagePurpose, SendMessageRequest};
use gateway_client::{Client, Error, RetryPolicy};
use gateway_sdk_tests::receiver::serve_json;
use gateway_sdk_tests::wasm::{Behaviour, expecting, policy};
use gateway_server::store::Store;
use serde_json::json;
use std::collections::{HashMap, HashSet};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const MESSAGES: usize = 200;
const DAILY_LIMIT: usize = 150;
const CLIENTS: usize = 8;

/// The committed `deploy/haproxy/haproxy.cfg`, its addresses replaced by loopback ports:
/// what docs/deployment.md tells operators to run is what this test runs.
fn haproxy_config(port: u16, stats: u16, a: u16, b: u16) -> String {
    let committed = include_str!("../../deploy/haproxy/haproxy.cfg");
    let replaced = committed
        .replace("bind *:8080", &format!("bind 127.0.0.1:{port}"))
        .replace("10.0.0.11:8080", &format!("127.0.0.1:{a}"))
        .replace("10.0.0.12:8080", &format!("127.0.0.1:{b}"))
        .replace("bind 127.0.0.1:8404", &format!("bind 127.0.0.1:{stats}"));
    for (was, what) in
        [("bind *:8080", "frontend"), ("10.0.0.11", "server a"), ("10.0.0.12", "server b"), (":8404", "stats")]
    {
        assert!(!replaced.contains(was), "deploy/haproxy/haproxy.cfg changed: its {what} line was not found");
    }
    replaced
}

/// The state HAProxy's health checks give each server: name -> `UP`, `DOWN`, ...
async fn server_states(http: &reqwest::Client, stats: u16) -> HashMap<String, String> {
    let Ok(response) = http.get(format!("http://127.0.0.1:{stats}/stats;csv")).send().await else {
        return HashMap::new();
    };
    let csv = response.text().await.unwrap_or_default();
    csv.lines()
        .filter(|l| l.starts_with("replicas,") && !l.starts_with("replicas,BACKEND"))
        .filter_map(|l| {
            let cols: Vec<&str> = l.split(',').collect();
            Some((cols.get(1)?.to_string(), cols.get(17)?.to_string()))
        })
        .collect()
}

async fn wait_states(http: &reqwest::Client, stats: u16, want: &[(&str, &str)], within: Duration) -> Duration {
    let started = Instant::now();
    loop {
        let states = server_states(http, stats).await;
        if want.iter().all(|(s, w)| states.get(*s).is_some_and(|v| v.starts_with(w))) {
            return started.elapsed();
        }
        assert!(started.elapsed() < within, "HAProxy's states {states:?}, wanted {want:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// What one logical message ended as.
#[derive(Debug)]
enum Ended {
    Sent(String),
    OverQuota,
    Unknown,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_replica_killed_behind_haproxy_loses_nothing_and_sends_nothing_twice() {
    let db = Db::new("lb").await;
    let demo = run_json(gateway(&db.url, &["demo"], &[]));
    let (key, customer) = (demo["api_key"].as_str().unwrap(), demo["customer_id"].as_str().unwrap());
    let instance = demo["instance_id"].as_str().unwrap();
    let lift = "1000000";
    let daily = DAILY_LIMIT.to_string();
    run_json(gateway(
        &db.url,
        &[
            "customer",
            "limits",
            "--customer",
            customer,
            "--daily",
            &daily,
            "--monthly",
            lift,
            "--instance-per-minute",
            lift,
            "--recipient-per-minute",
            lift,
        ],
        &[],
    ));
    // Every event, by id, as the customer's endpoint receives it.
    let deliveries: Arc<Mutex<Vec<String>>> = Arc::default();
    let seen = deliveries.clone();
    let (receiver, _task) = serve_json(Arc::new(move |r| {
        seen.lock().unwrap().push(r.header("x-gateway-event-id").unwrap_or("?").to_string());
        (200, json!({"ok": true}))
    }))
    .await;
    let loopback = [("GATEWAY_ALLOW_LOOPBACK_TARGETS", "1")];
    let url = format!("http://127.0.0.1:{receiver}/hook");
    run_json(gateway(
        &db.url,
        &["webhook", "set", "--instance", instance, "--url", &url, "--events", "message.sent", "--unsigned"],
        &loopback,
    ));

    // Two replicas: A delivers webhooks, B is an API-only replica (it is the one killed).
    let (port_a, port_b, port, stats) = (free_port(), free_port(), free_port(), free_port());
    let env = |dispatch: &'static str| {
        [
            ("GATEWAY_ALLOW_LOOPBACK_TARGETS", "1"),
            ("GATEWAY_WEBHOOKS__DISPATCH", dispatch),
            ("GATEWAY_SIMULATOR_STATUS_DELAY_MS", "0"),
            ("GATEWAY_PROVIDER_TIMEOUT_MS", "1000"),
            ("GATEWAY_POLICIES__BUNDLED", "0"),
        ]
    };
    let a = common::serve(gateway(&db.url, &[], &env("true")), port_a).await;
    let mut b = common::serve(gateway(&db.url, &[], &env("false")), port_b).await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("haproxy.cfg");
    std::fs::write(&config, haproxy_config(port, stats, port_a, port_b)).unwrap();
    let haproxy = Command::new("/usr/sbin/haproxy")
        .arg("-db")
        .arg("-f")
        .arg(&config)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("haproxy is installed (scripts/test installs it)");
    let http = reqwest::Client::new();
    wait_states(&http, stats, &[("a", "UP"), ("b", "UP")], Duration::from_secs(20)).await;

    // A module installed from the CLI goes live on both replicas.
    let module = dir.path().join("extra.wasm");
    std::fs::write(&module, policy("extra", "1.2.3", "content", &Behaviour::Allow, &expecting("allow"))).unwrap();
    let installed = run_json(gateway(&db.url, &["policy", "install", module.to_str().unwrap(), "--wait", "10"], &[]));
    let gateways = installed["gateways"].as_array().unwrap();
    assert_eq!(gateways.len(), 2, "{installed}");
    assert!(gateways.iter().all(|g| g["live"] == true), "{installed}");

    // The load: each client sends its share, one key per message, retrying with it.
    let base = format!("http://127.0.0.1:{port}");
    let policy =
        RetryPolicy { max_attempts: 40, base_delay: Duration::from_millis(50), max_delay: Duration::from_secs(20) };
    let done = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for c in 0..CLIENTS {
        let client = Client::with_api_key(&base, key);
        let (policy, done) = (policy.clone(), done.clone());
        tasks.push(tokio::spawn(async move {
            let mut ended = Vec::new();
            for m in 0..MESSAGES / CLIENTS {
                let body = SendMessageRequest {
                    instance_id: "demo".into(),
                    phone: format!("+1415555{:04}", c * 100 + m),
                    message_purpose: MessagePurpose::Transactional,
                    message: Some(format!("Your code is {c}{m:03}")),
                    caption: None,
                    file_name: None,
                    media: None,
                    media_type: None,
                    mime_type: None,
                };
                let outcome = match client.message_send_exactly_once(&body, &policy).await {
                    Ok(sent) => Ended::Sent(sent.message_id.clone()),
                    Err(Error::ErrorResponse(e)) if e.status().as_u16() == 429 => Ended::OverQuota,
                    Err(Error::ErrorResponse(e))
                        if e.details.get("reason").is_some_and(|r| r == "provider_outcome_unknown") =>
                    {
                        Ended::Unknown
                    }
                    Err(other) => panic!("message {c}/{m} ended with {other:?}"),
                };
                ended.push(outcome);
                done.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            ended
        }));
    }
    // SIGKILL replica B once a quarter of the messages are through.
    while done.load(std::sync::atomic::Ordering::Relaxed) < MESSAGES / 4 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    b.kill().unwrap();
    b.wait().unwrap();
    let out_after = wait_states(&http, stats, &[("b", "DOWN")], Duration::from_secs(10)).await;
    let mut ended = Vec::new();
    for task in tasks {
        ended.extend(task.await.unwrap());
    }
    let sent: Vec<&String> =
        ended.iter().filter_map(|e| if let Ended::Sent(id) = e { Some(id) } else { None }).collect();
    let over = ended.iter().filter(|e| matches!(e, Ended::OverQuota)).count();
    let unknown = ended.iter().filter(|e| matches!(e, Ended::Unknown)).count();
    eprintln!(
        "health checks took B out {out_after:?} after the kill; sent {}, over quota {over}, unknown {unknown}",
        sent.len()
    );
    assert_eq!(ended.len(), MESSAGES);
    assert_eq!(sent.iter().collect::<HashSet<_>>().len(), sent.len(), "no message id twice");
    // Unknown outcomes keep their quota: the daily limit holds exactly.
    assert_eq!(sent.len() + unknown, DAILY_LIMIT, "allowed sends");
    assert_eq!(over, MESSAGES - DAILY_LIMIT);

    // The store agrees: one allowed row per key, none pending, the counter exact.
    let store = Store::open(&db.url, 2, None).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let rows = loop {
        let rows: Vec<_> = store.recent_log(customer, 100_000).await.unwrap().into_iter().map(|(_, r)| r).collect();
        if rows.iter().all(|r| r.status != "pending") {
            break rows;
        }
        assert!(Instant::now() < deadline, "attempts still pending");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let allowed: Vec<_> = rows.iter().filter(|r| r.decision == "allowed").collect();
    assert_eq!(allowed.len(), DAILY_LIMIT, "one allowed row per allowed message");
    let sent_rows: HashSet<&str> =
        allowed.iter().filter(|r| r.status == "sent").filter_map(|r| r.provider_message_id.as_deref()).collect();
    assert_eq!(sent_rows.len(), sent.len());
    assert!(sent.iter().all(|id| sent_rows.contains(id.as_str())), "every 200 has its sent row");
    let now = gateway_server::store::now_ms();
    let usage = store.usage(customer, now - now.rem_euclid(24 * 3_600_000), 0).await.unwrap();
    assert_eq!(usage.today as usize, DAILY_LIMIT, "the daily counter");

    // Every message.sent event reaches the endpoint once.
    let events: Vec<_> =
        store.outbox_events(customer).await.unwrap().into_iter().filter(|(t, _)| t == "message.sent").collect();
    assert_eq!(events.len(), sent.len(), "one message.sent per sent message");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let got = deliveries.lock().unwrap().clone();
        if got.len() >= events.len() {
            let distinct: HashSet<&String> = got.iter().collect();
            assert_eq!(distinct.len(), got.len(), "no event delivered twice");
            assert_eq!(got.len(), events.len());
            break;
        }
        assert!(Instant::now() < deadline, "{} of {} events delivered", got.len(), events.len());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    store.close().await;
    drop(a);
    common::Stop::stop(haproxy);
    db.drop_it().await;
}

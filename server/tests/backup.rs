//! `gateway backup --to FILE`: a consistent copy of a SQLite store taken while the real
//! binary serves a load of sends, restored by serving from the copy.

mod common;

use common::{free_port, gateway, run_json};
use serde_json::json;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

async fn serve(url: &str, port: u16) -> common::Served {
    let env = [
        ("GATEWAY_WEBHOOKS__DISPATCH", "false"),
        ("GATEWAY_SIMULATOR_STATUS_DELAY_MS", "0"),
        ("GATEWAY_POLICIES__BUNDLED", "0"),
    ];
    common::serve(gateway(url, &[], &env), port).await
}

async fn send(http: &reqwest::Client, port: u16, key: &str, i: usize) -> Option<u16> {
    let body = json!({"instance_id": "demo", "phone": format!("+1415555{:04}", i % 10_000),
                      "message_purpose": "transactional", "message": "Your code is 123456"});
    let url = format!("http://127.0.0.1:{port}/api/send-message");
    let response = http.post(url).bearer_auth(key).json(&body).send().await.ok()?;
    Some(response.status().as_u16())
}

fn counts(path: &std::path::Path) -> (String, i64, i64, i64) {
    let conn = rusqlite::Connection::open(path).unwrap();
    let integrity: String = conn.query_row("PRAGMA integrity_check", [], |r| r.get(0)).unwrap();
    let one = |sql: &str| conn.query_row(sql, [], |r| r.get::<_, i64>(0)).unwrap();
    let sent = one("SELECT COUNT(*) FROM message_log WHERE status = 'sent'");
    let events = one("SELECT COUNT(*) FROM outbox WHERE event_type = 'message.sent'");
    let max_id = one("SELECT COALESCE(MAX(id), 0) FROM message_log");
    (integrity, sent, events, max_id)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_backup_taken_under_load_is_consistent_and_serves_when_restored() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}?mode=rwc", dir.path().join("live.db").display());
    let demo = run_json(gateway(&url, &["demo"], &[]));
    let key = demo["api_key"].as_str().unwrap().to_string();
    let customer = demo["customer_id"].as_str().unwrap();
    let lift = ["--daily", "1000000", "--monthly", "1000000", "--instance-per-minute", "1000000"];
    let mut args = vec!["customer", "limits", "--customer", customer, "--recipient-per-minute", "1000000"];
    args.extend(lift);
    run_json(gateway(&url, &args, &[]));
    let port = free_port();
    let mut server = serve(&url, port).await;

    let http = reqwest::Client::new();
    let (stop, answered) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicUsize::new(0)));
    let workers: Vec<_> = (0..6)
        .map(|w| {
            let (http, key, stop, answered) = (http.clone(), key.clone(), stop.clone(), answered.clone());
            tokio::spawn(async move {
                let mut i = w * 1000;
                while !stop.load(Ordering::Relaxed) {
                    assert_eq!(send(&http, port, &key, i).await, Some(200));
                    answered.fetch_add(1, Ordering::Relaxed);
                    i += 1;
                }
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = answered.load(Ordering::Relaxed) as i64;
    let copy = dir.path().join("copy.db");
    let to = copy.display().to_string();
    let out = tokio::task::spawn_blocking({
        let (url, to) = (url.clone(), to.clone());
        move || run_json(gateway(&url, &["backup", "--to", &to], &[]))
    })
    .await
    .unwrap();
    assert!(out["bytes"].as_u64().unwrap() > 0, "{out}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.await.unwrap();
    }
    server.kill().unwrap();
    server.wait().unwrap();
    assert!(answered.load(Ordering::Relaxed) as i64 > before, "sends went on during the backup");

    // The copy: intact, every send answered before it began, each with its event.
    let (integrity, sent, events, max_id) = counts(&copy);
    assert_eq!(integrity, "ok");
    assert!(sent >= before, "the copy holds the {before} sends answered before it began ({sent})");
    assert_eq!(sent, events, "rows and their events were copied together");

    // A backup never overwrites.
    let again = gateway(&url, &["backup", "--to", &to], &[]).output().unwrap();
    assert!(!again.status.success());

    // Restore: serve from the copy.
    let restored = format!("sqlite://{}?mode=rwc", copy.display());
    let port = free_port();
    let mut server = serve(&restored, port).await;
    assert_eq!(send(&http, port, &key, 9_999).await, Some(200));
    server.kill().unwrap();
    server.wait().unwrap();
    assert!(counts(&copy).3 > max_id, "the restored store goes on from where the copy was");
}

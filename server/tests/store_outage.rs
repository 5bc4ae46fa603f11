//! The database goes away under a running gateway (the real binary): on PostgreSQL a
//! TCP proxy between the two, which the test cuts; on SQLite another process holding
//! the file locked. Requests get the error body (503 `service_unavailable`, with
//! `Retry-After`) within the database timeout, never a hang; when the database is back,
//! the same process serves again, without a restart.

mod common;

use common::{Db, free_port, gateway, run_json};
use serde_json::{Value, json};
use std::time::{Duration, Instant};

async fn serve(url: &str, port: u16) -> common::Served {
    let env = [
        ("GATEWAY_WEBHOOKS__DISPATCH", "false"),
        ("GATEWAY_SIMULATOR_STATUS_DELAY_MS", "0"),
        ("GATEWAY_DATABASE_TIMEOUT_MS", "1500"),
        ("GATEWAY_POLICIES__BUNDLED", "0"),
    ];
    common::serve(gateway(url, &[], &env), port).await
}

async fn send(port: u16, key: &str, i: usize) -> (u16, Option<String>, Value) {
    let body = json!({"instance_id": "demo", "phone": format!("+1415555{:04}", 6000 + i),
                      "message_purpose": "transactional", "message": "Your code is 123456"});
    let response = reqwest::Client::new()
        .post(format!("http://127.0.0.1:{port}/api/send-message"))
        .bearer_auth(key)
        .json(&body)
        .timeout(Duration::from_secs(30))
        .send()
        .await
        .expect("an answer, never a hang");
    let status = response.status().as_u16();
    let retry_after = response.headers().get("retry-after").and_then(|v| v.to_str().ok()).map(str::to_string);
    (status, retry_after, response.json().await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lost_database_gets_503_in_time_and_service_resumes_without_a_restart() {
    let db = Db::new("outage").await;
    // PostgreSQL through the proxy; SQLite directly.
    let (url, proxy) = db.through_proxy().await;
    let demo = run_json(gateway(&url, &["demo"], &[]));
    let key = demo["api_key"].as_str().unwrap().to_string();
    let port = free_port();
    let mut server = serve(&url, port).await;
    assert_eq!(send(port, &key, 0).await.0, 200);

    // The database goes away.
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
    for i in 1..4 {
        let started = Instant::now();
        let (status, retry_after, body) = send(port, &key, i).await;
        let took = started.elapsed();
        assert_eq!(status, 503, "{body}");
        assert_eq!(body["error"], "service_unavailable");
        assert_eq!(body["success"], false);
        assert!(body["message"].is_string() && body["details"].is_object());
        assert_eq!(retry_after.as_deref(), Some("1"));
        // Within the database timeout (1.5 s) for each step that waits on it, never
        // anything like a hang.
        assert!(took < Duration::from_secs(8), "answered in {took:?}");
    }

    // A load balancer's readiness probe takes the replica out while the store is gone
    // (PostgreSQL; a locked SQLite file still answers reads).
    if proxy.is_some() {
        let started = Instant::now();
        let ready = reqwest::get(format!("http://127.0.0.1:{port}/health/ready")).await.unwrap();
        assert_eq!(ready.status().as_u16(), 503);
        let body: Value = ready.json().await.unwrap();
        assert_eq!(body["status"], "not_ready");
        assert_ne!(body["checks"]["store"], "ok", "{body}");
        assert!(started.elapsed() < Duration::from_secs(5));
    }

    // It comes back: the same process serves again.
    match (&proxy, lock) {
        (Some(proxy), _) => proxy.restore(),
        (None, Some(conn)) => conn.execute_batch("COMMIT").unwrap(),
        (None, None) => unreachable!(),
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut i = 10;
    loop {
        let (status, _, body) = send(port, &key, i).await;
        if status == 200 {
            break;
        }
        assert!(Instant::now() < deadline, "service resumed: last {status} {body}");
        i += 1;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let ready = reqwest::get(format!("http://127.0.0.1:{port}/health/ready")).await.unwrap();
    assert_eq!(ready.status().as_u16(), 200);
    server.kill().unwrap();
    server.wait().unwrap();
    db.drop_it().await;
}

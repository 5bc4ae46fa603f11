//! A flood at the sign-in page, as an attacker with one machine would send it, against
//! the real binary: 200 concurrent sign-ins, each with a new email, while a customer
//! keeps sending through the API. Password work is bounded (a fixed number of hashing
//! threads behind a short queue; beyond them 429 with `Retry-After` before any
//! hashing), so the process stays small and the API keeps answering. The per-source
//! throttle is lifted for the first flood, so that the hashing bound alone is what
//! holds; the second flood, with the defaults, shows the source throttle refusing.
//! Once the flood is over, the memory the hashing took is given back.
//! On SQLite, and on PostgreSQL when `GATEWAY_TEST_DATABASE_URL` is set.

mod common;

use common::{Db, free_port, gateway, run_json};
use gateway_sdk_tests::dashboard::{DashClient, Page};
use serde_json::json;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

const FLOOD: usize = 200;
/// The bounds: resident memory, and how long an API send may take meanwhile.
const MAX_RESIDENT_BYTES: u64 = 600 << 20;
const MAX_SEND: Duration = Duration::from_secs(3);
/// What the process may still hold once the flood is over, above what it held before:
/// the hashes' 19 MiB blocks are given back (glibc kept them, 200 MiB and more, until
/// each hash got an allocation of its own; `dashboard::auth`).
const MAX_KEPT_BYTES: u64 = 48 << 20;

/// A field of `/proc/PID/status` in bytes (`VmHWM`: the peak resident size).
fn proc_status_bytes(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with(field)).unwrap_or_else(|| panic!("{field} in {status}"));
    let kib: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kib * 1024
}

/// 200 browsers, each with its sign-in form, post at once, each with a new email.
async fn flood(base: &str, round: usize) -> Vec<Page> {
    let mut browsers = Vec::new();
    for _ in 0..FLOOD {
        let browser = DashClient::new(base);
        let csrf = browser.get("/login").await.csrf();
        browsers.push((browser, csrf));
    }
    let posts = browsers.iter().enumerate().map(|(i, (browser, csrf))| async move {
        let email = format!("nobody-{round}-{i}@flood.example");
        browser.post("/login", &[("csrf", csrf), ("email", &email), ("password", "a wrong password 123")]).await
    });
    futures::future::join_all(posts).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_sign_in_flood_is_refused_before_hashing_and_the_api_keeps_answering() {
    let db = Db::new("flood").await;
    let demo = run_json(gateway(&db.url, &["demo"], &[]));
    let (key, customer) = (demo["api_key"].as_str().unwrap().to_string(), demo["customer_id"].as_str().unwrap());
    let lift = "1000000";
    let args = ["customer", "limits", "--customer", customer, "--daily", lift, "--monthly", lift];
    run_json(gateway(
        &db.url,
        &[&args[..], &["--instance-per-minute", lift, "--recipient-per-minute", lift]].concat(),
        &[],
    ));
    let port = free_port();
    let env = [
        ("GATEWAY_SIMULATOR_STATUS_DELAY_MS", "0"),
        ("GATEWAY_POLICIES__BUNDLED", "false"),
        // The first flood meets only the hashing bound.
        ("GATEWAY_DASHBOARD__SIGNIN_BURST", "1000"),
        ("GATEWAY_DASHBOARD__SIGNIN_PER_MINUTE", "600"),
    ];
    let mut server = common::serve(gateway(&db.url, &[], &env), port).await;
    let pid = server.id();
    let base = format!("http://127.0.0.1:{port}");
    let before = proc_status_bytes(pid, "VmRSS:");

    // A customer sends every 50 ms throughout, each send timed.
    let flooding = Arc::new(AtomicBool::new(true));
    let sends = {
        let (flooding, base, key) = (flooding.clone(), base.clone(), key.clone());
        tokio::spawn(async move {
            let http = reqwest::Client::new();
            let mut times = Vec::new();
            let mut n = 0;
            while flooding.load(Ordering::Relaxed) {
                let body = json!({"instance_id": "demo", "phone": format!("+1415555{:04}", n % 10_000),
                                  "message_purpose": "transactional", "message": "Your code is 123456"});
                let started = Instant::now();
                let answer = http.post(format!("{base}/api/send-message")).bearer_auth(&key).json(&body).send().await;
                let status = answer.map(|r| r.status().as_u16()).unwrap_or(0);
                times.push((status, started.elapsed()));
                n += 1;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            times
        })
    };
    let started = Instant::now();
    let pages = flood(&base, 1).await;
    let took = started.elapsed();
    flooding.store(false, Ordering::Relaxed);
    let times = sends.await.unwrap();

    let hashed = pages.iter().filter(|p| p.status == 401).count();
    let busy: Vec<&Page> = pages.iter().filter(|p| p.status == 429).collect();
    assert_eq!(hashed + busy.len(), FLOOD, "every sign-in is a wrong password (401) or refused (429)");
    assert!(!busy.is_empty(), "200 at once must overflow the hashing slots and their queue");
    assert!(busy.iter().all(|p| p.retry_after.as_deref() == Some("1")), "every 429 carries Retry-After");
    assert!(busy.iter().all(|p| p.body.contains("busy")), "the page says why");
    let peak = proc_status_bytes(pid, "VmHWM:");
    let slowest = times.iter().map(|(_, t)| *t).max().unwrap();
    eprintln!(
        "flood of {FLOOD}: {hashed} hashed (401), {} refused (429) in {took:?}; resident {} MiB before, peak {} MiB; \
         {} sends meanwhile, slowest {slowest:?}",
        busy.len(),
        before >> 20,
        peak >> 20,
        times.len()
    );
    assert!(peak < MAX_RESIDENT_BYTES, "peak resident {} MiB", peak >> 20);
    let after = proc_status_bytes(pid, "VmRSS:");
    eprintln!("resident after the flood: {} MiB", after >> 20);
    assert!(after < before + MAX_KEPT_BYTES, "resident {} MiB after, {} MiB before", after >> 20, before >> 20);
    assert!(!times.is_empty());
    assert!(times.iter().all(|(status, _)| *status == 200), "{times:?}");
    assert!(slowest < MAX_SEND, "a send took {slowest:?} during the flood");
    let _ = server.kill();
    let _ = server.wait();

    // With the default per-source throttle, most of the same flood is refused before
    // it even asks for a hashing slot.
    let port = free_port();
    let mut server = common::serve(gateway(&db.url, &[], &env[..2]), port).await;
    let pages = flood(&format!("http://127.0.0.1:{port}"), 2).await;
    let refused: Vec<&Page> =
        pages.iter().filter(|p| p.status == 429 && p.body.contains("Too many attempts")).collect();
    assert!(refused.len() >= FLOOD - 30, "the source's burst is 30: {} refused by it", refused.len());
    assert!(refused.iter().all(|p| p.retry_after.as_deref().is_some_and(|s| s.parse::<u64>().unwrap() >= 1)));
    let _ = server.kill();
    let _ = server.wait();
    db.drop_it().await;
}

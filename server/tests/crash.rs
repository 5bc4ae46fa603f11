//! Nothing acknowledged is lost: events written by a gateway that is killed (SIGKILL)
//! before its first delivery attempt are delivered by the next one.

mod common;

use common::{free_port, gateway, run_json};
use gateway_sdk_tests::receiver::Receiver;
use std::time::Duration;

async fn serve(url: &str, port: u16, log: &std::path::Path, dispatch: &str) -> common::Served {
    let log = log.display().to_string();
    let env = [
        ("GATEWAY_ALLOW_LOOPBACK_TARGETS", "1"),
        ("GATEWAY_WEBHOOKS__DISPATCH", dispatch),
        ("GATEWAY_WEBHOOKS__POLL_INTERVAL_MS", "20"),
        ("GATEWAY_SIMULATOR_STATUS_DELAY_MS", "0"),
        ("GATEWAY_LOG_FILE", log.as_str()),
    ];
    common::serve(gateway(url, &[], &env), port).await
}

#[tokio::test(flavor = "multi_thread")]
async fn events_written_before_a_kill_are_delivered_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}?mode=rwc", dir.path().join("crash.db").display());
    let receiver = Receiver::start().await;
    let demo = run_json(gateway(&url, &["demo"], &[]));
    let (key, instance) = (demo["api_key"].as_str().unwrap(), demo["instance_id"].as_str().unwrap());
    let hook = receiver.url("/hook");
    let set = ["webhook", "set", "--instance", instance, "--url", &hook, "--events", "all", "--unsigned"];
    run_json(gateway(&url, &set, &[("GATEWAY_ALLOW_LOOPBACK_TARGETS", "1")]));

    // First life: an API-only process (it never attempts a delivery) accepts sends.
    let port = free_port();
    let mut first = serve(&url, port, &dir.path().join("first.log"), "false").await;
    let http = reqwest::Client::new();
    for i in 0..5 {
        let phone = format!("+1415555{:04}", 3000 + i);
        assert_eq!(common::send_text(&http, port, key, &phone, "Your code is 123456").await.0, 200);
    }
    first.kill().unwrap(); // SIGKILL: no shutdown of any kind
    first.wait().unwrap();
    assert!(receiver.received().is_empty(), "nothing was delivered before the kill");

    // Second life: the events are in the store and go out.
    let mut second = serve(&url, free_port(), &dir.path().join("second.log"), "true").await;
    let got = receiver.wait_for(5, Duration::from_secs(20)).await;
    let mut ids: Vec<_> = got.iter().map(|r| r.header("x-gateway-event-id").unwrap().to_string()).collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 5);
    assert!(got.iter().all(|r| r.header("x-gateway-event") == Some("message.sent")));
    second.kill().unwrap();
    second.wait().unwrap();
}

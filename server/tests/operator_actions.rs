//! An operator's action that stops sending holds the moment its command returns: on the
//! replica that acted and on every other replica on the same store, however warm their
//! caches are. Two real `gateway serve` processes on one store (a SQLite file, or one
//! PostgreSQL database when `GATEWAY_TEST_DATABASE_URL` is set); the actions are the
//! CLI's, from a third process.

mod common;

use common::{Db, free_port, run_json};
use serde_json::Value;
use std::process::Command;

fn gateway(url: &str, args: &[&str]) -> Command {
    let mut command = common::gateway(url, args, &[]);
    command.env("GATEWAY_POLICIES__BUNDLED", "0");
    command
}

async fn serve(url: &str) -> (common::Served, u16) {
    let port = free_port();
    let env = [("GATEWAY_WEBHOOKS__DISPATCH", "false"), ("GATEWAY_SIMULATOR_STATUS_DELAY_MS", "0")];
    let mut command = common::gateway(url, &[], &env);
    command.env("GATEWAY_POLICIES__BUNDLED", "0");
    (common::serve(command, port).await, port)
}

async fn send(http: &reqwest::Client, port: u16, key: &str, phone: &str) -> (u16, Value) {
    common::send_text(http, port, key, phone, "Your code is 123456").await
}

/// Both replicas send with `key` (their caches now hold the key and the instance).
async fn warm(http: &reqwest::Client, ports: &[u16], key: &str, phone: &str) {
    for port in ports {
        let (status, body) = send(http, *port, key, phone).await;
        assert_eq!(status, 200, "replica {port} before the action: {body}");
    }
}

/// The first send on each replica after the action is refused with `code`.
async fn refused(http: &reqwest::Client, ports: &[u16], key: &str, phone: &str, status: u16, code: &str, what: &str) {
    for port in ports {
        let (got, body) = send(http, *port, key, phone).await;
        assert_eq!((got, body["error"].as_str()), (status, Some(code)), "{what}, replica {port}: {body}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_action_that_stops_sending_holds_on_every_replica_when_its_command_returns() {
    let db = Db::new("actions").await;
    let url = db.url.clone();
    let demo = run_json(gateway(&url, &["demo"]));
    let customer = demo["customer_id"].as_str().unwrap().to_string();
    let instance = demo["instance_id"].as_str().unwrap().to_string();
    let lift = "1000000";
    let limits = ["customer", "limits", "--customer", &customer, "--daily", lift, "--monthly", lift];
    run_json(gateway(&url, &[&limits[..], &["--instance-per-minute", lift, "--recipient-per-minute", lift]].concat()));
    let ((mut a, port_a), (mut b, port_b)) = (serve(&url).await, serve(&url).await);
    let ports = [port_a, port_b];
    let http = reqwest::Client::new();
    let phone = "+14155550180";

    // A revoked key: 401 revoked_api_key at once.
    let key = run_json(gateway(&url, &["key", "create", "--customer", &customer]));
    let (key_id, secret) = (key["id"].as_str().unwrap(), key["api_key"].as_str().unwrap());
    warm(&http, &ports, secret, phone).await;
    run_json(gateway(&url, &["key", "revoke", key_id]));
    refused(&http, &ports, secret, phone, 401, "revoked_api_key", "a revoked key").await;

    let key = demo["api_key"].as_str().unwrap();
    // A paused instance: 423 at once; resumed: sends again.
    warm(&http, &ports, key, phone).await;
    run_json(gateway(&url, &["instance", "pause", &instance, "--reason", "under review"]));
    refused(&http, &ports, key, phone, 423, "instance_paused_for_review", "a paused instance").await;
    run_json(gateway(&url, &["instance", "resume", &instance]));
    warm(&http, &ports, key, phone).await;

    // A suppressed recipient: 403 at once.
    run_json(gateway(&url, &["suppression", "add", "--customer", &customer, "--phone", phone]));
    refused(&http, &ports, key, phone, 403, "recipient_suppressed", "a suppressed recipient").await;
    let phone = "+14155550181";

    // The API module turned off: 403 at once.
    warm(&http, &ports, key, phone).await;
    run_json(gateway(&url, &["customer", "modules", "--customer", &customer, "--api", "off"]));
    refused(&http, &ports, key, phone, 403, "module_not_enabled", "the API module off").await;
    run_json(gateway(&url, &["customer", "modules", "--customer", &customer, "--api", "on"]));
    warm(&http, &ports, key, phone).await;

    // A plan changed to one that waits for approval: 403 active_plan_required at once.
    run_json(gateway(&url, &["plan", "assign", "--customer", &customer, "--plan", "scale"]));
    refused(&http, &ports, key, phone, 403, "active_plan_required", "a plan awaiting approval").await;

    for replica in [&mut a, &mut b] {
        replica.kill().unwrap();
        replica.wait().unwrap();
    }
    db.drop_it().await;
}

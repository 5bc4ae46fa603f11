//! Several gateways on one store, as replicas on different machines are: each has its
//! own policies directory, and they share what the store holds.

use crate::expect_raw;
use gateway_sdk_tests::TestContext;
use gateway_sdk_tests::wasm::{Behaviour, expecting, policy};
use gateway_server::policy::reload::PolicyControl;
use gateway_server::policy::tools;
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn send(phone: &str) -> Value {
    json!({"instance_id": "main", "phone": phone, "message_purpose": "transactional",
           "message": "Your order has shipped."})
}

/// Waits until `control` runs `version` of content; how long that took.
async fn runs(control: &PolicyControl, version: &str, since: Instant) -> Duration {
    let deadline = since + Duration::from_secs(5);
    loop {
        let status = control.status();
        if status.modules.iter().any(|m| m.name == "content" && m.version == version) {
            return since.elapsed();
        }
        assert!(Instant::now() < deadline, "content {version} not live within 5 s: {:?}", status.modules);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn send_via(cx: &TestContext, base_url: &str, phone: &str) -> (u16, Value) {
    let response = cx
        .http
        .post(format!("{base_url}/api/send-message"))
        .bearer_auth(&cx.tenant.api_key)
        .json(&send(phone))
        .send()
        .await
        .unwrap();
    (response.status().as_u16(), response.json().await.unwrap())
}

#[tokio::test]
async fn a_module_installed_in_the_store_runs_on_every_replica_and_rolls_back_on_every_one() {
    let (dir_a, dir_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let path_a = dir_a.path().display().to_string();
    let cx = TestContext::with("replica_policies", |c| c.policies_dir = Some(path_a), None).await;
    cx.lift_velocity(&cx.tenant.customer_id).await;
    let b = cx.second_replica(dir_b.path()).await;
    let b_url = format!("http://{}", b.local_addr());
    let (a_policies, b_policies) = (cx.server.policies().unwrap().clone(), b.policies().unwrap().clone());
    let host = Arc::clone(a_policies.host());
    let deny = Behaviour::Deny { code: "held", reason: "every message is held", risk: 90 };
    // A module failing its own fixtures is refused and never stored.
    let broken = policy("content", "6.0.0", "content", &deny, &expecting("allow"));
    let Err(refused) = tools::install(cx.store(), host.clone(), broken, "test").await else {
        panic!("a module failing its fixtures was installed")
    };
    assert!(refused.to_string().contains("fixtures"), "{refused}");
    assert!(cx.store().live_policy_modules().await.unwrap().is_empty());
    // A good one is stored and goes live on both replicas within 5 s.
    let good = policy("content", "7.0.0", "content", &deny, &expecting("deny"));
    let installed_at = Instant::now();
    let (module, stored) = tools::install(cx.store(), host.clone(), good, "test").await.unwrap();
    assert_eq!((module.metadata.version.as_str(), stored.name.as_str()), ("7.0.0", "content"));
    let (took_a, took_b) =
        (runs(&a_policies, "7.0.0", installed_at).await, runs(&b_policies, "7.0.0", installed_at).await);
    eprintln!("live on replica A after {took_a:?}, on B after {took_b:?}");
    for status in [a_policies.status(), b_policies.status()] {
        let content = status.modules.iter().find(|m| m.name == "content").unwrap();
        assert!(content.source.starts_with("store #"), "{content:?}");
        assert!(status.refused.is_empty(), "{:?}", status.refused);
    }
    for (base, phone) in [(&cx.base_url, "+14155552001"), (&b_url, "+14155552002")] {
        let body = expect_raw(send_via(&cx, base, phone).await, 403, "policy_violation");
        assert_eq!(body["details"]["policy"], "content@7.0.0", "{body}");
    }
    // `policy list` sees both, each running the stored module. A replica reports what it
    // runs to the store after it swapped the module in (the next turn of its reload
    // loop), so the list may lag the replica's own status by that turn.
    let reports_it = |list: &Value| {
        list["gateways"]
            .as_array()
            .unwrap()
            .iter()
            .all(|g| g["modules"].as_array().unwrap().iter().any(|m| m["version"] == "7.0.0"))
    };
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut list = tools::list(cx.store()).await.unwrap();
    while !reports_it(&list) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
        list = tools::list(cx.store()).await.unwrap();
    }
    let gateways = list["gateways"].as_array().unwrap();
    assert_eq!(gateways.len(), 2, "{list}");
    for g in gateways {
        assert!(g["modules"].as_array().unwrap().iter().any(|m| m["version"] == "7.0.0"), "{g}");
    }
    // Rollback retires the stored row: the bundled module is back on both replicas.
    let (ok, report) = tools::rollback(cx.store(), "content", Duration::from_secs(20)).await.unwrap();
    assert!(ok, "{report}");
    assert_eq!(report["retired"]["version"], "7.0.0", "{report}");
    let rolled_at = Instant::now();
    runs(&a_policies, "1.0.0", rolled_at).await;
    runs(&b_policies, "1.0.0", rolled_at).await;
    assert_eq!(send_via(&cx, &b_url, "+14155552003").await.0, 200);
    assert!(cx.store().live_policy_modules().await.unwrap().is_empty());
    b.close().await.unwrap();
    cx.teardown().await;
}

/// Polls `send` through `base_url` until it answers `status`; how long that took.
async fn until_status(cx: &TestContext, base_url: &str, phone: &str, status: u16, since: Instant) -> Duration {
    let deadline = since + Duration::from_secs(5);
    loop {
        let (got, body) = send_via(cx, base_url, phone).await;
        if got == status {
            return since.elapsed();
        }
        assert!(Instant::now() < deadline, "still {got} {body} after 5 s, waiting for {status}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The send path caches keys, customers and instances per replica; a change made
/// through another replica's store is seen within the documented bound (2 s), and a
/// suppression (never cached) at once.
#[tokio::test]
async fn a_revoked_key_a_paused_instance_and_a_suppression_reach_every_replica_within_the_bound() {
    let cx = TestContext::new("replica_cache").await;
    cx.lift_velocity(&cx.tenant.customer_id).await;
    let dir = tempfile::tempdir().unwrap();
    let b = cx.second_replica(dir.path()).await;
    let b_url = format!("http://{}", b.local_addr());
    // B has the key, customer and instance in its cache.
    for phone in ["+14155552101", "+14155552102"] {
        assert_eq!(send_via(&cx, &b_url, phone).await.0, 200);
    }
    // A suppression is read with every send: refused at once.
    cx.store().add_suppression(&cx.tenant.customer_id, "+14155552103", "opted out", "manual").await.unwrap();
    expect_raw(send_via(&cx, &b_url, "+14155552103").await, 403, "recipient_suppressed");
    // A paused instance, then resumed.
    cx.store().set_paused(&cx.tenant.instance_id, true, Some("review")).await.unwrap();
    let paused = until_status(&cx, &b_url, "+14155552104", 423, Instant::now()).await;
    cx.store().set_paused(&cx.tenant.instance_id, false, None).await.unwrap();
    let resumed = until_status(&cx, &b_url, "+14155552105", 200, Instant::now()).await;
    // A revoked key.
    assert_eq!(send_via(&cx, &b_url, "+14155552106").await.0, 200);
    cx.store().revoke_api_key(&cx.tenant.api_key_id).await.unwrap();
    let revoked = until_status(&cx, &b_url, "+14155552107", 401, Instant::now()).await;
    eprintln!("seen by replica B: paused after {paused:?}, resumed after {resumed:?}, revoked after {revoked:?}");
    let bound = Duration::from_secs(2);
    assert!(paused < bound && resumed < bound && revoked < bound, "{paused:?} {resumed:?} {revoked:?}");
    assert!(gateway_server::store::CACHE_TTL < bound);
    b.close().await.unwrap();
    cx.teardown().await;
}

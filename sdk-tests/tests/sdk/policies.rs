//! The policy engine end to end: the bundled purpose, content and pacing modules decide
//! real sends; decisions reach the wire and the message log; reviews are queued and
//! pause an instance; modules are replaced while sends run.

use crate::expect_raw;
use gateway_sdk_tests::TestContext;
use gateway_sdk_tests::wasm::{Behaviour, drop_in, expecting, policy};
use gateway_server::ops;
use gateway_server::policy::bundled;
use gateway_server::policy::module::{read_metadata, with_metadata};
use gateway_server::policy::tools;
use gateway_server::store::LimitOverrides;
use serde_json::{Value, json};
use std::time::{Duration, Instant};

fn send(purpose: &str, phone: &str, text: &str) -> Value {
    json!({"instance_id": "main", "phone": phone, "message_purpose": purpose, "message": text})
}

/// The policy trace of the newest message-log row.
async fn last_trace(cx: &TestContext) -> (gateway_server::store::LogEntry, Vec<Value>) {
    let (_, entry) = cx.store().recent_log(&cx.tenant.customer_id, 1).await.unwrap().remove(0);
    let trace: Vec<Value> = serde_json::from_str(entry.policy_trace.as_deref().expect("a policy trace")).unwrap();
    (entry, trace)
}

#[tokio::test]
async fn marketing_and_political_texts_sent_as_transactional_are_refused_with_the_decision() {
    let cx = TestContext::new("pol_marketing").await;
    let promo = send("transactional", "+14155550701", "Black Friday: 50% OFF everything, promo code BF50!");
    let r = expect_raw(cx.send_json(&promo).await, 403, "policy_violation");
    let d = &r["details"];
    assert_eq!(
        (d["policy"].as_str(), d["action"].as_str(), d["rule"].as_str()),
        (Some("content@1.0.0"), Some("block"), Some("marketing_content"))
    );
    assert!(d["risk_score"].as_u64().unwrap() >= 70, "{d}");
    assert!(d["reason"].as_str().unwrap().contains("promotional wording"), "{d}");
    let (entry, trace) = last_trace(&cx).await;
    assert_eq!((entry.decision.as_str(), entry.error_code.as_deref()), ("refused", Some("policy_violation")));
    assert_eq!(entry.policy.as_deref(), Some("content@1.0.0"));
    let stages: Vec<(&str, &str, &str)> = trace
        .iter()
        .map(|t| (t["stage"].as_str().unwrap(), t["module"].as_str().unwrap(), t["decision"].as_str().unwrap()))
        .collect();
    assert_eq!(
        stages,
        [("purpose", "purpose", "allow"), ("content", "content", "deny"), ("content", "pacing", "allow")]
    );
    assert!(trace.iter().all(|t| t["version"] == "1.0.0" && t["fuel"].as_u64().unwrap() > 0), "{trace:?}");

    let vote = send("operational", "+14155550702", "Vote for Maria Lopez on November 5th. Together we win!");
    let r = expect_raw(cx.send_json(&vote).await, 403, "policy_violation");
    assert_eq!(r["details"]["rule"], "political_content");
    // An order update that mentions the discount already granted goes through.
    let update =
        send("transactional", "+14155550703", "Your order #1234 has shipped. The 10% discount you used was applied.");
    assert_eq!(cx.send_json(&update).await.0, 200);
    let (entry, trace) = last_trace(&cx).await;
    assert_eq!((entry.decision.as_str(), entry.policy.as_deref()), ("allowed", None));
    assert_eq!(trace.len(), 3, "every module's verdict is logged for an allowed send too: {trace:?}");
    assert!(trace.iter().all(|t| t["decision"] == "allow" && t["sha256"].as_str().unwrap().len() == 12));
    cx.teardown().await;
}

#[tokio::test]
async fn purpose_rules_are_422_message_purpose_not_allowed() {
    let cx = TestContext::new("pol_purpose").await;
    let store = cx.store();
    store
        .set_approved_purposes(&cx.tenant.customer_id, Some(&["transactional".into(), "support".into()]))
        .await
        .unwrap();
    let r = expect_raw(
        cx.send_json(&send("authentication", "+14155550711", "Your code is 123456")).await,
        422,
        "message_purpose_not_allowed",
    );
    assert_eq!(
        (r["details"]["rule"].as_str(), r["details"]["field"].as_str()),
        (Some("purpose_not_approved"), Some("message_purpose"))
    );
    assert!(r["message"].as_str().unwrap().contains("transactional, support"), "{r}");
    store.set_approved_purposes(&cx.tenant.customer_id, None).await.unwrap();
    assert_eq!(cx.send_json(&send("authentication", "+14155550711", "Your code is 123456")).await.0, 200);
    let image = json!({"instance_id": "main", "phone": "+14155550712", "message_purpose": "authentication",
                       "media_type": "image", "mime_type": "image/png", "file_name": "code.png",
                       "media": "iVBORw0KGgoAAAANSUhEUg==", "caption": "Your code is 123456"});
    let r = expect_raw(cx.send_json(&image).await, 422, "message_purpose_not_allowed");
    assert_eq!(r["details"]["rule"], "media_in_authentication");
    cx.teardown().await;
}

#[tokio::test]
async fn a_review_holds_the_message_and_three_reviews_pause_the_instance() {
    let cx = TestContext::new("pol_review").await;
    let otp = |n: u32| send("authentication", &format!("+1415555072{n}"), "Your code is 123456. Use coupon SAVE10");
    for n in 0..3 {
        let r = expect_raw(cx.send_json(&otp(n)).await, 403, "policy_violation");
        assert_eq!(
            (r["details"]["action"].as_str(), r["details"]["policy"].as_str()),
            (Some("review"), Some("content@1.0.0"))
        );
        assert!(r["details"]["reason"].as_str().unwrap().contains("coupon"), "{r}");
        assert!(r["details"].get("rule").is_none(), "a review names no deny rule: {r}");
    }
    let queue = cx.store().review_queue(Some("pending"), Some(&cx.tenant.customer_id), 10, None).await.unwrap();
    assert_eq!(queue.len(), 3);
    assert_eq!(
        queue[0].text.as_deref(),
        Some("Your code is 123456. Use coupon SAVE10"),
        "the reviewer sees the message"
    );
    assert_eq!((queue[0].recipient.as_deref(), queue[0].policy.as_str()), (Some("+14155550722"), "content@1.0.0"));
    let logged = cx.store().log_entry(queue[0].log_id).await.unwrap();
    assert_eq!(logged.recipient.as_deref(), Some("+14155550722"));
    // The third review paused the instance: every send is 423 until an operator resumes it.
    let instance = cx.store().instance(&cx.tenant.instance_id).await.unwrap();
    assert!(instance.paused, "paused after three reviews");
    assert!(instance.paused_reason.as_deref().unwrap().contains("3 messages sent to review within 24 hours"));
    let fine = send("transactional", "+14155550729", "Your order has shipped.");
    expect_raw(cx.send_json(&fine).await, 423, "instance_paused_for_review");
    let dismissed =
        cx.store().decide_review(queue[0].id, "dismissed", "ops@example.com", Some("false positive")).await.unwrap();
    assert_eq!((dismissed.status.as_str(), dismissed.decided_by.as_deref()), ("dismissed", Some("ops@example.com")));
    assert!(cx.store().decide_review(queue[0].id, "confirmed", "x", None).await.is_err(), "decided once");
    cx.store().set_paused(&cx.tenant.instance_id, false, None).await.unwrap();
    assert_eq!(cx.send_json(&fine).await.0, 200);
    cx.teardown().await;
}

#[tokio::test]
async fn a_new_number_warms_up_and_messages_few_strangers_a_day() {
    let cx = TestContext::new("pol_warmup").await;
    cx.lift_velocity(&cx.tenant.customer_id).await;
    // A brand-new number: day 0 of its warm-up.
    cx.store().set_instance_age(&cx.tenant.instance_id, 0).await.unwrap();
    for i in 0..10 {
        let r = cx.send_json(&send("transactional", &format!("+141555508{i:02}"), "Your order has shipped.")).await;
        assert_eq!(r.0, 200, "new recipient {i}: {}", r.1);
    }
    let r = expect_raw(
        cx.send_json(&send("transactional", "+14155550899", "Your order has shipped.")).await,
        403,
        "policy_violation",
    );
    assert_eq!(
        (r["details"]["rule"].as_str(), r["details"]["policy"].as_str()),
        (Some("warmup_new_recipient_limit"), Some("pacing@1.0.0"))
    );
    // A recipient it already wrote to is fine.
    assert_eq!(cx.send_json(&send("transactional", "+14155550800", "Your parcel is out for delivery.")).await.0, 200);
    // The same number 30 days later may message new recipients again.
    cx.store().set_instance_age(&cx.tenant.instance_id, 30).await.unwrap();
    assert_eq!(cx.send_json(&send("transactional", "+14155550899", "Your order has shipped.")).await.0, 200);
    cx.teardown().await;
}

#[tokio::test]
async fn ten_messages_a_day_to_someone_who_never_replied() {
    let cx = TestContext::new("pol_unreplied").await;
    cx.lift_velocity(&cx.tenant.customer_id).await;
    for i in 0..10 {
        assert_eq!(
            cx.send_json(&send("transactional", "+14155550901", &format!("Update {i} on your order"))).await.0,
            200
        );
    }
    let r = expect_raw(
        cx.send_json(&send("transactional", "+14155550901", "One more update")).await,
        403,
        "policy_violation",
    );
    assert_eq!(r["details"]["rule"], "unreplied_recipient_limit");
    cx.teardown().await;
}

/// The bundled content module as version `version` (same code and fixtures, so a
/// real module: only its metadata says another version).
fn content_version(version: &str) -> Vec<u8> {
    let (_, bytes) = bundled::MODULES.iter().find(|(name, _)| *name == "content").unwrap();
    let mut metadata = read_metadata(bytes).unwrap().unwrap();
    metadata.version = version.to_string();
    with_metadata(bytes, &metadata).unwrap()
}

#[tokio::test]
async fn the_content_module_is_replaced_ten_times_under_load_without_a_failed_request() {
    let dir = tempfile::tempdir().unwrap();
    let policies_dir = dir.path().to_path_buf();
    // Pacing would (rightly) stop this volume to a few recipients: a permissive test
    // module replaces it, so every send is the content module's to decide.
    let open = policy("pacing", "0.0.0-test", "content", &Behaviour::Allow, &expecting("allow"));
    drop_in(dir.path(), "pacing.wasm", &open);
    let cx = TestContext::with(
        "pol_reload_load",
        |c| {
            c.policies_dir = Some(policies_dir.display().to_string());
            c.policies.poll_interval_ms = 20;
            c.policies.debounce_ms = 50;
        },
        None,
    )
    .await;
    let limits = LimitOverrides {
        daily: Some(1_000_000),
        monthly: Some(1_000_000),
        instance_per_minute: Some(1_000_000),
        recipient_per_minute: Some(1_000_000),
    };
    ops::set_limits(cx.store(), &cx.tenant.customer_id, &limits).await.unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let senders: Vec<_> = (0..4)
        .map(|worker| {
            let (http, url, key, stop) =
                (cx.http.clone(), cx.base_url.clone(), cx.tenant.api_key.clone(), stop.clone());
            tokio::spawn(async move {
                let mut statuses = Vec::new();
                let mut n = 0u32;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let phone = format!("+14155551{worker}{:02}", n % 100);
                    let response = http
                        .post(format!("{url}/api/send-message"))
                        .bearer_auth(&key)
                        .json(&send("transactional", &phone, &format!("Your order {n} has shipped.")))
                        .send()
                        .await
                        .expect("the gateway answers");
                    statuses.push(response.status().as_u16());
                    n += 1;
                }
                statuses
            })
        })
        .collect();
    let policies = cx.server.policies().expect("the policy host runs");
    for i in 1..=10 {
        let version = format!("1.0.{i}");
        drop_in(dir.path(), "content.wasm", &content_version(&version));
        let deadline = Instant::now() + Duration::from_secs(20);
        while !policies.status().modules.iter().any(|m| m.name == "content" && m.version == version) {
            assert!(Instant::now() < deadline, "content {version} never went live");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut statuses = Vec::new();
    for sender in senders {
        statuses.extend(sender.await.unwrap());
    }
    assert!(statuses.len() >= 40, "sends ran during the swaps: {}", statuses.len());
    assert!(statuses.iter().all(|s| *s == 200), "every send succeeded: {statuses:?}");
    // Every log row names the content version that decided it.
    let log = cx.store().recent_log(&cx.tenant.customer_id, 10_000).await.unwrap();
    assert_eq!(log.len(), statuses.len());
    let mut versions = std::collections::BTreeSet::new();
    for (id, entry) in &log {
        let trace: Vec<Value> = serde_json::from_str(entry.policy_trace.as_deref().unwrap()).unwrap();
        let content = trace.iter().find(|t| t["module"] == "content").unwrap_or_else(|| panic!("row {id}: {trace:?}"));
        versions.insert(content["version"].as_str().unwrap().to_string());
    }
    assert!(versions.len() >= 2, "traffic moved across versions: {versions:?}");
    assert!(versions.iter().all(|v| v == "1.0.0" || v.starts_with("1.0.")), "{versions:?}");
    let status = policies.status();
    assert_eq!(status.modules.iter().find(|m| m.name == "content").unwrap().version, "1.0.10");
    assert!(status.generation >= 11, "ten swaps after the first set: {}", status.generation);
    cx.teardown().await;
}

#[tokio::test]
async fn policy_list_reload_and_rollback_reach_every_running_gateway() {
    let dir = tempfile::tempdir().unwrap();
    let policies_dir = dir.path().to_path_buf();
    let cx =
        TestContext::with("pol_commands", |c| c.policies_dir = Some(policies_dir.display().to_string()), None).await;
    let list = tools::list(cx.store()).await.unwrap();
    let gateways = list["gateways"].as_array().unwrap();
    assert_eq!(gateways.len(), 1, "{list}");
    assert_eq!(gateways[0]["live"], true);
    let names: Vec<&str> =
        gateways[0]["modules"].as_array().unwrap().iter().map(|m| m["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["purpose", "content", "pacing"]);
    assert_eq!(gateways[0]["modules"][1]["sha256"].as_str().unwrap().len(), 64);
    // A module dropped in without waiting for the watcher: `policy reload`.
    let deny = Behaviour::Deny { code: "held", reason: "every message is held", risk: 90 };
    drop_in(dir.path(), "content.wasm", &policy("content", "5.0.0", "content", &deny, &expecting("deny")));
    let (ok, report) = tools::command(cx.store(), "reload", None, Duration::from_secs(20)).await.unwrap();
    assert!(ok, "{report}");
    assert!(report["gateways"][0]["result"].as_str().unwrap().contains("loaded content@5.0.0"), "{report}");
    let r = expect_raw(
        cx.send_json(&send("transactional", "+14155551301", "Your order has shipped.")).await,
        403,
        "policy_violation",
    );
    assert_eq!((r["details"]["policy"].as_str(), r["details"]["rule"].as_str()), (Some("content@5.0.0"), Some("held")));
    // `policy rollback content`: the bundled 1.0.0 decides again.
    let (ok, report) = tools::command(cx.store(), "rollback", Some("content"), Duration::from_secs(20)).await.unwrap();
    assert!(ok, "{report}");
    assert_eq!(cx.send_json(&send("transactional", "+14155551302", "Your order has shipped.")).await.0, 200);
    let list = tools::list(cx.store()).await.unwrap();
    let content = &list["gateways"][0]["modules"][1];
    assert_eq!((content["version"].as_str(), content["pinned"].as_bool()), (Some("1.0.0"), Some(true)));
    // A module nobody replaced cannot be rolled back; the command says so.
    let (ok, report) = tools::command(cx.store(), "rollback", Some("pacing"), Duration::from_secs(20)).await.unwrap();
    assert!(!ok);
    assert!(report["gateways"][0]["result"].as_str().unwrap().contains("no previous version"), "{report}");
    cx.teardown().await;
}

#[tokio::test]
async fn the_operator_works_the_review_queue_and_the_customer_sees_each_modules_verdict() {
    use gateway_sdk_tests::dashboard::signed_in;
    use gateway_server::dashboard::roles::Role;
    let cx = TestContext::new("pol_dash_reviews").await;
    let otp = |n: u32| send("authentication", &format!("+1415555140{n}"), "Your code is 123456. Use coupon SAVE10");
    for n in 0..3 {
        expect_raw(cx.send_json(&otp(n)).await, 403, "policy_violation");
    }
    let operator = signed_in(cx.store(), &cx.config, &cx.base_url, None, "ops@gateway.example", Role::Operator).await;
    let queue = operator.get("/operator/reviews").await;
    assert_eq!(queue.status, 200);
    assert_eq!(
        queue.body.matches("Your code is 123456. Use coupon SAVE10").count(),
        3,
        "the reviewer reads each message"
    );
    assert!(queue.body.contains("content@1.0.0") && queue.body.contains("coupon"));
    assert!(
        queue.body.contains("paused")
            && queue.body.contains(&format!("/operator/instances/{}/resume", cx.tenant.instance_id))
    );
    let items = cx.store().review_queue(Some("pending"), None, 10, None).await.unwrap();
    // A decision needs the form's token.
    let forged = operator.post(&format!("/operator/reviews/{}/decide", items[0].id), &[("verdict", "dismissed")]).await;
    assert_eq!(forged.status, 403);
    let decided = operator
        .submit(
            "/operator/reviews",
            &format!("/operator/reviews/{}/decide", items[0].id),
            &[("verdict", "dismissed"), ("note", "a real OTP")],
        )
        .await;
    assert_eq!((decided.status, decided.location.as_deref()), (303, Some("/operator/reviews?done=dismissed")));
    let item = cx.store().review_entry(items[0].id).await.unwrap();
    assert_eq!(
        (item.status.as_str(), item.decided_by.as_deref(), item.note.as_deref()),
        ("dismissed", Some("ops@gateway.example"), Some("a real OTP"))
    );
    assert_eq!(operator.get("/operator/reviews").await.body.matches("Use coupon SAVE10").count(), 2, "pending only");
    assert!(operator.get("/operator/reviews?status=dismissed").await.body.contains("a real OTP"));
    // Resumed from the queue, the instance sends again.
    operator.submit("/operator/reviews", &format!("/operator/instances/{}/resume", cx.tenant.instance_id), &[]).await;
    assert_eq!(cx.send_json(&send("transactional", "+14155551410", "Your order has shipped.")).await.0, 200);
    // The customer's message log shows every module's verdict, with version and rule.
    expect_raw(
        cx.send_json(&send("transactional", "+14155551411", "Flash sale! 70% off, shop now")).await,
        403,
        "policy_violation",
    );
    let owner =
        signed_in(cx.store(), &cx.config, &cx.base_url, Some(&cx.tenant.customer_id), "owner@a.example", Role::Owner)
            .await;
    let log = owner.get("/messages?decision=refused").await;
    assert!(log.body.contains("marketing_content") && log.body.contains("ul class=\"trace\""), "{}", log.body);
    assert!(log.body.contains("pacing") && log.body.contains("1.0.0"));
    cx.teardown().await;
}

#[tokio::test]
async fn the_operator_uploads_reloads_and_rolls_back_policy_modules_in_the_console() {
    use base64::Engine as _;
    use gateway_sdk_tests::dashboard::signed_in;
    use gateway_server::dashboard::roles::Role;
    let dir = tempfile::tempdir().unwrap();
    let policies_dir = dir.path().to_path_buf();
    let cx = TestContext::with("pol_dash_modules", |c| c.policies_dir = Some(policies_dir.display().to_string()), None)
        .await;
    let operator = signed_in(cx.store(), &cx.config, &cx.base_url, None, "ops@gateway.example", Role::Operator).await;
    let page = operator.get("/operator/policies").await;
    assert_eq!(page.status, 200);
    for module in ["purpose", "content", "pacing"] {
        assert!(page.body.contains(module), "{module}");
    }
    let (_, content) = bundled::MODULES.iter().find(|(n, _)| *n == "content").unwrap();
    let sha = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(content));
    assert!(page.body.contains(&sha[..12]), "the hash of the running module");
    // A module that fails its own fixtures is refused, and nothing is written.
    let b64 = |bytes: &[u8]| base64::engine::general_purpose::STANDARD.encode(bytes);
    let deny = Behaviour::Deny { code: "held", reason: "every message is held", risk: 90 };
    let broken = policy("content", "9.0.0", "content", &deny, &expecting("allow"));
    let refused =
        operator.submit("/operator/policies", "/operator/policies/upload", &[("module", &b64(&broken))]).await;
    assert_eq!(refused.status, 400);
    assert!(refused.body.contains("fails its fixtures (0 passed, 1 failed)"), "{}", refused.body);
    assert!(cx.store().live_policy_modules().await.unwrap().is_empty(), "nothing stored");
    // A good one is checked, installed in the store, and every gateway loads it.
    let good = policy("content", "9.0.0", "content", &deny, &expecting("deny"));
    let installed =
        operator.submit("/operator/policies", "/operator/policies/upload", &[("module", &b64(&good))]).await;
    assert_eq!(installed.status, 200, "{}", installed.body);
    assert!(installed.body.contains("content@9.0.0") && installed.body.contains("passed its 1 fixtures"));
    let stored = cx.store().live_policy_modules().await.unwrap();
    assert_eq!((stored.len(), stored[0].version.as_str()), (1, "9.0.0"));
    assert_eq!(cx.store().policy_module_bytes(stored[0].id).await.unwrap(), good);
    assert!(!dir.path().join("content.wasm").exists(), "the store, not this machine's directory");
    let live = |version: &'static str| {
        let policies = cx.server.policies().unwrap().clone();
        async move {
            let deadline = Instant::now() + Duration::from_secs(20);
            while !policies.status().modules.iter().any(|m| m.name == "content" && m.version == version) {
                assert!(Instant::now() < deadline, "content {version} never went live");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    live("9.0.0").await;
    expect_raw(
        cx.send_json(&send("transactional", "+14155551501", "Your order has shipped.")).await,
        403,
        "policy_violation",
    );
    // Roll back from the console.
    let rolled = operator.submit("/operator/policies", "/operator/policies/rollback", &[("name", "content")]).await;
    assert_eq!(rolled.status, 303);
    live("1.0.0").await;
    assert_eq!(cx.send_json(&send("transactional", "+14155551502", "Your order has shipped.")).await.0, 200);
    let page = operator.get("/operator/policies").await;
    assert!(page.body.contains("9.0.0") && cx.store().live_policy_modules().await.unwrap().is_empty(), "{}", page.body);
    // Reload from the console: the command reaches the gateway.
    let reloaded = operator.submit("/operator/policies", "/operator/policies/reload", &[]).await;
    assert_eq!(reloaded.status, 303);
    cx.teardown().await;
}

/// 40 concurrent sends to strangers from a new number (ten new recipients on day one):
/// exactly ten pass, and each counts once, however the requests interleave.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pacing_caps_are_exact_under_concurrency() {
    let cx = TestContext::new("pol_exact").await;
    cx.lift_velocity(&cx.tenant.customer_id).await;
    let limits = gateway_server::store::LimitOverrides { daily: Some(10_000), ..Default::default() };
    gateway_server::ops::set_limits(cx.store(), &cx.tenant.customer_id, &limits).await.unwrap();
    cx.store().set_instance_age(&cx.tenant.instance_id, 0).await.unwrap();
    let answers =
        futures::future::join_all((0..40).map(|i| {
            cx.send_json_owned(send("transactional", &format!("+141555507{i:02}"), "Your order has shipped."))
        }))
        .await;
    let passed = answers.iter().filter(|(s, _)| *s == 200).count();
    assert_eq!(passed, 10, "{:?}", answers.iter().map(|(s, b)| (*s, b["details"]["rule"].clone())).collect::<Vec<_>>());
    assert!(answers.iter().all(|(s, b)| *s == 200 || b["details"]["rule"] == "warmup_new_recipient_limit"));
    let log = cx.store().recent_log(&cx.tenant.customer_id, 100).await.unwrap();
    assert_eq!(log.iter().filter(|(_, e)| e.status == "sent").count(), 10);
    assert_eq!(log.len(), 40, "every attempt has one row");
    // Refused before its attempt row, or after it, once the counters it took said
    // otherwise: either way a refusal, as decision and as status.
    assert!(
        log.iter()
            .all(|(_, e)| e.status == "sent" || (e.status.as_str(), e.decision.as_str()) == ("refused", "refused"))
    );
    // One reading of the clock: two (`now - now % day`) name the millisecond before
    // midnight whenever the clock ticks between them (0 where 10 was due, once in about
    // 200 runs).
    let now = gateway_server::store::now_ms();
    let day = now - now.rem_euclid(86_400_000);
    let new_today = cx.store().counter(&format!("inew:{}", cx.tenant.instance_id), day).await.unwrap();
    assert_eq!(new_today, 10, "refused sends gave their counters back");

    // Concurrent first sends to one new number count it once.
    cx.store().set_instance_age(&cx.tenant.instance_id, 30).await.unwrap();
    let answers = futures::future::join_all(
        (0..8).map(|_| cx.send_json_owned(send("transactional", "+14155550798", "Your order has shipped."))),
    )
    .await;
    assert!(answers.iter().all(|(s, _)| *s == 200), "{answers:?}");
    let new_today = cx.store().counter(&format!("inew:{}", cx.tenant.instance_id), day).await.unwrap();
    assert_eq!(new_today, 11, "one new recipient, not eight");

    // The never-replied cap (ten in 24 hours) holds the same way.
    let answers = futures::future::join_all(
        (0..30).map(|i| cx.send_json_owned(send("transactional", "+14155550797", &format!("Update {i}")))),
    )
    .await;
    let passed = answers.iter().filter(|(s, _)| *s == 200).count();
    assert_eq!(passed, 10, "{:?}", answers.iter().map(|(s, b)| (*s, b["details"]["rule"].clone())).collect::<Vec<_>>());
    cx.teardown().await;
}

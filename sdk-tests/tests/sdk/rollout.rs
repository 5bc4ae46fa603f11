//! Shipping a policy module knowing what it will do: backtest on kept inputs, shadow,
//! canary and scope, on one store shared by two gateways (docs/policies.md, "Ship
//! safely"). The module under test denies every message, so its verdicts differ from
//! the bundled content module's on every allowed send.

use gateway_sdk_tests::TestContext;
use gateway_sdk_tests::wasm::{Behaviour, drop_in, expecting, policy};
use gateway_server::policy::backtest::{self, Window};
use gateway_server::policy::reload::PolicyControl;
use gateway_server::policy::tools;
use gateway_server::store::{PolicyInputQuery, Rollout, RolloutMode};
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::{Duration, Instant};

const DENY: Behaviour = Behaviour::Deny { code: "held", reason: "every message is held", risk: 90 };

fn deny_module(name: &str, version: &str) -> Vec<u8> {
    policy(name, version, "content", &DENY, &expecting("deny"))
}

fn body(phone: &str, text: &str) -> Value {
    json!({"instance_id": "main", "phone": phone, "message_purpose": "transactional", "message": text})
}

/// A gateway whose pacing module allows everything (these tests send to many new
/// numbers), with limits lifted; and its policies directory.
async fn context(name: &str) -> (TestContext, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    drop_in(
        dir.path(),
        "pacing.wasm",
        &policy("pacing", "0.0.0-test", "content", &Behaviour::Allow, &expecting("allow")),
    );
    let path = dir.path().display().to_string();
    let cx = TestContext::with(name, |c| c.policies_dir = Some(path), None).await;
    cx.lift_velocity(&cx.tenant.customer_id).await;
    (cx, dir)
}

/// Waits up to 5 s until `control` runs the module `sha256` in `mode`; how long it took.
async fn runs(control: &PolicyControl, sha256: &str, mode: &str, since: Instant) -> Duration {
    loop {
        let status = control.status();
        if status.modules.iter().any(|m| m.sha256 == sha256 && m.mode == mode) {
            return since.elapsed();
        }
        assert!(since.elapsed() < Duration::from_secs(5), "{sha256} not {mode} within 5 s: {:?}", status.modules);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits up to 5 s until `control` runs no module of `name` but in mode `live`.
async fn only_live(control: &PolicyControl, name: &str, since: Instant) {
    loop {
        let status = control.status();
        if status.modules.iter().filter(|m| m.name == name).all(|m| m.mode == "live" && m.customers.is_empty()) {
            return;
        }
        assert!(since.elapsed() < Duration::from_secs(5), "{name} still has a trial: {:?}", status.modules);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn send_via(cx: &TestContext, base_url: &str, key: &str, body: &Value) -> (u16, Value) {
    let response =
        cx.http.post(format!("{base_url}/api/send-message")).bearer_auth(key).json(body).send().await.unwrap();
    (response.status().as_u16(), response.json().await.unwrap())
}

fn trace_of(entry: &gateway_server::store::LogEntry) -> Vec<Value> {
    serde_json::from_str(entry.policy_trace.as_deref().unwrap_or("[]")).unwrap()
}

fn shadow_changes(module: &str, change: &str) -> u64 {
    gateway_server::metrics::get().policy_shadow_changes.with_label_values(&[module, change]).get()
}

fn window() -> Window {
    Window { since_ms: 3_600_000, customer: None, limit: 100_000 }
}

#[tokio::test]
async fn a_shadow_decides_nothing_reports_what_it_would_change_and_is_promoted_on_every_replica() {
    let (cx, dir) = context("rollout_shadow").await;
    let b = cx.second_replica(dir.path()).await;
    let b_url = format!("http://{}", b.local_addr());
    let (a_policies, b_policies) = (cx.server.policies().unwrap().clone(), b.policies().unwrap().clone());
    let host = Arc::clone(a_policies.host());
    let key = cx.tenant.api_key.clone();

    // A module failing its own fixtures is never stored, in any mode.
    let broken = policy("content", "6.0.0", "content", &DENY, &expecting("allow"));
    for rollout in [
        Rollout { mode: RolloutMode::Shadow, ..Rollout::default() },
        Rollout { mode: RolloutMode::Canary(10), ..Rollout::default() },
        Rollout { customers: vec![cx.tenant.customer_id.clone()], ..Rollout::default() },
    ] {
        let refused = tools::install_as(cx.store(), host.clone(), broken.clone(), "test", rollout).await;
        assert!(refused.is_err_and(|e| e.to_string().contains("fixtures")));
    }
    assert!(cx.store().live_policy_modules().await.unwrap().is_empty());

    // The shadow runs on both replicas within 5 s.
    let shadow = Rollout { mode: RolloutMode::Shadow, ..Rollout::default() };
    let installed_at = Instant::now();
    let (module, stored) =
        tools::install_as(cx.store(), host.clone(), deny_module("content", "2.0.0"), "test", shadow).await.unwrap();
    assert_eq!(stored.rollout.mode, RolloutMode::Shadow);
    let took = (
        runs(&a_policies, &module.sha256, "shadow", installed_at).await,
        runs(&b_policies, &module.sha256, "shadow", installed_at).await,
    );
    eprintln!("shadow running on A after {:?}, on B after {:?}", took.0, took.1);
    let live_content =
        |c: &PolicyControl| c.status().modules.iter().filter(|m| m.name == "content" && m.mode == "live").count();
    assert_eq!((live_content(&a_policies), live_content(&b_policies)), (1, 1), "the live module stays");

    // It never changes an answer; its verdicts go into the trace marked shadow.
    let same_before = shadow_changes("content", "allow->deny");
    for (i, base) in [&cx.base_url, &b_url, &cx.base_url, &b_url, &cx.base_url, &b_url].into_iter().enumerate() {
        let (status, answer) =
            send_via(&cx, base, &key, &body(&format!("+1415555300{i}"), "Your order has shipped.")).await;
        assert_eq!(status, 200, "{answer}");
    }
    let log = cx.store().recent_log(&cx.tenant.customer_id, 10).await.unwrap();
    assert_eq!(log.len(), 6);
    for (id, entry) in &log {
        assert_eq!(entry.status, "sent", "row {id}");
        let trace = trace_of(entry);
        let live = trace.iter().find(|t| t["module"] == "content" && t.get("mode").is_none()).unwrap();
        assert_eq!(live["decision"], "allow", "{trace:?}");
        let shadow = trace.iter().find(|t| t["mode"] == "shadow").unwrap_or_else(|| panic!("row {id}: {trace:?}"));
        assert_eq!((shadow["module"].as_str(), shadow["version"].as_str()), (Some("content"), Some("2.0.0")));
        assert_eq!((shadow["decision"].as_str(), shadow["code"].as_str()), (Some("deny"), Some("held")));
    }
    assert!(shadow_changes("content", "allow->deny") >= same_before + 6, "the metric counts each change");

    // `policy shadow content` reads the same from the traces.
    let report = backtest::shadow(cx.store(), "content", &window()).await.unwrap();
    assert_eq!(report["module"], "content@2.0.0", "{report}");
    assert_eq!((report["evaluated"].as_u64(), report["same"].as_u64()), (Some(6), Some(0)), "{report}");
    assert_eq!(report["changes"], json!({"allow->deny": 6}), "{report}");
    assert_eq!(report["examples"][0]["rule"], "held", "{report}");
    assert!(report["fuel"]["max"].as_u64().unwrap() > 0, "{report}");

    // `policy list` shows the mode on every gateway.
    let list = tools::list(cx.store()).await.unwrap();
    let gateways = list["gateways"].as_array().unwrap();
    assert_eq!(gateways.len(), 2, "{list}");
    for g in gateways {
        let modules = g["modules"].as_array().unwrap();
        assert!(
            modules.iter().any(|m| m["name"] == "content" && m["mode"] == "shadow" && m["version"] == "2.0.0"),
            "{g}"
        );
        assert!(
            modules.iter().any(|m| m["name"] == "content" && m["mode"] == "live" && m["version"] == "1.0.0"),
            "{g}"
        );
    }

    // Promote: the shadow decides on both replicas within 5 s; the old live module is kept.
    let promoted_at = Instant::now();
    let (ok, promoted) = tools::promote(cx.store(), "content", "test", Duration::from_secs(20)).await.unwrap();
    assert!(ok, "{promoted}");
    assert_eq!((promoted["version"].as_str(), promoted["was"].as_str()), (Some("2.0.0"), Some("shadow")));
    runs(&a_policies, &module.sha256, "live", promoted_at).await;
    runs(&b_policies, &module.sha256, "live", promoted_at).await;
    only_live(&a_policies, "content", promoted_at).await;
    only_live(&b_policies, "content", promoted_at).await;
    for base in [&cx.base_url, &b_url] {
        let (status, answer) = send_via(&cx, base, &key, &body("+14155553100", "Your order has shipped.")).await;
        assert_eq!((status, answer["details"]["policy"].as_str()), (403, Some("content@2.0.0")), "{answer}");
    }
    // Rollback after a promotion: the bundled content module decides again everywhere.
    let (ok, report) = tools::rollback(cx.store(), "content", Duration::from_secs(20)).await.unwrap();
    assert!(ok, "{report}");
    assert_eq!(report["retired"]["version"], "2.0.0", "{report}");
    for base in [&cx.base_url, &b_url] {
        let deadline = Instant::now() + Duration::from_secs(5);
        while send_via(&cx, base, &key, &body("+14155553101", "Your order has shipped.")).await.0 != 200 {
            assert!(Instant::now() < deadline, "the bundled content module is not back on {base}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    b.close().await.unwrap();
    cx.teardown().await;
}

#[tokio::test]
async fn rollback_ends_a_shadow_and_leaves_the_live_module() {
    let (cx, _dir) = context("rollout_shadow_rollback").await;
    let control = cx.server.policies().unwrap().clone();
    let host = Arc::clone(control.host());
    let shadow = Rollout { mode: RolloutMode::Shadow, ..Rollout::default() };
    let (module, _) =
        tools::install_as(cx.store(), host, deny_module("content", "3.0.0"), "test", shadow).await.unwrap();
    runs(&control, &module.sha256, "shadow", Instant::now()).await;
    let (ok, report) = tools::rollback(cx.store(), "content", Duration::from_secs(20)).await.unwrap();
    assert!(ok, "{report}");
    assert_eq!(report["retired"]["version"], "3.0.0", "{report}");
    only_live(&control, "content", Instant::now()).await;
    let content = control.status().modules.into_iter().find(|m| m.name == "content").unwrap();
    assert_eq!((content.version.as_str(), content.source.as_str()), ("1.0.0", "bundled"));
    assert_eq!(cx.send_json(&body("+14155553200", "Your order has shipped.")).await.0, 200);
    let (_, entry) = cx.store().recent_log(&cx.tenant.customer_id, 1).await.unwrap().remove(0);
    assert!(trace_of(&entry).iter().all(|t| t.get("mode").is_none()), "no shadow after the rollback");
    // Promote with no trial running is refused and changes nothing.
    let refused = tools::promote(cx.store(), "content", "test", Duration::from_secs(1)).await;
    assert!(refused.is_err_and(|e| e.to_string().contains("no shadow or canary")));
    cx.teardown().await;
}

#[tokio::test]
async fn a_canary_decides_a_stable_share_and_the_trace_says_which_version_decided() {
    let (cx, _dir) = context("rollout_canary").await;
    let control = cx.server.policies().unwrap().clone();
    let host = Arc::clone(control.host());
    let canary = Rollout { mode: RolloutMode::Canary(30), ..Rollout::default() };
    let (module, _) =
        tools::install_as(cx.store(), host, deny_module("content", "4.0.0"), "test", canary).await.unwrap();
    runs(&control, &module.sha256, "canary 30 %", Instant::now()).await;
    let mut denied = Vec::new();
    for i in 0..60 {
        let send = body(&format!("+1415555{:04}", 3300 + i), &format!("Your order {i} has shipped."));
        let (status, answer) = cx.send_json(&send).await;
        match status {
            200 => {}
            403 => {
                assert_eq!(answer["details"]["policy"], "content@4.0.0", "{answer}");
                denied.push(send);
            }
            other => panic!("{other}: {answer}"),
        }
    }
    // Binomial(60, 0.3): 18 on average; outside 5 to 35 about once in 20,000 runs.
    assert!((5..=35).contains(&denied.len()), "about 30 % of 60 decided by the canary: {}", denied.len());
    // The same send again (a retry) is decided by the same version.
    for send in &denied {
        assert_eq!(cx.send_json(send).await.0, 403, "{send}");
    }
    let log = cx.store().recent_log(&cx.tenant.customer_id, 1_000).await.unwrap();
    for (id, entry) in &log {
        let trace = trace_of(entry);
        let content: Vec<&Value> = trace.iter().filter(|t| t["module"] == "content").collect();
        assert_eq!(content.len(), 1, "one content module decided row {id}: {trace:?}");
        match entry.decision.as_str() {
            "refused" => assert_eq!(
                (content[0]["mode"].as_str(), content[0]["version"].as_str()),
                (Some("canary"), Some("4.0.0"))
            ),
            _ => assert!(content[0].get("mode").is_none() && content[0]["version"] == "1.0.0", "{trace:?}"),
        }
    }
    // Rollback ends the canary: every send is the live module's again.
    let (ok, report) = tools::rollback(cx.store(), "content", Duration::from_secs(20)).await.unwrap();
    assert!(ok, "{report}");
    only_live(&control, "content", Instant::now()).await;
    for send in &denied {
        assert_eq!(cx.send_json(send).await.0, 200, "{send}");
    }
    cx.teardown().await;
}

#[tokio::test]
async fn a_scoped_install_decides_for_its_customers_only() {
    let (cx, _dir) = context("rollout_scope").await;
    let control = cx.server.policies().unwrap().clone();
    let host = Arc::clone(control.host());
    let other = gateway_sdk_tests::create_tenant(cx.store(), &cx.config, "Scale customer", Some("scale")).await;
    cx.lift_velocity(&other.customer_id).await;
    let (mine, theirs) = (cx.tenant.api_key.clone(), other.api_key.clone());
    let ship = |phone: &str| body(phone, "Your order has shipped.");

    // Unknown customers and plans are refused before anything is stored.
    for (customers, plans) in [(vec!["cus_nobody".to_string()], vec![]), (vec![], vec!["gold".to_string()])] {
        let refused = tools::rollout(cx.store(), false, None, &customers, &plans).await;
        assert!(refused.is_err(), "{customers:?} {plans:?}");
    }
    assert!(tools::rollout(cx.store(), true, Some(5), &[], &[]).await.is_err(), "--shadow and --canary");
    assert!(tools::rollout(cx.store(), false, Some(100), &[], &[]).await.is_err(), "--canary 100");

    // Under the name of a live module: a stricter content for this customer alone.
    let scoped =
        tools::rollout(cx.store(), false, None, std::slice::from_ref(&cx.tenant.customer_id), &[]).await.unwrap();
    let (module, _) =
        tools::install_as(cx.store(), host.clone(), deny_module("content", "5.0.0"), "test", scoped).await.unwrap();
    runs(&control, &module.sha256, "live", Instant::now()).await;
    let (status, answer) = send_via(&cx, &cx.base_url, &mine, &ship("+14155553400")).await;
    assert_eq!((status, answer["details"]["policy"].as_str()), (403, Some("content@5.0.0")), "{answer}");
    let (_, entry) = cx.store().recent_log(&cx.tenant.customer_id, 1).await.unwrap().remove(0);
    let content: Vec<Value> = trace_of(&entry).into_iter().filter(|t| t["module"] == "content").collect();
    assert_eq!((content.len(), content[0]["mode"].as_str()), (1, Some("scoped")), "{content:?}");
    assert_eq!(send_via(&cx, &cx.base_url, &theirs, &ship("+14155553401")).await.0, 200, "other customers as before");

    // Under a new name, by plan: an extra rule for Scale customers only.
    let by_plan = tools::rollout(cx.store(), false, None, &[], &["scale".to_string()]).await.unwrap();
    let (extra, _) =
        tools::install_as(cx.store(), host.clone(), deny_module("extra", "1.0.0"), "test", by_plan).await.unwrap();
    runs(&control, &extra.sha256, "live", Instant::now()).await;
    let (status, answer) = send_via(&cx, &cx.base_url, &theirs, &ship("+14155553402")).await;
    assert_eq!((status, answer["details"]["policy"].as_str()), (403, Some("extra@1.0.0")), "{answer}");
    let (_, entry) = cx.store().recent_log(&other.customer_id, 1).await.unwrap().remove(0);
    let content = trace_of(&entry).into_iter().find(|t| t["module"] == "content").unwrap();
    assert!(content.get("mode").is_none() && content["version"] == "1.0.0", "the live content module: {content}");

    // `policy list` shows each mode and scope.
    let status = control.status();
    let extra_status = status.modules.iter().find(|m| m.name == "extra").unwrap();
    assert_eq!((extra_status.mode.as_str(), extra_status.plans.clone()), ("live", vec!["scale".to_string()]));
    assert_eq!(status.modules.iter().filter(|m| m.name == "content").count(), 2, "{:?}", status.modules);

    // Rollback removes a scoped install: everyone is decided as before.
    for name in ["extra", "content"] {
        let (ok, report) = tools::rollback(cx.store(), name, Duration::from_secs(20)).await.unwrap();
        assert!(ok, "{report}");
    }
    only_live(&control, "content", Instant::now()).await;
    assert!(!control.status().modules.iter().any(|m| m.name == "extra"));
    assert_eq!(send_via(&cx, &cx.base_url, &mine, &ship("+14155553403")).await.0, 200);
    assert_eq!(send_via(&cx, &cx.base_url, &theirs, &ship("+14155553404")).await.0, 200);
    cx.teardown().await;
}

/// Waits until `n` inputs of `customer` are kept.
async fn kept(cx: &TestContext, customer: &str, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let q = PolicyInputQuery { from: 0, before: i64::MAX, customer_id: Some(customer.to_string()), limit: 1_000 };
        let found = cx.store().policy_inputs_page(&q).await.unwrap().len();
        if found == n {
            return;
        }
        assert!(Instant::now() < deadline, "{found} of {n} inputs kept");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn a_backtest_asks_a_module_about_the_kept_inputs_and_erasure_and_retention_remove_them() {
    let (cx, _dir) = context("rollout_backtest").await;
    let control = cx.server.policies().unwrap().clone();
    let host = Arc::clone(control.host());
    let customer = cx.tenant.customer_id.clone();
    for i in 0..5 {
        assert_eq!(cx.send_json(&body(&format!("+141555535{i:02}"), "Your order has shipped.")).await.0, 200);
    }
    let promo = body("+14155553599", "Black Friday: 50% OFF everything, promo code BF50!");
    assert_eq!(cx.send_json(&promo).await.0, 403, "the live content module refuses it");
    kept(&cx, &customer, 6).await;
    let q = PolicyInputQuery { from: 0, before: i64::MAX, customer_id: Some(customer.clone()), limit: 1 };
    let newest = cx.store().policy_inputs_page(&q).await.unwrap().remove(0);
    let context: Value = serde_json::from_str(&newest.context).unwrap();
    assert_eq!(context["text"], "Black Friday: 50% OFF everything, promo code BF50!", "the text is kept");
    assert_eq!(context["stage"], "purpose");
    assert!(context["counters"].is_object(), "{context}");

    // A stricter content module: the five allowed sends would have been denied.
    let module = Arc::new(host.load(&deny_module("content", "2.0.0"), "test", true).unwrap());
    let mut progress = Vec::new();
    let report = backtest::backtest(cx.store(), &host, module, &window(), |n| progress.push(n)).await.unwrap();
    assert_eq!(report["module"], "content@2.0.0", "{report}");
    assert_eq!(
        (report["evaluated"].as_u64(), report["same"].as_u64(), report["changed"].as_u64()),
        (Some(6), Some(1), Some(5)),
        "{report}"
    );
    assert_eq!(report["changes"], json!({"allow->deny": 5}), "{report}");
    assert_eq!(report["errors"], 0);
    assert_eq!(report["examples"].as_array().unwrap().len(), 5, "{report}");
    assert_eq!(
        (report["examples"][0]["rule"].as_str(), report["examples"][0]["reason"].as_str()),
        (Some("held"), Some("every message is held"))
    );
    assert_eq!(progress.last(), Some(&6));
    // A module under a new name decides in addition: the refused send stays refused.
    let extra = Arc::new(host.load(&deny_module("extra", "1.0.0"), "test", true).unwrap());
    let report = backtest::backtest(cx.store(), &host, extra, &window(), |_| {}).await.unwrap();
    assert_eq!(report["changes"], json!({"allow->deny": 5}), "{report}");
    // An allow-all content module would have let the promotion through.
    let open = Arc::new(
        host.load(&policy("content", "0.1.0", "content", &Behaviour::Allow, &expecting("allow")), "test", true)
            .unwrap(),
    );
    let only_mine = Window { customer: Some(customer.clone()), limit: 3, ..window() };
    let report = backtest::backtest(cx.store(), &host, open, &only_mine, |_| {}).await.unwrap();
    assert_eq!(
        (report["evaluated"].as_u64(), report["changes"].clone()),
        (Some(3), json!({"deny->allow": 1})),
        "{report}"
    );
    let none = Window { customer: Some("cus_other".into()), ..window() };
    let module = Arc::new(host.load(&deny_module("content", "2.0.0"), "test", true).unwrap());
    assert_eq!(backtest::backtest(cx.store(), &host, module, &none, |_| {}).await.unwrap()["evaluated"], 0);

    // Erasure removes the person's inputs; retention removes the rest past their time.
    let erased = gateway_server::ops::data::erase_person(cx.store(), &customer, "+14155553599").await.unwrap();
    assert!(erased.to_string().contains("policy_inputs"), "{erased}");
    kept(&cx, &customer, 5).await;
    let mut config = cx.config.clone();
    config.policies.input_retention_days = 0;
    let mut plan = gateway_server::retention_plan(&config, gateway_server::store::now_ms() + 1);
    plan.message_log_before = 0;
    cx.store().run_retention(&plan).await.unwrap();
    kept(&cx, &customer, 0).await;
    assert_eq!(cx.store().recent_log(&customer, 100).await.unwrap().len(), 6, "the message log stays");
    cx.teardown().await;
}

#[tokio::test]
async fn with_input_retention_zero_nothing_is_kept_and_backtesting_is_off() {
    let dir = tempfile::tempdir().unwrap();
    let cx = TestContext::with("rollout_no_inputs", |c| c.policies.input_retention_days = 0, None).await;
    assert_eq!(cx.send_json(&body("+14155553600", "Your order has shipped.")).await.0, 200);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let q = PolicyInputQuery { from: 0, before: i64::MAX, customer_id: None, limit: 10 };
    assert!(cx.store().policy_inputs_page(&q).await.unwrap().is_empty());
    let file = dir.path().join("content.wasm");
    std::fs::write(&file, deny_module("content", "2.0.0")).unwrap();
    let refused = tools::backtest_file(cx.store(), &cx.config.policies, &file, &window()).await;
    assert!(refused.is_err_and(|e| e.to_string().contains("backtesting is off")));
    cx.teardown().await;
}

#[tokio::test]
async fn the_operator_backtests_shadows_and_promotes_in_the_console() {
    use base64::Engine as _;
    use gateway_sdk_tests::dashboard::signed_in;
    use gateway_server::dashboard::roles::Role;
    let (cx, _dir) = context("rollout_console").await;
    let control = cx.server.policies().unwrap().clone();
    let operator = signed_in(cx.store(), &cx.config, &cx.base_url, None, "ops@gateway.example", Role::Operator).await;
    let b64 = |bytes: &[u8]| base64::engine::general_purpose::STANDARD.encode(bytes);
    let strict = deny_module("content", "2.0.0");
    for i in 0..4 {
        assert_eq!(cx.send_json(&body(&format!("+141555539{i:02}"), "Your order has shipped.")).await.0, 200);
    }
    kept(&cx, &cx.tenant.customer_id, 4).await;

    // A backtest of an uploaded module: the same numbers as the CLI, each example linked.
    let form = [("module", b64(&strict)), ("since", "1h".into()), ("customer", String::new()), ("limit", "100".into())];
    let form: Vec<(&str, &str)> = form.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let page = operator.submit("/operator/policies", "/operator/policies/backtest", &form).await;
    assert_eq!(page.status, 200, "{}", page.body);
    assert!(page.body.contains("Backtest of") && page.body.contains("content@2.0.0"), "{}", page.body);
    assert!(page.body.contains(r#"<dd class="evaluated">4</dd>"#), "{}", page.body);
    assert!(
        page.body.contains(r#"<dd class="changed">4</dd>"#) && page.body.contains("allow-&gt;deny"),
        "{}",
        page.body
    );
    let q = PolicyInputQuery { from: 0, before: i64::MAX, customer_id: None, limit: 1 };
    let newest = cx.store().policy_inputs_page(&q).await.unwrap().remove(0).log_id;
    let link = format!("/operator/messages/{newest}");
    assert!(page.body.contains(&format!(r#"href="{link}""#)), "{}", page.body);
    let message = operator.get(&link).await;
    assert_eq!(message.status, 200);
    assert!(message.body.contains("allowed · sent") && message.body.contains("content"), "{}", message.body);
    let bad = [("module", b64(&strict)), ("since", "forever".into()), ("limit", "100".into())];
    let bad: Vec<(&str, &str)> = bad.iter().map(|(k, v)| (*k, v.as_str())).collect();
    assert_eq!(operator.submit("/operator/policies", "/operator/policies/backtest", &bad).await.status, 400);

    // Upload as a shadow: the page shows its mode and, after sends, its agreement.
    let shadow = [("module", b64(&strict)), ("mode", "shadow".into())];
    let shadow: Vec<(&str, &str)> = shadow.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let installed = operator.submit("/operator/policies", "/operator/policies/upload", &shadow).await;
    assert_eq!(installed.status, 200, "{}", installed.body);
    assert!(installed.body.contains("as shadow for everyone"), "{}", installed.body);
    let sha = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(&strict));
    runs(&control, &sha, "shadow", Instant::now()).await;
    for i in 0..3 {
        assert_eq!(cx.send_json(&body(&format!("+141555539{:02}", 50 + i), "Your order has shipped.")).await.0, 200);
    }
    let page = operator.get("/operator/policies").await;
    assert!(page.body.contains(r#"id="shadows""#) && page.body.contains("Shadow of"), "{}", page.body);
    assert!(page.body.contains(r#"<dd class="evaluated">3</dd>"#), "{}", page.body);
    assert!(page.body.contains(r#"<dd class="same">0 (0.0 %)</dd>"#), "{}", page.body);
    assert!(page.body.contains("Promote"), "{}", page.body);
    // A canary share out of range is refused; promote makes the shadow decide.
    let canary = [("module", b64(&strict)), ("mode", "canary".into()), ("percent", "0".into())];
    let canary: Vec<(&str, &str)> = canary.iter().map(|(k, v)| (*k, v.as_str())).collect();
    assert_eq!(operator.submit("/operator/policies", "/operator/policies/upload", &canary).await.status, 400);
    let promoted = operator.submit("/operator/policies", "/operator/policies/promote", &[("name", "content")]).await;
    assert_eq!(promoted.status, 303);
    runs(&control, &sha, "live", Instant::now()).await;
    only_live(&control, "content", Instant::now()).await;
    assert_eq!(cx.send_json(&body("+14155553960", "Your order has shipped.")).await.0, 403);
    cx.teardown().await;
}

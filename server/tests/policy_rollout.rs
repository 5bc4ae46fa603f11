//! Shipping a policy module through the `gateway` binary as an operator does, against a
//! running `gateway serve` (docs/policies.md, "Ship safely"): backtest, install as a
//! shadow, read the shadow's report, promote, roll back; and the flags refused.

mod common;

use common::{Db, free_port, gateway, run_json, serve};
use gateway_sdk_tests::wasm::{Behaviour, expecting, policy};
use serde_json::{Value, json};
use std::time::{Duration, Instant};

/// Runs a CLI command: (success, JSON of stdout or stderr, stderr).
fn cli(url: &str, args: &[&str]) -> (bool, Value, String) {
    let out = gateway(url, args, &[]).output().expect("gateway runs");
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    let text = if out.status.success() { String::from_utf8_lossy(&out.stdout).to_string() } else { stderr.clone() };
    let json = serde_json::from_str(text.trim())
        .or_else(|_| serde_json::from_str(text.lines().last().unwrap_or_default()))
        .unwrap_or_else(|e| panic!("{args:?} printed no JSON ({e}): {text}"));
    (out.status.success(), json, stderr)
}

async fn send(http: &reqwest::Client, port: u16, key: &str, phone: &str) -> (u16, Value) {
    common::send_text(http, port, key, phone, "Your order has shipped.").await
}

/// Polls a CLI report until `evaluated` reaches `n` (inputs are kept in batches).
fn report_until(url: &str, args: &[&str], n: u64) -> (Value, String) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (ok, report, stderr) = cli(url, args);
        assert!(ok, "{args:?}: {report}");
        if report["evaluated"] == n || Instant::now() >= deadline {
            return (report, stderr);
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_backtests_shadows_promotes_and_rolls_back_a_module_with_the_cli() {
    let db = Db::new("rollout_cli").await;
    let demo = run_json(gateway(&db.url, &["demo"], &[]));
    let (key, customer) = (demo["api_key"].as_str().unwrap(), demo["customer_id"].as_str().unwrap());
    let dir = tempfile::tempdir().unwrap();
    let file = |name: &str| dir.path().join(name).display().to_string();
    // Pacing would rightly stop a flood of first messages; an open module stands in.
    let policies = dir.path().join("policies");
    std::fs::create_dir(&policies).unwrap();
    let open = policy("pacing", "0.0.0-test", "content", &Behaviour::Allow, &expecting("allow"));
    std::fs::write(policies.join("pacing.wasm"), open).unwrap();
    let deny = Behaviour::Deny { code: "held", reason: "every message is held", risk: 90 };
    std::fs::write(file("strict.wasm"), policy("content", "2.0.0", "content", &deny, &expecting("deny"))).unwrap();
    let broken = policy("content", "2.0.1", "content", &deny, &expecting("allow"));
    std::fs::write(file("broken.wasm"), broken).unwrap();

    std::fs::write(file("extra.wasm"), policy("extra", "1.0.0", "content", &deny, &expecting("deny"))).unwrap();
    let port = free_port();
    let metrics = format!("127.0.0.1:{}", free_port());
    let policies_dir = policies.display().to_string();
    let env = [
        ("GATEWAY_POLICIES_DIR", policies_dir.as_str()),
        ("GATEWAY_WEBHOOKS__DISPATCH", "false"),
        ("GATEWAY_METRICS_LISTEN", metrics.as_str()),
    ];
    let server = serve(gateway(&db.url, &[], &env), port).await;
    let http = reqwest::Client::new();
    for i in 0..5 {
        assert_eq!(send(&http, port, key, &format!("+1415555380{i}")).await.0, 200);
    }

    // Backtest: what the stricter module would have done to the last hour's sends.
    let (report, stderr) = report_until(&db.url, &["policy", "backtest", &file("strict.wasm"), "--since", "1h"], 5);
    assert_eq!(report["module"], "content@2.0.0", "{report}");
    assert_eq!((report["evaluated"].as_u64(), report["changed"].as_u64()), (Some(5), Some(5)), "{report}");
    assert_eq!(report["changes"], json!({"allow->deny": 5}), "{report}");
    assert!(stderr.contains("backtest: 5 sends evaluated"), "progress on stderr: {stderr}");
    let scoped = cli(&db.url, &["policy", "backtest", &file("strict.wasm"), "--customer", "cus_nobody"]).1;
    assert_eq!(scoped["evaluated"], 0, "{scoped}");

    // Refused flags, and a module failing its checks, change nothing.
    for (args, says) in [
        (vec!["--canary", "0"], "1 to 99"),
        (vec!["--canary", "100"], "1 to 99"),
        (vec!["--shadow", "--canary", "5"], "do not combine"),
        (vec!["--shadow", "--customers", customer], "do not combine"),
        (vec!["--plans", "gold"], "no plan"),
        (vec!["--customers", "cus_nobody"], "no customer"),
    ] {
        let strict = file("strict.wasm");
        let mut command = vec!["policy", "install", strict.as_str()];
        command.extend(args.iter().copied());
        let (ok, err, _) = cli(&db.url, &command);
        assert!(!ok && err["error"].as_str().unwrap().contains(says), "{command:?}: {err}");
    }
    let (ok, err, _) = cli(&db.url, &["policy", "install", &file("broken.wasm"), "--shadow"]);
    assert!(!ok && err["error"].as_str().unwrap().contains("fixtures"), "{err}");
    let (ok, err, _) = cli(&db.url, &["policy", "backtest", &file("strict.wasm"), "--since", "5x"]);
    assert!(!ok && err["error"].as_str().unwrap().contains("--since"), "{err}");
    let (ok, err, _) = cli(&db.url, &["policy", "promote", "content"]);
    assert!(!ok && err["error"].as_str().unwrap().contains("no shadow or canary"), "{err}");

    // Shadow: installed on the running gateway, it changes no answer.
    let (ok, installed, _) = cli(&db.url, &["policy", "install", &file("strict.wasm"), "--shadow"]);
    assert!(ok, "{installed}");
    assert_eq!((installed["mode"].as_str(), installed["scope"].as_str()), (Some("shadow"), Some("everyone")));
    assert_eq!(installed["gateways"][0]["live"], true, "{installed}");
    let list = cli(&db.url, &["policy", "list"]).1;
    let modules = list["gateways"][0]["modules"].as_array().unwrap().clone();
    let modes: Vec<(&str, &str)> = modules
        .iter()
        .filter(|m| m["name"] == "content")
        .map(|m| (m["version"].as_str().unwrap(), m["mode"].as_str().unwrap()))
        .collect();
    assert_eq!(modes, [("1.0.0", "live"), ("2.0.0", "shadow")], "{list}");
    for i in 0..3 {
        assert_eq!(send(&http, port, key, &format!("+1415555381{i}")).await.0, 200);
    }
    let (report, _) = report_until(&db.url, &["policy", "shadow", "content", "--since", "1h"], 3);
    assert_eq!(report["module"], "content@2.0.0", "{report}");
    assert_eq!(report["changes"], json!({"allow->deny": 3}), "{report}");
    let metrics_off = cli(&db.url, &["policy", "shadow", "purpose"]).1;
    assert_eq!(metrics_off["evaluated"], 0, "no shadow of purpose ran: {metrics_off}");

    // A shadow under a new name: its counters are there at 0 as soon as it runs; a send
    // it would refuse counts as `allow->deny` (it would decide in addition).
    let scrape = || async {
        let text = http.get(format!("http://{metrics}/metrics")).send().await.unwrap().text().await.unwrap();
        let value = |change: &str| {
            let series = format!("gateway_policy_shadow_changes_total{{change=\"{change}\",module=\"extra\"}} ");
            text.lines().find_map(|l| l.strip_prefix(series.as_str()).map(|v| v.trim().to_string()))
        };
        (value("review->deny"), value("allow->deny"))
    };
    assert_eq!(scrape().await, (None, None), "no series for a module that is not there");
    let (ok, installed, _) = cli(&db.url, &["policy", "install", &file("extra.wasm"), "--shadow"]);
    assert!(ok, "{installed}");
    assert_eq!(scrape().await, (Some("0".into()), Some("0".into())));
    assert_eq!(send(&http, port, key, "+14155553815").await.0, 200);
    assert_eq!(scrape().await, (Some("0".into()), Some("1".into())));
    let (ok, rolled, _) = cli(&db.url, &["policy", "rollback", "extra"]);
    assert!(ok && rolled["retired"]["name"] == "extra" && rolled["retired"]["mode"] == "shadow", "{rolled}");

    // Promote: it decides; rollback: the bundled module decides again.
    let (ok, promoted, _) = cli(&db.url, &["policy", "promote", "content"]);
    assert!(ok, "{promoted}");
    assert_eq!((promoted["version"].as_str(), promoted["was"].as_str()), (Some("2.0.0"), Some("shadow")));
    let (status, answer) = send(&http, port, key, "+14155553820").await;
    assert_eq!((status, answer["details"]["policy"].as_str()), (403, Some("content@2.0.0")), "{answer}");
    let (ok, rolled, _) = cli(&db.url, &["policy", "rollback", "content"]);
    assert!(ok, "{rolled}");
    assert_eq!(rolled["retired"]["version"], "2.0.0", "{rolled}");
    assert_eq!(send(&http, port, key, "+14155553821").await.0, 200);
    drop(server);
    db.drop_it().await;
}

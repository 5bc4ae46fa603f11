//! The `gateway` binary as an operator uses it: every command prints JSON on stdout,
//! creates print the new record's id, and the plan's instance cap applies.

use serde_json::Value;
use std::process::Command;

struct Cli {
    _dir: tempfile::TempDir,
    url: String,
}

impl Cli {
    fn new() -> Cli {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}?mode=rwc", dir.path().join("cli.db").display());
        Cli { _dir: dir, url }
    }

    /// Runs `gateway --database-url URL args...`; returns (success, stdout JSON or stderr JSON).
    fn run(&self, args: &[&str]) -> (bool, Value) {
        self.run_with_env(args, &[])
    }

    /// `run` with extra environment variables.
    fn run_with_env(&self, args: &[&str], env: &[(&str, &str)]) -> (bool, Value) {
        let out = Command::new(env!("CARGO_BIN_EXE_gateway"))
            .arg("--database-url")
            .arg(&self.url)
            .args(args)
            .env_remove("GATEWAY_DATABASE_URL")
            .env_remove("GATEWAY_ALLOW_LOOPBACK_TARGETS")
            .env("GATEWAY_POLICIES__CACHE_DIR", std::env::temp_dir().join("gateway-test-wasm-cache"))
            .envs(env.iter().copied())
            .output()
            .expect("gateway runs");
        let text = if out.status.success() { out.stdout } else { out.stderr };
        let text = String::from_utf8(text).unwrap();
        let json =
            serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("{args:?} printed no JSON ({e}): {text}"));
        (out.status.success(), json)
    }

    fn ok(&self, args: &[&str]) -> Value {
        self.ok_with_env(args, &[])
    }

    fn ok_with_env(&self, args: &[&str], env: &[(&str, &str)]) -> Value {
        let (ok, json) = self.run_with_env(args, env);
        assert!(ok, "{args:?} failed: {json}");
        json
    }
}

#[test]
fn operator_commands_print_json_and_ids() {
    let cli = Cli::new();
    assert_eq!(cli.ok(&["migrate"])["migrated"], true);
    let customer = cli.ok(&["customer", "create", "--name", "Acme", "--plan", "starter"]);
    let id = customer["id"].as_str().unwrap();
    assert!(id.starts_with("cus_"));
    assert_eq!(customer["plan_status"], "active");
    let instance = cli.ok(&["instance", "create", "--customer", id, "--name", "front-desk", "--connected"]);
    assert!(instance["id"].as_str().unwrap().starts_with("ins_"));
    assert_eq!(instance["connection_state"], "open");
    let shown = cli.ok(&["instance", "show", instance["id"].as_str().unwrap()]);
    assert_eq!((shown["lifecycle"].as_str(), shown["qr"].clone()), (Some("connected"), Value::Null));
    let paused = cli.ok(&["instance", "pause", instance["id"].as_str().unwrap(), "--reason", "complaints"]);
    assert_eq!((paused["paused"].as_bool(), paused["paused_reason"].as_str()), (Some(true), Some("complaints")));
    let resumed = cli.ok(&["instance", "resume", instance["id"].as_str().unwrap()]);
    assert_eq!(resumed["paused"], false);
    let key = cli.ok(&["key", "create", "--customer", id, "--name", "ci"]);
    assert!(key["api_key"].as_str().unwrap().starts_with("gw_live_"));
    assert!(key["id"].as_str().unwrap().starts_with("key_"));
    let revoked = cli.ok(&["key", "revoke", key["id"].as_str().unwrap()]);
    assert_eq!(revoked["revoked"], true);
    assert!(revoked.get("api_key").is_none(), "a key is never shown twice");
    let modules = cli.ok(&["customer", "modules", "--customer", id, "--pbx", "on", "--api", "off"]);
    assert_eq!(modules["modules"], serde_json::json!({"api": false, "pbx": true}));
    let limits = cli.ok(&["customer", "limits", "--customer", id, "--daily", "500", "--recipient-per-minute", "9"]);
    assert_eq!(limits["limit_overrides"]["daily"], 500);
    assert_eq!(limits["limit_overrides"]["recipient_per_minute"], 9);
    assert_eq!(limits["limit_overrides"]["monthly"], Value::Null);
    let added = cli.ok(&["suppression", "add", "--customer", id, "--phone", "+1 415 555 0123", "--reason", "asked"]);
    assert_eq!(added["phone"], "+14155550123");
    let removed = cli.ok(&["suppression", "remove", "--customer", id, "--phone", "+14155550123"]);
    assert_eq!(removed["removed"], true);
    let (ok, err) = cli.run(&["suppression", "add", "--customer", id, "--phone", "not a phone"]);
    assert!(!ok && err["error"].as_str().unwrap().contains("not a valid number"));
}

#[test]
fn instance_cap_applies_while_the_plan_is_active() {
    let cli = Cli::new();
    let starter = cli.ok(&["customer", "create", "--name", "Small", "--plan", "starter"]);
    let id = starter["id"].as_str().unwrap();
    cli.ok(&["instance", "create", "--customer", id, "--name", "one"]);
    let (ok, err) = cli.run(&["instance", "create", "--customer", id, "--name", "two"]);
    assert!(!ok, "Starter allows one instance");
    assert!(err["error"].as_str().unwrap().contains("allows 1 instance"), "{err}");
    // Names are unique per customer.
    let scale = cli.ok(&["customer", "create", "--name", "Big", "--plan", "scale"]);
    let big = scale["id"].as_str().unwrap();
    assert_eq!(scale["plan_status"], "pending_approval");
    // Pending approval: instances may be created ahead of approval, beyond any cap.
    for name in ["a", "b"] {
        cli.ok(&["instance", "create", "--customer", big, "--name", name]);
    }
    let (ok, _) = cli.run(&["instance", "create", "--customer", big, "--name", "a"]);
    assert!(!ok, "a second instance named a");
    let approved = cli.ok(&["plan", "assign", "--customer", big, "--plan", "scale", "--approve"]);
    assert_eq!(approved["plan_status"], "active");
    // No plan at all: the same.
    let none = cli.ok(&["customer", "create", "--name", "Later"]);
    assert_eq!(none["plan_status"], "none");
    for name in ["x", "y"] {
        cli.ok(&["instance", "create", "--customer", none["id"].as_str().unwrap(), "--name", name]);
    }
}

#[test]
fn demo_is_idempotent_and_prints_a_working_tenant() {
    let cli = Cli::new();
    let first = cli.ok(&["demo"]);
    let second = cli.ok(&["demo"]);
    assert_eq!(first["customer_id"], second["customer_id"]);
    assert_eq!(first["instance_id"], second["instance_id"]);
    assert_eq!(first["instance_name"], "demo");
    assert_ne!(first["api_key"], second["api_key"], "each run prints a new key");
    let customer = cli.ok(&["customer", "show", first["customer_id"].as_str().unwrap()]);
    assert_eq!((customer["plan"].as_str(), customer["plan_status"].as_str()), (Some("starter"), Some("active")));
}

#[test]
fn pbx_commands_create_show_template_set_rotate_and_list() {
    let cli = Cli::new();
    let customer = cli.ok(&["customer", "create", "--name", "Clinic", "--plan", "starter"]);
    let id = customer["id"].as_str().unwrap();
    cli.ok(&["instance", "create", "--customer", id, "--name", "front-desk", "--connected"]);
    let created =
        cli.ok(&["pbx", "create", "--customer", id, "--instance", "front-desk", "--hmac", "--business-name", "Clinic"]);
    let pbx = created["integration_id"].as_i64().unwrap().to_string();
    let secret = created["webhook_secret"].as_str().unwrap().to_string();
    assert!(secret.starts_with("pbx_"));
    assert!(created["hmac_secret"].as_str().unwrap().starts_with("pbxsig_"));
    assert_eq!(created["webhook_path"], format!("/integrations/pbx/webhook/{pbx}"));
    // The customer's pbx module is off (the default): the output says so.
    assert!(created["warning"].as_str().unwrap().contains("pbx module is off"), "{created}");
    cli.ok(&["customer", "modules", "--customer", id, "--pbx", "on"]);
    let second = cli.ok(&["pbx", "create", "--customer", id, "--instance", "front-desk"]);
    assert!(second.get("warning").is_none(), "{second}");
    let shown = cli.ok(&["pbx", "show", &pbx]);
    assert_eq!((shown["hmac"].as_bool(), shown["business_name"].as_str()), (Some(true), Some("Clinic")));
    assert_eq!((shown["rate_per_minute"].as_i64(), shown["burst"].as_i64()), (Some(60), Some(20)));
    assert_eq!(shown["cooldown_seconds"], 900);
    let text = shown.to_string();
    assert!(!text.contains(&secret) && !text.contains(created["hmac_secret"].as_str().unwrap()), "never shown twice");
    let templated = cli.ok(&[
        "pbx",
        "template",
        "set",
        "--integration",
        &pbx,
        "--event",
        "missed_call",
        "--text",
        "{{business_name}}: we missed your call, we will ring {{customer_phone}} back",
    ]);
    assert_eq!(templated["templates"][0]["event_type"], "missed_call");
    assert_eq!(templated["templates"][0]["purpose"], "support");
    let (ok, err) =
        cli.run(&["pbx", "template", "set", "--integration", &pbx, "--event", "missed_call", "--text", "{{nope}}"]);
    assert!(!ok && err["error"].as_str().unwrap().contains("unknown placeholder"));
    let (ok, _) = cli.run(&["pbx", "template", "set", "--integration", &pbx, "--event", "test", "--text", "x"]);
    assert!(!ok, "test events take no template");
    let set = cli.ok(&[
        "pbx",
        "set",
        "--integration",
        &pbx,
        "--rate-per-minute",
        "120",
        "--burst",
        "5",
        "--cooldown-minutes",
        "30",
        "--strict-window-hours",
        "24",
        "--ip-allowlist",
        "10.0.0.0/8",
    ]);
    assert_eq!((set["rate_per_minute"].as_i64(), set["burst"].as_i64()), (Some(120), Some(5)));
    assert_eq!((set["cooldown_seconds"].as_i64(), set["strict_window_hours"].as_i64()), (Some(1800), Some(24)));
    assert_eq!(set["ip_allowlist"], "10.0.0.0/8");
    let cleared = cli.ok(&["pbx", "set", "--integration", &pbx, "--no-strict-window", "--no-ip-allowlist"]);
    assert_eq!((cleared["strict_window_hours"].clone(), cleared["ip_allowlist"].clone()), (Value::Null, Value::Null));
    let (ok, err) = cli.run(&["pbx", "set", "--integration", &pbx, "--ip-allowlist", "not-an-address"]);
    assert!(!ok && err["error"].as_str().unwrap().contains("not an IP address"));
    let rotated = cli.ok(&["pbx", "rotate-secret", "--integration", &pbx]);
    assert_ne!(rotated["webhook_secret"].as_str().unwrap(), secret);
    assert!(rotated.get("hmac_secret").is_none());
    assert_eq!(cli.ok(&["pbx", "show", &pbx])["hmac"], true, "rotating the webhook secret keeps signing on");
    let removed = cli.ok(&["pbx", "template", "remove", "--integration", &pbx, "--event", "missed_call"]);
    assert_eq!(removed["removed"], true);
    assert_eq!(cli.ok(&["pbx", "events", "--integration", &pbx])["events"], serde_json::json!([]));
    let (ok, _) = cli.run(&["pbx", "create", "--customer", id, "--instance", "no-such-instance"]);
    assert!(!ok);
}

#[test]
fn webhook_commands_set_show_rotate_attempts_and_refuse_bad_input() {
    let cli = Cli::new();
    let customer = cli.ok(&["customer", "create", "--name", "Shop", "--plan", "starter"]);
    let id = customer["id"].as_str().unwrap();
    let instance = cli.ok(&["instance", "create", "--customer", id, "--name", "main", "--connected"]);
    let instance = instance["id"].as_str().unwrap();
    // http to loopback needs the development flag.
    let set =
        ["webhook", "set", "--instance", instance, "--url", "http://127.0.0.1:9/hook", "--events", "message.sent"];
    let (ok, err) = cli.run(&set);
    assert!(!ok && err["error"].as_str().unwrap().contains("refused"), "{err}");
    let created = cli.ok_with_env(&set, &[("GATEWAY_ALLOW_LOOPBACK_TARGETS", "1")]);
    let secret = created["secret"].as_str().unwrap().to_string();
    assert!(secret.starts_with("whsec_"));
    assert_eq!((created["signed"].as_bool(), created["enabled"].as_bool()), (Some(true), Some(true)));
    let shown = cli.ok(&["webhook", "show", "--instance", instance]);
    assert_eq!(shown["events"], serde_json::json!(["message.sent"]));
    assert!(!shown.to_string().contains(&secret), "never shown twice");
    // Setting again keeps the secret (and does not print it).
    let again = cli.ok_with_env(
        &["webhook", "set", "--instance", instance, "--url", "http://127.0.0.1:9/other", "--events", "all"],
        &[("GATEWAY_ALLOW_LOOPBACK_TARGETS", "1")],
    );
    assert!(again.get("secret").is_none());
    assert_eq!(again["events"].as_array().unwrap().len(), 16);
    let rotated = cli.ok(&["webhook", "rotate-secret", "--instance", instance]);
    assert_ne!(rotated["secret"].as_str().unwrap(), secret);
    assert!(rotated["previous_secret_signs_until"].is_string());
    let (ok, err) = cli.run_with_env(
        &["webhook", "set", "--instance", instance, "--url", "http://127.0.0.1:9/", "--events", "message.sent,nope"],
        &[("GATEWAY_ALLOW_LOOPBACK_TARGETS", "1")],
    );
    assert!(!ok && err["error"].as_str().unwrap().contains("not an event"));
    let (ok, _) = cli.run(&["webhook", "set", "--instance", instance, "--url", "https://10.0.0.1/", "--events", "all"]);
    assert!(!ok, "a private address is refused");
    assert_eq!(cli.ok(&["webhook", "attempts", "--instance", instance])["attempts"], serde_json::json!([]));
    assert_eq!(
        cli.ok(&["webhook", "recover", "--instance", instance, "--since", "2026-01-01T00:00:00Z"])["recovered"],
        0
    );
    assert_eq!(cli.ok(&["webhook", "enable", "--instance", instance])["enabled"], true);
}

/// Runs the gateway with `args`; (exit code, stdout, stderr).
fn raw(args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_gateway"))
        .args(args)
        .env_remove("GATEWAY_DATABASE_URL")
        .env("GATEWAY_POLICIES__CACHE_DIR", std::env::temp_dir().join("gateway-test-wasm-cache"))
        .envs(env.iter().copied())
        .output()
        .expect("gateway runs");
    let text = |b: Vec<u8>| String::from_utf8(b).unwrap();
    (out.status.code().unwrap_or(-1), text(out.stdout), text(out.stderr))
}

#[test]
fn policy_build_check_eval_and_test_work_without_a_database() {
    use gateway_sdk_tests::wasm::{Behaviour, sdk_core_module};
    let dir = tempfile::tempdir().unwrap();
    let path = |f: &str| dir.path().join(f).display().to_string();
    let deny = Behaviour::Deny { code: "no_promo", reason: "promotional wording", risk: 80 };
    std::fs::write(path("core.wasm"), sdk_core_module("no-promo", "2.3.0", "content", &deny)).unwrap();
    let fixtures = r#"[{"name": "denies", "context": {"text": "50% off"}, "expect": {"decision": "deny", "code": "no_promo"}},
                       {"name": "risky", "expect": {"decision": "deny", "risk_at_least": 70}}]"#;
    std::fs::write(path("fixtures.json"), fixtures).unwrap();
    // build: componentize, embed the fixtures, validate; the SDK's name and version.
    let (code, out, err) =
        raw(&["policy", "build", &path("core.wasm"), "--fixtures", &path("fixtures.json"), "-o", &path("p.wasm")], &[]);
    assert_eq!(code, 0, "{err}");
    let built: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        (built["name"].as_str(), built["version"].as_str(), built["interface"].as_str()),
        (Some("no-promo"), Some("2.3.0"), Some("0.1.0"))
    );
    assert_eq!(built["fixtures"], "2 passed, 0 failed");
    assert_eq!(built["sha256"].as_str().unwrap().len(), 64);
    // check: servable, with its fixtures.
    let (code, out, _) = raw(&["policy", "check", &path("p.wasm")], &[]);
    let checked: Value = serde_json::from_str(&out).unwrap();
    assert_eq!((code, checked["servable"].as_bool(), checked["fixtures"]["passed"].as_u64()), (0, Some(true), Some(2)));
    assert!(checked["fixtures"]["max_fuel"].as_u64().unwrap() > 0);
    // eval: one context.
    std::fs::write(path("ctx.json"), r#"{"stage": "content", "purpose": "support", "text": "hi"}"#).unwrap();
    let (code, out, _) = raw(&["policy", "eval", &path("p.wasm"), &path("ctx.json")], &[]);
    let decided: Value = serde_json::from_str(&out).unwrap();
    assert_eq!((code, decided["decision"].as_str(), decided["code"].as_str()), (0, Some("deny"), Some("no_promo")));
    assert_eq!(decided["module"], "no-promo@2.3.0");
    assert!(decided["fuel"].as_u64().unwrap() > 0);
    // test: a line a fixture and the summary; a failing file exits 1.
    let (code, out, _) = raw(&["policy", "test", &path("p.wasm"), &path("fixtures.json")], &[]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("ok    denies (") && out.trim_end().ends_with("2 passed, 0 failed"), "{out}");
    std::fs::write(path("wrong.json"), r#"[{"name": "expects allow", "expect": {"decision": "allow"}}]"#).unwrap();
    let (code, out, _) = raw(&["policy", "test", &path("p.wasm"), &path("wrong.json")], &[]);
    assert_eq!(code, 1);
    assert!(
        out.contains("FAIL  expects allow: expected decision allow, got deny no_promo")
            && out.trim_end().ends_with("0 passed, 1 failed"),
        "{out}"
    );
    // The core module itself can be tried before building.
    let (code, out, _) = raw(&["policy", "test", &path("core.wasm"), &path("fixtures.json")], &[]);
    assert_eq!(code, 0, "{out}");
    // A fuel budget the module exceeds fails the fixture.
    let (code, out, _) = raw(&["policy", "test", &path("p.wasm"), &path("fixtures.json"), "--max-fuel", "1"], &[]);
    assert_eq!(code, 1);
    assert!(out.contains("more than its max_fuel 1"), "{out}");
    // build refuses a module that fails its fixtures, and says why.
    let (code, _, err) =
        raw(&["policy", "build", &path("core.wasm"), "--fixtures", &path("wrong.json"), "-o", &path("x.wasm")], &[]);
    assert_eq!(code, 1);
    assert!(err.contains("fails its fixtures (0 passed, 1 failed)"), "{err}");
    assert!(!dir.path().join("x.wasm").exists());
}

#[test]
fn sighup_reloads_the_policies_of_a_running_gateway() {
    use gateway_sdk_tests::wasm::{Behaviour, expecting, policy};
    let cli = Cli::new();
    // The database first: `policy list` below must not race the server's migrations.
    cli.ok(&["migrate"]);
    let policies = tempfile::tempdir().unwrap();
    let cache = std::env::temp_dir().join("gateway-test-wasm-cache");
    let mut server = Command::new(env!("CARGO_BIN_EXE_gateway"))
        .args(["--database-url", &cli.url, "serve", "--listen", "127.0.0.1:0"])
        .env_remove("GATEWAY_DATABASE_URL")
        .env("GATEWAY_POLICIES_DIR", policies.path())
        .env("GATEWAY_POLICIES__DEBOUNCE_MS", "600000")
        .env("GATEWAY_POLICIES__CACHE_DIR", &cache)
        .env("GATEWAY_LOG_FILE", cli._dir.path().join("serve.log"))
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("gateway serve starts");
    let list = wait_for_content(&cli, &mut server, "1.0.0");
    assert_eq!(list["gateways"][0]["pid"], server.id());
    let deny = Behaviour::Deny { code: "held", reason: "held", risk: 90 };
    std::fs::write(
        policies.path().join("content.wasm"),
        policy("content", "7.0.0", "content", &deny, &expecting("deny")),
    )
    .unwrap();
    // The watcher waits 10 minutes for the directory to settle; SIGHUP does not.
    let status = Command::new("kill").args(["-HUP", &server.id().to_string()]).status().unwrap();
    assert!(status.success());
    wait_for_content(&cli, &mut server, "7.0.0");
    Command::new("kill").args(["-TERM", &server.id().to_string()]).status().unwrap();
    assert!(server.wait().unwrap().success(), "a clean shutdown");
    // A clean stop writes every line it logged.
    let log = std::fs::read_to_string(cli._dir.path().join("serve.log")).unwrap();
    assert!(log.contains("SIGHUP: policies reloaded"), "{log}");
    assert!(log.contains("gateway stopped"), "{log}");
}

/// Polls `policy list` until the running gateway's `content` module is `version`.
fn wait_for_content(cli: &Cli, server: &mut std::process::Child, version: &str) -> Value {
    // Generous: a debug build compiling the bundled modules on a busy machine is slow.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    loop {
        let (ok, list) = cli.run(&["policy", "list"]);
        let live = list["gateways"].get(0).and_then(|g| g["modules"].as_array().cloned()).and_then(|modules| {
            modules.iter().find(|m| m["name"] == "content").map(|m| m["version"].as_str().unwrap().to_string())
        });
        if ok && live.as_deref() == Some(version) {
            return list;
        }
        if let Ok(Some(status)) = server.try_wait() {
            let mut err = String::new();
            std::io::Read::read_to_string(server.stderr.as_mut().unwrap(), &mut err).unwrap();
            panic!("gateway serve exited ({status}): {err}");
        }
        if std::time::Instant::now() >= deadline {
            let log = std::fs::read_to_string(cli._dir.path().join("serve.log")).unwrap_or_default();
            panic!("content {version} never live: {list}\nserve log:\n{log}");
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

#[test]
fn user_and_operator_commands_print_a_one_time_sign_in_link() {
    let cli = Cli::new();
    let customer = cli.ok(&["customer", "create", "--name", "Acme", "--plan", "starter"]);
    let id = customer["id"].as_str().unwrap();
    let env = [("GATEWAY_PUBLIC_URL", "https://gw.example.com")];
    let user = cli
        .ok_with_env(&["user", "create", "--customer", id, "--email", "Owner@Acme.example", "--role", "owner"], &env);
    assert_eq!(user["user"]["email"], "owner@acme.example");
    assert_eq!(user["user"]["role"], "owner");
    assert_eq!(
        (user["user"]["password_set"].as_bool(), user["user"]["mfa_enrolled"].as_bool()),
        (Some(false), Some(false))
    );
    let link = user["sign_in_link"].as_str().unwrap();
    let code =
        link.strip_prefix("https://gw.example.com/invite#").expect("a link to the invitation page, code after #");
    assert!(code.len() >= 43, "256 bits: {code}");
    let operator = cli.ok(&["operator", "create", "--email", "ops@gateway.example"]);
    assert_eq!((operator["user"]["role"].as_str(), operator["user"]["customer_id"].as_str()), (Some("operator"), None));
    assert!(operator["sign_in_link"].as_str().unwrap().starts_with("http://127.0.0.1:8080/invite#"));
    // A new link replaces the old one.
    let again = cli.ok(&["user", "link", "--email", "owner@acme.example", "--reset-mfa"]);
    assert_ne!(again["sign_in_link"], user["sign_in_link"]);
    // Refusals: taken email, unknown customer, bad email (clap refuses other roles).
    assert!(!cli.run(&["user", "create", "--customer", id, "--email", "owner@acme.example", "--role", "viewer"]).0);
    assert!(!cli.run(&["user", "create", "--customer", "cus_nope", "--email", "x@acme.example", "--role", "viewer"]).0);
    assert!(!cli.run(&["operator", "create", "--email", "not-an-email"]).0);
}

/// Every number has a range, and a value outside it is refused with the range named,
/// never accepted to wrap later (the cooldown of 153722867280912930 minutes used to
/// wrap to a negative time and turn the cooldown off).
#[test]
fn numbers_outside_their_range_are_refused_by_the_cli_and_the_configuration() {
    let cli = Cli::new();
    let demo = cli.ok(&["demo"]);
    let (customer, instance) = (demo["customer_id"].as_str().unwrap(), demo["instance_id"].as_str().unwrap());
    cli.ok(&["customer", "modules", "--customer", customer, "--pbx", "on"]);
    let pbx = cli.ok(&["pbx", "create", "--customer", customer, "--instance", instance]);
    let pbx = pbx["integration_id"].to_string();
    let refused = |args: &[&str], says: &str| {
        let (ok, err) = cli.run(args);
        assert!(!ok, "{args:?} was accepted");
        let message = err["error"].as_str().unwrap();
        assert!(message.contains(says), "{args:?}: {message}");
    };
    let set = |flag: &str, value: &str| ["pbx", "set", "--integration", &pbx, &format!("{flag}={value}")].join("\u{1}");
    for (args, says) in [
        (set("--cooldown-minutes", "153722867280912930"), "between 0 and 10080"),
        (set("--cooldown-minutes", "-1"), "between 0 and 10080"),
        (set("--rate-per-minute", "60001"), "between 1 and 60000"),
        (set("--burst", "0"), "between 1 and 1000000000"),
        (set("--strict-window-hours", "100000"), "between 1 and 720"),
    ] {
        let args: Vec<&str> = args.split('\u{1}').collect();
        refused(&args, says);
    }
    assert_eq!(
        cli.ok(&["pbx", "set", "--integration", &pbx, "--cooldown-minutes", "10080"])["cooldown_seconds"],
        604_800
    );
    refused(&["customer", "limits", "--customer", customer, "--daily", "0"], "between 1 and 1000000000");
    refused(&["customer", "limits", "--customer", customer, "--monthly", "999999999999"], "between 1 and 1000000000");
    refused(&["instance", "age", instance, "--days", "106751991167301"], "between 0 and 36500");
    refused(&["review", "list", "--limit", "5000"], "between 1 and 1000");
    refused(&["webhook", "recover", "--instance", instance, "--since", "9223372036854775807"], "is not a time");
    refused(&["policy", "reload", "--wait", "18446744073709551615"], "between 0 and 3600");
    // The configuration: the key and its range, before anything starts.
    let (ok, err) = cli.run_with_env(&["migrate"], &[("GATEWAY_PBX__COOLDOWN_MINUTES", "153722867280912930")]);
    assert!(!ok);
    assert!(err["error"].as_str().unwrap().contains("pbx.cooldown_minutes must be between 0 and 10080"), "{err}");
    let (ok, err) = cli.run_with_env(&["migrate"], &[("GATEWAY_WEBHOOKS__JITTER", "nan")]);
    assert!(!ok && err["error"].as_str().unwrap().contains("webhooks.jitter"), "{err}");
}

#[test]
fn retention_run_and_privacy_erase_say_what_they_touched() {
    let cli = Cli::new();
    let demo = cli.ok(&["demo"]);
    let customer = demo["customer_id"].as_str().unwrap();
    let run = cli.ok(&["retention", "run"]);
    for table in ["message_log", "inbound_messages", "provider_events", "contacts", "dashboard_login_throttle"] {
        assert_eq!(run["pruned"][table], 0, "{run}");
    }
    assert_eq!(run["retention"]["message_log_days"], 90);
    let (ok, _) = cli.run_with_env(&["retention", "run"], &[("GATEWAY_RETENTION__MESSAGE_LOG_DAYS", "0")]);
    assert!(!ok, "a retention of 0 days is refused");
    cli.ok(&["suppression", "add", "--customer", customer, "--phone", "+14155550123", "--reason", "asked"]);
    let erased = cli.ok(&["privacy", "erase", "--customer", customer, "--phone", "+1 (415) 555-0123"]);
    assert_eq!(erased["phone"], "+14155550123", "the number as the API normalises it");
    let touched = erased["touched"].as_array().unwrap();
    assert!(
        touched.iter().any(|t| t["table"] == "suppressed_recipients" && t["action"] == "kept" && t["rows"] == 1),
        "{erased}"
    );
    let (ok, err) = cli.run(&["privacy", "erase", "--customer", customer, "--phone", "not a phone"]);
    assert!(!ok && err["error"].as_str().unwrap().contains("not a valid number"), "{err}");
}

//! The policy host's proofs: hostile modules are refused or contained and the host
//! keeps evaluating; modules are checked before they go live; the live set swaps
//! atomically (evaluations in flight finish on the old module), keeps the old module
//! when a new one fails its fixtures, and rolls back.
//!
//! Hostile modules are WebAssembly text made components in the test
//! (`gateway_sdk_tests::wasm`), so no wasm toolchain is needed.

use gateway_policy_model::{Context, Stage, Verdict};
use gateway_sdk_tests::wasm::{self, Behaviour, WIT_V0_1_0, drop_in, expecting};
use gateway_server::config::PolicySettings;
use gateway_server::policy::host::PolicyHost;
use gateway_server::policy::module::{LoadError, LoadedModule};
use gateway_server::policy::reload::{self, PolicyControl};
use gateway_server::policy::rollout::Variant;
use gateway_server::policy::sandbox::Fault;
use gateway_server::policy::{Decision, bundled};
use gateway_server::store::{Rollout, RolloutMode};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn settings() -> PolicySettings {
    // Compiled modules are cached across tests (debug builds compile slowly).
    let cache = std::env::temp_dir().join("gateway-test-wasm-cache");
    PolicySettings { cache_dir: cache.display().to_string(), ..PolicySettings::default() }
}

fn host_with(settings: &PolicySettings) -> PolicyHost {
    PolicyHost::new(settings, slog::Logger::root(slog::Discard, slog::o!())).expect("policy host")
}

fn host() -> PolicyHost {
    host_with(&settings())
}

/// Loads without requiring fixtures (a hostile module cannot pass any).
fn load(host: &PolicyHost, bytes: &[u8]) -> LoadedModule {
    host.load(bytes, "test", false).unwrap_or_else(|e| panic!("loads: {e}"))
}

fn content_context() -> Context {
    Context { stage: Stage::Content, text: Some("Your order has shipped".into()), ..Context::default() }
}

fn evaluate(module: &LoadedModule, host: &PolicyHost) -> Result<Verdict, Fault> {
    module.evaluate(&module.convert(&content_context()), host.limits()).outcome
}

fn allow_module(host: &PolicyHost) -> LoadedModule {
    load(host, &wasm::policy("ok", "1.0.0", "content", &Behaviour::Allow, &expecting("allow")))
}

#[test]
fn an_infinite_loop_runs_out_of_fuel_and_the_host_keeps_evaluating() {
    let host = host();
    let looping = load(&host, &wasm::policy("spin", "1.0.0", "content", &Behaviour::Loop, "[]"));
    let good = allow_module(&host);
    for _ in 0..3 {
        let e = looping.evaluate(&looping.convert(&content_context()), host.limits());
        assert_eq!(e.outcome, Err(Fault::OutOfFuel(host.limits().fuel)));
        assert_eq!(e.fuel, host.limits().fuel, "it used the whole budget");
        // A fresh instance each time: the trap poisoned nothing.
        assert_eq!(evaluate(&good, &host), Ok(Verdict::Allow));
    }
    // From now on the host runs it where it can hold up no request.
    assert!(looping.is_slow() && !good.is_slow());
}

#[test]
fn a_memory_bomb_is_stopped_at_the_memory_cap() {
    let host = host();
    let bomb = load(&host, &wasm::policy("bomb", "1.0.0", "content", &Behaviour::MemoryBomb, "[]"));
    assert_eq!(evaluate(&bomb, &host), Err(Fault::OutOfMemory(16 << 20)));
    assert_eq!(evaluate(&allow_module(&host), &host), Ok(Verdict::Allow));
}

#[test]
fn a_panicking_module_is_a_contained_trap() {
    let host = host();
    let panics = load(&host, &wasm::policy("panics", "1.0.0", "content", &Behaviour::Trap, "[]"));
    match evaluate(&panics, &host) {
        Err(Fault::Trap(what)) => assert!(what.contains("unreachable"), "{what}"),
        other => panic!("expected a trap, got {other:?}"),
    }
    assert_eq!(evaluate(&allow_module(&host), &host), Ok(Verdict::Allow));
}

#[test]
fn a_module_importing_wasi_is_refused_at_load() {
    let wasi = "package wasi:cli@0.2.0; interface environment { get-arguments: func() -> list<string>; }";
    let wit = WIT_V0_1_0.replace("world policy {", "world policy {\n    import wasi:cli/environment@0.2.0;");
    let core = wasm::core_wat(
        &Behaviour::Allow,
        "0.1.0",
        r#"(import "wasi:cli/environment@0.2.0" "get-arguments" (func (param i32)))"#,
    );
    let bytes = wasm::with_fixtures(&wasm::component(&core, &wit, &[wasi]), "wasi", "1.0.0", "content", "0.1.0", "[]");
    match host().load(&bytes, "test", false) {
        Err(e @ LoadError::Imports(_)) => {
            assert!(e.to_string().contains("wasi:cli/environment@0.2.0"), "{e}");
        }
        other => panic!("expected the import to be refused, got {other:?}"),
    }
}

#[test]
fn a_module_of_another_interface_version_is_refused_before_it_compiles() {
    let wit = WIT_V0_1_0.replace("@0.1.0", "@0.2.0");
    let component = wasm::component(&wasm::core_wat(&Behaviour::Allow, "0.2.0", ""), &wit, &[]);
    let declared = wasm::with_fixtures(&component, "future", "1.0.0", "content", "0.2.0", "[]");
    let e = host().load(&declared, "test", false).unwrap_err();
    assert!(matches!(e, LoadError::UnsupportedInterface { .. }), "{e:?}");
    assert_eq!(e.to_string(), "interface version 0.2.0 is not supported by this gateway (supported: 0.1.0)");
    // Claiming a supported version does not help: the export must be that version's.
    let lying = wasm::with_fixtures(&component, "future", "1.0.0", "content", "0.1.0", "[]");
    let e = host().load(&lying, "test", false).unwrap_err();
    assert!(matches!(e, LoadError::NoEvaluator { .. }), "{e:?}");
    assert!(e.to_string().contains("gateway:policy/evaluator@0.2.0"), "{e}");
}

#[test]
fn a_changed_record_is_refused_at_load_not_at_evaluation() {
    let wit = WIT_V0_1_0.replace("        sent-today: u32,\n", "");
    assert_ne!(wit, WIT_V0_1_0, "the test removes a counter");
    let component = wasm::component(&wasm::core_wat(&Behaviour::Allow, "0.1.0", ""), &wit, &[]);
    let bytes = wasm::with_fixtures(&component, "drift", "1.0.0", "content", "0.1.0", "[]");
    let e = host().load(&bytes, "test", false).unwrap_err();
    assert!(matches!(e, LoadError::TypeCheck { .. }), "{e:?}");
}

#[test]
fn a_module_declaring_more_memory_than_a_slot_is_refused_at_load() {
    let core = wasm::core_wat(&Behaviour::Allow, "0.1.0", "")
        .replace(r#"(memory (export "memory") 1)"#, r#"(memory (export "memory") 2000)"#);
    let bytes = wasm::with_fixtures(&wasm::component(&core, WIT_V0_1_0, &[]), "big", "1.0.0", "content", "0.1.0", "[]");
    let e = host().load(&bytes, "test", false).unwrap_err();
    assert!(matches!(e, LoadError::Compile(_)), "{e:?}");
    assert!(e.to_string().contains("exceeds the limit"), "{e}");
}

#[test]
fn a_module_failing_its_fixtures_is_refused_with_the_failure() {
    let bytes = wasm::policy(
        "strict",
        "1.0.0",
        "content",
        &Behaviour::Deny { code: "no_orders", reason: "orders refused", risk: 80 },
        &expecting("allow"),
    );
    let e = host().load(&bytes, "test", true).unwrap_err();
    assert!(matches!(e, LoadError::Fixtures { .. }), "{e:?}");
    let text = e.to_string();
    assert!(text.contains("0 passed, 1 failed") && text.contains("default context"), "{text}");
    // Its fixtures pass only with the decision it makes.
    let fine = wasm::policy(
        "strict",
        "1.0.0",
        "content",
        &Behaviour::Deny { code: "no_orders", reason: "orders refused", risk: 80 },
        &expecting("deny"),
    );
    host().load(&fine, "test", true).expect("passes its fixtures");
}

#[test]
fn a_module_without_fixtures_is_not_served_and_hostile_ones_cannot_pass_any() {
    let host = host();
    let bare = wasm::policy("bare", "1.0.0", "content", &Behaviour::Allow, "[]");
    assert!(matches!(host.load(&bare, "test", true), Err(LoadError::NoFixtures)));
    let looping = wasm::policy("spin", "1.0.0", "content", &Behaviour::Loop, &expecting("allow"));
    let e = host.load(&looping, "test", true).unwrap_err();
    assert!(e.to_string().contains("ran out of fuel"), "{e}");
}

#[test]
fn core_modules_text_and_oversized_modules_are_refused_with_a_hint() {
    let host = host();
    let core = wat::parse_str(wasm::core_wat(&Behaviour::Allow, "0.1.0", "")).unwrap();
    assert!(matches!(host.load(&core, "test", false), Err(LoadError::CoreModule)));
    assert!(LoadError::CoreModule.to_string().contains("gateway policy build"));
    assert!(matches!(host.load(b"(component)", "test", false), Err(LoadError::NotWasm)));
    let component = wasm::component(&wasm::core_wat(&Behaviour::Allow, "0.1.0", ""), WIT_V0_1_0, &[]);
    assert!(matches!(host.load(&component, "test", false), Err(LoadError::NoMetadata)));
    let small = host_with(&PolicySettings { max_module_bytes: 1000, ..settings() });
    let bytes = wasm::policy("ok", "1.0.0", "content", &Behaviour::Allow, "[]");
    assert!(matches!(small.load(&bytes, "test", false), Err(LoadError::TooLarge { .. })));
    let bad_name = wasm::policy("Bad Name", "1.0.0", "content", &Behaviour::Allow, "[]");
    assert!(matches!(host.load(&bad_name, "test", false), Err(LoadError::Metadata(_))));
}

#[test]
fn invalid_answers_are_faults() {
    let host = host();
    let risky =
        load(&host, &wasm::policy("r", "1.0.0", "content", &Behaviour::Review { reason: "x", risk: 250 }, "[]"));
    assert!(matches!(evaluate(&risky, &host), Err(Fault::BadAnswer(_))));
    let code = Behaviour::Deny { code: "Not A Code", reason: "x", risk: 10 };
    let coded = load(&host, &wasm::policy("c", "1.0.0", "content", &code, "[]"));
    assert!(matches!(evaluate(&coded, &host), Err(Fault::BadAnswer(_))));
    let empty = load(&host, &wasm::policy("e", "1.0.0", "content", &Behaviour::Review { reason: "", risk: 10 }, "[]"));
    assert!(matches!(evaluate(&empty, &host), Err(Fault::BadAnswer(_))));
}

#[test]
fn the_bundled_modules_import_only_types_and_pass_their_fixtures() {
    let host = host();
    let mut names = Vec::new();
    for (name, bytes) in bundled::MODULES {
        let module = host.load(bytes, "bundled", true).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(module.metadata.fixtures.len() >= 30, "{name} has {} fixtures", module.metadata.fixtures.len());
        assert_eq!(module.interface(), "0.1.0");
        names.push(module.metadata.name.clone());
    }
    assert_eq!(names, ["purpose", "content", "pacing"]);
}

fn set(host: &PolicyHost, modules: Vec<LoadedModule>) -> Arc<gateway_server::policy::host::PolicySet> {
    host.install(modules.into_iter().map(Arc::new).collect());
    host.current()
}

#[test]
fn the_first_deny_decides_then_the_first_review_and_every_verdict_is_traced() {
    let host = host();
    let review = load(
        &host,
        &wasm::policy("a-review", "1.0.0", "content", &Behaviour::Review { reason: "unsure", risk: 50 }, "[]"),
    );
    let deny = Behaviour::Deny { code: "no_sales", reason: "sales wording", risk: 90 };
    let denying = load(&host, &wasm::policy("b-deny", "2.1.0", "content", &deny, "[]"));
    let purpose_only = load(&host, &wasm::policy("c-purpose", "1.0.0", "purpose", &Behaviour::Trap, "[]"));
    let set = set(&host, vec![review, denying, purpose_only, allow_module(&host)]);
    let outcome = host.evaluate_blocking(&content_context(), &set);
    assert_eq!(
        outcome.decision,
        Decision::Deny {
            policy: "b-deny@2.1.0".into(),
            code: "no_sales".into(),
            reason: "sales wording".into(),
            risk_score: 90,
            fault: false
        }
    );
    let seen: Vec<(&str, &str, &str)> =
        outcome.trace.iter().map(|t| (t.module.as_str(), t.version.as_str(), t.decision)).collect();
    assert_eq!(seen, [("a-review", "1.0.0", "review"), ("b-deny", "2.1.0", "deny"), ("ok", "1.0.0", "allow")]);
    assert!(outcome.trace.iter().all(|t| t.fuel > 0 && t.sha256.len() == 12));
    let set = set_without(&host, &set, "b-deny");
    assert!(matches!(host.evaluate_blocking(&content_context(), &set).decision, Decision::Review { .. }));
}

fn set_without(
    host: &PolicyHost,
    set: &gateway_server::policy::host::PolicySet,
    name: &str,
) -> Arc<gateway_server::policy::host::PolicySet> {
    host.install(set.modules.iter().filter(|m| m.metadata.name != name).cloned().collect());
    host.current()
}

#[test]
fn a_fault_applies_the_fail_mode() {
    for (mode, expect) in [("deny", "deny"), ("review", "review"), ("allow", "allow")] {
        let host = host_with(&PolicySettings { fail_mode: mode.into(), ..settings() });
        let looping = load(&host, &wasm::policy("spin", "1.0.0", "content", &Behaviour::Loop, "[]"));
        let set = set(&host, vec![looping, allow_module(&host)]);
        let outcome = host.evaluate_blocking(&content_context(), &set);
        let got = match &outcome.decision {
            Decision::Deny { code, fault, .. } => {
                assert_eq!((code.as_str(), *fault), ("policy_error", true));
                "deny"
            }
            Decision::Review { .. } => "review",
            Decision::Allow => "allow",
        };
        assert_eq!(got, expect, "fail mode {mode}");
        assert_eq!(outcome.trace[0].decision, "fault");
        assert_eq!(outcome.trace[0].fault, Some("out_of_fuel"));
    }
}

fn variant(module: LoadedModule, rollout: Rollout) -> Variant {
    Variant { module: Arc::new(module), rollout }
}

/// A shadow that traps, runs out of fuel or answers nonsense changes nothing: the
/// decision and the deciding modules' trace are as without it; the shadow is traced
/// as a fault and counted as an error. One that disagrees is counted by its change.
#[test]
fn a_shadow_never_changes_a_decision_even_when_it_fails() {
    let host = host();
    let shadow = Rollout { mode: RolloutMode::Shadow, ..Rollout::default() };
    let bad_code = Behaviour::Deny { code: "NOT A CODE", reason: "x", risk: 10 };
    let deny = Behaviour::Deny { code: "held", reason: "held", risk: 90 };
    for (name, behaviour, change) in [
        ("trap", Behaviour::Trap, "error"),
        ("loop", Behaviour::Loop, "error"),
        ("nonsense", bad_code, "error"),
        ("ok", deny, "allow->deny"),
    ] {
        let module = load(&host, &wasm::policy(name, "9.0.0", "content", &behaviour, "[]"));
        let before = gateway_server::metrics::get().policy_shadow_changes.with_label_values(&[name, change]).get();
        host.install_with(vec![Arc::new(allow_module(&host))], vec![variant(module, shadow.clone())]);
        let outcome = host.evaluate_blocking(&content_context(), &host.current());
        assert_eq!(outcome.decision, Decision::Allow, "{name}");
        let seen: Vec<(&str, &str, Option<&str>)> =
            outcome.trace.iter().map(|t| (t.module.as_str(), t.decision, t.mode)).collect();
        let shadow_decision = if change == "error" { "fault" } else { "deny" };
        assert_eq!(seen, [("ok", "allow", None), (name, shadow_decision, Some("shadow"))], "{name}");
        let after = gateway_server::metrics::get().policy_shadow_changes.with_label_values(&[name, change]).get();
        assert_eq!(after, before + 1, "{name}: {change} counted");
    }
    // Under a new name a shadow would decide in addition: allowing what another module
    // denied changes nothing (as `policy shadow` counts it).
    let held = Behaviour::Deny { code: "held", reason: "held", risk: 90 };
    let strict = load(&host, &wasm::policy("strict", "1.0.0", "content", &held, "[]"));
    let newcomer = load(&host, &wasm::policy("newcomer", "1.0.0", "content", &Behaviour::Allow, "[]"));
    let count = |change: &str| {
        gateway_server::metrics::get().policy_shadow_changes.with_label_values(&["newcomer", change]).get()
    };
    let (same, opened) = (count("same"), count("deny->allow"));
    host.install_with(vec![Arc::new(strict)], vec![variant(newcomer, shadow)]);
    let outcome = host.evaluate_blocking(&content_context(), &host.current());
    assert!(matches!(outcome.decision, Decision::Deny { .. }));
    assert_eq!((count("same"), count("deny->allow")), (same + 1, opened));
}

/// Scope: a customer's own install before a plan's, and either instead of the live
/// module of its name; under a new name, in addition. Canary: a stable share by a hash
/// of the send, the live module for the rest.
#[test]
fn the_rollout_plan_picks_who_decides_each_send() {
    use gateway_server::policy::rollout::{Role, bucket, plan};
    let host = host();
    let review = |name: &str, reason: &'static str| {
        load(&host, &wasm::policy(name, "1.0.0", "content", &Behaviour::Review { reason, risk: 10 }, "[]"))
    };
    let for_plan = Rollout { plans: vec!["starter".into()], ..Rollout::default() };
    let for_customer = Rollout { customers: vec!["cus_a".into()], ..Rollout::default() };
    host.install_with(
        vec![Arc::new(review("content", "live"))],
        vec![
            variant(review("content", "by customer"), for_customer.clone()),
            variant(review("content", "by plan"), for_plan.clone()),
            variant(review("extra", "extra"), for_plan),
        ],
    );
    let set = host.current();
    let ctx = |customer: &str, plan: &str| {
        let mut ctx = content_context();
        ctx.customer.id = customer.into();
        ctx.customer.plan = plan.into();
        ctx
    };
    let decided = |ctx: &Context| match host.evaluate_blocking(ctx, &set).decision {
        Decision::Review { reason, .. } => reason,
        other => panic!("{other:?}"),
    };
    assert_eq!(decided(&ctx("cus_a", "starter")), "by customer");
    assert_eq!(decided(&ctx("cus_b", "starter")), "by plan");
    assert_eq!(decided(&ctx("cus_c", "scale")), "live");
    let roles = |ctx: &Context| -> Vec<(String, Role)> {
        plan(&set, ctx, false).deciders.iter().map(|(m, r)| (m.metadata.name.clone(), *r)).collect()
    };
    assert_eq!(roles(&ctx("cus_b", "starter")), [("content".into(), Role::Scoped), ("extra".into(), Role::Scoped)]);
    assert_eq!(roles(&ctx("cus_c", "scale")), [("content".to_string(), Role::Live)]);

    let canary = Rollout { mode: RolloutMode::Canary(25), ..Rollout::default() };
    host.install_with(vec![Arc::new(review("content", "live"))], vec![variant(review("content", "canary"), canary)]);
    let set = host.current();
    let mut by_canary = 0;
    for i in 0..400 {
        let mut ctx = content_context();
        ctx.text = Some(format!("Your order {i} has shipped"));
        let reason = match host.evaluate_blocking(&ctx, &set).decision {
            Decision::Review { reason, .. } => reason,
            other => panic!("{other:?}"),
        };
        assert_eq!(reason == "canary", bucket(&ctx) < 25, "the bucket decides");
        ctx.stage = Stage::Purpose;
        assert_eq!(
            bucket(&ctx),
            bucket(&{
                ctx.stage = Stage::Content;
                ctx.clone()
            }),
            "the same at every stage"
        );
        by_canary += usize::from(reason == "canary");
    }
    assert!((70..=130).contains(&by_canary), "about 25 % of 400: {by_canary}");
}

#[test]
fn an_evaluation_in_flight_finishes_on_the_module_it_started_with() {
    let host = Arc::new(host_with(&PolicySettings { fuel: u64::MAX / 2, ..settings() }));
    let slow = Behaviour::Spin { iterations: 400_000_000, reason: "v1" };
    let v1 = load(&host, &wasm::policy("content", "1.0.0", "content", &slow, "[]"));
    let v2 =
        load(&host, &wasm::policy("content", "2.0.0", "content", &Behaviour::Review { reason: "v2", risk: 10 }, "[]"));
    host.install(vec![Arc::new(v1)]);
    // The evaluation takes its module set before the swap: the thread says when it has.
    let (took, taken) = std::sync::mpsc::channel();
    let in_flight = {
        let host = host.clone();
        std::thread::spawn(move || {
            let set = host.current();
            took.send(()).unwrap();
            let started = Instant::now();
            (host.evaluate_blocking(&content_context(), &set), started.elapsed())
        })
    };
    taken.recv().unwrap();
    let swapped_at = Instant::now();
    host.install(vec![Arc::new(v2)]);
    let after = host.evaluate_blocking(&content_context(), &host.current());
    assert!(matches!(&after.decision, Decision::Review { reason, .. } if reason == "v2"), "{after:?}");
    let new_done = swapped_at.elapsed();
    let (old, old_took) = in_flight.join().unwrap();
    assert!(matches!(&old.decision, Decision::Review { reason, .. } if reason == "v1"), "{old:?}");
    assert!(new_done < old_took, "the new module answered while the old one was still running");
}

async fn start(settings: &PolicySettings, dir: &std::path::Path) -> (PolicyControl, Arc<PolicyHost>) {
    let host = Arc::new(host_with(settings));
    let log = slog::Logger::root(slog::Discard, slog::o!());
    // Dropped without a close: the reload job runs on until the test ends.
    let mut tasks = gateway_server::tasks::Tasks::new(log.clone());
    let control = reload::start(host.clone(), settings, Some(dir.to_path_buf()), None, &mut tasks, log)
        .await
        .expect("policy host starts");
    (control, host)
}

fn live(host: &PolicyHost, name: &str) -> Option<String> {
    host.current().modules.iter().find(|m| m.metadata.name == name).map(|m| m.metadata.version.clone())
}

fn deny_content(version: &str) -> Vec<u8> {
    let deny = Behaviour::Deny { code: "blocked", reason: "test module", risk: 90 };
    wasm::policy("content", version, "content", &deny, &expecting("deny"))
}

async fn wait_for(host: &PolicyHost, name: &str, version: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while live(host, name).as_deref() != Some(version) {
        assert!(Instant::now() < deadline, "{name} {version} never went live (live: {:?})", live(host, name));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn the_directory_is_watched_and_a_module_failing_its_fixtures_leaves_the_old_one_live() {
    let dir = tempfile::tempdir().unwrap();
    let settings = PolicySettings { poll_interval_ms: 20, debounce_ms: 100, ..settings() };
    let (control, host) = start(&settings, dir.path()).await;
    assert_eq!(live(&host, "content").as_deref(), Some("1.0.0"), "the bundled content module");
    drop_in(dir.path(), "content.wasm", &deny_content("9.0.0"));
    wait_for(&host, "content", "9.0.0").await;
    assert_eq!(live(&host, "purpose").as_deref(), Some("1.0.0"), "the others stay");
    // A newer version whose fixtures fail: refused, 9.0.0 stays, and the status says why.
    let broken = Behaviour::Deny { code: "blocked", reason: "test module", risk: 90 };
    drop_in(dir.path(), "content.wasm", &wasm::policy("content", "9.1.0", "content", &broken, &expecting("allow")));
    let summary = control.reload().await.unwrap_err();
    assert!(summary.contains("refused") && summary.contains("fails its fixtures"), "{summary}");
    assert_eq!(live(&host, "content").as_deref(), Some("9.0.0"));
    let status = control.status();
    assert_eq!(status.refused.len(), 1);
    assert!(status.refused[0].error.contains("0 passed, 1 failed"), "{:?}", status.refused);
    // Removing the file brings the bundled module back.
    std::fs::remove_file(dir.path().join("content.wasm")).unwrap();
    wait_for(&host, "content", "1.0.0").await;
    assert!(control.status().refused.is_empty());
}

#[tokio::test]
async fn rollback_brings_the_previous_version_back_until_the_file_changes() {
    let dir = tempfile::tempdir().unwrap();
    let settings = PolicySettings { poll_interval_ms: 20, debounce_ms: 50, ..settings() };
    let (control, host) = start(&settings, dir.path()).await;
    assert!(control.rollback("content").await.unwrap_err().contains("no previous version"));
    assert!(control.rollback("nothing").await.unwrap_err().contains("no live module"));
    drop_in(dir.path(), "content.wasm", &deny_content("2.0.0"));
    control.reload().await.unwrap();
    assert_eq!(live(&host, "content").as_deref(), Some("2.0.0"));
    let message = control.rollback("content").await.unwrap();
    assert!(message.contains("1.0.0") && message.contains("2.0.0"), "{message}");
    assert_eq!(live(&host, "content").as_deref(), Some("1.0.0"));
    let status = control.status();
    let content = status.modules.iter().find(|m| m.name == "content").unwrap();
    assert!(content.pinned && content.source == "bundled");
    assert!(content.previous.as_deref().is_some_and(|p| p.starts_with("2.0.0")), "{content:?}");
    // A reload with the same file keeps the rollback.
    control.reload().await.unwrap();
    assert_eq!(live(&host, "content").as_deref(), Some("1.0.0"));
    // Rolling back again goes forward again.
    control.rollback("content").await.unwrap();
    assert_eq!(live(&host, "content").as_deref(), Some("2.0.0"));
    control.rollback("content").await.unwrap();
    // A new file ends the rollback.
    drop_in(dir.path(), "content.wasm", &deny_content("3.0.0"));
    wait_for(&host, "content", "3.0.0").await;
    assert!(!control.status().modules.iter().any(|m| m.pinned));
}

#[tokio::test]
async fn the_bundled_modules_start_and_the_directory_adds_to_them() {
    // The bundled modules are checked like any other: here every one of them passes.
    let dir = tempfile::tempdir().unwrap();
    let (control, host) = start(&settings(), dir.path()).await;
    assert_eq!(host.current().modules.len(), 3);
    assert_eq!(
        control.status().modules.iter().map(|m| m.name.as_str()).collect::<Vec<_>>(),
        ["purpose", "content", "pacing"]
    );
    // Without the bundled modules, only the directory's are live.
    drop_in(
        dir.path(),
        "extra.wasm",
        &wasm::policy("extra", "1.0.0", "content", &Behaviour::Allow, &expecting("allow")),
    );
    let settings = PolicySettings { bundled: false, ..settings() };
    let (_, host) = start(&settings, dir.path()).await;
    assert_eq!(host.current().modules.iter().map(|m| m.label()).collect::<Vec<_>>(), ["extra@1.0.0"]);
}

/// Compiled artifacts in a cache directory (the worker's `.stats` and cleanup files
/// left out, and the files it is still writing: `NAME.wip-atomic-write-stats` while it
/// writes a `.stats` file in the background, seen once beside the artifact).
fn cached_artifacts(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(d) = pending.pop() {
        for entry in std::fs::read_dir(&d).unwrap().flatten() {
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().to_string();
            if path.is_dir() {
                pending.push(path);
            } else if !name.ends_with(".stats") && !name.starts_with('.') && !name.contains(".wip-") {
                found.push(path);
            }
        }
    }
    found.sort();
    found
}

#[test]
fn a_restart_loads_compiled_code_from_the_cache_instead_of_compiling_again() {
    let dir = tempfile::tempdir().unwrap();
    let settings = PolicySettings { cache_dir: dir.path().display().to_string(), ..PolicySettings::default() };
    let bytes = wasm::policy("cached", "1.0.0", "content", &Behaviour::Allow, &expecting("allow"));
    host_with(&settings).load(&bytes, "first start", true).unwrap();
    let stored = cached_artifacts(dir.path());
    assert_eq!(stored.len(), 1, "the compiled module was stored: {stored:?}");
    let written = std::fs::metadata(&stored[0]).unwrap().modified().unwrap();
    // A new host (a restart) finds it: nothing is compiled or stored again.
    host_with(&settings).load(&bytes, "restart", true).unwrap();
    assert_eq!(cached_artifacts(dir.path()), stored);
    assert_eq!(std::fs::metadata(&stored[0]).unwrap().modified().unwrap(), written);
    // Another module is another artifact.
    let other = wasm::policy("cached", "1.0.1", "content", &Behaviour::Allow, &expecting("allow"));
    host_with(&settings).load(&other, "new version", true).unwrap();
    assert_eq!(cached_artifacts(dir.path()).len(), 2);
}

#[test]
fn every_rule_of_the_bundled_policies_is_on_the_responsible_messaging_page() {
    let guide = include_str!("../../docs/responsible-messaging.md");
    let host = host();
    let mut codes = std::collections::BTreeSet::new();
    for (name, bytes) in bundled::MODULES {
        let module = host.load(bytes, name, true).unwrap();
        codes.extend(module.metadata.fixtures.iter().filter_map(|f| f.expect.code.clone()));
    }
    assert!(codes.len() >= 12, "{codes:?}");
    for code in &codes {
        assert!(guide.contains(&format!("`{code}`")), "docs/responsible-messaging.md does not explain {code}");
    }
}

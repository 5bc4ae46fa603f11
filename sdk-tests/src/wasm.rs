//! Policy components for tests, written as WebAssembly text: hostile ones (a loop, a
//! memory bomb, a trap, a WASI import, another interface version) and simple ones
//! that answer a fixed decision. No wasm toolchain is needed: the core module is
//! assembled from text (`wat`), the interface's WIT is embedded (`wit-parser`), and
//! `wit-component` makes the component, as `gateway policy build` does.
//!
//! The core functions follow the canonical ABI of interface 0.1.0: `evaluate` takes
//! one pointer (the context has more than 16 flat values) and returns a pointer to the
//! decision (more than one flat value): a byte discriminant (0 allow, 1 deny, 2
//! review), then at offset 4 the payload: deny {code ptr, code len, reason ptr,
//! reason len, risk u8}, review {reason ptr, reason len, risk u8}.

use gateway_server::policy::module::{Metadata, with_metadata};
use wit_component::{ComponentEncoder, StringEncoding};

/// The committed interface 0.1.0.
pub const WIT_V0_1_0: &str = include_str!("../../policies/wit/v0.1.0/policy.wit");

/// What a test module's `evaluate` does.
#[derive(Clone, Debug)]
pub enum Behaviour {
    Allow,
    Deny {
        code: &'static str,
        reason: &'static str,
        risk: u8,
    },
    Review {
        reason: &'static str,
        risk: u8,
    },
    /// `loop {}`.
    Loop,
    /// Grows its memory 1 MiB at a time, forever.
    MemoryBomb,
    /// `unreachable`: what a Rust panic compiles to with `panic = "abort"`.
    Trap,
    /// Counts down from this many, then answers review with `reason`: a slow module.
    Spin {
        iterations: u32,
        reason: &'static str,
    },
}

/// The core module (text) of a policy exporting `evaluate` of interface `version`,
/// importing `imports` (raw WAT import lines).
pub fn core_wat(behaviour: &Behaviour, version: &str, imports: &str) -> String {
    let (body, data) = match behaviour {
        Behaviour::Allow => (String::new(), String::new()),
        Behaviour::Deny { code, reason, risk } => (
            format!(
                "(i32.store8 (i32.const 16) (i32.const 1)) (i32.store (i32.const 20) (i32.const 256)) \
                 (i32.store (i32.const 24) (i32.const {})) (i32.store (i32.const 28) (i32.const 512)) \
                 (i32.store (i32.const 32) (i32.const {})) (i32.store8 (i32.const 36) (i32.const {risk}))",
                code.len(),
                reason.len()
            ),
            format!("(data (i32.const 256) {code:?}) (data (i32.const 512) {reason:?})"),
        ),
        Behaviour::Review { reason, risk } => (
            format!(
                "(i32.store8 (i32.const 16) (i32.const 2)) (i32.store (i32.const 20) (i32.const 512)) \
                 (i32.store (i32.const 24) (i32.const {})) (i32.store8 (i32.const 28) (i32.const {risk}))",
                reason.len()
            ),
            format!("(data (i32.const 512) {reason:?})"),
        ),
        Behaviour::Loop => ("(loop $forever (br $forever))".into(), String::new()),
        Behaviour::MemoryBomb => ("(loop $grow (drop (memory.grow (i32.const 16))) (br $grow))".into(), String::new()),
        Behaviour::Trap => ("unreachable".into(), String::new()),
        Behaviour::Spin { iterations, reason } => (
            format!(
                "(local $n i32) (local.set $n (i32.const {iterations})) \
                 (loop $spin (local.set $n (i32.sub (local.get $n) (i32.const 1))) \
                   (br_if $spin (i32.gt_u (local.get $n) (i32.const 0)))) \
                 (i32.store8 (i32.const 16) (i32.const 2)) (i32.store (i32.const 20) (i32.const 512)) \
                 (i32.store (i32.const 24) (i32.const {})) (i32.store8 (i32.const 28) (i32.const 10))",
                reason.len()
            ),
            format!("(data (i32.const 512) {reason:?})"),
        ),
    };
    format!(
        r#"(module
  {imports}
  (memory (export "memory") 1)
  (global $heap (mut i32) (i32.const 4096))
  (func (export "cabi_realloc") (param i32 i32 i32 i32) (result i32)
    (local $p i32)
    (local.set $p (i32.and (i32.add (global.get $heap) (i32.sub (local.get 2) (i32.const 1)))
                           (i32.sub (i32.const 0) (local.get 2))))
    (global.set $heap (i32.add (local.get $p) (local.get 3)))
    (if (i32.gt_u (global.get $heap) (i32.mul (memory.size) (i32.const 65536)))
      (then (drop (memory.grow (i32.add (i32.const 1)
        (i32.div_u (i32.sub (global.get $heap) (i32.mul (memory.size) (i32.const 65536))) (i32.const 65536)))))))
    (local.get $p))
  (func (export "gateway:policy/evaluator@{version}#evaluate") (param i32) (result i32)
    {body}
    (i32.const 16))
  {data}
)"#
    )
}

/// A component from a core module (text) and the WIT (text, plus `deps` packages) of
/// world `policy`.
pub fn component(core_wat: &str, wit: &str, deps: &[&str]) -> Vec<u8> {
    let module = core_module(core_wat, wit, deps);
    ComponentEncoder::default().module(&module).expect("module").validate(true).encode().expect("component")
}

/// The core module (text) with the WIT of world `policy` embedded, as wit-bindgen
/// leaves it for componentizing.
fn core_module(core_wat: &str, wit: &str, deps: &[&str]) -> Vec<u8> {
    let mut module = wat::parse_str(core_wat).expect("test module assembles");
    let mut resolve = wit_parser::Resolve::default();
    for (i, dep) in deps.iter().enumerate() {
        resolve.push_str(format!("dep{i}.wit"), dep).expect("dependency WIT parses");
    }
    let package = resolve.push_str("policy.wit", wit).expect("WIT parses");
    let world = resolve.select_world(&[package], Some("policy")).expect("world policy");
    wit_component::embed_component_metadata(&mut module, &resolve, world, StringEncoding::UTF8)
        .expect("embedding the interface");
    module
}

/// A built policy of interface 0.1.0: the component with its metadata and fixtures
/// (a JSON array; `"[]"` for none).
pub fn policy(name: &str, version: &str, stages: &str, behaviour: &Behaviour, fixtures: &str) -> Vec<u8> {
    let bytes = component(&core_wat(behaviour, "0.1.0", ""), WIT_V0_1_0, &[]);
    with_fixtures(&bytes, name, version, stages, "0.1.0", fixtures)
}

/// `component` with metadata and fixtures attached.
pub fn with_fixtures(
    component: &[u8],
    name: &str,
    version: &str,
    stages: &str,
    interface: &str,
    fixtures: &str,
) -> Vec<u8> {
    let metadata = Metadata {
        name: name.into(),
        version: version.into(),
        stages: stages.into(),
        interface: interface.into(),
        reads_counters: true,
        fixtures: serde_json::from_str(fixtures).expect("fixtures JSON"),
    };
    with_metadata(component, &metadata).expect("metadata attaches")
}

/// One fixture of the default context expecting `decision` (allow, deny, review).
pub fn expecting(decision: &str) -> String {
    format!(r#"[{{"name": "default context", "expect": {{"decision": "{decision}"}}}}]"#)
}

/// A core module as cargo builds one with the SDK: the interface embedded for
/// componentizing, and the SDK's `gateway-policy` section naming it (no fixtures).
pub fn sdk_core_module(name: &str, version: &str, stages: &str, behaviour: &Behaviour) -> Vec<u8> {
    let module = core_module(&core_wat(behaviour, "0.1.0", ""), WIT_V0_1_0, &[]);
    with_fixtures(&module, name, version, stages, "0.1.0", "[]")
}

/// Puts a module into a policies directory the way operators should: a temporary name
/// (ignored by the watcher, as it starts with a dot), then a rename.
pub fn drop_in(dir: &std::path::Path, file: &str, bytes: &[u8]) {
    let tmp = dir.join(format!(".{file}.tmp"));
    std::fs::write(&tmp, bytes).expect("writing the module");
    std::fs::rename(&tmp, dir.join(file)).expect("renaming the module into place");
}

//! The policy-module loader: any bytes are refused with a typed reason, or load as a
//! module that passed every check (size, component, metadata, interface version,
//! compile, imports, export, a trial instantiation). Seeds: the bundled modules.
#![no_main]
use gateway_server::policy::module::LoadedModule;
use gateway_server::policy::sandbox::{self, Limits};
use libfuzzer_sys::fuzz_target;
use std::sync::OnceLock;

static ENGINE: OnceLock<wasmtime::Engine> = OnceLock::new();

fuzz_target!(|data: &[u8]| {
    let engine = ENGINE.get_or_init(|| sandbox::engine(2, None).expect("the engine starts"));
    let limits = Limits { fuel: 1_000_000, memory_bytes: 1 << 20 };
    if let Ok(module) = LoadedModule::load(engine, data, "fuzz", limits, 1 << 20, false) {
        assert_eq!(module.label().split('@').count(), 2);
    }
});

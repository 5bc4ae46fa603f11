//! What the tests that run the real `gateway` binary share.

use serde_json::Value;
use std::process::Command;

/// The binary on the store at `url`, with `args` and `env`; compiled policy modules
/// are cached across tests, outside the source tree.
pub fn gateway(url: &str, args: &[&str], env: &[(&str, &str)]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_gateway"));
    command.arg("--database-url").arg(url).args(args).env_remove("GATEWAY_DATABASE_URL");
    command.env("GATEWAY_POLICIES__CACHE_DIR", std::env::temp_dir().join("gateway-test-wasm-cache"));
    for (k, v) in env {
        command.env(k, v);
    }
    command
}

/// Runs a CLI command that must succeed; its JSON output.
pub fn run_json(mut command: Command) -> Value {
    let out = command.output().expect("gateway runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("JSON on stdout")
}

/// A port nothing listens on now.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

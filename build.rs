//! Build script of the root package `gateway-contract`. It has one job: take the
//! committed contract `openapi/openapi.json`, refuse to build if it is not an OpenAPI
//! 3.0.3 document of version 1.0.x, and copy it into `OUT_DIR` so that the server
//! serves exactly these bytes at `GET /openapi.json`. It writes only to `OUT_DIR` and
//! never touches the network. (The policy issue may give it the job of building the
//! bundled policy modules instead.)

use std::{env, fs, path::PathBuf};

fn main() {
    let source = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap()).join("openapi/openapi.json");
    println!("cargo:rerun-if-changed={}", source.display());
    let text = fs::read_to_string(&source).unwrap_or_else(|e| {
        panic!("{} is missing ({e}); regenerate it with `UPDATE_OPENAPI=1 cargo test -p gateway-api`", source.display())
    });
    let doc: serde_json::Value =
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{} is not JSON: {e}", source.display()));
    assert_eq!(doc["openapi"], "3.0.3", "the contract must be OpenAPI 3.0.3");
    let version = doc["info"]["version"].as_str().unwrap_or_default();
    assert!(version.starts_with("1.0."), "the contract must stay at version 1.0.x, found {version:?}");
    let out = PathBuf::from(env::var("OUT_DIR").unwrap()).join("openapi.json");
    fs::write(out, text).expect("OUT_DIR is writable");
}

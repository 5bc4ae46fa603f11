//! Rebuilds the crate when a migration changes, and embeds the bundled policy modules
//! (`policies/dist/*.wasm`, built from source by `scripts/build-policies.sh`) into the
//! gateway. A missing file is embedded as empty, so the gateway can be built before the
//! policies are (its own `policy build` makes them); such a gateway refuses to start and
//! says which module is missing.

use std::path::PathBuf;

const BUNDLED: [&str; 3] = ["purpose", "content", "pacing"];

fn main() {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let dist = manifest.join("../policies/dist");
    println!("cargo:rerun-if-changed={}", dist.display());
    // `sqlx::migrate!` embeds the migrations, but cargo sees no change to a file it was
    // not told of: with these lines a new or changed migration rebuilds the crate (else
    // this build script's own rerun-if-changed lines hide them, and the binary keeps the
    // migrations it was first built with).
    println!("cargo:rerun-if-changed={}", manifest.join("migrations/sqlite").display());
    println!("cargo:rerun-if-changed={}", manifest.join("migrations/postgres").display());
    let mut code = String::from("/// (module name, bytes) of each bundled module, in evaluation order.\n");
    code.push_str(&format!("pub const MODULES: [(&str, &[u8]); {}] = [\n", BUNDLED.len()));
    for name in BUNDLED {
        let file = dist.join(format!("{name}.wasm"));
        println!("cargo:rerun-if-changed={}", file.display());
        if file.is_file() {
            let path = file.canonicalize().expect("bundled policy path");
            code.push_str(&format!("    ({name:?}, include_bytes!({:?})),\n", path.display().to_string()));
        } else {
            println!("cargo:warning=policies/dist/{name}.wasm is missing: run scripts/build-policies.sh");
            code.push_str(&format!("    ({name:?}, &[]),\n"));
        }
    }
    code.push_str("];\n");
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR")).join("bundled.rs");
    std::fs::write(out, code).expect("writing bundled.rs");
}

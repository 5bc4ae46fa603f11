//! The default policies, built into the gateway binary.
//!
//! `policies/dist/{purpose,content,pacing}.wasm` are the components
//! `scripts/build-policies.sh` builds from `policies/` (each with its fixtures
//! embedded); CI rebuilds them from source, runs every fixture in the sandbox, and
//! fails if the committed files differ from what the sources build. `build.rs`
//! embeds them. Embedding (rather than installing them beside the binary) means a
//! gateway can never start without its defaults, and the binary is the whole
//! deployment.

include!(concat!(env!("OUT_DIR"), "/bundled.rs"));

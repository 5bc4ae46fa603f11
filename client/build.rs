//! Generates the client from the committed contract, `../openapi/openapi.json`, and
//! nothing else: the client never depends on the server. Output goes to
//! `$OUT_DIR/codegen.rs` (pretty-printed, so it can be read there).

use std::{env, fs, path::PathBuf};

fn main() {
    let src = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap()).join("../openapi/openapi.json");
    println!("cargo:rerun-if-changed={}", src.display());
    let text = fs::read_to_string(&src).expect("openapi/openapi.json is readable");
    let spec = serde_json::from_str(&text).expect("openapi/openapi.json is an OpenAPI document");
    let mut settings = progenitor::GenerationSettings::default();
    settings.with_interface(progenitor::InterfaceStyle::Positional).with_inner_type(quote::quote!(crate::Auth));
    let tokens = progenitor::Generator::new(&settings).generate_tokens(&spec).expect("progenitor generates the client");
    let file = syn::parse2(tokens).expect("generated code parses");
    let out = PathBuf::from(env::var("OUT_DIR").unwrap()).join("codegen.rs");
    fs::write(out, prettyplease::unparse(&file)).expect("OUT_DIR is writable");
}

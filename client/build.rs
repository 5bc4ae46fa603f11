//! Generates the client from the committed contract, `../openapi/openapi.json`, and the
//! typed webhook events from `../openapi/events.schema.json`, and nothing else: the
//! client never depends on the server. Output goes to `$OUT_DIR/codegen.rs` and
//! `$OUT_DIR/events.rs` (pretty-printed, so they can be read there).

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
    events();
}

fn events() {
    let src = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap()).join("../openapi/events.schema.json");
    println!("cargo:rerun-if-changed={}", src.display());
    let text = fs::read_to_string(&src).expect("openapi/events.schema.json is readable");
    let doc: serde_json::Value = serde_json::from_str(&text).expect("events.schema.json is JSON");
    let definitions: std::collections::BTreeMap<String, schemars::schema::Schema> =
        serde_json::from_value(doc["definitions"].clone()).expect("definitions are JSON Schemas");
    let mut settings = typify::TypeSpaceSettings::default();
    settings.with_struct_builder(false).with_derive("PartialEq".to_string());
    let mut space = typify::TypeSpace::new(&settings);
    space.add_ref_types(definitions).expect("typify reads the event schemas");
    let file = syn::parse2(space.to_stream()).expect("generated events parse");
    let out = PathBuf::from(env::var("OUT_DIR").unwrap()).join("events.rs");
    fs::write(out, prettyplease::unparse(&file)).expect("OUT_DIR is writable");
}

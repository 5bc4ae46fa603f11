//! Generates the client from the committed contract, `../openapi/openapi.json`, and the
//! typed webhook events from `../openapi/events.schema.json`, and nothing else: the
//! client never depends on the server. Output goes to `$OUT_DIR/codegen.rs` and
//! `$OUT_DIR/events.rs` (pretty-printed, so they can be read there).
//!
//! The request bodies keep their earlier types. The contract now states the server's
//! rules in the request schemas (one of a text or a media message, lengths, patterns),
//! which would make the generated types enums and validating newtypes and break every
//! caller's code; the wire shape is the same, so the client is generated with the
//! schemas in `request-bodies.json` (the bodies as they were, and the types they
//! name), and the server answers a rule it enforces as it always did. The contract's
//! tests check that those bodies can still send every property the contract has.

use std::collections::BTreeSet;
use std::{env, fs, path::PathBuf};

fn main() {
    let dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap());
    let src = dir.join("../openapi/openapi.json");
    let bodies = dir.join("request-bodies.json");
    println!("cargo:rerun-if-changed={}", src.display());
    println!("cargo:rerun-if-changed={}", bodies.display());
    let text = fs::read_to_string(&src).expect("openapi/openapi.json is readable");
    let mut doc: serde_json::Value = serde_json::from_str(&text).expect("openapi/openapi.json is JSON");
    let kept: serde_json::Value =
        serde_json::from_str(&fs::read_to_string(&bodies).expect("client/request-bodies.json is readable"))
            .expect("client/request-bodies.json is JSON");
    for (name, schema) in kept["schemas"].as_object().expect("schemas") {
        doc["components"]["schemas"][name] = schema.clone();
    }
    prune_unreferenced(&mut doc);
    let spec = serde_json::from_value(doc).expect("openapi/openapi.json is an OpenAPI document");
    let mut settings = progenitor::GenerationSettings::default();
    settings.with_interface(progenitor::InterfaceStyle::Positional).with_inner_type(quote::quote!(crate::Auth));
    let tokens = progenitor::Generator::new(&settings).generate_tokens(&spec).expect("progenitor generates the client");
    let file = syn::parse2(tokens).expect("generated code parses");
    let out = PathBuf::from(env::var("OUT_DIR").unwrap()).join("codegen.rs");
    fs::write(out, prettyplease::unparse(&file)).expect("OUT_DIR is writable");
    events();
}

/// The component names `value` refers to (`#/components/schemas/NAME`), directly.
fn references(value: &serde_json::Value) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let mut stack = vec![value];
    while let Some(v) = stack.pop() {
        match v {
            serde_json::Value::Object(map) => {
                if let Some(name) =
                    map.get("$ref").and_then(|r| r.as_str()).and_then(|r| r.strip_prefix("#/components/schemas/"))
                {
                    found.insert(name.to_string());
                }
                stack.extend(map.values());
            }
            serde_json::Value::Array(items) => stack.extend(items),
            _ => {}
        }
    }
    found
}

/// Removes the component schemas nothing reachable from the paths refers to (the
/// current request bodies' branches, once the 1.0.0 bodies replace them).
fn prune_unreferenced(doc: &mut serde_json::Value) {
    let schemas = doc["components"]["schemas"].clone();
    let mut reachable = BTreeSet::new();
    let mut todo: Vec<String> = references(&doc["paths"]).into_iter().collect();
    todo.extend(references(&doc["components"]["responses"]));
    while let Some(name) = todo.pop() {
        if reachable.insert(name.clone()) {
            todo.extend(references(&schemas[&name]));
        }
    }
    if let Some(map) = doc["components"]["schemas"].as_object_mut() {
        map.retain(|name, _| reachable.contains(name));
    }
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

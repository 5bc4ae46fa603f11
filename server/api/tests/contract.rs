//! The committed contract equals what the API trait generates, and every change to it
//! stays compatible with the released 1.0.0 document.
//!
//! Regenerate on purpose with `UPDATE_OPENAPI=1 cargo test --workspace`, then review
//! `git diff openapi/`.

use std::path::PathBuf;

fn repo_file(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..").join(rel)
}

#[test]
fn committed_contract_matches_the_api_trait() {
    let generated = gateway_api::openapi_document();
    let path = repo_file("openapi/openapi.json");
    if std::env::var_os("UPDATE_OPENAPI").is_some() {
        std::fs::write(&path, &generated).unwrap();
        return;
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    if committed != generated {
        let line = committed
            .lines()
            .zip(generated.lines())
            .position(|(a, b)| a != b)
            .map(|i| i + 1)
            .unwrap_or_else(|| committed.lines().count().min(generated.lines().count()) + 1);
        panic!(
            "openapi/openapi.json differs from the API trait from line {line}; \
             if the change is intended, rerun with UPDATE_OPENAPI=1 and review git diff"
        );
    }
}

#[test]
fn committed_events_schema_matches_the_event_types() {
    let generated = gateway_api::events::events_schema();
    let path = repo_file("openapi/events.schema.json");
    if std::env::var_os("UPDATE_OPENAPI").is_some() {
        std::fs::write(&path, &generated).unwrap();
        return;
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == generated,
        "openapi/events.schema.json differs from the event types in server/api/src/events.rs; if the change \
         is intended, rerun with UPDATE_OPENAPI=1 and review git diff"
    );
    let doc: serde_json::Value = serde_json::from_str(&committed).unwrap();
    assert_eq!(doc["x-event-types"].as_object().unwrap().len(), 16);
    assert_eq!(
        doc["definitions"]["MessageSent"]["required"],
        serde_json::json!(["event", "instance_id", "instance_name", "message_purpose", "timestamp", "to"])
    );
}

#[test]
fn contract_is_openapi_303_version_100() {
    let doc: serde_json::Value = serde_json::from_str(&gateway_api::openapi_document()).unwrap();
    assert_eq!(doc["openapi"], "3.0.3");
    assert_eq!(doc["info"]["version"], "1.0.0");
    let op = &doc["paths"]["/api/send-message"]["post"];
    assert_eq!(op["operationId"], "message_send");
    assert_eq!(op["security"][0]["bearerAuth"], serde_json::json!([]));
    for status in ["400", "401", "403", "404", "415", "422", "423", "429", "500", "502"] {
        assert_eq!(
            op["responses"][status]["content"]["application/json"]["schema"]["$ref"], "#/components/schemas/ErrorBody",
            "status {status}"
        );
    }
    let request = &doc["components"]["schemas"]["SendMessageRequest"];
    assert_eq!(request["additionalProperties"], false);
    let required: Vec<&str> = request["required"].as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
    assert_eq!(required, ["instance_id", "message_purpose", "phone"]);
}

/// Changes a 1.0.0 client cannot live with: anything drift classes as breaking old
/// clients, or cannot classify.
fn breaking_changes(old: &serde_json::Value, new: &serde_json::Value) -> Vec<String> {
    drift::compare(old, new)
        .expect("both documents are OpenAPI")
        .into_iter()
        .flat_map(|change| change.changes)
        .filter(|info| {
            matches!(
                info.class,
                drift::ChangeClass::BackwardIncompatible
                    | drift::ChangeClass::Incompatible
                    | drift::ChangeClass::Unhandled
            )
        })
        .map(|info| format!("{} ({:?}) at {}", info.message, info.class, info.new_subpath))
        .collect()
}

fn released() -> serde_json::Value {
    let text = std::fs::read_to_string(repo_file("openapi/released/gateway-1.0.0.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

#[test]
fn contract_stays_compatible_with_released_1_0_0() {
    let current: serde_json::Value = serde_json::from_str(&gateway_api::openapi_document()).unwrap();
    let breaking = breaking_changes(&released(), &current);
    assert!(
        breaking.is_empty(),
        "the contract breaks 1.0.0 clients; make the change additive instead:\n{}",
        breaking.join("\n")
    );
}

#[test]
fn compatibility_check_catches_breaking_changes() {
    let base = released();
    // A new required request property breaks every 1.0.0 caller.
    let mut added_required = base.clone();
    let schema = &mut added_required["components"]["schemas"]["SendMessageRequest"];
    schema["properties"]["tenant"] = serde_json::json!({"type": "string"});
    schema["required"].as_array_mut().unwrap().push("tenant".into());
    assert!(!breaking_changes(&base, &added_required).is_empty());
    // Removing a response property breaks every 1.0.0 reader.
    let mut removed = base.clone();
    let response = &mut removed["components"]["schemas"]["SendMessageResponse"];
    response["properties"].as_object_mut().unwrap().remove("log_id");
    response["required"].as_array_mut().unwrap().retain(|v| v != "log_id");
    assert!(!breaking_changes(&base, &removed).is_empty());
    // Removing the endpoint is breaking too.
    let mut gone = base.clone();
    gone["paths"].as_object_mut().unwrap().remove("/api/send-message");
    assert!(!breaking_changes(&base, &gone).is_empty());
}

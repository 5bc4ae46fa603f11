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
    // One of a text message and a media message of each type; each refuses unknown
    // properties and requires the recipient, the instance and the purpose.
    let branches = doc["components"]["schemas"]["SendMessageRequest"]["oneOf"].as_array().unwrap();
    assert_eq!(branches.len(), 4);
    for branch in branches {
        assert_eq!(branch["additionalProperties"], false);
        let required: Vec<&str> = branch["required"].as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
        assert!(["instance_id", "message_purpose", "phone"].iter().all(|r| required.contains(r)), "{required:?}");
    }
    // Each branch of both bodies has a title, which generators use as its type name
    // (without one, openapi-python-client names them `SendMessageRequestType0` ...).
    let titles = |name: &str| -> Vec<String> {
        let branches = doc["components"]["schemas"][name]["oneOf"].as_array().unwrap();
        branches.iter().map(|b| b["title"].as_str().unwrap_or("(none)").to_string()).collect()
    };
    assert_eq!(titles("SendMessageRequest"), ["TextMessage", "ImageMessage", "AudioMessage", "DocumentMessage"]);
    assert_eq!(titles("PbxWebhookRequest"), ["PbxTestEvent", "PbxOutboundMessage", "PbxCallEvent"]);
}

/// Request-body changes drift cannot call compatible, each reviewed. The bodies became
/// "one of" several shapes so that the contract states the server's rules (a text or a
/// media message; the fields each PBX event type needs); every request a 1.0.0 server
/// answered with anything but a validation error still fits one shape, because the
/// shapes only require what the 1.0.0 server already refused without. Drift does not
/// look inside a changed kind, so `request_bodies_keep_every_1_0_0_property` checks the
/// shapes instead. (component, drift's message)
const REVIEWED: &[(&str, &str)] =
    &[("#/components/schemas/SendMessageRequest", "schema kind changed from regular type to oneOf")];

/// Changes a 1.0.0 client cannot live with: anything drift classes as breaking old
/// clients, or cannot classify, but for the reviewed input changes.
fn breaking_changes(old: &serde_json::Value, new: &serde_json::Value) -> Vec<String> {
    drift::compare(old, new)
        .expect("both documents are OpenAPI")
        .into_iter()
        .flat_map(|change| {
            let input_only = change.paths.iter().all(|p| p.comparison == drift::ChangeComparison::Input);
            let base = change.paths.first().and_then(|p| p.new.component_base()).unwrap_or("").to_string();
            change.changes.into_iter().filter(move |info| {
                let reviewed = input_only
                    && info.new_subpath.is_empty()
                    && REVIEWED.contains(&(base.as_str(), info.message.as_str()));
                !reviewed
                    && matches!(
                        info.class,
                        drift::ChangeClass::BackwardIncompatible
                            | drift::ChangeClass::Incompatible
                            | drift::ChangeClass::Unhandled
                    )
            })
        })
        .map(|info| format!("{} ({:?}) at {}", info.message, info.class, info.new_subpath))
        .collect()
}

/// A schema with its `$ref` resolved in `doc`.
fn resolve<'a>(doc: &'a serde_json::Value, schema: &'a serde_json::Value) -> &'a serde_json::Value {
    match schema["$ref"].as_str().and_then(|r| r.strip_prefix("#/")) {
        Some(path) => path.split('/').fold(doc, |at, part| &at[part]),
        None => schema,
    }
}

/// The property's type as a 1.0.0 client sends it: a JSON type, or the `$ref`'s enum.
fn wire_type(doc: &serde_json::Value, property: &serde_json::Value) -> String {
    let inner = property["allOf"].get(0).unwrap_or(property);
    let resolved = resolve(doc, inner);
    // An enum written as one of several string enums is a string.
    let types: Vec<&str> = match resolved["oneOf"].as_array() {
        Some(branches) => branches.iter().map(|b| b["type"].as_str().unwrap_or("?")).collect(),
        None => vec![resolved["type"].as_str().unwrap_or("?")],
    };
    if types.windows(2).all(|w| w[0] == w[1]) { types[0].to_string() } else { "?".to_string() }
}

/// What the reviewed "one of" changes must keep: every branch of a body has every
/// 1.0.0 property with the same wire type (so no 1.0.0 request is refused for a
/// property it sends), no branch has a property 1.0.0 did not, and a property is
/// required in a branch only if 1.0.0 required it or the 1.0.0 server refused a
/// request without it (`ENFORCED`: which body, property, and the rule that made it so).
fn body_problems(old: &serde_json::Value, new: &serde_json::Value, name: &str) -> Vec<String> {
    const ENFORCED: &[(&str, &str, &str)] = &[
        ("SendMessageRequest", "message", "missing_message_text for a text send"),
        ("SendMessageRequest", "media_type", "required when any media field is sent"),
        ("SendMessageRequest", "mime_type", "required when sending media"),
        ("SendMessageRequest", "file_name", "required when sending media"),
        ("SendMessageRequest", "media", "required when sending media"),
        ("PbxWebhookRequest", "to", "an outbound_message needs it (400 validation_error)"),
        ("PbxWebhookRequest", "message_text", "an outbound_message needs it (400 validation_error)"),
    ];
    let old_body = &old["components"]["schemas"][name];
    let old_required: Vec<&str> = old_body["required"].as_array().unwrap().iter().filter_map(|v| v.as_str()).collect();
    let old_props = old_body["properties"].as_object().unwrap();
    let body = &new["components"]["schemas"][name];
    let mut problems = Vec::new();
    let branches = body["oneOf"].as_array().map(|b| b.iter().map(|s| resolve(new, s)).collect::<Vec<_>>());
    for branch in branches.unwrap_or_else(|| vec![body]) {
        let props = branch["properties"].as_object().unwrap();
        for (key, old_prop) in old_props {
            match props.get(key) {
                None => problems.push(format!("{name}: a branch lost {key}")),
                Some(p) if wire_type(new, p) != wire_type(old, old_prop) => problems.push(format!(
                    "{name}.{key}: type {} became {}",
                    wire_type(old, old_prop),
                    wire_type(new, p)
                )),
                _ => {}
            }
        }
        for key in props.keys().filter(|k| !old_props.contains_key(*k)) {
            problems.push(format!("{name}: a branch added {key}"));
        }
        for required in branch["required"].as_array().unwrap().iter().filter_map(|v| v.as_str()) {
            let enforced = ENFORCED.iter().any(|(b, p, _)| *b == name && *p == required);
            if !old_required.contains(&required) && !enforced {
                problems.push(format!("{name}: a branch requires {required}, which 1.0.0 did not"));
            }
        }
    }
    problems
}

/// The request bodies as generated clients type them (`client/request-bodies.json`):
/// the shapes before the contract stated the server's rules in them.
fn client_bodies() -> serde_json::Value {
    let text = std::fs::read_to_string(repo_file("client/request-bodies.json")).unwrap();
    let kept: serde_json::Value = serde_json::from_str(&text).unwrap();
    serde_json::json!({"components": {"schemas": kept["schemas"]}})
}

#[test]
fn request_bodies_keep_every_1_0_0_property() {
    let current: serde_json::Value = serde_json::from_str(&gateway_api::openapi_document()).unwrap();
    // The 1.0.0 send body is the one clients type.
    let old = client_bodies();
    assert_eq!(
        old["components"]["schemas"]["SendMessageRequest"]["properties"],
        released()["components"]["schemas"]["SendMessageRequest"]["properties"]
    );
    for name in ["SendMessageRequest", "PbxWebhookRequest"] {
        let problems = body_problems(&old, &current, name);
        assert!(problems.is_empty(), "{}", problems.join("\n"));
    }
    // The check can fail: a branch that requires a new property, or loses one.
    let mut broken = current.clone();
    let first = broken["components"]["schemas"]["SendMessageRequest"]["oneOf"][0].clone();
    let mut branch = resolve(&current, &first).clone();
    branch["required"].as_array_mut().unwrap().push("tenant".into());
    branch["properties"].as_object_mut().unwrap().remove("caption");
    broken["components"]["schemas"]["SendMessageRequest"]["oneOf"][0] = branch;
    let problems = body_problems(&old, &broken, "SendMessageRequest");
    assert!(
        problems.iter().any(|p| p.contains("requires tenant")) && problems.iter().any(|p| p.contains("lost caption"))
    );
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
    // A reviewed change elsewhere than the two bodies is still caught.
    let mut other = base.clone();
    other["components"]["schemas"]["SendMessageResponse"] = serde_json::json!({"oneOf": [{"type": "object"}]});
    assert!(!breaking_changes(&base, &other).is_empty());
    // Removing the endpoint is breaking too.
    let mut gone = base.clone();
    gone["paths"].as_object_mut().unwrap().remove("/api/send-message");
    assert!(!breaking_changes(&base, &gone).is_empty());
}

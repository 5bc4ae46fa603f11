//! The published schemas of the two request bodies: what the server enforces, as far
//! as a JSON Schema can say it.
//!
//! - send-message is one of a text message (`message` required, no media fields) or a
//!   media message of each media type (`media_type`, its MIME types, `file_name`,
//!   `media` required);
//! - the PBX webhook is one of a `test` event, an `outbound_message` event (`to` and
//!   `message_text` required) or a call event (the other types);
//! - every string the server bounds has its length and pattern;
//! - every branch has a `title` (`TextMessage`, `ImageMessage`, ...; `PbxTestEvent`,
//!   ...), which generators use as the branch's type name (openapi-python-client would
//!   otherwise name them `SendMessageRequestType0` ...; `scripts/python-client.sh`
//!   checks the names). A title changes nothing on the wire.
//!
//! The server reads both bodies leniently (see `types`) and answers each rule with the
//! specification's error code; these schemas only publish the rules. What no schema
//! can express (a number that exists in a numbering plan, media content, the purpose
//! policy, a template set at run time) is listed in `schemathesis.toml` with its reason.
//! Generated clients keep the 1.0.0 shapes of these bodies (`client/build.rs`).

use schemars::r#gen::SchemaGenerator;
use schemars::schema::Schema;
use serde_json::{Value, json};

/// The phone syntax the gateway reads: digits with an optional `+` (or `00`), and
/// spaces, dots, dashes, parentheses; 6 to 21 digits. Whether the digits are a number
/// of a real numbering plan is checked by the server (listed in `schemathesis.toml`).
pub const PHONE_PATTERN: &str = r"^[ \u00a0().-]*\+?(?:[ \u00a0().-]*[0-9]){6,21}[ \u00a0().-]*$";
/// A file name: no path separators or NUL, not blank.
pub const FILE_NAME_PATTERN: &str = r"^[^/\\\u0000]*[^/\\\u0000\s][^/\\\u0000]*$";
/// Longest message text or caption, in characters.
pub const MAX_TEXT_CHARS: u32 = 4096;
/// Longest PBX free-text field (extension, queue, call time, ids).
pub const MAX_PBX_FIELD_CHARS: u32 = 128;

fn schema(value: Value) -> Schema {
    serde_json::from_value(value).expect("a valid schema")
}

fn purpose(g: &mut SchemaGenerator) -> Value {
    serde_json::to_value(g.subschema_for::<crate::MessagePurpose>()).expect("a schema")
}

/// A property every branch has alike.
fn common(g: &mut SchemaGenerator) -> serde_json::Map<String, Value> {
    let mut p = serde_json::Map::new();
    p.insert(
        "instance_id".into(),
        json!({"description": "Instance ID or instance name owned by the customer.",
               "type": "string", "minLength": 1, "maxLength": 64, "pattern": r"\S"}),
    );
    p.insert(
        "phone".into(),
        json!({"description": "Recipient number in international format (E.164, for example `+14155550123`).",
               "type": "string", "pattern": PHONE_PATTERN}),
    );
    p.insert("message_purpose".into(), json!({"description": "Why the message is sent.", "allOf": [purpose(g)]}));
    p
}

/// A property that only another branch may have: absent or null here.
fn absent(what: &str) -> Value {
    json!({"description": format!("Only for {what}."), "type": "string", "nullable": true, "enum": [null]})
}

fn text_message(g: &mut SchemaGenerator) -> Value {
    let mut p = common(g);
    p.insert(
        "message".into(),
        json!({"description": "The text.", "type": "string", "maxLength": MAX_TEXT_CHARS, "pattern": r"\S"}),
    );
    for field in ["caption", "media", "media_type", "mime_type", "file_name"] {
        p.insert(field.into(), absent("media sends"));
    }
    json!({"title": "TextMessage", "description": "A text message.", "type": "object", "additionalProperties": false,
           "required": ["instance_id", "message", "message_purpose", "phone"], "properties": p})
}

fn media_message(g: &mut SchemaGenerator, title: &str, media_type: &str, mime_pattern: &str) -> Value {
    let mut p = common(g);
    p.insert("media_type".into(), json!({"description": "Kind of media.", "type": "string", "enum": [media_type]}));
    p.insert(
        "mime_type".into(),
        json!({"description": "Media MIME type, one this media type accepts.", "type": "string",
               "pattern": mime_pattern}),
    );
    p.insert(
        "file_name".into(),
        json!({"description": "File name (at most 255 bytes of UTF-8).", "type": "string", "maxLength": 255,
               "pattern": FILE_NAME_PATTERN}),
    );
    p.insert(
        "media".into(),
        json!({"description": "Base64 contents, a data URL, or an https URL the gateway fetches.",
               "type": "string", "pattern": r"\S"}),
    );
    p.insert(
        "message".into(),
        json!({"description": "Caption, when `caption` is not given.", "type": "string", "nullable": true,
               "maxLength": MAX_TEXT_CHARS}),
    );
    p.insert(
        "caption".into(),
        json!({"description": "Media caption; overrides `message` as caption when given.", "type": "string",
               "nullable": true, "maxLength": MAX_TEXT_CHARS}),
    );
    json!({"title": title, "description": format!("A media message ({media_type})."), "type": "object",
           "additionalProperties": false,
           "required": ["file_name", "instance_id", "media", "media_type", "message_purpose", "mime_type", "phone"],
           "properties": p})
}

/// The schema of `SendMessageRequest`.
pub fn send_message(g: &mut SchemaGenerator) -> Schema {
    let document = r"^(application/(pdf|msword|vnd\.ms-excel|vnd\.ms-powerpoint|rtf|zip|json|xml)|text/(plain|csv)|application/vnd\.openxmlformats-officedocument\..+|application/vnd\.oasis\.opendocument\..+)$";
    schema(json!({
        "description": "Send a text message (`message`) or a media message (`media_type`, `mime_type`, \
                        `file_name`, `media`, optional `caption`). Unknown properties are rejected.",
        "oneOf": [
            text_message(g),
            media_message(g, "ImageMessage", "image", "^image/(jpeg|png|webp)$"),
            media_message(g, "AudioMessage", "audio", "^audio/(aac|mp4|mpeg|amr|ogg|opus|wav|webm)$"),
            media_message(g, "DocumentMessage", "document", document),
        ]
    }))
}

/// Properties every PBX event may carry.
fn pbx_common(g: &mut SchemaGenerator, event_types: &[&str]) -> serde_json::Map<String, Value> {
    let short = |description: &str| json!({"description": description, "type": "string", "nullable": true, "maxLength": MAX_PBX_FIELD_CHARS});
    let mut p = serde_json::Map::new();
    p.insert("event_type".into(), json!({"description": "What happened.", "type": "string", "enum": event_types}));
    p.insert("conversation_id".into(), short("The phone system's conversation."));
    p.insert(
        "external_message_id".into(),
        short("The phone system's own identifier of this event; a repeat is answered with the first result and sends nothing."),
    );
    p.insert("agent_extension".into(), short("The agent's extension."));
    p.insert("queue".into(), short("The call queue."));
    p.insert("call_time".into(), short("When the call happened, as the phone system writes it."));
    p.insert(
        "message_purpose".into(),
        json!({"description": "Purpose of the message an event sends; `support` when absent.", "nullable": true,
               "allOf": [purpose(g)]}),
    );
    p.insert(
        "to".into(),
        json!({"description": "Destination phone of an `outbound_message` event (others ignore it).",
               "type": "string", "nullable": true}),
    );
    p.insert(
        "customer_phone".into(),
        json!({"description": "The caller's phone, the recipient of a templated message (`test` and \
                               `outbound_message` ignore it).", "type": "string", "nullable": true}),
    );
    p.insert(
        "message_text".into(),
        json!({"description": "Body of an `outbound_message` event (others ignore it).", "type": "string",
               "nullable": true}),
    );
    p
}

/// The schema of `PbxWebhookRequest`.
pub fn pbx_webhook(g: &mut SchemaGenerator) -> Schema {
    let test = pbx_common(g, &["test"]);
    let mut outbound = pbx_common(g, &["outbound_message"]);
    outbound
        .insert("to".into(), json!({"description": "Destination phone.", "type": "string", "pattern": PHONE_PATTERN}));
    outbound.insert(
        "message_text".into(),
        json!({"description": "The text to send.", "type": "string", "maxLength": MAX_TEXT_CHARS, "pattern": r"\S"}),
    );
    let calls: Vec<&str> = crate::PbxEventType::ALL.iter().filter(|e| e.is_templatable()).map(|e| e.as_str()).collect();
    let mut call = pbx_common(g, &calls);
    // Empty is allowed: a phone system may send it for a withheld number (no message).
    let empty_or_phone = format!("^$|{PHONE_PATTERN}");
    call.insert(
        "customer_phone".into(),
        json!({"description": "The caller's phone, the recipient of a templated message (empty: withheld).",
               "type": "string", "nullable": true, "pattern": empty_or_phone}),
    );
    schema(json!({
        "description": "A call event from a phone system (PBX). Properties this version does not know are ignored.",
        "oneOf": [
            {"title": "PbxTestEvent", "description": "A test event: needs nothing.", "type": "object", "required": ["event_type"],
             "properties": test},
            {"title": "PbxOutboundMessage", "description": "Sends `message_text` to `to`.", "type": "object",
             "required": ["event_type", "message_text", "to"], "properties": outbound},
            {"title": "PbxCallEvent", "description": "A call event: messages `customer_phone` when the integration has a template for the \
                            event type (then `customer_phone` is needed).",
             "type": "object", "required": ["event_type"], "properties": call},
        ]
    }))
}

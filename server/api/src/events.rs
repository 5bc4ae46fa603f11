//! The customer webhook events: the body of each of the 16 event types.
//!
//! These types are the source of `openapi/events.schema.json` (checked for drift like
//! the contract), from which `gateway-client` generates its typed events; the server
//! builds event bodies from them. Every body holds the common base fields and the
//! event's own fields (specification, "Events"). Types stay open to additive fields.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Fields of every event.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct EventBase {
    /// The event name, e.g. `message.sent` (also in header `X-Gateway-Event`).
    pub event: String,
    /// Instance identifier.
    pub instance_id: String,
    /// Instance name.
    pub instance_name: String,
    /// When it happened (RFC 3339).
    pub timestamp: String,
}

/// Fields of the message status events.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct StatusFields {
    /// The contact (E.164).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<String>,
    /// The messaging network's message id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub external_message_id: Option<String>,
    /// The provider's status, e.g. `DELIVERY_ACK`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<String>,
}

/// Fields of the instance connection events.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ConnectionFields {
    /// `open` when connected.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connection_state: Option<String>,
}

/// Fields of the call events.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct CallFields {
    /// The caller (E.164).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub call_status: Option<String>,
}

macro_rules! events {
    ($( $(#[$doc:meta])* $name:ident = $wire:literal { $( $(#[$fdoc:meta])* $fvis:vis $field:ident : $ty:ty ),* $(,)? } )*) => {
        $(
            $(#[$doc])*
            #[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
            pub struct $name {
                #[serde(flatten)]
                pub base: EventBase,
                $( $(#[$fdoc])* $fvis $field: $ty, )*
            }

            impl $name {
                /// The event name.
                pub const NAME: &'static str = $wire;
            }
        )*

        /// Every event name, in the specification's order.
        pub const EVENT_NAMES: [&str; 16] = [$($wire),*];

        /// The JSON Schema of every event body, one definition per event.
        pub fn events_schema_definitions(g: &mut schemars::r#gen::SchemaGenerator) -> Vec<(&'static str, &'static str)> {
            // Named types are registered under `definitions` and referenced.
            vec![$( { let _ = g.subschema_for::<$name>(); (stringify!($name), $wire) } ),*]
        }
    };
}

events! {
    /// A message from a contact arrived.
    MessageReceived = "message.received" {
        /// Sender (E.164).
        pub from: String,
        pub message_text: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub message_type: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub external_message_id: Option<String>,
    }
    /// The provider accepted a message.
    MessageSent = "message.sent" {
        /// Recipient (E.164).
        pub to: String,
        pub message_purpose: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub message_id: Option<String>,
    }
    /// The provider did not accept a message.
    MessageFailed = "message.failed" {
        pub to: String,
        pub message_purpose: String,
        /// Why, e.g. `provider_rejected`.
        pub error: String,
    }
    /// A contact opted out and is suppressed.
    RecipientOptedOut = "recipient.opted_out" {
        pub from: String,
        pub reason: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub message_text: Option<String>,
    }
    /// The instance connected.
    InstanceConnected = "instance.connected" {
        #[serde(flatten)]
        pub connection: ConnectionFields,
    }
    /// The instance disconnected.
    InstanceDisconnected = "instance.disconnected" {
        #[serde(flatten)]
        pub connection: ConnectionFields,
    }
    /// The instance's connection state changed.
    InstanceConnectionUpdated = "instance.connection_updated" {
        #[serde(flatten)]
        pub connection: ConnectionFields,
    }
    /// A new pairing QR code is available.
    InstanceQrUpdated = "instance.qr_updated" {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub qr_available: Option<bool>,
    }
    /// A message was delivered.
    MessageDelivered = "message.delivered" {
        #[serde(flatten)]
        pub status: StatusFields,
    }
    /// A message was read.
    MessageRead = "message.read" {
        #[serde(flatten)]
        pub status: StatusFields,
    }
    /// A message's status changed otherwise.
    MessageStatusUpdated = "message.status_updated" {
        #[serde(flatten)]
        pub status: StatusFields,
    }
    /// A conversation window opened or closed.
    ConversationUpdated = "conversation.updated" {
        /// The contact (E.164) the conversation is with.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub conversation_id: Option<String>,
        /// `open` when the contact wrote and a 24-hour window opened, `closed` when it
        /// ended (additive to the specification's fields).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub conversation_state: Option<String>,
    }
    /// A call came in.
    CallReceived = "call.received" {
        #[serde(flatten)]
        pub call: CallFields,
    }
    /// A call was missed.
    CallMissed = "call.missed" {
        #[serde(flatten)]
        pub call: CallFields,
    }
    /// A message arrived in a group.
    GroupMessageReceived = "group.message_received" {
        pub group_id: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub from: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub message_text: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub external_message_id: Option<String>,
    }
    /// A group changed.
    GroupUpdated = "group.updated" {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub group_id: Option<String>,
    }
}

/// `openapi/events.schema.json`: a JSON Schema (draft 7) with one definition per event
/// body and `oneOf` over all of them, written in a stable order.
pub fn events_schema() -> String {
    let mut g = schemars::r#gen::SchemaSettings::draft07().into_generator();
    let names = events_schema_definitions(&mut g);
    let definitions = g.take_definitions();
    let one_of: Vec<serde_json::Value> =
        names.iter().map(|(ty, _)| serde_json::json!({"$ref": format!("#/definitions/{ty}")})).collect();
    let event_names: serde_json::Map<String, serde_json::Value> =
        names.iter().map(|(ty, wire)| (wire.to_string(), serde_json::Value::String(ty.to_string()))).collect();
    let doc = serde_json::json!({
        "$schema": "http://json-schema.org/draft-07/schema#",
        "title": "Gateway webhook events",
        "description": "Bodies of the customer webhook events. Header X-Gateway-Event names the event; \
                        x-event-types maps each name to its definition.",
        "x-event-types": event_names,
        "oneOf": one_of,
        "definitions": definitions,
    });
    let mut out = serde_json::to_string_pretty(&doc).expect("the schema serialises");
    out.push('\n');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sixteen_distinct_names() {
        let mut names = EVENT_NAMES.to_vec();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), 16);
        assert_eq!(MessageSent::NAME, "message.sent");
    }

    #[test]
    fn a_body_is_flat_base_plus_fields() {
        let body = MessageSent {
            base: EventBase {
                event: "message.sent".into(),
                instance_id: "ins_1".into(),
                instance_name: "main".into(),
                timestamp: "2026-11-21T10:00:00Z".into(),
            },
            to: "+14155550123".into(),
            message_purpose: "support".into(),
            message_id: None,
        };
        let json = serde_json::to_value(&body).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"event": "message.sent", "instance_id": "ins_1", "instance_name": "main",
                               "timestamp": "2026-11-21T10:00:00Z", "to": "+14155550123", "message_purpose": "support"})
        );
        assert_eq!(serde_json::from_value::<MessageSent>(json).unwrap(), body);
    }
}

//! Wire types of the v1 contract.
//!
//! The send request has two faces. Its *schema* (what the contract publishes and what
//! generated clients send) has the required fields and the purpose and media-type
//! enums. Its *deserialisation* is lenient: every field is optional text, so that a
//! missing phone is `missing_phone`, a missing purpose `message_purpose_required` and a
//! purpose outside the allowed set `message_purpose_not_allowed`, as the specification
//! names them, rather than one generic serde error. Unknown properties are still
//! refused at parse time (`deny_unknown_fields`). The published schemas of both request
//! bodies are in `request_schemas`.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Why a message is sent. Marketing, cold outreach, political messages and bulk
/// campaigns are not allowed purposes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum MessagePurpose {
    Transactional,
    Operational,
    Support,
    InternalTeam,
    Authentication,
}

impl MessagePurpose {
    /// Every purpose of the specification.
    pub const ALL: [MessagePurpose; 5] = [
        MessagePurpose::Transactional,
        MessagePurpose::Operational,
        MessagePurpose::Support,
        MessagePurpose::InternalTeam,
        MessagePurpose::Authentication,
    ];

    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            MessagePurpose::Transactional => "transactional",
            MessagePurpose::Operational => "operational",
            MessagePurpose::Support => "support",
            MessagePurpose::InternalTeam => "internal_team",
            MessagePurpose::Authentication => "authentication",
        }
    }

    /// Parses a wire name.
    pub fn parse(s: &str) -> Option<MessagePurpose> {
        MessagePurpose::ALL.into_iter().find(|p| p.as_str() == s)
    }
}

/// Kind of media in a media send.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum MediaType {
    Image,
    /// Documents such as PDFs.
    Document,
    Audio,
}

impl MediaType {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            MediaType::Image => "image",
            MediaType::Document => "document",
            MediaType::Audio => "audio",
        }
    }

    /// Parses a wire name.
    pub fn parse(s: &str) -> Option<MediaType> {
        [MediaType::Image, MediaType::Document, MediaType::Audio].into_iter().find(|m| m.as_str() == s)
    }
}

/// Body of `POST /api/send-message` as the server reads it (see the module docs).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SendMessageRequest {
    pub instance_id: Option<String>,
    pub phone: Option<String>,
    pub message_purpose: Option<String>,
    pub message: Option<String>,
    pub media_type: Option<String>,
    pub mime_type: Option<String>,
    pub file_name: Option<String>,
    pub media: Option<String>,
    pub caption: Option<String>,
}

impl JsonSchema for SendMessageRequest {
    fn schema_name() -> String {
        "SendMessageRequest".to_string()
    }

    fn json_schema(g: &mut schemars::r#gen::SchemaGenerator) -> schemars::schema::Schema {
        crate::request_schemas::send_message(g)
    }
}

/// Success body of `POST /api/send-message`.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
pub struct SendMessageResponse {
    /// Always `true`.
    pub success: bool,
    /// Delivery status at the time of the answer, for example `sent`.
    pub status: String,
    /// Message identifier from the messaging network.
    pub message_id: String,
    /// Identifier of the message log entry.
    pub log_id: i64,
    /// `text` or the media type.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message_type: Option<String>,
}

/// The PBX event types of the specification.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum PbxEventType {
    Test,
    OutboundMessage,
    InboundReply,
    MissedCall,
    CallStarted,
    CallEnded,
    Voicemail,
    QueueEvent,
    QueueCallback,
    AfterHours,
}

impl PbxEventType {
    /// Every event type, in the specification's order.
    pub const ALL: [PbxEventType; 10] = [
        PbxEventType::Test,
        PbxEventType::OutboundMessage,
        PbxEventType::InboundReply,
        PbxEventType::MissedCall,
        PbxEventType::CallStarted,
        PbxEventType::CallEnded,
        PbxEventType::Voicemail,
        PbxEventType::QueueEvent,
        PbxEventType::QueueCallback,
        PbxEventType::AfterHours,
    ];

    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            PbxEventType::Test => "test",
            PbxEventType::OutboundMessage => "outbound_message",
            PbxEventType::InboundReply => "inbound_reply",
            PbxEventType::MissedCall => "missed_call",
            PbxEventType::CallStarted => "call_started",
            PbxEventType::CallEnded => "call_ended",
            PbxEventType::Voicemail => "voicemail",
            PbxEventType::QueueEvent => "queue_event",
            PbxEventType::QueueCallback => "queue_callback",
            PbxEventType::AfterHours => "after_hours",
        }
    }

    /// Parses a wire name.
    pub fn parse(s: &str) -> Option<PbxEventType> {
        PbxEventType::ALL.into_iter().find(|e| e.as_str() == s)
    }

    /// Call events that message the caller back when the integration has a template.
    pub fn is_callback(self) -> bool {
        matches!(
            self,
            PbxEventType::MissedCall | PbxEventType::Voicemail | PbxEventType::AfterHours | PbxEventType::QueueCallback
        )
    }

    /// Event types that may carry a template (every type but `test` and `outbound_message`).
    pub fn is_templatable(self) -> bool {
        !matches!(self, PbxEventType::Test | PbxEventType::OutboundMessage)
    }
}

/// Body of `POST /integrations/pbx/webhook/{integration_id}` as the server reads it.
///
/// Lenient like the send request: every field is optional text, so that a missing or
/// unknown `event_type` is a 400 `validation_error` naming the field. Properties this
/// version does not know are ignored: phone systems add their own.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
pub struct PbxWebhookRequest {
    pub event_type: Option<String>,
    pub to: Option<String>,
    pub customer_phone: Option<String>,
    pub message_text: Option<String>,
    pub message_purpose: Option<String>,
    pub conversation_id: Option<String>,
    pub external_message_id: Option<String>,
    pub agent_extension: Option<String>,
    pub queue: Option<String>,
    pub call_time: Option<String>,
}

impl JsonSchema for PbxWebhookRequest {
    fn schema_name() -> String {
        "PbxWebhookRequest".to_string()
    }

    fn json_schema(g: &mut schemars::r#gen::SchemaGenerator) -> schemars::schema::Schema {
        crate::request_schemas::pbx_webhook(g)
    }
}

/// Success body of the PBX webhook.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
pub struct PbxWebhookResponse {
    /// Always `true`.
    pub success: bool,
    /// `processed`.
    pub status: String,
    /// Echo of the processed event type.
    pub event_type: String,
    /// What the gateway did: `received` (test), `message_sent`, `ignored` (no template
    /// for this event type), `cooldown` (the caller was messaged for this event type
    /// within the cooldown), `outside_conversation_window` (strict window on, the
    /// caller has not written recently).
    pub action: String,
    /// Message identifier, present when a message was sent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message_id: Option<String>,
}

/// Headers of the PBX webhook, as published in the contract. The server reads them
/// itself (see `PbxBody`), so that a missing or garbled one is the generic 401.
#[derive(Deserialize, JsonSchema)]
#[allow(dead_code)]
pub struct PbxHeaders {
    /// The integration's webhook secret.
    #[serde(rename = "X-Gateway-3CX-Secret")]
    secret: Option<String>,
    /// Unix time in seconds; required when HMAC signing is configured.
    #[serde(rename = "X-Gateway-Timestamp")]
    timestamp: Option<String>,
    /// `sha256=<hex>` (or bare `<hex>`): HMAC-SHA256 of timestamp + "." + raw body;
    /// required when HMAC signing is configured.
    #[serde(rename = "X-Gateway-Signature")]
    signature: Option<String>,
}

/// Path of the PBX webhook. The contract says integer; the server reads text, so that
/// a malformed id is the same 401 as an unknown one.
#[derive(Deserialize, JsonSchema)]
pub struct PbxPath {
    /// The integration's identifier.
    #[schemars(with = "u64")]
    pub integration_id: String,
}

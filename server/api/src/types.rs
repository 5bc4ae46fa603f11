//! Wire types of the v1 contract.
//!
//! The send request has two faces. Its *schema* (what the contract publishes and what
//! generated clients send) has the required fields and the purpose and media-type
//! enums. Its *deserialisation* is lenient: every field is optional text, so that a
//! missing phone is `missing_phone`, a missing purpose `message_purpose_required` and a
//! purpose outside the allowed set `message_purpose_not_allowed`, as the specification
//! names them, rather than one generic serde error. Unknown properties are still
//! refused at parse time (`deny_unknown_fields`).

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
        SendMessageRequestSchema::json_schema(g)
    }
}

/// Send a text message (`message`) or a media message (`media_type`, `mime_type`,
/// `file_name`, `media`, optional `caption`). Unknown properties are rejected.
#[derive(JsonSchema)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
struct SendMessageRequestSchema {
    /// Instance ID or instance name owned by the customer.
    instance_id: String,
    /// Recipient number in international format (E.164, for example `+14155550123`).
    phone: String,
    /// Why the message is sent.
    message_purpose: MessagePurpose,
    /// Body for text sends; used as media caption when media is sent.
    #[serde(default)]
    message: Option<String>,
    /// Kind of media; required when sending media.
    #[serde(default)]
    media_type: Option<MediaType>,
    /// Media MIME type; required when sending media.
    #[serde(default)]
    mime_type: Option<String>,
    /// File name; required when sending media.
    #[serde(default)]
    file_name: Option<String>,
    /// Base64 contents, a data URL, or an HTTPS URL reachable by the provider;
    /// required when sending media.
    #[serde(default)]
    media: Option<String>,
    /// Media caption; overrides `message` as caption when given.
    #[serde(default)]
    caption: Option<String>,
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

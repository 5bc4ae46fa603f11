//! The schema step: the request's fields read and checked (instance reference, phone
//! number in E.164, purpose, text or media), before anything is read from the store.

use super::{SendError, Sender};
use crate::media::{self, Media};
use crate::phone::{self, Phone};
use gateway_api::{MediaType, SendMessageRequest};

/// Longest text body accepted (the messaging network's own limit).
pub const MAX_TEXT_CHARS: usize = 4096;

/// A request that passed the schema step.
pub(super) struct Checked {
    pub instance_ref: String,
    pub phone: Phone,
    pub purpose: String,
    pub text: Option<String>,
    pub media: Option<Media>,
}

impl Checked {
    pub(super) fn message_type(&self) -> &'static str {
        self.media.as_ref().map_or("text", |m| m.media_type.as_str())
    }
}

impl Sender {
    pub(super) async fn check_schema(&self, body: &SendMessageRequest) -> Result<Checked, SendError> {
        let instance_ref = non_empty(&body.instance_id)
            .ok_or_else(|| validation("instance_id", "instance_id is required"))?
            .to_string();
        let raw_phone = non_empty(&body.phone).ok_or(SendError::MissingPhone)?;
        let phone = phone::normalize(raw_phone)
            .ok_or_else(|| validation("phone", "phone is not a valid number in international format"))?;
        let purpose = non_empty(&body.message_purpose).ok_or(SendError::PurposeRequired)?.to_string();
        let is_media =
            body.media_type.is_some() || body.media.is_some() || body.mime_type.is_some() || body.file_name.is_some();
        let (text, media) = if is_media {
            let media_type = non_empty(&body.media_type)
                .ok_or_else(|| validation("media_type", "media_type is required when sending media"))?;
            let media_type = MediaType::parse(media_type)
                .ok_or_else(|| validation("media_type", "media_type must be image, document or audio"))?;
            let mime_type = non_empty(&body.mime_type)
                .ok_or_else(|| validation("mime_type", "mime_type is required when sending media"))?;
            let file_name = non_empty(&body.file_name)
                .ok_or_else(|| validation("file_name", "file_name is required when sending media"))?;
            if file_name.len() > 255 || file_name.contains(['/', '\\', '\0']) {
                return Err(validation("file_name", "file_name must be a plain name of at most 255 bytes"));
            }
            let content =
                non_empty(&body.media).ok_or_else(|| validation("media", "media is required when sending media"))?;
            let media = media::validate(media_type, mime_type, file_name, content, &self.config.media, &self.fetcher)
                .await
                .map_err(|e| SendError::Validation { field: e.field, reason: e.reason })?;
            let caption = non_empty(&body.caption).or(non_empty(&body.message)).map(str::to_string);
            (caption, Some(media))
        } else {
            if body.caption.is_some() {
                return Err(validation("caption", "caption is only for media sends; use message"));
            }
            let text = non_empty(&body.message).ok_or(SendError::MissingMessageText)?.to_string();
            (Some(text), None)
        };
        if let Some(text) = &text
            && text.chars().count() > MAX_TEXT_CHARS
        {
            let field = if is_media && non_empty(&body.caption).is_some() { "caption" } else { "message" };
            return Err(validation(field, format!("text is longer than {MAX_TEXT_CHARS} characters")));
        }
        Ok(Checked { instance_ref, phone, purpose, text, media })
    }
}

pub(super) fn non_empty(field: &Option<String>) -> Option<&str> {
    field.as_deref().map(str::trim).filter(|s| !s.is_empty())
}

pub(super) fn validation(field: &'static str, reason: impl Into<String>) -> SendError {
    SendError::Validation { field, reason: reason.into() }
}

pub(super) fn truncate(s: &str, max: usize) -> String {
    s.chars().take(max).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::policy::PolicyEngine;
    use crate::store::Store;
    use gateway_policy_model as model;
    use std::sync::Arc;

    /// These tests stop at the schema step; no policy is asked.
    struct Unreachable;

    #[async_trait::async_trait]
    impl PolicyEngine for Unreachable {
        async fn evaluate(&self, _: &model::Context) -> crate::policy::StageOutcome {
            unreachable!("the schema tests never reach a policy")
        }
    }

    async fn sender(dir: &tempfile::TempDir) -> Sender {
        let url = format!("sqlite://{}?mode=rwc", dir.path().join("t.db").display());
        let store = Store::open(&url, 1, None).await.unwrap();
        let config = Arc::new(Config::default());
        let log = slog::Logger::root(slog::Discard, slog::o!());
        Sender::new(store, Arc::new(crate::provider::Simulator), Arc::new(Unreachable), config, log)
    }

    fn media_body(caption: Option<&str>, message: Option<&str>) -> SendMessageRequest {
        SendMessageRequest {
            instance_id: Some("main".into()),
            phone: Some("+14155550123".into()),
            message_purpose: Some("support".into()),
            message: message.map(str::to_string),
            caption: caption.map(str::to_string),
            media_type: Some("document".into()),
            mime_type: Some("application/pdf".into()),
            file_name: Some("a.pdf".into()),
            media: Some("JVBERi0xLjcK".into()), // "%PDF-1.7\n"
        }
    }

    #[tokio::test]
    async fn caption_overrides_message_as_the_media_caption() {
        let dir = tempfile::tempdir().unwrap();
        let s = sender(&dir).await;
        let both = s.check_schema(&media_body(Some("Invoice 42"), Some("fallback"))).await.unwrap();
        assert_eq!(both.text.as_deref(), Some("Invoice 42"));
        let message_only = s.check_schema(&media_body(None, Some("fallback"))).await.unwrap();
        assert_eq!(message_only.text.as_deref(), Some("fallback"));
        let neither = s.check_schema(&media_body(None, None)).await.unwrap();
        assert_eq!(neither.text, None);
        assert_eq!(neither.message_type(), "document");
    }

    #[tokio::test]
    async fn text_is_capped_and_caption_needs_media() {
        let dir = tempfile::tempdir().unwrap();
        let s = sender(&dir).await;
        let mut body = SendMessageRequest {
            instance_id: Some("main".into()),
            phone: Some("+14155550123".into()),
            message_purpose: Some("support".into()),
            message: Some("x".repeat(MAX_TEXT_CHARS + 1)),
            ..SendMessageRequest::default()
        };
        assert!(matches!(s.check_schema(&body).await, Err(SendError::Validation { field: "message", .. })));
        body.message = Some("x".repeat(MAX_TEXT_CHARS));
        assert!(s.check_schema(&body).await.is_ok());
        body.caption = Some("c".into());
        assert!(matches!(s.check_schema(&body).await, Err(SendError::Validation { field: "caption", .. })));
    }
}

//! Media of a send: base64, a data URL, or an https URL the gateway fetches itself.
//!
//! A leaf module: the send pipeline validates with it and the providers deliver what it
//! holds, and it imports neither (only the configuration's size caps and the network
//! guard). Checked before anything else happens to the send: the MIME type must be one
//! the media type allows; the content (decoded, or fetched through the SSRF guard by
//! [`fetch::Fetcher`]) must fit the size cap of its type and, for the formats with a
//! signature (JPEG, PNG, WebP, PDF, OGG, MP3), start with the signature of its declared
//! MIME type ([`sniff`]); fetched content must not be a web page. Every problem is 422
//! `validation_error` with `details.field` `media` or `mime_type`. The provider always
//! gets the bytes, so no name is resolved twice (the provider never fetches a URL).

pub mod fetch;
pub mod sniff;

use crate::config::MediaLimits;
use base64::Engine;
use gateway_api::MediaType;

pub use fetch::Fetcher;
pub use sniff::mime_allowed;

/// Validated media of a send, with its content.
#[derive(Clone, Debug)]
pub struct Media {
    pub media_type: MediaType,
    pub mime_type: String,
    pub file_name: String,
    /// The content, decoded or fetched.
    pub bytes: Vec<u8>,
    /// Whether the content was fetched from a URL (for the log; the URL is not kept).
    pub fetched: bool,
}

impl Media {
    /// Size of the content in bytes.
    pub fn size(&self) -> usize {
        self.bytes.len()
    }
}

/// A media problem: which field, and why.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{reason}")]
pub struct MediaError {
    pub field: &'static str,
    pub reason: String,
}

pub(crate) fn bad(field: &'static str, reason: impl Into<String>) -> MediaError {
    MediaError { field, reason: reason.into() }
}

/// The size cap of a media type.
pub fn cap(limits: &MediaLimits, media_type: MediaType) -> usize {
    match media_type {
        MediaType::Image => limits.max_image_bytes,
        MediaType::Document => limits.max_document_bytes,
        MediaType::Audio => limits.max_audio_bytes,
    }
}

/// Validates the media fields of a send; a URL is fetched with `fetcher`.
pub async fn validate(
    media_type: MediaType,
    mime_type: &str,
    file_name: &str,
    media: &str,
    limits: &MediaLimits,
    fetcher: &Fetcher,
) -> Result<Media, MediaError> {
    let mime = mime_type.trim().to_ascii_lowercase();
    if !mime_allowed(media_type, &mime) {
        return Err(bad(
            "mime_type",
            format!("{mime_type:?} is not an accepted MIME type for {}", media_type.as_str()),
        ));
    }
    let media = media.trim();
    let cap = cap(limits, media_type);
    let lower_start = media.get(..8).unwrap_or(media).to_ascii_lowercase();
    let fetched = lower_start.starts_with("https://") || lower_start.starts_with("http://");
    let bytes = if fetched {
        let bytes = fetcher.fetch(media, cap).await?;
        if bytes.is_empty() {
            return Err(bad("media", "the media URL gave no content"));
        }
        if sniff::looks_like_markup(&bytes) {
            return Err(bad("media", format!("the media URL gave a web page, not {mime}")));
        }
        bytes
    } else {
        decode(media, &mime, cap)?
    };
    if !sniff::signature_matches(&mime, &bytes) {
        return Err(bad("media", format!("the content is not {mime}")));
    }
    Ok(Media { media_type, mime_type: mime, file_name: file_name.to_string(), bytes, fetched })
}

/// Inline content (base64, or a base64 data URL that agrees with `mime`), decoded and
/// within `cap` bytes.
pub fn decode(media: &str, mime: &str, cap: usize) -> Result<Vec<u8>, MediaError> {
    let encoded = if media.get(..5).is_some_and(|s| s.eq_ignore_ascii_case("data:")) {
        let (header, data) = media[5..].split_once(',').ok_or_else(|| bad("media", "malformed data URL"))?;
        let mut parts = header.split(';');
        let declared = parts.next().unwrap_or("").trim().to_ascii_lowercase();
        if !parts.any(|p| p.trim().eq_ignore_ascii_case("base64")) {
            return Err(bad("media", "data URLs must be base64-encoded"));
        }
        if !declared.is_empty() && declared != mime {
            return Err(bad("mime_type", format!("the data URL says {declared}, mime_type says {mime}")));
        }
        data
    } else {
        media
    };
    decode_base64(encoded, cap)
}

fn decode_base64(encoded: &str, cap: usize) -> Result<Vec<u8>, MediaError> {
    let compact: String = encoded.chars().filter(|c| !c.is_ascii_whitespace()).collect();
    // Refuse by length before decoding: 4 characters carry 3 bytes.
    if compact.len() / 4 * 3 > cap.saturating_add(3) {
        return Err(bad("media", format!("media is larger than {cap} bytes")));
    }
    let engine = base64::engine::GeneralPurpose::new(
        &base64::alphabet::STANDARD,
        base64::engine::GeneralPurposeConfig::new()
            .with_decode_padding_mode(base64::engine::DecodePaddingMode::Indifferent),
    );
    let bytes = engine
        .decode(compact.as_bytes())
        .or_else(|_| base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(compact.trim_end_matches('=')))
        .map_err(|_| bad("media", "media is not valid base64"))?;
    if bytes.is_empty() {
        return Err(bad("media", "media is empty"));
    }
    if bytes.len() > cap {
        return Err(bad("media", format!("media is larger than {cap} bytes")));
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests;

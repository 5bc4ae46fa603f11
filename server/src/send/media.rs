//! Media of a send: base64, a data URL, or an https URL the provider fetches.
//!
//! Checked before anything else happens to the send: the MIME type must be one the
//! media type allows; inline content must decode, fit the size cap of its type, and
//! (for the formats with a signature: JPEG, PNG, WebP, PDF, OGG, MP3) start with the
//! signature of its declared MIME type; a URL must pass the SSRF guard. Every problem is
//! 422 `validation_error` with `details.field` `media` or `mime_type`.

use crate::config::MediaLimits;
use crate::net::ssrf;
use base64::Engine;
use gateway_api::MediaType;

/// Where the provider gets the media from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MediaSource {
    /// Decoded bytes.
    Inline(Vec<u8>),
    /// An https URL that passed the SSRF guard.
    Url(String),
}

/// Validated media of a send.
#[derive(Clone, Debug)]
pub struct Media {
    pub media_type: MediaType,
    pub mime_type: String,
    pub file_name: String,
    pub source: MediaSource,
}

impl Media {
    /// Decoded size, when known.
    pub fn size(&self) -> Option<usize> {
        match &self.source {
            MediaSource::Inline(b) => Some(b.len()),
            MediaSource::Url(_) => None,
        }
    }
}

/// A media problem: which field, and why.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{reason}")]
pub struct MediaError {
    pub field: &'static str,
    pub reason: String,
}

fn bad(field: &'static str, reason: impl Into<String>) -> MediaError {
    MediaError { field, reason: reason.into() }
}

/// MIME types each media type accepts.
pub fn mime_allowed(media_type: MediaType, mime: &str) -> bool {
    match media_type {
        MediaType::Image => matches!(mime, "image/jpeg" | "image/png" | "image/webp"),
        MediaType::Audio => matches!(
            mime,
            "audio/aac"
                | "audio/mp4"
                | "audio/mpeg"
                | "audio/amr"
                | "audio/ogg"
                | "audio/opus"
                | "audio/wav"
                | "audio/webm"
        ),
        MediaType::Document => {
            matches!(
                mime,
                "application/pdf"
                    | "text/plain"
                    | "text/csv"
                    | "application/msword"
                    | "application/vnd.ms-excel"
                    | "application/vnd.ms-powerpoint"
                    | "application/rtf"
                    | "application/zip"
                    | "application/json"
                    | "application/xml"
            ) || mime.starts_with("application/vnd.openxmlformats-officedocument.")
                || mime.starts_with("application/vnd.oasis.opendocument.")
        }
    }
}

fn cap(limits: &MediaLimits, media_type: MediaType) -> usize {
    match media_type {
        MediaType::Image => limits.max_image_bytes,
        MediaType::Document => limits.max_document_bytes,
        MediaType::Audio => limits.max_audio_bytes,
    }
}

/// Whether content that has a recognisable signature matches `mime`. Content of
/// formats without one (text, CSV, AAC, ...) passes.
fn signature_matches(mime: &str, bytes: &[u8]) -> bool {
    let starts = |sig: &[u8]| bytes.starts_with(sig);
    match mime {
        "image/jpeg" => starts(&[0xFF, 0xD8, 0xFF]),
        "image/png" => starts(b"\x89PNG\r\n\x1a\n"),
        "image/webp" => starts(b"RIFF") && bytes.get(8..12) == Some(b"WEBP"),
        "application/pdf" => starts(b"%PDF-"),
        "audio/ogg" | "audio/opus" => starts(b"OggS"),
        "audio/mpeg" => starts(b"ID3") || (bytes.len() > 1 && bytes[0] == 0xFF && bytes[1] & 0xE0 == 0xE0),
        _ => true,
    }
}

/// Validates the media fields of a send. `url_check` resolves and guards URLs.
pub async fn validate(
    media_type: MediaType,
    mime_type: &str,
    file_name: &str,
    media: &str,
    limits: &MediaLimits,
    allow_loopback: bool,
) -> Result<Media, MediaError> {
    let mime = mime_type.trim().to_ascii_lowercase();
    if !mime_allowed(media_type, &mime) {
        return Err(bad(
            "mime_type",
            format!("{mime_type:?} is not an accepted MIME type for {}", media_type.as_str()),
        ));
    }
    let media = media.trim();
    let lower_start = media.get(..8).unwrap_or(media).to_ascii_lowercase();
    let source = if lower_start.starts_with("https://") || lower_start.starts_with("http://") {
        let (url, _) = ssrf::resolve(media, allow_loopback).await.map_err(|e| bad("media", e.to_string()))?;
        MediaSource::Url(url.to_string())
    } else {
        let encoded = if lower_start.starts_with("data:") {
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
        let bytes = decode_base64(encoded, cap(limits, media_type))?;
        if !signature_matches(&mime, &bytes) {
            return Err(bad("media", format!("the content is not {mime}")));
        }
        MediaSource::Inline(bytes)
    };
    Ok(Media { media_type, mime_type: mime, file_name: file_name.to_string(), source })
}

fn decode_base64(encoded: &str, cap: usize) -> Result<Vec<u8>, MediaError> {
    let compact: String = encoded.chars().filter(|c| !c.is_ascii_whitespace()).collect();
    // Refuse by length before decoding: 4 characters carry 3 bytes.
    if compact.len() / 4 * 3 > cap + 3 {
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
mod tests {
    use super::*;
    use base64::engine::general_purpose::STANDARD;

    const PNG: &[u8] = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR";

    async fn check(t: MediaType, mime: &str, media: &str) -> Result<Media, MediaError> {
        validate(t, mime, "f", media, &MediaLimits::default(), false).await
    }

    #[tokio::test]
    async fn inline_forms() {
        let b64 = STANDARD.encode(PNG);
        let m = check(MediaType::Image, "image/png", &b64).await.unwrap();
        assert_eq!(m.source, MediaSource::Inline(PNG.to_vec()));
        let data_url = format!("data:image/png;base64,{b64}");
        assert_eq!(check(MediaType::Image, "image/png", &data_url).await.unwrap().size(), Some(PNG.len()));
        let pdf = STANDARD.encode(b"%PDF-1.7 ...");
        assert!(check(MediaType::Document, "application/pdf", &pdf).await.is_ok());
    }

    #[tokio::test]
    async fn problems_name_their_field() {
        let png = STANDARD.encode(PNG);
        assert_eq!(check(MediaType::Image, "application/pdf", &png).await.unwrap_err().field, "mime_type");
        assert_eq!(check(MediaType::Audio, "image/png", &png).await.unwrap_err().field, "mime_type");
        assert_eq!(check(MediaType::Image, "image/png", "%%%not base64%%%").await.unwrap_err().field, "media");
        assert_eq!(check(MediaType::Image, "image/jpeg", &png).await.unwrap_err().field, "media");
        let mismatched_url = format!("data:image/jpeg;base64,{png}");
        assert_eq!(check(MediaType::Image, "image/png", &mismatched_url).await.unwrap_err().field, "mime_type");
        assert_eq!(check(MediaType::Image, "image/png", "data:image/png,raw").await.unwrap_err().field, "media");
        assert_eq!(check(MediaType::Image, "image/png", "http://example.com/a.png").await.unwrap_err().field, "media");
        assert_eq!(check(MediaType::Image, "image/png", "https://127.0.0.1/a.png").await.unwrap_err().field, "media");
    }

    #[tokio::test]
    async fn size_cap_applies_to_decoded_bytes() {
        let limits = MediaLimits { max_image_bytes: 16, ..MediaLimits::default() };
        let mut big = PNG.to_vec();
        big.resize(17, 0);
        let e = validate(MediaType::Image, "image/png", "a.png", &STANDARD.encode(&big), &limits, false).await;
        assert!(e.unwrap_err().reason.contains("larger than 16"));
        big.truncate(16);
        assert!(validate(MediaType::Image, "image/png", "a.png", &STANDARD.encode(&big), &limits, false).await.is_ok());
    }
}

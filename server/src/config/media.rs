//! `[media]`: decoded size caps per media type and the fetch timeout.

use serde::Deserialize;

/// Decoded size caps per media type.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MediaLimits {
    pub max_image_bytes: usize,
    pub max_document_bytes: usize,
    pub max_audio_bytes: usize,
    /// How long fetching a media URL may take in all (redirects included).
    pub fetch_timeout_ms: u64,
}

impl Default for MediaLimits {
    fn default() -> Self {
        MediaLimits {
            max_image_bytes: 5 * 1024 * 1024,
            max_document_bytes: 16 * 1024 * 1024,
            max_audio_bytes: 16 * 1024 * 1024,
            fetch_timeout_ms: 10_000,
        }
    }
}

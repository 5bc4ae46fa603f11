//! What media content is: which MIME types each media type accepts, and whether bytes
//! carry the signature of their declared type. Pure: used on inline content and on
//! what the gateway fetched, and by the fuzz targets.

use gateway_api::MediaType;

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

/// Whether content that has a recognisable signature matches `mime`. Content of
/// formats without one (text, CSV, AAC, ...) passes.
pub fn signature_matches(mime: &str, bytes: &[u8]) -> bool {
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

/// Whether fetched bytes look like a web page (an error or login page a server sent
/// instead of the file): refused for every declared type, even those without a
/// signature (text, CSV), where a page would otherwise pass.
pub fn looks_like_markup(bytes: &[u8]) -> bool {
    let head = &bytes[..bytes.len().min(512)];
    let text = String::from_utf8_lossy(head);
    let start = text.trim_start_matches(['\u{feff}', ' ', '\t', '\r', '\n']).to_ascii_lowercase();
    ["<!doctype html", "<html", "<head", "<body", "<script", "<?xml-stylesheet"].iter().any(|p| start.starts_with(p))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signatures_and_pages() {
        assert!(signature_matches("image/png", b"\x89PNG\r\n\x1a\n\0"));
        assert!(!signature_matches("image/png", b"\xFF\xD8\xFF"));
        assert!(signature_matches("image/webp", b"RIFF\0\0\0\0WEBPVP8 "));
        assert!(!signature_matches("image/webp", b"RIFF\0\0"));
        assert!(signature_matches("text/plain", b"anything"));
        assert!(looks_like_markup(b"\n  <!DOCTYPE html><html>"));
        assert!(looks_like_markup(b"\xef\xbb\xbf<HTML>"));
        assert!(!looks_like_markup(b"name,phone\n"));
        assert!(!looks_like_markup(b""));
    }
}

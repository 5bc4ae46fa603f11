//! Media decoding (base64, data URLs) and sniffing: any input decodes within the cap or
//! is refused with a field; the sniffers read any bytes.
#![no_main]
use gateway_server::media::{decode, sniff};
use libfuzzer_sys::fuzz_target;

const MIMES: [&str; 6] = ["image/png", "image/jpeg", "image/webp", "application/pdf", "audio/ogg", "text/plain"];

fuzz_target!(|data: &[u8]| {
    let Some((&selector, rest)) = data.split_first() else { return };
    let mime = MIMES[selector as usize % MIMES.len()];
    let cap = 1 + (selector as usize % 64) * 17;
    let _ = sniff::signature_matches(mime, rest);
    let _ = sniff::looks_like_markup(rest);
    let Ok(text) = std::str::from_utf8(rest) else { return };
    match decode(text, mime, cap) {
        Ok(bytes) => assert!(!bytes.is_empty() && bytes.len() <= cap, "{} bytes, cap {cap}", bytes.len()),
        Err(e) => assert!(e.field == "media" || e.field == "mime_type", "{}", e.field),
    }
});

//! The customer-webhook signature check of the client (`X-Gateway-Signature`, a list of
//! `sha256=<hex>`): any header is refused or verified, never a panic.
#![no_main]
use libfuzzer_sys::fuzz_target;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let mut parts = text.splitn(3, '\n');
    let (Some(timestamp), Some(header), body) = (parts.next(), parts.next(), parts.next().unwrap_or("")) else {
        return;
    };
    let now = UNIX_EPOCH + Duration::from_secs(1_764_000_000);
    let verified = gateway_client::verify_signature_at(
        "whsec_fuzz",
        timestamp,
        body.as_bytes(),
        header,
        Duration::from_secs(300),
        now,
    );
    if verified.is_ok() {
        // Over the number the timestamp names: the header without surrounding whitespace.
        let expected = gateway_client::sign_for_tests("whsec_fuzz", timestamp.trim(), body.as_bytes());
        // Hex is read in either case.
        assert!(header.to_ascii_lowercase().contains(&expected), "verified without the signature");
    }
    let _ = SystemTime::now();
});

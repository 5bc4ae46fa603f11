//! The PBX signature headers (`X-Gateway-Timestamp`, `X-Gateway-Signature`): any header
//! values are refused or verified, never a panic; what verifies is the HMAC of them.
#![no_main]
use gateway_server::pbx::auth::{SIGNATURE_HEADER, TIMESTAMP_HEADER, check_signature, sign};
use libfuzzer_sys::fuzz_target;

const NOW: i64 = 1_764_000_000;

fuzz_target!(|data: &[u8]| {
    let mut parts = data.splitn(3, |b| *b == b'\n');
    let (Some(timestamp), Some(signature), body) = (parts.next(), parts.next(), parts.next().unwrap_or(b"")) else {
        return;
    };
    let mut headers = http::HeaderMap::new();
    for (name, value) in [(TIMESTAMP_HEADER, timestamp), (SIGNATURE_HEADER, signature)] {
        if let Ok(value) = http::HeaderValue::from_bytes(value) {
            headers.insert(name, value);
        }
    }
    if let Ok((hex, seconds)) = check_signature(&headers, "pbxsig_fuzz", body, NOW) {
        assert!((NOW - seconds).abs() <= 300);
        assert_eq!(hex, sign("pbxsig_fuzz", &seconds.to_string(), body));
    }
});

//! Verifying the gateway's webhook deliveries.
//!
//! A delivery carries `X-Gateway-Timestamp` (Unix seconds) and, when the endpoint has a
//! signing secret, `X-Gateway-Signature: sha256=<hex>`, where hex is HMAC-SHA256 of
//! the timestamp, a dot and the raw body, keyed with the secret. While a secret is
//! being rotated the header carries both, new first: `sha256=<new>,sha256=<old>`.
//!
//! A receiver, in outline (any HTTP framework; verify the raw body bytes before any
//! JSON parsing):
//!
//! ```
//! use gateway_client::{events, verify_signature};
//! use std::time::Duration;
//!
//! /// Called with the three headers and the raw body of a delivery.
//! fn receive(secret: &str, timestamp: &str, signature: &str, event: &str, raw_body: &[u8]) -> Result<(), String> {
//!     // Not from the gateway (or too old): answer 401 and stop.
//!     verify_signature(secret, timestamp, raw_body, signature, Duration::from_secs(300)).map_err(|e| e.to_string())?;
//!     // X-Gateway-Event-Id is the same on every retry of one event: skip ids already seen.
//!     if event == "message.sent" {
//!         let sent: events::MessageSent = serde_json::from_slice(raw_body).map_err(|e| e.to_string())?;
//!         println!("{} went to {}", sent.message_id.unwrap_or_default(), sent.to);
//!     }
//!     Ok(()) // answer 2xx within 15 s; anything else is retried
//! }
//! # let ts = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs().to_string();
//! # let body = br#"{"event":"message.sent","instance_id":"ins_1","instance_name":"main","timestamp":"2026-11-21T10:00:00Z","to":"+14155550123","message_purpose":"support","message_id":"SIM1"}"#;
//! # let signature = format!("sha256={}", gateway_client::sign_for_tests("whsec_test", &ts, body));
//! # receive("whsec_test", &ts, &signature, "message.sent", body).unwrap();
//! # assert!(receive("whsec_other", &ts, &signature, "message.sent", body).is_err());
//! ```

use hmac::{Hmac, Mac};
use sha2::Sha256;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Why a delivery did not verify.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SignatureError {
    /// The timestamp header is missing or not Unix seconds.
    BadTimestamp,
    /// The timestamp is further from now than the tolerance.
    OutsideTolerance,
    /// No `sha256=<hex>` value in the signature header.
    NoSignature,
    /// No signature matched.
    Mismatch,
}

impl std::fmt::Display for SignatureError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            SignatureError::BadTimestamp => "the timestamp header is missing or malformed",
            SignatureError::OutsideTolerance => "the timestamp is outside the tolerance",
            SignatureError::NoSignature => "no sha256 signature in the header",
            SignatureError::Mismatch => "no signature matches",
        })
    }
}

impl std::error::Error for SignatureError {}

/// Checks a delivery: `timestamp` within `tolerance` of now (either way), and one of
/// the `sha256=<hex>` values of `header` (comma- or space-separated) the HMAC-SHA256 of
/// `timestamp.body` under `secret`. Comparison is constant-time.
pub fn verify_signature(
    secret: &str,
    timestamp: &str,
    body: &[u8],
    header: &str,
    tolerance: Duration,
) -> Result<(), SignatureError> {
    verify_signature_at(secret, timestamp, body, header, tolerance, SystemTime::now())
}

/// [`verify_signature`] at a given time (for tests).
pub fn verify_signature_at(
    secret: &str,
    timestamp: &str,
    body: &[u8],
    header: &str,
    tolerance: Duration,
    now: SystemTime,
) -> Result<(), SignatureError> {
    let ts = timestamp.trim();
    if ts.is_empty() || !ts.bytes().all(|b| b.is_ascii_digit()) || ts.len() > 12 {
        return Err(SignatureError::BadTimestamp);
    }
    let seconds: u64 = ts.parse().map_err(|_| SignatureError::BadTimestamp)?;
    let now = now.duration_since(UNIX_EPOCH).map_err(|_| SignatureError::OutsideTolerance)?.as_secs();
    if now.abs_diff(seconds) > tolerance.as_secs() {
        return Err(SignatureError::OutsideTolerance);
    }
    let candidates: Vec<Vec<u8>> = header
        .split([',', ' '])
        .filter_map(|part| part.trim().strip_prefix("sha256="))
        .filter_map(|hex_part| hex::decode(hex_part).ok())
        .collect();
    if candidates.is_empty() {
        return Err(SignatureError::NoSignature);
    }
    let mut matched = false;
    for candidate in &candidates {
        let mut mac = Hmac::<Sha256>::new_from_slice(secret.as_bytes()).expect("any key length");
        mac.update(ts.as_bytes());
        mac.update(b".");
        mac.update(body);
        // verify_slice compares in constant time; every candidate is checked.
        matched |= mac.verify_slice(candidate).is_ok();
    }
    if matched { Ok(()) } else { Err(SignatureError::Mismatch) }
}

#[doc(hidden)]
/// Hex HMAC-SHA256 of `timestamp.body` (for doc examples and tests).
pub fn sign_for_tests(secret: &str, timestamp: &str, body: &[u8]) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret.as_bytes()).expect("any key length");
    mac.update(timestamp.as_bytes());
    mac.update(b".");
    mac.update(body);
    hex::encode(mac.finalize().into_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(seconds: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(seconds)
    }

    #[test]
    fn verifies_one_or_several_signatures_within_tolerance() {
        let body = br#"{"event":"message.sent"}"#;
        let ts = "1800000000";
        let good = "sha256=".to_string() + &sign_for_tests("whsec_a", ts, body);
        let old = "sha256=".to_string() + &sign_for_tests("whsec_old", ts, body);
        let t = Duration::from_secs(300);
        assert_eq!(verify_signature_at("whsec_a", ts, body, &good, t, at(1_800_000_000)), Ok(()));
        assert_eq!(verify_signature_at("whsec_a", ts, body, &format!("{good},{old}"), t, at(1_800_000_300)), Ok(()));
        assert_eq!(verify_signature_at("whsec_old", ts, body, &format!("{good}, {old}"), t, at(1_799_999_700)), Ok(()));
        let stale = verify_signature_at("whsec_a", ts, body, &good, t, at(1_800_000_301));
        assert_eq!(stale, Err(SignatureError::OutsideTolerance));
        assert_eq!(
            verify_signature_at("whsec_b", ts, body, &good, t, at(1_800_000_000)),
            Err(SignatureError::Mismatch)
        );
        let other_body = verify_signature_at("whsec_a", ts, b"{}", &good, t, at(1_800_000_000));
        assert_eq!(other_body, Err(SignatureError::Mismatch));
        assert_eq!(verify_signature_at("whsec_a", "", body, &good, t, at(0)), Err(SignatureError::BadTimestamp));
        assert_eq!(
            verify_signature_at("whsec_a", ts, body, "v1=abc", t, at(1_800_000_000)),
            Err(SignatureError::NoSignature)
        );
    }

    /// The timestamp header is read as HTTP gives it, without surrounding whitespace:
    /// the signature is over the number it names, as the gateway signed it (fuzzing found
    /// a padded header verified, which is right; `fuzz/corpus/webhook_signature/padded`).
    #[test]
    fn a_padded_timestamp_is_the_number_it_names() {
        let body = br#"{"event":"message.sent"}"#;
        let t = Duration::from_secs(300);
        let signed = "sha256=".to_string() + &sign_for_tests("whsec_a", "1800000000", body);
        assert_eq!(verify_signature_at("whsec_a", " 1800000000 ", body, &signed, t, at(1_800_000_000)), Ok(()));
        let padded = "sha256=".to_string() + &sign_for_tests("whsec_a", " 1800000000", body);
        let refused = verify_signature_at("whsec_a", " 1800000000", body, &padded, t, at(1_800_000_000));
        assert_eq!(refused, Err(SignatureError::Mismatch));
    }

    #[test]
    fn matches_an_independent_hmac() {
        // python3 -c 'import hmac,hashlib; print(hmac.new(b"whsec_test", b"1700000000.{}", hashlib.sha256).hexdigest())'
        assert_eq!(
            sign_for_tests("whsec_test", "1700000000", b"{}"),
            "35495024f4ef3f94e5a93e22221544c4b75e9a42300cd965ab81cb85cd994e91"
        );
    }
}

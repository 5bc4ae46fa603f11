//! Authentication of PBX webhook requests: the secret header, the optional HMAC
//! signature with its timestamp, and the optional IP allowlist.
//!
//! Every failure is one generic 401 for the caller; [`AuthFailure`] says which for the
//! log. Secrets are compared in constant time (the stored SHA-256 of the webhook secret
//! against the SHA-256 of the presented one; the signature with `Mac::verify_slice`).

use crate::apikey;
use hmac::{Hmac, Mac};
use http::HeaderMap;
use sha2::{Digest, Sha256};
use std::net::IpAddr;
use subtle::ConstantTimeEq;

/// Header with the integration's webhook secret.
pub const SECRET_HEADER: &str = "x-gateway-3cx-secret";
/// Header with the Unix timestamp (seconds) the signature covers.
pub const TIMESTAMP_HEADER: &str = "x-gateway-timestamp";
/// Header with the signature: `sha256=<hex>` or `<hex>`.
pub const SIGNATURE_HEADER: &str = "x-gateway-signature";
/// How far the timestamp may be from the gateway's clock, either way.
pub const TOLERANCE_SECONDS: i64 = 300;
// A replay passes the timestamp check only within TOLERANCE of its timestamp; a signature
// remembered (store::SIGNATURE_MEMORY_SECONDS) twice that long outlives every request
// that could replay it, with as long again for clocks that differ.
const _: () = assert!(crate::store::SIGNATURE_MEMORY_SECONDS >= 2 * TOLERANCE_SECONDS);

const WEBHOOK_SECRET_PREFIX: &str = "pbx_";
const SIGNING_SECRET_PREFIX: &str = "pbxsig_";
const SECRET_CHARS: usize = 43;

/// Why a request was not authenticated (for the log only).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AuthFailure {
    MalformedId,
    UnknownIntegration,
    AddressNotAllowed,
    MissingSecret,
    WrongSecret,
    MissingTimestamp,
    BadTimestamp,
    StaleTimestamp,
    MissingSignature,
    BadSignature,
    ReplayedSignature,
}

impl AuthFailure {
    /// The cause as logged.
    pub fn as_str(self) -> &'static str {
        match self {
            AuthFailure::MalformedId => "malformed_integration_id",
            AuthFailure::UnknownIntegration => "unknown_integration",
            AuthFailure::AddressNotAllowed => "address_not_allowed",
            AuthFailure::MissingSecret => "missing_secret",
            AuthFailure::WrongSecret => "wrong_secret",
            AuthFailure::MissingTimestamp => "missing_timestamp",
            AuthFailure::BadTimestamp => "malformed_timestamp",
            AuthFailure::StaleTimestamp => "timestamp_outside_window",
            AuthFailure::MissingSignature => "missing_signature",
            AuthFailure::BadSignature => "bad_signature",
            AuthFailure::ReplayedSignature => "replayed_signature",
        }
    }
}

/// A new webhook secret (shown once) and the hash and prefix that are stored.
pub struct NewSecret {
    pub plaintext: String,
    pub hash: String,
    pub prefix: String,
}

/// Generates a webhook secret: `pbx_` and 43 base62 characters (256 bits).
pub fn new_webhook_secret() -> NewSecret {
    let plaintext = format!("{WEBHOOK_SECRET_PREFIX}{}", apikey::random_base62(SECRET_CHARS));
    NewSecret { hash: hash_secret(&plaintext), prefix: plaintext[..10].to_string(), plaintext }
}

/// Generates an HMAC signing key: `pbxsig_` and 43 base62 characters.
pub fn new_signing_secret() -> String {
    format!("{SIGNING_SECRET_PREFIX}{}", apikey::random_base62(SECRET_CHARS))
}

/// Hex SHA-256 of a webhook secret, as stored.
pub fn hash_secret(secret: &str) -> String {
    hex::encode(Sha256::digest(secret.as_bytes()))
}

/// The one value of a header, as text; `None` when absent, repeated or not text.
fn single(headers: &HeaderMap, name: &str) -> Option<String> {
    let mut values = headers.get_all(name).iter();
    match (values.next(), values.next()) {
        (Some(v), None) => v.to_str().ok().map(|s| s.trim().to_string()),
        _ => None,
    }
}

/// Checks the secret header against the stored hash.
pub fn check_secret(headers: &HeaderMap, stored_hash: &str) -> Result<(), AuthFailure> {
    let presented = single(headers, SECRET_HEADER).filter(|s| !s.is_empty()).ok_or(AuthFailure::MissingSecret)?;
    let presented = hash_secret(&presented);
    if bool::from(presented.as_bytes().ct_eq(stored_hash.as_bytes())) { Ok(()) } else { Err(AuthFailure::WrongSecret) }
}

/// Hex HMAC-SHA256 of `timestamp + "." + body` under `key`.
pub fn sign(key: &str, timestamp: &str, body: &[u8]) -> String {
    hex::encode(mac(key, timestamp, body).finalize().into_bytes())
}

fn mac(key: &str, timestamp: &str, body: &[u8]) -> Hmac<Sha256> {
    let mut mac = Hmac::<Sha256>::new_from_slice(key.as_bytes()).expect("HMAC takes a key of any length");
    mac.update(timestamp.as_bytes());
    mac.update(b".");
    mac.update(body);
    mac
}

/// Checks timestamp and signature when HMAC signing is configured; returns the
/// verified signature (lower-case hex) and its timestamp, to remember for the replay
/// check.
pub fn check_signature(
    headers: &HeaderMap,
    key: &str,
    body: &[u8],
    now_seconds: i64,
) -> Result<(String, i64), AuthFailure> {
    let timestamp = single(headers, TIMESTAMP_HEADER).filter(|s| !s.is_empty()).ok_or(AuthFailure::MissingTimestamp)?;
    if timestamp.is_empty() || timestamp.len() > 12 || !timestamp.bytes().all(|b| b.is_ascii_digit()) {
        return Err(AuthFailure::BadTimestamp);
    }
    let seconds: i64 = timestamp.parse().map_err(|_| AuthFailure::BadTimestamp)?;
    if (now_seconds - seconds).abs() > TOLERANCE_SECONDS {
        return Err(AuthFailure::StaleTimestamp);
    }
    let header = single(headers, SIGNATURE_HEADER).filter(|s| !s.is_empty()).ok_or(AuthFailure::MissingSignature)?;
    let hex_part = match header.split_once('=') {
        Some((scheme, value)) if scheme.trim().eq_ignore_ascii_case("sha256") => value.trim(),
        Some(_) => return Err(AuthFailure::BadSignature),
        None => header.as_str(),
    };
    let presented = hex::decode(hex_part).map_err(|_| AuthFailure::BadSignature)?;
    mac(key, &timestamp, body).verify_slice(&presented).map_err(|_| AuthFailure::BadSignature)?;
    Ok((hex::encode(presented), seconds))
}

/// Parses an allowlist of addresses and CIDR blocks separated by commas or spaces.
pub fn parse_allowlist(list: &str) -> Result<Vec<ipnet::IpNet>, String> {
    list.split([',', ' '])
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|entry| {
            entry
                .parse::<ipnet::IpNet>()
                .or_else(|_| entry.parse::<IpAddr>().map(ipnet::IpNet::from))
                .map_err(|_| format!("{entry:?} is not an IP address or CIDR block"))
        })
        .collect()
}

/// Whether `addr` may call an integration with this allowlist (`None`: anyone). An
/// IPv4-mapped IPv6 peer is matched as its IPv4 address.
pub fn allowed(list: Option<&str>, addr: IpAddr) -> bool {
    let Some(list) = list.filter(|l| !l.trim().is_empty()) else {
        return true;
    };
    let addr = match addr {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(addr, IpAddr::V4),
        v4 => v4,
    };
    // A list that no longer parses admits no one rather than everyone.
    parse_allowlist(list).is_ok_and(|nets| nets.iter().any(|n| n.contains(&addr)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(http::HeaderName::from_bytes(k.as_bytes()).unwrap(), HeaderValue::from_str(v).unwrap());
        }
        h
    }

    #[test]
    fn secrets_are_compared_by_hash() {
        let s = new_webhook_secret();
        assert!(s.plaintext.starts_with("pbx_") && s.plaintext.len() == 47);
        assert_eq!(check_secret(&headers(&[(SECRET_HEADER, &s.plaintext)]), &s.hash), Ok(()));
        assert_eq!(check_secret(&headers(&[(SECRET_HEADER, "pbx_wrong")]), &s.hash), Err(AuthFailure::WrongSecret));
        assert_eq!(check_secret(&headers(&[]), &s.hash), Err(AuthFailure::MissingSecret));
        let twice = headers(&[(SECRET_HEADER, &s.plaintext), (SECRET_HEADER, &s.plaintext)]);
        assert_eq!(check_secret(&twice, &s.hash), Err(AuthFailure::MissingSecret));
    }

    /// A value computed independently (Python: `hmac.new(key, b"1700000000." + body,
    /// hashlib.sha256).hexdigest()`).
    #[test]
    fn signature_is_hmac_sha256_of_timestamp_dot_body() {
        let expected = "8eee3c0ef3d51f76b2f7a10e0ef292e4e0a0c65d6d2076d9ae6085cb3c4f3636";
        assert_eq!(sign("pbxsig_test", "1700000000", br#"{"event_type":"test"}"#), expected);
    }

    #[test]
    fn signature_forms_window_and_failures() {
        let body = br#"{"event_type":"test"}"#;
        let now = 1_800_000_000;
        let ts = now.to_string();
        let sig = sign("key", &ts, body);
        let check = |pairs: &[(&str, &str)], now: i64| check_signature(&headers(pairs), "key", body, now);
        let prefixed = format!("sha256={sig}");
        assert_eq!(check(&[(TIMESTAMP_HEADER, &ts), (SIGNATURE_HEADER, &prefixed)], now), Ok((sig.clone(), now)));
        assert_eq!(check(&[(TIMESTAMP_HEADER, &ts), (SIGNATURE_HEADER, &sig)], now), Ok((sig.clone(), now)));
        let upper = sig.to_uppercase();
        assert_eq!(check(&[(TIMESTAMP_HEADER, &ts), (SIGNATURE_HEADER, &upper)], now), Ok((sig.clone(), now)));
        assert_eq!(check(&[(TIMESTAMP_HEADER, &ts), (SIGNATURE_HEADER, &sig)], now + 300), Ok((sig.clone(), now)));
        assert_eq!(check(&[(TIMESTAMP_HEADER, &ts), (SIGNATURE_HEADER, &sig)], now - 300), Ok((sig.clone(), now)));
        let stale = Err(AuthFailure::StaleTimestamp);
        assert_eq!(check(&[(TIMESTAMP_HEADER, &ts), (SIGNATURE_HEADER, &sig)], now + 301), stale);
        assert_eq!(check(&[(TIMESTAMP_HEADER, &ts), (SIGNATURE_HEADER, &sig)], now - 301), stale);
        assert_eq!(check(&[(SIGNATURE_HEADER, &sig)], now), Err(AuthFailure::MissingTimestamp));
        assert_eq!(check(&[(TIMESTAMP_HEADER, &ts)], now), Err(AuthFailure::MissingSignature));
        assert_eq!(check(&[(TIMESTAMP_HEADER, "-5"), (SIGNATURE_HEADER, &sig)], now), Err(AuthFailure::BadTimestamp));
        assert_eq!(
            check(&[(TIMESTAMP_HEADER, &ts), (SIGNATURE_HEADER, "sha1=00")], now),
            Err(AuthFailure::BadSignature)
        );
        assert_eq!(check(&[(TIMESTAMP_HEADER, &ts), (SIGNATURE_HEADER, "zz")], now), Err(AuthFailure::BadSignature));
        let other = sign("other key", &ts, body);
        assert_eq!(check(&[(TIMESTAMP_HEADER, &ts), (SIGNATURE_HEADER, &other)], now), Err(AuthFailure::BadSignature));
        // The signature covers the timestamp: the same signature with another one fails.
        let later = (now + 1).to_string();
        assert_eq!(check(&[(TIMESTAMP_HEADER, &later), (SIGNATURE_HEADER, &sig)], now), Err(AuthFailure::BadSignature));
    }

    #[test]
    fn allowlist_matches_addresses_and_blocks() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        assert!(allowed(None, ip("127.0.0.1")));
        assert!(allowed(Some(""), ip("127.0.0.1")));
        assert!(allowed(Some("127.0.0.1"), ip("127.0.0.1")));
        assert!(allowed(Some("10.0.0.0/8, 127.0.0.0/8"), ip("127.5.6.7")));
        assert!(allowed(Some("127.0.0.1"), ip("::ffff:127.0.0.1")));
        assert!(allowed(Some("::1"), ip("::1")));
        assert!(!allowed(Some("10.0.0.0/8"), ip("127.0.0.1")));
        assert!(!allowed(Some("not-an-ip"), ip("127.0.0.1")));
        assert!(parse_allowlist("10.0.0.0/33").is_err());
        assert_eq!(parse_allowlist("10.0.0.1 192.0.2.0/24").unwrap().len(), 2);
    }
}

//! TOTP (RFC 6238): HMAC-SHA1, 6 digits, 30-second steps, one step of clock skew
//! either way. SHA-1 because it is what every authenticator app implements (some
//! silently fall back to it, which would make a SHA-256 seed fail there).
//!
//! A code is accepted once: [`verify`] returns the step it matched and the caller
//! stores it, refusing any step not later than the last accepted one (ASVS 6.5.1).
//! Seeds are 160 random bits (RFC 4226's recommendation), shown base32 (RFC 4648).

use hmac::{Hmac, Mac};
use rand::RngCore;
use sha1::Sha1;
use subtle::ConstantTimeEq;

/// Length of a step in seconds.
pub const STEP_SECONDS: i64 = 30;
/// Digits of a code.
pub const DIGITS: usize = 6;
/// Steps accepted before and after the current one.
pub const SKEW: i64 = 1;

const BASE32: &[u8; 32] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";

/// A new seed, base32 without padding (32 characters).
pub fn new_secret() -> String {
    let mut bytes = [0u8; 20];
    rand::rngs::OsRng.fill_bytes(&mut bytes);
    base32_encode(&bytes)
}

/// RFC 4648 base32, no padding.
pub fn base32_encode(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len().div_ceil(5) * 8);
    let (mut buffer, mut bits) = (0u32, 0u32);
    for &b in bytes {
        buffer = (buffer << 8) | u32::from(b);
        bits += 8;
        while bits >= 5 {
            out.push(BASE32[((buffer >> (bits - 5)) & 31) as usize] as char);
            bits -= 5;
        }
    }
    if bits > 0 {
        out.push(BASE32[((buffer << (5 - bits)) & 31) as usize] as char);
    }
    out
}

/// RFC 4648 base32 (case, spaces and padding ignored); None on another character.
pub fn base32_decode(text: &str) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(text.len() * 5 / 8);
    let (mut buffer, mut bits) = (0u32, 0u32);
    for c in text.chars().filter(|c| !c.is_whitespace() && *c != '=') {
        let value = BASE32.iter().position(|&b| b as char == c.to_ascii_uppercase())? as u32;
        buffer = (buffer << 5) | value;
        bits += 5;
        if bits >= 8 {
            out.push((buffer >> (bits - 8)) as u8);
            bits -= 8;
        }
    }
    Some(out)
}

/// The step of a Unix time.
pub fn step_of(unix_seconds: i64) -> i64 {
    unix_seconds.div_euclid(STEP_SECONDS)
}

/// The code of a step (HOTP of the step counter, RFC 4226 dynamic truncation).
pub fn code_at(key: &[u8], step: i64) -> String {
    let mut mac = Hmac::<Sha1>::new_from_slice(key).expect("HMAC takes any key length");
    mac.update(&(step as u64).to_be_bytes());
    let digest = mac.finalize().into_bytes();
    let offset = (digest[19] & 0x0f) as usize;
    let number =
        u32::from_be_bytes([digest[offset] & 0x7f, digest[offset + 1], digest[offset + 2], digest[offset + 3]]);
    format!("{:0width$}", number % 10u32.pow(DIGITS as u32), width = DIGITS)
}

/// The step whose code `code` is, within ±[`SKEW`] of `unix_seconds`, if any and if it
/// is later than `last_step`. Every candidate is compared (in constant time), so the
/// time taken does not say which one matched.
pub fn verify(secret_b32: &str, code: &str, unix_seconds: i64, last_step: Option<i64>) -> Option<i64> {
    let code: String = code.chars().filter(|c| !c.is_whitespace()).collect();
    if code.len() != DIGITS || !code.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let key = base32_decode(secret_b32)?;
    let now = step_of(unix_seconds);
    let mut matched = None;
    for step in now - SKEW..=now + SKEW {
        let equal: bool = code_at(&key, step).as_bytes().ct_eq(code.as_bytes()).into();
        if equal && last_step.is_none_or(|last| step > last) && matched.is_none() {
            matched = Some(step);
        }
    }
    matched
}

/// The `otpauth://` URL an authenticator app reads from the QR.
pub fn otpauth_url(issuer: &str, account: &str, secret_b32: &str) -> String {
    let enc = |s: &str| -> String {
        s.bytes()
            .map(|b| match b {
                b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => (b as char).to_string(),
                other => format!("%{other:02X}"),
            })
            .collect()
    };
    format!(
        "otpauth://totp/{}:{}?secret={secret_b32}&issuer={}&algorithm=SHA1&digits={DIGITS}&period={STEP_SECONDS}",
        enc(issuer),
        enc(account),
        enc(issuer)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 6238 appendix B, SHA-1 column (8 digits there; the last 6 are the 6-digit code).
    #[test]
    fn rfc_6238_test_vectors() {
        let key = b"12345678901234567890";
        for (time, eight) in [
            (59, "94287082"),
            (1_111_111_109, "07081804"),
            (1_111_111_111, "14050471"),
            (1_234_567_890, "89005924"),
            (2_000_000_000, "69279037"),
            (20_000_000_000, "65353130"),
        ] {
            assert_eq!(code_at(key, step_of(time)), eight[2..], "time {time}");
        }
    }

    #[test]
    fn base32_round_trips_and_matches_rfc_4648() {
        assert_eq!(base32_encode(b"foobar"), "MZXW6YTBOI");
        assert_eq!(base32_decode("mzxw 6ytb oi======").unwrap(), b"foobar");
        assert_eq!(base32_decode("MZ1"), None);
        let secret = new_secret();
        assert_eq!(secret.len(), 32);
        assert_eq!(base32_decode(&secret).unwrap().len(), 20);
    }

    #[test]
    fn one_step_of_skew_either_way_and_no_more() {
        let secret = base32_encode(b"12345678901234567890");
        let key = base32_decode(&secret).unwrap();
        let now = 1_700_000_000;
        let step = step_of(now);
        for (offset, accepted) in [(-2, false), (-1, true), (0, true), (1, true), (2, false)] {
            let code = code_at(&key, step + offset);
            assert_eq!(verify(&secret, &code, now, None).is_some(), accepted, "offset {offset}");
        }
        assert_eq!(verify(&secret, &code_at(&key, step), now, None), Some(step));
    }

    #[test]
    fn a_code_is_accepted_once() {
        let secret = base32_encode(b"12345678901234567890");
        let key = base32_decode(&secret).unwrap();
        let now = 1_700_000_000;
        let code = code_at(&key, step_of(now));
        let step = verify(&secret, &code, now, None).unwrap();
        assert_eq!(verify(&secret, &code, now, Some(step)), None, "the same code again");
        assert_eq!(verify(&secret, &code, now + 30, Some(step)), None, "still inside the skew");
        let older = code_at(&key, step - 1);
        assert_eq!(verify(&secret, &older, now, Some(step)), None, "an older code after a newer one");
    }

    #[test]
    fn malformed_codes_are_refused() {
        let secret = new_secret();
        for code in ["", "12345", "1234567", "12a456", "１２３４５６"] {
            assert_eq!(verify(&secret, code, 1_700_000_000, None), None, "{code:?}");
        }
    }

    #[test]
    fn otpauth_url_escapes_the_account() {
        let url = otpauth_url("Gateway", "a+b@example.com", "ABC");
        assert_eq!(
            url,
            "otpauth://totp/Gateway:a%2Bb%40example.com?secret=ABC&issuer=Gateway&algorithm=SHA1&digits=6&period=30"
        );
    }
}

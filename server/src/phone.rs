//! Recipient numbers, normalised to E.164 with libphonenumber's rules (the
//! `phonenumber` crate, a Rust port of its metadata).

use std::collections::HashMap;
use std::sync::{LazyLock, Mutex};

/// A valid recipient number.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Phone {
    /// `+` and digits, e.g. `+14155550123`.
    pub e164: String,
    /// Country calling code, e.g. 1.
    pub country_code: u16,
}

/// Parses a number in international format. Spaces, dots, dashes and parentheses are
/// ignored, and a leading `00` or a missing `+` is read as international.
pub fn normalize(raw: &str) -> Option<Phone> {
    let compact: String = raw.chars().filter(|c| !matches!(c, ' ' | '-' | '.' | '(' | ')' | '\u{a0}')).collect();
    let international = if let Some(rest) = compact.strip_prefix("00") {
        format!("+{rest}")
    } else if compact.starts_with('+') {
        compact
    } else {
        format!("+{compact}")
    };
    if international.len() > 20 || !international[1..].bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    if let Some(phone) = PARSED.lock().ok().and_then(|seen| seen.get(&international).cloned()) {
        return Some(phone);
    }
    let phone = parse_valid(&international)?;
    // Two numbers libphonenumber's rules call valid are not E.164 numbers a gateway
    // may send to: a German number of 16 or 17 digits (its rules allow national numbers
    // of up to 15 digits, E.164 allows 15 digits in all), and a number the rules rewrite
    // into one they then refuse (`+7 888 733 360 969`, its national prefix taken out,
    // gives `+78733360969`, which is not valid). Both were found by fuzzing
    // (fuzz/corpus/phone); a number given must normalise to itself.
    if phone.e164.len() > E164_MAX_LEN
        || (phone.e164 != international && parse_valid(&phone.e164).as_ref() != Some(&phone))
    {
        return None;
    }
    if let Ok(mut seen) = PARSED.lock() {
        if seen.len() >= PARSED_MAX {
            seen.clear();
        }
        seen.insert(international, phone.clone());
    }
    Some(phone)
}

/// The number libphonenumber's rules read from `international`, if they call it valid.
fn parse_valid(international: &str) -> Option<Phone> {
    let number = phonenumber::parse(None, international).ok()?;
    if !phonenumber::is_valid(&number) {
        return None;
    }
    Some(Phone { e164: number.format().mode(phonenumber::Mode::E164).to_string(), country_code: number.code().value() })
}

/// `+` and at most 15 digits (ITU-T E.164).
const E164_MAX_LEN: usize = 16;

/// Loads libphonenumber's rules before the first send. The `phonenumber` crate reads
/// its metadata on first use: the first send after a start took 86 ms in its schema
/// stage, and the sends that came meanwhile waited behind it (p99 of the first seconds
/// at 1,000 req/s 149 ms against 9 to 43 ms after; BENCHMARKS.md).
pub async fn prepare() {
    let _ = tokio::task::spawn_blocking(|| {
        phonenumber::parse(None, "+14155550123").map(|number| phonenumber::is_valid(&number))
    })
    .await;
}

/// Valid numbers parsed lately, by their international form. libphonenumber's rules are
/// dozens of regular expressions per number (8 % of the workers' CPU under load,
/// BENCHMARKS.md), and a gateway sends to the same numbers again and again (codes to
/// returning users, support conversations). Bounded: emptied when full.
static PARSED: LazyLock<Mutex<HashMap<String, Phone>>> = LazyLock::new(Mutex::default);
const PARSED_MAX: usize = 16_384;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn international_forms_normalise_to_e164() {
        for raw in ["+14155550123", "14155550123", "+1 (415) 555-0123", "0014155550123"] {
            let p = normalize(raw).unwrap_or_else(|| panic!("{raw}"));
            assert_eq!(p.e164, "+14155550123");
            assert_eq!(p.country_code, 1);
        }
        assert_eq!(normalize("+55 11 98765-4321").unwrap().e164, "+5511987654321");
        assert_eq!(normalize("+44 20 7946 0958").unwrap().country_code, 44);
    }

    #[test]
    fn invalid_numbers_are_refused() {
        for raw in ["", "+", "hello", "+1415", "+999123456789", "+1415555012a", "+1 415 555 0123 4567 8901"] {
            assert!(normalize(raw).is_none(), "{raw}");
        }
    }

    #[test]
    fn a_number_parsed_again_is_the_same() {
        for raw in ["+44 20 7946 0958", "+442079460958", "00442079460958"] {
            assert_eq!(normalize(raw), normalize("+442079460958"), "{raw}");
        }
        assert!(normalize("+1415").is_none() && normalize("+1415").is_none());
    }

    #[test]
    fn numbers_the_rules_accept_but_e164_does_not_are_refused() {
        // libphonenumber's rules call both valid; the first has 16 digits, the second
        // 17, E.164 allows 15.
        for raw in ["+4959233313338886", "+49514815525479276"] {
            assert!(phonenumber::is_valid(&phonenumber::parse(None, raw).unwrap()), "{raw}");
            assert!(normalize(raw).is_none(), "{raw}");
        }
        // 15 digits is still a number.
        assert_eq!(normalize("+49 30 12345678901").map(|p| p.e164), Some("+493012345678901".to_string()));
    }

    #[test]
    fn a_number_the_rules_rewrite_into_an_invalid_one_is_refused() {
        // The rules take a national prefix 8 out of the first, and refuse what they give.
        for raw in ["+7888733360969", "007888136193081"] {
            let rewritten = parse_valid(&format!("+{}", raw.trim_start_matches(['+', '0']))).unwrap();
            assert!(parse_valid(&rewritten.e164).is_none(), "{raw} gives {}", rewritten.e164);
            assert!(normalize(raw).is_none(), "{raw}");
        }
    }

    #[test]
    fn simulator_numbers_are_valid() {
        assert_eq!(normalize("+15005550001").unwrap().e164, "+15005550001");
        assert_eq!(normalize("+15005550002").unwrap().e164, "+15005550002");
    }
}

#[cfg(test)]
mod properties {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Any text: no panic; a result is E.164 and normalising it again changes nothing.
        #[test]
        fn normalised_numbers_are_e164_and_stable(raw in prop_oneof!["\\PC{0,30}", "\\+?[1-9][0-9]{7,14}"]) {
            if let Some(p) = normalize(&raw) {
                prop_assert!(p.e164.starts_with('+'));
                prop_assert!(p.e164[1..].bytes().all(|b| b.is_ascii_digit()));
                prop_assert!(p.e164.len() <= 16);
                prop_assert_eq!(normalize(&p.e164), Some(p));
            }
        }

        /// Separators a person types do not change the number.
        #[test]
        fn separators_do_not_matter(seps in proptest::collection::vec(prop_oneof![Just(""), Just(" "), Just("-"), Just(".")], 11)) {
            let digits = "14155550123";
            let mut typed = String::from("+");
            for (d, s) in digits.chars().zip(&seps) {
                typed.push(d);
                typed.push_str(s);
            }
            prop_assert_eq!(normalize(&typed).map(|p| p.e164), Some("+14155550123".to_string()));
        }
    }
}

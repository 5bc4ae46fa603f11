//! API key format: `gw_live_` + 43 base62 characters (256 bits) + a 6-character base62
//! CRC32 of those 43, so that a mistyped or made-up key is refused before the database
//! is asked. Only the SHA-256 of the whole key and its first 12 characters are stored;
//! with 256 bits of entropy a plain hash is enough (ASVS 6.5.2), and the lookup is by
//! the hash of the presented value, so it leaks nothing about stored keys.

use rand::Rng;
use sha2::{Digest, Sha256};

const PREFIX: &str = "gw_live_";
const BODY_LEN: usize = 43;
const CHECK_LEN: usize = 6;
const VISIBLE: usize = 12;
const BASE62: &[u8] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";

/// A freshly generated key: the plaintext (shown once), its visible prefix and its hash.
pub struct NewKey {
    pub plaintext: String,
    pub prefix: String,
    pub hash: String,
}

/// `n` random base62 characters from the operating system's generator.
pub fn random_base62(n: usize) -> String {
    let mut rng = rand::rngs::OsRng;
    (0..n).map(|_| BASE62[rng.gen_range(0..62)] as char).collect()
}

/// Generates a new key.
pub fn generate() -> NewKey {
    let body = random_base62(BODY_LEN);
    let plaintext = format!("{PREFIX}{body}{}", checksum(&body));
    NewKey { prefix: plaintext[..VISIBLE].to_string(), hash: hash(&plaintext), plaintext }
}

/// Whether `key` has our shape and a correct checksum.
pub fn well_formed(key: &str) -> bool {
    let Some(rest) = key.strip_prefix(PREFIX) else {
        return false;
    };
    if rest.len() != BODY_LEN + CHECK_LEN || !rest.bytes().all(|b| b.is_ascii_alphanumeric()) {
        return false;
    }
    let (body, check) = rest.split_at(BODY_LEN);
    checksum(body) == check
}

/// Hex SHA-256 of the whole key, as stored.
pub fn hash(key: &str) -> String {
    hex::encode(Sha256::digest(key.as_bytes()))
}

fn checksum(body: &str) -> String {
    let mut n = crc32fast::hash(body.as_bytes()) as u64;
    let mut out = [b'0'; CHECK_LEN];
    for slot in out.iter_mut().rev() {
        *slot = BASE62[(n % 62) as usize];
        n /= 62;
    }
    String::from_utf8(out.to_vec()).expect("base62 is ASCII")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_keys_are_well_formed_and_distinct() {
        let a = generate();
        let b = generate();
        assert!(well_formed(&a.plaintext), "{}", a.plaintext);
        assert_ne!(a.plaintext, b.plaintext);
        assert_eq!(a.plaintext.len(), 8 + 43 + 6);
        assert!(a.plaintext.starts_with(&a.prefix));
        assert_eq!(a.hash, hash(&a.plaintext));
    }

    #[test]
    fn a_changed_character_breaks_the_checksum() {
        let key = generate().plaintext;
        let mut bytes = key.into_bytes();
        bytes[20] = if bytes[20] == b'a' { b'b' } else { b'a' };
        assert!(!well_formed(std::str::from_utf8(&bytes).unwrap()));
        assert!(!well_formed("gw_live_short"));
        assert!(!well_formed(""));
    }
}

#[cfg(test)]
mod properties {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// CRC32 catches every single-character change (a burst of at most 8 bits).
        #[test]
        fn every_single_character_change_is_caught(pos in 8usize..57, with in "[0-9A-Za-z]") {
            let key = generate().plaintext;
            let mut changed = key.clone().into_bytes();
            changed[pos] = with.as_bytes()[0];
            prop_assume!(changed != key.as_bytes());
            prop_assert!(!well_formed(std::str::from_utf8(&changed).unwrap()));
        }

        /// Arbitrary text never panics the format check and is almost never accepted.
        #[test]
        fn arbitrary_text_is_refused(text in "\\PC{0,80}") {
            prop_assert!(!well_formed(&text));
        }
    }
}

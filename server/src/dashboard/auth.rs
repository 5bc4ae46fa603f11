//! Passwords, recovery codes, random tokens, and the sign-in throttle's rule.
//!
//! Passwords and recovery codes are argon2id with m = 19456 KiB, t = 2, p = 1, set
//! explicitly (OWASP and ASVS appendix C minimums), hashed on a blocking thread. An
//! unknown email is checked against a dummy hash, so a wrong email costs the same time
//! as a wrong password. Tokens (sessions, invitations, device cookies) are 256 random
//! bits from the OS; only their SHA-256 is stored.
//!
//! Throttle: every password or code attempt counts until a sign-in completes. The
//! first three in an hour are free; then each must wait 1 s, 2 s, 4 s ... up to 60 s
//! after the previous one. That allows at most 3 + 6 + 3537/60 ≈ 67 failures an hour
//! per bucket (the requirement is at most 100), and never locks anyone out: the owner
//! waits at most a minute. Attempts from a browser that completed a sign-in to that
//! account (device cookie) are counted in a bucket of their own, so an attacker who
//! fails on purpose only slows down browsers that never signed in.

use super::password_work::{self, Busy};
use argon2::password_hash::{Output, ParamsString, PasswordHash, SaltString};
use argon2::{Algorithm, Argon2, Block, Params, Version};
use rand::RngCore;
use sha2::{Digest, Sha256};
use std::sync::LazyLock;

/// argon2id memory cost in KiB (19 MiB).
pub const ARGON2_M_KIB: u32 = 19_456;
/// argon2id passes.
pub const ARGON2_T: u32 = 2;
/// argon2id lanes.
pub const ARGON2_P: u32 = 1;

/// Shortest password accepted.
pub const MIN_PASSWORD_CHARS: usize = 12;
/// Longest password accepted (long passphrases welcome; bounded to bound the work).
pub const MAX_PASSWORD_CHARS: usize = 256;

/// Recovery codes issued at enrolment.
pub const RECOVERY_CODES: usize = 10;

/// Free attempts an hour before the delay starts.
const FREE_ATTEMPTS: i64 = 3;
/// The longest delay between attempts.
pub const MAX_DELAY_MS: i64 = 60_000;

fn params() -> Params {
    Params::new(ARGON2_M_KIB, ARGON2_T, ARGON2_P, None).expect("valid argon2 parameters")
}

/// The size of the allocation a hash works in: above glibc's largest mmap threshold
/// (`4 * 1024 * 1024 * sizeof(long)`, 32 MiB, mallopt(3)), so glibc maps it on its own
/// and unmaps it when the hash is done. Allocated at its 19 MiB, glibc raised its
/// threshold to that size after the first free and served every later hash from its
/// arenas, which it never gave back: 30 MiB resident at rest became 245 MiB after one
/// sign-in (BENCHMARKS.md, "Memory"). Only the 19 MiB of blocks are ever touched.
const HASH_ALLOCATION: usize = 33 << 20;

/// Runs argon2 with `params` over memory of its own (see `HASH_ALLOCATION`).
fn argon2_into(
    argon: &Argon2<'_>,
    params: &Params,
    secret: &[u8],
    salt: &[u8],
    out: &mut [u8],
) -> Result<(), argon2::Error> {
    let blocks = params.block_count();
    let mut memory: Vec<Block> = Vec::with_capacity(blocks.max(HASH_ALLOCATION / std::mem::size_of::<Block>()));
    memory.resize(blocks, Block::default());
    argon.hash_password_into_with_memory(secret, salt, out, &mut memory[..])
}

/// `secret` hashed as the PHC string `PasswordHash` names (algorithm, version,
/// parameters, salt), into an output of `len` bytes.
fn phc_output(secret: &[u8], parsed: &PasswordHash<'_>, len: usize) -> Option<Output> {
    let salt = parsed.salt?;
    let params = Params::try_from(parsed).ok()?;
    let algorithm = Algorithm::try_from(parsed.algorithm).ok()?;
    let version = parsed.version.map(Version::try_from).transpose().ok()?.unwrap_or_default();
    let argon = Argon2::new(algorithm, version, params.clone());
    let mut salt_bytes = [0u8; 64];
    let salt = salt.decode_b64(&mut salt_bytes).ok()?;
    Output::init_with(len, |out| Ok(argon2_into(&argon, &params, secret, salt, out)?)).ok()
}

/// An argon2id PHC string of `secret` with a fresh salt (blocking: ~tens of ms).
pub fn hash_blocking(secret: &str) -> String {
    let salt = SaltString::generate(&mut rand::rngs::OsRng);
    let params = params();
    let mut phc = PasswordHash {
        algorithm: Algorithm::Argon2id.ident(),
        version: Some(Version::V0x13.into()),
        params: ParamsString::try_from(&params).expect("argon2 parameters as a PHC string"),
        salt: Some(salt.as_salt()),
        hash: None,
    };
    phc.hash = Some(phc_output(secret.as_bytes(), &phc, Params::DEFAULT_OUTPUT_LEN).expect("argon2 hashes any input"));
    phc.to_string()
}

/// Whether `secret` matches the PHC string `hash` (blocking); compared in constant time
/// (`Output`'s equality).
pub fn verify_blocking(hash: &str, secret: &str) -> bool {
    let Ok(parsed) = PasswordHash::new(hash) else { return false };
    let Some(expected) = parsed.hash else { return false };
    phc_output(secret.as_bytes(), &parsed, expected.len()).is_some_and(|computed| computed == expected)
}

/// A hash that matches nothing anyone types, checked for unknown accounts. Made at
/// start ([`prepare`]), so the first unknown email costs what every later one does.
static DUMMY_HASH: LazyLock<String> = LazyLock::new(|| hash_blocking(&random_token()));

/// Makes the dummy hash now, on a hashing thread.
pub async fn prepare() {
    let _ = password_work::pool().run(|| LazyLock::force(&DUMMY_HASH).len()).await;
}

/// Hashes on a password thread, or `Busy` at once when every slot and the queue are
/// taken (`password_work`).
pub async fn hash(secret: String) -> Result<String, Busy> {
    password_work::pool().run(move || hash_blocking(&secret)).await
}

/// Checks a password against an account's hash, or the dummy hash when there is none:
/// the same work either way (blocking: run it on a password thread).
pub fn check_blocking(hash: Option<&str>, secret: &str) -> bool {
    match hash {
        Some(hash) => verify_blocking(hash, secret),
        None => {
            let _ = verify_blocking(&DUMMY_HASH, secret);
            false
        }
    }
}

/// Runs other password work (recovery codes) on a password thread.
pub async fn run<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> Result<T, Busy> {
    password_work::pool().run(work).await
}

/// Why a password is refused (ASVS 6.2: length only, no composition rules).
pub fn password_problem(password: &str, email: &str) -> Option<String> {
    let chars = password.chars().count();
    if chars < MIN_PASSWORD_CHARS {
        return Some(format!("Use at least {MIN_PASSWORD_CHARS} characters (a few words make a good one)."));
    }
    if chars > MAX_PASSWORD_CHARS {
        return Some(format!("Use at most {MAX_PASSWORD_CHARS} characters."));
    }
    let lower = password.to_lowercase();
    let local = email.split('@').next().unwrap_or("");
    if lower == email || (!local.is_empty() && lower.contains(local) && local.len() >= 4) {
        return Some("Do not use your email address in the password.".into());
    }
    let distinct: std::collections::HashSet<char> = password.chars().collect();
    if distinct.len() < 4 || COMMON.iter().any(|c| lower.starts_with(c)) {
        return Some("This password is too easy to guess.".into());
    }
    None
}

/// Beginnings of the most common passwords.
const COMMON: &[&str] = &[
    "123456", "password", "qwerty", "111111", "abc123", "letmein", "iloveyou", "admin", "welcome", "monkey", "dragon",
    "passw0rd", "changeme", "gateway",
];

/// 256 random bits as 43 base62 characters.
pub fn random_token() -> String {
    crate::apikey::random_base62(43)
}

/// Hex SHA-256 of a token, as stored.
pub fn token_hash(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

/// A fresh recovery code: 12 base32 characters (60 bits) in groups of four, e.g.
/// `k7qd-2m4x-p9ra`.
pub fn new_recovery_code() -> String {
    let mut bytes = [0u8; 8];
    rand::rngs::OsRng.fill_bytes(&mut bytes);
    let text = super::totp::base32_encode(&bytes).to_lowercase();
    format!("{}-{}-{}", &text[0..4], &text[4..8], &text[8..12])
}

/// A recovery code as typed, normalised (case, spaces and dashes ignored).
pub fn normalize_recovery_code(typed: &str) -> String {
    typed.chars().filter(|c| c.is_ascii_alphanumeric()).map(|c| c.to_ascii_lowercase()).collect()
}

/// How long a bucket must wait after its `failures`-th attempt of the hour.
pub fn delay_ms(failures: i64) -> i64 {
    if failures <= FREE_ATTEMPTS {
        return 0;
    }
    let doublings = (failures - FREE_ATTEMPTS - 1).min(20) as u32;
    (1000i64 << doublings).min(MAX_DELAY_MS)
}

/// The throttle bucket of attempts on `email` from a browser that is known to that
/// account (`device`), or from any other browser.
pub fn throttle_bucket(email: &str, device: Option<&str>) -> String {
    token_hash(&format!("signin\n{email}\n{}", device.unwrap_or("-")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn argon2id_parameters_are_the_asvs_ones() {
        let hash = hash_blocking("correct horse battery staple");
        assert!(hash.starts_with("$argon2id$v=19$m=19456,t=2,p=1$"), "{hash}");
        assert!(verify_blocking(&hash, "correct horse battery staple"));
        assert!(!verify_blocking(&hash, "correct horse battery stapl"));
        assert!(!verify_blocking("not a hash", "x"));
    }

    #[test]
    fn hashes_are_argon2s_own_both_ways() {
        use argon2::password_hash::{PasswordHasher, PasswordVerifier};
        let argon = Argon2::new(Algorithm::Argon2id, Version::V0x13, params());
        // A hash made here is one argon2 verifies, and one argon2 made (as stored before
        // the hash had memory of its own) verifies here; other parameters too.
        let ours = hash_blocking("correct horse battery staple");
        let parsed = PasswordHash::new(&ours).unwrap();
        assert!(argon.verify_password(b"correct horse battery staple", &parsed).is_ok());
        assert!(argon.verify_password(b"wrong horse battery staple", &parsed).is_err());
        let salt = SaltString::generate(&mut rand::rngs::OsRng);
        let theirs = argon.hash_password(b"correct horse battery staple", &salt).unwrap().to_string();
        assert!(verify_blocking(&theirs, "correct horse battery staple"));
        assert!(!verify_blocking(&theirs, "correct horse battery stapler"));
        let light = Argon2::new(Algorithm::Argon2id, Version::V0x13, Params::new(1024, 1, 1, Some(16)).unwrap());
        let short = light.hash_password(b"pw", &salt).unwrap().to_string();
        assert!(verify_blocking(&short, "pw") && !verify_blocking(&short, "pW"));
        // The same salt and secret give the same string as argon2's own hasher.
        let again = argon.hash_password(b"x", PasswordHash::new(&ours).unwrap().salt.unwrap()).unwrap().to_string();
        let mut phc = PasswordHash::new(&again).unwrap();
        phc.hash = None;
        let computed = phc_output(b"x", &phc, Params::DEFAULT_OUTPUT_LEN).unwrap();
        assert_eq!(Some(computed), PasswordHash::new(&again).unwrap().hash);
    }

    #[test]
    fn at_most_100_failures_an_hour_and_never_more_than_a_minute_of_waiting() {
        // Attempts as fast as the throttle allows, for an hour.
        let (mut at, mut failures) = (0i64, 0i64);
        while at < THROTTLE_HOUR {
            failures += 1;
            at += delay_ms(failures).max(1);
        }
        assert!(failures <= 100, "{failures} attempts in an hour");
        assert!(failures >= 50, "the throttle should not be harsher than needed: {failures}");
        assert!((1..1000).all(|n| delay_ms(n) <= MAX_DELAY_MS));
        assert_eq!((delay_ms(1), delay_ms(3), delay_ms(4), delay_ms(5), delay_ms(9)), (0, 0, 1000, 2000, 32_000));
    }
    const THROTTLE_HOUR: i64 = crate::store::THROTTLE_WINDOW_MS;

    #[test]
    fn buckets_differ_by_email_and_device() {
        let a = throttle_bucket("a@example.com", None);
        assert_ne!(a, throttle_bucket("b@example.com", None));
        assert_ne!(a, throttle_bucket("a@example.com", Some("dev")));
        assert_eq!(a, throttle_bucket("a@example.com", None));
    }

    #[test]
    fn password_rules_are_length_and_guessability_only() {
        assert!(password_problem("short", "a@b.c").is_some());
        assert!(password_problem("password1234567", "a@b.c").is_some());
        assert!(password_problem("aaaaaaaaaaaaaaaa", "a@b.c").is_some());
        assert!(password_problem("alice-in-wonderland", "alice@example.com").is_some());
        assert!(password_problem("tulip orbit canyon 42", "alice@example.com").is_none());
        assert!(password_problem(&"x1y2".repeat(65), "a@b.c").is_some());
    }

    #[test]
    fn recovery_codes_are_60_bits_and_normalise() {
        let code = new_recovery_code();
        assert_eq!(code.len(), 14);
        assert_eq!(normalize_recovery_code(&code.to_uppercase().replace('-', " ")), code.replace('-', ""));
    }
}

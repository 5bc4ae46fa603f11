//! Cross-site request forgery defences (ASVS 3.5, OWASP CSRF cheat sheet).
//!
//! 1. Fetch metadata: an unsafe request that the browser marks `Sec-Fetch-Site:
//!    cross-site` or `same-site` is refused before anything else; a browser that sends
//!    no fetch metadata is held to its `Origin` header instead, when it sends one.
//! 2. Synchronizer token: every form of a signed-in page carries the session's random
//!    token, compared in constant time. The sign-in and invitation forms, before there
//!    is a session, carry an HMAC of a random pre-session cookie under a server key
//!    (the signed double-submit pattern), so a foreign site cannot post them either.
//!
//! State changes happen only in POST handlers; GET handlers read.

use super::{Ctx, DashError};
use hmac::{Hmac, Mac};
use http::header;
use sha2::Sha256;
use subtle::ConstantTimeEq;

/// Refuses a cross-site or same-site unsafe request.
pub fn check_fetch_site(rqctx: &Ctx) -> Result<(), DashError> {
    let headers = rqctx.request.headers();
    let site = headers.get("sec-fetch-site").and_then(|v| v.to_str().ok());
    match site {
        Some("same-origin") | Some("none") => Ok(()),
        Some(_) => Err(DashError::Csrf),
        None => {
            // No fetch metadata (an old browser, or not a browser): the Origin, if
            // given, must be this host.
            let origin = headers.get(header::ORIGIN).and_then(|v| v.to_str().ok());
            let host = headers.get(header::HOST).and_then(|v| v.to_str().ok());
            match (origin, host) {
                (Some("null"), _) => Err(DashError::Csrf),
                (Some(origin), Some(host)) => {
                    let origin_host = origin.split_once("://").map(|(_, rest)| rest).unwrap_or(origin);
                    if origin_host.eq_ignore_ascii_case(host) { Ok(()) } else { Err(DashError::Csrf) }
                }
                (Some(_), None) => Err(DashError::Csrf),
                (None, _) => Ok(()),
            }
        }
    }
}

/// Whether two tokens are equal (constant time; empty never matches).
pub fn same_token(expected: &str, presented: &str) -> bool {
    !expected.is_empty() && bool::from(expected.as_bytes().ct_eq(presented.as_bytes()))
}

/// The sign-in forms' token for a pre-session cookie value.
pub fn login_token(key: &[u8], pre_session: &str) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes any key length");
    mac.update(b"gateway-login-csrf\n");
    mac.update(pre_session.as_bytes());
    hex::encode(mac.finalize().into_bytes())
}

/// The server key of the sign-in forms' tokens (shared by replicas through the store).
pub async fn login_key(rqctx: &Ctx) -> Result<Vec<u8>, DashError> {
    let state = rqctx.context();
    let key = state
        .dashboard
        .login_key
        .get_or_try_init(|| async {
            let fresh = super::auth::random_token();
            let stored = state.store.dashboard_setting_or("login_csrf_key", &fresh).await?;
            Ok::<Vec<u8>, DashError>(stored.into_bytes())
        })
        .await?;
    Ok(key.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn login_tokens_are_bound_to_the_pre_session_and_the_key() {
        let a = login_token(b"key", "pre-1");
        assert_eq!(a, login_token(b"key", "pre-1"));
        assert_ne!(a, login_token(b"key", "pre-2"));
        assert_ne!(a, login_token(b"other", "pre-1"));
        assert!(same_token(&a, &a.clone()));
        assert!(!same_token(&a, &a[1..]));
        assert!(!same_token("", ""));
    }
}

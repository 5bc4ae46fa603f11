//! Creating accounts and their one-time sign-in links: what `gateway user create`,
//! `gateway operator create`, `gateway user link`, the users page and the operator
//! console share.
//!
//! A link is `{public_url}/invite#CODE`: the 256-bit code sits in the fragment, which
//! browsers never send, so it appears in no request log; the invitation page's script
//! copies it into the form (or the person pastes it). It works once, for 7 days, and
//! a new link for the same account replaces the old one.

use super::auth;
use super::roles::Role;
use crate::config::Config;
use crate::ops::OpsError;
use crate::store::{DashUser, Store, now_ms};
use serde_json::{Value, json};

/// How long a sign-in link works.
pub const LINK_LIFETIME_MS: i64 = 7 * 24 * 3_600_000;

/// An email as stored: trimmed, lower case, checked for a plausible shape.
pub fn normalize_email(raw: &str) -> Result<String, OpsError> {
    let email = raw.trim().to_lowercase();
    let valid = email.len() <= 254
        && email.split_once('@').is_some_and(|(local, domain)| {
            !local.is_empty() && domain.contains('.') && !domain.starts_with('.') && !domain.ends_with('.')
        })
        && !email.chars().any(|c| c.is_whitespace() || c.is_control() || c == '<' || c == '>');
    if valid { Ok(email) } else { Err(OpsError::Invalid(format!("{raw:?} is not an email address"))) }
}

/// Creates an account (customer user when `customer_id`, else operator) and its link.
pub async fn create(
    store: &Store,
    config: &Config,
    customer_id: Option<&str>,
    email: &str,
    role: Role,
    created_by: &str,
) -> Result<(DashUser, String), OpsError> {
    let email = normalize_email(email)?;
    match (customer_id, role) {
        (Some(_), Role::Operator) => return Err(OpsError::Invalid("operators belong to no customer".into())),
        (None, r) if r != Role::Operator => {
            return Err(OpsError::Invalid("a customer user needs a customer".into()));
        }
        _ => {}
    }
    let user = store.create_dashboard_user(customer_id, &email, role.as_str(), created_by).await?;
    let link = new_link(store, config, &user).await?;
    Ok((user, link))
}

/// A new one-time sign-in link for an account (the previous unused one stops working).
/// With the account's password already set, the link sets a new one; its
/// authenticator stays unless it was reset.
pub async fn new_link(store: &Store, config: &Config, user: &DashUser) -> Result<String, OpsError> {
    if user.disabled_at.is_some() {
        return Err(OpsError::Invalid(format!("the account {} is disabled", user.email)));
    }
    let code = auth::random_token();
    store.create_invitation(&user.id, &auth::token_hash(&code), now_ms() + LINK_LIFETIME_MS).await?;
    Ok(format!("{}/invite#{code}", config.public_base_url().trim_end_matches('/')))
}

/// An account as the CLI prints it (never a secret).
pub fn user_json(user: &DashUser) -> Value {
    json!({
        "id": user.id,
        "customer_id": user.customer_id,
        "email": user.email,
        "role": user.role,
        "password_set": user.password_hash.is_some(),
        "mfa_enrolled": user.totp_secret.is_some(),
        "disabled": user.disabled_at.is_some(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn emails_are_normalised_and_checked() {
        assert_eq!(normalize_email("  Ana@Example.COM ").unwrap(), "ana@example.com");
        for bad in ["", "ana", "ana@", "@example.com", "ana@example", "a b@example.com", "<a>@example.com"] {
            assert!(normalize_email(bad).is_err(), "{bad:?}");
        }
    }
}

//! Dashboard accounts, the store's side. Creating an account and its sign-in link is
//! `dashboard::accounts` (it mints the link's token with the dashboard's own
//! authentication, and the dashboard sits above `ops`); what the CLI needs of the
//! store besides is here.

use super::OpsError;
use crate::store::{DashUser, Store};

/// The account a new sign-in link is for, found by its email as stored (trimmed, lower
/// case). With `reset_mfa` its authenticator, recovery codes and sessions are forgotten
/// first. Returns the account as it now is.
pub async fn account_for_link(store: &Store, email: &str, reset_mfa: bool) -> Result<DashUser, OpsError> {
    let user =
        store.dashboard_user_by_email(email).await?.ok_or_else(|| OpsError::Invalid(format!("no account {email}")))?;
    if reset_mfa {
        store.reset_mfa(&user.id).await?;
    }
    store.dashboard_user(&user.id).await?.ok_or_else(|| OpsError::Invalid("the account vanished".into()))
}

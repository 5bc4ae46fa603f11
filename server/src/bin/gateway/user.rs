//! `gateway user` and `gateway operator`: accounts and their one-time sign-in links.

use anyhow::{Context, Result};
use clap::Subcommand;
use gateway_server::config::Config;
use gateway_server::dashboard::accounts;
use gateway_server::dashboard::roles::Role;
use gateway_server::ops::users;
use gateway_server::store::Store;
use serde_json::{Value, json};

#[derive(Subcommand)]
pub enum UserCommand {
    /// Create a dashboard user of a customer; prints a one-time sign-in link (7 days)
    /// where they choose a password and set up their authenticator.
    Create {
        #[arg(long)]
        customer: String,
        #[arg(long)]
        email: String,
        #[arg(long, value_parser = ["owner", "admin", "developer", "viewer"])]
        role: String,
    },
    /// A new one-time sign-in link for an account (a forgotten password; with
    /// --reset-mfa the authenticator and recovery codes are forgotten too, for a lost
    /// phone). Ends the account's sessions when resetting the authenticator.
    Link {
        #[arg(long)]
        email: String,
        #[arg(long)]
        reset_mfa: bool,
    },
}

#[derive(Subcommand)]
pub enum OperatorCommand {
    /// Create an operator; prints a one-time sign-in link (7 days).
    Create {
        #[arg(long)]
        email: String,
    },
}

pub async fn run(store: &Store, config: &Config, command: UserCommand) -> Result<Value> {
    let (user, link) = match command {
        UserCommand::Create { customer, email, role } => {
            let role = Role::parse(&role).context("unknown role")?;
            accounts::create(store, config, Some(&customer), &email, role, "cli").await?
        }
        UserCommand::Link { email, reset_mfa } => {
            let email = accounts::normalize_email(&email)?;
            let user = users::account_for_link(store, &email, reset_mfa).await?;
            let link = accounts::new_link(store, config, &user).await?;
            (user, link)
        }
    };
    Ok(json!({"user": accounts::user_json(&user), "sign_in_link": link}))
}

pub async fn run_operator(store: &Store, config: &Config, command: OperatorCommand) -> Result<Value> {
    let OperatorCommand::Create { email } = command;
    let (user, link) = accounts::create(store, config, None, &email, Role::Operator, "cli").await?;
    Ok(json!({"user": accounts::user_json(&user), "sign_in_link": link}))
}

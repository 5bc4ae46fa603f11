//! `gateway webhook`.

use anyhow::{Context, Result};
use clap::Subcommand;
use gateway_server::config::Config;
use gateway_server::ops::webhooks::{self, SecretChoice};
use gateway_server::store::Store;
use serde_json::Value;

#[derive(Subcommand)]
pub enum WebhookCommand {
    /// Set an instance's destination and events (https; http only to loopback with
    /// GATEWAY_ALLOW_LOOPBACK_TARGETS=1). A new endpoint gets a generated signing
    /// secret, printed once; an existing one keeps its secret unless --secret or
    /// --unsigned says otherwise. Re-enables a disabled endpoint.
    Set {
        #[arg(long)]
        instance: String,
        #[arg(long)]
        url: String,
        /// Comma-separated event names, or `all`.
        #[arg(long)]
        events: String,
        /// Use this signing secret (at least 16 characters).
        #[arg(long, conflicts_with = "unsigned")]
        secret: Option<String>,
        /// Deliver without X-Gateway-Signature.
        #[arg(long)]
        unsigned: bool,
    },
    /// Show an instance's endpoint (never its secret).
    Show {
        #[arg(long)]
        instance: String,
    },
    /// Replace the signing secret; the previous one keeps signing for 24 hours.
    RotateSecret {
        #[arg(long)]
        instance: String,
    },
    /// Re-enable a disabled endpoint.
    Enable {
        #[arg(long)]
        instance: String,
    },
    /// The latest delivery attempts, newest first.
    Attempts {
        #[arg(long)]
        instance: String,
        #[arg(long, default_value_t = 50)]
        limit: i64,
    },
    /// Deliver one event again now (one attempt; the schedule is not restarted).
    Resend {
        /// The event's id (`X-Gateway-Event-Id` without `evt_`).
        #[arg(long)]
        event: i64,
    },
    /// Deliver again, with a fresh schedule, every event since a time that was not
    /// delivered (failed, 410, or skipped while the endpoint was disabled).
    Recover {
        #[arg(long)]
        instance: String,
        /// RFC 3339 time or Unix seconds.
        #[arg(long)]
        since: String,
    },
    /// Send a `webhook.test` event to the endpoint now.
    Test {
        #[arg(long)]
        instance: String,
    },
}

pub async fn run(store: &Store, config: &Config, command: WebhookCommand) -> Result<Value> {
    Ok(match command {
        WebhookCommand::Set { instance, url, events, secret, unsigned } => {
            let choice = match (secret, unsigned) {
                (Some(s), _) => SecretChoice::Given(s),
                (None, true) => SecretChoice::None,
                (None, false) => SecretChoice::Keep,
            };
            webhooks::set_webhook(store, config, &instance, &url, &events, choice).await?
        }
        WebhookCommand::Show { instance } => webhooks::show_webhook(store, &instance).await?,
        WebhookCommand::RotateSecret { instance } => webhooks::rotate_webhook_secret(store, &instance).await?,
        WebhookCommand::Enable { instance } => webhooks::enable_webhook(store, &instance).await?,
        WebhookCommand::Attempts { instance, limit } => {
            webhooks::webhook_attempts(store, &instance, crate::list_limit(limit)?).await?
        }
        WebhookCommand::Resend { event } => webhooks::webhook_attempt_now(store, config, None, Some(event)).await?,
        WebhookCommand::Recover { instance, since } => {
            webhooks::recover_webhook_events(store, &instance, since_arg(&since)?).await?
        }
        WebhookCommand::Test { instance } => {
            webhooks::webhook_attempt_now(store, config, Some(&instance), None).await?
        }
    })
}

/// `--since`: RFC 3339, or Unix seconds from 0 to now; in milliseconds.
fn since_arg(raw: &str) -> Result<i64> {
    if let Ok(seconds) = raw.trim().parse::<i64>() {
        let now = gateway_server::store::now_ms() / 1000;
        anyhow::ensure!((0..=now).contains(&seconds), "{raw:?} is not a time (Unix seconds from 0 to now)");
        return Ok(seconds * 1000);
    }
    let at = chrono::DateTime::parse_from_rfc3339(raw.trim()).with_context(|| format!("{raw:?} is not a time"))?;
    Ok(at.timestamp_millis())
}

//! `gateway pbx`.

use anyhow::Result;
use clap::Subcommand;
use gateway_server::config::Config;
use gateway_server::ops::pbx;
use gateway_server::store::{PbxSettingsUpdate, Store};
use serde_json::Value;

#[derive(Subcommand)]
pub enum PbxCommand {
    /// Create an integration on one of the customer's instances; prints its id and
    /// webhook secret (and HMAC signing secret), shown once.
    Create {
        #[arg(long)]
        customer: String,
        /// Instance id or name.
        #[arg(long)]
        instance: String,
        /// Require signed requests (X-Gateway-Timestamp and X-Gateway-Signature).
        #[arg(long)]
        hmac: bool,
        /// Fills {{business_name}} in templates.
        #[arg(long)]
        business_name: Option<String>,
    },
    /// Show an integration and its templates (never its secrets).
    Show { id: i64 },
    /// Change an integration's settings.
    Set {
        #[arg(long)]
        integration: i64,
        #[arg(long)]
        business_name: Option<String>,
        /// Sustained requests a minute (default from the configuration).
        #[arg(long)]
        rate_per_minute: Option<i64>,
        /// Requests an idle integration may send at once.
        #[arg(long)]
        burst: Option<i64>,
        /// Minutes before a caller is messaged again for the same event type (0: no cooldown).
        #[arg(long)]
        cooldown_minutes: Option<i64>,
        /// Only message callers who wrote to the instance within this many hours.
        #[arg(long, conflicts_with = "no_strict_window")]
        strict_window_hours: Option<i64>,
        /// Turn the strict conversation window off.
        #[arg(long)]
        no_strict_window: bool,
        /// Only accept requests from these addresses or CIDR blocks (comma-separated).
        #[arg(long, conflicts_with = "no_ip_allowlist")]
        ip_allowlist: Option<String>,
        /// Accept requests from any address.
        #[arg(long)]
        no_ip_allowlist: bool,
    },
    /// Message templates per event type.
    Template {
        #[command(subcommand)]
        command: PbxTemplateCommand,
    },
    /// Replace the webhook secret (with --hmac also the signing secret); the old one
    /// stops working at once. Prints the new secrets, shown once.
    RotateSecret {
        #[arg(long)]
        integration: i64,
        #[arg(long)]
        hmac: bool,
    },
    /// The latest received events, newest first.
    Events {
        #[arg(long)]
        integration: i64,
        #[arg(long, default_value_t = 50)]
        limit: i64,
    },
}

#[derive(Subcommand)]
pub enum PbxTemplateCommand {
    /// Set the message sent for an event type. Placeholders: {{customer_phone}},
    /// {{agent_extension}}, {{queue}}, {{call_time}}, {{business_name}}.
    Set {
        #[arg(long)]
        integration: i64,
        /// missed_call, voicemail, after_hours, queue_callback, call_started,
        /// call_ended, queue_event or inbound_reply.
        #[arg(long)]
        event: String,
        #[arg(long)]
        text: String,
        #[arg(long, default_value = "support")]
        purpose: String,
    },
    /// Remove the template of an event type (its events are then ignored).
    Remove {
        #[arg(long)]
        integration: i64,
        #[arg(long)]
        event: String,
    },
}

pub async fn run(store: &Store, config: &Config, command: PbxCommand) -> Result<Value> {
    Ok(match command {
        PbxCommand::Create { customer, instance, hmac, business_name } => {
            pbx::create_pbx(store, &customer, &instance, hmac, business_name.as_deref()).await?
        }
        PbxCommand::Show { id } => pbx::show_pbx(store, config, id).await?,
        PbxCommand::Set {
            integration,
            business_name,
            rate_per_minute,
            burst,
            cooldown_minutes,
            strict_window_hours,
            no_strict_window,
            ip_allowlist,
            no_ip_allowlist,
        } => {
            let update = PbxSettingsUpdate {
                business_name: business_name.map(|n| Some(n).filter(|n| !n.trim().is_empty())),
                rate_per_minute: rate_per_minute.map(Some),
                burst: burst.map(Some),
                cooldown_seconds: cooldown_minutes.map(pbx::cooldown_seconds).transpose()?.map(Some),
                strict_window_hours: if no_strict_window { Some(None) } else { strict_window_hours.map(Some) },
                ip_allowlist: if no_ip_allowlist { Some(None) } else { ip_allowlist.map(Some) },
            };
            pbx::update_pbx(store, integration, &update).await?;
            pbx::show_pbx(store, config, integration).await?
        }
        PbxCommand::Template { command } => match command {
            PbxTemplateCommand::Set { integration, event, text, purpose } => {
                pbx::set_pbx_template(store, integration, &event, &text, &purpose).await?;
                pbx::show_pbx(store, config, integration).await?
            }
            PbxTemplateCommand::Remove { integration, event } => {
                pbx::remove_pbx_template(store, integration, &event).await?
            }
        },
        PbxCommand::RotateSecret { integration, hmac } => pbx::rotate_pbx_secret(store, integration, hmac).await?,
        PbxCommand::Events { integration, limit } => {
            pbx::pbx_events(store, integration, crate::list_limit(limit)?).await?
        }
    })
}

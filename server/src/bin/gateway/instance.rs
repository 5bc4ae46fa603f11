//! `gateway instance`.

use anyhow::Result;
use clap::Subcommand;
use gateway_server::config::Config;
use gateway_server::ops::{self, instances};
use gateway_server::store::Store;
use serde_json::Value;

#[derive(Subcommand)]
pub enum InstanceCommand {
    /// Create an instance.
    Create {
        #[arg(long)]
        customer: String,
        #[arg(long)]
        name: String,
        /// Mark it connected at once (simulator).
        #[arg(long)]
        connected: bool,
        /// Where its messages go; default: the `provider` setting. An evolution
        /// instance is also created at the provider.
        #[arg(long, value_parser = ["simulator", "evolution"])]
        provider: Option<String>,
    },
    /// Pairing (evolution): print the current QR code as a data URL, and the pairing
    /// code when --number is given; or that the instance is connected.
    Qr {
        id: String,
        /// The phone's number, for a pairing code instead of scanning.
        #[arg(long)]
        number: Option<String>,
    },
    /// Read the instance's connection state from its provider (evolution) and store it.
    State { id: String },
    /// Simulator: confirm the QR shown by `instance qr` was scanned; the instance connects.
    ConfirmPairing { id: String },
    /// Show an instance with its lifecycle state and latest QR.
    Show { id: String },
    /// Log an evolution instance out of the messaging network.
    Logout { id: String },
    /// Pause an instance for responsible-messaging review.
    Pause {
        id: String,
        #[arg(long)]
        reason: Option<String>,
    },
    /// Resume a paused instance.
    Resume { id: String },
    /// Declare how many days the instance's number has been in use: the pacing
    /// policy warms up numbers younger than 7 days, and a number moved from elsewhere
    /// is not new.
    Age {
        id: String,
        #[arg(long)]
        days: i64,
    },
}

pub async fn run(store: &Store, config: &Config, command: InstanceCommand) -> Result<Value> {
    let instance = match command {
        InstanceCommand::Create { customer, name, connected, provider } => {
            let provider = provider.unwrap_or_else(|| config.provider.clone());
            instances::create_instance_with(store, config, &customer, &name, &provider, connected).await?
        }
        InstanceCommand::Qr { id, number } => {
            let number = number.as_deref().map(ops::phone_arg).transpose()?;
            return Ok(instances::instance_qr(store, config, &id, number.as_deref()).await?);
        }
        InstanceCommand::State { id } => instances::sync_instance_state(store, config, &id).await?,
        InstanceCommand::ConfirmPairing { id } => instances::confirm_pairing(store, &id).await?,
        InstanceCommand::Logout { id } => instances::logout_instance(store, config, &id).await?,
        InstanceCommand::Show { id } => return Ok(instances::show_instance(store, &id).await?),
        InstanceCommand::Pause { id, reason } => instances::pause_instance(store, &id, reason.as_deref()).await?,
        InstanceCommand::Resume { id } => instances::resume_instance(store, &id).await?,
        InstanceCommand::Age { id, days } => instances::set_instance_age(store, &id, days).await?,
    };
    Ok(instances::instance_json(&instance))
}

//! `gateway suppression`.

use anyhow::Result;
use clap::Subcommand;
use gateway_server::ops::suppression;
use gateway_server::store::Store;
use serde_json::Value;

#[derive(Subcommand)]
pub enum SuppressionCommand {
    /// Suppress a recipient for a customer.
    Add {
        #[arg(long)]
        customer: String,
        #[arg(long)]
        phone: String,
        #[arg(long, default_value = "manual")]
        reason: String,
    },
    /// Remove a suppressed recipient.
    Remove {
        #[arg(long)]
        customer: String,
        #[arg(long)]
        phone: String,
    },
}

pub async fn run(store: &Store, command: SuppressionCommand) -> Result<Value> {
    Ok(match command {
        SuppressionCommand::Add { customer, phone, reason } => {
            suppression::add_suppression(store, &customer, &phone, &reason).await?
        }
        SuppressionCommand::Remove { customer, phone } => {
            suppression::remove_suppression(store, &customer, &phone).await?
        }
    })
}

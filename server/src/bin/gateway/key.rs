//! `gateway key`.

use anyhow::Result;
use clap::Subcommand;
use gateway_server::ops::keys;
use gateway_server::store::Store;
use serde_json::Value;

#[derive(Subcommand)]
pub enum KeyCommand {
    /// Create an API key (printed once).
    Create {
        #[arg(long)]
        customer: String,
        #[arg(long, default_value = "default")]
        name: String,
    },
    /// Revoke an API key (takes effect on the next request).
    Revoke { key_id: String },
}

pub async fn run(store: &Store, command: KeyCommand) -> Result<Value> {
    Ok(match command {
        KeyCommand::Create { customer, name } => keys::create_key(store, &customer, &name).await?,
        KeyCommand::Revoke { key_id } => keys::key_json(&keys::revoke_key(store, &key_id).await?),
    })
}

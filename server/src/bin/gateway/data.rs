//! `gateway backup`, `gateway retention` and `gateway privacy`.

use anyhow::Result;
use clap::{Args, Subcommand};
use gateway_server::config::Config;
use gateway_server::ops::data;
use gateway_server::store::Store;
use serde_json::Value;
use std::path::PathBuf;

#[derive(Args)]
pub struct BackupArgs {
    /// The copy to write (must not exist).
    #[arg(long)]
    to: PathBuf,
}

#[derive(Subcommand)]
pub enum RetentionCommand {
    /// Delete every row past its retention now, paced so that sends go on beside it (a
    /// backlog that fits is spread over up to 5 minutes); prints the rows deleted per table.
    Run,
}

#[derive(Subcommand)]
pub enum PrivacyCommand {
    /// Remove or redact what the gateway holds about one phone number for one
    /// customer (message log redacted, received messages, contacts, events and the
    /// rest deleted; a suppression is kept so the person is never messaged again);
    /// prints what each table lost.
    Erase {
        #[arg(long)]
        customer: String,
        /// The person's phone number (any form the API accepts).
        #[arg(long)]
        phone: String,
    },
}

pub async fn backup(store: &Store, args: BackupArgs) -> Result<Value> {
    Ok(data::backup(store, &args.to).await?)
}

pub async fn retention(store: &Store, config: &Config, command: RetentionCommand) -> Result<Value> {
    let RetentionCommand::Run = command;
    Ok(data::run_retention(store, config).await?)
}

pub async fn privacy(store: &Store, command: PrivacyCommand) -> Result<Value> {
    let PrivacyCommand::Erase { customer, phone } = command;
    Ok(data::erase_person(store, &customer, &phone).await?)
}

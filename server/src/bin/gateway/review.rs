//! `gateway review`.

use anyhow::Result;
use clap::Subcommand;
use gateway_server::ops::reviews;
use gateway_server::store::Store;
use serde_json::Value;

#[derive(Subcommand)]
pub enum ReviewCommand {
    /// Items of the review queue, newest first.
    List {
        /// pending, dismissed, confirmed or all.
        #[arg(long, default_value = "pending")]
        status: String,
        #[arg(long)]
        customer: Option<String>,
        #[arg(long, default_value_t = 50)]
        limit: i64,
    },
    /// One item, with the message text.
    Show { id: i64 },
    /// The policy was wrong: close the item (the instance stays as it is; resume it
    /// with `instance resume` if it was paused).
    Dismiss {
        id: i64,
        #[arg(long)]
        note: Option<String>,
        #[arg(long, default_value = "operator")]
        by: String,
    },
    /// The message was abuse: close the item as confirmed.
    Confirm {
        id: i64,
        #[arg(long)]
        note: Option<String>,
        #[arg(long, default_value = "operator")]
        by: String,
    },
}

pub async fn run(store: &Store, command: ReviewCommand) -> Result<Value> {
    let entry = match command {
        ReviewCommand::List { status, customer, limit } => {
            let status = (status != "all").then_some(status);
            let limit = crate::list_limit(limit)?;
            return Ok(reviews::list_reviews(store, status.as_deref(), customer.as_deref(), limit).await?);
        }
        ReviewCommand::Show { id } => reviews::review(store, id).await?,
        ReviewCommand::Dismiss { id, note, by } => {
            reviews::decide_review(store, id, "dismissed", &by, note.as_deref()).await?
        }
        ReviewCommand::Confirm { id, note, by } => {
            reviews::decide_review(store, id, "confirmed", &by, note.as_deref()).await?
        }
    };
    Ok(reviews::review_json(&entry))
}

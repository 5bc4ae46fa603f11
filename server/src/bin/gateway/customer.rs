//! `gateway customer` and `gateway plan`.

use anyhow::Result;
use clap::Subcommand;
use gateway_server::ops::{self, customers};
use gateway_server::store::{LimitOverrides, Store};
use serde_json::Value;

#[derive(Subcommand)]
pub enum CustomerCommand {
    /// Create a customer.
    Create {
        #[arg(long)]
        name: String,
        #[arg(long, default_value = "none", value_parser = ["starter", "scale", "none"])]
        plan: String,
        /// Approve a Scale plan at once.
        #[arg(long)]
        approve: bool,
    },
    /// Turn the api and pbx modules on or off.
    Modules {
        #[arg(long)]
        customer: String,
        #[arg(long, value_parser = ["on", "off"])]
        api: Option<String>,
        #[arg(long, value_parser = ["on", "off"])]
        pbx: Option<String>,
    },
    /// Set an operator's reviewed override of the plan's limits.
    Limits {
        #[arg(long)]
        customer: String,
        #[arg(long)]
        daily: Option<i64>,
        #[arg(long)]
        monthly: Option<i64>,
        #[arg(long)]
        instance_per_minute: Option<i64>,
        #[arg(long)]
        recipient_per_minute: Option<i64>,
    },
    /// Show a customer.
    Show { id: String },
    /// Set the purposes the customer is approved for (the purpose policy refuses the
    /// others with 422 message_purpose_not_allowed).
    Purposes {
        #[arg(long)]
        customer: String,
        /// Comma-separated: transactional, operational, support, internal_team,
        /// authentication.
        #[arg(long, conflicts_with = "all", required_unless_present = "all")]
        set: Option<String>,
        /// Approve all five (the default for a new customer).
        #[arg(long)]
        all: bool,
    },
}

#[derive(Subcommand)]
pub enum PlanCommand {
    /// Assign or renew a plan (starts a new 30-day period).
    Assign {
        #[arg(long)]
        customer: String,
        #[arg(long, value_parser = ["starter", "scale"])]
        plan: String,
        #[arg(long)]
        approve: bool,
    },
}

fn on_off(v: Option<String>) -> Option<bool> {
    v.map(|v| v == "on")
}

pub async fn run(store: &Store, command: CustomerCommand) -> Result<Value> {
    let customer = match command {
        CustomerCommand::Create { name, plan, approve } => {
            let plan = (plan != "none").then_some(plan);
            customers::create_customer(store, &name, plan.as_deref(), approve).await?
        }
        CustomerCommand::Modules { customer, api, pbx } => {
            customers::set_modules(store, &customer, on_off(api), on_off(pbx)).await?
        }
        CustomerCommand::Limits { customer, daily, monthly, instance_per_minute, recipient_per_minute } => {
            let limits = LimitOverrides { daily, monthly, instance_per_minute, recipient_per_minute };
            customers::set_limits(store, &customer, &limits).await?
        }
        CustomerCommand::Show { id } => customers::customer(store, &id).await?,
        CustomerCommand::Purposes { customer, set, all } => {
            let purposes = if all { None } else { Some(ops::purposes_arg(set.as_deref().unwrap_or_default())?) };
            customers::set_purposes(store, &customer, purposes.as_deref()).await?
        }
    };
    Ok(customers::customer_json(&customer))
}

pub async fn run_plan(store: &Store, command: PlanCommand) -> Result<Value> {
    let PlanCommand::Assign { customer, plan, approve } = command;
    Ok(customers::customer_json(&customers::assign_plan(store, &customer, &plan, approve).await?))
}

//! `gateway`: run the server and operate it.
//!
//! ```text
//! gateway serve                      # 127.0.0.1:8080, SQLite ./gateway.db, simulator
//! gateway serve --demo               # the same, plus a demo tenant and its API key
//! gateway demo                       # demo customer, instance "demo", an API key
//! gateway --database-url postgres://localhost/gateway migrate
//!
//! gateway policy build target/wasm32-unknown-unknown/release/policy_content.wasm \
//!     --fixtures policies/content/fixtures.json -o content.wasm
//! gateway policy test content.wasm policies/content/fixtures.json
//! gateway policy list                # what every running gateway uses
//! gateway operator create --email ops@example.com   # prints a one-time sign-in link
//! ```
//!
//! Every command but `serve` and `policy test` prints one JSON document on stdout
//! (`policy test` prints a line per fixture and `N passed, N failed`); logs go to
//! stderr. `serve` reloads its policies and its TLS certificate on SIGHUP.
//!
//! This file holds the top-level command line, the dispatch and the printing; each
//! command group has its file (its clap types and its `run`). No command calls the
//! store itself: each runs an operation of `gateway_server::ops` (of `policy::tools`
//! for the policy commands, of `dashboard::accounts` for new accounts and their links).

/// jemalloc for the process's Rust allocations (SQLite's C code keeps the system's), chosen
/// by measurement: send-message 0.97 to 1.23x glibc's malloc in eight pairs on both stores,
/// and less CPU a send in seven of them (1 to 91 µs), for 41 MiB at rest against 36; mimalloc
/// was as fast but held 55 to 63 MiB at rest (BENCHMARKS.md, issue 22, eleventh session).
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

mod customer;
mod data;
mod instance;
mod key;
mod pbx;
mod policy;
mod review;
mod serve;
mod suppression;
mod user;
mod webhook;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use gateway_server::config::Config;
use gateway_server::store::Store;
use gateway_server::{bounds, ops};
use serde_json::{Value, json};
use std::path::PathBuf;

#[derive(Parser)]
#[command(name = "gateway", version, about = "Messaging gateway: serve and operate")]
struct Cli {
    /// TOML configuration file (every key is optional).
    #[arg(long, global = true)]
    config: Option<PathBuf>,
    /// Database URL; overrides the file and GATEWAY_DATABASE_URL.
    #[arg(long, global = true)]
    database_url: Option<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the HTTP server until Ctrl-C or SIGTERM.
    Serve(serve::ServeArgs),
    /// Apply database migrations and exit.
    Migrate,
    /// Copy a SQLite store, consistently, while the gateway serves (PostgreSQL: use
    /// pg_dump, see docs/operations.md).
    Backup(data::BackupArgs),
    /// Create (or reuse) the demo customer and instance, and print a new API key.
    Demo,
    /// Customers.
    Customer {
        #[command(subcommand)]
        command: customer::CustomerCommand,
    },
    /// Plans.
    Plan {
        #[command(subcommand)]
        command: customer::PlanCommand,
    },
    /// Instances.
    Instance {
        #[command(subcommand)]
        command: instance::InstanceCommand,
    },
    /// API keys.
    Key {
        #[command(subcommand)]
        command: key::KeyCommand,
    },
    /// Suppressed recipients.
    Suppression {
        #[command(subcommand)]
        command: suppression::SuppressionCommand,
    },
    /// PBX integrations (phone systems posting call events).
    Pbx {
        #[command(subcommand)]
        command: pbx::PbxCommand,
    },
    /// Customer webhooks: where an instance's events are delivered.
    Webhook {
        #[command(subcommand)]
        command: webhook::WebhookCommand,
    },
    /// Policy modules: build, check and test them; see and change what running
    /// gateways use.
    Policy {
        #[command(subcommand)]
        command: policy::PolicyCommand,
    },
    /// The review queue: sends a policy held for an operator's review.
    Review {
        #[command(subcommand)]
        command: review::ReviewCommand,
    },
    /// Retention: delete rows past their time (every gateway also does it every 10
    /// minutes; the days are in the `[retention]` section of the configuration).
    Retention {
        #[command(subcommand)]
        command: data::RetentionCommand,
    },
    /// Data-subject requests.
    Privacy {
        #[command(subcommand)]
        command: data::PrivacyCommand,
    },
    /// Dashboard users of a customer.
    User {
        #[command(subcommand)]
        command: user::UserCommand,
    },
    /// Operators: the service's own staff (operator console).
    Operator {
        #[command(subcommand)]
        command: user::OperatorCommand,
    },
}

#[tokio::main]
async fn main() {
    let result = run().await;
    // Every line logged before the end is written before the process ends.
    gateway_server::logging::flush();
    if let Err(e) = result {
        let out = json!({"error": format!("{e:#}")});
        eprintln!("{out}");
        std::process::exit(1);
    }
}

async fn run() -> Result<()> {
    let cli = Cli::parse();
    let mut config = Config::load(cli.config.as_deref(), std::env::vars()).context("loading the configuration")?;
    if let Some(url) = cli.database_url {
        config.database_url = url;
    }
    let command = match cli.command {
        Command::Serve(args) => return serve::run(config, args).await,
        Command::Policy { command } => match policy::offline(&config, command)? {
            Some(online) => Command::Policy { command: online },
            None => return Ok(()),
        },
        other => other,
    };
    let store = Store::open_with(&config.database_url, 2, None, gateway_server::store_options(&config))
        .await
        .context("opening the database")?;
    let out = operate(&store, &config, command).await;
    store.close().await;
    let (ok, out) = out?;
    print_json(&out)?;
    if !ok {
        std::process::exit(1);
    }
    Ok(())
}

/// Runs a command on the store: (whether it fully succeeded, what to print).
async fn operate(store: &Store, config: &Config, command: Command) -> Result<(bool, Value)> {
    let out = match command {
        Command::Serve(_) => unreachable!("handled in run"),
        Command::Policy { command } => return policy::run(store, config, command).await,
        Command::Migrate => ops::data::migrated(store),
        Command::Backup(args) => data::backup(store, args).await?,
        Command::Demo => ops::demo::demo(store, config).await?,
        Command::Retention { command } => data::retention(store, config, command).await?,
        Command::Privacy { command } => data::privacy(store, command).await?,
        Command::Customer { command } => customer::run(store, command).await?,
        Command::Plan { command } => customer::run_plan(store, command).await?,
        Command::Instance { command } => instance::run(store, config, command).await?,
        Command::Key { command } => key::run(store, command).await?,
        Command::Suppression { command } => suppression::run(store, command).await?,
        Command::Pbx { command } => pbx::run(store, config, command).await?,
        Command::Webhook { command } => webhook::run(store, config, command).await?,
        Command::Review { command } => review::run(store, command).await?,
        Command::User { command } => user::run(store, config, command).await?,
        Command::Operator { command } => user::run_operator(store, config, command).await?,
    };
    Ok((true, out))
}

/// Prints one JSON document on stdout.
fn print_json(value: &Value) -> Result<()> {
    println!("{}", serde_json::to_string_pretty(value)?);
    Ok(())
}

/// A `--limit` within its range (refused outside it, never clamped).
fn list_limit(limit: i64) -> Result<i64> {
    bounds::within("--limit", limit, &bounds::LIST_LIMIT).map_err(anyhow::Error::msg)
}

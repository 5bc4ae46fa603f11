//! `gateway policy`: build, check, eval and test run without the database; install,
//! list, reload, promote and rollback act on the running gateways through the store;
//! backtest and shadow read what the store kept.

use anyhow::Result;
use clap::Subcommand;
use gateway_server::bounds;
use gateway_server::config::Config;
use gateway_server::policy::{backtest, tools};
use gateway_server::store::Store;
use serde_json::Value;
use std::path::PathBuf;

#[derive(Subcommand)]
pub enum PolicyCommand {
    /// Build the module a gateway loads: componentize the core module cargo built with
    /// the gateway-policy SDK, embed its fixtures, and validate it as a gateway would.
    Build {
        input: PathBuf,
        #[arg(short, long)]
        output: PathBuf,
        /// Fixture file embedded in the module; a gateway serves a module only after
        /// every one of them passes.
        #[arg(long)]
        fixtures: Option<PathBuf>,
        /// Override the name the SDK recorded (the crate's name unless given).
        #[arg(long)]
        name: Option<String>,
        /// Override the version the SDK recorded (the crate's version).
        #[arg(long)]
        version: Option<String>,
        /// Override the stages: purpose, content, or purpose,content.
        #[arg(long)]
        stages: Option<String>,
    },
    /// Inspect a built module: metadata, size, compile time, its fixtures in the
    /// sandbox, and whether a gateway would serve it.
    Check { module: PathBuf },
    /// Evaluate one context (JSON; missing fields take the fixture defaults) in the
    /// sandbox.
    Eval { module: PathBuf, context: PathBuf },
    /// Run a fixture file in the sandbox; prints `N passed, N failed`, exits 1 if any
    /// failed.
    Test {
        module: PathBuf,
        fixtures: PathBuf,
        /// Fuel budget for every fixture that sets no max_fuel.
        #[arg(long)]
        max_fuel: Option<u64>,
    },
    /// Check a built module as a reload does and install it in the store: every
    /// gateway on the store (any machine) runs it within a few seconds. A module that
    /// fails a check is not installed (exit 1).
    Install {
        module: PathBuf,
        /// Run it beside the live module of its name: every send evaluates it too, its
        /// verdict goes into the trace marked shadow, and it never changes an answer.
        #[arg(long)]
        shadow: bool,
        /// Let it decide this share of sends (1 to 99), chosen by a stable hash of each
        /// send; the live module decides the rest.
        #[arg(long, value_name = "PERCENT")]
        canary: Option<u8>,
        /// Apply it only to these customers' sends (comma-separated ids): under a live
        /// module's name it decides instead of it for them, under a new name in addition.
        #[arg(long, value_delimiter = ',', value_name = "ID,ID")]
        customers: Vec<String>,
        /// Apply it only to the sends of customers on these plans (starter, scale).
        #[arg(long, value_delimiter = ',', value_name = "PLAN,PLAN")]
        plans: Vec<String>,
        /// Seconds to wait for the running gateways to load it.
        #[arg(long, default_value_t = 30)]
        wait: u64,
    },
    /// Evaluate a module on the sends of the recent past, as the live modules saw them,
    /// and print what it would have changed (JSON; progress on stderr).
    Backtest {
        module: PathBuf,
        /// How far back: 90s, 30m, 24h, 7d (at most the kept inputs,
        /// [policies] input_retention_days).
        #[arg(long, default_value = "7d")]
        since: String,
        /// Only this customer's sends.
        #[arg(long)]
        customer: Option<String>,
        /// The newest this many sends at most.
        #[arg(long, default_value_t = 100_000)]
        limit: u64,
    },
    /// What the shadow of a module did on live traffic (the backtest's JSON).
    Shadow {
        name: String,
        /// How far back: 90s, 30m, 24h, 7d (never before the running shadow was
        /// installed).
        #[arg(long, default_value = "24h")]
        since: String,
        /// Only this customer's sends.
        #[arg(long)]
        customer: Option<String>,
        /// The newest this many sends at most.
        #[arg(long, default_value_t = 1_000_000)]
        limit: u64,
    },
    /// Make the shadow or canary of a module its live module on every running gateway
    /// (the live module before it is kept for rollback).
    Promote {
        name: String,
        /// Seconds to wait for the running gateways to run it.
        #[arg(long, default_value_t = 30)]
        wait: u64,
    },
    /// Show the modules (name, version, hash, source) each running gateway uses.
    List,
    /// Make every running gateway read its policies directory now.
    Reload {
        /// Seconds to wait for the gateways to answer.
        #[arg(long, default_value_t = 30)]
        wait: u64,
    },
    /// Undo the last install of a module on every running gateway: end its shadow or
    /// canary if one runs (the live module stays), else remove its newest stored
    /// install (scoped or live: the one before it runs again), else bring back the
    /// version each gateway ran before.
    Rollback {
        name: String,
        #[arg(long, default_value_t = 30)]
        wait: u64,
    },
}

/// The policy commands that need no database (build, check, eval, test); the others
/// are handed back.
pub fn offline(config: &Config, command: PolicyCommand) -> Result<Option<PolicyCommand>> {
    match command {
        PolicyCommand::Build { input, output, fixtures, name, version, stages } => {
            let host = tools::host(&config.policies)?;
            let options = tools::BuildOptions { fixtures, name, version, stages };
            crate::print_json(&tools::build(&host, &input, &output, &options)?)?;
        }
        PolicyCommand::Check { module } => crate::print_json(&tools::check(&tools::host(&config.policies)?, &module)?)?,
        PolicyCommand::Eval { module, context } => {
            let (ok, out) = tools::eval(&tools::host(&config.policies)?, &module, &context)?;
            crate::print_json(&out)?;
            if !ok {
                std::process::exit(1);
            }
        }
        PolicyCommand::Test { module, fixtures, max_fuel } => {
            let report = tools::test(&tools::host(&config.policies)?, &module, &fixtures, max_fuel)?;
            println!("{report}");
            if report.failed() > 0 {
                std::process::exit(1);
            }
        }
        online => return Ok(Some(online)),
    }
    Ok(None)
}

/// The policy commands on the store: (whether it fully succeeded, what to print).
pub async fn run(store: &Store, config: &Config, command: PolicyCommand) -> Result<(bool, Value)> {
    Ok(match command {
        PolicyCommand::List => (true, tools::list(store).await?),
        PolicyCommand::Reload { wait: w } => tools::command(store, "reload", None, wait_arg(w)?).await?,
        PolicyCommand::Rollback { name, wait: w } => tools::rollback(store, &name, wait_arg(w)?).await?,
        PolicyCommand::Install { module, shadow, canary, customers, plans, wait: w } => {
            let rollout = tools::rollout(store, shadow, canary, &customers, &plans).await?;
            tools::install_file(store, &config.policies, &module, rollout, wait_arg(w)?).await?
        }
        PolicyCommand::Backtest { module, since, customer, limit } => {
            let window = window(&since, customer, limit)?;
            (true, tools::backtest_file(store, &config.policies, &module, &window).await?)
        }
        PolicyCommand::Shadow { name, since, customer, limit } => {
            (true, backtest::shadow(store, &name, &window(&since, customer, limit)?).await?)
        }
        PolicyCommand::Promote { name, wait: w } => tools::promote(store, &name, "cli", wait_arg(w)?).await?,
        _ => unreachable!("offline policy commands are handled before the store opens"),
    })
}

/// The sends a backtest or shadow report reads.
fn window(since: &str, customer: Option<String>, limit: u64) -> Result<backtest::Window> {
    let since_ms = bounds::duration_ms("--since", since).map_err(anyhow::Error::msg)?;
    let limit = bounds::within("--limit", limit, &bounds::REPORT_LIMIT).map_err(anyhow::Error::msg)?;
    Ok(backtest::Window { since_ms, customer, limit })
}

/// A `--wait` within its range, as a duration.
fn wait_arg(seconds: u64) -> Result<std::time::Duration> {
    bounds::within("--wait", seconds, &bounds::WAIT_SECONDS)
        .map(std::time::Duration::from_secs)
        .map_err(anyhow::Error::msg)
}

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

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use gateway_server::config::Config;
use gateway_server::dashboard::accounts;
use gateway_server::dashboard::roles::Role;
use gateway_server::store::{LimitOverrides, PbxSettingsUpdate, Store};
use gateway_server::{bounds, ops, start_server};
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
enum RetentionCommand {
    /// Delete every row past its retention now; prints the rows deleted per table.
    Run,
}

#[derive(Subcommand)]
enum PrivacyCommand {
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

#[derive(Subcommand)]
enum Command {
    /// Run the HTTP server until Ctrl-C or SIGTERM.
    Serve {
        /// Address to bind; overrides the file and GATEWAY_LISTEN.
        #[arg(long)]
        listen: Option<std::net::SocketAddr>,
        /// Before serving, set up the demo tenant (as `gateway demo`) and print it.
        #[arg(long)]
        demo: bool,
    },
    /// Apply database migrations and exit.
    Migrate,
    /// Copy a SQLite store, consistently, while the gateway serves (PostgreSQL: use
    /// pg_dump, see the README).
    Backup {
        /// The copy to write (must not exist).
        #[arg(long)]
        to: std::path::PathBuf,
    },
    /// Create (or reuse) the demo customer and instance, and print a new API key.
    Demo,
    /// Customers.
    Customer {
        #[command(subcommand)]
        command: CustomerCommand,
    },
    /// Plans.
    Plan {
        #[command(subcommand)]
        command: PlanCommand,
    },
    /// Instances.
    Instance {
        #[command(subcommand)]
        command: InstanceCommand,
    },
    /// API keys.
    Key {
        #[command(subcommand)]
        command: KeyCommand,
    },
    /// Suppressed recipients.
    Suppression {
        #[command(subcommand)]
        command: SuppressionCommand,
    },
    /// PBX integrations (phone systems posting call events).
    Pbx {
        #[command(subcommand)]
        command: PbxCommand,
    },
    /// Customer webhooks: where an instance's events are delivered.
    Webhook {
        #[command(subcommand)]
        command: WebhookCommand,
    },
    /// Policy modules: build, check and test them; see and change what running
    /// gateways use.
    Policy {
        #[command(subcommand)]
        command: PolicyCommand,
    },
    /// The review queue: sends a policy held for an operator's review.
    Review {
        #[command(subcommand)]
        command: ReviewCommand,
    },
    /// Retention: delete rows past their time (every gateway also does it every 10
    /// minutes; the days are in the `[retention]` section of the configuration).
    Retention {
        #[command(subcommand)]
        command: RetentionCommand,
    },
    /// Data-subject requests.
    Privacy {
        #[command(subcommand)]
        command: PrivacyCommand,
    },
    /// Dashboard users of a customer.
    User {
        #[command(subcommand)]
        command: UserCommand,
    },
    /// Operators: the service's own staff (operator console).
    Operator {
        #[command(subcommand)]
        command: OperatorCommand,
    },
}

#[derive(Subcommand)]
enum PolicyCommand {
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
        /// Seconds to wait for the running gateways to load it.
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
    /// Make the previous version of a module live again on every running gateway.
    Rollback {
        name: String,
        #[arg(long, default_value_t = 30)]
        wait: u64,
    },
}

#[derive(Subcommand)]
enum UserCommand {
    /// Create a dashboard user of a customer; prints a one-time sign-in link (7 days)
    /// where they choose a password and set up their authenticator.
    Create {
        #[arg(long)]
        customer: String,
        #[arg(long)]
        email: String,
        #[arg(long, value_parser = ["owner", "admin", "developer", "viewer"])]
        role: String,
    },
    /// A new one-time sign-in link for an account (a forgotten password; with
    /// --reset-mfa the authenticator and recovery codes are forgotten too, for a lost
    /// phone). Ends the account's sessions when resetting the authenticator.
    Link {
        #[arg(long)]
        email: String,
        #[arg(long)]
        reset_mfa: bool,
    },
}

#[derive(Subcommand)]
enum ReviewCommand {
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

#[derive(Subcommand)]
enum OperatorCommand {
    /// Create an operator; prints a one-time sign-in link (7 days).
    Create {
        #[arg(long)]
        email: String,
    },
}

#[derive(Subcommand)]
enum WebhookCommand {
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

#[derive(Subcommand)]
enum PbxCommand {
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
enum PbxTemplateCommand {
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

#[derive(Subcommand)]
enum CustomerCommand {
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
enum PlanCommand {
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

#[derive(Subcommand)]
enum InstanceCommand {
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

#[derive(Subcommand)]
enum KeyCommand {
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

#[derive(Subcommand)]
enum SuppressionCommand {
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

fn on_off(v: Option<String>) -> Option<bool> {
    v.map(|v| v == "on")
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
    if let Command::Serve { listen, demo } = cli.command {
        if let Some(listen) = listen {
            config.listen = listen;
        }
        return serve(config, demo).await;
    }
    let command = match cli.command {
        Command::Policy { command } => match policy_offline(&config, command)? {
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
    println!("{}", serde_json::to_string_pretty(&out)?);
    if !ok {
        std::process::exit(1);
    }
    Ok(())
}

/// The policy commands that need no database (build, check, eval, test); the others
/// are handed back.
fn policy_offline(config: &Config, command: PolicyCommand) -> Result<Option<PolicyCommand>> {
    use gateway_server::policy::tools;
    let print = |v: &Value| -> Result<()> {
        println!("{}", serde_json::to_string_pretty(v)?);
        Ok(())
    };
    match command {
        PolicyCommand::Build { input, output, fixtures, name, version, stages } => {
            let host = tools::host(&config.policies)?;
            let options = tools::BuildOptions { fixtures, name, version, stages };
            print(&tools::build(&host, &input, &output, &options)?)?;
        }
        PolicyCommand::Check { module } => print(&tools::check(&tools::host(&config.policies)?, &module)?)?,
        PolicyCommand::Eval { module, context } => {
            let (ok, out) = tools::eval(&tools::host(&config.policies)?, &module, &context)?;
            print(&out)?;
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

/// Runs a command on the store: (whether it fully succeeded, what to print).
async fn operate(store: &Store, config: &Config, command: Command) -> Result<(bool, Value)> {
    if let Command::Policy { command } = command {
        return policy_online(store, config, command).await;
    }
    Ok((
        true,
        match command {
            Command::Serve { .. } => unreachable!("handled in run"),
            Command::Migrate => {
                json!({"migrated": true, "backend": format!("{:?}", store.backend()).to_lowercase()})
            }
            Command::Backup { to } => {
                let bytes = store.backup_to(&to).await?;
                json!({"backup": to.display().to_string(), "bytes": bytes})
            }
            Command::Demo => ops::demo(store, config).await?,
            Command::Retention { command: RetentionCommand::Run } => {
                let report = store
                    .run_retention(&gateway_server::retention_plan(config, gateway_server::store::now_ms()))
                    .await?;
                let pruned: serde_json::Map<String, Value> =
                    report.iter().map(|p| (p.table.to_string(), json!(p.rows))).collect();
                json!({"pruned": pruned, "retention": retention_json(config)})
            }
            Command::Privacy { command: PrivacyCommand::Erase { customer, phone } } => {
                let phone = ops::phone_arg(&phone)?;
                let report = store.erase_person(&customer, &phone).await?;
                let touched: Vec<Value> = report
                    .iter()
                    .filter(|e| e.rows > 0 || e.action == "kept")
                    .map(|e| json!({"table": e.table, "action": e.action, "rows": e.rows}))
                    .collect();
                json!({"customer_id": customer, "phone": phone, "touched": touched})
            }
            Command::Customer { command } => match command {
                CustomerCommand::Create { name, plan, approve } => {
                    let plan = (plan != "none").then_some(plan);
                    ops::customer_json(&ops::create_customer(store, &name, plan.as_deref(), approve).await?)
                }
                CustomerCommand::Modules { customer, api, pbx } => {
                    ops::customer_json(&store.set_modules(&customer, on_off(api), on_off(pbx)).await?)
                }
                CustomerCommand::Limits { customer, daily, monthly, instance_per_minute, recipient_per_minute } => {
                    let limits = LimitOverrides { daily, monthly, instance_per_minute, recipient_per_minute };
                    ops::customer_json(&ops::set_limits(store, &customer, &limits).await?)
                }
                CustomerCommand::Show { id } => ops::customer_json(&store.customer(&id).await?),
                CustomerCommand::Purposes { customer, set, all } => {
                    let purposes =
                        if all { None } else { Some(ops::purposes_arg(set.as_deref().unwrap_or_default())?) };
                    store.set_approved_purposes(&customer, purposes.as_deref()).await?;
                    ops::customer_json(&store.customer(&customer).await?)
                }
            },
            Command::Plan { command: PlanCommand::Assign { customer, plan, approve } } => {
                ops::customer_json(&ops::assign_plan(store, &customer, &plan, approve).await?)
            }
            Command::Instance { command } => match command {
                InstanceCommand::Create { customer, name, connected, provider } => {
                    let provider = provider.unwrap_or_else(|| config.provider.clone());
                    ops::instance_json(
                        &ops::create_instance_with(store, config, &customer, &name, &provider, connected).await?,
                    )
                }
                InstanceCommand::Qr { id, number } => {
                    let number = number.as_deref().map(ops::phone_arg).transpose()?;
                    ops::instance_qr(store, config, &id, number.as_deref()).await?
                }
                InstanceCommand::State { id } => {
                    ops::instance_json(&ops::sync_instance_state(store, config, &id).await?)
                }
                InstanceCommand::ConfirmPairing { id } => ops::instance_json(&ops::confirm_pairing(store, &id).await?),
                InstanceCommand::Logout { id } => ops::instance_json(&ops::logout_instance(store, config, &id).await?),
                InstanceCommand::Show { id } => {
                    let instance = store.instance(&id).await?;
                    let mut out = ops::instance_json(&instance);
                    out["lifecycle"] = json!(store.lifecycle(&instance).await?);
                    let (qr, qr_updated_at) = store.latest_qr(&id).await?;
                    out["qr"] = json!(qr);
                    out["qr_updated_at"] = json!(qr_updated_at);
                    out
                }
                InstanceCommand::Pause { id, reason } => {
                    ops::instance_json(&store.set_paused(&id, true, Some(reason.as_deref().unwrap_or("review"))).await?)
                }
                InstanceCommand::Resume { id } => ops::instance_json(&store.set_paused(&id, false, None).await?),
                InstanceCommand::Age { id, days } => {
                    ops::instance_json(&ops::set_instance_age(store, &id, days).await?)
                }
            },
            Command::Key { command } => match command {
                KeyCommand::Create { customer, name } => ops::create_key(store, &customer, &name).await?,
                KeyCommand::Revoke { key_id } => ops::key_json(&store.revoke_api_key(&key_id).await?),
            },
            Command::Suppression { command } => match command {
                SuppressionCommand::Add { customer, phone, reason } => {
                    let phone = ops::phone_arg(&phone)?;
                    store.add_suppression(&customer, &phone, &reason, "manual").await?;
                    json!({"customer_id": customer, "phone": phone, "suppressed": true, "reason": reason})
                }
                SuppressionCommand::Remove { customer, phone } => {
                    let phone = ops::phone_arg(&phone)?;
                    let removed = store.remove_suppression(&customer, &phone).await?;
                    json!({"customer_id": customer, "phone": phone, "suppressed": false, "removed": removed})
                }
            },
            Command::Pbx { command } => pbx(store, config, command).await?,
            Command::Webhook { command } => webhook(store, config, command).await?,
            Command::Review { command } => review(store, command).await?,
            Command::Policy { .. } => unreachable!("handled above"),
            Command::User { command } => user(store, config, command).await?,
            Command::Operator { command: OperatorCommand::Create { email } } => {
                let (user, link) = accounts::create(store, config, None, &email, Role::Operator, "cli").await?;
                json!({"user": accounts::user_json(&user), "sign_in_link": link})
            }
        },
    ))
}

async fn policy_online(store: &Store, config: &Config, command: PolicyCommand) -> Result<(bool, Value)> {
    use gateway_server::policy::tools;
    Ok(match command {
        PolicyCommand::List => (true, tools::list(store).await?),
        PolicyCommand::Reload { wait: w } => tools::command(store, "reload", None, wait_arg(w)?).await?,
        PolicyCommand::Rollback { name, wait: w } => tools::rollback(store, &name, wait_arg(w)?).await?,
        PolicyCommand::Install { module, wait: w } => {
            tools::install_file(store, &config.policies, &module, wait_arg(w)?).await?
        }
        _ => unreachable!("offline policy commands are handled before the store opens"),
    })
}

async fn review(store: &Store, command: ReviewCommand) -> Result<Value> {
    Ok(match command {
        ReviewCommand::List { status, customer, limit } => {
            let status = (status != "all").then_some(status);
            let items = store.review_queue(status.as_deref(), customer.as_deref(), list_limit(limit)?, None).await?;
            json!({"items": items.iter().map(ops::review_json).collect::<Vec<_>>()})
        }
        ReviewCommand::Show { id } => ops::review_json(&store.review_entry(id).await?),
        ReviewCommand::Dismiss { id, note, by } => {
            ops::review_json(&store.decide_review(id, "dismissed", &by, note.as_deref()).await?)
        }
        ReviewCommand::Confirm { id, note, by } => {
            ops::review_json(&store.decide_review(id, "confirmed", &by, note.as_deref()).await?)
        }
    })
}

async fn user(store: &Store, config: &Config, command: UserCommand) -> Result<Value> {
    Ok(match command {
        UserCommand::Create { customer, email, role } => {
            let role = Role::parse(&role).context("unknown role")?;
            let (user, link) = accounts::create(store, config, Some(&customer), &email, role, "cli").await?;
            json!({"user": accounts::user_json(&user), "sign_in_link": link})
        }
        UserCommand::Link { email, reset_mfa } => {
            let email = accounts::normalize_email(&email)?;
            let user = store.dashboard_user_by_email(&email).await?.with_context(|| format!("no account {email}"))?;
            if reset_mfa {
                store.reset_mfa(&user.id).await?;
            }
            let link = accounts::new_link(store, config, &user).await?;
            let user = store.dashboard_user(&user.id).await?.context("the account vanished")?;
            json!({"user": accounts::user_json(&user), "sign_in_link": link})
        }
    })
}

/// The retention in force, as `retention run` prints it.
fn retention_json(config: &Config) -> Value {
    let r = &config.retention;
    json!({
        "message_log_days": r.message_log_days, "inbound_days": r.inbound_days,
        "provider_events_hours": r.provider_events_hours,
        "failed_provider_events_days": r.failed_provider_events_days, "review_days": r.review_days,
        "contacts_days": r.contacts_days, "webhook_attempts_days": config.webhooks.retention_days,
        "pbx_events_days": config.pbx.event_retention_days,
    })
}

/// A `--limit` within its range (refused outside it, never clamped).
fn list_limit(limit: i64) -> Result<i64> {
    bounds::within("--limit", limit, &bounds::LIST_LIMIT).map_err(anyhow::Error::msg)
}

/// A `--wait` within its range, as a duration.
fn wait_arg(seconds: u64) -> Result<std::time::Duration> {
    bounds::within("--wait", seconds, &bounds::WAIT_SECONDS)
        .map(std::time::Duration::from_secs)
        .map_err(anyhow::Error::msg)
}

fn since_arg(raw: &str) -> Result<i64> {
    if let Ok(seconds) = raw.trim().parse::<i64>() {
        let now = gateway_server::store::now_ms() / 1000;
        anyhow::ensure!((0..=now).contains(&seconds), "{raw:?} is not a time (Unix seconds from 0 to now)");
        return Ok(seconds * 1000);
    }
    let at = chrono::DateTime::parse_from_rfc3339(raw.trim()).with_context(|| format!("{raw:?} is not a time"))?;
    Ok(at.timestamp_millis())
}

async fn webhook(store: &Store, config: &Config, command: WebhookCommand) -> Result<Value> {
    let show = |instance: String| async move {
        let endpoint =
            store.webhook(&instance).await?.with_context(|| format!("instance {instance} has no webhook"))?;
        anyhow::Ok(ops::webhook_json(&endpoint))
    };
    Ok(match command {
        WebhookCommand::Set { instance, url, events, secret, unsigned } => {
            let choice = match (secret, unsigned) {
                (Some(s), _) => ops::SecretChoice::Given(s),
                (None, true) => ops::SecretChoice::None,
                (None, false) => ops::SecretChoice::Keep,
            };
            ops::set_webhook(store, config, &instance, &url, &events, choice).await?
        }
        WebhookCommand::Show { instance } => show(instance).await?,
        WebhookCommand::RotateSecret { instance } => ops::rotate_webhook_secret(store, &instance).await?,
        WebhookCommand::Enable { instance } => {
            store.enable_webhook(&instance).await?;
            show(instance).await?
        }
        WebhookCommand::Attempts { instance, limit } => {
            let attempts = store.recent_attempts(&instance, list_limit(limit)?).await?;
            json!({"instance_id": instance, "attempts": attempts.iter().map(ops::attempt_json).collect::<Vec<_>>()})
        }
        WebhookCommand::Resend { event } => ops::webhook_attempt_now(store, config, None, Some(event)).await?,
        WebhookCommand::Recover { instance, since } => {
            let recovered = store.recover_events(&instance, since_arg(&since)?).await?;
            json!({"instance_id": instance, "recovered": recovered})
        }
        WebhookCommand::Test { instance } => ops::webhook_attempt_now(store, config, Some(&instance), None).await?,
    })
}

async fn pbx_show(store: &Store, config: &Config, id: i64) -> Result<Value> {
    let integration = store.pbx_integration(id).await?.with_context(|| format!("no PBX integration {id}"))?;
    Ok(ops::pbx_json(&integration, &store.pbx_templates(id).await?, config))
}

async fn pbx(store: &Store, config: &Config, command: PbxCommand) -> Result<Value> {
    Ok(match command {
        PbxCommand::Create { customer, instance, hmac, business_name } => {
            ops::create_pbx(store, &customer, &instance, hmac, business_name.as_deref()).await?
        }
        PbxCommand::Show { id } => pbx_show(store, config, id).await?,
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
                cooldown_seconds: cooldown_minutes.map(ops::cooldown_seconds).transpose()?.map(Some),
                strict_window_hours: if no_strict_window { Some(None) } else { strict_window_hours.map(Some) },
                ip_allowlist: if no_ip_allowlist { Some(None) } else { ip_allowlist.map(Some) },
            };
            ops::update_pbx(store, integration, &update).await?;
            pbx_show(store, config, integration).await?
        }
        PbxCommand::Template { command } => match command {
            PbxTemplateCommand::Set { integration, event, text, purpose } => {
                ops::set_pbx_template(store, integration, &event, &text, &purpose).await?;
                pbx_show(store, config, integration).await?
            }
            PbxTemplateCommand::Remove { integration, event } => {
                let removed = store.remove_pbx_template(integration, &event).await?;
                json!({"integration_id": integration, "event_type": event, "removed": removed})
            }
        },
        PbxCommand::RotateSecret { integration, hmac } => ops::rotate_pbx_secret(store, integration, hmac).await?,
        PbxCommand::Events { integration, limit } => {
            let events = store.recent_pbx_events(integration, list_limit(limit)?).await?;
            json!({"integration_id": integration, "events": events.iter().map(ops::pbx_event_json).collect::<Vec<_>>()})
        }
    })
}

async fn serve(config: Config, demo: bool) -> Result<()> {
    let log = gateway_server::make_logger(&config).map_err(anyhow::Error::msg)?;
    // Listened for before the server starts: a SIGHUP or SIGTERM that arrives while it
    // starts is handled once it runs, never the default action (exit).
    use tokio::signal::unix::{SignalKind, signal};
    let mut sigterm = signal(SignalKind::terminate())?;
    let mut sighup = signal(SignalKind::hangup())?;
    let server = start_server(log.clone(), &config).await?;
    if demo {
        let mut tenant = ops::demo(server.store(), &config).await?;
        let scheme = if config.tls.files().is_some() { "https" } else { "http" };
        tenant["base_url"] = json!(format!("{scheme}://{}", server.local_addr()));
        println!("{}", serde_json::to_string_pretty(&tenant)?);
    }
    loop {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => break,
            _ = sigterm.recv() => break,
            _ = sighup.recv() => {
                match server.policies() {
                    Some(policies) => match policies.reload().await {
                        Ok(summary) => slog::info!(log, "SIGHUP: policies reloaded"; "result" => summary),
                        Err(e) => slog::warn!(log, "SIGHUP: policies reloaded, a module was refused"; "result" => e),
                    },
                    None => slog::info!(log, "SIGHUP: no policy host to reload"),
                }
                if config.tls.files().is_some() {
                    // reload_tls logs and counts a refusal; the current pair stays.
                    let _ = server.reload_tls().await;
                }
            }
            r = server.wait_for_shutdown() => { r.map_err(anyhow::Error::msg)?; break; }
        }
    }
    slog::info!(log, "shutting down");
    server.close().await.map_err(anyhow::Error::msg)?;
    Ok(())
}

//! `gateway serve`: run the server until Ctrl-C or SIGTERM; SIGHUP reloads the policies
//! and the TLS certificate.

use anyhow::Result;
use clap::Args;
use gateway_server::config::Config;
use gateway_server::{ops, start_server};
use serde_json::json;

#[derive(Args)]
pub struct ServeArgs {
    /// Address to bind; overrides the file and GATEWAY_LISTEN.
    #[arg(long)]
    listen: Option<std::net::SocketAddr>,
    /// Before serving, set up the demo tenant (as `gateway demo`) and print it.
    #[arg(long)]
    demo: bool,
}

pub async fn run(mut config: Config, args: ServeArgs) -> Result<()> {
    if let Some(listen) = args.listen {
        config.listen = listen;
    }
    let log = gateway_server::make_logger(&config).map_err(anyhow::Error::msg)?;
    // Listened for before the server starts: a SIGHUP or SIGTERM that arrives while it
    // starts is handled once it runs, never the default action (exit).
    use tokio::signal::unix::{SignalKind, signal};
    let mut sigterm = signal(SignalKind::terminate())?;
    let mut sighup = signal(SignalKind::hangup())?;
    let server = start_server(log.clone(), &config).await?;
    if args.demo {
        let mut tenant = ops::demo::demo(server.store(), &config).await?;
        let scheme = if config.tls.files().is_some() { "https" } else { "http" };
        tenant["base_url"] = json!(format!("{scheme}://{}", server.local_addr()));
        crate::print_json(&tenant)?;
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

//! Baseline for the load benchmark: a bare Dropshot JSON echo, built the same way as
//! the gateway (same crate, profile, Dropshot version and logging), so that
//! `bench/run.sh` can compare send-message against what Dropshot itself costs.
//!
//! Run: `cargo run --release -p gateway-server --example echo -- 127.0.0.1:18081 /tmp/echo.log`

use dropshot::{
    ApiDescription, ConfigDropshot, ConfigLogging, ConfigLoggingIfExists, ConfigLoggingLevel, HttpError,
    HttpResponseOk, RequestContext, ServerBuilder, TypedBody, endpoint,
};

/// Echoes the JSON body.
#[endpoint { method = POST, path = "/echo" }]
async fn echo(
    _rqctx: RequestContext<()>,
    body: TypedBody<serde_json::Value>,
) -> Result<HttpResponseOk<serde_json::Value>, HttpError> {
    Ok(HttpResponseOk(body.into_inner()))
}

#[tokio::main]
async fn main() -> Result<(), String> {
    let mut args = std::env::args().skip(1);
    let listen = args.next().unwrap_or_else(|| "127.0.0.1:18081".into());
    let log_path = args.next().unwrap_or_else(|| "/dev/stderr".into());
    let log = ConfigLogging::File {
        level: ConfigLoggingLevel::Info,
        path: log_path.into(),
        if_exists: ConfigLoggingIfExists::Append,
    }
    .to_logger("echo")
    .map_err(|e| e.to_string())?;
    let mut api = ApiDescription::new();
    api.register(echo).map_err(|e| e.to_string())?;
    let config = ConfigDropshot {
        bind_address: listen.parse().map_err(|e| format!("{e}"))?,
        default_request_body_max_bytes: 64 * 1024,
        ..Default::default()
    };
    let server = ServerBuilder::new(api, (), log).config(config).start().map_err(|e| e.to_string())?;
    tokio::signal::ctrl_c().await.map_err(|e| e.to_string())?;
    server.close().await
}

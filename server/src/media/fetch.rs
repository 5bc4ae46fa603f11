//! Media URLs fetched by the gateway itself, so that no name is resolved twice: the
//! provider gets the content, never the URL. Each hop goes through the SSRF guard
//! (`net::guarded`: the form and literal addresses checked before the request, names
//! by the resolver the client connects with, to the addresses it checked); redirects
//! are followed by hand, at most [`MAX_REDIRECTS`], each target checked again; the body
//! is read with the media type's size cap; the whole fetch has one deadline. A refusal
//! tells the sender what was wrong with the URL, never an address it resolved to (the
//! log says which address and range).

use super::{MediaError, bad};
use crate::net::guarded::{self, ReadError};
use slog::{Logger, info};
use std::time::Duration;

/// Redirects followed at most.
pub const MAX_REDIRECTS: usize = 3;

/// Fetches media URLs through the guard.
#[derive(Clone)]
pub struct Fetcher {
    client: reqwest::Client,
    allow_loopback: bool,
    timeout: Duration,
    log: Logger,
}

impl Fetcher {
    /// A fetcher whose fetches take at most `timeout` each, redirects included.
    pub fn new(allow_loopback: bool, timeout: Duration, log: Logger) -> Fetcher {
        let client = guarded::client(allow_loopback, timeout, concat!("gateway-media/", env!("CARGO_PKG_VERSION")));
        Fetcher { client, allow_loopback, timeout, log }
    }

    /// The content at `raw`, at most `cap` bytes.
    pub async fn fetch(&self, raw: &str, cap: usize) -> Result<Vec<u8>, MediaError> {
        match tokio::time::timeout(self.timeout, self.follow(raw, cap)).await {
            Ok(result) => result,
            Err(_) => {
                Err(bad("media", format!("fetching the media URL took longer than {} ms", self.timeout.as_millis())))
            }
        }
    }

    async fn follow(&self, raw: &str, cap: usize) -> Result<Vec<u8>, MediaError> {
        let mut url = self.check(raw)?;
        for hop in 0..=MAX_REDIRECTS {
            let response = self.client.get(url.clone()).send().await.map_err(|e| self.transport(&e))?;
            let status = response.status();
            if status.is_redirection() {
                if hop == MAX_REDIRECTS {
                    return Err(bad("media", format!("the media URL redirected more than {MAX_REDIRECTS} times")));
                }
                let location =
                    response.headers().get(reqwest::header::LOCATION).and_then(|v| v.to_str().ok()).ok_or_else(
                        || bad("media", format!("the media URL answered {} without a location", status.as_u16())),
                    )?;
                let next =
                    url.join(location).map_err(|_| bad("media", "the media URL redirected to an invalid URL"))?;
                url = self.check(next.as_str())?;
                continue;
            }
            if !status.is_success() {
                return Err(bad("media", format!("the media URL answered {}", status.as_u16())));
            }
            return guarded::read_capped(response, cap).await.map_err(|e| match e {
                ReadError::TooLarge(cap) => bad("media", format!("media is larger than {cap} bytes")),
                ReadError::Transport(e) => self.transport(&e),
            });
        }
        unreachable!("the loop returns at the last hop")
    }

    /// Checks one hop's URL (its form and a literal address).
    fn check(&self, raw: &str) -> Result<url::Url, MediaError> {
        guarded::check_url(raw, self.allow_loopback).map_err(|e| {
            if let Some(detail) = e.log_detail() {
                info!(self.log, "media URL refused"; "address" => detail);
            }
            bad("media", format!("the media URL is refused: {e}"))
        })
    }

    /// A failed request, as the sender is told (no address), and the log's detail.
    fn transport(&self, e: &reqwest::Error) -> MediaError {
        if let Some(refused) = guarded::refusal(e) {
            if let Some(detail) = refused.log_detail() {
                info!(self.log, "media URL refused"; "address" => detail);
            }
            return bad("media", format!("the media URL is refused: {refused}"));
        }
        if e.is_timeout() {
            return bad("media", format!("fetching the media URL took longer than {} ms", self.timeout.as_millis()));
        }
        info!(self.log, "media URL could not be fetched"; "error" => %e);
        bad("media", "the media URL could not be fetched")
    }
}

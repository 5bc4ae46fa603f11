//! Outbound HTTP to customer-given URLs through the SSRF guard: the client resolves a
//! name once, with [`GuardedResolver`], which refuses it if any address is not public,
//! and connects only to the addresses it checked (no second lookup: a name that
//! rebinds between a check and a connect gains nothing). Literal addresses never reach
//! a resolver, so [`check_url`] checks them (and the URL's form) before a request.
//! Bodies are read with a cap ([`read_capped`]), so a peer cannot make the gateway hold
//! more than it asked for.

use super::ssrf::{self, SsrfError};
use std::net::SocketAddr;

/// Resolves names for a client and refuses any that resolve to a refused address; the
/// client then connects only to the addresses checked here.
#[derive(Clone, Debug)]
pub struct GuardedResolver {
    pub allow_loopback: bool,
}

impl reqwest::dns::Resolve for GuardedResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let allow_loopback = self.allow_loopback;
        Box::pin(async move {
            let addrs: Vec<SocketAddr> = tokio::net::lookup_host((name.as_str(), 0)).await?.collect();
            let ips: Vec<_> = addrs.iter().map(SocketAddr::ip).collect();
            ssrf::check_addresses(&ips, allow_loopback)?;
            let addrs: reqwest::dns::Addrs = Box::new(addrs.into_iter());
            Ok(addrs)
        })
    }
}

/// A client for customer-given URLs: no redirects (callers follow them by hand, each
/// hop checked again), no proxy, the guarded resolver, these timeouts.
pub fn client(allow_loopback: bool, timeout: std::time::Duration, user_agent: &str) -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .no_proxy()
        .dns_resolver(std::sync::Arc::new(GuardedResolver { allow_loopback }))
        .timeout(timeout)
        .connect_timeout(timeout.min(std::time::Duration::from_secs(10)))
        .user_agent(user_agent)
        .build()
        .expect("the guarded client builds")
}

/// Checks a URL before a request with the guarded client: its form, and a literal
/// address (names are checked by the resolver when the client connects).
pub fn check_url(raw: &str, allow_loopback: bool) -> Result<url::Url, SsrfError> {
    let url = ssrf::check_form(raw, allow_loopback)?;
    match url.host() {
        Some(url::Host::Ipv4(ip)) => ssrf::check_addresses(&[ip.into()], allow_loopback)?,
        Some(url::Host::Ipv6(ip)) => ssrf::check_addresses(&[ip.into()], allow_loopback)?,
        _ => {}
    }
    if url.scheme() == "http" {
        // Plain http only to loopback (with the development flag): a name must be one
        // that can only mean this machine.
        let loopback = match url.host() {
            Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
            Some(url::Host::Ipv6(ip)) => ip.to_canonical().is_loopback(),
            Some(url::Host::Domain(d)) => d.eq_ignore_ascii_case("localhost"),
            None => false,
        };
        if !loopback {
            return Err(SsrfError::NotHttps);
        }
    }
    Ok(url)
}

/// The SSRF refusal behind a failed request, if the guard was the cause.
pub fn refusal(e: &reqwest::Error) -> Option<&SsrfError> {
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        if let Some(refused) = cause.downcast_ref::<SsrfError>() {
            return Some(refused);
        }
        source = cause.source();
    }
    None
}

/// Why a capped read failed.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("the answer is larger than {0} bytes")]
    TooLarge(usize),
    #[error("the answer could not be read: {0}")]
    Transport(#[from] reqwest::Error),
}

/// Reads a response's body, refusing it as soon as it passes `cap` bytes (at once when
/// its declared length does).
pub async fn read_capped(mut response: reqwest::Response, cap: usize) -> Result<Vec<u8>, ReadError> {
    if response.content_length().is_some_and(|n| n > cap as u64) {
        return Err(ReadError::TooLarge(cap));
    }
    let mut body = Vec::with_capacity(response.content_length().map_or(8 * 1024, |n| n as usize).min(cap));
    while let Some(chunk) = response.chunk().await? {
        if body.len() + chunk.len() > cap {
            return Err(ReadError::TooLarge(cap));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

#[cfg(test)]
mod tests {
    use super::*;
    use reqwest::dns::Resolve;

    #[tokio::test]
    async fn the_resolver_refuses_loopback_names_unless_allowed() {
        let name = |s: &str| s.parse::<reqwest::dns::Name>().unwrap();
        let refused = GuardedResolver { allow_loopback: false }.resolve(name("localhost")).await;
        let error = refused.err().expect("localhost is refused");
        assert!(error.to_string().contains("refused address"), "{error}");
        assert!(!error.to_string().contains("127.0.0.1"), "a refusal never names the address: {error}");
        let allowed = GuardedResolver { allow_loopback: true }.resolve(name("localhost")).await;
        assert!(allowed.is_ok());
    }

    #[test]
    fn literal_addresses_and_plain_http_are_checked_before_a_request() {
        assert!(check_url("https://127.0.0.1/a", false).is_err());
        assert!(check_url("https://[::ffff:0:127.0.0.1]/a", false).is_err(), "IPv4-translated loopback");
        assert!(check_url("https://[::127.0.0.1]/a", false).is_err(), "IPv4-compatible loopback");
        assert!(check_url("https://192.88.99.1/a", false).is_err(), "6to4 relay anycast");
        assert!(check_url("https://[64:ff9b::7f00:1]/a", true).is_err(), "NAT64 of loopback, even with the flag");
        assert!(check_url("http://127.0.0.1:9/a", true).is_ok());
        assert!(check_url("http://localhost:9/a", true).is_ok());
        assert_eq!(check_url("http://example.com/a", true).unwrap_err(), SsrfError::NotHttps);
        assert!(check_url("https://example.com/a", false).is_ok(), "names are left to the resolver");
    }
}

//! SSRF guard: only https URLs whose every resolved address is public.
//!
//! Which addresses are public is decided by [`super::ranges`]: every entry of the IANA
//! special-purpose registries, multicast and reserved space, with IPv4 carried in IPv6
//! (mapped, compatible, translated) classified as that IPv4 address and NAT64, 6to4 and
//! Teredo refused whole. Every address a name resolves to must pass,
//! and callers that connect must connect to the addresses returned here (no second
//! lookup), which defeats DNS rebinding. Loopback (and only loopback) is allowed, over
//! http or https, when the operator sets `GATEWAY_ALLOW_LOOPBACK_TARGETS=1`.

use std::net::{IpAddr, SocketAddr};
use url::{Host, Url};

/// Why a URL was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SsrfError {
    #[error("not a valid URL")]
    Invalid,
    #[error("only https URLs are allowed")]
    NotHttps,
    #[error("URLs with credentials are not allowed")]
    Credentials,
    #[error("the host could not be resolved")]
    Unresolved,
    /// The address is kept for the log ([`SsrfError::log_detail`]); the message never
    /// names it, so a caller cannot map internal names to addresses through refusals.
    #[error("the host resolves to a refused address (private, loopback, link-local or another special-purpose range)")]
    Refused(IpAddr),
}

pub use super::ranges::{Special, classify, is_public};

impl SsrfError {
    /// What the operator's log may say beyond the message: the refused address and its
    /// special-purpose range.
    pub fn log_detail(&self) -> Option<String> {
        match self {
            SsrfError::Refused(ip) => Some(match classify(*ip) {
                Some(special) => format!("{ip}: {special}"),
                None => ip.to_string(),
            }),
            _ => None,
        }
    }
}

fn is_loopback(ip: IpAddr) -> bool {
    ip.to_canonical().is_loopback()
}

/// Checks a URL's scheme and form, before any lookup.
pub fn check_form(raw: &str, allow_loopback: bool) -> Result<Url, SsrfError> {
    let url = Url::parse(raw).map_err(|_| SsrfError::Invalid)?;
    match url.scheme() {
        "https" => {}
        "http" if allow_loopback => {}
        _ => return Err(SsrfError::NotHttps),
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(SsrfError::Credentials);
    }
    if url.host().is_none() {
        return Err(SsrfError::Invalid);
    }
    Ok(url)
}

/// Checks addresses a URL's host resolved to; all must pass.
pub fn check_addresses(addrs: &[IpAddr], allow_loopback: bool) -> Result<(), SsrfError> {
    if addrs.is_empty() {
        return Err(SsrfError::Unresolved);
    }
    for ip in addrs {
        let loopback_ok = allow_loopback && is_loopback(*ip);
        if !is_public(*ip) && !loopback_ok {
            return Err(SsrfError::Refused(*ip));
        }
    }
    Ok(())
}

/// Validates `raw` and resolves its host; returns the URL and the addresses a client
/// must connect to. Plain http is accepted only for loopback targets with the flag.
pub async fn resolve(raw: &str, allow_loopback: bool) -> Result<(Url, Vec<SocketAddr>), SsrfError> {
    let url = check_form(raw, allow_loopback)?;
    let port = url.port_or_known_default().ok_or(SsrfError::Invalid)?;
    let addrs: Vec<SocketAddr> = match url.host() {
        Some(Host::Ipv4(ip)) => vec![SocketAddr::new(IpAddr::V4(ip), port)],
        Some(Host::Ipv6(ip)) => vec![SocketAddr::new(IpAddr::V6(ip), port)],
        Some(Host::Domain(name)) => {
            tokio::net::lookup_host((name, port)).await.map_err(|_| SsrfError::Unresolved)?.collect()
        }
        None => return Err(SsrfError::Invalid),
    };
    let ips: Vec<IpAddr> = addrs.iter().map(SocketAddr::ip).collect();
    check_addresses(&ips, allow_loopback)?;
    if url.scheme() == "http" && !ips.iter().all(|ip| is_loopback(*ip)) {
        return Err(SsrfError::NotHttps);
    }
    Ok((url, addrs))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn loopback_flag_allows_loopback_only() {
        assert!(check_addresses(&[ip("127.0.0.1")], true).is_ok());
        assert!(check_addresses(&[ip("::1")], true).is_ok());
        assert!(check_addresses(&[ip("::ffff:127.0.0.1")], true).is_ok());
        assert_eq!(check_addresses(&[ip("10.0.0.1")], true), Err(SsrfError::Refused(ip("10.0.0.1"))));
        assert_eq!(check_addresses(&[ip("169.254.169.254")], true), Err(SsrfError::Refused(ip("169.254.169.254"))));
        // One bad address among good ones refuses the whole name.
        assert!(check_addresses(&[ip("8.8.8.8"), ip("127.0.0.1")], false).is_err());
        assert_eq!(check_addresses(&[], false), Err(SsrfError::Unresolved));
    }

    #[test]
    fn form_checks() {
        assert_eq!(check_form("http://example.com/a.png", false), Err(SsrfError::NotHttps));
        assert_eq!(check_form("ftp://example.com/a.png", true), Err(SsrfError::NotHttps));
        assert_eq!(check_form("https://u:p@example.com/a.png", false), Err(SsrfError::Credentials));
        assert_eq!(check_form("not a url", false), Err(SsrfError::Invalid));
        assert!(check_form("https://example.com/a.png", false).is_ok());
    }

    // Connect-path checks use loopback names and forms only: nothing leaves the machine.
    #[tokio::test]
    async fn loopback_names_and_forms_are_refused_without_the_flag() {
        for raw in [
            "https://localhost/a.png",
            "https://127.0.0.1/a.png",
            "https://[::1]/a.png",
            "https://[::ffff:127.0.0.1]/a.png",
            "https://2130706433/a.png", // decimal form of 127.0.0.1
            "https://0x7f.0.0.1/a.png", // hex form
            "https://0177.0.0.1/a.png", // octal form
            "https://127.1/a.png",      // short form
        ] {
            match resolve(raw, false).await {
                Err(SsrfError::Refused(ip)) => {
                    assert!(ip.to_canonical().is_loopback(), "{raw}: {ip}")
                }
                other => panic!("{raw}: {other:?}"),
            }
        }
    }

    #[tokio::test]
    async fn loopback_is_allowed_with_the_flag_over_http_or_https() {
        let (_, addrs) = resolve("http://127.0.0.1:9/a.png", true).await.unwrap();
        assert_eq!(addrs, vec!["127.0.0.1:9".parse().unwrap()]);
        assert!(resolve("https://localhost/a.png", true).await.is_ok());
        assert!(resolve("https://[::1]:8443/a.png", true).await.is_ok());
    }

    #[tokio::test]
    async fn metadata_literal_is_refused_even_with_the_flag() {
        assert_eq!(
            resolve("https://169.254.169.254/latest/meta-data", true).await,
            Err(SsrfError::Refused(ip("169.254.169.254")))
        );
    }
}

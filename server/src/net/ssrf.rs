//! SSRF guard: only https URLs whose every resolved address is public.
//!
//! The address list follows Svix's `is_allowed`: IPv4-mapped IPv6 is unwrapped first,
//! then private, loopback, link-local (cloud metadata included), CGNAT, multicast,
//! broadcast, documentation, benchmarking, reserved and "this network" ranges are
//! refused, and their IPv6 counterparts. Every address a name resolves to must pass,
//! and callers that connect must connect to the addresses returned here (no second
//! lookup), which defeats DNS rebinding. Loopback (and only loopback) is allowed, over
//! http or https, when the operator sets `GATEWAY_ALLOW_LOOPBACK_TARGETS=1`.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
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
    #[error("the host resolves to a refused address ({0})")]
    Refused(IpAddr),
}

/// Whether `ip` is a public unicast address.
pub fn is_public(ip: IpAddr) -> bool {
    match ip.to_canonical() {
        IpAddr::V4(v4) => public_v4(v4),
        IpAddr::V6(v6) => public_v6(v6),
    }
}

fn public_v4(ip: Ipv4Addr) -> bool {
    let [a, b, c, _] = ip.octets();
    !(ip.is_private()
        || ip.is_loopback()
        || ip.is_link_local()
        || ip.is_broadcast()
        || ip.is_multicast()
        || ip.is_documentation()
        || ip.is_unspecified()
        || a == 0                                   // 0.0.0.0/8 "this network"
        || (a == 100 && (64..128).contains(&b))     // 100.64.0.0/10 shared (CGNAT)
        || (a == 192 && b == 0 && c == 0)           // 192.0.0.0/24 IETF protocol assignments
        || (a == 198 && (b == 18 || b == 19))       // 198.18.0.0/15 benchmarking
        || a >= 240) // 240.0.0.0/4 reserved
}

fn public_v6(ip: Ipv6Addr) -> bool {
    let s = ip.segments();
    !(ip.is_loopback()
        || ip.is_unspecified()
        || ip.is_multicast()
        || (s[0] & 0xffc0) == 0xfe80                // link-local fe80::/10
        || (s[0] & 0xffc0) == 0xfec0                // site-local fec0::/10 (deprecated)
        || (s[0] & 0xfe00) == 0xfc00                // unique local fc00::/7 (incl. fd00:ec2::254)
        || (s[0] == 0x2001 && s[1] == 0x0db8)       // documentation 2001:db8::/32
        || (s[0] == 0x3fff && s[1] < 0x1000)        // documentation 3fff::/20
        || (s[0] == 0x0100 && s[1] == 0 && s[2] == 0 && s[3] == 0) // discard 100::/64
        || s[0] == 0x2002                           // 6to4 2002::/16
        || (s[0] == 0x0064 && s[1] == 0xff9b)       // NAT64 64:ff9b::/96 and 64:ff9b:1::/48
        || (s[0] == 0x2001 && s[1] < 0x0200)        // 2001::/23 IETF protocol assignments (Teredo, ...)
        || (s[0] == 0x5f00)) // SRv6 SIDs 5f00::/16
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
    fn refused_ranges() {
        for s in [
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "0.0.0.0",
            "0.1.2.3",
            "224.0.0.1",
            "255.255.255.255",
            "192.0.2.1",
            "198.51.100.1",
            "203.0.113.1",
            "198.18.0.1",
            "240.0.0.1",
            "192.0.0.8",
            "::1",
            "::",
            "fe80::1",
            "fc00::1",
            "fd00:ec2::254",
            "ff02::1",
            "2001:db8::1",
            "::ffff:127.0.0.1",
            "::ffff:169.254.169.254",
            "::ffff:10.0.0.1",
            "64:ff9b::a00:1",
            "2002:a00:1::",
            "100::1",
            "2001::1",
            "fec0::1",
        ] {
            assert!(!is_public(ip(s)), "{s} must be refused");
        }
    }

    #[test]
    fn public_addresses_pass() {
        for s in ["8.8.8.8", "1.1.1.1", "93.184.216.34", "2606:4700:4700::1111", "::ffff:8.8.8.8", "100.128.0.1"] {
            assert!(is_public(ip(s)), "{s} must pass");
        }
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

#[cfg(test)]
mod properties {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// An IPv4 address and its IPv4-mapped IPv6 form are classified alike.
        #[test]
        fn mapped_addresses_are_classified_like_ipv4(octets in any::<[u8; 4]>()) {
            let v4 = Ipv4Addr::from(octets);
            prop_assert_eq!(is_public(IpAddr::V4(v4)), is_public(IpAddr::V6(v4.to_ipv6_mapped())));
        }

        /// Every address of the private, loopback, link-local and CGNAT ranges is refused.
        #[test]
        fn internal_ranges_are_refused(b in any::<u8>(), c in any::<u8>(), d in any::<u8>()) {
            for ip in [
                Ipv4Addr::new(10, b, c, d),
                Ipv4Addr::new(127, b, c, d),
                Ipv4Addr::new(169, 254, c, d),
                Ipv4Addr::new(172, 16 + b % 16, c, d),
                Ipv4Addr::new(192, 168, c, d),
                Ipv4Addr::new(100, 64 + b % 64, c, d),
            ] {
                prop_assert!(!is_public(IpAddr::V4(ip)), "{}", ip);
            }
        }
    }
}

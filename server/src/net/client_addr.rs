//! The address a request came from, behind the operator's own load balancers.
//!
//! The peer of the TCP connection is the client unless it is one of the operator's
//! `trusted_proxies`; then the `X-Forwarded-For` list is read from its right end (the
//! entry the nearest proxy added), skipping further trusted proxies, and the first
//! address that is not one is the client. Entries further left were written by the
//! client itself and are never believed. With no trusted proxies (the default) the
//! header is ignored entirely, so a direct caller cannot choose its own address.
//!
//! Throttles group addresses by [`source_key`]: an IPv4 address alone, an IPv6
//! address by its /64 (one subscriber's whole network), so rotating through a /64
//! does not buy new attempts.

use ipnet::IpNet;
use std::net::{IpAddr, Ipv6Addr};

/// The client's address, given the connection's peer and its `X-Forwarded-For` values.
pub fn client_ip<'a>(peer: IpAddr, forwarded_for: impl Iterator<Item = &'a str>, trusted: &[IpNet]) -> IpAddr {
    let peer = peer.to_canonical();
    if !is_trusted(peer, trusted) {
        return peer;
    }
    let hops: Vec<&str> = forwarded_for.flat_map(|v| v.split(',')).map(str::trim).collect();
    for hop in hops.iter().rev() {
        let Some(ip) = parse_hop(hop) else {
            // A hop that is not an address: nothing left of it can be believed.
            return peer;
        };
        if !is_trusted(ip, trusted) {
            return ip;
        }
    }
    peer
}

fn is_trusted(ip: IpAddr, trusted: &[IpNet]) -> bool {
    trusted.iter().any(|net| net.contains(&ip))
}

/// An `X-Forwarded-For` entry: an address, maybe with a port (`1.2.3.4:5`, `[::1]:5`).
fn parse_hop(hop: &str) -> Option<IpAddr> {
    if let Ok(ip) = hop.parse::<IpAddr>() {
        return Some(ip.to_canonical());
    }
    if let Ok(sa) = hop.parse::<std::net::SocketAddr>() {
        return Some(sa.ip().to_canonical());
    }
    None
}

/// The throttle key of an address: IPv4 whole, IPv6 by its /64.
pub fn source_key(ip: IpAddr) -> String {
    match ip.to_canonical() {
        IpAddr::V4(v4) => v4.to_string(),
        IpAddr::V6(v6) => {
            let s = v6.segments();
            format!("{}/64", Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
        }
    }
}

/// Parses the operator's list of trusted proxies (addresses or CIDR networks).
pub fn parse_trusted(list: &[String]) -> Result<Vec<IpNet>, String> {
    list.iter()
        .map(|s| {
            let s = s.trim();
            s.parse::<IpNet>()
                .or_else(|_| s.parse::<IpAddr>().map(IpNet::from))
                .map_err(|_| format!("trusted_proxies: {s:?} is not an address or a network"))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn without_trusted_proxies_the_header_is_ignored() {
        assert_eq!(client_ip(ip("203.0.113.9"), ["1.2.3.4"].into_iter(), &[]), ip("203.0.113.9"));
    }

    #[test]
    fn behind_a_trusted_proxy_the_nearest_untrusted_hop_is_the_client() {
        let trusted = parse_trusted(&["10.0.0.0/8".into(), "127.0.0.1".into()]).unwrap();
        // The client wrote "6.6.6.6" itself; the proxies appended what they saw.
        let xff = ["6.6.6.6, 198.51.100.7", "10.1.1.1"];
        assert_eq!(client_ip(ip("127.0.0.1"), xff.into_iter(), &trusted), ip("198.51.100.7"));
        // Only trusted hops: the leftmost trusted one is as far as we can see.
        assert_eq!(client_ip(ip("10.0.0.2"), ["10.0.0.3"].into_iter(), &trusted), ip("10.0.0.2"));
        // Garbage stops the walk at the peer.
        assert_eq!(client_ip(ip("10.0.0.2"), ["1.2.3.4, nonsense"].into_iter(), &trusted), ip("10.0.0.2"));
        assert_eq!(client_ip(ip("10.0.0.2"), ["[2001:db8::1]:443"].into_iter(), &trusted), ip("2001:db8::1"));
        assert_eq!(client_ip(ip("::ffff:10.0.0.2"), ["192.0.2.4:80"].into_iter(), &trusted), ip("192.0.2.4"));
    }

    #[test]
    fn ipv6_sources_are_grouped_by_their_64() {
        assert_eq!(source_key(ip("2001:db8:1:2:aaaa::1")), source_key(ip("2001:db8:1:2:bbbb::9")));
        assert_ne!(source_key(ip("2001:db8:1:2::1")), source_key(ip("2001:db8:1:3::1")));
        assert_eq!(source_key(ip("::ffff:192.0.2.1")), "192.0.2.1");
        assert!(parse_trusted(&["not an address".into()]).is_err());
    }
}

//! Address classification for the SSRF guard: which addresses are not public, and why.
//!
//! # Shape
//!
//! Two const tables, `V4_RANGES` and `V6_RANGES`, hold every entry of the IANA IPv4 and
//! IPv6 Special-Purpose Address Registries (iana-ipv4-special-registry, updated 2025;
//! iana-ipv6-special-registry, updated 2025-10) as numeric `(base, prefix length)` pairs, plus
//! what the registries leave out: IPv4 multicast 224.0.0.0/4, IPv6 multicast ff00::/8,
//! deprecated site-local fec0::/10, deprecated IPv4-compatible ::/96 and IPv4-translated
//! ::ffff:0:0:0/96 (RFC 2765). [`classify`] finds the longest matching prefix and returns a
//! [`Special`] naming it (and any IPv4 address embedded in an IPv6 one) so callers can log
//! why an address was refused; [`is_public`] is the `bool` wrapper. Pure: no I/O.
//!
//! # Decisions
//!
//! * Every special-purpose entry is refused, whatever its "globally reachable" flag.
//!   Anycast infrastructure (AS112 192.31.196.0/24, 192.175.48.0/24, 2001:4:112::/48,
//!   2620:4f:8000::/48; AMT 192.52.193.0/24, 2001:3::/32; PCP/TURN/DNS-SD anycast;
//!   ORCHIDv2 2001:20::/28, ...) is never a legitimate webhook or media target, so the
//!   strictest rule is also the simplest. The deprecated 6to4 relay anycast 192.88.99.0/24
//!   is refused too.
//! * IPv4-mapped (::ffff:a.b.c.d), IPv4-compatible (::a.b.c.d, other than :: and ::1, which
//!   are their own entries) and IPv4-translated (::ffff:0:a.b.c.d) addresses are classified
//!   exactly as the IPv4 address they carry: a stack either reaches that IPv4 host (so its
//!   class is the right answer) or cannot route them at all. An IPv4 address and these three
//!   forms are therefore always classified alike (`::ffff:8.8.8.8` stays public, as before).
//! * NAT64 64:ff9b::/96, 6to4 2002::/16 and Teredo 2001::/32 are refused whole, even when the
//!   embedded IPv4 address is public (a translator or relay could be argued harmless, but
//!   refusing is simpler and no legitimate target needs them); [`Special::embedded`] still
//!   names the embedded address (Teredo: the de-obfuscated client) for the log. The NAT64
//!   local-use prefix 64:ff9b:1::/48 has no fixed embedding and is refused without one.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// A named special-purpose range, e.g. `Loopback 127.0.0.0/8`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Range {
    pub name: &'static str,
    pub cidr: &'static str,
}

/// Why an address is not public.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Special {
    /// The most specific range the address falls in.
    pub range: Range,
    /// The IPv4 address embedded in an IPv6 address, for ranges that embed one.
    pub embedded: Option<Ipv4Addr>,
    /// The embedded IPv4 address's own special-purpose range, if it has one.
    pub embedded_range: Option<Range>,
}

impl fmt::Display for Range {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.name, self.cidr)
    }
}

impl fmt::Display for Special {
    /// E.g. `6to4 2002::/16 embedding 127.0.0.1 (Loopback 127.0.0.0/8)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.range)?;
        if let Some(v4) = self.embedded {
            write!(f, " embedding {v4}")?;
        }
        if let Some(inner) = self.embedded_range {
            write!(f, " ({inner})")?;
        }
        Ok(())
    }
}

/// Where an IPv6 range carries an IPv4 address, and what that means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Embed {
    /// Nothing embedded.
    No,
    /// Low 32 bits; the address is classified as that IPv4 address (public if it is).
    Unwrap,
    /// Low 32 bits (NAT64); always refused.
    Low32,
    /// Bits 16..48 (6to4); always refused.
    SixToFour,
    /// Inverted low 32 bits (Teredo client); always refused.
    Teredo,
}

pub(crate) struct V4Entry {
    pub(crate) base: u32,
    pub(crate) len: u8,
    pub(crate) range: Range,
}

pub(crate) struct V6Entry {
    pub(crate) base: u128,
    pub(crate) len: u8,
    pub(crate) embed: Embed,
    pub(crate) range: Range,
}

const fn v4(a: u8, b: u8, c: u8, d: u8, len: u8, cidr: &'static str, name: &'static str) -> V4Entry {
    V4Entry { base: u32::from_be_bytes([a, b, c, d]), len, range: Range { name, cidr } }
}

/// `high` is the top 64 bits, `low` the bottom 64.
const fn v6(high: u64, low: u64, len: u8, embed: Embed, cidr: &'static str, name: &'static str) -> V6Entry {
    V6Entry { base: ((high as u128) << 64) | low as u128, len, embed, range: Range { name, cidr } }
}

/// IANA IPv4 Special-Purpose Address Registry, plus multicast.
#[rustfmt::skip]
pub(crate) const V4_RANGES: &[V4Entry] = &[
    v4(0, 0, 0, 0,         8,  "0.0.0.0/8",          "This network"),
    v4(0, 0, 0, 0,         32, "0.0.0.0/32",         "This host on this network"),
    v4(10, 0, 0, 0,        8,  "10.0.0.0/8",         "Private-Use"),
    v4(100, 64, 0, 0,      10, "100.64.0.0/10",      "Shared Address Space"),
    v4(127, 0, 0, 0,       8,  "127.0.0.0/8",        "Loopback"),
    v4(169, 254, 0, 0,     16, "169.254.0.0/16",     "Link Local"),
    v4(172, 16, 0, 0,      12, "172.16.0.0/12",      "Private-Use"),
    v4(192, 0, 0, 0,       24, "192.0.0.0/24",       "IETF Protocol Assignments"),
    v4(192, 0, 0, 0,       29, "192.0.0.0/29",       "IPv4 Service Continuity Prefix"),
    v4(192, 0, 0, 8,       32, "192.0.0.8/32",       "IPv4 dummy address"),
    v4(192, 0, 0, 9,       32, "192.0.0.9/32",       "Port Control Protocol Anycast"),
    v4(192, 0, 0, 10,      32, "192.0.0.10/32",      "Traversal Using Relays around NAT Anycast"),
    v4(192, 0, 0, 170,     32, "192.0.0.170/32",     "NAT64/DNS64 Discovery"),
    v4(192, 0, 0, 171,     32, "192.0.0.171/32",     "NAT64/DNS64 Discovery"),
    v4(192, 0, 2, 0,       24, "192.0.2.0/24",       "Documentation (TEST-NET-1)"),
    v4(192, 31, 196, 0,    24, "192.31.196.0/24",    "AS112-v4"),
    v4(192, 52, 193, 0,    24, "192.52.193.0/24",    "AMT"),
    v4(192, 88, 99, 0,     24, "192.88.99.0/24",     "Deprecated (6to4 Relay Anycast)"),
    v4(192, 168, 0, 0,     16, "192.168.0.0/16",     "Private-Use"),
    v4(192, 175, 48, 0,    24, "192.175.48.0/24",    "Direct Delegation AS112 Service"),
    v4(198, 18, 0, 0,      15, "198.18.0.0/15",      "Benchmarking"),
    v4(198, 51, 100, 0,    24, "198.51.100.0/24",    "Documentation (TEST-NET-2)"),
    v4(203, 0, 113, 0,     24, "203.0.113.0/24",     "Documentation (TEST-NET-3)"),
    v4(224, 0, 0, 0,       4,  "224.0.0.0/4",        "Multicast"),
    v4(240, 0, 0, 0,       4,  "240.0.0.0/4",        "Reserved"),
    v4(255, 255, 255, 255, 32, "255.255.255.255/32", "Limited Broadcast"),
];

/// IANA IPv6 Special-Purpose Address Registry, plus multicast, site-local and the
/// deprecated IPv4-compatible and IPv4-translated forms.
#[rustfmt::skip]
pub(crate) const V6_RANGES: &[V6Entry] = &[
    v6(0,                     0,                     128, Embed::No,        "::/128",            "Unspecified Address"),
    v6(0,                     1,                     128, Embed::No,        "::1/128",           "Loopback Address"),
    v6(0,                     0,                     96,  Embed::Unwrap,    "::/96",             "IPv4-compatible (deprecated)"),
    v6(0,                     0x0000_ffff_0000_0000, 96,  Embed::Unwrap,    "::ffff:0:0/96",     "IPv4-mapped Address"),
    v6(0,                     0xffff_0000_0000_0000, 96,  Embed::Unwrap,    "::ffff:0:0:0/96",   "IPv4-translated Address"),
    v6(0x0064_ff9b_0000_0000, 0,                     96,  Embed::Low32,     "64:ff9b::/96",      "IPv4-IPv6 Translation"),
    v6(0x0064_ff9b_0001_0000, 0,                     48,  Embed::No,        "64:ff9b:1::/48",    "IPv4-IPv6 Translation (local use)"),
    v6(0x0100_0000_0000_0000, 0,                     64,  Embed::No,        "100::/64",          "Discard-Only Address Block"),
    v6(0x0100_0000_0000_0001, 0,                     64,  Embed::No,        "100:0:0:1::/64",    "Dummy IPv6 Prefix"),
    v6(0x2001_0000_0000_0000, 0,                     23,  Embed::No,        "2001::/23",         "IETF Protocol Assignments"),
    v6(0x2001_0000_0000_0000, 0,                     32,  Embed::Teredo,    "2001::/32",         "TEREDO"),
    v6(0x2001_0001_0000_0000, 1,                     128, Embed::No,        "2001:1::1/128",     "Port Control Protocol Anycast"),
    v6(0x2001_0001_0000_0000, 2,                     128, Embed::No,        "2001:1::2/128",     "Traversal Using Relays around NAT Anycast"),
    v6(0x2001_0001_0000_0000, 3,                     128, Embed::No,        "2001:1::3/128",     "DNS-SD Service Registration Protocol Anycast"),
    v6(0x2001_0002_0000_0000, 0,                     48,  Embed::No,        "2001:2::/48",       "Benchmarking"),
    v6(0x2001_0003_0000_0000, 0,                     32,  Embed::No,        "2001:3::/32",       "AMT"),
    v6(0x2001_0004_0112_0000, 0,                     48,  Embed::No,        "2001:4:112::/48",   "AS112-v6"),
    v6(0x2001_0010_0000_0000, 0,                     28,  Embed::No,        "2001:10::/28",      "Deprecated (previously ORCHID)"),
    v6(0x2001_0020_0000_0000, 0,                     28,  Embed::No,        "2001:20::/28",      "ORCHIDv2"),
    v6(0x2001_0030_0000_0000, 0,                     28,  Embed::No,        "2001:30::/28",      "Drone Remote ID Protocol Entity Tags (DETs) Prefix"),
    v6(0x2001_0db8_0000_0000, 0,                     32,  Embed::No,        "2001:db8::/32",     "Documentation"),
    v6(0x2002_0000_0000_0000, 0,                     16,  Embed::SixToFour, "2002::/16",         "6to4"),
    v6(0x2620_004f_8000_0000, 0,                     48,  Embed::No,        "2620:4f:8000::/48", "Direct Delegation AS112 Service"),
    v6(0x3fff_0000_0000_0000, 0,                     20,  Embed::No,        "3fff::/20",         "Documentation"),
    v6(0x5f00_0000_0000_0000, 0,                     16,  Embed::No,        "5f00::/16",         "Segment Routing (SRv6) SIDs"),
    v6(0xfc00_0000_0000_0000, 0,                     7,   Embed::No,        "fc00::/7",          "Unique-Local"),
    v6(0xfe80_0000_0000_0000, 0,                     10,  Embed::No,        "fe80::/10",         "Link-Local Unicast"),
    v6(0xfec0_0000_0000_0000, 0,                     10,  Embed::No,        "fec0::/10",         "Site-Local (deprecated)"),
    v6(0xff00_0000_0000_0000, 0,                     8,   Embed::No,        "ff00::/8",          "Multicast"),
];

/// Whether `ip` is a public unicast address: in no special-purpose range (see the module docs).
pub fn is_public(ip: IpAddr) -> bool {
    classify(ip).is_none()
}

/// Why `ip` is not public, or `None` if it is.
pub fn classify(ip: IpAddr) -> Option<Special> {
    match ip {
        IpAddr::V4(v4) => classify_v4(v4),
        IpAddr::V6(v6) => classify_v6(v6),
    }
}

/// [`classify`] for an IPv4 address.
pub fn classify_v4(ip: Ipv4Addr) -> Option<Special> {
    v4_range(ip).map(|range| Special { range, embedded: None, embedded_range: None })
}

/// [`classify`] for an IPv6 address.
pub fn classify_v6(ip: Ipv6Addr) -> Option<Special> {
    let bits = u128::from(ip);
    let entry = V6_RANGES
        .iter()
        .filter(|e| bits & u128::MAX.checked_shl(128 - u32::from(e.len)).unwrap_or(0) == e.base)
        .max_by_key(|e| e.len)?;
    let embedded = match entry.embed {
        Embed::No => None,
        Embed::Unwrap | Embed::Low32 => Some(bits as u32),
        Embed::SixToFour => Some((bits >> 80) as u32),
        Embed::Teredo => Some(!(bits as u32)),
    }
    .map(Ipv4Addr::from);
    let embedded_range = embedded.and_then(v4_range);
    if entry.embed == Embed::Unwrap && embedded_range.is_none() {
        return None;
    }
    Some(Special { range: entry.range, embedded, embedded_range })
}

fn v4_range(ip: Ipv4Addr) -> Option<Range> {
    let bits = u32::from(ip);
    V4_RANGES
        .iter()
        .filter(|e| bits & u32::MAX.checked_shl(32 - u32::from(e.len)).unwrap_or(0) == e.base)
        .max_by_key(|e| e.len)
        .map(|e| e.range)
}

#[cfg(test)]
#[path = "ranges_tests.rs"]
mod tests;

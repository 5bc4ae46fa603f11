//! Tests for [`super`] against an independent table: the registries copied again as plain
//! `(CIDR, name)` text, parsed by a small CIDR parser of its own and matched bit by bit, so a
//! typo in the production constants does not hide behind the same typo here.

use super::{Range, Special, V4_RANGES, V6_RANGES, classify, classify_v4, is_public};
use proptest::prelude::*;
use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::LazyLock;

/// IANA IPv4 Special-Purpose Address Registry, plus multicast. All refused.
const V4_TABLE: &[(&str, &str)] = &[
    ("0.0.0.0/8", "This network"),
    ("0.0.0.0/32", "This host on this network"),
    ("10.0.0.0/8", "Private-Use"),
    ("100.64.0.0/10", "Shared Address Space"),
    ("127.0.0.0/8", "Loopback"),
    ("169.254.0.0/16", "Link Local"),
    ("172.16.0.0/12", "Private-Use"),
    ("192.0.0.0/24", "IETF Protocol Assignments"),
    ("192.0.0.0/29", "IPv4 Service Continuity Prefix"),
    ("192.0.0.8/32", "IPv4 dummy address"),
    ("192.0.0.9/32", "Port Control Protocol Anycast"),
    ("192.0.0.10/32", "Traversal Using Relays around NAT Anycast"),
    ("192.0.0.170/32", "NAT64/DNS64 Discovery"),
    ("192.0.0.171/32", "NAT64/DNS64 Discovery"),
    ("192.0.2.0/24", "Documentation (TEST-NET-1)"),
    ("192.31.196.0/24", "AS112-v4"),
    ("192.52.193.0/24", "AMT"),
    ("192.88.99.0/24", "Deprecated (6to4 Relay Anycast)"),
    ("192.168.0.0/16", "Private-Use"),
    ("192.175.48.0/24", "Direct Delegation AS112 Service"),
    ("198.18.0.0/15", "Benchmarking"),
    ("198.51.100.0/24", "Documentation (TEST-NET-2)"),
    ("203.0.113.0/24", "Documentation (TEST-NET-3)"),
    ("224.0.0.0/4", "Multicast"),
    ("240.0.0.0/4", "Reserved"),
    ("255.255.255.255/32", "Limited Broadcast"),
];

/// IANA IPv6 Special-Purpose Address Registry (less the IPv4-mapped entry, below), plus
/// multicast and site-local. All refused, whatever they embed.
const V6_TABLE: &[(&str, &str)] = &[
    ("::1/128", "Loopback Address"),
    ("::/128", "Unspecified Address"),
    ("64:ff9b::/96", "IPv4-IPv6 Translation"),
    ("64:ff9b:1::/48", "IPv4-IPv6 Translation (local use)"),
    ("100::/64", "Discard-Only Address Block"),
    ("100:0:0:1::/64", "Dummy IPv6 Prefix"),
    ("2001::/23", "IETF Protocol Assignments"),
    ("2001::/32", "TEREDO"),
    ("2001:1::1/128", "Port Control Protocol Anycast"),
    ("2001:1::2/128", "Traversal Using Relays around NAT Anycast"),
    ("2001:1::3/128", "DNS-SD Service Registration Protocol Anycast"),
    ("2001:2::/48", "Benchmarking"),
    ("2001:3::/32", "AMT"),
    ("2001:4:112::/48", "AS112-v6"),
    ("2001:10::/28", "Deprecated (previously ORCHID)"),
    ("2001:20::/28", "ORCHIDv2"),
    ("2001:30::/28", "Drone Remote ID Protocol Entity Tags (DETs) Prefix"),
    ("2001:db8::/32", "Documentation"),
    ("2002::/16", "6to4"),
    ("2620:4f:8000::/48", "Direct Delegation AS112 Service"),
    ("3fff::/20", "Documentation"),
    ("5f00::/16", "Segment Routing (SRv6) SIDs"),
    ("fc00::/7", "Unique-Local"),
    ("fe80::/10", "Link-Local Unicast"),
    ("fec0::/10", "Site-Local (deprecated)"),
    ("ff00::/8", "Multicast"),
];

/// IPv6 forms classified as the IPv4 address in their last four bytes (:: and ::1 excepted).
const V6_UNWRAPPED: &[(&str, &str)] = &[
    ("::/96", "IPv4-compatible (deprecated)"),
    ("::ffff:0:0/96", "IPv4-mapped Address"),
    ("::ffff:0:0:0/96", "IPv4-translated Address"),
];

// ---- the independent table: parser and matcher ----

#[derive(Debug)]
struct Net {
    bytes: Vec<u8>,
    len: usize,
    cidr: &'static str,
    name: &'static str,
    unwrapped: bool,
}

fn parse_v4(s: &str) -> Vec<u8> {
    let bytes: Vec<u8> = s.split('.').map(|p| p.parse::<u8>().unwrap()).collect();
    assert_eq!(bytes.len(), 4, "{s}");
    bytes
}

fn parse_v6(s: &str) -> Vec<u8> {
    let groups = |part: &str| -> Vec<u16> {
        if part.is_empty() { vec![] } else { part.split(':').map(|g| u16::from_str_radix(g, 16).unwrap()).collect() }
    };
    let all = match s.split_once("::") {
        Some((head, tail)) => {
            let (head, tail) = (groups(head), groups(tail));
            let zeros = vec![0; 8 - head.len() - tail.len()];
            [head, zeros, tail].concat()
        }
        None => groups(s),
    };
    assert_eq!(all.len(), 8, "{s}");
    all.iter().flat_map(|g| [(g >> 8) as u8, (g & 0xff) as u8]).collect()
}

fn parse_net(cidr: &'static str, name: &'static str, unwrapped: bool) -> Net {
    let (addr, len) = cidr.split_once('/').unwrap();
    let bytes = if addr.contains(':') { parse_v6(addr) } else { parse_v4(addr) };
    let len: usize = len.parse().unwrap();
    assert!(len <= bytes.len() * 8, "{cidr}");
    Net { bytes, len, cidr, name, unwrapped }
}

fn bit(bytes: &[u8], i: usize) -> bool {
    (bytes[i / 8] >> (7 - i % 8)) & 1 == 1
}

fn contains(net: &Net, addr: &[u8]) -> bool {
    net.bytes.len() == addr.len() && (0..net.len).all(|i| bit(&net.bytes, i) == bit(addr, i))
}

static V4_NETS: LazyLock<Vec<Net>> = LazyLock::new(|| V4_TABLE.iter().map(|&(c, n)| parse_net(c, n, false)).collect());
static V6_NETS: LazyLock<Vec<Net>> = LazyLock::new(|| {
    let refused = V6_TABLE.iter().map(|&(c, n)| parse_net(c, n, false));
    refused.chain(V6_UNWRAPPED.iter().map(|&(c, n)| parse_net(c, n, true))).collect()
});
static ALL_NETS: LazyLock<Vec<&'static Net>> = LazyLock::new(|| V4_NETS.iter().chain(V6_NETS.iter()).collect());

fn most_specific<'a>(nets: &'a [Net], addr: &[u8]) -> Option<&'a Net> {
    let mut best: Option<&Net> = None;
    for net in nets.iter().filter(|n| contains(n, addr)) {
        if best.is_none_or(|b| net.len > b.len) {
            best = Some(net);
        }
    }
    best
}

fn range_of(net: &Net) -> Range {
    Range { name: net.name, cidr: net.cidr }
}

fn v4_of(bytes: &[u8]) -> Ipv4Addr {
    Ipv4Addr::new(bytes[0], bytes[1], bytes[2], bytes[3])
}

/// What the table says `classify` must return.
fn expected(ip: IpAddr) -> Option<Special> {
    match ip {
        IpAddr::V4(a) => most_specific(&V4_NETS, &a.octets()).map(|n| Special {
            range: range_of(n),
            embedded: None,
            embedded_range: None,
        }),
        IpAddr::V6(a) => {
            let o = a.octets();
            let net = most_specific(&V6_NETS, &o)?;
            let embedded = match net.cidr {
                "2002::/16" => Some(v4_of(&o[2..6])),
                "2001::/32" => Some(v4_of(&[o[12] ^ 0xff, o[13] ^ 0xff, o[14] ^ 0xff, o[15] ^ 0xff])),
                "64:ff9b::/96" => Some(v4_of(&o[12..])),
                _ if net.unwrapped => Some(v4_of(&o[12..])),
                _ => None,
            };
            let embedded_range = embedded.and_then(|v4| most_specific(&V4_NETS, &v4.octets())).map(range_of);
            if net.unwrapped && embedded_range.is_none() {
                return None;
            }
            Some(Special { range: range_of(net), embedded, embedded_range })
        }
    }
}

fn to_ip(bytes: &[u8]) -> IpAddr {
    match bytes.len() {
        4 => IpAddr::V4(v4_of(bytes)),
        _ => IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(bytes).unwrap())),
    }
}

/// The network's bits, then `fill` bits for the host part.
fn in_net(net: &Net, fill: &[u8]) -> Vec<u8> {
    let mut out = net.bytes.clone();
    for i in net.len..out.len() * 8 {
        let mask = 1u8 << (7 - i % 8);
        out[i / 8] = (out[i / 8] & !mask) | (fill[i / 8] & mask);
    }
    out
}

/// `bytes` plus `delta` (±1) as a big-endian integer; `None` on wrap-around.
fn step(bytes: &[u8], up: bool) -> Option<Vec<u8>> {
    let mut out = bytes.to_vec();
    for b in out.iter_mut().rev() {
        let (v, carry) = if up { b.overflowing_add(1) } else { b.overflowing_sub(1) };
        *b = v;
        if !carry {
            return Some(out);
        }
    }
    None
}

fn check(ip: IpAddr) -> Result<(), TestCaseError> {
    let want = expected(ip);
    prop_assert_eq!(is_public(ip), want.is_none(), "{}", ip);
    prop_assert_eq!(classify(ip), want, "{}", ip);
    Ok(())
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

// ---- the table itself, and the production table against it ----

#[test]
fn table_entries_have_no_host_bits() {
    for net in ALL_NETS.iter() {
        assert_eq!(in_net(net, &[0; 16]), net.bytes, "{}", net.cidr);
    }
}

#[test]
fn production_table_lists_the_same_ranges() {
    let prod: BTreeSet<_> =
        V4_RANGES.iter().map(|e| e.range).chain(V6_RANGES.iter().map(|e| e.range)).map(|r| (r.cidr, r.name)).collect();
    let table: BTreeSet<_> = ALL_NETS.iter().map(|n| (n.cidr, n.name)).collect();
    assert_eq!(prod, table);
}

#[test]
fn production_cidr_text_matches_its_numbers() {
    for e in V4_RANGES {
        let (addr, len) = e.range.cidr.split_once('/').unwrap();
        assert_eq!((addr.parse::<Ipv4Addr>().unwrap(), len.parse::<u8>().unwrap()), (Ipv4Addr::from(e.base), e.len));
    }
    for e in V6_RANGES {
        let (addr, len) = e.range.cidr.split_once('/').unwrap();
        assert_eq!((addr.parse::<Ipv6Addr>().unwrap(), len.parse::<u8>().unwrap()), (Ipv6Addr::from(e.base), e.len));
    }
}

// ---- boundaries ----

#[test]
fn first_and_last_of_each_range_and_their_neighbours() {
    for net in ALL_NETS.iter() {
        let first = in_net(net, &[0; 16]);
        let last = in_net(net, &[0xff; 16]);
        if !net.unwrapped {
            assert!(!is_public(to_ip(&first)), "{} first", net.cidr);
            assert!(!is_public(to_ip(&last)), "{} last", net.cidr);
        }
        let below = step(&first, false);
        let above = step(&last, true);
        for addr in [Some(first), Some(last), below, above].into_iter().flatten() {
            let ip = to_ip(&addr);
            assert_eq!(classify(ip), expected(ip), "{ip} near {}", net.cidr);
        }
    }
}

// ---- the bypasses from the bug report, and the old list ----

fn teredo(server: Ipv4Addr, flags: u16, port: u16, client: Ipv4Addr) -> Ipv6Addr {
    let (s, c) = (u32::from(server), !u32::from(client));
    let segs = [0x2001, 0, (s >> 16) as u16, s as u16, flags, !port, (c >> 16) as u16, c as u16];
    Ipv6Addr::from(segs)
}

#[test]
fn reported_bypasses_are_refused_and_named() {
    let teredo_loopback = teredo(Ipv4Addr::new(65, 54, 227, 120), 0x8000, 40000, Ipv4Addr::LOCALHOST);
    assert_eq!(teredo_loopback, "2001:0:4136:e378:8000:63bf:80ff:fffe".parse::<Ipv6Addr>().unwrap());
    for (addr, log) in [
        ("::127.0.0.1", "IPv4-compatible (deprecated) ::/96 embedding 127.0.0.1 (Loopback 127.0.0.0/8)"),
        ("::ffff:0:127.0.0.1", "IPv4-translated Address ::ffff:0:0:0/96 embedding 127.0.0.1 (Loopback 127.0.0.0/8)"),
        ("::ffff:127.0.0.1", "IPv4-mapped Address ::ffff:0:0/96 embedding 127.0.0.1 (Loopback 127.0.0.0/8)"),
        ("192.88.99.1", "Deprecated (6to4 Relay Anycast) 192.88.99.0/24"),
        ("64:ff9b::7f00:1", "IPv4-IPv6 Translation 64:ff9b::/96 embedding 127.0.0.1 (Loopback 127.0.0.0/8)"),
        ("2002:7f00:1::", "6to4 2002::/16 embedding 127.0.0.1 (Loopback 127.0.0.0/8)"),
        ("2001:0:4136:e378:8000:63bf:80ff:fffe", "TEREDO 2001::/32 embedding 127.0.0.1 (Loopback 127.0.0.0/8)"),
        (
            "::ffff:169.254.169.254",
            "IPv4-mapped Address ::ffff:0:0/96 embedding 169.254.169.254 (Link Local 169.254.0.0/16)",
        ),
        ("2002:808:808::1", "6to4 2002::/16 embedding 8.8.8.8"),
        ("64:ff9b::8.8.8.8", "IPv4-IPv6 Translation 64:ff9b::/96 embedding 8.8.8.8"),
        ("64:ff9b:1::7f00:1", "IPv4-IPv6 Translation (local use) 64:ff9b:1::/48"),
        ("::", "Unspecified Address ::/128"),
        ("::1", "Loopback Address ::1/128"),
        ("0.0.0.0", "This host on this network 0.0.0.0/32"),
        ("255.255.255.255", "Limited Broadcast 255.255.255.255/32"),
        ("192.0.0.9", "Port Control Protocol Anycast 192.0.0.9/32"),
        ("2001:1::3", "DNS-SD Service Registration Protocol Anycast 2001:1::3/128"),
    ] {
        let found = classify(ip(addr)).unwrap_or_else(|| panic!("{addr} must be refused"));
        assert_eq!(found.to_string(), log, "{addr}");
    }
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
        "192.31.196.1",
        "192.52.193.1",
        "192.175.48.1",
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
        "::10.0.0.1",
        "::ffff:0:10.0.0.1",
        "64:ff9b::a00:1",
        "64:ff9b::808:808",
        "2002:a00:1::",
        "2002:808:808::",
        "100::1",
        "100:0:0:1::1",
        "2001::1",
        "2001:3::1",
        "2001:4:112::1",
        "2001:20::1",
        "2001:30::1",
        "2620:4f:8000::1",
        "3fff::1",
        "5f00::1",
        "fec0::1",
    ] {
        assert!(!is_public(ip(s)), "{s} must be refused");
    }
}

#[test]
fn public_addresses_pass() {
    for s in [
        "8.8.8.8",
        "1.1.1.1",
        "93.184.216.34",
        "2606:4700:4700::1111",
        "::ffff:8.8.8.8",
        "::8.8.8.8",
        "::ffff:0:8.8.8.8",
        "100.128.0.1",
        "192.88.98.255",
        "192.88.100.0",
        "2001:200::1",
        "2620:4f:8001::1",
        "3fff:1000::1",
    ] {
        assert!(is_public(ip(s)), "{s} must pass");
    }
}

// ---- properties ----

/// An address inside a random table entry (every entry equally likely), random host bits.
fn biased() -> impl Strategy<Value = (&'static Net, Vec<u8>)> {
    (0..ALL_NETS.len(), any::<[u8; 16]>()).prop_map(|(i, fill)| {
        let net = ALL_NETS[i];
        (net, in_net(net, &fill))
    })
}

/// An IPv4 address: uniform, or inside a random IPv4 table entry.
fn any_v4() -> impl Strategy<Value = Ipv4Addr> {
    let inside = (0..V4_NETS.len(), any::<[u8; 4]>()).prop_map(|(i, fill)| v4_of(&in_net(&V4_NETS[i], &fill)));
    prop_oneof![any::<u32>().prop_map(Ipv4Addr::from), inside]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(4096))]

    #[test]
    fn uniform_v4_agrees_with_table(x in any::<u32>()) {
        check(IpAddr::V4(Ipv4Addr::from(x)))?;
    }

    #[test]
    fn uniform_v6_agrees_with_table(x in any::<u128>()) {
        check(IpAddr::V6(Ipv6Addr::from(x)))?;
    }

    /// Low IPv6 space (top 64 bits mostly zero) where the small embedding ranges live.
    #[test]
    fn low_v6_agrees_with_table(high in any::<u16>(), low in any::<u64>()) {
        check(IpAddr::V6(Ipv6Addr::from((u128::from(high) << 64) | u128::from(low))))?;
    }

    /// Every range exercised: an address inside it is refused (unless it merely wraps a
    /// public IPv4 address) and classified as the table says.
    #[test]
    fn addresses_inside_each_range((net, addr) in biased()) {
        let ip = to_ip(&addr);
        if !net.unwrapped {
            prop_assert!(!is_public(ip), "{} in {}", ip, net.cidr);
        }
        check(ip)?;
    }

    /// One prefix bit flipped: just outside the range, classified as the table says.
    #[test]
    fn near_misses_agree_with_table((net, addr) in biased(), flip in any::<usize>()) {
        prop_assume!(net.len > 0);
        let mut addr = addr;
        let i = flip % net.len;
        addr[i / 8] ^= 1 << (7 - i % 8);
        check(to_ip(&addr))?;
    }

    /// An IPv4 address and its mapped, compatible and translated forms are classified alike.
    #[test]
    fn embedded_forms_classified_like_ipv4(v4 in any_v4()) {
        let public = is_public(IpAddr::V4(v4));
        let [a, b, c, d] = v4.octets();
        let mapped = Ipv6Addr::from([0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, a, b, c, d]);
        let compatible = Ipv6Addr::from([0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, a, b, c, d]);
        let translated = Ipv6Addr::from([0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0, 0, a, b, c, d]);
        prop_assert_eq!(mapped, v4.to_ipv6_mapped());
        for form in [mapped, compatible, translated] {
            prop_assert_eq!(is_public(IpAddr::V6(form)), public, "{} vs {}", form, v4);
            check(IpAddr::V6(form))?;
        }
        // :: and ::1 are their own entries; every other refused form names the IPv4 reason.
        if !public && u32::from(v4) > 1 {
            let inner = classify_v4(v4).map(|s| s.range);
            for form in [mapped, compatible, translated] {
                let found = classify(IpAddr::V6(form)).unwrap();
                prop_assert_eq!((found.embedded, found.embedded_range), (Some(v4), inner));
            }
        }
    }

    /// 6to4, NAT64 and Teredo are refused whatever they embed, and name the embedded address.
    #[test]
    fn tunnels_refused_and_name_embedded(v4 in any_v4(), rest in any::<u128>(), server in any::<u32>(), port in any::<u16>(), flags in any::<u16>()) {
        let [a, b, c, d] = v4.octets();
        let six_to_four = Ipv6Addr::from((0x2002u128 << 112) | (u128::from(u32::from(v4)) << 80) | (rest & ((1u128 << 80) - 1)));
        prop_assert_eq!(&six_to_four.octets()[..6], &[0x20, 0x02, a, b, c, d]);
        let nat64 = Ipv6Addr::from([0, 0x64, 0xff, 0x9b, 0, 0, 0, 0, 0, 0, 0, 0, a, b, c, d]);
        let teredo = teredo(Ipv4Addr::from(server), flags, port, v4);
        for (addr, cidr) in [(six_to_four, "2002::/16"), (nat64, "64:ff9b::/96"), (teredo, "2001::/32")] {
            let found = classify(IpAddr::V6(addr));
            prop_assert!(found.is_some(), "{}", addr);
            let found = found.unwrap();
            prop_assert_eq!(found.range.cidr, cidr);
            prop_assert_eq!(found.embedded, Some(v4));
            prop_assert_eq!(found.embedded_range, classify_v4(v4).map(|s| s.range));
        }
    }
}

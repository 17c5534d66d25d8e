//! Which IP addresses are the server's own networks (loopback, private, link-local where
//! cloud metadata answers, and the like): the one classification of every address the server
//! dials on someone's behalf (a webhook's receiver; the egress proxy's onward connections),
//! IPv6 forms that carry an IPv4 address included.
//!
//! An IPv6 address can lead to the IPv4 address written inside it: IPv4-mapped
//! (`::ffff:a.b.c.d`), IPv4-compatible (`::a.b.c.d`), SIIT (`::ffff:0:a.b.c.d`), 6to4
//! (`2002:AABB:CCDD::/48`), Teredo (`2001:0::/32`: the server's IPv4 in bits 32..64, the
//! client's in the last 32 bits, each bit inverted) and NAT64 (`64:ff9b::/96`, and the
//! local-use `64:ff9b:1::/48` of RFC 8215). Such an address is internal when the IPv6 address
//! itself is, or when an IPv4 address it carries is.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// How an IPv6 address carries an IPv4 address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Embedding {
    /// `::ffff:0:0/96`.
    Mapped,
    /// `::/96` (deprecated IPv4-compatible addresses).
    Compatible,
    /// `::ffff:0:0:0/96` (SIIT, RFC 2765).
    Siit,
    /// `2002::/16`: the IPv4 address in bits 16..48.
    SixToFour,
    /// `2001:0::/32`: the Teredo server's IPv4 address in bits 32..64.
    TeredoServer,
    /// `2001:0::/32`: the Teredo client's IPv4 address, the last 32 bits inverted.
    TeredoClient,
    /// `64:ff9b::/96` (RFC 6052): the IPv4 address in the last 32 bits.
    Nat64,
    /// `64:ff9b:1::/48` (RFC 8215): a local translator's prefix of 48, 56, 64 or 96 bits,
    /// which the address does not tell; every RFC 6052 position is read.
    Nat64Local,
}

impl Embedding {
    /// The form's name, as an error shows it.
    pub fn name(self) -> &'static str {
        match self {
            Embedding::Mapped => "IPv4-mapped",
            Embedding::Compatible => "IPv4-compatible",
            Embedding::Siit => "SIIT",
            Embedding::SixToFour => "6to4",
            Embedding::TeredoServer => "Teredo (server)",
            Embedding::TeredoClient => "Teredo (client)",
            Embedding::Nat64 => "NAT64",
            Embedding::Nat64Local => "local-use NAT64",
        }
    }
}

/// Why an address is internal: the kind of network, and the IPv4 address inside an IPv6
/// one that made it so.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Internal {
    /// The kind of network (`loopback`, `private`, ...).
    pub kind: &'static str,
    /// The carried IPv4 address that is internal, and how it is carried; `None` when the
    /// address itself is.
    pub via: Option<(Embedding, Ipv4Addr)>,
}

impl fmt::Display for Internal {
    /// `loopback`, or `loopback, the 6to4 form of 127.0.0.1`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.via {
            None => f.write_str(self.kind),
            Some((embedding, v4)) => {
                write!(f, "{}, the {} form of {v4}", self.kind, embedding.name())
            }
        }
    }
}

/// Why `address` is internal, or `None` for a public address.
pub fn internal(address: IpAddr) -> Option<Internal> {
    refused(address, |_| false)
}

/// Why `address` may not be reached, or `None`: a public address, or an internal one that
/// `allowed` lets through. `allowed` is asked about the address itself and, for an IPv6
/// address, about each internal IPv4 address it carries: allowing an IPv4 address allows its
/// IPv6 forms too.
pub fn refused(address: IpAddr, allowed: impl Fn(IpAddr) -> bool) -> Option<Internal> {
    let v6 = match address {
        IpAddr::V4(v4) => {
            let kind = internal_v4(v4)?;
            return (!allowed(address)).then_some(Internal { kind, via: None });
        }
        IpAddr::V6(v6) => v6,
    };
    if allowed(address) {
        return None;
    }
    if let Some(kind) = internal_v6(v6) {
        return Some(Internal { kind, via: None });
    }
    let carried = embedded(v6);
    // A local translator's prefix length is unknown: an IPv4 address read at a position
    // that leaves `0.0.0.0/8` is no address a translator sends to (the other positions
    // decide), unless every position does.
    let local_zero = |(embedding, v4): &(Embedding, Ipv4Addr)| {
        *embedding == Embedding::Nat64Local && v4.octets()[0] == 0
    };
    let all_local_zero = !carried.is_empty() && carried.iter().all(local_zero);
    carried
        .iter()
        .filter(|carried| all_local_zero || !local_zero(carried))
        .find_map(|&(embedding, v4)| {
            let kind = internal_v4(v4)?;
            (!allowed(IpAddr::V4(v4))).then_some(Internal {
                kind,
                via: Some((embedding, v4)),
            })
        })
}

/// The IPv4 addresses an IPv6 address carries, and how.
pub fn embedded(v6: Ipv6Addr) -> Vec<(Embedding, Ipv4Addr)> {
    let bits = u128::from(v6);
    let s = v6.segments();
    // The 32 bits that end `end` bits into the address.
    let at = |end: u32| Ipv4Addr::from((bits >> (128 - end)) as u32);
    let mut carried = Vec::new();
    match s {
        [0, 0, 0, 0, 0, 0xffff, ..] => carried.push((Embedding::Mapped, at(128))),
        [0, 0, 0, 0, 0xffff, 0, ..] => carried.push((Embedding::Siit, at(128))),
        [0, 0, 0, 0, 0, 0, ..] => carried.push((Embedding::Compatible, at(128))),
        [0x2002, ..] => carried.push((Embedding::SixToFour, at(48))),
        [0x2001, 0, ..] => {
            carried.push((Embedding::TeredoServer, at(64)));
            carried.push((Embedding::TeredoClient, Ipv4Addr::from(!(bits as u32))));
        }
        [0x64, 0xff9b, 0, 0, 0, 0, ..] => carried.push((Embedding::Nat64, at(128))),
        [0x64, 0xff9b, 1, ..] => {
            // RFC 6052: bits 64..72 are zero, so an IPv4 address that would cross them is
            // split around them.
            let split = |high_end: u32, high_bits: u32| {
                let high = (bits >> (128 - high_end)) & ((1 << high_bits) - 1);
                let low_bits = 32 - high_bits;
                let low = (bits >> (128 - 72 - low_bits)) & ((1 << low_bits) - 1);
                Ipv4Addr::from(((high << low_bits) | low) as u32)
            };
            carried.push((Embedding::Nat64Local, split(64, 16))); // a /48 prefix
            carried.push((Embedding::Nat64Local, split(64, 8))); // a /56 prefix
            carried.push((Embedding::Nat64Local, at(104))); // a /64 prefix
            carried.push((Embedding::Nat64Local, at(128))); // a /96 prefix
        }
        _ => {}
    }
    carried
}

/// The kind of internal IPv4 address `v4` is, or `None` for a public one.
fn internal_v4(v4: Ipv4Addr) -> Option<&'static str> {
    let [a, b, c, _] = v4.octets();
    Some(if v4.is_loopback() {
        "loopback"
    } else if v4.is_private() {
        "private"
    } else if v4.is_link_local() {
        "link-local (cloud metadata)"
    } else if a == 100 && (b & 0xc0) == 64 {
        "shared (carrier-grade NAT, cloud metadata)"
    } else if a == 0 {
        "unspecified"
    } else if a == 192 && b == 0 && c == 0 {
        "IETF protocol assignment"
    } else if v4.is_broadcast() || v4.is_multicast() || a >= 240 {
        "broadcast, multicast or reserved"
    } else {
        return None;
    })
}

/// The kind of internal IPv6 address `v6` is by its own prefix, or `None`.
fn internal_v6(v6: Ipv6Addr) -> Option<&'static str> {
    let first = v6.segments()[0];
    Some(if v6.is_loopback() {
        "loopback"
    } else if v6.is_unspecified() {
        "unspecified"
    } else if first & 0xfe00 == 0xfc00 {
        "private (unique local, cloud metadata)"
    } else if first & 0xffc0 == 0xfe80 {
        "link-local"
    } else if v6.is_multicast() {
        "multicast"
    } else {
        return None;
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(text: &str) -> IpAddr {
        text.parse().expect("an address")
    }

    /// Each address and the kind it is (`None`: public), with the IPv4 address that made it
    /// internal.
    #[test]
    fn addresses_are_classified_with_the_ipv4_they_carry() {
        /// The kind, and the carried IPv4 address that made it internal.
        type Expected = Option<(&'static str, Option<&'static str>)>;
        let table: &[(&str, Expected)] = &[
            ("127.0.0.1", Some(("loopback", None))),
            ("10.1.2.3", Some(("private", None))),
            (
                "169.254.169.254",
                Some(("link-local (cloud metadata)", None)),
            ),
            (
                "100.100.100.200",
                Some(("shared (carrier-grade NAT, cloud metadata)", None)),
            ),
            ("0.0.0.0", Some(("unspecified", None))),
            ("192.0.0.192", Some(("IETF protocol assignment", None))),
            (
                "255.255.255.255",
                Some(("broadcast, multicast or reserved", None)),
            ),
            ("93.184.216.34", None),
            ("::1", Some(("loopback", None))),
            ("::", Some(("unspecified", None))),
            (
                "fd00:ec2::254",
                Some(("private (unique local, cloud metadata)", None)),
            ),
            ("fe80::1", Some(("link-local", None))),
            ("ff02::1", Some(("multicast", None))),
            ("2606:4700::1111", None),
            // The IPv4 carried inside.
            ("::ffff:127.0.0.1", Some(("loopback", Some("127.0.0.1")))),
            ("::ffff:8.8.8.8", None),
            ("::127.0.0.1", Some(("loopback", Some("127.0.0.1")))),
            ("::8.8.8.8", None),
            ("::ffff:0:127.0.0.1", Some(("loopback", Some("127.0.0.1")))),
            (
                "::ffff:0:169.254.169.254",
                Some(("link-local (cloud metadata)", Some("169.254.169.254"))),
            ),
            ("::ffff:0:8.8.8.8", None),
            ("2002:7f00:1::", Some(("loopback", Some("127.0.0.1")))),
            (
                "2002:a9fe:a9fe:1234::1",
                Some(("link-local (cloud metadata)", Some("169.254.169.254"))),
            ),
            ("2002:808:808::1", None),
            // Teredo: server 65.54.227.120 (public); client 127.0.0.1 inverted is 80ff:fffe.
            (
                "2001:0:4136:e378:8000:63bf:80ff:fffe",
                Some(("loopback", Some("127.0.0.1"))),
            ),
            // Server 10.0.0.1, client 8.8.8.8 (inverted f7f7:f7f7).
            (
                "2001:0:a00:1::f7f7:f7f7",
                Some(("private", Some("10.0.0.1"))),
            ),
            ("2001:0:4136:e378::f7f7:f7f7", None),
            (
                "64:ff9b::a9fe:a9fe",
                Some(("link-local (cloud metadata)", Some("169.254.169.254"))),
            ),
            ("64:ff9b::7f00:1", Some(("loopback", Some("127.0.0.1")))),
            ("64:ff9b::808:808", None),
            // Local-use NAT64 at each prefix length.
            ("64:ff9b:1::7f00:1", Some(("loopback", Some("127.0.0.1")))), // /96
            (
                "64:ff9b:1:0:7f:0:100::",
                Some(("loopback", Some("127.0.0.1"))),
            ), // /64
            ("64:ff9b:1:7f:0:1::", Some(("loopback", Some("127.0.0.1")))), // /56
            ("64:ff9b:1:a00:0:100::", Some(("private", Some("10.0.0.1")))), // /48
            ("64:ff9b:1::808:808", None),
            ("64:ff9b:1:808:8:800::", None),
            ("64:ff9b:1::", Some(("unspecified", Some("0.0.0.0")))),
        ];
        for (address, expected) in table {
            let found = internal(ip(address));
            let found = found.map(|i| (i.kind, i.via.map(|(_, v4)| v4.to_string())));
            let expected = expected.map(|(kind, via)| (kind, via.map(str::to_string)));
            assert_eq!(found, expected, "{address}");
        }
    }

    #[test]
    fn allowing_an_ipv4_address_allows_its_ipv6_forms() {
        let loopback = |a: IpAddr| a == ip("127.0.0.1");
        for address in [
            "127.0.0.1",
            "::ffff:127.0.0.1",
            "::127.0.0.1",
            "2002:7f00:1::",
        ] {
            assert_eq!(refused(ip(address), loopback), None, "{address}");
        }
        assert!(refused(ip("127.0.0.2"), loopback).is_some());
        assert!(refused(ip("::1"), loopback).is_some());
        // Allowing the IPv6 address itself allows it.
        assert_eq!(refused(ip("::1"), |a| a == ip("::1")), None);
    }

    #[test]
    fn an_error_names_the_form_and_the_carried_address() {
        let shown = internal(ip("2002:7f00:1::")).expect("internal").to_string();
        assert_eq!(shown, "loopback, the 6to4 form of 127.0.0.1");
        assert_eq!(
            internal(ip("::1")).expect("internal").to_string(),
            "loopback"
        );
    }
}

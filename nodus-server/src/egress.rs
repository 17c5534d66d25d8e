//! Where the webhook action may send: not to the server's own networks (loopback, private,
//! link-local where cloud metadata services answer, and the like) unless the server's
//! `--webhook-allow` (`NODUS_WEBHOOK_ALLOW`) lists the host, the address or a CIDR holding it.
//! A delivery checks every address its host resolves to, and connects only to those. What is
//! internal is [`nodus_core::address`]'s one classification (IPv6 forms that carry an
//! internal IPv4 address are internal too).

use std::net::IpAddr;
use std::str::FromStr;

use nodus_core::address::{self, Internal};

/// The hosts, addresses and CIDRs webhooks may reach although they are internal; empty by
/// default (every internal address refused, every public one allowed).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WebhookAllow {
    entries: Vec<Entry>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Entry {
    /// Addresses of a network: its address and prefix length.
    Net(IpAddr, u8),
    /// A host name, lower case, whatever it resolves to.
    Host(String),
}

impl FromStr for WebhookAllow {
    type Err = String;

    /// A comma-separated list of host names, addresses and CIDRs
    /// (`127.0.0.1,10.0.0.0/8,hooks.internal`).
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let mut entries = Vec::new();
        for entry in text.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            entries.push(parse_entry(entry).ok_or_else(|| {
                format!(
                    "--webhook-allow takes host names, addresses and CIDRs separated by commas \
                     (127.0.0.1,10.0.0.0/8,hooks.internal); {entry:?} is none of them"
                )
            })?);
        }
        Ok(WebhookAllow { entries })
    }
}

fn parse_entry(entry: &str) -> Option<Entry> {
    if let Some((address, prefix)) = entry.split_once('/') {
        let address: IpAddr = address.parse().ok()?;
        let prefix: u8 = prefix.parse().ok()?;
        let most = if address.is_ipv4() { 32 } else { 128 };
        return (prefix <= most).then_some(Entry::Net(address, prefix));
    }
    if let Ok(address) = entry.parse::<IpAddr>() {
        let most = if address.is_ipv4() { 32 } else { 128 };
        return Some(Entry::Net(address, most));
    }
    let name = entry.to_ascii_lowercase();
    let valid = name.split('.').all(|label| {
        !label.is_empty()
            && label.len() <= 63
            && label
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-')
    });
    valid.then_some(Entry::Host(name))
}

impl WebhookAllow {
    /// Whether the list names `host` itself (then any address it resolves to may be reached).
    pub fn names_host(&self, host: &str) -> bool {
        let host = host.trim_end_matches('.').to_ascii_lowercase();
        self.entries
            .iter()
            .any(|entry| matches!(entry, Entry::Host(name) if *name == host))
    }

    /// Why `address` may not be reached (the kind of address it is, or of the IPv4 address
    /// it carries: [`nodus_core::address`]), or `None`: a public address, or an internal one
    /// the list holds (an IPv4 address listed allows its IPv6 forms too).
    pub fn refuses(&self, address: IpAddr) -> Option<Internal> {
        address::refused(address, |address| {
            self.entries.iter().any(|entry| match entry {
                Entry::Net(net, prefix) => contains(*net, *prefix, address),
                Entry::Host(_) => false,
            })
        })
    }
}

/// Whether the network `net/prefix` holds `address`.
fn contains(net: IpAddr, prefix: u8, address: IpAddr) -> bool {
    match (net, address) {
        (IpAddr::V4(net), IpAddr::V4(address)) => {
            let mask = u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0);
            u32::from(net) & mask == u32::from(address) & mask
        }
        (IpAddr::V6(net), IpAddr::V6(address)) => {
            let mask = u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0);
            u128::from(net) & mask == u128::from(address) & mask
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(text: &str) -> IpAddr {
        text.parse().expect("an address")
    }

    #[test]
    fn internal_addresses_are_refused_by_default() {
        let none = WebhookAllow::default();
        for refused in [
            "127.0.0.1",
            "127.8.9.10",
            "10.1.2.3",
            "172.16.0.1",
            "172.31.255.255",
            "192.168.1.1",
            "169.254.169.254",
            "100.100.100.200",
            "0.0.0.0",
            "192.0.0.192",
            "255.255.255.255",
            "224.0.0.1",
            "::1",
            "::",
            "fd00:ec2::254",
            "fe80::1",
            "::ffff:127.0.0.1",
            "::ffff:169.254.169.254",
            "64:ff9b::a9fe:a9fe",
            "::127.0.0.1",
            "::ffff:0:127.0.0.1",
            "2002:7f00:1::",
            "2001:0:4136:e378:8000:63bf:80ff:fffe",
            "64:ff9b:1::7f00:1",
        ] {
            assert!(none.refuses(ip(refused)).is_some(), "{refused}");
        }
        for allowed in [
            "93.184.216.34",
            "172.32.0.1",
            "100.128.0.1",
            "8.8.8.8",
            "2606:4700::1111",
        ] {
            assert_eq!(none.refuses(ip(allowed)), None, "{allowed}");
        }
    }

    #[test]
    fn the_list_allows_its_networks_and_hosts() {
        let allow: WebhookAllow = " 127.0.0.1, 10.0.0.0/8,Hooks.Internal ,fd00::/8"
            .parse()
            .expect("a list");
        assert_eq!(allow.refuses(ip("127.0.0.1")), None);
        assert_eq!(allow.refuses(ip("::ffff:127.0.0.1")), None);
        assert_eq!(allow.refuses(ip("2002:7f00:1::")), None, "its 6to4 form");
        assert!(allow.refuses(ip("2002:7f00:2::")).is_some());
        assert!(allow.refuses(ip("127.0.0.2")).is_some());
        assert_eq!(allow.refuses(ip("10.200.3.4")), None);
        assert!(allow.refuses(ip("11.0.0.1")).is_none(), "public");
        assert_eq!(allow.refuses(ip("fd12::1")), None);
        assert!(allow.refuses(ip("192.168.0.1")).is_some());
        assert!(allow.names_host("hooks.internal"));
        assert!(allow.names_host("HOOKS.internal."));
        assert!(!allow.names_host("other.internal"));
        for bad in ["10.0.0.0/33", "::/129", "not a host", "a..b", "1.2.3.4/x"] {
            let refused = bad.parse::<WebhookAllow>().expect_err(bad);
            assert!(refused.contains("--webhook-allow"), "{refused}");
            assert!(refused.contains(bad), "{refused}");
        }
        assert_eq!("".parse::<WebhookAllow>(), Ok(WebhookAllow::default()));
    }
}

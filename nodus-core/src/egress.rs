//! The egress policy: whether a run's sandbox may connect to a host, port and resolved
//! address, and which rule says so. A pure function of the run's `spec.network`, the
//! operator's `--egress-allow` networks and the connection; the egress proxy (nodus-server)
//! does the I/O and asks this for every address it would dial.
//!
//! Default-deny: `egress: none` refuses everything; an allowlist allows a connection only
//! when an entry matches its host (exact, or `*.domain` for the domain's subdomains) or its
//! address (`cidr`) and its port, and the address is no internal one
//! ([`crate::address`]) the operator's `--egress-allow` leaves out. A `cidr` entry reaches
//! only addresses the operator allows as well.

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

use crate::address;
use crate::resource::{AllowEntry, EgressMode, NetworkSpec};
use crate::secret::SecretString;

pub use crate::resource::EgressCounts;

/// The ports an allow entry without `ports` opens.
pub const DEFAULT_PORTS: [u16; 2] = [80, 443];

/// A network, `address/prefix` (a bare address is its own /32 or /128).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    net: IpAddr,
    prefix: u8,
}

impl FromStr for Cidr {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let bad = || format!("{text:?} is not an address or a CIDR (address/prefix)");
        let (address, prefix) = match text.split_once('/') {
            Some((address, prefix)) => (address, Some(prefix)),
            None => (text, None),
        };
        let net: IpAddr = address.parse().map_err(|_| bad())?;
        let most = if net.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => most,
            Some(prefix) => prefix
                .parse::<u8>()
                .ok()
                .filter(|p| *p <= most)
                .ok_or_else(bad)?,
        };
        Ok(Cidr { net, prefix })
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.net, self.prefix)
    }
}

impl Cidr {
    /// Whether this network holds `address`.
    pub fn contains(&self, address: IpAddr) -> bool {
        match (self.net, address) {
            (IpAddr::V4(net), IpAddr::V4(address)) => {
                let mask = u32::MAX
                    .checked_shl(32 - u32::from(self.prefix))
                    .unwrap_or(0);
                u32::from(net) & mask == u32::from(address) & mask
            }
            (IpAddr::V6(net), IpAddr::V6(address)) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.prefix))
                    .unwrap_or(0);
                u128::from(net) & mask == u128::from(address) & mask
            }
            _ => false,
        }
    }

    /// Whether every address of this network is in one of `outer`.
    pub fn inside(&self, outer: &[Cidr]) -> bool {
        outer
            .iter()
            .any(|o| o.prefix <= self.prefix && o.contains(self.net))
    }
}

/// Parses the operator's `--egress-allow`: addresses and CIDRs separated by commas.
pub fn parse_operator_allow(text: &str) -> Result<Vec<Cidr>, String> {
    text.split(',')
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .map(|entry| {
            entry.parse().map_err(|e| {
                format!("--egress-allow takes addresses and CIDRs separated by commas: {e}")
            })
        })
        .collect()
}

/// Whether a connection may be made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// It may, by this rule (`spec.network.allow[0]`).
    Allowed(String),
    /// It may not, for this reason.
    Refused(String),
}

impl Verdict {
    /// `allowed` or `refused`, as the egress record spells it.
    pub fn word(&self) -> &'static str {
        match self {
            Verdict::Allowed(_) => "allowed",
            Verdict::Refused(_) => "refused",
        }
    }

    /// The rule.
    pub fn rule(&self) -> &str {
        match self {
            Verdict::Allowed(rule) | Verdict::Refused(rule) => rule,
        }
    }

    /// Whether it is allowed.
    pub fn is_allowed(&self) -> bool {
        matches!(self, Verdict::Allowed(_))
    }
}

/// A host name as compared: lower case, without a trailing dot.
fn normal(host: &str) -> String {
    host.trim_end_matches('.').to_ascii_lowercase()
}

/// Whether an entry's `host` pattern names `host`: exactly, or `*.domain` for any name below
/// `domain` (not `domain` itself).
pub fn host_matches(pattern: &str, host: &str) -> bool {
    let host = normal(host);
    let pattern = normal(pattern);
    match pattern.strip_prefix("*.") {
        Some(domain) => host
            .strip_suffix(domain)
            .is_some_and(|rest| rest.len() > 1 && rest.ends_with('.')),
        None => host == pattern,
    }
}

fn ports_of(entry: &AllowEntry) -> &[u16] {
    entry.ports.as_deref().unwrap_or(&DEFAULT_PORTS)
}

/// May the sandbox reach `host` (as the request named it) on `port` at all, before any name
/// is resolved? `None` when an entry may allow it (the address decides: [`decide`]), else
/// the refusal.
pub fn precheck(network: &NetworkSpec, host: &str, port: u16) -> Option<Verdict> {
    if network.egress == EgressMode::None {
        return Some(Verdict::Refused("egress: none".into()));
    }
    // A cidr entry may hold whatever address any name resolves to: the address decides.
    let named = network.allow.iter().any(|entry| {
        ports_of(entry).contains(&port)
            && (entry.host.as_deref().is_some_and(|p| host_matches(p, host))
                || entry.cidr.is_some())
    });
    (!named).then(|| not_listed(network, host, port))
}

fn not_listed(network: &NetworkSpec, host: &str, port: u16) -> Verdict {
    let host_listed = network
        .allow
        .iter()
        .any(|e| e.host.as_deref().is_some_and(|p| host_matches(p, host)));
    if host_listed {
        Verdict::Refused(format!(
            "port {port} is not in the ports spec.network.allow gives {host}"
        ))
    } else {
        Verdict::Refused(format!("{host} is not in spec.network.allow"))
    }
}

/// The verdict on a connection to `host` (as named) on `port` at `address` (what the proxy
/// resolved it to, or the address the request wrote), under the run's `network` and the
/// operator's `operator` networks (`--egress-allow`).
pub fn decide(
    network: &NetworkSpec,
    operator: &[Cidr],
    host: &str,
    port: u16,
    address: IpAddr,
) -> Verdict {
    if let Some(refused) = precheck(network, host, port) {
        return refused;
    }
    let operator_allows = |a: IpAddr| operator.iter().any(|net| net.contains(a));
    let internal = address::refused(address, operator_allows);
    let mut cidr_listed = false;
    for (index, entry) in network.allow.iter().enumerate() {
        if !ports_of(entry).contains(&port) {
            continue;
        }
        let rule = || format!("spec.network.allow[{index}]");
        if let Some(pattern) = &entry.host
            && host_matches(pattern, host)
            && internal.is_none()
        {
            return Verdict::Allowed(rule());
        }
        if let Some(cidr) = entry.cidr.as_deref().and_then(|c| c.parse::<Cidr>().ok())
            && cidr.contains(address)
        {
            cidr_listed = true;
            if cidr.inside(operator) && operator_allows(address) {
                return Verdict::Allowed(rule());
            }
        }
    }
    if let Some(internal) = internal {
        return Verdict::Refused(format!(
            "{address} is an internal address ({internal}) that the server's --egress-allow \
             does not list"
        ));
    }
    if cidr_listed {
        return Verdict::Refused(format!(
            "{address} is in a spec.network.allow cidr outside the server's --egress-allow"
        ));
    }
    not_listed(network, host, port)
}

/// A header `spec.network.inject` has the egress proxy add to the requests to the hosts
/// `host` names (exact, or `*.domain`), with its Secret's value. It has no `Serialize`, and
/// its value prints as `[redacted]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InjectedHeader {
    /// The host pattern, as `inject[].host` wrote it.
    pub host: String,
    /// The header's name.
    pub name: String,
    /// Its value.
    pub value: SecretString,
}

/// The headers of `headers` for requests to `host`.
pub fn headers_for<'a>(
    headers: &'a [InjectedHeader],
    host: &'a str,
) -> impl Iterator<Item = &'a InjectedHeader> + 'a {
    headers.iter().filter(move |h| host_matches(&h.host, host))
}

/// Whether `value` may be sent as an HTTP header's value: visible ASCII, spaces and tabs
/// (no CR, LF, NUL or other control), not empty.
pub fn valid_header_value(value: &str) -> bool {
    !value.is_empty()
        && value
            .bytes()
            .all(|b| b == b'\t' || (b' '..=b'~').contains(&b))
}

/// Whether `name` is an HTTP header name the proxy may add: a token (letters, digits and
/// `!#$%&'*+-.^_`|~`), not one that frames the request or the connection (`Host`,
/// `Content-Length`, `Transfer-Encoding`, `Connection`, `Upgrade`, `Te`, `Trailer`,
/// `Keep-Alive`, `Proxy-*`).
pub fn valid_header_name(name: &str) -> bool {
    let token = !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b));
    let lower = name.to_ascii_lowercase();
    let framing = [
        "host",
        "content-length",
        "transfer-encoding",
        "connection",
        "upgrade",
        "te",
        "trailer",
        "keep-alive",
    ]
    .contains(&lower.as_str())
        || lower.starts_with("proxy-");
    token && !framing
}

/// One connection the egress proxy was asked for: a line of the run result `egress` (JSON
/// Lines). `address` is the one it dialled, or the one refused (none when no name resolved or
/// the host was refused before resolving).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EgressRecord {
    /// When the connection was asked for (RFC 3339).
    pub time: String,
    /// The host as the request named it.
    pub host: String,
    /// The port.
    pub port: u16,
    /// The address dialled or refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    /// `allowed` or `refused`.
    pub verdict: String,
    /// The rule that decided.
    pub rule: String,
    /// Bytes from the sandbox onward.
    pub bytes_out: u64,
    /// Bytes back to the sandbox.
    pub bytes_in: u64,
    /// How long the connection lasted.
    pub duration_ms: u64,
}

impl EgressCounts {
    /// These counts with `record` counted too.
    pub fn add(&mut self, record: &EgressRecord) {
        if record.verdict == "allowed" {
            self.allowed += 1;
        } else {
            self.refused += 1;
        }
        self.bytes_out = self.bytes_out.saturating_add(record.bytes_out);
        self.bytes_in = self.bytes_in.saturating_add(record.bytes_in);
    }

    /// The sum of these counts and `other`.
    pub fn plus(self, other: EgressCounts) -> EgressCounts {
        EgressCounts {
            allowed: self.allowed + other.allowed,
            refused: self.refused + other.refused,
            bytes_out: self.bytes_out.saturating_add(other.bytes_out),
            bytes_in: self.bytes_in.saturating_add(other.bytes_in),
        }
    }

    /// The counts of `records`.
    pub fn of(records: &[EgressRecord]) -> Self {
        let mut counts = EgressCounts::default();
        for record in records {
            counts.add(record);
        }
        counts
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn network(allow: &[(&str, Option<&[u16]>)]) -> NetworkSpec {
        NetworkSpec {
            egress: EgressMode::Allowlist,
            allow: allow
                .iter()
                .map(|(what, ports)| {
                    let cidr = what.contains('/');
                    AllowEntry {
                        host: (!cidr).then(|| what.to_string()),
                        cidr: cidr.then(|| what.to_string()),
                        ports: ports.map(<[u16]>::to_vec),
                    }
                })
                .collect(),
            inject: Vec::new(),
        }
    }

    #[test]
    fn the_policy_as_a_table() {
        let list = network(&[
            ("pypi.org", None),
            ("*.example.org", Some(&[8443])),
            ("files.test", None),
            ("10.20.0.0/16", Some(&[5432])),
        ]);
        let operator: Vec<Cidr> = parse_operator_allow("127.0.0.1,10.20.0.0/16").expect("parsed");
        let none = NetworkSpec::default();
        // (network, operator, host, port, address, verdict, words in the rule)
        #[allow(clippy::type_complexity)]
        let table: Vec<(&NetworkSpec, &[Cidr], &str, u16, &str, &str, &str)> = vec![
            (
                &none,
                &operator,
                "pypi.org",
                443,
                "151.101.0.223",
                "refused",
                "egress: none",
            ),
            (
                &list,
                &[],
                "pypi.org",
                443,
                "151.101.0.223",
                "allowed",
                "allow[0]",
            ),
            (
                &list,
                &[],
                "PyPI.org.",
                80,
                "151.101.0.223",
                "allowed",
                "allow[0]",
            ),
            (
                &list,
                &[],
                "pypi.org",
                22,
                "151.101.0.223",
                "refused",
                "port 22",
            ),
            (
                &list,
                &[],
                "evil.test",
                443,
                "151.101.0.223",
                "refused",
                "not in spec.network.allow",
            ),
            (
                &list,
                &[],
                "a.example.org",
                8443,
                "93.184.215.14",
                "allowed",
                "allow[1]",
            ),
            (
                &list,
                &[],
                "a.b.example.org",
                8443,
                "93.184.215.14",
                "allowed",
                "allow[1]",
            ),
            (
                &list,
                &[],
                "example.org",
                8443,
                "93.184.215.14",
                "refused",
                "not in",
            ),
            (
                &list,
                &[],
                "badexample.org",
                8443,
                "93.184.215.14",
                "refused",
                "not in",
            ),
            (
                &list,
                &[],
                "a.example.org",
                443,
                "93.184.215.14",
                "refused",
                "port 443",
            ),
            // An allowed name resolving to an internal address: refused unless the operator
            // allows that address.
            (
                &list,
                &[],
                "files.test",
                80,
                "127.0.0.1",
                "refused",
                "loopback",
            ),
            (
                &list,
                &operator,
                "files.test",
                80,
                "127.0.0.1",
                "allowed",
                "allow[2]",
            ),
            (
                &list,
                &operator,
                "files.test",
                80,
                "127.0.0.2",
                "refused",
                "loopback",
            ),
            (
                &list,
                &[],
                "pypi.org",
                443,
                "169.254.169.254",
                "refused",
                "internal",
            ),
            (
                &list,
                &[],
                "pypi.org",
                443,
                "10.0.0.1",
                "refused",
                "private",
            ),
            (&list, &[], "pypi.org", 443, "::1", "refused", "loopback"),
            (
                &list,
                &[],
                "pypi.org",
                443,
                "::ffff:127.0.0.1",
                "refused",
                "127.0.0.1",
            ),
            (
                &list,
                &[],
                "pypi.org",
                443,
                "64:ff9b::a9fe:a9fe",
                "refused",
                "169.254.169.254",
            ),
            (
                &list,
                &operator,
                "files.test",
                80,
                "::ffff:127.0.0.1",
                "allowed",
                "allow[2]",
            ),
            // A cidr entry: its addresses, whatever the name, only inside the operator's.
            (
                &list,
                &operator,
                "10.20.1.2",
                5432,
                "10.20.1.2",
                "allowed",
                "allow[3]",
            ),
            (
                &list,
                &operator,
                "db.internal",
                5432,
                "10.20.1.2",
                "allowed",
                "allow[3]",
            ),
            (
                &list,
                &[],
                "10.20.1.2",
                5432,
                "10.20.1.2",
                "refused",
                "private",
            ),
            (
                &list,
                &operator,
                "10.20.1.2",
                80,
                "10.20.1.2",
                "refused",
                "not in",
            ),
            (
                &list,
                &operator,
                "10.21.0.1",
                5432,
                "10.21.0.1",
                "refused",
                "private",
            ),
        ];
        for (network, operator, host, port, address, verdict, words) in table {
            let address: IpAddr = address.parse().expect("an address");
            let got = decide(network, operator, host, port, address);
            assert_eq!(
                (got.word(), got.rule().contains(words)),
                (verdict, true),
                "{host}:{port} at {address}: {got:?}"
            );
        }
    }

    #[test]
    fn a_cidr_reaches_no_public_address_beyond_the_operators() {
        let list = network(&[("0.0.0.0/0", Some(&[443]))]);
        let got = decide(&list, &[], "x", 443, "1.1.1.1".parse().expect("ip"));
        assert_eq!(got.word(), "refused", "{got:?}");
    }

    #[test]
    fn injected_headers_match_their_hosts_and_names_are_checked() {
        let header = |host: &str| InjectedHeader {
            host: host.into(),
            name: "Authorization".into(),
            value: SecretString::new("token"),
        };
        let headers = [header("api.test"), header("*.example.org")];
        let count = |host| headers_for(&headers, host).count();
        assert_eq!(
            [
                count("api.test"),
                count("API.test."),
                count("a.example.org")
            ],
            [1, 1, 1]
        );
        assert_eq!([count("other.test"), count("example.org")], [0, 0]);
        assert!(!format!("{:?}", headers[0]).contains("token"));
        for good in ["Authorization", "X-Api-Key", "x_custom.1"] {
            assert!(valid_header_name(good), "{good}");
        }
        for bad in [
            "",
            "Host",
            "content-length",
            "Transfer-Encoding",
            "Proxy-Authorization",
            "a b",
            "a:b",
        ] {
            assert!(!valid_header_name(bad), "{bad}");
        }
        assert!(valid_header_value("Bearer abc\t=="));
        for bad in ["", "a\r\nX-Evil: 1", "a\nb", "nul\0"] {
            assert!(!valid_header_value(bad), "{bad:?}");
        }
    }

    #[test]
    fn cidrs_parse_and_nest() {
        let outer = parse_operator_allow("10.0.0.0/8, 127.0.0.1").expect("parsed");
        assert!("10.1.0.0/16".parse::<Cidr>().expect("cidr").inside(&outer));
        assert!(!"10.0.0.0/7".parse::<Cidr>().expect("cidr").inside(&outer));
        assert!("127.0.0.1".parse::<Cidr>().expect("cidr").inside(&outer));
        assert!(!"127.0.0.0/8".parse::<Cidr>().expect("cidr").inside(&outer));
        for bad in ["10.0.0.0/33", "x", "::1/129", "1.2.3.4/"] {
            assert!(bad.parse::<Cidr>().is_err(), "{bad}");
        }
        assert!(parse_operator_allow("10.0.0.0/8,nope").is_err());
    }
}

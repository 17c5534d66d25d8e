//! The rules of `spec.network`'s host patterns and `inject` entries: headers the egress
//! proxy adds to the requests to a host, their values from Secrets.

use std::collections::BTreeSet;

use super::{Invalid, NOTHING, Result, check_dns_label, check_not_blank, shown};
use crate::egress::{host_matches, valid_header_name};
use crate::resource::{EgressMode, NetworkSpec};

/// The most entries of `spec.network.inject`.
const MAX_INJECT_ENTRIES: usize = 32;

/// Whether `host` is a host name (letters, digits, `-` in dot-separated labels) or
/// `*.domain`.
pub(super) fn valid_host_pattern(host: &str) -> bool {
    let name = host.strip_prefix("*.").unwrap_or(host);
    name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-')
        })
}

/// What a host-pattern refusal says.
pub(super) const HOST_RULE: &str = "must be a host name (letters, digits, '-' in dot-separated \
                                    labels), or *.domain for its subdomains";

/// The rules of a `spec.network` under `prefix` of a kind other than AgentEnvironment that
/// carries one (an Environment gives its agents one): the same as an AgentEnvironment's.
pub fn check_network_spec(prefix: &str, network: &NetworkSpec) -> Result<()> {
    check_network(prefix, network)?;
    check_inject(prefix, network)
}

/// `inject`: only with `egress: allowlist`, at most [`MAX_INJECT_ENTRIES`] entries, each a
/// host pattern some `allow` entry's host lets through, a header name the proxy may add
/// (no framing header: [`valid_header_name`]), once per host, and a Secret's key.
pub(super) fn check_inject(prefix: &str, network: &NetworkSpec) -> Result<()> {
    if network.inject.is_empty() {
        return Ok(());
    }
    if network.egress == EgressMode::None {
        return Err(Invalid::new(
            format!("{prefix}.inject"),
            "must be left out with egress: none (set egress: allowlist to use it)",
            format!("{} entries", network.inject.len()),
        ));
    }
    if network.inject.len() > MAX_INJECT_ENTRIES {
        return Err(Invalid::new(
            format!("{prefix}.inject"),
            format!("must have at most {MAX_INJECT_ENTRIES} entries"),
            network.inject.len().to_string(),
        ));
    }
    let mut seen = BTreeSet::new();
    for (index, entry) in network.inject.iter().enumerate() {
        let field = format!("{prefix}.inject[{index}]");
        if !valid_host_pattern(&entry.host) {
            return Err(Invalid::new(
                format!("{field}.host"),
                HOST_RULE,
                shown(&entry.host),
            ));
        }
        // A name the pattern stands for: itself, or one of its subdomains.
        let example = match entry.host.strip_prefix("*.") {
            Some(domain) => format!("x.{domain}"),
            None => entry.host.clone(),
        };
        let allowed = network.allow.iter().any(|allow| {
            allow
                .host
                .as_deref()
                .is_some_and(|p| p.eq_ignore_ascii_case(&entry.host) || host_matches(p, &example))
        });
        if !allowed {
            return Err(Invalid::new(
                format!("{field}.host"),
                "must be a host spec.network.allow lets through (by a host entry): the header \
                 is added only to requests the allowlist allows",
                shown(&entry.host),
            ));
        }
        if !valid_header_name(&entry.header) {
            return Err(Invalid::new(
                format!("{field}.header"),
                "must be an HTTP header name (letters, digits and !#$%&'*+-.^_`|~) other than \
                 Host, Content-Length, Transfer-Encoding, Connection, Upgrade, TE, Trailer, \
                 Keep-Alive and Proxy-*",
                shown(&entry.header),
            ));
        }
        let host = entry.host.trim_end_matches('.').to_ascii_lowercase();
        if !seen.insert((host, entry.header.to_ascii_lowercase())) {
            return Err(Invalid::new(
                format!("{field}.header"),
                "must be added to a host once: another inject entry adds it already",
                shown(&entry.header),
            ));
        }
        let secret = &entry.value_from.secret_key_ref;
        check_dns_label(
            &format!("{field}.valueFrom.secretKeyRef.name"),
            &secret.name,
        )?;
        check_not_blank(&format!("{field}.valueFrom.secretKeyRef.key"), &secret.key)?;
    }
    Ok(())
}

/// The most entries of `spec.network.allow`.
const MAX_ALLOW_ENTRIES: usize = 256;

/// The rules of `spec.network`: an allowlist's entries each a `host` (a name, or `*.domain`)
/// or a `cidr`, with 1 to 32 ports other than 0; `allow` only with `egress: allowlist`;
/// `inject` by [`check_inject`]. Whether a `cidr` is inside the operator's
/// `--egress-allow` is checked when a run is created.
pub(super) fn check_network(prefix: &str, network: &NetworkSpec) -> Result<()> {
    if network.egress == EgressMode::None && !network.allow.is_empty() {
        return Err(Invalid::new(
            format!("{prefix}.allow"),
            "must be left out with egress: none (set egress: allowlist to use it)",
            format!("{} entries", network.allow.len()),
        ));
    }
    if network.allow.len() > MAX_ALLOW_ENTRIES {
        return Err(Invalid::new(
            format!("{prefix}.allow"),
            format!("must have at most {MAX_ALLOW_ENTRIES} entries"),
            network.allow.len().to_string(),
        ));
    }
    for (index, entry) in network.allow.iter().enumerate() {
        let field = format!("{prefix}.allow[{index}]");
        match (&entry.host, &entry.cidr) {
            (Some(host), None) => {
                if !valid_host_pattern(host) {
                    return Err(Invalid::new(
                        format!("{field}.host"),
                        HOST_RULE,
                        shown(host),
                    ));
                }
            }
            (None, Some(cidr)) => {
                if let Err(e) = cidr.parse::<crate::egress::Cidr>() {
                    return Err(Invalid::new(format!("{field}.cidr"), e, shown(cidr)));
                }
            }
            (Some(_), Some(_)) => {
                return Err(Invalid::new(
                    field,
                    "must have one of host and cidr, not both",
                    "both",
                ));
            }
            (None, None) => {
                return Err(Invalid::new(field, "must have host or cidr", NOTHING));
            }
        }
        if let Some(ports) = &entry.ports
            && (ports.is_empty() || ports.len() > 32 || ports.contains(&0))
        {
            return Err(Invalid::new(
                format!("{field}.ports"),
                "must list 1 to 32 ports, none of them 0 (leave it out for [80, 443])",
                format!("{ports:?}"),
            ));
        }
    }
    Ok(())
}

//! The rules of an AgentEnvironment, written on its own or inline in an agent or a run:
//! image, variables, compute and network.

use std::collections::BTreeSet;
use std::ops::RangeInclusive;

use super::network::check_network;
use super::{
    Invalid, NOTHING, Result, Validate, check_dns_label, check_not_blank, check_reference, shown,
};
use crate::resource::{AgentEnvironmentSpec, NameOrInline};

/// Environment variables that the sandboxes set themselves, which an AgentEnvironment may
/// not set (nor any name starting with [`RESERVED_ENV_PREFIX`]).
pub const RESERVED_ENV_NAMES: [&str; 3] = ["PATH", "HOME", "LANG"];
/// The prefix of environment variable names that Nodus keeps for itself.
pub const RESERVED_ENV_PREFIX: &str = "NODUS_";
/// The most environment variables an AgentEnvironment sets.
pub const MAX_ENV_VARS: usize = 256;
/// The longest plain `value` of an environment variable, in bytes.
pub const MAX_ENV_VALUE_BYTES: usize = 32 * 1024;
/// Allowed `compute.cpu`, in thousandths of a CPU: 0.01 to 64 CPUs.
pub const CPU_MILLIS_RANGE: RangeInclusive<u64> = 10..=64_000;
/// Allowed `compute.memory`, in bytes: 16 MiB to 256 GiB.
pub const MEMORY_BYTES_RANGE: RangeInclusive<u64> = (16 << 20)..=(256 << 30);
impl Validate for AgentEnvironmentSpec {
    fn check_spec(&self) -> Result<()> {
        check_environment("spec", self)
    }
}

/// A run's or an agent's `environment`: a reference, or an environment written inline.
pub(super) fn check_environment_ref(
    field: &str,
    environment: &NameOrInline<AgentEnvironmentSpec>,
) -> Result<()> {
    match environment {
        NameOrInline::Name(name) => check_reference(field, name),
        NameOrInline::Inline(spec) => check_environment(field, spec),
    }
}

/// The rules of an AgentEnvironment's spec, whose fields are under `prefix` (`spec`, or
/// `spec.environment` when it is written inline).
pub fn check_environment(prefix: &str, spec: &AgentEnvironmentSpec) -> Result<()> {
    if spec.env.len() > MAX_ENV_VARS {
        return Err(Invalid::new(
            format!("{prefix}.env"),
            format!("must set at most {MAX_ENV_VARS} variables"),
            spec.env.len().to_string(),
        ));
    }
    let mut names = BTreeSet::new();
    for (index, var) in spec.env.iter().enumerate() {
        let field = format!("{prefix}.env[{index}]");
        let name = &var.name;
        let identifier = name
            .bytes()
            .next()
            .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
            && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
            && name.len() <= 255;
        if !identifier {
            return Err(Invalid::new(
                format!("{field}.name"),
                "must be an environment variable name: 1 to 255 letters, digits and '_', not \
                 starting with a digit",
                shown(name),
            ));
        }
        if RESERVED_ENV_NAMES.contains(&name.as_str()) || name.starts_with(RESERVED_ENV_PREFIX) {
            return Err(Invalid::new(
                format!("{field}.name"),
                format!(
                    "is reserved: the sandbox sets {} and Nodus keeps every name starting with \
                     {RESERVED_ENV_PREFIX}",
                    RESERVED_ENV_NAMES.join(", ")
                ),
                shown(name),
            ));
        }
        if !names.insert(name.as_str()) {
            return Err(Invalid::new(
                format!("{field}.name"),
                "must be unique in env",
                shown(name),
            ));
        }
        match (&var.value, &var.value_from) {
            (Some(value), None) => {
                if value.len() > MAX_ENV_VALUE_BYTES || value.contains('\0') {
                    return Err(Invalid::new(
                        format!("{field}.value"),
                        format!("must be at most {MAX_ENV_VALUE_BYTES} bytes without NUL bytes"),
                        format!("{} bytes", value.len()),
                    ));
                }
            }
            (None, Some(from)) => {
                let secret = &from.secret_key_ref;
                check_dns_label(
                    &format!("{field}.valueFrom.secretKeyRef.name"),
                    &secret.name,
                )?;
                check_not_blank(&format!("{field}.valueFrom.secretKeyRef.key"), &secret.key)?;
            }
            (Some(_), Some(_)) => {
                return Err(Invalid::new(
                    field,
                    "must have one of value and valueFrom, not both",
                    "both",
                ));
            }
            (None, None) => {
                return Err(Invalid::new(
                    field,
                    "must have value or valueFrom.secretKeyRef",
                    NOTHING,
                ));
            }
        }
    }
    check_network(&format!("{prefix}.network"), &spec.network)?;
    super::network::check_inject(&format!("{prefix}.network"), &spec.network)?;
    if let Some(compute) = &spec.compute {
        if let Some(cpu) = &compute.cpu {
            let field = format!("{prefix}.compute.cpu");
            let Some(millis) = cpu.cpu_millis() else {
                return Err(Invalid::new(
                    field,
                    "must be a CPU quantity such as \"2\", \"0.5\" or \"500m\"",
                    shown(&cpu.0),
                ));
            };
            if !CPU_MILLIS_RANGE.contains(&millis) {
                return Err(Invalid::new(
                    field,
                    "must be between 10m and 64 CPUs",
                    shown(&cpu.0),
                ));
            }
        }
        if let Some(memory) = &compute.memory {
            let field = format!("{prefix}.compute.memory");
            let Some(bytes) = memory.bytes() else {
                return Err(Invalid::new(
                    field,
                    "must be a memory quantity such as \"512Mi\", \"2Gi\" or a number of bytes",
                    shown(&memory.0),
                ));
            };
            if !MEMORY_BYTES_RANGE.contains(&bytes) {
                return Err(Invalid::new(
                    field,
                    "must be between 16Mi and 256Gi",
                    shown(&memory.0),
                ));
            }
        }
    }
    Ok(())
}

/// The longest image reference taken.
pub const MAX_IMAGE_REFERENCE_BYTES: usize = 512;

/// A container image reference, as `[registry[:port]/]name[:tag][@algorithm:digest]` spells
/// one: ASCII letters, digits and `._-/:@`, starting with a letter or digit, no empty, `.` or
/// `..` path segment. Anything else is refused, as the reference travels to the container
/// engine inside a request path.
pub fn check_image_reference(field: &str, text: &str) -> Result<()> {
    let rule = "must be an image reference ([registry/]name[:tag][@digest]: ASCII letters, \
                digits and ._-/:@, starting with a letter or digit, no empty, . or .. segment)";
    let allowed = |c: char| c.is_ascii_alphanumeric() || "._-/:@".contains(c);
    let well_formed = !text.is_empty()
        && text.len() <= MAX_IMAGE_REFERENCE_BYTES
        && text.starts_with(|c: char| c.is_ascii_alphanumeric())
        && text.chars().all(allowed)
        && text
            .split('/')
            .all(|segment| !matches!(segment, "" | "." | ".."));
    if well_formed {
        Ok(())
    } else {
        Err(Invalid::new(field, rule, shown(text)))
    }
}

#[cfg(test)]
#[path = "environment_tests.rs"]
mod tests;

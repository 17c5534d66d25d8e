//! Validation of user-written documents: every error names the field, the rule and the value.
//!
//! [`parse`] turns a JSON document into a typed [`Object`] and checks it; [`validate`] re-checks
//! a typed object (after a patch, say). Each kind's own rules live in its [`Validate`] impl.
//! An error is one [`Invalid`]: the field path as written in the YAML (`spec.dependsOn[1]`),
//! the rule it breaks, and the offending value, shortened when long so that an error never
//! echoes a whole 256 KiB input.

use std::fmt::Display;
use std::ops::RangeInclusive;

use serde_json::Value;

use crate::resource::{API_VERSION, DurationSpec, Object, ObjectMeta, Spec};

/// A document breaks a rule: `field: rule (got value)`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, thiserror::Error)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
#[error("{field}: {rule} (got {value})")]
pub struct Invalid {
    /// The field's path as written in the document, such as `spec.limits.maxActive`.
    pub field: String,
    /// The rule the field breaks, such as `must be between 1 and 1000`.
    pub rule: String,
    /// The offending value as shown to the user (strings quoted, long ones shortened).
    pub value: String,
}

impl Invalid {
    /// An error about `field`, which breaks `rule` with `value` (already rendered for display).
    pub fn new(
        field: impl Into<String>,
        rule: impl Into<String>,
        value: impl Into<String>,
    ) -> Self {
        Invalid {
            field: field.into(),
            rule: rule.into(),
            value: value.into(),
        }
    }
}

/// The result of a check.
pub type Result<T, E = Invalid> = std::result::Result<T, E>;
mod agent;
mod budget;
mod context;
mod display;
mod environment;
mod fileset;
mod group;
mod network;
mod run;
mod secret;
#[cfg(test)]
mod test_support;
#[cfg(test)]
mod tests;

pub use agent::{MAX_TOKENS_RANGE, MAX_TOOL_CALLS_RANGE};
pub use context::{
    DIALECT as CONTEXT_SCHEMA_DIALECT, FEATURE as CONTEXT_SCHEMA_FEATURE, check_context,
};
pub use display::shown;
use display::{NOTHING, SHOWN_CHARS, deserialize_error, push_key, shorten, shown_json};
pub use environment::{
    CPU_MILLIS_RANGE, MAX_ENV_VALUE_BYTES, MAX_ENV_VARS, MAX_IMAGE_REFERENCE_BYTES,
    MEMORY_BYTES_RANGE, RESERVED_ENV_NAMES, RESERVED_ENV_PREFIX, check_environment,
    check_image_reference,
};
pub use fileset::{MAX_FILESET_FILES, MAX_PATH_COMPONENT_BYTES};
pub use group::{EVALUATION_TIMEOUT_RANGE, MAX_EVALUATION_CASES, MAX_PENDING_RANGE};
pub use network::check_network_spec;
pub use run::{RESERVED_CONTEXT_KEY, RUN_TIMEOUT_RANGE};
pub use secret::MAX_SECRET_KEY_CHARS;
pub(crate) use secret::{check_secret, parse_secret};

/// The largest input, message, system prompt or default input: 256 KiB.
pub const MAX_INPUT_BYTES: usize = 256 * 1024;
/// The longest label key, in characters.
pub const MAX_LABEL_KEY_CHARS: usize = 253;
/// The longest label value, in characters.
pub const MAX_LABEL_VALUE_CHARS: usize = 63;
/// The longest message key, in characters.
pub const MAX_MESSAGE_KEY_CHARS: usize = 253;

const DAY_SECS: u64 = 24 * 3600;

const DNS_LABEL_RULE: &str = "must be a DNS label: 1 to 63 characters of a-z, 0-9 and '-', \
                              starting and ending with a letter or digit";
const REFERENCE_RULE: &str = "must be `name` or `project/name`, each a DNS label \
                              (1 to 63 characters of a-z, 0-9 and '-', starting and ending \
                              with a letter or digit)";

/// The rules of one kind of resource, beyond what its types already enforce.
pub trait Validate: Spec {
    /// Checks the spec on its own; field paths start with `spec.`.
    fn check_spec(&self) -> Result<()>;

    /// Checks `metadata` for a document with this spec. By default the name is required.
    fn check_metadata(&self, metadata: &ObjectMeta) -> Result<()> {
        check_common_metadata(metadata)?;
        require_name(metadata)
    }
}

/// Reads a user's document as an object of kind `S` and checks every rule.
///
/// Unknown fields, wrong types, malformed money or durations, a wrong `apiVersion` or `kind`
/// and broken rules all come back as one [`Invalid`] naming the field.
pub fn parse<S: Validate>(document: Value) -> Result<Object<S>> {
    check_header::<S>(&document)?;
    let object: Object<S> = serde_path_to_error::deserialize(&document)
        .map_err(|error| deserialize_error(&document, &error))?;
    validate(&object)?;
    Ok(object)
}

/// Checks a typed object: `apiVersion`, `kind`, `metadata` and `spec`.
pub fn validate<S: Validate>(object: &Object<S>) -> Result<()> {
    if object.api_version != API_VERSION {
        return Err(Invalid::new(
            "apiVersion",
            format!("must be {API_VERSION}"),
            shown(&object.api_version),
        ));
    }
    if object.kind != S::KIND {
        return Err(Invalid::new(
            "kind",
            format!("must be {}", S::KIND),
            object.kind.to_string(),
        ));
    }
    object.spec.check_metadata(&object.metadata)?;
    object.spec.check_spec()
}

/// Checks a message's idempotency key (`messageKey`, `--key`): 1 to
/// [`MAX_MESSAGE_KEY_CHARS`] characters, none of them control characters.
pub fn check_message_key(key: &str) -> Result<()> {
    if key.is_empty()
        || key.chars().count() > MAX_MESSAGE_KEY_CHARS
        || key.chars().any(char::is_control)
    {
        return Err(Invalid::new(
            "messageKey",
            format!("must be 1 to {MAX_MESSAGE_KEY_CHARS} characters without control characters"),
            shown(key),
        ));
    }
    Ok(())
}

/// Checks an input or a message: not empty and at most [`MAX_INPUT_BYTES`] bytes.
pub fn check_message(field: &str, text: &str) -> Result<()> {
    if text.is_empty() {
        return Err(Invalid::new(field, "must not be empty", shown(text)));
    }
    if text.len() > MAX_INPUT_BYTES {
        return Err(Invalid::new(
            field,
            format!("must be at most {MAX_INPUT_BYTES} bytes (256 KiB)"),
            shown(text),
        ));
    }
    Ok(())
}

/// Whether `text` is a DNS-1123 label: 1 to 63 characters of `a-z`, `0-9` and `-`, starting
/// and ending with a letter or digit.
pub fn is_dns_label(text: &str) -> bool {
    let bytes = text.as_bytes();
    let alphanumeric = |b: &u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    (1..=63).contains(&bytes.len())
        && bytes.iter().all(|b| alphanumeric(b) || *b == b'-')
        && bytes.first().is_some_and(alphanumeric)
        && bytes.last().is_some_and(alphanumeric)
}

/// The name of the run for task `task_key` of `group`: `<group>-<taskKey>`.
pub fn task_run_name(group: &str, task_key: &str) -> String {
    format!("{group}-{task_key}")
}

/// `apiVersion` and `kind` of the raw document, so that a document of another kind is named
/// as such rather than by its first unknown field.
pub(super) fn check_header<S: Spec>(document: &Value) -> Result<()> {
    if let Some(Value::String(version)) = document.get("apiVersion")
        && version != API_VERSION
    {
        return Err(Invalid::new(
            "apiVersion",
            format!("must be {API_VERSION}"),
            shown(version),
        ));
    }
    if let Some(Value::String(kind)) = document.get("kind")
        && *kind != S::KIND.to_string()
    {
        return Err(Invalid::new(
            "kind",
            format!("must be {}", S::KIND),
            shown(kind),
        ));
    }
    Ok(())
}

/// `project`, labels and (when present) the name.
pub(super) fn check_common_metadata(metadata: &ObjectMeta) -> Result<()> {
    if let Some(name) = &metadata.name {
        check_dns_label("metadata.name", name)?;
    }
    if let Some(project) = &metadata.project {
        check_dns_label("metadata.project", project)?;
    }
    for (key, value) in &metadata.labels {
        if key.is_empty() || key.chars().count() > MAX_LABEL_KEY_CHARS {
            return Err(Invalid::new(
                "metadata.labels",
                format!("keys must be 1 to {MAX_LABEL_KEY_CHARS} characters"),
                shown(key),
            ));
        }
        if value.chars().count() > MAX_LABEL_VALUE_CHARS {
            let mut field = String::from("metadata.labels");
            push_key(&mut field, key);
            return Err(Invalid::new(
                field,
                format!("must be at most {MAX_LABEL_VALUE_CHARS} characters"),
                shown(value),
            ));
        }
    }
    Ok(())
}

pub(super) fn require_name(metadata: &ObjectMeta) -> Result<()> {
    match metadata.name {
        Some(_) => Ok(()),
        None => Err(Invalid::new("metadata.name", "required", NOTHING)),
    }
}

pub(super) fn is_reference(text: &str) -> bool {
    match text.split_once('/') {
        Some((project, name)) => is_dns_label(project) && is_dns_label(name),
        None => is_dns_label(text),
    }
}

pub(super) fn check_reference(field: &str, text: &str) -> Result<()> {
    if is_reference(text) {
        Ok(())
    } else {
        Err(Invalid::new(field, REFERENCE_RULE, shown(text)))
    }
}

pub(super) fn check_dns_label(field: &str, text: &str) -> Result<()> {
    if is_dns_label(text) {
        Ok(())
    } else {
        Err(Invalid::new(field, DNS_LABEL_RULE, shown(text)))
    }
}

pub(super) fn check_not_blank(field: &str, text: &str) -> Result<()> {
    if text.trim().is_empty() {
        Err(Invalid::new(field, "must not be empty", shown(text)))
    } else {
        Ok(())
    }
}

pub(super) fn check_range<T: PartialOrd + Display>(
    field: &str,
    value: T,
    range: RangeInclusive<T>,
) -> Result<()> {
    if range.contains(&value) {
        Ok(())
    } else {
        Err(Invalid::new(
            field,
            format!("must be between {} and {}", range.start(), range.end()),
            value.to_string(),
        ))
    }
}

pub(crate) fn check_duration(
    field: &str,
    value: DurationSpec,
    seconds: RangeInclusive<u64>,
) -> Result<()> {
    if seconds.contains(&value.as_secs()) {
        Ok(())
    } else {
        Err(Invalid::new(
            field,
            format!(
                "must be between {} and {}",
                DurationSpec::from_secs(*seconds.start()),
                DurationSpec::from_secs(*seconds.end())
            ),
            value.to_string(),
        ))
    }
}

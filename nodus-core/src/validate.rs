//! Validation of user-written documents: every error names the field, the rule and the value.
//!
//! [`parse`] turns a JSON document into a typed [`Object`] and checks it; [`validate`] re-checks
//! a typed object (after a patch, say). Each kind's own rules live in its [`Validate`] impl.
//! An error is one [`Invalid`]: the field path as written in the YAML (`spec.dependsOn[1]`),
//! the rule it breaks, and the offending value, shortened when long so that an error never
//! echoes a whole 256 KiB input.

use std::collections::BTreeSet;
use std::fmt::{Display, Write as _};
use std::ops::RangeInclusive;

use serde_json::Value;

use crate::resource::{
    API_VERSION, Access, AgentEnvironmentSpec, AgentGroupSpec, AgentRunSpec, AgentSpec, BudgetSpec,
    DurationSpec, EvaluationSpec, FileSetSpec, GroupLimits, ModelAccess, NameOrInline, Object,
    ObjectMeta, Secret, Spec, WorkdirSpec,
};

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

mod context;
mod network;
pub use context::{
    DIALECT as CONTEXT_SCHEMA_DIALECT, FEATURE as CONTEXT_SCHEMA_FEATURE, check_context,
};
pub use network::check_network_spec;

/// The largest input, message, system prompt or default input: 256 KiB.
pub const MAX_INPUT_BYTES: usize = 256 * 1024;
/// Allowed `spec.maxTokens` of an Agent.
pub const MAX_TOKENS_RANGE: RangeInclusive<u32> = 1..=128_000;
/// Allowed `spec.maxToolCalls` of an Agent.
pub const MAX_TOOL_CALLS_RANGE: RangeInclusive<u32> = 1..=1000;
/// Allowed `spec.limits.maxPending` of an AgentGroup.
pub const MAX_PENDING_RANGE: RangeInclusive<u32> = 1..=GroupLimits::DEFAULT_MAX_PENDING;
/// Allowed `spec.timeout` of an AgentRun, in seconds: one second to 24 hours.
pub const RUN_TIMEOUT_RANGE: RangeInclusive<u64> = 1..=DAY_SECS;
/// Allowed `spec.evaluation.timeout` of an AgentGroup, in seconds: one minute to 24 hours.
pub const EVALUATION_TIMEOUT_RANGE: RangeInclusive<u64> = 60..=DAY_SECS;
/// The most cases (`tasks` × `repetitions`) an evaluation batch may have.
pub const MAX_EVALUATION_CASES: u64 = 100;
/// The longest label key, in characters.
pub const MAX_LABEL_KEY_CHARS: usize = 253;
/// The longest label value, in characters.
pub const MAX_LABEL_VALUE_CHARS: usize = 63;
/// The longest message key, in characters.
pub const MAX_MESSAGE_KEY_CHARS: usize = 253;
/// The longest component of a path in a working directory, in bytes (what file systems take).
pub const MAX_PATH_COMPONENT_BYTES: usize = 255;
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
/// The key of a run's `spec.context` that Nodus keeps for itself.
pub const RESERVED_CONTEXT_KEY: &str = "nodus";

const DAY_SECS: u64 = 24 * 3600;
/// Characters of a value shown before it is cut.
const SHOWN_CHARS: usize = 80;
/// Characters of an unrecognised deserializer message kept as the rule.
const SHOWN_MESSAGE_CHARS: usize = 160;
/// Path steps shown before the middle of a deep path is elided.
const SHOWN_STEPS: usize = 24;
/// What an error shows for a field that is absent.
const NOTHING: &str = "nothing";
/// JSON Schema keywords that would make a `contextSchema` depend on other documents.
const REFERENCE_KEYWORDS: [&str; 3] = ["$ref", "$dynamicRef", "$recursiveRef"];

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

impl Validate for AgentSpec {
    fn check_spec(&self) -> Result<()> {
        check_message("spec.system", &self.system)?;
        check_model(&self.model)?;
        check_range("spec.maxTokens", self.max_tokens, MAX_TOKENS_RANGE)?;
        check_range(
            "spec.maxToolCalls",
            self.max_tool_calls,
            MAX_TOOL_CALLS_RANGE,
        )?;
        if let Some(schema) = &self.context_schema {
            check_context_schema(schema)?;
        }
        if let Some(input) = &self.default_input {
            check_message("spec.defaultInput", input)?;
        }
        if let Some(actions) = &self.post_run_actions {
            if actions.is_empty() {
                return Err(Invalid::new(
                    "spec.postRunActions",
                    "must list at least one action kind when set",
                    "[]",
                ));
            }
            for (index, action) in actions.iter().enumerate() {
                check_not_blank(&format!("spec.postRunActions[{index}]"), action)?;
            }
        }
        if let Some(environment) = &self.environment {
            check_environment_ref("spec.environment", environment)?;
        }
        Ok(())
    }
}

impl Validate for AgentEnvironmentSpec {
    fn check_spec(&self) -> Result<()> {
        check_environment("spec", self)
    }
}

/// The most entries of `spec.network.allow`.
const MAX_ALLOW_ENTRIES: usize = 256;

/// The rules of `spec.network`: an allowlist's entries each a `host` (a name, or `*.domain`)
/// or a `cidr`, with 1 to 32 ports other than 0; `allow` only with `egress: allowlist`;
/// `inject` by [`network::check_inject`]. Whether a `cidr` is inside the operator's
/// `--egress-allow` is checked when a run is created.
fn check_network(prefix: &str, network: &crate::resource::NetworkSpec) -> Result<()> {
    use crate::resource::EgressMode;
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
                if !network::valid_host_pattern(host) {
                    return Err(Invalid::new(
                        format!("{field}.host"),
                        network::HOST_RULE,
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

/// A run's or an agent's `environment`: a reference, or an environment written inline.
fn check_environment_ref(
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
    network::check_inject(&format!("{prefix}.network"), &spec.network)?;
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

impl Validate for AgentRunSpec {
    fn check_spec(&self) -> Result<()> {
        match &self.agent {
            NameOrInline::Name(name) => check_reference("spec.agent", name)?,
            NameOrInline::Inline(agent) => {
                // The agent's own rules, its fields under spec.agent.
                agent.check_spec().map_err(|e| Invalid {
                    field: e.field.replacen("spec.", "spec.agent.", 1),
                    ..e
                })?;
                if self.group.is_some() {
                    return Err(Invalid::new(
                        "spec.agent",
                        "must name the group's agent for a run of a group, not be written inline",
                        "an inline agent",
                    ));
                }
            }
        }
        if let Some(input) = &self.input {
            check_message("spec.input", input)?;
        }
        check_task(self)?;
        if let Some(context) = &self.context
            && let Some(value) = context.get(RESERVED_CONTEXT_KEY)
        {
            return Err(Invalid::new(
                format!("spec.context.{RESERVED_CONTEXT_KEY}"),
                "is reserved for Nodus",
                shown_json(Some(value)),
            ));
        }
        if let Some(workdir) = &self.workdir {
            check_workdir(workdir)?;
        }
        if let Some(environment) = &self.environment {
            check_environment_ref("spec.environment", environment)?;
        }
        if let Some(timeout) = self.timeout {
            check_duration("spec.timeout", timeout, RUN_TIMEOUT_RANGE)?;
        }
        if let Some(image) = &self.image {
            check_image_reference("spec.image", image)?;
        }
        if let Some(action) = &self.post_run_action {
            check_not_blank("spec.postRunAction.kind", &action.kind)?;
        }
        Ok(())
    }

    /// A task of a group may leave its name out; when set it must be `<group>-<taskKey>`.
    fn check_metadata(&self, metadata: &ObjectMeta) -> Result<()> {
        check_common_metadata(metadata)?;
        let Some(group) = &self.group else {
            return require_name(metadata);
        };
        // A missing or malformed group or task key is reported by `check_spec`.
        let Some(task_key) = &self.task_key else {
            return Ok(());
        };
        if !is_dns_label(group) || !is_dns_label(task_key) {
            return Ok(());
        }
        let expected = task_run_name(group, task_key);
        match &metadata.name {
            None if is_dns_label(&expected) => Ok(()),
            None => Err(Invalid::new(
                "spec.taskKey",
                "must make a run name `<group>-<taskKey>` of at most 63 characters",
                shown(&expected),
            )),
            Some(name) if *name == expected => Ok(()),
            Some(name) => Err(Invalid::new(
                "metadata.name",
                format!(
                    "must be {} (`<group>-<taskKey>`) or left out for a task of a group",
                    shown(&expected)
                ),
                shown(name),
            )),
        }
    }
}

/// The most files one FileSet holds.
pub const MAX_FILESET_FILES: usize = 10_000;

impl Validate for FileSetSpec {
    fn check_spec(&self) -> Result<()> {
        if self.files.len() > MAX_FILESET_FILES {
            return Err(Invalid::new(
                "spec.files",
                format!("must hold at most {MAX_FILESET_FILES} files"),
                self.files.len().to_string(),
            ));
        }
        let mut paths = Vec::with_capacity(self.files.len());
        for (index, file) in self.files.iter().enumerate() {
            let field = format!("spec.files[{index}].path");
            paths.push((check_mount_path(&field, &file.path)?, index));
            if let Some(encoded) = &file.content_base64 {
                let field = format!("spec.files[{index}].contentBase64");
                if !file.content.is_empty() {
                    return Err(Invalid::new(
                        field,
                        "must not be given with content: a file has one or the other",
                        shown(encoded),
                    ));
                }
                if let Err(e) = file.bytes() {
                    return Err(Invalid::new(
                        field,
                        format!("must be standard base64 ({e})"),
                        shown(encoded),
                    ));
                }
            }
        }
        check_no_overlap(paths, &|index| {
            let path = self.files.get(index).map_or("", |f| f.path.as_str());
            (format!("spec.files[{index}].path"), path)
        })
    }
}

impl Validate for AgentGroupSpec {
    fn check_spec(&self) -> Result<()> {
        check_reference("spec.agent", &self.agent)?;
        check_range(
            "spec.limits.maxActive",
            self.limits.max_active,
            GroupLimits::MAX_ACTIVE_RANGE,
        )?;
        check_range(
            "spec.limits.maxPending",
            self.limits.max_pending,
            MAX_PENDING_RANGE,
        )?;
        if let Some(evaluation) = &self.evaluation {
            check_evaluation(evaluation)?;
        }
        Ok(())
    }
}

impl Validate for BudgetSpec {
    /// A Budget's one field is typed money; its type is its rule.
    fn check_spec(&self) -> Result<()> {
        Ok(())
    }
}

/// The longest key of a Secret's values.
pub const MAX_SECRET_KEY_CHARS: usize = 253;

/// Reads a user's Secret (`apiVersion`, `kind`, `metadata`, `type`, `stringData`) and checks
/// it. A value never appears in an error.
pub(crate) fn parse_secret(document: Value) -> Result<Secret> {
    let Value::Object(mut fields) = document else {
        return Err(Invalid::new(
            "",
            "a Secret is a JSON object",
            shown_json(Some(&document)),
        ));
    };
    const FIELDS: [&str; 5] = ["apiVersion", "kind", "metadata", "stringData", "type"];
    if let Some(unknown) = fields.keys().find(|k| !FIELDS.contains(&k.as_str())) {
        let rule = if unknown == "data" {
            "unknown field (write values as stringData)"
        } else {
            "unknown field"
        };
        return Err(Invalid::new(unknown.clone(), rule, shown(unknown)));
    }
    let api_version = fields.remove("apiVersion");
    if api_version.as_ref().and_then(Value::as_str) != Some(API_VERSION) {
        return Err(Invalid::new(
            "apiVersion",
            format!("must be {API_VERSION}"),
            shown_json(api_version.as_ref()),
        ));
    }
    let kind = fields.remove("kind");
    if kind.as_ref().and_then(Value::as_str) != Some("Secret") {
        return Err(Invalid::new(
            "kind",
            "must be Secret",
            shown_json(kind.as_ref()),
        ));
    }
    let metadata = fields.remove("metadata").unwrap_or(Value::Null);
    let metadata: ObjectMeta = if metadata.is_null() {
        ObjectMeta::default()
    } else {
        let wrapped = serde_json::json!({ "metadata": metadata });
        #[derive(serde::Deserialize)]
        struct Wrapped {
            metadata: ObjectMeta,
        }
        serde_path_to_error::deserialize::<_, Wrapped>(&wrapped)
            .map_err(|error| deserialize_error(&wrapped, &error))?
            .metadata
    };
    let secret_type = match fields.remove("type") {
        None | Some(Value::Null) => None,
        Some(Value::String(text)) => Some(text),
        Some(other) => {
            return Err(Invalid::new(
                "type",
                "is a string",
                shown_json(Some(&other)),
            ));
        }
    };
    let values = match fields.remove("stringData") {
        None | Some(Value::Null) => std::collections::BTreeMap::new(),
        Some(Value::Object(map)) => {
            let mut values = std::collections::BTreeMap::new();
            for (key, value) in map {
                let Value::String(value) = value else {
                    let mut field = String::from("stringData");
                    push_key(&mut field, &key);
                    return Err(Invalid::new(field, "is a string", "another type"));
                };
                values.insert(key, crate::secret::SecretString::new(value));
            }
            values
        }
        Some(_) => {
            return Err(Invalid::new(
                "stringData",
                "is a map of string keys to string values",
                "another shape",
            ));
        }
    };
    let secret = Secret {
        metadata,
        secret_type,
        keys: values.keys().cloned().collect(),
        values,
        sealed: None,
    };
    check_secret(&secret)?;
    Ok(secret)
}

/// Checks a Secret: its metadata (a name is required) and its keys (1 to
/// [`MAX_SECRET_KEY_CHARS`] characters).
pub(crate) fn check_secret(secret: &Secret) -> Result<()> {
    check_common_metadata(&secret.metadata)?;
    require_name(&secret.metadata)?;
    if let Some(key) = secret
        .values
        .keys()
        .find(|k| k.is_empty() || k.chars().count() > MAX_SECRET_KEY_CHARS)
    {
        return Err(Invalid::new(
            "stringData",
            format!("keys are 1 to {MAX_SECRET_KEY_CHARS} characters"),
            shown(key),
        ));
    }
    Ok(())
}

/// `apiVersion` and `kind` of the raw document, so that a document of another kind is named
/// as such rather than by its first unknown field.
fn check_header<S: Spec>(document: &Value) -> Result<()> {
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
fn check_common_metadata(metadata: &ObjectMeta) -> Result<()> {
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

fn require_name(metadata: &ObjectMeta) -> Result<()> {
    match metadata.name {
        Some(_) => Ok(()),
        None => Err(Invalid::new("metadata.name", "required", NOTHING)),
    }
}

fn check_model(model: &ModelAccess) -> Result<()> {
    match model.access {
        Access::Byok => {
            if let Some(families) = &model.families {
                return Err(Invalid::new(
                    "spec.model.families",
                    "must not be set with access BYOK, which names one model",
                    shorten(&family_list(families), SHOWN_CHARS),
                ));
            }
            match &model.name {
                None => {
                    return Err(Invalid::new(
                        "spec.model.name",
                        "required with access BYOK",
                        NOTHING,
                    ));
                }
                Some(name) => check_not_blank("spec.model.name", name)?,
            }
            match &model.api_key_secret {
                None => {
                    return Err(Invalid::new(
                        "spec.model.apiKeySecret",
                        "required with access BYOK",
                        NOTHING,
                    ));
                }
                Some(secret) => check_dns_label("spec.model.apiKeySecret", secret)?,
            }
        }
        Access::Nodus => {
            if let Some(secret) = &model.api_key_secret {
                return Err(Invalid::new(
                    "spec.model.apiKeySecret",
                    "must not be set with access Nodus, which needs no key",
                    shown(secret),
                ));
            }
            if let Some(name) = &model.name {
                check_not_blank("spec.model.name", name)?;
            }
        }
    }
    if let Some(families) = &model.families {
        if families.is_empty() {
            return Err(Invalid::new(
                "spec.model.families",
                "must list at least one family when set",
                "[]",
            ));
        }
        let mut seen = BTreeSet::new();
        for (index, family) in families.iter().enumerate() {
            if !seen.insert(*family) {
                return Err(Invalid::new(
                    format!("spec.model.families[{index}]"),
                    "must not repeat a family",
                    family.as_str(),
                ));
            }
        }
    }
    Ok(())
}

fn family_list(families: &[crate::catalog::Family]) -> String {
    let names: Vec<&str> = families.iter().map(|family| family.as_str()).collect();
    format!("[{}]", names.join(", "))
}

/// A JSON object with no reference keyword anywhere (walked without recursion), and a valid
/// JSON Schema 2020-12 document.
fn check_context_schema(schema: &Value) -> Result<()> {
    const PREFIX: [Step<'static>; 2] = [Step::Key("spec"), Step::Key("contextSchema")];
    if !schema.is_object() {
        return Err(Invalid::new(
            field_path(&PREFIX),
            "must be a JSON Schema object",
            shown_json(Some(schema)),
        ));
    }
    // Every visited node with its parent, so that a path is built only for an error.
    let mut nodes: Vec<(Option<usize>, Step<'_>)> = Vec::new();
    let mut pending: Vec<(&Value, Option<usize>)> = vec![(schema, None)];
    while let Some((value, node)) = pending.pop() {
        match value {
            Value::Object(map) => {
                for (key, child) in map {
                    nodes.push((node, Step::Key(key)));
                    let child_node = nodes.len() - 1;
                    if REFERENCE_KEYWORDS.contains(&key.as_str()) {
                        let mut steps = Vec::from(PREFIX);
                        steps.extend(steps_to(&nodes, child_node));
                        return Err(Invalid::new(
                            field_path(&steps),
                            "must not use $ref, $dynamicRef or $recursiveRef: \
                             the schema must be self-contained",
                            shown_json(Some(child)),
                        ));
                    }
                    pending.push((child, Some(child_node)));
                }
            }
            Value::Array(items) => {
                for (index, item) in items.iter().enumerate() {
                    nodes.push((node, Step::Index(index)));
                    pending.push((item, Some(nodes.len() - 1)));
                }
            }
            _ => {}
        }
    }
    context::check_schema(schema)
}

/// The steps from the root to `node`, following parents.
fn steps_to<'a>(nodes: &[(Option<usize>, Step<'a>)], node: usize) -> Vec<Step<'a>> {
    let mut steps = Vec::new();
    let mut current = Some(node);
    while let Some((parent, step)) = current.and_then(|index| nodes.get(index)) {
        steps.push(*step);
        current = *parent;
    }
    steps.reverse();
    steps
}

/// `group`, `taskKey` and `dependsOn`.
fn check_task(spec: &AgentRunSpec) -> Result<()> {
    match (&spec.group, &spec.task_key) {
        (Some(group), task_key) => {
            check_dns_label("spec.group", group)?;
            match task_key {
                None => {
                    return Err(Invalid::new(
                        "spec.taskKey",
                        "required with spec.group",
                        NOTHING,
                    ));
                }
                Some(task_key) => check_dns_label("spec.taskKey", task_key)?,
            }
        }
        (None, Some(task_key)) => {
            return Err(Invalid::new(
                "spec.taskKey",
                "only allowed with spec.group",
                shown(task_key),
            ));
        }
        (None, None) => {}
    }
    if spec.depends_on.is_empty() {
        return Ok(());
    }
    if spec.group.is_none() {
        return Err(Invalid::new(
            "spec.dependsOn",
            "only allowed with spec.group",
            shorten(&format!("{:?}", spec.depends_on), SHOWN_CHARS),
        ));
    }
    let mut seen = BTreeSet::new();
    for (index, dependency) in spec.depends_on.iter().enumerate() {
        let field = format!("spec.dependsOn[{index}]");
        check_dns_label(&field, dependency)?;
        if !seen.insert(dependency.as_str()) {
            return Err(Invalid::new(
                field,
                "must not repeat a task key",
                shown(dependency),
            ));
        }
        if spec.task_key.as_ref() == Some(dependency) {
            return Err(Invalid::new(
                field,
                "must not be the run's own taskKey",
                shown(dependency),
            ));
        }
    }
    Ok(())
}

/// `baseWorkdir`, and artifact mounts at distinct, non-overlapping relative paths.
fn check_workdir(workdir: &WorkdirSpec) -> Result<()> {
    if let Some(base) = &workdir.base_workdir {
        check_not_blank("spec.workdir.baseWorkdir", base)?;
    }
    let mut paths: Vec<(Vec<&str>, usize)> = Vec::with_capacity(workdir.artifact_mounts.len());
    for (index, mount) in workdir.artifact_mounts.iter().enumerate() {
        let field = format!("spec.workdir.artifactMounts[{index}]");
        check_not_blank(&format!("{field}.ref"), &mount.reference)?;
        let components = check_mount_path(&format!("{field}.mountPath"), &mount.mount_path)?;
        paths.push((components, index));
    }
    check_no_overlap(paths, &|index| {
        let path = workdir
            .artifact_mounts
            .get(index)
            .map_or("", |m| m.mount_path.as_str());
        (
            format!("spec.workdir.artifactMounts[{index}].mountPath"),
            path,
        )
    })
}

/// No path (its components, with its index) is another's, or inside another's; `describe`
/// gives an index's field and path for the error, which names the later of the two.
fn check_no_overlap<'a>(
    mut paths: Vec<(Vec<&str>, usize)>,
    describe: &dyn Fn(usize) -> (String, &'a str),
) -> Result<()> {
    // Sorted component-wise, a path that contains another comes right after one that it
    // contains, so comparing neighbours finds every overlap.
    paths.sort();
    for pair in paths.windows(2) {
        if let [(first, first_index), (second, second_index)] = pair
            && second.starts_with(first)
        {
            let (earlier, later) = if first_index < second_index {
                (*first_index, *second_index)
            } else {
                (*second_index, *first_index)
            };
            let (earlier_field, earlier_path) = describe(earlier);
            let (later_field, later_path) = describe(later);
            return Err(Invalid::new(
                later_field,
                format!("must not overlap {earlier_field} ({})", shown(earlier_path)),
                shown(later_path),
            ));
        }
    }
    Ok(())
}

/// A relative path inside the working directory; returns its components.
fn check_mount_path<'a>(field: &str, path: &'a str) -> Result<Vec<&'a str>> {
    if path.is_empty() {
        return Err(Invalid::new(field, "must not be empty", shown(path)));
    }
    if path.contains('\0') {
        return Err(Invalid::new(field, "must not contain NUL", shown(path)));
    }
    if path.contains(char::is_control) {
        return Err(Invalid::new(
            field,
            "must not contain control characters",
            shown(path),
        ));
    }
    if path.contains(is_bidi_control) {
        return Err(Invalid::new(
            field,
            "must not contain bidirectional overrides or isolates (U+202A to U+202E, \
             U+2066 to U+2069)",
            shown(path),
        ));
    }
    if path.starts_with('/') {
        return Err(Invalid::new(
            field,
            "must be relative to the working directory",
            shown(path),
        ));
    }
    let components: Vec<&str> = path
        .split('/')
        .filter(|component| !component.is_empty() && *component != ".")
        .collect();
    if components.contains(&"..") {
        return Err(Invalid::new(
            field,
            "must not contain `..` components",
            shown(path),
        ));
    }
    if components.is_empty() {
        return Err(Invalid::new(
            field,
            "must name a file inside the working directory",
            shown(path),
        ));
    }
    if components
        .iter()
        .any(|component| component.starts_with('-'))
    {
        return Err(Invalid::new(
            field,
            "must not have a component that starts with `-` (a command would read it as an \
             option)",
            shown(path),
        ));
    }
    if let Some(long) = components
        .iter()
        .find(|component| component.len() > MAX_PATH_COMPONENT_BYTES)
    {
        return Err(Invalid::new(
            field,
            format!(
                "must not have a component longer than {MAX_PATH_COMPONENT_BYTES} bytes (one \
                 has {})",
                long.len()
            ),
            shown(path),
        ));
    }
    Ok(components)
}

/// Characters that reorder how text is displayed (bidirectional embeddings, overrides and
/// isolates), so that a path would look like another one.
fn is_bidi_control(c: char) -> bool {
    matches!(c, '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}')
}

fn check_evaluation(evaluation: &EvaluationSpec) -> Result<()> {
    check_environment_version("spec.evaluation.environment", &evaluation.environment)?;
    if let Some(split) = &evaluation.split {
        check_not_blank("spec.evaluation.split", split)?;
    }
    if evaluation.tasks < 1 {
        return Err(Invalid::new(
            "spec.evaluation.tasks",
            "must be at least 1",
            evaluation.tasks.to_string(),
        ));
    }
    if evaluation.repetitions < 1 {
        return Err(Invalid::new(
            "spec.evaluation.repetitions",
            "must be at least 1",
            evaluation.repetitions.to_string(),
        ));
    }
    let cases = u64::from(evaluation.tasks) * u64::from(evaluation.repetitions);
    if cases > MAX_EVALUATION_CASES {
        return Err(Invalid::new(
            "spec.evaluation.tasks",
            format!("times repetitions must be at most {MAX_EVALUATION_CASES} cases in the batch"),
            format!(
                "{} tasks x {} repetitions = {cases}",
                evaluation.tasks, evaluation.repetitions
            ),
        ));
    }
    if let Some(timeout) = evaluation.timeout {
        check_duration("spec.evaluation.timeout", timeout, EVALUATION_TIMEOUT_RANGE)?;
    }
    Ok(())
}

/// `[project/]name@version`, with a non-empty version.
fn check_environment_version(field: &str, text: &str) -> Result<()> {
    const RULE: &str = "must be `name@version` or `project/name@version`, with DNS labels \
                        for project and name and a version without spaces, '/' or '@'";
    let valid = text.split_once('@').is_some_and(|(reference, version)| {
        is_reference(reference)
            && !version.is_empty()
            && !version
                .chars()
                .any(|c| c.is_whitespace() || c.is_control() || c == '/' || c == '@')
    });
    if valid {
        Ok(())
    } else {
        Err(Invalid::new(field, RULE, shown(text)))
    }
}

fn is_reference(text: &str) -> bool {
    match text.split_once('/') {
        Some((project, name)) => is_dns_label(project) && is_dns_label(name),
        None => is_dns_label(text),
    }
}

fn check_reference(field: &str, text: &str) -> Result<()> {
    if is_reference(text) {
        Ok(())
    } else {
        Err(Invalid::new(field, REFERENCE_RULE, shown(text)))
    }
}

fn check_dns_label(field: &str, text: &str) -> Result<()> {
    if is_dns_label(text) {
        Ok(())
    } else {
        Err(Invalid::new(field, DNS_LABEL_RULE, shown(text)))
    }
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

fn check_not_blank(field: &str, text: &str) -> Result<()> {
    if text.trim().is_empty() {
        Err(Invalid::new(field, "must not be empty", shown(text)))
    } else {
        Ok(())
    }
}

fn check_range<T: PartialOrd + Display>(
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

/// Turns a deserializer's error into an [`Invalid`] naming the field's path.
fn deserialize_error(
    document: &Value,
    error: &serde_path_to_error::Error<serde_json::Error>,
) -> Invalid {
    use serde_path_to_error::Segment;

    let mut steps: Vec<Step<'_>> = error
        .path()
        .iter()
        .map(|segment| match segment {
            Segment::Seq { index } => Step::Index(*index),
            Segment::Map { key } => Step::Key(key),
            Segment::Enum { variant } => Step::Key(variant),
            Segment::Unknown => Step::Key("?"),
        })
        .collect();
    let found = || shown_json(lookup(document, error.path()));
    let message = error.inner().to_string();

    if let Some(rest) = message.strip_prefix("unknown field `") {
        // The path already ends with the unknown key; keep serde's list of expected fields.
        let tail = match steps.last() {
            Some(Step::Key(key)) => rest.strip_prefix(*key).and_then(|r| r.strip_prefix('`')),
            _ => None,
        };
        let value = match (steps.last(), tail) {
            (Some(Step::Key(key)), Some(tail)) => format!("{}{tail}", shown(key)),
            _ => shorten(rest, SHOWN_MESSAGE_CHARS),
        };
        return Invalid::new(field_path(&steps), "unknown field", value);
    }
    if let Some(rest) = message.strip_prefix("missing field `") {
        let name = rest.strip_suffix('`').unwrap_or(rest);
        steps.push(Step::Key(name));
        return Invalid::new(field_path(&steps), "required", NOTHING);
    }
    let field = field_path(&steps);
    // Money and durations: "<rule>, got <text>".
    if let Some((rule, _)) = message.split_once(", got ") {
        return Invalid::new(field, rule, found());
    }
    // serde's own "invalid type: <found>, expected <what>" and the like; <found> may quote
    // the user's value in full, so only <what> is kept.
    let serdes_own = [
        "invalid type: ",
        "invalid value: ",
        "invalid length ",
        "unknown variant ",
    ]
    .iter()
    .any(|prefix| message.starts_with(prefix));
    if let Some((_, expected)) = message.rsplit_once(", expected ").filter(|_| serdes_own) {
        return Invalid::new(field, format!("expected {expected}"), found());
    }
    if message.starts_with("data did not match any variant") {
        return Invalid::new(field, "has the wrong type", found());
    }
    Invalid::new(field, shorten(&message, SHOWN_MESSAGE_CHARS), found())
}

/// The value at a deserializer's path in the document, when it is there.
fn lookup<'a>(document: &'a Value, path: &serde_path_to_error::Path) -> Option<&'a Value> {
    use serde_path_to_error::Segment;

    path.iter()
        .try_fold(document, |value, segment| match segment {
            Segment::Seq { index } => value.get(*index),
            Segment::Map { key } => value.get(key.as_str()),
            Segment::Enum { .. } | Segment::Unknown => None,
        })
}

/// One step of a field path.
#[derive(Debug, Clone, Copy)]
enum Step<'a> {
    Key(&'a str),
    Index(usize),
}

/// `spec.workdir.artifactMounts[0].mountPath`; odd keys are quoted (`labels["a.b/c"]`) and
/// the middle of a very deep path is elided.
fn field_path(steps: &[Step<'_>]) -> String {
    let elided = if steps.len() > SHOWN_STEPS {
        (SHOWN_STEPS / 2)..(steps.len() - SHOWN_STEPS / 2)
    } else {
        0..0
    };
    let mut path = String::new();
    for (position, step) in steps.iter().enumerate() {
        if elided.contains(&position) {
            if position == elided.start {
                path.push_str(".…");
            }
            continue;
        }
        match step {
            Step::Key(key) => push_key(&mut path, key),
            Step::Index(index) => {
                let _ = write!(path, "[{index}]");
            }
        }
    }
    if path.is_empty() {
        path.push_str("document");
    }
    path
}

fn push_key(path: &mut String, key: &str) {
    let plain = !key.is_empty()
        && key.len() <= SHOWN_CHARS
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '$' | '?'));
    if plain {
        if !path.is_empty() {
            path.push('.');
        }
        path.push_str(key);
    } else {
        path.push('[');
        path.push_str(&shown(key));
        path.push(']');
    }
}

/// A string as shown in an error: quoted, and cut after [`SHOWN_CHARS`] characters with its
/// length in bytes.
pub fn shown(text: &str) -> String {
    match text.char_indices().nth(SHOWN_CHARS) {
        None => format!("{text:?}"),
        Some((cut, _)) => format!(
            "{:?}… ({} bytes)",
            text.get(..cut).unwrap_or_default(),
            text.len()
        ),
    }
}

/// Text cut after `limit` characters, with its length in bytes.
fn shorten(text: &str, limit: usize) -> String {
    match text.char_indices().nth(limit) {
        None => text.to_owned(),
        Some((cut, _)) => format!(
            "{}… ({} bytes)",
            text.get(..cut).unwrap_or_default(),
            text.len()
        ),
    }
}

/// A JSON value as shown in an error.
fn shown_json(value: Option<&Value>) -> String {
    match value {
        None => NOTHING.to_owned(),
        Some(Value::String(text)) => shown(text),
        Some(other) => shorten(&other.to_string(), SHOWN_CHARS),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::Family;
    use crate::money::Usd;
    use crate::resource::{Agent, AgentGroup, AgentRun, Kind};
    use serde_json::json;

    // ---- helpers ----

    /// `document` with `value` written at the JSON pointer `at`, creating objects on the way.
    fn with(mut document: Value, at: &str, value: Value) -> Value {
        let (parent, key) = at.rsplit_once('/').expect("a pointer");
        let mut target = &mut document;
        for part in parent.split('/').skip(1) {
            let object = target.as_object_mut().expect("an object on the way");
            target = object.entry(part).or_insert_with(|| json!({}));
        }
        target
            .as_object_mut()
            .expect("an object")
            .insert(key.to_owned(), value);
        document
    }

    /// `document` without the field at the JSON pointer `at`.
    fn without(mut document: Value, at: &str) -> Value {
        let (parent, key) = at.rsplit_once('/').expect("a pointer");
        document
            .pointer_mut(parent)
            .and_then(Value::as_object_mut)
            .expect("the parent")
            .remove(key);
        document
    }

    /// Each document is refused naming `field`, and the message contains `shows`.
    fn check<S: Validate>(cases: Vec<(Value, &str, &str)>) {
        for (document, field, shows) in cases {
            let error = match parse::<S>(document.clone()) {
                Ok(_) => panic!("accepted, expected an error on {field}: {document}"),
                Err(error) => error,
            };
            let message = error.to_string();
            assert_eq!(error.field, field, "{message}");
            assert!(message.contains(shows), "{message:?} lacks {shows:?}");
            assert!(message.len() < 600, "too long: {message}");
        }
    }

    fn accept<S: Validate>(document: Value) -> Object<S> {
        match parse::<S>(document.clone()) {
            Ok(object) => object,
            Err(error) => panic!("refused: {error}\n{document}"),
        }
    }

    fn agent() -> Value {
        json!({
            "apiVersion": "nodus.dev/v1",
            "kind": "Agent",
            "metadata": { "name": "hello-agent" },
            "spec": {
                "system": "You are a careful assistant.\n",
                "model": { "access": "Nodus" },
                "perRunMaxCostUSD": "0.50"
            }
        })
    }

    fn byok_agent() -> Value {
        with(
            agent(),
            "/spec/model",
            json!({
                "access": "BYOK",
                "name": "claude-sonnet-5-5",
                "apiKeySecret": "anthropic-key"
            }),
        )
    }

    fn run() -> Value {
        json!({
            "apiVersion": "nodus.dev/v1",
            "kind": "AgentRun",
            "metadata": { "name": "hello-agent-run" },
            "spec": {
                "agent": "hello-agent",
                "input": "Use the shell to print the Python version, then tell me which one it is."
            }
        })
    }

    fn task(key: &str, depends_on: Value) -> Value {
        json!({
            "apiVersion": "nodus.dev/v1",
            "kind": "AgentRun",
            "metadata": { "name": format!("parallel-agents-{key}") },
            "spec": {
                "agent": "parallel-agents-worker",
                "group": "parallel-agents",
                "taskKey": key,
                "dependsOn": depends_on,
                "input": "What is the capital of France?"
            }
        })
    }

    fn group() -> Value {
        json!({
            "apiVersion": "nodus.dev/v1",
            "kind": "AgentGroup",
            "metadata": { "name": "parallel-agents" },
            "spec": {
                "agent": "parallel-agents-worker",
                "limits": { "maxActive": 2 },
                "maxCostUSD": "0.60"
            }
        })
    }

    fn evaluation_group() -> Value {
        json!({
            "apiVersion": "nodus.dev/v1",
            "kind": "AgentGroup",
            "metadata": { "name": "parallel-agents-eval" },
            "spec": {
                "agent": "parallel-agents-worker",
                "limits": { "maxActive": 2 },
                "maxCostUSD": "0.20",
                "evaluation": {
                    "environment": "nodus/arithmetic-v2@2.0.0",
                    "split": "test",
                    "tasks": 2,
                    "repetitions": 1,
                    "seed": 42,
                    "timeout": "10m"
                }
            }
        })
    }

    fn long(bytes: usize) -> String {
        "a".repeat(bytes)
    }

    // ---- the spec's examples ----

    #[test]
    fn the_specs_agents_pass_and_get_their_defaults() {
        let hello: Object<AgentSpec> = accept(agent());
        assert_eq!(hello.name(), "hello-agent");
        assert_eq!(hello.spec.per_run_max_cost_usd, Usd::from_cents(50));
        assert_eq!(hello.spec.max_tool_calls, 50);
        assert_eq!(hello.spec.max_tokens, AgentSpec::DEFAULT_MAX_TOKENS);

        let worker: Object<AgentSpec> = accept(json!({
            "apiVersion": "nodus.dev/v1",
            "kind": "Agent",
            "metadata": { "name": "parallel-agents-worker" },
            "spec": {
                "system": "Follow the task's requested answer format; otherwise answer in one short sentence.\n",
                "model": { "access": "Nodus", "families": ["haiku"] },
                "maxTokens": 1024,
                "perRunMaxCostUSD": "0.10"
            }
        }));
        assert_eq!(worker.spec.model.families, Some(vec![Family::Haiku]));
        assert_eq!(worker.spec.max_tokens, 1024);

        let byok: Object<AgentSpec> = accept(byok_agent());
        assert_eq!(byok.spec.model.access, Access::Byok);

        let minimal: Object<AgentSpec> = accept(json!({
            "apiVersion": "nodus.dev/v1",
            "kind": "Agent",
            "metadata": { "name": "minimal" },
            "spec": { "system": "Be brief." }
        }));
        assert_eq!(minimal.spec.per_run_max_cost_usd.to_string(), "1.00");
        assert_eq!(minimal.spec.max_tool_calls, 50);
        assert_eq!(minimal.spec.model.access, Access::Nodus);
    }

    #[test]
    fn the_specs_runs_pass() {
        let hello: AgentRun = accept(run());
        assert_eq!(
            hello.spec.agent,
            NameOrInline::Name("hello-agent".to_string())
        );
        accept::<AgentRunSpec>(task("a", json!([])));
        accept::<AgentRunSpec>(task("b", json!([])));
        let c: AgentRun = accept(task("c", json!(["a", "b"])));
        assert_eq!(c.spec.depends_on, ["a", "b"]);
        // A task may leave its name out.
        let unnamed: AgentRun = accept(without(task("d", json!(["c"])), "/metadata/name"));
        assert_eq!(unnamed.metadata.name, None);
        // A shared template and the optional fields.
        accept::<AgentRunSpec>(with(
            with(run(), "/spec/agent", json!("nodus/claude-assistant")),
            "/spec",
            json!({
                "agent": "nodus/claude-assistant",
                "input": "hi",
                "keepAlive": true,
                "deadline": "2030-01-01T00:00:00Z",
                "context": { "ticket": 42 },
                "workdir": {
                    "baseWorkdir": "repo",
                    "artifactMounts": [
                        { "ref": "files#a.txt", "mountPath": "data/a.txt" },
                        { "ref": "files#b.txt", "mountPath": "./data/b.txt" },
                        { "ref": "files#c.txt", "mountPath": "data-c.txt" }
                    ]
                },
                "environment": "team/staging",
                "timeout": "30m",
                "image": "python:3.13",
                "postRunAction": { "kind": "agents.noop" }
            }),
        ));
    }

    #[test]
    fn the_specs_groups_pass_and_get_their_defaults() {
        let parallel: AgentGroup = accept(group());
        assert_eq!(parallel.spec.limits.max_active, 2);
        assert_eq!(parallel.spec.limits.max_pending, 10_000);
        assert_eq!(parallel.spec.max_cost_usd, Some(Usd::from_cents(60)));

        let defaults: AgentGroup = accept(without(group(), "/spec/limits"));
        assert_eq!(defaults.spec.limits.max_active, 10);
        assert_eq!(defaults.spec.limits.max_pending, 10_000);

        let evaluation: AgentGroup = accept(evaluation_group());
        let spec = evaluation.spec.evaluation.expect("evaluation");
        assert_eq!((spec.tasks, spec.repetitions, spec.seed), (2, 1, 42));
        accept::<AgentGroupSpec>(with(
            evaluation_group(),
            "/spec/evaluation/environment",
            json!("arithmetic@v2"),
        ));
    }

    // ---- the error itself ----

    #[test]
    fn an_error_reads_field_rule_and_value() {
        let error = parse::<AgentGroupSpec>(with(group(), "/spec/limits/maxActive", json!(0)))
            .expect_err("0 is refused");
        assert_eq!(
            error.to_string(),
            "spec.limits.maxActive: must be between 1 and 1000 (got 0)"
        );
        assert_eq!(
            error,
            Invalid::new("spec.limits.maxActive", "must be between 1 and 1000", "0")
        );
    }

    #[test]
    fn long_values_are_shortened_with_their_length() {
        let error = parse::<AgentRunSpec>(with(run(), "/spec/input", json!(long(262_145))))
            .expect_err("too long");
        let message = error.to_string();
        assert_eq!(error.field, "spec.input");
        assert!(message.contains("(262145 bytes)"), "{message}");
        assert!(message.len() < 250, "{message}");
        // Also a long value of the wrong type, and a long unknown key.
        let error = parse::<AgentSpec>(with(agent(), "/spec/maxTokens", json!(long(100_000))))
            .expect_err("a string");
        assert!(error.to_string().contains("(100000 bytes)"), "{error}");
        assert!(error.to_string().len() < 250, "{error}");
        let error = parse::<AgentSpec>(with(agent(), &format!("/spec/{}", long(5_000)), json!(1)))
            .expect_err("unknown");
        assert_eq!(error.rule, "unknown field");
        assert!(error.to_string().len() < 600, "{error}");
    }

    #[test]
    fn check_message_allows_exactly_256_kib() {
        assert_eq!(check_message("payload", &long(MAX_INPUT_BYTES)), Ok(()));
        let error = check_message("payload", &long(MAX_INPUT_BYTES + 1)).expect_err("too long");
        assert_eq!(error.field, "payload");
        assert!(error.rule.contains("262144"), "{error}");
        let error = check_message("payload", "").expect_err("empty");
        assert_eq!(error.value, "\"\"");
        accept::<AgentRunSpec>(with(run(), "/spec/input", json!(long(MAX_INPUT_BYTES))));
        // Multi-byte characters count in bytes, and are never cut in half.
        let wide = "é".repeat(MAX_INPUT_BYTES / 2 + 1);
        let error = check_message("payload", &wide).expect_err("too long in bytes");
        assert!(error.value.contains("(262146 bytes)"), "{error}");
    }

    #[test]
    fn message_keys() {
        assert_eq!(check_message_key("staging-1"), Ok(()));
        assert_eq!(check_message_key(&long(253)), Ok(()));
        for bad in ["", "a\nb", long(254).as_str()] {
            let error = check_message_key(bad).expect_err(bad);
            assert_eq!(error.field, "messageKey");
        }
    }

    #[test]
    fn typed_objects_are_checked_by_kind() {
        assert_eq!(validate(&accept::<AgentSpec>(agent())), Ok(()));
        assert_eq!(validate(&accept::<AgentRunSpec>(run())), Ok(()));
        assert_eq!(validate(&accept::<AgentGroupSpec>(group())), Ok(()));
        let mut group: AgentGroup = accept(group());
        group.spec.limits.max_active = 0;
        assert_eq!(
            validate(&group).map_err(|e| e.field),
            Err("spec.limits.maxActive".to_owned())
        );
        let mut run: AgentRun = accept(task("a", json!([])));
        run.spec.depends_on = vec!["a".to_owned()];
        assert_eq!(
            validate(&run).map_err(|e| e.field),
            Err("spec.dependsOn[0]".to_owned())
        );
    }

    #[test]
    fn dns_labels() {
        for good in ["a", "a-b", "0", "abc123", long(63).as_str()] {
            assert!(is_dns_label(good), "{good}");
        }
        for bad in ["", "-a", "a-", "A", "a_b", "a.b", "é", long(64).as_str()] {
            assert!(!is_dns_label(bad), "{bad}");
        }
    }

    // ---- deserialization ----

    #[test]
    fn unknown_fields_are_refused_with_their_path() {
        check::<AgentSpec>(vec![
            (
                with(agent(), "/spec/bogus", json!(1)),
                "spec.bogus",
                "bogus",
            ),
            (
                with(agent(), "/spec/model/bogus", json!(1)),
                "spec.model.bogus",
                "bogus",
            ),
            (
                with(agent(), "/metadata/bogus", json!(1)),
                "metadata.bogus",
                "bogus",
            ),
            (with(agent(), "/bogus", json!(1)), "bogus", "bogus"),
        ]);
        check::<AgentGroupSpec>(vec![
            (
                with(group(), "/spec/limits/bogus", json!(1)),
                "spec.limits.bogus",
                "bogus",
            ),
            (
                with(evaluation_group(), "/spec/evaluation/bogus", json!(1)),
                "spec.evaluation.bogus",
                "expected one of",
            ),
        ]);
        check::<AgentRunSpec>(vec![
            (
                with(
                    run(),
                    "/spec/workdir",
                    json!({ "artifactMounts": [{ "ref": "f#a", "mountPath": "a", "bogus": 1 }] }),
                ),
                "spec.workdir.artifactMounts[0].bogus",
                "bogus",
            ),
            (
                with(
                    run(),
                    "/spec/postRunAction",
                    json!({ "kind": "agents.noop", "x": 1 }),
                ),
                "spec.postRunAction.x",
                "\"x\"",
            ),
        ]);
        let error = parse::<AgentGroupSpec>(with(group(), "/spec/limits/bogus", json!(1)))
            .expect_err("unknown");
        assert_eq!(error.rule, "unknown field");
    }

    #[test]
    fn wrong_types_and_malformed_values_name_their_path() {
        check::<AgentSpec>(vec![
            (
                with(agent(), "/spec/maxTokens", json!("many")),
                "spec.maxTokens",
                "\"many\"",
            ),
            (
                with(agent(), "/spec/maxTokens", json!(-1)),
                "spec.maxTokens",
                "-1",
            ),
            (
                with(agent(), "/spec/maxTokens", json!(5_000_000_000u64)),
                "spec.maxTokens",
                "5000000000",
            ),
            (
                with(agent(), "/spec/perRunMaxCostUSD", json!("abc")),
                "spec.perRunMaxCostUSD",
                "\"abc\"",
            ),
            (
                with(agent(), "/spec/perRunMaxCostUSD", json!("-1")),
                "spec.perRunMaxCostUSD",
                "without a sign",
            ),
            (
                with(agent(), "/spec/perRunMaxCostUSD", json!(0.5)),
                "spec.perRunMaxCostUSD",
                "expected a string (got 0.5)",
            ),
            (
                with(agent(), "/spec/model/access", json!("Other")),
                "spec.model.access",
                "\"Other\"",
            ),
            (
                with(agent(), "/spec/model/families", json!(["haiku", "gpt"])),
                "spec.model.families[1]",
                "\"gpt\"",
            ),
            (
                with(agent(), "/spec/state", json!("Paused")),
                "spec.state",
                "\"Paused\"",
            ),
            (without(agent(), "/spec/system"), "spec.system", "required"),
            (without(agent(), "/spec"), "spec", "required"),
            (json!("an agent"), "document", "\"an agent\""),
            (
                with(agent(), "/metadata/labels", json!({ "team": 1 })),
                "metadata.labels.team",
                "1",
            ),
        ]);
        check::<AgentRunSpec>(vec![
            (
                with(run(), "/spec/timeout", json!("5x")),
                "spec.timeout",
                "\"5x\"",
            ),
            (
                with(run(), "/spec/timeout", json!(true)),
                "spec.timeout",
                "true",
            ),
            (
                with(run(), "/spec/deadline", json!("soon")),
                "spec.deadline",
                "year",
            ),
            (
                with(run(), "/spec/deadline", json!("2030-01-01")),
                "spec.deadline",
                "\"2030-01-01\"",
            ),
            (
                with(run(), "/spec/dependsOn", json!(["a", 2])),
                "spec.dependsOn[1]",
                "2",
            ),
            (
                with(run(), "/spec/context", json!([1])),
                "spec.context",
                "[1]",
            ),
            (without(run(), "/spec/agent"), "spec.agent", "required"),
        ]);
        check::<AgentGroupSpec>(vec![(
            with(group(), "/spec/maxCostUSD", json!("0.1234567890")),
            "spec.maxCostUSD",
            "\"0.1234567890\"",
        )]);
    }

    #[test]
    fn api_version_and_kind() {
        check::<AgentSpec>(vec![
            (
                with(agent(), "/apiVersion", json!("nodus.dev/v2")),
                "apiVersion",
                "\"nodus.dev/v2\"",
            ),
            (run(), "kind", "must be Agent (got \"AgentRun\")"),
            (with(agent(), "/kind", json!("Pod")), "kind", "\"Pod\""),
            (without(agent(), "/kind"), "kind", "required"),
        ]);
        check::<AgentRunSpec>(vec![(group(), "kind", "must be AgentRun")]);
        // Typed objects are re-checked the same way.
        let mut object: Agent = accept(agent());
        object.kind = Kind::AgentGroup;
        assert_eq!(
            validate(&object).map_err(|e| e.field),
            Err("kind".to_owned())
        );
        object.kind = Kind::Agent;
        object.api_version = "v1".to_owned();
        assert_eq!(
            validate(&object).map_err(|e| e.field),
            Err("apiVersion".to_owned())
        );
    }

    // ---- metadata ----

    #[test]
    fn metadata_rules() {
        check::<AgentSpec>(vec![
            (
                without(agent(), "/metadata/name"),
                "metadata.name",
                "required",
            ),
            (
                with(agent(), "/metadata/name", json!("Hello")),
                "metadata.name",
                "\"Hello\"",
            ),
            (
                with(agent(), "/metadata/name", json!("")),
                "metadata.name",
                "\"\"",
            ),
            (
                with(agent(), "/metadata/name", json!("-a")),
                "metadata.name",
                "\"-a\"",
            ),
            (
                with(agent(), "/metadata/name", json!("a-")),
                "metadata.name",
                "\"a-\"",
            ),
            (
                with(agent(), "/metadata/name", json!("a_b")),
                "metadata.name",
                "\"a_b\"",
            ),
            (
                with(agent(), "/metadata/name", json!(long(64))),
                "metadata.name",
                &long(64),
            ),
            (
                with(agent(), "/metadata/project", json!("My.Project")),
                "metadata.project",
                "My.Project",
            ),
            (
                with(agent(), "/metadata/labels", json!({ "": "x" })),
                "metadata.labels",
                "\"\"",
            ),
            (
                with(agent(), "/metadata/labels", json!({ long(254): "x" })),
                "metadata.labels",
                "(254 bytes)",
            ),
            (
                with(agent(), "/metadata/labels", json!({ "team": long(64) })),
                "metadata.labels.team",
                &long(64),
            ),
            (
                with(
                    agent(),
                    "/metadata/labels",
                    json!({ "app.nodus.dev/tier": long(64) }),
                ),
                "metadata.labels[\"app.nodus.dev/tier\"]",
                "at most 63",
            ),
        ]);
        check::<AgentGroupSpec>(vec![(
            without(group(), "/metadata/name"),
            "metadata.name",
            "required",
        )]);
        let labelled: Agent = accept(with(
            with(
                agent(),
                "/metadata/labels",
                json!({ long(253): long(63), "a": "" }),
            ),
            "/metadata/project",
            json!("team-a"),
        ));
        assert_eq!(labelled.metadata.project.as_deref(), Some("team-a"));
    }

    #[test]
    fn run_names_and_tasks() {
        check::<AgentRunSpec>(vec![
            (
                without(run(), "/metadata/name"),
                "metadata.name",
                "required",
            ),
            (
                with(task("a", json!([])), "/metadata/name", json!("other")),
                "metadata.name",
                "\"parallel-agents-a\"",
            ),
            (
                without(
                    with(task(&long(40), json!([])), "/spec/group", json!(long(40))),
                    "/metadata/name",
                ),
                "spec.taskKey",
                "at most 63 characters",
            ),
        ]);
    }

    // ---- Agent ----

    #[test]
    fn agent_rules() {
        check::<AgentSpec>(vec![
            (
                with(agent(), "/spec/system", json!("")),
                "spec.system",
                "must not be empty",
            ),
            (
                with(agent(), "/spec/system", json!(long(MAX_INPUT_BYTES + 1))),
                "spec.system",
                "(262145 bytes)",
            ),
            (
                with(agent(), "/spec/maxTokens", json!(0)),
                "spec.maxTokens",
                "between 1 and 128000 (got 0)",
            ),
            (
                with(agent(), "/spec/maxTokens", json!(128_001)),
                "spec.maxTokens",
                "128001",
            ),
            (
                with(agent(), "/spec/maxToolCalls", json!(0)),
                "spec.maxToolCalls",
                "between 1 and 1000 (got 0)",
            ),
            (
                with(agent(), "/spec/maxToolCalls", json!(1001)),
                "spec.maxToolCalls",
                "1001",
            ),
            (
                with(agent(), "/spec/model/families", json!([])),
                "spec.model.families",
                "[]",
            ),
            (
                with(
                    agent(),
                    "/spec/model/families",
                    json!(["haiku", "sonnet", "haiku"]),
                ),
                "spec.model.families[2]",
                "haiku",
            ),
            (
                with(agent(), "/spec/model/apiKeySecret", json!("anthropic-key")),
                "spec.model.apiKeySecret",
                "anthropic-key",
            ),
            (
                with(agent(), "/spec/model/name", json!(" ")),
                "spec.model.name",
                "\" \"",
            ),
            (
                without(byok_agent(), "/spec/model/name"),
                "spec.model.name",
                "required",
            ),
            (
                with(byok_agent(), "/spec/model/name", json!("")),
                "spec.model.name",
                "\"\"",
            ),
            (
                without(byok_agent(), "/spec/model/apiKeySecret"),
                "spec.model.apiKeySecret",
                "required",
            ),
            (
                with(
                    byok_agent(),
                    "/spec/model/apiKeySecret",
                    json!("Anthropic_Key"),
                ),
                "spec.model.apiKeySecret",
                "Anthropic_Key",
            ),
            (
                with(byok_agent(), "/spec/model/families", json!(["haiku"])),
                "spec.model.families",
                "[haiku]",
            ),
            (
                with(agent(), "/spec/defaultInput", json!("")),
                "spec.defaultInput",
                "\"\"",
            ),
            (
                with(
                    agent(),
                    "/spec/defaultInput",
                    json!(long(MAX_INPUT_BYTES + 1)),
                ),
                "spec.defaultInput",
                "(262145 bytes)",
            ),
            (
                with(agent(), "/spec/contextSchema", json!("object")),
                "spec.contextSchema",
                "\"object\"",
            ),
            (
                with(agent(), "/spec/contextSchema", json!([])),
                "spec.contextSchema",
                "[]",
            ),
            (
                with(
                    agent(),
                    "/spec/contextSchema",
                    json!({ "$ref": "https://x/s.json" }),
                ),
                "spec.contextSchema.$ref",
                "https://x/s.json",
            ),
            (
                with(
                    agent(),
                    "/spec/contextSchema",
                    json!({ "type": "object", "properties": { "a": { "items": [{}, { "$dynamicRef": "#x" }] } } }),
                ),
                "spec.contextSchema.properties.a.items[1].$dynamicRef",
                "#x",
            ),
            (
                with(
                    agent(),
                    "/spec/contextSchema",
                    json!({ "anyOf": [{ "$recursiveRef": "#" }] }),
                ),
                "spec.contextSchema.anyOf[0].$recursiveRef",
                "\"#\"",
            ),
            (
                with(agent(), "/spec/postRunActions", json!([])),
                "spec.postRunActions",
                "[]",
            ),
            (
                with(agent(), "/spec/postRunActions", json!(["agents.noop", ""])),
                "spec.postRunActions[1]",
                "\"\"",
            ),
        ]);
        accept::<AgentSpec>(with(
            agent(),
            "/spec/postRunActions",
            json!(["agents.noop", "git.push"]),
        ));
        #[cfg(feature = "context-schema")]
        accept::<AgentSpec>(with(
            agent(),
            "/spec/contextSchema",
            json!({ "type": "object", "properties": { "ticket": { "type": "integer" } }, "required": ["ticket"] }),
        ));
        for limit in [1, 128_000] {
            accept::<AgentSpec>(with(agent(), "/spec/maxTokens", json!(limit)));
        }
        for limit in [1, 1000] {
            accept::<AgentSpec>(with(agent(), "/spec/maxToolCalls", json!(limit)));
        }
    }

    #[test]
    fn a_deep_context_schema_gives_a_bounded_path() {
        let mut schema = json!({ "$ref": "#" });
        for _ in 0..60 {
            schema = json!({ "not": schema });
        }
        let error = parse::<AgentSpec>(with(agent(), "/spec/contextSchema", schema))
            .expect_err("a reference");
        assert!(error.field.starts_with("spec.contextSchema.not"), "{error}");
        assert!(error.field.ends_with("not.$ref"), "{error}");
        assert!(error.field.contains('…'), "{error}");
        assert!(error.field.len() < 200, "{error}");
    }

    // ---- AgentRun ----

    #[test]
    fn run_rules() {
        let mounts = |paths: &[&str]| {
            let mounts: Vec<Value> = paths
                .iter()
                .map(|path| json!({ "ref": "files#x", "mountPath": path }))
                .collect();
            with(run(), "/spec/workdir", json!({ "artifactMounts": mounts }))
        };
        check::<AgentRunSpec>(vec![
            (
                with(run(), "/spec/agent", json!("Hello")),
                "spec.agent",
                "\"Hello\"",
            ),
            (
                with(run(), "/spec/agent", json!("a/b/c")),
                "spec.agent",
                "\"a/b/c\"",
            ),
            (
                with(run(), "/spec/agent", json!("/b")),
                "spec.agent",
                "\"/b\"",
            ),
            (with(run(), "/spec/agent", json!("")), "spec.agent", "\"\""),
            (with(run(), "/spec/input", json!("")), "spec.input", "\"\""),
            (
                with(run(), "/spec/input", json!(long(MAX_INPUT_BYTES + 1))),
                "spec.input",
                "(262145 bytes)",
            ),
            (
                with(task("a", json!([])), "/spec/group", json!("Group")),
                "spec.group",
                "\"Group\"",
            ),
            (
                without(task("a", json!([])), "/spec/taskKey"),
                "spec.taskKey",
                "required",
            ),
            (
                with(task("a", json!([])), "/spec/taskKey", json!("A")),
                "spec.taskKey",
                "\"A\"",
            ),
            (
                with(run(), "/spec/taskKey", json!("a")),
                "spec.taskKey",
                "\"a\"",
            ),
            (
                with(run(), "/spec/dependsOn", json!(["a"])),
                "spec.dependsOn",
                "[\"a\"]",
            ),
            (task("c", json!(["a", "B"])), "spec.dependsOn[1]", "\"B\""),
            (
                task("c", json!(["a", "b", "a"])),
                "spec.dependsOn[2]",
                "\"a\"",
            ),
            (
                task("c", json!(["a", "c"])),
                "spec.dependsOn[1]",
                "own taskKey (got \"c\")",
            ),
            (
                with(run(), "/spec/context", json!({ "nodus": { "x": 1 } })),
                "spec.context.nodus",
                "{\"x\":1}",
            ),
            (
                with(run(), "/spec/timeout", json!("0s")),
                "spec.timeout",
                "between 1s and 24h (got 0s)",
            ),
            (
                with(run(), "/spec/timeout", json!("24h1s")),
                "spec.timeout",
                "24h1s",
            ),
            (
                mounts(&[""]),
                "spec.workdir.artifactMounts[0].mountPath",
                "\"\"",
            ),
            (
                mounts(&["/etc/passwd"]),
                "spec.workdir.artifactMounts[0].mountPath",
                "/etc/passwd",
            ),
            (
                mounts(&["a/../../b"]),
                "spec.workdir.artifactMounts[0].mountPath",
                "a/../../b",
            ),
            (
                mounts(&["ok", ".."]),
                "spec.workdir.artifactMounts[1].mountPath",
                "\"..\"",
            ),
            (
                mounts(&["./"]),
                "spec.workdir.artifactMounts[0].mountPath",
                "\"./\"",
            ),
            (
                mounts(&["a\0b"]),
                "spec.workdir.artifactMounts[0].mountPath",
                "NUL",
            ),
            (
                mounts(&["a/b", "c", "a/b"]),
                "spec.workdir.artifactMounts[2].mountPath",
                "\"a/b\"",
            ),
            (
                mounts(&["data/x", "data"]),
                "spec.workdir.artifactMounts[1].mountPath",
                "[0]",
            ),
            (
                mounts(&["data", "z", "./data//x"]),
                "spec.workdir.artifactMounts[2].mountPath",
                "\"data\"",
            ),
            (
                with(
                    run(),
                    "/spec/workdir",
                    json!({ "artifactMounts": [{ "ref": "", "mountPath": "a" }] }),
                ),
                "spec.workdir.artifactMounts[0].ref",
                "\"\"",
            ),
            (
                with(run(), "/spec/workdir", json!({ "baseWorkdir": "" })),
                "spec.workdir.baseWorkdir",
                "\"\"",
            ),
            (
                with(run(), "/spec/postRunAction", json!({ "kind": "" })),
                "spec.postRunAction.kind",
                "\"\"",
            ),
            (
                with(run(), "/spec/environment", json!("Prod")),
                "spec.environment",
                "\"Prod\"",
            ),
            (
                with(run(), "/spec/environment", json!("a/b/c")),
                "spec.environment",
                "\"a/b/c\"",
            ),
            (with(run(), "/spec/image", json!("")), "spec.image", "\"\""),
            (
                with(run(), "/spec/image", json!("x/../../containers/c1")),
                "spec.image",
                "\"x/../../containers/c1\"",
            ),
            (
                with(run(), "/spec/image", json!("busybox?all=1")),
                "spec.image",
                "\"busybox?all=1\"",
            ),
        ]);
        for timeout in ["1s", "24h", "3600"] {
            accept::<AgentRunSpec>(with(run(), "/spec/timeout", json!(timeout)));
        }
        accept::<AgentRunSpec>(mounts(&["data/a", "data/b", "data-a", "datab/x"]));
        accept::<AgentRunSpec>(with(run(), "/spec/context", json!({ "x": { "nodus": 1 } })));
    }

    // ---- FileSet ----

    fn fileset(paths: &[&str]) -> Value {
        let files: Vec<Value> = paths
            .iter()
            .map(|p| json!({ "path": p, "content": "x" }))
            .collect();
        json!({
            "apiVersion": "nodus.dev/v1", "kind": "FileSet",
            "metadata": { "name": "source" }, "spec": { "files": files },
        })
    }

    #[test]
    fn fileset_rules() {
        check::<FileSetSpec>(vec![
            (
                fileset(&["/etc/passwd"]),
                "spec.files[0].path",
                "/etc/passwd",
            ),
            (
                fileset(&["ok", "a/../../b"]),
                "spec.files[1].path",
                "a/../../b",
            ),
            (fileset(&[""]), "spec.files[0].path", "\"\""),
            (
                fileset(&["a", "b", "./a"]),
                "spec.files[2].path",
                "spec.files[0].path",
            ),
            (
                fileset(&["data/x", "data"]),
                "spec.files[1].path",
                "spec.files[0].path",
            ),
            (
                with(
                    fileset(&[]),
                    "/spec/files",
                    json!([{ "path": "a", "mode": "0755" }]),
                ),
                "spec.files[0].mode",
                "unknown field",
            ),
            (
                with(fileset(&[]), "/metadata/name", json!("Source")),
                "metadata.name",
                "\"Source\"",
            ),
        ]);
        check::<FileSetSpec>(vec![
            (
                with(
                    fileset(&[]),
                    "/spec/files",
                    json!([{ "path": "a.bin", "contentBase64": "not base64!" }]),
                ),
                "spec.files[0].contentBase64",
                "standard base64",
            ),
            (
                with(
                    fileset(&[]),
                    "/spec/files",
                    json!([{ "path": "a", "content": "x", "contentBase64": "eA==" }]),
                ),
                "spec.files[0].contentBase64",
                "one or the other",
            ),
        ]);
        let binary = accept::<FileSetSpec>(with(
            fileset(&[]),
            "/spec/files",
            json!([{ "path": "a.bin", "contentBase64": "AAH/" }]),
        ));
        assert_eq!(binary.spec.files[0].bytes(), Ok(vec![0, 1, 255]));
        accept::<FileSetSpec>(fileset(&["app/main.py", "app-x/y", "run.sh"]));
        accept::<FileSetSpec>(fileset(&[&"x".repeat(255), "d\u{e9}j\u{e0}/vu", "a/b-"]));
    }

    /// Paths that would reach a file system or a command line in a misleading or failing
    /// form are refused when the FileSet (or a mount) is created, with the value escaped.
    #[test]
    fn fileset_paths_refuse_control_characters_bidi_leading_dashes_and_long_components() {
        let long = format!("dir/{}", "x".repeat(256));
        check::<FileSetSpec>(vec![
            (fileset(&["ok", "a\nb"]), "spec.files[1].path", r#""a\nb""#),
            (
                fileset(&["tab\there"]),
                "spec.files[0].path",
                "control characters",
            ),
            (fileset(&["esc\u{1b}[2J"]), "spec.files[0].path", r"\u{1b}"),
            (fileset(&["del\u{7f}"]), "spec.files[0].path", r"\u{7f}"),
            (
                fileset(&["c1\u{85}"]),
                "spec.files[0].path",
                "control characters",
            ),
            (
                fileset(&["invoice\u{202E}fdp.exe"]),
                "spec.files[0].path",
                r"\u{202e}",
            ),
            (
                fileset(&["a\u{202A}b"]),
                "spec.files[0].path",
                "bidirectional",
            ),
            (
                fileset(&["a\u{2066}b"]),
                "spec.files[0].path",
                "bidirectional",
            ),
            (fileset(&["a\u{2069}b"]), "spec.files[0].path", r"\u{2069}"),
            (fileset(&["-rf"]), "spec.files[0].path", "starts with `-`"),
            (
                fileset(&["src/--help"]),
                "spec.files[0].path",
                r#""src/--help""#,
            ),
            (
                fileset(&[&long]),
                "spec.files[0].path",
                "longer than 255 bytes (one has 256)",
            ),
        ]);
        // The same rules hold for a run's mount paths.
        let run = with(
            run(),
            "/spec/workdir",
            json!({ "artifactMounts": [{ "ref": "files#x", "mountPath": "-x" }] }),
        );
        check::<AgentRunSpec>(vec![(
            run,
            "spec.workdir.artifactMounts[0].mountPath",
            "starts with `-`",
        )]);
        accept::<FileSetSpec>(fileset(&[]));
    }

    // ---- AgentGroup ----

    #[test]
    fn group_rules() {
        check::<AgentGroupSpec>(vec![
            (
                with(group(), "/spec/agent", json!("Worker")),
                "spec.agent",
                "\"Worker\"",
            ),
            (
                with(group(), "/spec/limits/maxActive", json!(1001)),
                "spec.limits.maxActive",
                "1001",
            ),
            (
                with(group(), "/spec/limits/maxPending", json!(0)),
                "spec.limits.maxPending",
                "(got 0)",
            ),
            (
                with(group(), "/spec/limits/maxPending", json!(10_001)),
                "spec.limits.maxPending",
                "10001",
            ),
            (
                with(evaluation_group(), "/spec/evaluation/tasks", json!(0)),
                "spec.evaluation.tasks",
                "(got 0)",
            ),
            (
                with(evaluation_group(), "/spec/evaluation/repetitions", json!(0)),
                "spec.evaluation.repetitions",
                "(got 0)",
            ),
            (
                with(
                    with(evaluation_group(), "/spec/evaluation/tasks", json!(51)),
                    "/spec/evaluation/repetitions",
                    json!(2),
                ),
                "spec.evaluation.tasks",
                "= 102",
            ),
            (
                with(
                    evaluation_group(),
                    "/spec/evaluation/tasks",
                    json!(u32::MAX),
                ),
                "spec.evaluation.tasks",
                "4294967295",
            ),
            (
                with(evaluation_group(), "/spec/evaluation/timeout", json!("59s")),
                "spec.evaluation.timeout",
                "between 1m and 24h (got 59s)",
            ),
            (
                with(evaluation_group(), "/spec/evaluation/timeout", json!("25h")),
                "spec.evaluation.timeout",
                "25h",
            ),
            (
                with(
                    evaluation_group(),
                    "/spec/evaluation/environment",
                    json!("nodus/arithmetic-v2"),
                ),
                "spec.evaluation.environment",
                "\"nodus/arithmetic-v2\"",
            ),
            (
                with(
                    evaluation_group(),
                    "/spec/evaluation/environment",
                    json!("nodus/arithmetic-v2@"),
                ),
                "spec.evaluation.environment",
                "@\"",
            ),
            (
                with(
                    evaluation_group(),
                    "/spec/evaluation/environment",
                    json!("Nodus/a@1"),
                ),
                "spec.evaluation.environment",
                "Nodus/a@1",
            ),
            (
                with(
                    evaluation_group(),
                    "/spec/evaluation/environment",
                    json!("a@1 2"),
                ),
                "spec.evaluation.environment",
                "a@1 2",
            ),
            (
                without(evaluation_group(), "/spec/evaluation/tasks"),
                "spec.evaluation.tasks",
                "required",
            ),
            (
                with(evaluation_group(), "/spec/evaluation/split", json!("")),
                "spec.evaluation.split",
                "\"\"",
            ),
        ]);
        for limit in [1, 1000] {
            accept::<AgentGroupSpec>(with(group(), "/spec/limits/maxActive", json!(limit)));
        }
        accept::<AgentGroupSpec>(with(
            with(evaluation_group(), "/spec/evaluation/tasks", json!(50)),
            "/spec/evaluation/repetitions",
            json!(2),
        ));
        for timeout in ["1m", "24h"] {
            accept::<AgentGroupSpec>(with(
                evaluation_group(),
                "/spec/evaluation/timeout",
                json!(timeout),
            ));
        }
    }

    // ---- no input panics ----

    fn any_json() -> impl proptest::strategy::Strategy<Value = Value> {
        use proptest::prelude::*;
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            any::<u64>().prop_map(Value::from),
            "[a-zA-Z0-9./@$# -]{0,12}".prop_map(Value::from),
        ];
        leaf.prop_recursive(4, 32, 6, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::from),
                proptest::collection::btree_map("[a-zA-Z$]{1,10}", inner, 0..6)
                    .prop_map(|map| Value::Object(map.into_iter().collect())),
            ]
        })
    }

    proptest::proptest! {
        #[test]
        fn any_field_value_is_accepted_or_named(
            field in proptest::sample::select(vec![
                "/spec/system", "/spec/model", "/spec/model/families", "/spec/maxTokens",
                "/spec/contextSchema", "/spec/agent", "/spec/dependsOn", "/spec/workdir",
                "/spec/limits", "/spec/evaluation", "/spec/timeout", "/metadata/labels",
                "/metadata/name", "/kind", "/spec", "/metadata",
            ]),
            value in any_json(),
        ) {
            for document in [agent(), task("c", json!(["a"])), evaluation_group()] {
                let document = with(document, field, value.clone());
                let errors = [
                    parse::<AgentSpec>(document.clone()).err(),
                    parse::<AgentRunSpec>(document.clone()).err(),
                    parse::<AgentGroupSpec>(document).err(),
                ];
                for error in errors.into_iter().flatten() {
                    proptest::prop_assert!(!error.field.is_empty());
                    proptest::prop_assert!(!error.rule.is_empty());
                    proptest::prop_assert!(error.to_string().len() < 1000, "{}", error);
                }
            }
        }
    }

    // ---- AgentEnvironment ----

    fn environment() -> Value {
        json!({
            "apiVersion": "nodus.dev/v1",
            "kind": "AgentEnvironment",
            "metadata": { "name": "research" },
            "spec": {
                "env": [
                    { "name": "LOG_LEVEL", "value": "debug" },
                    { "name": "GITHUB_TOKEN",
                      "valueFrom": { "secretKeyRef": { "name": "github", "key": "token" } } }
                ],
                "compute": { "cpu": "2", "memory": "2Gi", "nvidia.com/gpu": 0 }
            }
        })
    }

    #[test]
    fn an_environment_in_designs_shape_is_accepted() {
        let accepted = accept::<AgentEnvironmentSpec>(environment());
        let compute = accepted.spec.compute.expect("compute");
        assert_eq!(compute.cpu.and_then(|c| c.cpu_millis()), Some(2000));
        assert_eq!(compute.memory.and_then(|m| m.bytes()), Some(2 << 30));
        assert_eq!(compute.gpu, Some(0));
        accept::<AgentEnvironmentSpec>(with(environment(), "/spec/compute/cpu", json!(0.5)));
        let inline = accept::<AgentRunSpec>(with(
            run(),
            "/spec/environment",
            environment()["spec"].clone(),
        ));
        assert!(matches!(
            inline.spec.environment,
            Some(NameOrInline::Inline(_))
        ));
        let named = accept::<AgentRunSpec>(with(run(), "/spec/environment", json!("team/x")));
        assert_eq!(
            named.spec.environment,
            Some(NameOrInline::Name("team/x".to_string()))
        );
        accept::<AgentSpec>(with(agent(), "/spec/environment", json!("research")));
    }

    #[test]
    fn network_rules_name_the_field() {
        let net = |value: Value| with(environment(), "/spec/network", value);
        let accepted = accept::<AgentEnvironmentSpec>(net(json!({
            "egress": "allowlist",
            "allow": [{"host": "pypi.org", "ports": [443]}, {"host": "*.example.org"},
                      {"cidr": "10.20.0.0/16"}]
        })));
        assert_eq!(accepted.spec.network.allow.len(), 3);
        let inject = |egress: &str, host: &str, header: &str, secret: &str| {
            json!({"egress": egress, "allow": [{"host": "pypi.org"}, {"host": "*.example.org"}],
                   "inject": [{"host": host, "header": header,
                               "valueFrom": {"secretKeyRef": {"name": secret, "key": "k"}}}]})
        };
        for host in [
            "pypi.org",
            "a.example.org",
            "*.example.org",
            "*.b.example.org",
        ] {
            let accepted =
                accept::<AgentEnvironmentSpec>(net(inject("allowlist", host, "X-Key", "s")));
            assert_eq!(accepted.spec.network.inject[0].host, host);
        }
        let mut twice = inject("allowlist", "pypi.org", "X-Key", "s");
        let again = twice["inject"][0].clone();
        twice["inject"]
            .as_array_mut()
            .expect("a list")
            .push(json!({"host": "PyPI.org", "header": "x-key",
                         "valueFrom": again["valueFrom"].clone()}));
        check::<AgentEnvironmentSpec>(vec![(net(twice), "spec.network.inject[1].header", "once")]);
        assert!(
            accept::<AgentEnvironmentSpec>(environment())
                .spec
                .network
                .is_default()
        );
        check::<AgentEnvironmentSpec>(vec![
            (
                net(json!({"egress": "open"})),
                "spec.network.egress",
                "open",
            ),
            (
                net(json!({"egress": "none", "allow": [{"host": "a.b"}]})),
                "spec.network.allow",
                "egress: none",
            ),
            (
                net(json!({"egress": "allowlist", "allow": [{"host": "bad host"}]})),
                "spec.network.allow[0].host",
                "\"bad host\"",
            ),
            (
                net(json!({"egress": "allowlist", "allow": [{"cidr": "10.0.0.0/40"}]})),
                "spec.network.allow[0].cidr",
                "10.0.0.0/40",
            ),
            (
                net(json!({"egress": "allowlist", "allow": [{"host": "a", "cidr": "1.2.3.4"}]})),
                "spec.network.allow[0]",
                "not both",
            ),
            (
                net(json!({"egress": "allowlist", "allow": [{"ports": [443]}]})),
                "spec.network.allow[0]",
                "host or cidr",
            ),
            (
                net(json!({"egress": "allowlist", "allow": [{"host": "a", "ports": [0]}]})),
                "spec.network.allow[0].ports",
                "[0]",
            ),
            (
                net(inject(
                    "allowlist",
                    "api.github.com",
                    "Authorization",
                    "github",
                )),
                "spec.network.inject[0].host",
                "must be a host spec.network.allow lets through",
            ),
            (
                net(
                    json!({"egress": "none", "inject": [{"host": "pypi.org", "header": "X-Key",
                    "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]}),
                ),
                "spec.network.inject",
                "egress: none",
            ),
            (
                net(inject("allowlist", "pypi.org", "Host", "github")),
                "spec.network.inject[0].header",
                "\"Host\"",
            ),
            (
                net(inject("allowlist", "pypi.org", "X-Key\r\nEvil", "github")),
                "spec.network.inject[0].header",
                "HTTP header name",
            ),
            (
                net(inject("allowlist", "pypi.org", "X-Key", "Not_A_Label")),
                "spec.network.inject[0].valueFrom.secretKeyRef.name",
                "Not_A_Label",
            ),
            (
                net(inject("allowlist", "bad host", "X-Key", "github")),
                "spec.network.inject[0].host",
                "host name",
            ),
        ]);
    }

    #[test]
    fn environment_rules_name_the_field() {
        let var = |value: Value| with(environment(), "/spec/env", json!([value]));
        check::<AgentEnvironmentSpec>(vec![
            (
                with(environment(), "/spec/compute/tpu", json!(1)),
                "spec.compute.tpu",
                "unknown field",
            ),
            (
                with(environment(), "/spec/compute/cpu", json!("lots")),
                "spec.compute.cpu",
                "\"lots\"",
            ),
            (
                with(environment(), "/spec/compute/cpu", json!("128")),
                "spec.compute.cpu",
                "64 CPUs",
            ),
            (
                with(environment(), "/spec/compute/memory", json!("2GB")),
                "spec.compute.memory",
                "\"2GB\"",
            ),
            (
                with(environment(), "/spec/compute/memory", json!("1Mi")),
                "spec.compute.memory",
                "16Mi",
            ),
            (
                var(json!({ "name": "PATH", "value": "/x" })),
                "spec.env[0].name",
                "reserved",
            ),
            (
                var(json!({ "name": "NODUS_RUN", "value": "x" })),
                "spec.env[0].name",
                "reserved",
            ),
            (
                var(json!({ "name": "1ABC", "value": "x" })),
                "spec.env[0].name",
                "\"1ABC\"",
            ),
            (
                var(json!({ "name": "A" })),
                "spec.env[0]",
                "value or valueFrom",
            ),
            (
                var(json!({ "name": "A", "value": "x",
                            "valueFrom": { "secretKeyRef": { "name": "s", "key": "k" } } })),
                "spec.env[0]",
                "not both",
            ),
            (
                var(json!({ "name": "A",
                            "valueFrom": { "secretKeyRef": { "name": "Bad_Name", "key": "k" } } })),
                "spec.env[0].valueFrom.secretKeyRef.name",
                "DNS label",
            ),
            (
                with(
                    environment(),
                    "/spec/env",
                    json!([{ "name": "A", "value": "1" }, { "name": "A", "value": "2" }]),
                ),
                "spec.env[1].name",
                "unique",
            ),
        ]);
        check::<AgentRunSpec>(vec![
            (
                with(
                    run(),
                    "/spec/environment",
                    json!({ "env": [{ "name": "HOME", "value": "/" }] }),
                ),
                "spec.environment.env[0].name",
                "reserved",
            ),
            (
                with(
                    run(),
                    "/spec/environment",
                    json!({ "compute": { "gpus": 1 } }),
                ),
                "spec.environment.compute.gpus",
                "unknown field",
            ),
        ]);
        check::<AgentSpec>(vec![(
            with(
                agent(),
                "/spec/environment",
                json!({ "env": [{ "name": "LANG", "value": "C" }] }),
            ),
            "spec.environment.env[0].name",
            "reserved",
        )]);
    }

    #[test]
    fn an_inline_agent_is_checked_by_the_agents_rules() {
        let inline = accept::<AgentRunSpec>(with(
            run(),
            "/spec/agent",
            json!({ "system": "You are terse.", "perRunMaxCostUSD": "0.10" }),
        ));
        let NameOrInline::Inline(agent) = &inline.spec.agent else {
            panic!("an inline agent")
        };
        assert_eq!(agent.system, "You are terse.");
        check::<AgentRunSpec>(vec![
            (
                with(run(), "/spec/agent", json!({ "system": "" })),
                "spec.agent.system",
                "must not be empty",
            ),
            (
                with(
                    run(),
                    "/spec/agent",
                    json!({ "system": "x", "maxTokens": 0 }),
                ),
                "spec.agent.maxTokens",
                "between",
            ),
            (
                with(run(), "/spec/agent", json!({ "system": "x", "bogus": 1 })),
                "spec.agent.bogus",
                "unknown field",
            ),
            (
                with(run(), "/spec/agent", json!(7)),
                "spec.agent",
                "expected",
            ),
        ]);
    }
}

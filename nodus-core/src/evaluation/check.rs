//! The rules of an Environment (every error names the field, the rule and the value), and
//! the `[project/]name@version` references that evaluation groups use.

use crate::resource::{EnvironmentSpec, GraderKind, TaskSpec};
use crate::validate::{
    Invalid, MAX_INPUT_BYTES, Result, Validate, check_image_reference, is_dns_label,
};

/// The most tasks one split lists.
pub const MAX_SPLIT_TASKS: usize = 10_000;
/// Allowed `spec.grader.timeout`, in seconds.
pub const GRADER_TIMEOUT_RANGE: std::ops::RangeInclusive<u64> = 1..=3600;

impl Validate for EnvironmentSpec {
    fn check_spec(&self) -> Result<()> {
        check_version(&self.version)?;
        crate::validate::check_network_spec("spec.network", &self.network)?;
        if !self.image.is_empty() {
            check_image_reference("spec.image", &self.image)?;
        }
        if self.splits.is_empty() {
            return Err(Invalid::new(
                "spec.splits",
                "must have at least one split",
                "nothing",
            ));
        }
        for (name, split) in &self.splits {
            let field = format!("spec.splits.{name}");
            if !is_dns_label(name) {
                return Err(Invalid::new(
                    field,
                    "must be named by a DNS label (a-z, 0-9 and '-')",
                    shown(name),
                ));
            }
            match (&split.generator, split.tasks.is_empty()) {
                (Some(_), false) => {
                    return Err(Invalid::new(
                        format!("{field}.generator"),
                        "must not be given with tasks: a split has one or the other",
                        "both",
                    ));
                }
                (None, true) => {
                    return Err(Invalid::new(
                        format!("{field}.tasks"),
                        "must list at least one task (or a generator, in built-ins)",
                        "nothing",
                    ));
                }
                _ => {}
            }
            if split.tasks.len() > MAX_SPLIT_TASKS {
                return Err(Invalid::new(
                    format!("{field}.tasks"),
                    format!("must list at most {MAX_SPLIT_TASKS} tasks"),
                    split.tasks.len().to_string(),
                ));
            }
            let mut ids = std::collections::BTreeSet::new();
            for (index, task) in split.tasks.iter().enumerate() {
                let field = format!("{field}.tasks[{index}]");
                check_task(&field, task, self.grader.kind)?;
                if !ids.insert(task.id.as_str()) {
                    return Err(Invalid::new(
                        format!("{field}.id"),
                        "must be unique in its split",
                        shown(&task.id),
                    ));
                }
            }
        }
        let grader = &self.grader;
        let command = grader.kind == GraderKind::Command;
        match (&grader.command, command) {
            (None, true) => {
                return Err(Invalid::new(
                    "spec.grader.command",
                    "is required for a command grader",
                    "nothing",
                ));
            }
            (Some(line), true) if line.trim().is_empty() => {
                return Err(Invalid::new(
                    "spec.grader.command",
                    "must not be empty",
                    shown(line),
                ));
            }
            (Some(line), false) => {
                return Err(Invalid::new(
                    "spec.grader.command",
                    "is only for a command grader",
                    shown(line),
                ));
            }
            _ => {}
        }
        if !command && (grader.files.is_some() || grader.timeout.is_some()) {
            let field = if grader.files.is_some() {
                "spec.grader.files"
            } else {
                "spec.grader.timeout"
            };
            return Err(Invalid::new(field, "is only for a command grader", "given"));
        }
        if !command && !grader.verdict_from.is_stdout() {
            return Err(Invalid::new(
                "spec.grader.verdictFrom",
                "is only for a command grader",
                format!("{:?}", grader.verdict_from),
            ));
        }
        if let Some(files) = &grader.files
            && !is_dns_label(&files.file_set)
        {
            return Err(Invalid::new(
                "spec.grader.files.fileSet",
                "must name a FileSet of the Environment's project (a DNS label)",
                shown(&files.file_set),
            ));
        }
        if let Some(timeout) = grader.timeout
            && !GRADER_TIMEOUT_RANGE.contains(&timeout.as_secs())
        {
            return Err(Invalid::new(
                "spec.grader.timeout",
                "must be between 1 second and 1 hour",
                timeout.to_string(),
            ));
        }
        if let Some(tolerance) = grader.tolerance {
            if grader.kind != GraderKind::Numeric {
                return Err(Invalid::new(
                    "spec.grader.tolerance",
                    "is only for a numeric grader",
                    tolerance.to_string(),
                ));
            }
            if !tolerance.is_finite() || tolerance < 0.0 {
                return Err(Invalid::new(
                    "spec.grader.tolerance",
                    "must be a number of at least 0",
                    tolerance.to_string(),
                ));
            }
        }
        Ok(())
    }
}

fn check_task(field: &str, task: &TaskSpec, grader: GraderKind) -> Result<()> {
    if task.id.trim().is_empty() || task.id.len() > 253 || task.id.chars().any(char::is_control) {
        return Err(Invalid::new(
            format!("{field}.id"),
            "must be 1 to 253 characters, no control characters",
            shown(&task.id),
        ));
    }
    if task.prompt.trim().is_empty() || task.prompt.len() > MAX_INPUT_BYTES {
        return Err(Invalid::new(
            format!("{field}.prompt"),
            format!("must be 1 to {MAX_INPUT_BYTES} bytes of text"),
            shown(&task.prompt),
        ));
    }
    if let Some(files) = &task.files
        && !is_dns_label(&files.file_set)
    {
        return Err(Invalid::new(
            format!("{field}.files.fileSet"),
            "must name a FileSet of the Environment's project (a DNS label)",
            shown(&files.file_set),
        ));
    }
    if let Some(timeout) = task.timeout {
        crate::validate::check_duration(
            &format!("{field}.timeout"),
            timeout,
            crate::validate::RUN_TIMEOUT_RANGE,
        )?;
    }
    let needs = match grader {
        GraderKind::Exact | GraderKind::Numeric => Some("expected"),
        GraderKind::Regex => Some("pattern"),
        GraderKind::Command => None,
    };
    if let Some(key) = needs {
        let value = task.hidden.get(key);
        let usable = match (grader, value) {
            (GraderKind::Numeric, Some(serde_json::Value::Number(_))) => true,
            (GraderKind::Numeric, Some(serde_json::Value::String(text))) => {
                text.trim().parse::<f64>().is_ok()
            }
            (
                GraderKind::Exact,
                Some(serde_json::Value::String(_) | serde_json::Value::Number(_)),
            ) => true,
            (GraderKind::Regex, Some(serde_json::Value::String(pattern))) => {
                if let Err(e) = regex::Regex::new(pattern) {
                    return Err(Invalid::new(
                        format!("{field}.hidden.pattern"),
                        format!("must be a regular expression ({e})"),
                        shown(pattern),
                    ));
                }
                true
            }
            _ => false,
        };
        if !usable {
            return Err(Invalid::new(
                format!("{field}.hidden.{key}"),
                format!(
                    "is required by the {} grader",
                    match grader {
                        GraderKind::Numeric => "numeric (a number)",
                        GraderKind::Regex => "regex (a pattern)",
                        _ => "exact (the expected text)",
                    }
                ),
                value.map_or_else(|| "nothing".to_string(), |v| shown(&v.to_string())),
            ));
        }
    }
    Ok(())
}

/// `MAJOR.MINOR.PATCH`, numbers without leading zeros, with an optional `-pre` and `+build`
/// of ASCII letters, digits, '-' and '.' (semantic versioning 2.0.0).
pub fn check_version(version: &str) -> Result<()> {
    let refuse = || {
        Invalid::new(
            "spec.version",
            "must be a semantic version MAJOR.MINOR.PATCH (such as 1.0.0 or 2.1.0-rc.1)",
            shown(version),
        )
    };
    let (core, build) = match version.split_once('+') {
        Some((core, build)) => (core, Some(build)),
        None => (version, None),
    };
    let (core, pre) = match core.split_once('-') {
        Some((core, pre)) => (core, Some(pre)),
        None => (core, None),
    };
    let numbers: Vec<&str> = core.split('.').collect();
    let number = |part: &&str| {
        !part.is_empty()
            && part.bytes().all(|b| b.is_ascii_digit())
            && (part.len() == 1 || !part.starts_with('0'))
            && part.parse::<u64>().is_ok()
    };
    if numbers.len() != 3 || !numbers.iter().all(number) {
        return Err(refuse());
    }
    let identifiers = |text: &str| {
        text.split('.')
            .all(|id| !id.is_empty() && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-'))
    };
    if pre.is_some_and(|p| !identifiers(p)) || build.is_some_and(|b| !identifiers(b)) {
        return Err(refuse());
    }
    Ok(())
}

/// A parsed `[project/]name@version`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvironmentRef {
    /// The project (the group's own when the reference names none).
    pub project: String,
    /// The name.
    pub name: String,
    /// The version.
    pub version: String,
}

impl EnvironmentRef {
    /// Reads `text` as seen from `project`; `None` when it is not `[project/]name@version`.
    pub fn parse(project: &str, text: &str) -> Option<Self> {
        let (reference, version) = text.split_once('@')?;
        let (project, name) = reference.split_once('/').unwrap_or((project, reference));
        Some(EnvironmentRef {
            project: project.to_string(),
            name: name.to_string(),
            version: version.to_string(),
        })
    }

    /// The stored document's name: `name@version`.
    pub fn key_name(&self) -> String {
        key_name(&self.name, &self.version)
    }
}

impl std::fmt::Display for EnvironmentRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}@{}", self.project, self.name, self.version)
    }
}

/// Where an Environment version is stored: `name@version`.
pub fn key_name(name: &str, version: &str) -> String {
    format!("{name}@{version}")
}

fn shown(text: &str) -> String {
    const KEEP: usize = 80;
    match text.char_indices().nth(KEEP) {
        None => format!("{text:?}"),
        Some((cut, _)) => format!("{:?}…", &text[..cut]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_environment_s_network_follows_an_agent_environment_s_rules() {
        let spec = |network: serde_json::Value| -> EnvironmentSpec {
            serde_json::from_value(serde_json::json!({
                "version": "1.0.0",
                "splits": {"test": {"tasks": [{"id": "a", "prompt": "p", "hidden": {"expected": "x"}}]}},
                "grader": {"kind": "exact"},
                "network": network,
            }))
            .expect("an Environment")
        };
        let allowed = spec(serde_json::json!({
            "egress": "allowlist",
            "allow": [{"host": "files.test", "ports": [8080]}],
        }));
        assert_eq!(allowed.check_spec(), Ok(()));
        for (network, field, shows) in [
            (
                serde_json::json!({"egress": "none", "allow": [{"host": "files.test"}]}),
                "spec.network.allow",
                "egress: none",
            ),
            (
                serde_json::json!({"egress": "allowlist", "allow": [{"host": "bad host"}]}),
                "spec.network.allow[0].host",
                "\"bad host\"",
            ),
            (
                serde_json::json!({"egress": "allowlist", "allow": [{"cidr": "10.0.0.0/33"}]}),
                "spec.network.allow[0].cidr",
                "10.0.0.0/33",
            ),
            (
                serde_json::json!({"egress": "allowlist", "allow": [{"host": "a.test", "ports": [0]}]}),
                "spec.network.allow[0].ports",
                "[0]",
            ),
            (
                serde_json::json!({
                    "egress": "allowlist",
                    "allow": [{"host": "a.test"}],
                    "inject": [{"host": "b.test", "header": "X-Key",
                                "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}],
                }),
                "spec.network.inject[0].host",
                "b.test",
            ),
        ] {
            let error = spec(network).check_spec().expect_err(field);
            assert_eq!(error.field, field, "{error}");
            assert!(error.to_string().contains(shows), "{error}");
        }
    }

    #[test]
    fn versions_are_semantic() {
        for good in [
            "1.0.0",
            "0.0.1",
            "2.10.3",
            "1.0.0-rc.1",
            "1.0.0+build.5",
            "1.0.0-a-b+c",
        ] {
            assert!(check_version(good).is_ok(), "{good}");
        }
        for bad in [
            "1",
            "1.0",
            "1.0.0.0",
            "01.0.0",
            "1.0.x",
            "",
            "v1.0.0",
            "1.0.0-",
            "1.0.0+",
            "1.0.0-a..b",
        ] {
            let error = check_version(bad).unwrap_err();
            assert_eq!(error.field, "spec.version", "{bad}");
        }
    }

    #[test]
    fn references_read_with_and_without_a_project() {
        let full = EnvironmentRef::parse("default", "nodus/arithmetic-v2@2.0.0").unwrap();
        assert_eq!(full.to_string(), "nodus/arithmetic-v2@2.0.0");
        assert_eq!(full.key_name(), "arithmetic-v2@2.0.0");
        let own = EnvironmentRef::parse("default", "shell@1.0.0").unwrap();
        assert_eq!(own.project, "default");
        assert!(EnvironmentRef::parse("default", "shell").is_none());
    }
}

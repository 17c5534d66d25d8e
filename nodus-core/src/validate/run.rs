//! The rules of an AgentRun: its agent, input, context, task place in a group, working
//! directory, timeout and image.

use std::collections::BTreeSet;
use std::ops::RangeInclusive;

use super::environment::{check_environment_ref, check_image_reference};
use super::fileset::{check_mount_path, check_no_overlap};
use super::{
    DAY_SECS, Invalid, NOTHING, Result, SHOWN_CHARS, Validate, check_common_metadata,
    check_dns_label, check_duration, check_message, check_not_blank, check_reference, is_dns_label,
    require_name, shorten, shown, shown_json, task_run_name,
};
use crate::resource::{AgentRunSpec, NameOrInline, ObjectMeta, WorkdirSpec};

/// Allowed `spec.timeout` of an AgentRun, in seconds: one second to 24 hours.
pub const RUN_TIMEOUT_RANGE: RangeInclusive<u64> = 1..=DAY_SECS;
/// The key of a run's `spec.context` that Nodus keeps for itself.
pub const RESERVED_CONTEXT_KEY: &str = "nodus";
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

/// `group`, `taskKey` and `dependsOn`.
pub(super) fn check_task(spec: &AgentRunSpec) -> Result<()> {
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
pub(super) fn check_workdir(workdir: &WorkdirSpec) -> Result<()> {
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

#[cfg(test)]
#[path = "run_tests.rs"]
mod tests;

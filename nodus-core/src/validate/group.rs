//! The rules of an AgentGroup: its agent, limits and evaluation batch.

use std::ops::RangeInclusive;

use super::{
    DAY_SECS, Invalid, Result, Validate, check_duration, check_not_blank, check_range,
    check_reference, is_reference, shown,
};
use crate::resource::{AgentGroupSpec, EvaluationSpec, GroupLimits};

/// Allowed `spec.limits.maxPending` of an AgentGroup.
pub const MAX_PENDING_RANGE: RangeInclusive<u32> = 1..=GroupLimits::DEFAULT_MAX_PENDING;
/// Allowed `spec.evaluation.timeout` of an AgentGroup, in seconds: one minute to 24 hours.
pub const EVALUATION_TIMEOUT_RANGE: RangeInclusive<u64> = 60..=DAY_SECS;
/// The most cases (`tasks` × `repetitions`) an evaluation batch may have.
pub const MAX_EVALUATION_CASES: u64 = 100;
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
#[cfg(test)]
#[path = "group_tests.rs"]
mod tests;

//! Retrying the unscored: which cases of a finished evaluation group get a new attempt, as a
//! pure function of the group's phase, its cases and the request. The engine's side (a new
//! member run per chosen case, the case moved to it) is `engine::evaluation`.
//!
//! Only an unscored case is retried: a scored one has its grade, and a pending one is still
//! going. The group must have finished (every case has its terminal state) and not been
//! cancelled. Counts stay over cases: a retried case is one case whose state is its last
//! attempt's.

use serde::{Deserialize, Serialize};

use super::{CaseRecord, CaseState, UnscoredReason};
use crate::group::GroupPhase;
use crate::validate::Invalid;

/// `POST …/agentgroups/{name}/retry`: which unscored cases to retry. Empty lists mean every
/// reason and every task.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RetryRequest {
    /// Only cases unscored for one of these reasons (default: any reason).
    #[serde(default)]
    pub reasons: Vec<UnscoredReason>,
    /// Only the cases of these task ids (default: every task); a task none of whose cases is
    /// unscored is refused.
    #[serde(default)]
    pub tasks: Vec<String>,
}

/// The positions (in `cases`) of the cases to retry, in batch order; refused naming why when
/// the group is not finished, was cancelled, a named task is unknown or has no unscored case,
/// or nothing is left to retry.
pub fn choose(
    group: &str,
    phase: Option<GroupPhase>,
    cases: &[CaseRecord],
    request: &RetryRequest,
) -> Result<Vec<usize>, Invalid> {
    match phase {
        Some(GroupPhase::Cancelled) => {
            return Err(Invalid::new(
                "status.phase",
                format!(
                    "must not be Cancelled: group {group} was cancelled, so its cases are not \
                     retried (create a new evaluation group)"
                ),
                "Cancelled",
            ));
        }
        Some(phase) if phase.is_finished() => {}
        other => {
            return Err(Invalid::new(
                "status.phase",
                format!(
                    "must be finished before a retry: group {group} still has cases without \
                     their terminal state (wait for it to finish)"
                ),
                other.map_or("none", GroupPhase::name),
            ));
        }
    }
    if cases.is_empty() {
        return Err(Invalid::new(
            "metadata.name",
            "must name an evaluation group (an ordinary group has no cases to retry)",
            format!("{group:?}"),
        ));
    }
    let wanted_reason = |case: &CaseRecord| {
        request.reasons.is_empty() || case.reason.is_some_and(|r| request.reasons.contains(&r))
    };
    let retryable = |case: &CaseRecord| case.state == CaseState::Unscored && wanted_reason(case);
    for task in &request.tasks {
        let mut of_task = cases.iter().filter(|c| &c.task_id == task).peekable();
        if of_task.peek().is_none() {
            return Err(Invalid::new(
                "tasks",
                format!("must name tasks of group {group}"),
                format!("{task:?}"),
            ));
        }
        if !of_task.any(retryable) {
            return Err(Invalid::new(
                "tasks",
                "must name a task with an unscored case (with one of the reasons asked for): a \
                 scored case keeps its grade and is never retried",
                format!("{task:?}"),
            ));
        }
    }
    let chosen: Vec<usize> = cases
        .iter()
        .enumerate()
        .filter(|(_, case)| request.tasks.is_empty() || request.tasks.contains(&case.task_id))
        .filter(|(_, case)| retryable(case))
        .map(|(i, _)| i)
        .collect();
    if chosen.is_empty() {
        let reasons = if request.reasons.is_empty() {
            "any reason".to_string()
        } else {
            request
                .reasons
                .iter()
                .map(|r| format!("{r:?}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        return Err(Invalid::new(
            "reasons",
            format!(
                "must match an unscored case: group {group} has none unscored for {reasons} \
                 (a scored case is never retried)"
            ),
            format!("{:?}", request.reasons),
        ));
    }
    Ok(chosen)
}

/// The name of attempt `attempt` (from 2) of the case whose first run is `first_run`:
/// `<first run>-<attempt>`.
pub fn attempt_run_name(first_run: &str, attempt: usize) -> String {
    format!("{first_run}-{attempt}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::evaluation::{Grade, Verdict};
    use jiff::Timestamp;

    fn case(index: u32, task: &str, outcome: Option<UnscoredReason>) -> CaseRecord {
        let record = CaseRecord {
            group: "g".into(),
            index,
            task_id: task.into(),
            repetition: 1,
            run: format!("g-c{index:03}"),
            environment: "e@1.0.0".into(),
            split: "test".into(),
            seed: 1,
            image_digest: String::new(),
            hidden: serde_json::Value::Null,
            deadline: Timestamp::UNIX_EPOCH,
            state: CaseState::Pending,
            reason: None,
            reward: None,
            verdict: None,
            evidence: None,
            gradings: Vec::new(),
            completion_time: None,
            payloads_removed_at: None,
            earlier_attempts: Vec::new(),
        };
        let now = Timestamp::UNIX_EPOCH;
        match outcome {
            Some(reason) => record.unscored(reason, "why".into(), now),
            None => record.scored(
                Grade {
                    reward: 1.0,
                    verdict: Verdict::Pass,
                    evidence: "ok".into(),
                },
                now,
            ),
        }
    }

    fn cases() -> Vec<CaseRecord> {
        vec![
            case(0, "a", None),
            case(1, "b", Some(UnscoredReason::RunFailed)),
            case(2, "c", Some(UnscoredReason::GraderFailed)),
            case(3, "d", None),
        ]
    }

    const DONE: Option<GroupPhase> = Some(GroupPhase::FailedRunsFailed);

    #[test]
    fn only_unscored_cases_of_the_reasons_and_tasks_asked_for_are_chosen() {
        let all = RetryRequest::default();
        assert_eq!(choose("g", DONE, &cases(), &all), Ok(vec![1, 2]));
        let grader = RetryRequest {
            reasons: vec![UnscoredReason::GraderFailed],
            tasks: vec![],
        };
        assert_eq!(choose("g", DONE, &cases(), &grader), Ok(vec![2]));
        let task_b = RetryRequest {
            reasons: vec![],
            tasks: vec!["b".into()],
        };
        assert_eq!(choose("g", DONE, &cases(), &task_b), Ok(vec![1]));
    }

    #[test]
    fn refusals_name_the_field_and_why() {
        let all = RetryRequest::default();
        let running = choose("g", Some(GroupPhase::Running), &cases(), &all).unwrap_err();
        assert_eq!(
            (running.field.as_str(), running.value.as_str()),
            ("status.phase", "Running")
        );
        let cancelled = choose("g", Some(GroupPhase::Cancelled), &cases(), &all).unwrap_err();
        assert!(cancelled.rule.contains("cancelled"), "{cancelled}");
        let scored = RetryRequest {
            reasons: vec![],
            tasks: vec!["a".into()],
        };
        let refused = choose("g", DONE, &cases(), &scored).unwrap_err();
        assert_eq!(refused.field, "tasks");
        assert!(refused.rule.contains("scored case"), "{refused}");
        let unknown = RetryRequest {
            reasons: vec![],
            tasks: vec!["zz".into()],
        };
        assert_eq!(
            choose("g", DONE, &cases(), &unknown).unwrap_err().value,
            "\"zz\""
        );
        let none = RetryRequest {
            reasons: vec![UnscoredReason::NoAnswer],
            tasks: vec![],
        };
        let refused = choose("g", DONE, &cases(), &none).unwrap_err();
        assert_eq!(refused.field, "reasons");
        assert!(refused.rule.contains("NoAnswer"), "{refused}");
        let every_scored = vec![case(0, "a", None)];
        let refused = choose("g", DONE, &every_scored, &all).unwrap_err();
        assert!(refused.rule.contains("none unscored"), "{refused}");
        assert_eq!(
            choose("g", DONE, &[], &all).unwrap_err().field,
            "metadata.name"
        );
    }

    #[test]
    fn a_retried_case_keeps_every_attempt_and_its_state_is_the_last() {
        let first = case(1, "b", Some(UnscoredReason::RunFailed));
        let later = Timestamp::from_second(60).unwrap();
        let retried = first.retried(attempt_run_name("g-c001", 2), later);
        assert_eq!(retried.state, CaseState::Pending);
        assert_eq!((retried.reason, retried.evidence.as_deref()), (None, None));
        assert_eq!(retried.deadline, later);
        let attempts = retried.result().attempts;
        assert_eq!(attempts.len(), 2);
        assert_eq!(
            (
                attempts[0].run.as_str(),
                attempts[0].state,
                attempts[0].reason
            ),
            (
                "g-c001",
                CaseState::Unscored,
                Some(UnscoredReason::RunFailed)
            )
        );
        assert_eq!(
            (attempts[1].run.as_str(), attempts[1].state),
            ("g-c001-2", CaseState::Pending)
        );
        // Counted once, as its last attempt stands.
        let summary = crate::evaluation::stats::summarize(
            &[crate::evaluation::CaseOutcome::from(&retried)],
            crate::evaluation::epochs::Reducer::Mean,
        );
        assert_eq!((summary.cases, summary.pending), (1, 1));
        assert!(summary.unscored.is_empty());
    }
}

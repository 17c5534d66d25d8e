//! What an evaluation group adds to the group controller's rules: its batch is fixed (the
//! controller works with a sealed spec), and it holds its phase while a case is pending.

use std::borrow::Cow;

use crate::resource::{AgentGroupSpec, AgentGroupStatus, EvaluationStatus, GroupPhase};

/// The spec the group controller works with: an evaluation group's batch is fixed when it is
/// created, so it is sealed (no run joins it, and it ends when its runs and cases have).
pub fn controlled(spec: &AgentGroupSpec) -> Cow<'_, AgentGroupSpec> {
    if spec.evaluation.is_some() && !spec.sealed {
        let mut sealed = spec.clone();
        sealed.sealed = true;
        Cow::Owned(sealed)
    } else {
        Cow::Borrowed(spec)
    }
}

/// The phase an evaluation group shows, given the phase its runs alone would give it and how
/// many of its cases are `pending`: it finishes only once every case has its terminal state,
/// so until then a finished phase is held as `Running` (or `Cancelling`, for a cancelled
/// group).
pub fn held_phase(phase: Option<GroupPhase>, pending: u32) -> Option<GroupPhase> {
    if pending == 0 {
        return phase;
    }
    match phase {
        Some(GroupPhase::Cancelled | GroupPhase::Cancelling) => Some(GroupPhase::Cancelling),
        Some(phase) if phase.is_finished() => Some(GroupPhase::Running),
        other => other,
    }
}

/// An evaluation group's status: the status its runs give it, with `status.evaluation`
/// computed from its cases and its phase held while a case is pending ([`held_phase`]).
pub fn with_cases(mut status: AgentGroupStatus, evaluation: EvaluationStatus) -> AgentGroupStatus {
    status.phase = held_phase(status.phase, evaluation.pending);
    status.evaluation = Some(evaluation);
    status
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resource::{EvaluationSpec, GroupLimits};

    #[test]
    fn a_finished_phase_is_held_while_a_case_is_pending() {
        use GroupPhase as G;
        // (the phase the runs give, pending cases) -> the phase shown
        let table = [
            (None, 0, None),
            (None, 3, None),
            (Some(G::Running), 0, Some(G::Running)),
            (Some(G::Running), 1, Some(G::Running)),
            (Some(G::Succeeded), 0, Some(G::Succeeded)),
            (Some(G::Succeeded), 1, Some(G::Running)),
            (Some(G::FailedRunsFailed), 0, Some(G::FailedRunsFailed)),
            (Some(G::FailedRunsFailed), 2, Some(G::Running)),
            (Some(G::Cancelling), 0, Some(G::Cancelling)),
            (Some(G::Cancelling), 1, Some(G::Cancelling)),
            (Some(G::Cancelled), 0, Some(G::Cancelled)),
            (Some(G::Cancelled), 5, Some(G::Cancelling)),
        ];
        for (phase, pending, expected) in table {
            assert_eq!(
                held_phase(phase, pending),
                expected,
                "{phase:?} with {pending} pending"
            );
        }
    }

    #[test]
    fn the_status_carries_the_cases_summary_and_the_held_phase() {
        let status = AgentGroupStatus {
            phase: Some(GroupPhase::Succeeded),
            ..AgentGroupStatus::default()
        };
        let evaluation = EvaluationStatus {
            cases: 4,
            pending: 1,
            ..EvaluationStatus::default()
        };
        let held = with_cases(status, evaluation.clone());
        assert_eq!(held.phase, Some(GroupPhase::Running));
        assert_eq!(held.evaluation, Some(evaluation));
    }

    #[test]
    fn only_an_evaluation_group_is_sealed_for_the_controller() {
        let ordinary = AgentGroupSpec {
            agent: "worker".to_string(),
            limits: GroupLimits::default(),
            max_cost_usd: None,
            sealed: false,
            evaluation: None,
        };
        let evaluation = AgentGroupSpec {
            evaluation: Some(EvaluationSpec {
                environment: "shell-tasks@1.0.0".to_string(),
                split: None,
                tasks: 2,
                repetitions: 1,
                seed: 7,
                timeout: None,
                reducer: None,
                rescore_of: None,
            }),
            ..ordinary.clone()
        };
        let sealed_evaluation = AgentGroupSpec {
            sealed: true,
            ..evaluation.clone()
        };
        // (spec) -> (sealed for the controller, the spec borrowed as it is)
        let table = [
            (&ordinary, false, true),
            (&evaluation, true, false),
            (&sealed_evaluation, true, true),
        ];
        for (spec, sealed, borrowed) in table {
            let controlled = controlled(spec);
            assert_eq!(controlled.sealed, sealed, "{spec:?}");
            assert_eq!(matches!(controlled, Cow::Borrowed(_)), borrowed, "{spec:?}");
            assert_eq!(controlled.evaluation, spec.evaluation);
        }
    }
}

//! What a pending case comes to, from its group and its run as they are now: wait, end
//! unscored (and why), or grade the run's answer. The engine reads the group, then the run
//! only when the group has not cut the case short ([`cut_short`]), then carries out what
//! [`ending`] says (removes grading sandboxes, cancels the run, writes the case).

use jiff::Timestamp;

use crate::lifecycle::{FailReason, RunPhase, WaitReason};
use crate::resource::UnscoredReason;

/// The run of a pending case, as the grading reads it (`R`: the run itself, handed back to
/// be graded).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CaseRun<'a, R> {
    /// The run was deleted.
    Deleted,
    /// The run, in `phase`, with its `status.message` (empty when it has none).
    Read {
        /// Its phase.
        phase: RunPhase,
        /// Its `status.message`.
        message: &'a str,
        /// The run.
        run: R,
    },
}

/// What a pending case comes to ([`cut_short`], [`ending`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ending<R> {
    /// Its run has not ended: look again at the case's deadline (or when the run changes).
    Later(Timestamp),
    /// The case ends unscored.
    Unscored {
        /// Why.
        reason: UnscoredReason,
        /// What happened, for the case's `evidence`.
        evidence: String,
        /// Its grading attempts are cut short: the unfinished ones are marked interrupted and
        /// their sandboxes removed (the group was cancelled, or the deadline passed).
        interrupt_grading: bool,
        /// Its run is cancelled too: it reached its cost cap and can go no further, so its
        /// sandbox is freed now.
        cancel_run: bool,
    },
    /// Its run succeeded: its answer is graded.
    Grade(R),
}

impl<R> Ending<R> {
    fn unscored(reason: UnscoredReason, evidence: impl Into<String>) -> Self {
        Ending::Unscored {
            reason,
            evidence: evidence.into(),
            interrupt_grading: false,
            cancel_run: false,
        }
    }
}

/// Whether a pending case whose deadline is `deadline` ends at `now` whatever its run did: a
/// cancelled group ends it as `Cancelled`, a passed deadline as `EvaluationTimeout`, its
/// grading attempts cut short. `None`: its run decides ([`ending`]).
pub fn cut_short<R>(
    group_cancelled: bool,
    now: Timestamp,
    deadline: Timestamp,
) -> Option<Ending<R>> {
    let (reason, evidence) = if group_cancelled {
        (
            UnscoredReason::Cancelled,
            "the evaluation group was cancelled",
        )
    } else if now >= deadline {
        (
            UnscoredReason::EvaluationTimeout,
            "the evaluation's deadline passed before the case was graded",
        )
    } else {
        return None;
    };
    Some(Ending::Unscored {
        reason,
        evidence: evidence.to_string(),
        interrupt_grading: true,
        cancel_run: false,
    })
}

/// What a pending case whose deadline is `deadline` comes to from its run: a run at its cost
/// cap ends it as `LimitReached` and is cancelled; a run that has not ended leaves it pending
/// until the deadline; a deleted run, or one that ended without succeeding, ends it unscored
/// with the reason its end gives; a succeeded run is graded.
pub fn ending<R>(deadline: Timestamp, run: CaseRun<'_, R>) -> Ending<R> {
    let (phase, message, run) = match run {
        CaseRun::Deleted => {
            return Ending::unscored(UnscoredReason::RunFailed, "the case's run was deleted");
        }
        CaseRun::Read {
            phase,
            message,
            run,
        } => (phase, message, run),
    };
    match phase {
        RunPhase::Waiting(WaitReason::MaxCostReached) => Ending::Unscored {
            reason: UnscoredReason::LimitReached,
            evidence: "the run reached its cost cap (perRunMaxCostUSD)".to_string(),
            interrupt_grading: false,
            cancel_run: true,
        },
        RunPhase::Pending(_)
        | RunPhase::Running
        | RunPhase::Waiting(_)
        | RunPhase::NeedsResolution => Ending::Later(deadline),
        RunPhase::Failed(FailReason::DeadlineExceeded) => Ending::unscored(
            UnscoredReason::EvaluationTimeout,
            "the run was cut off at the evaluation's deadline",
        ),
        RunPhase::Failed(FailReason::TimeoutExceeded) => {
            Ending::unscored(UnscoredReason::LimitReached, "the run reached its timeout")
        }
        RunPhase::Failed(reason) => Ending::unscored(
            UnscoredReason::RunFailed,
            format!("the run failed ({reason:?}) {message}")
                .trim()
                .to_string(),
        ),
        RunPhase::Cancelled(reason) => Ending::unscored(
            UnscoredReason::Cancelled,
            format!("the run was cancelled ({reason:?})"),
        ),
        RunPhase::Succeeded => Ending::Grade(run),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lifecycle::{CancelReason, PendingReason};

    fn at(second: i64) -> Timestamp {
        Timestamp::from_second(second).expect("a time")
    }

    fn unscored(reason: UnscoredReason, evidence: &str) -> Ending<()> {
        Ending::Unscored {
            reason,
            evidence: evidence.to_string(),
            interrupt_grading: false,
            cancel_run: false,
        }
    }

    fn read(phase: RunPhase) -> CaseRun<'static, ()> {
        CaseRun::Read {
            phase,
            message: "the model said no",
            run: (),
        }
    }

    #[test]
    fn a_cancelled_group_or_a_passed_deadline_cuts_a_case_short() {
        let deadline = at(1_000);
        let cut = |reason, evidence: &str| {
            Some(Ending::<()>::Unscored {
                reason,
                evidence: evidence.to_string(),
                interrupt_grading: true,
                cancel_run: false,
            })
        };
        let cancelled = "the evaluation group was cancelled";
        let late = "the evaluation's deadline passed before the case was graded";
        // (group cancelled, now) -> ending
        let table = [
            (true, at(999), cut(UnscoredReason::Cancelled, cancelled)),
            (true, at(2_000), cut(UnscoredReason::Cancelled, cancelled)),
            (
                false,
                at(1_000),
                cut(UnscoredReason::EvaluationTimeout, late),
            ),
            (
                false,
                at(1_001),
                cut(UnscoredReason::EvaluationTimeout, late),
            ),
            (false, at(999), None),
        ];
        for (cancelled, now, expected) in table {
            assert_eq!(
                cut_short(cancelled, now, deadline),
                expected,
                "cancelled {cancelled}, at {now}"
            );
        }
    }

    #[test]
    fn each_end_of_a_case_s_run_gives_its_case_s_ending() {
        let deadline = at(1_000);
        // run -> ending
        let table = [
            (
                CaseRun::Deleted,
                unscored(UnscoredReason::RunFailed, "the case's run was deleted"),
            ),
            (
                read(RunPhase::Waiting(WaitReason::MaxCostReached)),
                Ending::Unscored {
                    reason: UnscoredReason::LimitReached,
                    evidence: "the run reached its cost cap (perRunMaxCostUSD)".to_string(),
                    interrupt_grading: false,
                    cancel_run: true,
                },
            ),
            (
                read(RunPhase::Pending(PendingReason::GroupWait)),
                Ending::Later(deadline),
            ),
            (read(RunPhase::Running), Ending::Later(deadline)),
            (
                read(RunPhase::Waiting(WaitReason::AwaitingFunds)),
                Ending::Later(deadline),
            ),
            (
                read(RunPhase::Waiting(WaitReason::AwaitingMessage)),
                Ending::Later(deadline),
            ),
            (read(RunPhase::NeedsResolution), Ending::Later(deadline)),
            (
                read(RunPhase::Failed(FailReason::DeadlineExceeded)),
                unscored(
                    UnscoredReason::EvaluationTimeout,
                    "the run was cut off at the evaluation's deadline",
                ),
            ),
            (
                read(RunPhase::Failed(FailReason::TimeoutExceeded)),
                unscored(UnscoredReason::LimitReached, "the run reached its timeout"),
            ),
            (
                read(RunPhase::Failed(FailReason::ModelCallFailed)),
                unscored(
                    UnscoredReason::RunFailed,
                    "the run failed (ModelCallFailed) the model said no",
                ),
            ),
            (
                CaseRun::Read {
                    phase: RunPhase::Failed(FailReason::SandboxFailed),
                    message: "",
                    run: (),
                },
                unscored(UnscoredReason::RunFailed, "the run failed (SandboxFailed)"),
            ),
            (
                read(RunPhase::Cancelled(CancelReason::DependencyFailed)),
                unscored(
                    UnscoredReason::Cancelled,
                    "the run was cancelled (DependencyFailed)",
                ),
            ),
            (read(RunPhase::Succeeded), Ending::Grade(())),
        ];
        for (run, expected) in table {
            assert_eq!(ending(deadline, run), expected, "{run:?}");
        }
    }
}

//! The run lifecycle: phases with their reasons, and the pure transition function.
//!
//! A phase carries its reason in its type, so a `Succeeded` run cannot have a reason and a
//! `Pending` run cannot have `DeadlineExceeded`. Every change of phase goes through
//! [`RunPhase::apply`], which refuses the moves the lifecycle does not allow.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Why a run has not started.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum PendingReason {
    /// Waiting for an executor to take it.
    Queued,
    /// A dependency in its group has not succeeded yet.
    DependencyWait,
    /// Its group has no free slot or no room under the cost cap.
    GroupWait,
}

/// Why a started run is waiting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum WaitReason {
    /// A keepAlive run between turns.
    AwaitingMessage,
    /// The project's credits do not cover the next call; resumes when credits are added.
    AwaitingFunds,
    /// The next call at its largest does not fit under the run's cap; the run makes no more
    /// calls.
    MaxCostReached,
}

/// Why a run failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum FailReason {
    /// `spec.deadline` passed.
    DeadlineExceeded,
    /// `spec.timeout` passed.
    TimeoutExceeded,
    /// A model call failed for good.
    ModelCallFailed,
    /// The sandbox could not be created.
    SandboxFailed,
    /// The agent answered, and the run's post-run action failed.
    PostRunActionFailed,
}

/// Why a run was cancelled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
#[non_exhaustive]
pub enum CancelReason {
    /// A person cancelled it.
    CancelRequested,
    /// Its group was cancelled.
    GroupCancelled,
    /// A dependency failed.
    DependencyFailed,
    /// A dependency was cancelled.
    DependencyCancelled,
}

/// A run's phase, with its reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RunPhase {
    /// Not started.
    Pending(PendingReason),
    /// Working: routing, calling the model, running commands.
    Running,
    /// Started, holding its sandbox, making no calls.
    Waiting(WaitReason),
    /// A step's outcome is uncertain; a person must resolve it.
    NeedsResolution,
    /// Finished with an answer.
    Succeeded,
    /// Finished without one.
    Failed(FailReason),
    /// Stopped before finishing.
    Cancelled(CancelReason),
}

/// How a person resolves a run parked on an uncertain step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub enum Resolution {
    /// Carry the step out again.
    Retry,
    /// Record the step as failed and continue.
    RecordFailed,
    /// Cancel the run.
    Cancel,
}

/// Something that moves a run between phases.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RunEvent {
    /// Queue (or re-queue) a pending run for a reason.
    Queue(PendingReason),
    /// Start working.
    Start,
    /// Wait without working.
    Wait(WaitReason),
    /// Resume working after a wait.
    Resume,
    /// Park on an uncertain step.
    Park,
    /// A person resolved the uncertain step.
    Resolve(Resolution),
    /// Finish with an answer.
    Succeed,
    /// Finish without one.
    Fail(FailReason),
    /// Stop before finishing.
    Cancel(CancelReason),
}

/// A move the lifecycle does not allow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("a run in phase {from} cannot take the event {event:?}")]
pub struct TransitionRefused {
    /// The phase the run is in.
    pub from: RunPhase,
    /// The refused event.
    pub event: RunEvent,
}

impl RunPhase {
    /// Whether the run has finished (no event moves it any more).
    pub fn is_finished(self) -> bool {
        matches!(
            self,
            RunPhase::Succeeded | RunPhase::Failed(_) | RunPhase::Cancelled(_)
        )
    }

    /// Whether `phase`, a run's `status.phase` as stored (the name alone, without its reason),
    /// names a finished phase; a name this engine does not know is not finished.
    pub fn names_finished(phase: &str) -> bool {
        RunPhase::all()
            .into_iter()
            .any(|candidate| candidate.name() == phase && candidate.is_finished())
    }

    /// Whether the run has started and not finished (it holds a slot in its group).
    pub fn is_started(self) -> bool {
        matches!(
            self,
            RunPhase::Running | RunPhase::Waiting(_) | RunPhase::NeedsResolution
        )
    }

    /// The phase after `event`, or a refusal.
    pub fn apply(self, event: RunEvent) -> Result<RunPhase, TransitionRefused> {
        use RunEvent as E;
        use RunPhase as P;
        let refused = TransitionRefused { from: self, event };
        let next = match (self, event) {
            (P::Pending(_), E::Queue(reason)) => P::Pending(reason),
            (P::Pending(_), E::Start) => P::Running,
            (P::Running, E::Wait(reason)) => P::Waiting(reason),
            // A run that reached its cap makes no more calls: only cancel or a deadline end it.
            (P::Waiting(WaitReason::MaxCostReached), E::Resume) => return Err(refused),
            (P::Waiting(_), E::Resume) => P::Running,
            (P::Running, E::Park) => P::NeedsResolution,
            (P::NeedsResolution, E::Resolve(Resolution::Cancel)) => {
                P::Cancelled(CancelReason::CancelRequested)
            }
            (P::NeedsResolution, E::Resolve(_)) => P::Running,
            (P::Running, E::Succeed) => P::Succeeded,
            (phase, E::Fail(reason)) if !phase.is_finished() => {
                // Only time ends a run that has not started; errors need a started run.
                let started_only = matches!(
                    reason,
                    FailReason::ModelCallFailed
                        | FailReason::SandboxFailed
                        | FailReason::PostRunActionFailed
                );
                if started_only && !matches!(phase, P::Running) {
                    return Err(refused);
                }
                P::Failed(reason)
            }
            (P::Pending(_), E::Cancel(reason)) => P::Cancelled(reason),
            (
                phase,
                E::Cancel(reason @ (CancelReason::CancelRequested | CancelReason::GroupCancelled)),
            ) if !phase.is_finished() => P::Cancelled(reason),
            _ => return Err(refused),
        };
        Ok(next)
    }

    /// Move to `target` through the lifecycle: directly when it allows, otherwise by
    /// starting or resuming first. A move the lifecycle refuses is an error, never forced.
    pub fn toward(self, target: RunPhase) -> Result<RunPhase, TransitionRefused> {
        if self == target {
            return Ok(self);
        }
        let direct = target.event_toward().map(|event| self.apply(event));
        if let Some(Ok(next)) = direct {
            return Ok(next);
        }
        let running = match self {
            RunPhase::Pending(_) => self.apply(RunEvent::Start)?,
            RunPhase::Waiting(_) => self.apply(RunEvent::Resume)?,
            RunPhase::Running => self,
            _ => {
                return Err(TransitionRefused {
                    from: self,
                    event: target.event_toward().unwrap_or(RunEvent::Start),
                });
            }
        };
        match target.event_toward() {
            Some(event) => running.apply(event),
            None => Ok(running),
        }
    }

    /// The event that leads to this phase, if one does.
    fn event_toward(self) -> Option<RunEvent> {
        Some(match self {
            RunPhase::Pending(reason) => RunEvent::Queue(reason),
            RunPhase::Running => return None,
            RunPhase::Waiting(reason) => RunEvent::Wait(reason),
            RunPhase::NeedsResolution => RunEvent::Park,
            RunPhase::Succeeded => RunEvent::Succeed,
            RunPhase::Failed(reason) => RunEvent::Fail(reason),
            RunPhase::Cancelled(reason) => RunEvent::Cancel(reason),
        })
    }

    /// The `phase` string.
    pub fn name(self) -> &'static str {
        match self {
            RunPhase::Pending(_) => "Pending",
            RunPhase::Running => "Running",
            RunPhase::Waiting(_) => "Waiting",
            RunPhase::NeedsResolution => "NeedsResolution",
            RunPhase::Succeeded => "Succeeded",
            RunPhase::Failed(_) => "Failed",
            RunPhase::Cancelled(_) => "Cancelled",
        }
    }

    /// The `reason` string, when the phase has one.
    pub fn reason(self) -> Option<&'static str> {
        Some(match self {
            RunPhase::Pending(PendingReason::Queued) => "Queued",
            RunPhase::Pending(PendingReason::DependencyWait) => "DependencyWait",
            RunPhase::Pending(PendingReason::GroupWait) => "GroupWait",
            RunPhase::Waiting(WaitReason::AwaitingMessage) => "AwaitingMessage",
            RunPhase::Waiting(WaitReason::AwaitingFunds) => "AwaitingFunds",
            RunPhase::Waiting(WaitReason::MaxCostReached) => "MaxCostReached",
            RunPhase::Failed(FailReason::DeadlineExceeded) => "DeadlineExceeded",
            RunPhase::Failed(FailReason::TimeoutExceeded) => "TimeoutExceeded",
            RunPhase::Failed(FailReason::ModelCallFailed) => "ModelCallFailed",
            RunPhase::Failed(FailReason::SandboxFailed) => "SandboxFailed",
            RunPhase::Failed(FailReason::PostRunActionFailed) => "PostRunActionFailed",
            RunPhase::Cancelled(CancelReason::CancelRequested) => "CancelRequested",
            RunPhase::Cancelled(CancelReason::GroupCancelled) => "GroupCancelled",
            RunPhase::Cancelled(CancelReason::DependencyFailed) => "DependencyFailed",
            RunPhase::Cancelled(CancelReason::DependencyCancelled) => "DependencyCancelled",
            RunPhase::Running | RunPhase::NeedsResolution | RunPhase::Succeeded => return None,
        })
    }

    /// Every phase with every reason, in the order a run goes through them (for exhaustive
    /// tests, documentation and choices shown).
    pub fn all() -> Vec<RunPhase> {
        use RunPhase as P;
        let mut all = Vec::new();
        for reason in [
            PendingReason::Queued,
            PendingReason::DependencyWait,
            PendingReason::GroupWait,
        ] {
            all.push(P::Pending(reason));
        }
        all.push(P::Running);
        for reason in [
            WaitReason::AwaitingMessage,
            WaitReason::AwaitingFunds,
            WaitReason::MaxCostReached,
        ] {
            all.push(P::Waiting(reason));
        }
        all.extend([P::NeedsResolution, P::Succeeded]);
        for reason in [
            FailReason::DeadlineExceeded,
            FailReason::TimeoutExceeded,
            FailReason::ModelCallFailed,
            FailReason::SandboxFailed,
            FailReason::PostRunActionFailed,
        ] {
            all.push(P::Failed(reason));
        }
        for reason in [
            CancelReason::CancelRequested,
            CancelReason::GroupCancelled,
            CancelReason::DependencyFailed,
            CancelReason::DependencyCancelled,
        ] {
            all.push(P::Cancelled(reason));
        }
        all
    }

    fn parse(phase: &str, reason: Option<&str>) -> Option<RunPhase> {
        RunPhase::all()
            .into_iter()
            .find(|candidate| candidate.name() == phase && candidate.reason() == reason)
    }
}

impl fmt::Display for RunPhase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.reason() {
            Some(reason) => write!(f, "{} ({reason})", self.name()),
            None => f.write_str(self.name()),
        }
    }
}

#[derive(Serialize, Deserialize)]
struct PhaseRepr<'a> {
    phase: std::borrow::Cow<'a, str>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    reason: Option<std::borrow::Cow<'a, str>>,
}

impl Serialize for RunPhase {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        PhaseRepr {
            phase: self.name().into(),
            reason: self.reason().map(Into::into),
        }
        .serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for RunPhase {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let repr = PhaseRepr::deserialize(deserializer)?;
        RunPhase::parse(&repr.phase, repr.reason.as_deref()).ok_or_else(|| {
            serde::de::Error::custom(format!(
                "unknown run phase {:?} with reason {:?}",
                repr.phase, repr.reason
            ))
        })
    }
}

/// What a request to cancel a run comes to ([`RunPhase::cancelling`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cancelling {
    /// It has finished: there is nothing to cancel.
    Finished,
    /// It has not started: cancelled at once, in this phase (no drive would end it).
    Now(RunPhase),
    /// It has started: the request is recorded (`status.cancelRequested`), and its drive
    /// stops its command, deletes its sandbox and ends it.
    Flagged,
}

impl RunPhase {
    /// What cancelling a run in this phase for `reason` comes to: cancel now or flag.
    pub fn cancelling(self, reason: CancelReason) -> Result<Cancelling, TransitionRefused> {
        if self.is_finished() {
            Ok(Cancelling::Finished)
        } else if matches!(self, RunPhase::Pending(_)) {
            self.apply(RunEvent::Cancel(reason)).map(Cancelling::Now)
        } else {
            Ok(Cancelling::Flagged)
        }
    }
}

/// What a person's resolution of a parked run does to the run ([`RunPhase::resolving`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resolving {
    /// The run goes on working, in this phase: the step is carried out again, or recorded as
    /// failed and the run continues.
    Resume(RunPhase),
    /// The run is cancelled as a started run is: the request is recorded
    /// (`status.cancelRequested`, for this reason) and its drive deletes its sandbox and ends
    /// it; its phase stays until then.
    Flag(CancelReason),
}

impl RunPhase {
    /// What resolving a run in this phase with `resolution` does to it; only a parked run
    /// (`NeedsResolution`) takes a resolution, any other phase refuses it.
    pub fn resolving(self, resolution: Resolution) -> Result<Resolving, TransitionRefused> {
        let event = RunEvent::Resolve(resolution);
        if !self.takes_resolution() {
            return Err(TransitionRefused { from: self, event });
        }
        match resolution {
            Resolution::Cancel => Ok(Resolving::Flag(CancelReason::CancelRequested)),
            Resolution::Retry | Resolution::RecordFailed => {
                self.apply(event).map(Resolving::Resume)
            }
        }
    }

    /// Whether a run in this phase takes a resolution: it is parked on an uncertain step.
    pub fn takes_resolution(self) -> bool {
        self == RunPhase::NeedsResolution
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all_events() -> Vec<RunEvent> {
        let mut events = vec![
            RunEvent::Start,
            RunEvent::Resume,
            RunEvent::Park,
            RunEvent::Succeed,
        ];
        for phase in RunPhase::all() {
            match phase {
                RunPhase::Pending(r) => events.push(RunEvent::Queue(r)),
                RunPhase::Waiting(r) => events.push(RunEvent::Wait(r)),
                RunPhase::Failed(r) => events.push(RunEvent::Fail(r)),
                RunPhase::Cancelled(r) => events.push(RunEvent::Cancel(r)),
                _ => {}
            }
        }
        for resolution in [
            Resolution::Retry,
            Resolution::RecordFailed,
            Resolution::Cancel,
        ] {
            events.push(RunEvent::Resolve(resolution));
        }
        events
    }

    /// The whole table, written out: every phase × every event that is allowed, with its
    /// result. Everything not listed here must be refused.
    fn allowed(phase: RunPhase, event: RunEvent) -> Option<RunPhase> {
        use RunEvent as E;
        use RunPhase as P;
        match (phase, event) {
            (P::Pending(_), E::Queue(r)) => Some(P::Pending(r)),
            (P::Pending(_), E::Start) => Some(P::Running),
            (P::Pending(_), E::Cancel(r)) => Some(P::Cancelled(r)),
            (
                P::Pending(_),
                E::Fail(r @ (FailReason::DeadlineExceeded | FailReason::TimeoutExceeded)),
            ) => Some(P::Failed(r)),
            (P::Running, E::Wait(r)) => Some(P::Waiting(r)),
            (P::Running, E::Park) => Some(P::NeedsResolution),
            (P::Running, E::Succeed) => Some(P::Succeeded),
            (P::Running, E::Fail(r)) => Some(P::Failed(r)),
            (P::Waiting(WaitReason::AwaitingMessage | WaitReason::AwaitingFunds), E::Resume) => {
                Some(P::Running)
            }
            (
                P::Running | P::Waiting(_) | P::NeedsResolution,
                E::Cancel(r @ (CancelReason::CancelRequested | CancelReason::GroupCancelled)),
            ) => Some(P::Cancelled(r)),
            (
                P::Waiting(_) | P::NeedsResolution,
                E::Fail(r @ (FailReason::DeadlineExceeded | FailReason::TimeoutExceeded)),
            ) => Some(P::Failed(r)),
            (P::NeedsResolution, E::Resolve(Resolution::Cancel)) => {
                Some(P::Cancelled(CancelReason::CancelRequested))
            }
            (P::NeedsResolution, E::Resolve(_)) => Some(P::Running),
            _ => None,
        }
    }

    #[test]
    fn every_transition_matches_the_table_refused_ones_included() {
        let mut allowed_count = 0;
        let mut refused_count = 0;
        for phase in RunPhase::all() {
            for event in all_events() {
                let got = phase.apply(event);
                match allowed(phase, event) {
                    Some(next) => {
                        allowed_count += 1;
                        assert_eq!(got, Ok(next), "{phase} + {event:?}");
                    }
                    None => {
                        refused_count += 1;
                        assert_eq!(
                            got,
                            Err(TransitionRefused { from: phase, event }),
                            "{phase} + {event:?} must be refused"
                        );
                    }
                }
            }
        }
        assert!(
            allowed_count > 30 && refused_count > 200,
            "{allowed_count} / {refused_count}"
        );
    }

    #[test]
    fn finished_runs_refuse_everything() {
        for phase in RunPhase::all().into_iter().filter(|p| p.is_finished()) {
            for event in all_events() {
                assert!(phase.apply(event).is_err(), "{phase} + {event:?}");
            }
        }
    }

    #[test]
    fn phase_and_reason_round_trip_through_json() {
        for phase in RunPhase::all() {
            let json = serde_json::to_value(phase).expect("serialize");
            assert_eq!(json["phase"], phase.name());
            assert_eq!(json.get("reason").and_then(|r| r.as_str()), phase.reason());
            let back: RunPhase = serde_json::from_value(json).expect("deserialize");
            assert_eq!(back, phase);
        }
        let bad = serde_json::json!({"phase": "Succeeded", "reason": "DeadlineExceeded"});
        assert!(serde_json::from_value::<RunPhase>(bad).is_err());
    }

    #[test]
    fn a_run_not_started_is_cancelled_now_a_started_one_flagged() {
        use super::Cancelling;
        let reason = CancelReason::CancelRequested;
        let table = [
            (
                RunPhase::Pending(PendingReason::Queued),
                Cancelling::Now(RunPhase::Cancelled(reason)),
            ),
            (RunPhase::Running, Cancelling::Flagged),
            (
                RunPhase::Waiting(WaitReason::AwaitingMessage),
                Cancelling::Flagged,
            ),
            (
                RunPhase::Waiting(WaitReason::MaxCostReached),
                Cancelling::Flagged,
            ),
            (RunPhase::NeedsResolution, Cancelling::Flagged),
            (RunPhase::Succeeded, Cancelling::Finished),
            (
                RunPhase::Failed(FailReason::DeadlineExceeded),
                Cancelling::Finished,
            ),
            (
                RunPhase::Cancelled(CancelReason::GroupCancelled),
                Cancelling::Finished,
            ),
        ];
        for (phase, expected) in table {
            assert_eq!(phase.cancelling(reason), Ok(expected), "{phase}");
        }
    }

    #[test]
    fn only_a_parked_run_is_resolved_a_cancel_is_flagged_the_others_resume() {
        use super::Resolving;
        let parked = RunPhase::NeedsResolution;
        let table = [
            (
                parked,
                Resolution::Retry,
                Ok(Resolving::Resume(RunPhase::Running)),
            ),
            (
                parked,
                Resolution::RecordFailed,
                Ok(Resolving::Resume(RunPhase::Running)),
            ),
            (
                parked,
                Resolution::Cancel,
                Ok(Resolving::Flag(CancelReason::CancelRequested)),
            ),
            (RunPhase::Running, Resolution::Retry, Err(RunPhase::Running)),
            (
                RunPhase::Waiting(WaitReason::AwaitingMessage),
                Resolution::RecordFailed,
                Err(RunPhase::Waiting(WaitReason::AwaitingMessage)),
            ),
            (
                RunPhase::Pending(PendingReason::Queued),
                Resolution::Cancel,
                Err(RunPhase::Pending(PendingReason::Queued)),
            ),
            (
                RunPhase::Succeeded,
                Resolution::Retry,
                Err(RunPhase::Succeeded),
            ),
            (
                RunPhase::Cancelled(CancelReason::CancelRequested),
                Resolution::Cancel,
                Err(RunPhase::Cancelled(CancelReason::CancelRequested)),
            ),
        ];
        for (phase, resolution, expected) in table {
            let got = phase.resolving(resolution).map_err(|refused| refused.from);
            assert_eq!(got, expected, "{phase} resolved with {resolution:?}");
        }
    }

    #[test]
    fn finished_phases_are_told_by_their_stored_name() {
        let table = [
            ("Succeeded", true),
            ("Failed", true),
            ("Cancelled", true),
            ("Pending", false),
            ("Running", false),
            ("Waiting", false),
            ("NeedsResolution", false),
            ("succeeded", false),
            ("Finished", false),
            ("", false),
        ];
        for (name, finished) in table {
            assert_eq!(RunPhase::names_finished(name), finished, "{name:?}");
        }
    }
}

//! A run's status, projected from its journal and its phase.

use jiff::Timestamp;

use crate::lifecycle::{RunPhase, WaitReason};
use crate::replay::{Replay, SandboxState};
use crate::resource::{AgentRunStatus, AnswerStatus, SandboxStatus};

/// Bytes of the answer kept in `status.answer.preview`.
pub const ANSWER_PREVIEW_BYTES: usize = 4096;

/// The status after a step: derived fields from the journal, the phase given, the rest kept.
pub fn project(
    old: &AgentRunStatus,
    replay: &Replay,
    phase: RunPhase,
    started_at: Option<Timestamp>,
    now: Timestamp,
) -> AgentRunStatus {
    let mut status = old.clone();
    status.phase = Some(phase);
    status.turns = replay.turn_statuses();
    status.cost.total_usd = replay.spent;
    if let Some(answer) = replay.answer() {
        status.answer = Some(AnswerStatus {
            preview: preview(&answer, ANSWER_PREVIEW_BYTES).to_string(),
            bytes: answer.len() as u64,
        });
    }
    if let SandboxState::Live(info) = &replay.sandbox {
        status.sandbox = Some(SandboxStatus {
            id: info.id.0.clone(),
            isolated: info.isolated,
            host: info.host.clone(),
        });
    }
    if status.start_time.is_none() {
        status.start_time = started_at;
    }
    if phase.is_finished() {
        status.completion_time.get_or_insert(now);
        status.cancel_requested = None;
    }
    // Derived from the journal on every write, so that it never outlives the ending it
    // describes (a run that decided otherwise after a crash loses it at its next write).
    status.ending = ending(phase, replay);
    status.message = message(phase, replay);
    status
}

/// `status.ending`: how the run ends while it deletes its sandbox to end (`send_message`
/// refuses messages then, reading it on the document it posts against); none once finished.
fn ending(phase: RunPhase, replay: &Replay) -> Option<RunPhase> {
    if phase.is_finished() {
        return None;
    }
    replay.ending()
}

fn message(phase: RunPhase, replay: &Replay) -> Option<String> {
    if let Some(then) = ending(phase, replay) {
        return Some(format!(
            "the run is ending ({then}): deleting its sandbox; it takes no more messages"
        ));
    }
    Some(match phase {
        RunPhase::Waiting(WaitReason::MaxCostReached) => format!(
            "the next model call at its largest does not fit under the run's cap (spent {}); \
             the run makes no more calls: cancel it and start a new one to continue",
            replay.spent
        ),
        RunPhase::Waiting(WaitReason::AwaitingMessage) => {
            "waiting for a message; the sandbox is kept".to_string()
        }
        RunPhase::Waiting(WaitReason::AwaitingFunds) => {
            "waiting for credits; continues when credits are added".to_string()
        }
        RunPhase::NeedsResolution => {
            "a step was interrupted and its outcome is uncertain: inspect the sandbox, then \
             resolve with retry, record-failed or cancel"
                .to_string()
        }
        RunPhase::Failed(crate::lifecycle::FailReason::PostRunActionFailed) => {
            "the agent answered, and the run's post-run action failed: its error result says \
             why"
            .to_string()
        }
        RunPhase::Failed(_) => match &replay.sandbox {
            SandboxState::Failed(error) => format!("the sandbox could not be created: {error}"),
            _ => replay
                .turns
                .iter()
                .rev()
                .find_map(|t| {
                    t.route_failed.as_deref().or_else(|| {
                        t.calls.iter().rev().find_map(|c| match c {
                            crate::replay::Call::Failed { error, .. } => Some(error.as_str()),
                            crate::replay::Call::Replied { .. } => None,
                        })
                    })
                })
                .map_or_else(|| phase.to_string(), str::to_string),
        },
        _ => return None,
    })
}

/// The longest prefix of `text` of at most `max` bytes that ends on a character boundary.
pub fn preview(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::journal::{Intent, Step};
    use crate::sandbox::SandboxId;

    fn ending_step() -> Step {
        Step {
            seq: 0,
            started_at: Timestamp::UNIX_EPOCH,
            intent: Intent::DestroySandbox {
                id: SandboxId("sandbox-1".to_string()),
                then: RunPhase::Succeeded,
            },
            completion: None,
        }
    }

    #[test]
    fn ending_is_set_while_the_sandbox_deletion_is_under_way_and_only_then() {
        let now = Timestamp::UNIX_EPOCH;
        let ending = Replay::of(&[ending_step()]);
        let status = project(
            &AgentRunStatus::default(),
            &ending,
            RunPhase::Running,
            None,
            now,
        );
        assert_eq!(status.ending, Some(RunPhase::Succeeded));
        assert!(
            status
                .message
                .as_deref()
                .is_some_and(|m| m.contains("takes no more messages")),
            "{:?}",
            status.message
        );
        // Finished: the phase says it all.
        let finished = project(&status, &ending, RunPhase::Succeeded, None, now);
        assert_eq!(finished.ending, None);
        // A run whose journal holds no ending (it decided otherwise after a crash) loses the
        // field at its next write.
        let going_on = project(&status, &Replay::default(), RunPhase::Running, None, now);
        assert_eq!(going_on.ending, None);
        assert_eq!(going_on.message, None);
    }
}

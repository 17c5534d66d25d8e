//! The run journal: one step per effect, its intent written before the effect and its
//! outcome after. Replay takes each completed step's outcome instead of acting again.

use jiff::Timestamp;
use serde::{Deserialize, Serialize};

use crate::catalog::Family;
use crate::cost::Usage;
use crate::lifecycle::{Resolution, RunPhase};
use crate::model::ModelResponse;
use crate::money::Usd;
use crate::resource::ChosenBy;
use crate::sandbox::{ExecOutput, SandboxId, SandboxInfo, SandboxSpec};

/// What the run is about to do.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(
    tag = "kind",
    rename_all = "camelCase",
    rename_all_fields = "camelCase"
)]
pub enum Intent {
    /// Create (or re-attach to) the run's sandbox.
    CreateSandbox {
        /// What to create.
        spec: SandboxSpec,
    },
    /// Choose the turn's model.
    Route {
        /// The turn (0 is the input).
        turn: u32,
    },
    /// Call the model.
    CallModel {
        /// The turn.
        turn: u32,
        /// The model id.
        model: String,
        /// Reserved under the run's cap for this call.
        #[serde(rename = "reservedUSD")]
        reserved_usd: Usd,
        /// Whether the shell tool was offered (not once `maxToolCalls` is reached).
        tools: bool,
    },
    /// Run a command the model asked for.
    Command {
        /// The turn.
        turn: u32,
        /// The model's tool-call id.
        tool_use_id: String,
        /// The shell command line.
        command: String,
    },
    /// Take a message from the inbox as the next turn's prompt.
    ReadMessage {
        /// The turn it starts.
        turn: u32,
        /// The message's sequence number in the inbox.
        message_seq: u64,
    },
    /// Record the turn's answer (the text of its last model reply).
    Answer {
        /// The turn.
        turn: u32,
    },
    /// Delete the sandbox, then end the run.
    DestroySandbox {
        /// The sandbox.
        id: SandboxId,
        /// How the run ends once the sandbox is gone.
        then: RunPhase,
    },
    /// Carry out the run's post-run action (after its agent answered, before its sandbox
    /// goes).
    PostRunAction {
        /// The action's kind (`agents.webhook`).
        action: String,
        /// Its config.
        config: serde_json::Value,
    },
}

/// The kind of a step, for listings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
pub enum StepKind {
    /// Creating the sandbox.
    SandboxCreation,
    /// Routing a prompt.
    Routing,
    /// A model call.
    ModelCall,
    /// A command in the sandbox.
    Command,
    /// Reading a message.
    Message,
    /// Recording the answer.
    Answer,
    /// Deleting the sandbox.
    SandboxDeletion,
    /// The run's post-run action.
    PostRunAction,
}

impl Intent {
    /// The step's kind.
    pub fn kind(&self) -> StepKind {
        match self {
            Intent::CreateSandbox { .. } => StepKind::SandboxCreation,
            Intent::Route { .. } => StepKind::Routing,
            Intent::CallModel { .. } => StepKind::ModelCall,
            Intent::Command { .. } => StepKind::Command,
            Intent::ReadMessage { .. } => StepKind::Message,
            Intent::Answer { .. } => StepKind::Answer,
            Intent::DestroySandbox { .. } => StepKind::SandboxDeletion,
            Intent::PostRunAction { .. } => StepKind::PostRunAction,
        }
    }

    /// Whether carrying the step out again after a crash is safe. A command may have changed
    /// the sandbox, and a call on the user's own key may have been charged to them: those
    /// park the run for a person instead.
    pub fn safe_to_repeat(&self, byok: bool) -> bool {
        match self {
            Intent::Command { .. } => false,
            Intent::CallModel { .. } => !byok,
            Intent::CreateSandbox { .. }
            | Intent::Route { .. }
            | Intent::ReadMessage { .. }
            | Intent::Answer { .. }
            | Intent::DestroySandbox { .. } => true,
            // Carried out again with the same idempotency key: a receiver that keeps the keys
            // it has seen takes it once, and one whose outcome was journaled is never repeated.
            Intent::PostRunAction { .. } => true,
        }
    }
}

/// What the step's effect produced.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(
    tag = "result",
    rename_all = "camelCase",
    rename_all_fields = "camelCase"
)]
pub enum Outcome {
    /// The sandbox exists.
    SandboxCreated {
        /// Its id and isolation.
        info: SandboxInfo,
    },
    /// The turn's model is chosen.
    Routed {
        /// The family.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        family: Option<Family>,
        /// The model id that answers the whole turn.
        model: String,
        /// How it was chosen.
        chosen_by: ChosenBy,
        /// What routing cost.
        #[serde(rename = "costUSD")]
        cost_usd: Usd,
        /// Tokens of a routing model call.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        usage: Option<Usage>,
        /// Why the fallback answered.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        fallback_reason: Option<String>,
    },
    /// The model replied.
    ModelReplied {
        /// The reply.
        response: ModelResponse,
        /// What the call cost.
        #[serde(rename = "costUSD")]
        cost_usd: Usd,
    },
    /// The command ran (whatever its exit code).
    CommandFinished {
        /// What it did.
        output: ExecOutput,
        /// The sandbox it ran in when the run's own was lost (its Docker host stopped
        /// answering, its process died) and was made again for it: from this step on the run
        /// is there (`status.sandbox`, later steps, replay after a restart).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        remade_sandbox: Option<SandboxInfo>,
    },
    /// The message is the next turn's prompt.
    MessageRead,
    /// The turn's answer is recorded.
    Answered,
    /// The sandbox is gone.
    SandboxDestroyed,
    /// The post-run action finished.
    ActionFinished {
        /// What it saved among the run's results: name → standard base64.
        #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
        results: std::collections::BTreeMap<String, String>,
    },
    /// The effect failed, or a person recorded an uncertain step as failed.
    Failed {
        /// What happened.
        error: String,
        /// Whether a person recorded it as failed (its real outcome is unknown) and the run
        /// continues.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        by_resolution: bool,
    },
    /// The outcome stays unknown; a person chose to carry the step out again as a new step.
    Superseded,
    /// The command was stopped before it finished, because the run is ending (cancelled,
    /// deleted, or at its deadline): its processes were killed. A completed outcome, so the
    /// run ends instead of parking.
    Stopped {
        /// Why.
        reason: String,
    },
}

/// A step's outcome and when it was recorded.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Completion {
    /// When the outcome was recorded.
    pub finished_at: Timestamp,
    /// The outcome.
    #[serde(flatten)]
    pub outcome: Outcome,
}

/// One journal entry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Step {
    /// Position in the journal, from 0.
    pub seq: u32,
    /// When the intent was written.
    pub started_at: Timestamp,
    /// What the run set out to do.
    pub intent: Intent,
    /// What happened; `None` while under way, or forever when the process died.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion: Option<Completion>,
}

/// A step's state, as listings show it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
pub enum StepState {
    /// Under way.
    Started,
    /// Done; never repeated.
    Completed,
    /// Done, without success.
    Failed,
    /// Its outcome is unknown: interrupted by a crash, or superseded by a retry.
    Uncertain,
    /// Stopped before it finished because the run was ending; never repeated.
    Cancelled,
}

impl Step {
    /// The step's outcome, if recorded.
    pub fn outcome(&self) -> Option<&Outcome> {
        self.completion.as_ref().map(|c| &c.outcome)
    }

    /// The state to show; `interrupted` says the step is not under way in any process
    /// (the run is parked on it).
    pub fn state(&self, interrupted: bool) -> StepState {
        match self.outcome() {
            None if interrupted => StepState::Uncertain,
            None => StepState::Started,
            Some(Outcome::Superseded) => StepState::Uncertain,
            Some(Outcome::Failed { .. }) => StepState::Failed,
            Some(Outcome::Stopped { .. }) => StepState::Cancelled,
            Some(_) => StepState::Completed,
        }
    }

    /// One line about the step.
    pub fn summary(&self) -> String {
        let intent = match &self.intent {
            Intent::CreateSandbox { .. } => "create sandbox".to_string(),
            Intent::Route { turn } => format!("route turn {turn}"),
            Intent::CallModel { turn, model, .. } => format!("call {model} (turn {turn})"),
            Intent::Command { command, .. } => format!("run `{}`", preview(command, 80)),
            Intent::ReadMessage { message_seq, .. } => format!("read message {message_seq}"),
            Intent::Answer { turn } => format!("answer turn {turn}"),
            Intent::DestroySandbox { id, then } => format!("delete sandbox {id}, then {then}"),
            Intent::PostRunAction { action, .. } => format!("post-run action {action}"),
        };
        let outcome = match self.outcome() {
            None => return intent,
            Some(Outcome::SandboxCreated { info }) if info.isolated => {
                format!("sandbox {}", info.id)
            }
            Some(Outcome::SandboxCreated { info }) => format!("sandbox {} (unisolated)", info.id),
            Some(Outcome::Routed {
                model, chosen_by, ..
            }) => format!("{model} (chosen by {})", chosen_by.name()),
            Some(Outcome::ModelReplied { response, cost_usd }) => format!(
                "{:?}, {} in / {} out tokens, ${cost_usd}",
                response.stop_reason,
                response.usage.prompt_tokens(),
                response.usage.output_tokens
            ),
            Some(Outcome::CommandFinished {
                output,
                remade_sandbox,
            }) => {
                let ended = match output.exit_code {
                    _ if output.timed_out => "timed out".to_string(),
                    _ if output.stopped.is_some() => {
                        format!("stopped: {}", output.stopped.as_deref().unwrap_or_default())
                    }
                    Some(code) => format!("exit {code}"),
                    None => "killed by a signal".to_string(),
                };
                match remade_sandbox {
                    None => ended,
                    Some(info) => format!("{ended} (in {})", remade(info)),
                }
            }
            Some(Outcome::MessageRead) => "read".to_string(),
            Some(Outcome::Answered) => "answered".to_string(),
            Some(Outcome::SandboxDestroyed) => "deleted".to_string(),
            Some(Outcome::ActionFinished { results }) => match results.len() {
                0 => "done".to_string(),
                n => format!("done, {n} result(s) saved"),
            },
            Some(Outcome::Failed { error, .. }) => format!("failed: {}", preview(error, 200)),
            Some(Outcome::Superseded) => "outcome unknown; retried as a new step".to_string(),
            Some(Outcome::Stopped { reason }) => format!("stopped: {}", preview(reason, 200)),
        };
        format!("{intent}: {outcome}")
    }
}

/// How a step's summary names a sandbox made again: its id, and its host where it has one.
fn remade(info: &SandboxInfo) -> String {
    match &info.host {
        Some(host) => format!("sandbox {} made again on {host}", info.id),
        None => format!("sandbox {} made again", info.id),
    }
}

/// The first `max` characters of `text`, on one line.
fn preview(text: &str, max: usize) -> String {
    let line: String = text
        .chars()
        .map(|c| if c == '\n' { ' ' } else { c })
        .take(max)
        .collect();
    if text.chars().count() > max {
        format!("{line}…")
    } else {
        line
    }
}

/// What a person's resolution of a parked run records in its journal: the step it resolves
/// (the last one with no outcome, the one the run is parked on) and the outcome it gets:
/// `Superseded` for a retry (carried out again as a new step), a failure recorded by the
/// resolution otherwise. `None` when no step lacks its outcome.
pub fn resolved(journal: &[Step], resolution: Resolution) -> Option<(&Step, Outcome)> {
    let step = journal
        .iter()
        .rev()
        .find(|step| step.completion.is_none())?;
    let outcome = match resolution {
        Resolution::Retry => Outcome::Superseded,
        Resolution::RecordFailed => Outcome::Failed {
            error: "interrupted with an unknown outcome; recorded as failed by a person"
                .to_string(),
            by_resolution: true,
        },
        Resolution::Cancel => Outcome::Failed {
            error: "interrupted with an unknown outcome; the run was cancelled".to_string(),
            by_resolution: true,
        },
    };
    Some((step, outcome))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_in_a_step_read_back_bit_for_bit() {
        // Found by nodus-store's fuzz_steps_read_back_from_their_stored_text: without
        // serde_json's float_roundtrip, these came back one unit in the last place off.
        for number in [2.489_259_630_156_781e-121, -7.782_073_234_162_849e187] {
            let step = Step {
                seq: 0,
                started_at: Timestamp::UNIX_EPOCH,
                intent: Intent::PostRunAction {
                    action: "agents.noop".to_string(),
                    config: serde_json::json!({ "x": number }),
                },
                completion: None,
            };
            let text = serde_json::to_string(&step).expect("encode");
            let back: Step = serde_json::from_str(&text).expect("decode");
            assert_eq!(back, step, "{text}");
        }
    }

    /// A step of a small journal: sequence `seq`, a routing, completed with `outcome` or
    /// not.
    fn step(seq: u32, outcome: Option<Outcome>) -> Step {
        Step {
            seq,
            started_at: Timestamp::UNIX_EPOCH,
            intent: Intent::Route { turn: seq },
            completion: outcome.map(|outcome| Completion {
                finished_at: Timestamp::UNIX_EPOCH,
                outcome,
            }),
        }
    }

    #[test]
    fn a_resolution_gives_the_last_step_without_an_outcome_its_outcome() {
        let failed = |error: &str| Outcome::Failed {
            error: error.to_string(),
            by_resolution: true,
        };
        let done = || {
            Some(Outcome::Stopped {
                reason: "done".to_string(),
            })
        };
        // (journal: each step's seq and whether it has an outcome, resolution) -> (the step
        // resolved, its outcome)
        let table = [
            (
                vec![step(0, done()), step(1, None)],
                Resolution::Retry,
                Some((1, Outcome::Superseded)),
            ),
            (
                vec![step(0, done()), step(1, None)],
                Resolution::RecordFailed,
                Some((
                    1,
                    failed("interrupted with an unknown outcome; recorded as failed by a person"),
                )),
            ),
            (
                vec![step(0, done()), step(1, None)],
                Resolution::Cancel,
                Some((
                    1,
                    failed("interrupted with an unknown outcome; the run was cancelled"),
                )),
            ),
            // An earlier retry left a superseded step: the new attempt after it is resolved.
            (
                vec![
                    step(0, done()),
                    step(1, Some(Outcome::Superseded)),
                    step(2, None),
                ],
                Resolution::Retry,
                Some((2, Outcome::Superseded)),
            ),
            // The last step without an outcome, when an earlier one has none either.
            (
                vec![step(0, None), step(1, done()), step(2, None)],
                Resolution::Retry,
                Some((2, Outcome::Superseded)),
            ),
            (vec![step(0, done())], Resolution::Cancel, None),
        ];
        for (journal, resolution, expected) in table {
            let got = resolved(&journal, resolution).map(|(step, outcome)| (step.seq, outcome));
            assert_eq!(got, expected, "{resolution:?}");
        }
    }
}

//! The AgentRun resource: one conversation with an agent, in its own sandbox.

use jiff::Timestamp;
use serde::{Deserialize, Serialize};

use super::{AgentEnvironmentSpec, AgentSpec, DurationSpec, NameOrInline};
use crate::catalog::Family;
use crate::lifecycle::{CancelReason, PendingReason, RunPhase};
use crate::money::Usd;

/// `spec` of an AgentRun.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AgentRunSpec {
    /// The agent's name, or `project/name` for a shared template such as
    /// `nodus/claude-assistant`, or a whole agent spec written inline (validated and
    /// snapshotted onto the run, never stored as an Agent).
    pub agent: NameOrInline<AgentSpec>,
    /// The first prompt; the agent's `defaultInput` when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<String>,
    /// The group this run is a task of.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// The task's key in its group (a DNS label, unique in the group).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task_key: Option<String>,
    /// Task keys that must succeed before this run starts.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub depends_on: Vec<String>,
    /// Wait for messages after each turn instead of finishing.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub keep_alive: bool,
    /// When the run fails with `DeadlineExceeded`, waiting included.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schemars(with = "Option<super::DateTime>"))]
    pub deadline: Option<Timestamp>,
    /// Per-run parameters; must match the agent's `contextSchema`. The key `nodus` is reserved.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context: Option<serde_json::Map<String, serde_json::Value>>,
    /// The working directory the run starts from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workdir: Option<WorkdirSpec>,
    /// The AgentEnvironment (secrets, env vars, compute): a stored one's `name` or
    /// `project/name`, or one written inline; the agent's `environment` when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub environment: Option<NameOrInline<AgentEnvironmentSpec>>,
    /// Bounds the whole run from its first step (default 3600 s, which applies only to a run
    /// without a deadline).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<DurationSpec>,
    /// The container image for container sandboxes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// Work to do after the run succeeds, contributed by a plugin.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub post_run_action: Option<PostRunAction>,
    /// Whether the run's results include its `trajectory` (ATIF), built from its journal
    /// (default true; written out only when false).
    #[serde(default = "default_true", skip_serializing_if = "is_true")]
    pub auto_telemetry: bool,
    /// The run and step this run was forked from: its journal begins with that run's steps
    /// up to the step (inherited, never carried out again) and its working directory with
    /// the snapshot taken after it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fork_of: Option<ForkOf>,
}

/// `spec.forkOf`: where a fork starts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ForkOf {
    /// The source run's name, in the same project.
    pub run: String,
    /// The source's command step (journal sequence number) the fork continues after.
    pub step: u32,
    /// A new user message the fork's next model call sees after the conversation as it
    /// stood after `step`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<String>,
    /// This run replaces the source (`fork --replace`): the source is cancelled and names
    /// this run in its `status.replacedBy`. Written with the run, so that it is done even
    /// when the server stops between the run's creation and the source's cancellation: the
    /// run's first drive does it (again) before anything else.
    #[serde(default, skip_serializing_if = "is_false")]
    pub replace: bool,
}

// serde's `skip_serializing_if` passes a reference.
fn is_false(value: &bool) -> bool {
    !*value
}

fn default_true() -> bool {
    true
}

// serde's `skip_serializing_if` passes a reference.
fn is_true(value: &bool) -> bool {
    *value
}

impl AgentRunSpec {
    /// Default `timeout`: one hour.
    pub const DEFAULT_TIMEOUT: DurationSpec = DurationSpec::from_secs(3600);

    /// A run of `agent` with `input` and every default.
    pub fn new(agent: impl Into<String>, input: impl Into<String>) -> Self {
        AgentRunSpec {
            agent: NameOrInline::Name(agent.into()),
            input: Some(input.into()),
            group: None,
            task_key: None,
            depends_on: Vec::new(),
            keep_alive: false,
            deadline: None,
            context: None,
            workdir: None,
            environment: None,
            timeout: None,
            image: None,
            post_run_action: None,
            auto_telemetry: true,
            fork_of: None,
        }
    }
}

/// `spec.workdir`: files staged before the first command.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WorkdirSpec {
    /// A FileSet reference copied in as the starting tree.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_workdir: Option<String>,
    /// Single files layered on top, each at a relative path.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub artifact_mounts: Vec<ArtifactMount>,
}

/// One file mounted into the working directory.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ArtifactMount {
    /// `fileset#path` of the file.
    #[serde(rename = "ref")]
    pub reference: String,
    /// Where it goes, relative to the working directory.
    pub mount_path: String,
}

/// `spec.postRunAction`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PostRunAction {
    /// The action's kind, such as `agents.noop`.
    pub kind: String,
    /// The action's own configuration.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<serde_json::Value>,
}

/// `status` of an AgentRun.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct AgentRunStatus {
    /// `phase` and `reason`.
    #[serde(flatten, default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<RunPhase>,
    /// A sentence about the phase.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The phase the run ends in (`phase`, `reason`), set while it deletes its sandbox to end:
    /// from then on it takes no more messages (a message is refused with `AgentRunFinished`).
    /// Absent on a run that is not ending, and once it has finished.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ending: Option<RunPhase>,
    /// Each prompt with the model that served it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub turns: Vec<TurnStatus>,
    /// The final answer's first 4 KiB.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub answer: Option<AnswerStatus>,
    /// The replica that drives the run, or last drove it (its name, as `nodus get replicas`
    /// lists it). Absent before any replica wrote the run's status, and while a draining
    /// replica's run waits for another to take it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replica: Option<String>,
    /// Model spend so far and the cap.
    #[serde(default)]
    pub cost: CostStatus,
    /// The sandbox the run works in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<SandboxStatus>,
    /// The connections its sandbox asked the egress proxy for (runs with an allowlist).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress: Option<EgressCounts>,
    /// What the run copied at creation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<RunSnapshot>,
    /// A cancellation that was asked for and is being carried out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cancel_requested: Option<CancelReason>,
    /// The conversation was closed: the run succeeds after its current turn (and the messages
    /// that came before) instead of waiting for more messages.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub close_requested: bool,
    /// When the run started working.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schemars(with = "Option<super::DateTime>"))]
    pub start_time: Option<Timestamp>,
    /// When the run finished.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schemars(with = "Option<super::DateTime>"))]
    pub completion_time: Option<Timestamp>,
    /// When the retention sweep removed the run's recorded payloads (input, messages, step
    /// results), 30 days after it finished; set by the store.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schemars(with = "Option<super::DateTime>"))]
    pub payloads_removed_at: Option<Timestamp>,
    /// The fork that replaced this run (`nodus agentrun fork --replace`), which cancelled it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replaced_by: Option<String>,
}

impl AgentRunStatus {
    /// The run's phase: a run that has none has not been looked at yet, and is queued.
    pub fn current_phase(&self) -> RunPhase {
        self.phase
            .unwrap_or(RunPhase::Pending(PendingReason::Queued))
    }

    /// The phase a message to this run is refused with (`AgentRunFinished`): its phase once
    /// it has finished, the phase it ends in while it deletes its sandbox to end (`ending`);
    /// `None` while it takes messages.
    pub fn refuses_messages(&self) -> Option<RunPhase> {
        match self.phase {
            Some(phase) if phase.is_finished() => Some(phase),
            _ => self.ending,
        }
    }

    /// Whether this run takes messages: not finished, and not ending.
    pub fn takes_messages(&self) -> bool {
        self.refuses_messages().is_none()
    }

    /// Whether this run takes a resolution ([`RunPhase::takes_resolution`]): it is parked on
    /// an uncertain step.
    pub fn takes_resolution(&self) -> bool {
        self.current_phase().takes_resolution()
    }

    /// Whether a step of this run without an outcome is under way no more: the run is parked
    /// on it, or has finished (its outcome will never be written). Such a step reads as
    /// uncertain ([`Step::state`](crate::journal::Step::state)), never as started.
    pub fn steps_interrupted(&self) -> bool {
        self.takes_resolution() || self.is_finished()
    }

    /// Whether this run has finished.
    pub fn is_finished(&self) -> bool {
        self.phase.is_some_and(RunPhase::is_finished)
    }
}

/// One prompt of a run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct TurnStatus {
    /// The model that answered the whole turn.
    pub model: String,
    /// Its family, when routed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub family: Option<Family>,
    /// How the model was chosen.
    pub chosen_by: ChosenBy,
    /// What the turn cost (routing and model calls).
    #[serde(rename = "costUSD")]
    pub cost_usd: Usd,
    /// Input tokens over the turn's calls.
    pub input_tokens: u64,
    /// Output tokens over the turn's calls.
    pub output_tokens: u64,
    /// Cache-write tokens.
    pub cache_write_tokens: u64,
    /// Cache-read tokens.
    pub cache_read_tokens: u64,
    /// Commands run in the turn.
    pub commands: u32,
}

/// How a turn's model was chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub enum ChosenBy {
    /// The router picked it.
    Jev,
    /// The router failed or timed out; Sonnet answered.
    Fallback,
    /// The agent names one model (BYOK).
    Agent,
}

impl ChosenBy {
    /// The name as written in `status.turns[].chosenBy`.
    pub fn name(self) -> &'static str {
        match self {
            ChosenBy::Jev => "jev",
            ChosenBy::Fallback => "fallback",
            ChosenBy::Agent => "agent",
        }
    }
}

/// `status.answer`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct AnswerStatus {
    /// The first 4 KiB (cut at a character boundary).
    pub preview: String,
    /// The answer's full size in bytes.
    pub bytes: u64,
}

/// `status.cost`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
pub struct CostStatus {
    /// Model and routing spend so far.
    #[serde(rename = "totalUSD")]
    pub total_usd: Usd,
    /// The run's cap; absent for runs on the user's own key.
    #[serde(rename = "limitUSD", default, skip_serializing_if = "Option::is_none")]
    pub limit_usd: Option<Usd>,
}

/// `status.sandbox`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct SandboxStatus {
    /// The backend's id for the sandbox.
    pub id: String,
    /// False when the run ran in an operator-chosen unisolated mode.
    pub isolated: bool,
    /// The Docker host the sandbox was placed on, where the server has several
    /// (`--docker-host`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
}

/// What a run copied when it was created; later edits change only new runs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct RunSnapshot {
    /// The agent's `project/name`; absent for an agent written inline.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_ref: Option<String>,
    /// The agent's resourceVersion at creation; absent for an agent written inline.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_revision: Option<String>,
    /// The agent's spec at creation (its cost cap included).
    pub agent: AgentSpec,
    /// The working directory at creation: its staged archive's digest and the FileSets' versions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workdir: Option<WorkdirSnapshot>,
    /// The environment at creation: Secrets by name and version, never their values.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub environment: Option<EnvironmentSnapshot>,
    /// The post-run action chosen at creation, with its config (absent for `agents.noop`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub post_run_action: Option<PostRunAction>,
    /// The image the run's sandbox runs, pinned at creation: its `spec.image`, or the
    /// server's default image, resolved by the sandbox backend to its content digest
    /// (`name@sha256:…` or `sha256:…`), so that moving the tag later does not change what the
    /// run runs. Absent where the backend runs no images, and in runs created before images
    /// were pinned (they run `spec.image` as it resolves when their sandbox is made).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_digest: Option<String>,
}

/// The working directory a run resolved when it was created; the archive itself is kept
/// beside the run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct WorkdirSnapshot {
    /// SHA-256 (hex) of the staged tar archive.
    pub sha256: String,
    /// Its size in bytes.
    pub bytes: u64,
    /// Each FileSet it was read from, with its version then.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub file_sets: Vec<FileSetVersion>,
}

/// A FileSet a run's working directory was read from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct FileSetVersion {
    /// The FileSet's name.
    pub name: String,
    /// Its resourceVersion when the run was created.
    pub resource_version: String,
}

/// The AgentEnvironment a run resolved when it was created.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct EnvironmentSnapshot {
    /// The stored environment's `project/name`; absent when it was written inline.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub environment_ref: Option<String>,
    /// The stored environment's resourceVersion at creation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub environment_revision: Option<String>,
    /// Its spec at creation (a Secret's key by reference, not its value).
    pub spec: AgentEnvironmentSpec,
    /// The resourceVersion of each Secret it reads, at creation.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub secrets: Vec<SecretVersion>,
}

/// A Secret a run reads, by name and version.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct SecretVersion {
    /// The Secret's name in the run's project.
    pub name: String,
    /// Its resourceVersion when the run was created.
    pub resource_version: String,
}

/// `status.egress` of a run: how many connections were allowed and refused, and the bytes
/// that went each way, over every connection its sandbox asked for (those whose records the
/// journal no longer keeps included: [`crate::egress_log`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct EgressCounts {
    /// Connections allowed (those cut off at the run's byte limit count as refused).
    pub allowed: u64,
    /// Connections refused.
    pub refused: u64,
    /// Bytes from the sandbox onward.
    #[serde(default)]
    pub bytes_out: u64,
    /// Bytes back to the sandbox.
    #[serde(default)]
    pub bytes_in: u64,
}

#[cfg(test)]
mod tests {
    use super::AgentRunStatus;
    use crate::lifecycle::{CancelReason, FailReason, PendingReason, RunPhase, WaitReason};

    #[test]
    fn a_step_without_an_outcome_is_under_way_only_while_the_run_goes() {
        let table = [
            (None, false),
            (Some(RunPhase::Pending(PendingReason::Queued)), false),
            (Some(RunPhase::Running), false),
            (Some(RunPhase::Waiting(WaitReason::AwaitingMessage)), false),
            (Some(RunPhase::NeedsResolution), true),
            (Some(RunPhase::Succeeded), true),
            (Some(RunPhase::Failed(FailReason::DeadlineExceeded)), true),
            (
                Some(RunPhase::Cancelled(CancelReason::CancelRequested)),
                true,
            ),
        ];
        for (phase, interrupted) in table {
            let status = AgentRunStatus {
                phase,
                ..AgentRunStatus::default()
            };
            assert_eq!(status.steps_interrupted(), interrupted, "{phase:?}");
        }
    }

    #[test]
    fn a_run_takes_messages_until_it_is_ending_or_finished() {
        let ending = Some(RunPhase::Succeeded);
        // (phase, ending) -> the phase a message is refused with.
        let table: [(Option<RunPhase>, Option<RunPhase>, Option<RunPhase>); 8] = [
            (None, None, None),
            (Some(RunPhase::Pending(PendingReason::Queued)), None, None),
            (Some(RunPhase::Running), None, None),
            (
                Some(RunPhase::Waiting(WaitReason::AwaitingMessage)),
                None,
                None,
            ),
            (Some(RunPhase::Running), ending, ending),
            (Some(RunPhase::Succeeded), None, Some(RunPhase::Succeeded)),
            (
                Some(RunPhase::Failed(FailReason::DeadlineExceeded)),
                None,
                Some(RunPhase::Failed(FailReason::DeadlineExceeded)),
            ),
            (
                Some(RunPhase::Cancelled(CancelReason::CancelRequested)),
                None,
                Some(RunPhase::Cancelled(CancelReason::CancelRequested)),
            ),
        ];
        for (phase, ending, refused) in table {
            let status = AgentRunStatus {
                phase,
                ending,
                ..AgentRunStatus::default()
            };
            assert_eq!(
                status.refuses_messages(),
                refused,
                "{phase:?} ending {ending:?}"
            );
            assert_eq!(status.takes_messages(), refused.is_none(), "{phase:?}");
            assert_eq!(
                status.is_finished(),
                phase.is_some_and(RunPhase::is_finished),
                "{phase:?}"
            );
        }
    }
}

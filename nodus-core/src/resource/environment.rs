//! The Environment resource: a versioned set of evaluation tasks and the grader that scores
//! them (`project/name@version`; a written version never changes).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::DurationSpec;

/// `spec` of an Environment.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EnvironmentSpec {
    /// Semantic version (`1.0.0`); with the name, the key of the Environment.
    pub version: String,
    /// The image of the agent's and the grader's sandboxes (container backends); empty for
    /// the server's default.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub image: String,
    /// Named splits (`train`, `test`).
    pub splits: BTreeMap<String, SplitSpec>,
    /// How an answer is scored.
    pub grader: GraderSpec,
    /// Where the agents' sandboxes may connect (an AgentEnvironment's `spec.network`): given
    /// to every run of an evaluation of this Environment, in place of its agent
    /// environment's, and never to the grader, whose sandbox has no network at all. The
    /// default (`egress: none`) leaves the agent's environment as it is.
    #[serde(default, skip_serializing_if = "super::NetworkSpec::is_default")]
    pub network: super::NetworkSpec,
}

/// One split: a list of tasks, or (built-in Environments only) a seeded generator.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SplitSpec {
    /// The tasks.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tasks: Vec<TaskSpec>,
    /// Generates tasks from the evaluation's seed instead (built-ins only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generator: Option<GeneratorSpec>,
}

/// One task.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TaskSpec {
    /// Unique in its split.
    pub id: String,
    /// The only part of a task that reaches the agent.
    pub prompt: String,
    /// Data only the grader sees (`expected`, `pattern`, test cases); reading the
    /// Environment shows it only to admins of its project.
    #[serde(default, skip_serializing_if = "serde_json::Value::is_null")]
    pub hidden: serde_json::Value,
    /// Files the run's working directory starts with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub files: Option<FilesRef>,
    /// The `spec.timeout` of the task's runs (the agent's time, as a Harbor task's
    /// `agent.timeout_sec`); by default a run's own default. The evaluation's deadline
    /// bounds it still.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<DurationSpec>,
}

/// A FileSet of the Environment's project.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FilesRef {
    /// The FileSet's name.
    pub file_set: String,
}

/// A seeded generator of tasks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GeneratorSpec {
    /// Which generator: `arithmetic`.
    pub kind: String,
}

/// The kinds of grader.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub enum GraderKind {
    /// The trimmed answer equals `hidden.expected`.
    Exact,
    /// The last number in the answer is within `tolerance` of `hidden.expected`.
    Numeric,
    /// The answer matches the regular expression `hidden.pattern`.
    Regex,
    /// A command in a fresh sandbox of its own prints the verdict.
    Command,
}

/// `spec.grader`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GraderSpec {
    /// Which grader.
    pub kind: GraderKind,
    /// `numeric`: the largest absolute difference that passes (default 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tolerance: Option<f64>,
    /// `command`: the shell command line that prints the verdict.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
    /// `command`: the grader's own files, staged at `grader/`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub files: Option<FilesRef>,
    /// `command`: how long the command may take (default 5 minutes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<DurationSpec>,
    /// `command`: where the verdict comes from (default `stdout`).
    #[serde(default, skip_serializing_if = "VerdictFrom::is_stdout")]
    pub verdict_from: VerdictFrom,
}

/// Where a `command` grader's verdict comes from.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub enum VerdictFrom {
    /// The last non-empty line the command prints: `{"reward": 0..1, "passed": bool,
    /// "evidence": "..."}`; a command that exits with another status than 0 failed.
    #[default]
    Stdout,
    /// Harbor's reward files, as Harbor's verifier reads them: `/logs/verifier/reward.json`
    /// (an object of named numbers, or one number), else `/logs/verifier/reward.txt` (one
    /// number). The reward is `reward` (or the only one), between 0 and 1; full marks pass.
    /// The command's exit status is not looked at (Harbor's is not).
    HarborReward,
}

impl VerdictFrom {
    /// Whether this is the default, [`VerdictFrom::Stdout`].
    pub fn is_stdout(&self) -> bool {
        *self == VerdictFrom::Stdout
    }
}

/// `status` of an Environment (none yet: it is data).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct EnvironmentStatus {}

//! The evaluation types an AgentGroup's spec and status hold: the reducer it names and the
//! summary its status keeps. What they mean and how they are computed is
//! [`crate::evaluation`]'s (which re-exports them).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// How a task's rewards over its scored repetitions become one (`spec.evaluation.reducer`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub enum Reducer {
    /// Their mean (the default).
    #[default]
    Mean,
    /// The highest.
    Max,
    /// The most frequent; of equally frequent ones, the lowest.
    Mode,
}

/// One task's line of `status.evaluation.perTask`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct TaskSummary {
    /// The task's id.
    pub task_id: String,
    /// Its cases: one per repetition (a retried case is still one).
    pub attempts: u32,
    /// Those scored.
    pub scored: u32,
    /// Those passed.
    pub passes: u32,
    /// pass@k for k = 1 up to the scored cases (the unbiased estimator), keyed by k.
    #[serde(default)]
    pub pass_at_k: BTreeMap<u32, f64>,
    /// Its scored rewards reduced by `spec.evaluation.reducer`; absent while none is scored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reward: Option<f64>,
}

/// Why a case ended without a score.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
pub enum UnscoredReason {
    /// The run failed.
    RunFailed,
    /// The run succeeded without an answer.
    NoAnswer,
    /// The run reached its cost cap.
    LimitReached,
    /// The grader crashed, timed out or printed no verdict.
    GraderFailed,
    /// The evaluation's deadline came first.
    EvaluationTimeout,
    /// The run or the group was cancelled.
    Cancelled,
}

/// `status.evaluation` of an evaluation group.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct EvaluationStatus {
    /// Cases in the batch (tasks × repetitions).
    pub cases: u32,
    /// Cases without their terminal state yet.
    pub pending: u32,
    /// Cases graded.
    pub scored: u32,
    /// Cases ended without a score, by reason.
    #[serde(default)]
    pub unscored: BTreeMap<UnscoredReason, u32>,
    /// Passed ÷ scored; absent while nothing is scored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pass_rate: Option<f64>,
    /// Mean reward of the scored cases; absent while nothing is scored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mean_reward: Option<f64>,
    /// The number of scored cases the rates are over.
    pub n: u32,
    /// The pass rate if every case without a score had failed (`low`) or passed (`high`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bracket: Option<Range>,
    /// The 95 % Wilson interval of the pass rate; absent while nothing is scored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interval: Option<Range>,
    /// Each task over its repetitions, in batch order: cases, scored, passes, pass@k and its
    /// reduced reward.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub per_task: Vec<TaskSummary>,
    /// For each k, the mean pass@k of the tasks with at least k scored cases.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub pass_at_k: BTreeMap<u32, f64>,
    /// The mean over tasks of each task's reduced reward (`spec.evaluation.reducer`); absent
    /// while nothing is scored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task_reward: Option<f64>,
}

/// A range of fractions.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
pub struct Range {
    /// The lower end.
    pub low: f64,
    /// The upper end.
    pub high: f64,
}

//! The AgentGroup resource: many runs of one agent under shared limits.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{DurationSpec, GroupPhase};
use crate::money::Usd;

/// `spec` of an AgentGroup.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AgentGroupSpec {
    /// The agent every run of the group uses.
    pub agent: String,
    /// Concurrency and intake limits.
    #[serde(default)]
    pub limits: GroupLimits,
    /// One cap for the whole group's model spend.
    #[serde(
        rename = "maxCostUSD",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub max_cost_usd: Option<Usd>,
    /// No more runs are coming; cannot be undone.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub sealed: bool,
    /// Makes this an evaluation group.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub evaluation: Option<EvaluationSpec>,
}

/// `spec.limits`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GroupLimits {
    /// Runs that may be started and unfinished at once (1–1000).
    #[serde(default = "GroupLimits::default_max_active")]
    pub max_active: u32,
    /// Unfinished runs the group takes in.
    #[serde(default = "GroupLimits::default_max_pending")]
    pub max_pending: u32,
}

impl GroupLimits {
    /// Default `maxActive`.
    pub const DEFAULT_MAX_ACTIVE: u32 = 10;
    /// Default `maxPending`.
    pub const DEFAULT_MAX_PENDING: u32 = 10_000;
    /// Allowed `maxActive`.
    pub const MAX_ACTIVE_RANGE: std::ops::RangeInclusive<u32> = 1..=1000;

    fn default_max_active() -> u32 {
        Self::DEFAULT_MAX_ACTIVE
    }
    fn default_max_pending() -> u32 {
        Self::DEFAULT_MAX_PENDING
    }
}

impl Default for GroupLimits {
    fn default() -> Self {
        GroupLimits {
            max_active: Self::DEFAULT_MAX_ACTIVE,
            max_pending: Self::DEFAULT_MAX_PENDING,
        }
    }
}

/// `spec.evaluation`: a versioned task set the group runs and grades.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EvaluationSpec {
    /// `project/name@version` of the Environment.
    pub environment: String,
    /// The split, such as `test`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub split: Option<String>,
    /// Number of tasks.
    pub tasks: u32,
    /// Repetitions of each task.
    #[serde(default = "EvaluationSpec::default_repetitions")]
    pub repetitions: u32,
    /// Seed for the task selection.
    #[serde(default)]
    pub seed: u64,
    /// Absolute deadline from group creation (1 minute to 24 hours, default 30 minutes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<DurationSpec>,
    /// How a task's rewards over its repetitions become one: `mean` (default), `max` or
    /// `mode` (`status.evaluation.perTask[].reward`, `taskReward`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reducer: Option<super::Reducer>,
    /// A rescore: the finished evaluation group whose kept answers and final working
    /// directories this group grades again with its Environment version's grader (no model
    /// call, no agent sandbox).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rescore_of: Option<String>,
}

impl EvaluationSpec {
    fn default_repetitions() -> u32 {
        1
    }
}

/// `status` of an AgentGroup.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct AgentGroupStatus {
    /// `phase` and `reason`.
    #[serde(flatten, default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<GroupPhase>,
    /// Runs by state.
    #[serde(default)]
    pub counts: GroupCounts,
    /// Why queued runs have not started, and how many wait for each reason.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub blocked_reasons: BTreeMap<BlockedReason, u32>,
    /// Spend so far and the cap.
    #[serde(default)]
    pub cost: super::CostStatus,
    /// An evaluation group's cases and scores, computed from its cases.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub evaluation: Option<super::EvaluationStatus>,
}

/// `status.counts`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct GroupCounts {
    /// Not started yet.
    pub queued: u32,
    /// Started and working: the runs that take `maxActive` slots.
    pub active: u32,
    /// Started and waiting for a message or for funds (or at its cap); holds no slot.
    pub waiting: u32,
    /// Parked in `NeedsResolution` until a person resolves it; holds no slot.
    #[serde(default)]
    pub parked: u32,
    /// Finished successfully.
    pub succeeded: u32,
    /// Failed.
    pub failed: u32,
    /// Cancelled.
    pub cancelled: u32,
}

/// Why a queued run has not started.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
pub enum BlockedReason {
    /// A dependency has not succeeded yet.
    DependencyWait,
    /// `maxActive` runs are already going.
    MaxActiveReached,
    /// The run's cap does not fit under what is left of the group's cap.
    MaxCostReached,
}

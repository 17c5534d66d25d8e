//! Kubernetes-shaped resources: `apiVersion`, `kind`, `metadata`, `spec`, `status`.
//!
//! Specs are what users write and reject unknown fields; statuses are what Nodus observed.
//! Field names are spelled exactly as in the spec's YAML (camelCase).

mod agent;
mod agent_environment;
mod budget;
mod duration;
mod environment;
mod evaluation;
mod fileset;
mod group;
mod group_phase;
mod meta;
mod registry;
mod run;
mod secret;

pub use agent::{Access, AgentSpec, AgentState, AgentStatus, ModelAccess};
pub use agent_environment::{
    AgentEnvironmentSpec, AgentEnvironmentStatus, AllowEntry, Compute, EgressMode, EnvVar,
    EnvVarSource, InjectEntry, NameOrInline, NetworkSpec, Quantity, SecretKeyRef,
};
pub use budget::{BudgetSpec, BudgetStatus};
pub use duration::{DurationSpec, ParseDurationError};
pub use environment::{
    EnvironmentSpec, EnvironmentStatus, FilesRef, GeneratorSpec, GraderKind, GraderSpec, SplitSpec,
    TaskSpec, VerdictFrom,
};
pub use evaluation::{EvaluationStatus, Range, Reducer, TaskSummary, UnscoredReason};
pub use fileset::{FileEntry, FileSetSpec, FileSetStatus};
pub use group::{
    AgentGroupSpec, AgentGroupStatus, BlockedReason, EvaluationSpec, GroupCounts, GroupLimits,
};
pub use group_phase::GroupPhase;
#[cfg(feature = "openapi")]
pub use meta::DateTime;
pub use meta::{API_VERSION, Kind, ObjectMeta, TEMPLATE_PROJECT};
pub use registry::{KeptIn, KindInfo, WrittenBy};
pub use run::{
    AgentRunSpec, AgentRunStatus, AnswerStatus, ArtifactMount, ChosenBy, CostStatus, EgressCounts,
    EnvironmentSnapshot, FileSetVersion, ForkOf, PostRunAction, RunSnapshot, SandboxStatus,
    SecretVersion, TurnStatus, WorkdirSnapshot, WorkdirSpec,
};
pub use secret::Secret;
pub(crate) use secret::SecretDocument;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

/// What ties a spec type to its kind and status type.
pub trait Spec:
    Serialize + DeserializeOwned + Clone + std::fmt::Debug + Send + Sync + 'static
{
    /// The `kind` written in documents of this spec.
    const KIND: Kind;
    /// The status that Nodus writes for this kind.
    type Status: Serialize
        + DeserializeOwned
        + Clone
        + std::fmt::Debug
        + Default
        + PartialEq
        + Send
        + Sync
        + 'static;
}

/// One resource document: `apiVersion`, `kind`, `metadata`, `spec`, `status`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[serde(bound(serialize = "S: Spec", deserialize = "S: Spec"))]
pub struct Object<S: Spec> {
    /// Always `nodus.dev/v1`.
    pub api_version: String,
    /// The kind; must match the spec type.
    pub kind: Kind,
    /// Name, project, labels and the fields the store keeps.
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// What the user asked for.
    pub spec: S,
    /// What Nodus observed.
    #[serde(default)]
    pub status: S::Status,
}

impl<S: Spec> Object<S> {
    /// A new document of this kind with an empty status.
    pub fn new(name: impl Into<String>, spec: S) -> Self {
        Object {
            api_version: API_VERSION.to_string(),
            kind: S::KIND,
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..ObjectMeta::default()
            },
            spec,
            status: S::Status::default(),
        }
    }

    /// The name, or `""` when the document has none yet.
    pub fn name(&self) -> &str {
        self.metadata.name.as_deref().unwrap_or_default()
    }
}

/// An Agent: a system prompt, model access and a cost cap.
pub type Agent = Object<AgentSpec>;
/// An AgentRun: one conversation with an agent in its own sandbox.
pub type AgentRun = Object<AgentRunSpec>;
/// An AgentEnvironment: environment variables, Secrets bound to them, and compute.
pub type AgentEnvironment = Object<AgentEnvironmentSpec>;
/// An AgentGroup: many runs of one agent under concurrency, dependency and cost limits.
pub type AgentGroup = Object<AgentGroupSpec>;
/// An Environment: a versioned set of evaluation tasks and their grader.
pub type Environment = Object<EnvironmentSpec>;
/// A FileSet: stored files that working directories are staged from.
pub type FileSet = Object<FileSetSpec>;
/// A Budget: a cap on a project's total spend.
pub type Budget = Object<BudgetSpec>;

impl Spec for BudgetSpec {
    const KIND: Kind = Kind::Budget;
    type Status = BudgetStatus;
}

impl Spec for AgentSpec {
    const KIND: Kind = Kind::Agent;
    type Status = AgentStatus;
}

impl Spec for AgentRunSpec {
    const KIND: Kind = Kind::AgentRun;
    type Status = AgentRunStatus;
}

impl Spec for FileSetSpec {
    const KIND: Kind = Kind::FileSet;
    type Status = FileSetStatus;
}

impl Spec for AgentEnvironmentSpec {
    const KIND: Kind = Kind::AgentEnvironment;
    type Status = AgentEnvironmentStatus;
}

impl Spec for AgentGroupSpec {
    const KIND: Kind = Kind::AgentGroup;
    type Status = AgentGroupStatus;
}

impl Spec for EnvironmentSpec {
    const KIND: Kind = Kind::Environment;
    type Status = EnvironmentStatus;
}

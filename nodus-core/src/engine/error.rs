//! The engine's error: what went wrong, with a stable machine-readable reason.

use crate::group::{AdmissionRefused, UpdateRefused};
use crate::lifecycle::{RunPhase, TransitionRefused};
use crate::resource::Kind;
use crate::store;
use crate::validate::Invalid;

/// Errors of the engine's operations.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Error {
    /// The request is invalid; nothing was written.
    #[error(transparent)]
    Invalid(#[from] Invalid),
    /// No such resource.
    #[error("{kind} {name:?} not found")]
    NotFound {
        /// The kind.
        kind: Kind,
        /// The name.
        name: String,
    },
    /// The agent is stopped and takes no new runs.
    #[error("agent {agent:?} is stopped (spec.state: Stopped) and takes no new runs")]
    AgentStopped {
        /// The agent.
        agent: String,
    },
    /// The run has finished and takes no messages or resolutions.
    #[error("run {run:?} has already finished ({phase})")]
    AgentRunFinished {
        /// The run.
        run: String,
        /// Its final phase.
        phase: RunPhase,
    },
    /// The run is not parked on an uncertain step.
    #[error("run {run:?} is {phase}, not NeedsResolution: there is nothing to resolve")]
    NotParked {
        /// The run.
        run: String,
        /// Its phase.
        phase: RunPhase,
    },
    /// The run's cancellation is recorded, but it did not end in time (its runner is busy, or
    /// none runs); it cannot be deleted before it has.
    #[error(
        "run {run:?} is being cancelled but has not ended yet (its sandbox is still being \
         deleted, or no runner is working it): delete it again once it has ended"
    )]
    RunBusy {
        /// The run.
        run: String,
    },
    /// The group does not take this run.
    #[error(transparent)]
    Admission(#[from] AdmissionRefused),
    /// The group's spec cannot change this way.
    #[error(transparent)]
    GroupUpdate(#[from] UpdateRefused),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] store::Error),
    /// A stored document cannot be read as its kind.
    #[error("stored {key} cannot be read: {message}")]
    Corrupt {
        /// The document.
        key: String,
        /// Why.
        message: String,
    },
    /// A bug: the engine tried a move the run lifecycle forbids.
    #[error("internal error: {0}")]
    Lifecycle(#[from] TransitionRefused),
}

impl Error {
    /// The stable reason an API shows (`Invalid`, `NotFound`, `AgentStopped`,
    /// `AgentRunFinished`, `Conflict`, …).
    pub fn reason(&self) -> &'static str {
        match self {
            Error::Invalid(_) => "Invalid",
            Error::NotFound { .. } | Error::Store(store::Error::NotFound(_)) => "NotFound",
            Error::AgentStopped { .. } => "AgentStopped",
            Error::AgentRunFinished { .. } => "AgentRunFinished",
            Error::NotParked { .. } | Error::RunBusy { .. } => "Conflict",
            Error::Admission(AdmissionRefused::UnknownDependency(_))
            | Error::Admission(AdmissionRefused::AgentMismatch { .. }) => "Invalid",
            Error::Admission(_) | Error::GroupUpdate(_) => "Conflict",
            Error::Store(store::Error::AlreadyExists(_)) => "AlreadyExists",
            Error::Store(store::Error::Conflict { .. }) => "Conflict",
            Error::Store(store::Error::Unavailable(_)) => "Unavailable",
            Error::Store(_) | Error::Corrupt { .. } | Error::Lifecycle(_) => "InternalError",
        }
    }

    /// Whether trying again may help.
    pub fn is_retryable(&self) -> bool {
        matches!(self, Error::Store(e) if e.is_retryable())
    }
}

/// The engine's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

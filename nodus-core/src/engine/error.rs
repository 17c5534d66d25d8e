//! The engine's error: what went wrong, with a stable machine-readable reason.

use crate::group::{AdmissionRefused, UpdateRefused};
use crate::lifecycle::{RunPhase, TransitionRefused};
use crate::resource::Kind;
use crate::store;
use crate::validate::Invalid;

/// Errors of the engine's operations.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
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
    /// The run has no result of that name, and why.
    #[error("run {run:?} has no result {result:?}: {why}")]
    NoSuchResult {
        /// The run.
        run: String,
        /// The result asked for.
        result: String,
        /// Why it has none.
        why: String,
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
    /// A Secret's values could not be sealed or opened.
    #[error("{0}")]
    Sealing(#[from] crate::secret::SealError),
    /// The sandbox backend could not answer for now (a container engine restarting), so
    /// nothing was written; a retry may help.
    #[error("{0}")]
    SandboxUnavailable(String),
    /// A bug: the engine tried a move the run lifecycle forbids.
    #[error("internal error: {0}")]
    Lifecycle(#[from] TransitionRefused),
}

impl Error {
    /// The stable reason an API shows ([`Reason::Invalid`], [`Reason::NotFound`],
    /// [`Reason::AgentStopped`], [`Reason::Conflict`], …).
    pub fn reason(&self) -> Reason {
        match self {
            Error::Invalid(_) => Reason::Invalid,
            Error::NotFound { .. }
            | Error::NoSuchResult { .. }
            | Error::Store(store::Error::NotFound(_)) => Reason::NotFound,
            Error::AgentStopped { .. } => Reason::AgentStopped,
            Error::AgentRunFinished { .. } => Reason::AgentRunFinished,
            Error::NotParked { .. } | Error::RunBusy { .. } => Reason::Conflict,
            Error::Admission(AdmissionRefused::UnknownDependency(_))
            | Error::Admission(AdmissionRefused::AgentMismatch { .. }) => Reason::Invalid,
            Error::Admission(_) | Error::GroupUpdate(_) => Reason::Conflict,
            Error::Store(store::Error::AlreadyExists(_)) => Reason::AlreadyExists,
            Error::Store(
                store::Error::Conflict { .. }
                | store::Error::OverCap { .. }
                | store::Error::GroupClosed { .. },
            ) => Reason::Conflict,
            Error::Store(store::Error::Unavailable(_)) | Error::SandboxUnavailable(_) => {
                Reason::Unavailable
            }
            Error::Store(_) | Error::Corrupt { .. } | Error::Lifecycle(_) | Error::Sealing(_) => {
                Reason::InternalError
            }
        }
    }

    /// Whether trying again may help.
    pub fn is_retryable(&self) -> bool {
        matches!(self, Error::Store(e) if e.is_retryable())
            || matches!(self, Error::SandboxUnavailable(_))
    }

    /// Whether the write was refused only because the object changed since it was read (a
    /// stale `resourceVersion`): the same change applied to the object as it is now may pass.
    pub fn is_stale_version(&self) -> bool {
        matches!(self, Error::Store(store::Error::Conflict { .. }))
    }
}

/// The stable, machine-readable reason of a refusal, as the API writes it (`"reason":
/// "Conflict"`) and clients read it back. Decisions are made on it, never on a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
pub enum Reason {
    /// The request breaks a rule; nothing was written.
    Invalid,
    /// No such object (or path).
    NotFound,
    /// An object of that name exists.
    AlreadyExists,
    /// The object changed meanwhile, or is in a state that refuses this change.
    Conflict,
    /// The agent takes no new runs.
    AgentStopped,
    /// The run has finished.
    AgentRunFinished,
    /// A run's final working directory was not kept.
    WorkdirNotKept,
    /// The path does not take that method.
    MethodNotAllowed,
    /// No valid credentials.
    Unauthorized,
    /// The credentials do not allow this.
    Forbidden,
    /// A backend is unavailable for now (a retry may help).
    Unavailable,
    /// The caller holds as many open streams or request bodies as it may (a retry after one
    /// ends may help).
    TooManyRequests,
    /// A failure of the server itself.
    InternalError,
}

impl Reason {
    /// Every reason, in declaration order.
    pub const ALL: [Reason; 13] = [
        Reason::Invalid,
        Reason::NotFound,
        Reason::AlreadyExists,
        Reason::Conflict,
        Reason::AgentStopped,
        Reason::AgentRunFinished,
        Reason::WorkdirNotKept,
        Reason::MethodNotAllowed,
        Reason::Unauthorized,
        Reason::Forbidden,
        Reason::Unavailable,
        Reason::TooManyRequests,
        Reason::InternalError,
    ];

    /// The reason as written on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Invalid => "Invalid",
            Reason::NotFound => "NotFound",
            Reason::AlreadyExists => "AlreadyExists",
            Reason::Conflict => "Conflict",
            Reason::AgentStopped => "AgentStopped",
            Reason::AgentRunFinished => "AgentRunFinished",
            Reason::WorkdirNotKept => "WorkdirNotKept",
            Reason::MethodNotAllowed => "MethodNotAllowed",
            Reason::Unauthorized => "Unauthorized",
            Reason::Forbidden => "Forbidden",
            Reason::Unavailable => "Unavailable",
            Reason::TooManyRequests => "TooManyRequests",
            Reason::InternalError => "InternalError",
        }
    }

    /// The reason written as `text`, if it is one.
    pub fn parse(text: &str) -> Option<Reason> {
        Reason::ALL.into_iter().find(|r| r.as_str() == text)
    }
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl PartialEq<str> for Reason {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<&str> for Reason {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

/// The engine's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_reason_reads_back_as_the_api_writes_it() {
        for reason in Reason::ALL {
            let wire = serde_json::to_value(reason).expect("serializes");
            assert_eq!(wire, serde_json::Value::from(reason.as_str()), "{reason}");
            assert_eq!(Reason::parse(reason.as_str()), Some(reason));
            assert_eq!(
                serde_json::from_value::<Reason>(wire).expect("reads back"),
                reason
            );
        }
        assert_eq!(Reason::parse("conflict"), None, "exact, case included");
        assert_eq!(Reason::Conflict, "Conflict");
    }
}

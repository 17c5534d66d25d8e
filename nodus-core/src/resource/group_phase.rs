//! A group's phase with its reason (`status.phase` of an AgentGroup), as written and read.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A group's phase, with its reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GroupPhase {
    /// Taking runs, or some have not finished.
    Running,
    /// Cancelled by a person; unfinished runs are being cancelled.
    Cancelling,
    /// Sealed and every run finished without a failure.
    Succeeded,
    /// Sealed and every run finished; a run failed or was cancelled because a dependency failed.
    FailedRunsFailed,
    /// Cancelled, and every run has finished.
    Cancelled,
}

impl GroupPhase {
    /// Whether the group has finished.
    pub fn is_finished(self) -> bool {
        matches!(
            self,
            GroupPhase::Succeeded | GroupPhase::FailedRunsFailed | GroupPhase::Cancelled
        )
    }

    /// The `phase` string.
    pub fn name(self) -> &'static str {
        match self {
            GroupPhase::Running => "Running",
            GroupPhase::Cancelling => "Cancelling",
            GroupPhase::Succeeded => "Succeeded",
            GroupPhase::FailedRunsFailed => "Failed",
            GroupPhase::Cancelled => "Cancelled",
        }
    }

    /// The `reason` string, when the phase has one.
    pub fn reason(self) -> Option<&'static str> {
        match self {
            GroupPhase::FailedRunsFailed => Some("RunsFailed"),
            _ => None,
        }
    }

    pub(crate) const ALL: [GroupPhase; 5] = [
        GroupPhase::Running,
        GroupPhase::Cancelling,
        GroupPhase::Succeeded,
        GroupPhase::FailedRunsFailed,
        GroupPhase::Cancelled,
    ];
}

impl fmt::Display for GroupPhase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[derive(Serialize, Deserialize)]
struct GroupPhaseRepr {
    phase: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    reason: Option<String>,
}

impl Serialize for GroupPhase {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        GroupPhaseRepr {
            phase: self.name().to_string(),
            reason: self.reason().map(str::to_string),
        }
        .serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for GroupPhase {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let repr = GroupPhaseRepr::deserialize(deserializer)?;
        GroupPhase::ALL
            .into_iter()
            .find(|p| p.name() == repr.phase && p.reason() == repr.reason.as_deref())
            .ok_or_else(|| {
                serde::de::Error::custom(format!("unknown group phase {:?}", repr.phase))
            })
    }
}

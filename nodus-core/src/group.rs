//! The group controller: admission, dependencies, sealing, phase, counts and blocked reasons.
//!
//! [`reconcile`] is a pure function from a group and its members to what should happen
//! next (which queued runs start, which are cancelled, why the others wait) and the group's
//! status. [`admit`] decides whether a new run may join a group; [`check_update`] whether
//! a change to a live group's spec is allowed.
//!
//! The cost rule: a run starts only while its cap fits under
//! `maxCostUSD − spent by finished runs − caps of started, unfinished runs`. A started run
//! cannot spend more than its cap, so no order of completions can spend more than the
//! group's cap.

use std::collections::HashMap;
use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::lifecycle::{CancelReason, PendingReason, RunPhase};
use crate::money::Usd;
use crate::resource::{AgentGroupSpec, AgentGroupStatus, BlockedReason, CostStatus, GroupCounts};

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

    const ALL: [GroupPhase; 5] = [
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

/// One run of a group, as the controller sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    /// The run's task key, unique in the group.
    pub task_key: String,
    /// Task keys that must succeed first.
    pub depends_on: Vec<String>,
    /// The run's own cap (its agent's `perRunMaxCostUSD` at creation).
    pub cap: Usd,
    /// What the run has spent so far (never more than `cap`).
    pub spent: Usd,
    /// The run's phase.
    pub phase: RunPhase,
}

/// What the controller decided for one reconcile pass.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Plan {
    /// Indexes of queued members to start now, in order.
    pub start: Vec<usize>,
    /// Members to cancel, with the reason.
    pub cancel: Vec<(usize, CancelReason)>,
    /// Queued members that stay queued, with their new pending reason.
    pub queue: Vec<(usize, PendingReason)>,
    /// The group's status after the plan is carried out.
    pub status: AgentGroupStatus,
}

/// Decide what happens next in a group. `phase` is the group's current phase (`None` for a
/// new group); members are in creation order, which is also the order queued runs start in.
pub fn reconcile(spec: &AgentGroupSpec, phase: Option<GroupPhase>, members: &[Member]) -> Plan {
    let mut plan = Plan::default();
    let cancelling = matches!(
        phase,
        Some(GroupPhase::Cancelling | GroupPhase::Cancelled)
    );
    // Phases as they will be once the plan is carried out, so that a cancellation cascades
    // through a chain of dependents in one pass (dependencies come earlier in the order).
    let mut phases: Vec<RunPhase> = members.iter().map(|m| m.phase).collect();
    let index: HashMap<&str, usize> = members
        .iter()
        .enumerate()
        .map(|(i, m)| (m.task_key.as_str(), i))
        .collect();

    let mut active = phases.iter().filter(|p| p.is_started()).count();
    let max_active = usize::try_from(spec.limits.max_active).unwrap_or(usize::MAX);
    let spent_finished: Usd = members
        .iter()
        .filter(|m| m.phase.is_finished())
        .map(|m| m.spent)
        .sum();
    let mut held: Usd = members
        .iter()
        .filter(|m| m.phase.is_started())
        .map(|m| m.cap.max(m.spent))
        .sum();

    for (i, member) in members.iter().enumerate() {
        if !matches!(phases[i], RunPhase::Pending(_)) {
            continue;
        }
        if cancelling {
            phases[i] = RunPhase::Cancelled(CancelReason::GroupCancelled);
            plan.cancel.push((i, CancelReason::GroupCancelled));
            continue;
        }
        let mut waiting_for_dependency = false;
        let mut cancel_reason = None;
        for key in &member.depends_on {
            match index.get(key.as_str()).map(|&d| phases[d]) {
                Some(RunPhase::Succeeded) => {}
                Some(RunPhase::Failed(_)) => {
                    cancel_reason = Some(CancelReason::DependencyFailed);
                    break;
                }
                Some(RunPhase::Cancelled(_)) => {
                    cancel_reason.get_or_insert(CancelReason::DependencyCancelled);
                }
                // An unknown key cannot happen for admitted runs; waiting is the safe answer.
                _ => waiting_for_dependency = true,
            }
        }
        if let Some(reason) = cancel_reason {
            phases[i] = RunPhase::Cancelled(reason);
            plan.cancel.push((i, reason));
            continue;
        }
        if waiting_for_dependency {
            plan.queue.push((i, PendingReason::DependencyWait));
            *plan
                .status
                .blocked_reasons
                .entry(BlockedReason::DependencyWait)
                .or_default() += 1;
            continue;
        }
        if active >= max_active {
            plan.queue.push((i, PendingReason::GroupWait));
            *plan
                .status
                .blocked_reasons
                .entry(BlockedReason::MaxActiveReached)
                .or_default() += 1;
            continue;
        }
        let fits = match spec.max_cost_usd {
            None => true,
            Some(cap) => cap
                .checked_sub(spent_finished)
                .and_then(|left| left.checked_sub(held))
                .is_some_and(|left| member.cap <= left),
        };
        if !fits {
            plan.queue.push((i, PendingReason::GroupWait));
            *plan
                .status
                .blocked_reasons
                .entry(BlockedReason::MaxCostReached)
                .or_default() += 1;
            continue;
        }
        phases[i] = RunPhase::Running;
        active += 1;
        held = held.saturating_add(member.cap);
        plan.start.push(i);
    }

    plan.status.counts = count(&phases);
    plan.status.cost = CostStatus {
        total_usd: members.iter().map(|m| m.spent).sum(),
        limit_usd: spec.max_cost_usd,
    };
    let all_finished = phases.iter().all(|p| p.is_finished());
    plan.status.phase = Some(if cancelling {
        if all_finished {
            GroupPhase::Cancelled
        } else {
            GroupPhase::Cancelling
        }
    } else if spec.sealed && all_finished {
        if phases.iter().copied().any(counts_as_failure) {
            GroupPhase::FailedRunsFailed
        } else {
            GroupPhase::Succeeded
        }
    } else {
        GroupPhase::Running
    });
    plan
}

fn count(phases: &[RunPhase]) -> GroupCounts {
    let mut counts = GroupCounts::default();
    for phase in phases {
        let slot = match phase {
            RunPhase::Pending(_) => &mut counts.queued,
            RunPhase::Running | RunPhase::NeedsResolution => &mut counts.active,
            RunPhase::Waiting(_) => &mut counts.waiting,
            RunPhase::Succeeded => &mut counts.succeeded,
            RunPhase::Failed(_) => &mut counts.failed,
            RunPhase::Cancelled(_) => &mut counts.cancelled,
        };
        *slot += 1;
    }
    counts
}

/// Why a run may not join a group.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AdmissionRefused {
    /// The group is sealed (or finished, or being cancelled).
    #[error("group is sealed and takes no new runs")]
    Sealed,
    /// The group already has `maxPending` unfinished runs.
    #[error("group already has {max_pending} unfinished runs (spec.limits.maxPending)")]
    TooManyPending {
        /// The limit.
        max_pending: u32,
    },
    /// Another run of the group has this task key.
    #[error("spec.taskKey {0:?} is already used in this group")]
    DuplicateTaskKey(String),
    /// A dependency is not in the group.
    #[error("spec.dependsOn names {0:?}, which is not a task of this group; create it first")]
    UnknownDependency(String),
    /// The run names another agent than its group.
    #[error("spec.agent {run:?} must match the group's agent {group:?}")]
    AgentMismatch {
        /// The run's agent.
        run: String,
        /// The group's agent.
        group: String,
    },
}

/// Whether a run of `agent` with `task_key` and `depends_on` may join the group.
pub fn admit(
    spec: &AgentGroupSpec,
    phase: Option<GroupPhase>,
    members: &[Member],
    agent: &str,
    task_key: &str,
    depends_on: &[String],
) -> Result<(), AdmissionRefused> {
    if spec.sealed || phase.is_some_and(|p| p != GroupPhase::Running) {
        return Err(AdmissionRefused::Sealed);
    }
    if agent != spec.agent {
        return Err(AdmissionRefused::AgentMismatch {
            run: agent.to_string(),
            group: spec.agent.clone(),
        });
    }
    if members.iter().any(|m| m.task_key == task_key) {
        return Err(AdmissionRefused::DuplicateTaskKey(task_key.to_string()));
    }
    if let Some(missing) = depends_on
        .iter()
        .find(|key| !members.iter().any(|m| &m.task_key == *key))
    {
        return Err(AdmissionRefused::UnknownDependency(missing.clone()));
    }
    let unfinished = members.iter().filter(|m| !m.phase.is_finished()).count();
    if unfinished >= usize::try_from(spec.limits.max_pending).unwrap_or(usize::MAX) {
        return Err(AdmissionRefused::TooManyPending {
            max_pending: spec.limits.max_pending,
        });
    }
    Ok(())
}

/// Why a change to a group's spec is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UpdateRefused {
    /// `spec.sealed` went from true to false.
    #[error("spec.sealed cannot be undone")]
    Unseal,
    /// `spec.maxCostUSD` was lowered or removed.
    #[error("spec.maxCostUSD can be raised but not lowered (from {from} to {to})")]
    CapLowered {
        /// The old cap.
        from: String,
        /// The new cap.
        to: String,
    },
    /// `spec.agent` changed.
    #[error("spec.agent cannot change once the group exists")]
    AgentChanged,
}

/// Whether `new` may replace `old` on a live group.
pub fn check_update(old: &AgentGroupSpec, new: &AgentGroupSpec) -> Result<(), UpdateRefused> {
    if old.sealed && !new.sealed {
        return Err(UpdateRefused::Unseal);
    }
    if old.agent != new.agent {
        return Err(UpdateRefused::AgentChanged);
    }
    // No cap is an unlimited cap: adding one lowers it.
    let lowered = match (old.max_cost_usd, new.max_cost_usd) {
        (Some(from), Some(to)) => to < from,
        (Some(_), None) => false,
        (None, Some(_)) => true,
        (None, None) => false,
    };
    if lowered {
        let show = |cap: Option<Usd>| cap.map_or_else(|| "no cap".to_string(), |c| c.to_string());
        return Err(UpdateRefused::CapLowered {
            from: show(old.max_cost_usd),
            to: show(new.max_cost_usd),
        });
    }
    Ok(())
}

/// Whether a finished run makes its sealed group fail with `RunsFailed`: it failed, or it
/// was cancelled because a dependency failed.
pub fn counts_as_failure(phase: RunPhase) -> bool {
    matches!(
        phase,
        RunPhase::Failed(_) | RunPhase::Cancelled(CancelReason::DependencyFailed)
    )
}

//! The group controller: admission, dependencies, sealing, phase, counts and blocked reasons.
//!
//! [`reconcile`] is a pure function from a group and its members to what should happen
//! next (which queued runs start, which are cancelled, why the others wait) and the group's
//! status. [`admit`] decides whether a new run may join a group (from its members, or from
//! what [`Membership`] knows of them: [`admit_to`]); [`check_update`] whether a change to a
//! live group's spec is allowed.
//!
//! The concurrency rule: `maxActive` bounds the runs going at the same time, `Running` ones.
//! A run that waits (for a message, for funds, at its cap) or is parked in `NeedsResolution`
//! holds no slot, so runs parked by a crash cannot stall the group; a run that comes back
//! from waiting or parked goes on at once, and no queued run starts until the group is under
//! `maxActive` again.
//!
//! The cost rule: a run starts only while its cap fits under
//! `maxCostUSD − spent by finished runs − caps of started, unfinished runs`. A started run
//! cannot spend more than its cap, so no order of completions can spend more than the
//! group's cap.

use std::collections::HashMap;

use crate::lifecycle::{CancelReason, PendingReason, RunPhase};
use crate::money::Usd;
pub use crate::resource::GroupPhase;
use crate::resource::{AgentGroupSpec, AgentGroupStatus, BlockedReason, CostStatus, GroupCounts};

mod writes;
pub use writes::{MemberWrite, Message, cancelled, flagged_on_cancel};

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
    /// Queued members that can never start as the group's cap stands (their own cap is more
    /// than the group's cap leaves after its finished runs), with what to change; the other
    /// queued members have no such message.
    pub never_fit: Vec<(usize, String)>,
    /// The group's status after the plan is carried out.
    pub status: AgentGroupStatus,
}

/// Decide what happens next in a group. `phase` is the group's current phase (`None` for a
/// new group); members are in creation order, which is also the order queued runs start in.
pub fn reconcile(spec: &AgentGroupSpec, phase: Option<GroupPhase>, members: &[Member]) -> Plan {
    let mut plan = Plan::default();
    let cancelling = matches!(phase, Some(GroupPhase::Cancelling | GroupPhase::Cancelled));
    // Phases as they will be once the plan is carried out, so that a cancellation cascades
    // through a chain of dependents in one pass (dependencies come earlier in the order).
    let mut phases: Vec<RunPhase> = members.iter().map(|m| m.phase).collect();
    let index: HashMap<&str, usize> = members
        .iter()
        .enumerate()
        .map(|(i, m)| (m.task_key.as_str(), i))
        .collect();

    let mut active = phases.iter().filter(|p| holds_a_slot(**p)).count();
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
        // What finished runs spent stays spent, and started runs only add to it: a run whose
        // cap is more than what is left of the group's cap then never starts. Say what to
        // change, whatever it waits for now.
        if let Some(cap) = spec.max_cost_usd
            && cap
                .checked_sub(spent_finished)
                .is_none_or(|left| member.cap > left)
        {
            plan.never_fit
                .push((i, never_fits_message(cap, spent_finished, member.cap)));
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

/// What to change so that a run whose cap is `run_cap` can start under a group cap of
/// `group_cap`, of which finished runs spent `spent`.
fn never_fits_message(group_cap: Usd, spent: Usd, run_cap: Usd) -> String {
    let spent = if spent.is_zero() {
        String::new()
    } else {
        format!(", of which finished runs spent ${spent}")
    };
    format!(
        "this run's cap (${run_cap}) can never fit under its group's cap: raise the group's \
         spec.maxCostUSD (${group_cap}{spent}) or lower the agent's perRunMaxCostUSD \
         (${run_cap}; a run keeps the cap it was created with, so then delete this run and \
         create it again)"
    )
}

/// Whether a run in `phase` takes one of its group's `maxActive` slots: only a working one.
/// A waiting or parked run still holds its cap against the group's cap.
pub fn holds_a_slot(phase: RunPhase) -> bool {
    phase == RunPhase::Running
}

fn count(phases: &[RunPhase]) -> GroupCounts {
    let mut counts = GroupCounts::default();
    for phase in phases {
        let slot = match phase {
            RunPhase::Pending(_) => &mut counts.queued,
            RunPhase::Running => &mut counts.active,
            RunPhase::NeedsResolution => &mut counts.parked,
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

/// What admission needs to know of a group's members, and nothing more: whether a task key
/// is taken, and how many members have not finished. [`admit`] answers it from the members
/// themselves; the engine from the store's index (one read of a run by its name, a count of
/// the group's runs by phase), so that adding a member costs the same in a group of ten
/// thousand as in a group of ten.
pub trait Membership {
    /// Whether a member of the group has `task_key`.
    fn has_task(&self, task_key: &str) -> bool;
    /// How many members have not finished.
    fn unfinished(&self) -> usize;
}

/// The members of a group, indexed for [`Membership`].
struct MemberIndex<'a> {
    keys: std::collections::HashSet<&'a str>,
    unfinished: usize,
}

impl<'a> MemberIndex<'a> {
    fn of(members: &'a [Member]) -> Self {
        MemberIndex {
            keys: members.iter().map(|m| m.task_key.as_str()).collect(),
            unfinished: members.iter().filter(|m| !m.phase.is_finished()).count(),
        }
    }
}

impl Membership for MemberIndex<'_> {
    fn has_task(&self, task_key: &str) -> bool {
        self.keys.contains(task_key)
    }
    fn unfinished(&self) -> usize {
        self.unfinished
    }
}

/// The reason a new member of a group gives for waiting until the group's reconcile looks
/// at it: `GroupWait` when `running` members hold every slot and it depends on nothing, as
/// the reconcile would find (a free slot meanwhile lets the reconcile start it all the same),
/// so that the run is created saying so instead of being rewritten to say so; `Queued`
/// otherwise, for the reconcile to decide.
pub fn pending_on_admission(
    spec: &AgentGroupSpec,
    running: usize,
    depends_on: &[String],
) -> PendingReason {
    let max_active = usize::try_from(spec.limits.max_active).unwrap_or(usize::MAX);
    if depends_on.is_empty() && running >= max_active {
        PendingReason::GroupWait
    } else {
        PendingReason::Queued
    }
}

/// Whether a run of `agent` with `task_key` and `depends_on` may join the group of
/// `members` ([`admit_to`] over them).
pub fn admit(
    spec: &AgentGroupSpec,
    phase: Option<GroupPhase>,
    members: &[Member],
    agent: &str,
    task_key: &str,
    depends_on: &[String],
) -> Result<(), AdmissionRefused> {
    admit_to(
        spec,
        phase,
        &MemberIndex::of(members),
        agent,
        task_key,
        depends_on,
    )
}

/// Whether a group takes new runs: it is not sealed, and it is running (or has no phase yet:
/// not reconciled since it was made). Finished and cancelled groups take none. The phase by
/// its name: stores ask it of a stored document ([`MemberCap`](crate::store::MemberCap)).
pub fn takes_runs(sealed: bool, phase: Option<&str>) -> bool {
    !sealed && phase.is_none_or(|phase| phase == GroupPhase::Running.name())
}

/// Whether a run of `agent` with `task_key` and `depends_on` may join a group whose members
/// `members` describes: the group takes runs, the agent is the group's, the task key is new,
/// every dependency is a member, and fewer than `maxPending` members are unfinished (checked
/// in that order: the first refusal is the answer).
pub fn admit_to(
    spec: &AgentGroupSpec,
    phase: Option<GroupPhase>,
    members: &dyn Membership,
    agent: &str,
    task_key: &str,
    depends_on: &[String],
) -> Result<(), AdmissionRefused> {
    if !takes_runs(spec.sealed, phase.map(GroupPhase::name)) {
        return Err(AdmissionRefused::Sealed);
    }
    if agent != spec.agent {
        return Err(AdmissionRefused::AgentMismatch {
            run: agent.to_string(),
            group: spec.agent.clone(),
        });
    }
    if members.has_task(task_key) {
        return Err(AdmissionRefused::DuplicateTaskKey(task_key.to_string()));
    }
    if let Some(missing) = depends_on.iter().find(|key| !members.has_task(key)) {
        return Err(AdmissionRefused::UnknownDependency(missing.clone()));
    }
    if members.unfinished() >= usize::try_from(spec.limits.max_pending).unwrap_or(usize::MAX) {
        return Err(AdmissionRefused::TooManyPending {
            max_pending: spec.limits.max_pending,
        });
    }
    Ok(())
}

/// Why a change to a group's spec is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum UpdateRefused {
    /// `spec.sealed` went from true to false.
    #[error("spec.sealed cannot be undone")]
    Unseal,
    /// `spec.maxCostUSD` was lowered, or a cap was set on a group that had none (no cap is
    /// an unlimited cap; removing a cap raises it).
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lifecycle::{FailReason, RunEvent, WaitReason};
    use crate::resource::GroupLimits;

    fn usd(text: &str) -> Usd {
        text.parse().expect("test amount")
    }

    fn spec(max_active: u32, max_cost: Option<&str>) -> AgentGroupSpec {
        AgentGroupSpec {
            agent: "worker".to_string(),
            limits: GroupLimits {
                max_active,
                ..GroupLimits::default()
            },
            max_cost_usd: max_cost.map(usd),
            sealed: false,
            evaluation: None,
        }
    }

    fn run(key: &str, depends_on: &[&str], cap: &str, phase: RunPhase) -> Member {
        Member {
            task_key: key.to_string(),
            depends_on: depends_on.iter().map(|d| d.to_string()).collect(),
            cap: usd(cap),
            spent: Usd::ZERO,
            phase,
        }
    }

    fn queued(key: &str, depends_on: &[&str], cap: &str) -> Member {
        run(
            key,
            depends_on,
            cap,
            RunPhase::Pending(PendingReason::Queued),
        )
    }

    #[test]
    fn a_new_member_of_a_full_group_is_created_waiting_as_the_reconcile_would_say() {
        let spec = spec(2, None);
        let running = |key| run(key, &[], "1.00", RunPhase::Running);
        let reason = pending_on_admission(&spec, 2, &[]);
        assert_eq!(reason, PendingReason::GroupWait);
        let members = vec![
            running("a"),
            running("b"),
            run("c", &[], "1.00", RunPhase::Pending(reason)),
        ];
        let plan = reconcile(&spec, Some(GroupPhase::Running), &members);
        assert_eq!(plan.queue, vec![(2, PendingReason::GroupWait)]);
        let writes = plan.writes(&members, &[None, None, None]).expect("writes");
        assert!(writes.is_empty(), "nothing left to rewrite: {writes:?}");
        // A free slot, or a dependency: the reconcile decides.
        assert_eq!(pending_on_admission(&spec, 1, &[]), PendingReason::Queued);
        let depends = ["a".to_string()];
        assert_eq!(
            pending_on_admission(&spec, 2, &depends),
            PendingReason::Queued
        );
    }

    /// Carry a plan out the way the engine does, through the lifecycle.
    fn carry_out(members: &mut [Member], plan: &Plan) {
        let events = plan
            .start
            .iter()
            .map(|&i| (i, RunEvent::Start))
            .chain(plan.cancel.iter().map(|&(i, r)| (i, RunEvent::Cancel(r))))
            .chain(plan.queue.iter().map(|&(i, r)| (i, RunEvent::Queue(r))));
        for (i, event) in events {
            members[i].phase = members[i]
                .phase
                .apply(event)
                .expect("the plan follows the lifecycle");
        }
    }

    fn finish(member: &mut Member, spent: &str) {
        member.spent = usd(spent);
        member.phase = member
            .phase
            .apply(RunEvent::Succeed)
            .expect("a running run succeeds");
    }

    fn blocked(reasons: &[(BlockedReason, u32)]) -> std::collections::BTreeMap<BlockedReason, u32> {
        reasons.iter().copied().collect()
    }

    #[test]
    fn the_spec_example_six_caps_fit_under_sixty_cents_and_the_seventh_waits() {
        let mut spec = spec(2, Some("0.60"));
        let keys = ["a", "b", "c", "d", "e", "f", "g"];
        let mut members: Vec<Member> = keys.iter().map(|k| queued(k, &[], "0.10")).collect();

        // maxActive 2: two go, the others wait for a slot.
        let plan = reconcile(&spec, None, &members);
        assert_eq!(plan.start, vec![0, 1]);
        assert_eq!(
            plan.status.blocked_reasons,
            blocked(&[(BlockedReason::MaxActiveReached, 5)])
        );
        assert!(
            plan.queue
                .iter()
                .all(|&(_, r)| r == PendingReason::GroupWait)
        );
        carry_out(&mut members, &plan);

        // More slots: the $0.60 cap has room for six caps of $0.10 before anything is spent.
        let mut wider = spec.clone();
        wider.limits.max_active = 10;
        assert_eq!(check_update(&spec, &wider), Ok(()));
        spec = wider;
        let plan = reconcile(&spec, plan.status.phase, &members);
        assert_eq!(plan.start, vec![2, 3, 4, 5]);
        assert_eq!(plan.queue, vec![(6, PendingReason::GroupWait)]);
        assert_eq!(
            plan.status.blocked_reasons,
            blocked(&[(BlockedReason::MaxCostReached, 1)])
        );
        assert_eq!(plan.status.counts.active, 6);
        assert_eq!(plan.status.counts.queued, 1);
        carry_out(&mut members, &plan);

        // a finishes having spent $0.03: $0.07 is left, still short of g's $0.10.
        finish(&mut members[0], "0.03");
        let plan = reconcile(&spec, plan.status.phase, &members);
        assert!(plan.start.is_empty());
        assert_eq!(
            plan.status.blocked_reasons,
            blocked(&[(BlockedReason::MaxCostReached, 1)])
        );
        assert_eq!(plan.status.cost.total_usd, usd("0.03"));
        assert_eq!(plan.status.cost.limit_usd, Some(usd("0.60")));
        carry_out(&mut members, &plan);

        // b finishes having spent nothing: $0.60 − $0.03 − 4 × $0.10 = $0.17, g starts.
        finish(&mut members[1], "0");
        let plan = reconcile(&spec, plan.status.phase, &members);
        assert_eq!(plan.start, vec![6]);
        assert!(plan.status.blocked_reasons.is_empty());
    }

    #[test]
    fn the_spec_example_at_two_at_a_time_spending_every_cap_runs_six() {
        let spec = spec(2, Some("0.60"));
        let mut members: Vec<Member> = (0..7)
            .map(|i| queued(&format!("t{i}"), &[], "0.10"))
            .collect();
        let mut phase = None;
        for round in 0..3 {
            let plan = reconcile(&spec, phase, &members);
            assert_eq!(plan.start, vec![2 * round, 2 * round + 1], "round {round}");
            carry_out(&mut members, &plan);
            for &i in &plan.start {
                finish(&mut members[i], "0.10");
            }
            phase = plan.status.phase;
        }
        let plan = reconcile(&spec, phase, &members);
        assert!(plan.start.is_empty());
        assert_eq!(plan.queue, vec![(6, PendingReason::GroupWait)]);
        assert_eq!(
            plan.status.blocked_reasons,
            blocked(&[(BlockedReason::MaxCostReached, 1)])
        );
        assert_eq!(plan.status.cost.total_usd, usd("0.60"));
        assert_eq!(plan.status.counts.succeeded, 6);
    }

    #[test]
    fn a_cap_smaller_than_one_runs_cap_starts_nothing_until_it_is_raised() {
        let mut spec = spec(10, Some("0.05"));
        spec.sealed = true;
        let members = vec![queued("a", &[], "0.10"), queued("b", &[], "0.10")];
        let plan = reconcile(&spec, None, &members);
        assert!(plan.start.is_empty());
        assert_eq!(
            plan.status.blocked_reasons,
            blocked(&[(BlockedReason::MaxCostReached, 2)])
        );
        // Sealed, but queued runs have not finished: the group is still Running.
        assert_eq!(plan.status.phase, Some(GroupPhase::Running));

        // A zero cap is a cap too.
        let mut zero = spec.clone();
        zero.max_cost_usd = Some(Usd::ZERO);
        assert!(reconcile(&zero, None, &members).start.is_empty());

        // Exactly one run's cap fits one run.
        let mut raised = spec.clone();
        raised.max_cost_usd = Some(usd("0.10"));
        assert_eq!(check_update(&spec, &raised), Ok(()));
        let plan = reconcile(&raised, None, &members);
        assert_eq!(plan.start, vec![0]);
        assert_eq!(
            plan.status.blocked_reasons,
            blocked(&[(BlockedReason::MaxCostReached, 1)])
        );
    }

    #[test]
    fn patching_max_active_raises_concurrency_and_lowering_it_stops_nothing() {
        let spec = spec(1, None);
        let mut members: Vec<Member> = (0..5).map(|i| queued(&format!("t{i}"), &[], "1")).collect();
        let plan = reconcile(&spec, None, &members);
        assert_eq!(plan.start, vec![0]);
        carry_out(&mut members, &plan);

        let mut raised = spec.clone();
        raised.limits.max_active = 3;
        assert_eq!(check_update(&spec, &raised), Ok(()));
        let plan = reconcile(&raised, None, &members);
        assert_eq!(plan.start, vec![1, 2]);
        assert_eq!(plan.status.counts.active, 3);
        assert_eq!(
            plan.status.blocked_reasons,
            blocked(&[(BlockedReason::MaxActiveReached, 2)])
        );
        carry_out(&mut members, &plan);

        // Lowered below the runs going: they keep going, nothing new starts until fewer
        // than maxActive are left.
        let mut lowered = raised.clone();
        lowered.limits.max_active = 2;
        assert_eq!(check_update(&raised, &lowered), Ok(()));
        let plan = reconcile(&lowered, None, &members);
        assert!(plan.start.is_empty() && plan.cancel.is_empty());
        assert_eq!(plan.status.counts.active, 3);
        finish(&mut members[0], "0");
        assert!(reconcile(&lowered, None, &members).start.is_empty());
        finish(&mut members[1], "0");
        assert_eq!(reconcile(&lowered, None, &members).start, vec![3]);
    }

    #[test]
    fn waiting_and_parked_runs_hold_no_slot_but_hold_their_caps() {
        let spec = spec(1, Some("3.50"));
        let members = vec![
            run(
                "a",
                &[],
                "1",
                RunPhase::Waiting(WaitReason::AwaitingMessage),
            ),
            run("b", &[], "1", RunPhase::Waiting(WaitReason::MaxCostReached)),
            run("c", &[], "1", RunPhase::NeedsResolution),
            queued("d", &[], "0.50"),
            queued("e", &[], "0.50"),
        ];
        let plan = reconcile(&spec, None, &members);
        // No run works: d takes the one slot; the three started runs' caps leave $0.50.
        assert_eq!(plan.start, vec![3]);
        assert_eq!(plan.queue, vec![(4, PendingReason::GroupWait)]);
        assert_eq!(
            plan.status.blocked_reasons,
            blocked(&[(BlockedReason::MaxActiveReached, 1)])
        );
        assert_eq!(plan.status.counts.active, 1);
        assert_eq!(plan.status.counts.waiting, 2);
        assert_eq!(plan.status.counts.parked, 1);
        assert_eq!(plan.status.counts.queued, 1);

        // With the slot free again (d parked too), e waits only for money: the caps of the
        // waiting and parked runs are held.
        let mut members = members;
        members[3].phase = RunPhase::NeedsResolution;
        let plan = reconcile(&spec, None, &members);
        assert!(plan.start.is_empty());
        assert_eq!(
            plan.status.blocked_reasons,
            blocked(&[(BlockedReason::MaxCostReached, 1)])
        );
    }

    #[test]
    fn runs_parked_by_a_crash_do_not_stall_their_group() {
        // 20 runs, maxActive 10, the server killed while 10 went: they park, and the 10
        // queued ones start instead of waiting forever with GroupWait.
        let spec = spec(10, None);
        let mut members: Vec<Member> = (0..10)
            .map(|i| run(&format!("p{i}"), &[], "0.10", RunPhase::NeedsResolution))
            .collect();
        members.extend((0..10).map(|i| queued(&format!("q{i}"), &[], "0.10")));
        let plan = reconcile(&spec, None, &members);
        assert_eq!(plan.start, (10..20).collect::<Vec<_>>());
        assert!(plan.status.blocked_reasons.is_empty());
        assert_eq!(plan.status.counts.parked, 10);
        assert_eq!(plan.status.counts.active, 10);
        carry_out(&mut members, &plan);

        // A parked run resolved comes back at once, over maxActive; nothing else starts until
        // the group is under it again, and the queued run says why.
        members.push(queued("late", &[], "0.10"));
        members[0].phase = members[0]
            .phase
            .apply(RunEvent::Resolve(crate::lifecycle::Resolution::Retry))
            .expect("a parked run resumes");
        let plan = reconcile(&spec, None, &members);
        assert!(plan.start.is_empty());
        assert_eq!(plan.status.counts.active, 11);
        assert_eq!(
            plan.status.blocked_reasons,
            blocked(&[(BlockedReason::MaxActiveReached, 1)])
        );
    }

    #[test]
    fn a_started_run_holds_its_cap_or_its_spend_whichever_is_more() {
        let spec = spec(10, Some("1.00"));
        let mut over = run("a", &[], "0.30", RunPhase::Running);
        // A worst case that was wrong: the run spent past its cap. The group still counts it.
        over.spent = usd("0.50");
        let members = vec![over, queued("b", &[], "0.50"), queued("c", &[], "0.51")];
        let plan = reconcile(&spec, None, &members);
        assert_eq!(plan.start, vec![1]);
        assert_eq!(plan.queue, vec![(2, PendingReason::GroupWait)]);
    }

    #[test]
    fn a_run_that_does_not_fit_lets_a_smaller_later_run_start() {
        let spec = spec(10, Some("0.30"));
        let members = vec![queued("big", &[], "0.50"), queued("small", &[], "0.10")];
        let plan = reconcile(&spec, None, &members);
        assert_eq!(plan.start, vec![1]);
        assert_eq!(plan.queue, vec![(0, PendingReason::GroupWait)]);
    }

    #[test]
    fn a_run_whose_cap_never_fits_says_what_to_change() {
        let spec = spec(10, Some("0.30"));
        let mut done = run("done", &[], "0.10", RunPhase::Succeeded);
        done.spent = usd("0.05");
        let members = vec![
            done,
            queued("big", &[], "0.50"),
            queued("fits-later", &[], "0.25"),
            run("running", &[], "0.10", RunPhase::Running),
            queued("edge", &[], "0.26"),
        ];
        let plan = reconcile(&spec, None, &members);
        // 0.30 − 0.05 spent leaves 0.25: "big" and "edge" never fit; "fits-later" only waits
        // for the running run's cap.
        let never: Vec<usize> = plan.never_fit.iter().map(|(i, _)| *i).collect();
        assert_eq!(never, vec![1, 4]);
        let (_, message) = &plan.never_fit[0];
        assert!(
            message.contains("spec.maxCostUSD ($0.30, of which finished runs spent $0.05)")
                && message.contains("perRunMaxCostUSD ($0.50"),
            "{message}"
        );
        assert!(plan.queue.contains(&(2, PendingReason::GroupWait)));

        let unspent = reconcile(
            &spec,
            None,
            &[queued("big", &[], "0.50"), queued("small", &[], "0.10")],
        );
        assert_eq!(unspent.start, vec![1]);
        assert_eq!(unspent.never_fit.len(), 1);
        assert!(
            unspent.never_fit[0]
                .1
                .contains("raise the group's spec.maxCostUSD ($0.30) or lower the agent's perRunMaxCostUSD ($0.50"),
            "{:?}",
            unspent.never_fit
        );
    }

    #[test]
    fn blocked_reasons_check_dependencies_then_slots_then_money() {
        let spec = spec(1, Some("0.10"));
        let members = vec![
            run("a", &[], "0.10", RunPhase::Running),
            queued("b", &["a"], "0.10"),
            queued("c", &[], "0.10"),
        ];
        let plan = reconcile(&spec, None, &members);
        assert_eq!(
            plan.queue,
            vec![
                (1, PendingReason::DependencyWait),
                (2, PendingReason::GroupWait)
            ]
        );
        assert_eq!(
            plan.status.blocked_reasons,
            blocked(&[
                (BlockedReason::DependencyWait, 1),
                (BlockedReason::MaxActiveReached, 1)
            ])
        );
        let json = serde_json::to_value(&plan.status).expect("serialize");
        assert_eq!(
            json["blockedReasons"],
            serde_json::json!({"DependencyWait": 1, "MaxActiveReached": 1})
        );
    }

    #[test]
    fn a_failed_dependency_cancels_its_dependents_transitively_in_one_pass() {
        let mut spec = spec(10, None);
        spec.sealed = true;
        let members = vec![
            run("a", &[], "1", RunPhase::Failed(FailReason::ModelCallFailed)),
            queued("b", &["a"], "1"),
            queued("c", &["b"], "1"),
            queued("d", &["c", "a"], "1"),
            run("e", &[], "1", RunPhase::Succeeded),
            queued("f", &["e"], "1"),
        ];
        let plan = reconcile(&spec, None, &members);
        assert_eq!(
            plan.cancel,
            vec![
                (1, CancelReason::DependencyFailed),
                (2, CancelReason::DependencyCancelled),
                // A failed dependency outweighs a cancelled one.
                (3, CancelReason::DependencyFailed),
            ]
        );
        assert_eq!(plan.start, vec![5]);
        assert_eq!(plan.status.phase, Some(GroupPhase::Running));
        let mut members = members;
        carry_out(&mut members, &plan);
        finish(&mut members[5], "0");
        let plan = reconcile(&spec, plan.status.phase, &members);
        assert_eq!(plan.status.phase, Some(GroupPhase::FailedRunsFailed));
        assert_eq!(plan.status.counts.failed, 1);
        assert_eq!(plan.status.counts.cancelled, 3);
        assert_eq!(plan.status.counts.succeeded, 2);
    }

    #[test]
    fn a_cancelled_dependency_cancels_dependents_and_the_group_still_succeeds() {
        let mut spec = spec(10, None);
        spec.sealed = true;
        let members = vec![
            run(
                "a",
                &[],
                "1",
                RunPhase::Cancelled(CancelReason::CancelRequested),
            ),
            queued("b", &["a"], "1"),
            run("c", &[], "1", RunPhase::Succeeded),
        ];
        let plan = reconcile(&spec, None, &members);
        assert_eq!(plan.cancel, vec![(1, CancelReason::DependencyCancelled)]);
        assert_eq!(plan.status.phase, Some(GroupPhase::Succeeded));
        assert!(!counts_as_failure(RunPhase::Cancelled(
            CancelReason::DependencyCancelled
        )));
        assert!(counts_as_failure(RunPhase::Cancelled(
            CancelReason::DependencyFailed
        )));
        assert!(counts_as_failure(RunPhase::Failed(
            FailReason::DeadlineExceeded
        )));
    }

    #[test]
    fn a_queued_run_whose_dependency_failed_fails_the_sealed_group() {
        let mut spec = spec(10, None);
        spec.sealed = true;
        let members = vec![
            run("a", &[], "1", RunPhase::Succeeded),
            run(
                "b",
                &["a"],
                "1",
                RunPhase::Cancelled(CancelReason::DependencyFailed),
            ),
        ];
        let plan = reconcile(&spec, Some(GroupPhase::Running), &members);
        assert_eq!(plan.status.phase, Some(GroupPhase::FailedRunsFailed));
    }

    #[test]
    fn a_group_finishes_only_once_sealed_and_an_empty_sealed_group_succeeds() {
        let mut spec = spec(10, None);
        assert_eq!(
            reconcile(&spec, None, &[]).status.phase,
            Some(GroupPhase::Running)
        );
        let done = vec![run("a", &[], "1", RunPhase::Succeeded)];
        assert_eq!(
            reconcile(&spec, None, &done).status.phase,
            Some(GroupPhase::Running)
        );
        spec.sealed = true;
        let plan = reconcile(&spec, None, &[]);
        assert_eq!(plan.status.phase, Some(GroupPhase::Succeeded));
        assert_eq!(plan.status.counts, GroupCounts::default());
        assert_eq!(
            reconcile(&spec, None, &done).status.phase,
            Some(GroupPhase::Succeeded)
        );
    }

    #[test]
    fn group_cancel_goes_through_cancelling_to_cancelled() {
        let spec = spec(10, None);
        let mut members = vec![
            run("a", &[], "1", RunPhase::Succeeded),
            run("b", &["a"], "1", RunPhase::Running),
            queued("c", &["b"], "1"),
            queued("d", &[], "1"),
        ];
        // The cancel sets the phase; reconcile cancels what has not started.
        let plan = reconcile(&spec, Some(GroupPhase::Cancelling), &members);
        assert!(plan.start.is_empty());
        assert_eq!(
            plan.cancel,
            vec![
                (2, CancelReason::GroupCancelled),
                (3, CancelReason::GroupCancelled)
            ]
        );
        assert_eq!(plan.status.phase, Some(GroupPhase::Cancelling));
        assert_eq!(plan.status.counts.active, 1);
        assert_eq!(
            admit(&spec, plan.status.phase, &members, "worker", "e", &[]),
            Err(AdmissionRefused::Sealed)
        );
        carry_out(&mut members, &plan);

        // The engine cancels the started run; the finished one keeps its answer.
        members[1].phase = members[1]
            .phase
            .apply(RunEvent::Cancel(CancelReason::GroupCancelled))
            .expect("a started run can be cancelled");
        let plan = reconcile(&spec, plan.status.phase, &members);
        assert_eq!(plan.status.phase, Some(GroupPhase::Cancelled));
        assert!(plan.cancel.is_empty());
        assert_eq!(members[0].phase, RunPhase::Succeeded);
        assert_eq!(plan.status.counts.succeeded, 1);
        assert_eq!(plan.status.counts.cancelled, 3);

        // Cancelled stays Cancelled, sealed or not, and an empty group cancels at once.
        let mut sealed = spec.clone();
        sealed.sealed = true;
        assert_eq!(
            reconcile(&sealed, Some(GroupPhase::Cancelled), &members)
                .status
                .phase,
            Some(GroupPhase::Cancelled)
        );
        assert_eq!(
            reconcile(&spec, Some(GroupPhase::Cancelling), &[])
                .status
                .phase,
            Some(GroupPhase::Cancelled)
        );
    }

    #[test]
    fn group_phase_round_trips_through_json() {
        assert_eq!(
            serde_json::to_value(GroupPhase::FailedRunsFailed).expect("serialize"),
            serde_json::json!({"phase": "Failed", "reason": "RunsFailed"})
        );
        assert_eq!(
            serde_json::to_value(GroupPhase::Cancelling).expect("serialize"),
            serde_json::json!({"phase": "Cancelling"})
        );
        for phase in GroupPhase::ALL {
            let json = serde_json::to_string(&phase).expect("serialize");
            let back: GroupPhase = serde_json::from_str(&json).expect("deserialize");
            assert_eq!(back, phase, "{json}");
            assert_eq!(phase.to_string(), phase.name());
        }
        for bad in [
            serde_json::json!({"phase": "Failed"}),
            serde_json::json!({"phase": "Succeeded", "reason": "RunsFailed"}),
            serde_json::json!({"phase": "Done"}),
            serde_json::json!("Running"),
        ] {
            assert!(
                serde_json::from_value::<GroupPhase>(bad.clone()).is_err(),
                "{bad}"
            );
        }

        // Inside a status, phase and reason sit at the top level.
        let status = AgentGroupStatus {
            phase: Some(GroupPhase::FailedRunsFailed),
            ..AgentGroupStatus::default()
        };
        let json = serde_json::to_value(&status).expect("serialize");
        assert_eq!(json["phase"], "Failed");
        assert_eq!(json["reason"], "RunsFailed");
        let back: AgentGroupStatus = serde_json::from_value(json).expect("deserialize");
        assert_eq!(back, status);
    }

    #[test]
    fn admit_refuses_with_the_right_reason() {
        let spec = spec(10, None);
        let members = vec![
            run("a", &[], "1", RunPhase::Succeeded),
            queued("b", &["a"], "1"),
        ];
        let deps = |keys: &[&str]| keys.iter().map(|k| k.to_string()).collect::<Vec<_>>();
        assert_eq!(
            admit(&spec, None, &members, "worker", "c", &deps(&["a", "b"])),
            Ok(())
        );
        assert_eq!(
            admit(&spec, None, &members, "other", "c", &[]),
            Err(AdmissionRefused::AgentMismatch {
                run: "other".to_string(),
                group: "worker".to_string()
            })
        );
        assert_eq!(
            admit(&spec, None, &members, "worker", "a", &[]),
            Err(AdmissionRefused::DuplicateTaskKey("a".to_string()))
        );
        assert_eq!(
            admit(&spec, None, &members, "worker", "c", &deps(&["a", "z"])),
            Err(AdmissionRefused::UnknownDependency("z".to_string()))
        );
        // A run cannot depend on itself: it is not in the group yet.
        assert_eq!(
            admit(&spec, None, &members, "worker", "c", &deps(&["c"])),
            Err(AdmissionRefused::UnknownDependency("c".to_string()))
        );
        // A dependency may have finished, even failed: the run is admitted and cancelled later.
        let failed = vec![run(
            "a",
            &[],
            "1",
            RunPhase::Failed(FailReason::TimeoutExceeded),
        )];
        assert_eq!(
            admit(&spec, None, &failed, "worker", "b", &deps(&["a"])),
            Ok(())
        );
    }

    #[test]
    fn admit_refuses_a_sealed_cancelling_or_finished_group_first() {
        let mut sealed = spec(10, None);
        sealed.sealed = true;
        // Sealing is checked before anything else, even for a run that is wrong otherwise.
        assert_eq!(
            admit(&sealed, None, &[], "other", "a", &["z".to_string()]),
            Err(AdmissionRefused::Sealed)
        );
        let open = spec(10, None);
        for phase in [
            GroupPhase::Cancelling,
            GroupPhase::Cancelled,
            GroupPhase::Succeeded,
            GroupPhase::FailedRunsFailed,
        ] {
            assert_eq!(
                admit(&open, Some(phase), &[], "worker", "a", &[]),
                Err(AdmissionRefused::Sealed),
                "{phase}"
            );
        }
        assert_eq!(
            admit(&open, Some(GroupPhase::Running), &[], "worker", "a", &[]),
            Ok(())
        );
        assert_eq!(admit(&open, None, &[], "worker", "a", &[]), Ok(()));
    }

    #[test]
    fn max_pending_counts_only_unfinished_runs() {
        let mut spec = spec(10, None);
        spec.limits.max_pending = 2;
        let mut members = vec![
            run("a", &[], "1", RunPhase::Running),
            queued("b", &[], "1"),
            run("c", &[], "1", RunPhase::Succeeded),
            run(
                "d",
                &[],
                "1",
                RunPhase::Cancelled(CancelReason::CancelRequested),
            ),
        ];
        assert_eq!(
            admit(&spec, None, &members, "worker", "e", &[]),
            Err(AdmissionRefused::TooManyPending { max_pending: 2 })
        );
        members[0].phase = RunPhase::Failed(FailReason::ModelCallFailed);
        assert_eq!(admit(&spec, None, &members, "worker", "e", &[]), Ok(()));
        let message = AdmissionRefused::TooManyPending { max_pending: 2 }.to_string();
        assert!(message.contains("maxPending"), "{message}");
    }

    #[test]
    fn check_update_allows_raises_and_refuses_lowering_unsealing_and_a_new_agent() {
        let old = spec(2, Some("0.60"));
        let with = |edit: &dyn Fn(&mut AgentGroupSpec)| {
            let mut new = old.clone();
            edit(&mut new);
            new
        };
        assert_eq!(check_update(&old, &old), Ok(()));
        assert_eq!(
            check_update(&old, &with(&|s| s.max_cost_usd = Some(usd("0.61")))),
            Ok(())
        );
        assert_eq!(
            check_update(&old, &with(&|s| s.limits.max_active = 1)),
            Ok(())
        );
        assert_eq!(
            check_update(&old, &with(&|s| s.limits.max_active = 1000)),
            Ok(())
        );
        assert_eq!(check_update(&old, &with(&|s| s.sealed = true)), Ok(()));
        assert_eq!(
            check_update(&old, &with(&|s| s.max_cost_usd = Some(usd("0.599999999")))),
            Err(UpdateRefused::CapLowered {
                from: "0.60".to_string(),
                to: "0.599999999".to_string()
            })
        );
        assert_eq!(
            check_update(&old, &with(&|s| s.agent = "other".to_string())),
            Err(UpdateRefused::AgentChanged)
        );
        let sealed = with(&|s| s.sealed = true);
        assert_eq!(check_update(&sealed, &old), Err(UpdateRefused::Unseal));

        // No cap is an unlimited cap: adding one lowers it; removing one raises it.
        let uncapped = with(&|s| s.max_cost_usd = None);
        assert_eq!(
            check_update(&uncapped, &old),
            Err(UpdateRefused::CapLowered {
                from: "no cap".to_string(),
                to: "0.60".to_string()
            })
        );
        assert_eq!(check_update(&old, &uncapped), Ok(()));
    }
}

//! Model-based property tests of the group controller (`nodus_core::group`).
//!
//! Random groups take random interleavings of operations, in the style of vector's disk
//! buffer model tests: runs join through `admit`, the group is sealed, patched or cancelled,
//! `reconcile` runs and its plan is carried out through the run lifecycle, started runs
//! spend through their own `CostGuard` and finish. A small reference model, written for
//! clarity rather than speed (a fixpoint for the dependency cascade, signed arithmetic for
//! the money left), predicts every plan. After every operation the spec's invariants are
//! checked: concurrency (only working runs take `maxActive` slots: a waiting or parked run
//! holds none, but holds its cap), the per-run and group caps, dependencies, sealing, the
//! group's phase, counts and blocked reasons. Each case ends by sealing the group and driving it to
//! a finished phase.

use std::collections::BTreeMap;

use nodus_core::cost::CostGuard;
use nodus_core::group::{
    AdmissionRefused, GroupPhase, Member, Plan, UpdateRefused, admit, check_update,
    counts_as_failure, reconcile,
};
use nodus_core::lifecycle::{
    CancelReason, FailReason, PendingReason, Resolution, RunEvent, RunPhase, WaitReason,
};
use nodus_core::money::Usd;
use nodus_core::resource::{AgentGroupSpec, BlockedReason, GroupCounts, GroupLimits};
use proptest::prelude::*;
use proptest::sample::Index;
use proptest::strategy::ValueTree;
use proptest::test_runner::TestRunner;

const AGENT: &str = "worker";
const NANOS_PER_CENT: u64 = 10_000_000;

fn cents(n: u64) -> Usd {
    Usd::from_nanos(n * NANOS_PER_CENT)
}

fn task_key(n: u8) -> String {
    format!("t{n}")
}

fn to_usize(n: u32) -> usize {
    usize::try_from(n).expect("u32 fits in usize")
}

// ---------------------------------------------------------------------------------------
// The reference model of one reconcile pass.
// ---------------------------------------------------------------------------------------

/// What the model expects of one `reconcile` pass.
#[derive(Debug)]
struct Expected {
    start: Vec<usize>,
    cancel: Vec<(usize, CancelReason)>,
    queue: Vec<(usize, PendingReason)>,
    blocked: BTreeMap<BlockedReason, u32>,
    phase: GroupPhase,
}

fn pending_reason(blocked: BlockedReason) -> PendingReason {
    match blocked {
        BlockedReason::DependencyWait => PendingReason::DependencyWait,
        BlockedReason::MaxActiveReached | BlockedReason::MaxCostReached => PendingReason::GroupWait,
    }
}

/// The spec's rules, spelled out the slow way.
fn model_reconcile(
    spec: &AgentGroupSpec,
    phase: Option<GroupPhase>,
    members: &[Member],
) -> Expected {
    let mut phases: Vec<RunPhase> = members.iter().map(|m| m.phase).collect();
    let dependencies: Vec<Vec<usize>> = members
        .iter()
        .map(|m| {
            m.depends_on
                .iter()
                .map(|key| {
                    members
                        .iter()
                        .position(|other| &other.task_key == key)
                        .expect("admitted dependencies are members")
                })
                .collect()
        })
        .collect();
    let cancelling = matches!(phase, Some(GroupPhase::Cancelling | GroupPhase::Cancelled));
    let is_pending = |p: RunPhase| matches!(p, RunPhase::Pending(_));
    let mut cancelled: BTreeMap<usize, CancelReason> = BTreeMap::new();
    let mut start = Vec::new();
    let mut queue = Vec::new();
    let mut blocked: BTreeMap<BlockedReason, u32> = BTreeMap::new();

    if cancelling {
        for (i, p) in phases.iter_mut().enumerate() {
            if is_pending(*p) {
                *p = RunPhase::Cancelled(CancelReason::GroupCancelled);
                cancelled.insert(i, CancelReason::GroupCancelled);
            }
        }
    } else {
        // The cascade, to a fixpoint. Visiting in reverse on purpose: the model does not
        // rely on dependencies coming first.
        loop {
            let mut changed = false;
            for i in (0..members.len()).rev() {
                if !is_pending(phases[i]) {
                    continue;
                }
                let dep_phases: Vec<RunPhase> =
                    dependencies[i].iter().map(|&d| phases[d]).collect();
                let reason = if dep_phases.iter().any(|p| matches!(p, RunPhase::Failed(_))) {
                    Some(CancelReason::DependencyFailed)
                } else if dep_phases
                    .iter()
                    .any(|p| matches!(p, RunPhase::Cancelled(_)))
                {
                    Some(CancelReason::DependencyCancelled)
                } else {
                    None
                };
                if let Some(reason) = reason {
                    phases[i] = RunPhase::Cancelled(reason);
                    cancelled.insert(i, reason);
                    changed = true;
                }
            }
            if !changed {
                break;
            }
        }

        let nanos = |usd: Usd| i128::from(usd.nanos());
        let max_active = i128::from(spec.limits.max_active);
        let mut active: i128 = 0;
        let mut committed: i128 = 0;
        for m in members {
            if m.phase.is_finished() {
                committed += nanos(m.spent);
            } else if m.phase.is_started() {
                committed += nanos(m.cap.max(m.spent));
            }
            // Only a working run takes a slot; waiting and parked ones hold only their cap.
            if m.phase == RunPhase::Running {
                active += 1;
            }
        }
        let mut left: Option<i128> = spec.max_cost_usd.map(|cap| nanos(cap) - committed);
        for i in 0..members.len() {
            if !is_pending(phases[i]) {
                continue;
            }
            let cap = nanos(members[i].cap);
            let reason = if !dependencies[i]
                .iter()
                .all(|&d| phases[d] == RunPhase::Succeeded)
            {
                Some(BlockedReason::DependencyWait)
            } else if active >= max_active {
                Some(BlockedReason::MaxActiveReached)
            } else if left.is_some_and(|left| cap > left) {
                Some(BlockedReason::MaxCostReached)
            } else {
                None
            };
            match reason {
                Some(reason) => {
                    queue.push((i, pending_reason(reason)));
                    *blocked.entry(reason).or_default() += 1;
                }
                None => {
                    start.push(i);
                    phases[i] = RunPhase::Running;
                    active += 1;
                    if let Some(left) = &mut left {
                        *left -= cap;
                    }
                }
            }
        }
    }

    let all_finished = phases.iter().all(|p| p.is_finished());
    let some_failed = phases.iter().any(|p| {
        matches!(
            p,
            RunPhase::Failed(_) | RunPhase::Cancelled(CancelReason::DependencyFailed)
        )
    });
    let phase = if cancelling {
        if all_finished {
            GroupPhase::Cancelled
        } else {
            GroupPhase::Cancelling
        }
    } else if spec.sealed && all_finished {
        if some_failed {
            GroupPhase::FailedRunsFailed
        } else {
            GroupPhase::Succeeded
        }
    } else {
        GroupPhase::Running
    };
    Expected {
        start,
        cancel: cancelled.into_iter().collect(),
        queue,
        blocked,
        phase,
    }
}

fn counts_of(members: &[Member]) -> GroupCounts {
    let mut counts = GroupCounts::default();
    for m in members {
        match m.phase {
            RunPhase::Pending(_) => counts.queued += 1,
            RunPhase::Running => counts.active += 1,
            RunPhase::NeedsResolution => counts.parked += 1,
            RunPhase::Waiting(_) => counts.waiting += 1,
            RunPhase::Succeeded => counts.succeeded += 1,
            RunPhase::Failed(_) => counts.failed += 1,
            RunPhase::Cancelled(_) => counts.cancelled += 1,
        }
    }
    counts
}

/// Checks that hold for any plan over any members: the plan matches the model, and every
/// queued member gets exactly one decision.
fn check_plan_against_model(
    spec: &AgentGroupSpec,
    phase: Option<GroupPhase>,
    members: &[Member],
    plan: &Plan,
) -> Result<(), TestCaseError> {
    let expected = model_reconcile(spec, phase, members);
    prop_assert_eq!(&plan.start, &expected.start, "runs started");
    prop_assert_eq!(&plan.cancel, &expected.cancel, "runs cancelled");
    prop_assert_eq!(&plan.queue, &expected.queue, "runs queued");
    prop_assert_eq!(
        &plan.status.blocked_reasons,
        &expected.blocked,
        "blocked reasons"
    );
    prop_assert_eq!(plan.status.phase, Some(expected.phase), "group phase");

    let mut decisions = vec![0u32; members.len()];
    let decided = plan
        .start
        .iter()
        .copied()
        .chain(plan.cancel.iter().map(|&(i, _)| i))
        .chain(plan.queue.iter().map(|&(i, _)| i));
    for i in decided {
        prop_assert!(i < members.len(), "index {} out of range", i);
        decisions[i] += 1;
    }
    for (i, m) in members.iter().enumerate() {
        let queued = u32::from(matches!(m.phase, RunPhase::Pending(_)));
        prop_assert_eq!(decisions[i], queued, "decisions for {}", m.task_key);
    }

    let blocked: u32 = plan.status.blocked_reasons.values().sum();
    prop_assert_eq!(to_usize(blocked), plan.queue.len());
    prop_assert!(plan.status.blocked_reasons.values().all(|&n| n > 0));
    prop_assert_eq!(
        plan.status.cost.total_usd,
        members.iter().map(|m| m.spent).sum::<Usd>()
    );
    prop_assert_eq!(plan.status.cost.limit_usd, spec.max_cost_usd);
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Operations.
// ---------------------------------------------------------------------------------------

#[derive(Debug, Clone)]
struct Setup {
    max_active: u32,
    max_pending: u32,
    max_cost: Option<Usd>,
}

/// A dependency of a new run: an existing member (most of the time), or any key.
#[derive(Debug, Clone)]
enum Dep {
    Existing(Index),
    Raw(u8),
}

#[derive(Debug, Clone, Copy)]
enum Outcome {
    Succeed,
    Fail(FailReason),
    Cancel,
}

#[derive(Debug, Clone)]
enum Op {
    /// A new run asks to join.
    Add {
        key: u8,
        deps: Vec<Dep>,
        cap: Usd,
        wrong_agent: bool,
    },
    Seal,
    TryUnseal,
    TryChangeAgent,
    Reconcile,
    /// A running run makes a model call.
    Spend {
        run: Index,
        worst: Usd,
        per_mille: u64,
    },
    /// A started run waits, parks, resumes or is resolved.
    Pause {
        run: Index,
        choice: u8,
    },
    /// A started run finishes.
    Finish {
        run: Index,
        outcome: Outcome,
    },
    /// A queued run is cancelled by a person, or its deadline passes.
    EndQueued {
        run: Index,
        deadline: bool,
    },
    PatchMaxActive(u32),
    RaiseCap(Usd),
    TryLowerCap(Usd),
    CancelGroup,
}

/// An amount between `lo` and `hi` cents: whole cents half of the time (so that caps fit
/// exactly), any nano-dollar amount otherwise.
fn amount(lo: u64, hi: u64) -> impl Strategy<Value = Usd> {
    prop_oneof![
        (lo..=hi).prop_map(cents),
        (lo * NANOS_PER_CENT..=hi * NANOS_PER_CENT).prop_map(Usd::from_nanos),
    ]
}

fn setup() -> impl Strategy<Value = Setup> {
    (
        1u32..=8,
        prop_oneof![3 => 1u32..=16, 1 => Just(GroupLimits::DEFAULT_MAX_PENDING)],
        proptest::option::weighted(0.8, amount(0, 100)),
    )
        .prop_map(|(max_active, max_pending, max_cost)| Setup {
            max_active,
            max_pending,
            max_cost,
        })
}

fn fail_reason() -> impl Strategy<Value = FailReason> {
    prop_oneof![
        Just(FailReason::DeadlineExceeded),
        Just(FailReason::TimeoutExceeded),
        Just(FailReason::ModelCallFailed),
        Just(FailReason::SandboxFailed),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    let dep = prop_oneof![
        9 => any::<Index>().prop_map(Dep::Existing),
        1 => (0u8..40).prop_map(Dep::Raw),
    ];
    let outcome = prop_oneof![
        5 => Just(Outcome::Succeed),
        2 => fail_reason().prop_map(Outcome::Fail),
        2 => Just(Outcome::Cancel),
    ];
    prop_oneof![
        30 => (
            0u8..32,
            proptest::collection::vec(dep, 0..=3),
            amount(1, 20),
            proptest::bool::weighted(0.05),
        )
            .prop_map(|(key, deps, cap, wrong_agent)| Op::Add {
                key,
                deps,
                cap,
                wrong_agent,
            }),
        3 => Just(Op::Seal),
        1 => Just(Op::TryUnseal),
        1 => Just(Op::TryChangeAgent),
        30 => Just(Op::Reconcile),
        20 => (any::<Index>(), amount(0, 12), 0u64..=1000)
            .prop_map(|(run, worst, per_mille)| Op::Spend { run, worst, per_mille }),
        16 => (any::<Index>(), any::<u8>()).prop_map(|(run, choice)| Op::Pause { run, choice }),
        20 => (any::<Index>(), outcome).prop_map(|(run, outcome)| Op::Finish { run, outcome }),
        4 => (any::<Index>(), any::<bool>())
            .prop_map(|(run, deadline)| Op::EndQueued { run, deadline }),
        8 => (1u32..=8).prop_map(Op::PatchMaxActive),
        4 => amount(0, 30).prop_map(Op::RaiseCap),
        3 => (1u64..=30 * NANOS_PER_CENT).prop_map(|n| Op::TryLowerCap(Usd::from_nanos(n))),
        1 => Just(Op::CancelGroup),
    ]
}

fn scenario() -> impl Strategy<Value = (Setup, Vec<Op>)> {
    (setup(), proptest::collection::vec(op(), 0..80))
}

// ---------------------------------------------------------------------------------------
// The system under test, driven through the pure functions.
// ---------------------------------------------------------------------------------------

/// How often interesting things happened (for the coverage test).
#[derive(Debug, Default)]
struct Coverage(BTreeMap<String, u32>);

impl Coverage {
    fn hit(&mut self, what: impl Into<String>) {
        *self.0.entry(what.into()).or_default() += 1;
    }
}

struct Group {
    spec: AgentGroupSpec,
    phase: Option<GroupPhase>,
    members: Vec<Member>,
    /// Whether each member was ever started (by a plan).
    ever_started: Vec<bool>,
    /// More runs are working than `maxActive` (it was patched below them, or a waiting or
    /// parked run came back while its slot was taken), and they have not yet come back
    /// under it.
    over_max_active: bool,
    coverage: Coverage,
}

fn refusal_name(refused: &AdmissionRefused) -> &'static str {
    match refused {
        AdmissionRefused::Sealed => "Sealed",
        AdmissionRefused::TooManyPending { .. } => "TooManyPending",
        AdmissionRefused::DuplicateTaskKey(_) => "DuplicateTaskKey",
        AdmissionRefused::UnknownDependency(_) => "UnknownDependency",
        AdmissionRefused::AgentMismatch { .. } => "AgentMismatch",
    }
}

impl Group {
    fn new(setup: &Setup) -> Self {
        Group {
            spec: AgentGroupSpec {
                agent: AGENT.to_string(),
                limits: GroupLimits {
                    max_active: setup.max_active,
                    max_pending: setup.max_pending,
                },
                max_cost_usd: setup.max_cost,
                sealed: false,
                evaluation: None,
            },
            phase: None,
            members: Vec::new(),
            ever_started: Vec::new(),
            over_max_active: false,
            coverage: Coverage::default(),
        }
    }

    fn max_active(&self) -> usize {
        to_usize(self.spec.limits.max_active)
    }

    /// The runs that take `maxActive` slots: the working ones.
    fn going(&self) -> usize {
        self.members
            .iter()
            .filter(|m| m.phase == RunPhase::Running)
            .count()
    }

    fn cancelling(&self) -> bool {
        matches!(
            self.phase,
            Some(GroupPhase::Cancelling | GroupPhase::Cancelled)
        )
    }

    /// A member in a phase that `wanted` accepts, chosen by `run`.
    fn pick(&self, run: &Index, wanted: impl Fn(RunPhase) -> bool) -> Option<usize> {
        let eligible: Vec<usize> = (0..self.members.len())
            .filter(|&i| wanted(self.members[i].phase))
            .collect();
        (!eligible.is_empty()).then(|| eligible[run.index(eligible.len())])
    }

    /// Move a member through the lifecycle; the lifecycle must allow it.
    fn transition(&mut self, i: usize, event: RunEvent) -> Result<(), TestCaseError> {
        let member = &mut self.members[i];
        match member.phase.apply(event) {
            Ok(next) => {
                member.phase = next;
                Ok(())
            }
            Err(refused) => Err(TestCaseError::fail(format!(
                "{}: {refused}",
                member.task_key
            ))),
        }
    }

    /// The refusal the spec expects for a new run.
    fn expected_admission(
        &self,
        agent: &str,
        key: &str,
        deps: &[String],
    ) -> Result<(), AdmissionRefused> {
        let known = |k: &str| self.members.iter().any(|m| m.task_key == k);
        let open = !self.spec.sealed && matches!(self.phase, None | Some(GroupPhase::Running));
        if !open {
            return Err(AdmissionRefused::Sealed);
        }
        if agent != AGENT {
            return Err(AdmissionRefused::AgentMismatch {
                run: agent.to_string(),
                group: AGENT.to_string(),
            });
        }
        if known(key) {
            return Err(AdmissionRefused::DuplicateTaskKey(key.to_string()));
        }
        if let Some(missing) = deps.iter().find(|d| !known(d)) {
            return Err(AdmissionRefused::UnknownDependency(missing.clone()));
        }
        let unfinished = self
            .members
            .iter()
            .filter(|m| !m.phase.is_finished())
            .count();
        if unfinished >= to_usize(self.spec.limits.max_pending) {
            return Err(AdmissionRefused::TooManyPending {
                max_pending: self.spec.limits.max_pending,
            });
        }
        Ok(())
    }

    fn update(
        &mut self,
        new: AgentGroupSpec,
        expected: Result<(), UpdateRefused>,
    ) -> Result<(), TestCaseError> {
        let got = check_update(&self.spec, &new);
        prop_assert_eq!(&got, &expected);
        if got.is_ok() {
            self.spec = new;
        }
        Ok(())
    }

    fn step(&mut self, op: &Op) -> Result<(), TestCaseError> {
        match op {
            Op::Add {
                key,
                deps,
                cap,
                wrong_agent,
            } => {
                let key = task_key(*key);
                let deps: Vec<String> = deps
                    .iter()
                    .filter_map(|dep| match dep {
                        Dep::Existing(ix) => (!self.members.is_empty())
                            .then(|| self.members[ix.index(self.members.len())].task_key.clone()),
                        Dep::Raw(k) => Some(task_key(*k)),
                    })
                    .collect();
                let agent = if *wrong_agent { "another-agent" } else { AGENT };
                let got = admit(&self.spec, self.phase, &self.members, agent, &key, &deps);
                prop_assert_eq!(&got, &self.expected_admission(agent, &key, &deps));
                match got {
                    Ok(()) => {
                        self.coverage.hit("admitted");
                        if !deps.is_empty() {
                            self.coverage.hit("admitted with dependencies");
                        }
                        self.members.push(Member {
                            task_key: key,
                            depends_on: deps,
                            cap: *cap,
                            spent: Usd::ZERO,
                            phase: RunPhase::Pending(PendingReason::Queued),
                        });
                        self.ever_started.push(false);
                    }
                    Err(refused) => self
                        .coverage
                        .hit(format!("refused {}", refusal_name(&refused))),
                }
            }
            Op::Seal => {
                let mut new = self.spec.clone();
                new.sealed = true;
                self.update(new, Ok(()))?;
            }
            Op::TryUnseal => {
                let mut new = self.spec.clone();
                new.sealed = false;
                let expected = if self.spec.sealed {
                    self.coverage.hit("unseal refused");
                    Err(UpdateRefused::Unseal)
                } else {
                    Ok(())
                };
                self.update(new, expected)?;
            }
            Op::TryChangeAgent => {
                let mut new = self.spec.clone();
                new.agent = "another-agent".to_string();
                self.update(new, Err(UpdateRefused::AgentChanged))?;
            }
            Op::Reconcile => {
                self.reconcile()?;
            }
            Op::Spend {
                run,
                worst,
                per_mille,
            } => {
                if let Some(i) = self.pick(run, |p| p == RunPhase::Running) {
                    let member = &mut self.members[i];
                    let mut guard = CostGuard::new(Some(member.cap), member.spent);
                    match guard.reserve(*worst) {
                        Ok(reservation) => {
                            let actual = Usd::from_nanos(worst.nanos() * per_mille / 1000);
                            prop_assert!(guard.settle(reservation, actual));
                            member.spent = guard.spent();
                            self.coverage.hit("spent");
                        }
                        Err(refused) => {
                            prop_assert!(refused.needed > refused.left);
                            prop_assert_eq!(refused.left, member.cap.saturating_sub(member.spent));
                            self.coverage.hit("run reached its cap");
                            self.transition(i, RunEvent::Wait(WaitReason::MaxCostReached))?;
                        }
                    }
                }
            }
            Op::Pause { run, choice } => {
                if let Some(i) = self.pick(run, RunPhase::is_started) {
                    let event = match self.members[i].phase {
                        RunPhase::Running => match choice % 3 {
                            0 => RunEvent::Wait(WaitReason::AwaitingMessage),
                            1 => RunEvent::Wait(WaitReason::AwaitingFunds),
                            _ => RunEvent::Park,
                        },
                        RunPhase::Waiting(WaitReason::MaxCostReached) => {
                            // A run at its cap makes no more calls.
                            prop_assert!(self.members[i].phase.apply(RunEvent::Resume).is_err());
                            return self.check_invariants();
                        }
                        RunPhase::Waiting(_) => RunEvent::Resume,
                        _ if choice.is_multiple_of(2) => RunEvent::Resolve(Resolution::Retry),
                        _ => RunEvent::Resolve(Resolution::RecordFailed),
                    };
                    let was = self.members[i].phase;
                    self.transition(i, event)?;
                    if was != RunPhase::Running {
                        self.coverage.hit(if was == RunPhase::NeedsResolution {
                            "a parked run came back"
                        } else {
                            "a waiting run came back"
                        });
                        // It goes on at once, even when its slot was taken meanwhile.
                        if self.going() > self.max_active() {
                            self.over_max_active = true;
                            self.coverage.hit("a run came back over maxActive");
                        }
                    } else {
                        self.coverage
                            .hit(if self.members[i].phase == RunPhase::NeedsResolution {
                                "a run parked"
                            } else {
                                "a run waits"
                            });
                    }
                }
            }
            Op::Finish { run, outcome } => {
                if let Some(i) = self.pick(run, RunPhase::is_started) {
                    let event = match outcome {
                        Outcome::Succeed => RunEvent::Succeed,
                        Outcome::Fail(reason) => RunEvent::Fail(*reason),
                        // What the group's cancel does to a started run, or a person.
                        Outcome::Cancel if self.cancelling() => {
                            RunEvent::Cancel(CancelReason::GroupCancelled)
                        }
                        Outcome::Cancel => RunEvent::Cancel(CancelReason::CancelRequested),
                    };
                    let phase = self.members[i].phase;
                    match phase.apply(event) {
                        Ok(next) => {
                            self.members[i].phase = next;
                            self.coverage.hit(format!("run finished {}", next.name()));
                        }
                        // Only a working run can succeed or fail of an error.
                        Err(_) => prop_assert!(phase != RunPhase::Running),
                    }
                }
            }
            Op::EndQueued { run, deadline } => {
                if let Some(i) = self.pick(run, |p| matches!(p, RunPhase::Pending(_))) {
                    let event = if *deadline {
                        RunEvent::Fail(FailReason::DeadlineExceeded)
                    } else {
                        RunEvent::Cancel(CancelReason::CancelRequested)
                    };
                    self.transition(i, event)?;
                    self.coverage.hit("queued run ended");
                }
            }
            Op::PatchMaxActive(max_active) => {
                let mut new = self.spec.clone();
                new.limits.max_active = *max_active;
                self.update(new, Ok(()))?;
                self.over_max_active = self.going() > self.max_active();
                if self.over_max_active {
                    self.coverage
                        .hit("maxActive lowered below the started runs");
                }
            }
            Op::RaiseCap(by) => {
                if let Some(cap) = self.spec.max_cost_usd {
                    let mut new = self.spec.clone();
                    new.max_cost_usd = Some(cap.saturating_add(*by));
                    self.update(new, Ok(()))?;
                    self.coverage.hit("cap raised");
                }
            }
            Op::TryLowerCap(by) => {
                let (from, to) = match self.spec.max_cost_usd {
                    Some(cap) if !cap.is_zero() => {
                        let to = cap.saturating_sub(*by);
                        (cap.to_string(), to)
                    }
                    Some(_) => return self.check_invariants(),
                    // Adding a cap lowers an unlimited one.
                    None => ("no cap".to_string(), *by),
                };
                let mut new = self.spec.clone();
                new.max_cost_usd = Some(to);
                let expected = Err(UpdateRefused::CapLowered {
                    from,
                    to: to.to_string(),
                });
                self.update(new, expected)?;
                self.coverage.hit("lowering refused");
            }
            Op::CancelGroup => {
                if !self.phase.is_some_and(GroupPhase::is_finished) {
                    self.phase = Some(GroupPhase::Cancelling);
                    self.coverage.hit("group cancelled");
                }
            }
        }
        self.check_invariants()
    }

    /// One reconcile pass, checked against the model, carried out, and checked again.
    fn reconcile(&mut self) -> Result<Plan, TestCaseError> {
        let started_before = self.going();
        let max_active = self.max_active();
        let plan = reconcile(&self.spec, self.phase, &self.members);
        check_plan_against_model(&self.spec, self.phase, &self.members, &plan)?;

        // Never start a run while maxActive runs are going.
        prop_assert!(
            plan.start.len() <= max_active.saturating_sub(started_before),
            "started {} with {} of {} going",
            plan.start.len(),
            started_before,
            max_active
        );

        for &i in &plan.start {
            for key in &self.members[i].depends_on {
                let dep = self
                    .members
                    .iter()
                    .find(|m| &m.task_key == key)
                    .expect("dependency");
                prop_assert_eq!(
                    dep.phase,
                    RunPhase::Succeeded,
                    "{} started before {}",
                    &self.members[i].task_key,
                    key
                );
            }
            self.transition(i, RunEvent::Start)?;
            self.ever_started[i] = true;
            self.coverage.hit("run started");
        }
        for &(i, reason) in &plan.cancel {
            self.transition(i, RunEvent::Cancel(reason))?;
            self.coverage
                .hit(format!("cancelled {}", RunPhase::Cancelled(reason)));
            if reason == CancelReason::DependencyCancelled
                && self.members[i].depends_on.iter().any(|key| {
                    plan.cancel
                        .iter()
                        .any(|&(d, _)| &self.members[d].task_key == key)
                })
            {
                self.coverage.hit("transitive cancellation in one pass");
            }
        }
        for &(i, reason) in &plan.queue {
            self.transition(i, RunEvent::Queue(reason))?;
        }
        // No run waits for a slot while a slot is free: waiting and parked runs take none
        // (runs parked by a crash cannot stall the group).
        if plan
            .status
            .blocked_reasons
            .contains_key(&BlockedReason::MaxActiveReached)
        {
            prop_assert!(
                self.going() >= max_active,
                "a run waits for a slot with {} of {} working",
                self.going(),
                max_active
            );
        }
        for reason in plan.status.blocked_reasons.keys() {
            self.coverage.hit(format!("blocked {reason:?}"));
        }

        // The status describes the group after the plan.
        let counts = counts_of(&self.members);
        prop_assert_eq!(plan.status.counts, counts);
        let total = counts.queued
            + counts.active
            + counts.waiting
            + counts.parked
            + counts.succeeded
            + counts.failed
            + counts.cancelled;
        prop_assert_eq!(to_usize(total), self.members.len());
        prop_assert_eq!(
            plan.status.blocked_reasons.values().sum::<u32>(),
            counts.queued
        );

        // The cascade is complete in one pass; queued runs say why they wait.
        let phase_of = |key: &String| {
            self.members
                .iter()
                .find(|m| &m.task_key == key)
                .map(|m| m.phase)
                .expect("dependency")
        };
        for m in &self.members {
            let RunPhase::Pending(reason) = m.phase else {
                continue;
            };
            prop_assert!(
                !self.cancelling(),
                "{} still queued in a cancelled group",
                m.task_key
            );
            let deps: Vec<RunPhase> = m.depends_on.iter().map(phase_of).collect();
            prop_assert!(
                !deps
                    .iter()
                    .any(|p| matches!(p, RunPhase::Failed(_) | RunPhase::Cancelled(_))),
                "{} still queued after a dependency ended: {:?}",
                m.task_key,
                deps
            );
            let waits_for_dependency = deps.iter().any(|&p| p != RunPhase::Succeeded);
            let expected = if waits_for_dependency {
                PendingReason::DependencyWait
            } else {
                PendingReason::GroupWait
            };
            prop_assert_eq!(reason, expected, "reason of {}", &m.task_key);
        }

        // The group's phase.
        let phase = plan.status.phase.expect("reconcile always says the phase");
        let all_finished = self.members.iter().all(|m| m.phase.is_finished());
        let failure = self.members.iter().any(|m| {
            matches!(
                m.phase,
                RunPhase::Failed(_) | RunPhase::Cancelled(CancelReason::DependencyFailed)
            )
        });
        for m in &self.members {
            prop_assert_eq!(
                counts_as_failure(m.phase),
                matches!(
                    m.phase,
                    RunPhase::Failed(_) | RunPhase::Cancelled(CancelReason::DependencyFailed)
                )
            );
        }
        if self.cancelling() {
            prop_assert_eq!(phase.is_finished(), all_finished);
            prop_assert!(matches!(
                phase,
                GroupPhase::Cancelling | GroupPhase::Cancelled
            ));
        } else if self.spec.sealed && all_finished {
            let expected = if failure {
                GroupPhase::FailedRunsFailed
            } else {
                GroupPhase::Succeeded
            };
            prop_assert_eq!(phase, expected);
        } else {
            prop_assert_eq!(phase, GroupPhase::Running);
        }
        self.phase = Some(phase);

        // Carrying out the plan and reconciling again decides nothing new.
        let again = reconcile(&self.spec, self.phase, &self.members);
        prop_assert!(
            again.start.is_empty() && again.cancel.is_empty(),
            "{:?}",
            again
        );
        prop_assert_eq!(again.status.phase, plan.status.phase);
        prop_assert_eq!(again.status.counts, plan.status.counts);
        Ok(plan)
    }

    fn check_invariants(&mut self) -> Result<(), TestCaseError> {
        // Concurrency: never more than maxActive working, unless maxActive was lowered below
        // the runs already working (they are not stopped) or a waiting or parked run came
        // back (it is not held back), and they have not yet come back under it.
        let going = self.going();
        if going <= self.max_active() {
            self.over_max_active = false;
        }
        prop_assert!(
            self.over_max_active || going <= self.max_active(),
            "{} working with maxActive {}",
            going,
            self.max_active()
        );

        // Money: each run under its cap; the group's spend, and even the spend its started
        // runs could still reach, under the group's cap, whatever the order of completions.
        let mut total = Usd::ZERO;
        let mut committed = Usd::ZERO;
        for m in &self.members {
            prop_assert!(
                m.spent <= m.cap,
                "{} spent {} of {}",
                m.task_key,
                m.spent,
                m.cap
            );
            if matches!(m.phase, RunPhase::Pending(_)) {
                prop_assert!(m.spent.is_zero());
            }
            total = total.checked_add(m.spent).expect("small amounts");
            let bound = if m.phase.is_started() { m.cap } else { m.spent };
            committed = committed.checked_add(bound).expect("small amounts");
        }
        if let Some(cap) = self.spec.max_cost_usd {
            prop_assert!(total <= cap, "group spent {} of {}", total, cap);
            prop_assert!(committed <= cap, "group committed {} of {}", committed, cap);
        }

        // Dependencies: whatever started had every dependency succeeded.
        for (i, m) in self.members.iter().enumerate() {
            let has_run = m.phase.is_started() || m.phase == RunPhase::Succeeded;
            prop_assert!(
                self.ever_started[i] || !has_run,
                "{} started outside a plan",
                m.task_key
            );
            if self.ever_started[i] {
                for key in &m.depends_on {
                    let dep = self.members.iter().find(|d| &d.task_key == key);
                    prop_assert_eq!(dep.map(|d| d.phase), Some(RunPhase::Succeeded));
                }
            }
        }

        // A finished group has only finished runs.
        if self.phase.is_some_and(GroupPhase::is_finished) {
            prop_assert!(self.members.iter().all(|m| m.phase.is_finished()));
        }
        Ok(())
    }

    /// Seal the group and drive it to a finished phase: finish every started run, and raise
    /// the cap when the only thing in the way is money.
    fn drain(&mut self) -> Result<(), TestCaseError> {
        if !self.spec.sealed {
            self.step(&Op::Seal)?;
        }
        let mut rounds = 0;
        loop {
            rounds += 1;
            prop_assert!(
                rounds <= 3 * self.members.len() + 10,
                "the group never finishes"
            );
            let plan = self.reconcile()?;
            self.check_invariants()?;
            if self.phase.is_some_and(GroupPhase::is_finished) {
                break;
            }
            let started: Vec<usize> = (0..self.members.len())
                .filter(|&i| self.members[i].phase.is_started())
                .collect();
            if started.is_empty() {
                // Nothing going and nothing started: only money can be in the way.
                prop_assert!(plan.start.is_empty());
                prop_assert!(
                    plan.status
                        .blocked_reasons
                        .contains_key(&BlockedReason::MaxCostReached),
                    "stuck with {:?}",
                    plan.status.blocked_reasons
                );
                prop_assert!(
                    !plan
                        .status
                        .blocked_reasons
                        .contains_key(&BlockedReason::MaxActiveReached)
                );
                let needed: Usd = self.members.iter().map(|m| m.cap).sum();
                self.coverage.hit("drain raised the cap");
                self.step(&Op::RaiseCap(needed))?;
                continue;
            }
            for i in started {
                let event = match self.members[i].phase {
                    _ if self.cancelling() => RunEvent::Cancel(CancelReason::GroupCancelled),
                    RunPhase::Running if (i + rounds).is_multiple_of(7) => {
                        RunEvent::Fail(FailReason::ModelCallFailed)
                    }
                    RunPhase::Running => RunEvent::Succeed,
                    _ => RunEvent::Cancel(CancelReason::CancelRequested),
                };
                self.transition(i, event)?;
                self.check_invariants()?;
            }
        }
        let phase = self.phase.expect("reconciled");
        self.coverage.hit(format!("group ended {phase:?}"));
        if self.members.is_empty() && phase == GroupPhase::Succeeded {
            self.coverage.hit("empty group succeeded");
        }
        Ok(())
    }
}

fn run_scenario(setup: &Setup, ops: &[Op]) -> Result<Coverage, TestCaseError> {
    let mut group = Group::new(setup);
    group.check_invariants()?;
    for op in ops {
        group.step(op)?;
    }
    group.drain()?;
    // A finished group takes no new runs.
    let refused = admit(&group.spec, group.phase, &group.members, AGENT, "late", &[]);
    prop_assert_eq!(refused, Err(AdmissionRefused::Sealed));
    Ok(group.coverage)
}

// ---------------------------------------------------------------------------------------
// Arbitrary snapshots, for states the interleavings reach rarely.
// ---------------------------------------------------------------------------------------

fn snapshot() -> impl Strategy<Value = (AgentGroupSpec, Option<GroupPhase>, Vec<Member>)> {
    let phases = RunPhase::all();
    let member = (
        proptest::collection::vec(any::<Index>(), 0..=3),
        amount(1, 20),
        0u64..=1200,
        proptest::sample::select(phases),
    );
    let group_phase = proptest::option::of(proptest::sample::select(vec![
        GroupPhase::Running,
        GroupPhase::Cancelling,
        GroupPhase::Cancelled,
        GroupPhase::Succeeded,
        GroupPhase::FailedRunsFailed,
    ]));
    (
        setup(),
        any::<bool>(),
        group_phase,
        proptest::collection::vec(member, 0..40),
    )
        .prop_map(|(setup, sealed, phase, raw)| {
            let mut members: Vec<Member> = Vec::with_capacity(raw.len());
            for (i, (deps, cap, per_mille, phase)) in raw.into_iter().enumerate() {
                let mut depends_on: Vec<String> = if i == 0 {
                    Vec::new()
                } else {
                    deps.iter()
                        .map(|d| members[d.index(i)].task_key.clone())
                        .collect()
                };
                depends_on.dedup();
                // Up to 20% over the cap once a run has started: a worst case that was wrong.
                let spent = match phase {
                    RunPhase::Pending(_) => Usd::ZERO,
                    _ => Usd::from_nanos(cap.nanos() * per_mille / 1000),
                };
                members.push(Member {
                    task_key: format!("t{i}"),
                    depends_on,
                    cap,
                    spent,
                    phase,
                });
            }
            let spec = AgentGroupSpec {
                agent: AGENT.to_string(),
                limits: GroupLimits {
                    max_active: setup.max_active,
                    max_pending: setup.max_pending,
                },
                max_cost_usd: setup.max_cost,
                sealed,
                evaluation: None,
            };
            (spec, phase, members)
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1500, ..ProptestConfig::default() })]

    /// Any interleaving of admissions, seals, patches, reconciles, spending and completions
    /// keeps every invariant, and the group always finishes once sealed.
    #[test]
    fn random_interleavings_keep_every_invariant((setup, ops) in scenario()) {
        run_scenario(&setup, &ops)?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 4000, ..ProptestConfig::default() })]

    /// On any snapshot of members, one reconcile pass is what the model says.
    #[test]
    fn reconcile_matches_the_model_on_any_snapshot((spec, phase, members) in snapshot()) {
        let plan = reconcile(&spec, phase, &members);
        check_plan_against_model(&spec, phase, &members, &plan)?;
        let mut after = members.clone();
        for &i in &plan.start {
            after[i].phase = RunPhase::Running;
        }
        for &(i, reason) in &plan.cancel {
            after[i].phase = RunPhase::Cancelled(reason);
        }
        prop_assert_eq!(plan.status.counts, counts_of(&after));
        let started_before = members
            .iter()
            .filter(|m| m.phase == RunPhase::Running)
            .count();
        prop_assert!(
            plan.start.len() <= to_usize(spec.limits.max_active).saturating_sub(started_before)
        );
    }
}

/// The generator reaches every case the properties are about; without this, a property
/// could pass because its interesting branch never runs.
#[test]
fn the_generator_reaches_every_interesting_case() {
    let mut runner = TestRunner::deterministic();
    let strategy = scenario();
    let mut coverage = Coverage::default();
    for _ in 0..400 {
        let (setup, ops) = strategy
            .new_tree(&mut runner)
            .expect("generate a scenario")
            .current();
        let seen = run_scenario(&setup, &ops).expect("the properties hold");
        for (what, n) in seen.0 {
            *coverage.0.entry(what).or_default() += n;
        }
    }
    let expected = [
        "admitted",
        "admitted with dependencies",
        "refused Sealed",
        "refused TooManyPending",
        "refused DuplicateTaskKey",
        "refused UnknownDependency",
        "refused AgentMismatch",
        "unseal refused",
        "lowering refused",
        "cap raised",
        "run started",
        "spent",
        "run reached its cap",
        "run finished Succeeded",
        "run finished Failed",
        "run finished Cancelled",
        "queued run ended",
        "cancelled Cancelled (DependencyFailed)",
        "cancelled Cancelled (DependencyCancelled)",
        "cancelled Cancelled (GroupCancelled)",
        "transitive cancellation in one pass",
        "blocked DependencyWait",
        "blocked MaxActiveReached",
        "blocked MaxCostReached",
        "maxActive lowered below the started runs",
        "a run parked",
        "a run waits",
        "a parked run came back",
        "a waiting run came back",
        "a run came back over maxActive",
        "group cancelled",
        "drain raised the cap",
        "group ended Succeeded",
        "group ended FailedRunsFailed",
        "group ended Cancelled",
        "empty group succeeded",
    ];
    let missing: Vec<&str> = expected
        .into_iter()
        .filter(|what| !coverage.0.contains_key(*what))
        .collect();
    assert!(
        missing.is_empty(),
        "never reached: {missing:?}\nreached: {:#?}",
        coverage.0
    );
}

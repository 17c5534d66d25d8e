//! Admission decisions per second on a 10,000-run group with dependencies.
//!
//! The group is 100 blocks of 100 runs. A block's head fans in on the nine chain tails of
//! the block before; nine chains of ten runs hang off the head; the last nine runs of a
//! block are independent tasks that can start whenever there is room. `reconcile` makes one
//! decision per member (start, cancel or keep queued, or pass over a run that is going or
//! finished), so its throughput is reported in members per second.

use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use nodus_core::group::{Member, admit, reconcile};
use nodus_core::lifecycle::{CancelReason, FailReason, PendingReason, RunPhase, WaitReason};
use nodus_core::money::Usd;
use nodus_core::resource::{AgentGroupSpec, GroupLimits};

const RUNS: usize = 10_000;
const BLOCK: usize = 100;
const CHAINS: usize = 9;
const CHAIN: usize = 10;
/// The first independent position of a block.
const INDEPENDENT: usize = 1 + CHAINS * CHAIN;

fn key(i: usize) -> String {
    format!("task-{i}")
}

/// The tails of the chains of the block that starts at `head`.
fn tails(head: usize) -> impl Iterator<Item = usize> {
    (1..=CHAINS).map(move |c| head + c * CHAIN)
}

fn depends_on(i: usize) -> Vec<String> {
    let position = i % BLOCK;
    let head = i - position;
    if position == 0 {
        // Fan-in on the chain tails of the block before.
        match head.checked_sub(BLOCK) {
            Some(previous) => tails(previous).map(key).collect(),
            None => Vec::new(),
        }
    } else if position >= INDEPENDENT {
        Vec::new()
    } else if position % CHAIN == 1 {
        // A chain starts from its block's head.
        vec![key(head)]
    } else {
        vec![key(i - 1)]
    }
}

fn spec() -> AgentGroupSpec {
    AgentGroupSpec {
        agent: "worker".to_string(),
        limits: GroupLimits {
            max_active: 200,
            max_pending: GroupLimits::DEFAULT_MAX_PENDING,
        },
        // The mixed group has spent $160.04 and holds $1.80: room for 151 more runs at $0.10,
        // fewer than the free slots.
        max_cost_usd: Some(Usd::from_cents(17_700)),
        sealed: false,
        evaluation: None,
    }
}

/// 10,000 runs, all queued: a group's first reconcile.
fn fresh_group() -> Vec<Member> {
    (0..RUNS)
        .map(|i| Member {
            task_key: key(i),
            depends_on: depends_on(i),
            cap: Usd::from_cents(10),
            spent: Usd::ZERO,
            phase: RunPhase::Pending(PendingReason::Queued),
        })
        .collect()
}

/// 10,000 runs part way through: the first 40 blocks finished (mostly succeeded, spending
/// $0.04 each), in block 40 the head succeeded and the first run of every chain and the
/// independent runs are going (in every started phase), the rest queued.
fn mixed_group() -> Vec<Member> {
    let mut members = fresh_group();
    let going = 40;
    for (i, member) in members.iter_mut().enumerate() {
        let block = i / BLOCK;
        let position = i % BLOCK;
        if block < going || (block == going && position == 0) {
            member.phase = match i % 50 {
                0 => RunPhase::Cancelled(CancelReason::CancelRequested),
                _ => RunPhase::Succeeded,
            };
            member.spent = Usd::from_cents(4);
        } else if block == going && (position % CHAIN == 1 || position >= INDEPENDENT) {
            member.phase = match i % 4 {
                0 => RunPhase::Running,
                1 => RunPhase::Waiting(WaitReason::AwaitingMessage),
                2 => RunPhase::NeedsResolution,
                _ => RunPhase::Waiting(WaitReason::MaxCostReached),
            };
            member.spent = Usd::from_cents(2);
        } else {
            member.phase = RunPhase::Pending(PendingReason::DependencyWait);
        }
    }
    members
}

/// The mixed group just after the first run of block 40's first chain failed: the failure
/// cancels, transitively, every queued run after it but the independent ones.
fn cascading_group() -> Vec<Member> {
    let mut members = mixed_group();
    members[40 * BLOCK + 1].phase = RunPhase::Failed(FailReason::ModelCallFailed);
    members
}

fn bench_reconcile(c: &mut Criterion) {
    let spec = spec();
    let mut group = c.benchmark_group("reconcile_10k");
    group.throughput(Throughput::Elements(RUNS as u64));
    for (name, members) in [
        ("fresh", fresh_group()),
        ("mixed", mixed_group()),
        ("failure_cascade", cascading_group()),
    ] {
        let plan = reconcile(&spec, None, &members);
        eprintln!(
            "{name}: {} start, {} cancel, {} stay queued",
            plan.start.len(),
            plan.cancel.len(),
            plan.queue.len()
        );
        group.bench_function(name, |b| {
            b.iter(|| reconcile(black_box(&spec), None, black_box(&members)))
        });
    }
    group.finish();
}

fn bench_admit(c: &mut Criterion) {
    let spec = spec();
    let members = mixed_group();
    // A new head fanning in on the last block's nine chain tails and an independent run.
    let fan_in: Vec<String> = tails(RUNS - BLOCK).chain([RUNS - 1]).map(key).collect();
    assert_eq!(
        admit(&spec, None, &members, "worker", "new", &fan_in),
        Ok(())
    );
    let mut group = c.benchmark_group("admit_into_10k");
    group.throughput(Throughput::Elements(1));
    group.bench_function("no_dependencies", |b| {
        b.iter(|| {
            admit(
                black_box(&spec),
                None,
                black_box(&members),
                "worker",
                "new",
                &[],
            )
        })
    });
    group.bench_function("ten_dependencies", |b| {
        b.iter(|| {
            admit(
                black_box(&spec),
                None,
                black_box(&members),
                "worker",
                "new",
                black_box(&fan_in),
            )
        })
    });
    group.finish();
}

criterion_group!(benches, bench_reconcile, bench_admit);
criterion_main!(benches);

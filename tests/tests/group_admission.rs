//! Admission of new runs to a group through the engine: it reads the same from the store
//! whether the group has ten members or a thousand (a store wrapper counts the reads and the
//! documents they return), and it keeps every rule (a taken task key, an unknown dependency,
//! `maxPending` counting only unfinished runs, a sealed group), here on SQLite, whose count of
//! a group's runs comes from its index.

mod support;

use std::sync::Arc;

use nodus_core::engine::{Engine, Error};
use nodus_core::group::AdmissionRefused;
use nodus_core::lifecycle::RunPhase;
use nodus_core::resource::{AgentGroup, AgentGroupSpec, AgentRun, GroupLimits, Kind};
use nodus_core::testing::Drive;
use support::{CountingStore, PROJECT, World, agent, run, run_phase};

fn group_spec() -> AgentGroupSpec {
    AgentGroupSpec {
        agent: "worker".to_string(),
        limits: GroupLimits::default(),
        max_cost_usd: None,
        sealed: false,
        evaluation: None,
    }
}

/// Task `key` of group `g`, depending on `deps`.
fn task(key: &str, deps: &[&str]) -> AgentRun {
    let mut r = run("", "worker", &format!("Run `echo {key}`."), |s| {
        s.group = Some("g".to_string());
        s.task_key = Some(key.to_string());
        s.depends_on = deps.iter().map(|d| (*d).to_string()).collect();
    });
    r.metadata.name = None;
    r
}

/// The store reads (and documents read) of creating task `t{i}` singly, depending on the one
/// before, and of a batch of ten more, each depending on one earlier task.
async fn reads_to_add(engine: &Engine, store: &CountingStore, i: usize) -> [(usize, usize); 2] {
    let before = store.seen();
    engine
        .create_run(PROJECT, task(&format!("t{i}"), &[&format!("t{}", i - 1)]))
        .await
        .expect("one more member");
    let single = store.seen();
    let batch = (1..=10)
        .map(|j| task(&format!("t{i}-{j}"), &[&format!("t{}", i - j)]))
        .collect();
    engine
        .create_runs(PROJECT, batch, None)
        .await
        .expect("a batch of members");
    let after = store.seen();
    [
        (single.0 - before.0, single.1 - before.1),
        (after.0 - single.0, after.1 - single.1),
    ]
}

#[tokio::test]
async fn adding_a_member_reads_the_same_at_a_thousand_members_as_at_ten() {
    let store = Arc::new(CountingStore::default());
    let world = World::over_store(Vec::new(), store.clone());
    let engine = world.engine();
    engine
        .apply_agent(PROJECT, agent("worker", |_| {}))
        .await
        .expect("agent");
    engine
        .apply_group(PROJECT, AgentGroup::new("g", group_spec()))
        .await
        .expect("group");
    engine
        .create_run(PROJECT, task("t0", &[]))
        .await
        .expect("the first member");
    let mut created = 1;
    while created < 10 {
        engine
            .create_run(PROJECT, task(&format!("t{created}"), &[]))
            .await
            .expect("a member");
        created += 1;
    }
    let at_ten = reads_to_add(&engine, &store, created).await;
    created += 1;
    // A thousand members, in batches.
    while created < 1_000 {
        let batch: Vec<AgentRun> = (created..(created + 100).min(1_000))
            .map(|i| task(&format!("t{i}"), &[]))
            .collect();
        created += batch.len();
        engine
            .create_runs(PROJECT, batch, None)
            .await
            .expect("members");
    }
    let agent_reads = store.gets_of_kind(Kind::Agent);
    let at_a_thousand = reads_to_add(&engine, &store, created).await;
    assert_eq!(
        store.gets_of_kind(Kind::Agent) - agent_reads,
        2,
        "a run alone and a batch of ten each read their agent once"
    );
    assert_eq!(
        at_ten, at_a_thousand,
        "(reads, documents read) adding a member singly and ten in a batch, at 10 members \
         and at 1,000"
    );
}

/// Two batches joining one group at once: the second checks `maxPending` only once the
/// first's runs are written, so the two never pass it together. The first batch's write is
/// held (a store wrapper pauses it); the second waits to join, and once the first is written
/// it is refused.
#[tokio::test]
async fn two_batches_joining_a_group_at_once_never_both_pass_max_pending() {
    let mut spec = group_spec();
    spec.limits.max_pending = 1;
    let (store, _dir) = pausable_with_group(spec).await;
    let engine = World::over_store(Vec::new(), store.clone()).engine();
    let (reached, go_on) = store.pause_before_next("create a batch of");
    let first = joining(&engine, "a");
    reached.notified().await;
    let second = joining(&engine, "b");
    // Settled: the second batch waits to join the group (one that did not wait would pass
    // maxPending beside the first, whose run is not written yet).
    waits_to_join(
        &engine,
        &second,
        "the second batch never waited for the first one's write",
    )
    .await;
    assert!(
        !second.is_finished(),
        "the second batch went on past the first"
    );
    go_on.notify_one();
    first.await.expect("first").expect("the first batch joins");
    match second.await.expect("second") {
        Err(Error::Admission(AdmissionRefused::TooManyPending { max_pending: 1 })) => {}
        other => panic!("the second batch must be refused by maxPending: {other:?}"),
    }
}

/// A group sealed while a batch joins it: the seal waits for the batch's write (the batch was
/// admitted to the group unsealed), and a batch after the seal is refused. The first batch's
/// write is held (a store wrapper pauses it) while the seal is asked for.
#[tokio::test]
async fn a_group_sealed_while_a_batch_joins_it_is_sealed_after_the_batch_is_written() {
    let spec = group_spec();
    let (store, _dir) = pausable_with_group(spec.clone()).await;
    let engine = World::over_store(Vec::new(), store.clone()).engine();
    let (reached, go_on) = store.pause_before_next("create a batch of");
    let batch = joining(&engine, "a");
    reached.notified().await;
    let sealing = tokio::spawn({
        let engine = engine.clone();
        let mut sealed = spec.clone();
        sealed.sealed = true;
        async move {
            engine
                .apply_group(PROJECT, AgentGroup::new("g", sealed))
                .await
        }
    });
    waits_to_join(
        &engine,
        &sealing,
        "the seal was written while a batch admitted to the unsealed group was not",
    )
    .await;
    go_on.notify_one();
    batch
        .await
        .expect("joining")
        .expect("the batch admitted before the seal is written");
    let group = sealing.await.expect("sealing").expect("the seal");
    assert!(group.spec.sealed);
    match engine
        .create_runs(PROJECT, vec![task("b", &[])], None)
        .await
    {
        Err(Error::Admission(AdmissionRefused::Sealed)) => {}
        other => panic!("a batch after the seal must be refused: {other:?}"),
    }
}

/// Two replicas (two engines over one store, each with its own admission locks) admitting to
/// one group at once: the first replica's batch has read the group and passed `maxPending` but
/// is held before its write; the second replica, which does not wait for it, passes the same
/// check on the same counts and writes its run. The first batch's write is then refused by
/// the store, which checks the cap in that write, and the engine answers it as the admission
/// refusal it is.
#[tokio::test]
async fn two_replicas_joining_a_group_at_once_never_both_pass_max_pending() {
    let mut spec = group_spec();
    spec.limits.max_pending = 1;
    let (store, _dir) = pausable_with_group(spec).await;
    let replica_a = World::over_store(Vec::new(), store.clone()).engine();
    let replica_b = World::over_store(Vec::new(), store.clone()).engine();
    let (reached, go_on) = store.pause_before_next("create a batch of");
    let first = tokio::spawn(async move {
        replica_a
            .create_runs(PROJECT, vec![task("a", &[])], None)
            .await
    });
    reached.notified().await;
    replica_b
        .create_runs(PROJECT, vec![task("b", &[])], None)
        .await
        .expect("the other replica's batch joins");
    go_on.notify_one();
    match first.await.expect("first") {
        Err(Error::Admission(AdmissionRefused::TooManyPending { max_pending: 1 })) => {}
        other => panic!("the held batch must be refused by maxPending: {other:?}"),
    }
    replica_b
        .get_run(PROJECT, "g-b")
        .await
        .expect("the other replica's run is written");
    assert!(
        replica_b.get_run(PROJECT, "g-a").await.is_err(),
        "nothing of the refused batch is written"
    );
}

/// A group sealed on one replica while a batch admitted to it unsealed on another is held
/// before its write (the second replica does not share the first's admission locks, so the
/// seal does not wait for it): the store reads the group in the batch's write and refuses it,
/// and the engine answers it as the admission refusal a sealed group gives. Nothing of it is
/// written, and the group has no member.
#[tokio::test]
async fn a_batch_admitted_on_one_replica_is_refused_when_another_sealed_the_group_meanwhile() {
    let spec = group_spec();
    let (store, _dir) = pausable_with_group(spec.clone()).await;
    let replica_a = World::over_store(Vec::new(), store.clone()).engine();
    let replica_b = World::over_store(Vec::new(), store.clone()).engine();
    let (reached, go_on) = store.pause_before_next("create a batch of");
    let batch = joining(&replica_a, "a");
    reached.notified().await;
    let mut sealed = spec;
    sealed.sealed = true;
    replica_b
        .apply_group(PROJECT, AgentGroup::new("g", sealed))
        .await
        .expect("the other replica seals the group");
    go_on.notify_one();
    match batch.await.expect("joining") {
        Err(Error::Admission(AdmissionRefused::Sealed)) => {}
        other => panic!("the held batch must be refused: the group is sealed: {other:?}"),
    }
    assert!(
        replica_b.get_run(PROJECT, "g-a").await.is_err(),
        "nothing of the refused batch is written"
    );
    assert_eq!(
        nodus_core::Store::group_phases(store.as_ref(), PROJECT, "g")
            .await
            .expect("phases"),
        Vec::new(),
        "the sealed group has no member"
    );
}

/// Returns once `task` waits for group `g`'s joining lock in `engine` (one waiter); fails
/// with `never` if the task ends first, or after 20 s.
async fn waits_to_join<T>(engine: &Engine, task: &tokio::task::JoinHandle<T>, never: &str) {
    let give_up = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while engine.joining_waiting(PROJECT, "g") != 1 {
        assert!(
            std::time::Instant::now() < give_up && !task.is_finished(),
            "{never}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
}

/// A batch of task `key` of group `g` joining it through `engine`, in a task of its own.
fn joining(
    engine: &Engine,
    key: &str,
) -> tokio::task::JoinHandle<nodus_core::engine::Result<Vec<AgentRun>>> {
    let (engine, batch) = (engine.clone(), vec![task(key, &[])]);
    tokio::spawn(async move { engine.create_runs(PROJECT, batch, None).await })
}

/// [`on_sqlite_with_group`]'s store behind a wrapper that can pause its next write of a
/// kind (`pause_before_next`), for engines that a test makes over it.
async fn pausable_with_group(
    spec: AgentGroupSpec,
) -> (Arc<support::CrashingStore>, tempfile::TempDir) {
    let (engine, dir) = on_sqlite_with_group(spec).await;
    let store = Arc::new(support::CrashingStore::at_any_write(
        engine.store().clone(),
        usize::MAX,
        support::CrashMode::AfterWrite,
    ));
    (store, dir)
}

/// An engine on a new SQLite store (in the returned directory) with agent `worker` and its
/// group `g` of `spec`.
async fn on_sqlite_with_group(spec: AgentGroupSpec) -> (Engine, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let sqlite = nodus_store::SqliteStore::open(dir.path().join("nodus.db"))
        .await
        .expect("open a SQLite store");
    let engine = World::over_store(Vec::new(), Arc::new(sqlite)).engine();
    engine
        .apply_agent(PROJECT, agent("worker", |_| {}))
        .await
        .expect("agent");
    engine
        .apply_group(PROJECT, AgentGroup::new("g", spec))
        .await
        .expect("group");
    (engine, dir)
}

#[tokio::test]
async fn admission_keeps_every_rule_on_sqlite() {
    let mut spec = group_spec();
    spec.limits.max_pending = 3;
    let (engine, _dir) = on_sqlite_with_group(spec.clone()).await;
    fn refused<T: std::fmt::Debug>(result: Result<T, Error>) -> AdmissionRefused {
        match result {
            Err(Error::Admission(refused)) => refused,
            other => panic!("not refused by admission: {other:?}"),
        }
    }
    engine
        .create_runs(PROJECT, vec![task("a", &[]), task("b", &["a"])], None)
        .await
        .expect("a, and b after it in the same batch");
    // A run outside the group with a task's name is not a task of it.
    engine
        .create_run(PROJECT, run("g-x", "worker", "Run `echo x`.", |_| {}))
        .await
        .expect("a run of no group");
    assert_eq!(
        refused(engine.create_run(PROJECT, task("c", &["x"])).await),
        AdmissionRefused::UnknownDependency("x".to_string())
    );
    assert_eq!(
        refused(engine.create_run(PROJECT, task("a", &[])).await),
        AdmissionRefused::DuplicateTaskKey("a".to_string())
    );
    assert_eq!(
        refused(
            engine
                .create_runs(PROJECT, vec![task("c", &[]), task("c2", &["c", "z"])], None)
                .await
        ),
        AdmissionRefused::UnknownDependency("z".to_string())
    );
    assert!(
        engine.get_run(PROJECT, "g-c").await.is_err(),
        "a refused batch writes nothing"
    );
    // Three unfinished members fill maxPending 3; a finished one does not count.
    engine
        .create_run(PROJECT, task("c", &[]))
        .await
        .expect("the third");
    assert_eq!(
        refused(engine.create_run(PROJECT, task("d", &[])).await),
        AdmissionRefused::TooManyPending { max_pending: 3 }
    );
    engine.cancel_run(PROJECT, "g-a").await.expect("cancel a");
    let a = engine.get_run(PROJECT, "g-a").await.expect("a");
    assert!(
        a.status.phase.is_some_and(RunPhase::is_finished),
        "{:?}",
        a.status.phase
    );
    engine
        .create_run(PROJECT, task("d", &["a"]))
        .await
        .expect("a finished member leaves room, and is still a task of the group");
    spec.sealed = true;
    engine
        .apply_group(PROJECT, AgentGroup::new("g", spec))
        .await
        .expect("seal");
    assert_eq!(
        refused(engine.create_run(PROJECT, task("e", &[])).await),
        AdmissionRefused::Sealed
    );
}

/// A run that joins a group whose slots are all held is created saying it waits for one
/// (`GroupWait`), so the group's reconcile has nothing to rewrite in it (its version stays);
/// one with room, or with a dependency, is created `Queued` for the reconcile to decide.
#[tokio::test]
async fn a_run_joining_a_full_group_is_created_waiting_for_a_slot() {
    use nodus_core::lifecycle::PendingReason;
    use nodus_core::testing::Drive as _;
    let mut spec = group_spec();
    spec.limits.max_active = 1;
    let (engine, _dir) = on_sqlite_with_group(spec).await;
    let phase = |name| run_phase(&engine, name);
    engine.create_run(PROJECT, task("a", &[])).await.expect("a");
    assert_eq!(
        phase("g-a").await,
        Some(RunPhase::Pending(PendingReason::Queued)),
        "a free slot: the reconcile starts it"
    );
    engine
        .reconcile_group(PROJECT, "g")
        .await
        .expect("reconcile");
    assert_eq!(phase("g-a").await, Some(RunPhase::Running));
    engine
        .create_runs(PROJECT, vec![task("b", &[]), task("c", &["a"])], None)
        .await
        .expect("b, and c after a");
    assert_eq!(
        phase("g-b").await,
        Some(RunPhase::Pending(PendingReason::GroupWait)),
        "every slot held: b says so from the start"
    );
    assert_eq!(
        phase("g-c").await,
        Some(RunPhase::Pending(PendingReason::Queued)),
        "a dependency: the reconcile decides"
    );
    let version = |name| {
        let engine = &engine;
        async move {
            let run = engine.get_run(PROJECT, name).await.expect("run");
            run.metadata.resource_version
        }
    };
    let b_before = version("g-b").await;
    engine
        .reconcile_group(PROJECT, "g")
        .await
        .expect("reconcile");
    assert_eq!(version("g-b").await, b_before, "nothing rewritten in b");
    assert_eq!(
        phase("g-c").await,
        Some(RunPhase::Pending(PendingReason::DependencyWait))
    );
}

//! The Runner of nodus-core on the in-memory store and a manual clock, with no server: a
//! deadline wakes a waiting run when the clock passes it, waiting runs hold no task, no more
//! runs are driven at once than its bound and those queued beyond it hold no task, a group
//! with dependencies runs under maxActive and its cost cap, the retention sweep runs by the
//! clock, a rescore of an evaluation group whose payloads it removed is refused, and neither a
//! run's drive nor a group's reconcile is woken again by its own writes.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use nodus_core::catalog::Family;
use nodus_core::engine::{Config, Deps, Engine};
use nodus_core::group::GroupPhase;
use nodus_core::lifecycle::{FailReason, RunPhase, WaitReason};
use nodus_core::resource::{AgentGroup, AgentGroupSpec, AgentRun, Kind};
use nodus_core::router::FixedRouter;
use nodus_core::runner::{Runner, RunnerConfig, RunnerHandle};
use nodus_core::sandbox::{self, ExecOutput, ExecRequest, Sandbox, SandboxId};
use nodus_core::secret::StaticSecrets;
use nodus_core::store::{ObjectKey, Store};
use nodus_core::testing::{ManualClock, RecordingSandbox};
use nodus_core::{Clock, Usd};
use nodus_llm::ScriptedModel;
use nodus_store::MemoryStore;
use serde_json::json;
use support::hooked::{Hooked, Hooks};
use support::{PROJECT, agent, catalog, run};
use tokio::sync::Semaphore;

/// How long a test waits for what must happen soon (real time).
const SOON: Duration = Duration::from_secs(20);

/// Hooks of a recording sandbox whose commands wait at a gate, counting how many run at once.
struct Gate {
    gate: Arc<Semaphore>,
    in_flight: AtomicUsize,
    most: AtomicUsize,
}

impl Gate {
    /// The recording sandbox behind a gate that is closed.
    fn closed() -> Hooked<Gate> {
        Hooked {
            inner: Arc::new(RecordingSandbox::new()),
            hooks: Gate {
                gate: Arc::new(Semaphore::new(0)),
                in_flight: AtomicUsize::new(0),
                most: AtomicUsize::new(0),
            },
        }
    }

    fn open(&self) {
        self.gate.add_permits(Semaphore::MAX_PERMITS / 2);
    }
}

#[async_trait]
impl Hooks for Gate {
    async fn exec(
        &self,
        inner: &RecordingSandbox,
        id: &SandboxId,
        request: &ExecRequest,
    ) -> Result<ExecOutput, sandbox::Error> {
        let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        self.most.fetch_max(now, Ordering::SeqCst);
        let permit = self.gate.acquire().await;
        drop(permit);
        let output = inner.exec(id, request).await;
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
        output
    }
}

/// An engine over the in-memory store, `sandbox`, the offline model (it runs the commands a
/// prompt quotes in backticks) and a manual clock.
fn engine(sandbox: Arc<dyn Sandbox>, clock: Arc<ManualClock>) -> Engine {
    engine_over(Arc::new(MemoryStore::new()), sandbox, clock)
}

/// The same over `store`.
fn engine_over(
    store: Arc<dyn Store>,
    sandbox: Arc<dyn Sandbox>,
    clock: Arc<ManualClock>,
) -> Engine {
    Engine::new(
        Deps {
            store,
            sandbox,
            model: Arc::new(ScriptedModel::offline()),
            router: Arc::new(FixedRouter(Family::Haiku)),
            clock,
            catalog: Arc::new(catalog()),
            secrets: Arc::new(StaticSecrets::new()),
            ledger: Arc::new(nodus_core::ledger::Unmetered),
            spans: Arc::new(nodus_core::telemetry::NoSpans),
        },
        Config::default(),
    )
}

/// An engine over a store that counts its reads (the recording sandbox, a manual clock), with
/// the agent `agent`.
async fn counted_engine(agent_name: &str) -> (Arc<support::CountingStore>, Engine) {
    let store = Arc::new(support::CountingStore::default());
    let clock = Arc::new(ManualClock::default());
    let engine = engine_over(store.clone(), Arc::new(RecordingSandbox::new()), clock);
    engine
        .apply_agent(PROJECT, agent(agent_name, |_| {}))
        .await
        .expect("agent");
    (store, engine)
}

fn start(engine: &Engine, max_concurrent: usize) -> RunnerHandle {
    let mut config = RunnerConfig::default();
    config.max_concurrent = max_concurrent;
    config.group_settle = Duration::ZERO;
    Runner::start(engine.clone(), config)
}

/// Wait (real time) until the runner has settled: it drives no run, and the earliest time it
/// waits for is `at` (its one alarm, set at the next deadline).
async fn settled_until(runner: &RunnerHandle, clock: &ManualClock, at: jiff::Timestamp) {
    let mut driving = runner.driving();
    tokio::time::timeout(SOON, driving.wait_for(|driving| *driving == 0))
        .await
        .expect("no run driven")
        .expect("the runner runs");
    tokio::time::timeout(SOON, clock.until_waited_for(at))
        .await
        .expect("the runner's alarm set at the deadline");
    assert_eq!(
        clock.waited_for().first(),
        Some(&at),
        "the earliest time the runner waits for"
    );
}

/// Wait (real time) until the runner has settled at its bound: it drives `driving` runs and
/// holds `queued` back for a slot, so it has seen every run and starts no other until a drive
/// ends.
async fn settled_at_bound(runner: &RunnerHandle, driving: usize, queued: usize) {
    let (mut driven, mut held) = (runner.driving(), runner.queued());
    tokio::time::timeout(SOON, async {
        loop {
            if *driven.borrow_and_update() == driving && *held.borrow_and_update() == queued {
                return;
            }
            tokio::select! {
                _ = driven.changed() => {}
                _ = held.changed() => {}
            }
        }
    })
    .await
    .unwrap_or_else(|_| {
        panic!(
            "never {driving} driven and {queued} queued: {} and {}",
            *driven.borrow(),
            *held.borrow()
        )
    });
}

/// Wait (real time) until `check` holds.
async fn until(what: &str, mut check: impl FnMut() -> bool) {
    let give_up = tokio::time::Instant::now() + SOON;
    while !check() {
        assert!(tokio::time::Instant::now() < give_up, "never: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn a_deadline_wakes_a_waiting_run_when_the_clock_passes_it() {
    let clock = Arc::new(ManualClock::default());
    let engine = engine(Arc::new(RecordingSandbox::new()), clock.clone());
    engine
        .apply_agent(PROJECT, agent("helper", |_| {}))
        .await
        .expect("agent");
    let deadline = clock
        .now()
        .checked_add(jiff::SignedDuration::from_secs(60))
        .expect("time");
    let runner = start(&engine, 4);
    engine
        .create_run(
            PROJECT,
            run("chat", "helper", "Say hello: run `echo hello`.", |s| {
                s.keep_alive = true;
                s.deadline = Some(deadline);
            }),
        )
        .await
        .expect("run");
    let waiting = runner.settled(PROJECT, "chat").await.expect("settled");
    assert_eq!(
        waiting.status.phase,
        Some(RunPhase::Waiting(WaitReason::AwaitingMessage))
    );
    // Settled: no drive, and the runner's one alarm set at the deadline. Nothing wakes the
    // run while the clock stands before it.
    settled_until(&runner, &clock, deadline).await;
    clock.advance(Duration::from_secs(59));
    settled_until(&runner, &clock, deadline).await;
    let run = engine.get_run(PROJECT, "chat").await.expect("run");
    assert_eq!(
        run.status.phase,
        Some(RunPhase::Waiting(WaitReason::AwaitingMessage)),
        "one second before its deadline"
    );
    clock.advance(Duration::from_secs(2));
    let ended = tokio::time::timeout(
        SOON,
        engine.finished_run(PROJECT, "chat", Duration::from_secs(3600)),
    )
    .await
    .expect("woken at its deadline")
    .expect("run");
    assert_eq!(
        ended.status.phase,
        Some(RunPhase::Failed(FailReason::DeadlineExceeded))
    );
    runner.shutdown().await;
}

#[tokio::test]
async fn waiting_runs_hold_no_task_and_each_is_woken_at_its_own_deadline() {
    let clock = Arc::new(ManualClock::default());
    let engine = engine(Arc::new(RecordingSandbox::new()), clock.clone());
    engine
        .apply_agent(PROJECT, agent("helper", |_| {}))
        .await
        .expect("agent");
    let runner = start(&engine, 4);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let tasks = || {
        tokio::runtime::Handle::current()
            .metrics()
            .num_alive_tasks()
    };
    let idle = tasks();
    // Twenty conversations whose deadlines are two seconds apart, from a minute on.
    let names: Vec<String> = (0..20).map(|i| format!("chat{i}")).collect();
    let start_time = clock.now();
    let deadline_of = |i: i64| {
        start_time
            .checked_add(jiff::SignedDuration::from_secs(60 + 2 * i))
            .expect("time")
    };
    for (i, name) in (0i64..).zip(&names) {
        let deadline = deadline_of(i);
        engine
            .create_run(
                PROJECT,
                run(name, "helper", "Run `echo hello`.", |s| {
                    s.keep_alive = true;
                    s.deadline = Some(deadline);
                }),
            )
            .await
            .expect("run");
    }
    for name in &names {
        let waiting = runner.settled(PROJECT, name).await.expect("settled");
        assert_eq!(
            waiting.status.phase,
            Some(RunPhase::Waiting(WaitReason::AwaitingMessage))
        );
    }
    // Settled: the drives ended (after their runs' last writes), and the runner's one alarm
    // is set at the first deadline.
    settled_until(&runner, &clock, deadline_of(0)).await;
    assert!(
        tasks() <= idle + 1,
        "{} tasks with 20 runs waiting, {idle} without: a waiting run holds a task",
        tasks()
    );
    // The first deadline comes: that run ends, the next one still waits.
    clock.advance(Duration::from_secs(61));
    let first = tokio::time::timeout(
        SOON,
        engine.finished_run(PROJECT, "chat0", Duration::from_secs(3600)),
    )
    .await
    .expect("woken at its deadline")
    .expect("run");
    assert_eq!(
        first.status.phase,
        Some(RunPhase::Failed(FailReason::DeadlineExceeded))
    );
    // Settled: no drive, and the runner's alarm at the next deadline, a second away.
    settled_until(&runner, &clock, deadline_of(1)).await;
    let second = engine.get_run(PROJECT, "chat1").await.expect("run");
    assert_eq!(
        second.status.phase,
        Some(RunPhase::Waiting(WaitReason::AwaitingMessage)),
        "one second before its deadline"
    );
    // Every other deadline passes: each run ends.
    clock.advance(Duration::from_secs(60));
    for name in &names {
        let ended = tokio::time::timeout(
            SOON,
            engine.finished_run(PROJECT, name, Duration::from_secs(3600)),
        )
        .await
        .expect("woken at its deadline")
        .expect("run");
        assert_eq!(
            ended.status.phase,
            Some(RunPhase::Failed(FailReason::DeadlineExceeded)),
            "{name}"
        );
    }
    runner.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_more_runs_are_driven_at_once_than_its_bound() {
    let clock = Arc::new(ManualClock::default());
    let sandbox = Arc::new(Gate::closed());
    let engine = engine(sandbox.clone(), clock);
    engine
        .apply_agent(PROJECT, agent("helper", |_| {}))
        .await
        .expect("agent");
    let runner = start(&engine, 2);
    let names: Vec<String> = (0..5).map(|i| format!("r{i}")).collect();
    for name in &names {
        engine
            .create_run(
                PROJECT,
                run(name, "helper", &format!("Run `echo {name}`."), |_| {}),
            )
            .await
            .expect("run");
    }
    until("two commands wait at the gate", || {
        sandbox.hooks.in_flight.load(Ordering::SeqCst) == 2
    })
    .await;
    // Settled: every run seen, two driven, three held back; nothing starts until the gate
    // opens.
    settled_at_bound(&runner, 2, 3).await;
    assert_eq!(
        sandbox.hooks.most.load(Ordering::SeqCst),
        2,
        "a third waits"
    );
    sandbox.hooks.open();
    for name in &names {
        let run = tokio::time::timeout(SOON, runner.settled(PROJECT, name))
            .await
            .expect("finished")
            .expect("run");
        assert_eq!(run.status.phase, Some(RunPhase::Succeeded), "{name}");
    }
    assert_eq!(sandbox.hooks.most.load(Ordering::SeqCst), 2);
    assert_eq!(sandbox.inner.executions().len(), 5);
    runner.shutdown().await;
}

#[tokio::test]
async fn runs_queued_beyond_its_bound_wait_with_no_task() {
    let clock = Arc::new(ManualClock::default());
    let sandbox = Arc::new(Gate::closed());
    let engine = engine(sandbox.clone(), clock);
    engine
        .apply_agent(PROJECT, agent("helper", |_| {}))
        .await
        .expect("agent");
    let runner = start(&engine, 2);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let tasks = || {
        tokio::runtime::Handle::current()
            .metrics()
            .num_alive_tasks()
    };
    let idle = tasks();
    // Thirty runs queued at once (as every unfinished run is at a restart), two driven.
    let names: Vec<String> = (0..30).map(|i| format!("r{i}")).collect();
    for name in &names {
        engine
            .create_run(
                PROJECT,
                run(name, "helper", &format!("Run `echo {name}`."), |_| {}),
            )
            .await
            .expect("run");
    }
    until("two commands wait at the gate", || {
        sandbox.hooks.in_flight.load(Ordering::SeqCst) == 2
    })
    .await;
    settled_at_bound(&runner, 2, 28).await;
    assert!(
        tasks() <= idle + 2,
        "{} tasks with two runs driven and 28 queued, {idle} without: a queued run holds a task",
        tasks()
    );
    sandbox.hooks.open();
    for name in &names {
        let run = tokio::time::timeout(SOON, runner.settled(PROJECT, name))
            .await
            .expect("finished")
            .expect("run");
        assert_eq!(run.status.phase, Some(RunPhase::Succeeded), "{name}");
    }
    assert_eq!(sandbox.hooks.most.load(Ordering::SeqCst), 2);
    assert_eq!(sandbox.inner.executions().len(), 30, "each run once");
    runner.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_with_dependencies_runs_under_its_cost_cap_with_no_server() {
    let clock = Arc::new(ManualClock::default());
    let sandbox = Arc::new(Gate::closed());
    sandbox.hooks.open();
    let engine = engine(sandbox.clone(), clock);
    engine
        .apply_agent(
            PROJECT,
            agent("worker", |a| a.per_run_max_cost_usd = Usd::from_cents(20)),
        )
        .await
        .expect("agent");
    // maxActive would let two go, but $0.30 holds one $0.20 cap at a time.
    let mut spec = support::open_group("worker", 2, Some(Usd::from_cents(30)));
    engine
        .apply_group(PROJECT, AgentGroup::new("g", spec.clone()))
        .await
        .expect("group");
    let runner = start(&engine, 8);
    let mut runs = Vec::new();
    for (key, deps) in [
        ("a", vec![]),
        ("b", vec![]),
        ("c", vec![]),
        ("report", vec!["a", "b", "c"]),
    ] {
        let mut r: AgentRun = run("", "worker", &format!("Run `echo {key}`."), |s| {
            s.group = Some("g".to_string());
            s.task_key = Some(key.to_string());
            s.depends_on = deps.into_iter().map(str::to_string).collect();
        });
        r.metadata.name = None;
        runs.push(r);
    }
    engine.create_runs(PROJECT, runs, None).await.expect("runs");
    spec.sealed = true;
    engine
        .apply_group(PROJECT, AgentGroup::new("g", spec))
        .await
        .expect("seal");
    for name in ["g-a", "g-b", "g-c", "g-report"] {
        let run = tokio::time::timeout(SOON, runner.settled(PROJECT, name))
            .await
            .expect("finished")
            .expect("run");
        assert_eq!(run.status.phase, Some(RunPhase::Succeeded), "{name}");
    }
    let executions = sandbox.inner.executions();
    assert_eq!(executions.len(), 4, "{executions:?}");
    assert_eq!(
        executions.last().map(String::as_str),
        Some("echo report"),
        "the report runs after the runs it depends on: {executions:?}"
    );
    assert_eq!(
        sandbox.hooks.most.load(Ordering::SeqCst),
        1,
        "the cost cap holds one run at a time"
    );
    let mut changes = engine.store().subscribe();
    let group = tokio::time::timeout(SOON, async {
        loop {
            let group = engine
                .get::<AgentGroupSpec>(PROJECT, "g")
                .await
                .expect("group");
            if group.status.phase.is_some_and(GroupPhase::is_finished) {
                return group;
            }
            let _ = changes.recv().await;
        }
    })
    .await
    .expect("the group finishes");
    assert_eq!(group.status.phase, Some(GroupPhase::Succeeded));
    assert_eq!(group.status.counts.succeeded, 4);
    runner.shutdown().await;
}

#[tokio::test]
async fn the_retention_sweep_runs_by_the_clock() {
    let clock = Arc::new(ManualClock::default());
    let engine = engine(Arc::new(RecordingSandbox::new()), clock.clone());
    let store = engine.store().clone();
    let day = jiff::SignedDuration::from_hours(24);
    for (name, days_ago) in [("old", 31), ("recent", 29)] {
        let ended = clock.now().checked_sub(day * days_ago).expect("a time");
        let key = ObjectKey::new(PROJECT, Kind::AgentRun, name);
        store
            .create(
                &key,
                json!({
                    "apiVersion": "nodus.dev/v1", "kind": "AgentRun",
                    "metadata": {"name": name, "uid": format!("uid-{name}")},
                    "spec": {"agent": "a", "input": "secret input"},
                    "status": {"phase": "Succeeded", "completionTime": ended.to_string()},
                }),
            )
            .await
            .expect("a run");
        store
            .create(
                &nodus_core::engine::workdir_archive_key(&key),
                json!({"bytes": 0, "archiveBase64": ""}),
            )
            .await
            .expect("a kept working directory");
    }
    let kept = |name: &str| {
        nodus_core::engine::workdir_archive_key(&ObjectKey::new(PROJECT, Kind::AgentRun, name))
    };
    let swept = |store: Arc<dyn Store>, name: &'static str| async move {
        store
            .get(&ObjectKey::new(PROJECT, Kind::AgentRun, name))
            .await
            .expect("run")
            .document["status"]
            .get("payloadsRemovedAt")
            .is_some()
    };
    let hour = jiff::SignedDuration::from_hours(1);
    let next_sweep = clock.now().checked_add(hour).expect("a time");
    let mut config = RunnerConfig::default();
    config.retention = Some(Duration::from_secs(30 * 24 * 3600));
    config.sweep_every = Duration::from_secs(3600);
    let runner = Runner::start(engine.clone(), config);
    // At start: the run that ended 31 days ago. Settled: the sweep is done, and the sweeper
    // waits (on the clock) for the next one, an hour on.
    tokio::time::timeout(SOON, clock.until_waited_for(next_sweep))
        .await
        .expect("the first sweep ends and waits for the next");
    assert!(swept(store.clone(), "old").await);
    assert!(store.get(&kept("old")).await.is_err(), "swept");
    assert!(!swept(store.clone(), "recent").await);
    assert!(store.get(&kept("recent")).await.is_ok(), "kept");
    // Two days later (by the clock), at the next sweep, the other one.
    clock.advance(Duration::from_secs(2 * 24 * 3600));
    let after_that = clock.now().checked_add(hour).expect("a time");
    tokio::time::timeout(SOON, clock.until_waited_for(after_that))
        .await
        .expect("the second sweep ends and waits for the next");
    assert!(swept(store.clone(), "recent").await);
    assert!(store.get(&kept("recent")).await.is_err(), "swept");
    runner.shutdown().await;
}

#[tokio::test]
async fn deleting_a_started_run_leaves_driving_it_to_the_runner() {
    let clock = Arc::new(ManualClock::default());
    let sandbox = Arc::new(RecordingSandbox::new());
    let engine = engine(sandbox.clone(), clock.clone());
    engine
        .apply_agent(PROJECT, agent("helper", |_| {}))
        .await
        .expect("agent");
    let runner = start(&engine, 4);
    engine
        .create_run(
            PROJECT,
            run("chat", "helper", "Run `echo hello`.", |s| {
                s.keep_alive = true
            }),
        )
        .await
        .expect("run");
    runner.settled(PROJECT, "chat").await.expect("waiting");
    runner.shutdown().await;
    assert_eq!(sandbox.live().len(), 1, "started: its sandbox is live");
    // No runner: the request records the cancellation and does not drive the run itself
    // (before, it drove it under the runner's replica name and fenced the runner's drive).
    let deleting = engine.delete::<AgentRun>(PROJECT, "chat");
    let gives_up_at = clock
        .now()
        .checked_add(jiff::SignedDuration::try_from(Config::default().delete_wait).expect("a wait"))
        .expect("a time");
    let waiting = async {
        // Once the delete waits for the run to end (until its wait is over), the wait passes.
        clock.until_waited_for(gives_up_at).await;
        clock.advance(Duration::from_secs(31));
    };
    let (deleted, ()) = tokio::time::timeout(SOON, async { tokio::join!(deleting, waiting) })
        .await
        .expect("the delete gives up");
    assert_eq!(
        deleted.expect_err("not ended yet").reason(),
        "Conflict",
        "RunBusy"
    );
    assert_eq!(sandbox.live().len(), 1, "the request deleted no sandbox");
    let kept = engine.get_run(PROJECT, "chat").await.expect("still there");
    assert!(kept.status.cancel_requested.is_some());
    // The runner carries the cancellation out; then the run can go.
    let runner = Runner::start(engine.clone(), RunnerConfig::default());
    let ended = match tokio::time::timeout(SOON, runner.settled(PROJECT, "chat")).await {
        Ok(ended) => ended.expect("cancelled"),
        Err(_) => panic!(
            "not cancelled: {:?} {:?}",
            engine.get_run(PROJECT, "chat").await,
            engine.steps(PROJECT, "chat").await
        ),
    };
    assert!(matches!(ended.status.phase, Some(RunPhase::Cancelled(_))));
    assert!(sandbox.live().is_empty(), "the runner deleted the sandbox");
    engine
        .delete::<AgentRun>(PROJECT, "chat")
        .await
        .expect("delete");
    runner.shutdown().await;
}

#[tokio::test]
async fn a_rescore_is_refused_once_the_retention_sweep_removed_the_source_payloads() {
    let clock = Arc::new(ManualClock::default());
    let engine = engine(Arc::new(RecordingSandbox::new()), clock.clone());
    let store = engine.store().clone();
    engine
        .apply_agent(PROJECT, agent("helper", |_| {}))
        .await
        .expect("agent");
    let environment: nodus_core::resource::Environment = serde_json::from_value(json!({
        "apiVersion": "nodus.dev/v1", "kind": "Environment", "metadata": {"name": "kept"},
        "spec": {"version": "1.0.0", "grader": {"kind": "exact"}, "splits": {"test": {"tasks": [
            {"id": "a", "prompt": "Say a.", "hidden": {"expected": "a"}},
            {"id": "b", "prompt": "Say b.", "hidden": {"expected": "b"}}]}}}
    }))
    .expect("an Environment");
    engine
        .apply_environment(PROJECT, environment)
        .await
        .expect("environment");
    let group: AgentGroup = serde_json::from_value(json!({
        "apiVersion": "nodus.dev/v1", "kind": "AgentGroup", "metadata": {"name": "ev"},
        "spec": {"agent": "helper", "evaluation": {"environment": "kept@1.0.0", "tasks": 2}}
    }))
    .expect("a group");
    engine
        .create(PROJECT, group)
        .await
        .expect("evaluation group");
    let mut config = RunnerConfig::default();
    config.group_settle = Duration::ZERO;
    config.retention = Some(Duration::from_secs(30 * 24 * 3600));
    config.sweep_every = Duration::from_secs(3600);
    let runner = Runner::start(engine.clone(), config);
    let give_up = tokio::time::Instant::now() + SOON;
    loop {
        let group = engine
            .get::<AgentGroupSpec>(PROJECT, "ev")
            .await
            .expect("group");
        if group.status.phase.is_some_and(GroupPhase::is_finished) {
            break;
        }
        assert!(tokio::time::Instant::now() < give_up, "never finished");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // While the payloads are kept, a rescore is accepted.
    engine
        .rescore_evaluation(PROJECT, "ev", "kept@1.0.0", Some("ev-kept"))
        .await
        .expect("a rescore of kept payloads");
    // 31 days later (by the clock) the sweep removes the runs' payloads and the cases' with
    // them; a rescore is then refused, naming the field and why, and nothing is written.
    clock.advance(Duration::from_secs(31 * 24 * 3600));
    let case = ObjectKey::new(PROJECT, Kind::EvaluationCase, "ev-c000");
    let give_up = tokio::time::Instant::now() + SOON;
    while store.get(&case).await.expect("case").document["spec"]
        .get("payloadsRemovedAt")
        .is_none()
    {
        assert!(tokio::time::Instant::now() < give_up, "never swept");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let refused = engine
        .rescore_evaluation(PROJECT, "ev", "kept@1.0.0", Some("ev-late"))
        .await
        .expect_err("payloads removed");
    let shown = refused.to_string();
    assert!(
        shown.contains("spec.evaluation.rescoreOf") && shown.contains("retention sweep"),
        "{shown}"
    );
    assert!(
        engine
            .get::<AgentGroupSpec>(PROJECT, "ev-late")
            .await
            .is_err(),
        "nothing written"
    );
    runner.shutdown().await;
}

/// A run's drive writes the run as it goes, and last when it ends: the notifications of those
/// writes drive it no more (it used to be driven once more after it ended, only to read that it
/// had). A store wrapper counts the reads of the run; the test reads the inner store only.
#[tokio::test]
async fn a_run_is_not_driven_again_for_its_own_drive_s_writes() {
    let (store, engine) = counted_engine("helper").await;
    let runner = start(&engine, 4);
    let succeeded = |name: &'static str| {
        let inner = store.inner.clone();
        async move {
            let give_up = tokio::time::Instant::now() + SOON;
            loop {
                let record = inner.get(&support::run_key(name)).await.expect("the run");
                if record.document["status"]["phase"] == json!("Succeeded") {
                    return;
                }
                assert!(
                    tokio::time::Instant::now() < give_up,
                    "{name} never succeeded"
                );
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    };
    // The first run only warms the runner up (its start, which looks at every unfinished
    // run, may see the first run too and drive it again for that); the second is counted;
    // the third comes after it.
    for name in ["first", "second", "third"] {
        engine
            .create_run(PROJECT, run(name, "helper", "Run `echo one`.", |_| {}))
            .await
            .expect("run");
        succeeded(name).await;
    }
    // The runner sees changes in the order they were written: whatever the second run's last
    // write would drive was started before the third run's first drive, and is over once no
    // run is driven.
    let mut driving = runner.driving();
    tokio::time::timeout(SOON, driving.wait_for(|driving| *driving == 0))
        .await
        .expect("no run driven")
        .expect("the runner runs");
    assert_eq!(
        store.gets_of(&support::run_key("second")),
        2,
        "the second run read by the runner to drive it and by its drive after the claim, and \
         not again"
    );
    runner.shutdown().await;
}

/// A group's reconcile writes the group's status: that write's notification reconciles it no
/// more (the runner reconciled a group again after each of its own status writes, only to
/// find nothing new, which kept a busy group's reconciles going back to back). The finished
/// group's status is made stale by another writer; one reconcile puts it right, and no other
/// follows it. A store wrapper counts the reads of the group.
#[tokio::test]
async fn a_group_is_not_reconciled_again_for_its_own_reconcile_s_status_write() {
    let (store, engine) = counted_engine("worker").await;
    let mut spec = support::open_group("worker", 2, None);
    engine
        .apply_group(PROJECT, AgentGroup::new("g", spec.clone()))
        .await
        .expect("group");
    let runner = start(&engine, 4);
    let mut member: AgentRun = run("", "worker", "Run `echo a`.", |s| {
        s.group = Some("g".to_string());
        s.task_key = Some("a".to_string());
    });
    member.metadata.name = None;
    engine
        .create_runs(PROJECT, vec![member], None)
        .await
        .expect("run");
    spec.sealed = true;
    engine
        .apply_group(PROJECT, AgentGroup::new("g", spec))
        .await
        .expect("seal");
    let key = ObjectKey::new(PROJECT, Kind::AgentGroup, "g");
    let inner = store.inner.clone();
    let group_phase = |inner: MemoryStore| {
        let key = key.clone();
        async move {
            let record = inner.get(&key).await.expect("the group");
            (record.version, record.document["status"]["phase"].clone())
        }
    };
    let until_succeeded = |inner: MemoryStore| async move {
        let give_up = tokio::time::Instant::now() + SOON;
        loop {
            let (version, phase) = group_phase(inner.clone()).await;
            if phase == json!("Succeeded") {
                return version;
            }
            assert!(tokio::time::Instant::now() < give_up, "never succeeded");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    until_succeeded(inner.clone()).await;
    // Whatever the member's end and the group's last write still queue is over by now.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let before = store.gets_of(&key);
    // Another writer makes the status stale: the reconcile this wakes writes it again.
    let record = inner.get(&key).await.expect("the group");
    let mut stale = record.document.clone();
    stale["status"]["phase"] = json!("Running");
    let stale = inner
        .update(&key, record.version, stale)
        .await
        .expect("stale");
    let restored = until_succeeded(inner.clone()).await;
    assert_eq!(restored, stale.version + 1, "one write put it right");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        store.gets_of(&key) - before,
        1,
        "one reconcile for the other writer's change, none for its own write"
    );
    runner.shutdown().await;
}

//! The deterministic crash tests: a run with several turns and commands, crashed at every
//! journal boundary and restarted on the same store, ends as the uncrashed run did, and no
//! completed command runs twice; the same run with the real ledger, crashed at every store
//! write on the in-memory, SQLite and Postgres stores, holds no reservation, calls the model
//! as often as its journal says and runs each command at most once; and a message sent
//! between the two writes that end a run is refused, on all three stores.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use nodus_core::engine::Driven;
use nodus_core::journal::{Intent, Outcome, StepState};
use nodus_core::lifecycle::{CancelReason, Resolution, RunPhase};
use nodus_core::store::Store;
use nodus_core::testing::Drive;
use nodus_llm::Reply;
use support::{
    CrashMode, CrashingStore, PROJECT, World, agent, assert_costs_within_reservations,
    journal_json, run,
};

const COMMANDS: [&str; 4] = ["echo one", "echo two", "echo three", "echo four"];

fn script() -> Vec<Reply> {
    vec![
        Reply::Commands(vec!["echo one".into(), "echo two".into()]),
        Reply::Commands(vec!["echo three".into()]),
        Reply::Text("first answer".into()),
        Reply::Commands(vec!["echo four".into()]),
        Reply::Text("second answer".into()),
    ]
}

/// Set up the agent and the run, with a message waiting so that the run has two turns.
async fn setup(world: &World) {
    setup_run(world, |_| {}).await;
}

/// [`setup`], the run's spec changed by `configure`.
async fn setup_run(world: &World, configure: impl FnOnce(&mut nodus_core::resource::AgentRunSpec)) {
    let engine = world.engine();
    engine
        .apply_agent(PROJECT, agent("worker", |_| {}))
        .await
        .expect("agent");
    engine
        .create_run(PROJECT, run("job", "worker", "Run the checks.", configure))
        .await
        .expect("run");
    engine
        .send_message(PROJECT, "job", "Now the staging checks.", Some("staging-1"))
        .await
        .expect("message");
}

/// Where the runner of `engine` leaves the run "job" (finished, or parked again).
async fn settle(world: &World, engine: &nodus_core::engine::Engine) -> Driven {
    let runner = world.runner(engine);
    let run = runner.settled(PROJECT, "job").await.expect("settled");
    runner.shutdown().await;
    match run.status.phase.expect("a phase") {
        RunPhase::NeedsResolution => Driven::Parked {
            seq: 0,
            until: None,
        },
        phase => Driven::Finished(phase),
    }
}

/// Drive the run to its end on a fresh engine, resolving a park with `resolution`.
async fn finish(world: &World, resolution: Resolution) -> (Driven, bool) {
    let engine = world.engine();
    let driven = engine
        .drive(PROJECT, "job")
        .await
        .expect("drive after restart");
    if let Driven::Parked { .. } = driven {
        let run = engine.get_run(PROJECT, "job").await.expect("run");
        assert_eq!(run.status.phase, Some(RunPhase::NeedsResolution));
        let steps = engine.steps(PROJECT, "job").await.expect("steps");
        assert_eq!(steps.last().map(|s| s.state), Some(StepState::Uncertain));
        engine
            .resolve(PROJECT, "job", resolution)
            .await
            .expect("resolve");
        // The runner drives it on from the resolution.
        return (settle(world, &engine).await, true);
    }
    (driven, false)
}

#[tokio::test]
async fn uncrashed_run_has_two_turns_and_four_commands() {
    let world = World::new(script());
    setup(&world).await;
    let driven = world.engine().drive(PROJECT, "job").await.expect("drive");
    assert_eq!(driven, Driven::Finished(RunPhase::Succeeded));
    let engine = world.engine();
    assert_eq!(
        engine
            .answer(PROJECT, "job")
            .await
            .expect("answer")
            .as_deref(),
        Some("second answer")
    );
    for command in COMMANDS {
        assert_eq!(world.sandbox.count(command), 1, "{command}");
    }
    let run = engine.get_run(PROJECT, "job").await.expect("run");
    assert_eq!(run.status.turns.len(), 2);
    assert_eq!(run.status.turns[0].commands, 3);
    assert_eq!(run.status.turns[1].commands, 1);
    assert!(run.status.cost.total_usd > nodus_core::Usd::ZERO);
    assert_eq!(
        world.sandbox.live(),
        Vec::<String>::new(),
        "sandbox deleted"
    );
    let journal = engine.journal(PROJECT, "job").await.expect("journal");
    assert_eq!(journal.len(), 16);
    assert_costs_within_reservations(&journal, "the uncrashed run");
    assert!(
        journal
            .iter()
            .all(|s| s.state(false) == StepState::Completed)
    );
}

#[tokio::test]
async fn crash_at_every_journal_boundary_ends_like_the_uncrashed_run() {
    // The reference: the same run without a crash.
    let reference = World::new(script());
    setup(&reference).await;
    reference
        .engine()
        .drive(PROJECT, "job")
        .await
        .expect("drive");
    let reference_journal = reference
        .engine()
        .journal(PROJECT, "job")
        .await
        .expect("journal");
    let writes = reference_journal.len() * 2;
    assert_eq!(writes, 32);

    for mode in [CrashMode::AfterWrite, CrashMode::BeforeWrite] {
        for crash_at in 1..=writes {
            let world = World::new(script());
            setup(&world).await;
            let crashing = Arc::new(CrashingStore::new(world.memory.clone(), crash_at, mode));
            let crashed = world
                .engine_over(crashing.clone())
                .drive(PROJECT, "job")
                .await;
            assert!(crashed.is_err(), "{mode:?} at write {crash_at} must crash");

            // Which step did the crash interrupt, and was its outcome lost?
            let step_index = (crash_at - 1) / 2;
            let is_result_write = crash_at % 2 == 0;
            let step = &reference_journal[step_index];
            let interrupted_command = matches!(step.intent, Intent::Command { .. })
                && (mode == CrashMode::AfterWrite && !is_result_write
                    || mode == CrashMode::BeforeWrite && is_result_write);
            let command_ran = mode == CrashMode::BeforeWrite && is_result_write;

            // Restart: a new engine on the same store. An interrupted command parks the run;
            // record it as failed when it ran, retry it when it never did.
            let resolution = if command_ran {
                Resolution::RecordFailed
            } else {
                Resolution::Retry
            };
            let (driven, parked) = finish(&world, resolution).await;
            let context = format!(
                "{mode:?} at write {crash_at} (step {step_index}: {:?})",
                step.intent.kind()
            );
            assert_eq!(
                parked, interrupted_command,
                "{context}: parks exactly on an interrupted command"
            );
            assert_eq!(driven, Driven::Finished(RunPhase::Succeeded), "{context}");

            let engine = world.engine();
            assert_eq!(
                engine
                    .answer(PROJECT, "job")
                    .await
                    .expect("answer")
                    .as_deref(),
                Some("second answer"),
                "{context}"
            );
            for command in COMMANDS {
                assert_eq!(
                    world.sandbox.count(command),
                    1,
                    "{context}: `{command}` ran once"
                );
            }
            let journal = engine.journal(PROJECT, "job").await.expect("journal");
            assert_costs_within_reservations(&journal, &context);
            if !parked {
                assert_eq!(
                    journal_json(&journal),
                    journal_json(&reference_journal),
                    "{context}"
                );
            } else if command_ran {
                // The interrupted step is recorded as failed; everything else is as before.
                assert_eq!(journal.len(), reference_journal.len(), "{context}");
                assert!(
                    matches!(
                        journal[step_index].completion.as_ref().map(|c| &c.outcome),
                        Some(Outcome::Failed {
                            by_resolution: true,
                            ..
                        })
                    ),
                    "{context}"
                );
            } else {
                // The interrupted step is superseded by one retry with the same intent.
                assert_eq!(journal.len(), reference_journal.len() + 1, "{context}");
                assert_eq!(
                    journal[step_index].completion.as_ref().map(|c| &c.outcome),
                    Some(&Outcome::Superseded)
                );
                assert_eq!(
                    journal[step_index + 1].intent,
                    reference_journal[step_index].intent,
                    "{context}"
                );
            }
            assert_eq!(
                world.sandbox.live(),
                Vec::<String>::new(),
                "{context}: sandbox deleted"
            );
        }
    }
}

/// Crash after a command ran but before its result was journaled.
async fn parked_after_command(world: &World) {
    setup(world).await;
    // Write 8 is the result of the first command (steps: sandbox, route, call, command).
    let crashing = Arc::new(CrashingStore::new(
        world.memory.clone(),
        8,
        CrashMode::BeforeWrite,
    ));
    assert!(
        world
            .engine_over(crashing)
            .drive(PROJECT, "job")
            .await
            .is_err()
    );
    assert_eq!(world.sandbox.count("echo one"), 1);
    let driven = world.engine().drive(PROJECT, "job").await.expect("restart");
    assert!(
        matches!(driven, Driven::Parked { seq: 3, .. }),
        "{driven:?}"
    );
}

#[tokio::test]
async fn resolve_retry_runs_the_command_again() {
    let world = World::new(script());
    parked_after_command(&world).await;
    let engine = world.engine();
    engine
        .resolve(PROJECT, "job", Resolution::Retry)
        .await
        .expect("resolve");
    let driven = settle(&world, &engine).await;
    assert_eq!(driven, Driven::Finished(RunPhase::Succeeded));
    assert_eq!(
        world.sandbox.count("echo one"),
        2,
        "retry means run it again"
    );
    let steps = world.engine().steps(PROJECT, "job").await.expect("steps");
    assert_eq!(steps[3].state, StepState::Uncertain);
    assert_eq!(steps[4].state, StepState::Completed);
}

/// A person's retry and a drive of the same parked run in one process (the runner looks at
/// a run after each change, its own park included) claim the run's lease under the same name:
/// they come one after the other, and neither is refused (the retry was answered "owned by
/// another writer" when the drive took the lease over between its claim and its writes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_while_the_parked_run_is_driven_in_the_same_process_is_not_refused() {
    let world = World::new(script());
    parked_after_command(&world).await;
    let store = Arc::new(CrashingStore::at_any_write(
        Arc::new(world.memory.clone()),
        usize::MAX,
        CrashMode::AfterWrite,
    ));
    let (claimed, go_on) = store.pause_after_next_claim();
    let engine = world.engine_over(store);
    let resolving = {
        let engine = engine.clone();
        tokio::spawn(async move { engine.resolve(PROJECT, "job", Resolution::Retry).await })
    };
    // The retry holds the lease; now the drive starts.
    claimed.notified().await;
    let uid = engine
        .get_run(PROJECT, "job")
        .await
        .expect("the run")
        .metadata
        .uid
        .expect("a uid");
    let driving = {
        let engine = engine.clone();
        tokio::spawn(async move { engine.drive(PROJECT, "job").await })
    };
    // Settled: the drive waits behind the retry for the run (a drive that did not wait
    // would claim the lease over the retry's, and the retry's writes would be refused).
    let give_up = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while engine.writers_waiting(&uid) != 1 {
        assert!(
            std::time::Instant::now() < give_up,
            "the drive never waited behind the retry"
        );
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    assert!(!driving.is_finished(), "the drive went on past the retry");
    go_on.notify_one();
    resolving
        .await
        .expect("no panic")
        .expect("the retry is recorded");
    let driven = driving.await.expect("no panic").expect("the drive");
    assert_eq!(driven, Driven::Finished(RunPhase::Succeeded));
    assert_eq!(
        world.sandbox.count("echo one"),
        2,
        "the retry ran the command again"
    );
}

#[tokio::test]
async fn resolve_record_failed_continues_without_running_it() {
    let world = World::new(script());
    parked_after_command(&world).await;
    let engine = world.engine();
    engine
        .resolve(PROJECT, "job", Resolution::RecordFailed)
        .await
        .expect("resolve");
    let driven = settle(&world, &engine).await;
    assert_eq!(driven, Driven::Finished(RunPhase::Succeeded));
    assert_eq!(world.sandbox.count("echo one"), 1);
    let steps = world.engine().steps(PROJECT, "job").await.expect("steps");
    assert_eq!(steps[3].state, StepState::Failed);
    assert_eq!(world.sandbox.count("echo two"), 1, "the run continued");
}

#[tokio::test]
async fn resolve_cancel_deletes_the_sandbox_and_calls_no_model() {
    let world = World::new(script());
    parked_after_command(&world).await;
    let calls = world.model.calls();
    let engine = world.engine();
    engine
        .resolve(PROJECT, "job", Resolution::Cancel)
        .await
        .expect("resolve");
    let driven = settle(&world, &engine).await;
    assert_eq!(
        driven,
        Driven::Finished(RunPhase::Cancelled(CancelReason::CancelRequested))
    );
    assert_eq!(world.model.calls(), calls, "no model call after cancel");
    assert_eq!(world.sandbox.count("echo two"), 0);
    assert_eq!(world.sandbox.live(), Vec::<String>::new());
    let error = world
        .engine()
        .resolve(PROJECT, "job", Resolution::Retry)
        .await
        .expect_err("nothing left to resolve");
    assert_eq!(error.reason(), "Conflict");
}

/// The stores the crash test runs on.
#[derive(Debug, Clone, Copy)]
enum Backend {
    Memory,
    Sqlite,
    Postgres,
}

/// A fresh, empty store of `backend`, and what keeps it alive (its directory, its pool).
async fn fresh_store(backend: Backend) -> (Arc<dyn Store>, Keep) {
    match backend {
        Backend::Memory => (Arc::new(nodus_store::MemoryStore::new()), Keep::Nothing),
        Backend::Sqlite => {
            let dir = tempfile::tempdir().expect("a temporary directory");
            let store = nodus_store::SqliteStore::open(dir.path().join("nodus.db"))
                .await
                .expect("open a SQLite store");
            (Arc::new(store), Keep::Dir(dir))
        }
        Backend::Postgres => {
            static SCHEMAS: AtomicU64 = AtomicU64::new(0);
            let url = match std::env::var("NODUS_TEST_POSTGRES_URL") {
                Ok(url) if !url.is_empty() => url,
                _ => panic!(
                    "NODUS_TEST_POSTGRES_URL is not set: the crash test on Postgres needs a real \
                     PostgreSQL. Run `eval \"$(scripts/test-env start)\"` first (scripts/test does)."
                ),
            };
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() % 1_000_000_000_000);
            let schema = format!(
                "crash_{}_{nanos}_{}",
                std::process::id(),
                SCHEMAS.fetch_add(1, Ordering::Relaxed)
            );
            let mut options = nodus_store::PostgresOptions::new(url).schema(schema);
            options.max_connections = 4;
            let store = nodus_store::PostgresStore::connect(options)
                .await
                .expect("connect to the test database");
            (Arc::new(store.clone()), Keep::Pool(store))
        }
    }
}

/// What keeps a fresh store alive; [`Keep::close`] lets it go.
enum Keep {
    Nothing,
    Dir(tempfile::TempDir),
    Pool(nodus_store::PostgresStore),
}

impl Keep {
    fn close(self) {
        match self {
            Keep::Nothing => {}
            Keep::Dir(dir) => dir.close().expect("remove the store's directory"),
            // Dropped: its writer tasks end and give their connections back.
            Keep::Pool(store) => drop(store),
        }
    }
}

/// A world over a fresh store of `backend` with the project's credits and the run set up; the
/// run has a working directory, so that its end keeps it.
async fn metered_world(backend: Backend, credits: nodus_core::Usd) -> (World, Keep) {
    let (store, keep) = fresh_store(backend).await;
    let world = World::over_store(script(), store.clone());
    nodus_core::ledger::StoreLedger::new(store)
        .open(PROJECT, credits)
        .await
        .expect("credits");
    setup_run(&world, |spec| {
        spec.workdir = Some(nodus_core::resource::WorkdirSpec {
            base_workdir: None,
            artifact_mounts: Vec::new(),
        });
    })
    .await;
    (world, keep)
}

/// The crash test on one store, with the real ledger: the run is crashed at every store write
/// its drive makes (journal, run status, ledger reserve and settle, the kept working
/// directory, leases), before and after the write is durable, and restarted on the same store
/// by a new engine; a run parked on an interrupted command is resolved as an operator who
/// looked would (recorded as failed when it ran, retried when it did not). Each time the run
/// succeeds with the uncrashed run's answer, and then: no reservation is held and the credits
/// spent are the run's cost; the model was called exactly once per reply the journal records,
/// plus the one reply a crash lost when it came between the reply and its journal write;
/// every command ran at most once (exactly once: each is needed for the answer); no sandbox
/// is left.
async fn crash_at_every_store_write(backend: Backend) {
    let credits = nodus_core::Usd::from_cents(500);
    // The reference: the same run without a crash, counting its writes.
    let (reference, keep) = metered_world(backend, credits).await;
    let counting = Arc::new(CrashingStore::at_any_write(
        reference.store.clone(),
        usize::MAX,
        CrashMode::AfterWrite,
    ));
    let driven = reference
        .metered_engine_over(counting.clone())
        .drive(PROJECT, "job")
        .await
        .expect("the uncrashed drive");
    assert_eq!(driven, Driven::Finished(RunPhase::Succeeded));
    let writes: Vec<String> = counting.writes().into_iter().map(|w| w.what).collect();
    keep.close();
    let run_key = format!("{PROJECT}/agentruns/job");
    let account = format!("_system/accounts/{PROJECT}");
    let archive = format!("{PROJECT}/workdirarchives/job");
    for (kind, found) in [
        (
            "a journal append",
            writes.iter().any(|w| w.starts_with("append step")),
        ),
        (
            "a journal outcome",
            writes.iter().any(|w| w.starts_with("complete step")),
        ),
        (
            "a status write",
            writes.iter().any(|w| *w == format!("update {run_key}")),
        ),
        (
            "a reservation and a settlement",
            writes
                .iter()
                .filter(|w| **w == format!("modify {account}"))
                .count()
                >= 2,
        ),
        (
            // Into the document that holds the working directory staged at creation.
            "the kept working directory",
            writes.iter().any(|w| *w == format!("update {archive}")),
        ),
    ] {
        assert!(found, "{backend:?}: the drive writes {kind}: {writes:#?}");
    }

    // The cases are independent (each its own store, sandbox, model and clock) and mostly
    // wait for the disk or the database: a few run at once.
    let parallel = Arc::new(tokio::sync::Semaphore::new(4));
    let mut cases = tokio::task::JoinSet::new();
    for mode in [CrashMode::AfterWrite, CrashMode::BeforeWrite] {
        for (index, expected) in writes.iter().enumerate() {
            let parallel = Arc::clone(&parallel);
            let expected = expected.clone();
            cases.spawn(async move {
                let _turn = parallel.acquire_owned().await.expect("the semaphore");
                crash_once(backend, credits, mode, index + 1, expected).await;
            });
        }
    }
    while let Some(case) = cases.join_next().await {
        if let Err(error) = case {
            std::panic::resume_unwind(error.into_panic());
        }
    }
}

/// One case of [`crash_at_every_store_write`]: the run crashed at write `crash_at` (which the
/// uncrashed drive made as `expected`) in `mode`, restarted, and checked.
async fn crash_once(
    backend: Backend,
    credits: nodus_core::Usd,
    mode: CrashMode,
    crash_at: usize,
    expected: String,
) {
    let context = format!("{backend:?}, {mode:?} at write {crash_at} ({expected})");
    let (world, keep) = metered_world(backend, credits).await;
    let crashing = Arc::new(CrashingStore::at_any_write(
        world.store.clone(),
        crash_at,
        mode,
    ));
    // Some failed writes are only logged (giving up a lease): the process dies anyway.
    let _ = world
        .metered_engine_over(crashing.clone())
        .drive(PROJECT, "job")
        .await;
    let seen = crashing.writes();
    assert_eq!(seen.len(), crash_at, "{context}: the crash came");
    assert_eq!(
        seen.last().map(|w| &w.what),
        Some(&expected),
        "{context}: the writes come in the same order"
    );
    let lost_reply = mode == CrashMode::BeforeWrite && seen[crash_at - 1].model_reply;

    // Restart: a new engine (a new process) on the same store.
    let engine = world.metered_engine_over(world.store.clone());
    let mut driven = engine.drive(PROJECT, "job").await.expect("restart");
    if let Driven::Parked { seq, .. } = driven {
        let journal = engine.journal(PROJECT, "job").await.expect("journal");
        let Intent::Command { command, .. } = &journal[seq as usize].intent else {
            panic!("{context}: parked on {:?}", journal[seq as usize].intent);
        };
        let resolution = if world.sandbox.count(command) > 0 {
            Resolution::RecordFailed
        } else {
            Resolution::Retry
        };
        engine
            .resolve(PROJECT, "job", resolution)
            .await
            .expect("resolve");
        // The runner drives it on from the resolution.
        driven = settle(&world, &engine).await;
    }
    assert_eq!(driven, Driven::Finished(RunPhase::Succeeded), "{context}");
    assert_eq!(
        engine
            .answer(PROJECT, "job")
            .await
            .expect("answer")
            .as_deref(),
        Some("second answer"),
        "{context}"
    );

    let account = nodus_core::ledger::StoreLedger::new(world.store.clone())
        .account(PROJECT)
        .await
        .expect("account");
    let run = engine.get_run(PROJECT, "job").await.expect("run");
    assert!(
        account.reserved.is_empty(),
        "{context}: held {:?}",
        account.reserved
    );
    assert!(
        run.status.cost.total_usd > nodus_core::Usd::ZERO,
        "{context}"
    );
    assert_eq!(account.spent_usd, run.status.cost.total_usd, "{context}");
    let journal = engine.journal(PROJECT, "job").await.expect("journal");
    assert_costs_within_reservations(&journal, &context);
    assert_eq!(
        account.balance_usd,
        credits.saturating_sub(account.spent_usd),
        "{context}"
    );

    let replies = journal
        .iter()
        .filter(|step| matches!(step.outcome(), Some(Outcome::ModelReplied { .. })))
        .count();
    assert_eq!(
        world.model.calls(),
        replies + usize::from(lost_reply),
        "{context}: model calls against the journal's replies"
    );
    for command in COMMANDS {
        assert_eq!(
            world.sandbox.count(command),
            1,
            "{context}: `{command}` ran once"
        );
    }
    assert_eq!(
        world.sandbox.live(),
        Vec::<String>::new(),
        "{context}: sandbox deleted"
    );
    keep.close();
}

#[tokio::test]
async fn crash_at_every_store_write_on_the_memory_store() {
    crash_at_every_store_write(Backend::Memory).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_at_every_store_write_on_sqlite() {
    crash_at_every_store_write(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_at_every_store_write_on_postgres() {
    crash_at_every_store_write(Backend::Postgres).await;
}

/// Drives run `job` over `store` until it is about to journal its ending (its status already
/// says it ends) and holds it there: answers the drive and what lets it go on.
async fn drive_paused_before_the_ending(
    world: &World,
    store: Arc<dyn Store>,
) -> (
    tokio::task::JoinHandle<Result<Driven, nodus_core::engine::Error>>,
    Arc<tokio::sync::Notify>,
) {
    let pausing = Arc::new(CrashingStore::at_any_write(
        store,
        usize::MAX,
        CrashMode::AfterWrite,
    ));
    let (paused, go_on) = pausing.pause_before_next("(SandboxDeletion)");
    let driving = {
        let engine = world.engine_over(pausing);
        tokio::spawn(async move { engine.drive(PROJECT, "job").await })
    };
    paused.notified().await;
    (driving, go_on)
}

/// A message sent in the window between the two writes that end a run (its status saying
/// it ends, then the deletion of its sandbox journaled) is refused with `AgentRunFinished`,
/// not answered delivered and never read: the drive is paused before the journal write,
/// the message sent, the drive let go on.
async fn a_message_sent_while_the_run_ends_is_refused(backend: Backend) {
    let (store, keep) = fresh_store(backend).await;
    let world = World::over_store(script(), store.clone());
    setup(&world).await;
    let (driving, go_on) = drive_paused_before_the_ending(&world, store).await;
    let sender = world.engine();
    let run = sender.get_run(PROJECT, "job").await.expect("run");
    assert_eq!(run.status.ending, Some(RunPhase::Succeeded), "{backend:?}");
    assert_eq!(run.status.phase, Some(RunPhase::Running), "{backend:?}");
    let journal = sender.journal(PROJECT, "job").await.expect("journal");
    assert!(
        !journal
            .iter()
            .any(|step| matches!(step.intent, Intent::DestroySandbox { .. })),
        "{backend:?}: paused before the ending is journaled"
    );
    let sent = sender
        .send_message(PROJECT, "job", "One more thing.", Some("late"))
        .await;
    go_on.notify_one();
    let driven = driving.await.expect("no panic").expect("the drive");
    assert_eq!(driven, Driven::Finished(RunPhase::Succeeded), "{backend:?}");
    // Answered delivered, it would never be read: the run's last turn is over.
    let error = sent.expect_err("the ending run refuses the message");
    assert_eq!(error.reason(), "AgentRunFinished", "{backend:?}: {error}");
    assert!(error.to_string().contains("Succeeded"), "{error}");
    let run = sender.get_run(PROJECT, "job").await.expect("run");
    assert_eq!(run.status.turns.len(), 2, "{backend:?}: no third turn");
    assert_eq!(
        run.status.ending, None,
        "{backend:?}: finished, no longer ending"
    );
    let inbox = store_inbox(&world, &run).await;
    assert_eq!(
        inbox,
        vec!["Now the staging checks.".to_string()],
        "{backend:?}"
    );
    keep.close();
}

/// The messages of `run`, in order.
async fn store_inbox(world: &World, run: &nodus_core::resource::AgentRun) -> Vec<String> {
    let uid = run.metadata.uid.as_deref().expect("a uid");
    let inbox = world.store.inbox(uid).await.expect("inbox");
    inbox.into_iter().map(|m| m.payload).collect()
}

#[tokio::test]
async fn a_message_sent_while_the_run_ends_is_refused_on_the_memory_store() {
    a_message_sent_while_the_run_ends_is_refused(Backend::Memory).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_sent_while_the_run_ends_is_refused_on_sqlite() {
    a_message_sent_while_the_run_ends_is_refused(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_sent_while_the_run_ends_is_refused_on_postgres() {
    a_message_sent_while_the_run_ends_is_refused(Backend::Postgres).await;
}

/// A crash between the two writes that end a run leaves its status saying it ends with no
/// ending journaled; the restarted run decides again, and when it decides to go on (here: a
/// message that reached its inbox anyway, posted straight to the store), its status stops
/// saying it ends before it acts, so that it takes messages again.
async fn a_run_that_goes_on_after_a_crash_while_ending_takes_messages_again(backend: Backend) {
    let (store, keep) = fresh_store(backend).await;
    let mut replies = script();
    replies.push(Reply::Text("third answer".into()));
    let world = World::over_store(replies, store.clone());
    setup(&world).await;
    let (driving, _) = drive_paused_before_the_ending(&world, store.clone()).await;
    // The process dies before the ending is journaled.
    driving.abort();
    let _ = driving.await;

    let engine = world.engine();
    let run = engine.get_run(PROJECT, "job").await.expect("run");
    assert_eq!(run.status.ending, Some(RunPhase::Succeeded), "{backend:?}");
    let error = engine
        .send_message(PROJECT, "job", "Refused while it says it ends.", None)
        .await
        .expect_err("a run whose status says it ends refuses messages");
    assert_eq!(error.reason(), "AgentRunFinished", "{backend:?}: {error}");
    let version = run
        .metadata
        .resource_version
        .as_deref()
        .and_then(|v| v.parse().ok())
        .expect("a version");
    store
        .post_message(
            &support::run_key("job"),
            version,
            None,
            "And the third checks.",
            nodus_core::clock::Clock::now(world.clock.as_ref()),
        )
        .await
        .expect("posted");

    let restarted = Arc::new(CrashingStore::at_any_write(
        store,
        usize::MAX,
        CrashMode::AfterWrite,
    ));
    let (reading, go_on) = restarted.pause_before_next("(Message)");
    let driving = {
        let engine = world.engine_over(restarted);
        tokio::spawn(async move { engine.drive(PROJECT, "job").await })
    };
    reading.notified().await;
    let run = engine.get_run(PROJECT, "job").await.expect("run");
    assert_eq!(
        run.status.ending, None,
        "{backend:?}: the run that goes on no longer says it ends"
    );
    go_on.notify_one();
    let driven = driving.await.expect("no panic").expect("the drive");
    assert_eq!(driven, Driven::Finished(RunPhase::Succeeded), "{backend:?}");
    let run = engine.get_run(PROJECT, "job").await.expect("run");
    assert_eq!(
        run.status.turns.len(),
        3,
        "{backend:?}: the message was read"
    );
    assert_eq!(run.status.ending, None, "{backend:?}");
    assert_eq!(
        engine
            .answer(PROJECT, "job")
            .await
            .expect("answer")
            .as_deref(),
        Some("third answer"),
        "{backend:?}"
    );
    keep.close();
}

#[tokio::test]
async fn a_run_that_goes_on_after_a_crash_while_ending_takes_messages_again_on_the_memory_store() {
    a_run_that_goes_on_after_a_crash_while_ending_takes_messages_again(Backend::Memory).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_that_goes_on_after_a_crash_while_ending_takes_messages_again_on_sqlite() {
    a_run_that_goes_on_after_a_crash_while_ending_takes_messages_again(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_that_goes_on_after_a_crash_while_ending_takes_messages_again_on_postgres() {
    a_run_that_goes_on_after_a_crash_while_ending_takes_messages_again(Backend::Postgres).await;
}

//! The engine's own overhead per step: a run of ten commands (25 journaled steps) with the
//! in-memory store, the scripted model (instant) and the recording sandbox (no process),
//! next to a baseline measured in the same run: the same number of bare journal writes
//! (intent and outcome of 25 steps) on the same store.
//!
//! `cargo bench -p nodus-tests --bench engine`

use std::sync::Arc;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use nodus_core::catalog::Family;
use nodus_core::engine::{Config, Deps, Driven, Engine};
use nodus_core::journal::{Completion, Intent, Outcome, Step};
use nodus_core::lifecycle::RunPhase;
use nodus_core::resource::{Agent, AgentRun, AgentRunSpec, AgentSpec};
use nodus_core::router::FixedRouter;
use nodus_core::secret::StaticSecrets;
use nodus_core::store::Lease;
use nodus_core::testing::{Drive, ManualClock, RecordingSandbox};
use nodus_core::{Clock, Store};
use nodus_llm::{Reply, ScriptedModel};
use nodus_store::MemoryStore;

const COMMANDS: usize = 10;
/// Sandbox, routing, 11 model calls, 10 commands, answer, sandbox deletion.
const STEPS: u64 = 25;

fn engine(store: MemoryStore) -> Engine {
    let mut script: Vec<Reply> = (0..COMMANDS)
        .map(|i| Reply::Commands(vec![format!("echo {i}")]))
        .collect();
    script.push(Reply::Text("done".to_string()));
    Engine::new(
        Deps {
            store: Arc::new(store),
            sandbox: Arc::new(RecordingSandbox::new()),
            model: Arc::new(ScriptedModel::new(script)),
            router: Arc::new(FixedRouter(Family::Haiku)),
            clock: Arc::new(ManualClock::default()),
            catalog: Arc::new(nodus_llm::default_catalog().expect("catalog")),
            secrets: Arc::new(StaticSecrets::new()),
            ledger: Arc::new(nodus_core::ledger::Unmetered),
            spans: Arc::new(nodus_core::telemetry::NoSpans),
        },
        Config::default(),
    )
}

fn bench(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    let mut group = c.benchmark_group("engine_step");
    group.throughput(Throughput::Elements(STEPS));

    let store = MemoryStore::new();
    let engine = engine(store.clone());
    runtime.block_on(async {
        let mut spec = AgentSpec::new("bench");
        spec.max_tool_calls = 100;
        engine
            .apply_agent("bench", Agent::new("a", spec))
            .await
            .expect("agent");
    });
    let mut counter = 0u64;
    group.bench_function("run_of_25_steps", |b| {
        b.iter(|| {
            counter += 1;
            let name = format!("r{counter}");
            runtime.block_on(async {
                engine
                    .create_run("bench", AgentRun::new(&name, AgentRunSpec::new("a", "go")))
                    .await
                    .expect("run");
                let driven = engine.drive("bench", &name).await.expect("drive");
                assert_eq!(driven, Driven::Finished(RunPhase::Succeeded));
            });
        });
    });

    let clock = ManualClock::default();
    group.bench_function("baseline_bare_journal_writes", |b| {
        b.iter(|| {
            counter += 1;
            let uid = format!("baseline-{counter}");
            runtime.block_on(async {
                let fence = store
                    .claim(&uid, &Lease::for_this_process(clock.now()))
                    .await
                    .expect("claim");
                for seq in 0..STEPS as u32 {
                    let step = Step {
                        seq,
                        started_at: clock.now(),
                        intent: Intent::Answer { turn: 0 },
                        completion: None,
                    };
                    store.append_step(&uid, fence, &step).await.expect("append");
                    let completion = Completion {
                        finished_at: clock.now(),
                        outcome: Outcome::Answered,
                    };
                    store
                        .complete_step(&uid, fence, seq, &completion)
                        .await
                        .expect("complete");
                }
            });
        });
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);

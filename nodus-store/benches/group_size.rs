//! Creating a group's runs, at 1,000 members and at 10,000 in the same run: the time to add
//! a member should not grow with the group (admission reads no member list).
//!
//! `cargo bench -p nodus-store --bench group_size`
//!
//! The embedded default store (SQLite, one file in a temporary directory, as `nodus server`
//! opens it) under an engine built as an embedder builds one (`Deps::builder`: no metering;
//! a recording sandbox and a model that is never called, since nothing is driven: no runner
//! runs, so only creation is timed). Each group's runs are created in batches of
//! `NODUS_BENCH_BATCH` (default 100, the API's usual batch; 1 creates them one at a time),
//! each run depending on the one created just before it, the 1,000-member group first.
//! Prints each group's time, its time per member over its last tenth, and the ratio; then
//! the 10,000-member group's reconcile with every member read, against one that reads only
//! the member written since the last (the engine keeps its last listing by version).

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use nodus_core::Usd;
use nodus_core::catalog::{Catalog, CatalogModel, Family};
use nodus_core::cost::{Prices, Rates};
use nodus_core::engine::{Config, Deps, Engine};
use nodus_core::model::{self, ModelClient, ModelRequest, ModelResponse};
use nodus_core::resource::Kind;
use nodus_core::resource::{
    Agent, AgentGroup, AgentGroupSpec, AgentRun, AgentRunSpec, AgentSpec, GroupLimits,
};
use nodus_core::store::{ObjectKey, Store};
use nodus_core::testing::{Drive, RecordingSandbox};
use nodus_store::SqliteStore;

const PROJECT: &str = "bench";

/// Nothing is driven: a call would be a mistake of the bench.
struct NeverCalled;

#[async_trait]
impl ModelClient for NeverCalled {
    async fn complete(&self, _: &ModelRequest) -> Result<ModelResponse, model::Error> {
        Err(model::Error {
            kind: model::ErrorKind::Final,
            message: "the group bench drives no run".to_string(),
        })
    }
}

fn catalog() -> Catalog {
    let rates = Rates {
        input: Usd::from_cents(100),
        output: Usd::from_cents(500),
        cache_write: Usd::from_cents(125),
        cache_read: Usd::from_cents(10),
    };
    Catalog {
        date: "2026-12-01".to_string(),
        notes: Vec::new(),
        families: Family::ALL
            .into_iter()
            .map(|family| {
                let model = CatalogModel {
                    model: format!("bench-{family:?}"),
                    prices: Prices {
                        base: rates,
                        long_prompt: None,
                    },
                };
                (family, model)
            })
            .collect(),
        models: Vec::new(),
    }
}

fn batch_size() -> usize {
    std::env::var("NODUS_BENCH_BATCH")
        .ok()
        .and_then(|s| s.parse::<usize>().ok())
        .unwrap_or(100)
        .clamp(1, 100)
}

/// Task `i` of `group`, depending on task `i - 1`.
fn task(group: &str, i: usize) -> AgentRun {
    let mut spec = AgentRunSpec::new("worker", format!("Run `echo {i}`."));
    spec.group = Some(group.to_string());
    spec.task_key = Some(format!("t{i}"));
    if i > 0 {
        spec.depends_on = vec![format!("t{}", i - 1)];
    }
    let mut run = AgentRun::new("", spec);
    run.metadata.name = None;
    run
}

/// The time to create a group of `members` runs, and to create its last tenth.
async fn create_group(engine: &Engine, name: &str, members: usize) -> (Duration, Duration) {
    let spec = AgentGroupSpec {
        agent: "worker".to_string(),
        limits: GroupLimits {
            max_pending: u32::try_from(members).expect("members"),
            ..GroupLimits::default()
        },
        max_cost_usd: None,
        sealed: false,
        evaluation: None,
    };
    engine
        .apply_group(PROJECT, AgentGroup::new(name, spec))
        .await
        .expect("group");
    let batch = batch_size();
    let started = Instant::now();
    let mut last_tenth = None;
    let mut created = 0;
    while created < members {
        if last_tenth.is_none() && created >= members - members / 10 {
            last_tenth = Some(Instant::now());
        }
        let runs: Vec<AgentRun> = (created..(created + batch).min(members))
            .map(|i| task(name, i))
            .collect();
        created += runs.len();
        if batch == 1 {
            for run in runs {
                engine.create_run(PROJECT, run).await.expect("a member");
            }
        } else {
            engine
                .create_runs(PROJECT, runs, None)
                .await
                .expect("members");
        }
    }
    let took = started.elapsed();
    (took, last_tenth.map_or(took, |at| at.elapsed()))
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let store = SqliteStore::open(dir.path().join("nodus.db"))
            .await
            .expect("open the store");
        let store = Arc::new(store);
        let engine = Engine::new(deps(&store), Config::default());
        engine
            .apply_agent(PROJECT, Agent::new("worker", AgentSpec::new("You are careful.")))
            .await
            .expect("agent");
        println!("batches of {}", batch_size());
        let mut times = Vec::new();
        for (name, members) in [("small", 1_000), ("large", 10_000)] {
            let (took, last) = create_group(&engine, name, members).await;
            let per_member = last.as_micros() / u128::try_from(members / 10).unwrap_or(1);
            println!(
                "{members:>6}-member group: {:>8} ms, {per_member:>5} µs per member over its last tenth",
                took.as_millis()
            );
            times.push(took);
        }
        // In hundredths, with no float near the figures.
        let ratio = times[1].as_micros() * 100 / times[0].as_micros().max(1);
        println!(
            "ratio 10,000 / 1,000: {}.{:02}x (linear: 10x)",
            ratio / 100,
            ratio % 100
        );
        reconciles(&store, &engine).await;
    });
}

/// A reconcile of the 10,000-member group by an engine that never listed it (every member
/// read) against one by the engine that listed it last, after one member was written (that
/// member read again, the others known by version), alternated five times.
async fn reconciles(store: &Arc<SqliteStore>, engine: &Engine) {
    engine
        .reconcile_group(PROJECT, "large")
        .await
        .expect("the first reconcile");
    let mut cold = Vec::new();
    let mut warm = Vec::new();
    for round in 0..5 {
        let fresh = Engine::new(deps(store), Config::default());
        let started = Instant::now();
        fresh
            .reconcile_group(PROJECT, "large")
            .await
            .expect("a reconcile by a fresh engine");
        cold.push(started.elapsed());

        let key = ObjectKey::new(PROJECT, Kind::AgentRun, "large-t5000");
        let mut record = store.get(&key).await.expect("a member");
        record.document["metadata"]["labels"] = serde_json::json!({"round": round.to_string()});
        store
            .update(&key, record.version, record.document)
            .await
            .expect("write a member");
        let started = Instant::now();
        engine
            .reconcile_group(PROJECT, "large")
            .await
            .expect("a reconcile knowing the last listing");
        warm.push(started.elapsed());
    }
    cold.sort_unstable();
    warm.sort_unstable();
    // Milliseconds to a tenth, in integers.
    let ms = |t: &Duration| {
        let us = t.as_micros();
        format!("{}.{}", us / 1000, us % 1000 / 100)
    };
    let show = |times: &[Duration]| times.iter().map(ms).collect::<Vec<_>>().join(", ");
    println!(
        "reconcile of the 10,000-member group, every member read: {} ms (median {})",
        show(&cold),
        ms(&cold[2])
    );
    println!(
        "reconcile of the 10,000-member group, one member written since the last: {} ms \
         (median {})",
        show(&warm),
        ms(&warm[2])
    );
}

/// The bench's engine's parts over `store`.
fn deps(store: &Arc<SqliteStore>) -> Deps {
    Deps::builder(
        Arc::new(RecordingSandbox::new()),
        Arc::new(NeverCalled),
        catalog(),
    )
    .store(store.clone())
    .build()
}

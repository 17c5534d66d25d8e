//! Embedding nodus-core as the embedding example does (`Deps::builder` with its defaults: no
//! metering, so no project has a credit account; `RunnerConfig::default()`), but on a durable
//! store, SQLite in a real file: a run interrupted by a restart is resumed by the next
//! process's runner and finishes.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use nodus_core::engine::{Config, Deps, Engine};
use nodus_core::lifecycle::RunPhase;
use nodus_core::resource::{Agent, AgentRun, AgentRunSpec, AgentSpec};
use nodus_core::runner::{Runner, RunnerConfig};
use nodus_core::sandbox::{
    self, ExecOutput, ExecRequest, Sandbox, SandboxId, SandboxInfo, SandboxSpec,
};
use nodus_core::testing::RecordingSandbox;
use nodus_llm::ScriptedModel;
use nodus_store::SqliteStore;
use tokio::sync::Notify;

/// How long the test waits for what must happen soon (real time).
const SOON: Duration = Duration::from_secs(30);

/// The project, as an embedder names it: no account, no configuration names it.
const PROJECT: &str = "embedder";

/// A sandbox whose creation never completes: it tells `entered` and waits, as a process
/// killed while its run's sandbox was being created.
struct StuckSandbox {
    entered: Arc<Notify>,
}

#[async_trait]
impl Sandbox for StuckSandbox {
    async fn create(&self, _: &SandboxSpec) -> Result<SandboxInfo, sandbox::Error> {
        self.entered.notify_one();
        std::future::pending().await
    }
    async fn exec(&self, _: &SandboxId, _: &ExecRequest) -> Result<ExecOutput, sandbox::Error> {
        Err(sandbox::Error::Failed("no sandbox was created".to_string()))
    }
    async fn put_files(&self, _: &SandboxId, _: Vec<u8>) -> Result<(), sandbox::Error> {
        Err(sandbox::Error::Failed("no sandbox was created".to_string()))
    }
    async fn get_files(&self, _: &SandboxId, _: &str, _: usize) -> Result<Vec<u8>, sandbox::Error> {
        Err(sandbox::Error::Failed("no sandbox was created".to_string()))
    }
    async fn destroy(&self, _: &SandboxId) -> Result<(), sandbox::Error> {
        Ok(())
    }
}

/// An engine as an embedder builds one: the builder's defaults but for the store.
fn engine(store: SqliteStore, sandbox: Arc<dyn Sandbox>) -> Engine {
    let catalog = nodus_llm::offline_catalog(&nodus_llm::default_catalog().expect("catalog"));
    let deps = Deps::builder(sandbox, Arc::new(ScriptedModel::offline()), catalog)
        .store(Arc::new(store))
        .build();
    Engine::new(deps, Config::default())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_interrupted_by_a_restart_is_resumed_with_the_builders_defaults() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let file = dir.path().join("nodus.db");

    // The first process: its runner starts the run, which stops while its sandbox is being
    // created, and the process goes down.
    let entered = Arc::new(Notify::new());
    let first = engine(
        SqliteStore::open(&file).await.expect("open the store"),
        Arc::new(StuckSandbox {
            entered: entered.clone(),
        }),
    );
    let runner = Runner::start(first.clone(), RunnerConfig::default());
    first
        .apply_agent(
            PROJECT,
            Agent::new("helper", AgentSpec::new("You are careful.")),
        )
        .await
        .expect("agent");
    first
        .create_run(
            PROJECT,
            AgentRun::new(
                "resumed",
                AgentRunSpec::new("helper", "Run `echo resumed` and say what it printed."),
            ),
        )
        .await
        .expect("run");
    tokio::time::timeout(SOON, entered.notified())
        .await
        .expect("the first runner started the run");
    runner.shutdown().await;
    let before = first.get_run(PROJECT, "resumed").await.expect("the run");
    assert!(
        !before.status.phase.is_some_and(RunPhase::is_finished),
        "{:?}",
        before.status.phase
    );
    let begun = first.steps(PROJECT, "resumed").await.expect("its steps");
    assert_eq!(
        begun.len(),
        1,
        "the sandbox's creation was begun: {begun:?}"
    );
    drop(first);

    // The next process: the same file, a sandbox that works, the defaults again.
    let sandbox = Arc::new(RecordingSandbox::new());
    let next = engine(
        SqliteStore::open(&file)
            .await
            .expect("open the store again"),
        sandbox.clone(),
    );
    let runner = Runner::start(next.clone(), RunnerConfig::default());
    let finished = match tokio::time::timeout(SOON, runner.settled(PROJECT, "resumed")).await {
        Ok(finished) => finished.expect("the run"),
        Err(_) => panic!(
            "the run was not resumed after the restart: {:?}",
            next.get_run(PROJECT, "resumed")
                .await
                .map(|r| r.status.phase)
        ),
    };
    runner.shutdown().await;
    assert_eq!(finished.status.phase, Some(RunPhase::Succeeded));
    assert_eq!(
        sandbox.executions(),
        vec!["echo resumed".to_string()],
        "the resumed run ran its command once, in the new process's sandbox"
    );
    let answer = next.answer(PROJECT, "resumed").await.expect("answer");
    assert!(
        answer.as_deref().is_some_and(|a| a.contains("resumed")),
        "{answer:?}"
    );
}

//! Embedding nodus-core: an agent run kept in a SQLite file, with the offline scripted model
//! and the unisolated local sandbox, all in this process. It names nodus-core's facade
//! (`nodus_core::prelude`) and the backend crates: nodus-store (the store), nodus-sandbox (the
//! sandbox) and nodus-llm (the model client and its catalog).
//!
//! Run it with `cargo run -p nodus-examples --example embedding`. The engine's `Runner` drives
//! the run (as it does in the server); the offline model runs the shell commands that the
//! prompt quotes in backticks and answers with their output; every step is journaled, and the
//! answer and the steps are printed at the end.

use std::sync::Arc;

use nodus_core::prelude::*;
use nodus_llm::{Jev, ScriptedModel};
use nodus_sandbox::UnisolatedSandbox;
use nodus_store::SqliteStore;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let workdirs = std::env::temp_dir().join(format!("nodus-embedding-{}", std::process::id()));
    std::fs::create_dir_all(&workdirs)?;
    // A durable store: the run survives a restart of this process. The builder's defaults
    // for the rest: the system clock, no Secrets, no metering.
    let store = SqliteStore::open(workdirs.join("nodus.db")).await?;
    let deps = Deps::builder(
        Arc::new(UnisolatedSandbox::new(workdirs.join("sandboxes"))),
        Arc::new(ScriptedModel::offline()),
        // The offline model is free: every family is answered by it, at no price.
        nodus_llm::offline_catalog(&nodus_llm::default_catalog()?),
    )
    .store(Arc::new(store))
    .router(Arc::new(Jev::new()))
    .build();
    let engine = Engine::new(deps, Config::default());
    // The runner drives every run of the engine until it is shut down.
    let runner = Runner::start(engine.clone(), RunnerConfig::default());

    let agent = Agent::new(
        "hello-agent",
        AgentSpec::new(
            "You are a careful assistant. Run shell commands in your sandbox to check your \
             work, and answer in one short paragraph.",
        ),
    );
    engine.apply_agent("default", agent).await?;
    let run = AgentRun::new(
        "hello-agent-run",
        AgentRunSpec::new(
            "hello-agent",
            "Use the shell to print the Python version: run `python3 --version`, then tell me which one it is.",
        ),
    );
    engine.create_run("default", run).await?;

    let run = runner.settled("default", "hello-agent-run").await?;
    runner.shutdown().await;
    let phase = run.status.phase;
    println!("run hello-agent-run: {phase:?}");
    for (index, turn) in run.status.turns.iter().enumerate() {
        println!(
            "turn {index}: model {} (chosen by {:?}), {} commands, cost ${}",
            turn.model, turn.chosen_by, turn.commands, turn.cost_usd
        );
    }
    println!("total cost: ${}", run.status.cost.total_usd);
    println!("\nanswer:");
    println!(
        "{}",
        engine
            .answer("default", "hello-agent-run")
            .await?
            .unwrap_or_default()
    );
    println!("\nsteps:");
    for step in engine.steps("default", "hello-agent-run").await? {
        println!(
            "  {:>2} {:<16} {:<10} {}",
            step.seq,
            format!("{:?}", step.kind),
            format!("{:?}", step.state),
            step.summary
        );
    }
    let _ = std::fs::remove_dir_all(&workdirs);
    if phase != Some(RunPhase::Succeeded) {
        return Err(format!("the run did not succeed: {phase:?}").into());
    }
    Ok(())
}

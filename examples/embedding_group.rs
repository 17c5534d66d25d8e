//! Embedding nodus-core with a group: three runs and a fourth that depends on them, at most
//! two at once and under one cost cap for the group, on the in-memory store with no server.
//! The engine's `Runner` admits, starts and drives them, as it does in the server.
//!
//! Run it with `cargo run -p nodus-examples --example embedding_group`. It prints when each
//! run started and ended, and fails when a run did not succeed, when more than two ran at
//! once, or when the report started before the runs it depends on had ended.

use std::sync::Arc;
use std::time::Duration;

use nodus_core::prelude::*;
use nodus_llm::{Jev, ScriptedModel};
use nodus_sandbox::UnisolatedSandbox;

const PROJECT: &str = "default";

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let workdirs = std::env::temp_dir().join(format!("nodus-group-{}", std::process::id()));
    // The builder's defaults: the in-memory store, the system clock, no Secrets, no metering.
    let deps = Deps::builder(
        Arc::new(UnisolatedSandbox::new(workdirs.clone())),
        Arc::new(ScriptedModel::offline()),
        nodus_llm::default_catalog()?,
    )
    .router(Arc::new(Jev::new()))
    .build();
    let engine = Engine::new(deps, Config::default());
    let runner = Runner::start(engine.clone(), RunnerConfig::default());
    let result = run_group(&engine).await;
    runner.shutdown().await;
    let _ = std::fs::remove_dir_all(&workdirs);
    result
}

async fn run_group(engine: &Engine) -> Result<(), Box<dyn std::error::Error>> {
    let mut worker = AgentSpec::new(
        "You are a careful assistant. Run shell commands in your sandbox to check your work, \
         and answer in one short line.",
    );
    worker.per_run_max_cost_usd = Usd::from_cents(20);
    engine
        .apply_agent(PROJECT, Agent::new("worker", worker))
        .await?;
    // Two at once, and $0.60 for the whole group: a run starts only while its own $0.20 cap
    // fits under what is left.
    let group = AgentGroupSpec {
        agent: "worker".to_string(),
        limits: GroupLimits {
            max_active: 2,
            ..GroupLimits::default()
        },
        max_cost_usd: Some(Usd::from_cents(60)),
        sealed: false,
        evaluation: None,
    };
    engine
        .apply_group(PROJECT, AgentGroup::new("counts", group.clone()))
        .await?;
    let tasks: [(&str, &str, &[&str]); 4] = [
        (
            "etc",
            "Count the entries of /etc: run `ls /etc | wc -l`.",
            &[],
        ),
        (
            "usr",
            "Count the entries of /usr: run `ls /usr | wc -l`.",
            &[],
        ),
        ("tmp", "Say hello: run `echo hello`.", &[]),
        (
            "report",
            "Report the date the counts were taken: run `date -u`.",
            &["etc", "usr", "tmp"],
        ),
    ];
    let mut runs = Vec::new();
    for (key, input, depends_on) in tasks {
        let mut spec = AgentRunSpec::new("worker", input);
        spec.group = Some("counts".to_string());
        spec.task_key = Some(key.to_string());
        spec.depends_on = depends_on.iter().map(|d| d.to_string()).collect();
        let mut run = AgentRun::new("", spec);
        run.metadata.name = None;
        runs.push(run);
    }
    engine.create_runs(PROJECT, runs, None).await?;
    // No more runs are coming: the group finishes when they have.
    let sealed = AgentGroupSpec {
        sealed: true,
        ..group
    };
    engine
        .apply_group(PROJECT, AgentGroup::new("counts", sealed))
        .await?;

    let group = finished_group(engine, "counts").await?;
    println!(
        "group counts: {:?}, spent ${} of ${}",
        group.status.phase,
        group.status.cost.total_usd,
        group
            .status
            .cost
            .limit_usd
            .map(|l| l.to_string())
            .unwrap_or_default()
    );
    let mut spans = Vec::new();
    for (key, _, _) in tasks {
        let run = engine.get_run(PROJECT, &format!("counts-{key}")).await?;
        let (Some(started), Some(ended)) = (run.status.start_time, run.status.completion_time)
        else {
            return Err(format!("run counts-{key} has no start or end: {:?}", run.status).into());
        };
        println!(
            "  counts-{key:<7} {:?}  started {started}  ended {ended}",
            run.status.phase.unwrap_or(RunPhase::Succeeded)
        );
        if run.status.phase != Some(RunPhase::Succeeded) {
            return Err(format!("run counts-{key} did not succeed").into());
        }
        spans.push((key, started, ended));
    }
    // Never more than two at once: at each start, count the runs started and not ended yet.
    for (key, started, _) in &spans {
        let at_once = spans
            .iter()
            .filter(|(_, s, e)| s <= started && e > started)
            .count();
        if at_once > 2 {
            return Err(format!("{at_once} runs went at once when counts-{key} started").into());
        }
    }
    let report_started = spans[3].1;
    if spans[..3]
        .iter()
        .any(|(_, _, ended)| *ended > report_started)
    {
        return Err("the report started before the runs it depends on had ended".into());
    }
    println!(
        "\nreport: {}",
        engine
            .answer(PROJECT, "counts-report")
            .await?
            .unwrap_or_default()
    );
    Ok(())
}

/// The group once it has finished (its runner reconciles it after its last run ends).
async fn finished_group(
    engine: &Engine,
    name: &str,
) -> Result<AgentGroup, Box<dyn std::error::Error>> {
    let mut changes = engine.store().subscribe();
    let give_up = tokio::time::sleep(Duration::from_secs(120));
    tokio::pin!(give_up);
    loop {
        let group = engine.get::<AgentGroupSpec>(PROJECT, name).await?;
        if group.status.phase.is_some_and(GroupPhase::is_finished) {
            return Ok(group);
        }
        tokio::select! {
            _ = changes.recv() => {}
            () = &mut give_up => return Err(format!("group {name} did not finish: {:?}", group.status).into()),
        }
    }
}

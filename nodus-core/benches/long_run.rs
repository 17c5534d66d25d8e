//! A run of 1,000 commands: the engine's decider work per step over the run's last 100
//! steps next to its first 100 (issue 19: long runs stay linear).
//!
//! Each step is what the executor computes between two effects: ask the decider (with the
//! worst-case bound of a model call), fold the step's intent and outcome into the run's
//! replay, and project the status (the turns' lines and the answer); for a model call also
//! the request it sends, timed apart. The model answers every call with one command at
//! once and the commands print one line; no store, no sandbox, no model is timed. The
//! baseline, in the same run, is the same run folding the whole journal again at every step
//! (as the executor did before), which grows with the run.
//!
//! `cargo bench -p nodus-core --features test-util --bench long_run` (`NODUS_BENCH_NO_REQUEST=1`: without building
//! the model calls' requests; `NODUS_BENCH_INCREMENTAL_ONLY=1`: without the baseline, for a
//! profiler).

#![allow(clippy::float_arithmetic)] // microseconds and ratios for display only

use std::collections::BTreeMap;
use std::hint::black_box;
use std::time::{Duration, Instant};

use jiff::Timestamp;
use nodus_core::catalog::{Catalog, CatalogModel, Family};
use nodus_core::cost::{Prices, Rates, Usage};
use nodus_core::decide::{self, Decision, Facts, RunInput};
use nodus_core::journal::{Completion, Intent, Outcome, Step};
use nodus_core::model::{ContentBlock, Credentials, ModelResponse, StopReason};
use nodus_core::money::Usd;
use nodus_core::output::Output;
use nodus_core::replay::Replay;
use nodus_core::resource::{AgentRunSpec, AgentSpec, ChosenBy};
use nodus_core::sandbox::{ExecOutput, SandboxId, SandboxInfo, SandboxSpec};

const COMMANDS: usize = 1_000;
const WINDOW: usize = 100;
const REPEATS: usize = 5;

/// How the replay is kept.
#[derive(Clone, Copy, PartialEq)]
enum Fold {
    /// One step at a time (the executor now).
    Incremental,
    /// The whole journal at every step (the executor before).
    Whole,
}

fn catalog() -> Catalog {
    let prices = Prices {
        base: Rates {
            input: Usd::from_cents(100),
            output: Usd::from_cents(500),
            cache_write: Usd::from_cents(125),
            cache_read: Usd::from_cents(10),
        },
        long_prompt: None,
    };
    Catalog {
        date: "2026-12-01".to_string(),
        notes: Vec::new(),
        families: BTreeMap::from([(
            Family::Haiku,
            CatalogModel {
                model: "m-haiku".to_string(),
                prices,
            },
        )]),
        models: Vec::new(),
    }
}

/// The model's reply to call `call`: one command while tools are offered, then the answer.
fn reply(call: usize, tools: bool) -> ModelResponse {
    let content = if tools {
        vec![ContentBlock::ToolUse {
            id: format!("toolu_{call:04}"),
            name: "shell".to_string(),
            input: serde_json::json!({ "command": format!("echo {call}") }),
        }]
    } else {
        vec![ContentBlock::Text {
            text: "done".to_string(),
        }]
    };
    ModelResponse {
        model: "m-haiku".to_string(),
        content,
        stop_reason: StopReason::EndTurn,
        usage: Usage {
            input_tokens: 10,
            output_tokens: 5,
            cache_write_tokens: 0,
            cache_read_tokens: 0,
        },
        request_id: None,
    }
}

/// The outcome of a decided step, as the effect would give it.
fn outcome(intent: &Intent, calls: usize) -> Outcome {
    match intent {
        Intent::CreateSandbox { .. } => Outcome::SandboxCreated {
            info: SandboxInfo {
                id: SandboxId("sb".to_string()),
                isolated: true,
                host: None,
            },
        },
        Intent::Route { .. } => Outcome::Routed {
            family: Some(Family::Haiku),
            model: "m-haiku".to_string(),
            chosen_by: ChosenBy::Jev,
            cost_usd: Usd::ZERO,
            usage: None,
            fallback_reason: None,
        },
        Intent::CallModel { tools, .. } => Outcome::ModelReplied {
            response: reply(calls, *tools),
            cost_usd: Usd::from_nanos(100),
        },
        Intent::Command { command, .. } => Outcome::CommandFinished {
            output: ExecOutput {
                exit_code: Some(0),
                stdout: Output {
                    bytes: format!("{}\n", command.trim_start_matches("echo ")).into_bytes(),
                    truncated: false,
                },
                stderr: Output::default(),
                timed_out: false,
                stopped: None,
            },
            remade_sandbox: None,
        },
        Intent::ReadMessage { .. } => Outcome::MessageRead,
        Intent::Answer { .. } => Outcome::Answered,
        Intent::DestroySandbox { .. } => Outcome::SandboxDestroyed,
        Intent::PostRunAction { .. } => Outcome::ActionFinished {
            results: BTreeMap::new(),
        },
    }
}

/// Per step: the decider work, the time of building a model call's request, and the parts
/// of the decider work (deciding, folding, projecting the status).
type Timings = (Vec<Duration>, Vec<Duration>, [Vec<Duration>; 3]);

/// One run, timed per step.
fn run(fold: Fold) -> Timings {
    let mut agent = AgentSpec::new("bench");
    agent.max_tool_calls = 1_000;
    let spec = AgentRunSpec::new("a", "go");
    let sandbox = SandboxSpec {
        key: "run".to_string(),
        image: None,
        env: Default::default(),
        limits: Default::default(),
        network: false,
        egress: None,
        egress_headers: Vec::new(),
        links: Default::default(),
    };
    let catalog = catalog();
    let now = Timestamp::from_second(1_767_225_600).expect("time");
    let mut journal: Vec<Step> = Vec::new();
    let mut replay = Replay::default();
    let mut decider = Vec::new();
    let mut requests = Vec::new();
    let mut parts: [Vec<Duration>; 3] = Default::default();
    let mut calls = 0usize;
    loop {
        let started = Instant::now();
        let folded;
        let replay_now = match fold {
            Fold::Incremental => &replay,
            Fold::Whole => {
                folded = Replay::of(&journal);
                &folded
            }
        };
        let input = RunInput {
            agent: &agent,
            spec: &spec,
            sandbox: &sandbox,
            system: "bench",
            first_prompt: "go",
            replay: replay_now,
            inbox: &[],
            now,
            cancel: None,
            close: false,
            post_run_action: None,
            catalog: &catalog,
            router_max_cost: Usd::ZERO,
            byok_secret_key: nodus_core::engine::DEFAULT_BYOK_SECRET_KEY,
            facts: Facts::default(),
        };
        let decision = decide::decide(&input);
        let decided = started.elapsed();
        let Decision::Act(intent) = decision else {
            break;
        };
        let mut request_time = Duration::ZERO;
        if let Intent::CallModel { model, tools, .. } = &intent
            && std::env::var_os("NODUS_BENCH_NO_REQUEST").is_none()
        {
            let request = Instant::now();
            black_box(decide::model_request(
                &input,
                model,
                *tools,
                Credentials::Platform,
            ));
            request_time = request.elapsed();
        }
        let outcome = outcome(&intent, calls);
        let folding = Instant::now();
        if matches!(intent, Intent::CallModel { .. }) {
            calls += 1;
        }
        let seq = u32::try_from(journal.len()).expect("seq");
        let mut step = Step {
            seq,
            started_at: now,
            intent,
            completion: None,
        };
        if fold == Fold::Incremental {
            replay.apply(&step);
        }
        step.completion = Some(Completion {
            finished_at: now,
            outcome,
        });
        if fold == Fold::Incremental {
            replay.apply(&step);
        }
        journal.push(step);
        let folded_in = folding.elapsed();
        let projecting = Instant::now();
        // The status written after the step: the turns' lines and the answer.
        let projected = match fold {
            Fold::Incremental => (replay.turn_statuses(), replay.answer()),
            Fold::Whole => {
                let whole = Replay::of(&journal);
                (whole.turn_statuses(), whole.answer())
            }
        };
        black_box(projected);
        parts[0].push(decided);
        parts[1].push(folded_in);
        parts[2].push(projecting.elapsed());
        decider.push(started.elapsed().saturating_sub(request_time));
        requests.push(request_time);
    }
    assert_eq!(calls, COMMANDS + 1, "every command and the answer");
    (decider, requests, parts)
}

fn mean(window: &[Duration]) -> f64 {
    window.iter().map(Duration::as_secs_f64).sum::<f64>() / window.len() as f64 * 1e6
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn main() {
    // `cargo bench` passes `--bench`; nothing to parse.
    let mut rows: Vec<(&str, Vec<f64>, Vec<f64>)> = vec![
        (
            "decider work, fold one step at a time",
            Vec::new(),
            Vec::new(),
        ),
        (
            "the same + the model call's request",
            Vec::new(),
            Vec::new(),
        ),
        (
            "decider work, whole journal folded per step (before)",
            Vec::new(),
            Vec::new(),
        ),
        ("of the first row: deciding", Vec::new(), Vec::new()),
        (
            "of the first row: folding the step in",
            Vec::new(),
            Vec::new(),
        ),
        (
            "of the first row: projecting the status",
            Vec::new(),
            Vec::new(),
        ),
    ];
    let mut steps = 0;
    for _ in 0..REPEATS {
        // Alternate the two ways in one process, so both see the same machine.
        let (decider, requests, parts) = run(Fold::Incremental);
        // NODUS_BENCH_INCREMENTAL_ONLY=1 skips the baseline (for a profiler).
        let (whole, _, _) = if std::env::var_os("NODUS_BENCH_INCREMENTAL_ONLY").is_some() {
            run(Fold::Incremental)
        } else {
            run(Fold::Whole)
        };
        steps = decider.len();
        let with_request: Vec<Duration> = decider
            .iter()
            .zip(&requests)
            .map(|(d, r)| *d + *r)
            .collect();
        let series = [
            &decider,
            &with_request,
            &whole,
            &parts[0],
            &parts[1],
            &parts[2],
        ];
        for (row, series) in rows.iter_mut().zip(series) {
            row.1.push(mean(&series[..WINDOW]));
            row.2.push(mean(&series[series.len() - WINDOW..]));
        }
    }
    println!("a run of {COMMANDS} commands: {steps} steps; medians of {REPEATS} runs");
    println!("| per step | first {WINDOW} steps | last {WINDOW} steps | last / first |");
    println!("|---|---|---|---|");
    for (name, first, last) in rows {
        let (first, last) = (median(first), median(last));
        println!(
            "| {name} | {first:.1} µs | {last:.1} µs | **{:.2}×** |",
            last / first
        );
    }
}

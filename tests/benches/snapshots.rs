//! What working-directory snapshots cost per command, measured in one run of this binary: a
//! run's first command makes a 1,000-file, 100 MB working directory in an unisolated sandbox
//! (SQLite store in a temporary directory, scripted model), then runs `true` (nothing changes)
//! `ROUNDS` times, then `echo x >> f1` (one 100 KB file changes) `ROUNDS` times. Each command
//! step's time (intent to outcome: the command and, when on, the snapshot before the outcome)
//! and its whole cycle (from one command step's intent to the next's: the model's reply, the
//! writes of the intent, the outcome and the status, where a snapshot that names no contents
//! is kept with the outcome) are compared with the same run with snapshots off. Then a fork of a run whose working
//! directory is 1 GiB (1,024 files of 1 MiB): its creation and its first drive (copying the
//! inherited steps, reading the snapshot's contents from the store, unpacking them in a new
//! sandbox) against `cp -a` of a directory made the same way.
//!
//! `cargo bench -p nodus-tests --bench snapshots` (a bench binary, not criterion: each case
//! is seconds long); `NODUS_BENCH_ONLY=commands` or `fork` runs one of the two cases.

#![allow(clippy::float_arithmetic)] // milliseconds and ratios for display only

use std::sync::Arc;
use std::time::{Duration, Instant};

use nodus_core::Store;
use nodus_core::catalog::Family;
use nodus_core::engine::{Config, Deps, Driven, Engine};
use nodus_core::journal::{Intent, Step};
use nodus_core::resource::{Agent, AgentRun, AgentRunSpec, AgentSpec};
use nodus_core::router::FixedRouter;
use nodus_core::secret::StaticSecrets;
use nodus_core::testing::Drive;
use nodus_llm::{Reply, ScriptedModel};
use nodus_sandbox::unisolated::UnisolatedSandbox;
use nodus_store::SqliteStore;

const ROUNDS: usize = 20;

/// `ROUNDS`, or `NODUS_BENCH_ROUNDS` (for a profile of the unchanged steps alone).
fn rounds() -> usize {
    std::env::var("NODUS_BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(ROUNDS)
}
const MAKE: &str = "for i in $(seq 1000); do head -c 100000 /dev/urandom > f$i; done";
const MAKE_GIB: &str = "for i in $(seq 1024); do head -c 1048576 /dev/urandom > f$i; done";

/// The commands of the per-command case: make the directory, change nothing, change one file.
fn script() -> Vec<Reply> {
    let mut script = vec![Reply::Commands(vec![MAKE.to_string()])];
    for _ in 0..rounds() {
        script.push(Reply::Commands(vec!["true".to_string()]));
    }
    for _ in 0..rounds() {
        script.push(Reply::Commands(vec!["echo x >> f1".to_string()]));
    }
    script.push(Reply::Text("done".to_string()));
    script
}

async fn engine(
    dir: &std::path::Path,
    snapshots: bool,
    script: Vec<Reply>,
) -> (Engine, SqliteStore) {
    let store = SqliteStore::open(dir.join("nodus.db"))
        .await
        .expect("store");
    let engine = Engine::new(
        Deps {
            store: Arc::new(store.clone()),
            sandbox: Arc::new(UnisolatedSandbox::new(dir.join("sandboxes"))),
            model: Arc::new(ScriptedModel::new(script)),
            router: Arc::new(FixedRouter(Family::Haiku)),
            clock: Arc::new(nodus_core::clock::SystemClock),
            catalog: Arc::new(nodus_llm::default_catalog().expect("catalog")),
            secrets: Arc::new(StaticSecrets::new()),
            ledger: Arc::new(nodus_core::ledger::Unmetered),
            spans: Arc::new(nodus_core::telemetry::NoSpans),
        },
        {
            let mut config = Config::default();
            config.snapshots = snapshots.then(nodus_core::snapshot::Budget::default);
            config
        },
    );
    (engine, store)
}

/// With `NODUS_BENCH_BALLAST=1`, the run with snapshots off starts on a store that holds what
/// the first snapshot of the run with them on stores (1,000 contents of 100 KB, 100 MB, from
/// another run), so that the two differ by the snapshots of each step alone, not by the size
/// of the database and of what the process allocated.
async fn ballast(store: &SqliteStore) {
    let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut entries = Vec::new();
    let mut blobs = Vec::new();
    for i in 0..1000 {
        let bytes: Vec<u8> = (0..100_000)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                state.to_le_bytes()[0]
            })
            .collect();
        let blob = nodus_core::snapshot::Blob::of(bytes);
        entries.push(nodus_core::snapshot::Entry {
            path: format!("f{i}"),
            mode: nodus_core::snapshot::REGULAR | 0o644,
            size: 100_000,
            digest: blob.digest.clone(),
            mtime_ns: 1,
        });
        blobs.push(blob);
    }
    entries.sort_by(|a, b| a.path.cmp(&b.path));
    let snapshot = nodus_core::snapshot::Snapshot::Taken {
        manifest: nodus_core::snapshot::Manifest {
            entries,
            listed_at_ns: 1,
        },
        used_bytes: 100_000_000,
    };
    store
        .put_snapshot(
            "ballast",
            0,
            &nodus_core::snapshot::Stored::of(None, 0, snapshot),
            &blobs,
        )
        .await
        .expect("ballast");
}

/// The run's command steps: (command, duration from intent to outcome, start).
async fn run(
    snapshots: bool,
    script: Vec<Reply>,
) -> (Vec<Step3>, tempfile::TempDir, Engine, SqliteStore) {
    let dir = tempfile::tempdir().expect("tempdir");
    let (engine, store) = engine(dir.path(), snapshots, script).await;
    if !snapshots && std::env::var("NODUS_BENCH_BALLAST").is_ok_and(|v| v == "1") {
        ballast(&store).await;
    }
    let mut spec = AgentSpec::new("bench");
    spec.max_tool_calls = u32::try_from(2 * rounds() + 10).unwrap_or(u32::MAX);
    spec.per_run_max_cost_usd = nodus_core::money::Usd::from_cents(100_000);
    engine
        .apply_agent("default", Agent::new("bench", spec))
        .await
        .expect("agent");
    engine
        .create_run(
            "default",
            AgentRun::new("bench-run", AgentRunSpec::new("bench", "go")),
        )
        .await
        .expect("run");
    let driven = engine.drive("default", "bench-run").await.expect("drive");
    assert!(matches!(driven, Driven::Finished(_)), "{driven:?}");
    let journal: Vec<Step> = engine
        .journal("default", "bench-run")
        .await
        .expect("journal");
    let commands = journal
        .iter()
        .filter_map(|step| match &step.intent {
            Intent::Command { command, .. } => {
                let end = step.completion.as_ref()?.finished_at;
                let took = end.duration_since(step.started_at).unsigned_abs();
                Some((command.clone(), took, step.started_at))
            }
            _ => None,
        })
        .collect();
    (commands, dir, engine, store)
}

fn median(mut values: Vec<Duration>) -> Duration {
    values.sort();
    values[values.len() / 2]
}

/// A command step: its command, its time from intent to outcome, and when it began.
type Step3 = (String, Duration, jiff::Timestamp);

fn of(steps: &[Step3], command: &str) -> Duration {
    median(
        steps
            .iter()
            .filter(|(c, _, _)| c == command)
            .map(|(_, d, _)| *d)
            .collect(),
    )
}

/// The median time from one step of `command` to the next: the whole cycle (the model's
/// reply, the intent written, the command, the snapshot, the outcome and the status written).
fn cycle(steps: &[Step3], command: &str) -> Duration {
    let starts: Vec<jiff::Timestamp> = steps
        .iter()
        .filter(|(c, _, _)| c == command)
        .map(|(_, _, at)| *at)
        .collect();
    median(
        starts
            .windows(2)
            .map(|pair| pair[1].duration_since(pair[0]).unsigned_abs())
            .collect(),
    )
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1000.0)
}

/// Rounds of each case, alternated (off, on, off, on…; fork, `cp -a`, fork, `cp -a`…) so that
/// whatever else the machine does hits both alike.
const PAIRS: usize = 2;

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let only = std::env::var("NODUS_BENCH_ONLY").unwrap_or_default();
    if only.is_empty() || only == "commands" {
        per_command().await;
    }
    if only.is_empty() || only == "fork" {
        fork_of_a_gib().await;
    }
}

async fn per_command() {
    println!(
        "per command step, median of {} (snapshots off | on | cost | cost / off):",
        rounds()
    );
    for pair in 1..=PAIRS {
        // `NODUS_BENCH_SAME=off` (or `on`) runs both sides alike: what the bench's order alone
        // makes of the difference.
        let (first, second) = match std::env::var("NODUS_BENCH_SAME").as_deref() {
            Ok("off") => (false, false),
            Ok("on") => (true, true),
            _ => (false, true),
        };
        let (off, _off_dir, _, _) = run(first, script()).await;
        let (on, _on_dir, _, _) = run(second, script()).await;
        for command in ["true", "echo x >> f1"] {
            for (what, measure) in [
                ("step", of as fn(&[Step3], &str) -> Duration),
                ("cycle", cycle),
            ] {
                let (a, b) = (measure(&off, command), measure(&on, command));
                let cost = b.saturating_sub(a);
                println!(
                    "  pair {pair}: {command:14} {what:5} {} | {} | {} | {:.1}%",
                    ms(a),
                    ms(b),
                    ms(cost),
                    100.0 * cost.as_secs_f64() / a.as_secs_f64()
                );
            }
        }
        let first_off = off.first().map(|(_, d, _)| *d).unwrap_or_default();
        let first_on = on.first().map(|(_, d, _)| *d).unwrap_or_default();
        println!(
            "  pair {pair}: first command (makes 100 MB; the first snapshot reads it all): {} | {}",
            ms(first_off),
            ms(first_on)
        );
    }
}

/// A fork of a 1 GiB working directory against `cp -a` of one made the same way.
async fn fork_of_a_gib() {
    let script = vec![
        Reply::Commands(vec![MAKE_GIB.to_string()]),
        Reply::Text("done".to_string()),
    ];
    let (steps, dir, engine, store) = run(true, script).await;
    println!(
        "1 GiB run: its command and snapshot {}",
        ms(steps.first().map(|(_, d, _)| *d).unwrap_or_default())
    );
    let uid = engine
        .get_run("default", "bench-run")
        .await
        .expect("run")
        .metadata
        .uid
        .expect("uid");
    let snapshots = store.snapshots(&uid).await.expect("snapshots");
    let (last, snapshot) = snapshots.last().expect("a snapshot");
    let bytes = snapshot.manifest().expect("taken").content_bytes();
    assert_eq!(bytes, 1 << 30, "{snapshot:?}");
    // The source's sandbox is gone with its run: `cp -a` copies a directory made the same
    // way, after a sync so that the copy does not wait for the making's writes.
    let source = dir.path().join("reference");
    std::fs::create_dir_all(&source).expect("a directory");
    let made = std::process::Command::new("sh")
        .args(["-c", &format!("{MAKE_GIB} && sync")])
        .current_dir(&source)
        .status()
        .expect("sh");
    assert!(made.success());
    for pair in 1..=PAIRS {
        let name = format!("fork-{pair}");
        let started = Instant::now();
        engine
            .fork(
                "default",
                "bench-run",
                nodus_core::engine::ForkRequest {
                    at: nodus_core::engine::AtStep::Seq(*last),
                    count: 1,
                    name: Some(name.clone()),
                    agent: None,
                    input: None,
                    replace: false,
                },
            )
            .await
            .expect("fork");
        let created = started.elapsed();
        // The fork's first drive copies its steps, creates its sandbox from the snapshot,
        // then runs (its first model call answers, the run ends and its sandbox is deleted).
        let started = Instant::now();
        let _ = engine.drive("default", &name).await;
        let restored = started.elapsed();
        // Of which the step that creates its sandbox and restores the 1 GiB into it: the
        // last sandbox step (the first is the source's, inherited).
        let journal = engine.journal("default", &name).await.expect("journal");
        let sandbox = journal
            .iter()
            .rev()
            .find(|step| matches!(step.intent, Intent::CreateSandbox { .. }))
            .and_then(|step| {
                let end = step.completion.as_ref()?.finished_at;
                Some(end.duration_since(step.started_at).unsigned_abs())
            })
            .expect("the fork's sandbox step");
        let copy = dir.path().join(format!("copy-{pair}"));
        let started = Instant::now();
        let status = std::process::Command::new("cp")
            .arg("-a")
            .arg(&source)
            .arg(&copy)
            .status()
            .expect("cp");
        let cp = started.elapsed();
        assert!(status.success());
        // Both copies' writes are flushed before the next round (neither pays for the other).
        let _ = std::fs::remove_dir_all(&copy);
        let _ = std::process::Command::new("sync").status();
        println!(
            "pair {pair}: fork of 1 GiB: created {}, first drive (copy steps, sandbox and restore, answer, delete the sandbox) {}, of which the sandbox step (create, restore) {} | cp -a {} | sandbox step / cp -a {:.2}x | (created + drive) / cp -a {:.2}x",
            ms(created),
            ms(restored),
            ms(sandbox),
            ms(cp),
            sandbox.as_secs_f64() / cp.as_secs_f64(),
            (created + restored).as_secs_f64() / cp.as_secs_f64()
        );
    }
}

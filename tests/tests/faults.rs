//! Kill trials (issue 18): a group of runs whose commands append a line each to a file in
//! their working directories, on a platform model (the fake provider, billed from the
//! project's credits); the server is killed with SIGKILL at a random moment and started again
//! on the same store. Each trial checks that every run reaches a final phase or
//! NeedsResolution, that no completed command ran twice (nor any command outside the
//! journal), that no run was lost, that no credit reservation is left held, that the credits
//! charged are exactly what the runs cost, and that the group's spend is within its cap.
//!
//! `cargo test` runs `NODUS_KILL_TRIALS` trials (default 3) per store; `scripts/kill-trials N`
//! runs N on both and writes the tally to RELIABILITY.md (`NODUS_KILL_TALLY` names the file
//! each store's tally is written to; `NODUS_KILL_SEED` repeats a run of trials).

#[path = "support/server.rs"]
mod server;

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use nodus_core::cost::Usage;
use nodus_llm::testing::{Fake, FakeMessage, FakeServer, RecordedRequest};
use serde_json::{Value, json};
use server::{Backend, ServerProcess};

/// Runs in the group.
const RUNS: usize = 6;
/// Commands each run's model asks for, before it answers.
const COMMANDS: usize = 3;
/// What the group may spend; the runs' caps (6 × $0.50) do not all fit at once, so the cap
/// holds runs back until others finish.
const GROUP_CAP: &str = "1.60";
const PROJECT: &str = "/apis/nodus.dev/v1/projects/default";

/// The fake provider's answer to a run's model call: a function of the conversation only, so
/// a call repeated after the kill gets the same answer. The k-th call asks for command k,
/// which appends `c{k}` to `log.txt` and then sleeps, so a kill often lands while one runs.
fn respond(request: &RecordedRequest) -> Fake {
    let results = request.body["messages"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|message| message["content"].as_array())
        .flatten()
        .filter(|block| block["type"] == "tool_result")
        .count();
    let usage = Usage {
        input_tokens: 8_000,
        output_tokens: 600,
        ..Usage::default()
    };
    let message = if results < COMMANDS {
        FakeMessage::tool_use(
            &format!("toolu_c{results}"),
            &format!("echo c{results} >> log.txt && sleep 0.3"),
        )
    } else {
        FakeMessage::text(&format!("done after {results} commands"))
    };
    Fake::Message(message.with_usage(usage))
}

/// A deterministic generator (splitmix64), so a seed repeats a run of trials.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, bound: u64) -> u64 {
        self.next() % bound.max(1)
    }
}

/// Dollars as a decimal string (`"0.123"`) in nano-dollars, parsed here rather than by the
/// code under test.
fn nanos(text: &str) -> i128 {
    let (whole, fraction) = text.split_once('.').unwrap_or((text, ""));
    assert!(fraction.len() <= 9, "more than nano-dollars: {text}");
    let whole: i128 = whole
        .parse()
        .unwrap_or_else(|_| panic!("not dollars: {text}"));
    let fraction: i128 = format!("{fraction:0<9}")
        .parse()
        .unwrap_or_else(|_| panic!("not dollars: {text}"));
    whole * 1_000_000_000 + fraction
}

fn dollars(value: &Value, what: &str) -> i128 {
    nanos(
        value
            .as_str()
            .unwrap_or_else(|| panic!("{what} is not an amount: {value}")),
    )
}

/// One trial's record for the tally.
#[derive(Debug)]
struct Trial {
    kill_ms: u64,
    /// Runs in each phase once the restarted server settled, before any resolution.
    phases: Vec<String>,
    /// Commands whose step was interrupted (parked) by the kill.
    interrupted: usize,
    /// Commands that completed (each found exactly once in its log).
    completed: usize,
    /// What the trial found wrong (empty: it passed).
    defects: Vec<String>,
}

struct Harness {
    backend: Backend,
    fake: FakeServer,
}

impl Harness {
    /// A harness and the runtime its fake provider runs on (keep it for as long).
    fn new(backend: Backend) -> (tokio::runtime::Runtime, Harness) {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        let fake = runtime
            .block_on(FakeServer::start())
            .expect("fake provider");
        fake.respond_with(respond);
        (runtime, Harness { backend, fake })
    }

    /// A trial's record before anything happened.
    fn record(kill_ms: u64) -> Trial {
        Trial {
            kill_ms,
            phases: Vec::new(),
            interrupted: 0,
            completed: 0,
            defects: Vec::new(),
        }
    }

    fn start_server(&self, store: &str, dir: &Path) -> ServerProcess {
        let base_url = self.fake.base_url();
        ServerProcess::start_in_env(
            store,
            dir,
            "process",
            &[],
            &[
                ("ANTHROPIC_BASE_URL", base_url.as_str()),
                ("ANTHROPIC_API_KEY", "sk-ant-platform-kill-trials-0001"),
            ],
        )
    }

    /// Make the FileSet, agent, group and runs; returns the project's credits before.
    fn set_up(&self, server: &ServerProcess) -> i128 {
        let (status, credits) = server.http_with("GET", &format!("{PROJECT}/credits"), &[], None);
        assert_eq!(status, 200, "{credits}");
        let before = dollars(&credits["balanceUSD"], "balanceUSD");
        let objects = [
            (
                "filesets",
                json!({"apiVersion": "nodus.dev/v1", "kind": "FileSet",
                    "metadata": {"name": "seed"},
                    "spec": {"files": [{"path": "README", "content": "kill trial\n"}]}}),
            ),
            (
                "agents",
                json!({"apiVersion": "nodus.dev/v1", "kind": "Agent",
                    "metadata": {"name": "appender"},
                    "spec": {"system": "Append to log.txt.", "model": {"access": "Nodus"},
                        "maxTokens": 1024, "perRunMaxCostUSD": "0.50"}}),
            ),
            (
                "agentgroups",
                json!({"apiVersion": "nodus.dev/v1", "kind": "AgentGroup",
                    "metadata": {"name": "trial"},
                    "spec": {"agent": "appender", "limits": {"maxActive": 3},
                        "maxCostUSD": GROUP_CAP}}),
            ),
        ];
        for (plural, object) in objects {
            let (status, body) = server.http_with(
                "POST",
                &format!("{PROJECT}/{plural}"),
                &[],
                Some(&object.to_string()),
            );
            assert_eq!(status, 201, "{plural}: {body}");
        }
        let items: Vec<Value> = (0..RUNS)
            .map(|i| {
                json!({"apiVersion": "nodus.dev/v1", "kind": "AgentRun",
                    "metadata": {"name": format!("trial-t{i}")},
                    "spec": {"agent": "appender", "group": "trial", "taskKey": format!("t{i}"),
                        "input": format!("Task {i}: append to log.txt."),
                        "workdir": {"baseWorkdir": "seed"}}})
            })
            .collect();
        let list = json!({"apiVersion": "nodus.dev/v1", "kind": "AgentRunList", "items": items});
        let (status, body) = server.http_with(
            "POST",
            &format!("{PROJECT}/agentruns"),
            &[],
            Some(&list.to_string()),
        );
        assert_eq!(status, 201, "runs: {body}");
        before
    }

    fn runs(server: &ServerProcess) -> Vec<Value> {
        let (status, list) = server.http_with(
            "GET",
            &format!("{PROJECT}/agentruns?fieldSelector=spec.group=trial"),
            &[],
            None,
        );
        assert_eq!(status, 200, "{list}");
        list["items"].as_array().cloned().unwrap_or_default()
    }

    fn phase(run: &Value) -> String {
        run["status"]["phase"].as_str().unwrap_or("").to_string()
    }

    /// Wait until every run is final or, with `parked_ok`, in NeedsResolution or held back
    /// by the group's cap (which parked runs keep holding: a parked run's cap counts against
    /// the group's until it is resolved).
    fn settle(
        server: &ServerProcess,
        parked_ok: bool,
        timeout: Duration,
    ) -> Result<Vec<Value>, String> {
        let deadline = Instant::now() + timeout;
        loop {
            let runs = Self::runs(server);
            let phases: Vec<String> = runs.iter().map(Self::phase).collect();
            let parked = phases.iter().any(|p| p == "NeedsResolution");
            let held = phases.iter().any(|p| p == "Pending") && parked && {
                let (_, group) =
                    server.http_with("GET", &format!("{PROJECT}/agentgroups/trial"), &[], None);
                group["status"]["blockedReasons"]["MaxCostReached"].as_u64() > Some(0)
            };
            let settled = phases.iter().all(|phase| {
                matches!(phase.as_str(), "Succeeded" | "Failed" | "Cancelled")
                    || (parked_ok && phase == "NeedsResolution")
                    || (parked_ok && held && phase == "Pending")
            });
            if settled {
                return Ok(runs);
            }
            if Instant::now() > deadline {
                let (_, group) =
                    server.http_with("GET", &format!("{PROJECT}/agentgroups/trial"), &[], None);
                let phases: Vec<String> = runs
                    .iter()
                    .map(|run| format!("{}={}", Self::name(run), Self::phase(run)))
                    .collect();
                return Err(format!(
                    "runs did not settle within {timeout:?}: {phases:?}; group {}",
                    group["status"]
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn name(run: &Value) -> &str {
        run["metadata"]["name"].as_str().unwrap_or_default()
    }

    /// An uninterrupted group: how long it takes (the window kill moments are drawn from).
    fn calibrate(&self) -> Duration {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = self.backend.store_url(dir.path());
        let server = self.start_server(&store, dir.path());
        self.set_up(&server);
        let started = Instant::now();
        Self::settle(&server, false, Duration::from_secs(120)).expect("an uninterrupted group");
        let took = started.elapsed();
        let runs = Self::runs(&server);
        assert!(
            runs.iter().all(|run| Self::phase(run) == "Succeeded"),
            "an uninterrupted group succeeds: {runs:?}"
        );
        drop(server);
        drop_database(&store);
        took
    }

    fn trial(&self, kill_ms: u64) -> Trial {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = self.backend.store_url(dir.path());
        let mut first = self.start_server(&store, dir.path());
        let before = self.set_up(&first);
        std::thread::sleep(Duration::from_millis(kill_ms));
        first.kill();
        let mut trial = Self::record(kill_ms);
        let second = self.start_server(&store, dir.path());
        self.check(&second, before, &mut trial);
        drop(second);
        drop(first);
        drop_database(&store);
        trial
    }

    fn check(&self, server: &ServerProcess, credits_before: i128, trial: &mut Trial) {
        // Every run reaches a final phase or NeedsResolution.
        let runs = match Self::settle(server, true, Duration::from_secs(90)) {
            Ok(runs) => runs,
            Err(e) => {
                trial.defects.push(format!("after the restart: {e}"));
                return;
            }
        };
        trial.phases = runs.iter().map(Self::phase).collect();
        // No run was lost.
        let mut names: Vec<String> = runs
            .iter()
            .filter_map(|run| run["metadata"]["name"].as_str().map(str::to_string))
            .collect();
        names.sort();
        let expected: Vec<String> = (0..RUNS).map(|i| format!("trial-t{i}")).collect();
        if names != expected {
            trial
                .defects
                .push(format!("runs {names:?}, not {expected:?}"));
        }
        // Resolve what the kill interrupted (as failed: it may or may not have run); the
        // runs then finish.
        for run in runs
            .iter()
            .filter(|run| Self::phase(run) == "NeedsResolution")
        {
            let name = run["metadata"]["name"].as_str().unwrap_or_default();
            let (status, body) = server.http_with(
                "POST",
                &format!("{PROJECT}/agentruns/{name}/resolve"),
                &[],
                Some(r#"{"action":"recordFailed"}"#),
            );
            if status != 200 {
                trial
                    .defects
                    .push(format!("resolving {name}: {status} {body}"));
            }
        }
        let runs = match Self::settle(server, false, Duration::from_secs(90)) {
            Ok(runs) => runs,
            Err(e) => {
                trial.defects.push(format!("after resolving: {e}"));
                return;
            }
        };
        let mut spent = 0;
        for run in &runs {
            let name = run["metadata"]["name"].as_str().unwrap_or_default();
            if Self::phase(run) != "Succeeded" {
                trial.defects.push(format!(
                    "{name} ended {}: {}",
                    Self::phase(run),
                    run["status"]
                ));
            }
            spent += dollars(&run["status"]["cost"]["totalUSD"], "a run's totalUSD");
            self.check_commands(server, name, trial);
        }
        // No reservation held; the credits went down by exactly what the runs cost.
        let (_, credits) = server.http_with("GET", &format!("{PROJECT}/credits"), &[], None);
        let reserved = &credits["reserved"];
        if !(reserved.is_null() || reserved == &json!({})) {
            trial
                .defects
                .push(format!("credits still reserved: {credits}"));
        }
        let after = dollars(&credits["balanceUSD"], "balanceUSD");
        if credits_before - after != spent {
            trial.defects.push(format!(
                "credits went from {credits_before} to {after} nano-dollars, but the runs cost {spent}"
            ));
        }
        if spent == 0 {
            trial
                .defects
                .push("the runs cost nothing: the trial does not test money".to_string());
        }
        // The group's spend is the runs' and within its cap.
        let (_, group) =
            server.http_with("GET", &format!("{PROJECT}/agentgroups/trial"), &[], None);
        let group_spent = dollars(&group["status"]["cost"]["totalUSD"], "the group's totalUSD");
        if group_spent != spent || group_spent > nanos(GROUP_CAP) {
            trial.defects.push(format!(
                "the group spent {group_spent} nano-dollars (cap {GROUP_CAP}), its runs {spent}"
            ));
        }
    }

    /// Each command step of `name` against its kept working directory's `log.txt`.
    fn check_commands(&self, server: &ServerProcess, name: &str, trial: &mut Trial) {
        let (status, steps) = server.http_with(
            "GET",
            &format!("{PROJECT}/agentruns/{name}/steps?payload=true"),
            &[],
            None,
        );
        if status != 200 {
            trial
                .defects
                .push(format!("steps of {name}: {status} {steps}"));
            return;
        }
        let log = match kept_log(server, name) {
            Ok(log) => log,
            Err(e) => {
                trial.defects.push(format!("{name}: {e}"));
                return;
            }
        };
        let lines: Vec<&str> = log.lines().collect();
        let mut journaled = Vec::new();
        for step in steps["items"].as_array().into_iter().flatten() {
            if step["intent"]["kind"] != "command" {
                continue;
            }
            let command = step["intent"]["command"].as_str().unwrap_or_default();
            let Some(marker) = command
                .strip_prefix("echo ")
                .and_then(|rest| rest.split_whitespace().next())
            else {
                trial
                    .defects
                    .push(format!("{name}: a command not asked for: {command}"));
                continue;
            };
            if journaled.contains(&marker.to_string()) {
                trial
                    .defects
                    .push(format!("{name}: `{command}` journaled twice"));
            }
            journaled.push(marker.to_string());
            let ran = lines.iter().filter(|line| **line == marker).count();
            let outcome = step["outcome"]["result"].as_str().unwrap_or("none");
            let by_resolution = step["outcome"]["byResolution"] == true;
            match outcome {
                "commandFinished" => {
                    trial.completed += 1;
                    if ran != 1 {
                        trial.defects.push(format!(
                            "{name}: completed `{command}` ran {ran} times:\n{log}"
                        ));
                    }
                }
                _ => {
                    if by_resolution {
                        trial.interrupted += 1;
                    }
                    if ran > 1 {
                        trial.defects.push(format!(
                            "{name}: `{command}` ({outcome}) ran {ran} times:\n{log}"
                        ));
                    }
                }
            }
        }
        for line in &lines {
            if !journaled.iter().any(|marker| marker == line) {
                trial.defects.push(format!(
                    "{name}: `{line}` in log.txt, from no journaled command"
                ));
            }
        }
    }
}

/// `log.txt` from the run's kept final working directory.
fn kept_log(server: &ServerProcess, name: &str) -> Result<String, String> {
    let output = server.cli(&["agentrun", "workdir", name, "-"]);
    if !output.status.success() {
        return Err(format!(
            "no kept working directory: {}",
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    let mut archive = tar::Archive::new(output.stdout.as_slice());
    let entries = archive
        .entries()
        .map_err(|e| format!("not a tar archive: {e}"))?;
    for entry in entries {
        let mut entry = entry.map_err(|e| format!("a bad tar entry: {e}"))?;
        let path = entry.path().map_err(|e| e.to_string())?.into_owned();
        if path.file_name().is_some_and(|file| file == "log.txt") {
            let mut text = String::new();
            std::io::Read::read_to_string(&mut entry, &mut text).map_err(|e| e.to_string())?;
            return Ok(text);
        }
    }
    // No command appended anything (the kill came before the first).
    Ok(String::new())
}

fn drop_database(store: &str) {
    if !store.starts_with("postgres") {
        return;
    }
    let (server, database) = store.rsplit_once('/').expect("a database");
    let _ = std::process::Command::new("psql")
        .arg(format!("{server}/postgres"))
        .args([
            "-q",
            "-c",
            &format!("DROP DATABASE IF EXISTS {database} WITH (FORCE)"),
        ])
        .output();
}

fn trials(backend: Backend, label: &str) {
    let count: usize = std::env::var("NODUS_KILL_TRIALS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(3);
    let seed: u64 = std::env::var("NODUS_KILL_SEED")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(1)
        });
    let (_runtime, harness) = Harness::new(backend);
    let window = harness.calibrate();
    let window_ms = window.as_millis() as u64;
    eprintln!("{label}: an uninterrupted group takes {window_ms} ms; seed {seed}");
    let mut rng = Rng(seed);
    let mut results = Vec::new();
    for n in 0..count {
        let kill_ms = rng.below(window_ms);
        let trial = harness.trial(kill_ms);
        eprintln!(
            "{label} trial {n}: killed at {kill_ms} ms, phases {:?}, {} commands completed, {} interrupted, {}",
            trial.phases,
            trial.completed,
            trial.interrupted,
            if trial.defects.is_empty() {
                "passed".to_string()
            } else {
                format!("DEFECTS {:?}", trial.defects)
            }
        );
        results.push(trial);
    }
    if let Ok(path) = std::env::var("NODUS_KILL_TALLY") {
        std::fs::write(&path, tally(label, window_ms, seed, &results)).expect("the tally");
    }
    let failed: Vec<&Trial> = results.iter().filter(|t| !t.defects.is_empty()).collect();
    assert!(
        failed.is_empty(),
        "{} of {count} trials failed: {failed:#?}",
        failed.len()
    );
}

/// The tally as a Markdown table (and the defects found, if any).
fn tally(label: &str, window_ms: u64, seed: u64, results: &[Trial]) -> String {
    let passed = results.iter().filter(|t| t.defects.is_empty()).count();
    let parked = |t: &Trial| t.phases.iter().filter(|p| *p == "NeedsResolution").count();
    let parked_trials = results.iter().filter(|t| parked(t) > 0).count();
    let parked_runs: usize = results.iter().map(parked).sum();
    let completed: usize = results.iter().map(|t| t.completed).sum();
    let interrupted: usize = results.iter().map(|t| t.interrupted).sum();
    let mut out = String::new();
    let _ = writeln!(
        out,
        "| store | trials | passed | failed | trials with runs parked | runs parked | commands completed, each found once | commands interrupted, each found at most once | kill window (ms) | seed |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|---|---|---|---|---|");
    let _ = writeln!(
        out,
        "| {label} | {} | {passed} | {} | {parked_trials} | {parked_runs} | {completed} | {interrupted} | 0–{window_ms} | {seed} |",
        results.len(),
        results.len() - passed
    );
    for trial in results.iter().filter(|t| !t.defects.is_empty()) {
        let _ = writeln!(
            out,
            "\n- killed at {} ms: {:?}",
            trial.kill_ms, trial.defects
        );
    }
    out
}

#[test]
fn kill_trials_on_sqlite() {
    trials(Backend::Sqlite, "SQLite");
}

#[test]
fn kill_trials_on_postgres() {
    trials(Backend::Postgres, "Postgres");
}

/// The replica names that hold leases on runs now (from the store's own table).
fn lease_owners(store: &str) -> Vec<String> {
    let output = Command::new("psql")
        .arg(store)
        .args([
            "-tAc",
            "SELECT owner FROM nodus.leases WHERE owner IS NOT NULL",
        ])
        .output()
        .expect("psql");
    assert!(output.status.success(), "psql: {output:?}");
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(str::to_string)
        .collect()
}

#[test]
fn two_replicas_on_postgres_one_killed_the_other_finishes_its_runs() {
    let (_runtime, harness) = Harness::new(Backend::Postgres);
    let store = server::postgres_url();
    let (dir_a, dir_b) = (
        tempfile::tempdir().expect("a"),
        tempfile::tempdir().expect("b"),
    );
    let mut a = harness.start_server(&store, dir_a.path());
    let before = harness.set_up(&a);
    // Replicas share the key that seals Secrets and keys tokens.
    std::fs::copy(
        dir_a.path().join("secret.key"),
        dir_b.path().join("secret.key"),
    )
    .expect("the key");
    std::fs::set_permissions(
        dir_b.path().join("secret.key"),
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )
    .expect("owner-only");
    let replica_a = std::fs::read_to_string(dir_a.path().join("replica-name"))
        .expect("replica A's name")
        .trim()
        .to_string();
    let b = harness.start_server(&store, dir_b.path());
    // Kill A while it holds runs, with B up beside it.
    let deadline = Instant::now() + Duration::from_secs(30);
    let held = loop {
        let held = lease_owners(&store)
            .iter()
            .filter(|owner| **owner == replica_a)
            .count();
        if held > 0 {
            break held;
        }
        assert!(Instant::now() < deadline, "replica A never held a run");
        std::thread::sleep(Duration::from_millis(20));
    };
    a.kill();
    let killed = Instant::now();
    let mut trial = Harness::record(0);
    harness.check(&b, before, &mut trial);
    let took = killed.elapsed();
    eprintln!(
        "replica A held {held} runs when killed; B finished the group {} ms later; phases {:?}, {} commands completed, {} interrupted",
        took.as_millis(),
        trial.phases,
        trial.completed,
        trial.interrupted
    );
    assert!(trial.defects.is_empty(), "{:#?}", trial.defects);
    // A's runs waited for their leases to run out (renewed every 10 s, for 30 s).
    assert!(
        took >= Duration::from_secs(15),
        "B took A's runs over after {took:?}, before their leases ran out"
    );
    drop(b);
    drop_database(&store);
}

/// A PostgreSQL server of the test's own (as the unprivileged user of scripts/test-env when
/// run as root), to be stopped and started again; stopped and removed when dropped.
struct OwnPostgres {
    dir: tempfile::TempDir,
    bin: PathBuf,
    port: u16,
    root: bool,
}

impl OwnPostgres {
    const USER: &str = "nodus-pg";

    fn start() -> OwnPostgres {
        let bin = std::fs::read_dir("/usr/lib/postgresql")
            .expect("PostgreSQL installed (scripts/test-env installs it)")
            .filter_map(|entry| entry.ok())
            .filter_map(|entry| {
                let version: u32 = entry.file_name().to_str()?.parse().ok()?;
                Some((version, entry.path().join("bin")))
            })
            .max()
            .map(|(_, bin)| bin)
            .expect("a PostgreSQL version");
        let root = Command::new("id")
            .arg("-u")
            .output()
            .is_ok_and(|out| out.stdout.trim_ascii() == b"0");
        let dir = tempfile::tempdir().expect("tempdir");
        let pg = OwnPostgres {
            dir,
            bin,
            port: server::free_port(),
            root,
        };
        if root {
            let chown = Command::new("chown")
                .arg(Self::USER)
                .arg(pg.dir.path())
                .status()
                .expect("chown");
            assert!(
                chown.success(),
                "the user {} (scripts/test-env makes it)",
                Self::USER
            );
        }
        pg.run("initdb", &["-U", "postgres", "--auth=trust", "-E", "UTF8"]);
        pg.up();
        pg
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    fn run(&self, tool: &str, args: &[&str]) {
        let program = self.bin.join(tool);
        let mut command = if self.root {
            let mut command = Command::new("runuser");
            command.args(["-u", Self::USER, "--"]).arg(program);
            command
        } else {
            Command::new(program)
        };
        let output = command
            .arg("-D")
            .arg(self.data())
            .args(args)
            .output()
            .expect("a PostgreSQL tool");
        assert!(output.status.success(), "{tool} {args:?}: {output:?}");
    }

    fn up(&self) {
        let options = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1",
            self.port,
            self.data().display()
        );
        let log = self.dir.path().join("server.log");
        self.run(
            "pg_ctl",
            &[
                "-w",
                "-l",
                &log.display().to_string(),
                "-o",
                &options,
                "start",
            ],
        );
    }

    fn down(&self) {
        self.run("pg_ctl", &["-w", "-m", "fast", "stop"]);
    }

    fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }
}

impl Drop for OwnPostgres {
    fn drop(&mut self) {
        let _ = Command::new(self.bin.join("pg_ctl"))
            .arg("-D")
            .arg(self.data())
            .args(["-m", "immediate", "stop"])
            .output();
        if self.root {
            let _ = Command::new("runuser")
                .args(["-u", Self::USER, "--"])
                .arg(self.bin.join("pg_ctl"))
                .arg("-D")
                .arg(self.data())
                .args(["-m", "immediate", "stop"])
                .output();
        }
    }
}

/// An HTTP call that keeps the answer's headers: (status, headers in lower case, body).
fn call_with_headers(
    url: &str,
    method: &str,
    path: &str,
    body: Option<&str>,
) -> (u16, Vec<(String, String)>, String) {
    let mut command = Command::new("curl");
    command.args(["-s", "-i", "--max-time", "30", "-X", method]);
    command.arg(format!("{url}{path}"));
    command.args(["-H", &format!("Authorization: Bearer {}", server::TOKEN)]);
    command.args(["-H", "Content-Type: application/json"]);
    if let Some(body) = body {
        command.args(["--data-binary", body]);
    }
    let output = command.output().expect("curl");
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|line| line.split_whitespace().nth(1))
        .and_then(|code| code.parse().ok())
        .unwrap_or(0);
    let headers = lines
        .filter_map(|line| line.split_once(':'))
        .map(|(name, value)| (name.trim().to_ascii_lowercase(), value.trim().to_string()))
        .collect();
    (status, headers, body.to_string())
}

#[test]
fn a_ten_second_postgres_outage_refuses_writes_with_retry_after_and_loses_nothing() {
    let pg = OwnPostgres::start();
    let (_runtime, harness) = Harness::new(Backend::Postgres);
    let store = pg.url();
    let dir = tempfile::tempdir().expect("tempdir");
    let mut server = harness.start_server(&store, dir.path());
    let before = harness.set_up(&server);
    std::thread::sleep(Duration::from_millis(1500));
    pg.down();
    let stopped = Instant::now();
    let url = server.url.clone();
    // A write and a read while the store is down, at once: each may wait for a connection
    // as long as the pool waits (10 s); the store stays down until both are answered.
    let agent = json!({"apiVersion": "nodus.dev/v1", "kind": "Agent",
        "metadata": {"name": "during-outage"}, "spec": {"system": "s"}});
    let (write, read) = std::thread::scope(|scope| {
        let write = scope.spawn(|| {
            call_with_headers(
                &url,
                "POST",
                &format!("{PROJECT}/agents"),
                Some(&agent.to_string()),
            )
        });
        let read = scope.spawn(|| {
            call_with_headers(&url, "GET", &format!("{PROJECT}/agentruns/trial-t0"), None)
        });
        // Meanwhile the server stays up and says it is alive.
        while stopped.elapsed() < Duration::from_secs(10)
            || !(write.is_finished() && read.is_finished())
        {
            assert!(server.alive(), "the server exited during the outage");
            let (status, _, body) = call_with_headers(&url, "GET", "/healthz", None);
            assert_eq!(status, 200, "healthz during the outage: {body}");
            std::thread::sleep(Duration::from_millis(250));
        }
        (write.join().expect("write"), read.join().expect("read"))
    });
    let outage = stopped.elapsed();
    pg.up();
    eprintln!(
        "outage of {} ms: the write answered {} {:?}, the read {} {:?}",
        outage.as_millis(),
        write.0,
        write.1.iter().find(|(name, _)| name == "retry-after"),
        read.0,
        read.1.iter().find(|(name, _)| name == "retry-after"),
    );
    let retry_after = |headers: &[(String, String)]| {
        headers
            .iter()
            .find(|(name, _)| name == "retry-after")
            .and_then(|(_, value)| value.parse::<u64>().ok())
            .is_some_and(|seconds| seconds > 0)
    };
    // The write is refused, retryably, saying when to try again.
    assert_eq!(write.0, 503, "a write during the outage: {}", write.2);
    assert!(
        write.2.contains("\"reason\":\"Unavailable\""),
        "{}",
        write.2
    );
    assert!(
        retry_after(&write.1),
        "a refused write says when to try again: {write:?}"
    );
    // The read is answered, or refused the same way.
    assert!(
        read.0 == 200 || (read.0 == 503 && retry_after(&read.1)),
        "a read during the outage: {read:?}"
    );
    assert!(server.alive(), "the server exited");
    let mut trial = Harness::record(0);
    harness.check(&server, before, &mut trial);
    eprintln!(
        "after the outage: phases {:?}, {} commands completed, {} interrupted",
        trial.phases, trial.completed, trial.interrupted
    );
    assert!(trial.defects.is_empty(), "{:#?}", trial.defects);
    let (status, _, _) = call_with_headers(
        &server.url,
        "GET",
        &format!("{PROJECT}/agents/during-outage"),
        None,
    );
    assert_eq!(status, 404, "the refused write wrote nothing");
    assert!(server.alive(), "the server exited");
}

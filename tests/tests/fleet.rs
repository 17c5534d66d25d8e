//! A fleet (issue 30): three replicas on one PostgreSQL database, each with `--capacity 5`,
//! drive a group of 60 runs whose commands sleep and then append a line to a file all
//! replicas share (the unisolated sandbox runs commands as plain processes, so an absolute
//! path outside the working directory is the same file for every replica). Sampled all along,
//! no replica ever holds more than 5 live sandboxes; one replica is sent SIGTERM mid-way,
//! drains (its running commands finish, its runs are handed over) and exits, and the others
//! continue its runs within 2 s of its exit; every run succeeds and every command's line is in
//! the file exactly once.
//!
//! Beside it: `nodus server drain NAME` drains another replica process through the store; a
//! command cut by the drain timeout parks its run on the replica that takes it over; an API
//! replica drives nothing while a worker beside it drives everything and serves only
//! `/healthz` and `/metrics`.

#[path = "support/server.rs"]
mod server;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nodus_core::cost::Usage;
use nodus_llm::testing::{Fake, FakeMessage, FakeServer, RecordedRequest};
use serde_json::{Value, json};
use server::ServerProcess;

const RUNS: usize = 60;
const CAPACITY: usize = 5;
/// Commands each run's model asks for before it answers.
const COMMANDS: usize = 2;
const PROJECT: &str = "/apis/nodus.dev/v1/projects/default";

/// The run a model request is for: its input names it (`fleet-t<i>`).
fn label(request: &RecordedRequest) -> String {
    let body = request.body.to_string();
    let at = body
        .find("fleet-t")
        .expect("the run's label in its request");
    let digits: String = body[at + "fleet-t".len()..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    format!("fleet-t{digits}")
}

/// The fake provider's answer: command k of a run sleeps `seconds`, then appends `<run>-c<k>`
/// to the shared log; after `commands` commands it answers.
fn responder(
    log: PathBuf,
    seconds: &'static str,
    commands: usize,
) -> impl Fn(&RecordedRequest) -> Fake + Send + Sync + 'static {
    move |request| {
        let results = request.body["messages"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|message| message["content"].as_array())
            .flatten()
            .filter(|block| block["type"] == "tool_result")
            .count();
        let usage = Usage {
            input_tokens: 200,
            output_tokens: 20,
            ..Usage::default()
        };
        let message = if results < commands {
            FakeMessage::tool_use(
                &format!("toolu_c{results}"),
                &format!(
                    "sleep {seconds} && echo {}-c{results} >> {}",
                    label(request),
                    log.display()
                ),
            )
        } else {
            FakeMessage::text(&format!("done after {results} commands"))
        };
        Fake::Message(message.with_usage(usage))
    }
}

/// Live sandboxes of a replica: the unisolated backend's directories under its data
/// directory, made when a run's sandbox is created and removed when it is deleted.
fn live_sandboxes(data_dir: &Path) -> usize {
    std::fs::read_dir(data_dir.join("sandboxes")).map_or(0, |entries| entries.count())
}

/// The commands (`sleep … && echo <run>-c<k>`) running now under the process `pid`, by the
/// line each appends when it finishes (its shell's command line names it).
fn commands_under(pid: u32) -> BTreeSet<String> {
    let mut parents = BTreeMap::new();
    let mut shells = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(child) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // pid (comm) state ppid …: the comm may hold spaces, so split after its ')'.
        let Some(ppid) = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|ppid| ppid.parse::<u32>().ok())
        else {
            continue;
        };
        parents.insert(child, ppid);
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        if cmdline.contains("sleep ") && cmdline.contains(" && echo fleet-t") {
            shells.push((child, cmdline));
        }
    }
    shells
        .into_iter()
        .filter(|(shell, _)| {
            let mut at = *shell;
            for _ in 0..16 {
                match parents.get(&at) {
                    Some(&parent) if parent == pid => return true,
                    Some(&parent) if parent > 1 => at = parent,
                    _ => return false,
                }
            }
            false
        })
        .filter_map(|(_, cmdline)| {
            let at = cmdline.find("echo ")? + "echo ".len();
            cmdline[at..].split_whitespace().next().map(str::to_string)
        })
        .collect()
}

/// Who holds each run's lease now (by run uid; released leases have no owner).
fn lease_owners(store: &str) -> BTreeMap<String, String> {
    let output = Command::new("psql")
        .arg(store)
        .args([
            "-tAF",
            " ",
            "-c",
            "SELECT run_uid, owner FROM nodus.leases WHERE owner IS NOT NULL",
        ])
        .output()
        .expect("psql");
    assert!(output.status.success(), "psql: {output:?}");
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| line.split_once(' '))
        .map(|(uid, owner)| (uid.to_string(), owner.to_string()))
        .collect()
}

fn runs(server: &ServerProcess) -> Vec<Value> {
    let (status, list) = server.http_with(
        "GET",
        &format!("{PROJECT}/agentruns?fieldSelector=spec.group=fleet"),
        &[],
        None,
    );
    assert_eq!(status, 200, "{list}");
    list["items"].as_array().cloned().unwrap_or_default()
}

fn phase(run: &Value) -> &str {
    run["status"]["phase"].as_str().unwrap_or("")
}

fn is_final(run: &Value) -> bool {
    matches!(phase(run), "Succeeded" | "Failed" | "Cancelled")
}

fn replica_name(data_dir: &Path) -> String {
    std::fs::read_to_string(data_dir.join("replica-name"))
        .expect("the replica's name")
        .trim()
        .to_string()
}

fn share_key(from: &Path, to: &Path) {
    std::fs::copy(from.join("secret.key"), to.join("secret.key")).expect("the key");
    std::fs::set_permissions(
        to.join("secret.key"),
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )
    .expect("owner-only");
}

/// A multi-threaded runtime for the fake provider.
fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

/// Start a replica on `store` in `dir` (unisolated sandboxes, the fake provider at
/// `base_url`) with more `nodus server` flags.
fn replica(store: &str, dir: &Path, base_url: &str, extra: &[&str]) -> ServerProcess {
    ServerProcess::start_in_env(
        store,
        dir,
        "unisolated",
        extra,
        &[
            ("ANTHROPIC_BASE_URL", base_url),
            ("ANTHROPIC_API_KEY", "sk-ant-platform-fleet-0001"),
        ],
    )
}

/// Credits, the agent `sleeper`, the group `fleet` and its runs `fleet-t0` … `fleet-t<n-1>`,
/// created through `server`. Returns run names by uid.
fn create_group(server: &ServerProcess, n: usize) -> BTreeMap<String, String> {
    let (status, body) = server.http_with(
        "POST",
        &format!("{PROJECT}/credits"),
        &[],
        Some(&json!({"addUSD": "100.00"}).to_string()),
    );
    assert!(status == 200 || status == 201, "credits: {body}");
    for (plural, object) in [
        (
            "agents",
            json!({"apiVersion": "nodus.dev/v1", "kind": "Agent",
                "metadata": {"name": "sleeper"},
                "spec": {"system": "Sleep, then append to the log.", "model": {"access": "Nodus"},
                    "maxTokens": 1024, "perRunMaxCostUSD": "0.50"}}),
        ),
        (
            "agentgroups",
            json!({"apiVersion": "nodus.dev/v1", "kind": "AgentGroup",
                "metadata": {"name": "fleet"},
                "spec": {"agent": "sleeper", "maxCostUSD": "60.00"}}),
        ),
    ] {
        let (status, body) = server.http_with(
            "POST",
            &format!("{PROJECT}/{plural}"),
            &[],
            Some(&object.to_string()),
        );
        assert_eq!(status, 201, "{plural}: {body}");
    }
    let items: Vec<Value> = (0..n)
        .map(|i| {
            json!({"apiVersion": "nodus.dev/v1", "kind": "AgentRun",
                "metadata": {"name": format!("fleet-t{i}")},
                "spec": {"agent": "sleeper", "group": "fleet", "taskKey": format!("t{i}"),
                    "input": format!("Run fleet-t{i}: sleep and append.")}})
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
    let uids: BTreeMap<String, String> = runs(server)
        .iter()
        .map(|run| {
            (
                run["metadata"]["uid"].as_str().expect("a uid").to_string(),
                run["metadata"]["name"]
                    .as_str()
                    .expect("a name")
                    .to_string(),
            )
        })
        .collect();
    assert_eq!(uids.len(), n);
    uids
}

/// Wait until every run of the group is final; returns them.
fn all_final(server: &ServerProcess, within: Duration) -> Vec<Value> {
    let deadline = Instant::now() + within;
    loop {
        let runs = runs(server);
        if runs.iter().all(is_final) {
            return runs;
        }
        assert!(
            Instant::now() < deadline,
            "runs did not finish: {:?}",
            runs.iter()
                .map(|run| format!("{}={}", run["metadata"]["name"], phase(run)))
                .collect::<Vec<_>>()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// How many times each line is in the log.
fn line_counts(log: &Path) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for line in std::fs::read_to_string(log).unwrap_or_default().lines() {
        *counts.entry(line.to_string()).or_default() += 1;
    }
    counts
}

/// Drop the test's database.
fn drop_database(store: &str) {
    let _ = Command::new("psql")
        .arg(
            store
                .rsplit_once('/')
                .map(|(s, _)| format!("{s}/postgres"))
                .unwrap_or_default(),
        )
        .args([
            "-q",
            "-c",
            &format!(
                "DROP DATABASE IF EXISTS {} WITH (FORCE)",
                store.rsplit_once('/').map(|(_, d)| d).unwrap_or_default()
            ),
        ])
        .output();
}

#[test]
fn three_replicas_with_capacity_five_share_sixty_runs_and_one_drains_midway() {
    let runtime = runtime();
    let shared = tempfile::tempdir().expect("the shared directory");
    let log = shared.path().join("commands.log");
    let fake = runtime
        .block_on(FakeServer::start())
        .expect("fake provider");
    fake.respond_with(responder(log.clone(), "1.5", COMMANDS));
    let store = server::postgres_url();
    let dirs: Vec<tempfile::TempDir> = (0..3)
        .map(|_| tempfile::tempdir().expect("a data directory"))
        .collect();
    let base_url = fake.base_url();
    let capacity = CAPACITY.to_string();
    let start = |dir: &Path| {
        replica(
            &store,
            dir,
            &base_url,
            &["--capacity", &capacity, "--drain-timeout", "20"],
        )
    };
    let mut a = start(dirs[0].path());
    share_key(dirs[0].path(), dirs[1].path());
    share_key(dirs[0].path(), dirs[2].path());
    let b = start(dirs[1].path());
    let c = start(dirs[2].path());
    let names: Vec<String> = dirs.iter().map(|d| replica_name(d.path())).collect();

    // Sample each replica's live sandboxes until the test ends (A's only while it runs).
    let done = Arc::new(AtomicBool::new(false));
    let a_alive = Arc::new(AtomicBool::new(true));
    let most = Arc::new(Mutex::new([0usize; 3]));
    let sampler = {
        let (done, a_alive, most) = (done.clone(), a_alive.clone(), most.clone());
        let paths: Vec<PathBuf> = dirs.iter().map(|d| d.path().to_path_buf()).collect();
        std::thread::spawn(move || {
            let mut samples = 0u64;
            while !done.load(Ordering::SeqCst) {
                for (i, path) in paths.iter().enumerate() {
                    if i == 0 && !a_alive.load(Ordering::SeqCst) {
                        continue;
                    }
                    let live = live_sandboxes(path);
                    let mut most = most.lock().expect("most");
                    most[i] = most[i].max(live);
                }
                samples += 1;
                std::thread::sleep(Duration::from_millis(20));
            }
            samples
        })
    };

    let uids = create_group(&a, RUNS);

    // Mid-way (a third of the commands done) and while A runs a command: SIGTERM A.
    let deadline = Instant::now() + Duration::from_secs(120);
    let (held_by_a, running) = loop {
        let lines = std::fs::read_to_string(&log)
            .unwrap_or_default()
            .lines()
            .count();
        let held: BTreeSet<String> = lease_owners(&store)
            .into_iter()
            .filter(|(_, owner)| *owner == names[0])
            .map(|(uid, _)| uid)
            .collect();
        let running = commands_under(a.pid());
        if lines >= RUNS * COMMANDS / 3 && !held.is_empty() && !running.is_empty() {
            break (held, running);
        }
        assert!(
            Instant::now() < deadline,
            "never mid-way with A running a command"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    // The store lists the three replicas, each with its role, capacity and version.
    let (status, listed) = b.http_with("GET", "/apis/nodus.dev/v1/replicas", &[], None);
    assert_eq!(status, 200, "{listed}");
    let mut listed_names: Vec<&str> = listed["items"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|item| {
            assert_eq!(item["spec"]["role"], "all", "{item}");
            assert_eq!(item["spec"]["capacity"], CAPACITY, "{item}");
            assert_eq!(item["spec"]["version"], env!("CARGO_PKG_VERSION"), "{item}");
            item["metadata"]["name"].as_str().unwrap_or_default()
        })
        .collect();
    listed_names.sort_unstable();
    let mut all_names: Vec<&str> = names.iter().map(String::as_str).collect();
    all_names.sort_unstable();
    assert_eq!(listed_names, all_names);
    a.terminate();
    let terminated = Instant::now();
    while a.alive() {
        assert!(
            terminated.elapsed() < Duration::from_secs(40),
            "A did not exit within its drain timeout"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let exited = Instant::now();
    a_alive.store(false, Ordering::SeqCst);
    // The commands A ran when told to stop finished before it handed their runs over (the
    // drain timeout, 20 s, is far longer than a command).
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    for line in &running {
        assert!(
            text.lines().any(|l| l == line),
            "A's command {line} did not finish before A exited"
        );
    }
    // Each run A drove when told to stop is continued by B or C within 2 s of A's exit (or
    // A finished it before it stopped).
    let mut waiting: BTreeSet<String> = held_by_a.clone();
    // The runs seen under B's or C's lease: handed over (a run A held when sampled may have
    // been finished by A before the signal reached it, and says so).
    let mut handed_over: BTreeSet<String> = BTreeSet::new();
    while !waiting.is_empty() {
        let owners = lease_owners(&store);
        let finished: BTreeSet<String> = runs(&b)
            .iter()
            .filter(|run| is_final(run))
            .filter_map(|run| run["metadata"]["uid"].as_str().map(str::to_string))
            .collect();
        waiting.retain(|uid| {
            let continued = owners
                .get(uid)
                .is_some_and(|owner| *owner == names[1] || *owner == names[2]);
            if continued {
                handed_over.insert(uid.clone());
            }
            !continued && !finished.contains(uid)
        });
        if waiting.is_empty() {
            break;
        }
        assert!(
            exited.elapsed() < Duration::from_secs(2),
            "2 s after A exited ({} ms after SIGTERM), runs it drove are not continued: {:?}",
            exited.duration_since(terminated).as_millis(),
            waiting.iter().map(|uid| &uids[uid]).collect::<Vec<_>>()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let continued_after = exited.elapsed();

    // Every run succeeds.
    let finished = all_final(&b, Duration::from_secs(180));
    done.store(true, Ordering::SeqCst);
    let samples = sampler.join().expect("the sampler");
    let most = *most.lock().expect("most");
    let not_succeeded: Vec<String> = finished
        .iter()
        .filter(|run| phase(run) != "Succeeded")
        .map(|run| format!("{}={}", run["metadata"]["name"], phase(run)))
        .collect();
    assert!(not_succeeded.is_empty(), "{not_succeeded:?}");
    // The runs A handed over say who finished them.
    for run in &finished {
        let uid = run["metadata"]["uid"].as_str().unwrap_or_default();
        if handed_over.contains(uid) {
            let replica = run["status"]["replica"].as_str().unwrap_or_default();
            assert!(
                replica == names[1] || replica == names[2],
                "{} was handed over by A and shows replica {replica:?}",
                uids[uid]
            );
        }
    }

    // Every command's line exactly once: none ran twice, none was lost.
    let counts = line_counts(&log);
    let expected: BTreeSet<String> = (0..RUNS)
        .flat_map(|i| (0..COMMANDS).map(move |k| format!("fleet-t{i}-c{k}")))
        .collect();
    let twice: Vec<_> = counts.iter().filter(|(_, n)| **n > 1).collect();
    assert!(
        twice.is_empty(),
        "commands that ran more than once: {twice:?}"
    );
    let seen: BTreeSet<String> = counts.keys().map(|line| line.to_string()).collect();
    assert_eq!(seen, expected, "every command's line, and nothing else");

    eprintln!(
        "{samples} samples; most live sandboxes per replica {most:?}; A held {} runs at SIGTERM \
         ({} seen handed over), running {running:?}, exited {} ms later, its runs continued {} ms after its exit",
        held_by_a.len(),
        handed_over.len(),
        exited.duration_since(terminated).as_millis(),
        continued_after.as_millis()
    );
    assert!(
        most.iter().all(|&n| n <= CAPACITY),
        "a replica held more than {CAPACITY} live sandboxes: {most:?}"
    );
    assert!(
        most.contains(&CAPACITY),
        "no replica ever filled its capacity, so the test proves nothing: {most:?}"
    );
    // A drained replica leaves the list; `nodus get replicas` shows the others.
    let table = b.ok(&["get", "replicas"]);
    let header = table.lines().next().unwrap_or_default();
    for column in ["NAME", "ROLE", "CAPACITY", "IN-USE", "HEARTBEAT", "VERSION"] {
        assert!(header.contains(column), "{column} in {table}");
    }
    assert!(
        !table.contains(&names[0]),
        "A drained and is listed: {table}"
    );
    for name in &names[1..] {
        assert!(
            table
                .lines()
                .any(|l| l.starts_with(name.as_str()) && l.contains(" all ")),
            "{name} in {table}"
        );
    }
    // Each replica's gauges in /metrics (no token needed: nothing of any project).
    let (status, metrics) = b.http_with("GET", "/metrics", &[], None);
    assert_eq!(status, 200);
    let metrics = metrics.as_str().unwrap_or_default().to_string();
    let labels = format!("{{replica=\"{}\",role=\"all\"}}", names[1]);
    for line in [
        format!("nodus_replica_capacity{labels} {CAPACITY}"),
        format!("nodus_replica_sandboxes_in_use{labels} 0"),
        format!("nodus_replica_draining{labels} 0"),
    ] {
        assert!(metrics.lines().any(|l| l == line), "{line} in {metrics}");
    }
    drop(b);
    drop(c);
    drop_database(&store);
}

/// The runs whose lease `owner` holds now (by uid).
fn held_by(store: &str, owner: &str) -> BTreeSet<String> {
    lease_owners(store)
        .into_iter()
        .filter(|(_, holder)| holder == owner)
        .map(|(uid, _)| uid)
        .collect()
}

/// `nodus server drain NAME`, run against replica B, stops replica A, another process: A hears
/// it through the store, takes no more runs, lets its running commands finish, hands its runs
/// over and exits 0; B finishes them. Only the operator token may ask; an unknown name is a
/// NotFound that names it.
#[test]
fn server_drain_name_drains_another_replica_through_the_store() {
    const N: usize = 8;
    let runtime = runtime();
    let shared = tempfile::tempdir().expect("the shared directory");
    let log = shared.path().join("commands.log");
    let fake = runtime
        .block_on(FakeServer::start())
        .expect("fake provider");
    fake.respond_with(responder(log.clone(), "1.5", COMMANDS));
    let store = server::postgres_url();
    let dirs: Vec<tempfile::TempDir> = (0..2)
        .map(|_| tempfile::tempdir().expect("a data directory"))
        .collect();
    let base_url = fake.base_url();
    let flags = ["--capacity", "3", "--drain-timeout", "20"];
    let mut a = replica(&store, dirs[0].path(), &base_url, &flags);
    share_key(dirs[0].path(), dirs[1].path());
    let b = replica(&store, dirs[1].path(), &base_url, &flags);
    let (name_a, name_b) = (replica_name(dirs[0].path()), replica_name(dirs[1].path()));

    // Refused: a name no replica has, and a project's admin token (not the operator's).
    let refused = b.fails(&["server", "drain", "replica-nobody"]);
    assert!(
        refused.contains("NotFound") && refused.contains("replica-nobody"),
        "{refused}"
    );
    let (status, token) = b.http_with(
        "POST",
        &format!("{PROJECT}/tokens"),
        &[],
        Some(r#"{"metadata": {"name": "project-admin"}, "spec": {"role": "admin"}}"#),
    );
    assert_eq!(status, 201, "{token}");
    let secret = token["token"].as_str().expect("the new token's secret");
    let (status, body) = b.http(
        "POST",
        &format!("/apis/nodus.dev/v1/replicas/{name_a}/drain"),
        Some(secret),
        None,
    );
    assert_eq!(status, 403, "a project admin asked for a drain: {body}");

    let uids = create_group(&a, N);
    // While A holds runs and runs a command, ask for its drain through B.
    let deadline = Instant::now() + Duration::from_secs(60);
    let (held, running) = loop {
        let held = held_by(&store, &name_a);
        let running = commands_under(a.pid());
        if !held.is_empty() && !running.is_empty() {
            break (held, running);
        }
        assert!(Instant::now() < deadline, "A never ran a command");
        std::thread::sleep(Duration::from_millis(20));
    };
    let said = b.ok(&["server", "drain", &name_a]);
    assert!(said.contains(&format!("replica/{name_a}")), "{said}");
    let asked = Instant::now();
    let status = loop {
        if let Some(status) = a.try_status() {
            break status;
        }
        assert!(
            asked.elapsed() < Duration::from_secs(30),
            "A did not stop within its drain timeout after the drain request"
        );
        std::thread::sleep(Duration::from_millis(10));
    };
    assert!(status.success(), "A exited with {status}");
    let log_a = std::fs::read_to_string(&a.log).unwrap_or_default();
    assert!(
        log_a.contains("an operator asked this replica to drain"),
        "A's log: {log_a}"
    );
    // Its running commands finished before it handed their runs over.
    let counts = line_counts(&log);
    for line in &running {
        assert_eq!(counts.get(line), Some(&1), "A's command {line}: {counts:?}");
    }
    let finished = all_final(&b, Duration::from_secs(90));
    for run in &finished {
        assert_eq!(phase(run), "Succeeded", "{run}");
        let uid = run["metadata"]["uid"].as_str().unwrap_or_default();
        if held.contains(uid) {
            assert_eq!(
                run["status"]["replica"], name_b,
                "{} was A's when it drained",
                uids[uid]
            );
        }
    }
    let counts = line_counts(&log);
    let expected: BTreeSet<String> = (0..N)
        .flat_map(|i| (0..COMMANDS).map(move |k| format!("fleet-t{i}-c{k}")))
        .collect();
    assert_eq!(
        counts.keys().cloned().collect::<BTreeSet<_>>(),
        expected,
        "every command's line"
    );
    assert!(
        counts.values().all(|&n| n == 1),
        "a command ran twice: {counts:?}"
    );
    // A drained and left the list.
    let table = b.ok(&["get", "replicas"]);
    assert!(!table.contains(&name_a), "{table}");
    drop(b);
    drop_database(&store);
}

/// A command cut by the drain timeout is an interrupted command like any other: the replica
/// that takes the run over parks it (the command may or may not have had its effect), and once
/// resolved it runs there. The cut command was killed: its line never appears.
#[test]
fn a_command_cut_by_the_drain_timeout_parks_and_is_continued_by_another_replica() {
    let runtime = runtime();
    let shared = tempfile::tempdir().expect("the shared directory");
    let log = shared.path().join("commands.log");
    let fake = runtime
        .block_on(FakeServer::start())
        .expect("fake provider");
    fake.respond_with(responder(log.clone(), "4", 1));
    let store = server::postgres_url();
    let dirs: Vec<tempfile::TempDir> = (0..2)
        .map(|_| tempfile::tempdir().expect("a data directory"))
        .collect();
    let base_url = fake.base_url();
    let mut a = replica(&store, dirs[0].path(), &base_url, &["--drain-timeout", "1"]);
    let uids = create_group(&a, 1);
    let deadline = Instant::now() + Duration::from_secs(60);
    while commands_under(a.pid()).is_empty() {
        assert!(Instant::now() < deadline, "A never ran the command");
        std::thread::sleep(Duration::from_millis(20));
    }
    share_key(dirs[0].path(), dirs[1].path());
    let b = replica(&store, dirs[1].path(), &base_url, &[]);
    let name_b = replica_name(dirs[1].path());
    a.terminate();
    let terminated = Instant::now();
    while a.alive() {
        assert!(
            terminated.elapsed() < Duration::from_secs(10),
            "A did not exit after its 1 s drain timeout"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    // B takes the run over and parks it on the interrupted command.
    let deadline = Instant::now() + Duration::from_secs(30);
    let parked = loop {
        let run = runs(&b).pop().expect("the run");
        if phase(&run) == "NeedsResolution" {
            break run;
        }
        assert!(
            Instant::now() < deadline,
            "the cut command's run did not park: {run}"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(
        parked["status"]["message"]
            .as_str()
            .or(parked["status"]["reason"].as_str())
            .is_some(),
        "{parked}"
    );
    let steps = b.ok(&["agentrun", "steps", "fleet-t0"]);
    assert!(steps.contains("Uncertain"), "{steps}");
    // Past the time the cut command would have finished, its line is not there: it was
    // killed, not left running.
    std::thread::sleep(Duration::from_secs(5).saturating_sub(terminated.elapsed()));
    assert!(line_counts(&log).is_empty(), "the cut command went on");
    let (status, body) = b.http_with(
        "POST",
        &format!("{PROJECT}/agentruns/fleet-t0/resolve"),
        &[],
        Some(r#"{"action":"retry"}"#),
    );
    assert_eq!(status, 200, "{body}");
    let finished = all_final(&b, Duration::from_secs(60));
    assert_eq!(phase(&finished[0]), "Succeeded", "{}", finished[0]);
    assert_eq!(finished[0]["status"]["replica"], name_b);
    assert_eq!(uids.len(), 1);
    let counts = line_counts(&log);
    assert_eq!(
        counts,
        BTreeMap::from([("fleet-t0-c0".to_string(), 1)]),
        "the retried command ran once, on B"
    );
    drop(b);
    drop_database(&store);
}

/// An API replica records and answers but drives nothing (it never makes a sandbox); a worker
/// replica beside it drives every run and serves only /healthz and /metrics.
#[test]
fn an_api_replica_drives_nothing_and_a_worker_serves_only_health_and_metrics() {
    const N: usize = 4;
    let runtime = runtime();
    let shared = tempfile::tempdir().expect("the shared directory");
    let log = shared.path().join("commands.log");
    let fake = runtime
        .block_on(FakeServer::start())
        .expect("fake provider");
    fake.respond_with(responder(log.clone(), "0.2", 1));
    let store = server::postgres_url();
    let dirs: Vec<tempfile::TempDir> = (0..2)
        .map(|_| tempfile::tempdir().expect("a data directory"))
        .collect();
    let base_url = fake.base_url();
    let api = replica(&store, dirs[0].path(), &base_url, &["--role", "api"]);
    share_key(dirs[0].path(), dirs[1].path());
    let worker = replica(&store, dirs[1].path(), &base_url, &["--role", "worker"]);
    let (name_api, name_worker) = (replica_name(dirs[0].path()), replica_name(dirs[1].path()));

    // The worker: health and metrics, nothing else (not the API, the console, the document).
    let (status, _) = worker.http("GET", "/healthz", None, None);
    assert_eq!(status, 200);
    let (status, metrics) = worker.http_with("GET", "/metrics", &[], None);
    assert_eq!(status, 200);
    let gauge = format!("nodus_replica_capacity{{replica=\"{name_worker}\",role=\"worker\"}} ");
    assert!(
        metrics.as_str().unwrap_or_default().contains(&gauge),
        "{gauge} in {metrics}"
    );
    for path in [
        &format!("{PROJECT}/agentruns") as &str,
        "/apis/nodus.dev/v1/replicas",
        "/openapi.json",
        "/",
    ] {
        let (status, body) = worker.http_with("GET", path, &[], None);
        assert_eq!(status, 404, "{path} on the worker: {body}");
    }
    let (status, body) = worker.http_with(
        "POST",
        &format!("{PROJECT}/agents"),
        &[],
        Some(r#"{"apiVersion": "nodus.dev/v1", "kind": "Agent", "metadata": {"name": "x"}}"#),
    );
    assert_eq!(status, 404, "a write on the worker: {body}");

    // The API replica takes the runs; the worker drives all of them; the API replica never
    // makes a sandbox.
    create_group(&api, N);
    let deadline = Instant::now() + Duration::from_secs(60);
    let finished = loop {
        assert_eq!(
            live_sandboxes(dirs[0].path()),
            0,
            "the API replica made a sandbox"
        );
        let runs = runs(&api);
        if runs.iter().all(is_final) {
            break runs;
        }
        assert!(Instant::now() < deadline, "runs did not finish: {runs:?}");
        std::thread::sleep(Duration::from_millis(20));
    };
    for run in &finished {
        assert_eq!(phase(run), "Succeeded", "{run}");
        assert_eq!(run["status"]["replica"], name_worker, "{run}");
    }
    assert_eq!(line_counts(&log).len(), N);
    let (status, listed) = api.http_with("GET", "/apis/nodus.dev/v1/replicas", &[], None);
    assert_eq!(status, 200, "{listed}");
    let roles: BTreeMap<String, (String, u64)> = listed["items"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|item| {
            (
                item["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
                (
                    item["spec"]["role"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string(),
                    item["spec"]["capacity"].as_u64().unwrap_or(u64::MAX),
                ),
            )
        })
        .collect();
    assert_eq!(roles[&name_api], ("api".to_string(), 0));
    assert_eq!(roles[&name_worker].0, "worker");
    assert!(roles[&name_worker].1 > 0, "{listed}");
    drop(worker);
    drop(api);
    drop_database(&store);
}

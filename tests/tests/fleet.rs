//! A fleet (issue 30): three replicas on one PostgreSQL database, each with `--capacity 5`,
//! drive a group of 60 runs whose commands sleep and then append a line to a file all
//! replicas share (the unisolated sandbox runs commands as plain processes, so an absolute
//! path outside the working directory is the same file for every replica). Sampled all along,
//! no replica ever holds more than 5 live sandboxes; one replica is sent SIGTERM mid-way,
//! drains (its running commands finish, its runs are handed over) and exits, and the others
//! continue its runs within 2 s of its exit; every run succeeds and every command's line is in
//! the file exactly once.

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

/// The fake provider's answer: command k of a run sleeps, then appends `<run>-c<k>` to the
/// shared log; after [`COMMANDS`] commands it answers.
fn responder(log: PathBuf) -> impl Fn(&RecordedRequest) -> Fake + Send + Sync + 'static {
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
        let message = if results < COMMANDS {
            FakeMessage::tool_use(
                &format!("toolu_c{results}"),
                &format!(
                    "sleep 1.5 && echo {}-c{results} >> {}",
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

/// The commands (`sleep`) running now under the process `pid`, by the run each is for (its
/// shell's command line names it).
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
        if cmdline.contains("sleep 1.5 && echo fleet-t") {
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

#[test]
fn three_replicas_with_capacity_five_share_sixty_runs_and_one_drains_midway() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let shared = tempfile::tempdir().expect("the shared directory");
    let log = shared.path().join("commands.log");
    let fake = runtime
        .block_on(FakeServer::start())
        .expect("fake provider");
    fake.respond_with(responder(log.clone()));
    let store = server::postgres_url();
    let dirs: Vec<tempfile::TempDir> = (0..3)
        .map(|_| tempfile::tempdir().expect("a data directory"))
        .collect();
    let base_url = fake.base_url();
    let start = |dir: &Path| {
        ServerProcess::start_in_env(
            &store,
            dir,
            "unisolated",
            &["--capacity", &CAPACITY.to_string(), "--drain-timeout", "20"],
            &[
                ("ANTHROPIC_BASE_URL", base_url.as_str()),
                ("ANTHROPIC_API_KEY", "sk-ant-platform-fleet-0001"),
            ],
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

    let (status, body) = a.http_with(
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
        let (status, body) = a.http_with(
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
                "metadata": {"name": format!("fleet-t{i}")},
                "spec": {"agent": "sleeper", "group": "fleet", "taskKey": format!("t{i}"),
                    "input": format!("Run fleet-t{i}: sleep and append.")}})
        })
        .collect();
    let list = json!({"apiVersion": "nodus.dev/v1", "kind": "AgentRunList", "items": items});
    let (status, body) = a.http_with(
        "POST",
        &format!("{PROJECT}/agentruns"),
        &[],
        Some(&list.to_string()),
    );
    assert_eq!(status, 201, "runs: {body}");
    let uids: BTreeMap<String, String> = runs(&b)
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
    assert_eq!(uids.len(), RUNS);

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
    let deadline = Instant::now() + Duration::from_secs(180);
    let finished = loop {
        let runs = runs(&b);
        if runs.iter().all(is_final) {
            break runs;
        }
        assert!(
            Instant::now() < deadline,
            "runs did not finish: {:?}",
            runs.iter()
                .map(|run| format!("{}={}", run["metadata"]["name"], phase(run)))
                .collect::<Vec<_>>()
        );
        std::thread::sleep(Duration::from_millis(200));
    };
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
        if held_by_a.contains(uid) {
            let replica = run["status"]["replica"].as_str().unwrap_or_default();
            assert!(
                replica == names[1] || replica == names[2],
                "{} was handed over by A and shows replica {replica:?}",
                uids[uid]
            );
        }
    }

    // Every command's line exactly once: none ran twice, none was lost.
    let text = std::fs::read_to_string(&log).expect("the log");
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for line in text.lines() {
        *counts.entry(line).or_default() += 1;
    }
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
        "{samples} samples; most live sandboxes per replica {most:?}; A held {} runs at SIGTERM, \
         running {running:?}, exited {} ms later, its runs continued {} ms after its exit",
        held_by_a.len(),
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

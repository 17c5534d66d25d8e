//! Restart: the server is killed with SIGKILL while a group of runs is executing commands,
//! then started again on the same store. Every run either finishes or, where a command was in
//! flight, parks in NeedsResolution; no completed command runs twice; a resolved run finishes.

#[path = "support/server.rs"]
mod server;

use std::time::{Duration, Instant};

use server::ServerProcess;

const RUNS: usize = 4;

fn json(text: &str) -> serde_json::Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
}

#[test]
fn a_killed_server_resumes_and_never_repeats_a_completed_command() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = format!("sqlite://{}", dir.path().join("nodus.db").display());
    let mut first = ServerProcess::start(&store, dir.path(), "process");
    first.ok(&[
        "apply",
        "-f",
        concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/agent.yaml"),
    ]);
    first.ok(&[
        "create",
        "agentgroup",
        "batch",
        "--agent",
        "hello-agent",
        "--max-active",
        "4",
        "--max-cost",
        "2.00",
    ]);
    // Each run appends to a file in its working directory, sleeps, appends again, and shows
    // the file: a command that ran twice would show twice.
    for i in 0..RUNS {
        first.ok(&[
            "create",
            "agentrun",
            &format!("batch-t{i}"),
            "--agent",
            "hello-agent",
            "--group",
            "batch",
            "--task-key",
            &format!("t{i}"),
            "--prompt",
            "Run `echo start >> log.txt`, then `sleep 3`, then `echo end >> log.txt; cat log.txt`.",
        ]);
    }
    // Kill the server while commands are in flight.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let steps = first.ok(&["agentrun", "steps", "batch-t0"]);
        if steps
            .lines()
            .any(|l| l.contains("Command") && l.contains("sleep 3") && l.contains("Started"))
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no command got under way:\n{steps}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    first.kill();

    let second = ServerProcess::start(&store, dir.path(), "process");
    let mut parked = Vec::new();
    for i in 0..RUNS {
        let name = format!("batch-t{i}");
        let deadline = Instant::now() + Duration::from_secs(60);
        let phase = loop {
            let phase = second.ok(&[
                "get",
                &format!("agentrun/{name}"),
                "-o",
                "jsonpath={.status.phase}",
            ]);
            let phase = phase.trim().to_string();
            if matches!(
                phase.as_str(),
                "Succeeded" | "NeedsResolution" | "Failed" | "Cancelled"
            ) {
                break phase;
            }
            assert!(Instant::now() < deadline, "{name} stayed {phase}");
            std::thread::sleep(Duration::from_millis(100));
        };
        match phase.as_str() {
            "Succeeded" => {}
            "NeedsResolution" => parked.push(name),
            other => panic!("{name} ended {other}"),
        }
    }
    assert!(
        !parked.is_empty(),
        "a command was in flight when the server was killed"
    );
    for name in &parked {
        let steps = second.ok(&["agentrun", "steps", name]);
        assert!(
            steps.lines().any(|l| l.contains("Uncertain")),
            "the interrupted step is shown as uncertain:\n{steps}"
        );
        second.ok(&["agentrun", "resolve", name, "--action", "record-failed"]);
        second.ok(&[
            "wait",
            &format!("agentrun/{name}"),
            "--for=jsonpath={.status.phase}=Succeeded",
            "--timeout=1m",
        ]);
    }
    for i in 0..RUNS {
        let name = format!("batch-t{i}");
        let answer = second.ok(&["agentrun", "answer", &name]);
        let starts = answer.lines().filter(|l| l.trim() == "start").count();
        // A command interrupted by the kill and recorded as failed may or may not have run
        // before the kill; no command ever runs twice.
        if parked.contains(&name) {
            assert!(
                starts <= 1,
                "{name}: `echo start` ran at most once:\n{answer}"
            );
        } else {
            assert_eq!(starts, 1, "{name}: `echo start` ran once:\n{answer}");
        }
        let steps = json(&second.ok(&["get", &format!("agentrun/{name}"), "-o", "json"]));
        assert_eq!(steps["status"]["phase"], "Succeeded");
    }
    // The group finishes once sealed.
    second.ok(&[
        "patch",
        "ag/batch",
        "--patch",
        r#"{"spec":{"sealed":true}}"#,
    ]);
    second.ok(&[
        "wait",
        "ag/batch",
        "--for=jsonpath={.status.phase}=Succeeded",
        "--timeout=1m",
    ]);
}

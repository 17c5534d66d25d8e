//! End to end: the real `nodus server` on SQLite and on Postgres with the bubblewrap process
//! sandbox and the offline model, driven by the real `nodus` CLI and by plain HTTP, walking
//! the examples of the spec.

#[path = "support/server.rs"]
mod server;

use server::{Backend, ServerProcess, TOKEN};

const EXAMPLES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples");

fn example(name: &str) -> String {
    format!("{EXAMPLES}/{name}")
}

fn walk_the_spec(backend: Backend) {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = backend.store_url(dir.path());
    let server = ServerProcess::start(&store, dir.path(), "process");

    // Sign in and create an agent; start a run and wait for it.
    server.ok(&["apply", "-f", &example("agent.yaml")]);
    server.ok(&["apply", "-f", &example("run.yaml")]);
    server.ok(&[
        "wait",
        "agentrun/hello-agent-run",
        "--for=jsonpath={.status.phase}=Succeeded",
        "--timeout=2m",
    ]);
    let yaml = server.ok(&["get", "agentrun/hello-agent-run", "-o", "yaml"]);
    assert!(yaml.contains("phase: Succeeded"), "{yaml}");
    assert!(
        yaml.contains("chosenBy:"),
        "turns say how their model was chosen: {yaml}"
    );
    let answer = server.ok(&["agentrun", "answer", "hello-agent-run"]);
    assert!(
        answer.contains("offline model"),
        "the offline model says what it is: {answer}"
    );
    let steps = server.ok(&["agentrun", "steps", "hello-agent-run"]);
    assert!(
        steps.contains("SandboxCreation") && steps.contains("Completed"),
        "{steps}"
    );

    // Without a file: a prompt that quotes a command runs it in the sandbox.
    server.ok(&[
        "create",
        "agentrun",
        "triage",
        "--agent",
        "hello-agent",
        "--prompt",
        "Run `echo triaged` please",
    ]);
    server.ok(&[
        "wait",
        "agentrun/triage",
        "--for=jsonpath={.status.phase}=Succeeded",
        "--timeout=2m",
    ]);
    assert!(
        server
            .ok(&["agentrun", "answer", "triage"])
            .contains("triaged")
    );

    // keepAlive: a message key delivers once; a finished run refuses with AgentRunFinished.
    server.ok(&[
        "create",
        "agentrun",
        "chat",
        "--agent",
        "hello-agent",
        "--prompt",
        "Run `echo first`",
        "--keep-alive",
    ]);
    server.ok(&[
        "wait",
        "agentrun/chat",
        "--for=jsonpath={.status.phase}=Waiting",
        "--timeout=2m",
    ]);
    server.ok(&[
        "agentrun",
        "send",
        "chat",
        "Now run `echo staging`",
        "--key",
        "staging-1",
    ]);
    server.ok(&[
        "agentrun",
        "send",
        "chat",
        "Now run `echo staging`",
        "--key",
        "staging-1",
    ]);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let turns = server.ok(&[
            "get",
            "agentrun/chat",
            "-o",
            "jsonpath={.status.turns[*].model}",
        ]);
        let phase = server.ok(&["get", "agentrun/chat", "-o", "jsonpath={.status.phase}"]);
        if turns.split_whitespace().count() == 2 && phase.trim() == "Waiting" {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the message was not read: {turns} {phase}"
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    assert!(
        server
            .ok(&["agentrun", "answer", "chat"])
            .contains("staging")
    );
    server.ok(&["cancel", "agentrun/chat"]);
    let refused = server.fails(&["agentrun", "send", "chat", "hello?", "--key", "late"]);
    assert!(refused.contains("AgentRunFinished"), "{refused}");

    // Run agents in parallel: a group with dependencies, sealed after the last run.
    server.ok(&["apply", "-f", &example("parallel-agent.yaml")]);
    server.ok(&["apply", "-f", &example("group.yaml")]);
    server.ok(&["apply", "-f", &example("runs.yaml")]);
    server.ok(&[
        "patch",
        "ag/parallel-agents",
        "--patch",
        r#"{"spec":{"sealed":true}}"#,
    ]);
    server.ok(&[
        "wait",
        "ag/parallel-agents",
        "--for=jsonpath={.status.phase}=Succeeded",
        "--timeout=3m",
    ]);
    let table = server.ok(&["get", "ag"]);
    assert!(
        table.contains("parallel-agents") && table.contains("3/3"),
        "{table}"
    );
    let selected = server.ok(&[
        "get",
        "ar",
        "--field-selector",
        "spec.group=parallel-agents",
        "-o",
        "jsonpath={.items[*].metadata.name}",
    ]);
    assert_eq!(selected.split_whitespace().count(), 3, "{selected}");
    assert!(
        server
            .ok(&["agentrun", "answer", "parallel-agents-c"])
            .contains("offline model")
    );
    // A sealed group refuses new runs with a conflict.
    let (status, body) = server.http(
        "POST",
        "/apis/nodus.dev/v1/projects/default/agentruns",
        Some(TOKEN),
        Some(r#"{"apiVersion":"nodus.dev/v1","kind":"AgentRun","spec":{"agent":"parallel-agents-worker","group":"parallel-agents","taskKey":"d","input":"late"}}"#),
    );
    assert_eq!(
        (status, body["reason"].as_str()),
        (409, Some("Conflict")),
        "{body}"
    );

    // A stopped agent refuses new runs.
    server.ok(&[
        "patch",
        "agent/hello-agent",
        "--patch",
        r#"{"spec":{"state":"Stopped"}}"#,
    ]);
    let stopped = server.fails(&[
        "create",
        "agentrun",
        "late",
        "--agent",
        "hello-agent",
        "--prompt",
        "hi",
    ]);
    assert!(stopped.contains("AgentStopped"), "{stopped}");

    // A wrong token and another project's resources.
    let (status, body) = server.http(
        "GET",
        "/apis/nodus.dev/v1/projects/default/agents",
        Some("nodus_wrong"),
        None,
    );
    assert_eq!(
        (status, body["reason"].as_str()),
        (401, Some("Unauthorized"))
    );
    let (status, _) = server.http(
        "GET",
        "/apis/nodus.dev/v1/projects/someone-else/agents",
        Some(TOKEN),
        None,
    );
    assert_eq!(status, 403);
}

#[test]
fn the_spec_walks_on_sqlite() {
    walk_the_spec(Backend::Sqlite);
}

#[test]
fn the_spec_walks_on_postgres() {
    walk_the_spec(Backend::Postgres);
}

//! The quickstart through the real binaries: `nodus server` on an in-memory store with the
//! unisolated sandbox and the offline model, driven by the `nodus` CLI as the spec shows it:
//! login, apply an agent and a run, wait, `get -o yaml`, `agentrun answer`, `agentrun steps`.

mod support;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use support::{NODUS, TOKEN, nodus, ok, text};

/// A server on the in-memory store with the unisolated sandbox, its data in `dir/data`.
fn start_server(dir: &std::path::Path) -> support::Server {
    support::start_server(dir, Some("memory:"), "unisolated")
}

const AGENT: &str = r#"apiVersion: nodus.dev/v1
kind: Agent
metadata:
  name: hello-agent
spec:
  system: |
    You are a careful assistant. Run shell commands in your sandbox to check your work, and answer in one short
    paragraph.
  # Nodus's Claude: each prompt is routed to Haiku, Sonnet, Opus or Fable, and billed from your credits.
  model:
    access: Nodus
  perRunMaxCostUSD: "0.50"
"#;

const RUN: &str = r#"apiVersion: nodus.dev/v1
kind: AgentRun
metadata:
  name: hello-agent-run
spec:
  agent: hello-agent
  input: "Run `echo hello` and tell me what it printed"
"#;

/// `nodus quickstart` on the data directory of a running `nodus server` is refused, naming
/// the server's pid; once the server stops, another starts on it.
#[test]
fn the_quickstart_is_refused_on_the_data_directory_of_a_running_server() {
    let dir = tempfile::tempdir().expect("tempdir");
    let dir = dir.path();
    let mut server = start_server(dir);
    let data = dir.join("data");
    let output = Command::new(NODUS)
        .arg("quickstart")
        .arg("--data-dir")
        .arg(&data)
        .env_remove("ANTHROPIC_API_KEY")
        .stdin(Stdio::null())
        .output()
        .expect("nodus quickstart runs");
    let stderr = text(&output.stderr);
    assert!(!output.status.success(), "{stderr}");
    let named = format!(
        "data directory {}: it is in use by `nodus server` (pid {}); stop it or pass \
         --data-dir",
        data.display(),
        server.child.id()
    );
    assert!(stderr.contains(&named), "{stderr}");
    let _ = server.child.kill();
    let _ = server.child.wait();
    drop(server);
    let again = start_server(dir);
    drop(again);
}

#[test]
fn the_quickstart_runs_end_to_end_through_the_cli() {
    let dir = tempfile::tempdir().expect("tempdir");
    let dir = dir.path();
    let mut server = start_server(dir);
    let url = server.url();

    // Before login, commands say so with exit code 3.
    let output = nodus(dir, &["get", "agents"]);
    assert_eq!(output.status.code(), Some(3), "{}", text(&output.stderr));
    assert!(text(&output.stderr).contains("nodus login"));

    // A wrong token is refused and nothing is saved.
    let output = nodus(dir, &["login", "--server", &url, "--token", "wrong"]);
    assert_eq!(output.status.code(), Some(3), "{}", text(&output.stderr));
    assert!(text(&output.stderr).contains("Error from server (Unauthorized)"));

    // A token that does not hold the project named is no usable login for it either.
    let output = nodus(
        dir,
        &[
            "login",
            "--server",
            &url,
            "--token",
            TOKEN,
            "--project",
            "elsewhere",
        ],
    );
    assert_eq!(output.status.code(), Some(3), "{}", text(&output.stderr));
    assert!(
        text(&output.stderr).contains("not bound to the project \"elsewhere\""),
        "{}",
        text(&output.stderr)
    );

    let said = ok(dir, &["login", "--server", &url, "--token", TOKEN]);
    assert!(said.contains("Logged in"), "{said}");
    assert!(!said.contains(TOKEN), "the token is never printed");
    let config = dir.join("config/nodus/config.yaml");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(&config)
            .expect("config saved")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    let agent = dir.join("agent.yaml");
    let run = dir.join("run.yaml");
    std::fs::write(&agent, AGENT).expect("write");
    std::fs::write(&run, RUN).expect("write");
    let agent = agent.to_str().expect("utf-8 path");
    let run = run.to_str().expect("utf-8 path");

    assert_eq!(
        ok(dir, &["apply", "-f", agent]),
        "agent.nodus.dev/hello-agent created\n"
    );
    assert_eq!(
        ok(dir, &["apply", "-f", agent]),
        "agent.nodus.dev/hello-agent unchanged\n"
    );
    assert_eq!(
        ok(dir, &["apply", "-f", run]),
        "agentrun.nodus.dev/hello-agent-run created\n"
    );

    let waited = ok(
        dir,
        &[
            "wait",
            "agentrun/hello-agent-run",
            "--for=jsonpath={.status.phase}=Succeeded",
            "--timeout=2m",
        ],
    );
    assert_eq!(waited, "agentrun.nodus.dev/hello-agent-run condition met\n");

    let yaml = ok(dir, &["get", "agentrun/hello-agent-run", "-o", "yaml"]);
    assert!(
        yaml.starts_with("apiVersion: nodus.dev/v1\nkind: AgentRun\n"),
        "{yaml}"
    );
    for expected in [
        "phase: Succeeded",
        "preview:",
        "turns:",
        "chosenBy:",
        "costUSD:",
        "model:",
    ] {
        assert!(yaml.contains(expected), "{expected} in:\n{yaml}");
    }

    let table = ok(dir, &["get", "ar"]);
    let mut lines = table.lines();
    let header: Vec<&str> = lines
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    assert_eq!(header, ["NAME", "PHASE", "MODEL", "COST", "AGE"]);
    let row: Vec<&str> = lines
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    assert_eq!(row[..2], ["hello-agent-run", "Succeeded"], "{table}");
    assert!(row[3].starts_with('$'), "{table}");

    let phase = ok(
        dir,
        &["get", "ar", "-o", "jsonpath={.items[*].status.phase}"],
    );
    assert_eq!(phase, "Succeeded");

    // The offline model ran the quoted command in the sandbox and answered with its output.
    let answer = ok(dir, &["agentrun", "answer", "hello-agent-run"]);
    assert!(answer.contains("echo hello"), "{answer}");
    assert!(
        answer.lines().any(|line| line.trim() == "hello"),
        "{answer}"
    );

    let steps = ok(dir, &["agentrun", "steps", "hello-agent-run"]);
    assert!(steps.starts_with("SEQ"), "{steps}");
    for kind in ["SandboxCreation", "ModelCall", "Command", "SandboxDeletion"] {
        assert!(steps.contains(kind), "{kind} in:\n{steps}");
    }
    assert!(
        steps.lines().skip(1).all(|line| line.contains("Completed")),
        "{steps}"
    );

    // A finished run refuses messages: the server's reason, exit code 1.
    let output = nodus(dir, &["agentrun", "send", "hello-agent-run", "more"]);
    assert_eq!(output.status.code(), Some(1));
    assert!(
        text(&output.stderr).starts_with("Error from server (AgentRunFinished):"),
        "{}",
        text(&output.stderr)
    );

    // A command line the commands themselves find wrong is a usage error, code 2, as clap's.
    for args in [
        &["get", "pods"][..],
        &["cancel", "hello-agent-run"],
        &["wait", "ar/hello-agent-run", "--for=phase=Succeeded"],
        &[
            "wait",
            "ar/hello-agent-run",
            "--for=jsonpath={.status.phase}=Succeeded",
            "--timeout=soon",
        ],
        &[
            "create",
            "agentrun",
            "x",
            "--agent",
            "hello-agent",
            "--prompt",
            "p",
            "--deadline",
            "later",
        ],
        &["delete", "ar"],
    ] {
        let output = nodus(dir, args);
        assert_eq!(
            output.status.code(),
            Some(2),
            "{args:?}: {}",
            text(&output.stderr)
        );
        assert!(
            text(&output.stderr).starts_with("error: "),
            "{}",
            text(&output.stderr)
        );
    }

    // Waiting for a phase the finished run can never reach fails at once with code 5.
    let output = nodus(
        dir,
        &[
            "wait",
            "ar/hello-agent-run",
            "--for=jsonpath={.status.phase}=Failed",
            "--timeout=1m",
        ],
    );
    assert_eq!(output.status.code(), Some(5), "{}", text(&output.stderr));

    // Standard error is not a terminal here: no progress line, only the timeout.
    let output = nodus(
        dir,
        &[
            "wait",
            "ar/hello-agent-run",
            "--for=jsonpath={.metadata.name}=another-name",
            "--timeout=1s",
        ],
    );
    assert_eq!(output.status.code(), Some(4), "{}", text(&output.stderr));
    let stderr = text(&output.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("timed out after 1s"), "{stderr}");

    // SIGTERM stops the server cleanly, with exit code 0.
    let pid = server.child.id().to_string();
    let signalled = Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .expect("kill runs");
    assert!(signalled.success());
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = server.child.try_wait().expect("wait") {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "the server did not stop:\n{}",
            server.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(status.code(), Some(0), "{}", server.log());
    assert!(
        !server.log().contains(TOKEN),
        "the server never prints the token"
    );
}

//! Runs as jobs through a real `nodus server` and the CLI, on SQLite and on Postgres, with the
//! offline model (it runs the commands a prompt quotes in backticks): an inline agent runs
//! and is never stored; every finished run's results (a successful, a failed, a timed-out and
//! a cancelled one) are listed and downloaded, and the tarballs unpack; a FileSet changed
//! after a run was created does not change what the run starts from; `agentrun logs -f`
//! prints a command's output line by line while the command is still running (once only),
//! and ends when the run does; an invalid context schema is refused when the agent is
//! written, and a context that fails it (or is missing) when the run is created, each naming
//! the path.

#[path = "support/server.rs"]
mod server;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};

use server::{Backend, ServerProcess, TOKEN};

const AGENT: &str = "apiVersion: nodus.dev/v1\nkind: Agent\nmetadata:\n  name: worker\nspec:\n  system: You are a careful assistant.\n  perRunMaxCostUSD: \"0.50\"\n";

fn get(server: &ServerProcess, object: &str) -> serde_json::Value {
    serde_json::from_str(&server.ok(&["get", object, "-o", "json"])).expect("JSON")
}

/// Download `result` of `run` into `dir` with the CLI; its path.
fn download(server: &ServerProcess, run: &str, result: &str, dir: &Path) -> std::path::PathBuf {
    let file = dir.join(format!("{run}-{result}"));
    server.ok(&[
        "agentrun",
        "results",
        run,
        result,
        "-o",
        file.to_str().expect("a path"),
    ]);
    file
}

/// Unpack a downloaded `.tar.gz` with the system's tar; the directory.
fn unpack(file: &Path) -> std::path::PathBuf {
    let into = file.with_extension("d");
    std::fs::create_dir_all(&into).expect("a directory");
    let status = Command::new("tar")
        .arg("xzf")
        .arg(file)
        .arg("-C")
        .arg(&into)
        .status()
        .expect("tar runs");
    assert!(status.success(), "{} unpacks", file.display());
    into
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The results `run` lists, by name.
fn listed(server: &ServerProcess, run: &str) -> Vec<String> {
    let (status, answer) = server.http_with(
        "GET",
        &format!("/apis/nodus.dev/v1/projects/default/agentruns/{run}/results"),
        &[],
        None,
    );
    assert_eq!(status, 200, "{answer}");
    let table = server.ok(&["agentrun", "results", run]);
    let names: Vec<String> = answer["items"]
        .as_array()
        .expect("items")
        .iter()
        .map(|item| item["name"].as_str().expect("a name").to_string())
        .collect();
    for name in &names {
        assert!(table.contains(name.as_str()), "{table}");
    }
    names
}

fn jobs(backend: Backend) {
    let dir = tempfile::tempdir().expect("tempdir");
    let downloads = tempfile::tempdir().expect("tempdir");
    let store = backend.store_url(dir.path());
    let server = ServerProcess::start(&store, dir.path(), "process");
    let output = server.cli_in(&["apply", "-f", "-"], Some(AGENT));
    assert!(output.status.success(), "{output:?}");

    // An inline agent: validated, snapshotted, never stored.
    let output = server.cli_in(
        &["apply", "-f", "-"],
        Some(
            "apiVersion: nodus.dev/v1\nkind: AgentRun\nmetadata:\n  name: inline-run\nspec:\n  agent:\n    system: You are a one-off analyst.\n    perRunMaxCostUSD: \"0.20\"\n  input: Run `mkdir out && echo made-$((20+1)) > out/file.txt && echo wrote` and tell me.\n",
        ),
    );
    assert!(output.status.success(), "{output:?}");
    server.wait_for("inline-run", "Succeeded");
    let run = get(&server, "agentrun/inline-run");
    assert_eq!(
        run["status"]["snapshot"]["agent"]["system"],
        "You are a one-off analyst."
    );
    assert!(run["status"]["snapshot"].get("agentRef").is_none(), "{run}");
    let agents = server.ok(&["get", "agents", "-o", "name"]);
    assert!(!agents.contains("one-off"), "{agents}");
    let refused = server.cli_in(
        &["apply", "-f", "-"],
        Some(
            "apiVersion: nodus.dev/v1\nkind: AgentRun\nmetadata:\n  name: bad-inline\nspec:\n  agent:\n    system: \"\"\n  input: hi\n",
        ),
    );
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("spec.agent.system"),
        "{refused:?}"
    );

    // A successful run's results.
    assert_eq!(
        listed(&server, "inline-run"),
        [
            "inputWorkdir",
            "outputWorkdir",
            "artifacts",
            "runRecord",
            "trajectory"
        ]
    );
    let workdir = unpack(&download(
        &server,
        "inline-run",
        "outputWorkdir",
        downloads.path(),
    ));
    assert_eq!(read(&workdir.join("out/file.txt")), "made-21\n");
    let artifacts = unpack(&download(
        &server,
        "inline-run",
        "artifacts",
        downloads.path(),
    ));
    assert!(read(&artifacts.join("commands/001/command")).starts_with("mkdir out"));
    assert_eq!(read(&artifacts.join("commands/001/stdout")), "wrote\n");
    assert_eq!(read(&artifacts.join("commands/001/stderr")), "");
    assert_eq!(read(&artifacts.join("commands/001/exit")), "0\n");
    let input = unpack(&download(
        &server,
        "inline-run",
        "inputWorkdir",
        downloads.path(),
    ));
    assert_eq!(std::fs::read_dir(&input).expect("dir").count(), 0);
    let record: serde_json::Value = serde_json::from_str(&read(&download(
        &server,
        "inline-run",
        "runRecord",
        downloads.path(),
    )))
    .expect("JSON");
    assert_eq!(record["phase"], "Succeeded");
    assert!(
        record["answer"]
            .as_str()
            .is_some_and(|a| a.lines().any(|l| l == "wrote")),
        "{record}"
    );
    let (status, missing) = server.http_with(
        "GET",
        "/apis/nodus.dev/v1/projects/default/agentruns/inline-run/results/error",
        &[],
        None,
    );
    assert_eq!(status, 404, "{missing}");

    // A timed-out run: its commands' output so far and an error saying it was a timeout.
    let output = server.cli_in(
        &["apply", "-f", "-"],
        Some(
            "apiVersion: nodus.dev/v1\nkind: AgentRun\nmetadata:\n  name: slow-run\nspec:\n  agent: worker\n  timeout: 3s\n  input: Run `echo started-$((1+1)) > begun.txt; sleep 60` and tell me.\n",
        ),
    );
    assert!(output.status.success(), "{output:?}");
    server.wait_for("slow-run", "Failed");
    assert_eq!(
        listed(&server, "slow-run"),
        [
            "inputWorkdir",
            "outputWorkdir",
            "artifacts",
            "runRecord",
            "error",
            "trajectory"
        ]
    );
    let error: serde_json::Value = serde_json::from_str(&read(&download(
        &server,
        "slow-run",
        "error",
        downloads.path(),
    )))
    .expect("JSON");
    assert_eq!(error["type"], "TimeoutExceeded", "{error}");
    assert_eq!(error["timeout"], true, "{error}");
    let workdir = unpack(&download(
        &server,
        "slow-run",
        "outputWorkdir",
        downloads.path(),
    ));
    assert_eq!(read(&workdir.join("begun.txt")), "started-2\n");
    let artifacts = unpack(&download(
        &server,
        "slow-run",
        "artifacts",
        downloads.path(),
    ));
    assert!(read(&artifacts.join("commands/001/exit")).starts_with("stopped"));

    // A failed run (not a timeout): its webhook's host name resolves to a loopback address,
    // which this server's webhooks may not reach (refused at delivery, without retries).
    let output = server.cli_in(
        &["apply", "-f", "-"],
        Some(
            "apiVersion: nodus.dev/v1\nkind: AgentRun\nmetadata:\n  name: refused-hook\nspec:\n  agent:\n    system: You are a one-off analyst.\n    perRunMaxCostUSD: \"0.20\"\n  postRunAction: {kind: agents.webhook, config: {url: \"http://localhost:9/hook\"}}\n  input: Run `echo done > done.txt` and tell me.\n",
        ),
    );
    assert!(output.status.success(), "{output:?}");
    server.wait_for("refused-hook", "Failed");
    let error: serde_json::Value = serde_json::from_str(&read(&download(
        &server,
        "refused-hook",
        "error",
        downloads.path(),
    )))
    .expect("JSON");
    assert_eq!(error["type"], "PostRunActionFailed", "{error}");
    assert_eq!(error["timeout"], false, "{error}");
    assert!(
        error["message"]
            .as_str()
            .is_some_and(|m| m.contains("loopback") && m.contains("--webhook-allow")),
        "{error}"
    );
    let workdir = unpack(&download(
        &server,
        "refused-hook",
        "outputWorkdir",
        downloads.path(),
    ));
    assert_eq!(read(&workdir.join("done.txt")), "done\n");

    // Runs of a group that depend on a conversation still waiting stay queued meanwhile; a
    // FileSet changed and a Secret deleted after they were created do not change
    // them.
    let output = server.cli_in(
        &["apply", "-f", "-"],
        Some(
            "apiVersion: nodus.dev/v1\nkind: Secret\nmetadata:\n  name: doomed\nstringData:\n  key: kept-as-submitted\n---\napiVersion: nodus.dev/v1\nkind: FileSet\nmetadata:\n  name: notes\nspec:\n  files:\n  - {path: docs/notes.txt, content: \"as submitted\\n\"}\n---\napiVersion: nodus.dev/v1\nkind: AgentGroup\nmetadata:\n  name: queue\nspec:\n  agent: worker\n  maxCostUSD: \"5.00\"\n---\napiVersion: nodus.dev/v1\nkind: AgentRun\nmetadata:\n  name: queue-holder\nspec:\n  agent: worker\n  group: queue\n  taskKey: holder\n  keepAlive: true\n  input: Run `echo holding` and tell me.\n",
        ),
    );
    assert!(output.status.success(), "{output:?}");
    server.wait_for("queue-holder", "Waiting");
    let output = server.cli_in(
        &["apply", "-f", "-"],
        Some(
            "apiVersion: nodus.dev/v1\nkind: AgentRun\nmetadata:\n  name: queue-files\nspec:\n  agent: worker\n  group: queue\n  taskKey: files\n  dependsOn: [holder]\n  workdir: {baseWorkdir: \"notes#docs/\"}\n  input: Run `cat notes.txt` and tell me.\n---\napiVersion: nodus.dev/v1\nkind: AgentRun\nmetadata:\n  name: queue-secret\nspec:\n  agent: worker\n  group: queue\n  taskKey: secret\n  dependsOn: [holder]\n  environment:\n    env:\n    - name: KEY\n      valueFrom: {secretKeyRef: {name: doomed, key: key}}\n  input: Run `echo $KEY` and tell me.\n",
        ),
    );
    assert!(output.status.success(), "{output:?}");
    // After submission: the FileSet changes and the Secret goes.
    let output = server.cli_in(
        &["apply", "-f", "-"],
        Some(
            "apiVersion: nodus.dev/v1\nkind: FileSet\nmetadata:\n  name: notes\nspec:\n  files:\n  - {path: docs/notes.txt, content: \"changed later\\n\"}\n",
        ),
    );
    assert!(output.status.success(), "{output:?}");
    server.ok(&["delete", "secret/doomed"]);
    server.ok(&["agentrun", "close", "queue-holder"]);
    server.wait_for("queue-files", "Succeeded");
    let answer = server.ok(&["agentrun", "answer", "queue-files"]);
    assert!(answer.contains("as submitted"), "{answer}");
    assert!(!answer.contains("changed later"), "{answer}");
    let input = unpack(&download(
        &server,
        "queue-files",
        "inputWorkdir",
        downloads.path(),
    ));
    assert_eq!(read(&input.join("notes.txt")), "as submitted\n");
    server.wait_for("queue-secret", "Succeeded");
    let answer = server.ok(&["agentrun", "answer", "queue-secret"]);
    assert!(answer.contains("kept-as-submitted"), "{answer}");

    // A cancelled run.
    server.ok(&[
        "create",
        "agentrun",
        "cancelled-run",
        "--agent",
        "worker",
        "--keep-alive",
        "--prompt",
        "Run `echo kept > kept.txt` and tell me.",
    ]);
    server.wait_for("cancelled-run", "Waiting");
    server.ok(&["cancel", "agentrun/cancelled-run"]);
    server.wait_for("cancelled-run", "Cancelled");
    let error: serde_json::Value = serde_json::from_str(&read(&download(
        &server,
        "cancelled-run",
        "error",
        downloads.path(),
    )))
    .expect("JSON");
    assert_eq!(error["type"], "CancelRequested", "{error}");
    let workdir = unpack(&download(
        &server,
        "cancelled-run",
        "outputWorkdir",
        downloads.path(),
    ));
    assert_eq!(read(&workdir.join("kept.txt")), "kept\n");

    // logs -f: a command's output shows line by line while the command still runs, and once
    // only.
    server.ok(&[
        "create",
        "agentrun",
        "followed",
        "--agent",
        "worker",
        "--prompt",
        "Run `sleep 2; for i in 1 2 3; do echo line-$i; echo warn-$i >&2; sleep 1; done` and tell me.",
    ]);
    let mut logs = Command::new(server::nodus_binary())
        .args(["agentrun", "logs", "followed", "-f"])
        .env("NODUS_SERVER", &server.url)
        .env("NODUS_TOKEN", TOKEN)
        .env("XDG_CONFIG_HOME", server.data_dir.join("config"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("nodus runs");
    let mut lines = BufReader::new(logs.stdout.take().expect("stdout")).lines();
    let mut seen = Vec::new();
    loop {
        let line = lines
            .next()
            .expect("logs ended before the first line")
            .expect("a line");
        seen.push(line.clone());
        if line == "line-1" {
            break;
        }
    }
    // The command has printed its first line and is still running: its step is open.
    let (status, steps) = server.http_with(
        "GET",
        "/apis/nodus.dev/v1/projects/default/agentruns/followed/steps?payload=true",
        &[],
        None,
    );
    assert_eq!(status, 200, "{steps}");
    let command = steps["items"]
        .as_array()
        .expect("items")
        .iter()
        .find(|step| {
            step["intent"]["command"]
                .as_str()
                .is_some_and(|c| c.contains("line-$i"))
        })
        .unwrap_or_else(|| panic!("the command's step: {steps}"));
    assert!(
        command["finishedAt"].is_null(),
        "line-1 showed only once the command had finished: {seen:?} {command}"
    );
    assert!(!seen.iter().any(|l| l.contains("line-2")), "{seen:?}");
    let rest: Vec<String> = lines.map(|line| line.expect("a line")).collect();
    assert!(logs.wait().expect("logs ends").success());
    let all: Vec<&String> = seen.iter().chain(&rest).collect();
    for line in [
        "line-1",
        "line-2",
        "line-3",
        "stderr: warn-1",
        "stderr: warn-3",
    ] {
        assert_eq!(
            all.iter().filter(|l| l.as_str() == line).count(),
            1,
            "{line} shows once: {all:?}"
        );
    }
    assert_eq!(
        rest.last().map(String::as_str),
        Some("agentrun/followed Succeeded")
    );
}

#[test]
fn jobs_on_sqlite() {
    jobs(Backend::Sqlite);
}

#[test]
fn jobs_on_postgres() {
    jobs(Backend::Postgres);
}

/// A context checked against the agent's schema, on a real store: an invalid schema (and one
/// with `$ref`) is refused when the agent is written, naming the path in the schema; a run
/// whose context fails the schema, or that lacks a required context, is refused naming the
/// path, with nothing written; a run whose context fits runs.
fn context(backend: Backend) {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = backend.store_url(dir.path());
    let server = ServerProcess::start(&store, dir.path(), "process");
    let agent = |schema: &str| {
        format!(
            "apiVersion: nodus.dev/v1\nkind: Agent\nmetadata:\n  name: typed\nspec:\n  system: You are a careful assistant.\n  perRunMaxCostUSD: \"0.10\"\n  contextSchema: {schema}\n"
        )
    };
    for (schema, field) in [
        (
            "{type: object, properties: {ticket: {type: objekt}}}",
            "spec.contextSchema.properties.ticket.type",
        ),
        (
            "{type: object, properties: {ticket: {$ref: \"#/$defs/t\"}}}",
            "spec.contextSchema.properties.ticket.$ref",
        ),
    ] {
        let output = server.cli_in(&["apply", "-f", "-"], Some(&agent(schema)));
        assert!(!output.status.success(), "{schema} was accepted");
        let said = String::from_utf8_lossy(&output.stderr);
        assert!(said.contains(field), "{field} not named: {said}");
        assert!(!server.cli(&["get", "agent/typed"]).status.success());
    }
    let output = server.cli_in(
        &["apply", "-f", "-"],
        Some(&agent(
            "{type: object, properties: {ticket: {type: object, properties: {id: {type: integer}}}}, required: [ticket]}",
        )),
    );
    assert!(output.status.success(), "{output:?}");
    let run = |name: &str, context: Option<&str>| {
        let mut document = format!(
            "apiVersion: nodus.dev/v1\nkind: AgentRun\nmetadata:\n  name: {name}\nspec:\n  agent: typed\n  input: Run `echo checked` and tell me.\n"
        );
        if let Some(context) = context {
            document.push_str(&format!("  context: {context}\n"));
        }
        server.cli_in(&["apply", "-f", "-"], Some(&document))
    };
    for (name, context, parts) in [
        (
            "wrong-type",
            Some("{ticket: {id: seven}}"),
            &["spec.context.ticket.id", "\"seven\""][..],
        ),
        ("no-context", None, &["spec.context", "ticket"][..]),
    ] {
        let output = run(name, context);
        assert!(!output.status.success(), "{name} was accepted");
        let said = String::from_utf8_lossy(&output.stderr);
        for part in parts {
            assert!(said.contains(part), "{name}: {part} not named: {said}");
        }
        assert!(
            !server
                .cli(&["get", &format!("agentrun/{name}")])
                .status
                .success(),
            "{name} was written"
        );
    }
    let output = run("fits", Some("{ticket: {id: 7}}"));
    assert!(output.status.success(), "{output:?}");
    server.wait_for("fits", "Succeeded");
}

#[test]
fn context_on_sqlite() {
    context(Backend::Sqlite);
}

#[test]
fn context_on_postgres() {
    context(Backend::Postgres);
}

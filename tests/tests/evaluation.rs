//! Evaluation groups through the real `nodus` binary and server (bubblewrap sandboxes), on
//! SQLite and on Postgres, with a fake Anthropic model over HTTP that answers by the prompt:
//! correctly, wrongly, with no number, with nothing, with an error, or too late.
//!
//! The spec's example reaches its terminal phase with the right counts; the same seed draws the
//! same tasks; hidden data never reaches a run (its input, the model's requests, its steps, its
//! sandbox); each way a case can end unscored leaves pass rate and mean reward alone; a command
//! grader that writes in its own sandbox does not change the agent's working directory;
//! deleting a group removes its runs and results; bad input is refused naming the field, with
//! nothing written; and after a SIGKILL while cases are being graded, every case ends once.

// Rates and intervals are fractions, not money: floating point is fine here.
#![allow(clippy::float_arithmetic)]

#[path = "support/server.rs"]
mod server;

use std::time::Duration;

use nodus_llm::testing::{Fake, FakeMessage, FakeServer, RecordedRequest};
use serde_json::Value;
use server::{Backend, ServerProcess};

/// A hidden value no prompt holds: it must never reach a run.
const CANARY: &str = "CANARY-hidden-5e1b";
const BASE: &str = "/apis/nodus.dev/v1/projects/default";

fn json(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
}

/// The text of a message's content (a string, or text and tool-result blocks).
fn content_text(content: &Value) -> String {
    match content {
        Value::String(text) => text.clone(),
        Value::Array(blocks) => blocks
            .iter()
            .map(|b| match b.get("content") {
                Some(inner) => content_text(inner),
                None => b
                    .get("text")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string(),
            })
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    }
}

/// The fake model: it reads the task's prompt (the run's first message) and answers as the
/// prompt's marker says, or works the arithmetic out itself.
fn model(request: &RecordedRequest) -> Option<Fake> {
    let messages = request.body["messages"].as_array()?;
    let prompt = content_text(&messages.first()?["content"]);
    let after_command = messages.len() > 1;
    let text = |t: &str| Some(Fake::Message(FakeMessage::text(t)));
    let command = |c: &str| Some(Fake::Message(FakeMessage::tool_use("call-1", c)));
    if prompt.contains("[fail]") {
        return Some(Fake::status(
            400,
            "invalid_request_error",
            "this request is refused",
        ));
    }
    if prompt.contains("[slow]") {
        return Some(Fake::Slow(
            Duration::from_secs(75),
            Box::new(Fake::Message(FakeMessage::text("4"))),
        ));
    }
    if prompt.contains("[none]") {
        return text("");
    }
    if prompt.contains("[wrong]") {
        return text("The answer is 5.");
    }
    if prompt.contains("[invalid]") {
        return text("I would rather not say.");
    }
    if prompt.contains("[right]") {
        // Look for the hidden data where a run could find it: its working directory, /tmp,
        // its environment, the grader's paths. The pattern is split so that the command
        // itself does not hold it.
        return if after_command {
            text("The answer is 4.")
        } else {
            command(
                "grep -rs 'CANARY-hid''den' /work /tmp; echo grep-exit=$?; \
                 env | grep -c 'CANARY-hid''den'; ls /grading /grader 2>&1 | head -2",
            )
        };
    }
    if prompt.contains("[writes]") || prompt.contains("[crash]") || prompt.contains("[sleepy]") {
        return if after_command {
            text("done")
        } else {
            command("printf mine > agent.txt")
        };
    }
    if let Some(rest) = prompt.strip_prefix("Create the file ") {
        // nodus/workdir-files: "Create the file F in …, containing exactly the text "T" …".
        let file = rest.split_whitespace().next()?;
        let content = rest.split('"').nth(1)?;
        return if after_command {
            text("done")
        } else {
            command(&format!("printf '%s' '{content}' > {file}"))
        };
    }
    if let Some(rest) = prompt.strip_prefix("What is ") {
        let words: Vec<&str> = rest.split_whitespace().collect();
        let a: i64 = words.first()?.parse().ok()?;
        let b: i64 = words.get(2)?.trim_end_matches('?').parse().ok()?;
        let result = match *words.get(1)? {
            "+" => a + b,
            "-" => a - b,
            "*" => a * b,
            _ => return None,
        };
        return text(&format!("{a} {} {b} = {result}", words[1]));
    }
    None
}

async fn start(backend: &Backend, dir: &std::path::Path) -> (FakeServer, ServerProcess) {
    let fake = FakeServer::start().await.expect("fake provider");
    fake.respond_with(|request| {
        model(request).unwrap_or_else(|| Fake::Message(FakeMessage::text("ok")))
    });
    let base_url = fake.base_url();
    let server = ServerProcess::start_in_env(
        &backend.store_url(dir),
        dir,
        "process",
        &[],
        &[
            ("ANTHROPIC_BASE_URL", base_url.as_str()),
            ("ANTHROPIC_API_KEY", "sk-ant-platform-eval-0001"),
        ],
    );
    let agent = "apiVersion: nodus.dev/v1\nkind: Agent\nmetadata:\n  name: parallel-agents-worker\nspec:\n  system: Answer in one short sentence.\n  model:\n    access: Nodus\n    families: [haiku]\n  maxTokens: 1024\n  perRunMaxCostUSD: \"0.10\"\n";
    let output = server.cli_in(&["apply", "-f", "-"], Some(agent));
    assert!(output.status.success(), "{output:?}");
    (fake, server)
}

fn apply(server: &ServerProcess, yaml: &str) -> String {
    let output = server.cli_in(&["apply", "-f", "-"], Some(yaml));
    assert!(
        output.status.success(),
        "apply failed: {}\n{}",
        String::from_utf8_lossy(&output.stderr),
        std::fs::read_to_string(&server.log).unwrap_or_default()
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn group_yaml(
    name: &str,
    environment: &str,
    split: &str,
    tasks: u32,
    seed: u64,
    timeout: &str,
) -> String {
    format!(
        "apiVersion: nodus.dev/v1\nkind: AgentGroup\nmetadata:\n  name: {name}\nspec:\n  agent: parallel-agents-worker\n  limits:\n    maxActive: 4\n  maxCostUSD: \"2.00\"\n  evaluation:\n    environment: {environment}\n    split: {split}\n    tasks: {tasks}\n    repetitions: 1\n    seed: {seed}\n    timeout: {timeout}\n"
    )
}

fn wait_phase(server: &ServerProcess, group: &str, phase: &str) -> Value {
    server.ok(&[
        "wait",
        &format!("agentgroup/{group}"),
        &format!("--for=jsonpath={{.status.phase}}={phase}"),
        "--timeout=4m",
    ]);
    json(&server.ok(&["get", &format!("agentgroup/{group}"), "-o", "json"]))
}

fn results(server: &ServerProcess, group: &str) -> Vec<Value> {
    let list = json(&server.ok(&["get", "results", group, "-o", "json"]));
    assert_eq!(list["kind"], "EvaluationResultList", "{list}");
    list["items"].as_array().cloned().unwrap_or_default()
}

fn close(value: &Value, expected: f64) -> bool {
    value.as_f64().is_some_and(|v| (v - expected).abs() < 1e-6)
}

/// The spec's example, the same seed twice, every unscored reason beside scored wrong and
/// invalid answers, hidden data kept from the runs, a command grader's sandbox apart from
/// the agent's, deletion, and bad input.
async fn evaluation_end_to_end(backend: Backend) {
    let dir = tempfile::tempdir().expect("tempdir");
    let (fake, server) = start(&backend, dir.path()).await;

    // The built-ins are listed with their versions.
    let builtins = server.ok(&["get", "environments", "--project", "nodus"]);
    assert!(
        builtins.contains("arithmetic-v2") && builtins.contains("2.0.0"),
        "{builtins}"
    );
    assert!(
        builtins.contains("workdir-files") && builtins.contains("command"),
        "{builtins}"
    );

    // The spec's example: nodus/arithmetic-v2@2.0.0, split test, 2 tasks, seed 42, 10m.
    apply(
        &server,
        "apiVersion: nodus.dev/v1\nkind: AgentGroup\nmetadata:\n  name: parallel-agents-eval\nspec:\n  agent: parallel-agents-worker\n  limits:\n    maxActive: 2\n  maxCostUSD: \"0.20\"\n  evaluation:\n    environment: nodus/arithmetic-v2@2.0.0\n    split: test\n    tasks: 2\n    repetitions: 1\n    seed: 42\n    timeout: 10m\n",
    );
    let group = wait_phase(&server, "parallel-agents-eval", "Succeeded");
    let evaluation = &group["status"]["evaluation"];
    assert_eq!(evaluation["cases"], 2, "{group}");
    assert_eq!(evaluation["pending"], 0, "{group}");
    assert_eq!(evaluation["scored"], 2, "{group}");
    assert_eq!(evaluation["n"], 2, "{group}");
    assert_eq!(evaluation["unscored"], serde_json::json!({}), "{group}");
    assert!(close(&evaluation["passRate"], 1.0), "{group}");
    assert!(close(&evaluation["meanReward"], 1.0), "{group}");
    // Wilson at 95 % for 2 of 2 (computed apart from Nodus): 0.34238 .. 1.
    assert!(
        close(&evaluation["interval"]["low"], 0.342_380_227_5),
        "{group}"
    );
    assert!(close(&evaluation["bracket"]["low"], 1.0), "{group}");
    let first = results(&server, "parallel-agents-eval");
    assert_eq!(first.len(), 2);
    for result in &first {
        assert_eq!(result["state"], "Scored", "{result}");
        assert_eq!(result["verdict"], "pass", "{result}");
        assert_eq!(result["environment"], "nodus/arithmetic-v2@2.0.0");
        assert_eq!(
            (result["split"].as_str(), result["seed"].as_u64()),
            (Some("test"), Some(42))
        );
        assert_eq!(result["gradings"], 1, "graded once: {result}");
        // The member is an ordinary run whose only input is the task's prompt.
        let run = json(&server.ok(&[
            "get",
            &format!("agentrun/{}", result["run"].as_str().unwrap()),
            "-o",
            "json",
        ]));
        let input = run["spec"]["input"].as_str().unwrap();
        assert!(
            input.starts_with("What is ") && input.ends_with("Answer with the number."),
            "{input}"
        );
        assert_eq!(run["spec"]["group"], "parallel-agents-eval");
        assert!(run["spec"]["deadline"].is_string(), "{run}");
    }
    let table = server.ok(&["get", "results", "parallel-agents-eval"]);
    assert!(
        table.contains("TASK") && table.matches("Scored").count() == 2,
        "{table}"
    );
    let (status, _) = server.http_with(
        "GET",
        &format!("{BASE}/agentgroups/parallel-agents-eval/results?format=jsonl"),
        &[],
        None,
    );
    assert_eq!(status, 200);
    let lines = std::process::Command::new("curl")
        .args([
            "-s",
            "-H",
            &format!("Authorization: Bearer {}", server::TOKEN),
            "-H",
            "Accept: application/x-ndjson",
        ])
        .arg(format!(
            "{}{BASE}/agentgroups/parallel-agents-eval/results",
            server.url
        ))
        .output()
        .expect("curl");
    let lines = String::from_utf8_lossy(&lines.stdout).into_owned();
    assert_eq!(lines.lines().count(), 2, "{lines}");
    for line in lines.lines() {
        assert_eq!(json(line)["state"], "Scored");
    }

    // The same seed draws the same tasks; another seed others.
    apply(
        &server,
        &group_yaml("again", "nodus/arithmetic-v2@2.0.0", "test", 2, 42, "10m"),
    );
    apply(
        &server,
        &group_yaml(
            "other-seed",
            "nodus/arithmetic-v2@2.0.0",
            "test",
            2,
            43,
            "10m",
        ),
    );
    wait_phase(&server, "again", "Succeeded");
    wait_phase(&server, "other-seed", "Succeeded");
    let ids = |group: &str| -> Vec<String> {
        results(&server, group)
            .iter()
            .map(|r| r["taskId"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(ids("again"), ids("parallel-agents-eval"));
    // The batch is fixed: spec.evaluation never changes, and no other run joins the group.
    let stderr = server.fails(&[
        "patch",
        "agentgroup/again",
        "-p",
        r#"{"spec":{"evaluation":{"seed":1}}}"#,
    ]);
    assert!(stderr.contains("spec.evaluation"), "{stderr}");
    let extra = r#"{"apiVersion":"nodus.dev/v1","kind":"AgentRun","metadata":{"name":"extra"},"spec":{"agent":"parallel-agents-worker","input":"What is 1 + 1?","group":"again","taskKey":"extra"}}"#;
    let (status, body) = server.http_with("POST", &format!("{BASE}/agentruns"), &[], Some(extra));
    assert!(status >= 400, "no run joins an evaluation group: {body}");
    assert_eq!(results(&server, "again").len(), 2);
    assert_ne!(ids("other-seed"), ids("parallel-agents-eval"));

    // An Environment of the project's own: every way a case ends.
    let marked = |version: &str, extra: &str| {
        format!(
        "apiVersion: nodus.dev/v1\nkind: Environment\nmetadata:\n  name: marked\nspec:\n  version: {version}\n  splits:\n    test:\n      tasks:\n{}  grader:\n    kind: numeric\n",
        ["right", "wrong", "invalid", "none", "fail", "slow"]
            .iter()
            .map(|m| format!("      - id: {m}\n        prompt: \"What is 2 + 2? [{m}]{extra}\"\n        hidden: {{expected: 4, canary: {CANARY}}}\n"))
            .collect::<String>()
    )
    };
    assert!(apply(&server, &marked("1.0.0", "")).contains("created"));
    // The same version again is no change; another spec under it is refused, naming it.
    assert!(apply(&server, &marked("1.0.0", "")).contains("unchanged"));
    let output = server.cli_in(&["apply", "-f", "-"], Some(&marked("1.0.0", " Please.")));
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("spec.version") && stderr.contains("never changes"),
        "{stderr}"
    );
    let env = json(&server.ok(&["get", "environment/marked@1.0.0", "-o", "json"]));
    assert!(
        !env["spec"]["splits"]["test"]["tasks"][0]["prompt"]
            .as_str()
            .unwrap()
            .contains("Please")
    );

    apply(
        &server,
        &group_yaml("mixed", "marked@1.0.0", "test", 6, 7, "1m"),
    );
    let group = wait_phase(&server, "mixed", "Failed");
    let evaluation = &group["status"]["evaluation"];
    assert_eq!(evaluation["pending"], 0, "{group}");
    assert_eq!(
        evaluation["scored"], 3,
        "right, wrong and invalid are scored: {group}"
    );
    assert_eq!(
        evaluation["unscored"],
        serde_json::json!({"NoAnswer": 1, "RunFailed": 1, "EvaluationTimeout": 1}),
        "{group}"
    );
    // Over the 3 scored only: 1 pass; the 3 unscored are not zeros.
    assert!(close(&evaluation["passRate"], 1.0 / 3.0), "{group}");
    assert!(close(&evaluation["meanReward"], 1.0 / 3.0), "{group}");
    assert!(close(&evaluation["bracket"]["low"], 1.0 / 6.0), "{group}");
    assert!(close(&evaluation["bracket"]["high"], 4.0 / 6.0), "{group}");
    assert!(
        close(&evaluation["interval"]["low"], 0.061_491_944_7),
        "{group}"
    );
    assert!(
        close(&evaluation["interval"]["high"], 0.792_340_399_2),
        "{group}"
    );
    let by_task: std::collections::BTreeMap<String, Value> = results(&server, "mixed")
        .into_iter()
        .map(|r| (r["taskId"].as_str().unwrap().to_string(), r))
        .collect();
    let outcome = |task: &str| {
        let r = &by_task[task];
        (
            r["state"].as_str().unwrap_or("").to_string(),
            r["verdict"]
                .as_str()
                .or(r["reason"].as_str())
                .unwrap_or("")
                .to_string(),
        )
    };
    assert_eq!(outcome("right"), ("Scored".into(), "pass".into()));
    assert_eq!(outcome("wrong"), ("Scored".into(), "fail".into()));
    assert_eq!(outcome("invalid"), ("Scored".into(), "invalid".into()));
    assert_eq!(outcome("none"), ("Unscored".into(), "NoAnswer".into()));
    assert_eq!(outcome("fail"), ("Unscored".into(), "RunFailed".into()));
    assert_eq!(
        outcome("slow"),
        ("Unscored".into(), "EvaluationTimeout".into())
    );
    assert!(
        by_task["none"].get("reward").is_none(),
        "an unscored case has no reward"
    );

    // Hidden data never reached a run: not its input, answer or steps (with payloads), not
    // the model's requests, and the run's own search of its sandbox found nothing.
    for result in by_task.values() {
        let run = result["run"].as_str().unwrap();
        let document = server.ok(&["get", &format!("agentrun/{run}"), "-o", "json"]);
        assert!(
            !document.contains(CANARY) && !document.contains("canary"),
            "{document}"
        );
        let (_, steps) = server.http_with(
            "GET",
            &format!("{BASE}/agentruns/{run}/steps?payload=true"),
            &[],
            None,
        );
        assert!(!steps.to_string().contains(CANARY), "{steps}");
        let results_text = serde_json::to_string(result).unwrap();
        assert!(
            !results_text.contains(CANARY),
            "results do not show hidden data: {results_text}"
        );
    }
    for request in fake.requests() {
        assert!(
            !request.body.to_string().contains(CANARY),
            "{:?}",
            request.body
        );
    }
    let right = by_task["right"]["run"].as_str().unwrap();
    let (_, steps) = server.http_with(
        "GET",
        &format!("{BASE}/agentruns/{right}/steps?payload=true"),
        &[],
        None,
    );
    let steps = steps.to_string();
    assert!(
        steps.contains("grep-exit=1"),
        "the sandbox holds no hidden data: {steps}"
    );
    assert!(
        steps.contains("No such file"),
        "no grader paths in the agent's sandbox: {steps}"
    );

    // A command grader in a sandbox of its own, written as DESIGN.md writes one (its files at
    // /grader, its inputs at /grading): one crashes, one writes into the copy of the agent's
    // working directory it was given; the built-in workdir-files grades files.
    let grade_sh = "case $(cat /grading/hidden.json) in\n  *crash*) echo boom >&2; exit 3 ;;\n  *writes*) printf tampered > /grading/workdir/agent.txt; echo '{\"reward\": 1, \"passed\": true, \"evidence\": \"wrote\"}' ;;\nesac\n";
    let fileset = format!(
        "apiVersion: nodus.dev/v1\nkind: FileSet\nmetadata:\n  name: checker-files\nspec:\n  files:\n  - path: grade.sh\n    content: {}\n",
        serde_json::to_string(grade_sh).unwrap()
    );
    apply(&server, &fileset);
    apply(
        &server,
        "apiVersion: nodus.dev/v1\nkind: Environment\nmetadata:\n  name: checker\nspec:\n  version: 1.0.0\n  splits:\n    test:\n      tasks:\n      - {id: crash, prompt: \"Write agent.txt [crash]\", hidden: {mode: crash}}\n      - {id: writes, prompt: \"Write agent.txt [writes]\", hidden: {mode: writes}}\n  grader:\n    kind: command\n    command: sh /grader/grade.sh\n    files: {fileSet: checker-files}\n",
    );
    apply(
        &server,
        &group_yaml("graded", "checker@1.0.0", "test", 2, 1, "5m"),
    );
    apply(
        &server,
        &group_yaml("files", "nodus/workdir-files@1.0.0", "test", 3, 1, "5m"),
    );
    let group = wait_phase(&server, "graded", "Succeeded");
    assert_eq!(
        group["status"]["evaluation"]["unscored"],
        serde_json::json!({"GraderFailed": 1}),
        "{group}"
    );
    assert!(
        close(&group["status"]["evaluation"]["passRate"], 1.0),
        "{group}"
    );
    let graded: Vec<Value> = results(&server, "graded");
    let crash = graded.iter().find(|r| r["taskId"] == "crash").unwrap();
    assert!(
        crash["evidence"].as_str().unwrap().contains("boom"),
        "{crash}"
    );
    let writes = graded.iter().find(|r| r["taskId"] == "writes").unwrap();
    assert_eq!(writes["verdict"], "pass", "{writes}");
    let run = writes["run"].as_str().unwrap();
    let tar = std::process::Command::new("curl")
        .args([
            "-s",
            "-H",
            &format!("Authorization: Bearer {}", server::TOKEN),
        ])
        .arg(format!("{}{BASE}/agentruns/{run}/workdir", server.url))
        .output()
        .expect("curl")
        .stdout;
    let mut archive = tar::Archive::new(tar.as_slice());
    let mut agent_txt = String::new();
    for entry in archive.entries().expect("a tar archive") {
        let mut entry = entry.expect("entry");
        if entry
            .path()
            .unwrap()
            .to_string_lossy()
            .trim_start_matches("./")
            == "agent.txt"
        {
            std::io::Read::read_to_string(&mut entry, &mut agent_txt).unwrap();
        }
    }
    assert_eq!(
        agent_txt, "mine",
        "the grader's write stayed in its own sandbox"
    );
    let group = wait_phase(&server, "files", "Succeeded");
    assert_eq!(group["status"]["evaluation"]["scored"], 3, "{group}");
    assert!(
        close(&group["status"]["evaluation"]["passRate"], 1.0),
        "{group}"
    );

    // Deleting a group removes its runs and its results.
    let runs: Vec<String> = first
        .iter()
        .map(|r| r["run"].as_str().unwrap().to_string())
        .collect();
    server.ok(&["delete", "agentgroup", "parallel-agents-eval"]);
    for run in &runs {
        let output = server.cli(&["get", &format!("agentrun/{run}")]);
        assert!(!output.status.success(), "{run} is gone");
    }
    let (status, body) = server.http_with(
        "GET",
        &format!("{BASE}/agentgroups/parallel-agents-eval/results"),
        &[],
        None,
    );
    assert_eq!(status, 404, "{body}");
    let (_, cases) = server.http_with(
        "GET",
        &format!("{BASE}/agentgroups/again/results"),
        &[],
        None,
    );
    assert_eq!(
        cases["items"].as_array().map(Vec::len),
        Some(2),
        "other groups keep theirs"
    );

    // Bad input: refused naming the field, nothing written.
    for (name, environment, split, tasks, timeout, field) in [
        (
            "bad-env",
            "nodus/no-such@1.0.0",
            "test",
            2,
            "10m",
            "spec.evaluation.environment",
        ),
        (
            "bad-version",
            "nodus/arithmetic-v2@9.9.9",
            "test",
            2,
            "10m",
            "spec.evaluation.environment",
        ),
        (
            "bad-split",
            "nodus/arithmetic-v2@2.0.0",
            "holdout",
            2,
            "10m",
            "spec.evaluation.split",
        ),
        (
            "bad-count",
            "nodus/arithmetic-v2@2.0.0",
            "test",
            101,
            "10m",
            "spec.evaluation.tasks",
        ),
        (
            "bad-short",
            "nodus/arithmetic-v2@2.0.0",
            "test",
            2,
            "30s",
            "spec.evaluation.timeout",
        ),
        (
            "bad-long",
            "nodus/arithmetic-v2@2.0.0",
            "test",
            2,
            "25h",
            "spec.evaluation.timeout",
        ),
        (
            "bad-many",
            "marked@1.0.0",
            "test",
            7,
            "10m",
            "spec.evaluation.tasks",
        ),
    ] {
        let output = server.cli_in(
            &["apply", "-f", "-"],
            Some(&group_yaml(name, environment, split, tasks, 1, timeout)),
        );
        assert!(!output.status.success(), "{name} is refused");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(field), "{name}: {stderr}");
        assert!(
            !server
                .cli(&["get", &format!("agentgroup/{name}")])
                .status
                .success(),
            "{name}: nothing written"
        );
        let (_, runs) = server.http_with(
            "GET",
            &format!("{BASE}/agentruns?fieldSelector=spec.group={name}"),
            &[],
            None,
        );
        assert_eq!(
            runs["items"].as_array().map(Vec::len),
            Some(0),
            "{name}: no runs"
        );
    }
    // A generator is for built-ins only.
    let output = server.cli_in(
        &["apply", "-f", "-"],
        Some("apiVersion: nodus.dev/v1\nkind: Environment\nmetadata:\n  name: mine\nspec:\n  version: 1.0.0\n  splits:\n    test:\n      generator: {kind: arithmetic}\n  grader: {kind: numeric}\n"),
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        !output.status.success() && stderr.contains("spec.splits.test.generator"),
        "{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn evaluation_on_sqlite() {
    evaluation_end_to_end(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn evaluation_on_postgres() {
    evaluation_end_to_end(Backend::Postgres).await;
}

/// The server is killed with SIGKILL while cases are running and being graded; after the
/// restart every case reaches exactly one terminal state, and no case is graded twice: each
/// has exactly one grading carried to the end (an interrupted one is recorded as such).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigkill_while_grading_leaves_every_case_graded_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let backend = Backend::Sqlite;
    let (fake, mut server) = start(&backend, dir.path()).await;
    let grade_sh = "sleep 15\necho '{\"reward\": 1, \"passed\": true, \"evidence\": \"slept\"}'\n";
    apply(
        &server,
        &format!(
            "apiVersion: nodus.dev/v1\nkind: FileSet\nmetadata:\n  name: sleepy-files\nspec:\n  files:\n  - path: grade.sh\n    content: {}\n",
            serde_json::to_string(grade_sh).unwrap()
        ),
    );
    let tasks: String = (0..6)
        .map(|i| format!("      - {{id: t{i}, prompt: \"Write agent.txt [sleepy] {i}\"}}\n"))
        .collect();
    apply(
        &server,
        &format!(
            "apiVersion: nodus.dev/v1\nkind: Environment\nmetadata:\n  name: sleepy\nspec:\n  version: 1.0.0\n  splits:\n    test:\n      tasks:\n{tasks}  grader:\n    kind: command\n    command: sh grader/grade.sh\n    files: {{fileSet: sleepy-files}}\n"
        ),
    );
    apply(
        &server,
        &group_yaml("crashy", "sleepy@1.0.0", "test", 6, 3, "10m"),
    );
    // Kill it while a grading is under way: a case still pending with a grading attempt
    // written (its grader sleeps 15 s before it prints, longer than the runs take to end).
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    loop {
        assert!(std::time::Instant::now() < deadline, "no grading started");
        let (_, list) = server.http_with(
            "GET",
            &format!("{BASE}/agentgroups/crashy/results"),
            &[],
            None,
        );
        let items = list["items"].as_array().cloned().unwrap_or_default();
        // Every run has ended (a command cut off by the kill would park its run, which
        // waits for a person), and a grading is open.
        let (_, group) = server.http_with("GET", &format!("{BASE}/agentgroups/crashy"), &[], None);
        if group["status"]["counts"]["succeeded"] == 6
            && items
                .iter()
                .any(|r| r["state"] == "Pending" && r["gradings"] == 1)
        {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    server.kill();
    let server = ServerProcess::start_in_env(
        &backend.store_url(dir.path()),
        dir.path(),
        "process",
        &[],
        &[
            ("ANTHROPIC_BASE_URL", fake.base_url().as_str()),
            ("ANTHROPIC_API_KEY", "sk-ant-platform-eval-0001"),
        ],
    );
    let group = wait_phase(&server, "crashy", "Succeeded");
    assert_eq!(group["status"]["evaluation"]["scored"], 6, "{group}");
    assert_eq!(group["status"]["evaluation"]["pending"], 0, "{group}");
    let items = results(&server, "crashy");
    assert_eq!(items.len(), 6);
    for item in &items {
        assert_eq!(item["state"], "Scored", "{item}");
        assert_eq!(item["gradings"], 1, "graded exactly once: {item}");
    }
    let interrupted: u64 = items
        .iter()
        .map(|r| r["interruptedGradings"].as_u64().unwrap_or(0))
        .sum();
    // The grading the kill cut off is on record as interrupted, and was done again.
    assert!(
        interrupted >= 1,
        "a grading was under way at the kill: {items:?}"
    );
}

//! A run's `trajectory` result through a real `nodus server` and the CLI, with the offline
//! model (it runs the commands a prompt quotes in backticks): a keepAlive run of two turns
//! keeps one trajectory that harbor 0.25.0's `Trajectory` model accepts (run by the Python
//! that `NODUS_HARBOR_PYTHON` names; scripts/test makes that venv) and that matches the run's
//! journal step for step — each model call an agent step with its tokens and cost, each
//! command an observation with its exit code and output — with totals equal to the run's
//! status; a run created with `--auto-telemetry=false` has no trajectory, and asking for it
//! says why.

#[path = "support/harbor.rs"]
mod harbor;
#[path = "support/server.rs"]
mod server;

use std::io::Write as _;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use harbor::harbor_python;
use serde_json::Value;
use server::{Backend, ServerProcess};

const AGENT: &str = "apiVersion: nodus.dev/v1\nkind: Agent\nmetadata:\n  name: worker\nspec:\n  system: You are a careful assistant.\n  perRunMaxCostUSD: \"0.50\"\n";

/// Validate `trajectory` with harbor's `Trajectory` model; what harbor read back.
fn harbor_validates(trajectory: &str) -> Value {
    const SCRIPT: &str = "\
import importlib.metadata, json, sys
from harbor.models.trajectories import Trajectory
version = importlib.metadata.version('harbor')
assert version == '0.25.0', f'harbor {version} is installed, not 0.25.0'
t = Trajectory.model_validate_json(sys.stdin.read())
print(json.dumps(t.to_json_dict()))
";
    let mut child = Command::new(harbor_python())
        .args(["-c", SCRIPT])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the harbor python runs");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(trajectory.as_bytes())
        .expect("write the trajectory");
    let output = child.wait_with_output().expect("harbor ends");
    assert!(
        output.status.success(),
        "harbor refuses the trajectory:\n{}\n{trajectory}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("harbor's JSON")
}

fn get(server: &ServerProcess, object: &str) -> Value {
    serde_json::from_str(&server.ok(&["get", object, "-o", "json"])).expect("JSON")
}

/// The results `run` lists over the API, by name (the CLI's table lists them too).
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

fn amount(value: &Value) -> &str {
    value
        .as_str()
        .unwrap_or_else(|| panic!("an amount: {value}"))
}

#[test]
fn trajectory_on_sqlite() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = ServerProcess::start(
        &Backend::Sqlite.store_url(dir.path()),
        dir.path(),
        "process",
    );
    let python = harbor_python();
    let output = server.cli_in(&["apply", "-f", "-"], Some(AGENT));
    assert!(output.status.success(), "{output:?}");

    // A keepAlive run of two turns: two commands (one fails), then a message with a third.
    server.ok(&[
        "create",
        "agentrun",
        "chat",
        "--agent",
        "worker",
        "--prompt",
        "Run `echo one` and `ls /no-such-dir` please",
        "--keep-alive",
    ]);
    server.wait_for("chat", "Waiting");
    server.ok(&["agentrun", "send", "chat", "Now run `echo two`"]);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let run = get(&server, "agentrun/chat");
        let turns = run["status"]["turns"].as_array().map_or(0, Vec::len);
        if turns == 2 && run["status"]["phase"] == "Waiting" {
            break;
        }
        assert!(Instant::now() < deadline, "the message was not read: {run}");
        std::thread::sleep(Duration::from_millis(200));
    }
    server.ok(&["agentrun", "close", "chat"]);
    server.wait_for("chat", "Succeeded");

    assert!(
        listed(&server, "chat").contains(&"trajectory".to_string()),
        "a run lists its trajectory"
    );
    let text = server.ok(&["agentrun", "results", "chat", "trajectory", "-o", "-"]);
    let trajectory: Value = serde_json::from_str(&text).expect("JSON");
    let read_back = harbor_validates(&text);
    assert_eq!(
        read_back["steps"].as_array().map(Vec::len),
        trajectory["steps"].as_array().map(Vec::len),
        "harbor reads every step: {read_back}"
    );
    assert_eq!(trajectory["schema_version"], "ATIF-v1.8");
    eprintln!("validated with {}", python.display());

    let run = get(&server, "agentrun/chat");
    assert_eq!(trajectory["session_id"], run["metadata"]["uid"]);
    assert_eq!(trajectory["agent"]["name"], "default/worker");

    // Step for step against the journal.
    let (status, steps) = server.http_with(
        "GET",
        "/apis/nodus.dev/v1/projects/default/agentruns/chat/steps?payload=true",
        &[],
        None,
    );
    assert_eq!(status, 200, "{steps}");
    let journal = steps["items"].as_array().expect("steps");
    let seq = |step: &Value| step["seq"].as_u64().expect("a seq");
    let steps = trajectory["steps"].as_array().expect("steps");
    assert_eq!(steps[0]["source"], "system");
    assert_eq!(steps[0]["message"], "You are a careful assistant.");
    assert_eq!(steps[1]["source"], "user");
    assert_eq!(
        steps[1]["message"],
        "Run `echo one` and `ls /no-such-dir` please"
    );
    let kinds: Vec<(&str, u64)> = steps
        .iter()
        .filter_map(|s| {
            Some((
                s["extra"]["kind"].as_str()?,
                s["extra"]["journal_seq"].as_u64()?,
            ))
        })
        .collect();
    let expected: Vec<(&str, u64)> = journal
        .iter()
        .filter_map(|step| {
            match (
                step["intent"]["kind"].as_str()?,
                step["outcome"]["result"].as_str()?,
            ) {
                ("callModel", "modelReplied") => Some(("model_call", seq(step))),
                ("callModel", "failed") => Some(("model_call_failed", seq(step))),
                ("readMessage", "messageRead") => Some(("message", seq(step))),
                ("route", "routed")
                    if step["outcome"].get("usage").is_some()
                        || amount(&step["outcome"]["costUSD"]) != "0.00" =>
                {
                    Some(("routing", seq(step)))
                }
                _ => None,
            }
        })
        .collect();
    assert_eq!(kinds, expected, "{trajectory}");
    assert_eq!(
        kinds
            .iter()
            .filter(|(kind, _)| *kind == "model_call")
            .count(),
        4,
        "two model calls a turn: {kinds:?}"
    );
    let by_seq = |n: u64| {
        steps
            .iter()
            .find(|s| s["extra"]["journal_seq"] == n)
            .unwrap_or_else(|| panic!("no step for journal step {n}"))
    };
    for step in journal {
        let outcome = &step["outcome"];
        if step["intent"]["kind"] == "callModel" && outcome["result"] == "modelReplied" {
            let agent = by_seq(seq(step));
            assert_eq!(agent["source"], "agent");
            assert_eq!(agent["model_name"], outcome["response"]["model"]);
            let usage = &outcome["response"]["usage"];
            let tokens = |name: &str| usage[name].as_u64().unwrap_or(0);
            let metrics = &agent["metrics"];
            assert_eq!(
                metrics["prompt_tokens"],
                tokens("inputTokens") + tokens("cacheWriteTokens") + tokens("cacheReadTokens")
            );
            assert_eq!(metrics["completion_tokens"], tokens("outputTokens"));
            assert_eq!(metrics["cached_tokens"], tokens("cacheReadTokens"));
            assert_eq!(
                amount(&metrics["extra"]["cost_usd_exact"]),
                amount(&outcome["costUSD"])
            );
            let number: f64 = amount(&outcome["costUSD"]).parse().expect("a decimal");
            assert_eq!(metrics["cost_usd"].as_f64(), Some(number));
        }
    }
    // Each command is the observation of the call that asked for it.
    let results: Vec<&Value> = steps
        .iter()
        .filter_map(|s| s["observation"]["results"].as_array())
        .flatten()
        .collect();
    let commands: Vec<&Value> = journal
        .iter()
        .filter(|step| step["intent"]["kind"] == "command")
        .collect();
    assert_eq!(results.len(), 3, "{results:?}");
    assert_eq!(commands.len(), 3, "{commands:?}");
    for (result, command) in results.iter().zip(&commands) {
        assert_eq!(result["source_call_id"], command["intent"]["toolUseId"]);
        assert_eq!(result["extra"]["journal_seq"], command["seq"]);
        assert_eq!(result["extra"]["command"], command["intent"]["command"]);
        assert_eq!(
            result["extra"]["exit_code"],
            command["outcome"]["output"]["exitCode"]
        );
    }
    assert_eq!(results[0]["content"], "exit code 0\nstdout:\none\n");
    assert_ne!(
        results[1]["extra"]["exit_code"], 0,
        "ls of a missing dir fails"
    );
    assert!(
        results[1]["content"]
            .as_str()
            .is_some_and(|c| c.contains("stderr:") && c.contains("no-such-dir")),
        "{}",
        results[1]
    );
    assert_eq!(results[2]["content"], "exit code 0\nstdout:\ntwo\n");
    let message = steps
        .iter()
        .find(|s| s["extra"]["kind"] == "message")
        .expect("the message's step");
    assert_eq!(message["source"], "user");
    assert_eq!(message["message"], "Now run `echo two`");

    // The totals are the run's status.
    let totals = &trajectory["final_metrics"];
    assert_eq!(
        amount(&totals["extra"]["cost_usd_exact"]),
        amount(&run["status"]["cost"]["totalUSD"])
    );
    let spent: f64 = amount(&run["status"]["cost"]["totalUSD"])
        .parse()
        .expect("a decimal");
    // (The offline model's calls cost $0; the unit tests of nodus-core's trajectory check
    // amounts that are not.)
    assert_eq!(totals["total_cost_usd"].as_f64(), Some(spent));
    let turns = run["status"]["turns"].as_array().expect("turns");
    let sum = |names: &[&str]| -> u64 {
        turns
            .iter()
            .flat_map(|turn| {
                names
                    .iter()
                    .map(move |name| turn[*name].as_u64().unwrap_or(0))
            })
            .sum()
    };
    assert_eq!(
        totals["total_prompt_tokens"],
        sum(&["inputTokens", "cacheWriteTokens", "cacheReadTokens"])
    );
    assert_eq!(totals["total_completion_tokens"], sum(&["outputTokens"]));
    assert_eq!(totals["total_cached_tokens"], sum(&["cacheReadTokens"]));
    assert_eq!(totals["total_steps"], steps.len());

    // autoTelemetry false: no trajectory, and asking for one says why.
    server.ok(&[
        "create",
        "agentrun",
        "quiet",
        "--agent",
        "worker",
        "--prompt",
        "Run `echo hush`",
        "--auto-telemetry=false",
    ]);
    server.wait_for("quiet", "Succeeded");
    assert_eq!(
        get(&server, "agentrun/quiet")["spec"]["autoTelemetry"],
        false
    );
    assert_eq!(
        listed(&server, "quiet"),
        ["inputWorkdir", "outputWorkdir", "artifacts", "runRecord"]
    );
    let (status, refused) = server.http_with(
        "GET",
        "/apis/nodus.dev/v1/projects/default/agentruns/quiet/results/trajectory",
        &[],
        None,
    );
    assert_eq!(status, 404, "{refused}");
    assert_eq!(refused["reason"], "NotFound", "{refused}");
    assert!(
        refused["message"]
            .as_str()
            .is_some_and(|m| m.contains("spec.autoTelemetry is false")),
        "{refused}"
    );
    let said = server.fails(&["agentrun", "results", "quiet", "trajectory", "-o", "-"]);
    assert!(said.contains("autoTelemetry"), "{said}");
}

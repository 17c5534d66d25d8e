//! `nodus eval retry GROUP` and `nodus eval rescore GROUP` through the real `nodus` binary and
//! server (SQLite, bubblewrap
//! sandboxes, a command grader in a sandbox of its own) with a fake Anthropic model over
//! HTTP: of 10 cases, 3 end unscored the first time (RunFailed, GraderFailed,
//! EvaluationTimeout) and score when tried again. The retry reruns exactly those 3 (the fake
//! sees their 3 prompts and no other), each case keeps both attempts, and the summary, over
//! cases, changes only by the new scores. A retry of a running group, of a scored task, for a
//! reason no case has, or of a group with nothing unscored is refused naming why, with nothing
//! written. A rescore grades a finished group's answers again with a corrected grader version:
//! no model call, no run, new verdicts, and `eval compare` pairs it with its source; a version
//! with other tasks is refused. Repetitions give each task pass@k (checked against a hand
//! computation) and a reward reduced by `spec.evaluation.reducer`.

// Rates are fractions, not money: floating point is fine here.
#![allow(clippy::float_arithmetic)]

#[path = "support/server.rs"]
mod server;

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nodus_core::money::Usd;
use nodus_llm::testing::{Fake, FakeMessage, FakeServer, RecordedRequest};
use serde_json::Value;
use server::{Backend, ServerProcess};

/// The task's marker in its prompt: "What is 2 + 2? [marker]".
fn marker(request: &RecordedRequest) -> Option<String> {
    let prompt = request.body["messages"][0]["content"].to_string();
    Some(prompt.split("? [").nth(1)?.split(']').next()?.to_string())
}

/// The fake model: `right-*` answer 4, `wrong-*` answer 5; the `*-once` tasks go wrong the
/// first time they are asked only: a refused call (the run fails), an answer the grader
/// crashes on, an answer that comes after the evaluation's deadline.
fn model(request: &RecordedRequest, asked: &Mutex<BTreeSet<String>>) -> Option<Fake> {
    if request.path.ends_with("/count_tokens") {
        return None;
    }
    let marker = marker(request)?;
    let first = asked.lock().ok()?.insert(marker.clone());
    let text = |t: &str| Some(Fake::Message(FakeMessage::text(t)));
    match marker.as_str() {
        "fail-once" if first => Some(Fake::status(
            400,
            "invalid_request_error",
            "this request is refused",
        )),
        "crash-once" if first => text("crash"),
        "slow-once" if first => Some(Fake::Slow(
            Duration::from_secs(70),
            Box::new(Fake::Message(FakeMessage::text("2 + 2 = 4"))),
        )),
        m if m.starts_with("wrong") => text("2 + 2 = 5"),
        _ => text("2 + 2 = 4"),
    }
}

const TASKS: [&str; 10] = [
    "right-1",
    "right-2",
    "right-3",
    "right-4",
    "right-5",
    "wrong-1",
    "wrong-2",
    "fail-once",
    "crash-once",
    "slow-once",
];

/// Passes an answer holding 4, fails another, crashes on "crash".
const GRADE_SH: &str = "answer=$(cat /grading/answer.txt)\ncase \"$answer\" in\n  *crash*) echo boom >&2; exit 3 ;;\n  *4*) echo '{\"reward\": 1, \"passed\": true, \"evidence\": \"4\"}' ;;\n  *) echo '{\"reward\": 0, \"passed\": false, \"evidence\": \"not 4\"}' ;;\nesac\n";

fn apply(server: &ServerProcess, yaml: &str) {
    let output = server.cli_in(&["apply", "-f", "-"], Some(yaml));
    assert!(
        output.status.success(),
        "apply failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

fn json(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
}

fn results(server: &ServerProcess, group: &str) -> Vec<Value> {
    json(&server.ok(&["get", "results", group, "-o", "json"]))["items"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

fn wait_failed(server: &ServerProcess, group: &str) -> Value {
    server.ok(&[
        "wait",
        &format!("agentgroup/{group}"),
        "--for=jsonpath={.status.phase}=Failed",
        "--timeout=3m",
    ]);
    json(&server.ok(&["get", &format!("agentgroup/{group}"), "-o", "json"]))
}

fn close(value: &Value, expected: f64) -> bool {
    value.as_f64().is_some_and(|v| (v - expected).abs() < 1e-9)
}

/// The markers of the model requests after the first `skip`.
fn asked_after(fake: &FakeServer, skip: usize) -> Vec<String> {
    let mut asked: Vec<String> = fake
        .requests()
        .iter()
        .skip(skip)
        .filter(|r| !r.path.ends_with("/count_tokens"))
        .filter_map(marker)
        .collect();
    asked.sort();
    asked
}

#[tokio::test(flavor = "multi_thread")]
async fn eval_retry_reruns_exactly_the_unscored_cases() {
    let dir = tempfile::tempdir().expect("tempdir");
    let fake = FakeServer::start().await.expect("fake provider");
    let asked = Arc::new(Mutex::new(BTreeSet::new()));
    let seen = asked.clone();
    fake.respond_with(move |request| {
        model(request, &seen).unwrap_or_else(|| Fake::Message(FakeMessage::text("ok")))
    });
    let base_url = fake.base_url();
    let server = ServerProcess::start_in_env(
        &Backend::Sqlite.store_url(dir.path()),
        dir.path(),
        "process",
        &[],
        &[
            ("ANTHROPIC_BASE_URL", base_url.as_str()),
            ("ANTHROPIC_API_KEY", "sk-ant-platform-retry-0001"),
        ],
    );
    apply(
        &server,
        "apiVersion: nodus.dev/v1\nkind: Agent\nmetadata:\n  name: solver\nspec:\n  system: Answer in one short sentence.\n  model:\n    access: Nodus\n    families: [haiku]\n  maxTokens: 1024\n  perRunMaxCostUSD: \"0.10\"\n",
    );
    apply(
        &server,
        &format!(
            "apiVersion: nodus.dev/v1\nkind: FileSet\nmetadata:\n  name: grade-files\nspec:\n  files:\n  - path: grade.sh\n    content: {}\n",
            serde_json::to_string(GRADE_SH).unwrap()
        ),
    );
    let tasks: String = TASKS
        .iter()
        .map(|m| format!("      - {{id: {m}, prompt: \"What is 2 + 2? [{m}]\"}}\n"))
        .collect();
    apply(
        &server,
        &format!(
            "apiVersion: nodus.dev/v1\nkind: Environment\nmetadata:\n  name: flaky\nspec:\n  version: 1.0.0\n  splits:\n    test:\n      tasks:\n{tasks}  grader:\n    kind: command\n    command: sh /grader/grade.sh\n    files: {{fileSet: grade-files}}\n"
        ),
    );
    apply(
        &server,
        "apiVersion: nodus.dev/v1\nkind: AgentGroup\nmetadata:\n  name: flaky-eval\nspec:\n  agent: solver\n  limits:\n    maxActive: 5\n  maxCostUSD: \"2.00\"\n  evaluation:\n    environment: flaky@1.0.0\n    split: test\n    tasks: 10\n    seed: 3\n    timeout: 1m\n",
    );

    // While it runs (the slow case holds it for a minute), a retry is refused.
    let stderr = server.fails(&["eval", "retry", "flaky-eval"]);
    assert!(
        stderr.contains("status.phase") && stderr.contains("Running"),
        "{stderr}"
    );

    let group = wait_failed(&server, "flaky-eval");
    let evaluation = &group["status"]["evaluation"];
    assert_eq!(
        (&evaluation["cases"], &evaluation["scored"]),
        (&Value::from(10), &Value::from(7)),
        "{group}"
    );
    assert_eq!(
        evaluation["unscored"],
        serde_json::json!({"RunFailed": 1, "GraderFailed": 1, "EvaluationTimeout": 1}),
        "{group}"
    );
    assert!(close(&evaluation["passRate"], 5.0 / 7.0), "{group}");
    let before = results(&server, "flaky-eval");

    // Refused, naming why, with nothing written: a scored task, a reason no case has, a
    // reason that does not exist.
    let requests = fake.requests().len();
    let stderr = server.fails(&["eval", "retry", "flaky-eval", "--task", "right-1"]);
    assert!(
        stderr.contains("tasks") && stderr.contains("right-1") && stderr.contains("scored"),
        "{stderr}"
    );
    let stderr = server.fails(&["eval", "retry", "flaky-eval", "--reason", "NoAnswer"]);
    assert!(
        stderr.contains("reasons") && stderr.contains("NoAnswer"),
        "{stderr}"
    );
    let stderr = server.fails(&["eval", "retry", "flaky-eval", "--reason", "Bogus"]);
    assert!(stderr.contains("Bogus"), "{stderr}");
    assert_eq!(results(&server, "flaky-eval"), before, "nothing written");
    assert_eq!(fake.requests().len(), requests, "no run started");

    // The retry: exactly the 3 unscored cases get a second attempt.
    let printed = server.ok(&["eval", "retry", "flaky-eval"]);
    assert!(printed.contains("3 case(s) retried"), "{printed}");
    for task in ["fail-once", "crash-once", "slow-once"] {
        assert!(printed.contains(task), "{printed}");
    }
    let group = wait_failed(&server, "flaky-eval");
    let evaluation = &group["status"]["evaluation"];
    // The fake saw the 3 prompts again, and no other.
    assert_eq!(
        asked_after(&fake, requests),
        vec!["crash-once", "fail-once", "slow-once"]
    );
    // Counted over cases, never attempts: still 10, now every one scored; the rate moved by
    // the 3 new passes only (5 of 7 before, 8 of 10 now).
    assert_eq!(
        (
            &evaluation["cases"],
            &evaluation["scored"],
            &evaluation["pending"]
        ),
        (&Value::from(10), &Value::from(10), &Value::from(0)),
        "{group}"
    );
    assert_eq!(evaluation["unscored"], serde_json::json!({}), "{group}");
    assert!(close(&evaluation["passRate"], 0.8), "{group}");
    assert!(close(&evaluation["meanReward"], 0.8), "{group}");
    // The new runs are the group's members: 8 + 3 succeeded, 2 failed; the group's cost is
    // what all 13 spent, to the cent.
    assert_eq!(
        (
            &group["status"]["counts"]["succeeded"],
            &group["status"]["counts"]["failed"]
        ),
        (&Value::from(11), &Value::from(2)),
        "{group}"
    );
    let usd = |v: &Value| -> Usd { v.as_str().expect("an amount").parse().expect("USD") };
    let runs = json(&server.ok(&[
        "get",
        "agentruns",
        "--field-selector",
        "spec.group=flaky-eval",
        "-o",
        "json",
    ]));
    let runs = runs["items"].as_array().expect("runs");
    assert_eq!(runs.len(), 13);
    let spent: Usd = runs
        .iter()
        .map(|r| usd(&r["status"]["cost"]["totalUSD"]))
        .sum();
    assert_eq!(usd(&group["status"]["cost"]["totalUSD"]), spent, "{group}");

    let after = results(&server, "flaky-eval");
    for (old, new) in before.iter().zip(&after) {
        let task = old["taskId"].as_str().unwrap();
        assert_eq!(new["taskId"], task);
        let attempts = new["attempts"].as_array().expect("attempts");
        if task.ends_with("-once") {
            let first_run = old["run"].as_str().unwrap();
            assert_eq!(attempts.len(), 2, "{new}");
            assert_eq!(attempts[0]["run"], first_run, "{new}");
            assert_eq!(attempts[0]["state"], "Unscored", "{new}");
            assert_eq!(attempts[0]["reason"], old["reason"], "{new}");
            assert_eq!(attempts[1]["run"], format!("{first_run}-2"), "{new}");
            assert_eq!(attempts[1]["state"], "Scored", "{new}");
            assert_eq!(
                (&new["run"], &new["state"], &new["verdict"]),
                (
                    &attempts[1]["run"],
                    &Value::from("Scored"),
                    &Value::from("pass")
                ),
                "the case's state is its last attempt's: {new}"
            );
            let run = json(&server.ok(&[
                "get",
                &format!("agentrun/{}", new["run"].as_str().unwrap()),
                "-o",
                "json",
            ]));
            assert_eq!(run["spec"]["group"], "flaky-eval", "{run}");
            assert_eq!(
                run["spec"]["input"],
                "What is 2 + 2? [".to_string() + task + "]"
            );
        } else {
            assert_eq!(attempts.len(), 1, "{new}");
            assert_eq!(
                (&new["run"], &new["verdict"], &new["reward"]),
                (&old["run"], &old["verdict"], &old["reward"]),
                "a scored case is untouched: {new}"
            );
        }
    }
    assert_eq!(
        old_reasons(&before),
        vec!["EvaluationTimeout", "GraderFailed", "RunFailed"]
    );

    // Nothing is left to retry.
    let stderr = server.fails(&["eval", "retry", "flaky-eval"]);
    assert!(
        stderr.contains("reasons") && stderr.contains("none unscored"),
        "{stderr}"
    );
    assert_eq!(results(&server, "flaky-eval"), after, "nothing written");
}

/// The reasons of the unscored cases, sorted.
fn old_reasons(results: &[Value]) -> Vec<String> {
    let mut reasons: Vec<String> = results
        .iter()
        .filter_map(|r| r["reason"].as_str().map(str::to_string))
        .collect();
    reasons.sort();
    reasons
}

/// Two tasks, 4 repetitions each: `half` is answered right on 2 of its 4 asks, `once` on 1
/// (whichever runs ask first: the counts do not depend on the order). Graded first by version
/// 1.0.0's `exact` grader, which wants the bare number and so fails every "2 + 2 = 4" (the bug),
/// then rescored by 1.1.0's `numeric` grader (the fix).
#[tokio::test(flavor = "multi_thread")]
async fn a_rescore_grades_again_without_the_model_and_repetitions_give_pass_at_k() {
    let dir = tempfile::tempdir().expect("tempdir");
    let fake = FakeServer::start().await.expect("fake provider");
    let asks = Arc::new(Mutex::new(std::collections::BTreeMap::<String, u32>::new()));
    let counted = asks.clone();
    fake.respond_with(move |request| {
        let answer = (|| {
            if request.path.ends_with("/count_tokens") {
                return None;
            }
            let marker = marker(request)?;
            let mut asks = counted.lock().ok()?;
            let ask = asks.entry(marker.clone()).or_default();
            *ask += 1;
            let right = match marker.as_str() {
                "half" => *ask % 2 == 1,
                _ => *ask == 1,
            };
            Some(if right { "2 + 2 = 4" } else { "2 + 2 = 5" })
        })();
        Fake::Message(FakeMessage::text(answer.unwrap_or("ok")))
    });
    let base_url = fake.base_url();
    let server = ServerProcess::start_in_env(
        &Backend::Sqlite.store_url(dir.path()),
        dir.path(),
        "process",
        &[],
        &[
            ("ANTHROPIC_BASE_URL", base_url.as_str()),
            ("ANTHROPIC_API_KEY", "sk-ant-platform-epochs-0001"),
        ],
    );
    apply(
        &server,
        "apiVersion: nodus.dev/v1\nkind: Agent\nmetadata:\n  name: solver\nspec:\n  system: Answer in one short sentence.\n  model:\n    access: Nodus\n    families: [haiku]\n  maxTokens: 1024\n  perRunMaxCostUSD: \"0.10\"\n",
    );
    let environment = |version: &str, grader: &str, half_prompt: &str| {
        format!(
            "apiVersion: nodus.dev/v1\nkind: Environment\nmetadata:\n  name: epochs\nspec:\n  version: {version}\n  splits:\n    test:\n      tasks:\n      - {{id: half, prompt: \"{half_prompt}\", hidden: {{expected: 4}}}}\n      - {{id: once, prompt: \"What is 2 + 2? [once]\", hidden: {{expected: 4}}}}\n  grader:\n    kind: {grader}\n"
        )
    };
    let half = "What is 2 + 2? [half]";
    apply(&server, &environment("1.0.0", "exact", half));
    apply(&server, &environment("1.1.0", "numeric", half));
    apply(
        &server,
        &environment("2.0.0", "numeric", "What is 2 + 2? [half] Show your work."),
    );
    // An unknown reducer is refused, naming the field.
    let group = |name: &str, reducer: &str| {
        format!(
            "apiVersion: nodus.dev/v1\nkind: AgentGroup\nmetadata:\n  name: {name}\nspec:\n  agent: solver\n  limits:\n    maxActive: 8\n  maxCostUSD: \"2.00\"\n  evaluation:\n    environment: epochs@1.0.0\n    split: test\n    tasks: 2\n    repetitions: 4\n    seed: 1\n    reducer: {reducer}\n"
        )
    };
    let output = server.cli_in(&["apply", "-f", "-"], Some(&group("bad", "median")));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(
        stderr.contains("reducer") && stderr.contains("median"),
        "{stderr}"
    );
    apply(&server, &group("epochs-eval", "max"));
    let wait_succeeded = |name: &str| {
        server.ok(&[
            "wait",
            &format!("agentgroup/{name}"),
            "--for=jsonpath={.status.phase}=Succeeded",
            "--timeout=3m",
        ]);
        json(&server.ok(&["get", &format!("agentgroup/{name}"), "-o", "json"]))
    };
    let source = wait_succeeded("epochs-eval");
    assert!(
        close(&source["status"]["evaluation"]["passRate"], 0.0),
        "the exact grader failed every answer: {source}"
    );
    let requests = fake.requests().len();
    let runs = || {
        json(&server.ok(&["get", "agentruns", "-o", "json"]))["items"]
            .as_array()
            .map_or(0, Vec::len)
    };
    assert_eq!(runs(), 8);

    // A version whose tasks differ is refused, naming the task; nothing is written.
    let stderr = server.fails(&[
        "eval",
        "rescore",
        "epochs-eval",
        "--environment",
        "epochs@2.0.0",
    ]);
    assert!(
        stderr.contains("spec.evaluation.environment")
            && stderr.contains("\"half\"")
            && stderr.contains("prompt"),
        "{stderr}"
    );
    assert!(
        !server
            .cli(&["get", "agentgroup/epochs-eval-rescore"])
            .status
            .success()
    );

    // The rescore: the same work graded by 1.1.0, with no model call and no run.
    let printed = server.ok(&[
        "eval",
        "rescore",
        "epochs-eval",
        "--environment",
        "epochs@1.1.0",
    ]);
    assert!(
        printed.contains("agentgroup/epochs-eval-rescore created"),
        "{printed}"
    );
    let group = wait_succeeded("epochs-eval-rescore");
    assert_eq!(fake.requests().len(), requests, "no model call");
    assert_eq!(runs(), 8, "no run, so no agent sandbox");
    assert_eq!(group["spec"]["evaluation"]["rescoreOf"], "epochs-eval");
    let counts = &group["status"]["counts"];
    assert_eq!(
        (&counts["succeeded"], &counts["active"], &counts["queued"]),
        (&Value::from(0), &Value::from(0), &Value::from(0)),
        "{group}"
    );
    let source_results = results(&server, "epochs-eval");
    let rescored = results(&server, "epochs-eval-rescore");
    assert_eq!(rescored.len(), 8);
    for (old, new) in source_results.iter().zip(&rescored) {
        assert_eq!(new["run"], old["run"], "the source's run is graded: {new}");
        assert_eq!(new["environment"], "default/epochs@1.1.0", "{new}");
        assert_eq!(old["verdict"], "fail", "{old}");
    }
    let evaluation = &group["status"]["evaluation"];
    let per_task = evaluation["perTask"].as_array().expect("perTask");
    let task = |id: &str| {
        per_task
            .iter()
            .find(|t| t["taskId"] == id)
            .unwrap_or_else(|| panic!("{id} in {group}"))
            .clone()
    };
    // By hand, 1 − C(n−c, k)/C(n, k) with n = 4:
    // half (c = 2): 1/2, 1 − C(2,2)/C(4,2) = 5/6, 1, 1;
    // once (c = 1): 1/4, 1 − C(3,2)/C(4,2) = 1/2, 1 − C(3,3)/C(4,3) = 3/4, 1.
    for (id, passes, expected) in [
        ("half", 2, [0.5, 5.0 / 6.0, 1.0, 1.0]),
        ("once", 1, [0.25, 0.5, 0.75, 1.0]),
    ] {
        let t = task(id);
        assert_eq!(
            (&t["attempts"], &t["scored"], &t["passes"]),
            (&Value::from(4), &Value::from(4), &Value::from(passes)),
            "{t}"
        );
        for (k, value) in expected.iter().enumerate() {
            assert!(
                close(&t["passAtK"][(k + 1).to_string()], *value),
                "pass@{} of {id}: {t}",
                k + 1
            );
        }
        // The reducer (max, kept from the source): each task passed at least once.
        assert!(close(&t["reward"], 1.0), "{t}");
    }
    // Across tasks: the mean of each k's values.
    for (k, value) in [(1, 3.0 / 8.0), (2, 2.0 / 3.0), (3, 7.0 / 8.0), (4, 1.0)] {
        assert!(
            close(&evaluation["passAtK"][k.to_string()], value),
            "pass@{k}: {evaluation}"
        );
    }
    assert!(close(&evaluation["taskReward"], 1.0), "{evaluation}");
    // The case-level rates stay over the 8 cases: 3 passed.
    assert!(close(&evaluation["passRate"], 3.0 / 8.0), "{evaluation}");

    // The console's group page shows the same per task.
    let jar = dir.path().join("cookies");
    let curl = |args: &[&str]| {
        let output = std::process::Command::new("curl")
            .args([
                "-s",
                "-c",
                jar.to_str().unwrap(),
                "-b",
                jar.to_str().unwrap(),
            ])
            .args(args)
            .output()
            .expect("curl");
        String::from_utf8_lossy(&output.stdout).into_owned()
    };
    curl(&[
        "-d",
        &format!("token={}", server::TOKEN),
        &format!("{}/console/signin", server.url),
    ]);
    let page = curl(&[&format!(
        "{}/console/p/default/groups/epochs-eval-rescore",
        server.url
    )]);
    let table = page
        .split("<table id=\"per-task\">")
        .nth(1)
        .and_then(|rest| rest.split("</table>").next())
        .unwrap_or_else(|| panic!("a per-task table: {page}"));
    assert!(table.contains("pass@4"), "{table}");
    assert!(
        table.contains(
            "<td>once</td><td class=\"num\">4</td><td class=\"num\">4</td><td class=\"num\">1</td>"
        ),
        "{table}"
    );
    assert!(
        table.contains("83.3 %") && table.contains("75.0 %"),
        "{table}"
    );

    // eval compare pairs the rescore with its source: 3 gained, 5 failed in both.
    let compared = json(&server.ok(&[
        "eval",
        "compare",
        "epochs-eval",
        "epochs-eval-rescore",
        "-o",
        "json",
    ]));
    assert_eq!(
        (
            &compared["pairs"],
            &compared["gained"],
            &compared["bothFail"],
            &compared["environmentB"]
        ),
        (
            &Value::from(8),
            &Value::from(3),
            &Value::from(5),
            &Value::from("default/epochs@1.1.0")
        ),
        "{compared}"
    );
    // A rescore runs no agent: it is not retried.
    let stderr = server.fails(&["eval", "retry", "epochs-eval-rescore"]);
    assert!(stderr.contains("rescoreOf"), "{stderr}");
}

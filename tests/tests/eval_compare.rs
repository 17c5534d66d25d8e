//! `nodus eval compare A B` through the real `nodus` binary and server (SQLite, bubblewrap
//! sandboxes) with a fake Anthropic model over HTTP: two agents evaluated on the same
//! Environment version and seed, compared case by case with the paired difference in pass rate
//! and its interval; groups of another seed or Environment version are refused, naming why.

#[path = "support/server.rs"]
mod server;

use nodus_llm::testing::{Fake, FakeMessage, FakeServer, RecordedRequest};
use serde_json::Value;
use server::{Backend, ServerProcess};

/// The fake model: the agent's system prompt says which of the two agents asks (`baseline` or
/// `candidate`), the task's marker what each answers: right (4), wrong (5), or a refused call.
fn model(request: &RecordedRequest) -> Option<Fake> {
    if request.path.ends_with("/count_tokens") {
        return None;
    }
    let candidate = request.body["system"].to_string().contains("candidate");
    let prompt = request.body["messages"][0]["content"].to_string();
    let marker = prompt.split("? [").nth(1)?.split(']').next()?.to_string();
    // (baseline, candidate) for each marker.
    let (baseline_right, candidate_right) = match marker.as_str() {
        "both" => (true, true),
        "lost" => (true, false),
        "gained" | "gained-again" => (false, true),
        "neither" => (false, false),
        "refused" if candidate => {
            return Some(Fake::status(
                400,
                "invalid_request_error",
                "this request is refused",
            ));
        }
        "refused" => (true, true),
        _ => return None,
    };
    let right = if candidate {
        candidate_right
    } else {
        baseline_right
    };
    let answer = if right { "2 + 2 = 4" } else { "2 + 2 = 5" };
    Some(Fake::Message(FakeMessage::text(answer)))
}

fn environment(version: &str) -> String {
    let tasks: String = [
        "both",
        "lost",
        "gained",
        "gained-again",
        "neither",
        "refused",
    ]
    .iter()
    .map(|m| {
        format!("      - {{id: {m}, prompt: \"What is 2 + 2? [{m}]\", hidden: {{expected: 4}}}}\n")
    })
    .collect();
    format!(
        "apiVersion: nodus.dev/v1\nkind: Environment\nmetadata:\n  name: paired\nspec:\n  version: {version}\n  splits:\n    test:\n      tasks:\n{tasks}  grader:\n    kind: numeric\n"
    )
}

fn agent(name: &str) -> String {
    format!(
        "apiVersion: nodus.dev/v1\nkind: Agent\nmetadata:\n  name: {name}\nspec:\n  system: You are the {name}.\n  model:\n    access: Nodus\n    families: [haiku]\n  maxTokens: 1024\n  perRunMaxCostUSD: \"0.10\"\n"
    )
}

fn group(name: &str, agent: &str, environment: &str, tasks: u32, seed: u64) -> String {
    format!(
        "apiVersion: nodus.dev/v1\nkind: AgentGroup\nmetadata:\n  name: {name}\nspec:\n  agent: {agent}\n  limits:\n    maxActive: 6\n  maxCostUSD: \"2.00\"\n  evaluation:\n    environment: {environment}\n    split: test\n    tasks: {tasks}\n    repetitions: 1\n    seed: {seed}\n    timeout: 5m\n"
    )
}

fn apply(server: &ServerProcess, yaml: &str) {
    let output = server.cli_in(&["apply", "-f", "-"], Some(yaml));
    assert!(
        output.status.success(),
        "apply failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

fn wait_finished(server: &ServerProcess, name: &str) {
    for phase in ["Succeeded", "Failed"] {
        let output = server.cli(&[
            "wait",
            &format!("agentgroup/{name}"),
            &format!("--for=jsonpath={{.status.phase}}={phase}"),
            "--timeout=0",
        ]);
        if output.status.success() {
            return;
        }
    }
    server.ok(&[
        "wait",
        &format!("agentgroup/{name}"),
        "--for=jsonpath={.status.evaluation.pending}=0",
        "--timeout=3m",
    ]);
}

#[allow(clippy::float_arithmetic)]
fn close(value: &Value, expected: f64) -> bool {
    value.as_f64().is_some_and(|v| (v - expected).abs() < 1e-6)
}

#[tokio::test(flavor = "multi_thread")]
async fn eval_compare_pairs_two_groups_and_refuses_others() {
    let dir = tempfile::tempdir().expect("tempdir");
    let fake = FakeServer::start().await.expect("fake provider");
    fake.respond_with(|request| {
        model(request).unwrap_or_else(|| Fake::Message(FakeMessage::text("ok")))
    });
    let base_url = fake.base_url();
    let server = ServerProcess::start_in_env(
        &Backend::Sqlite.store_url(dir.path()),
        dir.path(),
        "process",
        &[],
        &[
            ("ANTHROPIC_BASE_URL", base_url.as_str()),
            ("ANTHROPIC_API_KEY", "sk-ant-platform-compare-0001"),
        ],
    );
    apply(&server, &agent("baseline"));
    apply(&server, &agent("candidate"));
    apply(&server, &environment("1.0.0"));
    apply(&server, &environment("1.1.0"));
    apply(&server, &group("base", "baseline", "paired@1.0.0", 6, 7));
    apply(&server, &group("cand", "candidate", "paired@1.0.0", 6, 7));
    apply(
        &server,
        &group("reseeded", "candidate", "paired@1.0.0", 6, 8),
    );
    apply(&server, &group("newer", "candidate", "paired@1.1.0", 6, 7));
    for name in ["base", "cand", "reseeded", "newer"] {
        wait_finished(&server, name);
    }

    let compared: Value =
        serde_json::from_str(&server.ok(&["eval", "compare", "base", "cand", "-o", "json"]))
            .expect("JSON");
    assert_eq!(
        compared["environment"], "default/paired@1.0.0",
        "{compared}"
    );
    assert_eq!(compared["seed"], 7);
    // By hand: both passes in both; lost only in the baseline; gained and gained-again only
    // in the candidate; neither in neither; refused is unscored in the candidate (its run
    // failed), so it is not a pair. e=1, f=2 (gained), g=1 (lost), h=1, n=5.
    let mut changes: Vec<(String, String, String, String)> = compared["cases"]
        .as_array()
        .expect("cases")
        .iter()
        .map(|c| {
            let text = |k: &str| c[k].as_str().unwrap_or_default().to_string();
            (text("taskId"), text("a"), text("b"), text("change"))
        })
        .collect();
    changes.sort();
    let row = |t: &str, a: &str, b: &str, c: &str| (t.into(), a.into(), b.into(), c.into());
    assert_eq!(
        changes,
        vec![
            row("both", "pass", "pass", "bothPass"),
            row("gained", "fail", "pass", "gained"),
            row("gained-again", "fail", "pass", "gained"),
            row("lost", "pass", "fail", "lost"),
            row("neither", "fail", "fail", "bothFail"),
            row("refused", "pass", "RunFailed", "notPaired"),
        ]
    );
    assert_eq!(
        (
            &compared["pairs"],
            &compared["gained"],
            &compared["lost"],
            &compared["notPaired"]
        ),
        (
            &Value::from(5),
            &Value::from(2),
            &Value::from(1),
            &Value::from(1)
        )
    );
    // A 2/5, B 3/5, B − A = 0.2; Newcombe's method 10 worked by hand (Python): eh − fg = −1,
    // φ = −1/√(3·2·2·3) = −1/6, interval −0.364078 .. 0.631341.
    assert!(close(&compared["passRateA"], 0.4) && close(&compared["passRateB"], 0.6));
    assert!(close(&compared["difference"], 0.2));
    assert!(
        close(&compared["interval"]["low"], -0.364_078_0),
        "{compared}"
    );
    assert!(
        close(&compared["interval"]["high"], 0.631_341_4),
        "{compared}"
    );

    // The table says the same for people.
    let table = server.ok(&["eval", "compare", "base", "cand"]);
    assert!(
        table.contains("B = cand against A = base: default/paired@1.0.0, split test, seed 7"),
        "{table}"
    );
    assert!(
        table.contains("Pass rate over the pairs: A 40.0 %, B 60.0 %"),
        "{table}"
    );
    assert!(
        table.contains(
            "Difference B − A: +20.0 % (95 % interval -36.4 % .. +63.1 %, Newcombe's method 10)"
        ),
        "{table}"
    );

    // Another seed, another version, an unknown group: refused, naming why, exit code 1.
    for (other, field, value) in [
        ("reseeded", "seed", "8"),
        ("newer", "environment", "default/paired@1.1.0"),
    ] {
        let output = server.cli(&["eval", "compare", "base", other]);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{stderr}");
        assert!(
            stderr.contains(&format!("B ({other}) {field} is {value}"))
                && stderr.contains("same Environment version, split and seed"),
            "{stderr}"
        );
    }
    let output = server.cli(&["eval", "compare", "base", "nothing-here"]);
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("nothing-here"));
}

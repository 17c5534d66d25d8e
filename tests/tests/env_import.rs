//! `nodus env import harbor DIR…` and `nodus env import jsonl FILE` through the real `nodus`
//! binary. Harbor's own models (harbor 0.25.0, run by the Python that `NODUS_HARBOR_PYTHON`
//! names) read the same task fields from the same directories as the importer: id,
//! instruction, agent and verifier timeouts, image; and refuse the same broken directories.
//! End to end through a real server (SQLite, bubblewrap sandboxes, a fake Anthropic model
//! over HTTP that runs one command, then answers): two Harbor tasks, one whose `test.sh`
//! passes and one whose fails on the agent's final working directory, score 1 and 0; two
//! JSONL samples (a text input and a chat input) score 1 and 0 with the exact grader. Bad
//! input is refused naming the path or line and the field, and nothing is written.

#[path = "support/harbor.rs"]
mod harbor;
#[path = "support/server.rs"]
mod server;

use std::path::{Path, PathBuf};
use std::process::Command;

use nodus_core::resource::DurationSpec;
use nodus_llm::testing::{Fake, FakeMessage, FakeServer};
use serde_json::Value;
use server::{Backend, ServerProcess};

/// Passes when the agent left `hello.txt` holding the tests' `expected.txt` (reward.txt 1);
/// fails otherwise (reward.json 0): both of Harbor's reward files are read.
const TEST_SH: &str = "if cmp -s hello.txt /tests/expected.txt; then\n  echo 1 > /logs/verifier/reward.txt\nelse\n  echo '{\"reward\": 0}' > /logs/verifier/reward.json\nfi\n";

/// Writes a task directory: `task.toml` (unless `None`), `instruction.md` (unless `None`),
/// `tests/test.sh`, `tests/expected.txt` and `environment/Dockerfile`.
fn write_task(root: &Path, name: &str, toml: Option<&str>, instruction: Option<&str>) -> PathBuf {
    let dir = root.join(name);
    std::fs::create_dir_all(dir.join("tests")).expect("tests/");
    std::fs::create_dir_all(dir.join("environment")).expect("environment/");
    if let Some(toml) = toml {
        std::fs::write(dir.join("task.toml"), toml).expect("task.toml");
    }
    if let Some(instruction) = instruction {
        std::fs::write(dir.join("instruction.md"), instruction).expect("instruction.md");
    }
    std::fs::write(dir.join("tests/test.sh"), TEST_SH).expect("test.sh");
    std::fs::write(dir.join("tests/expected.txt"), "hello\n").expect("expected.txt");
    std::fs::write(dir.join("environment/Dockerfile"), "FROM ubuntu:24.04\n").expect("Dockerfile");
    dir
}

/// What harbor's `Task` reads from each directory (or the error it refuses it with).
fn harbor_reads(dirs: &[PathBuf]) -> Vec<Value> {
    const SCRIPT: &str = "\
import importlib.metadata, json, sys
from harbor.models.task.task import Task
version = importlib.metadata.version('harbor')
assert version == '0.25.0', f'harbor {version} is installed, not 0.25.0'
out = []
for path in sys.argv[1:]:
    try:
        t = Task(path)
        out.append({'id': t.name, 'instruction': t.instruction,
                    'agent_timeout_sec': t.config.agent.timeout_sec,
                    'verifier_timeout_sec': t.config.verifier.timeout_sec,
                    'docker_image': t.config.environment.docker_image})
    except Exception as e:
        out.append({'error': type(e).__name__})
print(json.dumps(out))
";
    let output = Command::new(harbor::harbor_python())
        .args(["-c", SCRIPT])
        .args(dirs)
        .output()
        .expect("the harbor python runs");
    assert!(
        output.status.success(),
        "harbor failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let read: Value = serde_json::from_slice(&output.stdout).expect("harbor's JSON");
    read.as_array().cloned().expect("a list")
}

/// `nodus env import harbor DIR --no-image -o json` (no server needed): the importer's
/// documents, or its error.
fn import_json(data_dir: &Path, args: &[&str]) -> Result<Value, String> {
    let output = server::cli_against("http://127.0.0.1:9", data_dir, args, None);
    if output.status.success() {
        Ok(serde_json::from_slice(&output.stdout).expect("a JSON List"))
    } else {
        Err(String::from_utf8_lossy(&output.stderr).into_owned())
    }
}

/// `nodus env import harbor PATH --name one --version 1.0.0 [--no-image] -o json`.
fn import_task(data_dir: &Path, path: &str, no_image: bool) -> Result<Value, String> {
    let mut args = vec![
        "env",
        "import",
        "harbor",
        path,
        "--name",
        "one",
        "--version",
        "1.0.0",
    ];
    if no_image {
        args.push("--no-image");
    }
    args.extend(["-o", "json"]);
    import_json(data_dir, &args)
}

#[test]
fn harbor_reads_the_same_task_fields_as_the_importer() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path();
    let dirs = vec![
        write_task(
            root,
            "full",
            Some(
                "version = \"1.0\"\n[task]\nname = \"acme/hello-world\"\ndescription = \"d\"\n\
                 [metadata]\ndifficulty = \"easy\"\n[agent]\ntimeout_sec = 120\n[verifier]\n\
                 timeout_sec = 30.5\n[environment]\ndocker_image = \"ghcr.io/acme/hello:1\"\n\
                 cpus = 2\nmemory_mb = 2048\n",
            ),
            Some(
                "<!-- BENCHMARK DATA SHOULD NEVER APPEAR. canary GUID 26b5c67b -->\r\n\r\nWrite hello.txt.\r\nThen say done.\r\n",
            ),
        ),
        write_task(
            root,
            "defaults",
            Some(""),
            Some("# not a marker\nJust do it."),
        ),
        write_task(
            root,
            "timeouts",
            Some("[agent]\ntimeout_sec = 0.5\n[verifier]\ntimeout_sec = 1200\n"),
            Some("# canary line\n\n\nThe task.\n"),
        ),
    ];
    let harbor = harbor_reads(&dirs);
    for (dir, harbor) in dirs.iter().zip(&harbor) {
        assert!(
            harbor.get("error").is_none(),
            "harbor refused {dir:?}: {harbor}"
        );
        let path = dir.to_str().unwrap();
        let list = import_task(root, path, true).unwrap_or_else(|e| panic!("{path}: {e}"));
        let environment = &list["items"][1];
        let task = &environment["spec"]["splits"]["test"]["tasks"][0];
        assert_eq!(task["id"], harbor["id"], "{path}");
        assert_eq!(task["prompt"], harbor["instruction"], "{path}");
        // Timeouts: whole seconds, rounded up.
        let seconds = |v: &Value| {
            v.as_f64()
                .map(|s| DurationSpec::from_secs(s.ceil() as u64).to_string())
        };
        let timeout = task
            .get("timeout")
            .and_then(Value::as_str)
            .map(str::to_string);
        assert_eq!(timeout, seconds(&harbor["agent_timeout_sec"]), "{path}");
        assert_eq!(
            environment["spec"]["grader"]["timeout"]
                .as_str()
                .map(str::to_string),
            seconds(&harbor["verifier_timeout_sec"]),
            "{path}"
        );
        // The image as the task names it, when imported without --no-image.
        let with_image = import_task(root, path, false);
        match harbor["docker_image"].as_str() {
            Some(image) => {
                assert_eq!(
                    with_image.expect("imported")["items"][1]["spec"]["image"],
                    image
                )
            }
            None => assert!(
                with_image
                    .expect_err("no image")
                    .contains("environment.docker_image"),
                "{path}"
            ),
        }
    }

    // What harbor refuses, the importer refuses too, naming the file.
    let broken = vec![
        write_task(root, "no-instruction", Some(""), None),
        write_task(
            root,
            "bad-toml",
            Some("[agent\ntimeout_sec = 1\n"),
            Some("Do it."),
        ),
        write_task(
            root,
            "bad-name",
            Some("[task]\nname = \"no-org\"\n"),
            Some("Do it."),
        ),
    ];
    for ((dir, harbor), file) in
        broken
            .iter()
            .zip(harbor_reads(&broken))
            .zip(["instruction.md", "task.toml", "task.toml"])
    {
        assert!(
            harbor.get("error").is_some(),
            "harbor read {dir:?}: {harbor}"
        );
        let path = dir.to_str().unwrap();
        let error = import_task(root, path, true).expect_err(path);
        assert!(error.contains(&format!("{path}/{file}")), "{error}");
    }
}

fn json(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
}

fn results_by_task(
    server: &ServerProcess,
    group: &str,
) -> std::collections::BTreeMap<String, Value> {
    json(&server.ok(&["get", "results", group, "-o", "json"]))["items"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .map(|r| (r["taskId"].as_str().unwrap_or_default().to_string(), r))
        .collect()
}

fn evaluate(server: &ServerProcess, group: &str, environment: &str) -> Value {
    let yaml = format!(
        "apiVersion: nodus.dev/v1\nkind: AgentGroup\nmetadata:\n  name: {group}\nspec:\n  agent: solver\n  limits:\n    maxActive: 2\n  maxCostUSD: \"1.00\"\n  evaluation:\n    environment: {environment}\n    split: test\n    tasks: 2\n    timeout: 2m\n"
    );
    let output = server.cli_in(&["apply", "-f", "-"], Some(&yaml));
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    server.ok(&[
        "wait",
        &format!("agentgroup/{group}"),
        "--for=jsonpath={.status.phase}=Succeeded",
        "--timeout=2m",
    ]);
    json(&server.ok(&["get", &format!("agentgroup/{group}"), "-o", "json"]))
}

#[tokio::test(flavor = "multi_thread")]
async fn imported_benchmarks_run_end_to_end_and_bad_input_writes_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().join("bench");
    // The fake model: a prompt marked [pass] writes hello, [fail] writes goodbye (one command,
    // then "done"); the JSONL samples are answered 4 and green.
    let fake = FakeServer::start().await.expect("fake provider");
    fake.respond_with(|request| {
        let messages = request.body["messages"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let prompt = messages
            .first()
            .map(|m| m["content"].to_string())
            .unwrap_or_default();
        let text = |t: &str| Fake::Message(FakeMessage::text(t));
        if messages.len() > 1 {
            text("done")
        } else if prompt.contains("[pass]") {
            Fake::Message(FakeMessage::tool_use("t1", "printf 'hello\\n' > hello.txt"))
        } else if prompt.contains("[fail]") {
            Fake::Message(FakeMessage::tool_use(
                "t1",
                "printf 'goodbye\\n' > hello.txt",
            ))
        } else if prompt.contains("2 + 2") {
            text("4")
        } else {
            text("green")
        }
    });
    let base_url = fake.base_url();
    let server = ServerProcess::start_in_env(
        &Backend::Sqlite.store_url(dir.path()),
        dir.path(),
        "process",
        &[],
        &[
            ("ANTHROPIC_BASE_URL", base_url.as_str()),
            ("ANTHROPIC_API_KEY", "sk-ant-platform-import-0001"),
        ],
    );
    let output = server.cli_in(
        &["apply", "-f", "-"],
        Some("apiVersion: nodus.dev/v1\nkind: Agent\nmetadata:\n  name: solver\nspec:\n  system: Do the task.\n  model:\n    access: Nodus\n    families: [haiku]\n  maxTokens: 1024\n  perRunMaxCostUSD: \"0.10\"\n"),
    );
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );

    // Bad input first: each refused naming the path or line and the field; nothing written.
    let no_instruction = write_task(&root, "no-instruction", Some(""), None);
    let bad_toml = write_task(
        &root,
        "bad-toml",
        Some("[verifier]\ntimeout_sec = \"soon\"\n"),
        Some("Do it."),
    );
    let good = write_task(&root, "good", Some(""), Some("Do it."));
    for (dirs, path, field) in [
        (
            vec![&good, &no_instruction],
            format!("{}/instruction.md", no_instruction.display()),
            "must exist",
        ),
        (
            vec![&bad_toml],
            format!("{}/task.toml: verifier.timeout_sec", bad_toml.display()),
            "invalid type",
        ),
    ] {
        let mut args = vec!["env", "import", "harbor"];
        args.extend(dirs.iter().map(|d| d.to_str().unwrap()));
        args.extend(["--name", "broken", "--version", "1.0.0", "--no-image"]);
        let stderr = server.fails(&args);
        assert!(stderr.contains(&path) && stderr.contains(field), "{stderr}");
    }
    let samples = dir.path().join("samples.jsonl");
    for (text, line, field) in [
        (
            "{\"input\": \"a\", \"target\": \"a\"}\n{\"target\": \"b\"}\n",
            ":2: input",
            "is required",
        ),
        (
            "{\"input\": \"a\", \"target\": \"a\"}\n\n{\"input\": \"b\", \n",
            ":3",
            "must be JSON",
        ),
    ] {
        std::fs::write(&samples, text).expect("samples");
        let stderr = server.fails(&[
            "env",
            "import",
            "jsonl",
            samples.to_str().unwrap(),
            "--name",
            "broken",
            "--version",
            "1.0.0",
            "--grader",
            "exact",
        ]);
        assert!(
            stderr.contains(&format!("{}{line}", samples.display())) && stderr.contains(field),
            "{stderr}"
        );
    }
    let environments = json(&server.ok(&["get", "environments", "-o", "json"]));
    let filesets = json(&server.ok(&["get", "filesets", "-o", "json"]));
    for list in [&environments, &filesets] {
        assert_eq!(
            list["items"],
            serde_json::json!([]),
            "nothing written: {list}"
        );
    }

    // Two Harbor tasks: the agent's work passes one test.sh and fails the other.
    let pass = write_task(
        &root,
        "pass",
        Some(
            "[task]\nname = \"bench/pass\"\n[agent]\ntimeout_sec = 300\n[verifier]\ntimeout_sec = 60\n",
        ),
        Some("Write hello into hello.txt. [pass]\n"),
    );
    let fail = write_task(
        &root,
        "fail",
        Some(""),
        Some("Write hello into hello.txt. [fail]\n"),
    );
    let printed = server.ok(&[
        "env",
        "import",
        "harbor",
        pass.to_str().unwrap(),
        fail.to_str().unwrap(),
        "--name",
        "harbor-bench",
        "--version",
        "1.0.0",
        "--no-image",
    ]);
    assert!(
        printed.contains("fileset.nodus.dev/harbor-bench-1-0-0-tests created")
            && printed.contains("environment.nodus.dev/harbor-bench@1.0.0 created"),
        "{printed}"
    );
    let group = evaluate(&server, "harbor-eval", "harbor-bench@1.0.0");
    let evaluation = &group["status"]["evaluation"];
    assert_eq!(
        (&evaluation["scored"], &evaluation["unscored"]),
        (&Value::from(2), &serde_json::json!({})),
        "{group}"
    );
    let results = results_by_task(&server, "harbor-eval");
    let (passed, failed) = (&results["bench/pass"], &results["fail"]);
    assert_eq!(
        (&passed["reward"], &passed["verdict"]),
        (&Value::from(1.0), &Value::from("pass")),
        "{passed}"
    );
    assert!(
        passed["evidence"]
            .as_str()
            .unwrap_or_default()
            .contains("reward.txt"),
        "{passed}"
    );
    assert_eq!(
        (&failed["reward"], &failed["verdict"]),
        (&Value::from(0.0), &Value::from("fail")),
        "{failed}"
    );
    assert!(
        failed["evidence"]
            .as_str()
            .unwrap_or_default()
            .contains("reward.json"),
        "{failed}"
    );
    // Another spec under a version already written is refused before anything is written:
    // the version's tests (its grader's FileSet) stay as they were.
    let tests = || {
        json(&server.ok(&["get", "fileset/harbor-bench-1-0-0-tests", "-o", "json"]))["spec"].clone()
    };
    let before = tests();
    std::fs::write(pass.join("tests/expected.txt"), "changed\n").expect("expected.txt");
    let stderr = server.fails(&[
        "env",
        "import",
        "harbor",
        pass.to_str().unwrap(),
        fail.to_str().unwrap(),
        "--name",
        "harbor-bench",
        "--version",
        "1.0.0",
        "--no-image",
    ]);
    assert!(
        stderr.contains("harbor-bench-1-0-0-tests") && stderr.contains("another --version"),
        "{stderr}"
    );
    assert_eq!(tests(), before, "the written version's tests are untouched");
    // The agent's timeout from task.toml is its run's.
    let run = json(&server.ok(&[
        "get",
        &format!("agentrun/{}", passed["run"].as_str().unwrap()),
        "-o",
        "json",
    ]));
    assert_eq!(
        run["spec"]["timeout"],
        DurationSpec::from_secs(300).to_string(),
        "{run}"
    );

    // Inspect-style samples with the exact grader.
    std::fs::write(
        &samples,
        "{\"id\": \"sum\", \"input\": \"What is 2 + 2?\", \"target\": \"4\"}\n{\"id\": \"sky\", \"input\": [{\"role\": \"user\", \"content\": \"What color is the sky?\"}], \"target\": [\"blue\"]}\n",
    )
    .expect("samples");
    server.ok(&[
        "env",
        "import",
        "jsonl",
        samples.to_str().unwrap(),
        "--name",
        "qa",
        "--version",
        "1.0.0",
        "--grader",
        "exact",
    ]);
    evaluate(&server, "qa-eval", "qa@1.0.0");
    let results = results_by_task(&server, "qa-eval");
    assert_eq!(
        (&results["sum"]["verdict"], &results["sky"]["verdict"]),
        (&Value::from("pass"), &Value::from("fail")),
        "{results:?}"
    );

    // Importing the same version again changes nothing; another spec under it is refused
    // before anything is written.
    let again = server.ok(&[
        "env",
        "import",
        "jsonl",
        samples.to_str().unwrap(),
        "--name",
        "qa",
        "--version",
        "1.0.0",
        "--grader",
        "exact",
    ]);
    assert!(
        again.contains("environment.nodus.dev/qa@1.0.0 unchanged"),
        "{again}"
    );
    let stderr = server.fails(&[
        "env",
        "import",
        "jsonl",
        samples.to_str().unwrap(),
        "--name",
        "qa",
        "--version",
        "1.0.0",
        "--grader",
        "regex",
    ]);
    assert!(
        stderr.contains("qa@1.0.0") && stderr.contains("another --version"),
        "{stderr}"
    );
}

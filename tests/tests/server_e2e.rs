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
    // The command's output line, not the command the answer quotes (`echo triaged` →).
    let triaged = server.ok(&["agentrun", "answer", "triage"]);
    assert!(triaged.lines().any(|l| l == "triaged"), "{triaged}");

    // What a command sees of how its sandbox was started names neither the data directory
    // nor the server's working directory.
    server.ok(&[
        "create",
        "agentrun",
        "peek",
        "--agent",
        "hello-agent",
        "--prompt",
        "Run `cat /proc/1/cmdline; echo; cat /proc/1/environ; echo; cat /proc/self/mountinfo; echo peeked` please",
    ]);
    server.ok(&[
        "wait",
        "agentrun/peek",
        "--for=jsonpath={.status.phase}=Succeeded",
        "--timeout=2m",
    ]);
    let peeked = server.ok(&["agentrun", "answer", "peek"]);
    assert!(
        peeked.lines().any(|l| l == "peeked") && peeked.contains(" /work "),
        "{peeked}"
    );
    let data_dir = dir.path().display().to_string();
    let server_cwd = std::env::current_dir().expect("cwd").display().to_string();
    assert!(
        !peeked.contains(&data_dir),
        "the data directory shows: {peeked}"
    );
    assert!(
        !peeked.contains(&server_cwd),
        "the server's cwd shows: {peeked}"
    );

    // A working directory staged from a FileSet before the first command.
    server.ok(&["apply", "-f", &example("fileset.yaml")]);
    let filesets = server.ok(&["get", "filesets"]);
    assert!(
        filesets.contains("project-source") && filesets.contains("FILES"),
        "{filesets}"
    );
    server.ok(&["apply", "-f", &example("workdir-run.yaml")]);
    server.ok(&[
        "wait",
        "agentrun/review-config",
        "--for=jsonpath={.status.phase}=Succeeded",
        "--timeout=2m",
    ]);
    let answer = server.ok(&["agentrun", "answer", "review-config"]);
    assert!(answer.contains("retries: 3"), "{answer}");
    let saved = dir.path().join("review-config.tar");
    server.ok(&[
        "agentrun",
        "workdir",
        "review-config",
        saved.to_str().expect("utf-8 path"),
    ]);
    let tar = std::fs::read(&saved).expect("the saved archive");
    let mut names: Vec<String> = tar::Archive::new(tar.as_slice())
        .entries()
        .expect("a tar archive")
        .map(|entry| {
            let entry = entry.expect("an entry");
            entry.path().expect("a path").display().to_string()
        })
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            "app",
            "app/config.yaml",
            "check.sh",
            "copy",
            "copy/config.yaml"
        ],
        "the final working directory, directories included"
    );
    // A run without spec.workdir keeps its final working directory too: `echo triaged` wrote
    // no file into it.
    let kept = dir.path().join("triage.tar");
    server.ok(&[
        "agentrun",
        "workdir",
        "triage",
        kept.to_str().expect("utf-8 path"),
    ]);
    let tar = std::fs::read(&kept).expect("the saved archive");
    let files = tar::Archive::new(tar.as_slice())
        .entries()
        .expect("a tar archive")
        .map(|entry| entry.expect("an entry"))
        .filter(|entry| entry.header().entry_type().is_file())
        .count();
    assert_eq!(files, 0, "the triage run wrote no file");
    let missing = "apiVersion: nodus.dev/v1\nkind: AgentRun\nmetadata:\n  name: no-files\n\
                   spec:\n  agent: hello-agent\n  input: hi\n  workdir:\n    baseWorkdir: nothing-here\n";
    let refused = server.cli_in(&["apply", "-f", "-"], Some(missing));
    assert!(!refused.status.success(), "a missing FileSet is refused");
    let message = String::from_utf8_lossy(&refused.stderr);
    assert!(
        message.contains("spec.workdir.baseWorkdir") && message.contains("existing FileSet"),
        "{message}"
    );
    server.fails(&["get", "agentrun/no-files"]);

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
    let chat = server.ok(&["agentrun", "answer", "chat"]);
    assert!(chat.lines().any(|l| l == "staging"), "{chat}");
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

fn limits_walk(backend: Backend) {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = backend.store_url(dir.path());
    let server = ServerProcess::start(&store, dir.path(), "process");
    server.ok(&["apply", "-f", &example("agent.yaml")]);

    // A deadline ends a waiting run, without another model call.
    server.ok(&[
        "create",
        "agentrun",
        "dl",
        "--agent",
        "hello-agent",
        "--prompt",
        "Run `echo hi`",
        "--keep-alive",
        "--deadline",
        "3s",
    ]);
    server.ok(&[
        "wait",
        "agentrun/dl",
        "--for=jsonpath={.status.reason}=DeadlineExceeded",
        "--timeout=1m",
    ]);
    assert_eq!(
        server
            .ok(&["get", "agentrun/dl", "-o", "jsonpath={.status.phase}"])
            .trim(),
        "Failed"
    );

    // A run whose cap cannot fit the next call: tests/server_models.rs (the offline model
    // here is free, so no call is too big for a cap).

    // Group cap admission: $0.75 holds one run of the agent's $0.50 cap; the second waits
    // with MaxCostReached.
    server.ok(&[
        "create",
        "agentgroup",
        "tight",
        "--agent",
        "hello-agent",
        "--max-active",
        "5",
        "--max-cost",
        "0.75",
    ]);
    let held = |name: &str, key: &str| {
        vec![
            "create".to_string(),
            "agentrun".into(),
            name.into(),
            "--agent".into(),
            "hello-agent".into(),
            "--group".into(),
            "tight".into(),
            "--task-key".into(),
            key.into(),
            "--prompt".into(),
            "Run `echo held`".into(),
            "--keep-alive".into(),
        ]
    };
    let first = held("tight-one", "one");
    server.ok(&first.iter().map(String::as_str).collect::<Vec<_>>());
    let second = held("tight-two", "two");
    server.ok(&second.iter().map(String::as_str).collect::<Vec<_>>());
    server.ok(&[
        "wait",
        "agentrun/tight-one",
        "--for=jsonpath={.status.phase}=Waiting",
        "--timeout=1m",
    ]);
    // The group controller marks the second run after its next reconcile, which may come
    // after the first run is already waiting: wait for it rather than read once.
    server.ok(&[
        "wait",
        "agentrun/tight-two",
        "--for=jsonpath={.status.reason}=GroupWait",
        "--timeout=1m",
    ]);
    assert_eq!(
        server
            .ok(&[
                "get",
                "ag/tight",
                "-o",
                "jsonpath={.status.blockedReasons.MaxCostReached}"
            ])
            .trim(),
        "1"
    );
    // When the first finishes, its spend is counted and its cap released: the second starts.
    server.ok(&["cancel", "agentrun/tight-one"]);
    server.ok(&[
        "wait",
        "agentrun/tight-two",
        "--for=jsonpath={.status.phase}=Waiting",
        "--timeout=1m",
    ]);

    // Batches: 101 runs are refused whole; a repeated Idempotency-Key returns the first result.
    let runs_path = "/apis/nodus.dev/v1/projects/default/agentruns";
    let batch = |count: usize| {
        let items: Vec<String> = (0..count)
            .map(|i| format!(r#"{{"apiVersion":"nodus.dev/v1","kind":"AgentRun","metadata":{{"name":"many-{i}"}},"spec":{{"agent":"hello-agent","input":"hi"}}}}"#))
            .collect();
        format!(
            r#"{{"apiVersion":"nodus.dev/v1","kind":"AgentRunList","items":[{}]}}"#,
            items.join(",")
        )
    };
    let (status, body) = server.http("POST", runs_path, Some(TOKEN), Some(&batch(101)));
    assert_eq!(
        (status, body["reason"].as_str()),
        (422, Some("Invalid")),
        "{body}"
    );
    assert_eq!(
        server
            .http("GET", &format!("{runs_path}/many-0"), Some(TOKEN), None)
            .0,
        404,
        "nothing of it was written"
    );
    let first = server.http_with(
        "POST",
        runs_path,
        &[("Idempotency-Key", "batch-7")],
        Some(&batch(5)),
    );
    let again = server.http_with(
        "POST",
        runs_path,
        &[("Idempotency-Key", "batch-7")],
        Some(&batch(5)),
    );
    assert_eq!(first.0, 201, "{}", first.1);
    assert_eq!(again.0, 201, "{}", again.1);
    let names = |v: &serde_json::Value| {
        v["items"].as_array().map(|i| {
            i.iter()
                .map(|r| r["metadata"]["name"].clone())
                .collect::<Vec<_>>()
        })
    };
    assert_eq!(names(&first.1), names(&again.1));
    let listed = server.ok(&["get", "ar", "-o", "jsonpath={.items[*].metadata.name}"]);
    assert_eq!(
        listed
            .split_whitespace()
            .filter(|n| n.starts_with("many-"))
            .count(),
        5
    );

    // Bad input through the CLI: malformed YAML, an unknown field, an oversize input.
    let output = server.cli_in(
        &["apply", "-f", "-"],
        Some("apiVersion: nodus.dev/v1\nkind: [unclosed"),
    );
    assert!(!output.status.success());
    let output = server.cli_in(&["apply", "-f", "-"], Some("apiVersion: nodus.dev/v1\nkind: Agent\nmetadata: {name: odd}\nspec: {system: s, bogus: 1}\n"));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("spec.bogus"), "{stderr}");
    let big = format!(
        r#"{{"apiVersion":"nodus.dev/v1","kind":"AgentRun","metadata":{{"name":"big"}},"spec":{{"agent":"hello-agent","input":"{}"}}}}"#,
        "y".repeat(256 * 1024 + 1)
    );
    let output = server.cli_in(&["apply", "-f", "-"], Some(&big));
    let refused = String::from_utf8_lossy(&output.stderr);
    assert!(
        !output.status.success() && refused.contains("spec.input"),
        "{refused}"
    );
    assert_eq!(
        server
            .http("GET", &format!("{runs_path}/big"), Some(TOKEN), None)
            .0,
        404
    );
}

#[test]
fn limits_and_bad_input_on_sqlite() {
    limits_walk(Backend::Sqlite);
}

#[test]
fn limits_and_bad_input_on_postgres() {
    limits_walk(Backend::Postgres);
}

/// Two replicas on one Postgres share the work: every run finishes once, no command runs
/// twice, and a run created through one replica can be read through the other.
#[test]
fn two_replicas_share_the_runs_on_postgres() {
    let store = server::postgres_url();
    let (one_dir, two_dir) = (
        tempfile::tempdir().expect("dir"),
        tempfile::tempdir().expect("dir"),
    );
    let one = ServerProcess::start(&store, one_dir.path(), "process");
    let two = ServerProcess::start(&store, two_dir.path(), "process");
    one.ok(&["apply", "-f", &example("agent.yaml")]);
    for i in 0..12 {
        one.ok(&[
            "create",
            "agentrun",
            &format!("shared-{i}"),
            "--agent",
            "hello-agent",
            "--prompt",
            &format!("Run `echo shared {i}`"),
        ]);
    }
    for i in 0..12 {
        two.ok(&[
            "wait",
            &format!("agentrun/shared-{i}"),
            "--for=jsonpath={.status.phase}=Succeeded",
            "--timeout=2m",
        ]);
        let steps = one.ok(&["agentrun", "steps", &format!("shared-{i}")]);
        let commands = steps.lines().filter(|l| l.contains("Command")).count();
        assert_eq!(commands, 1, "shared-{i} ran its command once:\n{steps}");
        assert!(!steps.contains("Uncertain"), "{steps}");
    }
}

/// A long poll (`?watch=true`) on one object and on a list, through `watcher`, answers within
/// seconds of a change made through `writer` (another replica on Postgres: the change comes
/// over LISTEN/NOTIFY), and not before; the list's version is read with the store's own
/// sparse listing.
fn long_poll_walk(writer: &ServerProcess, watcher: &ServerProcess) {
    writer.ok(&["apply", "-f", &example("agent.yaml")]);
    let agents = "/apis/nodus.dev/v1/projects/default/agents";
    let version = |body: &serde_json::Value| {
        body["metadata"]["resourceVersion"]
            .as_str()
            .expect("a version")
            .to_string()
    };
    let (status, agent) = watcher.http("GET", &format!("{agents}/hello-agent"), Some(TOKEN), None);
    assert_eq!(status, 200, "{agent}");
    let (status, list) = watcher.http("GET", agents, Some(TOKEN), None);
    assert_eq!(status, 200, "{list}");
    let (object_version, list_version) = (version(&agent), version(&list));
    std::thread::scope(|scope| {
        let watch = |path: String| {
            scope.spawn(move || {
                let answer = watcher.http("GET", &path, Some(TOKEN), None);
                (answer, std::time::Instant::now())
            })
        };
        let object = watch(format!(
            "{agents}/hello-agent?watch=true&resourceVersion={object_version}&timeoutSeconds=60"
        ));
        let listed = watch(format!(
            "{agents}?watch=true&resourceVersion={list_version}&timeoutSeconds=60"
        ));
        std::thread::sleep(std::time::Duration::from_secs(1));
        assert!(
            !object.is_finished() && !listed.is_finished(),
            "nothing changed yet"
        );
        writer.ok(&[
            "patch",
            "agent/hello-agent",
            "--patch",
            r#"{"metadata":{"labels":{"watched":"yes"}}}"#,
        ]);
        let changed = std::time::Instant::now();
        let ((status, body), at) = object.join().expect("object watch");
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["metadata"]["labels"]["watched"], "yes");
        assert_ne!(version(&body), object_version);
        assert!(
            at - changed < std::time::Duration::from_secs(3),
            "{:?}",
            at - changed
        );
        let ((status, body), at) = listed.join().expect("list watch");
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["items"][0]["metadata"]["labels"]["watched"], "yes");
        assert_ne!(version(&body), list_version);
        assert!(
            at - changed < std::time::Duration::from_secs(3),
            "{:?}",
            at - changed
        );
    });
}

#[test]
fn a_long_poll_answers_a_change_on_sqlite() {
    let dir = tempfile::tempdir().expect("dir");
    let server = ServerProcess::start(
        &Backend::Sqlite.store_url(dir.path()),
        dir.path(),
        "process",
    );
    long_poll_walk(&server, &server);
}

#[test]
fn a_long_poll_answers_a_change_made_through_another_replica_on_postgres() {
    let store = server::postgres_url();
    let (one_dir, two_dir) = (
        tempfile::tempdir().expect("dir"),
        tempfile::tempdir().expect("dir"),
    );
    let one = ServerProcess::start(&store, one_dir.path(), "process");
    let two = ServerProcess::start(&store, two_dir.path(), "process");
    long_poll_walk(&one, &two);
}

/// One Docker server at a time in this binary: a Docker server removes, when it starts, the
/// containers of runs it does not know (orphans), which another test's server may be using.
fn one_docker_server_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static DOCKER: std::sync::Mutex<()> = std::sync::Mutex::new(());
    DOCKER
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The same server with the Docker sandbox: a run's command executes in its own container.
#[test]
fn a_run_executes_in_a_docker_container() {
    let _docker = one_docker_server_at_a_time();
    let image = std::env::var("NODUS_TEST_DOCKER_IMAGE").unwrap_or_else(|_| {
        panic!("NODUS_TEST_DOCKER_IMAGE is not set: run the tests with ./scripts/test, which builds the test image")
    });
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Backend::Sqlite.store_url(dir.path());
    let server =
        ServerProcess::start_with(&store, dir.path(), "docker", &["--default-image", &image]);
    server.ok(&["apply", "-f", &example("agent.yaml")]);
    server.ok(&[
        "create",
        "agentrun",
        "boxed",
        "--agent",
        "hello-agent",
        "--prompt",
        "Run `echo from-docker; hostname`",
    ]);
    server.ok(&[
        "wait",
        "agentrun/boxed",
        "--for=jsonpath={.status.phase}=Succeeded",
        "--timeout=2m",
    ]);
    let answer = server.ok(&["agentrun", "answer", "boxed"]);
    assert!(answer.lines().any(|l| l == "from-docker"), "{answer}");
    let isolated = server.ok(&[
        "get",
        "agentrun/boxed",
        "-o",
        "jsonpath={.status.sandbox.isolated}",
    ]);
    assert_eq!(isolated.trim(), "true");
}

/// `spec.image` end to end: with the Docker sandbox a run executes in the image it names (one
/// built here from the test image with a marker file, not the server's default image), whose
/// content digest its `status.snapshot.imageDigest` and its run record record; the
/// bubblewrap process sandbox refuses the same run at creation, naming spec.image.
#[test]
fn a_run_executes_in_the_image_it_names_and_the_process_sandbox_refuses_one() {
    let _docker = one_docker_server_at_a_time();
    let base = std::env::var("NODUS_TEST_DOCKER_IMAGE").unwrap_or_else(|_| {
        panic!("NODUS_TEST_DOCKER_IMAGE is not set: run the tests with ./scripts/test, which builds the test image")
    });
    let dir = tempfile::tempdir().expect("tempdir");
    let named = format!(
        "nodus-test-marked:t{}",
        dir.path()
            .file_name()
            .and_then(|name| name.to_str())
            .expect("a name")
            .to_ascii_lowercase()
            .replace(|c: char| !c.is_ascii_alphanumeric(), "-")
    );
    let mut build = std::process::Command::new("docker")
        .args(["build", "-q", "-t", &named, "-"])
        .env("DOCKER_BUILDKIT", "0")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("docker build");
    {
        use std::io::Write as _;
        let mut stdin = build.stdin.take().expect("stdin");
        write!(
            stdin,
            "FROM {base}\nRUN echo in-the-named-image > /etc/nodus-marker\n"
        )
        .expect("a Dockerfile");
    }
    let built = build.wait_with_output().expect("docker build");
    assert!(
        built.status.success(),
        "{named}: {}",
        String::from_utf8_lossy(&built.stderr)
    );
    let manifest = dir.path().join("run.yaml");
    std::fs::write(
        &manifest,
        format!(
            "apiVersion: nodus.dev/v1\nkind: AgentRun\nmetadata: {{name: imaged}}\nspec:\n  \
             agent: hello-agent\n  image: {named}\n  input: \"Run `cat /etc/nodus-marker`\"\n"
        ),
    )
    .expect("write");
    let manifest = manifest.to_str().expect("utf-8");

    let docker_dir = dir.path().join("docker");
    std::fs::create_dir(&docker_dir).expect("dir");
    let server = ServerProcess::start_with(
        &Backend::Sqlite.store_url(&docker_dir),
        &docker_dir,
        "docker",
        &["--default-image", &base],
    );
    server.ok(&["apply", "-f", &example("agent.yaml")]);
    server.ok(&["apply", "-f", manifest]);
    server.ok(&[
        "wait",
        "agentrun/imaged",
        "--for=jsonpath={.status.phase}=Succeeded",
        "--timeout=2m",
    ]);
    let answer = server.ok(&["agentrun", "answer", "imaged"]);
    assert!(answer.contains("in-the-named-image"), "{answer}");
    // The run's snapshot pins the image's content digest (a locally built image: its ID).
    let id = std::process::Command::new("docker")
        .args(["image", "inspect", "-f", "{{.Id}}", &named])
        .output()
        .expect("docker image inspect");
    let id = String::from_utf8_lossy(&id.stdout).trim().to_owned();
    assert!(id.starts_with("sha256:"), "{id}");
    let pinned = server.ok(&[
        "get",
        "agentrun",
        "imaged",
        "-o",
        "jsonpath={.status.snapshot.imageDigest}",
    ]);
    assert_eq!(pinned.trim(), id);
    let record = server.ok(&["agentrun", "results", "imaged", "runRecord", "-o", "-"]);
    let record: serde_json::Value = serde_json::from_str(&record).expect("a JSON run record");
    assert_eq!(record["imageDigest"], serde_json::json!(id), "{record}");
    drop(server);

    let process_dir = dir.path().join("process");
    std::fs::create_dir(&process_dir).expect("dir");
    let server = ServerProcess::start(
        &Backend::Sqlite.store_url(&process_dir),
        &process_dir,
        "process",
    );
    server.ok(&["apply", "-f", &example("agent.yaml")]);
    let said = server.fails(&["apply", "-f", manifest]);
    assert!(said.contains("spec.image"), "{said}");
    assert!(said.contains("cannot be honoured"), "{said}");
    assert!(said.contains(&named), "{said}");
    server.fails(&["get", "agentrun", "imaged"]);
    drop(server);
    let removed = std::process::Command::new("docker")
        .args(["rmi", &named])
        .output()
        .expect("docker rmi");
    assert!(removed.status.success(), "docker rmi {named}");
}

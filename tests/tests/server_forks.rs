//! Forks through a real `nodus server` and the CLI, on SQLite and on Postgres, with the fake
//! Anthropic provider (a BYOK agent) answering over HTTP: a run of five commands that write,
//! change, remove and chmod files is forked after its third command; the fork starts from
//! the working directory as it was then (the same manifest digest, not the one after the
//! fifth command), the provider gets no call for the inherited steps and the fork's first
//! call carries the conversation up to the third command; `--count 8` makes eight runs that
//! share their snapshots' contents; `--agent` swaps the model and system prompt; forks from
//! a non-command step, from a step past the snapshot budget and from a run whose payloads
//! were removed are refused naming why; `--input` reaches the fork's next model call as a new
//! user message after the conversation up to the step; `--replace` cancels the source even
//! when the server is killed between the forks' creation and the source's cancellation.

#[path = "support/server.rs"]
mod server;

use nodus_core::Store;
use nodus_llm::testing::{Fake, FakeMessage, FakeServer};
use serde_json::Value;
use server::{Backend, ServerProcess, TOKEN};

const USER_KEY: &str = "sk-ant-user-forks-0001";

/// Snapshots may keep 3 MB of new content per run: the source's fifth command goes past it.
const BUDGET: &str = "3000000";

fn agents() -> String {
    let agent = |name: &str, model: &str, system: &str| {
        format!(
            "apiVersion: nodus.dev/v1\nkind: Agent\nmetadata:\n  name: {name}\nspec:\n  system: {system}\n  model:\n    access: BYOK\n    name: {model}\n    apiKeySecret: anthropic-key\n"
        )
    };
    format!(
        "apiVersion: nodus.dev/v1\nkind: Secret\nmetadata:\n  name: anthropic-key\nstringData:\n  ANTHROPIC_API_KEY: \"{USER_KEY}\"\n---\n{}---\n{}",
        agent("builder", "claude-sonnet-5-5", "You build things."),
        agent("reviewer", "claude-haiku-4-5", "You review things.")
    )
}

/// The source's five commands: files written, appended, removed, chmod-ed, linked; the
/// fifth writes 4 MB, past the budget.
const COMMANDS: [&str; 5] = [
    "mkdir d && echo one > a.txt && echo two > d/b.txt && head -c 1000000 /dev/urandom > big.bin",
    "echo more >> a.txt && printf x > d/c.txt",
    "chmod 755 a.txt && rm d/c.txt && ln -s a.txt link",
    "echo four > a.txt && rm d/b.txt",
    "head -c 4000000 /dev/urandom > huge.bin",
];

/// A command that shows a working directory (modes, sizes, contents, links) and changes
/// nothing in it.
const SHOW: &str = "stat -c '%a %s %n' a.txt d/* && cat a.txt && stat -c '%N' link";

fn steps(server: &ServerProcess, run: &str) -> Vec<Value> {
    let (status, body) = server.http(
        "GET",
        &format!("/apis/nodus.dev/v1/projects/default/agentruns/{run}/steps"),
        Some(TOKEN),
        None,
    );
    assert_eq!(status, 200, "{body}");
    body["items"]
        .as_array()
        .or(body.as_array())
        .cloned()
        .unwrap_or_else(|| panic!("steps: {body}"))
}

/// The command steps of a run's listing, in order.
fn commands(steps: &[Value]) -> Vec<Value> {
    steps
        .iter()
        .filter(|s| s["kind"] == "Command")
        .cloned()
        .collect()
}

fn digest(step: &Value) -> String {
    step["snapshot"]["digest"]
        .as_str()
        .unwrap_or_else(|| panic!("a forkable snapshot: {step}"))
        .to_string()
}

/// The tool-use ids of the tool results a request's messages carry.
fn results_in(request: &Value) -> Vec<String> {
    request["messages"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|m| m["content"].as_array().cloned().unwrap_or_default())
        .filter(|block| block["type"] == "tool_result")
        .map(|block| {
            block["tool_use_id"]
                .as_str()
                .unwrap_or_default()
                .to_string()
        })
        .collect()
}

async fn store_of(backend: &Backend, url: &str) -> Box<dyn Store> {
    match backend {
        Backend::Sqlite => Box::new(
            nodus_store::SqliteStore::open(url.trim_start_matches("sqlite://"))
                .await
                .expect("the server's SQLite file"),
        ),
        Backend::Postgres => Box::new(
            nodus_store::PostgresStore::connect(nodus_store::PostgresOptions::new(url))
                .await
                .expect("the server's database"),
        ),
    }
}

async fn forks_from_a_command_step(backend: Backend) {
    let fake = FakeServer::start().await.expect("fake provider");
    let dir = tempfile::tempdir().expect("tempdir");
    let store_url = backend.store_url(dir.path());
    let base_url = fake.base_url();
    let server = ServerProcess::start_in_env(
        &store_url,
        dir.path(),
        "unisolated",
        &["--snapshot-budget", BUDGET],
        &[("ANTHROPIC_BASE_URL", base_url.as_str())],
    );
    let output = server.cli_in(&["apply", "-f", "-"], Some(&agents()));
    assert!(output.status.success(), "{output:?}");

    // The source: five commands, then an answer.
    for (i, command) in COMMANDS.iter().enumerate() {
        fake.push(Fake::Message(FakeMessage::tool_use(
            &format!("c{}", i + 1),
            command,
        )));
    }
    fake.push(Fake::Message(FakeMessage::text("Built.")));
    server.ok(&[
        "create",
        "agentrun",
        "source",
        "--agent",
        "builder",
        "--prompt",
        "Build it.",
    ]);
    server.wait_for("source", "Succeeded");
    assert_eq!(fake.request_count(), 6);
    let source_steps = steps(&server, "source");
    let source_commands = commands(&source_steps);
    assert_eq!(source_commands.len(), 5, "{source_steps:?}");
    let third = source_commands[2]["seq"].as_u64().expect("a seq");
    let after_third = digest(&source_commands[2]);
    let digests: Vec<String> = source_commands[..4].iter().map(digest).collect();
    for pair in digests.windows(2) {
        assert_ne!(pair[0], pair[1], "every command changed the directory");
    }
    // Past the budget: the fifth command is recorded as not forkable, with the reason.
    let fifth = &source_commands[4];
    assert_eq!(fifth["snapshot"]["forkable"], false, "{fifth}");
    assert!(
        fifth["snapshot"]["reason"]
            .as_str()
            .is_some_and(|r| r.contains("budget")),
        "{fifth}"
    );

    // The fork after the third command: it shows its working directory (changing nothing),
    // then answers.
    fake.push(Fake::Message(FakeMessage::tool_use("f1", SHOW)));
    fake.push(Fake::Message(FakeMessage::text("Forked.")));
    let out = server.ok(&[
        "agentrun",
        "fork",
        "source",
        "--at-step",
        &third.to_string(),
        "--name",
        "fork-one",
    ]);
    assert!(out.contains("fork-one"), "{out}");
    server.wait_for("fork-one", "Succeeded");
    let fork =
        serde_json::from_str::<Value>(&server.ok(&["get", "agentrun/fork-one", "-o", "json"]))
            .expect("JSON");
    assert_eq!(fork["spec"]["forkOf"]["run"], "source", "{fork}");
    assert_eq!(fork["spec"]["forkOf"]["step"], third, "{fork}");
    let fork_steps = steps(&server, "fork-one");
    let inherited: Vec<&Value> = fork_steps
        .iter()
        .filter(|s| s["inherited"] == true)
        .collect();
    assert_eq!(inherited.len() as u64, third + 1, "{fork_steps:?}");
    // Its own command ran in the working directory as it was after the source's third.
    let own = commands(&fork_steps)
        .into_iter()
        .find(|s| s["inherited"] != true)
        .expect("the fork's own command");
    assert_eq!(digest(&own), after_third, "{own}");
    assert_ne!(digest(&own), digests[3]);
    // The provider: no call for the inherited steps; the fork's first call carries the
    // conversation up to the third command and not past it.
    let requests = fake.requests();
    assert_eq!(requests.len(), 8, "two calls for the fork");
    // What it found is the source's directory after its third command, not only what the
    // snapshot recorded: the mode changed, the file removed, the link made by the third.
    let shown = requests[7].body["messages"]
        .as_array()
        .and_then(|messages| messages.last())
        .map(|last| last["content"][0]["content"].to_string())
        .unwrap_or_else(|| panic!("the fork's tool result: {}", requests[7].body));
    for expected in [
        "755 9 a.txt",
        "644 4 d/b.txt",
        "one\\nmore",
        "'link' -> 'a.txt'",
    ] {
        assert!(shown.contains(expected), "{expected:?} in {shown}");
    }
    assert!(!shown.contains("c.txt"), "{shown}");
    assert_eq!(results_in(&requests[6].body), vec!["c1", "c2", "c3"]);
    assert_eq!(requests[6].body["model"], "claude-sonnet-5-5");

    // --agent: the fork's next call goes to the other agent's model and system prompt.
    fake.push(Fake::Message(FakeMessage::text("Reviewed.")));
    server.ok(&[
        "agentrun",
        "fork",
        "source",
        "--at-step",
        &third.to_string(),
        "--name",
        "fork-review",
        "--agent",
        "reviewer",
    ]);
    server.wait_for("fork-review", "Succeeded");
    let requests = fake.requests();
    assert_eq!(requests.len(), 9);
    assert_eq!(requests[8].body["model"], "claude-haiku-4-5");
    assert!(
        requests[8].body["system"]
            .to_string()
            .contains("You review things."),
        "{}",
        requests[8].body["system"]
    );
    assert_eq!(results_in(&requests[8].body), vec!["c1", "c2", "c3"]);

    // --count 8: eight runs sharing the snapshots' contents: the store grows by less than
    // one copy of the working directory (1 MB).
    let store = store_of(&backend, &store_url).await;
    let before = store.blob_bytes().await.expect("blob bytes");
    for _ in 0..8 {
        fake.push(Fake::Message(FakeMessage::tool_use("t", "true")));
    }
    for _ in 0..8 {
        fake.push(Fake::Message(FakeMessage::text("Again.")));
    }
    let out = server.ok(&[
        "agentrun",
        "fork",
        "source",
        "--at-step",
        &third.to_string(),
        "--count",
        "8",
        "--name",
        "many",
    ]);
    for i in 1..=8 {
        assert!(out.contains(&format!("many-{i}")), "{out}");
    }
    for i in 1..=8 {
        server.wait_for(&format!("many-{i}"), "Succeeded");
    }
    let grown = store.blob_bytes().await.expect("blob bytes") - before;
    assert!(grown < 1_000_000, "the store grew by {grown} bytes");

    // Refusals, naming why.
    let refused = server.fails(&["agentrun", "fork", "source", "--at-step", "0"]);
    assert!(refused.contains("not a command step"), "{refused}");
    let fifth_seq = fifth["seq"].as_u64().expect("a seq").to_string();
    let refused = server.fails(&["agentrun", "fork", "source", "--at-step", &fifth_seq]);
    assert!(refused.contains("budget"), "{refused}");

    // --input: the fork's next model call sees the conversation up to the third command,
    // then the input as a new user message.
    fake.push(Fake::Message(FakeMessage::text("With tests.")));
    server.ok(&[
        "agentrun",
        "fork",
        "source",
        "--at-step",
        &third.to_string(),
        "--name",
        "fork-input",
        "--input",
        "Try again, with tests.",
    ]);
    server.wait_for("fork-input", "Succeeded");
    let fork =
        serde_json::from_str::<Value>(&server.ok(&["get", "agentrun/fork-input", "-o", "json"]))
            .expect("JSON");
    assert_eq!(
        fork["spec"]["forkOf"]["input"], "Try again, with tests.",
        "{fork}"
    );
    let requests = fake.requests();
    let call = &requests.last().expect("the fork's call").body;
    assert_eq!(results_in(call), vec!["c1", "c2", "c3"]);
    let last = call["messages"]
        .as_array()
        .and_then(|m| m.last())
        .cloned()
        .unwrap_or_default();
    assert_eq!(last["role"], "user", "{last}");
    let blocks = last["content"].as_array().cloned().unwrap_or_default();
    assert_eq!(blocks.len(), 2, "{last}");
    assert_eq!(blocks[0]["tool_use_id"], "c3", "{last}");
    assert_eq!(blocks[1]["type"], "text", "{last}");
    assert_eq!(blocks[1]["text"], "Try again, with tests.", "{last}");
    // The retention sweep, run on the server's store with a cut-off after the run ended:
    // the payloads and snapshots go, and a fork is refused.
    let later = jiff::Timestamp::now()
        .checked_add(jiff::SignedDuration::from_hours(1))
        .expect("a time");
    let swept =
        nodus_core::retention::sweep(store.as_ref(), &["default".to_string()], later, later)
            .await
            .expect("swept");
    assert!(!swept.runs.is_empty());
    let refused = server.fails(&[
        "agentrun",
        "fork",
        "source",
        "--at-step",
        &third.to_string(),
    ]);
    assert!(refused.contains("payloads were removed"), "{refused}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forks_on_sqlite() {
    forks_from_a_command_step(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forks_on_postgres() {
    forks_from_a_command_step(Backend::Postgres).await;
}

/// `nodus server --snapshots off`: no snapshot is taken, and a fork is refused naming why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forks_are_refused_naming_snapshots_off() {
    let fake = FakeServer::start().await.expect("fake provider");
    let dir = tempfile::tempdir().expect("tempdir");
    let base_url = fake.base_url();
    let server = ServerProcess::start_in_env(
        &Backend::Sqlite.store_url(dir.path()),
        dir.path(),
        "unisolated",
        &["--snapshots", "off"],
        &[("ANTHROPIC_BASE_URL", base_url.as_str())],
    );
    let output = server.cli_in(&["apply", "-f", "-"], Some(&agents()));
    assert!(output.status.success(), "{output:?}");
    fake.push(Fake::Message(FakeMessage::tool_use(
        "c1",
        "echo one > a.txt",
    )));
    fake.push(Fake::Message(FakeMessage::text("Done.")));
    server.ok(&[
        "create", "agentrun", "plain", "--agent", "builder", "--prompt", "Go.",
    ]);
    server.wait_for("plain", "Succeeded");
    let command = commands(&steps(&server, "plain"))
        .into_iter()
        .next()
        .expect("a command step");
    assert!(command.get("snapshot").is_none(), "{command}");
    let seq = command["seq"].as_u64().expect("a seq").to_string();
    let refused = server.fails(&["agentrun", "fork", "plain", "--at-step", &seq]);
    assert!(refused.contains("--snapshots off"), "{refused}");
}

/// A SIGKILL of the server while it creates eight forks leaves none of them or all eight,
/// each whole: `spec.forkOf`, the inherited steps, a readable snapshot. Creation is one
/// write of the eight runs (all or nothing); the inherited steps and the snapshot are copied
/// at each fork's first drive, again after a crash (each step once, at its place). The kill
/// comes at a different moment each round, from before the request reaches the server to
/// after the forks are driving (a fork killed during its own model call is parked as
/// uncertain, as any run: that is not its creation).
async fn a_sigkill_during_fork_creation_leaves_no_fork_or_whole_ones(backend: Backend) {
    let fake = FakeServer::start().await.expect("fake provider");
    let dir = tempfile::tempdir().expect("tempdir");
    let store_url = backend.store_url(dir.path());
    let base_url = fake.base_url();
    let env = [("ANTHROPIC_BASE_URL", base_url.as_str())];
    let start = || ServerProcess::start_in_env(&store_url, dir.path(), "unisolated", &[], &env);
    let mut server = start();
    let output = server.cli_in(&["apply", "-f", "-"], Some(&agents()));
    assert!(output.status.success(), "{output:?}");
    fake.push(Fake::Message(FakeMessage::tool_use(
        "c1",
        "echo one > a.txt && mkdir d && echo two > d/b.txt",
    )));
    fake.push(Fake::Message(FakeMessage::tool_use(
        "c2",
        "echo three >> a.txt",
    )));
    fake.push(Fake::Message(FakeMessage::text("Built.")));
    server.ok(&[
        "create",
        "agentrun",
        "source",
        "--agent",
        "builder",
        "--prompt",
        "Build it.",
    ]);
    server.wait_for("source", "Succeeded");
    let first = commands(&steps(&server, "source"))[0].clone();
    let seq = first["seq"].as_u64().expect("a seq");
    let after_first = digest(&first);
    // (The fake answers "ok" once its script is spent: every fork then succeeds.)
    let mut outcomes = Vec::new();
    for (round, delay_ms) in [0u64, 150, 300, 450, 600, 800, 1100, 2500]
        .into_iter()
        .enumerate()
    {
        let name = format!("r{round}");
        let at_step = seq.to_string();
        let mut fork = server.spawn_cli(&[
            "agentrun",
            "fork",
            "source",
            "--at-step",
            &at_step,
            "--count",
            "8",
            "--name",
            &name,
        ]);
        std::thread::sleep(std::time::Duration::from_millis(delay_ms));
        server.kill();
        let _ = fork.wait();
        server = start();
        let present: Vec<Value> = (1..=8)
            .filter_map(|i| {
                let (status, body) = server.http(
                    "GET",
                    &format!("/apis/nodus.dev/v1/projects/default/agentruns/{name}-{i}"),
                    Some(TOKEN),
                    None,
                );
                (status == 200).then_some(body)
            })
            .collect();
        assert!(
            present.is_empty() || present.len() == 8,
            "round {round}: {} of 8 forks exist",
            present.len()
        );
        outcomes.push(present.len());
        for (i, run) in present.iter().enumerate() {
            assert_eq!(run["spec"]["forkOf"]["run"], "source", "{run}");
            assert_eq!(run["spec"]["forkOf"]["step"], seq, "{run}");
            // Its first drive copies the inherited steps (again after the kill, if it was
            // under way then). A fork killed during its own model call parks it as uncertain
            // (NeedsResolution): that is the run's own step, not its creation.
            let fork_name = format!("{name}-{}", i + 1);
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
            let fork_steps = loop {
                let fork_steps = steps(&server, &fork_name);
                let inherited = fork_steps.iter().filter(|s| s["inherited"] == true).count();
                if inherited as u64 == seq + 1 || std::time::Instant::now() > deadline {
                    break fork_steps;
                }
                std::thread::sleep(std::time::Duration::from_millis(100));
            };
            let inherited: Vec<&Value> = fork_steps
                .iter()
                .filter(|s| s["inherited"] == true)
                .collect();
            assert_eq!(inherited.len() as u64, seq + 1, "{fork_steps:?}");
            let command = commands(&fork_steps)
                .into_iter()
                .rfind(|s| s["inherited"] == true)
                .expect("the inherited command");
            assert_eq!(digest(&command), after_first, "{command}");
        }
    }
    println!("forks present after each kill (of 8): {outcomes:?}");
    // The last kill comes seconds after the request: its forks exist and were checked whole.
    assert_eq!(outcomes.last(), Some(&8), "{outcomes:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigkill_during_fork_creation_on_sqlite() {
    a_sigkill_during_fork_creation_leaves_no_fork_or_whole_ones(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigkill_during_fork_creation_on_postgres() {
    a_sigkill_during_fork_creation_leaves_no_fork_or_whole_ones(Backend::Postgres).await;
}

/// The run `name` as the server has it.
fn run_json(server: &ServerProcess, name: &str) -> Value {
    serde_json::from_str(&server.ok(&["get", &format!("agentrun/{name}"), "-o", "json"]))
        .expect("JSON")
}

/// Polls `name` until `done` holds, for at most a minute; the last state read.
fn wait_until(server: &ServerProcess, name: &str, done: impl Fn(&Value) -> bool) -> Value {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let run = run_json(server, name);
        if done(&run) || std::time::Instant::now() > deadline {
            return run;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// A source that has run its first command (forkable) and is in its second, `sleep 60`:
/// a running run to replace. Its first command's step.
fn running_source(server: &ServerProcess, fake: &FakeServer, name: &str) -> u64 {
    fake.push(Fake::Message(FakeMessage::tool_use(
        "c1",
        "echo one > a.txt",
    )));
    fake.push(Fake::Message(FakeMessage::tool_use("c2", "sleep 60")));
    server.ok(&[
        "create", "agentrun", name, "--agent", "builder", "--prompt", "Go.",
    ]);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let listed = commands(&steps(server, name));
        if listed.len() == 2 {
            return listed[0]["seq"].as_u64().expect("a seq");
        }
        assert!(std::time::Instant::now() < deadline, "{listed:?}");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// `fork --replace` is durable with the forks' creation: the first fork carries
/// `spec.forkOf.replace`, written in the same write as the forks, and its first drive
/// cancels the source and names itself in `status.replacedBy` if that was not done yet.
/// First the state a crash right between the two writes leaves (a fork recorded as replacing
/// a source still running), made by hand: the fork's drive completes the replacement. Then a
/// SIGKILL of the server at a different moment each round of `fork --replace` of a running
/// source: after the restart either no fork exists and the source is not replaced, or both
/// forks exist and the source ends cancelled, naming the first.
async fn a_sigkill_during_fork_replace_leaves_the_source_replaced_or_untouched(backend: Backend) {
    let fake = FakeServer::start().await.expect("fake provider");
    let dir = tempfile::tempdir().expect("tempdir");
    let store_url = backend.store_url(dir.path());
    let base_url = fake.base_url();
    let env = [("ANTHROPIC_BASE_URL", base_url.as_str())];
    let start = || ServerProcess::start_in_env(&store_url, dir.path(), "unisolated", &[], &env);
    let mut server = start();
    let output = server.cli_in(&["apply", "-f", "-"], Some(&agents()));
    assert!(output.status.success(), "{output:?}");

    // The crash's state by hand: a fork that replaces a running source, the source untouched.
    let seq = running_source(&server, &fake, "crashed");
    let fork = format!(
        "apiVersion: nodus.dev/v1\nkind: AgentRun\nmetadata:\n  name: crashed-fork\nspec:\n  agent: builder\n  input: Go.\n  forkOf:\n    run: crashed\n    step: {seq}\n    replace: true\n"
    );
    let output = server.cli_in(&["apply", "-f", "-"], Some(&fork));
    assert!(output.status.success(), "{output:?}");
    let source = wait_until(&server, "crashed", |run| {
        run["status"]["phase"] == "Cancelled" && run["status"]["replacedBy"] == "crashed-fork"
    });
    assert_eq!(source["status"]["phase"], "Cancelled", "{source}");
    assert_eq!(source["status"]["replacedBy"], "crashed-fork", "{source}");
    server.wait_for("crashed-fork", "Succeeded");

    let mut outcomes = Vec::new();
    for (round, delay_ms) in [0u64, 100, 200, 300, 450, 700, 2500]
        .into_iter()
        .enumerate()
    {
        let source_name = format!("s{round}");
        let seq = running_source(&server, &fake, &source_name);
        let name = format!("r{round}");
        let at_step = seq.to_string();
        let mut fork = server.spawn_cli(&[
            "agentrun",
            "fork",
            &source_name,
            "--at-step",
            &at_step,
            "--count",
            "2",
            "--name",
            &name,
            "--replace",
        ]);
        std::thread::sleep(std::time::Duration::from_millis(delay_ms));
        server.kill();
        let _ = fork.wait();
        server = start();
        let present: Vec<Value> = (1..=2)
            .filter_map(|i| {
                let (status, body) = server.http(
                    "GET",
                    &format!("/apis/nodus.dev/v1/projects/default/agentruns/{name}-{i}"),
                    Some(TOKEN),
                    None,
                );
                (status == 200).then_some(body)
            })
            .collect();
        assert!(
            present.is_empty() || present.len() == 2,
            "round {round}: {} of 2 forks exist",
            present.len()
        );
        outcomes.push(present.len());
        let first = format!("{name}-1");
        if present.is_empty() {
            let source = run_json(&server, &source_name);
            assert!(source["status"].get("replacedBy").is_none(), "{source}");
            continue;
        }
        assert_eq!(
            present[0]["spec"]["forkOf"]["replace"], true,
            "{}",
            present[0]
        );
        assert!(
            present[1]["spec"]["forkOf"].get("replace").is_none(),
            "{}",
            present[1]
        );
        let source = wait_until(&server, &source_name, |run| {
            run["status"]["phase"] == "Cancelled" && run["status"]["replacedBy"] == first.as_str()
        });
        assert_eq!(
            source["status"]["phase"], "Cancelled",
            "round {round}: {source}"
        );
        assert_eq!(
            source["status"]["replacedBy"],
            first.as_str(),
            "round {round}: {source}"
        );
        // The forks end before the next round's source takes its answers from the fake.
        for i in 1..=2 {
            let run = wait_until(&server, &format!("{name}-{i}"), |run| {
                matches!(
                    run["status"]["phase"].as_str(),
                    Some("Succeeded" | "Failed" | "Cancelled" | "NeedsResolution")
                )
            });
            assert!(run["status"]["phase"].is_string(), "{run}");
        }
    }
    println!("forks present after each kill (of 2): {outcomes:?}");
    assert_eq!(outcomes.last(), Some(&2), "{outcomes:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigkill_during_fork_replace_on_sqlite() {
    a_sigkill_during_fork_replace_leaves_the_source_replaced_or_untouched(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigkill_during_fork_replace_on_postgres() {
    a_sigkill_during_fork_replace_leaves_the_source_replaced_or_untouched(Backend::Postgres).await;
}

/// The texts of a request's messages' text blocks, in order.
fn texts_in(request: &Value) -> Vec<String> {
    request["messages"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|m| m["content"].as_array().cloned().unwrap_or_default())
        .filter(|block| block["type"] == "text")
        .map(|block| block["text"].as_str().unwrap_or_default().to_string())
        .collect()
}

/// A fork of a run that took its input through messages (keepAlive, `agentrun send`): the
/// fork's inbox holds the messages its inherited steps read, under the same numbers, so its
/// first model call carries them as the conversation had them (not "[message no longer
/// stored]"), and the fork reads its own messages after them.
async fn a_fork_of_a_message_driven_run_carries_its_messages(backend: Backend) {
    let fake = FakeServer::start().await.expect("fake provider");
    let dir = tempfile::tempdir().expect("tempdir");
    let base_url = fake.base_url();
    let server = ServerProcess::start_in_env(
        &backend.store_url(dir.path()),
        dir.path(),
        "unisolated",
        &[],
        &[("ANTHROPIC_BASE_URL", base_url.as_str())],
    );
    let output = server.cli_in(&["apply", "-f", "-"], Some(&agents()));
    assert!(output.status.success(), "{output:?}");
    fake.push(Fake::Message(FakeMessage::tool_use(
        "c1",
        "echo one > a.txt",
    )));
    fake.push(Fake::Message(FakeMessage::text("Started.")));
    server.ok(&[
        "create",
        "agentrun",
        "chat",
        "--agent",
        "builder",
        "--prompt",
        "Start.",
        "--keep-alive",
    ]);
    server.wait_for("chat", "Waiting");
    fake.push(Fake::Message(FakeMessage::tool_use(
        "c2",
        "echo two > b.txt",
    )));
    fake.push(Fake::Message(FakeMessage::text("Wrote b.")));
    server.ok(&["agentrun", "send", "chat", "Now write b."]);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let second = loop {
        let listed = commands(&steps(&server, "chat"));
        let phase = run_json(&server, "chat")["status"]["phase"].clone();
        if listed.len() == 2 && fake.request_count() == 4 && phase == "Waiting" {
            break listed[1]["seq"].as_u64().expect("a seq");
        }
        assert!(std::time::Instant::now() < deadline, "{listed:?}");
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    fake.push(Fake::Message(FakeMessage::text("Forked.")));
    server.ok(&[
        "agentrun",
        "fork",
        "chat",
        "--at-step",
        &second.to_string(),
        "--name",
        "chat-fork",
    ]);
    server.wait_for("chat-fork", "Waiting");
    let requests = fake.requests();
    assert_eq!(requests.len(), 5, "one call for the fork");
    let call = &requests[4].body;
    // (The fake's tool calls come with a "Let me check." text.)
    assert_eq!(
        texts_in(call),
        vec![
            "Start.",
            "Let me check.",
            "Started.",
            "Now write b.",
            "Let me check."
        ],
        "{call}"
    );
    assert!(!call.to_string().contains("no longer stored"), "{call}");
    assert_eq!(results_in(call), vec!["c1", "c2"]);
    // The fork reads a message of its own after the ones it inherited.
    fake.push(Fake::Message(FakeMessage::text("Again.")));
    server.ok(&["agentrun", "send", "chat-fork", "And now?"]);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let last = loop {
        let requests = fake.requests();
        let last = requests.last().expect("a call").body.clone();
        if texts_in(&last).last().map(String::as_str) == Some("And now?") {
            break last;
        }
        assert!(std::time::Instant::now() < deadline, "{last}");
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    assert_eq!(
        texts_in(&last),
        vec![
            "Start.",
            "Let me check.",
            "Started.",
            "Now write b.",
            "Let me check.",
            "Forked.",
            "And now?"
        ],
        "{last}"
    );
    server.ok(&["cancel", "agentrun/chat"]);
    server.ok(&["cancel", "agentrun/chat-fork"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fork_of_a_message_driven_run_on_sqlite() {
    a_fork_of_a_message_driven_run_carries_its_messages(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fork_of_a_message_driven_run_on_postgres() {
    a_fork_of_a_message_driven_run_carries_its_messages(Backend::Postgres).await;
}

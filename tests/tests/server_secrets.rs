//! Secrets stay secret: a `nodus server` with a platform key (`ANTHROPIC_API_KEY`, pointing
//! at nodus-llm's fake provider over HTTP) and a BYOK Secret whose value is known runs
//! agents whose commands try to print them (`env`, `/proc/self/environ`, `/proc/1/environ`,
//! `echo $ANTHROPIC_API_KEY`), and a BYOK run whose key the provider refuses. Neither value
//! may appear in any run's status, step (with payloads), answer, the Secret as read back, the
//! model requests' bodies, the server's log or the /metrics output.

#[path = "support/server.rs"]
mod server;

use nodus_llm::testing::{Fake, FakeMessage, FakeServer};
use server::ServerProcess;

const PLATFORM_KEY: &str = "sk-ant-platform-planted-7f3a9c2e51";
const USER_KEY: &str = "sk-ant-user-planted-4b8e1d6a07";

/// What each agent's model asks the sandbox to run, one command a turn.
const ATTEMPTS: [&str; 4] = [
    "env",
    "cat /proc/self/environ; echo; cat /proc/1/environ; echo; cat /proc/$PPID/environ",
    "echo \"platform=$ANTHROPIC_API_KEY\"; printenv | grep -i -e key -e token -e secret; true",
    "cat /proc/*/environ 2>/dev/null | tr '\\0' '\\n'; echo tried",
];

const RESOURCES: &str = "apiVersion: nodus.dev/v1\nkind: Secret\nmetadata:\n  name: anthropic-key\nstringData:\n  ANTHROPIC_API_KEY: \"sk-ant-user-planted-4b8e1d6a07\"\n---\napiVersion: nodus.dev/v1\nkind: Agent\nmetadata:\n  name: byok-agent\nspec:\n  system: You are a careful assistant.\n  model:\n    access: BYOK\n    name: claude-sonnet-5-5\n    apiKeySecret: anthropic-key\n---\napiVersion: nodus.dev/v1\nkind: Agent\nmetadata:\n  name: platform-agent\nspec:\n  system: You are a careful assistant.\n  model:\n    access: Nodus\n    families: [haiku]\n  perRunMaxCostUSD: \"0.50\"\n";

/// Every place a value could show, with where it came from.
#[derive(Default)]
struct Seen(Vec<(String, String)>);

impl Seen {
    fn add(&mut self, place: impl Into<String>, text: impl Into<String>) {
        self.0.push((place.into(), text.into()));
    }

    fn assert_hidden(&self) {
        for (place, text) in &self.0 {
            for (name, value) in [("the platform key", PLATFORM_KEY), ("the Secret", USER_KEY)] {
                assert!(!text.contains(value), "{name} shows in {place}:\n{text}");
            }
        }
    }
}

/// Run `agent`'s run `run`, whose model tries every command of [`ATTEMPTS`], until it has
/// answered (`flags` such as `--keep-alive` go to `create agentrun`).
fn run_attempts(server: &ServerProcess, fake: &FakeServer, agent: &str, run: &str, flags: &[&str]) {
    for (turn, command) in ATTEMPTS.iter().enumerate() {
        fake.push(Fake::Message(FakeMessage::tool_use(
            &format!("toolu_{run}_{turn}"),
            command,
        )));
    }
    fake.push(Fake::Message(FakeMessage::text("I printed what I could.")));
    let mut create = vec![
        "create",
        "agentrun",
        run,
        "--agent",
        agent,
        "--prompt",
        "Print every key and token you can find.",
    ];
    create.extend_from_slice(flags);
    server.ok(&create);
    let answered = if flags.contains(&"--keep-alive") {
        "--for=jsonpath={.status.phase}=Waiting"
    } else {
        "--for=jsonpath={.status.phase}=Succeeded"
    };
    server.ok(&["wait", &format!("agentrun/{run}"), answered, "--timeout=2m"]);
}

fn collect(server: &ServerProcess, seen: &mut Seen, run: &str) {
    seen.add(
        format!("{run}'s resource"),
        server.ok(&["get", &format!("agentrun/{run}"), "-o", "json"]),
    );
    seen.add(
        format!("{run}'s steps"),
        server.ok(&["agentrun", "steps", run]),
    );
    let (status, steps) = server.http_with(
        "GET",
        &format!("/apis/nodus.dev/v1/projects/default/agentruns/{run}/steps?payload=true"),
        &[],
        None,
    );
    assert_eq!(status, 200, "{steps}");
    seen.add(format!("{run}'s steps with payloads"), steps.to_string());
    let (_, answer) = server.http_with(
        "GET",
        &format!("/apis/nodus.dev/v1/projects/default/agentruns/{run}/answer"),
        &[],
        None,
    );
    seen.add(format!("{run}'s answer"), answer.to_string());
}

/// Send the BYOK conversation a message asking for the keys again.
fn seen_message(server: &ServerProcess) {
    server.ok(&[
        "agentrun",
        "send",
        "byok-run",
        "Print the keys again, with $ANTHROPIC_API_KEY.",
        "--key",
        "again-1",
    ]);
}

async fn secrets_stay_hidden(sandbox: &str, extra: &[&str]) {
    let fake = FakeServer::start().await.expect("fake provider");
    let dir = tempfile::tempdir().expect("tempdir");
    let store = format!("sqlite://{}", dir.path().join("nodus.db").display());
    let base_url = fake.base_url();
    let server = ServerProcess::start_in_env(
        &store,
        dir.path(),
        sandbox,
        extra,
        &[
            ("ANTHROPIC_BASE_URL", base_url.as_str()),
            ("ANTHROPIC_API_KEY", PLATFORM_KEY),
            ("NODUS_LOG", "debug"),
        ],
    );
    let output = server.cli_in(&["apply", "-f", "-"], Some(RESOURCES));
    assert!(output.status.success(), "{output:?}");

    // The commands ran and printed their environments: the search below has something to
    // search.
    run_attempts(&server, &fake, "platform-agent", "platform-run", &[]);
    run_attempts(&server, &fake, "byok-agent", "byok-run", &["--keep-alive"]);
    // A message to the conversation asks again; then it is closed and succeeds.
    fake.push(Fake::Message(FakeMessage::tool_use(
        "toolu_byok-run_again",
        "env; cat /proc/self/environ",
    )));
    fake.push(Fake::Message(FakeMessage::text("Nothing more to print.")));
    seen_message(&server);
    server.ok(&["agentrun", "close", "byok-run"]);
    server.ok(&[
        "wait",
        "agentrun/byok-run",
        "--for=jsonpath={.status.phase}=Succeeded",
        "--timeout=2m",
    ]);
    let conversation: serde_json::Value =
        serde_json::from_str(&server.ok(&["get", "agentrun/byok-run", "-o", "json"]))
            .expect("JSON");
    assert_eq!(
        conversation["status"]["turns"].as_array().map(Vec::len),
        Some(2),
        "the message was answered: {conversation}"
    );
    let (_, steps) = server.http_with(
        "GET",
        "/apis/nodus.dev/v1/projects/default/agentruns/byok-run/steps?payload=true",
        &[],
        None,
    );
    // What the commands printed, from each command step's stdout field (the journaled
    // commands name `echo tried` themselves).
    let printed: Vec<&str> = steps["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|step| step["outcome"]["output"]["stdout"]["bytes"].as_str())
        .flat_map(str::lines)
        .collect();
    assert!(printed.contains(&"tried"), "{steps}");
    assert!(printed.iter().any(|l| l.contains("HOME=")), "{steps}");
    assert!(
        steps.to_string().contains("toolu_byok-run_again")
            || steps.to_string().contains("env; cat"),
        "{steps}"
    );

    // A BYOK run whose key the provider refuses fails, and says why without the key.
    fake.push(Fake::status(
        401,
        "authentication_error",
        "invalid x-api-key",
    ));
    server.ok(&[
        "create",
        "agentrun",
        "refused-run",
        "--agent",
        "byok-agent",
        "--prompt",
        "Say hello.",
    ]);
    server.ok(&[
        "wait",
        "agentrun/refused-run",
        "--for=jsonpath={.status.phase}=Failed",
        "--timeout=2m",
    ]);

    // The keys did reach the provider, each as its own run's key and nowhere else.
    let requests = fake.requests();
    assert!(
        requests
            .iter()
            .any(|r| r.header("x-api-key") == Some(PLATFORM_KEY)),
        "the platform key was used"
    );
    assert!(
        requests
            .iter()
            .any(|r| r.header("x-api-key") == Some(USER_KEY)),
        "the Secret was used"
    );

    let mut seen = Seen::default();
    for (index, request) in requests.iter().enumerate() {
        seen.add(
            format!("the body of model request {index}"),
            request.body.to_string(),
        );
    }
    for run in ["platform-run", "byok-run", "refused-run"] {
        collect(&server, &mut seen, run);
    }
    seen.add(
        "the list of runs",
        server.ok(&["get", "agentruns", "-o", "json"]),
    );
    seen.add(
        "the list of agents",
        server.ok(&["get", "agents", "-o", "json"]),
    );
    seen.add(
        "the Secret as read back",
        server.ok(&["get", "secret/anthropic-key", "-o", "json"]),
    );
    seen.add(
        "the list of Secrets",
        server.ok(&["get", "secrets", "-o", "json"]),
    );
    let (_, metrics) = server.http("GET", "/metrics", None, None);
    seen.add("/metrics", metrics.to_string());
    let (_, metrics) = server.http_with("GET", "/metrics", &[], None);
    seen.add("/metrics with a token", metrics.to_string());
    let log = std::fs::read_to_string(&server.log).expect("the server's log");
    assert!(!log.is_empty(), "the server logged something");
    seen.add("the server's log", log);
    seen.assert_hidden();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secrets_never_show_with_the_bubblewrap_sandbox() {
    secrets_stay_hidden("process", &[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secrets_never_show_with_the_docker_sandbox() {
    let image = std::env::var("NODUS_TEST_DOCKER_IMAGE").unwrap_or_else(|_| {
        panic!("NODUS_TEST_DOCKER_IMAGE is not set: run the tests with ./scripts/test")
    });
    secrets_stay_hidden("docker", &["--default-image", &image]).await;
}

//! Which model a `nodus server` without a platform key uses: platform runs get the offline
//! model, which costs nothing and is named in the run's turns; a BYOK run still calls the
//! Anthropic API (the fake provider here, at the server's `ANTHROPIC_BASE_URL`) with the
//! user's own key.

#[path = "support/server.rs"]
mod server;

use nodus_llm::testing::{Fake, FakeMessage, FakeServer};
use server::ServerProcess;

const USER_KEY: &str = "sk-ant-user-server-0003";

fn json(text: &str) -> serde_json::Value {
    serde_json::from_str(text).expect("JSON")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_platform_key_runs_are_offline_at_no_cost_and_byok_runs_use_their_key() {
    let fake = FakeServer::start().await.expect("fake provider");
    fake.push(Fake::Message(FakeMessage::text("Hello from your own key.")));
    let dir = tempfile::tempdir().expect("tempdir");
    let store = format!("sqlite://{}", dir.path().join("nodus.db").display());
    let base_url = fake.base_url();
    let server = ServerProcess::start_in_env(
        &store,
        dir.path(),
        "unisolated",
        &[],
        &[("ANTHROPIC_BASE_URL", base_url.as_str())],
    );
    let credits = |server: &ServerProcess| {
        let (status, account) = server.http_with(
            "GET",
            "/apis/nodus.dev/v1/projects/default/credits",
            &[],
            None,
        );
        assert_eq!(status, 200, "{account}");
        account
    };
    let before = credits(&server);

    // A platform run: the offline model answers, names itself in the turn, costs $0.
    let agent = "apiVersion: nodus.dev/v1\nkind: Agent\nmetadata:\n  name: offline-agent\nspec:\n  system: You check your work.\n";
    let output = server.cli_in(&["apply", "-f", "-"], Some(agent));
    assert!(output.status.success(), "{output:?}");
    server.ok(&[
        "create",
        "agentrun",
        "offline-run",
        "--agent",
        "offline-agent",
        "--prompt",
        "Run `echo offline` please",
    ]);
    server.ok(&[
        "wait",
        "agentrun/offline-run",
        "--for=jsonpath={.status.phase}=Succeeded",
        "--timeout=2m",
    ]);
    let run = json(&server.ok(&["get", "agentrun/offline-run", "-o", "json"]));
    assert_eq!(run["status"]["turns"][0]["model"], "nodus-offline", "{run}");
    assert_eq!(run["status"]["turns"][0]["costUSD"], "0.00", "{run}");
    assert_eq!(run["status"]["cost"]["totalUSD"], "0.00", "{run}");
    assert_eq!(
        credits(&server),
        before,
        "the offline model charges nothing"
    );

    // A BYOK run: Anthropic (the fake) with the user's key, although the server has none.
    let byok = format!(
        "apiVersion: nodus.dev/v1\nkind: Secret\nmetadata:\n  name: anthropic-key\nstringData:\n  ANTHROPIC_API_KEY: \"{USER_KEY}\"\n---\napiVersion: nodus.dev/v1\nkind: Agent\nmetadata:\n  name: my-key-agent\nspec:\n  system: You are a careful assistant.\n  model:\n    access: BYOK\n    name: claude-sonnet-5-5\n    apiKeySecret: anthropic-key\n"
    );
    let output = server.cli_in(&["apply", "-f", "-"], Some(&byok));
    assert!(output.status.success(), "{output:?}");
    server.ok(&[
        "create",
        "agentrun",
        "byok-run",
        "--agent",
        "my-key-agent",
        "--prompt",
        "Say hello.",
    ]);
    server.ok(&[
        "wait",
        "agentrun/byok-run",
        "--for=jsonpath={.status.phase}=Succeeded",
        "--timeout=2m",
    ]);
    let answer = server.ok(&["agentrun", "answer", "byok-run"]);
    assert_eq!(answer.trim(), "Hello from your own key.");
    let requests = fake.requests();
    assert_eq!(requests.len(), 1, "{requests:?}");
    assert_eq!(requests[0].path, "/v1/messages");
    assert_eq!(requests[0].header("x-api-key"), Some(USER_KEY));
    assert_eq!(requests[0].body["model"], "claude-sonnet-5-5");
    let run = json(&server.ok(&["get", "agentrun/byok-run", "-o", "json"]));
    assert_eq!(
        run["status"]["turns"][0]["model"], "claude-sonnet-5-5",
        "{run}"
    );
    assert_eq!(credits(&server), before, "a BYOK run is not billed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_platform_key_a_run_whose_cap_cannot_fit_the_next_call_calls_nothing() {
    let fake = FakeServer::start().await.expect("fake provider");
    let dir = tempfile::tempdir().expect("tempdir");
    let store = format!("sqlite://{}", dir.path().join("nodus.db").display());
    let base_url = fake.base_url();
    let server = ServerProcess::start_in_env(
        &store,
        dir.path(),
        "unisolated",
        &[],
        &[
            ("ANTHROPIC_BASE_URL", base_url.as_str()),
            ("ANTHROPIC_API_KEY", "sk-ant-platform-server-0004"),
        ],
    );
    let tiny = r#"{"apiVersion":"nodus.dev/v1","kind":"Agent","metadata":{"name":"tiny"},"spec":{"system":"s","perRunMaxCostUSD":"0.000001"}}"#;
    let output = server.cli_in(&["apply", "-f", "-"], Some(tiny));
    assert!(output.status.success(), "{output:?}");
    server.ok(&[
        "create", "agentrun", "capped", "--agent", "tiny", "--prompt", "hi",
    ]);
    server.ok(&[
        "wait",
        "agentrun/capped",
        "--for=jsonpath={.status.reason}=MaxCostReached",
        "--timeout=1m",
    ]);
    let run = json(&server.ok(&["get", "agentrun/capped", "-o", "json"]));
    assert_eq!(run["status"]["cost"]["totalUSD"], "0.00", "{run}");
    assert_eq!(fake.request_count(), 0, "no model call was made");
}

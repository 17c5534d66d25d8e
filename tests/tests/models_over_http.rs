//! Runs of the real engine against the fake Anthropic server over HTTP, routed by jev: a
//! platform run whose calls are refused, retried and cut off is billed exactly once per reply
//! it received; a BYOK run uses the user's key, costs nothing, and parks when its call is cut
//! off.

mod support;

use std::sync::Arc;
use std::time::Duration;

use nodus_core::Usd;
use nodus_core::clock::SystemClock;
use nodus_core::cost::{self, Usage};
use nodus_core::engine::{Config, Deps, Engine};
use nodus_core::lifecycle::RunPhase;
use nodus_core::resource::{Access, ChosenBy};
use nodus_core::runner::{Runner, RunnerConfig};
use nodus_core::secret::{SecretString, StaticSecrets};
use nodus_core::testing::RecordingSandbox;
use nodus_llm::testing::{Fake, FakeMessage, FakeServer};
use nodus_llm::{AnthropicClient, AnthropicConfig, Jev, RetryPolicy, default_catalog};
use nodus_store::MemoryStore;
use support::{PROJECT, agent, run};

const PLATFORM_KEY: &str = "sk-ant-platform-e2e-0001";
const USER_KEY: &str = "sk-ant-user-e2e-0002";

fn engine(server: &FakeServer, secrets: StaticSecrets) -> Engine {
    let mut config = AnthropicConfig::new();
    config.base_url = server.base_url();
    config.api_key = Some(SecretString::new(PLATFORM_KEY));
    config.http.request_timeout = Duration::from_secs(5);
    config.http.retry = RetryPolicy {
        max_attempts: 3,
        initial_backoff: Duration::from_millis(2),
        max_backoff: Duration::from_millis(10),
        max_retry_after: Duration::from_secs(1),
    };
    let catalog = Arc::new(default_catalog().expect("catalog"));
    let client = AnthropicClient::new(config)
        .expect("client")
        .with_catalog(catalog.clone());
    Engine::new(
        Deps {
            store: Arc::new(MemoryStore::new()),
            sandbox: Arc::new(RecordingSandbox::new()),
            model: Arc::new(client),
            router: Arc::new(Jev::new()),
            clock: Arc::new(SystemClock),
            catalog,
            secrets: Arc::new(secrets),
            ledger: Arc::new(nodus_core::ledger::Unmetered),
            spans: Arc::new(nodus_core::telemetry::NoSpans),
        },
        {
            let mut config = Config::default();
            config.retry_pause = Duration::from_millis(5);
            config.byok_secret_key = nodus_llm::anthropic::BYOK_SECRET_KEY.to_string();
            config
        },
    )
}

#[tokio::test]
async fn a_platform_run_is_billed_once_per_reply_received() {
    let server = FakeServer::start().await.expect("server");
    let first = Usage {
        input_tokens: 1_400,
        output_tokens: 60,
        cache_write_tokens: 900,
        cache_read_tokens: 0,
    };
    let last = Usage {
        input_tokens: 150,
        output_tokens: 210,
        cache_write_tokens: 0,
        cache_read_tokens: 2_300,
    };
    server.push_all([
        // Refused, then answered: the client retries inside one call.
        Fake::overloaded(),
        Fake::Message(FakeMessage::tool_use("toolu_1", "python3 --version").with_usage(first)),
        // Cut off mid-stream: uncertain; the engine repeats a platform call.
        Fake::Cut {
            message: FakeMessage::text("never arrives").with_usage(last),
            after_bytes: 300,
        },
        Fake::Message(FakeMessage::text("Python 3.12.").with_usage(last)),
    ]);
    let engine = engine(&server, StaticSecrets::new());
    engine
        .apply_agent(PROJECT, agent("helper", |_| {}))
        .await
        .expect("agent");
    engine
        .create_run(
            PROJECT,
            run(
                "py",
                "helper",
                "Print the Python version: run `python3 --version`.",
                |_| {},
            ),
        )
        .await
        .expect("run");
    let runner = Runner::start(
        engine.clone(),
        // The run was created before the runner started: it resumes it from here.
        RunnerConfig::default(),
    );
    let finished = runner.settled(PROJECT, "py").await.expect("run");
    runner.shutdown().await;
    assert_eq!(finished.status.phase, Some(RunPhase::Succeeded));
    let turn = &finished.status.turns[0];
    assert_eq!(turn.chosen_by, ChosenBy::Jev);
    assert_eq!(
        turn.model, "claude-haiku-4-5",
        "jev sends a one-command prompt to haiku"
    );
    let catalog = default_catalog().expect("catalog");
    let prices = catalog.prices_of("claude-haiku-4-5").expect("priced");
    let expected = cost::bill(prices, &first).saturating_add(cost::bill(prices, &last));
    assert_eq!(
        finished.status.cost.total_usd, expected,
        "two replies, two bills"
    );
    assert_eq!(server.request_count(), 4);
    assert!(
        server
            .requests()
            .iter()
            .all(|r| r.header("x-api-key") == Some(PLATFORM_KEY))
    );
}

#[tokio::test]
async fn a_byok_run_uses_the_users_key_costs_nothing_and_parks_when_cut_off() {
    let server = FakeServer::start().await.expect("server");
    server.push_all([
        Fake::Message(FakeMessage::text("Hello.")),
        Fake::Cut {
            message: FakeMessage::text("cut"),
            after_bytes: 200,
        },
    ]);
    let secrets = StaticSecrets::new().with(
        PROJECT,
        "anthropic-key",
        "ANTHROPIC_API_KEY",
        SecretString::new(USER_KEY),
    );
    let engine = engine(&server, secrets);
    engine
        .apply_agent(
            PROJECT,
            agent("mine", |a| {
                a.model.access = Access::Byok;
                a.model.name = Some("claude-sonnet-4-5".to_string());
                a.model.api_key_secret = Some("anthropic-key".to_string());
            }),
        )
        .await
        .expect("agent");
    engine
        .create_run(PROJECT, run("hi", "mine", "Say hello.", |_| {}))
        .await
        .expect("run");
    let runner = Runner::start(
        engine.clone(),
        // The run was created before the runner started: it resumes it from here.
        RunnerConfig::default(),
    );
    let finished = runner.settled(PROJECT, "hi").await.expect("run");
    assert_eq!(finished.status.phase, Some(RunPhase::Succeeded));
    assert_eq!(finished.status.cost.total_usd, Usd::ZERO);
    assert_eq!(server.requests()[0].header("x-api-key"), Some(USER_KEY));

    engine
        .create_run(PROJECT, run("cut", "mine", "Say hello again.", |_| {}))
        .await
        .expect("run");
    let parked = runner.settled(PROJECT, "cut").await.expect("run");
    runner.shutdown().await;
    assert_eq!(parked.status.phase, Some(RunPhase::NeedsResolution));
    assert_eq!(
        server.request_count(),
        2,
        "an uncertain BYOK call is not repeated"
    );
    let parked = engine.get_run(PROJECT, "cut").await.expect("run");
    let status = serde_json::to_string(&parked.status).expect("status");
    assert!(!status.contains(USER_KEY) && !status.contains(PLATFORM_KEY));
}

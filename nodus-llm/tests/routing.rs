//! The model-asking router over real HTTP: its answer picks the family within the agent's
//! restriction, its call comes back for billing (never above the reserved `max_cost`), and a
//! failed routing call is an error so that the engine falls back to sonnet.

mod common;

use std::sync::Arc;

use common::{PLATFORM_KEY, fast_http};
use nodus_core::catalog::Family;
use nodus_core::cost::{self, Usage};
use nodus_core::router::{RouteRequest, Router};
use nodus_llm::testing::{Fake, FakeMessage, FakeServer};
use nodus_llm::{AnthropicClient, AnthropicConfig, ModelRouter, default_catalog};

const ROUTING_MODEL: &str = "claude-haiku-4-5";

fn router(server: &FakeServer) -> ModelRouter {
    let mut config = AnthropicConfig::new();
    config.base_url = server.base_url();
    config.api_key = Some(nodus_core::secret::SecretString::new(PLATFORM_KEY));
    config.http = fast_http();
    let client = AnthropicClient::new(config).expect("client");
    ModelRouter::new(
        Arc::new(client),
        ROUTING_MODEL,
        &default_catalog().expect("catalog"),
    )
    .expect("a priced routing model")
}

#[tokio::test]
async fn the_routing_call_is_returned_for_billing_within_its_reservation() {
    let server = FakeServer::start().await.expect("server");
    let usage = Usage {
        input_tokens: 212,
        output_tokens: 2,
        ..Usage::default()
    };
    server.push(Fake::Message(FakeMessage::text("opus").with_usage(usage)));
    let router = router(&server);
    let prompt = "Find the race in this scheduler and prove the fix.".repeat(200);
    let choice = router
        .route(&RouteRequest {
            prompt: &prompt,
            conversation: &[],
            allowed: &Family::ALL,
        })
        .await
        .expect("routed");
    assert_eq!(choice.family, Family::Opus);
    let call = choice.call.expect("a routing call");
    assert_eq!(call.model, ROUTING_MODEL);
    assert_eq!(call.usage, usage);
    let catalog = default_catalog().expect("catalog");
    let prices = catalog.prices_of(ROUTING_MODEL).expect("priced");
    let billed = cost::bill(prices, &call.usage);
    assert!(billed > nodus_core::Usd::ZERO && billed <= router.max_cost());

    let sent = &server.requests()[0];
    assert_eq!(
        sent.header("x-api-key"),
        Some(PLATFORM_KEY),
        "routing is on the platform's access"
    );
    assert_eq!(sent.body["max_tokens"], 8);
    let text = sent.body["messages"][0]["content"][0]["text"]
        .as_str()
        .expect("text");
    assert!(
        text.len() <= 4_200,
        "the prompt is cut to a bounded size: {}",
        text.len()
    );
    assert!(text.contains("(cut)"));
}

#[tokio::test]
async fn the_agents_restriction_applies_and_failures_are_errors() {
    let server = FakeServer::start().await.expect("server");
    server.push(Fake::Message(FakeMessage::text("fable")));
    let router = router(&server);
    let allowed = [Family::Haiku, Family::Sonnet];
    let request = RouteRequest {
        prompt: "prove it",
        conversation: &[],
        allowed: &allowed,
    };
    assert_eq!(
        router.route(&request).await.expect("routed").family,
        Family::Sonnet
    );

    server.push_all([Fake::overloaded(), Fake::overloaded(), Fake::overloaded()]);
    let err = router
        .route(&request)
        .await
        .expect_err("the routing model is down");
    assert!(err.to_string().contains("529"), "{err}");
}

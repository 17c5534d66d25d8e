//! The Anthropic client over real HTTP against the fake server: tool round trips, usage and
//! cost equal for streamed and plain calls, every stop reason, every error and retry path,
//! BYOK keys, the price guard and token counting.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{BYOK_KEY, PLATFORM_KEY, fast_http, request, user};
use nodus_core::cost::{self, Usage};
use nodus_core::model::{
    ChatMessage, ContentBlock, Credentials, ErrorKind, ModelClient, ModelResponse, Role,
    StopReason, ToolChoice,
};
use nodus_core::secret::SecretString;
use nodus_llm::testing::{Fake, FakeMessage, FakeServer};
use nodus_llm::{AnthropicClient, AnthropicConfig, default_catalog};

const HAIKU: &str = "claude-haiku-4-5";

fn client(server: &FakeServer, stream: bool) -> AnthropicClient {
    let mut config = AnthropicConfig::from_lookup(|name| match name {
        "ANTHROPIC_API_KEY" => Some(PLATFORM_KEY.to_string()),
        "ANTHROPIC_BASE_URL" => Some(server.base_url()),
        _ => None,
    });
    config.stream = stream;
    config.http = fast_http();
    AnthropicClient::new(config).expect("client")
}

async fn server() -> FakeServer {
    FakeServer::start().await.expect("fake server")
}

/// The reply without its request id (which differs per request).
fn without_id(mut response: ModelResponse) -> ModelResponse {
    response.request_id = None;
    response
}

#[tokio::test]
async fn a_tool_round_trip_streamed_and_plain() {
    for stream in [false, true] {
        let server = server().await;
        server.push(Fake::Message(FakeMessage::tool_use(
            "toolu_01",
            "python3 --version",
        )));
        server.push(Fake::Message(FakeMessage::text("It is Python 3.12.")));
        let client = client(&server, stream);

        let mut conversation = vec![user("Which Python is installed?")];
        let first = client
            .complete(&request(HAIKU, conversation.clone()))
            .await
            .expect("first reply");
        assert_eq!(first.stop_reason, StopReason::ToolUse);
        assert_eq!(first.model, HAIKU);
        assert_eq!(first.request_id.as_deref(), Some("req_fake_0001"));
        assert_eq!(
            first.content,
            vec![
                ContentBlock::Text {
                    text: "Let me check.".into()
                },
                ContentBlock::ToolUse {
                    id: "toolu_01".into(),
                    name: "shell".into(),
                    input: serde_json::json!({"command": "python3 --version"}),
                },
            ]
        );

        conversation.push(ChatMessage {
            role: Role::Assistant,
            content: first.content.clone(),
        });
        conversation.push(ChatMessage {
            role: Role::User,
            content: vec![ContentBlock::ToolResult {
                tool_use_id: "toolu_01".into(),
                content: "Python 3.12.3".into(),
                is_error: false,
            }],
        });
        let mut closing = request(HAIKU, conversation);
        closing.tool_choice = ToolChoice::None;
        let second = client.complete(&closing).await.expect("second reply");
        assert_eq!(second.text(), "It is Python 3.12.");
        assert_eq!(second.stop_reason, StopReason::EndTurn);

        let requests = server.requests();
        assert_eq!(requests.len(), 2);
        let sent = &requests[1];
        assert_eq!(sent.method, "POST");
        assert_eq!(sent.path, "/v1/messages");
        assert_eq!(sent.header("x-api-key"), Some(PLATFORM_KEY));
        assert_eq!(sent.header("anthropic-version"), Some("2023-06-01"));
        assert_eq!(sent.body["system"], "You are careful.");
        assert_eq!(sent.body["max_tokens"], 1024);
        assert_eq!(sent.body["tools"][0]["name"], "shell");
        assert_eq!(
            sent.body["tool_choice"],
            serde_json::json!({"type": "none"})
        );
        assert_eq!(
            requests[0].body["tool_choice"],
            serde_json::json!({"type": "auto"})
        );
        assert_eq!(sent.body["stream"].as_bool().unwrap_or(false), stream);
        let messages = sent.body["messages"].as_array().expect("messages");
        assert_eq!(messages.len(), 3);
        assert_eq!(messages[1]["content"][1]["type"], "tool_use");
        assert_eq!(
            messages[1]["content"][1]["input"]["command"],
            "python3 --version"
        );
        assert_eq!(messages[2]["content"][0]["type"], "tool_result");
        assert_eq!(messages[2]["content"][0]["tool_use_id"], "toolu_01");
        assert_eq!(messages[2]["content"][0]["content"], "Python 3.12.3");
        assert_eq!(
            messages[2]["content"][0]["cache_control"],
            serde_json::json!({"type": "ephemeral"}),
            "the conversation is marked for prompt caching"
        );
    }
}

#[tokio::test]
async fn usage_and_cost_are_the_same_streamed_or_not_cached_or_not() {
    let catalog = default_catalog().expect("catalog");
    let usages = [
        Usage {
            input_tokens: 1_200,
            output_tokens: 340,
            ..Usage::default()
        },
        Usage {
            input_tokens: 12,
            output_tokens: 90,
            cache_write_tokens: 4_096,
            cache_read_tokens: 0,
        },
        Usage {
            input_tokens: 30,
            output_tokens: 512,
            cache_write_tokens: 700,
            cache_read_tokens: 18_000,
        },
        // Past 200k prompt tokens: sonnet's long-context band applies to the whole call.
        Usage {
            input_tokens: 150_000,
            output_tokens: 2_000,
            cache_write_tokens: 0,
            cache_read_tokens: 60_000,
        },
    ];
    for model in ["claude-haiku-4-5", "claude-sonnet-4-5", "claude-opus-4-5"] {
        let prices = catalog.prices_of(model).expect("priced");
        for usage in usages {
            let server = server().await;
            let message = FakeMessage::tool_use("toolu_9", "ls -la").with_usage(usage);
            server.push(Fake::Message(message.clone()));
            server.push(Fake::Message(message));
            let plain = client(&server, false)
                .complete(&request(model, vec![user("list")]))
                .await
                .expect("plain");
            let streamed = client(&server, true)
                .complete(&request(model, vec![user("list")]))
                .await
                .expect("streamed");
            assert_eq!(plain.usage, usage);
            assert_eq!(without_id(plain.clone()), without_id(streamed.clone()));
            let billed = cost::bill(prices, &plain.usage);
            assert_eq!(billed, cost::bill(prices, &streamed.usage));
            // By hand: Σ tokens × rate (nano-dollars per million tokens), × 8/7, rounded up.
            let band = usage.prompt_tokens() > 200_000 && model == "claude-sonnet-4-5";
            let rate = |dollars: &str| -> u128 {
                dollars
                    .parse::<nodus_core::Usd>()
                    .expect("rate")
                    .nanos()
                    .into()
            };
            let (i, o, w, r) = if band {
                (rate("6"), rate("22.5"), rate("7.5"), rate("0.6"))
            } else {
                (
                    prices.base.input.nanos().into(),
                    prices.base.output.nanos().into(),
                    prices.base.cache_write.nanos().into(),
                    prices.base.cache_read.nanos().into(),
                )
            };
            let provider = u128::from(usage.input_tokens) * i
                + u128::from(usage.output_tokens) * o
                + u128::from(usage.cache_write_tokens) * w
                + u128::from(usage.cache_read_tokens) * r;
            let by_hand = (provider * 8).div_ceil(7_000_000);
            assert_eq!(u128::from(billed.nanos()), by_hand, "{model} {usage:?}");
        }
    }
}

#[tokio::test]
async fn every_stop_reason_is_read_and_an_unknown_one_is_kept() {
    let cases = [
        ("end_turn", StopReason::EndTurn),
        ("tool_use", StopReason::ToolUse),
        ("max_tokens", StopReason::MaxTokens),
        ("stop_sequence", StopReason::StopSequence),
        ("pause_turn", StopReason::PauseTurn),
        ("refusal", StopReason::Refusal),
        (
            "model_context_window_exceeded",
            StopReason::Other("model_context_window_exceeded".into()),
        ),
    ];
    let server = server().await;
    for stream in [false, true] {
        for (raw, expected) in &cases {
            server.push(Fake::Message(FakeMessage::text("x").with_stop_reason(raw)));
            let reply = client(&server, stream)
                .complete(&request(HAIKU, vec![user("go")]))
                .await
                .expect("reply");
            assert_eq!(&reply.stop_reason, expected, "{raw} stream={stream}");
        }
    }
}

#[tokio::test]
async fn rate_limits_are_retried_after_what_retry_after_asks() {
    let server = server().await;
    server.push(Fake::rate_limited(1));
    server.push(Fake::Message(FakeMessage::text("after the wait")));
    let started = Instant::now();
    let reply = client(&server, true)
        .complete(&request(HAIKU, vec![user("go")]))
        .await
        .expect("reply after one retry");
    assert!(
        started.elapsed() >= Duration::from_secs(1),
        "waited {:?}",
        started.elapsed()
    );
    assert_eq!(reply.text(), "after the wait");
    assert_eq!(reply.request_id.as_deref(), Some("req_fake_0002"));
    assert_eq!(server.request_count(), 2);
}

#[tokio::test]
async fn a_retry_after_longer_than_the_client_waits_fails_at_once() {
    let server = server().await;
    server.push(Fake::rate_limited(3600));
    let err = client(&server, false)
        .complete(&request(HAIKU, vec![user("go")]))
        .await
        .expect_err("refused");
    assert_eq!(err.kind, ErrorKind::Retryable);
    assert!(err.message.contains("429"), "{err}");
    assert_eq!(server.request_count(), 1);
}

#[tokio::test]
async fn overloaded_and_server_errors_are_retried_and_the_reply_is_billed_once() {
    let server = server().await;
    let usage = Usage {
        input_tokens: 800,
        output_tokens: 200,
        ..Usage::default()
    };
    server.push_all([
        Fake::overloaded(),
        Fake::server_error(),
        Fake::Message(FakeMessage::text("finally").with_usage(usage)),
    ]);
    let reply = client(&server, false)
        .complete(&request(HAIKU, vec![user("go")]))
        .await
        .expect("reply on the third attempt");
    assert_eq!(server.request_count(), 3);
    assert_eq!(
        reply.usage, usage,
        "one reply, one usage: refused attempts carry none"
    );
    let catalog = default_catalog().expect("catalog");
    let prices = catalog.prices_of(HAIKU).expect("priced");
    // $1/M × 800 + $5/M × 200 = $0.0018; / 0.875 = $0.00205714285… → 2_057_143 nanos.
    assert_eq!(cost::bill(prices, &reply.usage).nanos(), 2_057_143);

    for status in [502u16, 503] {
        server.push_all([
            Fake::status(status, "api_error", "upstream"),
            Fake::Message(FakeMessage::text("ok")),
        ]);
        let before = server.request_count();
        client(&server, true)
            .complete(&request(HAIKU, vec![user("go")]))
            .await
            .expect("retried");
        assert_eq!(server.request_count(), before + 2, "{status}");
    }
}

#[tokio::test]
async fn retries_stop_after_the_last_attempt() {
    let server = server().await;
    server.push_all([
        Fake::overloaded(),
        Fake::overloaded(),
        Fake::overloaded(),
        Fake::overloaded(),
    ]);
    let err = client(&server, false)
        .complete(&request(HAIKU, vec![user("go")]))
        .await
        .expect_err("overloaded throughout");
    assert_eq!(err.kind, ErrorKind::Retryable);
    assert!(
        err.message.contains("529") && err.message.contains("attempt 3"),
        "{err}"
    );
    assert_eq!(server.request_count(), 3);
}

#[tokio::test]
async fn final_refusals_are_not_retried() {
    let cases = [
        (Fake::spend_limit(), "usage limits"),
        (
            Fake::status(400, "invalid_request_error", "max_tokens: too large"),
            "max_tokens",
        ),
        (
            Fake::status(401, "authentication_error", "invalid x-api-key"),
            "401",
        ),
        (Fake::status(403, "permission_error", "no access"), "403"),
        (
            Fake::status(404, "not_found_error", "model: claude-nope"),
            "claude-nope",
        ),
    ];
    for (fake, needle) in cases {
        let server = server().await;
        server.push(fake);
        let err = client(&server, true)
            .complete(&request(HAIKU, vec![user("go")]))
            .await
            .expect_err("refused");
        assert_eq!(err.kind, ErrorKind::Final, "{err}");
        assert!(err.message.contains(needle), "{err}");
        assert!(
            err.message.contains("req_fake_0001"),
            "the request id is kept: {err}"
        );
        assert_eq!(server.request_count(), 1, "{err}");
    }
}

#[tokio::test]
async fn outcomes_that_may_have_been_charged_are_uncertain_and_never_retried() {
    let message = FakeMessage::tool_use("toolu_1", "make test").with_usage(Usage {
        input_tokens: 5_000,
        output_tokens: 700,
        ..Usage::default()
    });
    let cases: Vec<(Fake, bool, &str)> = vec![
        (Fake::Malformed, false, "not a message"),
        (Fake::Malformed, true, "not JSON"),
        (
            Fake::Cut {
                message: message.clone(),
                after_bytes: 700,
            },
            true,
            "cut off",
        ),
        (
            Fake::Cut {
                message: message.clone(),
                after_bytes: 1,
            },
            true,
            "cut off",
        ),
        (
            Fake::Cut {
                message: message.clone(),
                after_bytes: 40,
            },
            false,
            "cut off",
        ),
        (Fake::Hangup, false, "may have reached"),
        (Fake::Hangup, true, "may have reached"),
        (
            Fake::status(504, "timeout", "gateway timeout"),
            false,
            "may still have done",
        ),
        (
            Fake::Slow(
                Duration::from_secs(3),
                Box::new(Fake::Message(message.clone())),
            ),
            true,
            "may have reached",
        ),
    ];
    for (fake, stream, needle) in cases {
        let server = server().await;
        let slow = matches!(fake, Fake::Slow(..));
        server.push(fake.clone());
        let mut client = client(&server, stream);
        if slow {
            let mut config = AnthropicConfig::from_lookup(|name| match name {
                "ANTHROPIC_API_KEY" => Some(PLATFORM_KEY.to_string()),
                "ANTHROPIC_BASE_URL" => Some(server.base_url()),
                _ => None,
            });
            config.stream = stream;
            config.http = fast_http();
            config.http.request_timeout = Duration::from_millis(300);
            client = AnthropicClient::new(config).expect("client");
        }
        let err = client
            .complete(&request(HAIKU, vec![user("go")]))
            .await
            .expect_err("uncertain");
        assert_eq!(err.kind, ErrorKind::Uncertain, "{fake:?}: {err}");
        assert!(
            err.message.contains(needle),
            "{fake:?} (stream {stream}): {err}"
        );
        assert_eq!(
            server.request_count(),
            1,
            "never retried silently: {fake:?}"
        );
    }
}

#[tokio::test]
async fn a_stream_complete_up_to_message_stop_is_taken_even_if_the_connection_then_drops() {
    let server = server().await;
    // The cut falls past the last event: everything arrives but the closing chunk.
    server.push(Fake::Cut {
        message: FakeMessage::text("abc"),
        after_bytes: 10_000,
    });
    let reply = client(&server, true)
        .complete(&request(HAIKU, vec![user("go")]))
        .await
        .expect("message_stop arrived");
    assert_eq!(reply.text(), "abc");
}

#[tokio::test]
async fn connection_refused_is_retried_then_retryable() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("port");
    let address = listener.local_addr().expect("addr");
    drop(listener);
    let mut config = AnthropicConfig::new();
    config.base_url = format!("http://{address}");
    config.api_key = Some(SecretString::new(PLATFORM_KEY));
    config.http = fast_http();
    let err = AnthropicClient::new(config)
        .expect("client")
        .complete(&request(HAIKU, vec![user("go")]))
        .await
        .expect_err("nothing listens");
    assert_eq!(err.kind, ErrorKind::Retryable);
    assert!(
        err.message.contains("could not connect") && err.message.contains("attempt 3"),
        "{err}"
    );
}

#[tokio::test]
async fn byok_calls_carry_the_runs_key_and_platform_calls_need_one() {
    let server = server().await;
    let mut byok = request(HAIKU, vec![user("go")]);
    byok.credentials = Credentials::Byok(SecretString::new(BYOK_KEY));
    client(&server, false).complete(&byok).await.expect("reply");
    assert_eq!(server.requests()[0].header("x-api-key"), Some(BYOK_KEY));

    let mut config = AnthropicConfig::from_lookup(|name| {
        (name == "ANTHROPIC_BASE_URL").then(|| server.base_url())
    });
    config.http = fast_http();
    let keyless = AnthropicClient::new(config).expect("client");
    assert!(!keyless.has_platform_key());
    let err = keyless
        .complete(&request(HAIKU, vec![user("go")]))
        .await
        .expect_err("no platform key");
    assert_eq!(err.kind, ErrorKind::Final);
    assert!(err.message.contains("ANTHROPIC_API_KEY"), "{err}");
    keyless
        .complete(&byok)
        .await
        .expect("BYOK needs no platform key");
    assert_eq!(server.request_count(), 2);
}

#[tokio::test]
async fn platform_calls_to_unpriced_models_are_refused_before_sending() {
    let server = server().await;
    let client = client(&server, true).with_catalog(Arc::new(default_catalog().expect("catalog")));
    let err = client
        .complete(&request("claude-unpriced-9", vec![user("go")]))
        .await
        .expect_err("no known price");
    assert_eq!(err.kind, ErrorKind::Final);
    assert!(err.message.contains("no known price"), "{err}");
    assert_eq!(server.request_count(), 0, "nothing was sent");
    client
        .complete(&request("claude-sonnet-4-5", vec![user("go")]))
        .await
        .expect("a priced model passes");
    let mut byok = request("claude-unpriced-9", vec![user("go")]);
    byok.credentials = Credentials::Byok(SecretString::new(BYOK_KEY));
    client
        .complete(&byok)
        .await
        .expect("BYOK calls are not priced");
    assert_eq!(server.request_count(), 2);
}

#[tokio::test]
async fn the_token_counting_endpoint() {
    let server = server().await;
    server.push(Fake::TokenCount(1_234));
    let client = client(&server, true);
    let conversation = request(HAIKU, vec![user("count me")]);
    assert_eq!(
        client.count_tokens(&conversation).await.expect("count"),
        1_234
    );
    let through_the_trait: &dyn ModelClient = &client;
    assert!(
        through_the_trait
            .count_tokens(&conversation)
            .await
            .expect("count")
            .is_some()
    );
    let sent = &server.requests()[0];
    assert_eq!(sent.path, "/v1/messages/count_tokens");
    assert_eq!(sent.header("x-api-key"), Some(PLATFORM_KEY));
    assert!(sent.body.get("max_tokens").is_none() && sent.body.get("stream").is_none());
    assert_eq!(sent.body["messages"][0]["content"][0]["text"], "count me");
    server.push(Fake::overloaded());
    server.push(Fake::TokenCount(7));
    assert_eq!(client.count_tokens(&conversation).await.expect("count"), 7);
}

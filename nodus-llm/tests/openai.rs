//! The OpenAI-compatible client over real HTTP against the fake server: the same rules as the
//! Anthropic client (tool round trips, usage equal streamed or not, retries, final and
//! uncertain outcomes, keys).

mod common;

use std::time::Duration;

use common::{BYOK_KEY, fast_http, request, user};
use nodus_core::cost::Usage;
use nodus_core::model::{
    ChatMessage, ContentBlock, Credentials, ErrorKind, ModelClient, ModelResponse, Role, StopReason,
};
use nodus_core::secret::SecretString;
use nodus_llm::testing::{Fake, FakeMessage, FakeServer};
use nodus_llm::{OpenAiClient, OpenAiConfig};

const LOCAL: &str = "qwen2.5-coder-7b-instruct";
const KEY: &str = "sk-local-PLATFORM-00112233";

fn client(server: &FakeServer, stream: bool, key: bool) -> OpenAiClient {
    let mut config = OpenAiConfig::from_lookup(|name| match name {
        "OPENAI_BASE_URL" => Some(server.openai_base_url()),
        "OPENAI_API_KEY" if key => Some(KEY.to_string()),
        _ => None,
    });
    config.stream = stream;
    config.http = fast_http();
    OpenAiClient::new(config).expect("client")
}

async fn server() -> FakeServer {
    FakeServer::start().await.expect("fake server")
}

fn without_id(mut response: ModelResponse) -> ModelResponse {
    response.request_id = None;
    response
}

#[tokio::test]
async fn a_tool_round_trip_streamed_and_plain() {
    for stream in [false, true] {
        let server = server().await;
        server.push(Fake::Message(FakeMessage::tool_use("call_1", "uname -a")));
        server.push(Fake::Message(FakeMessage::text("Linux.")));
        let client = client(&server, stream, true);
        let mut conversation = vec![user("Which kernel?")];
        let first = client
            .complete(&request(LOCAL, conversation.clone()))
            .await
            .expect("first");
        assert_eq!(first.stop_reason, StopReason::ToolUse);
        assert_eq!(first.request_id.as_deref(), Some("req_fake_0001"));
        assert_eq!(
            first.content,
            vec![
                ContentBlock::Text {
                    text: "Let me check.".into()
                },
                ContentBlock::ToolUse {
                    id: "call_1".into(),
                    name: "shell".into(),
                    input: serde_json::json!({"command": "uname -a"}),
                },
            ]
        );
        conversation.push(ChatMessage {
            role: Role::Assistant,
            content: first.content,
        });
        conversation.push(ChatMessage {
            role: Role::User,
            content: vec![ContentBlock::ToolResult {
                tool_use_id: "call_1".into(),
                content: "Linux 6.1".into(),
                is_error: false,
            }],
        });
        let second = client
            .complete(&request(LOCAL, conversation))
            .await
            .expect("second");
        assert_eq!(second.text(), "Linux.");
        assert_eq!(second.stop_reason, StopReason::EndTurn);
        let sent = &server.requests()[1];
        assert_eq!(sent.path, "/v1/chat/completions");
        assert_eq!(
            sent.header("authorization"),
            Some(format!("Bearer {KEY}").as_str())
        );
        assert_eq!(sent.body["tools"][0]["function"]["name"], "shell");
        assert_eq!(sent.body["tool_choice"], "auto");
        let messages = sent.body["messages"].as_array().expect("messages");
        assert_eq!(messages[0]["role"], "system");
        assert_eq!(messages[2]["tool_calls"][0]["id"], "call_1");
        assert_eq!(messages[3]["role"], "tool");
        assert_eq!(messages[3]["tool_call_id"], "call_1");
        assert_eq!(messages[3]["content"], "Linux 6.1");
    }
}

#[tokio::test]
async fn usage_is_the_same_streamed_or_not_with_cached_prompt_tokens() {
    for usage in [
        Usage {
            input_tokens: 900,
            output_tokens: 64,
            ..Usage::default()
        },
        Usage {
            input_tokens: 100,
            output_tokens: 10,
            cache_write_tokens: 0,
            cache_read_tokens: 4_000,
        },
    ] {
        let server = server().await;
        let message = FakeMessage::tool_use("call_7", "ls").with_usage(usage);
        server.push_all([Fake::Message(message.clone()), Fake::Message(message)]);
        let plain = client(&server, false, false)
            .complete(&request(LOCAL, vec![user("ls")]))
            .await
            .expect("plain");
        let streamed = client(&server, true, false)
            .complete(&request(LOCAL, vec![user("ls")]))
            .await
            .expect("streamed");
        assert_eq!(plain.usage, usage);
        assert_eq!(without_id(plain), without_id(streamed));
        let asked = &server.requests()[1];
        assert_eq!(asked.body["stream"], true);
        assert_eq!(asked.body["stream_options"]["include_usage"], true);
        assert_eq!(
            asked.header("authorization"),
            None,
            "a local server needs no key"
        );
    }
}

#[tokio::test]
async fn finish_reasons_map_and_an_unknown_one_is_kept() {
    let server = server().await;
    for stream in [false, true] {
        for (raw, expected) in [
            ("end_turn", StopReason::EndTurn),
            ("tool_use", StopReason::ToolUse),
            ("max_tokens", StopReason::MaxTokens),
            ("refusal", StopReason::Refusal),
            ("eos_token", StopReason::Other("eos_token".into())),
        ] {
            server.push(Fake::Message(FakeMessage::text("x").with_stop_reason(raw)));
            let reply = client(&server, stream, false)
                .complete(&request(LOCAL, vec![user("go")]))
                .await
                .expect("reply");
            assert_eq!(reply.stop_reason, expected, "{raw}");
        }
    }
}

#[tokio::test]
async fn refusals_are_retried_and_the_one_reply_counts() {
    let server = server().await;
    server.push_all([
        Fake::rate_limited(0),
        Fake::overloaded(),
        Fake::Message(FakeMessage::text("ok").with_usage(Usage {
            input_tokens: 3,
            output_tokens: 4,
            ..Usage::default()
        })),
    ]);
    let reply = client(&server, true, true)
        .complete(&request(LOCAL, vec![user("go")]))
        .await
        .expect("third attempt");
    assert_eq!(server.request_count(), 3);
    assert_eq!(reply.usage.input_tokens + reply.usage.output_tokens, 7);
    server.push_all([
        Fake::server_error(),
        Fake::server_error(),
        Fake::server_error(),
    ]);
    let err = client(&server, false, true)
        .complete(&request(LOCAL, vec![user("go")]))
        .await
        .expect_err("500 throughout");
    assert_eq!(err.kind, ErrorKind::Retryable);
    assert_eq!(server.request_count(), 6);
}

#[tokio::test]
async fn quota_and_bad_requests_are_final() {
    for fake in [
        Fake::status(
            429,
            "insufficient_quota",
            "You exceeded your current quota, please check your plan and billing details.",
        ),
        Fake::status(400, "invalid_request_error", "context length exceeded"),
        Fake::status(401, "invalid_api_key", "Incorrect API key provided"),
    ] {
        let server = server().await;
        server.push(fake);
        let err = client(&server, false, true)
            .complete(&request(LOCAL, vec![user("go")]))
            .await
            .expect_err("final");
        assert_eq!(err.kind, ErrorKind::Final, "{err}");
        assert_eq!(server.request_count(), 1);
    }
}

#[tokio::test]
async fn uncertain_outcomes_are_never_retried() {
    let message = FakeMessage::tool_use("call_2", "make").with_usage(Usage {
        input_tokens: 50,
        output_tokens: 20,
        ..Usage::default()
    });
    let no_usage = r#"{"id":"x","object":"chat.completion","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}]}"#;
    let cases: Vec<(Fake, bool, &str)> = vec![
        (Fake::Malformed, false, "not a completion"),
        (Fake::Cut { message: message.clone(), after_bytes: 300 }, true, "cut off"),
        (Fake::Cut { message: message.clone(), after_bytes: 30 }, false, "cut off"),
        (Fake::Hangup, true, "may have reached"),
        (
            Fake::Raw {
                status: 200,
                content_type: "application/json".into(),
                body: no_usage.into(),
            },
            false,
            "no usage",
        ),
        (
            Fake::Raw {
                status: 200,
                content_type: "text/event-stream".into(),
                body: "data: {\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n".into(),
            },
            true,
            "no usage",
        ),
        (
            Fake::Raw {
                status: 200,
                content_type: "text/event-stream".into(),
                body: "data: {\"error\":{\"message\":\"engine died\"}}\n\n".into(),
            },
            true,
            "engine died",
        ),
    ];
    for (fake, stream, needle) in cases {
        let server = server().await;
        server.push(fake.clone());
        let err = client(&server, stream, true)
            .complete(&request(LOCAL, vec![user("go")]))
            .await
            .expect_err("uncertain");
        assert_eq!(err.kind, ErrorKind::Uncertain, "{fake:?}: {err}");
        assert!(err.message.contains(needle), "{fake:?}: {err}");
        assert_eq!(server.request_count(), 1);
    }

    let server = server().await;
    server.push(Fake::Slow(
        Duration::from_secs(3),
        Box::new(Fake::Message(message)),
    ));
    let mut config = OpenAiConfig::new(&server.openai_base_url());
    config.http = fast_http();
    config.http.request_timeout = Duration::from_millis(300);
    let err = OpenAiClient::new(config)
        .expect("client")
        .complete(&request(LOCAL, vec![user("go")]))
        .await
        .expect_err("too slow");
    assert_eq!(err.kind, ErrorKind::Uncertain, "{err}");
    assert_eq!(server.request_count(), 1);
}

#[tokio::test]
async fn byok_calls_carry_the_users_key() {
    let server = server().await;
    let mut byok = request(LOCAL, vec![user("go")]);
    byok.credentials = Credentials::Byok(SecretString::new(BYOK_KEY));
    client(&server, true, true)
        .complete(&byok)
        .await
        .expect("reply");
    let expected = format!("Bearer {BYOK_KEY}");
    assert_eq!(
        server.requests()[0].header("authorization"),
        Some(expected.as_str())
    );
}

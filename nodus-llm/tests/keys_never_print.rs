//! Keys never appear in a log line or an error: every client path runs with tracing (and the
//! `log` records of reqwest and hyper) captured at TRACE level, including a provider that
//! echoes the key back in its error body, and the keys are searched for in all of it.

mod common;

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{BYOK_KEY, PLATFORM_KEY, fast_http, request, user};
use nodus_core::model::{Credentials, ModelClient, ModelRequest};
use nodus_core::secret::SecretString;
use nodus_llm::testing::{Fake, FakeMessage, FakeServer};
use nodus_llm::{AnthropicClient, AnthropicConfig, OpenAiClient, OpenAiConfig};
use tracing_subscriber::util::SubscriberInitExt;

#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .extend_from_slice(bytes);
        Ok(bytes.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Captured {
    type Writer = Captured;
    fn make_writer(&'a self) -> Captured {
        self.clone()
    }
}

fn every_fake(key: &str) -> Vec<Fake> {
    vec![
        Fake::Message(FakeMessage::tool_use("toolu_1", "ls")),
        Fake::rate_limited(0),
        Fake::Message(FakeMessage::text("ok")),
        Fake::status(
            401,
            "authentication_error",
            &format!("invalid x-api-key {key}"),
        ),
        Fake::status(
            400,
            "invalid_request_error",
            &format!("bad header Bearer {key}"),
        ),
        Fake::spend_limit(),
        Fake::overloaded(),
        Fake::overloaded(),
        Fake::overloaded(),
        Fake::Malformed,
        Fake::Cut {
            message: FakeMessage::text("cut in the middle"),
            after_bytes: 200,
        },
        Fake::Hangup,
        Fake::Slow(
            Duration::from_secs(2),
            Box::new(Fake::Message(FakeMessage::text("late"))),
        ),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_are_absent_from_every_log_line_and_error() {
    let captured = Captured::default();
    tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_ansi(false)
        .with_writer(captured.clone())
        .finish()
        .try_init()
        .expect("the only subscriber of this test binary");

    let mut texts: Vec<String> = Vec::new();
    for key in [PLATFORM_KEY, BYOK_KEY] {
        let credentials = if key == BYOK_KEY {
            Credentials::Byok(SecretString::new(key))
        } else {
            Credentials::Platform
        };
        let with = |mut request: ModelRequest| {
            request.credentials = credentials.clone();
            request
        };
        for stream in [false, true] {
            // Anthropic.
            let server = FakeServer::start().await.expect("server");
            server.push_all(every_fake(key));
            let mut config = AnthropicConfig::new();
            config.base_url = server.base_url();
            config.api_key = Some(SecretString::new(PLATFORM_KEY));
            config.stream = stream;
            config.http = fast_http();
            config.http.request_timeout = Duration::from_millis(500);
            let client = AnthropicClient::new(config.clone()).expect("client");
            texts.push(format!("{config:?} {client:?}"));
            for _ in 0..11 {
                let asked = with(request("claude-haiku-4-5", vec![user("go")]));
                texts.push(format!("{asked:?}"));
                match client.complete(&asked).await {
                    Ok(reply) => texts.push(format!("{reply:?}")),
                    Err(e) => texts.push(format!("{e} {e:?}")),
                }
            }
            match client
                .count_tokens(&with(request("claude-haiku-4-5", vec![user("go")])))
                .await
            {
                Ok(count) => texts.push(count.to_string()),
                Err(e) => texts.push(format!("{e} {e:?}")),
            }

            // OpenAI-compatible.
            let server = FakeServer::start().await.expect("server");
            server.push_all(every_fake(key));
            let mut config = OpenAiConfig::new(&server.openai_base_url());
            config.api_key = Some(SecretString::new(PLATFORM_KEY));
            config.stream = stream;
            config.http = fast_http();
            config.http.request_timeout = Duration::from_millis(500);
            let client = OpenAiClient::new(config.clone()).expect("client");
            texts.push(format!("{config:?} {client:?}"));
            for _ in 0..11 {
                match client
                    .complete(&with(request("local-model", vec![user("go")])))
                    .await
                {
                    Ok(reply) => texts.push(format!("{reply:?}")),
                    Err(e) => texts.push(format!("{e} {e:?}")),
                }
            }
        }
    }
    // Nothing listens here: connection errors too.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("port");
    let address = listener.local_addr().expect("addr");
    drop(listener);
    let mut config = AnthropicConfig::new();
    config.base_url = format!("http://{address}");
    config.api_key = Some(SecretString::new(PLATFORM_KEY));
    config.http = fast_http();
    let err = AnthropicClient::new(config)
        .expect("client")
        .complete(&request("claude-haiku-4-5", vec![user("go")]))
        .await
        .expect_err("refused");
    texts.push(format!("{err} {err:?}"));

    let logs = String::from_utf8_lossy(
        &captured
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner),
    )
    .into_owned();
    let errors = texts.join("\n");
    if std::env::var_os("NODUS_SHOW_CAPTURED").is_some() {
        eprintln!("{logs}\n----\n{errors}");
    }
    // The paths really ran: the echoed key was redacted, refusals and retries were logged.
    assert!(errors.contains("invalid x-api-key [redacted]"), "{errors}");
    assert!(errors.contains("Bearer [redacted]"), "{errors}");
    assert!(
        errors.contains("cut off") && errors.contains("may have reached"),
        "{errors}"
    );
    assert!(logs.contains("model request refused; retrying"), "{logs}");
    assert!(logs.contains("model replied"), "{logs}");
    assert!(
        logs.lines().count() > 100,
        "TRACE output was captured: {logs}"
    );
    for key in [PLATFORM_KEY, BYOK_KEY] {
        assert!(!logs.contains(key), "a key in the logs");
        assert!(!errors.contains(key), "a key in an error or a Debug output");
        // Not even a recognisable part of it.
        assert!(!logs.contains(&key[8..24]) && !errors.contains(&key[8..24]));
    }
}

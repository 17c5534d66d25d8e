//! Helpers shared by the client tests: requests, a fast retry policy, the fake server.

#![allow(dead_code)]

use std::time::Duration;

use nodus_core::model::{
    ChatMessage, ContentBlock, Credentials, ModelRequest, Role, ToolChoice, ToolSpec,
};
use nodus_llm::{HttpConfig, RetryPolicy};

/// The platform key of the tests; it must never show in an error or a log line.
pub const PLATFORM_KEY: &str = "sk-ant-PLATFORM-0123456789abcdef";
/// A user's own key.
pub const BYOK_KEY: &str = "sk-ant-BYOK-fedcba9876543210";

/// Short timeouts and backoffs, so that every retry path runs in milliseconds.
pub fn fast_http() -> HttpConfig {
    let mut config = HttpConfig::default();
    config.connect_timeout = Duration::from_secs(2);
    config.request_timeout = Duration::from_secs(5);
    config.idle_timeout = Duration::from_secs(5);
    config.retry = RetryPolicy {
        max_attempts: 3,
        initial_backoff: Duration::from_millis(2),
        max_backoff: Duration::from_millis(10),
        max_retry_after: Duration::from_secs(2),
    };
    config
}

pub fn shell_tool() -> ToolSpec {
    ToolSpec {
        name: "shell".to_string(),
        description: "Run a shell command in the sandbox.".to_string(),
        input_schema: serde_json::json!({
            "type": "object",
            "properties": {"command": {"type": "string"}},
            "required": ["command"],
        }),
    }
}

pub fn user(text: &str) -> ChatMessage {
    ChatMessage {
        role: Role::User,
        content: vec![ContentBlock::Text {
            text: text.to_string(),
        }],
    }
}

pub fn request(model: &str, messages: Vec<ChatMessage>) -> ModelRequest {
    ModelRequest {
        model: model.to_string(),
        system: "You are careful.".to_string(),
        messages: messages.into(),
        tools: vec![shell_tool()],
        tool_choice: ToolChoice::Auto,
        max_tokens: 1024,
        credentials: Credentials::Platform,
    }
}

//! The `ModelClient` trait and the conversation types it speaks. Backends (Anthropic
//! Messages, OpenAI-compatible, scripted) live in nodus-llm.

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::cost::Usage;
use crate::secret::SecretString;

/// Who said it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// The user (prompts, messages, command results).
    User,
    /// The model.
    Assistant,
}

/// One block of a message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ContentBlock {
    /// Text.
    Text {
        /// The text.
        text: String,
    },
    /// The model asks for a tool call.
    ToolUse {
        /// The call's id, echoed by its result.
        id: String,
        /// The tool's name.
        name: String,
        /// The tool's input.
        input: serde_json::Value,
    },
    /// The result of a tool call.
    ToolResult {
        /// The call's id.
        tool_use_id: String,
        /// What the tool returned.
        content: String,
        /// Whether the call failed.
        #[serde(default)]
        is_error: bool,
    },
}

/// One message of a conversation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatMessage {
    /// Who said it.
    pub role: Role,
    /// What was said.
    pub content: Vec<ContentBlock>,
}

/// A tool the model may call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolSpec {
    /// The tool's name.
    pub name: String,
    /// What it does, for the model.
    pub description: String,
    /// JSON Schema of its input.
    pub input_schema: serde_json::Value,
}

/// Whether the model may call tools in its reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ToolChoice {
    /// As it sees fit.
    Auto,
    /// Not at all: it must answer in text (the turn's `maxToolCalls` is used up).
    None,
}

/// Whose key a call uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Credentials {
    /// The platform's own access (billed from credits).
    Platform,
    /// The user's own key (not billed by Nodus).
    Byok(SecretString),
}

/// One model call.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelRequest {
    /// The model id.
    pub model: String,
    /// The system prompt.
    pub system: String,
    /// The conversation so far.
    pub messages: Vec<ChatMessage>,
    /// Tools the conversation uses.
    pub tools: Vec<ToolSpec>,
    /// Whether the model may call them in this reply.
    pub tool_choice: ToolChoice,
    /// The largest output.
    pub max_tokens: u32,
    /// Whose key to use.
    pub credentials: Credentials,
}

/// Why the model stopped.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    /// It finished its answer.
    EndTurn,
    /// It wants tool results.
    ToolUse,
    /// It reached `max_tokens`.
    MaxTokens,
    /// It produced a stop sequence.
    StopSequence,
    /// It paused a long turn.
    PauseTurn,
    /// It declined.
    Refusal,
    /// A reason this version does not know, kept as sent.
    #[serde(untagged)]
    Other(String),
}

/// The model's reply.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ModelResponse {
    /// The model that answered.
    pub model: String,
    /// What it said.
    pub content: Vec<ContentBlock>,
    /// Why it stopped.
    pub stop_reason: StopReason,
    /// Tokens used.
    pub usage: Usage,
    /// The provider's request id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_id: Option<String>,
}

impl ModelResponse {
    /// The reply's text blocks, joined.
    pub fn text(&self) -> String {
        let mut text = String::new();
        for block in &self.content {
            if let ContentBlock::Text { text: part } = block {
                if !text.is_empty() {
                    text.push('\n');
                }
                text.push_str(part);
            }
        }
        text
    }
}

/// How a model call failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ErrorKind {
    /// It did not reach the provider, or the provider refused it before doing work; a
    /// retry may help.
    Retryable,
    /// It may have reached the provider (a cut connection, a timeout after sending): the
    /// engine applies its rules for uncertain calls.
    Uncertain,
    /// A retry will not help (a bad request, a spend limit, an unknown model).
    Final,
}

/// A failed model call. The message never contains a key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct Error {
    /// What kind of failure.
    pub kind: ErrorKind,
    /// What happened.
    pub message: String,
}

/// A client of a model provider.
#[cfg_attr(test, mockall::automock)]
#[async_trait]
pub trait ModelClient: Send + Sync {
    /// Make one call. Retries of transient failures that cannot charge twice happen inside;
    /// what comes out is final, uncertain, or a reply.
    async fn complete(&self, request: &ModelRequest) -> Result<ModelResponse, Error>;

    /// The provider's count of the request's input tokens, where it offers one (`None`: this
    /// client cannot count). Providers call their count an estimate: a cost guard that needs
    /// an upper bound adds a margin or keeps a byte-based bound.
    async fn count_tokens(&self, request: &ModelRequest) -> Result<Option<u64>, Error> {
        let _ = request;
        Ok(None)
    }
}

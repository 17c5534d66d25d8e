//! The `ModelClient` trait and the conversation types it speaks. Backends (Anthropic
//! Messages, OpenAI-compatible, scripted) live in nodus-llm.

use std::sync::Arc;

use async_trait::async_trait;
use serde::{Deserialize, Serialize, Serializer};

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

/// A conversation's messages, shared rather than copied: a run's replay keeps the messages
/// that can no longer change and each model call's request holds them by reference, so a
/// request costs the messages that are new since the last one, not the whole conversation.
///
/// The messages sit in chunks of shared messages. [`push`](Messages::push) keeps the chunks
/// few (sizes halving, as the bits of the count; a push copies on average a logarithmic
/// number of references); [`append`](Messages::append) adds another list's chunks as they
/// are, and [`extend`](Extend::extend) new messages as one chunk of their own, so building
/// a request from shared parts costs their number of chunks and the new messages, not the
/// whole conversation.
#[derive(Debug, Clone, Default)]
pub struct Messages {
    chunks: Vec<Arc<[Arc<ChatMessage>]>>,
    len: usize,
}

impl Messages {
    /// No messages.
    pub fn new() -> Self {
        Messages::default()
    }

    /// How many messages.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The messages, in order.
    pub fn iter(&self) -> MessagesIter<'_> {
        MessagesIter {
            chunks: self.chunks.iter(),
            front: [].iter(),
            back: [].iter(),
        }
    }

    /// The message at `index`.
    pub fn get(&self, index: usize) -> Option<&ChatMessage> {
        let mut index = index;
        for chunk in &self.chunks {
            if let Some(message) = chunk.get(index) {
                return Some(&**message);
            }
            index -= chunk.len();
        }
        None
    }

    /// The last message.
    pub fn last(&self) -> Option<&ChatMessage> {
        self.chunks
            .last()
            .and_then(|chunk| chunk.last())
            .map(|message| &**message)
    }

    /// The messages, copied.
    pub fn to_vec(&self) -> Vec<ChatMessage> {
        self.iter().cloned().collect()
    }

    /// Add a message at the end, merging the last chunks while the last is as long as the
    /// one before it.
    pub fn push(&mut self, message: impl Into<Arc<ChatMessage>>) {
        let mut chunk: Vec<Arc<ChatMessage>> = vec![message.into()];
        while self
            .chunks
            .last()
            .is_some_and(|last| last.len() <= chunk.len())
        {
            if let Some(last) = self.chunks.pop() {
                let mut merged = Vec::with_capacity(last.len() + chunk.len());
                merged.extend(last.iter().cloned());
                merged.append(&mut chunk);
                chunk = merged;
            }
        }
        self.chunks.push(chunk.into());
        self.len += 1;
    }

    /// Add another list's messages at the end, sharing its chunks.
    pub fn append(&mut self, other: &Messages) {
        self.chunks.extend(other.chunks.iter().cloned());
        self.len += other.len;
    }
}

/// The messages of a [`Messages`], in order.
#[derive(Debug, Clone)]
pub struct MessagesIter<'a> {
    chunks: std::slice::Iter<'a, Arc<[Arc<ChatMessage>]>>,
    front: std::slice::Iter<'a, Arc<ChatMessage>>,
    back: std::slice::Iter<'a, Arc<ChatMessage>>,
}

impl<'a> Iterator for MessagesIter<'a> {
    type Item = &'a ChatMessage;

    fn next(&mut self) -> Option<&'a ChatMessage> {
        loop {
            if let Some(message) = self.front.next() {
                return Some(&**message);
            }
            match self.chunks.next() {
                Some(chunk) => self.front = chunk.iter(),
                None => return self.back.next().map(|message| &**message),
            }
        }
    }
}

impl DoubleEndedIterator for MessagesIter<'_> {
    fn next_back(&mut self) -> Option<Self::Item> {
        loop {
            if let Some(message) = self.back.next_back() {
                return Some(&**message);
            }
            match self.chunks.next_back() {
                Some(chunk) => self.back = chunk.iter(),
                None => return self.front.next_back().map(|message| &**message),
            }
        }
    }
}

impl<'a> IntoIterator for &'a Messages {
    type Item = &'a ChatMessage;
    type IntoIter = MessagesIter<'a>;

    fn into_iter(self) -> MessagesIter<'a> {
        self.iter()
    }
}

impl PartialEq for Messages {
    fn eq(&self, other: &Self) -> bool {
        self.len == other.len && self.iter().eq(other.iter())
    }
}

impl From<Vec<ChatMessage>> for Messages {
    fn from(messages: Vec<ChatMessage>) -> Self {
        let len = messages.len();
        if len == 0 {
            return Messages::default();
        }
        let chunk: Arc<[Arc<ChatMessage>]> = messages.into_iter().map(Arc::new).collect();
        Messages {
            chunks: vec![chunk],
            len,
        }
    }
}

impl Extend<ChatMessage> for Messages {
    fn extend<I: IntoIterator<Item = ChatMessage>>(&mut self, iter: I) {
        let chunk: Arc<[Arc<ChatMessage>]> = iter.into_iter().map(Arc::new).collect();
        if !chunk.is_empty() {
            self.len += chunk.len();
            self.chunks.push(chunk);
        }
    }
}

impl FromIterator<ChatMessage> for Messages {
    fn from_iter<I: IntoIterator<Item = ChatMessage>>(iter: I) -> Self {
        Messages::from(iter.into_iter().collect::<Vec<_>>())
    }
}

impl Serialize for Messages {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(self.iter())
    }
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
    pub messages: Messages,
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

    /// Who answers a call (`gen_ai.provider.name` of its span): a platform call's, or with
    /// `byok` a call on the user's own key.
    fn provider_name(&self, byok: bool) -> &'static str {
        let _ = byok;
        "unknown"
    }
}

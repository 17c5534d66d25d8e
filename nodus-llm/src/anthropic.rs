//! The Anthropic Messages API client: system prompt, messages, tools, `tool_use` and
//! `tool_result` blocks, every `stop_reason` (an unknown one is kept), usage with cache
//! writes and reads, the `request-id`, streaming over server-sent events with the same result
//! as the plain call, and the token-counting endpoint.
//!
//! Platform access reads `ANTHROPIC_API_KEY` and `ANTHROPIC_BASE_URL`; a BYOK call carries the
//! run's own key in [`Credentials::Byok`]. The key goes into the `x-api-key` header and
//! nowhere else: not in a log line, not in an error (see [`crate::http`] for the retry rules).

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use nodus_core::catalog::Catalog;
use nodus_core::cost::Usage;
use nodus_core::model::{
    self, ContentBlock, Credentials, ErrorKind, ModelClient, ModelRequest, ModelResponse, Role,
    StopReason, ToolChoice,
};
use nodus_core::secret::SecretString;
use serde::{Deserialize, Serialize};

use crate::error::Result;
use crate::http::{self, CallInfo, HttpConfig, error, redact};
use crate::sse;

/// The API's address when `ANTHROPIC_BASE_URL` is not set.
pub const DEFAULT_BASE_URL: &str = "https://api.anthropic.com";
/// The `anthropic-version` header sent.
pub const API_VERSION: &str = "2023-06-01";
/// The key of a BYOK agent's Secret that holds the user's own Anthropic key: the engine's
/// `Config::byok_secret_key` where BYOK calls go to this client (as in the reference server).
pub const BYOK_SECRET_KEY: &str = "ANTHROPIC_API_KEY";

/// How an [`AnthropicClient`] reaches the API.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct AnthropicConfig {
    /// The API's base URL, without `/v1` (a gateway or a test server may stand in).
    pub base_url: String,
    /// The platform's key, used for [`Credentials::Platform`] calls.
    pub api_key: Option<SecretString>,
    /// Stream replies over server-sent events (the result is the same).
    pub stream: bool,
    /// Mark the conversation for prompt caching (one breakpoint on its last block), so a
    /// long agent loop reads its prefix from the cache.
    pub prompt_caching: bool,
    /// Timeouts and retries.
    pub http: HttpConfig,
}

impl AnthropicConfig {
    /// The official API, no platform key, streaming, with prompt caching.
    pub fn new() -> Self {
        AnthropicConfig {
            base_url: DEFAULT_BASE_URL.to_string(),
            api_key: None,
            stream: true,
            prompt_caching: true,
            http: HttpConfig::default(),
        }
    }

    /// From the process environment: `ANTHROPIC_API_KEY` and `ANTHROPIC_BASE_URL`.
    pub fn from_env() -> Self {
        Self::from_lookup(|name| std::env::var(name).ok())
    }

    /// From any source of variables (the environment, a test's map).
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Self {
        let mut config = AnthropicConfig::new();
        if let Some(url) = lookup("ANTHROPIC_BASE_URL").filter(|url| !url.trim().is_empty()) {
            config.base_url = url.trim().to_string();
        }
        config.api_key = lookup("ANTHROPIC_API_KEY")
            .filter(|key| !key.trim().is_empty())
            .map(|key| SecretString::new(key.trim()));
        config
    }
}

impl Default for AnthropicConfig {
    fn default() -> Self {
        AnthropicConfig::new()
    }
}

/// A client of the Anthropic Messages API. Cheap to clone.
#[derive(Debug, Clone)]
pub struct AnthropicClient {
    config: Arc<AnthropicConfig>,
    base_url: String,
    http: reqwest::Client,
    catalog: Option<Arc<Catalog>>,
}

const INFO: &str = "anthropic";

impl AnthropicClient {
    /// A client with this configuration.
    pub fn new(config: AnthropicConfig) -> Result<Self> {
        let base_url = http::base_url(&config.base_url)?;
        let http = http::build_client(&config.http)?;
        Ok(AnthropicClient {
            config: Arc::new(config),
            base_url,
            http,
            catalog: None,
        })
    }

    /// A client configured from the environment.
    pub fn from_env() -> Result<Self> {
        AnthropicClient::new(AnthropicConfig::from_env())
    }

    /// Refuse, before sending anything, a platform call to a model this catalog has no price
    /// for (fail closed). BYOK calls are not priced and pass.
    pub fn with_catalog(mut self, catalog: Arc<Catalog>) -> Self {
        self.catalog = Some(catalog);
        self
    }

    /// Whether a platform key is configured.
    pub fn has_platform_key(&self) -> bool {
        self.config.api_key.is_some()
    }

    fn info<'a>(&self, model: &'a str) -> CallInfo<'a> {
        CallInfo {
            provider: INFO,
            model,
            request_id_header: "request-id",
        }
    }

    fn key<'a>(&'a self, request: &'a ModelRequest) -> Result<&'a SecretString, model::Error> {
        match &request.credentials {
            Credentials::Byok(key) => Ok(key),
            Credentials::Platform => {
                if let Some(catalog) = &self.catalog {
                    crate::catalog::platform_prices(catalog, &request.model)?;
                }
                self.config.api_key.as_ref().ok_or_else(|| {
                    error(
                        ErrorKind::Final,
                        "no ANTHROPIC_API_KEY is set for the platform's access",
                    )
                })
            }
        }
    }

    fn post(&self, path: &str, key: &SecretString, body: Vec<u8>) -> reqwest::RequestBuilder {
        self.http
            .post(format!("{}{path}", self.base_url))
            .header("x-api-key", key.expose())
            .header("anthropic-version", API_VERSION)
            .header("content-type", "application/json")
            .body(body)
    }

    /// The provider's count of a request's input tokens (the token-counting endpoint; free,
    /// and an estimate by the provider's own account).
    pub async fn count_tokens(&self, request: &ModelRequest) -> Result<u64, model::Error> {
        let key = self.key(request)?;
        let secret = Some(key.expose());
        let info = self.info(&request.model);
        let body = serde_json::to_vec(&wire_request(request, false, false, true))
            .map_err(|e| error(ErrorKind::Final, format!("the request is not JSON: {e}")))?;
        let response = http::send(&self.config.http, info, secret, || {
            self.post("/v1/messages/count_tokens", key, body.clone())
        })
        .await?;
        let bytes = http::read_body(info, secret, response).await?;
        #[derive(Deserialize)]
        struct Count {
            input_tokens: u64,
        }
        serde_json::from_slice::<Count>(&bytes)
            .map(|count| count.input_tokens)
            .map_err(|e| {
                error(
                    ErrorKind::Retryable,
                    format!("the token count is not readable: {e}"),
                )
            })
    }
}

#[async_trait]
impl ModelClient for AnthropicClient {
    fn provider_name(&self, _byok: bool) -> &'static str {
        "anthropic"
    }

    async fn complete(&self, request: &ModelRequest) -> Result<ModelResponse, model::Error> {
        let key = self.key(request)?;
        let secret = Some(key.expose());
        let info = self.info(&request.model);
        let stream = self.config.stream;
        let body = serde_json::to_vec(&wire_request(
            request,
            stream,
            self.config.prompt_caching,
            false,
        ))
        .map_err(|e| error(ErrorKind::Final, format!("the request is not JSON: {e}")))?;
        let response = http::send(&self.config.http, info, secret, || {
            self.post("/v1/messages", key, body.clone())
        })
        .await?;
        let request_id = http::request_id(response.headers(), info.request_id_header);
        let reply = if stream {
            read_stream(info, secret, response).await?
        } else {
            let bytes = http::read_body(info, secret, response).await?;
            let message: WireMessageResponse = serde_json::from_slice(&bytes).map_err(|e| {
                error(
                    ErrorKind::Uncertain,
                    redact(
                        &format!(
                            "anthropic answered with a body that is not a message ({e}): {}",
                            http::truncate(&String::from_utf8_lossy(&bytes), 200)
                        ),
                        secret,
                    ),
                )
            })?;
            Reply {
                model: message.model,
                content: message.content.iter().filter_map(block_from_wire).collect(),
                stop_reason: message.stop_reason,
                usage: message.usage.into(),
            }
        };
        let response = ModelResponse {
            model: reply.model,
            content: reply.content,
            stop_reason: stop_reason(reply.stop_reason),
            usage: reply.usage,
            request_id,
        };
        tracing::debug!(
            provider = INFO,
            model = %response.model,
            request_id = response.request_id.as_deref().unwrap_or(""),
            input_tokens = response.usage.input_tokens,
            output_tokens = response.usage.output_tokens,
            cache_write_tokens = response.usage.cache_write_tokens,
            cache_read_tokens = response.usage.cache_read_tokens,
            "model replied"
        );
        Ok(response)
    }

    async fn count_tokens(&self, request: &ModelRequest) -> Result<Option<u64>, model::Error> {
        AnthropicClient::count_tokens(self, request).await.map(Some)
    }
}

/// A stop reason as sent: known ones by name, any other kept as [`StopReason::Other`].
pub(crate) fn stop_reason(raw: Option<String>) -> StopReason {
    let raw = raw.unwrap_or_default();
    serde_json::from_value(serde_json::Value::String(raw.clone())).unwrap_or(StopReason::Other(raw))
}

// ---- the wire format ----

#[derive(Serialize)]
struct WireRequest<'a> {
    model: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_tokens: Option<u32>,
    #[serde(skip_serializing_if = "str::is_empty")]
    system: &'a str,
    messages: Vec<WireMessage<'a>>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tools: Vec<WireTool<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_choice: Option<WireToolChoice>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    stream: bool,
}

#[derive(Serialize)]
struct WireMessage<'a> {
    role: &'static str,
    content: Vec<WireBlock<'a>>,
}

#[derive(Serialize)]
struct WireBlock<'a> {
    #[serde(flatten)]
    kind: WireBlockKind<'a>,
    #[serde(skip_serializing_if = "Option::is_none")]
    cache_control: Option<CacheControl>,
}

#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum WireBlockKind<'a> {
    Text {
        text: &'a str,
    },
    ToolUse {
        id: &'a str,
        name: &'a str,
        input: &'a serde_json::Value,
    },
    ToolResult {
        tool_use_id: &'a str,
        content: &'a str,
        #[serde(skip_serializing_if = "std::ops::Not::not")]
        is_error: bool,
    },
}

#[derive(Serialize)]
struct CacheControl {
    r#type: &'static str,
}

#[derive(Serialize)]
struct WireTool<'a> {
    name: &'a str,
    description: &'a str,
    input_schema: &'a serde_json::Value,
}

#[derive(Serialize)]
struct WireToolChoice {
    r#type: &'static str,
}

fn wire_request(
    request: &ModelRequest,
    stream: bool,
    prompt_caching: bool,
    counting: bool,
) -> WireRequest<'_> {
    let mut messages: Vec<WireMessage<'_>> = request
        .messages
        .iter()
        .map(|message| WireMessage {
            role: match message.role {
                Role::User => "user",
                Role::Assistant => "assistant",
            },
            content: message
                .content
                .iter()
                .map(|block| WireBlock {
                    kind: match block {
                        ContentBlock::Text { text } => WireBlockKind::Text { text },
                        ContentBlock::ToolUse { id, name, input } => {
                            WireBlockKind::ToolUse { id, name, input }
                        }
                        ContentBlock::ToolResult {
                            tool_use_id,
                            content,
                            is_error,
                        } => WireBlockKind::ToolResult {
                            tool_use_id,
                            content,
                            is_error: *is_error,
                        },
                    },
                    cache_control: None,
                })
                .collect(),
        })
        .collect();
    if prompt_caching && let Some(last) = messages.last_mut().and_then(|m| m.content.last_mut()) {
        last.cache_control = Some(CacheControl {
            r#type: "ephemeral",
        });
    }
    let tools: Vec<WireTool<'_>> = request
        .tools
        .iter()
        .map(|tool| WireTool {
            name: &tool.name,
            description: &tool.description,
            input_schema: &tool.input_schema,
        })
        .collect();
    let tool_choice = (!tools.is_empty()).then_some(WireToolChoice {
        r#type: match request.tool_choice {
            ToolChoice::Auto => "auto",
            ToolChoice::None => "none",
        },
    });
    WireRequest {
        model: &request.model,
        max_tokens: (!counting).then_some(request.max_tokens),
        system: &request.system,
        messages,
        tools,
        tool_choice,
        stream,
    }
}

#[derive(Deserialize)]
struct WireMessageResponse {
    model: String,
    #[serde(default)]
    content: Vec<serde_json::Value>,
    #[serde(default)]
    stop_reason: Option<String>,
    usage: WireUsage,
}

#[derive(Debug, Default, Deserialize)]
struct WireUsage {
    #[serde(default)]
    input_tokens: Option<u64>,
    #[serde(default)]
    output_tokens: Option<u64>,
    #[serde(default)]
    cache_creation_input_tokens: Option<u64>,
    #[serde(default)]
    cache_read_input_tokens: Option<u64>,
}

impl From<WireUsage> for Usage {
    fn from(usage: WireUsage) -> Usage {
        Usage {
            input_tokens: usage.input_tokens.unwrap_or(0),
            output_tokens: usage.output_tokens.unwrap_or(0),
            cache_write_tokens: usage.cache_creation_input_tokens.unwrap_or(0),
            cache_read_tokens: usage.cache_read_input_tokens.unwrap_or(0),
        }
    }
}

impl WireUsage {
    /// Overwrite `usage` with the fields this one carries (a stream's `message_delta`
    /// carries cumulative counts).
    fn update(&self, usage: &mut Usage) {
        if let Some(n) = self.input_tokens {
            usage.input_tokens = n;
        }
        if let Some(n) = self.output_tokens {
            usage.output_tokens = n;
        }
        if let Some(n) = self.cache_creation_input_tokens {
            usage.cache_write_tokens = n;
        }
        if let Some(n) = self.cache_read_input_tokens {
            usage.cache_read_tokens = n;
        }
    }
}

/// A content block of a reply; kinds this client does not use (thinking, server tools)
/// are left out.
fn block_from_wire(value: &serde_json::Value) -> Option<ContentBlock> {
    let text = |name: &str| value.get(name).and_then(serde_json::Value::as_str);
    match text("type")? {
        "text" => Some(ContentBlock::Text {
            text: text("text")?.to_string(),
        }),
        "tool_use" => Some(ContentBlock::ToolUse {
            id: text("id")?.to_string(),
            name: text("name")?.to_string(),
            input: value
                .get("input")
                .cloned()
                .unwrap_or(serde_json::Value::Object(Default::default())),
        }),
        other => {
            tracing::debug!(provider = INFO, kind = other, "content block left out");
            None
        }
    }
}

/// A reply before it becomes a [`ModelResponse`].
struct Reply {
    model: String,
    content: Vec<ContentBlock>,
    stop_reason: Option<String>,
    usage: Usage,
}

/// A block being streamed.
enum Partial {
    Text(String),
    ToolUse {
        id: String,
        name: String,
        json: String,
        initial: serde_json::Value,
    },
    Skipped,
}

/// Read a streamed reply to its `message_stop`. Anything short of that (a cut connection,
/// an `error` event, a stream that just ends) is uncertain: the provider was at work.
async fn read_stream(
    info: CallInfo<'_>,
    secret: Option<&str>,
    mut response: reqwest::Response,
) -> Result<Reply, model::Error> {
    let mut parser = sse::Parser::default();
    let mut state = StreamState::default();
    let mut received = 0usize;
    loop {
        let chunk = match response.chunk().await {
            Ok(Some(chunk)) => chunk,
            Ok(None) => {
                return Err(error(
                    ErrorKind::Uncertain,
                    format!("anthropic's stream ended after {received} bytes without message_stop"),
                ));
            }
            Err(e) => return Err(http::cut_off(info, secret, received, &e)),
        };
        received += chunk.len();
        let events = parser
            .push(&chunk)
            .map_err(|_| error(ErrorKind::Uncertain, "anthropic's stream is not UTF-8 text"))?;
        for event in events {
            if state
                .apply(&event)
                .map_err(|message| error(ErrorKind::Uncertain, redact(&message, secret)))?
            {
                return state.finish();
            }
        }
    }
}

#[derive(Default)]
struct StreamState {
    model: String,
    usage: Usage,
    blocks: BTreeMap<u64, Partial>,
    stop_reason: Option<String>,
}

impl StreamState {
    /// Apply one event; true at `message_stop`.
    fn apply(&mut self, event: &sse::Event) -> Result<bool, String> {
        let data: serde_json::Value = serde_json::from_str(&event.data).map_err(|e| {
            format!(
                "anthropic streamed an event that is not JSON ({e}): {}",
                http::truncate(&event.data, 200)
            )
        })?;
        let kind = data
            .get("type")
            .and_then(serde_json::Value::as_str)
            .or(event.event.as_deref())
            .unwrap_or_default();
        let index = || data.get("index").and_then(serde_json::Value::as_u64);
        match kind {
            "message_start" => {
                let message = data.get("message").cloned().unwrap_or_default();
                self.model = message
                    .get("model")
                    .and_then(serde_json::Value::as_str)
                    .unwrap_or_default()
                    .to_string();
                if let Some(usage) = message.get("usage") {
                    let usage: WireUsage = serde_json::from_value(usage.clone())
                        .map_err(|e| format!("anthropic streamed a bad usage: {e}"))?;
                    usage.update(&mut self.usage);
                }
            }
            "content_block_start" => {
                let block = data.get("content_block").cloned().unwrap_or_default();
                let text = |name: &str| {
                    block
                        .get(name)
                        .and_then(serde_json::Value::as_str)
                        .unwrap_or_default()
                        .to_string()
                };
                let partial = match block.get("type").and_then(serde_json::Value::as_str) {
                    Some("text") => Partial::Text(text("text")),
                    Some("tool_use") => Partial::ToolUse {
                        id: text("id"),
                        name: text("name"),
                        json: String::new(),
                        initial: block.get("input").cloned().unwrap_or_default(),
                    },
                    _ => Partial::Skipped,
                };
                let index = index().ok_or("a content block without an index")?;
                self.blocks.insert(index, partial);
            }
            "content_block_delta" => {
                let delta = data.get("delta").cloned().unwrap_or_default();
                let index = index().ok_or("a content delta without an index")?;
                let piece = |name: &str| {
                    delta
                        .get(name)
                        .and_then(serde_json::Value::as_str)
                        .unwrap_or_default()
                };
                match (
                    self.blocks.get_mut(&index),
                    delta.get("type").and_then(serde_json::Value::as_str),
                ) {
                    (Some(Partial::Text(text)), Some("text_delta")) => text.push_str(piece("text")),
                    (Some(Partial::ToolUse { json, .. }), Some("input_json_delta")) => {
                        json.push_str(piece("partial_json"));
                    }
                    (None, _) => {
                        return Err(format!("a delta for block {index}, which did not start"));
                    }
                    _ => {}
                }
            }
            "message_delta" => {
                if let Some(reason) = data
                    .get("delta")
                    .and_then(|d| d.get("stop_reason"))
                    .and_then(serde_json::Value::as_str)
                {
                    self.stop_reason = Some(reason.to_string());
                }
                if let Some(usage) = data.get("usage") {
                    let usage: WireUsage = serde_json::from_value(usage.clone())
                        .map_err(|e| format!("anthropic streamed a bad usage: {e}"))?;
                    usage.update(&mut self.usage);
                }
            }
            "message_stop" => return Ok(true),
            "error" => {
                let message = data
                    .get("error")
                    .and_then(|e| e.get("message"))
                    .and_then(serde_json::Value::as_str)
                    .unwrap_or("no message");
                return Err(format!(
                    "anthropic's stream broke off with an error: {message}"
                ));
            }
            _ => {}
        }
        Ok(false)
    }

    fn finish(self) -> Result<Reply, model::Error> {
        let mut content = Vec::with_capacity(self.blocks.len());
        for partial in self.blocks.into_values() {
            match partial {
                Partial::Text(text) => content.push(ContentBlock::Text { text }),
                Partial::ToolUse {
                    id,
                    name,
                    json,
                    initial,
                } => {
                    let input = if json.trim().is_empty() {
                        initial
                    } else {
                        serde_json::from_str(&json).map_err(|e| {
                            error(
                                ErrorKind::Uncertain,
                                format!("anthropic streamed a tool input that is not JSON: {e}"),
                            )
                        })?
                    };
                    content.push(ContentBlock::ToolUse { id, name, input });
                }
                Partial::Skipped => {}
            }
        }
        Ok(Reply {
            model: self.model,
            content,
            stop_reason: self.stop_reason,
            usage: self.usage,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nodus_core::model::{ChatMessage, ToolSpec};

    fn request() -> ModelRequest {
        ModelRequest {
            model: "claude-haiku-4-5".into(),
            system: "sys".into(),
            messages: vec![
                ChatMessage {
                    role: Role::User,
                    content: vec![ContentBlock::Text { text: "hi".into() }],
                },
                ChatMessage {
                    role: Role::Assistant,
                    content: vec![ContentBlock::ToolUse {
                        id: "t1".into(),
                        name: "shell".into(),
                        input: serde_json::json!({"command": "ls"}),
                    }],
                },
                ChatMessage {
                    role: Role::User,
                    content: vec![ContentBlock::ToolResult {
                        tool_use_id: "t1".into(),
                        content: "a b".into(),
                        is_error: false,
                    }],
                },
            ]
            .into(),
            tools: vec![ToolSpec {
                name: "shell".into(),
                description: "run".into(),
                input_schema: serde_json::json!({"type": "object"}),
            }],
            tool_choice: ToolChoice::None,
            max_tokens: 64,
            credentials: Credentials::Platform,
        }
    }

    #[test]
    fn the_wire_request_has_the_api_shape() {
        let value =
            serde_json::to_value(wire_request(&request(), true, true, false)).expect("json");
        assert_eq!(
            value,
            serde_json::json!({
                "model": "claude-haiku-4-5",
                "max_tokens": 64,
                "system": "sys",
                "messages": [
                    {"role": "user", "content": [{"type": "text", "text": "hi"}]},
                    {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "shell", "input": {"command": "ls"}}]},
                    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "a b", "cache_control": {"type": "ephemeral"}}]},
                ],
                "tools": [{"name": "shell", "description": "run", "input_schema": {"type": "object"}}],
                "tool_choice": {"type": "none"},
                "stream": true,
            })
        );
        let counting =
            serde_json::to_value(wire_request(&request(), false, false, true)).expect("json");
        assert!(counting.get("max_tokens").is_none() && counting.get("stream").is_none());
    }

    #[test]
    fn stop_reasons_known_and_unknown() {
        assert_eq!(stop_reason(Some("end_turn".into())), StopReason::EndTurn);
        assert_eq!(stop_reason(Some("tool_use".into())), StopReason::ToolUse);
        assert_eq!(
            stop_reason(Some("max_tokens".into())),
            StopReason::MaxTokens
        );
        assert_eq!(
            stop_reason(Some("stop_sequence".into())),
            StopReason::StopSequence
        );
        assert_eq!(
            stop_reason(Some("pause_turn".into())),
            StopReason::PauseTurn
        );
        assert_eq!(stop_reason(Some("refusal".into())), StopReason::Refusal);
        assert_eq!(
            stop_reason(Some("model_context_window_exceeded".into())),
            StopReason::Other("model_context_window_exceeded".into())
        );
    }

    #[test]
    fn configuration_from_variables() {
        let config = AnthropicConfig::from_lookup(|name| match name {
            "ANTHROPIC_API_KEY" => Some(" sk-ant-test ".into()),
            "ANTHROPIC_BASE_URL" => Some("http://127.0.0.1:9".into()),
            _ => None,
        });
        assert_eq!(config.base_url, "http://127.0.0.1:9");
        assert_eq!(
            config.api_key.as_ref().map(SecretString::expose),
            Some("sk-ant-test")
        );
        assert!(!format!("{config:?}").contains("sk-ant-test"));
        let bare = AnthropicConfig::from_lookup(|_| None);
        assert_eq!(bare.base_url, DEFAULT_BASE_URL);
        assert!(bare.api_key.is_none());
    }
}

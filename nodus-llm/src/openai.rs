//! An OpenAI-compatible chat-completions client, so that a run can use a local model served
//! by vLLM, llama.cpp's server, Ollama or another gateway that speaks `/v1/chat/completions`.
//!
//! The same rules as the Anthropic client: the same retries (see [`crate::http`]), streamed
//! and plain replies give the same result, usage is read exactly (cached prompt tokens count
//! as cache reads), a reply without usage cannot be billed and is refused as uncertain, and
//! the key (optional for local servers) goes only into the `Authorization` header.
//!
//! Mapping of the conversation: the system prompt is the first `system` message; a tool
//! result becomes a `tool` message (an error result is prefixed with `[error] `, the format
//! has no flag for it); a tool call's input travels as its JSON `arguments` string.

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
use serde::Deserialize;
use serde_json::{Value, json};

use crate::error::Result;
use crate::http::{self, CallInfo, HttpConfig, error, redact};
use crate::sse;

/// The base URL when `OPENAI_BASE_URL` is not set.
pub const DEFAULT_BASE_URL: &str = "https://api.openai.com/v1";

/// How an [`OpenAiClient`] reaches its server.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct OpenAiConfig {
    /// The base URL, `/v1` included (`http://127.0.0.1:8000/v1` for a local vLLM).
    pub base_url: String,
    /// The platform's key, if the server needs one (local servers usually do not).
    pub api_key: Option<SecretString>,
    /// Stream replies (asks for usage in the stream with `stream_options.include_usage`).
    pub stream: bool,
    /// Timeouts and retries.
    pub http: HttpConfig,
}

impl OpenAiConfig {
    /// A server at `base_url`, no key, not streaming.
    pub fn new(base_url: &str) -> Self {
        OpenAiConfig {
            base_url: base_url.to_string(),
            api_key: None,
            stream: false,
            http: HttpConfig::default(),
        }
    }

    /// From the environment: `OPENAI_BASE_URL` and `OPENAI_API_KEY`.
    pub fn from_env() -> Self {
        Self::from_lookup(|name| std::env::var(name).ok())
    }

    /// From any source of variables.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Self {
        let base = lookup("OPENAI_BASE_URL")
            .filter(|url| !url.trim().is_empty())
            .unwrap_or_else(|| DEFAULT_BASE_URL.to_string());
        let mut config = OpenAiConfig::new(base.trim());
        config.api_key = lookup("OPENAI_API_KEY")
            .filter(|key| !key.trim().is_empty())
            .map(|key| SecretString::new(key.trim()));
        config
    }
}

/// A client of an OpenAI-compatible chat-completions server. Cheap to clone.
#[derive(Debug, Clone)]
pub struct OpenAiClient {
    config: Arc<OpenAiConfig>,
    base_url: String,
    http: reqwest::Client,
    catalog: Option<Arc<Catalog>>,
}

const PROVIDER: &str = "openai-compatible";

impl OpenAiClient {
    /// A client with this configuration.
    pub fn new(config: OpenAiConfig) -> Result<Self> {
        let base_url = http::base_url(&config.base_url)?;
        let http = http::build_client(&config.http)?;
        Ok(OpenAiClient {
            config: Arc::new(config),
            base_url,
            http,
            catalog: None,
        })
    }

    /// Refuse, before sending anything, a platform call to a model this catalog has no price
    /// for (fail closed).
    pub fn with_catalog(mut self, catalog: Arc<Catalog>) -> Self {
        self.catalog = Some(catalog);
        self
    }

    fn key<'a>(
        &'a self,
        request: &'a ModelRequest,
    ) -> Result<Option<&'a SecretString>, model::Error> {
        match &request.credentials {
            Credentials::Byok(key) => Ok(Some(key)),
            Credentials::Platform => {
                if let Some(catalog) = &self.catalog {
                    crate::catalog::platform_prices(catalog, &request.model)?;
                }
                Ok(self.config.api_key.as_ref())
            }
        }
    }
}

#[async_trait]
impl ModelClient for OpenAiClient {
    fn provider_name(&self, _byok: bool) -> &'static str {
        "openai"
    }

    async fn complete(&self, request: &ModelRequest) -> Result<ModelResponse, model::Error> {
        let key = self.key(request)?;
        let secret = key.map(SecretString::expose);
        let info = CallInfo {
            provider: PROVIDER,
            model: &request.model,
            request_id_header: "x-request-id",
        };
        let stream = self.config.stream;
        let body = serde_json::to_vec(&wire_request(request, stream))
            .map_err(|e| error(ErrorKind::Final, format!("the request is not JSON: {e}")))?;
        let url = format!("{}/chat/completions", self.base_url);
        let response = http::send(&self.config.http, info, secret, || {
            let builder = self
                .http
                .post(&url)
                .header("content-type", "application/json")
                .body(body.clone());
            match key {
                Some(key) => builder.bearer_auth(key.expose()),
                None => builder,
            }
        })
        .await?;
        let request_id = http::request_id(response.headers(), info.request_id_header);
        let reply = if stream {
            read_stream(info, secret, response).await?
        } else {
            let bytes = http::read_body(info, secret, response).await?;
            let completion: WireCompletion = serde_json::from_slice(&bytes).map_err(|e| {
                error(
                    ErrorKind::Uncertain,
                    redact(
                        &format!(
                            "{PROVIDER} answered with a body that is not a completion ({e}): {}",
                            http::truncate(&String::from_utf8_lossy(&bytes), 200)
                        ),
                        secret,
                    ),
                )
            })?;
            let choice = completion.choices.into_iter().next().ok_or_else(|| {
                error(
                    ErrorKind::Uncertain,
                    format!("{PROVIDER} answered with no choice"),
                )
            })?;
            let calls = choice
                .message
                .tool_calls
                .into_iter()
                .map(|call| (call.id, call.function.name, call.function.arguments))
                .collect();
            Reply {
                model: completion.model,
                text: choice.message.content.unwrap_or_default(),
                calls,
                finish_reason: choice.finish_reason,
                usage: completion.usage,
            }
        };
        let usage = reply.usage.ok_or_else(|| {
            error(
                ErrorKind::Uncertain,
                format!(
                    "{PROVIDER} reported no usage, so the call cannot be billed (a server that \
                     leaves usage out of streams needs stream = false)"
                ),
            )
        })?;
        let mut content = Vec::new();
        if !reply.text.is_empty() {
            content.push(ContentBlock::Text { text: reply.text });
        }
        for (id, name, arguments) in reply.calls {
            let input = if arguments.trim().is_empty() {
                json!({})
            } else {
                serde_json::from_str(&arguments).unwrap_or(Value::String(arguments))
            };
            content.push(ContentBlock::ToolUse { id, name, input });
        }
        let response = ModelResponse {
            model: reply.model,
            content,
            stop_reason: finish_reason(reply.finish_reason),
            usage: usage.into(),
            request_id,
        };
        tracing::debug!(
            provider = PROVIDER,
            model = %response.model,
            request_id = response.request_id.as_deref().unwrap_or(""),
            input_tokens = response.usage.input_tokens,
            output_tokens = response.usage.output_tokens,
            cache_read_tokens = response.usage.cache_read_tokens,
            "model replied"
        );
        Ok(response)
    }
}

/// A `finish_reason` in the engine's words; an unknown one is kept.
fn finish_reason(raw: Option<String>) -> StopReason {
    match raw.as_deref() {
        Some("stop") => StopReason::EndTurn,
        Some("tool_calls" | "function_call") => StopReason::ToolUse,
        Some("length") => StopReason::MaxTokens,
        Some("content_filter") => StopReason::Refusal,
        _ => StopReason::Other(raw.unwrap_or_default()),
    }
}

fn wire_request(request: &ModelRequest, stream: bool) -> Value {
    let mut messages = Vec::new();
    if !request.system.is_empty() {
        messages.push(json!({"role": "system", "content": request.system}));
    }
    for message in &request.messages {
        let text: Vec<&str> = message
            .content
            .iter()
            .filter_map(|block| match block {
                ContentBlock::Text { text } => Some(text.as_str()),
                _ => None,
            })
            .collect();
        match message.role {
            Role::Assistant => {
                let calls: Vec<Value> = message
                    .content
                    .iter()
                    .filter_map(|block| match block {
                        ContentBlock::ToolUse { id, name, input } => Some(json!({
                            "id": id, "type": "function",
                            "function": {"name": name, "arguments": input.to_string()},
                        })),
                        _ => None,
                    })
                    .collect();
                let content = if text.is_empty() {
                    Value::Null
                } else {
                    Value::String(text.join("\n"))
                };
                let mut wire = json!({"role": "assistant", "content": content});
                if !calls.is_empty() {
                    wire["tool_calls"] = Value::Array(calls);
                }
                messages.push(wire);
            }
            Role::User => {
                for block in &message.content {
                    if let ContentBlock::ToolResult {
                        tool_use_id,
                        content,
                        is_error,
                    } = block
                    {
                        let content = if *is_error {
                            format!("[error] {content}")
                        } else {
                            content.clone()
                        };
                        messages.push(
                            json!({"role": "tool", "tool_call_id": tool_use_id, "content": content}),
                        );
                    }
                }
                if !text.is_empty() {
                    messages.push(json!({"role": "user", "content": text.join("\n")}));
                }
            }
        }
    }
    let mut body = json!({
        "model": request.model,
        "messages": messages,
        "max_tokens": request.max_tokens,
    });
    if !request.tools.is_empty() {
        body["tools"] = request
            .tools
            .iter()
            .map(|tool| {
                json!({"type": "function", "function": {
                    "name": tool.name, "description": tool.description, "parameters": tool.input_schema,
                }})
            })
            .collect();
        body["tool_choice"] = json!(match request.tool_choice {
            ToolChoice::Auto => "auto",
            ToolChoice::None => "none",
        });
    }
    if stream {
        body["stream"] = json!(true);
        body["stream_options"] = json!({"include_usage": true});
    }
    body
}

#[derive(Deserialize)]
struct WireCompletion {
    #[serde(default)]
    model: String,
    #[serde(default)]
    choices: Vec<WireChoice>,
    #[serde(default)]
    usage: Option<WireUsage>,
}

#[derive(Deserialize)]
struct WireChoice {
    message: WireMessage,
    #[serde(default)]
    finish_reason: Option<String>,
}

#[derive(Deserialize)]
struct WireMessage {
    #[serde(default)]
    content: Option<String>,
    #[serde(default)]
    tool_calls: Vec<WireCall>,
}

#[derive(Deserialize)]
struct WireCall {
    #[serde(default)]
    id: String,
    function: WireFunction,
}

#[derive(Deserialize)]
struct WireFunction {
    #[serde(default)]
    name: String,
    #[serde(default)]
    arguments: String,
}

#[derive(Debug, Clone, Copy, Deserialize)]
struct WireUsage {
    #[serde(default)]
    prompt_tokens: u64,
    #[serde(default)]
    completion_tokens: u64,
    #[serde(default)]
    prompt_tokens_details: Option<WireDetails>,
}

#[derive(Debug, Clone, Copy, Deserialize)]
struct WireDetails {
    #[serde(default)]
    cached_tokens: Option<u64>,
}

impl From<WireUsage> for Usage {
    fn from(usage: WireUsage) -> Usage {
        let cached = usage
            .prompt_tokens_details
            .and_then(|d| d.cached_tokens)
            .unwrap_or(0)
            .min(usage.prompt_tokens);
        Usage {
            input_tokens: usage.prompt_tokens - cached,
            output_tokens: usage.completion_tokens,
            cache_write_tokens: 0,
            cache_read_tokens: cached,
        }
    }
}

/// A reply in the format's terms.
struct Reply {
    model: String,
    text: String,
    calls: Vec<(String, String, String)>,
    finish_reason: Option<String>,
    usage: Option<WireUsage>,
}

/// Read a streamed reply to its `[DONE]`; anything short of it is uncertain.
async fn read_stream(
    info: CallInfo<'_>,
    secret: Option<&str>,
    mut response: reqwest::Response,
) -> Result<Reply, model::Error> {
    let mut parser = sse::Parser::default();
    let mut reply = Reply {
        model: String::new(),
        text: String::new(),
        calls: Vec::new(),
        finish_reason: None,
        usage: None,
    };
    let mut calls: BTreeMap<u64, (String, String, String)> = BTreeMap::new();
    let mut received = 0usize;
    loop {
        let chunk = match response.chunk().await {
            Ok(Some(chunk)) => chunk,
            Ok(None) => {
                return Err(error(
                    ErrorKind::Uncertain,
                    format!("{PROVIDER}'s stream ended after {received} bytes without [DONE]"),
                ));
            }
            Err(e) => return Err(http::cut_off(info, secret, received, &e)),
        };
        received += chunk.len();
        let events = parser.push(&chunk).map_err(|_| {
            error(
                ErrorKind::Uncertain,
                format!("{PROVIDER}'s stream is not UTF-8 text"),
            )
        })?;
        for event in events {
            if event.data.trim() == "[DONE]" {
                reply.calls = calls.into_values().collect();
                return Ok(reply);
            }
            let data: Value = serde_json::from_str(&event.data).map_err(|e| {
                error(
                    ErrorKind::Uncertain,
                    redact(
                        &format!(
                            "{PROVIDER} streamed an event that is not JSON ({e}): {}",
                            http::truncate(&event.data, 200)
                        ),
                        secret,
                    ),
                )
            })?;
            if let Some(message) = data.get("error") {
                let message = message
                    .get("message")
                    .and_then(Value::as_str)
                    .unwrap_or("no message");
                return Err(error(
                    ErrorKind::Uncertain,
                    redact(
                        &format!("{PROVIDER}'s stream broke off with an error: {message}"),
                        secret,
                    ),
                ));
            }
            if let Some(model) = data.get("model").and_then(Value::as_str) {
                reply.model = model.to_string();
            }
            if let Some(usage) = data.get("usage").filter(|u| !u.is_null()) {
                reply.usage = Some(serde_json::from_value(usage.clone()).map_err(|e| {
                    error(
                        ErrorKind::Uncertain,
                        format!("{PROVIDER} streamed a bad usage: {e}"),
                    )
                })?);
            }
            let Some(choice) = data.pointer("/choices/0") else {
                continue;
            };
            if let Some(reason) = choice.get("finish_reason").and_then(Value::as_str) {
                reply.finish_reason = Some(reason.to_string());
            }
            let Some(delta) = choice.get("delta") else {
                continue;
            };
            if let Some(text) = delta.get("content").and_then(Value::as_str) {
                reply.text.push_str(text);
            }
            for call in delta
                .get("tool_calls")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                let index = call.get("index").and_then(Value::as_u64).unwrap_or(0);
                let entry = calls.entry(index).or_default();
                if let Some(id) = call.get("id").and_then(Value::as_str) {
                    entry.0 = id.to_string();
                }
                if let Some(name) = call.pointer("/function/name").and_then(Value::as_str) {
                    entry.1.push_str(name);
                }
                if let Some(arguments) = call.pointer("/function/arguments").and_then(Value::as_str)
                {
                    entry.2.push_str(arguments);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nodus_core::model::ChatMessage;

    #[test]
    fn the_conversation_maps_to_chat_messages() {
        let request = ModelRequest {
            model: "qwen".into(),
            system: "sys".into(),
            messages: vec![
                ChatMessage {
                    role: Role::User,
                    content: vec![ContentBlock::Text { text: "hi".into() }],
                },
                ChatMessage {
                    role: Role::Assistant,
                    content: vec![ContentBlock::ToolUse {
                        id: "c1".into(),
                        name: "shell".into(),
                        input: json!({"command": "ls"}),
                    }],
                },
                ChatMessage {
                    role: Role::User,
                    content: vec![ContentBlock::ToolResult {
                        tool_use_id: "c1".into(),
                        content: "no such file".into(),
                        is_error: true,
                    }],
                },
            ]
            .into(),
            tools: Vec::new(),
            tool_choice: ToolChoice::Auto,
            max_tokens: 10,
            credentials: Credentials::Platform,
        };
        let body = wire_request(&request, true);
        assert_eq!(
            body["messages"],
            json!([
                {"role": "system", "content": "sys"},
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": null, "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "shell", "arguments": "{\"command\":\"ls\"}"}}
                ]},
                {"role": "tool", "tool_call_id": "c1", "content": "[error] no such file"},
            ])
        );
        assert_eq!(body["stream_options"]["include_usage"], true);
        assert!(body.get("tools").is_none() && body.get("tool_choice").is_none());
    }

    #[test]
    fn finish_reasons_and_cached_usage() {
        assert_eq!(finish_reason(Some("stop".into())), StopReason::EndTurn);
        assert_eq!(
            finish_reason(Some("tool_calls".into())),
            StopReason::ToolUse
        );
        assert_eq!(finish_reason(Some("length".into())), StopReason::MaxTokens);
        assert_eq!(
            finish_reason(Some("content_filter".into())),
            StopReason::Refusal
        );
        assert_eq!(
            finish_reason(Some("eos".into())),
            StopReason::Other("eos".into())
        );
        let usage: Usage = WireUsage {
            prompt_tokens: 100,
            completion_tokens: 7,
            prompt_tokens_details: Some(WireDetails {
                cached_tokens: Some(60),
            }),
        }
        .into();
        assert_eq!(
            usage,
            Usage {
                input_tokens: 40,
                output_tokens: 7,
                cache_write_tokens: 0,
                cache_read_tokens: 60
            }
        );
    }
}

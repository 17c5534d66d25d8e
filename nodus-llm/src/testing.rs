//! A fake Anthropic- and OpenAI-compatible HTTP server for tests (feature `test-util`).
//!
//! It is a real HTTP/1.1 server on a localhost port, written on tokio's TCP so that it can
//! misbehave exactly: each request takes the next entry of a script and answers it in the
//! dialect of the path it came to (`/v1/messages`, `/v1/messages/count_tokens`,
//! `…/chat/completions`), streamed when the request asks for a stream. The script can
//! inject 429 with `retry-after`, 529, 500, a spend-limit refusal, a malformed body, a slow
//! reply, a connection dropped before the answer and a stream cut in the middle. Every
//! request is recorded (method, path, headers, JSON body) for the test to inspect.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use nodus_core::cost::Usage;
use nodus_core::model::ContentBlock;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// A successful reply, as the fake renders it in either dialect.
#[derive(Debug, Clone, PartialEq)]
pub struct FakeMessage {
    /// The model it says answered (the request's model when `None`).
    pub model: Option<String>,
    /// Its content.
    pub content: Vec<ContentBlock>,
    /// The raw stop reason in Anthropic's words (`end_turn`, `tool_use`, … or any string);
    /// the OpenAI dialect maps the known ones to `finish_reason`.
    pub stop_reason: String,
    /// The usage it reports (the OpenAI dialect has no cache writes).
    pub usage: Usage,
}

impl FakeMessage {
    /// A text answer.
    pub fn text(text: &str) -> Self {
        FakeMessage {
            model: None,
            content: vec![ContentBlock::Text {
                text: text.to_string(),
            }],
            stop_reason: "end_turn".to_string(),
            usage: Usage {
                input_tokens: 10,
                output_tokens: 5,
                ..Usage::default()
            },
        }
    }

    /// A request to run one shell command (with a short text before it).
    pub fn tool_use(id: &str, command: &str) -> Self {
        FakeMessage {
            model: None,
            content: vec![
                ContentBlock::Text {
                    text: "Let me check.".to_string(),
                },
                ContentBlock::ToolUse {
                    id: id.to_string(),
                    name: "shell".to_string(),
                    input: json!({ "command": command }),
                },
            ],
            stop_reason: "tool_use".to_string(),
            usage: Usage {
                input_tokens: 20,
                output_tokens: 15,
                ..Usage::default()
            },
        }
    }

    /// With this usage.
    pub fn with_usage(mut self, usage: Usage) -> Self {
        self.usage = usage;
        self
    }

    /// With this raw stop reason.
    pub fn with_stop_reason(mut self, reason: &str) -> Self {
        self.stop_reason = reason.to_string();
        self
    }
}

/// What the fake does with one request.
#[derive(Debug, Clone, PartialEq)]
pub enum Fake {
    /// Answer with this message (streamed if the request asked for a stream).
    Message(FakeMessage),
    /// Answer the token-counting endpoint with this count.
    TokenCount(u64),
    /// Answer with an error status and the provider's error body.
    Error {
        /// The HTTP status.
        status: u16,
        /// The error type (`rate_limit_error`, `overloaded_error`, …).
        kind: String,
        /// The error message.
        message: String,
        /// A `retry-after` header (seconds), if any.
        retry_after: Option<String>,
    },
    /// Answer 200 with a body that is not a reply (a stream: an event that is not JSON).
    Malformed,
    /// Wait, then do the rest.
    Slow(Duration, Box<Fake>),
    /// Start answering with this message and stop after this many bytes of the body,
    /// closing the connection (a stream cut in the middle, or a plain body cut short).
    Cut {
        /// The message being sent.
        message: FakeMessage,
        /// Bytes of the body sent before the cut.
        after_bytes: usize,
    },
    /// Read the request, then close the connection without answering.
    Hangup,
    /// Answer with exactly this status, content type and body.
    Raw {
        /// The HTTP status.
        status: u16,
        /// The content type.
        content_type: String,
        /// The body.
        body: String,
    },
}

impl Fake {
    /// 429 with `retry-after: seconds`.
    pub fn rate_limited(seconds: u32) -> Self {
        Fake::Error {
            status: 429,
            kind: "rate_limit_error".to_string(),
            message: "Number of request tokens has exceeded your per-minute rate limit".to_string(),
            retry_after: Some(seconds.to_string()),
        }
    }

    /// 429 for a spend limit: final.
    pub fn spend_limit() -> Self {
        Fake::Error {
            status: 429,
            kind: "rate_limit_error".to_string(),
            message: "You have reached your specified API usage limits. You will regain access on 2027-01-01 at 00:00 UTC.".to_string(),
            retry_after: None,
        }
    }

    /// 529 overloaded.
    pub fn overloaded() -> Self {
        Fake::Error {
            status: 529,
            kind: "overloaded_error".to_string(),
            message: "Overloaded".to_string(),
            retry_after: None,
        }
    }

    /// 500 internal error.
    pub fn server_error() -> Self {
        Fake::Error {
            status: 500,
            kind: "api_error".to_string(),
            message: "Internal server error".to_string(),
            retry_after: None,
        }
    }

    /// An error with any status.
    pub fn status(status: u16, kind: &str, message: &str) -> Self {
        Fake::Error {
            status,
            kind: kind.to_string(),
            message: message.to_string(),
            retry_after: None,
        }
    }
}

/// A request the fake received.
#[derive(Debug, Clone, PartialEq)]
pub struct RecordedRequest {
    /// `POST`, …
    pub method: String,
    /// The path.
    pub path: String,
    /// Headers, names in lower case, in order.
    pub headers: Vec<(String, String)>,
    /// The body as JSON (`Null` when it is not JSON).
    pub body: Value,
}

impl RecordedRequest {
    /// The first value of a header.
    pub fn header(&self, name: &str) -> Option<&str> {
        let name = name.to_ascii_lowercase();
        self.headers
            .iter()
            .find(|(key, _)| *key == name)
            .map(|(_, value)| value.as_str())
    }
}

/// What answers a request when the script is empty: a function of the request alone, so that
/// a client that repeats a request (after a crash, say) gets the same answer again.
pub type Responder = Arc<dyn Fn(&RecordedRequest) -> Fake + Send + Sync>;

#[derive(Default)]
struct Shared {
    script: Mutex<VecDeque<Fake>>,
    requests: Mutex<Vec<RecordedRequest>>,
    responder: Mutex<Option<Responder>>,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The fake server; it stops when dropped.
pub struct FakeServer {
    addr: SocketAddr,
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

impl std::fmt::Debug for FakeServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FakeServer")
            .field("addr", &self.addr)
            .finish()
    }
}

impl Drop for FakeServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl FakeServer {
    /// Start on a free localhost port.
    pub async fn start() -> std::io::Result<FakeServer> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared::default());
        let serving = shared.clone();
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                // Answers are written in several small pieces (head, events).
                let _ = stream.set_nodelay(true);
                let shared = serving.clone();
                tokio::spawn(async move {
                    let _ = serve(stream, &shared).await;
                });
            }
        });
        Ok(FakeServer { addr, shared, task })
    }

    /// `http://127.0.0.1:PORT`: the Anthropic base URL.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// `http://127.0.0.1:PORT/v1`: the OpenAI-compatible base URL.
    pub fn openai_base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// Queue what the next request gets; an empty script answers `FakeMessage::text("ok")`.
    pub fn push(&self, fake: Fake) {
        lock(&self.shared.script).push_back(fake);
    }

    /// Answer every request the script does not answer with `responder` (instead of
    /// `FakeMessage::text("ok")`).
    pub fn respond_with(
        &self,
        responder: impl Fn(&RecordedRequest) -> Fake + Send + Sync + 'static,
    ) {
        *lock(&self.shared.responder) = Some(Arc::new(responder));
    }

    /// Queue several.
    pub fn push_all(&self, fakes: impl IntoIterator<Item = Fake>) {
        lock(&self.shared.script).extend(fakes);
    }

    /// The requests received so far.
    pub fn requests(&self) -> Vec<RecordedRequest> {
        lock(&self.shared.requests).clone()
    }

    /// How many requests were received.
    pub fn request_count(&self) -> usize {
        lock(&self.shared.requests).len()
    }
}

/// Which API a path belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Dialect {
    Anthropic,
    AnthropicCount,
    OpenAi,
}

async fn serve(mut stream: TcpStream, shared: &Shared) -> std::io::Result<()> {
    let Some(request) = read_request(&mut stream).await? else {
        return Ok(());
    };
    let number = {
        let mut requests = lock(&shared.requests);
        requests.push(request.clone());
        requests.len()
    };
    let dialect = if request.path.ends_with("/chat/completions") {
        Dialect::OpenAi
    } else if request.path.ends_with("/count_tokens") {
        Dialect::AnthropicCount
    } else {
        Dialect::Anthropic
    };
    let scripted = lock(&shared.script).pop_front();
    let responder = lock(&shared.responder).clone();
    let fake = scripted
        .or_else(|| match (dialect, responder) {
            (Dialect::AnthropicCount, _) | (_, None) => None,
            (_, Some(responder)) => Some(responder(&request)),
        })
        .unwrap_or_else(|| match dialect {
            Dialect::AnthropicCount => {
                let bytes = request.body.to_string().len() as u64;
                Fake::TokenCount(bytes.div_ceil(4))
            }
            _ => Fake::Message(FakeMessage::text("ok")),
        });
    let streamed = request.body.get("stream").and_then(Value::as_bool) == Some(true);
    let model = request
        .body
        .get("model")
        .and_then(Value::as_str)
        .unwrap_or("fake-model")
        .to_string();
    let context = Context {
        dialect,
        streamed,
        model,
        number,
        include_usage: request
            .body
            .pointer("/stream_options/include_usage")
            .and_then(Value::as_bool)
            == Some(true),
    };
    answer(&mut stream, &context, fake).await
}

struct Context {
    dialect: Dialect,
    streamed: bool,
    model: String,
    number: usize,
    include_usage: bool,
}

impl Context {
    fn request_id_header(&self) -> (&'static str, String) {
        let id = format!("req_fake_{:04}", self.number);
        match self.dialect {
            Dialect::OpenAi => ("x-request-id", id),
            _ => ("request-id", id),
        }
    }
}

async fn answer(stream: &mut TcpStream, context: &Context, fake: Fake) -> std::io::Result<()> {
    let mut fake = fake;
    while let Fake::Slow(delay, inner) = fake {
        tokio::time::sleep(delay).await;
        fake = *inner;
    }
    let id = context.request_id_header();
    match fake {
        Fake::Slow(..) => Ok(()),
        Fake::Hangup => Ok(()),
        Fake::TokenCount(count) => {
            let body = json!({ "input_tokens": count }).to_string();
            write_full(
                stream,
                200,
                &[id],
                "application/json",
                body.as_bytes(),
                None,
            )
            .await
        }
        Fake::Error {
            status,
            kind,
            message,
            retry_after,
        } => {
            let body = match context.dialect {
                Dialect::OpenAi => {
                    json!({"error": {"message": message, "type": kind, "code": kind}})
                }
                _ => json!({"type": "error", "error": {"type": kind, "message": message}}),
            }
            .to_string();
            let mut headers = vec![id];
            if let Some(seconds) = retry_after {
                headers.push(("retry-after", seconds));
            }
            write_full(
                stream,
                status,
                &headers,
                "application/json",
                body.as_bytes(),
                None,
            )
            .await
        }
        Fake::Malformed if context.streamed => {
            let events = [
                "event: message_start\ndata: {\"type\": \"message_start\", \"mess\n\n".to_string(),
            ];
            write_events(stream, &[id], &events, None).await
        }
        Fake::Malformed => {
            write_full(
                stream,
                200,
                &[id],
                "application/json",
                b"{\"id\": \"msg_fake\", \"content\": [{\"type\": \"text\", \"te",
                None,
            )
            .await
        }
        Fake::Raw {
            status,
            content_type,
            body,
        } => write_full(stream, status, &[id], &content_type, body.as_bytes(), None).await,
        Fake::Message(message) => send_message(stream, context, &message, None).await,
        Fake::Cut {
            message,
            after_bytes,
        } => send_message(stream, context, &message, Some(after_bytes)).await,
    }
}

async fn send_message(
    stream: &mut TcpStream,
    context: &Context,
    message: &FakeMessage,
    cut: Option<usize>,
) -> std::io::Result<()> {
    let id = context.request_id_header();
    let model = message
        .model
        .clone()
        .unwrap_or_else(|| context.model.clone());
    let number = context.number;
    if context.streamed {
        let events = match context.dialect {
            Dialect::OpenAi => openai_events(message, &model, number, context.include_usage),
            _ => anthropic_events(message, &model, number),
        };
        write_events(stream, &[id], &events, cut).await
    } else {
        let body = match context.dialect {
            Dialect::OpenAi => openai_body(message, &model, number),
            _ => anthropic_body(message, &model, number),
        }
        .to_string();
        write_full(stream, 200, &[id], "application/json", body.as_bytes(), cut).await
    }
}

fn anthropic_block(block: &ContentBlock) -> Value {
    match block {
        ContentBlock::Text { text } => json!({"type": "text", "text": text}),
        ContentBlock::ToolUse { id, name, input } => {
            json!({"type": "tool_use", "id": id, "name": name, "input": input})
        }
        ContentBlock::ToolResult {
            tool_use_id,
            content,
            is_error,
        } => {
            json!({"type": "tool_result", "tool_use_id": tool_use_id, "content": content, "is_error": is_error})
        }
    }
}

fn anthropic_body(message: &FakeMessage, model: &str, number: usize) -> Value {
    let usage = &message.usage;
    json!({
        "id": format!("msg_fake_{number:04}"),
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": message.content.iter().map(anthropic_block).collect::<Vec<_>>(),
        "stop_reason": message.stop_reason,
        "stop_sequence": null,
        "usage": {
            "input_tokens": usage.input_tokens,
            "cache_creation_input_tokens": usage.cache_write_tokens,
            "cache_read_input_tokens": usage.cache_read_tokens,
            "output_tokens": usage.output_tokens,
        }
    })
}

/// Two pieces of a string, split near its middle on a character boundary.
fn halves(text: &str) -> (&str, &str) {
    let mut middle = text.len() / 2;
    while !text.is_char_boundary(middle) {
        middle -= 1;
    }
    text.split_at(middle)
}

fn sse(event: Option<&str>, data: &Value) -> String {
    match event {
        Some(event) => format!("event: {event}\ndata: {data}\n\n"),
        None => format!("data: {data}\n\n"),
    }
}

fn anthropic_events(message: &FakeMessage, model: &str, number: usize) -> Vec<String> {
    let usage = &message.usage;
    let mut events = vec![
        sse(
            Some("message_start"),
            &json!({"type": "message_start", "message": {
                "id": format!("msg_fake_{number:04}"), "type": "message", "role": "assistant",
                "model": model, "content": [], "stop_reason": null, "stop_sequence": null,
                "usage": {
                    "input_tokens": usage.input_tokens,
                    "cache_creation_input_tokens": usage.cache_write_tokens,
                    "cache_read_input_tokens": usage.cache_read_tokens,
                    "output_tokens": 1,
                }
            }}),
        ),
        sse(Some("ping"), &json!({"type": "ping"})),
    ];
    for (index, block) in message.content.iter().enumerate() {
        let (start, pieces) = match block {
            ContentBlock::Text { text } => {
                let (a, b) = halves(text);
                (
                    json!({"type": "text", "text": ""}),
                    vec![
                        json!({"type": "text_delta", "text": a}),
                        json!({"type": "text_delta", "text": b}),
                    ],
                )
            }
            ContentBlock::ToolUse { id, name, input } => {
                let input = input.to_string();
                let (a, b) = halves(&input);
                (
                    json!({"type": "tool_use", "id": id, "name": name, "input": {}}),
                    vec![
                        json!({"type": "input_json_delta", "partial_json": a}),
                        json!({"type": "input_json_delta", "partial_json": b}),
                    ],
                )
            }
            ContentBlock::ToolResult { .. } => continue,
        };
        events.push(sse(
            Some("content_block_start"),
            &json!({"type": "content_block_start", "index": index, "content_block": start}),
        ));
        for delta in pieces {
            events.push(sse(
                Some("content_block_delta"),
                &json!({"type": "content_block_delta", "index": index, "delta": delta}),
            ));
        }
        events.push(sse(
            Some("content_block_stop"),
            &json!({"type": "content_block_stop", "index": index}),
        ));
    }
    events.push(sse(
        Some("message_delta"),
        &json!({"type": "message_delta",
            "delta": {"stop_reason": message.stop_reason, "stop_sequence": null},
            "usage": {"output_tokens": usage.output_tokens}}),
    ));
    events.push(sse(Some("message_stop"), &json!({"type": "message_stop"})));
    events
}

fn finish_reason(stop_reason: &str) -> &str {
    match stop_reason {
        "end_turn" | "stop_sequence" => "stop",
        "tool_use" => "tool_calls",
        "max_tokens" => "length",
        "refusal" => "content_filter",
        other => other,
    }
}

fn openai_usage(usage: &Usage) -> Value {
    let prompt = usage.input_tokens + usage.cache_read_tokens + usage.cache_write_tokens;
    json!({
        "prompt_tokens": prompt,
        "completion_tokens": usage.output_tokens,
        "total_tokens": prompt + usage.output_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cache_read_tokens},
    })
}

fn openai_text(message: &FakeMessage) -> Option<String> {
    let texts: Vec<&str> = message
        .content
        .iter()
        .filter_map(|block| match block {
            ContentBlock::Text { text } => Some(text.as_str()),
            _ => None,
        })
        .collect();
    (!texts.is_empty()).then(|| texts.concat())
}

fn openai_calls(message: &FakeMessage) -> Vec<(String, String, String)> {
    message
        .content
        .iter()
        .filter_map(|block| match block {
            ContentBlock::ToolUse { id, name, input } => {
                Some((id.clone(), name.clone(), input.to_string()))
            }
            _ => None,
        })
        .collect()
}

fn openai_body(message: &FakeMessage, model: &str, number: usize) -> Value {
    let mut reply = json!({"role": "assistant", "content": openai_text(message)});
    let calls = openai_calls(message);
    if !calls.is_empty() {
        reply["tool_calls"] = calls
            .iter()
            .map(|(id, name, arguments)| {
                json!({"id": id, "type": "function", "function": {"name": name, "arguments": arguments}})
            })
            .collect();
    }
    json!({
        "id": format!("chatcmpl-fake-{number}"),
        "object": "chat.completion",
        "created": 0,
        "model": model,
        "choices": [{"index": 0, "message": reply, "finish_reason": finish_reason(&message.stop_reason)}],
        "usage": openai_usage(&message.usage),
    })
}

fn openai_events(
    message: &FakeMessage,
    model: &str,
    number: usize,
    include_usage: bool,
) -> Vec<String> {
    let chunk = |choices: Value| {
        sse(
            None,
            &json!({"id": format!("chatcmpl-fake-{number}"), "object": "chat.completion.chunk",
                "created": 0, "model": model, "choices": choices}),
        )
    };
    let delta = |delta: Value| chunk(json!([{"index": 0, "delta": delta, "finish_reason": null}]));
    let mut events = vec![delta(json!({"role": "assistant", "content": ""}))];
    if let Some(text) = openai_text(message) {
        let (a, b) = halves(&text);
        events.push(delta(json!({"content": a})));
        events.push(delta(json!({"content": b})));
    }
    for (index, (id, name, arguments)) in openai_calls(message).into_iter().enumerate() {
        let (a, b) = halves(&arguments);
        events.push(delta(
            json!({"tool_calls": [{"index": index, "id": id, "type": "function",
            "function": {"name": name, "arguments": ""}}]}),
        ));
        events.push(delta(
            json!({"tool_calls": [{"index": index, "function": {"arguments": a}}]}),
        ));
        events.push(delta(
            json!({"tool_calls": [{"index": index, "function": {"arguments": b}}]}),
        ));
    }
    events.push(chunk(json!([{"index": 0, "delta": {},
        "finish_reason": finish_reason(&message.stop_reason)}])));
    if include_usage {
        events.push(sse(
            None,
            &json!({"id": format!("chatcmpl-fake-{number}"), "object": "chat.completion.chunk",
                "created": 0, "model": model, "choices": [], "usage": openai_usage(&message.usage)}),
        ));
    }
    events.push("data: [DONE]\n\n".to_string());
    events
}

/// Read one request; `None` when the peer closed first.
async fn read_request(stream: &mut TcpStream) -> std::io::Result<Option<RecordedRequest>> {
    let mut buffer = Vec::new();
    let mut chunk = [0u8; 8192];
    let head_end = loop {
        if let Some(at) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
            break at;
        }
        let read = stream.read(&mut chunk).await?;
        if read == 0 {
            return Ok(None);
        }
        buffer.extend_from_slice(&chunk[..read]);
    };
    let head = String::from_utf8_lossy(&buffer[..head_end]).into_owned();
    let mut lines = head.split("\r\n");
    let mut first = lines.next().unwrap_or_default().split(' ');
    let method = first.next().unwrap_or_default().to_string();
    let path = first.next().unwrap_or_default().to_string();
    let headers: Vec<(String, String)> = lines
        .filter_map(|line| line.split_once(':'))
        .map(|(name, value)| (name.trim().to_ascii_lowercase(), value.trim().to_string()))
        .collect();
    let length: usize = headers
        .iter()
        .find(|(name, _)| name == "content-length")
        .and_then(|(_, value)| value.parse().ok())
        .unwrap_or(0);
    let mut body = buffer.split_off(head_end + 4);
    while body.len() < length {
        let read = stream.read(&mut chunk).await?;
        if read == 0 {
            return Ok(None);
        }
        body.extend_from_slice(&chunk[..read]);
    }
    Ok(Some(RecordedRequest {
        method,
        path,
        headers,
        body: serde_json::from_slice(&body).unwrap_or(Value::Null),
    }))
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        401 => "Unauthorized",
        404 => "Not Found",
        429 => "Too Many Requests",
        500 => "Internal Server Error",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        529 => "Overloaded",
        _ => "Status",
    }
}

fn head(status: u16, headers: &[(&str, String)], content_type: &str, framing: &str) -> String {
    let mut head = format!(
        "HTTP/1.1 {status} {}\r\ncontent-type: {content_type}\r\n{framing}\r\nconnection: close\r\n",
        reason(status)
    );
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    head
}

/// A whole body with its length; with `cut`, only its first bytes, then the connection closes.
async fn write_full(
    stream: &mut TcpStream,
    status: u16,
    headers: &[(&str, String)],
    content_type: &str,
    body: &[u8],
    cut: Option<usize>,
) -> std::io::Result<()> {
    let framing = format!("content-length: {}", body.len());
    stream
        .write_all(head(status, headers, content_type, &framing).as_bytes())
        .await?;
    let sent = cut.map_or(body.len(), |cut| cut.min(body.len().saturating_sub(1)));
    stream.write_all(&body[..sent]).await?;
    stream.flush().await?;
    stream.shutdown().await
}

/// Server-sent events, one chunk each; with `cut`, only the first bytes of the event stream
/// are sent (as complete chunks), and the connection closes without the last chunk.
async fn write_events(
    stream: &mut TcpStream,
    headers: &[(&str, String)],
    events: &[String],
    cut: Option<usize>,
) -> std::io::Result<()> {
    stream
        .write_all(
            head(
                200,
                headers,
                "text/event-stream",
                "transfer-encoding: chunked",
            )
            .as_bytes(),
        )
        .await?;
    let mut budget = cut.unwrap_or(usize::MAX);
    for event in events {
        if budget == 0 {
            break;
        }
        let piece = &event.as_bytes()[..event.len().min(budget)];
        budget = budget.saturating_sub(piece.len());
        stream
            .write_all(format!("{:x}\r\n", piece.len()).as_bytes())
            .await?;
        stream.write_all(piece).await?;
        stream.write_all(b"\r\n").await?;
        stream.flush().await?;
    }
    if cut.is_none() {
        stream.write_all(b"0\r\n\r\n").await?;
    }
    stream.flush().await?;
    stream.shutdown().await
}

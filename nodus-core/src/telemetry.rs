//! Trace spans of runs, their steps and groups, built from the journal (pure), and the sink
//! the engine hands them to (`SpanSink`, which must never block a run).
//!
//! Identities are deterministic: a run's trace id comes from its uid, a step's span id from
//! (uid, journal sequence), the run's own span and a group's span from their uid, so a span
//! built again after a crash, on another replica, carries the same ids. Names and attributes
//! follow the OpenTelemetry GenAI semantic conventions ([`semconv`]).

use jiff::Timestamp;
use sha2::{Digest, Sha256};

use crate::cost::Usage;
use crate::journal::{Intent, Outcome, Step};
use crate::money::Usd;

mod content;

pub use content::{Disclosure, Hidden, REDACTED};

/// The attribute and span names of the GenAI semantic conventions (experimental, as of
/// semantic-conventions 1.37), and Nodus's own. Kept here, in one place, since they still move.
pub mod semconv {
    /// `gen_ai.operation.name`.
    pub const OPERATION_NAME: &str = "gen_ai.operation.name";
    /// `gen_ai.provider.name`.
    pub const PROVIDER_NAME: &str = "gen_ai.provider.name";
    /// `gen_ai.request.model`.
    pub const REQUEST_MODEL: &str = "gen_ai.request.model";
    /// `gen_ai.response.model`.
    pub const RESPONSE_MODEL: &str = "gen_ai.response.model";
    /// `gen_ai.response.id`.
    pub const RESPONSE_ID: &str = "gen_ai.response.id";
    /// `gen_ai.response.finish_reasons`.
    pub const FINISH_REASONS: &str = "gen_ai.response.finish_reasons";
    /// `gen_ai.usage.input_tokens` (every input-side token, cached ones included).
    pub const INPUT_TOKENS: &str = "gen_ai.usage.input_tokens";
    /// `gen_ai.usage.output_tokens`.
    pub const OUTPUT_TOKENS: &str = "gen_ai.usage.output_tokens";
    /// `gen_ai.usage.cache_read.input_tokens`.
    pub const CACHE_READ_TOKENS: &str = "gen_ai.usage.cache_read.input_tokens";
    /// `gen_ai.usage.cache_creation.input_tokens`.
    pub const CACHE_CREATION_TOKENS: &str = "gen_ai.usage.cache_creation.input_tokens";
    /// `gen_ai.agent.name`.
    pub const AGENT_NAME: &str = "gen_ai.agent.name";
    /// `gen_ai.agent.id`.
    pub const AGENT_ID: &str = "gen_ai.agent.id";
    /// `gen_ai.conversation.id`.
    pub const CONVERSATION_ID: &str = "gen_ai.conversation.id";
    /// `gen_ai.tool.name`.
    pub const TOOL_NAME: &str = "gen_ai.tool.name";
    /// `gen_ai.tool.type`.
    pub const TOOL_TYPE: &str = "gen_ai.tool.type";
    /// `gen_ai.tool.call.id`.
    pub const TOOL_CALL_ID: &str = "gen_ai.tool.call.id";
    /// `gen_ai.tool.call.arguments` (content: only when content is exported).
    pub const TOOL_CALL_ARGUMENTS: &str = "gen_ai.tool.call.arguments";
    /// `gen_ai.tool.call.result` (content).
    pub const TOOL_CALL_RESULT: &str = "gen_ai.tool.call.result";
    /// `gen_ai.output.messages` (content): the reply, as a JSON list of messages.
    pub const OUTPUT_MESSAGES: &str = "gen_ai.output.messages";
    /// `gen_ai.input.messages` (content): what a model call was sent, as a JSON list of
    /// messages.
    pub const INPUT_MESSAGES: &str = "gen_ai.input.messages";
    /// `gen_ai.system_instructions` (content): the system prompt, as a JSON list of parts.
    pub const SYSTEM_INSTRUCTIONS: &str = "gen_ai.system_instructions";
    /// `error.type`.
    pub const ERROR_TYPE: &str = "error.type";

    /// Operation `chat` (a model call).
    pub const OP_CHAT: &str = "chat";
    /// Operation `execute_tool` (a command).
    pub const OP_EXECUTE_TOOL: &str = "execute_tool";
    /// Operation `invoke_agent` (a run).
    pub const OP_INVOKE_AGENT: &str = "invoke_agent";
    /// Operation `invoke_workflow` (a group).
    pub const OP_INVOKE_WORKFLOW: &str = "invoke_workflow";

    /// `nodus.cost.usd`: what the span cost, a decimal string (exact).
    pub const COST_USD: &str = "nodus.cost.usd";
    /// `nodus.project`.
    pub const PROJECT: &str = "nodus.project";
    /// `nodus.run`: the run's name.
    pub const RUN: &str = "nodus.run";
    /// `nodus.step`: the step's journal sequence.
    pub const STEP: &str = "nodus.step";
    /// `nodus.group`: a group's name.
    pub const GROUP: &str = "nodus.group";
    /// `nodus.phase`: how a run or group ended.
    pub const PHASE: &str = "nodus.phase";
    /// `nodus.route.chosen_by`: how routing chose the model.
    pub const ROUTE_CHOSEN_BY: &str = "nodus.route.chosen_by";
}

/// A trace id (16 bytes).
pub type TraceId = [u8; 16];
/// A span id (8 bytes, never all zero).
pub type SpanId = [u8; 8];

/// What a span id is derived from, besides the uid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Slot {
    /// The run's (or group's) own span.
    Root,
    /// A journal step.
    Step(u32),
}

/// The trace id of the run (or group) with this uid: the first 16 bytes of
/// SHA-256("nodus.trace:" + uid).
pub fn trace_id(uid: &str) -> TraceId {
    let digest = Sha256::new()
        .chain_update(b"nodus.trace:")
        .chain_update(uid.as_bytes())
        .finalize();
    let mut id = [0u8; 16];
    id.copy_from_slice(&digest[..16]);
    if id == [0; 16] {
        id[15] = 1;
    }
    id
}

/// The span id of `slot` of the run (or group) with this uid: the first 8 bytes of
/// SHA-256("nodus.span:" + uid + ":root") or ("…:" + seq).
pub fn span_id(uid: &str, slot: Slot) -> SpanId {
    let tail = match slot {
        Slot::Root => "root".to_string(),
        Slot::Step(seq) => seq.to_string(),
    };
    let digest = Sha256::new()
        .chain_update(b"nodus.span:")
        .chain_update(uid.as_bytes())
        .chain_update(b":")
        .chain_update(tail.as_bytes())
        .finalize();
    let mut id = [0u8; 8];
    id.copy_from_slice(&digest[..8]);
    if id == [0; 8] {
        id[7] = 1;
    }
    id
}

/// A span's kind, as OTLP spells them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpanKind {
    /// Work inside Nodus.
    Internal,
    /// A call to another service (a model provider).
    Client,
}

/// An attribute's value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// A string.
    Str(String),
    /// An integer.
    Int(i64),
    /// A list of strings.
    Strs(Vec<String>),
}

/// A link to another trace's span (a run's to its group).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpanLink {
    /// The linked trace.
    pub trace_id: TraceId,
    /// The linked span.
    pub span_id: SpanId,
}

/// One finished span, ready to export.
#[derive(Debug, Clone, PartialEq)]
pub struct Span {
    /// Its trace.
    pub trace_id: TraceId,
    /// Its id.
    pub span_id: SpanId,
    /// Its parent in the same trace; `None` for a root.
    pub parent: Option<SpanId>,
    /// Its name (`chat claude-…`).
    pub name: String,
    /// Its kind.
    pub kind: SpanKind,
    /// When it started.
    pub start: Timestamp,
    /// When it ended.
    pub end: Timestamp,
    /// Its attributes.
    pub attributes: Vec<(&'static str, Value)>,
    /// Its links.
    pub links: Vec<SpanLink>,
    /// `Some(message)` when it failed (status ERROR).
    pub error: Option<String>,
}

impl Span {
    /// The attribute named `key`.
    pub fn attribute(&self, key: &str) -> Option<&Value> {
        self.attributes
            .iter()
            .find(|(k, _)| *k == key)
            .map(|(_, v)| v)
    }
}

/// Whether spans carry message content (prompts, replies, commands and their output), which
/// can hold secrets: off unless the operator asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Content {
    /// No content (the default).
    #[default]
    Off,
    /// Content included.
    On,
}

/// What a run's spans need to know about it.
#[derive(Debug, Clone, PartialEq)]
pub struct RunContext {
    /// The run's uid.
    pub uid: String,
    /// Its project.
    pub project: String,
    /// Its name.
    pub run: String,
    /// Its agent's name.
    pub agent: String,
    /// Who answers its model calls (`gen_ai.provider.name`).
    pub provider: String,
}

fn int(n: u64) -> Value {
    Value::Int(i64::try_from(n).unwrap_or(i64::MAX))
}

fn common(ctx: &RunContext, cost: Usd) -> Vec<(&'static str, Value)> {
    vec![
        (semconv::PROJECT, Value::Str(ctx.project.clone())),
        (semconv::RUN, Value::Str(ctx.run.clone())),
        (semconv::COST_USD, Value::Str(cost.to_string())),
    ]
}

fn usage_attributes(usage: &Usage, into: &mut Vec<(&'static str, Value)>) {
    into.push((semconv::INPUT_TOKENS, int(usage.prompt_tokens())));
    into.push((semconv::OUTPUT_TOKENS, int(usage.output_tokens)));
    into.push((semconv::CACHE_READ_TOKENS, int(usage.cache_read_tokens)));
    into.push((
        semconv::CACHE_CREATION_TOKENS,
        int(usage.cache_write_tokens),
    ));
}

/// The span of a journaled step, once it has ended (`None` while it is open). Its parent is
/// the run's span. It carries message content only with a `disclosure`, and then never a
/// hidden value.
pub fn step_span(
    ctx: &RunContext,
    step: &Step,
    disclosure: Option<&Disclosure<'_>>,
) -> Option<Span> {
    let completion = step.completion.as_ref()?;
    let outcome = &completion.outcome;
    let cost = match outcome {
        Outcome::ModelReplied { cost_usd, .. } | Outcome::Routed { cost_usd, .. } => *cost_usd,
        _ => Usd::ZERO,
    };
    let mut attributes = common(ctx, cost);
    attributes.push((semconv::STEP, Value::Int(i64::from(step.seq))));
    attributes.push((semconv::CONVERSATION_ID, Value::Str(ctx.uid.clone())));
    let mut kind = SpanKind::Internal;
    let name = match &step.intent {
        Intent::CallModel { model, .. } => {
            kind = SpanKind::Client;
            attributes.push((semconv::OPERATION_NAME, Value::Str(semconv::OP_CHAT.into())));
            attributes.push((semconv::PROVIDER_NAME, Value::Str(ctx.provider.clone())));
            attributes.push((semconv::REQUEST_MODEL, Value::Str(model.clone())));
            if let Some(shown) = disclosure {
                let system = content::system_instructions(shown.system);
                attributes.push((
                    semconv::SYSTEM_INSTRUCTIONS,
                    Value::Str(shown.hidden.json_text(system)),
                ));
                if let Some(sent) = shown.sent {
                    let input = content::input_messages(sent);
                    attributes.push((
                        semconv::INPUT_MESSAGES,
                        Value::Str(shown.hidden.json_text(input)),
                    ));
                }
            }
            if let Outcome::ModelReplied { response, .. } = outcome {
                attributes.push((semconv::RESPONSE_MODEL, Value::Str(response.model.clone())));
                if let Some(id) = &response.request_id {
                    attributes.push((semconv::RESPONSE_ID, Value::Str(id.clone())));
                }
                let reason = content::finish_reason(&response.stop_reason);
                attributes.push((semconv::FINISH_REASONS, Value::Strs(vec![reason])));
                usage_attributes(&response.usage, &mut attributes);
                if let Some(shown) = disclosure {
                    let output = content::output_messages(&response.content, &response.stop_reason);
                    attributes.push((
                        semconv::OUTPUT_MESSAGES,
                        Value::Str(shown.hidden.json_text(output)),
                    ));
                }
            }
            format!("{} {model}", semconv::OP_CHAT)
        }
        Intent::Command {
            tool_use_id,
            command,
            ..
        } => {
            attributes.push((
                semconv::OPERATION_NAME,
                Value::Str(semconv::OP_EXECUTE_TOOL.into()),
            ));
            attributes.push((
                semconv::TOOL_NAME,
                Value::Str(crate::replay::SHELL_TOOL.into()),
            ));
            attributes.push((semconv::TOOL_TYPE, Value::Str("function".into())));
            attributes.push((semconv::TOOL_CALL_ID, Value::Str(tool_use_id.clone())));
            if let Some(shown) = disclosure {
                // The shell tool's arguments, as the model gave them.
                let arguments = serde_json::json!({ "command": command });
                attributes.push((
                    semconv::TOOL_CALL_ARGUMENTS,
                    Value::Str(shown.hidden.json_text(arguments)),
                ));
                if let Outcome::CommandFinished { output, .. } = outcome {
                    // What the model was told of it.
                    let result = crate::replay::render_output(output);
                    attributes.push((
                        semconv::TOOL_CALL_RESULT,
                        Value::Str(shown.hidden.text(&result)),
                    ));
                }
            }
            format!("{} {}", semconv::OP_EXECUTE_TOOL, crate::replay::SHELL_TOOL)
        }
        Intent::Route { .. } => {
            if let Outcome::Routed {
                model,
                chosen_by,
                usage,
                ..
            } = outcome
            {
                attributes.push((semconv::RESPONSE_MODEL, Value::Str(model.clone())));
                let chosen_by = serde_json::to_value(chosen_by)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_string))
                    .unwrap_or_default();
                attributes.push((semconv::ROUTE_CHOSEN_BY, Value::Str(chosen_by)));
                if let Some(usage) = usage {
                    usage_attributes(usage, &mut attributes);
                }
            }
            "route".to_string()
        }
        Intent::CreateSandbox { .. } => "create_sandbox".to_string(),
        Intent::ReadMessage { .. } => "read_message".to_string(),
        Intent::Answer { .. } => "answer".to_string(),
        Intent::DestroySandbox { .. } => "delete_sandbox".to_string(),
        Intent::PostRunAction { action, .. } => format!("post_run_action {action}"),
    };
    let error = match outcome {
        Outcome::Failed { error, .. } => Some(("failed", error.clone())),
        Outcome::Stopped { reason } => Some(("stopped", reason.clone())),
        Outcome::Superseded => Some(("superseded", "outcome unknown; carried out again".into())),
        Outcome::CommandFinished { output, .. } if output.exit_code != Some(0) => {
            Some(("exit_code", format!("exit code {:?}", output.exit_code)))
        }
        _ => None,
    };
    if let Some((kind, _)) = &error {
        attributes.push((semconv::ERROR_TYPE, Value::Str((*kind).to_string())));
    }
    Some(Span {
        trace_id: trace_id(&ctx.uid),
        span_id: span_id(&ctx.uid, Slot::Step(step.seq)),
        parent: Some(span_id(&ctx.uid, Slot::Root)),
        name,
        kind,
        start: step.started_at,
        end: completion.finished_at.max(step.started_at),
        attributes,
        links: Vec::new(),
        error: error.map(|(_, message)| message),
    })
}

/// How a run or a group ended, for its span.
#[derive(Debug, Clone, PartialEq)]
pub struct Ended {
    /// When it started.
    pub start: Timestamp,
    /// When it ended.
    pub end: Timestamp,
    /// Its final phase's name.
    pub phase: &'static str,
    /// Whether that phase is a success (else the span's status is ERROR).
    pub succeeded: bool,
    /// What it cost in all.
    pub cost: Usd,
}

/// The run's own span (`invoke_agent {agent}`), the root of its trace and the parent of its
/// steps' spans; linked to its group's span when it has one (`group_uid`).
pub fn run_span(ctx: &RunContext, ended: &Ended, group_uid: Option<&str>) -> Span {
    let mut attributes = common(ctx, ended.cost);
    attributes.push((
        semconv::OPERATION_NAME,
        Value::Str(semconv::OP_INVOKE_AGENT.into()),
    ));
    attributes.push((semconv::AGENT_NAME, Value::Str(ctx.agent.clone())));
    attributes.push((semconv::CONVERSATION_ID, Value::Str(ctx.uid.clone())));
    attributes.push((semconv::PHASE, Value::Str(ended.phase.to_string())));
    let error = failure(ended);
    if let Some(kind) = &error {
        attributes.push((semconv::ERROR_TYPE, Value::Str(kind.clone())));
    }
    Span {
        trace_id: trace_id(&ctx.uid),
        span_id: span_id(&ctx.uid, Slot::Root),
        parent: None,
        name: format!("{} {}", semconv::OP_INVOKE_AGENT, ctx.agent),
        kind: SpanKind::Internal,
        start: ended.start,
        end: ended.end.max(ended.start),
        attributes,
        links: group_uid
            .map(|uid| SpanLink {
                trace_id: trace_id(uid),
                span_id: span_id(uid, Slot::Root),
            })
            .into_iter()
            .collect(),
        error,
    }
}

/// A group's span (`invoke_workflow {group}`), the root of the group's own trace, which its
/// runs' spans link to.
pub fn group_span(project: &str, group: &str, uid: &str, ended: &Ended) -> Span {
    let mut attributes = vec![
        (semconv::PROJECT, Value::Str(project.to_string())),
        (semconv::GROUP, Value::Str(group.to_string())),
        (semconv::COST_USD, Value::Str(ended.cost.to_string())),
        (
            semconv::OPERATION_NAME,
            Value::Str(semconv::OP_INVOKE_WORKFLOW.into()),
        ),
        (semconv::PHASE, Value::Str(ended.phase.to_string())),
    ];
    let error = failure(ended);
    if let Some(kind) = &error {
        attributes.push((semconv::ERROR_TYPE, Value::Str(kind.clone())));
    }
    Span {
        trace_id: trace_id(uid),
        span_id: span_id(uid, Slot::Root),
        parent: None,
        name: format!("{} {group}", semconv::OP_INVOKE_WORKFLOW),
        kind: SpanKind::Internal,
        start: ended.start,
        end: ended.end.max(ended.start),
        attributes,
        links: Vec::new(),
        error,
    }
}

fn failure(ended: &Ended) -> Option<String> {
    (!ended.succeeded).then(|| ended.phase.to_string())
}

/// Where the engine hands finished spans. `export` is called on a run's own task right after
/// the journal write that ended the span: it must return at once (queue or drop, never wait).
pub trait SpanSink: Send + Sync + std::fmt::Debug {
    /// Whether spans are wanted at all (when not, the engine builds none).
    fn enabled(&self) -> bool;
    /// Whether spans carry content.
    fn content(&self) -> Content;
    /// Take a finished span, without blocking.
    fn export(&self, span: Span);
}

/// The sink of an engine that exports nothing (the default).
#[derive(Debug, Clone, Copy, Default)]
pub struct NoSpans;

impl SpanSink for NoSpans {
    fn enabled(&self) -> bool {
        false
    }
    fn content(&self) -> Content {
        Content::Off
    }
    fn export(&self, _span: Span) {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cost::Usage;
    use crate::journal::Completion;
    use crate::model::{ContentBlock, ModelResponse, StopReason};

    fn ctx() -> RunContext {
        RunContext {
            uid: "6f1c2a4e-0000-4000-8000-000000000001".into(),
            project: "default".into(),
            run: "r1".into(),
            agent: "hello".into(),
            provider: "anthropic".into(),
        }
    }

    fn at(secs: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + secs).unwrap()
    }

    fn model_step(seq: u32) -> Step {
        Step {
            seq,
            started_at: at(1),
            intent: Intent::CallModel {
                turn: 0,
                model: "claude-x".into(),
                reserved_usd: Usd::from_nanos(10),
                tools: true,
            },
            completion: Some(Completion {
                finished_at: at(2),
                outcome: Outcome::ModelReplied {
                    response: ModelResponse {
                        model: "claude-x-2025".into(),
                        content: vec![ContentBlock::Text {
                            text: "a secret reply".into(),
                        }],
                        stop_reason: StopReason::EndTurn,
                        usage: Usage {
                            input_tokens: 10,
                            output_tokens: 5,
                            cache_write_tokens: 2,
                            cache_read_tokens: 3,
                        },
                        request_id: None,
                    },
                    cost_usd: Usd::from_nanos(1_500),
                },
            }),
        }
    }

    #[test]
    fn ids_are_a_function_of_uid_and_sequence() {
        assert_eq!(trace_id("a"), trace_id("a"));
        assert_ne!(trace_id("a"), trace_id("b"));
        assert_eq!(span_id("a", Slot::Step(3)), span_id("a", Slot::Step(3)));
        assert_ne!(span_id("a", Slot::Step(3)), span_id("a", Slot::Step(4)));
        assert_ne!(span_id("a", Slot::Root), span_id("a", Slot::Step(0)));
        assert_ne!(span_id("a", Slot::Root), span_id("b", Slot::Root));
    }

    #[test]
    fn a_model_call_is_a_client_chat_span_under_the_run() {
        let span = step_span(&ctx(), &model_step(4), None).expect("ended");
        assert_eq!(span.name, "chat claude-x");
        assert_eq!(span.kind, SpanKind::Client);
        assert_eq!(span.parent, Some(span_id(&ctx().uid, Slot::Root)));
        assert_eq!(span.span_id, span_id(&ctx().uid, Slot::Step(4)));
        assert_eq!(span.trace_id, trace_id(&ctx().uid));
        assert_eq!(span.attribute(semconv::INPUT_TOKENS), Some(&Value::Int(15)));
        assert_eq!(
            span.attribute(semconv::FINISH_REASONS),
            Some(&Value::Strs(vec!["stop".into()]))
        );
        assert_eq!(
            span.attribute(semconv::COST_USD),
            Some(&Value::Str("0.0000015".into()))
        );
        assert_eq!(span.attribute(semconv::STEP), Some(&Value::Int(4)));
        for key in [
            semconv::OUTPUT_MESSAGES,
            semconv::INPUT_MESSAGES,
            semconv::SYSTEM_INSTRUCTIONS,
        ] {
            assert_eq!(span.attribute(key), None, "{key} without a disclosure");
        }
    }

    #[test]
    fn a_disclosure_exports_content_with_hidden_values_replaced() {
        let mut sent = crate::model::Messages::new();
        sent.push(crate::model::ChatMessage {
            role: crate::model::Role::User,
            content: vec![ContentBlock::Text {
                text: "the token is tok-123".into(),
            }],
        });
        let hidden = Hidden::new([crate::secret::SecretString::new("tok-123")]);
        let disclosure = Disclosure {
            system: "be brief; tok-123",
            sent: Some(&sent),
            hidden: &hidden,
        };
        let span = step_span(&ctx(), &model_step(4), Some(&disclosure)).expect("ended");
        let text = |key: &str| match span.attribute(key) {
            Some(Value::Str(text)) => serde_json::from_str::<serde_json::Value>(text)
                .unwrap_or_else(|e| panic!("{key} is JSON: {e}")),
            other => panic!("{key}: {other:?}"),
        };
        assert_eq!(
            text(semconv::INPUT_MESSAGES),
            serde_json::json!([{"role": "user", "parts": [
                {"type": "text", "content": "the token is [redacted]"}
            ]}])
        );
        assert_eq!(
            text(semconv::SYSTEM_INSTRUCTIONS),
            serde_json::json!([{"type": "text", "content": "be brief; [redacted]"}])
        );
        assert_eq!(
            text(semconv::OUTPUT_MESSAGES),
            serde_json::json!([{"role": "assistant", "finish_reason": "stop", "parts": [
                {"type": "text", "content": "a secret reply"}
            ]}])
        );
        assert!(!format!("{span:?}").contains("tok-123"));
    }

    #[test]
    fn a_command_span_discloses_its_call_and_output_with_hidden_values_replaced() {
        let step = Step {
            seq: 7,
            started_at: at(1),
            intent: Intent::Command {
                turn: 0,
                tool_use_id: "toolu_1".into(),
                command: "echo \"$KEY\"".into(),
            },
            completion: Some(Completion {
                finished_at: at(2),
                outcome: Outcome::CommandFinished {
                    output: crate::sandbox::ExecOutput {
                        exit_code: Some(0),
                        stdout: crate::output::Output::complete("k\"ey-1\n"),
                        stderr: crate::output::Output::complete(""),
                        timed_out: false,
                        stopped: None,
                    },
                    remade_sandbox: None,
                },
            }),
        };
        let bare = step_span(&ctx(), &step, None).expect("ended");
        assert_eq!(bare.attribute(semconv::TOOL_CALL_ARGUMENTS), None);
        assert_eq!(bare.attribute(semconv::TOOL_CALL_RESULT), None);
        assert_eq!(bare.attribute(semconv::STEP), Some(&Value::Int(7)));
        let hidden = Hidden::new([crate::secret::SecretString::new("k\"ey-1")]);
        let disclosure = Disclosure {
            system: "",
            sent: None,
            hidden: &hidden,
        };
        let span = step_span(&ctx(), &step, Some(&disclosure)).expect("ended");
        assert_eq!(
            span.attribute(semconv::TOOL_CALL_ARGUMENTS),
            Some(&Value::Str(r#"{"command":"echo \"$KEY\""}"#.into()))
        );
        assert_eq!(
            span.attribute(semconv::TOOL_CALL_RESULT),
            Some(&Value::Str("exit code 0\nstdout:\n[redacted]\n".into()))
        );
    }

    #[test]
    fn an_open_step_has_no_span() {
        let mut step = model_step(1);
        step.completion = None;
        assert_eq!(step_span(&ctx(), &step, None), None);
    }

    #[test]
    fn a_run_links_to_its_group() {
        let ended = Ended {
            start: at(0),
            end: at(9),
            phase: "Succeeded",
            succeeded: true,
            cost: Usd::ZERO,
        };
        let span = run_span(&ctx(), &ended, Some("g-uid"));
        assert_eq!(span.name, "invoke_agent hello");
        assert_eq!(span.parent, None);
        assert_eq!(
            span.links,
            vec![SpanLink {
                trace_id: trace_id("g-uid"),
                span_id: span_id("g-uid", Slot::Root)
            }]
        );
        assert_eq!(
            group_span("default", "g", "g-uid", &ended).span_id,
            span_id("g-uid", Slot::Root)
        );
    }
}

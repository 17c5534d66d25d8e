//! Message content on spans, shaped as the GenAI semantic conventions define it
//! (`gen_ai.system_instructions`, `gen_ai.input.messages`, `gen_ai.output.messages`, a tool
//! call's arguments and result), with the values of a run's Secrets hidden wherever they show.

use serde_json::{Value as Json, json};

use crate::model::{ChatMessage, ContentBlock, Messages, Role, StopReason};
use crate::secret::SecretString;

/// What stands in an exported span for a hidden value.
pub const REDACTED: &str = "[redacted]";

/// Values no exported span may carry: those of the Secrets a run is given (its environment's
/// `valueFrom` variables). A command can print them and the model repeat them, so they are
/// replaced in every piece of exported content, whatever holds them.
#[derive(Debug, Clone, Default)]
pub struct Hidden(Vec<SecretString>);

impl Hidden {
    /// Hide these values (empty ones hide nothing).
    pub fn new(values: impl IntoIterator<Item = SecretString>) -> Self {
        let mut values: Vec<SecretString> = values
            .into_iter()
            .filter(|value| !value.expose().is_empty())
            .collect();
        // Longest first: a value that holds another is hidden whole.
        values.sort_by_key(|value| std::cmp::Reverse(value.expose().len()));
        Hidden(values)
    }

    /// `text` with each hidden value replaced by [`REDACTED`].
    pub fn text(&self, text: &str) -> String {
        let mut text = text.to_string();
        for value in &self.0 {
            if text.contains(value.expose()) {
                text = text.replace(value.expose(), REDACTED);
            }
        }
        text
    }

    /// `value` as JSON text, each of its strings (keys included) hidden before it is encoded
    /// (a value with quotes or backslashes is escaped in the text, and would not be found
    /// there).
    pub fn json_text(&self, value: Json) -> String {
        self.json(value).to_string()
    }

    fn json(&self, value: Json) -> Json {
        match value {
            Json::String(text) => Json::String(self.text(&text)),
            Json::Array(items) => Json::Array(items.into_iter().map(|v| self.json(v)).collect()),
            Json::Object(map) => Json::Object(
                map.into_iter()
                    .map(|(key, v)| (self.text(&key), self.json(v)))
                    .collect(),
            ),
            other => other,
        }
    }
}

/// What a step's span discloses when message content is exported (`--otlp-content`); a span
/// built without one carries no content at all.
#[derive(Debug, Clone, Copy)]
pub struct Disclosure<'a> {
    /// The run's system prompt (a model call's `gen_ai.system_instructions`).
    pub system: &'a str,
    /// The conversation a model call was sent (its `gen_ai.input.messages`), when known.
    pub sent: Option<&'a Messages>,
    /// The values to hide.
    pub hidden: &'a Hidden,
}

/// `gen_ai.system_instructions`: the system prompt as a list of one text part.
pub fn system_instructions(system: &str) -> Json {
    json!([{"type": "text", "content": system}])
}

/// `gen_ai.input.messages`: each message with its role and parts.
pub fn input_messages(messages: &Messages) -> Json {
    Json::Array(messages.iter().map(message).collect())
}

/// `gen_ai.output.messages`: the reply, one assistant message with why it ended.
pub fn output_messages(content: &[ContentBlock], reason: &StopReason) -> Json {
    json!([{
        "role": "assistant",
        "parts": content.iter().map(part).collect::<Vec<_>>(),
        "finish_reason": finish_reason(reason),
    }])
}

/// A stop reason as the conventions name finish reasons (`stop`, `length`, `tool_call`,
/// `content_filter`); one they do not name, as the provider sent it.
pub fn finish_reason(reason: &StopReason) -> String {
    match reason {
        StopReason::EndTurn | StopReason::StopSequence => "stop".into(),
        StopReason::ToolUse => "tool_call".into(),
        StopReason::MaxTokens => "length".into(),
        StopReason::Refusal => "content_filter".into(),
        StopReason::PauseTurn => "pause_turn".into(),
        StopReason::Other(other) => other.clone(),
    }
}

fn message(message: &ChatMessage) -> Json {
    // Tool results travel in user messages to the provider; the conventions give them
    // the role `tool`.
    let results_only = !message.content.is_empty()
        && message
            .content
            .iter()
            .all(|block| matches!(block, ContentBlock::ToolResult { .. }));
    let role = match message.role {
        _ if results_only => "tool",
        Role::User => "user",
        Role::Assistant => "assistant",
    };
    json!({"role": role, "parts": message.content.iter().map(part).collect::<Vec<_>>()})
}

fn part(block: &ContentBlock) -> Json {
    match block {
        ContentBlock::Text { text } => json!({"type": "text", "content": text}),
        ContentBlock::ToolUse { id, name, input } => {
            json!({"type": "tool_call", "id": id, "name": name, "arguments": input})
        }
        ContentBlock::ToolResult {
            tool_use_id,
            content,
            ..
        } => json!({"type": "tool_call_response", "id": tool_use_id, "response": content}),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_hidden_value_is_replaced_wherever_it_shows() {
        let hidden = Hidden::new([
            SecretString::new("s3cr\"et"),
            SecretString::new("s3cr\"et-longer"),
            SecretString::new(""),
        ]);
        assert_eq!(hidden.text("a s3cr\"et-longer b"), "a [redacted] b");
        let text = hidden.json_text(json!({"k s3cr\"et": ["x s3cr\"et y", 1]}));
        assert_eq!(text, r#"{"k [redacted]":["x [redacted] y",1]}"#);
        assert_eq!(hidden.text("nothing here"), "nothing here");
    }

    #[test]
    fn messages_take_the_conventions_shape() {
        let mut messages = Messages::new();
        messages.push(ChatMessage {
            role: Role::User,
            content: vec![ContentBlock::Text { text: "hi".into() }],
        });
        messages.push(ChatMessage {
            role: Role::Assistant,
            content: vec![ContentBlock::ToolUse {
                id: "t1".into(),
                name: "shell".into(),
                input: json!({"command": "ls"}),
            }],
        });
        messages.push(ChatMessage {
            role: Role::User,
            content: vec![ContentBlock::ToolResult {
                tool_use_id: "t1".into(),
                content: "exit code 0".into(),
                is_error: false,
            }],
        });
        assert_eq!(
            input_messages(&messages),
            json!([
                {"role": "user", "parts": [{"type": "text", "content": "hi"}]},
                {"role": "assistant", "parts": [
                    {"type": "tool_call", "id": "t1", "name": "shell", "arguments": {"command": "ls"}}
                ]},
                {"role": "tool", "parts": [
                    {"type": "tool_call_response", "id": "t1", "response": "exit code 0"}
                ]},
            ])
        );
        assert_eq!(
            output_messages(
                &[ContentBlock::Text {
                    text: "done".into()
                }],
                &StopReason::EndTurn
            ),
            json!([{"role": "assistant", "parts": [{"type": "text", "content": "done"}],
                    "finish_reason": "stop"}])
        );
        assert_eq!(
            system_instructions("be brief"),
            json!([{"type": "text", "content": "be brief"}])
        );
    }
}

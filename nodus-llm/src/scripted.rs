//! The scripted model: deterministic replies without a provider, for tests and offline use.
//!
//! Its reply depends only on the request, never on how many calls came before, so a call
//! repeated after a crash gets the same reply as the first time. Two modes:
//! - a script: the n-th reply of a conversation (n = the assistant messages so far) is the
//!   script's n-th entry, text or shell commands;
//! - offline: it runs the shell commands a prompt quotes in backticks and answers with their
//!   output. It says that it is the offline model; it does not pretend to think.

use async_trait::async_trait;
use nodus_core::cost::Usage;
use nodus_core::model::{
    self, ContentBlock, ErrorKind, Messages, ModelClient, ModelRequest, ModelResponse, Role,
    StopReason, ToolChoice,
};

/// One scripted reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// Answer with this text.
    Text(String),
    /// Ask to run these shell commands.
    Commands(Vec<String>),
}

#[derive(Debug, Clone)]
enum Mode {
    Script(Vec<Reply>),
    Offline,
}

/// A model that answers from a script, or the offline model.
#[derive(Debug, Clone)]
pub struct ScriptedModel {
    mode: Mode,
}

impl ScriptedModel {
    /// Replies from a script, by position in the conversation.
    pub fn new(script: Vec<Reply>) -> Self {
        ScriptedModel {
            mode: Mode::Script(script),
        }
    }

    /// The offline model: runs the commands a prompt quotes in backticks.
    pub fn offline() -> Self {
        ScriptedModel {
            mode: Mode::Offline,
        }
    }

    fn reply(&self, request: &ModelRequest) -> Result<Reply, model::Error> {
        let position = request
            .messages
            .iter()
            .filter(|m| m.role == Role::Assistant)
            .count();
        match &self.mode {
            Mode::Script(script) => script.get(position).cloned().ok_or_else(|| model::Error {
                kind: ErrorKind::Final,
                message: format!(
                    "the scripted model has {} replies and was asked for reply {}",
                    script.len(),
                    position + 1
                ),
            }),
            Mode::Offline => Ok(offline_reply(&request.messages)),
        }
    }
}

/// What the offline model says next.
fn offline_reply(messages: &Messages) -> Reply {
    let Some(last) = messages.last() else {
        return Reply::Text("[offline model] There is nothing to answer.".to_string());
    };
    let results: Vec<&str> = last
        .content
        .iter()
        .filter_map(|block| match block {
            ContentBlock::ToolResult { content, .. } => Some(content.as_str()),
            _ => None,
        })
        .collect();
    if !results.is_empty() {
        let commands = messages
            .iter()
            .rev()
            .find(|m| m.role == Role::Assistant)
            .map(|m| {
                m.content
                    .iter()
                    .filter_map(|block| match block {
                        ContentBlock::ToolUse { input, .. } => input
                            .get("command")
                            .and_then(serde_json::Value::as_str)
                            .map(str::to_string),
                        _ => None,
                    })
                    .collect::<Vec<_>>()
            })
            .unwrap_or_default();
        let mut answer = String::from("[offline model] I ran the commands you quoted.");
        for (command, result) in commands.iter().zip(&results) {
            answer.push_str(&format!("\n\n`{command}` → {result}"));
        }
        return Reply::Text(answer);
    }
    let prompt: String = last
        .content
        .iter()
        .filter_map(|block| match block {
            ContentBlock::Text { text } => Some(text.as_str()),
            _ => None,
        })
        .collect::<Vec<_>>()
        .join("\n");
    let commands = quoted_commands(&prompt);
    if commands.is_empty() {
        Reply::Text(format!(
            "[offline model] No ANTHROPIC_API_KEY is set, so no real model answers. Quote shell \
             commands in backticks and I run them; your prompt quoted none: {prompt:?}"
        ))
    } else {
        Reply::Commands(commands)
    }
}

/// The spans of `text` quoted in single backticks.
fn quoted_commands(text: &str) -> Vec<String> {
    text.split('`')
        .skip(1)
        .step_by(2)
        .map(str::trim)
        .filter(|command| !command.is_empty())
        .map(str::to_string)
        .collect()
}

/// A token count that is never above the provider's (at most one token per four bytes, at
/// least one).
fn tokens(bytes: usize) -> u64 {
    (bytes as u64).div_ceil(4).max(1)
}

#[async_trait]
impl ModelClient for ScriptedModel {
    fn provider_name(&self, _byok: bool) -> &'static str {
        "nodus.scripted"
    }

    async fn complete(&self, request: &ModelRequest) -> Result<ModelResponse, model::Error> {
        let position = request
            .messages
            .iter()
            .filter(|m| m.role == Role::Assistant)
            .count();
        let mut reply = self.reply(request)?;
        if request.tool_choice == ToolChoice::None
            && let Reply::Commands(commands) = &reply
        {
            reply = Reply::Text(format!(
                "[scripted model] Tools are closed for this reply; I would have run: {}",
                commands.join("; ")
            ));
        }
        let (content, stop_reason) = match reply {
            Reply::Text(text) => (vec![ContentBlock::Text { text }], StopReason::EndTurn),
            Reply::Commands(commands) => (
                commands
                    .into_iter()
                    .enumerate()
                    .map(|(i, command)| ContentBlock::ToolUse {
                        id: format!("toolu_{position:03}_{i:02}"),
                        name: "shell".to_string(),
                        input: serde_json::json!({ "command": command }),
                    })
                    .collect(),
                StopReason::ToolUse,
            ),
        };
        let input_bytes = request.system.len()
            + request
                .messages
                .iter()
                .flat_map(|m| &m.content)
                .map(|block| serde_json::to_string(block).map_or(0, |s| s.len()))
                .sum::<usize>();
        let output_bytes = content
            .iter()
            .map(|block| serde_json::to_string(block).map_or(0, |s| s.len()))
            .sum::<usize>();
        Ok(ModelResponse {
            model: request.model.clone(),
            content,
            stop_reason,
            usage: Usage {
                input_tokens: tokens(input_bytes),
                output_tokens: tokens(output_bytes).min(u64::from(request.max_tokens)),
                cache_write_tokens: 0,
                cache_read_tokens: 0,
            },
            request_id: Some(format!("scripted-{position}")),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nodus_core::model::{ChatMessage, Credentials};

    fn request(messages: Vec<ChatMessage>) -> ModelRequest {
        ModelRequest {
            model: "claude-haiku-4-5".to_string(),
            system: "be brief".to_string(),
            messages: messages.into(),
            tools: Vec::new(),
            tool_choice: ToolChoice::Auto,
            max_tokens: 1024,
            credentials: Credentials::Platform,
        }
    }

    fn user(text: &str) -> ChatMessage {
        ChatMessage {
            role: Role::User,
            content: vec![ContentBlock::Text {
                text: text.to_string(),
            }],
        }
    }

    #[tokio::test]
    async fn script_replies_by_position_and_repeats_identically() {
        let model = ScriptedModel::new(vec![
            Reply::Commands(vec!["echo hi".to_string()]),
            Reply::Text("done".to_string()),
        ]);
        let first = model
            .complete(&request(vec![user("go")]))
            .await
            .expect("reply");
        let again = model
            .complete(&request(vec![user("go")]))
            .await
            .expect("reply");
        assert_eq!(first, again);
        assert_eq!(first.stop_reason, StopReason::ToolUse);
        let beyond = vec![
            user("go"),
            ChatMessage {
                role: Role::Assistant,
                content: first.content.clone(),
            },
            user("more"),
            ChatMessage {
                role: Role::Assistant,
                content: vec![],
            },
            user("more"),
        ];
        let err = model
            .complete(&request(beyond))
            .await
            .expect_err("script ended");
        assert_eq!(err.kind, ErrorKind::Final);
    }

    #[tokio::test]
    async fn offline_runs_backticked_commands_and_says_what_it_is() {
        let model = ScriptedModel::offline();
        let reply = model
            .complete(&request(vec![user(
                "Print it: `python3 --version` and `uname -s`.",
            )]))
            .await
            .expect("reply");
        let commands: Vec<_> = reply
            .content
            .iter()
            .filter_map(|b| match b {
                ContentBlock::ToolUse { input, .. } => {
                    input["command"].as_str().map(str::to_string)
                }
                _ => None,
            })
            .collect();
        assert_eq!(commands, ["python3 --version", "uname -s"]);
        let plain = model
            .complete(&request(vec![user("hello")]))
            .await
            .expect("reply");
        assert!(
            plain.text().starts_with("[offline model]"),
            "{}",
            plain.text()
        );
    }
}

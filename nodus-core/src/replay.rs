//! Replay: folds a run's journal into what the run knows — its sandbox, its turns, the
//! conversation so far and what it has spent. The decider and the run's status both read
//! the journal only through this fold, so a live run and a replayed one see the same thing.

use std::collections::HashMap;

use crate::catalog::Family;
use crate::cost::Usage;
use crate::journal::{Intent, Outcome, Step};
use crate::lifecycle::RunPhase;
use crate::model::{ChatMessage, ContentBlock, ModelResponse, Role};
use crate::money::Usd;
use crate::resource::{ChosenBy, TurnStatus};
use crate::sandbox::{ExecOutput, SandboxInfo};
use crate::store::InboxMessage;

/// The name of the one tool a run offers: a shell in its sandbox.
pub const SHELL_TOOL: &str = "shell";
/// Bytes of each output stream a command result shows the model.
pub const MODEL_OUTPUT_CAP: usize = 16 * 1024;

/// The run's sandbox, as the journal tells it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum SandboxState<'a> {
    /// Not created yet.
    NotCreated,
    /// Creation failed for good.
    Failed(&'a str),
    /// Created and not deleted.
    Live(&'a SandboxInfo),
    /// Deleted.
    Gone,
}

/// Where a turn's prompt came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Prompt {
    /// The run's input.
    Input,
    /// A message from the inbox.
    Message(u64),
}

/// The model chosen for a turn.
#[derive(Debug, Clone, PartialEq)]
pub struct Route<'a> {
    /// The model id.
    pub model: &'a str,
    /// Its family.
    pub family: Option<Family>,
    /// How it was chosen.
    pub chosen_by: ChosenBy,
}

/// A finished model call.
#[derive(Debug, Clone, PartialEq)]
pub enum Call<'a> {
    /// The model replied.
    Replied {
        /// The model.
        model: &'a str,
        /// The reply.
        response: &'a ModelResponse,
    },
    /// The call failed.
    Failed {
        /// What happened.
        error: &'a str,
        /// A person recorded an uncertain call as failed; the run goes on.
        by_resolution: bool,
    },
}

/// A finished command.
#[derive(Debug, Clone, PartialEq)]
pub enum CommandResult<'a> {
    /// It ran.
    Ran(&'a ExecOutput),
    /// It could not run, or a person recorded an uncertain one as failed.
    Failed(&'a str),
}

/// One turn: a prompt and the work that answers it.
#[derive(Debug, Clone, PartialEq)]
pub struct Turn<'a> {
    /// Where the prompt came from.
    pub prompt: Prompt,
    /// The model chosen by routing.
    pub route: Option<Route<'a>>,
    /// Routing failed for good (no model for the family).
    pub route_failed: Option<&'a str>,
    /// Finished model calls, in order.
    pub calls: Vec<Call<'a>>,
    /// Finished commands, by tool-call id.
    pub results: HashMap<&'a str, CommandResult<'a>>,
    /// Whether the answer is recorded.
    pub answered: bool,
    /// What the turn cost.
    pub cost: Usd,
    /// Tokens over the turn's calls (routing included).
    pub usage: Usage,
}

impl<'a> Turn<'a> {
    fn new(prompt: Prompt) -> Self {
        Turn {
            prompt,
            route: None,
            route_failed: None,
            calls: Vec::new(),
            results: HashMap::new(),
            answered: false,
            cost: Usd::ZERO,
            usage: Usage::default(),
        }
    }

    /// The last reply of the turn.
    pub fn last_reply(&self) -> Option<&'a ModelResponse> {
        self.calls.iter().rev().find_map(|call| match call {
            Call::Replied { response, .. } => Some(*response),
            Call::Failed { .. } => None,
        })
    }

    /// Every tool call the model asked for in this turn, in order.
    pub fn tool_uses(&self) -> impl Iterator<Item = ToolUse<'a>> + '_ {
        self.calls
            .iter()
            .filter_map(|call| match call {
                Call::Replied { response, .. } => Some(*response),
                Call::Failed { .. } => None,
            })
            .flat_map(|response| response.content.iter())
            .filter_map(|block| match block {
                ContentBlock::ToolUse { id, name, input } => Some(ToolUse {
                    id: id.as_str(),
                    name: name.as_str(),
                    input,
                }),
                _ => None,
            })
    }
}

/// A tool call the model asked for.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ToolUse<'a> {
    /// Its id.
    pub id: &'a str,
    /// The tool's name.
    pub name: &'a str,
    /// Its input.
    pub input: &'a serde_json::Value,
}

impl<'a> ToolUse<'a> {
    /// The shell command line, when this is a well-formed shell call.
    pub fn command(&self) -> Option<&'a str> {
        if self.name != SHELL_TOOL {
            return None;
        }
        self.input
            .get("command")
            .and_then(serde_json::Value::as_str)
    }
}

/// What the journal says, folded.
#[derive(Debug, Clone, PartialEq)]
pub struct Replay<'a> {
    /// The sandbox.
    pub sandbox: SandboxState<'a>,
    /// The turns, the input's first.
    pub turns: Vec<Turn<'a>>,
    /// Model and routing spend.
    pub spent: Usd,
    /// The last inbox message taken as a prompt (0: none).
    pub last_message_read: u64,
    /// A step with an intent and no outcome.
    pub open_step: Option<&'a Step>,
    /// How the run ends, once its sandbox deletion is recorded.
    pub ended: Option<RunPhase>,
}

impl<'a> Replay<'a> {
    /// Fold a journal.
    pub fn of(journal: &'a [Step]) -> Self {
        let mut replay = Replay {
            sandbox: SandboxState::NotCreated,
            turns: vec![Turn::new(Prompt::Input)],
            spent: Usd::ZERO,
            last_message_read: 0,
            open_step: None,
            ended: None,
        };
        for step in journal {
            let Some(outcome) = step.outcome() else {
                replay.open_step = Some(step);
                continue;
            };
            replay.apply(&step.intent, outcome);
        }
        replay
    }

    fn turn_mut(&mut self, turn: u32) -> Option<&mut Turn<'a>> {
        self.turns.get_mut(usize::try_from(turn).ok()?)
    }

    fn apply(&mut self, intent: &'a Intent, outcome: &'a Outcome) {
        match (intent, outcome) {
            (_, Outcome::Superseded) => {}
            (Intent::CreateSandbox { .. }, Outcome::SandboxCreated { info }) => {
                self.sandbox = SandboxState::Live(info);
            }
            (Intent::CreateSandbox { .. }, Outcome::Failed { error, .. }) => {
                self.sandbox = SandboxState::Failed(error);
            }
            (
                Intent::Route { turn },
                Outcome::Routed {
                    family,
                    model,
                    chosen_by,
                    cost_usd,
                    usage,
                    ..
                },
            ) => {
                self.spent = self.spent.saturating_add(*cost_usd);
                if let Some(turn) = self.turn_mut(*turn) {
                    turn.route = Some(Route {
                        model,
                        family: *family,
                        chosen_by: *chosen_by,
                    });
                    turn.cost = turn.cost.saturating_add(*cost_usd);
                    turn.usage = turn.usage.plus(usage.unwrap_or_default());
                }
            }
            (Intent::Route { turn }, Outcome::Failed { error, .. }) => {
                if let Some(turn) = self.turn_mut(*turn) {
                    turn.route_failed = Some(error);
                }
            }
            (
                Intent::CallModel { turn, model, .. },
                Outcome::ModelReplied { response, cost_usd },
            ) => {
                self.spent = self.spent.saturating_add(*cost_usd);
                if let Some(turn) = self.turn_mut(*turn) {
                    turn.calls.push(Call::Replied { model, response });
                    turn.cost = turn.cost.saturating_add(*cost_usd);
                    turn.usage = turn.usage.plus(response.usage);
                }
            }
            (
                Intent::CallModel { turn, .. },
                Outcome::Failed {
                    error,
                    by_resolution,
                },
            ) => {
                if let Some(turn) = self.turn_mut(*turn) {
                    turn.calls.push(Call::Failed {
                        error,
                        by_resolution: *by_resolution,
                    });
                }
            }
            (
                Intent::Command {
                    turn, tool_use_id, ..
                },
                outcome,
            ) => {
                let result = match outcome {
                    Outcome::CommandFinished { output } => CommandResult::Ran(output),
                    Outcome::Failed { error, .. } | Outcome::Stopped { reason: error } => {
                        CommandResult::Failed(error)
                    }
                    _ => return,
                };
                if let Some(turn) = self.turn_mut(*turn) {
                    turn.results.insert(tool_use_id, result);
                }
            }
            (Intent::ReadMessage { message_seq, .. }, Outcome::MessageRead) => {
                self.turns.push(Turn::new(Prompt::Message(*message_seq)));
                self.last_message_read = *message_seq;
            }
            (Intent::Answer { turn }, Outcome::Answered) => {
                if let Some(turn) = self.turn_mut(*turn) {
                    turn.answered = true;
                }
            }
            (Intent::DestroySandbox { then, .. }, _) => {
                self.sandbox = SandboxState::Gone;
                self.ended = Some(*then);
            }
            _ => {}
        }
    }

    /// The index of the current (last) turn.
    pub fn current_turn(&self) -> u32 {
        u32::try_from(self.turns.len().saturating_sub(1)).unwrap_or(u32::MAX)
    }

    /// The text of the last answered turn.
    pub fn answer(&self) -> Option<String> {
        self.turns
            .iter()
            .rev()
            .find(|turn| turn.answered)
            .and_then(Turn::last_reply)
            .map(ModelResponse::text)
    }

    /// The conversation so far, as the model sees it, and the index of its last assistant
    /// message (the reply of the last model call).
    pub fn conversation(
        &self,
        first_prompt: &str,
        inbox: &[InboxMessage],
        max_tool_calls: u32,
    ) -> (Vec<ChatMessage>, Option<usize>) {
        let mut messages = Vec::new();
        let mut last_reply = None;
        for turn in &self.turns {
            let prompt = match turn.prompt {
                Prompt::Input => first_prompt.to_string(),
                Prompt::Message(seq) => inbox.iter().find(|m| m.seq == seq).map_or_else(
                    || "[message no longer stored]".to_string(),
                    |m| m.payload.clone(),
                ),
            };
            messages.push(ChatMessage {
                role: Role::User,
                content: vec![ContentBlock::Text { text: prompt }],
            });
            let granted = granted_tool_uses(turn, max_tool_calls);
            for call in &turn.calls {
                let Call::Replied { response, .. } = call else {
                    continue;
                };
                last_reply = Some(messages.len());
                messages.push(ChatMessage {
                    role: Role::Assistant,
                    content: response.content.clone(),
                });
                let results: Vec<ContentBlock> = response
                    .content
                    .iter()
                    .filter_map(|block| match block {
                        ContentBlock::ToolUse { id, name, input } => {
                            Some(ToolUse { id, name, input })
                        }
                        _ => None,
                    })
                    .map(|tool_use| tool_result(turn, &granted, tool_use, max_tool_calls))
                    .collect();
                if !results.is_empty() {
                    messages.push(ChatMessage {
                        role: Role::User,
                        content: results,
                    });
                }
            }
        }
        (messages, last_reply)
    }

    /// The status lines of the turns that used a model.
    pub fn turn_statuses(&self) -> Vec<TurnStatus> {
        self.turns
            .iter()
            .filter_map(|turn| {
                let (model, family, chosen_by) = match (&turn.route, turn.calls.first()) {
                    (Some(route), _) => (route.model, route.family, route.chosen_by),
                    (None, Some(Call::Replied { model, .. })) => (*model, None, ChosenBy::Agent),
                    _ => return None,
                };
                let commands = turn
                    .results
                    .values()
                    .filter(|r| matches!(r, CommandResult::Ran(_)))
                    .count();
                Some(TurnStatus {
                    model: model.to_string(),
                    family,
                    chosen_by,
                    cost_usd: turn.cost,
                    input_tokens: turn.usage.input_tokens,
                    output_tokens: turn.usage.output_tokens,
                    cache_write_tokens: turn.usage.cache_write_tokens,
                    cache_read_tokens: turn.usage.cache_read_tokens,
                    commands: u32::try_from(commands).unwrap_or(u32::MAX),
                })
            })
            .collect()
    }
}

/// Ids of the tool calls of a turn that may run: the first `maxToolCalls` well-formed shell
/// calls, in order.
pub fn granted_tool_uses<'a>(turn: &Turn<'a>, max_tool_calls: u32) -> Vec<&'a str> {
    turn.tool_uses()
        .filter(|tool_use| tool_use.command().is_some())
        .take(usize::try_from(max_tool_calls).unwrap_or(usize::MAX))
        .map(|tool_use| tool_use.id)
        .collect()
}

/// The result block the model sees for one tool call.
fn tool_result(
    turn: &Turn<'_>,
    granted: &[&str],
    tool_use: ToolUse<'_>,
    max_tool_calls: u32,
) -> ContentBlock {
    let (content, is_error) = if tool_use.command().is_none() {
        (
            format!(
                "not run: the only tool is `{SHELL_TOOL}`, and it takes {{\"command\": \"<shell command line>\"}}"
            ),
            true,
        )
    } else if !granted.contains(&tool_use.id) {
        (
            format!(
                "not run: this turn already ran {max_tool_calls} commands (maxToolCalls); answer with what you have"
            ),
            true,
        )
    } else {
        match turn.results.get(tool_use.id) {
            Some(CommandResult::Ran(output)) => (render_output(output), false),
            Some(CommandResult::Failed(error)) => (format!("the command failed: {error}"), true),
            None => ("the command has not run yet".to_string(), true),
        }
    };
    ContentBlock::ToolResult {
        tool_use_id: tool_use.id.to_string(),
        content,
        is_error,
    }
}

/// A command's output as text for the model.
pub fn render_output(output: &ExecOutput) -> String {
    let status = match output.exit_code {
        _ if output.timed_out => "timed out and was killed".to_string(),
        Some(code) => format!("exit code {code}"),
        None => "killed by a signal".to_string(),
    };
    let mut text = status;
    for (name, stream) in [("stdout", &output.stdout), ("stderr", &output.stderr)] {
        if stream.bytes.is_empty() {
            continue;
        }
        let shown = &stream.bytes[..stream.bytes.len().min(MODEL_OUTPUT_CAP)];
        text.push_str(&format!("\n{name}:\n{}", String::from_utf8_lossy(shown)));
        if stream.truncated || shown.len() < stream.bytes.len() {
            text.push_str(&format!("\n[{name} truncated]"));
        }
    }
    text
}

//! Replay: folds a run's journal into what the run knows — its sandbox, its turns, the
//! conversation so far and what it has spent. The decider and the run's status both read
//! the journal only through this fold, so a live run and a replayed one see the same thing.

use std::collections::HashMap;

use jiff::Timestamp;

use crate::catalog::Family;
use crate::cost::Usage;
use crate::journal::{Intent, Outcome, Step};
use crate::lifecycle::RunPhase;
use crate::model::{ChatMessage, ContentBlock, Messages, ModelResponse, Role};
use crate::money::Usd;
use crate::resource::{ChosenBy, TurnStatus};
use crate::sandbox::{ExecOutput, SandboxInfo};
use crate::store::InboxMessage;

/// The name of the one tool a run offers: a shell in its sandbox.
pub const SHELL_TOOL: &str = "shell";
/// Bytes of framing the prompt-token bound counts per message and per content block.
pub const MESSAGE_OVERHEAD_BYTES: u64 = 32;
/// Bytes of each output stream a command result shows the model.
pub const MODEL_OUTPUT_CAP: usize = 16 * 1024;

/// The run's sandbox, as the journal tells it.
#[derive(Debug, Clone, PartialEq)]
pub enum SandboxState {
    /// Not created yet.
    NotCreated,
    /// Creation failed for good.
    Failed(String),
    /// Created and not deleted.
    Live(SandboxInfo),
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
pub struct Route {
    /// The model id.
    pub model: String,
    /// Its family.
    pub family: Option<Family>,
    /// How it was chosen.
    pub chosen_by: ChosenBy,
}

/// A finished model call.
#[derive(Debug, Clone, PartialEq)]
pub enum Call {
    /// The model replied.
    Replied {
        /// The model.
        model: String,
        /// The reply.
        response: ModelResponse,
    },
    /// The call failed.
    Failed {
        /// What happened.
        error: String,
        /// A person recorded an uncertain call as failed; the run goes on.
        by_resolution: bool,
    },
}

/// A finished command.
#[derive(Debug, Clone, PartialEq)]
pub enum CommandResult {
    /// It ran.
    Ran(ExecOutput),
    /// It could not run, or a person recorded an uncertain one as failed.
    Failed(String),
}

/// A well-formed shell call the model asked for in a turn.
#[derive(Debug, Clone, PartialEq)]
pub struct AskedCommand {
    /// The tool-call id.
    pub id: String,
    /// The shell command line.
    pub command: String,
}

/// One turn: a prompt and the work that answers it.
#[derive(Debug, Clone, PartialEq)]
pub struct Turn {
    /// Where the prompt came from.
    pub prompt: Prompt,
    /// The model chosen by routing.
    pub route: Option<Route>,
    /// Routing failed for good (no model for the family).
    pub route_failed: Option<String>,
    /// Finished model calls, in order.
    pub calls: Vec<Call>,
    /// Finished commands, by tool-call id.
    pub results: HashMap<String, CommandResult>,
    /// Whether the answer is recorded.
    pub answered: bool,
    /// What the turn cost.
    pub cost: Usd,
    /// Tokens over the turn's calls (routing included).
    pub usage: Usage,
    /// Whether the turn's last journaled model call offered the shell tool (`None`: no call
    /// yet). A call whose outcome was superseded counts: it was made.
    pub last_call_tools: Option<bool>,
    /// The well-formed shell calls the model asked for in this turn, in order.
    commands: Vec<AskedCommand>,
    /// How many of `commands`, from the first, have a result.
    finished: usize,
    /// How many commands ran (a result that is not a failure).
    ran: u32,
    /// The sizes of the turn's messages, for the bound of a prompt's tokens.
    sizes: Sizes,
    /// The turn's messages that can no longer change, as the model sees them (its prompt
    /// aside): the replies of `calls[..done_calls]` and their results, every command of which
    /// has its result. A request shares them instead of rendering them again.
    done: Messages,
    /// How many of `calls`, from the first, `done` holds.
    done_calls: usize,
    /// The well-formed shell calls in `done` (all of them ran when this is at most the
    /// turn's `maxToolCalls`; a request renders the turn anew otherwise).
    done_commands: usize,
    /// A fork's input: a user message after the results of `calls[.0]` (the last call its
    /// inherited steps hold), as the conversation shows it.
    fork_input: Option<(usize, String)>,
}

/// Bytes ([`block_bytes`], and [`MESSAGE_OVERHEAD_BYTES`] per message) of a turn's model
/// replies and tool results as the conversation gives them to the model, kept as the journal
/// is folded so that bounding a prompt does not render the whole conversation again. A tool
/// call's result counts its largest placeholder until its command's result is folded.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Sizes {
    /// The turn's replies and their results.
    pub messages: u64,
    /// The results message after the turn's last reply (0 when it asked for no tool).
    pub after_last_reply: u64,
    /// The counted size of each result not folded yet, with the number of its reply.
    pending: HashMap<String, (u64, u32)>,
    /// Replies so far.
    replies: u32,
}

impl Sizes {
    fn reply(&mut self, response: &ModelResponse) {
        self.replies = self.replies.saturating_add(1);
        let assistant =
            response.content.iter().map(block_bytes).sum::<u64>() + MESSAGE_OVERHEAD_BYTES;
        let mut results = 0;
        for tool_use in tool_uses_of(response) {
            let pending = pending_result_bytes(tool_use.id);
            results += pending;
            self.pending
                .insert(tool_use.id.to_string(), (pending, self.replies));
        }
        if results > 0 {
            results += MESSAGE_OVERHEAD_BYTES;
        }
        self.messages += assistant + results;
        self.after_last_reply = results;
    }

    fn result(&mut self, id: &str, result: &CommandResult) {
        let Some((pending, reply)) = self.pending.remove(id) else {
            return;
        };
        let actual = result_bytes(id, result_content(Some(result)));
        self.messages = self.messages.saturating_sub(pending) + actual;
        if reply == self.replies {
            self.after_last_reply = self.after_last_reply.saturating_sub(pending) + actual;
        }
    }
}

impl Turn {
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
            last_call_tools: None,
            commands: Vec::new(),
            finished: 0,
            ran: 0,
            sizes: Sizes::default(),
            done: Messages::new(),
            done_calls: 0,
            done_commands: 0,
            fork_input: None,
        }
    }

    /// Move the replies whose tool calls all have their result (or are not shell calls) into
    /// `done`, in order, rendered as a request shows them.
    fn advance_done(&mut self) {
        let Turn {
            calls,
            results,
            done,
            done_calls,
            done_commands,
            fork_input,
            ..
        } = self;
        while let Some(call) = calls.get(*done_calls) {
            if let Call::Replied { response, .. } = call {
                let finished = tool_uses_of(response).all(|tool_use| {
                    tool_use.command().is_none() || results.contains_key(tool_use.id)
                });
                if !finished {
                    break;
                }
                let (reply, answers) = reply_messages(response, results, |_| true, 0);
                *done_commands += tool_uses_of(response)
                    .filter(|tool_use| tool_use.command().is_some())
                    .count();
                done.push(reply);
                let answers = with_fork_input(answers, fork_input.as_ref(), *done_calls);
                if let Some(answers) = answers {
                    done.push(answers);
                }
            }
            *done_calls += 1;
        }
    }

    /// Show a fork's input after the results of the turn's last call so far: in the
    /// conversation, and in the sizes that bound a prompt's tokens.
    fn place_fork_input(&mut self, text: String) {
        let bytes = block_bytes(&ContentBlock::Text { text: text.clone() });
        let after = self.calls.len().saturating_sub(1);
        // A message of its own when that call's results are not rendered as one.
        let own_message = !self.calls.get(after).is_some_and(|call| {
            matches!(call, Call::Replied { response, .. } if tool_uses_of(response).next().is_some())
        });
        let added = bytes
            + if own_message {
                MESSAGE_OVERHEAD_BYTES
            } else {
                0
            };
        self.sizes.messages += added;
        self.sizes.after_last_reply += added;
        self.fork_input = Some((after, text));
        // `done` may hold that call already: render it again with the input.
        self.reset_done();
        self.advance_done();
    }

    /// Forget `done` (a command's result changed): it is rendered again from the start.
    fn reset_done(&mut self) {
        self.done = Messages::new();
        self.done_calls = 0;
        self.done_commands = 0;
    }

    /// The sizes of the turn's replies and results.
    pub fn sizes(&self) -> &Sizes {
        &self.sizes
    }

    /// The last reply of the turn.
    pub fn last_reply(&self) -> Option<&ModelResponse> {
        self.calls.iter().rev().find_map(|call| match call {
            Call::Replied { response, .. } => Some(response),
            Call::Failed { .. } => None,
        })
    }

    /// The well-formed shell calls the model asked for in this turn, in order.
    pub fn commands(&self) -> &[AskedCommand] {
        &self.commands
    }

    /// The first command that may run (one of the first `max_tool_calls`) and has no result
    /// yet. Commands are carried out in order, so this is found without a scan.
    pub fn next_command(&self, max_tool_calls: u32) -> Option<&AskedCommand> {
        let granted = usize::try_from(max_tool_calls).unwrap_or(usize::MAX);
        self.commands[..self.commands.len().min(granted)]
            .iter()
            .skip(self.finished)
            .find(|asked| !self.results.contains_key(&asked.id))
    }

    fn advance_finished(&mut self) {
        while self
            .commands
            .get(self.finished)
            .is_some_and(|asked| self.results.contains_key(&asked.id))
        {
            self.finished += 1;
        }
    }
}

/// The tool calls of one reply, in order.
pub(crate) fn tool_uses_of(response: &ModelResponse) -> impl Iterator<Item = ToolUse<'_>> + '_ {
    response.content.iter().filter_map(|block| match block {
        ContentBlock::ToolUse { id, name, input } => Some(ToolUse {
            id: id.as_str(),
            name: name.as_str(),
            input,
        }),
        _ => None,
    })
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

/// What the journal says, folded. It folds one step at a time ([`Replay::apply`]), so a
/// live run keeps its fold and adds each new step or outcome to it instead of folding the
/// whole journal again: a run's work per step does not grow with its length.
#[derive(Debug, Clone, PartialEq)]
pub struct Replay {
    /// The sandbox.
    pub sandbox: SandboxState,
    /// The turns, the input's first.
    pub turns: Vec<Turn>,
    /// Model and routing spend.
    pub spent: Usd,
    /// The last inbox message taken as a prompt (0: none).
    pub last_message_read: u64,
    /// A step with an intent and no outcome.
    pub open_step: Option<Step>,
    /// How the run ends, once its sandbox deletion is recorded.
    pub ended: Option<RunPhase>,
    /// When the run's first step started (its timeout counts from then).
    pub started_at: Option<Timestamp>,
    /// How many steps the journal holds (the next step's sequence number).
    pub steps: u32,
    /// The post-run action's outcome, once recorded: whether it succeeded.
    pub post_run_action: Option<bool>,
    /// For a fork: the steps it inherited from its source, which this run never carried out.
    pub fork: Option<Inherited>,
    /// For a fork with an input: the message, until its last inherited step places it.
    fork_input: Option<String>,
}

/// What a fork's fold does with the steps it inherited ([`Replay::forked`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Inherited {
    /// The last inherited step: steps up to it were the source's. After it, the turn under
    /// way is routed again: the fork may run another agent (its model, its families).
    pub through: u32,
}

impl Inherited {
    /// Whether step `seq` is inherited.
    pub fn covers(&self, seq: u32) -> bool {
        seq <= self.through
    }
}

impl Default for Replay {
    fn default() -> Self {
        Replay {
            sandbox: SandboxState::NotCreated,
            turns: vec![Turn::new(Prompt::Input)],
            spent: Usd::ZERO,
            last_message_read: 0,
            open_step: None,
            ended: None,
            started_at: None,
            steps: 0,
            post_run_action: None,
            fork: None,
            fork_input: None,
        }
    }
}

impl Replay {
    /// Fold a journal.
    pub fn of(journal: &[Step]) -> Self {
        let mut replay = Replay::default();
        for step in journal {
            replay.apply(step);
        }
        replay
    }

    /// Fold a fork's journal: its inherited steps show as the source's (the conversation,
    /// the turns and their costs) but neither count toward what this run spent (they are not
    /// charged again) nor leave it a sandbox (it makes its own, from the snapshot).
    /// With `input`, the conversation shows it as a user message after the last inherited
    /// step's results.
    pub fn forked(journal: &[Step], fork: Inherited, input: Option<String>) -> Self {
        let mut replay = Replay {
            fork: Some(fork),
            fork_input: input,
            ..Replay::default()
        };
        for step in journal {
            replay.apply(step);
        }
        replay
    }

    /// Fold one step more: a new step (its sequence number is [`steps`](Replay::steps)),
    /// with or without its outcome, or the outcome of the open step.
    pub fn apply(&mut self, step: &Step) {
        if step.seq >= self.steps {
            self.steps = step.seq.saturating_add(1);
            if self.started_at.is_none() {
                self.started_at = Some(step.started_at);
            }
        } else if self
            .open_step
            .as_ref()
            .is_some_and(|open| open.seq == step.seq)
        {
            self.open_step = None;
        }
        let Some(outcome) = step.outcome() else {
            self.open_step = Some(step.clone());
            return;
        };
        match self.fork.filter(|fork| fork.covers(step.seq)) {
            None => self.record(&step.intent, outcome),
            Some(fork) => {
                let spent = self.spent;
                let sandbox = self.sandbox.clone();
                self.record(&step.intent, outcome);
                self.spent = spent;
                self.sandbox = sandbox;
                if step.seq == fork.through
                    && let Some(turn) = self.turns.last_mut()
                {
                    turn.route = None;
                    if let Some(text) = self.fork_input.take() {
                        turn.place_fork_input(text);
                    }
                }
            }
        }
    }

    /// How the run ends, once its journal holds the deletion of its sandbox, done or under
    /// way (the open step): from then on the run reads no more messages.
    pub fn ending(&self) -> Option<RunPhase> {
        self.ended
            .or(match self.open_step.as_ref().map(|step| &step.intent) {
                Some(Intent::DestroySandbox { then, .. }) => Some(*then),
                _ => None,
            })
    }

    /// The step with this sequence number, when it is the open one.
    pub fn open(&self, seq: u32) -> Option<&Step> {
        self.open_step.as_ref().filter(|step| step.seq == seq)
    }

    fn turn_mut(&mut self, turn: u32) -> Option<&mut Turn> {
        self.turns.get_mut(usize::try_from(turn).ok()?)
    }

    fn record(&mut self, intent: &Intent, outcome: &Outcome) {
        if let Intent::CallModel { turn, tools, .. } = intent
            && let Some(turn) = self.turn_mut(*turn)
        {
            turn.last_call_tools = Some(*tools);
        }
        match (intent, outcome) {
            (_, Outcome::Superseded) => {}
            (Intent::CreateSandbox { .. }, Outcome::SandboxCreated { info }) => {
                self.sandbox = SandboxState::Live(info.clone());
            }
            (Intent::CreateSandbox { .. }, Outcome::Failed { error, .. }) => {
                self.sandbox = SandboxState::Failed(error.clone());
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
                        model: model.clone(),
                        family: *family,
                        chosen_by: *chosen_by,
                    });
                    turn.cost = turn.cost.saturating_add(*cost_usd);
                    turn.usage = turn.usage.plus(usage.unwrap_or_default());
                }
            }
            (Intent::Route { turn }, Outcome::Failed { error, .. }) => {
                if let Some(turn) = self.turn_mut(*turn) {
                    turn.route_failed = Some(error.clone());
                }
            }
            (
                Intent::CallModel { turn, model, .. },
                Outcome::ModelReplied { response, cost_usd },
            ) => {
                self.spent = self.spent.saturating_add(*cost_usd);
                if let Some(turn) = self.turn_mut(*turn) {
                    turn.commands
                        .extend(tool_uses_of(response).filter_map(|tool_use| {
                            Some(AskedCommand {
                                id: tool_use.id.to_string(),
                                command: tool_use.command()?.to_string(),
                            })
                        }));
                    turn.sizes.reply(response);
                    turn.calls.push(Call::Replied {
                        model: model.clone(),
                        response: response.clone(),
                    });
                    turn.cost = turn.cost.saturating_add(*cost_usd);
                    turn.usage = turn.usage.plus(response.usage);
                    turn.advance_finished();
                    turn.advance_done();
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
                        error: error.clone(),
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
                    Outcome::CommandFinished {
                        output,
                        remade_sandbox,
                    } => {
                        if let Some(info) = remade_sandbox {
                            self.sandbox = SandboxState::Live(info.clone());
                        }
                        CommandResult::Ran(output.clone())
                    }
                    Outcome::Failed { error, .. } | Outcome::Stopped { reason: error } => {
                        CommandResult::Failed(error.clone())
                    }
                    _ => return,
                };
                if let Some(turn) = self.turn_mut(*turn) {
                    let ran = matches!(result, CommandResult::Ran(_));
                    turn.sizes.result(tool_use_id, &result);
                    let changed = turn
                        .results
                        .get(tool_use_id)
                        .is_some_and(|before| *before != result);
                    let before = turn.results.insert(tool_use_id.clone(), result);
                    let ran_before = matches!(before, Some(CommandResult::Ran(_)));
                    match (ran_before, ran) {
                        (false, true) => turn.ran = turn.ran.saturating_add(1),
                        (true, false) => turn.ran = turn.ran.saturating_sub(1),
                        _ => {}
                    }
                    if changed {
                        turn.reset_done();
                    }
                    turn.advance_finished();
                    turn.advance_done();
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
            (Intent::PostRunAction { .. }, Outcome::Failed { .. }) => {
                self.post_run_action = Some(false);
            }
            (Intent::PostRunAction { .. }, _) => self.post_run_action = Some(true),
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

    /// The prompt of a turn: the run's first prompt, or the message it read (a message the
    /// retention sweep removed says so).
    pub fn prompt_of(&self, turn: u32, first_prompt: &str, inbox: &[InboxMessage]) -> String {
        let prompt = self
            .turns
            .get(usize::try_from(turn).unwrap_or(usize::MAX))
            .map_or(Prompt::Input, |t| t.prompt);
        prompt_text(prompt, first_prompt, inbox)
    }

    /// [`block_bytes`] of a turn's prompt message, with its framing.
    pub fn prompt_bytes(&self, turn: &Turn, first_prompt: &str, inbox: &[InboxMessage]) -> u64 {
        block_bytes(&ContentBlock::Text {
            text: prompt_text(turn.prompt, first_prompt, inbox),
        }) + MESSAGE_OVERHEAD_BYTES
    }

    /// The conversation so far, as the model sees it. Each turn's messages that can no
    /// longer change are shared from the fold; its prompt (read from `inbox` now, as a
    /// message the retention sweep removed says so) and the replies whose commands have not
    /// all run yet are rendered here.
    pub fn conversation(
        &self,
        first_prompt: &str,
        inbox: &[InboxMessage],
        max_tool_calls: u32,
    ) -> Messages {
        let mut messages = Messages::new();
        let granted = usize::try_from(max_tool_calls).unwrap_or(usize::MAX);
        for turn in &self.turns {
            let mut fresh = vec![prompt_message(turn.prompt, first_prompt, inbox)];
            // The well-formed shell calls seen so far in the turn: the first `granted` run.
            let (from, mut commands) = if turn.done_commands <= granted {
                messages.extend(fresh.drain(..));
                messages.append(&turn.done);
                (turn.done_calls, turn.done_commands)
            } else {
                (0, 0)
            };
            for (index, call) in turn.calls.iter().enumerate().skip(from) {
                let Call::Replied { response, .. } = call else {
                    continue;
                };
                let is_granted = |_: ToolUse<'_>| {
                    commands += 1;
                    commands <= granted
                };
                let (reply, results) =
                    reply_messages(response, &turn.results, is_granted, max_tool_calls);
                fresh.push(reply);
                fresh.extend(with_fork_input(results, turn.fork_input.as_ref(), index));
            }
            messages.extend(fresh);
        }
        messages
    }

    /// The conversation rendered from the turns alone, as [`conversation`](Replay::conversation)
    /// was before it shared the fold's messages: the reference it is tested against.
    #[cfg(test)]
    pub(crate) fn conversation_rebuilt(
        &self,
        first_prompt: &str,
        inbox: &[InboxMessage],
        max_tool_calls: u32,
    ) -> Vec<ChatMessage> {
        let mut messages = Vec::new();
        let granted = usize::try_from(max_tool_calls).unwrap_or(usize::MAX);
        for turn in &self.turns {
            messages.push(ChatMessage {
                role: Role::User,
                content: vec![ContentBlock::Text {
                    text: prompt_text(turn.prompt, first_prompt, inbox),
                }],
            });
            let mut commands = 0usize;
            for (index, call) in turn.calls.iter().enumerate() {
                let Call::Replied { response, .. } = call else {
                    continue;
                };
                messages.push(ChatMessage {
                    role: Role::Assistant,
                    content: response.content.clone(),
                });
                let results: Vec<ContentBlock> = tool_uses_of(response)
                    .map(|tool_use| {
                        let is_granted = tool_use.command().is_some() && {
                            commands += 1;
                            commands <= granted
                        };
                        let (content, is_error) = if tool_use.command().is_none() {
                            (not_a_shell_call(), true)
                        } else if !is_granted {
                            (over_max_tool_calls(max_tool_calls), true)
                        } else {
                            result_content(turn.results.get(tool_use.id))
                        };
                        ContentBlock::ToolResult {
                            tool_use_id: tool_use.id.to_string(),
                            content,
                            is_error,
                        }
                    })
                    .collect();
                let results = (!results.is_empty()).then_some(ChatMessage {
                    role: Role::User,
                    content: results,
                });
                messages.extend(with_fork_input(results, turn.fork_input.as_ref(), index));
            }
        }
        messages
    }

    /// The status lines of the turns that used a model.
    pub fn turn_statuses(&self) -> Vec<TurnStatus> {
        self.turns.iter().filter_map(Turn::status).collect()
    }

    /// Every turn, the input's first, as people read it (the console's transcript).
    pub fn turn_lines(&self) -> Vec<TurnLine> {
        self.turns
            .iter()
            .map(|turn| TurnLine {
                status: turn.status(),
                last_reply: turn.last_reply().map(ModelResponse::text),
            })
            .collect()
    }
}

impl Turn {
    /// The turn's line of `status.turns`, when it used a model.
    fn status(&self) -> Option<TurnStatus> {
        let (model, family, chosen_by) = match (&self.route, self.calls.first()) {
            (Some(route), _) => (route.model.as_str(), route.family, route.chosen_by),
            (None, Some(Call::Replied { model, .. })) => (model.as_str(), None, ChosenBy::Agent),
            _ => return None,
        };
        Some(TurnStatus {
            model: model.to_string(),
            family,
            chosen_by,
            cost_usd: self.cost,
            input_tokens: self.usage.input_tokens,
            output_tokens: self.usage.output_tokens,
            cache_write_tokens: self.usage.cache_write_tokens,
            cache_read_tokens: self.usage.cache_read_tokens,
            commands: self.ran,
        })
    }
}

/// One turn of a journal as people read it.
#[derive(Debug, Clone, PartialEq)]
pub struct TurnLine {
    /// Its line of `status.turns` (model, how chosen, cost, tokens), when it used a model.
    pub status: Option<TurnStatus>,
    /// The text of its last model reply (its answer, once answered).
    pub last_reply: Option<String>,
}

/// [`Replay::turn_lines`] of a journal: each turn, the input's first.
pub fn turn_lines(journal: &[Step]) -> Vec<TurnLine> {
    Replay::of(journal).turn_lines()
}

/// The text of a prompt.
pub(crate) fn prompt_text(prompt: Prompt, first_prompt: &str, inbox: &[InboxMessage]) -> String {
    match prompt {
        Prompt::Input => first_prompt.to_string(),
        Prompt::Message(seq) => inbox.iter().find(|m| m.seq == seq).map_or_else(
            || "[message no longer stored]".to_string(),
            |m| m.payload.clone(),
        ),
    }
}

/// The prompt message of a turn.
fn prompt_message(prompt: Prompt, first_prompt: &str, inbox: &[InboxMessage]) -> ChatMessage {
    ChatMessage {
        role: Role::User,
        content: vec![ContentBlock::Text {
            text: prompt_text(prompt, first_prompt, inbox),
        }],
    }
}

/// The messages of one reply as the model sees them: the reply, and the results of its tool
/// calls when it made any. `granted` is asked, in order, about each well-formed shell call:
/// whether it is one of the turn's first `max_tool_calls`.
fn reply_messages(
    response: &ModelResponse,
    results: &HashMap<String, CommandResult>,
    mut granted: impl FnMut(ToolUse<'_>) -> bool,
    max_tool_calls: u32,
) -> (ChatMessage, Option<ChatMessage>) {
    let reply = ChatMessage {
        role: Role::Assistant,
        content: response.content.clone(),
    };
    let blocks: Vec<ContentBlock> = tool_uses_of(response)
        .map(|tool_use| {
            let (content, is_error) = if tool_use.command().is_none() {
                (not_a_shell_call(), true)
            } else if !granted(tool_use) {
                (over_max_tool_calls(max_tool_calls), true)
            } else {
                result_content(results.get(tool_use.id))
            };
            ContentBlock::ToolResult {
                tool_use_id: tool_use.id.to_string(),
                content,
                is_error,
            }
        })
        .collect();
    let answers = (!blocks.is_empty()).then_some(ChatMessage {
        role: Role::User,
        content: blocks,
    });
    (reply, answers)
}

/// A call's results message with a fork's input after them when the input follows call
/// `index` (a message of its own when the call asked for no tool).
fn with_fork_input(
    results: Option<ChatMessage>,
    fork_input: Option<&(usize, String)>,
    index: usize,
) -> Option<ChatMessage> {
    let Some((_, text)) = fork_input.filter(|(after, _)| *after == index) else {
        return results;
    };
    let mut message = results.unwrap_or(ChatMessage {
        role: Role::User,
        content: Vec::new(),
    });
    message
        .content
        .push(ContentBlock::Text { text: text.clone() });
    Some(message)
}

pub(crate) fn not_a_shell_call() -> String {
    format!(
        "not run: the only tool is `{SHELL_TOOL}`, and it takes {{\"command\": \"<shell command line>\"}}"
    )
}

pub(crate) fn over_max_tool_calls(max_tool_calls: u32) -> String {
    format!(
        "not run: this turn already ran {max_tool_calls} commands (maxToolCalls); answer with what you have"
    )
}

/// What the model sees of a granted tool call: its result, or that it has not run.
pub(crate) fn result_content(result: Option<&CommandResult>) -> (String, bool) {
    match result {
        Some(CommandResult::Ran(output)) => (render_output(output), false),
        Some(CommandResult::Failed(error)) => (format!("the command failed: {error}"), true),
        None => ("the command has not run yet".to_string(), true),
    }
}

/// Bytes the prompt-token bound counts for a content block: its JSON and its framing.
pub fn block_bytes(block: &ContentBlock) -> u64 {
    serde_json::to_string(block).map_or(0, |json| json.len() as u64) + MESSAGE_OVERHEAD_BYTES
}

/// [`block_bytes`] of a tool call's result block, when it is given.
fn result_bytes(id: &str, content: (String, bool)) -> u64 {
    block_bytes(&ContentBlock::ToolResult {
        tool_use_id: id.to_string(),
        content: content.0,
        is_error: content.1,
    })
}

/// The most [`block_bytes`] a tool call's result block can have before its command ran:
/// any of the texts saying it did not run (or has not yet).
fn pending_result_bytes(id: &str) -> u64 {
    [
        (not_a_shell_call(), true),
        (over_max_tool_calls(u32::MAX), true),
        result_content(None),
    ]
    .into_iter()
    .map(|content| result_bytes(id, content))
    .max()
    .unwrap_or(0)
}

/// A command's output as text for the model.
pub fn render_output(output: &ExecOutput) -> String {
    let status = match output.exit_code {
        _ if output.timed_out => "timed out and was killed".to_string(),
        _ if output.stopped.is_some() => format!(
            "stopped by the sandbox: {}",
            output.stopped.as_deref().unwrap_or_default()
        ),
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

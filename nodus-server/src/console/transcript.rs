//! A run's transcript: the conversation as it happened, read from its journal — the system
//! prompt, each turn's prompt (the input or a message sent to a keep-alive run), each model
//! reply's text, each command as a tool call with its exit code and output, each answer, and
//! the steps a run is parked on with what a person resolves. [`build`] decides what is shown
//! (pure, table-tested); [`render`] writes it, every piece of data through [`Html::text`].

use nodus_core::journal::{Intent, Outcome, Step, StepKind, StepState};
use nodus_core::money::Usd;
use nodus_core::sandbox::ExecOutput;
use nodus_core::store::InboxMessage;
use nodus_core::{TurnLine, turn_lines};

use std::collections::BTreeSet;

use super::html::Html;
use super::pages::action_form;

/// Lines of a command's output shown before the rest is folded behind the step's page.
pub const SHOWN_LINES: usize = 20;
/// Characters of a command's output shown before the rest is folded.
pub const SHOWN_CHARS: usize = 4000;

/// Where a turn's prompt came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PromptSource {
    /// The run's input.
    Input,
    /// A message sent to the run, by its position in the inbox.
    Message(u64),
}

/// What a turn cost and which model served it: the values of `status.turns[]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TurnFacts {
    /// The model that answered the turn.
    pub model: String,
    /// How it was chosen (`jev`, `fallback`, `agent`).
    pub chosen_by: &'static str,
    /// Routing and model calls.
    pub cost: Usd,
    /// Uncached input tokens.
    pub input_tokens: u64,
    /// Output tokens.
    pub output_tokens: u64,
}

/// A command's output as the transcript shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shown {
    /// The first lines (stdout, then stderr).
    pub head: String,
    /// Whether more is on the step's page.
    pub folded: bool,
}

/// How a tool call ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallEnd {
    /// It ran: its exit (a code, a signal, a timeout) and output.
    Ran {
        /// `exit 0`, `timed out`, `killed by a signal`, `stopped: …`.
        exit: String,
        /// Whether the exit code was 0.
        ok: bool,
        /// The output.
        output: Shown,
    },
    /// It could not run, or was stopped as the run ended.
    Failed(String),
    /// Still running.
    Running,
    /// Its outcome is unknown: the run is parked on it.
    Unknown,
}

/// One entry of the transcript, in journal order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Entry {
    /// The agent's system prompt (shown folded).
    System(String),
    /// A turn begins: its prompt, and what the turn cost once it used a model.
    Prompt {
        /// The turn.
        turn: u32,
        /// Input or message.
        source: PromptSource,
        /// The text.
        text: String,
        /// Model, cost and tokens of the turn, when it used a model.
        facts: Option<TurnFacts>,
    },
    /// A model reply's text (absent when the reply only asked for commands).
    Reply {
        /// The model-call step.
        seq: u32,
        /// The model.
        model: String,
        /// What the call cost.
        cost: Usd,
        /// Tokens in (all input-side) and out.
        tokens: (u64, u64),
        /// The text.
        text: String,
    },
    /// A command the model asked for.
    ToolCall {
        /// The command step.
        seq: u32,
        /// The command line.
        command: String,
        /// How it ended.
        end: CallEnd,
    },
    /// A turn's answer recorded.
    Answer {
        /// The turn.
        turn: u32,
        /// The text.
        text: String,
    },
    /// A step that failed (a model call, the sandbox).
    Failed {
        /// The step.
        seq: u32,
        /// Its kind.
        kind: StepKind,
        /// What happened.
        error: String,
    },
    /// A step the run is parked on, and what a person resolves.
    Parked {
        /// The step.
        seq: u32,
        /// Its kind.
        kind: StepKind,
        /// What to decide.
        resolve: &'static str,
    },
}

/// What a person decides for a step of `kind` whose outcome is unknown.
pub fn what_to_resolve(kind: StepKind) -> &'static str {
    match kind {
        StepKind::Command => {
            "the server stopped while this command ran, so whether it changed the sandbox is \
             unknown: retry runs it again, recordFailed tells the model it failed, cancel ends \
             the run"
        }
        StepKind::ModelCall => {
            "the server stopped during this model call on your own key, which may have been \
             charged: retry calls again, recordFailed goes on without it, cancel ends the run"
        }
        _ => {
            "this step's outcome is unknown: retry carries it out again, recordFailed records \
             it failed, cancel ends the run"
        }
    }
}

/// A command's output folded at [`SHOWN_LINES`] lines or [`SHOWN_CHARS`] characters.
pub fn fold(output: &ExecOutput) -> Shown {
    let mut whole = output.stdout.lossy().into_owned();
    let stderr = output.stderr.lossy();
    if !stderr.is_empty() {
        if !whole.is_empty() && !whole.ends_with('\n') {
            whole.push('\n');
        }
        whole.push_str(&stderr);
    }
    let mut head = String::new();
    let mut folded = output.stdout.truncated || output.stderr.truncated;
    for (i, line) in whole.split_inclusive('\n').enumerate() {
        if i >= SHOWN_LINES || head.chars().count() + line.chars().count() > SHOWN_CHARS {
            folded = true;
            break;
        }
        head.push_str(line);
    }
    if head.is_empty() && !whole.is_empty() {
        // One very long line: its first characters.
        head = whole.chars().take(SHOWN_CHARS).collect();
        folded = true;
    }
    Shown { head, folded }
}

fn exit_of(output: &ExecOutput) -> (String, bool) {
    if output.timed_out {
        return ("timed out".to_string(), false);
    }
    if let Some(reason) = &output.stopped {
        return (format!("stopped: {reason}"), false);
    }
    match output.exit_code {
        Some(code) => (format!("exit {code}"), code == 0),
        None => ("killed by a signal".to_string(), false),
    }
}

fn facts_of(lines: &[TurnLine], turn: u32) -> Option<TurnFacts> {
    let status = lines.get(usize::try_from(turn).ok()?)?.status.as_ref()?;
    Some(TurnFacts {
        model: status.model.clone(),
        chosen_by: status.chosen_by.name(),
        cost: status.cost_usd,
        input_tokens: status.input_tokens,
        output_tokens: status.output_tokens,
    })
}

/// Where a run is, for what its steps without an outcome are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunNow {
    /// Going: such a step is under way.
    Going,
    /// Parked in NeedsResolution on such a step, for a person to resolve.
    Parked,
    /// Finished: such a step's outcome will never be known.
    Finished,
}

impl RunNow {
    /// Where the run of `status` is.
    pub fn of(status: &nodus_core::resource::AgentRunStatus) -> Self {
        if status.takes_resolution() {
            RunNow::Parked
        } else if status.is_finished() {
            RunNow::Finished
        } else {
            RunNow::Going
        }
    }
}

/// The transcript of a run: its `journal` (`now`: where the run is, which says whether a
/// step without an outcome is under way, parked on, or ended unknown), the agent's `system`
/// prompt, the run's `input` and its `inbox`.
pub fn build(
    journal: &[Step],
    now: RunNow,
    system: Option<&str>,
    input: &str,
    inbox: &[InboxMessage],
) -> Vec<Entry> {
    let lines = turn_lines(journal);
    let mut entries = Vec::new();
    if let Some(system) = system.filter(|s| !s.is_empty()) {
        entries.push(Entry::System(system.to_string()));
    }
    entries.push(Entry::Prompt {
        turn: 0,
        source: PromptSource::Input,
        text: input.to_string(),
        facts: facts_of(&lines, 0),
    });
    for step in journal {
        let seq = step.seq;
        let kind = step.intent.kind();
        let state = step.state(now != RunNow::Going);
        if now == RunNow::Parked && state == StepState::Uncertain && step.outcome().is_none() {
            entries.push(Entry::Parked {
                seq,
                kind,
                resolve: what_to_resolve(kind),
            });
        }
        match (&step.intent, step.outcome()) {
            (Intent::ReadMessage { turn, message_seq }, _) => entries.push(Entry::Prompt {
                turn: *turn,
                source: PromptSource::Message(*message_seq),
                text: inbox.iter().find(|m| m.seq == *message_seq).map_or_else(
                    || "[message no longer stored]".to_string(),
                    |m| m.payload.clone(),
                ),
                facts: facts_of(&lines, *turn),
            }),
            (
                Intent::CallModel { model, .. },
                Some(Outcome::ModelReplied { response, cost_usd }),
            ) => {
                let text = response.text();
                if !text.is_empty() {
                    entries.push(Entry::Reply {
                        seq,
                        model: model.clone(),
                        cost: *cost_usd,
                        tokens: (response.usage.prompt_tokens(), response.usage.output_tokens),
                        text,
                    });
                }
            }
            (Intent::Command { command, .. }, outcome) => {
                let end = match outcome {
                    Some(Outcome::CommandFinished { output, .. }) => {
                        let (exit, ok) = exit_of(output);
                        CallEnd::Ran {
                            exit,
                            ok,
                            output: fold(output),
                        }
                    }
                    Some(Outcome::Failed { error, .. }) => CallEnd::Failed(error.clone()),
                    Some(Outcome::Stopped { reason }) => {
                        CallEnd::Failed(format!("stopped: {reason}"))
                    }
                    Some(_) => CallEnd::Unknown,
                    None if state == StepState::Started => CallEnd::Running,
                    None => CallEnd::Unknown,
                };
                entries.push(Entry::ToolCall {
                    seq,
                    command: command.clone(),
                    end,
                });
            }
            (Intent::Answer { turn }, Some(Outcome::Answered)) => {
                let text = lines
                    .get(usize::try_from(*turn).unwrap_or(usize::MAX))
                    .and_then(|line| line.last_reply.clone())
                    .unwrap_or_default();
                entries.push(Entry::Answer { turn: *turn, text });
            }
            (_, Some(Outcome::Failed { error, .. })) => entries.push(Entry::Failed {
                seq,
                kind,
                error: error.clone(),
            }),
            _ => {}
        }
    }
    entries
}

fn kind_name(kind: StepKind) -> &'static str {
    match kind {
        StepKind::SandboxCreation => "sandbox creation",
        StepKind::Routing => "routing",
        StepKind::ModelCall => "model call",
        StepKind::Command => "command",
        StepKind::Message => "message",
        StepKind::Answer => "answer",
        StepKind::SandboxDeletion => "sandbox deletion",
        StepKind::PostRunAction => "post-run action",
    }
}

fn step_link(html: &mut Html, base: &str, seq: u32, label: &'static str) {
    html.raw("<a class=\"step-link\" href=\"")
        .text(base)
        .raw("/steps/")
        .text(seq)
        .raw("\">")
        .raw(label)
        .raw(" ")
        .text(seq)
        .raw("</a>");
}

/// The transcript as a list; `base` is the run's page (step links go below it); a command
/// step in `forks` gets a fork-from-here form carrying `csrf`.
pub fn render(html: &mut Html, entries: &[Entry], base: &str, forks: &BTreeSet<u32>, csrf: &str) {
    html.raw("<ol class=\"transcript\" id=\"transcript\">");
    for entry in entries {
        match entry {
            Entry::System(text) => {
                html.raw(
                    "<li class=\"entry system\"><details><summary>System prompt</summary>\
                     <pre class=\"text\">",
                )
                .text(text)
                .raw("</pre></details></li>");
            }
            Entry::Prompt {
                turn,
                source,
                text,
                facts,
            } => {
                html.raw("<li class=\"entry prompt\" data-turn=\"")
                    .text(turn)
                    .raw("\"><div class=\"who\">");
                match source {
                    PromptSource::Input => {
                        html.raw("Input");
                    }
                    PromptSource::Message(seq) => {
                        html.raw("Message ").text(seq);
                    }
                }
                html.raw(" <span class=\"muted\">· turn ")
                    .text(turn)
                    .raw("</span>");
                if let Some(facts) = facts {
                    html.raw(" <span class=\"turn-facts\"><span class=\"model\">")
                        .text(&facts.model)
                        .raw("</span> <span class=\"muted\">(")
                        .text(facts.chosen_by)
                        .raw(")</span> · $<span class=\"cost\">")
                        .text(facts.cost)
                        .raw("</span> · <span class=\"tokens\">")
                        .text(facts.input_tokens)
                        .raw(" in / ")
                        .text(facts.output_tokens)
                        .raw(" out</span></span>");
                }
                html.raw("</div><pre class=\"text\">")
                    .text(text)
                    .raw("</pre></li>");
            }
            Entry::Reply {
                seq,
                model,
                cost,
                tokens,
                text,
            } => {
                html.raw("<li class=\"entry reply\" data-seq=\"")
                    .text(seq)
                    .raw("\"><div class=\"who\">Assistant <span class=\"muted\">")
                    .text(model)
                    .raw(" · $")
                    .text(cost)
                    .raw(" · ")
                    .text(tokens.0)
                    .raw(" in / ")
                    .text(tokens.1)
                    .raw(" out · </span>");
                step_link(html, base, *seq, "step");
                html.raw("</div><pre class=\"text\">")
                    .text(text)
                    .raw("</pre></li>");
            }
            Entry::ToolCall { seq, command, end } => {
                html.raw("<li class=\"entry tool-call\" data-seq=\"")
                    .text(seq)
                    .raw("\"><div class=\"who\">Command ");
                step_link(html, base, *seq, "step");
                html.raw("</div><pre class=\"command\">$ ")
                    .text(command)
                    .raw("</pre>");
                match end {
                    CallEnd::Ran { exit, ok, output } => {
                        html.raw("<p class=\"exit ")
                            .raw(if *ok { "ok" } else { "bad" })
                            .raw("\">")
                            .text(exit)
                            .raw("</p><pre class=\"output\">")
                            .text(&output.head)
                            .raw("</pre>");
                        if output.folded {
                            html.raw("<p class=\"folded\"><a href=\"")
                                .text(base)
                                .raw("/steps/")
                                .text(seq)
                                .raw(
                                    "\">The whole output</a> <span class=\"muted\">(folded \
                                      here)</span></p>",
                                );
                        }
                    }
                    CallEnd::Failed(error) => {
                        html.raw("<p class=\"exit bad\">").text(error).raw("</p>");
                    }
                    CallEnd::Running => {
                        html.raw("<p class=\"exit muted\">running…</p>");
                    }
                    CallEnd::Unknown => {
                        html.raw("<p class=\"exit bad\">outcome unknown</p>");
                    }
                }
                if forks.contains(seq) {
                    action_form(html, base, "fork", csrf);
                    html.raw("<input type=\"hidden\" name=\"atStep\" value=\"")
                        .text(seq)
                        .raw(
                            "\"><button type=\"submit\" class=\"fork\">Fork from here</button>\
                             </form>",
                        );
                }
                html.raw("</li>");
            }
            Entry::Answer { turn, text } => {
                html.raw("<li class=\"entry answer\" data-turn=\"")
                    .text(turn)
                    .raw("\"><div class=\"who\">Answer <span class=\"muted\">· turn ")
                    .text(turn)
                    .raw("</span></div><pre class=\"text\">")
                    .text(text)
                    .raw("</pre></li>");
            }
            Entry::Failed { seq, kind, error } => {
                html.raw("<li class=\"entry failed\" data-seq=\"")
                    .text(seq)
                    .raw("\"><div class=\"who\">Failed: ")
                    .raw(kind_name(*kind))
                    .raw(" ");
                step_link(html, base, *seq, "step");
                html.raw("</div><p class=\"exit bad\">")
                    .text(error)
                    .raw("</p></li>");
            }
            Entry::Parked { seq, kind, resolve } => {
                html.raw("<li class=\"entry parked\" data-seq=\"")
                    .text(seq)
                    .raw("\"><div class=\"who\">Parked on ")
                    .raw(kind_name(*kind))
                    .raw(" ");
                step_link(html, base, *seq, "step");
                html.raw("</div><p class=\"resolve\">To resolve: ")
                    .raw(resolve)
                    .raw(" (the buttons above).</p></li>");
            }
        }
    }
    html.raw("</ol>");
}

#[cfg(test)]
#[path = "transcript_tests.rs"]
mod tests;

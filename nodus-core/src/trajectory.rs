//! A run's trajectory in ATIF (Agent Trajectory Interchange Format, `ATIF-v1.8`), built from
//! its journal: a pure function of the run, its journal and its inbox.
//!
//! The steps, numbered from 1: the system prompt (`source: system`); each prompt (the input,
//! then each message a keepAlive run read; `source: user`); each model call that replied
//! (`source: agent`: its text, its tool calls, and as its observation the result of each call:
//! the command's exit code and output, as the model was shown them, with the command and its
//! exit code in the result's `extra`); each routing decision that cost something or called a
//! model (`source: agent`, `extra.kind: routing`), so that the steps' metrics add up to the
//! run's spend; and each model call that failed (`source: system`). Every step built from a
//! journal step names it in `extra.journal_seq`. Sandbox, answer and post-run action steps
//! have no trajectory step.
//!
//! Money: ATIF wants `cost_usd` as a JSON number. Amounts stay [`Usd`] (exact nano-dollars)
//! in these types and become the nearest double to their exact decimal only when serialized
//! ([`usd_number`]); nothing is computed in floating point, and each number is accompanied by
//! the exact decimal string (`extra.cost_usd_exact`). Totals are summed as `Usd`.
//!
//! After the retention sweep removed a run's payloads, the trajectory keeps its shape, models,
//! token counts, costs, times and exit codes; texts are empty and tool arguments `{}`.

use std::collections::HashMap;

use jiff::Timestamp;
use serde::{Serialize, Serializer};

use crate::cost::Usage;
use crate::journal::{Intent, Outcome, Step};
use crate::money::Usd;
use crate::replay::{self, CommandResult, Prompt};
use crate::resource::AgentRun;
use crate::store::InboxMessage;

/// The ATIF version written.
pub const SCHEMA_VERSION: &str = "ATIF-v1.8";

/// A whole trajectory (ATIF's root object).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Trajectory {
    /// Always [`SCHEMA_VERSION`].
    pub schema_version: &'static str,
    /// The run's uid.
    pub session_id: String,
    /// The agent.
    pub agent: AgentInfo,
    /// The steps, `step_id` from 1.
    pub steps: Vec<TrajectoryStep>,
    /// What the trajectory holds and how it was built.
    pub notes: String,
    /// Totals over the steps.
    pub final_metrics: FinalMetrics,
}

/// ATIF's `agent`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AgentInfo {
    /// The Agent's `project/name`, or `inline` for an agent written into the run.
    pub name: String,
    /// The Agent's resourceVersion when the run was created, or `inline`.
    pub version: String,
    /// The model the agent names (a BYOK agent), else the model of the first reply.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model_name: Option<String>,
    /// The shell tool, in the OpenAI function-calling shape.
    pub tool_definitions: Vec<serde_json::Value>,
    /// `platform` (`nodus`), `project`, `run`.
    pub extra: serde_json::Value,
}

/// Who a step comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Source {
    /// The system prompt, or an event of the run.
    System,
    /// A prompt.
    User,
    /// The agent: a model call.
    Agent,
}

/// One ATIF step.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TrajectoryStep {
    /// Its number, from 1.
    pub step_id: u32,
    /// When it happened (RFC 3339).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timestamp: Option<Timestamp>,
    /// Who it comes from.
    pub source: Source,
    /// The model that replied (agent steps).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model_name: Option<String>,
    /// The text.
    pub message: String,
    /// The tool calls of a reply.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCall>>,
    /// The results of those tool calls.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub observation: Option<Observation>,
    /// Tokens and cost (agent steps).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metrics: Option<Metrics>,
    /// Model calls the step stands for (agent steps: 1).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub llm_call_count: Option<u32>,
    /// Where it comes from in the run.
    pub extra: StepExtra,
}

/// A step's `extra`: where in the run it comes from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StepExtra {
    /// What it is: `system_prompt`, `input`, `message`, `model_call`, `routing`,
    /// `model_call_failed`.
    pub kind: &'static str,
    /// The turn (0: the input's).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub turn: Option<u32>,
    /// The journal step it was built from.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub journal_seq: Option<u32>,
    /// The inbox message a prompt was read from.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message_seq: Option<u64>,
    /// Why the model stopped (`end_turn`, `tool_use`…).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stop_reason: Option<String>,
}

/// One tool call of a reply.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ToolCall {
    /// The model's id for it.
    pub tool_call_id: String,
    /// The tool (`shell`).
    pub function_name: String,
    /// Its input (`{"command": …}`); `{}` when the input was not an object.
    pub arguments: serde_json::Map<String, serde_json::Value>,
}

/// The results of a step's tool calls.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Observation {
    /// One per tool call, in the calls' order.
    pub results: Vec<ObservationResult>,
}

/// The result of one tool call.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ObservationResult {
    /// The tool call's id.
    pub source_call_id: String,
    /// What the model was shown: the exit code and the output (or why it did not run).
    pub content: String,
    /// The command as run.
    pub extra: CommandExtra,
}

/// A tool call's result's `extra`: the command and how it ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CommandExtra {
    /// The journal step that ran it; absent when it did not run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub journal_seq: Option<u32>,
    /// The command line.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
    /// Its exit code; absent when it timed out, was stopped or killed, or did not run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// Whether it ran to an end (whatever its exit code).
    pub ran: bool,
    /// Whether the model was told it failed.
    pub is_error: bool,
}

/// ATIF's per-step `metrics`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Metrics {
    /// Every input-side token: uncached, cache writes and cache reads.
    pub prompt_tokens: u64,
    /// Output tokens.
    pub completion_tokens: u64,
    /// Input tokens read from the prompt cache.
    pub cached_tokens: u64,
    /// What the call cost, as a number of dollars.
    #[serde(serialize_with = "usd_number")]
    pub cost_usd: Usd,
    /// The usage as the provider split it, and the exact cost.
    pub extra: MetricsExtra,
}

/// The exact figures behind [`Metrics`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MetricsExtra {
    /// Uncached input tokens.
    pub input_tokens: u64,
    /// Input tokens written to the prompt cache.
    pub cache_write_tokens: u64,
    /// The cost as an exact decimal string.
    pub cost_usd_exact: Usd,
}

/// ATIF's `final_metrics`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FinalMetrics {
    /// Sum of the steps' `prompt_tokens`.
    pub total_prompt_tokens: u64,
    /// Sum of the steps' `completion_tokens`.
    pub total_completion_tokens: u64,
    /// Sum of the steps' `cached_tokens`.
    pub total_cached_tokens: u64,
    /// Sum of the steps' costs (summed exactly), as a number of dollars.
    #[serde(serialize_with = "usd_number")]
    pub total_cost_usd: Usd,
    /// How many steps.
    pub total_steps: u64,
    /// The exact figures.
    pub extra: MetricsExtra,
}

/// `usd` as the JSON number nearest its exact decimal: the one place money becomes a float.
pub fn usd_number<S: Serializer>(usd: &Usd, serializer: S) -> Result<S::Ok, S::Error> {
    // Parsing the exact decimal gives the correctly rounded double; no arithmetic on floats.
    let number: f64 = usd.to_string().parse().map_err(serde::ser::Error::custom)?;
    serializer.serialize_f64(number)
}

fn metrics(usage: Usage, cost: Usd) -> Metrics {
    Metrics {
        prompt_tokens: usage.prompt_tokens(),
        completion_tokens: usage.output_tokens,
        cached_tokens: usage.cache_read_tokens,
        cost_usd: cost,
        extra: MetricsExtra {
            input_tokens: usage.input_tokens,
            cache_write_tokens: usage.cache_write_tokens,
            cost_usd_exact: cost,
        },
    }
}

fn extra(kind: &'static str) -> StepExtra {
    StepExtra {
        kind,
        turn: None,
        journal_seq: None,
        message_seq: None,
        stop_reason: None,
    }
}

/// The trajectory of `run` (of `project`) from its journal and inbox; `None` for a run with
/// no snapshot of its agent (it never started).
pub fn trajectory(
    project: &str,
    run: &AgentRun,
    journal: &[Step],
    inbox: &[InboxMessage],
) -> Option<Trajectory> {
    let snapshot = run.status.snapshot.as_ref()?;
    let started = run
        .status
        .start_time
        .or_else(|| journal.first().map(|step| step.started_at));
    let first_prompt = crate::decide::first_prompt(run, snapshot);
    let mut steps = vec![
        TrajectoryStep {
            step_id: 0,
            timestamp: started,
            source: Source::System,
            model_name: None,
            message: crate::decide::system_prompt(project, run, snapshot),
            tool_calls: None,
            observation: None,
            metrics: None,
            llm_call_count: None,
            extra: extra("system_prompt"),
        },
        TrajectoryStep {
            step_id: 0,
            timestamp: started,
            source: Source::User,
            model_name: None,
            message: first_prompt.clone(),
            tool_calls: None,
            observation: None,
            metrics: None,
            llm_call_count: None,
            extra: StepExtra {
                turn: Some(0),
                ..extra("input")
            },
        },
    ];
    // The commands' results by (turn, tool-call id); a later step for the same call (a person
    // chose to carry an uncertain one out again) replaces an earlier one.
    let mut ran: HashMap<(u32, &str), (u32, &str, CommandResult)> = HashMap::new();
    // The agent steps with tool calls: (index in `steps`, turn).
    let mut with_calls: Vec<(usize, u32)> = Vec::new();
    for step in journal {
        let Some(completion) = &step.completion else {
            continue;
        };
        let at = Some(completion.finished_at);
        match (&step.intent, &completion.outcome) {
            (Intent::ReadMessage { turn, message_seq }, Outcome::MessageRead) => {
                steps.push(TrajectoryStep {
                    step_id: 0,
                    timestamp: Some(step.started_at),
                    source: Source::User,
                    model_name: None,
                    message: replay::prompt_text(
                        Prompt::Message(*message_seq),
                        &first_prompt,
                        inbox,
                    ),
                    tool_calls: None,
                    observation: None,
                    metrics: None,
                    llm_call_count: None,
                    extra: StepExtra {
                        turn: Some(*turn),
                        journal_seq: Some(step.seq),
                        message_seq: Some(*message_seq),
                        ..extra("message")
                    },
                })
            }
            (
                Intent::Route { turn },
                Outcome::Routed {
                    model,
                    chosen_by,
                    cost_usd,
                    usage,
                    ..
                },
            ) if usage.is_some() || !cost_usd.is_zero() => steps.push(TrajectoryStep {
                step_id: 0,
                timestamp: at,
                source: Source::Agent,
                model_name: None,
                message: format!(
                    "routed turn {turn} to {model} (chosen by {})",
                    chosen_by.name()
                ),
                tool_calls: None,
                observation: None,
                metrics: Some(metrics(usage.unwrap_or_default(), *cost_usd)),
                llm_call_count: Some(1),
                extra: StepExtra {
                    turn: Some(*turn),
                    journal_seq: Some(step.seq),
                    ..extra("routing")
                },
            }),
            (Intent::CallModel { turn, .. }, Outcome::ModelReplied { response, cost_usd }) => {
                let calls: Vec<ToolCall> = replay::tool_uses_of(response)
                    .map(|call| ToolCall {
                        tool_call_id: call.id.to_string(),
                        function_name: call.name.to_string(),
                        arguments: call.input.as_object().cloned().unwrap_or_default(),
                    })
                    .collect();
                if !calls.is_empty() {
                    with_calls.push((steps.len(), *turn));
                }
                steps.push(TrajectoryStep {
                    step_id: 0,
                    timestamp: at,
                    source: Source::Agent,
                    model_name: Some(response.model.clone()),
                    message: response.text(),
                    tool_calls: (!calls.is_empty()).then_some(calls),
                    observation: None,
                    metrics: Some(metrics(response.usage, *cost_usd)),
                    llm_call_count: Some(1),
                    extra: StepExtra {
                        turn: Some(*turn),
                        journal_seq: Some(step.seq),
                        stop_reason: Some(stop_reason(&response.stop_reason)),
                        ..extra("model_call")
                    },
                });
            }
            (Intent::CallModel { turn, model, .. }, Outcome::Failed { error, .. }) => {
                steps.push(TrajectoryStep {
                    step_id: 0,
                    timestamp: at,
                    source: Source::System,
                    model_name: None,
                    message: format!("the call to {model} failed: {error}"),
                    tool_calls: None,
                    observation: None,
                    metrics: None,
                    llm_call_count: None,
                    extra: StepExtra {
                        turn: Some(*turn),
                        journal_seq: Some(step.seq),
                        ..extra("model_call_failed")
                    },
                });
            }
            (
                Intent::Command {
                    turn,
                    tool_use_id,
                    command,
                },
                outcome,
            ) => {
                let result = match outcome {
                    Outcome::CommandFinished { output, .. } => CommandResult::Ran(output.clone()),
                    Outcome::Failed { error, .. } | Outcome::Stopped { reason: error } => {
                        CommandResult::Failed(error.clone())
                    }
                    _ => continue,
                };
                ran.insert((*turn, tool_use_id), (step.seq, command, result));
            }
            _ => {}
        }
    }
    // Each reply's tool calls' results, as the model was shown them.
    let max_tool_calls = snapshot.agent.max_tool_calls;
    let mut shell_calls: HashMap<u32, u32> = HashMap::new();
    for (index, turn) in with_calls {
        let step = &mut steps[index];
        let calls = step.tool_calls.as_deref().unwrap_or_default();
        let results = calls
            .iter()
            .map(|call| {
                let is_shell_call = call.function_name == replay::SHELL_TOOL
                    && call.arguments.get("command").is_some_and(|c| c.is_string());
                let granted = is_shell_call && {
                    let count = shell_calls.entry(turn).or_default();
                    *count = count.saturating_add(1);
                    *count <= max_tool_calls
                };
                let found = ran.get(&(turn, call.tool_call_id.as_str()));
                let (content, is_error) = match found {
                    Some((_, _, result)) => replay::result_content(Some(result)),
                    None if !is_shell_call => (replay::not_a_shell_call(), true),
                    None if !granted => (replay::over_max_tool_calls(max_tool_calls), true),
                    None => replay::result_content(None),
                };
                ObservationResult {
                    source_call_id: call.tool_call_id.clone(),
                    content,
                    extra: CommandExtra {
                        journal_seq: found.map(|(seq, _, _)| *seq),
                        command: found.map(|(_, command, _)| (*command).to_string()),
                        exit_code: match found {
                            Some((_, _, CommandResult::Ran(output)))
                                if !output.timed_out && output.stopped.is_none() =>
                            {
                                output.exit_code
                            }
                            _ => None,
                        },
                        ran: matches!(found, Some((_, _, CommandResult::Ran(_)))),
                        is_error,
                    },
                }
            })
            .collect();
        step.observation = Some(Observation { results });
    }
    let mut total = Usage::default();
    let mut cost = Usd::ZERO;
    for (index, step) in steps.iter_mut().enumerate() {
        step.step_id = u32::try_from(index + 1).unwrap_or(u32::MAX);
        if let Some(metrics) = &step.metrics {
            total = total.plus(Usage {
                input_tokens: metrics.extra.input_tokens,
                output_tokens: metrics.completion_tokens,
                cache_write_tokens: metrics.extra.cache_write_tokens,
                cache_read_tokens: metrics.cached_tokens,
            });
            cost = cost.saturating_add(metrics.cost_usd);
        }
    }
    let model_name = snapshot
        .agent
        .model
        .name
        .clone()
        .or_else(|| steps.iter().find_map(|step| step.model_name.clone()));
    Some(Trajectory {
        schema_version: SCHEMA_VERSION,
        session_id: run.metadata.uid.clone().unwrap_or_default(),
        agent: AgentInfo {
            name: snapshot
                .agent_ref
                .clone()
                .unwrap_or_else(|| "inline".to_string()),
            version: snapshot
                .agent_revision
                .clone()
                .unwrap_or_else(|| "inline".to_string()),
            model_name,
            tool_definitions: vec![tool_definition()],
            extra: serde_json::json!({
                "platform": "nodus",
                "project": project,
                "run": run.name(),
            }),
        },
        final_metrics: FinalMetrics {
            total_prompt_tokens: total.prompt_tokens(),
            total_completion_tokens: total.output_tokens,
            total_cached_tokens: total.cache_read_tokens,
            total_cost_usd: cost,
            total_steps: steps.len() as u64,
            extra: MetricsExtra {
                input_tokens: total.input_tokens,
                cache_write_tokens: total.cache_write_tokens,
                cost_usd_exact: cost,
            },
        },
        steps,
        notes: NOTES.to_string(),
    })
}

const NOTES: &str = "Built by Nodus from the run's journal. Steps: the system prompt, each \
prompt (the input, then each message read), each model call that replied (with its tool calls \
and, as its observation, each command's exit code and output as the model was shown them), each \
routing decision that cost something, and each failed model call; extra.journal_seq names the \
journal step. cost_usd numbers are the nearest doubles to the exact amounts in \
extra.cost_usd_exact; total_cost_usd is the exact sum of the steps' costs.";

/// The shell tool in the OpenAI function-calling shape ATIF asks for.
fn tool_definition() -> serde_json::Value {
    let tool = crate::decide::shell_tool();
    serde_json::json!({
        "type": "function",
        "function": {
            "name": tool.name,
            "description": tool.description,
            "parameters": tool.input_schema,
        }
    })
}

fn stop_reason(reason: &crate::model::StopReason) -> String {
    match serde_json::to_value(reason) {
        Ok(serde_json::Value::String(name)) => name,
        _ => format!("{reason:?}"),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;
    use crate::journal::Completion;
    use crate::model::{ContentBlock, ModelResponse, StopReason};
    use crate::output::Output;
    use crate::resource::ChosenBy;
    use crate::sandbox::ExecOutput;

    fn at(second: i64) -> Timestamp {
        Timestamp::from_second(1_780_000_000 + second).expect("a time")
    }

    fn step(seq: u32, intent: Intent, outcome: Outcome) -> Step {
        Step {
            seq,
            started_at: at(i64::from(seq) * 2),
            intent,
            completion: Some(Completion {
                finished_at: at(i64::from(seq) * 2 + 1),
                outcome,
            }),
        }
    }

    fn usd(text: &str) -> Usd {
        text.parse().expect("an amount")
    }

    fn usage(input: u64, output: u64, write: u64, read: u64) -> Usage {
        Usage {
            input_tokens: input,
            output_tokens: output,
            cache_write_tokens: write,
            cache_read_tokens: read,
        }
    }

    fn shell(id: &str, command: &str) -> ContentBlock {
        ContentBlock::ToolUse {
            id: id.to_string(),
            name: "shell".to_string(),
            input: json!({ "command": command }),
        }
    }

    fn text(text: &str) -> ContentBlock {
        ContentBlock::Text {
            text: text.to_string(),
        }
    }

    fn call(seq: u32, turn: u32, content: Vec<ContentBlock>, used: Usage, cost: &str) -> Step {
        let stop_reason = if content
            .iter()
            .any(|b| matches!(b, ContentBlock::ToolUse { .. }))
        {
            StopReason::ToolUse
        } else {
            StopReason::EndTurn
        };
        step(
            seq,
            Intent::CallModel {
                turn,
                model: "claude-x".to_string(),
                reserved_usd: usd("0.10"),
                tools: true,
            },
            Outcome::ModelReplied {
                response: ModelResponse {
                    model: "claude-x".to_string(),
                    content,
                    stop_reason,
                    usage: used,
                    request_id: None,
                },
                cost_usd: usd(cost),
            },
        )
    }

    fn command(seq: u32, turn: u32, id: &str, line: &str, exit: i32, stdout: &str) -> Step {
        step(
            seq,
            Intent::Command {
                turn,
                tool_use_id: id.to_string(),
                command: line.to_string(),
            },
            Outcome::CommandFinished {
                output: ExecOutput {
                    exit_code: Some(exit),
                    stdout: Output::complete(stdout.as_bytes().to_vec()),
                    stderr: Output::complete(Vec::new()),
                    timed_out: false,
                    stopped: None,
                },
                remade_sandbox: None,
            },
        )
    }

    fn route(seq: u32, turn: u32, cost: &str, used: Option<Usage>) -> Step {
        step(
            seq,
            Intent::Route { turn },
            Outcome::Routed {
                family: None,
                model: "claude-x".to_string(),
                chosen_by: ChosenBy::Jev,
                cost_usd: usd(cost),
                usage: used,
                fallback_reason: None,
            },
        )
    }

    fn run(max_tool_calls: u32) -> AgentRun {
        serde_json::from_value(json!({
            "apiVersion": "nodus.dev/v1",
            "kind": "AgentRun",
            "metadata": {"name": "chat", "project": "default", "uid": "uid-1"},
            "spec": {"agent": "worker", "input": "List the files", "keepAlive": true},
            "status": {
                "startTime": "2026-05-28T20:26:40Z",
                "snapshot": {
                    "agentRef": "default/worker",
                    "agentRevision": "7",
                    "agent": {"system": "Be brief.", "maxToolCalls": max_tool_calls},
                },
            },
        }))
        .expect("a run")
    }

    /// A keepAlive run of two turns: routing that was free and routing that called a model,
    /// a reply with a shell call and a call of a tool that does not exist, a failed call and
    /// a command that exits 1.
    fn journal() -> Vec<Step> {
        vec![
            route(0, 0, "0", None),
            call(
                1,
                0,
                vec![
                    text("Looking."),
                    shell("t1", "ls"),
                    ContentBlock::ToolUse {
                        id: "t2".to_string(),
                        name: "browser".to_string(),
                        input: json!({}),
                    },
                ],
                usage(10, 5, 2, 3),
                "0.000123",
            ),
            command(2, 0, "t1", "ls", 0, "a.txt\n"),
            call(3, 0, vec![text("One file.")], usage(20, 4, 0, 15), "0.0001"),
            step(4, Intent::Answer { turn: 0 }, Outcome::Answered),
            step(
                5,
                Intent::ReadMessage {
                    turn: 1,
                    message_seq: 1,
                },
                Outcome::MessageRead,
            ),
            route(6, 1, "0.000002", Some(usage(1, 1, 0, 0))),
            step(
                7,
                Intent::CallModel {
                    turn: 1,
                    model: "claude-x".to_string(),
                    reserved_usd: usd("0.10"),
                    tools: true,
                },
                Outcome::Failed {
                    error: "overloaded".to_string(),
                    by_resolution: false,
                },
            ),
            call(
                8,
                1,
                vec![shell("t3", "false")],
                usage(30, 2, 0, 0),
                "0.00003",
            ),
            command(9, 1, "t3", "false", 1, ""),
            call(
                10,
                1,
                vec![text("It failed.")],
                usage(40, 3, 0, 0),
                "0.00004",
            ),
        ]
    }

    fn inbox() -> Vec<InboxMessage> {
        vec![InboxMessage {
            seq: 1,
            key: None,
            payload: "Now run false".to_string(),
            received_at: at(9),
        }]
    }

    fn built(run: &AgentRun, journal: &[Step]) -> Value {
        serde_json::to_value(trajectory("default", run, journal, &inbox()).expect("a snapshot"))
            .expect("encodes")
    }

    /// (source, extra.kind, extra.journal_seq, message) of each step.
    fn outline(trajectory: &Value) -> Vec<(String, String, Value, String)> {
        trajectory["steps"]
            .as_array()
            .expect("steps")
            .iter()
            .map(|s| {
                (
                    s["source"].as_str().expect("source").to_string(),
                    s["extra"]["kind"].as_str().expect("kind").to_string(),
                    s["extra"]["journal_seq"].clone(),
                    s["message"].as_str().expect("message").to_string(),
                )
            })
            .collect()
    }

    #[test]
    fn each_prompt_model_call_and_command_is_a_step_in_journal_order() {
        let t = built(&run(50), &journal());
        assert_eq!(t["schema_version"], "ATIF-v1.8");
        assert_eq!(t["session_id"], "uid-1");
        assert_eq!(t["agent"]["name"], "default/worker");
        assert_eq!(t["agent"]["version"], "7");
        assert_eq!(t["agent"]["model_name"], "claude-x");
        assert_eq!(
            t["agent"]["tool_definitions"][0]["function"]["name"],
            "shell"
        );
        let expected: Vec<(&str, &str, Value, &str)> = vec![
            ("system", "system_prompt", Value::Null, "Be brief."),
            ("user", "input", Value::Null, "List the files"),
            ("agent", "model_call", json!(1), "Looking."),
            ("agent", "model_call", json!(3), "One file."),
            ("user", "message", json!(5), "Now run false"),
            (
                "agent",
                "routing",
                json!(6),
                "routed turn 1 to claude-x (chosen by jev)",
            ),
            (
                "system",
                "model_call_failed",
                json!(7),
                "the call to claude-x failed: overloaded",
            ),
            ("agent", "model_call", json!(8), ""),
            ("agent", "model_call", json!(10), "It failed."),
        ];
        let expected: Vec<(String, String, Value, String)> = expected
            .into_iter()
            .map(|(a, b, c, d)| (a.to_string(), b.to_string(), c, d.to_string()))
            .collect();
        assert_eq!(outline(&t), expected);
        let ids: Vec<Value> = t["steps"]
            .as_array()
            .expect("steps")
            .iter()
            .map(|s| s["step_id"].clone())
            .collect();
        assert_eq!(ids, (1..=9).map(|n| json!(n)).collect::<Vec<_>>());

        // The first reply: its tool calls, and what the model was shown of each.
        let first = &t["steps"][2];
        assert_eq!(
            first["tool_calls"],
            json!([
                {"tool_call_id": "t1", "function_name": "shell", "arguments": {"command": "ls"}},
                {"tool_call_id": "t2", "function_name": "browser", "arguments": {}},
            ])
        );
        assert_eq!(
            first["observation"]["results"][0],
            json!({
                "source_call_id": "t1",
                "content": "exit code 0\nstdout:\na.txt\n",
                "extra": {"journal_seq": 2, "command": "ls", "exit_code": 0, "ran": true, "is_error": false},
            })
        );
        assert_eq!(first["observation"]["results"][1]["source_call_id"], "t2");
        assert_eq!(
            first["observation"]["results"][1]["content"],
            replay::not_a_shell_call()
        );
        assert_eq!(
            first["metrics"],
            json!({
                "prompt_tokens": 15,
                "completion_tokens": 5,
                "cached_tokens": 3,
                "cost_usd": 0.000123,
                "extra": {"input_tokens": 10, "cache_write_tokens": 2, "cost_usd_exact": "0.000123"},
            })
        );
        assert_eq!(first["model_name"], "claude-x");
        assert_eq!(first["llm_call_count"], 1);
        assert_eq!(first["extra"]["stop_reason"], "tool_use");
        assert_eq!(first["timestamp"], "2026-05-28T20:26:43Z");
        let failed = &t["steps"][7]["observation"]["results"][0];
        assert_eq!(failed["content"], "exit code 1");
        assert_eq!(failed["extra"]["exit_code"], 1);
        // Steps that are not the agent's carry no agent-only fields.
        for s in t["steps"].as_array().expect("steps") {
            if s["source"] != "agent" {
                for field in ["model_name", "tool_calls", "metrics", "llm_call_count"] {
                    assert!(s.get(field).is_none(), "{s}");
                }
            }
        }

        // The totals: every model and routing call, summed exactly.
        assert_eq!(
            t["final_metrics"],
            json!({
                "total_prompt_tokens": 15 + 35 + 1 + 30 + 40,
                "total_completion_tokens": 5 + 4 + 1 + 2 + 3,
                "total_cached_tokens": 3 + 15,
                "total_cost_usd": 0.000295,
                "total_steps": 9,
                "extra": {"input_tokens": 10 + 20 + 1 + 30 + 40, "cache_write_tokens": 2, "cost_usd_exact": "0.000295"},
            })
        );
        // The same spend and tokens as the run's status reads from its journal.
        let replay = crate::replay::Replay::of(&journal());
        assert_eq!(replay.spent, usd("0.000295"));
        let (prompt, output) = replay.turn_statuses().iter().fold((0, 0), |(p, o), turn| {
            (
                p + turn.input_tokens + turn.cache_write_tokens + turn.cache_read_tokens,
                o + turn.output_tokens,
            )
        });
        assert_eq!(t["final_metrics"]["total_prompt_tokens"], prompt);
        assert_eq!(t["final_metrics"]["total_completion_tokens"], output);
    }

    #[test]
    fn a_shell_call_past_max_tool_calls_shows_what_the_model_was_told() {
        let journal = vec![
            call(
                0,
                0,
                vec![shell("a", "true"), shell("b", "true")],
                usage(1, 1, 0, 0),
                "0.01",
            ),
            command(1, 0, "a", "true", 0, ""),
        ];
        let t = built(&run(1), &journal);
        let results = &t["steps"][2]["observation"]["results"];
        assert_eq!(results[0]["extra"]["ran"], true);
        assert_eq!(results[1]["content"], replay::over_max_tool_calls(1));
        assert_eq!(results[1]["extra"], json!({"ran": false, "is_error": true}));
    }

    #[test]
    fn costs_are_numbers_nearest_their_exact_decimal() {
        for (amount, number) in [
            ("0.000000001", 1e-9),
            ("0.1", 0.1),
            ("12345.678901234", 12_345.678_901_234),
        ] {
            let journal = vec![call(0, 0, vec![text("x")], usage(1, 1, 0, 0), amount)];
            let t = built(&run(50), &journal);
            assert_eq!(
                t["steps"][2]["metrics"]["cost_usd"],
                json!(number),
                "{amount}"
            );
            assert_eq!(
                t["steps"][2]["metrics"]["extra"]["cost_usd_exact"],
                usd(amount).to_string()
            );
            assert_eq!(
                t["final_metrics"]["total_cost_usd"],
                json!(number),
                "{amount}"
            );
        }
    }

    #[test]
    fn after_retention_the_shape_tokens_and_costs_stay() {
        let mut swept = journal();
        for step in &mut swept {
            crate::retention::strip_step(step);
        }
        let before = built(&run(50), &journal());
        let after = built(&run(50), &swept);
        assert_eq!(after["final_metrics"], before["final_metrics"]);
        assert_eq!(after["steps"].as_array().map(Vec::len), Some(9));
        let first = &after["steps"][2];
        assert_eq!(first["message"], "");
        assert_eq!(first["tool_calls"][0]["arguments"], json!({}));
        assert_eq!(first["metrics"], before["steps"][2]["metrics"]);
    }

    #[test]
    fn a_run_without_a_snapshot_has_none() {
        let mut run = run(50);
        run.status.snapshot = None;
        assert!(trajectory("default", &run, &journal(), &inbox()).is_none());
    }
}

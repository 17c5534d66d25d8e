//! The decider: a pure function from a run's journal, inbox and clock to its next decision.
//!
//! Live execution and replay are the same code: the executor asks [`decide`] what to do,
//! carries that out, journals it and asks again. After a restart the journal already holds
//! the completed steps, so the decider moves on from where the run was; a completed step is
//! never decided again.

use jiff::{SignedDuration, Timestamp};

use crate::catalog::Catalog;
use crate::cost::{self, CostGuard};
use crate::journal::{Intent, Outcome, Step};
use crate::lifecycle::{CancelReason, FailReason, RunPhase, WaitReason};
use crate::model::{ChatMessage, ContentBlock, ToolSpec};
use crate::money::Usd;
use crate::replay::{Call, Replay, SandboxState, granted_tool_uses};
use crate::resource::{Access, AgentRunSpec, AgentSpec};
use crate::sandbox::SandboxSpec;
use crate::store::InboxMessage;

/// Tokens a tool-using request may add beyond its visible content (the provider's own tool
/// instructions), and tokens of framing per message; both generous.
const TOOL_OVERHEAD_TOKENS: u64 = 2048;
const MESSAGE_OVERHEAD_TOKENS: u64 = 32;

/// Everything the decider looks at.
#[derive(Debug, Clone, Copy)]
pub struct RunInput<'a> {
    /// The agent as the run snapshotted it.
    pub agent: &'a AgentSpec,
    /// The run's spec.
    pub spec: &'a AgentRunSpec,
    /// The sandbox to create.
    pub sandbox: &'a SandboxSpec,
    /// The system prompt (the agent's, with the run's context).
    pub system: &'a str,
    /// The first turn's prompt (the input, or the agent's default input).
    pub first_prompt: &'a str,
    /// The journal so far.
    pub journal: &'a [Step],
    /// The inbox.
    pub inbox: &'a [InboxMessage],
    /// Now.
    pub now: Timestamp,
    /// A cancellation someone asked for.
    pub cancel: Option<CancelReason>,
    /// Whether the conversation was closed: a keepAlive run then succeeds after its turn
    /// instead of waiting for messages.
    pub close: bool,
    /// Model ids and prices.
    pub catalog: &'a Catalog,
    /// The most one routing call can cost.
    pub router_max_cost: Usd,
    /// The post-run action chosen when the run was created (`None` for `agents.noop`).
    pub post_run_action: Option<&'a crate::resource::PostRunAction>,
}

/// What the run does next.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// Journal this intent, carry it out, journal its outcome.
    Act(Intent),
    /// Carry out again the interrupted step with this sequence number (it is safe to).
    Repeat(u32),
    /// Park on the interrupted step with this sequence number: its outcome is uncertain and
    /// repeating it may not be safe.
    Park(u32),
    /// The run is ending while this step is interrupted: record it as failed.
    Abandon {
        /// The step.
        seq: u32,
        /// Why.
        error: String,
    },
    /// Hold the sandbox and make no calls until woken (a message, funds) or until `until`.
    Wait {
        /// Why.
        reason: WaitReason,
        /// When the run must look again (its deadline), if ever.
        until: Option<Timestamp>,
    },
    /// The run is over.
    Finish(RunPhase),
}

/// The tool every run offers.
pub fn shell_tool() -> ToolSpec {
    ToolSpec {
        name: crate::replay::SHELL_TOOL.to_string(),
        description: "Run a shell command line (sh -c) in your sandbox's working directory \
                      and get its exit code, stdout and stderr."
            .to_string(),
        input_schema: serde_json::json!({
            "type": "object",
            "properties": {"command": {"type": "string", "description": "The command line."}},
            "required": ["command"]
        }),
    }
}

/// When the run must end: its deadline or the end of its timeout (from its first step),
/// whichever is first. The default timeout bounds only a run without a deadline: a deadline
/// the user set is the run's lifetime, even a longer one.
pub fn time_limit(spec: &AgentRunSpec, journal: &[Step]) -> Option<(Timestamp, FailReason)> {
    let timeout = match (spec.timeout, spec.deadline) {
        (Some(timeout), _) => timeout,
        (None, None) => AgentRunSpec::DEFAULT_TIMEOUT,
        (None, Some(deadline)) => return Some((deadline, FailReason::DeadlineExceeded)),
    };
    let timeout_end = journal.first().and_then(|first| {
        let seconds = i64::try_from(timeout.as_secs()).ok()?;
        first
            .started_at
            .checked_add(SignedDuration::from_secs(seconds))
            .ok()
    });
    match (spec.deadline, timeout_end) {
        (Some(deadline), Some(end)) if end < deadline => Some((end, FailReason::TimeoutExceeded)),
        (Some(deadline), _) => Some((deadline, FailReason::DeadlineExceeded)),
        (None, Some(end)) => Some((end, FailReason::TimeoutExceeded)),
        (None, None) => None,
    }
}

/// How the run ends now, if it does: a cancellation recorded on it (`cancel`), or its time
/// limit passed. The decider ends the run then; the executor also asks while a command runs,
/// and stops the command when the answer is `Some`.
pub fn ending(
    spec: &AgentRunSpec,
    journal: &[Step],
    cancel: Option<CancelReason>,
    now: Timestamp,
) -> Option<RunPhase> {
    cancel.map(RunPhase::Cancelled).or_else(|| {
        time_limit(spec, journal)
            .filter(|(at, _)| now >= *at)
            .map(|(_, reason)| RunPhase::Failed(reason))
    })
}

/// Decide the run's next move.
pub fn decide(input: &RunInput<'_>) -> Decision {
    let replay = Replay::of(input.journal);
    if let Some(then) = replay.ended {
        return Decision::Finish(then);
    }
    let limit = time_limit(input.spec, input.journal);
    let ending = ending(input.spec, input.journal, input.cancel, input.now);
    let byok = input.agent.model.access == Access::Byok;

    if let Some(step) = replay.open_step {
        return match ending {
            Some(end) if !matches!(step.intent, Intent::DestroySandbox { .. }) => {
                Decision::Abandon {
                    seq: step.seq,
                    error: format!("interrupted, and the run is ending ({end})"),
                }
            }
            _ if step.intent.safe_to_repeat(byok) => Decision::Repeat(step.seq),
            _ => Decision::Park(step.seq),
        };
    }
    if let Some(end) = ending {
        return terminate(&replay, end);
    }

    match replay.sandbox {
        SandboxState::NotCreated => {
            return Decision::Act(Intent::CreateSandbox {
                spec: input.sandbox.clone(),
            });
        }
        SandboxState::Failed(_) => {
            return Decision::Finish(RunPhase::Failed(FailReason::SandboxFailed));
        }
        SandboxState::Live(_) | SandboxState::Gone => {}
    }

    let turn_index = replay.current_turn();
    let Some(turn) = replay.turns.last() else {
        return Decision::Finish(RunPhase::Failed(FailReason::ModelCallFailed));
    };
    let mut guard = CostGuard::new(
        (!byok).then_some(input.agent.per_run_max_cost_usd),
        replay.spent,
    );
    let wait_max_cost = Decision::Wait {
        reason: WaitReason::MaxCostReached,
        until: limit.map(|(at, _)| at),
    };

    // Routing: platform access only; a BYOK agent names its model.
    let model = if byok {
        input.agent.model.name.clone().unwrap_or_default()
    } else {
        if turn.route_failed.is_some() {
            return terminate(&replay, RunPhase::Failed(FailReason::ModelCallFailed));
        }
        match &turn.route {
            Some(route) => route.model.to_string(),
            None => {
                if guard.reserve(input.router_max_cost).is_err() {
                    return wait_max_cost;
                }
                return Decision::Act(Intent::Route { turn: turn_index });
            }
        }
    };

    // The model loop of the turn.
    if let Some(Call::Failed {
        by_resolution: false,
        ..
    }) = turn.calls.last()
    {
        return terminate(&replay, RunPhase::Failed(FailReason::ModelCallFailed));
    }
    let max_tool_calls = input.agent.max_tool_calls;
    let granted = granted_tool_uses(turn, max_tool_calls);
    let last_reply = turn.calls.last().and_then(|call| match call {
        Call::Replied { response, .. } => Some(*response),
        Call::Failed { .. } => None,
    });
    let budget_used = turn.tool_uses().filter(|t| t.command().is_some()).count()
        >= usize::try_from(max_tool_calls).unwrap_or(usize::MAX);
    let needs_call = match last_reply {
        None => true,
        Some(reply) => {
            let asked: Vec<_> = reply
                .content
                .iter()
                .filter_map(|block| match block {
                    ContentBlock::ToolUse { id, .. } => Some(id.as_str()),
                    _ => None,
                })
                .collect();
            if let Some(tool_use) = turn
                .tool_uses()
                .find(|t| granted.contains(&t.id) && !turn.results.contains_key(t.id))
            {
                return Decision::Act(Intent::Command {
                    turn: turn_index,
                    tool_use_id: tool_use.id.to_string(),
                    command: tool_use.command().unwrap_or_default().to_string(),
                });
            }
            // The model asked for tools: give it their results, unless it already had its
            // last call without tools (then its text is the answer).
            let had_call_without_tools = matches!(
                input
                    .journal
                    .iter()
                    .rev()
                    .find_map(|step| match &step.intent {
                        Intent::CallModel { turn, tools, .. } if *turn == turn_index =>
                            Some(*tools),
                        _ => None,
                    }),
                Some(false)
            );
            !asked.is_empty() && !had_call_without_tools
        }
    };
    if needs_call {
        let Some(reservation) = reservation(input, &replay, &model, !budget_used, byok) else {
            return terminate(&replay, RunPhase::Failed(FailReason::ModelCallFailed));
        };
        if guard.reserve(reservation).is_err() {
            return wait_max_cost;
        }
        return Decision::Act(Intent::CallModel {
            turn: turn_index,
            model,
            reserved_usd: reservation,
            tools: !budget_used,
        });
    }
    if !turn.answered {
        return Decision::Act(Intent::Answer { turn: turn_index });
    }

    // Between turns: a message that arrived is the next prompt.
    if let Some(message) = input
        .inbox
        .iter()
        .find(|m| m.seq > replay.last_message_read)
    {
        return Decision::Act(Intent::ReadMessage {
            turn: turn_index.saturating_add(1),
            message_seq: message.seq,
        });
    }
    if input.spec.keep_alive && !input.close {
        return Decision::Wait {
            reason: WaitReason::AwaitingMessage,
            until: limit.map(|(at, _)| at),
        };
    }
    // The agent is done: its post-run action, once, then the end.
    if let Some(action) = input.post_run_action {
        let done = input.journal.iter().find_map(|step| match &step.intent {
            Intent::PostRunAction { .. } => Some(step.outcome()),
            _ => None,
        });
        match done {
            None => {
                return Decision::Act(Intent::PostRunAction {
                    action: action.kind.clone(),
                    config: action
                        .config
                        .clone()
                        .unwrap_or_else(|| serde_json::json!({})),
                });
            }
            Some(Some(Outcome::Failed { .. })) => {
                return terminate(&replay, RunPhase::Failed(FailReason::PostRunActionFailed));
            }
            Some(_) => {}
        }
    }
    terminate(&replay, RunPhase::Succeeded)
}

/// End the run: delete its sandbox first if it has one.
fn terminate(replay: &Replay<'_>, end: RunPhase) -> Decision {
    match replay.sandbox {
        SandboxState::Live(info) => Decision::Act(Intent::DestroySandbox {
            id: info.id.clone(),
            then: end,
        }),
        _ => Decision::Finish(end),
    }
}

/// The worst case of the next model call, or `None` when the model has no known price on
/// platform access (fail closed). BYOK calls reserve nothing.
fn reservation(
    input: &RunInput<'_>,
    replay: &Replay<'_>,
    model: &str,
    tools: bool,
    byok: bool,
) -> Option<Usd> {
    if byok {
        return Some(Usd::ZERO);
    }
    let prices = input.catalog.prices_of(model)?;
    let (messages, last_reply) =
        replay.conversation(input.first_prompt, input.inbox, input.agent.max_tool_calls);
    let bound = prompt_token_bound(input, replay, &messages, last_reply, tools);
    Some(cost::worst_case(prices, bound, input.agent.max_tokens))
}

/// An upper bound of the prompt tokens of the next call: never below the real count.
///
/// A token is at least one byte of text, so the bytes of everything sent, plus generous
/// framing, bound it. When an earlier call reported its usage, its prompt and output plus the
/// bytes added since bound it too; the smaller of the two bounds is used.
pub fn prompt_token_bound(
    input: &RunInput<'_>,
    replay: &Replay<'_>,
    messages: &[ChatMessage],
    last_reply: Option<usize>,
    tools: bool,
) -> u64 {
    let tool_bytes = if tools {
        serde_json::to_string(&shell_tool()).map_or(0, |s| s.len() as u64) + TOOL_OVERHEAD_TOKENS
    } else {
        TOOL_OVERHEAD_TOKENS
    };
    let message_bytes = |slice: &[ChatMessage]| -> u64 {
        slice
            .iter()
            .map(|m| {
                m.content
                    .iter()
                    .map(|block| {
                        serde_json::to_string(block).map_or(0, |s| s.len() as u64)
                            + MESSAGE_OVERHEAD_TOKENS
                    })
                    .sum::<u64>()
                    + MESSAGE_OVERHEAD_TOKENS
            })
            .sum()
    };
    let from_bytes = input.system.len() as u64 + tool_bytes + message_bytes(messages);
    let last_usage = replay
        .turns
        .iter()
        .rev()
        .find_map(|turn| turn.last_reply())
        .map(|reply| reply.usage);
    match (last_usage, last_reply) {
        (Some(usage), Some(index)) => {
            let after = messages.get(index + 1..).map_or(0, message_bytes);
            let from_usage = usage.prompt_tokens() + usage.output_tokens + after + tool_bytes;
            from_bytes.min(from_usage)
        }
        _ => from_bytes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resource::DurationSpec;

    fn started(at: Timestamp) -> Vec<Step> {
        vec![Step {
            seq: 0,
            started_at: at,
            intent: Intent::Route { turn: 0 },
            completion: None,
        }]
    }

    #[test]
    fn a_run_ends_when_cancelled_or_at_its_time_limit() {
        let first: Timestamp = "2026-12-01T10:00:00Z".parse().expect("time");
        let journal = started(first);
        let mut spec = AgentRunSpec::new("a", "hi");
        spec.deadline = Some(first + SignedDuration::from_secs(2));
        assert_eq!(ending(&spec, &journal, None, first), None);
        assert_eq!(
            ending(&spec, &journal, Some(CancelReason::GroupCancelled), first),
            Some(RunPhase::Cancelled(CancelReason::GroupCancelled))
        );
        assert_eq!(
            ending(&spec, &journal, None, first + SignedDuration::from_secs(2)),
            Some(RunPhase::Failed(FailReason::DeadlineExceeded))
        );
    }

    #[test]
    fn a_deadline_is_the_lifetime_and_the_default_timeout_bounds_the_rest() {
        let first: Timestamp = "2026-12-01T10:00:00Z".parse().expect("time");
        let at = |hours: i64| first + SignedDuration::from_hours(hours);
        let journal = started(first);
        let mut spec = AgentRunSpec::new("a", "hi");
        assert_eq!(
            time_limit(&spec, &journal),
            Some((at(1), FailReason::TimeoutExceeded)),
            "no deadline: the default hour"
        );
        assert_eq!(time_limit(&spec, &[]), None, "not started: no timeout yet");
        spec.deadline = Some(at(2));
        assert_eq!(
            time_limit(&spec, &journal),
            Some((at(2), FailReason::DeadlineExceeded)),
            "a deadline past the default hour holds"
        );
        spec.timeout = Some(DurationSpec::from_secs(1800));
        assert_eq!(
            time_limit(&spec, &journal),
            Some((
                first + SignedDuration::from_mins(30),
                FailReason::TimeoutExceeded
            )),
            "a timeout the user set applies beside the deadline"
        );
        spec.timeout = Some(DurationSpec::from_secs(3 * 3600));
        assert_eq!(
            time_limit(&spec, &journal),
            Some((at(2), FailReason::DeadlineExceeded)),
            "whichever comes first"
        );
    }
}

//! The decider: a pure function from a run's journal, inbox and clock to its next decision.
//!
//! Live execution and replay are the same code: the executor asks [`decide`] what to do,
//! carries that out, journals it and asks again. After a restart the journal already holds
//! the completed steps, so the decider moves on from where the run was; a completed step is
//! never decided again.

use jiff::{SignedDuration, Timestamp};

use crate::catalog::{Catalog, Family};
use crate::cost::{self, CostGuard, Usage};
use crate::journal::{Intent, Outcome};
use crate::lifecycle::{CancelReason, FailReason, RunPhase, TransitionRefused, WaitReason};
use crate::model::{
    ChatMessage, ContentBlock, Credentials, ErrorKind, ModelRequest, ToolChoice, ToolSpec,
};
use crate::money::Usd;
use crate::replay::{Call, Replay, SandboxState};
use crate::resource::{Access, AgentRun, AgentRunSpec, AgentSpec, ChosenBy, RunSnapshot};
use crate::router::RouteChoice;
use crate::sandbox::{self, ExecOutput, SandboxInfo, SandboxSpec};
use crate::store::InboxMessage;

/// Tokens a tool-using request may add beyond its visible content (the provider's own tool
/// instructions), and tokens of framing per message; both generous.
const TOOL_OVERHEAD_TOKENS: u64 = 2048;

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
    /// The journal so far, folded: the decider reads the journal through this only.
    pub replay: &'a Replay,
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
    /// The key of a BYOK agent's Secret that holds its provider key
    /// ([`Config::byok_secret_key`](crate::engine::Config::byok_secret_key)).
    pub byok_secret_key: &'a str,
    /// What the executor learned of the world for this decision.
    pub facts: Facts,
}

/// Facts of the world outside the journal that a decision depends on. The executor learns
/// them when a decision asks for them ([`charge`], [`needs_key`]) and decides again with
/// them; the decider itself never looks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Facts {
    /// The project's credits did not cover what the decided step reserves (the ledger
    /// refused the reservation).
    pub funds_short: bool,
    /// Whether the Secret of a BYOK agent still holds its key.
    pub key: Key,
}

/// A BYOK agent's key, as its Secret holds it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Key {
    /// Not looked up (a platform agent, or no call decided yet).
    #[default]
    Unknown,
    /// The Secret holds it.
    Present,
    /// The Secret is gone or holds no key.
    Missing,
}

/// What the run does next.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// Journal this intent, carry it out, journal its outcome.
    Act(Intent),
    /// Journal this intent with a failed outcome without carrying it out: a check before
    /// the effect refused it (a BYOK key that vanished).
    Refuse {
        /// The step.
        intent: Intent,
        /// Why.
        error: String,
    },
    /// Carry out again the interrupted step with this sequence number (it is safe to).
    Repeat(u32),
    /// Park on the interrupted step with this sequence number: its outcome is uncertain and
    /// repeating it may not be safe.
    Park(u32),
    /// The run is ending while this step is interrupted, or the step cannot be carried out
    /// again: record it as failed.
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

/// A run's system prompt: its agent's, with the run's `context` (and the reserved `nodus`
/// key: the run, its project and its agent) appended as JSON when it has one.
pub fn system_prompt(project: &str, run: &AgentRun, snapshot: &RunSnapshot) -> String {
    let mut system = snapshot.agent.system.clone();
    if let Some(context) = &run.spec.context {
        let mut context = context.clone();
        context.insert(
            "nodus".to_string(),
            serde_json::json!({"run": run.name(), "project": project, "agent": snapshot.agent_ref}),
        );
        let context = serde_json::Value::Object(context);
        system.push_str(&format!("\n\nRun context (JSON):\n{context}"));
    }
    system
}

/// The prompt a run starts with: its `input`, else its agent's `defaultInput`; `None` when
/// neither is written (a run is refused at creation then).
pub fn chosen_prompt<'a>(spec: &'a AgentRunSpec, agent: &'a AgentSpec) -> Option<&'a str> {
    spec.input.as_deref().or(agent.default_input.as_deref())
}

/// A run's first prompt ([`chosen_prompt`]), or nothing.
pub fn first_prompt(run: &AgentRun, snapshot: &RunSnapshot) -> String {
    chosen_prompt(&run.spec, &snapshot.agent)
        .unwrap_or_default()
        .to_string()
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
pub fn time_limit(spec: &AgentRunSpec, replay: &Replay) -> Option<(Timestamp, FailReason)> {
    let timeout = match (spec.timeout, spec.deadline) {
        (Some(timeout), _) => timeout,
        (None, None) => AgentRunSpec::DEFAULT_TIMEOUT,
        (None, Some(deadline)) => return Some((deadline, FailReason::DeadlineExceeded)),
    };
    let timeout_end = replay.started_at.and_then(|first| {
        let seconds = i64::try_from(timeout.as_secs()).ok()?;
        first.checked_add(SignedDuration::from_secs(seconds)).ok()
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
    replay: &Replay,
    cancel: Option<CancelReason>,
    now: Timestamp,
) -> Option<RunPhase> {
    cancel.map(RunPhase::Cancelled).or_else(|| {
        time_limit(spec, replay)
            .filter(|(at, _)| now >= *at)
            .map(|(_, reason)| RunPhase::Failed(reason))
    })
}

/// What a run that is queued in its group (not admitted yet) does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Queued {
    /// Its deadline passed while it was queued: it fails.
    Expired(FailReason),
    /// It stays queued, and must be looked at again at its deadline, if it has one.
    Until(Option<Timestamp>),
}

/// A queued run's fate at `now`: only its deadline bounds it (its timeout counts from its
/// first step, which it has not taken).
pub fn queued(spec: &AgentRunSpec, now: Timestamp) -> Queued {
    match spec.deadline {
        Some(deadline) if now >= deadline => Queued::Expired(FailReason::DeadlineExceeded),
        until => Queued::Until(until),
    }
}

/// Decide the run's next move.
pub fn decide(input: &RunInput<'_>) -> Decision {
    let decision = decide_unfunded(input);
    // The ledger refused what this decision reserves: wait for credits instead.
    if input.facts.funds_short && charge(input, &decision).is_some() {
        return Decision::Wait {
            reason: WaitReason::AwaitingFunds,
            until: time_limit(input.spec, input.replay).map(|(at, _)| at),
        };
    }
    decision
}

/// What carrying out the decision reserves against the project's credits, and under which
/// step: platform model calls their worst case, routing the router's; nothing else, and
/// nothing on the user's own key.
pub fn charge(input: &RunInput<'_>, decision: &Decision) -> Option<(u32, Usd)> {
    let (seq, intent) = match decision {
        Decision::Act(intent) => (input.replay.steps, intent),
        Decision::Repeat(seq) => (*seq, &input.replay.open(*seq)?.intent),
        _ => return None,
    };
    Some((seq, charge_of(input.agent, input.router_max_cost, intent)?))
}

/// What a step reserves against the project's credits (see [`charge`]).
pub fn charge_of(agent: &AgentSpec, router_max_cost: Usd, intent: &Intent) -> Option<Usd> {
    if agent.model.access == Access::Byok {
        return None;
    }
    let amount = match intent {
        Intent::CallModel { reserved_usd, .. } => *reserved_usd,
        Intent::Route { .. } => router_max_cost,
        _ => return None,
    };
    // Nothing to reserve (a local router): no ledger write at all.
    (!amount.is_zero()).then_some(amount)
}

/// Whether carrying out the decision needs the BYOK agent's key (the executor then looks
/// it up and decides again with [`Facts::key`]).
pub fn needs_key(input: &RunInput<'_>, decision: &Decision) -> bool {
    input.agent.model.access == Access::Byok
        && input.facts.key == Key::Unknown
        && matches!(decision, Decision::Act(Intent::CallModel { .. }))
}

fn decide_unfunded(input: &RunInput<'_>) -> Decision {
    let replay = input.replay;
    if let Some(then) = replay.ended {
        return Decision::Finish(then);
    }
    let limit = time_limit(input.spec, replay);
    let ending = ending(input.spec, replay, input.cancel, input.now);
    let byok = input.agent.model.access == Access::Byok;

    if let Some(step) = &replay.open_step {
        return match ending {
            Some(end) if !matches!(step.intent, Intent::DestroySandbox { .. }) => {
                Decision::Abandon {
                    seq: step.seq,
                    error: format!("interrupted, and the run is ending ({end})"),
                }
            }
            _ if step.intent.safe_to_repeat(byok) => match &step.intent {
                Intent::CallModel { model, .. }
                    if bill(input, model, &Usage::default()).is_err() =>
                {
                    Decision::Abandon {
                        seq: step.seq,
                        error: unpriced(model),
                    }
                }
                _ => Decision::Repeat(step.seq),
            },
            _ => Decision::Park(step.seq),
        };
    }
    if let Some(end) = ending {
        return terminate(replay, end);
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

    // Routing: platform access only; a BYOK agent names its model. A routing step that
    // failed for good (no model for the family) fails the run.
    let model = if byok {
        input.agent.model.name.clone().unwrap_or_default()
    } else {
        if turn.route_failed.is_some() {
            return terminate(replay, RunPhase::Failed(FailReason::ModelCallFailed));
        }
        match &turn.route {
            Some(route) => route.model.clone(),
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
        return terminate(replay, RunPhase::Failed(FailReason::ModelCallFailed));
    }
    let max_tool_calls = input.agent.max_tool_calls;
    let last_reply = turn.calls.last().and_then(|call| match call {
        Call::Replied { response, .. } => Some(response),
        Call::Failed { .. } => None,
    });
    let budget_used =
        turn.commands().len() >= usize::try_from(max_tool_calls).unwrap_or(usize::MAX);
    let needs_call = match last_reply {
        None => true,
        Some(reply) => {
            if let Some(asked) = turn.next_command(max_tool_calls) {
                return Decision::Act(Intent::Command {
                    turn: turn_index,
                    tool_use_id: asked.id.clone(),
                    command: asked.command.clone(),
                });
            }
            // The model asked for tools: give it their results, unless it already had its
            // last call without tools (then its text is the answer).
            let asked_tools = reply
                .content
                .iter()
                .any(|block| matches!(block, ContentBlock::ToolUse { .. }));
            asked_tools && turn.last_call_tools != Some(false)
        }
    };
    if needs_call {
        let Some(reservation) = reservation(input, &model, !budget_used, byok) else {
            return terminate(replay, RunPhase::Failed(FailReason::ModelCallFailed));
        };
        if guard.reserve(reservation).is_err() {
            return wait_max_cost;
        }
        let intent = Intent::CallModel {
            turn: turn_index,
            model,
            reserved_usd: reservation,
            tools: !budget_used,
        };
        // The model-call checks: a BYOK call needs its key, which may have vanished since
        // the run was created.
        if byok && input.facts.key == Key::Missing {
            let secret = input.agent.model.api_key_secret.clone().unwrap_or_default();
            return Decision::Refuse {
                intent,
                error: format!("the Secret {secret:?} holds no {}", input.byok_secret_key),
            };
        }
        return Decision::Act(intent);
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
        match replay.post_run_action {
            None => {
                return Decision::Act(Intent::PostRunAction {
                    action: action.kind.clone(),
                    config: action
                        .config
                        .clone()
                        .unwrap_or_else(|| serde_json::json!({})),
                });
            }
            Some(false) => {
                return terminate(replay, RunPhase::Failed(FailReason::PostRunActionFailed));
            }
            Some(true) => {}
        }
    }
    terminate(replay, RunPhase::Succeeded)
}

/// End the run: delete its sandbox first if it has one.
fn terminate(replay: &Replay, end: RunPhase) -> Decision {
    match &replay.sandbox {
        SandboxState::Live(info) => Decision::Act(Intent::DestroySandbox {
            id: info.id.clone(),
            then: end,
        }),
        _ => Decision::Finish(end),
    }
}

fn unpriced(model: &str) -> String {
    format!("the model {model} has no known price; platform access refuses it")
}

/// What a model call with this usage costs the run: its price on platform access (a model
/// with no known price is refused: fail closed), nothing on the user's own key.
pub fn bill(input: &RunInput<'_>, model: &str, usage: &Usage) -> Result<Usd, String> {
    if input.agent.model.access == Access::Byok {
        return Ok(Usd::ZERO);
    }
    input
        .catalog
        .prices_of(model)
        .map(|prices| cost::bill(prices, usage))
        .ok_or_else(|| unpriced(model))
}

/// The worst case of the next model call, or `None` when the model has no known price on
/// platform access (fail closed). BYOK calls reserve nothing.
fn reservation(input: &RunInput<'_>, model: &str, tools: bool, byok: bool) -> Option<Usd> {
    if byok {
        return Some(Usd::ZERO);
    }
    let prices = input.catalog.prices_of(model)?;
    let bound = prompt_token_bound(input, tools);
    Some(cost::worst_case(prices, bound, input.agent.max_tokens))
}

/// The request a model call sends: the system prompt, the conversation so far as the
/// journal tells it, the shell tool (offered, or closed once `maxToolCalls` is reached).
pub fn model_request(
    input: &RunInput<'_>,
    model: &str,
    tools: bool,
    credentials: Credentials,
) -> ModelRequest {
    let messages =
        input
            .replay
            .conversation(input.first_prompt, input.inbox, input.agent.max_tool_calls);
    ModelRequest {
        model: model.to_string(),
        system: input.system.to_string(),
        messages,
        tools: vec![shell_tool()],
        tool_choice: if tools {
            ToolChoice::Auto
        } else {
            ToolChoice::None
        },
        max_tokens: input.agent.max_tokens,
        credentials,
    }
}

/// The families routing may choose: the agent's `families`, or every family.
pub fn allowed_families(agent: &AgentSpec) -> Vec<Family> {
    agent
        .model
        .families
        .clone()
        .unwrap_or_else(|| Family::ALL.to_vec())
}

/// What routing asks the router: the prompt of the turn, and the conversation before it.
pub fn route_prompt(input: &RunInput<'_>, turn: u32) -> (String, Vec<ChatMessage>) {
    let mut conversation = input
        .replay
        .conversation(input.first_prompt, input.inbox, input.agent.max_tool_calls)
        .to_vec();
    conversation.truncate(conversation.len().saturating_sub(1));
    let prompt = input
        .replay
        .prompt_of(turn, input.first_prompt, input.inbox);
    (prompt, conversation)
}

/// The outcome of a routing step from the router's answer (`Err`: it failed or timed out):
/// a family the agent allows, billed at the price of the router's own model call; the
/// fallback family otherwise (a router whose model has no known price is not trusted
/// either), saying why; a failure when the catalog has no model for the family.
pub fn routed(input: &RunInput<'_>, answer: Result<RouteChoice, String>) -> Outcome {
    let allowed = allowed_families(input.agent);
    let fallback = |reason: String| {
        (
            fallback_family(&allowed),
            ChosenBy::Fallback,
            Usd::ZERO,
            None,
            Some(reason),
        )
    };
    let (family, chosen_by, cost_usd, usage, fallback_reason) = match answer {
        Ok(choice) if allowed.contains(&choice.family) => {
            let billed = match &choice.call {
                None => Some(Usd::ZERO),
                Some(call) => input
                    .catalog
                    .prices_of(&call.model)
                    .map(|prices| cost::bill(prices, &call.usage)),
            };
            match billed {
                Some(cost_usd) => (
                    choice.family,
                    ChosenBy::Jev,
                    cost_usd,
                    choice.call.map(|c| c.usage),
                    None,
                ),
                None => fallback("the router's model has no known price".to_string()),
            }
        }
        Ok(choice) => fallback(format!(
            "the router chose {}, which the agent does not allow",
            choice.family
        )),
        Err(reason) => fallback(reason),
    };
    match input.catalog.family(family) {
        Some(entry) => Outcome::Routed {
            family: Some(family),
            model: entry.model.clone(),
            chosen_by,
            cost_usd,
            usage,
            fallback_reason,
        },
        None => failed(format!(
            "the model catalog has no model for the family {family}"
        )),
    }
}

/// Sonnet when the agent allows it, otherwise its first allowed family.
pub fn fallback_family(allowed: &[Family]) -> Family {
    if allowed.contains(&Family::FALLBACK) {
        Family::FALLBACK
    } else {
        allowed.first().copied().unwrap_or(Family::FALLBACK)
    }
}

/// What carrying out an effect gave, as the journal records it.
#[derive(Debug, Clone, PartialEq)]
pub enum Effect {
    /// An outcome to journal.
    Done(Outcome),
    /// The effect may or may not have happened, and repeating it is not safe: the run parks.
    Uncertain,
}

/// A failed outcome.
pub fn failed(error: String) -> Outcome {
    Outcome::Failed {
        error,
        by_resolution: false,
    }
}

/// What a command's execution means for its step: its output; a failure when it certainly
/// did not run (no sandbox, refused, not started); uncertain otherwise (it may have run).
/// `remade_sandbox` is the sandbox it ran in when the run's own was lost and made again for
/// it: the outcome records it, so the run is there from this step on.
pub fn command_effect(
    executed: Result<ExecOutput, sandbox::Error>,
    remade_sandbox: Option<SandboxInfo>,
) -> Effect {
    match executed {
        Ok(output) => Effect::Done(Outcome::CommandFinished {
            output,
            remade_sandbox,
        }),
        Err(
            e @ (sandbox::Error::NotFound(_)
            | sandbox::Error::Refused(_)
            | sandbox::Error::NotStarted(_)),
        ) => Effect::Done(failed(e.to_string())),
        Err(_) => Effect::Uncertain,
    }
}

/// What a model call's answer means for its step, or `None` when the call is to be made
/// again (an uncertain platform call is safe to repeat while attempts are left: the
/// platform pays for a lost reply, and the reservation covers one call). An uncertain call
/// on the user's own key may have been charged to them: the run parks.
pub fn model_effect(
    input: &RunInput<'_>,
    model: &str,
    answer: Result<crate::model::ModelResponse, crate::model::Error>,
    attempts_left: bool,
) -> Option<Effect> {
    let byok = input.agent.model.access == Access::Byok;
    match answer {
        Ok(response) => Some(Effect::Done(match bill(input, model, &response.usage) {
            Ok(cost_usd) => Outcome::ModelReplied { response, cost_usd },
            Err(error) => failed(error),
        })),
        Err(e) if e.kind == ErrorKind::Uncertain && byok => Some(Effect::Uncertain),
        Err(e) if e.kind == ErrorKind::Uncertain && attempts_left => None,
        Err(e) => Some(Effect::Done(failed(e.message))),
    }
}

/// The phase a run is in while it carries out a decided step: running (a run deleting its
/// sandbox to end keeps its phase until the deletion is recorded).
pub fn acting_phase(phase: RunPhase, intent: &Intent) -> Result<RunPhase, TransitionRefused> {
    match intent {
        Intent::DestroySandbox { .. } => Ok(phase),
        _ => phase.toward(RunPhase::Running),
    }
}

/// The phase an effect's result leads to from `phase`: an uncertain one parks the run; a
/// recorded outcome keeps it.
pub fn phase_after(phase: RunPhase, effect: &Effect) -> Result<RunPhase, TransitionRefused> {
    match effect {
        Effect::Done(_) => Ok(phase),
        Effect::Uncertain => phase.toward(RunPhase::NeedsResolution),
    }
}

/// The phase a decision that stops the run's work leads to from `phase`: parked, waiting,
/// or its end. `None` for a decision the run acts on.
pub fn phase_of(
    phase: RunPhase,
    decision: &Decision,
) -> Option<Result<RunPhase, TransitionRefused>> {
    let target = match decision {
        Decision::Park(_) => RunPhase::NeedsResolution,
        Decision::Wait { reason, .. } => RunPhase::Waiting(*reason),
        Decision::Finish(end) => *end,
        Decision::Act(_)
        | Decision::Refuse { .. }
        | Decision::Repeat(_)
        | Decision::Abandon { .. } => {
            return None;
        }
    };
    Some(phase.toward(target))
}

/// An upper bound of the prompt tokens of the next call: never below the real count.
///
/// A token is at least one byte of text, so the bytes of everything sent, plus generous
/// framing, bound it. When an earlier call reported its usage, its prompt and output plus the
/// bytes added since bound it too; the smaller of the two bounds is used. The bytes of the
/// replies and results are kept by the fold ([`crate::replay::Sizes`]), so the bound costs
/// no rendering of the conversation.
pub fn prompt_token_bound(input: &RunInput<'_>, tools: bool) -> u64 {
    let tool_bytes = if tools {
        serde_json::to_string(&shell_tool()).map_or(0, |s| s.len() as u64) + TOOL_OVERHEAD_TOKENS
    } else {
        TOOL_OVERHEAD_TOKENS
    };
    let replay = input.replay;
    let prompt = |turn| replay.prompt_bytes(turn, input.first_prompt, input.inbox);
    let from_bytes = input.system.len() as u64
        + tool_bytes
        + replay
            .turns
            .iter()
            .map(|turn| prompt(turn) + turn.sizes().messages)
            .sum::<u64>();
    let last = replay
        .turns
        .iter()
        .rposition(|turn| turn.last_reply().is_some());
    match last {
        Some(index) => {
            let turn = &replay.turns[index];
            let usage = turn
                .last_reply()
                .map(|reply| reply.usage)
                .unwrap_or_default();
            let after = turn.sizes().after_last_reply
                + replay.turns[index + 1..].iter().map(prompt).sum::<u64>();
            let from_usage = usage.prompt_tokens() + usage.output_tokens + after + tool_bytes;
            from_bytes.min(from_usage)
        }
        None => from_bytes,
    }
}

#[cfg(test)]
#[path = "decide_tests.rs"]
mod tests;

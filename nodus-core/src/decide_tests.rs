//! Table tests of the decider: a journal prefix and the facts in, the decision out.

use super::*;
use crate::resource::DurationSpec;

use std::collections::BTreeMap;

use crate::catalog::CatalogModel;
use crate::cost::{Prices, Rates};
use crate::journal::{Completion, Step};
use crate::lifecycle::PendingReason;
use crate::model::StopReason;
use crate::output::Output;
use crate::resource::ModelAccess;
use crate::sandbox::SandboxId;

fn t0() -> Timestamp {
    "2026-12-01T10:00:00Z".parse().expect("time")
}

fn prices() -> Prices {
    Prices {
        base: Rates {
            input: Usd::from_cents(100),
            output: Usd::from_cents(500),
            cache_write: Usd::from_cents(125),
            cache_read: Usd::from_cents(10),
        },
        long_prompt: None,
    }
}

fn catalog() -> Catalog {
    let entry = |model: &str| CatalogModel {
        model: model.to_string(),
        prices: prices(),
    };
    Catalog {
        date: "2026-12-01".to_string(),
        notes: Vec::new(),
        families: BTreeMap::from([
            (Family::Haiku, entry("m-haiku")),
            (Family::Sonnet, entry("m-sonnet")),
        ]),
        models: vec![entry("m-byok")],
    }
}

/// The world a decision is taken in: the run, its agent, and the facts passed in.
struct World {
    agent: AgentSpec,
    spec: AgentRunSpec,
    sandbox: SandboxSpec,
    catalog: Catalog,
    inbox: Vec<InboxMessage>,
    now: Timestamp,
    cancel: Option<CancelReason>,
    close: bool,
    router_max_cost: Usd,
    facts: Facts,
    post_run_action: Option<crate::resource::PostRunAction>,
}

impl World {
    fn platform() -> Self {
        World {
            agent: AgentSpec::new("be brief"),
            spec: AgentRunSpec::new("a", "list the files"),
            sandbox: SandboxSpec {
                key: "run-1".to_string(),
                image: None,
                env: Default::default(),
                limits: Default::default(),
                network: false,
                egress: None,
                egress_headers: Vec::new(),
                links: Default::default(),
            },
            catalog: catalog(),
            inbox: Vec::new(),
            now: t0(),
            cancel: None,
            close: false,
            router_max_cost: Usd::ZERO,
            facts: Facts::default(),
            post_run_action: None,
        }
    }

    fn byok() -> Self {
        let mut world = World::platform();
        world.agent.model = ModelAccess {
            access: Access::Byok,
            families: None,
            name: Some("m-byok".to_string()),
            api_key_secret: Some("my-key".to_string()),
        };
        world
    }

    fn decide(&self, journal: &[Step]) -> Decision {
        let replay = Replay::of(journal);
        decide(&self.input(&replay))
    }

    fn input<'a>(&'a self, replay: &'a Replay) -> RunInput<'a> {
        RunInput {
            agent: &self.agent,
            spec: &self.spec,
            sandbox: &self.sandbox,
            system: "be brief",
            first_prompt: "list the files",
            replay,
            inbox: &self.inbox,
            now: self.now,
            cancel: self.cancel,
            close: self.close,
            catalog: &self.catalog,
            router_max_cost: self.router_max_cost,
            byok_secret_key: "PROVIDER_API_KEY",
            facts: self.facts,
            post_run_action: self.post_run_action.as_ref(),
        }
    }
}

/// A journal written step by step.
#[derive(Default, Clone)]
struct Journal(Vec<Step>);

impl Journal {
    fn push(mut self, intent: Intent, outcome: Option<Outcome>) -> Self {
        let seq = u32::try_from(self.0.len()).expect("seq");
        self.0.push(Step {
            seq,
            started_at: t0(),
            intent,
            completion: outcome.map(|outcome| Completion {
                finished_at: t0(),
                outcome,
            }),
        });
        self
    }
    fn done(self, intent: Intent, outcome: Outcome) -> Self {
        self.push(intent, Some(outcome))
    }
    fn open(self, intent: Intent) -> Self {
        self.push(intent, None)
    }
    /// A live sandbox.
    fn created(self) -> Self {
        self.done(
            Intent::CreateSandbox {
                spec: World::platform().sandbox,
            },
            Outcome::SandboxCreated {
                info: SandboxInfo {
                    id: SandboxId("sb-1".to_string()),
                    isolated: true,
                    host: None,
                },
            },
        )
    }
    /// Turn `turn` routed to Haiku.
    fn routed(self, turn: u32) -> Self {
        self.done(Intent::Route { turn }, routed_to("m-haiku"))
    }
    fn replied(self, turn: u32, model: &str, tools: bool, content: Vec<ContentBlock>) -> Self {
        self.done(call(turn, model, tools), replied(content))
    }
}

fn routed_to(model: &str) -> Outcome {
    Outcome::Routed {
        family: Some(Family::Haiku),
        model: model.to_string(),
        chosen_by: ChosenBy::Jev,
        cost_usd: Usd::ZERO,
        usage: None,
        fallback_reason: None,
    }
}

fn call(turn: u32, model: &str, tools: bool) -> Intent {
    Intent::CallModel {
        turn,
        model: model.to_string(),
        reserved_usd: Usd::from_cents(1),
        tools,
    }
}

fn replied(content: Vec<ContentBlock>) -> Outcome {
    Outcome::ModelReplied {
        response: crate::model::ModelResponse {
            model: "m".to_string(),
            content,
            stop_reason: StopReason::EndTurn,
            usage: Usage {
                input_tokens: 100,
                output_tokens: 20,
                cache_write_tokens: 0,
                cache_read_tokens: 0,
            },
            request_id: None,
        },
        cost_usd: Usd::from_nanos(1_000),
    }
}

fn text(text: &str) -> Vec<ContentBlock> {
    vec![ContentBlock::Text {
        text: text.to_string(),
    }]
}

fn shell(id: &str, command: &str) -> ContentBlock {
    ContentBlock::ToolUse {
        id: id.to_string(),
        name: "shell".to_string(),
        input: serde_json::json!({ "command": command }),
    }
}

fn command(turn: u32, id: &str, command: &str) -> Intent {
    Intent::Command {
        turn,
        tool_use_id: id.to_string(),
        command: command.to_string(),
    }
}

fn finished(exit: i32) -> Outcome {
    Outcome::CommandFinished {
        output: ExecOutput {
            exit_code: Some(exit),
            stdout: Output {
                bytes: b"a.txt\n".to_vec(),
                truncated: false,
            },
            stderr: Output::default(),
            timed_out: false,
            stopped: None,
        },
        remade_sandbox: None,
    }
}

fn destroy(then: RunPhase) -> Intent {
    Intent::DestroySandbox {
        id: SandboxId("sb-1".to_string()),
        then,
    }
}

#[test]
fn a_fork_folds_its_inherited_steps_without_their_spend_or_sandbox_and_routes_again() {
    let journal = asked_ls().done(command(0, "t1", "ls"), finished(0));
    let through = u32::try_from(journal.0.len() - 1).expect("seq");
    let source = Replay::of(&journal.0);
    let fork = Replay::forked(&journal.0, crate::replay::Inherited { through }, None);
    // The source paid for its model call; the fork shows it in its turn, not as its spend.
    assert_eq!(source.spent, Usd::from_nanos(1_000));
    assert_eq!(fork.spent, Usd::ZERO);
    // The turn's cost is shown as the source's; its route is cleared (routed again).
    let cost = |replay: &Replay| replay.turn_statuses().first().map(|t| t.cost_usd);
    assert_eq!(cost(&fork), cost(&source));
    assert_eq!(
        fork.conversation_rebuilt("list the files", &[], 50),
        source.conversation_rebuilt("list the files", &[], 50)
    );
    // It makes its own sandbox, then routes the turn again (it may run another agent),
    // then calls the model with the conversation as it stood.
    let world = World::platform();
    assert_eq!(shape(&decide(&world.input(&fork))), "create sandbox");
    let own = journal.created();
    let fork = Replay::forked(&own.0, crate::replay::Inherited { through }, None);
    assert_eq!(shape(&decide(&world.input(&fork))), "route 0");
    // A step after the inherited ones is this run's own: its spend counts.
    let own = own.routed(0).replied(0, "m-haiku", true, text("done"));
    let fork = Replay::forked(&own.0, crate::replay::Inherited { through }, None);
    assert_eq!(fork.spent, Usd::from_nanos(1_000));
}

/// A fork's input: a user message after the last inherited step's results, in the
/// conversation shared from the fold as in the one rendered anew, and counted in the
/// bound of the next call's prompt tokens.
#[test]
fn a_forks_input_follows_the_last_inherited_results_as_a_user_message() {
    let journal = asked_ls().done(command(0, "t1", "ls"), finished(0));
    let through = u32::try_from(journal.0.len() - 1).expect("seq");
    let plain = Replay::forked(&journal.0, crate::replay::Inherited { through }, None);
    let input = "Try again, with tests.".to_string();
    let fork = Replay::forked(
        &journal.0,
        crate::replay::Inherited { through },
        Some(input.clone()),
    );
    let shared: Vec<ChatMessage> = fork
        .conversation("list the files", &[], 50)
        .iter()
        .cloned()
        .collect();
    assert_eq!(shared, fork.conversation_rebuilt("list the files", &[], 50));
    let last = shared.last().expect("messages");
    assert_eq!(last.role, crate::model::Role::User);
    assert!(
        matches!(&last.content[..], [ContentBlock::ToolResult { tool_use_id, .. }, ContentBlock::Text { text }]
            if tool_use_id == "t1" && *text == input),
        "{last:?}"
    );
    // Everything before it is the conversation as it stood.
    let before = plain.conversation_rebuilt("list the files", &[], 50);
    assert_eq!(shared.len(), before.len());
    assert_eq!(shared[..shared.len() - 1], before[..before.len() - 1]);
    // The bound of the next prompt grows by at least the input's bytes.
    let world = World::platform();
    let grown = prompt_token_bound(&world.input(&fork), true)
        - prompt_token_bound(&world.input(&plain), true);
    assert!(grown >= input.len() as u64, "{grown}");
}

/// The first turn up to the model's request for `ls` (tool call `t1`).
fn asked_ls() -> Journal {
    Journal::default()
        .created()
        .routed(0)
        .replied(0, "m-haiku", true, vec![shell("t1", "ls")])
}

/// The first turn answered.
fn answered() -> Journal {
    asked_ls()
        .done(command(0, "t1", "ls"), finished(0))
        .replied(0, "m-haiku", true, text("a.txt"))
        .done(Intent::Answer { turn: 0 }, Outcome::Answered)
}

fn failure(error: &str) -> Outcome {
    Outcome::Failed {
        error: error.to_string(),
        by_resolution: false,
    }
}

/// A decision in a few words, so that tables read as the run's story. The amounts of
/// model calls are checked apart (`a_model_call_reserves_its_worst_case`).
fn shape(decision: &Decision) -> String {
    fn intent(intent: &Intent) -> String {
        match intent {
            Intent::CreateSandbox { .. } => "create sandbox".to_string(),
            Intent::Route { turn } => format!("route {turn}"),
            Intent::CallModel {
                turn, model, tools, ..
            } => format!(
                "call {turn} {model} {}",
                if *tools {
                    "with tools"
                } else {
                    "without tools"
                }
            ),
            Intent::Command {
                turn,
                tool_use_id,
                command,
            } => format!("command {turn} {tool_use_id} `{command}`"),
            Intent::ReadMessage { turn, message_seq } => {
                format!("read message {message_seq} as turn {turn}")
            }
            Intent::Answer { turn } => format!("answer {turn}"),
            Intent::DestroySandbox { id, then } => format!("destroy {id}, then {then:?}"),
            Intent::PostRunAction { action, .. } => format!("post-run action {action}"),
        }
    }
    match decision {
        Decision::Act(act) => intent(act),
        Decision::Refuse { intent: act, error } => format!("refuse {}: {error}", intent(act)),
        Decision::Repeat(seq) => format!("repeat {seq}"),
        Decision::Park(seq) => format!("park {seq}"),
        Decision::Abandon { seq, error } => format!("abandon {seq}: {error}"),
        Decision::Wait { reason, .. } => format!("wait {reason:?}"),
        Decision::Finish(phase) => format!("finish {phase:?}"),
    }
}

/// The table: a journal prefix and the world, and what the run does next. Every step
/// kind is decided, every outcome is in some prefix, every terminal phase is reached.
/// A run with a post-run action carries it out once after its answer, then ends: as it
/// succeeded, or failed when the action failed; one without ends at once.
#[test]
fn the_post_run_action_comes_once_after_the_answer() {
    let mut world = World::platform();
    let action = Intent::PostRunAction {
        action: "agents.webhook".to_string(),
        config: serde_json::json!({"url": "http://x"}),
    };
    assert_eq!(
        shape(&world.decide(&answered().0)),
        "destroy sb-1, then Succeeded"
    );
    world.post_run_action = Some(crate::resource::PostRunAction {
        kind: "agents.webhook".to_string(),
        config: Some(serde_json::json!({"url": "http://x"})),
    });
    assert_eq!(world.decide(&answered().0), Decision::Act(action.clone()));
    let done = answered().done(
        action.clone(),
        Outcome::ActionFinished {
            results: Default::default(),
        },
    );
    assert_eq!(
        shape(&world.decide(&done.0)),
        "destroy sb-1, then Succeeded"
    );
    let failed = answered().done(action, failure("the receiver answered 400"));
    assert_eq!(
        shape(&world.decide(&failed.0)),
        "destroy sb-1, then Failed(PostRunActionFailed)"
    );
}

#[test]
fn the_decision_for_each_journal_prefix() {
    let platform = World::platform;
    let with = |edit: &dyn Fn(&mut World)| {
        let mut world = World::platform();
        edit(&mut world);
        world
    };
    let byok_with = |edit: &dyn Fn(&mut World)| {
        let mut world = World::byok();
        edit(&mut world);
        world
    };
    let mut inbox_world = World::platform();
    inbox_world.inbox.push(InboxMessage {
        seq: 1,
        key: None,
        payload: "and now the sizes".to_string(),
        received_at: t0(),
    });
    let later = |hours: i64| t0() + SignedDuration::from_hours(hours);
    let cases: Vec<(&str, World, Journal, &str)> = vec![
        // Creating the sandbox.
        (
            "a new run creates its sandbox",
            platform(),
            Journal::default(),
            "create sandbox",
        ),
        (
            "an interrupted creation is repeated",
            platform(),
            Journal::default().open(Intent::CreateSandbox {
                spec: platform().sandbox,
            }),
            "repeat 0",
        ),
        (
            "a creation that failed fails the run",
            platform(),
            Journal::default().done(
                Intent::CreateSandbox {
                    spec: platform().sandbox,
                },
                failure("no space"),
            ),
            "finish Failed(SandboxFailed)",
        ),
        // Routing.
        (
            "with a sandbox, the first turn is routed",
            platform(),
            Journal::default().created(),
            "route 0",
        ),
        (
            "an interrupted routing is repeated",
            platform(),
            Journal::default().created().open(Intent::Route { turn: 0 }),
            "repeat 1",
        ),
        (
            "a routing that failed for good fails the run, deleting the sandbox",
            platform(),
            Journal::default()
                .created()
                .done(Intent::Route { turn: 0 }, failure("no model for opus")),
            "destroy sb-1, then Failed(ModelCallFailed)",
        ),
        (
            "a BYOK agent is not routed: it calls its own model",
            World::byok(),
            Journal::default().created(),
            "call 0 m-byok with tools",
        ),
        // Model calls.
        (
            "a routed turn calls its model",
            platform(),
            Journal::default().created().routed(0),
            "call 0 m-haiku with tools",
        ),
        (
            "an interrupted platform call is repeated (the platform pays a lost reply)",
            platform(),
            Journal::default()
                .created()
                .routed(0)
                .open(call(0, "m-haiku", true)),
            "repeat 2",
        ),
        (
            "an interrupted BYOK call parks: it may have been charged to the user",
            World::byok(),
            Journal::default().created().open(call(0, "m-byok", true)),
            "park 1",
        ),
        (
            "a call that failed fails the run",
            platform(),
            Journal::default()
                .created()
                .routed(0)
                .done(call(0, "m-haiku", true), failure("overloaded")),
            "destroy sb-1, then Failed(ModelCallFailed)",
        ),
        (
            "a call a person recorded as failed is made again",
            platform(),
            Journal::default().created().routed(0).done(
                call(0, "m-haiku", true),
                Outcome::Failed {
                    error: "unknown".to_string(),
                    by_resolution: true,
                },
            ),
            "call 0 m-haiku with tools",
        ),
        (
            "a superseded call is made again as a new step",
            platform(),
            Journal::default()
                .created()
                .routed(0)
                .done(call(0, "m-haiku", true), Outcome::Superseded),
            "call 0 m-haiku with tools",
        ),
        // Commands.
        (
            "the command the model asked for runs",
            platform(),
            asked_ls(),
            "command 0 t1 `ls`",
        ),
        (
            "an interrupted command parks: it may have changed the sandbox",
            platform(),
            asked_ls().open(command(0, "t1", "ls")),
            "park 3",
        ),
        (
            "a finished command is not run again: the model gets its result",
            platform(),
            asked_ls().done(command(0, "t1", "ls"), finished(2)),
            "call 0 m-haiku with tools",
        ),
        (
            "a command that could not run is reported to the model",
            platform(),
            asked_ls().done(command(0, "t1", "ls"), failure("sandbox refused")),
            "call 0 m-haiku with tools",
        ),
        (
            "a superseded command runs again as a new step",
            platform(),
            asked_ls().done(command(0, "t1", "ls"), Outcome::Superseded),
            "command 0 t1 `ls`",
        ),
        (
            "commands run in the order asked, one step each",
            platform(),
            Journal::default()
                .created()
                .routed(0)
                .replied(
                    0,
                    "m-haiku",
                    true,
                    vec![shell("t1", "ls"), shell("t2", "pwd")],
                )
                .done(command(0, "t1", "ls"), finished(0)),
            "command 0 t2 `pwd`",
        ),
        (
            "past maxToolCalls a call is made without tools",
            with(&|w| w.agent.max_tool_calls = 1),
            Journal::default()
                .created()
                .routed(0)
                .replied(
                    0,
                    "m-haiku",
                    true,
                    vec![shell("t1", "ls"), shell("t2", "pwd")],
                )
                .done(command(0, "t1", "ls"), finished(0)),
            "call 0 m-haiku without tools",
        ),
        (
            "a reply to a call without tools is the answer, tool calls or not",
            with(&|w| w.agent.max_tool_calls = 1),
            Journal::default()
                .created()
                .routed(0)
                .replied(
                    0,
                    "m-haiku",
                    true,
                    vec![shell("t1", "ls"), shell("t2", "pwd")],
                )
                .done(command(0, "t1", "ls"), finished(0))
                .replied(0, "m-haiku", false, vec![shell("t3", "cat a.txt")]),
            "answer 0",
        ),
        (
            "a call that is not the shell's is answered by the model's next call",
            platform(),
            Journal::default().created().routed(0).replied(
                0,
                "m-haiku",
                true,
                vec![ContentBlock::ToolUse {
                    id: "t1".to_string(),
                    name: "browser".to_string(),
                    input: serde_json::json!({}),
                }],
            ),
            "call 0 m-haiku with tools",
        ),
        // Answers, messages, the end.
        (
            "a reply without tool calls is recorded as the answer",
            platform(),
            asked_ls()
                .done(command(0, "t1", "ls"), finished(0))
                .replied(0, "m-haiku", true, text("a.txt")),
            "answer 0",
        ),
        (
            "an answered run succeeds, deleting its sandbox",
            platform(),
            answered(),
            "destroy sb-1, then Succeeded",
        ),
        (
            "an answered keepAlive run waits for a message",
            with(&|w| w.spec.keep_alive = true),
            answered(),
            "wait AwaitingMessage",
        ),
        (
            "a closed keepAlive run succeeds after its turn",
            with(&|w| {
                w.spec.keep_alive = true;
                w.close = true;
            }),
            answered(),
            "destroy sb-1, then Succeeded",
        ),
        (
            "a message that arrived is the next turn's prompt",
            inbox_world,
            answered(),
            "read message 1 as turn 1",
        ),
        (
            "a message read starts a turn that is routed",
            platform(),
            answered().done(
                Intent::ReadMessage {
                    turn: 1,
                    message_seq: 1,
                },
                Outcome::MessageRead,
            ),
            "route 1",
        ),
        (
            "an interrupted deletion is repeated, even when the run is ending",
            with(&|w| w.cancel = Some(CancelReason::CancelRequested)),
            answered().open(destroy(RunPhase::Succeeded)),
            "repeat 6",
        ),
        (
            "a deleted sandbox ends the run as its step said",
            platform(),
            answered().done(destroy(RunPhase::Succeeded), Outcome::SandboxDestroyed),
            "finish Succeeded",
        ),
        (
            "a deletion that failed still ends the run",
            platform(),
            answered().done(
                destroy(RunPhase::Failed(FailReason::ModelCallFailed)),
                failure("busy"),
            ),
            "finish Failed(ModelCallFailed)",
        ),
        // Ending: cancellation and time.
        (
            "a cancelled run deletes its sandbox, then is cancelled",
            with(&|w| w.cancel = Some(CancelReason::CancelRequested)),
            asked_ls(),
            "destroy sb-1, then Cancelled(CancelRequested)",
        ),
        (
            "a run cancelled with its group, before its sandbox, ends at once",
            with(&|w| w.cancel = Some(CancelReason::GroupCancelled)),
            Journal::default(),
            "finish Cancelled(GroupCancelled)",
        ),
        (
            "a run whose dependency failed is cancelled",
            with(&|w| w.cancel = Some(CancelReason::DependencyFailed)),
            Journal::default(),
            "finish Cancelled(DependencyFailed)",
        ),
        (
            "a run whose dependency was cancelled is cancelled",
            with(&|w| w.cancel = Some(CancelReason::DependencyCancelled)),
            Journal::default().created(),
            "destroy sb-1, then Cancelled(DependencyCancelled)",
        ),
        (
            "a step interrupted while the run ends is recorded as failed",
            with(&|w| w.cancel = Some(CancelReason::CancelRequested)),
            asked_ls().open(command(0, "t1", "ls")),
            "abandon 3: interrupted, and the run is ending (Cancelled (CancelRequested))",
        ),
        (
            "a command stopped because the run is ending ends it",
            with(&|w| w.cancel = Some(CancelReason::CancelRequested)),
            asked_ls().done(
                command(0, "t1", "ls"),
                Outcome::Stopped {
                    reason: "the run is ending".to_string(),
                },
            ),
            "destroy sb-1, then Cancelled(CancelRequested)",
        ),
        (
            "past its deadline a run fails",
            with(&|w| {
                w.spec.deadline = Some(later(2));
                w.now = later(2);
            }),
            asked_ls(),
            "destroy sb-1, then Failed(DeadlineExceeded)",
        ),
        (
            "past the default hour from its first step a run times out",
            with(&|w| w.now = later(1)),
            asked_ls(),
            "destroy sb-1, then Failed(TimeoutExceeded)",
        ),
        // Facts passed in: funds, the key, the catalog, the cap.
        (
            "a routing the credits do not cover waits for funds",
            with(&|w| {
                w.router_max_cost = Usd::from_cents(1);
                w.facts.funds_short = true;
            }),
            Journal::default().created(),
            "wait AwaitingFunds",
        ),
        (
            "a local router reserves nothing, so short credits do not stop routing",
            with(&|w| w.facts.funds_short = true),
            Journal::default().created(),
            "route 0",
        ),
        (
            "a call the credits do not cover waits for funds",
            with(&|w| w.facts.funds_short = true),
            Journal::default().created().routed(0),
            "wait AwaitingFunds",
        ),
        (
            "a repeated call the credits do not cover waits for funds",
            with(&|w| w.facts.funds_short = true),
            Journal::default()
                .created()
                .routed(0)
                .open(call(0, "m-haiku", true)),
            "wait AwaitingFunds",
        ),
        (
            "a command reserves nothing, so short credits do not stop it",
            with(&|w| w.facts.funds_short = true),
            asked_ls(),
            "command 0 t1 `ls`",
        ),
        (
            "a BYOK call whose key vanished is refused, naming the Secret",
            byok_with(&|w| w.facts.key = Key::Missing),
            Journal::default().created(),
            "refuse call 0 m-byok with tools: the Secret \"my-key\" holds no PROVIDER_API_KEY",
        ),
        (
            "a BYOK call whose key is there is made",
            byok_with(&|w| w.facts.key = Key::Present),
            Journal::default().created(),
            "call 0 m-byok with tools",
        ),
        (
            "a BYOK call reserves nothing, so short credits do not stop it",
            byok_with(&|w| w.facts.funds_short = true),
            Journal::default().created(),
            "call 0 m-byok with tools",
        ),
        (
            "a model missing from the catalog fails the run (no unknown price on credits)",
            platform(),
            Journal::default()
                .created()
                .done(Intent::Route { turn: 0 }, routed_to("m-gone")),
            "destroy sb-1, then Failed(ModelCallFailed)",
        ),
        (
            "an interrupted call to a model missing from the catalog is not repeated",
            platform(),
            Journal::default()
                .created()
                .done(Intent::Route { turn: 0 }, routed_to("m-gone"))
                .open(call(0, "m-gone", true)),
            "abandon 2: the model m-gone has no known price; platform access refuses it",
        ),
        (
            "a call whose worst case does not fit under the run's cap waits for good",
            with(&|w| w.agent.per_run_max_cost_usd = Usd::from_nanos(1)),
            Journal::default().created().routed(0),
            "wait MaxCostReached",
        ),
    ];
    let mut failures = Vec::new();
    for (name, world, journal, expected) in &cases {
        let got = shape(&world.decide(&journal.0));
        if got != *expected {
            failures.push(format!("{name}:\n  expected {expected}\n  got      {got}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Replay records a completed command, so the decider never runs it again: with the
/// recording broken, the run would repeat its command forever.
#[test]
fn a_completed_command_is_never_decided_again() {
    let world = World::platform();
    let journal = asked_ls().done(command(0, "t1", "ls"), finished(0));
    let replay = Replay::of(&journal.0);
    assert!(
        matches!(
            replay.turns[0].results.get("t1"),
            Some(crate::replay::CommandResult::Ran(output)) if output.stdout.bytes == b"a.txt\n"
        ),
        "replay records the command's output: {:?}",
        replay.turns[0].results
    );
    assert_eq!(
        shape(&world.decide(&journal.0)),
        "call 0 m-haiku with tools"
    );
    // Folded a step at a time, as the executor does, the fold is the same.
    let mut folded = Replay::default();
    for step in &journal.0 {
        let mut intent_only = step.clone();
        intent_only.completion = None;
        folded.apply(&intent_only);
        folded.apply(step);
    }
    assert_eq!(folded, replay);
}

/// The wait for funds and the wait at the cap say when to look again: the time limit.
#[test]
fn waits_look_again_at_the_time_limit() {
    let mut world = World::platform();
    world.facts.funds_short = true;
    let journal = Journal::default().created().routed(0);
    assert_eq!(
        world.decide(&journal.0),
        Decision::Wait {
            reason: WaitReason::AwaitingFunds,
            until: Some(t0() + SignedDuration::from_hours(1)),
        }
    );
}

/// The worst case the call reserves: every prompt byte a token at the highest input
/// rate, plus `maxTokens` at the output rate, with the margin (÷ 0.875), rounded up.
#[test]
fn a_model_call_reserves_its_worst_case() {
    let mut world = World::platform();
    world.agent.max_tokens = 1000;
    let journal = Journal::default().created().routed(0);
    let Decision::Act(Intent::CallModel { reserved_usd, .. }) = world.decide(&journal.0) else {
        panic!("a call was expected");
    };
    // The request: system "be brief" (8 bytes), the shell tool (its JSON plus 2048), one
    // user message of one text block: {"type":"text","text":"list the files"} (39 bytes)
    // + 32 per block + 32 per message.
    let tool = serde_json::to_string(&shell_tool()).expect("json").len() as u64;
    let prompt_tokens = 8 + tool + 2048 + 39 + 32 + 32;
    // $1.25 per million at most on input (cache writes), $5 on output; × 8/7, up.
    let nanos = (u128::from(prompt_tokens) * 1_250_000_000 + 1000 * 5_000_000_000) * 8;
    let expected = nanos.div_ceil(7 * 1_000_000);
    assert_eq!(u128::from(reserved_usd.nanos()), expected);
}

/// What a charge is, per step: platform calls their reservation, routing the router's
/// worst case, nothing else and nothing on the user's key.
#[test]
fn what_each_step_reserves() {
    let platform = AgentSpec::new("x");
    let byok = World::byok().agent;
    let router = Usd::from_cents(3);
    let cases = [
        (&platform, call(0, "m", true), Some(Usd::from_cents(1))),
        (&platform, Intent::Route { turn: 0 }, Some(router)),
        (&platform, command(0, "t1", "ls"), None),
        (&platform, Intent::Answer { turn: 0 }, None),
        (&byok, call(0, "m", true), None),
        (&byok, Intent::Route { turn: 0 }, None),
    ];
    for (agent, intent, expected) in cases {
        assert_eq!(charge_of(agent, router, &intent), expected, "{intent:?}");
    }
    assert_eq!(
        charge_of(&platform, Usd::ZERO, &Intent::Route { turn: 0 }),
        None,
        "a local router reserves nothing"
    );
}

/// The routing policy: the family the router chose when the agent allows it, billed at
/// its model's price; the fallback otherwise, saying why; a failure without a model.
#[test]
fn the_routing_policy() {
    let world = World::platform();
    let replay = Replay::default();
    let input = world.input(&replay);
    let choice =
        |family: Family, call: Option<crate::router::RoutingCall>| Ok(RouteChoice { family, call });
    assert_eq!(
        routed(&input, choice(Family::Haiku, None)),
        Outcome::Routed {
            family: Some(Family::Haiku),
            model: "m-haiku".to_string(),
            chosen_by: ChosenBy::Jev,
            cost_usd: Usd::ZERO,
            usage: None,
            fallback_reason: None,
        }
    );
    // A router call of 7 000 input tokens on m-byok at $1/M: $0.007 ÷ 0.875 = $0.008.
    let usage = Usage {
        input_tokens: 7_000,
        ..Usage::default()
    };
    let billed = routed(
        &input,
        choice(
            Family::Haiku,
            Some(crate::router::RoutingCall {
                model: "m-byok".to_string(),
                usage,
            }),
        ),
    );
    assert!(
        matches!(&billed, Outcome::Routed { cost_usd, usage: Some(_), .. } if *cost_usd == Usd::from_nanos(8_000_000)),
        "{billed:?}"
    );
    let fallback = |reason: &str| Outcome::Routed {
        family: Some(Family::Sonnet),
        model: "m-sonnet".to_string(),
        chosen_by: ChosenBy::Fallback,
        cost_usd: Usd::ZERO,
        usage: None,
        fallback_reason: Some(reason.to_string()),
    };
    assert_eq!(
        routed(
            &input,
            choice(
                Family::Haiku,
                Some(crate::router::RoutingCall {
                    model: "m-unpriced".to_string(),
                    usage,
                })
            )
        ),
        fallback("the router's model has no known price")
    );
    assert_eq!(
        routed(&input, Err("the router timed out".to_string())),
        fallback("the router timed out")
    );
    let mut only_opus = World::platform();
    only_opus.agent.model.families = Some(vec![Family::Opus]);
    let input = only_opus.input(&replay);
    assert_eq!(
        routed(&input, choice(Family::Haiku, None)),
        failed("the model catalog has no model for the family opus".to_string()),
        "not allowed: the fallback is the first allowed family, which has no model here"
    );
    assert_eq!(allowed_families(&only_opus.agent), vec![Family::Opus]);
    assert_eq!(allowed_families(&world.agent), Family::ALL.to_vec());
    assert_eq!(
        fallback_family(&[Family::Opus, Family::Haiku]),
        Family::Opus
    );
    assert_eq!(
        fallback_family(&[Family::Opus, Family::Sonnet]),
        Family::Sonnet
    );
}

/// What raw results of effects mean for their steps.
#[test]
fn raw_results_become_outcomes() {
    let output = ExecOutput {
        exit_code: Some(1),
        stdout: Output::default(),
        stderr: Output::default(),
        timed_out: false,
        stopped: None,
    };
    assert_eq!(
        command_effect(Ok(output.clone()), None),
        Effect::Done(Outcome::CommandFinished {
            output: output.clone(),
            remade_sandbox: None
        })
    );
    let elsewhere = SandboxInfo {
        id: SandboxId("sb".to_string()),
        isolated: true,
        host: Some("unix:///run/other.sock".to_string()),
    };
    assert_eq!(
        command_effect(Ok(output.clone()), Some(elsewhere.clone())),
        Effect::Done(Outcome::CommandFinished {
            output,
            remade_sandbox: Some(elsewhere.clone())
        })
    );
    for certain in [
        sandbox::Error::NotFound(SandboxId("sb".to_string())),
        sandbox::Error::Refused("too long".to_string()),
        sandbox::Error::NotStarted("no fds".to_string()),
    ] {
        assert_eq!(
            command_effect(Err(certain.clone()), None),
            Effect::Done(failed(certain.to_string()))
        );
    }
    assert_eq!(
        command_effect(Err(sandbox::Error::Failed("lost".to_string())), None),
        Effect::Uncertain
    );

    let platform = World::platform();
    let byok = World::byok();
    let replay = Replay::default();
    let uncertain = || {
        Err(crate::model::Error {
            kind: ErrorKind::Uncertain,
            message: "cut".to_string(),
        })
    };
    let input = platform.input(&replay);
    assert_eq!(
        model_effect(&input, "m-haiku", uncertain(), true),
        None,
        "asked again"
    );
    assert_eq!(
        model_effect(&input, "m-haiku", uncertain(), false),
        Some(Effect::Done(failed("cut".to_string())))
    );
    assert_eq!(
        model_effect(&byok.input(&replay), "m-byok", uncertain(), true),
        Some(Effect::Uncertain),
        "a BYOK call is never made twice"
    );
    let Outcome::ModelReplied { response, .. } = replied(text("hi")) else {
        unreachable!()
    };
    // 100 input tokens at $1/M and 20 output at $5/M: $0.0002 ÷ 0.875, rounded up.
    assert_eq!(
        model_effect(&input, "m-haiku", Ok(response.clone()), true),
        Some(Effect::Done(Outcome::ModelReplied {
            response: response.clone(),
            cost_usd: Usd::from_nanos(228_572),
        }))
    );
    assert_eq!(
        model_effect(&byok.input(&replay), "m-byok", Ok(response.clone()), true),
        Some(Effect::Done(Outcome::ModelReplied {
            response,
            cost_usd: Usd::ZERO,
        }))
    );
}

/// The phase each decision and effect leads to, from each phase a driven run can be in.
#[test]
fn the_phase_a_decision_or_an_outcome_leads_to() {
    let queued = RunPhase::Pending(PendingReason::Queued);
    let waiting = RunPhase::Waiting(WaitReason::AwaitingMessage);
    let create = Intent::CreateSandbox {
        spec: World::platform().sandbox,
    };
    assert_eq!(acting_phase(queued, &create), Ok(RunPhase::Running));
    assert_eq!(
        acting_phase(waiting, &Intent::Route { turn: 1 }),
        Ok(RunPhase::Running)
    );
    assert_eq!(
        acting_phase(waiting, &destroy(RunPhase::Succeeded)),
        Ok(waiting),
        "a run deleting its sandbox keeps its phase until the deletion is recorded"
    );
    assert!(
        acting_phase(
            RunPhase::Waiting(WaitReason::MaxCostReached),
            &Intent::Route { turn: 1 }
        )
        .is_err(),
        "a run at its cap is never resumed"
    );
    assert_eq!(
        phase_after(RunPhase::Running, &Effect::Done(Outcome::Answered)),
        Ok(RunPhase::Running)
    );
    assert_eq!(
        phase_after(RunPhase::Running, &Effect::Uncertain),
        Ok(RunPhase::NeedsResolution)
    );
    let cases = [
        (
            queued,
            Decision::Finish(RunPhase::Cancelled(CancelReason::GroupCancelled)),
            Some(RunPhase::Cancelled(CancelReason::GroupCancelled)),
        ),
        (
            RunPhase::Running,
            Decision::Finish(RunPhase::Succeeded),
            Some(RunPhase::Succeeded),
        ),
        (
            waiting,
            Decision::Finish(RunPhase::Succeeded),
            Some(RunPhase::Succeeded),
        ),
        (
            RunPhase::Running,
            Decision::Finish(RunPhase::Failed(FailReason::SandboxFailed)),
            Some(RunPhase::Failed(FailReason::SandboxFailed)),
        ),
        (
            queued,
            Decision::Finish(RunPhase::Failed(FailReason::SandboxFailed)),
            Some(RunPhase::Failed(FailReason::SandboxFailed)),
        ),
        (
            RunPhase::Running,
            Decision::Park(3),
            Some(RunPhase::NeedsResolution),
        ),
        (
            waiting,
            Decision::Wait {
                reason: WaitReason::AwaitingFunds,
                until: None,
            },
            Some(RunPhase::Waiting(WaitReason::AwaitingFunds)),
        ),
        (RunPhase::Running, Decision::Repeat(1), None),
        (
            RunPhase::Running,
            Decision::Act(Intent::Answer { turn: 0 }),
            None,
        ),
    ];
    for (from, decision, expected) in cases {
        assert_eq!(
            phase_of(from, &decision).map(|r| r.expect("allowed")),
            expected,
            "{from:?} + {decision:?}"
        );
    }
}

/// A queued run fails once its deadline passes, and is looked at again then.
#[test]
fn a_queued_run_and_its_deadline() {
    let mut spec = AgentRunSpec::new("a", "hi");
    assert_eq!(queued(&spec, t0()), Queued::Until(None));
    spec.deadline = Some(t0() + SignedDuration::from_secs(5));
    assert_eq!(queued(&spec, t0()), Queued::Until(spec.deadline));
    assert_eq!(
        queued(&spec, t0() + SignedDuration::from_secs(5)),
        Queued::Expired(FailReason::DeadlineExceeded)
    );
}

/// The prompt a turn sends: routing gets the turn's prompt (the message read) and the
/// conversation before it; the model call the whole conversation, tool results included.
#[test]
fn the_prompt_a_turn_sends() {
    let mut world = World::platform();
    world.inbox.push(InboxMessage {
        seq: 1,
        key: None,
        payload: "and now the sizes".to_string(),
        received_at: t0(),
    });
    let journal = answered().done(
        Intent::ReadMessage {
            turn: 1,
            message_seq: 1,
        },
        Outcome::MessageRead,
    );
    let replay = Replay::of(&journal.0);
    let input = world.input(&replay);
    let (prompt, before) = route_prompt(&input, 1);
    assert_eq!(prompt, "and now the sizes");
    let roles: Vec<_> = before.iter().map(|m| m.role).collect();
    use crate::model::Role::{Assistant, User};
    assert_eq!(roles, vec![User, Assistant, User, Assistant]);
    let request = model_request(&input, "m-haiku", false, Credentials::Platform);
    assert_eq!(request.messages.len(), 5);
    assert_eq!(request.tool_choice, ToolChoice::None);
    assert_eq!(request.system, "be brief");
    assert_eq!(
        request.messages.get(2).map(|m| m.content.clone()),
        Some(vec![ContentBlock::ToolResult {
            tool_use_id: "t1".to_string(),
            content: "exit code 0\nstdout:\na.txt\n".to_string(),
            is_error: false,
        }])
    );
}

/// A model call's request shares the messages the fold keeps instead of rendering the
/// whole conversation again; what it sends is exactly the conversation rendered from the
/// turns alone (the reference kept for this test), after every step of a journal with
/// several turns, prompts read from the inbox (and one the retention sweep removed),
/// failed and pending commands, a tool that is not the shell, shell calls beyond
/// `maxToolCalls` (even with results), and a command whose result is recorded again. The incremental fold
/// and the fold of the whole journal give the same request.
#[test]
fn a_request_sends_the_conversation_as_rendered_from_the_turns() {
    let python = ContentBlock::ToolUse {
        id: "p1".to_string(),
        name: "python".to_string(),
        input: serde_json::json!({ "code": "1" }),
    };
    let read = |turn: u32, message_seq: u64| Intent::ReadMessage { turn, message_seq };
    let steps = Journal::default()
        .created()
        .routed(0)
        .replied(0, "m-haiku", true, vec![shell("t1", "ls"), python.clone()])
        .open(command(0, "t1", "ls"))
        .done(command(0, "t1", "ls"), finished(0))
        .replied(
            0,
            "m-haiku",
            true,
            vec![shell("t2", "cat a.txt"), shell("t3", "wc")],
        )
        .done(command(0, "t2", "cat a.txt"), failure("no such file"))
        .done(command(0, "t3", "wc"), finished(1))
        // Two shell calls beyond `maxToolCalls` (3): never run, denied.
        .replied(
            0,
            "m-haiku",
            true,
            vec![shell("t4", "pwd"), shell("t5", "id")],
        )
        // A journal that says they ran anyway: the model is still told they did not.
        .done(command(0, "t4", "pwd"), finished(0))
        .done(command(0, "t5", "id"), finished(0))
        .replied(0, "m-haiku", false, text("a.txt"))
        .done(Intent::Answer { turn: 0 }, Outcome::Answered)
        .done(read(1, 1), Outcome::MessageRead)
        .routed(1)
        .replied(1, "m-haiku", true, vec![shell("u1", "ls -l")])
        .done(command(1, "u1", "ls -l"), finished(0))
        // The same command's result recorded again, different.
        .done(command(1, "u1", "ls -l"), failure("recorded as failed"))
        .replied(1, "m-haiku", true, vec![shell("u2", "date")])
        .done(call(1, "m-haiku", true), failure("overloaded"))
        .replied(1, "m-haiku", true, text("done"))
        .done(Intent::Answer { turn: 1 }, Outcome::Answered)
        .done(read(2, 2), Outcome::MessageRead)
        .routed(2)
        .replied(2, "m-haiku", true, vec![shell("v1", "echo hi")])
        .open(command(2, "v1", "echo hi"))
        .0;
    let message = |seq: u64, payload: &str| InboxMessage {
        seq,
        key: None,
        payload: payload.to_string(),
        received_at: t0(),
    };
    let mut world = World::platform();
    world.agent.max_tool_calls = 3;
    let both = vec![message(1, "and now?"), message(2, "once more")];
    // The retention sweep removed the first message.
    let swept = vec![message(2, "once more")];
    let mut replay = Replay::default();
    for (at, step) in steps.iter().enumerate() {
        replay.apply(step);
        for inbox in [&both, &swept] {
            world.inbox = inbox.clone();
            let request = model_request(
                &world.input(&replay),
                "m-haiku",
                true,
                Credentials::Platform,
            );
            let expected = Replay::of(&steps[..=at]).conversation_rebuilt(
                "list the files",
                inbox,
                world.agent.max_tool_calls,
            );
            assert_eq!(request.messages.to_vec(), expected, "after step {at}");
            assert_eq!(
                serde_json::to_string(&request.messages).expect("json"),
                serde_json::to_string(&expected).expect("json"),
                "after step {at}"
            );
            let whole = Replay::of(&steps[..=at]);
            let again = model_request(&world.input(&whole), "m-haiku", true, Credentials::Platform);
            assert_eq!(again.messages, request.messages, "after step {at}");
        }
    }
    // The whole story, spelled out where it matters.
    world.inbox = swept.clone();
    let request = model_request(
        &world.input(&replay),
        "m-haiku",
        true,
        Credentials::Platform,
    );
    let texts: Vec<String> = request
        .messages
        .iter()
        .flat_map(|m| &m.content)
        .filter_map(|block| match block {
            ContentBlock::Text { text } => Some(text.clone()),
            ContentBlock::ToolResult { content, .. } => Some(content.clone()),
            ContentBlock::ToolUse { .. } => None,
        })
        .collect();
    assert_eq!(
        texts,
        vec![
            "list the files".to_string(),
            "exit code 0\nstdout:\na.txt\n".to_string(),
            "not run: the only tool is `shell`, and it takes {\"command\": \"<shell command line>\"}".to_string(),
            "the command failed: no such file".to_string(),
            "exit code 1\nstdout:\na.txt\n".to_string(),
            "not run: this turn already ran 3 commands (maxToolCalls); answer with what you have".to_string(),
            "not run: this turn already ran 3 commands (maxToolCalls); answer with what you have".to_string(),
            "a.txt".to_string(),
            "[message no longer stored]".to_string(),
            "the command failed: recorded as failed".to_string(),
            "the command has not run yet".to_string(),
            "done".to_string(),
            "once more".to_string(),
            "the command has not run yet".to_string(),
        ]
    );
}

fn started(at: Timestamp) -> Replay {
    Replay::of(&[crate::journal::Step {
        seq: 0,
        started_at: at,
        intent: Intent::Route { turn: 0 },
        completion: None,
    }])
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
    assert_eq!(
        time_limit(&spec, &Replay::default()),
        None,
        "not started: no timeout yet"
    );
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

/// One reply the model at the bound gives: text, or shell calls (command lengths).
#[derive(Debug, Clone)]
enum Said {
    Text(usize),
    Commands(Vec<usize>),
}

fn said() -> impl proptest::strategy::Strategy<Value = Said> {
    use proptest::prelude::*;
    prop_oneof![
        (0usize..400).prop_map(Said::Text),
        proptest::collection::vec(1usize..300, 1..4).prop_map(Said::Commands),
    ]
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(200))]

    /// The worst-case bound: a model at the bound (every byte of the request it is sent a
    /// prompt token, at whichever input rate — uncached, cache write, cache read — the
    /// split says; `maxTokens` of output) never costs more than its step reserved, and
    /// the run's spend never passes its cap, whatever the conversation, the outputs, the
    /// cap, `maxTokens` and `maxToolCalls`; prices have a long-prompt band, so calls
    /// cross it.
    #[test]
    fn a_model_at_the_bound_never_costs_more_than_its_step_reserved(
        cap_cents in 1u64..40,
        max_tokens in 400u32..3000,
        max_tool_calls in 1u32..4,
        replies in proptest::collection::vec(said(), 1..12),
        outputs in proptest::collection::vec(0usize..30_000, 1..6),
        split in (0u64..=4, 0u64..=4),
    ) {
        let mut world = World::platform();
        world.agent.per_run_max_cost_usd = Usd::from_cents(cap_cents);
        world.agent.max_tokens = max_tokens;
        world.agent.max_tool_calls = max_tool_calls;
        for entry in world.catalog.families.values_mut() {
            entry.prices.long_prompt = Some(crate::cost::LongPromptBand {
                above_prompt_tokens: 6_000,
                rates: Rates {
                    input: Usd::from_cents(200),
                    output: Usd::from_cents(750),
                    cache_write: Usd::from_cents(250),
                    cache_read: Usd::from_cents(20),
                },
            });
        }
        let prices = *world.catalog.prices_of("m-haiku").expect("priced");
        let cap = world.agent.per_run_max_cost_usd;
        let mut journal = Journal::default();
        let mut replies = replies.into_iter();
        let mut outputs = outputs.iter().cycle();
        let mut calls = 0u32;
        let mut ended = false;
        for _ in 0..400 {
            let replay = Replay::of(&journal.0);
            proptest::prop_assert!(replay.spent <= cap, "spent {} over the cap {cap}", replay.spent);
            let input = world.input(&replay);
            match decide(&input) {
                Decision::Act(Intent::CreateSandbox { .. }) => {
                    journal = journal.created();
                }
                Decision::Act(Intent::Route { turn }) => {
                    journal = journal.routed(turn);
                }
                Decision::Act(intent @ Intent::CallModel { .. }) => {
                    let Intent::CallModel { model, reserved_usd, tools, .. } = &intent else {
                        unreachable!()
                    };
                    let request = model_request(&input, model, *tools, Credentials::Platform);
                    // What it sends is the conversation rendered from the turns alone.
                    proptest::prop_assert_eq!(
                        request.messages.to_vec(),
                        replay.conversation_rebuilt("list the files", &[], max_tool_calls)
                    );
                    let bytes = |value: &dyn erased::Json| value.json_len();
                    let prompt = bytes(&request.system)
                        + bytes(&request.tools)
                        + bytes(&request.messages);
                    // The prompt's tokens split over the input rates.
                    let (a, b) = split;
                    let cache_write = prompt * a / 8;
                    let cache_read = prompt * b / 8;
                    let usage = Usage {
                        input_tokens: prompt - cache_write - cache_read,
                        output_tokens: u64::from(max_tokens),
                        cache_write_tokens: cache_write,
                        cache_read_tokens: cache_read,
                    };
                    let cost = cost::bill(&prices, &usage);
                    proptest::prop_assert!(
                        cost <= *reserved_usd,
                        "call {calls}: {usage:?} costs {cost}, reserved {reserved_usd}"
                    );
                    // What it says: at most maxTokens bytes (a token per byte).
                    let content = match replies.next() {
                        Some(Said::Commands(lengths)) if *tools => lengths
                            .iter()
                            .enumerate()
                            .map(|(i, length)| shell(&format!("t{calls}-{i}"), &"x".repeat(*length)))
                            .collect(),
                        Some(Said::Text(length)) => text(&"y".repeat(length)),
                        _ => text("done"),
                    };
                    let fits = serde_json::to_vec(&content).expect("json").len()
                        <= max_tokens as usize;
                    let mut outcome = replied(if fits { content } else { text("done") });
                    if let Outcome::ModelReplied { response, cost_usd } = &mut outcome {
                        response.usage = usage;
                        *cost_usd = cost;
                    }
                    journal = journal.done(intent.clone(), outcome);
                    calls += 1;
                }
                Decision::Act(intent @ Intent::Command { .. }) => {
                    let length = *outputs.next().expect("an output");
                    let mut output = ExecOutput {
                        exit_code: Some(0),
                        stdout: Output::default(),
                        stderr: Output::default(),
                        timed_out: false,
                        stopped: None,
                    };
                    output.stdout.bytes = vec![b'o'; length];
                    journal = journal.done(
                        intent,
                        Outcome::CommandFinished {
                            output,
                            remade_sandbox: None,
                        },
                    );
                }
                Decision::Act(intent @ Intent::Answer { .. }) => {
                    journal = journal.done(intent, Outcome::Answered);
                }
                Decision::Act(intent @ Intent::DestroySandbox { .. }) => {
                    journal = journal.done(intent, Outcome::SandboxDestroyed);
                }
                Decision::Finish(_)
                | Decision::Wait {
                    reason: WaitReason::MaxCostReached,
                    ..
                } => {
                    ended = true;
                    break;
                }
                other => proptest::prop_assert!(false, "unexpected decision {other:?}"),
            }
        }
        proptest::prop_assert!(ended, "the run ended or reached its cap");
    }
}

/// The length of a value's JSON.
mod erased {
    pub trait Json {
        fn json_len(&self) -> u64;
    }
    impl<T: serde::Serialize> Json for T {
        fn json_len(&self) -> u64 {
            serde_json::to_vec(self).map_or(0, |json| json.len() as u64)
        }
    }
}

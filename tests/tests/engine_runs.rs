//! Engine behaviours over the in-memory store: messages on keepAlive runs, deadlines,
//! cancellation, maxToolCalls, the cost cap, stopped agents, BYOK runs and groups.

mod support;

use std::time::Duration;

use nodus_core::engine::Driven;
use nodus_core::group::GroupPhase;
use nodus_core::journal::{Intent, StepKind};
use nodus_core::lifecycle::{
    CancelReason, FailReason, PendingReason, Resolution, RunPhase, WaitReason,
};
use nodus_core::model::{self, ErrorKind};
use nodus_core::resource::{
    Access, AgentGroup, AgentGroupSpec, AgentRun, AgentRunSpec, AgentState, GroupLimits,
};
use nodus_core::secret::SecretString;
use nodus_core::store::{Delivery, Selector, Store as _};
use nodus_core::testing::Drive;
use nodus_core::{Clock, Usd};
use nodus_llm::Reply;
use support::{PROJECT, World, agent, helper_run, run, waiting_chat};

fn text(s: &str) -> Reply {
    Reply::Text(s.to_string())
}

fn commands(list: &[&str]) -> Reply {
    Reply::Commands(list.iter().map(|c| c.to_string()).collect())
}

#[tokio::test]
async fn keep_alive_run_reads_messages_once_and_refuses_them_when_finished() {
    let world = World::new(vec![
        text("first"),
        commands(&["echo staging"]),
        text("second"),
    ]);
    let engine = world.engine();
    waiting_chat(&engine).await;
    assert_eq!(
        world.sandbox.live().len(),
        1,
        "the waiting run keeps its sandbox"
    );
    assert_eq!(
        world.sandbox.suspended(),
        world.sandbox.live(),
        "but no process of it while it waits"
    );
    let calls = world.model.calls();

    let first = engine
        .send_message(PROJECT, "chat", "Now the staging logs", Some("staging-1"))
        .await
        .expect("send");
    let again = engine
        .send_message(PROJECT, "chat", "Now the staging logs", Some("staging-1"))
        .await
        .expect("send again");
    assert_eq!(first, Delivery::Delivered(1));
    assert_eq!(again, Delivery::Duplicate(1), "the same key delivers once");
    assert_eq!(world.model.calls(), calls, "waiting uses no model");

    let driven = engine.drive(PROJECT, "chat").await.expect("drive");
    assert!(matches!(driven, Driven::Waiting { .. }));
    assert_eq!(
        engine
            .answer(PROJECT, "chat")
            .await
            .expect("answer")
            .as_deref(),
        Some("second")
    );
    assert_eq!(world.sandbox.count("echo staging"), 1);
    assert_eq!(
        world.sandbox.suspended(),
        world.sandbox.live(),
        "the command ran in the sandbox, which is suspended again as the run waits"
    );
    let steps = engine.steps(PROJECT, "chat").await.expect("steps");
    assert_eq!(
        steps.iter().filter(|s| s.kind == StepKind::Message).count(),
        1
    );

    let runner = world.runner(&engine);
    engine.cancel_run(PROJECT, "chat").await.expect("cancel");
    let cancelled = runner.settled(PROJECT, "chat").await.expect("cancelled");
    runner.shutdown().await;
    assert_eq!(
        cancelled.status.phase,
        Some(RunPhase::Cancelled(CancelReason::CancelRequested))
    );
    assert!(
        world.sandbox.live().is_empty(),
        "cancel deletes the sandbox"
    );
    let refused = engine
        .send_message(PROJECT, "chat", "anyone there?", Some("late"))
        .await
        .expect_err("finished");
    assert_eq!(refused.reason(), "AgentRunFinished");
    // A repeat of a delivered key is still answered as a repeat.
    let repeat = engine
        .send_message(PROJECT, "chat", "Now the staging logs", Some("staging-1"))
        .await
        .expect("repeat");
    assert_eq!(repeat, Delivery::Duplicate(1));
}

#[tokio::test]
async fn a_message_sent_while_working_is_read_after_the_current_turn() {
    let world = World::new(vec![text("one"), text("two")]);
    let engine = world.engine();
    helper_run(&engine, "work", "go", |_| {}).await;
    // Not keepAlive, and the message arrives before the run finishes its turn.
    engine
        .send_message(PROJECT, "work", "and this", None)
        .await
        .expect("send");
    let driven = engine.drive(PROJECT, "work").await.expect("drive");
    assert_eq!(driven, Driven::Finished(RunPhase::Succeeded));
    let run = engine.get_run(PROJECT, "work").await.expect("run");
    assert_eq!(run.status.turns.len(), 2);
    assert_eq!(run.status.answer.expect("answer").preview, "two");
}

/// A world whose model answers "answer", and its engine with the agent `worker`.
async fn with_worker() -> (World, nodus_core::engine::Engine) {
    let world = World::new(vec![text("answer")]);
    let engine = world.engine();
    engine
        .apply_agent(PROJECT, agent("worker", |_| {}))
        .await
        .expect("agent");
    (world, engine)
}

/// A group spec of the agent `worker`: at most `max_active` at once, no cap.
fn worker_group(max_active: u32, sealed: bool) -> AgentGroupSpec {
    AgentGroupSpec {
        agent: "worker".to_string(),
        limits: GroupLimits {
            max_active,
            ..GroupLimits::default()
        },
        max_cost_usd: None,
        sealed,
        evaluation: None,
    }
}

/// A deadline one minute after the world's clock.
fn a_minute_from_now(world: &World) -> jiff::Timestamp {
    world
        .clock
        .now()
        .checked_add(jiff::SignedDuration::from_secs(60))
        .expect("time")
}

#[tokio::test]
async fn deadline_fails_a_waiting_run_without_another_model_call() {
    let world = World::new(vec![text("first")]);
    let engine = world.engine();
    engine
        .apply_agent(PROJECT, agent("helper", |_| {}))
        .await
        .expect("agent");
    let deadline = a_minute_from_now(&world);
    engine
        .create_run(
            PROJECT,
            run("chat", "helper", "hi", |s| {
                s.keep_alive = true;
                s.deadline = Some(deadline);
            }),
        )
        .await
        .expect("run");
    let driven = engine.drive(PROJECT, "chat").await.expect("drive");
    assert_eq!(
        driven,
        Driven::Waiting {
            reason: WaitReason::AwaitingMessage,
            until: Some(deadline)
        }
    );
    let calls = world.model.calls();
    world.clock.advance(Duration::from_secs(61));
    // The runner ends it at its deadline by itself.
    let runner = world.runner(&engine);
    let ended = engine
        .finished_run(PROJECT, "chat", Duration::from_secs(3600))
        .await
        .expect("run");
    runner.shutdown().await;
    assert_eq!(
        ended.status.phase,
        Some(RunPhase::Failed(FailReason::DeadlineExceeded))
    );
    assert_eq!(world.model.calls(), calls);
    assert!(world.sandbox.live().is_empty());
    let run = engine.get_run(PROJECT, "chat").await.expect("run");
    assert_eq!(
        run.status.phase.and_then(|p| p.reason()),
        Some("DeadlineExceeded")
    );
    assert!(run.status.completion_time.is_some());
}

#[tokio::test]
async fn max_tool_calls_bounds_the_commands_of_a_turn() {
    let world = World::new(vec![
        commands(&["echo a", "echo b", "echo c"]),
        commands(&["echo d"]),
        text("done"),
    ]);
    let engine = world.engine();
    engine
        .apply_agent(PROJECT, agent("helper", |a| a.max_tool_calls = 2))
        .await
        .expect("agent");
    engine
        .create_run(PROJECT, run("busy", "helper", "go", |_| {}))
        .await
        .expect("run");
    let driven = engine.drive(PROJECT, "busy").await.expect("drive");
    assert_eq!(driven, Driven::Finished(RunPhase::Succeeded));
    assert_eq!(world.sandbox.executions(), ["echo a", "echo b"]);
    let journal = engine.journal(PROJECT, "busy").await.expect("journal");
    let calls: Vec<bool> = journal
        .iter()
        .filter_map(|s| match s.intent {
            Intent::CallModel { tools, .. } => Some(tools),
            _ => None,
        })
        .collect();
    assert_eq!(
        calls,
        [true, false],
        "after the limit the model may not call tools"
    );
    // The scripted model, asked without tools, answers in text.
    let answer = engine
        .answer(PROJECT, "busy")
        .await
        .expect("answer")
        .expect("some");
    assert!(answer.contains("Tools are closed"), "{answer}");
}

#[tokio::test]
async fn a_call_that_does_not_fit_under_the_cap_is_not_made() {
    let world = World::new(vec![text("never")]);
    let engine = world.engine();
    // A cap far below the worst case of one call (maxTokens of output alone costs more).
    engine
        .apply_agent(
            PROJECT,
            agent("cheap", |a| a.per_run_max_cost_usd = Usd::from_nanos(1_000)),
        )
        .await
        .expect("agent");
    engine
        .create_run(PROJECT, run("capped", "cheap", "go", |_| {}))
        .await
        .expect("run");
    let driven = engine.drive(PROJECT, "capped").await.expect("drive");
    assert!(
        matches!(
            driven,
            Driven::Waiting {
                reason: WaitReason::MaxCostReached,
                ..
            }
        ),
        "{driven:?}"
    );
    assert_eq!(world.model.calls(), 0);
    let run = engine.get_run(PROJECT, "capped").await.expect("run");
    assert_eq!(run.status.cost.total_usd, Usd::ZERO);
    assert_eq!(run.status.cost.limit_usd, Some(Usd::from_nanos(1_000)));
    // It stays there: driving again makes no call.
    engine.drive(PROJECT, "capped").await.expect("drive");
    assert_eq!(world.model.calls(), 0);
}

#[tokio::test]
async fn spend_stays_under_the_cap_across_calls() {
    let script = (0..100)
        .map(|i| commands(&[&format!("echo {i}")]))
        .collect();
    let world = World::new(script);
    let engine = world.engine();
    // Each call's worst case (4096 output tokens) is most of the cap, so the guard stops the
    // run after a few calls, well before the script ends.
    let cap = Usd::from_cents(3);
    engine
        .apply_agent(
            PROJECT,
            agent("looper", |a| {
                a.per_run_max_cost_usd = cap;
                a.max_tool_calls = 1000;
                a.max_tokens = 4096;
            }),
        )
        .await
        .expect("agent");
    engine
        .create_run(PROJECT, run("loop", "looper", "go", |_| {}))
        .await
        .expect("run");
    let driven = engine.drive(PROJECT, "loop").await.expect("drive");
    assert!(
        matches!(
            driven,
            Driven::Waiting {
                reason: WaitReason::MaxCostReached,
                ..
            }
        ),
        "{driven:?}"
    );
    let run = engine.get_run(PROJECT, "loop").await.expect("run");
    assert!(
        run.status.cost.total_usd <= cap,
        "{}",
        run.status.cost.total_usd
    );
    assert!(world.model.calls() > 1);
}

#[tokio::test]
async fn a_stopped_agent_refuses_new_runs_and_bad_references_fail_the_request() {
    let world = World::new(vec![]);
    let engine = world.engine();
    engine
        .apply_agent(PROJECT, agent("off", |a| a.state = AgentState::Stopped))
        .await
        .expect("agent");
    let error = engine
        .create_run(PROJECT, run("r", "off", "go", |_| {}))
        .await
        .expect_err("stopped");
    assert_eq!(error.reason(), "AgentStopped");
    let error = engine
        .create_run(PROJECT, run("r", "missing", "go", |_| {}))
        .await
        .expect_err("missing agent");
    assert_eq!(error.reason(), "Invalid");
    assert!(error.to_string().contains("spec.agent"), "{error}");
    // Another project's agent is answered exactly as a missing one: nothing of it shows.
    engine
        .apply_agent("other", agent("private", |_| {}))
        .await
        .expect("another project's agent");
    let answer = |error: nodus_core::engine::Error, reference: &str| {
        (error.reason(), error.to_string().replace(reference, "REF"))
    };
    let foreign = engine
        .create_run(PROJECT, run("r", "other/private", "go", |_| {}))
        .await
        .expect_err("another project's agent");
    let missing = engine
        .create_run(PROJECT, run("r", "other/nothing", "go", |_| {}))
        .await
        .expect_err("a missing agent of another project");
    assert_eq!(
        answer(foreign, "other/private"),
        answer(missing, "other/nothing")
    );
    let group = AgentGroupSpec {
        agent: "other/private".to_string(),
        limits: GroupLimits::default(),
        max_cost_usd: None,
        sealed: false,
        evaluation: None,
    };
    let error = engine
        .apply_group(PROJECT, AgentGroup::new("borrowed", group))
        .await
        .expect_err("a group on another project's agent");
    assert_eq!(error.reason(), "Invalid");
    let error = engine
        .create_run(PROJECT, run("Bad_Name", "off", "go", |_| {}))
        .await
        .expect_err("bad name");
    assert!(error.to_string().contains("metadata.name"), "{error}");
    let big = "x".repeat(256 * 1024 + 1);
    engine
        .apply_agent(PROJECT, agent("on", |_| {}))
        .await
        .expect("agent");
    let error = engine
        .create_run(PROJECT, run("big", "on", &big, |_| {}))
        .await
        .expect_err("oversize input");
    assert!(error.to_string().contains("spec.input"), "{error}");
    assert!(
        engine
            .list::<AgentRunSpec>(PROJECT, &Selector::default())
            .await
            .expect("list")
            .is_empty(),
        "nothing written"
    );
}

/// A world whose agent `mine` runs on the user's own key, and a run `byok` of it whose first
/// model call has an uncertain outcome, driven until it parks.
async fn parked_byok_run(deadline: Option<jiff::Timestamp>) -> (World, nodus_core::engine::Engine) {
    let mut world = World::new(vec![text("hello from my key")]);
    world.secrets = world.secrets.clone().with(
        PROJECT,
        "anthropic-key",
        "ANTHROPIC_API_KEY",
        SecretString::new("sk-test"),
    );
    let engine = world.engine();
    engine
        .apply_agent(
            PROJECT,
            agent("mine", |a| {
                a.model.access = Access::Byok;
                a.model.name = Some("claude-sonnet-4-5".to_string());
                a.model.api_key_secret = Some("anthropic-key".to_string());
            }),
        )
        .await
        .expect("agent");
    engine
        .create_run(
            PROJECT,
            run("byok", "mine", "hi", |s| s.deadline = deadline),
        )
        .await
        .expect("run");
    world.model.fail_next(model::Error {
        kind: ErrorKind::Uncertain,
        message: "connection reset after sending".into(),
    });
    let started = world.clock.now();
    let driven = engine.drive(PROJECT, "byok").await.expect("drive");
    // Parked on its model call (a BYOK run has no routing step), until its deadline, or
    // without one the end of its default hour.
    let until = deadline.or(started
        .checked_add(jiff::SignedDuration::from_hours(1))
        .ok());
    assert_eq!(driven, Driven::Parked { seq: 1, until });
    (world, engine)
}

#[tokio::test]
async fn a_parked_run_fails_at_its_deadline_unresolved() {
    let deadline = a_minute_from_now(&World::new(vec![]));
    let (world, engine) = parked_byok_run(Some(deadline)).await;
    let calls = world.model.calls();
    world.clock.advance(Duration::from_secs(61));
    assert_eq!(
        engine.drive(PROJECT, "byok").await.expect("drive"),
        Driven::Finished(RunPhase::Failed(FailReason::DeadlineExceeded))
    );
    assert_eq!(world.model.calls(), calls, "no call is made again");
    assert!(world.sandbox.live().is_empty(), "its sandbox is deleted");
}

#[tokio::test]
async fn an_uncertain_byok_call_parks_and_retry_resolves_it() {
    let (_world, engine) = parked_byok_run(None).await;
    let parked = engine.get_run(PROJECT, "byok").await.expect("run");
    assert_eq!(parked.status.phase, Some(RunPhase::NeedsResolution));
    assert_eq!(parked.status.cost.limit_usd, None, "BYOK runs have no cap");
    let runner = _world.runner(&engine);
    engine
        .resolve(PROJECT, "byok", Resolution::Retry)
        .await
        .expect("resolve");
    let finished = runner.settled(PROJECT, "byok").await.expect("run");
    runner.shutdown().await;
    assert_eq!(finished.status.phase, Some(RunPhase::Succeeded));
    assert_eq!(
        finished.status.cost.total_usd,
        Usd::ZERO,
        "BYOK calls cost nothing on the platform"
    );
    assert_eq!(finished.status.turns[0].model, "claude-sonnet-4-5");
    // A BYOK agent whose secret is missing is refused at creation.
    engine
        .apply_agent(
            PROJECT,
            agent("nokey", |a| {
                a.model.access = Access::Byok;
                a.model.name = Some("claude-sonnet-4-5".to_string());
                a.model.api_key_secret = Some("absent".to_string());
            }),
        )
        .await
        .expect("agent");
    let error = engine
        .create_run(PROJECT, run("x", "nokey", "hi", |_| {}))
        .await
        .expect_err("no secret");
    assert!(error.to_string().contains("apiKeySecret"), "{error}");
}

#[tokio::test]
async fn an_uncertain_platform_call_is_repeated_not_parked() {
    let world = World::new(vec![text("ok")]);
    let engine = world.engine();
    helper_run(&engine, "p", "hi", |_| {}).await;
    world.model.fail_next(model::Error {
        kind: ErrorKind::Uncertain,
        message: "timeout".into(),
    });
    let driven = engine.drive(PROJECT, "p").await.expect("drive");
    assert_eq!(driven, Driven::Finished(RunPhase::Succeeded));
    assert_eq!(world.model.calls(), 2);
}

#[tokio::test]
async fn a_final_model_error_fails_the_run_and_deletes_its_sandbox() {
    let world = World::new(vec![text("ok")]);
    let engine = world.engine();
    helper_run(&engine, "p", "hi", |_| {}).await;
    world.model.fail_next(model::Error {
        kind: ErrorKind::Final,
        message: "invalid request".into(),
    });
    let driven = engine.drive(PROJECT, "p").await.expect("drive");
    assert_eq!(
        driven,
        Driven::Finished(RunPhase::Failed(FailReason::ModelCallFailed))
    );
    assert!(world.sandbox.live().is_empty());
    let run = engine.get_run(PROJECT, "p").await.expect("run");
    assert_eq!(run.status.message.as_deref(), Some("invalid request"));
}

#[tokio::test]
async fn a_run_another_replica_holds_is_cancelled_and_its_delete_refused_until_it_ends() {
    use nodus_core::store::{Lease, Store as _};
    let (world, engine) = with_worker().await;
    let created = engine
        .create_run(PROJECT, run("busy", "worker", "q", |s| s.keep_alive = true))
        .await
        .expect("run");
    let uid = created.metadata.uid.clone().expect("a uid");
    // Started (it waits for a message, its sandbox live), and now another replica has
    // claimed it and works on it.
    assert!(matches!(
        engine.drive(PROJECT, "busy").await.expect("drive"),
        Driven::Waiting { .. }
    ));
    world
        .memory
        .claim(
            &uid,
            &Lease::new("other-replica", world.clock.now(), Duration::from_secs(30)),
        )
        .await
        .expect("claim");
    // The delete records the cancellation and waits for the run's runner to end it; nobody
    // here does, and it gives up once `Config::delete_wait` has passed on the clock.
    let deleting = engine.delete::<AgentRun>(PROJECT, "busy");
    let gives_up_at = world
        .clock
        .now()
        .checked_add(
            jiff::SignedDuration::try_from(nodus_core::engine::Config::default().delete_wait)
                .expect("a wait"),
        )
        .expect("a time");
    let waiting = async {
        // Once the delete waits for the run to end (until its wait is over), the wait passes.
        world.clock.until_waited_for(gives_up_at).await;
        world.clock.advance(Duration::from_secs(31));
    };
    let (deleted, ()) = tokio::join!(deleting, waiting);
    let error = deleted.expect_err("held by another replica");
    assert_eq!(error.reason(), "Conflict", "{error}");
    assert!(error.to_string().contains("delete it again"), "{error}");
    let kept = engine.get_run(PROJECT, "busy").await.expect("still there");
    assert!(
        kept.status.cancel_requested.is_some(),
        "its cancellation is recorded for the replica that runs it"
    );
}

#[tokio::test]
async fn a_swept_run_takes_its_own_spec_again_and_keeps_its_input_removed() {
    let (world, engine) = with_worker().await;
    let applied = run("kept", "worker", "private question", |_| {});
    engine
        .create_run(PROJECT, applied.clone())
        .await
        .expect("run");
    assert_eq!(
        engine.drive(PROJECT, "kept").await.expect("drive"),
        Driven::Finished(RunPhase::Succeeded)
    );
    let later = a_minute_from_now(&world);
    nodus_core::retention::sweep(&world.memory, &[PROJECT.to_string()], later, later)
        .await
        .expect("sweep");
    // The manifest applied again, as a GitOps loop does: no change, and no input comes back.
    engine
        .replace(PROJECT, "kept", applied.clone(), None)
        .await
        .expect("the same spec again");
    let stored = engine.get_run(PROJECT, "kept").await.expect("run");
    assert_eq!(stored.spec.input, None, "the input stays removed");
    let mut changed = applied;
    changed.spec.keep_alive = true;
    let error = engine
        .replace(PROJECT, "kept", changed, None)
        .await
        .expect_err("another spec");
    assert_eq!(error.reason(), "Invalid");
}

#[tokio::test]
async fn a_queued_group_run_fails_at_its_deadline_and_its_dependents_with_it() {
    let (world, engine) = with_worker().await;
    let spec = worker_group(1, true);
    engine
        .apply_group(
            PROJECT,
            AgentGroup::new(
                "g",
                AgentGroupSpec {
                    sealed: false,
                    ..spec.clone()
                },
            ),
        )
        .await
        .expect("group");
    let deadline = a_minute_from_now(&world);
    for (key, deps, deadline) in [
        ("first", vec![], None),
        ("late", vec![], Some(deadline)),
        ("after", vec!["late".to_string()], None),
    ] {
        let mut r = run("", "worker", "q", |s| {
            s.group = Some("g".to_string());
            s.task_key = Some(key.to_string());
            s.depends_on = deps;
            s.deadline = deadline;
        });
        r.metadata.name = None;
        engine.create_run(PROJECT, r).await.expect("task");
    }
    // "first" holds the only slot and is never driven: "late" stays queued.
    assert_eq!(
        engine.drive(PROJECT, "g-late").await.expect("late"),
        Driven::NotAdmitted {
            until: Some(deadline)
        },
        "queued, to be looked at again at its deadline"
    );
    world.clock.advance(Duration::from_secs(61));
    assert_eq!(
        engine.drive(PROJECT, "g-late").await.expect("late"),
        Driven::Finished(RunPhase::Failed(FailReason::DeadlineExceeded))
    );
    let late = engine.get_run(PROJECT, "g-late").await.expect("late");
    assert!(late.status.completion_time.is_some());
    assert!(world.sandbox.live().is_empty(), "it never had a sandbox");
    engine
        .apply_group(PROJECT, AgentGroup::new("g", spec))
        .await
        .expect("seal");
    let after = engine.get_run(PROJECT, "g-after").await.expect("after");
    assert_eq!(
        after.status.phase,
        Some(RunPhase::Cancelled(CancelReason::DependencyFailed)),
        "its dependent does not wait for it forever"
    );
}

#[tokio::test]
async fn group_runs_start_in_dependency_order_under_max_active() {
    let world = World::new(vec![text("answer")]);
    let engine = world.engine();
    engine
        .apply_agent(
            PROJECT,
            agent("worker", |a| {
                a.per_run_max_cost_usd = Usd::from_cents(10);
            }),
        )
        .await
        .expect("agent");
    let mut spec = support::open_group("worker", 1, Some(Usd::from_cents(60)));
    engine
        .apply_group(PROJECT, AgentGroup::new("g", spec.clone()))
        .await
        .expect("group");
    for (key, deps) in [
        ("a", vec![]),
        ("b", vec![]),
        ("c", vec!["a".to_string(), "b".to_string()]),
    ] {
        let mut r = run("", "worker", "q", |s| {
            s.group = Some("g".to_string());
            s.task_key = Some(key.to_string());
            s.depends_on = deps;
        });
        r.metadata.name = None;
        engine.create_run(PROJECT, r).await.expect("task");
    }
    // What a runner does when runs of the group change.
    engine
        .reconcile_group(PROJECT, "g")
        .await
        .expect("reconcile");
    let c = engine.get_run(PROJECT, "g-c").await.expect("c");
    assert_eq!(
        c.status.phase,
        Some(RunPhase::Pending(PendingReason::DependencyWait))
    );
    assert_eq!(
        engine.drive(PROJECT, "g-b").await.expect("b"),
        Driven::NotAdmitted { until: None },
        "maxActive 1"
    );
    assert_eq!(
        engine.drive(PROJECT, "g-a").await.expect("a"),
        Driven::Finished(RunPhase::Succeeded)
    );
    engine
        .reconcile_group(PROJECT, "g")
        .await
        .expect("reconcile");
    assert_eq!(
        engine.drive(PROJECT, "g-b").await.expect("b"),
        Driven::Finished(RunPhase::Succeeded)
    );
    engine
        .reconcile_group(PROJECT, "g")
        .await
        .expect("reconcile");
    assert_eq!(
        engine.drive(PROJECT, "g-c").await.expect("c"),
        Driven::Finished(RunPhase::Succeeded)
    );
    let group = engine
        .reconcile_group(PROJECT, "g")
        .await
        .expect("reconcile");
    assert_eq!(
        group.status.phase,
        Some(GroupPhase::Running),
        "not sealed yet"
    );
    spec.sealed = true;
    let group = engine
        .apply_group(PROJECT, AgentGroup::new("g", spec.clone()))
        .await
        .expect("seal");
    assert_eq!(group.status.phase, Some(GroupPhase::Succeeded));
    assert_eq!(group.status.counts.succeeded, 3);
    let sealed = engine
        .create_run(
            PROJECT,
            run("g-d", "worker", "q", |s| {
                s.group = Some("g".to_string());
                s.task_key = Some("d".to_string());
            }),
        )
        .await
        .expect_err("sealed");
    assert_eq!(sealed.reason(), "Conflict");
    spec.sealed = false;
    let unseal = engine
        .apply_group(PROJECT, AgentGroup::new("g", spec))
        .await
        .expect_err("unseal");
    assert_eq!(unseal.reason(), "Conflict");
}

#[tokio::test]
async fn batches_are_all_or_nothing_in_list_order_and_idempotent() {
    let (_world, engine) = with_worker().await;
    let batch = |count: usize| -> Vec<_> {
        (0..count)
            .map(|i| run(&format!("b-{i:03}"), "worker", "q", |_| {}))
            .collect()
    };
    let error = engine
        .create_runs(PROJECT, batch(101), None)
        .await
        .expect_err("101 runs");
    assert_eq!(error.reason(), "Invalid");
    assert!(error.to_string().contains("at most 100"), "{error}");

    // The 57th run is invalid: nothing of the batch is written, and the error names it.
    let mut bad = batch(100);
    bad[56].spec.input = Some(String::new());
    let error = engine
        .create_runs(PROJECT, bad, None)
        .await
        .expect_err("item 56");
    assert!(
        error.to_string().starts_with("items[56].spec.input"),
        "{error}"
    );
    assert!(
        engine
            .list::<AgentRunSpec>(PROJECT, &Selector::default())
            .await
            .expect("list")
            .is_empty()
    );

    let first = engine
        .create_runs(PROJECT, batch(100), Some("key-1"))
        .await
        .expect("batch");
    let names: Vec<_> = first.iter().map(|r| r.name().to_string()).collect();
    let listed: Vec<_> = engine
        .list::<AgentRunSpec>(PROJECT, &Selector::default())
        .await
        .expect("list")
        .iter()
        .map(|r| r.name().to_string())
        .collect();
    assert_eq!(listed, names, "created in list order");
    let again = engine
        .create_runs(PROJECT, batch(100), Some("key-1"))
        .await
        .expect("repeat");
    assert_eq!(
        again
            .iter()
            .map(|r| r.name().to_string())
            .collect::<Vec<_>>(),
        names
    );
    assert_eq!(
        engine
            .list::<AgentRunSpec>(PROJECT, &Selector::default())
            .await
            .expect("list")
            .len(),
        100
    );
    // The same key with other runs is refused, naming the key, and writes nothing.
    let other = vec![run("c-000", "worker", "q", |_| {})];
    let error = engine
        .create_runs(PROJECT, other, Some("key-1"))
        .await
        .expect_err("another batch under the same key");
    assert_eq!(error.reason(), "Invalid");
    assert!(error.to_string().starts_with("Idempotency-Key"), "{error}");
    assert!(
        engine.get_run(PROJECT, "c-000").await.is_err(),
        "not written"
    );
    // Without the key, the same batch collides with the runs that exist.
    let error = engine
        .create_runs(PROJECT, batch(1), None)
        .await
        .expect_err("exists");
    assert_eq!(error.reason(), "AlreadyExists");
}

/// Run fields this engine does not carry out yet are refused at creation, naming the field,
/// and nothing is written: they are never accepted and silently ignored.
#[tokio::test]
async fn fields_not_carried_out_yet_are_refused_at_creation() {
    use nodus_core::engine::Error;

    let world = World::new(vec![]);
    let engine = world.engine();
    engine
        .apply_agent(PROJECT, agent("plain", |_| {}))
        .await
        .expect("agent");
    // An evaluation group of an Environment that does not exist is refused, naming the field.
    let evaluation: nodus_core::resource::EvaluationSpec =
        serde_json::from_value(serde_json::json!({"environment": "nodus/swe-tasks@3", "tasks": 2}))
            .expect("an evaluation");
    let group = AgentGroupSpec {
        agent: "plain".to_string(),
        limits: GroupLimits::default(),
        max_cost_usd: None,
        sealed: false,
        evaluation: Some(evaluation),
    };
    match engine
        .apply_group(PROJECT, AgentGroup::new("eval", group))
        .await
    {
        Err(Error::Invalid(invalid)) => {
            assert_eq!(invalid.field, "spec.evaluation.environment");
            assert!(invalid.rule.contains("existing Environment"), "{invalid:?}");
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    assert!(
        engine.get::<AgentGroupSpec>(PROJECT, "eval").await.is_err(),
        "nothing is written"
    );
    // A context without a schema is carried out (it goes into the system prompt).
    engine
        .create_run(
            PROJECT,
            run("with-context", "plain", "q", |s| {
                s.context = Some(serde_json::Map::new())
            }),
        )
        .await
        .expect("a context without a schema");
}

/// A run naming `spec.image` is refused when it is created by an engine whose sandbox cannot
/// run images (bubblewrap, the unisolated backend), naming the field and why; nothing is
/// written. Without an image the same run is created.
#[tokio::test]
async fn an_image_is_refused_at_creation_by_a_backend_that_runs_none() {
    use nodus_core::engine::Error;
    use nodus_sandbox::{BwrapConfig, BwrapSandbox, UnisolatedSandbox};
    use std::sync::Arc;

    let root = tempfile::tempdir().expect("tempdir");
    let backends: [(&str, Arc<dyn nodus_core::Sandbox>); 2] = [
        (
            "bwrap",
            Arc::new(BwrapSandbox::new(BwrapConfig::new(
                root.path().join("bwrap"),
            ))),
        ),
        (
            "unisolated",
            Arc::new(UnisolatedSandbox::new(root.path().join("unisolated"))),
        ),
    ];
    for (backend, sandbox) in backends {
        let world = World::new(vec![]);
        let engine = world.engine_with_sandbox(sandbox);
        engine
            .apply_agent(PROJECT, agent("helper", |_| {}))
            .await
            .expect("agent");
        let refused = engine
            .create_run(
                PROJECT,
                run("imaged", "helper", "q", |s| {
                    s.image = Some("python:3.12-slim".to_string())
                }),
            )
            .await;
        match refused {
            Err(Error::Invalid(invalid)) => {
                assert_eq!(invalid.field, "spec.image", "{backend}: {invalid}");
                assert!(
                    invalid.rule.contains("cannot be honoured"),
                    "{backend}: {invalid}"
                );
                assert_eq!(invalid.value, "\"python:3.12-slim\"", "{backend}");
            }
            other => panic!("{backend}: expected a refusal, got {other:?}"),
        }
        assert!(
            engine.get_run(PROJECT, "imaged").await.is_err(),
            "{backend}: nothing is written"
        );
        engine
            .create_run(PROJECT, run("plain", "helper", "q", |_| {}))
            .await
            .unwrap_or_else(|e| panic!("{backend}: a run without an image: {e}"));
    }
}

/// A run's `context` is checked against its agent's `contextSchema` when the run is created:
/// a context failing at a nested path is refused naming that path, the schema keyword and the
/// value, and so is a missing context the schema requires; nothing is written. A matching
/// context, and a context for an agent without a schema, are created.
#[tokio::test]
async fn a_context_is_checked_against_the_agents_schema_at_creation() {
    use nodus_core::engine::Error;
    use serde_json::json;

    let world = World::new(vec![]);
    let engine = world.engine();
    let schema = json!({
        "type": "object",
        "properties": {
            "ticket": {
                "type": "object",
                "properties": { "id": { "type": "integer" } },
                "required": ["id"],
            },
        },
        "required": ["ticket"],
    });
    engine
        .apply_agent(
            PROJECT,
            agent("typed", |a| a.context_schema = Some(schema.clone())),
        )
        .await
        .expect("an agent with a context schema");
    engine
        .apply_agent(PROJECT, agent("plain", |_| {}))
        .await
        .expect("an agent without one");
    let context = |value: serde_json::Value| value.as_object().cloned();
    let cases = [
        (
            context(json!({"ticket": {"id": "seven"}})),
            "spec.context.ticket.id",
            "\"type\" at contextSchema#/properties/ticket/properties/id/type",
            "\"seven\"",
        ),
        (None, "spec.context", "is required", "nothing"),
    ];
    for (index, (given, field, rule, value)) in cases.into_iter().enumerate() {
        let name = format!("refused-{index}");
        let refused = engine
            .create_run(
                PROJECT,
                run(&name, "typed", "q", |s| s.context = given.clone()),
            )
            .await;
        match refused {
            Err(Error::Invalid(invalid)) => {
                assert_eq!(invalid.field, field, "{invalid}");
                assert!(invalid.rule.contains(rule), "{invalid}");
                assert_eq!(invalid.value, value, "{invalid}");
            }
            other => panic!("{field}: expected a refusal, got {other:?}"),
        }
        assert!(
            engine.get_run(PROJECT, &name).await.is_err(),
            "{field}: nothing is written"
        );
    }
    engine
        .create_run(
            PROJECT,
            run("matching", "typed", "q", |s| {
                s.context = context(json!({"ticket": {"id": 7}}))
            }),
        )
        .await
        .expect("a matching context");
    engine
        .create_run(
            PROJECT,
            run("untyped", "plain", "q", |s| {
                s.context = context(json!({"ticket": "anything"}))
            }),
        )
        .await
        .expect("a context for an agent without a schema");
}

/// A command that could not be started (the server out of descriptors) certainly did not
/// run: it is tried again and runs once, and the run never parks. When it still cannot
/// start, the step fails, the model is told, and the run goes on.
#[tokio::test]
async fn a_command_that_could_not_start_is_retried_not_parked() {
    use nodus_core::sandbox::Error as SandboxError;
    let emfile = || SandboxError::NotStarted("Too many open files (os error 24)".into());
    for (failures, ran) in [(2, 1), (3, 0)] {
        let world = World::new(vec![commands(&["echo one"]), text("done")]);
        let engine = world.engine();
        helper_run(&engine, "p", "hi", |_| {}).await;
        for _ in 0..failures {
            world.sandbox.fail_next_exec(emfile());
        }
        let driven = engine.drive(PROJECT, "p").await.expect("drive");
        assert_eq!(driven, Driven::Finished(RunPhase::Succeeded), "{failures}");
        assert_eq!(world.sandbox.count("echo one"), ran, "{failures}");
        let got = engine.get_run(PROJECT, "p").await.expect("run");
        assert_eq!(got.status.phase, Some(RunPhase::Succeeded));
    }
}

#[tokio::test]
async fn a_group_member_the_controller_cannot_read_is_an_error_not_a_zero_cap() {
    let (world, engine) = with_worker().await;
    engine
        .apply_agent(
            PROJECT,
            agent("worker", |a| {
                a.per_run_max_cost_usd = Usd::from_cents(10);
            }),
        )
        .await
        .expect("agent");
    // Room for one run's cap: a starts, b waits for room under the cap.
    let mut spec = worker_group(2, false);
    spec.max_cost_usd = Some(Usd::from_cents(15));
    engine
        .apply_group(PROJECT, AgentGroup::new("g", spec))
        .await
        .expect("group");
    for key in ["a", "b"] {
        let mut r = run("", "worker", "q", |s| {
            s.group = Some("g".to_string());
            s.task_key = Some(key.to_string());
        });
        r.metadata.name = None;
        engine.create_run(PROJECT, r).await.expect("task");
    }
    // What the runner does when runs of the group are created.
    engine
        .reconcile_group(PROJECT, "g")
        .await
        .expect("reconcile");
    let phase = |name| support::run_phase(&engine, name);
    assert_eq!(phase("g-a").await, Some(RunPhase::Running));
    assert_eq!(
        phase("g-b").await,
        Some(RunPhase::Pending(PendingReason::GroupWait))
    );

    // a's stored cap becomes unreadable (a number, where the document has a decimal string).
    let key = support::run_key("g-a");
    let record = world.memory.get(&key).await.expect("a");
    let mut document = record.document.clone();
    document["status"]["snapshot"]["agent"]["perRunMaxCostUSD"] = serde_json::json!(0.1);
    world
        .memory
        .update(&key, record.version, document)
        .await
        .expect("corrupt a");

    let error = engine
        .reconcile_group(PROJECT, "g")
        .await
        .expect_err("an unreadable member stops the reconcile");
    assert_eq!(error.reason(), "InternalError");
    let message = error.to_string();
    assert!(
        message.contains("g-a") && message.contains("perRunMaxCostUSD"),
        "{message}"
    );
    assert_eq!(
        phase("g-b").await,
        Some(RunPhase::Pending(PendingReason::GroupWait)),
        "b did not start on a cap read as zero"
    );
}

/// A run parked by a crash (its command's outcome unknown) gives up its slot: the group's
/// queued run starts instead of waiting for good, and the group counts the parked run.
#[tokio::test]
async fn a_run_parked_by_a_crash_frees_its_groups_slot() {
    use std::sync::Arc;
    use support::{CrashMode, CrashingStore};
    let world = World::new(vec![commands(&["echo one"]), text("done")]);
    let engine = world.engine();
    engine
        .apply_agent(PROJECT, agent("worker", |_| {}))
        .await
        .expect("agent");
    engine
        .apply_group(PROJECT, AgentGroup::new("g", worker_group(1, false)))
        .await
        .expect("group");
    for key in ["a", "b"] {
        let mut r = run("", "worker", "Run `echo one`", |s| {
            s.group = Some("g".to_string());
            s.task_key = Some(key.to_string());
        });
        r.metadata.name = None;
        engine.create_run(PROJECT, r).await.expect("task");
    }
    // What the runner does when runs of the group are created.
    engine
        .reconcile_group(PROJECT, "g")
        .await
        .expect("reconcile");
    // Killed after a's command ran and before its outcome was written (write 8: sandbox,
    // routing, model call, then the command's result); the restart parks it.
    let crashing = Arc::new(CrashingStore::new(
        world.memory.clone(),
        8,
        CrashMode::BeforeWrite,
    ));
    assert!(
        world
            .engine_over(crashing)
            .drive(PROJECT, "g-a")
            .await
            .is_err()
    );
    let driven = engine.drive(PROJECT, "g-a").await.expect("restart");
    assert!(matches!(driven, Driven::Parked { .. }), "{driven:?}");

    let group = engine
        .reconcile_group(PROJECT, "g")
        .await
        .expect("reconcile");
    assert_eq!(group.status.counts.parked, 1);
    assert_eq!(group.status.counts.active, 1, "b took the free slot");
    assert!(group.status.blocked_reasons.is_empty());
    assert_eq!(
        engine.drive(PROJECT, "g-b").await.expect("b"),
        Driven::Finished(RunPhase::Succeeded)
    );
    let group = engine
        .reconcile_group(PROJECT, "g")
        .await
        .expect("reconcile");
    assert_eq!(
        group.status.phase,
        Some(GroupPhase::Running),
        "a is still parked"
    );
    assert_eq!(group.status.counts.parked, 1);
    assert_eq!(group.status.counts.succeeded, 1);
}

/// A step is journaled with its predecessor's outcome, in the same store call: a run's
/// first step is appended alone, every later one rides on the outcome before it, and the
/// last outcome goes with the run's end (no status is written apart), whether its model
/// calls cost nothing or reserve credits first.
/// Of two charged steps in a row (a router that reserves, then the model call it routed) the
/// second is appended alone, after the first is settled. Either way the journal has the same steps,
/// and a metered run ends with no reservation held and its cost spent.
#[tokio::test]
async fn a_step_is_journaled_with_its_predecessor_s_outcome() {
    let script = || vec![commands(&["echo one"]), text("done")];
    let mut journals = Vec::new();
    for (free, costly_router) in [(true, false), (false, false), (false, true)] {
        let store = std::sync::Arc::new(support::CountingStore::default());
        let world = World::over_store(script(), store.clone());
        let ledger = nodus_core::ledger::StoreLedger::new(store.clone());
        ledger
            .add(PROJECT, Usd::from_cents(500))
            .await
            .expect("credits");
        let engine = if free {
            world.free_engine_over(store.clone())
        } else if costly_router {
            world.metered_engine_routed(store.clone(), std::sync::Arc::new(CostlyRouter))
        } else {
            world.metered_engine_over(store.clone())
        };
        helper_run(&engine, "merged", "Run `echo one`.", |_| {}).await;
        let driven = engine.drive(PROJECT, "merged").await.expect("drive");
        assert_eq!(driven, Driven::Finished(RunPhase::Succeeded));
        let journal = engine.journal(PROJECT, "merged").await.expect("journal");
        let last = u32::try_from(journal.len() - 1).expect("a short journal");
        // A call that follows a charged routing is appended alone.
        let alone: Vec<u32> = journal
            .windows(2)
            .filter(|pair| {
                costly_router
                    && matches!(pair[0].intent, Intent::Route { .. })
                    && matches!(pair[1].intent, Intent::CallModel { .. })
            })
            .map(|pair| pair[1].seq)
            .collect();
        assert_eq!(
            alone.is_empty(),
            !costly_router,
            "a charged routing is followed by a call: {journal:?}"
        );
        let mut expected = vec!["append 0".to_string()];
        for seq in 0..last {
            if alone.contains(&(seq + 1)) {
                expected.push(format!("complete {seq}"));
                expected.push(format!("append {}", seq + 1));
            } else {
                expected.push(format!("complete {seq} then append {}", seq + 1));
            }
        }
        expected.push(format!("complete {last}"));
        // The run's status only ever rides on outcomes: its end too.
        let writes: Vec<String> = store
            .journal_writes()
            .into_iter()
            .filter(|write| !write.starts_with("update") || write.contains("/agentruns/"))
            .collect();
        assert_eq!(writes, expected, "{journal:?}");
        // Nor is the run read again: what the drive wrote is what it knows, to its end.
        assert_eq!(
            store.gets_of(&support::run_key("merged")),
            3,
            "the run is read before its first step (its creation, the drive's claim), never after"
        );
        let account = ledger.account(PROJECT).await.expect("the account");
        assert!(account.reserved.is_empty(), "{account:?}");
        let cost: Usd = journal
            .iter()
            .filter_map(|step| match &step.completion.as_ref()?.outcome {
                nodus_core::journal::Outcome::ModelReplied { cost_usd, .. } => Some(*cost_usd),
                _ => None,
            })
            .sum();
        assert_eq!(account.spent_usd, cost, "the run's cost is spent");
        assert_eq!(
            free,
            cost.is_zero(),
            "free calls cost nothing, priced ones do"
        );
        let kinds: Vec<StepKind> = journal.iter().map(|step| step.intent.kind()).collect();
        journals.push(kinds);
    }
    assert!(
        journals.iter().all(|kinds| *kinds == journals[0]),
        "the same steps each way: {journals:?}"
    );
}

/// A run whose drive began with no step journaled has no snapshot yet: its first command's
/// snapshot does not look for an earlier one in the store, and the next command's compares
/// with the one this drive took.
#[tokio::test]
async fn a_new_runs_snapshots_read_none_back_from_the_store() {
    let store = std::sync::Arc::new(support::CountingStore::default());
    let script = vec![
        commands(&["echo one > a"]),
        commands(&["echo two > b"]),
        text("done"),
    ];
    let world = World::over_store(script, store.clone());
    let engine = world.engine_over(store.clone());
    helper_run(&engine, "fresh", "Write two files.", |_| {}).await;
    let run = engine.get_run(PROJECT, "fresh").await.expect("run");
    let uid = run.metadata.uid.clone().expect("a uid");
    let driven = engine.drive(PROJECT, "fresh").await.expect("drive");
    assert_eq!(driven, Driven::Finished(RunPhase::Succeeded));
    assert_eq!(store.snapshot_reads(), 0, "no snapshot read back");
    // Both command steps have their snapshot.
    let taken = store.inner.snapshots(&uid).await.expect("snapshots");
    assert_eq!(taken.len(), 2, "{taken:?}");
}

/// Hooks of a sandbox whose every command leaves one more 600-byte file (`f1`, `f2`, ...),
/// that never tells what changed (each snapshot lists it whole), and that counts the archives
/// the snapshots ask of it: how many it had served when each command began.
#[derive(Default)]
struct Growing {
    archives: std::sync::atomic::AtomicUsize,
    at_each_command: std::sync::Mutex<Vec<usize>>,
}

#[async_trait::async_trait]
impl support::hooked::Hooks for Growing {
    async fn exec(
        &self,
        inner: &nodus_core::testing::RecordingSandbox,
        id: &nodus_core::sandbox::SandboxId,
        request: &nodus_core::sandbox::ExecRequest,
    ) -> Result<nodus_core::sandbox::ExecOutput, nodus_core::sandbox::Error> {
        let served = self.archives.load(std::sync::atomic::Ordering::SeqCst);
        self.at_each_command.lock().expect("counts").push(served);
        nodus_core::sandbox::Sandbox::exec(inner, id, request).await
    }

    async fn get_files(
        &self,
        inner: &nodus_core::testing::RecordingSandbox,
        _: &nodus_core::sandbox::SandboxId,
        path: &str,
        _: usize,
    ) -> Result<Vec<u8>, nodus_core::sandbox::Error> {
        self.archives
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let mut archive = tar::Builder::new(Vec::new());
        for n in 1..=inner.executions().len() {
            let name = format!("f{n}");
            if !path.is_empty() && path != name {
                continue;
            }
            let mut header = tar::Header::new_gnu();
            header.set_entry_type(tar::EntryType::Regular);
            header.set_mode(0o644);
            header.set_size(600);
            header.set_mtime(1);
            archive
                .append_data(&mut header, &name, &[b'x'; 600][..])
                .expect("an entry");
        }
        Ok(archive.into_inner().expect("an archive"))
    }
}

/// Once a run's snapshots are past its budget, every later step is past it too: recorded as
/// such with the same figures, without listing or reading the working directory again.
#[tokio::test]
async fn snapshots_past_the_budget_list_nothing_more() {
    let script = vec![
        commands(&["echo one"]),
        commands(&["echo two"]),
        commands(&["echo three"]),
        commands(&["echo four"]),
        text("done"),
    ];
    let world = World::new(script);
    let sandbox = std::sync::Arc::new(support::hooked::Hooked {
        inner: world.sandbox.clone(),
        hooks: Growing::default(),
    });
    let mut config = support::engine_config();
    config.snapshots = Some(nodus_core::snapshot::Budget { limit_bytes: 1000 });
    let engine = world.engine_configured(sandbox.clone(), config);
    helper_run(&engine, "growing", "Write files.", |_| {}).await;
    let driven = engine.drive(PROJECT, "growing").await.expect("drive");
    assert_eq!(driven, Driven::Finished(RunPhase::Succeeded));
    let served = sandbox
        .hooks
        .at_each_command
        .lock()
        .expect("counts")
        .clone();
    let between: Vec<usize> = served.windows(2).map(|w| w[1] - w[0]).collect();
    // After the first command: the listing and `f1` read (600 bytes, within 1,000); after
    // the second: the listing, whose new `f2` would make 1,200 (over, so not read); after
    // the third: nothing.
    assert_eq!(between, [2, 1, 0], "archives served between commands");
    let run = engine.get_run(PROJECT, "growing").await.expect("run");
    let uid = run.metadata.uid.clone().expect("a uid");
    let taken: Vec<nodus_core::snapshot::Snapshot> = world
        .store
        .snapshots(&uid)
        .await
        .expect("snapshots")
        .into_iter()
        .map(|(_, snapshot)| snapshot)
        .collect();
    assert_eq!(taken.len(), 4, "{taken:?}");
    assert!(taken[0].manifest().is_some(), "{:?}", taken[0]);
    let over = nodus_core::snapshot::Snapshot::OverBudget {
        used_bytes: 600,
        wanted_bytes: 600,
        limit_bytes: 1000,
    };
    assert_eq!(&taken[1..], [over.clone(), over.clone(), over], "{taken:?}");
}

/// A model call decided with the outcome before it reserves its credits first; when the
/// status written with that outcome is refused (the run was cancelled meanwhile) the call is
/// not journaled and its reservation is given back: the run ends cancelled with nothing
/// reserved and no call made.
#[tokio::test]
async fn a_call_decided_with_an_outcome_gives_its_reservation_back_when_the_status_is_refused() {
    let store = std::sync::Arc::new(support::CountingStore::default());
    let world = World::over_store(vec![commands(&["echo one"]), text("done")], store.clone());
    let ledger = nodus_core::ledger::StoreLedger::new(store.clone());
    ledger
        .add(PROJECT, Usd::from_cents(500))
        .await
        .expect("credits");
    let engine = world.metered_engine_over(store.clone());
    helper_run(&engine, "cancelled", "Run `echo one`.", |_| {}).await;
    // Cancelled while it routed, just before the routing's outcome (and the first call) is
    // written.
    let cancel = serde_json::to_value(CancelReason::CancelRequested).expect("a reason");
    store.edit_before_next_call(
        support::run_key("cancelled"),
        Box::new(move |document| {
            let mut document = document.clone();
            document["status"]["cancelRequested"] = cancel.clone();
            Some(document)
        }),
    );
    let driven = engine.drive(PROJECT, "cancelled").await.expect("drive");
    assert_eq!(
        driven,
        Driven::Finished(RunPhase::Cancelled(CancelReason::CancelRequested))
    );
    assert_eq!(world.model.calls(), 0, "no call after the cancellation");
    let journal = engine.journal(PROJECT, "cancelled").await.expect("journal");
    let calls = journal
        .iter()
        .filter(|step| matches!(step.intent, Intent::CallModel { .. }))
        .count();
    assert_eq!(calls, 0, "the call was not journaled: {journal:?}");
    let account = ledger.account(PROJECT).await.expect("the account");
    assert!(
        account.reserved.is_empty(),
        "the call's reservation was given back: {account:?}"
    );
}

/// A router that reserves a cent before it routes (as a router that calls a model does),
/// and routes as the fixed one.
struct CostlyRouter;

#[async_trait::async_trait]
impl nodus_core::router::Router for CostlyRouter {
    fn max_cost(&self) -> Usd {
        Usd::from_cents(1)
    }

    async fn route(
        &self,
        request: &nodus_core::router::RouteRequest<'_>,
    ) -> Result<nodus_core::router::RouteChoice, nodus_core::router::Error> {
        nodus_core::router::FixedRouter(nodus_core::catalog::Family::Haiku)
            .route(request)
            .await
    }
}

/// The agent `helper`, an exact-graded Environment `sums` of `tasks` (id, prompt, answer) and
/// the evaluation group `graded` of all of them, one at a time: its cases' results.
async fn graded_evaluation(
    engine: &nodus_core::engine::Engine,
    tasks: &[(&str, &str, &str)],
) -> Vec<nodus_core::evaluation::CaseResult> {
    engine
        .apply_agent(PROJECT, agent("helper", |_| {}))
        .await
        .expect("agent");
    support::apply_exact_environment(engine, "sums", None, tasks).await;
    let group = support::evaluation_group(
        serde_json::json!({"environment": "sums@1.0.0", "tasks": tasks.len(), "seed": 7}),
        Some(1),
    );
    engine
        .apply_group(PROJECT, AgentGroup::new("graded", group))
        .await
        .expect("the group");
    engine
        .evaluation_results(PROJECT, "graded")
        .await
        .expect("results")
}

/// Grading reads the run of a pending case, and the case whole, only when the group's
/// listings say it may have ended: of three cases run one at a time, the finished one's run
/// and case are read and graded, and the two waiting for the slot stay pending with their
/// runs and cases unread (no case is listed whole).
#[tokio::test]
async fn grading_reads_only_the_runs_that_may_have_ended() {
    use nodus_core::evaluation::CaseState;
    use nodus_core::resource::Kind;
    use nodus_core::store::ObjectKey;

    let store = std::sync::Arc::new(support::CountingStore::default());
    let world = World::over_store(vec![text("4"), text("4"), text("4")], store.clone());
    let engine = world.engine();
    let results = graded_evaluation(
        &engine,
        &[
            ("a", "2 + 2?", "4"),
            ("b", "3 + 1?", "4"),
            ("c", "1 + 3?", "4"),
        ],
    )
    .await;
    assert_eq!(results.len(), 3);
    let mut ran = Vec::new();
    let mut waiting = Vec::new();
    for result in &results {
        match engine.drive(PROJECT, &result.run).await.expect("drive") {
            Driven::Finished(RunPhase::Succeeded) => ran.push(result.run.clone()),
            Driven::NotAdmitted { .. } => waiting.push(result.run.clone()),
            other => panic!("{}: {other:?}", result.run),
        }
    }
    assert_eq!((ran.len(), waiting.len()), (1, 2), "{ran:?} {waiting:?}");
    let key = |name: &str| ObjectKey::new(PROJECT, Kind::AgentRun, name);
    let reads = |names: &[String]| -> Vec<usize> {
        names.iter().map(|name| store.gets_of(&key(name))).collect()
    };
    let (ran_before, waiting_before) = (reads(&ran), reads(&waiting));
    let case_key = |name: &String| ObjectKey::new(PROJECT, Kind::EvaluationCase, name);
    let case_reads = |names: &[String]| -> Vec<usize> {
        names
            .iter()
            .map(|name| store.gets_of(&case_key(name)))
            .collect()
    };
    let (ran_cases, waiting_cases) = (case_reads(&ran), case_reads(&waiting));
    let whole_listings = store.whole_listings_of(Kind::EvaluationCase);

    engine
        .grade_evaluation(PROJECT, "graded")
        .await
        .expect("grade");

    assert!(
        reads(&ran)[0] > ran_before[0],
        "the finished run is read to grade its case"
    );
    assert_eq!(
        reads(&waiting),
        waiting_before,
        "the runs waiting for the slot are not read"
    );
    assert_eq!(
        case_reads(&ran)[0],
        ran_cases[0] + 1,
        "the finished run's case is read whole once, to grade it"
    );
    assert_eq!(
        case_reads(&waiting),
        waiting_cases,
        "the cases waiting for their runs are not read whole"
    );
    assert_eq!(
        store.whole_listings_of(Kind::EvaluationCase),
        whole_listings,
        "no case is listed whole"
    );
    let results = engine
        .evaluation_results(PROJECT, "graded")
        .await
        .expect("results");
    for result in &results {
        let expected = if ran.contains(&result.run) {
            CaseState::Scored
        } else {
            CaseState::Pending
        };
        assert_eq!(result.state, expected, "{result:?}");
    }
}

/// What the group controller keeps of a group's listings is dropped once the group is done:
/// an evaluation of one case run, graded (its group finishing with the grade), and graded
/// again as the runner does after each reconcile, keeps no listing of members or cases.
#[tokio::test]
async fn an_evaluation_done_keeps_no_listing() {
    let world = World::new(vec![text("4")]);
    let engine = world.engine();
    let results = graded_evaluation(&engine, &[("a", "2 + 2?", "4")]).await;
    engine
        .reconcile_group(PROJECT, "graded")
        .await
        .expect("reconcile");
    assert!(matches!(
        engine.drive(PROJECT, &results[0].run).await.expect("drive"),
        Driven::Finished(RunPhase::Succeeded)
    ));
    engine
        .reconcile_group(PROJECT, "graded")
        .await
        .expect("reconcile");
    assert!(
        engine.listings_kept() > 0,
        "a running group's listings are kept"
    );
    // The grade finishes the group (its reconcile forgets the listings); the pass after it
    // lists the cases again, finds none pending, and keeps nothing either.
    engine
        .grade_evaluation(PROJECT, "graded")
        .await
        .expect("grade");
    let group = engine
        .get::<nodus_core::resource::AgentGroupSpec>(PROJECT, "graded")
        .await
        .expect("group");
    assert!(
        group.status.phase.is_some_and(|p| p.is_finished()),
        "{:?}",
        group.status.phase
    );
    assert_eq!(engine.listings_kept(), 0, "after the grade");
    engine
        .grade_evaluation(PROJECT, "graded")
        .await
        .expect("grade again");
    assert_eq!(
        engine.listings_kept(),
        0,
        "after a pass with nothing to grade"
    );
}

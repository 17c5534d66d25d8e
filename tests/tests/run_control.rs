//! Ending and steering runs over the engine: a message key reused for another payload is
//! refused, a keepAlive conversation is closed after its current turn, and a group run that
//! can never start says why.

mod support;

use nodus_core::Usd;
use nodus_core::engine::Driven;
use nodus_core::lifecycle::{PendingReason, RunPhase, WaitReason};
use nodus_core::resource::{AgentGroup, AgentGroupSpec, GroupLimits};
use nodus_core::store::Delivery;
use nodus_llm::Reply;
use support::{PROJECT, World, agent, run};

fn text(s: &str) -> Reply {
    Reply::Text(s.to_string())
}

#[tokio::test]
async fn a_message_key_reused_for_another_payload_is_refused() {
    let world = World::new(vec![text("first"), text("second")]);
    let engine = world.engine();
    engine
        .apply_agent(PROJECT, agent("helper", |_| {}))
        .await
        .expect("agent");
    engine
        .create_run(
            PROJECT,
            run("chat", "helper", "Summarize the logs", |s| {
                s.keep_alive = true
            }),
        )
        .await
        .expect("run");
    let driven = engine.drive(PROJECT, "chat").await.expect("drive");
    assert!(
        matches!(
            driven,
            Driven::Waiting {
                reason: WaitReason::AwaitingMessage,
                ..
            }
        ),
        "{driven:?}"
    );
    let first = engine
        .send_message(PROJECT, "chat", "Now the staging logs", Some("staging-1"))
        .await
        .expect("send");
    assert_eq!(first, Delivery::Delivered(1));
    let refused = engine
        .send_message(
            PROJECT,
            "chat",
            "Now the production logs",
            Some("staging-1"),
        )
        .await
        .expect_err("another payload under the same key");
    assert_eq!(refused.reason(), "Invalid");
    let message = refused.to_string();
    assert!(
        message.contains("messageKey") && message.contains("staging-1"),
        "the refusal names the field and the key: {message}"
    );
    // The same message again is still a repeat, delivered once.
    let again = engine
        .send_message(PROJECT, "chat", "Now the staging logs", Some("staging-1"))
        .await
        .expect("repeat");
    assert_eq!(again, Delivery::Duplicate(1));
    let journal_uid = engine
        .get_run(PROJECT, "chat")
        .await
        .expect("run")
        .metadata
        .uid
        .expect("uid");
    let inbox = engine.store().inbox(&journal_uid).await.expect("inbox");
    assert_eq!(inbox.len(), 1, "nothing written: {inbox:?}");

    // A finished run refuses another payload under a delivered key the same way.
    engine.cancel_run(PROJECT, "chat").await.expect("cancel");
    let refused = engine
        .send_message(
            PROJECT,
            "chat",
            "Now the production logs",
            Some("staging-1"),
        )
        .await
        .expect_err("finished, another payload");
    assert_eq!(refused.reason(), "Invalid", "{refused}");
    let repeat = engine
        .send_message(PROJECT, "chat", "Now the staging logs", Some("staging-1"))
        .await
        .expect("repeat after the end");
    assert_eq!(repeat, Delivery::Duplicate(1));
    assert!(matches!(
        engine
            .get_run(PROJECT, "chat")
            .await
            .expect("run")
            .status
            .phase,
        Some(RunPhase::Cancelled(_))
    ));
}

#[tokio::test]
async fn a_group_run_whose_cap_can_never_fit_says_what_to_change() {
    let world = World::new(vec![text("done")]);
    let engine = world.engine();
    engine
        .apply_agent(
            PROJECT,
            agent("worker", |s| s.per_run_max_cost_usd = Usd::from_cents(10)),
        )
        .await
        .expect("agent");
    let mut group = AgentGroupSpec {
        agent: "worker".to_string(),
        limits: GroupLimits::default(),
        max_cost_usd: Some(Usd::from_cents(5)),
        sealed: false,
        evaluation: None,
    };
    engine
        .apply_group(PROJECT, AgentGroup::new("g", group.clone()))
        .await
        .expect("group");
    engine
        .create_run(
            PROJECT,
            run("g-a", "worker", "go", |s| {
                s.group = Some("g".to_string());
                s.task_key = Some("a".to_string());
            }),
        )
        .await
        .expect("run");
    let waiting = engine.get_run(PROJECT, "g-a").await.expect("run");
    assert_eq!(
        waiting.status.phase,
        Some(RunPhase::Pending(PendingReason::GroupWait))
    );
    let message = waiting.status.message.unwrap_or_default();
    assert!(
        message.contains("raise the group's spec.maxCostUSD ($0.05)")
            && message.contains("lower the agent's perRunMaxCostUSD ($0.10"),
        "the run says what to change: {message:?}"
    );
    // A reconcile that changes nothing writes nothing.
    let version = waiting.metadata.resource_version.clone();
    engine.reconcile_group(PROJECT, "g").await.expect("again");
    assert_eq!(
        engine
            .get_run(PROJECT, "g-a")
            .await
            .expect("run")
            .metadata
            .resource_version,
        version
    );

    // Raised, the run starts and the message goes.
    group.max_cost_usd = Some(Usd::from_cents(10));
    engine
        .apply_group(PROJECT, AgentGroup::new("g", group))
        .await
        .expect("raise");
    let started = engine.get_run(PROJECT, "g-a").await.expect("run");
    assert_eq!(started.status.phase, Some(RunPhase::Running));
    assert_eq!(started.status.message, None);
    assert_eq!(
        engine.drive(PROJECT, "g-a").await.expect("drive"),
        Driven::Finished(RunPhase::Succeeded)
    );
    let done = engine.get_run(PROJECT, "g-a").await.expect("run");
    assert_eq!(done.status.message, None);
}

//! Ending and steering runs over the engine: a message key reused for another payload is
//! refused, and a keepAlive conversation is closed after its current turn.

mod support;

use nodus_core::engine::Driven;
use nodus_core::lifecycle::{RunPhase, WaitReason};
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

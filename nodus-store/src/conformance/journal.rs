//! Conformance of the journal and inbox: in-order steps, fencing, messages, change
//! notifications, and deleting a run with its journal and inbox.

use jiff::Timestamp;
use nodus_core::Store;
use nodus_core::journal::{Intent, Outcome};
use nodus_core::resource::Kind;
use nodus_core::store::{Change, Delivery, Error, Fence, ObjectKey};
use serde_json::json;

use super::{OWNER_A, completion, lease, message, next_change, run_document, step, unique};

/// Steps are appended at the journal's length and completed once; the journal reads back in
/// order; out-of-order appends and double completions are refused with `Error::Journal`.
pub async fn journal_in_order<S: Store + Clone + 'static>(store: S) {
    let uid = unique("run");
    assert_eq!(
        store.journal(&uid).await,
        Ok(vec![]),
        "an unknown run has no steps"
    );
    let fence = store.claim(&uid, &lease(OWNER_A, 0)).await.expect("claim");

    let steps = [
        step(
            0,
            Intent::ReadMessage {
                turn: 0,
                message_seq: 1,
            },
        ),
        step(1, Intent::Route { turn: 0 }),
        step(2, Intent::Answer { turn: 0 }),
        step(3, Intent::Route { turn: 1 }),
    ];
    let outcomes = [Outcome::MessageRead, Outcome::Superseded, Outcome::Answered];
    let mut expected = Vec::new();
    for (step, outcome) in steps.iter().zip(&outcomes) {
        store
            .append_step(&uid, fence, step)
            .await
            .expect("append in order");
        let mut appended = step.clone();
        expected.push(appended.clone());
        assert_eq!(store.journal(&uid).await, Ok(expected.clone()));

        let completion = completion(step.seq, outcome.clone());
        store
            .complete_step(&uid, fence, step.seq, &completion)
            .await
            .expect("complete");
        appended.completion = Some(completion);
        expected.pop();
        expected.push(appended);
        assert_eq!(store.journal(&uid).await, Ok(expected.clone()));
    }
    store
        .append_step(&uid, fence, &steps[3])
        .await
        .expect("append a step left open");
    expected.push(steps[3].clone());

    // Out of order: a gap, a repeat, the past.
    for seq in [5, 4 + 1_000, 3, 0] {
        let result = store
            .append_step(&uid, fence, &step(seq, Intent::Route { turn: 9 }))
            .await;
        assert!(
            matches!(&result, Err(Error::Journal { run, .. }) if run == &uid),
            "append of step {seq} to a journal of 4: {result:?}"
        );
    }
    // Completing a step twice, or one that does not exist.
    for seq in [0, 2, 4, 99] {
        let result = store
            .complete_step(&uid, fence, seq, &completion(seq, Outcome::Answered))
            .await;
        assert!(
            matches!(&result, Err(Error::Journal { run, .. }) if run == &uid),
            "completion of step {seq}: {result:?}"
        );
    }
    assert_eq!(
        store.journal(&uid).await,
        Ok(expected.clone()),
        "refused writes change nothing"
    );

    let last = completion(3, Outcome::Answered);
    store
        .complete_step(&uid, fence, 3, &last)
        .await
        .expect("complete the open step");
    let result = store.complete_step(&uid, fence, 3, &last).await;
    assert!(
        matches!(result, Err(Error::Journal { .. })),
        "second completion: {result:?}"
    );
    if let Some(open) = expected.last_mut() {
        open.completion = Some(last);
    }
    let journal = store.journal(&uid).await.expect("read the journal");
    assert_eq!(journal, expected);
    assert_eq!(
        journal.iter().map(|s| s.seq).collect::<Vec<_>>(),
        [0, 1, 2, 3]
    );

    // Journals are per run.
    let other = unique("run");
    let other_fence = store
        .claim(&other, &lease(OWNER_A, 0))
        .await
        .expect("claim another run");
    store
        .append_step(&other, other_fence, &step(0, Intent::Route { turn: 0 }))
        .await
        .expect("the other run's journal starts at 0");
    assert_eq!(store.journal(&other).await.map(|j| j.len()), Ok(1));
    assert_eq!(store.journal(&uid).await, Ok(expected));
}

/// After a second claim, the first claim's appends and completions are refused with
/// `Fenced` and change nothing; claims are per run; a run nobody claimed cannot be written.
pub async fn fencing<S: Store + Clone + 'static>(store: S) {
    let uid = unique("run");
    let first = store
        .claim(&uid, &lease(OWNER_A, 0))
        .await
        .expect("first claim");
    store
        .append_step(&uid, first, &step(0, Intent::Route { turn: 0 }))
        .await
        .expect("the first writer appends");

    let second = store
        .claim(&uid, &lease(OWNER_A, 0))
        .await
        .expect("second claim");
    assert_ne!(first, second, "a claim makes a new fence");
    let fenced = Err(Error::Fenced { run: uid.clone() });
    assert_eq!(
        store
            .append_step(&uid, first, &step(1, Intent::Answer { turn: 0 }))
            .await,
        fenced
    );
    assert_eq!(
        store
            .complete_step(&uid, first, 0, &completion(0, Outcome::Answered))
            .await,
        fenced
    );
    assert_eq!(
        store.journal(&uid).await,
        Ok(vec![step(0, Intent::Route { turn: 0 })]),
        "the stale writer changed nothing"
    );

    store
        .complete_step(&uid, second, 0, &completion(0, Outcome::Answered))
        .await
        .expect("the new writer completes the open step");
    store
        .append_step(&uid, second, &step(1, Intent::Answer { turn: 0 }))
        .await
        .expect("the new writer appends");

    // Claims on another run leave this one's alone.
    let other = unique("run");
    let other_fence = store
        .claim(&other, &lease(OWNER_A, 0))
        .await
        .expect("claim another run");
    store
        .complete_step(&uid, second, 1, &completion(1, Outcome::Answered))
        .await
        .expect("still the latest claim on this run");

    // A third claim makes the second stale too.
    let third = store
        .claim(&uid, &lease(OWNER_A, 0))
        .await
        .expect("third claim");
    assert_ne!(third, second);
    assert_ne!(third, first);
    assert_eq!(
        store
            .append_step(&uid, second, &step(2, Intent::Route { turn: 1 }))
            .await,
        fenced
    );
    store
        .append_step(&uid, third, &step(2, Intent::Route { turn: 1 }))
        .await
        .expect("the third writer appends");
    assert_eq!(store.journal(&uid).await.map(|j| j.len()), Ok(3));

    // Nobody claimed this run: no fence writes it.
    let unclaimed = unique("run");
    for fence in [first, second, third, other_fence, Fence(0)] {
        assert_eq!(
            store
                .append_step(&unclaimed, fence, &step(0, Intent::Route { turn: 0 }))
                .await,
            Err(Error::Fenced {
                run: unclaimed.clone()
            }),
            "{fence:?} on a run nobody claimed"
        );
    }
    assert_eq!(store.journal(&unclaimed).await, Ok(vec![]));
}

/// Messages: a key delivers once (later repeats are `Duplicate`, whatever version they
/// name); a stale version is refused; each delivery bumps the run's version but not its
/// document, so a writer who decided on the older version is refused.
pub async fn messages<S: Store + Clone + 'static>(store: S) {
    let project = unique("inbox");
    let key = ObjectKey::new(&project, Kind::AgentRun, "chat");
    let uid = unique("run");
    let document = run_document("chat", &uid);
    store.create(&key, document.clone()).await.expect("create");
    assert_eq!(store.inbox(&uid).await, Ok(vec![]));
    let at = |second: i64| Timestamp::from_second(1_700_000_000 + second).expect("a timestamp");

    assert_eq!(
        store
            .post_message(&key, 1, Some("m-1"), "hello", at(1))
            .await,
        Ok(Delivery::Delivered(1))
    );
    let record = store.get(&key).await.expect("get after a message");
    assert_eq!(record.version, 2, "a message bumps the run's version");
    assert_eq!(record.document, document, "and leaves its document alone");

    // The same key again, at a stale version or the current one: delivered once.
    for version in [1, 2] {
        assert_eq!(
            store
                .post_message(&key, version, Some("m-1"), "hello again", at(2))
                .await,
            Ok(Delivery::Duplicate(1))
        );
    }
    // A stale version is refused, with a key or without.
    for message_key in [None, Some("m-2")] {
        assert_eq!(
            store
                .post_message(&key, 1, message_key, "stale", at(3))
                .await,
            Err(Error::Conflict {
                key: key.clone(),
                expected: 1,
                actual: 2
            })
        );
    }
    // A writer who decided on version 1 (to finish the run, say) is refused.
    let mut finished = document.clone();
    finished["status"]["phase"] = json!("Succeeded");
    assert_eq!(
        store.update(&key, 1, finished).await,
        Err(Error::Conflict {
            key: key.clone(),
            expected: 1,
            actual: 2
        })
    );
    assert_eq!(store.get(&key).await.map(|r| r.version), Ok(2));

    assert_eq!(
        store
            .post_message(&key, 2, Some("m-2"), "second", at(4))
            .await,
        Ok(Delivery::Delivered(2))
    );
    assert_eq!(
        store.post_message(&key, 3, None, "third", at(5)).await,
        Ok(Delivery::Delivered(3))
    );
    assert_eq!(
        store
            .post_message(&key, 1, Some("m-2"), "second again", at(6))
            .await,
        Ok(Delivery::Duplicate(2))
    );
    let record = store.get(&key).await.expect("get after three messages");
    assert_eq!(record.version, 4, "duplicates do not bump the version");
    assert_eq!(record.document, document);

    assert_eq!(
        store.inbox(&uid).await,
        Ok(vec![
            message(1, Some("m-1"), "hello", at(1)),
            message(2, Some("m-2"), "second", at(4)),
            message(3, None, "third", at(5)),
        ])
    );

    // An update keeps the inbox, and later messages use its new version.
    let mut running = document.clone();
    running["status"]["phase"] = json!("Waiting");
    store
        .update(&key, 4, running)
        .await
        .expect("update the run");
    assert_eq!(
        store
            .post_message(&key, 5, Some("m-1"), "hello", at(7))
            .await,
        Ok(Delivery::Duplicate(1))
    );
    assert_eq!(
        store.post_message(&key, 5, None, "fourth", at(8)).await,
        Ok(Delivery::Delivered(4))
    );
    assert_eq!(store.inbox(&uid).await.map(|m| m.len()), Ok(4));

    // Inboxes are per run, and keys are per inbox.
    let other_key = ObjectKey::new(&project, Kind::AgentRun, "other");
    let other_uid = unique("run");
    store
        .create(&other_key, run_document("other", &other_uid))
        .await
        .expect("create another run");
    assert_eq!(store.inbox(&other_uid).await, Ok(vec![]));
    assert_eq!(
        store
            .post_message(&other_key, 1, Some("m-1"), "elsewhere", at(9))
            .await,
        Ok(Delivery::Delivered(1))
    );
    assert_eq!(store.inbox(&uid).await.map(|m| m.len()), Ok(4));

    // No such run; a document without a uid.
    let missing = ObjectKey::new(&project, Kind::AgentRun, "missing");
    assert_eq!(
        store
            .post_message(&missing, 1, None, "nobody", at(10))
            .await,
        Err(Error::NotFound(missing))
    );
    let no_uid = ObjectKey::new(&project, Kind::AgentRun, "no-uid");
    let mut document = run_document("no-uid", "x");
    if let Some(metadata) = document["metadata"].as_object_mut() {
        metadata.remove("uid");
    }
    store.create(&no_uid, document).await.expect("create");
    let result = store.post_message(&no_uid, 1, None, "lost", at(11)).await;
    assert!(
        matches!(result, Err(Error::Journal { .. })),
        "a run document without metadata.uid: {result:?}"
    );
    assert_eq!(store.get(&no_uid).await.map(|r| r.version), Ok(1));
}

/// Subscribers see `Written(key, version)` for every create, batch item, update and
/// delivered message, and `Deleted(key)` for deletes, in order; refused writes send nothing.
pub async fn change_notification<S: Store + Clone + 'static>(store: S) {
    let project = unique("changes");
    let key = |name: &str| ObjectKey::new(&project, Kind::AgentRun, name);
    let uid = unique("run");

    // Writing with nobody listening is fine.
    store
        .create(&key("early"), run_document("early", &unique("uid")))
        .await
        .expect("create with no subscriber");

    let mut changes = store.subscribe();
    let document = run_document("watched", &uid);
    store
        .create(&key("watched"), document.clone())
        .await
        .expect("create");
    assert_eq!(
        next_change(&mut changes, &project).await,
        Change::Written(key("watched"), 1)
    );

    let mut second = store.subscribe();
    let mut running = document.clone();
    running["status"]["phase"] = json!("Running");
    store
        .update(&key("watched"), 1, running.clone())
        .await
        .expect("update");
    // Refused writes: no change.
    let _ = store.update(&key("watched"), 1, running.clone()).await;
    let _ = store.create(&key("watched"), document.clone()).await;
    store
        .post_message(
            &key("watched"),
            2,
            Some("k"),
            "hello",
            Timestamp::UNIX_EPOCH,
        )
        .await
        .expect("post");
    let _ = store
        .post_message(
            &key("watched"),
            3,
            Some("k"),
            "hello",
            Timestamp::UNIX_EPOCH,
        )
        .await;
    let _ = store
        .post_message(&key("watched"), 1, None, "stale", Timestamp::UNIX_EPOCH)
        .await;
    let batch = vec![
        (key("b-2"), run_document("b-2", &unique("uid"))),
        (key("b-1"), run_document("b-1", &unique("uid"))),
    ];
    store
        .create_batch(batch.clone(), None)
        .await
        .expect("batch");
    let _ = store.create_batch(batch, None).await;
    store.delete(&key("watched")).await.expect("delete");
    let _ = store.delete(&key("watched")).await;
    store.delete(&key("early")).await.expect("delete");

    let expected = [
        Change::Written(key("watched"), 2),
        Change::Written(key("watched"), 3),
        Change::Written(key("b-2"), 1),
        Change::Written(key("b-1"), 1),
        Change::Deleted(key("watched")),
        Change::Deleted(key("early")),
    ];
    for change in &expected {
        assert_eq!(&next_change(&mut changes, &project).await, change);
    }
    for change in &expected {
        assert_eq!(
            &next_change(&mut second, &project).await,
            change,
            "a second subscriber sees the same"
        );
    }
}

/// Deleting a run removes its journal and inbox (not other runs'); a run created again with
/// the same name and uid starts empty, and its message keys deliver again.
pub async fn delete_removes_journal_and_inbox<S: Store + Clone + 'static>(store: S) {
    let project = unique("delete");
    let key = ObjectKey::new(&project, Kind::AgentRun, "doomed");
    let uid = unique("run");
    let document = run_document("doomed", &uid);
    store.create(&key, document.clone()).await.expect("create");
    let fence = store.claim(&uid, &lease(OWNER_A, 0)).await.expect("claim");
    store
        .append_step(&uid, fence, &step(0, Intent::Route { turn: 0 }))
        .await
        .expect("append");
    store
        .complete_step(&uid, fence, 0, &completion(0, Outcome::Answered))
        .await
        .expect("complete");
    store
        .post_message(&key, 1, Some("k"), "hello", Timestamp::UNIX_EPOCH)
        .await
        .expect("post");

    let keep_key = ObjectKey::new(&project, Kind::AgentRun, "kept");
    let keep_uid = unique("run");
    store
        .create(&keep_key, run_document("kept", &keep_uid))
        .await
        .expect("create the run that stays");
    let keep_fence = store
        .claim(&keep_uid, &lease(OWNER_A, 0))
        .await
        .expect("claim");
    store
        .append_step(&keep_uid, keep_fence, &step(0, Intent::Route { turn: 0 }))
        .await
        .expect("append");
    store
        .post_message(&keep_key, 1, None, "stay", Timestamp::UNIX_EPOCH)
        .await
        .expect("post");

    store.delete(&key).await.expect("delete");
    assert_eq!(store.get(&key).await, Err(Error::NotFound(key.clone())));
    assert_eq!(store.journal(&uid).await, Ok(vec![]), "the journal is gone");
    assert_eq!(store.inbox(&uid).await, Ok(vec![]), "the inbox is gone");
    assert_eq!(store.journal(&keep_uid).await.map(|j| j.len()), Ok(1));
    assert_eq!(store.inbox(&keep_uid).await.map(|m| m.len()), Ok(1));

    // Created again: empty journal and inbox, the old message key delivers anew.
    store.create(&key, document).await.expect("create again");
    assert_eq!(
        store
            .post_message(&key, 1, Some("k"), "hello", Timestamp::UNIX_EPOCH)
            .await,
        Ok(Delivery::Delivered(1))
    );
    let fence = store
        .claim(&uid, &lease(OWNER_A, 0))
        .await
        .expect("claim again");
    store
        .append_step(&uid, fence, &step(0, Intent::Route { turn: 0 }))
        .await
        .expect("the journal starts at 0 again");
    assert_eq!(store.journal(&uid).await.map(|j| j.len()), Ok(1));
}

//! Conformance of [`Store::complete_step_with`] with a document: a step's outcome and a
//! document written together, the document only once the outcome is.

use nodus_core::Store;
use nodus_core::journal::Completion;
use nodus_core::journal::{Intent, Outcome};
use nodus_core::resource::Kind;
use nodus_core::store::{Change, DocumentWrite, Error, Fence, ObjectKey, Record, WithOutcome};
use serde_json::json;

use super::{OWNER_A, completion, join_all, lease, next_change, routing_run, step, unique};

/// A step's outcome and the run's status in one write: both land; a stale version refuses
/// the document alone (the outcome stays recorded); a refused outcome (completed already,
/// a stale fence) writes no document; a missing document is `NotFound` with the outcome
/// recorded; a written document is announced; and many runs at once (one group commit where
/// the store has one) each get their own answers.
pub async fn complete_step_with_a_document<S: Store + Clone + 'static>(store: S) {
    let project = unique("then");
    let (uid, key, created, fence) = routing_run(&store, &project, "run").await;
    let mut changes = store.subscribe();

    // Both written.
    let mut running = created.document.clone();
    running["status"]["phase"] = json!("Running");
    let done = completion(0, Outcome::Answered);
    let written = complete_then(
        &store,
        &uid,
        fence,
        0,
        &done,
        DocumentWrite {
            key: key.clone(),
            expected_version: 1,
            document: running.clone(),
        },
    )
    .await;
    let record = match written {
        Ok(Ok(record)) => record,
        other => panic!("outcome and document written: {other:?}"),
    };
    assert_eq!((record.version, &record.document), (2, &running));
    assert_eq!(store.get(&key).await, Ok(record.clone()));
    let journal = store.journal(&uid).await.expect("journal");
    assert_eq!(journal[0].completion, Some(done.clone()));
    assert_eq!(
        next_change(&mut changes, &project).await,
        Change::Written(key.clone(), 2),
        "the document written is announced"
    );

    // A stale version: the outcome is recorded, the document refused and left.
    store
        .append_step(&uid, fence, &step(1, Intent::Answer { turn: 0 }))
        .await
        .expect("append");
    let mut stale = running.clone();
    stale["status"]["phase"] = json!("Succeeded");
    let answered = completion(1, Outcome::Answered);
    let written = complete_then(
        &store,
        &uid,
        fence,
        1,
        &answered,
        DocumentWrite {
            key: key.clone(),
            expected_version: 1,
            document: stale.clone(),
        },
    )
    .await;
    assert_eq!(
        written,
        Ok(Err(Error::Conflict {
            key: key.clone(),
            expected: 1,
            actual: 2
        }))
    );
    assert_eq!(
        store.get(&key).await,
        Ok(record.clone()),
        "the document is left"
    );
    let journal = store.journal(&uid).await.expect("journal");
    assert_eq!(
        journal[1].completion,
        Some(answered.clone()),
        "the outcome is recorded though the document was refused"
    );

    // A refused outcome (the step is completed already) writes no document.
    let again = complete_then(
        &store,
        &uid,
        fence,
        1,
        &answered,
        DocumentWrite {
            key: key.clone(),
            expected_version: 2,
            document: stale.clone(),
        },
    )
    .await;
    assert!(
        matches!(&again, Err(Error::Journal { run, .. }) if run == &uid),
        "a second completion: {again:?}"
    );
    assert_eq!(
        store.get(&key).await,
        Ok(record.clone()),
        "no document written"
    );

    // A stale fence: refused, and no document written.
    store
        .append_step(&uid, fence, &step(2, Intent::Route { turn: 1 }))
        .await
        .expect("append");
    let newer = store
        .claim(&uid, &lease(OWNER_A, 0))
        .await
        .expect("claim again");
    let fenced = complete_then(
        &store,
        &uid,
        fence,
        2,
        &completion(2, Outcome::Answered),
        DocumentWrite {
            key: key.clone(),
            expected_version: 2,
            document: stale.clone(),
        },
    )
    .await;
    assert_eq!(fenced, Err(Error::Fenced { run: uid.clone() }));
    assert_eq!(
        store.get(&key).await,
        Ok(record.clone()),
        "no document written"
    );
    assert_eq!(
        store.journal(&uid).await.expect("journal")[2].completion,
        None
    );

    // A document that does not exist: `NotFound`, the outcome recorded.
    let missing = ObjectKey::new(&project, Kind::AgentRun, "missing");
    let written = complete_then(
        &store,
        &uid,
        newer,
        2,
        &completion(2, Outcome::Answered),
        DocumentWrite {
            key: missing.clone(),
            expected_version: 1,
            document: stale.clone(),
        },
    )
    .await;
    assert_eq!(written, Ok(Err(Error::NotFound(missing.clone()))));
    assert_eq!(store.get(&missing).await, Err(Error::NotFound(missing)));
    assert!(
        store.journal(&uid).await.expect("journal")[2]
            .completion
            .is_some()
    );

    // Many runs at once, each with its own outcome and status (and one stale version).
    let runs = 24;
    let mut tasks = Vec::new();
    for n in 0..runs {
        let store = store.clone();
        let project = project.clone();
        tasks.push(tokio::spawn(async move {
            let (uid, key, created, fence) =
                routing_run(&store, &project, &format!("many-{n}")).await;
            let mut document = created.document.clone();
            document["status"]["phase"] = json!(format!("Phase{n}"));
            let expected_version = if n == 7 { 5 } else { 1 };
            let written = complete_then(
                &store,
                &uid,
                fence,
                0,
                &completion(0, Outcome::Answered),
                DocumentWrite {
                    key: key.clone(),
                    expected_version,
                    document: document.clone(),
                },
            )
            .await
            .expect("the outcome is recorded");
            let stored = store.get(&key).await.expect("read");
            let journal = store.journal(&uid).await.expect("journal");
            (
                n,
                written.map(|r| r.version),
                stored,
                journal,
                created,
                document,
            )
        }));
    }
    for (n, written, stored, journal, created, document) in join_all(tasks).await {
        assert_eq!(
            journal[0].completion,
            Some(completion(0, Outcome::Answered)),
            "run {n}'s outcome"
        );
        if n == 7 {
            assert!(
                matches!(
                    written,
                    Err(Error::Conflict {
                        expected: 5,
                        actual: 1,
                        ..
                    })
                ),
                "run 7's stale version: {written:?}"
            );
            assert_eq!(stored, created, "run 7's document is left");
        } else {
            assert_eq!(written, Ok(2), "run {n}'s document");
            assert_eq!((stored.version, stored.document), (2, document));
        }
    }
}

/// The outcome and `then` alone: the document's answer.
async fn complete_then<S: Store>(
    store: &S,
    uid: &str,
    fence: Fence,
    seq: u32,
    completion: &Completion,
    then: DocumentWrite,
) -> Result<Result<Record, Error>, Error> {
    let with = WithOutcome {
        then: Some(&then),
        ..WithOutcome::default()
    };
    let written = store
        .complete_step_with(uid, fence, seq, completion, with)
        .await?;
    assert_eq!(written.next, None, "no next step was given");
    Ok(written.document.expect("a document given is answered for"))
}

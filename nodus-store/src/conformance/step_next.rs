//! Conformance of [`Store::complete_step_with`] with the run's next step: a step's outcome,
//! the run's status and its successor's intent written together, the successor only once
//! the status is.

use nodus_core::Store;
use nodus_core::journal::{Intent, Outcome, Step};
use nodus_core::store::{DocumentWrite, Error, OutcomeWritten, WithOutcome};
use serde_json::json;

use super::{OWNER_A, completion, join_all, lease, routing_run, step, unique};

/// The next step lands after the outcome and the document; a stale version refuses the
/// document and appends nothing (the outcome stays recorded); without a document the next
/// step lands alone; a next step out of order is refused with the outcome and the document
/// recorded; a stale fence writes nothing; and many runs at once (one group commit where
/// the store has one) each get their own answers.
pub async fn complete_step_with_the_next_step<S: Store + Clone + 'static>(store: S) {
    let project = unique("next");
    let (uid, key, created, fence) = routing_run(&store, &project, "run").await;
    let phase = |phase: &str| {
        let mut document = created.document.clone();
        document["status"]["phase"] = json!(phase);
        document
    };

    // The outcome, the document and the next step.
    let then = DocumentWrite {
        key: key.clone(),
        expected_version: 1,
        document: phase("Running"),
    };
    let first_call = step(1, Intent::Answer { turn: 0 });
    let with = WithOutcome {
        then: Some(&then),
        next: Some(&first_call),
        ..WithOutcome::default()
    };
    let written = store
        .complete_step_with(&uid, fence, 0, &completion(0, Outcome::Answered), with)
        .await
        .expect("the outcome is recorded");
    let record = match written {
        OutcomeWritten {
            document: Some(Ok(record)),
            next: Some(Ok(())),
        } => record,
        other => panic!("outcome, document and next step written: {other:?}"),
    };
    assert_eq!((record.version, &record.document), (2, &phase("Running")));
    assert_eq!(store.get(&key).await, Ok(record.clone()));
    let journal = store.journal(&uid).await.expect("journal");
    assert_eq!(
        journal,
        vec![
            Step {
                completion: Some(completion(0, Outcome::Answered)),
                ..step(0, Intent::Route { turn: 0 })
            },
            first_call.clone(),
        ],
        "the outcome, then the next step, open"
    );

    // A stale version: the outcome recorded, the document refused, no next step.
    let stale = DocumentWrite {
        key: key.clone(),
        expected_version: 1,
        document: phase("Succeeded"),
    };
    let refused_next = step(2, Intent::Route { turn: 1 });
    let with = WithOutcome {
        then: Some(&stale),
        next: Some(&refused_next),
        ..WithOutcome::default()
    };
    let written = store
        .complete_step_with(&uid, fence, 1, &completion(1, Outcome::Answered), with)
        .await
        .expect("the outcome is recorded");
    assert_eq!(
        written,
        OutcomeWritten {
            document: Some(Err(Error::Conflict {
                key: key.clone(),
                expected: 1,
                actual: 2
            })),
            next: None,
        }
    );
    assert_eq!(
        store.get(&key).await,
        Ok(record.clone()),
        "the document is left"
    );
    let journal = store.journal(&uid).await.expect("journal");
    assert_eq!(journal.len(), 2, "no next step after a refused document");
    assert_eq!(
        journal[1].completion,
        Some(completion(1, Outcome::Answered))
    );

    // Without a document: the outcome and the next step.
    store
        .append_step(&uid, fence, &step(2, Intent::Route { turn: 1 }))
        .await
        .expect("append");
    let alone = step(3, Intent::Answer { turn: 1 });
    let with = WithOutcome {
        next: Some(&alone),
        ..WithOutcome::default()
    };
    let written = store
        .complete_step_with(&uid, fence, 2, &completion(2, Outcome::Answered), with)
        .await;
    assert_eq!(
        written,
        Ok(OutcomeWritten {
            document: None,
            next: Some(Ok(()))
        })
    );
    let journal = store.journal(&uid).await.expect("journal");
    assert_eq!(journal.len(), 4);
    assert_eq!(
        journal[2].completion,
        Some(completion(2, Outcome::Answered))
    );
    assert_eq!(journal[3], alone);

    // A next step out of order: refused, with the outcome and the document recorded.
    let then = DocumentWrite {
        key: key.clone(),
        expected_version: 2,
        document: phase("Running"),
    };
    let out_of_order = step(9, Intent::Route { turn: 2 });
    let with = WithOutcome {
        then: Some(&then),
        next: Some(&out_of_order),
        ..WithOutcome::default()
    };
    let written = store
        .complete_step_with(&uid, fence, 3, &completion(3, Outcome::Answered), with)
        .await
        .expect("the outcome is recorded");
    assert!(
        matches!(&written.document, Some(Ok(record)) if record.version == 3),
        "the document is replaced: {written:?}"
    );
    assert!(
        matches!(&written.next, Some(Err(Error::Journal { run, .. })) if run == &uid),
        "a next step out of order: {written:?}"
    );
    let journal = store.journal(&uid).await.expect("journal");
    assert_eq!(journal.len(), 4, "nothing appended out of order");
    assert_eq!(
        journal[3].completion,
        Some(completion(3, Outcome::Answered))
    );

    // A stale fence: nothing written.
    store
        .append_step(&uid, fence, &step(4, Intent::Route { turn: 2 }))
        .await
        .expect("append");
    store
        .claim(&uid, &lease(OWNER_A, 0))
        .await
        .expect("claim again");
    let fenced_next = step(5, Intent::Answer { turn: 2 });
    let with = WithOutcome {
        next: Some(&fenced_next),
        ..WithOutcome::default()
    };
    let fenced = store
        .complete_step_with(&uid, fence, 4, &completion(4, Outcome::Answered), with)
        .await;
    assert_eq!(fenced, Err(Error::Fenced { run: uid.clone() }));
    let journal = store.journal(&uid).await.expect("journal");
    assert_eq!(journal.len(), 5, "no next step under a stale fence");
    assert_eq!(journal[4].completion, None, "nor the outcome");

    // Many runs at once, each with its outcome, status and next step (one stale version).
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
            let then = DocumentWrite {
                key: key.clone(),
                expected_version: if n == 7 { 5 } else { 1 },
                document,
            };
            let next = step(1, Intent::Answer { turn: n });
            let with = WithOutcome {
                then: Some(&then),
                next: Some(&next),
                ..WithOutcome::default()
            };
            let written = store
                .complete_step_with(&uid, fence, 0, &completion(0, Outcome::Answered), with)
                .await
                .expect("the outcome is recorded");
            let journal = store.journal(&uid).await.expect("journal");
            (n, written, journal, next)
        }));
    }
    for (n, written, journal, next) in join_all(tasks).await {
        assert_eq!(
            journal[0].completion,
            Some(completion(0, Outcome::Answered)),
            "run {n}'s outcome"
        );
        if n == 7 {
            assert!(
                matches!(
                    written,
                    OutcomeWritten {
                        document: Some(Err(Error::Conflict { .. })),
                        next: None
                    }
                ),
                "run 7's stale version: {written:?}"
            );
            assert_eq!(journal.len(), 1, "run 7 appended nothing");
        } else {
            assert!(
                matches!(
                    &written,
                    OutcomeWritten {
                        document: Some(Ok(record)),
                        next: Some(Ok(()))
                    } if record.version == 2
                ),
                "run {n}: {written:?}"
            );
            assert_eq!(journal.get(1), Some(&next), "run {n}'s next step");
        }
    }
}

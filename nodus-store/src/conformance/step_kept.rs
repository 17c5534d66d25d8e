//! Conformance of [`Store::complete_step_with`] with a snapshot: a command step's outcome written with the
//! working directory's snapshot after it (one that names no contents), and the run's status
//! when given.

use nodus_core::Store;
use nodus_core::journal::Completion;
use nodus_core::journal::{Intent, Outcome};
use nodus_core::resource::Kind;
use nodus_core::snapshot::{self as snap, Blob, Manifest, Snapshot, Stored};
use nodus_core::store::{DocumentWrite, Error, Fence, ObjectKey, Record, WithOutcome};
use serde_json::json;

use super::{OWNER_A, completion, lease, run_document, step, unique};

/// An unchanged working directory's snapshot kept with the outcome: both land and the
/// snapshot reads back whole as the last one's manifest; with a document, the document too;
/// a snapshot that names contents is refused naming them, and nothing is written.
pub async fn complete_step_with_a_snapshot<S: Store + Clone + 'static>(store: S) {
    let project = unique("kept");
    let uid = unique("uid-kept");
    let key = ObjectKey::new(&project, Kind::AgentRun, "run");
    let created = store
        .create(&key, run_document("run", &uid))
        .await
        .expect("create the run");
    let fence = store.claim(&uid, &lease(OWNER_A, 0)).await.expect("claim");
    let blob = Blob::of(unique("kept-contents").into_bytes());
    let first = Snapshot::Taken {
        manifest: Manifest {
            entries: vec![snap::Entry {
                path: "f".to_string(),
                mode: snap::REGULAR | 0o644,
                size: blob.bytes.len() as u64,
                digest: blob.digest.clone(),
                mtime_ns: 1,
            }],
            listed_at_ns: 5,
        },
        used_bytes: blob.bytes.len() as u64,
    };
    store
        .append_step(&uid, fence, &step(0, Intent::Route { turn: 0 }))
        .await
        .expect("append");
    store
        .put_snapshot(
            &uid,
            0,
            &Stored::of(None, 0, first.clone()),
            std::slice::from_ref(&blob),
        )
        .await
        .expect("the first snapshot");
    let done = completion(0, Outcome::Answered);
    let unchanged = Stored::unchanged(0, &first).expect("taken");

    // Without a document: the outcome and the snapshot.
    store
        .append_step(&uid, fence, &step(1, Intent::Answer { turn: 0 }))
        .await
        .expect("append");
    let written = complete_kept(&store, &uid, fence, 1, &done, &unchanged, None).await;
    assert_eq!(written, Ok(None));
    let journal = store.journal(&uid).await.expect("journal");
    assert_eq!(journal[1].completion, Some(done.clone()));
    let snapshots = store.snapshots(&uid).await.expect("snapshots");
    assert_eq!(snapshots, vec![(0, first.clone()), (1, first.clone())]);

    // With a document: the three.
    store
        .append_step(&uid, fence, &step(2, Intent::Answer { turn: 1 }))
        .await
        .expect("append");
    let mut running = created.document.clone();
    running["status"]["phase"] = json!("Running");
    let then = DocumentWrite {
        key: key.clone(),
        expected_version: 1,
        document: running.clone(),
    };
    let unchanged = Stored::unchanged(1, &first).expect("taken");
    let written = complete_kept(&store, &uid, fence, 2, &done, &unchanged, Some(then)).await;
    let record = match written {
        Ok(Some(Ok(record))) => record,
        other => panic!("outcome, snapshot and document written: {other:?}"),
    };
    assert_eq!((record.version, &record.document), (2, &running));
    assert_eq!(store.get(&key).await, Ok(record));
    let journal = store.journal(&uid).await.expect("journal");
    assert_eq!(journal[2].completion, Some(done.clone()));
    let snapshots = store.snapshots(&uid).await.expect("snapshots");
    assert_eq!(snapshots.last(), Some(&(2, first.clone())));

    // A snapshot that names contents is kept with them, not here: nothing is written.
    store
        .append_step(&uid, fence, &step(3, Intent::Answer { turn: 2 }))
        .await
        .expect("append");
    let whole = Stored::of(None, 3, first.clone());
    match complete_kept(&store, &uid, fence, 3, &done, &whole, None).await {
        Err(Error::Invalid(message)) => {
            assert!(message.contains(&blob.digest), "{message}");
        }
        other => panic!("a snapshot naming contents: {other:?}"),
    }
    let journal = store.journal(&uid).await.expect("journal");
    assert_eq!(journal[3].completion, None, "the outcome is not written");
    let snapshots = store.snapshots(&uid).await.expect("snapshots");
    assert!(
        snapshots.iter().all(|(seq, _)| *seq != 3),
        "nor the snapshot: {snapshots:?}"
    );
}

/// The outcome with `snapshot` and `then` when given: the document's answer.
async fn complete_kept<S: Store>(
    store: &S,
    uid: &str,
    fence: Fence,
    seq: u32,
    completion: &Completion,
    snapshot: &Stored,
    then: Option<DocumentWrite>,
) -> Result<Option<Result<Record, Error>>, Error> {
    let with = WithOutcome {
        snapshot: Some(snapshot),
        then: then.as_ref(),
        next: None,
    };
    let written = store
        .complete_step_with(uid, fence, seq, completion, with)
        .await?;
    assert_eq!(written.next, None, "no next step was given");
    Ok(written.document)
}

//! Conformance of working-directory snapshots: contents stored once by digest, and deltas.

use nodus_core::Store;
use nodus_core::resource::Kind;
use nodus_core::snapshot::{self as snap, Blob, Manifest, Snapshot, Stored};
use nodus_core::store::{Error, ObjectKey};

use super::{run_document, unique};

/// Working-directory snapshots: contents are stored once by digest whoever names them, a
/// snapshot naming contents the store lacks (or a blob whose digest is not its bytes') is
/// refused with nothing written, a step's snapshot is replaced, and removing a run's
/// snapshots (or the run) removes the contents no other run names and keeps the others.
pub async fn snapshots<S: Store + Clone + 'static>(store: S) {
    let project = unique("snapshots");
    let (run_a, run_b, run_c) = (unique("uid-a"), unique("uid-b"), unique("uid-c"));
    let blob = |what: &str, size: usize| {
        let mut bytes = unique(what).into_bytes();
        bytes.resize(size, b'x');
        Blob::of(bytes)
    };
    let (one, two, three) = (blob("one", 1000), blob("two", 2000), blob("three", 300));
    let manifest = |blobs: &[&Blob]| Manifest {
        entries: blobs
            .iter()
            .enumerate()
            .map(|(i, b)| snap::Entry {
                path: format!("f{i}"),
                mode: snap::REGULAR | 0o644,
                size: b.bytes.len() as u64,
                digest: b.digest.clone(),
                mtime_ns: 1,
            })
            .collect(),
        listed_at_ns: 2,
    };
    let whole = |blobs: &[&Blob]| Snapshot::Taken {
        manifest: manifest(blobs),
        used_bytes: 7,
    };
    let taken = |blobs: &[&Blob]| Stored::Whole(whole(blobs));
    let before = store.blob_bytes().await.expect("blob bytes");
    store
        .put_snapshot(
            &run_a,
            3,
            &taken(&[&one, &two]),
            &[one.clone(), two.clone()],
        )
        .await
        .expect("first snapshot");
    assert_eq!(store.blob_bytes().await.expect("bytes"), before + 3000);
    assert_eq!(
        store
            .missing_blobs(&[one.digest.clone(), three.digest.clone()])
            .await
            .expect("missing"),
        vec![three.digest.clone()]
    );
    // Another run names `one` again, sending only what the store lacks: stored once.
    store
        .put_snapshot(
            &run_b,
            5,
            &taken(&[&one, &three]),
            std::slice::from_ref(&three),
        )
        .await
        .expect("second run's snapshot");
    // Sending a stored blob again changes nothing either.
    store
        .put_snapshot(&run_b, 6, &taken(&[&one]), std::slice::from_ref(&one))
        .await
        .expect("a blob sent again");
    assert_eq!(store.blob_bytes().await.expect("bytes"), before + 3300);
    assert_eq!(
        store.blob(&three.digest).await.expect("blob"),
        Some(three.bytes.clone())
    );
    // Contents the store lacks: refused, nothing written.
    let lacking = blob("lacking", 10);
    match store
        .put_snapshot(&run_c, 1, &taken(&[&one, &lacking]), &[])
        .await
    {
        Err(Error::Invalid(message)) => assert!(message.contains(&lacking.digest), "{message}"),
        other => panic!("a snapshot naming absent contents: {other:?}"),
    }
    let forged = Blob {
        digest: two.digest.clone(),
        bytes: b"not two".to_vec(),
    };
    match store
        .put_snapshot(&run_c, 1, &taken(&[&two]), &[forged])
        .await
    {
        Err(Error::Invalid(message)) => assert!(message.contains("digest"), "{message}"),
        other => panic!("a forged blob: {other:?}"),
    }
    assert_eq!(store.snapshots(&run_c).await.expect("none"), vec![]);
    // A step's snapshot is replaced; others follow in step order.
    let over = Snapshot::OverBudget {
        used_bytes: 7,
        wanted_bytes: 9,
        limit_bytes: 10,
    };
    store
        .put_snapshot(&run_a, 9, &Stored::Whole(over.clone()), &[])
        .await
        .expect("over budget");
    store
        .put_snapshot(&run_a, 3, &taken(&[&one, &two]), &[])
        .await
        .expect("replaced");
    assert_eq!(
        store.snapshots(&run_a).await.expect("listed"),
        vec![(3, whole(&[&one, &two])), (9, over)]
    );
    // Removing A's snapshots removes `two` (only A names it) and keeps `one` (B names it).
    store.delete_snapshots(&run_a).await.expect("removed");
    assert_eq!(store.snapshots(&run_a).await.expect("listed"), vec![]);
    assert_eq!(store.blob(&two.digest).await.expect("blob"), None);
    assert_eq!(
        store.blob(&one.digest).await.expect("blob"),
        Some(one.bytes.clone())
    );
    // Deleting run B's document removes its snapshots and then-unnamed contents.
    let key = ObjectKey::new(&project, Kind::AgentRun, "run-b");
    store
        .create(&key, run_document("run-b", &run_b))
        .await
        .expect("run b");
    store.delete(&key).await.expect("deleted");
    assert_eq!(store.snapshots(&run_b).await.expect("listed"), vec![]);
    assert_eq!(store.blob(&one.digest).await.expect("blob"), None);
    assert_eq!(store.blob(&three.digest).await.expect("blob"), None);
    assert_eq!(store.blob_bytes().await.expect("bytes"), before);
}

/// Snapshots kept as changes from an earlier step's: a delta names (and needs) only the
/// contents of what it changes, an empty one is kept for a step where nothing changed, each
/// reads back as exactly the whole manifest it was made from, a delta of a step that is not
/// earlier is refused with nothing written, and removing the run removes what only it named.
pub async fn snapshot_deltas<S: Store + Clone + 'static>(store: S) {
    let run = unique("uid-deltas");
    let blob = |what: &str| Blob::of(unique(what).into_bytes());
    let (one, two, three) = (blob("d-one"), blob("d-two"), blob("d-three"));
    let entry = |path: &str, b: &Blob, mode: u32| snap::Entry {
        path: path.to_string(),
        mode: snap::REGULAR | mode,
        size: b.bytes.len() as u64,
        digest: b.digest.clone(),
        mtime_ns: 1,
    };
    let taken = |entries: Vec<snap::Entry>, listed: i64| Snapshot::Taken {
        manifest: Manifest {
            entries,
            listed_at_ns: listed,
        },
        used_bytes: 3,
    };
    let before = store.blob_bytes().await.expect("blob bytes");
    let s1 = taken(vec![entry("a", &one, 0o644), entry("b", &two, 0o644)], 10);
    let s2 = taken(
        vec![
            entry("a", &one, 0o755),
            entry("b", &two, 0o644),
            entry("c", &three, 0o644),
        ],
        20,
    );
    let s3 = taken(s2.manifest().expect("taken").entries.clone(), 30);
    let s4 = taken(vec![entry("c", &three, 0o644)], 40);
    let d2 = Stored::of(Some((1, &s1)), 2, s2.clone());
    let d3 = Stored::of(Some((2, &s2)), 3, s3.clone());
    let d4 = Stored::of(Some((3, &s3)), 4, s4.clone());
    assert!(matches!(&d3, Stored::Delta(d) if d.changed.is_empty() && d.removed.is_empty()));
    store
        .put_snapshot(
            &run,
            1,
            &Stored::of(None, 1, s1.clone()),
            &[one.clone(), two.clone()],
        )
        .await
        .expect("whole");
    // A delta naming contents the store lacks: refused.
    match store.put_snapshot(&run, 2, &d2, &[]).await {
        Err(Error::Invalid(message)) => assert!(message.contains(&three.digest), "{message}"),
        other => panic!("a delta naming absent contents: {other:?}"),
    }
    store
        .put_snapshot(&run, 2, &d2, std::slice::from_ref(&three))
        .await
        .expect("delta");
    store
        .put_snapshot(&run, 3, &d3, &[])
        .await
        .expect("empty delta");
    store
        .put_snapshot(&run, 4, &d4, &[])
        .await
        .expect("removals");
    store
        .put_snapshot(&run, 5, &Stored::of(Some((4, &s4)), 5, s4.clone()), &[])
        .await
        .expect("nothing changed");
    // A delta of a step that is not earlier: refused, nothing written.
    let Stored::Delta(mut bad) = Stored::of(Some((4, &s4)), 6, s4.clone()) else {
        panic!("a delta");
    };
    bad.delta_of = 6;
    match store.put_snapshot(&run, 6, &Stored::Delta(bad), &[]).await {
        Err(Error::Invalid(message)) => {
            assert!(message.contains("not an earlier step"), "{message}")
        }
        other => panic!("a delta of itself: {other:?}"),
    }
    assert_eq!(
        store.snapshots(&run).await.expect("listed"),
        vec![(1, s1), (2, s2), (3, s3), (4, s4.clone()), (5, s4)]
    );
    assert_eq!(
        store.blob_bytes().await.expect("bytes"),
        before + (one.bytes.len() + two.bytes.len() + three.bytes.len()) as u64
    );
    store.delete_snapshots(&run).await.expect("removed");
    assert_eq!(store.snapshots(&run).await.expect("listed"), vec![]);
    assert_eq!(store.blob(&three.digest).await.expect("blob"), None);
    assert_eq!(store.blob_bytes().await.expect("bytes"), before);
}

//! Conformance of writes: optimistic concurrency, racing writers, extension kinds, atomic
//! edits, and batches (all or nothing, in order, idempotent; into groups: `joins`).

use std::collections::BTreeMap;
use std::sync::Arc;

use nodus_core::Store;
use nodus_core::resource::Kind;
use nodus_core::store::{Change, Error, ObjectKey, Selector};
use serde_json::{Value, json};

use super::{join_all, names, next_change, run_document, unique};

/// A write naming a stale version is refused with `Conflict` and changes nothing; the write
/// that won is kept, and a writer who reads again succeeds.
pub async fn optimistic_concurrency<S: Store + Clone + 'static>(store: S) {
    let project = unique("occ");
    let key = ObjectKey::new(&project, Kind::AgentRun, "contested");
    let original = run_document("contested", &unique("uid"));
    store.create(&key, original.clone()).await.expect("create");

    // Two writers read version 1; the first to write wins.
    let read_a = store.get(&key).await.expect("reader a");
    let read_b = store.get(&key).await.expect("reader b");
    let mut by_a = read_a.document.clone();
    by_a["status"]["phase"] = json!("Running");
    let mut by_b = read_b.document.clone();
    by_b["status"]["phase"] = json!("Cancelled");

    let won = store
        .update(&key, read_a.version, by_a.clone())
        .await
        .expect("first writer");
    assert_eq!(won.version, 2);
    assert_eq!(
        store.update(&key, read_b.version, by_b.clone()).await,
        Err(Error::Conflict {
            key: key.clone(),
            expected: 1,
            actual: 2
        })
    );
    assert_eq!(
        store.get(&key).await,
        Ok(won.clone()),
        "the refused write is not stored and the winning one is not lost"
    );

    // Versions that were never stored are refused as well.
    for expected in [0, 3, 7, u64::MAX] {
        assert_eq!(
            store.update(&key, expected, by_b.clone()).await,
            Err(Error::Conflict {
                key: key.clone(),
                expected,
                actual: 2
            })
        );
    }

    // The loser reads again and writes on top of the winner.
    let reread = store.get(&key).await.expect("read again");
    let mut merged = reread.document.clone();
    merged["status"]["message"] = json!("seen the running phase");
    let second = store
        .update(&key, reread.version, merged.clone())
        .await
        .expect("write after reading again");
    assert_eq!(second.version, 3);
    assert_eq!(second.document["status"]["phase"], json!("Running"));
    assert_eq!(store.get(&key).await, Ok(second));
}

/// Several tasks race on one document. In each round all read the same version and all
/// write: exactly one wins. Then they increment a counter with retries: no increment is lost.
pub async fn concurrent_writers<S: Store + Clone + 'static>(store: S) {
    const WRITERS: usize = 8;
    const ROUNDS: u64 = 10;
    const INCREMENTS: u64 = 25;

    let project = unique("race");
    let key = ObjectKey::new(&project, Kind::AgentRun, "raced");
    let mut document = run_document("raced", &unique("uid"));
    document["status"]["counter"] = json!(0);
    store.create(&key, document).await.expect("create");

    let barrier = Arc::new(tokio::sync::Barrier::new(WRITERS));
    let mut tasks = Vec::with_capacity(WRITERS);
    for writer in 0..WRITERS {
        let store = store.clone();
        let key = key.clone();
        let barrier = Arc::clone(&barrier);
        tasks.push(tokio::spawn(async move {
            let mut wins = Vec::new();
            for round in 0..ROUNDS {
                let record = store.get(&key).await.expect("read in a round");
                assert_eq!(record.version, round + 1, "one write per round");
                barrier.wait().await;
                let mut document = record.document;
                document["status"]["writer"] = json!(writer);
                document["status"]["round"] = json!(round);
                match store.update(&key, record.version, document).await {
                    Ok(written) => {
                        assert_eq!(written.version, round + 2);
                        wins.push(round);
                    }
                    Err(Error::Conflict {
                        expected, actual, ..
                    }) => {
                        assert_eq!((expected, actual), (round + 1, round + 2));
                    }
                    Err(e) => panic!("writer {writer}, round {round}: {e}"),
                }
                barrier.wait().await;
            }
            wins
        }));
    }
    let mut winners = BTreeMap::new();
    for (writer, wins) in join_all(tasks).await.into_iter().enumerate() {
        for round in wins {
            assert!(
                winners.insert(round, writer).is_none(),
                "round {round} had two winners"
            );
        }
    }
    assert_eq!(
        winners.keys().copied().collect::<Vec<_>>(),
        (0..ROUNDS).collect::<Vec<_>>(),
        "every round has exactly one winner"
    );
    let record = store.get(&key).await.expect("read after the rounds");
    assert_eq!(record.version, ROUNDS + 1);
    assert_eq!(record.document["status"]["round"], json!(ROUNDS - 1));
    assert_eq!(
        record.document["status"]["writer"],
        json!(winners.get(&(ROUNDS - 1)).copied())
    );

    // Read, modify, write, retrying on conflict: the classic lost-update test.
    let mut tasks = Vec::with_capacity(WRITERS);
    for _ in 0..WRITERS {
        let store = store.clone();
        let key = key.clone();
        tasks.push(tokio::spawn(async move {
            let mut conflicts = 0u64;
            for _ in 0..INCREMENTS {
                loop {
                    let record = store.get(&key).await.expect("read to increment");
                    tokio::task::yield_now().await;
                    let mut document = record.document;
                    let counter = document["status"]["counter"].as_u64().expect("a counter");
                    document["status"]["counter"] = json!(counter + 1);
                    match store.update(&key, record.version, document).await {
                        Ok(_) => break,
                        Err(Error::Conflict { .. }) => conflicts += 1,
                        Err(e) => panic!("increment: {e}"),
                    }
                }
            }
            conflicts
        }));
    }
    join_all(tasks).await;
    let record = store.get(&key).await.expect("read after the increments");
    let total = INCREMENTS * WRITERS as u64;
    assert_eq!(record.document["status"]["counter"], json!(total));
    assert_eq!(record.version, ROUNDS + 1 + total);
}

/// A kind nodus-core does not know ([`Kind::Extension`], such as the server's tokens) is
/// stored, read, listed, changed, announced and deleted like any other, apart from every
/// other kind.
pub async fn extension_kinds<S: Store + Clone + 'static>(store: S) {
    const WIDGETS: Kind = Kind::extension("widgets");
    const GADGETS: Kind = Kind::extension("gadgets");
    let project = unique("extension");
    let key = ObjectKey::new(&project, WIDGETS, "w");
    let document =
        json!({"apiVersion": "nodus.dev/v1", "kind": "Widget", "metadata": {"name": "w"}});
    let mut changes = store.subscribe();
    let created = store.create(&key, document.clone()).await.expect("create");
    assert_eq!(created.key, key);
    assert_eq!(
        next_change(&mut changes, &project).await,
        Change::Written(key.clone(), 1),
        "the change names the extension kind"
    );
    assert_eq!(store.get(&key).await, Ok(created.clone()));
    assert_eq!(
        names(&store, &project, WIDGETS, &Selector::default()).await,
        vec!["w".to_string()]
    );
    for other in [GADGETS, Kind::Agent, Kind::AgentRun] {
        assert!(
            names(&store, &project, other, &Selector::default())
                .await
                .is_empty(),
            "{other} lists no widget"
        );
    }
    let gadget = ObjectKey::new(&project, GADGETS, "w");
    store
        .create(&gadget, document.clone())
        .await
        .expect("the same name under another extension kind");
    assert_eq!(
        next_change(&mut changes, &project).await,
        Change::Written(gadget.clone(), 1)
    );
    let mut changed = document.clone();
    changed["spec"] = json!({"size": 2});
    let updated = store
        .update(&key, 1, changed.clone())
        .await
        .expect("update");
    assert_eq!((updated.version, updated.document), (2, changed));
    assert_eq!(
        next_change(&mut changes, &project).await,
        Change::Written(key.clone(), 2)
    );
    store.delete(&key).await.expect("delete");
    assert_eq!(
        next_change(&mut changes, &project).await,
        Change::Deleted(key.clone())
    );
    assert_eq!(store.get(&key).await, Err(Error::NotFound(key.clone())));
    assert_eq!(
        store.get(&gadget).await.map(|r| r.version),
        Ok(1),
        "deleting a widget leaves the gadget of the same name"
    );
}

/// `modify` edits a document atomically: concurrent edits are all applied, none lost and none
/// refused; an edit that returns `None` writes nothing; the answer is the stored document; a
/// missing document is `NotFound`; every applied edit is announced as a change.
pub async fn atomic_edits<S: Store + Clone + 'static>(store: S) {
    const EDITORS: u64 = 16;
    const EDITS: u64 = 10;

    let project = unique("edits");
    let key = ObjectKey::new(&project, Kind::Account, "account");
    let missing = ObjectKey::new(&project, Kind::Account, "missing");
    let counting = || -> nodus_core::store::Edit {
        Box::new(|document: &Value| {
            let mut document = document.clone();
            let counter = document["status"]["counter"].as_u64()?;
            document["status"]["counter"] = json!(counter + 1);
            Some(document)
        })
    };
    assert_eq!(
        store.modify(&missing, counting()).await,
        Err(Error::NotFound(missing.clone()))
    );
    let document = json!({
        "apiVersion": "nodus.dev/v1", "kind": "Account",
        "metadata": {"name": "account"}, "status": {"counter": 0},
    });
    store.create(&key, document).await.expect("create");
    let mut changes = store.subscribe();

    let mut tasks = Vec::new();
    for _ in 0..EDITORS {
        let (store, key) = (store.clone(), key.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..EDITS {
                let edited = store.modify(&key, counting()).await.expect("an edit");
                assert!(edited.document["status"]["counter"].as_u64() >= Some(1));
            }
        }));
    }
    join_all(tasks).await;
    let total = EDITORS * EDITS;
    let record = store.get(&key).await.expect("read after the edits");
    assert_eq!(
        record.document["status"]["counter"],
        json!(total),
        "no edit lost"
    );
    assert_eq!(record.version, 1 + total, "one version per edit");
    let mut announced = 0;
    while announced < total {
        match next_change(&mut changes, &project).await {
            Change::Written(k, _) if k == key => announced += 1,
            other => panic!("unexpected change {other:?}"),
        }
    }

    let unchanged = store
        .modify(&key, Box::new(|_| None))
        .await
        .expect("an edit that changes nothing");
    assert_eq!(unchanged, record, "the stored document, unchanged");
    assert_eq!(
        store.get(&key).await.expect("read again").version,
        1 + total
    );
}

/// A batch is written all or nothing, in order: a batch of 100 whose 57th item exists, or
/// that names one key twice, leaves none of its items behind; a good batch lists in its
/// own order, after what was created before it and before what comes after.
pub async fn batch_atomicity_and_order<S: Store + Clone + 'static>(store: S) {
    let project = unique("batch");
    let key = |name: &str| ObjectKey::new(&project, Kind::AgentRun, name);
    let existing = run_document("run-056", &unique("uid"));
    store
        .create(&key("run-056"), existing.clone())
        .await
        .expect("create the item that collides");

    let batch: Vec<_> = (0..100)
        .map(|i| {
            let name = format!("run-{i:03}");
            (key(&name), run_document(&name, &unique("uid")))
        })
        .collect();
    assert_eq!(batch[56].0.name, "run-056", "the 57th item");
    assert_eq!(
        store.create_batch(batch.clone(), None).await,
        Err(Error::AlreadyExists(key("run-056")))
    );
    let all = store
        .list(&project, Kind::AgentRun, &Selector::default())
        .await
        .expect("list after the refused batch");
    assert_eq!(all.len(), 1, "none of the refused batch is left behind");
    assert_eq!(all[0].key, key("run-056"));
    assert_eq!(all[0].version, 1);
    assert_eq!(all[0].document, existing);
    for name in ["run-000", "run-055", "run-057", "run-099"] {
        assert_eq!(store.get(&key(name)).await, Err(Error::NotFound(key(name))));
    }

    // A key named twice in one batch refuses the batch too.
    let twice = vec![
        (key("dup-a"), run_document("dup-a", &unique("uid"))),
        (key("dup-b"), run_document("dup-b", &unique("uid"))),
        (key("dup-a"), run_document("dup-a", &unique("uid"))),
    ];
    assert_eq!(
        store.create_batch(twice, None).await,
        Err(Error::AlreadyExists(key("dup-a")))
    );
    assert_eq!(
        store.get(&key("dup-a")).await,
        Err(Error::NotFound(key("dup-a")))
    );
    assert_eq!(
        store.get(&key("dup-b")).await,
        Err(Error::NotFound(key("dup-b")))
    );

    // A good batch of 100, in an order that is neither alphabetical nor its reverse.
    let order: Vec<String> = (0..100u32)
        .map(|i| format!("item-{:03}", (i * 37 + 11) % 100))
        .collect();
    let batch: Vec<_> = order
        .iter()
        .map(|name| (key(name), run_document(name, &unique("uid"))))
        .collect();
    let records = store
        .create_batch(batch.clone(), None)
        .await
        .expect("a batch without collisions");
    assert_eq!(records.len(), 100);
    for (record, (key, document)) in records.iter().zip(&batch) {
        assert_eq!(&record.key, key, "records come back in batch order");
        assert_eq!(record.version, 1);
        assert_eq!(&record.document, document);
    }
    store
        .create(&key("after"), run_document("after", &unique("uid")))
        .await
        .expect("create after the batch");

    let mut expected = vec!["run-056".to_string()];
    expected.extend(order.iter().cloned());
    expected.push("after".to_string());
    assert_eq!(
        names(&store, &project, Kind::AgentRun, &Selector::default()).await,
        expected,
        "creation order: before the batch, the batch in its order, after it"
    );

    // Repeating a batch without an idempotency key collides with itself.
    assert_eq!(
        store.create_batch(batch[..3].to_vec(), None).await,
        Err(Error::AlreadyExists(batch[0].0.clone()))
    );
    assert_eq!(store.create_batch(vec![], None).await, Ok(vec![]));
}

/// With an idempotency key, a repeated batch returns the first call's records and writes
/// nothing; a refused batch does not use its key up; keys are scoped by project.
pub async fn idempotent_batches<S: Store + Clone + 'static>(store: S) {
    let project = unique("idem");
    let key = |name: &str| ObjectKey::new(&project, Kind::AgentRun, name);
    let idempotency_key = unique("request");
    let batch: Vec<_> = ["one", "two", "three"]
        .into_iter()
        .map(|name| (key(name), run_document(name, &unique("uid"))))
        .collect();

    let first = store
        .create_batch(batch.clone(), Some(&idempotency_key))
        .await
        .expect("first call");
    assert_eq!(first.len(), 3);
    assert_eq!(
        store
            .create_batch(batch.clone(), Some(&idempotency_key))
            .await,
        Ok(first.clone()),
        "a repeat returns the first call's records"
    );

    // The repeat writes nothing, even after the documents moved on.
    let two = store.get(&key("two")).await.expect("get two");
    let mut document = two.document.clone();
    document["status"]["phase"] = json!("Running");
    let updated = store
        .update(&key("two"), two.version, document)
        .await
        .expect("update two");
    assert_eq!(
        store
            .create_batch(batch.clone(), Some(&idempotency_key))
            .await,
        Ok(first.clone())
    );
    assert_eq!(store.get(&key("two")).await, Ok(updated));

    // The same key with other items is still a repeat: nothing new is written.
    let other = vec![(key("four"), run_document("four", &unique("uid")))];
    assert_eq!(
        store.create_batch(other, Some(&idempotency_key)).await,
        Ok(first.clone())
    );
    assert_eq!(
        store.get(&key("four")).await,
        Err(Error::NotFound(key("four")))
    );
    assert_eq!(
        names(&store, &project, Kind::AgentRun, &Selector::default()).await,
        ["one", "two", "three"]
    );

    // A refused batch does not use its key up.
    let retry_key = unique("request");
    let colliding = vec![
        (key("five"), run_document("five", &unique("uid"))),
        (key("one"), run_document("one", &unique("uid"))),
    ];
    assert_eq!(
        store.create_batch(colliding, Some(&retry_key)).await,
        Err(Error::AlreadyExists(key("one")))
    );
    let fixed = vec![
        (key("five"), run_document("five", &unique("uid"))),
        (key("six"), run_document("six", &unique("uid"))),
    ];
    let written = store
        .create_batch(fixed.clone(), Some(&retry_key))
        .await
        .expect("the corrected batch under the same key");
    assert_eq!(
        written
            .iter()
            .map(|r| r.key.name.as_str())
            .collect::<Vec<_>>(),
        ["five", "six"]
    );
    assert_eq!(
        store.create_batch(fixed, Some(&retry_key)).await,
        Ok(written)
    );

    // The key of one project means nothing in another.
    let elsewhere = unique("idem");
    let batch: Vec<_> = ["one", "two"]
        .into_iter()
        .map(|name| {
            (
                ObjectKey::new(&elsewhere, Kind::AgentRun, name),
                run_document(name, &unique("uid")),
            )
        })
        .collect();
    let records = store
        .create_batch(batch, Some(&idempotency_key))
        .await
        .expect("same idempotency key, another project");
    assert!(
        records
            .iter()
            .all(|r| r.key.project == elsewhere && r.version == 1)
    );
    assert_eq!(
        names(&store, &elsewhere, Kind::AgentRun, &Selector::default()).await,
        ["one", "two"]
    );
}

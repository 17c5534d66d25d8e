//! The SQLite store against the conformance suite (each case on a fresh file, and all cases
//! on one shared file), and its own faults: foreign and damaged files, a closed store, a
//! directory that does not exist, reopening.

use jiff::Timestamp;
use nodus_core::journal::{Intent, Step};
use nodus_core::resource::Kind;
use nodus_core::store::{Error, Lease, ObjectKey, Store};
use serde_json::json;
use tempfile::TempDir;

use super::SqliteStore;
use crate::conformance;

/// A store in a new file of a new temporary directory (kept alive by the returned guard).
async fn fresh() -> (SqliteStore, TempDir) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let store = SqliteStore::open(dir.path().join("nodus.db"))
        .await
        .expect("open a new store");
    (store, dir)
}

macro_rules! cases {
    ($($case:ident),* $(,)?) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn $case() {
            let (store, _dir) = fresh().await;
            conformance::$case(store).await;
        }
    )*};
}

cases!(
    create_get_list_update_delete,
    list_selectors,
    list_sparse_known,
    list_pages,
    group_phases,
    optimistic_concurrency,
    concurrent_writers,
    atomic_edits,
    batch_atomicity_and_order,
    idempotent_batches,
    capped_batches,
    closed_groups,
    journal_in_order,
    complete_step_with_a_document,
    complete_step_with_a_snapshot,
    complete_step_with_the_next_step,
    fencing,
    messages,
    change_notification,
    delete_removes_journal_and_inbox,
    money_exact,
    leases,
    replicas_racing,
    retention,
    rewrite_run,
    extension_kinds,
    snapshots,
    snapshot_deltas,
);

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn run_all_on_one_file() {
    let (store, _dir) = fresh().await;
    conformance::run_all(|| store.clone()).await;
}

#[tokio::test]
async fn wal_and_synchronous_full() {
    let (store, _dir) = fresh().await;
    assert_eq!(store.durability().await, Ok(("wal".to_string(), 2)));
}

#[tokio::test]
async fn reopening_keeps_everything_and_fences_move_on() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let path = dir.path().join("nodus.db");
    let key = ObjectKey::new("p", Kind::AgentRun, "r");
    let lease = Lease::new(
        "a",
        Timestamp::UNIX_EPOCH,
        std::time::Duration::from_secs(30),
    );
    let step = Step {
        seq: 0,
        started_at: Timestamp::UNIX_EPOCH,
        intent: Intent::Route { turn: 0 },
        completion: None,
    };
    let first = {
        let store = SqliteStore::open(&path).await.expect("open");
        store
            .create(&key, json!({"metadata": {"name": "r", "uid": "u"}, "status": {"cost": {"totalUSD": "0.000000001"}}}))
            .await
            .expect("create");
        let fence = store.claim("u", &lease).await.expect("claim");
        store.append_step("u", fence, &step).await.expect("append");
        store.close().await;
        fence
    };
    let store = SqliteStore::open(&path)
        .await
        .expect("open again (migrations are idempotent)");
    let record = store.get(&key).await.expect("get after reopening");
    assert_eq!(
        record.document["status"]["cost"]["totalUSD"],
        json!("0.000000001")
    );
    assert_eq!(store.journal("u").await, Ok(vec![step]));
    let second = store
        .claim("u", &lease)
        .await
        .expect("claim after reopening");
    assert!(second > first, "no fence is issued twice across restarts");
}

#[tokio::test]
async fn a_closed_store_is_unavailable_not_a_panic() {
    let (store, _dir) = fresh().await;
    let key = ObjectKey::new("p", Kind::Agent, "a");
    store.close().await;
    let result = store.get(&key).await;
    assert!(
        matches!(&result, Err(e @ Error::Unavailable(_)) if e.is_retryable()),
        "{result:?}"
    );
    let result = store.create(&key, json!({})).await;
    assert!(matches!(result, Err(Error::Unavailable(_))), "{result:?}");
}

#[tokio::test]
async fn a_missing_directory_is_unavailable() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let path = dir.path().join("no-such-directory").join("nodus.db");
    let result = SqliteStore::open(&path).await;
    assert!(matches!(result, Err(Error::Unavailable(_))), "{result:?}");
}

#[tokio::test]
async fn a_file_of_random_bytes_is_refused() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let path = dir.path().join("random.db");
    // Deterministic "random" bytes: a linear congruential generator.
    let mut x: u32 = 0x1234_5678;
    let bytes: Vec<u8> = (0..64 * 1024)
        .map(|_| {
            x = x.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            x.to_be_bytes()[0]
        })
        .collect();
    std::fs::write(&path, &bytes).expect("write the file");
    match SqliteStore::open(&path).await {
        Err(Error::Corrupt(message)) => {
            assert!(
                message.contains("is not a Nodus store")
                    && message.contains("not a SQLite database"),
                "{message}"
            );
            assert!(message.contains(&path.display().to_string()), "{message}");
        }
        other => panic!("a random file opened as {other:?}"),
    }
    assert_eq!(
        std::fs::read(&path).expect("read"),
        bytes,
        "the file is left alone"
    );
}

#[tokio::test]
async fn a_sqlite_file_of_another_application_is_refused() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let path = dir.path().join("other.db");
    let conn = rusqlite::Connection::open(&path).expect("create");
    conn.execute_batch(
        "CREATE TABLE notes (id INTEGER PRIMARY KEY, text TEXT); \
         INSERT INTO notes (text) VALUES ('keep me');",
    )
    .expect("a table and a row");
    drop(conn);
    let before = std::fs::read(&path).expect("read");

    match SqliteStore::open(&path).await {
        Err(Error::Corrupt(message)) => {
            assert!(
                message.contains("another application") && message.contains("notes"),
                "{message}"
            );
        }
        other => panic!("another application's file opened as {other:?}"),
    }
    assert_eq!(
        std::fs::read(&path).expect("read"),
        before,
        "the file is left alone"
    );

    // A file stamped with another application_id is refused even when empty.
    let stamped = dir.path().join("stamped.db");
    let conn = rusqlite::Connection::open(&stamped).expect("create");
    conn.execute_batch("PRAGMA application_id = 42")
        .expect("stamp");
    drop(conn);
    let result = SqliteStore::open(&stamped).await;
    assert!(
        matches!(&result, Err(Error::Corrupt(m)) if m.contains("0x2a")),
        "{result:?}"
    );
}

/// A write transaction announces its changes only when it commits: a batch refused halfway
/// (its first document inserted, its second a duplicate) announces nothing, and the next
/// change heard is the next write's.
#[tokio::test]
async fn a_refused_transaction_announces_nothing() {
    let (store, _dir) = fresh().await;
    let mut changes = store.subscribe();
    let first = ObjectKey::new("p", Kind::Agent, "a");
    let document = json!({"metadata": {"name": "a"}});
    assert_eq!(
        store
            .create_batch(
                vec![
                    (first.clone(), document.clone()),
                    (first.clone(), document.clone())
                ],
                None
            )
            .await,
        Err(Error::AlreadyExists(first.clone()))
    );
    let next = ObjectKey::new("p", Kind::Agent, "b");
    store.create(&next, document).await.expect("create");
    assert_eq!(
        changes.try_recv(),
        Ok(nodus_core::store::Change::Written(next, 1))
    );
    assert_eq!(store.get(&first).await, Err(Error::NotFound(first)));
}

/// A single create goes through the writer's group commit: in a batch with other writes, a
/// create of a taken key (stored before, or earlier in the same batch) is refused alone, and
/// the batch's other writes commit and are announced.
#[tokio::test]
async fn a_create_of_a_taken_key_in_a_batch_refuses_only_itself() {
    use super::write::Write;
    use super::writer::Writer;
    use crate::commit::Committer;

    let (store, _dir) = fresh().await;
    let key = |name: &str| ObjectKey::new("p", Kind::Agent, name);
    let document = |name: &str, n: u32| json!({"metadata": {"name": name}, "n": n});
    store
        .create(&key("taken"), document("taken", 0))
        .await
        .expect("create");
    let mut changes = store.subscribe();
    let mut writer = Writer {
        db: store.inner.db.clone(),
    };
    let create = |name: &str, n| Write::Create {
        key: key(name),
        document: document(name, n),
        caps: Vec::new(),
    };
    let results = writer
        .commit(vec![
            create("a", 1),
            create("taken", 2),
            create("a", 3),
            create("b", 4),
        ])
        .await
        .expect("the batch commits");
    let answered: Vec<String> = results
        .into_iter()
        .map(
            |result| match result.and_then(super::write::Written::document) {
                Ok(record) => format!(
                    "{} v{} n{}",
                    record.key.name, record.version, record.document["n"]
                ),
                Err(e) => format!("{e:?}"),
            },
        )
        .collect();
    assert_eq!(
        answered,
        vec![
            "a v1 n1".to_string(),
            format!("{:?}", Error::AlreadyExists(key("taken"))),
            format!("{:?}", Error::AlreadyExists(key("a"))),
            "b v1 n4".to_string(),
        ]
    );
    for (name, n) in [("a", 1), ("taken", 0), ("b", 4)] {
        let record = store.get(&key(name)).await.expect("stored");
        assert_eq!((record.version, record.document), (1, document(name, n)));
    }
    use nodus_core::store::Change;
    assert_eq!(changes.try_recv(), Ok(Change::Written(key("a"), 1)));
    assert_eq!(changes.try_recv(), Ok(Change::Written(key("b"), 1)));
    assert!(changes.try_recv().is_err(), "nothing else announced");
}

/// Migration 0003: a credit account written under the kind `projects` (before accounts had
/// a kind of their own) reads back as the project's account; other `projects` rows stay.
#[tokio::test]
async fn accounts_written_as_projects_are_read_as_accounts() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let path = dir.path().join("nodus.db");
    drop(SqliteStore::open(&path).await.expect("a new store"));
    // The file as the release before left it: migration 3 not applied, an account under
    // `projects`, and a document of a user project that happens to be of that kind name.
    let conn = rusqlite::Connection::open(&path).expect("connect");
    for sql in [
        "DELETE FROM _sqlx_migrations WHERE version = 3",
        "INSERT INTO resources (project, kind, name, version, uid, document) VALUES \
         ('_system', 'projects', 'team', 4, NULL, \
          '{\"kind\":\"Project\",\"metadata\":{\"name\":\"team\"},\
            \"status\":{\"account\":{\"balanceUSD\":\"5\",\"spentUSD\":\"1.25\"}}}')",
        "INSERT INTO resources (project, kind, name, version, uid, document) VALUES \
         ('team', 'projects', 'other', 1, NULL, '{\"metadata\":{\"name\":\"other\"}}')",
    ] {
        conn.execute_batch(sql).expect(sql);
    }
    drop(conn);

    let store = std::sync::Arc::new(SqliteStore::open(&path).await.expect("reopen"));
    let ledger = nodus_core::ledger::StoreLedger::new(store.clone());
    let account = ledger.account("team").await.expect("the account");
    assert_eq!(account.balance_usd, "5".parse().expect("usd"));
    assert_eq!(account.spent_usd, "1.25".parse().expect("usd"));
    assert_eq!(
        nodus_core::ledger::projects(store.as_ref()).await,
        Ok(vec!["team".to_string()])
    );
    let left = ObjectKey::new("team", Kind::extension("projects"), "other");
    assert_eq!(store.get(&left).await.map(|r| r.version), Ok(1));
}

/// One batch of journal writes, checked in order against each other and written in a few
/// statements: each write gets its own answer, exactly as if written one by one.
#[tokio::test]
async fn a_batch_of_journal_writes_answers_each_write_in_order() {
    use crate::commit::JournalWrite;
    use nodus_core::journal::{Completion, Outcome};
    use nodus_core::store::Fence;

    let (store, _dir) = fresh().await;
    let lease = Lease::new("a", Timestamp::now(), std::time::Duration::from_secs(30));
    let fence = store.claim("u", &lease).await.expect("claim");
    let step = |seq| Step {
        seq,
        started_at: Timestamp::UNIX_EPOCH,
        intent: Intent::Route { turn: seq },
        completion: None,
    };
    store
        .append_step("u", fence, &step(0))
        .await
        .expect("append");
    // Step 0 has its outcome before the batch, which completes it again.
    let first = Completion {
        finished_at: Timestamp::UNIX_EPOCH,
        outcome: Outcome::Answered,
    };
    store
        .complete_step("u", fence, 0, &first)
        .await
        .expect("complete");
    let done = Completion {
        finished_at: Timestamp::UNIX_EPOCH,
        outcome: Outcome::Failed {
            error: "no".to_string(),
            by_resolution: false,
        },
    };
    let append = |seq, fence| JournalWrite::Append {
        run: "u".to_string(),
        fence,
        step: step(seq),
    };
    let complete = |seq, fence| JournalWrite::Complete {
        run: "u".to_string(),
        fence,
        seq,
        completion: done.clone(),
    };
    let stale = Fence(fence.0 - 1);
    let writes = vec![
        append(1, fence),
        append(1, fence),
        complete(1, fence),
        complete(1, fence),
        complete(5, fence),
        append(2, stale),
        JournalWrite::Append {
            run: "nobody-holds-this".to_string(),
            fence,
            step: step(0),
        },
        complete(0, fence),
        append(2, fence),
    ];
    let results = store
        .inner
        .db
        .write(move |tx| super::batch::journal_writes(tx, &writes))
        .await
        .expect("the batch");
    let refusal = |r: &Result<(), Error>| match r {
        Ok(()) => "ok".to_string(),
        Err(Error::Fenced { .. }) => "fenced".to_string(),
        Err(Error::Journal { message, .. }) => message.clone(),
        Err(other) => format!("{other:?}"),
    };
    assert_eq!(
        results.iter().map(refusal).collect::<Vec<_>>(),
        vec![
            "ok".to_string(),
            "step 1 appended out of order (the journal has 2 steps, so the next is 2)".to_string(),
            "ok".to_string(),
            "step 1 is already completed".to_string(),
            "cannot complete step 5: the journal has 2 steps".to_string(),
            "fenced".to_string(),
            "fenced".to_string(),
            "step 0 is already completed".to_string(),
            "ok".to_string(),
        ]
    );
    let journal = store.journal("u").await.expect("the journal");
    assert_eq!(
        journal
            .iter()
            .map(|s| (s.seq, s.completion.clone()))
            .collect::<Vec<_>>(),
        vec![(0, Some(first)), (1, Some(done)), (2, None)],
        "step 0 keeps its first outcome"
    );
}

/// The largest batch the writer takes fits SQLite's limits (bound parameters, rows of one
/// `VALUES`): as many appends and completions, each for its own run, in one segment.
#[tokio::test]
async fn a_full_batch_of_journal_writes_fits_in_one_segment() {
    use crate::commit::{JournalWrite, MAX_BATCH};
    use nodus_core::journal::{Completion, Outcome};

    let (store, _dir) = fresh().await;
    let lease = Lease::new("a", Timestamp::now(), std::time::Duration::from_secs(30));
    let mut fences = Vec::new();
    for run in 0..MAX_BATCH {
        fences.push(
            store
                .claim(&format!("r{run}"), &lease)
                .await
                .expect("claim"),
        );
    }
    let step = Step {
        seq: 0,
        started_at: Timestamp::UNIX_EPOCH,
        intent: Intent::Route { turn: 0 },
        completion: None,
    };
    let appends: Vec<JournalWrite> = (0..MAX_BATCH)
        .map(|run| JournalWrite::Append {
            run: format!("r{run}"),
            fence: fences[run],
            step: step.clone(),
        })
        .collect();
    let completes: Vec<JournalWrite> = (0..MAX_BATCH)
        .map(|run| JournalWrite::Complete {
            run: format!("r{run}"),
            fence: fences[run],
            seq: 0,
            completion: Completion {
                finished_at: Timestamp::UNIX_EPOCH,
                outcome: Outcome::SandboxDestroyed,
            },
        })
        .collect();
    for segment in [appends, completes] {
        let results = store
            .inner
            .db
            .write(move |tx| super::batch::journal_writes(tx, &segment))
            .await
            .expect("the batch");
        assert!(results.iter().all(Result::is_ok), "{results:?}");
    }
    for run in [0, MAX_BATCH - 1] {
        let journal = store.journal(&format!("r{run}")).await.expect("journal");
        assert_eq!(journal.len(), 1);
        assert!(journal[0].completion.is_some());
    }
}

/// The plan SQLite chooses for `query`, one line per step.
fn plan(store: &SqliteStore, query: &super::db::Query) -> String {
    let rows = store
        .read(|conn| {
            query
                .explained()
                .rows(conn, |row| super::db::get::<String>(row, 3))
        })
        .expect("explain");
    rows.join("\n")
}

#[tokio::test]
async fn group_members_are_found_through_an_index() {
    let (store, _dir) = fresh().await;
    let selector = nodus_core::store::Selector::in_group("g");
    let mut query = super::db::Query::new("SELECT name FROM resources WHERE project = ");
    super::reads::push_selection(&mut query, "p", Kind::AgentRun, &selector);
    let members = plan(&store, &query);
    assert!(members.contains("resources_group"), "{members}");
}

/// The documents a segment of journal writes replaces, in one statement: each update gets its
/// own answer, exactly as if written one by one (a stale version and a missing document are
/// refused alone and change nothing), and a document named twice is replaced twice, in order.
#[tokio::test]
async fn a_segment_s_document_updates_answer_each_update_in_order() {
    use super::write::DocumentUpdate;
    use crate::sql::{Columns, document_text};

    let (store, _dir) = fresh().await;
    let key = |name: &str| ObjectKey::new("p", Kind::AgentRun, name);
    for name in ["a", "b", "c"] {
        store
            .create(
                &key(name),
                json!({ "spec": { "group": "g" }, "status": { "phase": "Pending" } }),
            )
            .await
            .expect("create");
    }
    let update = |name: &str, expected: u64, phase: &str| {
        let document = json!({ "spec": { "group": "g" }, "status": { "phase": phase } });
        DocumentUpdate {
            key: key(name),
            expected,
            columns: Columns::of(&document),
            text: document_text(&document),
        }
    };
    let run = |updates: Vec<DocumentUpdate>| {
        let store = &store;
        async move {
            store
                .inner
                .db
                .write(move |tx| {
                    let refs: Vec<&DocumentUpdate> = updates.iter().collect();
                    super::batch::replace_documents(tx, &refs)
                })
                .await
                .expect("the segment")
        }
    };
    let results = run(vec![
        update("a", 1, "Running"),
        update("b", 5, "Running"),
        update("gone", 1, "Running"),
        update("c", 1, "Succeeded"),
    ])
    .await;
    assert_eq!(
        results,
        vec![
            Ok(()),
            Err(Error::Conflict {
                key: key("b"),
                expected: 5,
                actual: 1
            }),
            Err(Error::NotFound(key("gone"))),
            Ok(()),
        ]
    );
    let stored = |name: &'static str| {
        let store = &store;
        async move {
            let record = store.get(&key(name)).await.expect("get");
            (record.version, record.document["status"]["phase"].clone())
        }
    };
    assert_eq!(stored("a").await, (2, json!("Running")));
    assert_eq!(
        stored("b").await,
        (1, json!("Pending")),
        "b is left as it was"
    );
    assert_eq!(stored("c").await, (2, json!("Succeeded")));
    // The phase column (what a group's counts read) follows the document.
    let mut phases = store.group_phases("p", "g").await.expect("phases");
    phases.sort();
    let phase = |name: &str| Some(name.to_string());
    assert_eq!(
        phases,
        vec![
            (phase("Pending"), 1),
            (phase("Running"), 1),
            (phase("Succeeded"), 1)
        ]
    );

    let results = run(vec![
        update("a", 2, "Waiting"),
        update("a", 3, "Succeeded"),
        update("b", 1, "Failed"),
    ])
    .await;
    assert_eq!(results, vec![Ok(()), Ok(()), Ok(())]);
    assert_eq!(stored("a").await, (4, json!("Succeeded")));
    assert_eq!(stored("b").await, (2, json!("Failed")));
}

/// A file whose recorded migrations this release does not know (a newer Nodus wrote it), one
/// of whose migrations was left part-way, or one applied from other SQL is refused on open,
/// with a message that says which, and is left as it was.
#[tokio::test]
async fn a_file_migrated_otherwise_is_refused() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let path = dir.path().join("nodus.db");
    let store = SqliteStore::open(&path).await.expect("a new store");
    store.close().await;
    drop(store);
    for (change, expected) in [
        (
            "INSERT INTO _sqlx_migrations (version, description, success, checksum, \
             execution_time) VALUES (9999, 'later', TRUE, x'00', 0)",
            "migrated by a newer Nodus (migration 9999 is unknown here)",
        ),
        (
            "UPDATE _sqlx_migrations SET success = FALSE WHERE version = 2",
            "migration 2 was left part-way",
        ),
        (
            "UPDATE _sqlx_migrations SET checksum = x'00' WHERE version = 1",
            "migration 1 was applied from other SQL",
        ),
    ] {
        let copy = dir.path().join("copy.db");
        std::fs::copy(&path, &copy).expect("a copy");
        let conn = rusqlite::Connection::open(&copy).expect("connect");
        conn.execute_batch(change).expect(change);
        drop(conn);
        let before = std::fs::read(&copy).expect("read");
        match SqliteStore::open(&copy).await {
            Err(Error::Corrupt(message)) => {
                assert!(message.contains(expected), "{message}");
            }
            other => panic!("{change}: opened as {other:?}"),
        }
        assert_eq!(
            std::fs::read(&copy).expect("read"),
            before,
            "{change}: left alone"
        );
        std::fs::remove_file(&copy).expect("remove");
    }
}

//! The conformance suite every [`Store`] backend passes: one public async function per case,
//! and [`run_all`] to run them all.
//!
//! Each case takes a fresh store and fails by panicking, like any test. Cases use their own
//! projects, run uids and idempotency keys (unique per process and call), so they can share a
//! database with each other and with earlier runs of the suite, and they accept change
//! notifications about other projects. A backend runs the suite like this:
//!
//! ```text
//! #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
//! async fn conformance() {
//!     nodus_store::conformance::run_all(MyStore::new).await;
//! }
//! ```

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use jiff::Timestamp;
use nodus_core::Store;
use nodus_core::journal::{Completion, Intent, Outcome, Step};
use nodus_core::resource::Kind;
use nodus_core::snapshot::{self as snap, Blob, Manifest, Snapshot, Stored};
use nodus_core::store::{
    Change, Delivery, Error, Fence, InboxMessage, Lease, ObjectKey, Page, Position, RunRewrite,
    Selector,
};
use serde_json::{Value, json};
use tokio::sync::broadcast;

mod step_then;
pub use step_then::complete_step_then;

/// How long a case waits for something that should happen at once (a change notification,
/// racing tasks to finish) before it fails instead of hanging.
const PATIENCE: Duration = Duration::from_secs(30);

/// Run every case, each on a store of its own from `make`.
pub async fn run_all<S: Store + Clone + 'static>(make: impl Fn() -> S) {
    create_get_list_update_delete(make()).await;
    list_selectors(make()).await;
    list_pages(make()).await;
    group_phases(make()).await;
    optimistic_concurrency(make()).await;
    concurrent_writers(make()).await;
    atomic_edits(make()).await;
    batch_atomicity_and_order(make()).await;
    idempotent_batches(make()).await;
    journal_in_order(make()).await;
    complete_step_then(make()).await;
    fencing(make()).await;
    messages(make()).await;
    change_notification(make()).await;
    delete_removes_journal_and_inbox(make()).await;
    money_exact(make()).await;
    leases(make()).await;
    replicas_racing(make()).await;
    retention(make()).await;
    rewrite_run(make()).await;
    extension_kinds(make()).await;
    snapshots(make()).await;
    snapshot_deltas(make()).await;
}

/// Create, get, list, update and delete one document; missing keys are `NotFound`, an
/// existing key cannot be created again, and a deleted name can be created afresh; `projects`
/// names the projects that hold a document, in order.
pub async fn create_get_list_update_delete<S: Store + Clone + 'static>(store: S) {
    let project = unique("crud");
    let key = ObjectKey::new(&project, Kind::AgentRun, "first");
    let uid = unique("uid");

    assert_eq!(store.get(&key).await, Err(Error::NotFound(key.clone())));
    assert_eq!(
        store.update(&key, 1, run_document("first", &uid)).await,
        Err(Error::NotFound(key.clone()))
    );
    assert_eq!(store.delete(&key).await, Err(Error::NotFound(key.clone())));
    assert_eq!(
        store
            .list(&project, Kind::AgentRun, &Selector::default())
            .await,
        Ok(vec![])
    );

    let in_projects = |store: S, project: String| async move {
        let projects = store.projects().await.expect("projects");
        let mut sorted = projects.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(projects, sorted, "projects in name order, each once");
        projects.contains(&project)
    };
    assert!(!in_projects(store.clone(), project.clone()).await);

    let document = run_document("first", &uid);
    let created = store
        .create(&key, document.clone())
        .await
        .expect("create a new document");
    assert!(in_projects(store.clone(), project.clone()).await);
    assert_eq!(created.key, key);
    assert_eq!(created.version, 1, "a new document is at version 1");
    assert_eq!(created.document, document);

    let mut other = run_document("first", &unique("uid"));
    other["spec"]["input"] = json!("a different document");
    assert_eq!(
        store.create(&key, other).await,
        Err(Error::AlreadyExists(key.clone()))
    );
    assert_eq!(
        store.get(&key).await,
        Ok(created.clone()),
        "a refused create leaves the stored document alone"
    );

    // The same name under another kind or project is another document.
    let agent = ObjectKey::new(&project, Kind::Agent, "first");
    let elsewhere = ObjectKey::new(unique("crud"), Kind::AgentRun, "first");
    for key in [&agent, &elsewhere] {
        let record = store
            .create(key, agent_document("first"))
            .await
            .expect("same name, another kind or project");
        assert_eq!(record.version, 1);
    }
    assert_eq!(
        store
            .list(&project, Kind::AgentRun, &Selector::default())
            .await,
        Ok(vec![created.clone()])
    );
    assert_eq!(
        names(&store, &project, Kind::Agent, &Selector::default()).await,
        ["first"]
    );

    let mut changed = document.clone();
    changed["status"]["phase"] = json!("Running");
    let updated = store
        .update(&key, 1, changed.clone())
        .await
        .expect("update at the current version");
    assert_eq!(updated.key, key);
    assert_eq!(updated.version, 2, "an update bumps the version");
    assert_eq!(updated.document, changed);
    assert_eq!(store.get(&key).await, Ok(updated.clone()));
    assert_eq!(
        store
            .list(&project, Kind::AgentRun, &Selector::default())
            .await,
        Ok(vec![updated])
    );

    store.delete(&key).await.expect("delete");
    assert_eq!(store.get(&key).await, Err(Error::NotFound(key.clone())));
    assert_eq!(store.delete(&key).await, Err(Error::NotFound(key.clone())));
    assert_eq!(
        store
            .list(&project, Kind::AgentRun, &Selector::default())
            .await,
        Ok(vec![])
    );
    assert_eq!(
        store.get(&agent).await.map(|r| r.version),
        Ok(1),
        "deleting a run leaves the agent of the same name"
    );
    assert!(in_projects(store.clone(), project.clone()).await);
    store.delete(&agent).await.expect("delete the agent");
    assert!(
        !in_projects(store.clone(), project.clone()).await,
        "a project without documents is not listed"
    );

    let again = store
        .create(&key, document.clone())
        .await
        .expect("create a deleted name again");
    assert_eq!(
        again.version, 1,
        "a re-created document starts at version 1"
    );
}

/// `group_phases` counts a group's runs by phase, and follows every write that changes a
/// run's group or phase: create, batch, update, atomic edit, delete. Runs of other groups, of
/// no group, of other projects and other kinds are not counted.
pub async fn group_phases<S: Store + Clone + 'static>(store: S) {
    let project = unique("phases");
    let run = |name: &str| ObjectKey::new(&project, Kind::AgentRun, name);
    let counts = |store: S, project: String| async move {
        store
            .group_phases(&project, "g1")
            .await
            .expect("group phases")
    };
    let counted = |pairs: &[(Option<&str>, u64)]| -> Vec<(Option<String>, u64)> {
        pairs
            .iter()
            .map(|(phase, n)| (phase.map(str::to_string), *n))
            .collect()
    };
    assert_eq!(counts(store.clone(), project.clone()).await, counted(&[]));
    for (name, group, phase) in [
        ("a", Some("g1"), "Running"),
        ("b", Some("g1"), "Running"),
        ("c", Some("g1"), "Succeeded"),
        ("x", Some("g2"), "Running"),
        ("y", None, "Running"),
    ] {
        store
            .create(
                &run(name),
                shaped_run(name, &unique("uid"), &[], group, phase),
            )
            .await
            .expect("create a run");
    }
    // A run with no phase yet, and one written in a batch.
    let mut fresh = shaped_run("d", &unique("uid"), &[], Some("g1"), "Pending");
    fresh["status"] = json!({});
    store.create(&run("d"), fresh).await.expect("create a run");
    store
        .create_batch(
            vec![(
                run("e"),
                shaped_run("e", &unique("uid"), &[], Some("g1"), "Pending"),
            )],
            None,
        )
        .await
        .expect("a batch");
    // Decoys: another kind naming the group, the group's name in another project.
    let mut agent = agent_document("decoy");
    agent["spec"]["group"] = json!("g1");
    store
        .create(&ObjectKey::new(&project, Kind::Agent, "decoy"), agent)
        .await
        .expect("an agent");
    let other = unique("phases");
    store
        .create(
            &ObjectKey::new(&other, Kind::AgentRun, "a"),
            shaped_run("a", &unique("uid"), &[], Some("g1"), "Running"),
        )
        .await
        .expect("a run in another project");
    assert_eq!(
        counts(store.clone(), project.clone()).await,
        counted(&[
            (None, 1),
            (Some("Pending"), 1),
            (Some("Running"), 2),
            (Some("Succeeded"), 1)
        ])
    );

    // An update, an atomic edit and a delete move the counts.
    let b = store.get(&run("b")).await.expect("b");
    let mut failed = b.document.clone();
    failed["status"]["phase"] = json!("Failed");
    store
        .update(&run("b"), b.version, failed)
        .await
        .expect("update b");
    store
        .modify(
            &run("a"),
            Box::new(|document| {
                let mut document = document.clone();
                document["status"]["phase"] = json!("Succeeded");
                Some(document)
            }),
        )
        .await
        .expect("edit a");
    store.delete(&run("d")).await.expect("delete d");
    // A run that leaves the group.
    let x = store.get(&run("e")).await.expect("e");
    let mut moved = x.document.clone();
    moved["spec"]["group"] = json!("g2");
    store
        .update(&run("e"), x.version, moved)
        .await
        .expect("move e");
    assert_eq!(
        counts(store.clone(), project.clone()).await,
        counted(&[(Some("Failed"), 1), (Some("Succeeded"), 2)])
    );
    assert_eq!(
        store.group_phases(&project, "g2").await.expect("g2"),
        counted(&[(Some("Pending"), 1), (Some("Running"), 1)])
    );
    assert_eq!(
        store.group_phases(&project, "none").await.expect("none"),
        counted(&[])
    );
}

/// `list` filters by labels and by dotted fields (`spec.group`, `status.phase`,
/// `status.snapshot.agentRef`), within one
/// project and kind, in creation order; a missing label or field matches nothing.
pub async fn list_selectors<S: Store + Clone + 'static>(store: S) {
    let project = unique("select");
    let documents = [
        (
            "zulu",
            &[("team", "red"), ("tier", "gold")][..],
            Some("g1"),
            "Running",
        ),
        ("alpha", &[("team", "blue")][..], Some("g1"), "Succeeded"),
        ("mike", &[("team", "red")][..], None, "Running"),
    ];
    // Each run's agent as written (`spec.agent`) and as resolved at creation
    // (`status.snapshot.agentRef`): an agent's runs are listed by either.
    let agents = [
        ("zulu", "helper", "helper"),
        ("alpha", "other", "other"),
        ("mike", "team/helper", "helper"),
    ];
    for (name, labels, group, phase) in documents {
        let mut document = shaped_run(name, &unique("uid"), labels, group, phase);
        if let Some((_, written, resolved)) = agents.iter().find(|(run, ..)| *run == name) {
            document["spec"]["agent"] = json!(written);
            document["status"]["snapshot"] =
                json!({ "agentRef": format!("team/{resolved}"), "agentRevision": "1" });
        }
        store
            .create(&ObjectKey::new(&project, Kind::AgentRun, name), document)
            .await
            .expect("create a run");
    }
    // Decoys: another kind in the project, the same kind in another project.
    store
        .create(
            &ObjectKey::new(&project, Kind::Agent, "decoy"),
            agent_document("decoy"),
        )
        .await
        .expect("create an agent");
    let other_project = unique("select");
    store
        .create(
            &ObjectKey::new(&other_project, Kind::AgentRun, "decoy"),
            shaped_run(
                "decoy",
                &unique("uid"),
                &[("team", "red")],
                Some("g1"),
                "Running",
            ),
        )
        .await
        .expect("create a run in another project");

    type Pairs = &'static [(&'static str, &'static str)];
    // (labels, fields, the names listed)
    let cases: &[(Pairs, Pairs, &[&str])] = &[
        (&[], &[], &["zulu", "alpha", "mike"]),
        (&[("team", "red")], &[], &["zulu", "mike"]),
        (&[("team", "red"), ("tier", "gold")], &[], &["zulu"]),
        (&[("team", "green")], &[], &[]),
        (&[("owner", "red")], &[], &[]),
        (&[], &[("spec.group", "g1")], &["zulu", "alpha"]),
        (&[], &[("spec.group", "g2")], &[]),
        (&[], &[("status.phase", "Running")], &["zulu", "mike"]),
        (&[], &[("status.phase", "Succeeded")], &["alpha"]),
        (
            &[("team", "red")],
            &[("spec.group", "g1"), ("status.phase", "Running")],
            &["zulu"],
        ),
        (&[("team", "blue")], &[("status.phase", "Running")], &[]),
        (&[], &[("spec.nothing", "x")], &[]),
        (&[], &[("metadata.name", "mike")], &["mike"]),
        (
            &[],
            &[("status.snapshot.agentRef", "team/helper")],
            &["zulu", "mike"],
        ),
        (
            &[],
            &[("status.snapshot.agentRef", "team/other")],
            &["alpha"],
        ),
        (&[], &[("status.snapshot.agentRef", "helper")], &[]),
        (&[], &[("spec.agent", "helper")], &["zulu"]),
        (
            &[("team", "red")],
            &[
                ("status.snapshot.agentRef", "team/helper"),
                ("status.phase", "Running"),
            ],
            &["zulu", "mike"],
        ),
    ];
    // A sparse listing holds the same records with only these paths (and the selector's).
    let paths = [
        "spec.group",
        "status.phase",
        "status.snapshot.agentRef",
        "metadata.labels.team",
        "metadata",
        "spec.nothing",
    ];
    for (labels, fields, expected) in cases {
        let selector = selector(labels, fields);
        assert_eq!(
            names(&store, &project, Kind::AgentRun, &selector).await,
            *expected,
            "list with {selector:?}"
        );
        let full = store
            .list(&project, Kind::AgentRun, &selector)
            .await
            .expect("list");
        let sparse = store
            .list_sparse(&project, Kind::AgentRun, &selector, &paths)
            .await
            .expect("sparse list");
        let wanted = selector.paths_with(&paths);
        let cut: Vec<_> = full
            .iter()
            .map(|r| {
                (
                    r.key.clone(),
                    r.version,
                    nodus_core::store::sparse(&r.document, &wanted),
                )
            })
            .collect();
        let got: Vec<_> = sparse
            .into_iter()
            .map(|r| (r.key, r.version, r.document))
            .collect();
        assert_eq!(got, cut, "sparse list with {selector:?}");
    }
    let narrow = store
        .list_sparse(
            &project,
            Kind::AgentRun,
            &selector(&[], &[("spec.group", "g1")]),
            &["status.phase", "spec.nothing"],
        )
        .await
        .expect("sparse list");
    assert_eq!(
        narrow
            .iter()
            .map(|r| r.document.clone())
            .collect::<Vec<_>>(),
        [
            json!({"spec": {"group": "g1"}, "status": {"phase": "Running"}}),
            json!({"spec": {"group": "g1"}, "status": {"phase": "Succeeded"}}),
        ],
        "only the paths asked for and the selector's; absent paths stay absent"
    );

    // An update changes what matches, not the order.
    let alpha = ObjectKey::new(&project, Kind::AgentRun, "alpha");
    let record = store.get(&alpha).await.expect("get alpha");
    let mut document = record.document;
    document["status"]["phase"] = json!("Running");
    store
        .update(&alpha, record.version, document)
        .await
        .expect("update alpha");
    assert_eq!(
        names(
            &store,
            &project,
            Kind::AgentRun,
            &selector(&[], &[("status.phase", "Running")])
        )
        .await,
        ["zulu", "alpha", "mike"]
    );

    // So does an atomic edit, and a change of group.
    store
        .modify(
            &alpha,
            Box::new(|document| {
                let mut document = document.clone();
                document["status"]["phase"] = json!("Failed");
                document["spec"]["group"] = json!("g2");
                Some(document)
            }),
        )
        .await
        .expect("edit alpha");
    for (fields, expected) in [
        (&[("status.phase", "Failed")][..], &["alpha"][..]),
        (&[("status.phase", "Running")][..], &["zulu", "mike"][..]),
        (&[("spec.group", "g2")][..], &["alpha"][..]),
        (&[("spec.group", "g1")][..], &["zulu"][..]),
    ] {
        assert_eq!(
            names(&store, &project, Kind::AgentRun, &selector(&[], fields)).await,
            expected,
            "after an edit, {fields:?}"
        );
    }

    assert_eq!(
        names(&store, &project, Kind::Agent, &selector(&[], &[])).await,
        ["decoy"]
    );
    assert_eq!(
        names(
            &store,
            &other_project,
            Kind::AgentRun,
            &selector(&[("team", "red")], &[])
        )
        .await,
        ["decoy"]
    );
    assert_eq!(
        names(
            &store,
            &unique("empty"),
            Kind::AgentRun,
            &selector(&[], &[])
        )
        .await,
        Vec::<String>::new()
    );

    // A NUL in a selector (a query parameter `labelSelector=a%00b=c` carries one) matches no
    // stored document, and is no store error: found by nodus-store's
    // fuzz_selectors_list_alike_in_* (SQLite refused the JSON path it cut, Postgres the text).
    for (labels, fields) in [
        (&[("te\0am", "red")][..], &[][..]),
        (&[("team", "r\0ed")][..], &[][..]),
        (&[][..], &[("spec.agent", "\0")][..]),
        (&[][..], &[("status.phase", "Running\0")][..]),
        (&[][..], &[("spec.group", "g1\0")][..]),
        (&[][..], &[("spec.a\0gent", "x")][..]),
    ] {
        let listed = store
            .list(&project, Kind::AgentRun, &selector(labels, fields))
            .await
            .unwrap_or_else(|e| panic!("{labels:?} {fields:?}: {e}"));
        assert!(listed.is_empty(), "{labels:?} {fields:?}");
    }
}
/// Pages of a listing: every size pages through exactly what `list` returns, in creation
/// order, each page at most its limit and `next` present only while more match (also when
/// documents the selector drops follow the last match, or lie between matches: the SQL stores
/// match numbers exactly only after reading). A document created while paging appears once,
/// at the end; one deleted is skipped; the position of a deleted document still continues;
/// a position past everything gives an empty last page.
pub async fn list_pages<S: Store + Clone + 'static>(store: S) {
    let project = unique("pages");
    let empty = store
        .list_page(
            &project,
            Kind::AgentRun,
            &Selector::default(),
            None,
            limit(3),
        )
        .await
        .expect("a page of nothing");
    assert_eq!(
        empty,
        Page {
            records: vec![],
            next: None
        }
    );
    // r0..r9: the even ones of agent `helper`; the odd ones' agent is a number, which a SQL
    // store's pushed-down condition lets through and the exact match drops.
    for n in 0..10 {
        let name = format!("r{n}");
        let mut document = shaped_run(&name, &unique("uid"), &[("team", "red")], None, "Running");
        if n % 2 == 1 {
            document["spec"]["agent"] = json!(n);
        }
        store
            .create(&ObjectKey::new(&project, Kind::AgentRun, &name), document)
            .await
            .expect("create a run");
    }
    // Decoys: another kind in the project, the same kind in another project.
    store
        .create(
            &ObjectKey::new(&project, Kind::Agent, "decoy"),
            agent_document("decoy"),
        )
        .await
        .expect("create an agent");
    store
        .create(
            &ObjectKey::new(unique("pages"), Kind::AgentRun, "decoy"),
            run_document("decoy", &unique("uid")),
        )
        .await
        .expect("create a run in another project");

    let helped = selector(&[], &[("spec.agent", "helper")]);
    for chosen in [Selector::default(), helped.clone()] {
        let all = names(&store, &project, Kind::AgentRun, &chosen).await;
        for size in [1, 2, 3, 4, 9, 10, 11, 1000] {
            let (pages, listed) = page_through(&store, &project, &chosen, size).await;
            assert_eq!(listed, all, "pages of {size} ({chosen:?})");
            let full_pages = all.len().div_ceil(size);
            assert_eq!(pages, full_pages.max(1), "pages of {size} ({chosen:?})");
        }
    }
    // r9 trails r8 (the last of `helper`): the page that ends at r8 says no more.
    let last = store
        .list_page(&project, Kind::AgentRun, &helped, None, limit(5))
        .await
        .expect("every run of `helper` in one page");
    assert_eq!(last.records.len(), 5);
    assert_eq!(last.next, None, "only dropped documents follow");

    // Changes while paging.
    let first = store
        .list_page(
            &project,
            Kind::AgentRun,
            &Selector::default(),
            None,
            limit(3),
        )
        .await
        .expect("the first page");
    let page_names: Vec<&str> = first.records.iter().map(|r| r.key.name.as_str()).collect();
    assert_eq!(page_names, ["r0", "r1", "r2"]);
    let after = first.next.expect("more remain");
    // r2 (the page's last) is changed and then deleted; r3 is deleted; r0 is changed; a new
    // run is created.
    for name in ["r0", "r2"] {
        let key = ObjectKey::new(&project, Kind::AgentRun, name);
        let record = store.get(&key).await.expect("get");
        let mut document = record.document.clone();
        document["metadata"]["labels"]["changed"] = json!("yes");
        store
            .update(&key, record.version, document)
            .await
            .expect("update");
    }
    for name in ["r2", "r3"] {
        store
            .delete(&ObjectKey::new(&project, Kind::AgentRun, name))
            .await
            .expect("delete");
    }
    store
        .create(
            &ObjectKey::new(&project, Kind::AgentRun, "late"),
            run_document("late", &unique("uid")),
        )
        .await
        .expect("create while paging");
    let mut rest = Vec::new();
    let mut position = Some(after);
    while let Some(after) = position {
        let page = store
            .list_page(
                &project,
                Kind::AgentRun,
                &Selector::default(),
                Some(after),
                limit(3),
            )
            .await
            .expect("a later page");
        rest.extend(page.records.into_iter().map(|r| r.key.name));
        position = page.next;
    }
    assert_eq!(rest, ["r4", "r5", "r6", "r7", "r8", "r9", "late"]);

    let past = store
        .list_page(
            &project,
            Kind::AgentRun,
            &Selector::default(),
            Some(Position(u64::MAX)),
            limit(3),
        )
        .await
        .expect("a page past the end");
    assert_eq!(
        past,
        Page {
            records: vec![],
            next: None
        }
    );
}

fn limit(n: usize) -> std::num::NonZeroUsize {
    std::num::NonZeroUsize::new(n).expect("a limit above zero")
}

/// Pages through a listing by `size`: how many pages, and the names in order, each page
/// checked to hold at most `size` and to say more remain exactly when it is not the last.
async fn page_through<S: Store>(
    store: &S,
    project: &str,
    chosen: &Selector,
    size: usize,
) -> (usize, Vec<String>) {
    let mut listed = Vec::new();
    let mut pages = 0;
    let mut after = None;
    loop {
        let page = store
            .list_page(project, Kind::AgentRun, chosen, after, limit(size))
            .await
            .expect("a page");
        pages += 1;
        assert!(page.records.len() <= size, "a page of {size} held more");
        for record in page.records {
            assert_eq!(record.key.project, project);
            assert_eq!(record.key.kind, Kind::AgentRun);
            assert!(chosen.matches(&record.document));
            listed.push(record.key.name);
        }
        match page.next {
            Some(next) => {
                assert!(Some(next) > after, "a page must move on");
                after = Some(next);
            }
            None => return (pages, listed),
        }
    }
}

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

/// Money and large numbers inside documents come back exactly as written: decimal strings
/// digit for digit, integers to `u64::MAX`.
pub async fn money_exact<S: Store + Clone + 'static>(store: S) {
    let project = unique("money");
    let key = ObjectKey::new(&project, Kind::AgentRun, "costly");
    let mut document = run_document("costly", &unique("uid"));
    document["status"]["cost"] = json!({
        "totalUSD": "12345678901.123456789",
        "limitUSD": "0.10",
    });
    document["status"]["turns"] = json!([{ "costUSD": "0.000000001", "inputTokens": u64::MAX }]);
    document["spec"]["maxCostUSD"] = json!("1e3");
    store.create(&key, document.clone()).await.expect("create");
    assert_eq!(
        store.get(&key).await.map(|r| r.document),
        Ok(document.clone())
    );
    let listed = store
        .list(&project, Kind::AgentRun, &Selector::default())
        .await
        .expect("list");
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].document, document);
    assert_eq!(
        listed[0].document["status"]["cost"]["totalUSD"],
        json!("12345678901.123456789")
    );
}

/// Leases: another owner's claim is refused with `Leased` while the lease runs, the holder
/// may claim again and renew; after expiry another owner takes the run over and the old
/// holder's fence can no longer append, complete, renew or release; a released lease is
/// free at once; an expired lease nobody took over can still be renewed.
pub async fn leases<S: Store + Clone + 'static>(store: S) {
    let uid = unique("run");
    let a1 = store
        .claim(&uid, &lease(OWNER_A, 0))
        .await
        .expect("a claims");
    store
        .append_step(&uid, a1, &step(0, Intent::Route { turn: 0 }))
        .await
        .expect("a appends");

    // B is refused while A's lease (30 s from 0) runs.
    for at in [0, 10, 29] {
        assert_eq!(
            store.claim(&uid, &lease(OWNER_B, at)).await,
            Err(Error::Leased {
                run: uid.clone(),
                owner: OWNER_A.to_string(),
                until: time(30),
            }),
            "b claims at {at}"
        );
    }
    // A claims again: a new fence; its first is stale.
    let a2 = store
        .claim(&uid, &lease(OWNER_A, 10))
        .await
        .expect("a again");
    assert_ne!(a1, a2);
    assert_eq!(
        store
            .append_step(&uid, a1, &step(1, Intent::Answer { turn: 0 }))
            .await,
        Err(Error::Fenced { run: uid.clone() })
    );
    // A renews at 20: its lease now runs to 50.
    store
        .renew(&uid, a2, &lease(OWNER_A, 20))
        .await
        .expect("a renews");
    assert_eq!(
        store.claim(&uid, &lease(OWNER_B, 45)).await,
        Err(Error::Leased {
            run: uid.clone(),
            owner: OWNER_A.to_string(),
            until: time(50),
        })
    );

    // At 50 it has expired: B takes the run over.
    let b1 = store
        .claim(&uid, &lease(OWNER_B, 50))
        .await
        .expect("b takes over after expiry");
    assert_ne!(b1, a2);
    let fenced = Err(Error::Fenced { run: uid.clone() });
    assert_eq!(
        store
            .append_step(&uid, a2, &step(1, Intent::Answer { turn: 0 }))
            .await,
        fenced
    );
    assert_eq!(
        store
            .complete_step(&uid, a2, 0, &completion(0, Outcome::Answered))
            .await,
        fenced
    );
    assert_eq!(store.renew(&uid, a2, &lease(OWNER_A, 51)).await, fenced);
    assert_eq!(store.release(&uid, a2).await, fenced);
    assert_eq!(
        store.journal(&uid).await,
        Ok(vec![step(0, Intent::Route { turn: 0 })]),
        "the fenced writer changed nothing"
    );
    assert_eq!(
        store.claim(&uid, &lease(OWNER_A, 60)).await,
        Err(Error::Leased {
            run: uid.clone(),
            owner: OWNER_B.to_string(),
            until: time(80),
        }),
        "now A is refused"
    );
    store
        .complete_step(&uid, b1, 0, &completion(0, Outcome::Answered))
        .await
        .expect("b completes the open step");

    // B releases: A may claim at once, and B's fence is stale after that.
    store.release(&uid, b1).await.expect("b releases");
    let a3 = store
        .claim(&uid, &lease(OWNER_A, 61))
        .await
        .expect("a claims a released run");
    assert_eq!(
        store
            .append_step(&uid, b1, &step(1, Intent::Answer { turn: 0 }))
            .await,
        fenced
    );
    store
        .append_step(&uid, a3, &step(1, Intent::Answer { turn: 0 }))
        .await
        .expect("a appends after its claim");

    // A's lease (to 91) expired and nobody took over: A may still renew, then B waits.
    store
        .renew(&uid, a3, &lease(OWNER_A, 200))
        .await
        .expect("renew after expiry, nobody took over");
    assert_eq!(
        store.claim(&uid, &lease(OWNER_B, 201)).await,
        Err(Error::Leased {
            run: uid.clone(),
            owner: OWNER_A.to_string(),
            until: time(230),
        })
    );
    assert_eq!(store.journal(&uid).await.map(|j| j.len()), Ok(2));

    // A run nobody claimed cannot be renewed or released.
    let unclaimed = unique("run");
    assert_eq!(
        store.renew(&unclaimed, a3, &lease(OWNER_A, 0)).await,
        Err(Error::Fenced {
            run: unclaimed.clone()
        })
    );
    assert_eq!(
        store.release(&unclaimed, a3).await,
        Err(Error::Fenced { run: unclaimed })
    );
}

/// Several replicas race to claim the same runs at the same time: every run is claimed by
/// exactly one replica (the others are refused with `Leased`), and each replica's fence
/// writes its runs' journals.
pub async fn replicas_racing<S: Store + Clone + 'static>(store: S) {
    const RUNS: usize = 40;
    const REPLICAS: usize = 4;
    let project = unique("racing");
    let mut runs = Vec::with_capacity(RUNS);
    for i in 0..RUNS {
        let name = format!("run-{i:02}");
        let uid = unique("uid");
        store
            .create(
                &ObjectKey::new(&project, Kind::AgentRun, &name),
                run_document(&name, &uid),
            )
            .await
            .expect("create");
        runs.push(uid);
    }
    let runs = Arc::new(runs);
    let barrier = Arc::new(tokio::sync::Barrier::new(REPLICAS));
    let mut tasks = Vec::with_capacity(REPLICAS);
    for replica in 0..REPLICAS {
        let store = store.clone();
        let runs = Arc::clone(&runs);
        let barrier = Arc::clone(&barrier);
        tasks.push(tokio::spawn(async move {
            let owner = format!("replica-{replica}");
            barrier.wait().await;
            let mut mine = Vec::new();
            // Each replica starts at another run, so that claims of one run collide.
            for i in 0..RUNS {
                let uid = &runs[(i + replica * 7) % RUNS];
                let fence = match store.claim(uid, &lease(&owner, 0)).await {
                    Ok(fence) => fence,
                    Err(Error::Leased { .. }) => continue,
                    Err(other) => panic!("claiming {uid}: {other}"),
                };
                store
                    .append_step(uid, fence, &step(0, Intent::Route { turn: 0 }))
                    .await
                    .expect("the claimer writes its run's journal");
                mine.push(uid.clone());
                tokio::task::yield_now().await;
            }
            mine
        }));
    }
    let mut claimed_by = BTreeMap::new();
    for (replica, mine) in join_all(tasks).await.into_iter().enumerate() {
        for uid in mine {
            if let Some(earlier) = claimed_by.insert(uid.clone(), replica) {
                panic!("{uid} was claimed by replica {earlier} and replica {replica}");
            }
        }
    }
    assert_eq!(claimed_by.len(), RUNS, "every run is claimed");
    for uid in runs.iter() {
        assert_eq!(
            store.journal(uid).await.map(|j| j.len()),
            Ok(1),
            "one writer per run"
        );
    }
}

/// Retention ([`nodus_core::retention::sweep`] over this store's `rewrite_run`): the payloads
/// of runs that ended before the cut-off are removed (input, answer preview, messages' text,
/// steps' contents, the kept working directory, the egress log) and the run says so in
/// `status.payloadsRemovedAt`; costs, tokens and the journal's shape stay; runs that ended later or have not ended keep everything; a second
/// sweep does nothing.
pub async fn retention<S: Store + Clone + 'static>(store: S) {
    use nodus_core::Usd;
    use nodus_core::cost::Usage;
    use nodus_core::model::{ContentBlock, ModelResponse, StopReason};
    use nodus_core::output::Output;
    use nodus_core::sandbox::ExecOutput;

    let project = unique("retention");
    let key = |name: &str| ObjectKey::new(&project, Kind::AgentRun, name);
    let day = 86_400;
    let now = time(40 * day);
    let cutoff = time(10 * day);

    let mut runs = BTreeMap::new();
    for (name, ended) in [
        ("old", Some(2 * day)),
        ("recent", Some(20 * day)),
        ("running", None),
    ] {
        let uid = unique("uid");
        let mut document = run_document(name, &uid);
        document["spec"]["input"] = json!("secret input");
        document["status"]["cost"] = json!({ "totalUSD": "0.123456789" });
        document["status"]["answer"] = json!({ "preview": "the answer", "bytes": 10 });
        if let Some(ended) = ended {
            document["status"]["phase"] = json!("Succeeded");
            document["status"]["completionTime"] = json!(time(ended).to_string());
        }
        store
            .create(&key(name), document.clone())
            .await
            .expect("create");
        store
            .post_message(&key(name), 1, Some("k"), "private message", time(1))
            .await
            .expect("post");
        let fence = store.claim(&uid, &lease(OWNER_A, 0)).await.expect("claim");
        let steps = [
            (
                Intent::Command {
                    turn: 0,
                    tool_use_id: "t1".to_string(),
                    command: "cat secrets".to_string(),
                },
                Outcome::CommandFinished {
                    output: ExecOutput {
                        exit_code: Some(3),
                        stdout: Output::complete(b"top secret".to_vec()),
                        stderr: Output::complete(b"warning".to_vec()),
                        timed_out: false,
                        stopped: None,
                    },
                    remade_sandbox: None,
                },
            ),
            (
                Intent::CallModel {
                    turn: 0,
                    model: "m-1".to_string(),
                    reserved_usd: Usd::from_nanos(5),
                    tools: true,
                },
                Outcome::ModelReplied {
                    response: ModelResponse {
                        model: "m-1".to_string(),
                        content: vec![ContentBlock::Text {
                            text: "private reply".to_string(),
                        }],
                        stop_reason: StopReason::EndTurn,
                        usage: Usage {
                            input_tokens: 11,
                            output_tokens: 7,
                            cache_write_tokens: 0,
                            cache_read_tokens: 0,
                        },
                        request_id: None,
                    },
                    cost_usd: Usd::from_nanos(123_456_789),
                },
            ),
        ];
        for (seq, (intent, outcome)) in steps.into_iter().enumerate() {
            let seq = u32::try_from(seq).expect("a small seq");
            store
                .append_step(&uid, fence, &step(seq, intent))
                .await
                .expect("append");
            store
                .complete_step(&uid, fence, seq, &completion(seq, outcome))
                .await
                .expect("complete");
        }
        // A kept final working directory, which is a payload too.
        store
            .create(
                &nodus_core::engine::workdir_archive_key(&key(name)),
                json!({ "bytes": 3, "archiveBase64": "AAAA" }),
            )
            .await
            .expect("an archive");
        // Its egress log, in more than one document.
        let mut connections = nodus_core::egress_log::EgressLog::default();
        for n in 0..=nodus_core::egress_log::chunks::CHUNK_RECORDS {
            connections.push(egress_record(n), nodus_core::egress_log::MAX_RECORDS_KEPT);
        }
        nodus_core::egress_log::chunks::append(&store, &uid, &connections)
            .await
            .expect("an egress log");
        runs.insert(name, (uid, store.get(&key(name)).await.expect("get")));
    }
    let before = |name: &str| runs[name].clone();
    let archive_of = |name: &str| nodus_core::engine::workdir_archive_key(&key(name));
    // Runs created in an idempotent batch: the copies the store keeps to answer a repeat are
    // swept with the runs.
    let batch: Vec<(ObjectKey, Value)> = [("batched-old", Some(3 * day)), ("batched-new", None)]
        .into_iter()
        .map(|(name, ended)| {
            let mut document = run_document(name, &unique("uid"));
            document["spec"]["input"] = json!("secret input");
            if let Some(ended) = ended {
                document["status"]["phase"] = json!("Succeeded");
                document["status"]["completionTime"] = json!(time(ended).to_string());
            }
            (key(name), document)
        })
        .collect();
    store
        .create_batch(batch.clone(), Some("kept"))
        .await
        .expect("batch");

    let projects = [project.clone()];
    let swept = nodus_core::retention::sweep(&store, &projects, cutoff, now)
        .await
        .expect("sweep");
    let ours: Vec<_> = swept
        .runs
        .iter()
        .filter(|k| k.project == project)
        .cloned()
        .collect();
    assert_eq!(
        ours,
        [key("old"), key("batched-old")],
        "only the runs that ended before the cut-off"
    );
    let repeat = store
        .create_batch(batch, Some("kept"))
        .await
        .expect("the batch, repeated");
    let input = |name: &str| {
        let record = repeat
            .iter()
            .find(|r| r.key == key(name))
            .expect("in the batch");
        record.document["spec"].get("input").cloned()
    };
    assert_eq!(input("batched-old"), None, "the kept copy is swept too");
    assert_eq!(input("batched-new"), Some(json!("secret input")));

    let (old_uid, old_before) = before("old");
    let old = store.get(&key("old")).await.expect("get old");
    assert_eq!(
        old.version,
        old_before.version + 1,
        "the sweep is one write"
    );
    assert_eq!(
        old.document["status"]["payloadsRemovedAt"],
        json!(now.to_string())
    );
    assert!(
        old.document["spec"].get("input").is_none(),
        "the input is gone"
    );
    assert_eq!(old.document["status"]["answer"]["preview"], json!(""));
    assert_eq!(old.document["status"]["answer"]["bytes"], json!(10));
    assert_eq!(
        old.document["status"]["cost"]["totalUSD"],
        json!("0.123456789"),
        "money stays, exactly"
    );
    assert_eq!(old.document["metadata"], old_before.document["metadata"]);
    let inbox = store.inbox(&old_uid).await.expect("inbox");
    assert_eq!(inbox.len(), 1);
    assert_eq!(inbox[0].payload, "", "the message's text is gone");
    assert_eq!(
        (inbox[0].seq, inbox[0].key.as_deref(), inbox[0].received_at),
        (1, Some("k"), time(1))
    );
    let journal = store.journal(&old_uid).await.expect("journal");
    assert_eq!(journal.len(), 2, "the journal keeps its steps");
    match (&journal[0].intent, journal[0].outcome()) {
        (Intent::Command { command, .. }, Some(Outcome::CommandFinished { output, .. })) => {
            assert_eq!(command, "");
            assert!(output.stdout.bytes.is_empty() && output.stderr.bytes.is_empty());
            assert_eq!(output.exit_code, Some(3));
        }
        other => panic!("step 0 after the sweep: {other:?}"),
    }
    match journal[1].outcome() {
        Some(Outcome::ModelReplied { response, cost_usd }) => {
            assert_eq!(response.text(), "");
            assert_eq!(response.usage.output_tokens, 7);
            assert_eq!(*cost_usd, Usd::from_nanos(123_456_789));
        }
        other => panic!("step 1 after the sweep: {other:?}"),
    }
    assert_eq!(
        journal[1].started_at,
        step(1, Intent::Route { turn: 0 }).started_at
    );

    assert!(
        matches!(store.get(&archive_of("old")).await, Err(Error::NotFound(_))),
        "the swept run's kept working directory is gone"
    );
    assert_eq!(
        nodus_core::egress_log::stored_keys(&store, &old_uid).await,
        Ok(Vec::new()),
        "the swept run's egress log is gone"
    );
    let chunk = nodus_core::egress_log::chunks::chunk_key(&old_uid, 1);
    assert!(
        matches!(store.get(&chunk).await, Err(Error::NotFound(_))),
        "with its chunks"
    );
    for name in ["recent", "running"] {
        assert!(
            store.get(&archive_of(name)).await.is_ok(),
            "{name} keeps its archive"
        );
        let (uid, record) = before(name);
        assert_eq!(
            store.get(&key(name)).await,
            Ok(record),
            "{name} keeps its document"
        );
        assert_eq!(
            store.inbox(&uid).await.map(|m| m[0].payload.clone()),
            Ok("private message".to_string())
        );
        let journal = store.journal(&uid).await.expect("journal");
        assert!(
            matches!(&journal[0].intent, Intent::Command { command, .. } if command == "cat secrets"),
            "{name} keeps its steps"
        );
        let egress = nodus_core::egress_log::read(&store, &uid).await;
        assert_eq!(
            egress.map(|log| log.records.len()),
            Ok(nodus_core::egress_log::chunks::CHUNK_RECORDS + 1),
            "{name} keeps its egress log"
        );
    }

    let again = nodus_core::retention::sweep(&store, &projects, cutoff, time(41 * day))
        .await
        .expect("sweep again");
    assert!(
        !again.runs.iter().any(|k| k.project == project),
        "a swept run is not swept again"
    );
    assert_eq!(store.get(&key("old")).await, Ok(old));
}

/// The record of egress connection `n`.
fn egress_record(n: usize) -> nodus_core::egress::EgressRecord {
    nodus_core::egress::EgressRecord {
        time: "2026-12-01T00:00:00Z".to_string(),
        host: format!("host-{n}.test"),
        port: 443,
        address: Some("192.0.2.1".to_string()),
        verdict: "allowed".to_string(),
        rule: "spec.network.allow[0]".to_string(),
        bytes_out: 1,
        bytes_in: 2,
        duration_ms: 3,
    }
}

/// `rewrite_run` applies its edits to the run document (one version up), the copies of it
/// kept for an idempotent batch, every step and every message of that run only, and deletes
/// the documents it names, in one write announced as such; a stale version, a run among the
/// deletions or a missing run is refused and changes nothing.
pub async fn rewrite_run<S: Store + Clone + 'static>(store: S) {
    let project = unique("rewrite");
    let key = |name: &str| ObjectKey::new(&project, Kind::AgentRun, name);
    let archive = ObjectKey::new(&project, Kind::WorkdirArchive, "target");
    let (uid, other_uid) = (unique("uid"), unique("uid"));
    let batch = vec![
        (key("target"), run_document("target", &uid)),
        (key("bystander"), run_document("bystander", &other_uid)),
    ];
    let batch_key = unique("batch");
    store
        .create_batch(batch.clone(), Some(&batch_key))
        .await
        .expect("batch");
    store
        .create(&archive, json!({ "bytes": 3, "archiveBase64": "AAAA" }))
        .await
        .expect("archive");
    for run in [&uid, &other_uid] {
        let fence = store.claim(run, &lease(OWNER_A, 0)).await.expect("claim");
        for seq in 0..2 {
            let command = Intent::Command {
                turn: 0,
                tool_use_id: format!("t{seq}"),
                command: format!("echo {seq}"),
            };
            store
                .append_step(run, fence, &step(seq, command))
                .await
                .expect("append");
        }
    }
    for (i, text) in ["first", "second"].into_iter().enumerate() {
        let version = store.get(&key("target")).await.expect("get").version;
        store
            .post_message(
                &key("target"),
                version,
                None,
                text,
                time(i64::try_from(i).expect("small")),
            )
            .await
            .expect("post");
    }
    let edit = |run: ObjectKey, expected_version: u64, delete: Vec<ObjectKey>| RunRewrite {
        run,
        expected_version,
        document: Box::new(|document| document["spec"]["input"] = json!("edited")),
        step: Box::new(|step| {
            if let Intent::Command { command, .. } = &mut step.intent {
                command.push_str(" (edited)");
            }
        }),
        message: Box::new(|message| message.payload.push_str(" (edited)")),
        delete,
    };
    let before = store.get(&key("target")).await.expect("get");
    let journal_before = store.journal(&uid).await.expect("journal");
    let inbox_before = store.inbox(&uid).await.expect("inbox");
    let unchanged = || async {
        assert_eq!(store.get(&key("target")).await.as_ref(), Ok(&before));
        assert_eq!(store.journal(&uid).await.as_ref(), Ok(&journal_before));
        assert_eq!(store.inbox(&uid).await.as_ref(), Ok(&inbox_before));
        assert!(
            store.get(&archive).await.is_ok(),
            "the archive is still there"
        );
    };

    let stale = store
        .rewrite_run(edit(
            key("target"),
            before.version - 1,
            vec![archive.clone()],
        ))
        .await;
    assert!(
        matches!(stale, Err(Error::Conflict { expected, actual, .. })
            if expected == before.version - 1 && actual == before.version),
        "{stale:?}"
    );
    unchanged().await;
    let deleting_a_run = store
        .rewrite_run(edit(key("target"), before.version, vec![key("bystander")]))
        .await;
    assert!(
        matches!(deleting_a_run, Err(Error::Invalid(_))),
        "{deleting_a_run:?}"
    );
    unchanged().await;
    assert!(store.get(&key("bystander")).await.is_ok());
    assert!(matches!(
        store.rewrite_run(edit(key("missing"), 1, Vec::new())).await,
        Err(Error::NotFound(_))
    ));

    let mut changes = store.subscribe();
    let missing = ObjectKey::new(&project, Kind::WorkdirArchive, "never-made");
    let written = store
        .rewrite_run(edit(
            key("target"),
            before.version,
            vec![archive.clone(), missing],
        ))
        .await
        .expect("rewrite");
    assert_eq!(written.version, before.version + 1, "one write");
    assert_eq!(written.document["spec"]["input"], json!("edited"));
    assert_eq!(written.document["metadata"], before.document["metadata"]);
    assert_eq!(store.get(&key("target")).await, Ok(written.clone()));
    assert_eq!(
        next_change(&mut changes, &project).await,
        Change::Written(key("target"), written.version)
    );
    assert_eq!(
        next_change(&mut changes, &project).await,
        Change::Deleted(archive.clone())
    );
    assert!(matches!(store.get(&archive).await, Err(Error::NotFound(_))));
    let commands = |journal: Vec<Step>| -> Vec<String> {
        journal
            .into_iter()
            .map(|step| match step.intent {
                Intent::Command { command, .. } => command,
                other => panic!("a command step, not {other:?}"),
            })
            .collect()
    };
    assert_eq!(
        commands(store.journal(&uid).await.expect("journal")),
        ["echo 0 (edited)", "echo 1 (edited)"]
    );
    assert_eq!(
        commands(store.journal(&other_uid).await.expect("journal")),
        ["echo 0", "echo 1"],
        "another run's journal is untouched"
    );
    let inbox = store.inbox(&uid).await.expect("inbox");
    assert_eq!(
        inbox,
        vec![
            message(1, None, "first (edited)", time(0)),
            message(2, None, "second (edited)", time(1)),
        ]
    );
    let repeat = store
        .create_batch(batch, Some(&batch_key))
        .await
        .expect("the batch, repeated");
    assert_eq!(
        repeat[0].document["spec"]["input"],
        json!("edited"),
        "the kept copy"
    );
    assert_eq!(
        repeat[0].version, 1,
        "the copy is the first call's record, edited"
    );
    assert_eq!(
        repeat[1].document["spec"]["input"],
        json!("say hello to bystander"),
        "another run's copy is untouched"
    );
}

// --- helpers ---

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

/// Lease owners: replicas of a test.
const OWNER_A: &str = "replica-a";
const OWNER_B: &str = "replica-b";

/// A fixed instant plus `second`s: leases use the caller's clock, so cases control it.
fn time(second: i64) -> Timestamp {
    Timestamp::from_second(1_700_000_000 + second).expect("a timestamp")
}

/// A 30-second lease for `owner` asked for at `time(at)`.
fn lease(owner: &str, at: i64) -> Lease {
    Lease::new(owner, time(at), Duration::from_secs(30))
}

/// A name no other case, call or process uses: `prefix-<pid>-<time>-<counter>`.
fn unique(prefix: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() % 1_000_000_000_000);
    format!(
        "{prefix}-{}-{nanos}-{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

/// An AgentRun document as the server would store it.
fn run_document(name: &str, uid: &str) -> Value {
    shaped_run(name, uid, &[("app", "conformance")], None, "Pending")
}

fn shaped_run(
    name: &str,
    uid: &str,
    labels: &[(&str, &str)],
    group: Option<&str>,
    phase: &str,
) -> Value {
    let labels: serde_json::Map<String, Value> = labels
        .iter()
        .map(|(k, v)| (k.to_string(), json!(v)))
        .collect();
    let mut spec = json!({
        "agent": "helper",
        "input": format!("say hello to {name}"),
        "keepAlive": false,
    });
    if let Some(group) = group {
        spec["group"] = json!(group);
    }
    json!({
        "apiVersion": "nodus.dev/v1",
        "kind": "AgentRun",
        "metadata": {
            "name": name,
            "uid": uid,
            "labels": labels,
            "creationTimestamp": "2024-01-01T00:00:00Z",
        },
        "spec": spec,
        "status": { "phase": phase },
    })
}

fn agent_document(name: &str) -> Value {
    json!({
        "apiVersion": "nodus.dev/v1",
        "kind": "Agent",
        "metadata": { "name": name, "uid": unique("uid"), "labels": { "team": "red" } },
        "spec": { "systemPrompt": "You help.", "model": { "access": "platform" } },
        "status": { "state": "Ready" },
    })
}

fn selector(labels: &[(&str, &str)], fields: &[(&str, &str)]) -> Selector {
    let map = |pairs: &[(&str, &str)]| {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    Selector {
        labels: map(labels),
        fields: map(fields),
    }
}

/// The names `list` returns, in order, checked against each document's `metadata.name`.
async fn names<S: Store>(store: &S, project: &str, kind: Kind, selector: &Selector) -> Vec<String> {
    let records = store.list(project, kind, selector).await.expect("list");
    records
        .into_iter()
        .map(|record| {
            assert_eq!(record.key.project, project);
            assert_eq!(record.key.kind, kind);
            assert_eq!(record.document["metadata"]["name"], json!(record.key.name));
            record.key.name
        })
        .collect()
}

fn step(seq: u32, intent: Intent) -> Step {
    Step {
        seq,
        started_at: Timestamp::from_second(1_700_000_000 + i64::from(seq)).expect("a timestamp"),
        intent,
        completion: None,
    }
}

fn completion(seq: u32, outcome: Outcome) -> Completion {
    Completion {
        finished_at: Timestamp::from_second(1_700_000_500 + i64::from(seq)).expect("a timestamp"),
        outcome,
    }
}

fn message(seq: u64, key: Option<&str>, payload: &str, at: Timestamp) -> InboxMessage {
    InboxMessage {
        seq,
        key: key.map(str::to_string),
        payload: payload.to_string(),
        received_at: at,
    }
}

/// The next change about `project`, skipping other projects' (a shared database); fails if
/// none arrives in time or if the subscriber fell behind.
async fn next_change(changes: &mut broadcast::Receiver<Change>, project: &str) -> Change {
    within("a change notification", async {
        loop {
            match changes.recv().await {
                Ok(Change::Written(key, version)) if key.project == project => {
                    return Change::Written(key, version);
                }
                Ok(Change::Deleted(key)) if key.project == project => {
                    return Change::Deleted(key);
                }
                Ok(_) => {}
                Err(e) => panic!("change subscription failed: {e}"),
            }
        }
    })
    .await
}

/// Every task's result, in order; a panic in a task fails the case.
async fn join_all<T: Send + 'static>(tasks: Vec<tokio::task::JoinHandle<T>>) -> Vec<T> {
    within("racing tasks", async {
        let mut results = Vec::with_capacity(tasks.len());
        for task in tasks {
            match task.await {
                Ok(result) => results.push(result),
                Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
                Err(e) => panic!("task failed: {e}"),
            }
        }
        results
    })
    .await
}

async fn within<T>(what: &str, future: impl Future<Output = T>) -> T {
    match tokio::time::timeout(PATIENCE, future).await {
        Ok(value) => value,
        Err(_) => panic!("waited {PATIENCE:?} for {what}"),
    }
}

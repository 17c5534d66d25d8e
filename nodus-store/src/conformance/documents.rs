//! Conformance of documents: create, read, list, update and delete; listing by selector and
//! by pages, and sparsely knowing the last listing; group phase counts; exact money and
//! large numbers.

use std::collections::HashMap;

use nodus_core::Store;
use nodus_core::resource::Kind;
use nodus_core::store::{Error, ObjectKey, Page, Position, Seen, Selector, Sparse};
use serde_json::json;

use super::{agent_document, names, run_document, selector, shaped_run, unique};

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

/// A sparse listing for a caller that kept the last one: a document at the place and version
/// it knows comes back by name alone; one written since, one new, one it knows at another
/// version or another place, and one deleted and created again under its name (at version 1
/// again) come back read; one deleted does not come back; all in creation order, and only
/// the selector's documents.
pub async fn list_sparse_known<S: Store + Clone + 'static>(store: S) {
    let project = unique("known");
    let create = |name: &str, group: &str, phase: &str| {
        let store = store.clone();
        let key = ObjectKey::new(&project, Kind::AgentRun, name);
        let document = shaped_run(name, &unique("uid"), &[], Some(group), phase);
        async move { store.create(&key, document).await.expect("create a run") }
    };
    for (name, phase) in [("r1", "Running"), ("r2", "Pending"), ("r3", "Running")] {
        create(name, "g", phase).await;
    }
    create("other", "h", "Running").await;
    create("r4", "g", "Pending").await;
    create("r6", "g", "Pending").await;
    let selector = Selector::in_group("g");
    let paths = ["status.phase"];
    let list = |known: HashMap<String, Seen>| {
        let store = store.clone();
        let (project, selector) = (project.clone(), selector.clone());
        async move {
            store
                .list_sparse_known(&project, Kind::AgentRun, &selector, &paths, &known)
                .await
                .expect("list sparse, knowing some")
        }
    };
    let shown = |listed: &[Sparse]| -> Vec<String> {
        listed
            .iter()
            .map(|sparse| match sparse {
                Sparse::Known(name) => format!("{name} known"),
                Sparse::Read { record, .. } => format!(
                    "{} v{} {}",
                    record.key.name, record.version, record.document["status"]["phase"]
                ),
            })
            .collect()
    };

    // Knowing nothing: every document of the group read, as list_sparse reads it, each at
    // its own place in creation order.
    let first = list(HashMap::new()).await;
    let sparse = store
        .list_sparse(&project, Kind::AgentRun, &selector, &paths)
        .await
        .expect("list sparse");
    let mut seen = HashMap::new();
    let mut records = Vec::new();
    for listed in &first {
        let Sparse::Read { at, record } = listed else {
            panic!("nothing known, yet {listed:?} came back known");
        };
        let version = record.version;
        seen.insert(record.key.name.clone(), Seen { at: *at, version });
        records.push(record.clone());
    }
    assert_eq!(records, sparse, "nothing known: list_sparse's answer");
    let mut places: Vec<Position> = seen.values().map(|seen| seen.at).collect();
    places.sort();
    places.dedup();
    assert_eq!(
        places.len(),
        5,
        "each document at a place of its own: {seen:?}"
    );

    // Knowing every one at its place and version: names alone.
    assert_eq!(
        shown(&list(seen.clone()).await),
        ["r1 known", "r2 known", "r3 known", "r4 known", "r6 known"]
    );

    // r2 written; r3 deleted; r6 deleted and created again (version 1 both times); r5
    // created; r4 known at a version it never had, r1 at a place it never had; and a name
    // of another group (and one of no document) known: only the changed, the new, the
    // created again and the mis-known are read.
    let r2 = ObjectKey::new(&project, Kind::AgentRun, "r2");
    let mut moved = store.get(&r2).await.expect("get r2");
    moved.document["status"]["phase"] = json!("Running");
    store
        .update(&r2, moved.version, moved.document)
        .await
        .expect("update r2");
    store
        .delete(&ObjectKey::new(&project, Kind::AgentRun, "r3"))
        .await
        .expect("delete r3");
    let r6 = ObjectKey::new(&project, Kind::AgentRun, "r6");
    store.delete(&r6).await.expect("delete r6");
    create("r6", "g", "Running").await;
    assert_eq!(seen["r6"].version, 1, "r6 was read at version 1");
    create("r5", "g", "Pending").await;
    let mut known = seen.clone();
    let shifted = |seen: Seen, at: u64, version: u64| Seen {
        at: Position(seen.at.0 + at),
        version: seen.version + version,
    };
    known.insert("r4".to_string(), shifted(seen["r4"], 0, 7));
    let r1_elsewhere = shifted(seen["r1"], 1000, 0);
    known.insert("r1".to_string(), r1_elsewhere);
    known.insert("other".to_string(), shifted(seen["r1"], 0, 0));
    known.insert("nobody".to_string(), shifted(seen["r1"], 0, 0));
    let v2 = seen["r2"].version + 1;
    let v4 = seen["r4"].version;
    let relisted = list(known).await;
    assert_eq!(
        shown(&relisted),
        [
            "r1 v1 \"Running\"".to_string(),
            format!("r2 v{v2} \"Running\""),
            format!("r4 v{v4} \"Pending\""),
            "r6 v1 \"Running\"".to_string(),
            "r5 v1 \"Pending\"".to_string(),
        ]
    );
    // Each read at its own place: r1 where it always was, r6 created again somewhere new.
    let at = |name: &str| {
        relisted.iter().find_map(|sparse| match sparse {
            Sparse::Read { at, record } if record.key.name == name => Some(*at),
            _ => None,
        })
    };
    assert_eq!(at("r1"), Some(seen["r1"].at), "r1 has not moved");
    assert!(
        at("r6").is_some_and(|at| at > seen["r6"].at),
        "r6 created again is at a later place than the r6 read: {:?} after {:?}",
        at("r6"),
        seen["r6"].at
    );
}

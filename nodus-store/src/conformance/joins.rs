//! Conformance of batches that join groups ([`Store::create_batch_within`]): each keeps its
//! groups' caps on unfinished runs, and none joins a group that is gone or takes no runs.

use nodus_core::Store;
use nodus_core::resource::Kind;
use nodus_core::store::{Error, MemberCap, ObjectKey};
use serde_json::{Value, json};

use super::{join_all, unique};

/// An AgentGroup document as the server would store it: `sealed` or not, and its phase
/// (none: not reconciled yet).
fn group_document(name: &str, sealed: bool, phase: Option<&str>) -> Value {
    let mut document = json!({
        "apiVersion": "nodus.dev/v1",
        "kind": "AgentGroup",
        "metadata": { "name": name, "uid": unique("uid") },
        "spec": { "agent": "helper", "sealed": sealed },
        "status": {},
    });
    if let Some(phase) = phase {
        document["status"]["phase"] = json!(phase);
    }
    document
}

/// Store group `name` of `project`, open to runs.
async fn open_group<S: Store>(store: &S, project: &str, name: &str) {
    store
        .create(
            &ObjectKey::new(project, Kind::AgentGroup, name),
            group_document(name, false, None),
        )
        .await
        .expect("the group");
}

/// Batches into a group with a cap on its unfinished runs ([`Store::create_batch_within`]):
/// one that keeps it is written; one that would break it is refused with `OverCap` naming the
/// count it would have made, and nothing of it is written; finished runs, runs of another
/// group or project and other kinds do not count; a repeat of an idempotent batch is answered
/// without checking again; batches racing into one group never pass it together.
pub async fn capped_batches<S: Store + Clone + 'static>(store: S) {
    let project = unique("capped");
    let run = |name: &str| ObjectKey::new(&project, Kind::AgentRun, name);
    let member = |name: &str, group: &str, phase: &str| {
        (
            run(name),
            super::shaped_run(name, &unique("uid"), &[], Some(group), phase),
        )
    };
    let cap = |group: &str, at_most: u64| MemberCap {
        project: project.clone(),
        group: group.to_string(),
        at_most,
    };
    for name in ["g", "h"] {
        open_group(&store, &project, name).await;
    }
    store
        .create_batch(
            vec![member("a", "g", "Running"), member("b", "g", "Succeeded")],
            None,
        )
        .await
        .expect("the group's first runs");
    // Decoys that do not count: another group's run, the group's name in another project.
    store
        .create(&run("h1"), member("h1", "h", "Running").1)
        .await
        .expect("another group's run");
    let elsewhere = unique("capped");
    store
        .create(
            &ObjectKey::new(&elsewhere, Kind::AgentRun, "z"),
            super::shaped_run("z", &unique("uid"), &[], Some("g"), "Running"),
        )
        .await
        .expect("a run of another project");

    // Up to the cap: a, c and d unfinished (b succeeded).
    let written = store
        .create_batch_within(
            vec![member("c", "g", "Pending"), member("d", "g", "Pending")],
            None,
            &[cap("g", 3)],
        )
        .await
        .expect("a batch that keeps the cap");
    let written: Vec<&str> = written.iter().map(|r| r.key.name.as_str()).collect();
    assert_eq!(written, ["c", "d"]);
    // One more would make four.
    assert_eq!(
        store
            .create_batch_within(vec![member("e", "g", "Pending")], None, &[cap("g", 3)])
            .await,
        Err(Error::OverCap {
            project: project.clone(),
            group: "g".to_string(),
            at_most: 3,
            unfinished: 4,
        })
    );
    assert!(
        matches!(store.get(&run("e")).await, Err(Error::NotFound(_))),
        "nothing of a refused batch is written"
    );
    assert_eq!(
        store.group_phases(&project, "g").await.expect("phases"),
        vec![
            (Some("Pending".to_string()), 2),
            (Some("Running".to_string()), 1),
            (Some("Succeeded".to_string()), 1),
        ],
        "the counters are as before the refused batch"
    );
    // A cap on another group is kept by a batch into this one.
    store
        .create_batch_within(vec![member("h2", "h", "Pending")], None, &[cap("h", 2)])
        .await
        .expect("the other group has room for one more");
    // Once a run finishes, there is room again.
    let a = store.get(&run("a")).await.expect("a");
    let mut finished = a.document.clone();
    finished["status"]["phase"] = json!("Failed");
    store
        .update(&run("a"), a.version, finished)
        .await
        .expect("a finishes");
    let key = unique("batch");
    let first = store
        .create_batch_within(
            vec![member("e", "g", "Pending")],
            Some(&key),
            &[cap("g", 3)],
        )
        .await
        .expect("room for e");
    // Its repeat (now over any cap) is answered with the first call's records.
    assert_eq!(
        store
            .create_batch_within(
                vec![member("e", "g", "Pending")],
                Some(&key),
                &[cap("g", 0)]
            )
            .await,
        Ok(first),
        "a repeat is not checked again"
    );

    // Racing: eight batches of one run each into a group capped at three.
    let racing = unique("race");
    open_group(&store, &project, &racing).await;
    let tasks = (0..8).map(|i| {
        let store = store.clone();
        let (project, racing) = (project.clone(), racing.clone());
        tokio::spawn(async move {
            let name = format!("{racing}-{i}");
            store
                .create_batch_within(
                    vec![(
                        ObjectKey::new(&project, Kind::AgentRun, &name),
                        super::shaped_run(&name, &unique("uid"), &[], Some(&racing), "Pending"),
                    )],
                    None,
                    &[MemberCap {
                        project: project.clone(),
                        group: racing.clone(),
                        at_most: 3,
                    }],
                )
                .await
        })
    });
    let results = join_all(tasks.collect()).await;
    let passed = results.iter().filter(|r| r.is_ok()).count();
    assert_eq!(passed, 3, "{results:?}");
    assert!(
        results
            .iter()
            .all(|r| r.is_ok() || matches!(r, Err(Error::OverCap { at_most: 3, .. }))),
        "{results:?}"
    );
    assert_eq!(
        store.group_phases(&project, &racing).await.expect("phases"),
        vec![(Some("Pending".to_string()), 3)]
    );
}

/// A batch joining a group that is gone, sealed, cancelled or finished is refused
/// (`NotFound` naming the group, `GroupClosed`), nothing of it written, alone or with other
/// documents, whatever room the cap leaves; a group sealed after a run joined it takes no
/// more; a group that is running, or not reconciled yet, takes them.
pub async fn closed_groups<S: Store + Clone + 'static>(store: S) {
    let project = unique("closed");
    let group = |name: &str| ObjectKey::new(&project, Kind::AgentGroup, name);
    let cap = |group: &str| MemberCap {
        project: project.clone(),
        group: group.to_string(),
        at_most: 100,
    };
    // Alone (a store may write one document apart from a batch) and with another document.
    let batches = |group: &str| {
        let run = |name: String| {
            let document = super::shaped_run(&name, &unique("uid"), &[], Some(group), "Pending");
            (ObjectKey::new(&project, Kind::AgentRun, &name), document)
        };
        let agent = ObjectKey::new(&project, Kind::Agent, format!("{group}-agent"));
        [
            vec![run(format!("{group}-alone"))],
            vec![
                run(format!("{group}-with")),
                (agent.clone(), super::agent_document(&agent.name)),
            ],
        ]
    };
    let refused = async |name: &str, expected: &dyn Fn(&Error) -> bool| {
        for batch in batches(name) {
            let keys: Vec<ObjectKey> = batch.iter().map(|(key, _)| key.clone()).collect();
            let answer = store.create_batch_within(batch, None, &[cap(name)]).await;
            assert!(
                answer.as_ref().is_err_and(expected),
                "a batch into {name}: {answer:?}"
            );
            for key in keys {
                assert!(
                    matches!(store.get(&key).await, Err(Error::NotFound(_))),
                    "{key} of a refused batch is not written"
                );
            }
        }
    };
    let closed = |name: &str| {
        let name = name.to_string();
        move |error: &Error| matches!(error, Error::GroupClosed { group, .. } if *group == name)
    };

    refused("gone", &|error| {
        matches!(error, Error::NotFound(key) if key.kind == Kind::AgentGroup && key.name == "gone")
    })
    .await;
    for (name, sealed, phase) in [
        ("sealed", true, None),
        ("sealed-running", true, Some("Running")),
        ("cancelling", false, Some("Cancelling")),
        ("cancelled", false, Some("Cancelled")),
        ("succeeded", true, Some("Succeeded")),
    ] {
        store
            .create(&group(name), group_document(name, sealed, phase))
            .await
            .expect("a closed group");
        refused(name, &closed(name)).await;
    }
    for (name, phase) in [("new", None), ("running", Some("Running"))] {
        store
            .create(&group(name), group_document(name, false, phase))
            .await
            .expect("an open group");
        for batch in batches(name) {
            store
                .create_batch_within(batch, None, &[cap(name)])
                .await
                .expect("an open group takes runs");
        }
    }
    // Sealed once it has runs: it takes no more.
    let running = store.get(&group("running")).await.expect("the group");
    let mut sealed = running.document.clone();
    sealed["spec"]["sealed"] = json!(true);
    store
        .update(&group("running"), running.version, sealed)
        .await
        .expect("sealed");
    let late = super::shaped_run("late", &unique("uid"), &[], Some("running"), "Pending");
    let late_key = ObjectKey::new(&project, Kind::AgentRun, "late");
    assert_eq!(
        store
            .create_batch_within(vec![(late_key.clone(), late)], None, &[cap("running")])
            .await,
        Err(Error::GroupClosed {
            project: project.clone(),
            group: "running".to_string(),
        })
    );
    assert!(matches!(
        store.get(&late_key).await,
        Err(Error::NotFound(_))
    ));
    assert_eq!(
        store
            .group_phases(&project, "running")
            .await
            .expect("phases"),
        vec![(Some("Pending".to_string()), 2)],
        "the two runs that joined before it was sealed"
    );
}

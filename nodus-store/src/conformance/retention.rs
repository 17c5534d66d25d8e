//! Conformance of retention: sweeping old runs' payloads, and `rewrite_run` underneath it.

use std::collections::BTreeMap;

use nodus_core::Store;
use nodus_core::journal::{Intent, Outcome, Step};
use nodus_core::resource::Kind;
use nodus_core::store::{Change, Error, ObjectKey, RunRewrite};
use serde_json::{Value, json};

use super::{OWNER_A, completion, lease, message, next_change, run_document, step, time, unique};

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

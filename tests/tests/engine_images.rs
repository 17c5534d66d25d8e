//! Images pinned when runs are created, on the real Docker engine (the Docker sandbox under
//! an engine over the in-memory store, with the scripted model): an evaluation group resolves
//! its Environment's image once, records the image's content digest (`sha256:…`) in every
//! case and in its members' snapshots, and a member started after the tag was moved to
//! another image still runs the pinned one; a run created after the move pins the new image.
//! An image that cannot be had is refused when the run or the group is created, naming the
//! field and the image, with nothing written.
//!
//! Needs `NODUS_TEST_DOCKER_IMAGE` (set by `scripts/test-env`) and a reachable engine; fails
//! and says so otherwise.

mod support;

use std::process::{Command, Stdio};
use std::sync::Arc;

use nodus_core::engine::{Driven, Error};
use nodus_core::journal::Outcome;
use nodus_core::lifecycle::RunPhase;
use nodus_core::resource::AgentGroup;
use nodus_core::sandbox::Sandbox;
use nodus_core::testing::Drive;
use nodus_llm::Reply;
use nodus_sandbox::{DockerConfig, DockerSandbox};
use support::{PROJECT, World, agent, run};

const MARKER: &str = "/etc/nodus-marker";

fn base_image() -> String {
    std::env::var("NODUS_TEST_DOCKER_IMAGE").unwrap_or_else(|_| {
        panic!(
            "NODUS_TEST_DOCKER_IMAGE is not set: run `eval \"$(scripts/test-env start)\"` first \
             (it starts dockerd and builds the test image)"
        )
    })
}

/// A name no other test on this machine uses.
fn unique_key(tag: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|elapsed| elapsed.as_nanos())
        .unwrap_or_default();
    format!("{tag}-{}-{nanos}", std::process::id())
}

/// `docker ARGS`, which must succeed; what it printed.
fn docker(args: &[&str]) -> String {
    let output = Command::new("docker")
        .args(args)
        .output()
        .expect("run docker");
    assert!(
        output.status.success(),
        "docker {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).trim().to_owned()
}

/// An image built from the test image with `text` in [`MARKER`], tagged `tag`; its ID.
fn build_marked(tag: &str, text: &str) -> String {
    let mut build = Command::new("docker")
        .args(["build", "-q", "-t", tag, "-"])
        .env("DOCKER_BUILDKIT", "0")
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("docker build");
    {
        use std::io::Write as _;
        let mut stdin = build.stdin.take().expect("stdin");
        write!(
            stdin,
            "FROM {}\nRUN echo {text} > {MARKER}\nLABEL nodus.test.marker={text}\n",
            base_image()
        )
        .expect("a Dockerfile");
    }
    let built = build.wait_with_output().expect("docker build");
    assert!(
        built.status.success(),
        "{tag}: {}",
        String::from_utf8_lossy(&built.stderr)
    );
    docker(&["image", "inspect", "-f", "{{.Id}}", tag])
}

/// What the run's one command printed.
async fn printed(engine: &nodus_core::engine::Engine, name: &str) -> String {
    let journal = engine.journal(PROJECT, name).await.expect("journal");
    journal
        .iter()
        .find_map(|step| match step.outcome() {
            Some(Outcome::CommandFinished { output, .. }) => Some(
                String::from_utf8_lossy(&output.stdout.bytes)
                    .trim()
                    .to_owned(),
            ),
            _ => None,
        })
        .unwrap_or_else(|| panic!("{name} ran no command"))
}

/// The image digest a run's snapshot records.
async fn snapshot_image(engine: &nodus_core::engine::Engine, name: &str) -> Option<String> {
    engine
        .get_run(PROJECT, name)
        .await
        .expect("the run")
        .status
        .snapshot
        .expect("a snapshot")
        .image_digest
}

async fn docker_sandbox() -> Arc<DockerSandbox> {
    let sandbox = DockerSandbox::connect(DockerConfig::new(base_image()))
        .await
        .unwrap_or_else(|e| panic!("Docker is not reachable: {e}"));
    Arc::new(sandbox)
}

fn cat_marker() -> [Reply; 2] {
    [
        Reply::Commands(vec![format!("cat {MARKER}")]),
        Reply::Text("read".to_owned()),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_run_the_image_pinned_when_the_group_was_created() {
    let key = unique_key("pin");
    let reference = format!("nodus-test-pinned:{key}");
    let first = build_marked(&format!("{reference}-first"), "first");
    let second = build_marked(&format!("{reference}-second"), "second");
    assert_ne!(first, second);
    docker(&["tag", &format!("{reference}-first"), &reference]);

    let world = World::new([cat_marker(), cat_marker(), cat_marker()].concat());
    let engine = world.engine_with_sandbox(docker_sandbox().await);
    engine
        .apply_agent(PROJECT, agent("helper", |_| {}))
        .await
        .expect("agent");
    support::apply_exact_environment(
        &engine,
        "marked",
        Some(&reference),
        &[
            ("a", "Read the marker.", "first"),
            ("b", "Read the marker again.", "first"),
        ],
    )
    .await;
    // One member at a time: the second starts only after the first has finished.
    let group = support::evaluation_group(
        serde_json::json!({"environment": "marked@1.0.0", "tasks": 2, "seed": 7}),
        Some(1),
    );
    engine
        .apply_group(PROJECT, AgentGroup::new("pinned", group))
        .await
        .expect("the group");

    // Every case records the image's content digest, not the reference as written.
    let results = engine
        .evaluation_results(PROJECT, "pinned")
        .await
        .expect("results");
    assert_eq!(results.len(), 2);
    for result in &results {
        assert_eq!(result.image_digest, first, "{result:?}");
        assert!(result.image_digest.starts_with("sha256:"), "{result:?}");
        assert_eq!(
            snapshot_image(&engine, &result.run).await.as_deref(),
            Some(first.as_str())
        );
    }

    // The first member admitted runs; the other waits for it.
    let mut waiting = Vec::new();
    let mut ran = Vec::new();
    for result in &results {
        match engine.drive(PROJECT, &result.run).await.expect("drive") {
            Driven::Finished(RunPhase::Succeeded) => ran.push(result.run.clone()),
            Driven::NotAdmitted { .. } => waiting.push(result.run.clone()),
            other => panic!("{}: {other:?}", result.run),
        }
    }
    assert_eq!((ran.len(), waiting.len()), (1, 1), "{ran:?} {waiting:?}");
    assert_eq!(printed(&engine, &ran[0]).await, "first");

    // The tag moves to another image before the second member starts.
    docker(&["tag", &format!("{reference}-second"), &reference]);
    assert_eq!(
        docker(&["image", "inspect", "-f", "{{.Id}}", &reference]),
        second
    );
    engine
        .reconcile_group(PROJECT, "pinned")
        .await
        .expect("reconcile");
    let driven = engine.drive(PROJECT, &waiting[0]).await.expect("drive");
    assert!(
        matches!(driven, Driven::Finished(RunPhase::Succeeded)),
        "{driven:?}"
    );
    assert_eq!(
        printed(&engine, &waiting[0]).await,
        "first",
        "the member runs the image pinned when the group was created"
    );

    // A run created now pins what the tag names now.
    engine
        .create_run(
            PROJECT,
            run("after-the-move", "helper", "Read the marker.", |spec| {
                spec.image = Some(reference.clone())
            }),
        )
        .await
        .expect("a run");
    assert_eq!(
        snapshot_image(&engine, "after-the-move").await.as_deref(),
        Some(second.as_str())
    );
    let driven = engine
        .drive(PROJECT, "after-the-move")
        .await
        .expect("drive");
    assert!(
        matches!(driven, Driven::Finished(RunPhase::Succeeded)),
        "{driven:?}"
    );
    assert_eq!(printed(&engine, "after-the-move").await, "second");

    for tag in [
        reference.clone(),
        format!("{reference}-first"),
        format!("{reference}-second"),
    ] {
        docker(&["rmi", &tag]);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_image_that_cannot_be_had_is_refused_at_creation() {
    let sandbox = docker_sandbox().await;
    let missing = format!("nodus-test-absent:{}", unique_key("absent"));
    // The backend pulls a missing image first, and refuses one it cannot pull.
    match sandbox.resolve_image(&missing).await {
        Err(nodus_core::sandbox::Error::Refused(message)) => {
            assert!(message.contains(&missing), "{message}");
        }
        other => panic!("{other:?}"),
    }
    let world = World::new(Vec::new());
    let engine = world.engine_with_sandbox(sandbox);
    engine
        .apply_agent(PROJECT, agent("helper", |_| {}))
        .await
        .expect("agent");
    match engine
        .create_run(
            PROJECT,
            run("absent", "helper", "Read the marker.", |spec| {
                spec.image = Some(missing.clone())
            }),
        )
        .await
    {
        Err(Error::Invalid(invalid)) => {
            assert_eq!(invalid.field, "spec.image", "{invalid}");
            assert_eq!(invalid.value, format!("{missing:?}"), "{invalid}");
            assert!(invalid.rule.contains("could not be pulled"), "{invalid}");
        }
        other => panic!("{other:?}"),
    }
    assert!(
        engine.get_run(PROJECT, "absent").await.is_err(),
        "not written"
    );

    support::apply_exact_environment(&engine, "absent", Some(&missing), &[("a", "Say hi.", "hi")])
        .await;
    let group = support::evaluation_group(
        serde_json::json!({"environment": "absent@1.0.0", "tasks": 1}),
        None,
    );
    match engine
        .apply_group(PROJECT, AgentGroup::new("absent", group))
        .await
    {
        Err(Error::Invalid(invalid)) => {
            assert_eq!(invalid.field, "spec.evaluation.environment", "{invalid}");
            assert_eq!(invalid.value, format!("{missing:?}"), "{invalid}");
            assert!(invalid.rule.contains("absent@1.0.0"), "{invalid}");
        }
        other => panic!("{other:?}"),
    }
    assert!(
        engine.get_run(PROJECT, "absent-c000").await.is_err(),
        "no member written"
    );
}

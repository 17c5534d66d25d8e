//! A run's working directory staged from FileSets: what the sandbox receives, references
//! refused at creation, and a FileSet gone by the time the sandbox is made.

mod support;

use std::io::Read;

use nodus_core::engine::{Driven, Error};
use nodus_core::lifecycle::RunPhase;
use nodus_core::resource::{AgentRun, ArtifactMount, FileEntry, FileSetSpec, Object, WorkdirSpec};
use nodus_core::testing::Drive;
use nodus_llm::Reply;
use support::{PROJECT, World, agent, run};

fn file(path: &str, content: &str, executable: bool) -> FileEntry {
    FileEntry {
        path: path.to_string(),
        content: content.to_string(),
        content_base64: None,
        executable,
    }
}

fn workdir(base: Option<&str>, mounts: &[(&str, &str)]) -> WorkdirSpec {
    WorkdirSpec {
        base_workdir: base.map(str::to_string),
        artifact_mounts: mounts
            .iter()
            .map(|(reference, path)| ArtifactMount {
                reference: reference.to_string(),
                mount_path: path.to_string(),
            })
            .collect(),
    }
}

/// Entries of a tar archive: path, mode, contents.
fn entries(tar: &[u8]) -> Vec<(String, u32, Vec<u8>)> {
    let mut archive = tar::Archive::new(tar);
    let mut out = Vec::new();
    for entry in archive.entries().expect("entries") {
        let mut entry = entry.expect("entry");
        let path = entry.path().expect("path").display().to_string();
        let mode = entry.header().mode().expect("mode");
        let mut content = Vec::new();
        entry.read_to_end(&mut content).expect("content");
        out.push((path, mode, content));
    }
    out
}

async fn world_with_filesets() -> (World, nodus_core::engine::Engine) {
    let world = World::new(vec![Reply::Text("done".to_string())]);
    let engine = world.engine();
    engine
        .apply_agent(PROJECT, agent("helper", |_| {}))
        .await
        .expect("agent");
    engine
        .create(
            PROJECT,
            Object::new(
                "source",
                FileSetSpec {
                    files: vec![
                        file("app/main.py", "print('hi')\n", false),
                        file("run.sh", "#!/bin/sh\npython3 app/main.py\n", true),
                        FileEntry {
                            path: "img/dot.bin".to_string(),
                            content: String::new(),
                            content_base64: Some("AAH/".to_string()),
                            executable: false,
                        },
                    ],
                },
            ),
        )
        .await
        .expect("a FileSet");
    engine
        .create(
            PROJECT,
            Object::new(
                "notes",
                FileSetSpec {
                    files: vec![file("notes.txt", "remember\n", false)],
                },
            ),
        )
        .await
        .expect("another FileSet");
    (world, engine)
}

#[tokio::test]
async fn the_sandbox_receives_the_base_files_and_the_mounted_ones() {
    let (world, engine) = world_with_filesets().await;
    let created = engine
        .create_run(
            PROJECT,
            run("staged", "helper", "q", |s| {
                s.workdir = Some(workdir(
                    Some("source"),
                    &[(&format!("{PROJECT}/notes#notes.txt"), "docs/notes.txt")],
                ));
            }),
        )
        .await
        .expect("a run with a working directory");
    assert_eq!(
        engine.drive(PROJECT, "staged").await.expect("drive"),
        Driven::Finished(RunPhase::Succeeded)
    );
    let uid = created.metadata.uid.expect("a uid");
    let tar = world.sandbox.archive(&uid).expect("an archive was put");
    assert_eq!(
        entries(&tar),
        vec![
            ("app/main.py".to_string(), 0o644, b"print('hi')\n".to_vec()),
            (
                "run.sh".to_string(),
                0o755,
                b"#!/bin/sh\npython3 app/main.py\n".to_vec()
            ),
            ("img/dot.bin".to_string(), 0o644, vec![0, 1, 255]),
            ("docs/notes.txt".to_string(), 0o644, b"remember\n".to_vec()),
        ]
    );
}

#[tokio::test]
async fn the_final_working_directory_is_kept_until_the_run_is_deleted() {
    use nodus_core::engine::{OutputWorkdir, workdir_archive_key};
    use nodus_core::store::{ObjectKey, Store};

    let (world, engine) = world_with_filesets().await;
    engine
        .create_run(
            PROJECT,
            run("kept", "helper", "q", |s| {
                s.workdir = Some(workdir(Some("notes"), &[]))
            }),
        )
        .await
        .expect("a run with a working directory");
    engine
        .create_run(PROJECT, run("plain", "helper", "q", |_| {}))
        .await
        .expect("a run without one");
    assert_eq!(
        engine.output_workdir(PROJECT, "kept").await.expect("read"),
        None,
        "nothing is kept before the run ends"
    );
    for name in ["kept", "plain"] {
        assert_eq!(
            engine.drive(PROJECT, name).await.expect("drive"),
            Driven::Finished(RunPhase::Succeeded)
        );
    }
    // The recording sandbox hands back what was put into it.
    match engine.output_workdir(PROJECT, "kept").await.expect("read") {
        Some(OutputWorkdir::Archive(tar)) => assert_eq!(
            entries(&tar),
            vec![("notes.txt".to_string(), 0o644, b"remember\n".to_vec())]
        ),
        other => panic!("expected the archive, got {other:?}"),
    }
    // Every run keeps its final working directory, among its results.
    match engine.output_workdir(PROJECT, "plain").await.expect("read") {
        Some(OutputWorkdir::Archive(tar)) => assert_eq!(entries(&tar), vec![]),
        other => panic!("expected an empty archive, got {other:?}"),
    }
    engine
        .delete::<AgentRun>(PROJECT, "kept")
        .await
        .expect("delete");
    let key = workdir_archive_key(&ObjectKey::new(
        PROJECT,
        nodus_core::resource::Kind::AgentRun,
        "kept",
    ));
    assert!(
        world.memory.get(&key).await.is_err(),
        "deleting the run removes what it kept"
    );
}

#[tokio::test]
async fn references_that_name_nothing_are_refused_at_creation() {
    let (_world, engine) = world_with_filesets().await;
    let cases = [
        (
            workdir(Some("missing"), &[]),
            "spec.workdir.baseWorkdir",
            "must name an existing FileSet",
        ),
        (
            workdir(Some("other-project/source"), &[]),
            "spec.workdir.baseWorkdir",
            "must name a FileSet of this project",
        ),
        (
            workdir(None, &[("notes#absent.txt", "a.txt")]),
            "spec.workdir.artifactMounts[0].ref",
            "must name a file of the FileSet",
        ),
        (
            workdir(None, &[("notes", "a.txt")]),
            "spec.workdir.artifactMounts[0].ref",
            "must be `fileset#path`",
        ),
    ];
    for (index, (spec, field, rule)) in cases.into_iter().enumerate() {
        let name = format!("refused-{index}");
        match engine
            .create_run(
                PROJECT,
                run(&name, "helper", "q", |s| s.workdir = Some(spec)),
            )
            .await
        {
            Err(Error::Invalid(invalid)) => {
                assert_eq!(invalid.field, field);
                assert!(invalid.rule.starts_with(rule), "{invalid:?}");
            }
            other => panic!("{field}: expected a refusal, got {other:?}"),
        }
        assert!(
            engine.get_run(PROJECT, &name).await.is_err(),
            "nothing written"
        );
    }
}

#[tokio::test]
async fn filesets_changed_or_deleted_after_creation_do_not_change_the_run() {
    let (world, engine) = world_with_filesets().await;
    let created = engine
        .create_run(
            PROJECT,
            run("resolved", "helper", "q", |s| {
                s.workdir = Some(workdir(
                    Some("source#app/"),
                    &[("notes#notes.txt", "n.txt")],
                ))
            }),
        )
        .await
        .expect("created while the FileSets exist");
    let snapshot = created
        .status
        .snapshot
        .as_ref()
        .and_then(|s| s.workdir.clone())
        .expect("the working directory is in the snapshot");
    let names: Vec<&str> = snapshot.file_sets.iter().map(|f| f.name.as_str()).collect();
    assert_eq!(names, ["source", "notes"]);
    // After creation, one FileSet changes and the other goes.
    let mut changed = engine
        .get::<FileSetSpec>(PROJECT, "source")
        .await
        .expect("the FileSet");
    changed.spec.files = vec![file("app/main.py", "print('changed')\n", false)];
    engine
        .replace(PROJECT, "source", changed, None)
        .await
        .expect("replace the FileSet");
    engine
        .delete::<Object<FileSetSpec>>(PROJECT, "notes")
        .await
        .expect("delete the FileSet");
    assert_eq!(
        engine.drive(PROJECT, "resolved").await.expect("drive"),
        Driven::Finished(RunPhase::Succeeded)
    );
    let uid = created.metadata.uid.expect("a uid");
    let tar = world.sandbox.archive(&uid).expect("an archive was put");
    // `source#app/` stages app/'s files relative to app/; the contents are those at creation.
    assert_eq!(
        entries(&tar),
        vec![
            ("main.py".to_string(), 0o644, b"print('hi')\n".to_vec()),
            ("n.txt".to_string(), 0o644, b"remember\n".to_vec()),
        ]
    );
    assert_eq!(
        nodus_core::digest::sha256_hex(&tar),
        snapshot.sha256,
        "the archive staged is the one recorded"
    );
}

#[tokio::test]
async fn a_base_directory_that_holds_no_files_is_refused_at_creation() {
    let (_world, engine) = world_with_filesets().await;
    for (base, rule) in [
        ("source#nothing/", "that holds files"),
        ("source#app", "ending in '/'"),
    ] {
        let refused = engine
            .create_run(
                PROJECT,
                run("empty-base", "helper", "q", |s| {
                    s.workdir = Some(workdir(Some(base), &[]))
                }),
            )
            .await;
        match refused {
            Err(Error::Invalid(invalid)) => {
                assert_eq!(invalid.field, "spec.workdir.baseWorkdir");
                assert!(invalid.rule.contains(rule), "{invalid:?}");
            }
            other => panic!("{base}: expected a refusal, got {other:?}"),
        }
        assert!(engine.get_run(PROJECT, "empty-base").await.is_err());
    }
}

#[tokio::test]
async fn a_staged_archive_gone_before_the_sandbox_is_made_fails_the_run_and_leaves_no_sandbox() {
    let (world, engine) = world_with_filesets().await;
    engine
        .create_run(
            PROJECT,
            run("orphaned", "helper", "q", |s| {
                s.workdir = Some(workdir(Some("source"), &[]))
            }),
        )
        .await
        .expect("created while the FileSet exists");
    engine
        .store()
        .delete(&nodus_core::engine::workdir_archive_key(
            &nodus_core::store::ObjectKey::new(
                PROJECT,
                nodus_core::resource::Kind::AgentRun,
                "orphaned",
            ),
        ))
        .await
        .expect("remove what the run kept");
    assert_eq!(
        engine.drive(PROJECT, "orphaned").await.expect("drive"),
        Driven::Finished(RunPhase::Failed(
            nodus_core::lifecycle::FailReason::SandboxFailed
        ))
    );
    let failed = engine.get_run(PROJECT, "orphaned").await.expect("the run");
    let message = serde_json::to_string(&failed.status).expect("status");
    assert!(
        message.contains("staging the working directory"),
        "{message}"
    );
    assert!(world.sandbox.live().is_empty(), "no sandbox is left behind");
}

#[tokio::test]
async fn many_mounts_of_a_big_fileset_are_refused_at_creation_by_size() {
    use nodus_core::engine::MAX_STAGED_WORKDIR_BYTES;

    let (world, engine) = world_with_filesets().await;
    engine
        .create(
            PROJECT,
            Object::new(
                "big",
                FileSetSpec {
                    files: vec![file("blob", &"x".repeat(20_000_000), false)],
                },
            ),
        )
        .await
        .expect("a big FileSet");
    // 100 mounts of a 20 MB file in a small request: 2 GB if each were staged.
    let mounts: Vec<(String, String)> = (0..100)
        .map(|i| ("big#blob".to_string(), format!("copy-{i}")))
        .collect();
    let mounts: Vec<(&str, &str)> = mounts
        .iter()
        .map(|(r, p)| (r.as_str(), p.as_str()))
        .collect();
    // The refusal comes from stored sizes, before any content is read or copied: the
    // process's peak memory (reset just before) stays far below one staged copy per mount.
    let resident_before = memory_kib("VmRSS");
    std::fs::write("/proc/self/clear_refs", "5").expect("reset the peak resident size");
    let refused = engine
        .create_run(
            PROJECT,
            run("hoarder", "helper", "q", |s| {
                s.workdir = Some(workdir(Some("source"), &mounts))
            }),
        )
        .await;
    let peak_growth_kib = memory_kib("VmHWM").saturating_sub(resident_before);
    assert!(
        peak_growth_kib < 256 * 1024,
        "creating the refused run grew the peak resident size by {peak_growth_kib} KiB"
    );
    match refused {
        Err(Error::Invalid(invalid)) => {
            // Three copies fit into 64 MiB, the fourth does not.
            assert_eq!(invalid.field, "spec.workdir.artifactMounts[3]");
            assert!(
                invalid
                    .rule
                    .contains(&format!("within {MAX_STAGED_WORKDIR_BYTES} bytes (64 MiB")),
                "{invalid:?}"
            );
            assert!(invalid.value.contains("bytes with this one"), "{invalid:?}");
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    assert!(
        engine.get_run(PROJECT, "hoarder").await.is_err(),
        "nothing written"
    );
    assert!(world.sandbox.archive("hoarder").is_none());

    // Three copies are within the limit and staged.
    let created = engine
        .create_run(
            PROJECT,
            run("three", "helper", "q", |s| {
                s.workdir = Some(workdir(None, &mounts[..3]))
            }),
        )
        .await
        .expect("three copies fit");
    assert_eq!(
        engine.drive(PROJECT, "three").await.expect("drive"),
        Driven::Finished(RunPhase::Succeeded)
    );
    let uid = created.metadata.uid.expect("a uid");
    let tar = world.sandbox.archive(&uid).expect("an archive was put");
    assert_eq!(entries(&tar).len(), 3);
}

/// A line of `/proc/self/status` in KiB (`VmRSS`: resident now, `VmHWM`: the peak since the
/// last reset through `/proc/self/clear_refs`).
fn memory_kib(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    status
        .lines()
        .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("{field} in /proc/self/status"))
}

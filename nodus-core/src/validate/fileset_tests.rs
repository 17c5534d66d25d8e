//! FileSet rules and working-directory paths.

use serde_json::{Value, json};

use crate::resource::*;
use crate::validate::test_support::*;

// ---- FileSet ----

fn fileset(paths: &[&str]) -> Value {
    let files: Vec<Value> = paths
        .iter()
        .map(|p| json!({ "path": p, "content": "x" }))
        .collect();
    json!({
        "apiVersion": "nodus.dev/v1", "kind": "FileSet",
        "metadata": { "name": "source" }, "spec": { "files": files },
    })
}

#[test]
fn fileset_rules() {
    check::<FileSetSpec>(vec![
        (
            fileset(&["/etc/passwd"]),
            "spec.files[0].path",
            "/etc/passwd",
        ),
        (
            fileset(&["ok", "a/../../b"]),
            "spec.files[1].path",
            "a/../../b",
        ),
        (fileset(&[""]), "spec.files[0].path", "\"\""),
        (
            fileset(&["a", "b", "./a"]),
            "spec.files[2].path",
            "spec.files[0].path",
        ),
        (
            fileset(&["data/x", "data"]),
            "spec.files[1].path",
            "spec.files[0].path",
        ),
        (
            with(
                fileset(&[]),
                "/spec/files",
                json!([{ "path": "a", "mode": "0755" }]),
            ),
            "spec.files[0].mode",
            "unknown field",
        ),
        (
            with(fileset(&[]), "/metadata/name", json!("Source")),
            "metadata.name",
            "\"Source\"",
        ),
    ]);
    check::<FileSetSpec>(vec![
        (
            with(
                fileset(&[]),
                "/spec/files",
                json!([{ "path": "a.bin", "contentBase64": "not base64!" }]),
            ),
            "spec.files[0].contentBase64",
            "standard base64",
        ),
        (
            with(
                fileset(&[]),
                "/spec/files",
                json!([{ "path": "a", "content": "x", "contentBase64": "eA==" }]),
            ),
            "spec.files[0].contentBase64",
            "one or the other",
        ),
    ]);
    let binary = accept::<FileSetSpec>(with(
        fileset(&[]),
        "/spec/files",
        json!([{ "path": "a.bin", "contentBase64": "AAH/" }]),
    ));
    assert_eq!(binary.spec.files[0].bytes(), Ok(vec![0, 1, 255]));
    accept::<FileSetSpec>(fileset(&["app/main.py", "app-x/y", "run.sh"]));
    accept::<FileSetSpec>(fileset(&[&"x".repeat(255), "d\u{e9}j\u{e0}/vu", "a/b-"]));
}

/// Paths that would reach a file system or a command line in a misleading or failing
/// form are refused when the FileSet (or a mount) is created, with the value escaped.
#[test]
fn fileset_paths_refuse_control_characters_bidi_leading_dashes_and_long_components() {
    let long = format!("dir/{}", "x".repeat(256));
    check::<FileSetSpec>(vec![
        (fileset(&["ok", "a\nb"]), "spec.files[1].path", r#""a\nb""#),
        (
            fileset(&["tab\there"]),
            "spec.files[0].path",
            "control characters",
        ),
        (fileset(&["esc\u{1b}[2J"]), "spec.files[0].path", r"\u{1b}"),
        (fileset(&["del\u{7f}"]), "spec.files[0].path", r"\u{7f}"),
        (
            fileset(&["c1\u{85}"]),
            "spec.files[0].path",
            "control characters",
        ),
        (
            fileset(&["invoice\u{202E}fdp.exe"]),
            "spec.files[0].path",
            r"\u{202e}",
        ),
        (
            fileset(&["a\u{202A}b"]),
            "spec.files[0].path",
            "bidirectional",
        ),
        (
            fileset(&["a\u{2066}b"]),
            "spec.files[0].path",
            "bidirectional",
        ),
        (fileset(&["a\u{2069}b"]), "spec.files[0].path", r"\u{2069}"),
        (fileset(&["-rf"]), "spec.files[0].path", "starts with `-`"),
        (
            fileset(&["src/--help"]),
            "spec.files[0].path",
            r#""src/--help""#,
        ),
        (
            fileset(&[&long]),
            "spec.files[0].path",
            "longer than 255 bytes (one has 256)",
        ),
    ]);
    // The same rules hold for a run's mount paths.
    let run = with(
        run(),
        "/spec/workdir",
        json!({ "artifactMounts": [{ "ref": "files#x", "mountPath": "-x" }] }),
    );
    check::<AgentRunSpec>(vec![(
        run,
        "spec.workdir.artifactMounts[0].mountPath",
        "starts with `-`",
    )]);
    accept::<FileSetSpec>(fileset(&[]));
}

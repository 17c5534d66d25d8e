//! AgentRun rules, task names among them.

use serde_json::{Value, json};

use crate::resource::*;
use crate::validate::test_support::*;
use crate::validate::*;

#[test]
fn run_names_and_tasks() {
    check::<AgentRunSpec>(vec![
        (
            without(run(), "/metadata/name"),
            "metadata.name",
            "required",
        ),
        (
            with(task("a", json!([])), "/metadata/name", json!("other")),
            "metadata.name",
            "\"parallel-agents-a\"",
        ),
        (
            without(
                with(task(&long(40), json!([])), "/spec/group", json!(long(40))),
                "/metadata/name",
            ),
            "spec.taskKey",
            "at most 63 characters",
        ),
    ]);
}

// ---- AgentRun ----

#[test]
fn run_rules() {
    let mounts = |paths: &[&str]| {
        let mounts: Vec<Value> = paths
            .iter()
            .map(|path| json!({ "ref": "files#x", "mountPath": path }))
            .collect();
        with(run(), "/spec/workdir", json!({ "artifactMounts": mounts }))
    };
    check::<AgentRunSpec>(vec![
        (
            with(run(), "/spec/agent", json!("Hello")),
            "spec.agent",
            "\"Hello\"",
        ),
        (
            with(run(), "/spec/agent", json!("a/b/c")),
            "spec.agent",
            "\"a/b/c\"",
        ),
        (
            with(run(), "/spec/agent", json!("/b")),
            "spec.agent",
            "\"/b\"",
        ),
        (with(run(), "/spec/agent", json!("")), "spec.agent", "\"\""),
        (with(run(), "/spec/input", json!("")), "spec.input", "\"\""),
        (
            with(run(), "/spec/input", json!(long(MAX_INPUT_BYTES + 1))),
            "spec.input",
            "(262145 bytes)",
        ),
        (
            with(task("a", json!([])), "/spec/group", json!("Group")),
            "spec.group",
            "\"Group\"",
        ),
        (
            without(task("a", json!([])), "/spec/taskKey"),
            "spec.taskKey",
            "required",
        ),
        (
            with(task("a", json!([])), "/spec/taskKey", json!("A")),
            "spec.taskKey",
            "\"A\"",
        ),
        (
            with(run(), "/spec/taskKey", json!("a")),
            "spec.taskKey",
            "\"a\"",
        ),
        (
            with(run(), "/spec/dependsOn", json!(["a"])),
            "spec.dependsOn",
            "[\"a\"]",
        ),
        (task("c", json!(["a", "B"])), "spec.dependsOn[1]", "\"B\""),
        (
            task("c", json!(["a", "b", "a"])),
            "spec.dependsOn[2]",
            "\"a\"",
        ),
        (
            task("c", json!(["a", "c"])),
            "spec.dependsOn[1]",
            "own taskKey (got \"c\")",
        ),
        (
            with(run(), "/spec/context", json!({ "nodus": { "x": 1 } })),
            "spec.context.nodus",
            "{\"x\":1}",
        ),
        (
            with(run(), "/spec/timeout", json!("0s")),
            "spec.timeout",
            "between 1s and 24h (got 0s)",
        ),
        (
            with(run(), "/spec/timeout", json!("24h1s")),
            "spec.timeout",
            "24h1s",
        ),
        (
            mounts(&[""]),
            "spec.workdir.artifactMounts[0].mountPath",
            "\"\"",
        ),
        (
            mounts(&["/etc/passwd"]),
            "spec.workdir.artifactMounts[0].mountPath",
            "/etc/passwd",
        ),
        (
            mounts(&["a/../../b"]),
            "spec.workdir.artifactMounts[0].mountPath",
            "a/../../b",
        ),
        (
            mounts(&["ok", ".."]),
            "spec.workdir.artifactMounts[1].mountPath",
            "\"..\"",
        ),
        (
            mounts(&["./"]),
            "spec.workdir.artifactMounts[0].mountPath",
            "\"./\"",
        ),
        (
            mounts(&["a\0b"]),
            "spec.workdir.artifactMounts[0].mountPath",
            "NUL",
        ),
        (
            mounts(&["a/b", "c", "a/b"]),
            "spec.workdir.artifactMounts[2].mountPath",
            "\"a/b\"",
        ),
        (
            mounts(&["data/x", "data"]),
            "spec.workdir.artifactMounts[1].mountPath",
            "[0]",
        ),
        (
            mounts(&["data", "z", "./data//x"]),
            "spec.workdir.artifactMounts[2].mountPath",
            "\"data\"",
        ),
        (
            with(
                run(),
                "/spec/workdir",
                json!({ "artifactMounts": [{ "ref": "", "mountPath": "a" }] }),
            ),
            "spec.workdir.artifactMounts[0].ref",
            "\"\"",
        ),
        (
            with(run(), "/spec/workdir", json!({ "baseWorkdir": "" })),
            "spec.workdir.baseWorkdir",
            "\"\"",
        ),
        (
            with(run(), "/spec/postRunAction", json!({ "kind": "" })),
            "spec.postRunAction.kind",
            "\"\"",
        ),
        (
            with(run(), "/spec/environment", json!("Prod")),
            "spec.environment",
            "\"Prod\"",
        ),
        (
            with(run(), "/spec/environment", json!("a/b/c")),
            "spec.environment",
            "\"a/b/c\"",
        ),
        (with(run(), "/spec/image", json!("")), "spec.image", "\"\""),
        (
            with(run(), "/spec/image", json!("x/../../containers/c1")),
            "spec.image",
            "\"x/../../containers/c1\"",
        ),
        (
            with(run(), "/spec/image", json!("busybox?all=1")),
            "spec.image",
            "\"busybox?all=1\"",
        ),
    ]);
    for timeout in ["1s", "24h", "3600"] {
        accept::<AgentRunSpec>(with(run(), "/spec/timeout", json!(timeout)));
    }
    accept::<AgentRunSpec>(mounts(&["data/a", "data/b", "data-a", "datab/x"]));
    accept::<AgentRunSpec>(with(run(), "/spec/context", json!({ "x": { "nodus": 1 } })));
}

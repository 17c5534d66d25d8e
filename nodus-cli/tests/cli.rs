//! The CLI as a user meets it, through the real binaries (`nodus server` on an in-memory
//! store, the unisolated sandbox, the offline model): apply of the whole examples directory,
//! delete and get that go on past a missing object, re-applying a sealed group, cancel with
//! KIND NAME, and the server's --listen.

mod support;

use std::time::Duration;

use support::{ROOT, Server, TOKEN, login, nodus, ok, start_server, text};

fn lines(text: &str) -> Vec<&str> {
    text.lines().collect()
}

#[test]
fn apply_of_the_examples_directory_works_on_an_empty_server_and_delete_goes_on_past_misses() {
    let dir = tempfile::tempdir().expect("tempdir");
    let dir = dir.path();
    let server = start_server(dir, Some("memory:"), "unisolated");
    login(dir, &server);
    let examples = format!("{ROOT}/examples/");

    // Secrets, FileSets and Agents before the group, the group before the runs; each kind in
    // file order (runs.yaml's c after the a and b it depends on).
    let applied = ok(dir, &["apply", "-f", &examples]);
    assert_eq!(
        lines(&applied),
        [
            "secret.nodus.dev/anthropic-key created",
            "fileset.nodus.dev/project-source created",
            "agent.nodus.dev/hello-agent created",
            "agent.nodus.dev/my-key-agent created",
            "agent.nodus.dev/parallel-agents-worker created",
            "agentgroup.nodus.dev/parallel-agents created",
            "agentrun.nodus.dev/hello-agent-run created",
            "agentrun.nodus.dev/parallel-agents-a created",
            "agentrun.nodus.dev/parallel-agents-b created",
            "agentrun.nodus.dev/parallel-agents-c created",
            "agentrun.nodus.dev/review-config created",
        ],
        "{applied}"
    );

    // Re-applying the unchanged group manifest to the sealed group leaves it sealed.
    let group = format!("{ROOT}/examples/group.yaml");
    ok(
        dir,
        &[
            "patch",
            "ag/parallel-agents",
            "--patch",
            r#"{"spec":{"sealed":true}}"#,
        ],
    );
    assert_eq!(
        ok(dir, &["apply", "-f", &group]),
        "agentgroup.nodus.dev/parallel-agents unchanged\n"
    );
    let wider = dir.join("wider-group.yaml");
    let manifest = std::fs::read_to_string(&group).expect("group.yaml");
    std::fs::write(&wider, manifest.replace("maxActive: 2 ", "maxActive: 3 ")).expect("write");
    assert_eq!(
        ok(dir, &["apply", "-f", wider.to_str().expect("utf-8")]),
        "agentgroup.nodus.dev/parallel-agents configured\n"
    );
    let spec = ok(
        dir,
        &[
            "get",
            "ag/parallel-agents",
            "-o",
            "jsonpath={.spec.sealed} {.spec.limits.maxActive}",
        ],
    );
    assert_eq!(spec, "true 3");

    // An error names the file and the document.
    let broken = dir.join("broken.yaml");
    std::fs::write(
        &broken,
        "apiVersion: nodus.dev/v1\nkind: Agent\nmetadata: {name: fine}\nspec:\n  system: s\n  model: {access: Nodus}\n  perRunMaxCostUSD: \"0.10\"\n---\napiVersion: nodus.dev/v1\nkind: Agent\nmetadata: {name: broken}\nspec:\n  system: s\n  model: {access: Nodus}\n  perRunMaxCostUSD: \"-1\"\n",
    )
    .expect("write");
    let broken = broken.to_str().expect("utf-8");
    let output = nodus(dir, &["apply", "-f", broken]);
    assert_eq!(output.status.code(), Some(1));
    assert_eq!(text(&output.stdout), "agent.nodus.dev/fine created\n");
    let said = text(&output.stderr);
    assert!(
        said.starts_with(&format!(
            "Error from server (Invalid): {broken}: document 2: "
        )),
        "{said}"
    );
    assert!(said.contains("perRunMaxCostUSD"), "{said}");

    // get: the found ones are printed, each missing one is an error, exit 1.
    let output = nodus(
        dir,
        &[
            "get",
            "ar",
            "parallel-agents-a",
            "nope",
            "parallel-agents-b",
            "-o",
            "name",
        ],
    );
    assert_eq!(output.status.code(), Some(1), "{}", text(&output.stderr));
    assert_eq!(
        lines(&text(&output.stdout)),
        [
            "agentrun.nodus.dev/parallel-agents-a",
            "agentrun.nodus.dev/parallel-agents-b"
        ]
    );
    assert_eq!(
        text(&output.stderr),
        "Error from server (NotFound): AgentRun \"nope\" not found\n"
    );

    // Every kind says when there is nothing.
    for kind in ["budgets", "secrets", "filesets"] {
        let output = nodus(dir, &["get", kind, "-l", "none=here"]);
        assert!(output.status.success());
        assert_eq!(
            text(&output.stderr),
            "No resources found in project default.\n",
            "{kind}"
        );
    }

    // cancel takes KIND NAME as get and delete do.
    ok(
        dir,
        &[
            "create",
            "agentrun",
            "long",
            "--agent",
            "hello-agent",
            "--prompt",
            "Run `sleep 30`",
        ],
    );
    assert_eq!(
        ok(dir, &["cancel", "agentrun", "long"]),
        "agentrun.nodus.dev/long cancelled\n"
    );

    // delete -f goes on past a missing object, reports it, and exits 1 at the end.
    let three = dir.join("three.yaml");
    std::fs::write(
        &three,
        "apiVersion: nodus.dev/v1\nkind: Agent\nmetadata: {name: hello-agent}\n---\napiVersion: nodus.dev/v1\nkind: Agent\nmetadata: {name: never-made}\n---\napiVersion: nodus.dev/v1\nkind: Agent\nmetadata: {name: fine}\n",
    )
    .expect("write");
    let three = three.to_str().expect("utf-8");
    let output = nodus(dir, &["delete", "-f", three]);
    assert_eq!(output.status.code(), Some(1), "{}", text(&output.stderr));
    assert_eq!(
        lines(&text(&output.stdout)),
        [
            "agent.nodus.dev/hello-agent deleted",
            "agent.nodus.dev/fine deleted"
        ]
    );
    assert_eq!(
        text(&output.stderr),
        format!(
            "Error from server (NotFound): {three}: document 2: Agent \"never-made\" not found\n"
        )
    );

    // delete -f of the examples takes the runs before their group: nothing is missing but
    // what the test deleted already.
    let output = nodus(dir, &["delete", "-f", &examples]);
    let said = text(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{said}");
    assert_eq!(said.lines().count(), 1, "only hello-agent was gone: {said}");
    assert!(said.contains("Agent \"hello-agent\" not found"), "{said}");
    let deleted = text(&output.stdout);
    assert_eq!(deleted.lines().count(), 10, "{deleted}");
    assert!(
        deleted.find("agentrun.nodus.dev/parallel-agents-c deleted")
            < deleted.find("agentgroup.nodus.dev/parallel-agents deleted"),
        "{deleted}"
    );
}

#[test]
fn the_server_listens_on_a_host_name_and_a_busy_port_is_an_error_before_serving() {
    let dir = tempfile::tempdir().expect("tempdir");
    let first_dir = dir.path().join("first");
    let second_dir = dir.path().join("second");
    std::fs::create_dir_all(&first_dir).expect("mkdir");
    std::fs::create_dir_all(&second_dir).expect("mkdir");
    let port = support::free_port();
    let listen = format!("localhost:{port}");
    let child = support::spawn_server(&first_dir, Some("memory:"), "unisolated", &listen);
    let first = support::wait_healthy(Server {
        child,
        log: first_dir.join("server.log"),
        port,
    });
    assert!(
        first
            .log()
            .contains(&format!("serving the API on http://127.0.0.1:{port}")),
        "{}",
        first.log()
    );

    let mut second = support::spawn_server(&second_dir, Some("memory:"), "unisolated", &listen);
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = second.try_wait().expect("wait") {
            break status;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the second server kept running"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let said = std::fs::read_to_string(second_dir.join("server.log")).expect("log");
    assert_eq!(status.code(), Some(1), "{said}");
    assert!(said.contains("cannot listen on"), "{said}");
    assert!(!said.contains("serving"), "{said}");
    assert!(!said.contains(TOKEN), "{said}");
}

//! Two projects with their own tokens, end to end through the real CLI and a real server:
//! the operator creates the projects and their first tokens; each project's tokens see only
//! its own resources; read, write and admin hold; a deleted or expired token is refused.

mod support;

use std::path::Path;
use std::process::Output;

use support::{ROOT, TOKEN, command, login, ok, start_server, text};

/// The CLI as the holder of `token` in `project`.
fn as_token(dir: &Path, server: &str, token: &str, project: &str, args: &[&str]) -> Output {
    command(dir)
        .env("NODUS_SERVER", server)
        .env("NODUS_TOKEN", token)
        .env("NODUS_PROJECT", project)
        .args(args)
        .output()
        .expect("nodus runs")
}

fn succeeded(output: &Output, what: &str) -> String {
    assert!(
        output.status.success(),
        "{what} failed with {}:\nstdout: {}\nstderr: {}",
        output.status,
        text(&output.stdout),
        text(&output.stderr)
    );
    text(&output.stdout)
}

/// The command failed, and its standard error says `needle`.
fn refused(output: &Output, needle: &str, what: &str) {
    let stderr = text(&output.stderr);
    assert!(
        !output.status.success() && stderr.contains(needle),
        "{what}: expected a refusal saying {needle:?}, got {}:\nstdout: {}\nstderr: {stderr}",
        output.status,
        text(&output.stdout)
    );
}

fn agent_file(dir: &Path, name: &str) -> String {
    let path = dir.join(format!("{name}.yaml"));
    let agent = std::fs::read_to_string(format!("{ROOT}/examples/agent.yaml"))
        .expect("examples/agent.yaml")
        .replace("name: hello-agent", &format!("name: {name}"));
    std::fs::write(&path, agent).expect("write the agent");
    path.display().to_string()
}

#[test]
fn two_projects_with_their_own_tokens_through_the_cli() {
    let dir = tempfile::tempdir().expect("tempdir");
    let dir = dir.path();
    let server = start_server(dir, Some("memory:"), "unisolated");
    let url = server.url();
    login(dir, &server);

    // The operator (the bootstrap token) makes the projects and their first tokens.
    assert_eq!(
        ok(dir, &["create", "project", "team-a"]),
        "project/team-a created\n"
    );
    assert_eq!(
        ok(dir, &["create", "project", "team-b"]),
        "project/team-b created\n"
    );
    let token = |project: &str, name: &str, role: &str, extra: &[&str]| -> String {
        let mut args = vec![
            "--project",
            project,
            "create",
            "token",
            name,
            "--role",
            role,
        ];
        args.extend_from_slice(extra);
        let output = support::nodus(dir, &args);
        let secret = succeeded(&output, "create token").trim().to_string();
        assert!(
            secret.starts_with("nodus_") && !secret.contains('\n'),
            "{secret:?}"
        );
        let note = text(&output.stderr);
        assert!(
            note.contains(&format!(
                "token/{name} created in project {project} (role {role}"
            )),
            "{note}"
        );
        assert!(
            !note.contains(&secret),
            "the secret is printed once, on stdout"
        );
        secret
    };
    let a_admin = token("team-a", "boss", "admin", &[]);
    let a_write = token("team-a", "builder", "write", &["--expires", "30d"]);
    let a_read = token("team-a", "viewer", "read", &[]);
    let b_admin = token("team-b", "boss", "admin", &[]);

    // Bad input: each names what is wrong, and nothing is made.
    refused(
        &support::nodus(
            dir,
            &[
                "--project",
                "team-a",
                "create",
                "token",
                "x",
                "--role",
                "owner",
            ],
        ),
        "--role",
        "a bad role",
    );
    for (args, field) in [
        (
            vec![
                "--project",
                "team-a",
                "create",
                "token",
                "x",
                "--role",
                "read",
                "--expires",
                "30y",
            ],
            "spec.expires",
        ),
        (
            vec![
                "--project",
                "team-a",
                "create",
                "token",
                "Not_A_Label",
                "--role",
                "read",
            ],
            "metadata.name",
        ),
        (
            vec![
                "--project",
                "nowhere",
                "create",
                "token",
                "x",
                "--role",
                "read",
            ],
            "project",
        ),
        (vec!["create", "project", "Team_C"], "metadata.name"),
    ] {
        refused(&support::nodus(dir, &args), field, &format!("{args:?}"));
    }

    // A team's token logs in to its own project without naming it.
    let member = dir.join("member");
    std::fs::create_dir_all(&member).expect("a home");
    let logged = ok(&member, &["login", "--server", &url, "--token", &a_read]);
    assert!(
        logged.starts_with(&format!("Logged in to {url} (project team-a)")),
        "{logged}"
    );
    let a = |token: &str, args: &[&str]| as_token(dir, &url, token, "team-a", args);
    let b = |token: &str, args: &[&str]| as_token(dir, &url, token, "team-b", args);

    // Each project's own resources, written by its write and admin tokens.
    let file_a = agent_file(dir, "agent-a");
    let file_b = agent_file(dir, "agent-b");
    assert_eq!(
        succeeded(&a(&a_write, &["apply", "-f", &file_a]), "apply in team-a"),
        "agent.nodus.dev/agent-a created\n"
    );
    succeeded(&b(&b_admin, &["apply", "-f", &file_b]), "apply in team-b");
    let listed = succeeded(&a(&a_read, &["get", "agents", "-o", "name"]), "get agents");
    assert_eq!(listed, "agent.nodus.dev/agent-a\n");
    assert_eq!(
        ok(&member, &["get", "agents", "-o", "name"]),
        "agent.nodus.dev/agent-a\n"
    );
    let listed = succeeded(&b(&b_admin, &["get", "agents", "-o", "name"]), "get agents");
    assert_eq!(listed, "agent.nodus.dev/agent-b\n");
    // …and nothing of the other's.
    refused(
        &a(&a_admin, &["--project", "team-b", "get", "agents"]),
        "does not hold project \"team-b\"",
        "a reads b",
    );
    refused(
        &b(
            &b_admin,
            &["--project", "team-a", "get", "agent", "agent-a"],
        ),
        "does not hold project \"team-a\"",
        "b reads a",
    );
    refused(
        &a(
            &a_admin,
            &[
                "--project",
                "team-b",
                "create",
                "token",
                "mine",
                "--role",
                "admin",
            ],
        ),
        "does not hold project",
        "a makes b's token",
    );
    assert_eq!(
        succeeded(&a(&a_admin, &["get", "projects", "-o", "name"]), "projects"),
        "project/team-a\n"
    );
    assert_eq!(
        ok(dir, &["get", "projects", "-o", "name"]),
        "project/default\nproject/nodus\nproject/team-a\nproject/team-b\n",
        "the operator sees every project"
    );
    refused(
        &a(&a_admin, &["create", "project", "team-c"]),
        "operator token",
        "a project admin makes a project",
    );

    // Roles: read cannot write; write cannot manage credits, budgets or tokens.
    refused(
        &a(&a_read, &["delete", "agent", "agent-a"]),
        "role is read",
        "read deletes",
    );
    let file_r = agent_file(dir, "agent-r");
    refused(
        &a(&a_read, &["apply", "-f", &file_r]),
        "role is read",
        "read applies",
    );
    refused(
        &a(&a_write, &["credits", "add", "1.00"]),
        "role is write",
        "write adds credits",
    );
    refused(
        &a(&a_write, &["get", "tokens"]),
        "role is write",
        "write lists tokens",
    );
    refused(
        &a(&a_write, &["create", "token", "x", "--role", "read"]),
        "role is write",
        "write makes tokens",
    );
    succeeded(
        &a(&a_admin, &["credits", "add", "1.00"]),
        "admin adds credits",
    );

    // The admin's view of the tokens: names, roles, expiry; never a secret.
    let table = succeeded(&a(&a_admin, &["get", "tokens"]), "get tokens");
    let rows: Vec<Vec<&str>> = table
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(
        rows[0],
        ["NAME", "PROJECTS", "ROLE", "EXPIRES", "AGE"],
        "{table}"
    );
    let row = |name: &str| {
        rows.iter()
            .find(|r| r[0] == name)
            .cloned()
            .unwrap_or_default()
    };
    assert_eq!(
        row("boss")[..4],
        ["boss", "team-a", "admin", "never"],
        "{table}"
    );
    assert_eq!(
        row("viewer")[..4],
        ["viewer", "team-a", "read", "never"],
        "{table}"
    );
    assert_eq!(
        row("builder")[..4],
        ["builder", "team-a", "write", "in"],
        "{table}"
    );
    let wide = succeeded(
        &a(&a_admin, &["get", "tokens", "-o", "wide"]),
        "get tokens -o wide",
    );
    let header: Vec<&str> = wide
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    assert_eq!(
        header,
        [
            "NAME",
            "PROJECTS",
            "ROLE",
            "EXPIRES",
            "AGE",
            "EXPIRES-AT",
            "CREATED"
        ]
    );
    let boss = wide
        .lines()
        .find(|l| l.starts_with("boss "))
        .unwrap_or_default();
    assert!(boss.contains("<none>") && boss.contains('T'), "{wide}");
    let json = succeeded(
        &a(&a_admin, &["get", "tokens", "-o", "json"]),
        "get tokens -o json",
    );
    for secret in [&a_admin, &a_write, &a_read, &b_admin] {
        assert!(!json.contains(secret.as_str()) && !table.contains(secret.as_str()));
    }
    assert!(!json.contains("tokenHash"), "{json}");

    // A deleted token is refused on its next request.
    assert_eq!(
        succeeded(&a(&a_admin, &["delete", "token", "viewer"]), "delete token"),
        "token/viewer deleted\n"
    );
    refused(
        &a(&a_read, &["get", "agents"]),
        "Unauthorized",
        "a deleted token",
    );
    // An expired one too.
    let brief = token("team-a", "brief", "read", &["--expires", "1s"]);
    std::thread::sleep(std::time::Duration::from_millis(1500));
    refused(
        &a(&brief, &["get", "agents"]),
        "expired",
        "an expired token",
    );
    let table = succeeded(&a(&a_admin, &["get", "token", "brief"]), "get token brief");
    assert!(table.contains("expired"), "{table}");
    drop(server);
    let _ = TOKEN;
}

//! Lists in pages through the real `nodus server` on SQLite and on Postgres: `limit` and
//! `continue` over REST (creation order, each object once while others are created, tokens
//! of another list or forged refused with a 400 naming the parameter), and `nodus get` reading
//! in chunks and printing the first N with `--limit`.

#[path = "support/server.rs"]
mod server;

use serde_json::{Value, json};
use server::{Backend, ServerProcess, TOKEN};

const AGENTS: &str = "/apis/nodus.dev/v1/projects/default/agents";

fn create_agent(server: &ServerProcess, name: &str, team: &str) {
    let agent = json!({
        "apiVersion": "nodus.dev/v1",
        "kind": "Agent",
        "metadata": {"name": name, "labels": {"team": team}},
        "spec": {"system": "You help.", "model": {"access": "Nodus"}},
    });
    let (status, body) = server.http("POST", AGENTS, Some(TOKEN), Some(&agent.to_string()));
    assert_eq!(status, 201, "create {name}: {body}");
}

fn get(server: &ServerProcess, path: &str) -> (u16, Value) {
    server.http("GET", path, Some(TOKEN), None)
}

fn names(list: &Value) -> Vec<String> {
    list["items"]
        .as_array()
        .expect("items")
        .iter()
        .map(|item| {
            item["metadata"]["name"]
                .as_str()
                .expect("a name")
                .to_string()
        })
        .collect()
}

/// Pages through `path` (which has a query) by `limit`: the names, page by page.
fn pages(server: &ServerProcess, path: &str, limit: usize) -> Vec<Vec<String>> {
    let mut pages = Vec::new();
    let mut token: Option<String> = None;
    loop {
        let mut url = format!("{path}&limit={limit}");
        if let Some(token) = &token {
            url.push_str(&format!("&continue={token}"));
        }
        let (status, page) = get(server, &url);
        assert_eq!(status, 200, "{url}: {page}");
        let listed = names(&page);
        assert!(listed.len() <= limit, "{url}: {page}");
        pages.push(listed);
        match page["metadata"]["continue"].as_str() {
            Some(next) => token = Some(next.to_string()),
            None => return pages,
        }
    }
}

fn pages_walk(backend: Backend) {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = backend.store_url(dir.path());
    let server = ServerProcess::start(&store, dir.path(), "process");
    let created: Vec<String> = (0..7).map(|n| format!("agent-{n}")).collect();
    for (n, name) in created.iter().enumerate() {
        create_agent(&server, name, if n % 2 == 0 { "red" } else { "blue" });
    }

    // Without limit, all of them in one answer, as before: no continue.
    let (status, all) = get(&server, AGENTS);
    assert_eq!(status, 200, "{all}");
    assert_eq!(names(&all), created);
    assert!(all["metadata"].get("continue").is_none(), "{all}");

    // Every size pages through the same list in creation order; continue only while more
    // remain (7 by 7 is one page, with no continue).
    for limit in [1, 2, 3, 7, 1000] {
        let pages = pages(&server, &format!("{AGENTS}?"), limit);
        assert_eq!(pages.len(), created.len().div_ceil(limit), "by {limit}");
        assert_eq!(pages.concat(), created, "by {limit}");
    }
    let red = pages(&server, &format!("{AGENTS}?labelSelector=team%3Dred"), 3);
    assert_eq!(
        red,
        [vec!["agent-0", "agent-2", "agent-4"], vec!["agent-6"]]
    );

    // An agent created while paging appears once, after the ones before it.
    let (_, first) = get(&server, &format!("{AGENTS}?limit=4"));
    assert_eq!(names(&first), created[..4]);
    let token = first["metadata"]["continue"]
        .as_str()
        .expect("more remain")
        .to_string();
    create_agent(&server, "late", "red");
    let (status, rest) = get(&server, &format!("{AGENTS}?limit=10&continue={token}"));
    assert_eq!(status, 200, "{rest}");
    assert_eq!(names(&rest), ["agent-4", "agent-5", "agent-6", "late"]);
    assert!(rest["metadata"].get("continue").is_none(), "{rest}");
    // continue without limit: all the rest.
    let (status, rest) = get(&server, &format!("{AGENTS}?continue={token}"));
    assert_eq!(status, 200, "{rest}");
    assert_eq!(names(&rest), ["agent-4", "agent-5", "agent-6", "late"]);

    // Bad limits are a 400 naming the parameter, the rule and the value.
    for bad in ["0", "1001", "ten", "-1"] {
        let (status, body) = get(&server, &format!("{AGENTS}?limit={bad}"));
        assert_eq!(status, 400, "limit={bad}: {body}");
        assert_eq!(body["reason"], "Invalid", "{body}");
        assert_eq!(body["details"]["field"], "limit", "{body}");
        assert_eq!(body["details"]["value"], format!("{bad:?}"), "{body}");
        assert!(
            body["details"]["rule"]
                .as_str()
                .unwrap_or_default()
                .contains("1 to 1000"),
            "{body}"
        );
    }
    // The token of another list (kind, selector, project) or a forged one is refused.
    let (status, created_project) = server.http(
        "POST",
        "/apis/nodus.dev/v1/projects",
        Some(TOKEN),
        Some(r#"{"metadata":{"name":"other"}}"#),
    );
    assert!(status == 201 || status == 200, "{created_project}");
    let (_, red_page) = get(
        &server,
        &format!("{AGENTS}?labelSelector=team%3Dred&limit=1"),
    );
    let red_token = red_page["metadata"]["continue"].as_str().expect("more red");
    let (mac_free, _) = token.split_once('.').expect("position.mac");
    for other in [
        format!("/apis/nodus.dev/v1/projects/default/agentruns?limit=2&continue={token}"),
        format!("/apis/nodus.dev/v1/projects/other/agents?limit=2&continue={token}"),
        format!("{AGENTS}?labelSelector=team%3Dblue&limit=2&continue={token}"),
        format!("{AGENTS}?limit=2&continue={red_token}"),
        format!("{AGENTS}?limit=2&continue=0.{}", "0".repeat(32)),
        format!("{AGENTS}?limit=2&continue={mac_free}"),
        format!("{AGENTS}?limit=2&continue=garbage"),
    ] {
        let (status, body) = get(&server, &other);
        assert_eq!(status, 400, "{other}: {body}");
        assert_eq!(body["details"]["field"], "continue", "{other}: {body}");
        assert!(body.get("items").is_none(), "{other}: {body}");
    }
    // A watch answers the whole list: limit with watch=true is refused.
    let version = all["metadata"]["resourceVersion"]
        .as_str()
        .expect("a version");
    let (status, body) = get(
        &server,
        &format!("{AGENTS}?watch=true&resourceVersion={version}&limit=2"),
    );
    assert_eq!(
        (status, &body["details"]["field"]),
        (400, &json!("limit")),
        "{body}"
    );

    // The CLI reads in chunks and prints them all; --limit prints the first N.
    let everything: Vec<String> = created
        .iter()
        .cloned()
        .chain(["late".to_string()])
        .collect();
    let listed = |args: &[&str]| -> Vec<String> {
        let mut all = vec!["get", "agents", "-o", "name"];
        all.extend(args);
        server
            .ok(&all)
            .lines()
            .map(|line| line.trim_start_matches("agent.nodus.dev/").to_string())
            .collect()
    };
    assert_eq!(listed(&[]), everything);
    assert_eq!(listed(&["--chunk-size", "3"]), everything);
    assert_eq!(listed(&["--chunk-size", "1"]), everything);
    assert_eq!(
        listed(&["--limit", "5", "--chunk-size", "2"]),
        everything[..5]
    );
    assert_eq!(listed(&["--limit", "3"]), everything[..3]);
    assert_eq!(
        listed(&["--limit", "3", "-l", "team=blue"]),
        ["agent-1", "agent-3", "agent-5"]
    );
    let json = server.ok(&["get", "agents", "-o", "json", "--chunk-size", "2"]);
    let json: Value = serde_json::from_str(&json).expect("json");
    assert_eq!(names(&json), everything);
    assert!(json["metadata"].get("continue").is_none(), "{json}");
    let refused = server.fails(&["get", "agents", "--chunk-size", "1001"]);
    assert!(refused.contains("1001"), "{refused}");
}

#[test]
fn lists_in_pages_on_sqlite() {
    pages_walk(Backend::Sqlite);
}

#[test]
fn lists_in_pages_on_postgres() {
    pages_walk(Backend::Postgres);
}

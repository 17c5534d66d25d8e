//! A run's log through a real `nodus server` and the CLI: `GET …/logs` answers the recorded
//! output cut by `tailLines` and `sinceSeconds` (bad values named), and `nodus agentrun logs
//! --tail N` prints the last lines of what `logs` prints.

#[path = "support/server.rs"]
mod server;

use server::{Backend, ServerProcess};

const AGENT: &str = "apiVersion: nodus.dev/v1\nkind: Agent\nmetadata:\n  name: worker\nspec:\n  system: You are a careful assistant.\n  perRunMaxCostUSD: \"0.50\"\n";

#[test]
fn logs_answer_the_last_lines_and_the_recent_steps() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Backend::Sqlite.store_url(dir.path());
    let server = ServerProcess::start(&store, dir.path(), "unisolated");
    let output = server.cli_in(&["apply", "-f", "-"], Some(AGENT));
    assert!(output.status.success(), "{output:?}");
    server.ok(&[
        "create",
        "agentrun",
        "counted",
        "--agent",
        "worker",
        "--prompt",
        "Run `for i in 1 2 3 4 5; do echo line-$i; done` and tell me.",
    ]);
    server.ok(&[
        "wait",
        "agentrun/counted",
        "--for=jsonpath={.status.phase}=Succeeded",
        "--timeout=2m",
    ]);
    let path = "/apis/nodus.dev/v1/projects/default/agentruns/counted/logs";
    let lines = |query: &str| -> Vec<String> {
        let (status, body) = server.http_with("GET", &format!("{path}{query}"), &[], None);
        assert_eq!(status, 200, "{query}: {body}");
        let text = body
            .as_str()
            .map(str::to_string)
            .unwrap_or_else(|| body.to_string());
        text.lines()
            .map(|line| {
                let line: serde_json::Value = serde_json::from_str(line).expect("a JSON line");
                line["bytes"].as_str().expect("text").to_string()
            })
            .collect()
    };
    let all = lines("");
    assert!(all.contains(&"line-1\n".to_string()), "{all:?}");
    assert_eq!(lines("?tailLines=2"), all[all.len() - 2..].to_vec());
    assert_eq!(lines("?tailLines=0"), Vec::<String>::new());
    assert_eq!(lines("?sinceSeconds=3600"), all);
    for (query, parameter, value) in [
        ("?tailLines=-2", "tailLines", "\"-2\""),
        ("?sinceSeconds=0", "sinceSeconds", "\"0\""),
        ("?follow=true&sinceSeconds=5m", "sinceSeconds", "\"5m\""),
    ] {
        let (status, body) = server.http_with("GET", &format!("{path}{query}"), &[], None);
        assert_eq!(status, 422, "{query}: {body}");
        assert_eq!(body["details"]["field"], parameter, "{body}");
        assert_eq!(body["details"]["value"], value, "{body}");
        assert!(
            body["details"]["rule"]
                .as_str()
                .is_some_and(|r| !r.is_empty())
        );
    }

    // The CLI: the last lines of what it prints, and all of it for a recent --since.
    let printed = server.ok(&["agentrun", "logs", "counted"]);
    let last: Vec<&str> = printed.lines().collect();
    assert!(last.len() > 3, "{printed}");
    let tail = server.ok(&["agentrun", "logs", "counted", "--tail", "3"]);
    assert_eq!(
        tail.lines().collect::<Vec<_>>(),
        last[last.len() - 3..].to_vec()
    );
    assert_eq!(
        server.ok(&["agentrun", "logs", "counted", "--since", "1h"]),
        printed
    );
    let followed = server.ok(&["agentrun", "logs", "counted", "-f", "--tail", "1"]);
    assert_eq!(
        followed.lines().collect::<Vec<_>>(),
        [last[last.len() - 1], "agentrun/counted Succeeded"]
    );
}

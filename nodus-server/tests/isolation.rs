//! Isolation on every route: every path × method of the served `/openapi.json`, pointed at
//! project A's real objects with valid bodies, is called with an admin token of project B,
//! with no token and with a wrong token. Each is refused (401/403/404), no body shows
//! anything of A's that the caller did not name, and nothing is written.

mod support;

use axum::http::{Method, StatusCode};
use serde_json::{Value, json};
use support::{Api, agent, api};

const OPERATOR: &str = support::TOKEN;
const ROOT: &str = support::BASE;
const A: &str = "alpha-iso";
const B: &str = "bravo-iso";
const WRONG: &str = "nodus_wrong_token_00000000000000000000";

/// A's objects: the real name behind `{name}` for each collection.
fn name_of(plural: &str) -> &'static str {
    match plural {
        "agents" => "aardvark-agent",
        "agentruns" => "aardvark-run",
        "agentgroups" => "aardvark-group",
        "secrets" => "aardvark-secret",
        "budgets" => "aardvark-budget",
        "filesets" => "aardvark-files",
        "agentenvironments" => "aardvark-agentenv",
        "environments" => "aardvark-env@1.0.0",
        "tokens" => "aardvark-boss",
        other => panic!("the test does not know the collection {other}"),
    }
}

/// What A holds that no one but A may see: names, a Secret's value, a file's content, the
/// run's input and answer, the agent's prompt, the budget's amount.
const DISTINCTIVE: &[&str] = &[
    "aardvark-agent",
    "aardvark-run",
    "aardvark-group",
    "aardvark-secret",
    "aardvark-budget",
    "aardvark-files",
    "aardvark-env",
    "aardvark-agentenv",
    "aardvark-hidden-6464",
    "aardvark-boss",
    "aardvark-secret-value-9931",
    "aardvark-file-content-5521",
    "aardvark-answer-4242",
    "aardvark-prompt-3317",
    "7.77",
];

/// A valid object of the collection's kind named `name`.
fn object(plural: &str, name: &str) -> Value {
    let meta = json!({"name": name});
    match plural {
        "agents" => agent(name),
        "agentruns" => json!({"apiVersion": "nodus.dev/v1", "kind": "AgentRun", "metadata": meta,
                              "spec": {"agent": "aardvark-agent", "input": "Run `echo new` and tell me."}}),
        "agentgroups" => {
            json!({"apiVersion": "nodus.dev/v1", "kind": "AgentGroup", "metadata": meta,
                                "spec": {"agent": "aardvark-agent", "limits": {"maxActive": 2}, "maxCostUSD": "0.60"}})
        }
        "secrets" => json!({"apiVersion": "nodus.dev/v1", "kind": "Secret", "metadata": meta,
                            "stringData": {"KEY": "other"}}),
        "budgets" => json!({"apiVersion": "nodus.dev/v1", "kind": "Budget", "metadata": meta,
                            "spec": {"maxSpendUSD": "3.00"}}),
        "filesets" => json!({"apiVersion": "nodus.dev/v1", "kind": "FileSet", "metadata": meta,
                             "spec": {"files": [{"path": "other.txt", "content": "other"}]}}),
        "agentenvironments" => json!({"apiVersion": "nodus.dev/v1", "kind": "AgentEnvironment",
                                      "metadata": meta, "spec": {"env": [{"name": "OTHER", "value": "x"}]}}),
        // An Environment is addressed as NAME@VERSION.
        "environments" => environment(name.split('@').next().unwrap_or(name), "other"),
        other => panic!("the test does not know the collection {other}"),
    }
}

/// An Environment version 1.0.0 named `name` whose one task hides `hidden`.
fn environment(name: &str, hidden: &str) -> Value {
    json!({"apiVersion": "nodus.dev/v1", "kind": "Environment", "metadata": {"name": name},
           "spec": {"version": "1.0.0", "grader": {"kind": "exact"},
                    "splits": {"test": {"tasks": [{"id": "t", "prompt": "Say it.",
                                                   "hidden": {"expected": hidden}}]}}}})
}

/// The body a route would accept from a caller it admits, so a refusal is due to the token.
fn body_for(path: &str, method: &Method, plural: Option<&str>) -> Option<Value> {
    match (method.as_str(), path.rsplit('/').next().unwrap_or_default()) {
        ("POST", "messages") => Some(json!({"payload": "hi", "messageKey": "k-iso"})),
        ("POST", "resolve") => Some(json!({"action": "retry"})),
        ("POST", "cancel" | "close") => None,
        ("POST", "credits") => Some(json!({"addUSD": "1.00"})),
        ("POST", "tokens") => {
            Some(json!({"metadata": {"name": "intruder"}, "spec": {"role": "admin"}}))
        }
        ("POST", "projects") => Some(json!({"metadata": {"name": "charlie-iso"}})),
        ("POST", _) => plural.map(|p| object(p, "intruder")),
        ("PUT", _) => plural.map(|p| object(p, name_of(p))),
        ("PATCH", _) => Some(json!({"metadata": {"labels": {"intruder": "yes"}}})),
        _ => None,
    }
}

/// Everything A and B hold, as their own admins and the operator see it, resourceVersions
/// included: any write shows as a difference.
async fn snapshot(api: &Api, plurals: &[String], a: &str, b: &str) -> Value {
    let mut all = serde_json::Map::new();
    for (project, token) in [(A, a), (B, b)] {
        let p = format!("{ROOT}/{project}");
        for plural in plurals.iter().map(String::as_str).chain(["tokens"]) {
            all.insert(
                format!("{project}/{plural}"),
                api.ok(Method::GET, &format!("{p}/{plural}"), token, None)
                    .await,
            );
        }
        all.insert(
            format!("{project}/credits"),
            api.ok(Method::GET, &format!("{p}/credits"), token, None)
                .await,
        );
    }
    let run = format!("{ROOT}/{A}/agentruns/aardvark-run");
    for sub in ["steps", "answer"] {
        all.insert(
            format!("run/{sub}"),
            api.ok(Method::GET, &format!("{run}/{sub}"), a, None).await,
        );
    }
    all.insert(
        "projects".into(),
        api.ok(Method::GET, ROOT, OPERATOR, None).await,
    );
    Value::Object(all)
}

#[tokio::test]
async fn every_documented_route_refuses_another_project_no_token_and_a_wrong_token() {
    let api = api().await;
    for project in [A, B] {
        api.ok(
            Method::POST,
            ROOT,
            OPERATOR,
            Some(json!({"metadata": {"name": project}})),
        )
        .await;
    }
    let token = |project: &str, name: &str| {
        let path = format!("{ROOT}/{project}/tokens");
        let body = json!({"metadata": {"name": name}, "spec": {"role": "admin"}});
        let api = &api;
        async move {
            let created = api.ok(Method::POST, &path, OPERATOR, Some(body)).await;
            created["token"].as_str().expect("the secret").to_string()
        }
    };
    let a = token(A, "aardvark-boss").await;
    let b = token(B, "bravo-boss").await;

    // A's objects, each with something only A should ever see.
    let p = format!("{ROOT}/{A}");
    api.ok(
        Method::POST,
        &format!("{p}/credits"),
        &a,
        Some(json!({"addUSD": "5.00"})),
    )
    .await;
    let mut agent_a = agent("aardvark-agent");
    agent_a["spec"]["system"] = json!("You are aardvark-prompt-3317.");
    api.ok(Method::POST, &format!("{p}/agents"), &a, Some(agent_a))
        .await;
    for (plural, body) in [
        (
            "secrets",
            json!({"apiVersion": "nodus.dev/v1", "kind": "Secret", "metadata": {"name": "aardvark-secret"},
                   "stringData": {"TOKEN": "aardvark-secret-value-9931"}}),
        ),
        (
            "filesets",
            json!({"apiVersion": "nodus.dev/v1", "kind": "FileSet", "metadata": {"name": "aardvark-files"},
                   "spec": {"files": [{"path": "notes.txt", "content": "aardvark-file-content-5521"}]}}),
        ),
        (
            "budgets",
            json!({"apiVersion": "nodus.dev/v1", "kind": "Budget", "metadata": {"name": "aardvark-budget"},
                   "spec": {"maxSpendUSD": "7.77"}}),
        ),
        (
            "agentenvironments",
            object("agentenvironments", "aardvark-agentenv"),
        ),
        ("agentgroups", object("agentgroups", "aardvark-group")),
        (
            "environments",
            environment("aardvark-env", "aardvark-hidden-6464"),
        ),
        (
            "agentruns",
            json!({"apiVersion": "nodus.dev/v1", "kind": "AgentRun", "metadata": {"name": "aardvark-run"},
                   "spec": {"agent": "aardvark-agent",
                            "input": "Run `echo aardvark-answer-4242` and tell me what it printed.",
                            "workdir": {"baseWorkdir": "aardvark-files"}}}),
        ),
    ] {
        api.ok(Method::POST, &format!("{p}/{plural}"), &a, Some(body))
            .await;
    }
    let runner = nodus_core::runner::Runner::start(
        api.state.engine.clone(),
        nodus_core::runner::RunnerConfig::default(),
    );
    let settled = runner.settled(A, "aardvark-run").await.expect("settled");
    runner.shutdown().await;
    assert_eq!(
        settled.status.phase,
        Some(nodus_core::lifecycle::RunPhase::Succeeded)
    );
    let answer = api
        .ok(
            Method::GET,
            &format!("{p}/agentruns/aardvark-run/answer"),
            &a,
            None,
        )
        .await;
    assert!(
        answer["answer"]
            .as_str()
            .is_some_and(|a| a.lines().any(|l| l == "aardvark-answer-4242")),
        "the run has its known answer, the command's output line: {answer}"
    );

    // The routes as the server documents them.
    let (status, document) = api.call(Method::GET, "/openapi.json", None, None).await;
    assert_eq!(status, StatusCode::OK);
    let paths = document["paths"].as_object().expect("paths").clone();
    // Each kind has its own collection path, `…/{project}/PLURAL`.
    let in_a_project = "/apis/nodus.dev/v1/projects/{project}/";
    let plurals: Vec<String> = paths
        .keys()
        .filter_map(|path| path.strip_prefix(in_a_project))
        .filter(|rest| !rest.contains('/') && !["tokens", "credits"].contains(rest))
        .map(str::to_string)
        .collect();
    assert_eq!(plurals.len(), 8, "the collections: {plurals:?}");
    let before = snapshot(&api, &plurals, &a, &b).await;
    for plural in plurals.iter().map(String::as_str).chain(["tokens"]) {
        let listed = before[format!("{A}/{plural}")].to_string();
        // An Environment lists its name and version apart (NAME@VERSION is its key).
        let name = name_of(plural).split('@').next().unwrap_or_default();
        assert!(
            listed.contains(name) && listed.contains("resourceVersion")
                || plural == "tokens" && listed.contains(name),
            "the snapshot holds A's {plural}: {listed}"
        );
    }

    let mut calls = 0;
    for (template, item) in &paths {
        let methods: Vec<Method> = item
            .as_object()
            .expect("a path item")
            .keys()
            .filter(|key| *key != "parameters")
            .map(|key| Method::from_bytes(key.to_uppercase().as_bytes()).expect("a method"))
            .collect();
        let in_project = template.contains("{project}");
        // The collection a path is in names the object its {name} is filled with.
        let collection = template
            .strip_prefix(in_a_project)
            .and_then(|rest| rest.split('/').next());
        {
            let mut path = template.replace("{project}", A);
            if let Some(plural) = collection.filter(|_| template.contains("{name}")) {
                path = path
                    .replace("{name}", name_of(plural))
                    .replace("{result}", "runRecord");
            }
            // Outside a project ({name} of a replica): a name no one holds, refused before any
            // lookup to every caller of this test (none is the operator).
            path = path.replace("{name}", "aardvark-replica");
            assert!(!path.contains('{'), "{template}: unfilled parameter");
            // A method the router takes on this path but the document does not list would
            // escape the loop below: every other method must be one the router refuses.
            for method in [
                Method::GET,
                Method::POST,
                Method::PUT,
                Method::PATCH,
                Method::DELETE,
            ] {
                if methods.contains(&method) {
                    continue;
                }
                let (status, answer) = api.call(method.clone(), &path, Some(&b), None).await;
                assert_eq!(
                    (status, answer["reason"].as_str()),
                    (StatusCode::METHOD_NOT_ALLOWED, Some("MethodNotAllowed")),
                    "{method} {path}: the router takes a method the document does not list: {answer}"
                );
            }
            for method in &methods {
                let body = body_for(
                    &path,
                    method,
                    collection.filter(|p| !["tokens", "credits"].contains(p)),
                );
                for (who, token) in [
                    ("B's admin", Some(b.as_str())),
                    ("no token", None),
                    ("a wrong token", Some(WRONG)),
                ] {
                    calls += 1;
                    let label = format!("{method} {path} with {who}");
                    let (status, answer) =
                        api.call(method.clone(), &path, token, body.clone()).await;
                    let text = answer.to_string();
                    for word in
                        DISTINCTIVE
                            .iter()
                            .chain(if in_project { &[][..] } else { &[A][..] })
                    {
                        assert!(
                            path.contains(word) || !text.contains(word),
                            "{label}: {word} of {A} in the answer {status} {text}"
                        );
                    }
                    let refused = [
                        StatusCode::UNAUTHORIZED,
                        StatusCode::FORBIDDEN,
                        StatusCode::NOT_FOUND,
                    ]
                    .contains(&status);
                    match (template.as_str(), who) {
                        ("/healthz" | "/openapi.json", _) => {
                            assert_eq!(status, StatusCode::OK, "{label}: {text}");
                        }
                        ("/metrics", "B's admin" | "no token") => {
                            assert_eq!(status, StatusCode::OK, "{label}: {text}");
                            // A has the only run: B's counters and the anonymous ones show none.
                            assert!(!text.contains("nodus_runs{"), "{label}: {text}");
                        }
                        (_, "no token" | "a wrong token") => {
                            assert_eq!(status, StatusCode::UNAUTHORIZED, "{label}: {text}");
                        }
                        ("/apis/nodus.dev/v1/postrunactions", "B's admin") => {
                            // What the server installs: the same for every token.
                            assert_eq!(status, StatusCode::OK, "{label}: {text}");
                        }
                        (ROOT, _) if *method == Method::GET => {
                            // B's own projects: B, never A.
                            assert_eq!(status, StatusCode::OK, "{label}: {text}");
                            assert!(text.contains(B), "{label}: {text}");
                        }
                        _ => assert!(refused, "{label}: {status} {text}"),
                    }
                }
            }
        }
    }
    assert!(calls > 100, "every route was called: {calls} calls");

    let after = snapshot(&api, &plurals, &a, &b).await;
    assert_eq!(before, after, "a refused call wrote something");
}

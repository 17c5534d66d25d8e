//! The API's handlers without a socket (`oneshot`): auth, bad input, resources, runs,
//! batches, secrets and credits, over the in-memory store and the unisolated sandbox.

mod support;

use axum::body::Body;
use axum::http::{Method, Request, StatusCode, header};
use nodus_core::testing::Drive;
use serde_json::{Value, json};
use support::{Api, BASE, TOKEN, agent, api};
use tower::ServiceExt;

impl Api {
    async fn runs(&self) -> usize {
        let (_, list) = self
            .call(
                Method::GET,
                &format!("{BASE}/default/agentruns"),
                Some(TOKEN),
                None,
            )
            .await;
        list["items"].as_array().map_or(0, Vec::len)
    }
}

fn run(name: &str, input: &str) -> Value {
    json!({"apiVersion": "nodus.dev/v1", "kind": "AgentRun", "metadata": {"name": name},
           "spec": {"agent": "hello-agent", "input": input}})
}

#[tokio::test]
async fn tokens_are_required_and_bound_to_their_projects() {
    let api = api().await;
    let path = format!("{BASE}/default/agents");
    let (status, body) = api.call(Method::GET, &path, None, None).await;
    assert_eq!(
        (status, body["reason"].as_str()),
        (StatusCode::UNAUTHORIZED, Some("Unauthorized"))
    );
    let (status, body) = api
        .call(Method::GET, &path, Some("nodus_wrong"), None)
        .await;
    assert_eq!(
        (status, body["reason"].as_str()),
        (StatusCode::UNAUTHORIZED, Some("Unauthorized"))
    );
    // Another project: the same answer whether it exists or not (to a token of `default`
    // that is not the operator's, which holds every project).
    let (status, created) = api
        .call(
            Method::POST,
            &format!("{BASE}/default/tokens"),
            Some(TOKEN),
            Some(json!({"metadata": {"name": "team"}, "spec": {"role": "admin"}})),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    let team = created["token"].as_str().expect("a token");
    api.state
        .ledger
        .open("other", nodus_core::Usd::ZERO)
        .await
        .expect("project");
    let (existing, a) = api
        .call(
            Method::GET,
            &format!("{BASE}/other/agents"),
            Some(team),
            None,
        )
        .await;
    let (missing, b) = api
        .call(
            Method::GET,
            &format!("{BASE}/nowhere/agents"),
            Some(team),
            None,
        )
        .await;
    assert_eq!(existing, StatusCode::FORBIDDEN);
    assert_eq!(missing, StatusCode::FORBIDDEN);
    assert_eq!(a["reason"], b["reason"]);
    assert_eq!(
        a["message"].as_str().map(|m| m.replace("other", "X")),
        b["message"].as_str().map(|m| m.replace("nowhere", "X"))
    );
    // The template project is readable and read-only.
    let (status, body) = api
        .call(
            Method::GET,
            &format!("{BASE}/nodus/agents/claude-assistant"),
            Some(TOKEN),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, body) = api
        .call(
            Method::POST,
            &format!("{BASE}/nodus/agents"),
            Some(TOKEN),
            Some(agent("mine")),
        )
        .await;
    assert_eq!(
        (status, body["reason"].as_str()),
        (StatusCode::FORBIDDEN, Some("Forbidden"))
    );
}

#[tokio::test]
async fn bad_input_is_answered_clearly_and_nothing_is_written() {
    let api = api().await;
    let agents = format!("{BASE}/default/agents");
    let runs = format!("{BASE}/default/agentruns");
    let (status, body) = api
        .raw(
            Method::POST,
            &agents,
            Some(TOKEN),
            Some("{not json".into()),
            &[],
        )
        .await;
    assert_eq!(
        (status, body["reason"].as_str()),
        (StatusCode::BAD_REQUEST, Some("Invalid"))
    );
    let mut unknown = agent("hello-agent");
    unknown["spec"]["bogus"] = json!(1);
    let (status, body) = api
        .call(Method::POST, &agents, Some(TOKEN), Some(unknown))
        .await;
    assert_eq!(
        (status, body["reason"].as_str()),
        (StatusCode::UNPROCESSABLE_ENTITY, Some("Invalid"))
    );
    assert_eq!(body["details"]["field"], "spec.bogus", "{body}");
    let (status, body) = api
        .call(Method::POST, &agents, Some(TOKEN), Some(agent("Bad_Name")))
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(body["details"]["field"], "metadata.name", "{body}");
    let (status, _) = api
        .call(
            Method::GET,
            &format!("{agents}/hello-agent"),
            Some(TOKEN),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "nothing was written");

    let (status, _) = api
        .call(
            Method::POST,
            &agents,
            Some(TOKEN),
            Some(agent("hello-agent")),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED);
    let big = "x".repeat(256 * 1024 + 1);
    let (status, body) = api
        .call(Method::POST, &runs, Some(TOKEN), Some(run("big", &big)))
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(body["details"]["field"], "spec.input", "{body}");
    assert!(
        body["message"].as_str().is_some_and(|m| m.len() < 1000),
        "the value is shortened"
    );
    let (status, body) = api
        .call(
            Method::POST,
            &runs,
            Some(TOKEN),
            Some(run("r", "hi").tap(|r| r["spec"]["agent"] = json!("nope"))),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(api.runs().await, 0, "nothing was written");
    let (status, body) = api
        .call(
            Method::GET,
            &format!("{runs}?fieldSelector=spec.input%3Dx"),
            Some(TOKEN),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");

    // What axum answers by itself has the API's JSON shape too.
    let huge = format!("{{\"pad\": \"{}\"}}", "x".repeat(33 * 1024 * 1024));
    let (status, body) = api
        .raw(Method::POST, &runs, Some(TOKEN), Some(huge), &[])
        .await;
    assert_eq!(
        (status, body["reason"].as_str()),
        (StatusCode::PAYLOAD_TOO_LARGE, Some("Invalid")),
        "{body}"
    );
    assert!(
        body["message"].as_str().is_some_and(|m| m.contains("MiB")),
        "{body}"
    );
    let (status, body) = api
        .call(
            Method::GET,
            &format!("{runs}/x/steps?payload=maybe"),
            Some(TOKEN),
            None,
        )
        .await;
    assert_eq!(
        (status, body["reason"].as_str()),
        (StatusCode::BAD_REQUEST, Some("Invalid")),
        "{body}"
    );
    let (status, body) = api
        .call(Method::PATCH, &format!("{runs}/x/steps"), Some(TOKEN), None)
        .await;
    assert_eq!(
        (status, body["reason"].as_str()),
        (StatusCode::METHOD_NOT_ALLOWED, Some("MethodNotAllowed")),
        "{body}"
    );
    assert_eq!(api.runs().await, 0, "nothing was written");

    // An evaluation group of an Environment that does not exist is refused when it is posted
    // too (not only when applied).
    let evaluation = json!({"apiVersion": "nodus.dev/v1", "kind": "AgentGroup",
        "metadata": {"name": "eval"},
        "spec": {"agent": "hello-agent", "evaluation": {"environment": "nodus/tasks@1", "tasks": 2}}});
    let (status, body) = api
        .call(
            Method::POST,
            &format!("{BASE}/default/agentgroups"),
            Some(TOKEN),
            Some(evaluation),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(
        body["details"]["field"], "spec.evaluation.environment",
        "{body}"
    );
    let (status, _) = api
        .call(
            Method::GET,
            &format!("{BASE}/default/agentgroups/eval"),
            Some(TOKEN),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "nothing was written");

    // A run's spec is fixed once it exists: a replace with another spec says what to do
    // instead and changes nothing.
    let (status, _) = api
        .call(Method::POST, &runs, Some(TOKEN), Some(run("fixed", "hi")))
        .await;
    assert_eq!(status, StatusCode::CREATED);
    let (status, body) = api
        .call(
            Method::PUT,
            &format!("{runs}/fixed"),
            Some(TOKEN),
            Some(run("fixed", "hi").tap(|r| r["spec"]["keepAlive"] = json!(true))),
        )
        .await;
    assert_eq!(
        (status, body["reason"].as_str()),
        (StatusCode::UNPROCESSABLE_ENTITY, Some("Invalid")),
        "{body}"
    );
    assert_eq!(body["details"]["field"], "spec", "{body}");
    assert!(
        body["message"]
            .as_str()
            .is_some_and(|m| m.contains("delete the run first")),
        "{body}"
    );
    let (_, kept) = api
        .call(Method::GET, &format!("{runs}/fixed"), Some(TOKEN), None)
        .await;
    assert_eq!(kept["spec"].get("keepAlive"), None, "{kept}");
}

trait Tap: Sized {
    fn tap(self, f: impl FnOnce(&mut Self)) -> Self;
}
impl Tap for Value {
    fn tap(mut self, f: impl FnOnce(&mut Self)) -> Self {
        f(&mut self);
        self
    }
}

#[tokio::test]
async fn a_run_goes_from_create_to_answer_and_steps() {
    let api = api().await;
    let (status, _) = api
        .call(
            Method::POST,
            &format!("{BASE}/default/agents"),
            Some(TOKEN),
            Some(agent("hello-agent")),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED);
    let (status, created) = api
        .call(
            Method::POST,
            &format!("{BASE}/default/agentruns"),
            Some(TOKEN),
            Some(run(
                "hello-agent-run",
                "Run `echo hello` and tell me what it printed.",
            )),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    assert_eq!(created["status"]["phase"], "Pending");
    assert_eq!(created["status"]["cost"]["limitUSD"], "0.50");
    // The router is called without a socket here: start the engine's runner as the server
    // does when it serves.
    let runner = nodus_core::runner::Runner::start(
        api.state.engine.clone(),
        nodus_core::runner::RunnerConfig::default(),
    );
    let settled = runner
        .settled("default", "hello-agent-run")
        .await
        .expect("settled");
    runner.shutdown().await;
    assert_eq!(
        settled.status.phase,
        Some(nodus_core::lifecycle::RunPhase::Succeeded)
    );
    let (_, got) = api
        .call(
            Method::GET,
            &format!("{BASE}/default/agentruns/hello-agent-run"),
            Some(TOKEN),
            None,
        )
        .await;
    assert_eq!(got["status"]["phase"], "Succeeded");
    // The command's output line, not the quoted command (`echo hello` →) around it.
    assert!(
        got["status"]["answer"]["preview"]
            .as_str()
            .is_some_and(|a| a.lines().any(|l| l == "hello")),
        "{got}"
    );
    assert_eq!(
        got["status"]["sandbox"]["isolated"], false,
        "the unisolated sandbox says so"
    );
    let (_, answer) = api
        .call(
            Method::GET,
            &format!("{BASE}/default/agentruns/hello-agent-run/answer"),
            Some(TOKEN),
            None,
        )
        .await;
    assert!(
        answer["answer"]
            .as_str()
            .is_some_and(|a| a.lines().any(|l| l == "hello")),
        "{answer}"
    );
    let (_, steps) = api
        .call(
            Method::GET,
            &format!("{BASE}/default/agentruns/hello-agent-run/steps"),
            Some(TOKEN),
            None,
        )
        .await;
    let kinds: Vec<_> = steps["items"]
        .as_array()
        .expect("items")
        .iter()
        .map(|s| s["kind"].as_str().unwrap_or_default().to_string())
        .collect();
    assert_eq!(kinds.first().map(String::as_str), Some("SandboxCreation"));
    assert!(kinds.iter().any(|k| k == "Command"));
    let (_, credits) = api
        .call(
            Method::GET,
            &format!("{BASE}/default/credits"),
            Some(TOKEN),
            None,
        )
        .await;
    assert_eq!(
        credits["spentUSD"], got["status"]["cost"]["totalUSD"],
        "the run's spend came off the credits: {credits}"
    );
    // Messages to a finished run are refused.
    let (status, body) = api
        .call(
            Method::POST,
            &format!("{BASE}/default/agentruns/hello-agent-run/messages"),
            Some(TOKEN),
            Some(json!({"payload": "more", "messageKey": "k"})),
        )
        .await;
    assert_eq!(
        (status, body["reason"].as_str()),
        (StatusCode::CONFLICT, Some("AgentRunFinished"))
    );
}

#[tokio::test]
async fn batches_are_all_or_nothing_and_idempotent() {
    let api = api().await;
    api.call(
        Method::POST,
        &format!("{BASE}/default/agents"),
        Some(TOKEN),
        Some(agent("hello-agent")),
    )
    .await;
    let list = |count: usize| {
        json!({"apiVersion": "nodus.dev/v1", "kind": "AgentRunList",
        "items": (0..count).map(|i| run(&format!("b-{i}"), "hi")).collect::<Vec<_>>()})
    };
    let runs = format!("{BASE}/default/agentruns");
    let (status, body) = api
        .call(Method::POST, &runs, Some(TOKEN), Some(list(101)))
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(api.runs().await, 0);
    let headers = [("idempotency-key", "batch-1")];
    let (status, first) = api
        .raw(
            Method::POST,
            &runs,
            Some(TOKEN),
            Some(list(3).to_string()),
            &headers,
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{first}");
    let (status, again) = api
        .raw(
            Method::POST,
            &runs,
            Some(TOKEN),
            Some(list(3).to_string()),
            &headers,
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{again}");
    let names = |v: &Value| {
        v["items"].as_array().map(|i| {
            i.iter()
                .map(|r| r["metadata"]["name"].clone())
                .collect::<Vec<_>>()
        })
    };
    assert_eq!(names(&first), names(&again));
    assert_eq!(api.runs().await, 3);
}

#[tokio::test]
async fn secrets_are_sealed_and_never_returned() {
    let api = api().await;
    let secret = json!({"apiVersion": "nodus.dev/v1", "kind": "Secret", "metadata": {"name": "anthropic-key"},
                        "stringData": {"ANTHROPIC_API_KEY": "sk-ant-very-secret"}});
    let (status, created) = api
        .call(
            Method::POST,
            &format!("{BASE}/default/secrets"),
            Some(TOKEN),
            Some(secret),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    let (_, got) = api
        .call(
            Method::GET,
            &format!("{BASE}/default/secrets/anthropic-key"),
            Some(TOKEN),
            None,
        )
        .await;
    let (_, listed) = api
        .call(
            Method::GET,
            &format!("{BASE}/default/secrets"),
            Some(TOKEN),
            None,
        )
        .await;
    for body in [&created, &got, &listed] {
        let text = body.to_string();
        assert!(
            !text.contains("sk-ant-very-secret") && !text.contains("sealedData"),
            "{text}"
        );
    }
    assert_eq!(got["keys"], json!(["ANTHROPIC_API_KEY"]));
    let stored = || async {
        api.state
            .store
            .get(&nodus_core::store::ObjectKey::new(
                "default",
                nodus_core::resource::Kind::Secret,
                "anthropic-key",
            ))
            .await
            .expect("stored")
    };
    assert!(
        !stored()
            .await
            .document
            .to_string()
            .contains("sk-ant-very-secret"),
        "encrypted at rest"
    );
    // A merge patch keeps the values it does not name, and answers none of them.
    let values = || async {
        let stored = stored().await;
        let sealed = stored.document["sealedData"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        (
            api.state.cipher.open(&sealed).expect("opens"),
            stored.document["metadata"]["labels"].clone(),
        )
    };
    let path = format!("{BASE}/default/secrets/anthropic-key");
    for (patch, want) in [
        (
            json!({"metadata": {"labels": {"team": "infra"}}}),
            json!({"ANTHROPIC_API_KEY": "sk-ant-very-secret"}),
        ),
        (
            json!({"stringData": {"EXTRA": "two"}}),
            json!({"ANTHROPIC_API_KEY": "sk-ant-very-secret", "EXTRA": "two"}),
        ),
        (
            json!({"stringData": {"EXTRA": null}}),
            json!({"ANTHROPIC_API_KEY": "sk-ant-very-secret"}),
        ),
    ] {
        let (status, body) = api
            .call(Method::PATCH, &path, Some(TOKEN), Some(patch.clone()))
            .await;
        assert_eq!(status, StatusCode::OK, "{patch}: {body}");
        assert!(!body.to_string().contains("sk-ant-very-secret"), "{body}");
        let (values, labels) = values().await;
        assert_eq!(serde_json::to_value(values).expect("json"), want, "{patch}");
        assert_eq!(labels, json!({"team": "infra"}), "{patch}");
    }
    // A BYOK agent that names a missing secret: its runs are refused at creation.
    let byok = json!({"apiVersion": "nodus.dev/v1", "kind": "Agent", "metadata": {"name": "mine"},
        "spec": {"system": "s", "model": {"access": "BYOK", "name": "claude-sonnet-4-5", "apiKeySecret": "absent"}}});
    api.call(
        Method::POST,
        &format!("{BASE}/default/agents"),
        Some(TOKEN),
        Some(byok),
    )
    .await;
    let (status, body) = api
        .call(
            Method::POST,
            &format!("{BASE}/default/agentruns"),
            Some(TOKEN),
            Some(run("x", "hi").tap(|r| r["spec"]["agent"] = json!("mine"))),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(body["details"]["field"], "spec.model.apiKeySecret");
}

#[tokio::test]
async fn merge_patch_seals_a_group_and_refuses_lowering_its_cap() {
    let api = api().await;
    api.call(
        Method::POST,
        &format!("{BASE}/default/agents"),
        Some(TOKEN),
        Some(agent("hello-agent")),
    )
    .await;
    let group = json!({"apiVersion": "nodus.dev/v1", "kind": "AgentGroup", "metadata": {"name": "g"},
                       "spec": {"agent": "hello-agent", "limits": {"maxActive": 2}, "maxCostUSD": "0.60"}});
    let (status, body) = api
        .call(
            Method::POST,
            &format!("{BASE}/default/agentgroups"),
            Some(TOKEN),
            Some(group),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let path = format!("{BASE}/default/agentgroups/g");
    let (status, body) = api
        .call(
            Method::PATCH,
            &path,
            Some(TOKEN),
            Some(json!({"spec": {"maxCostUSD": "0.10"}})),
        )
        .await;
    assert_eq!(
        (status, body["reason"].as_str()),
        (StatusCode::CONFLICT, Some("Conflict")),
        "{body}"
    );
    let (status, body) = api
        .call(
            Method::PATCH,
            &path,
            Some(TOKEN),
            Some(json!({"spec": {"limits": {"maxActive": 4}, "sealed": true}})),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["spec"]["limits"]["maxActive"], 4);
    assert_eq!(
        body["status"]["phase"], "Succeeded",
        "a sealed empty group succeeds"
    );
    let (status, body) = api
        .call(
            Method::PATCH,
            &path,
            Some(TOKEN),
            Some(
                json!({"metadata": {"resourceVersion": "1"}, "spec": {"limits": {"maxActive": 5}}}),
            ),
        )
        .await;
    assert_eq!(
        (status, body["reason"].as_str()),
        (StatusCode::CONFLICT, Some("Conflict")),
        "a stale version is refused: {body}"
    );
}

/// A FileSet stored before its paths were checked (a component longer than file systems
/// take) fails its run when the working directory is staged; the run's message says which
/// file and why, and shows no host path: not the data directory, not the sandbox's directory.
#[tokio::test]
async fn a_run_failure_message_shows_no_host_path() {
    let api = api().await;
    let (status, _) = api
        .call(
            Method::POST,
            &format!("{BASE}/default/agents"),
            Some(TOKEN),
            Some(agent("hello-agent")),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED);
    let long = format!("src/{}", "x".repeat(300));
    api.state
        .store
        .create(
            &nodus_core::store::ObjectKey::new(
                "default",
                nodus_core::resource::Kind::FileSet,
                "legacy",
            ),
            json!({"apiVersion": "nodus.dev/v1", "kind": "FileSet",
                   "metadata": {"name": "legacy"},
                   "spec": {"files": [{"path": long, "content": "x"}]}}),
        )
        .await
        .expect("a FileSet stored under the old rules");
    let mut staged = run("staged", "Run `ls` and tell me what it printed.");
    staged["spec"]["workdir"] = json!({"baseWorkdir": "legacy"});
    let (status, created) = api
        .call(
            Method::POST,
            &format!("{BASE}/default/agentruns"),
            Some(TOKEN),
            Some(staged),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    let driven = api
        .state
        .engine
        .drive("default", "staged")
        .await
        .expect("drive");
    assert_eq!(
        driven,
        nodus_core::engine::Driven::Finished(nodus_core::lifecycle::RunPhase::Failed(
            nodus_core::lifecycle::FailReason::SandboxFailed
        ))
    );
    let (_, got) = api
        .call(
            Method::GET,
            &format!("{BASE}/default/agentruns/staged"),
            Some(TOKEN),
            None,
        )
        .await;
    let message = got["status"]["message"].as_str().expect("a message");
    assert!(message.contains("./src/xxx"), "{message}");
    assert!(message.contains("too long"), "{message}");
    let data_dir = api._dir.path().display().to_string();
    let everything = got.to_string();
    assert!(!everything.contains(&data_dir), "{everything}");
    let (_, steps) = api
        .call(
            Method::GET,
            &format!("{BASE}/default/agentruns/staged/steps"),
            Some(TOKEN),
            None,
        )
        .await;
    assert!(!steps.to_string().contains(&data_dir), "{steps}");
}

/// `GET` with `watch=true` in the background: the answer and how long it took.
fn watch(
    api: &Api,
    path: String,
) -> tokio::task::JoinHandle<(StatusCode, Value, std::time::Duration)> {
    let router = api.router.clone();
    tokio::spawn(async move {
        let started = std::time::Instant::now();
        let request = Request::builder()
            .method(Method::GET)
            .uri(path)
            .header(header::AUTHORIZATION, format!("Bearer {TOKEN}"))
            .body(Body::empty())
            .expect("request");
        let response = router.oneshot(request).await.expect("response");
        let status = response.status();
        let bytes = axum::body::to_bytes(response.into_body(), usize::MAX)
            .await
            .expect("body");
        let value = serde_json::from_slice(&bytes).expect("JSON");
        (status, value, started.elapsed())
    })
}

async fn still_waiting(
    handle: &tokio::task::JoinHandle<(StatusCode, Value, std::time::Duration)>,
) -> bool {
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    !handle.is_finished()
}

#[tokio::test]
async fn a_watch_answers_as_soon_as_the_object_changes_and_not_before() {
    let api = api().await;
    let agents = format!("{BASE}/default/agents");
    let (status, body) = api
        .call(Method::POST, &agents, Some(TOKEN), Some(agent("w")))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let version = body["metadata"]["resourceVersion"]
        .as_str()
        .expect("a version")
        .to_string();
    let path = format!("{agents}/w?watch=true&resourceVersion={version}&timeoutSeconds=60");

    let waiting = watch(&api, path.clone());
    assert!(still_waiting(&waiting).await, "nothing changed yet");
    // A change of another object does not answer it.
    api.call(Method::POST, &agents, Some(TOKEN), Some(agent("other")))
        .await;
    assert!(still_waiting(&waiting).await, "another object changed");
    let changed = std::time::Instant::now();
    let (status, patched) = api
        .call(
            Method::PATCH,
            &format!("{agents}/w"),
            Some(TOKEN),
            Some(json!({"metadata": {"labels": {"team": "a"}}})),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{patched}");
    let (status, body, _) = waiting.await.expect("watch");
    assert!(
        changed.elapsed() < std::time::Duration::from_secs(2),
        "answered {:?} after the change",
        changed.elapsed()
    );
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["metadata"]["labels"]["team"], "a");
    assert_eq!(
        body["metadata"]["resourceVersion"],
        patched["metadata"]["resourceVersion"]
    );

    // A version the client has that is already old: the answer comes at once.
    let (status, body, took) = watch(&api, path.clone()).await.expect("watch");
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["metadata"]["labels"]["team"], "a");
    assert!(took < std::time::Duration::from_secs(2), "{took:?}");

    // Deleted while watched: NotFound, as a read would say.
    let current = patched["metadata"]["resourceVersion"]
        .as_str()
        .expect("a version")
        .to_string();
    let waiting = watch(
        &api,
        format!("{agents}/w?watch=true&resourceVersion={current}"),
    );
    assert!(still_waiting(&waiting).await);
    api.call(Method::DELETE, &format!("{agents}/w"), Some(TOKEN), None)
        .await;
    let (status, body, _) = waiting.await.expect("watch");
    assert_eq!(
        (status, body["reason"].as_str()),
        (StatusCode::NOT_FOUND, Some("NotFound")),
        "{body}"
    );
}

#[tokio::test]
async fn a_watch_times_out_with_the_unchanged_object_and_ends_when_the_server_stops() {
    let api = api().await;
    let agents = format!("{BASE}/default/agents");
    let (_, created) = api
        .call(Method::POST, &agents, Some(TOKEN), Some(agent("w")))
        .await;
    let version = created["metadata"]["resourceVersion"]
        .as_str()
        .expect("a version")
        .to_string();
    let (status, body, took) = watch(
        &api,
        format!("{agents}/w?watch=true&resourceVersion={version}&timeoutSeconds=1"),
    )
    .await
    .expect("watch");
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        body["metadata"]["resourceVersion"].as_str(),
        Some(&*version)
    );
    assert!(
        took >= std::time::Duration::from_secs(1) && took < std::time::Duration::from_secs(3),
        "{took:?}"
    );

    // The same for a list: its version says whether anything in it changed.
    let (status, list) = api.call(Method::GET, &agents, Some(TOKEN), None).await;
    assert_eq!(status, StatusCode::OK, "{list}");
    let list_version = list["metadata"]["resourceVersion"]
        .as_str()
        .expect("a list version")
        .to_string();
    let (status, body, took) = watch(
        &api,
        format!("{agents}?watch=true&resourceVersion={list_version}&timeoutSeconds=1"),
    )
    .await
    .expect("watch");
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        body["metadata"]["resourceVersion"],
        list["metadata"]["resourceVersion"]
    );
    assert!(took >= std::time::Duration::from_secs(1), "{took:?}");

    // A stopping server answers its long polls at once, as they are.
    let waiting = watch(
        &api,
        format!("{agents}/w?watch=true&resourceVersion={version}&timeoutSeconds=300"),
    );
    assert!(still_waiting(&waiting).await);
    api.state.watches.stop();
    let (status, body, took) = waiting.await.expect("watch");
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        body["metadata"]["resourceVersion"].as_str(),
        Some(&*version)
    );
    assert!(took < std::time::Duration::from_secs(3), "{took:?}");
}

#[tokio::test]
async fn a_list_watch_answers_when_an_item_is_added_or_changed_in_its_selection() {
    let api = api().await;
    let agents = format!("{BASE}/default/agents");
    let labelled = |name: &str, team: &str| {
        let mut agent = agent(name);
        agent["metadata"]["labels"] = json!({"team": team});
        agent
    };
    api.call(Method::POST, &agents, Some(TOKEN), Some(labelled("a", "x")))
        .await;
    let (_, list) = api
        .call(
            Method::GET,
            &format!("{agents}?labelSelector=team=x"),
            Some(TOKEN),
            None,
        )
        .await;
    let version = list["metadata"]["resourceVersion"]
        .as_str()
        .expect("a list version")
        .to_string();
    let path = format!("{agents}?labelSelector=team=x&watch=true&resourceVersion={version}");
    let waiting = watch(&api, path.clone());
    assert!(still_waiting(&waiting).await);
    // Outside the selection, or in another project: the list is the same, it waits on.
    api.call(Method::POST, &agents, Some(TOKEN), Some(labelled("b", "y")))
        .await;
    assert!(
        still_waiting(&waiting).await,
        "an agent outside the selector"
    );
    api.state
        .ledger
        .open("other", nodus_core::Usd::ZERO)
        .await
        .expect("project");
    api.call(
        Method::POST,
        &format!("{BASE}/other/agents"),
        Some(TOKEN),
        Some(labelled("c", "x")),
    )
    .await;
    assert!(still_waiting(&waiting).await, "an agent in another project");
    api.call(Method::POST, &agents, Some(TOKEN), Some(labelled("d", "x")))
        .await;
    let (status, body, _) = waiting.await.expect("watch");
    assert_eq!(status, StatusCode::OK, "{body}");
    let names: Vec<&str> = body["items"]
        .as_array()
        .expect("items")
        .iter()
        .filter_map(|item| item["metadata"]["name"].as_str())
        .collect();
    assert_eq!(names, ["a", "d"]);
    assert_ne!(
        body["metadata"]["resourceVersion"].as_str(),
        Some(&*version)
    );
}

#[tokio::test]
async fn watch_parameters_are_checked_and_the_project_is_enforced() {
    let api = api().await;
    let agents = format!("{BASE}/default/agents");
    api.call(Method::POST, &agents, Some(TOKEN), Some(agent("w")))
        .await;
    for (query, field) in [
        ("watch=yes&resourceVersion=1", "watch"),
        ("watch=true&resourceVersion=abc", "resourceVersion"),
        (
            "watch=true&resourceVersion=1&timeoutSeconds=0",
            "timeoutSeconds",
        ),
        (
            "watch=true&resourceVersion=1&timeoutSeconds=301",
            "timeoutSeconds",
        ),
        (
            "watch=true&resourceVersion=1&timeoutSeconds=ten",
            "timeoutSeconds",
        ),
        ("resourceVersion=1", "resourceVersion"),
        ("timeoutSeconds=5", "timeoutSeconds"),
    ] {
        let (status, body) = api
            .call(
                Method::GET,
                &format!("{agents}/w?{query}"),
                Some(TOKEN),
                None,
            )
            .await;
        assert_eq!(
            (
                status,
                body["reason"].as_str(),
                body["details"]["field"].as_str()
            ),
            (
                StatusCode::UNPROCESSABLE_ENTITY,
                Some("Invalid"),
                Some(field)
            ),
            "{query}: {body}"
        );
    }
    let (status, body) = api
        .call(
            Method::GET,
            &format!("{agents}?watch=true&resourceVersion=7"),
            Some(TOKEN),
            None,
        )
        .await;
    assert_eq!(
        (status, body["details"]["field"].as_str()),
        (StatusCode::UNPROCESSABLE_ENTITY, Some("resourceVersion")),
        "a list's version is its digest: {body}"
    );
    // The watch obeys the read's auth: at once, without waiting (to a token of `default`;
    // the operator's holds every project).
    let (status, created) = api
        .call(
            Method::POST,
            &format!("{BASE}/default/tokens"),
            Some(TOKEN),
            Some(json!({"metadata": {"name": "reader"}, "spec": {"role": "read"}})),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    let reader = created["token"].as_str().expect("a token");
    api.state
        .ledger
        .open("other", nodus_core::Usd::ZERO)
        .await
        .expect("project");
    let started = std::time::Instant::now();
    let (status, _) = api
        .call(
            Method::GET,
            &format!("{BASE}/other/agents/w?watch=true&resourceVersion=1&timeoutSeconds=60"),
            Some(reader),
            None,
        )
        .await;
    let took = started.elapsed();
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert!(took < std::time::Duration::from_secs(2), "{took:?}");
    let (status, body) = api
        .call(
            Method::GET,
            &format!("{agents}/w?watch=true&resourceVersion=1&timeoutSeconds=60"),
            None,
            None,
        )
        .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
    // The OpenAPI document names the parameters of both reads.
    let (_, openapi) = api.call(Method::GET, "/openapi.json", None, None).await;
    for path in ["agents", "agents/{name}"] {
        let parameters = &openapi["paths"]
            [format!("/apis/nodus.dev/v1/projects/{{project}}/{path}")]["get"]["parameters"];
        let names: Vec<&str> = parameters
            .as_array()
            .map(|all| all.iter().filter_map(|p| p["name"].as_str()).collect())
            .unwrap_or_default();
        for name in ["watch", "resourceVersion", "timeoutSeconds"] {
            assert!(names.contains(&name), "{path}: {names:?}");
        }
    }
}

/// The server checks a `contextSchema` when the agent is written (a valid JSON Schema
/// 2020-12 document, no `$ref`) and a run's `context` against it when the run is created,
/// answering 422 with the failing path; nothing is written.
#[tokio::test]
async fn a_context_schema_is_checked_at_agent_writing_and_a_context_at_run_creation() {
    let api = api().await;
    let agents = format!("{BASE}/default/agents");
    let runs = format!("{BASE}/default/agentruns");
    let with_schema = |schema: Value| {
        let mut document = agent("typed");
        document["spec"]["contextSchema"] = schema;
        document
    };
    for (schema, field) in [
        (
            json!({"properties": {"ticket": {"type": "objekt"}}}),
            "spec.contextSchema.properties.ticket.type",
        ),
        (
            json!({"properties": {"ticket": {"$ref": "#/$defs/t"}}}),
            "spec.contextSchema.properties.ticket.$ref",
        ),
    ] {
        let (status, body) = api
            .call(
                Method::POST,
                &agents,
                Some(TOKEN),
                Some(with_schema(schema)),
            )
            .await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
        assert_eq!(body["details"]["field"], field, "{body}");
    }
    let (status, _) = api
        .call(Method::GET, &format!("{agents}/typed"), Some(TOKEN), None)
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "no agent was written");

    let schema = json!({
        "type": "object",
        "properties": {"ticket": {"type": "object", "properties": {"id": {"type": "integer"}}}},
        "required": ["ticket"],
    });
    let (status, body) = api
        .call(
            Method::POST,
            &agents,
            Some(TOKEN),
            Some(with_schema(schema)),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let typed_run = |name: &str, context: Option<Value>| {
        let mut document = run(name, "hello");
        document["spec"]["agent"] = json!("typed");
        if let Some(context) = context {
            document["spec"]["context"] = context;
        }
        document
    };
    for (context, field) in [
        (
            Some(json!({"ticket": {"id": "seven"}})),
            "spec.context.ticket.id",
        ),
        (None, "spec.context"),
    ] {
        let (status, body) = api
            .call(
                Method::POST,
                &runs,
                Some(TOKEN),
                Some(typed_run("refused", context)),
            )
            .await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
        assert_eq!(body["details"]["field"], field, "{body}");
        assert!(
            body["details"]["rule"]
                .as_str()
                .is_some_and(|rule| rule.contains("contextSchema")),
            "{body}"
        );
    }
    assert_eq!(api.runs().await, 0, "nothing was written");
    let (status, body) = api
        .call(
            Method::POST,
            &runs,
            Some(TOKEN),
            Some(typed_run("matching", Some(json!({"ticket": {"id": 7}})))),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
}

/// An agent's runs are listed with `fieldSelector=status.snapshot.agentRef=project/name`
/// (however the runs named the agent) or `spec.agent=NAME` (as the runs named it).
#[tokio::test]
async fn an_agents_runs_are_listed_by_its_reference_or_its_name() {
    let api = api().await;
    let agents = format!("{BASE}/default/agents");
    let runs = format!("{BASE}/default/agentruns");
    for name in ["hello-agent", "other-agent"] {
        let (status, body) = api
            .call(Method::POST, &agents, Some(TOKEN), Some(agent(name)))
            .await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
    }
    for (name, agent) in [
        ("by-name", "hello-agent"),
        ("by-reference", "default/hello-agent"),
        ("elsewhere", "other-agent"),
    ] {
        let mut document = run(name, "hi");
        document["spec"]["agent"] = json!(agent);
        let (status, body) = api
            .call(Method::POST, &runs, Some(TOKEN), Some(document))
            .await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
    }
    for (selector, expected) in [
        (
            "status.snapshot.agentRef=default/hello-agent",
            &["by-name", "by-reference"][..],
        ),
        (
            "status.snapshot.agentRef=default/other-agent",
            &["elsewhere"],
        ),
        ("status.snapshot.agentRef=hello-agent", &[]),
        ("spec.agent=hello-agent", &["by-name"]),
        ("spec.agent=default/hello-agent", &["by-reference"]),
    ] {
        let (status, list) = api
            .call(
                Method::GET,
                &format!("{runs}?fieldSelector={selector}"),
                Some(TOKEN),
                None,
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{list}");
        let mut names: Vec<&str> = list["items"]
            .as_array()
            .expect("items")
            .iter()
            .filter_map(|item| item["metadata"]["name"].as_str())
            .collect();
        names.sort_unstable();
        assert_eq!(names, expected, "{selector}");
    }
    let (status, body) = api
        .call(
            Method::GET,
            &format!("{runs}?fieldSelector=status.snapshot.agent=x"),
            Some(TOKEN),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert!(
        body["details"]["rule"]
            .as_str()
            .is_some_and(|rule| rule.contains("status.snapshot.agentRef")),
        "{body}"
    );
}

/// One kind's row of the write-path table: a valid object, and a change that breaks a rule
/// the kind states once (the field the refusal names).
struct KindCase {
    plural: &'static str,
    kind: nodus_core::resource::Kind,
    valid: Value,
    /// A merge patch that breaks the rule.
    breaking: Value,
    field: &'static str,
    /// Where the object named `it` lives (an Environment's key is NAME@VERSION).
    key: &'static str,
}

fn kind_cases() -> Vec<KindCase> {
    use nodus_core::resource::Kind;
    let doc = |kind: &str, rest: Value| {
        let mut document = json!({"apiVersion": "nodus.dev/v1", "kind": kind,
                                  "metadata": {"name": "it"}});
        nodus_core::patch::merge(&mut document, &rest);
        document
    };
    vec![
        KindCase {
            plural: "agents",
            kind: Kind::Agent,
            valid: agent("it"),
            breaking: json!({"spec": {"maxTokens": 0}}),
            field: "spec.maxTokens",
            key: "it",
        },
        KindCase {
            plural: "agentgroups",
            kind: Kind::AgentGroup,
            valid: doc(
                "AgentGroup",
                json!({"spec": {"agent": "hello-agent", "limits": {"maxActive": 2},
                                "maxCostUSD": "0.60"}}),
            ),
            breaking: json!({"spec": {"limits": {"maxActive": 0}}}),
            field: "spec.limits.maxActive",
            key: "it",
        },
        KindCase {
            plural: "agentruns",
            kind: Kind::AgentRun,
            valid: run("it", "Say hello."),
            breaking: json!({"spec": {"postRunAction": {"kind": ""}}}),
            field: "spec.postRunAction.kind",
            key: "it",
        },
        KindCase {
            plural: "agentenvironments",
            kind: Kind::AgentEnvironment,
            valid: doc(
                "AgentEnvironment",
                json!({"spec": {"env": [{"name": "LOG_LEVEL", "value": "debug"}]}}),
            ),
            breaking: json!({"spec": {"env": [{"name": "PATH", "value": "/x"}]}}),
            field: "spec.env[0].name",
            key: "it",
        },
        KindCase {
            plural: "filesets",
            kind: Kind::FileSet,
            valid: doc(
                "FileSet",
                json!({"spec": {"files": [{"path": "a.txt", "content": "a"}]}}),
            ),
            breaking: json!({"spec": {"files": [{"path": "../escape", "content": "a"}]}}),
            field: "spec.files[0].path",
            key: "it",
        },
        KindCase {
            plural: "secrets",
            kind: Kind::Secret,
            valid: doc("Secret", json!({"stringData": {"KEY": "value-1"}})),
            breaking: json!({"stringData": {"": "value-2"}}),
            field: "stringData",
            key: "it",
        },
        KindCase {
            plural: "budgets",
            kind: Kind::Budget,
            valid: doc("Budget", json!({"spec": {"maxSpendUSD": "10.00"}})),
            breaking: json!({"spec": {"maxSpendUSD": "-1"}}),
            field: "spec.maxSpendUSD",
            key: "it",
        },
        KindCase {
            plural: "environments",
            kind: Kind::Environment,
            valid: doc(
                "Environment",
                json!({"spec": {"version": "1.0.0", "grader": {"kind": "exact"},
                                "splits": {"test": {"tasks": [{"id": "t", "prompt": "Say a.",
                                                               "hidden": {"expected": "a"}}]}}}}),
            ),
            breaking: json!({"spec": {"version": "1.0"}}),
            field: "spec.version",
            key: "it@1.0.0",
        },
    ]
}

/// One write path per kind: for every kind users write, a rule the kind states once is
/// enforced on create, replace, merge patch and apply alike — each answers `Invalid` naming
/// the field, and nothing is written (the existing object reads back the same, at the same
/// version; no new object appears).
#[tokio::test]
async fn every_verb_enforces_each_kinds_rules_and_writes_nothing_when_refused() {
    let api = api().await;
    api.ok(
        Method::POST,
        &format!("{BASE}/default/agents"),
        TOKEN,
        Some(agent("hello-agent")),
    )
    .await;
    let cases = kind_cases();
    assert_eq!(
        cases
            .iter()
            .map(|c| c.kind)
            .collect::<std::collections::BTreeSet<_>>(),
        nodus_core::resource::Kind::WRITABLE.into_iter().collect(),
        "the table covers every kind users write"
    );
    for case in cases {
        let collection = format!("{BASE}/default/{}", case.plural);
        let path = format!("{collection}/{}", case.key);
        let created = api
            .ok(Method::POST, &collection, TOKEN, Some(case.valid.clone()))
            .await;
        let before = api.ok(Method::GET, &path, TOKEN, None).await;
        let mut broken = case.valid.clone();
        nodus_core::patch::merge(&mut broken, &case.breaking);
        let mut broken_new = broken.clone();
        broken_new["metadata"]["name"] = json!("new");
        let engine = &api.state.engine;
        let apply = |document: Value| async move {
            let error = engine
                .apply_document("default", case.kind, document)
                .await
                .expect_err("apply refuses");
            let error = nodus_server::error::ApiError::from(error);
            (
                error.status(),
                serde_json::to_value(&error).expect("serializes"),
            )
        };
        let batch = json!({"apiVersion": "nodus.dev/v1", "kind": "AgentRunList",
                           "items": [broken_new.clone()]});
        let mut answers = vec![
            (
                "create",
                api.call(
                    Method::POST,
                    &collection,
                    Some(TOKEN),
                    Some(broken_new.clone()),
                )
                .await,
            ),
            (
                "replace",
                api.call(Method::PUT, &path, Some(TOKEN), Some(broken.clone()))
                    .await,
            ),
            (
                "merge patch",
                api.call(
                    Method::PATCH,
                    &path,
                    Some(TOKEN),
                    Some(case.breaking.clone()),
                )
                .await,
            ),
            ("apply over the object", apply(broken.clone()).await),
            ("apply of a new object", apply(broken_new.clone()).await),
        ];
        if case.kind == nodus_core::resource::Kind::AgentRun {
            // One run of a batch obeys the same rules, named by its item.
            let (status, mut body) = api
                .call(Method::POST, &collection, Some(TOKEN), Some(batch))
                .await;
            let field = body["details"]["field"].as_str().map(str::to_string);
            body["details"]["field"] =
                json!(field.and_then(|f| f.strip_prefix("items[0].").map(str::to_string)));
            answers.push(("create in a batch", (status, body)));
        }
        for (verb, (status, body)) in answers {
            assert_eq!(
                (
                    status,
                    body["reason"].as_str(),
                    body["details"]["field"].as_str()
                ),
                (
                    StatusCode::UNPROCESSABLE_ENTITY,
                    Some("Invalid"),
                    Some(case.field)
                ),
                "{} {verb}: {body}",
                case.plural
            );
        }
        let after = api.ok(Method::GET, &path, TOKEN, None).await;
        assert_eq!(after, before, "{}: nothing was written", case.plural);
        assert_eq!(
            after["metadata"]["resourceVersion"], created["metadata"]["resourceVersion"],
            "{}",
            case.plural
        );
        let (status, _) = api
            .call(
                Method::GET,
                &format!("{collection}/{}", case.key.replacen("it", "new", 1)),
                Some(TOKEN),
                None,
            )
            .await;
        assert_eq!(
            status,
            StatusCode::NOT_FOUND,
            "{}: no new object",
            case.plural
        );
    }
}

/// The OpenAPI document and the router agree on methods: each documented operation is routed
/// (answered without a token: 401, or the public answer), and every other method of a
/// documented path is answered 405. With the unit test that the document's paths are the
/// router's, the two describe the same operations.
#[tokio::test]
async fn the_openapi_document_lists_exactly_the_methods_each_path_takes() {
    let api = api().await;
    let (status, document) = api.call(Method::GET, "/openapi.json", None, None).await;
    assert_eq!(status, StatusCode::OK);
    let paths = document["paths"].as_object().expect("paths");
    assert!(paths.len() >= 20, "{}", paths.len());
    for (template, item) in paths {
        let path = template
            .replace("{project}", "p")
            .replace("{plural}", "agents")
            .replace("{name}", "n")
            .replace("{result}", "runRecord");
        for method in [
            Method::GET,
            Method::POST,
            Method::PUT,
            Method::PATCH,
            Method::DELETE,
        ] {
            let documented = item.get(method.as_str().to_lowercase()).is_some();
            let (status, body) = api.call(method.clone(), &path, None, None).await;
            assert_eq!(
                status == StatusCode::METHOD_NOT_ALLOWED,
                !documented,
                "{method} {template}: {status} {body}"
            );
        }
    }
}

/// Every answer matches the OpenAPI document's schema for it: one object of each kind created,
/// read and listed, a run's steps, answer and results, credits, projects, tokens, post-run
/// actions, a deletion and the errors (401, 404, 422 with details), each validated (JSON
/// Schema 2020-12) against the schema the document gives that operation.
#[tokio::test]
async fn every_answer_matches_the_openapi_document() {
    let api = api().await;
    let (_, document) = api.call(Method::GET, "/openapi.json", None, None).await;
    let check = |schema: &str, answer: &Value| {
        let mut root = document.clone();
        root["$ref"] = json!(format!("#/components/schemas/{schema}"));
        let validator = jsonschema::draft202012::new(&root).expect("the document is a schema");
        let errors: Vec<String> = validator
            .iter_errors(answer)
            .map(|e| format!("{} at {}", e, e.instance_path()))
            .collect();
        assert!(errors.is_empty(), "{schema}: {errors:?}\n{answer}");
    };
    let created = api
        .ok(
            Method::POST,
            BASE,
            TOKEN,
            Some(json!({"metadata": {"name": "conform"}})),
        )
        .await;
    check("Project", &created);
    let p = format!("{BASE}/conform");
    check(
        "Account",
        &api.ok(
            Method::POST,
            &format!("{p}/credits"),
            TOKEN,
            Some(json!({"addUSD": "5.00"})),
        )
        .await,
    );
    let head =
        json!({"apiVersion": "nodus.dev/v1", "metadata": {"name": "c", "labels": {"a": "b"}}});
    let with = |kind: &str, fields: Value| {
        let mut document = head.clone();
        document["kind"] = json!(kind);
        if let (Some(all), Value::Object(more)) = (document.as_object_mut(), fields) {
            all.extend(more);
        }
        document
    };
    for (plural, document) in [
        (
            "secrets",
            with("Secret", json!({"stringData": {"KEY": "value"}})),
        ),
        (
            "budgets",
            with("Budget", json!({"spec": {"maxSpendUSD": "5.00"}})),
        ),
        (
            "filesets",
            with(
                "FileSet",
                json!({"spec": {"files": [{"path": "a.txt", "content": "a"}, {"path": "b", "contentBase64": "Yg==", "executable": true}]}}),
            ),
        ),
        (
            "agentenvironments",
            with(
                "AgentEnvironment",
                json!({"spec": {"env": [{"name": "A", "value": "b"}, {"name": "K", "valueFrom": {"secretKeyRef": {"name": "c", "key": "KEY"}}}], "compute": {"cpu": "500m", "memory": "1Gi"}}}),
            ),
        ),
        (
            "environments",
            with(
                "Environment",
                json!({"spec": {"version": "1.0.0", "splits": {"test": {"tasks": [{"id": "t1", "prompt": "2+2?", "hidden": {"expected": "4"}}]}}, "grader": {"kind": "exact"}}}),
            ),
        ),
        (
            "agents",
            with(
                "Agent",
                json!({"spec": {"system": "Be brief.", "contextSchema": {"type": "object"}, "environment": "c"}}),
            ),
        ),
        (
            "agentgroups",
            with(
                "AgentGroup",
                json!({"spec": {"agent": "c", "maxCostUSD": "1.00"}}),
            ),
        ),
        (
            "agentruns",
            with(
                "AgentRun",
                json!({"spec": {"agent": "c", "input": "hi", "keepAlive": true, "timeout": "10m", "workdir": {"baseWorkdir": "c"}}}),
            ),
        ),
    ] {
        let created = api
            .ok(
                Method::POST,
                &format!("{p}/{plural}"),
                TOKEN,
                Some(document),
            )
            .await;
        let kind = created["kind"].as_str().expect("a kind").to_string();
        check(&kind, &created);
        let name = created["metadata"]["name"]
            .as_str()
            .expect("a name")
            .to_string();
        let name = if plural == "environments" {
            format!("{name}@1.0.0")
        } else {
            name
        };
        check(
            &kind,
            &api.ok(Method::GET, &format!("{p}/{plural}/{name}"), TOKEN, None)
                .await,
        );
        check(
            &format!("{kind}List"),
            &api.ok(Method::GET, &format!("{p}/{plural}"), TOKEN, None)
                .await,
        );
    }
    let batch = json!({"kind": "AgentRunList", "items": [with("AgentRun", json!({"metadata": {"name": "b1"}, "spec": {"agent": "c", "input": "hi"}}))]});
    check(
        "AgentRunList",
        &api.ok(Method::POST, &format!("{p}/agentruns"), TOKEN, Some(batch))
            .await,
    );
    let run = format!("{p}/agentruns/c");
    check(
        "StepList",
        &api.ok(
            Method::GET,
            &format!("{run}/steps?payload=true"),
            TOKEN,
            None,
        )
        .await,
    );
    check(
        "Answer",
        &api.ok(Method::GET, &format!("{run}/answer"), TOKEN, None)
            .await,
    );
    check(
        "RunResultList",
        &api.ok(Method::GET, &format!("{run}/results"), TOKEN, None)
            .await,
    );
    check(
        "AgentRun",
        &api.ok(Method::POST, &format!("{run}/cancel"), TOKEN, None)
            .await,
    );
    check(
        "RunResultList",
        &api.ok(Method::GET, &format!("{run}/results"), TOKEN, None)
            .await,
    );
    check(
        "StepList",
        &api.ok(
            Method::GET,
            &format!("{run}/steps?payload=true"),
            TOKEN,
            None,
        )
        .await,
    );
    check(
        "AgentGroup",
        &api.ok(
            Method::POST,
            &format!("{p}/agentgroups/c/cancel"),
            TOKEN,
            None,
        )
        .await,
    );
    check(
        "Account",
        &api.ok(Method::GET, &format!("{p}/credits"), TOKEN, None)
            .await,
    );
    let token = api
        .ok(
            Method::POST,
            &format!("{p}/tokens"),
            TOKEN,
            Some(
                json!({"metadata": {"name": "reader"}, "spec": {"role": "read", "expires": "30d"}}),
            ),
        )
        .await;
    check("Token", &token);
    check(
        "TokenList",
        &api.ok(Method::GET, &format!("{p}/tokens"), TOKEN, None)
            .await,
    );
    check("ProjectList", &api.ok(Method::GET, BASE, TOKEN, None).await);
    check(
        "PostRunActionList",
        &api.ok(
            Method::GET,
            "/apis/nodus.dev/v1/postrunactions",
            TOKEN,
            None,
        )
        .await,
    );
    check(
        "Deleted",
        &api.ok(Method::DELETE, &format!("{p}/budgets/c"), TOKEN, None)
            .await,
    );
    for (path, body, expected) in [
        (format!("{p}/agents/none"), None, StatusCode::NOT_FOUND),
        (
            format!("{p}/agents"),
            Some(json!({"kind": "Agent"})),
            StatusCode::UNPROCESSABLE_ENTITY,
        ),
        (
            format!("{p}/credits"),
            Some(json!({"addUSD": "x"})),
            StatusCode::UNPROCESSABLE_ENTITY,
        ),
    ] {
        let method = if body.is_some() {
            Method::POST
        } else {
            Method::GET
        };
        let (status, answer) = api.call(method, &path, Some(TOKEN), body).await;
        assert_eq!(status, expected, "{path}: {answer}");
        check("Status", &answer);
    }
    let (status, answer) = api
        .call(Method::GET, &format!("{p}/agents"), None, None)
        .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    check("Status", &answer);
}

#[tokio::test]
async fn a_worker_replica_serves_only_its_health_and_its_metrics() {
    let full = api().await;
    let worker = Api {
        router: nodus_server::worker_router(full.state.clone()),
        state: full.state.clone(),
        _dir: tempfile::tempdir().expect("tempdir"),
    };
    let (status, body) = worker.call(Method::GET, "/healthz", None, None).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, body) = worker
        .call(Method::GET, "/metrics", Some(TOKEN), None)
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    // Everything else is not served, with or without a token; the full API serves it.
    for path in [
        BASE.to_string(),
        format!("{BASE}/default/agents"),
        "/openapi.json".to_string(),
    ] {
        let (status, body) = worker.call(Method::GET, &path, Some(TOKEN), None).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{path}: {body}");
        let (status, body) = full.call(Method::GET, &path, Some(TOKEN), None).await;
        assert_eq!(status, StatusCode::OK, "{path}: {body}");
    }
}

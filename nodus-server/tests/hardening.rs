//! Refusals and redactions over the API (`oneshot`, in-memory store): IPv6 forms of internal
//! IPv4 addresses as webhook targets, an Agent naming another project's AgentEnvironment,
//! and who is shown an Environment's hidden grading data.

mod support;

use axum::http::{Method, StatusCode};
use serde_json::{Value, json};
use support::{Api, BASE, TOKEN, agent, api};

/// A run of `agent` whose post-run action is a webhook to `url`.
fn hooked_run(name: &str, agent: &str, url: &str) -> Value {
    json!({"apiVersion": "nodus.dev/v1", "kind": "AgentRun", "metadata": {"name": name},
           "spec": {"agent": agent, "input": "hello",
                    "postRunAction": {"kind": "agents.webhook", "config": {"url": url}}}})
}

/// The refusal of a write: its field, rule and value.
async fn refused(api: &Api, method: Method, path: &str, body: Value) -> (String, String, String) {
    let (status, answer) = api.call(method, path, Some(TOKEN), Some(body)).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{path}: {answer}");
    let details = &answer["details"];
    let text = |field: &str| details[field].as_str().unwrap_or_default().to_string();
    (text("field"), text("rule"), text("value"))
}

#[tokio::test]
async fn webhook_targets_in_ipv6_forms_of_internal_ipv4_addresses_are_refused_at_creation() {
    let api = api().await;
    let agents = format!("{BASE}/default/agents");
    let runs = format!("{BASE}/default/agentruns");
    let mut hooked = agent("hooked");
    hooked["spec"]["postRunActions"] = json!(["agents.webhook"]);
    api.ok(Method::POST, &agents, TOKEN, Some(hooked)).await;
    for (host, carried) in [
        ("[::127.0.0.1]", "IPv4-compatible form of 127.0.0.1"),
        ("[::ffff:0:127.0.0.1]", "SIIT form of 127.0.0.1"),
        ("[2002:7f00:1::]", "6to4 form of 127.0.0.1"),
        ("[2002:a9fe:a9fe::1]", "6to4 form of 169.254.169.254"),
        // Teredo: a public server (65.54.227.120), the client 127.0.0.1 (bits inverted).
        (
            "[2001:0:4136:e378:8000:63bf:80ff:fffe]",
            "Teredo (client) form of 127.0.0.1",
        ),
        (
            "[2001:0:a00:1::f7f7:f7f7]",
            "Teredo (server) form of 10.0.0.1",
        ),
        ("[64:ff9b::a9fe:a9fe]", "NAT64 form of 169.254.169.254"),
        ("[64:ff9b:1::7f00:1]", "local-use NAT64 form of 127.0.0.1"),
        (
            "[64:ff9b:1:a00:0:100::]",
            "local-use NAT64 form of 10.0.0.1",
        ),
    ] {
        let url = format!("http://{host}:8080/hook");
        let (field, rule, value) =
            refused(&api, Method::POST, &runs, hooked_run("r1", "hooked", &url)).await;
        assert_eq!(field, "spec.postRunAction.config.url", "{host}");
        assert!(rule.contains(carried), "{host}: {rule}");
        assert!(rule.contains("--webhook-allow"), "{host}: {rule}");
        let bare = host.trim_start_matches('[').trim_end_matches(']');
        let written: std::net::IpAddr = bare.parse().expect("an address");
        assert_eq!(value, written.to_string(), "{host}");
    }
    // Their public counterparts are taken.
    for (index, host) in [
        "[::ffff:0:8.8.8.8]",
        "[2002:808:808::]",
        "[2001:0:4136:e378::f7f7:f7f7]",
        "[64:ff9b::808:808]",
        "[64:ff9b:1::808:808]",
    ]
    .into_iter()
    .enumerate()
    {
        let url = format!("http://{host}/hook");
        api.ok(
            Method::POST,
            &runs,
            TOKEN,
            Some(hooked_run(&format!("public-{index}"), "hooked", &url)),
        )
        .await;
    }
}

#[tokio::test]
async fn an_agent_naming_another_projects_agent_environment_is_refused_on_every_verb() {
    let api = api().await;
    api.ok(
        Method::POST,
        BASE,
        TOKEN,
        Some(json!({"metadata": {"name": "other"}})),
    )
    .await;
    let environment = json!({"apiVersion": "nodus.dev/v1", "kind": "AgentEnvironment",
                             "metadata": {"name": "research"},
                             "spec": {"env": [{"name": "LOG_LEVEL", "value": "debug"}]}});
    for project in ["default", "other"] {
        api.ok(
            Method::POST,
            &format!("{BASE}/{project}/agentenvironments"),
            TOKEN,
            Some(environment.clone()),
        )
        .await;
    }
    let agents = format!("{BASE}/default/agents");
    let path = format!("{agents}/it");
    let created = api
        .ok(Method::POST, &agents, TOKEN, Some(agent("it")))
        .await;
    let with = |reference: &str, name: &str| {
        let mut document = agent(name);
        document["spec"]["environment"] = json!(reference);
        document
    };
    let engine = &api.state.engine;
    for reference in ["other/research", "nodus/research", "missing/research"] {
        let patch = json!({"spec": {"environment": reference}});
        let apply = |document: Value| async move {
            let error = engine
                .apply_document("default", nodus_core::resource::Kind::Agent, document)
                .await
                .expect_err("apply refuses");
            let error = nodus_server::error::ApiError::from(error);
            serde_json::to_value(&error).expect("serializes")["details"].clone()
        };
        let mut answers = vec![
            (
                "create",
                refused(&api, Method::POST, &agents, with(reference, "new")).await,
            ),
            (
                "replace",
                refused(&api, Method::PUT, &path, with(reference, "it")).await,
            ),
            (
                "merge patch",
                refused(&api, Method::PATCH, &path, patch).await,
            ),
        ];
        for (verb, name) in [
            ("apply over the agent", "it"),
            ("apply of a new agent", "new"),
        ] {
            let details = apply(with(reference, name)).await;
            let text = |field: &str| details[field].as_str().unwrap_or_default().to_string();
            answers.push((verb, (text("field"), text("rule"), text("value"))));
        }
        for (verb, (field, rule, value)) in answers {
            assert_eq!(field, "spec.environment", "{reference} {verb}");
            assert!(
                rule.contains("of this project (\"default\")"),
                "{reference} {verb}: {rule}"
            );
            assert_eq!(value, format!("{reference:?}"), "{reference} {verb}");
        }
    }
    let after = api.ok(Method::GET, &path, TOKEN, None).await;
    assert_eq!(
        after["metadata"]["resourceVersion"], created["metadata"]["resourceVersion"],
        "nothing was written"
    );
    let (status, _) = api
        .call(Method::GET, &format!("{agents}/new"), Some(TOKEN), None)
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "no new agent");
    // Its own project's, by name or qualified, and inline ones are taken.
    for (name, reference) in [("own", "research"), ("qualified", "default/research")] {
        api.ok(Method::POST, &agents, TOKEN, Some(with(reference, name)))
            .await;
    }
    let mut inline = agent("inline");
    inline["spec"]["environment"] = json!({"env": [{"name": "A", "value": "b"}]});
    api.ok(Method::POST, &agents, TOKEN, Some(inline)).await;
}

/// A new token of `project` with `role`; its secret.
async fn token(api: &Api, project: &str, name: &str, role: &str) -> String {
    let created = api
        .ok(
            Method::POST,
            &format!("{BASE}/{project}/tokens"),
            TOKEN,
            Some(json!({"metadata": {"name": name}, "spec": {"role": role}})),
        )
        .await;
    created["token"].as_str().expect("the secret").to_string()
}

/// An Environment whose one task's hidden data is `secret`.
fn environment(name: &str, secret: &str) -> Value {
    json!({"apiVersion": "nodus.dev/v1", "kind": "Environment", "metadata": {"name": name},
           "spec": {"version": "1.0.0", "grader": {"kind": "exact"},
                    "splits": {"test": {"tasks": [{"id": "t", "prompt": "Say it.",
                                                   "hidden": {"expected": secret}}]}}}})
}

#[tokio::test]
async fn hidden_grading_data_is_shown_only_to_admins_of_the_environments_project() {
    let api = api().await;
    api.ok(
        Method::POST,
        BASE,
        TOKEN,
        Some(json!({"metadata": {"name": "other"}})),
    )
    .await;
    let reader = token(&api, "default", "reader", "read").await;
    let writer = token(&api, "default", "writer", "write").await;
    let admin = token(&api, "default", "keeper", "admin").await;
    let stranger = token(&api, "other", "admin", "admin").await;
    let environments = format!("{BASE}/default/environments");
    let created = api
        .ok(
            Method::POST,
            &environments,
            TOKEN,
            Some(environment("quiz", "secret-answer-1")),
        )
        .await;
    let version = created["metadata"]["resourceVersion"]
        .as_str()
        .expect("a version")
        .to_string();
    let quiz = format!("{environments}/quiz@1.0.0");
    let stale_list = "0".repeat(64);
    // Every read of it: get, list, a page, and the long polls of both.
    let reads = [
        quiz.clone(),
        environments.clone(),
        format!("{environments}?limit=1"),
        format!(
            "{quiz}?watch=true&resourceVersion={}",
            version.parse::<u64>().expect("a number") - 1
        ),
        format!("{environments}?watch=true&resourceVersion={stale_list}"),
    ];
    for (who, token, sees) in [
        ("read", &reader, false),
        ("write", &writer, false),
        ("admin", &admin, true),
        ("operator", &TOKEN.to_string(), true),
    ] {
        for path in &reads {
            let answer = api.ok(Method::GET, path, token, None).await.to_string();
            assert!(answer.contains("Say it."), "{who} {path}: {answer}");
            assert_eq!(
                answer.contains("secret-answer-1"),
                sees,
                "{who} {path}: {answer}"
            );
            assert_eq!(answer.contains("\"hidden\""), sees, "{who} {path}");
        }
    }
    let (status, _) = api.call(Method::GET, &quiz, Some(&stranger), None).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "another project's admin");
    // What a write answers: a writer's create and merge patch show no hidden data.
    let answer = api
        .ok(
            Method::POST,
            &environments,
            &writer,
            Some(environment("drill", "secret-answer-2")),
        )
        .await
        .to_string();
    assert!(!answer.contains("secret-answer-2"), "{answer}");
    let answer = api
        .ok(
            Method::PATCH,
            &quiz,
            &writer,
            Some(json!({"metadata": {"labels": {"team": "x"}}})),
        )
        .await
        .to_string();
    assert!(answer.contains("\"team\""), "{answer}");
    assert!(!answer.contains("secret-answer-1"), "{answer}");
    // The patch kept the hidden data, which the admin still reads.
    let answer = api.ok(Method::GET, &quiz, &admin, None).await.to_string();
    assert!(answer.contains("secret-answer-1"), "{answer}");
    // The built-ins of project nodus: readable by all, their hidden data by none of them.
    let builtins = format!("{BASE}/nodus/environments");
    let operator_view = api
        .ok(Method::GET, &builtins, TOKEN, None)
        .await
        .to_string();
    assert!(operator_view.contains("\"hidden\""), "{operator_view}");
    for (who, token) in [
        ("read", &reader),
        ("admin", &admin),
        ("another project's admin", &stranger),
    ] {
        let answer = api
            .ok(Method::GET, &builtins, token, None)
            .await
            .to_string();
        assert!(answer.contains("workdir-files"), "{who}: {answer}");
        assert!(!answer.contains("\"hidden\""), "{who}: {answer}");
    }
}

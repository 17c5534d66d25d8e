//! Projects and tokens over the API (`oneshot`, in-memory store): every route refuses the
//! role below the lowest that may call it and lets that role through; projects see only
//! their own resources; expired and deleted tokens are refused on the next request; bad
//! input names its field and writes nothing; `/metrics` and `/openapi.json` reveal nothing
//! about a project to someone who does not hold it.

mod support;

use axum::http::{Method, StatusCode};
use nodus_core::store::ObjectKey;
use nodus_server::StoreUrl;
use serde_json::{Value, json};
use support::{Api, agent, api, build};

const OPERATOR: &str = support::TOKEN;
const ROOT: &str = support::BASE;

/// A fresh database on the test PostgreSQL.
fn postgres_url() -> String {
    let base = std::env::var("NODUS_TEST_POSTGRES_URL")
        .expect("NODUS_TEST_POSTGRES_URL is set (scripts/test starts PostgreSQL)");
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("time")
        .subsec_nanos();
    let database = format!("nodus_tokens_{}_{nanos}", std::process::id());
    // CREATE DATABASE copies template1 and fails while another session uses it: retry.
    let created = (0..20).any(|attempt| {
        if attempt > 0 {
            std::thread::sleep(std::time::Duration::from_millis(250));
        }
        std::process::Command::new("psql")
            .arg(&base)
            .args(["-q", "-c", &format!("CREATE DATABASE {database}")])
            .status()
            .is_ok_and(|status| status.success())
    });
    assert!(created, "cannot create database {database}");
    let (server, _) = base.rsplit_once('/').expect("a database part");
    format!("{server}/{database}")
}

impl Api {
    async fn project(&self, name: &str) {
        self.ok(
            Method::POST,
            ROOT,
            OPERATOR,
            Some(json!({"metadata": {"name": name}})),
        )
        .await;
    }

    /// A new token of `project` with `role`; its secret.
    async fn token(&self, project: &str, name: &str, role: &str) -> String {
        let created = self
            .ok(
                Method::POST,
                &format!("{ROOT}/{project}/tokens"),
                OPERATOR,
                Some(json!({"metadata": {"name": name}, "spec": {"role": role}})),
            )
            .await;
        created["token"].as_str().expect("the secret").to_string()
    }
}

fn run(name: &str) -> Value {
    json!({"apiVersion": "nodus.dev/v1", "kind": "AgentRun", "metadata": {"name": name},
           "spec": {"agent": "a1", "input": "hello"}})
}

fn budget(name: &str) -> Value {
    json!({"apiVersion": "nodus.dev/v1", "kind": "Budget", "metadata": {"name": name},
           "spec": {"maxSpendUSD": "10.00"}})
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Least {
    Read,
    Write,
    Admin,
    Operator,
}

/// For every route: the lowest role that may call it. The role below gets `403 Forbidden`
/// and nothing is written; the role itself gets past authorization.
#[tokio::test]
async fn every_route_refuses_the_role_below_its_lowest_and_admits_that_role() {
    let api = api().await;
    api.project("team-a").await;
    let read = api.token("team-a", "reader", "read").await;
    let write = api.token("team-a", "writer", "write").await;
    let admin = api.token("team-a", "boss", "admin").await;
    let p = format!("{ROOT}/team-a");
    api.ok(
        Method::POST,
        &format!("{p}/credits"),
        OPERATOR,
        Some(json!({"addUSD": "5.00"})),
    )
    .await;
    api.ok(
        Method::POST,
        &format!("{p}/agents"),
        OPERATOR,
        Some(agent("a1")),
    )
    .await;
    api.ok(
        Method::POST,
        &format!("{p}/agentruns"),
        OPERATOR,
        Some(run("r1")),
    )
    .await;
    api.ok(
        Method::POST,
        &format!("{p}/budgets"),
        OPERATOR,
        Some(budget("b1")),
    )
    .await;

    let s = |path: &str| format!("{p}{path}");
    let table: Vec<(Least, Method, String, Option<Value>)> = vec![
        (Least::Read, Method::GET, ROOT.to_string(), None),
        (Least::Read, Method::GET, s("/agents"), None),
        (Least::Read, Method::GET, s("/agents/a1"), None),
        (
            Least::Read,
            Method::GET,
            s("/agents/a1?watch=true&resourceVersion=0&timeoutSeconds=1"),
            None,
        ),
        (
            Least::Read,
            Method::GET,
            s("/agentruns?watch=true&resourceVersion=0&timeoutSeconds=1"),
            None,
        ),
        (Least::Read, Method::GET, s("/agentruns"), None),
        (Least::Read, Method::GET, s("/agentruns/r1"), None),
        (Least::Read, Method::GET, s("/agentruns/r1/steps"), None),
        (Least::Read, Method::GET, s("/agentruns/r1/answer"), None),
        (Least::Read, Method::GET, s("/agentruns/r1/workdir"), None),
        (Least::Read, Method::GET, s("/agentgroups"), None),
        (Least::Read, Method::GET, s("/secrets"), None),
        (Least::Read, Method::GET, s("/filesets"), None),
        (Least::Read, Method::GET, s("/budgets"), None),
        (Least::Read, Method::GET, s("/budgets/b1"), None),
        (Least::Read, Method::GET, s("/credits"), None),
        (Least::Write, Method::POST, s("/agents"), Some(agent("a2"))),
        (
            Least::Write,
            Method::PUT,
            s("/agents/a2"),
            Some(agent("a2")),
        ),
        (
            Least::Write,
            Method::PATCH,
            s("/agents/a2"),
            Some(json!({"metadata": {"labels": {"x": "y"}}})),
        ),
        (Least::Write, Method::POST, s("/agentruns"), Some(run("r2"))),
        (
            Least::Write,
            Method::POST,
            s("/agentruns/r1/messages"),
            Some(json!({"payload": "hi", "messageKey": "k1"})),
        ),
        (
            Least::Write,
            Method::POST,
            s("/agentruns/r1/resolve"),
            Some(json!({"action": "retry"})),
        ),
        (Least::Write, Method::POST, s("/agentruns/r1/close"), None),
        (Least::Write, Method::POST, s("/agentruns/r1/cancel"), None),
        (
            Least::Write,
            Method::POST,
            s("/agentgroups/g1/cancel"),
            None,
        ),
        (
            Least::Write,
            Method::POST,
            s("/secrets"),
            Some(
                json!({"apiVersion": "nodus.dev/v1", "kind": "Secret", "metadata": {"name": "s1"}, "stringData": {"K": "v"}}),
            ),
        ),
        (Least::Write, Method::DELETE, s("/secrets/s1"), None),
        (Least::Write, Method::DELETE, s("/agentruns/r2"), None),
        (Least::Write, Method::DELETE, s("/agents/a2"), None),
        (
            Least::Admin,
            Method::POST,
            s("/credits"),
            Some(json!({"addUSD": "1.00"})),
        ),
        (
            Least::Admin,
            Method::POST,
            s("/budgets"),
            Some(budget("b2")),
        ),
        (
            Least::Admin,
            Method::PUT,
            s("/budgets/b2"),
            Some(budget("b2")),
        ),
        (
            Least::Admin,
            Method::PATCH,
            s("/budgets/b2"),
            Some(json!({"spec": {"maxSpendUSD": "9.00"}})),
        ),
        (Least::Admin, Method::DELETE, s("/budgets/b2"), None),
        (Least::Admin, Method::GET, s("/tokens"), None),
        (Least::Admin, Method::GET, s("/tokens/reader"), None),
        (
            Least::Admin,
            Method::POST,
            s("/tokens"),
            Some(json!({"metadata": {"name": "extra"}, "spec": {"role": "read"}})),
        ),
        (Least::Admin, Method::DELETE, s("/tokens/extra"), None),
        (
            Least::Operator,
            Method::POST,
            ROOT.to_string(),
            Some(json!({"metadata": {"name": "team-z"}})),
        ),
    ];
    let token_of = |least: Least| match least {
        Least::Read => read.as_str(),
        Least::Write => write.as_str(),
        Least::Admin => admin.as_str(),
        Least::Operator => OPERATOR,
    };
    for (least, method, path, body) in table {
        let label = format!("{method} {path} (least {least:?})");
        if least > Least::Read {
            let below = match least {
                Least::Write => Least::Read,
                Least::Admin => Least::Write,
                _ => Least::Admin,
            };
            let (status, answer) = api
                .call(method.clone(), &path, Some(token_of(below)), body.clone())
                .await;
            assert_eq!(
                (status, answer["reason"].as_str()),
                (StatusCode::FORBIDDEN, Some("Forbidden")),
                "{label} with {below:?}: {answer}"
            );
        }
        let (status, answer) = api
            .call(method.clone(), &path, Some(token_of(least)), body)
            .await;
        assert!(
            status != StatusCode::FORBIDDEN && status != StatusCode::UNAUTHORIZED,
            "{label}: {status} {answer}"
        );
        // Past authorization, the route answers as it would anyone (a run that is not
        // parked has nothing to resolve): never a failure of the server.
        assert!(!status.is_server_error(), "{label}: {status} {answer}");
        let (status, _) = api.call(method, &path, None, None).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{label} without a token");
    }

    // Refused writes wrote nothing.
    let (status, _) = api
        .call(
            Method::POST,
            &s("/agents"),
            Some(&read),
            Some(agent("denied")),
        )
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let (status, _) = api
        .call(Method::GET, &s("/agents/denied"), Some(&read), None)
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _) = api
        .call(
            Method::GET,
            &format!("{ROOT}/team-z/agents"),
            Some(OPERATOR),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::OK, "the operator made team-z");
    // The messages of a refusal say what the role may not do.
    let (_, answer) = api
        .call(
            Method::POST,
            &s("/credits"),
            Some(&write),
            Some(json!({"addUSD": "1.00"})),
        )
        .await;
    assert!(
        answer["message"]
            .as_str()
            .unwrap_or_default()
            .contains("role is write"),
        "{answer}"
    );
}

/// Two projects: each token sees its own project's resources and tokens, and nothing of the
/// other's, whether or not it exists.
#[tokio::test]
async fn two_projects_see_only_their_own_resources() {
    let api = api().await;
    api.project("team-a").await;
    api.project("team-b").await;
    let a = api.token("team-a", "boss", "admin").await;
    let b = api.token("team-b", "boss", "admin").await;
    api.ok(
        Method::POST,
        &format!("{ROOT}/team-a/agents"),
        &a,
        Some(agent("only-a")),
    )
    .await;
    api.ok(
        Method::POST,
        &format!("{ROOT}/team-b/agents"),
        &b,
        Some(agent("only-b")),
    )
    .await;
    let names = |list: &Value| -> Vec<String> {
        list["items"]
            .as_array()
            .map(|items| {
                items
                    .iter()
                    .filter_map(|i| i["metadata"]["name"].as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default()
    };
    let list = api
        .ok(Method::GET, &format!("{ROOT}/team-a/agents"), &a, None)
        .await;
    assert_eq!(names(&list), ["only-a"]);
    let list = api.ok(Method::GET, ROOT, &a, None).await;
    assert_eq!(names(&list), ["team-a"]);
    // The operator holds every project that exists, and no other.
    let (status, _) = api
        .call(
            Method::GET,
            &format!("{ROOT}/nowhere/agents"),
            Some(OPERATOR),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    api.ok(
        Method::GET,
        &format!("{ROOT}/team-b/agents"),
        OPERATOR,
        None,
    )
    .await;
    let list = api.ok(Method::GET, ROOT, OPERATOR, None).await;
    assert_eq!(names(&list), ["default", "nodus", "team-a", "team-b"]);
    let list = api
        .ok(Method::GET, &format!("{ROOT}/team-b/tokens"), &b, None)
        .await;
    assert_eq!(names(&list), ["boss"]);
    for path in ["agents", "agents/only-b", "tokens", "credits"] {
        let (status, answer) = api
            .call(
                Method::GET,
                &format!("{ROOT}/team-b/{path}"),
                Some(&a),
                None,
            )
            .await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{path}: {answer}");
    }
    let (status, _) = api
        .call(
            Method::POST,
            &format!("{ROOT}/team-b/tokens"),
            Some(&a),
            Some(json!({"metadata": {"name": "mine"}, "spec": {"role": "admin"}})),
        )
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let (status, _) = api
        .call(
            Method::POST,
            ROOT,
            Some(&a),
            Some(json!({"metadata": {"name": "team-c"}})),
        )
        .await;
    assert_eq!(
        status,
        StatusCode::FORBIDDEN,
        "only the operator creates projects"
    );

    // /metrics counts only what the token holds; /openapi.json names no project's objects.
    api.ok(
        Method::POST,
        &format!("{ROOT}/team-b/agentruns"),
        &b,
        Some(
            json!({"apiVersion": "nodus.dev/v1", "kind": "AgentRun", "metadata": {"name": "secret-run"}, "spec": {"agent": "only-b", "input": "x"}}),
        ),
    )
    .await;
    let (status, text) = api.call(Method::GET, "/metrics", None, None).await;
    let text = text.as_str().unwrap_or_default().to_string();
    assert_eq!(status, StatusCode::OK, "{text}");
    assert!(text.contains("nodus_http_requests_total"), "{text}");
    for series in [
        "nodus_runs",
        "nodus_spend",
        "nodus_model_calls",
        "nodus_step",
    ] {
        assert!(!text.contains(series), "anonymous: {text}");
    }
    let (status, _) = api
        .call(Method::GET, "/metrics", Some("nodus_wrong"), None)
        .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (_, text) = api.call(Method::GET, "/metrics", Some(&a), None).await;
    let text = text.as_str().unwrap_or_default().to_string();
    assert!(!text.contains("nodus_runs{"), "team-a has no runs: {text}");
    let (_, text) = api.call(Method::GET, "/metrics", Some(&b), None).await;
    assert!(
        text.as_str()
            .unwrap_or_default()
            .contains("nodus_runs{phase=\"Pending\"} 1"),
        "{text}"
    );
    let (status, document) = api.call(Method::GET, "/openapi.json", None, None).await;
    assert_eq!(status, StatusCode::OK);
    let document = document.to_string();
    for word in ["team-a", "team-b", "only-a", "secret-run", "boss"] {
        assert!(!document.contains(word), "{word} in /openapi.json");
    }
    assert!(
        document.contains("/tokens"),
        "the token routes are documented"
    );
}

/// A deleted token is refused on the very next request; an expired one too; the secret is
/// shown once and stored nowhere.
#[tokio::test]
async fn deleted_and_expired_tokens_are_refused_on_the_next_request() {
    let api = api().await;
    api.project("team-a").await;
    let path = format!("{ROOT}/team-a/agents");
    let doomed = api.token("team-a", "doomed", "read").await;
    api.ok(Method::GET, &path, &doomed, None).await;
    let listed = api
        .ok(
            Method::GET,
            &format!("{ROOT}/team-a/tokens"),
            OPERATOR,
            None,
        )
        .await;
    assert!(!listed.to_string().contains(&doomed), "never shown again");
    assert!(!listed.to_string().contains("tokenHash"), "{listed}");
    api.ok(
        Method::DELETE,
        &format!("{ROOT}/team-a/tokens/doomed"),
        OPERATOR,
        None,
    )
    .await;
    let (status, _) = api.call(Method::GET, &path, Some(&doomed), None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "revoked at once");
    let (status, answer) = api
        .call(
            Method::DELETE,
            &format!("{ROOT}/team-a/tokens/doomed"),
            Some(OPERATOR),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{answer}");

    let created = api
        .ok(
            Method::POST,
            &format!("{ROOT}/team-a/tokens"),
            OPERATOR,
            Some(
                json!({"metadata": {"name": "brief"}, "spec": {"role": "write", "expires": "1h"}}),
            ),
        )
        .await;
    let brief = created["token"].as_str().expect("secret").to_string();
    assert!(created["spec"]["expiresAt"].is_string(), "{created}");
    assert_eq!(created["spec"]["role"], "write");
    api.ok(Method::GET, &path, &brief, None).await;
    // An hour later: its expiry is moved into the past in the store.
    let store = api.state.store.clone();
    let named = store
        .get(&ObjectKey::new(
            "team-a",
            nodus_server::auth::TOKEN,
            "brief",
        ))
        .await
        .expect("the token's name");
    let hash = named.document["tokenHash"]
        .as_str()
        .expect("hash")
        .to_string();
    assert!(
        !named.document.to_string().contains(&brief),
        "stored as a hash only"
    );
    let key = ObjectKey::new(
        nodus_server::auth::SYSTEM_PROJECT,
        nodus_server::auth::TOKEN,
        hash,
    );
    let record = store.get(&key).await.expect("the token");
    assert!(
        !record.document.to_string().contains(&brief),
        "stored as a hash only"
    );
    let mut document = record.document.clone();
    document["spec"]["expiresAt"] = json!("2020-01-01T00:00:00Z");
    store
        .update(&key, record.version, document)
        .await
        .expect("aged");
    let (status, answer) = api.call(Method::GET, &path, Some(&brief), None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{answer}");
    assert!(
        answer["message"]
            .as_str()
            .unwrap_or_default()
            .contains("expired"),
        "{answer}"
    );
    assert!(
        !answer.to_string().contains(&brief),
        "the token is not echoed"
    );
}

/// Bad roles, durations, names and projects are refused naming the field; nothing is
/// written; a second token of a name is a conflict; the operator token stays.
#[tokio::test]
async fn bad_token_and_project_requests_name_the_field_and_write_nothing() {
    let api = api().await;
    api.project("team-a").await;
    let tokens = format!("{ROOT}/team-a/tokens");
    let before = api.ok(Method::GET, &tokens, OPERATOR, None).await;
    for (body, field) in [
        (
            json!({"metadata": {"name": "t"}, "spec": {"role": "owner"}}),
            "spec.role",
        ),
        (
            json!({"metadata": {"name": "t"}, "spec": {"role": "read", "expires": "30y"}}),
            "spec.expires",
        ),
        (
            json!({"metadata": {"name": "t"}, "spec": {"role": "read", "expires": "0d"}}),
            "spec.expires",
        ),
        (
            json!({"metadata": {"name": "Not_A_Label"}, "spec": {"role": "read"}}),
            "metadata.name",
        ),
        (
            json!({"metadata": {"name": "t"}, "spec": {"role": "read", "admin": true}}),
            "body",
        ),
    ] {
        let (status, answer) = api
            .call(Method::POST, &tokens, Some(OPERATOR), Some(body.clone()))
            .await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}: {answer}");
        assert_eq!(answer["details"]["field"], field, "{body}: {answer}");
    }
    let (status, answer) = api
        .call(
            Method::POST,
            &format!("{ROOT}/nowhere/tokens"),
            Some(OPERATOR),
            Some(json!({"metadata": {"name": "t"}, "spec": {"role": "read"}})),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{answer}");
    assert_eq!(answer["details"]["field"], "project", "{answer}");
    assert_eq!(answer["details"]["value"], "\"nowhere\"", "{answer}");
    assert_eq!(
        api.ok(Method::GET, &tokens, OPERATOR, None).await,
        before,
        "nothing written"
    );
    let (status, answer) = api
        .call(
            Method::POST,
            ROOT,
            Some(OPERATOR),
            Some(json!({"metadata": {"name": "Team A"}})),
        )
        .await;
    assert_eq!(
        answer["details"]["field"], "metadata.name",
        "{status} {answer}"
    );
    let (status, _) = api
        .call(
            Method::POST,
            ROOT,
            Some(OPERATOR),
            Some(json!({"metadata": {"name": "team-a"}})),
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT);

    api.token("team-a", "ci", "read").await;
    let (status, answer) = api
        .call(
            Method::POST,
            &tokens,
            Some(OPERATOR),
            Some(json!({"metadata": {"name": "ci"}, "spec": {"role": "admin"}})),
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{answer}");
    // The operator token is listed in `default` and cannot be deleted over the API.
    let listed = api
        .ok(
            Method::GET,
            &format!("{ROOT}/default/tokens"),
            OPERATOR,
            None,
        )
        .await;
    assert_eq!(listed["items"][0]["metadata"]["name"], "admin", "{listed}");
    assert_eq!(listed["items"][0]["spec"]["operator"], true, "{listed}");
    let (status, _) = api
        .call(
            Method::DELETE,
            &format!("{ROOT}/default/tokens/admin"),
            Some(OPERATOR),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    api.ok(Method::GET, &tokens, OPERATOR, None).await;
}

/// On SQLite and PostgreSQL: projects and tokens survive a restart, a restart rewrites none
/// of them, and a token deleted or expired is refused on the next request.
#[tokio::test]
async fn tokens_hold_across_restarts_on_sqlite_and_postgres() {
    for store in ["sqlite", "postgres"] {
        let dir = tempfile::tempdir().expect("tempdir");
        let url = match store {
            "sqlite" => StoreUrl::Sqlite(dir.path().join("nodus.db")),
            _ => StoreUrl::Postgres(postgres_url()),
        };
        let (router, state) = build(&dir, url.clone()).await;
        let api = Api {
            router,
            state,
            _dir: tempfile::tempdir().expect("tempdir"),
        };
        api.project("team-a").await;
        let reader = api.token("team-a", "reader", "read").await;
        let doomed = api.token("team-a", "doomed", "write").await;
        let agents = format!("{ROOT}/team-a/agents");
        let (status, _) = api
            .call(Method::POST, &agents, Some(&reader), Some(agent("a1")))
            .await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{store}");
        api.ok(Method::POST, &agents, &doomed, Some(agent("a1")))
            .await;
        drop(api);

        // Restarted: the tokens work as before, and deleting one revokes it at once.
        let (router, state) = build(&dir, url).await;
        let api = Api {
            router,
            state,
            _dir: tempfile::tempdir().expect("tempdir"),
        };
        api.ok(Method::GET, &agents, &reader, None).await;
        api.ok(Method::GET, &agents, &doomed, None).await;
        let listed = api
            .ok(
                Method::GET,
                &format!("{ROOT}/team-a/tokens"),
                OPERATOR,
                None,
            )
            .await;
        assert_eq!(
            listed["items"].as_array().map(Vec::len),
            Some(2),
            "{store}: {listed}"
        );
        api.ok(
            Method::DELETE,
            &format!("{ROOT}/team-a/tokens/doomed"),
            OPERATOR,
            None,
        )
        .await;
        let (status, _) = api.call(Method::GET, &agents, Some(&doomed), None).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{store}");
        api.ok(Method::GET, &agents, &reader, None).await;
        let (status, _) = api
            .call(Method::POST, &agents, Some(&reader), Some(agent("a2")))
            .await;
        assert_eq!(
            status,
            StatusCode::FORBIDDEN,
            "{store}: still read after a restart"
        );
    }
}

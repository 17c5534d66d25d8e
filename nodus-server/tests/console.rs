//! The console's routes without a socket (`oneshot`), beside the API as `nodus server` serves
//! them: sessions, another project's run, the CSRF token, the security headers, and paging
//! through 1,000 runs. The browser tests (`sdk/python/tests/console`) drive the same pages in
//! Chromium.

mod support;

use axum::body::Body;
use axum::http::{HeaderMap, Method, Request, StatusCode, header};
use nodus_server::StoreUrl;
use serde_json::{Value, json};
use support::{BASE, TOKEN, agent};
use tower::ServiceExt;

struct Console {
    router: axum::Router,
    state: std::sync::Arc<nodus_server::AppState>,
    _dir: tempfile::TempDir,
}

struct Answer {
    status: StatusCode,
    headers: HeaderMap,
    body: String,
}

/// The console beside the API, as `nodus server` serves them (support's harness).
async fn console(store: StoreUrl) -> Console {
    let dir = tempfile::tempdir().expect("tempdir");
    let (api, state) = support::build(&dir, store).await;
    Console {
        router: nodus_server::console::router(state.clone()).merge(api),
        state,
        _dir: dir,
    }
}

impl Console {
    async fn send(
        &self,
        method: Method,
        path: &str,
        headers: &[(header::HeaderName, String)],
        body: Option<String>,
    ) -> Answer {
        let mut request = Request::builder().method(method).uri(path);
        for (name, value) in headers {
            request = request.header(name, value);
        }
        let request = request
            .body(body.map(Body::from).unwrap_or_else(Body::empty))
            .expect("request");
        let response = self
            .router
            .clone()
            .oneshot(request)
            .await
            .expect("response");
        let status = response.status();
        let headers = response.headers().clone();
        let bytes = axum::body::to_bytes(response.into_body(), usize::MAX)
            .await
            .expect("body");
        Answer {
            status,
            headers,
            body: String::from_utf8_lossy(&bytes).into_owned(),
        }
    }

    async fn api(&self, method: Method, path: &str, token: &str, body: Value) -> Answer {
        self.send(
            method,
            &format!("{BASE}{path}"),
            &[
                (header::AUTHORIZATION, format!("Bearer {token}")),
                (header::CONTENT_TYPE, "application/json".to_string()),
            ],
            Some(body.to_string()),
        )
        .await
    }

    /// A new project, made by the operator.
    async fn project(&self, name: &str) {
        let made = self
            .send(
                Method::POST,
                BASE,
                &[
                    (header::AUTHORIZATION, format!("Bearer {TOKEN}")),
                    (header::CONTENT_TYPE, "application/json".to_string()),
                ],
                Some(json!({"metadata": {"name": name}}).to_string()),
            )
            .await;
        assert_eq!(made.status, StatusCode::CREATED, "{}", made.body);
    }

    /// A new token of `project` only, with this role: its secret.
    async fn token(&self, project: &str, name: &str, role: &str) -> String {
        let made = self
            .api(
                Method::POST,
                &format!("/{project}/tokens"),
                TOKEN,
                json!({"metadata": {"name": name}, "spec": {"role": role}}),
            )
            .await;
        assert_eq!(made.status, StatusCode::CREATED, "{}", made.body);
        let made: Value = serde_json::from_str(&made.body).expect("json");
        made["token"].as_str().expect("token").to_string()
    }

    /// Signs in with `token`: the session cookie.
    async fn sign_in(&self, token: &str) -> String {
        let answer = self
            .form("/console/signin", None, &[("token", token)])
            .await;
        assert_eq!(answer.status, StatusCode::SEE_OTHER, "{}", answer.body);
        let cookie = answer.headers[header::SET_COOKIE]
            .to_str()
            .expect("cookie")
            .to_string();
        assert!(
            cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"),
            "{cookie}"
        );
        assert!(!cookie.contains(token));
        cookie.split(';').next().expect("pair").to_string()
    }

    async fn form(&self, path: &str, cookie: Option<&str>, fields: &[(&str, &str)]) -> Answer {
        let body = fields
            .iter()
            .map(|(k, v)| format!("{k}={}", form_value(v)))
            .collect::<Vec<_>>()
            .join("&");
        let mut headers = vec![(
            header::CONTENT_TYPE,
            "application/x-www-form-urlencoded".to_string(),
        )];
        if let Some(cookie) = cookie {
            headers.push((header::COOKIE, cookie.to_string()));
        }
        self.send(Method::POST, path, &headers, Some(body)).await
    }

    async fn page(&self, path: &str, cookie: &str) -> Answer {
        self.send(
            Method::GET,
            path,
            &[(header::COOKIE, cookie.to_string())],
            None,
        )
        .await
    }
}

fn form_value(value: &str) -> String {
    value
        .bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b == b'_' || b == b'-' {
                char::from(b).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

fn run(name: &str, input: &str) -> Value {
    json!({"apiVersion": "nodus.dev/v1", "kind": "AgentRun", "metadata": {"name": name},
           "spec": {"agent": "hello-agent", "input": input}})
}

fn csrf_of(page: &str) -> String {
    page.split("name=\"csrf\" value=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .expect("a csrf field")
        .to_string()
}

fn check_policy(answer: &Answer) {
    let policy = answer.headers[header::CONTENT_SECURITY_POLICY]
        .to_str()
        .expect("policy");
    assert!(policy.contains("default-src 'self'"), "{policy}");
    assert!(policy.contains("script-src 'self'"), "{policy}");
    assert!(!policy.contains("unsafe"), "{policy}");
    assert_eq!(answer.headers[header::X_CONTENT_TYPE_OPTIONS], "nosniff");
}

#[tokio::test]
async fn another_projects_run_is_not_reachable_and_the_switcher_holds_the_tokens_projects() {
    let console = console(StoreUrl::Memory).await;
    console.project("other").await;
    let other_token = console.token("other", "team", "write").await;
    let default_token = console.token("default", "mine", "write").await;
    // A run in project "other", made with that project's own token.
    let made = console
        .api(
            Method::POST,
            "/other/agents",
            &other_token,
            agent("hello-agent"),
        )
        .await;
    assert_eq!(made.status, StatusCode::CREATED, "{}", made.body);
    let made = console
        .api(
            Method::POST,
            "/other/agentruns",
            &other_token,
            run("private-run", "the other project's secret input"),
        )
        .await;
    assert_eq!(made.status, StatusCode::CREATED, "{}", made.body);
    // A token of "default" only: another project's run, in every form, and a project that
    // does not exist, answer the same Forbidden and show nothing.
    let cookie = console.sign_in(&default_token).await;
    for (path, project) in [
        ("/console/p/other/runs/private-run", "other"),
        ("/console/p/other/runs/private-run?fragment=1", "other"),
        ("/console/p/other/runs/private-run/steps/0", "other"),
        ("/console/p/other/agents", "other"),
        ("/console/p/other/groups", "other"),
        ("/console/p/other/credits", "other"),
        ("/console/p/nowhere/runs/private-run", "nowhere"),
    ] {
        let answer = console.page(path, &cookie).await;
        assert_eq!(answer.status, StatusCode::FORBIDDEN, "{path}");
        assert!(
            answer.body.contains(&format!(
                "this token does not hold project &quot;{project}&quot;"
            )),
            "{path}: {}",
            answer.body
        );
        assert!(!answer.body.contains("secret input"), "{path}");
        check_policy(&answer);
    }
    // Its actions too: nothing is done.
    let page = console.page("/console/p/default/agents", &cookie).await;
    let csrf = csrf_of(&page.body);
    let cancel = console
        .form(
            "/console/p/other/runs/private-run/cancel",
            Some(&cookie),
            &[("csrf", &csrf)],
        )
        .await;
    assert_eq!(cancel.status, StatusCode::FORBIDDEN, "{}", cancel.body);
    let run = console
        .state
        .engine
        .get_run("other", "private-run")
        .await
        .expect("run");
    assert_eq!(run.status.cancel_requested, None);
    assert_eq!(run.status.phase.map(|p| p.name()), Some("Pending"));
    // The events of another project are refused too.
    let events = console.page("/console/p/other/events", &cookie).await;
    assert_eq!(events.status, StatusCode::FORBIDDEN);
    // The switcher holds the token's one project.
    let switcher = |body: &str| {
        body.split("id=\"projects\"")
            .nth(1)
            .and_then(|rest| rest.split("</nav>").next())
            .expect("switcher")
            .to_string()
    };
    let mine = switcher(&page.body);
    assert!(mine.contains("href=\"/console/p/default/agents\" aria-current=\"page\""));
    assert_eq!(mine.matches("<a ").count(), 1, "{mine}");
    // The owner sees it; the operator holds every project and switches between them.
    let owner = console.sign_in(&other_token).await;
    let page = console
        .page("/console/p/other/runs/private-run", &owner)
        .await;
    assert_eq!(page.status, StatusCode::OK);
    assert!(page.body.contains("the other project&#39;s secret input"));
    let operator = console.sign_in(TOKEN).await;
    let page = console.page("/console/p/other/agents", &operator).await;
    assert_eq!(page.status, StatusCode::OK);
    let all = switcher(&page.body);
    assert!(all.contains("href=\"/console/p/default/agents\""));
    assert!(all.contains("href=\"/console/p/other/agents\" aria-current=\"page\""));
    // No page shows a token.
    for token in [TOKEN, &other_token, &default_token] {
        assert!(!page.body.contains(token));
    }
    // A deleted token ends its sessions at their next request.
    let deleted = console
        .send(
            Method::DELETE,
            &format!("{BASE}/other/tokens/team"),
            &[(header::AUTHORIZATION, format!("Bearer {TOKEN}"))],
            None,
        )
        .await;
    assert_eq!(deleted.status, StatusCode::OK, "{}", deleted.body);
    let after = console
        .page("/console/p/other/runs/private-run", &owner)
        .await;
    assert_eq!(after.status, StatusCode::SEE_OTHER);
    assert_eq!(after.headers[header::LOCATION], "/console/signin");
}

#[tokio::test]
async fn sessions_csrf_and_headers() {
    let console = console(StoreUrl::Memory).await;
    console
        .api(Method::POST, "/default/agents", TOKEN, agent("hello-agent"))
        .await;
    console
        .api(
            Method::POST,
            "/default/agentruns",
            TOKEN,
            run("r1", "<script>alert(1)</script>"),
        )
        .await;
    // No session, a made-up one: to sign-in (a page), 401 (a fragment, the events).
    for cookie in ["", "nodus_console_session=0000"] {
        let page = console.page("/console/p/default/agents", cookie).await;
        assert_eq!(page.status, StatusCode::SEE_OTHER);
        assert_eq!(page.headers[header::LOCATION], "/console/signin");
        check_policy(&page);
        let fragment = console
            .page("/console/p/default/agents?fragment=1", cookie)
            .await;
        assert_eq!(fragment.status, StatusCode::UNAUTHORIZED);
        let events = console.page("/console/p/default/events", cookie).await;
        assert_eq!(events.status, StatusCode::UNAUTHORIZED);
    }
    // A wrong token: refused, named, not shown back.
    let wrong = console
        .form(
            "/console/signin",
            None,
            &[("token", "nodus_wrong_token_123456")],
        )
        .await;
    assert_eq!(wrong.status, StatusCode::UNAUTHORIZED);
    assert!(
        wrong
            .body
            .contains("token: is not a valid token of this server")
    );
    assert!(!wrong.body.contains("nodus_wrong_token_123456"));
    assert!(wrong.headers.get(header::SET_COOKIE).is_none());
    // Another site's form: refused, even with a valid token (it would sign the browser in
    // as the other site's user); the same site's is taken.
    let foreign = console
        .send(
            Method::POST,
            "/console/signin",
            &[
                (header::HOST, "127.0.0.1:8080".to_string()),
                (header::ORIGIN, "https://evil.example".to_string()),
                (
                    header::CONTENT_TYPE,
                    "application/x-www-form-urlencoded".to_string(),
                ),
            ],
            Some(format!("token={TOKEN}")),
        )
        .await;
    assert_eq!(foreign.status, StatusCode::FORBIDDEN);
    assert!(foreign.body.contains("Origin: must be this server"));
    assert!(foreign.headers.get(header::SET_COOKIE).is_none());
    let same = console
        .send(
            Method::POST,
            "/console/signin",
            &[
                (header::HOST, "127.0.0.1:8080".to_string()),
                (header::ORIGIN, "http://127.0.0.1:8080".to_string()),
                (
                    header::CONTENT_TYPE,
                    "application/x-www-form-urlencoded".to_string(),
                ),
            ],
            Some(format!("token={TOKEN}")),
        )
        .await;
    assert_eq!(same.status, StatusCode::SEE_OTHER);
    let empty = console
        .form("/console/signin", None, &[("token", " ")])
        .await;
    assert_eq!(empty.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert!(empty.body.contains("token: is required"));
    // Signed in: the run's input is text.
    let cookie = console.sign_in(TOKEN).await;
    let page = console.page("/console/p/default/runs/r1", &cookie).await;
    assert_eq!(page.status, StatusCode::OK);
    check_policy(&page);
    assert!(page.body.contains("&lt;script&gt;alert(1)&lt;/script&gt;"));
    assert!(!page.body.contains("<script>alert"));
    assert!(!page.body.contains(TOKEN));
    // Actions without the session's CSRF token, with another session's, or not as a form:
    // refused, nothing done.
    let other_session = console.sign_in(TOKEN).await;
    let other_csrf = csrf_of(
        &console
            .page("/console/p/default/agents", &other_session)
            .await
            .body,
    );
    let csrf = csrf_of(&page.body);
    assert_ne!(csrf, other_csrf);
    for fields in [
        vec![],
        vec![("csrf", "x")],
        vec![("csrf", other_csrf.as_str())],
    ] {
        let refused = console
            .form("/console/p/default/runs/r1/cancel", Some(&cookie), &fields)
            .await;
        assert_eq!(refused.status, StatusCode::FORBIDDEN, "{fields:?}");
        assert!(refused.body.contains("csrf: must be the form"));
    }
    let foreign = console
        .send(
            Method::POST,
            "/console/p/default/runs/r1/cancel",
            &[
                (header::COOKIE, cookie.clone()),
                (header::HOST, "127.0.0.1:8080".to_string()),
                (header::ORIGIN, "null".to_string()),
                (
                    header::CONTENT_TYPE,
                    "application/x-www-form-urlencoded".to_string(),
                ),
            ],
            Some(format!("csrf={csrf}")),
        )
        .await;
    assert_eq!(foreign.status, StatusCode::FORBIDDEN);
    assert!(foreign.body.contains("Origin: must be this server"));
    let not_a_form = console
        .send(
            Method::POST,
            "/console/p/default/runs/r1/cancel",
            &[
                (header::COOKIE, cookie.clone()),
                (header::CONTENT_TYPE, "application/json".to_string()),
            ],
            Some(format!("{{\"csrf\": \"{csrf}\"}}")),
        )
        .await;
    assert_eq!(not_a_form.status, StatusCode::FORBIDDEN);
    let run = console
        .state
        .engine
        .get_run("default", "r1")
        .await
        .expect("run");
    assert_eq!(run.status.cancel_requested, None);
    // An empty message and an unknown resolution are named.
    let empty = console
        .form(
            "/console/p/default/runs/r1/message",
            Some(&cookie),
            &[("csrf", &csrf), ("payload", "")],
        )
        .await;
    assert_eq!(empty.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert!(empty.body.contains("payload"));
    let resolve = console
        .form(
            "/console/p/default/runs/r1/resolve",
            Some(&cookie),
            &[("csrf", &csrf), ("action", "<b>x</b>")],
        )
        .await;
    assert_eq!(resolve.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert!(resolve.body.contains("action"));
    assert!(resolve.body.contains("&lt;b&gt;x&lt;/b&gt;"));
    // With it: done, back to the run.
    let cancel = console
        .form(
            "/console/p/default/runs/r1/cancel",
            Some(&cookie),
            &[("csrf", &csrf)],
        )
        .await;
    assert_eq!(cancel.status, StatusCode::SEE_OTHER, "{}", cancel.body);
    assert_eq!(
        cancel.headers[header::LOCATION],
        "/console/p/default/runs/r1"
    );
    let run = console
        .state
        .engine
        .get_run("default", "r1")
        .await
        .expect("run");
    // Not started (no controller here): cancelled at once.
    assert!(
        run.status.cancel_requested.is_some()
            || run.status.phase.map(|p| p.name()) == Some("Cancelled"),
        "{:?}",
        run.status
    );
    // Sign-out ends the session, and only that one.
    let out = console
        .form("/console/signout", Some(&cookie), &[("csrf", &csrf)])
        .await;
    assert_eq!(out.status, StatusCode::SEE_OTHER);
    assert!(
        out.headers[header::SET_COOKIE]
            .to_str()
            .expect("cookie")
            .contains("Max-Age=0")
    );
    let after = console.page("/console/p/default/agents", &cookie).await;
    assert_eq!(after.status, StatusCode::SEE_OTHER);
    let still = console
        .page("/console/p/default/agents", &other_session)
        .await;
    assert_eq!(still.status, StatusCode::OK);
    // The assets: compiled in, with their types.
    let js = console.page("/console/assets/console.js", "").await;
    assert_eq!(
        js.headers[header::CONTENT_TYPE],
        "text/javascript; charset=utf-8"
    );
    assert!(js.body.contains("EventSource"));
    check_policy(&js);
}

#[tokio::test]
async fn paging_through_1000_runs_visits_each_once_on_sqlite() {
    let dir = tempfile::tempdir().expect("tempdir");
    let console = console(StoreUrl::Sqlite(dir.path().join("nodus.db"))).await;
    console
        .api(Method::POST, "/default/agents", TOKEN, agent("hello-agent"))
        .await;
    let mut made_names = std::collections::BTreeSet::new();
    for batch in 0..10 {
        let items: Vec<Value> = (0..100)
            .map(|i| {
                made_names.insert(format!("r-{batch}-{i}"));
                run(&format!("r-{batch}-{i}"), "hi")
            })
            .collect();
        let made = console
            .api(
                Method::POST,
                "/default/agentruns",
                TOKEN,
                json!({"apiVersion": "nodus.dev/v1", "kind": "AgentRunList", "items": items}),
            )
            .await;
        assert_eq!(made.status, StatusCode::CREATED, "{}", made.body);
    }
    let cookie = console.sign_in(TOKEN).await;
    // The runs page, 150 a page, followed by its "next page" links (how fast a page loads is
    // measured by scripts/bench-console, not here).
    let mut seen = Vec::new();
    let mut path = "/console/p/default/runs?limit=150".to_string();
    let mut pages = 0;
    loop {
        pages += 1;
        assert!(pages <= 8, "more pages than 1000 runs at 150 a page make");
        let page = console.page(&path, &cookie).await;
        assert_eq!(page.status, StatusCode::OK, "{path}");
        for row in page.body.split("<tr data-run=\"").skip(1) {
            seen.push(row.split('"').next().expect("name").to_string());
        }
        let Some(link) = page
            .body
            .split("<a id=\"next-page\" rel=\"next\" href=\"")
            .nth(1)
        else {
            assert!(
                page.body.contains("id=\"last-page\""),
                "{path}: no next and no last page"
            );
            break;
        };
        path = link.split('"').next().expect("href").replace("&amp;", "&");
    }
    assert_eq!(pages, 7, "1000 runs at 150 a page");
    assert_eq!(seen.len(), 1000, "every run once");
    let unique: std::collections::BTreeSet<String> = seen.into_iter().collect();
    assert_eq!(unique, made_names);
}

//! The console at `/console`: server-rendered pages of a project's agents, runs, groups and
//! credits, read through the same engine and store calls as the REST API, so that they show
//! the API's values. Pages of running work update by themselves: `console.js` listens to a
//! stream of server-sent events (the change wait of [`crate::watch`] in a loop) and fetches
//! the page's live part again.
//!
//! Sign-in takes a token once and answers an HttpOnly, SameSite=Strict cookie holding a
//! random session id; the sessions (with the token, which is checked again on every request
//! so that a removed token ends its sessions) are kept in this process's memory: a restart
//! signs everyone out, and with several replicas a browser must stay on one. The token is
//! never in a page, a URL or a log. Every state-changing action is a POST carrying the
//! session's CSRF token (compared in constant time); every answer carries a strict
//! Content-Security-Policy, and the pages have no inline script or event handler.

mod charts;
mod compare;
mod egress;
mod group;
pub(crate) mod html;
mod jobs;
mod lists;
mod pages;
mod run;
mod session;
mod timeline;
mod transcript;

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware;
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use nodus_core::lifecycle::Resolution;
use nodus_core::resource::Kind;
use nodus_core::store::ObjectKey;
use serde::Deserialize;
use tokio::time::Instant;

use crate::auth::{DEFAULT_PROJECT, Principal, SYSTEM_PROJECT, TEMPLATE_PROJECT};
use crate::error::ApiError;
use crate::state::AppState;
use crate::watch::Woken;

pub use html::{Html, escape};
pub(crate) use session::SignedIn;
use session::{
    COOKIE, MAX_SESSIONS, NotSignedIn, SESSION_LIFETIME, Session, bearer, cross_origin_refused,
    csrf_ok, csrf_refused, form_fields, random_hex, same_origin,
};

/// How often an idle event stream says it is still there.
const KEEP_ALIVE: Duration = Duration::from_secs(20);
/// The least time between two change events of a stream: a busy project (a group of a
/// thousand runs) makes a page fetch its live part at most a few times a second.
const MIN_EVENT_INTERVAL: Duration = Duration::from_millis(250);
/// The Content-Security-Policy of every console answer: scripts, styles and connections from
/// the server only, no inline script or style, no framing, forms post only here.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'self'; script-src 'self'; \
     style-src 'self'; img-src 'self'; connect-src 'self'; form-action 'self'; \
     frame-ancestors 'none'; base-uri 'none'; object-src 'none'";

const CSS: &str = include_str!("assets/console.css");
const JS: &str = include_str!("assets/console.js");
/// The console's state: the server's, and the sessions in memory.
struct Console {
    app: Arc<AppState>,
    sessions: Mutex<HashMap<String, Session>>,
}

/// The console's routes, under `/console`.
pub fn router(app: Arc<AppState>) -> Router {
    let console = Arc::new(Console {
        app,
        sessions: Mutex::new(HashMap::new()),
    });
    Router::new()
        .route("/console", get(home))
        .route("/console/", get(home))
        .route("/console/signin", get(signin_page).post(signin))
        .route("/console/signout", post(signout))
        .route("/console/assets/console.css", get(css))
        .route("/console/assets/console.js", get(js))
        .route("/console/p/{project}", get(project_home))
        .route("/console/p/{project}/agents", get(agents))
        .route("/console/p/{project}/runs", get(runs))
        .route("/console/p/{project}/compare", get(compare_page))
        .route("/console/p/{project}/runs/{name}", get(run))
        .route("/console/p/{project}/runs/{name}/steps/{seq}", get(step))
        .route(
            "/console/p/{project}/runs/{name}/results/{result}",
            get(run_result),
        )
        .route("/console/p/{project}/environments", get(environments))
        .route(
            "/console/p/{project}/runs/{name}/{action}",
            post(run_action),
        )
        .route("/console/p/{project}/groups", get(groups))
        .route("/console/p/{project}/groups/{name}", get(group))
        .route("/console/p/{project}/groups/{name}/results", get(results))
        .route(
            "/console/p/{project}/groups/{name}/charts",
            get(group_charts),
        )
        .route("/console/p/{project}/credits", get(credits))
        .route("/console/p/{project}/events", get(events))
        .layer(middleware::from_fn_with_state(console.clone(), admit_forms))
        .layer(middleware::map_response(secure_headers))
        .with_state(console)
}

async fn secure_headers(mut response: Response) -> Response {
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CONTENT_SECURITY_POLICY),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    // Not `no-referrer`: with it a browser sends `Origin: null` on the console's own forms.
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("same-origin"),
    );
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

/// The largest sign-in form: a token and a CSRF field.
const MAX_SIGNIN_BODY_BYTES: usize = 8 * 1024;
/// The largest form of a signed-in page (a message to a run is at most 256 KiB).
const MAX_FORM_BODY_BYTES: usize = 2 * 1024 * 1024;

/// Admission of the console's forms before their bodies are read (crate::admission): a
/// sign-in form counts against the anonymous bodies; any other needs a live session, or the
/// browser is sent to sign in without its body being read.
async fn admit_forms(
    State(console): State<Arc<Console>>,
    request: axum::extract::Request,
    next: middleware::Next,
) -> Response {
    use crate::admission::{close, has_body};
    if !has_body(&request) {
        return next.run(request).await;
    }
    if request.method() != axum::http::Method::POST {
        // No console page reads the body of another method.
        return close(next.run(request).await);
    }
    let admitted = if request.uri().path() == "/console/signin" {
        console
            .app
            .admission
            .admit_body(request, MAX_SIGNIN_BODY_BYTES, None)
    } else {
        let Some(holder) = console.body_holder(request.headers()) else {
            return close(NotSignedIn::Redirect.into_response());
        };
        console
            .app
            .admission
            .admit_body(request, MAX_FORM_BODY_BYTES, Some(&holder))
    };
    match admitted {
        Ok((request, admitted)) => admitted.answer(next.run(request).await),
        Err(refused) => refused.into_response(),
    }
}

fn see_other(location: &str) -> Response {
    match HeaderValue::from_str(location) {
        Ok(value) => (StatusCode::SEE_OTHER, [(header::LOCATION, value)]).into_response(),
        Err(_) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    }
}

fn html_response(status: StatusCode, html: Html) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
        html.into_string(),
    )
        .into_response()
}

/// An error as a page: its status and sentence (escaped), and a way back.
fn error_page(error: &ApiError, back: Option<String>) -> Response {
    html_response(error.status(), pages::error(error, back.as_deref()))
}

async fn css() -> Response {
    ([(header::CONTENT_TYPE, "text/css; charset=utf-8")], CSS).into_response()
}

async fn js() -> Response {
    (
        [(header::CONTENT_TYPE, "text/javascript; charset=utf-8")],
        JS,
    )
        .into_response()
}

async fn home(State(console): State<Arc<Console>>, headers: HeaderMap) -> Response {
    match console.signed_in(&headers, true).await {
        Ok(signed) => match first_project(&signed.principal) {
            Some(project) => see_other(&format!(
                "/console/p/{}/agents",
                html::percent_encode(project)
            )),
            None => see_other("/console/signin"),
        },
        Err(response) => response,
    }
}

/// The project a signed-in browser starts in: `default` when the token holds it, else its
/// first project other than the read-only templates.
fn first_project(principal: &Principal) -> Option<&str> {
    let held = |name: &str| principal.projects.iter().any(|p| p == name);
    if held(DEFAULT_PROJECT) {
        return Some(DEFAULT_PROJECT);
    }
    principal
        .projects
        .iter()
        .map(String::as_str)
        .find(|p| *p != TEMPLATE_PROJECT)
        .or_else(|| principal.projects.first().map(String::as_str))
}

async fn project_home(Path(project): Path<String>) -> Response {
    see_other(&format!(
        "/console/p/{}/agents",
        html::percent_encode(&project)
    ))
}

async fn signin_page() -> Response {
    html_response(StatusCode::OK, pages::signin(None))
}

/// `POST /console/signin` with `token`: a new session, its cookie, and the first project.
async fn signin(State(console): State<Arc<Console>>, headers: HeaderMap, body: Bytes) -> Response {
    if !same_origin(&headers) {
        return cross_origin_refused();
    }
    let form = form_fields(&body);
    let token = form.get("token").map(|t| t.trim()).unwrap_or_default();
    if token.is_empty() {
        return html_response(
            StatusCode::UNPROCESSABLE_ENTITY,
            pages::signin(Some(
                "token: is required: paste the API token you were given",
            )),
        );
    }
    let principal = match console.app.auth.authenticate(&bearer(token)).await {
        Ok(principal) => principal,
        Err(error) if error.status() == StatusCode::UNAUTHORIZED => {
            return html_response(
                StatusCode::UNAUTHORIZED,
                pages::signin(Some("token: is not a valid token of this server")),
            );
        }
        Err(error) => return error_page(&error, None),
    };
    let Some(project) = first_project(&principal).map(str::to_string) else {
        return html_response(
            StatusCode::FORBIDDEN,
            pages::signin(Some("token: holds no project")),
        );
    };
    let (id, csrf) = match (random_hex(32), random_hex(32)) {
        (Ok(id), Ok(csrf)) => (id, csrf),
        (Err(error), _) | (_, Err(error)) => return error_page(&error, None),
    };
    {
        let mut sessions = console.sessions.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        sessions.retain(|_, session| session.expires > now);
        if sessions.len() >= MAX_SESSIONS
            && let Some(oldest) = sessions
                .iter()
                .min_by_key(|(_, session)| session.expires)
                .map(|(id, _)| id.clone())
        {
            sessions.remove(&oldest);
        }
        sessions.insert(
            id.clone(),
            Session {
                token: token.to_string(),
                token_id: principal.token_id.clone(),
                csrf,
                expires: now + SESSION_LIFETIME,
            },
        );
    }
    let cookie = format!(
        "{COOKIE}={id}; Path=/console; HttpOnly; SameSite=Strict; Max-Age={}",
        SESSION_LIFETIME.as_secs()
    );
    let mut response = see_other(&format!(
        "/console/p/{}/agents",
        html::percent_encode(&project)
    ));
    if let Ok(value) = HeaderValue::from_str(&cookie) {
        response.headers_mut().insert(header::SET_COOKIE, value);
    }
    response
}

/// `POST /console/signout`: the session ends and its cookie is cleared.
async fn signout(State(console): State<Arc<Console>>, headers: HeaderMap, body: Bytes) -> Response {
    let signed = match console.signed_in(&headers, true).await {
        Ok(signed) => signed,
        Err(response) => return response,
    };
    let form = form_fields(&body);
    if !same_origin(&headers) {
        return cross_origin_refused();
    }
    if !csrf_ok(&signed, &form) {
        return csrf_refused();
    }
    console.end_session(&signed.session);
    let mut response = see_other("/console/signin");
    response.headers_mut().insert(
        header::SET_COOKIE,
        HeaderValue::from_static(
            "nodus_console_session=; Path=/console; HttpOnly; SameSite=Strict; Max-Age=0",
        ),
    );
    response
}

#[derive(Deserialize, Default)]
struct PageQuery {
    /// `1`: only the page's live part, for `console.js`.
    #[serde(default)]
    fragment: Option<String>,
}

impl PageQuery {
    fn fragment(&self) -> bool {
        self.fragment.as_deref() == Some("1")
    }
}

/// A page of a project: the caller signed in and allowed to read it, then `render` (the
/// live part), in the layout unless only the fragment is asked for.
async fn project_page<F, Fut>(
    console: &Console,
    headers: &HeaderMap,
    project: &str,
    query: &PageQuery,
    tab: pages::Tab,
    title: String,
    render: F,
) -> Response
where
    F: FnOnce(Arc<AppState>, SignedIn) -> Fut,
    Fut: std::future::Future<Output = Result<pages::Page, ApiError>>,
{
    let fragment = query.fragment();
    let signed = match console.signed_in(headers, !fragment).await {
        Ok(signed) => signed,
        Err(response) => return response,
    };
    if let Err(error) = signed.principal.check_read(project) {
        return error_page(&error, None);
    }
    let layout = pages::Layout {
        project: project.to_string(),
        projects: signed.principal.projects.clone(),
        csrf: signed.csrf.clone(),
        tab,
        title,
    };
    match render(console.app.clone(), signed).await {
        Ok(page) if fragment => html_response(StatusCode::OK, page.live),
        Ok(page) => html_response(StatusCode::OK, pages::layout(&layout, page)),
        Err(error) => error_page(
            &error,
            Some(format!(
                "/console/p/{}/agents",
                html::percent_encode(project)
            )),
        ),
    }
}

async fn agents(
    State(console): State<Arc<Console>>,
    Path(project): Path<String>,
    Query(query): Query<PageQuery>,
    Query(filter): Query<lists::ListFilter>,
    headers: HeaderMap,
) -> Response {
    let p = project.clone();
    project_page(
        &console,
        &headers,
        &project,
        &query,
        pages::Tab::Agents,
        "Agents".to_string(),
        |app, _| async move { lists::agents(&app, &p, &filter).await },
    )
    .await
}

/// `GET /console/p/{project}/runs`: the project's runs a page at a time, filtered.
async fn runs(
    State(console): State<Arc<Console>>,
    Path(project): Path<String>,
    Query(query): Query<PageQuery>,
    Query(filter): Query<lists::ListFilter>,
    headers: HeaderMap,
) -> Response {
    let p = project.clone();
    project_page(
        &console,
        &headers,
        &project,
        &query,
        pages::Tab::Runs,
        "Runs".to_string(),
        |app, _| async move { lists::runs(&app, &p, &filter).await },
    )
    .await
}

/// `GET /console/p/{project}/compare?a=A&b=B`: `nodus eval compare A B` as a page.
async fn compare_page(
    State(console): State<Arc<Console>>,
    Path(project): Path<String>,
    Query(query): Query<PageQuery>,
    Query(groups): Query<compare::CompareQuery>,
    headers: HeaderMap,
) -> Response {
    let p = project.clone();
    project_page(
        &console,
        &headers,
        &project,
        &query,
        pages::Tab::Groups,
        "Compare evaluations".to_string(),
        |app, _| async move { compare::page(&app, &p, &groups).await },
    )
    .await
}

async fn run(
    State(console): State<Arc<Console>>,
    Path((project, name)): Path<(String, String)>,
    Query(query): Query<PageQuery>,
    headers: HeaderMap,
) -> Response {
    let (p, n) = (project.clone(), name.clone());
    project_page(
        &console,
        &headers,
        &project,
        &query,
        pages::Tab::Agents,
        format!("Run {name}"),
        |app, signed| async move { run::run(&app, &p, &n, &signed.csrf).await },
    )
    .await
}

async fn step(
    State(console): State<Arc<Console>>,
    Path((project, name, seq)): Path<(String, String, String)>,
    headers: HeaderMap,
) -> Response {
    let (p, n) = (project.clone(), name.clone());
    project_page(
        &console,
        &headers,
        &project,
        &PageQuery::default(),
        pages::Tab::Agents,
        format!("Run {name}: step {seq}"),
        |app, _| async move {
            let seq: u32 = seq.parse().map_err(|_| {
                ApiError::from(nodus_core::validate::Invalid::new(
                    "seq",
                    "is a step's position, a whole number",
                    format!("{seq:?}"),
                ))
            })?;
            pages::step(&app, &p, &n, seq).await
        },
    )
    .await
}

/// The console's page of the run `name`.
fn run_path(project: &str, name: &str) -> String {
    format!(
        "/console/p/{}/runs/{}",
        html::percent_encode(project),
        html::percent_encode(name)
    )
}

/// `GET /console/p/{project}/runs/{name}/results/{result}`: one result's file, downloaded
/// with the session (the API's route takes a bearer token, which a browser has not).
async fn run_result(
    State(console): State<Arc<Console>>,
    Path((project, name, result)): Path<(String, String, String)>,
    headers: HeaderMap,
) -> Response {
    let signed = match console.signed_in(&headers, true).await {
        Ok(signed) => signed,
        Err(response) => return response,
    };
    let back = run_path(&project, &name);
    let found = async {
        signed.principal.check_read(&project)?;
        Ok::<_, ApiError>(console.app.engine.result(&project, &name, &result).await?)
    }
    .await;
    match found {
        Ok(found) => crate::download::result_download(found),
        Err(error) => error_page(&error, Some(back)),
    }
}

async fn environments(
    State(console): State<Arc<Console>>,
    Path(project): Path<String>,
    Query(query): Query<PageQuery>,
    headers: HeaderMap,
) -> Response {
    let p = project.clone();
    project_page(
        &console,
        &headers,
        &project,
        &query,
        pages::Tab::Environments,
        "Environments".to_string(),
        |app, _| async move { jobs::environments(&app, &p).await },
    )
    .await
}

async fn groups(
    State(console): State<Arc<Console>>,
    Path(project): Path<String>,
    Query(query): Query<PageQuery>,
    headers: HeaderMap,
) -> Response {
    let p = project.clone();
    project_page(
        &console,
        &headers,
        &project,
        &query,
        pages::Tab::Groups,
        "Groups".to_string(),
        |app, _| async move { pages::groups(&app, &p).await },
    )
    .await
}

async fn group(
    State(console): State<Arc<Console>>,
    Path((project, name)): Path<(String, String)>,
    Query(query): Query<PageQuery>,
    Query(filter): Query<lists::ListFilter>,
    headers: HeaderMap,
) -> Response {
    let (p, n) = (project.clone(), name.clone());
    project_page(
        &console,
        &headers,
        &project,
        &query,
        pages::Tab::Groups,
        format!("Group {name}"),
        |app, _| async move { group::group(&app, &p, &n, &filter).await },
    )
    .await
}

/// `GET /console/p/{project}/groups/{name}/charts`: the group's progress and spend charts.
async fn group_charts(
    State(console): State<Arc<Console>>,
    Path((project, name)): Path<(String, String)>,
    Query(query): Query<PageQuery>,
    headers: HeaderMap,
) -> Response {
    let (p, n) = (project.clone(), name.clone());
    project_page(
        &console,
        &headers,
        &project,
        &query,
        pages::Tab::Groups,
        format!("Charts of {name}"),
        |app, _| async move { group::charts_page(&app, &p, &n).await },
    )
    .await
}

async fn results(
    State(console): State<Arc<Console>>,
    Path((project, name)): Path<(String, String)>,
    Query(query): Query<PageQuery>,
    headers: HeaderMap,
) -> Response {
    let (p, n) = (project.clone(), name.clone());
    project_page(
        &console,
        &headers,
        &project,
        &query,
        pages::Tab::Groups,
        format!("Results of {name}"),
        |app, _| async move { pages::results(&app, &p, &n).await },
    )
    .await
}

async fn credits(
    State(console): State<Arc<Console>>,
    Path(project): Path<String>,
    Query(query): Query<PageQuery>,
    headers: HeaderMap,
) -> Response {
    project_page(
        &console,
        &headers,
        &project,
        &query,
        pages::Tab::Credits,
        "Credits".to_string(),
        |app, signed| async move { pages::credits(&app, &signed.principal.projects).await },
    )
    .await
}

/// `POST /console/p/{project}/runs/{name}/{cancel|close|resolve|fork|message}`: the API's action,
/// then back to the run.
async fn run_action(
    State(console): State<Arc<Console>>,
    Path((project, name, action)): Path<(String, String, String)>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let signed = match console.signed_in(&headers, true).await {
        Ok(signed) => signed,
        Err(response) => return response,
    };
    let form = form_fields(&body);
    if !same_origin(&headers) {
        return cross_origin_refused();
    }
    if !csrf_ok(&signed, &form) {
        return csrf_refused();
    }
    let back = run_path(&project, &name);
    let engine = &console.app.engine;
    let done: Result<(), ApiError> = async {
        signed.principal.check_write(&project)?;
        match action.as_str() {
            "cancel" => {
                engine.cancel_run_and_wait(&project, &name).await?;
            }
            "close" => {
                engine.close_run(&project, &name).await?;
            }
            "resolve" => {
                let given = form.get("action").cloned().unwrap_or_default();
                let resolution: Resolution = serde_json::from_value(serde_json::Value::String(
                    given.clone(),
                ))
                .map_err(|_| {
                    nodus_core::validate::Invalid::new(
                        "action",
                        "is one of retry, recordFailed, cancel",
                        format!("{:?}", given.chars().take(40).collect::<String>()),
                    )
                })?;
                engine.resolve(&project, &name, resolution).await?;
            }
            "fork" => {
                let given = form.get("atStep").cloned().unwrap_or_default();
                let seq: u32 = given.parse().map_err(|_| {
                    nodus_core::validate::Invalid::new(
                        "atStep",
                        "is a step's number",
                        format!("{:?}", given.chars().take(40).collect::<String>()),
                    )
                })?;
                let request = nodus_core::engine::ForkRequest {
                    at: nodus_core::engine::AtStep::Seq(seq),
                    count: 1,
                    name: None,
                    agent: None,
                    input: None,
                    replace: false,
                };
                engine.fork(&project, &name, request).await?;
            }
            "message" => {
                let payload = form.get("payload").cloned().unwrap_or_default();
                engine.send_message(&project, &name, &payload, None).await?;
            }
            other => {
                return Err(ApiError::not_found(format!(
                    "no run action {:?}; there are cancel, close, resolve, fork and message",
                    other.chars().take(40).collect::<String>()
                )));
            }
        }
        Ok(())
    }
    .await;
    match done {
        Ok(()) => see_other(&back),
        Err(error) => error_page(&error, Some(back)),
    }
}

/// `GET /console/p/{project}/events`: server-sent events, a `change` whenever something of
/// the project (or its credits) is written, and a comment every [`KEEP_ALIVE`] when idle; the
/// stream ends when the server stops.
async fn events(
    State(console): State<Arc<Console>>,
    Path(project): Path<String>,
    headers: HeaderMap,
) -> Response {
    let signed = match console.signed_in(&headers, false).await {
        Ok(signed) => signed,
        Err(response) => return response,
    };
    if let Err(error) = signed.principal.check_read(&project) {
        return error.into_response();
    }
    // Counted against the session and its token, and ended with either.
    let mut holder = crate::admission::Holder::of_session(&signed.principal, &signed.session);
    let session_left = signed
        .session_ends
        .saturating_duration_since(Instant::now());
    let session_ends = jiff::Timestamp::now()
        .checked_add(session_left)
        .unwrap_or(jiff::Timestamp::MAX);
    holder.expires_at = Some(
        holder
            .expires_at
            .map_or(session_ends, |t| t.min(session_ends)),
    );
    let lease = match console.app.admission.open_stream(&holder) {
        Ok(lease) => lease,
        Err(refused) => return refused.into_response(),
    };
    // Subscribed before the answer: nothing written after the page's read is missed.
    let changes = console.app.watches.subscribe(console.app.store.as_ref());
    let now = Instant::now();
    let start = (
        changes,
        project,
        now.checked_sub(MIN_EVENT_INTERVAL).unwrap_or(now),
    );
    let stream = futures_util::stream::unfold(start, |(mut changes, project, last)| async move {
        // Changes meanwhile stay queued in the subscription: the next wait sees them.
        tokio::time::sleep_until(last + MIN_EVENT_INTERVAL).await;
        let deadline = Instant::now() + KEEP_ALIVE;
        let concerns = |key: &ObjectKey| {
            key.project == project
                || (key.project == SYSTEM_PROJECT
                    && key.kind == Kind::Account
                    && key.name == project)
        };
        let event = match changes.next(&concerns, deadline).await {
            Woken::Changed => Event::default().event("change").data("changed"),
            // Ended before its deadline: the server is stopping.
            Woken::Ended if Instant::now() < deadline => return None,
            Woken::Ended => Event::default().comment("idle"),
        };
        Some((
            Ok::<_, Infallible>(event),
            (changes, project, Instant::now()),
        ))
    });
    lease.bound(Sse::new(stream).into_response())
}

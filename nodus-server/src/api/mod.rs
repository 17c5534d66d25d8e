//! The REST API under `/apis/nodus.dev/v1/projects/{project}/…`, `/healthz`, `/metrics` and
//! `/openapi.json`. Handlers authenticate, parse, call the engine, and answer JSON; every
//! error goes through [`ApiError`](crate::error::ApiError).

pub(crate) mod credits;
mod openapi;
mod resources;
pub(crate) mod runs;
pub(crate) mod selectors;
mod tokens;

use std::sync::Arc;

use axum::Router;
use axum::extract::{DefaultBodyLimit, MatchedPath, Request, State};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodRouter, get, post};
use nodus_core::engine::Reason;
use serde_json::Value;

pub use crate::paging::MAX_LIMIT;

use crate::auth::Principal;
use crate::error::{ApiError, ApiResult};
use crate::state::AppState;

/// The prefix of every resource path.
pub const PREFIX: &str = "/apis/nodus.dev/v1/projects/{project}";
/// Where projects are listed and created.
pub const PROJECTS: &str = "/apis/nodus.dev/v1/projects";
/// The largest request body: a batch of 100 runs with large inputs.
const MAX_BODY_BYTES: usize = 32 * 1024 * 1024;

/// Every route of the API: its path and the handler of each method it takes. The OpenAPI
/// document ([`openapi::document`]) describes exactly these paths and methods (a test
/// holds the two together).
pub(crate) fn routes() -> Vec<(String, MethodRouter<Arc<AppState>>)> {
    let at = |path: &str| format!("{PREFIX}{path}");
    vec![
        ("/healthz".into(), get(healthz)),
        ("/metrics".into(), get(metrics)),
        ("/openapi.json".into(), get(openapi)),
        (
            "/apis/nodus.dev/v1/postrunactions".into(),
            get(post_run_actions),
        ),
        ("/apis/nodus.dev/v1/replicas".into(), get(replicas)),
        (
            "/apis/nodus.dev/v1/replicas/{name}/drain".into(),
            post(drain_replica),
        ),
        (
            PROJECTS.into(),
            get(tokens::list_projects).post(tokens::create_project),
        ),
        (at("/credits"), get(credits::get).post(credits::add)),
        (
            at("/tokens"),
            get(tokens::list_tokens).post(tokens::create_token),
        ),
        (
            at("/tokens/{name}"),
            get(tokens::get_token).delete(tokens::delete_token),
        ),
        (
            at("/{plural}"),
            get(resources::list).post(resources::create),
        ),
        (
            at("/{plural}/{name}"),
            get(resources::get)
                .put(resources::replace)
                .patch(resources::patch)
                .delete(resources::delete),
        ),
        (at("/agentruns/{name}/messages"), post(runs::send_message)),
        (at("/agentruns/{name}/steps"), get(runs::steps)),
        (at("/agentruns/{name}/logs"), get(runs::logs)),
        (at("/agentruns/{name}/answer"), get(runs::answer)),
        (at("/agentruns/{name}/workdir"), get(runs::workdir)),
        (at("/agentruns/{name}/results"), get(runs::results)),
        (at("/agentruns/{name}/results/{result}"), get(runs::result)),
        (at("/agentruns/{name}/cancel"), post(runs::cancel)),
        (at("/agentruns/{name}/fork"), post(runs::fork)),
        (at("/agentruns/{name}/close"), post(runs::close)),
        (at("/agentruns/{name}/resolve"), post(runs::resolve)),
        (at("/agentgroups/{name}/cancel"), post(runs::cancel_group)),
        (at("/agentgroups/{name}/results"), get(runs::group_results)),
        (at("/agentgroups/{name}/retry"), post(runs::retry_group)),
        (at("/agentgroups/{name}/rescore"), post(runs::rescore_group)),
    ]
}

/// The routes a worker replica (`--role worker`) serves: it drives runs and answers only
/// its health and its metrics.
pub const WORKER_PATHS: [&str; 2] = ["/healthz", "/metrics"];

/// The whole API.
pub fn router(state: Arc<AppState>) -> Router {
    router_of(state, routes())
}

/// A worker replica's API: [`WORKER_PATHS`] only.
pub fn worker_router(state: Arc<AppState>) -> Router {
    let routes = routes()
        .into_iter()
        .filter(|(path, _)| WORKER_PATHS.contains(&path.as_str()))
        .collect();
    router_of(state, routes)
}

fn router_of(state: Arc<AppState>, routes: Vec<(String, MethodRouter<Arc<AppState>>)>) -> Router {
    routes
        .into_iter()
        .fold(Router::new(), |router, (path, methods)| {
            router.route(&path, methods)
        })
        .fallback(not_found)
        .layer(middleware::from_fn_with_state(state.clone(), admit))
        .layer(middleware::from_fn(json_errors))
        .layer(middleware::from_fn_with_state(
            state.clone(),
            count_requests,
        ))
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(state)
}

/// The largest body of a route that takes one and is not a resource write (a message, a
/// token, a resolution): a message is at most 256 KiB, which JSON may escape to a few times
/// that.
const MAX_SMALL_BODY_BYTES: usize = 2 * 1024 * 1024;

/// The largest body the route at `path` (its pattern) takes with `method`; `None` when its
/// handler reads none.
fn body_limit(method: &Method, path: &str) -> Option<usize> {
    if !matches!(*method, Method::POST | Method::PUT | Method::PATCH) {
        return None;
    }
    let resource_write = path
        .strip_prefix(PREFIX)
        .is_some_and(|rest| rest == "/{plural}" || rest == "/{plural}/{name}");
    Some(if resource_write {
        MAX_BODY_BYTES
    } else {
        MAX_SMALL_BODY_BYTES
    })
}

/// Whether a request waits or streams for long: a watch (`watch=true`) or a follow
/// (`follow=true`).
fn is_long_lived(request: &Request) -> bool {
    let Some(query) = request.uri().query() else {
        return false;
    };
    serde_urlencoded::from_str::<Vec<(String, String)>>(query)
        .unwrap_or_default()
        .iter()
        .any(|(name, value)| {
            matches!(name.as_str(), "watch" | "follow") && matches!(value.as_str(), "true" | "1")
        })
}

/// Admission before the handler (crate::admission): a request with a body, or a watch or a
/// follow, is authenticated before anything else of it is read (a refusal closes the
/// connection); its body is checked against its route's limit, reserved and timed; its
/// stream is counted against its token and ended when the token is revoked or expires.
async fn admit(State(state): State<Arc<AppState>>, request: Request, next: Next) -> Response {
    let limit = request
        .extensions()
        .get::<MatchedPath>()
        .and_then(|path| body_limit(request.method(), path.as_str()));
    let has_body = crate::admission::has_body(&request);
    let long_lived = is_long_lived(&request);
    if limit.is_none() && has_body {
        // A body this route does not read is never read: the connection closes after the
        // answer instead of waiting for it.
        return crate::admission::close(next.run(request).await);
    }
    if !(has_body || long_lived) {
        return next.run(request).await;
    }
    let principal = match state.auth.authenticate(request.headers()).await {
        Ok(principal) => principal,
        Err(error) => return crate::admission::unauthenticated(error),
    };
    let holder = crate::admission::Holder::of(&principal);
    if let (true, Some(limit)) = (has_body, limit) {
        return match state.admission.admit_body(request, limit, Some(&holder)) {
            Ok((request, admitted)) => admitted.answer(next.run(request).await),
            Err(refused) => refused.into_response(),
        };
    }
    let lease = match state.admission.open_stream(&holder) {
        Ok(lease) => lease,
        Err(refused) => return refused.into_response(),
    };
    let response = tokio::select! {
        response = next.run(request) => response,
        () = lease.ended() => return crate::admission::close(token_ended().into_response()),
    };
    // A long poll that answers now may have waited past its token's deletion: what changed
    // since is not shown to it (its stream, once started, ends within a second).
    if let Ok(false) = state.auth.is_valid(&principal.token_id).await {
        return crate::admission::close(token_ended().into_response());
    }
    lease.bound(response)
}

/// The answer to a long poll whose token was revoked or expired while it waited.
fn token_ended() -> ApiError {
    ApiError::new(
        StatusCode::UNAUTHORIZED,
        Reason::Unauthorized,
        "this token was deleted or expired while the request waited",
    )
}

/// `GET /apis/nodus.dev/v1/postrunactions`: the post-run actions this server installs (any
/// valid token).
async fn post_run_actions(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    caller(&state, &headers).await?;
    Ok(reply(
        StatusCode::OK,
        serde_json::json!({"kind": "PostRunActionList", "items": state.engine.post_run_actions()}),
    ))
}

/// The fleet's replicas as the store knows them (the operator token).
async fn replicas(State(state): State<Arc<AppState>>, headers: HeaderMap) -> ApiResult<Response> {
    caller(&state, &headers)
        .await?
        .check_operator("list replicas")?;
    let items = crate::replicas::list(state.store.as_ref()).await?;
    Ok(reply(
        StatusCode::OK,
        serde_json::json!({"kind": "ReplicaList", "items": items}),
    ))
}

/// Ask the replica `name` to drain, as SIGTERM does (the operator token): it may be another
/// process, which hears it through the store. 202: the replica's document, `spec.drain` set.
async fn drain_replica(
    State(state): State<Arc<AppState>>,
    axum::extract::Path(name): axum::extract::Path<String>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    caller(&state, &headers)
        .await?
        .check_operator("drain a replica")?;
    match crate::replicas::request_drain(state.store.as_ref(), &name).await {
        Ok(document) => Ok(reply(StatusCode::ACCEPTED, document)),
        Err(nodus_core::store::Error::NotFound(_)) => Err(ApiError::not_found(format!(
            "no replica named {name:?} shares this store (`nodus get replicas` lists them)"
        ))),
        Err(error) => Err(error.into()),
    }
}

async fn count_requests(
    State(state): State<Arc<AppState>>,
    request: Request,
    next: Next,
) -> Response {
    state.metrics.request();
    next.run(request).await
}

/// Gives the errors that axum answers by itself (a body over [`MAX_BODY_BYTES`], a query that
/// does not parse, a method a path does not have) the API's JSON shape and a reason.
async fn json_errors(request: Request, next: Next) -> Response {
    let response = next.run(request).await;
    let status = response.status();
    let is_json = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if !status.is_client_error() || is_json {
        return response;
    }
    let text = axum::body::to_bytes(response.into_body(), 64 * 1024)
        .await
        .map(|bytes| String::from_utf8_lossy(&bytes).trim().to_string())
        .unwrap_or_default();
    let (reason, message) = match status {
        StatusCode::PAYLOAD_TOO_LARGE => (
            Reason::Invalid,
            format!(
                "the request body is larger than {} MiB",
                MAX_BODY_BYTES / (1024 * 1024)
            ),
        ),
        StatusCode::METHOD_NOT_ALLOWED => (
            Reason::MethodNotAllowed,
            "this path does not take that method".to_string(),
        ),
        _ => (Reason::Invalid, text),
    };
    ApiError::new(status, reason, message).into_response()
}

async fn healthz() -> &'static str {
    "ok\n"
}

/// `/metrics`: without a token, only the server's own counters (nothing about any project);
/// with one, the runs of the projects it holds too (every project for the operator token).
/// A token that is not valid is refused.
async fn metrics(State(state): State<Arc<AppState>>, headers: HeaderMap) -> ApiResult<Response> {
    let caller = if headers.contains_key(header::AUTHORIZATION) {
        Some(caller(&state, &headers).await?)
    } else {
        None
    };
    let text = state
        .metrics
        .render(&state.engine, state.store.as_ref(), caller.as_ref())
        .await;
    Ok(([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response())
}

async fn openapi() -> Response {
    axum::Json(openapi::document()).into_response()
}

async fn not_found() -> ApiError {
    ApiError::not_found("no such path; the API lives under /apis/nodus.dev/v1/projects/{project}/")
}

/// The caller, or `Unauthorized`.
async fn caller(state: &AppState, headers: &HeaderMap) -> ApiResult<Principal> {
    state.auth.authenticate(headers).await
}

/// A request body as JSON.
fn json_body(body: &[u8]) -> ApiResult<Value> {
    if body.is_empty() {
        return Err(ApiError::malformed("the request needs a JSON body"));
    }
    serde_json::from_slice(body)
        .map_err(|e| ApiError::malformed(format!("the body is not valid JSON: {e}")))
}

/// The body read as a `T`; when it is JSON of another shape, a Malformed error that says the
/// shape expected (`shape`) and what serde found wrong.
fn shaped_body<T: serde::de::DeserializeOwned>(body: &[u8], shape: &str) -> ApiResult<T> {
    serde_json::from_value(json_body(body)?)
        .map_err(|e| ApiError::malformed(format!("{shape}: {e}")))
}

/// A JSON answer with a status.
fn reply(status: StatusCode, value: impl serde::Serialize) -> Response {
    (status, axum::Json(value)).into_response()
}

//! The REST API under `/apis/nodus.dev/v1/projects/{project}/…`, `/healthz`, `/metrics` and
//! `/openapi.json`. Handlers authenticate, parse, call the engine, and answer JSON; every
//! error goes through [`ApiError`](crate::error::ApiError).

pub(crate) mod credits;
mod pages;
mod resources;
pub(crate) mod runs;
mod selectors;
mod tokens;

use std::sync::Arc;

use axum::Router;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodRouter, get, post};
use nodus_core::engine::Reason;
use serde_json::Value;

pub use pages::{ContinueKey, MAX_LIMIT};

use crate::app::AppState;
use crate::auth::Principal;
use crate::error::{ApiError, ApiResult};

/// The prefix of every resource path.
pub const PREFIX: &str = "/apis/nodus.dev/v1/projects/{project}";
/// Where projects are listed and created.
pub const PROJECTS: &str = "/apis/nodus.dev/v1/projects";
/// The largest request body: a batch of 100 runs with large inputs.
const MAX_BODY_BYTES: usize = 32 * 1024 * 1024;

/// Every route of the API: its path and the handler of each method it takes. The OpenAPI
/// document ([`crate::openapi::document`]) describes exactly these paths and methods (a test
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
        (at("/agentruns/{name}/close"), post(runs::close)),
        (at("/agentruns/{name}/resolve"), post(runs::resolve)),
        (at("/agentgroups/{name}/cancel"), post(runs::cancel_group)),
        (at("/agentgroups/{name}/results"), get(runs::group_results)),
    ]
}

/// The whole API.
pub fn router(state: Arc<AppState>) -> Router {
    routes()
        .into_iter()
        .fold(Router::new(), |router, (path, methods)| {
            router.route(&path, methods)
        })
        .fallback(not_found)
        .layer(middleware::from_fn(json_errors))
        .layer(middleware::from_fn_with_state(
            state.clone(),
            count_requests,
        ))
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(state)
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
    axum::Json(crate::openapi::document()).into_response()
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

/// A JSON answer with a status.
fn reply(status: StatusCode, value: impl serde::Serialize) -> Response {
    (status, axum::Json(value)).into_response()
}

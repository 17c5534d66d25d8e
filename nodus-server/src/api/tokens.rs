//! Projects and tokens: `…/projects` (list: any token; create: the operator token) and
//! `…/projects/{project}/tokens[/{name}]` (admin tokens of the project).

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use nodus_core::resource::API_VERSION;
use serde_json::{Value, json};

use super::{caller, json_body, reply};
use crate::error::ApiResult;
use crate::state::AppState;

fn list(kind: &str, items: Vec<Value>) -> Value {
    json!({"apiVersion": API_VERSION, "kind": format!("{kind}List"), "items": items})
}

/// `GET /apis/nodus.dev/v1/projects`: the projects the token holds.
pub async fn list_projects(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    let caller = caller(&state, &headers).await?;
    let items = state.auth.list_projects(&caller).await?;
    Ok(reply(StatusCode::OK, list("Project", items)))
}

/// `POST /apis/nodus.dev/v1/projects` (the operator token).
pub async fn create_project(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult<Response> {
    caller(&state, &headers)
        .await?
        .check_operator("create projects")?;
    let created = state
        .auth
        .create_project(json_body(&body)?, &state.ledger)
        .await?;
    Ok(reply(StatusCode::CREATED, created))
}

const MANAGE: &str = "manage tokens";

/// `GET …/tokens`
pub async fn list_tokens(
    State(state): State<Arc<AppState>>,
    Path(project): Path<String>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    caller(&state, &headers)
        .await?
        .check_admin(&project, MANAGE)?;
    let items = state.auth.list_tokens(&project).await?;
    Ok(reply(StatusCode::OK, list("Token", items)))
}

/// `POST …/tokens`: the answer holds the token (`token`), shown this once.
pub async fn create_token(
    State(state): State<Arc<AppState>>,
    Path(project): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult<Response> {
    let caller = caller(&state, &headers).await?;
    // The operator holds every project that exists: for one that does not, the request's
    // project is what is wrong.
    if !caller.operator || state.auth.project_exists(&project).await? {
        caller.check_admin(&project, MANAGE)?;
    }
    let created = state.auth.create_token(&project, json_body(&body)?).await?;
    Ok(reply(StatusCode::CREATED, created))
}

/// `GET …/tokens/{name}`
pub async fn get_token(
    State(state): State<Arc<AppState>>,
    Path((project, name)): Path<(String, String)>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    caller(&state, &headers)
        .await?
        .check_admin(&project, MANAGE)?;
    Ok(reply(
        StatusCode::OK,
        state.auth.get_token(&project, &name).await?,
    ))
}

/// `DELETE …/tokens/{name}`: refused from the next request on.
pub async fn delete_token(
    State(state): State<Arc<AppState>>,
    Path((project, name)): Path<(String, String)>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    caller(&state, &headers)
        .await?
        .check_admin(&project, MANAGE)?;
    state.auth.delete_token(&project, &name).await?;
    Ok(reply(
        StatusCode::OK,
        json!({"kind": "Status", "status": "Success", "message": format!("Token {name:?} deleted")}),
    ))
}

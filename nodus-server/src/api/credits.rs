//! A project's credits: what runs reserve against, and what an operator adds.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use nodus_core::Usd;
use nodus_core::validate::Invalid;
use serde::Deserialize;

use super::{caller, json_body, reply};
use crate::error::{ApiError, ApiResult};
use crate::state::AppState;

/// `GET …/credits`
pub async fn get(
    State(state): State<Arc<AppState>>,
    Path(project): Path<String>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    caller(&state, &headers).await?.check_read(&project)?;
    Ok(reply(StatusCode::OK, state.ledger.account(&project).await?))
}

/// Credits to add.
#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct AddCredits {
    /// The amount to add to the balance.
    #[serde(rename = "addUSD")]
    add_usd: Usd,
}

/// `POST …/credits` with `{"addUSD": "5.00"}` (admin tokens only).
pub async fn add(
    State(state): State<Arc<AppState>>,
    Path(project): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult<Response> {
    caller(&state, &headers)
        .await?
        .check_admin(&project, "add credits")?;
    let body: AddCredits = serde_json::from_value(json_body(&body)?).map_err(|e| {
        ApiError::from(Invalid::new(
            "addUSD",
            "is a decimal amount of dollars such as \"5.00\"",
            e.to_string(),
        ))
    })?;
    Ok(reply(
        StatusCode::OK,
        state.ledger.add(&project, body.add_usd).await?,
    ))
}

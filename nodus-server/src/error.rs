//! The API's errors: one JSON shape with a stable machine-readable reason, mapped from every
//! error below in one place.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use nodus_core::engine::{self, Reason};
use nodus_core::store;
use nodus_core::validate::Invalid;
use serde::Serialize;

/// An error answer: HTTP status, reason (`NotFound`, `Invalid`, `Conflict`, …) and a sentence.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, thiserror::Error)]
#[error("{reason}: {message}")]
pub struct ApiError {
    #[serde(skip)]
    status: u16,
    /// The stable reason scripts can rely on.
    pub reason: Reason,
    /// A sentence a person understands.
    pub message: String,
    /// For `Invalid`: the field, the rule and the value.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub details: Option<Invalid>,
}

impl ApiError {
    /// An error with this status and reason.
    pub fn new(status: StatusCode, reason: Reason, message: impl Into<String>) -> Self {
        ApiError {
            status: status.as_u16(),
            reason,
            message: message.into(),
            details: None,
        }
    }

    /// A failure of the server itself (sealing or opening a Secret).
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            Reason::InternalError,
            message,
        )
    }

    /// The request body is not JSON, or not of the expected shape.
    pub fn malformed(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, Reason::Invalid, message)
    }

    /// A query parameter breaks its rule: 400, with the field, the rule and the value.
    pub fn bad_parameter(invalid: Invalid) -> Self {
        ApiError {
            status: StatusCode::BAD_REQUEST.as_u16(),
            reason: Reason::Invalid,
            message: invalid.to_string(),
            details: Some(invalid),
        }
    }

    /// No such thing.
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, Reason::NotFound, message)
    }

    /// The caller is not authenticated.
    pub fn unauthorized() -> Self {
        Self::new(
            StatusCode::UNAUTHORIZED,
            Reason::Unauthorized,
            "a valid bearer token is required (Authorization: Bearer <token>)",
        )
    }

    /// The caller may not do this; says nothing about whether the target exists.
    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::new(StatusCode::FORBIDDEN, Reason::Forbidden, message)
    }

    /// The status code.
    pub fn status(&self) -> StatusCode {
        StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
    }
}

impl From<Invalid> for ApiError {
    fn from(invalid: Invalid) -> Self {
        ApiError {
            status: StatusCode::UNPROCESSABLE_ENTITY.as_u16(),
            reason: Reason::Invalid,
            message: invalid.to_string(),
            details: Some(invalid),
        }
    }
}

impl From<engine::Error> for ApiError {
    fn from(error: engine::Error) -> Self {
        if let engine::Error::Invalid(invalid) = error {
            return invalid.into();
        }
        let reason = error.reason();
        let status = status_of(reason);
        if status == StatusCode::INTERNAL_SERVER_ERROR {
            tracing::error!(error = %error, "internal error");
        }
        ApiError::new(status, reason, error.to_string())
    }
}

/// The HTTP status of a reason.
fn status_of(reason: Reason) -> StatusCode {
    match reason {
        Reason::NotFound => StatusCode::NOT_FOUND,
        Reason::AlreadyExists
        | Reason::Conflict
        | Reason::AgentRunFinished
        | Reason::AgentStopped => StatusCode::CONFLICT,
        Reason::Invalid => StatusCode::UNPROCESSABLE_ENTITY,
        Reason::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        Reason::TooManyRequests => StatusCode::TOO_MANY_REQUESTS,
        Reason::Unauthorized => StatusCode::UNAUTHORIZED,
        Reason::Forbidden => StatusCode::FORBIDDEN,
        Reason::WorkdirNotKept => StatusCode::NOT_FOUND,
        Reason::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
        Reason::InternalError => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

impl From<store::Error> for ApiError {
    fn from(error: store::Error) -> Self {
        engine::Error::from(error).into()
    }
}

#[derive(Serialize)]
struct Body<'a> {
    kind: &'static str,
    status: &'static str,
    code: u16,
    #[serde(flatten)]
    error: &'a ApiError,
}

/// What a 503 tells the client to wait before it tries again, in seconds: the store is
/// restarting or out of connections, or the disk is full, and the request may pass later.
pub const RETRY_AFTER_SECONDS: u32 = 5;

impl ApiError {
    /// The JSON body this error answers (a `Status`), also the object of a watch stream's
    /// `ERROR` event.
    pub fn status_body(&self) -> serde_json::Value {
        let body = Body {
            kind: "Status",
            status: "Failure",
            code: self.status,
            error: self,
        };
        serde_json::to_value(&body).unwrap_or_default()
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = Body {
            kind: "Status",
            status: "Failure",
            code: self.status,
            error: &self,
        };
        let mut response = (self.status(), Json(&body)).into_response();
        if self.status() == StatusCode::SERVICE_UNAVAILABLE {
            response.headers_mut().insert(
                axum::http::header::RETRY_AFTER,
                axum::http::HeaderValue::from(RETRY_AFTER_SECONDS),
            );
        }
        response
    }
}

/// The API's result type.
pub type ApiResult<T> = Result<T, ApiError>;

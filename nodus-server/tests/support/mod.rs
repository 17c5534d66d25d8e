//! The harness of the API tests: a server built on a store of the test's choice with the
//! unisolated sandbox and a known operator token, called without a socket (`oneshot`).

#![allow(dead_code)]

use axum::body::Body;
use axum::http::{Method, Request, StatusCode, header};
use nodus_server::{Options, SandboxKind, Server, StoreUrl};
use serde_json::{Value, json};
use tower::ServiceExt;

/// The operator's token, given as `--bootstrap-token`.
pub const TOKEN: &str = "nodus_test_admin_token_0123456789abcdef";
/// Where projects are listed; each project's resources are below it.
pub const BASE: &str = "/apis/nodus.dev/v1/projects";

/// The API of a server built for one test.
pub struct Api {
    pub router: axum::Router,
    pub state: std::sync::Arc<nodus_server::AppState>,
    pub _dir: tempfile::TempDir,
}

/// A server on the in-memory store.
pub async fn api() -> Api {
    let dir = tempfile::tempdir().expect("tempdir");
    let (router, state) = build(&dir, StoreUrl::Memory).await;
    Api {
        router,
        state,
        _dir: dir,
    }
}

/// Build a server on `store` with its data directory in `dir`.
pub async fn build(
    dir: &tempfile::TempDir,
    store: StoreUrl,
) -> (axum::Router, std::sync::Arc<nodus_server::AppState>) {
    // The server makes its data directory owner-only; a temporary directory is not.
    let mut options = Options::new(dir.path().join("data"));
    options.store = Some(store);
    options.sandbox = SandboxKind::Unisolated;
    options.bootstrap_token = Some(TOKEN.to_string());
    let server = Server::build(options).await.expect("server builds");
    let state = server.state();
    (nodus_server::router(state.clone()), state)
}

impl Api {
    /// A call with a JSON body (a merge patch for PATCH): (status, body).
    pub async fn call(
        &self,
        method: Method,
        path: &str,
        token: Option<&str>,
        body: Option<Value>,
    ) -> (StatusCode, Value) {
        self.raw(method, path, token, body.map(|b| b.to_string()), &[])
            .await
    }

    /// A call with this body as it is and more headers: (status, body).
    pub async fn raw(
        &self,
        method: Method,
        path: &str,
        token: Option<&str>,
        body: Option<String>,
        headers: &[(&str, &str)],
    ) -> (StatusCode, Value) {
        let content_type = if method == Method::PATCH {
            "application/merge-patch+json"
        } else {
            "application/json"
        };
        let mut request = Request::builder().method(method).uri(path);
        if let Some(token) = token {
            request = request.header(header::AUTHORIZATION, format!("Bearer {token}"));
        }
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let request = request
            .header(header::CONTENT_TYPE, content_type)
            .body(body.map(Body::from).unwrap_or_else(Body::empty))
            .expect("request");
        let response = self
            .router
            .clone()
            .oneshot(request)
            .await
            .expect("response");
        let status = response.status();
        let bytes = axum::body::to_bytes(response.into_body(), usize::MAX)
            .await
            .expect("body");
        let value = serde_json::from_slice(&bytes)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()));
        (status, value)
    }

    /// A call that must succeed; its body.
    pub async fn ok(&self, method: Method, path: &str, token: &str, body: Option<Value>) -> Value {
        let (status, value) = self.call(method, path, Some(token), body).await;
        assert!(status.is_success(), "{path}: {status} {value}");
        value
    }
}

/// An Agent on Nodus's Claude.
pub fn agent(name: &str) -> Value {
    json!({"apiVersion": "nodus.dev/v1", "kind": "Agent", "metadata": {"name": name},
           "spec": {"system": "You are careful.", "model": {"access": "Nodus"}, "perRunMaxCostUSD": "0.50"}})
}

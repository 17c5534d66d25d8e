//! The HTTP client for the Nodus API: one reqwest client (HTTP/1.1 over rustls with the ring
//! provider, as nodus-llm builds it), bearer auth, paths under
//! `/apis/nodus.dev/v1/projects/{project}/…`, and the server's error bodies turned into
//! [`Error::Server`]. Tokens never appear in an error or a debug print.

use std::sync::Arc;
use std::time::Duration;

use reqwest::{Method, Url};
use serde_json::Value;

use nodus_core::engine::Reason;

use crate::error::{Error, Result};

/// The largest response body read.
const MAX_BODY_BYTES: usize = 64 * 1024 * 1024;

/// The longest a streamed answer ([`Client::get_stream`]) is read.
const STREAM_TIMEOUT: Duration = Duration::from_secs(7 * 24 * 3600);

/// A connection to one server, for one project.
#[derive(Clone)]
pub struct Client {
    http: reqwest::Client,
    base: Url,
    token: String,
    /// The project requests go to.
    pub project: String,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("base", &self.base.as_str())
            .field("project", &self.project)
            .finish_non_exhaustive()
    }
}

/// The body of a request.
pub enum Body {
    /// JSON.
    Json(Value),
    /// A JSON merge patch.
    MergePatch(Value),
}

/// Checks that `text` is an absolute http(s) URL and returns it without a trailing slash.
pub fn server_url(text: &str) -> Result<Url> {
    let url = Url::parse(text.trim())
        .map_err(|e| Error::input(format!("the server {text:?} is not a URL: {e}")))?;
    if !matches!(url.scheme(), "http" | "https") || url.cannot_be_a_base() {
        return Err(Error::input(format!(
            "the server {text:?} is not an http:// or https:// URL"
        )));
    }
    Ok(url)
}

fn build_http() -> Result<reqwest::Client> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verifier = rustls_platform_verifier::Verifier::new(provider.clone())
        .map_err(|e| Error::Start(format!("TLS certificate verifier: {e}")))?;
    let mut tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::Start(format!("TLS versions: {e}")))?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(verifier))
        .with_no_client_auth();
    tls.alpn_protocols = vec![b"http/1.1".to_vec()];
    reqwest::Client::builder()
        .tls_backend_preconfigured(tls)
        .connect_timeout(Duration::from_secs(10))
        .timeout(Duration::from_secs(120))
        .retry(reqwest::retry::never())
        .build()
        .map_err(|e| Error::Start(format!("HTTP client: {e}")))
}

impl Client {
    /// A client for `server` with `token`, working in `project`.
    pub fn new(server: &str, token: &str, project: &str) -> Result<Client> {
        Ok(Client {
            http: build_http()?,
            base: server_url(server)?,
            token: token.to_string(),
            project: project.to_string(),
        })
    }

    /// The server's base URL.
    pub fn server(&self) -> String {
        self.base.as_str().trim_end_matches('/').to_string()
    }

    /// The URL of `segments` under the base (each segment escaped).
    fn url(&self, segments: &[&str], query: &[(&str, &str)]) -> Url {
        let mut url = self.base.clone();
        if let Ok(mut path) = url.path_segments_mut() {
            path.pop_if_empty().extend(segments);
        }
        if !query.is_empty() {
            url.query_pairs_mut().extend_pairs(query);
        }
        url
    }

    /// Path segments of `…/projects/{project}/{rest…}`.
    fn project_segments<'a>(&'a self, rest: &[&'a str]) -> Vec<&'a str> {
        let mut segments = vec!["apis", "nodus.dev", "v1", "projects", self.project.as_str()];
        segments.extend_from_slice(rest);
        segments
    }

    fn unreachable(&self, error: &reqwest::Error) -> Error {
        // The innermost cause says it best ("Connection refused (os error 111)").
        let mut reason = error.to_string();
        let mut source = std::error::Error::source(error);
        while let Some(inner) = source {
            reason = inner.to_string();
            source = inner.source();
        }
        if error.is_timeout() {
            reason = format!("timed out ({reason})");
        }
        Error::Unreachable {
            server: self.server(),
            reason,
        }
    }

    /// Sends a request to `segments` under the project and reads the JSON answer.
    pub async fn call(
        &self,
        method: Method,
        rest: &[&str],
        query: &[(&str, &str)],
        body: Option<Body>,
    ) -> Result<Value> {
        self.send(method, &self.project_segments(rest), query, body, &[])
            .await
    }

    /// Sends a request with extra headers.
    pub async fn send(
        &self,
        method: Method,
        segments: &[&str],
        query: &[(&str, &str)],
        body: Option<Body>,
        headers: &[(&str, &str)],
    ) -> Result<Value> {
        let mut request = self
            .http
            .request(method, self.url(segments, query))
            .bearer_auth(&self.token)
            .header("accept", "application/json");
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        request = match body {
            None => request,
            Some(Body::Json(value)) => request
                .header("content-type", "application/json")
                .body(value.to_string()),
            Some(Body::MergePatch(value)) => request
                .header("content-type", "application/merge-patch+json")
                .body(value.to_string()),
        };
        let response = request.send().await.map_err(|e| self.unreachable(&e))?;
        let status = response.status();
        let bytes = response.bytes().await.map_err(|e| self.unreachable(&e))?;
        if bytes.len() > MAX_BODY_BYTES {
            return Err(Error::Unreachable {
                server: self.server(),
                reason: format!("the answer is larger than {MAX_BODY_BYTES} bytes"),
            });
        }
        if status.is_success() {
            if bytes.is_empty() {
                return Ok(Value::Null);
            }
            return serde_json::from_slice(&bytes).map_err(|e| Error::Unreachable {
                server: self.server(),
                reason: format!("the answer is not JSON ({e}); is this a Nodus server?"),
            });
        }
        Err(server_error(status.as_u16(), &bytes))
    }

    /// `GET` of a path under the project.
    pub async fn get(&self, rest: &[&str]) -> Result<Value> {
        self.call(Method::GET, rest, &[], None).await
    }

    /// `GET` of a binary answer (an archive) under the project.
    pub async fn get_bytes(&self, rest: &[&str]) -> Result<Vec<u8>> {
        let response = self
            .http
            .get(self.url(&self.project_segments(rest), &[]))
            .bearer_auth(&self.token)
            .send()
            .await
            .map_err(|e| self.unreachable(&e))?;
        let status = response.status();
        let bytes = response.bytes().await.map_err(|e| self.unreachable(&e))?;
        if status.is_success() {
            Ok(bytes.to_vec())
        } else {
            Err(server_error(status.as_u16(), &bytes))
        }
    }

    /// `GET` of a streamed answer under the project (read as it comes, with
    /// [`reqwest::Response::chunk`]), with no time limit but the server's; an error status
    /// is read whole and returned as [`Error::Server`].
    pub async fn get_stream(
        &self,
        rest: &[&str],
        query: &[(&str, &str)],
    ) -> Result<reqwest::Response> {
        let response = self
            .http
            .get(self.url(&self.project_segments(rest), query))
            .bearer_auth(&self.token)
            .timeout(STREAM_TIMEOUT)
            .send()
            .await
            .map_err(|e| self.unreachable(&e))?;
        let status = response.status();
        if status.is_success() {
            return Ok(response);
        }
        let bytes = response.bytes().await.map_err(|e| self.unreachable(&e))?;
        Err(server_error(status.as_u16(), &bytes))
    }

    /// `POST` of JSON to a path under the project.
    pub async fn post(&self, rest: &[&str], body: Value) -> Result<Value> {
        self.call(Method::POST, rest, &[], Some(Body::Json(body)))
            .await
    }
}

/// The server's error body as an [`Error::Server`]; a body that is not a Status names the
/// HTTP status instead.
pub fn server_error(code: u16, body: &[u8]) -> Error {
    let parsed: Option<Value> = serde_json::from_slice(body).ok();
    let field = |name: &str| {
        parsed
            .as_ref()
            .and_then(|v| v.get(name))
            .and_then(Value::as_str)
            .map(str::to_string)
    };
    // A reason this client does not know (a newer server's) is read as its status says.
    let reason = field("reason")
        .and_then(|text| Reason::parse(&text))
        .unwrap_or(match code {
            401 => Reason::Unauthorized,
            403 => Reason::Forbidden,
            404 => Reason::NotFound,
            409 => Reason::Conflict,
            400 | 422 => Reason::Invalid,
            503 => Reason::Unavailable,
            _ => Reason::InternalError,
        });
    let message = field("message").unwrap_or_else(|| {
        let text = String::from_utf8_lossy(body);
        let text = text.trim();
        if text.is_empty() {
            format!("the server answered HTTP {code}")
        } else {
            format!(
                "HTTP {code}: {}",
                text.chars().take(500).collect::<String>()
            )
        }
    });
    Error::Server {
        code,
        reason,
        message,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_bodies_become_server_errors() {
        let body = br#"{"kind":"Status","status":"Failure","code":409,"reason":"AgentRunFinished","message":"run x has finished (Succeeded)"}"#;
        let error = server_error(409, body);
        assert_eq!(
            error.render(),
            "Error from server (AgentRunFinished): run x has finished (Succeeded)"
        );
        let error = server_error(502, b"<html>bad gateway</html>");
        assert_eq!(
            error.render(),
            "Error from server (InternalError): HTTP 502: <html>bad gateway</html>"
        );
        assert!(server_error(404, b"").is_not_found());
    }

    #[test]
    fn urls_escape_names_and_keep_a_base_path() {
        let client = Client::new("http://127.0.0.1:7070/", "t", "default").expect("client");
        let url = client.url(
            &client.project_segments(&["agentruns", "a b/c"]),
            &[("labelSelector", "a=b,c=d")],
        );
        assert_eq!(
            url.as_str(),
            "http://127.0.0.1:7070/apis/nodus.dev/v1/projects/default/agentruns/a%20b%2Fc?labelSelector=a%3Db%2Cc%3Dd"
        );
        let client = Client::new("https://example.com/nodus", "t", "p").expect("client");
        assert_eq!(
            client.url(&["healthz"], &[]).as_str(),
            "https://example.com/nodus/healthz"
        );
        assert!(!format!("{client:?}").contains("\"t\""));
        assert!(Client::new("ftp://x", "t", "p").is_err());
        assert!(Client::new("127.0.0.1:7070", "t", "p").is_err());
    }
}

//! Console sessions: the cookie, signing in and out of memory, and the checks every form
//! passes (its session's CSRF token, its page's origin).

use std::collections::BTreeMap;
use std::time::Duration;

use axum::body::Bytes;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use tokio::time::Instant;

use super::{Console, error_page, see_other};
use crate::auth::Principal;
use crate::error::ApiError;

/// The console's cookie: a session id, never the token.
pub(super) const COOKIE: &str = "nodus_console_session";
/// How long a session lasts after sign-in.
pub(super) const SESSION_LIFETIME: Duration = Duration::from_secs(12 * 3600);

/// The most sessions kept; signing in past it ends the one closest to its end.
pub(super) const MAX_SESSIONS: usize = 10_000;

/// A signed-in browser: its token (kept here, checked again on every request), its CSRF
/// token, and when it ends. No `Debug`: it holds a token.
pub(super) struct Session {
    pub(super) token: String,
    /// The token's id ([`Principal::token_id`]): what the session's streams are counted by.
    pub(super) token_id: String,
    pub(super) csrf: String,
    pub(super) expires: Instant,
}

/// A request of a signed-in browser.
pub(crate) struct SignedIn {
    pub(super) principal: Principal,
    pub(super) csrf: String,
    pub(super) session: String,
    /// When the session ends (its streams end then, or when its token does).
    pub(super) session_ends: Instant,
}

/// Random hex of `bytes` bytes.
pub(super) fn random_hex(bytes: usize) -> Result<String, ApiError> {
    let mut buffer = vec![0u8; bytes];
    getrandom::fill(&mut buffer)
        .map_err(|e| ApiError::internal(format!("no randomness for a session: {e}")))?;
    Ok(buffer.iter().map(|b| format!("{b:02x}")).collect())
}

/// Equal, in a time that depends on the lengths only.
fn same_secret(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .fold(0u8, |diff, (x, y)| diff | (x ^ y))
            == 0
}

/// The session id of the request's cookie.
fn session_id(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, _)| *name == COOKIE)
        .map(|(_, value)| value.to_string())
}

/// Where a request without a valid session goes.
pub(super) enum NotSignedIn {
    /// A page: to the sign-in page.
    Redirect,
    /// A fragment or an event stream: 401, and the page reloads.
    Unauthorized,
}

impl IntoResponse for NotSignedIn {
    fn into_response(self) -> Response {
        match self {
            NotSignedIn::Redirect => see_other("/console/signin"),
            NotSignedIn::Unauthorized => (
                StatusCode::UNAUTHORIZED,
                [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
                "not signed in\n",
            )
                .into_response(),
        }
    }
}

impl Console {
    /// The signed-in caller, or where to send them. The session's token is checked again:
    /// a token removed since ends its sessions.
    pub(super) async fn signed_in(
        &self,
        headers: &HeaderMap,
        page: bool,
    ) -> Result<SignedIn, Response> {
        let refuse = || {
            if page {
                NotSignedIn::Redirect.into_response()
            } else {
                NotSignedIn::Unauthorized.into_response()
            }
        };
        let Some(id) = session_id(headers) else {
            return Err(refuse());
        };
        let (token, csrf, session_ends) = {
            let sessions = self.sessions.lock().unwrap_or_else(|e| e.into_inner());
            match sessions.get(&id) {
                Some(session) if session.expires > Instant::now() => {
                    (session.token.clone(), session.csrf.clone(), session.expires)
                }
                _ => return Err(refuse()),
            }
        };
        match self.app.auth.authenticate(&bearer(&token)).await {
            Ok(principal) => Ok(SignedIn {
                principal,
                csrf,
                session: id,
                session_ends,
            }),
            Err(error) if error.status() == StatusCode::UNAUTHORIZED => {
                self.end_session(&id);
                Err(refuse())
            }
            Err(error) => Err(error_page(&error, None)),
        }
    }

    /// End a session, and its open streams.
    pub(super) fn end_session(&self, id: &str) {
        let ended = self
            .sessions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(id);
        if let Some(session) = ended {
            self.app.admission.end_session(&session.token_id, id);
        }
    }

    /// The holder of a session's body, read before its body is (no token is checked: the
    /// handler does that), or `None` when the request has no live session.
    pub(super) fn body_holder(&self, headers: &HeaderMap) -> Option<crate::admission::Holder> {
        let id = session_id(headers)?;
        let sessions = self.sessions.lock().unwrap_or_else(|e| e.into_inner());
        let session = sessions.get(&id).filter(|s| s.expires > Instant::now())?;
        Some(crate::admission::Holder {
            token_id: session.token_id.clone(),
            session: Some(id),
            expires_at: None,
        })
    }
}

/// Headers carrying `token` as the API takes it.
pub(super) fn bearer(token: &str) -> HeaderMap {
    let mut headers = HeaderMap::new();
    if let Ok(value) = HeaderValue::from_str(&format!("Bearer {token}")) {
        headers.insert(header::AUTHORIZATION, value);
    }
    headers
}

/// A posted form's fields (`application/x-www-form-urlencoded`); none when it is not one, so
/// that a post without the session's CSRF token is refused as such.
pub(super) fn form_fields(body: &Bytes) -> BTreeMap<String, String> {
    serde_urlencoded::from_bytes(body).unwrap_or_default()
}

/// Whether a POST comes from a page of this server: a browser names the page's origin in
/// `Origin`, and its host must be the request's `Host`. Without `Origin` (not a browser, or
/// one too old to send it) the CSRF token alone decides; sign-in has no session yet, so this
/// is what keeps another site from signing a browser in with the site's own token.
pub(super) fn same_origin(headers: &HeaderMap) -> bool {
    let Some(origin) = headers.get(header::ORIGIN) else {
        return true;
    };
    let host = headers.get(header::HOST).and_then(|h| h.to_str().ok());
    let origin_host = origin
        .to_str()
        .ok()
        .and_then(|o| o.split_once("://"))
        .map(|(_, rest)| rest);
    matches!((origin_host, host), (Some(a), Some(b)) if a.eq_ignore_ascii_case(b))
}

/// The answer to a POST from another site.
pub(super) fn cross_origin_refused() -> Response {
    error_page(
        &ApiError::forbidden(
            "Origin: must be this server: the console takes forms from its own pages only",
        ),
        None,
    )
}

/// Whether the CSRF token of a form is the session's.
pub(super) fn csrf_ok(signed: &SignedIn, form: &BTreeMap<String, String>) -> bool {
    let given = form.get("csrf").map(String::as_str).unwrap_or_default();
    same_secret(given, &signed.csrf)
}

/// The answer to a form without the session's CSRF token.
pub(super) fn csrf_refused() -> Response {
    error_page(
        &ApiError::forbidden(
            "csrf: must be the form's token of this session; reload the page and try again",
        ),
        None,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_compare_whole() {
        assert!(same_secret("abc", "abc"));
        assert!(!same_secret("abc", "abd"));
        assert!(!same_secret("abc", "ab"));
        assert!(!same_secret("", "a"));
    }

    #[test]
    fn the_session_cookie_is_found_among_others() {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::COOKIE,
            HeaderValue::from_static("a=1; nodus_console_session=xyz; b=2"),
        );
        assert_eq!(session_id(&headers).as_deref(), Some("xyz"));
        assert_eq!(session_id(&HeaderMap::new()), None);
    }
}

//! Admission of the requests that hold the server for long, so that no client — with a token
//! or without — can take the room `/healthz` and ordinary requests need:
//!
//! - **Bodies.** A body is read only after the caller is known (a bearer token on the API, a
//!   session on the console; sign-in's small form counts against an anonymous holder) and
//!   its declared length is within the route's limit. Its bytes are reserved in a pool that
//!   bounds the memory of every body in flight together (past it: 503 with `Retry-After`),
//!   and it must arrive in time: a deadline that grows with its length (a minimum rate) and a
//!   pause between two pieces of it at most as long as the header timeout. A body cut by
//!   either is answered 408 and the connection closed.
//! - **Streams** (long polls, watches, `logs?follow`, the console's events). Each holder (a
//!   token; a console session within it) may have so many open, and all of them together so
//!   many; past either: 429 with `Retry-After`. A stream ends when its token is deleted or
//!   expires, or its console session ends — within a second ([`Admission::watch_tokens`]).
//!
//! Every refusal here closes its connection (`Connection: close`): a refused client holds no
//! connection of the server's afterwards.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::extract::Request;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt as _;
use nodus_core::engine::Reason;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};
use tokio::time::Instant;

use crate::auth::Auth;
use crate::error::ApiError;

/// The bounds an operator sets (`nodus server --help`, docs/operations.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AdmissionLimits {
    /// How long a body may pause between two pieces, and the base of its deadline.
    pub body_timeout: Duration,
    /// The least rate a body must keep, in bytes a second: its deadline is
    /// `body_timeout + length / body_min_rate`.
    pub body_min_rate: u64,
    /// The bytes every body being read may hold together.
    pub max_body_memory: usize,
    /// Bodies one token may be sending at once.
    pub max_bodies_per_token: usize,
    /// Bodies without a caller (the console's sign-in form) being sent at once, together.
    pub max_anonymous_bodies: usize,
    /// Streams and long polls open at once, together.
    pub max_streams: usize,
    /// Streams and long polls one token may hold open.
    pub max_streams_per_token: usize,
    /// Streams one console session may hold open.
    pub max_streams_per_session: usize,
}

impl Default for AdmissionLimits {
    fn default() -> Self {
        AdmissionLimits {
            body_timeout: Duration::from_secs(10),
            body_min_rate: 256 * 1024,
            max_body_memory: 256 * 1024 * 1024,
            max_bodies_per_token: 32,
            max_anonymous_bodies: 32,
            max_streams: 1024,
            max_streams_per_token: 64,
            max_streams_per_session: 8,
        }
    }
}

/// What a refused client is told to wait, in seconds.
pub const RETRY_AFTER_SECONDS: u32 = 1;

/// How often the tokens of open streams are checked again, besides the store's change
/// notification (which a lagging subscriber may miss).
const RECHECK_EVERY: Duration = Duration::from_secs(1);

/// The holder of anonymous bodies.
const ANONYMOUS: &str = "";

/// Who holds a body or a stream: a token (by its id, never the token), and for the console a
/// session of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    /// [`Principal::token_id`](crate::auth::Principal::token_id); empty for anonymous bodies.
    pub token_id: String,
    /// The console session, if the request is one of the console's.
    pub session: Option<String>,
    /// When the token expires (a stream ends then).
    pub expires_at: Option<jiff::Timestamp>,
}

impl Holder {
    /// The holder of a request made with a token.
    pub fn of(principal: &crate::auth::Principal) -> Self {
        Holder {
            token_id: principal.token_id.clone(),
            session: None,
            expires_at: principal.expires_at,
        }
    }

    /// The holder of a request of a console session.
    pub fn of_session(principal: &crate::auth::Principal, session: &str) -> Self {
        Holder {
            session: Some(session.to_string()),
            ..Holder::of(principal)
        }
    }

    fn anonymous() -> Self {
        Holder {
            token_id: ANONYMOUS.to_string(),
            session: None,
            expires_at: None,
        }
    }
}

/// Counts and ends what holders have open.
pub struct Admission {
    limits: AdmissionLimits,
    /// Body bytes in KiB.
    memory: Arc<Semaphore>,
    held: Arc<Mutex<Held>>,
}

#[derive(Default)]
struct Held {
    streams: usize,
    tokens: HashMap<String, TokenHeld>,
}

struct TokenHeld {
    bodies: usize,
    streams: usize,
    /// Sent `true` when the token is revoked or expired.
    ended: watch::Sender<bool>,
    sessions: HashMap<String, SessionHeld>,
}

struct SessionHeld {
    streams: usize,
    ended: watch::Sender<bool>,
}

impl TokenHeld {
    fn new() -> Self {
        TokenHeld {
            bodies: 0,
            streams: 0,
            ended: watch::Sender::new(false),
            sessions: HashMap::new(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum What {
    Body,
    Stream,
}

/// A body or a stream admitted: counted until it drops; [`Lease::ended`] resolves when its
/// holder's token (or session) ends.
pub struct Lease {
    held: Arc<Mutex<Held>>,
    what: What,
    token_id: String,
    session: Option<String>,
    token_ended: watch::Receiver<bool>,
    session_ended: Option<watch::Receiver<bool>>,
    expires: Option<Instant>,
}

impl Lease {
    /// Resolves when the holder's token is revoked or expires, or its session ends.
    pub async fn ended(&self) {
        let mut token = self.token_ended.clone();
        let mut session = self.session_ended.clone();
        let token = async move {
            let _ = token.wait_for(|ended| *ended).await;
        };
        let session = async move {
            match session.as_mut() {
                Some(session) => drop(session.wait_for(|ended| *ended).await),
                None => std::future::pending().await,
            }
        };
        let expiry = async {
            match self.expires {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = token => {}
            () = session => {}
            () = expiry => {}
        }
    }

    /// The response with its body cut when the lease ends; the lease lives as long as the
    /// body.
    pub fn bound(self, response: Response) -> Response {
        use axum::body::HttpBody as _;
        let (parts, body) = response.into_parts();
        if body.size_hint().exact().is_some() {
            // Whole already (a long poll's answer): nothing is left to cut, and it keeps its
            // `Content-Length`.
            return Response::from_parts(parts, body);
        }
        let lease = Arc::new(self);
        let ending = {
            let lease = lease.clone();
            Box::pin(async move { lease.ended().await })
        };
        let stream = body
            .into_data_stream()
            .take_until(ending)
            .map(move |chunk| {
                // Held by the stream: the count drops with the body.
                let _ = &lease;
                chunk
            });
        Response::from_parts(parts, Body::from_stream(stream))
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        if self.what == What::Stream {
            held.streams = held.streams.saturating_sub(1);
        }
        let Some(token) = held.tokens.get_mut(&self.token_id) else {
            return;
        };
        match self.what {
            What::Body => token.bodies = token.bodies.saturating_sub(1),
            What::Stream => token.streams = token.streams.saturating_sub(1),
        }
        if let Some(session) = &self.session
            && let Some(held_session) = token.sessions.get_mut(session)
        {
            held_session.streams = held_session.streams.saturating_sub(1);
            if held_session.streams == 0 {
                token.sessions.remove(session);
            }
        }
        if token.bodies == 0 && token.streams == 0 {
            held.tokens.remove(&self.token_id);
        }
    }
}

/// Why a request was not admitted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refused {
    /// The holder has as many open as it may.
    TooMany(String),
    /// The server has as much as it may hold.
    Full(String),
    /// The declared body is longer than the route takes.
    TooLarge(String),
}

impl Refused {
    /// The answer: 429 or 503 with `Retry-After`, or 413; the connection is closed after it.
    pub fn into_response(self) -> Response {
        let error = match self {
            Refused::TooMany(message) => ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                Reason::TooManyRequests,
                message,
            ),
            Refused::Full(message) => ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                Reason::Unavailable,
                message,
            ),
            Refused::TooLarge(message) => {
                ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, Reason::Invalid, message)
            }
        };
        let retry = matches!(
            error.status(),
            StatusCode::TOO_MANY_REQUESTS | StatusCode::SERVICE_UNAVAILABLE
        );
        let mut response = error.into_response();
        if retry {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(RETRY_AFTER_SECONDS));
        }
        close(response)
    }
}

/// `response`, with its connection closed after it.
pub fn close(mut response: Response) -> Response {
    response
        .headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    response
}

/// A body admitted: its lease, its bytes reserved, and whether it ran out of time.
pub struct AdmittedBody {
    _lease: Option<Lease>,
    _memory: Option<OwnedSemaphorePermit>,
    late: Arc<std::sync::atomic::AtomicBool>,
}

impl AdmittedBody {
    /// The answer to the request: a 408 that closes the connection when its body did not
    /// arrive in time, else the handler's answer.
    pub fn answer(self, response: Response) -> Response {
        if self.late.load(std::sync::atomic::Ordering::SeqCst) {
            return close(
                ApiError::new(
                    StatusCode::REQUEST_TIMEOUT,
                    Reason::Invalid,
                    "the request body did not arrive in time (a pause longer than the \
                     server's body timeout, or slower than its least rate)",
                )
                .into_response(),
            );
        }
        response
    }
}

/// The length of a request's body: `Some(0)` for none, `None` when it is sent in chunks of
/// unknown total (hyper knows it from `Content-Length` or `Transfer-Encoding`).
fn declared_length(request: &Request) -> Option<u64> {
    use axum::body::HttpBody as _;
    let body = request.body();
    if body.is_end_stream() {
        return Some(0);
    }
    body.size_hint().exact()
}

/// Whether the request carries a body.
pub fn has_body(request: &Request) -> bool {
    declared_length(request) != Some(0)
}

impl Admission {
    /// Admission under `limits`.
    pub fn new(limits: AdmissionLimits) -> Self {
        Admission {
            limits,
            memory: Arc::new(Semaphore::new(kib(limits.max_body_memory))),
            held: Arc::new(Mutex::new(Held::default())),
        }
    }

    /// Streams open now (for `/metrics` and tests).
    pub fn open_streams(&self) -> usize {
        self.held.lock().unwrap_or_else(|e| e.into_inner()).streams
    }

    fn lease(&self, holder: &Holder, what: What) -> Result<Lease, Refused> {
        let limits = self.limits;
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        if what == What::Stream && held.streams >= limits.max_streams {
            return Err(Refused::Full(format!(
                "the server holds {} streams and long polls, as many as it may; try again \
                 shortly",
                held.streams
            )));
        }
        let anonymous = holder.token_id == ANONYMOUS;
        let token = held
            .tokens
            .entry(holder.token_id.clone())
            .or_insert_with(TokenHeld::new);
        match what {
            What::Body => {
                let most = if anonymous {
                    limits.max_anonymous_bodies
                } else {
                    limits.max_bodies_per_token
                };
                if token.bodies >= most {
                    let refusal = if anonymous {
                        Refused::Full(format!(
                            "{most} bodies without a token are being sent, as many as the \
                             server reads at once; try again shortly"
                        ))
                    } else {
                        Refused::TooMany(format!(
                            "this token is sending {most} request bodies, as many as it may \
                             at once; try again when one has arrived"
                        ))
                    };
                    drop_if_idle(&mut held, &holder.token_id);
                    return Err(refusal);
                }
                token.bodies += 1;
            }
            What::Stream => {
                if token.streams >= limits.max_streams_per_token {
                    let most = limits.max_streams_per_token;
                    drop_if_idle(&mut held, &holder.token_id);
                    return Err(Refused::TooMany(format!(
                        "this token holds {most} open streams and long polls (watches, \
                         logs?follow, console events), as many as it may; close one first"
                    )));
                }
                if let Some(session) = &holder.session {
                    let open = token.sessions.get(session).map_or(0, |s| s.streams);
                    if open >= limits.max_streams_per_session {
                        let most = limits.max_streams_per_session;
                        drop_if_idle(&mut held, &holder.token_id);
                        return Err(Refused::TooMany(format!(
                            "this console session holds {most} open event streams, as many \
                             as it may; close a tab first"
                        )));
                    }
                    token
                        .sessions
                        .entry(session.clone())
                        .or_insert_with(|| SessionHeld {
                            streams: 0,
                            ended: watch::Sender::new(false),
                        })
                        .streams += 1;
                }
                token.streams += 1;
            }
        }
        let token_ended = token.ended.subscribe();
        let session_ended = holder
            .session
            .as_ref()
            .and_then(|session| token.sessions.get(session))
            .map(|session| session.ended.subscribe());
        if what == What::Stream {
            held.streams += 1;
        }
        let expires = holder.expires_at.map(|at| {
            let left = at.duration_since(jiff::Timestamp::now());
            Instant::now() + Duration::try_from(left).unwrap_or_default()
        });
        Ok(Lease {
            held: self.held.clone(),
            what,
            token_id: holder.token_id.clone(),
            session: holder.session.clone(),
            token_ended,
            session_ended,
            expires,
        })
    }

    /// Admit a stream or long poll of `holder`.
    pub fn open_stream(&self, holder: &Holder) -> Result<Lease, Refused> {
        self.lease(holder, What::Stream)
    }

    /// Admit the body of `request` for a route that takes at most `limit` bytes, sent by
    /// `holder` (`None`: no caller, such as the console's sign-in): its length is checked, its
    /// bytes reserved and its arrival timed. The request comes back with its body wrapped.
    pub fn admit_body(
        &self,
        request: Request,
        limit: usize,
        holder: Option<&Holder>,
    ) -> Result<(Request, AdmittedBody), Refused> {
        let declared = declared_length(&request);
        if declared == Some(0) {
            let late = Arc::new(std::sync::atomic::AtomicBool::new(false));
            return Ok((
                request,
                AdmittedBody {
                    _lease: None,
                    _memory: None,
                    late,
                },
            ));
        }
        let limit_u64 = u64::try_from(limit).unwrap_or(u64::MAX);
        if let Some(length) = declared
            && length > limit_u64
        {
            return Err(Refused::TooLarge(format!(
                "the request body is {length} bytes; this route takes at most {}",
                size(limit)
            )));
        }
        // A body of unknown length may grow to the route's limit: that much is reserved.
        let length = declared.unwrap_or(limit_u64);
        let anonymous = Holder::anonymous();
        let lease = self.lease(holder.unwrap_or(&anonymous), What::Body)?;
        let wanted =
            u32::try_from(kib(usize::try_from(length).unwrap_or(limit))).unwrap_or(u32::MAX);
        let memory = self
            .memory
            .clone()
            .try_acquire_many_owned(wanted)
            .map_err(|_| {
                Refused::Full(format!(
                    "the server is reading as many request bodies as its memory for them allows \
                 ({} MiB); try again shortly",
                    self.limits.max_body_memory / (1024 * 1024)
                ))
            })?;
        let late = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let rate = self.limits.body_min_rate.max(1);
        let deadline =
            Instant::now() + self.limits.body_timeout + Duration::from_secs(length / rate);
        let pause = self.limits.body_timeout;
        let (parts, body) = request.into_parts();
        let timed = timed_body(body, deadline, pause, late.clone());
        Ok((
            Request::from_parts(parts, timed),
            AdmittedBody {
                _lease: Some(lease),
                _memory: Some(memory),
                late,
            },
        ))
    }

    /// End the streams of a console session (signed out, or its sign-in expired).
    pub fn end_session(&self, token_id: &str, session: &str) {
        let held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(session) = held
            .tokens
            .get(token_id)
            .and_then(|token| token.sessions.get(session))
        {
            session.ended.send_replace(true);
        }
    }

    /// End everything a token holds (it was deleted, or expired).
    fn end_token(&self, token_id: &str) {
        let held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(token) = held.tokens.get(token_id) {
            token.ended.send_replace(true);
        }
    }

    fn held_tokens(&self) -> Vec<String> {
        let held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        held.tokens
            .iter()
            .filter(|(id, token)| id.as_str() != ANONYMOUS && !*token.ended.borrow())
            .map(|(id, _)| id.clone())
            .collect()
    }

    /// Until `stop` resolves: end the streams of every token that is deleted or expires, as
    /// the store announces it (any replica's deletion), and by checking the tokens that hold
    /// streams again every second (a missed announcement, a token that expired).
    pub async fn watch_tokens(
        self: Arc<Self>,
        auth: Auth,
        mut changes: tokio::sync::broadcast::Receiver<nodus_core::store::Change>,
    ) {
        use nodus_core::store::Change;
        use tokio::sync::broadcast::error::RecvError;
        let mut every = tokio::time::interval(RECHECK_EVERY);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let check: Vec<String> = tokio::select! {
                change = changes.recv() => match change {
                    Ok(Change::Written(key, _) | Change::Deleted(key)) if Auth::is_token_key(&key) => {
                        vec![key.name]
                    }
                    Ok(_) => continue,
                    Err(RecvError::Lagged(_)) => self.held_tokens(),
                    Err(RecvError::Closed) => return,
                },
                _ = every.tick() => self.held_tokens(),
            };
            for token_id in check {
                if !self
                    .held
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .tokens
                    .contains_key(&token_id)
                {
                    continue;
                }
                match auth.is_valid(&token_id).await {
                    Ok(true) => {}
                    Ok(false) => self.end_token(&token_id),
                    // The store cannot say now: the next check will.
                    Err(error) => {
                        tracing::debug!(error = %error, "cannot check a token of open streams");
                    }
                }
            }
        }
    }
}

fn drop_if_idle(held: &mut Held, token_id: &str) {
    if held
        .tokens
        .get(token_id)
        .is_some_and(|token| token.bodies == 0 && token.streams == 0)
    {
        held.tokens.remove(token_id);
    }
}

/// A size as people write it: `32 MiB`, `8 KiB`, `100 bytes`.
fn size(bytes: usize) -> String {
    const KIB: usize = 1024;
    const MIB: usize = 1024 * 1024;
    if bytes >= MIB && bytes.is_multiple_of(MIB) {
        format!("{} MiB", bytes / MIB)
    } else if bytes >= KIB && bytes.is_multiple_of(KIB) {
        format!("{} KiB", bytes / KIB)
    } else {
        format!("{bytes} bytes")
    }
}

/// Bytes in KiB, rounded up.
fn kib(bytes: usize) -> usize {
    bytes.div_ceil(1024)
}

/// `body`, failing (and marking `late`) when a piece takes longer than `pause` or the whole
/// is not there by `deadline`.
fn timed_body(
    body: Body,
    deadline: Instant,
    pause: Duration,
    late: Arc<std::sync::atomic::AtomicBool>,
) -> Body {
    let stream = body.into_data_stream();
    let timed = futures_util::stream::unfold(
        (stream, late, false),
        move |(mut stream, late, done)| async move {
            if done {
                return None;
            }
            let until = deadline.min(Instant::now() + pause);
            match tokio::time::timeout_at(until, stream.next()).await {
                Ok(Some(Ok(bytes))) => Some((Ok(bytes), (stream, late, false))),
                Ok(Some(Err(error))) => Some((
                    Err(std::io::Error::other(error.to_string())),
                    (stream, late, true),
                )),
                Ok(None) => None,
                Err(_) => {
                    late.store(true, std::sync::atomic::Ordering::SeqCst);
                    Some((
                        Err(std::io::Error::new(
                            std::io::ErrorKind::TimedOut,
                            "the request body did not arrive in time",
                        )),
                        (stream, late, true),
                    ))
                }
            }
        },
    );
    Body::from_stream(timed)
}

/// A refusal of a request that is not authenticated, sent before its body is read, closing
/// the connection.
pub fn unauthenticated(error: ApiError) -> Response {
    close(error.into_response())
}

impl IntoResponse for Refused {
    fn into_response(self) -> Response {
        Refused::into_response(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn holder(token: &str, session: Option<&str>) -> Holder {
        Holder {
            token_id: token.to_string(),
            session: session.map(str::to_string),
            expires_at: None,
        }
    }

    fn limits() -> AdmissionLimits {
        AdmissionLimits {
            max_streams: 5,
            max_streams_per_token: 3,
            max_streams_per_session: 2,
            max_bodies_per_token: 2,
            max_anonymous_bodies: 1,
            max_body_memory: 10 * 1024,
            ..AdmissionLimits::default()
        }
    }

    fn body_request(length: usize) -> Request {
        Request::builder()
            .method("POST")
            .uri("/x")
            .header(header::CONTENT_LENGTH, length)
            .body(Body::from(vec![b'x'; length]))
            .expect("request")
    }

    #[test]
    fn sizes_read_as_people_write_them() {
        assert_eq!(size(32 * 1024 * 1024), "32 MiB");
        assert_eq!(size(8 * 1024), "8 KiB");
        assert_eq!(size(1000), "1000 bytes");
    }

    #[test]
    fn streams_are_limited_per_session_per_token_and_in_all() {
        let admission = Admission::new(limits());
        let a1 = admission.open_stream(&holder("a", Some("s1"))).expect("1");
        let a2 = admission.open_stream(&holder("a", Some("s1"))).expect("2");
        assert!(matches!(
            admission.open_stream(&holder("a", Some("s1"))),
            Err(Refused::TooMany(_))
        ));
        let a3 = admission
            .open_stream(&holder("a", Some("s2")))
            .expect("other session");
        assert!(matches!(
            admission.open_stream(&holder("a", None)),
            Err(Refused::TooMany(_))
        ));
        let b1 = admission
            .open_stream(&holder("b", None))
            .expect("other token");
        let _b2 = admission
            .open_stream(&holder("b", None))
            .expect("other token");
        assert!(matches!(
            admission.open_stream(&holder("c", None)),
            Err(Refused::Full(_))
        ));
        assert_eq!(admission.open_streams(), 5);
        drop((a1, b1));
        assert_eq!(admission.open_streams(), 3);
        let _again = admission
            .open_stream(&holder("a", Some("s1")))
            .expect("room again");
        drop((a2, a3));
    }

    #[tokio::test]
    async fn a_revoked_token_or_ended_session_ends_its_leases_only() {
        let admission = Admission::new(limits());
        let revoked = admission.open_stream(&holder("a", Some("s1"))).expect("a");
        let other_session = admission
            .open_stream(&holder("b", Some("s2")))
            .expect("b s2");
        let session = admission
            .open_stream(&holder("b", Some("s3")))
            .expect("b s3");
        let kept = admission.open_stream(&holder("c", None)).expect("c");
        admission.end_token("a");
        admission.end_session("b", "s3");
        let soon = Duration::from_secs(1);
        tokio::time::timeout(soon, revoked.ended())
            .await
            .expect("token ended");
        tokio::time::timeout(soon, session.ended())
            .await
            .expect("session ended");
        for lease in [&other_session, &kept] {
            assert!(
                tokio::time::timeout(Duration::from_millis(50), lease.ended())
                    .await
                    .is_err(),
                "only the revoked token's and the ended session's leases end"
            );
        }
    }

    #[tokio::test]
    async fn an_expiring_token_ends_its_leases_at_expiry() {
        let admission = Admission::new(limits());
        let mut expiring = holder("a", None);
        expiring.expires_at = Some(jiff::Timestamp::now() + jiff::SignedDuration::from_millis(200));
        let lease = admission.open_stream(&expiring).expect("lease");
        tokio::time::timeout(Duration::from_secs(2), lease.ended())
            .await
            .expect("ends at expiry");
    }

    #[test]
    fn bodies_are_checked_against_the_route_counted_and_reserved() {
        let admission = Admission::new(limits());
        let a = holder("a", None);
        assert!(matches!(
            admission.admit_body(body_request(2048), 1024, Some(&a)),
            Err(Refused::TooLarge(_))
        ));
        let (_, first) = admission
            .admit_body(body_request(6 * 1024), 8 * 1024, Some(&a))
            .expect("first");
        // 6 KiB of the 10 KiB pool are held: 6 more do not fit.
        assert!(matches!(
            admission.admit_body(body_request(6 * 1024), 8 * 1024, Some(&holder("b", None))),
            Err(Refused::Full(_))
        ));
        let (_, second) = admission
            .admit_body(body_request(1024), 8 * 1024, Some(&a))
            .expect("second");
        assert!(matches!(
            admission.admit_body(body_request(10), 8 * 1024, Some(&a)),
            Err(Refused::TooMany(_))
        ));
        let (_, anonymous) = admission
            .admit_body(body_request(10), 8 * 1024, None)
            .expect("one anonymous");
        assert!(matches!(
            admission.admit_body(body_request(10), 8 * 1024, None),
            Err(Refused::Full(_))
        ));
        drop((first, second, anonymous));
        admission
            .admit_body(body_request(8 * 1024), 8 * 1024, Some(&a))
            .expect("everything given back");
        let empty = Request::builder().body(Body::empty()).expect("request");
        assert!(!has_body(&empty));
    }

    #[tokio::test]
    async fn a_body_that_pauses_too_long_is_cut_and_marked_late() {
        let mut limits = limits();
        limits.body_timeout = Duration::from_millis(100);
        let admission = Admission::new(limits);
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<axum::body::Bytes, std::io::Error>>(1);
        tx.send(Ok(axum::body::Bytes::from_static(b"x")))
            .await
            .expect("send");
        let request = Request::builder()
            .method("POST")
            .header(header::CONTENT_LENGTH, 100)
            .body(Body::from_stream(tokio_stream_of(rx)))
            .expect("request");
        let (request, admitted) = admission
            .admit_body(request, 1024, Some(&holder("a", None)))
            .expect("admitted");
        let read = axum::body::to_bytes(request.into_body(), 1024).await;
        assert!(read.is_err(), "the stalled body fails");
        let answer = admitted.answer(StatusCode::OK.into_response());
        assert_eq!(answer.status(), StatusCode::REQUEST_TIMEOUT);
        assert_eq!(answer.headers()[header::CONNECTION], "close");
        drop(tx);
    }

    fn tokio_stream_of(
        rx: tokio::sync::mpsc::Receiver<Result<axum::body::Bytes, std::io::Error>>,
    ) -> impl futures_util::Stream<Item = Result<axum::body::Bytes, std::io::Error>> {
        futures_util::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|item| (item, rx))
        })
    }
}

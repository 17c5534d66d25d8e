//! The HTTP transport both provider clients share: one reqwest client (HTTP/1.1 over rustls
//! with the ring provider), the retry loop, and the rules that keep a call from being charged
//! twice.
//!
//! The rules, in one place:
//! - could not connect (refused, DNS, TLS handshake): the request never left, so it is retried
//!   with backoff and jitter;
//! - 429 (except a spend limit), 408, 500, 502, 503 and 529: the provider answered that it did
//!   no work, so it is retried, waiting at least what `retry-after` asks;
//! - a spend-limit 429 and every other 4xx: final;
//! - 504 (a gateway gave up waiting on the provider, which may still be working and charging),
//!   a connection lost or a timeout after the request was sent, and a 2xx response whose
//!   body is cut off or unreadable: uncertain, never retried here: the engine applies its
//!   rules (a platform call is issued again, a BYOK call parks the run).
//!
//! Keys never leave this module in a message: every error text is scrubbed of the key, and
//! nothing logs a header.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use nodus_core::model::{self, ErrorKind};
use reqwest::header::HeaderMap;

use crate::error::{Error, Result};

/// How often and how patiently a call that the provider refused is tried again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts in all, the first included (at least 1).
    pub max_attempts: u32,
    /// The backoff before the first retry; it doubles with each retry.
    pub initial_backoff: Duration,
    /// The largest backoff.
    pub max_backoff: Duration,
    /// The longest `retry-after` honoured; a provider asking for more makes the call fail
    /// (retryable) at once rather than hold the run.
    pub max_retry_after: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 4,
            initial_backoff: Duration::from_millis(500),
            max_backoff: Duration::from_secs(8),
            max_retry_after: Duration::from_secs(60),
        }
    }
}

impl RetryPolicy {
    /// The pause before retry number `retry` (1 for the first retry): the provider's
    /// `retry-after` when it gave one (plus up to a tenth more, so that clients told the
    /// same time do not return together), otherwise an exponential backoff with jitter
    /// (uniform in its upper half).
    pub fn delay(&self, retry: u32, retry_after: Option<Duration>) -> Duration {
        if let Some(wait) = retry_after {
            let spread = micros(wait) / 10;
            return wait.saturating_add(Duration::from_micros(random_up_to(spread)));
        }
        let shift = retry.saturating_sub(1).min(32);
        let backoff = micros(self.initial_backoff)
            .saturating_mul(1u64 << shift)
            .min(micros(self.max_backoff));
        let half = backoff / 2;
        Duration::from_micros(backoff - half + random_up_to(half))
    }
}

fn micros(duration: Duration) -> u64 {
    u64::try_from(duration.as_micros()).unwrap_or(u64::MAX)
}

/// A uniform-enough pseudo-random number in `0..=max` for jitter (splitmix64 over a shared
/// counter seeded from the clock; not for anything secret).
fn random_up_to(max: u64) -> u64 {
    static STATE: AtomicU64 = AtomicU64::new(0);
    if max == 0 {
        return 0;
    }
    let mut seed = STATE.load(Ordering::Relaxed);
    if seed == 0 {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| u64::try_from(d.as_nanos()).unwrap_or(1));
        let _ = STATE.compare_exchange(0, now | 1, Ordering::Relaxed, Ordering::Relaxed);
    }
    seed = STATE.fetch_add(0x9E37_79B9_7F4A_7C15, Ordering::Relaxed);
    let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    z % (max.saturating_add(1)).max(1)
}

/// Timeouts and retries of a client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct HttpConfig {
    /// How long connecting may take.
    pub connect_timeout: Duration,
    /// How long one attempt may take, from sending to the last byte of the response (a long
    /// streamed reply included; a stalled stream is caught sooner by `idle_timeout`).
    pub request_timeout: Duration,
    /// How long the response may stay silent between two chunks (a stalled stream).
    pub idle_timeout: Duration,
    /// Retries of refused calls.
    pub retry: RetryPolicy,
}

impl Default for HttpConfig {
    fn default() -> Self {
        HttpConfig {
            connect_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(1800),
            idle_timeout: Duration::from_secs(120),
            retry: RetryPolicy::default(),
        }
    }
}

/// The largest response body read (a reply is far smaller; this bounds memory on a
/// misbehaving server).
const MAX_BODY_BYTES: usize = 32 * 1024 * 1024;
/// The most of an error body kept for its message.
const MAX_ERROR_BODY_BYTES: usize = 16 * 1024;

/// A reqwest client set up for model providers.
pub fn build_client(config: &HttpConfig) -> Result<reqwest::Client> {
    client_builder(config)?
        .build()
        .map_err(|e| Error::Config(format!("HTTP client: {e}")))
}

/// The builder of [`build_client`], for a caller that sets more (the server's webhook action
/// pins the addresses it checked and follows no redirect).
pub fn client_builder(config: &HttpConfig) -> Result<reqwest::ClientBuilder> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verifier = rustls_platform_verifier::Verifier::new(provider.clone())
        .map_err(|e| Error::Config(format!("TLS certificate verifier: {e}")))?;
    let mut tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::Config(format!("TLS versions: {e}")))?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(verifier))
        .with_no_client_auth();
    tls.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(reqwest::Client::builder()
        .tls_backend_preconfigured(tls)
        .connect_timeout(config.connect_timeout)
        .read_timeout(config.idle_timeout)
        .retry(reqwest::retry::never()))
}

/// Check that a base URL is an absolute http(s) URL, and drop a trailing slash.
pub(crate) fn base_url(text: &str) -> Result<String> {
    let url = reqwest::Url::parse(text)
        .map_err(|e| Error::Config(format!("the base URL {text:?} is not a URL: {e}")))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(Error::Config(format!(
            "the base URL {text:?} is neither http nor https"
        )));
    }
    Ok(text.trim_end_matches('/').to_string())
}

/// What a log line and an error say about a call.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CallInfo<'a> {
    /// `anthropic` or `openai-compatible`.
    pub provider: &'static str,
    /// The model asked.
    pub model: &'a str,
    /// The header carrying the provider's request id.
    pub request_id_header: &'static str,
}

/// Replace every occurrence of the key in `text`.
pub(crate) fn redact(text: &str, secret: Option<&str>) -> String {
    match secret {
        Some(secret) if !secret.is_empty() => text.replace(secret, "[redacted]"),
        _ => text.to_string(),
    }
}

pub(crate) fn error(kind: ErrorKind, message: impl Into<String>) -> model::Error {
    model::Error {
        kind,
        message: message.into(),
    }
}

/// The request id a response carries, if any.
pub(crate) fn request_id(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get(name)
        .and_then(|value| value.to_str().ok())
        .map(str::to_string)
}

/// How long the provider asks to wait: `retry-after-ms`, else `retry-after` in seconds.
pub(crate) fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let parse = |name: &str| -> Option<u64> {
        headers
            .get(name)?
            .to_str()
            .ok()?
            .trim()
            .split('.')
            .next()?
            .parse()
            .ok()
    };
    parse("retry-after-ms")
        .map(Duration::from_millis)
        .or_else(|| parse("retry-after").map(Duration::from_secs))
}

/// Whether an error body says that a spending limit or quota, not a rate, was reached.
pub(crate) fn is_spend_limit(body: &str) -> bool {
    let body = body.to_ascii_lowercase();
    [
        "spend limit",
        "spending limit",
        "usage limit",
        "credit balance",
        "insufficient_quota",
        "billing",
        "current quota",
    ]
    .iter()
    .any(|needle| body.contains(needle))
}

/// The message of an error body: `error.message` of a JSON body, else the body itself.
fn error_message(body: &str) -> String {
    let parsed: Option<serde_json::Value> = serde_json::from_str(body).ok();
    let from_json = parsed.as_ref().and_then(|value| {
        let error = value.get("error")?;
        error
            .get("message")
            .and_then(serde_json::Value::as_str)
            .map(str::to_string)
            .or_else(|| error.as_str().map(str::to_string))
    });
    let text = from_json.unwrap_or_else(|| body.trim().to_string());
    truncate(&text, 300)
}

pub(crate) fn truncate(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

/// What one attempt gave.
enum Attempt {
    Success(reqwest::Response),
    Retry {
        error: model::Error,
        retry_after: Option<Duration>,
    },
    Fail(model::Error),
}

/// Send a request, retrying what the rules allow, and return the first 2xx response (its
/// body still unread) or the error that ends the call.
pub(crate) async fn send(
    config: &HttpConfig,
    info: CallInfo<'_>,
    secret: Option<&str>,
    build: impl Fn() -> reqwest::RequestBuilder,
) -> Result<reqwest::Response, model::Error> {
    let policy = config.retry;
    let mut attempt: u32 = 1;
    loop {
        tracing::debug!(
            provider = info.provider,
            model = info.model,
            attempt,
            "model request"
        );
        let outcome = match build().timeout(config.request_timeout).send().await {
            Ok(response) if response.status().is_success() => Attempt::Success(response),
            Ok(response) => refused(info, secret, response).await,
            Err(e) if e.is_connect() => Attempt::Retry {
                error: error(
                    ErrorKind::Retryable,
                    redact(
                        &format!("could not connect to {}: {}", info.provider, chain(&e)),
                        secret,
                    ),
                ),
                retry_after: None,
            },
            Err(e) if e.is_builder() => Attempt::Fail(error(
                ErrorKind::Final,
                redact(&format!("the request could not be built: {e}"), secret),
            )),
            Err(e) => Attempt::Fail(error(
                ErrorKind::Uncertain,
                redact(
                    &format!(
                        "the request may have reached {} but no answer came: {}",
                        info.provider,
                        chain(&e)
                    ),
                    secret,
                ),
            )),
        };
        match outcome {
            Attempt::Success(response) => return Ok(response),
            Attempt::Fail(e) => {
                tracing::warn!(provider = info.provider, model = info.model, attempt, kind = ?e.kind, error = %e, "model request failed");
                return Err(e);
            }
            Attempt::Retry { error, retry_after } => {
                let too_long = retry_after.is_some_and(|wait| wait > policy.max_retry_after);
                if attempt >= policy.max_attempts || too_long {
                    let why = if too_long {
                        "the provider asks to wait longer than this client waits"
                    } else {
                        "no attempts left"
                    };
                    tracing::warn!(provider = info.provider, model = info.model, attempt, error = %error, "model request refused; {why}");
                    return Err(model::Error {
                        kind: error.kind,
                        message: format!("{} (attempt {attempt}; {why})", error.message),
                    });
                }
                let delay = policy.delay(attempt, retry_after);
                tracing::warn!(
                    provider = info.provider,
                    model = info.model,
                    attempt,
                    delay_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX),
                    error = %error,
                    "model request refused; retrying"
                );
                tokio::time::sleep(delay).await;
                attempt += 1;
            }
        }
    }
}

/// Classify a non-2xx response.
async fn refused(info: CallInfo<'_>, secret: Option<&str>, response: reqwest::Response) -> Attempt {
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let request_id = request_id(&headers, info.request_id_header);
    let body = read_bounded(response, MAX_ERROR_BODY_BYTES).await;
    let body = String::from_utf8_lossy(&body).into_owned();
    let id = request_id.map_or_else(String::new, |id| format!(" (request id {id})"));
    let message = redact(
        &format!(
            "{} answered {status}{id}: {}",
            info.provider,
            error_message(&body)
        ),
        secret,
    );
    match status {
        429 if is_spend_limit(&body) => Attempt::Fail(error(ErrorKind::Final, message)),
        429 | 408 | 500 | 502 | 503 | 529 => Attempt::Retry {
            error: error(ErrorKind::Retryable, message),
            retry_after: retry_after(&headers),
        },
        504 => Attempt::Fail(error(
            ErrorKind::Uncertain,
            format!("{message}; the provider may still have done the work"),
        )),
        _ => Attempt::Fail(error(ErrorKind::Final, message)),
    }
}

/// Up to `max` bytes of a body; what cannot be read is left out (only for error bodies).
async fn read_bounded(mut response: reqwest::Response, max: usize) -> Vec<u8> {
    let mut body = Vec::new();
    while body.len() < max {
        match response.chunk().await {
            Ok(Some(chunk)) => body.extend_from_slice(&chunk),
            _ => break,
        }
    }
    body.truncate(max);
    body
}

/// The whole body of a 2xx response. A body cut off after its first byte, or one too large,
/// is an uncertain outcome: the provider did the work.
pub(crate) async fn read_body(
    info: CallInfo<'_>,
    secret: Option<&str>,
    mut response: reqwest::Response,
) -> Result<Vec<u8>, model::Error> {
    let mut body = Vec::new();
    loop {
        match response.chunk().await {
            Ok(Some(chunk)) => {
                body.extend_from_slice(&chunk);
                if body.len() > MAX_BODY_BYTES {
                    return Err(error(
                        ErrorKind::Uncertain,
                        format!(
                            "{}'s response is larger than {MAX_BODY_BYTES} bytes",
                            info.provider
                        ),
                    ));
                }
            }
            Ok(None) => return Ok(body),
            Err(e) => return Err(cut_off(info, secret, body.len(), &e)),
        }
    }
}

/// The error of a response cut off after `received` bytes.
pub(crate) fn cut_off(
    info: CallInfo<'_>,
    secret: Option<&str>,
    received: usize,
    e: &reqwest::Error,
) -> model::Error {
    error(
        ErrorKind::Uncertain,
        redact(
            &format!(
                "{}'s response was cut off after {received} bytes: {}",
                info.provider,
                chain(e)
            ),
            secret,
        ),
    )
}

/// An error with its sources, on one line.
fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(inner) = source {
        let part = inner.to_string();
        if !text.contains(&part) {
            text.push_str(": ");
            text.push_str(&part);
        }
        source = inner.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use reqwest::header::HeaderValue;

    #[test]
    fn backoff_doubles_within_its_cap_and_honours_retry_after() {
        let policy = RetryPolicy {
            max_attempts: 5,
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_millis(300),
            max_retry_after: Duration::from_secs(5),
        };
        for _ in 0..200 {
            let first = policy.delay(1, None);
            assert!(first >= Duration::from_millis(50) && first <= Duration::from_millis(100));
            let second = policy.delay(2, None);
            assert!(second >= Duration::from_millis(100) && second <= Duration::from_millis(200));
            let capped = policy.delay(30, None);
            assert!(capped >= Duration::from_millis(150) && capped <= Duration::from_millis(300));
            let told = policy.delay(1, Some(Duration::from_secs(2)));
            assert!(told >= Duration::from_secs(2) && told <= Duration::from_millis(2200));
        }
    }

    #[test]
    fn retry_after_reads_milliseconds_then_seconds() {
        let mut headers = HeaderMap::new();
        assert_eq!(retry_after(&headers), None);
        headers.insert("retry-after", HeaderValue::from_static("3"));
        assert_eq!(retry_after(&headers), Some(Duration::from_secs(3)));
        headers.insert("retry-after-ms", HeaderValue::from_static("250"));
        assert_eq!(retry_after(&headers), Some(Duration::from_millis(250)));
        let mut dated = HeaderMap::new();
        dated.insert(
            "retry-after",
            HeaderValue::from_static("Wed, 21 Oct 2015 07:28:00 GMT"),
        );
        assert_eq!(retry_after(&dated), None);
    }

    #[test]
    fn spend_limits_are_told_apart_from_rate_limits() {
        assert!(is_spend_limit(
            r#"{"type":"error","error":{"type":"rate_limit_error","message":"You have reached your specified API usage limits."}}"#
        ));
        assert!(is_spend_limit(
            r#"{"error":{"code":"insufficient_quota","message":"You exceeded your current quota"}}"#
        ));
        assert!(!is_spend_limit(
            r#"{"type":"error","error":{"type":"rate_limit_error","message":"Number of request tokens has exceeded your per-minute rate limit"}}"#
        ));
    }

    #[test]
    fn redaction_and_truncation() {
        assert_eq!(
            redact("key sk-1 and sk-1", Some("sk-1")),
            "key [redacted] and [redacted]"
        );
        assert_eq!(redact("nothing", Some("")), "nothing");
        assert_eq!(truncate("ééé", 3), "é…");
        assert_eq!(
            error_message(r#"{"error":{"message":"bad"}}"#),
            "bad".to_string()
        );
        assert_eq!(error_message("plain"), "plain".to_string());
    }

    #[test]
    fn a_client_builds_with_ring_and_the_platform_verifier() {
        assert!(build_client(&HttpConfig::default()).is_ok());
        assert!(base_url("ftp://x").is_err());
        assert_eq!(
            base_url("http://127.0.0.1:1/").expect("url"),
            "http://127.0.0.1:1"
        );
    }
}

//! The post-run actions this server installs: nodus-core's `agents.noop` and
//! `agents.webhook`, which POSTs the run record as JSON to a URL. A delivery is tried up to
//! [`ATTEMPTS`] times while the receiver cannot be reached or answers 408, 429 or 5xx, and
//! carries an `Idempotency-Key` header that stays the same when the engine carries the step
//! out again after a restart (a step interrupted before its outcome was journaled), so a
//! receiver that keeps the keys it has seen takes each delivery once. A header may take its
//! value from a Secret (`{secretKeyRef: {name, key}}`, pinned when the run is created); a
//! header that looks like a credential must. The URL's host must not be one of the server's
//! own networks unless [`WebhookAllow`] lists it: checked at creation for an address written
//! in the URL and at each delivery on every address the host resolves to (the request goes
//! only to those addresses, and follows no redirect).

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use nodus_core::postrun::{ActionContext, ActionResults, PostRunAction, Registry};
use nodus_core::resource::{EnvVarSource, SecretKeyRef};
use nodus_core::validate::Invalid;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use serde_json::{Value, json};

use crate::egress::WebhookAllow;

/// Deliveries tried before the action fails.
pub const ATTEMPTS: u32 = 4;
/// The pause before the first retry; it doubles each time.
const FIRST_PAUSE: Duration = Duration::from_millis(500);
/// How long one delivery may take.
const TIMEOUT: Duration = Duration::from_secs(30);

/// Words in a header's name that make it a credential, whose value must come from a Secret.
const CREDENTIAL_WORDS: [&str; 10] = [
    "auth",
    "cookie",
    "token",
    "secret",
    "password",
    "api-key",
    "apikey",
    "api_key",
    "signature",
    "credential",
];

/// The registry of every action this server installs; webhooks reach internal addresses
/// only as `allow` lists them.
pub fn registry(allow: WebhookAllow) -> Registry {
    Registry::new().with(Arc::new(Webhook::new(allow)))
}

/// `agents.webhook`: POST the run record to `config.url`.
#[derive(Debug, Clone, Default)]
pub struct Webhook {
    allow: Arc<WebhookAllow>,
}

impl Webhook {
    /// A webhook that reaches internal addresses only as `allow` lists them.
    pub fn new(allow: WebhookAllow) -> Self {
        Webhook {
            allow: Arc::new(allow),
        }
    }
}

/// A header value: plain text, or `{secretKeyRef: {name, key}}`.
fn secret_ref(value: &Value) -> Option<Result<SecretKeyRef, String>> {
    value.is_object().then(|| {
        serde_json::from_value::<EnvVarSource>(value.clone())
            .map(|source| source.secret_key_ref)
            .map_err(|e| e.to_string())
    })
}

fn is_credential(name: &str) -> bool {
    let lower = name.to_ascii_lowercase();
    CREDENTIAL_WORDS.iter().any(|word| lower.contains(word))
}

/// A URL's host: an address written in it, or a name.
enum UrlHost<'a> {
    Address(IpAddr),
    Name(&'a str),
}

fn host_of(url: &reqwest::Url) -> Option<UrlHost<'_>> {
    let host = url.host_str()?;
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    Some(match bare.parse::<IpAddr>() {
        Ok(address) => UrlHost::Address(address),
        Err(_) => UrlHost::Name(host),
    })
}

/// Why webhooks may not reach `address` of `host`, or `None`.
fn refusal(allow: &WebhookAllow, host: &str, address: IpAddr) -> Option<String> {
    let kind = allow.refuses(address)?;
    Some(format!(
        "the URL's host {host} is {address}, an internal address ({kind}), which webhooks may \
         not reach unless the server's --webhook-allow (NODUS_WEBHOOK_ALLOW) lists it"
    ))
}

#[async_trait]
impl PostRunAction for Webhook {
    fn kind(&self) -> &'static str {
        "agents.webhook"
    }

    fn title(&self) -> &'static str {
        "Webhook"
    }

    fn description(&self) -> &'static str {
        "POST the run record (JSON) to a URL, with retries and an Idempotency-Key header."
    }

    fn config_schema(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "url": {"type": "string", "format": "uri", "description": "http or https URL to POST the run record to (not an internal address unless the server allows it)"},
                "headers": {
                    "type": "object",
                    "additionalProperties": {"oneOf": [
                        {"type": "string"},
                        {
                            "type": "object",
                            "properties": {"secretKeyRef": {
                                "type": "object",
                                "properties": {"name": {"type": "string"}, "key": {"type": "string"}},
                                "required": ["name", "key"],
                                "additionalProperties": false
                            }},
                            "required": ["secretKeyRef"],
                            "additionalProperties": false
                        }
                    ]},
                    "description": "extra request headers: plain text, or {secretKeyRef: {name, key}} of a Secret (required for credentials such as Authorization)"
                }
            },
            "required": ["url"],
            "additionalProperties": false
        })
    }

    fn check_config(&self, config: &Value) -> Result<(), Invalid> {
        let Some(fields) = config.as_object() else {
            return Err(Invalid::new("", "must be an object", config.to_string()));
        };
        if let Some(key) = fields
            .keys()
            .find(|k| !matches!(k.as_str(), "url" | "headers"))
        {
            return Err(Invalid::new(
                format!(".{key}"),
                "unknown field (agents.webhook takes url and headers)",
                format!("{key:?}"),
            ));
        }
        let Some(url) = fields.get("url") else {
            return Err(Invalid::new(".url", "required", "nothing"));
        };
        let parsed = url
            .as_str()
            .and_then(|text| reqwest::Url::parse(text).ok())
            .filter(|u| matches!(u.scheme(), "http" | "https"));
        let Some(parsed) = parsed else {
            return Err(Invalid::new(
                ".url",
                "must be an absolute http or https URL",
                url.to_string(),
            ));
        };
        // The URL is stored in the run's spec and journaled with its step: a password there
        // would show in both. The value is not echoed back.
        if !parsed.username().is_empty() || parsed.password().is_some() {
            return Err(Invalid::new(
                ".url",
                "must not carry a user name or password (send credentials in headers)",
                "a URL with credentials",
            ));
        }
        // An address written in the URL is checked now; a name, at each delivery.
        if let Some(UrlHost::Address(address)) = host_of(&parsed)
            && let Some(kind) = self.allow.refuses(address)
        {
            return Err(Invalid::new(
                ".url",
                format!(
                    "must not point at an internal address ({kind}), which webhooks may not \
                     reach unless the server's --webhook-allow (NODUS_WEBHOOK_ALLOW) lists it"
                ),
                address.to_string(),
            ));
        }
        if let Some(headers) = fields.get("headers") {
            let Some(headers) = headers.as_object() else {
                return Err(Invalid::new(
                    ".headers",
                    "must be an object of strings",
                    headers.to_string(),
                ));
            };
            for (name, value) in headers {
                let field = format!(".headers.{name}");
                if HeaderName::from_bytes(name.as_bytes()).is_err() {
                    return Err(Invalid::new(
                        field,
                        "must be a header name",
                        format!("{name:?}"),
                    ));
                }
                if let Some(reference) = secret_ref(value) {
                    let reference = reference.map_err(|e| {
                        Invalid::new(
                            &field,
                            format!("must be a string or {{secretKeyRef: {{name, key}}}}: {e}"),
                            value.to_string(),
                        )
                    })?;
                    if reference.name.trim().is_empty() || reference.key.trim().is_empty() {
                        return Err(Invalid::new(
                            format!("{field}.secretKeyRef"),
                            "must name a Secret and a key",
                            value.to_string(),
                        ));
                    }
                    continue;
                }
                // Not echoed back: it may be a credential.
                let Some(text) = value.as_str() else {
                    return Err(Invalid::new(
                        field,
                        "must be a string or {secretKeyRef: {name, key}}",
                        "another JSON value",
                    ));
                };
                if is_credential(name) {
                    return Err(Invalid::new(
                        field,
                        "looks like a credential, and a plain value would be stored in the \
                         run's spec and steps: take it from a Secret with {secretKeyRef: \
                         {name: SECRET, key: KEY}}",
                        "a plain-text value",
                    ));
                }
                if HeaderValue::from_str(text).is_err() {
                    return Err(Invalid::new(
                        field,
                        "must be a valid header value (visible ASCII, no line breaks)",
                        "an invalid value",
                    ));
                }
            }
        }
        Ok(())
    }

    fn secret_refs(&self, config: &Value) -> Vec<(String, SecretKeyRef)> {
        config["headers"]
            .as_object()
            .into_iter()
            .flatten()
            .filter_map(|(name, value)| {
                let reference = secret_ref(value)?.ok()?;
                Some((format!(".headers.{name}.secretKeyRef"), reference))
            })
            .collect()
    }

    async fn run(&self, context: &ActionContext) -> Result<ActionResults, String> {
        let failed = |why: String| format!("agents.webhook: {why}");
        let url = context.config["url"].as_str().unwrap_or_default();
        let parsed = reqwest::Url::parse(url).map_err(|_| failed("the URL is not a URL".into()))?;
        let headers = self.headers(context).map_err(failed)?;
        let mut pause = FIRST_PAUSE;
        let mut last = String::new();
        for attempt in 1..=ATTEMPTS {
            // Checked again at each attempt: where a name points may change.
            let client = match self.client_for(&parsed).await {
                Ok(client) => client,
                Err(Reach::Refused(why)) => return Err(failed(why)),
                Err(Reach::Unreachable(why)) => {
                    last = why;
                    if attempt < ATTEMPTS {
                        tokio::time::sleep(pause).await;
                        pause *= 2;
                    }
                    continue;
                }
            };
            let request = client
                .post(parsed.clone())
                .timeout(TIMEOUT)
                .headers(headers.clone())
                .header("Idempotency-Key", &context.idempotency_key)
                .header(reqwest::header::CONTENT_TYPE, "application/json")
                .body(serde_json::to_vec(&context.run_record).unwrap_or_default());
            match request.send().await {
                Ok(response) if response.status().is_success() => {
                    let status = response.status().as_u16();
                    let delivery = json!({"status": status, "attempts": attempt});
                    let mut results = ActionResults::new();
                    results.insert(
                        "webhookDelivery".to_string(),
                        serde_json::to_vec_pretty(&delivery).unwrap_or_default(),
                    );
                    return Ok(results);
                }
                Ok(response) => {
                    let status = response.status();
                    last = format!("the receiver answered {status}");
                    let retryable =
                        status.is_server_error() || matches!(status.as_u16(), 408 | 429);
                    if !retryable {
                        break;
                    }
                }
                // Without the URL: it may hold a secret.
                Err(e) => last = format!("the receiver could not be reached ({})", e.without_url()),
            }
            if attempt < ATTEMPTS {
                tokio::time::sleep(pause).await;
                pause *= 2;
            }
        }
        Err(failed(last))
    }
}

/// Why a delivery cannot be sent now.
enum Reach {
    /// The host is an address webhooks may not reach: the action fails, without retries.
    Refused(String),
    /// The host cannot be resolved now: tried again.
    Unreachable(String),
}

impl Webhook {
    /// The request's headers: the config's, those from Secrets with the values pinned when
    /// the run was created (marked sensitive). An error never holds a value.
    fn headers(&self, context: &ActionContext) -> Result<HeaderMap, String> {
        let mut headers = HeaderMap::new();
        for (name, value) in context.config["headers"].as_object().into_iter().flatten() {
            let header = HeaderName::from_bytes(name.as_bytes())
                .map_err(|_| format!("the header name {name:?} is not valid"))?;
            let value = match secret_ref(value) {
                Some(reference) => {
                    let reference = reference
                        .map_err(|_| format!("the header {name} is not a secretKeyRef"))?;
                    let secret = context
                        .secrets
                        .get(&reference.name, &reference.key)
                        .ok_or_else(|| {
                            format!(
                                "the header {name} reads key {:?} of Secret {:?}, which was not \
                                 pinned when the run was created",
                                reference.key, reference.name
                            )
                        })?;
                    let mut value = HeaderValue::from_str(secret.expose()).map_err(|_| {
                        format!(
                            "the value of key {:?} of Secret {:?} is not a valid value for \
                             the header {name}",
                            reference.key, reference.name
                        )
                    })?;
                    value.set_sensitive(true);
                    value
                }
                None => HeaderValue::from_str(value.as_str().unwrap_or_default())
                    .map_err(|_| format!("the value of the header {name} is not valid"))?,
            };
            headers.insert(header, value);
        }
        Ok(headers)
    }

    /// A client that sends to `url`'s host only at the addresses checked now, follows no
    /// redirect (a redirect's target would not be checked), and goes through no proxy from
    /// the environment (a proxy resolves the host again itself, and could reach an address
    /// the check refuses).
    async fn client_for(&self, url: &reqwest::Url) -> Result<reqwest::Client, Reach> {
        let builder = nodus_llm::http::client_builder(&nodus_llm::HttpConfig::default())
            .map_err(|e| Reach::Unreachable(e.to_string()))?
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy();
        let port = url.port_or_known_default().unwrap_or(80);
        let builder = match host_of(url) {
            Some(UrlHost::Address(address)) => {
                self.check(&address.to_string(), address)?;
                builder
            }
            Some(UrlHost::Name(host)) => {
                let addresses: Vec<SocketAddr> = tokio::net::lookup_host((host, port))
                    .await
                    .map_err(|e| {
                        Reach::Unreachable(format!(
                            "the URL's host {host} cannot be resolved ({e})"
                        ))
                    })?
                    .collect();
                if !self.allow.names_host(host) {
                    for address in &addresses {
                        self.check(host, address.ip())?;
                    }
                }
                builder.resolve_to_addrs(host, &addresses)
            }
            None => return Err(Reach::Refused("the URL has no host".to_string())),
        };
        builder
            .build()
            .map_err(|e| Reach::Unreachable(format!("HTTP client: {e}")))
    }

    fn check(&self, host: &str, address: IpAddr) -> Result<(), Reach> {
        match refusal(&self.allow, host, address) {
            Some(why) => Err(Reach::Refused(why)),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_url_with_credentials_is_refused_without_echoing_them() {
        let refused = Webhook::default()
            .check_config(&json!({"url": "https://alice:s3cret-pw@hooks.example/run"}))
            .expect_err("credentials in the URL");
        assert_eq!(refused.field, ".url");
        assert!(!format!("{refused:?}").contains("s3cret-pw"), "{refused:?}");
        Webhook::default()
            .check_config(&json!({"url": "https://hooks.example/run"}))
            .expect("a plain URL");
        let refused = Webhook::default()
            .check_config(&json!({"url": "ftp://hooks.example/run"}))
            .expect_err("not http");
        assert_eq!(refused.rule, "must be an absolute http or https URL");
    }

    #[test]
    fn credential_headers_must_come_from_secrets() {
        let webhook = Webhook::default();
        for name in [
            "Authorization",
            "Cookie",
            "X-Api-Key",
            "X-Auth-Token",
            "X-Hub-Signature",
        ] {
            let refused = webhook
                .check_config(&json!({"url": "https://hooks.example/run",
                                      "headers": {name: "plain-credential-9921"}}))
                .expect_err(name);
            assert_eq!(refused.field, format!(".headers.{name}"));
            assert!(refused.rule.contains("secretKeyRef"), "{refused:?}");
            assert!(!format!("{refused:?}").contains("plain-credential-9921"));
        }
        let config = json!({"url": "https://hooks.example/run", "headers": {
            "Authorization": {"secretKeyRef": {"name": "hooks", "key": "token"}},
            "X-Trace": "plain"}});
        webhook
            .check_config(&config)
            .expect("a reference and a plain header");
        assert_eq!(
            webhook.secret_refs(&config),
            vec![(
                ".headers.Authorization.secretKeyRef".to_string(),
                SecretKeyRef {
                    name: "hooks".into(),
                    key: "token".into()
                }
            )]
        );
        let refused = webhook
            .check_config(&json!({"url": "https://hooks.example/run",
                                  "headers": {"X-Key": {"secretKeyRef": {"name": "hooks"}}}}))
            .expect_err("no key");
        assert_eq!(refused.field, ".headers.X-Key");
    }

    #[test]
    fn an_internal_address_in_the_url_is_refused_unless_allowed() {
        for url in [
            "http://127.0.0.1:8080/hook",
            "http://169.254.169.254/latest/meta-data/",
            "http://[::1]/hook",
            "http://10.0.0.7/hook",
        ] {
            let refused = Webhook::default()
                .check_config(&json!({"url": url}))
                .expect_err(url);
            assert_eq!(refused.field, ".url");
            assert!(refused.rule.contains("--webhook-allow"), "{refused:?}");
        }
        let allowed = Webhook::new("127.0.0.1,::1".parse().expect("a list"));
        allowed
            .check_config(&json!({"url": "http://127.0.0.1:8080/hook"}))
            .expect("allowed");
        allowed
            .check_config(&json!({"url": "http://[::1]/hook"}))
            .expect("allowed");
        // A name is checked at delivery, on what it resolves to.
        Webhook::default()
            .check_config(&json!({"url": "http://localhost/hook"}))
            .expect("a name");
    }

    #[tokio::test]
    async fn a_name_resolving_to_loopback_is_refused_at_delivery_without_retries() {
        let context = ActionContext {
            run: "default/r".into(),
            idempotency_key: "uid-3".into(),
            config: json!({"url": "http://localhost:9/hook"}),
            run_record: json!({}),
            secrets: Default::default(),
        };
        let started = std::time::Instant::now();
        let error = Webhook::default().run(&context).await.expect_err("refused");
        assert!(error.contains("loopback"), "{error}");
        // Retries would pause 0.5 + 1 + 2 s between the attempts.
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "retried: {error}"
        );
    }

    #[tokio::test]
    async fn a_name_the_list_holds_is_delivered_to_with_its_headers() {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a port");
        let port = listener.local_addr().expect("address").port();
        let received = tokio::spawn(async move {
            let (mut stream, _) = listener.accept().await.expect("a connection");
            let mut request = Vec::new();
            let mut buffer = [0u8; 4096];
            while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                let read = stream.read(&mut buffer).await.expect("read");
                assert!(read > 0, "the request ended early");
                request.extend_from_slice(&buffer[..read]);
            }
            stream
                .write_all(b"HTTP/1.1 204 No Content\r\nconnection: close\r\n\r\n")
                .await
                .expect("answer");
            String::from_utf8_lossy(&request).to_ascii_lowercase()
        });
        let mut secrets = nodus_core::secret::PinnedSecrets::new();
        secrets.insert(
            "hooks",
            "token",
            nodus_core::secret::SecretString::new("Bearer pinned-4d2a"),
        );
        let context = ActionContext {
            run: "default/r".into(),
            idempotency_key: "uid-3".into(),
            // Resolved to 127.0.0.1 only: the list names the host.
            config: json!({"url": format!("http://localhost:{port}/hook"), "headers": {
                "Authorization": {"secretKeyRef": {"name": "hooks", "key": "token"}}}}),
            run_record: json!({"name": "r"}),
            secrets,
        };
        let webhook = Webhook::new("localhost".parse().expect("a list"));
        let saved = webhook.run(&context).await.expect("delivered");
        assert!(saved.contains_key("webhookDelivery"));
        let request = received.await.expect("the receiver");
        assert!(request.starts_with("post /hook "), "{request}");
        assert!(
            request.contains("authorization: bearer pinned-4d2a"),
            "{request}"
        );
        assert!(request.contains("idempotency-key: uid-3"), "{request}");
    }
}

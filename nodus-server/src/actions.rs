//! The post-run actions this server installs: nodus-core's `agents.noop` and
//! `agents.webhook`, which POSTs the run record as JSON to a URL. A delivery is tried up to
//! [`ATTEMPTS`] times while the receiver cannot be reached or answers 408, 429 or 5xx, and
//! carries an `Idempotency-Key` header that stays the same when the engine carries the step
//! out again after a restart (a step interrupted before its outcome was journaled), so a
//! receiver that keeps the keys it has seen takes each delivery once.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use nodus_core::postrun::{ActionContext, ActionResults, PostRunAction, Registry};
use nodus_core::validate::Invalid;
use serde_json::{Value, json};

/// Deliveries tried before the action fails.
pub const ATTEMPTS: u32 = 4;
/// The pause before the first retry; it doubles each time.
const FIRST_PAUSE: Duration = Duration::from_millis(500);
/// How long one delivery may take.
const TIMEOUT: Duration = Duration::from_secs(30);

/// The registry of every action this server installs.
pub fn registry() -> Registry {
    Registry::new().with(Arc::new(Webhook))
}

/// `agents.webhook`: POST the run record to `config.url`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Webhook;

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
                "url": {"type": "string", "format": "uri", "description": "http or https URL to POST the run record to"},
                "headers": {"type": "object", "additionalProperties": {"type": "string"}, "description": "extra request headers"}
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
        if let Some(headers) = fields.get("headers") {
            let Some(headers) = headers.as_object() else {
                return Err(Invalid::new(
                    ".headers",
                    "must be an object of strings",
                    headers.to_string(),
                ));
            };
            for (name, value) in headers {
                let valid = reqwest::header::HeaderName::from_bytes(name.as_bytes()).is_ok()
                    && value
                        .as_str()
                        .is_some_and(|v| reqwest::header::HeaderValue::from_str(v).is_ok());
                if !valid {
                    return Err(Invalid::new(
                        format!(".headers.{name}"),
                        "must be a header name with a string value",
                        format!("{name:?}"),
                    ));
                }
            }
        }
        Ok(())
    }

    async fn run(&self, context: &ActionContext) -> Result<ActionResults, String> {
        let url = context.config["url"].as_str().unwrap_or_default();
        let client = nodus_llm::http::build_client(&nodus_llm::HttpConfig::default())
            .map_err(|e| e.to_string())?;
        let mut pause = FIRST_PAUSE;
        let mut last = String::new();
        for attempt in 1..=ATTEMPTS {
            let mut request = client
                .post(url)
                .timeout(TIMEOUT)
                .header("Idempotency-Key", &context.idempotency_key)
                .header(reqwest::header::CONTENT_TYPE, "application/json")
                .body(serde_json::to_vec(&context.run_record).unwrap_or_default());
            if let Some(headers) = context.config["headers"].as_object() {
                for (name, value) in headers {
                    request = request.header(name, value.as_str().unwrap_or_default());
                }
            }
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
        Err(format!("agents.webhook: {last}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_url_with_credentials_is_refused_without_echoing_them() {
        let refused = Webhook
            .check_config(&json!({"url": "https://alice:s3cret-pw@hooks.example/run"}))
            .expect_err("credentials in the URL");
        assert_eq!(refused.field, ".url");
        assert!(!format!("{refused:?}").contains("s3cret-pw"), "{refused:?}");
        Webhook
            .check_config(&json!({"url": "https://hooks.example/run"}))
            .expect("a plain URL");
        let refused = Webhook
            .check_config(&json!({"url": "ftp://hooks.example/run"}))
            .expect_err("not http");
        assert_eq!(refused.rule, "must be an absolute http or https URL");
    }
}

//! The model client a server or an embedding program uses by default, chosen from the
//! environment: the Anthropic client when `ANTHROPIC_API_KEY` is set; otherwise the offline
//! model answers platform calls while BYOK runs still reach Anthropic with their own key.

use std::sync::Arc;

use async_trait::async_trait;
use nodus_core::catalog::Catalog;
use nodus_core::model::{self, Credentials, ModelClient, ModelRequest, ModelResponse};

use crate::anthropic::{AnthropicClient, AnthropicConfig};
use crate::error::Result;
use crate::scripted::ScriptedModel;

/// Platform calls go to the offline model, BYOK calls to Anthropic.
#[derive(Debug, Clone)]
pub struct OfflinePlatform {
    anthropic: AnthropicClient,
    offline: ScriptedModel,
}

#[async_trait]
impl ModelClient for OfflinePlatform {
    async fn complete(&self, request: &ModelRequest) -> Result<ModelResponse, model::Error> {
        match request.credentials {
            Credentials::Platform => self.offline.complete(request).await,
            Credentials::Byok(_) => self.anthropic.complete(request).await,
        }
    }

    async fn count_tokens(&self, request: &ModelRequest) -> Result<Option<u64>, model::Error> {
        match request.credentials {
            Credentials::Platform => Ok(None),
            Credentials::Byok(_) => self.anthropic.count_tokens(request).await.map(Some),
        }
    }
}

/// The model client from the environment (`ANTHROPIC_API_KEY`, `ANTHROPIC_BASE_URL`), with
/// platform calls to unpriced models refused by `catalog`, and one line that says which it is
/// (never the key).
pub fn model_from_env(catalog: Arc<Catalog>) -> Result<(Arc<dyn ModelClient>, String)> {
    model_from_config(AnthropicConfig::from_env(), catalog)
}

/// As [`model_from_env`], from a configuration.
pub fn model_from_config(
    config: AnthropicConfig,
    catalog: Arc<Catalog>,
) -> Result<(Arc<dyn ModelClient>, String)> {
    let base_url = config.base_url.clone();
    let date = catalog.date.clone();
    let anthropic = AnthropicClient::new(config)?.with_catalog(catalog);
    if anthropic.has_platform_key() {
        Ok((
            Arc::new(anthropic),
            format!(
                "model: the Anthropic Messages API at {base_url} (platform key from \
                 ANTHROPIC_API_KEY; catalog prices of {date})"
            ),
        ))
    } else {
        Ok((
            Arc::new(OfflinePlatform {
                anthropic,
                offline: ScriptedModel::offline(),
            }),
            format!(
                "model: the OFFLINE scripted model for platform access (no ANTHROPIC_API_KEY): \
                 it runs the shell commands a prompt quotes in backticks; BYOK agents reach \
                 {base_url} with their own key"
            ),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nodus_core::model::{ChatMessage, ContentBlock, Role, ToolChoice};
    use nodus_core::secret::SecretString;

    fn request(credentials: Credentials) -> ModelRequest {
        ModelRequest {
            model: "claude-haiku-4-5".into(),
            system: String::new(),
            messages: vec![ChatMessage {
                role: Role::User,
                content: vec![ContentBlock::Text { text: "hi".into() }],
            }],
            tools: Vec::new(),
            tool_choice: ToolChoice::Auto,
            max_tokens: 16,
            credentials,
        }
    }

    #[tokio::test]
    async fn without_a_platform_key_platform_calls_are_offline_and_byok_calls_are_not() {
        let catalog = Arc::new(crate::default_catalog().expect("catalog"));
        let mut config = AnthropicConfig::new();
        // Nothing listens on port 9 here: a BYOK call fails to connect, proving it went out.
        config.base_url = "http://127.0.0.1:9".into();
        config.http.retry.max_attempts = 1;
        let (model, line) = model_from_config(config.clone(), catalog.clone()).expect("model");
        assert!(line.contains("OFFLINE"), "{line}");
        let offline = model
            .complete(&request(Credentials::Platform))
            .await
            .expect("offline");
        assert!(offline.text().starts_with("[offline model]"));
        let byok = model
            .complete(&request(Credentials::Byok(SecretString::new("sk-user"))))
            .await
            .expect_err("no server");
        assert_eq!(byok.kind, model::ErrorKind::Retryable, "{byok}");

        config.api_key = Some(SecretString::new("sk-platform"));
        let (_, line) = model_from_config(config, catalog).expect("model");
        assert!(
            line.contains("Anthropic Messages API") && !line.contains("sk-platform"),
            "{line}"
        );
    }
}

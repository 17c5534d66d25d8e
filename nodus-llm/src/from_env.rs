//! The model client a server or an embedding program uses by default, chosen from the
//! environment: the Anthropic client when `ANTHROPIC_API_KEY` is set; otherwise the offline
//! model answers platform calls, at no price and under its own name ([`OFFLINE_MODEL`]), while
//! BYOK runs still reach Anthropic with their own key.

use std::sync::Arc;

use async_trait::async_trait;
use nodus_core::catalog::{Catalog, CatalogModel};
use nodus_core::cost::{Prices, Rates};
use nodus_core::model::{self, Credentials, ModelClient, ModelRequest, ModelResponse};
use nodus_core::money::Usd;

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
    fn provider_name(&self, byok: bool) -> &'static str {
        if byok { "anthropic" } else { "nodus.offline" }
    }

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

/// The model id the offline model answers platform calls as. It is not a model anyone pays
/// for: its calls cost $0, and a run's turns name it.
pub const OFFLINE_MODEL: &str = "nodus-offline";

/// `catalog` as a server without a platform key prices its runs: every family is answered by
/// [`OFFLINE_MODEL`] at no price; the further models (named by BYOK agents) stay.
pub fn offline_catalog(catalog: &Catalog) -> Catalog {
    let free = CatalogModel {
        model: OFFLINE_MODEL.to_string(),
        prices: Prices {
            base: Rates {
                input: Usd::ZERO,
                output: Usd::ZERO,
                cache_write: Usd::ZERO,
                cache_read: Usd::ZERO,
            },
            long_prompt: None,
        },
    };
    let mut offline = catalog.clone();
    for entry in offline.families.values_mut() {
        *entry = free.clone();
    }
    offline.notes.push(format!(
        "no platform key: every family is answered by the offline model ({OFFLINE_MODEL}), at no price"
    ));
    offline
}

/// What [`model_from_env`] chose.
pub struct Chosen {
    /// The model client.
    pub model: Arc<dyn ModelClient>,
    /// The catalog runs are routed and priced by: the one given, or its
    /// [`offline_catalog`] when platform calls go to the offline model.
    pub catalog: Arc<Catalog>,
    /// One line that says which it is (never the key).
    pub line: String,
}

/// The model client from the environment (`ANTHROPIC_API_KEY`, `ANTHROPIC_BASE_URL`), with
/// platform calls to unpriced models refused by `catalog`.
pub fn model_from_env(catalog: Catalog) -> Result<Chosen> {
    model_from_config(AnthropicConfig::from_env(), catalog)
}

/// As [`model_from_env`], from a configuration. Without a platform key, platform calls go to
/// the offline model (priced by the [`offline_catalog`]) and BYOK calls to the configured
/// base URL with the run's own key.
pub fn model_from_config(config: AnthropicConfig, catalog: Catalog) -> Result<Chosen> {
    let base_url = config.base_url.clone();
    let date = catalog.date.clone();
    if config.api_key.is_some() {
        let catalog = Arc::new(catalog);
        let anthropic = AnthropicClient::new(config)?.with_catalog(catalog.clone());
        Ok(Chosen {
            model: Arc::new(anthropic),
            catalog,
            line: format!(
                "model: the Anthropic Messages API at {base_url} (platform key from \
                 ANTHROPIC_API_KEY; catalog prices of {date})"
            ),
        })
    } else {
        let catalog = Arc::new(offline_catalog(&catalog));
        let anthropic = AnthropicClient::new(config)?.with_catalog(catalog.clone());
        Ok(Chosen {
            model: Arc::new(OfflinePlatform {
                anthropic,
                offline: ScriptedModel::offline(),
            }),
            catalog,
            line: format!(
                "model: the OFFLINE scripted model ({OFFLINE_MODEL}, $0) for platform access \
                 (no ANTHROPIC_API_KEY): it runs the shell commands a prompt quotes in \
                 backticks; BYOK agents reach {base_url} with their own key"
            ),
        })
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
            }]
            .into(),
            tools: Vec::new(),
            tool_choice: ToolChoice::Auto,
            max_tokens: 16,
            credentials,
        }
    }

    #[tokio::test]
    async fn without_a_platform_key_platform_calls_are_offline_and_byok_calls_are_not() {
        let catalog = crate::default_catalog().expect("catalog");
        let mut config = AnthropicConfig::new();
        // Nothing listens on port 9 here: a BYOK call fails to connect, proving it went out.
        config.base_url = "http://127.0.0.1:9".into();
        config.http.retry.max_attempts = 1;
        let chosen = model_from_config(config.clone(), catalog.clone()).expect("model");
        let (model, line) = (chosen.model, chosen.line);
        assert!(line.contains("OFFLINE"), "{line}");
        for family in nodus_core::catalog::Family::ALL {
            let entry = chosen.catalog.family(family).expect("every family");
            assert_eq!(entry.model, OFFLINE_MODEL);
            assert_eq!(
                nodus_core::cost::bill(
                    &entry.prices,
                    &nodus_core::cost::Usage {
                        input_tokens: 1_000_000,
                        output_tokens: 1_000_000,
                        cache_write_tokens: 0,
                        cache_read_tokens: 0,
                    }
                ),
                Usd::ZERO
            );
        }
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
        let chosen = model_from_config(config, catalog.clone()).expect("model");
        assert_eq!(
            *chosen.catalog, catalog,
            "a platform key keeps the catalog's prices"
        );
        let line = chosen.line;
        assert!(
            line.contains("Anthropic Messages API") && !line.contains("sk-platform"),
            "{line}"
        );
    }
}

//! A router that asks a small model which family should answer: the second implementation
//! of the [`Router`] trait, beside [`crate::jev`].
//!
//! Its call is a routing call: it returns the model and usage in [`RouteChoice::call`], and
//! the engine bills it like any call (provider price ÷ 0.875, rounded up). Before routing the
//! engine reserves [`Router::max_cost`]: the router bounds its request (the prompt is cut to
//! a fixed number of bytes, and a token is at least one byte) and its answer (`max_tokens`),
//! so the real cost never exceeds what was reserved. A routing model without a known price is
//! refused when the router is built (fail closed).
//!
//! The model's answer names a family; the agent's `families` restriction applies to it as in
//! jev. An answer that names no family still cost money, so it is billed and the turn goes to
//! the fallback family among the allowed ones; a failed call is a routing error (the engine
//! then falls back and records `chosenBy: fallback`).

use std::sync::Arc;

use async_trait::async_trait;
use nodus_core::catalog::{Catalog, Family};
use nodus_core::cost::{self, Prices};
use nodus_core::model::{
    ChatMessage, ContentBlock, Credentials, ModelClient, ModelRequest, Role, ToolChoice,
};
use nodus_core::money::Usd;
use nodus_core::router::{self, RouteChoice, RouteRequest, Router, RoutingCall};

use crate::error::{Error, Result};
use crate::jev::restrict;

/// The most of the prompt sent to the routing model.
pub const DEFAULT_PROMPT_BYTES: usize = 4_000;
/// The routing model's largest answer.
pub const DEFAULT_MAX_TOKENS: u32 = 8;
/// Tokens allowed for the message framing the provider adds around the text.
const FRAMING_TOKENS: u64 = 64;

const SYSTEM: &str = "You route requests to AI models of four sizes: haiku (simple questions, \
one command, short edits), sonnet (ordinary coding and writing tasks of a few steps), opus \
(careful multi-step engineering: debugging, design, security, performance), fable (the most \
demanding work: proofs, formal methods, research, building large systems from scratch). \
Answer with one word: the smallest size that will do the request well.";

/// A router that asks a small model.
pub struct ModelRouter {
    client: Arc<dyn ModelClient>,
    model: String,
    prices: Prices,
    prompt_bytes: usize,
    max_tokens: u32,
}

impl std::fmt::Debug for ModelRouter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelRouter")
            .field("model", &self.model)
            .field("prompt_bytes", &self.prompt_bytes)
            .field("max_tokens", &self.max_tokens)
            .finish()
    }
}

impl ModelRouter {
    /// A router asking `model` through `client`; the catalog must price the model.
    pub fn new(client: Arc<dyn ModelClient>, model: &str, catalog: &Catalog) -> Result<Self> {
        let prices = *catalog.prices_of(model).ok_or_else(|| {
            Error::Config(format!(
                "the routing model {model} has no known price; a routing call must be billable"
            ))
        })?;
        Ok(ModelRouter {
            client,
            model: model.to_string(),
            prices,
            prompt_bytes: DEFAULT_PROMPT_BYTES,
            max_tokens: DEFAULT_MAX_TOKENS,
        })
    }

    /// Send at most this many bytes of the prompt.
    pub fn with_prompt_bytes(mut self, bytes: usize) -> Self {
        self.prompt_bytes = bytes;
        self
    }

    /// The request for one prompt; its bytes bound its tokens.
    fn request(&self, request: &RouteRequest<'_>) -> ModelRequest {
        let mut end = request.prompt.len().min(self.prompt_bytes);
        while !request.prompt.is_char_boundary(end) {
            end -= 1;
        }
        let tool_results = request
            .conversation
            .iter()
            .flat_map(|m| &m.content)
            .filter(|b| matches!(b, ContentBlock::ToolResult { .. }))
            .count();
        let allowed: Vec<&str> = request.allowed.iter().map(|f| f.as_str()).collect();
        let text = format!(
            "Allowed sizes: {}.\nConversation so far: {} messages, {} tool results.\n\
             Request{}:\n{}",
            allowed.join(", "),
            request.conversation.len().min(99_999),
            tool_results.min(99_999),
            if end < request.prompt.len() {
                " (cut)"
            } else {
                ""
            },
            &request.prompt[..end]
        );
        ModelRequest {
            model: self.model.clone(),
            system: SYSTEM.to_string(),
            messages: vec![ChatMessage {
                role: Role::User,
                content: vec![ContentBlock::Text { text }],
            }]
            .into(),
            tools: Vec::new(),
            tool_choice: ToolChoice::None,
            max_tokens: self.max_tokens,
            credentials: Credentials::Platform,
        }
    }

    /// The most prompt tokens a routing request can have.
    fn prompt_bound(&self) -> u64 {
        let fixed = "Allowed sizes: haiku, sonnet, opus, fable.\nConversation so far: 99999 \
                     messages, 99999 tool results.\nRequest (cut):\n";
        (SYSTEM.len() + fixed.len() + self.prompt_bytes) as u64 + FRAMING_TOKENS
    }
}

/// The family a routing answer names, if it names one.
fn named_family(answer: &str) -> Option<Family> {
    let lower = answer.to_ascii_lowercase();
    lower
        .split(|c: char| !c.is_ascii_alphabetic())
        .find_map(|word| Family::ALL.into_iter().find(|f| f.as_str() == word))
}

#[async_trait]
impl Router for ModelRouter {
    fn max_cost(&self) -> Usd {
        cost::worst_case(&self.prices, self.prompt_bound(), self.max_tokens)
    }

    async fn route(&self, request: &RouteRequest<'_>) -> Result<RouteChoice, router::Error> {
        if request.allowed.is_empty() {
            return Err(router::Error("no family is allowed".to_string()));
        }
        let response = self
            .client
            .complete(&self.request(request))
            .await
            .map_err(|e| router::Error(format!("the routing model failed: {e}")))?;
        let call = Some(RoutingCall {
            model: self.model.clone(),
            usage: response.usage,
        });
        let fallback = if request.allowed.contains(&Family::FALLBACK) {
            Family::FALLBACK
        } else {
            restrict(Family::FALLBACK, request.allowed).unwrap_or(Family::FALLBACK)
        };
        let family = match named_family(&response.text()) {
            Some(named) => restrict(named, request.allowed).unwrap_or(fallback),
            None => {
                tracing::warn!(model = %self.model, "the routing model named no family; the fallback answers");
                fallback
            }
        };
        Ok(RouteChoice { family, call })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scripted::{Reply, ScriptedModel};

    fn router(answer: &str) -> ModelRouter {
        let catalog = crate::default_catalog().expect("catalog");
        ModelRouter::new(
            Arc::new(ScriptedModel::new(vec![Reply::Text(answer.to_string())])),
            "claude-haiku-4-5",
            &catalog,
        )
        .expect("priced")
    }

    fn ask(prompt: &str, allowed: &[Family]) -> RouteRequest<'static> {
        let prompt: &'static str = Box::leak(prompt.to_string().into_boxed_str());
        let allowed: &'static [Family] = Box::leak(allowed.to_vec().into_boxed_slice());
        RouteRequest {
            prompt,
            conversation: &[],
            allowed,
        }
    }

    #[tokio::test]
    async fn the_answer_names_the_family_and_the_call_is_returned_for_billing() {
        let choice = router("Opus.")
            .route(&ask("design a cache", &Family::ALL))
            .await
            .expect("routed");
        assert_eq!(choice.family, Family::Opus);
        let call = choice.call.expect("a routing call");
        assert_eq!(call.model, "claude-haiku-4-5");
        assert!(call.usage.input_tokens > 0);
    }

    #[tokio::test]
    async fn restriction_and_unreadable_answers() {
        let restricted = router("fable")
            .route(&ask("prove it", &[Family::Haiku, Family::Sonnet]))
            .await
            .expect("routed");
        assert_eq!(restricted.family, Family::Sonnet);
        let unreadable = router("I cannot tell")
            .route(&ask("?", &[Family::Haiku, Family::Opus]))
            .await
            .expect("routed");
        assert_eq!(
            unreadable.family,
            Family::Opus,
            "the fallback among the allowed"
        );
        assert!(
            unreadable.call.is_some(),
            "a call that cost money is billed"
        );
        assert!(router("haiku").route(&ask("x", &[])).await.is_err());
    }

    #[test]
    fn an_unpriced_routing_model_is_refused() {
        let catalog = crate::default_catalog().expect("catalog");
        let err = ModelRouter::new(
            Arc::new(ScriptedModel::offline()),
            "tiny-unpriced",
            &catalog,
        )
        .expect_err("fail closed");
        assert!(err.to_string().contains("no known price"));
    }

    #[test]
    fn the_request_is_bounded_by_what_max_cost_assumes() {
        let router = router("haiku").with_prompt_bytes(100);
        let long = "é".repeat(1_000);
        let conversation = crate::jev::synthetic_history("task", 50_000, 1);
        let request = router.request(&RouteRequest {
            prompt: &long,
            conversation: &conversation,
            allowed: &Family::ALL,
        });
        let bytes = request.system.len()
            + request
                .messages
                .iter()
                .flat_map(|m| &m.content)
                .map(|b| match b {
                    ContentBlock::Text { text } => text.len(),
                    _ => 0,
                })
                .sum::<usize>();
        assert!(
            bytes as u64 + FRAMING_TOKENS <= router.prompt_bound(),
            "{bytes}"
        );
        assert!(router.max_cost() > Usd::ZERO);
    }
}

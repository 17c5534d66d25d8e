//! Model clients for Nodus: how runs reach real models, and how every call is priced and
//! routed.
//!
//! - [`anthropic`]: the Anthropic Messages API client (plain and streamed, token counting).
//! - [`openai`]: an OpenAI-compatible chat-completions client (vLLM, llama.cpp's server,
//!   Ollama and other gateways), for local models.
//! - [`http`]: the transport both share, with the retry rules that never charge twice.
//! - [`catalog`]: the model catalog as data (shipped defaults, replaceable by a file).
//! - [`jev`]: the built-in router, a pure function of cheap local features;
//!   [`model_router`]: a router that asks a small model, billed as a routing call.
//! - [`scripted`]: the scripted and offline model for tests and the offline demo;
//!   [`from_env`]: the default client from the environment (Anthropic, or offline without a
//!   platform key).
//! - `testing` (feature `test-util`): a fake Anthropic- and OpenAI-compatible HTTP server.

pub mod anthropic;
pub mod catalog;
pub mod error;
pub mod from_env;
pub mod http;
pub mod jev;
pub mod model_router;
pub mod openai;
pub mod scripted;
mod sse;
#[cfg(feature = "test-util")]
pub mod testing;

pub use anthropic::{AnthropicClient, AnthropicConfig};
pub use catalog::default_catalog;
pub use error::{Error, Result};
pub use from_env::{OFFLINE_MODEL, model_from_env, offline_catalog};
pub use http::{HttpConfig, RetryPolicy};
pub use jev::Jev;
pub use model_router::ModelRouter;
pub use openai::{OpenAiClient, OpenAiConfig};
pub use scripted::{Reply, ScriptedModel};

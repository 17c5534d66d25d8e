//! Model clients for Nodus.
//!
//! Today: the default model catalog and the scripted model (deterministic replies for tests
//! and the offline demo). The Anthropic Messages client, the OpenAI-compatible client and
//! the router `jev` come with the models issue.

pub mod catalog;
pub mod scripted;

pub use catalog::default_catalog;
pub use scripted::{Reply, ScriptedModel};

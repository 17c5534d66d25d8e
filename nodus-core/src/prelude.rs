//! What an embedder names, in one import (`use nodus_core::prelude::*;`): the engine and
//! what it is built from, the runner, the resources people write, a run's and a group's
//! phase, exact money, and the traits a store, a sandbox, a model client and a clock
//! implement (their backends live in nodus-store, nodus-sandbox and nodus-llm).
//!
//! With it, an embedding program names nodus-core once and each backend crate at its root
//! (`nodus_store::SqliteStore`, `nodus_sandbox::BwrapSandbox`, `nodus_llm::AnthropicClient`);
//! `examples/embedding.rs` and `examples/embedding_group.rs` import nothing else. The
//! settings ([`Config`], [`RunnerConfig`]) grow with new versions: start from their
//! `Default` and set the fields you change
//! (`let mut config = Config::default(); config.replica = Some("a".into());`).

pub use crate::clock::{Clock, SystemClock};
pub use crate::engine::{Config, Deps, Engine, Error, Result};
pub use crate::lifecycle::RunPhase;
pub use crate::model::ModelClient;
pub use crate::money::Usd;
pub use crate::resource::{
    Agent, AgentGroup, AgentGroupSpec, AgentRun, AgentRunSpec, AgentSpec, GroupLimits, GroupPhase,
};
pub use crate::runner::{Runner, RunnerConfig, RunnerHandle};
pub use crate::sandbox::Sandbox;
pub use crate::store::Store;

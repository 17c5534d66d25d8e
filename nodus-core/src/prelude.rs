//! What an embedder names, in one import (`use nodus_core::prelude::*;`): the engine and
//! what it is built from, the runner, the resources people write, a run's and a group's
//! phase, exact money, and the traits a store, a sandbox, a model client and a clock
//! implement (their backends live in nodus-store, nodus-sandbox and nodus-llm).

pub use crate::clock::{Clock, SystemClock};
pub use crate::engine::{Config, Deps, Engine, Error, Result};
pub use crate::lifecycle::RunPhase;
pub use crate::model::ModelClient;
pub use crate::money::Usd;
pub use crate::resource::{
    Agent, AgentGroup, AgentGroupSpec, AgentRun, AgentRunSpec, AgentSpec, GroupPhase,
};
pub use crate::runner::{Runner, RunnerConfig, RunnerHandle};
pub use crate::sandbox::Sandbox;
pub use crate::store::Store;

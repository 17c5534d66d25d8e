//! nodus-core: the library at the heart of Nodus.
//!
//! It holds the resource types and their validation, exact money, the pure state machines
//! (run lifecycle, group controller, cost guard), the traits through which everything
//! touches the world ([`Store`], [`Sandbox`], [`ModelClient`], [`Router`], [`Clock`]), the
//! durable run engine built on them, and the [`Runner`] that schedules its runs and groups
//! (the server only starts it). It does no I/O of its own.
//!
//! # Embedding
//!
//! [`prelude`] holds what an embedder names; the backends come from nodus-store (a store),
//! nodus-sandbox (a sandbox) and nodus-llm (a model client and its catalog).
//!
//! An [`Engine`](engine::Engine) is built from its [`Deps`](engine::Deps) — a sandbox, a model
//! client and its catalog; [`Deps::builder`](engine::Deps::builder) fills in the rest (the
//! in-memory store, the system clock, no metering; `.store(…)` for a durable one) — and a
//! [`Config`](engine::Config). Its operations write what people ask for (agents, runs,
//! groups; messages, cancellations); the [`Runner`] drives the runs. Here with the in-memory store, the unisolated sandbox (a
//! directory per run, no isolation: for trusted commands only) and the offline model, which
//! answers without calling anyone and is free:
//!
//! ```
//! use std::sync::Arc;
//!
//! use nodus_core::prelude::*;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let workdirs = tempfile::tempdir()?;
//! let deps = Deps::builder(
//!     Arc::new(nodus_sandbox::UnisolatedSandbox::new(workdirs.path().to_path_buf())),
//!     Arc::new(nodus_llm::ScriptedModel::offline()),
//!     nodus_llm::offline_catalog(&nodus_llm::default_catalog()?),
//! )
//! .build();
//! let engine = Engine::new(deps, Config::default());
//! let runner = Runner::start(engine.clone(), RunnerConfig::default());
//!
//! engine
//!     .apply_agent("default", Agent::new("helper", AgentSpec::new("You are careful.")))
//!     .await?;
//! let run = AgentRun::new("first", AgentRunSpec::new("helper", "Say hello."));
//! engine.create_run("default", run).await?;
//!
//! let run = runner.settled("default", "first").await?;
//! assert_eq!(run.status.phase, Some(RunPhase::Succeeded));
//! let answer = engine.answer("default", "first").await?;
//! assert!(answer.is_some_and(|text| !text.is_empty()));
//! runner.shutdown().await;
//! # Ok(())
//! # }
//! ```

pub mod address;
pub mod catalog;
pub mod clock;
pub mod cost;
/// Public with `test-util`, for the engine's benchmarks; internal otherwise.
#[cfg(feature = "test-util")]
pub mod decide;
#[cfg(not(feature = "test-util"))]
pub(crate) mod decide;
pub mod digest;
pub mod egress;
pub mod egress_log;
pub mod engine;
pub mod evaluation;
pub mod group;
pub mod journal;
pub mod ledger;
pub mod lifecycle;
pub mod model;
pub mod money;
pub mod output;
pub mod patch;
pub mod postrun;
pub mod prelude;
/// Public with `test-util`, for the engine's benchmarks; internal otherwise.
#[cfg(feature = "test-util")]
pub mod replay;
#[cfg(not(feature = "test-util"))]
pub(crate) mod replay;
pub mod resource;
pub mod retention;
pub mod router;
pub mod runner;
pub mod sandbox;
pub(crate) mod sandboxing;
#[cfg(feature = "openapi")]
pub mod schema;
pub mod secret;
pub mod snapshot;
pub mod store;
pub mod telemetry;
#[cfg(any(test, feature = "test-util"))]
pub mod testing;
pub mod trajectory;
pub mod validate;

pub use clock::Clock;
pub use model::ModelClient;
pub use money::Usd;
pub use replay::{TurnLine, turn_lines};
pub use router::Router;
pub use runner::{Runner, RunnerConfig, RunnerHandle};
pub use sandbox::Sandbox;
pub use store::Store;

//! nodus-core: the library at the heart of Nodus.
//!
//! It holds the resource types and their validation, exact money, the pure state machines
//! (run lifecycle, group controller, cost guard), the traits through which everything
//! touches the world ([`Store`], [`Sandbox`], [`ModelClient`], [`Router`], [`Clock`]), the
//! durable run engine built on them, and the [`Runner`] that schedules its runs and groups
//! (the server only starts it). It does no I/O of its own.

pub mod catalog;
pub mod clock;
pub mod cost;
pub mod decide;
pub mod digest;
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
pub mod replay;
pub mod resource;
pub mod retention;
pub mod router;
pub mod runner;
pub mod sandbox;
pub mod secret;
pub mod store;
#[cfg(any(test, feature = "test-util"))]
pub mod testing;
pub mod validate;

pub use clock::Clock;
pub use model::ModelClient;
pub use money::Usd;
pub use router::Router;
pub use runner::{Runner, RunnerConfig, RunnerHandle};
pub use sandbox::Sandbox;
pub use store::Store;

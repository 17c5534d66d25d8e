//! The Nodus server: the REST API (axum), auth with project-bound tokens, sealed Secrets and
//! project credits, on top of nodus-core, whose `Runner` (started by the server) drives the
//! runs and groups. `nodus server` (in nodus-cli) starts it.

pub mod actions;
pub mod admission;
mod api;
pub mod app;
pub mod auth;
pub mod console;
mod download;
pub mod egress;
pub mod egress_proxy;
pub mod egress_tls;
pub mod error;
mod listen;
pub mod lock;
mod metrics;
pub mod options;
mod paging;
pub mod replicas;
pub mod reserve;
pub mod secrets;
mod start_error;
mod state;
pub mod stream;
pub mod telemetry;
pub mod watch;

pub use api::{WORKER_PATHS, router, worker_router};
pub use app::Server;
pub use options::{
    Options, ROOT_SANDBOX_AREA, Role, SandboxKind, StoreUrl, default_capacity, default_data_dir,
    default_sandbox_dir, host_capacity,
};
pub use start_error::StartError;
pub use state::AppState;

/// The API group and version the server serves.
pub const API_PATH: &str = "/apis/nodus.dev/v1";

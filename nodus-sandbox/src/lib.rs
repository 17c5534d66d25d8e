//! Sandbox backends for Nodus: implementations of [`nodus_core::Sandbox`], the place where a
//! run's shell commands execute.
//!
//! Today there is one backend, [`UnisolatedSandbox`]: plain local processes in a directory per
//! run, with **no isolation**, for the embedding example, tests and operators who choose it by
//! name. Backends that isolate come later: a process backend on bubblewrap (new namespaces, no
//! network, read-only system, only the working directory writable, cgroup limits) and a Docker
//! backend (no network by default, memory/cpu/pids limits, reattach after restart).
//!
//! What every backend shares lives here too: checks of sandbox keys and relative paths, and
//! tar transfer that validates every entry of an incoming archive before writing anything.

mod archive;
mod paths;
pub mod unisolated;

pub use unisolated::UnisolatedSandbox;

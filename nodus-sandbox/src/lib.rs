//! Sandbox backends for Nodus: implementations of [`nodus_core::Sandbox`], the place where a
//! run's shell commands execute.
//!
//! - [`BwrapSandbox`]: the process backend. Each sandbox is one bubblewrap process, kept
//!   between its commands, in new namespaces, without network, with a read-only view of the
//!   host's system directories and only its working directory writable; cgroup limits where
//!   the host allows, rlimits otherwise.
//! - [`DockerSandbox`] (feature `docker`): one container per run, kept alive between
//!   commands, without network by default, with memory, CPU and process limits, labelled so
//!   that a restarted server reattaches to its containers and removes orphans.
//! - [`UnisolatedSandbox`]: plain local processes in a directory per run with **no
//!   isolation**, for the embedding example, tests and operators who choose it by name; it
//!   reports `isolated: false`.
//!
//! What every backend shares lives here too, written once: checks of sandbox keys and
//! relative paths, tar transfer that validates every entry of an incoming archive before
//! writing anything, output capping, and local process handling. The conformance suite that
//! every backend passes is [`conformance`] (feature `test-util`).

mod archive;
mod bubblewrap;
pub mod bwrap;
mod capped;
mod cgroup;
mod channel;
#[cfg(feature = "test-util")]
pub mod conformance;
mod cpus;
mod disk;
#[cfg(feature = "docker")]
pub mod docker;
mod host;
mod launcher;
mod paths;
mod process;
mod trust;
pub mod unisolated;
mod watch;
mod workdir;
mod zygote;

pub use bwrap::{
    BwrapConfig, BwrapSandbox, CgroupUse, DEFAULT_CGROUP_POOL, DEFAULT_NETNS_POOL,
    DEFAULT_SANDBOX_USER, HostUser,
};
#[cfg(feature = "docker")]
pub use docker::{DockerConfig, DockerEgress, DockerHost, DockerHosts, DockerSandbox};
pub use unisolated::UnisolatedSandbox;

//! The `Sandbox` trait: an isolated place with a working directory where a run's commands
//! execute. Backends (bubblewrap processes, Docker containers) live in nodus-sandbox.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::output::Output;

/// The backend's id of a sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct SandboxId(pub String);

impl fmt::Display for SandboxId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Compute limits of a sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Limits {
    /// CPU in thousandths of a core.
    pub cpu_millis: u32,
    /// Memory in bytes.
    pub memory_bytes: u64,
    /// Processes and threads.
    pub processes: u32,
    /// Wall time of one command.
    pub command_timeout_secs: u64,
    /// Bytes of stdout and of stderr kept per command.
    pub output_cap_bytes: u64,
}

impl Default for Limits {
    /// 1 CPU, 1 GiB, 256 processes, 300 s per command, 1 MiB of each output stream.
    fn default() -> Self {
        Limits {
            cpu_millis: 1000,
            memory_bytes: 1 << 30,
            processes: 256,
            command_timeout_secs: 300,
            output_cap_bytes: 1 << 20,
        }
    }
}

/// What to create.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SandboxSpec {
    /// A stable key (the run's uid): creating again with the same key re-attaches to the
    /// same sandbox and working directory, which makes creation safe to repeat after a crash.
    pub key: String,
    /// Container image, for container backends.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// Environment variables of every command.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Compute limits.
    pub limits: Limits,
    /// Whether the sandbox may reach the network.
    #[serde(default)]
    pub network: bool,
}

/// A created sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SandboxInfo {
    /// Its id.
    pub id: SandboxId,
    /// False for an unisolated mode that the operator chose by name.
    pub isolated: bool,
}

/// One command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecRequest {
    /// A shell command line, run with `sh -c`.
    pub command: String,
    /// Killed (with its whole process tree) after this long.
    pub timeout: Duration,
    /// Directory relative to the working directory; the working directory when `None`.
    pub cwd: Option<String>,
    /// Bytes of stdout and of stderr to keep.
    pub output_cap: u64,
}

/// What a command did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ExecOutput {
    /// The exit code; `None` when a signal ended it.
    pub exit_code: Option<i32>,
    /// Standard output, raw.
    pub stdout: Output,
    /// Standard error, raw.
    pub stderr: Output,
    /// Whether the timeout killed it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub timed_out: bool,
}

/// What can go wrong with a sandbox.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// No sandbox with this id.
    #[error("sandbox {0} does not exist")]
    NotFound(SandboxId),
    /// The backend cannot work right now (a daemon restarting); a retry may help.
    #[error("sandbox backend unavailable: {0}")]
    Unavailable(String),
    /// The request is refused (a hostile archive, a missing tool); a retry will not help.
    #[error("{0}")]
    Refused(String),
    /// Something else failed.
    #[error("sandbox failure: {0}")]
    Failed(String),
}

impl Error {
    /// Whether trying again may help.
    pub fn is_retryable(&self) -> bool {
        matches!(self, Error::Unavailable(_))
    }
}

/// A place where a run's commands execute.
#[async_trait]
pub trait Sandbox: Send + Sync {
    /// Create (or re-attach to) the sandbox for `spec.key`.
    async fn create(&self, spec: &SandboxSpec) -> Result<SandboxInfo, Error>;
    /// Run one command.
    async fn exec(&self, id: &SandboxId, request: &ExecRequest) -> Result<ExecOutput, Error>;
    /// Unpack a tar archive into the working directory (paths checked: relative, no `..`,
    /// no links pointing outside).
    async fn put_files(&self, id: &SandboxId, tar: Vec<u8>) -> Result<(), Error>;
    /// A tar archive of `path`, relative to the working directory.
    async fn get_files(&self, id: &SandboxId, path: &str) -> Result<Vec<u8>, Error>;
    /// Remove the sandbox; removing one that is gone is fine.
    async fn destroy(&self, id: &SandboxId) -> Result<(), Error>;
}

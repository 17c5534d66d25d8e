//! The `Sandbox` trait: an isolated place with a working directory where a run's commands
//! execute. Backends (bubblewrap processes, Docker containers) live in nodus-sandbox.
//!
//! What every backend guarantees, beyond the signatures:
//! - **Limits.** A sandbox's [`Limits`] are fixed when it is created. A command runs for at
//!   most the smaller of [`ExecRequest::timeout`] and [`Limits::command_timeout_secs`], and
//!   keeps at most the smaller of [`ExecRequest::output_cap`] and
//!   [`Limits::output_cap_bytes`] of each stream ([`ExecRequest::within`]).
//! - **Bounded command lines.** A command longer than [`MAX_COMMAND_BYTES`] is refused
//!   before anything runs ([`ExecRequest::within`]), the same on every backend.
//! - **No leftovers.** A timeout kills the command's whole process tree and returns what it
//!   printed so far. Processes a command leaves running in the background do not outlive it.
//! - **Cancellation kills.** Dropping the future of [`Sandbox::exec`] before it completes
//!   kills the command (at once or within moments, from a background task).
//! - **One command at a time.** A backend may run the commands of one sandbox one after the
//!   other; callers do not rely on two commands of one sandbox running side by side.
//! - **Bounded archives.** Archives are whole byte vectors of at most [`MAX_ARCHIVE_BYTES`]:
//!   [`Sandbox::put_files`] refuses a larger one, and [`Sandbox::get_files`] stops building
//!   one as soon as it would grow past the caller's cap (never more than
//!   [`MAX_ARCHIVE_BYTES`]). An archive that comes out has no set-uid, set-gid or sticky
//!   bits and no symbolic link that leads outside the working directory.
//! - **Only the working directory lasts.** A backend may keep processes for a sandbox
//!   between commands (a container, a bubblewrap sandbox) and end them at any time: when the
//!   run waits ([`Sandbox::suspend`]), when one died, after a timeout. The next command finds
//!   the working directory as it was and the sandbox started again; `/tmp` may be fresh.
//! - **Bounded disk.** A command that makes the working directory larger than
//!   [`Limits::disk_bytes`], or leaves the file system of the working directories less free
//!   space than the backend's reserve, is stopped, and [`ExecOutput::stopped`] says why.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::egress::InjectedHeader;
use crate::output::Output;
use crate::resource::NetworkSpec;

pub use crate::snapshot::archive::MAX_ARCHIVE_BYTES;

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
    /// Bytes the working directory may take on disk ([`DEFAULT_DISK_BYTES`] when a stored
    /// spec has none): a command that grows it past this is stopped.
    #[serde(default = "default_disk_bytes")]
    pub disk_bytes: u64,
}

/// The default [`Limits::disk_bytes`]: 1 GiB.
pub const DEFAULT_DISK_BYTES: u64 = 1 << 30;

fn default_disk_bytes() -> u64 {
    DEFAULT_DISK_BYTES
}

impl Default for Limits {
    /// 1 CPU, 1 GiB, 256 processes, 300 s per command, 1 MiB of each output stream, 1 GiB
    /// of working directory.
    fn default() -> Self {
        Limits {
            cpu_millis: 1000,
            memory_bytes: 1 << 30,
            processes: 256,
            command_timeout_secs: 300,
            output_cap_bytes: 1 << 20,
            disk_bytes: DEFAULT_DISK_BYTES,
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
    /// Container image, for container backends: the engine passes the content digest
    /// [`Sandbox::resolve_image`] answered when the run was created.
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
    /// The allowlist of a sandbox whose only way out is the egress proxy
    /// ([`EgressGate`]); `None` (and `network: false`): no way out at all. Only a backend
    /// that [`Sandbox::supports_egress`] takes one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress: Option<NetworkSpec>,
    /// The headers `spec.network.inject` has the egress proxy add, with their Secrets'
    /// values: filled in only when the sandbox is created, never written anywhere (not
    /// serialized, redacted when printed) and never given to the sandbox itself.
    #[serde(skip)]
    pub egress_headers: Vec<InjectedHeader>,
    /// Absolute paths that lead to directories of the working directory: `/grading` →
    /// `grading` shows the working directory's `grading` at `/grading` too (a symbolic link
    /// in the sandbox's own root; the directory need not exist yet). Each path is one name
    /// below `/` that no system directory takes ([`check_links`]). The unisolated backend,
    /// which has no root of its own, makes none: its commands reach the directories only by
    /// their relative paths.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub links: BTreeMap<String, String>,
}

/// The names below `/` a [`SandboxSpec::links`] path may not take: the system's directories
/// and those every sandbox has.
const RESERVED_ROOT_NAMES: [&str; 22] = [
    "bin", "boot", "dev", "etc", "home", "lib", "lib32", "lib64", "libx32", "media", "mnt", "nix",
    "opt", "proc", "root", "run", "sbin", "srv", "sys", "tmp", "usr", "var",
];

/// Checks [`SandboxSpec::links`] against `workdir`, where the backend shows the working
/// directory: each path is `/NAME` (a name of letters, digits, `.`, `_` and `-`, not `.` or
/// `..`, no system directory's and not the working directory's own), each target a relative
/// path of plain names. A refusal names the link.
pub fn check_links(links: &BTreeMap<String, String>, workdir: &str) -> Result<(), String> {
    let plain = |name: &str| {
        !name.is_empty()
            && name != "."
            && name != ".."
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
    };
    let own = workdir
        .trim_start_matches('/')
        .split('/')
        .next()
        .unwrap_or_default();
    for (path, target) in links {
        let name = path.strip_prefix('/').unwrap_or_default();
        if !plain(name) || RESERVED_ROOT_NAMES.contains(&name) || name == own {
            return Err(format!(
                "the link {path:?} must be /NAME, one name below / that no system directory \
                 nor the working directory ({workdir}) takes"
            ));
        }
        if !target.split('/').all(plain) {
            return Err(format!(
                "the link {path:?} must lead to a relative path of the working directory, not \
                 {target:?}"
            ));
        }
    }
    Ok(())
}

/// The longest command line a sandbox runs, in bytes: Linux hands it to `/bin/sh -c` as one
/// argument, and one argument holds at most 128 KiB with its terminating NUL.
pub const MAX_COMMAND_BYTES: usize = (128 << 10) - 1;

/// A created sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SandboxInfo {
    /// Its id.
    pub id: SandboxId,
    /// False for an unisolated mode that the operator chose by name.
    pub isolated: bool,
    /// The host it lives on, where the backend places sandboxes on several (remote Docker
    /// hosts); absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
}

/// One command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecRequest {
    /// A shell command line, run with `sh -c`.
    pub command: String,
    /// Killed (with its whole process tree) after this long, or after the sandbox's
    /// [`Limits::command_timeout_secs`] when that is shorter.
    pub timeout: Duration,
    /// Directory relative to the working directory; the working directory when `None`.
    pub cwd: Option<String>,
    /// Bytes of stdout and of stderr to keep, or the sandbox's [`Limits::output_cap_bytes`]
    /// when that is smaller.
    pub output_cap: u64,
}

impl ExecRequest {
    /// This request with its timeout and output cap bounded by a sandbox's limits (the
    /// request's values win where they are smaller), or [`Error::Refused`] for a command
    /// longer than [`MAX_COMMAND_BYTES`], which no backend can hand to its shell.
    pub fn within(&self, limits: &Limits) -> Result<ExecRequest, Error> {
        let length = self.command.len();
        if length > MAX_COMMAND_BYTES {
            return Err(Error::Refused(format!(
                "the command is {length} bytes long, and a command may have at most \
                 {MAX_COMMAND_BYTES}: nothing ran; write large files in several commands"
            )));
        }
        Ok(ExecRequest {
            command: self.command.clone(),
            timeout: self
                .timeout
                .min(Duration::from_secs(limits.command_timeout_secs)),
            cwd: self.cwd.clone(),
            output_cap: self.output_cap.min(limits.output_cap_bytes),
        })
    }
}

/// What a command did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ExecOutput {
    /// The exit code; `None` when a signal ended it. (Docker reports a command ended by a
    /// signal as exit code 128 + the signal's number, so its backend cannot tell.)
    pub exit_code: Option<i32>,
    /// Standard output, raw.
    pub stdout: Output,
    /// Standard error, raw.
    pub stderr: Output,
    /// Whether the timeout killed it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub timed_out: bool,
    /// Why the sandbox stopped it before it ended, when it did for a limit other than the
    /// timeout (the working directory grew past [`Limits::disk_bytes`], the disk ran short).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stopped: Option<String>,
}

/// One of a command's two output streams.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Stream {
    /// Standard output.
    Stdout,
    /// Standard error.
    Stderr,
}

/// Where [`Sandbox::exec_live`] reports a running command's output as it arrives, for people
/// following the run. What it reports is what the command printed, within the request's
/// output cap, with one exception: a newline that ends what has come so far is reported at
/// once, although it may turn out to be the start of the backend's end marker (a command
/// whose output does not end with a newline). The [`ExecOutput`] stays the record.
pub trait LiveOutput: Send + Sync {
    /// `bytes` of `stream`, starting at byte `offset` of what the command printed on it.
    /// Called from the task that reads the command: it must not block.
    fn output(&self, stream: Stream, offset: u64, bytes: &[u8]);
}

/// What can go wrong with a sandbox.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
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
    /// The command could not be started because the host was out of a resource for the
    /// moment (open files, processes, memory): it certainly did not run, and a retry may help.
    #[error("the command could not be started, so it did not run: {0}")]
    NotStarted(String),
}

impl Error {
    /// Whether trying again may help.
    pub fn is_retryable(&self) -> bool {
        matches!(self, Error::Unavailable(_) | Error::NotStarted(_))
    }
}

/// A place where a run's commands execute. See the [module docs](self) for what every
/// backend guarantees.
#[cfg_attr(test, mockall::automock)]
#[async_trait]
pub trait Sandbox: Send + Sync {
    /// Create (or re-attach to) the sandbox for `spec.key`. After a restart of the server,
    /// `create` with the same spec must be called again before `exec`.
    async fn create(&self, spec: &SandboxSpec) -> Result<SandboxInfo, Error>;
    /// Run one command, bounded by the sandbox's limits ([`ExecRequest::within`]). Dropping
    /// the returned future kills the command.
    async fn exec(&self, id: &SandboxId, request: &ExecRequest) -> Result<ExecOutput, Error>;
    /// [`Sandbox::exec`], reporting the command's output to `live` while it runs. The
    /// default reports nothing: a backend that cannot stream leaves followers to the
    /// completed step.
    async fn exec_live(
        &self,
        id: &SandboxId,
        request: &ExecRequest,
        live: Arc<dyn LiveOutput>,
    ) -> Result<ExecOutput, Error> {
        let _ = live;
        self.exec(id, request).await
    }
    /// Unpack a tar archive of at most [`MAX_ARCHIVE_BYTES`] into the working directory
    /// (paths checked: relative, no `..`, no links pointing outside; nothing is written when
    /// an entry is refused). Used to stage a run's files before its first command.
    async fn put_files(&self, id: &SandboxId, tar: Vec<u8>) -> Result<(), Error>;
    /// A tar archive of `path`, relative to the working directory (`.` for all of it, as at
    /// the end of a run); entries are named relative to the working directory. Packing stops,
    /// with [`Error::Refused`], as soon as the archive would grow past `max_bytes` (or
    /// [`MAX_ARCHIVE_BYTES`] when that is smaller), so no more is ever held in memory.
    /// Set-uid, set-gid and sticky bits are cleared; symbolic links that lead outside the
    /// working directory are left out (asked for by name, refused).
    async fn get_files(
        &self,
        id: &SandboxId,
        path: &str,
        max_bytes: usize,
    ) -> Result<Vec<u8>, Error>;
    /// Every entry of the working directory that [`Sandbox::get_files`] would archive
    /// (regular files, directories, symbolic links), with its type and permission bits, size
    /// and modification time but not its contents: what a snapshot compares with the last
    /// one, to read again only what changed. This default reads an archive of the whole
    /// working directory and keeps its headers (times to the second); backends that see the
    /// working directory on the host walk it instead.
    async fn list_files(&self, id: &SandboxId) -> Result<Vec<crate::snapshot::FileStat>, Error> {
        let tar = self.get_files(id, "", MAX_ARCHIVE_BYTES).await?;
        crate::snapshot::archive::read_archive(&tar, &|_| false)
            .map(|(stats, _)| stats)
            .map_err(Error::Failed)
    }
    /// What changed in the working directory since the last call for this sandbox, as
    /// [`Sandbox::list_files`] would list it: the entries that may have changed and the paths
    /// gone, or [`Changes::Unknown`](crate::snapshot::Changes::Unknown) when the backend cannot
    /// tell (the first call, after a restart of the process, after it lost track), or
    /// [`Changes::Listed`](crate::snapshot::Changes::Listed), the whole listing, when it
    /// cannot tell but listed the directory anyway (saving the engine a second call). Every
    /// call drains what the backend gathered: only one caller (the engine's snapshot) may
    /// ask. This default never tells; backends that see the working directory on the host
    /// watch it.
    async fn changes(&self, id: &SandboxId) -> Result<crate::snapshot::Changes, Error> {
        let _ = id;
        Ok(crate::snapshot::Changes::Unknown)
    }
    /// Remove the sandbox; removing one that is gone is fine.
    async fn destroy(&self, id: &SandboxId) -> Result<(), Error>;
    /// The run will not use its sandbox for a while (it waits for a message): a backend that
    /// keeps processes for a sandbox between commands ends them now. The working directory
    /// and what the sandbox was created with stay; the next [`Sandbox::exec`] starts what it
    /// needs again. Suspending a sandbox that is gone, or has nothing running, is fine. The
    /// default does nothing.
    async fn suspend(&self, id: &SandboxId) -> Result<(), Error> {
        let _ = id;
        Ok(())
    }
    /// Whether this backend runs a sandbox in the image its spec names
    /// ([`SandboxSpec::image`]). Backends that cannot (they run commands on the host's file
    /// system) answer `false`, the default, and a run naming `spec.image` is refused when it
    /// is created rather than run somewhere else.
    fn supports_image(&self) -> bool {
        false
    }
    /// The content digest the image `reference` names now, for [`SandboxSpec::image`]: a
    /// sandbox created with the answer runs that image whatever the reference's tag points to
    /// later, so that runs created together run the same thing. A backend that runs images
    /// answers with an immutable reference (the Docker backend: `name@sha256:…` for an image
    /// that came from a registry, else the image's ID `sha256:…`), fetching an image it does
    /// not have first, and [`Error::Refused`] for one it cannot get. A backend that runs no
    /// images ([`Sandbox::supports_image`] is `false`) has nothing to pin and answers the
    /// reference as it is, the default.
    async fn resolve_image(&self, reference: &str) -> Result<String, Error> {
        Ok(reference.to_owned())
    }
    /// Whether this backend can give a sandbox GPUs (an AgentEnvironment's
    /// `compute.nvidia.com/gpu`). Backends that cannot answer `false`, the default, and a run
    /// asking for one is refused when it is created.
    fn supports_gpu(&self) -> bool {
        false
    }
    /// Whether this backend can give a sandbox the egress proxy as its only way out
    /// ([`SandboxSpec::egress`]). Backends that cannot answer `false`, the default, and a run
    /// whose environment asks for an allowlist is refused when it is created.
    fn supports_egress(&self) -> bool {
        false
    }
}

/// The egress proxy as a sandbox backend sees it: it serves one sandbox's connections on a
/// Unix socket the backend names, under the sandbox's allowlist, until it is closed. The
/// server implements it; a backend that [`Sandbox::supports_egress`] holds one and bridges
/// the sandbox's proxy address to the socket.
pub trait EgressGate: Send + Sync + fmt::Debug {
    /// Serves the connections of sandbox `key` under `network` on a Unix socket made at
    /// `socket` (what was there is replaced; a sandbox opened again keeps its records).
    /// `headers` are those `network.inject` adds, with their values.
    fn open(
        &self,
        key: &str,
        network: &NetworkSpec,
        headers: &[InjectedHeader],
        socket: &std::path::Path,
    ) -> Result<(), Error>;
    /// The certificate (PEM) of the authority the proxy signs the certificates it shows for
    /// hosts with injected headers: a sandbox that goes out through the proxy trusts it.
    /// `None`: the proxy terminates no TLS.
    fn ca_certificate(&self) -> Option<String> {
        None
    }
    /// Stops serving sandbox `key` (its open connections end); closing one that is not open
    /// is fine.
    fn close(&self, key: &str);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_is_bounded_by_the_sandbox_limits() {
        let limits = Limits {
            command_timeout_secs: 10,
            output_cap_bytes: 100,
            ..Limits::default()
        };
        let request = |timeout, output_cap| ExecRequest {
            command: "true".to_owned(),
            timeout: Duration::from_secs(timeout),
            cwd: Some("sub".to_owned()),
            output_cap,
        };
        let bounded = |r: ExecRequest| r.within(&limits).expect("a short command");
        assert_eq!(bounded(request(5, 50)), request(5, 50));
        assert_eq!(bounded(request(60, 50)), request(10, 50));
        assert_eq!(bounded(request(5, 1 << 20)), request(5, 100));
        assert_eq!(bounded(request(60, 1 << 20)), request(10, 100));
    }

    #[test]
    fn a_command_longer_than_a_shell_argument_may_be_is_refused() {
        let request = |length| ExecRequest {
            command: "x".repeat(length),
            timeout: Duration::from_secs(1),
            cwd: None,
            output_cap: 1,
        };
        let longest = request(MAX_COMMAND_BYTES);
        assert_eq!(longest.within(&Limits::default()).expect("fits"), longest);
        match request(MAX_COMMAND_BYTES + 1).within(&Limits::default()) {
            Err(Error::Refused(message)) => {
                assert!(message.contains("131072 bytes long"), "{message}");
                assert!(message.contains("at most 131071"), "{message}");
            }
            other => panic!("expected a refusal, got {other:?}"),
        }
    }
}

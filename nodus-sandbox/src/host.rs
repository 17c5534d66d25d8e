//! The process backend's configuration and the host layout both of its starters (bubblewrap
//! and Nodus's launcher) share: where the working directories live and who owns them, the
//! system directories bound read-only, a sandbox's environment. A leaf: it imports neither
//! starter.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::fs;
use std::io::{self, Seek, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use nodus_core::sandbox::{EgressGate, Error};

/// Where the working directory appears inside the sandbox.
pub const WORKDIR: &str = "/work";

/// `PATH` inside the sandbox.
pub(crate) const SANDBOX_PATH: &str =
    "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// The host's system directories that are bound read-only (or re-created as the same
/// symbolic links) when they exist.
pub(crate) const SYSTEM_DIRS: &[&str] = &[
    "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc",
];

/// The host user sandboxes run as under a root server unless configured otherwise: 65534,
/// `nobody` and `nogroup` on Debian and most distributions.
pub const DEFAULT_SANDBOX_USER: HostUser = HostUser {
    uid: 65534,
    gid: 65534,
};

/// The free space the file system of the working directories keeps by default: 256 MiB.
pub const DEFAULT_DISK_RESERVE_BYTES: u64 = 256 << 20;

/// A host user id and group id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostUser {
    /// The user id.
    pub uid: u32,
    /// The group id (the only group: supplementary groups are cleared).
    pub gid: u32,
}

/// How many emptied cgroups a hierarchy keeps for reuse by default
/// ([`BwrapConfig::cgroup_pool`]).
pub const DEFAULT_CGROUP_POOL: usize = 32;

/// How many empty network namespaces the resident launcher keeps for the next sandboxes
/// without network, by default ([`BwrapConfig::netns_pool`]).
pub const DEFAULT_NETNS_POOL: usize = 32;

/// Whether to enforce limits through cgroups.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum CgroupUse {
    /// Cgroups wherever the host allows, rlimits for the rest.
    #[default]
    Auto,
    /// Rlimits only.
    Never,
}

/// How the process backend works on this host.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct BwrapConfig {
    /// The directory that holds the working directories (`root/sandboxes/<key>`). Keep it
    /// outside the directories bound into sandboxes; with [`BwrapConfig::run_as`] every
    /// ancestor must be searchable by that user.
    pub root: PathBuf,
    /// The `bwrap` binary; searched in `PATH` when `None`.
    pub bwrap: Option<PathBuf>,
    /// Nodus's own sandbox launcher (the `nodus` binary, or `nodus-sandbox-launch`; see
    /// [`nodus_launch`]) to start sandboxes with instead of bubblewrap. When `None`, or when
    /// it fails its self-check on this host at the first [`Sandbox::create`], sandboxes start
    /// with bubblewrap; the log says once which.
    pub launcher: Option<PathBuf>,
    /// With [`BwrapConfig::launcher`]: whether a resident launcher forks each sandbox's
    /// first process (started once, after the launcher's self-check) instead of the launcher
    /// being spawned for each sandbox, which costs a program start (`execve`, the dynamic
    /// loader, the C library's start-up) every time. On by default.
    pub resident_launcher: bool,
    /// With [`BwrapConfig::resident_launcher`], on a root server (the launcher runs as root of
    /// the initial user namespace): how many empty network namespaces it keeps for the next
    /// sandboxes without network, instead of each sandbox making one and the kernel tearing
    /// it down after (the dearest single step of a sandbox). A namespace is taken back only
    /// once every process that was in it is gone; it belongs to the initial user namespace,
    /// so that no sandbox can configure anything in it (see docs/operations.md). 0 turns the
    /// pool off; elsewhere it is off anyway.
    pub netns_pool: usize,
    /// Whether limits go through cgroups.
    pub cgroups: CgroupUse,
    /// The parent cgroup of the sandboxes' cgroups, in each hierarchy.
    pub cgroup_parent: String,
    /// How many emptied cgroups each cgroup v1 hierarchy keeps for the next sandboxes
    /// (renamed and given the new sandbox's limits instead of made and removed; see the
    /// `cgroup` module); 0 makes and removes every one.
    pub cgroup_pool: usize,
    /// More host directories to bind read-only at the same path (toolchains under `/opt`).
    /// The sandboxes read in them what [`BwrapConfig::run_as`] may read.
    pub extra_ro_binds: Vec<PathBuf>,
    /// The host user and group that commands run as (on cgroup v2 through `setpriv`, which
    /// must then be installed), or `None` for the server's own user. The server must be root
    /// to use it.
    pub run_as: Option<HostUser>,
    /// The free bytes the file system of [`BwrapConfig::root`] keeps: a command that lets it
    /// drop below is stopped, so that the store, when it shares that file system, can still
    /// write.
    pub disk_reserve_bytes: u64,
    /// The egress proxy, for sandboxes whose only way out it is ([`SandboxSpec::egress`]):
    /// with the launcher only, which bridges the sandbox's `127.0.0.1:3128` to the proxy's
    /// socket for it (`root/egress/<key>.sock`). `None`: such sandboxes are refused.
    pub egress: Option<Arc<dyn EgressGate>>,
}

impl BwrapConfig {
    /// Working directories under `root`, `bwrap` from `PATH`, cgroups where possible under
    /// `nodus` with a pool of [`DEFAULT_CGROUP_POOL`], nothing bound beyond the defaults, [`DEFAULT_SANDBOX_USER`] when this process
    /// runs as root (its own user otherwise), [`DEFAULT_DISK_RESERVE_BYTES`] kept free.
    pub fn new(root: PathBuf) -> Self {
        BwrapConfig {
            root,
            bwrap: None,
            launcher: None,
            resident_launcher: true,
            netns_pool: DEFAULT_NETNS_POOL,
            cgroups: CgroupUse::Auto,
            cgroup_parent: "nodus".to_owned(),
            cgroup_pool: DEFAULT_CGROUP_POOL,
            extra_ro_binds: Vec::new(),
            run_as: rustix::process::getuid()
                .is_root()
                .then_some(DEFAULT_SANDBOX_USER),
            disk_reserve_bytes: DEFAULT_DISK_RESERVE_BYTES,
            egress: None,
        }
    }
}

/// Makes the directory of the working directories and checks that the sandboxes' user can
/// reach it.
pub(crate) fn prepare_root(config: &BwrapConfig) -> Result<(), Error> {
    let failed = |what: &str, e: io::Error| Error::Failed(format!("{what}: {e}"));
    let sandboxes = config.root.join("sandboxes");
    let shown = sandboxes.display();
    // Searchable by the sandboxes' user, listable by root only.
    let mode = if config.run_as.is_some() {
        0o711
    } else {
        0o700
    };
    fs::DirBuilder::new()
        .recursive(true)
        .mode(mode)
        .create(&sandboxes)
        .map_err(|e| failed(&format!("creating {shown}"), e))?;
    fs::set_permissions(&sandboxes, fs::Permissions::from_mode(mode))
        .map_err(|e| failed(&format!("setting the mode of {shown}"), e))?;
    if let Some(user) = config.run_as {
        check_reachable(&sandboxes, user)?;
    }
    Ok(())
}

/// Refuses a directory that `user` cannot reach: bubblewrap, running as `user`, resolves the
/// working directories' paths, so every directory on the way must be searchable by it.
pub(crate) fn check_reachable(dir: &Path, user: HostUser) -> Result<(), Error> {
    let real = dir
        .canonicalize()
        .map_err(|e| Error::Failed(format!("resolving {}: {e}", dir.display())))?;
    for ancestor in real.ancestors() {
        let meta = fs::metadata(ancestor)
            .map_err(|e| Error::Failed(format!("reading {}: {e}", ancestor.display())))?;
        let mode = meta.permissions().mode();
        let searchable = mode & 0o001 != 0
            || (meta.uid() == user.uid && mode & 0o100 != 0)
            || (meta.gid() == user.gid && mode & 0o010 != 0);
        if !searchable {
            return Err(Error::Refused(format!(
                "the sandboxes' working directories must be under a directory that their user \
                 {}:{} can reach, and {} (mode {:o}, owner {}) is not searchable by it: choose \
                 a sandbox directory outside it, or allow it with `chmod o+x {}`",
                user.uid,
                user.gid,
                ancestor.display(),
                mode & 0o7777,
                meta.uid(),
                ancestor.display()
            )));
        }
    }
    Ok(())
}

/// Makes `user` the owner of `dir` and everything below it (never following links), as
/// after files were unpacked there as root.
pub(crate) fn give_to(dir: &Path, user: HostUser) -> Result<(), Error> {
    let mut stack = vec![dir.to_path_buf()];
    while let Some(path) = stack.pop() {
        let meta = fs::symlink_metadata(&path)
            .map_err(|e| Error::Failed(format!("reading {}: {e}", path.display())))?;
        if meta.uid() != user.uid || meta.gid() != user.gid {
            std::os::unix::fs::lchown(&path, Some(user.uid), Some(user.gid)).map_err(|e| {
                Error::Failed(format!("giving {} to the sandbox: {e}", path.display()))
            })?;
        }
        if meta.is_dir() {
            let children = fs::read_dir(&path)
                .map_err(|e| Error::Failed(format!("reading {}: {e}", path.display())))?;
            stack.extend(children.flatten().map(|child| child.path()));
        }
    }
    Ok(())
}

/// A file that reads `data` from its start, for a child's standard input (a memfd: nothing
/// on disk).
pub(crate) fn input_file(data: &[u8], what: &str) -> Result<fs::File, Error> {
    let fd = rustix::fs::memfd_create("nodus-sandbox-input", rustix::fs::MemfdFlags::CLOEXEC)
        .map_err(|e| Error::Failed(format!("making {what}: {e}")))?;
    let mut file = fs::File::from(fd);
    file.write_all(data)
        .and_then(|()| file.seek(io::SeekFrom::Start(0)).map(drop))
        .map_err(|e| Error::Failed(format!("writing {what}: {e}")))?;
    Ok(file)
}

/// The environment of a sandbox's shell: `PATH`, `HOME` and `LANG`, then the sandbox's own
/// (which may replace them).
pub(crate) fn sandbox_env(env: &BTreeMap<String, String>) -> Vec<(OsString, OsString)> {
    let mut all: BTreeMap<&str, &str> = [
        ("PATH", SANDBOX_PATH),
        ("HOME", WORKDIR),
        ("LANG", "C.UTF-8"),
    ]
    .into_iter()
    .collect();
    all.extend(env.iter().map(|(k, v)| (k.as_str(), v.as_str())));
    all.into_iter().map(|(k, v)| (k.into(), v.into())).collect()
}

//! The process backend: each command runs in a fresh [bubblewrap] sandbox over the run's
//! working directory.
//!
//! A command gets new user, pid, ipc, uts, cgroup and network namespaces (the network only when
//! the spec allows it), all capabilities dropped, no further user namespaces, a new session,
//! and `--die-with-parent`. Its file system is a read-only tmpfs root with:
//! - the host's system directories read-only (`/usr`, `/bin`, `/sbin`, `/lib*`, `/etc`, and
//!   what [`BwrapConfig::extra_ro_binds`] adds);
//! - fresh `/proc` and `/dev`, a private `/tmp` (a tmpfs no larger than the memory limit);
//! - the sandbox's working directory at [`WORKDIR`], the only writable place that outlives
//!   the command.
//!
//! Nothing else of the host is there: not the other sandboxes' directories, not the server's
//! files, not `/home`, `/root` or `/var`.
//!
//! Host user: a server running as root runs every sandbox as an unprivileged host user and
//! group ([`BwrapConfig::run_as`], by default [`DEFAULT_SANDBOX_USER`], 65534 `nobody` /
//! `nogroup`), dropping to it with util-linux `setpriv` as the last step before bubblewrap. So
//! file permissions keep host secrets out: what that user may not read on the host (`/etc/shadow`,
//! a 0600 root file anywhere under the bound directories, whenever it was made) it cannot read
//! in a sandbox either. Bubblewrap resolves the working directory's host path as that user, so
//! every ancestor of [`BwrapConfig::root`] must be searchable by it (a directory under `/root`
//! is not): [`Sandbox::create`] refuses, naming the directory, when one is not. Each working
//! directory is owned by that user, mode 0700; the directory that holds them is root's, 0711.
//! A server that is not root runs sandboxes as its own user (bubblewrap maps it in a user
//! namespace); its own files are then the ones to keep out of the bound directories.
//!
//! What a command can see of how it was started holds no host path: bubblewrap reads its
//! arguments from the command's standard input (`--args 0`, so `/proc/1/cmdline` is
//! `bwrap --args 0`), starts in `/` with an empty environment, and the working directory's
//! host path, which `/proc/self/mountinfo` shows, is `<root>/sandboxes/<key>`. Commands then
//! get `/dev/null` as standard input.
//!
//! Disk: a command's single files are limited to [`Limits::disk_bytes`] (`ulimit -f`), and a
//! watchdog measures the working directory while the command runs: when it grew past
//! [`Limits::disk_bytes`], or the file system of the working directories has less free space
//! than [`BwrapConfig::disk_reserve_bytes`], the command is killed and
//! [`ExecOutput::stopped`] says why (see the `disk` module).
//!
//! Limits: memory (without swap), processes and CPU go through cgroups where the host lets
//! this process manage them (v1 or v2); a command is moved into its
//! sandbox's cgroups before it starts. A limit that no cgroup enforces falls back to an rlimit
//! set inside the sandbox before the command runs (`ulimit -u` or `-p` for processes, counted per
//! sandbox thanks to its user namespace; `ulimit -v` for memory); CPU then has no limit but the
//! timeout. A server running as root without a pids cgroup is refused a sandbox: there
//! RLIMIT_NPROC would count every root process of the host. The command timeout and the
//! output cap hold everywhere.
//!
//! Layout: the sandbox with key `k` is the directory `root/sandboxes/k` and has the id `k`; it
//! outlives the server, so after a restart `create` with the same key works over the same
//! files. As with the unisolated backend, the environment and limits of a sandbox live in
//! memory: after a restart, `create` comes before `exec`.
//!
//! When the command's shell exits the sandbox's pid namespace ends, which kills whatever it
//! left running; a timeout, or dropping the `exec` future, kills bubblewrap and with it the
//! whole namespace. Bubblewrap reports a command ended by a signal as exit code 128 + the
//! signal's number.
//!
//! Requires bubblewrap 0.8 or later and user namespaces. When `bwrap` is missing, `create`
//! refuses with a message that says how to install it.
//!
//! [bubblewrap]: https://github.com/containers/bubblewrap

use std::collections::{BTreeMap, HashMap};
use std::ffi::OsString;
use std::fs;
use std::io;
use std::io::{Seek, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use nodus_core::Sandbox;
use nodus_core::sandbox::{
    Error, ExecOutput, ExecRequest, Limits, SandboxId, SandboxInfo, SandboxSpec,
};
use tokio::process::Command;
use tokio::sync::OnceCell;
use tracing::{debug, info};

use crate::cgroup::Cgroups;
use crate::disk::Watch;
use crate::workdir::{blocking, canonical_dir, check_env, inside_dir, remove_tree};
use crate::{archive, paths, process};

/// Where the working directory appears inside the sandbox.
pub const WORKDIR: &str = "/work";

/// `PATH` inside the sandbox.
const SANDBOX_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// The host's system directories that are bound read-only (or re-created as the same
/// symbolic links) when they exist.
const SYSTEM_DIRS: &[&str] = &[
    "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc",
];

/// The cgroup gate: `$1` files to write `0` into (moving the shell itself into the sandbox's
/// cgroups), then the program to become. A file it cannot write ends it with [`GATE_FAILED`]
/// and a line that starts with [`GATE_MESSAGE`].
const GATE: &str = "n=$1; shift; while [ \"$n\" -gt 0 ]; do \
    echo 0 2>/dev/null > \"$1\" || { echo \"nodus-sandbox: cannot join the cgroup $1\" >&2; exit 125; }; \
    shift; n=$((n - 1)); done; exec \"$@\"";

/// The exit status of a gate that could not join a cgroup.
const GATE_FAILED: i32 = 125;

/// How the gate's own failure message starts.
const GATE_MESSAGE: &[u8] = b"nodus-sandbox: cannot join the cgroup ";

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

/// What to tell an operator whose host has no `bwrap`.
const INSTALL_HINT: &str = "install bubblewrap: `apt-get install bubblewrap` (Debian, Ubuntu), \
     `dnf install bubblewrap` (Fedora) or `apk add bubblewrap` (Alpine); or ask for the \
     unisolated mode by name";

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
pub struct BwrapConfig {
    /// The directory that holds the working directories (`root/sandboxes/<key>`). Keep it
    /// outside the directories bound into sandboxes; with [`BwrapConfig::run_as`] every
    /// ancestor must be searchable by that user.
    pub root: PathBuf,
    /// The `bwrap` binary; searched in `PATH` when `None`.
    pub bwrap: Option<PathBuf>,
    /// Whether limits go through cgroups.
    pub cgroups: CgroupUse,
    /// The parent cgroup of the sandboxes' cgroups, in each hierarchy.
    pub cgroup_parent: String,
    /// More host directories to bind read-only at the same path (toolchains under `/opt`).
    /// The sandboxes read in them what [`BwrapConfig::run_as`] may read.
    pub extra_ro_binds: Vec<PathBuf>,
    /// The host user and group that commands run as (through `setpriv`, which must be
    /// installed), or `None` for the server's own user. The server must be root to use it.
    pub run_as: Option<HostUser>,
    /// The free bytes the file system of [`BwrapConfig::root`] keeps: a command that lets it
    /// drop below is stopped, so that the store, when it shares that file system, can still
    /// write.
    pub disk_reserve_bytes: u64,
}

impl BwrapConfig {
    /// Working directories under `root`, `bwrap` from `PATH`, cgroups where possible under
    /// `nodus`, nothing bound beyond the defaults, [`DEFAULT_SANDBOX_USER`] when this process
    /// runs as root (its own user otherwise), [`DEFAULT_DISK_RESERVE_BYTES`] kept free.
    pub fn new(root: PathBuf) -> Self {
        BwrapConfig {
            root,
            bwrap: None,
            cgroups: CgroupUse::Auto,
            cgroup_parent: "nodus".to_owned(),
            extra_ro_binds: Vec::new(),
            run_as: rustix::process::getuid()
                .is_root()
                .then_some(DEFAULT_SANDBOX_USER),
            disk_reserve_bytes: DEFAULT_DISK_RESERVE_BYTES,
        }
    }
}

/// What a sandbox was created with.
#[derive(Debug, Clone)]
struct Created {
    env: BTreeMap<String, String>,
    limits: Limits,
    network: bool,
}

/// What every command needs, found once: how to start bubblewrap and the arguments that lay
/// out the sandbox's file system.
#[derive(Debug)]
struct Prepared {
    bwrap: PathBuf,
    /// The program and its arguments up to and including `bwrap`: `setpriv … bwrap` when
    /// commands run as another user, `bwrap` alone otherwise.
    launcher: Vec<OsString>,
    base_args: Vec<OsString>,
}

/// Sandboxes that run each command under bubblewrap. See the [module docs](self).
#[derive(Debug)]
pub struct BwrapSandbox {
    config: BwrapConfig,
    cgroups: Cgroups,
    prepared: OnceCell<Prepared>,
    created: Mutex<HashMap<String, Created>>,
}

impl BwrapSandbox {
    /// A backend with this configuration. Finds the host's cgroup controllers now (and
    /// creates the parent cgroups); `bwrap` itself is looked for and tried on the first
    /// [`Sandbox::create`].
    pub fn new(config: BwrapConfig) -> Self {
        let cgroups = match config.cgroups {
            CgroupUse::Auto => Cgroups::detect(&config.cgroup_parent),
            CgroupUse::Never => Cgroups::none(),
        };
        let enforced = cgroups.enforced();
        info!(
            root = %config.root.display(),
            memory = enforced.memory,
            pids = enforced.pids,
            cpu = enforced.cpu,
            "bubblewrap sandboxes (limits not enforced by cgroups fall back to rlimits)"
        );
        BwrapSandbox {
            config,
            cgroups,
            prepared: OnceCell::new(),
            created: Mutex::new(HashMap::new()),
        }
    }

    /// Which limits hold: those cgroups enforce, and what stands in for the others (one
    /// sentence, for the server to say at start).
    pub fn limits(&self) -> String {
        self.cgroups.summary()
    }

    /// The host directory of a sandbox, for an id this backend could have issued.
    fn dir_of(&self, id: &SandboxId) -> Result<PathBuf, Error> {
        paths::check_key(&id.0).map_err(|_| Error::NotFound(id.clone()))?;
        Ok(self.config.root.join("sandboxes").join(&id.0))
    }

    async fn existing_dir(&self, id: &SandboxId) -> Result<PathBuf, Error> {
        let dir = self.dir_of(id)?;
        let id = id.clone();
        blocking(move || canonical_dir(&dir, &id)).await
    }

    fn created(&self) -> std::sync::MutexGuard<'_, HashMap<String, Created>> {
        // The map stays consistent even if a holder panicked: each access is one call.
        self.created.lock().unwrap_or_else(PoisonError::into_inner)
    }

    async fn prepared(&self) -> Result<&Prepared, Error> {
        self.prepared
            .get_or_try_init(|| async {
                let config = self.config.clone();
                let memory = Limits::default().memory_bytes;
                let prepared = blocking(move || prepare(&config)).await?;
                probe(&prepared, memory).await?;
                Ok(prepared)
            })
            .await
    }
}

#[async_trait]
impl Sandbox for BwrapSandbox {
    async fn create(&self, spec: &SandboxSpec) -> Result<SandboxInfo, Error> {
        paths::check_key(&spec.key).map_err(Error::Refused)?;
        check_env(&spec.env)?;
        if !self.cgroups.enforced().pids && rustix::process::getuid().is_root() {
            // RLIMIT_NPROC counts every process of the user, and root runs the whole host:
            // the fallback would leave the sandbox unable to start anything at all, or, unset,
            // leave a fork bomb uncontained. Refuse instead of pretending.
            return Err(Error::Refused(
                "no pids cgroup is available to limit this sandbox's processes, and the server \
                 runs as root, where an rlimit cannot do it: give the server a pids cgroup \
                 (cgroup v1 `pids` or v2 with the pids controller) or run it as an \
                 unprivileged user"
                    .to_string(),
            ));
        }
        self.prepared().await?;
        let dir = self.config.root.join("sandboxes").join(&spec.key);
        let cgroups = self.cgroups.clone();
        let (key, limits, user) = (spec.key.clone(), spec.limits, self.config.run_as);
        blocking(move || {
            let failed = |e: io::Error| {
                Error::Failed(format!("creating the sandbox's working directory: {e}"))
            };
            fs::create_dir_all(&dir).map_err(failed)?;
            if let Some(user) = user {
                std::os::unix::fs::lchown(&dir, Some(user.uid), Some(user.gid)).map_err(failed)?;
                fs::set_permissions(&dir, fs::Permissions::from_mode(0o700)).map_err(failed)?;
            }
            cgroups.create(&key, &limits)
        })
        .await?;
        self.created().insert(
            spec.key.clone(),
            Created {
                env: spec.env.clone(),
                limits: spec.limits,
                network: spec.network,
            },
        );
        debug!(key = %spec.key, "bubblewrap sandbox ready");
        Ok(SandboxInfo {
            id: SandboxId(spec.key.clone()),
            isolated: true,
        })
    }

    async fn exec(&self, id: &SandboxId, request: &ExecRequest) -> Result<ExecOutput, Error> {
        let dir = self.dir_of(id)?;
        let created = self
            .created()
            .get(&id.0)
            .cloned()
            .ok_or_else(|| Error::NotFound(id.clone()))?;
        let prepared = self.prepared().await?;
        let request = request.within(&created.limits)?;
        let shown_cwd = request.cwd.clone().unwrap_or_default();
        let rel = paths::relative(Path::new(&shown_cwd))
            .map_err(|why| Error::Refused(format!("working directory {shown_cwd:?} {why}")))?;
        let owned_id = id.clone();
        let (home, cwd) = blocking(move || {
            let home = canonical_dir(&dir, &owned_id)?;
            let cwd = inside_dir(&home, &rel, &shown_cwd)?;
            let inner = cwd.strip_prefix(&home).unwrap_or(Path::new(""));
            let inside = if inner.as_os_str().is_empty() {
                PathBuf::from(WORKDIR)
            } else {
                Path::new(WORKDIR).join(inner)
            };
            Ok((home, inside))
        })
        .await?;

        let mut args = prepared.base_args.clone();
        let mut push = |items: &[&std::ffi::OsStr]| args.extend(items.iter().map(OsString::from));
        if created.network {
            push(&["--share-net".as_ref()]);
        }
        let tmp_size = created.limits.memory_bytes.to_string();
        push(&[
            "--size".as_ref(),
            tmp_size.as_ref(),
            "--tmpfs".as_ref(),
            "/tmp".as_ref(),
            "--bind".as_ref(),
            home.as_os_str(),
            WORKDIR.as_ref(),
            "--remount-ro".as_ref(),
            "/".as_ref(),
            "--clearenv".as_ref(),
            "--setenv".as_ref(),
            "PATH".as_ref(),
            SANDBOX_PATH.as_ref(),
            "--setenv".as_ref(),
            "HOME".as_ref(),
            WORKDIR.as_ref(),
            "--setenv".as_ref(),
            "LANG".as_ref(),
            "C.UTF-8".as_ref(),
        ]);
        for (name, value) in &created.env {
            push(&["--setenv".as_ref(), name.as_ref(), value.as_ref()]);
        }
        push(&["--chdir".as_ref(), cwd.as_os_str()]);
        // Bubblewrap read its arguments from standard input and closed it: the command gets
        // /dev/null instead. Then the limits, then the command exactly as given.
        let enforced = self.cgroups.enforced();
        let mut prelude = vec!["exec </dev/null".to_owned()];
        if !enforced.pids {
            // `-u` in bash and busybox, `-p` in dash.
            let n = created.limits.processes;
            prelude.push(format!("{{ ulimit -u {n} 2>/dev/null || ulimit -p {n}; }}"));
        }
        if !enforced.memory {
            prelude.push(format!("ulimit -v {}", created.limits.memory_bytes / 1024));
        }
        // In blocks of 512 bytes, as `sh` counts them.
        prelude.push(format!("ulimit -f {}", created.limits.disk_bytes / 512));
        let script = format!("{} && exec /bin/sh -c \"$1\"", prelude.join(" && "));
        let shell: [OsString; 5] = [
            "/bin/sh".into(),
            "-c".into(),
            script.into(),
            "sh".into(),
            request.command.clone().into(),
        ];

        let entry_files = self.cgroups.entry_files(&id.0);
        let mut command = launch(prepared, &entry_files, &args, &shell)?;
        command
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true);
        let watch = Watch {
            dir: home,
            limit: created.limits.disk_bytes,
            reserve: self.config.disk_reserve_bytes,
        };
        let out = process::run(command, request.timeout, request.output_cap, Some(watch)).await?;
        if out.exit_code == Some(GATE_FAILED) && out.stderr.bytes.starts_with(GATE_MESSAGE) {
            return Err(Error::Failed(
                String::from_utf8_lossy(&out.stderr.bytes).trim().to_owned(),
            ));
        }
        Ok(out)
    }

    async fn put_files(&self, id: &SandboxId, tar: Vec<u8>) -> Result<(), Error> {
        let dir = self.existing_dir(id).await?;
        let user = self.config.run_as;
        blocking(move || {
            archive::unpack(&tar, &dir)?;
            match user {
                Some(user) => give_to(&dir, user),
                None => Ok(()),
            }
        })
        .await
    }

    async fn get_files(
        &self,
        id: &SandboxId,
        path: &str,
        max_bytes: usize,
    ) -> Result<Vec<u8>, Error> {
        let dir = self.existing_dir(id).await?;
        let rel = paths::relative(Path::new(path))
            .map_err(|why| Error::Refused(format!("path {path:?} {why}")))?;
        let shown = path.to_owned();
        blocking(move || archive::pack(&dir, &rel, &shown, max_bytes)).await
    }

    async fn destroy(&self, id: &SandboxId) -> Result<(), Error> {
        // An id this backend cannot have issued names no sandbox: nothing to remove.
        let Ok(dir) = self.dir_of(id) else {
            return Ok(());
        };
        self.created().remove(&id.0);
        let cgroups = self.cgroups.clone();
        let key = id.0.clone();
        blocking(move || {
            remove_tree(&dir)?;
            cgroups.remove(&key);
            Ok(())
        })
        .await
    }
}

/// Finds `bwrap` (and `setpriv`), makes the directory of the working directories, checks that
/// the sandboxes' user can reach it, and lays out the file system arguments.
fn prepare(config: &BwrapConfig) -> Result<Prepared, Error> {
    let bwrap = match &config.bwrap {
        Some(path) if path.is_file() => path.clone(),
        Some(path) => {
            return Err(Error::Refused(format!(
                "bubblewrap is not installed (no {}): {INSTALL_HINT}",
                path.display()
            )));
        }
        None => find_in_path("bwrap").ok_or_else(|| {
            Error::Refused(format!(
                "bubblewrap is not installed (no `bwrap` in PATH): {INSTALL_HINT}"
            ))
        })?,
    };
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
    let mut launcher = Vec::new();
    if let Some(user) = config.run_as {
        check_reachable(&sandboxes, user)?;
        let setpriv = find_in_path("setpriv").ok_or_else(|| {
            Error::Refused(format!(
                "`setpriv` (util-linux) is not installed, and a server running as root needs it \
                 to run sandboxes as the user {}:{}: `apt-get install util-linux` (Debian, \
                 Ubuntu), `dnf install util-linux` (Fedora) or `apk add setpriv` (Alpine)",
                user.uid, user.gid
            ))
        })?;
        launcher.extend([
            setpriv.into_os_string(),
            "--reuid".into(),
            user.uid.to_string().into(),
            "--regid".into(),
            user.gid.to_string().into(),
            "--clear-groups".into(),
        ]);
    }
    launcher.push(bwrap.clone().into_os_string());

    let mut args: Vec<OsString> = [
        "--unshare-all",
        "--unshare-user",
        "--disable-userns",
        "--die-with-parent",
        "--new-session",
        "--cap-drop",
        "ALL",
        "--hostname",
        "nodus",
    ]
    .iter()
    .map(OsString::from)
    .collect();
    let system = SYSTEM_DIRS.iter().map(PathBuf::from);
    for path in system.chain(config.extra_ro_binds.iter().cloned()) {
        match fs::symlink_metadata(&path) {
            Ok(meta) if meta.file_type().is_symlink() => {
                if let Ok(target) = fs::read_link(&path) {
                    args.extend(["--symlink".into(), target.into(), path.clone().into()]);
                }
            }
            Ok(meta) if meta.is_dir() => {
                args.extend(["--ro-bind".into(), path.clone().into(), path.clone().into()]);
            }
            _ => {}
        }
    }
    args.extend(
        ["--proc", "/proc", "--dev", "/dev"]
            .iter()
            .map(OsString::from),
    );
    Ok(Prepared {
        bwrap,
        launcher,
        base_args: args,
    })
}

/// Refuses a directory that `user` cannot reach: bubblewrap, running as `user`, resolves the
/// working directories' paths, so every directory on the way must be searchable by it.
fn check_reachable(dir: &Path, user: HostUser) -> Result<(), Error> {
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
fn give_to(dir: &Path, user: HostUser) -> Result<(), Error> {
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

/// The command that starts bubblewrap with the options `args` and then `program`: through the
/// cgroup gate when there are `entry_files` to join, as the sandboxes' user when there is one,
/// in `/` with an empty environment, reading its options from standard input (`--args 0`) so
/// that none of them, host paths included, shows in the sandbox's `/proc/1/cmdline`; only
/// `program` (the shell and the command) does.
fn launch(
    prepared: &Prepared,
    entry_files: &[PathBuf],
    args: &[OsString],
    program: &[OsString],
) -> Result<Command, Error> {
    let mut data = Vec::new();
    for arg in args {
        let bytes = arg.as_encoded_bytes();
        if bytes.contains(&0) {
            return Err(Error::Refused(
                "cannot run this command: it contains a NUL byte".to_owned(),
            ));
        }
        data.extend_from_slice(bytes);
        data.push(0);
    }
    let fd = rustix::fs::memfd_create("nodus-bwrap-args", rustix::fs::MemfdFlags::CLOEXEC)
        .map_err(|e| Error::Failed(format!("making bubblewrap's arguments: {e}")))?;
    let mut file = fs::File::from(fd);
    file.write_all(&data)
        .and_then(|()| file.seek(io::SeekFrom::Start(0)).map(drop))
        .map_err(|e| Error::Failed(format!("writing bubblewrap's arguments: {e}")))?;
    let (first, rest) = prepared
        .launcher
        .split_first()
        .ok_or_else(|| Error::Failed("no bubblewrap to start".to_owned()))?;
    let mut command = if entry_files.is_empty() {
        let mut command = Command::new(first);
        command.args(rest);
        command
    } else {
        // A gate shell moves itself into the sandbox's cgroups, then becomes bubblewrap (as
        // the sandboxes' user), so every process of the sandbox starts inside them.
        let mut command = Command::new("/bin/sh");
        command
            .arg("-c")
            .arg(GATE)
            .arg("nodus-sandbox")
            .arg(entry_files.len().to_string())
            .args(entry_files)
            .arg(first)
            .args(rest);
        command
    };
    command
        .args(["--args", "0", "--"])
        .args(program)
        .stdin(Stdio::from(file))
        .current_dir("/")
        .env_clear();
    Ok(command)
}

/// Runs `true` in a sandbox laid out as every command's, so that a host where bubblewrap
/// cannot work says so at `create`, not as a command's failure.
async fn probe(prepared: &Prepared, memory: u64) -> Result<(), Error> {
    let mut args = prepared.base_args.clone();
    args.extend(
        [
            "--size",
            &memory.to_string(),
            "--tmpfs",
            "/tmp",
            "--remount-ro",
            "/",
        ]
        .iter()
        .map(OsString::from),
    );
    let shell = ["/bin/sh", "-c", "true"].map(OsString::from);
    let mut command = launch(prepared, &[], &args, &shell)?;
    command.kill_on_drop(true);
    let output = tokio::time::timeout(Duration::from_secs(30), command.output())
        .await
        .map_err(|_| Error::Failed("bubblewrap did not start a sandbox in 30 s".to_owned()))?
        .map_err(|e| {
            Error::Refused(format!(
                "cannot run bubblewrap ({}): {e}; {INSTALL_HINT}",
                prepared.bwrap.display()
            ))
        })?;
    if output.status.success() {
        Ok(())
    } else {
        Err(Error::Refused(format!(
            "bubblewrap ({}) cannot create a sandbox on this host (it needs version 0.8 or \
             later and user namespaces): {}",
            prepared.bwrap.display(),
            String::from_utf8_lossy(&output.stderr).trim()
        )))
    }
}

fn find_in_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_else(|| SANDBOX_PATH.into());
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
}

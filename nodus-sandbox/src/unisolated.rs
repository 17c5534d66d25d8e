//! The unisolated backend: a run's commands are ordinary local processes of the server's own
//! user, each sandbox only a directory. It gives **no isolation at all**.
//!
//! A command can read and write everything the server's user can, reach the network and stay
//! behind by leaving its process group (`setsid`); of the [`Limits`](nodus_core::sandbox::Limits)
//! only the per-command timeout and the output cap (both given in each [`ExecRequest`]) are
//! enforced, and `network: false` is ignored. It exists for the embedding example, for tests
//! and for an operator who asks for it by name on a machine where the model's commands are
//! trusted; it reports `isolated: false` from [`Sandbox::create`] so that callers can say so.
//!
//! Layout: the sandbox with key `k` is the directory `root/k`; its id is `k`. Creating it again
//! re-attaches to the same directory and keeps its files. The environment of each sandbox
//! lives in memory only, so after a restart `create` must be called before `exec` (which
//! otherwise answers [`Error::NotFound`]); file transfer and `destroy` need only the directory.
//!
//! Each command runs as `/bin/sh -c <command>` in its own process group with a cleared
//! environment (`PATH` from the server, `HOME` the working directory, `LANG=C.UTF-8`, then the
//! spec's variables) and no standard input. The whole group is killed with `SIGKILL` when the
//! command times out and also as soon as the shell exits, so background children do not
//! outlive their command.

use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use nodus_core::Sandbox;
use nodus_core::output::Output;
use nodus_core::sandbox::{Error, ExecOutput, ExecRequest, SandboxId, SandboxInfo, SandboxSpec};
use rustix::process::{Pid, Signal};
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::process::Command;
use tracing::{debug, warn};

use crate::{archive, paths};

/// `PATH` for commands when the server has none.
const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// How long output is still read after the shell has exited and its group was killed. Only
/// a process that left the group can hold a pipe open that long.
const DRAIN_GRACE: Duration = Duration::from_secs(1);

/// Size of one read from a command's stdout or stderr.
const READ_CHUNK: usize = 64 * 1024;

/// Sandboxes that are plain directories under `root`, with commands run as local processes
/// without any isolation. See the [module docs](self).
#[derive(Debug)]
pub struct UnisolatedSandbox {
    root: PathBuf,
    /// The environment of each sandbox created since this value was made, by id.
    envs: Mutex<HashMap<String, BTreeMap<String, String>>>,
}

impl UnisolatedSandbox {
    /// Sandboxes in directories under `root`, which is created when needed.
    pub fn new(root: PathBuf) -> Self {
        warn!(
            root = %root.display(),
            "unisolated sandboxes: commands run as local processes with no isolation"
        );
        UnisolatedSandbox {
            root,
            envs: Mutex::new(HashMap::new()),
        }
    }

    /// The directory of a sandbox, for an id this backend could have issued.
    fn dir_of(&self, id: &SandboxId) -> Result<PathBuf, Error> {
        paths::check_key(&id.0).map_err(|_| Error::NotFound(id.clone()))?;
        Ok(self.root.join(&id.0))
    }

    /// The canonical directory of an existing sandbox.
    async fn existing_dir(&self, id: &SandboxId) -> Result<PathBuf, Error> {
        let dir = self.dir_of(id)?;
        let id = id.clone();
        blocking(move || canonical_dir(&dir, &id)).await
    }

    fn envs(&self) -> std::sync::MutexGuard<'_, HashMap<String, BTreeMap<String, String>>> {
        // The map stays consistent even if a holder panicked: each access is one call.
        self.envs.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[async_trait]
impl Sandbox for UnisolatedSandbox {
    async fn create(&self, spec: &SandboxSpec) -> Result<SandboxInfo, Error> {
        paths::check_key(&spec.key).map_err(Error::Refused)?;
        check_env(&spec.env)?;
        let dir = self.root.join(&spec.key);
        blocking(move || {
            fs::create_dir_all(&dir).map_err(|e| {
                Error::Failed(format!("creating the directory {}: {e}", dir.display()))
            })
        })
        .await?;
        self.envs().insert(spec.key.clone(), spec.env.clone());
        debug!(key = %spec.key, "unisolated sandbox ready (limits other than timeout and output cap are not enforced)");
        Ok(SandboxInfo {
            id: SandboxId(spec.key.clone()),
            isolated: false,
        })
    }

    async fn exec(&self, id: &SandboxId, request: &ExecRequest) -> Result<ExecOutput, Error> {
        let dir = self.dir_of(id)?;
        let env = self
            .envs()
            .get(&id.0)
            .cloned()
            .ok_or_else(|| Error::NotFound(id.clone()))?;
        let shown_cwd = request.cwd.clone().unwrap_or_default();
        let rel = paths::relative(Path::new(&shown_cwd))
            .map_err(|why| Error::Refused(format!("working directory {shown_cwd:?} {why}")))?;
        let owned_id = id.clone();
        let (home, cwd) = blocking(move || {
            let home = canonical_dir(&dir, &owned_id)?;
            let cwd = inside_dir(&home, &rel, &shown_cwd)?;
            Ok((home, cwd))
        })
        .await?;

        let mut command = Command::new("/bin/sh");
        command
            .arg("-c")
            .arg(&request.command)
            .current_dir(&cwd)
            .env_clear()
            .env(
                "PATH",
                std::env::var_os("PATH").unwrap_or_else(|| DEFAULT_PATH.into()),
            )
            .env("HOME", &home)
            .env("LANG", "C.UTF-8")
            .envs(&env)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true);
        run(command, request).await
    }

    async fn put_files(&self, id: &SandboxId, tar: Vec<u8>) -> Result<(), Error> {
        let dir = self.existing_dir(id).await?;
        blocking(move || archive::unpack(&tar, &dir)).await
    }

    async fn get_files(&self, id: &SandboxId, path: &str) -> Result<Vec<u8>, Error> {
        let dir = self.existing_dir(id).await?;
        let rel = paths::relative(Path::new(path))
            .map_err(|why| Error::Refused(format!("path {path:?} {why}")))?;
        let shown = path.to_owned();
        blocking(move || archive::pack(&dir, &rel, &shown)).await
    }

    async fn destroy(&self, id: &SandboxId) -> Result<(), Error> {
        // An id this backend cannot have issued names no sandbox: nothing to remove.
        let Ok(dir) = self.dir_of(id) else {
            return Ok(());
        };
        self.envs().remove(&id.0);
        blocking(move || remove_tree(&dir)).await
    }
}

/// Runs the prepared command: output read while it runs, the group killed at the end.
async fn run(mut command: Command, request: &ExecRequest) -> Result<ExecOutput, Error> {
    let mut child = command.spawn().map_err(|e| match e.kind() {
        io::ErrorKind::NotFound => Error::Refused(format!("cannot start /bin/sh: {e}")),
        io::ErrorKind::InvalidInput => Error::Refused(format!("cannot run this command: {e}")),
        _ => Error::Failed(format!("starting the command: {e}")),
    })?;
    // With `process_group(0)` the shell leads a new group whose id is its pid.
    let mut group = ProcessGroup::of(child.id());
    let (Some(stdout), Some(stderr)) = (child.stdout.take(), child.stderr.take()) else {
        return Err(Error::Failed(
            "the command's output pipes are missing".to_owned(),
        ));
    };
    let cap = usize::try_from(request.output_cap).unwrap_or(usize::MAX);
    let mut out = Output::default();
    let mut err = Output::default();

    let (status, drained) = {
        let drain = async {
            let (a, b) = tokio::join!(
                read_capped(stdout, cap, &mut out),
                read_capped(stderr, cap, &mut err)
            );
            a.and(b)
        };
        tokio::pin!(drain);
        let timer = tokio::time::sleep(request.timeout);
        tokio::pin!(timer);
        let mut drained = None;
        let status = loop {
            tokio::select! {
                status = child.wait() => break Some(status),
                result = &mut drain, if drained.is_none() => drained = Some(result),
                () = &mut timer => break None,
            }
        };
        // Killing the group closes the pipes of all its processes; what they wrote is still
        // read below.
        group.kill();
        if drained.is_none() {
            drained = tokio::time::timeout(DRAIN_GRACE, &mut drain).await.ok();
        }
        (status, drained)
    };

    let timed_out = status.is_none();
    let exit_code = match status {
        // `None` when a signal ended the shell.
        Some(Ok(status)) => status.code(),
        Some(Err(e)) => return Err(Error::Failed(format!("waiting for the command: {e}"))),
        None => {
            // The shell was killed with its group; reap it (dropping the child would too).
            if tokio::time::timeout(DRAIN_GRACE, child.wait())
                .await
                .is_err()
            {
                warn!("a killed command's shell did not exit in time");
            }
            None
        }
    };
    match drained {
        Some(Err(e)) => Err(Error::Failed(format!("reading the command's output: {e}"))),
        Some(Ok(())) => Ok(()),
        None => {
            debug!("a process that left the command's process group still holds its output open");
            Ok(())
        }
    }?;
    Ok(ExecOutput {
        exit_code,
        stdout: out,
        stderr: err,
        timed_out,
    })
}

/// Reads `reader` to its end, keeping the first `cap` bytes in `out` and marking it truncated
/// when more came.
async fn read_capped<R: AsyncRead + Unpin>(
    mut reader: R,
    cap: usize,
    out: &mut Output,
) -> io::Result<()> {
    let mut buf = vec![0u8; READ_CHUNK];
    loop {
        let n = reader.read(&mut buf).await?;
        let Some(chunk) = buf.get(..n).filter(|chunk| !chunk.is_empty()) else {
            return Ok(());
        };
        let room = cap.saturating_sub(out.bytes.len());
        let keep = chunk.get(..room).unwrap_or(chunk);
        out.bytes.extend_from_slice(keep);
        if keep.len() < chunk.len() {
            out.truncated = true;
        }
    }
}

/// A process group that is killed when this value is dropped, unless killed before.
struct ProcessGroup(Option<Pid>);

impl ProcessGroup {
    fn of(leader: Option<u32>) -> Self {
        // Never group 0 or 1: `kill(-1)` would signal every process the server may signal.
        let pid = leader
            .and_then(|pid| i32::try_from(pid).ok())
            .filter(|&pid| pid > 1)
            .and_then(Pid::from_raw);
        ProcessGroup(pid)
    }

    fn kill(&mut self) {
        if let Some(pid) = self.0.take() {
            match rustix::process::kill_process_group(pid, Signal::KILL) {
                Ok(()) | Err(rustix::io::Errno::SRCH) => {}
                Err(e) => {
                    warn!(group = pid.as_raw_nonzero().get(), error = %e, "killing a command's process group failed")
                }
            }
        }
    }
}

impl Drop for ProcessGroup {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Environment variables that a process can be given.
fn check_env(env: &BTreeMap<String, String>) -> Result<(), Error> {
    for (name, value) in env {
        if name.is_empty() || name.contains(['=', '\0']) {
            return Err(Error::Refused(format!(
                "environment variable name {name:?} is empty or contains '=' or a NUL byte"
            )));
        }
        if value.contains('\0') {
            return Err(Error::Refused(format!(
                "environment variable {name} contains a NUL byte"
            )));
        }
    }
    Ok(())
}

/// The canonical form of a sandbox's directory, which must exist.
fn canonical_dir(dir: &Path, id: &SandboxId) -> Result<PathBuf, Error> {
    match dir.canonicalize() {
        Ok(dir) if dir.is_dir() => Ok(dir),
        Ok(_) => Err(Error::NotFound(id.clone())),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Err(Error::NotFound(id.clone())),
        Err(e) => Err(Error::Failed(format!(
            "opening the directory {}: {e}",
            dir.display()
        ))),
    }
}

/// The directory `rel` under the canonical directory `home`, which must exist and stay inside
/// `home` even when it passes through symbolic links.
fn inside_dir(home: &Path, rel: &Path, shown: &str) -> Result<PathBuf, Error> {
    let dir = match home.join(rel).canonicalize() {
        Ok(dir) => dir,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(Error::Refused(format!(
                "working directory {shown:?} does not exist"
            )));
        }
        Err(e) => return Err(Error::Failed(format!("opening {shown:?}: {e}"))),
    };
    if !dir.starts_with(home) {
        return Err(Error::Refused(format!(
            "working directory {shown:?} leads outside the sandbox"
        )));
    }
    if !dir.is_dir() {
        return Err(Error::Refused(format!(
            "working directory {shown:?} is not a directory"
        )));
    }
    Ok(dir)
}

/// Removes `dir` and everything in it; a missing directory is fine. Directories that a
/// command made read-only (as Go's module cache is) are made writable first.
fn remove_tree(dir: &Path) -> Result<(), Error> {
    let failed = |e: io::Error| Error::Failed(format!("removing {}: {e}", dir.display()));
    match fs::remove_dir_all(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::PermissionDenied => {
            make_dirs_writable(dir);
            match fs::remove_dir_all(dir) {
                Ok(()) => Ok(()),
                Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
                Err(e) => Err(failed(e)),
            }
        }
        Err(e) => Err(failed(e)),
    }
}

/// Gives the owner full access to every directory below `dir` (never following links), as far
/// as it can.
fn make_dirs_writable(dir: &Path) {
    let mut stack = vec![dir.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let is_dir = fs::symlink_metadata(&dir).is_ok_and(|meta| meta.is_dir());
        if !is_dir {
            continue;
        }
        if let Err(e) = fs::set_permissions(&dir, fs::Permissions::from_mode(0o700)) {
            debug!(path = %dir.display(), error = %e, "cannot make a directory writable");
        }
        if let Ok(children) = fs::read_dir(&dir) {
            stack.extend(children.flatten().map(|child| child.path()));
        }
    }
}

/// Runs blocking file-system work off the async threads.
async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, Error> + Send + 'static,
) -> Result<T, Error> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| Error::Failed(format!("blocking file-system task failed: {e}")))?
}

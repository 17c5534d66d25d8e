//! Working directories on the local file system, shared by the unisolated and the bubblewrap
//! backends: environment checks, resolving a command's directory, removal, blocking work.

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use nodus_core::sandbox::{Error, SandboxId};
use tracing::debug;

/// Checks that every variable can be given to a process: a name that is not empty and has no
/// `=` or NUL byte, a value without NUL bytes.
pub(crate) fn check_env(env: &BTreeMap<String, String>) -> Result<(), Error> {
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
pub(crate) fn canonical_dir(dir: &Path, id: &SandboxId) -> Result<PathBuf, Error> {
    match dir.canonicalize() {
        Ok(dir) if dir.is_dir() => Ok(dir),
        Ok(_) => Err(Error::NotFound(id.clone())),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Err(Error::NotFound(id.clone())),
        Err(e) => Err(Error::Failed(format!(
            "opening the sandbox's working directory: {e}"
        ))),
    }
}

/// The directory `rel` under the canonical directory `home`, which must exist and stay inside
/// `home` even when it passes through symbolic links.
pub(crate) fn inside_dir(home: &Path, rel: &Path, shown: &str) -> Result<PathBuf, Error> {
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
pub(crate) fn remove_tree(dir: &Path) -> Result<(), Error> {
    let failed =
        |e: io::Error| Error::Failed(format!("removing the sandbox's working directory: {e}"));
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

/// Runs `work` with the canonical form of the sandbox directory `dir`, which must exist, off
/// the async threads: the check and the work in one trip to the blocking pool.
pub(crate) async fn in_existing_dir<T: Send + 'static>(
    dir: PathBuf,
    id: &SandboxId,
    work: impl FnOnce(PathBuf) -> Result<T, Error> + Send + 'static,
) -> Result<T, Error> {
    let id = id.clone();
    blocking(move || work(canonical_dir(&dir, &id)?)).await
}

/// Runs blocking file-system work off the async threads.
pub(crate) async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, Error> + Send + 'static,
) -> Result<T, Error> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| Error::Failed(format!("blocking file-system task failed: {e}")))?
}

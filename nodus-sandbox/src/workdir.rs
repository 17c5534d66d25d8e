//! Working directories on the local file system, shared by the unisolated and the bubblewrap
//! backends: environment checks, resolving a command's directory, removal, blocking work.

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use nodus_core::sandbox::{Error, SandboxId};
use tracing::debug;

use crate::paths;

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

/// The directory that holds a backend's sandbox directories, one per sandbox key. Its
/// canonical form is resolved once it exists and kept (it is the server's own and does not
/// move): a sandbox's canonical directory is then that and one look at the sandbox's own, not
/// a walk of every component of the path (a `readlink` each) at every call.
#[derive(Debug)]
pub(crate) struct SandboxesDir {
    path: PathBuf,
    canonical: OnceLock<PathBuf>,
}

impl SandboxesDir {
    pub(crate) fn new(path: PathBuf) -> Self {
        SandboxesDir {
            path,
            canonical: OnceLock::new(),
        }
    }

    /// The host directory of sandbox `key`, made or not (not resolved).
    pub(crate) fn of(&self, key: &str) -> PathBuf {
        self.path.join(key)
    }

    /// The host directory of a sandbox, for an id a backend could have issued.
    pub(crate) fn of_id(&self, id: &SandboxId) -> Result<PathBuf, Error> {
        paths::check_key(&id.0).map_err(|_| Error::NotFound(id.clone()))?;
        Ok(self.of(&id.0))
    }

    /// The canonical form of sandbox `id`'s directory, which must exist and be a directory
    /// of its own (not a symbolic link: a backend makes each with `mkdir`).
    pub(crate) fn existing(&self, id: &SandboxId) -> Result<PathBuf, Error> {
        let failed =
            |e: io::Error| Error::Failed(format!("opening the sandbox's working directory: {e}"));
        let not_found = |e: io::Error| match e.kind() {
            io::ErrorKind::NotFound => Error::NotFound(id.clone()),
            _ => failed(e),
        };
        paths::check_key(&id.0).map_err(|_| Error::NotFound(id.clone()))?;
        let parent = match self.canonical.get() {
            Some(parent) => parent,
            None => {
                let parent = self.path.canonicalize().map_err(not_found)?;
                self.canonical.get_or_init(|| parent)
            }
        };
        let dir = parent.join(&id.0);
        match fs::symlink_metadata(&dir) {
            Ok(meta) if meta.is_dir() => Ok(dir),
            Ok(_) => Err(Error::NotFound(id.clone())),
            Err(e) => Err(not_found(e)),
        }
    }
}

/// The directory `rel` under the canonical directory `home`, which must exist and stay inside
/// `home` even when it passes through symbolic links.
pub(crate) fn inside_dir(home: &Path, rel: &Path, shown: &str) -> Result<PathBuf, Error> {
    if rel.as_os_str().is_empty() {
        // `home` itself, canonical and a directory already.
        return Ok(home.to_path_buf());
    }
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

/// Runs `work` with the canonical form of sandbox `id`'s directory in `dirs`, which must
/// exist, off the async threads: the check and the work in one trip to the blocking pool.
pub(crate) async fn in_existing_dir<T: Send + 'static>(
    dirs: &Arc<SandboxesDir>,
    id: &SandboxId,
    work: impl FnOnce(PathBuf) -> Result<T, Error> + Send + 'static,
) -> Result<T, Error> {
    let (dirs, id) = (Arc::clone(dirs), id.clone());
    blocking(move || work(dirs.existing(&id)?)).await
}

/// Runs blocking file-system work off the async threads.
pub(crate) async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, Error> + Send + 'static,
) -> Result<T, Error> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| Error::Failed(format!("blocking file-system task failed: {e}")))?
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(key: &str) -> SandboxId {
        SandboxId(key.to_string())
    }

    #[test]
    fn a_sandbox_directory_is_found_canonical_and_only_when_it_is_a_directory_of_its_own() {
        let tmp = tempfile::tempdir().expect("tempdir");
        // The root reached through a link: its canonical form is what is answered.
        let real = tmp.path().join("real");
        fs::create_dir_all(real.join("sandboxes/made")).expect("mkdir");
        std::os::unix::fs::symlink(&real, tmp.path().join("link")).expect("symlink");
        let dirs = SandboxesDir::new(tmp.path().join("link/sandboxes"));
        let canonical = real
            .canonicalize()
            .expect("canonical")
            .join("sandboxes/made");
        assert_eq!(dirs.existing(&id("made")).expect("found"), canonical);
        // Again, from the kept parent.
        assert_eq!(dirs.existing(&id("made")).expect("found"), canonical);
        // Missing, a file, a link to a directory, a key no backend issues: not found.
        fs::write(real.join("sandboxes/file"), b"x").expect("file");
        std::os::unix::fs::symlink(real.join("sandboxes/made"), real.join("sandboxes/linked"))
            .expect("symlink");
        for key in ["missing", "file", "linked", "../sandboxes/made"] {
            assert!(
                matches!(dirs.existing(&id(key)), Err(Error::NotFound(_))),
                "{key}: {:?}",
                dirs.existing(&id(key))
            );
        }
    }

    #[test]
    fn no_sandbox_is_found_before_the_directory_of_sandboxes_is_made() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dirs = SandboxesDir::new(tmp.path().join("sandboxes"));
        assert!(matches!(dirs.existing(&id("a")), Err(Error::NotFound(_))));
        fs::create_dir_all(tmp.path().join("sandboxes/a")).expect("mkdir");
        let found = dirs.existing(&id("a")).expect("found once made");
        assert_eq!(
            found,
            tmp.path().canonicalize().expect("c").join("sandboxes/a")
        );
    }

    #[test]
    fn the_working_directory_itself_is_the_sandbox_s_and_a_way_out_is_refused() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let home = tmp.path().canonicalize().expect("canonical").join("home");
        fs::create_dir_all(home.join("sub")).expect("mkdir");
        std::os::unix::fs::symlink(tmp.path(), home.join("out")).expect("symlink");
        assert_eq!(inside_dir(&home, Path::new(""), "").expect("home"), home);
        assert_eq!(
            inside_dir(&home, Path::new("sub"), "sub").expect("sub"),
            home.join("sub")
        );
        assert!(matches!(
            inside_dir(&home, Path::new("out"), "out"),
            Err(Error::Refused(_))
        ));
    }
}

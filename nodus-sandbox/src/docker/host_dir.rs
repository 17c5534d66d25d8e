//! A sandbox's working directory as this host sees it: its volume's directory, when the
//! engine is on this host (a unix socket) and this process can read it (as root). Then the
//! working directory is listed and watched there ([`crate::watch`]), as the process
//! sandboxes' are, instead of being read back as an archive of the whole directory.

use std::path::{Path, PathBuf};
use std::sync::PoisonError;

use nodus_core::sandbox::{Error, MAX_ARCHIVE_BYTES, SandboxId};
use nodus_core::snapshot::{Changes, FileStat};

use super::{DockerSandbox, Endpoint, fs_readable};
use crate::archive;
use crate::workdir::blocking;

impl DockerSandbox {
    /// The volume's directory of sandbox `id` on this host, when it can be read here; found
    /// once per sandbox.
    async fn host_dir(&self, id: &SandboxId) -> Option<PathBuf> {
        if !matches!(self.config.endpoint, Endpoint::Socket(_)) {
            return None;
        }
        if let Some(known) = self.lock_host_dirs().get(&id.0) {
            return known.clone();
        }
        let dir = match self.docker.inspect_volume(&id.0).await {
            Ok(volume) => Some(PathBuf::from(volume.mountpoint)),
            Err(_) => None,
        };
        let dir = match dir {
            Some(dir) if fs_readable(&dir).await => Some(dir),
            _ => None,
        };
        self.lock_host_dirs().insert(id.0.clone(), dir.clone());
        dir
    }

    /// [`nodus_core::Sandbox::list_files`]: walked on this host when it can, else read from
    /// an archive of the whole working directory.
    pub(super) async fn list_host_or_archive(
        &self,
        id: &SandboxId,
    ) -> Result<Vec<FileStat>, Error> {
        self.limits_of(id)?;
        if let Some(dir) = self.host_dir(id).await {
            return blocking(move || archive::list(&dir)).await;
        }
        let tar = nodus_core::Sandbox::get_files(self, id, "", MAX_ARCHIVE_BYTES).await?;
        nodus_core::snapshot::archive::read_archive(&tar, &|_| false)
            .map(|(stats, _)| stats)
            .map_err(Error::Failed)
    }

    /// [`nodus_core::Sandbox::changes`]: told by the watch on this host, `Unknown` without
    /// one.
    pub(super) async fn changes_on_host(&self, id: &SandboxId) -> Result<Changes, Error> {
        self.limits_of(id)?;
        match self.host_dir(id).await {
            Some(dir) => {
                let owned_id = id.clone();
                self.watcher
                    .changes_of(id, move || canonical_dir(&dir, &owned_id))
                    .await
            }
            None => Ok(Changes::Unknown),
        }
    }

    /// Forget what is known of sandbox `id`'s directory (it is being removed).
    pub(super) fn forget_host_dir(&self, id: &SandboxId) {
        self.lock_host_dirs().remove(&id.0);
        self.watcher.forget(&id.0);
    }

    fn lock_host_dirs(
        &self,
    ) -> std::sync::MutexGuard<'_, std::collections::HashMap<String, Option<PathBuf>>> {
        self.host_dirs
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

/// The canonical form of a sandbox's volume directory `dir`, which must exist.
fn canonical_dir(dir: &Path, id: &SandboxId) -> Result<PathBuf, Error> {
    match dir.canonicalize() {
        Ok(dir) if dir.is_dir() => Ok(dir),
        Ok(_) => Err(Error::NotFound(id.clone())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(Error::NotFound(id.clone())),
        Err(e) => Err(Error::Failed(format!(
            "opening the sandbox's working directory: {e}"
        ))),
    }
}

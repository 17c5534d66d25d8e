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
//! outlive their command. Of the spec's [`Limits`](nodus_core::sandbox::Limits) only the
//! command timeout and the output cap are enforced.
//!
//! [`SandboxSpec::links`] are not made: with no root of its own, a link such as `/grading`
//! would be one path of the host shared by every sandbox (and need root to make), so a command
//! reaches those directories only by their paths relative to the working directory
//! (`grading/`, not `/grading`). The links are still checked, as every backend checks them.

use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex, PoisonError};

use async_trait::async_trait;
use nodus_core::Sandbox;
use nodus_core::sandbox::{
    Error, ExecOutput, ExecRequest, Limits, SandboxId, SandboxInfo, SandboxSpec,
};
use tokio::process::Command;
use tracing::{debug, warn};

use crate::watch::Watcher;
use crate::workdir::{SandboxesDir, blocking, check_env, in_existing_dir, inside_dir, remove_tree};
use crate::{archive, paths, process};

/// `PATH` for commands when the server has none.
const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// The environment and limits a sandbox was created with.
type Created = (BTreeMap<String, String>, Limits);

/// Sandboxes that are plain directories under `root`, with commands run as local processes
/// without any isolation. See the [module docs](self).
#[derive(Debug)]
pub struct UnisolatedSandbox {
    dirs: Arc<SandboxesDir>,
    /// The environment and limits of each sandbox created since this value was made, by id.
    envs: Mutex<HashMap<String, Created>>,
    /// What changed in each working directory.
    watcher: Arc<Watcher>,
}

impl UnisolatedSandbox {
    /// Sandboxes in directories under `root`, which is created when needed.
    pub fn new(root: PathBuf) -> Self {
        warn!(
            root = %root.display(),
            "unisolated sandboxes: commands run as local processes with no isolation"
        );
        UnisolatedSandbox {
            dirs: Arc::new(SandboxesDir::new(root)),
            envs: Mutex::new(HashMap::new()),
            watcher: Arc::default(),
        }
    }

    fn envs(&self) -> std::sync::MutexGuard<'_, HashMap<String, Created>> {
        // The map stays consistent even if a holder panicked: each access is one call.
        self.envs.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[async_trait]
impl Sandbox for UnisolatedSandbox {
    async fn create(&self, spec: &SandboxSpec) -> Result<SandboxInfo, Error> {
        paths::check_key(&spec.key).map_err(Error::Refused)?;
        check_env(&spec.env)?;
        // Checked as elsewhere, but not made (see the module's documentation).
        nodus_core::sandbox::check_links(&spec.links, "/").map_err(Error::Refused)?;
        let dir = self.dirs.of(&spec.key);
        blocking(move || {
            fs::create_dir_all(&dir).map_err(|e| {
                Error::Failed(format!("creating the sandbox's working directory: {e}"))
            })
        })
        .await?;
        self.envs()
            .insert(spec.key.clone(), (spec.env.clone(), spec.limits));
        debug!(key = %spec.key, "unisolated sandbox ready (limits other than timeout and output cap are not enforced)");
        Ok(SandboxInfo {
            id: SandboxId(spec.key.clone()),
            isolated: false,
            host: None,
        })
    }

    async fn exec(&self, id: &SandboxId, request: &ExecRequest) -> Result<ExecOutput, Error> {
        let (env, limits) = self
            .envs()
            .get(&id.0)
            .cloned()
            .ok_or_else(|| Error::NotFound(id.clone()))?;
        let request = request.within(&limits)?;
        let shown_cwd = request.cwd.clone().unwrap_or_default();
        let rel = paths::relative(Path::new(&shown_cwd))
            .map_err(|why| Error::Refused(format!("working directory {shown_cwd:?} {why}")))?;
        let (dirs, owned_id) = (Arc::clone(&self.dirs), id.clone());
        let (home, cwd) = blocking(move || {
            let home = dirs.existing(&owned_id)?;
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
        process::run(command, request.timeout, request.output_cap, None).await
    }

    async fn put_files(&self, id: &SandboxId, tar: Vec<u8>) -> Result<(), Error> {
        in_existing_dir(&self.dirs, id, move |dir| archive::unpack(&tar, &dir)).await
    }

    async fn list_files(
        &self,
        id: &SandboxId,
    ) -> Result<Vec<nodus_core::snapshot::FileStat>, Error> {
        in_existing_dir(&self.dirs, id, |dir| archive::list(&dir)).await
    }

    async fn changes(&self, id: &SandboxId) -> Result<nodus_core::snapshot::Changes, Error> {
        let (dirs, owned_id) = (Arc::clone(&self.dirs), id.clone());
        self.watcher
            .changes_of(id, move || dirs.existing(&owned_id))
            .await
    }

    async fn get_files(
        &self,
        id: &SandboxId,
        path: &str,
        max_bytes: usize,
    ) -> Result<Vec<u8>, Error> {
        // A missing sandbox is told before a path it could not hold.
        let rel = paths::relative(Path::new(path))
            .map_err(|why| Error::Refused(format!("path {path:?} {why}")));
        let shown = path.to_owned();
        in_existing_dir(&self.dirs, id, move |dir| {
            archive::pack(&dir, &rel?, &shown, max_bytes)
        })
        .await
    }

    async fn destroy(&self, id: &SandboxId) -> Result<(), Error> {
        // An id this backend cannot have issued names no sandbox: nothing to remove.
        let Ok(dir) = self.dirs.of_id(id) else {
            return Ok(());
        };
        self.envs().remove(&id.0);
        self.watcher.forget(&id.0);
        blocking(move || remove_tree(&dir)).await
    }
}

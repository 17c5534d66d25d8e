//! The Docker backend (feature `docker`): one container per run, kept alive between commands,
//! over the Docker Engine API on a local unix socket (bollard).
//!
//! The sandbox with key `k` is the container `nodus-k` (the prefix is configurable), which is
//! also its id, with a volume of the same name at the working directory ([`DockerConfig`]'s
//! `workdir`, `/work` by default). Both carry the label `nodus.sandbox.key=k`, so that a
//! restarted server re-attaches to them (`create` with the same key finds the container and
//! starts it if it stopped) and removes the ones no run needs ([`DockerSandbox::remove_orphans`]).
//!
//! A container is made from the run's image or the operator's default one (the engine names
//! it by the content digest [`Sandbox::resolve_image`] answered when the run was created, so
//! that a tag moved since changes nothing), with:
//! - network `none` unless the spec allows the network (then the default bridge), or, for a
//!   spec with an allowlist, the internal egress network whose only way out is the egress
//!   proxy (the [`egress`] module);
//! - memory (without swap), CPU and process limits from the spec, and no file larger than
//!   its disk limit (`ulimit -f`); besides its CPU quota, a container runs on as many of the
//!   engine's CPUs as its limit rounds up to (`cpuset-cpus`, chosen in turn as the bubblewrap
//!   backend chooses its sandboxes' CPUs), so that `nproc` inside agrees with the limit; where the server can read the working directory's volume
//!   on this host (a local engine, the server root), the bubblewrap backend's watchdog also
//!   stops a command that grows the volume past the limit or leaves the disk less free space
//!   than [`DockerConfig::disk_reserve_bytes`];
//! - a read-only root file system, a private `/tmp` (a tmpfs no larger than the memory limit)
//!   and the working-directory volume as the only writable places;
//! - all capabilities dropped and `no-new-privileges`;
//! - no log kept by the engine (log driver `none`): output reaches the backend through the
//!   attachment only, and cannot fill the host's disk;
//! - as its first process a shell that reads commands from its stdin, which stays open
//!   between commands (the image needs `/bin/sh`; `kill` and `printf` are built into every
//!   shell).
//!
//! A run that waits for a message has its container stopped ([`Sandbox::suspend`]): its
//! volume stays, and the next command starts it again.
//!
//! Commands go through the [command channel](crate::channel): the backend attaches to the first
//! process when it creates the container (again after a restart, on the next command) and
//! sends each command as one line; the command runs as `/bin/sh -c` in the working directory
//! (or a directory below it), with stdout and stderr read apart and capped. When the command
//! ends, every process it left in the container is killed (`kill -9 -1` from the first
//! process, which spares only itself). A timeout, or dropping the `exec` future, does the same
//! from an exec, and restarts the container (same file system) when that cannot start (a fork
//! bomb at its process limit); after a dropped future, the sandbox's next command waits for
//! that kill, which could otherwise hit it. Commands of one sandbox run one at a time. A
//! command ended by a signal reports exit code 128 + the signal's number.
//!
//! Files move through the Docker archive API. An incoming archive is checked like everywhere
//! (see the crate's archive rules): what is on disk at the paths it touches is looked up with
//! one script through the command channel first; the engine unpacks it with the permission bits it carries (set-uid bits
//! are inert under `no-new-privileges`). Outgoing archives name their entries relative to the
//! working directory.
//! As with the other backends, the limits of a sandbox live in memory: after a restart,
//! `create` comes before `exec`.

use std::collections::{BTreeSet, HashMap};
use std::path::{Component, Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bollard::Docker;
use bollard::errors::Error as DockerError;
use bollard::exec::{CreateExecOptions, StartExecResults};
use bollard::query_parameters::{
    CreateImageOptionsBuilder, DownloadFromContainerOptionsBuilder, ListContainersOptionsBuilder,
    ListVolumesOptionsBuilder, RemoveContainerOptionsBuilder, RemoveVolumeOptionsBuilder,
    RestartContainerOptionsBuilder, StopContainerOptionsBuilder, UploadToContainerOptionsBuilder,
};
use futures_util::StreamExt;
use nodus_core::Sandbox;
use nodus_core::output::Output;
use nodus_core::sandbox::{
    Error, ExecOutput, ExecRequest, Limits, LiveOutput, MAX_ARCHIVE_BYTES, SandboxId, SandboxInfo,
    SandboxSpec,
};
use rustix::thread::CpuSet;
use tracing::{debug, info, warn};

use crate::archive::{self, OnDisk};
use crate::cpus::first_cpus;
use crate::disk::Watch;
use crate::paths;
use crate::workdir::check_env;

mod channel;
mod create;
mod egress;
mod exec;
mod host_dir;
mod hosts;

pub use egress::{DEFAULT_NETWORK as DEFAULT_EGRESS_NETWORK, DockerEgress};
pub use hosts::{DockerHost, DockerHosts};

use crate::channel::{self as framing, Reading, Status};
use channel::Channel;

/// A container's turn to run something.
type Slot = Arc<tokio::sync::Mutex<Turn>>;

/// What the holder of a container's slot finds there.
#[derive(Debug, Default)]
struct Turn {
    /// The command channel, once attached.
    channel: Option<Channel>,
    /// The kill of what a dropped command left running. The next holder waits for it before
    /// it runs anything, so that the kill cannot hit its command instead.
    killing: Option<tokio::task::JoinHandle<()>>,
}

/// The label that names a container's or volume's sandbox key.
pub const KEY_LABEL: &str = "nodus.sandbox.key";

/// The label that names who made a container or volume ([`DockerConfig::owner`]).
pub const OWNER_LABEL: &str = "nodus.sandbox.owner";

/// How long output is still read after a timeout killed a command.
const DRAIN_GRACE: Duration = Duration::from_secs(2);

/// How long the backend's own short execs (path checks, kills) may take.
const HELPER_TIMEOUT: Duration = Duration::from_secs(30);

/// The most bytes of quoted paths in one look-up script (Linux caps one argument at 128 KiB).
const LOOKUP_BATCH_BYTES: usize = 96 * 1024;

/// How the Docker backend works.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct DockerConfig {
    /// The image of runs that name none.
    pub default_image: String,
    /// Where the engine listens.
    pub endpoint: Endpoint,
    /// Prefix of container and volume names.
    pub name_prefix: String,
    /// The working directory inside containers (absolute).
    pub workdir: String,
    /// Timeout of one API request (not of a command), in seconds.
    pub request_timeout_secs: u64,
    /// The free bytes the file system of the working-directory volumes keeps, where the
    /// server can see them (a local engine): a command that lets it drop below is stopped.
    pub disk_reserve_bytes: u64,
    /// The egress proxy, for sandboxes whose only way out it is ([`SandboxSpec::egress`]);
    /// `None`: such sandboxes are refused.
    pub egress: Option<DockerEgress>,
    /// Who makes this backend's sandboxes (one name per store: the replicas of one store
    /// share it, another installation on the same engine has its own). Its containers and
    /// volumes carry it (label [`OWNER_LABEL`]), and [`DockerSandbox::remove_orphans`]
    /// removes only those: another owner's, and those of no owner (made before owners
    /// were), are never its orphans. `None` (the default): nothing is labelled, and every
    /// container of the name prefix may be an orphan.
    pub owner: Option<String>,
}

impl DockerConfig {
    /// `/var/run/docker.sock`, names `nodus-<key>`, working directory `/work`, 120 s per
    /// request, 256 MiB kept free.
    pub fn new(default_image: String) -> Self {
        DockerConfig {
            default_image,
            endpoint: Endpoint::Socket(PathBuf::from("/var/run/docker.sock")),
            name_prefix: "nodus-".to_owned(),
            workdir: "/work".to_owned(),
            request_timeout_secs: 120,
            disk_reserve_bytes: crate::bwrap::DEFAULT_DISK_RESERVE_BYTES,
            egress: None,
            owner: None,
        }
    }
}

/// Where a Docker engine listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    /// A unix socket on this host.
    Socket(PathBuf),
    /// A TCP address (`tcp://HOST:PORT`), with TLS when `tls_dir` holds the client's
    /// `ca.pem`, `cert.pem` and `key.pem`, as the Docker CLI's `--tlsverify` reads them.
    Tcp {
        /// `tcp://HOST:PORT`.
        url: String,
        /// The directory of `ca.pem`, `cert.pem` and `key.pem`; plain TCP without it.
        tls_dir: Option<PathBuf>,
    },
}

impl std::fmt::Display for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Endpoint::Socket(path) => write!(f, "unix://{}", path.display()),
            Endpoint::Tcp { url, .. } => f.write_str(url),
        }
    }
}

impl Endpoint {
    /// A client of the engine here (not contacted yet).
    fn client(&self, timeout_secs: u64) -> Result<Docker, DockerError> {
        let version = bollard::API_DEFAULT_VERSION;
        match self {
            Endpoint::Socket(path) => {
                Docker::connect_with_unix(&path.to_string_lossy(), timeout_secs, version)
            }
            Endpoint::Tcp {
                url,
                tls_dir: Some(dir),
            } => Docker::connect_with_ssl(
                url,
                &dir.join("key.pem"),
                &dir.join("cert.pem"),
                &dir.join("ca.pem"),
                timeout_secs,
                version,
            ),
            Endpoint::Tcp { url, tls_dir: None } => {
                Docker::connect_with_http(url, timeout_secs, version)
            }
        }
    }
}

/// Sandboxes that are Docker containers. See the [module docs](self).
#[derive(Debug, Clone)]
pub struct DockerSandbox {
    docker: Docker,
    config: Arc<DockerConfig>,
    /// The limits of each sandbox created since this value was made, by container name.
    created: Arc<Mutex<HashMap<String, Limits>>>,
    /// One slot per container, holding its command channel once attached: its commands and
    /// transfers run one at a time.
    slots: Arc<Mutex<HashMap<String, Slot>>>,
    /// The engine's CPUs, which containers are pinned to some of.
    engine_cpus: CpuSet,
    /// The way to the egress proxy, when the configuration gives one.
    egress: Option<Arc<egress::Egress>>,
    /// Each sandbox's working directory on this host, when it can be read here.
    host_dirs: Arc<Mutex<HashMap<String, Option<PathBuf>>>>,
    /// What changed in those directories.
    watcher: Arc<crate::watch::Watcher>,
}

impl DockerSandbox {
    /// Connects to the engine and agrees on an API version. Fails with
    /// [`Error::Unavailable`] when the engine cannot be reached.
    pub async fn connect(config: DockerConfig) -> Result<Self, Error> {
        if !config.workdir.starts_with('/')
            || paths::relative(Path::new(&config.workdir[1..])).is_err()
        {
            return Err(Error::Refused(format!(
                "the working directory {:?} must be an absolute path without `..`",
                config.workdir
            )));
        }
        if let Endpoint::Socket(path) = &config.endpoint
            && path.to_str().is_none()
        {
            return Err(Error::Refused(format!("socket path {path:?} is not UTF-8")));
        }
        let docker = config
            .endpoint
            .client(config.request_timeout_secs)
            .map_err(|e| unavailable(&config, e))?
            .negotiate_version()
            .await
            .map_err(|e| unavailable(&config, e))?;
        let engine = docker.info().await.map_err(|e| unavailable(&config, e))?;
        let engine_cpus = first_cpus(
            engine
                .ncpu
                .and_then(|n| usize::try_from(n).ok())
                .unwrap_or(1),
        );
        info!(endpoint = %config.endpoint, version = ?docker.client_version(), cpus = engine_cpus.count(), "Docker sandboxes");
        Ok(DockerSandbox {
            docker,
            egress: config
                .egress
                .clone()
                .map(|e| Arc::new(egress::Egress::new(e))),
            config: Arc::new(config),
            created: Arc::default(),
            slots: Arc::default(),
            engine_cpus,
            host_dirs: Arc::default(),
            watcher: Arc::default(),
        })
    }

    /// Removes every container and volume of this backend (by label, name prefix and
    /// [owner](DockerConfig::owner)) whose key is not in `live_keys`, as after a restart, when
    /// the store says which runs still need a sandbox. Returns the keys removed.
    pub async fn remove_orphans(&self, live_keys: &BTreeSet<String>) -> Result<Vec<String>, Error> {
        let filters = HashMap::from([("label", vec![KEY_LABEL])]);
        let containers = self
            .docker
            .list_containers(Some(
                ListContainersOptionsBuilder::new()
                    .all(true)
                    .filters(&filters)
                    .build(),
            ))
            .await
            .map_err(|e| api_error("listing containers", e))?;
        let mut removed = BTreeSet::new();
        for container in containers {
            if !self.owns(container.labels.as_ref()) {
                continue;
            }
            let key = container.labels.as_ref().and_then(|l| l.get(KEY_LABEL));
            let named = container
                .names
                .iter()
                .flatten()
                .any(|n| key.is_some_and(|key| n.trim_start_matches('/') == self.name(key)));
            if let (Some(key), true) = (key, named)
                && !live_keys.contains(key)
            {
                self.remove(&self.name(key)).await?;
                removed.insert(key.clone());
            }
        }
        let volumes = self
            .docker
            .list_volumes(Some(
                ListVolumesOptionsBuilder::new().filters(&filters).build(),
            ))
            .await
            .map_err(|e| api_error("listing volumes", e))?;
        for volume in volumes.volumes.into_iter().flatten() {
            if let Some(key) = volume.labels.get(KEY_LABEL)
                && self.owns(Some(&volume.labels))
                && volume.name == self.name(key)
                && !live_keys.contains(key)
            {
                self.remove(&volume.name).await?;
                removed.insert(key.clone());
            }
        }
        if !removed.is_empty() {
            info!(count = removed.len(), "removed orphaned Docker sandboxes");
        }
        Ok(removed.into_iter().collect())
    }

    /// Whether a container or volume of these labels is this backend's owner's (any, when
    /// it has no owner).
    fn owns(&self, labels: Option<&HashMap<String, String>>) -> bool {
        match &self.config.owner {
            None => true,
            Some(owner) => labels.and_then(|l| l.get(OWNER_LABEL)) == Some(owner),
        }
    }

    /// The labels of sandbox `key`'s container and volume.
    pub(super) fn labels(&self, key: &str) -> HashMap<String, String> {
        let mut labels = HashMap::from([(KEY_LABEL.to_owned(), key.to_owned())]);
        if let Some(owner) = &self.config.owner {
            labels.insert(OWNER_LABEL.to_owned(), owner.clone());
        }
        labels
    }

    fn name(&self, key: &str) -> String {
        format!("{}{key}", self.config.name_prefix)
    }

    /// Where this engine listens.
    pub fn endpoint(&self) -> &Endpoint {
        &self.config.endpoint
    }

    /// Whether the engine answers a ping within `within`.
    pub async fn answers(&self, within: Duration) -> bool {
        matches!(
            tokio::time::timeout(within, self.docker.ping()).await,
            Ok(Ok(_))
        )
    }

    /// How many of this backend's containers the engine holds (running or stopped), whoever
    /// made them.
    pub async fn count(&self) -> Result<usize, Error> {
        let filters = HashMap::from([("label", vec![KEY_LABEL])]);
        let containers = self
            .docker
            .list_containers(Some(
                ListContainersOptionsBuilder::new()
                    .all(true)
                    .filters(&filters)
                    .build(),
            ))
            .await
            .map_err(|e| api_error("listing containers", e))?;
        Ok(containers.len())
    }

    /// Whether the engine holds the sandbox `id` (its container).
    pub async fn holds(&self, id: &SandboxId) -> Result<bool, Error> {
        match self.docker.inspect_container(&id.0, None).await {
            Ok(_) => Ok(true),
            Err(e) if status(&e) == Some(404) => Ok(false),
            Err(e) => Err(api_error("inspecting the container", e)),
        }
    }

    /// The name of the sandbox with key `key`.
    pub fn id_of(&self, key: &str) -> SandboxId {
        SandboxId(self.name(key))
    }

    /// The key of an id this backend could have issued.
    fn key_of<'a>(&self, id: &'a SandboxId) -> Option<&'a str> {
        id.0.strip_prefix(&self.config.name_prefix)
            .filter(|key| paths::check_key(key).is_ok())
    }

    fn limits_of(&self, id: &SandboxId) -> Result<Limits, Error> {
        self.key_of(id).ok_or_else(|| Error::NotFound(id.clone()))?;
        self.created
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&id.0)
            .copied()
            .ok_or_else(|| Error::NotFound(id.clone()))
    }

    /// The disk watch of a sandbox's working directory: its volume's directory on this host,
    /// when the engine is local and this process can read it (as root); `None` otherwise,
    /// when only `ulimit -f` bounds what a command writes.
    async fn disk_watch(&self, id: &SandboxId, limits: &Limits) -> Option<Watch> {
        let volume = match self.docker.inspect_volume(&id.0).await {
            Ok(volume) => volume,
            Err(e) => {
                debug!(sandbox = %id, error = %e, "no disk watch: cannot inspect the volume");
                return None;
            }
        };
        let dir = PathBuf::from(volume.mountpoint);
        let readable = fs_readable(&dir).await;
        if !readable {
            debug!(sandbox = %id, "no disk watch: the volume's directory is not readable here");
            return None;
        }
        Some(Watch {
            dir,
            limit: limits.disk_bytes,
            reserve: self.config.disk_reserve_bytes,
        })
    }

    fn slot_of(&self, id: &SandboxId) -> Slot {
        self.slots
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(id.0.clone())
            .or_default()
            .clone()
    }

    /// Removes a container and its volume; missing ones are fine.
    async fn remove(&self, name: &str) -> Result<(), Error> {
        let options = RemoveContainerOptionsBuilder::new()
            .force(true)
            .v(false)
            .build();
        match self.docker.remove_container(name, Some(options)).await {
            Ok(()) => {}
            Err(e) if status(&e) == Some(404) => {}
            Err(e) => return Err(api_error("removing the container", e)),
        }
        let options = RemoveVolumeOptionsBuilder::new().force(true).build();
        match self.docker.remove_volume(name, Some(options)).await {
            Ok(()) => Ok(()),
            Err(e) if status(&e) == Some(404) => Ok(()),
            Err(e) => Err(api_error("removing the volume", e)),
        }
    }

    async fn pull(&self, image: &str) -> Result<(), Error> {
        info!(image, "pulling an image for sandboxes");
        let options = CreateImageOptionsBuilder::new().from_image(image).build();
        let mut stream = self.docker.create_image(Some(options), None, None);
        while let Some(progress) = stream.next().await {
            progress.map_err(|e| {
                Error::Refused(format!(
                    "image {image:?} is not available here and could not be pulled: {e}"
                ))
            })?;
        }
        Ok(())
    }

    /// The exit code of a finished exec (its output has ended; the engine may lag a moment).
    async fn exit_code(&self, exec: &str) -> Result<Option<i32>, Error> {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let inspect = self
                .docker
                .inspect_exec(exec)
                .await
                .map_err(|e| api_error("inspecting the exec", e))?;
            if inspect.running != Some(true) || Instant::now() > deadline {
                return Ok(inspect.exit_code.and_then(|c| i32::try_from(c).ok()));
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    /// Runs one of the backend's own short shell scripts with arguments (`$1`…) through the
    /// channel held in `held`; its exit code and what it printed.
    async fn helper(
        &self,
        id: &SandboxId,
        held: &mut Turn,
        script: &str,
        args: &[&str],
    ) -> Result<(i32, Output, Output), Error> {
        let mut command = String::from("set --");
        for arg in args {
            command.push(' ');
            command.push_str(&framing::quote(arg));
        }
        command.push('\n');
        command.push_str(script);
        let ran = self
            .run_command(
                id,
                held,
                &self.config.workdir,
                &command,
                Bounds::helper(16 << 20),
            )
            .await?;
        match ran {
            Ran::Ended(reading) if !reading.stdout_truncated() => {
                if let Status::Exited(code) = reading.status()? {
                    let (out, err) = reading.into_outputs();
                    return Ok((code, out, err));
                }
            }
            _ => {}
        }
        Err(Error::Failed(
            "a path look-up in the container did not finish".to_owned(),
        ))
    }

    /// Kills every process of the container but its first: from inside when an exec can
    /// start, else by restarting the container (its file system stays). Answers whether it
    /// restarted the container.
    async fn kill_all(&self, name: &str) -> bool {
        let options = CreateExecOptions {
            attach_stdout: Some(true),
            attach_stderr: Some(true),
            cmd: Some(vec![
                "/bin/sh".to_owned(),
                "-c".to_owned(),
                "kill -9 -1".to_owned(),
            ]),
            ..Default::default()
        };
        let from_inside = async {
            let exec = self.docker.create_exec(name, options).await?;
            if let StartExecResults::Attached { mut output, .. } =
                self.docker.start_exec(&exec.id, None).await?
            {
                while output.next().await.is_some() {}
            }
            Ok::<_, DockerError>(exec.id)
        };
        let killed = match tokio::time::timeout(Duration::from_secs(5), from_inside).await {
            Ok(Ok(exec)) => matches!(self.exit_code(&exec).await, Ok(Some(0))),
            Ok(Err(e)) => {
                debug!(container = name, error = %e, "cannot kill from inside");
                false
            }
            Err(_) => false,
        };
        if killed {
            return false;
        }
        warn!(
            container = name,
            "restarting a container to kill a command's processes"
        );
        let options = RestartContainerOptionsBuilder::new().t(0).build();
        if let Err(e) = self.docker.restart_container(name, Some(options)).await {
            warn!(container = name, error = %e, "cannot restart a container");
        }
        true
    }

    async fn start(&self, name: &str) -> Result<(), Error> {
        match self.docker.start_container(name, None).await {
            Ok(()) => Ok(()),
            // Already running.
            Err(e) if status(&e) == Some(304) => Ok(()),
            Err(e) => Err(api_error("starting the container", e)),
        }
    }

    /// The container path of `rel` (clean, relative) under the working directory.
    fn inside(&self, rel: &Path) -> Result<String, Error> {
        let joined = Path::new(&self.config.workdir).join(rel);
        joined
            .to_str()
            .map(str::to_owned)
            .ok_or_else(|| Error::Refused(format!("{rel:?} is not UTF-8, which Docker needs")))
    }

    /// Checks that the directory `rel` exists and, with links resolved, stays inside the
    /// working directory (the first process checks a command's directory that way). `what`
    /// names it in errors.
    async fn check_dir(
        &self,
        id: &SandboxId,
        held: &mut Turn,
        rel: &Path,
        what: &str,
    ) -> Result<(), Error> {
        let dir = self.inside(rel)?;
        let ran = self
            .run_command(id, held, &dir, "true", Bounds::helper(0))
            .await?;
        match ran {
            Ran::Ended(reading) => match reading.status()? {
                Status::Exited(_) => Ok(()),
                Status::MissingDir => Err(Error::Refused(format!("{what} does not exist"))),
                Status::OutsideDir => Err(Error::Refused(format!(
                    "{what} leads outside the working directory"
                ))),
            },
            _ => Err(Error::Failed(format!(
                "checking {what} in the container did not finish"
            ))),
        }
    }

    /// What is at each of `rel_paths` in the working directory, without following a final
    /// link.
    async fn look_up(
        &self,
        id: &SandboxId,
        held: &mut Turn,
        rel_paths: &[PathBuf],
    ) -> Result<HashMap<PathBuf, OnDisk>, Error> {
        const SCRIPT: &str = "for p in \"$@\"; do \
            if [ -L \"$p\" ]; then echo L; elif [ -d \"$p\" ]; then echo D; \
            elif [ -e \"$p\" ]; then echo O; else echo M; fi; done";
        let mut found = HashMap::new();
        let mut rest = rel_paths;
        while !rest.is_empty() {
            let mut args = Vec::new();
            let mut bytes = 0;
            for path in rest {
                let text = path.to_str().ok_or_else(|| {
                    Error::Refused(format!(
                        "archive entry {path:?} is not UTF-8, which Docker needs"
                    ))
                })?;
                let arg = format!("./{text}");
                // The script travels as one argument of `/bin/sh -c`, which Linux caps.
                let quoted = framing::quote(&arg).len() + 1;
                if !args.is_empty() && bytes + quoted > LOOKUP_BATCH_BYTES {
                    break;
                }
                bytes += quoted;
                args.push(arg);
            }
            let (batch, later) = rest.split_at(args.len());
            rest = later;
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let (code, out, err) = self.helper(id, held, SCRIPT, &args).await?;
            let answers = String::from_utf8_lossy(&out.bytes).into_owned();
            let answers: Vec<&str> = answers.lines().collect();
            if code != 0 || answers.len() != batch.len() {
                return Err(Error::Failed(format!(
                    "looking up paths in the container failed: {}",
                    String::from_utf8_lossy(&err.bytes).trim()
                )));
            }
            for (path, answer) in batch.iter().zip(answers) {
                let kind = match answer {
                    "L" => OnDisk::Symlink,
                    "D" => OnDisk::Dir,
                    "O" => OnDisk::Other,
                    _ => OnDisk::Missing,
                };
                found.insert(path.clone(), kind);
            }
        }
        Ok(found)
    }
}

#[async_trait]
impl Sandbox for DockerSandbox {
    /// A container is created from the spec's image (the configured default when it names
    /// none).
    fn supports_image(&self) -> bool {
        true
    }

    /// On an engine of this host, when the server gave the backend its egress proxy.
    fn supports_egress(&self) -> bool {
        self.egress.is_some() && DockerEgress::reaches(&self.config.endpoint).is_none()
    }

    /// The image's content digest: the `RepoDigests` entry of the reference's repository
    /// (`name@sha256:…`, or the first entry) for an image that came from a registry, else its
    /// ID (`sha256:…`). An image the engine lacks is pulled first; one it cannot pull is
    /// refused.
    async fn resolve_image(&self, reference: &str) -> Result<String, Error> {
        // The reference goes into the engine's request path: only a well-formed one.
        nodus_core::validate::check_image_reference("image", reference)
            .map_err(|invalid| Error::Refused(invalid.to_string()))?;
        let found = match self.docker.inspect_image(reference).await {
            Ok(found) => found,
            Err(e) if status(&e) == Some(404) => {
                self.pull(reference).await?;
                self.docker
                    .inspect_image(reference)
                    .await
                    .map_err(|e| match status(&e) {
                        Some(404) => Error::Refused(format!(
                            "image {reference:?} is not available here even after a pull: {e}"
                        )),
                        _ => api_error("inspecting the image", e),
                    })?
            }
            Err(e) if status(&e) == Some(400) => {
                return Err(Error::Refused(format!(
                    "{reference:?} is not an image reference: {e}"
                )));
            }
            Err(e) => return Err(api_error("inspecting the image", e)),
        };
        content_digest(
            reference,
            found.repo_digests.as_deref(),
            found.id.as_deref(),
        )
        .ok_or_else(|| Error::Failed(format!("the engine reported no ID for image {reference:?}")))
    }

    async fn create(&self, spec: &SandboxSpec) -> Result<SandboxInfo, Error> {
        paths::check_key(&spec.key).map_err(Error::Refused)?;
        check_env(&spec.env)?;
        nodus_core::sandbox::check_links(&spec.links, &self.config.workdir)
            .map_err(Error::Refused)?;
        let name = self.name(&spec.key);
        let wiring = self.wire(spec).await?;
        // Most creations are new: try that first, and re-attach when the name is taken (or
        // make it again when it goes to another egress proxy than this server's).
        let mut made = self.create_container(spec, &name, wiring.as_ref()).await?;
        if !made && self.rewire(spec, &name, wiring.as_ref()).await? {
            made = self.create_container(spec, &name, wiring.as_ref()).await?;
        }
        if made {
            // Attach as `docker run` does, before the first process starts, so that nothing
            // it says is missed; both requests travel together.
            let (attached, started) =
                tokio::join!(Channel::attach(&self.docker, &name), self.start(&name));
            started?;
            let channel = attached.map_err(|e| api_error("attaching to the container", e))?;
            self.slot_of(&SandboxId(name.clone())).lock().await.channel = Some(channel);
            debug!(container = %name, "Docker sandbox ready");
        } else {
            let found = match self.docker.inspect_container(&name, None).await {
                Ok(found) => found,
                Err(e) if status(&e) == Some(404) => {
                    return Err(Error::Unavailable(format!(
                        "the container {name} was removed while it was being re-attached"
                    )));
                }
                Err(e) => return Err(api_error("inspecting the container", e)),
            };
            let key = found
                .config
                .as_ref()
                .and_then(|c| c.labels.as_ref())
                .and_then(|l| l.get(KEY_LABEL));
            if key != Some(&spec.key) {
                return Err(Error::Refused(format!(
                    "a container named {name} exists and is not this sandbox's"
                )));
            }
            let running = found.state.as_ref().and_then(|s| s.running) == Some(true);
            if !running {
                self.start(&name).await?;
            }
            debug!(container = %name, "re-attached to a Docker sandbox");
        }
        self.created
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(name.clone(), spec.limits);
        Ok(SandboxInfo {
            id: SandboxId(name),
            isolated: true,
            host: None,
        })
    }

    async fn exec(&self, id: &SandboxId, request: &ExecRequest) -> Result<ExecOutput, Error> {
        self.exec_reporting(id, request, None).await
    }

    async fn exec_live(
        &self,
        id: &SandboxId,
        request: &ExecRequest,
        live: Arc<dyn LiveOutput>,
    ) -> Result<ExecOutput, Error> {
        self.exec_reporting(id, request, Some(&live)).await
    }

    async fn put_files(&self, id: &SandboxId, tar: Vec<u8>) -> Result<(), Error> {
        self.limits_of(id)?;
        let touched = archive::touched(&tar)?;
        let slot = self.slot_of(id);
        let mut held = slot.lock().await;
        let on_disk = if touched.is_empty() {
            HashMap::new()
        } else {
            self.look_up(id, &mut held, &touched).await?
        };
        archive::check(&tar, &|path| {
            on_disk.get(path).copied().unwrap_or(OnDisk::Missing)
        })?;
        let options = UploadToContainerOptionsBuilder::new()
            .path(&self.config.workdir)
            .build();
        match self
            .docker
            .upload_to_container(&id.0, Some(options), bollard::body_full(tar.into()))
            .await
        {
            Ok(()) => Ok(()),
            Err(e) if status(&e) == Some(404) => Err(Error::NotFound(id.clone())),
            Err(e) => Err(api_error("unpacking the archive", e)),
        }
    }

    async fn list_files(
        &self,
        id: &SandboxId,
    ) -> Result<Vec<nodus_core::snapshot::FileStat>, Error> {
        self.list_host_or_archive(id).await
    }

    async fn changes(&self, id: &SandboxId) -> Result<nodus_core::snapshot::Changes, Error> {
        self.changes_on_host(id).await
    }

    async fn get_files(
        &self,
        id: &SandboxId,
        path: &str,
        max_bytes: usize,
    ) -> Result<Vec<u8>, Error> {
        self.limits_of(id)?;
        // Docker's archive is a little larger than the one made of it (headers for the
        // working directory itself): allow one more header and padding while downloading.
        let max = max_bytes.min(MAX_ARCHIVE_BYTES);
        let download_max = max.saturating_add(4096).min(MAX_ARCHIVE_BYTES);
        let rel = paths::relative(Path::new(path))
            .map_err(|why| Error::Refused(format!("path {path:?} {why}")))?;
        let slot = self.slot_of(id);
        let mut held = slot.lock().await;
        if let Some(parent) = rel.parent().filter(|p| !p.as_os_str().is_empty()) {
            self.check_dir(id, &mut held, parent, &format!("{path:?}"))
                .await?;
        }
        let options = DownloadFromContainerOptionsBuilder::new()
            .path(&self.inside(&rel)?)
            .build();
        let mut stream = self.docker.download_from_container(&id.0, Some(options));
        let mut tar = Vec::new();
        while let Some(chunk) = stream.next().await {
            match chunk {
                Ok(bytes) => {
                    tar.extend_from_slice(&bytes);
                    if tar.len() > download_max {
                        archive::check_cap(tar.len(), max)?;
                    }
                }
                Err(e) if status(&e) == Some(404) => {
                    return Err(Error::Refused(format!("{path:?} does not exist")));
                }
                Err(e) => return Err(api_error("archiving", e)),
            }
        }
        // Docker names entries from the last component of the path; name them from the
        // working directory instead, leaving out the working directory itself.
        let whole = rel.as_os_str().is_empty();
        let prefix = rel.parent().map(Path::to_path_buf).unwrap_or_default();
        let (tar, left_out) = archive::rebase(
            &tar,
            &|entry| {
                if whole {
                    let mut parts = entry
                        .components()
                        .filter(|c| !matches!(c, Component::CurDir));
                    parts.next();
                    let rest: PathBuf = parts.collect();
                    (!rest.as_os_str().is_empty()).then_some(rest)
                } else {
                    Some(prefix.join(entry))
                }
            },
            max,
        )?;
        if !whole && left_out.contains(&rel) {
            return Err(Error::Refused(format!(
                "{path:?} is a symbolic link that leads outside the working directory"
            )));
        }
        Ok(tar)
    }

    async fn suspend(&self, id: &SandboxId) -> Result<(), Error> {
        let made_here = self
            .created
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .contains_key(&id.0);
        if !made_here {
            return Ok(());
        }
        let slot = self.slot_of(id);
        let mut held = slot.lock().await;
        if let Some(killing) = held.killing.take() {
            let _ = killing.await;
        }
        // The next command attaches again, which starts the container.
        held.channel = None;
        let options = StopContainerOptionsBuilder::new().t(0).build();
        match self.docker.stop_container(&id.0, Some(options)).await {
            Ok(()) => Ok(()),
            // Stopped already, or gone.
            Err(e) if matches!(status(&e), Some(304 | 404)) => Ok(()),
            Err(e) => Err(api_error("stopping the container", e)),
        }
    }

    async fn destroy(&self, id: &SandboxId) -> Result<(), Error> {
        // An id this backend cannot have issued names no sandbox: nothing to remove.
        let Some(key) = self.key_of(id) else {
            return Ok(());
        };
        if let Some(egress) = &self.egress {
            egress.close(key);
        }
        self.forget_host_dir(id);
        let made_here = self
            .created
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .contains_key(&id.0);
        // A container this value created or re-attached to was checked then; any other must
        // carry this sandbox's label before it is removed.
        let found = if made_here {
            Ok(None)
        } else {
            self.docker.inspect_container(&id.0, None).await.map(Some)
        };
        match found {
            Ok(None) => {}
            Ok(Some(found)) => {
                let label = found
                    .config
                    .as_ref()
                    .and_then(|c| c.labels.as_ref())
                    .and_then(|l| l.get(KEY_LABEL));
                if label.map(String::as_str) != Some(key) {
                    return Err(Error::Refused(format!(
                        "the container {id} is not a sandbox of this backend"
                    )));
                }
            }
            Err(e) if status(&e) == Some(404) => {}
            Err(e) => return Err(api_error("inspecting the container", e)),
        }
        self.created
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&id.0);
        self.remove(&id.0).await?;
        self.slots
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&id.0);
        Ok(())
    }
}

/// How a command sent through the channel came out.
enum Ran {
    /// Both end markers came.
    Ended(Reading),
    /// The timeout hit; what the command printed until then (and during the kill).
    TimedOut(Reading),
    /// The disk watch stopped it, for this reason; what it printed until then.
    Stopped(Reading, String),
    /// The first process's streams ended first.
    Closed(Reading),
}

/// What bounds one command: its timeout, the bytes kept of each stream, and the disk watch
/// with the working directory's size when it started.
#[derive(Clone, Copy)]
struct Bounds<'a> {
    timeout: Duration,
    cap: usize,
    watch: Option<(&'a Watch, u64)>,
    /// Where the command's output is reported as it arrives.
    live: Option<&'a Arc<dyn LiveOutput>>,
}

impl Bounds<'_> {
    /// A helper script of the backend's own: [`HELPER_TIMEOUT`], `cap`, no disk watch.
    fn helper(cap: usize) -> Self {
        Bounds {
            timeout: HELPER_TIMEOUT,
            cap,
            watch: None,
            live: None,
        }
    }
}

/// Kills the processes of a container when a command's future is dropped before it finished,
/// from a task that the slot's next holder waits for ([`Turn::killing`]).
struct KillOnDrop<'a> {
    sandbox: Option<DockerSandbox>,
    name: String,
    killing: &'a mut Option<tokio::task::JoinHandle<()>>,
}

impl Drop for KillOnDrop<'_> {
    fn drop(&mut self) {
        let Some(sandbox) = self.sandbox.take() else {
            return;
        };
        let name = std::mem::take(&mut self.name);
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                *self.killing = Some(runtime.spawn(async move {
                    sandbox.kill_all(&name).await;
                }));
            }
            Err(_) => {
                warn!(container = %name, "a command was dropped outside a runtime; it may still run")
            }
        }
    }
}

/// The HTTP status of an engine's answer.
/// The immutable reference of an image `reference` found: the `repo_digests` entry of the
/// reference's repository (the first entry when none is), else the image's `id`.
fn content_digest(
    reference: &str,
    repo_digests: Option<&[String]>,
    id: Option<&str>,
) -> Option<String> {
    let digests = repo_digests.unwrap_or_default();
    let repository = repository_of(reference);
    digests
        .iter()
        .find(|entry| entry.split_once('@').map(|(name, _)| name) == Some(repository))
        .or_else(|| digests.first())
        .cloned()
        .or_else(|| id.map(str::to_owned))
}

/// The repository of an image reference: without its `@digest` and its `:tag` (a colon
/// before the last `/` is a registry's port, not a tag).
fn repository_of(reference: &str) -> &str {
    let named = reference
        .split_once('@')
        .map_or(reference, |(name, _)| name);
    match named.rfind(':') {
        Some(colon) if !named[colon..].contains('/') => &named[..colon],
        _ => named,
    }
}

fn status(e: &DockerError) -> Option<u16> {
    match e {
        DockerError::DockerResponseServerError { status_code, .. } => Some(*status_code),
        _ => None,
    }
}

fn unavailable(config: &DockerConfig, e: DockerError) -> Error {
    Error::Unavailable(format!("cannot reach Docker at {}: {e}", config.endpoint))
}

/// An engine error while doing `what`: retryable when the engine could not be reached or
/// answered 5xx, a failure otherwise.
fn api_error(what: &str, e: DockerError) -> Error {
    match &e {
        DockerError::DockerResponseServerError { status_code, .. } if *status_code >= 500 => {
            Error::Unavailable(format!("{what}: {e}"))
        }
        DockerError::DockerResponseServerError {
            status_code,
            message,
        } => Error::Failed(format!("{what}: {status_code} {message}")),
        DockerError::RequestTimeoutError
        | DockerError::IOError { .. }
        | DockerError::HyperResponseError { .. }
        | DockerError::SocketNotFoundError(_) => Error::Unavailable(format!("{what}: {e}")),
        _ => Error::Failed(format!("{what}: {e}")),
    }
}

/// Whether `dir` is a directory this process can list.
async fn fs_readable(dir: &Path) -> bool {
    tokio::fs::read_dir(dir).await.is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_image_is_pinned_to_its_repository_digest_or_else_its_id() {
        let digests = [
            "mirror.example:5000/tools/busybox@sha256:aaa".to_owned(),
            "busybox@sha256:bbb".to_owned(),
        ];
        let pinned = |reference, digests: Option<&[String]>| {
            content_digest(reference, digests, Some("sha256:id"))
        };
        assert_eq!(
            pinned("busybox:latest", Some(&digests)).as_deref(),
            Some("busybox@sha256:bbb")
        );
        assert_eq!(
            pinned("mirror.example:5000/tools/busybox", Some(&digests)).as_deref(),
            Some("mirror.example:5000/tools/busybox@sha256:aaa")
        );
        assert_eq!(
            pinned("docker.io/library/busybox:1.36", Some(&digests)).as_deref(),
            Some("mirror.example:5000/tools/busybox@sha256:aaa"),
            "no entry of its own repository: the first"
        );
        assert_eq!(pinned("local:dev", Some(&[])).as_deref(), Some("sha256:id"));
        assert_eq!(pinned("local:dev", None).as_deref(), Some("sha256:id"));
        assert_eq!(content_digest("local:dev", None, None), None);
    }

    #[test]
    fn a_reference_s_repository_has_no_tag_or_digest() {
        assert_eq!(repository_of("busybox"), "busybox");
        assert_eq!(repository_of("busybox:latest"), "busybox");
        assert_eq!(repository_of("busybox@sha256:abc"), "busybox");
        assert_eq!(repository_of("busybox:1.36@sha256:abc"), "busybox");
        assert_eq!(repository_of("host:5000/team/app"), "host:5000/team/app");
        assert_eq!(repository_of("host:5000/team/app:v2"), "host:5000/team/app");
    }
}

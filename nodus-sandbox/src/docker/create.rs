//! Container creation for the Docker backend: the container and its volume, with the
//! directories its links bind made first in a container without them.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;

use bollard::models::{
    ContainerCreateBody, HostConfig, HostConfigLogConfig, Mount, MountType, MountVolumeOptions,
    ResourcesUlimits,
};
use bollard::query_parameters::{
    ContainerArchiveInfoOptionsBuilder, CreateContainerOptionsBuilder,
    RemoveContainerOptionsBuilder, UploadToContainerOptionsBuilder,
};
use nodus_core::sandbox::{Error, SandboxSpec};

use super::{DockerSandbox, api_error, egress, status};
use crate::channel as framing;
use crate::cpus::{cpu_list, sandbox_cpus};

impl DockerSandbox {
    /// Creates the container (and its volume, unless it is left from before). Answers
    /// `Ok(false)` when a container of that name exists already.
    ///
    /// [`SandboxSpec::links`] are the volume's directories bound again at their paths (the
    /// root file system is read-only, so no symbolic link can be made there; a volume's
    /// `subpath` needs Docker Engine API 1.45, and Debian's engine speaks 1.41): the source of
    /// each bind is the directory under the volume's mount point on the engine's host. A bind
    /// source must exist before its container starts, so a sandbox with links is made in two
    /// steps: a container without them, into which the directories are unpacked (the archive
    /// API reaches a created container's volume) and in which each directory on the way is
    /// checked to be a directory and no symbolic link (the engine would follow a link on its
    /// own host: a working directory made again over an agent's files must not lead a bind
    /// out of the volume), is removed (its volume kept) and made again with them. Nothing runs
    /// in the volume between the check and the bind. Each step is repeated safely: a crash
    /// between them leaves no container, and the next creation starts over.
    pub(super) async fn create_container(
        &self,
        spec: &SandboxSpec,
        name: &str,
        wiring: Option<&egress::Wiring>,
    ) -> Result<bool, Error> {
        if spec.links.is_empty() {
            return self
                .create_container_with(spec, name, &BTreeMap::new(), wiring)
                .await;
        }
        if !self
            .create_container_with(spec, name, &BTreeMap::new(), wiring)
            .await?
        {
            return Ok(false);
        }
        let dirs = link_dirs(spec)?;
        let options = UploadToContainerOptionsBuilder::new()
            .path(&self.config.workdir)
            .build();
        let made = match self
            .docker
            .upload_to_container(name, Some(options), bollard::body_full(dirs.into()))
            .await
        {
            Ok(()) => self.link_sources(spec, name).await,
            Err(e) => Err(api_error("making the linked directories", e)),
        };
        let options = RemoveContainerOptionsBuilder::new()
            .force(true)
            .v(false)
            .build();
        let removed = self
            .docker
            .remove_container(name, Some(options))
            .await
            .map_err(|e| api_error("removing the container made for the links", e));
        let sources = made?;
        removed?;
        self.create_container_with(spec, name, &sources, wiring)
            .await
    }

    /// The host directory each of [`SandboxSpec::links`] binds (by its path in the
    /// container), once every directory on the way to it in the created container `name` is
    /// a directory and no symbolic link.
    async fn link_sources(
        &self,
        spec: &SandboxSpec,
        name: &str,
    ) -> Result<BTreeMap<String, String>, Error> {
        /// Go's `os.ModeDir` and `os.ModeSymlink`, as the archive API reports a path's mode.
        const MODE_DIR: u32 = 1 << 31;
        const MODE_SYMLINK: u32 = 1 << 27;
        let volume = self
            .docker
            .inspect_volume(name)
            .await
            .map_err(|e| api_error("reading the working directory's volume", e))?;
        let mut sources = BTreeMap::new();
        for (path, target) in &spec.links {
            let mut on_the_way = PathBuf::new();
            for part in target.split('/') {
                on_the_way.push(part);
                let inside = self.inside(&on_the_way)?;
                let options = ContainerArchiveInfoOptionsBuilder::new()
                    .path(&inside)
                    .build();
                let stat = self
                    .docker
                    .get_container_archive_info(name, Some(options))
                    .await
                    .map_err(|e| api_error("checking a linked directory", e))?;
                if stat.file_mode & MODE_SYMLINK != 0 || stat.file_mode & MODE_DIR == 0 {
                    return Err(Error::Refused(format!(
                        "link {path}: {} in the working directory must be a directory, not a \
                         symbolic link or a file",
                        on_the_way.display()
                    )));
                }
            }
            let source = format!("{}/{target}", volume.mountpoint.trim_end_matches('/'));
            sources.insert(path.clone(), source);
        }
        Ok(sources)
    }

    /// Creates the container, with `links` (path in the container to the host directory it
    /// binds; empty for none), on the egress network when `wiring` says so.
    async fn create_container_with(
        &self,
        spec: &SandboxSpec,
        name: &str,
        links: &BTreeMap<String, String>,
        wiring: Option<&egress::Wiring>,
    ) -> Result<bool, Error> {
        let image = spec
            .image
            .clone()
            .unwrap_or_else(|| self.config.default_image.clone());
        let labels = self.labels(&spec.key);
        let limits = &spec.limits;
        let memory = i64::try_from(limits.memory_bytes).unwrap_or(i64::MAX);
        let mut env: Vec<String> = vec![format!("HOME={}", self.config.workdir)];
        env.extend(spec.env.iter().map(|(k, v)| format!("{k}={v}")));
        env.extend(wiring.iter().flat_map(|w| w.env.iter().cloned()));
        let network_mode = match wiring {
            Some(wiring) => wiring.network.clone(),
            None if spec.network => "bridge".to_owned(),
            None => "none".to_owned(),
        };
        let body = ContainerCreateBody {
            image: Some(image.clone()),
            entrypoint: Some(vec![
                "/bin/sh".to_owned(),
                "-c".to_owned(),
                framing::FIRST_PROCESS.to_owned(),
                "nodus".to_owned(),
                self.config.workdir.clone(),
            ]),
            open_stdin: Some(true),
            stdin_once: Some(false),
            attach_stdin: Some(true),
            attach_stdout: Some(true),
            attach_stderr: Some(true),
            env: Some(env),
            working_dir: Some(self.config.workdir.clone()),
            labels: Some(labels.clone()),
            hostname: Some("nodus".to_owned()),
            host_config: Some(HostConfig {
                network_mode: Some(network_mode),
                memory: Some(memory),
                memory_swap: Some(memory),
                nano_cpus: Some(i64::from(limits.cpu_millis) * 1_000_000),
                // As many whole CPUs as the quota rounds up to, so that `nproc` agrees.
                cpuset_cpus: sandbox_cpus(&self.engine_cpus, limits.cpu_millis)
                    .map(|cpus| cpu_list(&cpus)),
                pids_limit: Some(i64::from(limits.processes)),
                // No file larger than the disk limit (RLIMIT_FSIZE counts bytes).
                ulimits: Some(vec![ResourcesUlimits {
                    name: Some("fsize".to_owned()),
                    soft: Some(i64::try_from(limits.disk_bytes).unwrap_or(i64::MAX)),
                    hard: Some(i64::try_from(limits.disk_bytes).unwrap_or(i64::MAX)),
                }]),
                readonly_rootfs: Some(true),
                tmpfs: Some(HashMap::from([(
                    "/tmp".to_owned(),
                    format!("rw,nosuid,nodev,size={}", limits.memory_bytes),
                )])),
                // The engine makes the named volume, with these labels, if it is missing.
                mounts: Some(
                    std::iter::once(Mount {
                        target: Some(self.config.workdir.clone()),
                        source: Some(name.to_owned()),
                        typ: Some(MountType::VOLUME),
                        volume_options: Some(MountVolumeOptions {
                            labels: Some(labels.clone()),
                            ..Default::default()
                        }),
                        ..Default::default()
                    })
                    .chain(links.iter().map(|(path, source)| Mount {
                        target: Some(path.clone()),
                        source: Some(source.clone()),
                        typ: Some(MountType::BIND),
                        ..Default::default()
                    }))
                    .chain(wiring.and_then(|w| w.mount.clone()))
                    .collect(),
                ),
                cap_drop: Some(vec!["ALL".to_owned()]),
                security_opt: Some(vec!["no-new-privileges".to_owned()]),
                // Output reaches the backend through the attachment only; a log kept by the
                // engine would fill the host's disk with whatever a command prints.
                log_config: Some(HostConfigLogConfig {
                    typ: Some("none".to_owned()),
                    config: None,
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let options = CreateContainerOptionsBuilder::new().name(name).build();
        let mut pulled = false;
        loop {
            match self
                .docker
                .create_container(Some(options.clone()), body.clone())
                .await
            {
                Ok(_) => return Ok(true),
                Err(e) if status(&e) == Some(409) => return Ok(false),
                Err(e) if status(&e) == Some(404) && !pulled => {
                    self.pull(&image).await?;
                    pulled = true;
                }
                Err(e) if status(&e) == Some(404) => {
                    return Err(Error::Refused(format!(
                        "image {image:?} is not available: {e}"
                    )));
                }
                Err(e) => return Err(api_error("creating the container", e)),
            }
        }
    }
}

/// A tar archive of the directories [`SandboxSpec::links`] lead to (and those above them),
/// relative to the working directory, writable by the sandbox's user whoever the image makes it.
fn link_dirs(spec: &SandboxSpec) -> Result<Vec<u8>, Error> {
    let mut dirs = BTreeSet::new();
    for target in spec.links.values() {
        let mut path = PathBuf::new();
        for part in target.split('/') {
            path.push(part);
            dirs.insert(path.clone());
        }
    }
    let mut builder = tar::Builder::new(Vec::new());
    for dir in dirs {
        let mut header = tar::Header::new_gnu();
        header.set_entry_type(tar::EntryType::Directory);
        header.set_mode(0o777);
        header.set_size(0);
        builder
            .append_data(&mut header, &dir, std::io::empty())
            .map_err(|e| Error::Failed(format!("packing the linked directories: {e}")))?;
    }
    builder
        .into_inner()
        .map_err(|e| Error::Failed(format!("packing the linked directories: {e}")))
}

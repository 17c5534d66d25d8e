//! A run's working directory staged from FileSets: the references are resolved when the run
//! is created (a missing FileSet or file fails the request, not the run) and the files they
//! name are packed then, as one tar archive kept beside the run (in its
//! [`Kind::WorkdirArchive`] document, as `input`) and recorded in its snapshot by SHA-256
//! and the FileSets' versions, so that changing or deleting a FileSet afterwards does not
//! change the run. That archive is put into the sandbox when it is created. When the run
//! ends, before its sandbox is deleted, the final working directory is kept in the same
//! document for [`Engine::output_workdir`]. A base may be a whole FileSet or a directory of
//! one (`fileset#path/`), whose files are staged relative to it.
//!
//! Memory stays bounded: each FileSet is read once however many mounts name it, the bytes a
//! working directory stages are counted from the files' stored sizes before anything is
//! decoded or copied (more than [`MAX_STAGED_WORKDIR_BYTES`] refuses the run at creation),
//! and the sandbox stops packing the final working directory as soon as it would exceed
//! [`MAX_KEPT_WORKDIR_BYTES`].

use std::collections::BTreeMap;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;

use super::{Engine, Error, Result, typed};
use crate::resource::{FileEntry, FileSetSpec, FileSetVersion, Kind, WorkdirSnapshot, WorkdirSpec};
use crate::sandbox::SandboxId;
use crate::secret::PinnedSecrets;
use crate::store::{self, ObjectKey};
use crate::validate::Invalid;

/// The largest final working directory kept (a larger one is recorded as omitted).
pub const MAX_KEPT_WORKDIR_BYTES: usize = 16 << 20;

/// The most bytes a working directory stages from FileSets: 64 MiB, counting every file of
/// `baseWorkdir` and every artifact mount (each mount again, even of the same file), with
/// [`STAGED_ENTRY_OVERHEAD`] for each.
pub const MAX_STAGED_WORKDIR_BYTES: u64 = 64 << 20;

/// What one staged file adds to the staging archive beyond its bytes (its header and
/// padding), counted against [`MAX_STAGED_WORKDIR_BYTES`] with its path.
pub const STAGED_ENTRY_OVERHEAD: u64 = 1024;

pub use crate::store::workdir_archive_key;

/// A run's final working directory, as far as it was kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OutputWorkdir {
    /// The tar archive.
    Archive(Vec<u8>),
    /// Why there is none (too large, or the sandbox could not give it).
    Omitted(String),
}

/// What a run keeps of its working directory when it is created: the staged archive, and
/// its snapshot.
pub(super) struct InputWorkdir {
    /// The tar archive the sandbox starts from.
    pub tar: Vec<u8>,
    /// Its digest and the FileSets' versions.
    pub snapshot: WorkdirSnapshot,
}

/// A file of the working directory: where it goes, its bytes and whether it may be run.
pub(super) struct Staged<'a> {
    pub(super) path: &'a str,
    pub(super) bytes: Vec<u8>,
    pub(super) executable: bool,
}

impl<'a> Staged<'a> {
    fn new(path: &'a str, file: &FileEntry) -> Result<Self> {
        let bytes = file.bytes().map_err(|e| Error::Corrupt {
            key: path.to_string(),
            message: format!("a stored file is not base64: {e}"),
        })?;
        Ok(Staged {
            path,
            bytes,
            executable: file.executable,
        })
    }
}

impl Engine {
    /// Resolve `workdir` in `project` now: the archive the run will start from, its SHA-256
    /// and the versions of the FileSets it was read from.
    pub(super) async fn snapshot_workdir(
        &self,
        project: &str,
        workdir: &WorkdirSpec,
    ) -> Result<InputWorkdir> {
        let (tar, file_sets) = self.workdir_archive_with_versions(project, workdir).await?;
        Ok(InputWorkdir {
            snapshot: WorkdirSnapshot {
                sha256: crate::digest::sha256_hex(&tar),
                bytes: tar.len() as u64,
                file_sets,
            },
            tar,
        })
    }

    /// The document that keeps what is private to a run beside it, written with the run:
    /// its staged working directory (`input`) and the Secret values it reads, sealed
    /// (`pinnedSecrets`); `None` when it has neither.
    pub(super) fn private_document(
        &self,
        input: Option<&InputWorkdir>,
        pinned: &PinnedSecrets,
    ) -> Result<Option<serde_json::Value>> {
        let mut document = serde_json::Map::new();
        if let Some(input) = input {
            document.insert(
                "input".to_string(),
                serde_json::json!({
                    "sha256": input.snapshot.sha256,
                    "bytes": input.snapshot.bytes,
                    "archiveBase64": BASE64.encode(&input.tar),
                }),
            );
        }
        if !pinned.is_empty() {
            let sealed = pinned.seal(self.deps.secrets.as_ref())?;
            document.insert("pinnedSecrets".to_string(), sealed.into());
        }
        Ok((!document.is_empty()).then_some(serde_json::Value::Object(document)))
    }

    /// The staged archive of `run` as kept when it was created, checked against `snapshot`.
    pub(super) async fn kept_input(
        &self,
        run: &ObjectKey,
        snapshot: &WorkdirSnapshot,
    ) -> Result<Vec<u8>> {
        let key = workdir_archive_key(run);
        let corrupt = |message: String| Error::Corrupt {
            key: key.to_string(),
            message,
        };
        let record = self.deps.store.get(&key).await?;
        let encoded = record.document["input"]["archiveBase64"]
            .as_str()
            .ok_or_else(|| corrupt("the staged working directory is not kept".to_string()))?;
        let tar = BASE64
            .decode(encoded)
            .map_err(|e| corrupt(format!("the staged working directory is not base64: {e}")))?;
        let digest = crate::digest::sha256_hex(&tar);
        if digest != snapshot.sha256 {
            return Err(corrupt(format!(
                "the staged working directory's SHA-256 is {digest}, and the run recorded {}",
                snapshot.sha256
            )));
        }
        Ok(tar)
    }

    /// The working directory that `workdir` describes, as a tar archive.
    pub(super) async fn workdir_archive(
        &self,
        project: &str,
        workdir: &WorkdirSpec,
    ) -> Result<Vec<u8>> {
        Ok(self
            .workdir_archive_with_versions(project, workdir)
            .await?
            .0)
    }

    async fn workdir_archive_with_versions(
        &self,
        project: &str,
        workdir: &WorkdirSpec,
    ) -> Result<(Vec<u8>, Vec<FileSetVersion>)> {
        let sets = self.workdir_files(project, workdir).await?;
        let mut staged: Vec<Staged<'_>> = Vec::new();
        if let Some((base, prefix)) = &sets.base {
            for file in &base.files {
                if let Some(path) = under(&file.path, prefix) {
                    staged.push(Staged::new(path, file)?);
                }
            }
        }
        for mount in &workdir.artifact_mounts {
            let (set, path) = split_ref(&mount.reference).unwrap_or_default();
            if let Some(file) = sets.mounted.get(set).and_then(|set| set.file(path)) {
                staged.push(Staged::new(&mount.mount_path, file)?);
            }
        }
        let tar = archive(&staged).map_err(|e| -> Error {
            Invalid::new("spec.workdir", "must make a tar archive", e.to_string()).into()
        })?;
        Ok((tar, sets.versions))
    }

    /// Keep the final working directory of `run` (whose sandbox is `sandbox`), once: a repeat
    /// after a crash finds it kept. Best effort: a failure is kept as the reason.
    ///
    /// Most runs have no such document yet (no staged input, no pinned Secrets): the kept
    /// directory is created without a read first; only when the document exists is it read,
    /// and merged into unless it holds the output already (a repeat after a crash).
    pub(super) async fn keep_workdir(&self, run: &ObjectKey, sandbox: &SandboxId) {
        let key = workdir_archive_key(run);
        // The sandbox stops packing at the cap: no more than it is ever held.
        let packed = self
            .deps
            .sandbox
            .get_files(sandbox, "", MAX_KEPT_WORKDIR_BYTES)
            .await;
        let document = match packed {
            Ok(tar) if tar.len() > MAX_KEPT_WORKDIR_BYTES => serde_json::json!({
                "bytes": tar.len(),
                "omitted": format!("the working directory is {} bytes, more than the {MAX_KEPT_WORKDIR_BYTES} kept", tar.len()),
            }),
            Ok(tar) => {
                serde_json::json!({ "bytes": tar.len(), "archiveBase64": BASE64.encode(&tar) })
            }
            Err(e) => {
                serde_json::json!({ "omitted": format!("the sandbox could not give it: {e}") })
            }
        };
        // Each store call tried again while the store is unavailable, as the executor's
        // others: the directory is packed already, and the sandbox goes once this returns.
        let created = self
            .retrying(|| self.deps.store.create(&key, document.clone()))
            .await;
        let written = match created {
            // The document holds the staged input (kept when the run was created), or the
            // output kept before a crash.
            Err(store::Error::AlreadyExists(_)) => match self
                .retrying(|| self.deps.store.get(&key))
                .await
            {
                Ok(record)
                    if record.document.get("archiveBase64").is_some()
                        || record.document.get("omitted").is_some() =>
                {
                    return;
                }
                Ok(record) => {
                    let mut merged = record.document;
                    if let (Some(merged), serde_json::Value::Object(output)) =
                        (merged.as_object_mut(), document)
                    {
                        merged.extend(output);
                    }
                    self.retrying(|| self.deps.store.update(&key, record.version, merged.clone()))
                        .await
                }
                Err(e) => Err(e),
            },
            other => other,
        };
        match written {
            Ok(_) | Err(store::Error::Conflict { .. }) => {}
            Err(e) => {
                tracing::warn!(run = %run, error = %e, "cannot keep the final working directory")
            }
        }
    }

    /// The final working directory of a run with `spec.workdir`, kept when it ended; `None`
    /// when there is none (the run has not ended, or it was removed
    /// by retention).
    pub async fn output_workdir(&self, project: &str, name: &str) -> Result<Option<OutputWorkdir>> {
        self.read_run(project, name).await?;
        let key = workdir_archive_key(&ObjectKey::new(project, Kind::AgentRun, name));
        let record = match self.deps.store.get(&key).await {
            Ok(record) => record,
            Err(store::Error::NotFound(_)) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        if let Some(archive) = record.document["archiveBase64"].as_str() {
            let tar = BASE64.decode(archive).map_err(|e| Error::Corrupt {
                key: key.to_string(),
                message: format!("the kept archive is not base64: {e}"),
            })?;
            return Ok(Some(OutputWorkdir::Archive(tar)));
        }
        match record.document["omitted"].as_str() {
            Some(reason) => Ok(Some(OutputWorkdir::Omitted(reason.to_string()))),
            // Only the staged input so far: the run has not ended.
            None => Ok(None),
        }
    }

    /// The FileSets `workdir` names, read and checked: each once, however many mounts name
    /// it, and the bytes they stage counted from stored sizes before any is decoded.
    async fn workdir_files(&self, project: &str, workdir: &WorkdirSpec) -> Result<Sets> {
        let mut staged = StagedBytes::default();
        let mut versions: Vec<FileSetVersion> = Vec::new();
        let base = match &workdir.base_workdir {
            Some(reference) => {
                let field = "spec.workdir.baseWorkdir";
                // `fileset#dir/`: the files under dir/, staged relative to it.
                let (name, prefix) = match reference.split_once('#') {
                    Some((name, prefix)) if !name.is_empty() && prefix.ends_with('/') => {
                        (name, prefix.to_string())
                    }
                    Some(_) => {
                        return Err(Invalid::new(
                            field,
                            "must be `fileset` or `fileset#dir/` (a directory of it, ending in '/')",
                            format!("{reference:?}"),
                        )
                        .into());
                    }
                    None => (reference.as_str(), String::new()),
                };
                let (set, version) = self.fileset(project, field, name).await?;
                versions.push(FileSetVersion {
                    name: name.to_string(),
                    resource_version: version,
                });
                let mut any = false;
                for file in &set.files {
                    if let Some(path) = under(&file.path, &prefix) {
                        staged.add(field, path, file.size())?;
                        any = true;
                    }
                }
                if !any && !prefix.is_empty() {
                    return Err(Invalid::new(
                        field,
                        format!("must name a directory of the FileSet {name:?} that holds files"),
                        format!("{reference:?}"),
                    )
                    .into());
                }
                Some((set, prefix))
            }
            None => None,
        };
        let mut mounted: BTreeMap<String, FileSetSpec> = BTreeMap::new();
        for (index, mount) in workdir.artifact_mounts.iter().enumerate() {
            let field = format!("spec.workdir.artifactMounts[{index}].ref");
            let Some((set, path)) = split_ref(&mount.reference) else {
                return Err(Invalid::new(
                    field,
                    "must be `fileset#path` (a FileSet and a file of it)",
                    format!("{:?}", mount.reference),
                )
                .into());
            };
            if !mounted.contains_key(set) {
                let (spec, version) = self.fileset(project, &field, set).await?;
                versions.push(FileSetVersion {
                    name: set.to_string(),
                    resource_version: version,
                });
                mounted.insert(set.to_string(), spec);
            }
            let Some(file) = mounted.get(set).and_then(|spec| spec.file(path)) else {
                return Err(Invalid::new(
                    field,
                    format!("must name a file of the FileSet {set:?}"),
                    format!("{:?}", mount.reference),
                )
                .into());
            };
            staged.add(
                &format!("spec.workdir.artifactMounts[{index}]"),
                &mount.mount_path,
                file.size(),
            )?;
        }
        Ok(Sets {
            base,
            mounted,
            versions,
        })
    }

    /// The FileSet `reference` (`name`, or `project/name` of this project) names, with its
    /// version.
    async fn fileset(
        &self,
        project: &str,
        field: &str,
        reference: &str,
    ) -> Result<(FileSetSpec, String)> {
        let (owner, name) = reference.split_once('/').unwrap_or((project, reference));
        if owner != project {
            return Err(Invalid::new(
                field,
                format!("must name a FileSet of this project ({project})"),
                format!("{reference:?}"),
            )
            .into());
        }
        let key = ObjectKey::new(project, Kind::FileSet, name);
        match self.deps.store.get(&key).await {
            Ok(record) => {
                let version = record.version.to_string();
                Ok((typed::decode::<FileSetSpec>(record)?.object.spec, version))
            }
            Err(store::Error::NotFound(_)) => Err(Invalid::new(
                field,
                "must name an existing FileSet",
                format!("{reference:?}"),
            )
            .into()),
            Err(e) => Err(e.into()),
        }
    }
}

/// What a working directory is made of.
struct Sets {
    /// The base FileSet and the directory of it that is staged (`""` for all of it).
    base: Option<(FileSetSpec, String)>,
    /// The FileSets the artifact mounts name, each once, by the name the mount gives.
    mounted: BTreeMap<String, FileSetSpec>,
    /// Each FileSet read, with its version.
    versions: Vec<FileSetVersion>,
}

/// `path` relative to the directory `prefix` (ending in '/'), when it is under it; every path
/// when `prefix` is empty.
fn under<'a>(path: &'a str, prefix: &str) -> Option<&'a str> {
    let path = path.trim_start_matches("./");
    if prefix.is_empty() {
        return Some(path);
    }
    path.strip_prefix(prefix.trim_start_matches("./"))
        .filter(|rest| !rest.is_empty())
}

/// The bytes a working directory stages so far, against [`MAX_STAGED_WORKDIR_BYTES`].
#[derive(Default)]
struct StagedBytes(u64);

impl StagedBytes {
    /// Counts a file of `size` bytes staged at `path` for `field`; refuses, naming `field`,
    /// when the total goes over the limit.
    fn add(&mut self, field: &str, path: &str, size: u64) -> Result<()> {
        self.0 = self
            .0
            .saturating_add(size)
            .saturating_add(path.len() as u64)
            .saturating_add(STAGED_ENTRY_OVERHEAD);
        if self.0 > MAX_STAGED_WORKDIR_BYTES {
            return Err(Invalid::new(
                field,
                format!(
                    "must keep the working directory's staged files within \
                     {MAX_STAGED_WORKDIR_BYTES} bytes (64 MiB, counting the base FileSet's files \
                     and each artifact mount again, with {STAGED_ENTRY_OVERHEAD} bytes per file)"
                ),
                format!("{} bytes with this one", self.0),
            )
            .into());
        }
        Ok(())
    }
}

/// `fileset#path` split in two.
fn split_ref(reference: &str) -> Option<(&str, &str)> {
    reference
        .split_once('#')
        .filter(|(set, path)| !set.is_empty() && !path.is_empty())
}

/// A tar archive of `files` (later ones replace earlier ones at the same path when unpacked).
pub(super) fn archive(files: &[Staged<'_>]) -> std::io::Result<Vec<u8>> {
    let mut builder = tar::Builder::new(Vec::new());
    for staged in files {
        let mut header = tar::Header::new_gnu();
        header.set_size(staged.bytes.len() as u64);
        header.set_mode(if staged.executable { 0o755 } else { 0o644 });
        header.set_entry_type(tar::EntryType::Regular);
        builder.append_data(
            &mut header,
            staged.path.trim_start_matches("./"),
            staged.bytes.as_slice(),
        )?;
    }
    builder.into_inner()
}

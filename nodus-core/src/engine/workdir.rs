//! A run's working directory staged from FileSets: the references are checked when the run is
//! created (a missing FileSet or file fails the request, not the run), and the files are
//! read and put into the sandbox, as one tar archive, when its sandbox is created.

use super::{Engine, Result, typed};
use crate::resource::{FileEntry, FileSetSpec, Kind, WorkdirSpec};
use crate::store::{self, ObjectKey};
use crate::validate::Invalid;

/// A file of the working directory: where it goes and what it holds.
struct Staged<'a> {
    path: &'a str,
    file: &'a FileEntry,
}

impl Engine {
    /// Check that every FileSet and file that `workdir` names exists in `project`.
    pub(super) async fn check_workdir(&self, project: &str, workdir: &WorkdirSpec) -> Result<()> {
        self.workdir_files(project, workdir).await.map(drop)
    }

    /// The working directory that `workdir` describes, as a tar archive.
    pub(super) async fn workdir_archive(
        &self,
        project: &str,
        workdir: &WorkdirSpec,
    ) -> Result<Vec<u8>> {
        let sets = self.workdir_files(project, workdir).await?;
        let mut staged: Vec<Staged<'_>> = Vec::new();
        if let Some(base) = &sets.base {
            staged.extend(base.files.iter().map(|file| Staged {
                path: &file.path,
                file,
            }));
        }
        for (mount, set) in workdir.artifact_mounts.iter().zip(&sets.mounts) {
            let (_, path) = split_ref(&mount.reference).unwrap_or_default();
            if let Some(file) = set.file(path) {
                staged.push(Staged {
                    path: &mount.mount_path,
                    file,
                });
            }
        }
        archive(&staged).map_err(|e| {
            Invalid::new("spec.workdir", "must make a tar archive", e.to_string()).into()
        })
    }

    /// The FileSets `workdir` names, read and checked.
    async fn workdir_files(&self, project: &str, workdir: &WorkdirSpec) -> Result<Sets> {
        let base = match &workdir.base_workdir {
            Some(reference) => Some(
                self.fileset(project, "spec.workdir.baseWorkdir", reference)
                    .await?,
            ),
            None => None,
        };
        let mut mounts = Vec::with_capacity(workdir.artifact_mounts.len());
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
            let spec = self.fileset(project, &field, set).await?;
            if spec.file(path).is_none() {
                return Err(Invalid::new(
                    field,
                    format!("must name a file of the FileSet {set:?}"),
                    format!("{:?}", mount.reference),
                )
                .into());
            }
            mounts.push(spec);
        }
        Ok(Sets { base, mounts })
    }

    /// The FileSet `reference` (`name`, or `project/name` of this project) names.
    async fn fileset(&self, project: &str, field: &str, reference: &str) -> Result<FileSetSpec> {
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
            Ok(record) => Ok(typed::decode::<FileSetSpec>(record)?.object.spec),
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
    base: Option<FileSetSpec>,
    /// The FileSet of each artifact mount, in order.
    mounts: Vec<FileSetSpec>,
}

/// `fileset#path` split in two.
fn split_ref(reference: &str) -> Option<(&str, &str)> {
    reference
        .split_once('#')
        .filter(|(set, path)| !set.is_empty() && !path.is_empty())
}

/// A tar archive of `files` (later ones replace earlier ones at the same path when unpacked).
fn archive(files: &[Staged<'_>]) -> std::io::Result<Vec<u8>> {
    let mut builder = tar::Builder::new(Vec::new());
    for staged in files {
        let mut header = tar::Header::new_gnu();
        header.set_size(staged.file.content.len() as u64);
        header.set_mode(if staged.file.executable { 0o755 } else { 0o644 });
        header.set_entry_type(tar::EntryType::Regular);
        builder.append_data(
            &mut header,
            staged.path.trim_start_matches("./"),
            staged.file.content.as_bytes(),
        )?;
    }
    builder.into_inner()
}

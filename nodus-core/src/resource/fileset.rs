//! `FileSet`: stored files that a run's working directory is staged from
//! (`spec.workdir.baseWorkdir` names one; `spec.workdir.artifactMounts` take single files of
//! one, as `fileset#path`).

use serde::{Deserialize, Serialize};

/// `spec` of a FileSet: its files, each at a relative path.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FileSetSpec {
    /// The files, in the order they are staged.
    #[serde(default)]
    pub files: Vec<FileEntry>,
}

/// One stored file (UTF-8 text).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FileEntry {
    /// Where it goes, relative to the working directory (`app/main.py`).
    pub path: String,
    /// Its contents.
    #[serde(default)]
    pub content: String,
    /// Whether it may be run (mode 0755 instead of 0644).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub executable: bool,
}

impl FileSetSpec {
    /// The file at `path`, if the set holds one.
    pub fn file(&self, path: &str) -> Option<&FileEntry> {
        let wanted = components(path);
        self.files.iter().find(|f| components(&f.path) == wanted)
    }
}

/// A path's components, without empty and `.` ones (`./a//b` is `a/b`).
fn components(path: &str) -> Vec<&str> {
    path.split('/')
        .filter(|c| !c.is_empty() && *c != ".")
        .collect()
}

/// A FileSet has no status of its own.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct FileSetStatus {}

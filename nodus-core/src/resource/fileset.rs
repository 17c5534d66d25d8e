//! `FileSet`: stored files that a run's working directory is staged from
//! (`spec.workdir.baseWorkdir` names one; `spec.workdir.artifactMounts` take single files of
//! one, as `fileset#path`).

use serde::{Deserialize, Serialize};

/// `spec` of a FileSet: its files, each at a relative path.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FileSetSpec {
    /// The files, in the order they are staged.
    #[serde(default)]
    pub files: Vec<FileEntry>,
}

/// One stored file: UTF-8 text in `content`, or any bytes in `contentBase64`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FileEntry {
    /// Where it goes, relative to the working directory (`app/main.py`).
    pub path: String,
    /// Its contents as text.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub content: String,
    /// Its contents as standard base64, for bytes that are not text (instead of `content`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_base64: Option<String>,
    /// Whether it may be run (mode 0755 instead of 0644).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub executable: bool,
}

impl FileEntry {
    /// The file's bytes; an error when `contentBase64` is not base64 (validation refuses
    /// such a file).
    pub fn bytes(&self) -> Result<Vec<u8>, base64::DecodeError> {
        use base64::Engine as _;
        match &self.content_base64 {
            Some(encoded) => base64::engine::general_purpose::STANDARD.decode(encoded),
            None => Ok(self.content.as_bytes().to_vec()),
        }
    }

    /// The file's size in bytes, from its stored form without decoding it (for valid
    /// `contentBase64`, exact; padding and line breaks are not counted).
    pub fn size(&self) -> u64 {
        match &self.content_base64 {
            Some(encoded) => {
                let digits = encoded
                    .bytes()
                    .filter(|b| !matches!(b, b'=' | b'\n' | b'\r'))
                    .count();
                (digits as u64).saturating_mul(3) / 4
            }
            None => self.content.len() as u64,
        }
    }
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
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
pub struct FileSetStatus {}

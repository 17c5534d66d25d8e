//! Benchmarks people already have, turned into an Environment: Harbor task directories
//! ([`harbor`]) and Inspect-style JSON Lines samples ([`jsonl`]). Pure functions of what was
//! read (the caller reads the files): each returns the Environment document and the FileSets
//! it names, checked by the same rules the server applies, or an [`Invalid`] that names the
//! file (and line), the field, the rule and the value. Nothing is written here: the caller
//! writes the FileSets, then the Environment, or prints them.

pub mod harbor;
pub mod jsonl;

use std::collections::BTreeMap;

use crate::resource::{
    Environment, EnvironmentSpec, FileEntry, FileSet, FileSetSpec, GraderSpec, SplitSpec, TaskSpec,
};
use crate::validate::{self, Invalid, Result, is_dns_label};

/// What an import is named: the Environment `name@version` and the split its tasks go in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// The Environment's name (a DNS label).
    pub name: String,
    /// Its version (semantic).
    pub version: String,
    /// The split (default `test`).
    pub split: String,
}

/// An import's documents: the FileSets (written first) and the Environment that names them.
#[derive(Debug, Clone)]
pub struct Imported {
    /// FileSets the Environment names (its grader's files, its tasks' starting files).
    pub file_sets: Vec<FileSet>,
    /// The Environment.
    pub environment: Environment,
}

/// One imported task and where it came from (a directory, or `FILE:LINE`), for errors.
struct Sourced {
    source: String,
    task: TaskSpec,
}

/// The name of an imported FileSet: `<name>-<version>-<what>`, the version's dots and other
/// signs as `-`; refused, naming `--name`, when that is no DNS label (too long).
fn file_set_name(target: &Target, what: &str) -> Result<String> {
    let version: String = target
        .version
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect();
    let name = format!("{}-{version}-{what}", target.name);
    if !is_dns_label(&name) {
        return Err(Invalid::new(
            "--name",
            format!(
                "must leave room for the FileSets it names: {name:?} must be a DNS label of at \
                 most 63 characters"
            ),
            format!("{:?}", target.name),
        ));
    }
    Ok(name)
}

/// A FileSet of `files`, checked.
fn file_set(name: String, files: Vec<FileEntry>) -> Result<FileSet> {
    let set = FileSet::new(name, FileSetSpec { files });
    validate::validate(&set).map_err(|e| {
        Invalid::new(
            format!("FileSet {}: {}", set.name(), e.field),
            e.rule,
            e.value,
        )
    })?;
    Ok(set)
}

/// A file's entry: text as `content`, other bytes as `contentBase64`.
fn file_entry(path: String, bytes: Vec<u8>, executable: bool) -> FileEntry {
    use base64::Engine as _;
    match String::from_utf8(bytes) {
        Ok(content) => FileEntry {
            path,
            content,
            content_base64: None,
            executable,
        },
        Err(bytes) => FileEntry {
            path,
            content: String::new(),
            content_base64: Some(
                base64::engine::general_purpose::STANDARD.encode(bytes.into_bytes()),
            ),
            executable,
        },
    }
}

/// The Environment of `tasks`, checked by the server's rules; an error about a task names
/// where the task came from.
fn environment(
    target: &Target,
    image: String,
    tasks: Vec<Sourced>,
    grader: GraderSpec,
) -> Result<Environment> {
    let sources: Vec<String> = tasks.iter().map(|t| t.source.clone()).collect();
    let spec = EnvironmentSpec {
        version: target.version.clone(),
        image,
        splits: BTreeMap::from([(
            target.split.clone(),
            SplitSpec {
                tasks: tasks.into_iter().map(|t| t.task).collect(),
                generator: None,
            },
        )]),
        grader,
        network: Default::default(),
    };
    let environment = Environment::new(target.name.clone(), spec);
    validate::validate(&environment).map_err(|e| {
        let prefix = format!("spec.splits.{}.tasks[", target.split);
        let source = e
            .field
            .strip_prefix(&prefix)
            .and_then(|rest| rest.split(']').next())
            .and_then(|index| index.parse::<usize>().ok())
            .and_then(|index| sources.get(index));
        match source {
            Some(source) => Invalid::new(format!("{source}: {}", e.field), e.rule, e.value),
            None => e,
        }
    })?;
    Ok(environment)
}

/// `text` on one line, shortened, for an error's value.
fn one_line(text: &str) -> String {
    let line = text.split_whitespace().collect::<Vec<_>>().join(" ");
    crate::evaluation::grade::shorten(&line)
}

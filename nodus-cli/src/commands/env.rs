//! `nodus env import harbor DIR…` and `nodus env import jsonl FILE`: read the benchmark's
//! files, turn them into an Environment and its FileSets with
//! `nodus_core::evaluation::import` (which decides everything), then apply them (FileSets
//! first) or print them. Nothing is written when the import is refused, nor when the version
//! exists already with other contents (its Environment or its FileSets).

use std::path::Path;

use nodus_core::evaluation::import::{self, Imported, Target, harbor};
use nodus_core::resource::{GraderKind, Kind};
use serde_json::Value;

use super::apply::{Applied, apply_one, unchanged};
use super::{connect, out, outln};
use crate::cli::{EnvCommand, Global, ImportCommand, ImportTarget, Output};
use crate::error::{Error, Result};
use crate::kinds::qualified;
use crate::yaml;

pub async fn run(global: &Global, command: EnvCommand) -> Result<()> {
    let EnvCommand::Import(command) = command;
    let (imported, output) = match command {
        ImportCommand::Harbor {
            dirs,
            target,
            image,
            no_image,
        } => {
            let image = match (image, no_image) {
                (Some(image), _) => harbor::ImageChoice::Given(image),
                (None, true) => harbor::ImageChoice::Without,
                (None, false) => harbor::ImageChoice::FromTasks,
            };
            let dirs = dirs
                .iter()
                .map(|dir| read_task_dir(dir))
                .collect::<Result<Vec<_>>>()?;
            let imported =
                harbor::import(&dirs, &import_target(&target), &image).map_err(Error::input)?;
            (imported, target.output)
        }
        ImportCommand::Jsonl {
            file,
            target,
            grader,
        } => {
            let grader = match grader.as_str() {
                "exact" => GraderKind::Exact,
                "numeric" => GraderKind::Numeric,
                "regex" => GraderKind::Regex,
                other => {
                    return Err(Error::usage(format!(
                        "--grader must be exact, numeric or regex, not {other:?}"
                    )));
                }
            };
            let shown = file.display().to_string();
            let text = if shown == "-" {
                super::text_or_stdin("-")?
            } else {
                read_text(&file)?
            };
            let imported = import::jsonl::import(&shown, &text, &import_target(&target), grader)
                .map_err(Error::input)?;
            (imported, target.output)
        }
    };
    let documents = documents(&imported)?;
    match output {
        None => apply(global, documents).await,
        Some(Output::Yaml) => {
            for (_, _, document) in &documents {
                out(&format!("---\n{}", yaml::to_yaml(document)?));
            }
            Ok(())
        }
        Some(Output::Json) => {
            let items: Vec<Value> = documents.into_iter().map(|(_, _, d)| d).collect();
            let list = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": items});
            outln(&serde_json::to_string_pretty(&list).map_err(Error::input)?);
            Ok(())
        }
        Some(_) => Err(Error::usage(
            "env import applies what it imports, or prints it with -o yaml (documents to \
             apply) or -o json (a List)",
        )),
    }
}

fn import_target(target: &ImportTarget) -> Target {
    Target {
        name: target.name.clone(),
        version: target.version.clone(),
        split: target.split.clone(),
    }
}

/// The documents to write, in order: the FileSets, then the Environment (`NAME@VERSION`).
fn documents(imported: &Imported) -> Result<Vec<(Kind, String, Value)>> {
    // The documents as a user writes them: no status (the server writes that).
    let json = |value: serde_json::Result<Value>| {
        let mut document = value.map_err(Error::input)?;
        if let Some(map) = document.as_object_mut() {
            map.remove("status");
        }
        Ok::<_, Error>(document)
    };
    let mut documents = Vec::with_capacity(imported.file_sets.len() + 1);
    for set in &imported.file_sets {
        documents.push((
            Kind::FileSet,
            set.name().to_string(),
            json(serde_json::to_value(set))?,
        ));
    }
    let environment = &imported.environment;
    documents.push((
        Kind::Environment,
        format!("{}@{}", environment.name(), environment.spec.version),
        json(serde_json::to_value(environment))?,
    ));
    Ok(documents)
}

/// Writes the documents, refused before anything is written when one of them exists with
/// other contents: an Environment version never changes, nor do the files it names (an import
/// names its FileSets after the version).
async fn apply(global: &Global, documents: Vec<(Kind, String, Value)>) -> Result<()> {
    let client = connect(global)?;
    for (kind, name, document) in &documents {
        match client.get(&[kind.plural(), name]).await {
            Ok(live) => {
                let mut desired = live.clone();
                nodus_core::patch::merge(&mut desired, document);
                if !unchanged(*kind, &desired, &live) {
                    return Err(Error::input(format!(
                        "{}: exists with other contents, and an imported version never \
                         changes: import it as another --version",
                        qualified(*kind, name)
                    )));
                }
            }
            Err(error) if error.is_not_found() => {}
            Err(error) => return Err(error),
        }
    }
    for (kind, name, document) in documents {
        let word = match apply_one(&client, kind, &name, document).await? {
            Applied::Created => "created",
            Applied::Configured => "configured",
            Applied::Unchanged => "unchanged",
        };
        outln(&format!("{} {word}", qualified(kind, &name)));
    }
    Ok(())
}

/// A file's text, refused naming the file when it cannot be read or is not UTF-8.
fn read_text(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).map_err(|e| Error::input(format!("{}: {e}", path.display())))
}

/// The parts of a Harbor task directory the importer reads.
fn read_task_dir(dir: &Path) -> Result<harbor::TaskDir> {
    let shown = dir.display().to_string();
    if !dir.is_dir() {
        return Err(Error::input(format!("{shown}: is not a directory")));
    }
    let optional = |name: &str| -> Result<Option<String>> {
        let path = dir.join(name);
        if path.exists() {
            read_text(&path).map(Some)
        } else {
            Ok(None)
        }
    };
    let dir_name = dir
        .canonicalize()
        .ok()
        .and_then(|full| full.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_else(|| shown.clone());
    let mut tests = Vec::new();
    let tests_dir = dir.join("tests");
    if tests_dir.is_dir() {
        read_tree(&tests_dir, "", &mut tests)?;
    }
    tests.sort();
    Ok(harbor::TaskDir {
        path: shown.trim_end_matches('/').to_string(),
        dir_name,
        task_toml: optional("task.toml")?,
        instruction: optional("instruction.md")?,
        tests,
        has_environment_dir: dir.join("environment").is_dir(),
    })
}

/// The regular files under `root/prefix`, with paths relative to `root`; a symbolic link or
/// another special file is refused, naming it.
fn read_tree(root: &Path, prefix: &str, files: &mut Vec<(String, Vec<u8>, bool)>) -> Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    let here = root.join(prefix);
    let failed = |path: &Path, e: std::io::Error| Error::input(format!("{}: {e}", path.display()));
    for entry in std::fs::read_dir(&here).map_err(|e| failed(&here, e))? {
        let entry = entry.map_err(|e| failed(&here, e))?;
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        let relative = if prefix.is_empty() {
            name
        } else {
            format!("{prefix}/{name}")
        };
        let kind = entry.file_type().map_err(|e| failed(&path, e))?;
        if kind.is_dir() {
            read_tree(root, &relative, files)?;
        } else if kind.is_file() {
            let bytes = std::fs::read(&path).map_err(|e| failed(&path, e))?;
            let mode = entry
                .metadata()
                .map_err(|e| failed(&path, e))?
                .permissions()
                .mode();
            files.push((relative, bytes, mode & 0o111 != 0));
        } else {
            return Err(Error::input(format!(
                "{}: must be a regular file or a directory (links and special files are not \
                 imported)",
                path.display()
            )));
        }
    }
    Ok(())
}

//! The commands: each module carries out one group of them against the API.

mod access;
mod apply;
mod create;
mod egress;
mod env;
mod eval;
mod get;
mod login;
mod misc;
mod quickstart;
mod runs;
mod server;
mod wait;

use std::io::{Read as _, Write as _};
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::cli::{Cli, Command, Global};
use crate::client::Client;
use crate::config::{self, Config};
use crate::error::{Error, Result};
use crate::yaml;

/// Carries out the command line.
pub async fn run(cli: Cli) -> Result<()> {
    let global = cli.global;
    match cli.command {
        Command::Server(crate::cli::ServerArgs {
            action: Some(crate::cli::ServerCommand::Drain(args)),
            ..
        }) => {
            let global = Global {
                project: None,
                context: args.context,
            };
            server::drain(&connect(&global)?, &args.name).await
        }
        Command::Server(args) => server::run(args).await,
        Command::Quickstart(args) => quickstart::run(args).await,
        Command::Login(args) => login::login(&global, args).await,
        Command::Config(command) => login::config(&global, command),
        Command::Completion(args) => misc::completion(args),
        Command::Apply(args) => apply::run(&connect(&global)?, args).await,
        Command::Get(args) => get::run(&connect(&global)?, args).await,
        Command::Wait(args) => wait::run(&connect(&global)?, args).await,
        Command::Create(command) => create::run(&connect(&global)?, command).await,
        Command::Patch(args) => misc::patch(&connect(&global)?, args).await,
        Command::Cancel(args) => misc::cancel(&connect(&global)?, args).await,
        Command::Delete(args) => misc::delete(&connect(&global)?, args).await,
        Command::Agentrun(command) => runs::run(&connect(&global)?, command).await,
        Command::Eval(command) => eval::run(&connect(&global)?, command).await,
        Command::Env(command) => env::run(&global, command).await,
        Command::Credits(args) => misc::credits(&connect(&global)?, args).await,
    }
}

/// The server, token and project to use: `NODUS_SERVER` / `NODUS_TOKEN` over the context
/// (`--context`, else the current one), `--project` over the context's project.
pub fn connect(global: &Global) -> Result<Client> {
    let env = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
    let path = config::default_path();
    let config = Config::load(&path)?;
    let context = match &global.context {
        Some(name) => Some(config.context(name).ok_or_else(|| {
            Error::NotLoggedIn(format!(
                "no context {name:?} in {}; run nodus login --name {name}",
                path.display()
            ))
        })?),
        None => config.current(),
    };
    let server = env("NODUS_SERVER")
        .or_else(|| context.map(|c| c.server.clone()))
        .unwrap_or_else(|| config::LOCAL_SERVER.to_string());
    let token = env("NODUS_TOKEN").or_else(|| token_for(&config, context, &server));
    let Some(token) = token else {
        return Err(Error::NotLoggedIn(match env("NODUS_SERVER") {
            Some(server) => format!(
                "no token for {server}: set NODUS_TOKEN, or run nodus login --server {server}"
            ),
            None => {
                "not logged in: run `nodus login` (or set NODUS_SERVER and NODUS_TOKEN)".to_string()
            }
        }));
    };
    let project = global
        .project
        .clone()
        .or_else(|| context.and_then(|c| c.project.clone()))
        .unwrap_or_else(|| config::DEFAULT_PROJECT.to_string());
    Client::new(&server, &token, &project)
}

/// The saved token for `server`: the context's when it is for that server, else another
/// context's for it. A token is never sent to a server it was not saved for.
fn token_for(config: &Config, context: Option<&config::Context>, server: &str) -> Option<String> {
    let same =
        |c: &&config::Context| c.server.trim_end_matches('/') == server.trim_end_matches('/');
    context
        .filter(same)
        .or_else(|| config.contexts.iter().find(same))
        .map(|c| c.token.clone())
}

/// The end of a command that went on past failures it printed one by one: success when there
/// were none, else [`Error::Reported`] with the worst exit code among them.
pub fn reported(failures: &[Error]) -> Result<()> {
    match failures.len() {
        0 => Ok(()),
        count => Err(Error::Reported {
            count,
            code: failures
                .iter()
                .map(Error::exit_code)
                .max()
                .unwrap_or(crate::error::exit::REFUSED),
        }),
    }
}

/// Writes to standard output; a closed pipe (as with `| head`) is not an error.
pub fn out(text: &str) {
    let mut stdout = std::io::stdout().lock();
    let _ = stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush());
}

/// Writes a line to standard output.
pub fn outln(text: &str) {
    out(&format!("{text}\n"));
}

/// The text of an argument, or standard input for `-`.
pub fn text_or_stdin(text: &str) -> Result<String> {
    if text != "-" {
        return Ok(text.to_string());
    }
    let mut input = String::new();
    std::io::stdin()
        .read_to_string(&mut input)
        .map_err(|e| Error::input(format!("cannot read standard input: {e}")))?;
    Ok(input)
}

/// The documents of files (`-` is standard input; a directory gives its `.yaml`, `.yml` and
/// `.json` files in name order), each with where it came from (`FILE: document N`, counting
/// from 1 in its file). `kind: …List` documents with `items` give their items
/// (`FILE: document N, item M`).
pub fn read_documents(paths: &[PathBuf]) -> Result<Vec<(String, Value)>> {
    let mut files = Vec::new();
    for path in paths {
        if path.is_dir() {
            let mut entries: Vec<PathBuf> = std::fs::read_dir(path)
                .map_err(|e| Error::input(format!("{}: {e}", path.display())))?
                .filter_map(|entry| entry.ok().map(|e| e.path()))
                .filter(|p| {
                    p.extension()
                        .and_then(|e| e.to_str())
                        .is_some_and(|e| matches!(e, "yaml" | "yml" | "json"))
                })
                .collect();
            entries.sort();
            files.extend(entries);
        } else {
            files.push(path.clone());
        }
    }
    let mut documents = Vec::new();
    for file in files {
        let (source, text) = read_file(&file)?;
        for (index, document) in yaml::parse_documents(&text, &source)?
            .into_iter()
            .enumerate()
        {
            let at = format!("{source}: document {}", index + 1);
            expand_list(&at, document, &mut documents);
        }
    }
    Ok(documents)
}

fn read_file(path: &Path) -> Result<(String, String)> {
    if path.as_os_str() == "-" {
        return Ok(("-".to_string(), text_or_stdin("-")?));
    }
    let source = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|e| Error::input(format!("{source}: {e}")))?;
    Ok((source, text))
}

fn expand_list(at: &str, document: Value, into: &mut Vec<(String, Value)>) {
    let is_list = document
        .get("kind")
        .and_then(Value::as_str)
        .is_some_and(|k| k.ends_with("List"));
    match document {
        Value::Object(mut map) if is_list && map.get("items").is_some_and(Value::is_array) => {
            if let Some(Value::Array(items)) = map.remove("items") {
                into.extend(
                    items
                        .into_iter()
                        .enumerate()
                        .map(|(index, item)| (format!("{at}, item {}", index + 1), item)),
                );
            }
        }
        other => into.push((at.to_string(), other)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn saved_tokens_go_only_to_their_own_server() {
        let context = |name: &str, server: &str, token: &str| config::Context {
            name: name.into(),
            server: server.into(),
            token: token.into(),
            project: None,
        };
        let mut config = Config::default();
        config.upsert(context("prod", "https://prod.example.com", "p"));
        config.upsert(context("local", "http://127.0.0.1:7070", "l"));
        let current = config.current();
        assert_eq!(
            token_for(&config, current, "http://127.0.0.1:7070/").as_deref(),
            Some("l")
        );
        assert_eq!(
            token_for(&config, current, "https://prod.example.com").as_deref(),
            Some("p")
        );
        assert_eq!(
            token_for(&config, current, "https://evil.example.com"),
            None
        );
    }

    #[test]
    fn files_and_directories_give_their_documents_in_order() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(
            dir.path().join("b.yaml"),
            "kind: Agent\nmetadata: {name: b}\n",
        )
        .expect("write");
        std::fs::write(
            dir.path().join("a.yml"),
            "kind: AgentRunList\nitems:\n- kind: AgentRun\n  metadata: {name: a1}\n- kind: AgentRun\n  metadata: {name: a2}\n",
        )
        .expect("write");
        std::fs::write(dir.path().join("notes.txt"), "not yaml: [").expect("write");
        let documents = read_documents(&[dir.path().to_path_buf()]).expect("reads");
        let names: Vec<&str> = documents
            .iter()
            .filter_map(|(_, d)| d.pointer("/metadata/name").and_then(Value::as_str))
            .collect();
        assert_eq!(names, ["a1", "a2", "b"]);
        let places: Vec<&str> = documents.iter().map(|(at, _)| at.as_str()).collect();
        let a = dir.path().join("a.yml").display().to_string();
        let b = dir.path().join("b.yaml").display().to_string();
        assert_eq!(
            places,
            [
                format!("{a}: document 1, item 1"),
                format!("{a}: document 1, item 2"),
                format!("{b}: document 1"),
            ]
        );
        let missing = read_documents(&[dir.path().join("absent.yaml")]).expect_err("absent");
        assert!(missing.to_string().contains("absent.yaml"), "{missing}");
    }
}

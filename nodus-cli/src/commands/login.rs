//! `nodus login` (check a token against a server and save it as the current context) and
//! `nodus config get-contexts|current-context|use-context`.

use std::path::Path;

use super::{outln, text_or_stdin};
use crate::cli::{ConfigCommand, Global, LoginArgs};
use crate::client::Client;
use crate::config::{self, Config, Context};
use crate::error::{Error, Result};
use crate::table::Table;

pub async fn login(global: &Global, args: LoginArgs) -> Result<()> {
    let server = match &args.server {
        Some(server) if server.contains("://") => server.trim_end_matches('/').to_string(),
        Some(server) => format!("http://{}", server.trim_end_matches('/')),
        None => config::LOCAL_SERVER.to_string(),
    };
    let token = match &args.token {
        Some(token) => text_or_stdin(token)?.trim().to_string(),
        None => match std::env::var("NODUS_TOKEN")
            .ok()
            .filter(|t| !t.trim().is_empty())
        {
            Some(token) => token.trim().to_string(),
            None => {
                let dir = args
                    .data_dir
                    .clone()
                    .unwrap_or_else(nodus_server::default_data_dir);
                local_token(&dir, &server)?
            }
        },
    };
    if token.is_empty() {
        return Err(Error::NotLoggedIn("the token is empty".to_string()));
    }
    let project = global
        .project
        .clone()
        .unwrap_or_else(|| config::DEFAULT_PROJECT.to_string());
    let client = Client::new(&server, &token, &project)?;
    // A read the token must be allowed: the project's agents.
    client.get(&["agents"]).await?;
    let name = args
        .name
        .clone()
        .unwrap_or_else(|| config::context_name_for(&server));
    let path = config::default_path();
    let mut config = Config::load(&path)?;
    config.upsert(Context {
        name: name.clone(),
        server: server.clone(),
        token,
        project: Some(project.clone()),
    });
    config.save(&path)?;
    outln(&format!(
        "Logged in to {server} (project {project}); saved as context {name:?} in {}",
        path.display()
    ));
    Ok(())
}

/// The local server's admin token, from its data directory.
fn local_token(dir: &Path, server: &str) -> Result<String> {
    let file = dir.join("admin-token");
    match std::fs::read_to_string(&file) {
        Ok(token) => Ok(token.trim().to_string()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(Error::NotLoggedIn(format!(
            "no token given and no token file at {}: start the local server with `nodus server` \
             first, or log in to {server} with --token",
            file.display()
        ))),
        Err(e) => Err(Error::NotLoggedIn(format!(
            "cannot read {}: {e}",
            file.display()
        ))),
    }
}

pub fn config(_global: &Global, command: ConfigCommand) -> Result<()> {
    let path = config::default_path();
    let mut config = Config::load(&path)?;
    match command {
        ConfigCommand::GetContexts => {
            let mut table = Table::new(&["CURRENT", "NAME", "SERVER", "PROJECT"]);
            for context in &config.contexts {
                let current = config.current_context.as_deref() == Some(context.name.as_str());
                table.rows.push(vec![
                    if current { "*".into() } else { String::new() },
                    context.name.clone(),
                    context.server.clone(),
                    context
                        .project
                        .clone()
                        .unwrap_or_else(|| config::DEFAULT_PROJECT.into()),
                ]);
            }
            super::out(&table.render());
        }
        ConfigCommand::CurrentContext => match config.current() {
            Some(context) => outln(&context.name),
            None => {
                return Err(Error::NotLoggedIn(
                    "no current context: run nodus login".to_string(),
                ));
            }
        },
        ConfigCommand::UseContext { name } => {
            config.use_context(&name)?;
            config.save(&path)?;
            outln(&format!("Switched to context {name:?}."));
        }
    }
    Ok(())
}

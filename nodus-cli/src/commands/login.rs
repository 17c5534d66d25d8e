//! `nodus login` (check a token against a server and save it as the current context) and
//! `nodus config get-contexts|current-context|use-context`.

use std::path::Path;

use nodus_core::engine::Reason;

use super::{outln, text_or_stdin};
use crate::cli::{ConfigCommand, Global, LoginArgs};
use crate::client::Client;
use crate::config::{self, Config, Context};
use crate::error::{Error, Result};
use crate::table::Table;

/// The project of a login without `--project`: the token's one project when it holds only
/// one (a team's token), else `default`.
async fn only_project(server: &str, token: &str) -> Result<String> {
    let client = Client::new(server, token, config::DEFAULT_PROJECT)?;
    let projects = client
        .send(
            reqwest::Method::GET,
            &super::access::PROJECTS,
            &[],
            None,
            &[],
        )
        .await
        .ok()
        .and_then(|list| list["items"].as_array().cloned())
        .unwrap_or_default();
    Ok(match projects.as_slice() {
        [one] => one["metadata"]["name"]
            .as_str()
            .unwrap_or(config::DEFAULT_PROJECT)
            .to_string(),
        _ => config::DEFAULT_PROJECT.to_string(),
    })
}

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
    let project = match &global.project {
        Some(project) => project.clone(),
        None => only_project(&server, &token).await?,
    };
    let client = Client::new(&server, &token, &project)?;
    // A read the token must be allowed: the project's agents. A token that does not hold the
    // project is no usable login for it.
    client.get(&["agents"]).await.map_err(|error| match &error {
        Error::Server {
            reason: Reason::Forbidden,
            ..
        } => Error::NotLoggedIn(format!(
            "the token is not bound to the project {project:?} on {server}: log in with a token \
             for it, or name one of the token's projects with --project"
        )),
        _ => error,
    })?;
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

/// The local server's admin token, from its data directory; only for a server on this
/// machine, so that the admin token never goes to another one.
fn local_token(dir: &Path, server: &str) -> Result<String> {
    if !on_this_machine(server) {
        return Err(Error::NotLoggedIn(format!(
            "give the token for {server} with --token (or NODUS_TOKEN): the local server's \
             token file is only used for a server on this machine"
        )));
    }
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

/// Whether `server` (a URL) is on this machine: `localhost` or a loopback address.
fn on_this_machine(server: &str) -> bool {
    let Ok(url) = reqwest::Url::parse(server) else {
        return false;
    };
    let Some(host) = url.host_str() else {
        return false;
    };
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    host.eq_ignore_ascii_case("localhost")
        || bare
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_local_token_file_serves_only_a_server_on_this_machine() {
        let dir = tempfile::tempdir().expect("dir");
        std::fs::write(dir.path().join("admin-token"), "nodus_secret_admin\n").expect("token");
        for local in [
            "http://127.0.0.1:7070",
            "http://localhost:7070",
            "http://[::1]:7070",
        ] {
            assert_eq!(
                local_token(dir.path(), local).expect("local"),
                "nodus_secret_admin"
            );
        }
        for remote in [
            "https://nodus.example.com",
            "http://10.0.0.5:7070",
            "not a url",
        ] {
            match local_token(dir.path(), remote) {
                Err(Error::NotLoggedIn(message)) => {
                    assert!(message.contains("--token"), "{message}");
                    assert!(!message.contains("nodus_secret_admin"), "{message}");
                }
                other => panic!("{remote}: the admin token must not go there: {other:?}"),
            }
        }
    }
}

//! The config file (`$XDG_CONFIG_HOME/nodus/config.yaml`, or `~/.config/nodus/config.yaml`,
//! or `$NODUS_CONFIG`): named contexts (server, token, project) and the current one. It holds
//! tokens, so it is written readable by its owner only.

use std::io::Write as _;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// The project used when neither a flag nor the context names one.
pub const DEFAULT_PROJECT: &str = "default";
/// The local server `nodus login` uses with no `--server`.
pub const LOCAL_SERVER: &str = "http://127.0.0.1:7070";

/// The whole file.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Config {
    /// The context commands use unless told otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_context: Option<String>,
    /// Every saved context.
    #[serde(default)]
    pub contexts: Vec<Context>,
}

/// One server, the token for it, and a project.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Context {
    /// The context's name.
    pub name: String,
    /// The server's base URL.
    pub server: String,
    /// The bearer token.
    pub token: String,
    /// The project commands use.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub project: Option<String>,
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("name", &self.name)
            .field("server", &self.server)
            .field("token", &"[redacted]")
            .field("project", &self.project)
            .finish()
    }
}

/// Where the config file is.
pub fn default_path() -> PathBuf {
    let var = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
    if let Some(path) = var("NODUS_CONFIG") {
        return PathBuf::from(path);
    }
    let dir = var("XDG_CONFIG_HOME")
        .map(PathBuf::from)
        .or_else(|| var("HOME").map(|home| PathBuf::from(home).join(".config")))
        .unwrap_or_else(|| PathBuf::from("."));
    dir.join("nodus").join("config.yaml")
}

fn config_error(path: &Path, reason: impl std::fmt::Display) -> Error {
    Error::Config {
        path: path.display().to_string(),
        reason: reason.to_string(),
    }
}

impl Config {
    /// The file at `path`; an absent file is an empty config.
    pub fn load(path: &Path) -> Result<Config> {
        let text = match std::fs::read_to_string(path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Config::default()),
            Err(e) => return Err(config_error(path, e)),
        };
        Config::parse(&text).map_err(|e| config_error(path, e))
    }

    /// The config in a YAML text.
    pub fn parse(text: &str) -> std::result::Result<Config, String> {
        if text.trim().is_empty() {
            return Ok(Config::default());
        }
        serde_saphyr::from_str(text).map_err(|e| format!("not a nodus config: {e}"))
    }

    /// The config as YAML.
    pub fn to_text(&self) -> Result<String> {
        serde_saphyr::to_string(self)
            .map_err(|e| Error::input(format!("cannot write the config: {e}")))
    }

    /// Writes the file (owner-only), through a temporary file and a rename.
    pub fn save(&self, path: &Path) -> Result<()> {
        let text = self.to_text()?;
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|e| config_error(path, e))?;
        }
        let temporary = path.with_extension("yaml.tmp");
        let mut options = std::fs::OpenOptions::new();
        options.write(true).create(true).truncate(true);
        #[cfg(unix)]
        {
            use std::os::unix::fs::OpenOptionsExt as _;
            options.mode(0o600);
        }
        let mut file = options
            .open(&temporary)
            .map_err(|e| config_error(path, e))?;
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt as _;
            file.set_permissions(std::fs::Permissions::from_mode(0o600))
                .map_err(|e| config_error(path, e))?;
        }
        file.write_all(text.as_bytes())
            .and_then(|()| file.sync_all())
            .map_err(|e| config_error(path, e))?;
        std::fs::rename(&temporary, path).map_err(|e| config_error(path, e))
    }

    /// The context named `name`.
    pub fn context(&self, name: &str) -> Option<&Context> {
        self.contexts.iter().find(|c| c.name == name)
    }

    /// The current context, if any.
    pub fn current(&self) -> Option<&Context> {
        self.current_context
            .as_deref()
            .and_then(|name| self.context(name))
    }

    /// Adds or replaces a context and makes it current.
    pub fn upsert(&mut self, context: Context) {
        self.current_context = Some(context.name.clone());
        match self.contexts.iter_mut().find(|c| c.name == context.name) {
            Some(existing) => *existing = context,
            None => self.contexts.push(context),
        }
    }

    /// Makes `name` current, or says which contexts there are.
    pub fn use_context(&mut self, name: &str) -> Result<()> {
        if self.context(name).is_none() {
            let known: Vec<&str> = self.contexts.iter().map(|c| c.name.as_str()).collect();
            return Err(Error::input(format!(
                "no context {name:?}; there are: {}",
                if known.is_empty() {
                    "none (run nodus login)".to_string()
                } else {
                    known.join(", ")
                }
            )));
        }
        self.current_context = Some(name.to_string());
        Ok(())
    }
}

/// The name `nodus login` gives a context for a server: `local` for the local default,
/// otherwise the server's host and port.
pub fn context_name_for(server: &str) -> String {
    if server.trim_end_matches('/') == LOCAL_SERVER {
        return "local".to_string();
    }
    let rest = server.split_once("://").map_or(server, |(_, rest)| rest);
    let host = rest.split('/').next().unwrap_or(rest);
    if host.is_empty() {
        "default".to_string()
    } else {
        host.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn context(name: &str, server: &str) -> Context {
        Context {
            name: name.into(),
            server: server.into(),
            token: "secret-token".into(),
            project: Some("default".into()),
        }
    }

    #[test]
    fn the_file_round_trips_owner_only() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("nested/config.yaml");
        assert_eq!(
            Config::load(&path).expect("absent is empty"),
            Config::default()
        );
        let mut config = Config::default();
        config.upsert(context("local", LOCAL_SERVER));
        config.upsert(context("prod", "https://nodus.example.com"));
        config.save(&path).expect("saves");
        let loaded = Config::load(&path).expect("loads");
        assert_eq!(loaded, config);
        assert_eq!(loaded.current().map(|c| c.name.as_str()), Some("prod"));
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt as _;
            let mode = std::fs::metadata(&path)
                .expect("exists")
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o600);
        }
    }

    #[test]
    fn contexts_are_replaced_by_name_and_chosen_by_name() {
        let mut config = Config::default();
        config.upsert(context("local", LOCAL_SERVER));
        let mut changed = context("local", LOCAL_SERVER);
        changed.project = Some("team".into());
        config.upsert(changed);
        config.upsert(context("other", "http://10.0.0.1:7070"));
        assert_eq!(config.contexts.len(), 2);
        assert_eq!(
            config.context("local").and_then(|c| c.project.as_deref()),
            Some("team")
        );
        config.use_context("local").expect("exists");
        assert_eq!(config.current_context.as_deref(), Some("local"));
        let error = config.use_context("nope").expect_err("absent");
        assert!(error.to_string().contains("local, other"), "{error}");
    }

    #[test]
    fn tokens_never_show_in_debug_output() {
        let shown = format!("{:?}", context("local", LOCAL_SERVER));
        assert!(!shown.contains("secret-token"), "{shown}");
    }

    #[test]
    fn a_broken_file_is_an_error_naming_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("config.yaml");
        std::fs::write(&path, "contexts: [\n").expect("write");
        let error = Config::load(&path).expect_err("broken");
        assert!(error.to_string().contains("config.yaml"), "{error}");
    }

    #[test]
    fn context_names_come_from_the_server() {
        assert_eq!(context_name_for("http://127.0.0.1:7070/"), "local");
        assert_eq!(
            context_name_for("https://nodus.example.com/"),
            "nodus.example.com"
        );
        assert_eq!(context_name_for("http://127.0.0.1:8080"), "127.0.0.1:8080");
    }
}

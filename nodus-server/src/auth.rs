//! Bearer tokens: each bound to one or more projects. Tokens are stored by their SHA-256
//! hash only; the token itself is shown once, when it is made.

use std::path::Path;
use std::sync::Arc;

use axum::http::HeaderMap;
use nodus_core::resource::Kind;
use nodus_core::store::{self, ObjectKey, Store};
use serde::{Deserialize, Serialize};

use crate::error::ApiError;

pub use nodus_core::ledger::SYSTEM_PROJECT;
/// The read-only project with the ready-made agent templates, readable from every project.
pub const TEMPLATE_PROJECT: &str = "nodus";
/// The project made on first start.
pub const DEFAULT_PROJECT: &str = "default";
/// The file in the data directory that holds the first admin token.
pub const ADMIN_TOKEN_FILE: &str = "admin-token";

/// Who is calling.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    /// The projects the token holds.
    pub projects: Vec<String>,
    /// Whether it may add credits.
    pub admin: bool,
}

impl Principal {
    /// Whether the caller may read `project` (its own, and the template project).
    pub fn check_read(&self, project: &str) -> Result<(), ApiError> {
        if project == TEMPLATE_PROJECT || self.projects.iter().any(|p| p == project) {
            return Ok(());
        }
        Err(no_access(project))
    }

    /// Whether the caller may write in `project` (its own; the template project is read-only).
    pub fn check_write(&self, project: &str) -> Result<(), ApiError> {
        if project == TEMPLATE_PROJECT {
            return Err(ApiError::forbidden(format!(
                "project {TEMPLATE_PROJECT:?} is read-only: it holds Nodus's ready-made agents"
            )));
        }
        if self.projects.iter().any(|p| p == project) {
            return Ok(());
        }
        Err(no_access(project))
    }

    /// Whether the caller may administer `project` (add credits).
    pub fn check_admin(&self, project: &str) -> Result<(), ApiError> {
        self.check_write(project)?;
        if !self.admin {
            return Err(ApiError::forbidden("only an admin token can add credits"));
        }
        Ok(())
    }
}

/// The same answer whether or not the project exists: the caller learns nothing about it.
fn no_access(project: &str) -> ApiError {
    ApiError::forbidden(format!("this token does not hold project {project:?}"))
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct TokenSpec {
    projects: Vec<String>,
    admin: bool,
}

/// Tokens, kept in the store by hash.
#[derive(Clone)]
pub struct Auth {
    store: Arc<dyn Store>,
}

impl Auth {
    /// Tokens in this store.
    pub fn new(store: Arc<dyn Store>) -> Self {
        Auth { store }
    }

    fn key(token: &str) -> ObjectKey {
        let hash = nodus_core::digest::sha256_hex(token.as_bytes());
        ObjectKey::new(SYSTEM_PROJECT, Kind::Token, hash)
    }

    /// Register a token for these projects (replacing what it held).
    pub async fn register(
        &self,
        token: &str,
        projects: &[&str],
        admin: bool,
    ) -> Result<(), store::Error> {
        let key = Self::key(token);
        let document = serde_json::json!({
            "apiVersion": nodus_core::resource::API_VERSION,
            "kind": "Token",
            "metadata": {"name": key.name},
            "spec": TokenSpec { projects: projects.iter().map(|p| p.to_string()).collect(), admin },
        });
        match self.store.get(&key).await {
            Ok(record) => self
                .store
                .update(&key, record.version, document)
                .await
                .map(|_| ()),
            Err(store::Error::NotFound(_)) => self.store.create(&key, document).await.map(|_| ()),
            Err(e) => Err(e),
        }
    }

    /// The caller of a request, from its `Authorization: Bearer` header.
    pub async fn authenticate(&self, headers: &HeaderMap) -> Result<Principal, ApiError> {
        let token = headers
            .get(axum::http::header::AUTHORIZATION)
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.strip_prefix("Bearer "))
            .map(str::trim)
            .filter(|token| !token.is_empty())
            .ok_or_else(ApiError::unauthorized)?;
        let record = match self.store.get(&Self::key(token)).await {
            Ok(record) => record,
            Err(store::Error::NotFound(_)) => return Err(ApiError::unauthorized()),
            Err(e) => return Err(e.into()),
        };
        let spec: TokenSpec = serde_json::from_value(record.document["spec"].clone())
            .map_err(|_| ApiError::unauthorized())?;
        Ok(Principal {
            projects: spec.projects,
            admin: spec.admin,
        })
    }
}

/// A new random token.
pub fn new_token() -> Result<String, getrandom::Error> {
    let mut bytes = [0u8; 24];
    getrandom::fill(&mut bytes)?;
    Ok(format!(
        "nodus_{}",
        bytes.iter().map(|b| format!("{b:02x}")).collect::<String>()
    ))
}

/// Write a file that only its owner can read, failing if it exists.
pub fn write_private_file(path: &Path, contents: &str) -> std::io::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
    file.write_all(contents.as_bytes())?;
    file.sync_all()
}

//! Bearer tokens: each bound to one or more projects. Tokens are stored by their
//! HMAC-SHA256 under a key derived from the server's `secret.key` only, so a stolen database
//! alone does not let anyone test guesses of a token; the token itself is shown once, when
//! it is made. Tokens stored by a plain SHA-256 (before the key) still work, and are stored
//! again under the key when first used.

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

/// The shortest admin token `--bootstrap-token` takes, in characters.
pub const MIN_BOOTSTRAP_TOKEN_CHARS: usize = 32;

/// The key tokens are hashed with: derived from the server's secret key.
#[derive(Clone)]
pub struct TokenKey([u8; 32]);

impl TokenKey {
    /// The token key of a server key.
    pub fn derive(server_key: &[u8; 32]) -> Self {
        TokenKey(nodus_core::digest::hmac_sha256(
            server_key,
            b"nodus token hashing v1",
        ))
    }

    /// The name a token is stored under.
    pub fn hash(&self, token: &str) -> String {
        nodus_core::digest::hmac_sha256_hex(&self.0, token.as_bytes())
    }
}

/// Tokens, kept in the store by keyed hash.
#[derive(Clone)]
pub struct Auth {
    store: Arc<dyn Store>,
    key: TokenKey,
}

impl Auth {
    /// Tokens in this store, hashed with `key`.
    pub fn new(store: Arc<dyn Store>, key: TokenKey) -> Self {
        Auth { store, key }
    }

    fn key(&self, token: &str) -> ObjectKey {
        ObjectKey::new(SYSTEM_PROJECT, Kind::Token, self.key.hash(token))
    }

    /// Where a token made before tokens were keyed is stored: its plain SHA-256.
    fn legacy_key(token: &str) -> ObjectKey {
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
        let key = self.key(token);
        let document = serde_json::json!({
            "apiVersion": nodus_core::resource::API_VERSION,
            "kind": "Token",
            "metadata": {"name": key.name},
            "spec": TokenSpec { projects: projects.iter().map(|p| p.to_string()).collect(), admin },
        });
        match self.store.get(&key).await {
            // Registered as it is already (every start registers the admin token): nothing
            // to write, so that a server starts on a full disk.
            Ok(record) if record.document == document => {}
            Ok(record) => {
                self.store.update(&key, record.version, document).await?;
            }
            Err(store::Error::NotFound(_)) => {
                self.store.create(&key, document).await?;
            }
            Err(e) => return Err(e),
        }
        // The same token stored before tokens were keyed would still open the door.
        let legacy = Self::legacy_key(token);
        match self.store.get(&legacy).await {
            Ok(_) => match self.store.delete(&legacy).await {
                Ok(()) | Err(store::Error::NotFound(_)) => Ok(()),
                Err(e) => Err(e),
            },
            Err(store::Error::NotFound(_)) => Ok(()),
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
        let record = match self.store.get(&self.key(token)).await {
            Ok(record) => record,
            Err(store::Error::NotFound(_)) => return self.authenticate_legacy(token).await,
            Err(e) => return Err(e.into()),
        };
        let spec: TokenSpec = serde_json::from_value(record.document["spec"].clone())
            .map_err(|_| ApiError::unauthorized())?;
        Ok(Principal {
            projects: spec.projects,
            admin: spec.admin,
        })
    }

    /// A token stored by its plain SHA-256 (before tokens were keyed): accepted, and stored
    /// again under the keyed hash (the plain one is removed).
    async fn authenticate_legacy(&self, token: &str) -> Result<Principal, ApiError> {
        let record = match self.store.get(&Self::legacy_key(token)).await {
            Ok(record) => record,
            Err(store::Error::NotFound(_)) => return Err(ApiError::unauthorized()),
            Err(e) => return Err(e.into()),
        };
        let spec: TokenSpec = serde_json::from_value(record.document["spec"].clone())
            .map_err(|_| ApiError::unauthorized())?;
        let projects: Vec<&str> = spec.projects.iter().map(String::as_str).collect();
        if let Err(error) = self.register(token, &projects, spec.admin).await {
            // The token still works this time; storing it keyed is tried again next time.
            tracing::warn!(error = %error, "cannot store a token under its keyed hash");
        }
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
    use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
    // The mode given to `open` passes through the umask; this one does not.
    file.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    file.write_all(contents.as_bytes())?;
    file.sync_all()
}

//! Bearer tokens: each belongs to one project, with a role there (`read`, `write`, `admin`),
//! and perhaps an expiry; the bootstrap token is the server's operator token as well. Tokens
//! are stored by their HMAC-SHA256 under a key derived from the server's `secret.key` only,
//! so a stolen database alone does not let anyone test guesses of a token; the token itself
//! is shown once, when it is made. Tokens stored by a plain SHA-256 (before the key) still
//! work, and are stored again under the key when first used.
//!
//! A token is two documents: under [`SYSTEM_PROJECT`] by its keyed hash (what a request is
//! checked against, read on every request: deleting it revokes the token at once), and in
//! its project by its name (what `get tokens` lists and `delete token` names).

use std::path::Path;
use std::sync::Arc;

use axum::http::HeaderMap;
use jiff::{SignedDuration, Timestamp};
use nodus_core::clock::Clock;
use nodus_core::engine::Reason;
use nodus_core::resource::Kind;
use nodus_core::store::{self, ObjectKey, Selector, Store};
use nodus_core::validate::{Invalid, is_dns_label};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::error::{ApiError, ApiResult};

pub use nodus_core::ledger::SYSTEM_PROJECT;
/// The read-only project with the ready-made agent templates, readable from every project.
pub const TEMPLATE_PROJECT: &str = "nodus";
/// The project made on first start.
pub const DEFAULT_PROJECT: &str = "default";
/// The file in the data directory that holds the first admin token.
pub const ADMIN_TOKEN_FILE: &str = "admin-token";
/// The name of the bootstrap token in the project `default`.
pub const OPERATOR_TOKEN_NAME: &str = "admin";
/// The server's own kind of stored document, which nodus-core does not know: a token, stored
/// as `tokens` (under [`SYSTEM_PROJECT`] by keyed hash, in its project by name). A project is
/// a project for the server when it has a credit account ([`nodus_core::ledger::projects`]).
pub const TOKEN: Kind = Kind::extension("tokens");
/// The longest expiry a token may have, in days.
pub const MAX_EXPIRY_DAYS: i64 = 3650;

/// What a token may do in its projects; each role may do what the one before it may.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Get, list and watch.
    Read,
    /// And create, change, delete, send, cancel, resolve and close.
    Write,
    /// And credits, budgets and tokens.
    Admin,
}

impl Role {
    /// The role as written (`read`).
    pub fn name(self) -> &'static str {
        match self {
            Role::Read => "read",
            Role::Write => "write",
            Role::Admin => "admin",
        }
    }

    /// The role `text` names, or an error naming `field`.
    pub fn parse(field: &str, text: &str) -> Result<Role, Invalid> {
        match text {
            "read" => Ok(Role::Read),
            "write" => Ok(Role::Write),
            "admin" => Ok(Role::Admin),
            _ => Err(Invalid::new(
                field,
                "must be one of read, write, admin",
                format!("{text:?}"),
            )),
        }
    }
}

/// Who is calling.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    /// The projects the token holds.
    pub projects: Vec<String>,
    /// What it may do there.
    pub role: Role,
    /// The server's operator token (the bootstrap token): an admin of every project that
    /// exists (they are its `projects`), and the one that creates projects.
    pub operator: bool,
    /// The token's id: its keyed hash (never the token), what open streams and bodies are
    /// counted and ended by.
    pub token_id: String,
    /// When the token expires, if it does.
    pub expires_at: Option<Timestamp>,
}

impl Principal {
    fn holds(&self, project: &str) -> bool {
        self.projects.iter().any(|p| p == project)
    }

    /// Whether the caller may read `project` (its own, and the template project).
    pub fn check_read(&self, project: &str) -> Result<(), ApiError> {
        if project == TEMPLATE_PROJECT || self.holds(project) {
            return Ok(());
        }
        Err(no_access(project))
    }

    /// Whether the caller may write in `project` (its own; the template project is read-only).
    pub fn check_write(&self, project: &str) -> Result<(), ApiError> {
        self.check_role(project, Role::Write, "create, change or delete")
    }

    /// Whether the caller may administer `project`: `what` (add credits, change budgets,
    /// manage tokens) is what an admin token may do and a write token may not.
    pub fn check_admin(&self, project: &str, what: &str) -> Result<(), ApiError> {
        self.check_role(project, Role::Admin, what)
    }

    fn check_role(&self, project: &str, least: Role, what: &str) -> Result<(), ApiError> {
        if project == TEMPLATE_PROJECT {
            return Err(ApiError::forbidden(format!(
                "project {TEMPLATE_PROJECT:?} is read-only: it holds Nodus's ready-made agents"
            )));
        }
        if !self.holds(project) {
            return Err(no_access(project));
        }
        let role = self.role;
        if role < least {
            return Err(ApiError::forbidden(format!(
                "this token's role is {}: only a token with the role {} or above may {what}",
                role.name(),
                least.name()
            )));
        }
        Ok(())
    }

    /// Whether the caller is shown what only a project's admins see (an Environment's
    /// `hidden` grading data): an admin token of `project` (the operator token holds every
    /// project).
    pub fn administers(&self, project: &str) -> bool {
        self.role >= Role::Admin && self.holds(project)
    }

    /// Whether the caller is the server's operator (to create projects).
    pub fn check_operator(&self, what: &str) -> Result<(), ApiError> {
        if self.operator {
            return Ok(());
        }
        Err(ApiError::forbidden(format!(
            "only the server's operator token (the bootstrap admin token) may {what}"
        )))
    }
}

/// The same answer whether or not the project exists: the caller learns nothing about it.
fn no_access(project: &str) -> ApiError {
    ApiError::forbidden(format!("this token does not hold project {project:?}"))
}

fn is_false(value: &bool) -> bool {
    !*value
}

/// What a request is checked against, stored under the token's keyed hash.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct TokenSpec {
    projects: Vec<String>,
    /// Tokens made before roles: `true` for an admin, `false` for a write token.
    #[serde(default, skip_serializing)]
    admin: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    role: Option<Role>,
    #[serde(default, skip_serializing_if = "is_false")]
    operator: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    expires_at: Option<Timestamp>,
}

impl TokenSpec {
    fn role(&self) -> Role {
        self.role
            .unwrap_or(if self.admin { Role::Admin } else { Role::Write })
    }
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

/// A token to make: `POST …/tokens`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TokenRequest {
    #[serde(default, rename = "apiVersion")]
    _api_version: Option<String>,
    #[serde(default, rename = "kind")]
    _kind: Option<String>,
    metadata: RequestMeta,
    spec: TokenRequestSpec,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RequestMeta {
    name: String,
    #[serde(default)]
    project: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TokenRequestSpec {
    role: String,
    #[serde(default)]
    expires: Option<String>,
}

/// A project to make: `POST /apis/nodus.dev/v1/projects`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ProjectRequest {
    #[serde(default, rename = "apiVersion")]
    _api_version: Option<String>,
    #[serde(default, rename = "kind")]
    _kind: Option<String>,
    metadata: RequestMeta,
}

fn name_rule() -> &'static str {
    "must be a DNS-1123 label: 1 to 63 characters of a-z, 0-9 and -, starting and ending \
     with a letter or digit"
}

/// `--expires`: a duration such as `30d`, `12h`, `90m`, `1d12h`.
pub fn parse_expiry(field: &str, text: &str) -> Result<SignedDuration, Invalid> {
    let bad = || {
        Invalid::new(
            field,
            format!(
                "must be a duration such as 30d, 12h or 90m (units d, h, m, s), more than \
                 zero and at most {MAX_EXPIRY_DAYS}d"
            ),
            format!("{text:?}"),
        )
    };
    let mut seconds: i64 = 0;
    let mut rest = text.trim();
    if rest.is_empty() {
        return Err(bad());
    }
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !c.is_ascii_digit()).ok_or_else(bad)?;
        if digits == 0 {
            return Err(bad());
        }
        let number: i64 = rest[..digits].parse().map_err(|_| bad())?;
        let unit = match rest[digits..].chars().next() {
            Some('d') => 86_400,
            Some('h') => 3_600,
            Some('m') => 60,
            Some('s') => 1,
            _ => return Err(bad()),
        };
        seconds = number
            .checked_mul(unit)
            .and_then(|s| s.checked_add(seconds))
            .ok_or_else(bad)?;
        rest = &rest[digits + 1..];
    }
    if seconds <= 0 || seconds > MAX_EXPIRY_DAYS * 86_400 {
        return Err(bad());
    }
    Ok(SignedDuration::from_secs(seconds))
}

fn parse_body<T: serde::de::DeserializeOwned>(body: Value, shape: &str) -> ApiResult<T> {
    serde_json::from_value(body).map_err(|e| {
        ApiError::from(Invalid::new(
            "body",
            format!("must be {shape}"),
            e.to_string(),
        ))
    })
}

fn check_name(name: &str) -> Result<(), Invalid> {
    if is_dns_label(name) {
        return Ok(());
    }
    Err(Invalid::new(
        "metadata.name",
        name_rule(),
        format!("{name:?}"),
    ))
}

/// Tokens and projects, kept in the store (tokens by keyed hash).
#[derive(Clone)]
pub struct Auth {
    store: Arc<dyn Store>,
    key: TokenKey,
    clock: Arc<dyn Clock>,
}

impl Auth {
    /// Tokens in this store, hashed with `key`; expiry is read on `clock`.
    pub fn new(store: Arc<dyn Store>, key: TokenKey, clock: Arc<dyn Clock>) -> Self {
        Auth { store, key, clock }
    }

    fn key(&self, token: &str) -> ObjectKey {
        ObjectKey::new(SYSTEM_PROJECT, TOKEN, self.key.hash(token))
    }

    fn hash_key(hash: &str) -> ObjectKey {
        ObjectKey::new(SYSTEM_PROJECT, TOKEN, hash)
    }

    fn name_key(project: &str, name: &str) -> ObjectKey {
        ObjectKey::new(project, TOKEN, name)
    }

    fn project_key(project: &str) -> ObjectKey {
        nodus_core::ledger::account_key(project)
    }

    /// Where a token made before tokens were keyed is stored: its plain SHA-256.
    fn legacy_key(token: &str) -> ObjectKey {
        let hash = nodus_core::digest::sha256_hex(token.as_bytes());
        ObjectKey::new(SYSTEM_PROJECT, TOKEN, hash)
    }

    /// Write `document` at `key` unless it is there as it is (so that a server starts on a
    /// full disk).
    async fn put(&self, key: &ObjectKey, document: Value) -> Result<(), store::Error> {
        match self.store.get(key).await {
            Ok(record) if record.document == document => Ok(()),
            Ok(record) => self
                .store
                .update(key, record.version, document)
                .await
                .map(|_| ()),
            Err(store::Error::NotFound(_)) => self.store.create(key, document).await.map(|_| ()),
            Err(e) => Err(e),
        }
    }

    async fn delete_quietly(&self, key: &ObjectKey) -> Result<(), store::Error> {
        match self.store.delete(key).await {
            Ok(()) | Err(store::Error::NotFound(_)) => Ok(()),
            Err(e) => Err(e),
        }
    }

    fn hash_document(hash: &str, spec: &TokenSpec) -> Value {
        json!({
            "apiVersion": nodus_core::resource::API_VERSION,
            "kind": "Token",
            "metadata": {"name": hash},
            "spec": spec,
        })
    }

    /// Store the token's hash document (replacing what it held), and remove the plain
    /// SHA-256 one if there is one.
    async fn register(&self, token: &str, spec: &TokenSpec) -> Result<(), store::Error> {
        let key = self.key(token);
        self.put(&key, Self::hash_document(&key.name, spec)).await?;
        // The same token stored before tokens were keyed would still open the door.
        let legacy = Self::legacy_key(token);
        match self.store.get(&legacy).await {
            Ok(_) => self.delete_quietly(&legacy).await,
            Err(store::Error::NotFound(_)) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Register the bootstrap token as the server's operator token: named
    /// [`OPERATOR_TOKEN_NAME`] in the project `default`, an admin of every project. A
    /// bootstrap token given before in its place is not removed (replicas that do not share
    /// `secret.key` each register theirs).
    pub async fn register_operator(&self, token: &str) -> Result<(), store::Error> {
        let spec = TokenSpec {
            projects: vec![DEFAULT_PROJECT.to_string()],
            admin: false,
            role: Some(Role::Admin),
            operator: true,
            expires_at: None,
        };
        let hash = self.key.hash(token);
        let name_key = Self::name_key(DEFAULT_PROJECT, OPERATOR_TOKEN_NAME);
        let created = match self.store.get(&name_key).await {
            Ok(record) => record.document["metadata"]["creationTimestamp"]
                .as_str()
                .and_then(|t| t.parse().ok())
                .unwrap_or_else(|| self.clock.now()),
            Err(store::Error::NotFound(_)) => self.clock.now(),
            Err(e) => return Err(e),
        };
        self.register(token, &spec).await?;
        self.put(
            &name_key,
            name_document(DEFAULT_PROJECT, OPERATOR_TOKEN_NAME, &spec, created, &hash),
        )
        .await
    }

    /// The caller of a request, from its `Authorization: Bearer` header. Read from the store
    /// every time: a deleted token is refused on the next request.
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
        self.principal(record.key.name, spec).await
    }

    /// Whether the token of `token_id` (its keyed hash, [`Principal::token_id`]) is still
    /// valid: `Ok(false)` once it was deleted or has expired.
    pub async fn is_valid(&self, token_id: &str) -> Result<bool, store::Error> {
        let record = match self.store.get(&Self::hash_key(token_id)).await {
            Ok(record) => record,
            Err(store::Error::NotFound(_)) => return Ok(false),
            Err(e) => return Err(e),
        };
        let Ok(spec) = serde_json::from_value::<TokenSpec>(record.document["spec"].clone()) else {
            return Ok(false);
        };
        Ok(spec
            .expires_at
            .is_none_or(|expires_at| expires_at > self.clock.now()))
    }

    /// Whether `key` is where a token is checked (a change there may revoke it).
    pub fn is_token_key(key: &ObjectKey) -> bool {
        key.project == SYSTEM_PROJECT && key.kind == TOKEN
    }

    /// The names of every project (not the system's own).
    async fn project_names(&self) -> Result<Vec<String>, store::Error> {
        let mut names: Vec<String> = nodus_core::ledger::projects(self.store.as_ref())
            .await?
            .into_iter()
            .filter(|name| name != SYSTEM_PROJECT)
            .collect();
        names.sort();
        Ok(names)
    }

    /// Who the holder of a token of `spec` is: the operator holds every project that exists
    /// now (read at each request, so a new project is held at once).
    async fn principal(&self, token_id: String, spec: TokenSpec) -> Result<Principal, ApiError> {
        if let Some(expires_at) = spec.expires_at
            && expires_at <= self.clock.now()
        {
            return Err(ApiError::new(
                axum::http::StatusCode::UNAUTHORIZED,
                Reason::Unauthorized,
                format!("this token expired at {expires_at}; ask an admin for a new one"),
            ));
        }
        let projects = if spec.operator {
            self.project_names().await?
        } else {
            spec.projects.clone()
        };
        Ok(Principal {
            role: spec.role(),
            operator: spec.operator,
            projects,
            token_id,
            expires_at: spec.expires_at,
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
        let mut spec: TokenSpec = serde_json::from_value(record.document["spec"].clone())
            .map_err(|_| ApiError::unauthorized())?;
        spec.role = Some(spec.role());
        if let Err(error) = self.register(token, &spec).await {
            // The token still works this time; storing it keyed is tried again next time.
            tracing::warn!(error = %error, "cannot store a token under its keyed hash");
        }
        self.principal(self.key.hash(token), spec).await
    }

    /// Whether `project` exists.
    pub async fn project_exists(&self, project: &str) -> ApiResult<bool> {
        match self.store.get(&Self::project_key(project)).await {
            Ok(_) => Ok(true),
            Err(store::Error::NotFound(_)) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// `POST …/tokens`: a new token of `project`. The answer shows the token once (`token`);
    /// only its keyed hash is stored.
    pub async fn create_token(&self, project: &str, body: Value) -> ApiResult<Value> {
        let request: TokenRequest = parse_body(
            body,
            "a Token: {\"metadata\": {\"name\": NAME}, \"spec\": {\"role\": \
             \"read|write|admin\", \"expires\": \"30d\"}}",
        )?;
        check_name(&request.metadata.name)?;
        if let Some(other) = &request.metadata.project
            && other != project
        {
            return Err(Invalid::new(
                "metadata.project",
                format!("must be the project of the path, {project:?}"),
                format!("{other:?}"),
            )
            .into());
        }
        let role = Role::parse("spec.role", &request.spec.role)?;
        let now = self.clock.now();
        let expires_at = match &request.spec.expires {
            None => None,
            Some(text) => Some(
                now.checked_add(parse_expiry("spec.expires", text)?)
                    .map_err(|e| ApiError::internal(e.to_string()))?,
            ),
        };
        if project == TEMPLATE_PROJECT || !self.project_exists(project).await? {
            return Err(Invalid::new(
                "project",
                "must be an existing project (nodus create project NAME)",
                format!("{project:?}"),
            )
            .into());
        }
        let token = new_token().map_err(|e| ApiError::internal(format!("no randomness: {e}")))?;
        let hash = self.key.hash(&token);
        let spec = TokenSpec {
            projects: vec![project.to_string()],
            admin: false,
            role: Some(role),
            operator: false,
            expires_at,
        };
        let name = request.metadata.name;
        // The name first: a second token of the same name is refused before anything else
        // is written.
        let name_key = Self::name_key(project, &name);
        self.store
            .create(&name_key, name_document(project, &name, &spec, now, &hash))
            .await?;
        if let Err(error) = self
            .store
            .create(&Self::hash_key(&hash), Self::hash_document(&hash, &spec))
            .await
        {
            let _ = self.delete_quietly(&name_key).await;
            return Err(error.into());
        }
        let mut view = token_view(project, &name, &spec, now);
        view["token"] = Value::String(token);
        Ok(view)
    }

    /// `GET …/tokens`: the project's tokens, never their secrets.
    pub async fn list_tokens(&self, project: &str) -> ApiResult<Vec<Value>> {
        Ok(self
            .store
            .list(project, TOKEN, &Selector::default())
            .await?
            .into_iter()
            .map(|record| public_view(record.document))
            .collect())
    }

    /// `GET …/tokens/{name}`.
    pub async fn get_token(&self, project: &str, name: &str) -> ApiResult<Value> {
        let record = self
            .store
            .get(&Self::name_key(project, name))
            .await
            .map_err(|e| token_not_found(e, project, name))?;
        Ok(public_view(record.document))
    }

    /// `DELETE …/tokens/{name}`: the token is refused from the next request on.
    pub async fn delete_token(&self, project: &str, name: &str) -> ApiResult<Value> {
        let name_key = Self::name_key(project, name);
        let record = self
            .store
            .get(&name_key)
            .await
            .map_err(|e| token_not_found(e, project, name))?;
        if record.document["spec"]["operator"].as_bool() == Some(true) {
            return Err(ApiError::forbidden(format!(
                "token {name:?} is the server's operator token: change it with the server's \
                 --bootstrap-token instead"
            )));
        }
        if let Some(hash) = record.document["tokenHash"].as_str() {
            self.delete_quietly(&Self::hash_key(hash)).await?;
        }
        self.delete_quietly(&name_key).await?;
        Ok(public_view(record.document))
    }

    /// `POST /apis/nodus.dev/v1/projects`: a new project, with no credits and no tokens.
    pub async fn create_project(
        &self,
        body: Value,
        ledger: &nodus_core::ledger::StoreLedger,
    ) -> ApiResult<Value> {
        let request: ProjectRequest =
            parse_body(body, "a Project: {\"metadata\": {\"name\": NAME}}")?;
        let name = request.metadata.name;
        check_name(&name)?;
        if request.metadata.project.is_some() {
            return Err(Invalid::new(
                "metadata.project",
                "must be absent: a project is in no project",
                "given",
            )
            .into());
        }
        if self.project_exists(&name).await? {
            return Err(ApiError::new(
                axum::http::StatusCode::CONFLICT,
                Reason::AlreadyExists,
                format!("project {name:?} already exists"),
            ));
        }
        ledger.open(&name, nodus_core::Usd::ZERO).await?;
        Ok(project_view(&name))
    }

    /// `GET /apis/nodus.dev/v1/projects`: the projects the caller holds (every project for
    /// the operator).
    pub async fn list_projects(&self, caller: &Principal) -> ApiResult<Vec<Value>> {
        Ok(self
            .project_names()
            .await?
            .iter()
            .filter(|name| caller.projects.contains(name))
            .map(|name| project_view(name))
            .collect())
    }
}

fn token_not_found(error: store::Error, project: &str, name: &str) -> ApiError {
    match error {
        store::Error::NotFound(_) => {
            ApiError::not_found(format!("no token {name:?} in project {project:?}"))
        }
        e => e.into(),
    }
}

fn project_view(name: &str) -> Value {
    json!({"apiVersion": nodus_core::resource::API_VERSION, "kind": "Project", "metadata": {"name": name}})
}

/// What `get tokens` shows of a token: never its secret, nor its hash.
fn token_view(project: &str, name: &str, spec: &TokenSpec, created: Timestamp) -> Value {
    let mut view_spec = json!({"role": spec.role(), "projects": spec.projects});
    if spec.operator {
        view_spec["operator"] = Value::Bool(true);
    }
    if let Some(expires_at) = spec.expires_at {
        view_spec["expiresAt"] = json!(expires_at);
    }
    json!({
        "apiVersion": nodus_core::resource::API_VERSION,
        "kind": "Token",
        "metadata": {"name": name, "project": project, "creationTimestamp": created},
        "spec": view_spec,
    })
}

fn name_document(
    project: &str,
    name: &str,
    spec: &TokenSpec,
    created: Timestamp,
    hash: &str,
) -> Value {
    let mut document = token_view(project, name, spec, created);
    document["tokenHash"] = Value::String(hash.to_string());
    document
}

fn public_view(mut document: Value) -> Value {
    if let Some(object) = document.as_object_mut() {
        object.remove("tokenHash");
    }
    document
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expiries_parse_and_bad_ones_name_the_field() {
        assert_eq!(
            parse_expiry("spec.expires", "30d").map(|d| d.as_secs()),
            Ok(30 * 86_400)
        );
        assert_eq!(
            parse_expiry("spec.expires", "1d12h").map(|d| d.as_secs()),
            Ok(36 * 3_600)
        );
        for bad in [
            "",
            "0d",
            "30",
            "30y",
            "d",
            "-1d",
            "3651d",
            "99999999999999999999d",
        ] {
            let error = parse_expiry("spec.expires", bad).expect_err(bad);
            assert_eq!(error.field, "spec.expires", "{bad}");
        }
    }
}

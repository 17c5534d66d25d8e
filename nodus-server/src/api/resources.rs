//! Create, read, list, replace, merge-patch and delete of every kind.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use nodus_core::engine::{Engine, Replaceable};
use nodus_core::resource::{
    API_VERSION, AgentGroupSpec, AgentRun, AgentRunSpec, AgentSpec, EnvironmentSpec, FileSetSpec,
    Kind, Object,
};
use nodus_core::store::{ObjectKey, Selector};
use nodus_core::validate::{self, Invalid, Validate};
use serde_json::{Value, json};

use super::selectors::ListQuery;
use super::{caller, json_body, reply};
use crate::app::AppState;
use crate::error::{ApiError, ApiResult};
use crate::watch::{Target, WatchQuery};

fn kind_of(plural: &str) -> ApiResult<Kind> {
    match Kind::from_plural(plural) {
        Some(
            kind @ (Kind::Agent
            | Kind::AgentRun
            | Kind::AgentGroup
            | Kind::Secret
            | Kind::Budget
            | Kind::FileSet
            | Kind::Environment),
        ) => Ok(kind),
        _ => Err(ApiError::not_found(format!(
            "no resource type {plural:?}; there are agents, agentruns, agentgroups, secrets, \
             budgets, filesets and environments"
        ))),
    }
}

/// The kind of `plural`, once the caller may change it in `project`: budgets need an admin
/// token, the other kinds a write token.
async fn check_change(
    state: &AppState,
    headers: &HeaderMap,
    project: &str,
    plural: &str,
) -> ApiResult<Kind> {
    let caller = caller(state, headers).await?;
    caller.check_write(project)?;
    let kind = kind_of(plural)?;
    if kind == Kind::Budget {
        caller.check_admin(project, "create, change or delete budgets")?;
    }
    Ok(kind)
}

fn to_value(object: &impl serde::Serialize) -> ApiResult<Value> {
    serde_json::to_value(object).map_err(|e| ApiError::malformed(e.to_string()))
}

fn list_of(kind: Kind, items: Vec<Value>) -> Value {
    json!({"apiVersion": API_VERSION, "kind": format!("{kind}List"), "items": items})
}

async fn list_typed<S: nodus_core::resource::Spec>(
    engine: &Engine,
    project: &str,
    selector: &Selector,
) -> ApiResult<Vec<Value>> {
    engine
        .list::<S>(project, selector)
        .await?
        .iter()
        .map(to_value)
        .collect()
}

/// `GET …/{plural}`; with `watch=true`, a long poll (see [`crate::watch`]): the list once its
/// `metadata.resourceVersion` differs from the client's.
pub async fn list(
    State(state): State<Arc<AppState>>,
    Path((project, plural)): Path<(String, String)>,
    Query(query): Query<ListQuery>,
    Query(watch): Query<WatchQuery>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    caller(&state, &headers).await?.check_read(&project)?;
    let kind = kind_of(&plural)?;
    let selector = query.selector()?;
    let Some(poll) = watch.long_poll(Target::List)? else {
        let answer = list_answer(&state, &project, kind, &selector).await?;
        return Ok(reply(StatusCode::OK, answer));
    };
    let (state, project, selector) = (&*state, project.as_str(), &selector);
    let answer = state
        .watches
        .answer_when_changed(
            state.store.as_ref(),
            &poll,
            |changed| changed.project == project && changed.kind == kind,
            || async move {
                let records = state
                    .store
                    .list_sparse(project, kind, selector, &["metadata.uid"])
                    .await?;
                Ok(crate::watch::list_version_of_records(&records))
            },
            || list_answer(state, project, kind, selector),
        )
        .await?;
    Ok(reply(StatusCode::OK, answer))
}

/// The list answer, with its `metadata.resourceVersion`.
async fn list_answer(
    state: &AppState,
    project: &str,
    kind: Kind,
    selector: &Selector,
) -> ApiResult<Value> {
    let items = match kind {
        Kind::Agent => list_typed::<AgentSpec>(&state.engine, project, selector).await?,
        Kind::FileSet => list_typed::<FileSetSpec>(&state.engine, project, selector).await?,
        Kind::AgentRun => list_typed::<AgentRunSpec>(&state.engine, project, selector).await?,
        Kind::AgentGroup => list_typed::<AgentGroupSpec>(&state.engine, project, selector).await?,
        Kind::Environment => {
            list_typed::<EnvironmentSpec>(&state.engine, project, selector).await?
        }
        _ => state
            .store
            .list(project, kind, selector)
            .await?
            .into_iter()
            .map(|record| with_version(plain_view(kind, record.document), record.version))
            .collect(),
    };
    let version = crate::watch::list_version_of(&items);
    let mut answer = list_of(kind, items);
    answer["metadata"] = json!({"resourceVersion": version});
    Ok(answer)
}

/// `GET …/{plural}/{name}`; with `watch=true`, a long poll (see [`crate::watch`]): the object
/// once its `metadata.resourceVersion` differs from the client's (`NotFound` once deleted).
pub async fn get(
    State(state): State<Arc<AppState>>,
    Path((project, plural, name)): Path<(String, String, String)>,
    Query(watch): Query<WatchQuery>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    caller(&state, &headers).await?.check_read(&project)?;
    let kind = kind_of(&plural)?;
    let Some(poll) = watch.long_poll(Target::Object)? else {
        let value = read(&state, &project, kind, &name).await?;
        return Ok(reply(StatusCode::OK, value));
    };
    let key = ObjectKey::new(&project, kind, &name);
    let (state, project, name) = (&*state, project.as_str(), name.as_str());
    let value = state
        .watches
        .answer_when_changed(
            state.store.as_ref(),
            &poll,
            |changed| *changed == key,
            || async move {
                let value = read(state, project, kind, name).await?;
                Ok(value["metadata"]["resourceVersion"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string())
            },
            || read(state, project, kind, name),
        )
        .await?;
    Ok(reply(StatusCode::OK, value))
}

async fn read(state: &AppState, project: &str, kind: Kind, name: &str) -> ApiResult<Value> {
    match kind {
        Kind::Agent => to_value(&state.engine.get::<AgentSpec>(project, name).await?),
        Kind::FileSet => to_value(&state.engine.get::<FileSetSpec>(project, name).await?),
        Kind::AgentRun => to_value(&state.engine.get::<AgentRunSpec>(project, name).await?),
        Kind::AgentGroup => to_value(&state.engine.get::<AgentGroupSpec>(project, name).await?),
        Kind::Environment => to_value(&state.engine.get::<EnvironmentSpec>(project, name).await?),
        _ => {
            let record = state
                .store
                .get(&ObjectKey::new(project, kind, name))
                .await?;
            Ok(with_version(
                plain_view(kind, record.document),
                record.version,
            ))
        }
    }
}

/// The object as a merge patch applies to it: as `get` shows it, but for a Secret its values
/// as `stringData` (opened here, sealed again when written; never answered), so that a patch
/// of its labels keeps them and a patch of `stringData` merges into them.
async fn editable(state: &AppState, project: &str, kind: Kind, name: &str) -> ApiResult<Value> {
    if kind != Kind::Secret {
        return read(state, project, kind, name).await;
    }
    let record = state
        .store
        .get(&ObjectKey::new(project, kind, name))
        .await?;
    let sealed = record.document["sealedData"].as_str().unwrap_or_default();
    let values = state
        .cipher
        .open(sealed)
        .map_err(|e| ApiError::internal(e.to_string()))?;
    let mut metadata = record.document["metadata"].clone();
    if let Some(metadata) = metadata.as_object_mut() {
        metadata.remove("project");
    }
    Ok(with_version(
        json!({
            "apiVersion": API_VERSION,
            "kind": "Secret",
            "metadata": metadata,
            "stringData": values,
        }),
        record.version,
    ))
}

/// What `get` shows of a plain document: a Secret's keys, never its values.
fn plain_view(kind: Kind, mut document: Value) -> Value {
    if kind == Kind::Secret
        && let Some(object) = document.as_object_mut()
    {
        object.remove("sealedData");
    }
    document
}

fn with_version(mut document: Value, version: u64) -> Value {
    document["metadata"]["resourceVersion"] = Value::String(version.to_string());
    document
}

/// `POST …/{plural}`: create one object, or a batch of runs (`AgentRunList`).
pub async fn create(
    State(state): State<Arc<AppState>>,
    Path((project, plural)): Path<(String, String)>,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult<Response> {
    let kind = check_change(&state, &headers, &project, &plural).await?;
    let mut document = json_body(&body)?;
    check_project(&mut document, &project)?;
    let created = match kind {
        Kind::AgentRun if document.get("kind").and_then(Value::as_str) == Some("AgentRunList") => {
            let key = headers
                .get("idempotency-key")
                .map(|v| {
                    v.to_str()
                        .map_err(|_| ApiError::malformed("Idempotency-Key must be text"))
                })
                .transpose()?;
            let runs = parse_run_list(document)?;
            let created = state.engine.create_runs(&project, runs, key).await?;
            list_of(
                Kind::AgentRun,
                created.iter().map(to_value).collect::<ApiResult<_>>()?,
            )
        }
        Kind::Agent => to_value(
            &state
                .engine
                .create::<AgentSpec>(&project, validate::parse(document)?)
                .await?,
        )?,
        Kind::FileSet => to_value(
            &state
                .engine
                .create::<FileSetSpec>(&project, validate::parse(document)?)
                .await?,
        )?,
        Kind::AgentRun => to_value(
            &state
                .engine
                .create_run(&project, validate::parse(document)?)
                .await?,
        )?,
        Kind::AgentGroup => to_value(
            &state
                .engine
                .create_group(&project, validate::parse(document)?)
                .await?,
        )?,
        Kind::Environment => {
            // A version is written once: the same spec again is answered as it is (200).
            let (environment, created) = state
                .engine
                .apply_environment(&project, validate::parse(document)?)
                .await?;
            let status = if created {
                StatusCode::CREATED
            } else {
                StatusCode::OK
            };
            return Ok(reply(status, to_value(&environment)?));
        }
        Kind::Secret | Kind::Budget => {
            let (name, stored) = plain_document(&state, &project, kind, document)?;
            let record = state
                .store
                .create(&ObjectKey::new(&project, kind, &name), stored)
                .await?;
            with_version(plain_view(kind, record.document), record.version)
        }
        _ => return Err(ApiError::not_found(format!("cannot create {plural}"))),
    };
    Ok(reply(StatusCode::CREATED, created))
}

fn parse_run_list(document: Value) -> ApiResult<Vec<AgentRun>> {
    let Value::Object(mut list) = document else {
        return Err(ApiError::malformed("an AgentRunList is an object"));
    };
    if let Some(unknown) = list
        .keys()
        .find(|k| !["apiVersion", "kind", "items", "metadata"].contains(&k.as_str()))
    {
        return Err(Invalid::new(unknown.clone(), "unknown field", format!("{unknown:?}")).into());
    }
    let Some(Value::Array(items)) = list.remove("items") else {
        return Err(Invalid::new("items", "is required: a list of AgentRuns", "nothing").into());
    };
    if items.len() > nodus_core::engine::MAX_BATCH {
        return Err(Invalid::new(
            "items",
            format!(
                "a batch holds at most {} runs",
                nodus_core::engine::MAX_BATCH
            ),
            items.len().to_string(),
        )
        .into());
    }
    items
        .into_iter()
        .enumerate()
        .map(|(index, item)| {
            validate::parse::<AgentRunSpec>(item).map_err(|invalid| {
                ApiError::from(Invalid::new(
                    format!("items[{index}].{}", invalid.field),
                    invalid.rule,
                    invalid.value,
                ))
            })
        })
        .collect()
}

/// The project in a document must be absent or the path's.
fn check_project(document: &mut Value, project: &str) -> ApiResult<()> {
    let given = document
        .pointer("/metadata/project")
        .and_then(Value::as_str);
    if let Some(given) = given
        && given != project
    {
        return Err(Invalid::new(
            "metadata.project",
            format!("must be the project in the path, {project:?}"),
            format!("{given:?}"),
        )
        .into());
    }
    if let Some(metadata) = document.get_mut("metadata").and_then(Value::as_object_mut) {
        metadata.remove("project");
    }
    Ok(())
}

/// A Secret (sealed) or a Budget (checked) as stored.
fn plain_document(
    state: &AppState,
    project: &str,
    kind: Kind,
    document: Value,
) -> ApiResult<(String, Value)> {
    let Value::Object(fields) = document else {
        return Err(ApiError::malformed(format!("a {kind} is a JSON object")));
    };
    let allowed: &[&str] = match kind {
        Kind::Secret => &["apiVersion", "kind", "metadata", "stringData", "type"],
        _ => &["apiVersion", "kind", "metadata", "spec"],
    };
    if let Some(unknown) = fields.keys().find(|k| !allowed.contains(&k.as_str())) {
        let hint = if unknown == "data" {
            "unknown field (write values as stringData)"
        } else {
            "unknown field"
        };
        return Err(Invalid::new(unknown.clone(), hint, format!("{unknown:?}")).into());
    }
    if fields.get("apiVersion").and_then(Value::as_str) != Some(API_VERSION) {
        return Err(Invalid::new(
            "apiVersion",
            format!("must be {API_VERSION}"),
            format!("{}", fields.get("apiVersion").unwrap_or(&Value::Null)),
        )
        .into());
    }
    if fields.get("kind").and_then(Value::as_str) != Some(&kind.to_string()) {
        return Err(Invalid::new(
            "kind",
            format!("must be {kind}"),
            format!("{}", fields.get("kind").unwrap_or(&Value::Null)),
        )
        .into());
    }
    let name = fields
        .get("metadata")
        .and_then(|m| m.get("name"))
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    if !validate::is_dns_label(&name) {
        return Err(Invalid::new(
            "metadata.name",
            "must be a DNS-1123 label (lowercase letters, digits and '-', at most 63)",
            format!("{name:?}"),
        )
        .into());
    }
    let metadata = json!({"name": name, "project": project, "labels": fields.get("metadata").and_then(|m| m.get("labels")).cloned().unwrap_or(json!({}))});
    let stored = match kind {
        Kind::Secret => {
            let values: BTreeMap<String, String> = match fields.get("stringData") {
                None => BTreeMap::new(),
                Some(data) => serde_json::from_value(data.clone()).map_err(|_| {
                    Invalid::new(
                        "stringData",
                        "is a map of string keys to string values",
                        "another shape",
                    )
                })?,
            };
            if let Some(key) = values.keys().find(|k| k.is_empty() || k.len() > 253) {
                return Err(Invalid::new(
                    "stringData",
                    "keys are 1 to 253 characters",
                    format!("{key:?}"),
                )
                .into());
            }
            let sealed = state
                .cipher
                .seal(&values)
                .map_err(|e| ApiError::internal(e.to_string()))?;
            json!({"apiVersion": API_VERSION, "kind": "Secret", "metadata": metadata, "keys": values.keys().collect::<Vec<_>>(), "sealedData": sealed})
        }
        _ => {
            let spec: crate::app::BudgetSpec =
                serde_json::from_value(fields.get("spec").cloned().unwrap_or(Value::Null))
                    .map_err(|e| {
                        Invalid::new(
                            "spec",
                            "is {maxSpendUSD: \"<decimal dollars>\"}",
                            e.to_string(),
                        )
                    })?;
            json!({"apiVersion": API_VERSION, "kind": "Budget", "metadata": metadata, "spec": spec})
        }
    };
    Ok((name, stored))
}

/// `PUT …/{plural}/{name}`: replace spec and labels (optimistic with `metadata.resourceVersion`).
pub async fn replace(
    State(state): State<Arc<AppState>>,
    Path((project, plural, name)): Path<(String, String, String)>,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult<Response> {
    let kind = check_change(&state, &headers, &project, &plural).await?;
    let mut document = json_body(&body)?;
    check_project(&mut document, &project)?;
    let value = put(&state, &project, kind, &name, document).await?;
    Ok(reply(StatusCode::OK, value))
}

fn expected_version(document: &Value) -> ApiResult<Option<u64>> {
    match document.pointer("/metadata/resourceVersion") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(text)) => text.parse().map(Some).map_err(|_| {
            Invalid::new(
                "metadata.resourceVersion",
                "is the version read from the server",
                format!("{text:?}"),
            )
            .into()
        }),
        Some(other) => {
            Err(Invalid::new("metadata.resourceVersion", "is a string", other.to_string()).into())
        }
    }
}

async fn put(
    state: &AppState,
    project: &str,
    kind: Kind,
    name: &str,
    mut document: Value,
) -> ApiResult<Value> {
    let expected = expected_version(&document)?;
    if let Some(object) = document.as_object_mut() {
        object.remove("status");
    }
    if let Some(metadata) = document.get_mut("metadata").and_then(Value::as_object_mut) {
        for field in ["resourceVersion", "uid", "creationTimestamp"] {
            metadata.remove(field);
        }
    }
    match kind {
        Kind::Agent => {
            replace_typed::<AgentSpec>(&state.engine, project, name, document, expected).await
        }
        Kind::FileSet => {
            replace_typed::<FileSetSpec>(&state.engine, project, name, document, expected).await
        }
        Kind::AgentRun => {
            replace_typed::<AgentRunSpec>(&state.engine, project, name, document, expected).await
        }
        Kind::AgentGroup => {
            replace_typed::<AgentGroupSpec>(&state.engine, project, name, document, expected).await
        }
        Kind::Environment => {
            let environment: Object<EnvironmentSpec> = validate::parse(document)?;
            let stored = format!("{}@{}", environment.name(), environment.spec.version);
            if stored != name {
                return Err(Invalid::new(
                    "metadata.name",
                    format!("with spec.version must make the name in the path, {name:?}"),
                    format!("{stored:?}"),
                )
                .into());
            }
            state.engine.get::<EnvironmentSpec>(project, name).await?;
            to_value(
                &state
                    .engine
                    .apply_environment(project, environment)
                    .await?
                    .0,
            )
        }
        _ => {
            let key = ObjectKey::new(project, kind, name);
            let current = state.store.get(&key).await?;
            let (given, stored) = plain_document(state, project, kind, document)?;
            if given != name {
                return Err(Invalid::new(
                    "metadata.name",
                    format!("must match the name in the path, {name:?}"),
                    format!("{given:?}"),
                )
                .into());
            }
            let record = state
                .store
                .update(&key, expected.unwrap_or(current.version), stored)
                .await?;
            Ok(with_version(
                plain_view(kind, record.document),
                record.version,
            ))
        }
    }
}

async fn replace_typed<S: Validate + Replaceable>(
    engine: &Engine,
    project: &str,
    name: &str,
    document: Value,
    expected: Option<u64>,
) -> ApiResult<Value> {
    let object: Object<S> = validate::parse(document)?;
    to_value(&engine.replace(project, name, object, expected).await?)
}

/// `PATCH …/{plural}/{name}`: a JSON merge patch of spec and labels.
pub async fn patch(
    State(state): State<Arc<AppState>>,
    Path((project, plural, name)): Path<(String, String, String)>,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult<Response> {
    let kind = check_change(&state, &headers, &project, &plural).await?;
    let patch = json_body(&body)?;
    if !patch.is_object() {
        return Err(ApiError::malformed("a merge patch is a JSON object"));
    }
    if patch.get("status").is_some() {
        return Err(Invalid::new(
            "status",
            "is written by Nodus, not patched",
            "a status patch",
        )
        .into());
    }
    let pinned = expected_version(&patch)?;
    // Without a pinned version, a patch applies to the latest object: retry on a race.
    for attempt in 0..20u64 {
        if attempt > 0 {
            tokio::time::sleep(std::time::Duration::from_millis(5 * attempt)).await;
        }
        let mut document = editable(&state, &project, kind, &name).await?;
        let version = expected_version(&document)?;
        crate::patch::merge(&mut document, &patch);
        if let Some(metadata) = document.get_mut("metadata").and_then(Value::as_object_mut) {
            metadata.insert(
                "resourceVersion".into(),
                Value::String(pinned.or(version).unwrap_or_default().to_string()),
            );
        }
        match put(&state, &project, kind, &name, document).await {
            Err(error)
                if error.reason == "Conflict"
                    && pinned.is_none()
                    && error.message.contains("changed by someone else") =>
            {
                continue;
            }
            other => return other.map(|value| reply(StatusCode::OK, value)),
        }
    }
    Err(ApiError::new(
        StatusCode::CONFLICT,
        "Conflict",
        format!("{name} kept changing; try again"),
    ))
}

/// `DELETE …/{plural}/{name}`: a group goes with all of its runs; a started run is cancelled
/// (its sandbox deleted) first.
pub async fn delete(
    State(state): State<Arc<AppState>>,
    Path((project, plural, name)): Path<(String, String, String)>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    let kind = check_change(&state, &headers, &project, &plural).await?;
    match kind {
        Kind::Agent => state.engine.delete::<AgentSpec>(&project, &name).await?,
        Kind::FileSet => state.engine.delete::<FileSetSpec>(&project, &name).await?,
        Kind::AgentRun => state.engine.delete_run(&project, &name).await?,
        Kind::AgentGroup => state.engine.delete_group(&project, &name).await?,
        Kind::Environment => {
            state.engine.get::<EnvironmentSpec>(&project, &name).await?;
            return Err(Invalid::new(
                "metadata.name",
                "names an Environment version, which is never changed or deleted (results \
                 name it): write a new version instead",
                format!("{name:?}"),
            )
            .into());
        }
        _ => {
            state
                .store
                .delete(&ObjectKey::new(&project, kind, &name))
                .await?
        }
    }
    Ok(reply(
        StatusCode::OK,
        json!({"kind": "Status", "status": "Success", "message": format!("{kind} {name:?} deleted")}),
    ))
}

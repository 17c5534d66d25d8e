//! Create, read, list, replace, merge-patch and delete of every kind.

use std::num::NonZeroUsize;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use nodus_core::resource::{API_VERSION, AgentRun, AgentRunSpec, Kind};
use nodus_core::store::{ObjectKey, Selector};
use nodus_core::validate::{self, Invalid};
use serde_json::{Value, json};

use super::selectors::ListQuery;
use super::{caller, json_body, reply};
use crate::auth::Principal;
use crate::error::{ApiError, ApiResult};
use crate::paging::{self, ListOf};
use crate::state::AppState;
use crate::stream::Scope;
use crate::watch::{Mode, Stream, Target, WatchQuery};

/// The kind users write that a path's `{plural}` names (its plural, singular or short name,
/// as [`Kind::named`] reads them), or a not-found naming the kinds there are.
fn kind_of(plural: &str) -> ApiResult<Kind> {
    Kind::named(plural).ok_or_else(|| {
        let plurals: Vec<&str> = Kind::WRITABLE
            .into_iter()
            .filter_map(|kind| kind.info())
            .map(|info| info.plural)
            .collect();
        let there_are = match plurals.split_last() {
            Some((last, rest)) if !rest.is_empty() => format!("{} and {last}", rest.join(", ")),
            _ => plurals.concat(),
        };
        ApiError::not_found(format!(
            "no resource type {plural:?}; there are {there_are}"
        ))
    })
}

/// The caller and the kind of `plural`, once the caller may change it in `project`: budgets
/// need an admin token, the other kinds a write token.
async fn check_change(
    state: &AppState,
    headers: &HeaderMap,
    project: &str,
    plural: &str,
) -> ApiResult<(Principal, Kind)> {
    let caller = caller(state, headers).await?;
    caller.check_write(project)?;
    let kind = kind_of(plural)?;
    if kind == Kind::Budget {
        caller.check_admin(project, "create, change or delete budgets")?;
    }
    Ok((caller, kind))
}

/// What of an object of `kind` in `project` the API answers to `caller`: an Environment's
/// tasks without their `hidden` grading data unless the caller administers the project
/// (every answer that holds an Environment goes through this, watch streams included).
fn shown_to(caller: &Principal, project: &str, kind: Kind, mut document: Value) -> Value {
    if hides_from(caller, project, kind) {
        nodus_core::evaluation::without_hidden(&mut document);
    }
    document
}

/// Whether objects of `kind` in `project` are shown to `caller` without hidden data.
fn hides_from(caller: &Principal, project: &str, kind: Kind) -> bool {
    kind == Kind::Environment && !caller.administers(project)
}

/// [`shown_to`] of each item of a list.
fn shown_all(caller: &Principal, project: &str, kind: Kind, items: Vec<Value>) -> Vec<Value> {
    items
        .into_iter()
        .map(|item| shown_to(caller, project, kind, item))
        .collect()
}

fn to_value(object: &impl serde::Serialize) -> ApiResult<Value> {
    serde_json::to_value(object).map_err(|e| ApiError::malformed(e.to_string()))
}

fn list_of(kind: Kind, items: Vec<Value>) -> Value {
    json!({"apiVersion": API_VERSION, "kind": format!("{kind}List"), "items": items})
}

/// `GET …/{plural}`; with `watch=true`, a stream of watch events ([`crate::stream`]), or,
/// with a list's `resourceVersion` (its digest), a long poll (see [`crate::watch`]): the list
/// once its `metadata.resourceVersion` differs from the client's.
pub async fn list(
    State(state): State<Arc<AppState>>,
    Path((project, plural)): Path<(String, String)>,
    Query(query): Query<ListQuery>,
    Query(watch): Query<WatchQuery>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    let principal = caller(&state, &headers).await?;
    principal.check_read(&project)?;
    let kind = kind_of(&plural)?;
    let selector = query.selector()?;
    let by_name = selector.fields.get("metadata.name").cloned();
    let mode = watch.mode(Target::List {
        by_name: by_name.is_some(),
    })?;
    if mode != Mode::Read
        && let Some((field, value)) = query
            .limit
            .as_deref()
            .map(|limit| ("limit", limit))
            .or(query
                .continue_token
                .as_deref()
                .map(|token| ("continue", token)))
    {
        return Err(ApiError::bad_parameter(Invalid::new(
            field,
            "cannot be combined with watch=true (a watch answers the whole list)",
            validate::shown(value),
        )));
    }
    let poll = match mode {
        Mode::Read => {
            let answer = if query.limit.is_some() || query.continue_token.is_some() {
                let list = ListOf {
                    project: &project,
                    kind,
                    selector: &selector,
                };
                page_answer(&state, &principal, list, &query).await?
            } else {
                list_answer(&state, &principal, &project, kind, &selector).await?
            };
            return Ok(reply(StatusCode::OK, answer));
        }
        Mode::Stream(stream) => {
            let scope = Scope {
                project,
                kind,
                name: by_name,
                selector,
                without_hidden: false,
            };
            return start_stream(state, principal, scope, stream).await;
        }
        Mode::LongPoll(poll) => poll,
    };
    let (state, project, selector, caller) = (&*state, project.as_str(), &selector, &principal);
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
            || list_answer(state, caller, project, kind, selector),
        )
        .await?;
    Ok(reply(StatusCode::OK, answer))
}

/// Where every watch stream starts, for a list or one object: the caller (already allowed to
/// read the project), what it watches and from where. A limit of the streams a principal
/// holds open belongs here.
async fn start_stream(
    state: Arc<AppState>,
    principal: Principal,
    mut scope: Scope,
    stream: Stream,
) -> ApiResult<Response> {
    // Counted against the caller's token and ended with it by the API's admission, which
    // sees `watch=true` before this handler runs.
    scope.without_hidden = hides_from(&principal, &scope.project, scope.kind);
    crate::stream::response(state, scope, stream.start, stream.timeout).await
}

/// The list answer as `caller` may see it, with its `metadata.resourceVersion`.
async fn list_answer(
    state: &AppState,
    caller: &Principal,
    project: &str,
    kind: Kind,
    selector: &Selector,
) -> ApiResult<Value> {
    let items = state.engine.list_documents(project, kind, selector).await?;
    let version = crate::watch::list_version_of(&items);
    let items = shown_all(caller, project, kind, items);
    let mut answer = list_of(kind, items);
    answer["metadata"] = json!({"resourceVersion": version});
    Ok(answer)
}

/// A page of the list: at most `limit` objects (all the rest without it) after the
/// `continue` token's position, with `metadata.continue` when more remain.
async fn page_answer(
    state: &AppState,
    caller: &Principal,
    list: ListOf<'_>,
    query: &ListQuery,
) -> ApiResult<Value> {
    let limit = match query.limit.as_deref() {
        Some(text) => paging::limit(text).map_err(ApiError::bad_parameter)?,
        None => NonZeroUsize::MAX,
    };
    let key = state.cipher.continue_key();
    let after = match query.continue_token.as_deref() {
        Some(token) => Some(
            key.position(&list, token)
                .map_err(ApiError::bad_parameter)?,
        ),
        None => None,
    };
    let (items, next) = state
        .engine
        .list_documents_page(list.project, list.kind, list.selector, after, limit)
        .await?;
    let version = crate::watch::list_version_of(&items);
    let items = shown_all(caller, list.project, list.kind, items);
    let mut answer = list_of(list.kind, items);
    answer["metadata"] = json!({"resourceVersion": version});
    if let Some(next) = next {
        answer["metadata"]["continue"] = json!(key.token(&list, next));
    }
    Ok(answer)
}

/// `GET …/{plural}/{name}`; with `watch=true`, a stream of the object's watch events
/// ([`crate::stream`]), or, with `resourceVersion`, a long poll (see [`crate::watch`]): the
/// object once its `metadata.resourceVersion` differs from the client's (`NotFound` once
/// deleted).
pub async fn get(
    State(state): State<Arc<AppState>>,
    Path((project, plural, name)): Path<(String, String, String)>,
    Query(watch): Query<WatchQuery>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    let principal = caller(&state, &headers).await?;
    principal.check_read(&project)?;
    let kind = kind_of(&plural)?;
    let poll = match watch.mode(Target::Object)? {
        Mode::Read => {
            let value = read(&state, &project, kind, &name).await?;
            return Ok(reply(
                StatusCode::OK,
                shown_to(&principal, &project, kind, value),
            ));
        }
        Mode::Stream(stream) => {
            let scope = Scope {
                project,
                kind,
                name: Some(name),
                selector: Selector::default(),
                without_hidden: false,
            };
            return start_stream(state, principal, scope, stream).await;
        }
        Mode::LongPoll(poll) => poll,
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
    Ok(reply(
        StatusCode::OK,
        shown_to(&principal, project, kind, value),
    ))
}

async fn read(state: &AppState, project: &str, kind: Kind, name: &str) -> ApiResult<Value> {
    Ok(state.engine.get_document(project, kind, name).await?)
}

/// `POST …/{plural}`: create one object, or a batch of runs (`AgentRunList`).
pub async fn create(
    State(state): State<Arc<AppState>>,
    Path((project, plural)): Path<(String, String)>,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult<Response> {
    let (caller, kind) = check_change(&state, &headers, &project, &plural).await?;
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
        _ => {
            let created = state
                .engine
                .create_document(&project, kind, document)
                .await?;
            shown_to(&caller, &project, kind, created)
        }
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

/// `PUT …/{plural}/{name}`: replace spec and labels (optimistic with `metadata.resourceVersion`).
pub async fn replace(
    State(state): State<Arc<AppState>>,
    Path((project, plural, name)): Path<(String, String, String)>,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult<Response> {
    let (caller, kind) = check_change(&state, &headers, &project, &plural).await?;
    let mut document = json_body(&body)?;
    check_project(&mut document, &project)?;
    let value = state
        .engine
        .replace_document(&project, kind, &name, document)
        .await?;
    Ok(reply(
        StatusCode::OK,
        shown_to(&caller, &project, kind, value),
    ))
}

/// `PATCH …/{plural}/{name}`: a JSON merge patch of spec and labels.
pub async fn patch(
    State(state): State<Arc<AppState>>,
    Path((project, plural, name)): Path<(String, String, String)>,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult<Response> {
    let (caller, kind) = check_change(&state, &headers, &project, &plural).await?;
    let patch = json_body(&body)?;
    if !patch.is_object() {
        return Err(ApiError::malformed("a merge patch is a JSON object"));
    }
    let value = state
        .engine
        .patch_document(&project, kind, &name, &patch)
        .await?;
    Ok(reply(
        StatusCode::OK,
        shown_to(&caller, &project, kind, value),
    ))
}

/// `DELETE …/{plural}/{name}`: a group goes with all of its runs; a started run is cancelled
/// (its sandbox deleted) first.
pub async fn delete(
    State(state): State<Arc<AppState>>,
    Path((project, plural, name)): Path<(String, String, String)>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    let (_, kind) = check_change(&state, &headers, &project, &plural).await?;
    state.engine.delete_document(&project, kind, &name).await?;
    Ok(reply(
        StatusCode::OK,
        json!({"kind": "Status", "status": "Success", "message": format!("{kind} {name:?} deleted")}),
    ))
}

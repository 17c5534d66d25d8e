//! The stream of watch events of `GET …?watch=true`, as Kubernetes answers it: one JSON line
//! per event, `{"type": "ADDED" | "MODIFIED" | "DELETED" | "BOOKMARK" | "ERROR", "object":
//! …}` (`application/x-ndjson`), until `timeoutSeconds` passes or the server stops.
//!
//! [`Seen`] is the pure part: what the client was sent (each object's name, uid and
//! version, never a copy of the object), and the event that a read of an object or of the
//! whole selection makes of it. [`response`] drives it: it reads at each change the store
//! announces for what is watched (all of it again when announcements were missed), with the
//! same engine reads and views as `GET`, so an event shows what a `GET` would.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use nodus_core::engine::Reason;
use nodus_core::resource::{API_VERSION, Kind};
use nodus_core::store::{Change, ObjectKey, Selector};
use serde_json::{Value, json};
use tokio::time::Instant;

use crate::error::ApiResult;
use crate::state::AppState;
use crate::watch::{Changes, Next, Start};

/// The annotation of the `BOOKMARK` that follows the events of the state a stream started
/// from (Kubernetes's name for it).
pub const INITIAL_EVENTS_END: &str = "k8s.io/initial-events-end";

/// What a stream watches: objects of a kind in a project that match a selector, and only
/// the one named when `name` is set.
#[derive(Debug, Clone)]
pub struct Scope {
    /// The project.
    pub project: String,
    /// The kind.
    pub kind: Kind,
    /// Only this object (its path, or `metadata.name` in the field selector).
    pub name: Option<String>,
    /// Labels and fields the objects match.
    pub selector: Selector,
    /// Environments' `hidden` grading data is left out (the caller does not administer the
    /// project), as `GET` leaves it out.
    pub without_hidden: bool,
}

impl Scope {
    /// `object` as the stream's client may see it.
    fn shown(&self, mut object: Value) -> Value {
        if self.without_hidden {
            nodus_core::evaluation::without_hidden(&mut object);
        }
        object
    }

    /// Whether a change of `key` may concern the stream.
    pub fn concerns(&self, key: &ObjectKey) -> bool {
        key.project == self.project
            && key.kind == self.kind
            && self.name.as_ref().is_none_or(|name| *name == key.name)
    }
}

/// An event's type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    /// The object is new to the client.
    Added,
    /// A new version of an object the client has.
    Modified,
    /// The object is gone, or left the selection.
    Deleted,
}

impl EventType {
    fn name(self) -> &'static str {
        match self {
            EventType::Added => "ADDED",
            EventType::Modified => "MODIFIED",
            EventType::Deleted => "DELETED",
        }
    }
}

/// An event: its type and the object.
pub fn event(kind: &str, object: Value) -> Value {
    json!({"type": kind, "object": object})
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Sent {
    uid: String,
    version: String,
}

fn meta(object: &Value, field: &str) -> String {
    object["metadata"][field]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// What a stream has told its client: each object it holds by name, with its uid and version.
#[derive(Debug, Clone)]
pub struct Seen {
    kind: Kind,
    selector: Selector,
    sent: BTreeMap<String, Sent>,
}

impl Seen {
    /// A client that has nothing.
    pub fn new(kind: Kind, selector: Selector) -> Self {
        Seen {
            kind,
            selector,
            sent: BTreeMap::new(),
        }
    }

    /// A client that has `version` of the object `name` (its uid unknown).
    pub fn with_version(mut self, name: &str, version: u64) -> Self {
        self.sent.insert(
            name.to_string(),
            Sent {
                uid: String::new(),
                version: version.to_string(),
            },
        );
        self
    }

    /// Whether the client has this version of `name` already.
    pub fn has(&self, name: &str, version: u64) -> bool {
        self.sent
            .get(name)
            .is_some_and(|sent| sent.version == version.to_string())
    }

    /// The version of the only object the client has (for a stream of one object).
    fn only_version(&self) -> String {
        match self.sent.values().next() {
            Some(sent) if self.sent.len() == 1 => sent.version.clone(),
            _ => String::new(),
        }
    }

    /// What the client is told of `name` as it is now (`None`: it does not exist): `ADDED`
    /// when it is new to the client and matches, `MODIFIED` when its version changed,
    /// `DELETED` (with the object) when it no longer matches, `DELETED` (with what is left of
    /// it: its name, uid and the last version sent) when it is gone; nothing otherwise.
    pub fn update(&mut self, name: &str, now: Option<Value>) -> Option<Value> {
        match now {
            Some(object) if self.selector.matches(&object) => {
                let sent = Sent {
                    uid: meta(&object, "uid"),
                    version: meta(&object, "resourceVersion"),
                };
                let kind = match self.sent.insert(name.to_string(), sent.clone()) {
                    None => EventType::Added,
                    // A uid the client's version came without is unknown, not another.
                    Some(before)
                        if before.version != sent.version
                            || (!before.uid.is_empty() && before.uid != sent.uid) =>
                    {
                        EventType::Modified
                    }
                    Some(_) => return None,
                };
                Some(event(kind.name(), object))
            }
            Some(object) => {
                self.sent.remove(name)?;
                Some(event(EventType::Deleted.name(), object))
            }
            None => {
                let sent = self.sent.remove(name)?;
                let mut metadata = json!({"name": name, "resourceVersion": sent.version});
                if !sent.uid.is_empty() {
                    metadata["uid"] = json!(sent.uid);
                }
                Some(event(
                    EventType::Deleted.name(),
                    json!({"apiVersion": API_VERSION, "kind": self.kind.to_string(), "metadata": metadata}),
                ))
            }
        }
    }

    /// The events that bring the client from what it has to `objects`, the whole selection as
    /// it is now (in the order listed; then the deletions, in name order).
    pub fn resync(&mut self, objects: Vec<Value>) -> Vec<Value> {
        let mut events = Vec::new();
        let mut present = BTreeSet::new();
        for object in objects {
            let name = meta(&object, "name");
            present.insert(name.clone());
            events.extend(self.update(&name, Some(object)));
        }
        let gone: Vec<String> = self
            .sent
            .keys()
            .filter(|name| !present.contains(*name))
            .cloned()
            .collect();
        for name in gone {
            events.extend(self.update(&name, None));
        }
        events
    }

    /// A `BOOKMARK`: the stream is alive. Its `metadata.resourceVersion` is the version of the
    /// object for a stream of one object (a stream may start from it), empty for a list.
    pub fn bookmark(&self, one_object: bool, initial_events_end: bool) -> Value {
        let version = if one_object {
            self.only_version()
        } else {
            String::new()
        };
        let mut metadata = json!({"resourceVersion": version});
        if initial_events_end {
            metadata["annotations"] = json!({INITIAL_EVENTS_END: "true"});
        }
        event(
            "BOOKMARK",
            json!({"apiVersion": API_VERSION, "kind": self.kind.to_string(), "metadata": metadata}),
        )
    }
}

/// The objects of `scope` as `GET` shows them now: the one named (if it exists and matches),
/// or the list.
async fn read_all(state: &AppState, scope: &Scope) -> ApiResult<Vec<Value>> {
    match &scope.name {
        Some(name) => Ok(read_one(state, scope, name)
            .await?
            .into_iter()
            .filter(|object| scope.selector.matches(object))
            .collect()),
        None => Ok(state
            .engine
            .list_documents(&scope.project, scope.kind, &scope.selector)
            .await?
            .into_iter()
            .map(|object| scope.shown(object))
            .collect()),
    }
}

/// The object `name` as `GET` shows it, `None` when it does not exist.
async fn read_one(state: &AppState, scope: &Scope, name: &str) -> ApiResult<Option<Value>> {
    match state
        .engine
        .get_document(&scope.project, scope.kind, name)
        .await
    {
        Ok(object) => Ok(Some(scope.shown(object))),
        Err(error) if error.reason() == Reason::NotFound => Ok(None),
        Err(error) => Err(error.into()),
    }
}

/// A running stream: what it watches, what its client has, the events not sent yet.
struct Driver {
    state: Arc<AppState>,
    scope: Scope,
    seen: Seen,
    changes: Changes,
    deadline: Instant,
    next_bookmark: Instant,
    pending: VecDeque<Value>,
    ended: bool,
}

/// What woke a stream.
enum Woke {
    Store(Next),
    Bookmark,
}

impl Driver {
    /// Waits for what comes next and queues its events.
    async fn step(&mut self) {
        let woke = tokio::select! {
            next = self.changes.next_change(self.deadline) => Woke::Store(next),
            () = tokio::time::sleep_until(self.next_bookmark) => Woke::Bookmark,
        };
        let result = match woke {
            Woke::Bookmark => {
                let one = self.scope.name.is_some();
                self.pending.push_back(self.seen.bookmark(one, false));
                Ok(())
            }
            Woke::Store(Next::Ended) => {
                self.ended = true;
                Ok(())
            }
            Woke::Store(Next::Missed) => self.resync().await,
            Woke::Store(Next::Change(change)) => self.changed(change).await,
        };
        if let Err(error) = result {
            // Kubernetes's way: an ERROR event with the status, and the stream ends.
            self.pending.push_back(event("ERROR", error.status_body()));
            self.ended = true;
        }
        if !self.pending.is_empty() {
            self.next_bookmark = Instant::now() + self.state.watches.bookmark_every();
        }
    }

    async fn changed(&mut self, change: Change) -> ApiResult<()> {
        let (key, version) = match change {
            Change::Written(key, version) => (key, Some(version)),
            Change::Deleted(key) => (key, None),
        };
        if !self.scope.concerns(&key) {
            return Ok(());
        }
        let now = match version {
            Some(version) if self.seen.has(&key.name, version) => return Ok(()),
            Some(_) => read_one(&self.state, &self.scope, &key.name).await?,
            None => None,
        };
        self.pending.extend(self.seen.update(&key.name, now));
        Ok(())
    }

    async fn resync(&mut self) -> ApiResult<()> {
        let objects = read_all(&self.state, &self.scope).await?;
        self.pending.extend(self.seen.resync(objects));
        Ok(())
    }
}

/// The streaming answer of a watch of `scope` from `start`, ending after `timeout`: reads
/// what the client is told first (an error of that read is the answer, as for `GET`), then
/// streams. Changes are subscribed to before that read, so none is missed.
pub async fn response(
    state: Arc<AppState>,
    scope: Scope,
    start: Start,
    timeout: Duration,
) -> ApiResult<Response> {
    let changes = state.watches.subscribe(state.store.as_ref());
    let mut seen = Seen::new(scope.kind, scope.selector.clone());
    if let (Start::Version(version), Some(name)) = (start, &scope.name) {
        seen = seen.with_version(name, version);
    }
    let mut pending: VecDeque<Value> = seen
        .resync(read_all(&state, &scope).await?)
        .into_iter()
        .collect();
    pending.push_back(seen.bookmark(scope.name.is_some(), true));
    let now = Instant::now();
    let driver = Driver {
        next_bookmark: now + state.watches.bookmark_every(),
        state,
        scope,
        seen,
        changes,
        deadline: now + timeout,
        pending,
        ended: false,
    };
    let stream = futures_util::stream::unfold(driver, |mut driver| async move {
        loop {
            if let Some(event) = driver.pending.pop_front() {
                let line = Bytes::from(format!("{event}\n"));
                return Some((Ok::<_, std::convert::Infallible>(line), driver));
            }
            if driver.ended {
                return None;
            }
            driver.step().await;
        }
    });
    Ok(Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "application/x-ndjson")
        .body(Body::from_stream(stream))
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn agent(name: &str, uid: &str, version: u64, team: &str) -> Value {
        json!({"apiVersion": API_VERSION, "kind": "Agent", "metadata": {
            "name": name, "uid": uid, "resourceVersion": version.to_string(),
            "labels": {"team": team}}})
    }

    fn types(events: &[Value]) -> Vec<(String, String)> {
        events
            .iter()
            .map(|e| {
                (
                    e["type"].as_str().unwrap_or_default().to_string(),
                    meta(&e["object"], "name"),
                )
            })
            .collect()
    }

    fn pair(kind: &str, name: &str) -> (String, String) {
        (kind.to_string(), name.to_string())
    }

    #[test]
    fn the_client_is_told_each_change_once() {
        let selector = Selector {
            labels: [("team".to_string(), "x".to_string())].into(),
            ..Selector::default()
        };
        let mut seen = Seen::new(Kind::Agent, selector);
        let start = seen.resync(vec![agent("a", "u1", 1, "x"), agent("b", "u2", 4, "x")]);
        assert_eq!(types(&start), [pair("ADDED", "a"), pair("ADDED", "b")]);
        // The same version again (a change announced after the read): nothing.
        assert!(seen.has("a", 1));
        assert_eq!(seen.update("a", Some(agent("a", "u1", 1, "x"))), None);
        let modified = seen.update("a", Some(agent("a", "u1", 2, "x")));
        assert_eq!(types(&Vec::from_iter(modified)), [pair("MODIFIED", "a")]);
        // Out of the selection: DELETED with the object; back in: ADDED.
        let left = seen.update("a", Some(agent("a", "u1", 3, "y")));
        assert_eq!(types(&Vec::from_iter(left)), [pair("DELETED", "a")]);
        let back = seen.update("a", Some(agent("a", "u1", 4, "x")));
        assert_eq!(types(&Vec::from_iter(back)), [pair("ADDED", "a")]);
        // Never in the selection: nothing.
        assert_eq!(seen.update("c", Some(agent("c", "u3", 1, "y"))), None);
        assert_eq!(seen.update("c", None), None);
        // Gone: DELETED with its name, uid and the last version sent, nothing else.
        let gone = seen.update("b", None).expect("deleted");
        assert_eq!(
            gone,
            json!({"type": "DELETED", "object": {"apiVersion": API_VERSION, "kind": "Agent",
                   "metadata": {"name": "b", "uid": "u2", "resourceVersion": "4"}}})
        );
        // Deleted and made again under the same name and version: a new object.
        seen.update("a", None);
        let again = seen.resync(vec![agent("a", "u9", 4, "x")]);
        assert_eq!(types(&again), [pair("ADDED", "a")]);
        // A resync says what changed while announcements were missed.
        let missed = seen.resync(vec![agent("d", "u4", 1, "x")]);
        assert_eq!(types(&missed), [pair("ADDED", "d"), pair("DELETED", "a")]);
    }

    #[test]
    fn a_stream_of_one_object_starts_from_the_clients_version() {
        let seen = || Seen::new(Kind::Agent, Selector::default()).with_version("a", 3);
        assert_eq!(
            seen().resync(vec![agent("a", "u1", 3, "x")]),
            Vec::<Value>::new()
        );
        assert_eq!(
            types(&seen().resync(vec![agent("a", "u1", 5, "x")])),
            [pair("MODIFIED", "a")]
        );
        assert_eq!(types(&seen().resync(vec![])), [pair("DELETED", "a")]);
        let mut one = seen();
        one.resync(vec![agent("a", "u1", 5, "x")]);
        assert_eq!(
            one.bookmark(true, false)["object"]["metadata"]["resourceVersion"],
            "5"
        );
        assert_eq!(
            one.bookmark(false, true)["object"]["metadata"],
            json!({"resourceVersion": "", "annotations": {INITIAL_EVENTS_END: "true"}})
        );
    }
}

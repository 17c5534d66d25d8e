//! Waiting for a change, on the store's change notification: the long poll of
//! `GET …/{plural}/{name}?watch=true&resourceVersion=RV&timeoutSeconds=N` and of the same on a
//! list. It answers as soon as what the client would read differs from the version it has (at
//! once when it already does), or as it is when the time is up or the server stops.
//!
//! A waiting request holds a receiver of the store's notification, the version it compares
//! and its deadline: no lock, and no copy of what it watches (it reads again to answer). It
//! reads only when a change names what it watches. [`Watches::subscribe`] and
//! [`Changes::next`] are the one wait; a stream of changes (server-sent events) is that wait
//! in a loop.

use std::future::Future;
use std::time::Duration;

use nodus_core::digest::sha256_hex;
use nodus_core::store::{Change, ObjectKey, Record, Store};
use nodus_core::validate::Invalid;
use serde::Deserialize;
use serde_json::Value;
use tokio::sync::broadcast::{self, error::RecvError};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::error::ApiResult;

/// How long a long poll waits when `timeoutSeconds` is not given.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);
/// The longest `timeoutSeconds`.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(300);

/// The query parameters of a watch, on `GET` of an object or a list.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WatchQuery {
    /// `true` to wait for a change.
    pub watch: Option<String>,
    /// The `metadata.resourceVersion` the client has.
    pub resource_version: Option<String>,
    /// The longest wait in seconds.
    pub timeout_seconds: Option<String>,
}

/// What is watched: an object's version is a whole number, a list's a digest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// One object, by its path (`GET …/{plural}/{name}`).
    Object,
    /// A list; `by_name` when its field selector names one object (`metadata.name=NAME`),
    /// whose version a stream may then start from.
    List {
        /// The field selector holds `metadata.name`.
        by_name: bool,
    },
}

/// A long poll asked for: the version the client has, and how long to wait at most.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LongPoll {
    /// The version the answer must differ from.
    pub resource_version: String,
    /// How long to wait for that.
    pub timeout: Duration,
}

/// Where a stream of watch events starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Start {
    /// From the current state: an `ADDED` event for every object there is, then changes.
    Now,
    /// The client has this version of the one object watched: an event only if it differs.
    Version(u64),
}

/// A stream of watch events asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stream {
    /// Where it starts.
    pub start: Start,
    /// When it ends (`timeoutSeconds`).
    pub timeout: Duration,
}

/// What a `GET` with these parameters asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mode {
    /// A plain read.
    Read,
    /// One answer once the version differs from the client's.
    LongPoll(LongPoll),
    /// Watch events as they happen.
    Stream(Stream),
}

/// The longest `timeoutSeconds` of a stream.
pub const MAX_STREAM_TIMEOUT: Duration = Duration::from_secs(3600);
/// How long a stream lasts when `timeoutSeconds` is not given (Kubernetes's shortest).
pub const DEFAULT_STREAM_TIMEOUT: Duration = Duration::from_secs(1800);
/// How often a stream sends a `BOOKMARK` event when nothing else happens, by default.
pub const DEFAULT_BOOKMARK_INTERVAL: Duration = Duration::from_secs(30);

fn is_digest(text: &str) -> bool {
    text.len() == 64 && text.bytes().all(|b| b.is_ascii_hexdigit())
}

impl WatchQuery {
    /// What is asked for, or an error naming the parameter, its rule and its value:
    ///
    /// - an object's path with `resourceVersion` (a whole number): the long poll;
    /// - a list with `resourceVersion` a list's digest: the long poll;
    /// - without `resourceVersion` (or, on a list, `0` or empty, as Kubernetes's "any
    ///   version"): a stream from the current state;
    /// - a list whose field selector names one object, with that object's version: a stream
    ///   from that version.
    pub fn mode(&self, target: Target) -> Result<Mode, Invalid> {
        let watch = match self.watch.as_deref() {
            None | Some("false" | "0") => false,
            Some("true" | "1") => true,
            Some(other) => {
                return Err(Invalid::new(
                    "watch",
                    "is true or false",
                    format!("{other:?}"),
                ));
            }
        };
        if !watch {
            for (parameter, given) in [
                ("resourceVersion", &self.resource_version),
                ("timeoutSeconds", &self.timeout_seconds),
            ] {
                if let Some(given) = given {
                    return Err(Invalid::new(
                        parameter,
                        "applies only with watch=true",
                        format!("{given:?}"),
                    ));
                }
            }
            return Ok(Mode::Read);
        }
        let version = self.resource_version.as_deref();
        let shown = |text: &str| format!("{:?}", text.chars().take(80).collect::<String>());
        let stream = match (target, version) {
            (Target::Object, None) | (Target::List { .. }, None | Some("" | "0")) => {
                Some(Start::Now)
            }
            (Target::Object, Some(text)) if text.parse::<u64>().is_ok() => None,
            (Target::Object, Some(text)) => {
                return Err(Invalid::new(
                    "resourceVersion",
                    "is an object's metadata.resourceVersion, a whole number",
                    shown(text),
                ));
            }
            (Target::List { .. }, Some(text)) if is_digest(text) => None,
            (Target::List { by_name: true }, Some(text)) if text.parse::<u64>().is_ok() => {
                text.parse::<u64>().ok().map(Start::Version)
            }
            (Target::List { .. }, Some(text)) => {
                return Err(Invalid::new(
                    "resourceVersion",
                    "on a list is the list's metadata.resourceVersion (64 hex digits: a long \
                     poll), absent or 0 (a stream from the current state), or, when \
                     fieldSelector names one object (metadata.name=NAME), that object's \
                     version (a stream from it); objects' versions are counted per object, \
                     so none is a position in a list",
                    shown(text),
                ));
            }
        };
        let (default, max) = match stream {
            Some(_) => (DEFAULT_STREAM_TIMEOUT, MAX_STREAM_TIMEOUT),
            None => (DEFAULT_TIMEOUT, MAX_TIMEOUT),
        };
        let timeout = match self.timeout_seconds.as_deref() {
            None => default,
            Some(text) => text
                .parse::<u64>()
                .ok()
                .filter(|seconds| (1..=max.as_secs()).contains(seconds))
                .map(Duration::from_secs)
                .ok_or_else(|| {
                    Invalid::new(
                        "timeoutSeconds",
                        format!(
                            "is a whole number of seconds from 1 to {} ({})",
                            max.as_secs(),
                            if stream.is_some() {
                                "a stream"
                            } else {
                                "a long poll"
                            }
                        ),
                        format!("{text:?}"),
                    )
                })?,
        };
        Ok(match (stream, version) {
            (Some(start), _) => Mode::Stream(Stream { start, timeout }),
            (None, version) => Mode::LongPoll(LongPoll {
                resource_version: version.unwrap_or_default().to_string(),
                timeout,
            }),
        })
    }
}

/// A list's `metadata.resourceVersion`: a digest of its items' names, uids and versions, so
/// that it changes when an item is written, added or removed (in creation order, as listed).
pub fn list_version<'a>(items: impl IntoIterator<Item = (&'a str, &'a str, &'a str)>) -> String {
    let mut text = String::new();
    for (name, uid, version) in items {
        text.push_str(name);
        text.push('\n');
        text.push_str(uid);
        text.push('\n');
        text.push_str(version);
        text.push('\n');
    }
    sha256_hex(text.as_bytes())
}

/// [`list_version`] of a list answer's items.
pub fn list_version_of(items: &[Value]) -> String {
    let text = |item: &'_ Value, field: &str| -> String {
        match &item["metadata"][field] {
            Value::String(text) => text.clone(),
            _ => String::new(),
        }
    };
    let parts: Vec<[String; 3]> = items
        .iter()
        .map(|item| {
            [
                text(item, "name"),
                text(item, "uid"),
                text(item, "resourceVersion"),
            ]
        })
        .collect();
    list_version(
        parts
            .iter()
            .map(|[n, u, v]| (n.as_str(), u.as_str(), v.as_str())),
    )
}

/// [`list_version`] of stored records (read with `metadata.uid`, [`Store::list_sparse`]).
pub fn list_version_of_records(records: &[Record]) -> String {
    let parts: Vec<(String, String)> = records
        .iter()
        .map(|record| {
            (
                record.document["metadata"]["uid"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
                record.version.to_string(),
            )
        })
        .collect();
    list_version(
        records.iter().zip(&parts).map(|(record, (uid, version))| {
            (record.key.name.as_str(), uid.as_str(), version.as_str())
        }),
    )
}

/// The waits that requests hold; [`Watches::stop`] ends them all (the server is stopping,
/// and must not wait for them).
pub struct Watches {
    stopping: watch::Sender<bool>,
    bookmark_every: Duration,
}

impl Default for Watches {
    fn default() -> Self {
        Watches::new(DEFAULT_BOOKMARK_INTERVAL)
    }
}

/// Why [`Changes::next`] returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Woken {
    /// Something watched changed (or notifications were missed: it may have).
    Changed,
    /// The deadline passed, or the server is stopping.
    Ended,
}

/// What [`Changes::next_change`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Next {
    /// A change in the store.
    Change(Change),
    /// Notifications were missed: anything may have changed.
    Missed,
    /// The deadline passed, or the server is stopping.
    Ended,
}

/// A subscription to the store's changes, for one request.
pub struct Changes {
    changes: broadcast::Receiver<Change>,
    stopping: watch::Receiver<bool>,
}

impl Changes {
    /// The next change of any key, a lag of the notifications, `deadline`, or the server
    /// stopping (cancel-safe: no change is lost when the future is dropped).
    pub async fn next_change(&mut self, deadline: Instant) -> Next {
        let changed = async {
            match self.changes.recv().await {
                Ok(change) => Next::Change(change),
                Err(RecvError::Lagged(_)) => Next::Missed,
                // The store is gone: nothing will change any more.
                Err(RecvError::Closed) => std::future::pending().await,
            }
        };
        let stopping = self.stopping.wait_for(|stopping| *stopping);
        tokio::select! {
            next = changed => next,
            _ = stopping => Next::Ended,
            () = tokio::time::sleep_until(deadline) => Next::Ended,
        }
    }

    /// Waits for a change of a key that `concerns` accepts, a lag of the notifications (a
    /// change may have been missed), `deadline`, or the server stopping.
    pub async fn next(
        &mut self,
        concerns: &impl Fn(&ObjectKey) -> bool,
        deadline: Instant,
    ) -> Woken {
        let changed = async {
            loop {
                match self.changes.recv().await {
                    Ok(Change::Written(key, _) | Change::Deleted(key)) if concerns(&key) => {
                        return Woken::Changed;
                    }
                    Ok(_) => {}
                    Err(RecvError::Lagged(_)) => return Woken::Changed,
                    // The store is gone: nothing will change any more.
                    Err(RecvError::Closed) => std::future::pending::<()>().await,
                }
            }
        };
        let stopping = self.stopping.wait_for(|stopping| *stopping);
        tokio::select! {
            woken = changed => woken,
            _ = stopping => Woken::Ended,
            () = tokio::time::sleep_until(deadline) => Woken::Ended,
        }
    }
}

impl Watches {
    /// Waits that end when [`Watches::stop`] is called; streams send a `BOOKMARK` event after
    /// `bookmark_every` without one.
    pub fn new(bookmark_every: Duration) -> Self {
        Watches {
            stopping: watch::Sender::new(false),
            bookmark_every,
        }
    }

    /// How long a stream goes without a `BOOKMARK` event.
    pub fn bookmark_every(&self) -> Duration {
        self.bookmark_every
    }

    /// Ends every wait, now and from now on.
    pub fn stop(&self) {
        self.stopping.send_replace(true);
    }

    /// Changes from now on: subscribe before reading what is compared, so that nothing
    /// written in between is missed.
    pub fn subscribe(&self, store: &dyn Store) -> Changes {
        Changes {
            changes: store.subscribe(),
            stopping: self.stopping.subscribe(),
        }
    }

    /// The long poll: `read()` (the answer) as soon as `version()` differs from the client's,
    /// looking again at each change that `concerns` accepts, or `read()` when the time is up.
    /// An error of either (the object was deleted: `NotFound`) is the answer.
    pub async fn answer_when_changed<V, VF, R, RF>(
        &self,
        store: &dyn Store,
        poll: &LongPoll,
        concerns: impl Fn(&ObjectKey) -> bool,
        mut version: V,
        mut read: R,
    ) -> ApiResult<Value>
    where
        V: FnMut() -> VF,
        VF: Future<Output = ApiResult<String>>,
        R: FnMut() -> RF,
        RF: Future<Output = ApiResult<Value>>,
    {
        let deadline = Instant::now() + poll.timeout;
        let mut changes = self.subscribe(store);
        loop {
            if version().await? != poll.resource_version {
                return read().await;
            }
            if changes.next(&concerns, deadline).await == Woken::Ended {
                return read().await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn query(watch: Option<&str>, version: Option<&str>, timeout: Option<&str>) -> WatchQuery {
        WatchQuery {
            watch: watch.map(str::to_string),
            resource_version: version.map(str::to_string),
            timeout_seconds: timeout.map(str::to_string),
        }
    }

    #[test]
    fn parameters_are_checked_and_named() {
        const LIST: Target = Target::List { by_name: false };
        const ONE: Target = Target::List { by_name: true };
        assert_eq!(query(None, None, None).mode(Target::Object), Ok(Mode::Read));
        assert_eq!(
            query(Some("true"), Some("7"), None).mode(Target::Object),
            Ok(Mode::LongPoll(LongPoll {
                resource_version: "7".into(),
                timeout: DEFAULT_TIMEOUT
            }))
        );
        assert_eq!(
            query(Some("true"), Some("7"), Some("300")).mode(Target::Object),
            Ok(Mode::LongPoll(LongPoll {
                resource_version: "7".into(),
                timeout: MAX_TIMEOUT
            }))
        );
        for (bad, field) in [
            (query(Some("yes"), Some("7"), None), "watch"),
            (query(Some("true"), Some("x1"), None), "resourceVersion"),
            (query(Some("true"), Some("7"), Some("0")), "timeoutSeconds"),
            (
                query(Some("true"), Some("7"), Some("301")),
                "timeoutSeconds",
            ),
            (
                query(Some("true"), Some("7"), Some("1.5")),
                "timeoutSeconds",
            ),
            (query(Some("true"), None, Some("3601")), "timeoutSeconds"),
            (query(None, None, Some("5")), "timeoutSeconds"),
            (query(Some("false"), Some("7"), None), "resourceVersion"),
        ] {
            let error = bad.mode(Target::Object).expect_err(field);
            assert_eq!(error.field, field, "{bad:?}");
        }
        // Without a version: a stream, on an object's path and on a list's.
        for target in [Target::Object, LIST, ONE] {
            assert_eq!(
                query(Some("true"), None, Some("3600")).mode(target),
                Ok(Mode::Stream(Stream {
                    start: Start::Now,
                    timeout: MAX_STREAM_TIMEOUT
                }))
            );
        }
        for any in ["0", ""] {
            assert_eq!(
                query(Some("true"), Some(any), None).mode(LIST),
                Ok(Mode::Stream(Stream {
                    start: Start::Now,
                    timeout: DEFAULT_STREAM_TIMEOUT
                }))
            );
        }
        // A list's digest: the long poll.
        let digest = list_version([("a", "u", "1")]);
        assert!(matches!(
            query(Some("true"), Some(&digest), None).mode(LIST),
            Ok(Mode::LongPoll(_))
        ));
        // An object's version: a stream from it when the selector names the object.
        assert_eq!(
            query(Some("true"), Some("7"), None).mode(ONE),
            Ok(Mode::Stream(Stream {
                start: Start::Version(7),
                timeout: DEFAULT_STREAM_TIMEOUT
            }))
        );
        let error = query(Some("true"), Some("7"), None)
            .mode(LIST)
            .expect_err("not a position in a list");
        assert_eq!(error.field, "resourceVersion");
        assert!(error.rule.contains("per object"), "{error}");
    }

    #[test]
    fn a_list_version_changes_with_any_item() {
        let one = list_version([("a", "u1", "1"), ("b", "u2", "4")]);
        assert_eq!(one, list_version([("a", "u1", "1"), ("b", "u2", "4")]));
        for other in [
            list_version([("a", "u1", "2"), ("b", "u2", "4")]),
            list_version([("a", "u1", "1")]),
            list_version([("a", "u1", "1"), ("b", "u3", "4")]),
            list_version([("a", "u1", "1"), ("b", "u2", "4"), ("c", "u4", "1")]),
        ] {
            assert_ne!(one, other);
        }
    }
}

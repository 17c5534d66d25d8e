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
    /// One object.
    Object,
    /// A list.
    List,
}

/// A long poll asked for: the version the client has, and how long to wait at most.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LongPoll {
    /// The version the answer must differ from.
    pub resource_version: String,
    /// How long to wait for that.
    pub timeout: Duration,
}

impl WatchQuery {
    /// The long poll asked for, `None` for a plain read, or an error naming the parameter.
    pub fn long_poll(&self, target: Target) -> Result<Option<LongPoll>, Invalid> {
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
            return Ok(None);
        }
        let resource_version = match (target, self.resource_version.as_deref()) {
            (_, None) => {
                return Err(Invalid::new(
                    "resourceVersion",
                    "is required with watch=true: the metadata.resourceVersion you have",
                    "nothing",
                ));
            }
            (Target::Object, Some(text)) if text.parse::<u64>().is_err() => {
                return Err(Invalid::new(
                    "resourceVersion",
                    "is an object's metadata.resourceVersion, a whole number",
                    format!("{text:?}"),
                ));
            }
            (Target::List, Some(text))
                if text.len() != 64 || !text.bytes().all(|b| b.is_ascii_hexdigit()) =>
            {
                return Err(Invalid::new(
                    "resourceVersion",
                    "is a list's metadata.resourceVersion (64 hex digits)",
                    format!("{:?}", text.chars().take(80).collect::<String>()),
                ));
            }
            (_, Some(text)) => text.to_string(),
        };
        let timeout = match self.timeout_seconds.as_deref() {
            None => DEFAULT_TIMEOUT,
            Some(text) => text
                .parse::<u64>()
                .ok()
                .filter(|seconds| (1..=MAX_TIMEOUT.as_secs()).contains(seconds))
                .map(Duration::from_secs)
                .ok_or_else(|| {
                    Invalid::new(
                        "timeoutSeconds",
                        format!(
                            "is a whole number of seconds from 1 to {}",
                            MAX_TIMEOUT.as_secs()
                        ),
                        format!("{text:?}"),
                    )
                })?,
        };
        Ok(Some(LongPoll {
            resource_version,
            timeout,
        }))
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
}

impl Default for Watches {
    fn default() -> Self {
        Watches {
            stopping: watch::Sender::new(false),
        }
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

/// A subscription to the store's changes, for one request.
pub struct Changes {
    changes: broadcast::Receiver<Change>,
    stopping: watch::Receiver<bool>,
}

impl Changes {
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
        assert_eq!(query(None, None, None).long_poll(Target::Object), Ok(None));
        assert_eq!(
            query(Some("true"), Some("7"), None).long_poll(Target::Object),
            Ok(Some(LongPoll {
                resource_version: "7".into(),
                timeout: DEFAULT_TIMEOUT
            }))
        );
        assert_eq!(
            query(Some("true"), Some("7"), Some("300"))
                .long_poll(Target::Object)
                .map(|p| p.map(|p| p.timeout)),
            Ok(Some(MAX_TIMEOUT))
        );
        for (bad, field) in [
            (query(Some("yes"), Some("7"), None), "watch"),
            (query(Some("true"), None, None), "resourceVersion"),
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
            (query(None, None, Some("5")), "timeoutSeconds"),
            (query(Some("false"), Some("7"), None), "resourceVersion"),
        ] {
            let error = bad.long_poll(Target::Object).expect_err(field);
            assert_eq!(error.field, field, "{bad:?}");
        }
        let digest = list_version([("a", "u", "1")]);
        assert!(
            query(Some("true"), Some(&digest), None)
                .long_poll(Target::List)
                .is_ok()
        );
        assert_eq!(
            query(Some("true"), Some("7"), None)
                .long_poll(Target::List)
                .expect_err("not a digest")
                .field,
            "resourceVersion"
        );
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

//! The `Store` trait: resources with optimistic concurrency, the run journal, the message
//! inbox, run leases for several replicas, rewriting a run's recorded contents in one write and change
//! notification.
//! The in-memory backend is here ([`MemoryStore`], the default of
//! [`Deps::builder`](crate::engine::Deps::builder)); SQLite and Postgres live in nodus-store.

pub mod memory;

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::hash::{BuildHasher, Hasher};
use std::num::NonZeroUsize;
use std::sync::OnceLock;
use std::time::Duration;

use async_trait::async_trait;
use jiff::Timestamp;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::journal::{Completion, Step};
use crate::resource::Kind;
use crate::snapshot::{Blob, Snapshot, Stored};

pub use memory::MemoryStore;

/// Where a resource lives.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct ObjectKey {
    /// The project.
    pub project: String,
    /// The kind.
    pub kind: Kind,
    /// The name.
    pub name: String,
}

impl ObjectKey {
    /// A key.
    pub fn new(project: impl Into<String>, kind: Kind, name: impl Into<String>) -> Self {
        ObjectKey {
            project: project.into(),
            kind,
            name: name.into(),
        }
    }
}

/// Where the final working directory of `run` is kept.
pub fn workdir_archive_key(run: &ObjectKey) -> ObjectKey {
    ObjectKey::new(&run.project, Kind::WorkdirArchive, &run.name)
}

impl fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}/{}", self.project, self.kind.plural(), self.name)
    }
}

/// A stored resource document and its version.
#[derive(Debug, Clone, PartialEq)]
pub struct Record {
    /// Where it lives.
    pub key: ObjectKey,
    /// Bumped by every write; a write naming an older version is refused.
    pub version: u64,
    /// The whole document (`apiVersion`, `kind`, `metadata`, `spec`, `status`).
    pub document: Value,
}

/// What a caller of [`Store::list_sparse_known`] kept of a document it read: where the
/// document was created and the version read. A document deleted and created again under the
/// same name starts at version 1 again, but at a later position: it is never taken for the
/// one kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Seen {
    /// The document's place in its collection's creation order.
    pub at: Position,
    /// The version read.
    pub version: u64,
}

/// A document of [`Store::list_sparse_known`]'s answer, in creation order.
#[derive(Debug, Clone, PartialEq)]
pub enum Sparse {
    /// The document of this name is the one the caller kept, at the version it kept: not
    /// read again.
    Known(String),
    /// A document the caller does not know at this version (or at all), read as
    /// [`Store::list_sparse`] reads it, with where it was created.
    Read {
        /// The document's place in its collection's creation order.
        at: Position,
        /// The document, cut down to the paths asked for.
        record: Record,
    },
}

impl Sparse {
    /// `record`, created `at`, or only its name when `known` holds it there at its version.
    pub fn of(at: Position, record: Record, known: &HashMap<String, Seen>) -> Self {
        let seen = Seen {
            at,
            version: record.version,
        };
        if known.get(&record.key.name) == Some(&seen) {
            Sparse::Known(record.key.name)
        } else {
            Sparse::Read { at, record }
        }
    }
}

/// Which documents a list returns: every label and every field must match.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Selector {
    /// `metadata.labels` that must have these values.
    pub labels: BTreeMap<String, String>,
    /// Dotted field paths (`spec.group`, `status.phase`, `spec.agent`) that must have these
    /// string values.
    pub fields: BTreeMap<String, String>,
}

impl Selector {
    /// The documents whose `spec.group` is `group`: a group's runs, or its evaluation cases.
    pub fn in_group(group: &str) -> Self {
        Selector {
            fields: [("spec.group".to_string(), group.to_string())].into(),
            ..Selector::default()
        }
    }

    /// `paths` and the paths this selector looks at (`metadata.labels` for any label), each
    /// once: what a sparse document needs to hold to be matched and read.
    pub fn paths_with(&self, paths: &[&str]) -> Vec<String> {
        let mut all: Vec<String> = paths.iter().map(|p| (*p).to_string()).collect();
        if !self.labels.is_empty() {
            all.push("metadata.labels".to_string());
        }
        all.extend(self.fields.keys().cloned());
        all.sort_unstable();
        all.dedup();
        all
    }

    /// Whether a document matches. A missing field matches nothing.
    pub fn matches(&self, document: &Value) -> bool {
        let labels = &document["metadata"]["labels"];
        self.labels
            .iter()
            .all(|(k, v)| labels.get(k).and_then(Value::as_str) == Some(v.as_str()))
            && self.fields.iter().all(|(path, expected)| {
                path.split('.')
                    .try_fold(document, |value, part| value.get(part))
                    .is_some_and(|value| match value {
                        Value::String(text) => text == expected,
                        Value::Bool(b) => b.to_string() == *expected,
                        Value::Number(n) => n.to_string() == *expected,
                        _ => false,
                    })
            })
    }
}

/// A place in a listing's creation order: the page that asks for it starts after the
/// document created there. Only the store that gave it knows what it means; it stays valid
/// while documents are created and deleted (a keyset, not an offset).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Position(pub u64);

/// One page of a listing: [`Store::list_page`].
#[derive(Debug, Clone, PartialEq)]
pub struct Page {
    /// The documents, in creation order.
    pub records: Vec<Record>,
    /// Where the next page starts: present only when more matching documents remain.
    pub next: Option<Position>,
}

impl Page {
    /// The page of the first `limit` of `found` (documents and their positions, in creation
    /// order, with at most one more than the page holds to tell whether more remain).
    pub fn of(mut found: Vec<(Position, Record)>, limit: NonZeroUsize) -> Page {
        let more = found.len() > limit.get();
        found.truncate(limit.get());
        let next = if more {
            found.last().map(|(position, _)| *position)
        } else {
            None
        };
        Page {
            records: found.into_iter().map(|(_, record)| record).collect(),
            next,
        }
    }
}

/// A message for a run's inbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InboxMessage {
    /// Position in the inbox, from 1.
    pub seq: u64,
    /// The sender's deduplication key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// The text.
    pub payload: String,
    /// When it arrived.
    pub received_at: Timestamp,
}

/// What posting a message did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delivery {
    /// Stored as the message with this sequence number.
    Delivered(u64),
    /// A message with the same key was already delivered as this sequence number.
    Duplicate(u64),
}

/// A writer's claim on a run's journal. Claiming again (another replica taking over) makes
/// every older fence stale, and a stale fence cannot write.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Fence(pub u64);

/// A replica's request to hold a run's lease: who asks, when (the asker's clock), for how
/// long. A lease gives the right to write the run's journal; its [`Fence`] proves it.
///
/// Replicas compare their own clocks with the expiry another replica wrote, so their clocks
/// must agree to well within a lease's duration (NTP does).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    /// The replica: one stable name per process.
    pub owner: String,
    /// The time of the request.
    pub now: Timestamp,
    /// How long the lease lasts unless it is renewed.
    pub duration: Duration,
}

impl Lease {
    /// How long a lease lasts by default: renew well within it (every third of it, say).
    pub const DEFAULT_DURATION: Duration = Duration::from_secs(30);

    /// A lease request.
    pub fn new(owner: impl Into<String>, now: Timestamp, duration: Duration) -> Self {
        Lease {
            owner: owner.into(),
            now,
            duration,
        }
    }

    /// A request by this process ([`process_owner`]) for [`Lease::DEFAULT_DURATION`].
    pub fn for_this_process(now: Timestamp) -> Self {
        Lease::new(process_owner(), now, Lease::DEFAULT_DURATION)
    }

    /// When a lease granted now ends, or an error when that is past the end of time.
    pub fn expires_at(&self) -> Result<Timestamp, Error> {
        jiff::SignedDuration::try_from(self.duration)
            .ok()
            .and_then(|d| self.now.checked_add(d).ok())
            .ok_or_else(|| {
                Error::Invalid(format!(
                    "a lease from {} for {:?} ends past the last representable time",
                    self.now, self.duration
                ))
            })
    }
}

/// This process's name as a lease owner: its pid and a random part, so that two processes
/// (on one machine or several) never share a name. Set a replica's name explicitly with
/// [`Lease::new`] where a stable one is wanted.
pub fn process_owner() -> &'static str {
    static OWNER: OnceLock<String> = OnceLock::new();
    OWNER.get_or_init(|| {
        let random = std::collections::hash_map::RandomState::new()
            .build_hasher()
            .finish();
        format!("process-{}-{random:016x}", std::process::id())
    })
}

/// A rewrite of one run's recorded contents, applied by [`Store::rewrite_run`] in one write.
/// The store applies the edits it is given and decides nothing: what changes, and which runs,
/// is the caller's (the retention sweep in [`crate::retention`]).
pub struct RunRewrite {
    /// The run document.
    pub run: ObjectKey,
    /// The version the run document must still have.
    pub expected_version: u64,
    /// Applied to the run document and to the copies of it kept for idempotent batches.
    pub document: Box<dyn Fn(&mut Value) + Send + Sync>,
    /// Applied to every step of the run's journal.
    pub step: Box<dyn Fn(&mut Step) + Send + Sync>,
    /// Applied to every message of the run's inbox.
    pub message: Box<dyn Fn(&mut InboxMessage) + Send + Sync>,
    /// Documents deleted in the same write (not runs: delete a run by itself); one that does
    /// not exist is no error.
    pub delete: Vec<ObjectKey>,
}

/// Refuse the deletions of a [`RunRewrite`] that would delete a run: a rewrite deletes
/// documents only, and a run's journal and inbox go with the run. Every store checks this
/// before it writes.
pub fn check_rewrite_deletes(delete: &[ObjectKey]) -> Result<(), Error> {
    match delete.iter().find(|key| key.kind == Kind::AgentRun) {
        Some(run) => Err(Error::Invalid(format!(
            "a run rewrite cannot delete the run {run}: delete it by itself"
        ))),
        None => Ok(()),
    }
}

impl fmt::Debug for RunRewrite {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RunRewrite")
            .field("run", &self.run)
            .field("expected_version", &self.expected_version)
            .field("delete", &self.delete)
            .finish_non_exhaustive()
    }
}

/// Checks a [`Store::put_snapshot`]'s blobs before anything is written: each digest must be
/// that of its bytes. Every store calls this first.
pub fn check_blobs(blobs: &[Blob]) -> Result<(), Error> {
    match blobs
        .iter()
        .find(|blob| crate::digest::sha256_hex(&blob.bytes) != blob.digest)
    {
        Some(blob) => Err(Error::Invalid(format!(
            "blob {}: its digest is not the SHA-256 of its {} bytes",
            blob.digest,
            blob.bytes.len()
        ))),
        None => Ok(()),
    }
}

/// The refusal of a [`Store::put_snapshot`] of a delta of a step that is not earlier.
pub fn check_stored(seq: u32, stored: &Stored) -> Result<(), Error> {
    stored.check(seq).map_err(Error::Invalid)
}

/// The refusal of a [`Store::complete_step_with`] whose snapshot names contents, or is a
/// delta of a step that is not earlier.
pub fn check_kept(run_uid: &str, seq: u32, stored: &Stored) -> Result<(), Error> {
    check_stored(seq, stored)?;
    let named = stored.named_blobs();
    if named.is_empty() {
        Ok(())
    } else {
        Err(Error::Invalid(format!(
            "the snapshot of run {run_uid} after step {seq} names contents ({}), so it is kept \
             with them, not with the step's outcome",
            named.join(", ")
        )))
    }
}

/// The refusal of a [`Store::put_snapshot`] whose manifest names contents the store lacks.
pub fn missing_contents(run_uid: &str, seq: u32, missing: &[String]) -> Error {
    Error::Invalid(format!(
        "the snapshot of run {run_uid} after step {seq} names contents the store lacks: {}",
        missing.join(", ")
    ))
}

/// A document replaced if it is still at the version its writer read: what
/// [`Store::complete_step_with`] writes with a step's outcome (the run's status, say).
#[derive(Debug, Clone, PartialEq)]
pub struct DocumentWrite {
    /// The document.
    pub key: ObjectKey,
    /// The version the writer read.
    pub expected_version: u64,
    /// Its replacement.
    pub document: Value,
}

/// What [`Store::complete_step_with`] writes with a step's outcome, each only once what
/// comes before it is written.
#[derive(Debug, Clone, Copy, Default)]
pub struct WithOutcome<'a> {
    /// The working directory after a command step, naming no contents
    /// ([`Stored::named_blobs`] empty: nothing changed, or only removals).
    pub snapshot: Option<&'a Stored>,
    /// A document replaced once the outcome is recorded (the run's status).
    pub then: Option<&'a DocumentWrite>,
    /// The run's next step, appended once the outcome is recorded and `then` replaced (a
    /// refused `then` appends nothing: the next step was decided on what it replaced).
    pub next: Option<&'a Step>,
}

/// What became of what [`Store::complete_step_with`] wrote with an outcome.
#[derive(Debug, Clone, PartialEq)]
pub struct OutcomeWritten {
    /// The document's record, or why it was refused (`Conflict`, `NotFound`); `None`
    /// without one.
    pub document: Option<Result<Record, Error>>,
    /// Whether the next step was appended, or why not; `None` without one or when the
    /// document was refused (nothing was tried).
    pub next: Option<Result<(), Error>>,
}

/// Something changed in the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// A document was created or written (its version).
    Written(ObjectKey, u64),
    /// A document was deleted.
    Deleted(ObjectKey),
}

/// Store failures, in portable kinds.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// No such document.
    #[error("{0} not found")]
    NotFound(ObjectKey),
    /// A document with this key exists.
    #[error("{0} already exists")]
    AlreadyExists(ObjectKey),
    /// The write named a stale version.
    #[error("{key} was changed by someone else (version {actual}, the write expected {expected})")]
    Conflict {
        /// The document.
        key: ObjectKey,
        /// The version the writer read.
        expected: u64,
        /// The version stored.
        actual: u64,
    },
    /// The writer's claim on the run was taken over.
    #[error("run {run} is now owned by another writer")]
    Fenced {
        /// The run's uid.
        run: String,
    },
    /// Another replica holds an unexpired lease on the run.
    #[error("run {run} is leased to {owner} until {until}")]
    Leased {
        /// The run's uid.
        run: String,
        /// The replica holding the lease.
        owner: String,
        /// When its lease ends unless renewed.
        until: Timestamp,
    },
    /// The store cannot hold this value (a time past its range, say).
    #[error("the store cannot hold this: {0}")]
    Invalid(String),
    /// A journal write out of order (a bug in the caller).
    #[error("journal of run {run}: {message}")]
    Journal {
        /// The run's uid.
        run: String,
        /// What is wrong.
        message: String,
    },
    /// A batch would leave a group with more unfinished runs than a [`MemberCap`] allows
    /// (nothing was written).
    #[error(
        "group {project}/{group} would have {unfinished} unfinished runs, over the {at_most} \
         it may have"
    )]
    OverCap {
        /// The group's project.
        project: String,
        /// The group.
        group: String,
        /// The cap.
        at_most: u64,
        /// Its unfinished runs had the batch been written.
        unfinished: u64,
    },
    /// A batch names a group that takes no new runs: sealed, finished or cancelled (nothing
    /// was written).
    #[error("group {project}/{group} takes no new runs (sealed, finished or cancelled)")]
    GroupClosed {
        /// The group's project.
        project: String,
        /// The group.
        group: String,
    },
    /// The database is down or restarting; a retry may help.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// Stored data cannot be read.
    #[error("store data is corrupt: {0}")]
    Corrupt(String),
}

impl Error {
    /// Whether trying again may help.
    pub fn is_retryable(&self) -> bool {
        matches!(self, Error::Unavailable(_))
    }
}

/// The room a group has for a batch's new runs, which the batch's write keeps
/// ([`Store::create_batch_within`]): none once the group is sealed, finished or cancelled
/// ([`group::takes_runs`](crate::group::takes_runs)) or gone; else, once the batch is
/// written, the runs of `group` that have not finished (no phase, or one that is not
/// `Succeeded`, `Failed` or `Cancelled`), the batch's own counted, are at most `at_most`.
/// Stores check it in the batch's own transaction, reading the group and counting its
/// members before writing; a write that closes the group is ordered with it (Postgres: both
/// take the group's advisory lock).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberCap {
    /// The group's project.
    pub project: String,
    /// The group.
    pub group: String,
    /// How many of its runs may be unfinished.
    pub at_most: u64,
}

impl MemberCap {
    /// The group's document.
    pub fn group_key(&self) -> ObjectKey {
        ObjectKey::new(&self.project, Kind::AgentGroup, &self.group)
    }

    /// Whether the stored group document `group` takes new runs
    /// ([`group::takes_runs`](crate::group::takes_runs) of its `spec.sealed` and
    /// `status.phase`).
    pub fn takes_runs(group: &Value) -> bool {
        let sealed = group["spec"]["sealed"].as_bool().unwrap_or(false);
        crate::group::takes_runs(sealed, group["status"]["phase"].as_str())
    }

    /// Whether the group has room for `adding`: `group` is the group's document as read
    /// (refused with its [`Error::NotFound`] when it is gone, and [`Error::GroupClosed`] when
    /// it takes no runs), `stored` its members counted by phase as stored
    /// ([`Store::group_phases`]), to which the runs of `adding` that name the group are added
    /// (refused with [`Error::OverCap`] past `at_most`).
    pub fn check(
        &self,
        group: Result<Record, Error>,
        stored: &[(Option<String>, u64)],
        adding: &[(ObjectKey, Value)],
    ) -> Result<(), Error> {
        if !Self::takes_runs(&group?.document) {
            return Err(Error::GroupClosed {
                project: self.project.clone(),
                group: self.group.clone(),
            });
        }
        let unfinished =
            |phase: Option<&str>| !phase.is_some_and(crate::lifecycle::RunPhase::names_finished);
        let added = adding
            .iter()
            .filter(|(key, document)| {
                key.kind == Kind::AgentRun
                    && key.project == self.project
                    && document["spec"]["group"].as_str() == Some(self.group.as_str())
                    && unfinished(document["status"]["phase"].as_str())
            })
            .count();
        let unfinished = stored
            .iter()
            .filter(|(phase, _)| unfinished(phase.as_deref()))
            .fold(u64::try_from(added).unwrap_or(u64::MAX), |sum, (_, n)| {
                sum.saturating_add(*n)
            });
        if unfinished > self.at_most {
            return Err(Error::OverCap {
                project: self.project.clone(),
                group: self.group.clone(),
                at_most: self.at_most,
                unfinished,
            });
        }
        Ok(())
    }
}

/// Phases counted ([`Store::group_phases`]): each phase once with how many have it, in
/// phase order (`None` first).
pub fn count_phases<'a>(
    phases: impl IntoIterator<Item = Option<&'a str>>,
) -> Vec<(Option<String>, u64)> {
    let mut counts: BTreeMap<Option<String>, u64> = BTreeMap::new();
    for phase in phases {
        *counts.entry(phase.map(str::to_string)).or_default() += 1;
    }
    counts.into_iter().collect()
}

/// `records` with each document cut down to `paths` (see [`sparse`]).
pub fn cut_down(records: Vec<Record>, paths: &[String]) -> Vec<Record> {
    records
        .into_iter()
        .map(|record| Record {
            document: sparse(&record.document, paths),
            ..record
        })
        .collect()
}

/// A document that holds only the values of `document` at `paths` (dotted field paths); an
/// absent path stays absent, and so does one that runs through something not an object.
pub fn sparse(document: &Value, paths: &[String]) -> Value {
    let mut out = Value::Object(serde_json::Map::new());
    for path in paths {
        let found = path
            .split('.')
            .try_fold(document, |value, part| value.get(part));
        if let Some(value) = found {
            set_path(&mut out, path, value.clone());
        }
    }
    out
}

/// Puts `value` at the dotted `path` of `document`, making the objects on the way.
pub fn set_path(document: &mut Value, path: &str, value: Value) {
    let mut here = document;
    let mut parts = path.split('.').peekable();
    while let Some(part) = parts.next() {
        let Some(object) = here.as_object_mut() else {
            return;
        };
        if parts.peek().is_none() {
            object.insert(part.to_string(), value);
            return;
        }
        here = object
            .entry(part.to_string())
            .or_insert_with(|| Value::Object(serde_json::Map::new()));
    }
}

/// An edit of one document for [`Store::modify`]: the replacement of the stored document, or
/// `None` to leave it.
pub type Edit = Box<dyn FnMut(&Value) -> Option<Value> + Send>;

/// Durable state: resources, journals, inboxes.
#[async_trait]
pub trait Store: Send + Sync {
    /// Create a document (version 1).
    async fn create(&self, key: &ObjectKey, document: Value) -> Result<Record, Error>;

    /// Create several documents in order, all or nothing. With an idempotency key, a repeat
    /// returns the first call's records without writing.
    async fn create_batch(
        &self,
        items: Vec<(ObjectKey, Value)>,
        idempotency_key: Option<&str>,
    ) -> Result<Vec<Record>, Error> {
        self.create_batch_within(items, idempotency_key, &[]).await
    }

    /// [`Store::create_batch`], keeping every cap of `caps` ([`MemberCap::check`]): checked in
    /// the batch's own write (the group read and the batch's runs counted there), so that two
    /// batches into one group, on one replica or on two, never both pass on counts read
    /// before either was written, and no batch joins a group closed (sealed, cancelled) after
    /// the batch was admitted. Refused, nothing written, when a cap would not hold; a repeat
    /// of an idempotent batch returns the first call's records without checking again.
    async fn create_batch_within(
        &self,
        items: Vec<(ObjectKey, Value)>,
        idempotency_key: Option<&str>,
        caps: &[MemberCap],
    ) -> Result<Vec<Record>, Error>;

    /// Read a document.
    async fn get(&self, key: &ObjectKey) -> Result<Record, Error>;

    /// Documents of a kind in a project that match, in creation order.
    async fn list(
        &self,
        project: &str,
        kind: Kind,
        selector: &Selector,
    ) -> Result<Vec<Record>, Error>;

    /// At most `limit` of the documents [`Store::list`] returns, those created after
    /// `after` (from the first without it), with the position the next page starts after
    /// when more remain. A document created while a client pages appears at most once.
    async fn list_page(
        &self,
        project: &str,
        kind: Kind,
        selector: &Selector,
        after: Option<Position>,
        limit: NonZeroUsize,
    ) -> Result<Page, Error>;

    /// Like [`Store::list`], but each document holds only the values at `paths` (dotted
    /// field paths; absent ones stay absent) and at the selector's own paths: for controllers
    /// that look at a few fields of many documents. This default lists whole documents and
    /// cuts them down; the SQL stores read only those paths.
    async fn list_sparse(
        &self,
        project: &str,
        kind: Kind,
        selector: &Selector,
        paths: &[&str],
    ) -> Result<Vec<Record>, Error> {
        let wanted = selector.paths_with(paths);
        Ok(cut_down(self.list(project, kind, selector).await?, &wanted))
    }

    /// [`Store::list_sparse`] for a caller that keeps what it listed last: a document that
    /// `known` holds for its name, at the same place in creation order and at the same
    /// version, is answered by its name alone ([`Sparse::Known`]), so a listing that mostly
    /// did not change costs about its names (the SQL stores read no path of a known document,
    /// and hand none over). No default: only the store knows where its documents were
    /// created.
    async fn list_sparse_known(
        &self,
        project: &str,
        kind: Kind,
        selector: &Selector,
        paths: &[&str],
        known: &HashMap<String, Seen>,
    ) -> Result<Vec<Sparse>, Error>;

    /// Every project that holds a document, in name order, each once.
    async fn projects(&self) -> Result<Vec<String>, Error>;

    /// How many runs (`AgentRun` documents) of `project` name `group` as their `spec.group`
    /// (a string), by `status.phase` (`None`: none, or not a string), in [`count_phases`]'s
    /// order: what a group's admission counts instead of reading every member. This default
    /// reads each member's phase; the SQL stores keep counters per group and phase (triggers
    /// on every write), so their answer costs the same at any group size.
    async fn group_phases(
        &self,
        project: &str,
        group: &str,
    ) -> Result<Vec<(Option<String>, u64)>, Error> {
        let selector = Selector::in_group(group);
        let members = self
            .list_sparse(project, Kind::AgentRun, &selector, &["status.phase"])
            .await?;
        Ok(count_phases(
            members
                .iter()
                .filter(|record| record.document["spec"]["group"].as_str() == Some(group))
                .map(|record| record.document["status"]["phase"].as_str()),
        ))
    }

    /// Replace a document if it is still at `expected_version`.
    async fn update(
        &self,
        key: &ObjectKey,
        expected_version: u64,
        document: Value,
    ) -> Result<Record, Error>;

    /// Change a document atomically: `edit` is given the stored document and returns its
    /// replacement, or `None` to leave it as it is; no other write to the document comes
    /// between that read and this write, so concurrent edits (many runs' reservations on one
    /// account, say) never conflict and are never lost. Returns the document as stored
    /// afterwards. Backends that can, run `edit` inside their own write (one commit, however
    /// many edits are queued); this default reads and updates until no conflict intervenes,
    /// so `edit` may be called more than once.
    async fn modify(&self, key: &ObjectKey, mut edit: Edit) -> Result<Record, Error> {
        loop {
            let record = self.get(key).await?;
            let Some(document) = edit(&record.document) else {
                return Ok(record);
            };
            match self.update(key, record.version, document).await {
                Err(Error::Conflict { .. }) => continue,
                other => return other,
            }
        }
    }

    /// Delete a document with its journal and inbox.
    async fn delete(&self, key: &ObjectKey) -> Result<(), Error>;

    /// Claim the right to write a run's journal with a lease. Granted when nobody holds an
    /// unexpired lease on the run, or when `lease.owner` holds it (a replica claiming again,
    /// after a restart under the same name or to resolve a run); refused with `Leased`
    /// otherwise. Each grant makes a new fence, and every earlier fence stale.
    async fn claim(&self, run_uid: &str, lease: &Lease) -> Result<Fence, Error>;

    /// Extend the lease that `fence` holds to `lease.now + lease.duration`. Refused with
    /// `Fenced` once another claim took the run over (an expired lease nobody took over is
    /// renewed).
    async fn renew(&self, run_uid: &str, fence: Fence, lease: &Lease) -> Result<(), Error>;

    /// Give up the lease that `fence` holds, so another replica can claim the run at once.
    /// The fence stays the latest until someone claims. Refused with `Fenced` when stale.
    async fn release(&self, run_uid: &str, fence: Fence) -> Result<(), Error>;

    /// Append a step's intent. Its `seq` must be the journal's length.
    async fn append_step(&self, run_uid: &str, fence: Fence, step: &Step) -> Result<(), Error>;

    /// Record the outcome of step `seq`, which must have none yet.
    async fn complete_step(
        &self,
        run_uid: &str,
        fence: Fence,
        seq: u32,
        completion: &Completion,
    ) -> Result<(), Error>;

    /// Record the outcome of step `seq` as [`Store::complete_step`] does and, only once it
    /// is recorded, what `with` carries, in order: the snapshot after the step (as
    /// [`Store::put_snapshot`] would, with no contents), the document (as [`Store::update`]
    /// would) and the run's next step (as [`Store::append_step`] would, and only when the
    /// document was replaced or none was given). One write where the store can (SQLite: one
    /// submission to its writer, one commit), so that a step costs one round trip from its
    /// outcome to its successor's intent. The `Err` is the completion's, or a snapshot that
    /// names contents (`Invalid`): nothing was written. This default makes the calls one
    /// after the other.
    async fn complete_step_with(
        &self,
        run_uid: &str,
        fence: Fence,
        seq: u32,
        completion: &Completion,
        with: WithOutcome<'_>,
    ) -> Result<OutcomeWritten, Error> {
        if let Some(snapshot) = with.snapshot {
            check_kept(run_uid, seq, snapshot)?;
            self.put_snapshot(run_uid, seq, snapshot, &[]).await?;
        }
        self.complete_step(run_uid, fence, seq, completion).await?;
        let document = match with.then {
            None => None,
            Some(then) => Some(
                self.update(&then.key, then.expected_version, then.document.clone())
                    .await,
            ),
        };
        let next = match (with.next, &document) {
            (Some(step), None | Some(Ok(_))) => Some(self.append_step(run_uid, fence, step).await),
            _ => None,
        };
        Ok(OutcomeWritten { document, next })
    }

    /// The run's journal, in order.
    async fn journal(&self, run_uid: &str) -> Result<Vec<Step>, Error>;

    /// Put a message in a run's inbox if the run document is still at `expected_version`,
    /// and bump that version, so that a writer who decided on the older version (to finish
    /// the run, say) is refused and looks again. A repeated key delivers once.
    async fn post_message(
        &self,
        run: &ObjectKey,
        expected_version: u64,
        key: Option<&str>,
        payload: &str,
        at: Timestamp,
    ) -> Result<Delivery, Error>;

    /// The run's inbox, in order.
    async fn inbox(&self, run_uid: &str) -> Result<Vec<InboxMessage>, Error>;

    /// Rewrite a run's recorded contents in one write, if its document is still at
    /// `rewrite.expected_version` (refused with `Conflict` otherwise, and nothing is written):
    /// the document (its version is bumped) and its copies kept for idempotent batches, every
    /// step of its journal (the journal of its `metadata.uid`), every message of its inbox,
    /// and the deletion of `rewrite.delete`. Returns the document as stored afterwards.
    async fn rewrite_run(&self, rewrite: RunRewrite) -> Result<Record, Error>;

    /// Keep `snapshot`, the run's working directory after step `seq` (replacing one kept for
    /// the step before), whole or as the changes from an earlier step's ([`Stored`]), with
    /// the contents it names that the store lacks: each blob is stored once by its digest,
    /// however many runs name it. One write: refused with `Invalid`, and nothing written,
    /// when a blob's digest is not that of its bytes, the record names contents the store
    /// would still lack, or it is a delta of a step that is not earlier. Only the contents
    /// the record itself names are checked: a delta's base named its own.
    async fn put_snapshot(
        &self,
        run_uid: &str,
        seq: u32,
        snapshot: &Stored,
        blobs: &[Blob],
    ) -> Result<(), Error>;

    /// Which of `digests` the store holds no contents for.
    async fn missing_blobs(&self, digests: &[String]) -> Result<Vec<String>, Error>;

    /// The run's snapshots, by step, in step order, whole ([`crate::snapshot::resolve`]).
    async fn snapshots(&self, run_uid: &str) -> Result<Vec<(u32, Snapshot)>, Error>;

    /// The contents stored under `digest`.
    async fn blob(&self, digest: &str) -> Result<Option<Vec<u8>>, Error>;

    /// Remove the run's snapshots, and the contents no other run's snapshot names, in one
    /// write. Deleting a run ([`Store::delete`]) does the same.
    async fn delete_snapshots(&self, run_uid: &str) -> Result<(), Error>;

    /// Bytes of snapshot contents stored, every run's together, each blob counted once.
    async fn blob_bytes(&self) -> Result<u64, Error>;

    /// Changes from now on.
    fn subscribe(&self) -> tokio::sync::broadcast::Receiver<Change>;
}

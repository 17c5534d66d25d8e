//! An in-memory [`Store`]: the whole state behind one mutex, for tests, examples and
//! single-process embedding (the default store of [`Deps::builder`](crate::engine::Deps::builder)).
//!
//! Nothing survives the process. Every operation takes the lock once, does its checks and
//! its writes under it, and sends its change notifications before releasing it, so the
//! notifications of one document arrive in version order. The lock is never held across an
//! await point.

use std::collections::{BTreeMap, HashMap};
use std::num::NonZeroUsize;
use std::ops::Bound;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::journal::{Completion, Step};
use crate::resource::Kind;
use crate::snapshot::{Blob, Snapshot, Stored};
use crate::store::{
    Change, Delivery, Edit, Error, Fence, InboxMessage, Lease, MemberCap, ObjectKey, Page,
    Position, Record, RunRewrite, Seen, Selector, Sparse, Store, check_blobs,
    check_rewrite_deletes, check_stored, missing_contents, sparse,
};
use async_trait::async_trait;
use jiff::Timestamp;
use serde_json::Value;
use tokio::sync::broadcast;

/// How many changes a slow subscriber may fall behind before it sees `Lagged`.
const CHANGE_CAPACITY: usize = 1024;

/// An in-memory store. Cloning is cheap and every clone shares the same state, so an engine
/// and a test can hold one store each and see the same documents.
#[derive(Debug, Clone)]
pub struct MemoryStore {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    state: Mutex<State>,
    changes: broadcast::Sender<Change>,
}

/// Everything the store holds.
#[derive(Debug, Default)]
struct State {
    /// Documents by project, then kind.
    projects: HashMap<String, HashMap<Kind, Collection>>,
    /// The next creation number; orders documents for `list`.
    next_order: u64,
    /// Each run's latest fence and lease (kept after a delete, so that old fences stay
    /// stale).
    fences: HashMap<String, LeaseState>,
    /// Journals by run uid.
    journals: HashMap<String, Vec<Step>>,
    /// Inboxes by run uid.
    inboxes: HashMap<String, Inbox>,
    /// The records of batches created with an idempotency key, by (project, key).
    batches: HashMap<(String, String), Vec<Record>>,
    /// Working-directory snapshots by run uid, then step.
    snapshots: HashMap<String, BTreeMap<u32, Snapshot>>,
    /// Snapshot contents by digest.
    blobs: HashMap<String, Vec<u8>>,
}

impl State {
    /// The runs of `group` of `project` counted by phase ([`Store::group_phases`]): one pass
    /// over the project's runs, copying nothing.
    fn group_phases(&self, project: &str, group: &str) -> Vec<(Option<String>, u64)> {
        crate::store::count_phases(
            self.collection(project, Kind::AgentRun)
                .into_iter()
                .flat_map(|collection| collection.by_order.values())
                .filter(|entry| entry.document["spec"]["group"].as_str() == Some(group))
                .map(|entry| entry.document["status"]["phase"].as_str()),
        )
    }

    /// Remove the run's snapshots and the contents no other snapshot names.
    fn drop_snapshots(&mut self, run_uid: &str) {
        let Some(gone) = self.snapshots.remove(run_uid) else {
            return;
        };
        let named: std::collections::HashSet<String> = self
            .snapshots
            .values()
            .flat_map(BTreeMap::values)
            .filter_map(Snapshot::manifest)
            .flat_map(crate::snapshot::Manifest::blobs)
            .collect();
        for digest in gone
            .values()
            .filter_map(Snapshot::manifest)
            .flat_map(crate::snapshot::Manifest::blobs)
        {
            if !named.contains(&digest) {
                self.blobs.remove(&digest);
            }
        }
    }
}

/// The documents of one kind in one project.
#[derive(Debug, Default)]
struct Collection {
    /// Creation number by name.
    by_name: HashMap<String, u64>,
    /// Documents in creation order.
    by_order: BTreeMap<u64, Entry>,
}

#[derive(Debug)]
struct Entry {
    name: String,
    version: u64,
    document: Value,
}

/// A run's latest fence and who holds it until when.
#[derive(Debug)]
struct LeaseState {
    fence: u64,
    /// `None` once released or deleted.
    owner: Option<String>,
    expires_at: Timestamp,
}

impl LeaseState {
    /// Refuse a claim by `lease.owner` while another owner's lease runs.
    fn check_free(&self, run_uid: &str, lease: &Lease) -> Result<(), Error> {
        match &self.owner {
            Some(owner) if *owner != lease.owner && self.expires_at > lease.now => {
                Err(Error::Leased {
                    run: run_uid.to_string(),
                    owner: owner.clone(),
                    until: self.expires_at,
                })
            }
            _ => Ok(()),
        }
    }
}

#[derive(Debug, Default)]
struct Inbox {
    messages: Vec<InboxMessage>,
    /// Sequence number by deduplication key.
    keys: HashMap<String, u64>,
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        let (changes, _) = broadcast::channel(CHANGE_CAPACITY);
        MemoryStore {
            inner: Arc::new(Inner {
                state: Mutex::new(State::default()),
                changes,
            }),
        }
    }

    /// The state, recovered if a panicking holder poisoned the lock: every operation checks
    /// before it writes, so a panic cannot leave a half-done write behind.
    fn lock(&self) -> MutexGuard<'_, State> {
        self.inner.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Tell subscribers; having none is fine.
    fn notify(&self, change: Change) {
        let _ = self.inner.changes.send(change);
    }
}

impl Default for MemoryStore {
    fn default() -> Self {
        MemoryStore::new()
    }
}

impl State {
    fn collection(&self, project: &str, kind: Kind) -> Option<&Collection> {
        self.projects.get(project)?.get(&kind)
    }

    fn entry(&self, key: &ObjectKey) -> Option<&Entry> {
        let collection = self.collection(&key.project, key.kind)?;
        let order = collection.by_name.get(&key.name)?;
        collection.by_order.get(order)
    }

    fn entry_mut(&mut self, key: &ObjectKey) -> Option<&mut Entry> {
        let collection = self.projects.get_mut(&key.project)?.get_mut(&key.kind)?;
        let order = collection.by_name.get(&key.name)?;
        collection.by_order.get_mut(order)
    }

    /// Take a document out, if it is there.
    fn remove(&mut self, key: &ObjectKey) -> Option<Entry> {
        let collection = self.projects.get_mut(&key.project)?.get_mut(&key.kind)?;
        let order = collection.by_name.remove(&key.name)?;
        collection.by_order.remove(&order)
    }

    /// A copy of the document stored under `key`.
    fn record(&self, key: &ObjectKey) -> Result<Record, Error> {
        let entry = self
            .entry(key)
            .ok_or_else(|| Error::NotFound(key.clone()))?;
        Ok(Record {
            key: key.clone(),
            version: entry.version,
            document: entry.document.clone(),
        })
    }

    fn contains(&self, key: &ObjectKey) -> bool {
        self.collection(&key.project, key.kind)
            .is_some_and(|c| c.by_name.contains_key(&key.name))
    }

    /// Insert a document that is known not to exist, at version 1.
    fn insert(&mut self, key: &ObjectKey, document: Value) -> Record {
        let order = self.next_order;
        self.next_order += 1;
        let collection = self
            .projects
            .entry(key.project.clone())
            .or_default()
            .entry(key.kind)
            .or_default();
        collection.by_name.insert(key.name.clone(), order);
        collection.by_order.insert(
            order,
            Entry {
                name: key.name.clone(),
                version: 1,
                document: document.clone(),
            },
        );
        Record {
            key: key.clone(),
            version: 1,
            document,
        }
    }

    /// Refuse a write by `fence` unless it is the run's latest claim.
    fn check_fence(&self, run_uid: &str, fence: Fence) -> Result<(), Error> {
        match self.fences.get(run_uid) {
            Some(latest) if fence.0 == latest.fence => Ok(()),
            _ => Err(Error::Fenced {
                run: run_uid.to_string(),
            }),
        }
    }

    /// Grant `lease` on a run: a new fence, after checking that nobody else holds it.
    fn grant(&mut self, run_uid: &str, lease: &Lease) -> Result<Fence, Error> {
        let expires_at = lease.expires_at()?;
        let state = self
            .fences
            .entry(run_uid.to_string())
            .or_insert(LeaseState {
                fence: 0,
                owner: None,
                expires_at: Timestamp::MIN,
            });
        state.check_free(run_uid, lease)?;
        state.fence = state
            .fence
            .checked_add(1)
            .ok_or_else(|| Error::Corrupt(format!("run {run_uid}: no fence is left to claim")))?;
        state.owner = Some(lease.owner.clone());
        state.expires_at = expires_at;
        Ok(Fence(state.fence))
    }
}

/// The run uid a document carries in `metadata.uid`.
fn run_uid(document: &Value) -> Option<&str> {
    document["metadata"]["uid"].as_str()
}

fn journal_error(run: &str, message: String) -> Error {
    Error::Journal {
        run: run.to_string(),
        message,
    }
}

fn next_version(key: &ObjectKey, version: u64) -> Result<u64, Error> {
    version
        .checked_add(1)
        .ok_or_else(|| Error::Corrupt(format!("{key}: version {version} cannot be bumped")))
}

#[async_trait]
impl Store for MemoryStore {
    async fn create(&self, key: &ObjectKey, document: Value) -> Result<Record, Error> {
        let mut state = self.lock();
        if state.contains(key) {
            return Err(Error::AlreadyExists(key.clone()));
        }
        let record = state.insert(key, document);
        self.notify(Change::Written(key.clone(), 1));
        Ok(record)
    }

    async fn create_batch_within(
        &self,
        items: Vec<(ObjectKey, Value)>,
        idempotency_key: Option<&str>,
        caps: &[MemberCap],
    ) -> Result<Vec<Record>, Error> {
        let mut state = self.lock();
        let scope = match (idempotency_key, items.first()) {
            (Some(idempotency_key), Some((first, _))) => {
                let scope = (first.project.clone(), idempotency_key.to_string());
                if let Some(records) = state.batches.get(&scope) {
                    return Ok(records.clone());
                }
                Some(scope)
            }
            _ => None,
        };
        // Check everything before writing anything: a key that exists, or that the batch
        // names twice, refuses the whole batch.
        let mut seen = std::collections::HashSet::with_capacity(items.len());
        for (key, _) in &items {
            if state.contains(key) || !seen.insert(key) {
                return Err(Error::AlreadyExists(key.clone()));
            }
        }
        for cap in caps {
            let group = state.record(&cap.group_key());
            cap.check(group, &state.group_phases(&cap.project, &cap.group), &items)?;
        }
        let records: Vec<Record> = items
            .into_iter()
            .map(|(key, document)| state.insert(&key, document))
            .collect();
        for record in &records {
            self.notify(Change::Written(record.key.clone(), record.version));
        }
        if let Some(scope) = scope {
            state.batches.insert(scope, records.clone());
        }
        Ok(records)
    }

    async fn get(&self, key: &ObjectKey) -> Result<Record, Error> {
        self.lock().record(key)
    }

    async fn list(
        &self,
        project: &str,
        kind: Kind,
        selector: &Selector,
    ) -> Result<Vec<Record>, Error> {
        let state = self.lock();
        let Some(collection) = state.collection(project, kind) else {
            return Ok(Vec::new());
        };
        Ok(collection
            .by_order
            .values()
            .filter(|entry| selector.matches(&entry.document))
            .map(|entry| Record {
                key: ObjectKey::new(project, kind, entry.name.clone()),
                version: entry.version,
                document: entry.document.clone(),
            })
            .collect())
    }

    async fn list_page(
        &self,
        project: &str,
        kind: Kind,
        selector: &Selector,
        after: Option<Position>,
        limit: NonZeroUsize,
    ) -> Result<Page, Error> {
        let state = self.lock();
        let Some(collection) = state.collection(project, kind) else {
            return Ok(Page {
                records: Vec::new(),
                next: None,
            });
        };
        let start = match after {
            Some(Position(order)) => Bound::Excluded(order),
            None => Bound::Unbounded,
        };
        let found = collection
            .by_order
            .range((start, Bound::Unbounded))
            .filter(|(_, entry)| selector.matches(&entry.document))
            .take(limit.get().saturating_add(1))
            .map(|(order, entry)| {
                let record = Record {
                    key: ObjectKey::new(project, kind, entry.name.clone()),
                    version: entry.version,
                    document: entry.document.clone(),
                };
                (Position(*order), record)
            })
            .collect();
        Ok(Page::of(found, limit))
    }

    async fn list_sparse_known(
        &self,
        project: &str,
        kind: Kind,
        selector: &Selector,
        paths: &[&str],
        known: &HashMap<String, Seen>,
    ) -> Result<Vec<Sparse>, Error> {
        let wanted = selector.paths_with(paths);
        let state = self.lock();
        let Some(collection) = state.collection(project, kind) else {
            return Ok(Vec::new());
        };
        Ok(collection
            .by_order
            .iter()
            .filter(|(_, entry)| selector.matches(&entry.document))
            .map(|(order, entry)| {
                let at = Position(*order);
                let seen = Seen {
                    at,
                    version: entry.version,
                };
                if known.get(&entry.name) == Some(&seen) {
                    return Sparse::Known(entry.name.clone());
                }
                let record = Record {
                    key: ObjectKey::new(project, kind, entry.name.clone()),
                    version: entry.version,
                    document: sparse(&entry.document, &wanted),
                };
                Sparse::Read { at, record }
            })
            .collect())
    }

    async fn projects(&self) -> Result<Vec<String>, Error> {
        let state = self.lock();
        let mut projects: Vec<String> = state
            .projects
            .iter()
            .filter(|(_, kinds)| kinds.values().any(|c| !c.by_name.is_empty()))
            .map(|(project, _)| project.clone())
            .collect();
        projects.sort_unstable();
        Ok(projects)
    }

    async fn group_phases(
        &self,
        project: &str,
        group: &str,
    ) -> Result<Vec<(Option<String>, u64)>, Error> {
        Ok(self.lock().group_phases(project, group))
    }

    async fn update(
        &self,
        key: &ObjectKey,
        expected_version: u64,
        document: Value,
    ) -> Result<Record, Error> {
        let mut state = self.lock();
        let entry = state
            .entry_mut(key)
            .ok_or_else(|| Error::NotFound(key.clone()))?;
        if entry.version != expected_version {
            return Err(Error::Conflict {
                key: key.clone(),
                expected: expected_version,
                actual: entry.version,
            });
        }
        let version = next_version(key, entry.version)?;
        entry.version = version;
        entry.document = document.clone();
        self.notify(Change::Written(key.clone(), version));
        Ok(Record {
            key: key.clone(),
            version,
            document,
        })
    }

    async fn modify(&self, key: &ObjectKey, mut edit: Edit) -> Result<Record, Error> {
        let mut state = self.lock();
        let entry = state
            .entry_mut(key)
            .ok_or_else(|| Error::NotFound(key.clone()))?;
        if let Some(document) = edit(&entry.document) {
            let version = next_version(key, entry.version)?;
            entry.version = version;
            entry.document = document;
            self.notify(Change::Written(key.clone(), version));
        }
        Ok(Record {
            key: key.clone(),
            version: entry.version,
            document: entry.document.clone(),
        })
    }

    async fn delete(&self, key: &ObjectKey) -> Result<(), Error> {
        let mut state = self.lock();
        let entry = state
            .remove(key)
            .ok_or_else(|| Error::NotFound(key.clone()))?;
        if let Some(uid) = run_uid(&entry.document) {
            state.journals.remove(uid);
            state.inboxes.remove(uid);
            state.drop_snapshots(uid);
            // A writer still holding a claim on the deleted run must not bring its journal
            // back: make every fence stale (the counter stays, so no fence is reissued).
            if let Some(latest) = state.fences.get_mut(uid) {
                latest.fence = latest.fence.saturating_add(1);
                latest.owner = None;
            }
        }
        self.notify(Change::Deleted(key.clone()));
        Ok(())
    }

    async fn claim(&self, run_uid: &str, lease: &Lease) -> Result<Fence, Error> {
        self.lock().grant(run_uid, lease)
    }

    async fn renew(&self, run_uid: &str, fence: Fence, lease: &Lease) -> Result<(), Error> {
        let expires_at = lease.expires_at()?;
        let mut state = self.lock();
        state.check_fence(run_uid, fence)?;
        if let Some(latest) = state.fences.get_mut(run_uid) {
            latest.owner = Some(lease.owner.clone());
            latest.expires_at = expires_at;
        }
        Ok(())
    }

    async fn release(&self, run_uid: &str, fence: Fence) -> Result<(), Error> {
        let mut state = self.lock();
        state.check_fence(run_uid, fence)?;
        if let Some(latest) = state.fences.get_mut(run_uid) {
            latest.owner = None;
            latest.expires_at = Timestamp::MIN;
        }
        Ok(())
    }

    async fn append_step(&self, run_uid: &str, fence: Fence, step: &Step) -> Result<(), Error> {
        let mut state = self.lock();
        state.check_fence(run_uid, fence)?;
        let journal = state.journals.entry(run_uid.to_string()).or_default();
        if usize::try_from(step.seq).ok() != Some(journal.len()) {
            return Err(journal_error(
                run_uid,
                format!(
                    "step {} appended out of order (the journal has {} steps, so the next is {})",
                    step.seq,
                    journal.len(),
                    journal.len()
                ),
            ));
        }
        journal.push(step.clone());
        Ok(())
    }

    async fn complete_step(
        &self,
        run_uid: &str,
        fence: Fence,
        seq: u32,
        completion: &Completion,
    ) -> Result<(), Error> {
        let mut state = self.lock();
        state.check_fence(run_uid, fence)?;
        let journal = state.journals.get_mut(run_uid);
        let len = journal.as_ref().map_or(0, |j| j.len());
        let step = journal
            .and_then(|j| j.get_mut(usize::try_from(seq).ok()?))
            .ok_or_else(|| {
                journal_error(
                    run_uid,
                    format!("cannot complete step {seq}: the journal has {len} steps"),
                )
            })?;
        if step.completion.is_some() {
            return Err(journal_error(
                run_uid,
                format!("step {seq} is already completed"),
            ));
        }
        step.completion = Some(completion.clone());
        Ok(())
    }

    async fn journal(&self, run_uid: &str) -> Result<Vec<Step>, Error> {
        Ok(self
            .lock()
            .journals
            .get(run_uid)
            .cloned()
            .unwrap_or_default())
    }

    async fn post_message(
        &self,
        run: &ObjectKey,
        expected_version: u64,
        key: Option<&str>,
        payload: &str,
        at: Timestamp,
    ) -> Result<Delivery, Error> {
        let mut state = self.lock();
        let entry = state
            .entry(run)
            .ok_or_else(|| Error::NotFound(run.clone()))?;
        let current = entry.version;
        let uid = run_uid(&entry.document)
            .ok_or_else(|| {
                journal_error(&run.to_string(), "the run has no metadata.uid".to_string())
            })?
            .to_string();
        if let Some(&seq) = key.and_then(|key| state.inboxes.get(&uid)?.keys.get(key)) {
            return Ok(Delivery::Duplicate(seq));
        }
        if current != expected_version {
            return Err(Error::Conflict {
                key: run.clone(),
                expected: expected_version,
                actual: current,
            });
        }
        let version = next_version(run, current)?;
        let inbox = state.inboxes.entry(uid).or_default();
        let seq = u64::try_from(inbox.messages.len())
            .ok()
            .and_then(|len| len.checked_add(1))
            .ok_or_else(|| Error::Corrupt(format!("{run}: the inbox is full")))?;
        if let Some(key) = key {
            inbox.keys.insert(key.to_string(), seq);
        }
        inbox.messages.push(InboxMessage {
            seq,
            key: key.map(str::to_string),
            payload: payload.to_string(),
            received_at: at,
        });
        if let Some(entry) = state.entry_mut(run) {
            entry.version = version;
        }
        self.notify(Change::Written(run.clone(), version));
        Ok(Delivery::Delivered(seq))
    }

    async fn inbox(&self, run_uid: &str) -> Result<Vec<InboxMessage>, Error> {
        Ok(self
            .lock()
            .inboxes
            .get(run_uid)
            .map(|inbox| inbox.messages.clone())
            .unwrap_or_default())
    }

    async fn rewrite_run(&self, rewrite: RunRewrite) -> Result<Record, Error> {
        let RunRewrite {
            run,
            expected_version,
            document: edit_document,
            step: edit_step,
            message: edit_message,
            delete,
        } = rewrite;
        check_rewrite_deletes(&delete)?;
        let mut state = self.lock();
        let entry = state
            .entry_mut(&run)
            .ok_or_else(|| Error::NotFound(run.clone()))?;
        if entry.version != expected_version {
            return Err(Error::Conflict {
                key: run,
                expected: expected_version,
                actual: entry.version,
            });
        }
        let version = next_version(&run, entry.version)?;
        let uid = run_uid(&entry.document).map(str::to_string);
        edit_document(&mut entry.document);
        entry.version = version;
        let record = Record {
            key: run.clone(),
            version,
            document: entry.document.clone(),
        };
        if let Some(uid) = uid {
            if let Some(journal) = state.journals.get_mut(&uid) {
                journal.iter_mut().for_each(&edit_step);
            }
            if let Some(inbox) = state.inboxes.get_mut(&uid) {
                inbox.messages.iter_mut().for_each(&edit_message);
            }
        }
        for records in state.batches.values_mut() {
            for copy in records.iter_mut().filter(|r| r.key == run) {
                edit_document(&mut copy.document);
            }
        }
        self.notify(Change::Written(run, version));
        for key in delete {
            if state.remove(&key).is_some() {
                self.notify(Change::Deleted(key));
            }
        }
        Ok(record)
    }

    async fn put_snapshot(
        &self,
        run_uid: &str,
        seq: u32,
        snapshot: &Stored,
        blobs: &[Blob],
    ) -> Result<(), Error> {
        check_blobs(blobs)?;
        check_stored(seq, snapshot)?;
        let mut state = self.lock();
        let missing: Vec<String> = snapshot
            .named_blobs()
            .into_iter()
            .filter(|d| !state.blobs.contains_key(d) && !blobs.iter().any(|b| &b.digest == d))
            .collect();
        if !missing.is_empty() {
            return Err(missing_contents(run_uid, seq, &missing));
        }
        for blob in blobs {
            state
                .blobs
                .entry(blob.digest.clone())
                .or_insert_with(|| blob.bytes.clone());
        }
        // Kept whole: a delta is resolved on its base now, as the SQL stores do when read.
        let kept = state.snapshots.entry(run_uid.to_string()).or_default();
        let base = match snapshot {
            Stored::Delta(delta) => kept.get(&delta.delta_of),
            Stored::Whole(_) => None,
        };
        let whole = snapshot.clone().resolve_on(base);
        kept.insert(seq, whole);
        Ok(())
    }

    async fn missing_blobs(&self, digests: &[String]) -> Result<Vec<String>, Error> {
        let state = self.lock();
        Ok(digests
            .iter()
            .filter(|d| !state.blobs.contains_key(*d))
            .cloned()
            .collect())
    }

    async fn snapshots(&self, run_uid: &str) -> Result<Vec<(u32, Snapshot)>, Error> {
        Ok(self
            .lock()
            .snapshots
            .get(run_uid)
            .map(|s| s.iter().map(|(seq, s)| (*seq, s.clone())).collect())
            .unwrap_or_default())
    }

    async fn blob(&self, digest: &str) -> Result<Option<Vec<u8>>, Error> {
        Ok(self.lock().blobs.get(digest).cloned())
    }

    async fn delete_snapshots(&self, run_uid: &str) -> Result<(), Error> {
        self.lock().drop_snapshots(run_uid);
        Ok(())
    }

    async fn blob_bytes(&self) -> Result<u64, Error> {
        Ok(self.lock().blobs.values().map(|b| b.len() as u64).sum())
    }

    fn subscribe(&self) -> broadcast::Receiver<Change> {
        self.inner.changes.subscribe()
    }
}

#[cfg(test)]
mod tests {
    //! Behaviour of the in-memory store beyond the conformance suite.

    use crate::journal::{Intent, Step};
    use serde_json::json;

    use super::*;

    fn step(seq: u32) -> Step {
        Step {
            seq,
            started_at: Timestamp::UNIX_EPOCH,
            intent: Intent::Route { turn: seq },
            completion: None,
        }
    }

    #[tokio::test]
    async fn delete_makes_outstanding_fences_stale() {
        let store = MemoryStore::new();
        let key = ObjectKey::new("p", Kind::AgentRun, "r");
        let document = json!({"apiVersion": "nodus.dev/v1", "kind": "AgentRun",
            "metadata": {"name": "r", "uid": "u-1"}, "spec": {}, "status": {}});
        store.create(&key, document.clone()).await.unwrap();
        let fence = store
            .claim("u-1", &Lease::for_this_process(Timestamp::UNIX_EPOCH))
            .await
            .unwrap();
        store.append_step("u-1", fence, &step(0)).await.unwrap();

        store.delete(&key).await.unwrap();
        // The old writer cannot bring the deleted run's journal back.
        assert_eq!(
            store.append_step("u-1", fence, &step(0)).await,
            Err(Error::Fenced { run: "u-1".into() })
        );
        assert_eq!(store.journal("u-1").await, Ok(vec![]));

        // Nor can it write to the run created again: new claims never reissue its fence.
        store.create(&key, document).await.unwrap();
        let fresh = store
            .claim("u-1", &Lease::for_this_process(Timestamp::UNIX_EPOCH))
            .await
            .unwrap();
        assert!(fresh > fence);
        assert_eq!(
            store.append_step("u-1", fence, &step(0)).await,
            Err(Error::Fenced { run: "u-1".into() })
        );
        store.append_step("u-1", fresh, &step(0)).await.unwrap();
    }

    #[tokio::test]
    async fn clones_share_state_and_changes() {
        let store = MemoryStore::default();
        let clone = store.clone();
        let mut changes = clone.subscribe();
        let key = ObjectKey::new("p", Kind::Agent, "a");
        store
            .create(&key, json!({"metadata": {"name": "a"}}))
            .await
            .unwrap();
        assert_eq!(clone.get(&key).await.unwrap().version, 1);
        assert_eq!(changes.try_recv(), Ok(Change::Written(key, 1)));
    }
}

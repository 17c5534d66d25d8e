//! Shared harness of the engine tests: an engine over the in-memory store (or another), the
//! recording sandbox, the scripted model and a manual clock, and a store wrapper that crashes
//! at a chosen write.

#![allow(dead_code)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use jiff::Timestamp;
use nodus_core::catalog::{Catalog, Family};
use nodus_core::engine::{Config, Deps, Engine};
use nodus_core::journal::{Completion, Step};
use nodus_core::model::{self, ModelClient, ModelRequest, ModelResponse};
use nodus_core::resource::{Agent, AgentRun, AgentRunSpec, AgentSpec, Kind};
use nodus_core::router::FixedRouter;
use nodus_core::runner::{Runner, RunnerConfig, RunnerHandle};
use nodus_core::secret::StaticSecrets;
use nodus_core::store::{
    self, Change, Delivery, Fence, InboxMessage, Lease, ObjectKey, Page, Position, Record,
    RunRewrite, Selector, Store,
};
use nodus_core::testing::{Drive, ManualClock, RecordingSandbox};
use nodus_llm::{Reply, ScriptedModel};
use nodus_store::MemoryStore;
use serde_json::Value;

pub mod hooked;

pub const PROJECT: &str = "default";

/// Where a crash happens relative to the chosen journal write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CrashMode {
    /// The write is durable, then the process dies.
    AfterWrite,
    /// The process dies before the write is durable.
    BeforeWrite,
}

/// Which writes a [`CrashingStore`] counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Counted {
    /// Journal writes only (appending a step, recording its outcome).
    Journal,
    /// Every write: documents (run status, ledger reserve and settle, the kept working
    /// directory, ...), journal, leases, messages, rewrites.
    Every,
}

/// A write a [`CrashingStore`] saw: what it was, and whether it recorded a model call's reply
/// (a crash before that write loses a call the model answered).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    pub what: String,
    pub model_reply: bool,
}

/// A store that dies at its n-th counted write (counting from 1), like a process killed at
/// that boundary: every later call fails too, until a new "process" opens the inner store.
pub struct CrashingStore {
    inner: Arc<dyn Store>,
    counted: Counted,
    writes: Mutex<Vec<Seen>>,
    crash_at: usize,
    mode: CrashMode,
    dead: Mutex<bool>,
    /// When set, the next write it names pauses there.
    pause: Mutex<Option<Pause>>,
}

/// A pause at the next write whose description contains `matching`: before the write is
/// made or once it is made, the write tells `made` and waits for `go_on`.
struct Pause {
    matching: String,
    after: bool,
    made: Arc<tokio::sync::Notify>,
    go_on: Arc<tokio::sync::Notify>,
}

impl Pause {
    async fn hold(&self) {
        self.made.notify_one();
        self.go_on.notified().await;
    }
}

impl CrashingStore {
    /// Dies at the `crash_at`-th journal write.
    pub fn new(inner: impl Store + 'static, crash_at: usize, mode: CrashMode) -> Self {
        Self::counting(Arc::new(inner), Counted::Journal, crash_at, mode)
    }

    /// Dies at the `crash_at`-th write of any kind (`usize::MAX`: never, to count them).
    pub fn at_any_write(inner: Arc<dyn Store>, crash_at: usize, mode: CrashMode) -> Self {
        Self::counting(inner, Counted::Every, crash_at, mode)
    }

    fn counting(inner: Arc<dyn Store>, counted: Counted, crash_at: usize, mode: CrashMode) -> Self {
        CrashingStore {
            inner,
            counted,
            writes: Mutex::new(Vec::new()),
            crash_at,
            mode,
            dead: Mutex::new(false),
            pause: Mutex::new(None),
        }
    }

    /// Pauses the next claim after it is made (holding the lease): the first `Notify` is told
    /// when it is, and the claim returns once the second is.
    pub fn pause_after_next_claim(&self) -> (Arc<tokio::sync::Notify>, Arc<tokio::sync::Notify>) {
        self.pause_at("claim ", true)
    }

    /// Pauses the next write whose description (as [`CrashingStore::writes`] lists them, e.g.
    /// `append step 15 (SandboxDeletion)`) contains `matching`, before it is made: the first
    /// `Notify` is told when it is reached, and the write is made once the second is.
    pub fn pause_before_next(
        &self,
        matching: &str,
    ) -> (Arc<tokio::sync::Notify>, Arc<tokio::sync::Notify>) {
        self.pause_at(matching, false)
    }

    fn pause_at(
        &self,
        matching: &str,
        after: bool,
    ) -> (Arc<tokio::sync::Notify>, Arc<tokio::sync::Notify>) {
        let pause = Pause {
            matching: matching.to_string(),
            after,
            made: Arc::default(),
            go_on: Arc::default(),
        };
        let notifies = (pause.made.clone(), pause.go_on.clone());
        *self.pause.lock().expect("lock") = Some(pause);
        notifies
    }

    /// The pause set for the write described `what`, taken (it pauses one write).
    fn take_pause(&self, what: &str) -> Option<Pause> {
        let mut pause = self.pause.lock().expect("lock");
        if pause.as_ref().is_some_and(|p| what.contains(&p.matching)) {
            return pause.take();
        }
        None
    }

    fn crashed() -> store::Error {
        store::Error::Corrupt("simulated crash".to_string())
    }

    fn check_alive(&self) -> Result<(), store::Error> {
        if *self.dead.lock().expect("lock") {
            return Err(Self::crashed());
        }
        Ok(())
    }

    /// Count a write (a journal write when `journal`); says whether to die after writing, or
    /// fails when the process dies before it.
    fn write(&self, journal: bool, seen: Seen) -> Result<bool, store::Error> {
        self.check_alive()?;
        if !journal && self.counted == Counted::Journal {
            return Ok(false);
        }
        let n = {
            let mut writes = self.writes.lock().expect("lock");
            writes.push(seen);
            writes.len()
        };
        if n != self.crash_at {
            return Ok(false);
        }
        *self.dead.lock().expect("lock") = true;
        match self.mode {
            CrashMode::BeforeWrite => Err(Self::crashed()),
            CrashMode::AfterWrite => Ok(true),
        }
    }

    /// Runs `write` on the inner store unless the process died before it, and dies after it
    /// when this is the chosen write; pauses before or after it when a pause names it.
    async fn writing<T>(
        &self,
        journal: bool,
        seen: impl FnOnce() -> Seen,
        write: impl std::future::Future<Output = Result<T, store::Error>>,
    ) -> Result<T, store::Error> {
        let seen = seen();
        let pause = self.take_pause(&seen.what);
        let die_after = self.write(journal, seen)?;
        if let Some(pause) = pause.as_ref().filter(|p| !p.after) {
            pause.hold().await;
        }
        let written = write.await?;
        if let Some(pause) = pause.as_ref().filter(|p| p.after) {
            pause.hold().await;
        }
        if die_after {
            return Err(Self::crashed());
        }
        Ok(written)
    }

    pub fn journal_writes(&self) -> usize {
        self.writes.lock().expect("lock").len()
    }

    /// The counted writes so far, in order.
    pub fn writes(&self) -> Vec<Seen> {
        self.writes.lock().expect("lock").clone()
    }
}

fn seen(what: String) -> Seen {
    Seen {
        what,
        model_reply: false,
    }
}

#[async_trait]
impl Store for CrashingStore {
    async fn create(&self, key: &ObjectKey, document: Value) -> Result<Record, store::Error> {
        let what = || seen(format!("create {key}"));
        self.writing(false, what, self.inner.create(key, document))
            .await
    }
    async fn create_batch_within(
        &self,
        items: Vec<(ObjectKey, Value)>,
        key: Option<&str>,
        caps: &[store::MemberCap],
    ) -> Result<Vec<Record>, store::Error> {
        let what = || seen(format!("create a batch of {}", items.len()));
        let write = self.inner.create_batch_within(items.clone(), key, caps);
        self.writing(false, what, write).await
    }
    async fn get(&self, key: &ObjectKey) -> Result<Record, store::Error> {
        self.check_alive()?;
        self.inner.get(key).await
    }
    async fn list(
        &self,
        project: &str,
        kind: Kind,
        selector: &Selector,
    ) -> Result<Vec<Record>, store::Error> {
        self.check_alive()?;
        self.inner.list(project, kind, selector).await
    }
    async fn list_page(
        &self,
        project: &str,
        kind: Kind,
        selector: &Selector,
        after: Option<store::Position>,
        limit: std::num::NonZeroUsize,
    ) -> Result<store::Page, store::Error> {
        self.check_alive()?;
        self.inner
            .list_page(project, kind, selector, after, limit)
            .await
    }
    async fn list_sparse_known(
        &self,
        project: &str,
        kind: Kind,
        selector: &Selector,
        paths: &[&str],
        known: &std::collections::HashMap<String, store::Seen>,
    ) -> Result<Vec<store::Sparse>, store::Error> {
        self.check_alive()?;
        self.inner
            .list_sparse_known(project, kind, selector, paths, known)
            .await
    }
    async fn projects(&self) -> Result<Vec<String>, store::Error> {
        self.check_alive()?;
        self.inner.projects().await
    }
    async fn update(
        &self,
        key: &ObjectKey,
        version: u64,
        document: Value,
    ) -> Result<Record, store::Error> {
        let what = || seen(format!("update {key}"));
        self.writing(false, what, self.inner.update(key, version, document))
            .await
    }
    async fn modify(&self, key: &ObjectKey, edit: store::Edit) -> Result<Record, store::Error> {
        let what = || seen(format!("modify {key}"));
        self.writing(false, what, self.inner.modify(key, edit))
            .await
    }
    async fn delete(&self, key: &ObjectKey) -> Result<(), store::Error> {
        let what = || seen(format!("delete {key}"));
        self.writing(false, what, self.inner.delete(key)).await
    }
    async fn claim(&self, run: &str, lease: &Lease) -> Result<Fence, store::Error> {
        let what = || seen(format!("claim {run}"));
        self.writing(false, what, self.inner.claim(run, lease))
            .await
    }
    async fn renew(&self, run: &str, fence: Fence, lease: &Lease) -> Result<(), store::Error> {
        let what = || seen(format!("renew {run}"));
        self.writing(false, what, self.inner.renew(run, fence, lease))
            .await
    }
    async fn release(&self, run: &str, fence: Fence) -> Result<(), store::Error> {
        let what = || seen(format!("release {run}"));
        self.writing(false, what, self.inner.release(run, fence))
            .await
    }
    async fn append_step(&self, run: &str, fence: Fence, step: &Step) -> Result<(), store::Error> {
        let what = || {
            seen(format!(
                "append step {} ({:?})",
                step.seq,
                step.intent.kind()
            ))
        };
        self.writing(true, what, self.inner.append_step(run, fence, step))
            .await
    }
    async fn complete_step(
        &self,
        run: &str,
        fence: Fence,
        seq: u32,
        completion: &Completion,
    ) -> Result<(), store::Error> {
        let what = || Seen {
            what: format!("complete step {seq}"),
            model_reply: matches!(
                completion.outcome,
                nodus_core::journal::Outcome::ModelReplied { .. }
            ),
        };
        self.writing(
            true,
            what,
            self.inner.complete_step(run, fence, seq, completion),
        )
        .await
    }
    async fn journal(&self, run: &str) -> Result<Vec<Step>, store::Error> {
        self.check_alive()?;
        self.inner.journal(run).await
    }
    async fn post_message(
        &self,
        run: &ObjectKey,
        version: u64,
        key: Option<&str>,
        payload: &str,
        at: Timestamp,
    ) -> Result<Delivery, store::Error> {
        let what = || seen(format!("post a message to {run}"));
        self.writing(
            false,
            what,
            self.inner.post_message(run, version, key, payload, at),
        )
        .await
    }
    async fn inbox(&self, run: &str) -> Result<Vec<InboxMessage>, store::Error> {
        self.check_alive()?;
        self.inner.inbox(run).await
    }
    async fn rewrite_run(&self, rewrite: RunRewrite) -> Result<Record, store::Error> {
        let what = || seen(format!("rewrite {}", rewrite.run));
        let what = what();
        self.writing(false, || what, self.inner.rewrite_run(rewrite))
            .await
    }
    async fn put_snapshot(
        &self,
        run_uid: &str,
        seq: u32,
        snapshot: &nodus_core::snapshot::Stored,
        blobs: &[nodus_core::snapshot::Blob],
    ) -> Result<(), store::Error> {
        let what = || seen(format!("snapshot {run_uid}/{seq}"));
        self.writing(
            false,
            what,
            self.inner.put_snapshot(run_uid, seq, snapshot, blobs),
        )
        .await
    }
    async fn missing_blobs(&self, digests: &[String]) -> Result<Vec<String>, store::Error> {
        self.inner.missing_blobs(digests).await
    }
    async fn snapshots(
        &self,
        run_uid: &str,
    ) -> Result<Vec<(u32, nodus_core::snapshot::Snapshot)>, store::Error> {
        self.inner.snapshots(run_uid).await
    }
    async fn blob(&self, digest: &str) -> Result<Option<Vec<u8>>, store::Error> {
        self.inner.blob(digest).await
    }
    async fn delete_snapshots(&self, run_uid: &str) -> Result<(), store::Error> {
        let what = || seen(format!("delete snapshots {run_uid}"));
        self.writing(false, what, self.inner.delete_snapshots(run_uid))
            .await
    }
    async fn blob_bytes(&self) -> Result<u64, store::Error> {
        self.inner.blob_bytes().await
    }
    fn subscribe(&self) -> tokio::sync::broadcast::Receiver<Change> {
        self.inner.subscribe()
    }
}

/// A model that counts its calls, and can be told to answer the next calls with errors.
pub struct CountingModel {
    inner: ScriptedModel,
    calls: AtomicUsize,
    failures: Mutex<Vec<model::Error>>,
}

impl CountingModel {
    pub fn new(script: Vec<Reply>) -> Self {
        CountingModel {
            inner: ScriptedModel::new(script),
            calls: AtomicUsize::new(0),
            failures: Mutex::new(Vec::new()),
        }
    }
    pub fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }
    pub fn fail_next(&self, error: model::Error) {
        self.failures.lock().expect("lock").push(error);
    }
}

#[async_trait]
impl ModelClient for CountingModel {
    async fn complete(&self, request: &ModelRequest) -> Result<ModelResponse, model::Error> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let failure = {
            let mut failures = self.failures.lock().expect("lock");
            (!failures.is_empty()).then(|| failures.remove(0))
        };
        if let Some(error) = failure {
            return Err(error);
        }
        self.inner.complete(request).await
    }
}

pub fn catalog() -> Catalog {
    nodus_llm::default_catalog().expect("the shipped catalog")
}

pub struct World {
    /// The in-memory store of [`World::new`] (empty in a world [`World::over_store`] another).
    pub memory: MemoryStore,
    /// The store every engine of this world uses.
    pub store: Arc<dyn Store>,
    pub sandbox: Arc<RecordingSandbox>,
    pub model: Arc<CountingModel>,
    pub clock: Arc<ManualClock>,
    pub secrets: StaticSecrets,
}

/// An in-memory store that counts its reads of documents: how many, the documents (or
/// counts) they answered, and the reads of each document by its key.
#[derive(Default)]
pub struct CountingStore {
    /// The store counted: reading it directly counts nothing.
    pub inner: MemoryStore,
    reads: AtomicUsize,
    documents: AtomicUsize,
    /// The reads of a run's working-directory snapshots.
    snapshot_reads: AtomicUsize,
    gets: Mutex<std::collections::HashMap<ObjectKey, usize>>,
    /// The listings of whole documents (`list`, `list_page`), by kind.
    whole_listings: Mutex<std::collections::HashMap<Kind, usize>>,
    journal_writes: Mutex<Vec<String>>,
    /// An edit made to a document just before the next outcome written with a model call
    /// after it ([`CountingStore::edit_before_next_call`]).
    before_next_call: Mutex<Option<(ObjectKey, store::Edit)>>,
}

impl CountingStore {
    fn read(&self, documents: usize) {
        self.reads.fetch_add(1, Ordering::SeqCst);
        self.documents.fetch_add(documents, Ordering::SeqCst);
    }

    fn listed_whole(&self, kind: Kind) {
        *self
            .whole_listings
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(kind)
            .or_default() += 1;
    }

    /// How many times the documents of `kind` were listed whole so far (not sparse).
    pub fn whole_listings_of(&self, kind: Kind) -> usize {
        let listings = self
            .whole_listings
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        listings.get(&kind).copied().unwrap_or(0)
    }

    /// (reads, documents read) so far.
    pub fn seen(&self) -> (usize, usize) {
        (
            self.reads.load(Ordering::SeqCst),
            self.documents.load(Ordering::SeqCst),
        )
    }

    /// How many times a run's working-directory snapshots were read so far.
    pub fn snapshot_reads(&self) -> usize {
        self.snapshot_reads.load(Ordering::SeqCst)
    }

    /// How many times the documents of `kind` were read by key so far.
    pub fn gets_of_kind(&self, kind: Kind) -> usize {
        let gets = self.gets.lock().unwrap_or_else(|e| e.into_inner());
        gets.iter()
            .filter(|(key, _)| key.kind == kind)
            .map(|(_, count)| count)
            .sum()
    }

    /// The journal writes and document updates so far, each as one store call: `append 3`,
    /// `complete 3`, `complete 3 then append 4` (an outcome written with the next step), or
    /// `update <key>` (a document replaced by itself, not with an outcome).
    pub fn journal_writes(&self) -> Vec<String> {
        self.journal_writes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Edit `key` (as another writer would, meanwhile) just before the next outcome that is
    /// written with a model call after it.
    pub fn edit_before_next_call(&self, key: ObjectKey, edit: store::Edit) {
        *self
            .before_next_call
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = Some((key, edit));
    }

    fn journal_write(&self, write: String) {
        self.journal_writes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(write);
    }

    /// How many times `key` was read so far.
    pub fn gets_of(&self, key: &ObjectKey) -> usize {
        let gets = self.gets.lock().unwrap_or_else(|e| e.into_inner());
        gets.get(key).copied().unwrap_or(0)
    }
}

#[async_trait]
impl Store for CountingStore {
    async fn create(&self, key: &ObjectKey, document: Value) -> Result<Record, store::Error> {
        self.inner.create(key, document).await
    }
    async fn create_batch_within(
        &self,
        items: Vec<(ObjectKey, Value)>,
        idempotency_key: Option<&str>,
        caps: &[store::MemberCap],
    ) -> Result<Vec<Record>, store::Error> {
        self.inner
            .create_batch_within(items, idempotency_key, caps)
            .await
    }
    async fn get(&self, key: &ObjectKey) -> Result<Record, store::Error> {
        self.read(1);
        *self
            .gets
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(key.clone())
            .or_default() += 1;
        self.inner.get(key).await
    }
    async fn list(
        &self,
        project: &str,
        kind: Kind,
        selector: &Selector,
    ) -> Result<Vec<Record>, store::Error> {
        let listed = self.inner.list(project, kind, selector).await?;
        self.read(listed.len());
        self.listed_whole(kind);
        Ok(listed)
    }
    async fn list_page(
        &self,
        project: &str,
        kind: Kind,
        selector: &Selector,
        after: Option<Position>,
        limit: std::num::NonZeroUsize,
    ) -> Result<Page, store::Error> {
        let page = self
            .inner
            .list_page(project, kind, selector, after, limit)
            .await?;
        self.read(page.records.len());
        self.listed_whole(kind);
        Ok(page)
    }
    async fn list_sparse(
        &self,
        project: &str,
        kind: Kind,
        selector: &Selector,
        paths: &[&str],
    ) -> Result<Vec<Record>, store::Error> {
        let listed = self
            .inner
            .list_sparse(project, kind, selector, paths)
            .await?;
        self.read(listed.len());
        Ok(listed)
    }
    /// Counted as one read of every document listed, known or read (a known document is one
    /// the listing still walked).
    async fn list_sparse_known(
        &self,
        project: &str,
        kind: Kind,
        selector: &Selector,
        paths: &[&str],
        known: &std::collections::HashMap<String, store::Seen>,
    ) -> Result<Vec<store::Sparse>, store::Error> {
        let listed = self
            .inner
            .list_sparse_known(project, kind, selector, paths, known)
            .await?;
        self.read(listed.len());
        Ok(listed)
    }
    async fn projects(&self) -> Result<Vec<String>, store::Error> {
        self.inner.projects().await
    }
    async fn group_phases(
        &self,
        project: &str,
        group: &str,
    ) -> Result<Vec<(Option<String>, u64)>, store::Error> {
        let phases = self.inner.group_phases(project, group).await?;
        self.read(phases.len());
        Ok(phases)
    }
    async fn update(
        &self,
        key: &ObjectKey,
        version: u64,
        document: Value,
    ) -> Result<Record, store::Error> {
        self.journal_write(format!("update {key}"));
        self.inner.update(key, version, document).await
    }
    async fn modify(&self, key: &ObjectKey, edit: store::Edit) -> Result<Record, store::Error> {
        self.inner.modify(key, edit).await
    }
    async fn delete(&self, key: &ObjectKey) -> Result<(), store::Error> {
        self.inner.delete(key).await
    }
    async fn claim(&self, run: &str, lease: &Lease) -> Result<Fence, store::Error> {
        self.inner.claim(run, lease).await
    }
    async fn renew(&self, run: &str, fence: Fence, lease: &Lease) -> Result<(), store::Error> {
        self.inner.renew(run, fence, lease).await
    }
    async fn release(&self, run: &str, fence: Fence) -> Result<(), store::Error> {
        self.inner.release(run, fence).await
    }
    async fn append_step(&self, run: &str, fence: Fence, step: &Step) -> Result<(), store::Error> {
        self.journal_write(format!("append {}", step.seq));
        self.inner.append_step(run, fence, step).await
    }
    async fn complete_step(
        &self,
        run: &str,
        fence: Fence,
        seq: u32,
        completion: &Completion,
    ) -> Result<(), store::Error> {
        self.journal_write(format!("complete {seq}"));
        self.inner.complete_step(run, fence, seq, completion).await
    }
    async fn complete_step_with(
        &self,
        run: &str,
        fence: Fence,
        seq: u32,
        completion: &Completion,
        with: store::WithOutcome<'_>,
    ) -> Result<store::OutcomeWritten, store::Error> {
        self.journal_write(match with.next {
            Some(next) => format!("complete {seq} then append {}", next.seq),
            None => format!("complete {seq}"),
        });
        let edit = with
            .next
            .filter(|next| matches!(next.intent, nodus_core::journal::Intent::CallModel { .. }))
            .and_then(|_| {
                self.before_next_call
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .take()
            });
        if let Some((key, edit)) = edit {
            self.inner.modify(&key, edit).await?;
        }
        self.inner
            .complete_step_with(run, fence, seq, completion, with)
            .await
    }
    async fn journal(&self, run: &str) -> Result<Vec<Step>, store::Error> {
        self.inner.journal(run).await
    }
    async fn post_message(
        &self,
        run: &ObjectKey,
        expected_version: u64,
        key: Option<&str>,
        payload: &str,
        at: jiff::Timestamp,
    ) -> Result<Delivery, store::Error> {
        self.inner
            .post_message(run, expected_version, key, payload, at)
            .await
    }
    async fn inbox(&self, run: &str) -> Result<Vec<InboxMessage>, store::Error> {
        self.inner.inbox(run).await
    }
    async fn rewrite_run(&self, rewrite: RunRewrite) -> Result<Record, store::Error> {
        self.inner.rewrite_run(rewrite).await
    }
    async fn put_snapshot(
        &self,
        run_uid: &str,
        seq: u32,
        snapshot: &nodus_core::snapshot::Stored,
        blobs: &[nodus_core::snapshot::Blob],
    ) -> Result<(), store::Error> {
        self.inner.put_snapshot(run_uid, seq, snapshot, blobs).await
    }
    async fn missing_blobs(&self, digests: &[String]) -> Result<Vec<String>, store::Error> {
        self.inner.missing_blobs(digests).await
    }
    async fn snapshots(
        &self,
        run_uid: &str,
    ) -> Result<Vec<(u32, nodus_core::snapshot::Snapshot)>, store::Error> {
        self.snapshot_reads.fetch_add(1, Ordering::SeqCst);
        self.inner.snapshots(run_uid).await
    }
    async fn blob(&self, digest: &str) -> Result<Option<Vec<u8>>, store::Error> {
        self.inner.blob(digest).await
    }
    async fn delete_snapshots(&self, run_uid: &str) -> Result<(), store::Error> {
        self.inner.delete_snapshots(run_uid).await
    }
    async fn blob_bytes(&self) -> Result<u64, store::Error> {
        self.inner.blob_bytes().await
    }
    fn subscribe(&self) -> tokio::sync::broadcast::Receiver<Change> {
        self.inner.subscribe()
    }
}

/// The phase of run `name` of [`PROJECT`] as stored now.
pub async fn run_phase(engine: &Engine, name: &str) -> Option<nodus_core::lifecycle::RunPhase> {
    let run = engine.get_run(PROJECT, name).await.expect("the run");
    run.status.phase
}

impl World {
    pub fn new(script: Vec<Reply>) -> Self {
        let memory = MemoryStore::new();
        Self::over(script, Arc::new(memory.clone()), memory)
    }

    /// A world whose engines use `store`.
    pub fn over_store(script: Vec<Reply>, store: Arc<dyn Store>) -> Self {
        Self::over(script, store, MemoryStore::new())
    }

    fn over(script: Vec<Reply>, store: Arc<dyn Store>, memory: MemoryStore) -> Self {
        World {
            memory,
            store,
            sandbox: Arc::new(RecordingSandbox::new()),
            model: Arc::new(CountingModel::new(script)),
            clock: Arc::new(ManualClock::default()),
            secrets: StaticSecrets::new(),
        }
    }

    /// An engine (a "process") over this world's store.
    pub fn engine(&self) -> Engine {
        self.engine_over(self.store.clone())
    }

    /// The runner of `engine`, as a server or an embedder starts it: groups reconcile at
    /// once (no settling pause).
    pub fn runner(&self, engine: &Engine) -> RunnerHandle {
        let mut config = RunnerConfig::default();
        config.group_settle = std::time::Duration::ZERO;
        Runner::start(engine.clone(), config)
    }

    pub fn engine_over(&self, store: Arc<dyn Store>) -> Engine {
        self.engine_with_ledger(store, Arc::new(nodus_core::ledger::Unmetered))
    }

    /// An engine over `store` that reserves and settles credits in it (`StoreLedger`).
    pub fn metered_engine_over(&self, store: Arc<dyn Store>) -> Engine {
        let ledger = nodus_core::ledger::StoreLedger::new(store.clone());
        self.engine_with_ledger(store, Arc::new(ledger))
    }

    pub fn engine_with_ledger(
        &self,
        store: Arc<dyn Store>,
        ledger: Arc<dyn nodus_core::ledger::Ledger>,
    ) -> Engine {
        self.engine_with(store, self.sandbox.clone(), ledger)
    }

    /// An engine over this world's store with another sandbox.
    pub fn engine_with_sandbox(&self, sandbox: Arc<dyn nodus_core::sandbox::Sandbox>) -> Engine {
        self.engine_with(
            self.store.clone(),
            sandbox,
            Arc::new(nodus_core::ledger::Unmetered),
        )
    }

    pub fn engine_with(
        &self,
        store: Arc<dyn Store>,
        sandbox: Arc<dyn nodus_core::sandbox::Sandbox>,
        ledger: Arc<dyn nodus_core::ledger::Ledger>,
    ) -> Engine {
        let router = Arc::new(FixedRouter(Family::Haiku));
        self.engine_priced(store, sandbox, ledger, catalog(), router, engine_config())
    }

    /// An engine over this world's store with another sandbox and these settings.
    pub fn engine_configured(
        &self,
        sandbox: Arc<dyn nodus_core::sandbox::Sandbox>,
        config: Config,
    ) -> Engine {
        let (ledger, router) = (
            Arc::new(nodus_core::ledger::Unmetered),
            Arc::new(FixedRouter(Family::Haiku)),
        );
        self.engine_priced(
            self.store.clone(),
            sandbox,
            ledger,
            catalog(),
            router,
            config,
        )
    }

    /// A metered engine over `store` (credits reserved and settled in it) that routes with
    /// `router`.
    pub fn metered_engine_routed(
        &self,
        store: Arc<dyn Store>,
        router: Arc<dyn nodus_core::router::Router>,
    ) -> Engine {
        let ledger = Arc::new(nodus_core::ledger::StoreLedger::new(store.clone()));
        self.engine_priced(
            store,
            self.sandbox.clone(),
            ledger,
            catalog(),
            router,
            engine_config(),
        )
    }

    /// An engine over `store` whose model calls cost nothing (a server without a platform
    /// key prices them so): they reserve nothing.
    pub fn free_engine_over(&self, store: Arc<dyn Store>) -> Engine {
        self.engine_priced(
            store,
            self.sandbox.clone(),
            Arc::new(nodus_core::ledger::Unmetered),
            nodus_llm::offline_catalog(&catalog()),
            Arc::new(FixedRouter(Family::Haiku)),
            engine_config(),
        )
    }

    fn engine_priced(
        &self,
        store: Arc<dyn Store>,
        sandbox: Arc<dyn nodus_core::sandbox::Sandbox>,
        ledger: Arc<dyn nodus_core::ledger::Ledger>,
        catalog: Catalog,
        router: Arc<dyn nodus_core::router::Router>,
        config: Config,
    ) -> Engine {
        Engine::new(
            Deps {
                store,
                sandbox,
                model: self.model.clone(),
                router,
                clock: self.clock.clone(),
                catalog: Arc::new(catalog),
                secrets: Arc::new(self.secrets.clone()),
                ledger,
                spans: Arc::new(nodus_core::telemetry::NoSpans),
            },
            config,
        )
    }
}

/// The engine's settings in these tests: the defaults, with BYOK keys under the name the
/// reference server's users write (`ANTHROPIC_API_KEY`: BYOK calls go to Anthropic there).
pub fn engine_config() -> Config {
    let mut config = Config::default();
    config.byok_secret_key = nodus_llm::anthropic::BYOK_SECRET_KEY.to_string();
    config
}

pub fn agent(name: &str, configure: impl FnOnce(&mut AgentSpec)) -> Agent {
    let mut spec = AgentSpec::new("You are careful. Use the shell to check your work.");
    configure(&mut spec);
    Agent::new(name, spec)
}

pub fn run(
    name: &str,
    agent: &str,
    input: &str,
    configure: impl FnOnce(&mut AgentRunSpec),
) -> AgentRun {
    let mut spec = AgentRunSpec::new(agent, input);
    configure(&mut spec);
    AgentRun::new(name, spec)
}

/// Apply the agent `helper` and create its run `name` with `input`.
pub async fn helper_run(
    engine: &Engine,
    name: &str,
    input: &str,
    configure: impl FnOnce(&mut AgentRunSpec),
) {
    engine
        .apply_agent(PROJECT, agent("helper", |_| {}))
        .await
        .expect("agent");
    engine
        .create_run(PROJECT, run(name, "helper", input, configure))
        .await
        .expect("run");
}

/// The keepAlive conversation `chat` of the agent `helper`, driven until it waits for a
/// message.
pub async fn waiting_chat(engine: &Engine) {
    helper_run(engine, "chat", "Summarize the logs", |s| {
        s.keep_alive = true
    })
    .await;
    let driven = engine.drive(PROJECT, "chat").await.expect("drive");
    assert!(
        matches!(
            driven,
            nodus_core::engine::Driven::Waiting {
                reason: nodus_core::lifecycle::WaitReason::AwaitingMessage,
                ..
            }
        ),
        "{driven:?}"
    );
}

/// Every model call of the journal cost at most what its step reserved (the worst case the
/// decider computed before the call), and at least one call was made; says which step if not.
pub fn assert_costs_within_reservations(journal: &[Step], context: &str) {
    use nodus_core::journal::{Intent, Outcome};
    let mut calls = 0;
    for step in journal {
        if let (
            Intent::CallModel { reserved_usd, .. },
            Some(Outcome::ModelReplied { cost_usd, .. }),
        ) = (&step.intent, step.outcome())
        {
            calls += 1;
            assert!(
                cost_usd <= reserved_usd,
                "{context}: step {} cost {cost_usd}, more than the {reserved_usd} it reserved",
                step.seq
            );
        }
    }
    assert!(calls > 0, "{context}: no model call was made");
}

/// The journal as JSON, for exact comparison.
pub fn journal_json(journal: &[Step]) -> Value {
    serde_json::to_value(journal).expect("journal serializes")
}

pub fn run_key(name: &str) -> ObjectKey {
    ObjectKey::new(PROJECT, Kind::AgentRun, name)
}

/// Apply the Environment `<name>@1.0.0`: one `test` split of `tasks` (id, prompt, the answer
/// expected), graded by exact match, its sandboxes started from `image` when given.
pub async fn apply_exact_environment(
    engine: &Engine,
    name: &str,
    image: Option<&str>,
    tasks: &[(&str, &str, &str)],
) {
    let tasks: Vec<Value> = tasks
        .iter()
        .map(|(id, prompt, expected)| {
            serde_json::json!({"id": id, "prompt": prompt, "hidden": {"expected": expected}})
        })
        .collect();
    let mut spec = serde_json::json!({
        "version": "1.0.0",
        "splits": {"test": {"tasks": tasks}},
        "grader": {"kind": "exact"}
    });
    if let Some(image) = image {
        spec["image"] = image.into();
    }
    let environment: nodus_core::resource::Environment =
        serde_json::from_value(serde_json::json!({
            "apiVersion": "nodus.dev/v1",
            "kind": "Environment",
            "metadata": {"name": name},
            "spec": spec,
        }))
        .expect("an Environment");
    engine
        .apply_environment(PROJECT, environment)
        .await
        .expect("environment");
}

/// An ordinary group of the agent `agent`, open to new members (not sealed), at most
/// `max_active` of them at a time, under `max_cost` when given.
pub fn open_group(
    agent: &str,
    max_active: u32,
    max_cost: Option<nodus_core::Usd>,
) -> nodus_core::resource::AgentGroupSpec {
    nodus_core::resource::AgentGroupSpec {
        agent: agent.to_owned(),
        limits: nodus_core::resource::GroupLimits {
            max_active,
            ..nodus_core::resource::GroupLimits::default()
        },
        max_cost_usd: max_cost,
        sealed: false,
        evaluation: None,
    }
}

/// An evaluation group of the agent `helper`: `evaluation` as its `spec.evaluation`, at most
/// `max_active` members at a time (the default without).
pub fn evaluation_group(
    evaluation: Value,
    max_active: Option<u32>,
) -> nodus_core::resource::AgentGroupSpec {
    let mut limits = nodus_core::resource::GroupLimits::default();
    if let Some(max_active) = max_active {
        limits.max_active = max_active;
    }
    nodus_core::resource::AgentGroupSpec {
        agent: "helper".to_owned(),
        limits,
        max_cost_usd: None,
        sealed: false,
        evaluation: Some(serde_json::from_value(evaluation).expect("an evaluation")),
    }
}

//! Admission of new runs to a group through the engine: it reads the same from the store
//! whether the group has ten members or a thousand (a store wrapper counts the reads and the
//! documents they return), and it keeps every rule (a taken task key, an unknown dependency,
//! `maxPending` counting only unfinished runs, a sealed group), here on SQLite, whose count of
//! a group's runs comes from its index.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use async_trait::async_trait;
use nodus_core::engine::{Engine, Error};
use nodus_core::group::AdmissionRefused;
use nodus_core::journal::{Completion, Step};
use nodus_core::lifecycle::RunPhase;
use nodus_core::resource::{AgentGroup, AgentGroupSpec, AgentRun, GroupLimits, Kind};
use nodus_core::store::{
    self, Change, Delivery, Fence, InboxMessage, Lease, ObjectKey, Page, Position, Record,
    RunRewrite, Selector, Store,
};
use nodus_store::MemoryStore;
use serde_json::Value;
use support::{PROJECT, World, agent, run};

/// A store that counts its reads of documents and the documents (or counts) they answer,
/// and its reads of agents.
struct CountingStore {
    inner: MemoryStore,
    reads: AtomicUsize,
    documents: AtomicUsize,
    agent_reads: AtomicUsize,
}

impl CountingStore {
    fn read(&self, documents: usize) {
        self.reads.fetch_add(1, Ordering::SeqCst);
        self.documents.fetch_add(documents, Ordering::SeqCst);
    }

    /// (reads, documents read) so far.
    fn seen(&self) -> (usize, usize) {
        (
            self.reads.load(Ordering::SeqCst),
            self.documents.load(Ordering::SeqCst),
        )
    }
}

#[async_trait]
impl Store for CountingStore {
    async fn create(&self, key: &ObjectKey, document: Value) -> Result<Record, store::Error> {
        self.inner.create(key, document).await
    }
    async fn create_batch(
        &self,
        items: Vec<(ObjectKey, Value)>,
        idempotency_key: Option<&str>,
    ) -> Result<Vec<Record>, store::Error> {
        self.inner.create_batch(items, idempotency_key).await
    }
    async fn get(&self, key: &ObjectKey) -> Result<Record, store::Error> {
        self.read(1);
        if key.kind == Kind::Agent {
            self.agent_reads.fetch_add(1, Ordering::SeqCst);
        }
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
        self.inner.append_step(run, fence, step).await
    }
    async fn complete_step(
        &self,
        run: &str,
        fence: Fence,
        seq: u32,
        completion: &Completion,
    ) -> Result<(), store::Error> {
        self.inner.complete_step(run, fence, seq, completion).await
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

fn group_spec() -> AgentGroupSpec {
    AgentGroupSpec {
        agent: "worker".to_string(),
        limits: GroupLimits::default(),
        max_cost_usd: None,
        sealed: false,
        evaluation: None,
    }
}

/// Task `key` of group `g`, depending on `deps`.
fn task(key: &str, deps: &[&str]) -> AgentRun {
    let mut r = run("", "worker", &format!("Run `echo {key}`."), |s| {
        s.group = Some("g".to_string());
        s.task_key = Some(key.to_string());
        s.depends_on = deps.iter().map(|d| (*d).to_string()).collect();
    });
    r.metadata.name = None;
    r
}

/// The store reads (and documents read) of creating task `t{i}` singly, depending on the one
/// before, and of a batch of ten more, each depending on one earlier task.
async fn reads_to_add(engine: &Engine, store: &CountingStore, i: usize) -> [(usize, usize); 2] {
    let before = store.seen();
    engine
        .create_run(PROJECT, task(&format!("t{i}"), &[&format!("t{}", i - 1)]))
        .await
        .expect("one more member");
    let single = store.seen();
    let batch = (1..=10)
        .map(|j| task(&format!("t{i}-{j}"), &[&format!("t{}", i - j)]))
        .collect();
    engine
        .create_runs(PROJECT, batch, None)
        .await
        .expect("a batch of members");
    let after = store.seen();
    [
        (single.0 - before.0, single.1 - before.1),
        (after.0 - single.0, after.1 - single.1),
    ]
}

#[tokio::test]
async fn adding_a_member_reads_the_same_at_a_thousand_members_as_at_ten() {
    let store = Arc::new(CountingStore {
        inner: MemoryStore::new(),
        reads: AtomicUsize::new(0),
        documents: AtomicUsize::new(0),
        agent_reads: AtomicUsize::new(0),
    });
    let world = World::over_store(Vec::new(), store.clone());
    let engine = world.engine();
    engine
        .apply_agent(PROJECT, agent("worker", |_| {}))
        .await
        .expect("agent");
    engine
        .apply_group(PROJECT, AgentGroup::new("g", group_spec()))
        .await
        .expect("group");
    engine
        .create_run(PROJECT, task("t0", &[]))
        .await
        .expect("the first member");
    let mut created = 1;
    while created < 10 {
        engine
            .create_run(PROJECT, task(&format!("t{created}"), &[]))
            .await
            .expect("a member");
        created += 1;
    }
    let at_ten = reads_to_add(&engine, &store, created).await;
    created += 1;
    // A thousand members, in batches.
    while created < 1_000 {
        let batch: Vec<AgentRun> = (created..(created + 100).min(1_000))
            .map(|i| task(&format!("t{i}"), &[]))
            .collect();
        created += batch.len();
        engine
            .create_runs(PROJECT, batch, None)
            .await
            .expect("members");
    }
    let agent_reads = store.agent_reads.load(Ordering::SeqCst);
    let at_a_thousand = reads_to_add(&engine, &store, created).await;
    assert_eq!(
        store.agent_reads.load(Ordering::SeqCst) - agent_reads,
        2,
        "a run alone and a batch of ten each read their agent once"
    );
    assert_eq!(
        at_ten, at_a_thousand,
        "(reads, documents read) adding a member singly and ten in a batch, at 10 members \
         and at 1,000"
    );
}

#[tokio::test]
async fn admission_keeps_every_rule_on_sqlite() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let sqlite = nodus_store::SqliteStore::open(dir.path().join("nodus.db"))
        .await
        .expect("open a SQLite store");
    let world = World::over_store(Vec::new(), Arc::new(sqlite));
    let engine = world.engine();
    engine
        .apply_agent(PROJECT, agent("worker", |_| {}))
        .await
        .expect("agent");
    let mut spec = group_spec();
    spec.limits.max_pending = 3;
    engine
        .apply_group(PROJECT, AgentGroup::new("g", spec.clone()))
        .await
        .expect("group");
    fn refused<T: std::fmt::Debug>(result: Result<T, Error>) -> AdmissionRefused {
        match result {
            Err(Error::Admission(refused)) => refused,
            other => panic!("not refused by admission: {other:?}"),
        }
    }
    engine
        .create_runs(PROJECT, vec![task("a", &[]), task("b", &["a"])], None)
        .await
        .expect("a, and b after it in the same batch");
    // A run outside the group with a task's name is not a task of it.
    engine
        .create_run(PROJECT, run("g-x", "worker", "Run `echo x`.", |_| {}))
        .await
        .expect("a run of no group");
    assert_eq!(
        refused(engine.create_run(PROJECT, task("c", &["x"])).await),
        AdmissionRefused::UnknownDependency("x".to_string())
    );
    assert_eq!(
        refused(engine.create_run(PROJECT, task("a", &[])).await),
        AdmissionRefused::DuplicateTaskKey("a".to_string())
    );
    assert_eq!(
        refused(
            engine
                .create_runs(PROJECT, vec![task("c", &[]), task("c2", &["c", "z"])], None)
                .await
        ),
        AdmissionRefused::UnknownDependency("z".to_string())
    );
    assert!(
        engine.get_run(PROJECT, "g-c").await.is_err(),
        "a refused batch writes nothing"
    );
    // Three unfinished members fill maxPending 3; a finished one does not count.
    engine
        .create_run(PROJECT, task("c", &[]))
        .await
        .expect("the third");
    assert_eq!(
        refused(engine.create_run(PROJECT, task("d", &[])).await),
        AdmissionRefused::TooManyPending { max_pending: 3 }
    );
    engine.cancel_run(PROJECT, "g-a").await.expect("cancel a");
    let a = engine.get_run(PROJECT, "g-a").await.expect("a");
    assert!(
        a.status.phase.is_some_and(RunPhase::is_finished),
        "{:?}",
        a.status.phase
    );
    engine
        .create_run(PROJECT, task("d", &["a"]))
        .await
        .expect("a finished member leaves room, and is still a task of the group");
    spec.sealed = true;
    engine
        .apply_group(PROJECT, AgentGroup::new("g", spec))
        .await
        .expect("seal");
    assert_eq!(
        refused(engine.create_run(PROJECT, task("e", &[])).await),
        AdmissionRefused::Sealed
    );
}

/// A run that joins a group whose slots are all held is created saying it waits for one
/// (`GroupWait`), so the group's reconcile has nothing to rewrite in it (its version stays);
/// one with room, or with a dependency, is created `Queued` for the reconcile to decide.
#[tokio::test]
async fn a_run_joining_a_full_group_is_created_waiting_for_a_slot() {
    use nodus_core::lifecycle::PendingReason;
    use nodus_core::testing::Drive as _;
    let dir = tempfile::tempdir().expect("a temporary directory");
    let sqlite = nodus_store::SqliteStore::open(dir.path().join("nodus.db"))
        .await
        .expect("open a SQLite store");
    let world = World::over_store(Vec::new(), Arc::new(sqlite));
    let engine = world.engine();
    engine
        .apply_agent(PROJECT, agent("worker", |_| {}))
        .await
        .expect("agent");
    let mut spec = group_spec();
    spec.limits.max_active = 1;
    engine
        .apply_group(PROJECT, AgentGroup::new("g", spec))
        .await
        .expect("group");
    let phase = |name: &'static str| {
        let engine = &engine;
        async move {
            engine
                .get_run(PROJECT, name)
                .await
                .expect("run")
                .status
                .phase
        }
    };
    engine.create_run(PROJECT, task("a", &[])).await.expect("a");
    assert_eq!(
        phase("g-a").await,
        Some(RunPhase::Pending(PendingReason::Queued)),
        "a free slot: the reconcile starts it"
    );
    engine
        .reconcile_group(PROJECT, "g")
        .await
        .expect("reconcile");
    assert_eq!(phase("g-a").await, Some(RunPhase::Running));
    engine
        .create_runs(PROJECT, vec![task("b", &[]), task("c", &["a"])], None)
        .await
        .expect("b, and c after a");
    assert_eq!(
        phase("g-b").await,
        Some(RunPhase::Pending(PendingReason::GroupWait)),
        "every slot held: b says so from the start"
    );
    assert_eq!(
        phase("g-c").await,
        Some(RunPhase::Pending(PendingReason::Queued)),
        "a dependency: the reconcile decides"
    );
    let version = |name: &'static str| {
        let engine = &engine;
        async move {
            engine
                .get_run(PROJECT, name)
                .await
                .expect("run")
                .metadata
                .resource_version
        }
    };
    let b_before = version("g-b").await;
    engine
        .reconcile_group(PROJECT, "g")
        .await
        .expect("reconcile");
    assert_eq!(version("g-b").await, b_before, "nothing rewritten in b");
    assert_eq!(
        phase("g-c").await,
        Some(RunPhase::Pending(PendingReason::DependencyWait))
    );
}

//! The run engine: creates runs, drives them through the decider, journals every effect,
//! and offers the operations people use on runs (messages, cancel, resolve) and groups.
//!
//! One shape for every entry point: read the documents, ask a pure function (the decider,
//! the group controller, the lifecycle) what to do, carry that out through the traits, and
//! write the result with the version that was read, so a concurrent change is never lost.

mod changes;
mod control;
mod documents;
mod environment;
mod error;
mod evaluation;
mod evaluation_network;
mod execute;
mod fork;
mod grader_sandbox;
mod group;
mod image;
mod kinds;
mod listings;
mod live;
mod resources;
mod results;
mod snapshots;
mod spans;
mod status;
mod typed;
mod workdir;
mod writers;
pub use workdir::{
    MAX_KEPT_WORKDIR_BYTES, MAX_STAGED_WORKDIR_BYTES, OutputWorkdir, STAGED_ENTRY_OVERHEAD,
    workdir_archive_key,
};

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use jiff::Timestamp;

pub use control::CANCEL_WAIT;
pub use error::{Error, Reason, Result};
pub use evaluation::{
    DEFAULT_EVALUATION_TIMEOUT, DEFAULT_GRADER_TIMEOUT, MAX_EVALUATION_GROUP_NAME,
};
pub use execute::Driven;
pub use fork::{AtStep, ForkRequest, last_good};
pub use kinds::{SpecRules, Writable};
pub use live::{FOLLOW_CAPACITY, MAX_CHUNK_BYTES, OutputChunk};
pub use results::{RESULT_NAMES, RunResult, RunResultInfo};
use typed::Versioned;

use crate::catalog::Catalog;
use crate::clock::Clock;
use crate::journal::{Completion, Step, StepKind, StepState};
use crate::lifecycle::{CancelReason, Cancelling, PendingReason, Resolution, Resolving, RunPhase};
use crate::model::ModelClient;
use crate::resource::{
    Access, Agent, AgentGroup, AgentRun, AgentState, CostStatus, Kind, NameOrInline, RunSnapshot,
};
use crate::router::Router;
use crate::sandbox::{Limits, Sandbox};
use crate::secret::Secrets;
use crate::store::{ObjectKey, Record, Store};
use crate::validate::{self, Invalid};

pub use crate::resource::TEMPLATE_PROJECT;

/// The most runs one batch creates.
pub const MAX_BATCH: usize = 100;

/// What the runs one request creates share while they are prepared: their admissions to
/// their groups so far, the images they pinned and the agents they name (each reference
/// resolved once: the runs of a batch snapshot one version of their agent).
#[derive(Default)]
struct Batch {
    admissions: group::Admissions,
    images: image::PinnedImages,
    /// The agents its runs name, each resolved once ([`Engine::resolve_agent`]), by reference.
    agents: std::collections::HashMap<String, (String, Versioned<crate::resource::AgentSpec>)>,
}

/// What the engine works through.
#[derive(Clone)]
pub struct Deps {
    /// Durable state.
    pub store: Arc<dyn Store>,
    /// Where commands run.
    pub sandbox: Arc<dyn Sandbox>,
    /// The model provider.
    pub model: Arc<dyn ModelClient>,
    /// Picks a family per prompt.
    pub router: Arc<dyn Router>,
    /// Time.
    pub clock: Arc<dyn Clock>,
    /// Models and prices.
    pub catalog: Arc<Catalog>,
    /// Keys of BYOK agents.
    pub secrets: Arc<dyn Secrets>,
    /// Project credits that platform calls reserve against.
    pub ledger: Arc<dyn crate::ledger::Ledger>,
    /// Where ended steps', runs' and groups' spans go (never blocking a run).
    pub spans: Arc<dyn crate::telemetry::SpanSink>,
}

impl Deps {
    /// Dependencies over these backends — where commands run, the model and its catalog
    /// (what each family's model is and costs) — with the defaults for the rest: a new
    /// in-memory store ([`MemoryStore`](crate::store::MemoryStore): nothing survives the
    /// process), the system clock, routing every prompt to the fallback family
    /// ([`Family::FALLBACK`], within what an agent allows), no Secrets, and no metering of
    /// credits (for embedders who bill elsewhere; runs' own caps still hold). Change any with
    /// [`DepsBuilder`]'s methods, then [`DepsBuilder::build`].
    ///
    /// [`Family::FALLBACK`]: crate::catalog::Family::FALLBACK
    pub fn builder(
        sandbox: Arc<dyn Sandbox>,
        model: Arc<dyn ModelClient>,
        catalog: Catalog,
    ) -> DepsBuilder {
        DepsBuilder {
            deps: Deps {
                store: Arc::new(crate::store::MemoryStore::new()),
                sandbox,
                model,
                router: Arc::new(crate::router::FixedRouter(crate::catalog::Family::FALLBACK)),
                clock: Arc::new(crate::clock::SystemClock),
                catalog: Arc::new(catalog),
                secrets: Arc::new(crate::secret::StaticSecrets::new()),
                ledger: Arc::new(crate::ledger::Unmetered),
                spans: Arc::new(crate::telemetry::NoSpans),
            },
        }
    }
}

/// [`Deps`] being put together: [`Deps::builder`] with the backends, these methods for the
/// rest.
#[must_use]
pub struct DepsBuilder {
    deps: Deps,
}

impl DepsBuilder {
    /// Durable state (a SQLite or Postgres store of nodus-store, or a [`Store`] of your own).
    pub fn store(mut self, store: Arc<dyn Store>) -> Self {
        self.deps.store = store;
        self
    }

    /// Picks a family per prompt.
    pub fn router(mut self, router: Arc<dyn Router>) -> Self {
        self.deps.router = router;
        self
    }

    /// Time (in tests, the `ManualClock` of the `test-util` feature).
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.deps.clock = clock;
        self
    }

    /// Keys of BYOK agents, and the sealing of Secret resources.
    pub fn secrets(mut self, secrets: Arc<dyn Secrets>) -> Self {
        self.deps.secrets = secrets;
        self
    }

    /// Project credits that platform calls reserve against
    /// ([`StoreLedger`](crate::ledger::StoreLedger) keeps them in the store).
    pub fn ledger(mut self, ledger: Arc<dyn crate::ledger::Ledger>) -> Self {
        self.deps.ledger = ledger;
        self
    }

    /// Where spans go (`telemetry::NoSpans` by default).
    pub fn spans(mut self, spans: Arc<dyn crate::telemetry::SpanSink>) -> Self {
        self.deps.spans = spans;
        self
    }

    /// The dependencies.
    pub fn build(self) -> Deps {
        self.deps
    }
}

/// Settings an operator can change.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Config {
    /// Sandbox limits of every run.
    pub limits: Limits,
    /// The image of container sandboxes when a run names none.
    pub default_image: Option<String>,
    /// How long the router may take before the fallback answers.
    pub router_timeout: Duration,
    /// Attempts at an effect that failed in a way a retry can fix (a store or sandbox
    /// backend restarting, a platform model call that may not have arrived).
    pub attempts: u32,
    /// Pause between those attempts.
    pub retry_pause: Duration,
    /// This replica's stable name, under which it claims runs (a restarted replica with the
    /// same name takes its runs back at once); the process's own name when `None`.
    pub replica: Option<String>,
    /// How long deleting a started run waits for the [`Runner`](crate::runner::Runner) to
    /// end it (stop its command, delete its sandbox) before it refuses with `RunBusy`.
    pub delete_wait: Duration,
    /// The post-run actions installed (`agents.noop` by default).
    pub actions: crate::postrun::Registry,
    /// The internal networks the operator lets egress reach (`--egress-allow`): a run's
    /// `spec.network.allow` cidr must lie inside one of them.
    pub egress_allow: Vec<crate::egress::Cidr>,
    /// The egress proxy's journal, when this process has one: `status.egress` waits for it.
    pub egress_journal: Option<crate::egress_log::EgressJournal>,
    /// Working-directory snapshots after each command step, within this budget of new
    /// content per run (so that runs can be forked from those steps); `None` takes none.
    pub snapshots: Option<crate::snapshot::Budget>,
    /// The key of a BYOK agent's Secret that holds its provider key
    /// ([`DEFAULT_BYOK_SECRET_KEY`] by default). Which key a provider's credential goes by is
    /// the model client's to know: the reference server sets the one of nodus-llm's client.
    pub byok_secret_key: String,
}

/// [`Config::byok_secret_key`] when the embedder names none.
pub const DEFAULT_BYOK_SECRET_KEY: &str = "API_KEY";

impl Default for Config {
    fn default() -> Self {
        Config {
            limits: Limits::default(),
            default_image: None,
            router_timeout: Duration::from_millis(500),
            attempts: 3,
            retry_pause: Duration::from_millis(200),
            replica: None,
            delete_wait: Duration::from_secs(30),
            actions: crate::postrun::Registry::new(),
            egress_allow: Vec::new(),
            egress_journal: None,
            snapshots: Some(crate::snapshot::Budget::default()),
            byok_secret_key: DEFAULT_BYOK_SECRET_KEY.to_string(),
        }
    }
}

/// A step as listings show it.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct StepView {
    /// Position in the journal.
    pub seq: u32,
    /// What kind of effect.
    pub kind: StepKind,
    /// Its state.
    pub state: StepState,
    /// When it started.
    #[cfg_attr(feature = "openapi", schemars(with = "crate::schema::DateTime"))]
    pub started_at: Timestamp,
    /// When it finished.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[cfg_attr(
        feature = "openapi",
        schemars(with = "Option<crate::schema::DateTime>")
    )]
    pub finished_at: Option<Timestamp>,
    /// One line about it.
    pub summary: String,
    /// Copied from the run this one was forked from: never carried out by this run, its
    /// cost the source's. Absent when false (so not required in the document).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    #[cfg_attr(feature = "openapi", schemars(default))]
    pub inherited: bool,
    /// A command step's snapshot of the working directory after it: whether the run can be
    /// forked from the step.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<SnapshotView>,
}

/// What a step's listing says about its snapshot.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct SnapshotView {
    /// Whether a fork can start after the step.
    pub forkable: bool,
    /// The manifest's digest (the same for the same files, modes and contents).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
    /// Entries of the working directory.
    pub entries: u64,
    /// Bytes of its files.
    pub bytes: u64,
    /// Why the step cannot be forked from.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

impl SnapshotView {
    fn of(snapshot: &crate::snapshot::Snapshot) -> Self {
        let manifest = snapshot.manifest();
        SnapshotView {
            forkable: manifest.is_some(),
            digest: manifest.map(crate::snapshot::Manifest::digest),
            entries: manifest.map_or(0, |m| m.entries.len() as u64),
            bytes: manifest.map_or(0, crate::snapshot::Manifest::content_bytes),
            reason: snapshot.not_forkable(),
        }
    }
}

/// The durable run engine. Cheap to clone.
#[derive(Clone)]
pub struct Engine {
    deps: Deps,
    config: Arc<Config>,
    uid_counter: Arc<AtomicU64>,
    /// The runs someone follows on this process, for their commands' output.
    followed: Arc<live::Followed>,
    /// The runs a task of this process writes now (a drive or a resolution).
    writers: Arc<writers::KeyedLocks>,
    /// One batch of new runs at a time joins each group in this process (key
    /// `project/group`): the admission it checks (the group's unfinished runs under
    /// `maxPending`, its task keys) holds until its runs are created, and a change of the
    /// group's spec waits for it (`Writable::hold_to_replace`). Across replicas the store
    /// keeps what can be broken there: the group is read again and `maxPending` checked in the
    /// batch's own write ([`Store::create_batch_within`]: a group sealed, cancelled or deleted
    /// since refuses it), and its unique names refuse a second run of the same task.
    joining: Arc<writers::KeyedLocks>,
    /// The replica drains: drives stop between steps and hand their runs over.
    draining: Arc<std::sync::atomic::AtomicBool>,
    /// The leases this process's drives hold now, by run uid, so that a drain can hand over
    /// those of drives it had to stop.
    held:
        Arc<std::sync::Mutex<std::collections::HashMap<String, (ObjectKey, crate::store::Fence)>>>,
    /// Each driven run's last working-directory snapshot.
    last_snapshots: Arc<snapshots::LastSnapshots>,
    /// Changes of single documents, for the tasks waiting on one.
    key_changes: Arc<changes::KeyChanges>,
    /// Each group's members as its last reconcile listed them.
    member_listings: Arc<listings::Listings<(Record, crate::group::Member)>>,
    /// Each evaluation group's cases as its last reconcile listed them.
    case_listings: Arc<listings::Listings<(String, crate::evaluation::CaseOutcome)>>,
}

impl Engine {
    /// An engine over these backends.
    pub fn new(deps: Deps, config: Config) -> Self {
        Engine {
            deps,
            config: Arc::new(config),
            uid_counter: Arc::new(AtomicU64::new(0)),
            followed: Arc::default(),
            writers: Arc::default(),
            joining: Arc::default(),
            draining: Arc::default(),
            held: Arc::default(),
            last_snapshots: Arc::default(),
            key_changes: Arc::default(),
            member_listings: Arc::default(),
            case_listings: Arc::default(),
        }
    }

    /// Drain: from now on a drive stops before its next step, gives its run's lease up and
    /// answers [`Driven::Released`], so that another replica continues the run at once. A
    /// step under way (a running command) finishes first.
    pub fn start_draining(&self) {
        self.draining.store(true, Ordering::SeqCst);
    }

    /// Whether this engine drains ([`Engine::start_draining`]).
    pub fn draining(&self) -> bool {
        self.draining.load(Ordering::SeqCst)
    }

    /// Give up every lease a drive of this process still holds: for a drain whose grace
    /// period ended with drives still under way, once those drives were stopped (their
    /// commands killed). A run whose command was cut shows an interrupted step to whoever
    /// claims it next, which parks it as any interrupted command. Returns how many were given
    /// up.
    pub async fn release_held(&self) -> usize {
        let held: Vec<(String, (ObjectKey, crate::store::Fence))> = match self.held.lock() {
            Ok(mut held) => held.drain().collect(),
            Err(poisoned) => poisoned.into_inner().drain().collect(),
        };
        let mut released = 0;
        for (uid, (key, fence)) in held {
            match self.deps.store.release(&uid, fence).await {
                Ok(()) => {
                    released += 1;
                    self.handed_over(&key).await;
                }
                Err(error) => {
                    tracing::warn!(run = %uid, error = %error, "cannot hand the run's lease over");
                }
            }
        }
        released
    }

    /// Note a lease a drive holds (`Some`) or gave up (`None`).
    fn hold(&self, uid: &str, held_as: Option<(ObjectKey, crate::store::Fence)>) {
        let mut held = match self.held.lock() {
            Ok(held) => held,
            Err(poisoned) => poisoned.into_inner(),
        };
        match held_as {
            Some(held_as) => held.insert(uid.to_string(), held_as),
            None => held.remove(uid),
        };
    }

    /// A draining replica gave a run's lease up: clear `status.replica`, a write every
    /// replica sees as a change of the run, so one with room claims it at once (instead of
    /// at its next retry).
    async fn handed_over(&self, key: &ObjectKey) {
        let edit: crate::store::Edit = Box::new(|document: &serde_json::Value| {
            let replica = document.pointer("/status/replica")?;
            if replica.is_null() {
                return None;
            }
            let mut document = document.clone();
            if let Some(status) = document
                .get_mut("status")
                .and_then(serde_json::Value::as_object_mut)
            {
                status.remove("replica");
            }
            Some(document)
        });
        match self.deps.store.modify(key, edit).await {
            Ok(_) | Err(crate::store::Error::NotFound(_)) => {}
            Err(error) => {
                tracing::warn!(run = %key, error = %error, "cannot say the run was handed over");
            }
        }
    }

    /// How many tasks of this process wait to write the run `uid` ([`crate::testing::Drive`]:
    /// compiled wherever that is, or its `writers_waiting` would call itself).
    #[cfg(any(test, feature = "test-util"))]
    pub(crate) fn writers_waiting(&self, uid: &str) -> usize {
        self.writers.waiting(uid)
    }

    /// How many batches of this process wait to join `group` of `project` ([`Drive`]'s, as
    /// [`writers_waiting`](Engine::writers_waiting)).
    ///
    /// [`Drive`]: crate::testing::Drive
    #[cfg(any(test, feature = "test-util"))]
    pub(crate) fn joining_waiting(&self, project: &str, group: &str) -> usize {
        self.joining.waiting(&joining_key(project, group))
    }

    /// A lease request by this replica, from now.
    fn lease(&self) -> crate::store::Lease {
        let owner = match &self.config.replica {
            Some(name) => name.clone(),
            None => crate::store::process_owner().to_string(),
        };
        crate::store::Lease::new(
            owner,
            self.deps.clock.now(),
            crate::store::Lease::DEFAULT_DURATION,
        )
    }

    /// The store.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.deps.store
    }

    /// The clock.
    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.deps.clock
    }

    fn new_uid(&self) -> String {
        let count = self.uid_counter.fetch_add(1, Ordering::Relaxed);
        format!(
            "{:x}{:04x}",
            self.deps.clock.now().as_nanosecond(),
            count & 0xffff
        )
    }

    fn stamp<S: crate::resource::Spec>(
        &self,
        project: &str,
        object: &mut crate::resource::Object<S>,
    ) {
        object.metadata.project = Some(project.to_string());
        object.metadata.uid = Some(self.new_uid());
        object.metadata.creation_timestamp = Some(self.deps.clock.now());
        object.metadata.resource_version = None;
    }

    /// Create an agent, or replace the spec of an existing one (its runs keep their
    /// snapshot): [`Engine::apply`].
    pub async fn apply_agent(&self, project: &str, agent: Agent) -> Result<Agent> {
        self.apply(project, agent).await
    }

    /// The checks of an agent beyond its own rules: every post-run action it declares is
    /// installed.
    pub fn check_agent(&self, agent: &crate::resource::AgentSpec) -> Result<()> {
        Ok(self
            .config
            .actions
            .check_declared(agent.post_run_actions.as_deref())?)
    }

    /// The post-run actions installed.
    pub fn post_run_actions(&self) -> Vec<crate::postrun::ActionInfo> {
        self.config.actions.list()
    }

    /// Read a run.
    pub async fn get_run(&self, project: &str, name: &str) -> Result<AgentRun> {
        Ok(self.read_run(project, name).await?.object)
    }

    async fn read_run(
        &self,
        project: &str,
        name: &str,
    ) -> Result<Versioned<crate::resource::AgentRunSpec>> {
        self.read(project, name).await
    }

    /// Resolve `spec.agent` (`name`, or `project/name` for a shared template).
    async fn resolve_agent(
        &self,
        project: &str,
        reference: &str,
    ) -> Result<(String, Versioned<crate::resource::AgentSpec>)> {
        let (agent_project, name) = reference.split_once('/').unwrap_or((project, reference));
        let not_found = || -> Error {
            Invalid {
                field: "spec.agent".to_string(),
                rule: "must name an existing agent".to_string(),
                value: reference.to_string(),
            }
            .into()
        };
        // Only the project's own agents and the shared templates: another project's agent is
        // answered as missing, so a run learns nothing of it (not even that it exists).
        if agent_project != project && agent_project != TEMPLATE_PROJECT {
            return Err(not_found());
        }
        let key = ObjectKey::new(agent_project, Kind::Agent, name);
        let found = match self.deps.store.get(&key).await {
            // A bare name that the project lacks may name a ready-made template.
            Err(crate::store::Error::NotFound(_)) if !reference.contains('/') => {
                let template = ObjectKey::new(TEMPLATE_PROJECT, Kind::Agent, name);
                self.deps
                    .store
                    .get(&template)
                    .await
                    .map(|r| (TEMPLATE_PROJECT, r))
            }
            other => other.map(|r| (agent_project, r)),
        };
        match found {
            Ok((agent_project, record)) => {
                Ok((format!("{agent_project}/{name}"), typed::decode(record)?))
            }
            Err(crate::store::Error::NotFound(_)) => Err(not_found()),
            Err(e) => Err(e.into()),
        }
    }

    /// Create a run: validate it, resolve and snapshot its agent, admit it to its group.
    /// A bad reference fails this request, not the run; nothing is written on error. The
    /// [`Runner`](crate::runner::Runner) starts it (a run of a group once its group admits it).
    pub async fn create_run(&self, project: &str, run: AgentRun) -> Result<AgentRun> {
        self.create(project, run).await
    }

    /// Store a new run that its kind's rules passed: [`Writable::insert`] of an AgentRun.
    async fn insert_run(&self, project: &str, run: AgentRun) -> Result<AgentRun> {
        let _joining = self
            .join_groups(project, run.spec.group.iter().map(String::as_str))
            .await;
        let mut batch = Batch::default();
        let (key, document, input) = self.prepare_run(project, run, &[], &mut batch).await?;
        let caps = group::member_caps(project, &batch.admissions);
        if input.is_none() && caps.is_empty() {
            let record = self.deps.store.create(&key, document).await?;
            return Ok(typed::decode(record)?.object);
        }
        // The staged working directory is written with the run, all or nothing; a member of a
        // group within the group's cap.
        let records = self
            .deps
            .store
            .create_batch_within(
                std::iter::once((key, document)).chain(input).collect(),
                None,
                &caps,
            )
            .await
            .map_err(group::refused_by_store)?;
        let record = records
            .into_iter()
            .find(|record| record.key.kind == Kind::AgentRun)
            .ok_or_else(|| Error::Corrupt {
                key: "the batch".to_string(),
                message: "the store did not answer with the run".to_string(),
            })?;
        Ok(typed::decode(record)?.object)
    }

    /// Hold each of `groups` of `project` for one batch of new runs to join (in name order, so
    /// that two batches never wait for each other), as the engine's `joining` locks say.
    async fn join_groups<'g>(
        &self,
        project: &str,
        groups: impl Iterator<Item = &'g str>,
    ) -> Vec<tokio::sync::OwnedMutexGuard<()>> {
        let groups: std::collections::BTreeSet<&str> = groups.collect();
        let mut held = Vec::with_capacity(groups.len());
        for group in groups {
            held.push(self.joining.lock(&joining_key(project, group)).await);
        }
        held
    }

    /// Create up to [`MAX_BATCH`] runs in list order, all or nothing. With an idempotency
    /// key, a repeat of the same runs returns the first call's runs, and other runs under the
    /// same key are refused. An error names the item (`items[3].spec…`).
    pub async fn create_runs(
        &self,
        project: &str,
        runs: Vec<AgentRun>,
        idempotency_key: Option<&str>,
    ) -> Result<Vec<AgentRun>> {
        if runs.len() > MAX_BATCH {
            return Err(Invalid::new(
                "items",
                format!("a batch holds at most {MAX_BATCH} runs"),
                runs.len().to_string(),
            )
            .into());
        }
        let request = batch_digest(&runs);
        if let Some(key) = idempotency_key {
            validate::check_message_key(key)
                .map_err(|e| Invalid::new("Idempotency-Key", e.rule, e.value))?;
            if let Some(first) = self.batch_record(project, key, &request).await? {
                return Ok(first);
            }
        }
        let _joining = self
            .join_groups(project, runs.iter().filter_map(|r| r.spec.group.as_deref()))
            .await;
        let mut items = Vec::with_capacity(runs.len() + 1);
        let mut earlier: Vec<AgentRun> = Vec::new();
        let mut batch = Batch::default();
        for (index, mut run) in runs.into_iter().enumerate() {
            run.prepare();
            let prepared = match run.check(self, project) {
                Ok(()) => self.prepare_run(project, run, &earlier, &mut batch).await,
                Err(error) => Err(error),
            };
            match prepared {
                Ok((key, document, input)) => {
                    items.extend(input);
                    earlier.push(
                        typed::decode(Record {
                            key: key.clone(),
                            version: 0,
                            document: document.clone(),
                        })?
                        .object,
                    );
                    items.push((key, document));
                }
                Err(Error::Invalid(invalid)) => {
                    return Err(Invalid::new(
                        format!("items[{index}].{}", invalid.field),
                        invalid.rule,
                        invalid.value,
                    )
                    .into());
                }
                Err(other) => return Err(other),
            }
        }
        let names: Vec<&str> = earlier.iter().map(|r| r.name()).collect();
        if let Some(key) = idempotency_key {
            // The record of the batch is written in the same all-or-nothing batch, so a repeat
            // finds either the whole batch or nothing of it.
            items.push((
                ObjectKey::new(project, Kind::BatchRecord, key),
                serde_json::json!({ "runs": names, "request": request }),
            ));
        }
        let caps = group::member_caps(project, &batch.admissions);
        let records = self
            .deps
            .store
            .create_batch_within(items, idempotency_key, &caps)
            .await
            .map_err(group::refused_by_store)?;
        // A batch under the same key that was being written at the same time as this one: the
        // store answered with that batch, which is a repeat only if it asked for these runs.
        if let Some(key) = idempotency_key
            && let Some(record) = records.iter().find(|r| r.key.kind == Kind::BatchRecord)
        {
            check_repeat(&record.document, &request, key)?;
        }
        records
            .into_iter()
            .filter(|record| record.key.kind == Kind::AgentRun)
            .map(|record| typed::decode(record).map(|v| v.object))
            .collect()
    }

    /// The runs of an earlier batch with this idempotency key, as they are now; refused when
    /// that batch asked for other runs (`request` is [`batch_digest`] of this one).
    async fn batch_record(
        &self,
        project: &str,
        key: &str,
        request: &str,
    ) -> Result<Option<Vec<AgentRun>>> {
        let record = match self
            .deps
            .store
            .get(&ObjectKey::new(project, Kind::BatchRecord, key))
            .await
        {
            Ok(record) => record,
            Err(crate::store::Error::NotFound(_)) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        check_repeat(&record.document, request, key)?;
        let names: Vec<String> =
            serde_json::from_value(record.document["runs"].clone()).map_err(|e| {
                Error::Corrupt {
                    key: record.key.to_string(),
                    message: e.to_string(),
                }
            })?;
        let mut runs = Vec::with_capacity(names.len());
        for name in names {
            match self.get_run(project, &name).await {
                Ok(run) => runs.push(run),
                // A run of the batch deleted since is left out.
                Err(Error::NotFound { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(Some(runs))
    }

    /// Check what a run refers to (its kind's own rules passed) and build the document to
    /// store; `earlier` are runs of the same batch, whose admissions and pinned images
    /// `batch` holds.
    async fn prepare_run(
        &self,
        project: &str,
        mut run: AgentRun,
        earlier: &[AgentRun],
        batch: &mut Batch,
    ) -> Result<(
        ObjectKey,
        serde_json::Value,
        Option<(ObjectKey, serde_json::Value)>,
    )> {
        if let Some(fork_of) = &run.spec.fork_of {
            self.check_fork(project, fork_of).await?;
        }
        if earlier.iter().any(|e| e.name() == run.name()) {
            return Err(Invalid::new(
                "metadata.name",
                "must be unique in the batch",
                format!("{:?}", run.name()),
            )
            .into());
        }
        // A stored agent (its reference and version are kept), or one written inline (only
        // its spec is kept: it is never stored as an Agent).
        let (agent_ref, agent_revision, agent) = match &run.spec.agent {
            NameOrInline::Name(reference) => {
                let (agent_ref, agent) = match batch.agents.get(reference) {
                    Some(resolved) => resolved.clone(),
                    None => {
                        let resolved = self.resolve_agent(project, reference).await?;
                        batch.agents.insert(reference.clone(), resolved.clone());
                        resolved
                    }
                };
                (
                    Some(agent_ref),
                    Some(agent.version.to_string()),
                    agent.object.spec,
                )
            }
            NameOrInline::Inline(spec) => (None, None, (**spec).clone()),
        };
        let action = self.config.actions.choose(
            agent.post_run_actions.as_deref(),
            matches!(run.spec.agent, NameOrInline::Inline(_)),
            run.spec.post_run_action.as_ref(),
        )?;
        if let Some(image) = &run.spec.image
            && !self.deps.sandbox.supports_image()
        {
            return Err(Invalid::new(
                "spec.image",
                "cannot be honoured by this server's sandbox backend, which runs commands on \
                 the host's file system and not in an image (only the docker sandbox runs \
                 images): remove spec.image or use a server with --sandbox docker",
                format!("{image:?}"),
            )
            .into());
        }
        // The Secret values the run reads (its environment's, its action's), pinned now.
        let mut pinned = crate::secret::PinnedSecrets::new();
        let environment = self
            .resolve_environment(project, &run.spec, &agent, &mut pinned)
            .await?;
        self.pin_action_secrets(project, &action, &mut pinned)
            .await?;
        if let Some(schema) = &agent.context_schema {
            validate::check_context(schema, run.spec.context.as_ref())?;
        }
        let input = match &run.spec.workdir {
            Some(workdir) => Some(self.snapshot_workdir(project, workdir).await?),
            None => None,
        };
        if agent.state == AgentState::Stopped {
            return Err(Error::AgentStopped {
                agent: run.spec.agent.name().unwrap_or("inline").to_string(),
            });
        }
        let Some(prompt) = crate::decide::chosen_prompt(&run.spec, &agent) else {
            return Err(Invalid::new(
                "spec.input",
                "is required when the agent has no defaultInput",
                "nothing",
            )
            .into());
        };
        validate::check_message("spec.input", prompt)?;
        let byok = agent.model.access == Access::Byok;
        if byok {
            let secret = agent.model.api_key_secret.clone().unwrap_or_default();
            if self
                .deps
                .secrets
                .lookup(project, &secret, &self.config.byok_secret_key)
                .await
                .is_none()
            {
                return Err(Invalid::new(
                    "spec.model.apiKeySecret",
                    format!(
                        "must name a Secret of this project holding {}",
                        self.config.byok_secret_key
                    ),
                    format!("{secret:?}"),
                )
                .into());
            }
        }
        // Last, as it may pull an image: what the run's sandbox runs, pinned now.
        let image_digest = self
            .pin_image(run.spec.image.as_deref(), &mut batch.images)
            .await?;
        let pending = match run.spec.group.clone() {
            Some(group) => {
                self.admit_to_group(project, &group, &run, &mut batch.admissions)
                    .await?
            }
            None => PendingReason::Queued,
        };
        self.stamp(project, &mut run);
        run.status = Default::default();
        run.status.phase = Some(RunPhase::Pending(pending));
        run.status.cost = CostStatus {
            total_usd: crate::money::Usd::ZERO,
            limit_usd: (!byok).then_some(agent.per_run_max_cost_usd),
        };
        run.status.snapshot = Some(RunSnapshot {
            agent_ref,
            agent_revision,
            agent,
            workdir: input.as_ref().map(|input| input.snapshot.clone()),
            environment,
            // agents.noop does nothing: no step is journaled for it.
            post_run_action: (action.kind != crate::postrun::NOOP).then_some(
                crate::resource::PostRunAction {
                    kind: action.kind,
                    config: Some(action.config),
                },
            ),
            image_digest,
        });
        let key = ObjectKey::new(project, Kind::AgentRun, run.name());
        let document = typed::encode(&key, &run)?;
        let private = self
            .private_document(input.as_ref(), &pinned)?
            .map(|private| (workdir_archive_key(&key), private));
        Ok((key, document, private))
    }

    /// The full answer of the run's last answered turn.
    pub async fn answer(&self, project: &str, name: &str) -> Result<Option<String>> {
        let run = self.read_run(project, name).await?;
        self.answer_of(&run.object).await
    }

    /// [`answer`](Engine::answer) of a run already read: its journal is read, not the run.
    pub(crate) async fn answer_of(&self, run: &AgentRun) -> Result<Option<String>> {
        let journal = self.deps.store.journal(run_uid(run)).await?;
        Ok(crate::replay::Replay::of(&journal).answer())
    }

    /// What the run did, in order.
    pub async fn steps(&self, project: &str, name: &str) -> Result<Vec<StepView>> {
        let run = self.read_run(project, name).await?;
        let interrupted = run.object.status.steps_interrupted();
        let journal = self.deps.store.journal(run_uid(&run.object)).await?;
        let snapshots: std::collections::BTreeMap<u32, crate::snapshot::Snapshot> = self
            .deps
            .store
            .snapshots(run_uid(&run.object))
            .await?
            .into_iter()
            .collect();
        let inherited = |seq: u32| {
            run.object
                .spec
                .fork_of
                .as_ref()
                .is_some_and(|fork| seq <= fork.step)
        };
        Ok(journal
            .iter()
            .map(|step| {
                let mut view = view(step, interrupted, inherited(step.seq));
                view.snapshot = snapshots.get(&step.seq).map(SnapshotView::of);
                view
            })
            .collect())
    }

    /// The run's journal, with full payloads.
    pub async fn journal(&self, project: &str, name: &str) -> Result<Vec<Step>> {
        let run = self.read_run(project, name).await?;
        Ok(self.deps.store.journal(run_uid(&run.object)).await?)
    }

    /// Mark a run as to be cancelled (`reason`); returns false when it had finished.
    async fn request_cancel(
        &self,
        project: &str,
        name: &str,
        reason: CancelReason,
    ) -> Result<bool> {
        loop {
            let mut run = self.read_run(project, name).await?;
            let phase = run.object.status.current_phase();
            let undriven = match phase.cancelling(reason)? {
                Cancelling::Finished => return Ok(false),
                Cancelling::Now(cancelled) => {
                    run.object.status.phase = Some(cancelled);
                    run.object.status.completion_time = Some(self.deps.clock.now());
                    true
                }
                Cancelling::Flagged => {
                    run.object.status.cancel_requested = Some(reason);
                    false
                }
            };
            let key = ObjectKey::new(project, Kind::AgentRun, name);
            match self
                .deps
                .store
                .update(&key, run.version, typed::encode(&key, &run.object)?)
                .await
            {
                Err(crate::store::Error::Conflict { .. }) => continue,
                Err(e) => return Err(e.into()),
                Ok(_) => {
                    if undriven {
                        // Cancelled before it started: no drive ends it, this write did.
                        self.undriven_run_ended(project, &run.object).await;
                    }
                    return Ok(true);
                }
            }
        }
    }

    /// Resolve a run parked on an uncertain step: carry the step out again, record it as
    /// failed and continue, or cancel the run. This records the resolution; the
    /// [`Runner`](crate::runner::Runner) drives the run on.
    pub async fn resolve(&self, project: &str, name: &str, resolution: Resolution) -> Result<()> {
        let resolving = |run: &Versioned<crate::resource::AgentRunSpec>| {
            run.object
                .status
                .current_phase()
                .resolving(resolution)
                .map_err(|refused| Error::NotParked {
                    run: name.to_string(),
                    phase: refused.from,
                })
        };
        let first = self.read_run(project, name).await?;
        resolving(&first)?;
        // The runner may be looking at the parked run right now (it does after each change):
        // wait for it, then read the run again, as it may have moved on meanwhile.
        let uid = run_uid(&first.object).to_string();
        let _writing = self.writers.lock(&uid).await;
        let mut run = self.read_run(project, name).await?;
        let resolving = resolving(&run)?;
        let lease = self.lease();
        let fence = self.deps.store.claim(&uid, &lease).await?;
        let journal = self.deps.store.journal(&uid).await?;
        if let Some((step, outcome)) = crate::journal::resolved(&journal, resolution) {
            let completion = Completion {
                finished_at: self.deps.clock.now(),
                outcome,
            };
            self.deps
                .store
                .complete_step(&uid, fence, step.seq, &completion)
                .await?;
            if let Some(ctx) = span_context(&self.deps, project, &run.object) {
                let mut step = step.clone();
                step.completion = Some(completion);
                let snapshot = run.object.status.snapshot.as_ref();
                let key = ObjectKey::new(project, Kind::AgentRun, name);
                let hidden = match snapshot {
                    Some(snapshot) => {
                        self.hidden_in_spans(&key, snapshot.environment.as_ref())
                            .await
                    }
                    None => None,
                };
                let system = snapshot
                    .map(|snapshot| crate::decide::system_prompt(project, &run.object, snapshot))
                    .unwrap_or_default();
                let disclosure = hidden.as_ref().map(|hidden| crate::telemetry::Disclosure {
                    system: &system,
                    sent: None,
                    hidden,
                });
                if let Some(span) = crate::telemetry::step_span(&ctx, &step, disclosure.as_ref()) {
                    self.deps.spans.export(span);
                }
            }
        }
        // Give the lease up at once: the runner drives the run on (under another replica's
        // name, perhaps).
        let _ = self.deps.store.release(&uid, fence).await;
        match resolving {
            Resolving::Resume(phase) => run.object.status.phase = Some(phase),
            Resolving::Flag(reason) => run.object.status.cancel_requested = Some(reason),
        }
        let key = ObjectKey::new(project, Kind::AgentRun, name);
        self.deps
            .store
            .update(&key, run.version, typed::encode(&key, &run.object)?)
            .await?;
        Ok(())
    }

    /// Create a group, or update a live one's spec (raising its cap, changing `maxActive`,
    /// sealing it), then reconcile it: [`Engine::apply`].
    pub async fn apply_group(&self, project: &str, group: AgentGroup) -> Result<AgentGroup> {
        self.apply(project, group).await
    }
}

/// What a run's spans say about it, or `None` when no spans are wanted.
fn span_context(
    deps: &Deps,
    project: &str,
    run: &AgentRun,
) -> Option<crate::telemetry::RunContext> {
    if !deps.spans.enabled() {
        return None;
    }
    let snapshot = run.status.snapshot.as_ref();
    let byok = snapshot.is_some_and(|s| s.agent.model.access == Access::Byok);
    let agent = snapshot
        .and_then(|s| s.agent_ref.as_deref())
        .map(|r| r.rsplit('/').next().unwrap_or(r).to_string())
        .or_else(|| run.spec.agent.name().map(str::to_string))
        .unwrap_or_else(|| "inline".to_string());
    Some(crate::telemetry::RunContext {
        uid: run_uid(run).to_string(),
        project: project.to_string(),
        run: run.name().to_string(),
        agent,
        provider: deps.model.provider_name(byok).to_string(),
    })
}

/// The key of `group` of `project` among the engine's `joining` locks.
fn joining_key(project: &str, group: &str) -> String {
    format!("{project}/{group}")
}

fn run_uid(run: &AgentRun) -> &str {
    run.metadata.uid.as_deref().unwrap_or_default()
}

fn view(step: &Step, interrupted: bool, inherited: bool) -> StepView {
    StepView {
        seq: step.seq,
        inherited,
        snapshot: None,
        kind: step.intent.kind(),
        state: step.state(interrupted),
        started_at: step.started_at,
        finished_at: step.completion.as_ref().map(|c| c.finished_at),
        summary: step.summary(),
    }
}

/// Refuses a batch record that was written for other runs than `request` asks for (records
/// written before digests were kept have none, and match any request).
fn check_repeat(record: &serde_json::Value, request: &str, key: &str) -> Result<()> {
    match record.get("request").and_then(|d| d.as_str()) {
        Some(first) if first != request => Err(Invalid::new(
            "Idempotency-Key",
            "was already used for a batch of other runs: a repeat must send the same runs, and \
             a new batch needs a new key",
            key,
        )
        .into()),
        _ => Ok(()),
    }
}

/// A fingerprint of the runs a batch asks for (SHA-256 of their JSON, hex), so that a repeat
/// under the same idempotency key can be told from another batch.
fn batch_digest(runs: &[AgentRun]) -> String {
    crate::digest::sha256_hex(&serde_json::to_vec(runs).unwrap_or_default())
}

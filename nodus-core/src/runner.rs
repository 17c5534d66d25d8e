//! The runner: the one scheduler of runs and groups, driven by the store's change notification.
//!
//! Its owner starts it over an [`Engine`] ([`Runner::start`]) and stops it
//! ([`RunnerHandle::shutdown`]); the server does nothing else with runs. One loop owns the work
//! queue. A change to a run queues the run; a change to a group, or a run of a group moving,
//! queues the group, except a write that the key's last drive or reconcile made itself (or
//! saw): a reconcile that writes its group's status does not wake another. Each key is worked
//! by at most one task at a time; a change that arrives while its key is being worked marks it
//! to be worked again. At most
//! [`RunnerConfig::max_concurrent`] runs are driven at once; the others queued wait in a list
//! of keys, with no task (at a restart every unfinished run is queued at once, and a task
//! each would be a peak of memory the allocator keeps). A waiting or parked run, and a run
//! still queued in its group, is queued again at its deadline; a change of a project's credits
//! or budget wakes the runs this runner left waiting for funds. At start every unfinished run
//! and every group of every project the store holds is queued, which is how runs resume after
//! a restart. With
//! [`RunnerConfig::retention`] it also sweeps the payloads of old runs.
//!
//! Every time it reads or waits for is the engine's [`Clock`]: with a manual clock, a deadline
//! comes when the test moves the clock past it.

use std::collections::{BTreeSet, HashMap, HashSet, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};

use crate::clock::Clock;
use crate::engine::{Driven, Engine, Error, Result};
use crate::ledger::SYSTEM_PROJECT;
use crate::lifecycle::{RunPhase, WaitReason};
use crate::resource::{AgentGroupSpec, AgentRun, Kind};
use crate::retention;
use crate::store::{Change, ObjectKey, Selector, Store};

/// How a runner works.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct RunnerConfig {
    /// The most runs driven at once (at least one).
    pub max_concurrent: usize,
    /// The longest a group's changes gather before it is reconciled (one reconcile lists every
    /// member's name and version, and reads those written since its last, so one per burst of
    /// changes instead of one per change); zero reconciles at once.
    /// Below it, a group's reconcile starts [`SETTLE_FACTOR`] times what its last reconcile's
    /// reads took (not the commits of its writes: waiting for the disk is no work to space
    /// out) after that reconcile ended, and at once when that is past: a large group's
    /// reconciles are spaced out, a small one, or one whose runs change seldom, follows its
    /// runs closely. 200 ms by
    /// default: a reconcile of a 1,000-run group on a busy machine takes tens of
    /// milliseconds, and under a shorter bound the reconciles of one large group were most
    /// of the server's CPU per run (BENCHMARKS.md, "CPU per run").
    pub group_settle: Duration,
    /// When a drive failed in a way that may pass (another replica holds the run, the store is
    /// restarting), how long until the run is looked at again.
    pub retry_after: Duration,
    /// Sweep the recorded payloads of runs that ended longer ago than this (at start, then
    /// every [`sweep_every`](RunnerConfig::sweep_every)); `None` keeps them.
    pub retention: Option<Duration>,
    /// How often the retention sweep runs.
    pub sweep_every: Duration,
}

impl Default for RunnerConfig {
    fn default() -> Self {
        RunnerConfig {
            max_concurrent: 256,
            group_settle: Duration::from_millis(200),
            retry_after: Duration::from_secs(2),
            retention: None,
            sweep_every: Duration::from_secs(3600),
        }
    }
}

/// A group's reconcile starts no sooner than this many times as long as its last reconcile's
/// reads and plan took (at most [`RunnerConfig::group_settle`]) after that one ended: a busy
/// group's reconciles read for at most about a ninth of the time. (With four, a fifth, a
/// 1,000-run group cost about 6 % more CPU per run, and took no less wall time: BENCHMARKS.md,
/// issue 34.)
pub const SETTLE_FACTOR: u32 = 8;

/// The scheduler of an engine's runs and groups. Built and started by [`Runner::start`].
pub struct Runner {
    engine: Engine,
    store: Arc<dyn Store>,
    clock: Arc<dyn Clock>,
    config: RunnerConfig,
    driving: watch::Sender<usize>,
    /// How many runs wait for a drive, beyond `max_concurrent` (the loop sends it).
    queued: watch::Sender<usize>,
}

/// A started runner: stop it with [`shutdown`](RunnerHandle::shutdown), or hand its runs over
/// first with [`drain`](RunnerHandle::drain).
pub struct RunnerHandle {
    engine: Engine,
    stop: watch::Sender<bool>,
    /// How many runs are driven now (the loop sends it; a drain waits for zero).
    driving: watch::Receiver<usize>,
    /// How many runs wait for a drive.
    queued: watch::Receiver<usize>,
    task: JoinHandle<()>,
    sweeper: Option<JoinHandle<()>>,
}

/// What a worker finished, and what it found should happen next.
struct Done {
    key: ObjectKey,
    /// What to work next: a group to reconcile because one of its runs moved, or an
    /// evaluation group's grading after its reconcile.
    group: Option<ObjectKey>,
    /// When to look at the run again by itself (its deadline, or a retry).
    wake_at: Option<Timestamp>,
    /// The run waits for its project's credits.
    awaiting_funds: bool,
    /// How long the group's reconcile took (a group's work only; `None` when it is gone).
    reconcile_took: Option<Duration>,
    /// The run's version as its drive wrote it last (the group's as its reconcile wrote or
    /// read it), when the drive saw none later: its changes up to that version need no drive
    /// (no reconcile) after it.
    own_write: Option<u64>,
}

impl Done {
    fn nothing(key: ObjectKey, group: Option<ObjectKey>) -> Self {
        Done {
            key,
            group,
            wake_at: None,
            awaiting_funds: false,
            reconcile_took: None,
            own_write: None,
        }
    }
}

#[derive(Default)]
struct Slot {
    /// A worker has the key, or it waits in [`Queue::ready`] for one.
    busy: bool,
    /// It changed while a worker had it: work it again after.
    dirty: bool,
    /// The highest version of it notified since the slot was taken (`u64::MAX` when it was
    /// queued for another reason than a change of its own): a drive that wrote that version
    /// last, or a later one, needs no other drive.
    notified: u64,
    /// It waits in [`Queue::ready`]: its drive has not begun, so a change needs nothing more.
    ready: bool,
}

/// The runner's working state inside its loop.
#[derive(Default)]
struct Queue {
    slots: HashMap<ObjectKey, Slot>,
    workers: JoinSet<Done>,
    /// The key of each worker, for one that panicked.
    working: HashMap<tokio::task::Id, ObjectKey>,
    /// Runs to drive, in the order they were queued, once fewer than
    /// [`RunnerConfig::max_concurrent`] are driven: a key each, no task.
    ready: VecDeque<ObjectKey>,
    /// Runs being driven now.
    driving: usize,
    /// Keys woken at a time of the clock, each at the earliest time asked for; one alarm
    /// for them all, so that a waiting run holds no task.
    wakes: HashMap<ObjectKey, Timestamp>,
    /// The same, in the order they come.
    by_time: BTreeSet<(Timestamp, ObjectKey)>,
    /// The runs this runner left waiting for funds, by project: a change of a project's
    /// credits wakes only those (every model call changes the account; looking for waiting
    /// runs in the store each time would read every run of the project).
    awaiting_funds: HashMap<String, HashSet<ObjectKey>>,
    /// Runs (groups) whose drive's (reconcile's) own last write is not notified yet, with its
    /// version: its notification (or an earlier one) wakes nothing. An entry lasts until that
    /// notification comes, or notifications are lost.
    own_writes: HashMap<ObjectKey, u64>,
    /// Each group's last reconcile, which sets how long its changes gather.
    last_reconcile: HashMap<ObjectKey, LastReconcile>,
}

/// What a group's last reconcile took (its reads and plan), and when it ended.
#[derive(Debug, Clone, Copy)]
struct LastReconcile {
    took: Duration,
    ended: Timestamp,
}

impl Runner {
    /// Start a runner over `engine` (its store, sandbox, model and clock). Changes written
    /// after this returns are seen; unfinished runs and groups already stored are resumed.
    pub fn start(engine: Engine, config: RunnerConfig) -> RunnerHandle {
        let store = engine.store().clone();
        let clock = engine.clock().clone();
        let changes = store.subscribe();
        // The engine's own watchers of single runs (a command watching for a cancellation)
        // are handed their changes by one task of its own, started with the runner's.
        engine.start_watching_changes();
        let (stop, stopped) = watch::channel(false);
        let sweeper = config.retention.map(|retention| {
            tokio::spawn(sweep_payloads(
                store.clone(),
                clock.clone(),
                retention,
                config.sweep_every,
            ))
        });
        let (driving_tx, driving) = watch::channel(0);
        let (queued_tx, queued) = watch::channel(0);
        let runner = Runner {
            engine: engine.clone(),
            store,
            clock,
            config,
            driving: driving_tx,
            queued: queued_tx,
        };
        let task = tokio::spawn(runner.run(changes, stopped));
        RunnerHandle {
            engine,
            stop,
            driving,
            queued,
            task,
            sweeper,
        }
    }

    async fn run(
        self,
        mut changes: tokio::sync::broadcast::Receiver<Change>,
        mut stopped: watch::Receiver<bool>,
    ) {
        let mut queue = Queue::default();
        for key in self.everything().await {
            self.queue(key, &mut queue);
        }
        let stop = async move {
            let _ = stopped.wait_for(|stopped| *stopped).await;
        };
        tokio::pin!(stop);
        // The one alarm, set at the earliest wake.
        let mut alarm: Option<(Timestamp, Alarm)> = None;
        loop {
            let earliest = queue.by_time.first().map(|(at, _)| *at);
            if alarm.as_ref().map(|(at, _)| *at) != earliest {
                alarm = earliest.map(|at| {
                    let clock = self.clock.clone();
                    let sleep: Alarm = Box::pin(async move { clock.sleep_until(at).await });
                    (at, sleep)
                });
            }
            tokio::select! {
                () = &mut stop => break,
                change = changes.recv() => match change {
                    Ok(Change::Written(key, version)) if matches!(key.kind, Kind::AgentRun | Kind::AgentGroup) => {
                        self.changed(key, version, &mut queue);
                    }
                    Ok(Change::Written(key, _)) if key.kind == Kind::Account && key.project == SYSTEM_PROJECT => {
                        // Credits changed: the runs waiting for funds look again (only
                        // those: every model call changes its project's account).
                        for run in queue.awaiting_funds.remove(&key.name).unwrap_or_default() {
                            self.queue(run, &mut queue);
                        }
                    }
                    Ok(Change::Written(key, _) | Change::Deleted(key)) if key.kind == Kind::Budget => {
                        // A budget raised or removed may fund what waits in its project.
                        for run in queue.awaiting_funds.remove(&key.project).unwrap_or_default() {
                            self.queue(run, &mut queue);
                        }
                    }
                    Ok(_) => {}
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(missed)) => {
                        tracing::warn!(missed, "change notifications lagged; looking at everything again");
                        queue.own_writes.clear();
                        for key in self.everything().await {
                            self.queue(key, &mut queue);
                        }
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => break,
                },
                () = ring(&mut alarm), if alarm.is_some() => {
                    alarm = None;
                    let now = self.clock.now();
                    while let Some((at, key)) = queue.by_time.first().cloned()
                        && at <= now
                    {
                        queue.by_time.remove(&(at, key.clone()));
                        queue.wakes.remove(&key);
                        self.queue(key, &mut queue);
                    }
                }
                Some(done) = queue.workers.join_next_with_id(), if !queue.workers.is_empty() => {
                    let done = match done {
                        Ok((id, done)) => {
                            queue.working.remove(&id);
                            done
                        }
                        Err(error) => {
                            let Some(key) = queue.working.remove(&error.id()) else { continue };
                            if error.is_cancelled() {
                                Done::nothing(key, None)
                            } else {
                                // A worker that panicked: its key is looked at again later.
                                tracing::error!(key = %key, error = %error, "a worker panicked; retrying later");
                                Done {
                                    wake_at: self.later(),
                                    ..Done::nothing(key, None)
                                }
                            }
                        }
                    };
                    self.finished(done, &mut queue);
                }
            }
        }
        queue.workers.shutdown().await;
    }

    /// When a failed work is looked at again.
    fn later(&self) -> Option<Timestamp> {
        retry_at(self.clock.as_ref(), self.config.retry_after)
    }

    /// A worker is done: queue what follows from it.
    fn finished(&self, done: Done, queue: &mut Queue) {
        if is_drive(done.key.kind) {
            queue.driving = queue.driving.saturating_sub(1);
            self.driving.send_replace(queue.driving);
        }
        if done.awaiting_funds {
            queue
                .awaiting_funds
                .entry(done.key.project.clone())
                .or_default()
                .insert(done.key.clone());
        }
        if done.key.kind == Kind::AgentGroup {
            match done.reconcile_took {
                Some(took) => {
                    let ended = self.clock.now();
                    queue
                        .last_reconcile
                        .insert(done.key.clone(), LastReconcile { took, ended })
                }
                None => queue.last_reconcile.remove(&done.key),
            };
        }
        if let Some(group) = done.group {
            self.queue(group, queue);
        }
        if let Some(at) = done.wake_at {
            // The earliest wake stands: the run is driven then, and its drive says when next.
            match queue.wakes.get(&done.key) {
                Some(known) if *known <= at => {}
                known => {
                    if let Some(known) = known {
                        queue.by_time.remove(&(*known, done.key.clone()));
                    }
                    queue.wakes.insert(done.key.clone(), at);
                    queue.by_time.insert((at, done.key.clone()));
                }
            }
        }
        let own_write = done.own_write;
        let again = queue.slots.get_mut(&done.key).is_some_and(|slot| {
            slot.busy = false;
            let dirty = std::mem::take(&mut slot.dirty);
            match own_write {
                // The drive's own writes (and what it saw): nothing new for a drive.
                Some(written) if slot.notified <= written => {
                    if slot.notified < written {
                        queue.own_writes.insert(done.key.clone(), written);
                    }
                    false
                }
                _ => dirty,
            }
        });
        if again {
            // Its slot keeps the versions notified so far.
            self.queue_at(done.key, 0, queue);
        } else {
            queue.slots.remove(&done.key);
        }
        // A drive ended: the next run ready takes its place (none while draining).
        while may_drive(
            queue.driving,
            self.config.max_concurrent,
            self.engine.draining(),
        ) && let Some(key) = queue.ready.pop_front()
        {
            if let Some(slot) = queue.slots.get_mut(&key) {
                slot.ready = false;
            }
            self.queued.send_replace(queue.ready.len());
            self.spawn(key, queue);
        }
    }

    /// Version `version` of run or group `key` was written: drive (reconcile) it, unless the
    /// write is its last drive's (reconcile's) own, or was seen by it.
    fn changed(&self, key: ObjectKey, version: u64, queue: &mut Queue) {
        if let Some(&written) = queue.own_writes.get(&key) {
            if version >= written {
                queue.own_writes.remove(&key);
            }
            if version <= written {
                return;
            }
        }
        self.queue_at(key, version, queue);
    }

    fn queue(&self, key: ObjectKey, queue: &mut Queue) {
        self.queue_at(key, u64::MAX, queue);
    }

    /// Queue `key`'s work, for a change to `version` of it (`u64::MAX`: another reason).
    fn queue_at(&self, key: ObjectKey, version: u64, queue: &mut Queue) {
        if self.engine.draining() {
            // A draining replica takes on nothing: the other replicas see the same changes.
            return;
        }
        let slot = queue.slots.entry(key.clone()).or_default();
        slot.notified = slot.notified.max(version);
        if slot.ready {
            return;
        }
        if slot.busy {
            slot.dirty = true;
            return;
        }
        slot.busy = true;
        // In the order queued: behind the runs already waiting for a drive.
        if is_drive(key.kind)
            && (!may_drive(queue.driving, self.config.max_concurrent, false)
                || !queue.ready.is_empty())
        {
            slot.ready = true;
            queue.ready.push_back(key);
            self.queued.send_replace(queue.ready.len());
            return;
        }
        self.spawn(key, queue);
    }

    /// Start the worker of `key` (its slot is busy).
    fn spawn(&self, key: ObjectKey, queue: &mut Queue) {
        if is_drive(key.kind) {
            queue.driving += 1;
            self.driving.send_replace(queue.driving);
        }
        let worker_key = key.clone();
        let engine = self.engine.clone();
        let clock = self.clock.clone();
        let settle = queue
            .last_reconcile
            .get(&key)
            .map_or(Duration::ZERO, |last| {
                let since = self.clock.now().duration_since(last.ended);
                settle_time(
                    self.config.group_settle,
                    last.took,
                    Duration::try_from(since).unwrap_or(Duration::ZERO),
                )
            });
        let retry_after = self.config.retry_after;
        let worker = queue.workers.spawn(async move {
            match key.kind {
                Kind::AgentGroup => {
                    // Let the changes of a busy group gather.
                    if !settle.is_zero() {
                        clock.sleep(settle).await;
                    }
                    // What the reconcile's reads took, not its commits: the work that grows
                    // with the group.
                    let mut took = Duration::ZERO;
                    let reconciled = engine
                        .reconcile_group_reading(&key.project, &key.name, &mut took)
                        .await;
                    // A group deleted meanwhile has no cost to remember.
                    let (evaluation, took, own_write) = match reconciled {
                        Ok((group, version)) => {
                            (group.spec.evaluation.is_some(), Some(took), Some(version))
                        }
                        Err(Error::NotFound { .. }) => (false, None, None),
                        Err(error) => {
                            tracing::warn!(group = %key, error = %error, "reconcile failed");
                            (false, Some(took), None)
                        }
                    };
                    // An evaluation group's grading is worked apart, under a key of its own,
                    // so that a slow grader never holds up the group's reconciles.
                    let grading = evaluation
                        .then(|| ObjectKey::new(&key.project, Kind::EvaluationCase, &key.name));
                    Done {
                        reconcile_took: took,
                        own_write,
                        ..Done::nothing(key, grading)
                    }
                }
                Kind::EvaluationCase => {
                    // Grade the cases whose runs ended; look again when a case's deadline or
                    // retry comes.
                    let wake_at = match engine.grade_evaluation(&key.project, &key.name).await {
                        Ok(at) => at,
                        Err(Error::NotFound { .. }) => None,
                        Err(error) => {
                            tracing::warn!(group = %key.name, error = %error, "grading failed");
                            retry_at(clock.as_ref(), retry_after)
                        }
                    };
                    Done {
                        wake_at,
                        ..Done::nothing(key, None)
                    }
                }
                _ => drive(&engine, clock.as_ref(), retry_after, key).await,
            }
        });
        queue.working.insert(worker.id(), worker_key);
    }

    /// Every unfinished run and every group of every project the store holds.
    async fn everything(&self) -> Vec<ObjectKey> {
        let projects = projects(self.store.as_ref()).await;
        let mut keys = Vec::new();
        for name in projects {
            keys.extend(self.runs_of(&name).await);
            if let Ok(groups) = self
                .engine
                .list::<AgentGroupSpec>(&name, &Selector::default())
                .await
            {
                keys.extend(
                    groups
                        .iter()
                        .map(|g| ObjectKey::new(&name, Kind::AgentGroup, g.name())),
                );
            }
        }
        keys
    }

    /// The unfinished runs of a project.
    async fn runs_of(&self, project: &str) -> Vec<ObjectKey> {
        match self.engine.unfinished_runs(project).await {
            Ok(runs) => runs
                .into_iter()
                .map(|name| ObjectKey::new(project, Kind::AgentRun, name))
                .collect(),
            Err(error) => {
                tracing::error!(project, error = %error, "cannot list runs");
                Vec::new()
            }
        }
    }
}

impl RunnerHandle {
    /// The engine this runner drives.
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// How many runs this runner drives now (each holds its sandbox): for gauges.
    pub fn driving(&self) -> watch::Receiver<usize> {
        self.driving.clone()
    }

    /// How many runs wait for a drive, queued beyond `max_concurrent` (as keys: no task
    /// each): for gauges, and for tests that must know every run was seen and held back.
    pub fn queued(&self) -> watch::Receiver<usize> {
        self.queued.clone()
    }

    /// Drain, then stop: take on no more work, let the drives under way stop between steps
    /// (each gives its run's lease up), and once `grace` has passed stop those still running
    /// a step (their commands are killed) and give their leases up too, so that the other
    /// replicas continue every run at once instead of waiting for leases to expire. Returns
    /// how many runs were cut by the grace period.
    pub async fn drain(self, grace: Duration) -> usize {
        self.engine.start_draining();
        let clock = self.engine.clock().clone();
        let mut driving = self.driving.clone();
        let cut = tokio::select! {
            _ = driving.wait_for(|driving| *driving == 0) => 0,
            () = clock.sleep(grace) => *self.driving.borrow(),
        };
        let engine = self.engine.clone();
        self.shutdown().await;
        // The drives are stopped (dropped): nothing of this process writes their runs now.
        let released = engine.release_held().await;
        tracing::info!(cut, released, "drained");
        cut
    }

    /// Stop the runner: drives in progress are dropped (a run's journal says where it was;
    /// the next runner resumes it), timers and the retention sweep end.
    pub async fn shutdown(self) {
        let _ = self.stop.send(true);
        if let Some(sweeper) = &self.sweeper {
            sweeper.abort();
        }
        let _ = self.task.await;
        if let Some(sweeper) = self.sweeper {
            let _ = sweeper.await;
        }
    }

    /// The run once the runner has taken it as far as it goes by itself: finished, parked
    /// until a person resolves it, or waiting for a message or for funds (and not asked to
    /// cancel or close). For tests and embedders that start a run and want its result; a run
    /// that waits for a message is answered as it is, even when a message was just sent
    /// (wait for its change, or for [`Engine::finished_run`], then).
    pub async fn settled(&self, project: &str, name: &str) -> Result<AgentRun> {
        let mut changes = self.engine.store().subscribe();
        let key = ObjectKey::new(project, Kind::AgentRun, name);
        loop {
            let run = self.engine.get_run(project, name).await?;
            let asked = run.status.cancel_requested.is_some() || run.status.close_requested;
            let phase = run.status.phase;
            if phase.is_some_and(RunPhase::is_finished) || (!asked && phase.is_some_and(is_settled))
            {
                return Ok(run);
            }
            loop {
                match changes.recv().await {
                    Ok(Change::Written(changed, _) | Change::Deleted(changed))
                        if changed == key =>
                    {
                        break;
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => break,
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => {
                        return Err(Error::NotFound {
                            kind: Kind::AgentRun,
                            name: name.to_string(),
                        });
                    }
                    Ok(_) => {}
                }
            }
        }
    }
}

/// The runner's alarm: a sleep until a time of its clock.
type Alarm = Pin<Box<dyn Future<Output = ()> + Send>>;

/// Resolves when the alarm rings (never without one).
async fn ring(alarm: &mut Option<(Timestamp, Alarm)>) {
    match alarm {
        Some((_, sleep)) => sleep.as_mut().await,
        None => std::future::pending().await,
    }
}

/// Whether a runner driving `driving` runs may start another drive (claim another run's
/// lease): only while it has room under its capacity (at least one), and never while it
/// drains. A runner that may not leaves the run to the other replicas, which see the same
/// changes.
fn may_drive(driving: usize, capacity: usize, draining: bool) -> bool {
    !draining && driving < capacity.max(1)
}

/// Whether the work of a key of `kind` is a run's drive (bounded by
/// [`RunnerConfig::max_concurrent`]); a group's reconcile and an evaluation's grading are not.
fn is_drive(kind: Kind) -> bool {
    !matches!(kind, Kind::AgentGroup | Kind::EvaluationCase)
}

/// Whether a run in `phase` stays so until something outside the runner happens.
fn is_settled(phase: RunPhase) -> bool {
    phase.is_finished()
        || matches!(
            phase,
            RunPhase::NeedsResolution
                | RunPhase::Waiting(WaitReason::AwaitingMessage | WaitReason::AwaitingFunds)
        )
}

/// How long a group's changes gather before its reconcile: until [`SETTLE_FACTOR`] times what
/// its last reconcile took (at most `longest`) has passed since that reconcile ended, `since`
/// ago (nothing before its first: the caller waits for nothing then).
fn settle_time(longest: Duration, took: Duration, since: Duration) -> Duration {
    took.saturating_mul(SETTLE_FACTOR)
        .min(longest)
        .saturating_sub(since)
}

/// When work that failed is looked at again: `retry_after` from now.
fn retry_at(clock: &dyn Clock, retry_after: Duration) -> Option<Timestamp> {
    let retry =
        jiff::SignedDuration::try_from(retry_after).unwrap_or(jiff::SignedDuration::from_secs(2));
    clock.now().checked_add(retry).ok()
}

/// Drive one run and say what follows.
async fn drive(engine: &Engine, clock: &dyn Clock, retry_after: Duration, key: ObjectKey) -> Done {
    // One read of the run for both: its group, and the drive.
    let (group, driven, own_write) = match engine.drive_in_group(&key.project, &key.name).await {
        Ok((group, driven, own_write)) => (
            group.map(|group| ObjectKey::new(&key.project, Kind::AgentGroup, group)),
            driven,
            own_write,
        ),
        Err(_) => return Done::nothing(key, None),
    };
    let done = drive_done(clock, retry_after, key, group, driven);
    Done { own_write, ..done }
}

/// What follows from a drive of run `key` of `group` that went as `driven`.
fn drive_done(
    clock: &dyn Clock,
    retry_after: Duration,
    key: ObjectKey,
    group: Option<ObjectKey>,
    driven: Result<Driven>,
) -> Done {
    match driven {
        Ok(Driven::Waiting { until, reason }) => Done {
            key,
            group,
            wake_at: until,
            awaiting_funds: reason == WaitReason::AwaitingFunds,
            reconcile_took: None,
            own_write: None,
        },
        // A run its group has not admitted yet: the group decides (a new run of an open
        // group is admitted by that reconcile; one that must wait leaves the group as it was,
        // which writes nothing). It, and a parked run, look again at their deadline.
        Ok(Driven::NotAdmitted { until } | Driven::Parked { until, .. }) => Done {
            wake_at: until,
            ..Done::nothing(key, group)
        },
        // Handed over by a drain: another replica continues it.
        Ok(Driven::Released) => Done::nothing(key, None),
        Ok(_) | Err(Error::NotFound { .. }) => Done::nothing(key, group),
        Err(error) => {
            // Another replica holds the run, or the store is restarting: look again soon.
            tracing::warn!(run = %key, error = %error, "driving the run failed; retrying soon");
            Done {
                wake_at: retry_at(clock, retry_after),
                ..Done::nothing(key, group)
            }
        }
    }
}

/// The projects a runner looks after: every project the store holds a document of (as the
/// retention sweep reads them), whether or not it has a credit account: an embedder's
/// projects on [`Unmetered`](crate::ledger::Unmetered) have none. Accounts live in
/// [`SYSTEM_PROJECT`], which holds no runs.
async fn projects(store: &dyn Store) -> Vec<String> {
    match store.projects().await {
        Ok(projects) => projects
            .into_iter()
            .filter(|project| project != SYSTEM_PROJECT)
            .collect(),
        Err(error) => {
            tracing::error!(error = %error, "cannot list projects");
            Vec::new()
        }
    }
}

/// The retention sweep ([`retention::sweep`]): at start and then every `every`, remove the
/// recorded payloads of the runs (of every project in the store) that ended more than
/// `keep_for` ago, with their kept final working directories; their records say so.
async fn sweep_payloads(
    store: Arc<dyn Store>,
    clock: Arc<dyn Clock>,
    keep_for: Duration,
    every: Duration,
) {
    let keep_for = jiff::SignedDuration::try_from(keep_for).unwrap_or(jiff::SignedDuration::MAX);
    let every = jiff::SignedDuration::try_from(every).unwrap_or(jiff::SignedDuration::MAX);
    loop {
        let now = clock.now();
        let before = now.checked_sub(keep_for).unwrap_or(Timestamp::MIN);
        let swept = match store.projects().await {
            Ok(projects) => retention::sweep(store.as_ref(), &projects, before, now).await,
            Err(error) => Err(error),
        };
        match swept {
            Ok(swept) => {
                tracing::info!(runs = swept.runs.len(), "retention sweep");
                // An evaluation case shares its run's retention.
                for run in &swept.runs {
                    let case = ObjectKey::new(&run.project, Kind::EvaluationCase, &run.name);
                    let edit: crate::store::Edit = Box::new(move |document| {
                        crate::evaluation::without_payloads(document, now)
                    });
                    match store.modify(&case, edit).await {
                        Ok(_) | Err(crate::store::Error::NotFound(_)) => {}
                        Err(error) => {
                            tracing::warn!(case = %case, error = %error, "cannot sweep a case");
                        }
                    }
                }
            }
            Err(error) => {
                tracing::warn!(error = %error, "retention sweep failed; retrying at the next one");
            }
        }
        clock
            .sleep_until(now.checked_add(every).unwrap_or(Timestamp::MAX))
            .await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_runner_claims_another_run_only_with_room_and_never_while_it_drains() {
        // (driving, capacity, draining) → may it start another drive?
        let table = [
            ((0, 5, false), true),
            ((4, 5, false), true),
            ((5, 5, false), false),
            ((6, 5, false), false),
            // A capacity of zero is one.
            ((0, 0, false), true),
            ((1, 0, false), false),
            // Draining: nothing more, whatever the room.
            ((0, 5, true), false),
            ((4, 5, true), false),
        ];
        for ((driving, capacity, draining), expected) in table {
            assert_eq!(
                may_drive(driving, capacity, draining),
                expected,
                "driving {driving}, capacity {capacity}, draining {draining}"
            );
        }
    }

    #[test]
    fn a_group_gathers_its_changes_until_a_few_times_its_last_reconcile_has_passed_since_it() {
        let longest = Duration::from_millis(50);
        let ms = Duration::from_millis;
        // Right after its last reconcile: eight times what that took, at most the longest.
        assert_eq!(settle_time(longest, ms(2), ms(0)), ms(16));
        assert_eq!(settle_time(longest, ms(6), ms(0)), ms(48));
        assert_eq!(settle_time(longest, ms(7), ms(0)), longest);
        assert_eq!(settle_time(Duration::ZERO, ms(30), ms(0)), Duration::ZERO);
        assert_eq!(settle_time(longest, Duration::MAX, ms(0)), longest);
        // Later: only what is left of it, and nothing once it has passed.
        assert_eq!(settle_time(longest, ms(2), ms(5)), ms(11));
        assert_eq!(settle_time(longest, ms(30), ms(20)), ms(30));
        assert_eq!(settle_time(longest, ms(2), ms(16)), Duration::ZERO);
        assert_eq!(settle_time(longest, ms(2), ms(300)), Duration::ZERO);
    }
}

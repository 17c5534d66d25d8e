//! The controllers: the run executor and the group controller, driven by the store's change
//! notification.
//!
//! One loop owns the work queue. A change to a run queues the run; a change to a group, or a
//! run of a group finishing, queues the group. Each key is worked by at most one task at a
//! time; a change that arrives while its key is being worked marks it to be worked again. A
//! waiting run with a deadline is queued again when the deadline comes. At start every
//! unfinished run and every group is queued, which is how runs resume after a restart.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use nodus_core::Clock;
use nodus_core::engine::{Driven, Engine};
use nodus_core::lifecycle::WaitReason;
use nodus_core::resource::{AgentGroupSpec, AgentRunSpec, Kind};
use nodus_core::store::{Change, ObjectKey, Selector, Store};
use tokio::sync::{Semaphore, mpsc};
use tokio::task::JoinSet;

use crate::auth::SYSTEM_PROJECT;

/// How long a group's changes gather before it is reconciled.
const GROUP_SETTLE: Duration = Duration::from_millis(50);

/// What a worker finished, and what it found should happen next.
struct Done {
    key: ObjectKey,
    /// A group to reconcile because one of its runs moved.
    group: Option<ObjectKey>,
    /// When to look at the run again by itself (its deadline).
    wake_at: Option<jiff::Timestamp>,
    /// The run waits for its project's credits.
    awaiting_funds: bool,
}

#[derive(Default)]
struct Slot {
    busy: bool,
    dirty: bool,
}

/// The executor and group controller.
pub struct Controller {
    engine: Engine,
    store: Arc<dyn Store>,
    clock: Arc<dyn Clock>,
    permits: Arc<Semaphore>,
}

impl Controller {
    /// A controller that drives at most `max_concurrent` runs at once.
    pub fn new(engine: Engine, clock: Arc<dyn Clock>, max_concurrent: usize) -> Self {
        Controller {
            store: engine.store().clone(),
            engine,
            clock,
            permits: Arc::new(Semaphore::new(max_concurrent.max(1))),
        }
    }

    /// Run until `shutdown` resolves.
    pub async fn run(self, shutdown: impl std::future::Future<Output = ()>) {
        let mut changes = self.store.subscribe();
        let (wake_tx, mut wake_rx) = mpsc::unbounded_channel::<ObjectKey>();
        let mut slots: HashMap<ObjectKey, Slot> = HashMap::new();
        let mut workers: JoinSet<Done> = JoinSet::new();
        // The runs this controller left waiting for funds, by project: a change of a
        // project's credits wakes only those (every model call changes the account; looking
        // for waiting runs in the store each time would read every run of the project).
        let mut awaiting_funds: HashMap<String, HashSet<ObjectKey>> = HashMap::new();
        for key in self.everything().await {
            self.queue(key, &mut slots, &mut workers);
        }
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                () = &mut shutdown => break,
                change = changes.recv() => match change {
                    Ok(Change::Written(key, _)) if matches!(key.kind, Kind::AgentRun | Kind::AgentGroup) => {
                        self.queue(key, &mut slots, &mut workers);
                    }
                    Ok(Change::Written(key, _)) if key.kind == Kind::Project && key.project == SYSTEM_PROJECT => {
                        // Credits changed: the runs waiting for funds look again (only
                        // those: every model call changes its project's account).
                        for run in awaiting_funds.remove(&key.name).unwrap_or_default() {
                            self.queue(run, &mut slots, &mut workers);
                        }
                    }
                    Ok(Change::Written(key, _) | Change::Deleted(key)) if key.kind == Kind::Budget => {
                        // A budget raised or removed may fund what waits in its project.
                        for run in awaiting_funds.remove(&key.project).unwrap_or_default() {
                            self.queue(run, &mut slots, &mut workers);
                        }
                    }
                    Ok(_) => {}
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(missed)) => {
                        tracing::warn!(missed, "change notifications lagged; looking at everything again");
                        for key in self.everything().await {
                            self.queue(key, &mut slots, &mut workers);
                        }
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => break,
                },
                Some(key) = wake_rx.recv() => self.queue(key, &mut slots, &mut workers),
                Some(done) = workers.join_next(), if !workers.is_empty() => {
                    let Ok(done) = done else { continue };
                    if done.awaiting_funds {
                        awaiting_funds
                            .entry(done.key.project.clone())
                            .or_default()
                            .insert(done.key.clone());
                    }
                    if let Some(group) = done.group {
                        self.queue(group, &mut slots, &mut workers);
                    }
                    if let Some(at) = done.wake_at {
                        let wake_tx = wake_tx.clone();
                        let clock = self.clock.clone();
                        let key = done.key.clone();
                        tokio::spawn(async move {
                            let left = at.duration_since(clock.now());
                            clock.sleep(Duration::try_from(left).unwrap_or(Duration::ZERO)).await;
                            let _ = wake_tx.send(key);
                        });
                    }
                    let again = slots.get_mut(&done.key).is_some_and(|slot| {
                        slot.busy = false;
                        std::mem::take(&mut slot.dirty)
                    });
                    if again {
                        self.queue(done.key, &mut slots, &mut workers);
                    } else {
                        slots.remove(&done.key);
                    }
                }
            }
        }
        workers.shutdown().await;
    }

    fn queue(
        &self,
        key: ObjectKey,
        slots: &mut HashMap<ObjectKey, Slot>,
        workers: &mut JoinSet<Done>,
    ) {
        let slot = slots.entry(key.clone()).or_default();
        if slot.busy {
            slot.dirty = true;
            return;
        }
        slot.busy = true;
        let engine = self.engine.clone();
        let permits = self.permits.clone();
        workers.spawn(async move {
            match key.kind {
                Kind::AgentGroup => {
                    // Let the changes of a busy group gather: one reconcile reads every member,
                    // so one per burst of changes instead of one per change.
                    tokio::time::sleep(GROUP_SETTLE).await;
                    if let Err(error) = engine.reconcile_group(&key.project, &key.name).await
                        && error.reason() != "NotFound"
                    {
                        tracing::warn!(group = %key, error = %error, "reconcile failed");
                    }
                    Done {
                        key,
                        group: None,
                        wake_at: None,
                        awaiting_funds: false,
                    }
                }
                _ => {
                    let _permit = permits.acquire_owned().await;
                    drive(&engine, key).await
                }
            }
        });
    }

    /// Every unfinished run and every group of every project.
    async fn everything(&self) -> Vec<ObjectKey> {
        let projects = match self
            .store
            .list(SYSTEM_PROJECT, Kind::Project, &Selector::default())
            .await
        {
            Ok(projects) => projects,
            Err(error) => {
                tracing::error!(error = %error, "cannot list projects");
                return Vec::new();
            }
        };
        let mut keys = Vec::new();
        for project in projects {
            let name = project.key.name;
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
        match self
            .engine
            .list::<AgentRunSpec>(project, &Selector::default())
            .await
        {
            Ok(runs) => runs
                .iter()
                .filter(|run| !run.status.phase.is_some_and(|p| p.is_finished()))
                .map(|run| ObjectKey::new(project, Kind::AgentRun, run.name()))
                .collect(),
            Err(error) => {
                tracing::error!(project, error = %error, "cannot list runs");
                Vec::new()
            }
        }
    }
}

/// Drive one run and say what follows.
async fn drive(engine: &Engine, key: ObjectKey) -> Done {
    let group = match engine.get_run(&key.project, &key.name).await {
        Ok(run) => run
            .spec
            .group
            .map(|group| ObjectKey::new(&key.project, Kind::AgentGroup, group)),
        Err(_) => {
            return Done {
                key,
                group: None,
                wake_at: None,
                awaiting_funds: false,
            };
        }
    };
    match engine.drive(&key.project, &key.name).await {
        Ok(Driven::Waiting { until, reason }) => Done {
            key,
            group,
            wake_at: until,
            awaiting_funds: reason == WaitReason::AwaitingFunds,
        },
        // A run its group has not admitted yet: the group decides (a new run of an open
        // group is admitted by that reconcile; one that must wait leaves the group as it was,
        // which writes nothing). It, and a parked run, look again at their deadline.
        Ok(Driven::NotAdmitted { until } | Driven::Parked { until, .. }) => Done {
            key,
            group,
            wake_at: until,
            awaiting_funds: false,
        },
        Ok(_) => Done {
            key,
            group,
            wake_at: None,
            awaiting_funds: false,
        },
        Err(error) if error.reason() == "NotFound" => Done {
            key,
            group,
            wake_at: None,
            awaiting_funds: false,
        },
        Err(error) => {
            // Another replica holds the run, or the store is restarting: look again soon.
            tracing::warn!(run = %key, error = %error, "driving the run failed; retrying soon");
            Done {
                key,
                group,
                wake_at: jiff::Timestamp::now()
                    .checked_add(jiff::SignedDuration::from_secs(2))
                    .ok(),
                awaiting_funds: false,
            }
        }
    }
}

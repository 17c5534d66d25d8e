//! The executor: asks the decider for the next move, journals the intent, carries the effect
//! out through the traits, journals the outcome, and writes the run's status.

use std::future::Future;
use std::time::Duration;

use super::{API_KEY_SECRET_KEY, Engine, Error, Result, run_uid, status, typed};
use crate::catalog::Family;
use crate::cost;
use crate::decide::{self, Decision, RunInput};
use crate::journal::{Completion, Intent, Outcome, Step};
use crate::lifecycle::{
    FailReason, PendingReason, RunEvent, RunPhase, TransitionRefused, WaitReason,
};
use crate::model::{Credentials, ErrorKind, ModelRequest, ToolChoice};
use crate::money::Usd;
use crate::replay::{Prompt, Replay, SandboxState};
use crate::resource::{Access, AgentRun, AgentSpec, ChosenBy, Kind, RunSnapshot};
use crate::router::RouteRequest;
use crate::sandbox::{self, ExecRequest, SandboxSpec};
use crate::store::{self as store_api, Fence, InboxMessage, ObjectKey};

/// A run as read from (or written to) the store.
type Run = typed::Versioned<crate::resource::AgentRunSpec>;

/// Where driving a run left it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Driven {
    /// The run is over.
    Finished(RunPhase),
    /// The run waits; drive it again when woken, or at `until`.
    Waiting {
        /// Why.
        reason: WaitReason,
        /// Its deadline, if any.
        until: Option<jiff::Timestamp>,
    },
    /// The run is parked on an uncertain step until a person resolves it, or until `until`.
    Parked {
        /// The step.
        seq: u32,
        /// Its deadline or the end of its timeout, if any: then it fails unresolved.
        until: Option<jiff::Timestamp>,
    },
    /// The run is queued in its group and not admitted yet; drive it again when the group
    /// changes, or at `until`.
    NotAdmitted {
        /// Its deadline, if any: it fails then if it is still queued.
        until: Option<jiff::Timestamp>,
    },
    /// Another writer claimed the run; this one stopped.
    TakenOver,
}

/// What carrying out an intent gave.
enum Performed {
    /// An outcome to journal.
    Done(Outcome),
    /// The effect may or may not have happened, and repeating it is not safe.
    Uncertain,
}

/// What a run needs that does not change while it is driven.
pub(super) struct Fixed {
    key: ObjectKey,
    pub(super) uid: String,
    pub(super) project: String,
    snapshot: RunSnapshot,
    system: String,
    first_prompt: String,
    sandbox: SandboxSpec,
}

impl Engine {
    /// Drive a run as far as it goes now: until it finishes, waits, parks, or is not admitted
    /// yet. Safe to call on any run at any time, after a crash included: completed steps are
    /// taken from the journal, never repeated.
    pub async fn drive(&self, project: &str, name: &str) -> Result<Driven> {
        let run = self.read_run(project, name).await?;
        let phase = phase_of(&run.object);
        if phase.is_finished() {
            return Ok(Driven::Finished(phase));
        }
        if run.object.spec.group.is_some() && matches!(phase, RunPhase::Pending(_)) {
            let deadline = run.object.spec.deadline;
            if deadline.is_some_and(|at| self.deps.clock.now() >= at) {
                let key = ObjectKey::new(project, Kind::AgentRun, name);
                self.end_queued(&key, phase, FailReason::DeadlineExceeded)
                    .await?;
                // Failed now, or admitted meanwhile (its own loop then sees the deadline).
                return Box::pin(self.drive(project, name)).await;
            }
            return Ok(Driven::NotAdmitted { until: deadline });
        }
        let fixed = self.fixed(project, &run.object)?;
        let lease = self.lease();
        let fence = self.deps.store.claim(&fixed.uid, &lease).await?;
        let mut journal = self.deps.store.journal(&fixed.uid).await?;
        self.settle_last_charge(&fixed, &journal).await?;
        // Renew the lease while the run is driven (a command may outlast it), and give it up
        // when the drive ends, so another replica can take the run at once.
        let renewing = async {
            loop {
                let third =
                    jiff::SignedDuration::try_from(crate::store::Lease::DEFAULT_DURATION / 3)
                        .unwrap_or(jiff::SignedDuration::from_secs(10));
                let next = self.deps.clock.now().checked_add(third);
                self.deps
                    .clock
                    .sleep_until(next.unwrap_or(jiff::Timestamp::MAX))
                    .await;
                if let Err(error) = self
                    .deps
                    .store
                    .renew(&fixed.uid, fence, &self.lease())
                    .await
                {
                    tracing::warn!(run = %fixed.key, error = %error, "cannot renew the run's lease");
                }
            }
        };
        let driven = tokio::select! {
            biased;
            driven = self.drive_loop(&fixed, fence, &mut journal) => driven,
            () = renewing => unreachable_renewal(),
        };
        if !matches!(
            driven,
            Ok(Driven::TakenOver) | Err(Error::Store(store_api::Error::Fenced { .. }))
        ) {
            let _ = self.deps.store.release(&fixed.uid, fence).await;
        }
        match driven {
            Err(Error::Store(store_api::Error::Fenced { .. })) => Ok(Driven::TakenOver),
            other => other,
        }
    }

    fn fixed(&self, project: &str, run: &AgentRun) -> Result<Fixed> {
        let key = ObjectKey::new(project, Kind::AgentRun, run.name());
        let snapshot = run.status.snapshot.clone().ok_or_else(|| Error::Corrupt {
            key: key.to_string(),
            message: "the run has no snapshot of its agent".to_string(),
        })?;
        let uid = run_uid(run).to_string();
        let mut system = snapshot.agent.system.clone();
        if let Some(context) = &run.spec.context {
            let mut context = context.clone();
            context.insert(
                "nodus".to_string(),
                serde_json::json!({"run": run.name(), "project": project, "agent": snapshot.agent_ref}),
            );
            let context = serde_json::Value::Object(context);
            system.push_str(&format!("\n\nRun context (JSON):\n{context}"));
        }
        let first_prompt = run
            .spec
            .input
            .clone()
            .or_else(|| snapshot.agent.default_input.clone())
            .unwrap_or_default();
        let sandbox = SandboxSpec {
            key: uid.clone(),
            image: run
                .spec
                .image
                .clone()
                .or_else(|| self.config.default_image.clone()),
            env: super::environment::plain_env(snapshot.environment.as_ref()),
            limits: super::environment::limits_of(
                self.config.limits,
                snapshot.environment.as_ref(),
            ),
            network: false,
        };
        Ok(Fixed {
            key,
            uid,
            project: project.to_string(),
            snapshot,
            system,
            first_prompt,
            sandbox,
        })
    }

    async fn drive_loop(
        &self,
        fixed: &Fixed,
        fence: Fence,
        journal: &mut Vec<Step>,
    ) -> Result<Driven> {
        // The run as this loop last wrote it, with its inbox: while nobody else writes the run
        // (a message or a cancel request bumps its version, so the next status write is
        // refused and the loop reads again), there is nothing new to read.
        let mut known: Option<(Run, Vec<InboxMessage>)> = None;
        loop {
            let (mut run, inbox) = match known.take() {
                Some(known) => known,
                None => {
                    let record = self.deps.store.get(&fixed.key).await?;
                    let run = typed::decode::<crate::resource::AgentRunSpec>(record)?;
                    let inbox = self.deps.store.inbox(&fixed.uid).await?;
                    (run, inbox)
                }
            };
            let phase = phase_of(&run.object);
            if phase.is_finished() {
                return Ok(Driven::Finished(phase));
            }
            let now = self.deps.clock.now();
            let decision = decide::decide(&RunInput {
                agent: &fixed.snapshot.agent,
                spec: &run.object.spec,
                sandbox: &fixed.sandbox,
                system: &fixed.system,
                first_prompt: &fixed.first_prompt,
                journal,
                inbox: &inbox,
                now,
                cancel: run.object.status.cancel_requested,
                close: run.object.status.close_requested,
                catalog: &self.deps.catalog,
                router_max_cost: self.deps.router.max_cost(),
                post_run_action: fixed.snapshot.post_run_action.as_ref(),
            });
            let decision = self
                .funded(fixed, journal, decision, &run.object.spec)
                .await?;
            let (seq, target) = match decision {
                Decision::Act(intent) => {
                    let target = match intent {
                        Intent::DestroySandbox { .. } => phase,
                        _ => advance(phase, RunPhase::Running)?,
                    };
                    let seq = u32::try_from(journal.len()).unwrap_or(u32::MAX);
                    let step = Step {
                        seq,
                        started_at: now,
                        intent,
                        completion: None,
                    };
                    if matches!(step.intent, Intent::DestroySandbox { .. }) {
                        // The run ends: say so in its status before the step is journaled,
                        // with a write conditional on the run as read. A message that came
                        // after that read bumped the version, so the write is refused and the
                        // run decides again with the message; one that comes after the write
                        // is refused by send_message, which sees the journaled ending.
                        let mut ending = journal.clone();
                        ending.push(step.clone());
                        match self.write_status(fixed, &run, &ending, phase).await? {
                            Some(written) => run = written,
                            None => continue,
                        }
                    }
                    self.retrying(|| self.deps.store.append_step(&fixed.uid, fence, &step))
                        .await?;
                    journal.push(step);
                    (seq, target)
                }
                Decision::Repeat(seq) => (seq, advance(phase, RunPhase::Running)?),
                Decision::Abandon { seq, error } => {
                    let outcome = Outcome::Failed {
                        error,
                        by_resolution: false,
                    };
                    self.complete(fixed, fence, journal, seq, outcome).await?;
                    continue;
                }
                Decision::Park(seq) => {
                    let target = advance(phase, RunPhase::NeedsResolution)?;
                    if self
                        .write_status(fixed, &run, journal, target)
                        .await?
                        .is_some()
                    {
                        return Ok(Driven::Parked {
                            seq,
                            until: decide::time_limit(&run.object.spec, journal).map(|(at, _)| at),
                        });
                    }
                    continue;
                }
                Decision::Wait { reason, until } => {
                    let target = advance(phase, RunPhase::Waiting(reason))?;
                    if self
                        .write_status(fixed, &run, journal, target)
                        .await?
                        .is_some()
                    {
                        return Ok(Driven::Waiting { reason, until });
                    }
                    continue;
                }
                Decision::Finish(end) => {
                    let target = advance(phase, end)?;
                    if self
                        .write_status(fixed, &run, journal, target)
                        .await?
                        .is_some()
                    {
                        return Ok(Driven::Finished(end));
                    }
                    continue;
                }
            };
            let index = usize::try_from(seq).unwrap_or(usize::MAX);
            let Some(intent) = journal.get(index).map(|s| s.intent.clone()) else {
                return Err(Error::Corrupt {
                    key: fixed.key.to_string(),
                    message: format!("the decider named step {seq}, which the journal lacks"),
                });
            };
            match self
                .perform(fixed, journal, &run.object, &inbox, &intent)
                .await
            {
                Performed::Done(outcome) => {
                    self.complete(fixed, fence, journal, seq, outcome).await?;
                    // A conflict here only means the document moved on; the next pass
                    // re-reads it and writes the status again.
                    known = self
                        .write_status(fixed, &run, journal, target)
                        .await?
                        .map(|written| (written, inbox));
                }
                Performed::Uncertain => {
                    let target = advance(target, RunPhase::NeedsResolution)?;
                    if self
                        .write_status(fixed, &run, journal, target)
                        .await?
                        .is_some()
                    {
                        return Ok(Driven::Parked {
                            seq,
                            until: decide::time_limit(&run.object.spec, journal).map(|(at, _)| at),
                        });
                    }
                }
            }
        }
    }

    async fn complete(
        &self,
        fixed: &Fixed,
        fence: Fence,
        journal: &mut [Step],
        seq: u32,
        outcome: Outcome,
    ) -> Result<()> {
        let charged = journal
            .get(usize::try_from(seq).unwrap_or(usize::MAX))
            .is_some_and(|step| self.charge_of(fixed, &step.intent).is_some());
        let actual = cost_of(&outcome);
        let completion = Completion {
            finished_at: self.deps.clock.now(),
            outcome,
        };
        self.retrying(|| {
            self.deps
                .store
                .complete_step(&fixed.uid, fence, seq, &completion)
        })
        .await?;
        if let Some(step) = journal.get_mut(usize::try_from(seq).unwrap_or(usize::MAX)) {
            step.completion = Some(completion);
        }
        if charged {
            let key = format!("{}/{seq}", fixed.uid);
            self.retrying(|| self.deps.ledger.settle(&fixed.project, &key, actual))
                .await?;
        }
        Ok(())
    }

    /// Settle the reservation of the last charged step that has an outcome, in case a crash
    /// came between journaling the outcome and settling (settling is idempotent, and a
    /// settled reservation writes nothing). Only the last one can be unsettled: a step's
    /// reservation is settled before the next step is decided.
    async fn settle_last_charge(&self, fixed: &Fixed, journal: &[Step]) -> Result<()> {
        let last = journal.iter().rev().find_map(|step| {
            let completion = step.completion.as_ref()?;
            self.charge_of(fixed, &step.intent)?;
            Some((step.seq, cost_of(&completion.outcome)))
        });
        if let Some((seq, actual)) = last {
            let key = format!("{}/{seq}", fixed.uid);
            self.retrying(|| self.deps.ledger.settle(&fixed.project, &key, actual))
                .await?;
        }
        Ok(())
    }

    /// What a step reserves against the project's credits: platform model calls their
    /// worst case, routing the router's; nothing else, and nothing on the user's own key.
    fn charge_of(&self, fixed: &Fixed, intent: &Intent) -> Option<Usd> {
        if fixed.snapshot.agent.model.access == Access::Byok {
            return None;
        }
        let amount = match intent {
            Intent::CallModel { reserved_usd, .. } => *reserved_usd,
            Intent::Route { .. } => self.deps.router.max_cost(),
            _ => return None,
        };
        // Nothing to reserve (a local router): no ledger write at all.
        (!amount.is_zero()).then_some(amount)
    }

    /// The decision, or waiting for funds when the step it acts on cannot be reserved
    /// against the project's credits.
    async fn funded(
        &self,
        fixed: &Fixed,
        journal: &[Step],
        decision: Decision,
        spec: &crate::resource::AgentRunSpec,
    ) -> Result<Decision> {
        let (seq, intent) = match &decision {
            Decision::Act(intent) => (u32::try_from(journal.len()).unwrap_or(u32::MAX), intent),
            Decision::Repeat(seq) => match journal.get(usize::try_from(*seq).unwrap_or(usize::MAX))
            {
                Some(step) => (*seq, &step.intent),
                None => return Ok(decision),
            },
            _ => return Ok(decision),
        };
        if self.reserve_funds(fixed, seq, intent).await? {
            return Ok(decision);
        }
        Ok(Decision::Wait {
            reason: WaitReason::AwaitingFunds,
            until: decide::time_limit(spec, journal).map(|(at, _)| at),
        })
    }

    /// Reserve a step's charge; false when the project cannot cover it.
    async fn reserve_funds(&self, fixed: &Fixed, seq: u32, intent: &Intent) -> Result<bool> {
        let Some(amount) = self.charge_of(fixed, intent) else {
            return Ok(true);
        };
        let key = format!("{}/{seq}", fixed.uid);
        Ok(self
            .retrying(|| self.deps.ledger.reserve(&fixed.project, &key, amount))
            .await?)
    }

    /// Write the status projected from the journal with `phase`: the run as stored now, or
    /// `None` when the document changed since it was read (the caller looks again).
    async fn write_status(
        &self,
        fixed: &Fixed,
        run: &Run,
        journal: &[Step],
        phase: RunPhase,
    ) -> Result<Option<Run>> {
        let replay = Replay::of(journal);
        let status = status::project(
            &run.object.status,
            &replay,
            phase,
            journal.first().map(|s| s.started_at),
            self.deps.clock.now(),
        );
        if status == run.object.status {
            return Ok(Some(run.clone()));
        }
        let mut object = run.object.clone();
        object.status = status;
        let document = typed::encode(&fixed.key, &object)?;
        match self
            .retrying(|| {
                self.deps
                    .store
                    .update(&fixed.key, run.version, document.clone())
            })
            .await
        {
            Ok(record) => {
                object.metadata.resource_version = Some(record.version.to_string());
                Ok(Some(Run {
                    object,
                    version: record.version,
                }))
            }
            Err(store_api::Error::Conflict { .. }) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// Retry a store call while it fails in a way a retry can fix.
    async fn retrying<T, F, Fut>(&self, mut call: F) -> std::result::Result<T, store_api::Error>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = std::result::Result<T, store_api::Error>>,
    {
        let mut attempt = 1;
        loop {
            match call().await {
                Err(e) if e.is_retryable() && attempt < self.config.attempts => {
                    tracing::warn!(error = %e, attempt, "store call failed; retrying");
                    attempt += 1;
                    self.deps.clock.sleep(self.config.retry_pause).await;
                }
                other => return other,
            }
        }
    }

    async fn perform(
        &self,
        fixed: &Fixed,
        journal: &[Step],
        run: &AgentRun,
        inbox: &[InboxMessage],
        intent: &Intent,
    ) -> Performed {
        let replay = Replay::of(journal);
        match intent {
            Intent::CreateSandbox { spec } => {
                let environment = fixed.snapshot.environment.as_ref();
                let spec = match self.with_secrets(&fixed.project, environment, spec).await {
                    Ok(spec) => spec,
                    Err(error) => return Performed::Done(failed(error)),
                };
                match self
                    .sandbox_retrying(|| self.deps.sandbox.create(&spec))
                    .await
                {
                    Ok(info) => match self.stage_workdir(fixed, run, &info).await {
                        Ok(()) => Performed::Done(Outcome::SandboxCreated { info }),
                        Err(error) => {
                            // The step fails, so the run holds no sandbox: remove this one.
                            if let Err(e) = self.deps.sandbox.destroy(&info.id).await {
                                tracing::warn!(sandbox = %info.id, error = %e, "cannot remove a sandbox whose staging failed");
                            }
                            Performed::Done(failed(error))
                        }
                    },
                    Err(e) => Performed::Done(failed(e.to_string())),
                }
            }
            Intent::Route { turn } => {
                Performed::Done(self.route(fixed, &replay, inbox, *turn).await)
            }
            Intent::CallModel { model, tools, .. } => {
                self.call_model(fixed, &replay, inbox, model, *tools).await
            }
            Intent::Command { command, .. } => {
                let SandboxState::Live(info) = replay.sandbox else {
                    return Performed::Done(failed("the run has no sandbox".to_string()));
                };
                let request = ExecRequest {
                    command: command.clone(),
                    timeout: Duration::from_secs(self.config.limits.command_timeout_secs),
                    cwd: None,
                    output_cap: self.config.limits.output_cap_bytes,
                };
                // Watched from before the command starts, so no cancellation is missed.
                let changes = self.deps.store.subscribe();
                let exec = async {
                    let mut attempt = 1;
                    loop {
                        let mut executed = self.deps.sandbox.exec(&info.id, &request).await;
                        if let Err(sandbox::Error::NotFound(_)) = executed {
                            // A sandbox created before a restart: re-create it over its working
                            // directory (creation is idempotent by key) and run the command
                            // there.
                            let environment = fixed.snapshot.environment.as_ref();
                            executed = match self
                                .with_secrets(&fixed.project, environment, &fixed.sandbox)
                                .await
                            {
                                Err(error) => Err(sandbox::Error::Refused(error)),
                                Ok(spec) => match self.deps.sandbox.create(&spec).await {
                                    Ok(again) => self.deps.sandbox.exec(&again.id, &request).await,
                                    Err(e) => Err(e),
                                },
                            };
                        }
                        match executed {
                            // It did not start (the host is out of descriptors, say): again.
                            Err(sandbox::Error::NotStarted(_))
                                if attempt < self.config.attempts =>
                            {
                                attempt += 1;
                                self.deps.clock.sleep(self.config.retry_pause).await;
                            }
                            other => break other,
                        }
                    }
                };
                // The run ending (cancelled, deleted, at its deadline) stops the command at
                // once: dropping the exec kills its processes, and the step is recorded as
                // stopped, a completed outcome, so the run ends rather than parks.
                let executed = tokio::select! {
                    biased;
                    executed = exec => executed,
                    end = self.ending(fixed, &run.spec, journal, changes) => {
                        tracing::info!(run = %fixed.key, ending = %end, "stopped a command: the run is ending");
                        return Performed::Done(Outcome::Stopped {
                            reason: format!("the run is ending ({end}); its processes were killed"),
                        });
                    }
                };
                match executed {
                    Ok(output) => Performed::Done(Outcome::CommandFinished { output }),
                    // It certainly did not run.
                    Err(
                        e @ (sandbox::Error::NotFound(_)
                        | sandbox::Error::Refused(_)
                        | sandbox::Error::NotStarted(_)),
                    ) => Performed::Done(failed(e.to_string())),
                    Err(e) => {
                        tracing::warn!(run = %fixed.key, error = %e, "command outcome uncertain");
                        Performed::Uncertain
                    }
                }
            }
            Intent::PostRunAction {
                action: kind,
                config,
            } => {
                // What the run produced is saved before the action starts.
                if let SandboxState::Live(info) = replay.sandbox {
                    self.keep_workdir(&fixed.key, &info.id).await;
                }
                let seq = journal.last().map_or(0, |step| step.seq);
                Performed::Done(
                    self.post_run_action(fixed, run, journal, seq, kind, config)
                        .await,
                )
            }
            Intent::ReadMessage { .. } => Performed::Done(Outcome::MessageRead),
            Intent::Answer { .. } => Performed::Done(Outcome::Answered),
            Intent::DestroySandbox { id, .. } => {
                // Every run keeps its final working directory, among its results.
                self.keep_workdir(&fixed.key, id).await;
                match self
                    .sandbox_retrying(|| self.deps.sandbox.destroy(id))
                    .await
                {
                    Ok(()) => Performed::Done(Outcome::SandboxDestroyed),
                    Err(e) => Performed::Done(failed(e.to_string())),
                }
            }
        }
    }

    /// Resolves, with how the run ends, once the run is to end while one of its steps is
    /// under way: a cancellation recorded on it (a run deleted meanwhile counts as cancelled)
    /// or its time limit reached. Whether it ends is [`decide::ending`]'s answer; this only
    /// watches for the moment to ask: the run as stored now, each change to it, and the time
    /// limit. Never resolves otherwise.
    async fn ending(
        &self,
        fixed: &Fixed,
        spec: &crate::resource::AgentRunSpec,
        journal: &[Step],
        mut changes: tokio::sync::broadcast::Receiver<store_api::Change>,
    ) -> RunPhase {
        use tokio::sync::broadcast::error::RecvError;
        let clock = &self.deps.clock;
        let watch = async {
            let mut look = true;
            loop {
                if look {
                    let cancel = match self.deps.store.get(&fixed.key).await {
                        Ok(record) => typed::decode::<crate::resource::AgentRunSpec>(record)
                            .ok()
                            .and_then(|run| run.object.status.cancel_requested),
                        Err(store_api::Error::NotFound(_)) => {
                            Some(crate::lifecycle::CancelReason::CancelRequested)
                        }
                        // The store is unavailable: the command goes on, and the next change
                        // looks again.
                        Err(_) => None,
                    };
                    if let Some(end) = decide::ending(spec, journal, cancel, clock.now()) {
                        return end;
                    }
                }
                look = match changes.recv().await {
                    Ok(store_api::Change::Written(key, _) | store_api::Change::Deleted(key)) => {
                        key == fixed.key
                    }
                    Err(RecvError::Lagged(_)) => true,
                    Err(RecvError::Closed) => std::future::pending().await,
                };
            }
        };
        let limit = decide::time_limit(spec, journal);
        let timer = async {
            let Some((at, reason)) = limit else {
                return std::future::pending().await;
            };
            clock.sleep_until(at).await;
            RunPhase::Failed(reason)
        };
        tokio::select! {
            biased;
            end = watch => end,
            end = timer => end,
        }
    }

    async fn sandbox_retrying<T, F, Fut>(
        &self,
        mut call: F,
    ) -> std::result::Result<T, sandbox::Error>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = std::result::Result<T, sandbox::Error>>,
    {
        let mut attempt = 1;
        loop {
            match call().await {
                Err(e) if e.is_retryable() && attempt < self.config.attempts => {
                    attempt += 1;
                    self.deps.clock.sleep(self.config.retry_pause).await;
                }
                other => return other,
            }
        }
    }

    /// Put the run's working directory (`spec.workdir`) into its new sandbox. Repeating it
    /// after a crash is safe: no command has run in the sandbox yet.
    async fn stage_workdir(
        &self,
        fixed: &Fixed,
        run: &AgentRun,
        info: &sandbox::SandboxInfo,
    ) -> std::result::Result<(), String> {
        let Some(workdir) = &run.spec.workdir else {
            return Ok(());
        };
        // What was resolved when the run was created; a run created before snapshots were
        // kept reads its FileSets now.
        let tar = match &fixed.snapshot.workdir {
            Some(snapshot) => self.kept_input(&fixed.key, snapshot).await,
            None => self.workdir_archive(&fixed.project, workdir).await,
        }
        .map_err(|e| format!("staging the working directory: {e}"))?;
        self.sandbox_retrying(|| self.deps.sandbox.put_files(&info.id, tar.clone()))
            .await
            .map_err(|e| format!("staging the working directory: {e}"))
    }

    async fn route(
        &self,
        fixed: &Fixed,
        replay: &Replay<'_>,
        inbox: &[InboxMessage],
        turn: u32,
    ) -> Outcome {
        let agent = &fixed.snapshot.agent;
        let allowed: Vec<Family> = agent
            .model
            .families
            .clone()
            .unwrap_or_else(|| Family::ALL.to_vec());
        let (conversation, _) =
            replay.conversation(&fixed.first_prompt, inbox, agent.max_tool_calls);
        let prompt = match replay
            .turns
            .get(usize::try_from(turn).unwrap_or(usize::MAX))
            .map(|t| t.prompt)
        {
            Some(Prompt::Message(seq)) => inbox
                .iter()
                .find(|m| m.seq == seq)
                .map(|m| m.payload.clone())
                .unwrap_or_default(),
            _ => fixed.first_prompt.clone(),
        };
        let before = conversation.len().saturating_sub(1);
        let request = RouteRequest {
            prompt: &prompt,
            conversation: &conversation[..before],
            allowed: &allowed,
        };
        let clock = self.deps.clock.clone();
        let routed = tokio::select! {
            biased;
            routed = self.deps.router.route(&request) => routed.map_err(|e| e.to_string()),
            () = clock.sleep(self.config.router_timeout) => Err("the router timed out".to_string()),
        };
        let (family, chosen_by, cost_usd, usage, fallback_reason) = match routed {
            Ok(choice) if allowed.contains(&choice.family) => {
                let billed = match &choice.call {
                    None => Some(Usd::ZERO),
                    Some(call) => self
                        .deps
                        .catalog
                        .prices_of(&call.model)
                        .map(|prices| cost::bill(prices, &call.usage)),
                };
                match billed {
                    Some(cost_usd) => (
                        choice.family,
                        ChosenBy::Jev,
                        cost_usd,
                        choice.call.map(|c| c.usage),
                        None,
                    ),
                    None => (
                        fallback_family(&allowed),
                        ChosenBy::Fallback,
                        Usd::ZERO,
                        None,
                        Some("the router's model has no known price".to_string()),
                    ),
                }
            }
            Ok(choice) => (
                fallback_family(&allowed),
                ChosenBy::Fallback,
                Usd::ZERO,
                None,
                Some(format!(
                    "the router chose {}, which the agent does not allow",
                    choice.family
                )),
            ),
            Err(reason) => (
                fallback_family(&allowed),
                ChosenBy::Fallback,
                Usd::ZERO,
                None,
                Some(reason),
            ),
        };
        match self.deps.catalog.family(family) {
            Some(entry) => Outcome::Routed {
                family: Some(family),
                model: entry.model.clone(),
                chosen_by,
                cost_usd,
                usage,
                fallback_reason,
            },
            None => failed(format!(
                "the model catalog has no model for the family {family}"
            )),
        }
    }

    async fn call_model(
        &self,
        fixed: &Fixed,
        replay: &Replay<'_>,
        inbox: &[InboxMessage],
        model: &str,
        tools: bool,
    ) -> Performed {
        let agent: &AgentSpec = &fixed.snapshot.agent;
        let byok = agent.model.access == Access::Byok;
        let credentials = if byok {
            let secret = agent.model.api_key_secret.clone().unwrap_or_default();
            match self
                .deps
                .secrets
                .lookup(&fixed.project, &secret, API_KEY_SECRET_KEY)
                .await
            {
                Some(key) => Credentials::Byok(key),
                None => {
                    return Performed::Done(failed(format!(
                        "the Secret {secret:?} holds no {API_KEY_SECRET_KEY}"
                    )));
                }
            }
        } else {
            Credentials::Platform
        };
        let prices = if byok {
            None
        } else {
            match self.deps.catalog.prices_of(model) {
                Some(prices) => Some(*prices),
                None => {
                    return Performed::Done(failed(format!(
                        "the model {model} has no known price; platform access refuses it"
                    )));
                }
            }
        };
        let (messages, _) = replay.conversation(&fixed.first_prompt, inbox, agent.max_tool_calls);
        let request = ModelRequest {
            model: model.to_string(),
            system: fixed.system.clone(),
            messages,
            tools: vec![decide::shell_tool()],
            tool_choice: if tools {
                ToolChoice::Auto
            } else {
                ToolChoice::None
            },
            max_tokens: agent.max_tokens,
            credentials,
        };
        let mut attempt = 1;
        loop {
            match self.deps.model.complete(&request).await {
                Ok(response) => {
                    let cost_usd = prices.map_or(Usd::ZERO, |p| cost::bill(&p, &response.usage));
                    return Performed::Done(Outcome::ModelReplied { response, cost_usd });
                }
                Err(e) if e.kind == ErrorKind::Uncertain && byok => {
                    tracing::warn!(run = %fixed.key, error = %e, "BYOK model call outcome uncertain");
                    return Performed::Uncertain;
                }
                Err(e) if e.kind == ErrorKind::Uncertain && attempt < self.config.attempts => {
                    attempt += 1;
                    self.deps.clock.sleep(self.config.retry_pause).await;
                }
                Err(e) => return Performed::Done(failed(e.message)),
            }
        }
    }
}

/// The renewal loop never ends by itself; the select ends with the drive.
fn unreachable_renewal() -> Result<Driven> {
    Ok(Driven::TakenOver)
}

/// What a completed step cost: a model call's or a routing call's billed cost, else nothing.
fn cost_of(outcome: &Outcome) -> Usd {
    match outcome {
        Outcome::ModelReplied { cost_usd, .. } | Outcome::Routed { cost_usd, .. } => *cost_usd,
        _ => Usd::ZERO,
    }
}

fn failed(error: String) -> Outcome {
    Outcome::Failed {
        error,
        by_resolution: false,
    }
}

/// Sonnet when the agent allows it, otherwise its first allowed family.
fn fallback_family(allowed: &[Family]) -> Family {
    if allowed.contains(&Family::FALLBACK) {
        Family::FALLBACK
    } else {
        allowed.first().copied().unwrap_or(Family::FALLBACK)
    }
}

fn phase_of(run: &AgentRun) -> RunPhase {
    run.status
        .phase
        .unwrap_or(RunPhase::Pending(PendingReason::Queued))
}

/// The event that leads to `target`, if one does.
fn event_toward(target: RunPhase) -> Option<RunEvent> {
    Some(match target {
        RunPhase::Pending(reason) => RunEvent::Queue(reason),
        RunPhase::Running => return None,
        RunPhase::Waiting(reason) => RunEvent::Wait(reason),
        RunPhase::NeedsResolution => RunEvent::Park,
        RunPhase::Succeeded => RunEvent::Succeed,
        RunPhase::Failed(reason) => RunEvent::Fail(reason),
        RunPhase::Cancelled(reason) => RunEvent::Cancel(reason),
    })
}

/// Move `phase` to `target` through the lifecycle: directly when it allows, otherwise by
/// starting or resuming first. A move the lifecycle refuses is an error, never forced.
fn advance(phase: RunPhase, target: RunPhase) -> std::result::Result<RunPhase, TransitionRefused> {
    if phase == target {
        return Ok(phase);
    }
    let direct = event_toward(target).map(|event| phase.apply(event));
    if let Some(Ok(next)) = direct {
        return Ok(next);
    }
    let running = match phase {
        RunPhase::Pending(_) => phase.apply(RunEvent::Start)?,
        RunPhase::Waiting(_) => phase.apply(RunEvent::Resume)?,
        RunPhase::Running => phase,
        _ => {
            return Err(TransitionRefused {
                from: phase,
                event: event_toward(target).unwrap_or(RunEvent::Start),
            });
        }
    };
    match event_toward(target) {
        Some(event) => running.apply(event),
        None => Ok(running),
    }
}

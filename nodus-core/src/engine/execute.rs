//! The executor: asks the decider for the next move, journals the intent, carries the effect
//! out through the traits, journals the outcome, and writes the run's status.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use super::{Engine, Error, Result, run_uid, status, typed};
use crate::decide::{self, Decision, Effect, Facts, Key, Queued, RunInput};
use crate::journal::{Intent, Outcome, Step};
use crate::lifecycle::{RunPhase, WaitReason};
use crate::model::Credentials;
use crate::money::Usd;
use crate::replay::{Inherited, Replay, SandboxState};
use crate::resource::{Access, AgentRun, Kind, RunSnapshot};
use crate::router::RouteRequest;
use crate::sandbox::{self, ExecRequest, LiveOutput, SandboxSpec};
use crate::secret::SecretString;
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
    /// The replica drains ([`Engine::start_draining`]): the drive stopped between steps and
    /// gave the run's lease up, for another replica to continue.
    Released,
}

/// What a run needs that does not change while it is driven.
pub(super) struct Fixed {
    pub(super) key: ObjectKey,
    pub(super) uid: String,
    pub(super) project: String,
    snapshot: RunSnapshot,
    system: String,
    first_prompt: String,
    sandbox: SandboxSpec,
    /// What its spans say about it; `None` when no spans are wanted.
    spans: Option<crate::telemetry::RunContext>,
    /// The values its spans hide when they carry message content; `None`: no content.
    hidden: Option<crate::telemetry::Hidden>,
    /// Its group's name.
    group: Option<String>,
    /// Where it was forked from.
    pub(super) fork_of: Option<crate::resource::ForkOf>,
}

/// The versions of its run a drive saw: the highest it read or wrote, and the one it wrote
/// last.
#[derive(Debug, Default)]
pub(crate) struct Seen {
    highest: u64,
    written: Option<u64>,
}

impl Seen {
    fn read(&mut self, version: u64) {
        self.highest = self.highest.max(version);
    }

    fn wrote(&mut self, version: u64) {
        self.read(version);
        self.written = Some(version);
    }

    /// The version the drive wrote last, when it saw none later: each change of the run up
    /// to it was the drive's own or seen by it (a write is conditional on the version read),
    /// and its notification is still to come or came.
    fn own_write(&self) -> Option<u64> {
        self.written.filter(|written| *written == self.highest)
    }
}

impl Engine {
    /// Drive a run as far as it goes now: until it finishes, waits, parks, or is not admitted
    /// yet. Safe to call on any run at any time, after a crash included: completed steps are
    /// taken from the journal, never repeated. Only the [`Runner`](crate::runner::Runner)
    /// drives runs; tests drive by hand through [`testing::Drive`](crate::testing::Drive).
    #[cfg(any(test, feature = "test-util"))]
    pub(crate) async fn drive(&self, project: &str, name: &str) -> Result<Driven> {
        let run = self.read_run(project, name).await?;
        self.drive_seen(project, name, run, &mut Seen::default())
            .await
    }

    /// Drive a run as [`Engine::drive`] does, and say which group it is in, from the same
    /// read of the run (the runner looks at the group after): `Err` when the run cannot be
    /// read, else the group, how the drive went, and the version of the run the drive wrote
    /// last when nothing later was seen by it ([`Seen::own_write`]: changes up to it are the
    /// drive's or were seen by it).
    pub(crate) async fn drive_in_group(
        &self,
        project: &str,
        name: &str,
    ) -> Result<(Option<String>, Result<Driven>, Option<u64>)> {
        let run = self.read_run(project, name).await?;
        let group = run.object.spec.group.clone();
        let mut seen = Seen::default();
        let driven = self.drive_seen(project, name, run, &mut seen).await;
        Ok((group, driven, seen.own_write()))
    }

    /// Drive `run` as read, noting in `seen` the versions of it the drive reads and writes.
    async fn drive_seen(
        &self,
        project: &str,
        name: &str,
        run: Run,
        seen: &mut Seen,
    ) -> Result<Driven> {
        seen.read(run.version);
        let phase = phase_of(&run.object);
        if phase.is_finished() {
            return Ok(Driven::Finished(phase));
        }
        if run.object.spec.group.is_some() && matches!(phase, RunPhase::Pending(_)) {
            return match decide::queued(&run.object.spec, self.deps.clock.now()) {
                Queued::Expired(reason) => {
                    let key = ObjectKey::new(project, Kind::AgentRun, name);
                    self.end_queued(&key, phase, reason).await?;
                    // Failed now, or admitted meanwhile (its own loop then sees the deadline).
                    let again = self.read_run(project, name).await?;
                    Box::pin(self.drive_seen(project, name, again, seen)).await
                }
                Queued::Until(until) => Ok(Driven::NotAdmitted { until }),
            };
        }
        let mut fixed = self.fixed(project, &run.object)?;
        if fixed.spans.is_some() {
            fixed.hidden = self
                .hidden_in_spans(&fixed.key, fixed.snapshot.environment.as_ref())
                .await;
        }
        // No other task of this process writes the run meanwhile (a person's resolution).
        let _writing = self.writers.lock(&fixed.uid).await;
        let lease = self.lease();
        let fence = self.deps.store.claim(&fixed.uid, &lease).await?;
        self.hold(&fixed.uid, Some((fixed.key.clone(), fence)));
        let driven = self.drive_claimed(&fixed, fence, seen).await;
        self.hold(&fixed.uid, None);
        if !matches!(driven, Ok(Driven::Waiting { .. })) {
            self.last_snapshots.forget(&fixed.uid);
        }
        driven
    }

    /// Drive a run whose lease this drive holds under `fence`, and give the lease up after.
    async fn drive_claimed(&self, fixed: &Fixed, fence: Fence, seen: &mut Seen) -> Result<Driven> {
        // Watched from before the drive reads the run, so that what it holds (the run as it
        // last read or wrote it) is known to be current until a later version is notified.
        let watch = self.key_changes.watch(&self.deps.store, &fixed.key);
        let journal = match self.deps.store.journal(&fixed.uid).await {
            Ok(journal) => journal,
            Err(error) => {
                let _ = self.deps.store.release(&fixed.uid, fence).await;
                return Err(error.into());
            }
        };
        if journal.is_empty() && fixed.fork_of.is_none() {
            self.last_snapshots.none_yet(&fixed.uid);
        }
        // A fork's first drive copies the steps it inherits.
        let journal = match self.inherit(fixed, fence, journal).await {
            Ok(journal) => journal,
            Err(error) => {
                let _ = self.deps.store.release(&fixed.uid, fence).await;
                return Err(error);
            }
        };
        if let Err(error) = self.settle_last_charge(fixed, &journal).await {
            let _ = self.deps.store.release(&fixed.uid, fence).await;
            return Err(error);
        }
        // The journal is folded once; the loop adds each new step to the fold.
        let mut replay = match &fixed.fork_of {
            Some(fork) => Replay::forked(
                &journal,
                Inherited { through: fork.step },
                fork.input.clone(),
            ),
            None => Replay::of(&journal),
        };
        drop(journal);
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
            driven = self.drive_loop(fixed, fence, &mut replay, &watch, seen) => driven,
            () = renewing => unreachable_renewal(),
        };
        if !matches!(
            driven,
            Ok(Driven::TakenOver) | Err(Error::Store(store_api::Error::Fenced { .. }))
        ) {
            let _ = self.deps.store.release(&fixed.uid, fence).await;
        }
        if matches!(driven, Ok(Driven::Released)) {
            self.handed_over(&fixed.key).await;
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
        let system = crate::decide::system_prompt(project, run, &snapshot);
        let first_prompt = crate::decide::first_prompt(run, &snapshot);
        let sandbox = SandboxSpec {
            key: uid.clone(),
            image: crate::sandboxing::image(
                snapshot.image_digest.as_deref(),
                run.spec.image.as_deref(),
                self.config.default_image.as_deref(),
            ),
            env: super::environment::plain_env(snapshot.environment.as_ref()),
            limits: super::environment::limits_of(
                self.config.limits,
                snapshot.environment.as_ref(),
            ),
            network: false,
            egress: super::environment::egress_of(snapshot.environment.as_ref()),
            egress_headers: Vec::new(),
            links: Default::default(),
        };
        Ok(Fixed {
            key,
            uid,
            project: project.to_string(),
            snapshot,
            system,
            first_prompt,
            sandbox,
            spans: super::span_context(&self.deps, project, run),
            hidden: None,
            group: run.spec.group.clone(),
            fork_of: run.spec.fork_of.clone(),
        })
    }

    /// What the decider looks at, from the run as read and the fold of its journal.
    fn input<'a>(
        &'a self,
        fixed: &'a Fixed,
        run: &'a AgentRun,
        inbox: &'a [InboxMessage],
        replay: &'a Replay,
        now: jiff::Timestamp,
    ) -> RunInput<'a> {
        RunInput {
            agent: &fixed.snapshot.agent,
            spec: &run.spec,
            sandbox: &fixed.sandbox,
            system: &fixed.system,
            first_prompt: &fixed.first_prompt,
            replay,
            inbox,
            now,
            cancel: run.status.cancel_requested,
            close: run.status.close_requested,
            catalog: &self.deps.catalog,
            router_max_cost: self.deps.router.max_cost(),
            byok_secret_key: &self.config.byok_secret_key,
            facts: Facts::default(),
            post_run_action: fixed.snapshot.post_run_action.as_ref(),
        }
    }

    /// Ask the decider, and learn the facts its decision asks for: the BYOK key of a model
    /// call (looked up), and the project's credits for what the step reserves (reserved, so
    /// the reservation is held when the step is carried out). The decider decides again
    /// with each fact; the key, when looked up, is returned for the call.
    async fn decide(
        &self,
        fixed: &Fixed,
        mut input: RunInput<'_>,
    ) -> Result<(Decision, Option<SecretString>)> {
        let mut key = None;
        loop {
            let decision = decide::decide(&input);
            if decide::needs_key(&input, &decision) {
                key = self.byok_key(fixed).await;
                input.facts.key = if key.is_some() {
                    Key::Present
                } else {
                    Key::Missing
                };
                continue;
            }
            if !input.facts.funds_short
                && let Some((seq, amount)) = decide::charge(&input, &decision)
            {
                let ledger_key = reservation_key(fixed, seq);
                let covered = self
                    .retrying(|| {
                        self.deps
                            .ledger
                            .reserve(&fixed.project, &ledger_key, amount)
                    })
                    .await?;
                if !covered {
                    input.facts.funds_short = true;
                    continue;
                }
            }
            return Ok((decision, key));
        }
    }

    /// The key of a BYOK agent, as its Secret holds it now.
    async fn byok_key(&self, fixed: &Fixed) -> Option<SecretString> {
        let secret = fixed
            .snapshot
            .agent
            .model
            .api_key_secret
            .clone()
            .unwrap_or_default();
        self.deps
            .secrets
            .lookup(&fixed.project, &secret, &self.config.byok_secret_key)
            .await
    }

    async fn drive_loop(
        &self,
        fixed: &Fixed,
        fence: Fence,
        replay: &mut Replay,
        watch: &super::changes::KeyWatch,
        seen: &mut Seen,
    ) -> Result<Driven> {
        // The run as this loop last wrote it, with its inbox: while nobody else writes the run
        // (a message or a cancel request bumps its version, so the next status write is
        // refused and the loop reads again), there is nothing new to read.
        let mut known: Option<(Run, Vec<InboxMessage>)> = None;
        // The step journaled with the last outcome (decided then), and the phase it is
        // carried out in: carried out next, without deciding again.
        let mut journaled: Option<complete::Journaled> = None;
        // What the step before `journaled` reserved: settled while `journaled` is carried out.
        let mut unsettled: Option<complete::Unsettled> = None;
        loop {
            if journaled.is_none() && self.draining() {
                // Between steps: hand the run over (the drive gives its lease up). A step
                // journaled already is carried out first (its successor would find it open).
                return Ok(Driven::Released);
            }
            let (mut run, inbox) = match known.take() {
                Some(known) => known,
                None => {
                    let record = self.deps.store.get(&fixed.key).await?;
                    let run = typed::decode::<crate::resource::AgentRunSpec>(record)?;
                    let inbox = self.deps.store.inbox(&fixed.uid).await?;
                    seen.read(run.version);
                    (run, inbox)
                }
            };
            let phase = phase_of(&run.object);
            if phase.is_finished() {
                self.settle(fixed, unsettled.take()).await?;
                return Ok(Driven::Finished(phase));
            }
            let now = self.deps.clock.now();
            let (seq, target, key) = match journaled.take() {
                Some(journaled) => (journaled.seq, journaled.target, journaled.key),
                None => {
                    let (decision, key) = self
                        .decide(fixed, self.input(fixed, &run.object, &inbox, replay, now))
                        .await?;
                    // A decision that stops the run's work: the phase it leads to, written.
                    if let Some(target) = decide::phase_of(phase, &decision) {
                        let target = target?;
                        match self.write_status(fixed, &run, replay, target).await? {
                            Some(written) => seen.wrote(written.version),
                            None => continue,
                        }
                        return Ok(self.stopped(fixed, &run, replay, decision, target).await);
                    }
                    let (seq, target) = match decision {
                        Decision::Act(intent) => {
                            let target = decide::acting_phase(phase, &intent)?;
                            let seq = replay.steps;
                            let step = Step {
                                seq,
                                started_at: now,
                                intent,
                                completion: None,
                            };
                            let ends = matches!(step.intent, Intent::DestroySandbox { .. });
                            if ends || run.object.status.ending.is_some() {
                                // The run ends: say so in its status (`status.ending`) before the
                                // step is journaled, with a write conditional on the run as read. A
                                // message posted after that read bumped the version, so the write is
                                // refused and the run decides again with the message; one posted
                                // after the write is refused by send_message, which reads
                                // `status.ending` on the very version it posts against.
                                // A run whose status says it ends but decided otherwise (a crash came
                                // between that write and the journal's) says so first, the same way,
                                // so that it takes messages again.
                                let mut written = replay.clone();
                                if ends {
                                    written.apply(&step);
                                }
                                match self.write_status(fixed, &run, &written, phase).await? {
                                    Some(written) => {
                                        seen.wrote(written.version);
                                        run = written;
                                    }
                                    None => continue,
                                }
                            }
                            self.retrying(|| self.deps.store.append_step(&fixed.uid, fence, &step))
                                .await?;
                            replay.apply(&step);
                            (seq, target)
                        }
                        Decision::Refuse { intent, error } => {
                            let step = Step {
                                seq: replay.steps,
                                started_at: now,
                                intent,
                                completion: None,
                            };
                            self.retrying(|| self.deps.store.append_step(&fixed.uid, fence, &step))
                                .await?;
                            replay.apply(&step);
                            self.complete(
                                fixed,
                                fence,
                                replay,
                                &inbox,
                                step.seq,
                                decide::failed(error),
                            )
                            .await?;
                            continue;
                        }
                        Decision::Repeat(seq) => {
                            let Some(step) = replay.open(seq) else {
                                return Err(self.missing_step(fixed, seq));
                            };
                            (seq, decide::acting_phase(phase, &step.intent)?)
                        }
                        Decision::Abandon { seq, error } => {
                            self.complete(fixed, fence, replay, &inbox, seq, decide::failed(error))
                                .await?;
                            continue;
                        }
                        Decision::Park(_) | Decision::Wait { .. } | Decision::Finish(_) => {
                            // Handled above: each leads to a phase.
                            continue;
                        }
                    };
                    (seq, target, key)
                }
            };
            let Some(intent) = replay.open(seq).map(|s| s.intent.clone()) else {
                return Err(self.missing_step(fixed, seq));
            };
            let input = self.input(fixed, &run.object, &inbox, replay, now);
            let (effect, settled) = tokio::join!(
                self.perform(fixed, &input, &run, watch, &intent, key),
                self.settle(fixed, unsettled.take()),
            );
            let target = decide::phase_after(target, &effect)?;
            match effect {
                Effect::Done(outcome) => {
                    // The working directory after a command, kept before the step completes:
                    // a completed command step has its snapshot (or the reason it has none).
                    let snapshot = match (&intent, &outcome, &replay.sandbox) {
                        (
                            Intent::Command { .. },
                            Outcome::CommandFinished { .. },
                            SandboxState::Live(info),
                        ) => self.take_snapshot(fixed, &info.id, seq).await,
                        _ => None,
                    };
                    // The outcome and the status it leads to, in one write. A conflict here
                    // only means the document moved on; the next pass re-reads it and writes
                    // the status again.
                    let completed = self
                        .complete_then(
                            fixed,
                            fence,
                            replay,
                            &inbox,
                            seq,
                            outcome,
                            (&run, target),
                            snapshot,
                        )
                        .await?;
                    // The outcome is written first: a settle that failed ends the drive with
                    // the step it overlapped recorded.
                    settled?;
                    journaled = completed.next;
                    unsettled = completed.unsettled;
                    known = completed.run.map(|written| {
                        seen.wrote(written.version);
                        (written, inbox)
                    });
                    // A decision that stops the run's work, its phase written with the outcome.
                    if let (Some((decision, target)), Some((written, _))) =
                        (completed.stopped, &known)
                    {
                        return Ok(self.stopped(fixed, written, replay, decision, target).await);
                    }
                }
                Effect::Uncertain => {
                    settled?;
                    if let Some(written) = self.write_status(fixed, &run, replay, target).await? {
                        seen.wrote(written.version);
                        return Ok(Driven::Parked {
                            seq,
                            until: decide::time_limit(&run.object.spec, replay).map(|(at, _)| at),
                        });
                    }
                }
            }
        }
    }

    /// Where a decision that stops the run's work leaves it, once `target`, the phase it
    /// leads to, is written: the run's end exported when it finished, a waiting run's
    /// sandbox suspended when it waits for a person.
    async fn stopped(
        &self,
        fixed: &Fixed,
        run: &Run,
        replay: &Replay,
        decision: Decision,
        target: RunPhase,
    ) -> Driven {
        if target.is_finished() {
            self.run_ended(fixed, replay, target).await;
        }
        let until = decide::time_limit(&run.object.spec, replay).map(|(at, _)| at);
        match decision {
            Decision::Park(seq) => Driven::Parked { seq, until },
            Decision::Wait { reason, until } => {
                if crate::sandboxing::suspends_while(reason) {
                    self.suspend_sandbox(fixed, replay).await;
                }
                Driven::Waiting { reason, until }
            }
            _ => Driven::Finished(target),
        }
    }

    fn missing_step(&self, fixed: &Fixed, seq: u32) -> Error {
        Error::Corrupt {
            key: fixed.key.to_string(),
            message: format!("the decider named step {seq}, which is not the open step"),
        }
    }

    /// Export the span of a run that the status write just made finish (once: only the
    /// write that moves it to a finished phase, conditional on the version read, does). Its
    /// group is read for its uid, which the span links to.
    async fn run_ended(&self, fixed: &Fixed, replay: &Replay, phase: RunPhase) {
        let Some(ctx) = &fixed.spans else {
            return;
        };
        let group_uid = self.group_uid(&fixed.project, fixed.group.as_deref()).await;
        let now = self.deps.clock.now();
        let ended = crate::telemetry::Ended {
            start: replay.started_at.unwrap_or(now),
            end: now,
            phase: phase.name(),
            succeeded: phase == RunPhase::Succeeded,
            cost: replay.spent,
        };
        self.deps.spans.export(crate::telemetry::run_span(
            ctx,
            &ended,
            group_uid.as_deref(),
        ));
    }

    /// Settle the reservation of the last charged step that has an outcome, in case a crash
    /// came between journaling the outcome and settling (settling is idempotent, and a
    /// settled reservation writes nothing). Only the last one can be unsettled: a step's
    /// reservation is settled before the next charged step is decided (the step journaled
    /// with its outcome, which reserves nothing, may be carried out meanwhile).
    async fn settle_last_charge(&self, fixed: &Fixed, journal: &[Step]) -> Result<()> {
        let inherited = |seq: u32| fixed.fork_of.as_ref().is_some_and(|f| seq <= f.step);
        let last = journal.iter().rev().find_map(|step| {
            if inherited(step.seq) {
                // The source's: charged to it, never to this run.
                return None;
            }
            let completion = step.completion.as_ref()?;
            self.charge_of(fixed, &step.intent)?;
            Some((step.seq, cost_of(&completion.outcome)))
        });
        if let Some((seq, actual)) = last {
            let key = reservation_key(fixed, seq);
            self.retrying(|| self.deps.ledger.settle(&fixed.project, &key, actual))
                .await?;
        }
        Ok(())
    }

    /// What a step reserves against the project's credits ([`decide::charge_of`]).
    fn charge_of(&self, fixed: &Fixed, intent: &Intent) -> Option<Usd> {
        decide::charge_of(&fixed.snapshot.agent, self.deps.router.max_cost(), intent)
    }

    /// A run that waits for a message holds no process: its live sandbox is suspended (its
    /// working directory stays; the next command starts it again). A failure only costs the
    /// process it leaves running.
    async fn suspend_sandbox(&self, fixed: &Fixed, replay: &Replay) {
        if let SandboxState::Live(info) = &replay.sandbox
            && let Err(e) = self.deps.sandbox.suspend(&info.id).await
        {
            tracing::warn!(run = %fixed.key, error = %e, "cannot suspend the sandbox of a waiting run");
        }
    }

    /// Write the status projected from the journal with `phase`: the run as stored now, or
    /// `None` when the document changed since it was read (the caller looks again).
    async fn write_status(
        &self,
        fixed: &Fixed,
        run: &Run,
        replay: &Replay,
        phase: RunPhase,
    ) -> Result<Option<Run>> {
        let (object, document) = match self.status_document(fixed, run, replay, phase).await? {
            Projected::Same => return Ok(Some(run.clone())),
            Projected::Changed(object, document) => (object, document),
        };
        match self
            .retrying(|| {
                self.deps
                    .store
                    .update(&fixed.key, run.version, document.clone())
            })
            .await
        {
            Ok(record) => Ok(Some(written_run(*object, record.version))),
            Err(store_api::Error::Conflict { .. }) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// The run with the status projected from the journal with `phase`, and its document,
    /// unless that status is the one stored.
    async fn status_document(
        &self,
        fixed: &Fixed,
        run: &Run,
        replay: &Replay,
        phase: RunPhase,
    ) -> Result<Projected> {
        let mut status = status::project(
            &run.object.status,
            replay,
            phase,
            replay.started_at,
            self.deps.clock.now(),
        );
        if let Some(replica) = &self.config.replica {
            status.replica = Some(replica.clone());
        }
        if fixed.sandbox.egress.is_some() {
            status.egress = Some(self.egress_counts(&fixed.uid).await?);
        }
        if status == run.object.status {
            return Ok(Projected::Same);
        }
        let mut object = run.object.clone();
        object.status = status;
        let document = typed::encode(&fixed.key, &object)?;
        Ok(Projected::Changed(Box::new(object), document))
    }

    /// The counts of the egress journal of run `uid` (once what this process's proxy
    /// recorded so far is written).
    async fn egress_counts(&self, uid: &str) -> Result<crate::egress::EgressCounts> {
        let log = match &self.config.egress_journal {
            Some(journal) => journal.settled(uid).await?,
            None => crate::egress_log::read(self.deps.store.as_ref(), uid).await?,
        };
        Ok(log.counts)
    }

    /// Retry a store call while it fails in a way a retry can fix.
    pub(super) async fn retrying<T, F, Fut>(
        &self,
        mut call: F,
    ) -> std::result::Result<T, store_api::Error>
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

    /// Carry out a step's intent and report what happened, as the decider's pure functions
    /// read the raw result (a command's output or error, the router's or the model's
    /// answer).
    async fn perform(
        &self,
        fixed: &Fixed,
        input: &RunInput<'_>,
        held: &Run,
        watch: &super::changes::KeyWatch,
        intent: &Intent,
        key: Option<SecretString>,
    ) -> Effect {
        let replay = input.replay;
        let run = &held.object;
        match intent {
            Intent::CreateSandbox { spec } => {
                let environment = fixed.snapshot.environment.as_ref();
                let spec = match self.with_secrets(&fixed.key, environment, spec).await {
                    Ok(spec) => spec,
                    Err(error) => return Effect::Done(decide::failed(error)),
                };
                match self
                    .sandbox_retrying(|| self.deps.sandbox.create(&spec))
                    .await
                {
                    Ok(info) => {
                        let staged = self.stage_workdir(fixed, run, &info).await;
                        let (outcome, destroy) = crate::sandboxing::after_staging(info, staged);
                        if let Some(id) = destroy
                            && let Err(e) = self.deps.sandbox.destroy(&id).await
                        {
                            tracing::warn!(sandbox = %id, error = %e, "cannot remove a sandbox whose staging failed");
                        }
                        Effect::Done(outcome)
                    }
                    Err(e) => Effect::Done(decide::failed(e.to_string())),
                }
            }
            Intent::Route { turn } => Effect::Done(self.route(input, *turn).await),
            Intent::CallModel { model, tools, .. } => {
                self.call_model(fixed, input, model, *tools, key).await
            }
            Intent::Command { command, .. } => {
                let SandboxState::Live(info) = &replay.sandbox else {
                    return Effect::Done(decide::failed("the run has no sandbox".to_string()));
                };
                let request = ExecRequest {
                    command: command.clone(),
                    timeout: Duration::from_secs(self.config.limits.command_timeout_secs),
                    cwd: None,
                    output_cap: self.config.limits.output_cap_bytes,
                };
                // Watched from before the command starts, so no cancellation is missed.
                let changes = watch.again();
                let live: Arc<dyn LiveOutput> = Arc::new(super::live::CommandOutput {
                    followed: self.followed.clone(),
                    uid: fixed.uid.clone(),
                    seq: replay
                        .open_step
                        .as_ref()
                        .map_or(replay.steps.saturating_sub(1), |step| step.seq),
                });
                // The sandbox the command ran in when the run's own was lost and made again.
                let mut remade = None;
                let exec = async {
                    let mut attempt = 1;
                    loop {
                        let mut executed = self
                            .deps
                            .sandbox
                            .exec_live(&info.id, &request, live.clone())
                            .await;
                        if let Err(error) = &executed
                            && crate::sandboxing::recreates_after(error)
                        {
                            // A sandbox created before a restart, or on a Docker host that
                            // stopped answering: re-create it over its working directory
                            // (creation is idempotent by key; the backend places it) and run
                            // the command there.
                            let environment = fixed.snapshot.environment.as_ref();
                            executed = match self
                                .with_secrets(&fixed.key, environment, &fixed.sandbox)
                                .await
                            {
                                Err(error) => Err(sandbox::Error::Refused(error)),
                                Ok(spec) => match self.deps.sandbox.create(&spec).await {
                                    Ok(again) => {
                                        let ran = self
                                            .deps
                                            .sandbox
                                            .exec_live(&again.id, &request, live.clone())
                                            .await;
                                        remade = Some(again);
                                        ran
                                    }
                                    Err(e) => Err(e),
                                },
                            };
                        }
                        match executed {
                            Err(error)
                                if crate::sandboxing::starts_again(
                                    &error,
                                    attempt,
                                    self.config.attempts,
                                ) =>
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
                    end = self.ending(fixed, held, replay, changes) => {
                        tracing::info!(run = %fixed.key, ending = %end, "stopped a command: the run is ending");
                        return Effect::Done(Outcome::Stopped {
                            reason: format!("the run is ending ({end}); its processes were killed"),
                        });
                    }
                };
                if let Err(e) = &executed {
                    tracing::warn!(run = %fixed.key, error = %e, "command failed");
                }
                decide::command_effect(executed, remade)
            }
            Intent::PostRunAction {
                action: kind,
                config,
            } => {
                // What the run produced is saved before the action starts.
                if let SandboxState::Live(info) = &replay.sandbox {
                    self.keep_workdir(&fixed.key, &info.id).await;
                }
                let seq = replay
                    .open_step
                    .as_ref()
                    .map_or(replay.steps.saturating_sub(1), |step| step.seq);
                Effect::Done(
                    self.post_run_action(fixed, run, replay, seq, kind, config)
                        .await,
                )
            }
            Intent::ReadMessage { .. } => Effect::Done(Outcome::MessageRead),
            Intent::Answer { .. } => Effect::Done(Outcome::Answered),
            Intent::DestroySandbox { id, .. } => {
                // Every run keeps its final working directory, among its results.
                self.keep_workdir(&fixed.key, id).await;
                match self
                    .sandbox_retrying(|| self.deps.sandbox.destroy(id))
                    .await
                {
                    Ok(()) => Effect::Done(Outcome::SandboxDestroyed),
                    Err(e) => Effect::Done(decide::failed(e.to_string())),
                }
            }
        }
    }

    /// Resolves, with how the run ends, once the run is to end while one of its steps is
    /// under way: a cancellation recorded on it (a run deleted meanwhile counts as cancelled)
    /// or its time limit reached. Whether it ends is [`decide::ending`]'s answer; this only
    /// watches for the moment to ask: the run as the drive holds it (`held`, read or written
    /// after the drive's watch began), the run as stored at each change notified with a later
    /// version (the drive's own writes are not read again), and the time limit. Never
    /// resolves otherwise.
    async fn ending(
        &self,
        fixed: &Fixed,
        held: &Run,
        replay: &Replay,
        mut changes: super::changes::KeyWatch,
    ) -> RunPhase {
        let clock = &self.deps.clock;
        let spec = &held.object.spec;
        let watch = async {
            let mut read = held.version;
            let mut cancel = held.object.status.cancel_requested;
            loop {
                if changes.notified() > read {
                    match self.deps.store.get(&fixed.key).await {
                        Ok(record) => {
                            read = record.version;
                            cancel = typed::decode::<crate::resource::AgentRunSpec>(record)
                                .ok()
                                .and_then(|run| run.object.status.cancel_requested);
                        }
                        Err(store_api::Error::NotFound(_)) => {
                            read = u64::MAX;
                            cancel = Some(crate::lifecycle::CancelReason::CancelRequested);
                        }
                        // The store is unavailable: the command goes on, and the next change
                        // looks again.
                        Err(_) => cancel = None,
                    }
                }
                if let Some(end) = decide::ending(spec, replay, cancel, clock.now()) {
                    return end;
                }
                // A change of the run, or notifications lost: look again.
                changes.changed().await;
            }
        };
        let limit = decide::time_limit(spec, replay);
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

    pub(super) async fn sandbox_retrying<T, F, Fut>(
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
        if let Some(fork) = &fixed.fork_of {
            // A fork starts from the snapshot after the step it was forked at.
            return self
                .restore_fork(fixed, fork, &info.id)
                .await
                .map_err(|e| format!("restoring the forked working directory: {e}"));
        }
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

    /// Ask the router for the turn's family, within the router's time; what its answer
    /// means is [`decide::routed`]'s.
    async fn route(&self, input: &RunInput<'_>, turn: u32) -> Outcome {
        let allowed = decide::allowed_families(input.agent);
        let (prompt, conversation) = decide::route_prompt(input, turn);
        let request = RouteRequest {
            prompt: &prompt,
            conversation: &conversation,
            allowed: &allowed,
        };
        let clock = self.deps.clock.clone();
        let answer = tokio::select! {
            biased;
            routed = self.deps.router.route(&request) => routed.map_err(|e| e.to_string()),
            () = clock.sleep(self.config.router_timeout) => Err("the router timed out".to_string()),
        };
        decide::routed(input, answer)
    }

    /// Call the model with the request the decider builds, again while a lost reply may be
    /// asked for again; what the answer means is [`decide::model_effect`]'s.
    async fn call_model(
        &self,
        fixed: &Fixed,
        input: &RunInput<'_>,
        model: &str,
        tools: bool,
        key: Option<SecretString>,
    ) -> Effect {
        let credentials = match (input.agent.model.access, key) {
            (Access::Byok, Some(key)) => Credentials::Byok(key),
            (Access::Byok, None) => {
                // The decider asks for the key before every BYOK call it decides.
                return Effect::Done(decide::failed(
                    "the agent's key was not looked up before the call".to_string(),
                ));
            }
            (Access::Nodus, _) => Credentials::Platform,
        };
        let request = decide::model_request(input, model, tools, credentials);
        let mut attempt = 1;
        loop {
            let answer = self.deps.model.complete(&request).await;
            let failure = answer.as_ref().err().map(ToString::to_string);
            match decide::model_effect(input, model, answer, attempt < self.config.attempts) {
                Some(Effect::Uncertain) => {
                    tracing::warn!(run = %fixed.key, error = failure.unwrap_or_default(), "BYOK model call outcome uncertain");
                    return Effect::Uncertain;
                }
                Some(effect) => return effect,
                None => {
                    attempt += 1;
                    self.deps.clock.sleep(self.config.retry_pause).await;
                }
            }
        }
    }
}

/// A run's status as projected against the one stored.
enum Projected {
    /// The same: nothing to write.
    Same,
    /// Changed: the run with it, and its document.
    Changed(Box<AgentRun>, serde_json::Value),
}

/// The run as a status write stored it, at `version`.
/// The ledger's key for what step `seq` of the run reserves (`<run uid>/<step>`).
fn reservation_key(fixed: &Fixed, seq: u32) -> String {
    format!("{}/{seq}", fixed.uid)
}

fn written_run(mut object: AgentRun, version: u64) -> Run {
    object.metadata.resource_version = Some(version.to_string());
    Run { object, version }
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

fn phase_of(run: &AgentRun) -> RunPhase {
    run.status.current_phase()
}

mod complete;

#[cfg(test)]
#[path = "execute_tests.rs"]
mod tests;

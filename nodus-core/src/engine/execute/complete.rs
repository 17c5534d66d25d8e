//! Journaling a step's outcome: the completion, the span of the step, the settling of what
//! it reserved, and with it (one store write, [`Store::complete_step_with`]) the run's status
//! that the outcome leads to and, when the run acts next, that next step's intent (or, when
//! it stops its work, the phase it stops in): a step then costs one write from its outcome
//! to its successor's intent, not two, and a run's last outcome and its end are one write. The next step
//! is decided as the drive's next pass would (its key looked up, what it reserves reserved),
//! except that of two charged steps in a row the second is left to that pass: a reservation
//! is settled before the next one is made.
//!
//! [`Store::complete_step_with`]: crate::store::Store::complete_step_with

use super::{Fixed, Projected, Run, cost_of, reservation_key, written_run};
use crate::decide::{self, Decision};
use crate::engine::snapshots::KeptWithOutcome;
use crate::engine::{Engine, Result};
use crate::journal::{Completion, Intent, Outcome, Step};
use crate::lifecycle::RunPhase;
use crate::money::Usd;
use crate::replay::Replay;
use crate::secret::SecretString;
use crate::store::{self as store_api, Fence, InboxMessage, WithOutcome};

/// What journaling an outcome with the run's status left.
pub(super) struct Completed {
    /// The run as stored after the write; `None` when the document changed since it was
    /// read (the caller looks again).
    pub(super) run: Option<Run>,
    /// The next step, journaled in the same write: the caller carries it out without
    /// deciding again.
    pub(super) next: Option<Journaled>,
    /// What the finished step reserved, when the next step was journaled: the caller
    /// settles it ([`Engine::settle`]) before it decides again, while it carries the next
    /// step out (a crash before that is settled by the next drive: the finished step is
    /// the last charged one with an outcome).
    pub(super) unsettled: Option<Unsettled>,
    /// The decision that stops the run's work (it finishes, waits or parks), decided on
    /// the fold with the outcome, and the phase it leads to, written with the outcome: set
    /// only when the status was written.
    pub(super) stopped: Option<(Decision, RunPhase)>,
}

/// What the run does after the outcome, decided on the fold with it.
enum After {
    /// Acts: the next step, journaled with the outcome.
    Act(Next),
    /// Stops its work: the decision and the phase it leads to, written with the outcome.
    Stop(Decision, RunPhase),
    /// Left to the drive's next pass.
    Later,
}

/// A step's reservation and what the step cost.
pub(super) struct Unsettled {
    key: String,
    actual: Usd,
}

/// A step journaled, to be carried out without deciding again.
pub(super) struct Journaled {
    pub(super) seq: u32,
    /// The phase the run is in while it is carried out.
    pub(super) target: RunPhase,
    /// The BYOK key of a model call, looked up when it was decided.
    pub(super) key: Option<SecretString>,
}

/// A next step decided on the fold with an outcome, to be journaled with it.
struct Next {
    step: Step,
    /// The phase the run is in while it is carried out.
    target: RunPhase,
    /// It ends the run (deleting its sandbox): the status written with it says so.
    ends: bool,
    key: Option<SecretString>,
    /// What it reserved, under which ledger key: released if it is not journaled.
    reserved: Option<String>,
}

impl Engine {
    /// Journal the outcome of the open step `seq`, fold it, and settle what it reserved.
    pub(super) async fn complete(
        &self,
        fixed: &Fixed,
        fence: Fence,
        replay: &mut Replay,
        inbox: &[InboxMessage],
        seq: u32,
        outcome: Outcome,
    ) -> Result<()> {
        let (mut step, completion, charged) = self.completion(fixed, replay, seq, outcome)?;
        let span = self.completed_span(fixed, replay, inbox, &step, &completion);
        self.retrying(|| {
            self.deps
                .store
                .complete_step(&fixed.uid, fence, seq, &completion)
        })
        .await?;
        let actual = cost_of(&completion.outcome);
        step.completion = Some(completion);
        replay.apply(&step);
        let unsettled = self.completed(fixed, seq, actual, span, charged);
        self.settle(fixed, unsettled).await
    }

    /// [`Engine::complete`] with the status projected from the journal with the step's
    /// outcome and `phase` ([`Engine::write_status`]), the snapshot after the step when
    /// given, and the run's next step when it can be decided now ([`Completed`]), in one
    /// store write.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn complete_then(
        &self,
        fixed: &Fixed,
        fence: Fence,
        replay: &mut Replay,
        inbox: &[InboxMessage],
        seq: u32,
        outcome: Outcome,
        (run, phase): (&Run, RunPhase),
        snapshot: Option<KeptWithOutcome>,
    ) -> Result<Completed> {
        let (mut step, completion, charged) = self.completion(fixed, replay, seq, outcome)?;
        let span = self.completed_span(fixed, replay, inbox, &step, &completion);
        // The status and the next step are decided on the fold with the outcome; the
        // outcome is folded first (an error below ends the drive, and the fold with it). A
        // charged step's reservation is settled before its successor is decided.
        step.completion = Some(completion.clone());
        replay.apply(&step);
        let (next, stop) = match self
            .after_outcome(fixed, run, inbox, replay, phase, charged)
            .await?
        {
            After::Act(next) => (Some(next), None),
            After::Stop(decision, target) => (None, Some((decision, target))),
            After::Later => (None, None),
        };
        // The phase the status says: the one a stopping decision leads to, or the acting one.
        let status_phase = stop.as_ref().map_or(phase, |(_, target)| *target);
        // A step that ends the run is journaled with a status that says so.
        let ending = next.as_ref().filter(|next| next.ends).map(|next| {
            let mut ending = replay.clone();
            ending.apply(&next.step);
            ending
        });
        let (object, then) = match self
            .status_document(fixed, run, ending.as_ref().unwrap_or(replay), status_phase)
            .await?
        {
            Projected::Same => (None, None),
            Projected::Changed(object, document) => (
                Some(object),
                Some(store_api::DocumentWrite {
                    key: fixed.key.clone(),
                    expected_version: run.version,
                    document,
                }),
            ),
        };
        let with = WithOutcome {
            snapshot: snapshot.as_ref().map(|s| &s.stored),
            then: then.as_ref(),
            next: next.as_ref().map(|next| &next.step),
        };
        let written = self
            .retrying(|| {
                self.deps
                    .store
                    .complete_step_with(&fixed.uid, fence, seq, &completion, with)
            })
            .await?;
        if let Some(snapshot) = snapshot {
            self.kept_with_outcome(&fixed.uid, seq, snapshot);
        }
        let run = match (written.document, object) {
            (None, _) => Some(run.clone()),
            (Some(Ok(record)), Some(object)) => Some(written_run(*object, record.version)),
            (Some(Ok(_)), None) => {
                return Err(store_api::Error::Corrupt(
                    "a document write answered for no document".to_string(),
                )
                .into());
            }
            (Some(Err(store_api::Error::Conflict { .. })), _) => None,
            // The outcome is recorded; the status alone again, as any (no next step was
            // journaled: it is decided again).
            (Some(Err(e)), _) if e.is_retryable() => {
                self.write_status(fixed, run, replay, status_phase).await?
            }
            (Some(Err(e)), _) => return Err(e.into()),
        };
        let next = match (next, written.next) {
            (Some(next), Some(Ok(()))) => {
                replay.apply(&next.step);
                Some(Journaled {
                    seq: next.step.seq,
                    target: next.target,
                    key: next.key,
                })
            }
            (next, answer) => {
                // Not journaled (the status was refused, or a store that appends apart failed
                // in a way a retry fixes): the next pass decides again, and what the step
                // reserved is given back first.
                if let Some(reserved) = next.and_then(|next| next.reserved) {
                    self.retrying(|| {
                        self.deps
                            .ledger
                            .settle(&fixed.project, &reserved, Usd::ZERO)
                    })
                    .await?;
                }
                match answer {
                    Some(Err(e)) if !e.is_retryable() => return Err(e.into()),
                    _ => None,
                }
            }
        };
        let unsettled = self.completed(fixed, seq, cost_of(&completion.outcome), span, charged);
        // With a next step journaled (which reserves nothing: of two charged steps the second
        // waits), the caller settles while it carries that step out; otherwise now.
        let unsettled = match next {
            Some(_) => unsettled,
            None => {
                self.settle(fixed, unsettled).await?;
                None
            }
        };
        // A stopping decision holds when its phase was written (the run as stored).
        let stopped = stop.filter(|_| run.is_some());
        Ok(Completed {
            run,
            next,
            unsettled,
            stopped,
        })
    }

    /// The completion of the open step `seq` with `outcome`, the step, and whether it was
    /// charged.
    fn completion(
        &self,
        fixed: &Fixed,
        replay: &Replay,
        seq: u32,
        outcome: Outcome,
    ) -> Result<(Step, Completion, bool)> {
        let Some(step) = replay.open(seq).cloned() else {
            return Err(self.missing_step(fixed, seq));
        };
        let charged = self.charge_of(fixed, &step.intent).is_some();
        let completion = Completion {
            finished_at: self.deps.clock.now(),
            outcome,
        };
        Ok((step, completion, charged))
    }

    /// The span of a step completed with `completion`, read from the fold before the
    /// outcome.
    fn completed_span(
        &self,
        fixed: &Fixed,
        replay: &Replay,
        inbox: &[InboxMessage],
        step: &Step,
        completion: &Completion,
    ) -> Option<crate::telemetry::Span> {
        let ctx = fixed.spans.as_ref()?;
        let mut completed = step.clone();
        completed.completion = Some(completion.clone());
        self.step_span(ctx, fixed, replay, inbox, &completed)
    }

    /// Once the outcome is written (and folded): export the step's span, and say what the
    /// step reserved, if it did, to be settled to `actual`.
    fn completed(
        &self,
        fixed: &Fixed,
        seq: u32,
        actual: Usd,
        span: Option<crate::telemetry::Span>,
        charged: bool,
    ) -> Option<Unsettled> {
        if let Some(span) = span {
            self.deps.spans.export(span);
        }
        charged.then(|| Unsettled {
            key: reservation_key(fixed, seq),
            actual,
        })
    }

    /// Settle a step's reservation to what it cost (nothing to do for `None`).
    pub(super) async fn settle(&self, fixed: &Fixed, unsettled: Option<Unsettled>) -> Result<()> {
        if let Some(Unsettled { key, actual }) = unsettled {
            self.retrying(|| self.deps.ledger.settle(&fixed.project, &key, actual))
                .await?;
        }
        Ok(())
    }

    /// What the run does after the outcome, decided on the fold with it as the drive's next
    /// pass would decide on the run as written (a next step's key looked up, what it
    /// reserves reserved): its next step, or a decision that stops its work and the phase it
    /// leads to; left to that pass when the replica drains (the run is handed over before
    /// its next step), when both the finished step (`charged`) and the next one reserve (the
    /// finished one is settled first), or when the decision is one that pass carries out (a
    /// step repeated, refused or abandoned) or refuses.
    async fn after_outcome(
        &self,
        fixed: &Fixed,
        run: &Run,
        inbox: &[InboxMessage],
        replay: &Replay,
        phase: RunPhase,
        charged: bool,
    ) -> Result<After> {
        if self.draining() {
            // The drive hands the run over before its next step: nothing is journaled ahead.
            return Ok(After::Later);
        }
        let now = self.deps.clock.now();
        // The status written with the outcome changes nothing the decider reads of the run
        // (its spec, its cancel and close requests).
        let input = || self.input(fixed, &run.object, inbox, replay, now);
        if charged {
            let pure = input();
            if decide::charge(&pure, &decide::decide(&pure)).is_some() {
                return Ok(After::Later);
            }
        }
        let (decision, key) = self.decide(fixed, input()).await?;
        match decide::phase_of(phase, &decision) {
            Some(Ok(target)) => return Ok(After::Stop(decision, target)),
            Some(Err(_)) => return Ok(After::Later),
            None => {}
        }
        let Decision::Act(intent) = decision else {
            return Ok(After::Later);
        };
        let seq = replay.steps;
        let reserved = self
            .charge_of(fixed, &intent)
            .map(|_| reservation_key(fixed, seq));
        let Ok(target) = decide::acting_phase(phase, &intent) else {
            // The next pass refuses the transition (an error for the drive), not this one.
            if let Some(reserved) = &reserved {
                self.retrying(|| self.deps.ledger.settle(&fixed.project, reserved, Usd::ZERO))
                    .await?;
            }
            return Ok(After::Later);
        };
        let ends = matches!(intent, Intent::DestroySandbox { .. });
        Ok(After::Act(Next {
            step: Step {
                seq,
                started_at: now,
                intent,
                completion: None,
            },
            target,
            ends,
            key,
            reserved,
        }))
    }

    /// The span of a completed step, with what a model call was sent read from `replay`
    /// (the fold before the step's outcome) and the inbox, as the request was built.
    fn step_span(
        &self,
        ctx: &crate::telemetry::RunContext,
        fixed: &Fixed,
        replay: &Replay,
        inbox: &[InboxMessage],
        step: &Step,
    ) -> Option<crate::telemetry::Span> {
        let sent = match (&fixed.hidden, &step.intent) {
            (Some(_), Intent::CallModel { .. }) => Some(replay.conversation(
                &fixed.first_prompt,
                inbox,
                fixed.snapshot.agent.max_tool_calls,
            )),
            _ => None,
        };
        let disclosure = fixed
            .hidden
            .as_ref()
            .map(|hidden| crate::telemetry::Disclosure {
                system: &fixed.system,
                sent: sent.as_ref(),
                hidden,
            });
        crate::telemetry::step_span(ctx, step, disclosure.as_ref())
    }
}

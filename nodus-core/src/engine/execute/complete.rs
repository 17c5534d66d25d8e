//! Journaling a step's outcome: the completion, the span of the step, the settling of what
//! it reserved, and with it (one store write, [`Store::complete_step_then`]) the run's status
//! that the outcome leads to.
//!
//! [`Store::complete_step_then`]: crate::store::Store::complete_step_then

use super::{Fixed, Projected, Run, cost_of, written_run};
use crate::engine::snapshots::KeptWithOutcome;
use crate::engine::{Engine, Result};
use crate::journal::{Completion, Intent, Outcome, Step};
use crate::lifecycle::RunPhase;
use crate::replay::Replay;
use crate::snapshot::Stored;
use crate::store::{self as store_api, Fence, InboxMessage};

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
        self.complete_then(fixed, fence, replay, inbox, seq, outcome, None, None)
            .await
            .map(drop)
    }

    /// [`Engine::complete`], and with `status`, the status projected from the journal with
    /// the step's outcome and that phase ([`Engine::write_status`]) written in the same
    /// store write: the run as stored then, or `None` when no status was asked for or the
    /// document changed since it was read (the caller looks again).
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn complete_then(
        &self,
        fixed: &Fixed,
        fence: Fence,
        replay: &mut Replay,
        inbox: &[InboxMessage],
        seq: u32,
        outcome: Outcome,
        status: Option<(&Run, RunPhase)>,
        snapshot: Option<KeptWithOutcome>,
    ) -> Result<Option<Run>> {
        let Some(mut step) = replay.open(seq).cloned() else {
            return Err(self.missing_step(fixed, seq));
        };
        let charged = self.charge_of(fixed, &step.intent).is_some();
        let actual = cost_of(&outcome);
        let completion = Completion {
            finished_at: self.deps.clock.now(),
            outcome,
        };
        // What the step's span shows is read from the fold before the outcome.
        let span = fixed.spans.as_ref().map(|ctx| {
            let mut completed = step.clone();
            completed.completion = Some(completion.clone());
            self.step_span(ctx, fixed, replay, inbox, &completed)
        });
        // The snapshot after the step, kept with its outcome.
        let kept = snapshot.as_ref().map(|s| &s.stored);
        let written = match status {
            None => {
                self.outcome_alone(fixed, fence, seq, &completion, kept)
                    .await?;
                step.completion = Some(completion);
                replay.apply(&step);
                None
            }
            Some((run, phase)) => {
                // The status is projected from the fold with the outcome: folded first (an
                // error below ends the drive, and the fold with it).
                step.completion = Some(completion.clone());
                replay.apply(&step);
                match self.status_document(fixed, run, replay, phase).await? {
                    // Unchanged: the outcome alone.
                    Projected::Same => {
                        self.outcome_alone(fixed, fence, seq, &completion, kept)
                            .await?;
                        Some(run.clone())
                    }
                    Projected::Changed(object, document) => {
                        let then = store_api::DocumentWrite {
                            key: fixed.key.clone(),
                            expected_version: run.version,
                            document,
                        };
                        let updated = match kept {
                            None => {
                                self.retrying(|| {
                                    self.deps.store.complete_step_then(
                                        &fixed.uid,
                                        fence,
                                        seq,
                                        &completion,
                                        then.clone(),
                                    )
                                })
                                .await?
                            }
                            Some(stored) => self
                                .retrying(|| {
                                    self.deps.store.complete_step_kept(
                                        &fixed.uid,
                                        fence,
                                        seq,
                                        &completion,
                                        stored,
                                        Some(then.clone()),
                                    )
                                })
                                .await?
                                .ok_or_else(|| {
                                    store_api::Error::Corrupt(
                                        "a document write answered without its document"
                                            .to_string(),
                                    )
                                })?,
                        };
                        match updated {
                            Ok(record) => Some(written_run(*object, record.version)),
                            Err(store_api::Error::Conflict { .. }) => None,
                            // The outcome is recorded; the status alone again, as any.
                            Err(e) if e.is_retryable() => {
                                self.write_status(fixed, run, replay, phase).await?
                            }
                            Err(e) => return Err(e.into()),
                        }
                    }
                }
            }
        };
        if let Some(snapshot) = snapshot {
            self.kept_with_outcome(&fixed.uid, seq, snapshot);
        }
        if let Some(Some(span)) = span {
            self.deps.spans.export(span);
        }
        if charged {
            let key = format!("{}/{seq}", fixed.uid);
            self.retrying(|| self.deps.ledger.settle(&fixed.project, &key, actual))
                .await?;
        }
        Ok(written)
    }

    /// The outcome of step `seq` without a document, with the snapshot after it when given.
    async fn outcome_alone(
        &self,
        fixed: &Fixed,
        fence: Fence,
        seq: u32,
        completion: &Completion,
        kept: Option<&Stored>,
    ) -> Result<()> {
        match kept {
            None => {
                self.retrying(|| {
                    self.deps
                        .store
                        .complete_step(&fixed.uid, fence, seq, completion)
                })
                .await?
            }
            Some(stored) => {
                self.retrying(|| {
                    self.deps
                        .store
                        .complete_step_kept(&fixed.uid, fence, seq, completion, stored, None)
                })
                .await?;
            }
        }
        Ok(())
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

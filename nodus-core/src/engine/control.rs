//! A person's control of a run: messages, cancel (answered once the run has ended, as the API
//! and the console both do), close, and waiting for a run to finish.

use std::time::Duration;

use jiff::Timestamp;

use super::{Engine, Error, Result, run_uid, typed};
use crate::lifecycle::{CancelReason, RunPhase};
use crate::resource::{AgentRun, Kind};
use crate::store::{Delivery, ObjectKey};
use crate::validate::{self, Invalid};

/// How long a cancel waits for the run to end before it answers with the run as it is.
pub const CANCEL_WAIT: Duration = Duration::from_secs(10);

impl Engine {
    /// Send a message to a run. A repeated `key` delivers once (the same key with another
    /// payload is refused, naming `messageKey`); a finished run, or one deleting its sandbox
    /// to end, refuses with `AgentRunFinished`; a run that is working reads it after its
    /// current turn.
    pub async fn send_message(
        &self,
        project: &str,
        name: &str,
        payload: &str,
        key: Option<&str>,
    ) -> Result<Delivery> {
        validate::check_message("payload", payload)?;
        if let Some(key) = key {
            validate::check_message_key(key)?;
        }
        loop {
            let run = self.read_run(project, name).await?;
            let object_key = ObjectKey::new(project, Kind::AgentRun, name);
            // A run that is ending (deleting its sandbox) reads no more messages either:
            // refused like a finished run's, rather than answered delivered and never read.
            // The executor writes `status.ending` before it journals the ending, and the
            // message is posted conditional on the version read here: either this version
            // says the run is ending, or the executor's write comes after the post and is
            // refused, and the run decides again with the message.
            if let Some(phase) = run.object.status.refuses_messages() {
                // A repeat of a message the run already had is still answered as a repeat.
                if let Some(key) = key {
                    let inbox = self.deps.store.inbox(run_uid(&run.object)).await?;
                    if let Some(message) = inbox.iter().find(|m| m.key.as_deref() == Some(key)) {
                        // The retention sweep may have removed the first payload: then a
                        // repeat cannot be told from another message, and answers as one.
                        if run.object.status.payloads_removed_at.is_none() {
                            check_same_message(message, payload, key)?;
                        }
                        return Ok(Delivery::Duplicate(message.seq));
                    }
                }
                return Err(Error::AgentRunFinished {
                    run: name.to_string(),
                    phase,
                });
            }
            match self
                .deps
                .store
                .post_message(
                    &object_key,
                    run.version,
                    key,
                    payload,
                    self.deps.clock.now(),
                )
                .await
            {
                Err(crate::store::Error::Conflict { .. }) => continue,
                Ok(Delivery::Duplicate(seq)) => {
                    let key = key.unwrap_or_default();
                    let inbox = self.deps.store.inbox(run_uid(&run.object)).await?;
                    if let Some(message) = inbox.iter().find(|m| m.seq == seq) {
                        check_same_message(message, payload, key)?;
                    }
                    return Ok(Delivery::Duplicate(seq));
                }
                other => return Ok(other?),
            }
        }
    }

    /// Record that a run is to be cancelled: a run that has not started is cancelled at
    /// once; the [`Runner`](crate::runner::Runner) stops a started one's command and deletes its
    /// sandbox. A finished run refuses with `AgentRunFinished`.
    pub async fn cancel_run(&self, project: &str, name: &str) -> Result<AgentRun> {
        if !self
            .request_cancel(project, name, CancelReason::CancelRequested)
            .await?
        {
            let run = self.get_run(project, name).await?;
            return Err(Error::AgentRunFinished {
                run: name.to_string(),
                phase: run.status.phase.unwrap_or(RunPhase::Succeeded),
            });
        }
        self.get_run(project, name).await
    }

    /// Close a keepAlive conversation: the run answers its current turn (and the messages
    /// that came before), then succeeds and deletes its sandbox instead of waiting for more
    /// messages; the [`Runner`](crate::runner::Runner) carries it out. A run that is not
    /// keepAlive finishes after its turn anyway; closing it changes nothing. A finished run
    /// refuses with `AgentRunFinished`.
    pub async fn close_run(&self, project: &str, name: &str) -> Result<AgentRun> {
        loop {
            let mut run = self.read_run(project, name).await?;
            let phase = run.object.status.current_phase();
            if phase.is_finished() {
                return Err(Error::AgentRunFinished {
                    run: name.to_string(),
                    phase,
                });
            }
            if run.object.status.close_requested {
                return Ok(run.object);
            }
            run.object.status.close_requested = true;
            let key = ObjectKey::new(project, Kind::AgentRun, name);
            match self
                .deps
                .store
                .update(&key, run.version, typed::encode(&key, &run.object)?)
                .await
            {
                Err(crate::store::Error::Conflict { .. }) => continue,
                Err(e) => return Err(e.into()),
                Ok(record) => return Ok(typed::decode(record)?.object),
            }
        }
    }

    /// The run once it has finished, or as it is when `timeout` has passed on the engine's
    /// clock: for an API that records a cancellation and answers once the runner has carried
    /// it out (a running
    /// command is stopped at once, so that is soon unless another replica is slow to see it).
    pub async fn finished_run(
        &self,
        project: &str,
        name: &str,
        timeout: Duration,
    ) -> Result<AgentRun> {
        let mut changes = self.deps.store.subscribe();
        let key = ObjectKey::new(project, Kind::AgentRun, name);
        let clock = self.deps.clock.clone();
        let until = clock
            .now()
            .checked_add(
                jiff::SignedDuration::try_from(timeout).unwrap_or(jiff::SignedDuration::MAX),
            )
            .unwrap_or(Timestamp::MAX);
        let give_up = clock.sleep_until(until);
        tokio::pin!(give_up);
        loop {
            let run = self.get_run(project, name).await?;
            if run.status.phase.is_some_and(RunPhase::is_finished) {
                return Ok(run);
            }
            let changed = async {
                loop {
                    match changes.recv().await {
                        Ok(crate::store::Change::Written(changed, _))
                        | Ok(crate::store::Change::Deleted(changed))
                            if changed == key =>
                        {
                            return;
                        }
                        Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => return,
                        Err(tokio::sync::broadcast::error::RecvError::Closed) => {
                            std::future::pending::<()>().await;
                        }
                        Ok(_) => {}
                    }
                }
            };
            tokio::select! {
                biased;
                () = changed => {}
                () = &mut give_up => return Ok(run),
            }
        }
    }

    /// Cancel a run ([`Engine::cancel_run`]), then answer once the
    /// [`Runner`](crate::runner::Runner) has carried it out (stopped a running command,
    /// deleted the sandbox, ended the run), so that "cancelled" is what the run is; after
    /// [`CANCEL_WAIT`], with the run as it is.
    pub async fn cancel_run_and_wait(&self, project: &str, name: &str) -> Result<AgentRun> {
        self.cancel_run(project, name).await?;
        self.finished_run(project, name, CANCEL_WAIT).await
    }
}

/// Refuses a message key that was already used for a message with another payload: only a
/// repeat of the same message is answered as delivered.
fn check_same_message(first: &crate::store::InboxMessage, payload: &str, key: &str) -> Result<()> {
    if first.payload == payload {
        return Ok(());
    }
    Err(Invalid::new(
        "messageKey",
        format!(
            "was already used for message {} with another payload: a repeat must send the same \
             payload, and a new message needs a new key",
            first.seq
        ),
        key,
    )
    .into())
}

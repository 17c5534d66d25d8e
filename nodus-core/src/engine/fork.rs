//! Forks: new runs that continue another run from one of its command steps. Creating them
//! checks the step (a completed command with a snapshot, from a run whose payloads are kept)
//! and creates every fork in one write; a fork's first drive copies the source's steps up to
//! that step into its journal (inherited, never carried out again) and its first sandbox
//! starts from the snapshot.

use std::collections::{BTreeMap, BTreeSet};

use super::execute::Fixed;
use super::{Engine, Error, MAX_BATCH, Result, run_uid};
use crate::journal::{Intent, Outcome, Step};
use crate::resource::{AgentRun, ForkOf, NameOrInline};
use crate::sandbox::SandboxId;
use crate::snapshot::{DIRECTORY, Entry, Manifest, Stored, TYPE_BITS, archive};
use crate::store::{Delivery, Fence};
use crate::validate::Invalid;

/// Bytes of contents in each archive of a fork's restore ([`Engine::restore_fork`]).
pub const RESTORE_BATCH_BYTES: usize = 64 << 20;

/// Contents a fork's restore reads from the store at a time.
const RESTORE_READS: usize = 4;

/// Which step a fork starts after.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AtStep {
    /// This journal sequence number.
    Seq(u32),
    /// The last completed command before the first failed or uncertain step.
    LastGood,
}

/// A request for forks of a run.
#[derive(Debug, Clone, PartialEq)]
pub struct ForkRequest {
    /// Where they start.
    pub at: AtStep,
    /// How many (1 to [`MAX_BATCH`]).
    pub count: u32,
    /// The fork's name (with `-1`, `-2`… after it when several); `SOURCE-fork-STEP` when
    /// absent.
    pub name: Option<String>,
    /// Another agent to continue with (its model and system prompt).
    pub agent: Option<String>,
    /// A new user message for the forks' next model call.
    pub input: Option<String>,
    /// Cancel the source once the forks exist, naming the first in its `status.replacedBy`.
    pub replace: bool,
}

/// The last completed command step before the first failed or uncertain step of `journal`
/// (`interrupted`: its open step, if any, is not under way).
pub fn last_good(journal: &[Step], interrupted: bool) -> Option<u32> {
    use crate::journal::StepState;
    journal
        .iter()
        .take_while(|step| {
            !matches!(
                step.state(interrupted),
                StepState::Failed | StepState::Uncertain
            )
        })
        .filter(|step| {
            matches!(step.intent, Intent::Command { .. })
                && matches!(step.outcome(), Some(Outcome::CommandFinished { .. }))
        })
        .map(|step| step.seq)
        .last()
}

/// Why a fork cannot start after step `seq` of `journal`, given the source's snapshots and
/// whether this server takes them (`snapshots_on`).
pub fn refusal(
    journal: &[Step],
    snapshots: &[(u32, crate::snapshot::Snapshot)],
    seq: u32,
    snapshots_on: bool,
) -> Option<String> {
    let Some(step) = journal.get(usize::try_from(seq).unwrap_or(usize::MAX)) else {
        return Some(format!(
            "the run has no step {seq} (it has {})",
            journal.len()
        ));
    };
    match (&step.intent, step.outcome()) {
        (Intent::Command { .. }, Some(Outcome::CommandFinished { .. })) => {}
        (Intent::Command { .. }, _) => {
            return Some(format!(
                "step {seq} is a command that did not complete, not a command boundary"
            ));
        }
        (intent, _) => {
            return Some(format!(
                "step {seq} is a {:?} step, not a command step: a fork starts after a command",
                intent.kind()
            ));
        }
    }
    match snapshots.iter().find(|(at, _)| *at == seq) {
        None if !snapshots_on => Some(format!(
            "step {seq} has no snapshot of the working directory: this server takes none \
             (`nodus server --snapshots off`)"
        )),
        None => Some(format!(
            "step {seq} has no snapshot of the working directory"
        )),
        Some((_, snapshot)) => snapshot.not_forkable(),
    }
}

impl Engine {
    /// Fork run `source` of `project`: `request.count` new runs, created all or nothing,
    /// each with `spec.forkOf` naming the source and the step. Refused (nothing written)
    /// with the reason when the step is not a completed command with a snapshot, or the
    /// source's payloads were removed.
    pub async fn fork(
        &self,
        project: &str,
        source: &str,
        request: ForkRequest,
    ) -> Result<Vec<AgentRun>> {
        let count = usize::try_from(request.count).unwrap_or(usize::MAX);
        if count == 0 || count > MAX_BATCH {
            return Err(Invalid::new(
                "count",
                format!("must be 1 to {MAX_BATCH}"),
                request.count.to_string(),
            )
            .into());
        }
        let run = self.read_run(project, source).await?.object;
        let step = match request.at {
            AtStep::Seq(seq) => seq,
            AtStep::LastGood => {
                let journal = self.deps.store.journal(run_uid(&run)).await?;
                last_good(&journal, run.status.steps_interrupted()).ok_or_else(|| {
                    Invalid::new(
                        "atStep",
                        "needs a completed command before the first failed or uncertain step",
                        "\"last-good\"",
                    )
                })?
            }
        };
        let base = request
            .name
            .clone()
            .unwrap_or_else(|| format!("{source}-fork-{step}"));
        let forks = (1..=count)
            .map(|i| {
                let mut spec = run.spec.clone();
                spec.group = None;
                spec.task_key = None;
                spec.depends_on = Vec::new();
                spec.workdir = None;
                if let Some(agent) = &request.agent {
                    spec.agent = NameOrInline::Name(agent.clone());
                }
                spec.fork_of = Some(ForkOf {
                    run: source.to_string(),
                    step,
                    input: request.input.clone(),
                    // The first fork carries the replacement, written with it.
                    replace: request.replace && i == 1,
                });
                let name = if count == 1 {
                    base.clone()
                } else {
                    format!("{base}-{i}")
                };
                let mut fork = AgentRun::new(name, spec);
                fork.metadata.labels = run.metadata.labels.clone();
                fork
            })
            .collect();
        let created = self.create_runs(project, forks, None).await?;
        // The first fork's `spec.forkOf.replace` is the durable record of the replacement:
        // done now, and again by that fork's first drive (after a crash between the two).
        if request.replace
            && let Some(first) = created.first()
        {
            self.replace_with(project, source, first.name()).await?;
        }
        Ok(created)
    }

    /// Cancel `source` (a finished one stays as it is) and name its replacement. Repeating
    /// it changes nothing more.
    async fn replace_with(&self, project: &str, source: &str, fork: &str) -> Result<()> {
        match self.cancel_run(project, source).await {
            Ok(_) | Err(Error::AgentRunFinished { .. }) => {}
            Err(e) => return Err(e),
        }
        let key = crate::store::ObjectKey::new(project, crate::resource::Kind::AgentRun, source);
        let fork = fork.to_string();
        self.deps
            .store
            .modify(
                &key,
                Box::new(move |document| {
                    if document["status"]["replacedBy"] == fork.as_str() {
                        return None;
                    }
                    let mut document = document.clone();
                    document["status"]["replacedBy"] = serde_json::json!(fork);
                    Some(document)
                }),
            )
            .await?;
        Ok(())
    }

    /// Checks a new run's `spec.forkOf` (see [`Engine::fork`]): the refusal names why.
    pub(super) async fn check_fork(&self, project: &str, fork_of: &ForkOf) -> Result<()> {
        let invalid = |rule: String| -> Error {
            Invalid::new("spec.forkOf.step", rule, fork_of.step.to_string()).into()
        };
        if let Some(input) = &fork_of.input {
            crate::validate::check_message("spec.forkOf.input", input)?;
        }
        let source = match self.read_run(project, &fork_of.run).await {
            Ok(source) => source.object,
            Err(Error::NotFound { .. }) => {
                return Err(Invalid::new(
                    "spec.forkOf.run",
                    "must name a run of the project",
                    format!("{:?}", fork_of.run),
                )
                .into());
            }
            Err(e) => return Err(e),
        };
        if let Some(at) = source.status.payloads_removed_at {
            return Err(invalid(format!(
                "the source run's payloads were removed at {at} (retention), its snapshots \
                 with them: it cannot be forked"
            )));
        }
        let uid = run_uid(&source);
        let journal = self.deps.store.journal(uid).await?;
        let snapshots = self.deps.store.snapshots(uid).await?;
        match refusal(
            &journal,
            &snapshots,
            fork_of.step,
            self.config.snapshots.is_some(),
        ) {
            Some(why) => Err(invalid(format!("cannot be forked from: {why}"))),
            None => Ok(()),
        }
    }

    /// A fork's journal with its inherited steps: copied from the source (those not copied
    /// yet, after a crash) with the snapshot they end with, before the fork takes any step
    /// of its own. Copying again is harmless: each step is appended once, at its place.
    pub(super) async fn inherit(
        &self,
        fixed: &Fixed,
        fence: Fence,
        mut journal: Vec<Step>,
    ) -> Result<Vec<Step>> {
        let Some(fork) = &fixed.fork_of else {
            return Ok(journal);
        };
        let have = u32::try_from(journal.len()).unwrap_or(u32::MAX);
        if have > fork.step {
            return Ok(journal);
        }
        // Before anything else: a replacement recorded with the fork is carried out (again,
        // if the server stopped after the fork was created and before the source was
        // cancelled).
        if fork.replace {
            self.replace_with(&fixed.project, &fork.run, &fixed.key.name)
                .await?;
        }
        let source = self.read_run(&fixed.project, &fork.run).await?.object;
        let source_uid = run_uid(&source).to_string();
        if have == 0 {
            let snapshot = self
                .deps
                .store
                .snapshots(&source_uid)
                .await?
                .into_iter()
                .find(|(seq, _)| *seq == fork.step)
                .map(|(_, s)| Stored::Whole(s))
                .ok_or_else(|| Error::Corrupt {
                    key: fixed.key.to_string(),
                    message: format!(
                        "the source {} has no snapshot after step {} any more",
                        fork.run, fork.step
                    ),
                })?;
            self.retrying(|| {
                self.deps
                    .store
                    .put_snapshot(&fixed.uid, fork.step, &snapshot, &[])
            })
            .await?;
        }
        let source_journal = self.deps.store.journal(&source_uid).await?;
        self.inherit_messages(fixed, &source_uid, &source_journal, fork.step)
            .await?;
        for step in source_journal
            .into_iter()
            .skip(journal.len())
            .take_while(|step| step.seq <= fork.step)
        {
            let mut intent = step.clone();
            intent.completion = None;
            self.retrying(|| self.deps.store.append_step(&fixed.uid, fence, &intent))
                .await?;
            if let Some(completion) = &step.completion {
                self.retrying(|| {
                    self.deps
                        .store
                        .complete_step(&fixed.uid, fence, step.seq, completion)
                })
                .await?;
            }
            journal.push(step);
        }
        Ok(journal)
    }

    /// The messages the inherited steps read (those up to the last one read by step `step`
    /// of the source), copied into the fork's inbox under the same sequence numbers, so that
    /// the fork's model calls see the conversation they are part of. Each is posted with its
    /// key (a fork-made one when it had none), so that copying again after a crash delivers
    /// it once. Refused as corrupt when the fork's inbox numbers them otherwise (a message
    /// sent to the fork before its first drive took a number first).
    async fn inherit_messages(
        &self,
        fixed: &Fixed,
        source_uid: &str,
        source_journal: &[Step],
        step: u32,
    ) -> Result<()> {
        let Some(last_read) = source_journal
            .iter()
            .take_while(|s| s.seq <= step)
            .filter_map(|s| match s.intent {
                Intent::ReadMessage { message_seq, .. } => Some(message_seq),
                _ => None,
            })
            .max()
        else {
            return Ok(());
        };
        let inbox = self.deps.store.inbox(source_uid).await?;
        for message in inbox.iter().filter(|m| m.seq <= last_read) {
            let key = message
                .key
                .clone()
                .unwrap_or_else(|| format!("nodus.fork.{}", message.seq));
            let delivered = loop {
                let version = self.deps.store.get(&fixed.key).await?.version;
                match self
                    .deps
                    .store
                    .post_message(
                        &fixed.key,
                        version,
                        Some(&key),
                        &message.payload,
                        message.received_at,
                    )
                    .await
                {
                    Err(crate::store::Error::Conflict { .. }) => continue,
                    other => break other?,
                }
            };
            let (Delivery::Delivered(seq) | Delivery::Duplicate(seq)) = delivered;
            if seq != message.seq {
                return Err(Error::Corrupt {
                    key: fixed.key.to_string(),
                    message: format!(
                        "the source's message {} was copied as the fork's message {seq}: a \
                         message sent to the fork before its first drive took its number",
                        message.seq
                    ),
                });
            }
        }
        Ok(())
    }

    /// Put the working directory a fork starts from into its new sandbox: the manifest of
    /// its snapshot after the step it was forked at, in archives of at most
    /// [`RESTORE_BATCH_BYTES`] of contents ([`archive::restore_batches`]), each read from the
    /// store and built while the sandbox unpacks the one before, so that about three are
    /// held at a time whatever the directory's size. Repeating it after a crash is safe: no
    /// command has run in the sandbox yet, and unpacking replaces what an earlier attempt
    /// wrote.
    pub(super) async fn restore_fork(
        &self,
        fixed: &Fixed,
        fork: &ForkOf,
        sandbox: &SandboxId,
    ) -> std::result::Result<(), String> {
        let manifest: Manifest = self
            .deps
            .store
            .snapshots(&fixed.uid)
            .await
            .map_err(|e| e.to_string())?
            .into_iter()
            .find(|(seq, _)| *seq == fork.step)
            .and_then(|(_, s)| s.manifest().cloned())
            .ok_or_else(|| format!("the fork has no snapshot after step {}", fork.step))?;
        let mut unpacking: Option<Vec<u8>> = None;
        for batch in archive::restore_batches(&manifest, RESTORE_BATCH_BYTES) {
            let next = self.restore_archive(fixed, &batch);
            let built = match unpacking.take() {
                None => next.await,
                Some(tar) => {
                    let (built, put) = tokio::join!(next, self.put_restored(sandbox, tar));
                    put?;
                    built
                }
            };
            unpacking = Some(built.map_err(|e| e.to_string())?);
        }
        match unpacking {
            Some(tar) => self.put_restored(sandbox, tar).await,
            None => Ok(()),
        }
    }

    /// The archive of one batch of a fork's restore, its contents read from the store a few
    /// at a time.
    async fn restore_archive(&self, fixed: &Fixed, batch: &[&Entry]) -> Result<Vec<u8>> {
        let corrupt = |message: String| Error::Corrupt {
            key: fixed.key.to_string(),
            message,
        };
        let digests: Vec<&str> = batch
            .iter()
            .filter(|e| e.mode & TYPE_BITS != DIRECTORY)
            .map(|e| e.digest.as_str())
            .collect::<BTreeSet<&str>>()
            .into_iter()
            .collect();
        let mut contents: BTreeMap<&str, Vec<u8>> = BTreeMap::new();
        for some in digests.chunks(RESTORE_READS) {
            let read = futures_util::future::try_join_all(
                some.iter().map(|digest| self.deps.store.blob(digest)),
            )
            .await?;
            for (digest, bytes) in some.iter().zip(read) {
                let bytes = bytes
                    .ok_or_else(|| corrupt(format!("the snapshot's contents {digest} are gone")))?;
                contents.insert(digest, bytes);
            }
        }
        archive::restore_archive(batch, &|digest| {
            contents
                .get(digest)
                .map(Vec::as_slice)
                .ok_or_else(|| format!("contents {digest} are not in the manifest"))
        })
        .map_err(corrupt)
    }

    /// Unpack one archive of a fork's restore in its sandbox.
    async fn put_restored(
        &self,
        sandbox: &SandboxId,
        tar: Vec<u8>,
    ) -> std::result::Result<(), String> {
        self.sandbox_retrying(|| self.deps.sandbox.put_files(sandbox, tar.clone()))
            .await
            .map_err(|e| e.to_string())
    }
}

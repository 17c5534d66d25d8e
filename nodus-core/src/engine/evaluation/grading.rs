//! Grading in the engine: an evaluation group's pending cases graded once their runs have
//! ended, by a command grader's journaled attempts in sandboxes of their own, and the
//! grading sandboxes of unfinished attempts removed.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use futures_util::StreamExt;
use jiff::Timestamp;

use super::{
    DEFAULT_GRADER_TIMEOUT, GRADER_OUTPUT_CAP, GRADING_CONCURRENCY, GRADING_RETRY, GraderOutcome,
    case_of,
};
use crate::engine::grader_sandbox::{GRADER_TASK_ID_VARIABLE, grader_links};
use crate::engine::{Engine, Error, Result};
use crate::evaluation::ending::{CaseRun, Ending, cut_short, ending};
use crate::evaluation::{
    CaseOutcome, CaseRecord, CaseState, GradingAttempt, UnscoredReason, grade,
};
use crate::group::GroupPhase;
use crate::lifecycle::{CancelReason, RunPhase};
use crate::resource::Kind;
use crate::resource::{
    AgentGroupSpec, AgentRun, AgentRunSpec, EnvironmentSpec, FileSetSpec, GraderKind, VerdictFrom,
};
use crate::sandbox::{ExecRequest, SandboxId, SandboxSpec};
use crate::store::{self, ObjectKey, Record};

impl Engine {
    /// Grade what can be graded in an evaluation group: every pending case whose run has
    /// ended gets its one terminal state (a cancelled group's, and those past the deadline,
    /// too). Answers when to look again (the earliest deadline or retry of a case still
    /// pending), or `None`. An ordinary group has nothing to grade.
    pub async fn grade_evaluation(&self, project: &str, name: &str) -> Result<Option<Timestamp>> {
        // The group, its cases and its members, read at once (each a round trip to the store).
        let (group, cases, members) = tokio::try_join!(
            self.read::<AgentGroupSpec>(project, name),
            self.case_outcomes(project, name),
            self.members(project, name)
        )?;
        let group = group.object;
        let Some(evaluation) = &group.spec.evaluation else {
            return Ok(None);
        };
        let cancelled = group
            .status
            .phase
            .is_some_and(|p| matches!(p, GroupPhase::Cancelling | GroupPhase::Cancelled));
        // The cases still pending, from the listing the group's reconciles keep (read again
        // only where written since), and the phase of each member run as the group's listing
        // has it: a case whose run has not ended is left pending unread, and only a case that
        // may end now is read whole (most cases of a large evaluation wait for a slot).
        let pending: Vec<Arc<(String, CaseOutcome)>> = cases
            .into_iter()
            .filter(|case| case.1.state == CaseState::Pending)
            .collect();
        if pending.is_empty() {
            // Every case has its state: the group finishes (or finished) at its next reconcile,
            // and no pass comes after; what this one listed again is not kept.
            self.forget_listings(project, name);
            return Ok(None);
        }
        let phases: HashMap<String, RunPhase> = members
            .iter()
            .map(|listed| (listed.0.key.name.clone(), listed.1.phase))
            .collect();
        let now = self.deps.clock.now();
        let mut wake: Option<Timestamp> = None;
        let mut ending_now = Vec::new();
        for case in pending {
            let (_, outcome) = &*case;
            match (
                cut_short::<()>(cancelled, now, outcome.deadline),
                phases.get(&outcome.run),
            ) {
                (None, Some(phase)) => {
                    let seen = CaseRun::Read {
                        phase: *phase,
                        message: "",
                        run: (),
                    };
                    match ending(outcome.deadline, seen) {
                        Ending::Later(at) => wake = Some(wake.map_or(at, |w| w.min(at))),
                        _ => ending_now.push(case),
                    }
                }
                _ => ending_now.push(case),
            }
        }
        if ending_now.is_empty() {
            return Ok(wake);
        }
        let environment = self
            .evaluation_environment(project, &evaluation.environment)
            .await
            .ok()
            .map(|(reference, environment)| (reference.project, environment.spec));
        let graded: Vec<Result<Graded>> = futures_util::stream::iter(ending_now)
            .map(|case| {
                let key = ObjectKey::new(project, Kind::EvaluationCase, &case.0);
                let environment = environment.as_ref();
                async move {
                    let record = match self.deps.store.get(&key).await {
                        Ok(record) => record,
                        // Deleted meanwhile (the group with it): nothing to grade.
                        Err(store::Error::NotFound(_)) => return Ok(Graded::Gone),
                        Err(e) => return Err(e.into()),
                    };
                    let whole: CaseRecord = case_of(&record)?;
                    if whole.is_terminal() {
                        // Graded meanwhile (by another replica).
                        return Ok(Graded::Recorded);
                    }
                    self.grade_case(project, record, whole, cancelled, environment)
                        .await
                }
            })
            .buffer_unordered(GRADING_CONCURRENCY)
            .collect()
            .await;
        let mut changed = false;
        for graded in graded {
            match graded? {
                Graded::Recorded => changed = true,
                Graded::Later(at) => wake = Some(wake.map_or(at, |w| w.min(at))),
                Graded::Gone => {}
            }
        }
        if changed {
            self.reconcile_group(project, name).await?;
        }
        Ok(wake)
    }

    /// Grade one pending case, if its run has ended (or the group was cancelled, or the
    /// deadline passed), reading its run (the pass calls it only for a case that the group's
    /// listing says may end now).
    async fn grade_case(
        &self,
        project: &str,
        record: Record,
        case: CaseRecord,
        cancelled: bool,
        environment: Option<&(String, EnvironmentSpec)>,
    ) -> Result<Graded> {
        let now = self.deps.clock.now();
        let ending = match cut_short(cancelled, now, case.deadline) {
            Some(ending) => ending,
            None => {
                let read = match self.read::<AgentRunSpec>(project, &case.run).await {
                    Ok(run) => Some(run.object),
                    Err(Error::NotFound { .. }) => None,
                    Err(e) => return Err(e),
                };
                match read {
                    Some(run) => {
                        let message = run.status.message.clone().unwrap_or_default();
                        let phase = run.status.current_phase();
                        let seen = CaseRun::Read {
                            phase,
                            message: &message,
                            run,
                        };
                        ending(case.deadline, seen)
                    }
                    None => ending(case.deadline, CaseRun::Deleted),
                }
            }
        };
        let ended = match ending {
            Ending::Later(at) => return Ok(Graded::Later(at)),
            Ending::Unscored {
                reason,
                evidence,
                interrupt_grading,
                cancel_run,
            } => {
                if cancel_run {
                    // The run can go no further on its cap: the case ends here, and the run
                    // too.
                    let _ = self
                        .request_cancel(project, &case.run, CancelReason::CancelRequested)
                        .await;
                }
                let case = if interrupt_grading {
                    self.remove_grading_sandboxes(&case).await;
                    case.attempts_interrupted(now)
                } else {
                    case
                };
                case.unscored(reason, evidence, now)
            }
            Ending::Grade(run) => {
                let unscored = |reason: UnscoredReason, evidence: String| -> CaseRecord {
                    case.clone().unscored(reason, evidence, now)
                };
                let answer = self.answer_of(&run).await?;
                match answer.filter(|a| !a.trim().is_empty()) {
                    None => unscored(
                        UnscoredReason::NoAnswer,
                        "the run ended without an answer".to_string(),
                    ),
                    Some(answer) => match environment {
                        None => unscored(
                            UnscoredReason::GraderFailed,
                            format!("the Environment {} cannot be read", case.environment),
                        ),
                        Some((env_project, spec)) if spec.grader.kind == GraderKind::Command => {
                            return self
                                .grade_with_command(
                                    project,
                                    record,
                                    case,
                                    &run,
                                    &answer,
                                    env_project,
                                    spec,
                                )
                                .await;
                        }
                        Some((_, spec)) => {
                            let mut graded = case.clone();
                            graded.gradings.push(GradingAttempt {
                                attempt: next_attempt(&case),
                                sandbox: None,
                                started_at: now,
                                finished_at: Some(now),
                                interrupted: false,
                            });
                            match grade::grade_answer(&spec.grader, &graded.hidden, &answer) {
                                Ok(grade) => graded.scored(grade, now),
                                Err(error) => {
                                    graded.unscored(UnscoredReason::GraderFailed, error, now)
                                }
                            }
                        }
                    },
                }
            }
        };
        self.record_case(record, ended).await
    }

    /// Grade with a `command` grader in a fresh sandbox of its own, holding the run's lease.
    #[allow(clippy::too_many_arguments)]
    async fn grade_with_command(
        &self,
        project: &str,
        record: Record,
        case: CaseRecord,
        run: &AgentRun,
        answer: &str,
        env_project: &str,
        environment: &EnvironmentSpec,
    ) -> Result<Graded> {
        let uid = run.metadata.uid.clone().unwrap_or_default();
        let lease = self.lease();
        let fence = match self.deps.store.claim(&uid, &lease).await {
            Ok(fence) => fence,
            // Another replica grades it (or has not released the run yet).
            Err(store::Error::Leased { .. }) => return Ok(Graded::Later(self.retry_at())),
            Err(e) => return Err(e.into()),
        };
        let outcome = self
            .grade_with_command_leased(project, record, case, run, answer, env_project, environment)
            .await;
        let _ = self.deps.store.release(&uid, fence).await;
        outcome
    }

    #[allow(clippy::too_many_arguments)]
    async fn grade_with_command_leased(
        &self,
        project: &str,
        record: Record,
        case: CaseRecord,
        run: &AgentRun,
        answer: &str,
        env_project: &str,
        environment: &EnvironmentSpec,
    ) -> Result<Graded> {
        // An attempt a crash interrupted: remove its sandbox; the grade is made again.
        self.remove_grading_sandboxes(&case).await;
        let mut case = case.attempts_interrupted(self.deps.clock.now());
        let attempt = next_attempt(&case);
        let sandbox_key = format!(
            "grade-{}-{attempt}",
            run.metadata.uid.as_deref().unwrap_or(&case.run)
        );
        case.gradings.push(GradingAttempt {
            attempt,
            sandbox: Some(sandbox_key.clone()),
            started_at: self.deps.clock.now(),
            finished_at: None,
            interrupted: false,
        });
        // The intent, before the effect.
        let record = match self.write_case(&record, &case).await? {
            Some(record) => record,
            None => return Ok(Graded::Recorded),
        };
        let outcome = self
            .run_grader(
                project,
                &case,
                answer,
                env_project,
                environment,
                &sandbox_key,
            )
            .await;
        let now = self.deps.clock.now();
        if let Some(last) = case.gradings.last_mut() {
            last.finished_at = Some(now);
        }
        let ended = match outcome {
            GraderOutcome::Graded(grade) => case.scored(grade, now),
            GraderOutcome::Failed(error) if now >= case.deadline => case.unscored(
                UnscoredReason::EvaluationTimeout,
                format!("the evaluation's deadline passed while grading ({error})"),
                now,
            ),
            GraderOutcome::Failed(error) => case.unscored(UnscoredReason::GraderFailed, error, now),
            // The backend is restarting: the attempt stays open, the next one repeats it.
            GraderOutcome::Retry => return Ok(Graded::Later(self.retry_at())),
        };
        self.record_case(record, ended).await
    }

    /// Runs the grader: stage its inputs in a new sandbox, run the command, read the verdict,
    /// remove the sandbox.
    async fn run_grader(
        &self,
        project: &str,
        case: &CaseRecord,
        answer: &str,
        env_project: &str,
        environment: &EnvironmentSpec,
        sandbox_key: &str,
    ) -> GraderOutcome {
        let inputs = match self
            .grader_inputs(project, case, answer, env_project, environment)
            .await
        {
            Ok(inputs) => inputs,
            Err(error) => return GraderOutcome::Failed(error),
        };
        let spec = SandboxSpec {
            key: sandbox_key.to_string(),
            // The image pinned when the group was created (a case recorded before images
            // were pinned holds the reference as written, run as it resolves now).
            image: (!case.image_digest.is_empty())
                .then(|| case.image_digest.clone())
                .or_else(|| (!environment.image.is_empty()).then(|| environment.image.clone()))
                .or_else(|| self.config.default_image.clone()),
            env: BTreeMap::from([(GRADER_TASK_ID_VARIABLE.to_string(), case.task_id.clone())]),
            limits: self.config.limits,
            network: false,
            egress: None,
            egress_headers: Vec::new(),
            links: grader_links(),
        };
        let id = match self.deps.sandbox.create(&spec).await {
            Ok(info) => info.id,
            Err(e) if e.is_retryable() => return GraderOutcome::Retry,
            Err(e) => return GraderOutcome::Failed(format!("the grader's sandbox: {e}")),
        };
        let outcome = self.grade_in(&id, case, inputs, environment).await;
        let _ = self.deps.sandbox.destroy(&id).await;
        outcome
    }

    async fn grade_in(
        &self,
        id: &SandboxId,
        case: &CaseRecord,
        inputs: Vec<u8>,
        environment: &EnvironmentSpec,
    ) -> GraderOutcome {
        if let Err(e) = self.deps.sandbox.put_files(id, inputs).await {
            return GraderOutcome::Failed(format!("staging the grader's inputs: {e}"));
        }
        let left = case
            .deadline
            .duration_since(self.deps.clock.now())
            .try_into()
            .unwrap_or(std::time::Duration::ZERO);
        let timeout = environment
            .grader
            .timeout
            .unwrap_or(DEFAULT_GRADER_TIMEOUT)
            .to_std()
            .min(left);
        let request = ExecRequest {
            command: environment.grader.command.clone().unwrap_or_default(),
            timeout,
            cwd: None,
            output_cap: GRADER_OUTPUT_CAP,
        };
        let output = match self.deps.sandbox.exec(id, &request).await {
            Ok(output) => output,
            Err(e) if e.is_retryable() => return GraderOutcome::Retry,
            Err(e) => return GraderOutcome::Failed(format!("the grader could not run: {e}")),
        };
        let stderr = grade::shorten(output.stderr.lossy().trim());
        if output.timed_out {
            return GraderOutcome::Failed(format!(
                "the grader timed out after {} s",
                timeout.as_secs()
            ));
        }
        if let Some(why) = output.stopped {
            return GraderOutcome::Failed(format!("the grader was stopped: {why}"));
        }
        if environment.grader.verdict_from == VerdictFrom::HarborReward {
            return self.harbor_reward(id).await;
        }
        if output.exit_code != Some(0) {
            return GraderOutcome::Failed(
                format!(
                    "the grader exited with {} {stderr}",
                    output
                        .exit_code
                        .map_or_else(|| "a signal".to_string(), |c| format!("code {c}"))
                )
                .trim()
                .to_string(),
            );
        }
        match grade::parse_verdict(&output.stdout.lossy()) {
            Ok(grade) => GraderOutcome::Graded(grade),
            Err(error) => GraderOutcome::Failed(error),
        }
    }

    /// The grader's inputs as one tar archive: `grading/answer.txt`, `grading/hidden.json`,
    /// `grading/workdir/` (the agent's final working directory, as kept when its run ended)
    /// and `grader/` (the grader's FileSet).
    async fn grader_inputs(
        &self,
        project: &str,
        case: &CaseRecord,
        answer: &str,
        env_project: &str,
        environment: &EnvironmentSpec,
    ) -> std::result::Result<Vec<u8>, String> {
        let hidden = serde_json::to_vec(&case.hidden).map_err(|e| e.to_string())?;
        let mut files: Vec<(String, Vec<u8>, bool)> = vec![
            (
                "grading/answer.txt".into(),
                answer.as_bytes().to_vec(),
                false,
            ),
            ("grading/hidden.json".into(), hidden, false),
        ];
        let kept = match self
            .output_workdir(project, &case.run)
            .await
            .map_err(|e| e.to_string())?
        {
            Some(super::super::OutputWorkdir::Archive(tar)) => tar,
            Some(super::super::OutputWorkdir::Omitted(why)) => {
                return Err(format!(
                    "the agent's final working directory was not kept: {why}"
                ));
            }
            None => return Err("the agent's final working directory was not kept".to_string()),
        };
        let mut archive = tar::Archive::new(kept.as_slice());
        let entries = archive.entries().map_err(|e| e.to_string())?;
        for entry in entries {
            let mut entry = entry.map_err(|e| e.to_string())?;
            if entry.header().entry_type() != tar::EntryType::Regular {
                continue;
            }
            let path = entry
                .path()
                .map_err(|e| e.to_string())?
                .to_string_lossy()
                .into_owned();
            let executable = entry.header().mode().is_ok_and(|m| m & 0o111 != 0);
            let mut bytes = Vec::new();
            std::io::Read::read_to_end(&mut entry, &mut bytes).map_err(|e| e.to_string())?;
            let path = path.trim_start_matches("./").to_string();
            files.push((format!("grading/workdir/{path}"), bytes, executable));
        }
        if let Some(fileset) = &environment.grader.files {
            let set = self
                .read::<FileSetSpec>(env_project, &fileset.file_set)
                .await
                .map_err(|e| format!("the grader's FileSet: {e}"))?
                .object
                .spec;
            for file in &set.files {
                let bytes = file.bytes().map_err(|e| e.to_string())?;
                files.push((format!("grader/{}", file.path), bytes, file.executable));
            }
        }
        let staged: Vec<super::super::workdir::Staged<'_>> = files
            .iter()
            .map(|(path, bytes, executable)| super::super::workdir::Staged {
                path,
                bytes: bytes.clone(),
                executable: *executable,
            })
            .collect();
        super::super::workdir::archive(&staged).map_err(|e| e.to_string())
    }

    /// Removes the sandboxes of a case's unfinished grading attempts (created again by key,
    /// which re-attaches, then destroyed). Best effort.
    pub(super) async fn remove_grading_sandboxes(&self, case: &CaseRecord) {
        for attempt in &case.gradings {
            let (Some(key), None) = (&attempt.sandbox, attempt.finished_at) else {
                continue;
            };
            let spec = SandboxSpec {
                key: key.clone(),
                image: self.config.default_image.clone(),
                env: BTreeMap::new(),
                limits: self.config.limits,
                network: false,
                egress: None,
                egress_headers: Vec::new(),
                links: grader_links(),
            };
            if let Ok(info) = self.deps.sandbox.create(&spec).await
                && let Err(e) = self.deps.sandbox.destroy(&info.id).await
            {
                tracing::warn!(sandbox = %key, error = %e, "cannot remove a grading sandbox");
            }
        }
    }

    /// Write `case`'s terminal state over `record`: once. When someone else wrote the case
    /// meanwhile and it is terminal, theirs stands.
    async fn record_case(&self, record: Record, case: CaseRecord) -> Result<Graded> {
        self.write_case(&record, &case).await?;
        Ok(Graded::Recorded)
    }

    fn retry_at(&self) -> Timestamp {
        let now = self.deps.clock.now();
        now.checked_add(GRADING_RETRY).unwrap_or(now)
    }
}

/// What grading a case came to.
enum Graded {
    /// A state was written (or found written).
    Recorded,
    /// Nothing yet: look again at this time.
    Later(Timestamp),
    /// The case was deleted meanwhile (with its group).
    Gone,
}

fn next_attempt(case: &CaseRecord) -> u32 {
    u32::try_from(case.gradings.len())
        .unwrap_or(u32::MAX)
        .saturating_add(1)
}

//! Evaluation groups in the engine: Environment versions written once, a group created with
//! its fixed batch of cases and their runs, grading as durable work, and the results.
//!
//! A case is a `Pending` [`CaseRecord`] document created with the group and its run, in the
//! same all-or-nothing batch. When the run has ended, [`Engine::grade_evaluation`] (the
//! [`Runner`](crate::runner::Runner) queues it after each reconcile of the group, under a key
//! of its own so that a slow grader never holds up the group) writes the
//! case's one terminal state, with the version it read: a second writer is refused and finds
//! it terminal, so a grade is recorded once. A `command` grader is journaled in the case
//! itself: the attempt (its sandbox's key) is written before the grader starts and finished
//! with the grade; an attempt interrupted by a crash is repeated from its inputs (the answer,
//! the hidden data, the kept final working directory) in a new sandbox, after the old one is
//! removed. Whoever grades holds the run's lease, so two replicas never grade one case at once.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::Deserialize;
use serde_json::{Value, json};

use super::{Engine, Error, Result, typed};
use crate::evaluation::check::{EnvironmentRef, key_name};
use crate::evaluation::epochs::Reducer;
use crate::evaluation::{
    CaseOutcome, CaseRecord, CaseResult, CaseState, Grade, OUTCOME_PATHS, builtin, cases, retry,
    stats,
};
use crate::group::GroupPhase;
use crate::resource::{
    API_VERSION, AgentGroup, AgentGroupSpec, AgentRun, AgentRunSpec, DurationSpec, Environment,
    EnvironmentSpec, FileSetSpec, GraderKind, Kind, WorkdirSpec,
};
use crate::store::{self, ObjectKey, Record, Selector};
use crate::validate::Invalid;

mod grading;

/// Default `spec.evaluation.timeout`: 30 minutes.
pub const DEFAULT_EVALUATION_TIMEOUT: DurationSpec = DurationSpec::from_secs(30 * 60);
/// Default `spec.grader.timeout` of a command grader: 5 minutes.
pub const DEFAULT_GRADER_TIMEOUT: DurationSpec = DurationSpec::from_secs(5 * 60);
/// The longest evaluation group name: its runs are `<group>-cNNN`, DNS labels.
pub const MAX_EVALUATION_GROUP_NAME: usize = 58;
/// Cases graded at once in one group.
const GRADING_CONCURRENCY: usize = 8;
/// Bytes of a command grader's output kept.
const GRADER_OUTPUT_CAP: u64 = 64 * 1024;
/// How soon a case whose grading could not proceed (its run leased elsewhere, the sandbox
/// backend restarting) is looked at again.
const GRADING_RETRY: jiff::SignedDuration = jiff::SignedDuration::from_secs(2);

impl Engine {
    /// Write an Environment version ([`Engine::apply`]): a new version is created; the same
    /// spec again changes nothing; another spec for a version already written is refused,
    /// naming `spec.version`.
    pub async fn apply_environment(
        &self,
        project: &str,
        environment: Environment,
    ) -> Result<Environment> {
        self.apply(project, environment).await
    }

    /// Store a new Environment version under `NAME@VERSION`, once its project-bound rules
    /// hold: a generator is for the built-ins of project `nodus` only, and the FileSets it
    /// names must exist in its project.
    async fn insert_environment(
        &self,
        project: &str,
        mut environment: Environment,
    ) -> Result<Environment> {
        for (name, split) in &environment.spec.splits {
            if split.generator.is_some() && project != builtin::PROJECT {
                return Err(Invalid::new(
                    format!("spec.splits.{name}.generator"),
                    "is for the built-in Environments of project nodus only: list the tasks",
                    format!("{:?}", split.generator.as_ref().map(|g| g.kind.as_str())),
                )
                .into());
            }
            for (index, task) in split.tasks.iter().enumerate() {
                if let Some(files) = &task.files {
                    let field = format!("spec.splits.{name}.tasks[{index}].files.fileSet");
                    self.environment_fileset(project, &field, &files.file_set)
                        .await?;
                }
            }
        }
        if let Some(files) = &environment.spec.grader.files {
            self.environment_fileset(project, "spec.grader.files.fileSet", &files.file_set)
                .await?;
        }
        let key = ObjectKey::new(
            project,
            Kind::Environment,
            key_name(environment.name(), &environment.spec.version),
        );
        self.stamp(project, &mut environment);
        environment.status = Default::default();
        let record = self
            .deps
            .store
            .create(&key, typed::encode(&key, &environment)?)
            .await?;
        Ok(typed::decode(record)?.object)
    }

    /// Write the built-in Environments (and the FileSets they name) into project `nodus`
    /// ([`Engine::apply`] of each): what is missing is created, a FileSet of another spec is
    /// brought to this release's, and what is there already as it is is left alone.
    pub async fn install_builtin_environments(&self) -> Result<()> {
        let (filesets, environments) = builtin::environments();
        for fileset in filesets {
            self.apply(builtin::PROJECT, fileset).await?;
        }
        for environment in environments {
            self.apply(builtin::PROJECT, environment).await?;
        }
        Ok(())
    }

    /// A FileSet an Environment of `project` names, which must exist.
    async fn environment_fileset(
        &self,
        project: &str,
        field: &str,
        name: &str,
    ) -> Result<FileSetSpec> {
        match self.read::<FileSetSpec>(project, name).await {
            Ok(found) => Ok(found.object.spec),
            Err(Error::NotFound { .. }) => Err(Invalid::new(
                field,
                format!("must name an existing FileSet of project {project}"),
                format!("{name:?}"),
            )
            .into()),
            Err(e) => Err(e),
        }
    }

    /// The Environment an evaluation names, as seen from `project`: its own, or a built-in
    /// of project `nodus`; another project's is answered as missing.
    async fn evaluation_environment(
        &self,
        project: &str,
        text: &str,
    ) -> Result<(EnvironmentRef, Environment)> {
        let missing = || -> Error {
            Invalid::new(
                "spec.evaluation.environment",
                "must name an existing Environment version (`name@version` of this project or \
                 `nodus/name@version`)",
                format!("{text:?}"),
            )
            .into()
        };
        let reference = EnvironmentRef::parse(project, text).ok_or_else(missing)?;
        if reference.project != project && reference.project != builtin::PROJECT {
            return Err(missing());
        }
        match self
            .read::<EnvironmentSpec>(&reference.project, &reference.key_name())
            .await
        {
            Ok(found) => Ok((reference, found.object)),
            Err(Error::NotFound { .. }) => Err(missing()),
            Err(e) => Err(e),
        }
    }

    /// Create an evaluation group: resolve its Environment, draw its batch, and write the
    /// group, one AgentRun per case (all pinning the same agent revision, each with the task's
    /// prompt as its only input and the evaluation's absolute deadline) and the cases, all or
    /// nothing. Then reconcile it. Errors name the field; nothing is written on error.
    pub(super) async fn create_evaluation_group(
        &self,
        project: &str,
        mut group: AgentGroup,
    ) -> Result<AgentGroup> {
        let Some(evaluation) = group.spec.evaluation.clone() else {
            return Err(Invalid::new("spec.evaluation", "is required", "nothing").into());
        };
        if let Some(source) = evaluation.rescore_of.clone() {
            return self
                .create_rescore_group(project, group, &evaluation, &source)
                .await;
        }
        let name = group.name().to_string();
        if name.len() > MAX_EVALUATION_GROUP_NAME {
            return Err(Invalid::new(
                "metadata.name",
                format!(
                    "must be at most {MAX_EVALUATION_GROUP_NAME} characters for an evaluation \
                     group (its runs are named <group>-cNNN)"
                ),
                format!("{name:?}"),
            )
            .into());
        }
        let (_, agent) = self.resolve_agent(project, &group.spec.agent).await?;
        let (reference, environment) = self
            .evaluation_environment(project, &evaluation.environment)
            .await?;
        let run_environment = self
            .evaluation_run_environment(project, &agent.object.spec, &environment.spec.network)
            .await?;
        let split = match &evaluation.split {
            Some(split) => split.clone(),
            None if environment.spec.splits.len() == 1 => environment
                .spec
                .splits
                .keys()
                .next()
                .cloned()
                .unwrap_or_default(),
            None => {
                let known: Vec<&str> = environment.spec.splits.keys().map(String::as_str).collect();
                return Err(Invalid::new(
                    "spec.evaluation.split",
                    format!(
                        "is required: the Environment has the splits {}",
                        known.join(", ")
                    ),
                    "nothing",
                )
                .into());
            }
        };
        let batch = cases::batch(
            &environment.spec,
            &split,
            evaluation.tasks,
            evaluation.repetitions,
            evaluation.seed,
        )?;
        let image = (!environment.spec.image.is_empty()).then(|| environment.spec.image.clone());
        if image.is_some() && !self.deps.sandbox.supports_image() {
            return Err(Invalid::new(
                "spec.evaluation.environment",
                "names an Environment with an image, which this server's sandbox backend cannot \
                 run (only the docker sandbox runs images)",
                format!("{:?}", evaluation.environment),
            )
            .into());
        }
        // The image every member and grader runs, resolved once, now, to its content digest
        // (empty where the backend runs no images): moving its tag later changes nothing.
        let mut prepared = super::Batch::default();
        let image_used = match image.as_deref().or(self.config.default_image.as_deref()) {
            Some(reference) if self.deps.sandbox.supports_image() => {
                let rule = match &image {
                    Some(_) => format!(
                        "names Environment {:?}, whose image this server's sandbox backend \
                         cannot run",
                        evaluation.environment
                    ),
                    None => "names an Environment without an image, and the server's default \
                             image cannot be run"
                        .to_owned(),
                };
                let digest = self
                    .resolve_image(reference, "spec.evaluation.environment", &rule)
                    .await?;
                prepared.images.insert(reference.to_owned(), digest.clone());
                digest
            }
            _ => String::new(),
        };
        let timeout = evaluation.timeout.unwrap_or(DEFAULT_EVALUATION_TIMEOUT);
        let now = self.deps.clock.now();
        let deadline = now
            .checked_add(jiff::SignedDuration::try_from(timeout.to_std()).unwrap_or_default())
            .map_err(|e| {
                Invalid::new(
                    "spec.evaluation.timeout",
                    e.to_string(),
                    timeout.to_string(),
                )
            })?;
        // A command grader reads the agent's final working directory: the run keeps it.
        let keeps_workdir = environment.spec.grader.kind == GraderKind::Command;
        for attempt in 0..3 {
            let mut items = Vec::with_capacity(batch.len() * 2 + 1);
            let mut earlier: Vec<AgentRun> = Vec::with_capacity(batch.len());
            let mut revisions = std::collections::BTreeSet::new();
            let mut case_items = Vec::with_capacity(batch.len());
            for case in &batch {
                let run_name = format!("{name}-{}", cases::task_key(case.index));
                let mut spec =
                    AgentRunSpec::new(group.spec.agent.clone(), case.task.prompt.clone());
                spec.deadline = Some(deadline);
                spec.image = image.clone();
                spec.environment = run_environment.clone();
                spec.timeout = case.task.timeout;
                if keeps_workdir || case.task.files.is_some() {
                    spec.workdir = Some(WorkdirSpec {
                        base_workdir: case.task.files.as_ref().map(|f| f.file_set.clone()),
                        artifact_mounts: Vec::new(),
                    });
                }
                let run = AgentRun::new(run_name.clone(), spec);
                let (key, mut document, input) = self
                    .prepare_run(project, run, &earlier, &mut prepared)
                    .await
                    .map_err(|e| match e {
                        Error::Invalid(invalid) => Error::Invalid(Invalid::new(
                            format!(
                                "spec.evaluation (the run of case {}): {}",
                                case.index, invalid.field
                            ),
                            invalid.rule,
                            invalid.value,
                        )),
                        other => other,
                    })?;
                document["spec"]["group"] = json!(name);
                document["spec"]["taskKey"] = json!(cases::task_key(case.index));
                revisions.insert(
                    document["status"]["snapshot"]["agentRevision"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string(),
                );
                earlier.push(
                    typed::decode(Record {
                        key: key.clone(),
                        version: 0,
                        document: document.clone(),
                    })?
                    .object,
                );
                items.push((key, document));
                // The task's staged working directory, written with its run.
                items.extend(input);
                let record = CaseRecord {
                    group: name.clone(),
                    index: case.index,
                    task_id: case.task.id.clone(),
                    repetition: case.repetition,
                    run: run_name.clone(),
                    environment: reference.to_string(),
                    split: split.clone(),
                    seed: evaluation.seed,
                    image_digest: image_used.clone(),
                    hidden: case.task.hidden.clone(),
                    deadline,
                    state: CaseState::Pending,
                    reason: None,
                    reward: None,
                    verdict: None,
                    evidence: None,
                    gradings: Vec::new(),
                    completion_time: None,
                    payloads_removed_at: None,
                    earlier_attempts: Vec::new(),
                };
                case_items.push((
                    ObjectKey::new(project, Kind::EvaluationCase, &run_name),
                    case_document(project, &run_name, &record)?,
                ));
            }
            // Every member pins the same revision: the agent changed while the runs were
            // prepared, so prepare them again.
            if revisions.len() > 1 && attempt < 2 {
                continue;
            }
            let mut object = group.clone();
            self.stamp(project, &mut object);
            object.status = Default::default();
            let group_key = ObjectKey::new(project, Kind::AgentGroup, &name);
            let mut all = vec![(group_key.clone(), typed::encode(&group_key, &object)?)];
            all.extend(items);
            all.extend(case_items);
            self.deps.store.create_batch(all, None).await?;
            group = object;
            break;
        }
        self.reconcile_group(project, group.name()).await
    }

    /// Create a rescore of evaluation group `source`: a group with no runs of its own whose
    /// cases are the source's (each at its last attempt's run), graded again with the grader of
    /// `evaluation.environment` from the kept answers and final working directories: no model
    /// call, no agent sandbox. The grader runs in the image the source's case ran in. Refused,
    /// naming the field, when the source is not a finished evaluation group, when the new
    /// version's tasks differ from the source's (ids and prompts), when a command grader would
    /// need working directories the source did not keep, or when the retention sweep removed
    /// the source's payloads. Nothing is written on error.
    async fn create_rescore_group(
        &self,
        project: &str,
        group: AgentGroup,
        evaluation: &crate::resource::EvaluationSpec,
        source: &str,
    ) -> Result<AgentGroup> {
        const FIELD: &str = "spec.evaluation.rescoreOf";
        let name = group.name().to_string();
        if name.len() > MAX_EVALUATION_GROUP_NAME {
            return Err(Invalid::new(
                "metadata.name",
                format!(
                    "must be at most {MAX_EVALUATION_GROUP_NAME} characters for an evaluation \
                     group"
                ),
                format!("{name:?}"),
            )
            .into());
        }
        let not_evaluation = || -> Error {
            Invalid::new(
                FIELD,
                "must name an existing evaluation group of this project",
                format!("{source:?}"),
            )
            .into()
        };
        let source_group = match self.read::<AgentGroupSpec>(project, source).await {
            Ok(found) => found.object,
            Err(Error::NotFound { .. }) => return Err(not_evaluation()),
            Err(e) => return Err(e),
        };
        let Some(source_evaluation) = &source_group.spec.evaluation else {
            return Err(not_evaluation());
        };
        let phase = source_group.status.phase;
        if !phase.is_some_and(GroupPhase::is_finished) {
            return Err(Invalid::new(
                FIELD,
                "must name a finished evaluation group (every case with its terminal state)",
                format!(
                    "{source:?} ({})",
                    phase.map_or("not reconciled yet", GroupPhase::name)
                ),
            )
            .into());
        }
        let (reference, environment) = self
            .evaluation_environment(project, &evaluation.environment)
            .await?;
        let (_, source_environment) = self
            .evaluation_environment(project, &source_evaluation.environment)
            .await
            .map_err(|_| {
                Error::from(Invalid::new(
                    FIELD,
                    "must name a group whose Environment version can still be read",
                    format!("{:?}", source_evaluation.environment),
                ))
            })?;
        let cases = self.evaluation_cases(project, source).await?;
        let split = cases
            .first()
            .map(|(_, case)| case.split.clone())
            .ok_or_else(not_evaluation)?;
        // A task list by id; a generator's tasks as it makes them from the source's seed.
        let tasks = |spec: &EnvironmentSpec| -> BTreeMap<String, crate::resource::TaskSpec> {
            match spec.splits.get(&split) {
                Some(listed) if listed.generator.is_none() => listed
                    .tasks
                    .iter()
                    .map(|t| (t.id.clone(), t.clone()))
                    .collect(),
                Some(_) => cases::batch(
                    spec,
                    &split,
                    source_evaluation.tasks,
                    1,
                    source_evaluation.seed,
                )
                .map(|batch| {
                    batch
                        .into_iter()
                        .map(|c| (c.task.id.clone(), c.task))
                        .collect()
                })
                .unwrap_or_default(),
                None => BTreeMap::new(),
            }
        };
        let (old_tasks, new_tasks) = (tasks(&source_environment.spec), tasks(&environment.spec));
        let command = environment.spec.grader.kind == GraderKind::Command;
        let kept_workdirs = source_environment.spec.grader.kind == GraderKind::Command;
        let timeout = evaluation.timeout.unwrap_or(DEFAULT_EVALUATION_TIMEOUT);
        let now = self.deps.clock.now();
        let deadline = now
            .checked_add(jiff::SignedDuration::try_from(timeout.to_std()).unwrap_or_default())
            .map_err(|e| {
                Invalid::new(
                    "spec.evaluation.timeout",
                    e.to_string(),
                    timeout.to_string(),
                )
            })?;
        let mut items = Vec::with_capacity(cases.len() + 1);
        for (_, case) in &cases {
            let Some(task) = new_tasks.get(&case.task_id) else {
                return Err(Invalid::new(
                    "spec.evaluation.environment",
                    format!(
                        "must have the source's tasks: split {split:?} of {reference} has no task \
                         {:?}",
                        case.task_id
                    ),
                    format!("{:?}", evaluation.environment),
                )
                .into());
            };
            let old_prompt = old_tasks.get(&case.task_id).map(|t| t.prompt.as_str());
            if old_prompt != Some(task.prompt.as_str()) {
                return Err(Invalid::new(
                    "spec.evaluation.environment",
                    format!(
                        "must have the source's tasks: task {:?} has another prompt in {reference} \
                         (a rescore grades the same work, so only the grader may change)",
                        case.task_id
                    ),
                    format!("{:?}", evaluation.environment),
                )
                .into());
            }
            if command && !kept_workdirs && task.files.is_none() {
                return Err(Invalid::new(
                    "spec.evaluation.environment",
                    format!(
                        "has a command grader, which reads the final working directory, and \
                         group {source}'s runs did not keep theirs (task {:?})",
                        case.task_id
                    ),
                    format!("{:?}", evaluation.environment),
                )
                .into());
            }
            if let Some(removed) = case.payloads_removed_at {
                return Err(Invalid::new(
                    FIELD,
                    format!(
                        "must name a group whose answers are still kept: the retention sweep \
                         removed the payloads of case {} (run {}) at {removed}",
                        case.task_id, case.run
                    ),
                    format!("{source:?}"),
                )
                .into());
            }
            let record = CaseRecord {
                group: name.clone(),
                index: case.index,
                task_id: case.task_id.clone(),
                repetition: case.repetition,
                run: case.run.clone(),
                environment: reference.to_string(),
                split: split.clone(),
                seed: case.seed,
                image_digest: case.image_digest.clone(),
                hidden: task.hidden.clone(),
                deadline,
                state: CaseState::Pending,
                reason: None,
                reward: None,
                verdict: None,
                evidence: None,
                gradings: Vec::new(),
                completion_time: None,
                payloads_removed_at: None,
                earlier_attempts: Vec::new(),
            };
            let key_name = format!("{name}-{}", cases::task_key(case.index));
            items.push((
                ObjectKey::new(project, Kind::EvaluationCase, &key_name),
                case_document(project, &key_name, &record)?,
            ));
        }
        let mut object = group;
        self.stamp(project, &mut object);
        object.status = Default::default();
        let group_key = ObjectKey::new(project, Kind::AgentGroup, &name);
        let mut all = vec![(group_key.clone(), typed::encode(&group_key, &object)?)];
        all.extend(items);
        self.deps.store.create_batch(all, None).await?;
        self.reconcile_group(project, &name).await
    }

    /// `nodus eval rescore SOURCE --environment NAME@VERSION`: a new evaluation group `name`
    /// (default `<source>-rescore`) that grades `source`'s work with another Environment
    /// version's grader ([`Engine::create_rescore_group`]).
    pub async fn rescore_evaluation(
        &self,
        project: &str,
        source: &str,
        environment: &str,
        name: Option<&str>,
    ) -> Result<AgentGroup> {
        let source_group = self.read::<AgentGroupSpec>(project, source).await?.object;
        let Some(mut evaluation) = source_group.spec.evaluation.clone() else {
            return Err(Invalid::new(
                "rescoreOf",
                "must name an evaluation group of this project",
                format!("{source:?}"),
            )
            .into());
        };
        evaluation.environment = environment.to_string();
        evaluation.rescore_of = Some(source.to_string());
        evaluation.timeout = None;
        let mut spec = source_group.spec.clone();
        spec.evaluation = Some(evaluation);
        let name = name.map_or_else(|| format!("{source}-rescore"), str::to_string);
        self.create(project, AgentGroup::new(name, spec)).await
    }

    /// The cases of an evaluation group, in batch order.
    pub(super) async fn evaluation_cases(
        &self,
        project: &str,
        group: &str,
    ) -> Result<Vec<(Record, CaseRecord)>> {
        let selector = Selector::in_group(group);
        let mut cases = self
            .deps
            .store
            .list(project, Kind::EvaluationCase, &selector)
            .await?
            .into_iter()
            .map(|record| {
                let case: CaseRecord = case_of(&record)?;
                Ok((record, case))
            })
            .collect::<Result<Vec<_>>>()?;
        cases.sort_by_key(|(_, case)| case.index);
        Ok(cases)
    }

    /// `status.evaluation` of a group, from its cases.
    pub(super) async fn evaluation_status(
        &self,
        project: &str,
        group: &str,
        reducer: Reducer,
    ) -> Result<stats::EvaluationStatus> {
        let listed = self.case_outcomes(project, group).await?;
        let mut cases: Vec<CaseOutcome> = listed.iter().map(|case| case.1.clone()).collect();
        cases.sort_by_key(|case| case.index);
        Ok(stats::summarize(&cases, reducer))
    }

    /// The name and outcome of each case of a group. Every reconcile of the group and every
    /// grading pass reads this: only the fields they need, of the cases written since the last
    /// listing.
    pub(super) async fn case_outcomes(
        &self,
        project: &str,
        group: &str,
    ) -> Result<Vec<Arc<(String, CaseOutcome)>>> {
        self.case_listings
            .list(
                self.deps.store.as_ref(),
                project,
                Kind::EvaluationCase,
                group,
                OUTCOME_PATHS,
                |record| Ok((record.key.name.clone(), case_of(&record)?)),
            )
            .await
    }

    /// The per-case results of an evaluation group, in batch order (an ordinary group has
    /// none).
    pub async fn evaluation_results(&self, project: &str, group: &str) -> Result<Vec<CaseResult>> {
        self.read::<AgentGroupSpec>(project, group).await?;
        Ok(self
            .evaluation_cases(project, group)
            .await?
            .iter()
            .map(|(_, case)| case.result())
            .collect())
    }

    /// Retry the unscored: each case [`retry::choose`] picks gets a new attempt, a new member
    /// run of the group (the same agent revision, prompt, working directory and image as its
    /// last attempt, with the evaluation's timeout from now), and the case moves to it,
    /// pending, keeping its earlier attempts. The runs are written first, all or nothing, then
    /// each case (at the version read); a run left by a retry that stopped between the two is
    /// taken up by the next retry of its case instead of being made again. Cost goes to the
    /// group's cap like any member's. Answers the retried cases' results.
    pub async fn retry_evaluation(
        &self,
        project: &str,
        name: &str,
        request: &retry::RetryRequest,
    ) -> Result<Vec<CaseResult>> {
        let group = self.read::<AgentGroupSpec>(project, name).await?.object;
        let Some(evaluation) = &group.spec.evaluation else {
            return Err(Invalid::new(
                "metadata.name",
                "must name an evaluation group (an ordinary group has no cases to retry)",
                format!("{name:?}"),
            )
            .into());
        };
        if let Some(source) = &evaluation.rescore_of {
            return Err(Invalid::new(
                "spec.evaluation.rescoreOf",
                "is set: a rescore runs no agent, so its cases are not retried (retry the source \
                 group, then rescore it again)",
                format!("{source:?}"),
            )
            .into());
        }
        let cases = self.evaluation_cases(project, name).await?;
        let records: Vec<CaseRecord> = cases.iter().map(|(_, case)| case.clone()).collect();
        let chosen = retry::choose(name, group.status.phase, &records, request)?;
        let timeout = evaluation.timeout.unwrap_or(DEFAULT_EVALUATION_TIMEOUT);
        let now = self.deps.clock.now();
        let deadline = now
            .checked_add(jiff::SignedDuration::try_from(timeout.to_std()).unwrap_or_default())
            .map_err(|e| {
                Invalid::new(
                    "spec.evaluation.timeout",
                    e.to_string(),
                    timeout.to_string(),
                )
            })?;
        let mut prepared = super::Batch::default();
        let mut earlier: Vec<AgentRun> = Vec::new();
        let mut items = Vec::new();
        let mut moves = Vec::with_capacity(chosen.len());
        for index in chosen {
            let (record, case) = &cases[index];
            let attempts = case.attempts();
            let first = attempts
                .first()
                .map_or(case.run.as_str(), |a| a.run.as_str());
            let run_name = retry::attempt_run_name(first, attempts.len() + 1);
            if run_name.len() > crate::validate::MAX_LABEL_VALUE_CHARS {
                return Err(Invalid::new(
                    "metadata.name",
                    format!(
                        "is too long to retry a case: its new run {run_name:?} would be longer                          than 63 characters"
                    ),
                    format!("{name:?}"),
                )
                .into());
            }
            let last = match self.read::<AgentRunSpec>(project, &case.run).await {
                Ok(run) => run.object,
                Err(Error::NotFound { .. }) => {
                    return Err(Invalid::new(
                        "tasks",
                        format!(
                            "must name cases whose last run still exists: {} was deleted",
                            case.run
                        ),
                        format!("{:?}", case.task_id),
                    )
                    .into());
                }
                Err(e) => return Err(e),
            };
            let run_key = ObjectKey::new(project, Kind::AgentRun, &run_name);
            // Made by a retry that stopped before it moved the case: taken up as it is.
            let made = match self.deps.store.get(&run_key).await {
                Ok(found) => found.document["spec"]["group"] == json!(name),
                Err(store::Error::NotFound(_)) => false,
                Err(e) => return Err(e.into()),
            };
            if !made {
                let revision = last
                    .status
                    .snapshot
                    .as_ref()
                    .and_then(|s| s.agent_revision.clone());
                let mut spec = last.spec.clone();
                let task_key = spec.task_key.take().unwrap_or_default();
                spec.group = None;
                spec.deadline = Some(deadline);
                if !case.image_digest.is_empty()
                    && let Some(reference) = spec
                        .image
                        .clone()
                        .or_else(|| self.config.default_image.clone())
                {
                    prepared.images.insert(reference, case.image_digest.clone());
                }
                let run = AgentRun::new(run_name.clone(), spec);
                let (key, mut document, input) = self
                    .prepare_run(project, run, &earlier, &mut prepared)
                    .await?;
                let pinned = document["status"]["snapshot"]["agentRevision"]
                    .as_str()
                    .map(str::to_string);
                if revision.is_some() && pinned != revision {
                    return Err(Invalid::new(
                        "spec.agent",
                        format!(
                            "changed since group {name} was created (its runs pin revision                              {}): a retry runs the same agent, so create a new evaluation group",
                            revision.unwrap_or_default()
                        ),
                        format!("{pinned:?}"),
                    )
                    .into());
                }
                document["spec"]["group"] = json!(name);
                document["spec"]["taskKey"] = json!(format!("{task_key}-{}", attempts.len() + 1));
                earlier.push(
                    typed::decode(Record {
                        key: key.clone(),
                        version: 0,
                        document: document.clone(),
                    })?
                    .object,
                );
                items.push((key, document));
                items.extend(input);
            }
            moves.push((record.clone(), case.clone().retried(run_name, deadline)));
        }
        if !items.is_empty() {
            self.deps.store.create_batch(items, None).await?;
        }
        let mut retried = Vec::with_capacity(moves.len());
        for (record, case) in moves {
            // Changed meanwhile (another retry moved it first): that one stands.
            if self.write_case(&record, &case).await?.is_some() {
                retried.push(case.result());
            }
        }
        self.reconcile_group(project, name).await?;
        Ok(retried)
    }

    /// Delete the cases of a group (with the group).
    pub(super) async fn delete_cases(&self, project: &str, group: &str) -> Result<()> {
        for (record, case) in self.evaluation_cases(project, group).await? {
            self.remove_grading_sandboxes(&case).await;
            match self.deps.store.delete(&record.key).await {
                Ok(()) | Err(store::Error::NotFound(_)) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    /// Write `case` over `record` if it is still at the version read: the new record, or
    /// `None` when the case changed meanwhile.
    async fn write_case(&self, record: &Record, case: &CaseRecord) -> Result<Option<Record>> {
        let project = record.key.project.clone();
        match self
            .deps
            .store
            .update(
                &record.key,
                record.version,
                case_document(&project, &record.key.name, case)?,
            )
            .await
        {
            Ok(written) => Ok(Some(written)),
            Err(store::Error::Conflict { .. } | store::Error::NotFound(_)) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }
}

/// What a command grader came to.
pub(super) enum GraderOutcome {
    Graded(Grade),
    Failed(String),
    Retry,
}

/// A case as stored under `name` (its first run's, or `<group>-cNNN` for a rescore): `spec`
/// holds the record (so `spec.group` selects a group's cases).
fn case_document(project: &str, name: &str, case: &CaseRecord) -> Result<Value> {
    let spec = serde_json::to_value(case).map_err(|e| Error::Corrupt {
        key: case.run.clone(),
        message: e.to_string(),
    })?;
    Ok(json!({
        "apiVersion": API_VERSION,
        "kind": Kind::EvaluationCase.to_string(),
        "metadata": {"name": name, "project": project},
        "spec": spec,
    }))
}

/// A case document's `spec` as `T`: the whole [`CaseRecord`], or the [`CaseOutcome`] a sparse
/// listing holds.
fn case_of<'a, T: Deserialize<'a>>(record: &'a Record) -> Result<T> {
    T::deserialize(&record.document["spec"]).map_err(|e| Error::Corrupt {
        key: record.key.to_string(),
        message: e.to_string(),
    })
}

/// A group's `spec.evaluation` cannot change once the group exists (its batch is fixed when
/// it is created): neither added, removed nor changed.
pub(super) fn check_unchanged(current: &AgentGroupSpec, new: &AgentGroupSpec) -> Result<()> {
    if current.evaluation == new.evaluation {
        return Ok(());
    }
    Err(Invalid::new(
        "spec.evaluation",
        "cannot change once the group exists (its batch was drawn when it was created): \
         create another group",
        format!(
            "{:?}",
            new.evaluation.as_ref().map(|e| e.environment.as_str())
        ),
    )
    .into())
}

/// An Environment is stored and addressed as `NAME@VERSION`, written once: the same spec again
/// changes nothing, another spec is refused naming `spec.version`, and it is never deleted
/// (results name it).
#[async_trait::async_trait]
impl super::kinds::SpecRules for EnvironmentSpec {
    fn key_name(object: &Environment) -> String {
        key_name(object.name(), &object.spec.version)
    }

    fn replaced(current: &Environment, new: Self) -> Result<Self> {
        if current.spec != new {
            return Err(Invalid::new(
                "spec.version",
                format!(
                    "was already written for {:?} with another spec, and a version never \
                     changes: write the change as a new version",
                    current.name()
                ),
                format!("{:?}", new.version),
            )
            .into());
        }
        Ok(new)
    }

    async fn insert(engine: &Engine, project: &str, object: Environment) -> Result<Environment> {
        engine.insert_environment(project, object).await
    }

    async fn remove(engine: &Engine, project: &str, name: &str) -> Result<()> {
        engine.read::<EnvironmentSpec>(project, name).await?;
        Err(Invalid::new(
            "metadata.name",
            "names an Environment version, which is never changed or deleted (results name \
             it): write a new version instead",
            format!("{name:?}"),
        )
        .into())
    }
}

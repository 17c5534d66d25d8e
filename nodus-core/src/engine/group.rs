//! Group operations of the engine: admission of new runs, reconcile, cancel.

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;

use super::{Engine, Error, Result, typed};
use crate::group::{self, GroupPhase, Member};
use crate::lifecycle::{PendingReason, RunEvent, RunPhase};
use crate::money::Usd;
use serde::Deserialize;

use crate::resource::{Access, AgentGroup, AgentGroupSpec, AgentRun, Kind};
use crate::store::{MemberCap, ObjectKey, Record, Selector};

impl Engine {
    async fn read_group(
        &self,
        project: &str,
        name: &str,
    ) -> Result<typed::Versioned<AgentGroupSpec>> {
        self.read(project, name).await
    }

    /// The runs of a group, each with its view for the controller. Only the paths the view
    /// needs are read ([`MEMBER_PATHS`]), and only of the members written since the last
    /// listing ([`listings`](super::listings)): every reconcile lists every member (admission
    /// reads none: [`Engine::admit_to_group`]).
    pub(super) async fn members(
        &self,
        project: &str,
        group: &str,
    ) -> Result<Vec<Arc<(Record, Member)>>> {
        let parse = |record: Record| match member_of(&record.document) {
            Ok(member) => Ok((record, member)),
            // Never a guess: a cap read as zero would let the group start runs its cap
            // has no room for.
            Err(message) => Err(Error::Corrupt {
                key: record.key.to_string(),
                message: format!("the group controller cannot read this run: {message}"),
            }),
        };
        self.member_listings
            .list(
                self.deps.store.as_ref(),
                project,
                Kind::AgentRun,
                group,
                MEMBER_PATHS,
                parse,
            )
            .await
    }

    /// Keep no listing of `group` (it finished, or is gone).
    pub(super) fn forget_listings(&self, project: &str, group: &str) {
        self.member_listings.forget(project, group);
        self.case_listings.forget(project, group);
    }

    /// How many groups' listings (of members, and of cases) are kept now.
    #[cfg(any(test, feature = "test-util"))]
    pub fn listings_kept(&self) -> usize {
        self.member_listings.kept() + self.case_listings.kept()
    }

    /// The names of a project's unfinished runs, read from the two fields that say so (the
    /// runner resumes them at its start; reading every run whole would make that start the
    /// server's peak of memory). A run whose phase cannot be read counts as unfinished: its
    /// drive reports what is wrong with it.
    pub(crate) async fn unfinished_runs(&self, project: &str) -> Result<Vec<String>> {
        let records = self
            .deps
            .store
            .list_sparse(
                project,
                Kind::AgentRun,
                &Selector::default(),
                &["status.phase", "status.reason"],
            )
            .await?;
        Ok(records
            .into_iter()
            .filter(|record| member_phase(&record.document).map_or(true, |p| !p.is_finished()))
            .map(|record| record.key.name)
            .collect())
    }

    /// Whether `run` may join `group`, read without listing the group: the run's own task key
    /// and each of its dependencies looked up by name ([`Engine::is_member`]), and the group's
    /// members counted by phase by the store ([`Store::group_phases`]: counters, in the SQL
    /// stores), so adding a member costs the same at ten thousand members as at ten; and if
    /// so, the reason it waits with when created ([`group::pending_on_admission`]).
    /// `admissions` holds what earlier runs of the same batch learned of their groups (their
    /// own runs as members), so a batch reads each group and counts its members once.
    ///
    /// [`Store::group_phases`]: crate::store::Store::group_phases
    pub(super) async fn admit_to_group(
        &self,
        project: &str,
        group: &str,
        run: &AgentRun,
        admissions: &mut Admissions,
    ) -> Result<PendingReason> {
        if !admissions.contains_key(group) {
            let read = self.read_group(project, group).await.map_err(|e| match e {
                Error::NotFound { name, .. } => no_such_group(name),
                other => other,
            })?;
            let (unfinished, running) = self.member_counts(project, group).await?;
            admissions.insert(
                group.to_string(),
                Admission {
                    // An evaluation group's batch is fixed: it takes no run.
                    spec: crate::evaluation::hold::controlled(&read.object.spec).into_owned(),
                    phase: read.object.status.phase,
                    unfinished,
                    running,
                    tasks: std::collections::HashMap::new(),
                },
            );
        }
        let Some(admission) = admissions.get_mut(group) else {
            return Ok(PendingReason::Queued);
        };
        let task_key = run.spec.task_key.as_deref().unwrap_or_default();
        // The keys admission asks about that this batch has not looked up yet.
        let mut asked: Vec<&str> = std::iter::once(task_key)
            .chain(run.spec.depends_on.iter().map(String::as_str))
            .filter(|key| !admission.tasks.contains_key(*key))
            .collect();
        asked.sort_unstable();
        asked.dedup();
        let found = join_all(asked.iter().map(|key| self.is_member(project, group, key))).await;
        for (key, member) in asked.into_iter().zip(found) {
            admission.tasks.insert(key.to_string(), member?);
        }
        group::admit_to(
            &admission.spec,
            admission.phase,
            &*admission,
            run.spec.agent.name().unwrap_or_default(),
            task_key,
            &run.spec.depends_on,
        )?;
        admission.tasks.insert(task_key.to_string(), true);
        admission.unfinished += 1;
        Ok(group::pending_on_admission(
            &admission.spec,
            admission.running,
            &run.spec.depends_on,
        ))
    }

    /// Whether `group` has a member with `task_key`. Every task of a group is named
    /// `<group>-<taskKey>` ([`validate::task_run_name`](crate::validate::task_run_name); a
    /// name that differs is refused), so it is one read by name; the run found is a member
    /// when it names this group and this key (another group's task can have that name).
    async fn is_member(&self, project: &str, group: &str, task_key: &str) -> Result<bool> {
        let key = ObjectKey::new(
            project,
            Kind::AgentRun,
            crate::validate::task_run_name(group, task_key),
        );
        match self.deps.store.get(&key).await {
            Ok(record) => {
                let spec = &record.document["spec"];
                Ok(spec["group"].as_str() == Some(group)
                    && spec["taskKey"].as_str() == Some(task_key))
            }
            Err(crate::store::Error::NotFound(_)) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// How many runs of `group` have not finished, and how many of those hold a slot
    /// (run), counted by phase by the store. A run with no phase has not started (it is
    /// queued); a phase this engine does not know counts as unfinished (the run's drive
    /// reports what is wrong).
    async fn member_counts(&self, project: &str, group: &str) -> Result<(usize, usize)> {
        let phases = self.deps.store.group_phases(project, group).await?;
        let count = |counted: &dyn Fn(Option<&str>) -> bool| {
            let sum: u64 = phases
                .iter()
                .filter(|(phase, _)| counted(phase.as_deref()))
                .map(|(_, count)| *count)
                .sum();
            usize::try_from(sum).unwrap_or(usize::MAX)
        };
        let unfinished = count(&|phase| !phase.is_some_and(RunPhase::names_finished));
        let running = count(&|phase| phase == Some(RunPhase::Running.name()));
        Ok((unfinished, running))
    }

    /// Reconcile a group: start the queued runs that may start, cancel those whose
    /// dependencies failed, and write the group's status. Runs it starts still need an
    /// executor to [`drive`](Engine::drive) them.
    pub(crate) async fn reconcile_group(&self, project: &str, name: &str) -> Result<AgentGroup> {
        let mut reading = Duration::ZERO;
        let (group, _) = self
            .reconcile_group_reading(project, name, &mut reading)
            .await?;
        Ok(group)
    }

    /// [`reconcile_group`](Engine::reconcile_group), adding to `reading` how long its reads
    /// and plans took: the part of a reconcile that grows with the group's size, by which the
    /// runner spaces a group's reconciles. The commits of its writes are left out: waiting for
    /// the disk is no work of the server's, and counting it spaced the reconciles of a group
    /// of 100 by 35 ms where its reads took a few (BENCHMARKS.md, "Where a case's time goes").
    /// Answers the group as reconciled and the version of it this reconcile wrote (or read,
    /// when its status was unchanged): a change notified up to that version was the
    /// reconcile's own or was seen by it, and needs no reconcile after it.
    pub(crate) async fn reconcile_group_reading(
        &self,
        project: &str,
        name: &str,
        reading: &mut Duration,
    ) -> Result<(AgentGroup, u64)> {
        let reconciled = self.reconcile_listed(project, name, reading).await;
        // What the listings keep serves the group's next reconcile: none comes to one gone
        // or finished (and were one to come, it would list every member again).
        let done = match &reconciled {
            Ok((group, _)) => group.status.phase.is_some_and(|phase| phase.is_finished()),
            Err(error) => matches!(error, Error::NotFound { .. }),
        };
        if done {
            self.forget_listings(project, name);
        }
        reconciled
    }

    /// [`reconcile_group_reading`](Engine::reconcile_group_reading) but for what its
    /// listings keep.
    async fn reconcile_listed(
        &self,
        project: &str,
        name: &str,
        reading: &mut Duration,
    ) -> Result<(AgentGroup, u64)> {
        loop {
            let begun = self.deps.clock.now();
            // At once: each read is a round trip to the store, which a busy runtime makes long.
            let (group, members) =
                tokio::try_join!(self.read_group(project, name), self.members(project, name))?;
            let view: Vec<Member> = members.iter().map(|listed| listed.1.clone()).collect();
            let spec = crate::evaluation::hold::controlled(&group.object.spec);
            let mut plan = group::reconcile(&spec, group.object.status.phase, &view);
            if let Some(evaluation) = &spec.evaluation {
                let reducer = evaluation.reducer.unwrap_or_default();
                let cases = self.evaluation_status(project, name, reducer).await?;
                plan.status = crate::evaluation::hold::with_cases(plan.status, cases);
            }
            let now = self.deps.clock.now();
            *reading += Duration::try_from(now.duration_since(begun)).unwrap_or_default();
            let messages: Vec<Option<&str>> = members
                .iter()
                .map(|listed| listed.0.document["status"]["message"].as_str())
                .collect();
            let mut writes = Vec::new();
            for write in plan.writes(&view, &messages)? {
                let Some((record, member)) = members.get(write.index).map(|listed| &**listed)
                else {
                    continue;
                };
                // The listing read only a few paths: the store edits the whole document, and
                // leaves it when the run moved on meanwhile (the next pass sees it).
                let (seen, next) = (member.phase, write.phase);
                let message = write.message;
                let (edit, applied) = super::spans::tracked(move |document| {
                    (member_phase(document) == Ok(seen)).then(|| {
                        let mut document = document.clone();
                        set_phase(&mut document, next, now);
                        if let group::Message::Set(message) = &message {
                            set_message(&mut document, message.as_deref());
                        }
                        document
                    })
                });
                let write = self.deps.store.modify(&record.key, edit);
                writes.push(async move { (write.await, applied, next.is_finished()) });
            }
            // All at once: a store that commits concurrent writes together (SQLite's writer)
            // starts a hundred runs in one commit instead of a hundred, and writes a status
            // that does not finish the group in that commit too (the admitted runs start one
            // commit sooner). A status that finishes the group waits for its members' writes:
            // a group never says it ended before its members' ends are written. An unchanged
            // status is not written (no change notification that would wake the controllers
            // for nothing).
            let key = ObjectKey::new(project, Kind::AgentGroup, name);
            let update = |document| self.deps.store.update(&key, group.version, document);
            let status = if group.object.status == plan.status {
                StatusWrite::Unchanged
            } else {
                let finishes_group = plan.status.phase.is_some_and(|p| p.is_finished());
                let mut object = group.object.clone();
                object.status = plan.status;
                let document = typed::encode(&key, &object)?;
                match finishes_group {
                    true => StatusWrite::After(document),
                    false => StatusWrite::With(document),
                }
            };
            let (members_written, status) = match status {
                StatusWrite::With(document) => {
                    let (members, status) = tokio::join!(join_all(writes), update(document));
                    (members, StatusWrite::Written(status))
                }
                status => (join_all(writes).await, status),
            };
            // Every write's outcome is looked at (a failed one does not hide the spans of
            // those that were kept); the first failure is returned after.
            let mut failed = None;
            for (written, applied, finishes) in members_written {
                match written {
                    // Deleted meanwhile: the next pass no longer lists it.
                    Err(crate::store::Error::NotFound(_)) => {}
                    Err(error) => {
                        failed.get_or_insert(error);
                    }
                    // A run the group ended before it started (cancelled): its span now.
                    Ok(record) if finishes => {
                        self.undriven_write_ended(project, &record, &applied).await;
                    }
                    Ok(_) => {}
                }
            }
            if let Some(error) = failed {
                // A status written with them is put right by the next pass.
                return Err(error.into());
            }
            let written = match status {
                StatusWrite::Unchanged => return Ok((group.object, group.version)),
                StatusWrite::Written(written) => written,
                StatusWrite::After(document) | StatusWrite::With(document) => {
                    update(document).await
                }
            };
            match written {
                Err(crate::store::Error::Conflict { .. }) => continue,
                Err(e) => return Err(e.into()),
                Ok(record) => {
                    let written = typed::decode::<AgentGroupSpec>(record)?;
                    let was = group.object.status.phase.is_some_and(|p| p.is_finished());
                    if !was {
                        self.group_ended(project, &written.object, now);
                    }
                    return Ok((written.object, written.version));
                }
            }
        }
    }

    /// Export the span of a group that this write finished (once: only the write that moves
    /// it to a finished phase, conditional on the version read, does).
    fn group_ended(&self, project: &str, group: &AgentGroup, now: jiff::Timestamp) {
        let Some(phase) = group.status.phase.filter(|p| p.is_finished()) else {
            return;
        };
        if !self.deps.spans.enabled() {
            return;
        }
        let Some(uid) = group.metadata.uid.as_deref() else {
            return;
        };
        let ended = crate::telemetry::Ended {
            start: group.metadata.creation_timestamp.unwrap_or(now),
            end: now,
            phase: phase.name(),
            succeeded: phase == crate::group::GroupPhase::Succeeded,
            cost: group.status.cost.total_usd,
        };
        self.deps.spans.export(crate::telemetry::group_span(
            project,
            group.metadata.name.as_deref().unwrap_or_default(),
            uid,
            &ended,
        ));
    }

    /// Fail a run that its group never admitted (its deadline passed while it was queued),
    /// unless it left `queued` meanwhile.
    pub(super) async fn end_queued(
        &self,
        key: &ObjectKey,
        queued: RunPhase,
        reason: crate::lifecycle::FailReason,
    ) -> Result<()> {
        let next = queued.apply(RunEvent::Fail(reason))?;
        let now = self.deps.clock.now();
        let (edit, applied) = super::spans::tracked(move |document| {
            (member_phase(document) == Ok(queued)).then(|| {
                let mut document = document.clone();
                set_phase(&mut document, next, now);
                document
            })
        });
        let written = self.deps.store.modify(key, edit).await?;
        self.undriven_write_ended(&key.project, &written, &applied)
            .await;
        Ok(())
    }

    /// Cancel a group: every run that has not finished is cancelled; finished runs keep their
    /// answers. The group goes through `Cancelling` to `Cancelled`. Started runs are marked to
    /// be cancelled; the [`Runner`](crate::runner::Runner) deletes their sandboxes and ends them.
    pub async fn cancel_group(&self, project: &str, name: &str) -> Result<AgentGroup> {
        loop {
            let group = self.read_group(project, name).await?;
            let Some(phase) = group::cancelled(group.object.status.phase) else {
                return Ok(group.object);
            };
            let mut object = group.object.clone();
            object.status.phase = Some(phase);
            let key = ObjectKey::new(project, Kind::AgentGroup, name);
            match self
                .deps
                .store
                .update(&key, group.version, typed::encode(&key, &object)?)
                .await
            {
                Err(crate::store::Error::Conflict { .. }) => continue,
                Err(e) => return Err(e.into()),
                Ok(_) => break,
            }
        }
        let members = self.members(project, name).await?;
        let view: Vec<Member> = members.iter().map(|listed| listed.1.clone()).collect();
        let requests = group::flagged_on_cancel(&view)
            .into_iter()
            .filter_map(|(index, reason)| {
                let (record, _) = &**members.get(index)?;
                Some(self.request_cancel(project, &record.key.name, reason))
            });
        join_all(requests)
            .await
            .into_iter()
            .collect::<Result<Vec<_>>>()?;
        self.reconcile_group(project, name).await
    }
}

/// A reconcile's write of its group's status.
enum StatusWrite {
    /// The status did not change: nothing to write.
    Unchanged,
    /// To write with the members' writes.
    With(serde_json::Value),
    /// To write after them (the status finishes the group).
    After(serde_json::Value),
    /// Written with the members' writes.
    Written(std::result::Result<Record, crate::store::Error>),
}

/// What a batch learned of one group: its spec and phase, how many of its members have not
/// finished, and whether each task key it looked up is a member (the batch's own runs are).
pub(super) struct Admission {
    spec: AgentGroupSpec,
    phase: Option<GroupPhase>,
    unfinished: usize,
    /// How many members hold a slot ([`group::holds_a_slot`]: they run).
    running: usize,
    tasks: std::collections::HashMap<String, bool>,
}

impl group::Membership for Admission {
    /// Only keys looked up first ([`Engine::admit_to_group`] does) are known.
    fn has_task(&self, task_key: &str) -> bool {
        self.tasks.get(task_key).copied().unwrap_or(false)
    }
    fn unfinished(&self) -> usize {
        self.unfinished
    }
}

/// Admissions by group name.
pub(super) type Admissions = std::collections::HashMap<String, Admission>;

/// The caps a batch's write keeps ([`Store::create_batch_within`]): each group its runs
/// were admitted to stays within its `maxPending` once they are written, whatever was
/// admitted to it meanwhile (on another replica: this process's batches take turns).
///
/// [`Store::create_batch_within`]: crate::store::Store::create_batch_within
pub(super) fn member_caps(project: &str, admissions: &Admissions) -> Vec<MemberCap> {
    admissions
        .iter()
        .map(|(group, admission)| MemberCap {
            project: project.to_string(),
            group: group.clone(),
            at_most: u64::from(admission.spec.limits.max_pending),
        })
        .collect()
}

/// A store's refusal of a batch that its groups have no room for, as the admission refusal
/// the engine gives for the same rule: over a cap, the group closed, or gone (since the batch
/// was admitted, on another replica); any other error as it is.
pub(super) fn refused_by_store(error: crate::store::Error) -> Error {
    match error {
        crate::store::Error::OverCap { at_most, .. } => {
            Error::Admission(group::AdmissionRefused::TooManyPending {
                max_pending: u32::try_from(at_most).unwrap_or(u32::MAX),
            })
        }
        crate::store::Error::GroupClosed { .. } => {
            Error::Admission(group::AdmissionRefused::Sealed)
        }
        crate::store::Error::NotFound(key) if key.kind == Kind::AgentGroup => {
            no_such_group(key.name)
        }
        other => other.into(),
    }
}

/// A run's `spec.group` names no group.
fn no_such_group(name: String) -> Error {
    crate::validate::Invalid {
        field: "spec.group".to_string(),
        rule: "must name an existing group".to_string(),
        value: name,
    }
    .into()
}

/// A run's phase (and completion time, when it finishes) written into its document.
fn set_phase(document: &mut serde_json::Value, phase: RunPhase, now: jiff::Timestamp) {
    let Some(status) = document
        .as_object_mut()
        .map(|d| d.entry("status").or_insert_with(|| serde_json::json!({})))
        .and_then(serde_json::Value::as_object_mut)
    else {
        return;
    };
    status.insert("phase".into(), phase.name().into());
    match phase.reason() {
        Some(reason) => status.insert("reason".into(), reason.into()),
        None => status.remove("reason"),
    };
    if phase.is_finished() {
        status.insert("completionTime".into(), now.to_string().into());
    }
}

/// A run's `status.message` written into its document (removed for `None`).
fn set_message(document: &mut serde_json::Value, message: Option<&str>) {
    let Some(status) = document
        .get_mut("status")
        .and_then(serde_json::Value::as_object_mut)
    else {
        return;
    };
    match message {
        Some(message) => status.insert("message".into(), message.into()),
        None => status.remove("message"),
    };
}

/// The paths of a run's document that [`member_of`] reads, and its message (which a
/// reconcile writes when a queued run can never start).
const MEMBER_PATHS: &[&str] = &[
    "spec.taskKey",
    "spec.dependsOn",
    "status.phase",
    "status.reason",
    "status.message",
    "status.cost.totalUSD",
    "status.snapshot.agent.model.access",
    "status.snapshot.agent.perRunMaxCostUSD",
];

/// The parts of a run's document the group controller reads ([`MEMBER_PATHS`]), typed as
/// the run's own types read them: a document they cannot read is an error, never a default.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct MemberDocument {
    #[serde(default)]
    spec: MemberSpec,
    #[serde(default)]
    status: MemberStatus,
}

#[derive(Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct MemberSpec {
    #[serde(default)]
    task_key: Option<String>,
    #[serde(default)]
    depends_on: Vec<String>,
}

#[derive(Default, Deserialize)]
struct MemberStatus {
    #[serde(default)]
    cost: MemberCost,
    #[serde(default)]
    snapshot: Option<MemberSnapshot>,
}

#[derive(Default, Deserialize)]
struct MemberCost {
    #[serde(rename = "totalUSD", default)]
    total_usd: Usd,
}

#[derive(Deserialize)]
struct MemberSnapshot {
    agent: MemberAgent,
}

#[derive(Deserialize)]
struct MemberAgent {
    #[serde(default)]
    model: MemberModel,
    #[serde(rename = "perRunMaxCostUSD")]
    per_run_max_cost_usd: Usd,
}

#[derive(Default, Deserialize)]
struct MemberModel {
    #[serde(default)]
    access: Access,
}

/// A run's phase from its stored document (a run not started yet has none: queued).
fn member_phase(document: &serde_json::Value) -> std::result::Result<RunPhase, String> {
    let status = &document["status"];
    if status["phase"].is_null() {
        return Ok(RunPhase::Pending(PendingReason::Queued));
    }
    serde_json::from_value(serde_json::json!({
        "phase": status["phase"],
        "reason": status["reason"],
    }))
    .map_err(|e| format!("status.phase: {e}"))
}

/// A run as the group controller sees it, read from its stored document (whole, or cut
/// down to [`MEMBER_PATHS`]); an error says what could not be read.
fn member_of(document: &serde_json::Value) -> std::result::Result<Member, String> {
    let phase = member_phase(document)?;
    let read: MemberDocument = serde_path_to_error::deserialize(document)
        .map_err(|e| format!("{}: {}", e.path(), e.inner()))?;
    let cap = match &read.status.snapshot {
        Some(snapshot) if snapshot.agent.model.access == Access::Byok => Usd::ZERO,
        Some(snapshot) => snapshot.agent.per_run_max_cost_usd,
        // What a finished run holds is what it spent; an unfinished one holds its cap.
        None if phase.is_finished() => Usd::ZERO,
        None => return Err("status.snapshot: the run has no snapshot of its agent".to_string()),
    };
    Ok(Member {
        task_key: read.spec.task_key.unwrap_or_default(),
        depends_on: read.spec.depends_on,
        cap,
        spent: read.status.cost.total_usd,
        phase,
    })
}

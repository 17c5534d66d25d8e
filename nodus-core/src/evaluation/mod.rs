//! Evaluation: Environments and their tasks, the graders, each case's one terminal state,
//! and the statistics over the cases, as pure functions and data. The engine's side (creating
//! an evaluation group, grading as durable work) is `engine::evaluation`.
//!
//! A case is one task × repetition of an evaluation group. It is stored as an internal
//! [`Kind::EvaluationCase`](crate::resource::Kind::EvaluationCase) document named after its
//! run ([`CaseRecord`]): created `Pending` with the group and its runs, it is written once
//! into `Scored` or `Unscored` and never changes after that. The group's
//! `status.evaluation` is computed from the cases ([`stats::summarize`]).

pub mod builtin;
pub mod cases;
pub mod check;
pub mod ending;
pub mod epochs;
pub mod grade;
pub mod hold;
pub mod import;
pub mod retry;
pub mod stats;

use jiff::Timestamp;
use serde::{Deserialize, Serialize};

pub use crate::resource::UnscoredReason;

/// Where a case stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
pub enum CaseState {
    /// Its run has not finished, or its grading has not.
    Pending,
    /// Graded: a reward and a verdict (a wrong or invalid answer is scored).
    Scored,
    /// Ended without a score, for a [`UnscoredReason`].
    Unscored,
}

impl UnscoredReason {
    /// Every reason, in the order summaries list them.
    pub const ALL: [UnscoredReason; 6] = [
        UnscoredReason::RunFailed,
        UnscoredReason::NoAnswer,
        UnscoredReason::LimitReached,
        UnscoredReason::GraderFailed,
        UnscoredReason::EvaluationTimeout,
        UnscoredReason::Cancelled,
    ];
}

/// A scored case's verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub enum Verdict {
    /// Passed.
    Pass,
    /// Failed.
    Fail,
    /// The answer could not be read as an answer (no number where one was asked for).
    Invalid,
}

/// A grader's score of one answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Grade {
    /// Between 0 and 1.
    pub reward: f64,
    /// Pass, fail or invalid.
    pub verdict: Verdict,
    /// What the grader saw, in a sentence.
    pub evidence: String,
}

/// One attempt at grading a case: written before the grader starts (its sandbox's key), and
/// finished when it has. An attempt without `finishedAt` was interrupted; the next attempt
/// removes its sandbox and grades again (a grader is a function of its inputs).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GradingAttempt {
    /// From 1.
    pub attempt: u32,
    /// The key of the grader's sandbox (command graders only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<String>,
    /// When it started.
    pub started_at: Timestamp,
    /// When it finished (or was found interrupted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<Timestamp>,
    /// A crash interrupted it before it recorded a grade; the next attempt graded instead.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub interrupted: bool,
}

/// A case as stored: what it is, its hidden data (for the grader only), and its state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CaseRecord {
    /// The evaluation group.
    pub group: String,
    /// Position in the batch, from 0.
    pub index: u32,
    /// The task's id in its split.
    pub task_id: String,
    /// From 1.
    pub repetition: u32,
    /// The AgentRun's name.
    pub run: String,
    /// `project/name@version`.
    pub environment: String,
    /// The split.
    pub split: String,
    /// The evaluation's seed.
    pub seed: u64,
    /// The content digest of the image the case's run and grader run (`name@sha256:…` or
    /// `sha256:…`), resolved once when the group was created; empty where the sandbox
    /// backend runs no images.
    #[serde(default)]
    pub image_digest: String,
    /// Data for the grader only; never served.
    #[serde(default)]
    pub hidden: serde_json::Value,
    /// When grading stops.
    pub deadline: Timestamp,
    /// Where it stands.
    pub state: CaseState,
    /// Why it is unscored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<UnscoredReason>,
    /// The grade, when scored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reward: Option<f64>,
    /// The verdict, when scored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verdict: Option<Verdict>,
    /// What the grader saw, or why the case is unscored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub evidence: Option<String>,
    /// Grading attempts, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gradings: Vec<GradingAttempt>,
    /// When it reached its terminal state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_time: Option<Timestamp>,
    /// When the retention sweep removed its evidence and hidden data (with its run's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payloads_removed_at: Option<Timestamp>,
    /// The attempts before the current one (`run`, `state`, `reason` above), oldest first:
    /// each ended unscored and was retried ([`retry`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub earlier_attempts: Vec<Attempt>,
}

/// What a group's summary reads of a case ([`stats::summarize`]), and its grading of the
/// cases still pending: a few fields of its document, so that neither decodes the case's
/// hidden data, its evidence nor its attempts ([`OUTCOME_PATHS`], a sparse read).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CaseOutcome {
    /// Position in the batch, from 0.
    pub index: u32,
    /// The task's id in its split.
    pub task_id: String,
    /// The AgentRun's name (its latest attempt's).
    pub run: String,
    /// When grading stops.
    pub deadline: Timestamp,
    /// Where it stands.
    pub state: CaseState,
    /// Why it is unscored.
    #[serde(default)]
    pub reason: Option<UnscoredReason>,
    /// The grade, when scored.
    #[serde(default)]
    pub reward: Option<f64>,
    /// The verdict, when scored.
    #[serde(default)]
    pub verdict: Option<Verdict>,
}

/// The paths of a case document a [`CaseOutcome`] is read from.
pub const OUTCOME_PATHS: &[&str] = &[
    "spec.index",
    "spec.taskId",
    "spec.run",
    "spec.deadline",
    "spec.state",
    "spec.reason",
    "spec.reward",
    "spec.verdict",
];

impl From<&CaseRecord> for CaseOutcome {
    fn from(case: &CaseRecord) -> Self {
        CaseOutcome {
            index: case.index,
            task_id: case.task_id.clone(),
            run: case.run.clone(),
            deadline: case.deadline,
            state: case.state,
            reason: case.reason,
            reward: case.reward,
            verdict: case.verdict,
        }
    }
}

/// One attempt at a case: its run and how it ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct Attempt {
    /// The AgentRun's name.
    pub run: String,
    /// `Pending`, `Scored` or `Unscored`.
    pub state: CaseState,
    /// Why it is unscored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<UnscoredReason>,
}

impl CaseRecord {
    /// Whether the case has its one terminal state.
    pub fn is_terminal(&self) -> bool {
        self.state != CaseState::Pending
    }

    /// The case with its unfinished grading attempts marked interrupted at `now`.
    pub fn attempts_interrupted(mut self, now: Timestamp) -> Self {
        for attempt in &mut self.gradings {
            if attempt.finished_at.is_none() {
                attempt.finished_at = Some(now);
                attempt.interrupted = true;
            }
        }
        self
    }

    /// The case with its score.
    pub fn scored(mut self, grade: Grade, now: Timestamp) -> Self {
        self.state = CaseState::Scored;
        self.reason = None;
        self.reward = Some(grade.reward);
        self.verdict = Some(grade.verdict);
        self.evidence = Some(grade.evidence);
        self.completion_time = Some(now);
        self
    }

    /// The case unscored for `reason`.
    pub fn unscored(mut self, reason: UnscoredReason, evidence: String, now: Timestamp) -> Self {
        self.state = CaseState::Unscored;
        self.reason = Some(reason);
        self.reward = None;
        self.verdict = None;
        self.evidence = Some(evidence);
        self.completion_time = Some(now);
        self
    }

    /// Every attempt, oldest first: the earlier ones, then the current one (the case's state
    /// is always its last attempt's).
    pub fn attempts(&self) -> Vec<Attempt> {
        let mut attempts = self.earlier_attempts.clone();
        attempts.push(Attempt {
            run: self.run.clone(),
            state: self.state,
            reason: self.reason,
        });
        attempts
    }

    /// The case again at a new attempt: run `run`, pending until `deadline`. The attempt that
    /// ended is kept in [`CaseRecord::earlier_attempts`]; its grading history and evidence go
    /// (the new attempt is graded from its own run).
    pub fn retried(mut self, run: String, deadline: Timestamp) -> Self {
        let ended = Attempt {
            run: std::mem::replace(&mut self.run, run),
            state: self.state,
            reason: self.reason,
        };
        self.earlier_attempts.push(ended);
        self.state = CaseState::Pending;
        self.reason = None;
        self.reward = None;
        self.verdict = None;
        self.evidence = None;
        self.gradings = Vec::new();
        self.completion_time = None;
        self.deadline = deadline;
        self
    }

    /// The result as the API shows it: everything but the hidden data and the deadline.
    pub fn result(&self) -> CaseResult {
        CaseResult {
            task_id: self.task_id.clone(),
            repetition: self.repetition,
            state: self.state,
            reason: self.reason,
            reward: self.reward,
            verdict: self.verdict,
            evidence: self.evidence.clone(),
            run: self.run.clone(),
            environment: self.environment.clone(),
            split: self.split.clone(),
            seed: self.seed,
            image_digest: self.image_digest.clone(),
            gradings: count(self.gradings.iter().filter(|g| !g.interrupted)),
            interrupted_gradings: count(self.gradings.iter().filter(|g| g.interrupted)),
            attempts: self.attempts(),
        }
    }
}

/// One case's result as the API and the CLI show it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct CaseResult {
    /// The task's id.
    pub task_id: String,
    /// From 1.
    pub repetition: u32,
    /// `Pending`, `Scored` or `Unscored`.
    pub state: CaseState,
    /// Why it is unscored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<UnscoredReason>,
    /// The reward, when scored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reward: Option<f64>,
    /// The verdict, when scored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verdict: Option<Verdict>,
    /// What the grader saw, or why it is unscored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub evidence: Option<String>,
    /// The AgentRun's name.
    pub run: String,
    /// `project/name@version`.
    pub environment: String,
    /// The split.
    pub split: String,
    /// The seed.
    pub seed: u64,
    /// The content digest of the image the run and the grader ran, resolved when the group
    /// was created (empty where the sandbox backend runs no images).
    pub image_digest: String,
    /// Gradings carried out to the end: 1 for a graded case, 0 for one unscored before it
    /// was graded (a grade is recorded once).
    pub gradings: u32,
    /// Grading attempts a crash interrupted before they recorded anything (each repeated).
    #[serde(default)]
    pub interrupted_gradings: u32,
    /// Every attempt at the case, oldest first; the last is the current one (its `run`,
    /// `state` and `reason` are the case's). More than one when unscored attempts were
    /// retried.
    #[serde(default)]
    pub attempts: Vec<Attempt>,
}

fn count<T>(items: impl Iterator<Item = T>) -> u32 {
    u32::try_from(items.count()).unwrap_or(u32::MAX)
}

/// An Environment document (as reading shows it) for a reader who may not see its grading
/// data: every task of every split without its `hidden` data. Only an admin of the
/// Environment's own project is shown `hidden`; the API and the console answer everyone else
/// through this.
pub fn without_hidden(document: &mut serde_json::Value) {
    let splits = document
        .pointer_mut("/spec/splits")
        .and_then(serde_json::Value::as_object_mut);
    for split in splits.into_iter().flat_map(|splits| splits.values_mut()) {
        let tasks = split
            .get_mut("tasks")
            .and_then(serde_json::Value::as_array_mut);
        for task in tasks.into_iter().flatten() {
            if let Some(task) = task.as_object_mut() {
                task.remove("hidden");
            }
        }
    }
}

/// The retention sweep's edit of a case whose run's payloads were removed: its evidence and
/// hidden data go with them (its state, reason, verdict and reward stay, as a run keeps what
/// accounts for it), marked `spec.payloadsRemovedAt`; `None` when already swept.
pub fn without_payloads(document: &serde_json::Value, now: Timestamp) -> Option<serde_json::Value> {
    let spec = document.get("spec")?.as_object()?;
    if spec.contains_key("payloadsRemovedAt") {
        return None;
    }
    let mut document = document.clone();
    let spec = document.get_mut("spec")?.as_object_mut()?;
    spec.remove("evidence");
    spec.insert("hidden".into(), serde_json::Value::Null);
    spec.insert("payloadsRemovedAt".into(), now.to_string().into());
    Some(document)
}

#[cfg(test)]
mod tests {
    #[test]
    fn hidden_data_is_left_out_of_every_task_and_nothing_else() {
        let mut document = serde_json::json!({"kind": "Environment", "spec": {
            "version": "1.0.0", "grader": {"kind": "exact"},
            "splits": {
                "test": {"tasks": [
                    {"id": "a", "prompt": "Say a.", "hidden": {"expected": "a"}},
                    {"id": "b", "prompt": "Say b."}]},
                "train": {"tasks": [{"id": "c", "prompt": "Say c.", "hidden": "c"}]},
                "gen": {"generator": {"kind": "arithmetic"}}}}});
        super::without_hidden(&mut document);
        assert_eq!(
            document,
            serde_json::json!({"kind": "Environment", "spec": {
                "version": "1.0.0", "grader": {"kind": "exact"},
                "splits": {
                    "test": {"tasks": [{"id": "a", "prompt": "Say a."},
                                       {"id": "b", "prompt": "Say b."}]},
                    "train": {"tasks": [{"id": "c", "prompt": "Say c."}]},
                    "gen": {"generator": {"kind": "arithmetic"}}}}})
        );
    }

    use super::*;

    #[test]
    fn the_sweep_removes_evidence_and_hidden_data_once() {
        let document = serde_json::json!({"spec": {"state": "Scored", "reward": 1.0, "verdict": "pass",
            "evidence": "the answer is 59", "hidden": {"expected": 59}}});
        let now = Timestamp::UNIX_EPOCH;
        let swept = without_payloads(&document, now).expect("swept");
        assert_eq!(
            swept,
            serde_json::json!({"spec": {"state": "Scored", "reward": 1.0, "verdict": "pass",
                "hidden": null, "payloadsRemovedAt": "1970-01-01T00:00:00Z"}})
        );
        assert_eq!(without_payloads(&swept, now), None);
    }
}

//! A finished run's results, as files to download: `inputWorkdir` and `outputWorkdir` (the
//! working directory as staged and as the run left it, `.tar.gz`), `artifacts` (`.tar.gz`:
//! `commands/NNN/{command,stdout,stderr,exit}` for each command, its output as the sandbox
//! kept it, at most [`Limits::output_cap_bytes`](crate::sandbox::Limits) of each stream),
//! `runRecord` (JSON: phase, answer, turns, cost, times, the image's digest it ran) and, for a run that did not succeed,
//! `error` (JSON: `type`, `message`, `timeout`), for a run whose sandbox had an allowlist
//! `egress` (JSON Lines: [`crate::egress_log`]), and what its post-run action saved (by its
//! own names). They are read from what the run keeps — its
//! document, its journal and its [`Kind::WorkdirArchive`] — so they are there however the
//! run ended (success, failure, timeout, cancellation), and go when the retention sweep or
//! deleting the run removes those.

use std::io::Write as _;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde::Serialize;

use super::{Engine, Error, Result, workdir_archive_key};
use crate::journal::{Intent, Outcome, Step};
use crate::lifecycle::{FailReason, RunPhase};
use crate::resource::{AgentRun, Kind};
use crate::store::{self, ObjectKey};

/// The names of a run's results, in the order they are listed.
pub const RESULT_NAMES: [&str; 7] = [
    "inputWorkdir",
    "outputWorkdir",
    "artifacts",
    "runRecord",
    "error",
    "trajectory",
    "egress",
];

/// One result of a run, as listed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct RunResultInfo {
    /// Its name (`outputWorkdir`).
    pub name: String,
    /// The file name it downloads as (`outputWorkdir.tar.gz`).
    pub file_name: String,
    /// Its media type.
    pub content_type: String,
    /// Its size in bytes.
    pub bytes: u64,
}

/// One result's contents.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunResult {
    /// What it is.
    pub info: RunResultInfo,
    /// Its bytes.
    pub content: Vec<u8>,
}

impl Engine {
    /// The results of a finished run (none before it finishes).
    pub async fn results(&self, project: &str, name: &str) -> Result<Vec<RunResultInfo>> {
        Ok(self
            .all_results(project, name)
            .await?
            .into_iter()
            .map(|result| result.info)
            .collect())
    }

    /// One result of a finished run; [`Error::NoSuchResult`] saying why when the run has no
    /// such result (it has not finished, it did not keep it, or there is no such name).
    pub async fn result(&self, project: &str, name: &str, result: &str) -> Result<RunResult> {
        let mut results = self.all_results(project, name).await?;
        if let Some(index) = results.iter().position(|r| r.info.name == result) {
            return Ok(results.swap_remove(index));
        }
        let run = self.read_run(project, name).await?.object;
        let why = if results.is_empty() {
            "it has not finished (results are kept when it ends)".to_string()
        } else if result == "trajectory" && !run.spec.auto_telemetry {
            "its spec.autoTelemetry is false, so no trajectory was kept".to_string()
        } else {
            let names: Vec<&str> = results.iter().map(|r| r.info.name.as_str()).collect();
            format!("its results are {}", names.join(", "))
        };
        Err(Error::NoSuchResult {
            run: name.to_string(),
            result: result.to_string(),
            why,
        })
    }

    async fn all_results(&self, project: &str, name: &str) -> Result<Vec<RunResult>> {
        let run = self.read_run(project, name).await?.object;
        let phase = run
            .status
            .phase
            .unwrap_or(RunPhase::Pending(crate::lifecycle::PendingReason::Queued));
        if !phase.is_finished() {
            return Ok(Vec::new());
        }
        let journal = self.deps.store.journal(super::run_uid(&run)).await?;
        let key = ObjectKey::new(project, Kind::AgentRun, name);
        let kept = match self.deps.store.get(&workdir_archive_key(&key)).await {
            Ok(record) => record.document,
            Err(store::Error::NotFound(_)) => serde_json::Value::Null,
            Err(e) => return Err(e.into()),
        };
        let archive = |document: &serde_json::Value| -> Result<Vec<u8>> {
            match document["archiveBase64"].as_str() {
                Some(encoded) => BASE64.decode(encoded).map_err(|e| Error::Corrupt {
                    key: workdir_archive_key(&key).to_string(),
                    message: format!("a kept archive is not base64: {e}"),
                }),
                // Nothing staged (or nothing kept): an empty directory.
                None => empty_tar(),
            }
        };
        let mut results = vec![
            file("inputWorkdir", gzip(&archive(&kept["input"])?)?),
            file("outputWorkdir", gzip(&archive(&kept)?)?),
            file("artifacts", gzip(&artifacts(&journal)?)?),
            file(
                "runRecord",
                json(&run_record(
                    &run,
                    phase,
                    crate::replay::Replay::of(&journal).answer(),
                ))?,
            ),
        ];
        if let Some(error) = error_record(&run, phase, &journal) {
            results.push(file("error", json(&error)?));
        }
        if run.spec.auto_telemetry {
            let inbox = self.deps.store.inbox(super::run_uid(&run)).await?;
            if let Some(trajectory) = crate::trajectory::trajectory(project, &run, &journal, &inbox)
            {
                let trajectory = serde_json::to_value(&trajectory).map_err(|e| Error::Corrupt {
                    key: key.to_string(),
                    message: format!("the trajectory does not encode: {e}"),
                })?;
                results.push(file("trajectory", json(&trajectory)?));
            }
        }
        // The connections its sandbox asked the egress proxy for, when it had an allowlist.
        let environment = run
            .status
            .snapshot
            .as_ref()
            .and_then(|s| s.environment.as_ref());
        if super::environment::egress_of(environment).is_some() {
            let log =
                crate::egress_log::read(self.deps.store.as_ref(), super::run_uid(&run)).await?;
            results.push(file("egress", log.json_lines()));
        }
        // What the post-run action saved.
        for (name, content) in action_results(&journal) {
            results.push(file(&name, content));
        }
        Ok(results)
    }

    /// Carry out the run's post-run action (step `seq` of its journal): the outcome to
    /// journal.
    pub(super) async fn post_run_action(
        &self,
        fixed: &super::execute::Fixed,
        run: &AgentRun,
        replay: &crate::replay::Replay,
        seq: u32,
        kind: &str,
        config: &serde_json::Value,
    ) -> Outcome {
        let failed = |error: String| Outcome::Failed {
            error,
            by_resolution: false,
        };
        let Some(action) = self.config.actions.get(kind) else {
            return failed(format!(
                "the post-run action {kind} is not installed on this server"
            ));
        };
        let secrets = if action.secret_refs(config).is_empty() {
            crate::secret::PinnedSecrets::new()
        } else {
            match self.pinned_secrets(&fixed.key).await {
                Ok(secrets) => secrets,
                Err(error) => return failed(error),
            }
        };
        let context = crate::postrun::ActionContext {
            run: format!("{}/{}", fixed.project, run.name()),
            idempotency_key: format!("{}-{seq}", fixed.uid),
            config: config.clone(),
            run_record: run_record(run, RunPhase::Succeeded, replay.answer()),
            secrets,
        };
        match action.run(&context).await {
            Ok(saved) => Outcome::ActionFinished {
                results: saved
                    .into_iter()
                    .map(|(name, bytes)| (name, BASE64.encode(bytes)))
                    .collect(),
            },
            Err(error) => failed(error),
        }
    }
}

/// The results a post-run action saved, by name.
fn action_results(journal: &[Step]) -> Vec<(String, Vec<u8>)> {
    journal
        .iter()
        .filter_map(|step| match step.outcome() {
            Some(Outcome::ActionFinished { results }) => Some(results),
            _ => None,
        })
        .flat_map(|results| {
            results
                .iter()
                .filter(|(name, _)| !RESULT_NAMES.contains(&name.as_str()))
                .map(|(name, encoded)| (name.clone(), BASE64.decode(encoded).unwrap_or_default()))
        })
        .collect()
}

/// A result named `name`: a `.tar.gz` or a `.json` by its name.
fn file(name: &str, content: Vec<u8>) -> RunResult {
    let directory = name.ends_with("Workdir") || name == "artifacts";
    let (extension, content_type) = if directory {
        ("tar.gz", "application/gzip")
    } else if name == "egress" {
        ("jsonl", "application/jsonl")
    } else {
        ("json", "application/json")
    };
    RunResult {
        info: RunResultInfo {
            name: name.to_string(),
            file_name: format!("{name}.{extension}"),
            content_type: content_type.to_string(),
            bytes: content.len() as u64,
        },
        content,
    }
}

fn json(value: &serde_json::Value) -> Result<Vec<u8>> {
    let mut bytes = serde_json::to_vec_pretty(value).map_err(|e| Error::Corrupt {
        key: "a result".to_string(),
        message: e.to_string(),
    })?;
    bytes.push(b'\n');
    Ok(bytes)
}

fn io_error(e: std::io::Error) -> Error {
    Error::Corrupt {
        key: "a result".to_string(),
        message: format!("cannot pack it: {e}"),
    }
}

fn gzip(bytes: &[u8]) -> Result<Vec<u8>> {
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    encoder.write_all(bytes).map_err(io_error)?;
    encoder.finish().map_err(io_error)
}

fn empty_tar() -> Result<Vec<u8>> {
    tar::Builder::new(Vec::new()).into_inner().map_err(io_error)
}

/// `commands/NNN/{command,stdout,stderr,exit}` for each command the run ran, numbered from 1
/// in the order they ran; `exit` holds the exit code, or why there is none.
fn artifacts(journal: &[Step]) -> Result<Vec<u8>> {
    let mut builder = tar::Builder::new(Vec::new());
    let mut add = |path: String, bytes: &[u8]| -> Result<()> {
        let mut header = tar::Header::new_gnu();
        header.set_size(bytes.len() as u64);
        header.set_mode(0o644);
        header.set_entry_type(tar::EntryType::Regular);
        builder
            .append_data(&mut header, path, bytes)
            .map_err(io_error)
    };
    let commands = journal.iter().filter_map(|step| match &step.intent {
        Intent::Command { command, .. } => Some((command, step.completion.as_ref())),
        _ => None,
    });
    for (index, (command, completion)) in commands.enumerate() {
        let dir = format!("commands/{:03}", index + 1);
        add(format!("{dir}/command"), command.as_bytes())?;
        let (stdout, stderr, exit) = match completion.map(|c| &c.outcome) {
            Some(Outcome::CommandFinished { output, .. }) => {
                let exit = if output.timed_out {
                    "timed out\n".to_string()
                } else if let Some(why) = &output.stopped {
                    format!("stopped: {why}\n")
                } else {
                    match output.exit_code {
                        Some(code) => format!("{code}\n"),
                        None => "killed by a signal\n".to_string(),
                    }
                };
                (
                    output.stdout.bytes.clone(),
                    output.stderr.bytes.clone(),
                    exit,
                )
            }
            Some(Outcome::Stopped { reason }) => {
                (Vec::new(), Vec::new(), format!("stopped: {reason}\n"))
            }
            Some(Outcome::Failed { error, .. }) => {
                (Vec::new(), Vec::new(), format!("failed: {error}\n"))
            }
            Some(_) => (Vec::new(), Vec::new(), "no outcome\n".to_string()),
            None => (Vec::new(), Vec::new(), "unknown: interrupted\n".to_string()),
        };
        add(format!("{dir}/stdout"), &stdout)?;
        add(format!("{dir}/stderr"), &stderr)?;
        add(format!("{dir}/exit"), exit.as_bytes())?;
    }
    builder.into_inner().map_err(io_error)
}

/// The run record: what the run was and how it ended.
fn run_record(run: &AgentRun, phase: RunPhase, answer: Option<String>) -> serde_json::Value {
    let snapshot = run.status.snapshot.as_ref();
    serde_json::json!({
        "name": run.name(),
        "project": run.metadata.project,
        "uid": run.metadata.uid,
        "agentRef": snapshot.and_then(|s| s.agent_ref.clone()),
        "imageDigest": snapshot.and_then(|s| s.image_digest.clone()),
        "phase": phase.name(),
        "reason": phase.reason(),
        "message": run.status.message,
        "answer": answer,
        "turns": run.status.turns,
        "cost": run.status.cost,
        "creationTimestamp": run.metadata.creation_timestamp,
        "startTime": run.status.start_time,
        "completionTime": run.status.completion_time,
    })
}

/// The error record of a run that did not succeed: `type` (its reason), `message`, and
/// whether a time limit ended it.
fn error_record(run: &AgentRun, phase: RunPhase, journal: &[Step]) -> Option<serde_json::Value> {
    if phase == RunPhase::Succeeded {
        return None;
    }
    if phase == RunPhase::Failed(FailReason::PostRunActionFailed) {
        let error = journal
            .iter()
            .rev()
            .find_map(|step| match (&step.intent, step.outcome()) {
                (Intent::PostRunAction { .. }, Some(Outcome::Failed { error, .. })) => {
                    Some(error.clone())
                }
                _ => None,
            });
        return Some(serde_json::json!({
            "type": "PostRunActionFailed",
            "message": error.unwrap_or_else(|| "the post-run action failed".to_string()),
            "timeout": false,
        }));
    }
    let timeout = matches!(
        phase,
        RunPhase::Failed(FailReason::TimeoutExceeded | FailReason::DeadlineExceeded)
    );
    Some(serde_json::json!({
        "type": phase.reason().unwrap_or(phase.name()),
        "message": run.status.message.clone().unwrap_or_else(|| format!("the run ended {}", phase.name())),
        "timeout": timeout,
    }))
}

//! Retention: which runs' recorded payloads are removed, and what of them. The sweep finds the
//! runs that ended before a cut-off and have not been swept, and has the store rewrite each in
//! one write ([`Store::rewrite_run`]): the payloads of its document, steps and messages go,
//! what accounts for the run (kinds, times, models, tokens, costs, exit codes) stays, and its
//! kept final working directory and its egress log (the connections its sandbox made; their
//! counts stay in `status.egress`) are deleted with them. The store only applies these edits.

use jiff::Timestamp;
use serde_json::{Value, json};

use crate::journal::{Intent, Outcome, Step};
use crate::model::ContentBlock;
use crate::output::Output;
use crate::resource::Kind;
use crate::store::{
    Error, InboxMessage, ObjectKey, RunRewrite, Selector, Store, workdir_archive_key,
};

/// What stands in for removed text.
pub const REMOVED: &str = "";

/// How often a run that changed between the listing and its rewrite is read again before the
/// sweep leaves it to the next one.
const ATTEMPTS: usize = 3;

/// What a retention sweep did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Swept {
    /// The runs whose payloads were removed, each now marked `status.payloadsRemovedAt`.
    pub runs: Vec<ObjectKey>,
}

/// The paths of a run document the sweep reads to choose.
const PATHS: [&str; 3] = [
    "metadata.uid",
    "status.completionTime",
    "status.payloadsRemovedAt",
];

/// Remove the recorded payloads of every run of `projects` that ended
/// (`status.completionTime`) before `ended_before` and was not swept yet: its input
/// (`spec.input`), the answer preview, its inbox messages' text and its steps' contents
/// (commands, their output, model replies' content, error texts), in one write per run that
/// also marks it `status.payloadsRemovedAt: now` and deletes its kept final working directory
/// (the `WorkdirArchive` of its name) and its egress log ([`crate::egress_log`]), and strips the copies of it kept for an idempotent
/// batch; its working-directory snapshots go too, with the contents no other run's snapshot
/// names. Runs of a project are swept in creation order, projects in the order given. A run
/// that changes while it is swept is read again; several sweepers at once sweep each run
/// once.
pub async fn sweep(
    store: &dyn Store,
    projects: &[String],
    ended_before: Timestamp,
    now: Timestamp,
) -> Result<Swept, Error> {
    let mut swept = Swept::default();
    for project in projects {
        let runs = store
            .list_sparse(project, Kind::AgentRun, &Selector::default(), &PATHS)
            .await?;
        for run in runs {
            if !due(&run.document, ended_before) {
                continue;
            }
            // Its working-directory snapshots go first (and the contents no other run names):
            // should the rewrite fail, the next sweep finds the run due and goes on.
            // Its egress log goes in the rewrite's write.
            let mut egress = Vec::new();
            if let Some(uid) = run.document["metadata"]["uid"].as_str() {
                store.delete_snapshots(uid).await?;
                egress = crate::egress_log::stored_keys(store, uid).await?;
            }
            let swept_run = sweep_run(
                store,
                run.key.clone(),
                run.version,
                &egress,
                ended_before,
                now,
            );
            if swept_run.await? {
                swept.runs.push(run.key);
            }
        }
    }
    Ok(swept)
}

/// Sweep one run listed at `version`; whether it was swept (not when it was deleted, swept by
/// someone else or changed past being due meanwhile).
async fn sweep_run(
    store: &dyn Store,
    key: ObjectKey,
    mut version: u64,
    egress: &[ObjectKey],
    ended_before: Timestamp,
    now: Timestamp,
) -> Result<bool, Error> {
    for _ in 0..ATTEMPTS {
        match store
            .rewrite_run(rewrite(key.clone(), version, egress, now))
            .await
        {
            Ok(_) => return Ok(true),
            Err(Error::NotFound(_)) => return Ok(false),
            Err(Error::Conflict { .. }) => match store.get(&key).await {
                Ok(record) if due(&record.document, ended_before) => version = record.version,
                Ok(_) | Err(Error::NotFound(_)) => return Ok(false),
                Err(error) => return Err(error),
            },
            Err(error) => return Err(error),
        }
    }
    // It keeps changing (a busy run would not be due): the next sweep looks again.
    Ok(false)
}

/// The rewrite that removes the payloads of `run`, stored at `version`, with the documents
/// of its egress log (`egress`).
fn rewrite(run: ObjectKey, version: u64, egress: &[ObjectKey], now: Timestamp) -> RunRewrite {
    let mut delete = vec![workdir_archive_key(&run)];
    delete.extend_from_slice(egress);
    RunRewrite {
        delete,
        run,
        expected_version: version,
        document: Box::new(move |document| strip_run(document, now)),
        step: Box::new(strip_step),
        message: Box::new(strip_message),
    }
}

/// Whether a run document is due for a sweep: it finished before `ended_before` and was not
/// swept yet.
pub fn due(document: &Value, ended_before: Timestamp) -> bool {
    let status = &document["status"];
    if !status["payloadsRemovedAt"].is_null() {
        return false;
    }
    status["completionTime"]
        .as_str()
        .and_then(|text| text.parse::<Timestamp>().ok())
        .is_some_and(|ended| ended < ended_before)
}

/// The run document without its input and answer preview, marked as swept at `now`.
pub fn strip_run(document: &mut Value, now: Timestamp) {
    if let Some(spec) = document.get_mut("spec").and_then(Value::as_object_mut) {
        spec.remove("input");
    }
    if let Some(preview) = document
        .get_mut("status")
        .and_then(|s| s.get_mut("answer"))
        .and_then(|a| a.get_mut("preview"))
    {
        *preview = json!(REMOVED);
    }
    if let Some(status) = document.get_mut("status").and_then(Value::as_object_mut) {
        status.insert("payloadsRemovedAt".to_string(), json!(now.to_string()));
    } else if let Some(object) = document.as_object_mut() {
        object.insert(
            "status".to_string(),
            json!({ "payloadsRemovedAt": now.to_string() }),
        );
    }
}

/// The message without its text; its number, key and time stay.
pub fn strip_message(message: &mut InboxMessage) {
    message.payload = REMOVED.to_string();
}

/// The step without its contents: commands, their output, model replies' content, error
/// texts. Kinds, times, sequence numbers, models, token counts, costs and exit codes stay.
pub fn strip_step(step: &mut Step) {
    if let Intent::Command { command, .. } = &mut step.intent {
        *command = REMOVED.to_string();
    }
    let Some(completion) = step.completion.as_mut() else {
        return;
    };
    match &mut completion.outcome {
        Outcome::CommandFinished { output, .. } => {
            output.stdout = Output::complete(Vec::new());
            output.stderr = Output::complete(Vec::new());
        }
        Outcome::ModelReplied { response, .. } => {
            for block in &mut response.content {
                match block {
                    ContentBlock::Text { text } => *text = REMOVED.to_string(),
                    ContentBlock::ToolUse { input, .. } => *input = Value::Null,
                    ContentBlock::ToolResult { content, .. } => *content = REMOVED.to_string(),
                }
            }
        }
        Outcome::Failed { error, .. } => *error = REMOVED.to_string(),
        // What a post-run action saved is a payload of the run.
        Outcome::ActionFinished { results } => results.clear(),
        Outcome::Routed {
            fallback_reason, ..
        } => *fallback_reason = None,
        Outcome::SandboxCreated { .. }
        | Outcome::MessageRead
        | Outcome::Answered
        | Outcome::SandboxDestroyed
        | Outcome::Superseded
        // Says only how the run ended.
        | Outcome::Stopped { .. } => {}
    }
}

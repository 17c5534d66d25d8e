//! What the retention sweep removes, shared by every backend: the payloads of a step and of a
//! run document, keeping what accounts for the run (kinds, times, models, tokens, costs).

use jiff::Timestamp;
use nodus_core::journal::{Intent, Outcome, Step};
use nodus_core::model::ContentBlock;
use nodus_core::output::Output;
use serde_json::{Value, json};

/// What stands in for removed text.
pub const REMOVED: &str = "";

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

/// The copies in an idempotent batch's records of the runs just swept, stripped the same
/// way; whether any was.
pub fn strip_batch(
    records: &mut [nodus_core::store::Record],
    swept: &[nodus_core::store::ObjectKey],
    now: Timestamp,
) -> bool {
    let mut changed = false;
    for record in records.iter_mut().filter(|r| swept.contains(&r.key)) {
        strip_run(&mut record.document, now);
        changed = true;
    }
    changed
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
        Outcome::CommandFinished { output } => {
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

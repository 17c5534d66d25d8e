//! The run's own span (`invoke_agent`), exported once by the write that finished the run:
//! by its drive, or by a write that ended it before any drive (cancelled while queued,
//! cancelled by its group, failed in its group's queue at its deadline).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use super::Engine;
use crate::lifecycle::RunPhase;
use crate::money::Usd;
use crate::resource::{AgentRun, Kind};
use crate::store::{Edit, ObjectKey};

impl Engine {
    /// The uid of the group a run's span links to; `None` without a group, or when the group
    /// cannot be read (the span then has no link rather than no export).
    pub(super) async fn group_uid(&self, project: &str, group: Option<&str>) -> Option<String> {
        let key = ObjectKey::new(project, Kind::AgentGroup, group?);
        let record = self.deps.store.get(&key).await.ok()?;
        record.document["metadata"]["uid"]
            .as_str()
            .map(str::to_string)
    }

    /// Export the span of a run that a write just finished without driving it: `run` as that
    /// write stored it. Nothing ran, so nothing was spent and no step has a span; it starts
    /// when the run was created and ends when it finished.
    pub(super) async fn undriven_run_ended(&self, project: &str, run: &AgentRun) {
        let Some(phase) = run.status.phase.filter(|phase| phase.is_finished()) else {
            return;
        };
        let Some(ctx) = super::span_context(&self.deps, project, run) else {
            return;
        };
        let end = run
            .status
            .completion_time
            .unwrap_or_else(|| self.deps.clock.now());
        let ended = crate::telemetry::Ended {
            start: run.metadata.creation_timestamp.unwrap_or(end),
            end,
            phase: phase.name(),
            succeeded: phase == RunPhase::Succeeded,
            cost: Usd::ZERO,
        };
        let group_uid = self.group_uid(project, run.spec.group.as_deref()).await;
        self.deps.spans.export(crate::telemetry::run_span(
            &ctx,
            &ended,
            group_uid.as_deref(),
        ));
    }

    /// After `modify` with an edit made by [`tracked`]: export the run's span when that edit
    /// is what the store kept and it finished the run.
    pub(super) async fn undriven_write_ended(
        &self,
        project: &str,
        written: &crate::store::Record,
        applied: &AtomicBool,
    ) {
        if !self.deps.spans.enabled() || !applied.load(Ordering::Acquire) {
            return;
        }
        match super::typed::decode::<crate::resource::AgentRunSpec>(written.clone()) {
            Ok(run) => self.undriven_run_ended(project, &run.object).await,
            Err(error) => {
                tracing::warn!(run = %written.key, error = %error, "no span for a run that cannot be read");
            }
        }
    }
}

/// `edit` as the store runs it, and a flag saying whether its last run changed the document:
/// the store keeps the last run's answer, so after `modify` returns the flag tells whether
/// this edit is the write that was kept.
pub(super) fn tracked(
    mut edit: impl FnMut(&serde_json::Value) -> Option<serde_json::Value> + Send + 'static,
) -> (Edit, Arc<AtomicBool>) {
    let applied = Arc::new(AtomicBool::new(false));
    let flag = applied.clone();
    let edit: Edit = Box::new(move |document| {
        let changed = edit(document);
        flag.store(changed.is_some(), Ordering::Release);
        changed
    });
    (edit, applied)
}

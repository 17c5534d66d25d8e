//! What a command grader's sandbox shows beyond its staged inputs: the absolute paths it
//! finds them at, the id of the task it grades, and (for graders written for Harbor) the
//! reward files read back after the command.

use std::collections::BTreeMap;

use super::Engine;
use super::evaluation::GraderOutcome;
use crate::evaluation::grade;
use crate::sandbox::SandboxId;

/// Where a command grader finds its inputs besides its working directory's `grading/` and
/// `grader/`: `/grading` and `/grader`, as DESIGN.md and the docs write them; and, for tests
/// written for Harbor, `/tests` and `/logs` (Harbor's verifier copies a task's tests to
/// `/tests` and reads its reward from `/logs/verifier/`), which are `grading/tests` and
/// `grading/logs`.
pub(super) fn grader_links() -> BTreeMap<String, String> {
    [
        ("/grading", "grading"),
        ("/grader", "grader"),
        ("/tests", "grading/tests"),
        ("/logs", "grading/logs"),
    ]
    .into_iter()
    .map(|(path, target)| (path.to_string(), target.to_string()))
    .collect()
}

/// The environment variable that tells a command grader which task it grades.
pub const GRADER_TASK_ID_VARIABLE: &str = "NODUS_TASK_ID";
/// Where a `harborReward` grader's reward files are, in the grader's working directory
/// (`/logs/verifier` in the sandbox).
pub(super) const HARBOR_VERIFIER_DIR: &str = "grading/logs/verifier";
/// The most bytes of Harbor's verifier directory read back.
pub(super) const HARBOR_VERIFIER_BYTES: usize = 1024 * 1024;

impl Engine {
    /// The verdict of a `harborReward` grader: its reward files, read back from the sandbox.
    pub(super) async fn harbor_reward(&self, id: &SandboxId) -> GraderOutcome {
        let tar = match self
            .deps
            .sandbox
            .get_files(id, HARBOR_VERIFIER_DIR, HARBOR_VERIFIER_BYTES)
            .await
        {
            Ok(tar) => tar,
            Err(e) if e.is_retryable() => return GraderOutcome::Retry,
            Err(e) => {
                return GraderOutcome::Failed(format!(
                    "no reward file: /logs/verifier could not be read ({e})"
                ));
            }
        };
        let read = |name: &str| -> std::result::Result<Option<Vec<u8>>, String> {
            let wanted = format!("{HARBOR_VERIFIER_DIR}/{name}");
            let mut archive = tar::Archive::new(tar.as_slice());
            for entry in archive.entries().map_err(|e| e.to_string())? {
                let mut entry = entry.map_err(|e| e.to_string())?;
                let path = entry.path().map_err(|e| e.to_string())?;
                if path.to_string_lossy().trim_start_matches("./") == wanted
                    && entry.header().entry_type() == tar::EntryType::Regular
                {
                    let mut bytes = Vec::new();
                    std::io::Read::read_to_end(&mut entry, &mut bytes)
                        .map_err(|e| e.to_string())?;
                    return Ok(Some(bytes));
                }
            }
            Ok(None)
        };
        let files = read("reward.json").and_then(|json| Ok((json, read("reward.txt")?)));
        match files.and_then(|(json, text)| grade::harbor_reward(json.as_deref(), text.as_deref()))
        {
            Ok(grade) => GraderOutcome::Graded(grade),
            Err(error) => GraderOutcome::Failed(error),
        }
    }
}

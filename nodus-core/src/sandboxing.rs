//! The executor's sandbox rules as pure functions: the image a run's sandbox runs, whether a
//! waiting run's sandbox is suspended, what follows a command that found no sandbox or did
//! not start, and what a sandbox whose staging failed becomes. The executor only carries
//! out what these say.

use crate::decide;
use crate::journal::Outcome;
use crate::lifecycle::WaitReason;
use crate::sandbox::{self, SandboxId, SandboxInfo};

/// The image a run's sandbox runs: the digest pinned when the run was created; for a run
/// created before images were pinned, its `spec.image` reference as it resolves now, else the
/// engine's default image.
pub fn image(pinned: Option<&str>, written: Option<&str>, default: Option<&str>) -> Option<String> {
    pinned.or(written).or(default).map(str::to_string)
}

/// Whether a run that stops to wait for `reason` suspends its live sandbox: only one waiting
/// for a message (a conversation may wait long and holds no process meanwhile). A run waiting
/// for funds or at its cap keeps its sandbox as it is.
pub fn suspends_while(reason: WaitReason) -> bool {
    reason == WaitReason::AwaitingMessage
}

/// Whether a command that failed with `error` is run again in a re-created sandbox: its
/// sandbox is gone (created before a restart; creation is idempotent by key, over the same
/// working directory).
pub fn recreates_after(error: &sandbox::Error) -> bool {
    matches!(error, sandbox::Error::NotFound(_))
}

/// Whether a command that failed with `error` on its `attempt`-th try (from 1) is tried
/// again after the engine's pause: it did not start (the host out of descriptors, say) and
/// fewer than `attempts` were made.
pub fn starts_again(error: &sandbox::Error, attempt: u32, attempts: u32) -> bool {
    matches!(error, sandbox::Error::NotStarted(_)) && attempt < attempts
}

/// What creating a run's sandbox comes to once its working directory was staged
/// (`staged`): the step's outcome, and the sandbox to remove first when the step fails (a run
/// whose step failed holds no sandbox).
pub fn after_staging(
    info: SandboxInfo,
    staged: Result<(), String>,
) -> (Outcome, Option<SandboxId>) {
    match staged {
        Ok(()) => (Outcome::SandboxCreated { info }, None),
        Err(error) => (decide::failed(error), Some(info.id)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_image_is_the_pinned_digest_then_the_reference_then_the_default() {
        let table = [
            (
                (Some("sha256:a"), Some("ref"), Some("default")),
                Some("sha256:a"),
            ),
            ((None, Some("ref"), Some("default")), Some("ref")),
            ((None, None, Some("default")), Some("default")),
            ((Some("sha256:a"), None, None), Some("sha256:a")),
            ((None, None, None), None),
        ];
        for ((pinned, written, default), expected) in table {
            assert_eq!(
                image(pinned, written, default).as_deref(),
                expected,
                "{pinned:?} {written:?} {default:?}"
            );
        }
    }

    #[test]
    fn only_a_run_waiting_for_a_message_suspends_its_sandbox() {
        let table = [
            (WaitReason::AwaitingMessage, true),
            (WaitReason::AwaitingFunds, false),
            (WaitReason::MaxCostReached, false),
        ];
        for (reason, suspends) in table {
            assert_eq!(suspends_while(reason), suspends, "{reason:?}");
        }
    }

    #[test]
    fn a_missing_sandbox_is_re_created_and_a_command_not_started_is_tried_again() {
        let id = || SandboxId("s".to_string());
        let errors = [
            sandbox::Error::NotFound(id()),
            sandbox::Error::NotStarted("EMFILE".to_string()),
            sandbox::Error::Unavailable("restarting".to_string()),
            sandbox::Error::Refused("no".to_string()),
            sandbox::Error::Failed("broken".to_string()),
        ];
        // (error index, attempt, attempts) -> (re-created, tried again)
        let table = [
            (0, 1, 3, true, false),
            (1, 1, 3, false, true),
            (1, 2, 3, false, true),
            (1, 3, 3, false, false),
            (1, 1, 1, false, false),
            (2, 1, 3, false, false),
            (3, 1, 3, false, false),
            (4, 1, 3, false, false),
        ];
        for (error, attempt, attempts, recreated, again) in table {
            let error = &errors[error];
            assert_eq!(recreates_after(error), recreated, "{error:?}");
            assert_eq!(
                starts_again(error, attempt, attempts),
                again,
                "{error:?} attempt {attempt} of {attempts}"
            );
        }
    }

    #[test]
    fn a_sandbox_whose_staging_failed_is_removed_and_the_step_fails() {
        let info = SandboxInfo {
            id: SandboxId("s".to_string()),
            isolated: true,
            host: None,
        };
        let (outcome, destroy) = after_staging(info.clone(), Ok(()));
        assert_eq!(outcome, Outcome::SandboxCreated { info: info.clone() });
        assert_eq!(destroy, None);
        let (outcome, destroy) = after_staging(info, Err("too large".to_string()));
        assert_eq!(outcome, decide::failed("too large".to_string()));
        assert_eq!(destroy, Some(SandboxId("s".to_string())));
    }
}

//! What the engine writes to a group's members: the writes that carry a reconcile's
//! [`Plan`] out (each member's phase and `status.message`), and which members a group's
//! cancellation flags.

use super::{GroupPhase, Member, Plan};
use crate::lifecycle::{CancelReason, RunEvent, RunPhase, TransitionRefused};

/// One member's write that carries a plan out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberWrite {
    /// The member's index in the reconciled members.
    pub index: usize,
    /// Its phase once written (the phase it was read in when only its message changes).
    pub phase: RunPhase,
    /// Its `status.message`: `Some(text)` written, `None` removed.
    pub message: Message,
}

/// What a member write does to the member's `status.message`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    /// Left as it is (a cancelled run keeps its message).
    Kept,
    /// Written (`Some`) or removed (`None`).
    Set(Option<String>),
}

impl Plan {
    /// The writes that carry this plan out on `members`, whose stored `status.message` is
    /// `messages` (index for index): a member the plan starts no longer says why it waited,
    /// a queued member says why it can never start ([`Plan::never_fit`]) or nothing, and a
    /// cancelled member keeps its message. A member whose phase and message would stay as
    /// they are gets no write. A move the lifecycle refuses is an error (never forced).
    pub fn writes(
        &self,
        members: &[Member],
        messages: &[Option<&str>],
    ) -> Result<Vec<MemberWrite>, TransitionRefused> {
        let changes = self
            .start
            .iter()
            .map(|&i| (i, RunEvent::Start))
            .chain(
                self.cancel
                    .iter()
                    .map(|&(i, reason)| (i, RunEvent::Cancel(reason))),
            )
            .chain(
                self.queue
                    .iter()
                    .map(|&(i, reason)| (i, RunEvent::Queue(reason))),
            );
        let mut writes = Vec::new();
        for (index, event) in changes {
            let Some(member) = members.get(index) else {
                continue;
            };
            let phase = member.phase.apply(event)?;
            let message = match event {
                RunEvent::Queue(_) => Message::Set(
                    self.never_fit
                        .iter()
                        .find(|(i, _)| *i == index)
                        .map(|(_, message)| message.clone()),
                ),
                RunEvent::Start => Message::Set(None),
                _ => Message::Kept,
            };
            let stored = messages.get(index).copied().flatten();
            let message_changes = match &message {
                Message::Kept => false,
                Message::Set(message) => message.as_deref() != stored,
            };
            if phase == member.phase && !message_changes {
                continue;
            }
            writes.push(MemberWrite {
                index,
                phase,
                message,
            });
        }
        Ok(writes)
    }
}

/// The phase a group takes when it is cancelled in `phase`: `Cancelling` (the reconcile that
/// follows cancels its queued members, and it is `Cancelled` once every member has finished),
/// or `None` for a finished group, which stays as it is.
pub fn cancelled(phase: Option<GroupPhase>) -> Option<GroupPhase> {
    match phase {
        Some(phase) if phase.is_finished() => None,
        _ => Some(GroupPhase::Cancelling),
    }
}

/// The members a group's cancellation flags, with the reason: each started, unfinished one
/// (its drive stops its command, deletes its sandbox and ends it). A queued member is
/// cancelled by the reconcile of the cancelling group instead, and a finished one keeps its
/// answer.
pub fn flagged_on_cancel(members: &[Member]) -> Vec<(usize, CancelReason)> {
    members
        .iter()
        .enumerate()
        .filter(|(_, member)| member.phase.is_started())
        .map(|(index, _)| (index, CancelReason::GroupCancelled))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lifecycle::{FailReason, PendingReason, WaitReason};
    use crate::money::Usd;

    fn member(phase: RunPhase) -> Member {
        Member {
            task_key: String::new(),
            depends_on: Vec::new(),
            cap: Usd::ZERO,
            spent: Usd::ZERO,
            phase,
        }
    }

    const QUEUED: RunPhase = RunPhase::Pending(PendingReason::Queued);
    const GROUP_WAIT: RunPhase = RunPhase::Pending(PendingReason::GroupWait);
    const DEPENDENCY_WAIT: RunPhase = RunPhase::Pending(PendingReason::DependencyWait);

    #[test]
    fn each_member_gets_its_phase_and_message_and_an_unchanged_one_no_write() {
        let set = |text: &str| Message::Set(Some(text.to_string()));
        // Members 0..=6, as read: phase and stored message.
        let members = [
            member(GROUP_WAIT),      // 0: started
            member(QUEUED),          // 1: stays queued, GroupWait, can never fit
            member(GROUP_WAIT),      // 2: stays GroupWait, no message: nothing to write
            member(DEPENDENCY_WAIT), // 3: DependencyWait, the never-fit message already there
            member(QUEUED),          // 4: cancelled, keeps its message
            member(GROUP_WAIT),      // 5: stays GroupWait, its old message removed
            member(DEPENDENCY_WAIT), // 6: moves to GroupWait
        ];
        let messages = [
            Some("waited"),
            None,
            None,
            Some("never"),
            Some("kept"),
            Some("old"),
            None,
        ];
        let plan = Plan {
            start: vec![0],
            cancel: vec![(4, CancelReason::DependencyFailed)],
            queue: vec![
                (1, PendingReason::GroupWait),
                (2, PendingReason::GroupWait),
                (3, PendingReason::DependencyWait),
                (5, PendingReason::GroupWait),
                (6, PendingReason::GroupWait),
            ],
            never_fit: vec![(1, "never".to_string()), (3, "never".to_string())],
            status: Default::default(),
        };
        let expected = vec![
            MemberWrite {
                index: 0,
                phase: RunPhase::Running,
                message: Message::Set(None),
            },
            MemberWrite {
                index: 4,
                phase: RunPhase::Cancelled(CancelReason::DependencyFailed),
                message: Message::Kept,
            },
            MemberWrite {
                index: 1,
                phase: GROUP_WAIT,
                message: set("never"),
            },
            MemberWrite {
                index: 5,
                phase: GROUP_WAIT,
                message: Message::Set(None),
            },
            MemberWrite {
                index: 6,
                phase: GROUP_WAIT,
                message: Message::Set(None),
            },
        ];
        assert_eq!(plan.writes(&members, &messages), Ok(expected));
    }

    #[test]
    fn a_plan_the_lifecycle_refuses_is_an_error() {
        // A finished member cannot be started again.
        let plan = Plan {
            start: vec![0],
            ..Plan::default()
        };
        let refused = plan
            .writes(&[member(RunPhase::Succeeded)], &[None])
            .expect_err("refused");
        assert_eq!(refused.from, RunPhase::Succeeded);
        assert_eq!(refused.event, RunEvent::Start);
    }

    #[test]
    fn a_finished_group_stays_and_any_other_goes_cancelling() {
        let table = [
            (None, Some(GroupPhase::Cancelling)),
            (Some(GroupPhase::Running), Some(GroupPhase::Cancelling)),
            (Some(GroupPhase::Cancelling), Some(GroupPhase::Cancelling)),
            (Some(GroupPhase::Succeeded), None),
            (Some(GroupPhase::FailedRunsFailed), None),
            (Some(GroupPhase::Cancelled), None),
        ];
        for (phase, expected) in table {
            assert_eq!(cancelled(phase), expected, "{phase:?}");
        }
    }

    #[test]
    fn a_group_s_cancellation_flags_its_started_unfinished_members_only() {
        let members = [
            member(QUEUED),                                             // 0
            member(RunPhase::Running),                                  // 1
            member(RunPhase::Waiting(WaitReason::AwaitingMessage)),     // 2
            member(RunPhase::NeedsResolution),                          // 3
            member(RunPhase::Succeeded),                                // 4
            member(RunPhase::Failed(FailReason::ModelCallFailed)),      // 5
            member(RunPhase::Cancelled(CancelReason::CancelRequested)), // 6
            member(GROUP_WAIT),                                         // 7
            member(RunPhase::Waiting(WaitReason::MaxCostReached)),      // 8
        ];
        let group = CancelReason::GroupCancelled;
        assert_eq!(
            flagged_on_cancel(&members),
            vec![(1, group), (2, group), (3, group), (8, group)]
        );
    }
}

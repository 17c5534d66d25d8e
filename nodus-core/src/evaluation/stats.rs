//! The summary of an evaluation (`status.evaluation`), computed from its cases every time:
//! never a counter kept on the side that could drift from them.
//!
//! Pass rate and mean reward are over the scored cases only (`n` of them); an unscored case
//! is never a zero. The bracket says how far the cases without a score (unscored or still
//! pending) could move the pass rate: `low` if every one of them had failed, `high` if every
//! one had passed. The interval is the Wilson score interval at 95 % for the pass rate over
//! the `n` scored cases.
//!
//! These are fractions, not money: floating point is fine here.
#![allow(clippy::float_arithmetic)]

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{CaseRecord, CaseState, UnscoredReason, Verdict};

/// The normal quantile for a two-sided 95 % interval.
pub const Z95: f64 = 1.959_963_984_540_054;

/// `status.evaluation` of an evaluation group.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EvaluationStatus {
    /// Cases in the batch (tasks × repetitions).
    pub cases: u32,
    /// Cases without their terminal state yet.
    pub pending: u32,
    /// Cases graded.
    pub scored: u32,
    /// Cases ended without a score, by reason.
    #[serde(default)]
    pub unscored: BTreeMap<UnscoredReason, u32>,
    /// Passed ÷ scored; absent while nothing is scored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pass_rate: Option<f64>,
    /// Mean reward of the scored cases; absent while nothing is scored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mean_reward: Option<f64>,
    /// The number of scored cases the rates are over.
    pub n: u32,
    /// The pass rate if every case without a score had failed (`low`) or passed (`high`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bracket: Option<Range>,
    /// The 95 % Wilson interval of the pass rate; absent while nothing is scored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interval: Option<Range>,
}

/// A range of fractions.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Range {
    /// The lower end.
    pub low: f64,
    /// The upper end.
    pub high: f64,
}

/// The summary of these cases.
pub fn summarize(cases: &[CaseRecord]) -> EvaluationStatus {
    let mut status = EvaluationStatus {
        cases: count(cases.len()),
        ..EvaluationStatus::default()
    };
    let mut passed = 0u32;
    let mut rewards = 0.0;
    for case in cases {
        match case.state {
            CaseState::Pending => status.pending += 1,
            CaseState::Scored => {
                status.scored += 1;
                rewards += case.reward.unwrap_or(0.0);
                if case.verdict == Some(Verdict::Pass) {
                    passed += 1;
                }
            }
            CaseState::Unscored => {
                let reason = case.reason.unwrap_or(UnscoredReason::RunFailed);
                *status.unscored.entry(reason).or_default() += 1;
            }
        }
    }
    status.n = status.scored;
    if status.scored > 0 {
        let n = f64::from(status.scored);
        status.pass_rate = Some(f64::from(passed) / n);
        status.mean_reward = Some(rewards / n);
        status.interval = Some(wilson(passed, status.scored, Z95));
    }
    if status.cases > 0 {
        let all = f64::from(status.cases);
        let unknown = status.cases - status.scored;
        status.bracket = Some(Range {
            low: f64::from(passed) / all,
            high: f64::from(passed + unknown) / all,
        });
    }
    status
}

/// The Wilson score interval of `passed` successes in `n` trials at quantile `z`.
pub fn wilson(passed: u32, n: u32, z: f64) -> Range {
    if n == 0 {
        return Range {
            low: 0.0,
            high: 1.0,
        };
    }
    let n = f64::from(n);
    let p = f64::from(passed) / n;
    let z2 = z * z;
    let denominator = 1.0 + z2 / n;
    let center = (p + z2 / (2.0 * n)) / denominator;
    let half = z * (p * (1.0 - p) / n + z2 / (4.0 * n * n)).sqrt() / denominator;
    Range {
        low: (center - half).max(0.0),
        high: (center + half).min(1.0),
    }
}

fn count(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::evaluation::Grade;

    fn case(index: u32) -> CaseRecord {
        CaseRecord {
            group: "g".into(),
            index,
            task_id: format!("t{index}"),
            repetition: 1,
            run: format!("g-c{index:03}"),
            environment: "nodus/arithmetic-v2@2.0.0".into(),
            split: "test".into(),
            seed: 42,
            image_digest: String::new(),
            hidden: serde_json::Value::Null,
            deadline: jiff::Timestamp::UNIX_EPOCH,
            state: CaseState::Pending,
            reason: None,
            reward: None,
            verdict: None,
            evidence: None,
            gradings: Vec::new(),
            completion_time: None,
            payloads_removed_at: None,
        }
    }

    fn scored(index: u32, reward: f64, verdict: Verdict) -> CaseRecord {
        case(index).scored(
            Grade {
                reward,
                verdict,
                evidence: String::new(),
            },
            jiff::Timestamp::UNIX_EPOCH,
        )
    }

    fn unscored(index: u32, reason: UnscoredReason) -> CaseRecord {
        case(index).unscored(reason, String::new(), jiff::Timestamp::UNIX_EPOCH)
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-6
    }

    #[test]
    fn unscored_cases_leave_the_rates_alone_and_widen_the_bracket() {
        // 5 cases: 2 passed (rewards 1, 1), 1 failed (0.5), 1 no answer, 1 pending.
        let cases = vec![
            scored(0, 1.0, Verdict::Pass),
            scored(1, 1.0, Verdict::Pass),
            scored(2, 0.5, Verdict::Fail),
            unscored(3, UnscoredReason::NoAnswer),
            case(4),
        ];
        let status = summarize(&cases);
        assert_eq!(status.cases, 5);
        assert_eq!(status.pending, 1);
        assert_eq!(status.scored, 3);
        assert_eq!(status.n, 3);
        assert_eq!(
            status.unscored,
            BTreeMap::from([(UnscoredReason::NoAnswer, 1)])
        );
        // By hand: 2/3 passed; (1 + 1 + 0.5)/3 mean reward.
        assert!(close(status.pass_rate.unwrap(), 0.666_666_7));
        assert!(close(status.mean_reward.unwrap(), 0.833_333_3));
        // 2 of 5 if the two without a score failed, 4 of 5 if they passed.
        let bracket = status.bracket.unwrap();
        assert!(close(bracket.low, 0.4) && close(bracket.high, 0.8));
    }

    #[test]
    fn nothing_scored_has_no_rates() {
        let status = summarize(&[unscored(0, UnscoredReason::GraderFailed), case(1)]);
        assert_eq!(status.scored, 0);
        assert_eq!(status.pass_rate, None);
        assert_eq!(status.mean_reward, None);
        assert_eq!(status.interval, None);
        let bracket = status.bracket.unwrap();
        assert!(close(bracket.low, 0.0) && close(bracket.high, 1.0));
        assert_eq!(summarize(&[]).bracket, None);
    }

    #[test]
    fn wilson_interval_matches_hand_computed_values() {
        // p = 1/2, n = 2, z = 1.96: center 0.5, half-width
        // 1.96 * sqrt(0.125 + 3.8416/16) / (1 + 3.8416/2) = 0.40547.
        let r = wilson(1, 2, 1.96);
        assert!(close(r.low, 0.094_529) && close(r.high, 0.905_471), "{r:?}");
        // 8 of 10: the textbook (Wilson 1927; Newcombe 1998) 0.4902 .. 0.9433.
        let r = wilson(8, 10, Z95);
        assert!(
            (r.low - 0.4902).abs() < 1e-4 && (r.high - 0.9433).abs() < 1e-4,
            "{r:?}"
        );
        // All passed: the upper end is 1, the lower n/(n + z²).
        let r = wilson(5, 5, 1.96);
        assert!(
            close(r.high, 1.0) && close(r.low, 5.0 / (5.0 + 3.8416)),
            "{r:?}"
        );
    }
}

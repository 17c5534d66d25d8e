//! The summary of an evaluation (`status.evaluation`), computed from its cases every time:
//! never a counter kept on the side that could drift from them.
//!
//! Pass rate and mean reward are over the scored cases only (`n` of them); an unscored case
//! is never a zero. The bracket says how far the cases without a score (unscored or still
//! pending) could move the pass rate: `low` if every one of them had failed, `high` if every
//! one had passed. The interval is the Wilson score interval at 95 % for the pass rate over
//! the `n` scored cases.
//!
//! Two evaluation groups of the same Environment version, split and seed are compared case by
//! case ([`compare`]): cases pair by task id and repetition, and over the pairs scored on both
//! sides the difference in pass rate (B − A) gets a 95 % interval by Newcombe's method 10 (the
//! hybrid score interval for paired proportions, from the two Wilson intervals and the
//! correlation of the pairs; Newcombe 1998, Statistics in Medicine 17, 2635–2650).
//!
//! These are fractions, not money: floating point is fine here.
#![allow(clippy::float_arithmetic)]

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::epochs::{self, Reducer};
use super::{CaseOutcome, CaseResult, CaseState, UnscoredReason, Verdict};
pub use crate::resource::{EvaluationStatus, Range};
use crate::validate::Invalid;

/// The normal quantile for a two-sided 95 % interval.
pub const Z95: f64 = 1.959_963_984_540_054;

/// The summary of these cases, each task's rewards reduced by `reducer`.
pub fn summarize(cases: &[CaseOutcome], reducer: Reducer) -> EvaluationStatus {
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
    status.per_task = epochs::per_task(cases, reducer);
    status.pass_at_k = epochs::pass_at_k_summary(&status.per_task);
    let reduced: Vec<f64> = status.per_task.iter().filter_map(|t| t.reward).collect();
    status.task_reward = Reducer::Mean.reduce(&reduced);
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

/// Which groups may be compared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pairing {
    /// Two evaluations of the same Environment version, split and seed.
    SameEnvironment,
    /// A rescore and its source (either way round): the same work, graded by two versions.
    Rescore,
}

impl Pairing {
    /// How groups `a` and `b` pair, from each one's `spec.evaluation.rescoreOf`: a rescore
    /// and its source (either way round), else two evaluations of the same tasks.
    pub fn of(a: &str, a_rescore_of: Option<&str>, b: &str, b_rescore_of: Option<&str>) -> Self {
        if b_rescore_of == Some(a) || a_rescore_of == Some(b) {
            Pairing::Rescore
        } else {
            Pairing::SameEnvironment
        }
    }
}

/// How a pair of cases (the same task and repetition in A and in B) compares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Change {
    /// Passed in both.
    BothPass,
    /// Scored in both, passed in neither.
    BothFail,
    /// Passed in B only.
    Gained,
    /// Passed in A only.
    Lost,
    /// Not scored on both sides (pending, unscored, or missing from one group): left out of
    /// the paired difference.
    NotPaired,
}

/// One case of a comparison: a task and repetition, how A and B ended, and the change.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PairedCase {
    /// The task's id.
    pub task_id: String,
    /// From 1.
    pub repetition: u32,
    /// A's outcome: its verdict when scored, else its unscored reason, `Pending`, or
    /// `missing` when A has no such case.
    pub a: String,
    /// B's outcome, the same way.
    pub b: String,
    /// How they compare.
    pub change: Change,
}

/// The comparison of evaluation group B against A.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Comparison {
    /// The Environment both evaluate (`project/name@version`); A's when B rescores A.
    pub environment: String,
    /// B's Environment version when it differs from A's (a rescore and its source).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub environment_b: Option<String>,
    /// The split.
    pub split: String,
    /// The seed.
    pub seed: u64,
    /// Pairs scored on both sides: the `n` of the rates and the interval.
    pub pairs: u32,
    /// Pairs passed in both.
    pub both_pass: u32,
    /// Pairs passed in B only.
    pub gained: u32,
    /// Pairs passed in A only.
    pub lost: u32,
    /// Pairs passed in neither.
    pub both_fail: u32,
    /// Cases left out: not scored on both sides, or in one group only.
    pub not_paired: u32,
    /// A's pass rate over the pairs; absent without pairs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pass_rate_a: Option<f64>,
    /// B's pass rate over the pairs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pass_rate_b: Option<f64>,
    /// B's pass rate minus A's, over the pairs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub difference: Option<f64>,
    /// The 95 % interval of the difference (Newcombe's method 10).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interval: Option<Range>,
    /// Every case, in A's batch order, then B's cases that A lacks.
    pub cases: Vec<PairedCase>,
}

/// How a case ended, as a comparison shows it.
fn outcome(case: Option<&CaseResult>) -> String {
    let Some(case) = case else {
        return "missing".to_string();
    };
    let text = match case.state {
        CaseState::Pending => serde_json::to_value(CaseState::Pending),
        CaseState::Scored => serde_json::to_value(case.verdict),
        CaseState::Unscored => serde_json::to_value(case.reason),
    };
    match text {
        Ok(serde_json::Value::String(text)) => text,
        _ => "-".to_string(),
    }
}

/// Whether a case was scored, and if so whether it passed.
fn scored_pass(case: Option<&CaseResult>) -> Option<bool> {
    case.filter(|c| c.state == CaseState::Scored)
        .map(|c| c.verdict == Some(Verdict::Pass))
}

/// The one value of `field` every case of a group holds (its cases were drawn together).
fn common<'a>(
    group: &str,
    cases: &'a [CaseResult],
    field: &str,
    value: impl Fn(&'a CaseResult) -> String,
) -> Result<String, Invalid> {
    let first = cases.first().map(&value).ok_or_else(|| {
        Invalid::new(
            group,
            "must be an evaluation group with cases (an ordinary group has none)",
            "no cases",
        )
    })?;
    match cases.iter().map(&value).find(|v| *v != first) {
        None => Ok(first),
        Some(other) => Err(Invalid::new(
            format!("{group}.{field}"),
            "must be one value across the group's cases",
            format!("{first:?} and {other:?}"),
        )),
    }
}

/// Compares evaluation group B against A: both must evaluate the same Environment version,
/// split and seed (else the tasks would not be the same), refused naming the one that differs.
/// Cases pair by task id and repetition; the rates, their difference and its interval are
/// over the pairs scored on both sides, an unscored or pending case being left out (never a
/// fail).
pub fn compare(
    a: &[CaseResult],
    b: &[CaseResult],
    pairing: Pairing,
) -> Result<Comparison, Invalid> {
    let environment = common("A", a, "environment", |c| c.environment.clone())?;
    let split = common("A", a, "split", |c| c.split.clone())?;
    let seed = common("A", a, "seed", |c| c.seed.to_string())?;
    let environment_b = common("B", b, "environment", |c| c.environment.clone())?;
    for (field, mine) in [
        ("environment", &environment),
        ("split", &split),
        ("seed", &seed),
    ] {
        let theirs = match field {
            // A rescore grades the same work with another version's grader.
            "environment" if pairing == Pairing::Rescore => continue,
            "environment" => environment_b.clone(),
            "split" => common("B", b, field, |c| c.split.clone())?,
            _ => common("B", b, field, |c| c.seed.to_string())?,
        };
        if theirs != *mine {
            return Err(Invalid::new(
                format!("B.{field}"),
                format!(
                    "must be A's ({mine}): only groups of the same Environment version, split \
                     and seed evaluate the same tasks (or a rescore and its source)"
                ),
                theirs,
            ));
        }
    }
    let key = |c: &CaseResult| (c.task_id.clone(), c.repetition);
    let in_b: BTreeMap<(String, u32), &CaseResult> = b.iter().map(|c| (key(c), c)).collect();
    let in_a: BTreeMap<(String, u32), &CaseResult> = a.iter().map(|c| (key(c), c)).collect();
    let mut keys: Vec<(String, u32)> = a.iter().map(key).collect();
    keys.extend(b.iter().map(key).filter(|k| !in_a.contains_key(k)));
    let mut comparison = Comparison {
        environment_b: (environment_b != environment).then_some(environment_b),
        environment,
        split,
        seed: seed.parse().unwrap_or_default(),
        pairs: 0,
        both_pass: 0,
        gained: 0,
        lost: 0,
        both_fail: 0,
        not_paired: 0,
        pass_rate_a: None,
        pass_rate_b: None,
        difference: None,
        interval: None,
        cases: Vec::with_capacity(keys.len()),
    };
    for k in keys {
        let (case_a, case_b) = (in_a.get(&k).copied(), in_b.get(&k).copied());
        let change = match (scored_pass(case_a), scored_pass(case_b)) {
            (Some(true), Some(true)) => Change::BothPass,
            (Some(false), Some(false)) => Change::BothFail,
            (Some(false), Some(true)) => Change::Gained,
            (Some(true), Some(false)) => Change::Lost,
            _ => Change::NotPaired,
        };
        match change {
            Change::BothPass => comparison.both_pass += 1,
            Change::BothFail => comparison.both_fail += 1,
            Change::Gained => comparison.gained += 1,
            Change::Lost => comparison.lost += 1,
            Change::NotPaired => comparison.not_paired += 1,
        }
        comparison.cases.push(PairedCase {
            task_id: k.0,
            repetition: k.1,
            a: outcome(case_a),
            b: outcome(case_b),
            change,
        });
    }
    let (e, f, g, h) = (
        comparison.both_pass,
        comparison.gained,
        comparison.lost,
        comparison.both_fail,
    );
    comparison.pairs = e + f + g + h;
    if comparison.pairs > 0 {
        let n = f64::from(comparison.pairs);
        comparison.pass_rate_a = Some(f64::from(e + g) / n);
        comparison.pass_rate_b = Some(f64::from(e + f) / n);
        comparison.difference = Some(f64::from(f) / n - f64::from(g) / n);
        comparison.interval = Some(paired_difference(e, f, g, h, Z95));
    }
    Ok(comparison)
}

/// Newcombe's method 10: the interval at quantile `z` of p1 − p2 for paired proportions,
/// from `e` pairs where both succeeded, `f` where only the first did, `g` where only the
/// second did and `h` where neither did. It combines the Wilson intervals of p1 = (e+f)/n and
/// p2 = (e+g)/n with the pairs' correlation φ (its numerator eh − fg taken as 0 up to n/2 and
/// less n/2 above, as Newcombe defines it). No pairs: the whole range −1 .. 1.
pub fn paired_difference(e: u32, f: u32, g: u32, h: u32, z: f64) -> Range {
    let n = e + f + g + h;
    if n == 0 {
        return Range {
            low: -1.0,
            high: 1.0,
        };
    }
    let first = wilson(e + f, n, z);
    let second = wilson(e + g, n, z);
    let total = f64::from(n);
    let (e, f, g, h) = (f64::from(e), f64::from(f), f64::from(g), f64::from(h));
    let p1 = (e + f) / total;
    let p2 = (e + g) / total;
    let margins = (e + f) * (g + h) * (e + g) * (f + h);
    let cross = e * h - f * g;
    let corrected = if cross > total / 2.0 {
        cross - total / 2.0
    } else if cross >= 0.0 {
        0.0
    } else {
        cross
    };
    let phi = if margins > 0.0 {
        corrected / margins.sqrt()
    } else {
        0.0
    };
    let below = (p1 - first.low).powi(2) - 2.0 * phi * (p1 - first.low) * (second.high - p2)
        + (second.high - p2).powi(2);
    let above = (p2 - second.low).powi(2) - 2.0 * phi * (p2 - second.low) * (first.high - p1)
        + (first.high - p1).powi(2);
    let difference = p1 - p2;
    Range {
        low: (difference - below.max(0.0).sqrt()).max(-1.0),
        high: (difference + above.max(0.0).sqrt()).min(1.0),
    }
}

fn count(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::evaluation::{CaseRecord, Grade};

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
            earlier_attempts: Vec::new(),
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

    fn outcomes(cases: &[CaseRecord]) -> Vec<CaseOutcome> {
        cases.iter().map(CaseOutcome::from).collect()
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
        let status = summarize(&outcomes(&cases), Reducer::Mean);
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
        let status = summarize(
            &outcomes(&[unscored(0, UnscoredReason::GraderFailed), case(1)]),
            Reducer::Mean,
        );
        assert_eq!(status.scored, 0);
        assert_eq!(status.pass_rate, None);
        assert_eq!(status.mean_reward, None);
        assert_eq!(status.interval, None);
        let bracket = status.bracket.unwrap();
        assert!(close(bracket.low, 0.0) && close(bracket.high, 1.0));
        assert_eq!(summarize(&[], Reducer::Mean).bracket, None);
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

    fn result(task: &str, repetition: u32, verdict: Option<Verdict>) -> CaseResult {
        let mut record = case(0);
        record.task_id = task.into();
        record.repetition = repetition;
        let record = match verdict {
            Some(verdict) => record.scored(
                Grade {
                    reward: if verdict == Verdict::Pass { 1.0 } else { 0.0 },
                    verdict,
                    evidence: String::new(),
                },
                jiff::Timestamp::UNIX_EPOCH,
            ),
            None => record.unscored(
                UnscoredReason::RunFailed,
                String::new(),
                jiff::Timestamp::UNIX_EPOCH,
            ),
        };
        record.result()
    }

    #[test]
    fn newcombe_paired_interval_matches_hand_computed_values() {
        // Worked by hand (Python, the formulas of Newcombe 1998 written out) with
        // z = 1.959964. e=12, f=9, g=2, h=21: D = 7/44 = 0.159091,
        // Wilson (21/44) 0.337773 .. 0.621117, (14/44) 0.200155 .. 0.466040,
        // eh − fg = 234 > 22, φ = 212 / √(21·23·14·30) = 0.470693: 0.011243 .. 0.295372.
        let r = paired_difference(12, 9, 2, 21, Z95);
        assert!(
            close(r.low, 0.011_242_5) && close(r.high, 0.295_371_8),
            "{r:?}"
        );
        // e=3, f=3, g=1, h=3: eh − fg = 6 > 5, φ = 1/24: D = 0.2, −0.197785 .. 0.520940.
        let r = paired_difference(3, 3, 1, 3, Z95);
        assert!(
            close(r.low, -0.197_785_2) && close(r.high, 0.520_939_8),
            "{r:?}"
        );
        // e=2, f=1, g=0, h=1: eh − fg = 2 ≤ 2, φ = 0: D = 0.25, −0.319557 .. 0.655287.
        let r = paired_difference(2, 1, 0, 1, Z95);
        assert!(
            close(r.low, -0.319_557_3) && close(r.high, 0.655_286_7),
            "{r:?}"
        );
        // e=1, f=3, g=4, h=1: eh − fg = −11 < 0 is kept, φ = −11/20 = −0.55:
        // D = −1/9, −0.561257 .. 0.397557.
        let r = paired_difference(1, 3, 4, 1, Z95);
        assert!(
            close(r.low, -0.561_257_4) && close(r.high, 0.397_557_3),
            "{r:?}"
        );
        // No discordant pairs: symmetric about 0; one pair: margins 0, φ = 0.
        let r = paired_difference(5, 0, 0, 5, Z95);
        assert!(
            close(r.low, -0.166_593_2) && close(r.high, 0.166_593_2),
            "{r:?}"
        );
        let r = paired_difference(1, 0, 0, 0, Z95);
        assert!(
            close(r.low, -0.793_450_7) && close(r.high, 0.793_450_7),
            "{r:?}"
        );
        assert_eq!(
            paired_difference(0, 0, 0, 0, Z95),
            Range {
                low: -1.0,
                high: 1.0
            }
        );
    }

    #[test]
    fn compare_pairs_by_task_and_repetition_and_leaves_unscored_out() {
        use Verdict::{Fail, Invalid as Inv, Pass};
        let a = vec![
            result("t1", 1, Some(Pass)),
            result("t1", 2, Some(Pass)),
            result("t2", 1, Some(Fail)),
            result("t3", 1, Some(Inv)),
            result("t4", 1, None),
            result("t5", 1, Some(Pass)),
        ];
        // B in another order, t5 missing, t6 only in B.
        let b = vec![
            result("t3", 1, Some(Pass)),
            result("t2", 1, Some(Pass)),
            result("t1", 2, Some(Fail)),
            result("t1", 1, Some(Pass)),
            result("t4", 1, Some(Pass)),
            result("t6", 1, Some(Pass)),
        ];
        let c = compare(&a, &b, Pairing::SameEnvironment).expect("comparable");
        // Pairs scored on both: t1/1 both pass, t1/2 lost, t2 gained, t3 gained (invalid is
        // a scored non-pass); t4 (unscored in A), t5 (missing in B), t6 (missing in A) out.
        assert_eq!(
            (
                c.pairs,
                c.both_pass,
                c.gained,
                c.lost,
                c.both_fail,
                c.not_paired
            ),
            (4, 1, 2, 1, 0, 3)
        );
        assert!(close(c.pass_rate_a.unwrap(), 0.5) && close(c.pass_rate_b.unwrap(), 0.75));
        assert!(close(c.difference.unwrap(), 0.25));
        assert_eq!(c.interval, Some(paired_difference(1, 2, 1, 0, Z95)));
        let changes: Vec<(&str, u32, &str, &str, Change)> = c
            .cases
            .iter()
            .map(|p| {
                (
                    p.task_id.as_str(),
                    p.repetition,
                    p.a.as_str(),
                    p.b.as_str(),
                    p.change,
                )
            })
            .collect();
        assert_eq!(
            changes,
            vec![
                ("t1", 1, "pass", "pass", Change::BothPass),
                ("t1", 2, "pass", "fail", Change::Lost),
                ("t2", 1, "fail", "pass", Change::Gained),
                ("t3", 1, "invalid", "pass", Change::Gained),
                ("t4", 1, "RunFailed", "pass", Change::NotPaired),
                ("t5", 1, "pass", "missing", Change::NotPaired),
                ("t6", 1, "missing", "pass", Change::NotPaired),
            ]
        );
    }

    #[test]
    fn compare_refuses_groups_of_another_environment_version_split_or_seed() {
        let a = vec![result("t1", 1, Some(Verdict::Pass))];
        let mut other = a.clone();
        other[0].environment = "nodus/arithmetic-v2@2.1.0".into();
        // A rescore of A may have another version; nothing else may differ.
        let rescore = compare(&a, &other, Pairing::Rescore).expect("a rescore pairs");
        assert_eq!(
            rescore.environment_b.as_deref(),
            Some("nodus/arithmetic-v2@2.1.0")
        );
        assert_eq!(rescore.pairs, 1);
        let refused = compare(&a, &other, Pairing::SameEnvironment).unwrap_err();
        assert_eq!(refused.field, "B.environment");
        assert!(
            refused.rule.contains("nodus/arithmetic-v2@2.0.0"),
            "{refused:?}"
        );
        assert_eq!(refused.value, "nodus/arithmetic-v2@2.1.0");
        let mut other = a.clone();
        other[0].seed = 43;
        assert!(compare(&a, &other, Pairing::Rescore).is_err());
        let refused = compare(&a, &other, Pairing::SameEnvironment).unwrap_err();
        assert_eq!(
            (refused.field.as_str(), refused.value.as_str()),
            ("B.seed", "43")
        );
        let mut other = a.clone();
        other[0].split = "train".into();
        assert_eq!(
            compare(&a, &other, Pairing::SameEnvironment)
                .unwrap_err()
                .field,
            "B.split"
        );
        assert_eq!(
            compare(&[], &a, Pairing::SameEnvironment)
                .unwrap_err()
                .field,
            "A"
        );
        assert_eq!(
            compare(&a, &[], Pairing::SameEnvironment)
                .unwrap_err()
                .field,
            "B"
        );
    }
}

//! Repetitions (epochs) of a task: its per-task line of `status.evaluation.perTask`, pass@k by
//! the unbiased estimator, and the reducer that turns a task's rewards into one.
//!
//! pass@k of a task with `n` scored cases of which `c` passed is `1 − C(n−c, k) / C(n, k)`:
//! the chance that at least one of `k` cases drawn from the `n` without replacement passed
//! (Chen et al. 2021, "Evaluating Large Language Models Trained on Code"). It is computed as
//! an exact fraction ([`Fraction`]) and turned into a float only as the final value; it is
//! defined for `k ≤ n` only. Unscored cases are left out, as everywhere: `n` counts the
//! scored ones.
//!
//! These are fractions, not money: the final values are floats.
#![allow(clippy::float_arithmetic)]

use std::collections::BTreeMap;

use super::{CaseOutcome, CaseState, Verdict};
pub use crate::resource::{Reducer, TaskSummary};

impl Reducer {
    /// The one reward of `rewards`; `None` when there are none.
    pub fn reduce(self, rewards: &[f64]) -> Option<f64> {
        if rewards.is_empty() {
            return None;
        }
        Some(match self {
            Reducer::Mean => rewards.iter().sum::<f64>() / rewards.len() as f64,
            Reducer::Max => rewards.iter().copied().fold(f64::NEG_INFINITY, f64::max),
            Reducer::Mode => {
                let mut sorted = rewards.to_vec();
                sorted.sort_by(f64::total_cmp);
                let mut best = (sorted[0], 0usize);
                let mut i = 0;
                while i < sorted.len() {
                    let run = sorted[i..].iter().take_while(|r| **r == sorted[i]).count();
                    if run > best.1 {
                        best = (sorted[i], run);
                    }
                    i += run;
                }
                best.0
            }
        })
    }
}

/// A non-negative fraction `numerator / denominator`, kept in lowest terms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fraction {
    /// Above the line.
    pub numerator: u128,
    /// Below the line, never 0.
    pub denominator: u128,
}

impl Fraction {
    fn new(numerator: u128, denominator: u128) -> Fraction {
        let divisor = gcd(numerator, denominator).max(1);
        Fraction {
            numerator: numerator / divisor,
            denominator: denominator / divisor,
        }
    }

    /// The value as a float: the one place a float appears.
    pub fn value(self) -> f64 {
        self.numerator as f64 / self.denominator as f64
    }
}

fn gcd(mut a: u128, mut b: u128) -> u128 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// pass@k of `passed` passes among `n` scored cases, exactly: `1 − C(n−c, k) / C(n, k)`.
/// The ratio is the product of `min(c, k)` factors, `∏_{j<c} (n−k−j)/(n−j)` or
/// `∏_{i<k} (n−c−i)/(n−i)` (the same value), reduced at every step. `None` when `k` is 0 or
/// more than `n`, `passed` is more than `n`, or the exact fraction would not fit in 128 bits
/// (far beyond the repetitions an evaluation has).
pub fn pass_at_k(n: u32, passed: u32, k: u32) -> Option<Fraction> {
    if k == 0 || k > n || passed > n {
        return None;
    }
    let (n, c, k) = (u128::from(n), u128::from(passed), u128::from(k));
    // C(n−c, k) / C(n, k): 0 as soon as fewer than k cases failed.
    if n - c < k {
        return Some(Fraction::new(1, 1));
    }
    let factors: Vec<(u128, u128)> = if c <= k {
        (0..c).map(|j| (n - k - j, n - j)).collect()
    } else {
        (0..k).map(|i| (n - c - i, n - i)).collect()
    };
    let mut none_pass = Fraction::new(1, 1);
    for (above, below) in factors {
        let step = Fraction::new(above, below);
        let across = gcd(none_pass.numerator, step.denominator).max(1);
        let down = gcd(step.numerator, none_pass.denominator).max(1);
        none_pass = Fraction::new(
            (none_pass.numerator / across).checked_mul(step.numerator / down)?,
            (none_pass.denominator / down).checked_mul(step.denominator / across)?,
        );
    }
    Some(Fraction::new(
        none_pass.denominator - none_pass.numerator,
        none_pass.denominator,
    ))
}

/// Each task's line, in the order the tasks first appear in `cases` (batch order).
pub fn per_task(cases: &[CaseOutcome], reducer: Reducer) -> Vec<TaskSummary> {
    let mut order: Vec<&str> = Vec::new();
    let mut by_task: BTreeMap<&str, Vec<&CaseOutcome>> = BTreeMap::new();
    for case in cases {
        let entry = by_task.entry(case.task_id.as_str()).or_default();
        if entry.is_empty() {
            order.push(case.task_id.as_str());
        }
        entry.push(case);
    }
    order
        .into_iter()
        .map(|task| {
            let cases = &by_task[task];
            let scored: Vec<&&CaseOutcome> = cases
                .iter()
                .filter(|c| c.state == CaseState::Scored)
                .collect();
            let n = count(scored.len());
            let passes = count(
                scored
                    .iter()
                    .filter(|c| c.verdict == Some(Verdict::Pass))
                    .count(),
            );
            let rewards: Vec<f64> = scored.iter().filter_map(|c| c.reward).collect();
            TaskSummary {
                task_id: task.to_string(),
                attempts: count(cases.len()),
                scored: n,
                passes,
                pass_at_k: (1..=n)
                    .filter_map(|k| pass_at_k(n, passes, k).map(|f| (k, f.value())))
                    .collect(),
                reward: reducer.reduce(&rewards),
            }
        })
        .collect()
}

/// `status.evaluation.passAtK`: for each k, the mean of pass@k over the tasks that have it
/// (those with at least k scored cases).
pub fn pass_at_k_summary(tasks: &[TaskSummary]) -> BTreeMap<u32, f64> {
    let mut sums: BTreeMap<u32, (f64, u32)> = BTreeMap::new();
    for task in tasks {
        for (&k, &value) in &task.pass_at_k {
            let entry = sums.entry(k).or_default();
            entry.0 += value;
            entry.1 += 1;
        }
    }
    sums.into_iter()
        .map(|(k, (sum, tasks))| (k, sum / f64::from(tasks)))
        .collect()
}

fn count(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exact(n: u32, c: u32, k: u32) -> (u128, u128) {
        let f = pass_at_k(n, c, k).expect("defined");
        (f.numerator, f.denominator)
    }

    /// Worked by hand from 1 − C(n−c, k)/C(n, k).
    #[test]
    fn pass_at_k_matches_hand_computation() {
        // n = 5, c = 2: k = 1: 1 − 3/5 = 2/5; k = 2: 1 − C(3,2)/C(5,2) = 1 − 3/10 = 7/10;
        // k = 3: 1 − 1/10 = 9/10; k = 4, 5: fewer than k failed, so 1.
        assert_eq!(exact(5, 2, 1), (2, 5));
        assert_eq!(exact(5, 2, 2), (7, 10));
        assert_eq!(exact(5, 2, 3), (9, 10));
        assert_eq!(exact(5, 2, 4), (1, 1));
        assert_eq!(exact(5, 2, 5), (1, 1));
        // n = 10, c = 3, k = 4: 1 − C(7,4)/C(10,4) = 1 − 35/210 = 5/6.
        assert_eq!(exact(10, 3, 4), (5, 6));
        // None passed: 0 for every k; all passed: 1.
        assert_eq!(exact(4, 0, 3), (0, 1));
        assert_eq!(exact(4, 4, 1), (1, 1));
        // n = 60, c = 1, k = 30: 1 − C(59,30)/C(60,30) = 1 − 30/60 = 1/2, with no overflow
        // on the way (C(60, 30) is about 1.2e17).
        assert_eq!(exact(60, 1, 30), (1, 2));
        // n = 200, c = 7, k = 100, computed apart with Python's fractions.Fraction and
        // math.comb: 1 − C(193,100)/C(200,100) = 506067/509639.
        assert_eq!(exact(200, 7, 100), (506_067, 509_639));
        assert_eq!(pass_at_k(3, 1, 4), None);
        assert_eq!(pass_at_k(3, 1, 0), None);
        assert_eq!(pass_at_k(3, 4, 1), None);
    }

    #[test]
    fn reducers() {
        let rewards = [0.0, 1.0, 0.5, 1.0, 0.0, 1.0];
        assert_eq!(Reducer::Mean.reduce(&rewards), Some(3.5 / 6.0));
        assert_eq!(Reducer::Max.reduce(&rewards), Some(1.0));
        assert_eq!(Reducer::Mode.reduce(&rewards), Some(1.0));
        // A tie goes to the lowest.
        assert_eq!(Reducer::Mode.reduce(&[1.0, 0.0, 1.0, 0.0]), Some(0.0));
        assert_eq!(Reducer::Mean.reduce(&[]), None);
    }
}

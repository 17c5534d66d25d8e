//! The graders that are pure functions of an answer and a task's hidden data (`exact`,
//! `numeric`, `regex`), and the reading of a `command` grader's printed verdict.
//!
//! Rewards and tolerances are fractions, not money: floating point is fine here.
#![allow(clippy::float_arithmetic)]

use serde_json::Value;

use super::{Grade, Verdict};
use crate::resource::{GraderKind, GraderSpec};

/// Grades `answer` with a built-in grader. An error means the grader could not grade (the
/// task's hidden data lacks what the grader needs): the case is unscored, `GraderFailed`.
pub fn grade_answer(grader: &GraderSpec, hidden: &Value, answer: &str) -> Result<Grade, String> {
    match grader.kind {
        GraderKind::Exact => {
            let expected = expected_text(hidden)?;
            let got = answer.trim();
            Ok(if got == expected.trim() {
                pass(format!("the answer is {expected:?}"))
            } else {
                fail(format!("expected {expected:?}, got {:?}", shorten(got)))
            })
        }
        GraderKind::Numeric => {
            let expected = expected_number(hidden)?;
            let tolerance = grader.tolerance.unwrap_or(0.0);
            Ok(match last_number(answer) {
                None => Grade {
                    reward: 0.0,
                    verdict: Verdict::Invalid,
                    evidence: format!("no number in the answer (expected {expected})"),
                },
                Some(got) if (got - expected).abs() <= tolerance => {
                    pass(format!("the answer's number {got} is {expected}"))
                }
                Some(got) => fail(format!("expected {expected}, the answer's number is {got}")),
            })
        }
        GraderKind::Regex => {
            let pattern = hidden
                .get("pattern")
                .and_then(Value::as_str)
                .ok_or("the task's hidden data has no `pattern` text for the regex grader")?;
            let regex = regex::Regex::new(pattern)
                .map_err(|e| format!("the task's pattern is not a regular expression: {e}"))?;
            Ok(if regex.is_match(answer) {
                pass(format!("the answer matches {pattern:?}"))
            } else {
                fail(format!("the answer does not match {pattern:?}"))
            })
        }
        GraderKind::Command => Err("a command grader runs in a sandbox".to_string()),
    }
}

/// A `command` grader's verdict from what it printed: the last non-empty line of its output,
/// a JSON object `{"reward": 0..1, "passed": bool, "evidence": "..."}`. An error says why the
/// output is not one (the case is then unscored, `GraderFailed`).
pub fn parse_verdict(stdout: &str) -> Result<Grade, String> {
    let line = stdout
        .lines()
        .rev()
        .map(str::trim)
        .find(|line| !line.is_empty())
        .ok_or("the grader printed nothing")?;
    let value: Value = serde_json::from_str(line).map_err(|e| {
        format!(
            "the grader's last line is not JSON ({e}): {}",
            shorten(line)
        )
    })?;
    let reward = value
        .get("reward")
        .and_then(Value::as_f64)
        .ok_or("the grader's verdict has no number `reward`")?;
    if !(0.0..=1.0).contains(&reward) {
        return Err(format!(
            "the grader's reward must be between 0 and 1 (got {reward})"
        ));
    }
    let passed = value
        .get("passed")
        .and_then(Value::as_bool)
        .ok_or("the grader's verdict has no boolean `passed`")?;
    let evidence = match value.get("evidence") {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(text)) => shorten(text),
        Some(_) => return Err("the grader's `evidence` must be text".to_string()),
    };
    Ok(Grade {
        reward,
        verdict: if passed { Verdict::Pass } else { Verdict::Fail },
        evidence,
    })
}

/// A `harborReward` grader's verdict from Harbor's reward files, read as Harbor's verifier
/// reads them: `reward.json` when there is one (an object of named numbers, or one number),
/// else `reward.txt` (one number). The reward is the one named `reward`, or the only one; it
/// must be between 0 and 1, and full marks (1) pass. An error says why there is no verdict
/// (the case is then unscored, `GraderFailed`).
pub fn harbor_reward(json: Option<&[u8]>, text: Option<&[u8]>) -> Result<Grade, String> {
    let (file, reward) = match (json, text) {
        (Some(bytes), _) => ("reward.json", reward_of_json(bytes)?),
        (None, Some(bytes)) => {
            let text = String::from_utf8_lossy(bytes);
            let reward = text.trim().parse::<f64>().map_err(|_| {
                format!(
                    "/logs/verifier/reward.txt must hold one number, not {:?}",
                    shorten(text.trim())
                )
            })?;
            ("reward.txt", reward)
        }
        (None, None) => {
            return Err(
                "the tests wrote no reward: neither /logs/verifier/reward.json nor \
                 /logs/verifier/reward.txt exists"
                    .to_string(),
            );
        }
    };
    if !reward.is_finite() || !(0.0..=1.0).contains(&reward) {
        return Err(format!(
            "the reward in /logs/verifier/{file} must be between 0 and 1 (got {reward})"
        ));
    }
    let evidence = format!("{file}: reward {reward}");
    Ok(if reward >= 1.0 {
        Grade {
            reward,
            verdict: Verdict::Pass,
            evidence,
        }
    } else {
        Grade {
            reward,
            verdict: Verdict::Fail,
            evidence,
        }
    })
}

/// The reward of a Harbor `reward.json`: one number, or an object whose `reward` (or only
/// entry) is one.
fn reward_of_json(bytes: &[u8]) -> Result<f64, String> {
    let value: Value = serde_json::from_slice(bytes)
        .map_err(|e| format!("/logs/verifier/reward.json is not JSON ({e})"))?;
    let chosen = match &value {
        Value::Object(rewards) => match (rewards.get("reward"), rewards.len()) {
            (Some(reward), _) => reward,
            (None, 1) => rewards.values().next().unwrap_or(&Value::Null),
            (None, _) => {
                return Err(format!(
                    "/logs/verifier/reward.json names several rewards and none `reward`: {}",
                    shorten(&value.to_string())
                ));
            }
        },
        other => other,
    };
    chosen.as_f64().ok_or_else(|| {
        format!(
            "/logs/verifier/reward.json must give a number reward, not {}",
            shorten(&chosen.to_string())
        )
    })
}

/// The last number written in `text` (`-12`, `3.5`, `1,234` read as 1234), if any.
pub fn last_number(text: &str) -> Option<f64> {
    let bytes = text.as_bytes();
    let mut found = None;
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i].is_ascii_digit() {
            let start = if i > 0 && bytes[i - 1] == b'-' {
                i - 1
            } else {
                i
            };
            let mut end = i;
            let mut seen_point = false;
            while end < bytes.len() {
                let b = bytes[end];
                let next_digit = bytes.get(end + 1).is_some_and(u8::is_ascii_digit);
                if b.is_ascii_digit() || (b == b',' && next_digit) {
                    end += 1;
                } else if b == b'.' && !seen_point && next_digit {
                    seen_point = true;
                    end += 1;
                } else {
                    break;
                }
            }
            let number: String = text[start..end].chars().filter(|c| *c != ',').collect();
            if let Ok(value) = number.parse::<f64>() {
                found = Some(value);
            }
            i = end;
        } else {
            i += 1;
        }
    }
    found
}

fn expected_text(hidden: &Value) -> Result<String, String> {
    match hidden.get("expected") {
        Some(Value::String(text)) => Ok(text.clone()),
        Some(Value::Number(n)) => Ok(n.to_string()),
        _ => Err("the task's hidden data has no `expected` text".to_string()),
    }
}

fn expected_number(hidden: &Value) -> Result<f64, String> {
    match hidden.get("expected") {
        Some(Value::Number(n)) => n.as_f64(),
        Some(Value::String(text)) => text.trim().parse().ok(),
        _ => None,
    }
    .ok_or_else(|| "the task's hidden data has no number `expected`".to_string())
}

fn pass(evidence: String) -> Grade {
    Grade {
        reward: 1.0,
        verdict: Verdict::Pass,
        evidence,
    }
}

fn fail(evidence: String) -> Grade {
    Grade {
        reward: 0.0,
        verdict: Verdict::Fail,
        evidence,
    }
}

/// Evidence is kept short: at most 1000 characters.
pub fn shorten(text: &str) -> String {
    const KEEP: usize = 1000;
    match text.char_indices().nth(KEEP) {
        None => text.to_string(),
        Some((cut, _)) => format!("{}…", &text[..cut]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn grader(kind: GraderKind, tolerance: Option<f64>) -> GraderSpec {
        GraderSpec {
            kind,
            tolerance,
            command: None,
            files: None,
            timeout: None,
            verdict_from: Default::default(),
        }
    }

    #[test]
    fn numbers_are_read_from_the_end() {
        assert_eq!(last_number("The answer is 42."), Some(42.0));
        assert_eq!(last_number("7 + 5 = 12"), Some(12.0));
        assert_eq!(last_number("it is -3"), Some(-3.0));
        assert_eq!(last_number("about 3.25 units"), Some(3.25));
        assert_eq!(last_number("1,234 apples"), Some(1234.0));
        assert_eq!(last_number("version 2. done"), Some(2.0));
        assert_eq!(last_number("no number here"), None);
        assert_eq!(last_number(""), None);
    }

    #[test]
    fn numeric_grader_scores_right_wrong_and_invalid() {
        let numeric = grader(GraderKind::Numeric, None);
        let hidden = json!({"expected": 59});
        let right = grade_answer(&numeric, &hidden, "17 + 42 = 59").unwrap();
        assert_eq!((right.reward, right.verdict), (1.0, Verdict::Pass));
        let wrong = grade_answer(&numeric, &hidden, "60").unwrap();
        assert_eq!((wrong.reward, wrong.verdict), (0.0, Verdict::Fail));
        let invalid = grade_answer(&numeric, &hidden, "I do not know").unwrap();
        assert_eq!((invalid.reward, invalid.verdict), (0.0, Verdict::Invalid));
        let loose = grader(GraderKind::Numeric, Some(0.5));
        assert_eq!(
            grade_answer(&loose, &hidden, "59.5").unwrap().verdict,
            Verdict::Pass
        );
        assert_eq!(
            grade_answer(&loose, &hidden, "59.6").unwrap().verdict,
            Verdict::Fail
        );
        assert!(grade_answer(&numeric, &json!({}), "59").is_err());
    }

    #[test]
    fn exact_and_regex_graders() {
        let exact = grader(GraderKind::Exact, None);
        let hidden = json!({"expected": "hello"});
        assert_eq!(
            grade_answer(&exact, &hidden, "  hello\n").unwrap().verdict,
            Verdict::Pass
        );
        assert_eq!(
            grade_answer(&exact, &hidden, "Hello").unwrap().verdict,
            Verdict::Fail
        );
        let regex = grader(GraderKind::Regex, None);
        let hidden = json!({"pattern": "^h[a-z]+o$"});
        assert_eq!(
            grade_answer(&regex, &hidden, "hello").unwrap().verdict,
            Verdict::Pass
        );
        assert_eq!(
            grade_answer(&regex, &hidden, "help").unwrap().verdict,
            Verdict::Fail
        );
        assert!(grade_answer(&regex, &json!({"pattern": "("}), "x").is_err());
    }

    #[test]
    fn harbor_rewards_are_read_as_harbor_reads_them() {
        type Files<'a> = (Option<&'a str>, Option<&'a str>);
        let graded: [(Files<'_>, f64, Verdict); 7] = [
            ((None, Some("1\n")), 1.0, Verdict::Pass),
            ((None, Some("0")), 0.0, Verdict::Fail),
            ((None, Some(" 0.25 ")), 0.25, Verdict::Fail),
            ((Some("{\"reward\": 1.0}"), None), 1.0, Verdict::Pass),
            ((Some("{\"accuracy\": 0.5}"), None), 0.5, Verdict::Fail),
            (
                (Some("{\"reward\": 0, \"style\": 1}"), None),
                0.0,
                Verdict::Fail,
            ),
            // reward.json first, as Harbor's verifier: reward.txt is not read then.
            ((Some("1"), Some("0")), 1.0, Verdict::Pass),
        ];
        for ((json, text), reward, verdict) in graded {
            let grade = harbor_reward(json.map(str::as_bytes), text.map(str::as_bytes))
                .unwrap_or_else(|e| panic!("{json:?} {text:?}: {e}"));
            assert_eq!(
                (grade.reward, grade.verdict),
                (reward, verdict),
                "{json:?} {text:?}"
            );
        }
        let refused: [(Files<'_>, &str); 8] = [
            ((None, None), "no reward"),
            ((None, Some("")), "reward.txt must hold one number"),
            ((None, Some("passed")), "reward.txt must hold one number"),
            ((None, Some("2")), "between 0 and 1"),
            ((None, Some("NaN")), "between 0 and 1"),
            ((Some("{"), None), "reward.json is not JSON"),
            ((Some("{\"a\": 1, \"b\": 0}"), None), "none `reward`"),
            ((Some("{\"reward\": \"1\"}"), None), "a number reward"),
        ];
        for ((json, text), why) in refused {
            let error =
                harbor_reward(json.map(str::as_bytes), text.map(str::as_bytes)).expect_err(why);
            assert!(error.contains(why), "{json:?} {text:?}: {error}");
        }
    }

    #[test]
    fn command_verdicts_are_read_or_refused() {
        let grade = parse_verdict(
            "checking\n{\"reward\": 0.5, \"passed\": true, \"evidence\": \"ok\"}\n\n",
        )
        .unwrap();
        assert_eq!(grade.reward, 0.5);
        assert_eq!(grade.verdict, Verdict::Pass);
        assert_eq!(grade.evidence, "ok");
        let failed = parse_verdict("{\"reward\": 0, \"passed\": false}").unwrap();
        assert_eq!(failed.verdict, Verdict::Fail);
        for bad in [
            "",
            "not json",
            "{\"passed\": true}",
            "{\"reward\": 1.5, \"passed\": true}",
            "{\"reward\": 1}",
            "{\"reward\": 1, \"passed\": true, \"evidence\": 3}",
        ] {
            assert!(parse_verdict(bad).is_err(), "{bad:?}");
        }
    }
}

//! Tables as kubectl prints them: upper-case headers, columns padded to their widest cell
//! and separated by three spaces, and the columns of each kind (the spec's, plus more with
//! `-o wide`).

use jiff::Timestamp;
use nodus_core::resource::Kind;
use serde_json::Value;

use crate::jsonpath::scalar_text;

/// Rows under headers.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Table {
    /// The column names.
    pub headers: Vec<String>,
    /// The cells, one `Vec` per row, as many cells as headers.
    pub rows: Vec<Vec<String>>,
}

impl Table {
    /// A table with these headers and no rows.
    pub fn new(headers: &[&str]) -> Table {
        Table {
            headers: headers.iter().map(|h| h.to_string()).collect(),
            rows: Vec::new(),
        }
    }

    /// The table as text, one line per row, each ending with a newline.
    pub fn render(&self) -> String {
        let mut widths: Vec<usize> = self.headers.iter().map(|h| h.chars().count()).collect();
        for row in &self.rows {
            for (width, cell) in widths.iter_mut().zip(row) {
                *width = (*width).max(cell.chars().count());
            }
        }
        let mut out = String::new();
        for row in std::iter::once(&self.headers).chain(&self.rows) {
            let mut line = String::new();
            for (index, (cell, width)) in row.iter().zip(&widths).enumerate() {
                if index + 1 == row.len() {
                    line.push_str(cell);
                } else {
                    line.push_str(cell);
                    line.push_str(&" ".repeat(width - cell.chars().count() + 3));
                }
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
        out
    }
}

/// A table of objects of one kind, with the kind's columns.
pub fn objects(kind: Kind, items: &[Value], wide: bool, now: Timestamp) -> Table {
    let mut table = Table::new(&headers(kind, wide));
    for item in items {
        table.rows.push(row(kind, item, wide, now));
    }
    table
}

fn headers(kind: Kind, wide: bool) -> Vec<&'static str> {
    let (base, more): (&[&str], &[&str]) = match kind {
        Kind::Agent => (
            &["NAME", "ACCESS", "MAX COST", "AGE"],
            &["FAMILIES", "MODEL", "STATE"],
        ),
        Kind::AgentRun => (
            &["NAME", "PHASE", "MODEL", "COST", "AGE"],
            &["REASON", "TURNS", "AGENT", "GROUP"],
        ),
        Kind::AgentGroup => (
            &["NAME", "PHASE", "RUNS", "ACTIVE", "COST", "AGE"],
            &[
                "AGENT",
                "QUEUED",
                "WAITING",
                "FAILED",
                "MAX ACTIVE",
                "MAX COST",
                "SEALED",
            ],
        ),
        Kind::Secret => (&["NAME", "KEYS", "AGE"], &[]),
        Kind::Budget => (&["NAME", "MAX SPEND", "AGE"], &[]),
        Kind::FileSet => (&["NAME", "FILES", "AGE"], &[]),
        Kind::AgentEnvironment => (&["NAME", "ENV", "CPU", "MEMORY", "AGE"], &[]),
        Kind::Environment => (&["NAME", "VERSION", "SPLITS", "GRADER", "AGE"], &[]),
        // A kind without columns of its own (the CLI lists only the kinds users write).
        _ => (&["NAME", "AGE"], &[]),
    };
    let mut headers = base.to_vec();
    if wide {
        headers.extend_from_slice(more);
    }
    headers
}

fn text(value: &Value, pointer: &str) -> String {
    match value.pointer(pointer) {
        None | Some(Value::Null) => "<none>".to_string(),
        Some(found) => scalar_text(found),
    }
}

fn dollars(value: &Value, pointer: &str) -> String {
    match value.pointer(pointer).and_then(Value::as_str) {
        Some(amount) => format!("${amount}"),
        None => "<none>".to_string(),
    }
}

fn count(value: &Value, pointer: &str) -> u64 {
    value.pointer(pointer).and_then(Value::as_u64).unwrap_or(0)
}

fn row(kind: Kind, item: &Value, wide: bool, now: Timestamp) -> Vec<String> {
    let name = text(item, "/metadata/name");
    let age = age(item, now);
    match kind {
        Kind::Agent => {
            let mut row = vec![
                name,
                item.pointer("/spec/model/access")
                    .and_then(Value::as_str)
                    .unwrap_or("Nodus")
                    .to_string(),
                dollars(item, "/spec/perRunMaxCostUSD"),
                age,
            ];
            if wide {
                let families = match item
                    .pointer("/spec/model/families")
                    .and_then(Value::as_array)
                {
                    Some(list) if !list.is_empty() => {
                        list.iter().map(scalar_text).collect::<Vec<_>>().join(",")
                    }
                    _ => "<any>".to_string(),
                };
                row.push(families);
                row.push(text(item, "/spec/model/name"));
                row.push(
                    item.pointer("/spec/state")
                        .and_then(Value::as_str)
                        .unwrap_or("Running")
                        .to_string(),
                );
            }
            row
        }
        Kind::AgentRun => {
            let turns = item.pointer("/status/turns").and_then(Value::as_array);
            let model = turns
                .and_then(|t| t.last())
                .and_then(|t| t.get("model"))
                .and_then(Value::as_str)
                .unwrap_or("<none>")
                .to_string();
            let mut row = vec![
                name,
                phase(item),
                model,
                dollars(item, "/status/cost/totalUSD"),
                age,
            ];
            if wide {
                row.push(text(item, "/status/reason"));
                row.push(turns.map_or(0, Vec::len).to_string());
                row.push(text(item, "/spec/agent"));
                row.push(text(item, "/spec/group"));
            }
            row
        }
        Kind::AgentGroup => {
            let counts = [
                "queued",
                "active",
                "waiting",
                "parked",
                "succeeded",
                "failed",
                "cancelled",
            ];
            let total: u64 = counts
                .iter()
                .map(|c| count(item, &format!("/status/counts/{c}")))
                .sum();
            let mut row = vec![
                name,
                phase(item),
                format!("{}/{total}", count(item, "/status/counts/succeeded")),
                count(item, "/status/counts/active").to_string(),
                dollars(item, "/status/cost/totalUSD"),
                age,
            ];
            if wide {
                row.push(text(item, "/spec/agent"));
                row.push(count(item, "/status/counts/queued").to_string());
                row.push(count(item, "/status/counts/waiting").to_string());
                row.push(count(item, "/status/counts/failed").to_string());
                row.push(text(item, "/spec/limits/maxActive"));
                row.push(dollars(item, "/spec/maxCostUSD"));
                row.push(
                    item.pointer("/spec/sealed")
                        .and_then(Value::as_bool)
                        .unwrap_or(false)
                        .to_string(),
                );
            }
            row
        }
        Kind::Secret => {
            let keys = item
                .get("keys")
                .and_then(Value::as_array)
                .map_or(0, Vec::len);
            vec![name, keys.to_string(), age]
        }
        Kind::Budget => vec![name, dollars(item, "/spec/maxSpendUSD"), age],
        Kind::FileSet => {
            let files = item
                .pointer("/spec/files")
                .and_then(Value::as_array)
                .map_or(0, Vec::len);
            vec![name, files.to_string(), age]
        }
        Kind::AgentEnvironment => {
            let env = item
                .pointer("/spec/env")
                .and_then(Value::as_array)
                .map_or(0, Vec::len);
            let cpu = text(item, "/spec/compute/cpu");
            let memory = text(item, "/spec/compute/memory");
            vec![name, env.to_string(), cpu, memory, age]
        }
        Kind::Environment => {
            let splits = item
                .pointer("/spec/splits")
                .and_then(Value::as_object)
                .map(|splits| splits.keys().cloned().collect::<Vec<_>>().join(","))
                .unwrap_or_default();
            vec![
                name,
                text(item, "/spec/version"),
                splits,
                text(item, "/spec/grader/kind"),
                age,
            ]
        }
        _ => vec![name, age],
    }
}

/// The table of an evaluation group's results (`nodus get results NAME`).
pub fn results(items: &[Value]) -> Table {
    let mut table = Table::new(&[
        "TASK", "REP", "STATE", "VERDICT", "REWARD", "RUN", "EVIDENCE",
    ]);
    for item in items {
        let state = text(item, "/state");
        let verdict = match item.get("reason").and_then(Value::as_str) {
            Some(reason) => reason.to_string(),
            None => item
                .get("verdict")
                .and_then(Value::as_str)
                .unwrap_or("-")
                .to_string(),
        };
        let reward = item
            .get("reward")
            .and_then(Value::as_f64)
            .map_or_else(|| "-".to_string(), |r| format!("{r}"));
        let evidence: String = item
            .get("evidence")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .chars()
            .take(60)
            .collect();
        table.rows.push(vec![
            text(item, "/taskId"),
            text(item, "/repetition"),
            state,
            verdict,
            reward,
            text(item, "/run"),
            evidence,
        ]);
    }
    table
}

fn phase(item: &Value) -> String {
    item.pointer("/status/phase")
        .and_then(Value::as_str)
        .unwrap_or("Pending")
        .to_string()
}

/// The AGE column: how long ago the object was created.
fn age(item: &Value, now: Timestamp) -> String {
    item.pointer("/metadata/creationTimestamp")
        .and_then(Value::as_str)
        .and_then(|t| t.parse::<Timestamp>().ok())
        .map_or_else(
            || "<unknown>".to_string(),
            |created| human_duration(now.as_second().saturating_sub(created.as_second())),
        )
}

/// A duration as kubectl's AGE column shows it: `45s`, `3m20s`, `45m`, `3h20m`, `30h`,
/// `3d4h`, `90d`, `2y100d`.
pub fn human_duration(seconds: i64) -> String {
    let s = seconds.max(0);
    let (minute, hour, day) = (60, 3600, 86_400);
    let year = 365 * day;
    if s < 2 * minute {
        format!("{s}s")
    } else if s < 10 * minute {
        let (m, rest) = (s / minute, s % minute);
        if rest == 0 {
            format!("{m}m")
        } else {
            format!("{m}m{rest}s")
        }
    } else if s < 3 * hour {
        format!("{}m", s / minute)
    } else if s < 8 * hour {
        let (h, m) = (s / hour, (s % hour) / minute);
        if m == 0 {
            format!("{h}h")
        } else {
            format!("{h}h{m}m")
        }
    } else if s < 2 * day {
        format!("{}h", s / hour)
    } else if s < 8 * day {
        let (d, h) = (s / day, (s % day) / hour);
        if h == 0 {
            format!("{d}d")
        } else {
            format!("{d}d{h}h")
        }
    } else if s < 2 * year {
        format!("{}d", s / day)
    } else if s < 8 * year {
        let (y, d) = (s / year, (s % year) / day);
        if d == 0 {
            format!("{y}y")
        } else {
            format!("{y}y{d}d")
        }
    } else {
        format!("{}y", s / year)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn now() -> Timestamp {
        "2026-05-01T12:00:00Z".parse().expect("valid")
    }

    #[test]
    fn columns_are_padded_and_separated_by_three_spaces() {
        let mut table = Table::new(&["NAME", "PHASE"]);
        table
            .rows
            .push(vec!["hello-agent-run".into(), "Succeeded".into()]);
        table.rows.push(vec!["b".into(), "".into()]);
        assert_eq!(
            table.render(),
            "NAME              PHASE\nhello-agent-run   Succeeded\nb\n"
        );
    }

    #[test]
    fn runs_show_phase_model_of_the_latest_turn_cost_and_age() {
        let run = json!({
            "metadata": {"name": "hello-agent-run", "creationTimestamp": "2026-05-01T11:57:40Z"},
            "spec": {"agent": "hello-agent"},
            "status": {
                "phase": "Succeeded",
                "turns": [{"model": "claude-haiku-4-5"}, {"model": "claude-sonnet-4-5"}],
                "cost": {"totalUSD": "0.0042", "limitUSD": "0.50"}
            }
        });
        let queued = json!({"metadata": {"name": "q"}, "spec": {"agent": "a", "group": "g"}, "status": {"phase": "Pending", "reason": "GroupWait", "cost": {"totalUSD": "0.00"}}});
        let table = objects(Kind::AgentRun, &[run.clone(), queued.clone()], false, now());
        assert_eq!(
            table.render(),
            "NAME              PHASE       MODEL               COST      AGE\n\
             hello-agent-run   Succeeded   claude-sonnet-4-5   $0.0042   2m20s\n\
             q                 Pending     <none>              $0.00     <unknown>\n"
        );
        let wide = objects(Kind::AgentRun, &[run, queued], true, now());
        assert_eq!(wide.headers.len(), 9);
        assert_eq!(wide.rows[0][5..], ["<none>", "2", "hello-agent", "<none>"]);
        assert_eq!(wide.rows[1][5..], ["GroupWait", "0", "a", "g"]);
    }

    #[test]
    fn groups_show_runs_as_succeeded_of_total_and_active() {
        let group = json!({
            "metadata": {"name": "parallel-agents", "creationTimestamp": "2026-05-01T09:00:00Z"},
            "spec": {"agent": "w", "limits": {"maxActive": 2}, "maxCostUSD": "0.60", "sealed": true},
            "status": {
                "phase": "Running",
                "counts": {"queued": 1, "active": 2, "waiting": 0, "parked": 2, "succeeded": 3, "failed": 1, "cancelled": 0},
                "cost": {"totalUSD": "0.12", "limitUSD": "0.60"}
            }
        });
        let table = objects(Kind::AgentGroup, std::slice::from_ref(&group), false, now());
        assert_eq!(
            table.headers,
            ["NAME", "PHASE", "RUNS", "ACTIVE", "COST", "AGE"]
        );
        assert_eq!(
            table.rows[0],
            ["parallel-agents", "Running", "3/9", "2", "$0.12", "3h"]
        );
        let wide = objects(Kind::AgentGroup, &[group], true, now());
        assert_eq!(
            wide.rows[0][6..],
            ["w", "1", "0", "1", "2", "$0.60", "true"]
        );
    }

    #[test]
    fn agents_secrets_and_budgets_have_their_columns() {
        let agent = json!({"metadata": {"name": "hello-agent", "creationTimestamp": "2026-04-28T12:00:00Z"}, "spec": {"model": {"access": "Nodus", "families": ["haiku", "sonnet"]}, "perRunMaxCostUSD": "0.50"}});
        let table = objects(Kind::Agent, std::slice::from_ref(&agent), true, now());
        assert_eq!(
            table.headers,
            [
                "NAME", "ACCESS", "MAX COST", "AGE", "FAMILIES", "MODEL", "STATE"
            ]
        );
        assert_eq!(
            table.rows[0],
            [
                "hello-agent",
                "Nodus",
                "$0.50",
                "3d",
                "haiku,sonnet",
                "<none>",
                "Running"
            ]
        );
        let secret = json!({"metadata": {"name": "anthropic-key"}, "keys": ["ANTHROPIC_API_KEY"]});
        assert_eq!(
            objects(Kind::Secret, &[secret], false, now()).rows[0],
            ["anthropic-key", "1", "<unknown>"]
        );
        let budget = json!({"metadata": {"name": "b"}, "spec": {"maxSpendUSD": "20.00"}});
        assert_eq!(
            objects(Kind::Budget, &[budget], false, now()).rows[0],
            ["b", "$20.00", "<unknown>"]
        );
    }

    #[test]
    fn ages_read_like_kubectl() {
        let cases = [
            (0, "0s"),
            (119, "119s"),
            (120, "2m"),
            (200, "3m20s"),
            (45 * 60, "45m"),
            (3 * 3600 + 20 * 60, "3h20m"),
            (30 * 3600, "30h"),
            (3 * 86_400 + 4 * 3600, "3d4h"),
            (90 * 86_400, "90d"),
            (3 * 365 * 86_400, "3y"),
            (-5, "0s"),
        ];
        for (seconds, want) in cases {
            assert_eq!(human_duration(seconds), want, "{seconds}");
        }
    }
}

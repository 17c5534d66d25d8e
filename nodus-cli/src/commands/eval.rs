//! `nodus eval compare A B`: two evaluation groups case by case, and the paired difference in
//! pass rate with its interval, computed by `nodus_core::evaluation::stats::compare`;
//! `nodus eval retry GROUP`: a new attempt for each unscored case, decided by the server.

use nodus_core::evaluation::CaseResult;
use nodus_core::evaluation::stats::{Change, Comparison, Pairing, compare};
use reqwest::Method;
use serde_json::{Value, json};

use super::{out, outln};
use crate::cli::{EvalCommand, Output};
use crate::client::{Body, Client};
use crate::error::{Error, Result};
use crate::table::Table;
use crate::yaml;

pub async fn run(client: &Client, command: EvalCommand) -> Result<()> {
    match command {
        EvalCommand::Compare { a, b, output } => compare_groups(client, a, b, output).await,
        EvalCommand::Retry {
            group,
            reasons,
            tasks,
        } => retry(client, &group, reasons, tasks).await,
        EvalCommand::Rescore {
            group,
            environment,
            name,
        } => {
            let created = client
                .call(
                    Method::POST,
                    &["agentgroups", &group, "rescore"],
                    &[],
                    Some(Body::Json(
                        json!({"environment": environment, "name": name}),
                    )),
                )
                .await?;
            outln(&format!(
                "agentgroup/{} created: grading {group}'s work with {environment}",
                created["metadata"]["name"].as_str().unwrap_or_default()
            ));
            Ok(())
        }
    }
}

/// How two groups pair: a rescore and its source (either way round), or two evaluations.
async fn pairing(client: &Client, a: &str, b: &str) -> Result<Pairing> {
    let rescore_of = |group: &Value| group["spec"]["evaluation"]["rescoreOf"].clone();
    let group_a = client
        .call(Method::GET, &["agentgroups", a], &[], None)
        .await?;
    let group_b = client
        .call(Method::GET, &["agentgroups", b], &[], None)
        .await?;
    Ok(Pairing::of(
        a,
        rescore_of(&group_a).as_str(),
        b,
        rescore_of(&group_b).as_str(),
    ))
}

/// Asks the server to retry the group's unscored cases and lists those it retried.
async fn retry(
    client: &Client,
    group: &str,
    reasons: Vec<String>,
    tasks: Vec<String>,
) -> Result<()> {
    let answer = client
        .call(
            Method::POST,
            &["agentgroups", group, "retry"],
            &[],
            Some(Body::Json(json!({"reasons": reasons, "tasks": tasks}))),
        )
        .await?;
    let retried: Vec<CaseResult> =
        serde_json::from_value(answer.get("retried").cloned().unwrap_or(Value::Null))
            .map_err(|e| Error::input(format!("the server's answer could not be read: {e}")))?;
    let mut table = Table::new(&["TASK", "REP", "ATTEMPT", "RUN", "LAST"]);
    for case in &retried {
        let last = case
            .attempts
            .iter()
            .rev()
            .nth(1)
            .and_then(|a| a.reason)
            .map(|r| format!("{r:?}"))
            .unwrap_or_default();
        table.rows.push(vec![
            case.task_id.clone(),
            case.repetition.to_string(),
            case.attempts.len().to_string(),
            case.run.clone(),
            last,
        ]);
    }
    out(&format!(
        "{group}: {} case(s) retried\n\n{}",
        retried.len(),
        table.render()
    ));
    Ok(())
}

async fn compare_groups(
    client: &Client,
    a: String,
    b: String,
    output: Option<Output>,
) -> Result<()> {
    let cases_a = results(client, &a).await?;
    let cases_b = results(client, &b).await?;
    let pairing = pairing(client, &a, &b).await?;
    let comparison = compare(&cases_a, &cases_b, pairing).map_err(|refused| {
        let (side, field) = refused
            .field
            .split_once('.')
            .unwrap_or((refused.field.as_str(), ""));
        let group = if side == "A" { &a } else { &b };
        let what = if field.is_empty() {
            format!("{side} ({group})")
        } else {
            format!("{side} ({group}) {field}")
        };
        Error::input(format!(
            "cannot compare {b} against {a}: {what} is {}; it {}",
            refused.value, refused.rule
        ))
    })?;
    match output {
        None | Some(Output::Table | Output::Wide) => out(&render(&a, &b, &comparison)),
        Some(Output::Json) => outln(&serde_json::to_string_pretty(&comparison).unwrap_or_default()),
        Some(Output::Yaml) => out(&yaml::to_yaml(
            &serde_json::to_value(&comparison).unwrap_or(Value::Null),
        )?),
        Some(_) => return Err(Error::usage("eval compare prints a table, yaml or json")),
    }
    Ok(())
}

/// The cases of an evaluation group, in batch order.
async fn results(client: &Client, group: &str) -> Result<Vec<CaseResult>> {
    let document = client
        .call(Method::GET, &["agentgroups", group, "results"], &[], None)
        .await?;
    let items = document.get("items").cloned().unwrap_or(Value::Null);
    serde_json::from_value(items).map_err(|e| {
        Error::input(format!(
            "the server's results of {group} could not be read: {e}"
        ))
    })
}

/// A fraction as a percentage: these are rates, not money, so floating point is fine.
#[allow(clippy::float_arithmetic)]
fn percent(value: f64) -> String {
    format!("{:.1} %", value * 100.0)
}

/// A difference of rates as a signed percentage.
#[allow(clippy::float_arithmetic)]
fn signed_percent(value: f64) -> String {
    format!("{:+.1} %", value * 100.0)
}

/// The table of cases and the summary below it.
fn render(a: &str, b: &str, c: &Comparison) -> String {
    let mut table = Table::new(&["TASK", "REP", "A", "B", "CHANGE"]);
    for case in &c.cases {
        let change = match case.change {
            Change::BothPass => "both pass",
            Change::BothFail => "both fail",
            Change::Gained => "gained",
            Change::Lost => "lost",
            Change::NotPaired => "not paired",
        };
        table.rows.push(vec![
            case.task_id.clone(),
            case.repetition.to_string(),
            case.a.clone(),
            case.b.clone(),
            change.to_string(),
        ]);
    }
    let environment = match &c.environment_b {
        Some(other) => format!("{} (B graded by {other})", c.environment),
        None => c.environment.clone(),
    };
    let mut text = format!(
        "B = {b} against A = {a}: {environment}, split {}, seed {}\n\n",
        c.split, c.seed
    );
    text.push_str(&table.render());
    text.push_str(&format!(
        "\nPairs scored in both: {} (both pass {}, gained {}, lost {}, both fail {}); not paired: {}\n",
        c.pairs, c.both_pass, c.gained, c.lost, c.both_fail, c.not_paired
    ));
    match (c.pass_rate_a, c.pass_rate_b, c.difference, c.interval) {
        (Some(rate_a), Some(rate_b), Some(difference), Some(interval)) => {
            text.push_str(&format!(
                "Pass rate over the pairs: A {}, B {}\nDifference B − A: {} (95 % interval {} .. {}, Newcombe's method 10)\n",
                percent(rate_a),
                percent(rate_b),
                signed_percent(difference),
                signed_percent(interval.low),
                signed_percent(interval.high)
            ));
        }
        _ => text.push_str("No pair is scored in both groups: no difference to estimate.\n"),
    }
    text
}

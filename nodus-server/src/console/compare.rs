//! `nodus eval compare A B` as a page: two evaluation groups case by case, with the paired
//! difference in pass rate and its interval, computed by the same pure function the CLI
//! calls (`nodus_core::evaluation::stats::compare`), the discordant cases (gained, lost)
//! listed first, then every case.

use nodus_core::evaluation::stats::{Change, Comparison, Pairing, compare};
use nodus_core::resource::AgentGroupSpec;
use serde::Deserialize;

use super::html::Html;
use super::pages::Page;
use crate::error::ApiError;
use crate::state::AppState;

/// The page's query: the two groups.
#[derive(Debug, Default, Deserialize)]
pub struct CompareQuery {
    /// Group A (the baseline).
    #[serde(default)]
    pub a: Option<String>,
    /// Group B (compared against A).
    #[serde(default)]
    pub b: Option<String>,
}

/// A fraction as a percentage, as the CLI writes it: these are rates, not money.
#[allow(clippy::float_arithmetic)]
fn percent(value: f64) -> String {
    format!("{:.1} %", value * 100.0)
}

/// A difference of rates as a signed percentage, as the CLI writes it.
#[allow(clippy::float_arithmetic)]
fn signed_percent(value: f64) -> String {
    format!("{:+.1} %", value * 100.0)
}

fn change_name(change: Change) -> &'static str {
    match change {
        Change::BothPass => "both pass",
        Change::BothFail => "both fail",
        Change::Gained => "gained",
        Change::Lost => "lost",
        Change::NotPaired => "not paired",
    }
}

fn required<'a>(value: &'a Option<String>, field: &'static str) -> Result<&'a str, ApiError> {
    value
        .as_deref()
        .map(str::trim)
        .filter(|v| !v.is_empty())
        .ok_or_else(|| {
            ApiError::bad_parameter(nodus_core::validate::Invalid::new(
                field,
                "is required: the name of an evaluation group of this project",
                "\"\"",
            ))
        })
}

/// A group's `spec.evaluation.rescoreOf`.
async fn rescore_of(
    state: &AppState,
    project: &str,
    group: &str,
) -> Result<Option<String>, ApiError> {
    let group = state.engine.get::<AgentGroupSpec>(project, group).await?;
    let spec = serde_json::to_value(&group.spec).unwrap_or_default();
    Ok(spec["evaluation"]["rescoreOf"].as_str().map(str::to_string))
}

/// The comparison of B against A.
pub async fn page(state: &AppState, project: &str, query: &CompareQuery) -> Result<Page, ApiError> {
    let a = required(&query.a, "a")?;
    let b = required(&query.b, "b")?;
    let (rescore_a, rescore_b) = (
        rescore_of(state, project, a).await?,
        rescore_of(state, project, b).await?,
    );
    let pairing = Pairing::of(a, rescore_a.as_deref(), b, rescore_b.as_deref());
    let cases_a = state.engine.evaluation_results(project, a).await?;
    let cases_b = state.engine.evaluation_results(project, b).await?;
    let comparison = compare(&cases_a, &cases_b, pairing).map_err(ApiError::bad_parameter)?;
    let mut html = Html::new();
    html.raw("<h1>Compare B = ")
        .text(b)
        .raw(" against A = ")
        .text(a)
        .raw("</h1>");
    summary(&mut html, project, a, b, &comparison);
    html.raw("<h2>Discordant cases</h2>");
    let discordant: Vec<_> = comparison
        .cases
        .iter()
        .filter(|c| matches!(c.change, Change::Gained | Change::Lost))
        .collect();
    if discordant.is_empty() {
        html.raw("<p class=\"muted\" id=\"discordant-none\">No case passed in one and failed in the other.</p>");
    } else {
        cases(&mut html, "discordant", &discordant);
    }
    html.raw("<h2>Every case</h2>");
    let every: Vec<_> = comparison.cases.iter().collect();
    cases(&mut html, "cases", &every);
    Ok(Page::live(html))
}

fn summary(html: &mut Html, project: &str, a: &str, b: &str, c: &Comparison) {
    html.raw("<dl class=\"facts\" id=\"comparison\"><dt>A</dt><dd><a href=\"/console/p/")
        .segment(project)
        .raw("/groups/")
        .segment(a)
        .raw("\">")
        .text(a)
        .raw("</a></dd><dt>B</dt><dd><a href=\"/console/p/")
        .segment(project)
        .raw("/groups/")
        .segment(b)
        .raw("\">")
        .text(b)
        .raw("</a></dd><dt>Environment</dt><dd>")
        .text(&c.environment);
    if let Some(other) = &c.environment_b {
        html.raw(" (B graded by ").text(other).raw(")");
    }
    html.raw("</dd><dt>Split, seed</dt><dd>")
        .text(&c.split)
        .raw(", seed ")
        .text(c.seed)
        .raw("</dd><dt>Pairs scored in both</dt><dd id=\"pairs\">")
        .text(c.pairs)
        .raw("</dd><dt>Both pass, gained, lost, both fail</dt><dd id=\"changes\">")
        .text(format!(
            "{}, {}, {}, {}",
            c.both_pass, c.gained, c.lost, c.both_fail
        ))
        .raw("</dd><dt>Not paired</dt><dd id=\"not-paired\">")
        .text(c.not_paired)
        .raw("</dd>");
    match (c.pass_rate_a, c.pass_rate_b, c.difference, c.interval) {
        (Some(rate_a), Some(rate_b), Some(difference), Some(interval)) => {
            html.raw("<dt>Pass rate over the pairs</dt><dd id=\"rates\">A ")
                .text(percent(rate_a))
                .raw(", B ")
                .text(percent(rate_b))
                .raw("</dd><dt>Difference B − A</dt><dd id=\"difference\">")
                .text(signed_percent(difference))
                .raw("</dd><dt>95 % interval (Newcombe's method 10)</dt><dd id=\"interval\">")
                .text(signed_percent(interval.low))
                .raw(" .. ")
                .text(signed_percent(interval.high))
                .raw("</dd>");
        }
        _ => {
            html.raw(
                "<dt>Difference</dt><dd id=\"difference\">No pair is scored in both groups: \
                 no difference to estimate.</dd>",
            );
        }
    }
    html.raw("</dl>");
}

fn cases(html: &mut Html, id: &'static str, cases: &[&nodus_core::evaluation::stats::PairedCase]) {
    html.raw("<div class=\"table\"><table id=\"").raw(id).raw(
        "\"><thead><tr><th>Task</th><th class=\"num\">Rep.</th><th>A</th><th>B</th>\
             <th>Change</th></tr></thead><tbody>",
    );
    for case in cases {
        html.raw("<tr data-task=\"")
            .text(&case.task_id)
            .raw("\"><td>")
            .text(&case.task_id)
            .raw("</td><td class=\"num\">")
            .text(case.repetition)
            .raw("</td><td>")
            .text(&case.a)
            .raw("</td><td>")
            .text(&case.b)
            .raw("</td><td class=\"change\">")
            .text(change_name(case.change))
            .raw("</td></tr>");
    }
    html.raw("</tbody></table></div>");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_read_as_the_cli_writes_them() {
        assert_eq!(percent(0.5), "50.0 %");
        assert_eq!(signed_percent(0.25), "+25.0 %");
        assert_eq!(signed_percent(-0.104), "-10.4 %");
        assert_eq!(change_name(Change::Gained), "gained");
    }
}

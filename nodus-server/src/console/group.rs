//! A group's page: its facts, progress over time and spend against its cap (small charts
//! from [`super::charts`]), counts, blocked reasons, for an evaluation group its summary, a
//! per-task table with each task's pass rate and interval and a form to compare it with
//! another evaluation, and its runs a page at a time ([`super::lists`]).

use jiff::Timestamp;
use nodus_core::evaluation::stats::{Z95, wilson};
use nodus_core::money::Usd;
use nodus_core::resource::{AgentGroupSpec, Kind};
use nodus_core::store::Selector;
use serde_json::Value;

use super::charts::{self, Member};
use super::html::{Html, percent_encode};
use super::lists::{ListFilter, page, pager};
use super::pages::{
    COUNT_FIELDS, Page, cost_against_cap, group_total, percent, percent_range, phase_class,
    reason_counts, reward, runs_table, show,
};
use crate::error::ApiError;
use crate::state::AppState;

/// Moments the progress chart samples.
const PROGRESS_POINTS: u32 = 48;

/// The members' timestamps and costs: four fields of each, read without the rest.
async fn members(state: &AppState, project: &str, name: &str) -> Result<Vec<Member>, ApiError> {
    let selector = Selector::in_group(name);
    let records = state
        .store
        .list_sparse(
            project,
            Kind::AgentRun,
            &selector,
            &[
                "metadata.creationTimestamp",
                "status.startTime",
                "status.completionTime",
                "status.cost.totalUSD",
            ],
        )
        .await?;
    let time = |value: &Value| value.as_str().and_then(|t| t.parse::<Timestamp>().ok());
    Ok(records
        .iter()
        .filter_map(|record| {
            let document = &record.document;
            Some(Member {
                created: time(&document["metadata"]["creationTimestamp"])?,
                started: time(&document["status"]["startTime"]),
                completed: time(&document["status"]["completionTime"]),
                cost: document["status"]["cost"]["totalUSD"]
                    .as_str()
                    .and_then(|c| c.parse::<Usd>().ok())
                    .unwrap_or(Usd::ZERO),
            })
        })
        .collect())
}

/// The group's cap: `spec.maxCostUSD`, else the one its status reports.
fn cap_of(group: &Value) -> Option<Usd> {
    let cap = if group["spec"]["maxCostUSD"].is_null() {
        &group["status"]["cost"]["limitUSD"]
    } else {
        &group["spec"]["maxCostUSD"]
    };
    cap.as_str().and_then(|c| c.parse().ok())
}

/// The group's charts (the part its page fetches after it is shown, or a page of its own).
pub async fn charts_page(state: &AppState, project: &str, name: &str) -> Result<Page, ApiError> {
    let group = serde_json::to_value(state.engine.get::<AgentGroupSpec>(project, name).await?)
        .unwrap_or(Value::Null);
    let members = members(state, project, name).await?;
    let mut html = Html::new();
    charts(&mut html, &group, &members);
    // Below the part the group's page takes in: only on the charts' own page.
    let mut after = Html::new();
    after
        .raw("<p class=\"back\"><a href=\"/console/p/")
        .segment(project)
        .raw("/groups/")
        .segment(name)
        .raw("\">Group ")
        .text(name)
        .raw("</a></p>");
    Ok(Page {
        live: html,
        after,
        is_live: true,
    })
}

/// The charts and their legends: progress (today's split from `status.counts`, the API's),
/// spend against the cap.
fn charts(html: &mut Html, group: &Value, members: &[Member]) {
    let counts = &group["status"]["counts"];
    let count = |field: &str| counts[field].as_u64().unwrap_or(0);
    let now = Timestamp::now();
    html.raw("<h2>Progress</h2>");
    charts::render_progress(html, &charts::progress(members, now, PROGRESS_POINTS));
    html.raw("<ul class=\"legend\" id=\"progress-legend\">");
    let done = count("succeeded") + count("failed") + count("cancelled");
    for (series, label, value) in [
        ("queued", "queued", count("queued")),
        ("active", "active", count("active")),
        ("waiting", "waiting", count("waiting")),
        ("parked", "parked", count("parked")),
        ("done", "done", done),
    ] {
        html.raw("<li data-series=\"")
            .raw(series)
            .raw("\"><span class=\"swatch series-")
            .raw(series)
            .raw("\"></span>")
            .raw(label)
            .raw(" <strong class=\"count\">")
            .text(value)
            .raw("</strong></li>");
    }
    html.raw(
        "</ul><p class=\"muted\">Over time, a started run that has not finished is drawn as \
         active (waiting and parked are known for now only: the split above).</p>\
         <h2>Spend</h2>",
    );
    charts::render_spend(html, &charts::spend(members, now), cap_of(group));
    html.raw("<p id=\"spend-legend\">Spent <strong>")
        .text(show(&group["status"]["cost"]["totalUSD"]))
        .raw("</strong> USD");
    match cap_of(group) {
        Some(cap) => {
            html.raw(" of the cap, <strong>")
                .text(cap)
                .raw("</strong> USD");
        }
        None => {
            html.raw(" <span class=\"muted\">(no cap)</span>");
        }
    }
    html.raw("</p>");
}

/// A group: phase, counts, blocked reasons with counts, cost against the cap, and its runs
/// with what each depends on.
pub async fn group(
    state: &AppState,
    project: &str,
    name: &str,
    filter: &ListFilter,
) -> Result<Page, ApiError> {
    let group = serde_json::to_value(state.engine.get::<AgentGroupSpec>(project, name).await?)
        .unwrap_or(Value::Null);
    let selector = Selector::in_group(name);
    let listed = page(state, project, Kind::AgentRun, &selector, filter).await?;
    let status = &group["status"];
    let counts = &status["counts"];
    let mut html = Html::new();
    html.raw("<h1>Group ")
        .text(name)
        .raw("</h1><dl class=\"facts\"><dt>Phase</dt><dd id=\"phase\" class=\"phase phase-")
        .text(phase_class(&status["phase"]))
        .raw("\">")
        .text(show(&status["phase"]))
        .raw("</dd><dt>Agent</dt><dd>")
        .text(show(&group["spec"]["agent"]))
        .raw("</dd><dt>Runs succeeded/total</dt><dd id=\"runs\">")
        .text(counts["succeeded"].as_u64().unwrap_or(0))
        .raw("/")
        .text(group_total(counts))
        .raw("</dd><dt>Active</dt><dd>")
        .text(counts["active"].as_u64().unwrap_or(0))
        .raw("</dd><dt>Cost (USD)</dt><dd id=\"cost\">");
    cost_against_cap(&mut html, &group);
    html.raw("</dd></dl>");
    // The charts read every member (four fields each): fetched by the page once it is shown
    // (console.js), so that the page itself reads one page of runs; without script, a link.
    html.raw("<div class=\"lazy\" id=\"charts\" data-fragment=\"/console/p/")
        .segment(project)
        .raw("/groups/")
        .segment(name)
        .raw("/charts\"><p><a href=\"/console/p/")
        .segment(project)
        .raw("/groups/")
        .segment(name)
        .raw("/charts\">Progress and spend over time</a></p></div>");
    html.raw("<h2>Counts</h2><div class=\"table\"><table id=\"counts\"><thead><tr>");
    let fields = COUNT_FIELDS;
    for field in fields {
        html.raw("<th class=\"num\">").raw(field).raw("</th>");
    }
    html.raw("</tr></thead><tbody><tr>");
    for field in fields {
        html.raw("<td class=\"num\">")
            .text(counts[field].as_u64().unwrap_or(0))
            .raw("</td>");
    }
    html.raw("</tr></tbody></table></div><h2>Blocked</h2>");
    reason_counts(
        &mut html,
        &status["blockedReasons"],
        "blocked",
        "Runs",
        "Nothing is blocked.",
    );
    if !group["spec"]["evaluation"].is_null() {
        evaluation_summary(&mut html, project, name, &group);
        compare_form(&mut html, state, project, name, &group).await?;
    }
    html.raw("<h2>Runs</h2>");
    let runs: Vec<&Value> = listed.items.iter().collect();
    runs_table(&mut html, project, &runs, true);
    let path = format!(
        "/console/p/{}/groups/{}",
        percent_encode(project),
        percent_encode(name)
    );
    pager(&mut html, &path, filter, listed.next.as_deref());
    Ok(Page::live(html))
}

/// An evaluation group's summary: what it evaluates, scored and pending cases, pass rate with
/// its bracket and interval, mean reward, the unscored cases by reason, and the link to the
/// results.
fn evaluation_summary(html: &mut Html, project: &str, name: &str, group: &Value) {
    let spec = &group["spec"]["evaluation"];
    let summary = &group["status"]["evaluation"];
    html.raw("<h2>Evaluation</h2><dl class=\"facts\" id=\"evaluation\"><dt>Environment</dt><dd>")
        .text(show(&spec["environment"]))
        .raw("</dd><dt>Split, seed</dt><dd>")
        .text(show(&spec["split"]))
        .raw(", seed ")
        .text(show(&spec["seed"]))
        .raw("</dd><dt>Cases</dt><dd id=\"eval-cases\">")
        .text(show(&summary["cases"]))
        .raw("</dd><dt>Scored</dt><dd id=\"eval-scored\">")
        .text(show(&summary["scored"]))
        .raw("</dd><dt>Pending</dt><dd id=\"eval-pending\">")
        .text(show(&summary["pending"]))
        .raw("</dd><dt>Pass rate (of scored)</dt><dd id=\"eval-pass-rate\">")
        .text(percent(&summary["passRate"]))
        .raw("</dd><dt>95 % interval</dt><dd id=\"eval-interval\">")
        .text(percent_range(&summary["interval"]))
        .raw("</dd><dt>Bracket (unscored as fail – as pass)</dt><dd id=\"eval-bracket\">")
        .text(percent_range(&summary["bracket"]))
        .raw("</dd><dt>Mean reward (of scored)</dt><dd id=\"eval-mean-reward\">")
        .text(reward(&summary["meanReward"]))
        .raw("</dd></dl><p><a id=\"results-link\" href=\"/console/p/")
        .segment(project)
        .raw("/groups/")
        .segment(name)
        .raw(
            "/results\">Results: each case with its run and the grader's evidence</a></p>\
              <h3>Unscored</h3>",
        );
    reason_counts(
        html,
        &summary["unscored"],
        "unscored",
        "Cases",
        "No case is unscored.",
    );
    per_task(html, summary);
}

/// Each task over its repetitions: cases, scored, passes, its reduced reward and pass@1..k,
/// as the server computed them (`status.evaluation.perTask`).
#[allow(clippy::float_arithmetic)]
fn per_task(html: &mut Html, summary: &Value) {
    html.raw("<h3>Per task</h3>");
    let tasks = summary["perTask"].as_array().cloned().unwrap_or_default();
    if tasks.is_empty() {
        html.raw("<p class=\"muted\">No task has a case yet.</p>");
        return;
    }
    let most = tasks
        .iter()
        .filter_map(|t| t["passAtK"].as_object().map(serde_json::Map::len))
        .max()
        .unwrap_or(0);
    // pass@k says more than pass@1 only when tasks were repeated.
    let most = if most > 1 { most } else { 0 };
    html.raw(
        "<div class=\"table\"><table id=\"per-task\"><thead><tr><th>Task</th>\
         <th class=\"num\">Cases</th><th class=\"num\">Scored</th>\
         <th class=\"num\">Passes</th><th class=\"num\">Pass rate</th>\
         <th class=\"num\">95 % interval</th><th class=\"num\">Reward</th>",
    );
    for k in 1..=most {
        html.raw("<th class=\"num\">pass@").text(k).raw("</th>");
    }
    html.raw("</tr></thead><tbody>");
    for task in &tasks {
        html.raw("<tr data-task=\"")
            .text(show(&task["taskId"]))
            .raw("\"><td>")
            .text(show(&task["taskId"]))
            .raw("</td><td class=\"num\">")
            .text(show(&task["attempts"]))
            .raw("</td><td class=\"num\">")
            .text(show(&task["scored"]))
            .raw("</td><td class=\"num\">")
            .text(show(&task["passes"]))
            .raw("</td><td class=\"num pass-rate\">");
        let scored = task["scored"].as_u64().and_then(|n| u32::try_from(n).ok());
        let passes = task["passes"].as_u64().and_then(|n| u32::try_from(n).ok());
        match (passes, scored) {
            (Some(passes), Some(scored)) if scored > 0 => {
                // The same interval the group's pass rate has (Wilson's, at 95 %).
                let interval =
                    serde_json::to_value(wilson(passes, scored, Z95)).unwrap_or(Value::Null);
                let rate = serde_json::json!(f64::from(passes) / f64::from(scored));
                html.text(percent(&rate))
                    .raw("</td><td class=\"num interval\">")
                    .text(percent_range(&interval));
            }
            _ => {
                html.raw("—</td><td class=\"num interval\">—");
            }
        }
        html.raw("</td><td class=\"num\">")
            .text(reward(&task["reward"]))
            .raw("</td>");
        for k in 1..=most {
            html.raw("<td class=\"num\">")
                .text(percent(&task["passAtK"][k.to_string()]))
                .raw("</td>");
        }
        html.raw("</tr>");
    }
    html.raw("</tbody></table></div>");
}

/// A form that opens the comparison of this evaluation with another of the same split and
/// seed (a GET: it changes nothing).
async fn compare_form(
    html: &mut Html,
    state: &AppState,
    project: &str,
    name: &str,
    group: &Value,
) -> Result<(), ApiError> {
    let records = state
        .store
        .list_sparse(
            project,
            Kind::AgentGroup,
            &Selector::default(),
            &[
                "metadata.name",
                "spec.evaluation.split",
                "spec.evaluation.seed",
            ],
        )
        .await?;
    let mine = &group["spec"]["evaluation"];
    let others: Vec<String> = records
        .iter()
        .map(|r| &r.document)
        .filter(|d| {
            let theirs = &d["spec"]["evaluation"];
            theirs.is_object()
                && theirs["split"] == mine["split"]
                && theirs["seed"] == mine["seed"]
                && d["metadata"]["name"].as_str() != Some(name)
        })
        .map(|d| show(&d["metadata"]["name"]))
        .collect();
    html.raw("<h3>Compare</h3>");
    if others.is_empty() {
        html.raw(
            "<p class=\"muted\" id=\"compare-none\">No other evaluation of this split and \
             seed to compare with.</p>",
        );
        return Ok(());
    }
    html.raw("<form method=\"get\" class=\"filters\" id=\"compare-form\" action=\"/console/p/")
        .segment(project)
        .raw("/compare\"><input type=\"hidden\" name=\"a\" value=\"")
        .text(name)
        .raw("\"><label>B (compared against this group as A)<select name=\"b\" id=\"compare-b\">");
    for other in &others {
        html.raw("<option>").text(other).raw("</option>");
    }
    html.raw("</select></label><button type=\"submit\" id=\"compare\">Compare</button></form>");
    Ok(())
}

//! The console's pages, rendered from the values the REST API answers (the same engine and
//! store calls, serialized the same way), every piece of data through [`Html::text`].

use std::collections::BTreeMap;

use nodus_core::resource::{AgentGroupSpec, AgentRunSpec, AgentRunStatus, Kind};
use nodus_core::store::Selector;
use serde_json::Value;

use super::html::{Html, percent_encode};
use crate::auth::TEMPLATE_PROJECT;
use crate::error::ApiError;
use crate::state::AppState;

/// Which part of the console a page belongs to.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Tab {
    /// Agents.
    Agents,
    /// Runs, filtered and paged.
    Runs,
    /// Groups.
    Groups,
    /// Credits, budget and spend.
    Credits,
    /// AgentEnvironments.
    Environments,
}

/// What the layout around a page needs.
pub struct Layout {
    /// The project shown.
    pub project: String,
    /// The projects of the caller's token, for the switcher.
    pub projects: Vec<String>,
    /// The session's CSRF token, for the sign-out form.
    pub csrf: String,
    /// The part of the console.
    pub tab: Tab,
    /// The page's title.
    pub title: String,
}

/// A rendered page: its live part (fetched again on a change, when `live`) and the rest.
pub struct Page {
    /// The part that a change re-renders.
    pub live: Html,
    /// Below it, kept while the live part is replaced (forms being typed in).
    pub after: Html,
    /// Whether the page listens for changes.
    pub is_live: bool,
}

impl Page {
    pub(super) fn live(live: Html) -> Self {
        Page {
            live,
            after: Html::new(),
            is_live: true,
        }
    }
}

fn head(html: &mut Html, title: &str) {
    html.raw(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\"><title>",
    )
    .text(title)
    .raw(
        " · Nodus</title><link rel=\"stylesheet\" href=\"/console/assets/console.css\">\
         <script src=\"/console/assets/console.js\" defer></script></head><body>",
    );
}

/// The page in the console's layout: header with the pages, the project switcher and
/// sign-out; then the live part and the rest.
pub fn layout(layout: &Layout, page: Page) -> Html {
    let mut html = Html::new();
    head(&mut html, &layout.title);
    let project = percent_encode(&layout.project);
    html.raw("<header><span class=\"brand\">Nodus console</span><nav aria-label=\"Pages\"><ul>");
    for (tab, path, label) in [
        (Tab::Agents, "agents", "Agents"),
        (Tab::Runs, "runs", "Runs"),
        (Tab::Groups, "groups", "Groups"),
        (Tab::Environments, "environments", "Environments"),
        (Tab::Credits, "credits", "Credits"),
    ] {
        html.raw("<li><a href=\"/console/p/")
            .text(&project)
            .raw("/")
            .raw(path)
            .raw("\"");
        if tab == layout.tab {
            html.raw(" aria-current=\"page\"");
        }
        html.raw(">").raw(label).raw("</a></li>");
    }
    html.raw("</ul></nav><nav aria-label=\"Projects\" id=\"projects\"><ul><li class=\"muted\">Project:</li>");
    for other in &layout.projects {
        html.raw("<li><a href=\"/console/p/")
            .segment(other)
            .raw("/agents\"");
        if *other == layout.project {
            html.raw(" aria-current=\"page\"");
        }
        html.raw(">").text(other).raw("</a></li>");
    }
    html.raw(
        "</ul></nav><form method=\"post\" action=\"/console/signout\" class=\"inline\">\
         <input type=\"hidden\" name=\"csrf\" value=\"",
    )
    .text(&layout.csrf)
    .raw("\"><button type=\"submit\" id=\"signout\">Sign out</button></form></header><main>");
    if page.is_live {
        html.raw("<div id=\"live\" data-events=\"/console/p/")
            .text(&project)
            .raw("/events\">");
    } else {
        html.raw("<div>");
    }
    html.append(page.live)
        .raw("</div>")
        .append(page.after)
        .raw("</main></body></html>");
    html
}

/// The sign-in page, with what was wrong with the last try.
pub fn signin(problem: Option<&str>) -> Html {
    let mut html = Html::new();
    head(&mut html, "Sign in");
    html.raw("<main class=\"signin\"><h1>Nodus console</h1>");
    if let Some(problem) = problem {
        html.raw("<p class=\"error\" role=\"alert\" id=\"problem\">")
            .text(problem)
            .raw("</p>");
    }
    html.raw(
        "<form method=\"post\" action=\"/console/signin\"><p><label for=\"token\">API token</label></p>\
         <p><input type=\"password\" id=\"token\" name=\"token\" autocomplete=\"off\" required autofocus></p>\
         <p><button type=\"submit\" id=\"signin\">Sign in</button></p></form>\
         <p class=\"muted\">The token stays on the server; the browser keeps a session cookie.</p>\
         </main></body></html>",
    );
    html
}

/// An error: status, reason and sentence, and a link back.
pub fn error(error: &ApiError, back: Option<&str>) -> Html {
    let mut html = Html::new();
    head(&mut html, error.reason.as_str());
    html.raw("<main><h1>")
        .text(error.status().as_u16())
        .raw(" ")
        .text(error.reason.as_str())
        .raw("</h1><p class=\"error\" role=\"alert\" id=\"problem\">")
        .text(&error.message)
        .raw("</p><p>");
    if let Some(back) = back {
        html.raw("<a href=\"").text(back).raw("\">Back</a> · ");
    }
    html.raw("<a href=\"/console\">Console</a></p></main></body></html>");
    html
}

/// A JSON value as text: a string as it is, nothing as a dash.
pub(super) fn show(value: &Value) -> String {
    match value {
        Value::Null => "—".to_string(),
        Value::String(text) => text.clone(),
        other => other.to_string(),
    }
}

pub(super) fn to_values<T: serde::Serialize>(items: &[T]) -> Vec<Value> {
    items
        .iter()
        .map(|item| serde_json::to_value(item).unwrap_or(Value::Null))
        .collect()
}

/// A run's `spec.agent` as the console names it: the agent's name, or [`INLINE_AGENT`] for
/// an agent written into the run (its spec is in the run's snapshot, not a name).
pub(super) fn agent_label(agent: &Value) -> String {
    if agent.is_object() {
        INLINE_AGENT.to_string()
    } else {
        show(agent)
    }
}

/// How the console names an agent written inline in a run.
const INLINE_AGENT: &str = "(inline agent)";

/// A phase as a class name: its letters and digits only.
pub(super) fn phase_class(phase: &Value) -> String {
    show(phase)
        .chars()
        .filter(|c| c.is_ascii_alphanumeric())
        .collect()
}

pub(super) fn phase_cell(html: &mut Html, phase: &Value) {
    let text = show(phase);
    html.raw("<td class=\"phase phase-")
        .text(phase_class(phase))
        .raw("\">")
        .text(text)
        .raw("</td>");
}

pub(super) fn run_link(html: &mut Html, project: &str, name: &str) {
    html.raw("<a href=\"/console/p/")
        .segment(project)
        .raw("/runs/")
        .segment(name)
        .raw("\">")
        .text(name)
        .raw("</a>");
}

/// The run's status as the engine reads it (what a page shows of a run is what the engine
/// wrote; a status that does not read is shown as a run without a phase).
fn status_of(run: &Value) -> AgentRunStatus {
    serde_json::from_value(run["status"].clone()).unwrap_or_default()
}

/// Whether `run` has finished ([`AgentRunStatus::is_finished`]).
pub(super) fn is_finished(run: &Value) -> bool {
    status_of(run).is_finished()
}

/// Whether `run` takes a resolution ([`AgentRunStatus::takes_resolution`]): it is parked on
/// an uncertain step.
pub(super) fn takes_resolution(run: &Value) -> bool {
    status_of(run).takes_resolution()
}

/// Whether `run` still takes messages ([`AgentRunStatus::takes_messages`]): not finished,
/// and not ending (deleting its sandbox to end).
pub(super) fn takes_messages(run: &Value) -> bool {
    status_of(run).takes_messages()
}

/// The runs of a project, newest first.
async fn runs_of(
    state: &AppState,
    project: &str,
    selector: &Selector,
) -> Result<Vec<Value>, ApiError> {
    let runs = state.engine.list::<AgentRunSpec>(project, selector).await?;
    let mut runs = to_values(&runs);
    runs.reverse();
    Ok(runs)
}

/// A table of runs: name, phase, the model of the latest turn, cost.
pub(super) fn runs_table(html: &mut Html, project: &str, runs: &[&Value], extra: bool) {
    html.raw("<div class=\"table\"><table><thead><tr><th>Run</th><th>Phase</th>");
    if extra {
        html.raw("<th>Task</th><th>Depends on</th>");
    }
    html.raw(
        "<th>Model (latest turn)</th><th class=\"num\">Cost (USD)</th>\
         <th class=\"hide-narrow\">Created</th></tr></thead><tbody>",
    );
    for run in runs {
        let name = run["metadata"]["name"].as_str().unwrap_or_default();
        html.raw("<tr data-run=\"").text(name).raw("\"><td>");
        run_link(html, project, name);
        html.raw("</td>");
        phase_cell(html, &run["status"]["phase"]);
        if extra {
            html.raw("<td>")
                .text(show(&run["spec"]["taskKey"]))
                .raw("</td><td>");
            let depends: Vec<&str> = run["spec"]["dependsOn"]
                .as_array()
                .map(|items| items.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            if depends.is_empty() {
                html.raw("—");
            }
            for (i, task) in depends.iter().enumerate() {
                if i > 0 {
                    html.raw(", ");
                }
                html.text(task);
            }
            html.raw("</td>");
        }
        let model = run["status"]["turns"]
            .as_array()
            .and_then(|turns| turns.last())
            .map(|turn| show(&turn["model"]))
            .unwrap_or_else(|| "—".to_string());
        html.raw("<td class=\"model\">")
            .text(model)
            .raw("</td><td class=\"num cost\">")
            .text(show(&run["status"]["cost"]["totalUSD"]))
            .raw("</td><td class=\"hide-narrow muted\">")
            .text(show(&run["metadata"]["creationTimestamp"]))
            .raw("</td></tr>");
    }
    html.raw("</tbody></table></div>");
}

pub(super) fn csrf_field(html: &mut Html, csrf: &str) {
    html.raw("<input type=\"hidden\" name=\"csrf\" value=\"")
        .text(csrf)
        .raw("\">");
}

pub(super) fn action_form(html: &mut Html, base: &str, action: &'static str, csrf: &str) {
    html.raw("<form method=\"post\" class=\"inline\" action=\"")
        .text(base)
        .raw("/")
        .raw(action)
        .raw("\">");
    csrf_field(html, csrf);
}

pub(super) fn duration(step: &Value) -> String {
    let parse = |v: &Value| v.as_str().and_then(|t| t.parse::<jiff::Timestamp>().ok());
    match (parse(&step["startedAt"]), parse(&step["finishedAt"])) {
        (Some(start), Some(end)) => {
            let millis = end.duration_since(start).as_millis();
            if millis < 1000 {
                format!("{millis} ms")
            } else {
                format!("{}.{:01} s", millis / 1000, (millis % 1000) / 100)
            }
        }
        _ => "—".to_string(),
    }
}

/// One step's recorded intent and outcome (a step's payload, on demand).
pub async fn step(state: &AppState, project: &str, name: &str, seq: u32) -> Result<Page, ApiError> {
    let views = state.engine.steps(project, name).await?;
    let journal = state.engine.journal(project, name).await?;
    let Some((view, step)) = views
        .into_iter()
        .zip(journal)
        .find(|(view, _)| view.seq == seq)
    else {
        return Err(ApiError::not_found(format!(
            "run {name:?} has no step {seq}"
        )));
    };
    let pretty = |value: Value| serde_json::to_string_pretty(&value).unwrap_or_default();
    let intent = pretty(serde_json::to_value(&step.intent).unwrap_or(Value::Null));
    let outcome = pretty(serde_json::to_value(step.outcome()).unwrap_or(Value::Null));
    let view = serde_json::to_value(&view).unwrap_or(Value::Null);
    let mut html = Html::new();
    html.raw("<p><a href=\"/console/p/")
        .segment(project)
        .raw("/runs/")
        .segment(name)
        .raw("\">← Run ")
        .text(name)
        .raw("</a></p><h1>Step ")
        .text(seq)
        .raw(": ")
        .text(show(&view["kind"]))
        .raw("</h1><dl class=\"facts\"><dt>State</dt><dd>")
        .text(show(&view["state"]))
        .raw("</dd><dt>Duration</dt><dd>")
        .text(duration(&view))
        .raw("</dd><dt>Summary</dt><dd>")
        .text(show(&view["summary"]))
        .raw("</dd></dl>");
    // A command's whole output as text: what the transcript folds.
    if let Some(nodus_core::journal::Outcome::CommandFinished { output, .. }) = step.outcome() {
        for (id, label, stream) in [
            ("stdout", "Standard output", &output.stdout),
            ("stderr", "Standard error", &output.stderr),
        ] {
            html.raw("<h2>")
                .raw(label)
                .raw("</h2><pre id=\"")
                .raw(id)
                .raw("\">");
            html.text(stream.lossy()).raw("</pre>");
            if stream.truncated {
                html.raw("<p class=\"muted\">Cut at the sandbox's output cap.</p>");
            }
        }
    }
    html.raw("<h2>Intent</h2><pre id=\"intent\">")
        .text(intent)
        .raw("</pre><h2>Outcome</h2><pre id=\"outcome\">")
        .text(outcome)
        .raw("</pre>");
    Ok(Page {
        live: html,
        after: Html::new(),
        is_live: false,
    })
}

/// The fields of a group's `status.counts`, in the order the group page shows them; every run
/// of the group is in exactly one.
pub(super) const COUNT_FIELDS: [&str; 7] = [
    "queued",
    "active",
    "waiting",
    "parked",
    "succeeded",
    "failed",
    "cancelled",
];

pub(super) fn group_total(counts: &Value) -> u64 {
    COUNT_FIELDS
        .iter()
        .filter_map(|field| counts[*field].as_u64())
        .sum()
}

pub(super) fn cost_against_cap(html: &mut Html, group: &Value) {
    html.text(show(&group["status"]["cost"]["totalUSD"]));
    let cap = if group["spec"]["maxCostUSD"].is_null() {
        &group["status"]["cost"]["limitUSD"]
    } else {
        &group["spec"]["maxCostUSD"]
    };
    if cap.is_null() {
        html.raw(" <span class=\"muted\">(no cap)</span>");
    } else {
        html.raw(" of ").text(show(cap));
    }
}

/// Groups: phase, RUNS succeeded/total, active, cost against the cap.
pub async fn groups(state: &AppState, project: &str) -> Result<Page, ApiError> {
    let groups = to_values(
        &state
            .engine
            .list::<AgentGroupSpec>(project, &Selector::default())
            .await?,
    );
    let mut html = Html::new();
    html.raw("<h1>Groups</h1>");
    if groups.is_empty() {
        html.raw("<p class=\"muted\">No groups in this project yet.</p>");
        return Ok(Page::live(html));
    }
    html.raw(
        "<div class=\"table\"><table id=\"groups\"><thead><tr><th>Group</th><th>Phase</th>\
              <th class=\"num\">Runs succeeded/total</th><th class=\"num\">Active</th>\
              <th class=\"num\">Cost (USD) against the cap</th></tr></thead><tbody>",
    );
    for group in groups.iter().rev() {
        let name = group["metadata"]["name"].as_str().unwrap_or_default();
        let counts = &group["status"]["counts"];
        html.raw("<tr><td><a href=\"/console/p/")
            .segment(project)
            .raw("/groups/")
            .segment(name)
            .raw("\">")
            .text(name)
            .raw("</a></td>");
        phase_cell(&mut html, &group["status"]["phase"]);
        html.raw("<td class=\"num\">")
            .text(counts["succeeded"].as_u64().unwrap_or(0))
            .raw("/")
            .text(group_total(counts))
            .raw("</td><td class=\"num\">")
            .text(counts["active"].as_u64().unwrap_or(0))
            .raw("</td><td class=\"num\">");
        cost_against_cap(&mut html, group);
        html.raw("</td></tr>");
    }
    html.raw("</tbody></table></div>");
    Ok(Page::live(html))
}

/// A table of counts by reason (`{REASON: count}`) with the id `id`, the counts headed
/// `unit`; `none` when there are none.
pub(super) fn reason_counts(
    html: &mut Html,
    counts: &Value,
    id: &'static str,
    unit: &'static str,
    none: &'static str,
) {
    let Some(reasons) = counts.as_object().filter(|r| !r.is_empty()) else {
        html.raw("<p class=\"muted\" id=\"")
            .raw(id)
            .raw("\">")
            .raw(none)
            .raw("</p>");
        return;
    };
    html.raw("<div class=\"table\"><table id=\"")
        .raw(id)
        .raw("\"><thead><tr><th>Reason</th><th class=\"num\">")
        .raw(unit)
        .raw("</th></tr></thead><tbody>");
    for (reason, count) in reasons {
        html.raw("<tr data-reason=\"")
            .text(reason)
            .raw("\"><td>")
            .text(reason)
            .raw("</td><td class=\"num\">")
            .text(show(count))
            .raw("</td></tr>");
    }
    html.raw("</tbody></table></div>");
}

/// A fraction (a pass rate, an end of an interval) as a percentage with one decimal. These
/// are fractions, not money: floating point is fine here.
#[allow(clippy::float_arithmetic)]
pub(super) fn percent(value: &Value) -> String {
    value
        .as_f64()
        .map_or_else(|| "—".to_string(), |v| format!("{:.1} %", v * 100.0))
}

/// A `{"low", "high"}` range as `low – high` in percent.
pub(super) fn percent_range(range: &Value) -> String {
    if range.is_null() {
        return "—".to_string();
    }
    format!("{} – {}", percent(&range["low"]), percent(&range["high"]))
}

/// A reward (0 to 1) with three decimals.
pub(super) fn reward(value: &Value) -> String {
    value
        .as_f64()
        .map_or_else(|| "—".to_string(), |v| format!("{v:.3}"))
}

/// An evaluation group's results: each case in batch order with its state, verdict or reason,
/// reward, the grader's evidence (as text) and a link to its AgentRun with the run's phase.
pub async fn results(state: &AppState, project: &str, name: &str) -> Result<Page, ApiError> {
    let cases = to_values(&state.engine.evaluation_results(project, name).await?);
    let runs = runs_of(state, project, &Selector::in_group(name)).await?;
    let phases: BTreeMap<&str, &Value> = runs
        .iter()
        .map(|run| {
            (
                run["metadata"]["name"].as_str().unwrap_or_default(),
                &run["status"]["phase"],
            )
        })
        .collect();
    let mut html = Html::new();
    html.raw("<h1>Results of <a href=\"/console/p/")
        .segment(project)
        .raw("/groups/")
        .segment(name)
        .raw("\">")
        .text(name)
        .raw("</a></h1>");
    if cases.is_empty() {
        html.raw("<p class=\"muted\">No cases: this group is not an evaluation group.</p>");
        return Ok(Page::live(html));
    }
    html.raw(
        "<div class=\"table\"><table id=\"results\"><thead><tr><th>Task</th>\
         <th class=\"num\">Rep.</th><th>State</th><th>Verdict or reason</th>\
         <th class=\"num\">Reward</th><th>Evidence</th><th>Run</th><th>Run phase</th>\
         </tr></thead><tbody>",
    );
    for case in &cases {
        let run = case["run"].as_str().unwrap_or_default();
        let outcome = if case["verdict"].is_null() {
            &case["reason"]
        } else {
            &case["verdict"]
        };
        html.raw("<tr data-task=\"")
            .text(show(&case["taskId"]))
            .raw("\" data-repetition=\"")
            .text(show(&case["repetition"]))
            .raw("\"><td>")
            .text(show(&case["taskId"]))
            .raw("</td><td class=\"num\">")
            .text(show(&case["repetition"]))
            .raw("</td><td class=\"case-state state-")
            .text(phase_class(&case["state"]))
            .raw("\">")
            .text(show(&case["state"]))
            .raw("</td><td class=\"outcome\">")
            .text(show(outcome))
            .raw("</td><td class=\"num reward\">")
            .text(reward(&case["reward"]))
            .raw("</td><td class=\"evidence\">")
            .text(show(&case["evidence"]))
            .raw("</td><td>");
        run_link(&mut html, project, run);
        html.raw("</td>");
        phase_cell(&mut html, phases.get(run).copied().unwrap_or(&Value::Null));
        html.raw("</tr>");
    }
    html.raw("</tbody></table></div>");
    Ok(Page::live(html))
}

/// Credits, budget and spend of each project of the token.
pub async fn credits(state: &AppState, projects: &[String]) -> Result<Page, ApiError> {
    let mut html = Html::new();
    html.raw(
        "<h1>Credits</h1><div class=\"table\"><table id=\"credits\"><thead><tr><th>Project</th>\
              <th class=\"num\">Credits left (USD)</th><th class=\"num\">Spent (USD)</th>\
              <th class=\"num\">Reserved (USD)</th><th>Budget (USD)</th></tr></thead><tbody>",
    );
    // The template project holds no credits of anyone's.
    for project in projects.iter().filter(|p| *p != TEMPLATE_PROJECT) {
        let typed = state.ledger.account(project).await?;
        let account = serde_json::to_value(&typed).unwrap_or(Value::Null);
        let reserved: nodus_core::Usd = typed
            .reserved
            .values()
            .fold(nodus_core::Usd::ZERO, |sum, amount| {
                sum.saturating_add(*amount)
            });
        let budgets = state
            .store
            .list(project, Kind::Budget, &Selector::default())
            .await?;
        html.raw("<tr data-project=\"")
            .text(project)
            .raw("\"><td>")
            .text(project)
            .raw("</td><td class=\"num balance\">")
            .text(show(&account["balanceUSD"]))
            .raw("</td><td class=\"num spent\">")
            .text(show(&account["spentUSD"]))
            .raw("</td><td class=\"num\">")
            .text(reserved)
            .raw("</td><td class=\"budget\">");
        if budgets.is_empty() {
            html.raw("<span class=\"muted\">none</span>");
        }
        for (i, budget) in budgets.iter().enumerate() {
            if i > 0 {
                html.raw("; ");
            }
            html.text(show(&budget.document["metadata"]["name"]))
                .raw(": at most ")
                .text(show(&budget.document["spec"]["maxSpendUSD"]));
        }
        html.raw("</td></tr>");
    }
    html.raw("</tbody></table></div>");
    Ok(Page::live(html))
}

//! The console's view of runs as jobs: a run's results (with download links that use the
//! console's session), the environment it took when it was created (Secrets by name, key and
//! version only: a snapshot holds no value), its post-run action and its outcome, and the
//! page that lists a project's AgentEnvironments.

use nodus_core::resource::AgentEnvironmentSpec;
use nodus_core::store::Selector;
use serde_json::Value;

use super::html::{Html, percent_encode};
use super::pages::Page;
use crate::error::ApiError;
use crate::state::AppState;

/// A size in bytes as people read it: `512 B`, `1.5 KiB`, `3.2 MiB` (one decimal, rounded
/// down; the exact count is in the cell's `data-bytes`).
pub fn size(bytes: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut unit = 0;
    let mut scaled = bytes;
    // Tenths of the unit, in integers.
    let mut tenths = bytes.saturating_mul(10) / 1024;
    while tenths >= 10 * 1024 && unit + 1 < UNITS.len() {
        scaled /= 1024;
        tenths = scaled * 10 / 1024;
        unit += 1;
    }
    format!("{}.{} {}", tenths / 10, tenths % 10, UNITS[unit])
}

/// The run page's job sections: results, environment, post-run action.
pub async fn run_sections(
    html: &mut Html,
    state: &AppState,
    project: &str,
    name: &str,
    run: &Value,
    steps: &[Value],
    finished: bool,
) -> Result<(), ApiError> {
    let telemetry = run["spec"]["autoTelemetry"] != Value::Bool(false);
    results(html, state, project, name, finished, telemetry).await?;
    environment(html, &run["status"]["snapshot"]["environment"]);
    post_run_action(html, run, steps);
    Ok(())
}

/// Each result with its size and a link that downloads it through the console; first, a link
/// to the run's trajectory, or why it has none.
async fn results(
    html: &mut Html,
    state: &AppState,
    project: &str,
    name: &str,
    finished: bool,
    telemetry: bool,
) -> Result<(), ApiError> {
    html.raw("<h2>Results</h2>");
    if !telemetry {
        html.raw(
            "<p class=\"muted\" id=\"trajectory-none\">No trajectory: this run was created \
             with autoTelemetry false.</p>",
        );
    }
    if !finished {
        html.raw(
            "<p class=\"muted\" id=\"results-none\">The results are kept when the run \
             finishes.</p>",
        );
        return Ok(());
    }
    let items = state.engine.results(project, name).await?;
    if items.is_empty() {
        html.raw("<p class=\"muted\" id=\"results-none\">This run kept no results.</p>");
        return Ok(());
    }
    if items.iter().any(|item| item.name == "trajectory") {
        html.raw("<p id=\"trajectory-link\"><a download href=\"/console/p/")
            .segment(project)
            .raw("/runs/")
            .segment(name)
            .raw(
                "/results/trajectory\">Trajectory</a> <span class=\"muted\">(ATIF JSON: every \
                 prompt, model call and command, with tokens and cost)</span></p>",
            );
    }
    html.raw(
        "<div class=\"table\"><table id=\"results\"><thead><tr><th>Result</th><th>File</th>\
         <th>Type</th><th class=\"num\">Size</th></tr></thead><tbody>",
    );
    for item in &items {
        html.raw("<tr data-result=\"")
            .text(&item.name)
            .raw("\"><td>")
            .text(&item.name)
            .raw("</td><td><a class=\"download\" download href=\"/console/p/")
            .segment(project)
            .raw("/runs/")
            .segment(name)
            .raw("/results/")
            .segment(&item.name)
            .raw("\">")
            .text(&item.file_name)
            .raw("</a></td><td class=\"muted\">")
            .text(&item.content_type)
            .raw("</td><td class=\"num size\" data-bytes=\"")
            .text(item.bytes)
            .raw("\">")
            .text(size(item.bytes))
            .raw("</td></tr>");
    }
    html.raw("</tbody></table></div>");
    Ok(())
}

/// One environment variable's source: its plain value, or the Secret's name and key (and
/// version, in a run's snapshot) — never a Secret's value, which no spec or snapshot holds.
fn variable_row(html: &mut Html, variable: &Value, versions: &Value) {
    let name = variable["name"].as_str().unwrap_or_default();
    html.raw("<tr data-variable=\"")
        .text(name)
        .raw("\"><td class=\"variable\">")
        .text(name)
        .raw("</td>");
    let secret = &variable["valueFrom"]["secretKeyRef"];
    if secret.is_object() {
        let secret_name = secret["name"].as_str().unwrap_or_default();
        html.raw("<td class=\"source secret\">Secret <strong>")
            .text(secret_name)
            .raw("</strong>, key <strong>")
            .text(secret["key"].as_str().unwrap_or_default())
            .raw("</strong>");
        let version = versions
            .as_array()
            .into_iter()
            .flatten()
            .find(|v| v["name"].as_str() == Some(secret_name))
            .and_then(|v| v["resourceVersion"].as_str());
        if let Some(version) = version {
            html.raw(" <span class=\"muted\">(version ")
                .text(version)
                .raw(")</span>");
        }
        html.raw("</td>");
    } else {
        html.raw("<td class=\"source value\"><code>")
            .text(variable["value"].as_str().unwrap_or_default())
            .raw("</code></td>");
    }
    html.raw("</tr>");
}

/// An environment spec's variables and compute.
fn environment_spec(html: &mut Html, id: Option<&'static str>, spec: &Value, versions: &Value) {
    let variables = spec["env"].as_array().cloned().unwrap_or_default();
    if variables.is_empty() {
        html.raw("<p class=\"muted\">No variables.</p>");
    } else {
        html.raw("<div class=\"table\"><table class=\"variables\"");
        if let Some(id) = id {
            html.raw(" id=\"").raw(id).raw("\"");
        }
        html.raw("><thead><tr><th>Variable</th><th>Value or source</th></tr></thead><tbody>");
        for variable in &variables {
            variable_row(html, variable, versions);
        }
        html.raw("</tbody></table></div>");
    }
    let compute = spec["compute"].as_object().filter(|c| !c.is_empty());
    html.raw("<p class=\"compute\">Compute: ");
    match compute {
        None => {
            html.raw("<span class=\"muted\">the server's defaults</span>");
        }
        Some(compute) => {
            for (i, (key, value)) in compute.iter().enumerate() {
                if i > 0 {
                    html.raw(", ");
                }
                html.raw("<code>")
                    .text(key)
                    .raw("</code> ")
                    .text(show(value));
            }
        }
    }
    html.raw("</p>");
}

fn show(value: &Value) -> String {
    match value {
        Value::Null => "—".to_string(),
        Value::String(text) => text.clone(),
        other => other.to_string(),
    }
}

/// The environment the run took when it was created.
fn environment(html: &mut Html, snapshot: &Value) {
    html.raw("<h2>Environment</h2>");
    if snapshot.is_null() {
        html.raw("<p class=\"muted\" id=\"environment-none\">No environment.</p>");
        return;
    }
    html.raw("<dl class=\"facts\" id=\"environment\"><dt>From</dt><dd>");
    match snapshot["environmentRef"].as_str() {
        Some(reference) => {
            // `project/name`: a link to it on the Environments page (it may have changed
            // since, or be gone; the run keeps what it took).
            match reference.split_once('/') {
                Some((project, name)) => {
                    html.raw("<a id=\"environment-link\" href=\"/console/p/")
                        .segment(project)
                        .raw("/environments#environment-")
                        .segment(name)
                        .raw("\">")
                        .text(reference)
                        .raw("</a>");
                }
                None => {
                    html.text(reference);
                }
            }
            if let Some(revision) = snapshot["environmentRevision"].as_str() {
                html.raw(" <span class=\"muted\">(version ")
                    .text(revision)
                    .raw(")</span>");
            }
        }
        None => {
            html.raw("written inline in the run");
        }
    }
    html.raw("</dd></dl>");
    environment_spec(
        html,
        Some("environment-variables"),
        &snapshot["spec"],
        &snapshot["secrets"],
    );
}

/// An action's config as shown: a `headers` map shows its names only (a header may carry a
/// credential), everything else as written.
fn shown_config(config: &Value) -> String {
    let mut config = config.clone();
    if let Some(headers) = config.get_mut("headers").and_then(Value::as_object_mut) {
        for value in headers.values_mut() {
            *value = Value::String("…".to_string());
        }
    }
    serde_json::to_string_pretty(&config).unwrap_or_default()
}

/// The post-run action chosen at creation and how it went (its journaled steps).
fn post_run_action(html: &mut Html, run: &Value, steps: &[Value]) {
    html.raw("<h2>Post-run action</h2>");
    let action = &run["status"]["snapshot"]["postRunAction"];
    let Some(kind) = action["kind"].as_str() else {
        html.raw(
            "<p class=\"muted\" id=\"post-run-action\"><code>agents.noop</code>: nothing is done \
             after the run.</p>",
        );
        return;
    };
    html.raw("<dl class=\"facts\" id=\"post-run-action\"><dt>Kind</dt><dd id=\"action-kind\">")
        .text(kind)
        .raw("</dd><dt>Config</dt><dd><pre id=\"action-config\">")
        .text(shown_config(&action["config"]))
        .raw("</pre></dd><dt>Outcome</dt><dd id=\"action-outcome\">");
    let attempts: Vec<&Value> = steps
        .iter()
        .filter(|step| step["kind"] == "PostRunAction")
        .collect();
    match attempts.last() {
        None if super::pages::is_finished(run) => {
            html.raw("not carried out (the run did not get that far)");
        }
        None => {
            html.raw("not yet: it runs once the agent has answered");
        }
        Some(step) => {
            html.raw("<span class=\"state\">")
                .text(show(&step["state"]))
                .raw("</span>: ")
                .text(show(&step["summary"]));
            if run["status"]["reason"] == "PostRunActionFailed" {
                html.raw(" — the run failed because of it; see its <code>error</code> result");
            }
        }
    }
    html.raw("</dd></dl>");
}

/// AgentEnvironments: each with its variables (plain values, Secrets by name and key) and
/// compute.
pub async fn environments(state: &AppState, project: &str) -> Result<Page, ApiError> {
    let environments = state
        .engine
        .list::<AgentEnvironmentSpec>(project, &Selector::default())
        .await?;
    let mut html = Html::new();
    html.raw("<h1>Environments</h1>");
    if environments.is_empty() {
        html.raw(
            "<p class=\"muted\" id=\"environments-none\">No AgentEnvironments in this project \
             yet.</p>",
        );
        return Ok(Page::live(html));
    }
    for environment in &environments {
        let document = serde_json::to_value(environment).unwrap_or(Value::Null);
        let name = document["metadata"]["name"].as_str().unwrap_or_default();
        html.raw("<section class=\"environment\" data-environment=\"")
            .text(name)
            .raw("\"><h2 id=\"environment-")
            .text(percent_encode(name))
            .raw("\">")
            .text(name)
            .raw(" <span class=\"muted\">(version ")
            .text(show(&document["metadata"]["resourceVersion"]))
            .raw(")</span></h2>");
        environment_spec(&mut html, None, &document["spec"], &Value::Null);
        html.raw("</section>");
    }
    Ok(Page::live(html))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_as_people_read_them() {
        assert_eq!(size(0), "0 B");
        assert_eq!(size(1023), "1023 B");
        assert_eq!(size(1024), "1.0 KiB");
        assert_eq!(size(1536), "1.5 KiB");
        assert_eq!(size(10 * 1024 * 1024 - 1), "9.9 MiB");
        assert_eq!(size(16 * 1024 * 1024), "16.0 MiB");
    }

    #[test]
    fn header_values_of_a_config_are_hidden() {
        let shown = shown_config(&serde_json::json!({
            "url": "https://hooks.example/x",
            "headers": {"Authorization": "Bearer abc123"}
        }));
        assert!(shown.contains("https://hooks.example/x"));
        assert!(shown.contains("Authorization"));
        assert!(!shown.contains("abc123"));
    }
}

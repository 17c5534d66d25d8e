//! Lists that page and filter, as the REST API does: `limit` and `continue` (the API's signed
//! tokens over the store's creation-order keyset, so a page of a 10,000-run group reads one
//! page of documents), and the API's selectors built from a form of phase, agent, label and
//! group. The run list page, the Agents page and a group's runs use them.

use std::num::NonZeroUsize;

use nodus_core::lifecycle::RunPhase;
use nodus_core::resource::Kind;
use nodus_core::store::Selector;
use nodus_core::validate::Invalid;
use serde::Deserialize;
use serde_json::Value;

use super::html::{Html, percent_encode};
use super::pages::{Page, runs_table, show};
use crate::api::selectors::ListQuery;
use crate::error::ApiError;
use crate::paging::{ListOf, limit as parse_limit};
use crate::state::AppState;

/// Rows of a page when the query does not say.
pub const DEFAULT_LIMIT: usize = 100;

/// The query of a list page: the filters, and where the page starts.
#[derive(Debug, Default, Clone, Deserialize)]
pub struct ListFilter {
    /// `status.phase`.
    #[serde(default)]
    pub phase: Option<String>,
    /// `spec.agent`.
    #[serde(default)]
    pub agent: Option<String>,
    /// A label, `key=value`.
    #[serde(default)]
    pub label: Option<String>,
    /// `spec.group`.
    #[serde(default)]
    pub group: Option<String>,
    /// Rows per page, 1 to the API's largest limit.
    #[serde(default)]
    pub limit: Option<String>,
    /// The token of the previous page's next link.
    #[serde(default, rename = "continue")]
    pub continue_token: Option<String>,
}

fn given(value: &Option<String>) -> Option<&str> {
    value.as_deref().map(str::trim).filter(|v| !v.is_empty())
}

impl ListFilter {
    /// The API's selector of these filters (its rules, its errors).
    pub fn selector(&self) -> Result<Selector, Invalid> {
        let fields: Vec<String> = [
            ("status.phase", &self.phase),
            ("spec.agent", &self.agent),
            ("spec.group", &self.group),
        ]
        .iter()
        .filter_map(|(path, value)| given(value).map(|v| format!("{path}={v}")))
        .collect();
        if let Some(label) = given(&self.label)
            && !label.contains('=')
        {
            return Err(Invalid::new(
                "label",
                "is key=value",
                nodus_core::validate::shown(label),
            ));
        }
        for (field, value) in [
            ("phase", &self.phase),
            ("agent", &self.agent),
            ("group", &self.group),
        ] {
            if given(value).is_some_and(|v| v.contains(',') || v.contains('=')) {
                return Err(Invalid::new(
                    field,
                    "is one value, without , or =",
                    nodus_core::validate::shown(given(value).unwrap_or_default()),
                ));
            }
        }
        ListQuery {
            label_selector: given(&self.label).map(str::to_string),
            field_selector: Some(fields.join(",")),
            ..ListQuery::default()
        }
        .selector()
    }

    /// The rows per page.
    pub fn limit(&self) -> Result<NonZeroUsize, Invalid> {
        match given(&self.limit) {
            Some(text) => parse_limit(text),
            None => Ok(NonZeroUsize::new(DEFAULT_LIMIT).unwrap_or(NonZeroUsize::MIN)),
        }
    }

    /// The query string of these filters (without `continue`), for links.
    pub fn query(&self) -> String {
        [
            ("phase", &self.phase),
            ("agent", &self.agent),
            ("label", &self.label),
            ("group", &self.group),
            ("limit", &self.limit),
        ]
        .iter()
        .filter_map(|(name, value)| given(value).map(|v| format!("{name}={}", percent_encode(v))))
        .collect::<Vec<_>>()
        .join("&")
    }
}

/// One page of a list: its documents (as the API shows them) and the next page's token.
pub struct Listed {
    /// The documents, in creation order.
    pub items: Vec<Value>,
    /// The `continue` token of the next page, when more remain.
    pub next: Option<String>,
}

/// A page of `kind` in `project` matching `selector`, as the API's `limit`/`continue` answer it.
pub async fn page(
    state: &AppState,
    project: &str,
    kind: Kind,
    selector: &Selector,
    filter: &ListFilter,
) -> Result<Listed, ApiError> {
    let limit = filter.limit().map_err(ApiError::bad_parameter)?;
    let list = ListOf {
        project,
        kind,
        selector,
    };
    let key = state.cipher.continue_key();
    let after = match given(&filter.continue_token) {
        Some(token) => Some(
            key.position(&list, token)
                .map_err(ApiError::bad_parameter)?,
        ),
        None => None,
    };
    let (items, next) = state
        .engine
        .list_documents_page(project, kind, selector, after, limit)
        .await?;
    Ok(Listed {
        items,
        next: next.map(|position| key.token(&list, position)),
    })
}

/// The links under a page: to the first page, and to the next when there is one.
pub fn pager(html: &mut Html, path: &str, filter: &ListFilter, next: Option<&str>) {
    let query = filter.query();
    let joined = |extra: &str| match (query.is_empty(), extra.is_empty()) {
        (true, true) => String::new(),
        (true, false) => format!("?{extra}"),
        (false, true) => format!("?{query}"),
        (false, false) => format!("?{query}&{extra}"),
    };
    html.raw("<nav class=\"pager\" aria-label=\"Pages\">");
    if given(&filter.continue_token).is_some() {
        html.raw("<a id=\"first-page\" href=\"")
            .text(path)
            .text(joined(""))
            .raw("\">First page</a>");
    }
    if let Some(next) = next {
        html.raw("<a id=\"next-page\" rel=\"next\" href=\"")
            .text(path)
            .text(joined(&format!("continue={}", percent_encode(next))))
            .raw("\">Next page</a>");
    } else {
        html.raw("<span class=\"muted\" id=\"last-page\">Last page</span>");
    }
    html.raw("</nav>");
}

/// A text field of the filter form.
fn field(html: &mut Html, name: &'static str, label: &'static str, value: &Option<String>) {
    html.raw("<label>")
        .raw(label)
        .raw("<input type=\"text\" name=\"")
        .raw(name)
        .raw("\" id=\"filter-")
        .raw(name)
        .raw("\" value=\"")
        .text(given(value).unwrap_or_default())
        .raw("\"></label>");
}

/// The phases a run can be in, each once, in the order a run goes through them: the
/// filter's choices.
fn phases() -> Vec<&'static str> {
    let mut names: Vec<&'static str> = RunPhase::all().into_iter().map(RunPhase::name).collect();
    names.dedup();
    names
}

/// The filter form: a GET form (nothing changes, so no CSRF token), keyboard-usable.
fn filters(html: &mut Html, path: &str, filter: &ListFilter) {
    html.raw("<form method=\"get\" class=\"filters\" id=\"filters\" action=\"")
        .text(path)
        .raw("\"><label>Phase<select name=\"phase\" id=\"filter-phase\"><option value=\"\">any</option>");
    for phase in phases() {
        html.raw("<option");
        if given(&filter.phase) == Some(phase) {
            html.raw(" selected");
        }
        html.raw(">").raw(phase).raw("</option>");
    }
    html.raw("</select></label>");
    field(html, "agent", "Agent", &filter.agent);
    field(html, "label", "Label (key=value)", &filter.label);
    field(html, "group", "Group", &filter.group);
    field(html, "limit", "Per page", &filter.limit);
    html.raw("<button type=\"submit\" id=\"filter\">Filter</button></form>");
}

/// The run list: the project's runs in creation order, a page at a time, filtered.
pub async fn runs(state: &AppState, project: &str, filter: &ListFilter) -> Result<Page, ApiError> {
    let selector = filter.selector().map_err(ApiError::bad_parameter)?;
    let listed = page(state, project, Kind::AgentRun, &selector, filter).await?;
    let path = format!("/console/p/{}/runs", percent_encode(project));
    let mut html = Html::new();
    html.raw("<h1>Runs</h1>");
    filters(&mut html, &path, filter);
    if listed.items.is_empty() {
        html.raw("<p class=\"muted\" id=\"runs-none\">No runs match.</p>");
    } else {
        let rows: Vec<&Value> = listed.items.iter().collect();
        runs_table(&mut html, project, &rows, given(&filter.group).is_some());
    }
    pager(&mut html, &path, filter, listed.next.as_deref());
    Ok(Page::live(html))
}

/// Agents: a page of the project's agents, each with its model and a link to its runs.
pub async fn agents(
    state: &AppState,
    project: &str,
    filter: &ListFilter,
) -> Result<Page, ApiError> {
    let listed = page(state, project, Kind::Agent, &Selector::default(), filter).await?;
    let path = format!("/console/p/{}/agents", percent_encode(project));
    let mut html = Html::new();
    html.raw("<h1>Agents</h1>");
    if listed.items.is_empty() && given(&filter.continue_token).is_none() {
        html.raw("<p class=\"muted\">No agents in this project yet.</p>");
    } else {
        html.raw(
            "<div class=\"table\"><table id=\"agents\"><thead><tr><th>Agent</th>\
             <th>Model</th><th class=\"num\">Per-run cap (USD)</th><th>Runs</th>\
             <th class=\"hide-narrow\">Created</th></tr></thead><tbody>",
        );
        for agent in &listed.items {
            let name = agent["metadata"]["name"].as_str().unwrap_or_default();
            let model = &agent["spec"]["model"];
            let families: Vec<&str> = model["families"]
                .as_array()
                .map(|f| f.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            let model_text = match (model["model"].as_str(), families.is_empty()) {
                (Some(fixed), _) => fixed.to_string(),
                (None, false) => format!("routed: {}", families.join(", ")),
                (None, true) => show(&model["access"]),
            };
            html.raw("<tr data-agent=\"")
                .text(name)
                .raw("\"><td>")
                .text(name)
                .raw("</td><td class=\"model\">")
                .text(model_text)
                .raw("</td><td class=\"num\">")
                .text(show(&agent["spec"]["perRunMaxCostUSD"]))
                .raw("</td><td><a class=\"agent-runs\" href=\"/console/p/")
                .segment(project)
                .raw("/runs?agent=")
                .segment(name)
                .raw("\">Runs of ")
                .text(name)
                .raw("</a></td><td class=\"hide-narrow muted\">")
                .text(show(&agent["metadata"]["creationTimestamp"]))
                .raw("</td></tr>");
        }
        html.raw("</tbody></table></div>");
    }
    pager(&mut html, &path, filter, listed.next.as_deref());
    html.raw("<p><a id=\"all-runs\" href=\"/console/p/")
        .segment(project)
        .raw("/runs\">All runs of the project</a></p>");
    Ok(Page::live(html))
}

/// Query parameters of a page as pairs (for tests of links).
#[cfg(test)]
fn pairs(query: &str) -> std::collections::BTreeMap<String, String> {
    query
        .split('&')
        .filter_map(|pair| pair.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn filter(phase: &str, agent: &str, label: &str, group: &str) -> ListFilter {
        let some = |v: &str| Some(v.to_string());
        ListFilter {
            phase: some(phase),
            agent: some(agent),
            label: some(label),
            group: some(group),
            ..ListFilter::default()
        }
    }

    #[test]
    fn the_phase_filter_offers_every_phase_once_in_the_order_a_run_goes() {
        assert_eq!(
            phases(),
            [
                "Pending",
                "Running",
                "Waiting",
                "NeedsResolution",
                "Succeeded",
                "Failed",
                "Cancelled"
            ]
        );
    }

    #[test]
    fn filters_become_the_apis_selector() {
        let selector = filter("Running", "helper", "team=a", "g1")
            .selector()
            .expect("valid");
        assert_eq!(selector.fields["status.phase"], "Running");
        assert_eq!(selector.fields["spec.agent"], "helper");
        assert_eq!(selector.fields["spec.group"], "g1");
        assert_eq!(selector.labels["team"], "a");
        let empty = filter("", " ", "", "").selector().expect("nothing chosen");
        assert!(empty.fields.is_empty() && empty.labels.is_empty());
    }

    #[test]
    fn bad_filters_name_the_field_and_the_value() {
        let label = filter("", "", "team", "").selector().expect_err("no =");
        assert_eq!(
            (label.field.as_str(), label.rule.as_str()),
            ("label", "is key=value")
        );
        let agent = filter("", "a,spec.group=x", "", "")
            .selector()
            .expect_err("one value");
        assert_eq!(agent.field, "agent");
        let limit = ListFilter {
            limit: Some("0".to_string()),
            ..ListFilter::default()
        };
        assert_eq!(limit.limit().expect_err("at least 1").field, "limit");
        assert_eq!(
            ListFilter::default().limit().expect("default").get(),
            DEFAULT_LIMIT
        );
    }

    #[test]
    fn links_keep_the_filters_and_encode_them() {
        let mut chosen = filter("Failed", "a b", "team=x&y", "");
        chosen.limit = Some("10".to_string());
        let query = chosen.query();
        assert_eq!(
            pairs(&query),
            BTreeMap::from([
                ("phase".to_string(), "Failed".to_string()),
                ("agent".to_string(), "a%20b".to_string()),
                ("label".to_string(), "team%3Dx%26y".to_string()),
                ("limit".to_string(), "10".to_string()),
            ])
        );
        let mut html = Html::new();
        pager(&mut html, "/console/p/d/runs", &chosen, Some("1f.abc"));
        let html = html.into_string();
        assert!(html.contains("href=\"/console/p/d/runs?phase=Failed&amp;agent=a%20b"));
        assert!(html.contains("&amp;continue=1f.abc\""));
        assert!(
            !html.contains("first-page"),
            "the first page has no link to itself"
        );
    }
}

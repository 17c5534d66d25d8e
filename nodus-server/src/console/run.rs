//! The run page: facts and actions, then its sections in [`SECTIONS`] order — the
//! transcript, the timeline, the turns, the answer and input, the results and environment,
//! the steps, the forks and the messages — and the message form below the live part. A new
//! section (a run's egress log) is one more [`Section`] and one more arm in [`section`].

use jiff::Timestamp;
use nodus_core::engine::StepView;
use nodus_core::journal::Step;
use nodus_core::resource::AgentRunSpec;
use nodus_core::store::InboxMessage;
use serde_json::Value;

use super::html::{Html, percent_encode};
use super::pages::{
    Page, action_form, agent_label, duration, is_finished, phase_class, show, takes_messages,
    takes_resolution, to_values,
};
use super::{timeline, transcript};
use crate::error::ApiError;
use crate::state::AppState;

/// The sections of a run's page, top to bottom.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Section {
    /// The conversation from the journal.
    Transcript,
    /// The steps on a time axis.
    Timeline,
    /// Each turn's model, how it was chosen, cost and tokens.
    Turns,
    /// The answer and the input.
    Answer,
    /// Results (the trajectory first), environment, post-run action.
    Jobs,
    /// The steps as a table, with fork-from-here.
    Steps,
    /// Runs forked from this one.
    Forks,
    /// The connections its sandbox asked the egress proxy for.
    Egress,
    /// Messages sent to the run.
    Messages,
}

/// The order of the sections.
pub const SECTIONS: [Section; 9] = [
    Section::Transcript,
    Section::Timeline,
    Section::Turns,
    Section::Answer,
    Section::Jobs,
    Section::Steps,
    Section::Forks,
    Section::Egress,
    Section::Messages,
];

/// What the sections are written from: read once per page.
struct RunView<'a> {
    project: &'a str,
    name: &'a str,
    csrf: &'a str,
    /// The run's page.
    base: String,
    run: Value,
    journal: Vec<Step>,
    views: Vec<StepView>,
    inbox: Vec<InboxMessage>,
    answer: Option<String>,
    now: transcript::RunNow,
}

/// The runs forked from `name`, with their steps and phases, when there are any.
async fn forks(
    html: &mut Html,
    state: &AppState,
    project: &str,
    name: &str,
) -> Result<(), ApiError> {
    let selector = nodus_core::store::Selector {
        fields: [("spec.forkOf.run".to_string(), name.to_string())].into(),
        ..nodus_core::store::Selector::default()
    };
    let forks = state
        .store
        .list_sparse(
            project,
            nodus_core::resource::Kind::AgentRun,
            &selector,
            &["metadata.name", "spec.forkOf.step", "status.phase"],
        )
        .await?;
    if forks.is_empty() {
        html.raw("<p class=\"muted\">No runs forked from this one.</p>");
        return Ok(());
    }
    html.raw(
        "<div class=\"table\"><table id=\"forks\"><thead><tr><th>Run</th>\
         <th>From step</th><th>Phase</th></tr></thead><tbody>",
    );
    for fork in &forks {
        let document = &fork.document;
        let fork_name = show(&document["metadata"]["name"]);
        html.raw("<tr><td><a href=\"/console/p/")
            .segment(project)
            .raw("/runs/")
            .segment(&fork_name)
            .raw("\">")
            .text(&fork_name)
            .raw("</a></td><td>")
            .text(show(&document["spec"]["forkOf"]["step"]))
            .raw("</td><td>")
            .text(show(&document["status"]["phase"]))
            .raw("</td></tr>");
    }
    html.raw("</tbody></table></div>");
    Ok(())
}

/// A run: facts, actions and the [`SECTIONS`]; the message form below the live part.
pub async fn run(
    state: &AppState,
    project: &str,
    name: &str,
    csrf: &str,
) -> Result<Page, ApiError> {
    let object = state.engine.get::<AgentRunSpec>(project, name).await?;
    let answer = state.engine.answer(project, name).await?;
    let views = state.engine.steps(project, name).await?;
    let journal = state.engine.journal(project, name).await?;
    let inbox = match object.metadata.uid.as_deref() {
        Some(uid) => state.store.inbox(uid).await?,
        None => Vec::new(),
    };
    let now = transcript::RunNow::of(&object.status);
    let view = RunView {
        project,
        name,
        csrf,
        base: format!(
            "/console/p/{}/runs/{}",
            percent_encode(project),
            percent_encode(name)
        ),
        run: serde_json::to_value(&object).unwrap_or(Value::Null),
        journal,
        views,
        inbox,
        answer,
        now,
    };
    let mut html = Html::new();
    facts_and_actions(&mut html, &view);
    for part in SECTIONS {
        section(&mut html, state, &view, part).await?;
    }
    let mut after = Html::new();
    if takes_messages(&view.run) {
        after.raw("<h2>Send a message</h2>");
        action_form(&mut after, &view.base, "message", csrf);
        after.raw(
            "<p><label for=\"payload\">Message</label></p>\
             <p><textarea id=\"payload\" name=\"payload\" required></textarea></p>\
             <p><button type=\"submit\" id=\"send\">Send</button></p></form>",
        );
    }
    // A finished run changes no more: its page does not listen, and a page that watched it
    // finish stops listening (`data-final`), so that its results are not read again on
    // every change of the project.
    let finished = is_finished(&view.run);
    if finished {
        html.raw("<p hidden data-final></p>");
    }
    Ok(Page {
        live: html,
        after,
        is_live: !finished,
    })
}

fn facts_and_actions(html: &mut Html, view: &RunView<'_>) {
    let (run, base, csrf) = (&view.run, &view.base, view.csrf);
    let status = &run["status"];
    html.raw("<h1>Run ")
        .text(view.name)
        .raw("</h1><dl class=\"facts\"><dt>Phase</dt><dd id=\"phase\" class=\"phase phase-")
        .text(phase_class(&status["phase"]))
        .raw("\">")
        .text(show(&status["phase"]))
        .raw("</dd>");
    let agent = Value::String(agent_label(&run["spec"]["agent"]));
    for (label, value) in [
        ("Reason", &status["reason"]),
        ("Message", &status["message"]),
        ("Agent", &agent),
        ("Group", &run["spec"]["group"]),
        ("Keep alive", &run["spec"]["keepAlive"]),
        ("Started", &status["startTime"]),
        ("Completed", &status["completionTime"]),
    ] {
        if value.is_null() {
            continue;
        }
        html.raw("<dt>")
            .raw(label)
            .raw("</dt><dd>")
            .text(show(value))
            .raw("</dd>");
    }
    html.raw("<dt>Cost (USD)</dt><dd id=\"cost\">")
        .text(show(&status["cost"]["totalUSD"]));
    if !status["cost"]["limitUSD"].is_null() {
        html.raw(" of ").text(show(&status["cost"]["limitUSD"]));
    }
    html.raw("</dd></dl><nav class=\"sections\" aria-label=\"Sections\"><ul>");
    for part in SECTIONS {
        let (id, title) = heading(part);
        html.raw("<li><a href=\"#")
            .raw(id)
            .raw("-section\">")
            .raw(title)
            .raw("</a></li>");
    }
    html.raw("</ul></nav><div class=\"actions\">");
    if !is_finished(run) {
        action_form(html, base, "cancel", csrf);
        html.raw(
            "<button type=\"submit\" class=\"danger\" id=\"cancel\">Cancel run</button></form>",
        );
        if run["spec"]["keepAlive"] == Value::Bool(true) {
            action_form(html, base, "close", csrf);
            html.raw("<button type=\"submit\" id=\"close\">Close conversation</button></form>");
        }
    }
    if takes_resolution(run) {
        for (action, label) in [
            ("retry", "Resolve: retry the step"),
            ("recordFailed", "Resolve: record it failed"),
            ("cancel", "Resolve: cancel the run"),
        ] {
            action_form(html, base, "resolve", csrf);
            html.raw("<input type=\"hidden\" name=\"action\" value=\"")
                .raw(action)
                .raw("\"><button type=\"submit\" id=\"resolve-")
                .raw(action)
                .raw("\">")
                .raw(label)
                .raw("</button></form>");
        }
    }
    html.raw("</div>");
}

/// A section's anchor and heading.
fn heading(part: Section) -> (&'static str, &'static str) {
    match part {
        Section::Transcript => ("transcript", "Transcript"),
        Section::Timeline => ("timeline", "Timeline"),
        Section::Turns => ("turns", "Turns"),
        Section::Answer => ("answer", "Answer"),
        Section::Jobs => ("results", "Results"),
        Section::Steps => ("steps", "Steps"),
        Section::Forks => ("forks", "Forks"),
        Section::Egress => ("egress", "Egress"),
        Section::Messages => ("messages", "Messages"),
    }
}

/// Whether the step `seq` can be forked from: a finished run's command step with a snapshot.
fn forkable(view: &RunView<'_>, step: &StepView) -> bool {
    is_finished(&view.run) && step.snapshot.as_ref().is_some_and(|s| s.forkable)
}

/// One section, in a `<section>` whose heading the section list links to.
async fn section(
    html: &mut Html,
    state: &AppState,
    view: &RunView<'_>,
    part: Section,
) -> Result<(), ApiError> {
    let (id, title) = heading(part);
    html.raw("<section id=\"").raw(id).raw("-section\">");
    // The results part writes its own headings (results, environment, post-run action).
    if part != Section::Jobs {
        html.raw("<h2>").raw(title).raw("</h2>");
    }
    let (run, base, csrf) = (&view.run, &view.base, view.csrf);
    match part {
        Section::Transcript => {
            let system = run["status"]["snapshot"]["agent"]["system"].as_str();
            let input = run["spec"]["input"].as_str().unwrap_or_default();
            let entries = transcript::build(&view.journal, view.now, system, input, &view.inbox);
            let forks: std::collections::BTreeSet<u32> = view
                .views
                .iter()
                .filter(|step| forkable(view, step))
                .map(|step| step.seq)
                .collect();
            transcript::render(html, &entries, base, &forks, csrf);
        }
        Section::Timeline => timeline::render(html, &view.views, Timestamp::now(), base),
        Section::Turns => turns(html, run),
        Section::Answer => {
            match &view.answer {
                Some(answer) => {
                    html.raw("<pre id=\"answer\">").text(answer).raw("</pre>");
                }
                None => {
                    html.raw("<p class=\"muted\" id=\"answer-none\">No answer yet.</p>");
                }
            }
            if let Some(input) = run["spec"]["input"].as_str() {
                html.raw("<h3>Input</h3><pre id=\"input\">")
                    .text(input)
                    .raw("</pre>");
            }
        }
        Section::Jobs => {
            let steps = to_values(&view.views);
            super::jobs::run_sections(
                html,
                state,
                view.project,
                view.name,
                run,
                &steps,
                is_finished(run),
            )
            .await?;
        }
        Section::Steps => steps(html, view),
        Section::Forks => forks(html, state, view.project, view.name).await?,
        Section::Egress => super::egress::section(html, state, run).await?,
        Section::Messages => messages(html, &view.inbox),
    }
    html.raw("</section>");
    Ok(())
}

fn turns(html: &mut Html, run: &Value) {
    html.raw(
        "<div class=\"table\"><table id=\"turns\"><thead><tr><th>#</th>\
         <th>Model</th><th>Chosen by</th><th class=\"num\">Cost (USD)</th>\
         <th class=\"num hide-narrow\">Tokens in / out</th><th class=\"num hide-narrow\">Commands</th>\
         </tr></thead><tbody>",
    );
    for (i, turn) in run["status"]["turns"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
    {
        html.raw("<tr><td>")
            .text(i + 1)
            .raw("</td><td class=\"model\">")
            .text(show(&turn["model"]))
            .raw("</td><td class=\"chosen-by\">")
            .text(show(&turn["chosenBy"]))
            .raw("</td><td class=\"num cost\">")
            .text(show(&turn["costUSD"]))
            .raw("</td><td class=\"num hide-narrow\">")
            .text(show(&turn["inputTokens"]))
            .raw(" / ")
            .text(show(&turn["outputTokens"]))
            .raw("</td><td class=\"num hide-narrow\">")
            .text(show(&turn["commands"]))
            .raw("</td></tr>");
    }
    html.raw("</tbody></table></div>");
}

fn steps(html: &mut Html, view: &RunView<'_>) {
    let (base, csrf) = (&view.base, view.csrf);
    html.raw(
        "<div class=\"table\"><table id=\"steps\"><thead><tr><th>#</th><th>Kind</th>\
         <th>State</th><th class=\"num\">Duration</th><th>Summary</th><th>Payload</th>\
         <th>Fork</th></tr></thead><tbody>",
    );
    for typed in &view.views {
        let step = serde_json::to_value(typed).unwrap_or(Value::Null);
        let seq = typed.seq.to_string();
        html.raw("<tr><td>")
            .text(&seq)
            .raw("</td><td>")
            .text(show(&step["kind"]))
            .raw("</td><td class=\"state\">")
            .text(show(&step["state"]))
            .raw("</td><td class=\"num\">")
            .text(duration(&step))
            .raw("</td><td class=\"summary\">")
            .text(show(&step["summary"]))
            .raw("</td><td><a href=\"")
            .text(base)
            .raw("/steps/")
            .segment(&seq)
            .raw("\">payload</a></td><td>");
        if forkable(view, typed) {
            action_form(html, base, "fork", csrf);
            html.raw("<input type=\"hidden\" name=\"atStep\" value=\"")
                .text(&seq)
                .raw("\"><button type=\"submit\" class=\"fork\">Fork from here</button></form>");
        } else if typed.inherited {
            html.raw("<span class=\"muted\">inherited</span>");
        }
        html.raw("</td></tr>");
    }
    html.raw("</tbody></table></div>");
}

fn messages(html: &mut Html, inbox: &[InboxMessage]) {
    if inbox.is_empty() {
        html.raw("<p class=\"muted\">No messages.</p>");
        return;
    }
    html.raw(
        "<div class=\"table\"><table id=\"messages\"><thead><tr><th>#</th><th>Received</th>\
         <th>Message</th></tr></thead><tbody>",
    );
    for message in inbox {
        html.raw("<tr><td>")
            .text(message.seq)
            .raw("</td><td class=\"muted\">")
            .text(message.received_at)
            .raw("</td><td><pre class=\"message\">")
            .text(&message.payload)
            .raw("</pre></td></tr>");
    }
    html.raw("</tbody></table></div>");
}

//! A run's timeline: its steps on a time axis as a server-rendered SVG, one lane per kind of
//! step (sandbox, routing, model calls, commands, messages, answers, post-run action), one
//! mark per step whose width is its duration at one scale for the whole run. Each mark is a
//! link to the step's page (keyboard-focusable) with a `<title>` that a pointer's hover shows.
//! [`layout`] places the marks (pure, table-tested); [`render`] writes the SVG.

use jiff::Timestamp;
use nodus_core::engine::StepView;
use nodus_core::journal::{StepKind, StepState};

use super::html::Html;

/// Width of the drawing area, in SVG units.
pub const WIDTH: f64 = 1000.0;
/// Left margin for the lanes' names.
const LEFT: f64 = 130.0;
/// Height of a lane.
const LANE: f64 = 22.0;
/// Height of the axis below the lanes.
const AXIS: f64 = 24.0;

/// The lanes, top to bottom.
const LANES: [(StepKind, &str); 8] = [
    (StepKind::SandboxCreation, "sandbox"),
    (StepKind::Routing, "routing"),
    (StepKind::ModelCall, "model calls"),
    (StepKind::Command, "commands"),
    (StepKind::Message, "messages"),
    (StepKind::Answer, "answers"),
    (StepKind::PostRunAction, "post-run action"),
    (StepKind::SandboxDeletion, "sandbox deletion"),
];

fn lane_of(kind: StepKind) -> usize {
    LANES.iter().position(|(k, _)| *k == kind).unwrap_or(0)
}

/// One step's mark.
#[derive(Debug, Clone, PartialEq)]
pub struct Mark {
    /// The step.
    pub seq: u32,
    /// Its lane.
    pub lane: usize,
    /// Left edge, in SVG units from the drawing area's left.
    pub x: f64,
    /// Width: the step's duration at the run's scale.
    pub width: f64,
    /// Its duration in milliseconds (to now for a step under way).
    pub millis: i64,
    /// Whether it is still under way (no finish yet).
    pub open: bool,
}

/// The marks of `steps`, on an axis from the first start to the last end (`now` for a step
/// under way); the scale is [`WIDTH`] over the whole span. Durations are milliseconds of
/// wall time; a layout, not money, so floating point is fine.
#[allow(clippy::float_arithmetic, clippy::cast_precision_loss)]
pub fn layout(steps: &[StepView], now: Timestamp) -> (Vec<Mark>, i64) {
    let Some(start) = steps.iter().map(|s| s.started_at).min() else {
        return (Vec::new(), 0);
    };
    let end_of = |s: &StepView| s.finished_at.unwrap_or(now).max(s.started_at);
    let end = steps.iter().map(end_of).max().unwrap_or(start);
    let span = i64::try_from(end.duration_since(start).as_millis())
        .unwrap_or(i64::MAX)
        .max(1);
    let scale = WIDTH / span as f64;
    let marks = steps
        .iter()
        .map(|step| {
            let offset = step.started_at.duration_since(start).as_millis();
            let millis = i64::try_from(end_of(step).duration_since(step.started_at).as_millis())
                .unwrap_or(i64::MAX);
            Mark {
                seq: step.seq,
                lane: lane_of(step.kind),
                x: offset as f64 * scale,
                width: millis as f64 * scale,
                millis,
                open: step.finished_at.is_none() && step.state == StepState::Started,
            }
        })
        .collect();
    (marks, span)
}

/// A duration as people read it.
pub fn duration(millis: i64) -> String {
    if millis < 1000 {
        format!("{millis} ms")
    } else if millis < 60_000 {
        format!("{}.{} s", millis / 1000, (millis % 1000) / 100)
    } else {
        format!("{} min {} s", millis / 60_000, (millis % 60_000) / 1000)
    }
}

fn state_class(state: StepState) -> &'static str {
    match state {
        StepState::Started => "started",
        StepState::Completed => "completed",
        StepState::Failed => "failed",
        StepState::Uncertain => "uncertain",
        StepState::Cancelled => "cancelled",
    }
}

/// The SVG of `steps`; each mark links below `base` (the run's page).
#[allow(clippy::float_arithmetic, clippy::cast_precision_loss)]
pub fn render(html: &mut Html, steps: &[StepView], now: Timestamp, base: &str) {
    let (marks, span) = layout(steps, now);
    if marks.is_empty() {
        html.raw("<p class=\"muted\" id=\"timeline-none\">No steps yet.</p>");
        return;
    }
    let height = LANE * LANES.len() as f64 + AXIS;
    html.raw(
        "<div class=\"timeline-frame\"><svg id=\"timeline\" class=\"timeline\" role=\"img\" \
              aria-labelledby=\"timeline-title\" viewBox=\"0 0 ",
    )
    .text(format!("{:.0}", LEFT + WIDTH + 10.0))
    .raw(" ")
    .text(format!("{height:.0}"))
    .raw("\" data-span-ms=\"")
    .text(span)
    .raw("\" data-scale=\"")
    .text(format!("{}", WIDTH / span as f64))
    .raw("\"><title id=\"timeline-title\">The run's steps over ")
    .text(duration(span))
    .raw("</title>");
    for (i, (_, name)) in LANES.iter().enumerate() {
        let y = LANE * i as f64;
        html.raw("<text class=\"lane\" x=\"0\" y=\"")
            .text(format!("{:.1}", y + LANE * 0.7))
            .raw("\">")
            .raw(name)
            .raw("</text><line class=\"grid\" x1=\"")
            .text(format!("{LEFT:.0}"))
            .raw("\" x2=\"")
            .text(format!("{:.0}", LEFT + WIDTH))
            .raw("\" y1=\"")
            .text(format!("{:.1}", y + LANE))
            .raw("\" y2=\"")
            .text(format!("{:.1}", y + LANE))
            .raw("\"/>");
    }
    for (mark, step) in marks.iter().zip(steps) {
        let x = LEFT + mark.x;
        let y = LANE * mark.lane as f64;
        html.raw("<a class=\"mark-link\" href=\"")
            .text(base)
            .raw("/steps/")
            .text(mark.seq)
            .raw("\"><title>")
            .text(format!(
                "step {}: {:?}, {}{}: {}",
                mark.seq,
                step.kind,
                duration(mark.millis),
                if mark.open { " so far" } else { "" },
                step.summary
            ))
            .raw("</title><rect class=\"mark kind-")
            .text(format!("{:?}", step.kind))
            .raw(" state-")
            .raw(state_class(step.state))
            .raw("\" data-seq=\"")
            .text(mark.seq)
            .raw("\" data-ms=\"")
            .text(mark.millis)
            .raw("\" x=\"")
            .text(format!("{x:.4}"))
            .raw("\" y=\"")
            .text(format!("{:.1}", y + 4.0))
            .raw("\" width=\"")
            .text(format!("{:.4}", mark.width))
            .raw("\" height=\"")
            .text(format!("{:.1}", LANE - 8.0))
            // A tick at the start, so that a step too short to have a visible width can still
            // be seen, hovered and clicked.
            .raw("\"/><line class=\"tick kind-")
            .text(format!("{:?}", step.kind))
            .raw("\" x1=\"")
            .text(format!("{x:.4}"))
            .raw("\" x2=\"")
            .text(format!("{x:.4}"))
            .raw("\" y1=\"")
            .text(format!("{:.1}", y + 2.0))
            .raw("\" y2=\"")
            .text(format!("{:.1}", y + LANE - 2.0))
            .raw("\"/></a>");
    }
    let axis = LANE * LANES.len() as f64;
    html.raw("<text class=\"axis\" x=\"")
        .text(format!("{LEFT:.0}"))
        .raw("\" y=\"")
        .text(format!("{:.1}", axis + 16.0))
        .raw("\">0</text><text class=\"axis\" text-anchor=\"end\" x=\"")
        .text(format!("{:.0}", LEFT + WIDTH))
        .raw("\" y=\"")
        .text(format!("{:.1}", axis + 16.0))
        .raw("\">")
        .text(duration(span))
        .raw("</text></svg></div>");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(millis: i64) -> Timestamp {
        Timestamp::from_millisecond(1_800_000_000_000 + millis).expect("a time")
    }

    fn step(seq: u32, kind: StepKind, start: i64, end: Option<i64>) -> StepView {
        StepView {
            seq,
            kind,
            state: if end.is_some() {
                StepState::Completed
            } else {
                StepState::Started
            },
            started_at: at(start),
            finished_at: end.map(at),
            summary: format!("<b>{seq}</b>"),
            inherited: false,
            snapshot: None,
        }
    }

    #[test]
    #[allow(clippy::float_arithmetic)]
    fn widths_are_durations_at_one_scale() {
        let steps = [
            step(0, StepKind::SandboxCreation, 0, Some(200)),
            step(1, StepKind::ModelCall, 200, Some(1200)),
            step(2, StepKind::Command, 1300, Some(1800)),
            step(3, StepKind::ModelCall, 1800, None),
        ];
        let (marks, span) = layout(&steps, at(2000));
        assert_eq!(span, 2000);
        let widths: Vec<f64> = marks.iter().map(|m| m.width).collect();
        assert_eq!(widths, [100.0, 500.0, 250.0, 100.0]);
        let xs: Vec<f64> = marks.iter().map(|m| m.x).collect();
        assert_eq!(xs, [0.0, 100.0, 650.0, 900.0]);
        assert_eq!(
            marks.iter().map(|m| m.lane).collect::<Vec<_>>(),
            [0, 2, 3, 2]
        );
        assert!(marks[3].open && !marks[2].open);
        assert_eq!(layout(&[], at(0)), (Vec::new(), 0));
    }

    #[test]
    fn one_mark_per_step_and_its_summary_is_text() {
        let steps = [
            step(0, StepKind::Routing, 0, Some(5)),
            step(1, StepKind::Command, 5, Some(10)),
        ];
        let mut html = Html::new();
        render(&mut html, &steps, at(10), "/console/p/d/runs/r");
        let svg = html.into_string();
        assert_eq!(svg.matches("<rect").count(), 2);
        assert!(svg.contains("&lt;b&gt;1&lt;/b&gt;"));
        assert!(!svg.contains("<b>"));
        assert!(svg.contains("href=\"/console/p/d/runs/r/steps/1\""));
    }

    #[test]
    fn durations_read_as_people_say_them() {
        assert_eq!(duration(12), "12 ms");
        assert_eq!(duration(1534), "1.5 s");
        assert_eq!(duration(125_000), "2 min 5 s");
    }
}

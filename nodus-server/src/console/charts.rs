//! A group's small charts, drawn by the server as SVG: its progress over time (queued, started,
//! done) and its spend against its cap. The history is derived from the members' own
//! timestamps — `metadata.creationTimestamp` (queued from then), `status.startTime` (started)
//! and `status.completionTime` (done) — and spend from each member's `status.cost.totalUSD`,
//! counted when the member finished (a member still going counts at the chart's end). Whether
//! a started run was working, waiting or parked at a past moment is not in those timestamps,
//! so the history draws them as one "started" band; the legend gives today's split from the
//! group's `status.counts`. [`progress`] and [`spend`] are pure and table-tested.

use jiff::Timestamp;
use nodus_core::money::Usd;

use super::html::Html;

/// One member as the charts read it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    /// When it was created (queued from then).
    pub created: Timestamp,
    /// When it started.
    pub started: Option<Timestamp>,
    /// When it finished.
    pub completed: Option<Timestamp>,
    /// What it cost so far.
    pub cost: Usd,
}

/// The members' states at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Point {
    /// The moment.
    pub at: Timestamp,
    /// Created, not started.
    pub queued: u32,
    /// Started, not finished (working, waiting or parked).
    pub started: u32,
    /// Finished.
    pub done: u32,
}

/// The chart's time span: from the first creation to the last finish, or to `now` while a
/// member is unfinished.
fn span(members: &[Member], now: Timestamp) -> Option<(Timestamp, Timestamp)> {
    let first = members.iter().map(|m| m.created).min()?;
    let last = if members.iter().any(|m| m.completed.is_none()) {
        now
    } else {
        members.iter().filter_map(|m| m.completed).max()?
    };
    Some((first, last.max(first)))
}

/// The members' states at `points` moments evenly spread over the span (the last at its end).
pub fn progress(members: &[Member], now: Timestamp, points: u32) -> Vec<Point> {
    let Some((first, last)) = span(members, now) else {
        return Vec::new();
    };
    let total = last.duration_since(first).as_nanos();
    let steps = i128::from(points.max(2) - 1);
    (0..=steps)
        .map(|k| {
            let offset = total * k / steps;
            let at = first
                .checked_add(jiff::SignedDuration::from_nanos(
                    i64::try_from(offset).unwrap_or(i64::MAX),
                ))
                .unwrap_or(last);
            let at = if k == steps { last } else { at };
            let mut point = Point {
                at,
                ..Point::default()
            };
            for member in members {
                if member.completed.is_some_and(|t| t <= at) {
                    point.done += 1;
                } else if member.started.is_some_and(|t| t <= at) {
                    point.started += 1;
                } else if member.created <= at {
                    point.queued += 1;
                }
            }
            point
        })
        .collect()
}

/// Spend over time: each finished member's cost at its finish, the unfinished members' at
/// the span's end; cumulative, exact, one step per moment spend changed.
pub fn spend(members: &[Member], now: Timestamp) -> Vec<(Timestamp, Usd)> {
    let Some((first, last)) = span(members, now) else {
        return Vec::new();
    };
    let mut events: Vec<(Timestamp, Usd)> = members
        .iter()
        .map(|m| (m.completed.unwrap_or(last), m.cost))
        .collect();
    events.sort_by_key(|(at, _)| *at);
    let mut steps = vec![(first, Usd::ZERO)];
    let mut sum = Usd::ZERO;
    for (at, cost) in events {
        sum = sum.saturating_add(cost);
        match steps.last_mut() {
            Some(step) if step.0 == at => step.1 = sum,
            _ => steps.push((at, sum)),
        }
    }
    steps
}

const WIDTH: u64 = 600;
const HEIGHT: u64 = 120;
const LEFT: u64 = 40;
const TOP: u64 = 8;

/// `part` of `whole` as a coordinate in tenths of a unit, `0..=length*10`, in integers (a
/// chart of money stays off floating point).
fn scaled(part: u128, whole: u128, length: u64) -> u64 {
    if whole == 0 {
        return 0;
    }
    u64::try_from(part.min(whole) * u128::from(length) * 10 / whole).unwrap_or(0)
}

/// Tenths as text: `123` → `12.3`.
fn tenths(value: u64) -> String {
    format!("{}.{}", value / 10, value % 10)
}

fn x_of(at: Timestamp, first: Timestamp, last: Timestamp) -> u64 {
    let whole = last.duration_since(first).as_nanos().max(0).unsigned_abs();
    let part = at.duration_since(first).as_nanos().max(0).unsigned_abs();
    LEFT * 10 + scaled(part, whole, WIDTH)
}

fn frame(html: &mut Html, id: &'static str, title: &str) {
    html.raw("<div class=\"chart-frame\"><svg class=\"chart\" id=\"")
        .raw(id)
        .raw("\" role=\"img\" viewBox=\"0 0 ")
        .text(LEFT + WIDTH + 10)
        .raw(" ")
        .text(TOP + HEIGHT + 20)
        .raw("\"><title>")
        .text(title)
        .raw("</title><line class=\"axis-line\" x1=\"")
        .text(LEFT)
        .raw("\" x2=\"")
        .text(LEFT + WIDTH)
        .raw("\" y1=\"")
        .text(TOP + HEIGHT)
        .raw("\" y2=\"")
        .text(TOP + HEIGHT)
        .raw("\"/>");
}

/// A band of the progress chart: its lower and upper cumulative count at a point.
type Band = fn(&Point) -> (u32, u32);

/// The progress chart: stacked bands of done, started and queued members over time, the
/// last point's counts in `data-` attributes.
pub fn render_progress(html: &mut Html, points: &[Point]) {
    let (Some(first), Some(last)) = (points.first(), points.last()) else {
        html.raw("<p class=\"muted\" id=\"progress-none\">No runs yet.</p>");
        return;
    };
    let most = points
        .iter()
        .map(|p| p.queued + p.started + p.done)
        .max()
        .unwrap_or(0)
        .max(1);
    frame(html, "progress", "Runs over time: done, started, queued");
    let baseline = (TOP + HEIGHT) * 10;
    let y = |count: u32| baseline - scaled(u128::from(count), u128::from(most), HEIGHT);
    // Each band between a lower and an upper cumulative count.
    let bands: [(&str, Band); 3] = [
        ("done", |p| (0, p.done)),
        ("active", |p| (p.done, p.done + p.started)),
        ("queued", |p| {
            (p.done + p.started, p.done + p.started + p.queued)
        }),
    ];
    for (series, band) in bands {
        let mut path = String::new();
        for (i, point) in points.iter().enumerate() {
            let x = tenths(x_of(point.at, first.at, last.at));
            path.push_str(if i == 0 { "M" } else { " L" });
            path.push_str(&format!("{x} {}", tenths(y(band(point).1))));
        }
        for point in points.iter().rev() {
            let x = tenths(x_of(point.at, first.at, last.at));
            path.push_str(&format!(" L{x} {}", tenths(y(band(point).0))));
        }
        path.push_str(" Z");
        html.raw("<path class=\"area series-")
            .raw(series)
            .raw("\" d=\"")
            .text(path)
            .raw("\"/>");
    }
    html.raw("<text x=\"0\" y=\"")
        .text(TOP + 10)
        .raw("\">")
        .text(most)
        .raw("</text><text x=\"0\" y=\"")
        .text(TOP + HEIGHT)
        .raw("\">0</text><text x=\"")
        .text(LEFT)
        .raw("\" y=\"")
        .text(TOP + HEIGHT + 16)
        .raw("\">")
        .text(first.at.strftime("%H:%M:%S"))
        .raw("</text><text text-anchor=\"end\" x=\"")
        .text(LEFT + WIDTH)
        .raw("\" y=\"")
        .text(TOP + HEIGHT + 16)
        .raw("\">")
        .text(last.at.strftime("%H:%M:%S"))
        .raw("</text><g id=\"progress-now\" data-queued=\"")
        .text(last.queued)
        .raw("\" data-started=\"")
        .text(last.started)
        .raw("\" data-done=\"")
        .text(last.done)
        .raw("\"></g></svg></div>");
}

/// The spend chart: cumulative spend as a step line, the cap as a dashed line.
pub fn render_spend(html: &mut Html, steps: &[(Timestamp, Usd)], cap: Option<Usd>) {
    let (Some(first), Some(last)) = (steps.first(), steps.last()) else {
        html.raw("<p class=\"muted\" id=\"spend-none\">Nothing spent yet.</p>");
        return;
    };
    let total = last.1;
    let top = cap.map_or(total, |cap| cap.max(total)).nanos().max(1);
    frame(html, "spend", "Spend over time against the cap");
    let baseline = (TOP + HEIGHT) * 10;
    let y = |usd: Usd| baseline - scaled(u128::from(usd.nanos()), u128::from(top), HEIGHT);
    let mut path = String::new();
    let mut previous = Usd::ZERO;
    for (i, (at, sum)) in steps.iter().enumerate() {
        let x = tenths(x_of(*at, first.0, last.0));
        if i == 0 {
            path.push_str(&format!("M{x} {}", tenths(y(*sum))));
        } else {
            path.push_str(&format!(
                " L{x} {} L{x} {}",
                tenths(y(previous)),
                tenths(y(*sum))
            ));
        }
        previous = *sum;
    }
    html.raw("<path class=\"spend\" d=\"")
        .text(path)
        .raw("\"/>");
    if let Some(cap) = cap {
        let at = tenths(y(cap));
        html.raw("<line class=\"cap\" x1=\"")
            .text(LEFT)
            .raw("\" x2=\"")
            .text(LEFT + WIDTH)
            .raw("\" y1=\"")
            .text(&at)
            .raw("\" y2=\"")
            .text(&at)
            .raw("\"/><text x=\"0\" y=\"")
            .text(at)
            .raw("\">cap</text>");
    }
    html.raw("<text x=\"0\" y=\"")
        .text(TOP + HEIGHT)
        .raw("\">$0</text><g id=\"spend-now\" data-total=\"")
        .text(total)
        .raw("\"></g></svg></div>");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(second: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + second).expect("a time")
    }

    fn member(created: i64, started: Option<i64>, completed: Option<i64>, cents: u64) -> Member {
        Member {
            created: at(created),
            started: started.map(at),
            completed: completed.map(at),
            cost: Usd::from_cents(cents),
        }
    }

    #[test]
    fn each_moment_counts_queued_started_and_done_from_the_timestamps() {
        let members = [
            member(0, Some(0), Some(4), 1),
            member(0, Some(2), Some(8), 2),
            member(0, None, Some(6), 0), // cancelled while queued
            member(4, Some(6), None, 3), // still going (waiting or working)
        ];
        let points = progress(&members, at(8), 5);
        let counts: Vec<(i64, u32, u32, u32)> = points
            .iter()
            .map(|p| {
                (
                    p.at.as_second() - 1_800_000_000,
                    p.queued,
                    p.started,
                    p.done,
                )
            })
            .collect();
        assert_eq!(
            counts,
            [
                (0, 2, 1, 0),
                (2, 1, 2, 0),
                (4, 2, 1, 1),
                (6, 0, 2, 2),
                (8, 0, 1, 3),
            ]
        );
        assert!(progress(&[], at(0), 5).is_empty());
    }

    #[test]
    fn spend_is_cumulative_and_exact() {
        let members = [
            member(0, Some(0), Some(4), 1),
            member(0, Some(0), Some(4), 2),
            member(0, Some(1), None, 7),
        ];
        let steps = spend(&members, at(10));
        assert_eq!(
            steps,
            [
                (at(0), Usd::ZERO),
                (at(4), Usd::from_cents(3)),
                (at(10), Usd::from_cents(10))
            ]
        );
        let mut html = Html::new();
        render_spend(&mut html, &steps, Some(Usd::from_cents(20)));
        let svg = html.into_string();
        assert!(svg.contains("data-total=\"0.10\""), "{svg}");
        // The cap is the top of the chart: its line is at the top margin.
        assert!(
            svg.contains("class=\"cap\" x1=\"40\" x2=\"640\" y1=\"8.0\""),
            "{svg}"
        );
    }

    #[test]
    fn the_progress_chart_carries_the_last_counts() {
        let members = [member(0, Some(1), Some(2), 0), member(0, None, None, 0)];
        let mut html = Html::new();
        render_progress(&mut html, &progress(&members, at(4), 3));
        let svg = html.into_string();
        assert!(svg.contains("data-queued=\"1\" data-started=\"0\" data-done=\"1\""));
        assert_eq!(svg.matches("<path").count(), 3);
    }
}

//! The router evaluation: jev against the labelled prompts of `data/router_eval.jsonl`.
//!
//! Run it with `cargo run --release -p nodus-llm --example router_eval`. It prints the share
//! of prompts routed to each family, the agreement with the labels (exact, within one family,
//! under- and over-routed) on the whole set and on its two halves (the half jev's thresholds
//! were fitted on with `--fit`, and the held-out half), the confusion matrix, the cost of jev's
//! choices against always choosing the largest family (and always sonnet, and the labels
//! themselves), and the time of one decision (p50, p99, max).
//!
//! The cost model: every prompt is served with the same usage whatever the family: input =
//! 600 tokens of system prompt and tools + the prompt (one token per 4 bytes) + its
//! conversation; output by the label (the work the prompt asks for): haiku 150, sonnet 800,
//! opus 2,500, fable 6,000 tokens. Prices come from the shipped catalog.

use std::time::Instant;

use nodus_core::Usd;
use nodus_core::catalog::Family;
use nodus_core::cost::{self, Usage};
use nodus_core::router::RouteRequest;
use nodus_llm::jev::{self, Jev};
use serde::Deserialize;

const DATA: &str = include_str!("../data/router_eval.jsonl");

#[derive(Deserialize)]
struct Row {
    id: u32,
    label: Family,
    prompt: String,
    #[serde(default)]
    history: Option<History>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct History {
    turns: u32,
    tool_results: u32,
    task: String,
}

/// The half of the set the thresholds were fitted on: the prompts come in cycles of four
/// (one per label), and every other cycle is in it.
fn tuned_half(id: u32) -> bool {
    (id.saturating_sub(1) / 4).is_multiple_of(2)
}

fn percent(part: usize, whole: usize) -> String {
    let per_mille = (part * 1000).checked_div(whole).unwrap_or(0);
    format!("{}.{}%", per_mille / 10, per_mille % 10)
}

fn index(family: Family) -> usize {
    Family::ALL.iter().position(|f| *f == family).unwrap_or(0)
}

fn output_tokens(label: Family) -> u64 {
    match label {
        Family::Haiku => 150,
        Family::Sonnet => 800,
        Family::Opus => 2_500,
        Family::Fable => 6_000,
    }
}

#[derive(Default)]
struct Agreement {
    total: usize,
    exact: usize,
    within_one: usize,
    under: usize,
    over: usize,
}

impl Agreement {
    fn add(&mut self, label: Family, chosen: Family) {
        self.total += 1;
        let (l, c) = (index(label), index(chosen));
        if l == c {
            self.exact += 1;
        }
        if l.abs_diff(c) <= 1 {
            self.within_one += 1;
        }
        if c < l {
            self.under += 1;
        }
        if c > l {
            self.over += 1;
        }
    }

    fn line(&self, name: &str) -> String {
        format!(
            "{name:<22} {:>4} prompts  exact {:>6}  within one {:>6}  under-routed {:>6}  over-routed {:>6}",
            self.total,
            percent(self.exact, self.total),
            percent(self.within_one, self.total),
            percent(self.under, self.total),
            percent(self.over, self.total),
        )
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let catalog = nodus_llm::default_catalog()?;
    let rows: Vec<Row> = DATA
        .lines()
        .filter(|line| !line.trim().is_empty())
        .map(serde_json::from_str)
        .collect::<Result<_, _>>()?;
    let histories: Vec<Vec<nodus_core::model::ChatMessage>> = rows
        .iter()
        .map(|row| {
            row.history.as_ref().map_or_else(Vec::new, |h| {
                jev::synthetic_history(&h.task, h.turns, h.tool_results)
            })
        })
        .collect();
    let router = Jev::new();

    let mut shares = [0usize; 4];
    let mut labels = [0usize; 4];
    let mut confusion = [[0usize; 4]; 4];
    let (mut all, mut tuned, mut held_out) = (
        Agreement::default(),
        Agreement::default(),
        Agreement::default(),
    );
    let (mut cost_jev, mut cost_largest, mut cost_sonnet, mut cost_labels) =
        (Usd::ZERO, Usd::ZERO, Usd::ZERO, Usd::ZERO);
    let largest = Family::ALL[3];
    let mut misses = Vec::new();
    for (row, history) in rows.iter().zip(&histories) {
        let request = RouteRequest {
            prompt: &row.prompt,
            conversation: history,
            allowed: &Family::ALL,
        };
        let decision = router.decide(&request).ok_or("no family allowed")?;
        let chosen = decision.family;
        shares[index(chosen)] += 1;
        labels[index(row.label)] += 1;
        confusion[index(row.label)][index(chosen)] += 1;
        all.add(row.label, chosen);
        if tuned_half(row.id) {
            tuned.add(row.label, chosen);
        } else {
            held_out.add(row.label, chosen);
        }
        if chosen != row.label {
            misses.push((
                row.id,
                row.label,
                chosen,
                decision.score,
                row.prompt.clone(),
            ));
        }
        let history_tokens = row.history.as_ref().map_or(0, |h| {
            u64::from(h.turns) * 60 + u64::from(h.tool_results) * 400
        });
        let usage = Usage {
            input_tokens: 600 + (row.prompt.len() as u64).div_ceil(4) + history_tokens,
            output_tokens: output_tokens(row.label),
            ..Usage::default()
        };
        let bill = |family: Family| -> Result<Usd, String> {
            let entry = catalog.family(family).ok_or("a family without a model")?;
            Ok(cost::bill(&entry.prices, &usage))
        };
        cost_jev = cost_jev.saturating_add(bill(chosen)?);
        cost_largest = cost_largest.saturating_add(bill(largest)?);
        cost_sonnet = cost_sonnet.saturating_add(bill(Family::Sonnet)?);
        cost_labels = cost_labels.saturating_add(bill(row.label)?);
    }

    println!(
        "jev on {} labelled prompts (nodus-llm/data/router_eval.jsonl)\n",
        rows.len()
    );
    println!("family   labelled  routed by jev");
    for family in Family::ALL {
        let i = index(family);
        println!(
            "{:<8} {:>4} {:>6}  {:>4} {:>6}",
            family.as_str(),
            labels[i],
            percent(labels[i], rows.len()),
            shares[i],
            percent(shares[i], rows.len())
        );
    }
    println!("\nagreement with the labels");
    println!("{}", all.line("all"));
    println!("{}", tuned.line("fitted half"));
    println!("{}", held_out.line("held-out half"));
    println!("\nconfusion (rows: label, columns: jev)");
    println!(
        "{:<8} {:>6} {:>6} {:>6} {:>6}",
        "", "haiku", "sonnet", "opus", "fable"
    );
    for family in Family::ALL {
        let row = confusion[index(family)];
        println!(
            "{:<8} {:>6} {:>6} {:>6} {:>6}",
            family.as_str(),
            row[0],
            row[1],
            row[2],
            row[3]
        );
    }
    let ratio = |part: Usd, whole: Usd| {
        let per_mille = u128::from(part.nanos()) * 1000 / u128::from(whole.nanos().max(1));
        format!("{}.{}%", per_mille / 10, per_mille % 10)
    };
    println!("\ncost of the set (cost model in the example's doc)");
    println!("always {:<14} ${cost_largest}", largest.as_str());
    println!(
        "always sonnet         ${cost_sonnet}  ({} of always {})",
        ratio(cost_sonnet, cost_largest),
        largest.as_str()
    );
    println!(
        "the labels (oracle)   ${cost_labels}  ({} of always {})",
        ratio(cost_labels, cost_largest),
        largest.as_str()
    );
    println!(
        "jev                   ${cost_jev}  ({} of always {})",
        ratio(cost_jev, cost_largest),
        largest.as_str()
    );

    // The time of one decision: every prompt, many rounds, each decision timed alone.
    let mut samples: Vec<u128> = Vec::with_capacity(rows.len() * 50);
    let started = Instant::now();
    for _ in 0..50 {
        for (row, history) in rows.iter().zip(&histories) {
            let request = RouteRequest {
                prompt: &row.prompt,
                conversation: history,
                allowed: &Family::ALL,
            };
            let at = Instant::now();
            std::hint::black_box(router.decide(std::hint::black_box(&request)));
            samples.push(at.elapsed().as_nanos());
        }
    }
    let total = started.elapsed().as_nanos();
    samples.sort_unstable();
    let at = |per_mille: usize| samples[(samples.len() * per_mille / 1000).min(samples.len() - 1)];
    let per_second = (samples.len() as u128 * 1_000_000_000)
        .checked_div(total)
        .unwrap_or(0);
    println!(
        "\ndecision time over {} decisions: p50 {} ns, p99 {} ns, max {} ns ({} decisions/s with the timing overhead)",
        samples.len(),
        at(500),
        at(990),
        samples.last().copied().unwrap_or(0),
        per_second
    );

    if std::env::args().any(|a| a == "--fit") {
        fit(&rows, &histories);
    }
    if std::env::args().any(|a| a == "--misses") {
        println!("\nmisses (id, label → jev, score)");
        for (id, label, chosen, score, prompt) in misses {
            let short: String = prompt.chars().take(110).collect();
            println!("{id:>4} {label} → {chosen} ({score}): {short}");
        }
    }
    Ok(())
}

/// Search the thresholds that agree best with the labels of the fitted half (most exact
/// matches, then fewest under-routed prompts), and print them.
fn fit(rows: &[Row], histories: &[Vec<nodus_core::model::ChatMessage>]) {
    let scored: Vec<(Family, i32)> = rows
        .iter()
        .zip(histories)
        .filter(|(row, _)| tuned_half(row.id))
        .filter_map(|(row, history)| {
            let request = RouteRequest {
                prompt: &row.prompt,
                conversation: history,
                allowed: &Family::ALL,
            };
            let decision = Jev::new().decide(&request)?;
            Some((row.label, decision.score.max(decision.task_score)))
        })
        .collect();
    let mut best = (0usize, usize::MAX, jev::Thresholds::default());
    for sonnet in -10..30 {
        for opus in sonnet + 1..50 {
            for fable in opus + 1..70 {
                let thresholds = jev::Thresholds {
                    sonnet,
                    opus,
                    fable,
                };
                let (mut exact, mut under) = (0, 0);
                for (label, score) in &scored {
                    let chosen = thresholds.family_for(*score);
                    exact += usize::from(chosen == *label);
                    under += usize::from(chosen < *label);
                }
                if exact > best.0 || (exact == best.0 && under < best.1) {
                    best = (exact, under, thresholds);
                }
            }
        }
    }
    println!(
        "\nfitted on {} prompts: {:?} ({} exact, {} under-routed)",
        scored.len(),
        best.2,
        best.0,
        best.1
    );
}

//! Router decisions per second: jev over the labelled evaluation prompts (beside a baseline:
//! one lower-case copy of each), a short prompt, a 16 KiB prompt, and a short prompt at the
//! end of a 200-message conversation.
//!
//! `cargo bench -p nodus-llm --bench router -- --warm-up-time 1 --measurement-time 3`

use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use nodus_core::catalog::Family;
use nodus_core::router::RouteRequest;
use nodus_llm::jev::{self, Jev};

const DATA: &str = include_str!("../data/router_eval.jsonl");

fn prompts() -> Vec<String> {
    DATA.lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter_map(|row| row["prompt"].as_str().map(str::to_string))
        .collect()
}

fn bench(c: &mut Criterion) {
    let router = Jev::new();
    let prompts = prompts();
    let mut group = c.benchmark_group("jev");

    group.throughput(Throughput::Elements(prompts.len() as u64));
    group.bench_function("every evaluation prompt", |b| {
        b.iter(|| {
            for prompt in &prompts {
                let request = RouteRequest {
                    prompt,
                    conversation: &[],
                    allowed: &Family::ALL,
                };
                black_box(router.decide(black_box(&request)));
            }
        })
    });

    // Baseline, same run: the least work any reading of the text does (one lower-case copy).
    group.bench_function("baseline: lower-case every evaluation prompt", |b| {
        b.iter(|| {
            for prompt in &prompts {
                black_box(black_box(prompt.as_str()).to_ascii_lowercase());
            }
        })
    });

    group.throughput(Throughput::Elements(1));
    let short = "What is the capital of Australia?";
    group.bench_function("short prompt", |b| {
        b.iter(|| {
            black_box(router.decide(black_box(&RouteRequest {
                prompt: short,
                conversation: &[],
                allowed: &Family::ALL,
            })))
        })
    });

    let long = prompts
        .join("\n")
        .chars()
        .take(16 * 1024)
        .collect::<String>();
    group.bench_function("16 KiB prompt", |b| {
        b.iter(|| {
            black_box(router.decide(black_box(&RouteRequest {
                prompt: &long,
                conversation: &[],
                allowed: &Family::ALL,
            })))
        })
    });

    let history = jev::synthetic_history(&prompts[3], 100, 60);
    group.bench_function("follow-up after 200 messages", |b| {
        b.iter(|| {
            black_box(router.decide(black_box(&RouteRequest {
                prompt: "Continue.",
                conversation: &history,
                allowed: &[Family::Haiku, Family::Sonnet],
            })))
        })
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);

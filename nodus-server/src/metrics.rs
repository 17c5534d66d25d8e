//! Prometheus metrics at `/metrics`: requests answered for anyone; runs by phase, model
//! calls, spend and step latency of the projects a token holds, for a caller with a token.
//!
//! Counters are kept in memory by the API and read from the store when scraped; the text is
//! written in the Prometheus exposition format by hand (a handful of series needs no crate).
//! The GenAI histograms (`gen_ai.client.token.usage`, `gen_ai.client.operation.duration` of
//! the semantic conventions, dots spelled as underscores) are read from the journals too.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};

use nodus_core::Usd;
use nodus_core::engine::Engine;
use nodus_core::journal::{Intent, Outcome};
use nodus_core::resource::{AgentRunSpec, Kind};
use nodus_core::store::{Selector, Store};

use crate::auth::{Principal, SYSTEM_PROJECT};

/// Counters the API keeps.
#[derive(Debug, Default)]
pub struct Metrics {
    /// HTTP requests answered.
    pub requests: AtomicU64,
    /// What the span exporter did (all zero without `--otlp-endpoint`).
    pub spans: std::sync::Arc<crate::telemetry::SpanCounters>,
    /// This replica's gauges, once it serves.
    pub replica: std::sync::OnceLock<ReplicaGauges>,
    /// The egress proxy's journal, for the records it gave up.
    pub egress: Option<nodus_core::egress_log::EgressJournal>,
}

/// Bucket bounds of `gen_ai.client.token.usage` (the semantic conventions' advice).
const TOKEN_BUCKETS: [u64; 14] = [
    1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864,
];
/// Bucket bounds of `gen_ai.client.operation.duration`, in milliseconds (the conventions'
/// advice in seconds: 0.01 … 81.92), and as the `le` labels say them.
const DURATION_BUCKETS_MS: [(u64, &str); 14] = [
    (10, "0.01"),
    (20, "0.02"),
    (40, "0.04"),
    (80, "0.08"),
    (160, "0.16"),
    (320, "0.32"),
    (640, "0.64"),
    (1280, "1.28"),
    (2560, "2.56"),
    (5120, "5.12"),
    (10240, "10.24"),
    (20480, "20.48"),
    (40960, "40.96"),
    (81920, "81.92"),
];

/// A Prometheus histogram over integers: per-bucket counts (not yet cumulative), sum, count.
#[derive(Debug, Default, Clone)]
struct Histogram {
    buckets: [u64; 14],
    sum: u64,
    count: u64,
}

impl Histogram {
    fn observe(&mut self, bounds: impl Iterator<Item = u64>, value: u64) {
        if let Some(i) = bounds.into_iter().position(|bound| value <= bound) {
            self.buckets[i] += 1;
        }
        self.sum = self.sum.saturating_add(value);
        self.count += 1;
    }

    /// The `_bucket`, `_sum` and `_count` lines; `sum` formats the sum.
    fn write(
        &self,
        text: &mut String,
        name: &str,
        labels: &str,
        les: impl Iterator<Item = String>,
        sum: impl Fn(u64) -> String,
    ) {
        let mut cumulative = 0;
        for (le, n) in les.zip(self.buckets) {
            cumulative += n;
            let _ = writeln!(text, "{name}_bucket{{{labels},le=\"{le}\"}} {cumulative}");
        }
        let _ = writeln!(text, "{name}_bucket{{{labels},le=\"+Inf\"}} {}", self.count);
        let _ = writeln!(text, "{name}_sum{{{labels}}} {}", sum(self.sum));
        let _ = writeln!(text, "{name}_count{{{labels}}} {}", self.count);
    }
}

/// Milliseconds as seconds, exactly (`1234` → `1.234`).
fn seconds(millis: u64) -> String {
    format!("{}.{:03}", millis / 1000, millis % 1000)
}

/// What `/metrics` says of this replica: its name and role, its capacity, how many of it
/// its runs use now, whether it drains. Nothing of any project.
#[derive(Debug)]
pub struct ReplicaGauges {
    /// The replica's name (as its runs' `status.replica` and its leases say).
    pub name: String,
    /// `all`, `api` or `worker`.
    pub role: &'static str,
    /// Live sandboxes it may hold at once (0 for an API replica: it drives nothing).
    pub capacity: usize,
    /// Runs it drives now, each holding its sandbox (none for an API replica).
    pub in_use: Option<tokio::sync::watch::Receiver<usize>>,
}

impl ReplicaGauges {
    fn render(&self, engine: &Engine, text: &mut String) {
        let labels = format!("replica=\"{}\",role=\"{}\"", self.name, self.role);
        let in_use = self.in_use.as_ref().map_or(0, |in_use| *in_use.borrow());
        let draining = u8::from(engine.draining());
        for (name, help, value) in [
            (
                "nodus_replica_capacity",
                "Live sandboxes this replica may hold at once (--capacity).",
                self.capacity,
            ),
            (
                "nodus_replica_sandboxes_in_use",
                "Runs this replica drives now, each holding its sandbox.",
                in_use,
            ),
            (
                "nodus_replica_draining",
                "1 while this replica drains (it takes on no more runs).",
                usize::from(draining),
            ),
        ] {
            let _ = writeln!(text, "# HELP {name} {help}");
            let _ = writeln!(text, "# TYPE {name} gauge");
            let _ = writeln!(text, "{name}{{{labels}}} {value}");
        }
    }
}

impl Metrics {
    /// Count one request.
    pub fn request(&self) {
        self.requests.fetch_add(1, Ordering::Relaxed);
    }

    /// The exposition text: the server's own counters for anyone; with a `caller`, what the
    /// store says about the runs of the projects it holds.
    pub async fn render(
        &self,
        engine: &Engine,
        store: &dyn Store,
        caller: Option<&Principal>,
    ) -> String {
        let mut text = String::new();
        let _ = writeln!(
            text,
            "# HELP nodus_http_requests_total HTTP requests answered."
        );
        let _ = writeln!(text, "# TYPE nodus_http_requests_total counter");
        let _ = writeln!(
            text,
            "nodus_http_requests_total {}",
            self.requests.load(Ordering::Relaxed)
        );
        let spans = &self.spans;
        let _ = writeln!(
            text,
            "# HELP nodus_otlp_spans_exported_total Spans the OTLP endpoint accepted."
        );
        let _ = writeln!(text, "# TYPE nodus_otlp_spans_exported_total counter");
        let _ = writeln!(
            text,
            "nodus_otlp_spans_exported_total {}",
            spans.exported.load(Ordering::Relaxed)
        );
        let _ = writeln!(
            text,
            "# HELP nodus_otlp_spans_dropped_total Spans not exported: the queue was full, or their export failed."
        );
        let _ = writeln!(text, "# TYPE nodus_otlp_spans_dropped_total counter");
        let _ = writeln!(
            text,
            "nodus_otlp_spans_dropped_total{{reason=\"queue_full\"}} {}",
            spans.dropped_queue_full.load(Ordering::Relaxed)
        );
        let _ = writeln!(
            text,
            "nodus_otlp_spans_dropped_total{{reason=\"export_failed\"}} {}",
            spans.dropped_export_failed.load(Ordering::Relaxed)
        );
        if let Some(egress) = &self.egress {
            let _ = writeln!(
                text,
                "# HELP nodus_egress_records_lost_total Egress connections whose records the \
                 store kept refusing (each said so in the server's log)."
            );
            let _ = writeln!(text, "# TYPE nodus_egress_records_lost_total counter");
            let _ = writeln!(
                text,
                "nodus_egress_records_lost_total {}",
                egress.records_lost()
            );
        }
        if let Some(replica) = self.replica.get() {
            replica.render(engine, &mut text);
        }
        let Some(caller) = caller else {
            return text;
        };
        // Per requested model: input and output token histograms, and the duration one.
        let mut tokens: std::collections::BTreeMap<(String, &str), Histogram> = Default::default();
        let mut durations: std::collections::BTreeMap<String, Histogram> = Default::default();
        let mut phases: std::collections::BTreeMap<String, u64> = Default::default();
        let mut model_calls = 0u64;
        let mut spend = Usd::ZERO;
        let mut steps = 0u64;
        let mut step_millis = 0u64;
        let projects = store
            .list(SYSTEM_PROJECT, Kind::Account, &Selector::default())
            .await
            .unwrap_or_default();
        for project in projects {
            if caller.check_read(&project.key.name).is_err() {
                continue;
            }
            let runs = engine
                .list::<AgentRunSpec>(&project.key.name, &Selector::default())
                .await
                .unwrap_or_default();
            for run in runs {
                let phase = run.status.phase.map_or("Pending", |p| p.name());
                *phases.entry(phase.to_string()).or_default() += 1;
                spend = spend.saturating_add(run.status.cost.total_usd);
                if let Ok(journal) = engine.journal(&project.key.name, run.name()).await {
                    for step in &journal {
                        if let Some(done) = &step.completion {
                            steps += 1;
                            let took = done.finished_at.duration_since(step.started_at);
                            step_millis += u64::try_from(took.as_millis()).unwrap_or(0);
                            if let Intent::CallModel { model, .. } = &step.intent {
                                let millis = u64::try_from(took.as_millis()).unwrap_or(0);
                                durations
                                    .entry(model.clone())
                                    .or_default()
                                    .observe(DURATION_BUCKETS_MS.iter().map(|b| b.0), millis);
                                if let Outcome::ModelReplied { response, .. } = &done.outcome {
                                    model_calls += 1;
                                    for (kind, count) in [
                                        ("input", response.usage.prompt_tokens()),
                                        ("output", response.usage.output_tokens),
                                    ] {
                                        tokens
                                            .entry((model.clone(), kind))
                                            .or_default()
                                            .observe(TOKEN_BUCKETS.iter().copied(), count);
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
        let _ = writeln!(text, "# HELP nodus_runs Runs by phase.");
        let _ = writeln!(text, "# TYPE nodus_runs gauge");
        for (phase, count) in &phases {
            let _ = writeln!(text, "nodus_runs{{phase=\"{phase}\"}} {count}");
        }
        let _ = writeln!(
            text,
            "# HELP nodus_model_calls_total Model calls that replied."
        );
        let _ = writeln!(text, "# TYPE nodus_model_calls_total counter");
        let _ = writeln!(text, "nodus_model_calls_total {model_calls}");
        let _ = writeln!(
            text,
            "# HELP nodus_spend_nanodollars_total Model and routing spend, in nano-dollars (exact)."
        );
        let _ = writeln!(text, "# TYPE nodus_spend_nanodollars_total counter");
        let _ = writeln!(text, "nodus_spend_nanodollars_total {}", spend.nanos());
        let _ = writeln!(
            text,
            "# HELP nodus_step_duration_milliseconds Time from a step's intent to its outcome."
        );
        let _ = writeln!(text, "# TYPE nodus_step_duration_milliseconds summary");
        let _ = writeln!(text, "nodus_step_duration_milliseconds_sum {step_millis}");
        let _ = writeln!(text, "nodus_step_duration_milliseconds_count {steps}");
        let _ = writeln!(
            text,
            "# HELP gen_ai_client_token_usage Tokens used per model call (gen_ai.client.token.usage)."
        );
        let _ = writeln!(text, "# TYPE gen_ai_client_token_usage histogram");
        for ((model, kind), histogram) in &tokens {
            histogram.write(
                &mut text,
                "gen_ai_client_token_usage",
                &format!(
                    "gen_ai_operation_name=\"chat\",gen_ai_request_model=\"{}\",gen_ai_token_type=\"{kind}\"",
                    label(model)
                ),
                TOKEN_BUCKETS.iter().map(u64::to_string),
                |sum| sum.to_string(),
            );
        }
        let _ = writeln!(
            text,
            "# HELP gen_ai_client_operation_duration_seconds Duration of model calls (gen_ai.client.operation.duration)."
        );
        let _ = writeln!(
            text,
            "# TYPE gen_ai_client_operation_duration_seconds histogram"
        );
        for (model, histogram) in &durations {
            histogram.write(
                &mut text,
                "gen_ai_client_operation_duration_seconds",
                &format!(
                    "gen_ai_operation_name=\"chat\",gen_ai_request_model=\"{}\"",
                    label(model)
                ),
                DURATION_BUCKETS_MS.iter().map(|b| b.1.to_string()),
                seconds,
            );
        }
        text
    }
}

/// A label value escaped as the exposition format asks (backslash, quote, newline).
fn label(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_histogram_is_cumulative_with_its_sum_and_count() {
        let mut h = Histogram::default();
        for ms in [5, 10, 11, 100_000] {
            h.observe(DURATION_BUCKETS_MS.iter().map(|b| b.0), ms);
        }
        let mut text = String::new();
        h.write(
            &mut text,
            "d",
            "m=\"x\"",
            DURATION_BUCKETS_MS.iter().map(|b| b.1.to_string()),
            seconds,
        );
        assert!(text.contains("d_bucket{m=\"x\",le=\"0.01\"} 2\n"), "{text}");
        assert!(text.contains("d_bucket{m=\"x\",le=\"0.02\"} 3\n"), "{text}");
        assert!(
            text.contains("d_bucket{m=\"x\",le=\"81.92\"} 3\n"),
            "{text}"
        );
        assert!(text.contains("d_bucket{m=\"x\",le=\"+Inf\"} 4\n"), "{text}");
        assert!(text.contains("d_sum{m=\"x\"} 100.026\n"), "{text}");
        assert!(text.contains("d_count{m=\"x\"} 4\n"), "{text}");
    }
}

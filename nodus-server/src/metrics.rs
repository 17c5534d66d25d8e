//! Prometheus metrics at `/metrics`: requests answered for anyone; runs by phase, model
//! calls, spend and step latency of the projects a token holds, for a caller with a token.
//!
//! Counters are kept in memory by the API and read from the store when scraped; the text is
//! written in the Prometheus exposition format by hand (a handful of series needs no crate).
//! The GenAI histograms (`gen_ai.client.token.usage`, `gen_ai.client.operation.duration` of
//! the semantic conventions, dots spelled as underscores) are read from the journals too.
//!
//! A scrape lists each project's runs by a few fields ([`RUN_PATHS`]) and reads the journal of
//! an unfinished run each time, but a finished run's once: its journal's figures are kept by
//! the run's uid and version ([`FinishedRuns`]), and read again only when the run was written
//! since (a scrape costs about the runs that move, not the history).

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use nodus_core::Usd;
use nodus_core::engine::Engine;
use nodus_core::journal::{Intent, Outcome, Step};
use nodus_core::lifecycle::RunPhase;
use nodus_core::resource::Kind;
use nodus_core::store::{Record, Selector, Store};
use serde::Deserialize;

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
    /// The journals' figures of finished runs, read once.
    pub finished: FinishedRuns,
}

/// The figures of each finished run's journal, by project and run uid, with the run's
/// version when its journal was read: a finished run's journal does not change unless the
/// run is written again (a rewrite gives it a new version). Runs no longer listed are
/// dropped at the next scrape of their project.
#[derive(Debug, Default)]
pub struct FinishedRuns(Mutex<HashMap<String, ProjectRuns>>);

/// A project's finished runs: by uid, the version read and its journal's figures.
type ProjectRuns = HashMap<String, (u64, Arc<JournalFigures>)>;

impl FinishedRuns {
    /// The figures kept of run `uid` of `project` at `version`, if any.
    fn get(&self, project: &str, uid: &str, version: u64) -> Option<Arc<JournalFigures>> {
        let kept = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        match kept.get(project)?.get(uid) {
            Some((at, figures)) if *at == version => Some(Arc::clone(figures)),
            _ => None,
        }
    }

    /// Keep `runs` (uid, version, figures) as `project`'s finished runs, instead of those
    /// kept before.
    fn keep(&self, project: &str, runs: ProjectRuns) {
        let mut kept = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        kept.insert(project.to_string(), runs);
    }

    /// How many runs' figures are kept (for tests).
    #[cfg(test)]
    fn len(&self) -> usize {
        let kept = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        kept.values().map(HashMap::len).sum()
    }
}

/// The paths of a run's document a scrape reads.
const RUN_PATHS: &[&str] = &["metadata.uid", "status.phase", "status.cost.totalUSD"];

/// The part of a run's document a scrape reads ([`RUN_PATHS`]).
#[derive(Debug, Default, Deserialize)]
struct RunRow {
    #[serde(default)]
    metadata: RowMetadata,
    #[serde(default)]
    status: RowStatus,
}

#[derive(Debug, Default, Deserialize)]
struct RowMetadata {
    #[serde(default)]
    uid: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
struct RowStatus {
    #[serde(default)]
    phase: Option<String>,
    #[serde(default)]
    cost: RowCost,
}

#[derive(Debug, Default, Deserialize)]
struct RowCost {
    #[serde(rename = "totalUSD", default)]
    total_usd: Usd,
}

/// What one run's journal adds to the metrics.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct JournalFigures {
    /// Steps with an outcome.
    steps: u64,
    /// Their time from intent to outcome, summed.
    step_millis: u64,
    /// Model calls that replied.
    model_calls: u64,
    /// Tokens per call, by requested model and `input`/`output`.
    tokens: BTreeMap<(String, &'static str), Histogram>,
    /// Model calls' durations, by requested model.
    durations: BTreeMap<String, Histogram>,
}

impl JournalFigures {
    /// The figures of `journal`.
    fn of(journal: &[Step]) -> Self {
        let mut figures = JournalFigures::default();
        for step in journal {
            let Some(done) = &step.completion else {
                continue;
            };
            figures.steps += 1;
            let took = done.finished_at.duration_since(step.started_at);
            let millis = u64::try_from(took.as_millis()).unwrap_or(0);
            figures.step_millis = figures.step_millis.saturating_add(millis);
            let Intent::CallModel { model, .. } = &step.intent else {
                continue;
            };
            figures
                .durations
                .entry(model.clone())
                .or_default()
                .observe(DURATION_BUCKETS_MS.iter().map(|b| b.0), millis);
            if let Outcome::ModelReplied { response, .. } = &done.outcome {
                figures.model_calls += 1;
                for (kind, count) in [
                    ("input", response.usage.prompt_tokens()),
                    ("output", response.usage.output_tokens),
                ] {
                    figures
                        .tokens
                        .entry((model.clone(), kind))
                        .or_default()
                        .observe(TOKEN_BUCKETS.iter().copied(), count);
                }
            }
        }
        figures
    }

    /// Add `other`'s figures to these.
    fn add(&mut self, other: &JournalFigures) {
        self.steps += other.steps;
        self.step_millis = self.step_millis.saturating_add(other.step_millis);
        self.model_calls += other.model_calls;
        for (key, histogram) in &other.tokens {
            self.tokens.entry(key.clone()).or_default().add(histogram);
        }
        for (model, histogram) in &other.durations {
            self.durations
                .entry(model.clone())
                .or_default()
                .add(histogram);
        }
    }
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
#[derive(Debug, Default, Clone, PartialEq)]
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

    /// Add `other`'s observations to these (same bounds).
    fn add(&mut self, other: &Histogram) {
        for (mine, theirs) in self.buckets.iter_mut().zip(other.buckets) {
            *mine += theirs;
        }
        self.sum = self.sum.saturating_add(other.sum);
        self.count += other.count;
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

/// What the runs of the projects a caller holds add up to.
#[derive(Debug, Default)]
struct Totals {
    figures: JournalFigures,
    /// Runs by phase name (`Pending` for one not started).
    phases: BTreeMap<String, u64>,
    spend: Usd,
}

impl Metrics {
    /// Add `project`'s runs to `totals`: each run's phase and spend from its listing, and
    /// its journal's figures (kept for a finished run, read for the others).
    async fn scan(&self, store: &dyn Store, project: &str, totals: &mut Totals) {
        let runs = store
            .list_sparse(project, Kind::AgentRun, &Selector::default(), RUN_PATHS)
            .await
            .unwrap_or_default();
        let mut finished = HashMap::new();
        for run in runs {
            let version = run.version;
            let row = row_of(run);
            let phase = row.status.phase.unwrap_or_else(|| "Pending".to_string());
            totals.spend = totals.spend.saturating_add(row.status.cost.total_usd);
            let done = RunPhase::names_finished(&phase);
            *totals.phases.entry(phase).or_default() += 1;
            let Some(uid) = row.metadata.uid else {
                continue;
            };
            let kept = match done {
                true => self.finished.get(project, &uid, version),
                false => None,
            };
            let of_run = match kept {
                Some(kept) => kept,
                None => match store.journal(&uid).await {
                    Ok(journal) => Arc::new(JournalFigures::of(&journal)),
                    Err(_) => continue,
                },
            };
            totals.figures.add(&of_run);
            if done {
                finished.insert(uid, (version, of_run));
            }
        }
        self.finished.keep(project, finished);
    }

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
        let mut totals = Totals::default();
        let projects = store
            .list(SYSTEM_PROJECT, Kind::Account, &Selector::default())
            .await
            .unwrap_or_default();
        for project in projects {
            if caller.check_read(&project.key.name).is_ok() {
                self.scan(store, &project.key.name, &mut totals).await;
            }
        }
        let Totals {
            figures,
            phases,
            spend,
        } = totals;
        let JournalFigures {
            steps,
            step_millis,
            model_calls,
            tokens,
            durations,
        } = figures;
        runs_by_phase(&mut text, &phases);
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

/// The fields of a run a scrape reads; a document they cannot be read from counts as a run not
/// started, with nothing spent and no journal.
fn row_of(record: Record) -> RunRow {
    serde_json::from_value(record.document).unwrap_or_default()
}

/// The `nodus_runs` gauge: runs by phase, each phase as stored (escaped: a stored document is
/// not trusted to hold one of the engine's names).
fn runs_by_phase(text: &mut String, phases: &BTreeMap<String, u64>) {
    let _ = writeln!(text, "# HELP nodus_runs Runs by phase.");
    let _ = writeln!(text, "# TYPE nodus_runs gauge");
    for (phase, count) in phases {
        let _ = writeln!(text, "nodus_runs{{phase=\"{}\"}} {count}", label(phase));
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
    use nodus_core::store::{Lease, MemoryStore, ObjectKey};
    use serde_json::{Value, json};

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

    /// A step of run `uid` journaled whole: its intent, then its outcome, half a second
    /// later (`intent` and `outcome` in the journal's JSON).
    async fn step(store: &MemoryStore, uid: &str, seq: u32, intent: Value, outcome: Value) {
        let now: jiff::Timestamp = "2026-12-01T10:00:00Z".parse().expect("time");
        let lease = Lease::new("test", now, Lease::DEFAULT_DURATION);
        let fence = store.claim(uid, &lease).await.expect("claim");
        let step: Step = serde_json::from_value(json!({
            "seq": seq, "startedAt": "2026-12-01T10:00:00Z", "intent": intent,
        }))
        .expect("a step");
        store.append_step(uid, fence, &step).await.expect("intent");
        let mut completion = outcome;
        completion["finishedAt"] = json!("2026-12-01T10:00:00.5Z");
        let completion = serde_json::from_value(completion).expect("a completion");
        store
            .complete_step(uid, fence, seq, &completion)
            .await
            .expect("outcome");
        store.release(uid, fence).await.expect("release");
    }

    fn routed() -> (Value, Value) {
        (
            json!({"kind": "route", "turn": 0}),
            json!({"result": "routed", "model": "claude-haiku", "chosenBy": "jev",
                "costUSD": "0.0001"}),
        )
    }

    fn replied() -> (Value, Value) {
        (
            json!({"kind": "callModel", "turn": 0, "model": "claude-haiku",
                "reservedUSD": "0.01", "tools": true}),
            json!({"result": "modelReplied", "costUSD": "0.001", "response": {
                "model": "claude-haiku", "content": [{"type": "text", "text": "hi"}],
                "stopReason": "end_turn", "usage": {"inputTokens": 10, "outputTokens": 5}}}),
        )
    }

    async fn scanned(metrics: &Metrics, store: &MemoryStore) -> Totals {
        let mut totals = Totals::default();
        metrics.scan(store, "p", &mut totals).await;
        totals
    }

    #[test]
    fn a_stored_phase_cannot_write_a_line_of_its_own() {
        let phases = BTreeMap::from([
            ("Running".to_string(), 2),
            ("x\"} 1\nnodus_spend_nanodollars_total 9".to_string(), 1),
        ]);
        let mut text = String::new();
        runs_by_phase(&mut text, &phases);
        assert!(text.contains("nodus_runs{phase=\"Running\"} 2\n"), "{text}");
        assert!(
            text.contains("nodus_runs{phase=\"x\\\"} 1\\nnodus_spend_nanodollars_total 9\"} 1\n"),
            "{text}"
        );
        assert_eq!(text.lines().count(), 4, "{text}");
    }

    #[tokio::test]
    async fn a_finished_run_s_journal_is_read_once_until_the_run_is_written_again() {
        let store = MemoryStore::new();
        let run = |name: &str, uid: &str, phase: &str| {
            json!({"apiVersion": "nodus.dev/v1", "kind": "AgentRun",
                "metadata": {"name": name, "uid": uid}, "spec": {},
                "status": {"phase": phase, "cost": {"totalUSD": "0.25"}}})
        };
        let done = ObjectKey::new("p", Kind::AgentRun, "done");
        store
            .create(&done, run("done", "u-done", "Succeeded"))
            .await
            .expect("done");
        let going = ObjectKey::new("p", Kind::AgentRun, "going");
        store
            .create(&going, run("going", "u-going", "Running"))
            .await
            .expect("going");
        for uid in ["u-done", "u-going"] {
            let ((route, routed), (call, replied)) = (routed(), replied());
            step(&store, uid, 0, route, routed).await;
            step(&store, uid, 1, call, replied).await;
        }
        let metrics = Metrics::default();
        let first = scanned(&metrics, &store).await;
        assert_eq!((first.figures.steps, first.figures.model_calls), (4, 2));
        assert_eq!(first.phases.get("Succeeded"), Some(&1));
        assert_eq!(first.phases.get("Running"), Some(&1));
        assert_eq!(first.spend.to_string(), "0.50");
        assert_eq!(first.figures.step_millis, 2000);
        let tokens = &first.figures.tokens[&("claude-haiku".to_string(), "input")];
        assert_eq!((tokens.count, tokens.sum), (2, 20));
        assert_eq!(metrics.finished.len(), 1, "the finished run's figures kept");

        // A step more in each journal, neither run document written: the finished run's
        // figures are the ones kept (its journal not read again), the going run's read again.
        for uid in ["u-done", "u-going"] {
            let (route, routed) = routed();
            step(&store, uid, 2, route, routed).await;
        }
        let second = scanned(&metrics, &store).await;
        assert_eq!(second.figures.steps, 5, "4 and the going run's new step");

        // The finished run written again (a new version): its journal read again.
        let record = store.get(&done).await.expect("done");
        store
            .update(&done, record.version, record.document)
            .await
            .expect("written again");
        let third = scanned(&metrics, &store).await;
        assert_eq!(third.figures.steps, 6);

        // Deleted: no longer counted, nor kept.
        store.delete(&done).await.expect("delete");
        let fourth = scanned(&metrics, &store).await;
        assert_eq!(fourth.figures.steps, 3);
        assert_eq!(metrics.finished.len(), 0);
    }
}

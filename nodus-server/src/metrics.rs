//! Prometheus metrics at `/metrics`: requests answered for anyone; runs by phase, model
//! calls, spend and step latency of the projects a token holds, for a caller with a token.
//!
//! Counters are kept in memory by the API and read from the store when scraped; the text is
//! written in the Prometheus exposition format by hand (a handful of series needs no crate).

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};

use nodus_core::Usd;
use nodus_core::engine::Engine;
use nodus_core::journal::{Outcome, StepKind};
use nodus_core::resource::{AgentRunSpec, Kind};
use nodus_core::store::{Selector, Store};

use crate::auth::{Principal, SYSTEM_PROJECT};

/// Counters the API keeps.
#[derive(Debug, Default)]
pub struct Metrics {
    /// HTTP requests answered.
    pub requests: AtomicU64,
    /// This replica's gauges, once it serves.
    pub replica: std::sync::OnceLock<ReplicaGauges>,
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
        if let Some(replica) = self.replica.get() {
            replica.render(engine, &mut text);
        }
        let Some(caller) = caller else {
            return text;
        };
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
                            if step.intent.kind() == StepKind::ModelCall
                                && matches!(done.outcome, Outcome::ModelReplied { .. })
                            {
                                model_calls += 1;
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
        text
    }
}

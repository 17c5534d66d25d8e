//! The egress journal: every connection a run's sandbox asked the egress proxy for, kept in
//! the store with the run (an [`EgressLog`] document, [`Kind::EgressLog`] named after the
//! run's uid) and served as its run result `egress` (JSON Lines) and its `status.egress`.
//!
//! The proxy hands each record over as its connection ends ([`EgressJournal::record`], which
//! never waits); one writer task per run appends what has gathered since its last write
//! ([`chunks::append`]: the log lies in chunks of bounded size, so an append costs what it
//! appends, not what the log holds), so records are batched under load and written at once
//! when idle. A record is durable once that write returns: one finished before a restart is
//! there after it. A write that fails in a way a retry can help is tried again a few times
//! with growing pauses ([`Retries`]); then its records are given up, said so in the server's
//! log and counted ([`EgressJournal::records_lost`]). Bounded: a run's log keeps its first
//! [`MAX_RECORDS_KEPT`] records and counts the rest (its counts and bytes cover every
//! connection), and what waits for a write is bounded the same way.

pub mod chunks;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::egress::{EgressCounts, EgressRecord};
use crate::resource::Kind;
use crate::store::{self, ObjectKey, Store};

/// The records a run's log keeps; later connections are counted, not kept.
pub const MAX_RECORDS_KEPT: usize = 10_000;

pub use chunks::{delete, read, stored_keys};

/// How the journal's writer tries a failed write again before it gives its records up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retries {
    /// Attempts in all, the first included (at least one is made).
    pub attempts: u32,
    /// The pause before the second attempt; each later pause doubles it.
    pub first_pause: Duration,
    /// The longest pause.
    pub max_pause: Duration,
}

impl Retries {
    /// Five attempts over about six seconds.
    pub const DEFAULT: Retries = Retries {
        attempts: 5,
        first_pause: Duration::from_millis(400),
        max_pause: Duration::from_secs(5),
    };

    /// The pause before attempt `attempt` (the second is 2) after a failure a retry can help
    /// (`retryable`), or `None` when no attempt is left: the records are given up.
    pub fn pause_before(&self, attempt: u32, retryable: bool) -> Option<Duration> {
        if !retryable || attempt > self.attempts || attempt < 2 {
            return None;
        }
        let doubled = self
            .first_pause
            .checked_mul(1 << (attempt - 2).min(20))
            .unwrap_or(self.max_pause);
        Some(doubled.min(self.max_pause))
    }
}

impl Default for Retries {
    fn default() -> Self {
        Retries::DEFAULT
    }
}

/// Where the egress log of the run with uid `run_uid` is kept.
pub fn egress_log_key(run_uid: &str) -> ObjectKey {
    ObjectKey::new(crate::ledger::SYSTEM_PROJECT, Kind::EgressLog, run_uid)
}

/// A run's egress log as stored, or a batch of it on its way to the store.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EgressLog {
    /// Every connection, kept or not.
    #[serde(default)]
    pub counts: EgressCounts,
    /// The connections' records, oldest first, at most [`MAX_RECORDS_KEPT`].
    #[serde(default)]
    pub records: Vec<EgressRecord>,
    /// Connections counted whose records were not kept.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub records_dropped: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl EgressLog {
    /// Counts `record`, and keeps it while fewer than `max_kept` are kept.
    pub fn push(&mut self, record: EgressRecord, max_kept: usize) {
        self.counts.add(&record);
        if self.records.len() < max_kept {
            self.records.push(record);
        } else {
            self.records_dropped += 1;
        }
    }

    /// This log followed by `batch`: counts added, records kept up to `max_kept`.
    pub fn extend(&mut self, batch: EgressLog, max_kept: usize) {
        self.counts = self.counts.plus(batch.counts);
        let room = max_kept.saturating_sub(self.records.len());
        let over = batch.records.len().saturating_sub(room) as u64;
        self.records.extend(batch.records.into_iter().take(room));
        self.records_dropped += batch.records_dropped + over;
    }

    /// Whether it holds nothing.
    pub fn is_empty(&self) -> bool {
        self.counts == EgressCounts::default() && self.records.is_empty()
    }

    /// The records as JSON Lines (the run result `egress`).
    pub fn json_lines(&self) -> Vec<u8> {
        let mut out = Vec::new();
        for record in &self.records {
            // A record is plain strings and numbers: it always encodes.
            if let Ok(line) = serde_json::to_vec(record) {
                out.extend_from_slice(&line);
                out.push(b'\n');
            }
        }
        out
    }
}

/// What waits for one run's writer.
#[derive(Debug, Default)]
struct Pending {
    /// Records handed over and not taken by the writer yet.
    batch: EgressLog,
    /// The number of the last record handed over.
    last: u64,
    /// The number of the last record written (or given up).
    written: u64,
    /// Whether a writer task runs for the run.
    writing: bool,
}

/// The egress journal of the runs of this process's sandboxes: cheap to clone.
#[derive(Clone)]
pub struct EgressJournal {
    store: Arc<dyn Store>,
    pending: Arc<Mutex<HashMap<String, Pending>>>,
    written: Arc<tokio::sync::Notify>,
    numbered: Arc<AtomicU64>,
    retries: Retries,
    lost: Arc<AtomicU64>,
}

impl std::fmt::Debug for EgressJournal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EgressJournal").finish_non_exhaustive()
    }
}

impl EgressJournal {
    /// A journal writing to `store`, retrying as [`Retries::DEFAULT`] says.
    pub fn new(store: Arc<dyn Store>) -> Self {
        EgressJournal {
            store,
            pending: Arc::default(),
            written: Arc::new(tokio::sync::Notify::new()),
            numbered: Arc::new(AtomicU64::new(0)),
            retries: Retries::DEFAULT,
            lost: Arc::new(AtomicU64::new(0)),
        }
    }

    /// This journal retrying failed writes as `retries` says.
    pub fn with_retries(mut self, retries: Retries) -> Self {
        self.retries = retries;
        self
    }

    /// The connections whose records this journal gave up because the store kept failing
    /// (each said so in the server's log): the metric `nodus_egress_records_lost_total`.
    pub fn records_lost(&self) -> u64 {
        self.lost.load(Ordering::Relaxed)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Pending>> {
        self.pending.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Hands over the record of a connection of the sandbox of run `run_uid`; it is written
    /// soon, with whatever else gathers meanwhile. Never waits (a connection's end, even one
    /// cut by its sandbox's end, calls it).
    pub fn record(&self, run_uid: &str, record: EgressRecord) {
        let number = self.numbered.fetch_add(1, Ordering::Relaxed) + 1;
        let start = {
            let mut pending = self.lock();
            let run = pending.entry(run_uid.to_string()).or_default();
            run.batch.push(record, MAX_RECORDS_KEPT);
            run.last = number;
            !std::mem::replace(&mut run.writing, true)
        };
        if start {
            match tokio::runtime::Handle::try_current() {
                Ok(runtime) => {
                    runtime.spawn(self.clone().write(run_uid.to_string()));
                }
                // Only when the process ends: nothing can write any more.
                Err(_) => tracing::error!(run = %run_uid, "an egress record came after the \
                    server stopped; it is lost"),
            }
        }
    }

    /// One run's writer: writes what gathered, until nothing does.
    async fn write(self, run_uid: String) {
        loop {
            let (batch, last) = {
                let mut pending = self.lock();
                let Some(run) = pending.get_mut(&run_uid) else {
                    return;
                };
                if run.batch.is_empty() {
                    pending.remove(&run_uid);
                    drop(pending);
                    self.written.notify_waiters();
                    return;
                }
                (std::mem::take(&mut run.batch), run.last)
            };
            let mut attempt = 1;
            while let Err(error) = chunks::append(self.store.as_ref(), &run_uid, &batch).await {
                attempt += 1;
                let Some(pause) = self.retries.pause_before(attempt, error.is_retryable()) else {
                    let connections = batch.counts.allowed + batch.counts.refused;
                    self.lost.fetch_add(connections, Ordering::Relaxed);
                    tracing::error!(run = %run_uid, error = %error, connections,
                        attempts = attempt - 1, "cannot journal egress records; they are lost");
                    break;
                };
                tracing::warn!(run = %run_uid, error = %error, attempt = attempt - 1,
                    "an egress journal write failed; trying again");
                tokio::time::sleep(pause).await;
            }
            if let Some(run) = self.lock().get_mut(&run_uid) {
                run.written = last;
            }
            self.written.notify_waiters();
        }
    }

    /// Waits until every record of run `run_uid` handed over before this call is written,
    /// then reads the run's log.
    pub async fn settled(&self, run_uid: &str) -> Result<EgressLog, store::Error> {
        let target = self.lock().get(run_uid).map(|run| run.last);
        if let Some(target) = target {
            loop {
                let written = self.written.notified();
                let done = self
                    .lock()
                    .get(run_uid)
                    .is_none_or(|run| run.written >= target);
                if done {
                    break;
                }
                written.await;
            }
        }
        read(self.store.as_ref(), run_uid).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(host: &str, verdict: &str, bytes: u64) -> EgressRecord {
        EgressRecord {
            time: "2026-12-01T00:00:00Z".into(),
            host: host.into(),
            port: 443,
            address: None,
            verdict: verdict.into(),
            rule: "r".into(),
            bytes_out: bytes,
            bytes_in: 2 * bytes,
            duration_ms: 1,
        }
    }

    #[test]
    fn a_log_keeps_its_first_records_and_counts_them_all() {
        // (records pushed to a batch, kept at most, then extended into a log already holding
        // `before`): records kept, dropped, allowed, refused, bytes out.
        type Case = (usize, usize, usize, usize, u64, u64, u64, u64);
        let cases: [Case; 4] = [
            (3, 10, 0, 3, 0, 2, 1, 30),
            (3, 2, 0, 2, 1, 2, 1, 30),
            (3, 4, 2, 4, 1, 3, 2, 40),
            (0, 4, 4, 4, 0, 2, 2, 20),
        ];
        for (pushed, max, before, kept, dropped, allowed, refused, out) in cases {
            let mut batch = EgressLog::default();
            for i in 0..pushed {
                let verdict = if i == 1 { "refused" } else { "allowed" };
                batch.push(record("a.test", verdict, 10), max);
            }
            let mut log = EgressLog::default();
            for i in 0..before {
                let verdict = if i % 2 == 0 { "allowed" } else { "refused" };
                log.push(record("b.test", verdict, 5), max);
            }
            log.extend(batch, max);
            let case = (pushed, max, before);
            assert_eq!(log.records.len(), kept, "{case:?}");
            assert_eq!(log.records_dropped, dropped, "{case:?}");
            assert_eq!(log.counts.allowed, allowed, "{case:?}");
            assert_eq!(log.counts.refused, refused, "{case:?}");
            assert_eq!(log.counts.bytes_out, out, "{case:?}");
            assert_eq!(log.counts.bytes_in, 2 * out, "{case:?}");
        }
    }

    #[test]
    fn a_log_reads_back_and_prints_one_line_per_record() {
        let mut log = EgressLog::default();
        log.push(record("a.test", "allowed", 1), 10);
        log.push(record("b.test", "refused", 0), 10);
        let document = serde_json::to_value(&log).expect("json");
        assert_eq!(document["counts"]["bytesOut"], 1);
        assert!(document.get("recordsDropped").is_none());
        let read: EgressLog = serde_json::from_value(document).expect("reads back");
        assert_eq!(read, log);
        let lines = String::from_utf8(log.json_lines()).expect("UTF-8");
        let lines: Vec<&str> = lines.lines().collect();
        assert_eq!(lines.len(), 2);
        let first: serde_json::Value = serde_json::from_str(lines[0]).expect("a JSON line");
        assert_eq!(first["host"], "a.test");
        assert_eq!(first["bytesIn"], 2);
        assert_eq!(first["durationMs"], 1);
    }
}

#[cfg(test)]
mod journal_tests;

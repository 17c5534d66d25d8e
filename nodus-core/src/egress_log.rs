//! The egress journal: every connection a run's sandbox asked the egress proxy for, kept in
//! the store with the run (an [`EgressLog`] document, [`Kind::EgressLog`] named after the
//! run's uid) and served as its run result `egress` (JSON Lines) and its `status.egress`.
//!
//! The proxy hands each record over as its connection ends ([`EgressJournal::record`], which
//! never waits); one writer task per run appends what has gathered since its last write in
//! one store write, so records are batched under load and written at once when idle. A
//! record is durable once that write returns: one finished before a restart is there after
//! it. Bounded: a run's log keeps its first [`MAX_RECORDS_KEPT`] records and counts the rest
//! (its counts and bytes cover every connection), and what waits for a write is bounded the
//! same way.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

use crate::egress::{EgressCounts, EgressRecord};
use crate::resource::Kind;
use crate::store::{self, ObjectKey, Store};

/// The records a run's log keeps; later connections are counted, not kept.
pub const MAX_RECORDS_KEPT: usize = 10_000;

/// How often a failed write of a batch is tried again before its records are given up (and
/// said so in the server's log).
const WRITE_ATTEMPTS: u32 = 5;

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

    /// The log stored at `document`, or why it cannot be read.
    pub fn from_document(document: &serde_json::Value) -> Result<Self, String> {
        serde_json::from_value(document.clone()).map_err(|e| e.to_string())
    }
}

/// The egress log of run `run_uid` as stored (an empty one when the run has none).
pub async fn read(store: &dyn Store, run_uid: &str) -> Result<EgressLog, store::Error> {
    let key = egress_log_key(run_uid);
    match store.get(&key).await {
        Ok(record) => EgressLog::from_document(&record.document)
            .map_err(|e| store::Error::Corrupt(format!("{key}: {e}"))),
        Err(store::Error::NotFound(_)) => Ok(EgressLog::default()),
        Err(e) => Err(e),
    }
}

/// Appends `batch` to the log at `key` (made by the first batch).
async fn append(store: &dyn Store, key: &ObjectKey, batch: &EgressLog) -> Result<(), store::Error> {
    loop {
        let added = batch.clone();
        let edit: store::Edit = Box::new(move |document| {
            let mut log = EgressLog::from_document(document).unwrap_or_default();
            log.extend(added.clone(), MAX_RECORDS_KEPT);
            serde_json::to_value(log).ok()
        });
        match store.modify(key, edit).await {
            Ok(_) => return Ok(()),
            Err(store::Error::NotFound(_)) => {
                let mut first = EgressLog::default();
                first.extend(batch.clone(), MAX_RECORDS_KEPT);
                let document = serde_json::to_value(first)
                    .map_err(|e| store::Error::Invalid(format!("an egress log: {e}")))?;
                match store.create(key, document).await {
                    // Someone made it meanwhile: append to theirs.
                    Err(store::Error::AlreadyExists(_)) => continue,
                    other => return other.map(|_| ()),
                }
            }
            Err(e) => return Err(e),
        }
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
    numbered: Arc<std::sync::atomic::AtomicU64>,
}

impl std::fmt::Debug for EgressJournal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EgressJournal").finish_non_exhaustive()
    }
}

impl EgressJournal {
    /// A journal writing to `store`.
    pub fn new(store: Arc<dyn Store>) -> Self {
        EgressJournal {
            store,
            pending: Arc::default(),
            written: Arc::new(tokio::sync::Notify::new()),
            numbered: Arc::new(std::sync::atomic::AtomicU64::new(0)),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Pending>> {
        self.pending.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Hands over the record of a connection of the sandbox of run `run_uid`; it is written
    /// soon, with whatever else gathers meanwhile. Never waits (a connection's end, even one
    /// cut by its sandbox's end, calls it).
    pub fn record(&self, run_uid: &str, record: EgressRecord) {
        let number = self
            .numbered
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            + 1;
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
        let key = egress_log_key(&run_uid);
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
            while let Err(error) = append(self.store.as_ref(), &key, &batch).await {
                if attempt >= WRITE_ATTEMPTS {
                    tracing::error!(run = %run_uid, error = %error, records = batch.records.len(),
                        "cannot journal egress records; they are lost");
                    break;
                }
                attempt += 1;
                tokio::time::sleep(std::time::Duration::from_millis(100 << attempt)).await;
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
        assert_eq!(EgressLog::from_document(&document), Ok(log.clone()));
        let lines = String::from_utf8(log.json_lines()).expect("UTF-8");
        let lines: Vec<&str> = lines.lines().collect();
        assert_eq!(lines.len(), 2);
        let first: serde_json::Value = serde_json::from_str(lines[0]).expect("a JSON line");
        assert_eq!(first["host"], "a.test");
        assert_eq!(first["bytesIn"], 2);
        assert_eq!(first["durationMs"], 1);
    }
}

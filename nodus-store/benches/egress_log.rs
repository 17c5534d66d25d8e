//! A run's egress log, appended one connection at a time: what an append costs when the log
//! holds 1 record and when it holds 9,000 (of the 10,000 kept). Chunked (the log as it is
//! stored: `nodus_core::egress_log::chunks`) against the whole log rewritten by each append
//! (`Store::modify` of one document, as it was stored before), in the same run.
//!
//! `cargo bench -p nodus-store --bench egress_log`
//!
//! The embedded default store (SQLite, one file in a temporary directory, as `nodus server`
//! opens it). For each layout and each size: a fresh run's log is filled to the size in one
//! append (not timed), then `NODUS_BENCH_ITERS` (default 100) appends of one record each are
//! timed, one at a time, as a connection trickling in makes them. Prints medians and p90s
//! per layout and size, and each layout's ratio of 9,000 to 1.

use std::time::{Duration, Instant};

use nodus_core::egress::EgressRecord;
use nodus_core::egress_log::{self, EgressLog, MAX_RECORDS_KEPT, chunks};
use nodus_core::store::{Edit, Store};
use nodus_store::SqliteStore;

/// The record of connection `n`: a typical size (a host name, an address, a rule).
fn record(n: usize) -> EgressRecord {
    EgressRecord {
        time: "2026-12-03T12:00:00.123456Z".to_string(),
        host: format!("files-{n}.pypi.example.org"),
        port: 443,
        address: Some("192.0.2.17".to_string()),
        verdict: "allowed".to_string(),
        rule: "spec.network.allow[0]".to_string(),
        bytes_out: 812,
        bytes_in: 48_213,
        duration_ms: 35,
    }
}

fn batch(from: usize, count: usize) -> EgressLog {
    let mut batch = EgressLog::default();
    for n in from..from + count {
        batch.push(record(n), MAX_RECORDS_KEPT);
    }
    batch
}

/// The two layouts.
#[derive(Debug, Clone, Copy)]
enum Layout {
    /// Chunks of bounded size (as stored today).
    Chunked,
    /// One document per run, rewritten whole by each append (as stored before).
    Whole,
}

async fn append(store: &SqliteStore, layout: Layout, uid: &str, batch: EgressLog) {
    match layout {
        Layout::Chunked => chunks::append(store, uid, &batch).await.expect("append"),
        Layout::Whole => {
            let key = egress_log::egress_log_key(uid);
            let added = batch.clone();
            let edit: Edit = Box::new(move |document| {
                let mut log: EgressLog = serde_json::from_value(document.clone()).ok()?;
                log.extend(added.clone(), MAX_RECORDS_KEPT);
                serde_json::to_value(log).ok()
            });
            match store.modify(&key, edit).await {
                Ok(_) => {}
                Err(nodus_core::store::Error::NotFound(_)) => {
                    let document = serde_json::to_value(&batch).expect("json");
                    store.create(&key, document).await.expect("create");
                }
                Err(e) => panic!("modify: {e}"),
            }
        }
    }
}

fn iterations() -> usize {
    std::env::var("NODUS_BENCH_ITERS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(100)
}

/// The `q`-th hundredth of `times` (sorted).
fn quantile(times: &[Duration], q: usize) -> Duration {
    times[(times.len() - 1) * q / 100]
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let store = SqliteStore::open(dir.path().join("nodus.db"))
            .await
            .expect("open the store");
        let iterations = iterations();
        println!("{iterations} appends of one record each, per layout and size");
        for layout in [Layout::Chunked, Layout::Whole] {
            let mut medians = Vec::new();
            for size in [1, 9_000] {
                let uid = format!("{layout:?}-{size}");
                append(&store, layout, &uid, batch(0, size - 1)).await;
                let mut times = Vec::with_capacity(iterations);
                for i in 0..iterations {
                    let one = batch(size - 1 + i, 1);
                    let started = Instant::now();
                    append(&store, layout, &uid, one).await;
                    times.push(started.elapsed());
                }
                let log = egress_log::read(&store, &uid).await.expect("read");
                assert_eq!(
                    log.records.len(),
                    size - 1 + iterations,
                    "every record kept"
                );
                times.sort_unstable();
                let (median, p90) = (quantile(&times, 50), quantile(&times, 90));
                println!(
                    "{layout:?}, at record {size:>5}: median {:>7} µs, p90 {:>7} µs",
                    median.as_micros(),
                    p90.as_micros()
                );
                medians.push(median);
            }
            // In hundredths, with no float near the figures.
            let ratio = medians[1].as_micros() * 100 / medians[0].as_micros().max(1);
            println!(
                "{layout:?}: ratio of the median at 9,000 to at 1: {}.{:02}x",
                ratio / 100,
                ratio % 100
            );
        }
    });
}

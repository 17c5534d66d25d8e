//! Journal appends per second on SQLite and on Postgres, each next to the raw single-row
//! insert-and-commit rate of the same database, driver and row shape, measured in the same
//! run; for 1 run and for 64 concurrent runs.
//!
//! `cargo bench -p nodus-store --bench journal` (Postgres from `NODUS_TEST_POSTGRES_URL`,
//! which `eval "$(scripts/test-env start)"` sets; the bench fails without it). Set
//! `NODUS_BENCH_SECONDS` to change how long each measurement runs (default 6); raw and
//! journal writes alternate in slices, so a disturbance on the machine hits both alike.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering as AtomicOrdering};
use std::time::{Duration, Instant};

use jiff::Timestamp;
use nodus_core::Store;
use nodus_core::journal::{Intent, Step};
use nodus_core::store::Lease;
use nodus_store::{PostgresOptions, PostgresStore, SqliteStore};
use sqlx::postgres::PgPoolOptions;

/// Concurrent runs (and raw writers) in the concurrent measurements.
const CONCURRENT: usize = 64;

fn seconds() -> Duration {
    let seconds = std::env::var("NODUS_BENCH_SECONDS")
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
        .unwrap_or(6);
    Duration::from_secs(seconds.max(1))
}

/// The step every append writes; the raw rows carry the same JSON.
fn step(seq: u32) -> Step {
    Step {
        seq,
        started_at: Timestamp::from_second(1_700_000_000).unwrap_or(Timestamp::UNIX_EPOCH),
        intent: Intent::Route { turn: seq },
        completion: None,
    }
}

fn step_json(seq: u32) -> String {
    serde_json::to_string(&step(seq)).unwrap_or_default()
}

/// How many slices each pair of figures is measured in, alternating raw and journal
/// writes, so that a disturbance on the machine (another process's fsyncs) hits both alike.
const SLICES: u32 = 6;

/// A write: `op(writer)` does writer `writer`'s next write.
type Op = Arc<dyn Fn(usize) -> BoxFuture + Send + Sync>;
type BoxFuture = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;

/// Operations done and seconds taken by `writers` tasks running `op` for `duration`.
async fn slice(writers: usize, op: &Op, duration: Duration) -> (u64, f64) {
    let start = Instant::now();
    let mut tasks = Vec::new();
    for writer in 0..writers {
        let op = Arc::clone(op);
        tasks.push(tokio::spawn(async move {
            let mut done = 0u64;
            while start.elapsed() < duration {
                op(writer).await;
                done += 1;
            }
            done
        }));
    }
    let mut total = 0u64;
    for task in tasks {
        total += task.await.expect("a writer");
    }
    (total, start.elapsed().as_secs_f64())
}

/// Raw and journal writes per second with `writers` writers each, measured in alternating
/// slices.
#[allow(clippy::float_arithmetic)]
async fn pair(writers: usize, raw: &Op, journal: &Op) -> (f64, f64) {
    let duration = seconds() / SLICES;
    let (mut raw_ops, mut raw_secs, mut journal_ops, mut journal_secs) = (0, 0.0, 0, 0.0);
    for _ in 0..SLICES {
        let (ops, secs) = slice(writers, raw, duration).await;
        raw_ops += ops;
        raw_secs += secs;
        let (ops, secs) = slice(writers, journal, duration).await;
        journal_ops += ops;
        journal_secs += secs;
    }
    (raw_ops as f64 / raw_secs, journal_ops as f64 / journal_secs)
}

/// Journal appends: writer `i` appends the next step of its own run.
async fn journal_op<S: Store + Clone + 'static>(store: S, runs: usize, tag: &str) -> Op {
    let lease = Lease::new("bench", Timestamp::now(), Duration::from_secs(3600));
    let mut fences = Vec::new();
    for run in 0..runs {
        let uid = format!("{tag}-{run}");
        let fence = store.claim(&uid, &lease).await.expect("claim");
        fences.push((uid, fence, AtomicU32::new(0)));
    }
    let fences = Arc::new(fences);
    Arc::new(move |run| {
        let store = store.clone();
        let fences = Arc::clone(&fences);
        Box::pin(async move {
            let (uid, fence, next) = &fences[run];
            let seq = next.fetch_add(1, AtomicOrdering::Relaxed);
            store
                .append_step(uid, *fence, &step(seq))
                .await
                .expect("append");
        })
    })
}

/// Numbers the raw rows.
static RAW_ROWS: AtomicU32 = AtomicU32::new(0);

struct Figures {
    raw_1: f64,
    raw_n: f64,
    journal_1: f64,
    journal_n: f64,
}

#[allow(clippy::float_arithmetic)]
fn print(backend: &str, f: &Figures) {
    println!("{backend}");
    println!("  raw insert+commit, 1 writer:        {:>9.0} /s", f.raw_1);
    println!(
        "  raw insert+commit, {CONCURRENT} writers:       {:>9.0} /s",
        f.raw_n
    );
    println!(
        "  journal appends, 1 run:             {:>9.0} /s  = {:>5.1} % of raw (1 writer)",
        f.journal_1,
        100.0 * f.journal_1 / f.raw_1
    );
    println!(
        "  journal appends, {CONCURRENT} concurrent runs: {:>9.0} /s  = {:>5.1} x raw (1 writer)",
        f.journal_n,
        f.journal_n / f.raw_1
    );
}

async fn sqlite() -> Figures {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let path = dir.path().join("bench.db");
    let store = SqliteStore::open(&path).await.expect("open");
    // The raw rate: the same file, driver and settings (WAL, synchronous=FULL), one row per
    // autocommit INSERT, through one connection as SQLite allows one writer, on the blocking
    // pool as the store's writes.
    let raw = rusqlite::Connection::open(&path).expect("raw connection");
    raw.busy_timeout(Duration::from_secs(5))
        .expect("busy timeout");
    raw.execute_batch(
        "PRAGMA journal_mode = WAL; PRAGMA synchronous = FULL; \
         CREATE TABLE bench_raw (run_uid TEXT NOT NULL, seq INTEGER NOT NULL, step TEXT NOT NULL, \
         PRIMARY KEY (run_uid, seq)) WITHOUT ROWID",
    )
    .expect("raw table");
    let raw = Arc::new(std::sync::Mutex::new(raw));
    let raw: Op = Arc::new(move |writer| {
        let raw = raw.clone();
        Box::pin(async move {
            let seq = RAW_ROWS.fetch_add(1, AtomicOrdering::Relaxed);
            tokio::task::spawn_blocking(move || {
                raw.lock()
                    .expect("the raw connection")
                    .prepare_cached(
                        "INSERT INTO bench_raw (run_uid, seq, step) VALUES (?1, ?2, ?3)",
                    )
                    .expect("prepare")
                    .execute(rusqlite::params![
                        format!("raw-{writer}"),
                        i64::from(seq),
                        step_json(seq)
                    ])
                    .expect("raw insert");
            })
            .await
            .expect("the raw insert ran");
        })
    });
    let (raw_1, journal_1) = pair(1, &raw, &journal_op(store.clone(), 1, "one").await).await;
    let many = journal_op(store.clone(), CONCURRENT, "many").await;
    let (raw_n, journal_n) = pair(CONCURRENT, &raw, &many).await;
    Figures {
        raw_1,
        raw_n,
        journal_1,
        journal_n,
    }
}

async fn postgres() -> Figures {
    let url = std::env::var("NODUS_TEST_POSTGRES_URL").unwrap_or_else(|_| {
        panic!("NODUS_TEST_POSTGRES_URL is not set: run `eval \"$(scripts/test-env start)\"`")
    });
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() % 1_000_000_000_000);
    let schema = format!("bench_{}_{nanos}", std::process::id());
    let mut options = PostgresOptions::new(&url).schema(&schema);
    options.max_connections = 8;
    let store = PostgresStore::connect(options).await.expect("connect");
    // The raw rate: the same server, driver and row shape, one row per autocommit INSERT,
    // one connection per writer (no liveness check before each use, like the store's journal
    // connection).
    let raw = PgPoolOptions::new()
        .max_connections(u32::try_from(CONCURRENT).unwrap_or(64))
        .test_before_acquire(false)
        .connect(&url)
        .await
        .expect("raw pool");
    sqlx::query(&format!(
        "CREATE TABLE {schema}.bench_raw (run_uid text NOT NULL, seq bigint NOT NULL, \
         step json NOT NULL, PRIMARY KEY (run_uid, seq))"
    ))
    .execute(&raw)
    .await
    .expect("raw table");
    let insert =
        format!("INSERT INTO {schema}.bench_raw (run_uid, seq, step) VALUES ($1, $2, $3::json)");
    let raw_pool = raw.clone();
    let raw: Op = Arc::new(move |writer| {
        let raw = raw_pool.clone();
        let insert = insert.clone();
        Box::pin(async move {
            let seq = RAW_ROWS.fetch_add(1, AtomicOrdering::Relaxed);
            sqlx::query(&insert)
                .bind(format!("raw-{writer}"))
                .bind(i64::from(seq))
                .bind(step_json(seq))
                .execute(&raw)
                .await
                .expect("raw insert");
        })
    });
    let (raw_1, journal_1) = pair(1, &raw, &journal_op(store.clone(), 1, "one").await).await;
    let many = journal_op(store.clone(), CONCURRENT, "many").await;
    let (raw_n, journal_n) = pair(CONCURRENT, &raw, &many).await;
    let raw = PgPoolOptions::new()
        .max_connections(1)
        .connect(&url)
        .await
        .expect("a connection to clean up");
    let _ = sqlx::query(&format!("DROP SCHEMA {schema} CASCADE"))
        .execute(&raw)
        .await;
    Figures {
        raw_1,
        raw_n,
        journal_1,
        journal_n,
    }
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        println!(
            "each figure: {} s of writes in {SLICES} slices, raw and journal alternating",
            seconds().as_secs()
        );
        print("SQLite (WAL, synchronous=FULL)", &sqlite().await);
        print("Postgres", &postgres().await);
    });
}

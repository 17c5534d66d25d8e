//! What a statement costs the SQLite store's driver by itself: sqlx runs each SQLite
//! connection on a thread of its own, and every statement is handed to that thread and its
//! answer handed back. The same rows are inserted one statement each and a hundred to a
//! statement, in one transaction either way, and the CPU time of the whole process is read
//! around each (`/proc/self/stat`): the difference per row is the hand-off's.
//!
//! `cargo bench -p nodus-store --bench statement_handoff` (`NODUS_BENCH_ROWS`, default
//! 20,000, sets the rows per measurement; five rounds, the two ways alternated).

use std::time::Instant;

use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{Executor as _, QueryBuilder, Sqlite};

/// Rows a multi-row statement inserts.
const PER_STATEMENT: usize = 100;

/// `micros` over `rows`, in µs with one decimal.
fn per_row(micros: u128, rows: usize) -> String {
    let tenths = micros * 10 / rows.max(1) as u128;
    format!("{}.{}", tenths / 10, tenths % 10)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let rows: usize = std::env::var("NODUS_BENCH_ROWS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20_000)
        .max(PER_STATEMENT);
    let directory = tempfile::tempdir().expect("a temporary directory");
    let options = SqliteConnectOptions::new()
        .filename(directory.path().join("handoff.db"))
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        // The commit's fsync is not what is measured here.
        .synchronous(SqliteSynchronous::Off);
    let pool = SqlitePoolOptions::new()
        .max_connections(1)
        .connect_with(options)
        .await
        .expect("the database");
    pool.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT NOT NULL)")
        .await
        .expect("the table");
    println!("{rows} rows per measurement, in one transaction each");
    println!(
        "| round | one row per statement: CPU / wall per row | {PER_STATEMENT} rows per statement | CPU difference per row |"
    );
    println!("|---|---|---|---|");
    for round in 0..5 {
        let (cpu, wall) = (
            nodus_core::testing::process_cpu().as_micros(),
            Instant::now(),
        );
        let mut tx = pool.begin().await.expect("begin");
        for i in 0..rows {
            sqlx::query("INSERT INTO t (v) VALUES (?1)")
                .bind(format!("v{i}"))
                .execute(&mut *tx)
                .await
                .expect("insert");
        }
        tx.commit().await.expect("commit");
        let single = (
            nodus_core::testing::process_cpu().as_micros() - cpu,
            wall.elapsed().as_micros(),
        );
        let (cpu, wall) = (
            nodus_core::testing::process_cpu().as_micros(),
            Instant::now(),
        );
        let mut tx = pool.begin().await.expect("begin");
        for chunk in 0..rows / PER_STATEMENT {
            let mut query: QueryBuilder<Sqlite> = QueryBuilder::new("INSERT INTO t (v) ");
            query.push_values(0..PER_STATEMENT, |mut row, i| {
                row.push_bind(format!("v{}", chunk * PER_STATEMENT + i));
            });
            query.build().execute(&mut *tx).await.expect("insert");
        }
        tx.commit().await.expect("commit");
        let batched = (
            nodus_core::testing::process_cpu().as_micros() - cpu,
            wall.elapsed().as_micros(),
        );
        println!(
            "| {round} | {} / {} µs | {} / {} µs | **{} µs** |",
            per_row(single.0, rows),
            per_row(single.1, rows),
            per_row(batched.0, rows),
            per_row(batched.1, rows),
            per_row(single.0.saturating_sub(batched.0), rows),
        );
    }
}

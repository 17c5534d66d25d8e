//! What a statement costs the SQLite store's driver by itself. The store ran its statements
//! through sqlx's SQLite driver, which keeps each connection on a thread of its own and hands
//! every statement to that thread and its answer back (measured with this bench before the
//! change: 35–44 µs of CPU per statement more than a row of a multi-row insert, and about
//! 200 µs per transaction of one insert). The store now calls SQLite on the calling thread
//! (rusqlite), and this bench measures the same two shapes that way: the same rows inserted
//! one statement each and a hundred to a statement, in one transaction either way; then
//! transactions of one insert each. The process's CPU time is read around each
//! (`/proc/self/stat`).
//!
//! `cargo bench -p nodus-store --bench statement_handoff` (`NODUS_BENCH_ROWS`, default
//! 20,000, sets the rows per measurement; five rounds, the ways alternated).

use std::time::Instant;

use rusqlite::Connection;

/// Rows a multi-row statement inserts.
const PER_STATEMENT: usize = 100;

/// `micros` over `rows`, in µs with one decimal.
fn per_row(micros: u128, rows: usize) -> String {
    let tenths = micros * 10 / rows.max(1) as u128;
    format!("{}.{}", tenths / 10, tenths % 10)
}

/// The process's CPU time and the wall clock, now.
fn now() -> (u128, Instant) {
    (
        nodus_core::testing::process_cpu().as_micros(),
        Instant::now(),
    )
}

/// CPU and wall time since `since`, in µs.
fn since(since: (u128, Instant)) -> (u128, u128) {
    (
        nodus_core::testing::process_cpu().as_micros() - since.0,
        since.1.elapsed().as_micros(),
    )
}

fn main() {
    let rows: usize = std::env::var("NODUS_BENCH_ROWS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20_000)
        .max(PER_STATEMENT);
    let directory = tempfile::tempdir().expect("a temporary directory");
    let conn = Connection::open(directory.path().join("handoff.db")).expect("the database");
    // The commit's fsync is not what is measured here.
    conn.execute_batch(
        "PRAGMA journal_mode = WAL; PRAGMA synchronous = OFF; \
         CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT NOT NULL)",
    )
    .expect("the table");
    let insert_many = format!(
        "INSERT INTO t (v) VALUES {}",
        vec!["(?)"; PER_STATEMENT].join(", ")
    );
    println!("{rows} rows per measurement, in one transaction each");
    println!(
        "| round | one row per statement: CPU / wall per row | {PER_STATEMENT} rows per statement | CPU difference per row |"
    );
    println!("|---|---|---|---|");
    for round in 0..5 {
        let start = now();
        conn.execute_batch("BEGIN").expect("begin");
        for i in 0..rows {
            conn.prepare_cached("INSERT INTO t (v) VALUES (?1)")
                .expect("prepare")
                .execute([format!("v{i}")])
                .expect("insert");
        }
        conn.execute_batch("COMMIT").expect("commit");
        let single = since(start);
        let start = now();
        conn.execute_batch("BEGIN").expect("begin");
        for chunk in 0..rows / PER_STATEMENT {
            let values: Vec<String> = (0..PER_STATEMENT)
                .map(|i| format!("v{}", chunk * PER_STATEMENT + i))
                .collect();
            conn.prepare_cached(&insert_many)
                .expect("prepare")
                .execute(rusqlite::params_from_iter(values))
                .expect("insert");
        }
        conn.execute_batch("COMMIT").expect("commit");
        let batched = since(start);
        println!(
            "| {round} | {} / {} µs | {} / {} µs | **{} µs** |",
            per_row(single.0, rows),
            per_row(single.1, rows),
            per_row(batched.0, rows),
            per_row(batched.1, rows),
            per_row(single.0.saturating_sub(batched.0), rows),
        );
    }
    let transactions = rows / 4;
    println!();
    println!("{transactions} transactions of one insert per measurement");
    println!("| round | CPU / wall per transaction |");
    println!("|---|---|");
    for round in 0..5 {
        let start = now();
        for i in 0..transactions {
            conn.execute_batch("BEGIN").expect("begin");
            conn.prepare_cached("INSERT INTO t (v) VALUES (?1)")
                .expect("prepare")
                .execute([format!("t{i}")])
                .expect("insert");
            conn.execute_batch("COMMIT").expect("commit");
        }
        let spent = since(start);
        println!(
            "| {round} | {} / {} µs |",
            per_row(spent.0, transactions),
            per_row(spent.1, transactions),
        );
    }
}

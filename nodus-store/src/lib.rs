//! Store backends for Nodus, behind the [`nodus_core::Store`] trait.
//!
//! - [`MemoryStore`]: everything in memory, for tests, examples and single-process use (kept
//!   in nodus-core, re-exported here).
//! - [`SqliteStore`] (feature `sqlite`): the embedded default, one file in WAL mode with
//!   `synchronous = FULL`, for one process.
//! - [`PostgresStore`] (feature `postgres`): several replicas on one database, runs claimed
//!   with leases (`FOR UPDATE SKIP LOCKED`), changes over `LISTEN/NOTIFY`.
//! - `conformance` (with the `test-util` feature): the one test suite every backend passes,
//!   so that all backends agree on versions, batches, journals, leases and fencing, inboxes,
//!   run rewrites (retention's primitive) and change notification.
//!
//! The SQL backends migrate their schema on open, bind every value (selector paths too), keep
//! documents as exact JSON text (money is never a float), group-commit writes, and
//! map database failures to `Error::Unavailable` (retryable) or `Error::Corrupt`.

#[cfg(any(feature = "sqlite", feature = "postgres"))]
mod commit;
#[cfg(feature = "postgres")]
mod dialect;
#[cfg(feature = "postgres")]
pub mod postgres;
#[cfg(feature = "postgres")]
mod reads;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
mod sql;
#[cfg(feature = "sqlite")]
pub mod sqlite;

#[cfg(any(test, feature = "test-util"))]
pub mod conformance;
#[cfg(all(test, feature = "sqlite", feature = "postgres"))]
mod fuzz;

/// The in-memory store lives in nodus-core (the default store of its `Deps::builder`); it is
/// here too, beside the other backends, and runs the same conformance suite.
pub use nodus_core::store::MemoryStore;
#[cfg(feature = "postgres")]
pub use postgres::{PostgresOptions, PostgresStore};
#[cfg(feature = "sqlite")]
pub use sqlite::SqliteStore;

#[cfg(test)]
mod tests {
    //! The conformance suite, run against [`MemoryStore`].

    use crate::conformance;
    use nodus_core::store::MemoryStore;

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn run_all() {
        conformance::run_all(MemoryStore::new).await;
    }

    #[tokio::test]
    async fn create_get_list_update_delete() {
        conformance::create_get_list_update_delete(MemoryStore::new()).await;
    }

    #[tokio::test]
    async fn list_selectors() {
        conformance::list_selectors(MemoryStore::new()).await;
    }

    #[tokio::test]
    async fn list_sparse_known() {
        conformance::list_sparse_known(MemoryStore::new()).await;
    }

    #[tokio::test]
    async fn list_pages() {
        conformance::list_pages(MemoryStore::new()).await;
    }

    #[tokio::test]
    async fn group_phases() {
        conformance::group_phases(MemoryStore::new()).await;
    }

    #[tokio::test]
    async fn optimistic_concurrency() {
        conformance::optimistic_concurrency(MemoryStore::new()).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn concurrent_writers() {
        conformance::concurrent_writers(MemoryStore::new()).await;
    }

    #[tokio::test]
    async fn concurrent_writers_on_one_thread() {
        conformance::concurrent_writers(MemoryStore::new()).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn atomic_edits() {
        conformance::atomic_edits(MemoryStore::new()).await;
    }

    #[tokio::test]
    async fn batch_atomicity_and_order() {
        conformance::batch_atomicity_and_order(MemoryStore::new()).await;
    }

    #[tokio::test]
    async fn idempotent_batches() {
        conformance::idempotent_batches(MemoryStore::new()).await;
    }

    #[tokio::test]
    async fn capped_batches() {
        conformance::capped_batches(MemoryStore::new()).await;
    }

    #[tokio::test]
    async fn closed_groups() {
        conformance::closed_groups(MemoryStore::new()).await;
    }

    #[tokio::test]
    async fn journal_in_order() {
        conformance::journal_in_order(MemoryStore::new()).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn complete_step_with_a_document() {
        conformance::complete_step_with_a_document(MemoryStore::new()).await;
    }

    #[tokio::test]
    async fn complete_step_with_a_snapshot() {
        conformance::complete_step_with_a_snapshot(MemoryStore::new()).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn complete_step_with_the_next_step() {
        conformance::complete_step_with_the_next_step(MemoryStore::new()).await;
    }

    #[tokio::test]
    async fn fencing() {
        conformance::fencing(MemoryStore::new()).await;
    }

    #[tokio::test]
    async fn messages() {
        conformance::messages(MemoryStore::new()).await;
    }

    #[tokio::test]
    async fn change_notification() {
        conformance::change_notification(MemoryStore::new()).await;
    }

    #[tokio::test]
    async fn delete_removes_journal_and_inbox() {
        conformance::delete_removes_journal_and_inbox(MemoryStore::new()).await;
    }

    #[tokio::test]
    async fn money_exact() {
        conformance::money_exact(MemoryStore::new()).await;
    }

    #[tokio::test]
    async fn leases() {
        conformance::leases(MemoryStore::new()).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn replicas_racing() {
        conformance::replicas_racing(MemoryStore::new()).await;
    }

    #[tokio::test]
    async fn retention() {
        conformance::retention(MemoryStore::new()).await;
    }

    #[tokio::test]
    async fn rewrite_run() {
        conformance::rewrite_run(MemoryStore::new()).await;
    }

    #[tokio::test]
    async fn extension_kinds() {
        conformance::extension_kinds(MemoryStore::new()).await;
    }
}

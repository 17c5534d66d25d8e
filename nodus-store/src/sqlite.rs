//! The SQLite [`Store`]: the embedded default, one file, for **one process**.
//!
//! The file is in WAL mode with `synchronous = FULL`, so a write is acknowledged only after
//! it reached the disk and survives a power cut. All writes go through one connection (SQLite
//! allows one writer at a time), reads through a small pool that WAL lets run beside it.
//! Statements run synchronously (rusqlite, `db`): a read on the calling thread, a write with
//! the writer connection on the runtime's blocking pool, a whole transaction at a time.
//! Every write but batches of creates, deletes, messages and rewrites (journal writes, single
//! creates, document updates and edits, leases) is group-committed (see [`crate::commit`]).
//! Leases and fences are kept in the file like everywhere else, but change notification is an in-process
//! channel: a second process on the same file would not see this one's changes, so run one
//! process per file and use Postgres for several replicas.
//!
//! Opening refuses a file that is not a SQLite database, and a SQLite database of another
//! application (one without Nodus's `application_id` that already has tables), with a clear
//! message, before writing anything to it.
//!
//! Its modules mirror the Postgres store's: `open` (the file, pragmas, migrations), `db` (the
//! connections, `WriteTx`, errors, built statements), `reads`, `writer` (the one writer task
//! and its group commit), `journal` (with `batch`), `documents`, `leases`, `inbox`,
//! `snapshots` and `notifications`.

use std::collections::HashMap;
use std::num::NonZeroUsize;
use std::sync::Arc;

use async_trait::async_trait;
use jiff::Timestamp;
use nodus_core::journal::{Completion, Step};
use nodus_core::resource::Kind;
use nodus_core::snapshot::{Blob, Snapshot, Stored};
use nodus_core::store::{
    Change, Delivery, Edit, Error, Fence, InboxMessage, Lease, MemberCap, ObjectKey,
    OutcomeWritten, Page, Position, Record, RunRewrite, Seen, Selector, Sparse, Store, WithOutcome,
};
use serde_json::Value;
use tokio::sync::broadcast;

use crate::commit::GroupCommit;

mod batch;
mod db;
mod documents;
mod inbox;
mod journal;
mod leases;
mod notifications;
mod open;
mod reads;
mod snapshots;
mod write;
mod writer;

pub use open::APPLICATION_ID;

/// A store in one SQLite file. Cloning is cheap; clones share the connections and the change
/// channel.
#[derive(Debug, Clone)]
pub struct SqliteStore {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    /// The connections and the change channel.
    db: Arc<db::Db>,
    /// Every write but batches of creates, deletes, messages and rewrites, group-committed: under load many runs' steps,
    /// status writes, account edits and leases share one durable commit.
    writes: GroupCommit<write::Write, write::Written>,
}

impl SqliteStore {
    /// Run `read` on the calling thread with a reader connection.
    fn read<T>(
        &self,
        read: impl FnOnce(&rusqlite::Connection) -> Result<T, Error>,
    ) -> Result<T, Error> {
        self.inner.db.read(read)
    }
}

#[async_trait]
impl Store for SqliteStore {
    async fn create(&self, key: &ObjectKey, document: Value) -> Result<Record, Error> {
        documents::create(self, key, document, Vec::new()).await
    }

    async fn create_batch_within(
        &self,
        items: Vec<(ObjectKey, Value)>,
        idempotency_key: Option<&str>,
        caps: &[MemberCap],
    ) -> Result<Vec<Record>, Error> {
        documents::create_batch(self, items, idempotency_key, caps).await
    }

    async fn get(&self, key: &ObjectKey) -> Result<Record, Error> {
        self.read(|conn| reads::record(conn, key))
    }

    async fn list(
        &self,
        project: &str,
        kind: Kind,
        selector: &Selector,
    ) -> Result<Vec<Record>, Error> {
        self.read(|conn| reads::list(conn, project, kind, selector))
    }

    async fn list_page(
        &self,
        project: &str,
        kind: Kind,
        selector: &Selector,
        after: Option<Position>,
        limit: NonZeroUsize,
    ) -> Result<Page, Error> {
        self.read(|conn| reads::list_page(conn, project, kind, selector, after, limit))
    }

    async fn list_sparse(
        &self,
        project: &str,
        kind: Kind,
        selector: &Selector,
        paths: &[&str],
    ) -> Result<Vec<Record>, Error> {
        documents::list_sparse(self, project, kind, selector, paths).await
    }

    async fn list_sparse_known(
        &self,
        project: &str,
        kind: Kind,
        selector: &Selector,
        paths: &[&str],
        known: &HashMap<String, Seen>,
    ) -> Result<Vec<Sparse>, Error> {
        documents::list_sparse_known(self, project, kind, selector, paths, known).await
    }

    async fn projects(&self) -> Result<Vec<String>, Error> {
        self.read(reads::projects)
    }

    async fn group_phases(
        &self,
        project: &str,
        group: &str,
    ) -> Result<Vec<(Option<String>, u64)>, Error> {
        self.read(|conn| reads::group_phases(conn, project, group))
    }

    async fn update(
        &self,
        key: &ObjectKey,
        expected_version: u64,
        document: Value,
    ) -> Result<Record, Error> {
        documents::update(self, key, expected_version, document).await
    }

    async fn modify(&self, key: &ObjectKey, edit: Edit) -> Result<Record, Error> {
        documents::modify(self, key, edit).await
    }

    async fn delete(&self, key: &ObjectKey) -> Result<(), Error> {
        documents::delete(self, key).await
    }

    async fn claim(&self, run_uid: &str, lease: &Lease) -> Result<Fence, Error> {
        leases::claim(self, run_uid, lease).await
    }

    async fn renew(&self, run_uid: &str, fence: Fence, lease: &Lease) -> Result<(), Error> {
        leases::renew(self, run_uid, fence, lease).await
    }

    async fn release(&self, run_uid: &str, fence: Fence) -> Result<(), Error> {
        leases::release(self, run_uid, fence).await
    }

    async fn append_step(&self, run_uid: &str, fence: Fence, step: &Step) -> Result<(), Error> {
        journal::append_step(self, run_uid, fence, step).await
    }

    async fn complete_step(
        &self,
        run_uid: &str,
        fence: Fence,
        seq: u32,
        completion: &Completion,
    ) -> Result<(), Error> {
        journal::complete_step(self, run_uid, fence, seq, completion).await
    }

    async fn complete_step_with(
        &self,
        run_uid: &str,
        fence: Fence,
        seq: u32,
        completion: &Completion,
        with: WithOutcome<'_>,
    ) -> Result<OutcomeWritten, Error> {
        journal::complete_step_with(self, run_uid, fence, seq, completion, with).await
    }

    async fn journal(&self, run_uid: &str) -> Result<Vec<Step>, Error> {
        self.read(|conn| reads::journal(conn, run_uid))
    }

    async fn post_message(
        &self,
        run: &ObjectKey,
        expected_version: u64,
        key: Option<&str>,
        payload: &str,
        at: Timestamp,
    ) -> Result<Delivery, Error> {
        inbox::post_message(self, run, expected_version, key, payload, at).await
    }

    async fn inbox(&self, run_uid: &str) -> Result<Vec<InboxMessage>, Error> {
        self.read(|conn| reads::inbox(conn, run_uid))
    }

    async fn rewrite_run(&self, rewrite: RunRewrite) -> Result<Record, Error> {
        documents::rewrite_run(self, rewrite).await
    }

    async fn put_snapshot(
        &self,
        run_uid: &str,
        seq: u32,
        snapshot: &Stored,
        blobs: &[Blob],
    ) -> Result<(), Error> {
        snapshots::put_snapshot(self, run_uid, seq, snapshot, blobs).await
    }

    async fn missing_blobs(&self, digests: &[String]) -> Result<Vec<String>, Error> {
        self.read(|conn| reads::missing_blobs(conn, digests))
    }

    async fn snapshots(&self, run_uid: &str) -> Result<Vec<(u32, Snapshot)>, Error> {
        self.read(|conn| reads::snapshots(conn, run_uid))
    }

    async fn blob(&self, digest: &str) -> Result<Option<Vec<u8>>, Error> {
        self.read(|conn| reads::blob(conn, digest))
    }

    async fn delete_snapshots(&self, run_uid: &str) -> Result<(), Error> {
        snapshots::delete_snapshots(self, run_uid).await
    }

    async fn blob_bytes(&self) -> Result<u64, Error> {
        self.read(reads::blob_bytes)
    }

    fn subscribe(&self) -> broadcast::Receiver<Change> {
        self.changes()
    }
}

#[cfg(test)]
mod tests;

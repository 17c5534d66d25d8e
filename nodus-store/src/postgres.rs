//! The Postgres [`Store`]: several server replicas on one database.
//!
//! Runs are claimed with leases: every lease change is one conditional statement on the run's
//! lease row, so two replicas never both hold a run; journal writes lock that row (`FOR SHARE`)
//! and check the fence, so a replica whose lease was taken over cannot write. Journal writes are group-committed (see
//! [`crate::commit`]): many runs' steps share one transaction, each acknowledged after commit.
//! Changes are announced with `pg_notify` inside the writing transaction (delivered on
//! commit, in commit order) and heard by one `LISTEN` connection per store; notifications
//! sent while that connection is being re-established are lost, so waiters should also
//! re-read on a timer.
//!
//! Documents are `json`, kept exactly as written. The schema is versioned and migrated on
//! connect; each store lives in one Postgres schema (`nodus` by default).

//!
//! Its modules mirror the SQLite store's: `open` (options, schema, migrations), `transaction`
//! (a write transaction that owns its notifications), `journal`, `documents`, `leases`,
//! `inbox` and `notifications`.

use std::collections::HashMap;
use std::num::NonZeroUsize;
use std::sync::Arc;

use async_trait::async_trait;
use jiff::Timestamp;
use nodus_core::journal::{Completion, Step};
use nodus_core::resource::Kind;
use nodus_core::snapshot::{Blob, Snapshot, Stored};
use nodus_core::store::{
    Change, Delivery, Edit, Error, Fence, InboxMessage, Lease, MemberCap, ObjectKey, Page,
    Position, Record, RunRewrite, Seen, Selector, Sparse, Store,
};
use serde_json::Value;
use sqlx::postgres::PgPool;
use tokio::sync::{broadcast, oneshot};

use crate::commit::GroupCommit;
use crate::reads::{Lock, Reads};

/// The shared reads, on Postgres.
type Read = Reads<sqlx::Postgres>;

mod documents;
mod inbox;
mod journal;
mod leases;
mod notifications;
mod open;
mod snapshots;
mod transaction;

pub use open::PostgresOptions;

/// A store in a Postgres schema. Cloning is cheap; clones share the pool, the listener and
/// the change channel.
#[derive(Debug, Clone)]
pub struct PostgresStore {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    pool: PgPool,
    /// Where writes announce their changes.
    notifier: Arc<notifications::Notifier>,
    journal: GroupCommit,
    /// Atomic edits ([`Store::modify`]), group-committed: many runs' reservations on one
    /// account share one transaction, which holds the account's row lock once.
    edits: GroupCommit<documents::EditWrite, Record>,
    changes: broadcast::Sender<Change>,
    /// Dropped with the store, which stops the listener task.
    _stop_listening: oneshot::Sender<()>,
}

#[async_trait]
impl Store for PostgresStore {
    async fn create(&self, key: &ObjectKey, document: Value) -> Result<Record, Error> {
        documents::create(self, key, document).await
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
        Read::record(&self.inner.pool, key, Lock::None).await
    }

    async fn list(
        &self,
        project: &str,
        kind: Kind,
        selector: &Selector,
    ) -> Result<Vec<Record>, Error> {
        Read::list(&self.inner.pool, project, kind, selector).await
    }

    async fn list_page(
        &self,
        project: &str,
        kind: Kind,
        selector: &Selector,
        after: Option<Position>,
        limit: NonZeroUsize,
    ) -> Result<Page, Error> {
        Read::list_page(&self.inner.pool, project, kind, selector, after, limit).await
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
        Read::projects(&self.inner.pool).await
    }

    async fn group_phases(
        &self,
        project: &str,
        group: &str,
    ) -> Result<Vec<(Option<String>, u64)>, Error> {
        Read::group_phases(&self.inner.pool, project, group).await
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

    async fn journal(&self, run_uid: &str) -> Result<Vec<Step>, Error> {
        Read::journal(&self.inner.pool, run_uid).await
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
        Read::inbox(&self.inner.pool, run_uid).await
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
        Read::missing_blobs(&self.inner.pool, digests).await
    }

    async fn snapshots(&self, run_uid: &str) -> Result<Vec<(u32, Snapshot)>, Error> {
        Read::snapshots(&self.inner.pool, run_uid).await
    }

    async fn blob(&self, digest: &str) -> Result<Option<Vec<u8>>, Error> {
        Read::blob(&self.inner.pool, digest).await
    }

    async fn delete_snapshots(&self, run_uid: &str) -> Result<(), Error> {
        snapshots::delete_snapshots(self, run_uid).await
    }

    async fn blob_bytes(&self) -> Result<u64, Error> {
        Read::blob_bytes(&self.inner.pool).await
    }

    fn subscribe(&self) -> broadcast::Receiver<Change> {
        self.changes()
    }
}

#[cfg(test)]
mod tests;

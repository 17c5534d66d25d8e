//! The journal's writer over a store that fails: a failed write is tried again a bounded
//! number of times with growing pauses, then its records are given up and counted.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use serde_json::Value;

use super::*;
use crate::journal::{Completion, Step};
use crate::snapshot::{Blob, Snapshot, Stored};
use crate::store::{
    Change, Delivery, Error, Fence, InboxMessage, Lease, MemoryStore, Page, Position, Record,
    RunRewrite, Selector,
};

/// A [`MemoryStore`] whose reads fail (unavailable, or corrupt) while `failing` counts down;
/// only what the egress log uses is served, the rest is refused.
struct FailingStore {
    inner: MemoryStore,
    failing: AtomicU32,
    retryable: bool,
    gets: AtomicU32,
}

impl FailingStore {
    fn new(failing: u32, retryable: bool) -> Self {
        FailingStore {
            inner: MemoryStore::new(),
            failing: AtomicU32::new(failing),
            retryable,
            gets: AtomicU32::new(0),
        }
    }
}

fn refused() -> Error {
    Error::Invalid("not used by the egress log".to_string())
}

#[async_trait]
impl Store for FailingStore {
    async fn create(&self, key: &ObjectKey, document: Value) -> Result<Record, Error> {
        self.inner.create(key, document).await
    }
    async fn create_batch_within(
        &self,
        _: Vec<(ObjectKey, Value)>,
        _: Option<&str>,
        _: &[crate::store::MemberCap],
    ) -> Result<Vec<Record>, Error> {
        Err(refused())
    }
    async fn get(&self, key: &ObjectKey) -> Result<Record, Error> {
        self.gets.fetch_add(1, Ordering::SeqCst);
        let left = self.failing.load(Ordering::SeqCst);
        if left > 0 {
            self.failing.store(left - 1, Ordering::SeqCst);
            return Err(if self.retryable {
                Error::Unavailable("the database restarts".to_string())
            } else {
                Error::Corrupt("a broken page".to_string())
            });
        }
        self.inner.get(key).await
    }
    async fn list(&self, _: &str, _: Kind, _: &Selector) -> Result<Vec<Record>, Error> {
        Err(refused())
    }
    async fn list_page(
        &self,
        _: &str,
        _: Kind,
        _: &Selector,
        _: Option<Position>,
        _: std::num::NonZeroUsize,
    ) -> Result<Page, Error> {
        Err(refused())
    }
    async fn list_sparse_known(
        &self,
        _: &str,
        _: Kind,
        _: &Selector,
        _: &[&str],
        _: &std::collections::HashMap<String, crate::store::Seen>,
    ) -> Result<Vec<crate::store::Sparse>, Error> {
        Err(refused())
    }
    async fn projects(&self) -> Result<Vec<String>, Error> {
        Err(refused())
    }
    async fn update(
        &self,
        key: &ObjectKey,
        version: u64,
        document: Value,
    ) -> Result<Record, Error> {
        self.inner.update(key, version, document).await
    }
    async fn delete(&self, key: &ObjectKey) -> Result<(), Error> {
        self.inner.delete(key).await
    }
    async fn claim(&self, _: &str, _: &Lease) -> Result<Fence, Error> {
        Err(refused())
    }
    async fn renew(&self, _: &str, _: Fence, _: &Lease) -> Result<(), Error> {
        Err(refused())
    }
    async fn release(&self, _: &str, _: Fence) -> Result<(), Error> {
        Err(refused())
    }
    async fn append_step(&self, _: &str, _: Fence, _: &Step) -> Result<(), Error> {
        Err(refused())
    }
    async fn complete_step(&self, _: &str, _: Fence, _: u32, _: &Completion) -> Result<(), Error> {
        Err(refused())
    }
    async fn journal(&self, _: &str) -> Result<Vec<Step>, Error> {
        Err(refused())
    }
    async fn post_message(
        &self,
        _: &ObjectKey,
        _: u64,
        _: Option<&str>,
        _: &str,
        _: jiff::Timestamp,
    ) -> Result<Delivery, Error> {
        Err(refused())
    }
    async fn inbox(&self, _: &str) -> Result<Vec<InboxMessage>, Error> {
        Err(refused())
    }
    async fn rewrite_run(&self, _: RunRewrite) -> Result<Record, Error> {
        Err(refused())
    }
    async fn put_snapshot(&self, _: &str, _: u32, _: &Stored, _: &[Blob]) -> Result<(), Error> {
        Err(refused())
    }
    async fn missing_blobs(&self, _: &[String]) -> Result<Vec<String>, Error> {
        Err(refused())
    }
    async fn snapshots(&self, _: &str) -> Result<Vec<(u32, Snapshot)>, Error> {
        Err(refused())
    }
    async fn blob(&self, _: &str) -> Result<Option<Vec<u8>>, Error> {
        Err(refused())
    }
    async fn delete_snapshots(&self, _: &str) -> Result<(), Error> {
        Err(refused())
    }
    async fn blob_bytes(&self) -> Result<u64, Error> {
        Err(refused())
    }
    fn subscribe(&self) -> tokio::sync::broadcast::Receiver<Change> {
        self.inner.subscribe()
    }
}

fn record(host: &str) -> EgressRecord {
    EgressRecord {
        time: "2026-12-01T00:00:00Z".into(),
        host: host.into(),
        port: 443,
        address: None,
        verdict: "allowed".into(),
        rule: "spec.network.allow[0]".into(),
        bytes_out: 1,
        bytes_in: 1,
        duration_ms: 1,
    }
}

const QUICK: Retries = Retries {
    attempts: 4,
    first_pause: Duration::from_millis(1),
    max_pause: Duration::from_millis(4),
};

#[test]
fn retries_pause_longer_each_time_up_to_the_last_attempt() {
    let ms = Duration::from_millis;
    // (attempt, whether a retry can help): the pause before it.
    let cases = [
        (1, true, None),
        (2, true, Some(ms(400))),
        (3, true, Some(ms(800))),
        (4, true, Some(ms(1600))),
        (5, true, Some(ms(3200))),
        (6, true, None),
        (2, false, None),
    ];
    for (attempt, retryable, pause) in cases {
        assert_eq!(
            Retries::DEFAULT.pause_before(attempt, retryable),
            pause,
            "attempt {attempt}, retryable {retryable}"
        );
    }
    let capped = Retries {
        attempts: 100,
        ..Retries::DEFAULT
    };
    assert_eq!(
        capped.pause_before(60, true),
        Some(Retries::DEFAULT.max_pause)
    );
}

#[tokio::test]
async fn a_write_that_fails_a_while_is_tried_again_and_kept() {
    let store = Arc::new(FailingStore::new(2, true));
    let journal = EgressJournal::new(store.clone()).with_retries(QUICK);
    journal.record("uid", record("a.test"));
    let log = journal
        .settled("uid")
        .await
        .expect("written at the third attempt");
    assert_eq!(log.records, [record("a.test")]);
    assert_eq!(journal.records_lost(), 0);
}

#[tokio::test]
async fn a_write_that_keeps_failing_is_given_up_and_counted() {
    for (retryable, attempts) in [(true, QUICK.attempts), (false, 1)] {
        let store = Arc::new(FailingStore::new(u32::MAX, retryable));
        let journal = EgressJournal::new(store.clone()).with_retries(QUICK);
        journal.record("uid", record("a.test"));
        journal.record("uid", record("b.test"));
        // The writer gives up (the read after it fails too: the store is still down).
        assert!(journal.settled("uid").await.is_err());
        assert_eq!(journal.records_lost(), 2, "retryable {retryable}");
        // Each attempt reads the log's head once, and one read is `settled`'s own; the two
        // records went as one batch, or as two.
        let gets = store.gets.load(Ordering::SeqCst);
        assert!(
            gets == attempts + 1 || gets == 2 * attempts + 1,
            "retryable {retryable}: {gets} reads"
        );
    }
}

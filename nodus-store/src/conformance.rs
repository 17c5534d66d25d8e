//! The conformance suite every [`Store`] backend passes: one public async function per case,
//! and [`run_all`] to run them all.
//!
//! Each case takes a fresh store and fails by panicking, like any test. Cases use their own
//! projects, run uids and idempotency keys (unique per process and call), so they can share a
//! database with each other and with earlier runs of the suite, and they accept change
//! notifications about other projects. A backend runs the suite like this:
//!
//! ```text
//! #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
//! async fn conformance() {
//!     nodus_store::conformance::run_all(MyStore::new).await;
//! }
//! ```

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use jiff::Timestamp;
use nodus_core::Store;
use nodus_core::journal::{Completion, Intent, Outcome, Step};
use nodus_core::resource::Kind;
use nodus_core::store::{Change, Fence, InboxMessage, Lease, ObjectKey, Record, Selector};
use serde_json::{Value, json};
use tokio::sync::broadcast;

mod documents;
mod joins;
mod journal;
mod leases;
mod retention;
mod snapshots;
mod step_kept;
mod step_next;
mod step_then;
mod writes;

pub use documents::{
    create_get_list_update_delete, group_phases, list_pages, list_selectors, list_sparse_known,
    money_exact,
};
pub use joins::{capped_batches, closed_groups};
pub use journal::{
    change_notification, delete_removes_journal_and_inbox, fencing, journal_in_order, messages,
};
pub use leases::{leases, replicas_racing};
pub use retention::{retention, rewrite_run};
pub use snapshots::{snapshot_deltas, snapshots};
pub use step_kept::complete_step_with_a_snapshot;
pub use step_next::complete_step_with_the_next_step;
pub use step_then::complete_step_with_a_document;
pub use writes::{
    atomic_edits, batch_atomicity_and_order, concurrent_writers, extension_kinds,
    idempotent_batches, optimistic_concurrency,
};

/// How long a case waits for something that should happen at once (a change notification,
/// racing tasks to finish) before it fails instead of hanging.
const PATIENCE: Duration = Duration::from_secs(30);

/// Run every case, each on a store of its own from `make`.
pub async fn run_all<S: Store + Clone + 'static>(make: impl Fn() -> S) {
    create_get_list_update_delete(make()).await;
    list_selectors(make()).await;
    list_sparse_known(make()).await;
    list_pages(make()).await;
    group_phases(make()).await;
    optimistic_concurrency(make()).await;
    concurrent_writers(make()).await;
    atomic_edits(make()).await;
    batch_atomicity_and_order(make()).await;
    idempotent_batches(make()).await;
    capped_batches(make()).await;
    closed_groups(make()).await;
    journal_in_order(make()).await;
    complete_step_with_a_document(make()).await;
    complete_step_with_a_snapshot(make()).await;
    complete_step_with_the_next_step(make()).await;
    fencing(make()).await;
    messages(make()).await;
    change_notification(make()).await;
    delete_removes_journal_and_inbox(make()).await;
    money_exact(make()).await;
    leases(make()).await;
    replicas_racing(make()).await;
    retention(make()).await;
    rewrite_run(make()).await;
    extension_kinds(make()).await;
    snapshots(make()).await;
    snapshot_deltas(make()).await;
}

// --- helpers ---

/// Lease owners: replicas of a test.
const OWNER_A: &str = "replica-a";
const OWNER_B: &str = "replica-b";

/// A fixed instant plus `second`s: leases use the caller's clock, so cases control it.
fn time(second: i64) -> Timestamp {
    Timestamp::from_second(1_700_000_000 + second).expect("a timestamp")
}

/// A 30-second lease for `owner` asked for at `time(at)`.
fn lease(owner: &str, at: i64) -> Lease {
    Lease::new(owner, time(at), Duration::from_secs(30))
}

/// A name no other case, call or process uses: `prefix-<pid>-<time>-<counter>`.
fn unique(prefix: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() % 1_000_000_000_000);
    format!(
        "{prefix}-{}-{nanos}-{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

/// An AgentRun document as the server would store it.
fn run_document(name: &str, uid: &str) -> Value {
    shaped_run(name, uid, &[("app", "conformance")], None, "Pending")
}

fn shaped_run(
    name: &str,
    uid: &str,
    labels: &[(&str, &str)],
    group: Option<&str>,
    phase: &str,
) -> Value {
    let labels: serde_json::Map<String, Value> = labels
        .iter()
        .map(|(k, v)| (k.to_string(), json!(v)))
        .collect();
    let mut spec = json!({
        "agent": "helper",
        "input": format!("say hello to {name}"),
        "keepAlive": false,
    });
    if let Some(group) = group {
        spec["group"] = json!(group);
    }
    json!({
        "apiVersion": "nodus.dev/v1",
        "kind": "AgentRun",
        "metadata": {
            "name": name,
            "uid": uid,
            "labels": labels,
            "creationTimestamp": "2024-01-01T00:00:00Z",
        },
        "spec": spec,
        "status": { "phase": phase },
    })
}

fn agent_document(name: &str) -> Value {
    json!({
        "apiVersion": "nodus.dev/v1",
        "kind": "Agent",
        "metadata": { "name": name, "uid": unique("uid"), "labels": { "team": "red" } },
        "spec": { "systemPrompt": "You help.", "model": { "access": "platform" } },
        "status": { "state": "Ready" },
    })
}

fn selector(labels: &[(&str, &str)], fields: &[(&str, &str)]) -> Selector {
    let map = |pairs: &[(&str, &str)]| {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    Selector {
        labels: map(labels),
        fields: map(fields),
    }
}

/// The names `list` returns, in order, checked against each document's `metadata.name`.
async fn names<S: Store>(store: &S, project: &str, kind: Kind, selector: &Selector) -> Vec<String> {
    let records = store.list(project, kind, selector).await.expect("list");
    records
        .into_iter()
        .map(|record| {
            assert_eq!(record.key.project, project);
            assert_eq!(record.key.kind, kind);
            assert_eq!(record.document["metadata"]["name"], json!(record.key.name));
            record.key.name
        })
        .collect()
}

/// A run created as `name` in `project` (a fresh uid), claimed by [`OWNER_A`], with its step
/// 0 (a routing) appended: its uid, key, record as created and fence.
async fn routing_run<S: Store>(
    store: &S,
    project: &str,
    name: &str,
) -> (String, ObjectKey, Record, Fence) {
    let uid = unique("uid");
    let key = ObjectKey::new(project, Kind::AgentRun, name);
    let created = store
        .create(&key, run_document(name, &uid))
        .await
        .expect("create the run");
    let fence = store.claim(&uid, &lease(OWNER_A, 0)).await.expect("claim");
    store
        .append_step(&uid, fence, &step(0, Intent::Route { turn: 0 }))
        .await
        .expect("append");
    (uid, key, created, fence)
}

fn step(seq: u32, intent: Intent) -> Step {
    Step {
        seq,
        started_at: Timestamp::from_second(1_700_000_000 + i64::from(seq)).expect("a timestamp"),
        intent,
        completion: None,
    }
}

fn completion(seq: u32, outcome: Outcome) -> Completion {
    Completion {
        finished_at: Timestamp::from_second(1_700_000_500 + i64::from(seq)).expect("a timestamp"),
        outcome,
    }
}

fn message(seq: u64, key: Option<&str>, payload: &str, at: Timestamp) -> InboxMessage {
    InboxMessage {
        seq,
        key: key.map(str::to_string),
        payload: payload.to_string(),
        received_at: at,
    }
}

/// The next change about `project`, skipping other projects' (a shared database); fails if
/// none arrives in time or if the subscriber fell behind.
async fn next_change(changes: &mut broadcast::Receiver<Change>, project: &str) -> Change {
    within("a change notification", async {
        loop {
            match changes.recv().await {
                Ok(Change::Written(key, version)) if key.project == project => {
                    return Change::Written(key, version);
                }
                Ok(Change::Deleted(key)) if key.project == project => {
                    return Change::Deleted(key);
                }
                Ok(_) => {}
                Err(e) => panic!("change subscription failed: {e}"),
            }
        }
    })
    .await
}

/// Every task's result, in order; a panic in a task fails the case.
async fn join_all<T: Send + 'static>(tasks: Vec<tokio::task::JoinHandle<T>>) -> Vec<T> {
    within("racing tasks", async {
        let mut results = Vec::with_capacity(tasks.len());
        for task in tasks {
            match task.await {
                Ok(result) => results.push(result),
                Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
                Err(e) => panic!("task failed: {e}"),
            }
        }
        results
    })
    .await
}

async fn within<T>(what: &str, future: impl Future<Output = T>) -> T {
    match tokio::time::timeout(PATIENCE, future).await {
        Ok(value) => value,
        Err(_) => panic!("waited {PATIENCE:?} for {what}"),
    }
}

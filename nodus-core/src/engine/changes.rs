//! The changes of single documents, for the tasks of this process that wait on one (a running
//! command watching its run for a cancellation): one subscriber to the store's notifications
//! hands each change to the watchers of its key only, where every watcher used to wake at
//! every write of the store (a hundred commands at once: a hundred wake-ups per write).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};

use tokio::sync::{broadcast, watch};

use crate::store::{Change, ObjectKey, Store};

/// The watchers of this process, by key, and the task that hands changes out to them.
#[derive(Debug, Default)]
pub(super) struct KeyChanges {
    shared: Arc<Shared>,
}

#[derive(Debug, Default)]
struct Shared {
    watched: Mutex<HashMap<ObjectKey, Watched>>,
    /// Whether the task handing changes out runs (it stops with the runtime it runs on; the
    /// next watch starts it again).
    running: AtomicBool,
}

#[derive(Debug)]
struct Watched {
    watchers: usize,
    /// The highest version of the document notified while it is watched ([`DELETED`] once
    /// deleted or when notifications were lost).
    changed: watch::Sender<u64>,
}

/// What a watch holds once the document was deleted or notifications were lost: later than
/// any version, so that a holder of the document always reads it again.
const DELETED: u64 = u64::MAX;

impl Shared {
    fn watched(&self) -> MutexGuard<'_, HashMap<ObjectKey, Watched>> {
        self.watched.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// One watcher of one key: [`KeyWatch::changed`] resolves after each change of the document
/// (written or deleted) notified since the watch began or since it last resolved, and after
/// notifications were lost (a lagging subscriber), when the document may have changed;
/// [`KeyWatch::notified`] says the highest version notified, so that a holder of the
/// document as read or written after the watch began reads it again only when it is older.
#[derive(Debug)]
pub(super) struct KeyWatch {
    key: ObjectKey,
    shared: Arc<Shared>,
    changed: watch::Receiver<u64>,
}

impl KeyChanges {
    /// Watch `key` from now on: every change notified after this returns is seen.
    pub(super) fn watch(&self, store: &Arc<dyn Store>, key: &ObjectKey) -> KeyWatch {
        let changed = {
            let mut watched = self.shared.watched();
            let entry = watched.entry(key.clone()).or_insert_with(|| Watched {
                watchers: 0,
                changed: watch::channel(0).0,
            });
            entry.watchers += 1;
            entry.changed.subscribe()
        };
        // Subscribed before this returns, so no change after it is missed.
        self.start(store);
        KeyWatch {
            key: key.clone(),
            shared: self.shared.clone(),
            changed,
        }
    }

    /// Start the task that hands changes out, unless it runs (on the current runtime).
    pub(super) fn start(&self, store: &Arc<dyn Store>) {
        if !self.shared.running.swap(true, Ordering::SeqCst) {
            tokio::spawn(hand_out(store.subscribe(), Arc::downgrade(&self.shared)));
        }
    }
}

impl super::Engine {
    /// Start the one task that hands the store's changes to this process's watchers of single
    /// documents (a running command watching its run), as a runner does when it starts, so
    /// that it runs from then on; otherwise the first watch starts it.
    pub fn start_watching_changes(&self) {
        self.key_changes.start(&self.deps.store);
    }
}

impl KeyWatch {
    /// Resolves at the key's next change (see [`KeyWatch`]); never, once the store's
    /// notifications have ended.
    pub(super) async fn changed(&mut self) {
        if self.changed.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }

    /// The highest version of the document notified since the first watch of the key
    /// began (`u64::MAX` once it was deleted or notifications were lost); the changes up to
    /// it count as seen by [`KeyWatch::changed`].
    pub(super) fn notified(&mut self) -> u64 {
        *self.changed.borrow_and_update()
    }

    /// Another watch of the same key that knows what this one was notified of (a running
    /// command's, from its drive's): it resolves at changes after this call only.
    pub(super) fn again(&self) -> KeyWatch {
        if let Some(entry) = self.shared.watched().get_mut(&self.key) {
            entry.watchers += 1;
        }
        let mut changed = self.changed.clone();
        changed.mark_unchanged();
        KeyWatch {
            key: self.key.clone(),
            shared: self.shared.clone(),
            changed,
        }
    }
}

impl Drop for KeyWatch {
    fn drop(&mut self) {
        let mut watched = self.shared.watched();
        if let Some(entry) = watched.get_mut(&self.key) {
            entry.watchers = entry.watchers.saturating_sub(1);
            if entry.watchers == 0 {
                watched.remove(&self.key);
            }
        }
    }
}

/// Clears `running` when the task ends, however it ends (its runtime shut down included).
struct Stopped(Weak<Shared>);

impl Drop for Stopped {
    fn drop(&mut self) {
        if let Some(shared) = self.0.upgrade() {
            shared.running.store(false, Ordering::SeqCst);
        }
    }
}

/// Hand each change to the watchers of its key; after lost notifications, to every watcher.
async fn hand_out(mut changes: broadcast::Receiver<Change>, shared: Weak<Shared>) {
    let _stopped = Stopped(shared.clone());
    loop {
        let change = changes.recv().await;
        let Some(shared) = shared.upgrade() else {
            return;
        };
        let watched = shared.watched();
        match change {
            Ok(Change::Written(key, version)) => {
                if let Some(entry) = watched.get(&key) {
                    entry
                        .changed
                        .send_modify(|notified| *notified = (*notified).max(version));
                }
            }
            Ok(Change::Deleted(key)) => {
                if let Some(entry) = watched.get(&key) {
                    entry.changed.send_replace(DELETED);
                }
            }
            Err(broadcast::error::RecvError::Lagged(_)) => {
                for entry in watched.values() {
                    entry.changed.send_replace(DELETED);
                }
            }
            Err(broadcast::error::RecvError::Closed) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resource::Kind;
    use crate::store::memory::MemoryStore;
    use std::time::Duration;

    fn key(name: &str) -> ObjectKey {
        ObjectKey::new("p", Kind::AgentRun, name)
    }

    async fn resolves(watch: &mut KeyWatch) -> bool {
        tokio::time::timeout(Duration::from_millis(200), watch.changed())
            .await
            .is_ok()
    }

    #[tokio::test]
    async fn a_watch_wakes_for_its_own_key_only_and_is_forgotten_when_dropped() {
        let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
        let changes = KeyChanges::default();
        let mut mine = changes.watch(&store, &key("a"));
        let mut other = changes.watch(&store, &key("b"));
        let document = serde_json::json!({"metadata": {"name": "a"}});
        store
            .create(&key("a"), document.clone())
            .await
            .expect("create");
        assert!(
            resolves(&mut mine).await,
            "a change of its key wakes the watch"
        );
        assert!(
            !resolves(&mut other).await,
            "a change of another key does not"
        );
        assert!(!resolves(&mut mine).await, "each change wakes it once");
        store.delete(&key("a")).await.expect("delete");
        assert!(resolves(&mut mine).await, "a deletion wakes it too");
        drop(mine);
        drop(other);
        assert!(changes.shared.watched().is_empty());
    }

    #[tokio::test]
    async fn a_watch_says_the_highest_version_notified_and_another_one_wakes_only_after_it() {
        let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
        let changes = KeyChanges::default();
        let mut drive = changes.watch(&store, &key("a"));
        assert_eq!(drive.notified(), 0, "nothing notified yet");
        store
            .create(&key("a"), serde_json::json!({}))
            .await
            .expect("create");
        store
            .update(&key("a"), 1, serde_json::json!({"x": 1}))
            .await
            .expect("update");
        assert!(resolves(&mut drive).await);
        assert_eq!(drive.notified(), 2, "the highest version notified");
        let mut command = drive.again();
        assert_eq!(
            command.notified(),
            2,
            "it knows what the first was notified of"
        );
        assert!(
            !resolves(&mut command).await,
            "changes before it do not wake it"
        );
        store
            .update(&key("a"), 2, serde_json::json!({"x": 2}))
            .await
            .expect("update");
        assert!(resolves(&mut command).await, "a later change does");
        assert_eq!(command.notified(), 3);
        store.delete(&key("a")).await.expect("delete");
        assert!(resolves(&mut command).await);
        assert_eq!(
            command.notified(),
            u64::MAX,
            "deleted: later than any version"
        );
        drop(drive);
        assert!(
            !changes.shared.watched().is_empty(),
            "the key stays watched while one of its watches lives"
        );
        drop(command);
        assert!(changes.shared.watched().is_empty());
    }

    #[test]
    fn a_watch_still_sees_changes_after_the_runtime_that_handed_them_out_ended() {
        let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
        let changes = KeyChanges::default();
        let runtime = || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime")
        };
        runtime().block_on(async {
            let mut watch = changes.watch(&store, &key("a"));
            store
                .create(&key("a"), serde_json::json!({}))
                .await
                .expect("create");
            assert!(resolves(&mut watch).await);
        });
        runtime().block_on(async {
            let mut watch = changes.watch(&store, &key("a"));
            store
                .update(&key("a"), 1, serde_json::json!({"x": 1}))
                .await
                .expect("update");
            assert!(resolves(&mut watch).await, "the task was started again");
        });
    }
}

//! One writer per run in this process: a run's drive and a person's resolution of it both
//! claim the run's lease under this process's name, and a second claim by the same owner
//! takes the lease over, so the first's next write would be refused as fenced. They take the
//! run's lock here first, and so come one after the other. (Writers in other processes are
//! kept apart by the lease itself: they claim under other names.) The same keyed locks let
//! one batch at a time join a group in this process (`Engine::joining`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

use tokio::sync::OwnedMutexGuard;

/// Keys (runs some task of this process writes now, groups a batch joins now), each behind its
/// own lock.
#[derive(Debug, Default)]
pub(super) struct KeyedLocks {
    locks: Mutex<HashMap<String, Weak<tokio::sync::Mutex<()>>>>,
    /// How many tasks wait for each run's lock now (for tests that must know a writer is
    /// held back, instead of sleeping).
    waiting: Mutex<HashMap<String, usize>>,
}

/// Counts a task as waiting for a run's lock while it lasts (also when the waiting future is
/// dropped).
struct Waiting<'w> {
    writers: &'w KeyedLocks,
    uid: &'w str,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        let mut waiting = self
            .writers
            .waiting
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(count) = waiting.get_mut(self.uid) {
            *count -= 1;
            if *count == 0 {
                waiting.remove(self.uid);
            }
        }
    }
}

impl KeyedLocks {
    /// Waits until no other task of this process writes the run `uid`, and holds it until the
    /// guard is dropped.
    pub(super) async fn lock(&self, uid: &str) -> OwnedMutexGuard<()> {
        let lock = {
            let mut locks = self
                .locks
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            // Entries whose every guard is gone are dropped here, so the map holds only the
            // runs being written now.
            locks.retain(|_, lock| lock.strong_count() > 0);
            match locks.get(uid).and_then(Weak::upgrade) {
                Some(lock) => lock,
                None => {
                    let lock = Arc::new(tokio::sync::Mutex::new(()));
                    locks.insert(uid.to_string(), Arc::downgrade(&lock));
                    lock
                }
            }
        };
        *self
            .waiting
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .entry(uid.to_string())
            .or_default() += 1;
        let _waiting = Waiting { writers: self, uid };
        lock.lock_owned().await
    }

    /// How many tasks of this process wait now to write the run `uid` (behind the one that
    /// writes it).
    #[cfg(any(test, feature = "test-util"))]
    pub(super) fn waiting(&self, uid: &str) -> usize {
        self.waiting
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .get(uid)
            .copied()
            .unwrap_or(0)
    }

    /// How many runs have an entry (for tests: it falls back to the runs held).
    #[cfg(test)]
    fn entries(&self) -> usize {
        let mut locks = self
            .locks
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        locks.retain(|_, lock| lock.strong_count() > 0);
        locks.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn a_second_writer_of_the_same_run_waits_and_another_run_does_not() {
        let writers = Arc::new(KeyedLocks::default());
        let first = writers.lock("run-a").await;
        // Another run is free at once.
        let other = tokio::time::timeout(Duration::from_secs(5), writers.lock("run-b")).await;
        assert!(other.is_ok(), "another run's lock must not wait");
        drop(other);
        // The same run waits until the first guard is dropped.
        let waiting = {
            let writers = writers.clone();
            tokio::spawn(async move {
                let _guard = writers.lock("run-a").await;
            })
        };
        // Settled: the second writer waits for the lock (it is counted only while it does).
        tokio::time::timeout(Duration::from_secs(5), async {
            while writers.waiting("run-a") != 1 {
                tokio::task::yield_now().await;
            }
        })
        .await
        .expect("the second writer waits for run-a");
        assert!(!waiting.is_finished(), "a second writer of run-a got in");
        assert_eq!(writers.waiting("run-b"), 0);
        drop(first);
        tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("the second writer goes on once the first is done")
            .expect("no panic");
        assert_eq!(
            writers.entries(),
            0,
            "no entry is kept for runs nobody writes"
        );
        assert_eq!(writers.waiting("run-a"), 0, "nobody waits any more");
    }
}

//! Taking a run's working-directory snapshot after a command step: list the sandbox's files,
//! read again only those whose size or time changed since the run's last snapshot, store
//! the contents the store lacks and the manifest, within the run's budget
//! ([`crate::snapshot`] decides; this carries it out).

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

use super::Engine;
use super::execute::Fixed;
use crate::digest::sha256_hex;
use crate::sandbox::{MAX_ARCHIVE_BYTES, SandboxId};
use crate::snapshot::{self, Blob, Budget, Snapshot, Walk};

/// The last snapshot of each run driven on this process, so that the next one compares with
/// it without reading it back from the store.
#[derive(Default)]
pub(super) struct LastSnapshots(Mutex<HashMap<String, Snapshot>>);

impl LastSnapshots {
    fn get(&self, uid: &str) -> Option<Snapshot> {
        self.lock().get(uid).cloned()
    }

    fn put(&self, uid: &str, snapshot: Snapshot) {
        self.lock().insert(uid.to_string(), snapshot);
    }

    /// Forget a run (it finished, or its drive ended).
    pub(super) fn forget(&self, uid: &str) {
        self.lock().remove(uid);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Snapshot>> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl Engine {
    /// Record the run's working directory after its command step `seq`: taken, over the
    /// budget, or failed (with the reason), never an error for the run: a snapshot only
    /// decides whether the step can be forked from.
    pub(super) async fn take_snapshot(&self, fixed: &Fixed, sandbox: &SandboxId, seq: u32) {
        let Some(budget) = self.config.snapshots else {
            return;
        };
        let last = match self.last_snapshots.get(&fixed.uid) {
            Some(last) => Some(last),
            None => match self.deps.store.snapshots(&fixed.uid).await {
                Ok(all) => all.into_iter().next_back().map(|(_, s)| s),
                Err(e) => {
                    tracing::warn!(run = %fixed.key, error = %e, "cannot read the run's last snapshot");
                    None
                }
            },
        };
        let (snapshot, blobs) = match self.walk(sandbox, last.as_ref(), budget).await {
            Ok(taken) => taken,
            Err(error) => (
                Snapshot::Failed {
                    error,
                    used_bytes: last.as_ref().map_or(0, Snapshot::used_bytes),
                },
                Vec::new(),
            ),
        };
        let stored = self
            .retrying(|| {
                self.deps
                    .store
                    .put_snapshot(&fixed.uid, seq, &snapshot, &blobs)
            })
            .await;
        match stored {
            Ok(()) => self.last_snapshots.put(&fixed.uid, snapshot),
            Err(e) => {
                tracing::warn!(run = %fixed.key, step = seq, error = %e, "cannot store the working directory's snapshot; the step is not forkable");
                self.last_snapshots.forget(&fixed.uid);
            }
        }
    }

    /// Walk the sandbox: the snapshot and the contents the store lacks, or why it failed.
    async fn walk(
        &self,
        sandbox: &SandboxId,
        last: Option<&Snapshot>,
        budget: Budget,
    ) -> Result<(Snapshot, Vec<Blob>), String> {
        let previous = last.and_then(Snapshot::manifest);
        let stats = self
            .deps
            .sandbox
            .list_files(sandbox)
            .await
            .map_err(|e| e.to_string())?;
        let planned = snapshot::plan(previous, &stats);
        let sizes: BTreeMap<&str, u64> = stats.iter().map(|s| (s.path.as_str(), s.size)).collect();
        let wanted: u64 = planned.iter().map(|p| sizes[p.as_str()]).sum();
        let used = match budget.spend(last, wanted) {
            Ok(used) => used,
            Err(over) => return Ok((over, Vec::new())),
        };
        let mut walk = Walk {
            stats,
            read: BTreeMap::new(),
        };
        let mut blobs: BTreeMap<String, Vec<u8>> = BTreeMap::new();
        for path in planned {
            let tar = self
                .deps
                .sandbox
                .get_files(sandbox, &path, MAX_ARCHIVE_BYTES)
                .await
                .map_err(|e| format!("reading {path:?}: {e}"))?;
            let (_, mut contents) = snapshot::archive::read_archive(&tar, &|p| p == path)?;
            let bytes = contents
                .remove(&path)
                .ok_or_else(|| format!("{path:?} changed while it was read"))?;
            let digest = sha256_hex(&bytes);
            walk.read.insert(path, (digest.clone(), bytes.len() as u64));
            blobs.entry(digest).or_insert(bytes);
        }
        // Symbolic links' targets are stored as blobs too.
        for stat in &walk.stats {
            if let Some(target) = &stat.target {
                blobs
                    .entry(sha256_hex(target.as_bytes()))
                    .or_insert_with(|| target.as_bytes().to_vec());
            }
        }
        let manifest = walk
            .manifest(previous)
            .ok_or("a file was neither read nor known")?;
        let digests: Vec<String> = blobs.keys().cloned().collect();
        let missing = self
            .deps
            .store
            .missing_blobs(&digests)
            .await
            .map_err(|e| e.to_string())?;
        let blobs = missing
            .into_iter()
            .filter_map(|digest| blobs.remove(&digest).map(|bytes| Blob { digest, bytes }))
            .collect();
        Ok((
            Snapshot::Taken {
                manifest,
                used_bytes: used,
            },
            blobs,
        ))
    }
}

//! Taking a run's working-directory snapshot after a command step: list the sandbox's files,
//! read again only those whose size or time changed since the run's last snapshot (or whose
//! time was too close to that listing to tell), store the contents the store lacks and the
//! snapshot as the changes from the last one, within the run's budget ([`crate::snapshot`]
//! decides; this carries it out).

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

use super::Engine;
use super::execute::Fixed;
use crate::digest::sha256_hex;
use crate::sandbox::{MAX_ARCHIVE_BYTES, SandboxId};
use crate::snapshot::{self, Blob, Budget, Snapshot, Stored, Walk};

/// The last snapshot of each run driven on this process, with its step, so that the next one
/// compares with it without reading it back from the store.
#[derive(Default)]
pub(super) struct LastSnapshots(Mutex<HashMap<String, (u32, Snapshot)>>);

impl LastSnapshots {
    fn get(&self, uid: &str) -> Option<(u32, Snapshot)> {
        self.lock().get(uid).cloned()
    }

    fn put(&self, uid: &str, seq: u32, snapshot: Snapshot) {
        self.lock().insert(uid.to_string(), (seq, snapshot));
    }

    /// Forget a run (it finished, or its drive ended).
    pub(super) fn forget(&self, uid: &str) {
        self.lock().remove(uid);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, (u32, Snapshot)>> {
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
        // The run's last snapshot of an earlier step (the same step's, taken before a crash,
        // is taken again).
        let last = match self.last_snapshots.get(&fixed.uid) {
            Some((at, last)) if at < seq => Some((at, last)),
            _ => match self.deps.store.snapshots(&fixed.uid).await {
                Ok(all) => all.into_iter().rev().find(|(at, _)| *at < seq),
                Err(e) => {
                    tracing::warn!(run = %fixed.key, error = %e, "cannot read the run's last snapshot");
                    None
                }
            },
        };
        let previous = last.as_ref().map(|(at, s)| (*at, s));
        let (snapshot, blobs) = match self.walk(sandbox, previous.map(|(_, s)| s), budget).await {
            Ok(taken) => taken,
            Err(error) => (
                Snapshot::Failed {
                    error,
                    used_bytes: previous.map_or(0, |(_, s)| s.used_bytes()),
                },
                Vec::new(),
            ),
        };
        // Kept as the changes from the last one: nothing but a reference when nothing changed.
        let stored = Stored::of(previous, seq, snapshot.clone());
        let written = self
            .retrying(|| {
                self.deps
                    .store
                    .put_snapshot(&fixed.uid, seq, &stored, &blobs)
            })
            .await;
        match written {
            Ok(()) => self.last_snapshots.put(&fixed.uid, seq, snapshot),
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
        // Before the listing: a file written after this has a later time (see
        // `snapshot::racy`).
        let listed_at_ns = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX));
        let stats = self
            .deps
            .sandbox
            .list_files(sandbox)
            .await
            .map_err(|e| e.to_string())?;
        let planned = snapshot::plan(previous, &stats);
        // Before reading: what may be new must fit (memory stays within the budget).
        if let Err(over) = budget.spend(last, snapshot::fresh_bytes(previous, &stats, &planned)) {
            return Ok((over, Vec::new()));
        }
        let mut walk = Walk {
            stats,
            read: BTreeMap::new(),
            listed_at_ns,
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
        // Symbolic links' targets are stored as blobs too (those the last manifest had are
        // stored already).
        let known: std::collections::BTreeSet<(&str, &str)> = previous
            .map(|m| {
                m.entries
                    .iter()
                    .map(|e| (e.path.as_str(), e.digest.as_str()))
                    .collect()
            })
            .unwrap_or_default();
        for stat in &walk.stats {
            if let Some(target) = &stat.target
                && !known.contains(&(stat.path.as_str(), sha256_hex(target.as_bytes()).as_str()))
            {
                blobs
                    .entry(sha256_hex(target.as_bytes()))
                    .or_insert_with(|| target.as_bytes().to_vec());
            }
        }
        // After reading: what is new counts.
        let used = match budget.spend(last, snapshot::new_bytes(previous, &walk.read)) {
            Ok(used) => used,
            Err(over) => return Ok((over, Vec::new())),
        };
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

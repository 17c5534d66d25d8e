//! Taking a run's working-directory snapshot after a command step: ask the sandbox what
//! changed since the last one (or list all its files when it cannot tell), read again only
//! the files whose size or time changed (or whose time was too close to the last listing to
//! tell), store the contents the store lacks and the snapshot as the changes from the last
//! one, within the run's budget ([`crate::snapshot`] decides; this carries it out). A
//! snapshot that names no contents is kept with the step's outcome, in the same write; once a
//! run's snapshots are past the budget, later ones list nothing.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use super::Engine;
use super::execute::Fixed;
use crate::digest::sha256_hex;
use crate::sandbox::{MAX_ARCHIVE_BYTES, SandboxId};
use crate::snapshot::{self, Blob, Budget, Changes, Snapshot, Stored, Walk};

/// The last snapshot of each run driven on this process, with its step, so that the next one
/// compares with it without reading it back from the store; or that the run has none yet.
#[derive(Default)]
pub(super) struct LastSnapshots(Mutex<HashMap<String, Last>>);

/// What this process knows of a run's last snapshot.
#[derive(Clone)]
enum Last {
    /// The run has none: its drive began with no step journaled.
    NoneYet,
    /// The one taken after this step.
    Taken(u32, Arc<Snapshot>),
}

impl LastSnapshots {
    fn get(&self, uid: &str) -> Option<Last> {
        self.lock().get(uid).cloned()
    }

    fn put(&self, uid: &str, seq: u32, snapshot: Arc<Snapshot>) {
        self.lock()
            .insert(uid.to_string(), Last::Taken(seq, snapshot));
    }

    /// `uid`'s drive found no step journaled, and the run is no fork: no snapshot of it can
    /// be in the store (one is only ever kept after a step, by the drive holding the run, or
    /// copied to a fork), so its first need not look for one there.
    pub(super) fn none_yet(&self, uid: &str) {
        self.lock().insert(uid.to_string(), Last::NoneYet);
    }

    /// Forget a run (it finished, or its drive ended).
    pub(super) fn forget(&self, uid: &str) {
        self.lock().remove(uid);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Last>> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// A snapshot that names no contents (nothing changed, or only removals), to be kept with
/// its step's outcome in the same store write ([`crate::Store::complete_step_with`]).
pub(super) struct KeptWithOutcome {
    /// As the store keeps it.
    pub(super) stored: Stored,
    /// Whole, for the next snapshot to compare with once it is kept.
    pub(super) snapshot: Arc<Snapshot>,
}

impl Engine {
    /// Record the run's working directory after its command step `seq`: taken, over the
    /// budget, or failed (with the reason), never an error for the run: a snapshot only
    /// decides whether the step can be forked from. One that names no contents is given
    /// back, to be kept with the step's outcome ([`Engine::kept_with_outcome`] once written);
    /// any other is kept here.
    pub(super) async fn take_snapshot(
        &self,
        fixed: &Fixed,
        sandbox: &SandboxId,
        seq: u32,
    ) -> Option<KeptWithOutcome> {
        let budget = self.config.snapshots?;
        // Before anything is listed or told: a file written after this has a later time (see
        // `snapshot::racy`); what the sandbox tells next may be a listing already.
        let listed_at_ns = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX));
        // What changed since the last snapshot this process took of this sandbox: asked
        // first, so that whatever changes from now on is told next time.
        let changes = match self.deps.sandbox.changes(sandbox).await {
            Ok(changes) => changes,
            Err(e) => {
                tracing::debug!(run = %fixed.key, error = %e, "the sandbox cannot tell what changed");
                Changes::Unknown
            }
        };
        // The run's last snapshot of an earlier step (the same step's, taken before a crash,
        // is taken again). The changes are told since the last one this process took: only
        // with it are they enough.
        let (last, changes) = match self.last_snapshots.get(&fixed.uid) {
            Some(Last::Taken(at, last)) if at < seq => (Some((at, last)), changes),
            Some(Last::NoneYet) => (None, changes),
            _ => (
                match self.deps.store.snapshots(&fixed.uid).await {
                    Ok(all) => all
                        .into_iter()
                        .rev()
                        .find(|(at, _)| *at < seq)
                        .map(|(at, last)| (at, Arc::new(last))),
                    Err(e) => {
                        tracing::warn!(run = %fixed.key, error = %e, "cannot read the run's last snapshot");
                        None
                    }
                },
                // A whole listing holds whatever the last one was; changes only since the
                // last one this process took.
                match changes {
                    Changes::Listed(all) => Changes::Listed(all),
                    _ => Changes::Unknown,
                },
            ),
        };
        // Past the budget: so is every later step (the budget is not earned back), which
        // needs nothing listed or read to say so. The same record, kept with the outcome.
        if let Some((_, last)) = &last
            && matches!(**last, Snapshot::OverBudget { .. })
        {
            return Some(KeptWithOutcome {
                stored: Stored::Whole(Snapshot::clone(last)),
                snapshot: Arc::clone(last),
            });
        }
        // Nothing changed: the last snapshot again, kept as a reference to it.
        if changes.is_nothing()
            && let Some((at, last)) = &last
            && let Some(stored) = Stored::unchanged(*at, last)
        {
            return Some(KeptWithOutcome {
                stored,
                snapshot: Arc::clone(last),
            });
        }
        let previous = last.as_ref().map(|(at, s)| (*at, s.as_ref()));
        let (snapshot, blobs) = match self
            .walk(
                sandbox,
                previous.map(|(_, s)| s),
                changes,
                budget,
                listed_at_ns,
            )
            .await
        {
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
        let snapshot = Arc::new(snapshot);
        if blobs.is_empty() && stored.named_blobs().is_empty() {
            return Some(KeptWithOutcome { stored, snapshot });
        }
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
        None
    }

    /// The snapshot after step `seq` was kept with its outcome: the next one compares with it.
    pub(super) fn kept_with_outcome(&self, uid: &str, seq: u32, kept: KeptWithOutcome) {
        self.last_snapshots.put(uid, seq, kept.snapshot);
    }

    /// Walk the sandbox, or only what changed when the sandbox can tell and there is a last
    /// manifest to change (or take the whole listing it told): the snapshot and the contents
    /// the store lacks, or why it failed. `listed_at_ns`: a time before the sandbox was asked.
    async fn walk(
        &self,
        sandbox: &SandboxId,
        last: Option<&Snapshot>,
        changes: Changes,
        budget: Budget,
        listed_at_ns: i64,
    ) -> Result<(Snapshot, Vec<Blob>), String> {
        let previous = last.and_then(Snapshot::manifest);
        let (stats, gone) = match (previous, changes) {
            (Some(_), Changes::Known { present, gone }) => (present, Some(gone)),
            (_, Changes::Listed(all)) => (all, None),
            _ => (
                self.deps
                    .sandbox
                    .list_files(sandbox)
                    .await
                    .map_err(|e| e.to_string())?,
                None,
            ),
        };
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
        let manifest = match (previous, &gone) {
            (Some(previous), Some(gone)) => walk.patch(previous, gone),
            _ => walk.manifest(previous),
        }
        .ok_or("a file was neither read nor known")?;
        if blobs.is_empty() {
            return Ok((
                Snapshot::Taken {
                    manifest,
                    used_bytes: used,
                },
                Vec::new(),
            ));
        }
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

//! How a snapshot is kept in the store: whole, or as the changes from the run's snapshot of
//! an earlier step ([`Delta`]; an empty one when nothing changed), so that a command that
//! changes one file of a thousand writes one entry, not a thousand. Pure: [`Stored::of`]
//! decides the form, [`Stored::resolve_on`] and [`resolve`] give back the whole snapshots.

use std::cmp::Ordering;
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{Entry, Manifest, Snapshot};

/// A snapshot as the store keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Stored {
    /// The changes from an earlier step's taken snapshot.
    Delta(Delta),
    /// The whole snapshot (the first of a run, a fork's first, one not taken).
    Whole(Snapshot),
}

/// A taken snapshot as the changes from the manifest of the run's snapshot after step
/// `delta_of`, an earlier step.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Delta {
    /// The earlier step whose manifest this changes.
    pub delta_of: u32,
    /// Entries new or different (in contents, mode, size or time), in path order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub changed: Vec<Entry>,
    /// Paths gone, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub removed: Vec<String>,
    /// As [`Snapshot::Taken`]'s.
    pub used_bytes: u64,
    /// As [`Manifest::listed_at_ns`].
    #[serde(default)]
    pub listed_at_ns: i64,
}

impl Stored {
    /// How to keep `next`, the snapshot after step `seq`, when the run's last kept one is
    /// `previous` (with its step): the changes from it when both are taken and it is of an
    /// earlier step, whole otherwise.
    pub fn of(previous: Option<(u32, &Snapshot)>, seq: u32, next: Snapshot) -> Stored {
        match (previous, &next) {
            (
                Some((at, Snapshot::Taken { manifest: base, .. })),
                Snapshot::Taken {
                    manifest,
                    used_bytes,
                },
            ) if at < seq => {
                let (changed, removed) = diff(base, manifest);
                Stored::Delta(Delta {
                    delta_of: at,
                    changed,
                    removed,
                    used_bytes: *used_bytes,
                    listed_at_ns: manifest.listed_at_ns,
                })
            }
            _ => Stored::Whole(next),
        }
    }

    /// How to keep a snapshot when nothing changed since `last`, the run's taken snapshot
    /// after step `at`: an empty delta of it. `None` when `last` was not taken.
    pub fn unchanged(at: u32, last: &Snapshot) -> Option<Stored> {
        match last {
            Snapshot::Taken {
                manifest,
                used_bytes,
            } => Some(Stored::Delta(Delta {
                delta_of: at,
                changed: Vec::new(),
                removed: Vec::new(),
                used_bytes: *used_bytes,
                listed_at_ns: manifest.listed_at_ns,
            })),
            _ => None,
        }
    }

    /// Why it cannot be kept as the snapshot after step `seq`: a delta of a step that is
    /// not earlier.
    pub fn check(&self, seq: u32) -> Result<(), String> {
        match self {
            Stored::Delta(delta) if delta.delta_of >= seq => Err(format!(
                "the snapshot after step {seq} is kept as changes from step {}, which is not \
                 an earlier step",
                delta.delta_of
            )),
            _ => Ok(()),
        }
    }

    /// The contents this record names that the run's earlier records may not: a whole
    /// manifest's, or a delta's changed entries'.
    pub fn named_blobs(&self) -> Vec<String> {
        match self {
            Stored::Whole(snapshot) => snapshot.manifest().map(Manifest::blobs).unwrap_or_default(),
            Stored::Delta(delta) => super::blob_digests(&delta.changed),
        }
    }

    /// The whole snapshot, given the one kept after the step a delta changes (`base`): a
    /// delta whose base is missing or was not taken resolves to a failed snapshot saying so
    /// (the step is not forkable; nothing else is lost).
    pub fn resolve_on(self, base: Option<&Snapshot>) -> Snapshot {
        let delta = match self {
            Stored::Whole(snapshot) => return snapshot,
            Stored::Delta(delta) => delta,
        };
        match base {
            Some(Snapshot::Taken { manifest, .. }) => Snapshot::Taken {
                manifest: apply(manifest, &delta),
                used_bytes: delta.used_bytes,
            },
            _ => Snapshot::Failed {
                error: format!(
                    "it was kept as changes from the snapshot after step {}, which is not kept",
                    delta.delta_of
                ),
                used_bytes: delta.used_bytes,
            },
        }
    }
}

/// A run's kept snapshots, whole, in step order (`rows` in step order).
pub fn resolve(rows: Vec<(u32, Stored)>) -> Vec<(u32, Snapshot)> {
    let mut whole: BTreeMap<u32, Snapshot> = BTreeMap::new();
    for (seq, stored) in rows {
        let base = match &stored {
            Stored::Delta(delta) if delta.delta_of < seq => whole.get(&delta.delta_of),
            _ => None,
        };
        let snapshot = stored.resolve_on(base);
        whole.insert(seq, snapshot);
    }
    whole.into_iter().collect()
}

/// The entries of `next` that `base` lacks or has otherwise, and the paths of `base` that
/// `next` lacks (both in path order: manifests are).
fn diff(base: &Manifest, next: &Manifest) -> (Vec<Entry>, Vec<String>) {
    let (mut changed, mut removed) = (Vec::new(), Vec::new());
    let (mut old, mut new) = (
        base.entries.iter().peekable(),
        next.entries.iter().peekable(),
    );
    loop {
        match (old.peek(), new.peek()) {
            (None, None) => break,
            (Some(o), None) => {
                removed.push(o.path.clone());
                old.next();
            }
            (None, Some(n)) => {
                changed.push((*n).clone());
                new.next();
            }
            (Some(o), Some(n)) => match o.path.cmp(&n.path) {
                Ordering::Less => {
                    removed.push(o.path.clone());
                    old.next();
                }
                Ordering::Greater => {
                    changed.push((*n).clone());
                    new.next();
                }
                Ordering::Equal => {
                    if o != n {
                        changed.push((*n).clone());
                    }
                    old.next();
                    new.next();
                }
            },
        }
    }
    (changed, removed)
}

/// `base` with `delta`'s changes.
fn apply(base: &Manifest, delta: &Delta) -> Manifest {
    let mut entries: BTreeMap<&str, &Entry> =
        base.entries.iter().map(|e| (e.path.as_str(), e)).collect();
    for path in &delta.removed {
        entries.remove(path.as_str());
    }
    for entry in &delta.changed {
        entries.insert(entry.path.as_str(), entry);
    }
    Manifest {
        entries: entries.into_values().cloned().collect(),
        listed_at_ns: delta.listed_at_ns,
    }
}

#[cfg(test)]
mod tests {
    use super::super::{DIRECTORY, REGULAR, SYMLINK};
    use super::*;

    fn entry(path: &str, mode: u32, digest: &str, mtime: i64) -> Entry {
        Entry {
            path: path.to_string(),
            mode,
            size: digest.len() as u64,
            digest: digest.to_string(),
            mtime_ns: mtime,
        }
    }

    fn taken(entries: Vec<Entry>, used: u64) -> Snapshot {
        Snapshot::Taken {
            manifest: Manifest {
                entries,
                listed_at_ns: 7,
            },
            used_bytes: used,
        }
    }

    #[test]
    fn an_unchanged_directory_is_kept_as_an_empty_delta_that_resolves_to_the_same_manifest() {
        let first = taken(
            vec![
                entry("a", REGULAR | 0o644, "x", 1),
                entry("d", DIRECTORY | 0o755, "", 1),
            ],
            1,
        );
        let stored = Stored::of(Some((2, &first)), 4, first.clone());
        let Stored::Delta(delta) = &stored else {
            panic!("a delta: {stored:?}");
        };
        assert_eq!(
            (delta.delta_of, delta.changed.len(), delta.removed.len()),
            (2, 0, 0)
        );
        assert!(stored.named_blobs().is_empty());
        let text = serde_json::to_string(&stored).expect("JSON");
        assert!(text.len() < 80, "{text}");
        let back: Stored = serde_json::from_str(&text).expect("read back");
        assert_eq!(back, stored);
        assert_eq!(back.resolve_on(Some(&first)), first);
        // Told that nothing changed, the same record without comparing the manifests.
        assert_eq!(Stored::unchanged(2, &first), Some(stored));
        let failed = Snapshot::Failed {
            error: "x".to_string(),
            used_bytes: 1,
        };
        assert_eq!(Stored::unchanged(2, &failed), None);
    }

    /// Every kind of change, each resolved back to exactly the manifest it was made from.
    #[test]
    fn changes_removals_modes_and_additions_resolve_to_the_exact_manifest() {
        let base = vec![
            entry("a", REGULAR | 0o644, "x", 1),
            entry("b", REGULAR | 0o644, "y", 1),
            entry("c", REGULAR | 0o644, "z", 1),
            entry("d", DIRECTORY | 0o755, "", 1),
        ];
        let cases: Vec<(&str, Vec<Entry>, usize, usize)> = vec![
            // (what, next entries, changed, removed)
            ("same", base.clone(), 0, 0),
            (
                "contents",
                vec![
                    entry("a", REGULAR | 0o644, "x2", 2),
                    base[1].clone(),
                    base[2].clone(),
                    base[3].clone(),
                ],
                1,
                0,
            ),
            (
                "mode",
                vec![
                    base[0].clone(),
                    entry("b", REGULAR | 0o755, "y", 1),
                    base[2].clone(),
                    base[3].clone(),
                ],
                1,
                0,
            ),
            (
                "time only",
                {
                    let mut next = base.clone();
                    next[2].mtime_ns = 9;
                    next
                },
                1,
                0,
            ),
            ("removal", vec![base[0].clone(), base[2].clone()], 0, 2),
            (
                "addition first and last",
                vec![
                    entry("0", REGULAR | 0o600, "n", 3),
                    base[0].clone(),
                    base[1].clone(),
                    base[2].clone(),
                    base[3].clone(),
                    entry("z", SYMLINK | 0o777, "t", 3),
                ],
                2,
                0,
            ),
            ("all gone", vec![], 0, 4),
        ];
        let before = taken(base.clone(), 5);
        for (what, next, changed, removed) in cases {
            let next = taken(next, 6);
            let stored = Stored::of(Some((1, &before)), 3, next.clone());
            let Stored::Delta(delta) = &stored else {
                panic!("{what}: a delta");
            };
            assert_eq!(
                (delta.changed.len(), delta.removed.len()),
                (changed, removed),
                "{what}"
            );
            let text = serde_json::to_string(&stored).expect("JSON");
            let back: Stored = serde_json::from_str(&text).expect("read back");
            assert_eq!(back.resolve_on(Some(&before)), next, "{what}");
        }
    }

    #[test]
    fn a_first_a_same_step_or_a_not_taken_snapshot_is_kept_whole() {
        let first = taken(vec![entry("a", REGULAR | 0o644, "x", 1)], 1);
        let failed = Snapshot::Failed {
            error: "e".to_string(),
            used_bytes: 1,
        };
        assert!(matches!(
            Stored::of(None, 1, first.clone()),
            Stored::Whole(_)
        ));
        // The step taken again (after a crash) is not a delta of itself.
        assert!(matches!(
            Stored::of(Some((3, &first)), 3, first.clone()),
            Stored::Whole(_)
        ));
        assert!(matches!(
            Stored::of(Some((1, &failed)), 3, first.clone()),
            Stored::Whole(_)
        ));
        assert!(matches!(
            Stored::of(Some((1, &first)), 3, failed.clone()),
            Stored::Whole(_)
        ));
        // A whole snapshot written before deltas existed reads back whole.
        let text = serde_json::to_string(&first).expect("JSON");
        assert_eq!(
            serde_json::from_str::<Stored>(&text).expect("read"),
            Stored::Whole(first.clone())
        );
    }

    #[test]
    fn a_chain_resolves_step_by_step_and_a_missing_base_is_not_forkable_naming_it() {
        let s1 = taken(vec![entry("a", REGULAR | 0o644, "x", 1)], 1);
        let s3 = taken(
            vec![
                entry("a", REGULAR | 0o644, "x", 1),
                entry("b", REGULAR | 0o644, "y", 2),
            ],
            2,
        );
        let s5 = taken(vec![entry("b", REGULAR | 0o644, "y", 2)], 2);
        let rows = vec![
            (1, Stored::of(None, 1, s1.clone())),
            (3, Stored::of(Some((1, &s1)), 3, s3.clone())),
            (5, Stored::of(Some((3, &s3)), 5, s5.clone())),
        ];
        assert_eq!(
            resolve(rows.clone()),
            vec![(1, s1.clone()), (3, s3.clone()), (5, s5.clone())]
        );
        // Without step 3's record, step 5's names what is missing.
        let broken = resolve(vec![rows[0].clone(), rows[2].clone()]);
        let reason = broken[1].1.not_forkable().expect("not forkable");
        assert!(reason.contains("after step 3"), "{reason}");
        assert_eq!(
            rows[2].1.check(3).expect_err("not earlier"),
            "the snapshot after step 3 is kept as changes from step 3, which is not an earlier step"
        );
        assert_eq!(rows[2].1.check(5), Ok(()));
    }
}

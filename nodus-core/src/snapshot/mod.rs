//! Working-directory snapshots, taken after each command step so that a run can be forked
//! from it: a manifest (`path`, `mode`, `size`, `digest`) whose contents are stored once by
//! SHA-256 in the store, shared by every run and fork that has them.
//!
//! Everything here is pure: what to read again ([`plan`]), the manifest that results
//! ([`Walk::manifest`]), whether the run's budget allows it ([`Budget`]), the digest that
//! names a manifest ([`Manifest::digest`]) and how the store keeps it ([`Stored`]). The
//! engine walks the sandbox and writes the store.

pub mod archive;
mod changes;
mod stored;

pub use changes::Changes;
pub use stored::{Delta, Stored, resolve};

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::digest::sha256_hex;

/// The file-type bits of a [`FileStat::mode`] / [`Entry::mode`] (`S_IFMT`).
pub const TYPE_BITS: u32 = 0o170_000;
/// A regular file's type bits (`S_IFREG`).
pub const REGULAR: u32 = 0o100_000;
/// A directory's type bits (`S_IFDIR`).
pub const DIRECTORY: u32 = 0o040_000;
/// A symbolic link's type bits (`S_IFLNK`).
pub const SYMLINK: u32 = 0o120_000;

/// The default of the per-run snapshot budget: 1 GiB of new content.
pub const DEFAULT_BUDGET_BYTES: u64 = 1 << 30;

/// How long before a listing a file's time must be for its size and time to be trusted at
/// the next walk, when the listing gives times finer than a second: a file written again
/// within the file system's clock tick (at most 10 ms on Linux) may keep its time and size
/// though its contents changed (as git's "racily clean" entries).
pub const RACY_WINDOW_NS: i64 = 20_000_000;

/// The same for a listing that gives times to the second (a time that is a whole second:
/// the default listing of an archive's headers).
pub const RACY_WINDOW_SECONDS_NS: i64 = 1_000_000_000;

/// What a sandbox says about one entry of its working directory, without its contents.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FileStat {
    /// Relative to the working directory, `/`-separated.
    pub path: String,
    /// Type and permission bits ([`REGULAR`], [`DIRECTORY`] or [`SYMLINK`], plus `0o7777`).
    pub mode: u32,
    /// Bytes of a regular file; 0 otherwise.
    pub size: u64,
    /// Last modification, in nanoseconds since the epoch (what the backend can tell).
    pub mtime_ns: i64,
    /// A symbolic link's target.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
}

impl FileStat {
    /// Whether this is a regular file.
    pub fn is_file(&self) -> bool {
        self.mode & TYPE_BITS == REGULAR
    }
}

/// One entry of a manifest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct Entry {
    /// Relative to the working directory, `/`-separated.
    pub path: String,
    /// Type and permission bits, as [`FileStat::mode`].
    pub mode: u32,
    /// Bytes of a regular file; 0 otherwise.
    pub size: u64,
    /// SHA-256 (hex) of a regular file's contents or of a symbolic link's target; empty for
    /// a directory.
    pub digest: String,
    /// The modification time it was read at: a later walk that finds the same size and time
    /// takes the digest without reading the file again. Not part of [`Manifest::digest`].
    #[serde(default, rename = "mtimeNs")]
    pub mtime_ns: i64,
}

/// A working directory as it was after a step: its entries in path order.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
pub struct Manifest {
    /// In path order.
    pub entries: Vec<Entry>,
    /// When the walk that made it began listing, in nanoseconds since the epoch (the host's
    /// clock): a file whose time is not clearly before it is read again at the next walk
    /// (see [`RACY_WINDOW_NS`]). Not part of [`Manifest::digest`]; 0 when unknown (every
    /// file is then read again).
    #[serde(default, rename = "listedAtNs")]
    pub listed_at_ns: i64,
}

impl Manifest {
    /// The SHA-256 (hex) that names this manifest: of each entry's path, mode, size and
    /// digest (not its time), one line each, in path order. Two working directories with
    /// the same files, modes and contents have the same digest.
    pub fn digest(&self) -> String {
        let mut text = String::new();
        for entry in &self.entries {
            text.push_str(&format!(
                "{:o} {} {} {}\n",
                entry.mode,
                entry.size,
                entry.digest,
                entry.path.escape_default()
            ));
        }
        sha256_hex(text.as_bytes())
    }

    /// Bytes of regular files' contents.
    pub fn content_bytes(&self) -> u64 {
        self.entries.iter().map(|e| e.size).sum()
    }

    /// The digests of the regular files' contents and of the symbolic links' targets (stored
    /// as blobs too), each once.
    pub fn blobs(&self) -> Vec<String> {
        blob_digests(&self.entries)
    }
}

/// The digests `entries` store as blobs (regular files' contents, symbolic links' targets),
/// sorted, each once.
fn blob_digests(entries: &[Entry]) -> Vec<String> {
    let mut digests: Vec<String> = entries
        .iter()
        .filter(|e| matches!(e.mode & TYPE_BITS, REGULAR | SYMLINK))
        .map(|e| e.digest.clone())
        .collect();
    digests.sort_unstable();
    digests.dedup();
    digests
}

/// What a run recorded about its working directory after one command step.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(
    tag = "state",
    rename_all = "camelCase",
    rename_all_fields = "camelCase"
)]
pub enum Snapshot {
    /// Taken: the step can be forked from.
    Taken {
        /// The working directory.
        manifest: Manifest,
        /// New content the run's snapshots have read so far, this one included (what the
        /// budget counts).
        used_bytes: u64,
    },
    /// Not taken because the run's budget is spent: neither this step nor any later one
    /// can be forked from (each later step keeps the same record).
    OverBudget {
        /// New content read so far.
        used_bytes: u64,
        /// What the snapshot that went over would have read on top.
        wanted_bytes: u64,
        /// The budget.
        limit_bytes: u64,
    },
    /// Not taken because the working directory could not be read (the backend failed).
    Failed {
        /// What happened.
        error: String,
        /// New content read so far.
        used_bytes: u64,
    },
}

impl Snapshot {
    /// The new content read so far.
    pub fn used_bytes(&self) -> u64 {
        match self {
            Snapshot::Taken { used_bytes, .. }
            | Snapshot::OverBudget { used_bytes, .. }
            | Snapshot::Failed { used_bytes, .. } => *used_bytes,
        }
    }

    /// The manifest, when taken.
    pub fn manifest(&self) -> Option<&Manifest> {
        match self {
            Snapshot::Taken { manifest, .. } => Some(manifest),
            _ => None,
        }
    }

    /// Why the step cannot be forked from, when it cannot.
    pub fn not_forkable(&self) -> Option<String> {
        match self {
            Snapshot::Taken { .. } => None,
            Snapshot::OverBudget {
                used_bytes,
                wanted_bytes,
                limit_bytes,
            } => Some(format!(
                "past the run's snapshot budget: {used_bytes} bytes of new content were kept \
                 when a step's snapshot needed {wanted_bytes} more, over the {limit_bytes} \
                 bytes allowed, so neither that step nor any later one is forkable"
            )),
            Snapshot::Failed { error, .. } => {
                Some(format!("its working directory could not be read: {error}"))
            }
        }
    }
}

/// A regular file's contents, named by their digest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Blob {
    /// SHA-256 (hex) of `bytes`.
    pub digest: String,
    /// The contents.
    pub bytes: Vec<u8>,
}

impl Blob {
    /// A blob of `bytes`, its digest computed.
    pub fn of(bytes: Vec<u8>) -> Self {
        Blob {
            digest: sha256_hex(&bytes),
            bytes,
        }
    }
}

/// What a walk must read again: the regular files that are new, whose size or time differs
/// from the previous manifest's entry, or whose time was too close to the previous listing
/// to tell a later change apart ([`racy`]).
pub fn plan(previous: Option<&Manifest>, stats: &[FileStat]) -> Vec<String> {
    let known: BTreeMap<&str, &Entry> = previous
        .map(|m| m.entries.iter().map(|e| (e.path.as_str(), e)).collect())
        .unwrap_or_default();
    let listed_at = previous.map_or(0, |m| m.listed_at_ns);
    stats
        .iter()
        .filter(|stat| stat.is_file())
        .filter(|stat| {
            !known.get(stat.path.as_str()).is_some_and(|entry| {
                entry.mode & TYPE_BITS == REGULAR
                    && entry.size == stat.size
                    && entry.mtime_ns == stat.mtime_ns
                    && !racy(entry.mtime_ns, listed_at)
            })
        })
        .map(|stat| stat.path.clone())
        .collect()
}

/// Bytes of the planned files whose size differs from the previous manifest's entry, or
/// that it lacks: an upper bound of the new content a walk can find, checked against the
/// budget before anything is read. A file of the same size (its time alone changed, or it
/// was too recent to trust: a fork's restored files, a file written twice in a tick) is
/// read but counts only if its contents turn out to differ ([`new_bytes`]).
pub fn fresh_bytes(previous: Option<&Manifest>, stats: &[FileStat], planned: &[String]) -> u64 {
    let known: BTreeMap<&str, &Entry> = previous
        .map(|m| m.entries.iter().map(|e| (e.path.as_str(), e)).collect())
        .unwrap_or_default();
    let planned: std::collections::BTreeSet<&str> = planned.iter().map(String::as_str).collect();
    stats
        .iter()
        .filter(|stat| planned.contains(stat.path.as_str()))
        .filter(|stat| {
            !known
                .get(stat.path.as_str())
                .is_some_and(|entry| entry.mode & TYPE_BITS == REGULAR && entry.size == stat.size)
        })
        .map(|stat| stat.size)
        .sum()
}

/// Bytes of the files read whose contents differ from the previous manifest's entry (or that
/// it lacks): what the budget counts.
pub fn new_bytes(previous: Option<&Manifest>, read: &BTreeMap<String, (String, u64)>) -> u64 {
    let known: BTreeMap<&str, &Entry> = previous
        .map(|m| m.entries.iter().map(|e| (e.path.as_str(), e)).collect())
        .unwrap_or_default();
    read.iter()
        .filter(|(path, (digest, _))| {
            !known
                .get(path.as_str())
                .is_some_and(|entry| entry.mode & TYPE_BITS == REGULAR && &entry.digest == digest)
        })
        .map(|(_, (_, size))| *size)
        .sum()
}

/// Whether a file whose time was `mtime_ns` when a listing began at `listed_at_ns` could
/// have been written again since with the same time: its time is within the clock's tick of
/// the listing ([`RACY_WINDOW_NS`], or [`RACY_WINDOW_SECONDS_NS`] for a time to the second).
pub fn racy(mtime_ns: i64, listed_at_ns: i64) -> bool {
    let window = if mtime_ns.rem_euclid(1_000_000_000) == 0 {
        RACY_WINDOW_SECONDS_NS
    } else {
        RACY_WINDOW_NS
    };
    mtime_ns.saturating_add(window) > listed_at_ns
}

/// A walk's findings: every entry's stat, and the digests of what was read again.
#[derive(Debug, Clone, Default)]
pub struct Walk {
    /// The entries as the sandbox listed them.
    pub stats: Vec<FileStat>,
    /// Digest and size of each file read again, by path.
    pub read: BTreeMap<String, (String, u64)>,
    /// When the listing began (see [`Manifest::listed_at_ns`]).
    pub listed_at_ns: i64,
}

impl Walk {
    /// The manifest: read files take their new digest (and the size read: a file that
    /// changed between the listing and the reading is recorded as read), the others the
    /// previous manifest's. `None` when a file the plan did not read has no previous entry
    /// (the caller read less than [`plan`] asked).
    pub fn manifest(&self, previous: Option<&Manifest>) -> Option<Manifest> {
        let known: BTreeMap<&str, &Entry> = previous
            .map(|m| m.entries.iter().map(|e| (e.path.as_str(), e)).collect())
            .unwrap_or_default();
        let mut entries = Vec::with_capacity(self.stats.len());
        for stat in &self.stats {
            let (digest, size) = if stat.is_file() {
                match self.read.get(&stat.path) {
                    Some((digest, size)) => (digest.clone(), *size),
                    None => {
                        let entry = known.get(stat.path.as_str())?;
                        (entry.digest.clone(), entry.size)
                    }
                }
            } else if stat.mode & TYPE_BITS == SYMLINK {
                (
                    sha256_hex(stat.target.as_deref().unwrap_or_default().as_bytes()),
                    0,
                )
            } else {
                (String::new(), 0)
            };
            entries.push(Entry {
                path: stat.path.clone(),
                mode: stat.mode,
                size,
                digest,
                mtime_ns: stat.mtime_ns,
            });
        }
        entries.sort_by(|a, b| a.path.cmp(&b.path));
        Some(Manifest {
            entries,
            listed_at_ns: self.listed_at_ns,
        })
    }
}

/// The per-run budget of new snapshot content.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    /// Bytes of new content a run's snapshots may read in all.
    pub limit_bytes: u64,
}

impl Default for Budget {
    fn default() -> Self {
        Budget {
            limit_bytes: DEFAULT_BUDGET_BYTES,
        }
    }
}

impl Budget {
    /// What comes after `last` (the run's previous snapshot) when this walk must read
    /// `wanted` bytes of new content: `Ok` with the new total, or the over-budget record
    /// (also once any earlier snapshot went over: the budget is not earned back).
    pub fn spend(&self, last: Option<&Snapshot>, wanted: u64) -> Result<u64, Snapshot> {
        let used = last.map_or(0, Snapshot::used_bytes);
        let total = used.saturating_add(wanted);
        let over = Snapshot::OverBudget {
            used_bytes: used,
            wanted_bytes: wanted,
            limit_bytes: self.limit_bytes,
        };
        if matches!(last, Some(Snapshot::OverBudget { .. })) || total > self.limit_bytes {
            Err(over)
        } else {
            Ok(total)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stat(path: &str, mode: u32, size: u64, mtime: i64) -> FileStat {
        FileStat {
            path: path.to_string(),
            mode,
            size,
            mtime_ns: mtime,
            target: None,
        }
    }

    fn walk(stats: Vec<FileStat>, read: &[(&str, &str, u64)]) -> Walk {
        Walk {
            stats,
            listed_at_ns: 1_000_000_000_000,
            read: read
                .iter()
                .map(|(p, d, s)| (p.to_string(), (d.to_string(), *s)))
                .collect(),
        }
    }

    #[test]
    fn only_new_or_changed_files_are_read_again() {
        let first = vec![
            stat("a", REGULAR | 0o644, 3, 10),
            stat("d", DIRECTORY | 0o755, 0, 10),
            stat("d/b", REGULAR | 0o644, 5, 10),
        ];
        assert_eq!(plan(None, &first), vec!["a", "d/b"]);
        let manifest = walk(first, &[("a", "da", 3), ("d/b", "db", 5)])
            .manifest(None)
            .expect("all read");
        // Same size and time: not read. Another time, another size, a new file: read.
        let second = vec![
            stat("a", REGULAR | 0o644, 3, 10),
            stat("d", DIRECTORY | 0o755, 0, 10),
            stat("d/b", REGULAR | 0o644, 5, 11),
            stat("d/c", REGULAR | 0o600, 1, 10),
        ];
        assert_eq!(plan(Some(&manifest), &second), vec!["d/b", "d/c"]);
        let next = walk(second, &[("d/b", "db2", 5), ("d/c", "dc", 1)])
            .manifest(Some(&manifest))
            .expect("planned");
        assert_eq!(next.entries[0].digest, "da");
        assert_eq!(next.entries[2].digest, "db2");
        assert_eq!(next.blobs(), vec!["da", "db2", "dc"]);
    }

    #[test]
    fn a_mode_change_or_a_removal_changes_the_digest_and_a_time_does_not() {
        let base = walk(
            vec![
                stat("a", REGULAR | 0o644, 1, 1),
                stat("b", REGULAR | 0o644, 1, 1),
            ],
            &[("a", "x", 1), ("b", "y", 1)],
        )
        .manifest(None)
        .expect("read");
        let touched = walk(
            vec![
                stat("a", REGULAR | 0o644, 1, 2),
                stat("b", REGULAR | 0o644, 1, 2),
            ],
            &[("a", "x", 1), ("b", "y", 1)],
        )
        .manifest(None)
        .expect("read");
        assert_eq!(base.digest(), touched.digest());
        let chmod = walk(
            vec![
                stat("a", REGULAR | 0o755, 1, 1),
                stat("b", REGULAR | 0o644, 1, 1),
            ],
            &[],
        )
        .manifest(Some(&base))
        .expect("known");
        assert_ne!(base.digest(), chmod.digest());
        let removed = walk(vec![stat("a", REGULAR | 0o644, 1, 1)], &[])
            .manifest(Some(&base))
            .expect("known");
        assert_ne!(base.digest(), removed.digest());
    }

    /// The budget counts new content: a file read again whose contents did not change
    /// (a restored fork's, one re-read because its time was recent) costs nothing; the
    /// check before reading counts only files that are new or changed size.
    #[test]
    fn only_contents_that_changed_count_against_the_budget() {
        let first = vec![
            stat("same", REGULAR | 0o644, 10, 1),
            stat("grows", REGULAR | 0o644, 10, 1),
        ];
        let manifest = walk(first, &[("same", "s", 10), ("grows", "g", 10)])
            .manifest(None)
            .expect("read");
        // Every time changed (a restore); one file grew, one is new.
        let second = vec![
            stat("grows", REGULAR | 0o644, 15, 2),
            stat("new", REGULAR | 0o644, 7, 2),
            stat("same", REGULAR | 0o644, 10, 2),
        ];
        let planned = plan(Some(&manifest), &second);
        assert_eq!(planned, vec!["grows", "new", "same"]);
        assert_eq!(fresh_bytes(Some(&manifest), &second, &planned), 22);
        let read: BTreeMap<String, (String, u64)> = [
            ("grows".to_string(), ("g2".to_string(), 15)),
            ("new".to_string(), ("n".to_string(), 7)),
            ("same".to_string(), ("s".to_string(), 10)),
        ]
        .into();
        assert_eq!(new_bytes(Some(&manifest), &read), 22);
        assert_eq!(new_bytes(None, &read), 32);
    }

    /// A file written again within the clock's tick of the last listing may keep its size
    /// and time: it is read again until its time is clearly before a listing.
    #[test]
    fn a_file_whose_time_is_close_to_the_last_listing_is_read_again() {
        const S: i64 = 1_000_000_000;
        // (file's time, listing began, racy)
        let table = [
            (5 * S + 1, 5 * S + 1, true),
            (5 * S + 1, 5 * S + RACY_WINDOW_NS, true),
            (5 * S + 1, 5 * S + RACY_WINDOW_NS + 2, false),
            // To the second: a whole second's window.
            (5 * S, 5 * S + S / 2, true),
            (5 * S, 6 * S, false),
            // Unknown listing time: every file.
            (5 * S + 1, 0, true),
        ];
        for (mtime, listed, expected) in table {
            assert_eq!(racy(mtime, listed), expected, "{mtime} listed at {listed}");
        }
        let stats = vec![stat("a", REGULAR | 0o644, 3, 5 * S + 1)];
        let mut manifest = walk(stats.clone(), &[("a", "da", 3)])
            .manifest(None)
            .expect("read");
        manifest.listed_at_ns = 5 * S + 2;
        assert_eq!(plan(Some(&manifest), &stats), vec!["a"]);
        manifest.listed_at_ns = 6 * S;
        assert!(plan(Some(&manifest), &stats).is_empty());
    }

    #[test]
    fn a_file_the_plan_did_not_read_and_nobody_knew_gives_no_manifest() {
        assert_eq!(
            walk(vec![stat("a", REGULAR | 0o644, 1, 1)], &[]).manifest(None),
            None
        );
    }

    #[test]
    fn the_budget_refuses_what_goes_past_it_naming_the_numbers_and_stays_spent() {
        let budget = Budget { limit_bytes: 100 };
        let taken = |used| Snapshot::Taken {
            manifest: Manifest::default(),
            used_bytes: used,
        };
        assert_eq!(budget.spend(None, 100), Ok(100));
        assert_eq!(budget.spend(Some(&taken(40)), 60), Ok(100));
        let over = budget.spend(Some(&taken(40)), 61).expect_err("past");
        let reason = over.not_forkable().expect("a reason");
        assert!(reason.contains("40 bytes"), "{reason}");
        assert!(reason.contains("61 more"), "{reason}");
        assert!(reason.contains("100 bytes allowed"), "{reason}");
        // Once over, a small change later is still refused.
        assert!(budget.spend(Some(&over), 0).is_err());
    }
}

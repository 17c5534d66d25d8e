//! What a sandbox can tell of its working directory's changes since it was last asked
//! ([`Changes`]), and the manifest that results from the last one and those changes alone
//! ([`Walk::patch`]): a snapshot after a command that changed nothing lists nothing.

use std::collections::BTreeSet;

use super::{FileStat, Manifest, Walk};

/// What a sandbox tells of its working directory since the last time it was asked
/// ([`crate::Sandbox::changes`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Changes {
    /// It cannot tell (it does not watch its working directory, it has only begun to, or it
    /// lost track): the whole directory must be listed.
    Unknown,
    /// It cannot tell what changed, and listed the whole directory instead, as
    /// [`crate::Sandbox::list_files`] would (a backend that has only begun to watch, which
    /// walks the directory then anyway): every entry present, none to list again.
    Listed(Vec<FileStat>),
    /// Only these entries may differ: each changed path still present (a directory that
    /// appeared with everything under it), and the paths gone.
    Known {
        /// The present entries that may have changed.
        present: Vec<FileStat>,
        /// Paths no longer there (with whatever was under them).
        gone: Vec<String>,
    },
}

impl Changes {
    /// Known, and nothing changed.
    pub fn is_nothing(&self) -> bool {
        matches!(self, Changes::Known { present, gone } if present.is_empty() && gone.is_empty())
    }
}

impl Walk {
    /// The manifest after a walk of the changed entries only (`self.stats` the present ones,
    /// `gone` the paths removed): the changed entries as [`Walk::manifest`] makes them, every
    /// other entry of `previous` as it was, minus the gone paths and what was under them.
    /// `None` as [`Walk::manifest`].
    pub fn patch(&self, previous: &Manifest, gone: &[String]) -> Option<Manifest> {
        let changed = self.manifest(Some(previous))?;
        let touched: BTreeSet<&str> = self
            .stats
            .iter()
            .map(|s| s.path.as_str())
            .chain(gone.iter().map(String::as_str))
            .collect();
        let gone: BTreeSet<&str> = gone.iter().map(String::as_str).collect();
        let under_gone = |path: &str| {
            path.match_indices('/')
                .any(|(at, _)| gone.contains(&path[..at]))
        };
        let mut entries: Vec<_> = previous
            .entries
            .iter()
            .filter(|e| !touched.contains(e.path.as_str()) && !under_gone(&e.path))
            .cloned()
            .chain(changed.entries)
            .collect();
        entries.sort_by(|a, b| a.path.cmp(&b.path));
        Some(Manifest {
            entries,
            listed_at_ns: self.listed_at_ns,
        })
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::super::{DIRECTORY, Entry, REGULAR};
    use super::*;

    fn entry(path: &str, mode: u32, size: u64, digest: &str) -> Entry {
        Entry {
            path: path.to_string(),
            mode,
            size,
            digest: digest.to_string(),
            mtime_ns: 5,
        }
    }

    fn stat(path: &str, mode: u32, size: u64) -> FileStat {
        FileStat {
            path: path.to_string(),
            mode,
            size,
            mtime_ns: 9,
            target: None,
        }
    }

    fn previous() -> Manifest {
        Manifest {
            entries: vec![
                entry("a", REGULAR | 0o644, 1, "da"),
                entry("d", DIRECTORY | 0o755, 0, ""),
                entry("d/x", REGULAR | 0o644, 2, "dx"),
                entry("d/y", REGULAR | 0o644, 3, "dy"),
                entry("dz", REGULAR | 0o644, 4, "dz"),
            ],
            listed_at_ns: 100,
        }
    }

    #[test]
    fn a_patch_changes_the_changed_entries_drops_the_gone_and_keeps_the_rest() {
        let walk = Walk {
            stats: vec![stat("a", REGULAR | 0o600, 7), stat("n", REGULAR | 0o644, 8)],
            read: BTreeMap::from([
                ("a".to_string(), ("na".to_string(), 7)),
                ("n".to_string(), ("nn".to_string(), 8)),
            ]),
            listed_at_ns: 200,
        };
        let patched = walk
            .patch(&previous(), &["d".to_string()])
            .expect("patched");
        let paths: Vec<(&str, &str, u64)> = patched
            .entries
            .iter()
            .map(|e| (e.path.as_str(), e.digest.as_str(), e.size))
            .collect();
        // "dz" shares a prefix with the gone "d" but is not under it.
        assert_eq!(paths, [("a", "na", 7), ("dz", "dz", 4), ("n", "nn", 8)]);
        assert_eq!(patched.entries[0].mode, REGULAR | 0o600);
        assert_eq!(patched.listed_at_ns, 200);
    }

    #[test]
    fn a_patch_with_nothing_changed_is_the_previous_manifest() {
        let walk = Walk {
            listed_at_ns: 300,
            ..Walk::default()
        };
        let patched = walk.patch(&previous(), &[]).expect("patched");
        assert_eq!(patched.entries, previous().entries);
        assert_eq!(patched.digest(), previous().digest());
        assert!(
            Changes::Known {
                present: Vec::new(),
                gone: Vec::new()
            }
            .is_nothing()
        );
        assert!(!Changes::Unknown.is_nothing());
        assert!(!Changes::Listed(Vec::new()).is_nothing());
    }

    #[test]
    fn a_changed_file_that_was_not_read_and_was_not_known_gives_no_patch() {
        let walk = Walk {
            stats: vec![stat("new", REGULAR | 0o644, 1)],
            ..Walk::default()
        };
        assert_eq!(walk.patch(&previous(), &[]), None);
    }
}

//! Snapshots and tar archives, the form in which sandboxes move files: the stats and contents
//! an archive holds (for backends that can only give archives), and the archives that put a
//! manifest's working directory back, in batches of at most [`MAX_ARCHIVE_BYTES`] each.

use std::collections::BTreeMap;
use std::io::Read;

use super::{DIRECTORY, Entry, FileStat, Manifest, REGULAR, SYMLINK, TYPE_BITS};

/// The largest tar archive that [`Sandbox::put_files`](crate::sandbox::Sandbox::put_files) accepts and [`Sandbox::get_files`](crate::sandbox::Sandbox::get_files)
/// returns: 256 MiB. Archives travel as whole byte vectors, so this bounds the memory one
/// transfer takes.
pub const MAX_ARCHIVE_BYTES: usize = 256 << 20;

/// What [`read_archive`] found: each entry's stat (in path order), and the contents asked
/// for, by path.
pub type Found = (Vec<FileStat>, BTreeMap<String, Vec<u8>>);

/// What a tar archive of a working directory holds: each entry's stat, and the contents of
/// those whose paths `wanted` says, by path. Entries other than regular files, directories
/// and symbolic links are left out.
pub fn read_archive(tar: &[u8], wanted: &dyn Fn(&str) -> bool) -> Result<Found, String> {
    let mut stats = Vec::new();
    let mut contents = BTreeMap::new();
    let mut archive = tar::Archive::new(tar);
    let entries = archive
        .entries()
        .map_err(|e| format!("reading the archive: {e}"))?;
    for entry in entries {
        let mut entry = entry.map_err(|e| format!("reading the archive: {e}"))?;
        let header = entry.header();
        let kind = match header.entry_type() {
            tar::EntryType::Regular | tar::EntryType::Continuous => REGULAR,
            tar::EntryType::Directory => DIRECTORY,
            tar::EntryType::Symlink => SYMLINK,
            _ => continue,
        };
        let path = entry
            .path()
            .map_err(|e| format!("an entry's path: {e}"))?
            .to_string_lossy()
            .trim_start_matches("./")
            .trim_end_matches('/')
            .to_string();
        if path.is_empty() || path == "." {
            continue;
        }
        let header = entry.header();
        let mode = kind | (header.mode().map_err(|e| format!("{path}: mode: {e}"))? & 0o7777);
        let mtime = header.mtime().map_err(|e| format!("{path}: mtime: {e}"))?;
        let target = match kind {
            SYMLINK => entry
                .link_name()
                .map_err(|e| format!("{path}: link: {e}"))?
                .map(|t| t.to_string_lossy().into_owned()),
            _ => None,
        };
        let size = if kind == REGULAR { entry.size() } else { 0 };
        if kind == REGULAR && wanted(&path) {
            let mut bytes = Vec::with_capacity(usize::try_from(size).unwrap_or(0));
            entry
                .read_to_end(&mut bytes)
                .map_err(|e| format!("{path}: {e}"))?;
            contents.insert(path.clone(), bytes);
        }
        stats.push(FileStat {
            path,
            mode,
            size,
            mtime_ns: i64::try_from(mtime)
                .unwrap_or(i64::MAX)
                .saturating_mul(1_000_000_000),
            target,
        });
    }
    stats.sort_by(|a, b| a.path.cmp(&b.path));
    Ok((stats, contents))
}

/// How a manifest's working directory is put back: in batches of entries, each made into one
/// archive ([`restore_archive`]) and unpacked in order into an empty directory, so that no
/// more than one batch's contents is held at a time. Regular files and symbolic links come
/// first, in path order (their parent directories are made as they are unpacked), each batch
/// at most `max_bytes` (and [`MAX_ARCHIVE_BYTES`]) of archive unless one file alone is
/// larger; the directories come last, in a batch of their own, so that a directory's mode (a
/// read-only one too) and time are set after everything was written into it.
pub fn restore_batches(manifest: &Manifest, max_bytes: usize) -> Vec<Vec<&Entry>> {
    let max = max_bytes.min(MAX_ARCHIVE_BYTES);
    let (dirs, others): (Vec<&Entry>, Vec<&Entry>) = manifest
        .entries
        .iter()
        .partition(|e| e.mode & TYPE_BITS == DIRECTORY);
    let mut batches: Vec<Vec<&Entry>> = Vec::new();
    let mut batch: Vec<&Entry> = Vec::new();
    let mut bytes = 0usize;
    for entry in others {
        let length = archived_bytes(entry);
        if !batch.is_empty() && bytes.saturating_add(length).saturating_add(1024) > max {
            batches.push(std::mem::take(&mut batch));
            bytes = 0;
        }
        bytes = bytes.saturating_add(length);
        batch.push(entry);
    }
    if !batch.is_empty() {
        batches.push(batch);
    }
    if !dirs.is_empty() {
        batches.push(dirs);
    }
    batches
}

/// Bytes an entry takes in an archive: its header, and a regular file's contents padded to
/// the block.
fn archived_bytes(entry: &Entry) -> usize {
    let contents = match entry.mode & TYPE_BITS {
        REGULAR => usize::try_from(entry.size).unwrap_or(usize::MAX),
        _ => 0,
    };
    // A symbolic link's long target may take a second header.
    1024usize.saturating_add(contents.div_ceil(512).saturating_mul(512))
}

/// One archive of `batch` (from [`restore_batches`]): modes, times to the second, contents
/// and link targets as the manifest has them. `blob` gives a regular file's contents or a
/// symbolic link's target by digest.
pub fn restore_archive<'b>(
    batch: &[&Entry],
    blob: &dyn Fn(&str) -> Result<&'b [u8], String>,
) -> Result<Vec<u8>, String> {
    let capacity = batch
        .iter()
        .map(|e| archived_bytes(e))
        .fold(1024usize, usize::saturating_add);
    let mut builder = tar::Builder::new(Vec::with_capacity(capacity));
    let io = |path: &str, e: std::io::Error| format!("{path}: {e}");
    for entry in batch {
        let mut header = tar::Header::new_gnu();
        header.set_mode(entry.mode & 0o7777);
        header.set_mtime(u64::try_from(entry.mtime_ns / 1_000_000_000).unwrap_or(0));
        match entry.mode & TYPE_BITS {
            DIRECTORY => {
                header.set_entry_type(tar::EntryType::Directory);
                header.set_size(0);
                builder
                    .append_data(&mut header, &entry.path, std::io::empty())
                    .map_err(|e| io(&entry.path, e))?;
            }
            SYMLINK => {
                // The target is stored as a blob like a file's contents.
                let target = std::str::from_utf8(blob(&entry.digest)?)
                    .map_err(|_| format!("{}: the link's target is not UTF-8", entry.path))?;
                header.set_entry_type(tar::EntryType::Symlink);
                header.set_size(0);
                builder
                    .append_link(&mut header, &entry.path, target)
                    .map_err(|e| io(&entry.path, e))?;
            }
            _ => {
                let contents = blob(&entry.digest)?;
                header.set_entry_type(tar::EntryType::Regular);
                header.set_size(contents.len() as u64);
                builder
                    .append_data(&mut header, &entry.path, contents)
                    .map_err(|e| io(&entry.path, e))?;
            }
        }
    }
    builder.into_inner().map_err(|e| io("the archive", e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::digest::sha256_hex;

    fn entry(path: &str, mode: u32, contents: &[u8]) -> Entry {
        Entry {
            path: path.to_string(),
            mode,
            size: contents.len() as u64,
            digest: if mode & TYPE_BITS == REGULAR {
                sha256_hex(contents)
            } else {
                String::new()
            },
            mtime_ns: 5_000_000_000,
        }
    }

    /// Unpacks `batches` as [`restore_batches`] made them, in order: every entry's mode and
    /// contents as the manifest has them, files before directories.
    #[test]
    fn a_manifest_comes_back_from_its_batches_with_modes_and_contents_directories_last() {
        let files: BTreeMap<String, Vec<u8>> = [
            (sha256_hex(b"one"), b"one".to_vec()),
            (sha256_hex(&[7u8; 3000]), vec![7u8; 3000]),
            (sha256_hex(b"a.sh"), b"a.sh".to_vec()),
        ]
        .into();
        let mut link = entry("d/link", SYMLINK | 0o777, b"");
        link.digest = sha256_hex(b"a.sh");
        let manifest = Manifest {
            entries: vec![
                entry("a.sh", REGULAR | 0o755, b"one"),
                entry("d", DIRECTORY | 0o550, b""),
                entry("d/big", REGULAR | 0o600, &[7u8; 3000]),
                link,
                entry("e", DIRECTORY | 0o700, b""),
            ],
            listed_at_ns: 0,
        };
        let blob = |digest: &str| {
            files
                .get(digest)
                .map(Vec::as_slice)
                .ok_or(digest.to_string())
        };
        // Small archives: the big file goes in an archive of its own.
        let batches = restore_batches(&manifest, 2048);
        let paths: Vec<Vec<&str>> = batches
            .iter()
            .map(|b| b.iter().map(|e| e.path.as_str()).collect())
            .collect();
        assert_eq!(
            paths,
            vec![vec!["a.sh"], vec!["d/big"], vec!["d/link"], vec!["d", "e"]]
        );
        let mut stats = Vec::new();
        let mut contents = BTreeMap::new();
        for batch in &batches {
            let tar = restore_archive(batch, &blob).expect("an archive");
            let (s, c) = read_archive(&tar, &|_| true).expect("readable");
            stats.extend(s);
            contents.extend(c);
        }
        stats.sort_by(|a, b| a.path.cmp(&b.path));
        let modes: Vec<(String, u32, Option<String>)> = stats
            .iter()
            .map(|s| (s.path.clone(), s.mode, s.target.clone()))
            .collect();
        assert_eq!(
            modes,
            vec![
                ("a.sh".to_string(), REGULAR | 0o755, None),
                ("d".to_string(), DIRECTORY | 0o550, None),
                ("d/big".to_string(), REGULAR | 0o600, None),
                (
                    "d/link".to_string(),
                    SYMLINK | 0o777,
                    Some("a.sh".to_string())
                ),
                ("e".to_string(), DIRECTORY | 0o700, None),
            ]
        );
        assert_eq!(contents["d/big"], vec![7u8; 3000]);
        assert_eq!(contents["a.sh"], b"one");
        // A missing blob names its digest.
        let none = |digest: &str| -> Result<&'static [u8], String> { Err(format!("no {digest}")) };
        assert_eq!(
            restore_archive(&batches[0], &none),
            Err(format!("no {}", sha256_hex(b"one")))
        );
    }

    /// Where batches split: (file sizes, cap, batch lengths).
    #[test]
    fn batches_hold_at_most_the_cap_unless_one_file_alone_is_larger() {
        let cases: Vec<(Vec<usize>, usize, Vec<usize>)> = vec![
            (vec![], 4096, vec![]),
            (vec![10, 10, 10], 1 << 20, vec![3]),
            (vec![3000, 3000], 4096, vec![1, 1]),
            (vec![100_000], 4096, vec![1]),
            (vec![1000, 100_000, 1000], 4096, vec![1, 1, 1]),
            (vec![500, 500, 500, 500], 4096, vec![2, 2]),
            (vec![0; 10], 1 << 30, vec![10]),
        ];
        for (sizes, cap, expected) in cases {
            let manifest = Manifest {
                entries: sizes
                    .iter()
                    .enumerate()
                    .map(|(i, size)| entry(&format!("f{i:02}"), REGULAR | 0o644, &vec![1u8; *size]))
                    .collect(),
                listed_at_ns: 0,
            };
            let lengths: Vec<usize> = restore_batches(&manifest, cap)
                .iter()
                .map(Vec::len)
                .collect();
            assert_eq!(lengths, expected, "{sizes:?} within {cap}");
        }
    }
}

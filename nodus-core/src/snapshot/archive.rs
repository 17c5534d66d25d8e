//! Snapshots and tar archives, the form in which sandboxes move files: the stats and contents
//! an archive holds (for backends that can only give archives), and the archives that put a
//! manifest's working directory back, each at most [`MAX_ARCHIVE_BYTES`].

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

/// Tar archives that, unpacked in order into an empty directory, make the working directory
/// `manifest` describes: directories first, each archive at most `max_bytes` (and
/// [`MAX_ARCHIVE_BYTES`]) long unless one file alone is larger. `blob` gives a regular file's
/// contents by digest.
pub fn restore_archives(
    manifest: &Manifest,
    max_bytes: usize,
    blob: &mut dyn FnMut(&str) -> Result<Vec<u8>, String>,
) -> Result<Vec<Vec<u8>>, String> {
    let max = max_bytes.min(MAX_ARCHIVE_BYTES);
    let mut archives = Vec::new();
    let mut builder = tar::Builder::new(Vec::new());
    let mut bytes = 0usize;
    let io = |path: &str, e: std::io::Error| format!("{path}: {e}");
    // Directories first (in path order, parents before children), then everything else.
    let (dirs, others): (Vec<&Entry>, Vec<&Entry>) = manifest
        .entries
        .iter()
        .partition(|e| e.mode & TYPE_BITS == DIRECTORY);
    for entry in dirs.into_iter().chain(others) {
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
                bytes += 512;
            }
            SYMLINK => {
                // The target is stored as a blob like a file's contents.
                let target = String::from_utf8(blob(&entry.digest)?)
                    .map_err(|_| format!("{}: the link's target is not UTF-8", entry.path))?;
                header.set_entry_type(tar::EntryType::Symlink);
                header.set_size(0);
                builder
                    .append_link(&mut header, &entry.path, &target)
                    .map_err(|e| io(&entry.path, e))?;
                bytes += 1024;
            }
            _ => {
                let contents = blob(&entry.digest)?;
                let length = contents.len();
                if bytes > 0 && bytes + length + 1024 > max {
                    archives.push(
                        std::mem::replace(&mut builder, tar::Builder::new(Vec::new()))
                            .into_inner()
                            .map_err(|e| io(&entry.path, e))?,
                    );
                    bytes = 0;
                }
                header.set_entry_type(tar::EntryType::Regular);
                header.set_size(length as u64);
                builder
                    .append_data(&mut header, &entry.path, contents.as_slice())
                    .map_err(|e| io(&entry.path, e))?;
                bytes += 512 + length.div_ceil(512) * 512;
            }
        }
    }
    archives.push(builder.into_inner().map_err(|e| io("the archive", e))?);
    Ok(archives)
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

    #[test]
    fn a_manifest_comes_back_from_its_archives_with_modes_and_contents() {
        let files: BTreeMap<String, Vec<u8>> = [
            (sha256_hex(b"one"), b"one".to_vec()),
            (sha256_hex(&[7u8; 3000]), vec![7u8; 3000]),
        ]
        .into();
        let manifest = Manifest {
            entries: vec![
                entry("a.sh", REGULAR | 0o755, b"one"),
                entry("d", DIRECTORY | 0o750, b""),
                entry("d/big", REGULAR | 0o600, &[7u8; 3000]),
            ],
            listed_at_ns: 0,
        };
        let mut blob = |digest: &str| files.get(digest).cloned().ok_or(digest.to_string());
        // Small archives: the big file goes in an archive of its own.
        let archives = restore_archives(&manifest, 2048, &mut blob).expect("archives");
        assert_eq!(archives.len(), 2);
        let mut stats = Vec::new();
        let mut contents = BTreeMap::new();
        for tar in &archives {
            let (s, c) = read_archive(tar, &|_| true).expect("readable");
            stats.extend(s);
            contents.extend(c);
        }
        stats.sort_by(|a, b| a.path.cmp(&b.path));
        let modes: Vec<(String, u32)> = stats.iter().map(|s| (s.path.clone(), s.mode)).collect();
        assert_eq!(
            modes,
            vec![
                ("a.sh".to_string(), REGULAR | 0o755),
                ("d".to_string(), DIRECTORY | 0o750),
                ("d/big".to_string(), REGULAR | 0o600),
            ]
        );
        assert_eq!(contents["d/big"], vec![7u8; 3000]);
        assert_eq!(contents["a.sh"], b"one");
    }
}

//! Tar archives into and out of a working directory. Every entry of an incoming archive is
//! checked before anything of it is written, so a hostile archive leaves no trace.
//!
//! The rules for an incoming archive:
//! - entry paths are relative and have no `..`;
//! - no entry is written through a symbolic link or a non-directory, whether that comes from
//!   the archive itself or already lies in the working directory;
//! - a symbolic link's target is relative, may only start with `..` (never `a/../..`, whose
//!   meaning depends on what `a` is) and stays inside the directory;
//! - a hard link's target is a regular file inside the directory, named without `..` and not
//!   through a symbolic link;
//! - only regular files, directories and links: no devices or FIFOs;
//! - no entry conflicts with another or with what is on disk in a way that would make
//!   unpacking fail half-way (a file over a directory, a hard link over an existing name).
//!
//! Permission bits are applied without set-uid, set-gid and sticky bits; ownership is not.
//! Archives in and out are at most [`MAX_ARCHIVE_BYTES`] long.
//!
//! An outgoing archive (a downloaded working directory) is held to the same rules: only
//! permission bits (no set-id or sticky bits), no owners, and no symbolic link whose target
//! the incoming rules would refuse; its size is bounded while it is built.

use std::collections::HashMap;
use std::fs;
use std::io;
use std::path::{Component, Path, PathBuf};

use nodus_core::sandbox::{Error, MAX_ARCHIVE_BYTES};
use nodus_core::snapshot::FileStat;
use tar::EntryType;
use tracing::debug;

use crate::paths;

/// What is at a path, as far as unpacking cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OnDisk {
    /// Nothing.
    Missing,
    /// A directory (not a symbolic link to one).
    Dir,
    /// A symbolic link.
    Symlink,
    /// A file or anything else that is not a directory.
    Other,
}

/// Looks at `root/rel` without following a final symbolic link.
pub(crate) fn on_disk(root: &Path, rel: &Path) -> OnDisk {
    match fs::symlink_metadata(root.join(rel)) {
        Err(_) => OnDisk::Missing,
        Ok(meta) if meta.file_type().is_symlink() => OnDisk::Symlink,
        Ok(meta) if meta.is_dir() => OnDisk::Dir,
        Ok(_) => OnDisk::Other,
    }
}

/// The kinds of entry that may be unpacked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    File,
    Dir,
    Symlink,
    HardLink,
}

/// Checks every entry of `tar` (see the module docs) against the working directory described by
/// `on_disk`, writing nothing.
pub(crate) fn check(tar: &[u8], on_disk: &dyn Fn(&Path) -> OnDisk) -> Result<(), Error> {
    check_size(tar.len())?;
    let mut archive = tar::Archive::new(tar);
    let entries = archive.entries().map_err(invalid)?;
    // What the archive puts at each path so far, including directories it creates implicitly.
    let mut seen: HashMap<PathBuf, Kind> = HashMap::new();
    for entry in entries {
        let entry = entry.map_err(invalid)?;
        let raw = entry.path().map_err(invalid)?.into_owned();
        let shown = raw.display().to_string();
        let refuse = |why: String| Error::Refused(format!("archive entry {shown:?} {why}"));
        let header = entry.header();
        let kind = match header.entry_type() {
            // Old-style archives mark directories with a trailing slash only; tar unpacks them
            // as directories.
            EntryType::Regular | EntryType::Continuous
                if header.as_ustar().is_none() && entry.path_bytes().ends_with(b"/") =>
            {
                Kind::Dir
            }
            EntryType::Regular | EntryType::Continuous | EntryType::GNUSparse => Kind::File,
            EntryType::Directory => Kind::Dir,
            EntryType::Symlink => Kind::Symlink,
            EntryType::Link => Kind::HardLink,
            EntryType::XGlobalHeader
            | EntryType::XHeader
            | EntryType::GNULongName
            | EntryType::GNULongLink => continue,
            other => return Err(refuse(format!("has an unsupported type ({other:?})"))),
        };
        let path = paths::relative(&raw).map_err(|why| refuse(why.to_owned()))?;
        if path.as_os_str().is_empty() {
            // `./`: the working directory itself, which exists.
            if kind == Kind::Dir {
                continue;
            }
            return Err(refuse("names no file".to_owned()));
        }
        for ancestor in paths::ancestors(&path) {
            check_ancestor(ancestor, &seen, on_disk).map_err(&refuse)?;
        }
        check_replace(&path, kind, &seen, on_disk).map_err(&refuse)?;
        match kind {
            Kind::Symlink => {
                let target = link_target(&entry).map_err(&refuse)?;
                check_symlink_target(&path, &target).map_err(&refuse)?;
            }
            Kind::HardLink => {
                let target = link_target(&entry).map_err(&refuse)?;
                check_hard_link_target(&target, &seen, on_disk).map_err(&refuse)?;
            }
            Kind::File | Kind::Dir => {}
        }
        for ancestor in paths::ancestors(&path) {
            seen.entry(ancestor.to_path_buf()).or_insert(Kind::Dir);
        }
        seen.insert(path, kind);
    }
    Ok(())
}

/// Refuses an outgoing archive larger than `max` bytes.
pub(crate) fn check_cap(len: usize, max: usize) -> Result<(), Error> {
    if len > max {
        return Err(Error::Refused(format!(
            "the archive would be larger than {max} bytes"
        )));
    }
    Ok(())
}

/// Refuses an archive larger than [`MAX_ARCHIVE_BYTES`].
pub(crate) fn check_size(len: usize) -> Result<(), Error> {
    if len > MAX_ARCHIVE_BYTES {
        return Err(Error::Refused(format!(
            "the archive would have {len} bytes, more than the {MAX_ARCHIVE_BYTES} bytes allowed"
        )));
    }
    Ok(())
}

/// Every path an archive's entries could make [`check`] ask about, relative and clean: the
/// entries' paths, the targets of hard links, and their ancestors. Entries that `check`
/// refuses for their name alone are left out.
#[cfg_attr(not(feature = "docker"), allow(dead_code))]
pub(crate) fn touched(tar: &[u8]) -> Result<Vec<PathBuf>, Error> {
    check_size(tar.len())?;
    let mut archive = tar::Archive::new(tar);
    let mut out = std::collections::BTreeSet::new();
    let mut add = |path: &Path| {
        if let Ok(clean) = paths::relative(path) {
            for ancestor in paths::ancestors(&clean) {
                out.insert(ancestor.to_path_buf());
            }
            if !clean.as_os_str().is_empty() {
                out.insert(clean);
            }
        }
    };
    for entry in archive.entries().map_err(invalid)? {
        let entry = entry.map_err(invalid)?;
        add(&entry.path().map_err(invalid)?);
        if entry.header().entry_type() == EntryType::Link
            && let Ok(Some(target)) = entry.link_name()
        {
            add(&target);
        }
    }
    Ok(out.into_iter().collect())
}

/// A copy of `tar` with every entry renamed by `rename` (entries it maps to `None` are left
/// out), hard-link targets included, of at most `max` bytes. Used to name the entries of an
/// archive that another program made relative to the working directory; cleaned as [`pack`]
/// cleans: modes keep their permission bits only, and symbolic links that lead outside are
/// left out. Returns the archive and the (renamed) paths of the links left out.
#[cfg_attr(not(feature = "docker"), allow(dead_code))]
pub(crate) fn rebase(
    tar: &[u8],
    rename: &dyn Fn(&Path) -> Option<PathBuf>,
    max: usize,
) -> Result<(Vec<u8>, Vec<PathBuf>), Error> {
    let mut left_out = Vec::new();
    let failed = |e: io::Error| Error::Failed(format!("rewriting an archive: {e}"));
    let mut archive = tar::Archive::new(tar);
    let mut builder = tar::Builder::new(Vec::new());
    for entry in archive.entries().map_err(invalid)? {
        let mut entry = entry.map_err(invalid)?;
        let path = entry.path().map_err(invalid)?.into_owned();
        let Some(path) = rename(&path) else {
            continue;
        };
        let mut header = entry.header().clone();
        let mode = header.mode().map_err(invalid)?;
        header.set_mode(mode & 0o777);
        match header.entry_type() {
            EntryType::Symlink => {
                let target =
                    link_target(&entry).map_err(|why| Error::Failed(format!("{path:?} {why}")))?;
                if check_symlink_target(&path, &target).is_err() {
                    debug!(path = %path.display(), "left a link that leads outside out of an archive");
                    left_out.push(path);
                    continue;
                }
                builder
                    .append_link(&mut header, &path, target)
                    .map_err(failed)?;
            }
            EntryType::Link => {
                let target =
                    link_target(&entry).map_err(|why| Error::Failed(format!("{path:?} {why}")))?;
                let Some(target) = rename(&target) else {
                    continue;
                };
                builder
                    .append_link(&mut header, &path, target)
                    .map_err(failed)?;
            }
            _ => builder
                .append_data(&mut header, &path, &mut entry)
                .map_err(failed)?,
        }
        check_cap(builder.get_ref().len(), max)?;
    }
    let tar = builder.into_inner().map_err(failed)?;
    check_cap(tar.len(), max)?;
    Ok((tar, left_out))
}

/// Checks `tar` and, when every entry passes, unpacks it into `dir`.
pub(crate) fn unpack(tar: &[u8], dir: &Path) -> Result<(), Error> {
    check(tar, &|rel| on_disk(dir, rel))?;
    let mut archive = tar::Archive::new(tar);
    archive.set_preserve_permissions(false);
    archive.set_preserve_ownerships(false);
    archive.set_overwrite(true);
    archive.unpack(dir).map_err(|e| {
        Error::Failed(format!(
            "unpacking the archive: {}",
            paths::shown_error(&e, dir)
        ))
    })
}

/// A tar archive of `rel` (a checked relative path; empty for the whole directory) under
/// `dir`, of at most `max` bytes (and never more than [`MAX_ARCHIVE_BYTES`]): packing stops as
/// soon as the next entry would not fit, so no more than that is ever held. Symbolic links
/// are archived as links, never followed; those that lead outside the working directory (see
/// [`check_symlink_target`]) are left out, and refused when asked for by name. Sockets, FIFOs
/// and devices inside a directory are left out. Modes keep only the permission bits: no
/// set-uid, set-gid or sticky bit; owners are not recorded. `shown` is the path as the caller
/// wrote it.
pub(crate) fn pack(dir: &Path, rel: &Path, shown: &str, max: usize) -> Result<Vec<u8>, Error> {
    let failed = |e: io::Error| Error::Failed(format!("archiving {shown:?}: {e}"));
    let max = max.min(MAX_ARCHIVE_BYTES);
    let full = dir.join(rel);
    if let Some(parent) = full.parent().filter(|_| !rel.as_os_str().is_empty()) {
        // The path may pass through links, as long as they stay inside the directory.
        let inside = match (parent.canonicalize(), dir.canonicalize()) {
            (Ok(parent), Ok(dir)) => parent.starts_with(dir),
            (Err(e), _) if e.kind() == io::ErrorKind::NotFound => {
                return Err(Error::Refused(format!("{shown:?} does not exist")));
            }
            (Err(e), _) | (_, Err(e)) => return Err(failed(e)),
        };
        if !inside {
            return Err(Error::Refused(format!(
                "{shown:?} leads outside the working directory"
            )));
        }
    }
    let meta = match fs::symlink_metadata(&full) {
        Ok(meta) => meta,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(Error::Refused(format!("{shown:?} does not exist")));
        }
        Err(e) => return Err(failed(e)),
    };
    let mut builder = tar::Builder::new(Vec::new());
    let file_type = meta.file_type();
    if file_type.is_dir() {
        append_tree(&mut builder, &full, rel, max).map_err(|e| too_large_or(e, max, failed))?;
    } else if file_type.is_file() || file_type.is_symlink() {
        let appended = append_one(&mut builder, &full, rel, &meta, max)
            .map_err(|e| too_large_or(e, max, failed))?;
        if !appended {
            return Err(Error::Refused(format!(
                "{shown:?} is a symbolic link that leads outside the working directory"
            )));
        }
    } else {
        return Err(Error::Refused(format!(
            "{shown:?} is not a regular file, directory or symbolic link"
        )));
    }
    let tar = builder.into_inner().map_err(failed)?;
    // Long names add headers the estimate above leaves out.
    check_cap(tar.len(), max)?;
    Ok(tar)
}

/// Every entry below `dir` that [`pack`] would archive (regular files, directories, symbolic
/// links that stay inside), with its type and permission bits, size and modification time to
/// the nanosecond, without reading any contents: what a snapshot compares with the last one.
pub(crate) fn list(dir: &Path) -> Result<Vec<FileStat>, Error> {
    let mut stats = Vec::new();
    list_below(dir, PathBuf::new(), &mut stats)?;
    stats.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(stats)
}

/// Every entry [`list`] would give below `rel` (a directory relative to `dir`), in no order.
pub(crate) fn list_below(dir: &Path, rel: PathBuf, stats: &mut Vec<FileStat>) -> Result<(), Error> {
    let mut stack = vec![rel];
    while let Some(rel) = stack.pop() {
        for child in fs::read_dir(dir.join(&rel)).map_err(listing_failed)? {
            let child = child.map_err(listing_failed)?;
            let name = rel.join(child.file_name());
            let meta = child.metadata().map_err(listing_failed)?;
            if let Some(stat) = file_stat(&child.path(), &name, &meta)? {
                if meta.file_type().is_dir() {
                    stack.push(name);
                }
                stats.push(stat);
            }
        }
    }
    Ok(())
}

/// What [`list`] would give for the entry `rel` of `dir` alone: `None` when it is gone or
/// not something [`pack`] archives (a special file, a symbolic link that leads outside), or
/// when one of the directories on its way is not one (a symbolic link put in a directory's
/// place: [`list`] never descends through a link, and neither does this, so that a path the
/// sandbox named is never looked up outside its working directory).
pub(crate) fn stat_one(dir: &Path, rel: &Path) -> Result<Option<FileStat>, Error> {
    let mut on_the_way = dir.to_path_buf();
    if let Some(parent) = rel.parent() {
        for part in parent.components() {
            on_the_way.push(part);
            match fs::symlink_metadata(&on_the_way) {
                Ok(meta) if meta.file_type().is_dir() => {}
                Ok(_) => return Ok(None),
                Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
                Err(e) => return Err(listing_failed(e)),
            }
        }
    }
    let full = dir.join(rel);
    match fs::symlink_metadata(&full) {
        Ok(meta) => file_stat(&full, rel, &meta),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(listing_failed(e)),
    }
}

fn listing_failed(e: io::Error) -> Error {
    Error::Failed(format!("listing the working directory: {e}"))
}

/// The entry `name` (relative), found at `full` with `meta` (not following a link).
fn file_stat(full: &Path, name: &Path, meta: &fs::Metadata) -> Result<Option<FileStat>, Error> {
    use std::os::unix::fs::MetadataExt;
    let file_type = meta.file_type();
    let kind = if file_type.is_file() {
        nodus_core::snapshot::REGULAR
    } else if file_type.is_dir() {
        nodus_core::snapshot::DIRECTORY
    } else if file_type.is_symlink() {
        nodus_core::snapshot::SYMLINK
    } else {
        return Ok(None);
    };
    let target = if file_type.is_symlink() {
        let target = fs::read_link(full).map_err(listing_failed)?;
        if check_symlink_target(name, &target).is_err() {
            return Ok(None);
        }
        Some(target.to_string_lossy().into_owned())
    } else {
        None
    };
    Ok(Some(FileStat {
        path: name.to_string_lossy().into_owned(),
        mode: kind | (meta.mode() & 0o777),
        size: if file_type.is_file() { meta.len() } else { 0 },
        mtime_ns: meta
            .mtime()
            .saturating_mul(1_000_000_000)
            .saturating_add(meta.mtime_nsec()),
        target,
    }))
}

/// Appends the directory `full` as `name` with everything below it, in name order.
fn append_tree(
    builder: &mut tar::Builder<Vec<u8>>,
    full: &Path,
    name: &Path,
    max: usize,
) -> io::Result<()> {
    let mut stack = vec![(full.to_path_buf(), name.to_path_buf())];
    while let Some((full, name)) = stack.pop() {
        let meta = fs::symlink_metadata(&full)?;
        let file_type = meta.file_type();
        if file_type.is_dir() {
            if !name.as_os_str().is_empty() {
                append_one(builder, &full, &name, &meta, max)?;
            }
            let mut children = fs::read_dir(&full)?
                .map(|child| child.map(|child| child.file_name()))
                .collect::<io::Result<Vec<_>>>()?;
            // Popped from the end: reverse order here gives name order in the archive.
            children.sort_unstable_by(|a, b| b.cmp(a));
            stack.extend(
                children
                    .into_iter()
                    .map(|child| (full.join(&child), name.join(&child))),
            );
        } else if file_type.is_file() || file_type.is_symlink() {
            if !append_one(builder, &full, &name, &meta, max)? {
                debug!(path = %full.display(), "left a link that leads outside out of an archive");
            }
        } else {
            debug!(path = %full.display(), "left a special file out of an archive");
        }
    }
    Ok(())
}

/// Appends one directory, regular file or symbolic link `full` as `name`, with its permission
/// bits only (no set-id or sticky bits, no owners). Returns `false` for a symbolic link that
/// leads outside the working directory, which is left out. Fails with [`TooLarge`] when the
/// entry would take the archive past `max`.
fn append_one(
    builder: &mut tar::Builder<Vec<u8>>,
    full: &Path,
    name: &Path,
    meta: &fs::Metadata,
    max: usize,
) -> io::Result<bool> {
    let file_type = meta.file_type();
    let mut header = tar::Header::new_gnu();
    header.set_metadata_in_mode(meta, tar::HeaderMode::Deterministic);
    header.set_mtime(
        meta.modified()
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_secs()),
    );
    header.set_mode(std::os::unix::fs::PermissionsExt::mode(&meta.permissions()) & 0o777);
    let size = if file_type.is_file() { meta.len() } else { 0 };
    fits(builder, size, max)?;
    if file_type.is_symlink() {
        let target = fs::read_link(full)?;
        if check_symlink_target(name, &target).is_err() {
            return Ok(false);
        }
        builder.append_link(&mut header, name, &target)?;
    } else if file_type.is_dir() {
        builder.append_data(&mut header, name, io::empty())?;
    } else {
        // At most the size in the header, even if the file grew since.
        let file = fs::File::open(full)?;
        let mut data = io::Read::take(file, size);
        builder.append_data(&mut header, name, &mut data)?;
    }
    Ok(true)
}

/// The marker of an archive that would grow past its cap.
#[derive(Debug)]
struct TooLarge;

impl std::fmt::Display for TooLarge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("too large")
    }
}

impl std::error::Error for TooLarge {}

/// Whether an entry of `size` bytes still fits into an archive of at most `max` bytes (with
/// its headers, padding and the archive's end).
fn fits(builder: &tar::Builder<Vec<u8>>, size: u64, max: usize) -> io::Result<()> {
    let size = usize::try_from(size).unwrap_or(usize::MAX);
    let after = builder
        .get_ref()
        .len()
        .saturating_add(size)
        .saturating_add(2048);
    if after > max {
        return Err(io::Error::other(TooLarge));
    }
    Ok(())
}

/// A too-large archive is refused, naming the cap; other errors are failures.
fn too_large_or(e: io::Error, max: usize, failed: impl Fn(io::Error) -> Error) -> Error {
    if e.get_ref().is_some_and(|inner| inner.is::<TooLarge>()) {
        Error::Refused(format!("the archive would be larger than {max} bytes"))
    } else {
        failed(e)
    }
}

fn invalid(e: io::Error) -> Error {
    Error::Refused(format!("invalid tar archive: {e}"))
}

fn link_target<R: io::Read>(entry: &tar::Entry<'_, R>) -> Result<PathBuf, String> {
    match entry.link_name() {
        Ok(Some(target)) if !target.as_os_str().is_empty() => Ok(target.into_owned()),
        Ok(_) => Err("is a link without a target".to_owned()),
        Err(e) => Err(format!("has an unreadable link target: {e}")),
    }
}

/// An ancestor of an entry must be a real directory, in the archive or on disk.
fn check_ancestor(
    ancestor: &Path,
    seen: &HashMap<PathBuf, Kind>,
    on_disk: &dyn Fn(&Path) -> OnDisk,
) -> Result<(), String> {
    let shown = ancestor.display();
    match seen.get(ancestor) {
        Some(Kind::Dir) => Ok(()),
        Some(Kind::Symlink) => Err(format!("passes through the symbolic link {shown:?}")),
        Some(Kind::File | Kind::HardLink) => Err(format!("passes through the file {shown:?}")),
        None => match on_disk(ancestor) {
            OnDisk::Missing | OnDisk::Dir => Ok(()),
            OnDisk::Symlink => Err(format!(
                "passes through the existing symbolic link {shown:?}"
            )),
            OnDisk::Other => Err(format!("passes through the existing file {shown:?}")),
        },
    }
}

/// Whether unpacking `kind` at `path` can replace what is there: a directory only merges
/// with a directory, files and symbolic links replace other non-directories, and a hard link
/// needs a free name.
fn check_replace(
    path: &Path,
    kind: Kind,
    seen: &HashMap<PathBuf, Kind>,
    on_disk: &dyn Fn(&Path) -> OnDisk,
) -> Result<(), String> {
    let (there_is_dir, there_is_something, origin) = match seen.get(path) {
        Some(previous) => (*previous == Kind::Dir, true, "an earlier entry"),
        None => match on_disk(path) {
            OnDisk::Missing => (false, false, ""),
            OnDisk::Dir => (true, true, "an existing directory"),
            OnDisk::Symlink | OnDisk::Other => (false, true, "an existing file"),
        },
    };
    let fits = match kind {
        Kind::Dir => there_is_dir || !there_is_something,
        Kind::File | Kind::Symlink => !there_is_dir,
        Kind::HardLink => !there_is_something,
    };
    if fits {
        Ok(())
    } else {
        Err(format!("conflicts with {origin} of the same name"))
    }
}

/// A symbolic link's target is relative, only starts with `..`, and does not climb above the
/// working directory from the link's own directory (whose ancestors are real directories, as
/// checked before).
fn check_symlink_target(path: &Path, target: &Path) -> Result<(), String> {
    let shown = target.display();
    let mut depth = path.components().count().saturating_sub(1);
    let mut named = false;
    for component in target.components() {
        match component {
            Component::Prefix(_) | Component::RootDir => {
                return Err(format!("links to the absolute path {shown:?}"));
            }
            Component::CurDir => {}
            Component::ParentDir if named => {
                return Err(format!(
                    "links to {shown:?}, which has `..` after a name (only leading `..` is allowed)"
                ));
            }
            Component::ParentDir => {
                depth = depth
                    .checked_sub(1)
                    .ok_or_else(|| format!("links to {shown:?}, outside the working directory"))?;
            }
            Component::Normal(_) => named = true,
        }
    }
    Ok(())
}

/// A hard link's target (relative to the archive's root) is a regular file already there.
fn check_hard_link_target(
    target: &Path,
    seen: &HashMap<PathBuf, Kind>,
    on_disk: &dyn Fn(&Path) -> OnDisk,
) -> Result<(), String> {
    let shown = target.display();
    let clean =
        paths::relative(target).map_err(|why| format!("links to {shown:?}, which {why}"))?;
    if clean.as_os_str().is_empty() {
        return Err(format!("links to {shown:?}, which names no file"));
    }
    for ancestor in paths::ancestors(&clean) {
        check_ancestor(ancestor, seen, on_disk)
            .map_err(|why| format!("links to {shown:?}, which {why}"))?;
    }
    let is_file = match seen.get(&clean) {
        Some(kind) => matches!(kind, Kind::File | Kind::HardLink),
        None => on_disk(&clean) == OnDisk::Other,
    };
    if is_file {
        Ok(())
    } else {
        Err(format!("links to {shown:?}, which is not a regular file"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An archive entry: path, type, link target.
    type Spec<'a> = (&'a str, EntryType, &'a str);

    /// Builds an archive with raw names, so that hostile paths can be written.
    fn archive(entries: &[Spec<'_>]) -> Vec<u8> {
        let mut out = Vec::new();
        for (path, kind, target) in entries {
            let mut header = tar::Header::new_gnu();
            header.set_entry_type(*kind);
            header.set_mode(0o644);
            header.set_size(0);
            let old = header.as_old_mut();
            old.name[..path.len()].copy_from_slice(path.as_bytes());
            old.linkname[..target.len()].copy_from_slice(target.as_bytes());
            header.set_cksum();
            out.extend_from_slice(header.as_bytes());
        }
        out.extend_from_slice(&[0; 1024]);
        out
    }

    fn empty_disk(_: &Path) -> OnDisk {
        OnDisk::Missing
    }

    fn refused(entries: &[Spec<'_>], on_disk: &dyn Fn(&Path) -> OnDisk) -> String {
        match check(&archive(entries), on_disk) {
            Err(Error::Refused(why)) => why,
            other => panic!("{entries:?} was not refused: {other:?}"),
        }
    }

    const F: EntryType = EntryType::Regular;
    const D: EntryType = EntryType::Directory;
    const S: EntryType = EntryType::Symlink;
    const H: EntryType = EntryType::Link;

    #[test]
    fn ordinary_archives_pass() {
        let good: &[&[Spec<'_>]] = &[
            &[
                ("./", D, ""),
                ("./a.txt", F, ""),
                ("./d/", D, ""),
                ("./d/b", F, ""),
            ],
            &[("d/e/f", F, ""), ("d", D, ""), ("d/e", D, "")],
            &[("a", F, ""), ("a", F, "")],
            &[("a", F, ""), ("l", S, "a"), ("h", H, "a"), ("h2", H, "./h")],
            &[
                ("d/e/l", S, "../../x"),
                ("d/l", S, "./../d/e"),
                ("l", S, "."),
            ],
            &[("node_modules/.bin/tool", S, "../tool/cli.js")],
        ];
        for entries in good {
            assert_eq!(check(&archive(entries), &empty_disk), Ok(()), "{entries:?}");
        }
    }

    #[test]
    fn hostile_archives_are_refused_naming_the_path() {
        let cases: &[(&[Spec<'_>], &str)] = &[
            (
                &[("ok", F, ""), ("/etc/passwd", F, "")],
                "\"/etc/passwd\" is absolute",
            ),
            (&[("../x", F, "")], "\"../x\" contains `..`"),
            (&[("a/../../x", F, "")], "\"a/../../x\" contains `..`"),
            (
                &[("l", S, "/etc")],
                "\"l\" links to the absolute path \"/etc\"",
            ),
            (&[("l", S, "..")], "\"l\" links to \"..\", outside"),
            (
                &[("d/l", S, "../../x")],
                "\"d/l\" links to \"../../x\", outside",
            ),
            (&[("d/l", S, "a/../../..")], "has `..` after a name"),
            (&[("l", S, "d/../..")], "has `..` after a name"),
            (&[("l", S, "")], "\"l\" is a link without a target"),
            (
                &[("l", S, "."), ("l/x", F, "")],
                "passes through the symbolic link \"l\"",
            ),
            (
                &[("f", F, ""), ("f/x", F, "")],
                "passes through the file \"f\"",
            ),
            (
                &[("h", H, "/etc/passwd")],
                "\"h\" links to \"/etc/passwd\", which is absolute",
            ),
            (
                &[("h", H, "../x")],
                "\"h\" links to \"../x\", which contains `..`",
            ),
            (&[("h", H, "missing")], "which is not a regular file"),
            (
                &[("l", S, "."), ("h", H, "l/f")],
                "passes through the symbolic link \"l\"",
            ),
            (
                &[("d/x", F, ""), ("d", F, "")],
                "\"d\" conflicts with an earlier entry",
            ),
            (
                &[("a", F, ""), ("a", D, "")],
                "conflicts with an earlier entry",
            ),
            (&[("a", F, ""), ("h", H, "a"), ("h", H, "a")], "conflicts"),
            (
                &[("dev", EntryType::Char, "")],
                "\"dev\" has an unsupported type",
            ),
            (&[("fifo", EntryType::Fifo, "")], "unsupported type"),
        ];
        for (entries, expected) in cases {
            let why = refused(entries, &empty_disk);
            assert!(why.contains(expected), "{entries:?}: {why}");
        }
    }

    #[test]
    fn what_is_on_disk_counts() {
        let disk = |rel: &Path| match rel.to_str() {
            Some("out") => OnDisk::Symlink,
            Some("file") => OnDisk::Other,
            Some("dir") => OnDisk::Dir,
            _ => OnDisk::Missing,
        };
        let cases: &[(&[Spec<'_>], &str)] = &[
            (
                &[("out/x", F, "")],
                "passes through the existing symbolic link \"out\"",
            ),
            (
                &[("file/x", F, "")],
                "passes through the existing file \"file\"",
            ),
            (&[("out", D, "")], "conflicts with an existing file"),
            (&[("dir", F, "")], "conflicts with an existing directory"),
            (&[("file", H, "x")], "conflicts with an existing file"),
            (&[("h", H, "out")], "which is not a regular file"),
            (
                &[("h", H, "out/x")],
                "passes through the existing symbolic link",
            ),
        ];
        for (entries, expected) in cases {
            let why = refused(entries, &disk);
            assert!(why.contains(expected), "{entries:?}: {why}");
        }
        let fine: &[Spec<'_>] = &[
            ("dir", D, ""),
            ("dir/x", F, ""),
            ("file", F, ""),
            ("out", S, "dir"),
            ("h", H, "file"),
        ];
        assert_eq!(check(&archive(fine), &disk), Ok(()));
    }

    /// A file that cannot be written (a name longer than the file system takes) fails with
    /// the entry's path relative to the working directory and the reason, never the host's
    /// path of the directory.
    #[test]
    fn an_unpack_failure_names_no_host_path() {
        let dir = tempfile::tempdir().expect("a directory");
        let long = format!("src/{}", "x".repeat(300));
        let mut builder = tar::Builder::new(Vec::new());
        let mut header = tar::Header::new_gnu();
        header.set_mode(0o644);
        header.set_size(1);
        builder
            .append_data(&mut header, &long, &b"x"[..])
            .expect("a long name");
        let tar = builder.into_inner().expect("an archive");
        let why = match unpack(&tar, dir.path()) {
            Err(Error::Failed(why)) => why,
            other => panic!("unpacked: {other:?}"),
        };
        let host = dir.path().display().to_string();
        assert!(!why.contains(&host), "{why}");
        assert!(why.contains("./src/xxx"), "{why}");
        assert!(why.contains("too long"), "{why}");
    }

    #[test]
    fn packing_stops_at_the_cap_and_cleans_modes_and_links() {
        use std::os::unix::fs::PermissionsExt;

        let dir = std::env::temp_dir().join(format!("nodus-pack-{}", std::process::id()));
        fs::create_dir_all(dir.join("d")).expect("dir");
        fs::write(dir.join("a"), b"small").expect("write");
        fs::set_permissions(dir.join("a"), fs::Permissions::from_mode(0o4755)).expect("chmod");
        fs::set_permissions(dir.join("d"), fs::Permissions::from_mode(0o1777)).expect("chmod");
        std::os::unix::fs::symlink("/etc/shadow", dir.join("d/out")).expect("symlink");
        std::os::unix::fs::symlink("../a", dir.join("d/in")).expect("symlink");
        // 200 MiB that take no disk: packing must stop before reading them.
        let big = fs::File::create(dir.join("z-big")).expect("create");
        big.set_len(200 << 20).expect("sparse");
        let started = std::time::Instant::now();
        match pack(&dir, Path::new(""), ".", 1 << 20) {
            Err(Error::Refused(why)) => {
                assert_eq!(why, "the archive would be larger than 1048576 bytes")
            }
            other => panic!("over the cap: {other:?}"),
        }
        assert!(started.elapsed() < std::time::Duration::from_secs(1));

        fs::remove_file(dir.join("z-big")).expect("rm");
        let tar = pack(&dir, Path::new(""), ".", 1 << 20).expect("fits");
        let mut seen = Vec::new();
        for entry in tar::Archive::new(tar.as_slice())
            .entries()
            .expect("entries")
        {
            let entry = entry.expect("entry");
            let path = entry.path().expect("path").display().to_string();
            seen.push((path, entry.header().mode().expect("mode")));
        }
        seen.sort();
        let want = [("a", 0o755), ("d", 0o777), ("d/in", 0o777)];
        let want: Vec<(String, u32)> = want.iter().map(|(p, m)| (p.to_string(), *m)).collect();
        assert_eq!(seen, want);
        match pack(&dir, Path::new("d/out"), "d/out", 1 << 20) {
            Err(Error::Refused(why)) => assert!(why.contains("leads outside"), "{why}"),
            other => panic!("a link to /etc/shadow: {other:?}"),
        }
        fs::remove_dir_all(&dir).expect("clean up");
    }

    #[test]
    fn garbage_is_refused() {
        let mut bytes = archive(&[("a", F, "")]);
        bytes[148] = b'x';
        assert!(matches!(check(&bytes, &empty_disk), Err(Error::Refused(_))));
    }
}

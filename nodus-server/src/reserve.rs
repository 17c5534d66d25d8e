//! The store's reserve: a file of [`RESERVE_BYTES`] beside the SQLite file (`nodus.db.reserve`)
//! that is given back to the file system when it is (nearly) full, so that the store can
//! still open (it needs room for its WAL and shared-memory files) and write; it is made again
//! once there is room.

use std::fs;
use std::io::{self, Write as _};
use std::path::{Path, PathBuf};

/// What the reserve's file name adds to the SQLite file's.
pub const RESERVE_SUFFIX: &str = ".reserve";
/// The reserve's size: room for the store's shared memory and some writes.
pub const RESERVE_BYTES: u64 = 8 * 1024 * 1024;
/// Below this much free space, the reserve is given back.
const NEARLY_FULL_BYTES: u64 = 1024 * 1024;

/// What [`keep`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Kept {
    /// Nothing to do.
    Unchanged,
    /// The file system was nearly full: the reserve was removed.
    Released(PathBuf),
    /// The reserve was made.
    Made(PathBuf),
}

/// Bytes free for an unprivileged writer on the file system of `dir`.
fn available(dir: &Path) -> io::Result<u64> {
    let dir = fs::File::open(dir)?;
    let stats = rustix::fs::fstatvfs(&dir)?;
    Ok(stats.f_bavail.saturating_mul(stats.f_frsize))
}

/// The reserve of the SQLite file `db`.
pub fn reserve_of(db: &Path) -> PathBuf {
    let mut name = db.file_name().unwrap_or_default().to_os_string();
    name.push(RESERVE_SUFFIX);
    db.with_file_name(name)
}

/// Give the reserve at `path` back when its file system is nearly full; make it when it is
/// missing and there is room for it twice over.
pub(crate) fn keep(path: &Path) -> io::Result<Kept> {
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    let path = path.to_path_buf();
    let free = available(dir)?;
    let exists = path.exists();
    if exists && free < NEARLY_FULL_BYTES {
        fs::remove_file(&path)?;
        return Ok(Kept::Released(path));
    }
    if !exists && free >= RESERVE_BYTES.saturating_mul(2) {
        if let Err(e) = make(&path) {
            let _ = fs::remove_file(&path);
            return Err(e);
        }
        return Ok(Kept::Made(path));
    }
    Ok(Kept::Unchanged)
}

/// Write the reserve's bytes (written, not a sparse file, so that they are really held).
fn make(path: &Path) -> io::Result<()> {
    use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
    let mut file = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
    file.set_permissions(fs::Permissions::from_mode(0o600))?;
    const CHUNK: usize = 64 * 1024;
    let chunk = vec![0xA5u8; CHUNK];
    let mut written = 0u64;
    while written < RESERVE_BYTES {
        file.write_all(&chunk)?;
        written += CHUNK as u64;
    }
    file.sync_all()
}

/// [`keep`], logged; for the periodic check while the server runs.
pub(crate) fn keep_logged(path: &Path) {
    match keep(path) {
        Ok(Kept::Unchanged) => {}
        Ok(Kept::Released(path)) => tracing::warn!(
            path = %path.display(),
            "the disk is nearly full: released the store's reserve so that it can still write; free space on it"
        ),
        Ok(Kept::Made(path)) => tracing::info!(path = %path.display(), "made the store's reserve"),
        Err(error) => tracing::warn!(error = %error, "cannot keep the store's reserve"),
    }
}

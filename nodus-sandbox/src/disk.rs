//! Disk limits of local working directories: what a working directory takes on disk and what
//! its file system has left, watched while a command runs so that one run cannot fill the
//! disk the store writes to.
//!
//! A command is stopped when, while it runs, its working directory has grown (it is larger
//! than when the command started) and is now larger than the sandbox's
//! [`Limits::disk_bytes`](nodus_core::sandbox::Limits::disk_bytes) (with 1 MiB of slack for
//! its directories), or the file system holding it has less free space than the backend's
//! reserve. A command that ends by itself with the directory at the limit (a writer that
//! `ulimit -f` stopped) is reported as stopped too. A directory that is already too large
//! does not stop a command that frees space (`rm`), so a run can always clean up.

use std::collections::HashSet;
use std::fs;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::workdir::blocking;

/// How often a running command's working directory is measured, at most: a directory that
/// takes long to measure is measured less often (see [`Watch::pause`]).
const WATCH_INTERVAL: Duration = Duration::from_millis(200);

/// How far past the limit the watchdog lets a working directory grow before it stops the
/// command: room for its directories, so that a single file, which `ulimit -f` ends exactly
/// at the limit, is not cut short by the watchdog first.
const WATCH_SLACK: u64 = 1 << 20;

/// At most this share of the time goes to measuring: after a measurement that took `t`, the
/// next waits at least `t` times this.
const WATCH_SPACING: u32 = 4;

/// What to watch while one command runs.
#[derive(Debug, Clone)]
pub(crate) struct Watch {
    /// The working directory.
    pub(crate) dir: PathBuf,
    /// The most bytes it may take.
    pub(crate) limit: u64,
    /// The free bytes its file system must keep.
    pub(crate) reserve: u64,
}

impl Watch {
    /// The bytes the working directory takes now (its starting point for [`Watch::check`]).
    pub(crate) async fn start(&self) -> u64 {
        let dir = self.dir.clone();
        blocking(move || Ok(usage(&dir))).await.unwrap_or(0)
    }

    /// Watches from `start` every [`WATCH_INTERVAL`] or more (see [`Watch::check`]) and answers,
    /// when the command must stop, why; never while it may go on.
    pub(crate) async fn until_stopped(&self, start: u64) -> String {
        let mut pause = WATCH_INTERVAL;
        loop {
            tokio::time::sleep(pause).await;
            match self.check(start).await {
                (Some(reason), _) => return reason,
                (None, next) => pause = next,
            }
        }
    }

    /// Why the command must stop, if it must: the working directory grew past `start` and
    /// is over the limit, or grew while the file system has less free space than the
    /// reserve. Also how long to wait before the next check.
    pub(crate) async fn check(&self, start: u64) -> (Option<String>, Duration) {
        let watch = self.clone();
        let began = std::time::Instant::now();
        let verdict = blocking(move || Ok(watch.check_now(start)))
            .await
            .unwrap_or(None);
        let pause = WATCH_INTERVAL.max(began.elapsed() * WATCH_SPACING);
        (verdict, pause)
    }

    fn check_now(&self, start: u64) -> Option<String> {
        let used = usage(&self.dir);
        if used <= start {
            return None;
        }
        if used > self.limit.saturating_add(WATCH_SLACK) {
            return Some(format!(
                "the working directory grew past its disk limit of {} bytes (delete files or write \
                 less)",
                self.limit
            ));
        }
        match free_bytes(&self.dir) {
            Ok(free) if free < self.reserve => Some(format!(
                "the disk of the working directories has {free} bytes free, less than the \
                 {} bytes kept free for the server",
                self.reserve
            )),
            _ => None,
        }
    }

    /// Why a command that ended by itself stopped at the limit, if it did: the working
    /// directory grew and reached the limit (as when `ulimit -f` ended a writer at it).
    pub(crate) async fn reached(&self, start: u64) -> Option<String> {
        let watch = self.clone();
        blocking(move || {
            let used = usage(&watch.dir);
            Ok((used > start && used >= watch.limit).then(|| {
                format!(
                    "the working directory reached its disk limit of {} bytes (delete files or \
                     write less)",
                    watch.limit
                )
            }))
        })
        .await
        .unwrap_or(None)
    }
}

/// Bytes allocated on disk under `dir` (blocks, so sparse files count what they hold), without
/// following symbolic links, counting each hard-linked file once. What cannot be read counts
/// as nothing.
pub(crate) fn usage(dir: &Path) -> u64 {
    let mut total = 0u64;
    let mut linked = HashSet::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(path) = stack.pop() {
        let Ok(meta) = fs::symlink_metadata(&path) else {
            continue;
        };
        if meta.nlink() > 1 && !meta.is_dir() && !linked.insert((meta.dev(), meta.ino())) {
            continue;
        }
        total = total.saturating_add(meta.blocks().saturating_mul(512));
        if meta.is_dir()
            && let Ok(children) = fs::read_dir(&path)
        {
            stack.extend(children.flatten().map(|child| child.path()));
        }
    }
    total
}

/// The bytes an unprivileged user may still write on the file system of `path`.
pub(crate) fn free_bytes(path: &Path) -> io::Result<u64> {
    let stat = rustix::fs::statvfs(path)?;
    Ok(stat.f_bavail.saturating_mul(stat.f_frsize))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_counts_blocks_once_per_file() {
        let dir = std::env::temp_dir().join(format!("nodus-disk-usage-{}", std::process::id()));
        fs::create_dir_all(dir.join("sub")).expect("dir");
        fs::write(dir.join("sub/a"), vec![1u8; 100_000]).expect("write");
        fs::hard_link(dir.join("sub/a"), dir.join("b")).expect("link");
        std::os::unix::fs::symlink("/usr", dir.join("l")).expect("symlink");
        let used = usage(&dir);
        assert!((100_000..150_000).contains(&used), "{used}");
        assert!(free_bytes(&dir).expect("statvfs") > 0);
        fs::remove_dir_all(&dir).expect("clean up");
    }
}

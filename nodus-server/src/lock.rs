//! One process per data directory: an exclusive advisory lock on a file in it, held for the
//! process's life, with the holder's pid and command written in it for the refusal.

use std::io::{Read as _, Seek as _, Write as _};
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::Path;

use rustix::fs::{FlockOperation, flock};

use crate::start_error::StartError;

/// The lock file in the data directory.
pub const LOCK_FILE: &str = "nodus.lock";

/// The data directory's lock; released when dropped (and by the kernel when the process
/// dies, so a lock file left by a dead process does not block).
#[derive(Debug)]
pub struct DataDirLock {
    _file: std::fs::File,
}

/// Take the lock of `dir` without waiting, and write this process's pid and command in it.
pub fn lock(dir: &Path) -> Result<DataDirLock, StartError> {
    let refuse = |reason: String| StartError::DataDir {
        path: dir.display().to_string(),
        reason,
    };
    let failed = |error: std::io::Error| refuse(format!("its lock file {LOCK_FILE}: {error}"));
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(dir.join(LOCK_FILE))
        .map_err(failed)?;
    match flock(&file, FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => {}
        Err(rustix::io::Errno::WOULDBLOCK) => {
            let mut holder = String::new();
            let _ = file.read_to_string(&mut holder);
            let mut lines = holder.lines().map(str::trim);
            let who = match (lines.next(), lines.next()) {
                // A pid no longer running is the last holder's: the new one has not written
                // its name yet.
                (Some(pid), Some(command))
                    if pid.parse::<u32>().is_ok()
                        && !command.is_empty()
                        && Path::new("/proc").join(pid).exists() =>
                {
                    format!("`{command}` (pid {pid})")
                }
                _ => "another process".to_string(),
            };
            return Err(refuse(format!(
                "it is in use by {who}; stop it or pass --data-dir with another directory"
            )));
        }
        Err(error) => return Err(failed(error.into())),
    }
    file.set_len(0).map_err(failed)?;
    file.rewind().map_err(failed)?;
    file.write_all(format!("{}\n{}\n", std::process::id(), command()).as_bytes())
        .map_err(failed)?;
    Ok(DataDirLock { _file: file })
}

/// This process's command as the refusal shows it: the program's name and its subcommand
/// (`nodus server`), never its other arguments, which may hold a token.
fn command() -> String {
    let mut args = std::env::args();
    let program = args
        .next()
        .map(|arg0| {
            Path::new(&arg0)
                .file_name()
                .map_or(arg0.clone(), |name| name.to_string_lossy().into_owned())
        })
        .unwrap_or_else(|| "nodus".to_string());
    match args.next() {
        Some(sub)
            if !sub.is_empty()
                && sub
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
                && !sub.starts_with('-') =>
        {
            format!("{program} {sub}")
        }
        _ => program,
    }
}

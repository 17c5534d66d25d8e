//! Local processes for a command, shared by the unisolated and the bubblewrap backends: the
//! command's process group is killed on timeout, when its shell exits and when the caller
//! stops waiting; stdout and stderr are read while it runs and capped. A disk watch, when
//! given, stops the command as soon as its working directory takes too much.

use std::io;
use std::time::Duration;

use nodus_core::output::Output;
use nodus_core::sandbox::{Error, ExecOutput};
use rustix::process::{Pid, Signal};
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::process::Command;
use tracing::{debug, warn};

use crate::capped;
use crate::disk::Watch;

/// How long output is still read after the shell has exited and its group was killed. Only
/// a process that left the group can hold a pipe open that long.
pub(crate) const DRAIN_GRACE: Duration = Duration::from_secs(1);

/// Size of one read from a command's stdout or stderr.
const READ_CHUNK: usize = 64 * 1024;

/// Why a command could not be spawned. Spawning fails before the command runs, so no
/// failure here is uncertain: a lack of descriptors, processes or memory is worth a retry.
pub(crate) fn spawn_error(e: io::Error) -> Error {
    use rustix::io::Errno;
    let short_of = [Errno::MFILE, Errno::NFILE, Errno::AGAIN, Errno::NOMEM];
    if short_of
        .iter()
        .any(|errno| e.raw_os_error() == Some(errno.raw_os_error()))
    {
        return Error::NotStarted(e.to_string());
    }
    match e.kind() {
        io::ErrorKind::NotFound => Error::Refused(format!("cannot start the command: {e}")),
        // The command line or environment is more than the kernel takes: it certainly did
        // not run.
        io::ErrorKind::InvalidInput | io::ErrorKind::ArgumentListTooLong => {
            Error::Refused(format!("cannot run this command: {e}"))
        }
        _ => Error::Refused(format!("cannot start the command: {e}")),
    }
}

/// Runs a prepared command (stdout and stderr piped, its own process group, killed on drop)
/// for at most `timeout`, keeping `cap` bytes of each stream. The whole process group is
/// killed when the command ends or times out, and when the returned future is dropped.
/// With a `watch`, the group is also killed when the working directory grows past its limit
/// or the disk runs short, and [`ExecOutput::stopped`] says which.
pub(crate) async fn run(
    mut command: Command,
    timeout: Duration,
    cap: u64,
    watch: Option<Watch>,
) -> Result<ExecOutput, Error> {
    let start = match &watch {
        Some(watch) => watch.start().await,
        None => 0,
    };
    let mut child = command.spawn().map_err(spawn_error)?;
    // With `process_group(0)` the spawned process leads a new group whose id is its pid.
    let mut group = ProcessGroup::of(child.id());
    let (Some(stdout), Some(stderr)) = (child.stdout.take(), child.stderr.take()) else {
        return Err(Error::Failed(
            "the command's output pipes are missing".to_owned(),
        ));
    };
    let cap = capped::cap_len(cap);
    let mut out = Output::default();
    let mut err = Output::default();

    let (status, drained, mut stopped) = {
        let watchdog = async {
            match &watch {
                Some(watch) => watch.until_stopped(start).await,
                None => std::future::pending().await,
            }
        };
        tokio::pin!(watchdog);
        let mut stopped = None;
        let drain = async {
            let (a, b) = tokio::join!(
                read_capped(stdout, cap, &mut out),
                read_capped(stderr, cap, &mut err)
            );
            a.and(b)
        };
        tokio::pin!(drain);
        let timer = tokio::time::sleep(timeout);
        tokio::pin!(timer);
        let mut drained = None;
        let status = loop {
            tokio::select! {
                status = child.wait() => break Some(status),
                result = &mut drain, if drained.is_none() => drained = Some(result),
                () = &mut timer => break None,
                reason = &mut watchdog => {
                    stopped = Some(reason);
                    break None;
                }
            }
        };
        // Killing the group closes the pipes of all its processes; what they wrote is still
        // read below.
        group.kill();
        if drained.is_none() {
            drained = tokio::time::timeout(DRAIN_GRACE, &mut drain).await.ok();
        }
        (status, drained, stopped)
    };

    let timed_out = status.is_none() && stopped.is_none();
    let exit_code = match status {
        // `None` when a signal ended the process.
        Some(Ok(status)) => status.code(),
        Some(Err(e)) => return Err(Error::Failed(format!("waiting for the command: {e}"))),
        None => {
            // The process was killed with its group; reap it (dropping the child would too).
            if tokio::time::timeout(DRAIN_GRACE, child.wait())
                .await
                .is_err()
            {
                warn!("a killed command did not exit in time");
            }
            None
        }
    };
    match drained {
        Some(Err(e)) => Err(Error::Failed(format!("reading the command's output: {e}"))),
        Some(Ok(())) => Ok(()),
        None => {
            debug!("a process that left the command's process group still holds its output open");
            Ok(())
        }
    }?;
    if let (Some(watch), None, Some(_)) = (&watch, &stopped, exit_code) {
        stopped = watch.reached(start).await;
    }
    Ok(ExecOutput {
        exit_code,
        stdout: out,
        stderr: err,
        timed_out,
        stopped,
    })
}

/// Reads `reader` to its end, keeping the first `cap` bytes in `out` and marking it truncated
/// when more came.
async fn read_capped<R: AsyncRead + Unpin>(
    mut reader: R,
    cap: usize,
    out: &mut Output,
) -> io::Result<()> {
    let mut buf = vec![0u8; READ_CHUNK];
    loop {
        let n = reader.read(&mut buf).await?;
        let Some(chunk) = buf.get(..n).filter(|chunk| !chunk.is_empty()) else {
            return Ok(());
        };
        capped::push(out, cap, chunk);
    }
}

/// A process group that is killed when this value is dropped, unless killed before.
#[derive(Debug)]
pub(crate) struct ProcessGroup(Option<Pid>);

impl ProcessGroup {
    /// The group led by `leader` (a process spawned with `process_group(0)`).
    pub(crate) fn of(leader: Option<u32>) -> Self {
        // Never group 0 or 1: `kill(-1)` would signal every process the server may signal.
        let pid = leader
            .and_then(|pid| i32::try_from(pid).ok())
            .filter(|&pid| pid > 1)
            .and_then(Pid::from_raw);
        ProcessGroup(pid)
    }

    /// Kills every process of the group (once).
    pub(crate) fn kill(&mut self) {
        if let Some(pid) = self.0.take() {
            match rustix::process::kill_process_group(pid, Signal::KILL) {
                Ok(()) | Err(rustix::io::Errno::SRCH) => {}
                Err(e) => {
                    warn!(group = pid.as_raw_nonzero().get(), error = %e, "killing a command's process group failed")
                }
            }
        }
    }
}

impl Drop for ProcessGroup {
    fn drop(&mut self) {
        self.kill();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Spawning fails before the command runs: running out of descriptors (or processes, or
    /// memory) is a retryable failure, never an uncertain one; other failures are refusals.
    #[test]
    fn a_spawn_failure_is_never_uncertain() {
        use rustix::io::Errno;
        for errno in [Errno::MFILE, Errno::NFILE, Errno::AGAIN, Errno::NOMEM] {
            let error = spawn_error(io::Error::from_raw_os_error(errno.raw_os_error()));
            assert!(
                matches!(error, Error::NotStarted(_)),
                "{errno:?}: {error:?}"
            );
            assert!(error.is_retryable(), "{errno:?}");
            assert!(error.to_string().contains("did not run"), "{error}");
        }
        let emfile = spawn_error(io::Error::from_raw_os_error(Errno::MFILE.raw_os_error()));
        assert!(
            emfile.to_string().contains("Too many open files"),
            "{emfile}"
        );
        for errno in [Errno::NOENT, Errno::ACCESS, Errno::TOOBIG, Errno::NOEXEC] {
            let error = spawn_error(io::Error::from_raw_os_error(errno.raw_os_error()));
            assert!(matches!(error, Error::Refused(_)), "{errno:?}: {error:?}");
        }
    }
}

//! The resident launcher ([`nodus_launch`] started with [`nodus_launch::FORKS_ARG`]): one
//! per backend, started after the launcher's self-check, it forks each sandbox's stage one
//! instead of a launcher program starting per sandbox. A sandbox it starts is a [`Forked`]
//! process: a pid and a pidfd, watched by the runtime.
//!
//! It is spawned from a thread of its own that lives as long as it is wanted: its
//! parent-death signal follows the thread that started it, and a runtime's worker (or a
//! blocking-pool thread, which ends when idle) would take it down with it.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use nodus_core::sandbox::Error;
use nodus_launch::zygote_protocol::{self, Failure};
use tokio::io::unix::AsyncFd;
use tracing::{debug, warn};

/// How long an answer may take before the resident launcher counts as gone (a fork takes
/// well under a millisecond; a stopped or stuck launcher is replaced).
const ANSWER_TIMEOUT: Duration = Duration::from_secs(10);

/// A running resident launcher.
#[derive(Debug)]
struct Zygote {
    socket: OwnedFd,
    child: std::process::Child,
    /// Dropped with this value: the thread that spawned the launcher then ends.
    _keeper: std::sync::mpsc::Sender<()>,
}

impl Zygote {
    /// Starts `program` as the resident launcher: as this process's user, in `/`, with an
    /// empty environment, its stdin the socket, stdout `/dev/null`, stderr this process's,
    /// with a pool of `netns_pool` network namespaces (used on a root server only).
    fn start(program: &Path, netns_pool: usize) -> Result<Zygote, String> {
        let (socket, theirs) =
            zygote_protocol::socket_pair().map_err(|e| format!("making its socket: {e}"))?;
        rustix::net::sockopt::set_socket_timeout(
            &socket,
            rustix::net::sockopt::Timeout::Recv,
            Some(ANSWER_TIMEOUT),
        )
        .map_err(|e| format!("setting its socket's timeout: {e}"))?;
        let mut command = std::process::Command::new(program);
        std::os::unix::process::CommandExt::arg0(&mut command, "nodus-launch");
        command
            .arg(nodus_launch::FORKS_ARG)
            .arg(nodus_launch::NETNS_POOL_ARG)
            .arg(netns_pool.to_string())
            .stdin(Stdio::from(theirs))
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .current_dir("/")
            .env_clear();
        let (spawned_tx, spawned) = std::sync::mpsc::channel();
        let (keeper, kept) = std::sync::mpsc::channel::<()>();
        std::thread::Builder::new()
            .name("nodus-zygote".to_owned())
            .spawn(move || {
                let _ = spawned_tx.send(command.spawn());
                // Until the `Zygote` goes (its sender dropped): this thread's end would send
                // the launcher its parent-death signal.
                let _ = kept.recv();
            })
            .map_err(|e| format!("starting its thread: {e}"))?;
        let child = spawned
            .recv()
            .map_err(|_| "its thread ended".to_owned())?
            .map_err(|e| format!("starting {}: {e}", program.display()))?;
        Ok(Zygote {
            socket,
            child,
            _keeper: keeper,
        })
    }
}

impl Drop for Zygote {
    fn drop(&mut self) {
        // Its children's stage one (the sandboxes it started) end with it.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The resident launcher of a backend, started again when it is gone.
#[derive(Debug)]
pub(crate) struct Resident {
    program: PathBuf,
    netns_pool: usize,
    /// One request at a time; `None` until started, or when gone.
    zygote: Mutex<Option<Zygote>>,
}

impl Resident {
    /// Starts the resident launcher `program` (the backend's launcher executable), with a
    /// pool of `netns_pool` network namespaces.
    pub(crate) fn start(program: &Path, netns_pool: usize) -> Result<Resident, Error> {
        let zygote = Zygote::start(program, netns_pool)
            .map_err(|why| Error::Failed(format!("cannot start the resident launcher: {why}")))?;
        Ok(Resident {
            program: program.to_path_buf(),
            netns_pool,
            zygote: Mutex::new(Some(zygote)),
        })
    }

    /// The pid of the resident launcher running now, if one is (for tests and operators).
    pub(crate) fn pid(&self) -> Option<u32> {
        let held = self.zygote.lock().unwrap_or_else(PoisonError::into_inner);
        held.as_ref().map(|zygote| zygote.child.id())
    }

    /// Starts the sandbox of `plan` (encoded) with `stdout` and `stderr`: a fork of the
    /// resident launcher, which is started again (once) when it is gone. `None` when it
    /// cannot: the caller spawns the launcher for this sandbox instead. Blocks for the
    /// exchange (a fork's time), as a spawn does.
    pub(crate) fn fork(
        &self,
        plan: &[u8],
        stdout: BorrowedFd<'_>,
        stderr: BorrowedFd<'_>,
    ) -> Option<zygote_protocol::Forked> {
        let mut held = self.zygote.lock().unwrap_or_else(PoisonError::into_inner);
        for attempt in 0..2 {
            let zygote = match held.as_mut() {
                Some(zygote) => zygote,
                None => match Zygote::start(&self.program, self.netns_pool) {
                    Ok(zygote) => held.insert(zygote),
                    Err(why) => {
                        warn!(%why, "cannot start the resident launcher again: this sandbox's launcher is spawned");
                        return None;
                    }
                },
            };
            match zygote_protocol::request(zygote.socket.as_fd(), plan, stdout, stderr) {
                Ok(forked) => return Some(forked),
                Err(Failure::Gone(why)) => {
                    debug!(%why, attempt, "the resident launcher is gone: starting another");
                    *held = None;
                }
                Err(Failure::Refused(why)) => {
                    warn!(%why, "the resident launcher refused a sandbox: its launcher is spawned");
                    return None;
                }
            }
        }
        None
    }
}

/// A sandbox's first process forked by the resident launcher (which reaps it): its pid and a
/// pidfd, readable once it has exited. Killed when dropped.
#[derive(Debug)]
pub(crate) struct Forked {
    pid: u32,
    pidfd: AsyncFd<OwnedFd>,
}

impl Forked {
    /// Watches `forked` with this runtime.
    pub(crate) fn new(forked: zygote_protocol::Forked) -> std::io::Result<Forked> {
        // Deprecated (its replacement is `unsafe`, which this crate forbids) because a value
        // that does not own its descriptor could close it while registered. An `OwnedFd`
        // owns it, and the `AsyncFd` keeps it open, the same descriptor, until it is dropped:
        // what `register_with_interest` asks of its caller.
        #[allow(deprecated)]
        let pidfd = AsyncFd::with_interest(forked.pidfd, tokio::io::Interest::READABLE)?;
        Ok(Forked {
            pid: forked.pid,
            pidfd,
        })
    }

    /// Its pid, while it has not exited (once exited, the launcher may reap it and the pid
    /// name another process).
    pub(crate) fn id(&self) -> Option<u32> {
        self.running().then_some(self.pid)
    }

    /// Whether it has not exited: a pidfd is readable once its process has.
    pub(crate) fn running(&self) -> bool {
        let mut polled = [rustix::event::PollFd::new(
            self.pidfd.get_ref(),
            rustix::event::PollFlags::IN,
        )];
        let now = rustix::event::Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        match rustix::event::poll(&mut polled, Some(&now)) {
            Ok(_) => polled[0].revents().is_empty(),
            Err(_) => false,
        }
    }

    /// Sends it SIGKILL (through the pidfd: never another process).
    pub(crate) fn kill(&self) {
        match rustix::process::pidfd_send_signal(
            self.pidfd.get_ref(),
            rustix::process::Signal::KILL,
        ) {
            Ok(()) | Err(rustix::io::Errno::SRCH) => {}
            Err(e) => warn!(pid = self.pid, error = %e, "killing a sandbox's first process failed"),
        }
    }

    /// Waits until it has exited.
    pub(crate) async fn wait(&self) {
        // The readiness is left set: a pidfd stays readable once its process has exited.
        let _ = self.pidfd.readable().await;
    }
}

impl Drop for Forked {
    fn drop(&mut self) {
        if self.running() {
            self.kill();
        }
    }
}

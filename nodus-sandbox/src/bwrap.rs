//! The process backend: each sandbox is one [bubblewrap] process over the run's working
//! directory, started when the sandbox is created and kept between its commands.
//!
//! Inside it, a shell reads commands over the [command channel](crate::channel) that the
//! Docker backend uses too (frames in over a socket that is also its stdout, output back
//! between per-command markers) and runs each as `/bin/sh -c` (a process start, not a sandbox
//! start), then kills whatever the command left running. The sandbox gets new user, pid, ipc,
//! uts, cgroup and network namespaces (the network only when the spec allows it), all
//! capabilities dropped, no further user namespaces, a new session, and `--die-with-parent`.
//! Its file system is a read-only tmpfs root with:
//! - the host's system directories read-only (`/usr`, `/bin`, `/sbin`, `/lib*`, `/etc`, and
//!   what [`BwrapConfig::extra_ro_binds`] adds);
//! - fresh `/proc` and `/dev`, a private `/tmp` (a tmpfs no larger than the memory limit,
//!   kept between commands while the sandbox's process lives);
//! - the sandbox's working directory at [`WORKDIR`], the only writable place that outlives
//!   the sandbox's process.
//!
//! Nothing else of the host is there: not the other sandboxes' directories, not the server's
//! files, not `/home`, `/root` or `/var`.
//!
//! Host user: a server running as root runs every sandbox as an unprivileged host user and
//! group ([`BwrapConfig::run_as`], by default [`DEFAULT_SANDBOX_USER`], 65534 `nobody` /
//! `nogroup`, no supplementary groups). On cgroup v1 (or without cgroups) the spawned process
//! drops to it before it runs anything, and the cgroup gate joins the sandbox's cgroups through
//! their `tasks` files, which are given to that user (only the sandbox's own: it cannot change
//! their limits); on v2, where joining needs root, the gate joins as root and util-linux
//! `setpriv` drops to the user as the last step before bubblewrap. So
//! file permissions keep host secrets out: what that user may not read on the host (`/etc/shadow`,
//! a 0600 root file anywhere under the bound directories, whenever it was made) it cannot read
//! in a sandbox either. Bubblewrap resolves the working directory's host path as that user, so
//! every ancestor of [`BwrapConfig::root`] must be searchable by it (a directory under `/root`
//! is not): [`Sandbox::create`] refuses, naming the directory, when one is not. Each working
//! directory is owned by that user, mode 0700; the directory that holds them is root's, 0711.
//! A server that is not root runs sandboxes as its own user (bubblewrap maps it in a user
//! namespace); its own files are then the ones to keep out of the bound directories.
//!
//! What a command can see of how it was started holds no host path: bubblewrap reads its
//! arguments from its standard input (`--args 0`, so `/proc/1/cmdline` is `bwrap --args 0`
//! and the channel's shell), starts in `/` with an empty environment, and the working
//! directory's host path, which `/proc/self/mountinfo` shows, is `<root>/sandboxes/<key>`.
//! Commands get `/dev/null` as standard input.
//!
//! Disk: a command's single files are limited to [`Limits::disk_bytes`] (`ulimit -f`), and a
//! watchdog measures the working directory while the command runs: when it grew past
//! [`Limits::disk_bytes`], or the file system of the working directories has less free space
//! than [`BwrapConfig::disk_reserve_bytes`], the command is killed and
//! [`ExecOutput::stopped`] says why (see the `disk` module).
//!
//! Limits: memory (without swap), processes and CPU go through cgroups where the host lets
//! this process manage them (v1 or v2); a command is moved into its
//! sandbox's cgroups before it starts. A limit that no cgroup enforces falls back to an rlimit
//! set inside the sandbox before the command runs (`ulimit -u` or `-p` for processes, counted per
//! sandbox thanks to its user namespace; `ulimit -v` for memory); CPU then has no limit but the
//! timeout. A server running as root without a pids cgroup is refused a sandbox: there
//! RLIMIT_NPROC would count every root process of the host. The command timeout and the
//! output cap hold everywhere.
//!
//! Layout: the sandbox with key `k` is the directory `root/sandboxes/k` and has the id `k`; it
//! outlives the server, so after a restart `create` with the same key works over the same
//! files. As with the unisolated backend, the environment and limits of a sandbox live in
//! memory: after a restart, `create` comes before `exec`.
//!
//! When a command's shell exits, the channel's shell kills whatever it left running
//! (`kill -9 -1` spares only itself and the namespace's init). A timeout, the disk watchdog,
//! or dropping the `exec` future kills bubblewrap and with it the whole namespace; so does
//! anything else that ends the sandbox's process (the OOM killer, an operator). The next
//! command then starts the sandbox again over the same working directory (a fresh `/tmp`);
//! a command is sent again only when the sandbox ended before it began, so none runs twice.
//! [`Sandbox::suspend`] ends it too, for a run that waits for a message, and removes its
//! cgroups (made again at the next start), so that a waiting run holds no process and no
//! cgroup. `--die-with-parent`
//! ties a sandbox to the server thread that started it (a runtime's worker): when that thread
//! ends, so does the sandbox, and its next command starts it again. A command ended by a signal reports
//! exit code 128 + the signal's number.
//!
//! Requires bubblewrap 0.8 or later and user namespaces. When `bwrap` is missing, `create`
//! refuses with a message that says how to install it.
//!
//! With [`BwrapConfig::launcher`] set, sandboxes are started by Nodus's own launcher
//! ([`nodus_launch`], the `launcher` module) instead: the same namespaces, file system, user
//! and limits, with fewer steps and no cgroup gate (the launcher joins the cgroups itself);
//! its PID 1 reads the channel and runs the commands itself, in place of the channel's shell.
//! A launcher that fails its self-check on this host leaves the backend on bubblewrap, and the
//! log says once which starts the sandboxes. With [`BwrapConfig::resident_launcher`] (the
//! default), the launcher is started once, after its self-check, as a resident process that
//! forks each sandbox's first process (see the `zygote` module): no program start per
//! sandbox. When it is gone (killed from outside) the next sandbox starts another; when that
//! fails, the launcher is spawned for each sandbox as without it. Killing it ends the
//! sandboxes it started (their first process has it as parent); their next command starts
//! them again.
//! On a root server it also keeps a pool of empty network namespaces
//! ([`BwrapConfig::netns_pool`]) for the sandboxes without network: a namespace goes back to
//! it only once every process that was in it is gone, and it belongs to the initial user
//! namespace, so that no sandbox can configure anything in it (nodus-launch's `netpool`).
//!
//! Egress: a sandbox whose spec carries an allowlist ([`SandboxSpec::egress`]) gets the egress
//! proxy as its only way out, with the launcher only ([`BwrapConfig::egress`]; bubblewrap
//! cannot run the bridge, and such a sandbox is refused there): the proxy's socket for it is
//! `root/egress/<key>.sock` (0600, the sandboxes' user's), the launcher hands each connection to
//! the sandbox's `127.0.0.1:3128` to it (nodus-launch's `egress` and `handoff` modules), and the commands get the proxy
//! variables. Destroying the sandbox closes its socket and its open connections.
//!
//! [bubblewrap]: https://github.com/containers/bubblewrap

use std::collections::{BTreeMap, HashMap};
use std::ffi::OsString;
use std::fs;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use nodus_core::Sandbox;
use nodus_core::sandbox::{
    Error, ExecOutput, ExecRequest, Limits, LiveOutput, SandboxId, SandboxInfo, SandboxSpec,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::Command;
use tokio::sync::OnceCell;
use tracing::{debug, info};

use crate::bubblewrap::{self, BwrapStart, bwrap_args, launch, prepare, probe};
use crate::cgroup::Cgroups;
use crate::channel::{self, Reading};
use crate::cpus::sandbox_cpus;
use crate::disk::Watch;
pub use crate::host::{
    BwrapConfig, CgroupUse, DEFAULT_CGROUP_POOL, DEFAULT_DISK_RESERVE_BYTES, DEFAULT_NETNS_POOL,
    DEFAULT_SANDBOX_USER, HostUser, WORKDIR,
};
use crate::host::{give_to, prepare_root, sandbox_env};
use crate::process::{self, DRAIN_GRACE, ProcessGroup};
use crate::watch::Watcher;
use crate::workdir::{SandboxesDir, blocking, check_env, in_existing_dir, inside_dir, remove_tree};
use crate::{archive, capped, paths};

/// How the gate's own failure message starts.
const GATE_MESSAGE: &[u8] = b"nodus-sandbox: cannot join the cgroup ";

/// What a sandbox was created with, and its live process.
#[derive(Debug, Clone)]
struct Created {
    env: BTreeMap<String, String>,
    limits: Limits,
    network: bool,
    /// The host path of the egress proxy's socket for this sandbox, whose only way out it is.
    egress: Option<PathBuf>,
    /// The host directory of the trust bundle with the egress proxy's authority, bound
    /// read-only at [`crate::trust::INSIDE_DIR`].
    trust: Option<PathBuf>,
    /// [`SandboxSpec::links`]: symbolic links in the sandbox's root into [`WORKDIR`].
    links: BTreeMap<String, String>,
    /// The sandbox's process while it runs (`None` before it starts again): the holder of
    /// this lock runs the sandbox's one command at a time.
    live: Arc<tokio::sync::Mutex<Option<Live>>>,
    /// The canonical working directory, found when the sandbox was made.
    home: PathBuf,
    /// The working directory's size as last measured, with the watch's mark taken before it.
    measured: Arc<std::sync::Mutex<Option<Measured>>>,
}

/// A working directory's size, and the watch's mark taken before it was measured: while the
/// watch gives the same mark, nothing in the directory changed and the size holds (see
/// [`Watcher::mark`]).
#[derive(Debug, Clone, Copy)]
struct Measured {
    mark: u64,
    bytes: u64,
}

/// Where a command runs: the sandbox's working directory on the host, the command's directory
/// as the sandbox sees it, and the working directory's size before the command, with the
/// watch's mark taken before that size was measured (when the watch gave one).
struct Place {
    home: PathBuf,
    inside: PathBuf,
    start: u64,
    start_mark: Option<u64>,
}

impl Created {
    /// The working directory's last measured size, if the watch vouches that it still holds.
    fn measured_now(&self, watcher: &Watcher, id: &str) -> Option<Measured> {
        let measured = (*self.measured.lock().unwrap_or_else(PoisonError::into_inner))?;
        (watcher.mark(id) == Some(measured.mark)).then_some(measured)
    }

    /// Keeps `bytes`, measured after the watch gave `mark` (nothing kept without one).
    fn remember(&self, mark: Option<u64>, bytes: u64) {
        *self.measured.lock().unwrap_or_else(PoisonError::into_inner) =
            mark.map(|mark| Measured { mark, bytes });
    }
}

/// The most bytes of what a sandbox said on stderr before its first command began that an
/// error keeps (bubblewrap's or the cgroup gate's complaint when it could not start).
const EARLY_STDERR: usize = 4096;

/// A running sandbox: bubblewrap, and in it the shell that reads commands over the shared
/// [command channel](crate::channel). Its stdout is one end of a socket pair, which also
/// carries the frames in (the shell reads them from it); stderr is a pipe. Dropping it kills
/// the sandbox: its process group, and with bubblewrap (`--die-with-parent`) its whole pid
/// namespace.
#[derive(Debug)]
struct Live {
    child: FirstProcess,
    group: ProcessGroup,
    input: tokio::net::unix::OwnedWriteHalf,
    output: tokio::net::unix::OwnedReadHalf,
    errors: tokio::net::unix::pipe::Receiver,
}

/// A sandbox's first process: spawned (bubblewrap, or the launcher spawned for it), or forked
/// by the resident launcher. Killed when dropped.
#[derive(Debug)]
enum FirstProcess {
    Spawned(tokio::process::Child),
    Forked(crate::zygote::Forked),
}

impl FirstProcess {
    /// Kills the only child of this process (the sandbox's init); whether it did.
    fn kill_only_child(&self) -> bool {
        match self {
            // Not reaped until waited for here: its pid is its own meanwhile.
            FirstProcess::Spawned(child) => {
                child.id().is_some_and(|pid| kill_only_child(pid, || true))
            }
            // The resident launcher reaps it once it has exited: the pid is still its own
            // if it has not exited after the children were read.
            FirstProcess::Forked(forked) => forked
                .id()
                .is_some_and(|pid| kill_only_child(pid, || forked.running())),
        }
    }

    /// Kills its process group (which it leads) while it runs: a forked first process is
    /// reaped by the resident launcher as soon as it has exited, and its number may then
    /// lead another process's group (pids wrap at 32768 on a small host). A spawned one's
    /// group is the `Live`'s [`ProcessGroup`], whose number stays its own until it is waited
    /// for here.
    fn kill_group(&self) {
        if let FirstProcess::Forked(forked) = self
            && let Some(pid) = forked.id()
        {
            ProcessGroup::of(Some(pid)).kill();
        }
    }

    fn start_kill(&mut self) {
        match self {
            FirstProcess::Spawned(child) => {
                let _ = child.start_kill();
            }
            FirstProcess::Forked(forked) => forked.kill(),
        }
    }

    /// Waits until it has exited.
    async fn wait(&mut self) {
        match self {
            FirstProcess::Spawned(child) => {
                let _ = child.wait().await;
            }
            FirstProcess::Forked(forked) => forked.wait().await,
        }
    }

    /// Whether it has not exited.
    fn running(&mut self) -> bool {
        match self {
            FirstProcess::Spawned(child) => matches!(child.try_wait(), Ok(None)),
            FirstProcess::Forked(forked) => forked.running(),
        }
    }
}

/// How a command sent to a live sandbox came out.
enum Ran {
    /// Both end markers came.
    Ended(Reading),
    /// The timeout hit and the sandbox was stopped; what the command printed until then.
    TimedOut(Reading),
    /// The disk watch stopped it (and the sandbox), for this reason.
    Stopped(Reading, String),
    /// The sandbox's streams ended before the command did; what its stderr said before any
    /// command began.
    Closed(Reading, Vec<u8>),
}

impl Ran {
    /// The command's status (when it ended), what it printed, and why the disk watch stopped
    /// it; an error when the sandbox `id` ended before the command did.
    fn outcome(
        self,
        id: &SandboxId,
    ) -> Result<(Option<channel::Status>, Reading, Option<String>), Error> {
        match self {
            Ran::Ended(reading) => Ok((Some(reading.status()?), reading, None)),
            Ran::TimedOut(reading) => Ok((None, reading, None)),
            Ran::Stopped(reading, reason) => Ok((None, reading, Some(reason))),
            Ran::Closed(reading, early) if !reading.begun() => {
                let said = String::from_utf8_lossy(&early).trim().to_owned();
                if early.starts_with(GATE_MESSAGE) {
                    return Err(Error::Failed(said));
                }
                Err(Error::Failed(format!(
                    "the sandbox {id} did not start: {said}"
                )))
            }
            Ran::Closed(..) => Err(Error::Unavailable(format!(
                "the sandbox {id} ended while a command ran"
            ))),
        }
    }
}

impl Live {
    /// Kills the sandbox and waits (up to [`DRAIN_GRACE`]) until its first process has
    /// exited. That process (the launcher's stage one, or bubblewrap) has one child, the
    /// sandbox's init: killed first, it takes every process of its pid namespace with it
    /// before it is gone, and the first process, which waits for it, exits after it. So once
    /// the first process has exited, the sandbox's own processes have all left its cgroups,
    /// which are then found empty at the first look instead of being polled meanwhile. When
    /// the init cannot be found that way, the first process is killed, and the init dies
    /// with it (its parent-death signal).
    async fn end(mut self) {
        let init_killed = self.child.kill_only_child();
        if !init_killed {
            self.kill();
        }
        if tokio::time::timeout(DRAIN_GRACE, self.child.wait())
            .await
            .is_err()
        {
            debug!("a killed sandbox's first process did not exit in time");
        }
        // Whatever is left of its process group (dropping the child kills it too).
        self.group.kill();
    }

    /// Whether the sandbox's process still runs.
    fn running(&mut self) -> bool {
        self.child.running()
    }

    /// Kills the sandbox's first process and its process group (the init dies with the
    /// first process: its parent-death signal).
    fn kill(&mut self) {
        self.group.kill();
        self.child.kill_group();
        self.child.start_kill();
    }

    /// Sends one command's frame and reads its output until both end markers, the timeout or
    /// the disk `watch` (from the size `start`); on the last two, and when the sandbox's
    /// streams end first, kills the sandbox and reads what is left for a moment.
    async fn run(
        &mut self,
        frame: &[u8],
        mut reading: Reading,
        timeout: Duration,
        watch: &Watch,
        start: u64,
    ) -> Result<Ran, Error> {
        let mut early = Vec::new();
        let (mut out_buf, mut err_buf) = (vec![0u8; 64 * 1024], vec![0u8; 64 * 1024]);
        let (mut out_open, mut err_open) = (true, true);
        let (mut stopped, mut timed_out) = (None, false);
        // Once set, the sandbox was killed and its last output is read until then.
        let mut grace = None;
        if self.input.write_all(frame).await.is_err() {
            out_open = false;
        }
        let deadline = tokio::time::Instant::now() + timeout;
        let watchdog = watch.until_stopped(start);
        tokio::pin!(watchdog);
        loop {
            if grace.is_none() && (!out_open || stopped.is_some() || timed_out) {
                // Timed out, stopped, or gone: whatever is left of the sandbox goes.
                self.kill();
                grace = Some(tokio::time::Instant::now() + DRAIN_GRACE);
            }
            if (grace.is_none() && reading.done()) || (!out_open && !err_open) {
                break;
            }
            // Reads are cancel-safe: what was not taken stays in the socket or pipe.
            tokio::select! {
                n = self.output.read(&mut out_buf), if out_open => match n {
                    Ok(n @ 1..) => reading.stdout.feed(&out_buf[..n])?,
                    _ => out_open = false,
                },
                n = self.errors.read(&mut err_buf), if err_open => match n {
                    Ok(n @ 1..) => {
                        if !reading.begun() {
                            let room = EARLY_STDERR.saturating_sub(early.len());
                            early.extend_from_slice(&err_buf[..n.min(room)]);
                        }
                        reading.stderr.feed(&err_buf[..n])?;
                    }
                    _ => err_open = false,
                },
                () = tokio::time::sleep_until(deadline), if grace.is_none() => timed_out = true,
                reason = &mut watchdog, if grace.is_none() => stopped = Some(reason),
                () = tokio::time::sleep_until(grace.unwrap_or(deadline)), if grace.is_some() => break,
            }
        }
        if grace.is_none() {
            return Ok(Ran::Ended(reading));
        }
        reading.finish();
        Ok(match (stopped, timed_out) {
            (Some(reason), _) => Ran::Stopped(reading, reason),
            (None, true) => Ran::TimedOut(reading),
            (None, false) => Ran::Closed(reading, early),
        })
    }
}

/// Kills the only child of the process `pid` (through a pidfd, so that no other process that
/// took its number is hit); whether it did. A process with no child or several is left alone.
/// `still_ours` says, after the children were read, that `pid` was not reaped meanwhile (so
/// that the list read was that process's).
fn kill_only_child(pid: u32, still_ours: impl Fn() -> bool) -> bool {
    let list = format!("/proc/{pid}/task/{pid}/children");
    let Ok(children) = fs::read_to_string(&list) else {
        return false;
    };
    let mut listed = children.split_whitespace();
    let (Some(only), None) = (listed.next(), listed.next()) else {
        return false;
    };
    let Some(child) = only
        .parse::<i32>()
        .ok()
        .filter(|&child| child > 1)
        .and_then(rustix::process::Pid::from_raw)
    else {
        return false;
    };
    let Ok(pidfd) = rustix::process::pidfd_open(child, rustix::process::PidfdFlags::empty()) else {
        return false;
    };
    // The pidfd names whichever process had that number when it was opened: the child's, if
    // the list still names it (a child is listed until its parent reaps it).
    let still = fs::read_to_string(&list).unwrap_or_default();
    if !still.split_whitespace().any(|listed| listed == only) || !still_ours() {
        return false;
    }
    rustix::process::pidfd_send_signal(&pidfd, rustix::process::Signal::KILL).is_ok()
}

/// Pins this thread to the CPUs of a sandbox with `cpu_millis` ([`sandbox_cpus`]) for the
/// spawn of its process, which inherits them; the CPUs it had, to restore after the spawn,
/// or `None` when nothing was pinned.
fn pin_thread(cpu_millis: u32) -> Option<rustix::thread::CpuSet> {
    let allowed = rustix::thread::sched_getaffinity(None).ok()?;
    let pinned = sandbox_cpus(&allowed, cpu_millis)?;
    match rustix::thread::sched_setaffinity(None, &pinned) {
        Ok(()) => Some(allowed),
        Err(e) => {
            debug!(error = %e, "cannot pin a sandbox to its CPUs");
            None
        }
    }
}

/// A started sandbox: its first process (which leads its process group), the channel's socket
/// and the read end of its stderr.
fn live(
    child: FirstProcess,
    ours: std::os::unix::net::UnixStream,
    errors: OwnedFd,
) -> Result<Live, Error> {
    let failed = |e: io::Error| Error::Failed(format!("making the sandbox's channel: {e}"));
    // Its first process leads a new group whose id is its pid: killed through the value
    // (when dropped too) for a spawned one, only while it runs for a forked one (see
    // `FirstProcess::kill_group`).
    let group = match &child {
        FirstProcess::Spawned(spawned) => ProcessGroup::of(spawned.id()),
        FirstProcess::Forked(_) => ProcessGroup::of(None),
    };
    let errors = tokio::net::unix::pipe::Receiver::from_owned_fd(errors).map_err(failed)?;
    ours.set_nonblocking(true).map_err(failed)?;
    let (output, input) = tokio::net::UnixStream::from_std(ours)
        .map_err(failed)?
        .into_split();
    Ok(Live {
        child,
        group,
        input,
        output,
        errors,
    })
}

/// What every sandbox start needs, found once: what starts sandboxes, and as whom.
#[derive(Debug)]
struct Prepared {
    starter: Starter,
    /// The user the spawned process (the gate or bubblewrap) becomes before it starts, when no
    /// `setpriv` does: one exec fewer. Never with the launcher, which becomes the sandboxes'
    /// user itself after joining their cgroups.
    spawn_as: Option<HostUser>,
}

/// What starts a sandbox.
#[derive(Debug)]
enum Starter {
    /// Bubblewrap (behind the cgroup gate).
    Bwrap(BwrapStart),
    /// Nodus's own launcher ([`nodus_launch`]), resident when it could be started so.
    Launcher(crate::launcher::Layout, Option<crate::zygote::Resident>),
}

/// Sandboxes that are each one bubblewrap process. See the [module docs](self).
#[derive(Debug)]
pub struct BwrapSandbox {
    config: BwrapConfig,
    cgroups: Cgroups,
    prepared: OnceCell<Prepared>,
    created: Mutex<HashMap<String, Created>>,
    /// Where the sandboxes' working directories are (`root/sandboxes`).
    dirs: Arc<SandboxesDir>,
    /// What changed in each working directory.
    watcher: Arc<Watcher>,
}

impl BwrapSandbox {
    /// [`Sandbox::exec`], reporting the command's output to `followers` when given.
    async fn exec_reporting(
        &self,
        id: &SandboxId,
        request: &ExecRequest,
        followers: Option<Arc<dyn LiveOutput>>,
    ) -> Result<ExecOutput, Error> {
        let created = self
            .created()
            .get(&id.0)
            .cloned()
            .ok_or_else(|| Error::NotFound(id.clone()))?;
        let prepared = self.prepared().await?;
        let request = request.within(&created.limits)?;
        let shown_cwd = request.cwd.clone().unwrap_or_default();
        let rel = paths::relative(Path::new(&shown_cwd))
            .map_err(|why| Error::Refused(format!("working directory {shown_cwd:?} {why}")))?;
        // The slot first: whether the sandbox must start (and have its cgroups made) is then
        // known to `place`, which makes them in its trip to the blocking pool.
        let mut held = created.live.lock().await;
        let starts = !held.as_mut().is_some_and(Live::running);
        let Place {
            home,
            inside: cwd,
            start,
            start_mark,
        } = self
            .place(id, &created, prepared, rel, &shown_cwd, starts)
            .await?;
        let mut cgroups_made = starts;

        let inner = cwd.to_string_lossy().into_owned();
        let nonce = channel::nonce();
        let frame = channel::frame(&nonce, &inner, &request.command)?;
        let watch = Watch {
            dir: home.clone(),
            limit: created.limits.disk_bytes,
            reserve: self.config.disk_reserve_bytes,
        };
        let cap = capped::cap_len(request.output_cap);
        let mut fresh = false;
        let ran = loop {
            // A sandbox whose process died (killed from outside, or stopped with its last
            // command) starts again over the same working directory.
            let running = held
                .take()
                .and_then(|mut live| live.running().then_some(live));
            let mut live = match running {
                Some(live) => live,
                None => {
                    fresh = true;
                    // Its cgroups are gone when it was suspended: made above, unless it was
                    // running then (and ended since).
                    if !std::mem::take(&mut cgroups_made) {
                        blocking(self.cgroup_maker(prepared, &id.0, created.limits)).await?;
                    }
                    self.start(prepared, &id.0, &created, &home)?
                }
            };
            let reading = Reading::live(&nonce, cap, followers.clone());
            // While the command runs the sandbox is out of the slot: dropping this future
            // drops it, which kills it, and the next command starts it again.
            match live
                .run(&frame, reading, request.timeout, &watch, start)
                .await?
            {
                Ran::Ended(reading) => {
                    *held = Some(live);
                    break Ran::Ended(reading);
                }
                // It ended before this command began, so the command did not run: once more
                // in a fresh sandbox.
                Ran::Closed(reading, _) if !reading.begun() && !fresh => {}
                ran => break ran,
            }
        };
        let (status, reading, mut stopped) = ran.outcome(id)?;
        let exit_code = status.map(|s| s.exit_code(&shown_cwd)).transpose()?;
        // A command that wrote nothing in the working directory (the watch's mark the same as
        // before `start` was measured) left it as large as it found it: nothing to measure.
        let unchanged = start_mark.is_some() && self.watcher.mark(&id.0) == start_mark;
        if let (None, Some(_)) = (&stopped, exit_code)
            && !unchanged
        {
            stopped = watch.reached(start).await;
        }
        Ok(reading.into_exec_output(exit_code, stopped))
    }

    /// Where a command in `rel` (shown as `shown_cwd`) runs in the sandbox `id`, and its
    /// working directory's size before it; when the sandbox `starts`, its cgroups are made in
    /// the same trip to the blocking pool.
    async fn place(
        &self,
        id: &SandboxId,
        created: &Created,
        prepared: &Prepared,
        rel: PathBuf,
        shown_cwd: &str,
        starts: bool,
    ) -> Result<Place, Error> {
        // A command in the working directory itself, in a sandbox that runs and whose
        // directory the watch saw unchanged since it was last measured, needs no trip to the
        // blocking pool: its directory and its size are known. (A directory removed or moved
        // is an event of its watch.)
        if !starts
            && rel.as_os_str().is_empty()
            && let Some(measured) = created.measured_now(&self.watcher, &id.0)
        {
            return Ok(Place {
                home: created.home.clone(),
                inside: PathBuf::from(WORKDIR),
                start: measured.bytes,
                start_mark: Some(measured.mark),
            });
        }
        let (dirs, watcher) = (Arc::clone(&self.dirs), Arc::clone(&self.watcher));
        let (owned_id, shown) = (id.clone(), shown_cwd.to_owned());
        let make_cgroups = starts.then(|| self.cgroup_maker(prepared, &id.0, created.limits));
        // The directories, the disk watch's starting point (after the watch's mark), and the
        // cgroups of a sandbox that starts.
        let place = blocking(move || {
            let home = dirs.existing(&owned_id)?;
            let cwd = inside_dir(&home, &rel, &shown)?;
            let inner = cwd.strip_prefix(&home).unwrap_or(Path::new(""));
            let inside = if inner.as_os_str().is_empty() {
                PathBuf::from(WORKDIR)
            } else {
                Path::new(WORKDIR).join(inner)
            };
            let start_mark = watcher.mark(&owned_id.0);
            let start = crate::disk::usage(&home);
            if let Some(make) = make_cgroups {
                make()?;
            }
            Ok(Place {
                home,
                inside,
                start,
                start_mark,
            })
        })
        .await?;
        created.remember(place.start_mark, place.start);
        Ok(place)
    }

    /// What makes the cgroups of the sandbox `key` (on the blocking pool: it writes cgroupfs),
    /// entered by the user the sandbox's first process is spawned as.
    fn cgroup_maker(
        &self,
        prepared: &Prepared,
        key: &str,
        limits: Limits,
    ) -> impl FnOnce() -> Result<(), Error> + Send + 'static {
        let (cgroups, key) = (self.cgroups.clone(), key.to_owned());
        let entrant = prepared.spawn_as.map(|user| (user.uid, user.gid));
        move || cgroups.create(&key, &limits, entrant)
    }

    /// A backend with this configuration. Finds the host's cgroup controllers now (and
    /// creates the parent cgroups); `bwrap` itself is looked for and tried on the first
    /// [`Sandbox::create`].
    pub fn new(config: BwrapConfig) -> Self {
        let cgroups = match config.cgroups {
            CgroupUse::Auto => Cgroups::detect(&config.cgroup_parent, config.cgroup_pool),
            CgroupUse::Never => Cgroups::none(),
        };
        let enforced = cgroups.enforced();
        info!(
            root = %config.root.display(),
            memory = enforced.memory,
            pids = enforced.pids,
            cpu = enforced.cpu,
            "bubblewrap sandboxes (limits not enforced by cgroups fall back to rlimits)"
        );
        BwrapSandbox {
            dirs: Arc::new(SandboxesDir::new(config.root.join("sandboxes"))),
            config,
            cgroups,
            prepared: OnceCell::new(),
            created: Mutex::new(HashMap::new()),
            watcher: Arc::default(),
        }
    }

    /// Opens the egress proxy's socket for the sandbox of `spec` (which `network` lets out):
    /// `root/egress/<key>.sock`, which only the sandboxes' user (and the server) may connect
    /// to, and which no sandbox's file system shows. Refused without a proxy, or when
    /// sandboxes start with bubblewrap, which cannot bridge to it.
    async fn open_egress(
        &self,
        prepared: &Prepared,
        spec: &SandboxSpec,
        network: &nodus_core::resource::NetworkSpec,
    ) -> Result<(PathBuf, Option<PathBuf>), Error> {
        let refused = |why: &str| {
            Error::Refused(format!(
                "this sandbox's only way out would be the egress proxy, but {why}"
            ))
        };
        let Some(gate) = &self.config.egress else {
            return Err(refused("this backend was given none"));
        };
        if spec.network {
            return Err(refused("it asks for the host's network too"));
        }
        if !matches!(prepared.starter, Starter::Launcher(..)) {
            return Err(refused(
                "sandboxes start with bubblewrap here, which cannot bridge to it (the nodus \
                 launcher can)",
            ));
        }
        let dir = self.config.root.join("egress");
        let socket = dir.join(format!("{}.sock", spec.key));
        // sockaddr_un holds 108 bytes with the terminating NUL.
        if socket.as_os_str().len() > 107 {
            return Err(refused(&format!(
                "its socket's path {} is longer than a Unix socket's 107 bytes: give the \
                 server a shorter --sandbox-dir",
                socket.display()
            )));
        }
        let user = self.config.run_as;
        let made = dir.clone();
        blocking(move || {
            let failed = |e: io::Error| {
                Error::Failed(format!(
                    "making {} for the egress proxy: {e}",
                    made.display()
                ))
            };
            // Searchable by the sandboxes' user, listable by the server only.
            let mode = if user.is_some() { 0o711 } else { 0o700 };
            fs::DirBuilder::new()
                .recursive(true)
                .mode(mode)
                .create(&made)
                .map_err(failed)?;
            fs::set_permissions(&made, fs::Permissions::from_mode(mode)).map_err(failed)
        })
        .await?;
        gate.open(&spec.key, network, &spec.egress_headers, &socket)?;
        let trust = match gate.ca_certificate() {
            Some(ca) => {
                let dir = self.config.root.join("egress-trust");
                let made = dir.clone();
                blocking(move || {
                    crate::trust::write_bundle(&made, &ca).map_err(|e| {
                        Error::Failed(format!(
                            "writing the egress trust bundle in {}: {e}",
                            made.display()
                        ))
                    })
                })
                .await?;
                Some(dir)
            }
            None => None,
        };
        let owned = socket.clone();
        blocking(move || {
            let failed = |e: io::Error| {
                Error::Failed(format!(
                    "giving the egress socket to the sandbox's user: {e}"
                ))
            };
            // Stage one connects as the sandboxes' user.
            if let Some(user) = user {
                std::os::unix::fs::lchown(&owned, Some(user.uid), Some(user.gid))
                    .map_err(failed)?;
            }
            fs::set_permissions(&owned, fs::Permissions::from_mode(0o600)).map_err(failed)
        })
        .await?;
        Ok((socket, trust))
    }

    /// Whether sandboxes start with Nodus's own launcher (`false`: with bubblewrap); the
    /// choice is made at the first use, or here.
    pub async fn uses_launcher(&self) -> Result<bool, Error> {
        Ok(matches!(
            self.prepared().await?.starter,
            Starter::Launcher(..)
        ))
    }

    /// The pid of the resident launcher that forks this backend's sandboxes, when one runs
    /// ([`BwrapConfig::resident_launcher`]; `None` before the first sandbox, with
    /// bubblewrap, or while it is gone).
    pub fn resident_launcher_pid(&self) -> Option<u32> {
        match &self.prepared.get()?.starter {
            Starter::Launcher(_, Some(resident)) => resident.pid(),
            _ => None,
        }
    }

    /// Which limits hold: those cgroups enforce, and what stands in for the others (one
    /// sentence, for the server to say at start).
    pub fn limits(&self) -> String {
        self.cgroups.summary()
    }

    fn created(&self) -> std::sync::MutexGuard<'_, HashMap<String, Created>> {
        // The map stays consistent even if a holder panicked: each access is one call.
        self.created.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Starts the sandbox `key` over its working directory `home`: bubblewrap, joined to the
    /// sandbox's cgroups, as the sandboxes' user, running the shell that reads commands with
    /// the sandbox's rlimits set.
    fn start(
        &self,
        prepared: &Prepared,
        key: &str,
        created: &Created,
        home: &Path,
    ) -> Result<Live, Error> {
        let entry_files = self.cgroups.entry_files(key);
        let failed = |e: io::Error| Error::Failed(format!("making the sandbox's channel: {e}"));
        let (ours, theirs) = std::os::unix::net::UnixStream::pair().map_err(failed)?;
        let (errors, errors_theirs) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)
            .map_err(|e| failed(e.into()))?;
        let mut command = match &prepared.starter {
            Starter::Bwrap(bwrap) => {
                let start = bubblewrap::Start {
                    network: created.network,
                    tmp_bytes: created.limits.memory_bytes,
                    home,
                    links: links_of(created),
                    env: &created.env,
                };
                let args = bwrap_args(bwrap, start);
                launch(
                    bwrap,
                    prepared.spawn_as,
                    &entry_files,
                    &args,
                    &self.shell(created),
                )?
            }
            Starter::Launcher(layout, resident) => {
                // The launcher's PID 1 reads the channel itself (no shell): `/bin/sh -c` is
                // what each command is appended to.
                let mut plan = layout.plan(
                    entry_files,
                    self.config.run_as,
                    created.network,
                    created.limits.memory_bytes,
                    home,
                    sandbox_env(&created.env),
                    vec!["/bin/sh".into(), "-c".into()],
                );
                plan.channel = true;
                plan.egress = created.egress.clone();
                plan.ro_binds_at.extend(
                    created
                        .trust
                        .clone()
                        .map(|dir| (dir, PathBuf::from(crate::trust::INSIDE_DIR))),
                );
                plan.symlinks.extend(links_of(created));
                plan.rlimits = self.rlimits(created);
                // Stage one pins itself to the sandbox's CPUs (a fork of the resident launcher
                // inherits no pinned thread of this process).
                plan.cpus = rustix::thread::sched_getaffinity(None)
                    .ok()
                    .and_then(|allowed| sandbox_cpus(&allowed, created.limits.cpu_millis))
                    .map(|set| {
                        (0..rustix::thread::CpuSet::MAX_CPU)
                            .filter(|&cpu| set.is_set(cpu))
                            .collect()
                    })
                    .unwrap_or_default();
                if let Some(resident) = resident {
                    let data = plan
                        .encode()
                        .map_err(|e| Error::Refused(format!("cannot run this command: {e}")))?;
                    if let Some(forked) =
                        resident.fork(&data, theirs.as_fd(), errors_theirs.as_fd())
                    {
                        // Its copies are the sandbox's: without ours, the socket and the pipe
                        // end when the sandbox does.
                        drop((theirs, errors_theirs));
                        let forked = crate::zygote::Forked::new(forked).map_err(|e| {
                            Error::Failed(format!("watching the sandbox's process: {e}"))
                        })?;
                        return live(FirstProcess::Forked(forked), ours, errors);
                    }
                }
                crate::launcher::command(layout, &plan)?
            }
        };
        command
            .stdout(Stdio::from(OwnedFd::from(theirs)))
            .stderr(Stdio::from(errors_theirs))
            .process_group(0)
            .kill_on_drop(true);
        let pinned = matches!(prepared.starter, Starter::Bwrap(_));
        self.spawn(command, created, pinned, ours, errors)
    }

    /// The rlimits every command of a sandbox runs with: the file size always, processes and
    /// memory where no cgroup limits them.
    fn rlimits(&self, created: &Created) -> Vec<(nodus_launch::Limit, u64)> {
        let enforced = self.cgroups.enforced();
        let mut limits = Vec::new();
        if !enforced.pids {
            limits.push((
                nodus_launch::Limit::Processes,
                u64::from(created.limits.processes),
            ));
        }
        if !enforced.memory {
            limits.push((
                nodus_launch::Limit::AddressSpace,
                created.limits.memory_bytes / 1024 * 1024,
            ));
        }
        // In whole blocks of 512 bytes, as `ulimit -f` sets it.
        limits.push((
            nodus_launch::Limit::FileSize,
            created.limits.disk_bytes / 512 * 512,
        ));
        limits
    }

    /// The channel's shell, with the sandbox's rlimits set: what runs inside bubblewrap.
    fn shell(&self, created: &Created) -> [OsString; 5] {
        // Bubblewrap read its arguments from standard input: the shell reads its commands from
        // its stdout, the socket (commands get /dev/null as their stdin). Then the limits,
        // which every command inherits, then the channel's loop.
        let enforced = self.cgroups.enforced();
        let mut prelude = vec!["exec <&1".to_owned()];
        if !enforced.pids {
            // `-u` in bash and busybox, `-p` in dash.
            let n = created.limits.processes;
            prelude.push(format!("{{ ulimit -u {n} 2>/dev/null || ulimit -p {n}; }}"));
        }
        if !enforced.memory {
            prelude.push(format!("ulimit -v {}", created.limits.memory_bytes / 1024));
        }
        // In blocks of 512 bytes, as `sh` counts them.
        prelude.push(format!("ulimit -f {}", created.limits.disk_bytes / 512));
        let script = format!(
            "{} || exit 1\n{}",
            prelude.join(" && "),
            channel::FIRST_PROCESS
        );
        [
            "/bin/sh".into(),
            "-c".into(),
            script.into(),
            "nodus".into(),
            WORKDIR.into(),
        ]
    }

    /// Spawns a sandbox's `command` (its stdout the other end of `ours`, its stderr the other
    /// end of `errors`), on the CPUs of its limit when `pin` (the launcher pins itself).
    fn spawn(
        &self,
        mut command: Command,
        created: &Created,
        pin: bool,
        ours: std::os::unix::net::UnixStream,
        errors: OwnedFd,
    ) -> Result<Live, Error> {
        // The sandbox inherits the CPUs of the thread that starts it: pinned for the spawn
        // only, so that `nproc` inside shows its CPU limit.
        let restore = pin.then(|| pin_thread(created.limits.cpu_millis)).flatten();
        let spawned = command.spawn();
        if let Some(previous) = restore
            && let Err(e) = rustix::thread::sched_setaffinity(None, &previous)
        {
            tracing::warn!(error = %e, "cannot give this thread its CPUs back");
        }
        let child = spawned.map_err(process::spawn_error)?;
        // The command holds the sandbox's ends of the socket and the pipe: without them,
        // they end when the sandbox does.
        drop(command);
        live(FirstProcess::Spawned(child), ours, errors)
    }

    async fn prepared(&self) -> Result<&Prepared, Error> {
        self.prepared
            .get_or_try_init(|| async {
                let config = self.config.clone();
                let memory = Limits::default().memory_bytes;
                // On cgroup v1 the gate joins as the sandboxes' user (its `tasks` files are
                // given to it), so the spawn drops to that user and no `setpriv` runs.
                let drop_at_spawn = self.cgroups.all_v1();
                let spawn_as = config.run_as.filter(|_| drop_at_spawn);
                if let Some(program) = config.launcher.clone() {
                    let owned = config.clone();
                    let layout = blocking(move || {
                        prepare_root(&owned)?;
                        crate::launcher::prepare(&owned, program)
                    })
                    .await;
                    let tried = match layout {
                        Ok(layout) => {
                            let sandboxes = config.root.join("sandboxes");
                            crate::launcher::probe(&layout, &sandboxes, config.run_as, memory)
                                .await
                                .map(|()| layout)
                        }
                        Err(e) => Err(e),
                    };
                    match tried {
                        Ok(layout) => {
                            // The launcher is started as this process's user and becomes the
                            // sandboxes' user itself, after joining their cgroups.
                            let resident = if config.resident_launcher {
                                crate::zygote::Resident::start(&layout.program, config.netns_pool)
                                    .inspect_err(|e| {
                                        tracing::warn!(error = %e, "the launcher is spawned for each sandbox")
                                    })
                                    .ok()
                            } else {
                                None
                            };
                            info!(
                                launcher = %layout.program.display(),
                                resident = resident.is_some(),
                                "sandboxes start with the nodus launcher"
                            );
                            return Ok(Prepared {
                                starter: Starter::Launcher(layout, resident),
                                spawn_as: None,
                            });
                        }
                        Err(e) => tracing::warn!(
                            error = %e,
                            "the sandbox launcher failed its self-check on this host: sandboxes \
                             start with bubblewrap"
                        ),
                    }
                }
                let bwrap = blocking(move || prepare(&config, drop_at_spawn)).await?;
                probe(&bwrap, spawn_as, memory).await?;
                info!(bwrap = %bwrap.bwrap.display(), "sandboxes start with bubblewrap");
                Ok(Prepared {
                    starter: Starter::Bwrap(bwrap),
                    spawn_as,
                })
            })
            .await
    }
}

#[async_trait]
impl Sandbox for BwrapSandbox {
    async fn create(&self, spec: &SandboxSpec) -> Result<SandboxInfo, Error> {
        paths::check_key(&spec.key).map_err(Error::Refused)?;
        check_env(&spec.env)?;
        nodus_core::sandbox::check_links(&spec.links, WORKDIR).map_err(Error::Refused)?;
        if !self.cgroups.enforced().pids && rustix::process::getuid().is_root() {
            // RLIMIT_NPROC counts every process of the user, and root runs the whole host:
            // the fallback would leave the sandbox unable to start anything at all, or, unset,
            // leave a fork bomb uncontained. Refuse instead of pretending.
            return Err(Error::Refused(
                "no pids cgroup is available to limit this sandbox's processes, and the server \
                 runs as root, where an rlimit cannot do it: give the server a pids cgroup \
                 (cgroup v1 `pids` or v2 with the pids controller) or run it as an \
                 unprivileged user"
                    .to_string(),
            ));
        }
        let prepared = self.prepared().await?;
        let (egress, trust) = match &spec.egress {
            Some(network) => {
                let (socket, trust) = self.open_egress(prepared, spec, network).await?;
                (Some(socket), trust)
            }
            None => (None, None),
        };
        let (dirs, dir) = (Arc::clone(&self.dirs), self.dirs.of(&spec.key));
        let make_cgroups = self.cgroup_maker(prepared, &spec.key, spec.limits);
        let user = self.config.run_as;
        let id = SandboxId(spec.key.clone());
        let owned_id = id.clone();
        let watcher = Arc::clone(&self.watcher);
        let (home, measured) = blocking(move || {
            let failed = |e: io::Error| {
                Error::Failed(format!("creating the sandbox's working directory: {e}"))
            };
            fs::create_dir_all(&dir).map_err(failed)?;
            if let Some(user) = user {
                std::os::unix::fs::lchown(&dir, Some(user.uid), Some(user.gid)).map_err(failed)?;
                fs::set_permissions(&dir, fs::Permissions::from_mode(0o700)).map_err(failed)?;
            }
            make_cgroups()?;
            let home = dirs.existing(&owned_id)?;
            // Watched from the start: a command that writes nothing is told apart without
            // measuring the directory again (see `exec_reporting`).
            watcher.begin(&owned_id.0, &home);
            let mark = watcher.mark(&owned_id.0);
            let bytes = crate::disk::usage(&home);
            Ok((home, mark.map(|mark| Measured { mark, bytes })))
        })
        .await?;
        let mut env = spec.env.clone();
        if egress.is_some() {
            env.extend(proxy_env());
        }
        if trust.is_some() {
            env.extend(crate::trust::trust_env(&crate::trust::inside_bundle()));
        }
        let created = Created {
            env,
            limits: spec.limits,
            network: spec.network,
            egress,
            trust,
            links: spec.links.clone(),
            live: Arc::default(),
            home: home.clone(),
            measured: Arc::new(std::sync::Mutex::new(measured)),
        };
        let live = self.start(prepared, &spec.key, &created, &home)?;
        *created.live.lock().await = Some(live);
        // A sandbox created again (after a restart, or a retried step) starts afresh: the
        // process of the one it replaces, if any, is killed when its last holder lets go.
        self.created().insert(spec.key.clone(), created);
        debug!(key = %spec.key, "bubblewrap sandbox started");
        Ok(SandboxInfo {
            id: SandboxId(spec.key.clone()),
            isolated: true,
            host: None,
        })
    }

    async fn exec(&self, id: &SandboxId, request: &ExecRequest) -> Result<ExecOutput, Error> {
        self.exec_reporting(id, request, None).await
    }

    fn supports_egress(&self) -> bool {
        self.config.egress.is_some() && self.config.launcher.is_some()
    }

    async fn exec_live(
        &self,
        id: &SandboxId,
        request: &ExecRequest,
        live: Arc<dyn LiveOutput>,
    ) -> Result<ExecOutput, Error> {
        self.exec_reporting(id, request, Some(live)).await
    }

    async fn put_files(&self, id: &SandboxId, tar: Vec<u8>) -> Result<(), Error> {
        let user = self.config.run_as;
        in_existing_dir(&self.dirs, id, move |dir| {
            archive::unpack(&tar, &dir)?;
            match user {
                Some(user) => give_to(&dir, user),
                None => Ok(()),
            }
        })
        .await
    }

    async fn list_files(
        &self,
        id: &SandboxId,
    ) -> Result<Vec<nodus_core::snapshot::FileStat>, Error> {
        in_existing_dir(&self.dirs, id, |dir| archive::list(&dir)).await
    }

    async fn changes(&self, id: &SandboxId) -> Result<nodus_core::snapshot::Changes, Error> {
        let (dirs, owned_id) = (Arc::clone(&self.dirs), id.clone());
        self.watcher
            .changes_of(id, move || dirs.existing(&owned_id))
            .await
    }

    async fn get_files(
        &self,
        id: &SandboxId,
        path: &str,
        max_bytes: usize,
    ) -> Result<Vec<u8>, Error> {
        // A missing sandbox is told before a path it could not hold.
        let rel = paths::relative(Path::new(path))
            .map_err(|why| Error::Refused(format!("path {path:?} {why}")));
        let shown = path.to_owned();
        in_existing_dir(&self.dirs, id, move |dir| {
            archive::pack(&dir, &rel?, &shown, max_bytes)
        })
        .await
    }

    async fn suspend(&self, id: &SandboxId) -> Result<(), Error> {
        let created = self.created().get(&id.0).cloned();
        if let Some(created) = created {
            // After its running command, if one runs; holding the slot, so that no command
            // starts the sandbox again meanwhile.
            let mut held = created.live.lock().await;
            if let Some(live) = held.take() {
                live.end().await;
            }
            // While it waits the sandbox holds no cgroup either: its next start makes them
            // again.
            let (cgroups, key) = (self.cgroups.clone(), id.0.clone());
            blocking(move || {
                cgroups.remove(&key);
                Ok(())
            })
            .await?;
        }
        Ok(())
    }

    async fn destroy(&self, id: &SandboxId) -> Result<(), Error> {
        // An id this backend cannot have issued names no sandbox: nothing to remove.
        let Ok(dir) = self.dirs.of_id(id) else {
            return Ok(());
        };
        // As `suspend` (after its running command, if one runs, holding the slot), then the
        // cgroups and the directory in one trip to the blocking pool.
        let created = self.created().remove(&id.0);
        self.watcher.forget(&id.0);
        if let Some(gate) = &self.config.egress {
            gate.close(&id.0);
        }
        let held = match &created {
            Some(created) => {
                let mut held = created.live.lock().await;
                if let Some(live) = held.take() {
                    live.end().await;
                }
                Some(held)
            }
            None => None,
        };
        let cgroups = self.cgroups.clone();
        let key = id.0.clone();
        // The directory goes once the sandbox's processes are gone, before its cgroups are
        // pooled: its files' page cache is then no longer charged to them.
        let removed = blocking(move || cgroups.remove_after(&key, || remove_tree(&dir))).await;
        drop(held);
        removed
    }
}

/// The variables that send a sandbox's HTTP clients through the egress proxy on its
/// loopback (both spellings: curl reads `http_proxy` only in lower case, other tools the
/// upper case), and the sandbox's own addresses past it.
fn proxy_env() -> BTreeMap<String, String> {
    let proxy = format!("http://127.0.0.1:{}", nodus_launch::EGRESS_PORT);
    let local = "localhost,127.0.0.1,::1".to_owned();
    [
        ("HTTP_PROXY", proxy.clone()),
        ("HTTPS_PROXY", proxy.clone()),
        ("http_proxy", proxy.clone()),
        ("https_proxy", proxy),
        ("NO_PROXY", local.clone()),
        ("no_proxy", local),
    ]
    .into_iter()
    .map(|(name, value)| (name.to_owned(), value))
    .collect()
}

/// A sandbox's [`SandboxSpec::links`] as symbolic links of its root: (target, path).
fn links_of(created: &Created) -> Vec<(PathBuf, PathBuf)> {
    created
        .links
        .iter()
        .map(|(path, target)| (Path::new(WORKDIR).join(target), PathBuf::from(path)))
        .collect()
}

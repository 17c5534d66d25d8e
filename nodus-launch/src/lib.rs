//! The sandbox launcher of Nodus: starts one sandbox's first process in new namespaces over a
//! root file system of its own, as bubblewrap does for the process backend, with less work.
//!
//! It runs as its own short-lived executable (the `nodus` binary started with [`LAUNCH_ARG`]
//! as its first argument, or nodus-sandbox's `nodus-sandbox-launch`), single-threaded, and
//! reads its [`Plan`] from standard input. Two stages:
//! - [`stage one`](enter) joins the sandbox's cgroups, drops to the sandbox's user, sets
//!   `no_new_privs`, unshares the user, mount, pid, ipc, uts, cgroup (and, without network,
//!   net, unless it entered an empty one of the resident launcher's pool first) namespaces,
//!   maps its user to root of the new user namespace, and forks stage two,
//!   which is PID 1 of the new pid namespace (a copy of stage one, no second program start);
//!   it waits for it and exits as it does;
//! - [`stage two`](init) lays out the root (a tmpfs with the read-only binds, a fresh
//!   `/proc`, a small `/dev`, a sized `/tmp`, the working directory), pivots into it, unshares
//!   one more user namespace that maps the sandbox's user to the first one's root (so that
//!   what it starts has a non-zero user id, no capabilities and cannot touch the mounts,
//!   which belong to the outer namespace), caps nested user namespaces, then starts the
//!   program and reaps every process of the namespace until the program exits, or, for a
//!   sandbox with a command channel, runs the channel's loop itself (see [`Frame`]).
//!
//!
//! Started with [`FORKS_ARG`] instead, it is the resident launcher (see the `zygote` module
//! and [`zygote_protocol`]): it stays, and forks stage one for each sandbox asked of it on
//! its standard input, a socket, so that a sandbox's start pays no program start.
//!
//! The only `unsafe` are the calls to `unshare`, `fork`, `close_range` and `_exit` (see
//! [`unshare`], [`fork`], [`close_from`] and [`exit_now`]), and the `setrlimit` of a
//! program's address space between its fork and its `exec` (`init::limit_address_space`).

mod egress;
pub mod handoff;
mod init;
mod netpool;
mod plan;
mod root;
mod serve;
mod stage;
mod zygote;

pub use egress::EGRESS_PORT;
pub use netpool::NETNS_POOL_ARG;
pub use zygote::protocol as zygote_protocol;

pub use plan::{Limit, Plan};
pub use serve::Frame;

use std::ffi::OsString;
use std::io::Write;
use std::process::ExitCode;

/// The first argument that makes a `nodus` binary (or `nodus-sandbox-launch`) the launcher's
/// first stage.
pub const LAUNCH_ARG: &str = "--nodus-launch";

/// The first argument that makes a `nodus` binary (or `nodus-sandbox-launch`) the resident
/// launcher, which forks stage one for each sandbox asked of it on its standard input (see
/// [`zygote_protocol`]). [`NETNS_POOL_ARG`] and a number may follow: the size of its pool of
/// empty network namespaces for the sandboxes without network (used only where it runs as
/// root of the initial user namespace).
pub const FORKS_ARG: &str = "--nodus-launch-forks";

/// The exit status of a launcher that could not join the sandbox's cgroups (as the
/// bubblewrap backend's gate).
pub const CGROUP_EXIT: u8 = 125;

/// The exit status of a launcher that could not set up the sandbox for any other reason.
pub const FAILED_EXIT: u8 = 126;

/// What can go wrong while starting a sandbox.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The plan read on standard input is not one the launcher understands.
    #[error("nodus-launch: the plan is malformed: {0}")]
    Plan(String),
    /// A cgroup's `tasks` or `cgroup.procs` file could not be written (the message starts as
    /// the bubblewrap backend's gate's does).
    #[error("nodus-sandbox: cannot join the cgroup {path}: {source}")]
    Cgroup {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// The launcher was started with arguments it does not take.
    #[error("nodus-launch: {0}")]
    Usage(String),
    /// A step of the set-up failed.
    #[error("nodus-launch: {step}: {source}")]
    Step {
        /// What was being done.
        step: String,
        /// Why it failed.
        source: std::io::Error,
    },
}

impl Error {
    /// A failed step, for `map_err`.
    pub(crate) fn step(step: impl Into<String>) -> impl FnOnce(std::io::Error) -> Error {
        let step = step.into();
        move |source| Error::Step { step, source }
    }

    /// A failed system call, for `map_err`.
    pub(crate) fn errno(step: impl Into<String>) -> impl FnOnce(rustix::io::Errno) -> Error {
        let step = step.into();
        move |errno| Error::Step {
            step,
            source: errno.into(),
        }
    }
}

/// Runs the launcher when `args` (the process's arguments after its name) start with
/// [`LAUNCH_ARG`], or the resident launcher when they start with [`FORKS_ARG`]; `None` when
/// they do not, for a multi-call binary to go on with its own work (the launcher's stages do
/// not return: they end with the sandbox's code, see [`exit_now`]). Call it first thing in
/// `main`, before any thread starts: a process with more than one thread cannot enter a new
/// user namespace, and the resident launcher forks.
pub fn run_if_asked(args: &[OsString]) -> Option<ExitCode> {
    let first = args.first()?;
    if first == FORKS_ARG {
        return Some(zygote::serve(&args[1..]));
    }
    if first != LAUNCH_ARG {
        return None;
    }
    exit_now(finish(stage::enter()))
}

/// The exit code of a sandbox's start that ended with `outcome`, its error said on stderr.
pub(crate) fn finish(outcome: Result<u8, Error>) -> u8 {
    match outcome {
        Ok(code) => code,
        Err(e) => {
            let code = match e {
                Error::Cgroup { .. } => CGROUP_EXIT,
                _ => FAILED_EXIT,
            };
            let _ = writeln!(std::io::stderr(), "{e}");
            code
        }
    }
}

/// Ends this process at once with `code`, as `_exit(2)` does: no destructor runs, nor the C
/// library's exit handlers (its `atexit` list, the dynamic loader's finalisers), and no
/// buffer is flushed (the launcher writes nothing buffered: its messages go to stderr, which
/// has none). How every stage ends: a stage forked from the resident launcher is a copy of it,
/// and each page an orderly exit writes (the allocator's lists as the plan is freed, the
/// loader's tables) would be one more copy-on-write fault, about a hundredth of a
/// millisecond apiece on a virtual machine.
#[allow(unsafe_code)]
pub(crate) fn exit_now(code: u8) -> ! {
    // SAFETY: `_exit` may be called at any point of any process; it is `unsafe` only as a
    // foreign function. Nothing is left unwritten by skipping the orderly exit (see above).
    unsafe { libc::_exit(i32::from(code)) }
}

/// The `main` of an executable that is only the launcher (`nodus-launch` beside `nodus`,
/// nodus-sandbox's `nodus-sandbox-launch`): a small program starts faster than the `nodus`
/// binary, whose tens of thousands of relocations every start pays. `name` is the program's
/// name, for the message shown to someone who starts it by hand.
pub fn executable_main(name: &str) -> ExitCode {
    let args: Vec<OsString> = std::env::args_os().skip(1).collect();
    run_if_asked(&args).unwrap_or_else(|| {
        let _ = writeln!(
            std::io::stderr(),
            "{name} is started by the sandbox backend (first argument {LAUNCH_ARG} or \
             {FORKS_ARG}), not by hand"
        );
        ExitCode::from(2)
    })
}

/// Moves this process into new namespaces: `unshare(2)`.
#[allow(unsafe_code)]
fn unshare(flags: rustix::thread::UnshareFlags) -> Result<(), Error> {
    // `CLONE_FILES` would split the descriptor table between threads. The launcher never
    // asks for it here.
    debug_assert!(!flags.contains(rustix::thread::UnshareFlags::FILES));
    let flags = flags.difference(rustix::thread::UnshareFlags::FILES);
    // SAFETY: `unshare_unsafe` is unsafe only because `CLONE_FILES` lets threads of one
    // process see different descriptor tables, so that one thread could use a descriptor
    // another thread's table does not hold. `FILES` is removed from `flags` above, and the
    // launcher is single-threaded besides (`run_if_asked` runs before any thread starts; a
    // new user namespace, which stage one asks for, is refused to a multi-threaded process
    // anyway, and the resident launcher, which asks for a network namespace alone for its
    // pool, is one loop on one thread).
    unsafe { rustix::thread::unshare_unsafe(flags) }.map_err(Error::errno("unshare"))
}

/// Forks this process (`what` names the child in an error): `Some(pid)` of the child in the
/// parent, `None` in the child.
#[allow(unsafe_code)]
fn fork(what: &str) -> Result<Option<rustix::process::Pid>, Error> {
    // SAFETY: after `fork` in a multi-threaded process the child may only make
    // async-signal-safe calls, since another thread may have held a lock (the allocator's, the
    // standard streams') at the moment of the copy. The launcher is single-threaded: it runs
    // from `run_if_asked` before any thread starts and starts none (stage one has besides just
    // entered a new user namespace, which the kernel refuses to a process with more than one
    // thread; the resident launcher is one loop on one thread). The child is then a whole copy
    // with every lock free, and may go on as an ordinary program. Nothing is left in the
    // standard output's buffer to be written twice (neither stage one nor the resident
    // launcher writes to it), and the descriptors the child inherits are the ones it is meant
    // to have (the resident launcher's child closes the others itself, see the `zygote`
    // module).
    let pid = unsafe { libc::fork() };
    match pid {
        -1 => Err(Error::Step {
            step: format!("forking {what}"),
            source: std::io::Error::last_os_error(),
        }),
        0 => Ok(None),
        pid => Ok(rustix::process::Pid::from_raw(pid)),
    }
}

/// Closes every descriptor from `first` on. Call it only where no value of this process owns
/// one of them (an `OwnedFd`, a `File`): they are gone after it, and such a value would close
/// a number that may by then be another descriptor.
#[allow(unsafe_code)]
pub(crate) fn close_from(first: u32) -> Result<(), Error> {
    // SAFETY: `close_range` is unsafe in I/O-safety terms only: it closes descriptors that
    // values of this process may own. The callers (the resident launcher at its start, before
    // it opens anything, and its forked child once it has dropped every descriptor value it
    // held) own none from `first` on, and both are single-threaded, so that no other thread
    // holds one either.
    let done = unsafe { libc::syscall(libc::SYS_close_range, first, u32::MAX, 0) };
    if done == 0 {
        Ok(())
    } else {
        Err(Error::Step {
            step: format!("closing the descriptors from {first} on"),
            source: std::io::Error::last_os_error(),
        })
    }
}

/// How a wait status reads as an exit code: the process's own, or 128 + the signal.
pub(crate) fn code_of(status: rustix::process::WaitStatus) -> u8 {
    let code = status
        .exit_status()
        .or_else(|| status.terminating_signal().map(|signal| 128 + signal))
        .unwrap_or(i32::from(FAILED_EXIT));
    u8::try_from(code).unwrap_or(FAILED_EXIT)
}

/// Writes `text` into the file at `path` (a `/proc` control file: one write).
pub(crate) fn write_file(path: &str, text: &str) -> Result<(), Error> {
    std::fs::write(path, text).map_err(Error::step(format!("writing {text:?} to {path}")))
}

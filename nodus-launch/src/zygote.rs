//! The resident launcher (a "zygote", or fork server): started once per backend with
//! [`FORKS_ARG`](crate::FORKS_ARG), it forks stage one for each sandbox asked of it, so that a
//! sandbox's start pays no `execve`, no dynamic loader and no C library start-up (CPUID, which
//! traps to the hypervisor on a virtual machine, relocations, page faults of a fresh image).
//!
//! Its standard input is one end of a `SOCK_SEQPACKET` socket pair (see [`protocol`]); each
//! message is one request: the sandbox's encoded [`Plan`] as data and, by `SCM_RIGHTS`, the
//! sandbox's stdout (the command channel's socket) and stderr. For each, it forks; the child
//! drops every descriptor it holds but those two (the control socket, the other sandboxes'
//! pidfds: no `exec` follows, so close-on-exec protects nothing), moves them to 1 and 2
//! (stdin is `/dev/null` already), makes its own process group (the backend kills the group)
//! and runs stage one from the plan, pinned to the plan's CPUs. The parent opens a pidfd of
//! the child before anything could reap it, answers with the pid and that pidfd, closes its
//! copies of the received descriptors, and keeps a pidfd of its own per child: a child's pidfd
//! turns readable when it has exited, and only then is that child reaped (never an automatic
//! reap: a pid reaped and reused would give a pidfd of another process).
//!
//! For a sandbox without network, on a root server, the child also gets an empty network
//! namespace from the launcher's pool (see the `netpool` module), which it enters before
//! stage one; the namespace goes back to the pool when the child exited (not when a signal
//! killed it).
//!
//! Invariants: one thread (it forks); nothing of it leaks into a sandbox but descriptors 0, 1
//! and 2; a pidfd of each child before it can be reaped; a malformed request gets an error
//! answer and the loop goes on. It ends when the socket hangs up, and with the thread that
//! started it (its parent-death signal); its children's stage one ends with it (theirs).

use std::os::fd::{AsFd, OwnedFd};
use std::process::ExitCode;

use rustix::event::{PollFd, PollFlags};
use rustix::process::{Pid, PidfdFlags, Signal, WaitOptions};

use crate::netpool::NetPool;
use crate::{Error, Plan};

/// The resident launcher's requests and answers, for the backend that starts it.
pub mod protocol {
    use std::io::{IoSlice, IoSliceMut};
    use std::mem::MaybeUninit;
    use std::os::fd::{BorrowedFd, OwnedFd};

    use rustix::net::{
        AddressFamily, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags,
        SendAncillaryBuffer, SendAncillaryMessage, SendFlags, SocketFlags, SocketType,
    };

    /// The largest request (an encoded plan) the resident launcher reads: 1 MiB.
    pub const MAX_REQUEST: usize = 1 << 20;

    /// The largest answer: `ok PID` or `error MESSAGE`.
    pub(crate) const MAX_ANSWER: usize = 4096;

    /// A socket pair for the resident launcher: (the backend's end, the launcher's standard
    /// input), both close-on-exec (a spawn's `dup2` to 0 clears it on the launcher's copy).
    pub fn socket_pair() -> std::io::Result<(OwnedFd, OwnedFd)> {
        Ok(rustix::net::socketpair(
            AddressFamily::UNIX,
            SocketType::SEQPACKET,
            SocketFlags::CLOEXEC,
            None,
        )?)
    }

    /// A sandbox the resident launcher forked: its stage one.
    #[derive(Debug)]
    pub struct Forked {
        /// Its pid (in the pid namespace of the launcher, which is the backend's).
        pub pid: u32,
        /// A pidfd of it, opened before it could be reaped.
        pub pidfd: OwnedFd,
    }

    /// Why a request did not start a sandbox.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub enum Failure {
        /// The launcher is gone or does not answer (start another).
        Gone(String),
        /// The launcher answered with this error (the request was malformed, or the fork
        /// failed).
        Refused(String),
    }

    impl std::fmt::Display for Failure {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            match self {
                Failure::Gone(why) => write!(f, "the resident launcher is gone: {why}"),
                Failure::Refused(why) => write!(f, "the resident launcher refused: {why}"),
            }
        }
    }

    /// Asks the resident launcher on `socket` to start the sandbox of `plan` (encoded) with
    /// `stdout` and `stderr`, and reads its answer. One request at a time on a socket: the
    /// caller serialises them. A socket with a receive timeout turns a launcher that does not
    /// answer into [`Failure::Gone`].
    pub fn request(
        socket: BorrowedFd<'_>,
        plan: &[u8],
        stdout: BorrowedFd<'_>,
        stderr: BorrowedFd<'_>,
    ) -> Result<Forked, Failure> {
        let fds = [stdout, stderr];
        let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(2))];
        let mut control = SendAncillaryBuffer::new(&mut space);
        if !control.push(SendAncillaryMessage::ScmRights(&fds)) {
            return Err(Failure::Refused("no room for two descriptors".to_owned()));
        }
        match rustix::net::sendmsg(
            socket,
            &[IoSlice::new(plan)],
            &mut control,
            SendFlags::NOSIGNAL,
        ) {
            Ok(_) => {}
            Err(rustix::io::Errno::MSGSIZE) => {
                return Err(Failure::Refused(format!(
                    "the plan ({} bytes) is larger than a request may be",
                    plan.len()
                )));
            }
            Err(e) => return Err(Failure::Gone(format!("sending the request: {e}"))),
        }
        let mut answer = [0u8; MAX_ANSWER];
        let (length, mut fds) = receive(socket, &mut answer).map_err(|e| match e {
            Received::Gone(why) => Failure::Gone(why),
            Received::Bad(why) => Failure::Gone(format!("its answer {why}")),
        })?;
        let text = String::from_utf8_lossy(&answer[..length]);
        if let Some(why) = text.strip_prefix("error ") {
            return Err(Failure::Refused(why.to_owned()));
        }
        let pid = text
            .strip_prefix("ok ")
            .and_then(|pid| pid.parse::<u32>().ok())
            .filter(|&pid| pid > 1);
        match (pid, fds.pop(), fds.is_empty()) {
            (Some(pid), Some(pidfd), true) => Ok(Forked { pid, pidfd }),
            _ => Err(Failure::Gone(format!(
                "it answered {text:?} with {} descriptors",
                fds.len() + 1
            ))),
        }
    }

    /// Why a message could not be read.
    pub(crate) enum Received {
        /// The peer hung up, or the socket failed.
        Gone(String),
        /// The message was not one to take (too large, too many descriptors).
        Bad(String),
    }

    /// Reads one message into `data` (at most its length) and the descriptors that came with
    /// it (at most 4; more are closed by the kernel and the message is refused): its length
    /// and the descriptors. A message of no bytes is the peer's hang-up.
    pub(crate) fn receive(
        socket: BorrowedFd<'_>,
        data: &mut [u8],
    ) -> Result<(usize, Vec<OwnedFd>), Received> {
        let max = data.len();
        let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(4))];
        let mut control = RecvAncillaryBuffer::new(&mut space);
        let got = loop {
            match rustix::net::recvmsg(
                socket,
                &mut [IoSliceMut::new(data)],
                &mut control,
                RecvFlags::CMSG_CLOEXEC,
            ) {
                Ok(got) => break got,
                Err(rustix::io::Errno::INTR) => {}
                Err(rustix::io::Errno::AGAIN) => {
                    return Err(Received::Gone("no answer in time".to_owned()));
                }
                Err(e) => return Err(Received::Gone(format!("reading: {e}"))),
            }
        };
        let mut fds = Vec::new();
        for message in control.drain() {
            if let RecvAncillaryMessage::ScmRights(rights) = message {
                fds.extend(rights);
            }
        }
        if got.bytes == 0 && fds.is_empty() {
            return Err(Received::Gone("it hung up".to_owned()));
        }
        if got.flags.contains(ReturnFlags::TRUNC) {
            return Err(Received::Bad(format!("is larger than {max} bytes")));
        }
        if got.flags.contains(ReturnFlags::CTRUNC) {
            return Err(Received::Bad("carries more than 4 descriptors".to_owned()));
        }
        Ok((got.bytes, fds))
    }

    /// Sends one answer, with at most one descriptor.
    pub(crate) fn answer(
        socket: BorrowedFd<'_>,
        text: &str,
        fd: Option<BorrowedFd<'_>>,
    ) -> rustix::io::Result<()> {
        let fds: Vec<BorrowedFd<'_>> = fd.into_iter().collect();
        let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
        let mut control = SendAncillaryBuffer::new(&mut space);
        if !fds.is_empty() {
            control.push(SendAncillaryMessage::ScmRights(&fds));
        }
        let text = &text.as_bytes()[..text.len().min(MAX_ANSWER)];
        rustix::net::sendmsg(
            socket,
            &[IoSlice::new(text)],
            &mut control,
            SendFlags::NOSIGNAL,
        )
        .map(drop)
    }
}

/// A request read and checked: the plan, the sandbox's stdout and stderr; and, once taken
/// from the pool, the network namespace the child enters.
struct Request {
    plan: Plan,
    stdout: OwnedFd,
    stderr: OwnedFd,
    netns: Option<OwnedFd>,
}

/// A child not reaped yet: its pid, a pidfd of this process's own, and the pooled network
/// namespace it entered, to give back when it has exited.
struct Child {
    pid: Pid,
    pidfd: OwnedFd,
    netns: Option<OwnedFd>,
}

/// What the loop ended with.
enum Ended {
    /// The backend hung up: the launcher exits.
    HungUp,
    /// This is a forked child, which starts the sandbox of the request.
    Child(Request),
}

/// Runs the resident launcher until the socket on its standard input hangs up; in a forked
/// child, runs stage one and ends as the sandbox did (see [`crate::exit_now`]).
pub(crate) fn serve(args: &[std::ffi::OsString]) -> ExitCode {
    match crate::netpool::size_from(args).and_then(serve_loop) {
        Ok(Ended::HungUp) => ExitCode::SUCCESS,
        Ok(Ended::Child(request)) => crate::exit_now(crate::finish(child(request))),
        Err(e) => {
            use std::io::Write;
            let _ = writeln!(std::io::stderr(), "{e}");
            ExitCode::from(crate::FAILED_EXIT)
        }
    }
}

fn serve_loop(netns_pool: usize) -> Result<Ended, Error> {
    // Nothing of this process owns a descriptor yet: whatever the backend let through besides
    // 0, 1 and 2 goes, so that no sandbox inherits it.
    crate::close_from(3)?;
    rustix::process::set_parent_process_death_signal(Some(Signal::KILL))
        .map_err(Error::errno("setting the parent-death signal"))?;
    // The socket moves off 0, which becomes `/dev/null`: every child's standard input.
    let control = std::io::stdin()
        .as_fd()
        .try_clone_to_owned()
        .map_err(Error::step("taking the control socket"))?;
    let null = std::fs::File::open("/dev/null").map_err(Error::step("opening /dev/null"))?;
    rustix::stdio::dup2_stdin(&null).map_err(Error::errno("making /dev/null stdin"))?;
    drop(null);
    // Empty network namespaces for the sandboxes without network (root servers only).
    let mut pool = NetPool::open(netns_pool);
    // The children not reaped yet.
    let mut children: Vec<Child> = Vec::new();
    // Every request is read here (allocated and zeroed once, not at each request).
    let mut buffer = vec![0u8; protocol::MAX_REQUEST];
    loop {
        let (control_events, exited) = {
            let mut polled: Vec<PollFd<'_>> = std::iter::once(&control)
                .chain(children.iter().map(|child| &child.pidfd))
                .map(|fd| PollFd::new(fd, PollFlags::IN))
                .collect();
            match rustix::event::poll(&mut polled, None) {
                Ok(_) => {}
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => return Err(Error::errno("waiting for requests")(e)),
            }
            let exited: Vec<usize> = polled
                .iter()
                .skip(1)
                .enumerate()
                .filter(|(_, polled)| !polled.revents().is_empty())
                .map(|(i, _)| i)
                .collect();
            (polled[0].revents(), exited)
        };
        // Highest first: `swap_remove` moves the last one, already handled, into the gap.
        for i in exited.into_iter().rev() {
            let child = children.swap_remove(i);
            match rustix::process::waitpid(Some(child.pid), WaitOptions::NOHANG) {
                Ok(Some((_, status))) => {
                    // Its network namespace goes back only if it exited (see `NetPool`).
                    if let (Some(pool), Some(netns)) = (pool.as_mut(), child.netns) {
                        pool.give_back(netns, status);
                    }
                }
                // Not knowing how it ended, its namespace is dropped.
                Err(_) => drop(child),
                // Not exited after all: kept.
                Ok(None) => children.push(child),
            }
        }
        if control_events.contains(PollFlags::IN) {
            match take(&control, &mut buffer) {
                Ok(Some(request)) => {
                    if let Some(request) = start(&control, request, &mut children, &mut pool)? {
                        // The child: the control socket, the other children's pidfds and
                        // namespaces, and the pool go before the sandbox starts.
                        drop(control);
                        drop(children);
                        drop(pool);
                        return Ok(Ended::Child(request));
                    }
                }
                Ok(None) => return Ok(Ended::HungUp),
                Err(why) => {
                    if protocol::answer(control.as_fd(), &format!("error {why}"), None).is_err() {
                        return Ok(Ended::HungUp);
                    }
                }
            }
        } else if control_events.intersects(PollFlags::HUP | PollFlags::ERR | PollFlags::NVAL) {
            return Ok(Ended::HungUp);
        }
    }
}

/// Reads one request: `None` when the backend hung up, an error (to answer) when the request
/// is malformed.
fn take(control: &OwnedFd, buffer: &mut [u8]) -> Result<Option<Request>, String> {
    let (length, fds) = match protocol::receive(control.as_fd(), buffer) {
        Ok(got) => got,
        Err(protocol::Received::Gone(_)) => return Ok(None),
        Err(protocol::Received::Bad(why)) => return Err(format!("the request {why}")),
    };
    let count = fds.len();
    let Ok([stdout, stderr]) = <[OwnedFd; 2]>::try_from(fds) else {
        return Err(format!(
            "a request carries 2 descriptors (the sandbox's stdout and stderr), this one {count}"
        ));
    };
    let plan = Plan::decode(&buffer[..length]).map_err(|e| e.to_string());
    // The request's bytes (its environment's values among them) do not stay in this
    // process's memory, which every later sandbox's first processes start as a copy of.
    buffer[..length].fill(0);
    let plan = plan?;
    Ok(Some(Request {
        plan,
        stdout,
        stderr,
        netns: None,
    }))
}

/// Forks the child for `request`: in the child, the request back (to run once this loop's
/// state is dropped); in this process, `None` once the child's pid and pidfd are sent.
fn start(
    control: &OwnedFd,
    mut request: Request,
    children: &mut Vec<Child>,
    pool: &mut Option<NetPool>,
) -> Result<Option<Request>, Error> {
    // A sandbox without network gets an empty namespace of the pool's (when there is one);
    // one whose way out is the egress proxy makes its own, whose loopback it may bring up.
    if !request.plan.network
        && request.plan.egress.is_none()
        && let Some(pool) = pool.as_mut()
    {
        request.netns = pool.take()?;
    }
    // The child waits until this pipe's write end is closed, after the answer: otherwise it
    // takes this CPU from the moment it exists and the answer, for which the backend waits,
    // comes only when the scheduler gives it back (most of a millisecond).
    let (go, answered) = match rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC) {
        Ok(pipe) => pipe,
        Err(e) => {
            let _ = protocol::answer(
                control.as_fd(),
                &format!("error nodus-launch: making a pipe: {e}"),
                None,
            );
            return Ok(None);
        }
    };
    let pid = match crate::fork("a sandbox's stage one") {
        Ok(None) => {
            drop(answered);
            let mut byte = [0u8; 1];
            // Until the end of the file (or an error): nothing is ever written.
            while let Err(rustix::io::Errno::INTR) = rustix::io::read(&go, &mut byte) {}
            drop(go);
            return Ok(Some(request));
        }
        Ok(Some(pid)) => pid,
        Err(e) => {
            if let (Some(pool), Some(netns)) = (pool.as_mut(), request.netns.take()) {
                // No process entered it.
                pool.put_unused(netns);
            }
            let _ = protocol::answer(control.as_fd(), &format!("error {e}"), None);
            return Ok(None);
        }
    };
    let netns = request.netns.take();
    drop((request, go));
    // Before any reap: the pid is this process's unreaped child, so the pidfd is its.
    let pidfd = match rustix::process::pidfd_open(pid, PidfdFlags::empty()) {
        Ok(pidfd) => pidfd,
        Err(e) => {
            // Still unreaped: the pid is the child's, to kill and reap here (killed: its
            // network namespace, if any, is dropped with `netns`).
            let _ = rustix::process::kill_process(pid, Signal::KILL);
            let _ = rustix::process::waitpid(Some(pid), WaitOptions::empty());
            let _ = protocol::answer(
                control.as_fd(),
                &format!("error opening a pidfd of the sandbox's stage one: {e}"),
                None,
            );
            return Ok(None);
        }
    };
    // Its own process group before the backend learns of it (the child makes it too, first
    // thing: whichever runs first), so that a kill of the group right after the answer finds
    // it.
    let _ = rustix::process::setpgid(Some(pid), Some(pid));
    let text = format!("ok {}", pid.as_raw_nonzero());
    if protocol::answer(control.as_fd(), &text, Some(pidfd.as_fd())).is_err() {
        // Nobody knows of this sandbox: it goes (and is reaped when its pidfd says so).
        let _ = rustix::process::pidfd_send_signal(&pidfd, Signal::KILL);
    }
    drop(answered);
    children.push(Child { pid, pidfd, netns });
    Ok(None)
}

/// The forked child: the request's descriptors become stdout and stderr, it enters the pooled
/// network namespace if it was given one (as root, before stage one makes it the sandbox's
/// user: the namespace stays the initial user namespace's), every other descriptor is
/// closed, a process group of its own, then stage one.
fn child(request: Request) -> Result<u8, Error> {
    let Request {
        plan,
        stdout,
        stderr,
        netns,
    } = request;
    rustix::process::setpgid(None, None).map_err(Error::errno("making a process group"))?;
    let net_entered = match netns {
        Some(netns) => {
            rustix::thread::move_into_link_name_space(
                netns.as_fd(),
                Some(rustix::thread::LinkNameSpaceType::Network),
            )
            .map_err(Error::errno("entering the sandbox's network namespace"))?;
            // Closed before anything else runs: nothing past 2 reaches the sandbox.
            drop(netns);
            true
        }
        None => false,
    };
    rustix::stdio::dup2_stdout(&stdout).map_err(Error::errno("making the sandbox's stdout"))?;
    rustix::stdio::dup2_stderr(&stderr).map_err(Error::errno("making the sandbox's stderr"))?;
    drop((stdout, stderr));
    // No value of this process owns a descriptor past 2 any more (the loop's were dropped).
    crate::close_from(3)?;
    // Signals: the resident launcher blocks none and changes no disposition, so the child
    // has what a launcher started for it would have (the Rust runtime's SIGPIPE ignored,
    // which stage two's spawns reset for the sandbox's programs).
    crate::stage::start(plan, net_entered)
}

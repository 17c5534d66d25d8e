//! The resident launcher, started from this test binary (which runs `run_if_asked` first, as
//! the `nodus` binary does): a malformed request gets an error answer and the launcher goes on
//! to start the next sandbox, whose processes see no descriptor beyond 0, 1 and 2.
//!
//! As root of the initial user namespace, its pool of network namespaces too: a namespace
//! whose stage one exited is handed to the next sandbox, one whose stage one was killed by a
//! signal is not.
//!
//! `cargo test -p nodus-launch --test zygote` (as root or with unprivileged user namespaces;
//! the pool's tests as root only).

use std::ffi::OsString;
use std::io::Read;
use std::os::fd::{AsFd, OwnedFd};
use std::process::{Command, ExitCode, Stdio};

use nodus_launch::zygote_protocol::{Failure, request, socket_pair};
use nodus_launch::{FORKS_ARG, NETNS_POOL_ARG, Plan};

fn main() -> ExitCode {
    let args: Vec<OsString> = std::env::args_os().skip(1).collect();
    if let Some(code) = nodus_launch::run_if_asked(&args) {
        return code;
    }
    a_malformed_request_is_answered_and_the_next_one_starts_its_sandbox();
    println!("test a_malformed_request_is_answered_and_the_next_one_starts_its_sandbox ... ok");
    assert!(
        initial_root(),
        "the network namespace pool's tests need root of the initial user namespace: run them as root (./scripts/test does)"
    );
    a_namespace_whose_stage_one_exited_goes_to_the_next_sandbox();
    println!("test a_namespace_whose_stage_one_exited_goes_to_the_next_sandbox ... ok");
    a_namespace_whose_stage_one_was_killed_is_not_handed_again();
    println!("test a_namespace_whose_stage_one_was_killed_is_not_handed_again ... ok");
    without_a_pool_each_sandbox_has_a_new_namespace();
    println!("test without_a_pool_each_sandbox_has_a_new_namespace ... ok");
    ExitCode::SUCCESS
}

/// A plan laid out as the backend's, running `command` with `/bin/sh -c`.
fn plan(work: &std::path::Path, command: &str) -> Plan {
    let mut plan = Plan {
        hostname: "nodus".to_owned(),
        tmp_size: 1 << 20,
        work_host: work.to_path_buf(),
        work_inside: "/work".into(),
        program: ["/bin/sh", "-c", command].map(OsString::from).to_vec(),
        env: vec![("PATH".into(), "/usr/bin:/bin".into())],
        ..Plan::default()
    };
    plan.add_host_dirs(["/usr", "/bin", "/sbin", "/lib", "/lib64", "/etc"].map(Into::into));
    plan
}

fn pipe() -> (std::fs::File, OwnedFd) {
    let (read, write) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).expect("pipe");
    (std::fs::File::from(read), write)
}

fn a_malformed_request_is_answered_and_the_next_one_starts_its_sandbox() {
    let (ours, theirs) = socket_pair().expect("socket pair");
    let mut zygote = Command::new(std::env::current_exe().expect("this test binary"))
        .arg(FORKS_ARG)
        .stdin(Stdio::from(theirs))
        .current_dir("/")
        .spawn()
        .expect("start the resident launcher");

    // Not a plan: refused by name, with the launcher still there.
    let (_out_read, out_write) = pipe();
    let (_err_read, err_write) = pipe();
    let refused = request(
        ours.as_fd(),
        b"bogus\0--\0/bin/sh\0",
        out_write.as_fd(),
        err_write.as_fd(),
    )
    .expect_err("a malformed plan");
    assert_eq!(
        refused,
        Failure::Refused("nodus-launch: the plan is malformed: unknown item \"bogus\"".to_owned())
    );

    // Then a real one: `ls` of the shell's descriptors and a line on stderr.
    let work = tempfile::tempdir().expect("tempdir");
    let bytes = plan(work.path(), "ls /proc/$$/fd; echo said >&2")
        .encode()
        .expect("a plan");
    let (mut out_read, out_write) = pipe();
    let (mut err_read, err_write) = pipe();
    let forked = request(ours.as_fd(), &bytes, out_write.as_fd(), err_write.as_fd())
        .expect("the sandbox starts after the malformed request");
    drop((out_write, err_write));
    assert!(forked.pid > 1);
    let (mut out, mut err) = (String::new(), String::new());
    out_read.read_to_string(&mut out).expect("stdout");
    err_read.read_to_string(&mut err).expect("stderr");
    assert_eq!(
        out, "0\n1\n2\n",
        "the sandbox's processes hold descriptors 0, 1 and 2 only (stderr: {err})"
    );
    assert_eq!(err, "said\n");
    // Its pidfd turns readable once stage one has exited.
    let mut polled = [rustix::event::PollFd::new(
        &forked.pidfd,
        rustix::event::PollFlags::IN,
    )];
    rustix::event::poll(&mut polled, None).expect("poll the pidfd");
    assert!(polled[0].revents().contains(rustix::event::PollFlags::IN));

    // A request without descriptors is refused too.
    let mut space: [std::mem::MaybeUninit<u8>; 0] = [];
    let mut none = rustix::net::SendAncillaryBuffer::new(&mut space);
    rustix::net::sendmsg(
        &ours,
        &[std::io::IoSlice::new(&bytes)],
        &mut none,
        rustix::net::SendFlags::empty(),
    )
    .expect("send");
    let mut answer = [0u8; 4096];
    let n = rustix::io::read(&ours, &mut answer).expect("answer");
    let answer = String::from_utf8_lossy(&answer[..n]);
    assert!(answer.contains("carries 2 descriptors"), "{answer}");

    // Hung up: the launcher exits.
    drop(ours);
    let status = zygote.wait().expect("the launcher exits");
    assert!(status.success(), "{status}");
}

/// Whether this test runs as root of the initial user namespace (where the launcher keeps a
/// pool of network namespaces).
fn initial_root() -> bool {
    rustix::process::geteuid().is_root()
        && std::fs::read_to_string("/proc/self/uid_map")
            .is_ok_and(|map| map.split_whitespace().collect::<Vec<_>>() == ["0", "0", "4294967295"])
}

/// A resident launcher started from this binary with a pool of `pool` network namespaces,
/// and the backend's end of its socket.
fn launcher(pool: usize) -> (std::process::Child, OwnedFd) {
    let (ours, theirs) = socket_pair().expect("socket pair");
    let zygote = Command::new(std::env::current_exe().expect("this test binary"))
        .arg(FORKS_ARG)
        .arg(NETNS_POOL_ARG)
        .arg(pool.to_string())
        .stdin(Stdio::from(theirs))
        .current_dir("/")
        .spawn()
        .expect("start the resident launcher");
    (zygote, ours)
}

/// A sandbox started by the launcher on `socket`, running `command`: its stage one, and its
/// stdout, with stderr, to read.
struct Started {
    forked: nodus_launch::zygote_protocol::Forked,
    out: std::io::BufReader<std::fs::File>,
    err: std::fs::File,
    _work: tempfile::TempDir,
}

fn start(socket: &OwnedFd, command: &str) -> Started {
    let work = tempfile::tempdir().expect("tempdir");
    let bytes = plan(work.path(), command).encode().expect("a plan");
    let (out_read, out_write) = pipe();
    let (err_read, err_write) = pipe();
    let forked = request(socket.as_fd(), &bytes, out_write.as_fd(), err_write.as_fd())
        .expect("the sandbox starts");
    Started {
        forked,
        out: std::io::BufReader::new(out_read),
        err: err_read,
        _work: work,
    }
}

impl Started {
    /// The first line the sandbox printed (its network namespace, `net:[INODE]`).
    fn line(&mut self) -> String {
        let mut line = String::new();
        std::io::BufRead::read_line(&mut self.out, &mut line).expect("read stdout");
        if line.is_empty() {
            let mut err = String::new();
            let _ = self.err.read_to_string(&mut err);
            panic!("the sandbox printed nothing (stderr: {err})");
        }
        assert!(line.starts_with("net:["), "{line}");
        line.trim_end().to_owned()
    }

    /// Waits until its stage one has exited (its pidfd turns readable): the launcher then sees
    /// it exited at its next look, before it reads the next request.
    fn wait(&self) {
        let mut polled = [rustix::event::PollFd::new(
            &self.forked.pidfd,
            rustix::event::PollFlags::IN,
        )];
        rustix::event::poll(&mut polled, None).expect("poll the pidfd");
    }

    /// A descriptor of its network namespace, read through its stage one (which entered it
    /// before the sandbox printed): held, the namespace cannot be freed and its inode number
    /// cannot go to a new one.
    fn hold_netns(&self) -> std::fs::File {
        std::fs::File::open(format!("/proc/{}/ns/net", self.forked.pid))
            .expect("open the sandbox's network namespace")
    }
}

/// The inode of the network namespace `held`, as `readlink` shows it.
fn named(held: &std::fs::File) -> String {
    use std::os::unix::fs::MetadataExt;
    format!("net:[{}]", held.metadata().expect("stat").ino())
}

fn a_namespace_whose_stage_one_exited_goes_to_the_next_sandbox() {
    let (mut zygote, socket) = launcher(1);
    let mut a = start(&socket, "readlink /proc/self/ns/net");
    let first = a.line();
    let ours = std::fs::File::open("/proc/self/ns/net").expect("our namespace");
    assert_ne!(
        first,
        named(&ours),
        "the sandbox has a namespace of its own"
    );
    a.wait();
    let mut b = start(&socket, "readlink /proc/self/ns/net");
    assert_eq!(
        b.line(),
        first,
        "the namespace of a sandbox whose stage one exited goes to the next one"
    );
    b.wait();
    drop(socket);
    assert!(zygote.wait().expect("the launcher exits").success());
}

fn a_namespace_whose_stage_one_was_killed_is_not_handed_again() {
    let (mut zygote, socket) = launcher(1);
    // A sandbox that stays until killed.
    let mut a = start(&socket, "readlink /proc/self/ns/net; exec sleep 1000");
    let first = a.line();
    let held = a.hold_netns();
    assert_eq!(named(&held), first);
    rustix::process::pidfd_send_signal(&a.forked.pidfd, rustix::process::Signal::KILL)
        .expect("kill stage one");
    a.wait();
    let mut b = start(&socket, "readlink /proc/self/ns/net");
    assert_ne!(
        b.line(),
        first,
        "the namespace of a stage one killed by a signal is not handed to another sandbox"
    );
    b.wait();
    drop((held, socket));
    assert!(zygote.wait().expect("the launcher exits").success());
}

fn without_a_pool_each_sandbox_has_a_new_namespace() {
    let (mut zygote, socket) = launcher(0);
    let mut a = start(&socket, "readlink /proc/self/ns/net; exec sleep 1000");
    let first = a.line();
    // Held, so that its inode number cannot go to the next one once it is freed.
    let held = a.hold_netns();
    assert_eq!(named(&held), first);
    // Stage one exits once its init (the shell, `sleep`) is killed.
    let init = std::fs::read_to_string(format!("/proc/{0}/task/{0}/children", a.forked.pid))
        .expect("stage one's children");
    let init: i32 = init.trim().parse().expect("one child, the init");
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(init).expect("a pid"),
        rustix::process::Signal::KILL,
    )
    .expect("kill the init");
    a.wait();
    let mut b = start(&socket, "readlink /proc/self/ns/net");
    assert_ne!(b.line(), first, "no pool: a new namespace for each sandbox");
    b.wait();
    drop((held, socket));
    assert!(zygote.wait().expect("the launcher exits").success());
}

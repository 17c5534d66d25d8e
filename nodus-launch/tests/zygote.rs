//! The resident launcher, started from this test binary (which runs `run_if_asked` first, as
//! the `nodus` binary does): a malformed request gets an error answer and the launcher goes on
//! to start the next sandbox, whose processes see no descriptor beyond 0, 1 and 2.
//!
//! `cargo test -p nodus-launch --test zygote` (as root or with unprivileged user namespaces).

use std::ffi::OsString;
use std::io::Read;
use std::os::fd::{AsFd, OwnedFd};
use std::process::{Command, ExitCode, Stdio};

use nodus_launch::zygote_protocol::{Failure, request, socket_pair};
use nodus_launch::{FORKS_ARG, Plan};

fn main() -> ExitCode {
    let args: Vec<OsString> = std::env::args_os().skip(1).collect();
    if let Some(code) = nodus_launch::run_if_asked(&args) {
        return code;
    }
    a_malformed_request_is_answered_and_the_next_one_starts_its_sandbox();
    println!("test a_malformed_request_is_answered_and_the_next_one_starts_its_sandbox ... ok");
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
    for dir in ["/usr", "/bin", "/sbin", "/lib", "/lib64", "/etc"] {
        match std::fs::read_link(dir) {
            Ok(target) => plan.symlinks.push((target, dir.into())),
            Err(_) if std::path::Path::new(dir).is_dir() => plan.ro_binds.push(dir.into()),
            Err(_) => {}
        }
    }
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

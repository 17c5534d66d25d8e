//! PID 1's command loop, for a sandbox started with [`Plan::channel`]: it reads the command
//! channel's frames (nodus-sandbox's `channel` module writes them) on its standard output,
//! which is a socket, and runs each command as the channel's shell does, without that shell's
//! own program start.
//!
//! A frame is one line, `NONCE LENGTH DIR PAYLOAD`, the directory and the payload written as
//! `printf %b` text; a line whose payload does not have the announced length is skipped. For
//! each frame: the directory is entered (`cd -P`: it must exist and, links resolved, stay
//! inside the working directory, else the status is `missing` or `outside`); `NONCE B` goes to
//! both streams; the command runs as the plan's program with the command appended
//! (`/bin/sh -c CMD`), stdin from `/dev/null`, in a process group of its own, with the
//! sandbox's environment and `PWD`/`OLDPWD` as the shell's `cd` leaves them; when it has
//! exited, every other process of the namespace is killed and reaped; then `\nNONCE E STATUS`
//! goes to stdout and `\nNONCE E` to stderr. Orphans are reaped while a command runs. The loop
//! ends, and with it the sandbox, when the channel is closed.

use std::ffi::OsStr;
use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::os::fd::AsFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use rustix::process::{Pid, Signal, WaitOptions};

use crate::{Error, Plan};

/// One command read from the channel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    /// The command's nonce, which its markers carry.
    pub nonce: Vec<u8>,
    /// The directory to run it in, decoded.
    pub dir: Vec<u8>,
    /// The command, decoded.
    pub command: Vec<u8>,
}

impl Frame {
    /// Reads one line of the channel (without its newline) as the channel's shell does:
    /// `None` for a line that is not a whole frame (an empty line, a fragment of a frame whose
    /// writer stopped half-way).
    pub fn parse(line: &[u8]) -> Option<Frame> {
        let mut fields = line.splitn(4, |&b| b == b' ');
        let (nonce, length, dir, payload) = (
            fields.next()?,
            fields.next()?,
            fields.next()?,
            fields.next()?,
        );
        if payload.len().to_string().as_bytes() != length {
            return None;
        }
        Some(Frame {
            nonce: nonce.to_vec(),
            dir: unescape(dir),
            command: unescape(payload),
        })
    }
}

/// What `printf %b` makes of `text`: `\0` and up to three octal digits is that byte, and the
/// one-letter escapes are their characters (the channel writes only the first kind).
fn unescape(text: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(text.len());
    let mut i = 0;
    while i < text.len() {
        let (byte, next) = match (text[i], text.get(i + 1)) {
            (b'\\', Some(b'0')) => {
                let digits = text[i + 2..]
                    .iter()
                    .take(3)
                    .take_while(|d| (b'0'..=b'7').contains(d))
                    .count();
                let value = text[i + 2..i + 2 + digits]
                    .iter()
                    .fold(0u32, |n, d| n * 8 + u32::from(d - b'0'));
                (u8::try_from(value & 0xff).unwrap_or(0), i + 2 + digits)
            }
            (b'\\', Some(&letter)) => match letter {
                b'\\' => (b'\\', i + 2),
                b'a' => (7, i + 2),
                b'b' => (8, i + 2),
                b'f' => (12, i + 2),
                b'n' => (b'\n', i + 2),
                b'r' => (b'\r', i + 2),
                b't' => (b'\t', i + 2),
                b'v' => (11, i + 2),
                _ => (b'\\', i + 1),
            },
            (byte, _) => (byte, i + 1),
        };
        out.push(byte);
        i = next;
    }
    out
}

/// How a command's directory came out.
enum Entered {
    /// The command runs here.
    Inside(PathBuf),
    /// The status that says why it does not run: `missing` or `outside`.
    Refused(&'static str),
}

/// Enters `dir` as `cd -P` does and checks that it is `work` or below it.
fn enter(dir: &[u8], work: &Path) -> Entered {
    if rustix::process::chdir(OsStr::from_bytes(dir)).is_err() {
        return Entered::Refused("missing");
    }
    match std::env::current_dir() {
        Ok(cwd) if cwd.starts_with(work) => Entered::Inside(cwd),
        Ok(_) => Entered::Refused("outside"),
        Err(_) => Entered::Refused("missing"),
    }
}

/// Runs the loop until the channel closes; stage two calls it as PID 1, in the sandbox's root,
/// with its inner user namespace entered.
pub(crate) fn serve(plan: &Plan) -> Result<u8, Error> {
    let work = plan.work_inside.as_path();
    let copy = |fd: std::os::fd::BorrowedFd<'_>, what: &str| {
        fd.try_clone_to_owned()
            .map(File::from)
            .map_err(Error::step(format!("taking the channel's {what}")))
    };
    let mut input = BufReader::new(copy(std::io::stdout().as_fd(), "input")?);
    let mut out = copy(std::io::stdout().as_fd(), "stdout")?;
    let mut err = copy(std::io::stderr().as_fd(), "stderr")?;
    let mut line = Vec::new();
    loop {
        line.clear();
        match input.read_until(b'\n', &mut line) {
            Ok(0) => return Ok(0),
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(Error::step("reading the channel")(e)),
        }
        let Some(frame) = Frame::parse(line.strip_suffix(b"\n").unwrap_or(&line)) else {
            continue;
        };
        let entered = enter(&frame.dir, work);
        let begin = [&frame.nonce[..], b" B\n"].concat();
        // A write that fails means the host closed the channel: the sandbox ends.
        if out.write_all(&begin).and(err.write_all(&begin)).is_err() {
            return Ok(0);
        }
        let status = match entered {
            Entered::Inside(cwd) => run(plan, &frame.command, &cwd, &mut err)?.to_string(),
            Entered::Refused(why) => why.to_owned(),
        };
        rustix::process::chdir(work).map_err(Error::errno("entering the working directory"))?;
        let end_out = [b"\n", &frame.nonce[..], b" E ", status.as_bytes(), b"\n"].concat();
        let end_err = [b"\n", &frame.nonce[..], b" E\n"].concat();
        if out
            .write_all(&end_out)
            .and(err.write_all(&end_err))
            .is_err()
        {
            return Ok(0);
        }
    }
}

/// Runs one command in `cwd` and waits for it, reaping orphans meanwhile; then ends every
/// other process of the namespace. Its status: its exit code, or 128 + the signal that ended
/// it.
fn run(plan: &Plan, command: &[u8], cwd: &Path, err: &mut File) -> Result<i32, Error> {
    let (program, args) = plan
        .program
        .split_first()
        .ok_or_else(|| Error::Plan("no program".to_owned()))?;
    let mut child = Command::new(program);
    child
        .args(args)
        .arg(OsStr::from_bytes(command))
        .env_clear()
        .envs(plan.env.iter().map(|(k, v)| (k, v)))
        .env("PWD", cwd)
        .env("OLDPWD", &plan.work_inside)
        .stdin(Stdio::null())
        .process_group(0);
    crate::init::limit_address_space(&mut child, plan);
    let spawned = child.spawn();
    let code = match spawned {
        Ok(child) => {
            let main = child.id();
            loop {
                match rustix::process::wait(WaitOptions::empty()) {
                    Ok(Some((pid, status)))
                        if pid.as_raw_nonzero().get().unsigned_abs() == main =>
                    {
                        break i32::from(crate::code_of(status));
                    }
                    Ok(_) | Err(rustix::io::Errno::INTR) => {}
                    Err(e) => return Err(Error::errno("waiting for the command")(e)),
                }
            }
        }
        Err(e) => {
            let _ = writeln!(err, "nodus-launch: cannot start the command: {e}");
            i32::from(crate::FAILED_EXIT)
        }
    };
    end_the_rest()?;
    Ok(code)
}

/// Kills every process of the namespace but this one (what the command left running) and
/// reaps them all. The kill is repeated before each wait, so that a process forked while the
/// signals went out is killed too.
fn end_the_rest() -> Result<(), Error> {
    loop {
        // `kill(-1, SIGKILL)` (rustix spells `-pid` as a process group): from PID 1 of a pid
        // namespace, every process of the namespace but PID 1.
        match rustix::process::kill_process_group(Pid::INIT, Signal::KILL) {
            Ok(()) | Err(rustix::io::Errno::SRCH) => {}
            Err(e) => return Err(Error::errno("ending the command's processes")(e)),
        }
        match rustix::process::wait(WaitOptions::empty()) {
            Ok(_) | Err(rustix::io::Errno::INTR) => {}
            Err(rustix::io::Errno::CHILD) => return Ok(()),
            Err(e) => return Err(Error::errno("reaping the command's processes")(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_are_read_as_the_shell_reads_them() {
        let frame = Frame::parse(b"N 16 /work/a\\0040b echo\\0040hi\\0012").expect("a frame");
        assert_eq!(frame.nonce, b"N");
        assert_eq!(frame.dir, b"/work/a b");
        assert_eq!(frame.command, b"echo hi\n");
        // Spaces in the payload are its own.
        let frame = Frame::parse(b"N 6 /work a  b c").expect("a frame");
        assert_eq!(frame.command, b"a  b c");
        for broken in [
            &b""[..],
            b"N",
            b"N 3 /work",
            b"N 3 /work ab",
            b"N 03 /work abc",
        ] {
            assert_eq!(
                Frame::parse(broken),
                None,
                "{:?}",
                String::from_utf8_lossy(broken)
            );
        }
    }

    #[test]
    fn escapes_decode_as_printf_b() {
        assert_eq!(unescape(b"\\0134\\0000\\0377x"), b"\\\0\xffx");
        assert_eq!(unescape(b"\\01x\\0"), b"\x01x\0");
        assert_eq!(unescape(b"a\\tb\\\\c\\q"), b"a\tb\\c\\q");
    }
}

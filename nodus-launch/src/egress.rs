//! The way out of a sandbox whose only route is the egress proxy: stage one, in the
//! sandbox's new network namespace (whose user namespace it is root of), brings loopback up
//! and listens on `127.0.0.1:`[`EGRESS_PORT`] there, then forks the bridge before it enters
//! the sandbox's other namespaces: a process in the host's pid and mount namespaces (a thread
//! cannot be made once `CLONE_NEWPID` is unshared, and the sandbox's root, pivoted into in a
//! mount namespace the bridge shared, would become its root too) that carries each
//! connection to the proxy's Unix socket for this sandbox, a host path that the sandbox's
//! file system does not show. It ends with
//! stage one (its parent-death signal), and is in stage one's process group.
//!
//! Nothing else leaves the namespace: its only interface is loopback, so a direct connection
//! to any other address finds no route, and the sandbox's processes (no capability in any
//! user namespace) cannot open raw sockets, add interfaces or routes. They cannot see or
//! signal the bridge either: it is not in their pid namespace. The proxy decides every
//! connection; the bridge only carries bytes, so it lives as long as stage one, that is as
//! long as the sandbox.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, Shutdown, TcpListener, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;

use rustix::net::{AddressFamily, RecvFlags, SendFlags, SocketType};

use crate::Error;

/// The port of the egress proxy on a sandbox's loopback (`HTTP_PROXY=http://127.0.0.1:3128`).
pub const EGRESS_PORT: u16 = 3128;

/// The listener, made before stage one forks the sandbox's init.
#[derive(Debug)]
pub(crate) struct Bridge {
    listener: TcpListener,
    socket: PathBuf,
}

impl Bridge {
    /// Brings this network namespace's loopback up and listens on the proxy's port; the
    /// connections will go to `socket`.
    pub(crate) fn listen(socket: PathBuf) -> Result<Bridge, Error> {
        loopback_up()?;
        let listener =
            TcpListener::bind((Ipv4Addr::LOCALHOST, EGRESS_PORT)).map_err(Error::step(format!(
                "listening on 127.0.0.1:{EGRESS_PORT} for the egress proxy"
            )))?;
        Ok(Bridge { listener, socket })
    }

    /// Forks the bridge, which serves the connections until this process ends. Call it while
    /// this process is single-threaded, before it unshares the pid and mount namespaces.
    pub(crate) fn start(self) -> Result<(), Error> {
        let Some(_bridge) = crate::fork("the egress bridge")? else {
            // Nothing of the sandbox's channel stays open here.
            let end = |e: Error| -> ! {
                let _ = writeln!(std::io::stderr(), "{e}");
                std::process::exit(i32::from(crate::FAILED_EXIT))
            };
            if let Err(e) = self.detach() {
                end(e);
            }
            self.serve();
            std::process::exit(0)
        };
        Ok(())
    }

    /// In the bridge: ends with its parent, and lets go of the standard streams (the
    /// sandbox's channel).
    fn detach(&self) -> Result<(), Error> {
        rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL))
            .map_err(Error::errno("setting the bridge's parent-death signal"))?;
        // Stage one ended before the signal was set: nothing would end this process.
        if rustix::process::getppid().is_none_or(|parent| parent == rustix::process::Pid::INIT) {
            return Err(Error::Plan(
                "stage one ended before the bridge started".to_owned(),
            ));
        }
        let null = rustix::fs::open(
            "/dev/null",
            rustix::fs::OFlags::RDWR | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )
        .map_err(Error::errno("opening /dev/null"))?;
        rustix::stdio::dup2_stdin(&null).map_err(Error::errno("closing the bridge's stdin"))?;
        rustix::stdio::dup2_stdout(&null).map_err(Error::errno("closing the bridge's stdout"))?;
        rustix::stdio::dup2_stderr(&null).map_err(Error::errno("closing the bridge's stderr"))?;
        Ok(())
    }

    /// Serves the connections, a thread each (two per connection), for ever.
    fn serve(self) {
        let Bridge { listener, socket } = self;
        for stream in listener.incoming() {
            let Ok(stream) = stream else { continue };
            let socket = socket.clone();
            // Out of threads (the sandbox's pids limit counts them): the connection is
            // dropped, which the client sees as refused.
            let _ = std::thread::Builder::new().spawn(move || carry(stream, &socket));
        }
    }
}

/// Carries one connection's bytes both ways between the sandbox and the proxy, passing on
/// each side's end of writing.
fn carry(sandbox: TcpStream, socket: &std::path::Path) {
    let Ok(proxy) = UnixStream::connect(socket) else {
        return;
    };
    let (Ok(sandbox_in), Ok(proxy_out)) = (sandbox.try_clone(), proxy.try_clone()) else {
        return;
    };
    let onward = std::thread::Builder::new().spawn(move || {
        let _ = pass(&sandbox_in, &proxy_out);
        let _ = proxy_out.shutdown(Shutdown::Write);
    });
    if onward.is_err() {
        return;
    }
    let _ = pass(&proxy, &sandbox);
    let _ = sandbox.shutdown(Shutdown::Write);
}

/// The most one `splice(2)` moves, and the pipe's size asked for (the kernel's default pipe
/// is 64 KiB).
const SPLICED: usize = 1 << 20;

/// Passes what `from` sends to `to` until `from` ends: through a pipe with `splice(2)`, so
/// the bytes never enter this process's memory; by reading and writing where the kernel
/// cannot splice these sockets.
fn pass<F, T>(from: &F, to: &T) -> std::io::Result<u64>
where
    F: std::os::fd::AsFd,
    T: std::os::fd::AsFd,
    for<'a> &'a F: Read,
    for<'a> &'a T: Write,
{
    use rustix::io::Errno;
    use rustix::pipe::{PipeFlags, SpliceFlags};
    let Ok((pipe_out, pipe_in)) = rustix::pipe::pipe_with(PipeFlags::CLOEXEC) else {
        return copy(from, to);
    };
    // A larger pipe moves more per call; the default size serves too.
    let _ = rustix::pipe::fcntl_setpipe_size(&pipe_in, SPLICED);
    let mut total = 0u64;
    loop {
        let read =
            match rustix::pipe::splice(from, None, &pipe_in, None, SPLICED, SpliceFlags::MOVE) {
                Ok(0) => return Ok(total),
                Ok(n) => n,
                Err(Errno::INTR) => continue,
                Err(Errno::INVAL) if total == 0 => return copy(from, to),
                Err(e) => return Err(e.into()),
            };
        let mut left = read;
        while left > 0 {
            match rustix::pipe::splice(&pipe_out, None, to, None, left, SpliceFlags::MOVE) {
                Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
                Ok(n) => left -= n,
                Err(Errno::INTR) => {}
                Err(e) => return Err(e.into()),
            }
        }
        total += read as u64;
    }
}

/// Passes what `from` sends to `to` through a buffer, until `from` ends.
fn copy<F, T>(mut from: &F, mut to: &T) -> std::io::Result<u64>
where
    for<'a> &'a F: Read,
    for<'a> &'a T: Write,
{
    let mut buf = vec![0u8; 64 << 10];
    let mut total = 0;
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) => return Ok(total),
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        to.write_all(&buf[..n])?;
        total += n as u64;
    }
}

/// Sets loopback (index 1 in every network namespace) up with an `RTM_NEWLINK` request over
/// rtnetlink, and reads the kernel's acknowledgement.
fn loopback_up() -> Result<(), Error> {
    const RTM_NEWLINK: u16 = 16;
    const NLM_F_REQUEST: u16 = 1;
    const NLM_F_ACK: u16 = 4;
    const IFF_UP: u32 = 1;
    const LOOPBACK_INDEX: i32 = 1;
    let step = "bringing the sandbox's loopback up";
    let mut message = Vec::with_capacity(32);
    // struct nlmsghdr: length, type, flags, sequence, port id.
    message.extend_from_slice(&32u32.to_ne_bytes());
    message.extend_from_slice(&RTM_NEWLINK.to_ne_bytes());
    message.extend_from_slice(&(NLM_F_REQUEST | NLM_F_ACK).to_ne_bytes());
    message.extend_from_slice(&1u32.to_ne_bytes());
    message.extend_from_slice(&0u32.to_ne_bytes());
    // struct ifinfomsg: family (AF_UNSPEC), padding, type, index, flags, change mask.
    message.extend_from_slice(&[0, 0]);
    message.extend_from_slice(&0u16.to_ne_bytes());
    message.extend_from_slice(&LOOPBACK_INDEX.to_ne_bytes());
    message.extend_from_slice(&IFF_UP.to_ne_bytes());
    message.extend_from_slice(&IFF_UP.to_ne_bytes());
    let netlink = rustix::net::socket(AddressFamily::NETLINK, SocketType::RAW, None)
        .map_err(Error::errno(step))?;
    // An unconnected netlink socket sends to the kernel.
    rustix::net::send(&netlink, &message, SendFlags::empty()).map_err(Error::errno(step))?;
    let mut answer = [0u8; 256];
    let (n, _) =
        rustix::net::recv(&netlink, &mut answer, RecvFlags::empty()).map_err(Error::errno(step))?;
    // struct nlmsghdr, then struct nlmsgerr, whose first field is 0 or a negative errno.
    let code = answer
        .get(16..20)
        .filter(|_| n >= 20)
        .map(|b| i32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
        .ok_or_else(|| Error::Plan(format!("{step}: a short answer from the kernel")))?;
    if code != 0 {
        return Err(Error::Step {
            step: step.to_owned(),
            source: std::io::Error::from_raw_os_error(-code),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A connected pair of loopback TCP sockets.
    fn tcp_pair() -> (TcpStream, TcpStream) {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("a port");
        let near = TcpStream::connect(listener.local_addr().expect("address")).expect("connect");
        let (far, _) = listener.accept().expect("accept");
        (near, far)
    }

    /// Bytes whose pattern does not repeat at any power of two.
    fn pattern(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 7 + i / 251) as u8).collect()
    }

    /// `data` written into `into` (then closed), carried from `from` to `to` (then closed) by
    /// [`pass`] or its fallback [`copy`]: how many bytes the carrier counted, and what
    /// `out_of` read.
    fn carried<F, T>(
        data: &[u8],
        mut into: impl Write + Send + 'static,
        from: F,
        to: T,
        mut out_of: impl Read,
        spliced: bool,
    ) -> (u64, Vec<u8>)
    where
        F: std::os::fd::AsFd + Send + 'static,
        T: std::os::fd::AsFd + Send + 'static,
        for<'a> &'a F: Read,
        for<'a> &'a T: Write,
    {
        let data = data.to_vec();
        let writer = std::thread::spawn(move || into.write_all(&data).expect("write"));
        let carrier = std::thread::spawn(move || {
            let total = if spliced {
                pass(&from, &to)
            } else {
                copy(&from, &to)
            };
            total.expect("carried")
        });
        let mut got = Vec::new();
        out_of.read_to_end(&mut got).expect("read");
        writer.join().expect("writer");
        (carrier.join().expect("carrier"), got)
    }

    #[test]
    fn a_connection_is_carried_whole_both_ways_spliced_or_copied() {
        let data = pattern(3 * SPLICED + 12_345);
        for spliced in [true, false] {
            // The sandbox's TCP connection, onward to the proxy's Unix socket.
            let (sandbox, bridge_in) = tcp_pair();
            let (bridge_out, proxy) = UnixStream::pair().expect("a socket pair");
            let (total, got) = carried(&data, sandbox, bridge_in, bridge_out, proxy, spliced);
            assert_eq!(total, data.len() as u64, "onward, spliced {spliced}");
            assert!(got == data, "onward, spliced {spliced}: the bytes differ");
            // The proxy's answer, back to the sandbox.
            let (proxy, bridge_in) = UnixStream::pair().expect("a socket pair");
            let (bridge_out, sandbox) = tcp_pair();
            let (total, got) = carried(&data, proxy, bridge_in, bridge_out, sandbox, spliced);
            assert_eq!(total, data.len() as u64, "back, spliced {spliced}");
            assert!(got == data, "back, spliced {spliced}: the bytes differ");
        }
    }
}

//! The way out of a sandbox whose only route is the egress proxy: stage one, in the
//! sandbox's new network namespace (whose user namespace it is root of), brings loopback up
//! and listens on `127.0.0.1:`[`EGRESS_PORT`] there, then forks the bridge before it enters
//! the sandbox's other namespaces: a process in the host's pid and mount namespaces (a thread
//! cannot be made once `CLONE_NEWPID` is unshared, and the sandbox's root, pivoted into in a
//! mount namespace the bridge shared, would become its root too) that hands each connection
//! to the proxy ([`crate::handoff`]) over the proxy's Unix socket for this sandbox, a host
//! path that the sandbox's file system does not show; the proxy then reads and writes the
//! connection itself. It ends with stage one (its parent-death signal), and is in stage one's
//! process group.
//!
//! Nothing else leaves the namespace: its only interface is loopback, so a direct connection
//! to any other address finds no route, and the sandbox's processes (no capability in any
//! user namespace) cannot open raw sockets, add interfaces or routes. They cannot see or
//! signal the bridge either: it is not in their pid namespace. The proxy decides every
//! connection; the bridge only hands connections over, so it lives as long as stage one, that
//! is as long as the sandbox.

use std::io::Write;
use std::net::{Ipv4Addr, TcpListener};
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

    /// Hands each connection to the proxy (its descriptor, over the proxy's Unix socket for
    /// this sandbox), for ever.
    fn serve(self) {
        let Bridge { listener, socket } = self;
        for stream in listener.incoming() {
            let Ok(stream) = stream else { continue };
            // A connection the proxy does not take is dropped, which the client sees as
            // refused.
            if let Ok(proxy) = UnixStream::connect(&socket) {
                let _ = crate::handoff::send(&proxy, &stream);
            }
        }
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

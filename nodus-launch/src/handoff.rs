//! Handing a sandbox's connection to the egress proxy: whoever accepts it (the launcher's
//! bridge in the sandbox's network namespace, or the Docker backend's listener) connects to
//! the run's Unix socket of the proxy and passes the connection's descriptor over it
//! (`SCM_RIGHTS`, with one byte), then closes its own copy. The proxy then reads and writes
//! the sandbox's socket itself: nothing carries the bytes on the way, and the connection
//! belongs to the run whose socket it came through.

use std::io::{self, IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, OwnedFd};

use rustix::net::{
    AddressFamily, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags, SocketType,
};

/// The byte sent with the descriptor (a message of ancillary data alone is not delivered).
const MARK: u8 = b'C';

/// Passes `connection` over `channel` (a connected Unix stream socket). A nonblocking
/// `channel` may fail with `WouldBlock`: call again once it is writable.
pub fn send(channel: impl AsFd, connection: impl AsFd) -> io::Result<()> {
    let mut space = [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    let fds = [connection.as_fd()];
    if !control.push(SendAncillaryMessage::ScmRights(&fds)) {
        return Err(io::Error::other("no room for the descriptor"));
    }
    let sent = rustix::net::sendmsg(
        channel,
        &[IoSlice::new(&[MARK])],
        &mut control,
        SendFlags::NOSIGNAL,
    )?;
    if sent == 1 {
        Ok(())
    } else {
        Err(io::ErrorKind::WriteZero.into())
    }
}

/// Receives a connection [`send`] passed over `channel`: a connected TCP socket (IPv4 or
/// IPv6), or an error naming what came instead. A nonblocking `channel` may fail with
/// `WouldBlock`: call again once it is readable.
pub fn receive(channel: impl AsFd) -> io::Result<OwnedFd> {
    let mut space = [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let mut mark = [0u8; 1];
    let got = rustix::net::recvmsg(
        &channel,
        &mut [IoSliceMut::new(&mut mark)],
        &mut control,
        RecvFlags::CMSG_CLOEXEC,
    )?;
    // Every descriptor that came is taken (and closed when not kept), whatever else is wrong.
    let mut received: Vec<OwnedFd> = Vec::new();
    for message in control.drain() {
        if let RecvAncillaryMessage::ScmRights(fds) = message {
            received.extend(fds);
        }
    }
    if got.bytes != 1 || mark[0] != MARK || received.len() != 1 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "expected one byte and one connection, got {} bytes and {} descriptors",
                got.bytes,
                received.len()
            ),
        ));
    }
    let connection = received.remove(0);
    let kind = rustix::net::sockopt::socket_type(&connection)?;
    let family = rustix::net::sockopt::socket_domain(&connection)?;
    if kind != SocketType::STREAM
        || (family != AddressFamily::INET && family != AddressFamily::INET6)
    {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "the descriptor passed is not a TCP connection",
        ));
    }
    Ok(connection)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::{Ipv4Addr, TcpListener, TcpStream};
    use std::os::unix::net::UnixStream;

    #[test]
    fn a_connection_passed_is_the_same_connection() {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("a port");
        let mut near =
            TcpStream::connect(listener.local_addr().expect("address")).expect("connect");
        let (far, _) = listener.accept().expect("accept");
        let (bridge, proxy) = UnixStream::pair().expect("a socket pair");
        send(&bridge, &far).expect("sent");
        drop(far);
        let mut passed = TcpStream::from(receive(&proxy).expect("received"));
        near.write_all(b"hello").expect("write");
        let mut got = [0u8; 5];
        passed.read_exact(&mut got).expect("read");
        assert_eq!(&got, b"hello");
        passed.write_all(b"back").expect("write");
        drop(passed);
        let mut answer = String::new();
        near.read_to_string(&mut answer).expect("read");
        assert_eq!(answer, "back");
    }

    #[test]
    fn anything_but_a_tcp_connection_is_refused() {
        let (bridge, proxy) = UnixStream::pair().expect("a socket pair");
        // A Unix socket passed instead of a TCP connection.
        let (other, _keep) = UnixStream::pair().expect("a socket pair");
        send(&bridge, &other).expect("sent");
        let refused = receive(&proxy).expect_err("a Unix socket");
        assert!(
            refused.to_string().contains("not a TCP connection"),
            "{refused}"
        );
        // Bytes without a descriptor.
        (&bridge).write_all(b"GET / HTTP/1.1\r\n").expect("write");
        let refused = receive(&proxy).expect_err("no descriptor");
        assert!(refused.to_string().contains("0 descriptors"), "{refused}");
    }
}

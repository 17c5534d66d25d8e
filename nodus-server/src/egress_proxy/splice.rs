//! A plain tunnel's bytes carried by the kernel: each direction moves from one socket into a
//! pipe and from the pipe into the other socket with `splice(2)`, so a proxied byte never
//! enters the proxy's memory. Metered as [`super::meter`] meters a copied tunnel: the
//! sandbox's side counted both ways and charged to the run's budget, each move asked for no
//! more than what is left of it, and the connection cut off once it is spent.

use std::io;
use std::os::fd::AsFd;

use rustix::pipe::{PipeFlags, SpliceFlags};
use tokio::io::Interest;

use super::meter::{Budget, Meter};

/// The most one `splice(2)` moves, and the pipe's size asked for (the kernel's default pipe
/// is 64 KiB, which serves too).
const SPLICED: usize = 1 << 20;

/// A tokio socket the kernel can splice: its descriptor, and its readiness.
pub(crate) trait Socket: AsFd + Send + Sync {
    /// Waits until the socket may be ready for `interest`.
    fn ready_for(&self, interest: Interest) -> impl Future<Output = io::Result<()>> + Send;
    /// Runs `call` on the socket, clearing its readiness when `call` would block.
    fn try_io_for<R>(
        &self,
        interest: Interest,
        call: impl FnOnce() -> io::Result<R>,
    ) -> io::Result<R>;
}

macro_rules! socket {
    ($type:ty) => {
        impl Socket for $type {
            async fn ready_for(&self, interest: Interest) -> io::Result<()> {
                self.ready(interest).await.map(|_| ())
            }
            fn try_io_for<R>(
                &self,
                interest: Interest,
                call: impl FnOnce() -> io::Result<R>,
            ) -> io::Result<R> {
                self.try_io(interest, call)
            }
        }
    };
}
socket!(tokio::net::UnixStream);
socket!(tokio::net::TcpStream);

/// Which way bytes go, for the meter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Way {
    /// From the sandbox onward.
    Out,
    /// Back to the sandbox.
    Back,
}

/// Carries `sandbox`'s bytes to `host` and `host`'s back until both ways have ended (each end
/// of writing passed on), one fails, or the run's `budget` is spent (then `meter` says the
/// connection was cut off).
pub(super) async fn carry<A: Socket, B: Socket>(
    sandbox: &A,
    host: &B,
    meter: &Meter,
    budget: &Budget,
) -> io::Result<()> {
    let out = one_way(sandbox, host, Way::Out, meter, budget);
    let back = one_way(host, sandbox, Way::Back, meter, budget);
    tokio::try_join!(out, back).map(|_| ())
}

/// Moves what `from` sends to `to` until `from` ends (then ends `to`'s writing).
async fn one_way<F: Socket, T: Socket>(
    from: &F,
    to: &T,
    way: Way,
    meter: &Meter,
    budget: &Budget,
) -> io::Result<()> {
    let (pipe_out, pipe_in) = rustix::pipe::pipe_with(PipeFlags::CLOEXEC | PipeFlags::NONBLOCK)?;
    let _ = rustix::pipe::fcntl_setpipe_size(&pipe_in, SPLICED);
    let flags = SpliceFlags::MOVE | SpliceFlags::NONBLOCK;
    loop {
        let allowed = budget.left();
        if allowed == 0 {
            return Err(meter.cut());
        }
        let want = SPLICED.min(usize::try_from(allowed).unwrap_or(usize::MAX));
        // The pipe is empty here: `would block` is the socket's.
        let moved = loop {
            from.ready_for(Interest::READABLE).await?;
            let spliced = from.try_io_for(Interest::READABLE, || {
                rustix::pipe::splice(from, None, &pipe_in, None, want, flags)
                    .map_err(io::Error::from)
            });
            match spliced {
                Ok(n) => break n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        };
        if moved == 0 {
            let _ = rustix::net::shutdown(to, rustix::net::Shutdown::Write);
            return Ok(());
        }
        meter.carried(way == Way::Out, moved as u64);
        budget.charge(moved);
        let mut left = moved;
        while left > 0 {
            to.ready_for(Interest::WRITABLE).await?;
            let spliced = to.try_io_for(Interest::WRITABLE, || {
                rustix::pipe::splice(&pipe_out, None, to, None, left, flags)
                    .map_err(io::Error::from)
            });
            match spliced {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => left -= n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A connected pair of loopback TCP sockets.
    async fn tcp_pair() -> (tokio::net::TcpStream, tokio::net::TcpStream) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a port");
        let address = listener.local_addr().expect("address");
        let (near, far) = tokio::join!(tokio::net::TcpStream::connect(address), listener.accept());
        (near.expect("connect"), far.expect("accept").0)
    }

    fn pattern(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 7 + i / 251) as u8).collect()
    }

    #[tokio::test]
    async fn a_tunnel_is_carried_whole_both_ways_and_metered() {
        // The sandbox's connection (a Unix socket) and the host's (TCP).
        let (mut sandbox, proxy_side) = tokio::net::UnixStream::pair().expect("a pair");
        let (proxy_onward, mut host) = tcp_pair().await;
        let meter = Meter::default();
        let budget = Budget::new(u64::MAX);
        let request = pattern(3 * SPLICED + 17);
        let answer = pattern(5 * SPLICED + 3);
        let carried = carry(&proxy_side, &proxy_onward, &meter, &budget);
        let sandbox_side = async {
            sandbox.write_all(&request).await.expect("request");
            sandbox.shutdown().await.expect("end");
            let mut got = Vec::new();
            sandbox.read_to_end(&mut got).await.expect("answer");
            got
        };
        let host_side = async {
            let mut got = vec![0u8; request.len()];
            host.read_exact(&mut got).await.expect("request");
            host.write_all(&answer).await.expect("answer");
            host.shutdown().await.expect("end");
            got
        };
        let (carried, got_answer, got_request) = tokio::join!(carried, sandbox_side, host_side);
        carried.expect("carried");
        assert!(got_request == request, "the request differs");
        assert!(got_answer == answer, "the answer differs");
        assert_eq!(
            (meter.bytes_out(), meter.bytes_in()),
            (request.len() as u64, answer.len() as u64)
        );
        assert!(!meter.was_cut());
    }

    #[tokio::test]
    async fn a_tunnel_past_the_budget_is_cut_off_at_it() {
        let (mut sandbox, proxy_side) = tokio::net::UnixStream::pair().expect("a pair");
        let (proxy_onward, mut host) = tcp_pair().await;
        let meter = Meter::default();
        let budget = Budget::new(100_000);
        // The host sends more than the budget (what the tunnel leaves unread stays in the
        // sockets' buffers: the writer is not waited for).
        tokio::spawn(async move {
            let _ = host.write_all(&pattern(1 << 20)).await;
            host
        });
        let carried = carry(&proxy_side, &proxy_onward, &meter, &budget).await;
        assert!(carried.is_err(), "cut off");
        drop(proxy_side);
        let mut got = Vec::new();
        sandbox.read_to_end(&mut got).await.expect("read");
        assert!(meter.was_cut());
        assert_eq!(meter.bytes_in(), 100_000, "exactly the budget");
        assert_eq!(got.len(), 100_000);
    }
}

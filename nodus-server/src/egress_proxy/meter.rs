//! The bytes of a run's connections through the egress proxy: each connection's counts (in
//! its record, even when the connection is cut short by its sandbox's end) and the run's
//! budget (`--egress-max-bytes`): once a run's connections have carried the budget, the one
//! that passed it is cut off (within one buffer of the limit) and later ones are refused.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// The bytes a run's connections may carry, both ways together, and what they carried.
#[derive(Debug)]
pub(super) struct Budget {
    limit: u64,
    used: AtomicU64,
}

impl Budget {
    /// A budget of `limit` bytes, none used.
    pub(super) fn new(limit: u64) -> Self {
        Budget {
            limit,
            used: AtomicU64::new(0),
        }
    }

    /// The limit.
    pub(super) fn limit(&self) -> u64 {
        self.limit
    }

    /// Whether the run's connections have carried all it allows.
    pub(super) fn spent(&self) -> bool {
        spent(self.used.load(Ordering::Relaxed), self.limit)
    }

    /// The bytes left before the budget is spent.
    pub(super) fn left(&self) -> u64 {
        self.limit.saturating_sub(self.used.load(Ordering::Relaxed))
    }

    /// Counts `bytes` carried.
    pub(super) fn charge(&self, bytes: usize) {
        self.used.fetch_add(bytes as u64, Ordering::Relaxed);
    }
}

/// Whether `used` bytes have used up a budget of `limit`.
fn spent(used: u64, limit: u64) -> bool {
    used >= limit
}

/// One connection's bytes so far, and whether it was cut off.
#[derive(Debug, Default)]
pub(super) struct Meter {
    out: AtomicU64,
    back: AtomicU64,
    cut: AtomicBool,
}

impl Meter {
    /// Bytes from the sandbox onward.
    pub(super) fn bytes_out(&self) -> u64 {
        self.out.load(Ordering::Relaxed)
    }

    /// Bytes back to the sandbox.
    pub(super) fn bytes_in(&self) -> u64 {
        self.back.load(Ordering::Relaxed)
    }

    /// Counts bytes sent onward before the stream was metered (the request head).
    pub(super) fn add_out(&self, bytes: u64) {
        self.out.fetch_add(bytes, Ordering::Relaxed);
    }

    /// Whether the run's budget cut the connection off.
    pub(super) fn was_cut(&self) -> bool {
        self.cut.load(Ordering::Relaxed)
    }

    /// Counts `bytes` carried onward from the sandbox (`out`) or back to it.
    pub(super) fn carried(&self, out: bool, bytes: u64) {
        let count = if out { &self.out } else { &self.back };
        count.fetch_add(bytes, Ordering::Relaxed);
    }

    /// Notes that the run's budget cut the connection off: the error that ends it.
    pub(super) fn cut(&self) -> io::Error {
        self.cut.store(true, Ordering::Relaxed);
        io::Error::other("the run's egress byte limit is reached")
    }
}

/// The sandbox's side of a connection, metered: what is read from it goes onward (`out`),
/// what is written to it came back (`in`); both are charged to the run's budget, and once it
/// is spent every read and write fails.
pub(super) struct Metered<'a, S> {
    pub(super) inner: &'a mut S,
    pub(super) meter: &'a Meter,
    pub(super) budget: &'a Budget,
}

impl<S> Metered<'_, S> {
    fn cut(&self) -> io::Error {
        self.meter.cut()
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Metered<'_, S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.budget.spent() {
            return Poll::Ready(Err(this.cut()));
        }
        let before = buf.filled().len();
        let polled = Pin::new(&mut *this.inner).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = polled {
            let read = buf.filled().len() - before;
            this.meter.out.fetch_add(read as u64, Ordering::Relaxed);
            this.budget.charge(read);
        }
        polled
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Metered<'_, S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.budget.spent() {
            return Poll::Ready(Err(this.cut()));
        }
        let polled = Pin::new(&mut *this.inner).poll_write(cx, buf);
        if let Poll::Ready(Ok(written)) = polled {
            this.meter.back.fetch_add(written as u64, Ordering::Relaxed);
            this.budget.charge(written);
        }
        polled
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.get_mut().inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[test]
    fn a_budget_is_spent_at_its_limit() {
        for (used, limit, expected) in [(0, 1, false), (1, 1, true), (5, 1, true), (0, 0, true)] {
            assert_eq!(spent(used, limit), expected, "{used} of {limit}");
        }
    }

    #[tokio::test]
    async fn a_metered_stream_counts_both_ways_and_is_cut_past_the_budget() {
        let (mut sandbox, mut proxy_side) = tokio::io::duplex(1 << 16);
        let meter = Meter::default();
        let budget = Budget::new(10);
        let mut metered = Metered {
            inner: &mut proxy_side,
            meter: &meter,
            budget: &budget,
        };
        sandbox.write_all(b"12345678").await.expect("sent");
        let mut got = [0u8; 8];
        metered.read_exact(&mut got).await.expect("read");
        metered.write_all(b"abc").await.expect("written");
        assert_eq!((meter.bytes_out(), meter.bytes_in()), (8, 3));
        assert!(!meter.was_cut());
        // 11 of 10 bytes: the next read and write are refused, and the cut is noted.
        sandbox.write_all(b"more").await.expect("sent");
        assert!(metered.read(&mut got).await.is_err());
        assert!(metered.write_all(b"x").await.is_err());
        assert!(meter.was_cut());
        assert_eq!((meter.bytes_out(), meter.bytes_in()), (8, 3));
    }
}

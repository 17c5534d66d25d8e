//! Time as a trait, so the engine's deadlines run on a controllable clock in tests.

use std::time::Duration;

use async_trait::async_trait;
use jiff::Timestamp;

/// The current time and waiting.
#[async_trait]
pub trait Clock: Send + Sync {
    /// Now.
    fn now(&self) -> Timestamp;
    /// Wait for `duration` to pass on this clock.
    async fn sleep(&self, duration: Duration);
    /// Wait until this clock reads `at` or later (at once when it does already).
    async fn sleep_until(&self, at: Timestamp) {
        let left = at.duration_since(self.now());
        if let Ok(left) = Duration::try_from(left)
            && !left.is_zero()
        {
            self.sleep(left).await;
        }
    }
}

/// The system's wall clock and tokio's timer.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

#[async_trait]
impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        Timestamp::now()
    }

    async fn sleep(&self, duration: Duration) {
        tokio::time::sleep(duration).await;
    }
}

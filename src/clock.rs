//! Where every stored timestamp comes from (leases, commit and finish
//! times, idempotency claims, delivery schedules, purge cutoffs): the wall
//! clock in production. In tests, either a clock that follows tokio's
//! time (unit tests without I/O, under `tokio::time::pause()` and
//! `advance()`), or the wall clock shifted by what the test advances it
//! (a gateway over real I/O: retention, TTL and leases come due when the
//! test says, not after a sleep).

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

/// RFC 3339 with milliseconds, UTC: how every timestamp is written.
pub use crate::store::convert::rfc3339;
pub(crate) use mongodb::bson::DateTime;

#[derive(Clone, Debug, Default)]
pub enum Clock {
    /// The system's wall clock.
    #[default]
    System,
    /// The wall-clock time at creation, advanced by tokio's time since.
    Tokio { base_ms: i64, start: tokio::time::Instant },
    /// The wall clock, moved on by the milliseconds [`Clock::advance`]
    /// added (shared by every clone).
    Shifted(Arc<AtomicI64>),
}

impl Clock {
    /// A clock that moves with tokio's (pausable) time.
    pub fn following_tokio() -> Self {
        Clock::Tokio { base_ms: DateTime::now().timestamp_millis(), start: tokio::time::Instant::now() }
    }

    /// The wall clock, to be moved on by [`Clock::advance`].
    pub fn shifted() -> Self {
        Clock::Shifted(Arc::new(AtomicI64::new(0)))
    }

    /// Move a shifted clock (and its clones) on by `by`; `false`, leaving
    /// it as it is, for any other clock.
    pub fn advance(&self, by: Duration) -> bool {
        let Clock::Shifted(offset) = self else { return false };
        offset.fetch_add(i64::try_from(by.as_millis()).unwrap_or(i64::MAX), Ordering::SeqCst);
        true
    }

    /// The current time, with millisecond precision (what both stores keep).
    pub fn now(&self) -> DateTime {
        match self {
            Clock::System => DateTime::now(),
            Clock::Shifted(offset) => {
                DateTime::from_millis(DateTime::now().timestamp_millis().saturating_add(offset.load(Ordering::SeqCst)))
            }
            Clock::Tokio { base_ms, start } => {
                let elapsed = i64::try_from(start.elapsed().as_millis()).unwrap_or(i64::MAX);
                DateTime::from_millis(base_ms.saturating_add(elapsed))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_tokio_clock_moves_only_with_tokio_time() {
        let clock = Clock::following_tokio();
        let t0 = clock.now();
        tokio::time::advance(Duration::from_millis(1500)).await;
        assert_eq!(clock.now().timestamp_millis() - t0.timestamp_millis(), 1500);
    }
}

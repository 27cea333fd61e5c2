//! Where every stored timestamp comes from (leases, commit and finish
//! times, idempotency claims, delivery schedules, purge cutoffs): the wall
//! clock in production; in tests, a clock that follows tokio's time, so
//! lease, expiry and backoff arithmetic runs under `tokio::time::pause()`
//! and `advance()` instead of sleeping.

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
}

impl Clock {
    /// A clock that moves with tokio's (pausable) time.
    pub fn following_tokio() -> Self {
        Clock::Tokio { base_ms: DateTime::now().timestamp_millis(), start: tokio::time::Instant::now() }
    }

    /// The current time, with millisecond precision (what both stores keep).
    pub fn now(&self) -> DateTime {
        match self {
            Clock::System => DateTime::now(),
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

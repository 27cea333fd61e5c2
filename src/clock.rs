//! Where every stored timestamp comes from (leases, commit and finish
//! times, idempotency claims, delivery schedules, purge cutoffs): the wall
//! clock in production; in tests, a clock that follows tokio's time, so
//! lease, expiry and backoff arithmetic runs under `tokio::time::pause()`
//! and `advance()` instead of sleeping.

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

/// RFC 3339 with milliseconds, UTC (`2026-01-02T03:04:05.678Z`).
pub fn rfc3339(dt: DateTime) -> String {
    let Ok(t) = time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(dt.timestamp_millis()) * 1_000_000) else {
        return dt.timestamp_millis().to_string();
    };
    let Ok(year) = u32::try_from(t.year()) else { return formatted(t, dt) };
    if year > 9999 {
        return formatted(t, dt);
    }
    // Every response carries two of these per document: the digits are
    // placed directly rather than through a format description.
    let mut out = *b"0000-00-00T00:00:00.000Z";
    let mut put = |at: usize, width: usize, mut n: u32| {
        for i in (at..at + width).rev() {
            out[i] = b'0' + (n % 10) as u8;
            n /= 10;
        }
    };
    put(0, 4, year);
    put(5, 2, u32::from(u8::from(t.month())));
    put(8, 2, u32::from(t.day()));
    put(11, 2, u32::from(t.hour()));
    put(14, 2, u32::from(t.minute()));
    put(17, 2, u32::from(t.second()));
    put(20, 3, u32::from(t.millisecond()));
    String::from_utf8_lossy(&out).into_owned()
}

/// [`rfc3339`] of a year outside 0..=9999, through `time`'s formatter.
fn formatted(t: time::OffsetDateTime, dt: DateTime) -> String {
    const FORMAT: &[time::format_description::FormatItem<'static>] =
        time::macros::format_description!("[year]-[month]-[day]T[hour]:[minute]:[second].[subsecond digits:3]Z");
    t.format(FORMAT).unwrap_or_else(|_| dt.timestamp_millis().to_string())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn timestamps_are_written_as_the_format_description_writes_them() {
        let mut ms: i64 = -62_135_596_800_000; // 0001-01-01
        let step = 9_876_543_210_987;
        while ms < 253_402_300_799_999 {
            let t = time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000).unwrap();
            assert_eq!(rfc3339(DateTime::from_millis(ms)), formatted(t, DateTime::from_millis(ms)), "{ms}");
            ms += step;
        }
        assert_eq!(rfc3339(DateTime::from_millis(0)), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339(DateTime::from_millis(253_402_300_799_999)), "9999-12-31T23:59:59.999Z");
        assert_eq!(rfc3339(DateTime::from_millis(-1)), "1969-12-31T23:59:59.999Z");
    }

    #[tokio::test(start_paused = true)]
    async fn a_tokio_clock_moves_only_with_tokio_time() {
        let clock = Clock::following_tokio();
        let t0 = clock.now();
        tokio::time::advance(Duration::from_millis(1500)).await;
        assert_eq!(clock.now().timestamp_millis() - t0.timestamp_millis(), 1500);
    }
}

//! A store layer that tells this process's log readers when an append to
//! the event log has landed, so that streams wake at once instead of
//! polling (appends by other instances are found by a stream's poll).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::sync::watch;

use crate::store::DynStore;
use crate::store::layer::{Layer, Layered};

use super::EVENTS;

/// The layer that wakes this process's log readers.
pub struct Tap {
    appended: watch::Sender<u64>,
    /// Events appended through this layer (`txgate_events_written_total`).
    written: Arc<AtomicU64>,
}

impl Tap {
    pub fn over(inner: DynStore, appended: watch::Sender<u64>, written: Arc<AtomicU64>) -> Layered<Self> {
        Layered::new(inner, Self { appended, written })
    }
}

impl Layer for Tap {
    /// The log changed: readers wake, and the appends are counted.
    fn after_write(&self, landed: &[(&str, &'static str)]) {
        let log = landed.iter().filter(|(coll, _)| *coll == EVENTS);
        let (mut touched, mut appended) = (false, 0u64);
        for (_, kind) in log {
            touched = true;
            appended += u64::from(*kind == "append");
        }
        if touched {
            self.written.fetch_add(appended, Ordering::Relaxed);
            self.appended.send_modify(|n| *n = n.wrapping_add(1));
        }
    }
}

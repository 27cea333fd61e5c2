//! A store layer that tells this process's log readers when an append to
//! the event log has landed, so that streams wake at once instead of
//! polling (appends by other instances are found by a stream's poll).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::sync::watch;

use crate::store::DynStore;
use crate::store::layer::{Layer, Layered};

use super::EVENTS;

/// The layer that wakes this process's log readers; its clones share one
/// channel, so the log ([`super::Log`]) holds one and the store stack
/// another.
#[derive(Clone)]
pub struct Tap {
    appended: watch::Sender<u64>,
    /// Events appended through this layer (`txgate_events_written_total`).
    written: Arc<AtomicU64>,
}

impl Default for Tap {
    fn default() -> Self {
        Self { appended: watch::Sender::new(0), written: Arc::default() }
    }
}

impl Tap {
    /// This tap over the store `inner`.
    pub fn over(&self, inner: DynStore) -> Layered<Self> {
        Layered::new(inner, self.clone())
    }

    /// A receiver that changes whenever an append landed through the tap.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.appended.subscribe()
    }

    /// Events appended through the tap so far.
    pub fn written(&self) -> u64 {
        self.written.load(Ordering::Relaxed)
    }
}

impl Layer for Tap {
    /// The log changed: readers wake, and the appends are counted.
    fn after_write(&self, landed: &[(&str, crate::store::WriteKind)]) {
        let log = landed.iter().filter(|(coll, _)| *coll == EVENTS);
        let (mut touched, mut appended) = (false, 0u64);
        for (_, kind) in log {
            touched = true;
            appended += u64::from(*kind == crate::store::WriteKind::Append);
        }
        if touched {
            self.written.fetch_add(appended, Ordering::Relaxed);
            self.appended.send_modify(|n| *n = n.wrapping_add(1));
        }
    }
}

//! Process-wide counters and latency summaries, kept in memory and labelled
//! the way the Prometheus exposition names them (`txgate_*`).

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

/// A metric name and its label value.
type Key = (&'static str, String);

/// Counters keyed by `(name, label value)`.
#[derive(Default)]
pub struct Metrics {
    counters: Mutex<BTreeMap<Key, u64>>,
    /// Sum and count of observed durations, in seconds, per `(name, label)`.
    timings: Mutex<BTreeMap<Key, (f64, u64)>>,
}

impl Metrics {
    pub fn incr(&self, name: &'static str, label: &str) {
        self.add(name, label, 1);
    }

    pub fn add(&self, name: &'static str, label: &str, n: u64) {
        *self.counters.lock().expect("metrics").entry((name, label.to_owned())).or_default() += n;
    }

    pub fn observe(&self, name: &'static str, label: &str, duration: Duration) {
        let mut timings = self.timings.lock().expect("metrics");
        let entry = timings.entry((name, label.to_owned())).or_default();
        entry.0 += duration.as_secs_f64();
        entry.1 += 1;
    }

    pub fn get(&self, name: &'static str, label: &str) -> u64 {
        self.counters.lock().expect("metrics").get(&(name, label.to_owned())).copied().unwrap_or(0)
    }

    pub fn aborted(&self, reason: &str) {
        self.incr("txgate_transactions_aborted_total", reason);
    }

    pub fn recovery_action(&self, kind: &str) {
        self.incr("txgate_recovery_actions_total", kind);
    }

    /// Every counter, for exposition and tests.
    pub fn snapshot(&self) -> Vec<(String, String, u64)> {
        self.counters.lock().expect("metrics").iter().map(|((n, l), v)| ((*n).to_owned(), l.clone(), *v)).collect()
    }

    pub fn timings(&self) -> Vec<(String, String, f64, u64)> {
        self.timings
            .lock()
            .expect("metrics")
            .iter()
            .map(|((n, l), (sum, count))| ((*n).to_owned(), l.clone(), *sum, *count))
            .collect()
    }
}

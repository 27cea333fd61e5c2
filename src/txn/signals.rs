//! In-process shortcuts for the protocol's waits. Everything here only
//! speeds things up: the store stays the single source of truth, and every
//! wait still polls it, so a missed signal (or a transaction run by another
//! instance) costs at most one poll interval.
//!
//! - A transaction wounded by another one in this process learns it at
//!   once, instead of at its next read of its own record.
//! - Whoever waits for a document's lock wakes as soon as this process
//!   releases it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

#[derive(Default)]
pub(crate) struct Signals {
    /// Transactions running in this process: id → their "wounded" token.
    running: Mutex<HashMap<String, CancellationToken>>,
    /// Documents someone here waits on: (collection, id) → wake-up.
    waiting: Mutex<HashMap<(String, String), Arc<Notify>>>,
}

/// Unregisters a running transaction when dropped.
pub(crate) struct Running<'a> {
    signals: &'a Signals,
    txn: String,
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.signals.running.lock().expect("running set").remove(&self.txn);
    }
}

impl Signals {
    /// Register `txn` as running here, with the token that stops it.
    pub(crate) fn run(&self, txn: &str, wounded: CancellationToken) -> Running<'_> {
        self.running.lock().expect("running set").insert(txn.to_owned(), wounded);
        Running { signals: self, txn: txn.to_owned() }
    }

    /// `txn` was aborted: stop it now if it runs here.
    pub(crate) fn aborted(&self, txn: &str) {
        if let Some(token) = self.running.lock().expect("running set").get(txn) {
            token.cancel();
        }
    }

    /// The lock on `(coll, id)` was released or applied: wake its waiters.
    pub(crate) fn released(&self, coll: &str, id: &str) {
        let key = (coll.to_owned(), id.to_owned());
        if let Some(notify) = self.waiting.lock().expect("waiting set").remove(&key) {
            notify.notify_waiters();
        }
    }

    /// Wait until `(coll, id)` is released here or `timeout` passes.
    pub(crate) async fn wait_release(&self, coll: &str, id: &str, timeout: Duration) {
        let key = (coll.to_owned(), id.to_owned());
        let notify = Arc::clone(self.waiting.lock().expect("waiting set").entry(key.clone()).or_default());
        let _ = tokio::time::timeout(timeout, notify.notified()).await;
        // The last waiter drops an entry nobody released (a holder in another
        // instance), so the map does not grow.
        let mut waiting = self.waiting.lock().expect("waiting set");
        if waiting.get(&key).is_some_and(|n| Arc::ptr_eq(n, &notify) && Arc::strong_count(n) == 2) {
            waiting.remove(&key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_release_wakes_the_waiter_before_its_timeout() {
        let signals = Arc::new(Signals::default());
        let s = Arc::clone(&signals);
        let waiter = tokio::spawn(async move {
            let started = std::time::Instant::now();
            s.wait_release("c", "a", Duration::from_secs(10)).await;
            started.elapsed()
        });
        // Let the waiter register, then release.
        while signals.waiting.lock().unwrap().is_empty() {
            tokio::task::yield_now().await;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
        signals.released("c", "a");
        let waited = waiter.await.unwrap();
        assert!(waited < Duration::from_secs(5), "woken after {waited:?}");
        assert!(signals.waiting.lock().unwrap().is_empty());
    }

    #[tokio::test]
    async fn a_timed_out_wait_leaves_nothing_behind() {
        let signals = Signals::default();
        signals.wait_release("c", "a", Duration::from_millis(1)).await;
        assert!(signals.waiting.lock().unwrap().is_empty());
    }

    #[test]
    fn an_abort_cancels_a_running_transaction_until_it_ends() {
        let signals = Signals::default();
        let token = CancellationToken::new();
        {
            let _running = signals.run("t1", token.clone());
            signals.aborted("t2");
            assert!(!token.is_cancelled());
            signals.aborted("t1");
            assert!(token.is_cancelled());
        }
        assert!(signals.running.lock().unwrap().is_empty());
    }
}

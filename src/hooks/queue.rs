//! The sender's schedule in this process: which deliveries fall due when.
//! It is only a hint: a delivery is sent after a claim on its record in the
//! store succeeds, so a stale or duplicate entry costs one failed claim, and
//! work this process never heard of (other instances, restarts) reaches it
//! through the sender's periodic scan of the store.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::sync::Mutex;

use tokio::sync::Notify;

/// Most entries kept. Beyond, new entries are dropped: the periodic scan of
/// the store finds them when they fall due, so a long outage of a receiver
/// cannot grow this without bound.
const MAX_ENTRIES: usize = 100_000;

#[derive(Default)]
pub struct Queue {
    inner: Mutex<Inner>,
    /// Woken when an entry due earlier than any before is added.
    pub changed: Notify,
}

#[derive(Default)]
struct Inner {
    /// (due at, in ms since the epoch; delivery id), earliest first.
    heap: BinaryHeap<Reverse<(i64, String)>>,
    /// The due time each queued id was last scheduled for.
    due: HashMap<String, i64>,
}

impl Queue {
    /// Schedule `id` at `at_ms` (an earlier time replaces a later one).
    pub fn push(&self, id: &str, at_ms: i64) {
        let mut inner = self.inner.lock().expect("delivery queue");
        if inner.due.get(id).is_some_and(|&t| t <= at_ms) {
            return;
        }
        if inner.due.len() >= MAX_ENTRIES && !inner.due.contains_key(id) {
            return;
        }
        let earliest = inner.heap.peek().map(|Reverse((t, _))| *t);
        inner.due.insert(id.to_owned(), at_ms);
        inner.heap.push(Reverse((at_ms, id.to_owned())));
        drop(inner);
        if earliest.is_none_or(|t| at_ms < t) {
            self.changed.notify_one();
        }
    }

    /// Take up to `max` ids due at `now_ms`, earliest first.
    pub fn pop_due(&self, now_ms: i64, max: usize) -> Vec<String> {
        let mut inner = self.inner.lock().expect("delivery queue");
        let mut out = Vec::new();
        while out.len() < max {
            match inner.heap.peek() {
                Some(Reverse((t, _))) if *t <= now_ms => {}
                _ => break,
            }
            let Reverse((t, id)) = inner.heap.pop().expect("peeked");
            // Skip entries superseded by an earlier schedule of the same id.
            if inner.due.get(&id) == Some(&t) {
                inner.due.remove(&id);
                out.push(id);
            }
        }
        out
    }

    /// When the earliest queued entry falls due.
    pub fn next_due(&self) -> Option<i64> {
        self.inner.lock().expect("delivery queue").heap.peek().map(|Reverse((t, _))| *t)
    }

    pub fn len(&self) -> usize {
        self.inner.lock().expect("delivery queue").due.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pops_in_due_order_once_each() {
        let q = Queue::default();
        q.push("b", 20);
        q.push("a", 10);
        q.push("c", 30);
        q.push("c", 5); // rescheduled earlier
        q.push("a", 50); // a later time does not move it
        assert_eq!(q.next_due(), Some(5));
        assert_eq!(q.pop_due(20, 10), vec!["c", "a", "b"]);
        assert!(q.pop_due(100, 10).is_empty(), "the stale entry for c is dropped");
        assert!(q.is_empty());
    }

    #[test]
    fn stays_bounded() {
        let q = Queue::default();
        for i in 0..MAX_ENTRIES + 10 {
            q.push(&i.to_string(), i as i64);
        }
        assert_eq!(q.len(), MAX_ENTRIES);
        q.push("0", -1); // a queued id may still move earlier
        assert_eq!(q.next_due(), Some(-1));
    }

    #[test]
    fn pops_at_most_max_and_only_what_is_due() {
        let q = Queue::default();
        for (i, id) in ["a", "b", "c"].iter().enumerate() {
            q.push(id, i as i64);
        }
        q.push("later", 1_000);
        assert_eq!(q.pop_due(10, 2), vec!["a", "b"]);
        assert_eq!(q.pop_due(10, 2), vec!["c"]);
        assert_eq!(q.len(), 1);
        assert_eq!(q.next_due(), Some(1_000));
    }
}

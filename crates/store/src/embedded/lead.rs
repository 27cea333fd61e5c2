//! Who runs the writer: the request that finds it idle, or the writer's
//! own thread.
//!
//! There is one [`Writer`] and one queue. A write that finds the queue
//! empty and the writer idle takes the writer and commits its batch on
//! its own thread (the leader), then puts the writer back: no other
//! thread is woken on the path of a write that meets no other, which on
//! a small machine costs as much processor time as the commit itself
//! (docs/decisions.md, "The writer's shape, measured"). Writes that come
//! while the writer is taken wait in the queue; the leader takes them into
//! its batch (group commit) while it applies it. What it leaves queued,
//! work that takes long or must stand alone (index changes, snapshots,
//! checkpoints, closing) and the writer's timed work (a sync once the
//! interval has passed, a checkpoint, a seal once idle) go to the
//! background thread, which runs the writer the same way until the queue
//! is empty. So one batch at most runs on a request's thread, and the
//! writer's state is only ever touched by whoever holds it.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Instant;

use super::writer::{Queued, Writer, stop};
use crate::StoreError;

/// How long the background thread keeps the writer after serving queued
/// writes, before a write may run it on its own thread again. Under
/// concurrent writes the background thread batches them while the
/// requests' threads serve HTTP; a request that led would sit in the
/// sync (measured: the contended bank lost a third of its throughput
/// with requests leading, docs/decisions.md).
const LINGER: std::time::Duration = std::time::Duration::from_millis(1);

/// The writer, its queue, and the background thread's bell.
pub(super) struct Lead {
    state: Mutex<State>,
    bell: Condvar,
}

struct State {
    queue: VecDeque<Queued>,
    /// The writer, while no one runs it.
    writer: Option<Box<Writer>>,
    /// The background thread takes the writer next: a write that does
    /// not wait for it takes it no more.
    background: bool,
    /// When the writer has work of its own next, as of when it was put
    /// back ([`Writer::due`]).
    due: Option<Instant>,
    /// The background thread waits, until then (`Some(None)`: until rung).
    waiting: Option<Option<Instant>>,
    /// The background thread keeps the writer until then: writes met
    /// others lately, and a request's thread blocked in a sync would be
    /// one less to serve them (see [`LINGER`]).
    lingering: Option<Instant>,
    /// Every handle to the store is gone: finish what is queued and close.
    closing: bool,
    /// The writer closed or stopped: nothing more is taken.
    stopped: bool,
}

impl Lead {
    pub(super) fn new(writer: Writer) -> Arc<Self> {
        let due = writer.due();
        Arc::new(Self {
            state: Mutex::new(State {
                queue: VecDeque::new(),
                writer: Some(Box::new(writer)),
                background: false,
                due,
                waiting: None,
                lingering: None,
                closing: false,
                stopped: false,
            }),
            bell: Condvar::new(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Queue `item`, and commit its batch on this thread if the writer is
    /// idle. Refused once the writer has stopped.
    pub(super) fn submit(&self, item: Queued) -> Result<(), StoreError> {
        let mut state = self.lock();
        if state.stopped {
            return Err(StoreError::Unavailable("embedded writer stopped".into()));
        }
        let alone = item.is_schema();
        state.queue.push_back(item);
        if alone || state.background || state.lingering.is_some() || state.closing {
            state.background = true;
            self.bell.notify_one();
            return Ok(());
        }
        let Some(writer) = state.writer.take() else { return Ok(()) };
        let first = state.queue.pop_front().expect("the item just queued");
        drop(state);
        or_stop(|| self.lead(writer, first));
        Ok(())
    }

    /// One batch, `first` and what comes meanwhile, then the writer put
    /// back (or handed to the background thread).
    fn lead(&self, mut writer: Box<Writer>, first: Queued) {
        writer.commit(first, &|| self.more());
        self.put_back(writer);
    }

    /// The next queued item if it can join a batch.
    fn more(&self) -> Option<Queued> {
        let mut state = self.lock();
        if state.queue.front().is_some_and(|item| !item.is_schema()) { state.queue.pop_front() } else { None }
    }

    /// Put the writer back, for the background thread if work is left
    /// (something queued, its own work due) or the store closes.
    fn put_back(&self, writer: Box<Writer>) {
        let due = writer.due();
        let mut state = self.lock();
        state.due = due;
        state.writer = Some(writer);
        let now = Instant::now();
        if state.closing || !state.queue.is_empty() || due.is_some_and(|at| at <= now) {
            state.background = true;
        }
        let sooner = match state.waiting {
            Some(None) => due.is_some(),
            Some(Some(until)) => due.is_some_and(|at| at < until),
            None => false,
        };
        if state.background || sooner {
            self.bell.notify_one();
        }
    }

    /// Every handle is gone: the background thread finishes what is
    /// queued, checkpoints and stops.
    pub(super) fn close(&self) {
        self.lock().closing = true;
        self.bell.notify_one();
    }

    /// The background thread: run the writer whenever it is handed over,
    /// its own work is due, or the store closes.
    pub(super) fn run(&self) {
        loop {
            let (mut writer, idle) = {
                let mut state = self.lock();
                loop {
                    if state.writer.is_some() {
                        let now = Instant::now();
                        if state.background || state.closing || state.due.is_some_and(|at| at <= now) {
                            state.background = false;
                            break (state.writer.take().expect("the writer"), state.queue.is_empty());
                        }
                        if state.lingering.is_some_and(|until| until <= now) {
                            state.lingering = None;
                        }
                        let until = [state.due, state.lingering].into_iter().flatten().min();
                        state.waiting = Some(until);
                        state = match until {
                            Some(at) => match self.bell.wait_timeout(state, at - now) {
                                Ok((state, _)) => state,
                                Err(poisoned) => poisoned.into_inner().0,
                            },
                            None => self.bell.wait(state).unwrap_or_else(std::sync::PoisonError::into_inner),
                        };
                    } else {
                        // A request runs it: told when it is put back.
                        state.waiting = Some(None);
                        state = self.bell.wait(state).unwrap_or_else(std::sync::PoisonError::into_inner);
                    }
                    state.waiting = None;
                }
            };
            writer.tick(idle);
            let mut served = false;
            // Everything queued, in order.
            loop {
                let item = {
                    let mut state = self.lock();
                    match state.queue.pop_front() {
                        Some(item) => item,
                        None if state.closing => {
                            state.stopped = true;
                            drop(state);
                            writer.close();
                            return;
                        }
                        None => {
                            state.due = writer.due();
                            state.writer = Some(writer);
                            if served {
                                state.lingering = Some(Instant::now() + LINGER);
                            }
                            break;
                        }
                    }
                };
                if item.is_schema() {
                    if writer.alone(item) {
                        // Closed: whatever is queued after it is refused.
                        let mut state = self.lock();
                        state.stopped = true;
                        state.queue.clear();
                        return;
                    }
                } else {
                    writer.commit(item, &|| self.more());
                    served = true;
                }
                writer.tick(false);
            }
        }
    }
}

/// Run `f` (the writer's work): a panic there leaves no writer behind a
/// store that still reads, so the process stops, and the next start
/// recovers.
pub(super) fn or_stop(f: impl FnOnce()) {
    if let Err(panic) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        let what = panic
            .downcast_ref::<&str>()
            .map(|s| (*s).to_owned())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_default();
        stop(&StoreError::Internal(format!("the writer panicked: {what}")));
    }
}

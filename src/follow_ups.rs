//! Work a request leaves for after its answer (docs/design.md §3): a
//! transaction's roll-forward, a single write's event on its way from the
//! outbox to the log, a stored idempotency outcome. All of it is already
//! durable through the transaction record or the outbox, so a crash loses
//! none of it (recovery does it instead); what it changes is what readers
//! of the event log and of collection counts see, a few round trips after
//! the answer.
//!
//! So that a client reading events or counts right after an answer from
//! this instance sees its own write, such work is *settled*: a reader of
//! the log first waits (bounded) for every settled follow-up started
//! before it began. Another instance sees the event once it is published.

use std::collections::BTreeSet;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{Notify, OwnedRwLockReadGuard, OwnedRwLockWriteGuard, RwLock};
use tokio_util::task::TaskTracker;

/// The longest a reader waits for follow-ups before it reads anyway (a
/// store that hangs must not hang readers with it).
pub(crate) const SETTLE_WAIT: Duration = Duration::from_secs(2);

/// The longest a quiet read waits for this instance's writes under way to
/// finish (new ones wait meanwhile) before it reads anyway. A store slowed
/// down (a loaded server) can take a second or more to land a transaction
/// and its roll-forward; past this wait the read's position is a lower
/// bound.
pub(crate) const QUIET_WAIT: Duration = Duration::from_secs(5);

/// The follow-ups of one gateway: spawned on one tracker (shutdown waits
/// for all of it), the settled ones ticketed. Clones share both.
#[derive(Clone, Default)]
pub(crate) struct FollowUps {
    tasks: TaskTracker,
    running: Arc<Running>,
    tickets: Arc<Tickets>,
    /// Held shared by each of this instance's writes from before it
    /// changes what a reader sees until its follow-ups are ticketed;
    /// taken whole by a read that must see none land ([`Self::quiesce`]).
    gate: Arc<RwLock<()>>,
}

/// A write of this instance under way ([`FollowUps::writing`]).
pub(crate) type Writing = OwnedRwLockReadGuard<()>;

/// No write of this instance under way or starting, and every settled
/// follow-up finished, while held ([`FollowUps::quiesce`]).
pub(crate) type Quiet = OwnedRwLockWriteGuard<()>;

/// How many follow-ups are under way, and a wake-up when one ends: what
/// [`FollowUps::idle`] waits on. (Not the tracker's own count: a task
/// leaves it only after its future is dropped, after any wake-up sent from
/// inside it.)
#[derive(Default)]
struct Running {
    count: std::sync::atomic::AtomicUsize,
    ended: Notify,
}

/// One follow-up under way; counted until dropped (finished, failed or
/// cancelled alike).
struct Underway(Arc<Running>);

impl Underway {
    fn start(running: &Arc<Running>) -> Self {
        running.count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Self(Arc::clone(running))
    }
}

impl Drop for Underway {
    fn drop(&mut self) {
        self.0.count.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
        self.0.ended.notify_waiters();
    }
}

#[derive(Default)]
struct Tickets {
    state: Mutex<State>,
    /// Wakes settling readers when a ticket is returned.
    returned: Notify,
}

#[derive(Default)]
struct State {
    /// The number the next ticket gets.
    next: u64,
    /// Tickets out: settled follow-ups not finished.
    out: BTreeSet<u64>,
}

/// A settled follow-up under way; returned when dropped (finished,
/// failed or cancelled alike).
pub(crate) struct Ticket {
    n: u64,
    tickets: Arc<Tickets>,
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.tickets.state.lock().expect("follow-up tickets").out.remove(&self.n);
        self.tickets.returned.notify_waiters();
    }
}

impl FollowUps {
    /// Every follow-up, settled or not: closed and waited for at shutdown
    /// (spawned through [`Self::spawn`] and [`Self::spawn_settled`] only).
    pub(crate) fn tasks(&self) -> &TaskTracker {
        &self.tasks
    }

    /// Work that changes nothing readers of the log wait for (a
    /// roll-back, a stored outcome, a request that outlives its
    /// connection).
    pub(crate) fn spawn<F>(&self, work: F) -> tokio::task::JoinHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        use futures::FutureExt as _;
        // Counted until the work ends (or is dropped, cancelled).
        let underway = Underway::start(&self.running);
        self.tasks.spawn(work.map(move |out| {
            drop(underway);
            out
        }))
    }

    /// Work that puts events in the log: readers of this instance settle
    /// it before they read.
    pub(crate) fn spawn_settled<F>(&self, work: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let ticket = self.ticket();
        self.spawn(async move {
            work.await;
            drop(ticket);
        });
    }

    /// Until no follow-up of this instance is under way, however it was
    /// spawned ([`Self::spawn`], [`Self::spawn_settled`]): what a test
    /// waits for before it reads what an answer left behind.
    pub(crate) async fn idle(&self) {
        let running = &self.running;
        crate::wake::until(&running.ended, || running.count.load(std::sync::atomic::Ordering::SeqCst) == 0).await;
    }

    /// A ticket for settled work that runs in a task spawned earlier (a
    /// queue's drain): readers settle it until it is dropped.
    pub(crate) fn ticket(&self) -> Ticket {
        let mut state = self.tickets.state.lock().expect("follow-up tickets");
        let n = state.next;
        state.next += 1;
        state.out.insert(n);
        Ticket { n, tickets: Arc::clone(&self.tickets) }
    }

    /// Hold while writing: from before a write changes what readers see
    /// until its follow-ups, if any, are ticketed. Never taken twice by
    /// one task (a read waiting to quiesce queues new writers behind it).
    pub(crate) async fn writing(&self) -> Writing {
        Arc::clone(&self.gate).read_owned().await
    }

    /// Wait (at most `max` in all) until no write of this instance is
    /// under way and every settled follow-up has finished, and keep new
    /// writes from starting while the answer is held: a read made then
    /// sees nothing this instance writes land. `None` when that took
    /// longer (writers wait meanwhile, so the wait is short).
    pub(crate) async fn quiesce(&self, max: Duration) -> Option<Quiet> {
        let deadline = tokio::time::Instant::now() + max;
        let quiet = tokio::time::timeout_at(deadline, Arc::clone(&self.gate).write_owned()).await.ok()?;
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        self.settle(left).await.then_some(quiet)
    }

    /// Wait until every settled follow-up started before this call has
    /// finished, or `max` has passed. `true` when they all finished.
    pub(crate) async fn settle(&self, max: Duration) -> bool {
        let tickets = &self.tickets;
        let upto = tickets.state.lock().expect("follow-up tickets").next;
        let deadline = tokio::time::Instant::now() + max;
        loop {
            let returned = tickets.returned.notified();
            tokio::pin!(returned);
            returned.as_mut().enable();
            let done = tickets.state.lock().expect("follow-up tickets").out.first().is_none_or(|first| *first >= upto);
            if done {
                return true;
            }
            if tokio::time::timeout_at(deadline, returned).await.is_err() {
                tracing::debug!("read without waiting longer for follow-ups of earlier answers");
                return false;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn quiet_waits_for_writes_under_way_and_holds_new_ones() {
        let follow_ups = FollowUps::default();
        let writing = follow_ups.writing().await;
        assert!(follow_ups.quiesce(Duration::from_millis(20)).await.is_none(), "a write is under way");
        drop(writing);
        let quiet = follow_ups.quiesce(Duration::from_millis(20)).await.expect("nothing under way");
        let started = follow_ups.clone();
        let next = tokio::spawn(async move { drop(started.writing().await) });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!next.is_finished(), "a write started while quiet");
        drop(quiet);
        next.await.unwrap();
        // A settled follow-up under way keeps it from being quiet.
        let ticket = follow_ups.ticket();
        assert!(follow_ups.quiesce(Duration::from_millis(20)).await.is_none());
        drop(ticket);
        assert!(follow_ups.quiesce(Duration::from_millis(20)).await.is_some());
    }

    #[tokio::test]
    async fn settling_waits_for_what_started_before_and_only_that() {
        let follow_ups = FollowUps::default();
        assert!(follow_ups.settle(Duration::from_millis(10)).await, "nothing under way");
        let (release_first, first) = tokio::sync::oneshot::channel::<()>();
        follow_ups.spawn_settled(async move {
            let _ = first.await;
        });
        assert!(!follow_ups.settle(Duration::from_millis(20)).await, "the first is under way");
        let settling = tokio::spawn({
            let follow_ups = follow_ups.clone();
            async move { follow_ups.settle(Duration::from_secs(10)).await }
        });
        tokio::time::sleep(Duration::from_millis(10)).await;
        // One started after the reader began is not waited for.
        let (_hold_second, second) = tokio::sync::oneshot::channel::<()>();
        follow_ups.spawn_settled(async move {
            let _ = second.await;
        });
        // Unsettled work is not waited for either.
        follow_ups.spawn(std::future::pending::<()>());
        assert!(!settling.is_finished());
        release_first.send(()).unwrap();
        assert!(settling.await.unwrap(), "settled once the first finished");
    }

    #[tokio::test]
    async fn a_cancelled_follow_up_returns_its_ticket() {
        let follow_ups = FollowUps::default();
        follow_ups.spawn_settled(async { panic!("a follow-up that fails") });
        assert!(follow_ups.settle(Duration::from_secs(5)).await);
    }
}

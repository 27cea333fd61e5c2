//! Reads of what a collection's index holds (queries and counts) at one
//! exact log position: in a snapshot where the store has them, otherwise
//! bracketed.
//!
//! The bracket:
//!
//! 1. the log's last position `H` is read once this instance's answered
//!    work is in place and every committed transaction over the
//!    collection is rolled forward (else `H` is capped below the first
//!    event of one still not rolled forward, and the read is only a lower
//!    bound: see [`Positioned::settled_position`]);
//! 2. the read is made;
//! 3. no document of the collection holds an unlogged event (an outbox),
//!    no committed transaction over it is still not rolled forward, and
//!    then no event of the collection is logged after `H`.
//!
//! Why 3 proves that no change after `H` is reflected: a change is made
//! before its event is logged. A single write's document keeps its event
//! in its outbox until the event is logged; a transaction's events are
//! logged before any of its locks is released, and it is rolled forward
//! (no longer "committed") only after. So a change the read reflected is,
//! at step 3, either still an outbox or an unapplied transaction, or
//! logged before the log's position is read again, hence after `H` only
//! if step 3 sees it. When step 3 fails (or `H` was capped) the read is
//! made again, up to [`EXACT_READS`] times. The last is made *quiet*
//! ([`crate::follow_ups::FollowUps::quiesce`]): no write of this instance
//! is under way or starts during it, and every follow-up of one is
//! finished, so only another instance's writes (or an expiry) can land
//! during it; it is not checked, and its `H` is a lower bound only when
//! they did.
//!
//! In a snapshot, the read is exact at the snapshot's last position once
//! no document of the collection holds an outbox there and no transaction
//! over it is committed, with events logged, but not rolled forward: a
//! transaction so found is finished and another snapshot taken (up to
//! [`SNAPSHOTS`]). A change logged at or before `H` is then in the
//! snapshot's records and index entries.

use super::{InSnapshot, Positioned, holds_outbox};
use crate::document::StagedOp;
use crate::documents::ReadAt;
use crate::events::Log;
use crate::events::model::document_event_id;
use crate::follow_ups::{QUIET_WAIT, Quiet, SETTLE_WAIT};
use crate::store::{DynStore, StoreError};
use crate::txn::record::TxnRecord;

/// Reads a page or count makes, at most, for an exact position (each
/// one after the first follows writes to the collection during the one
/// before).
const EXACT_READS: usize = 3;
/// Snapshots a page or count takes, at most, for one holding no
/// transaction over its collection between its events and its
/// roll-forward (each such one is finished before the next).
const SNAPSHOTS: usize = 5;
/// Events after a read's position looked at for one of its collection;
/// more means the collection changed.
const CHANGES_SCAN: usize = 128;

/// A read of a collection at one exact log position, driven by its
/// reader ([`Positioned::collection`]): read [`Self::at`], then ask
/// [`Self::stands`]; a read that does not stand is made again, at the
/// position the next try prepared.
pub(crate) struct Reading<'p> {
    positioned: &'p Positioned,
    coll: &'p str,
    at: ReadAt,
    position: u64,
    /// Where the read is bracketed (no snapshot): the try it is at.
    bracket: Option<Bracket>,
}

/// One try of a bracketed read.
struct Bracket {
    /// 1 for the first.
    attempt: usize,
    /// Whether its position is the log's last one (not capped).
    settled: bool,
    /// Held through the last try: this instance's writes held back.
    quiet: Option<Quiet>,
}

impl Positioned {
    /// A read of collection `coll` at one exact log position: in a
    /// snapshot where one is exact, else bracketed (module docs).
    pub(crate) async fn collection<'p>(&'p self, coll: &'p str) -> Result<Reading<'p>, StoreError> {
        let exact = self.in_snapshot(SNAPSHOTS, SETTLE_WAIT, |at, _, settled| exact_in(at, coll, settled)).await?;
        if let Some(((), snapshot, head)) = exact {
            return Ok(Reading { positioned: self, coll, at: ReadAt::Pinned(snapshot), position: head, bracket: None });
        }
        let bracket = Bracket { attempt: 0, settled: false, quiet: None };
        let mut reading = Reading { positioned: self, coll, at: ReadAt::Now, position: 0, bracket: Some(bracket) };
        reading.next_try().await?;
        Ok(reading)
    }

    /// Wait (bounded) for this instance's answered work to be in place and
    /// finish (bounded) any committed transaction over `coll` still not
    /// rolled forward (another instance's, or a roll-forward slower than
    /// the wait: a query sees a transaction's writes once its 200 is sent,
    /// whoever sent it), then learn the position a read of `coll` made now
    /// is at: the log's last position, capped below the first event of any
    /// committed transaction over `coll` still not rolled forward after
    /// [`EXACT_READS`] such rounds (its documents' index entries may not
    /// have moved: a page read now could miss a document that newly
    /// matches though its event is in the log). Every change at or before
    /// the position is reflected in what is read after.
    ///
    /// Also whether the position is the log's last one (not capped): only
    /// then can the read made after it be exact.
    async fn settled_position(&self, coll: &str) -> Result<(u64, bool), StoreError> {
        self.follow_ups.settle(SETTLE_WAIT).await;
        let store = self.documents.store();
        let mut round = 1;
        // The log's last position first, then the committed transactions
        // over `coll` not rolled forward yet (a transaction missed that way
        // committed after `head`: its events are past it).
        let (head, unapplied) = loop {
            let head = self.log.head().await?;
            let (unapplied, _) = Self::unapplied(store, coll).await?;
            if unapplied.is_empty() {
                return Ok((head, true));
            }
            if round == EXACT_READS || !self.finish(&unapplied, SETTLE_WAIT).await {
                break (head, unapplied);
            }
            round += 1;
        };
        let wanted: Vec<String> = unapplied.iter().filter_map(|rec| member_events(rec, coll)).flatten().collect();
        if wanted.is_empty() {
            return Ok((head, true));
        }
        // Their events are appended right after the commit: wait (bounded)
        // for those on their way.
        let deadline = tokio::time::Instant::now() + SETTLE_WAIT;
        loop {
            let found = self.log.positions_of(&wanted).await?;
            if found.len() == wanted.len() || tokio::time::Instant::now() >= deadline {
                let first = found.values().map(|(seq, _)| *seq).min();
                return Ok((first.map_or(head, |s| head.min(s.saturating_sub(1))), false));
            }
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    }

    /// Step 3 of the bracket (module docs): nothing the read after
    /// position `head` may have reflected is logged after `head`.
    async fn unchanged_since(&self, coll: &str, head: u64) -> Result<bool, StoreError> {
        let store = self.documents.store();
        if holds_outbox(store, coll).await? || !Self::unapplied(store, coll).await?.0.is_empty() {
            return Ok(false);
        }
        let now = self.log.head().await?;
        Ok(now == head || !self.log.changed(coll, head, now, CHANGES_SCAN).await?)
    }
}

impl Reading<'_> {
    /// Where to read.
    pub(crate) fn at(&self) -> &ReadAt {
        &self.at
    }

    /// The position a read made [`Self::at`] is at, once it stands.
    pub(crate) fn position(&self) -> u64 {
        self.position
    }

    /// After a read made [`Self::at`]: whether it stands, exact at
    /// [`Self::position`] (in a snapshot, always; bracketed, once step 3
    /// holds, or at the last of [`EXACT_READS`] tries). Otherwise the next
    /// try is prepared, and the read is to be made again.
    pub(crate) async fn stands(&mut self) -> Result<bool, StoreError> {
        let Some(bracket) = &self.bracket else { return Ok(true) };
        let last = bracket.attempt >= EXACT_READS;
        // A position capped below a transaction not rolled forward is
        // read again too, as one a write landed after.
        if last || (bracket.settled && self.positioned.unchanged_since(self.coll, self.position).await?) {
            if last && bracket.quiet.is_none() {
                tracing::debug!(collection = %self.coll, "a read's last try was made with this instance's writes going on: its position is a lower bound");
            }
            return Ok(true);
        }
        self.next_try().await?;
        Ok(false)
    }

    /// The next try of a bracketed read: its settled position, the last
    /// made with this instance's writes held back (writes that keep
    /// landing here cannot make every read inexact; another instance's
    /// still can).
    async fn next_try(&mut self) -> Result<(), StoreError> {
        let Some(bracket) = &mut self.bracket else { return Ok(()) };
        bracket.attempt += 1;
        bracket.quiet = None;
        if bracket.attempt == EXACT_READS {
            bracket.quiet = self.positioned.follow_ups.quiesce(QUIET_WAIT).await;
        }
        let (position, settled) = self.positioned.settled_position(self.coll).await?;
        bracket.settled = settled;
        self.position = position;
        Ok(())
    }
}

/// Whether a read of `coll` in snapshot `at` is exact at its last position
/// (module docs), given whether this instance's answered work was in place
/// before it was taken.
async fn exact_in(at: DynStore, coll: &str, settled: bool) -> Result<InSnapshot<()>, StoreError> {
    let at = at.as_ref();
    if holds_outbox(at, coll).await? {
        return Ok(InSnapshot::Elsewhere);
    }
    let (mut unapplied, complete) = Positioned::unapplied(at, coll).await?;
    if !complete {
        return Ok(InSnapshot::Elsewhere);
    }
    if settled && !unapplied.is_empty() {
        // Those with no event logged yet are shown as before them.
        let mut logged = Vec::with_capacity(unapplied.len());
        for rec in unapplied {
            let Some(events) = member_events(&rec, coll) else { return Ok(InSnapshot::Elsewhere) };
            if !Log::positions_in(at, &events).await?.is_empty() {
                logged.push(rec);
            }
        }
        unapplied = logged;
    }
    Ok(if unapplied.is_empty() { InSnapshot::Exact(()) } else { InSnapshot::Finish(unapplied) })
}

/// The event ids of the changes committed transaction `rec` made to
/// `coll`; `None` when the record does not say (no results).
fn member_events(rec: &TxnRecord, coll: &str) -> Option<Vec<String>> {
    let results = rec.results.as_ref()?;
    Some(
        rec.members
            .iter()
            .zip(results)
            .filter(|(member, _)| member.collection == coll && member.op != StagedOp::Check)
            .map(|(_, result)| document_event_id(coll, &result.id, result.version))
            .collect(),
    )
}

//! Reading at one exact position of the change-event log (docs/design.md
//! §7): the one service queries, counts and batch reads go through. A read
//! answered with a `position` reflects every change logged at or before it
//! and none after it.
//!
//! There are three ways to reach that, tried in this order:
//!
//! - **In a snapshot** ([`Positioned::in_snapshot`]), where the store has
//!   snapshots (the embedded store): what is read, and the log's last
//!   position `H`, are read in one, taken once this instance's answered
//!   work is in place. A record and the event of its change land in one
//!   commit (a single write's outbox exists only where they cannot), so
//!   every record of the snapshot is logged at or before `H`; a document
//!   held by a transaction whose events are not logged there shows its
//!   data from before its holder ([`crate::documents::ReadAt::Pinned`]).
//!   That holder was not answered before the read began, or the answered
//!   work would have been in place. What a snapshot cannot settle (an
//!   outbox, a transaction committed with its events logged but not rolled
//!   forward) is checked by the reader: such a transaction is finished
//!   here and another snapshot taken; an outbox sends the read to one of
//!   the other ways.
//! - **Bracketed**, for what a collection's index holds (queries and
//!   counts, [`Positioned::collection`]): `H` is read once this instance's
//!   answered work is in place and every committed transaction over the
//!   collection is rolled forward; the read is made; then no document of
//!   the collection holds an outbox, no committed transaction over it is
//!   still not rolled forward, and no event of the collection is logged
//!   after `H` (`collection.rs` says why that is exact).
//! - **Collected twice**, for named documents (batch reads,
//!   [`Positioned::members`]): each member's version is placed in the log
//!   and the members read again (`members.rs` says why that is exact).
//!
//! Both fallbacks try a bounded number of times, the last with this
//! instance's writes held back ([`FollowUps::quiesce`]), so only another
//! instance's writes can keep a read from being exact.

mod collection;
mod members;

use std::sync::Arc;
use std::time::Duration;

pub(crate) use self::collection::Reading;
pub(crate) use self::members::{MAX_MEMBERS, Member, ReadError};
use crate::document::StagedOp;
use crate::documents::Documents;
use crate::events::Log;
use crate::follow_ups::{FollowUps, SETTLE_WAIT};
use crate::store::scans::{DOCS_OUTBOX, TXNS_BY_COMMIT};
use crate::store::{Bound, Bson, DynStore, Store, StoreError};
use crate::txn::record::{Status, TXNS, TxnRecord};

/// Committed transactions not rolled forward a position considers at
/// most (they are rolled forward within moments of their commit).
const UNAPPLIED_SCAN: usize = 1000;

/// Reading at one exact log position.
pub struct Positioned {
    documents: Arc<Documents>,
    log: Arc<Log>,
    follow_ups: FollowUps,
    /// How long a named document's change may take to reach the log (a
    /// batch read waits that long for it).
    wait: Duration,
}

/// What a read made in a snapshot found ([`Positioned::in_snapshot`]).
pub(crate) enum InSnapshot<T> {
    /// The answer, exact at the snapshot's last position.
    Exact(T),
    /// Exact once these committed transactions, not rolled forward in the
    /// snapshot, are: they are finished, and another snapshot taken.
    Finish(Vec<TxnRecord>),
    /// Not exact in a snapshot (a change not logged in it): read another
    /// way.
    Elsewhere,
}

impl Positioned {
    pub(crate) fn new(documents: Arc<Documents>, log: Arc<Log>, follow_ups: FollowUps, wait: Duration) -> Self {
        Self { documents, log, follow_ups, wait }
    }

    /// Where the store has snapshots, `read` made in one (given the
    /// snapshot, its last log position, and whether this instance's
    /// answered work was in place before it was taken), with the snapshot
    /// and that position; up to `tries` snapshots, the transactions a read
    /// asks to be finished finished between them (each time within
    /// `finish_wait`). `None` where the store has none, where a read
    /// answered [`InSnapshot::Elsewhere`], or where no try was exact.
    pub(crate) async fn in_snapshot<T, E, Fut>(
        &self,
        tries: usize,
        finish_wait: Duration,
        mut read: impl FnMut(DynStore, u64, bool) -> Fut,
    ) -> Result<Option<(T, DynStore, u64)>, E>
    where
        Fut: Future<Output = Result<InSnapshot<T>, E>>,
        E: From<StoreError>,
    {
        let store = self.documents.store();
        if !store.capabilities().snapshots {
            return Ok(None);
        }
        // This instance's answered work in place: a transaction committed
        // in the snapshot whose events are not logged there was not answered
        // before the read began, and may be shown as before it.
        let settled = self.follow_ups.settle(SETTLE_WAIT).await;
        for attempt in 1..=tries {
            let Some(snapshot) = store.snapshot().await? else { return Ok(None) };
            let head = Log::head_in(snapshot.as_ref()).await?;
            match read(Arc::clone(&snapshot), head, settled).await? {
                InSnapshot::Exact(answer) => return Ok(Some((answer, snapshot, head))),
                InSnapshot::Elsewhere => return Ok(None),
                InSnapshot::Finish(_) if attempt == tries => return Ok(None),
                InSnapshot::Finish(mut unfinished) => {
                    unfinished.dedup_by(|a, b| a.id == b.id);
                    if !self.finish(&unfinished, finish_wait).await {
                        return Ok(None);
                    }
                }
            }
        }
        Ok(None)
    }

    /// Finish committed transactions `unapplied` (within `wait`): whether
    /// all of them were.
    async fn finish(&self, unapplied: &[TxnRecord], wait: Duration) -> bool {
        match self.documents.finish_committed(unapplied, wait).await {
            Ok(()) => true,
            Err(err) => {
                tracing::warn!(error = %err, "a read could not finish the committed transactions it met: read another way");
                false
            }
        }
    }

    /// Committed transactions not rolled forward yet that changed `coll`,
    /// read in `store`, and whether that is all of them: up to
    /// [`UNAPPLIED_SCAN`] of all such transactions are looked at, and a
    /// record that cannot be read is left out.
    async fn unapplied(store: &dyn Store, coll: &str) -> Result<(Vec<TxnRecord>, bool), StoreError> {
        let committed = || TXNS_BY_COMMIT.scan(vec![Status::Committed.to_bson()]);
        // Usually there is none: one entry looked for first, a point read.
        if store.scan(TXNS, committed().limit(1)).await?.is_empty() {
            return Ok((Vec::new(), true));
        }
        let found = store.scan(TXNS, committed().limit(UNAPPLIED_SCAN)).await?;
        let mut complete = found.len() < UNAPPLIED_SCAN;
        let mut out = Vec::new();
        for rec in found {
            match TxnRecord::from_record(rec) {
                Ok(rec) if rec.members.iter().any(|m| m.collection == coll && m.op != StagedOp::Check) => out.push(rec),
                Ok(_) => {}
                Err(err) => {
                    complete = false;
                    tracing::warn!(error = %err, "a transaction record that cannot be read was left out of a read's position");
                }
            }
        }
        Ok((out, complete))
    }
}

/// Whether a document of `coll`, read in `store`, holds an event not
/// logged yet (an outbox).
async fn holds_outbox(store: &dyn Store, coll: &str) -> Result<bool, StoreError> {
    let outbox = DOCS_OUTBOX.scan(Vec::new()).from(Bound::Included(Bson::String(String::new()))).limit(1);
    Ok(!store.scan(coll, outbox).await?.is_empty())
}

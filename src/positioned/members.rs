//! Batch reads (docs/design.md §7): documents of any collections, every one
//! as of one point of the change-event log, and that point (`position`).
//!
//! Where the store has snapshots (the embedded store), the members are read
//! in one, at its last log position ([`Positioned::in_snapshot`]): a
//! member held by a committed transaction whose change is not logged there
//! is finished first, and a single write's outbox sends the read to the
//! double collect. Elsewhere the point is found by reading the members
//! twice (a double collect):
//!
//! 1. the log's last position `H` is read, then every member as a reader
//!    sees it (a member locked by a committed transaction reads as its
//!    post-image, as a single read does);
//! 2. each member's version is looked up in the log (the event
//!    `<collection>/<id>/<version>`), waiting, bounded, for one whose
//!    change is made but not logged yet (a single write's outbox, a
//!    committed transaction not rolled forward), and so is the
//!    `transaction.committed` event of each transaction that made one of
//!    those versions (appended after its members' events); `P` is the
//!    greatest of `H` and those positions;
//! 3. the members are read again; a member whose version moved on must
//!    have its next version logged after `P`. Then the answer is the first
//!    read, at `P`; otherwise 2–3 again from the second read.
//!
//! Why this is exact: positions are taken in order (the store's counter),
//! and a change is made before its position is taken. A member's change
//! logged at or before `P` was made before `P`'s event was seen, so before
//! the second read, which shows it moved on; step 3 refuses such a read.
//! No change after `P` is shown, since every version shown is logged at or
//! before `P`. A member read before a transaction and another after it
//! cannot pass: the transaction's `transaction.committed` event, after its
//! members' events, is at or before `P`, so the first member's next
//! version is too.

use std::collections::HashMap;
use std::time::Duration;

use super::{InSnapshot, Positioned};
use crate::document::{StoredDoc, View};
use crate::documents::DocError;
use crate::events::model::{document_event_id, transaction_event_id};
use crate::follow_ups::QUIET_WAIT;
use crate::store::{Store, get_all_within, record_id};

/// Members one batch read names at most.
pub(crate) const MAX_MEMBERS: usize = 100;
/// Bytes of members (as stored) one batch read may hold: one whose
/// members hold more is refused ([`ReadError::TooLarge`]), its read
/// stopped once past them. A document named twice counts twice. Four documents at the size limit, or 100 of
/// 160 KiB.
pub(crate) const BATCH_BYTES: usize = 16 * 1024 * 1024;
/// Double collects tried before the batch is answered `locked`.
const ATTEMPTS: usize = 12;
/// The double collect made with this instance's writes held back.
const QUIET_AFTER: usize = 2;

#[derive(Debug, thiserror::Error)]
pub(crate) enum ReadError {
    /// A member's change could not be placed in the log within the wait
    /// (its transaction or single write is still finishing), or members
    /// kept changing between the two reads.
    #[error("{collection}/{id} is changing: it could not be read at one point with the others")]
    Unsettled { collection: String, id: String, holder: Option<String> },
    /// The members hold more than [`BATCH_BYTES`] as stored.
    #[error("the documents named hold more than {} MiB as stored: read them in smaller batches", BATCH_BYTES >> 20)]
    TooLarge,
    #[error(transparent)]
    Doc(#[from] DocError),
}

impl From<crate::store::StoreError> for ReadError {
    fn from(err: crate::store::StoreError) -> Self {
        ReadError::Doc(DocError::Store(err))
    }
}

/// A member of a batch read.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Member {
    pub collection: String,
    pub id: String,
}

/// The members as of `position`, in the order asked.
#[derive(Debug)]
pub(crate) struct BatchRead {
    pub position: u64,
    pub views: Vec<View>,
}

/// An event a batch read looks for.
struct Want {
    id: String,
    /// Whether its change is made, so the event is on its way if absent.
    wait: bool,
    /// The member it concerns (for the answer when it never comes).
    member: usize,
}

impl Want {
    fn event(members: &[Member], i: usize, version: i64, wait: bool) -> Self {
        Self { id: document_event_id(&members[i].collection, &members[i].id, version), wait, member: i }
    }
}

/// A member as one read found it.
struct Seen {
    view: View,
    /// The transaction the document is locked by, if any.
    holder: Option<String>,
    /// Whether the change the view shows may not be logged yet.
    unlogged: bool,
}

impl Seen {
    /// The version the view shows (0: none).
    fn version(&self) -> i64 {
        match &self.view {
            View::NotFound => 0,
            View::Deleted { version, .. } => *version,
            View::Live(live) => live.version,
        }
    }
}

impl Positioned {
    /// `members` as of one point of the log.
    pub(crate) async fn members(&self, members: &[Member]) -> Result<BatchRead, ReadError> {
        // This instance's answered writes first: a client reads its own.
        let settled = self.follow_ups.settle(crate::follow_ups::SETTLE_WAIT).await;
        if settled && let Some(read) = self.members_in_snapshot(members).await? {
            return Ok(read);
        }
        let deadline = tokio::time::Instant::now() + self.wait;
        let mut head = self.log.head().await?;
        let mut seen = self.collect(members).await?;
        for attempt in 0..ATTEMPTS {
            // After two double collects that members changed under, the
            // next is made with this instance's writes held back (its
            // first collect again, then): writes that keep landing here
            // cannot keep the members from being read together.
            let quiet = if attempt == QUIET_AFTER { self.follow_ups.quiesce(QUIET_WAIT).await } else { None };
            if quiet.is_some() {
                head = self.log.head().await?;
                seen = self.collect(members).await?;
            }
            // Where each version seen was logged; and the transactions
            // that made them, whose `transaction.committed` event follows
            // their members' events.
            let versions: Vec<Want> = (0..members.len())
                .filter(|&i| seen[i].version() > 0)
                .map(|i| Want::event(members, i, seen[i].version(), seen[i].unlogged))
                .collect();
            let found = self.positions(&versions, members, &seen, deadline).await?;
            let mut position = found.values().map(|(seq, _)| *seq).fold(head, u64::max);
            let mut txns: Vec<Want> = Vec::new();
            for w in &versions {
                if let Some((_, Some(txn))) = found.get(&w.id) {
                    let id = transaction_event_id(txn);
                    if !txns.iter().any(|t| t.id == id) {
                        txns.push(Want { id, wait: true, member: w.member });
                    }
                }
            }
            let committed = self.positions(&txns, members, &seen, deadline).await?;
            position = committed.values().map(|(seq, _)| *seq).fold(position, u64::max);
            // Read again: a member that changed since must have been
            // logged after `position`, or the first read is not one point.
            let next_head = self.log.head().await?;
            let again = self.collect(members).await?;
            let moved: Vec<Want> = (0..members.len())
                .filter(|&i| again[i].version() > seen[i].version())
                .map(|i| Want::event(members, i, seen[i].version() + 1, true))
                .collect();
            let next = self.positions(&moved, members, &again, deadline).await?;
            if next.values().all(|(seq, _)| *seq > position) {
                return Ok(BatchRead { position, views: seen.into_iter().map(|s| s.view).collect() });
            }
            head = next_head;
            seen = again;
        }
        // Members changing faster than they can be read together.
        let i = seen.iter().position(|s| s.holder.is_some()).unwrap_or(0);
        Err(unsettled(&members[i], &seen[i]))
    }

    /// Where the store has snapshots (the embedded store), `members` read
    /// in one, at its last log position: every member as of that one
    /// point, with no double collect. `None` where the store has none, or
    /// where the snapshot holds a single write's outbox or, twice, a
    /// member held by a committed transaction whose change is not logged
    /// there yet (finished after the first): then the members are
    /// double-collected.
    ///
    /// Exact, as a collection's snapshot is ([`super`]): a record and the
    /// event of its change land in one commit, so every record of the
    /// snapshot is logged at or before its last position, and a held
    /// member shows its holder's change exactly when the snapshot logs it.
    async fn members_in_snapshot(&self, members: &[Member]) -> Result<Option<BatchRead>, ReadError> {
        let read = self
            .in_snapshot(2, self.wait, |snapshot, _, _| async move {
                let snapshot = snapshot.as_ref();
                let docs = read_members(snapshot, members).await?;
                let (mut holders, mut views, mut unfinished) = (HashMap::new(), Vec::new(), Vec::new());
                for m in members {
                    let Some(doc) = docs.get(&(m.collection.as_str(), m.id.clone())) else {
                        views.push(View::NotFound);
                        continue;
                    };
                    if doc.meta.outbox.is_some() {
                        return Ok::<_, ReadError>(InSnapshot::Elsewhere);
                    }
                    match self.documents.view_in(snapshot, &m.collection, doc.clone(), &mut holders).await? {
                        Ok(view) => views.push(view),
                        Err(rec) => unfinished.push(rec),
                    }
                }
                Ok(if unfinished.is_empty() { InSnapshot::Exact(views) } else { InSnapshot::Finish(unfinished) })
            })
            .await?;
        Ok(read.map(|(views, _, position)| BatchRead { position, views }))
    }

    /// Every member as a reader sees it now (one store read per
    /// collection).
    async fn collect(&self, members: &[Member]) -> Result<Vec<Seen>, ReadError> {
        let docs = read_members(self.documents.store(), members).await?;
        // A fresh view of every holder: its state as of this read.
        let mut holders = HashMap::new();
        let mut out = Vec::with_capacity(members.len());
        for m in members {
            let Some(doc) = docs.get(&(m.collection.as_str(), m.id.clone())) else {
                out.push(Seen { view: View::NotFound, holder: None, unlogged: false });
                continue;
            };
            let holder = doc.meta.txn.clone();
            let outbox = doc.meta.outbox.is_some();
            let view = self.documents.view_of(doc.clone(), &mut holders).await?;
            let rolled = holder.as_ref().is_some_and(|h| matches!(holders.get(h), Some(Some(_))));
            out.push(Seen { view, holder, unlogged: outbox || rolled });
        }
        Ok(out)
    }

    /// Where the events `wanted` are in the log, waiting (until
    /// `deadline`) for those whose change is made but may not be logged
    /// yet. One not waited for and not found (a version older than the
    /// log's retention) is left out.
    async fn positions(
        &self,
        wanted: &[Want],
        members: &[Member],
        seen: &[Seen],
        deadline: tokio::time::Instant,
    ) -> Result<HashMap<String, (u64, Option<String>)>, ReadError> {
        let mut found = HashMap::new();
        let mut missing: Vec<&Want> = wanted.iter().collect();
        let mut backoff = Duration::from_millis(2);
        loop {
            let ids: Vec<String> = missing.iter().map(|w| w.id.clone()).collect();
            found.extend(self.log.positions_of(&ids).await?);
            missing.retain(|w| w.wait && !found.contains_key(&w.id));
            let Some(first) = missing.first() else { return Ok(found) };
            let now = tokio::time::Instant::now();
            if now >= deadline {
                tracing::warn!(event = %first.id, "a batch read waited in vain for a change to reach the event log");
                return Err(unsettled(&members[first.member], &seen[first.member]));
            }
            tokio::time::sleep(backoff.min(deadline - now)).await;
            backoff = (backoff * 2).min(Duration::from_millis(100));
        }
    }
}

/// The stored documents of `members` (one store read per collection, side
/// by side, within [`BATCH_BYTES`] all told). A document named by several
/// members is read once but counted once for each, as the answer holds it
/// once for each: the bound is on what is answered.
async fn read_members<'m>(
    store: &(impl Store + ?Sized),
    members: &'m [Member],
) -> Result<HashMap<(&'m str, String), StoredDoc>, ReadError> {
    let wanted = by_collection(members);
    // Named more than once: every document's bytes, times its members.
    let twice = wanted.values().map(Vec::len).sum::<usize>() < members.len();
    let Some(records) = get_all_within(store, wanted, BATCH_BYTES).await? else {
        return Err(ReadError::TooLarge);
    };
    let mut answered = 0usize;
    let mut docs = HashMap::new();
    for (coll, record) in records {
        let Some(id) = record_id(&record).map(str::to_owned) else { continue };
        if twice {
            let times = members.iter().filter(|m| m.collection == coll && m.id == id).count();
            let size = mongodb::bson::to_vec(&record).map_or(usize::MAX, |b| b.len());
            answered = answered.saturating_add(size.saturating_mul(times));
            if answered > BATCH_BYTES {
                return Err(ReadError::TooLarge);
            }
        }
        docs.insert((coll, id), StoredDoc::from_record(record).map_err(DocError::Store)?);
    }
    Ok(docs)
}

/// The ids of `members` by collection, each once.
fn by_collection(members: &[Member]) -> HashMap<&str, Vec<String>> {
    let mut by_coll: HashMap<&str, Vec<String>> = HashMap::new();
    for m in members {
        let ids = by_coll.entry(&m.collection).or_default();
        if !ids.contains(&m.id) {
            ids.push(m.id.clone());
        }
    }
    by_coll
}

fn unsettled(member: &Member, seen: &Seen) -> ReadError {
    ReadError::Unsettled { collection: member.collection.clone(), id: member.id.clone(), holder: seen.holder.clone() }
}

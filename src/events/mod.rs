//! The change-event log (docs/design.md §5): every committed change leaves one
//! event at a unique, increasing position (`seq`) of `_events`.
//!
//! Events are appended ([`crate::store::Write::Append`]) by whoever makes a
//! change durable in the documents: a transaction's roll-forward before it
//! releases any lock (its outputs, [`TxnEvents`]), and a single-document
//! write right after its compare-and-set, which stored the event in the
//! document's `_meta.outbox` ([`publish_outbox`]). Appends are idempotent
//! by event id (the log's unique index), so any number of helpers may make
//! sure an event exists.
//!
//! Readers ([`Log::read`]) go through the log in position order and never
//! move past a position that may still fill (a gap): one still empty once
//! the position after it is older than a timeout is closed for good with
//! a void entry (insert-if-absent), and an append that finds its position
//! closed takes another. What a reader hands out is durable first
//! (docs/design.md §1): it syncs the store after reading.

pub mod model;
pub mod tap;

pub use tap::Tap;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::watch;

use crate::clock::Clock;
use crate::documents::model::StoredDoc;
use crate::store::{
    Bound, Bson, DateTime, Document, DynStore, LOG_SEQ, Record, Store, StoreError, StoreResult, Write, void_entry,
};
use crate::txn::TxnRecord;
use crate::txn::outputs::Outputs;
pub use model::{Entry, Event, EventMember, EventType, Logged};

/// The log collection.
pub const EVENTS: &str = "_events";
/// Where the log keeps its floor: `{_id: "_events.floor", n}`, the last
/// position purged (every position up to it is gone or going).
pub const STATE: &str = "_counters";
const FLOOR: &str = "_events.floor";
/// Where the live counts of collections keep the position up to which
/// they have counted the log's changes: `{_id: "_collections.counted", n}`
/// in [`STATE`]. The purge never moves the floor past it, so no change is
/// purged before it is counted.
pub const COUNTED: &str = "_collections.counted";

/// The counters kept in [`STATE`] (the log's floor, the position counts
/// are folded to): each a position `n` that only moves forward, by
/// compare-and-set on the value below the new one.
pub mod counter {
    use serde::Serialize;

    use crate::store::shape::{Lt, fields};
    use crate::store::{Document, Record, Update};

    #[derive(Serialize)]
    struct Counter<'a> {
        #[serde(rename = "_id")]
        id: &'a str,
        n: i64,
    }

    #[derive(Serialize)]
    struct Value<N> {
        n: N,
    }

    fn stored(n: u64) -> i64 {
        i64::try_from(n).unwrap_or(i64::MAX)
    }

    /// Counter `id` at `n`, as first inserted.
    pub fn record(id: &str, n: u64) -> Record {
        fields(&Counter { id, n: stored(n) })
    }

    /// The value `n`, as a replacement of the counter's record.
    pub fn value(n: u64) -> Document {
        fields(&Value { n: stored(n) })
    }

    /// Set the counter to `n`.
    pub fn set(n: u64) -> Update {
        Update::fields(&Value { n: stored(n) })
    }

    /// The filter of a counter below `n`: moving it to `n` moves it forward.
    pub fn below(n: u64) -> Document {
        fields(&Value { n: Lt(stored(n)) })
    }

    /// The position a counter's record holds.
    pub fn read(rec: &Record) -> u64 {
        rec.get_i64("n").ok().and_then(|n| u64::try_from(n).ok()).unwrap_or(0)
    }
}

/// Position `seq` as the log stores it.
pub(crate) fn position(seq: u64) -> Bson {
    Bson::Int64(i64::try_from(seq).unwrap_or(i64::MAX))
}

/// Positions one read takes at most.
pub const READ_BATCH: usize = 500;

/// How the log is kept.
#[derive(Clone, Debug)]
pub struct EventsConfig {
    /// Events older than this are purged.
    pub retention: Duration,
    /// Tombstones older than this are purged (at least `retention`).
    pub tombstone_retention: Duration,
    /// How long a gap may stay open before a reader closes it.
    pub gap_timeout: Duration,
    /// How far instances' clocks may be apart.
    pub clock_skew: Duration,
    pub clock: Clock,
}

impl Default for EventsConfig {
    fn default() -> Self {
        Self {
            retention: Duration::from_secs(7 * 24 * 3600),
            tombstone_retention: Duration::from_secs(30 * 24 * 3600),
            gap_timeout: Duration::from_secs(3),
            clock_skew: Duration::from_secs(1),
            clock: Clock::System,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// The cursor lies before the oldest retained position.
    #[error("events after {after} are no longer retained (the oldest retained position follows {floor})")]
    Expired { after: u64, floor: u64 },
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// An event as readers hand it out: decoded once and written as JSON
/// once, however many readers take it.
#[derive(Debug)]
pub struct Ready {
    pub event: Event,
    pub json: String,
}

impl Ready {
    fn new(event: Event) -> Arc<Self> {
        let json = serde_json::to_string(&event).expect("an event serializes");
        Arc::new(Self { event, json })
    }
}

/// What one read found: the events after the cursor up to the first gap
/// that may still fill (void entries left out), and the last position read
/// (the cursor of the next read).
#[derive(Debug, Default)]
pub struct Batch {
    pub events: Vec<Arc<Ready>>,
    pub next: u64,
    /// Whether a gap that may still fill stopped the read.
    pub gap: bool,
    /// Whether the read stopped at `max` positions with more after.
    pub more: bool,
}

/// Which events a reader wants: `None` is any.
#[derive(Clone, Debug, Default)]
pub struct Filter {
    pub collections: Option<Vec<String>>,
    pub types: Option<Vec<EventType>>,
    /// The collections the reader may see (an API key limited to some):
    /// an event telling of any other is left out.
    pub within: Option<Vec<String>>,
}

impl Filter {
    pub fn wants(&self, event: &Event) -> bool {
        self.types.as_ref().is_none_or(|t| t.contains(&event.kind))
            && self.collections.as_ref().is_none_or(|c| event.touches(c))
            && self.within.as_ref().is_none_or(|w| event.within(w))
    }
}

/// Positions the cache of recent reads holds at most.
const RECENT: usize = 4096;
/// Bytes of event JSON it holds at most (events carry whole documents).
const RECENT_BYTES: usize = 16 << 20;

/// The positions read last from the store, durable and contiguous:
/// `entries[i]` is position `from + i` (`None`: a void entry). Streams at
/// the head of the log all want the same few positions; the first to miss
/// reads them from the store (the others wait for it), the rest take them
/// from here. A reader further back reads the store itself.
#[derive(Default)]
struct Recent {
    from: u64,
    entries: std::collections::VecDeque<Option<Arc<Ready>>>,
    /// The JSON bytes of the events held.
    bytes: usize,
}

fn json_len(entry: &Option<Arc<Ready>>) -> usize {
    entry.as_ref().map_or(0, |r| r.json.len())
}

impl Recent {
    /// The first position not held.
    fn end(&self) -> u64 {
        self.from + self.entries.len() as u64
    }

    /// Up to `max` positions after `after`, if the next one is held.
    fn after(&self, after: u64, max: usize) -> Option<Batch> {
        let first = after.checked_add(1)?;
        if first < self.from || first >= self.end() || self.entries.is_empty() {
            return None;
        }
        let skip = (first - self.from) as usize;
        let taken: Vec<&Option<Arc<Ready>>> = self.entries.iter().skip(skip).take(max).collect();
        let next = after + taken.len() as u64;
        let events = taken.into_iter().flatten().cloned().collect();
        // At the end of what is held, the stream waits for a wake-up (or
        // its poll) before it reads the store.
        Some(Batch { events, next, gap: false, more: next + 1 < self.end() })
    }

    /// Positions `after + 1 ..` as read from the store.
    fn remember(&mut self, after: u64, read: Vec<Option<Arc<Ready>>>) {
        if read.is_empty() {
            return;
        }
        if after + 1 != self.end() || self.entries.is_empty() {
            if after + 1 < self.end() {
                // Older than what is held: leave it.
                return;
            }
            self.entries.clear();
            self.bytes = 0;
            self.from = after + 1;
        }
        self.bytes += read.iter().map(json_len).sum::<usize>();
        self.entries.extend(read);
        while self.entries.len() > RECENT || (self.bytes > RECENT_BYTES && self.entries.len() > 1) {
            let gone = self.entries.pop_front().expect("more than one held");
            self.bytes -= json_len(&gone);
            self.from += 1;
        }
    }
}

/// The log: reads, the wake-up of local readers, retention.
pub struct Log {
    store: DynStore,
    cfg: EventsConfig,
    /// Wakes this log's readers when this process appends.
    tap: Tap,
    recent: std::sync::Mutex<Recent>,
    /// Held by the reader filling [`Recent`] from the store.
    filling: tokio::sync::Mutex<()>,
    /// The floor as last read (or moved) here.
    floor_seen: std::sync::atomic::AtomicU64,
}

impl Log {
    /// The log of `store`, whose readers `tap` wakes: `store` is the
    /// stack with `tap` in it (see `txgate::stack`), or, for a reader
    /// that polls, any store and a tap of its own.
    pub fn new(store: DynStore, tap: Tap, cfg: EventsConfig) -> Arc<Self> {
        Arc::new(Self {
            store,
            cfg,
            tap,
            recent: std::sync::Mutex::default(),
            filling: tokio::sync::Mutex::new(()),
            floor_seen: std::sync::atomic::AtomicU64::new(0),
        })
    }

    pub fn config(&self) -> &EventsConfig {
        &self.cfg
    }

    /// A receiver that changes whenever this process appended to the log.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.tap.subscribe()
    }

    /// Events this process appended to the log so far.
    pub fn appended(&self) -> u64 {
        self.tap.written()
    }

    /// The last position purged; a cursor before it is expired.
    pub async fn floor(&self) -> StoreResult<u64> {
        self.state(FLOOR).await
    }

    /// The position up to which collections' live counts are counted
    /// ([`COUNTED`]; 0 before the first count).
    pub async fn counted(&self) -> StoreResult<u64> {
        self.state(COUNTED).await
    }

    async fn state(&self, id: &str) -> StoreResult<u64> {
        Ok(self.store.get(STATE, id).await?.as_ref().map_or(0, counter::read))
    }

    /// The last position in the log (0 when empty): where a stream without
    /// a cursor starts.
    pub async fn head(&self) -> StoreResult<u64> {
        let scan = crate::store::scans::EVENTS_BY_SEQ.scan(Vec::new()).desc().limit(1);
        let last = self.store.scan(EVENTS, scan).await?;
        Ok(last.first().and_then(|r| r.get_i64(LOG_SEQ).ok()).and_then(|n| u64::try_from(n).ok()).unwrap_or(0))
    }

    /// Up to `max` positions after `after`, stopping before a gap that
    /// may still fill; what is returned is durable.
    pub async fn read(&self, after: u64, max: usize) -> Result<Batch, ReadError> {
        if let Some(batch) = self.cached(after, max) {
            return Ok(batch);
        }
        let at_head = after + 1 >= self.recent.lock().expect("recent reads").end();
        if !at_head {
            return Ok(self.read_store(after, max).await?.0);
        }
        // One reader at the head reads the store; the others take what it
        // read.
        let _filling = self.filling.lock().await;
        if let Some(batch) = self.cached(after, max) {
            return Ok(batch);
        }
        let (batch, read) = self.read_store(after, max).await?;
        self.recent.lock().expect("recent reads").remember(after, read);
        Ok(batch)
    }

    /// [`Log::read`] from the store, never from what streams read lately:
    /// for a page, which must not stop where that ends.
    pub async fn read_fresh(&self, after: u64, max: usize) -> Result<Batch, ReadError> {
        Ok(self.read_store(after, max).await?.0)
    }

    /// What [`Recent`] holds after `after`, unless the cursor may be
    /// older than the floor (the store then says whether it is).
    fn cached(&self, after: u64, max: usize) -> Option<Batch> {
        if after < self.floor_seen.load(std::sync::atomic::Ordering::Relaxed) {
            return None;
        }
        self.recent.lock().expect("recent reads").after(after, max)
    }

    /// [`Log::read`] from the store; also every position read, in order.
    async fn read_store(&self, after: u64, max: usize) -> Result<(Batch, Vec<Option<Arc<Ready>>>), ReadError> {
        let floor = self.floor().await?;
        self.floor_seen.fetch_max(floor, std::sync::atomic::Ordering::Relaxed);
        if after < floor {
            return Err(ReadError::Expired { after, floor });
        }
        let mut positions = Vec::new();
        let mut batch = Batch { next: after, ..Batch::default() };
        let mut read = 0;
        'scan: while read < max {
            let want = (max - read).min(READ_BATCH);
            let scan = crate::store::scans::EVENTS_BY_SEQ
                .scan(Vec::new())
                .from(Bound::Excluded(position(batch.next)))
                .limit(want);
            let records = self.store.scan(EVENTS, scan).await?;
            let full = records.len() == want;
            for rec in records {
                let logged = Logged::from_record(rec)?;
                if logged.seq != batch.next + 1 {
                    if self.close_gap(batch.next + 1, &logged).await? {
                        // Closed: read on from the same place.
                        continue 'scan;
                    }
                    batch.gap = true;
                    break 'scan;
                }
                batch.next = logged.seq;
                read += 1;
                match logged.entry {
                    Entry::Event(event) => {
                        let ready = Ready::new(*event);
                        positions.push(Some(Arc::clone(&ready)));
                        batch.events.push(ready);
                    }
                    _ => positions.push(None),
                }
            }
            if !full {
                break;
            }
            batch.more = read >= max;
        }
        // Nothing leaves the process on the strength of an unsynced write.
        if batch.next > after {
            self.store.sync().await?;
        }
        Ok((batch, positions))
    }

    /// Positions `from` up to `next.seq` are empty: when `next` was logged
    /// longer than the gap timeout ago (so were they taken), close them
    /// with void entries. `true` when every one is filled or closed now.
    async fn close_gap(&self, from: u64, next: &Logged) -> StoreResult<bool> {
        let now = self.cfg.clock.now().timestamp_millis();
        let wait = i64::try_from((self.cfg.gap_timeout + self.cfg.clock_skew).as_millis()).unwrap_or(i64::MAX);
        match next.logged_at {
            Some(at) if now.saturating_sub(at.timestamp_millis()) < wait => return Ok(false),
            _ => {}
        }
        for seq in from..next.seq {
            let void = void_entry(seq, self.cfg.clock.now());
            // Unsynced: the read syncs before anything is handed out.
            if self.store.unsynced().insert(EVENTS, void).await? {
                tracing::warn!(seq, "closed a gap in the event log that stayed empty past its timeout");
            }
        }
        Ok(true)
    }

    /// Purge what is past retention, oldest first, in position order: the
    /// floor moves first (synced), so no reader ever takes a purged
    /// position for a gap; then the records up to it go. Nothing past the
    /// position collections' live counts have reached goes ([`COUNTED`]).
    /// Returns how many.
    pub async fn purge(&self) -> StoreResult<usize> {
        let cutoff = self
            .cfg
            .clock
            .now()
            .timestamp_millis()
            .saturating_sub(i64::try_from(self.cfg.retention.as_millis()).unwrap_or(i64::MAX));
        let mut total = 0;
        loop {
            let floor = self.floor().await?;
            let counted = self.counted().await?;
            // Nothing to do unless the oldest record is past retention and
            // counted (or below the floor): one read when idle.
            let oldest = self.store.scan(EVENTS, crate::store::scans::EVENTS_BY_SEQ.scan(Vec::new()).limit(1)).await?;
            match oldest.into_iter().next().map(Logged::from_record).transpose()? {
                None => return Ok(total),
                Some(l)
                    if l.seq > floor
                        && (l.seq > counted || l.logged_at.is_some_and(|at| at.timestamp_millis() >= cutoff)) =>
                {
                    return Ok(total);
                }
                Some(_) => {}
            }
            let scan = crate::store::scans::EVENTS_BY_SEQ.scan(Vec::new()).limit(crate::store::BATCH);
            let records = self.store.scan(EVENTS, scan).await?;
            let full = records.len() == crate::store::BATCH;
            // The contiguous old prefix above the floor (or left below it by
            // an earlier pass that stopped between its steps).
            let mut upto = floor;
            let mut ids = Vec::new();
            for rec in &records {
                let id = crate::store::record_id(rec).unwrap_or_default().to_owned();
                let logged = Logged::from_record(rec.clone())?;
                let old = logged.logged_at.is_none_or(|at| at.timestamp_millis() < cutoff);
                if logged.seq <= floor {
                    ids.push(id);
                    continue;
                }
                if logged.seq != upto + 1 || !old || logged.seq > counted {
                    break;
                }
                upto = logged.seq;
                ids.push(id);
            }
            if ids.is_empty() {
                return Ok(total);
            }
            if upto > floor {
                let moved = self.store.replace(STATE, FLOOR, counter::below(upto), counter::value(upto)).await?
                    || self.store.insert(STATE, counter::record(FLOOR, upto)).await?;
                if !moved {
                    // Another instance moved it meanwhile.
                    continue;
                }
                self.floor_seen.fetch_max(upto, std::sync::atomic::Ordering::Relaxed);
            }
            let unsynced = self.store.unsynced();
            let unsynced = &unsynced;
            let deletes = ids.iter().map(|id| async move { unsynced.delete(EVENTS, id, Document::new()).await });
            for done in futures::future::join_all(deletes).await {
                total += usize::from(done?);
            }
            if !full {
                return Ok(total);
            }
        }
    }
}

/// The worker that purges the log and the tombstones past their retention
/// every `interval`.
pub struct Purge {
    pub log: Arc<Log>,
    pub interval: Duration,
}

#[async_trait::async_trait]
impl crate::worker::Worker for Purge {
    fn name(&self) -> &'static str {
        "event_purge"
    }

    async fn run(self: Arc<Self>, stop: tokio_util::sync::CancellationToken) {
        let log = &self.log;
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(self.interval) => {}
            }
            match log.purge().await {
                Ok(0) => {}
                Ok(n) => tracing::info!(purged = n, "event log purged past its retention"),
                Err(err) => tracing::warn!(error = %err, "event log purge failed; retrying next interval"),
            }
            match log.purge_tombstones().await {
                Ok(0) => {}
                Ok(n) => tracing::info!(purged = n, "tombstones purged past their retention"),
                Err(err) => tracing::warn!(error = %err, "tombstone purge failed; retrying next interval"),
            }
        }
    }
}

impl Log {
    /// Delete the tombstones older than the tombstone retention (unlocked,
    /// their event logged), along each user collection's index of
    /// documents by deletion time. The retention is at least the events':
    /// a document re-created once its tombstone is gone starts at version
    /// 1 again, and its event ids must not be in the log any more.
    pub async fn purge_tombstones(&self) -> StoreResult<usize> {
        let retention = i64::try_from(self.cfg.tombstone_retention.as_millis()).unwrap_or(i64::MAX);
        let cutoff = DateTime::from_millis(self.cfg.clock.now().timestamp_millis().saturating_sub(retention));
        let filter = StoredDoc::purgeable_tombstone(cutoff);
        let mut total = 0;
        for coll in self.store.collections().await? {
            if coll.starts_with('_') {
                continue;
            }
            loop {
                let scan = crate::store::scans::DOCS_BY_DELETION
                    .scan(vec![Bson::Boolean(true)])
                    .to(Bound::Excluded(Bson::DateTime(cutoff)))
                    .limit(crate::store::BATCH);
                let batch = self.store.scan(&coll, scan).await?;
                let full = batch.len() == crate::store::BATCH;
                let unsynced = self.store.unsynced();
                let unsynced = &unsynced;
                let deletes = batch.iter().filter_map(crate::store::record_id).map(|id| {
                    let (coll, filter) = (coll.as_str(), filter.clone());
                    async move { unsynced.delete(coll, id, filter).await }
                });
                let mut deleted = 0;
                for done in futures::future::join_all(deletes).await {
                    deleted += usize::from(done?);
                }
                total += deleted;
                // A full batch none of which could go would be read again.
                if !full || deleted == 0 {
                    break;
                }
            }
        }
        Ok(total)
    }
}

/// Make sure the event `doc` holds in its outbox is in the log, then clear
/// the outbox (unless the document moved on). Readers never call this;
/// writers do before they write a document that has one, and recovery for
/// any a crash left behind.
pub async fn publish_outbox(store: &dyn Store, coll: &str, doc: &StoredDoc, at: DateTime) -> StoreResult<()> {
    let Some(outbox) = &doc.meta.outbox else { return Ok(()) };
    let Ok(eid) = outbox.get_str("_id") else {
        return Err(StoreError::Internal(format!("{coll}/{}: outbox without an event id", doc.id)));
    };
    let mut record = outbox.clone();
    record.insert("logged_at", at);
    let chain = vec![
        (EVENTS, Write::Append(record)),
        (
            coll,
            Write::Update {
                id: &doc.id,
                filter: StoredDoc::outbox_filter(doc.meta.v, eid),
                update: StoredDoc::clear_outbox(),
            },
        ),
    ];
    if store.unsynced().in_order(chain).await? == 0 {
        // It was in the log already: only the outbox is left to clear.
        let (filter, clear) = (StoredDoc::outbox_filter(doc.meta.v, eid), StoredDoc::clear_outbox());
        store.unsynced().update(coll, &doc.id, filter, clear).await?;
    }
    Ok(())
}

/// The log records (positions left to the store) of committed `rec`'s
/// events, from its members' post-images `forwarded` (member index and
/// the document as rolled forward): one per changed member, then the
/// `transaction.committed` event.
pub fn transaction_records(rec: &TxnRecord, forwarded: &[(usize, &StoredDoc)], at: DateTime) -> Vec<Record> {
    let committed = rec.committed_at.unwrap_or(at);
    let mut out = Vec::with_capacity(forwarded.len() + 1);
    for (i, doc) in forwarded {
        let m = &rec.members[*i];
        if let Some(kind) = EventType::of_staged(m.op) {
            let mut r = model::document_event(kind, &m.collection, doc, Some(&rec.id), committed);
            r.insert("logged_at", at);
            out.push(r);
        }
    }
    let mut r = model::transaction_event(rec);
    r.insert("logged_at", at);
    out.push(r);
    out
}

/// The event output of committed transactions: before any lock is
/// released, the events of every member still held, then the
/// `transaction.committed` event.
pub struct TxnEvents {
    store: DynStore,
    clock: Clock,
}

impl TxnEvents {
    pub fn new(store: DynStore, clock: Clock) -> Arc<Self> {
        Arc::new(Self { store, clock })
    }
}

#[async_trait]
impl Outputs for TxnEvents {
    async fn ensure(&self, rec: &TxnRecord) -> StoreResult<()> {
        let at = self.clock.now();
        let committed = rec.committed_at.unwrap_or(at);
        // A member no longer held was released by someone who made every
        // event of the transaction exist first: with none held, there is
        // nothing to do.
        // `Some(None)`: held, but another tool broke the document; its lock
        // cannot be released either, and the rest go on.
        let reads = rec.members.iter().enumerate().map(|(i, m)| async move {
            let Some(found) = self.store.get(&m.collection, &m.id).await? else { return Ok(None) };
            match StoredDoc::from_record(found) {
                Ok(doc) if doc.meta.txn.as_deref() == Some(rec.id.as_str()) => {
                    Ok(Some(Some((i, doc.rolled_forward(committed)))))
                }
                Ok(_) => Ok(None),
                Err(err) => {
                    tracing::warn!(txn.id = %rec.id, collection = %m.collection, id = %m.id, error = %err, "no event for a member that cannot be read");
                    Ok(Some(None))
                }
            }
        });
        let held: Vec<Option<(usize, StoredDoc)>> = futures::future::join_all(reads)
            .await
            .into_iter()
            .collect::<StoreResult<Vec<_>>>()?
            .into_iter()
            .flatten()
            .collect();
        if held.is_empty() {
            return Ok(());
        }
        let forwarded: Vec<(usize, StoredDoc)> = held.into_iter().flatten().collect();
        let refs: Vec<(usize, &StoredDoc)> = forwarded.iter().map(|(i, d)| (*i, d)).collect();
        // The members' events first; the transaction's own only once every
        // one of them is in the log, whoever put it there. Another helper
        // may be appending the same events at once and win some of them at
        // later positions: a position taken after all members exist is
        // larger than each of theirs, so the transaction's event comes last.
        let mut records = transaction_records(rec, &refs, at);
        let own = records.pop().expect("the transaction's own event is last");
        self.store.append_all(EVENTS, records).await?;
        self.store.unsynced().append(EVENTS, own).await?;
        Ok(())
    }

    fn has_any(&self, _: &TxnRecord) -> bool {
        true
    }

    fn chained(&self, rec: &TxnRecord, forwarded: &[(usize, &StoredDoc)]) -> Option<Vec<(&'static str, Record)>> {
        Some(transaction_records(rec, forwarded, self.clock.now()).into_iter().map(|r| (EVENTS, r)).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ready(seq: u64) -> Option<Arc<Ready>> {
        let event = Event {
            id: format!("c/d/{seq}"),
            seq,
            kind: EventType::Updated,
            collection: Some("c".into()),
            document: Some("d".into()),
            version: Some(seq as i64),
            transaction: None,
            at: "2026-01-01T00:00:00.000Z".into(),
            data: None,
            members: None,
        };
        Some(Ready::new(event))
    }

    fn seqs(batch: &Batch) -> Vec<u64> {
        batch.events.iter().map(|r| r.event.seq).collect()
    }

    #[test]
    fn recent_reads_hand_out_held_positions_in_order_and_stay_bounded() {
        let mut recent = Recent::default();
        assert!(recent.after(0, 10).is_none(), "nothing held");
        // Positions 6..=8, 7 a void entry.
        recent.remember(5, vec![ready(6), None, ready(8)]);
        let b = recent.after(5, 10).unwrap();
        assert_eq!((seqs(&b), b.next, b.more, b.gap), (vec![6, 8], 8, false, false));
        let b = recent.after(5, 2).unwrap();
        assert_eq!((seqs(&b), b.next, b.more), (vec![6], 7, true), "a void position counts toward max");
        assert!(recent.after(8, 10).is_none(), "past the end: the store is read");
        assert!(recent.after(4, 10).is_none(), "before the start: the store is read");
        // Contiguous reads extend it; a read further back leaves it alone;
        // one past its end starts it over.
        recent.remember(8, vec![ready(9)]);
        assert_eq!(seqs(&recent.after(7, 10).unwrap()), vec![8, 9]);
        recent.remember(2, vec![ready(3)]);
        assert_eq!(recent.from, 6);
        recent.remember(20, vec![ready(21)]);
        assert_eq!((recent.from, recent.end()), (21, 22));
        let many: Vec<_> = (22..22 + RECENT as u64 + 10).map(ready).collect();
        recent.remember(21, many);
        assert_eq!(recent.entries.len(), RECENT);
        assert_eq!(recent.end(), 22 + RECENT as u64 + 10);
    }
}

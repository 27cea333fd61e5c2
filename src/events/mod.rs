//! The change-event log (docs/design.md §5): every committed change leaves one
//! event at a unique, increasing position (`seq`) of `_events`.
//!
//! Events are appended ([`crate::store::Write::Append`]) by whoever makes a
//! change durable in the documents: a transaction's roll-forward before it
//! releases any lock (its outputs, [`crate::txn::TxnEvents`]), and a single-document
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

pub(crate) mod counter;
pub(crate) mod model;
pub(crate) mod outbox;
mod purge;
pub(crate) mod ruled;
pub(crate) mod set;
pub(crate) mod tap;

pub(crate) use outbox::{Publisher, publish_outbox};
pub(crate) use purge::Purge;
pub use tap::Tap;

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::clock::Clock;
use crate::follow_ups::{FollowUps, SETTLE_WAIT};
use crate::store::{Bound, Bson, DynStore, LOG_SEQ, PAGE_BYTES, Store, StoreError, StoreResult, void_entry};
pub(crate) use model::{Entry, Event, EventType, Logged};

/// The log collection.
pub const EVENTS: &str = "_events";
/// Where the log keeps its floor: `{_id: "_events.floor", n}`, the last
/// position purged (every position up to it is gone or going).
pub(crate) const STATE: &str = "_counters";
const FLOOR: &str = "_events.floor";
/// Where the live counts of collections keep the position up to which
/// they have counted the log's changes: `{_id: "_collections.counted", n}`
/// in [`STATE`]. The purge never moves the floor past it, so no change is
/// purged before it is counted.
pub(crate) const COUNTED: &str = "_collections.counted";

/// Position `seq` as the log stores it.
pub(crate) fn position(seq: u64) -> Bson {
    Bson::Int64(i64::try_from(seq).unwrap_or(i64::MAX))
}

/// The position of the first of `records` (read with [`LOG_SEQ`]).
fn last_position(records: Vec<crate::store::Record>) -> Option<u64> {
    records.first().and_then(|r| r.get_i64(LOG_SEQ).ok()).and_then(|n| u64::try_from(n).ok())
}

/// Positions one read takes at most.
pub(crate) const READ_BATCH: usize = 500;

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
    /// The document before the change, once a filtered reader asked
    /// ([`set::Prior`]): learned once, however many readers ask.
    prior: tokio::sync::OnceCell<set::Prior>,
}

impl Ready {
    fn new(event: Event) -> Arc<Self> {
        let json = serde_json::to_string(&event).expect("an event serializes");
        Arc::new(Self { event, json, prior: tokio::sync::OnceCell::new() })
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
    /// Whether the read stopped at `max` positions (or at
    /// [`PAGE_BYTES`]) with more after.
    pub more: bool,
    /// The bytes of the records read, as stored (or, for events held in
    /// memory, as JSON).
    pub bytes: usize,
}

/// Which events a reader wants: `None` is any.
#[derive(Clone, Debug, Default)]
pub struct Filter {
    pub collections: Option<Vec<String>>,
    pub types: Option<Vec<EventType>>,
    /// The collections the reader may see (an API key limited to some):
    /// an event telling of any other is left out.
    pub within: Option<Vec<String>>,
    /// The collections whose `access.viewed_as` events the reader is sent
    /// (those it holds `admin` on; `None`: every one).
    pub admin: Option<Vec<String>>,
}

impl Filter {
    pub fn wants(&self, event: &Event) -> bool {
        self.types.as_ref().is_none_or(|t| t.contains(&event.kind))
            && self.collections.as_ref().is_none_or(|c| event.touches(c))
            && self.within.as_ref().is_none_or(|w| event.within(w))
            && (event.kind != EventType::ViewedAs || self.admin.as_ref().is_none_or(|a| event.within(a)))
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
        let bytes = taken.iter().copied().map(json_len).sum();
        let events = taken.into_iter().flatten().cloned().collect();
        // At the end of what is held, the stream waits for a wake-up (or
        // its poll) before it reads the store.
        Some(Batch { events, next, gap: false, more: next + 1 < self.end(), bytes })
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
    /// The head as last read here: the next read of the head starts there.
    head_seen: std::sync::atomic::AtomicU64,
    /// Work of this instance's answers that puts events in the log.
    follow_ups: FollowUps,
}

impl Log {
    /// The log of `store`, whose readers `tap` wakes: `store` is the
    /// stack with `tap` in it (see `txgate::stack`), or, for a reader
    /// that polls, any store and a tap of its own.
    pub fn new(store: DynStore, tap: Tap, cfg: EventsConfig) -> Arc<Self> {
        Self::settling(store, tap, cfg, FollowUps::default())
    }

    /// [`Log::new`], its readers settling `follow_ups` ([`Log::settle`]).
    pub(crate) fn settling(store: DynStore, tap: Tap, cfg: EventsConfig, follow_ups: FollowUps) -> Arc<Self> {
        Arc::new(Self {
            store,
            cfg,
            tap,
            recent: std::sync::Mutex::default(),
            filling: tokio::sync::Mutex::new(()),
            floor_seen: std::sync::atomic::AtomicU64::new(0),
            head_seen: std::sync::atomic::AtomicU64::new(0),
            follow_ups,
        })
    }

    /// Wait (bounded) until the events of every answer this instance gave
    /// before are in the log: a client reading events, counts or the
    /// log's head right after an answer sees its own write
    /// ([`crate::follow_ups`]): whether they all are.
    pub(crate) async fn settle(&self) -> bool {
        self.follow_ups.settle(SETTLE_WAIT).await
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
    ///
    /// Read from the head last read here on (positions only grow), so the
    /// read costs the positions appended since, also on a server that
    /// sorts every record its filter matches rather than walk the index in
    /// order (DocumentDB: docs/limitations.md). When none is found from
    /// there (the purge emptied the log, or it was replaced under this
    /// process), the whole log is read, as on the first read.
    pub async fn head(&self) -> StoreResult<u64> {
        use std::sync::atomic::Ordering::Relaxed;
        let seen = self.head_seen.load(Relaxed);
        if seen > 0 {
            let scan = crate::store::scans::EVENTS_BY_SEQ
                .scan(Vec::new())
                .from(Bound::Included(position(seen)))
                .desc()
                .limit(1)
                .fields(&[LOG_SEQ]);
            if let Some(head) = last_position(self.store.scan(EVENTS, scan).await?) {
                self.head_seen.fetch_max(head, Relaxed);
                return Ok(head);
            }
        }
        let head = Self::head_in(self.store.as_ref()).await?;
        self.head_seen.store(head, Relaxed);
        Ok(head)
    }

    /// [`Self::head`], read in `store` (a snapshot of the log's store).
    pub(crate) async fn head_in(store: &dyn Store) -> StoreResult<u64> {
        // The position only: the last record may be a large transaction's.
        let scan = crate::store::scans::EVENTS_BY_SEQ.scan(Vec::new()).desc().limit(1).fields(&[LOG_SEQ]);
        Ok(last_position(store.scan(EVENTS, scan).await?).unwrap_or(0))
    }

    /// Whether an event of collection `coll` is logged after position
    /// `after`, up to `upto`: looked for among at most `most` positions,
    /// and past them taken as yes (so is a record that cannot be read).
    pub(crate) async fn changed(&self, coll: &str, after: u64, upto: u64, most: usize) -> StoreResult<bool> {
        let scan = crate::store::scans::EVENTS_BY_SEQ
            .scan(Vec::new())
            .from(Bound::Excluded(position(after)))
            .to(Bound::Included(position(upto)))
            .limit(most);
        let records = self.store.scan(EVENTS, scan).await?;
        if records.len() == most {
            return Ok(true);
        }
        Ok(records.into_iter().any(|rec| match model::Logged::from_record(rec) {
            Ok(logged) => match logged.entry {
                Entry::Event(event) => event.collection.as_deref() == Some(coll),
                _ => false,
            },
            Err(_) => true,
        }))
    }

    /// Of the events `ids` (event ids), those in the log: each one's
    /// position and the transaction that made its change, if any.
    pub(crate) async fn positions_of(
        &self,
        ids: &[String],
    ) -> StoreResult<std::collections::HashMap<String, (u64, Option<String>)>> {
        Self::positions_in(self.store.as_ref(), ids).await
    }

    /// [`Self::positions_of`], read in `store` (a snapshot of the log's
    /// store).
    pub(crate) async fn positions_in(
        store: &dyn Store,
        ids: &[String],
    ) -> StoreResult<std::collections::HashMap<String, (u64, Option<String>)>> {
        if ids.is_empty() {
            return Ok(Default::default());
        }
        let mut found = std::collections::HashMap::with_capacity(ids.len());
        for rec in store.get_many(EVENTS, ids).await? {
            let Some(id) = crate::store::record_id(&rec).map(str::to_owned) else { continue };
            let Some(seq) = rec.get_i64(LOG_SEQ).ok().and_then(|s| u64::try_from(s).ok()) else { continue };
            found.insert(id, (seq, rec.get_str("transaction").ok().map(str::to_owned)));
        }
        Ok(found)
    }

    /// Of the events `ids` (event ids), those the log holds; a record that
    /// cannot be decoded is left out, and reported.
    pub(crate) async fn events_by_id(&self, ids: &[String]) -> StoreResult<Vec<model::Event>> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let mut out = Vec::with_capacity(ids.len());
        for rec in self.store.get_many(EVENTS, ids).await? {
            match model::Logged::from_record(rec) {
                Ok(model::Logged { entry: model::Entry::Event(event), .. }) => out.push(*event),
                Ok(_) => {}
                Err(err) => tracing::warn!(error = %err, "an event record that cannot be read was left out"),
            }
        }
        Ok(out)
    }

    /// [`Self::events_by_id`], reading at most `budget` bytes as stored
    /// (the record that passes it is the last read): the events, the
    /// bytes read, and whether the budget stopped the read (then some of
    /// `ids` the log holds may not be among them).
    pub(crate) async fn events_by_id_within(
        &self,
        ids: &[String],
        budget: usize,
    ) -> StoreResult<(Vec<model::Event>, usize, bool)> {
        if ids.is_empty() {
            return Ok((Vec::new(), 0, false));
        }
        let found = self.store.get_many_within(EVENTS, ids, budget).await?;
        let mut out = Vec::with_capacity(found.records.len());
        for rec in found.records {
            match model::Logged::from_record(rec) {
                Ok(model::Logged { entry: model::Entry::Event(event), .. }) => out.push(*event),
                Ok(_) => {}
                Err(err) => tracing::warn!(error = %err, "an event record that cannot be read was left out"),
            }
        }
        Ok((out, found.bytes, found.cut))
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

    /// Whether a read after `after` goes to the store on its own: the
    /// position is older than the recent reads hold (a reader at their end
    /// or with none held reads the store one at a time, for everyone).
    pub fn behind(&self, after: u64) -> bool {
        let recent = self.recent.lock().expect("recent reads");
        !recent.entries.is_empty() && after.saturating_add(1) < recent.from
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
                .limit(want)
                .within(PAGE_BYTES.saturating_sub(batch.bytes).max(1));
            let found = self.store.scan_found(EVENTS, scan).await?;
            let full = found.records.len() == want;
            batch.bytes += found.bytes;
            for rec in found.records {
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
            if found.cut {
                // The batch holds its bytes: the next read goes on.
                batch.more = true;
                break;
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
            key: None,
            actor: None,
            at: "2026-01-01T00:00:00.000Z".into(),
            data: None,
            members: None,
            left: None,
            before: None,
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

    #[tokio::test]
    async fn the_head_follows_the_log_read_from_the_last_one_seen_and_after_it_is_emptied() {
        use crate::store::doc;
        let store: DynStore = Arc::new(crate::store::memory::MemoryStore::default());
        let log = Log::new(Arc::clone(&store), Tap::default(), EventsConfig::default());
        let put = |seq: i64| {
            let store = Arc::clone(&store);
            async move { assert!(store.insert(EVENTS, doc! {"_id": format!("e{seq}"), LOG_SEQ: seq}).await.unwrap()) }
        };
        assert_eq!(log.head().await.unwrap(), 0, "an empty log");
        put(1).await;
        assert_eq!(log.head().await.unwrap(), 1);
        // Appended by another instance, out of order: the last counts.
        put(3).await;
        put(2).await;
        assert_eq!(log.head().await.unwrap(), 3);
        assert_eq!(log.head().await.unwrap(), 3, "read again from the last seen");
        // The purge empties the log: nothing from the last one seen on, so
        // the whole log is read.
        for seq in 1..=3 {
            assert!(store.delete(EVENTS, &format!("e{seq}"), doc! {}).await.unwrap());
        }
        assert_eq!(log.head().await.unwrap(), 0);
        put(1).await;
        assert_eq!(log.head().await.unwrap(), 1, "a log started over is followed from its start");
        put(7).await;
        assert_eq!(log.head().await.unwrap(), 7);
    }
}

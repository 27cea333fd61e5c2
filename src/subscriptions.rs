//! Event subscriptions (docs/design.md §5): change events as webhooks, through the
//! delivery engine of §4.
//!
//! A subscription is a record in `_subscriptions`: a destination, filters,
//! and the log position up to which its events have been turned into
//! deliveries. It starts at the end of the log when it is created, so it
//! receives the events from then on.
//!
//! The dispatcher (in every instance) reads the log after each
//! subscription's position, like any reader: in position order, never past
//! a gap that may still fill, durable events only. It records one delivery
//! per wanted event in `_deliveries`, with the id `<subscription>:<event id>`
//! (the `webhook-id`), by insert-if-absent, so instances dispatching one
//! subscription at once record each delivery once; then it moves the
//! position with a compare-and-set. A crash between the two records the
//! same deliveries again, which changes nothing.
//!
//! Per document in order: a delivery whose document has an earlier
//! delivery of the same subscription not yet final waits for it (`prev`),
//! and goes once that one is delivered or dead. Whoever sees the earlier
//! one final releases it: its sender, the dispatcher right after recording
//! (the earlier one may have finished meanwhile), or the sender's sweep.
//!
//! Deleting a subscription stops its dispatch; deliveries it left are dead
//! without an attempt.

use crate::worker::Worker;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use crate::events::ruled::RuledReader;
use crate::events::{EventType, Filter, Log, READ_BATCH, ReadError, Ready};
use crate::hooks::{DELIVERIES, Delivery, Hooks, event_key};
use crate::store::{DateTime, DynStore, Record, StoreError, StoreResult, Update, doc, scans};

/// The subscriptions collection.
pub(crate) const SUBSCRIPTIONS: &str = "_subscriptions";

/// How often the dispatcher looks for events other instances appended.
const POLL: Duration = Duration::from_millis(250);
/// How soon it looks again when a gap stopped a read.
const GAP_RETRY: Duration = Duration::from_millis(20);
/// Subscriptions read per page of a pass.
const PAGE: usize = 200;
/// Documents whose deliveries are recorded at once.
const CHAINS_AT_ONCE: usize = 32;
/// How often the subscriptions are read again (other instances' creates
/// and deletes; this instance's own at once).
const RELOAD: Duration = Duration::from_secs(1);
/// How far a subscription with nothing to deliver moves before its
/// position is written...
const PERSIST_LAG: u64 = 10_000;
/// ...or how long.
const PERSIST_EVERY: Duration = Duration::from_secs(30);

/// A subscription as stored.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
pub struct Subscription {
    #[serde(rename = "_id")]
    pub id: String,
    pub url: String,
    /// Only events about these collections; all when `None`.
    #[serde(default)]
    pub collections: Option<Vec<String>>,
    /// Only these event types; all when `None`.
    #[serde(default)]
    pub types: Option<Vec<EventType>>,
    /// Created with an API key limited to these collections: only events
    /// telling of nothing else are delivered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub within: Option<Vec<String>>,
    pub created_at: DateTime,
    /// The log position up to which its events are recorded as deliveries.
    pub position: i64,
    /// Who created it: the API key's name, or `user:<digest of issuer and
    /// subject>` for a user (none without credentials, and for
    /// subscriptions of earlier releases): each may have
    /// `TXGATE_MAX_SUBSCRIPTIONS_PER_KEY`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// Who created it, as collections' rules judge them: its events are
    /// judged as that caller's stream would judge them (none without
    /// credentials, and for subscriptions of earlier releases: they are
    /// judged by the scopes of their key alone, as then).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub caller: Option<Caller>,
}

/// The creator of a subscription, as rules judge them: a user with the
/// roles and claims of the token that created (or last renewed) it, until
/// that token's `exp`; an API key by name; or an anonymous caller.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
pub struct Caller {
    /// `user`, `key` or `anonymous`.
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sub: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iss: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub roles: Vec<String>,
    /// The token's claims, as JSON (`$auth` is not a field name MongoDB
    /// stores, and claims may hold such names).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claims: Option<String>,
    /// When the token expires: past it, the subscription pauses (no event
    /// is lost) until renewed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires: Option<DateTime>,
}

impl Caller {
    /// The caller `who`, whose credential expires at `expires`.
    pub(crate) fn of(who: &crate::rules::Principal, expires: Option<DateTime>) -> Option<Self> {
        use crate::rules::Kind;
        let kind = match who.kind {
            Kind::Open => return None,
            Kind::Key => "key",
            Kind::User => "user",
            Kind::Anonymous => "anonymous",
        };
        Some(Caller {
            kind: kind.to_owned(),
            sub: who.sub.clone(),
            iss: who.iss.clone(),
            key: who.key.clone(),
            roles: who.roles.clone(),
            claims: (!who.claims.is_empty()).then(|| serde_json::to_string(&who.claims).unwrap_or_default()),
            expires,
        })
    }

    fn principal(&self) -> crate::rules::Principal {
        use crate::rules::Kind;
        let kind = match self.kind.as_str() {
            "key" => Kind::Key,
            "user" => Kind::User,
            // Unknown kinds are judged as strictly as can be.
            _ => Kind::Anonymous,
        };
        crate::rules::Principal {
            kind,
            sub: self.sub.clone(),
            iss: self.iss.clone(),
            key: self.key.clone(),
            roles: self.roles.clone(),
            claims: self.claims.as_deref().and_then(|c| serde_json::from_str(c).ok()).unwrap_or_default(),
        }
    }
}

impl Subscription {
    pub fn from_record(record: Record) -> StoreResult<Self> {
        mongodb::bson::from_document(record).map_err(|e| StoreError::Internal(format!("bad subscription record: {e}")))
    }

    fn to_record(&self) -> Record {
        mongodb::bson::to_document(self).expect("a subscription serializes")
    }

    pub fn filter(&self) -> Filter {
        Filter {
            collections: self.collections.clone(),
            types: self.types.clone(),
            within: self.within.clone(),
            // Subscriptions deliver changes: never an `access.viewed_as` event.
            admin: Some(Vec::new()),
        }
    }

    fn position(&self) -> u64 {
        u64::try_from(self.position).unwrap_or(0)
    }
}

/// What one dispatch pass found.
#[derive(Debug, Default)]
pub struct Pass {
    /// Deliveries recorded.
    pub recorded: usize,
    /// A read stopped at a gap that may still fill.
    pub gap: bool,
    /// A read stopped with more to read.
    pub more: bool,
}

/// Why a subscription was not created.
#[derive(Debug, thiserror::Error)]
pub enum CreateError {
    /// The key has as many subscriptions as it may.
    #[error("the API key has {0} subscriptions, as many as it may")]
    Limit(usize),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// `events` as `ruled` (a subscription's creator) may see them, in order:
/// projected, `left`, or left out.
async fn judged(log: &Log, ruled: &RuledReader, events: Vec<Arc<Ready>>) -> StoreResult<Vec<Arc<Ready>>> {
    let mut out = Vec::with_capacity(events.len());
    for ready in events {
        out.extend(ruled.judge(log, &ready, None).await?);
    }
    Ok(out)
}

/// A subscription as this instance dispatches it.
struct Known {
    /// As stored (`position` as last written or read).
    sub: Subscription,
    filter: Filter,
    /// The position its events are recorded as deliveries up to, as this
    /// instance knows it: ahead of the stored one while it has had nothing
    /// to deliver ([`PERSIST_LAG`], [`PERSIST_EVERY`]).
    at: u64,
    /// When its position was last written.
    written: Instant,
    /// Its creator, whose events the rules judge (see [`Caller`]).
    ruled: Option<Arc<RuledReader>>,
}

impl Known {
    fn new(sub: Subscription, rules: &Arc<crate::rules::Rules>) -> Self {
        let ruled = sub.caller.as_ref().map(|c| Arc::new(RuledReader::new(c.principal(), Arc::clone(rules))));
        Known { filter: sub.filter(), at: sub.position(), written: Instant::now(), ruled, sub }
    }

    /// Whether the token that created it has expired: its events wait.
    fn paused(&self, now: DateTime) -> bool {
        self.sub.caller.as_ref().and_then(|c| c.expires).is_some_and(|e| e <= now)
    }
}

/// This instance's copy of the subscriptions, read again every
/// [`RELOAD`] (other instances' creates and deletes) and at once after its
/// own.
#[derive(Default)]
struct Cache {
    loaded: Option<Instant>,
    subs: Vec<Known>,
    /// Who may want an event of a collection: the subscriptions (indexes
    /// into `subs`) that name it or, limited to some collections, may see
    /// it...
    by_collection: HashMap<String, Vec<usize>>,
    /// ...and those of every collection.
    everywhere: Vec<usize>,
}

pub struct Subscriptions {
    store: DynStore,
    log: Arc<Log>,
    hooks: Arc<Hooks>,
    known: tokio::sync::Mutex<Cache>,
    /// Set by a create or delete here: read the subscriptions again.
    changed: std::sync::atomic::AtomicBool,
    /// One create at a time on this instance, so that a key's count and
    /// its new subscription are one step.
    creating: tokio::sync::Mutex<()>,
    /// Subscriptions one key may have (`TXGATE_MAX_SUBSCRIPTIONS_PER_KEY`).
    per_key: usize,
    /// Collections' rules, which judge the events of subscriptions whose
    /// creator they judge.
    rules: Arc<crate::rules::Rules>,
}

impl Subscriptions {
    pub(crate) fn new(
        store: DynStore,
        log: Arc<Log>,
        hooks: Arc<Hooks>,
        rules: Arc<crate::rules::Rules>,
        per_key: usize,
    ) -> Arc<Self> {
        Arc::new(Self {
            store,
            log,
            hooks,
            rules,
            known: tokio::sync::Mutex::default(),
            changed: std::sync::atomic::AtomicBool::new(false),
            creating: tokio::sync::Mutex::new(()),
            per_key,
        })
    }

    /// The collections' rules this instance judges by (one view of them,
    /// shared with the HTTP layer).
    pub(crate) fn rules(&self) -> Arc<crate::rules::Rules> {
        Arc::clone(&self.rules)
    }

    /// How many subscriptions the key named `key` (`None`: no keys) has.
    async fn count_of(&self, key: Option<&str>) -> StoreResult<usize> {
        let mut n = 0;
        self.each(|record| n += usize::from(record.get_str("key").ok() == key)).await?;
        Ok(n)
    }

    /// Every stored subscription record, in id order, a page at a time.
    async fn each(&self, mut f: impl FnMut(Record)) -> StoreResult<()> {
        let mut after: Option<String> = None;
        loop {
            let scan = scans::SUBSCRIPTIONS.scan(Vec::new()).after(after.as_deref()).limit(PAGE);
            let records = self.store.scan(SUBSCRIPTIONS, scan).await?;
            let full = records.len() == PAGE;
            after = records.last().and_then(crate::store::record_id).map(str::to_owned);
            records.into_iter().for_each(&mut f);
            if !full {
                return Ok(());
            }
        }
    }

    /// A new subscription to `url` for the key named `key`, receiving the
    /// events appended from now on that `filter` wants, unless the key has
    /// as many as it may already. Synced: a subscription the client was told about
    /// survives. (Creates on several instances at once can each count
    /// before the others insert: a key can end up with one more per
    /// instance creating for it at that moment.)
    pub async fn create(
        &self,
        url: String,
        filter: Filter,
        (key, caller): (Option<String>, Option<Caller>),
    ) -> Result<Subscription, CreateError> {
        let _one = self.creating.lock().await;
        let has = self.count_of(key.as_deref()).await?;
        if has >= self.per_key {
            return Err(CreateError::Limit(has));
        }
        let Filter { collections, types, within, .. } = filter;
        // The end of the log (with the events of every answer this
        // instance gave before: those are not "from now on"); after a
        // purge of all of it, the floor.
        self.log.settle().await;
        let head = self.log.head().await?.max(self.log.floor().await?);
        let position = i64::try_from(head).unwrap_or(i64::MAX);
        let sub = Subscription {
            id: uuid::Uuid::now_v7().to_string(),
            url,
            collections,
            types,
            within,
            created_at: self.hooks.clock.now(),
            position,
            key,
            caller,
        };
        if !self.store.insert(SUBSCRIPTIONS, sub.to_record()).await? {
            return Err(StoreError::Internal(format!("subscription id {} taken", sub.id)).into());
        }
        self.changed.store(true, std::sync::atomic::Ordering::SeqCst);
        tracing::info!(subscription.id = %sub.id, url = %crate::hooks::redact_url(&sub.url), position, "subscription created");
        Ok(sub)
    }

    pub async fn get(&self, id: &str) -> StoreResult<Option<Subscription>> {
        self.store.get(SUBSCRIPTIONS, id).await?.map(Subscription::from_record).transpose()
    }

    /// A page of subscriptions in id (creation) order.
    pub async fn list(&self, after: Option<&str>, limit: usize) -> StoreResult<(Vec<Subscription>, Option<String>)> {
        let scan = scans::SUBSCRIPTIONS.scan(Vec::new());
        crate::store::page(self.store.as_ref(), SUBSCRIPTIONS, scan, after, limit, Subscription::from_record).await
    }

    /// Renew subscription `id` for its creator `caller` (a fresher token):
    /// its events are judged by it from where it paused. `false`: none.
    pub async fn renew(&self, id: &str, caller: Caller) -> StoreResult<bool> {
        let caller = mongodb::bson::to_bson(&caller).expect("a caller serializes");
        let renewed = self
            .store
            .update(SUBSCRIPTIONS, id, crate::store::shape::any(), Update::set(doc! {"caller": caller}))
            .await?;
        if renewed {
            self.changed.store(true, std::sync::atomic::Ordering::SeqCst);
            tracing::info!(subscription.id = %id, "subscription renewed");
        }
        Ok(renewed)
    }

    /// Delete subscription `id` (synced); whether it existed.
    pub async fn delete(&self, id: &str) -> StoreResult<bool> {
        let gone = self.store.delete(SUBSCRIPTIONS, id, crate::store::shape::any()).await?;
        if gone {
            self.changed.store(true, std::sync::atomic::Ordering::SeqCst);
            tracing::info!(subscription.id = %id, "subscription deleted");
        }
        Ok(gone)
    }

    /// Read the subscriptions again, keeping what this instance knows of
    /// the positions of those it knew.
    async fn reload(&self, cache: &mut Cache) -> StoreResult<()> {
        self.changed.store(false, std::sync::atomic::Ordering::SeqCst);
        let mut old: HashMap<String, Known> = cache.subs.drain(..).map(|k| (k.sub.id.clone(), k)).collect();
        let mut subs = Vec::new();
        self.each(|record| {
            let id = crate::store::record_id(&record).unwrap_or_default().to_owned();
            let sub = match Subscription::from_record(record) {
                Ok(sub) => sub,
                Err(err) => {
                    tracing::warn!(subscription.id = %id, error = %err, "a subscription cannot be read; it is not dispatched");
                    return;
                }
            };
            subs.push(match old.remove(&sub.id) {
                Some(mut k) => {
                    k.at = k.at.max(sub.position());
                    if k.sub.caller != sub.caller {
                        k.ruled = Known::new(sub.clone(), &self.rules).ruled;
                    }
                    k.sub = sub;
                    k
                }
                None => Known::new(sub, &self.rules),
            });
        })
        .await?;
        let (mut by_collection, mut everywhere) = (HashMap::<String, Vec<usize>>::new(), Vec::new());
        for (i, k) in subs.iter().enumerate() {
            match k.filter.collections.as_ref().or(k.filter.within.as_ref()) {
                Some(colls) => colls.iter().for_each(|c| by_collection.entry(c.clone()).or_default().push(i)),
                None => everywhere.push(i),
            }
        }
        *cache = Cache { loaded: Some(Instant::now()), subs, by_collection, everywhere };
        Ok(())
    }

    /// One pass: one read of the log after the position of the
    /// subscription furthest behind, each event handed to the
    /// subscriptions of its collections (and those of every collection)
    /// that want it, their deliveries recorded and their positions moved.
    /// A subscription with nothing to deliver costs no write: its position
    /// moves here and is written every [`PERSIST_LAG`] positions or
    /// [`PERSIST_EVERY`]. One that fails (a delivery the store refuses) is
    /// logged and stays where it was: the others go on.
    pub async fn pass(&self) -> StoreResult<Pass> {
        let mut cache = self.known.lock().await;
        let stale = cache.loaded.is_none_or(|at| at.elapsed() >= RELOAD);
        if stale || self.changed.load(std::sync::atomic::Ordering::SeqCst) {
            self.reload(&mut cache).await?;
        }
        // A paused subscription holds no one back: it reads on from where
        // it stopped once renewed.
        let now = self.hooks.clock.now();
        let Some(from) = cache.subs.iter().filter(|k| !k.paused(now)).map(|k| k.at).min() else {
            return Ok(Pass::default());
        };
        let batch = match self.log.read(from, READ_BATCH).await {
            Ok(batch) => batch,
            Err(ReadError::Expired { floor, .. }) => {
                // Their events were purged before they could be recorded
                // (not dispatched for a whole retention): go on from the
                // oldest retained one.
                for k in cache.subs.iter_mut().filter(|k| k.at < floor) {
                    tracing::error!(subscription.id = %k.sub.id, after = k.at, floor, "events purged before their deliveries were recorded; they are lost to this subscription");
                    k.at = floor;
                    self.write_position(k).await?;
                }
                return Ok(Pass { more: true, ..Pass::default() });
            }
            Err(ReadError::Store(err)) => return Err(err),
        };
        let mut wanted: std::collections::BTreeMap<usize, Vec<Arc<Ready>>> = Default::default();
        for event in &batch.events {
            let e = &event.event;
            let mut candidates = cache.everywhere.clone();
            let colls = e.collection.iter().chain(e.members.iter().flatten().map(|m| &m.collection));
            for c in colls {
                candidates.extend(cache.by_collection.get(c.as_str()).into_iter().flatten());
            }
            candidates.sort_unstable();
            candidates.dedup();
            for i in candidates {
                let k = &cache.subs[i];
                if e.seq > k.at && k.filter.wants(e) && !k.paused(now) {
                    wanted.entry(i).or_default().push(Arc::clone(event));
                }
            }
        }
        let mut pass = Pass { gap: batch.gap, more: batch.more, ..Pass::default() };
        let mut failed = std::collections::BTreeSet::new();
        for (i, events) in wanted {
            let k = &mut cache.subs[i];
            let events = match &k.ruled {
                None => events,
                Some(ruled) => match judged(&self.log, ruled, events).await {
                    Ok(events) => events,
                    Err(err) => {
                        failed.insert(i);
                        tracing::warn!(subscription.id = %k.sub.id, error = %err, "a subscription's events could not be judged by rules; tried again next pass");
                        continue;
                    }
                },
            };
            match self.record(&k.sub, events).await {
                Ok(recorded) => {
                    pass.recorded += recorded;
                    k.at = k.at.max(batch.next);
                    self.write_position(k).await?;
                }
                Err(err) => {
                    failed.insert(i);
                    tracing::warn!(subscription.id = %k.sub.id, error = %err, "dispatch of a subscription failed; it is tried again next pass");
                }
            }
        }
        for (i, k) in cache.subs.iter_mut().enumerate() {
            if failed.contains(&i) || k.at >= batch.next || k.paused(now) {
                continue;
            }
            k.at = batch.next;
            if k.at - k.sub.position() >= PERSIST_LAG || k.written.elapsed() >= PERSIST_EVERY {
                self.write_position(k).await?;
            }
        }
        // One that failed holds the read back: wait before trying again.
        pass.more &= failed.is_empty();
        Ok(pass)
    }

    /// Record the deliveries of `events` (in position order) for `sub`.
    ///
    /// (Events judged by rules first: see [`judged`].)
    async fn record(&self, sub: &Subscription, events: Vec<Arc<Ready>>) -> StoreResult<usize> {
        // By document (a transaction's own event is its own chain), each
        // chain in position order.
        let mut chains: Vec<Vec<Arc<Ready>>> = Vec::new();
        let mut by_doc: HashMap<(String, String), usize> = HashMap::new();
        for event in events {
            match (&event.event.collection, &event.event.document) {
                (Some(c), Some(d)) => {
                    let i = *by_doc.entry((c.clone(), d.clone())).or_insert_with(|| {
                        chains.push(Vec::new());
                        chains.len() - 1
                    });
                    chains[i].push(event);
                }
                _ => chains.push(vec![event]),
            }
        }
        let recorded: Vec<usize> = futures::stream::iter(chains)
            .map(|chain| self.record_chain(sub, chain))
            .buffer_unordered(CHAINS_AT_ONCE)
            .try_collect()
            .await?;
        Ok(recorded.into_iter().sum())
    }

    /// Write `k`'s position as this instance knows it. Another instance
    /// that moved it (or a delete) meanwhile wins: the subscriptions are
    /// read again on the next pass.
    async fn write_position(&self, k: &mut Known) -> StoreResult<()> {
        k.written = Instant::now();
        if k.at <= k.sub.position() {
            return Ok(());
        }
        if self.advance(&k.sub, k.at).await? {
            k.sub.position = i64::try_from(k.at).unwrap_or(i64::MAX);
        } else {
            self.changed.store(true, std::sync::atomic::Ordering::SeqCst);
        }
        Ok(())
    }

    /// Move `sub`'s position from where it was read to `to` (unless another
    /// instance moved it, or it was deleted, meanwhile). Unsynced: it
    /// follows the deliveries it covers, and a lost move records them again.
    async fn advance(&self, sub: &Subscription, to: u64) -> StoreResult<bool> {
        /// The position a subscription has recorded deliveries up to.
        #[derive(serde::Serialize)]
        struct Position {
            position: i64,
        }
        let to = Update::fields(&Position { position: i64::try_from(to).unwrap_or(i64::MAX) });
        let from = crate::store::shape::fields(&Position { position: sub.position });
        self.store.unsynced().update(SUBSCRIPTIONS, &sub.id, from, to).await
    }

    /// Record the deliveries of one document's events (in position order).
    async fn record_chain(&self, sub: &Subscription, chain: Vec<Arc<Ready>>) -> StoreResult<usize> {
        let mut recorded = 0;
        // The delivery before the next one, and whether it is final.
        let mut before: Option<(String, bool)> = None;
        for event in chain {
            let at = self.hooks.clock.now();
            let key = event_key(&sub.id, &event.event);
            if before.is_none() {
                if let (Some(key), Ok(seq)) = (&key, i64::try_from(event.event.seq)) {
                    before = self.hooks.last_of_key(key, seq).await?.map(|d| (d.id, d.status.is_final()));
                }
            }
            let waits_for = before.as_ref().filter(|(_, fin)| !fin).map(|(id, _)| id.clone());
            let d = Delivery::of_event(&sub.id, &sub.url, &event, waits_for.clone(), at);
            // Insert-if-absent: another instance may have recorded it.
            // Unsynced: the position that covers it is written after it.
            if self.store.unsynced().insert(DELIVERIES, d.to_record()).await? {
                recorded += 1;
                match &waits_for {
                    // The one before may have become final meanwhile.
                    Some(prev) if self.hooks.is_final(prev).await? => {
                        self.hooks.release(&d.id).await?;
                    }
                    Some(_) => {}
                    None => self.hooks.queue.push(&d.id, at.timestamp_millis()),
                }
            } else if let Some(stored) = self.hooks.store.get(DELIVERIES, &d.id).await? {
                // Recorded already (by another instance, or by a pass that
                // failed before its position moved), perhaps still waiting
                // for one that is final by now: release it here rather
                // than leave it to the sweep.
                let stored = Delivery::from_record(stored)?;
                if stored.next_at == crate::hooks::AFTER_PREVIOUS
                    && stored.status == crate::hooks::DeliveryStatus::Pending
                {
                    let free = match &stored.prev {
                        Some(prev) => self.hooks.is_final(prev).await?,
                        None => true,
                    };
                    if free {
                        self.hooks.release(&d.id).await?;
                    }
                }
            }
            before = key.is_some().then_some((d.id, false));
        }
        Ok(recorded)
    }
}

#[async_trait::async_trait]
impl Worker for Subscriptions {
    fn name(&self) -> &'static str {
        "subscriptions"
    }

    /// Passes until one has no more to read.
    async fn run_once(&self) -> StoreResult<()> {
        while self.pass().await?.more {}
        Ok(())
    }

    /// Record the deliveries of every subscription's new events until
    /// `stop`: at once for this process's appends, every [`POLL`] for other
    /// instances'.
    async fn run(self: Arc<Self>, stop: CancellationToken) {
        let mut appended = self.log.subscribe();
        let mut failures = 0u32;
        while !stop.is_cancelled() {
            // Appends from here on wake the wait below.
            appended.borrow_and_update();
            let wait = match self.pass().await {
                Ok(pass) => {
                    failures = 0;
                    if pass.more {
                        continue;
                    }
                    if pass.gap { GAP_RETRY } else { POLL }
                }
                Err(err) => {
                    failures += 1;
                    tracing::warn!(error = %err, "dispatch of subscription events failed; retrying");
                    Duration::from_millis(100) * (1 << failures.min(5))
                }
            };
            tokio::select! {
                () = stop.cancelled() => {}
                _ = appended.changed(), if failures == 0 => {}
                () = tokio::time::sleep(wait) => {}
            }
        }
    }
}

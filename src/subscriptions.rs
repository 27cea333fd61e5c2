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
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

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
}

impl Subscription {
    pub fn from_record(record: Record) -> StoreResult<Self> {
        mongodb::bson::from_document(record).map_err(|e| StoreError::Internal(format!("bad subscription record: {e}")))
    }

    fn to_record(&self) -> Record {
        mongodb::bson::to_document(self).expect("a subscription serializes")
    }

    pub fn filter(&self) -> Filter {
        Filter { collections: self.collections.clone(), types: self.types.clone(), within: self.within.clone() }
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

pub struct Subscriptions {
    store: DynStore,
    log: Arc<Log>,
    hooks: Arc<Hooks>,
}

impl Subscriptions {
    pub fn new(store: DynStore, log: Arc<Log>, hooks: Arc<Hooks>) -> Arc<Self> {
        Arc::new(Self { store, log, hooks })
    }

    /// A new subscription to `url`, receiving the events appended from now
    /// on that `filter` wants. Synced: a subscription the client was told
    /// about survives.
    pub async fn create(&self, url: String, filter: Filter) -> StoreResult<Subscription> {
        let Filter { collections, types, within } = filter;
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
        };
        if !self.store.insert(SUBSCRIPTIONS, sub.to_record()).await? {
            return Err(StoreError::Internal(format!("subscription id {} taken", sub.id)));
        }
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

    /// Delete subscription `id` (synced); whether it existed.
    pub async fn delete(&self, id: &str) -> StoreResult<bool> {
        let gone = self.store.delete(SUBSCRIPTIONS, id, crate::store::shape::any()).await?;
        if gone {
            tracing::info!(subscription.id = %id, "subscription deleted");
        }
        Ok(gone)
    }

    /// One pass over every subscription. One that fails (a record it
    /// cannot read, a delivery the store refuses) is logged and passed
    /// over: the others go on.
    pub async fn pass(&self) -> StoreResult<Pass> {
        let mut pass = Pass::default();
        let mut after: Option<String> = None;
        loop {
            let scan = scans::SUBSCRIPTIONS.scan(Vec::new()).after(after.as_deref()).limit(PAGE);
            let records = self.store.scan(SUBSCRIPTIONS, scan).await?;
            let full = records.len() == PAGE;
            after = records.last().and_then(crate::store::record_id).map(str::to_owned);
            for record in records {
                let id = crate::store::record_id(&record).unwrap_or_default().to_owned();
                let step = match Subscription::from_record(record) {
                    Ok(sub) => self.dispatch(&sub).await,
                    Err(err) => Err(err),
                };
                match step {
                    Ok(step) => {
                        pass.recorded += step.recorded;
                        pass.gap |= step.gap;
                        pass.more |= step.more;
                    }
                    Err(err) => {
                        tracing::warn!(subscription.id = %id, error = %err, "dispatch of a subscription failed; it is tried again next pass");
                    }
                }
            }
            if !full {
                return Ok(pass);
            }
        }
    }

    /// Record the deliveries of `sub`'s events after its position (one
    /// read's worth), then move its position past them.
    pub async fn dispatch(&self, sub: &Subscription) -> StoreResult<Pass> {
        let batch = match self.log.read(sub.position(), READ_BATCH).await {
            Ok(batch) => batch,
            Err(ReadError::Expired { after, floor }) => {
                // Its events were purged before they could be recorded (it
                // was not dispatched for a whole retention): go on from the
                // oldest retained one.
                tracing::error!(subscription.id = %sub.id, after, floor, "events purged before their deliveries were recorded; they are lost to this subscription");
                self.advance(sub, floor).await?;
                return Ok(Pass { more: true, ..Pass::default() });
            }
            Err(ReadError::Store(err)) => return Err(err),
        };
        let filter = sub.filter();
        // The wanted events, by document (a transaction's own event is its
        // own chain), each chain in position order.
        let mut chains: Vec<Vec<Arc<Ready>>> = Vec::new();
        let mut by_doc: HashMap<(String, String), usize> = HashMap::new();
        for event in batch.events.into_iter().filter(|r| filter.wants(&r.event)) {
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
        if batch.next > sub.position() {
            self.advance(sub, batch.next).await?;
        }
        Ok(Pass { recorded: recorded.into_iter().sum(), gap: batch.gap, more: batch.more })
    }

    /// Move `sub`'s position from where it was read to `to` (unless another
    /// instance moved it, or it was deleted, meanwhile). Unsynced: it
    /// follows the deliveries it covers, and a lost move records them again.
    async fn advance(&self, sub: &Subscription, to: u64) -> StoreResult<()> {
        /// The position a subscription has recorded deliveries up to.
        #[derive(serde::Serialize)]
        struct Position {
            position: i64,
        }
        let to = Update::fields(&Position { position: i64::try_from(to).unwrap_or(i64::MAX) });
        let from = crate::store::shape::fields(&Position { position: sub.position });
        self.store.unsynced().update(SUBSCRIPTIONS, &sub.id, from, to).await?;
        Ok(())
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

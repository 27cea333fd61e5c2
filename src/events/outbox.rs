//! A single-document write's event on its way to the log: the document
//! carries it in its outbox until it is appended.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;

use super::EVENTS;
use crate::clock::Clock;
use crate::document::StoredDoc;
use crate::follow_ups::{FollowUps, Ticket};
use crate::rules::Rules;
use crate::store::{DateTime, Document, DynStore, Record, Store, StoreError, StoreResult, Write};

/// Make sure the event `doc` holds in its outbox is in the log, then clear
/// the outbox (unless the document moved on). Readers never call this;
/// writers do before they write a document that has one, and recovery for
/// any a crash left behind.
pub(crate) async fn publish_outbox(store: &dyn Store, coll: &str, doc: &StoredDoc, at: DateTime) -> StoreResult<()> {
    let Some(outbox) = &doc.meta.outbox else { return Ok(()) };
    let (record, filter) = entry(coll, &doc.id, doc.meta.v, outbox, at)?;
    let chain = vec![
        (EVENTS, Write::Append(record)),
        (coll, Write::Update { id: &doc.id, filter: filter.clone(), update: StoredDoc::clear_outbox() }),
    ];
    if store.unsynced().in_order(chain).await? == 0 {
        // It was in the log already: only the outbox is left to clear.
        store.unsynced().update(coll, &doc.id, filter, StoredDoc::clear_outbox()).await?;
    }
    Ok(())
}

/// The log record of `event`, the outbox of `coll`/`id` at version `v`,
/// logged at `at`; and the filter that clears that outbox only while the
/// document still holds it.
pub fn entry(coll: &str, id: &str, v: i64, event: &Document, at: DateTime) -> StoreResult<(Record, Document)> {
    let Ok(eid) = event.get_str("_id") else {
        return Err(StoreError::Internal(format!("{coll}/{id}: outbox without an event id")));
    };
    let filter = StoredDoc::outbox_filter(v, eid);
    let mut record = event.clone();
    record.insert("logged_at", at);
    Ok((record, filter))
}

/// Events of one batch at most: one append of the batch, then its
/// outboxes cleared side by side.
const BATCH: usize = 256;

/// The events of this instance's single-document writes on their way
/// from their outboxes to the log after the answer, in the order the
/// writes were answered: a client that writes one document and then
/// another finds their events in that order. Queued writes are appended
/// in batches by one drain at a time (a group commit: an append of many
/// events costs the round trips of one), each a settled follow-up
/// ([`crate::follow_ups`]). A batch that fails is left in its outboxes,
/// for the next writer of each document or the recovery sweep.
pub(crate) struct Publisher {
    store: DynStore,
    clock: Clock,
    follow_ups: FollowUps,
    /// Collections' rules: what each event keeps of the document before.
    rules: Arc<Rules>,
    queue: Mutex<Queue>,
    /// How many queued events the drain has dealt with (appended, or
    /// failed and left in their outboxes).
    done: watch::Sender<u64>,
}

#[derive(Default)]
struct Queue {
    waiting: Vec<Queued>,
    /// Events queued so far.
    queued: u64,
    /// Whether a drain is running.
    draining: bool,
}

/// A queued event: where its document is, at which version, and the
/// event itself (the document's data is not kept twice).
struct Queued {
    coll: String,
    id: String,
    v: i64,
    event: Document,
    _ticket: Ticket,
}

/// Events queued at most before a writer waits for the queue to drain
/// (when appends fall behind writes, writes slow down to their pace
/// rather than let the queue, which holds whole documents, grow).
const MAX_QUEUED: usize = 4 * BATCH;

impl Publisher {
    pub(crate) fn new(store: DynStore, clock: Clock, follow_ups: FollowUps, rules: Arc<Rules>) -> Arc<Self> {
        Arc::new(Self { store, clock, follow_ups, rules, queue: Mutex::default(), done: watch::Sender::new(0) })
    }

    /// The top-level fields a change event of `coll` keeps of the
    /// document before the change (`None`: nothing; no rules).
    pub(crate) async fn named(&self, coll: &str) -> StoreResult<Option<Arc<BTreeSet<String>>>> {
        self.rules.named(coll).await
    }

    /// See [`FollowUps::writing`].
    pub(crate) async fn writing(&self) -> crate::follow_ups::Writing {
        self.follow_ups.writing().await
    }

    /// Queue the event `doc` (as just written to `coll`) holds in its
    /// outbox. `true` when the queue is as long as it may be: the caller
    /// then waits for it ([`Publisher::flush`]) before it answers.
    pub(crate) fn publish(self: &Arc<Self>, coll: &str, doc: StoredDoc) -> bool {
        let Some(event) = doc.meta.outbox else { return false };
        let (id, v) = (doc.id, doc.meta.v);
        let queued = Queued { coll: coll.to_owned(), id, v, event, _ticket: self.follow_ups.ticket() };
        let mut queue = self.queue.lock().expect("outbox queue");
        queue.waiting.push(queued);
        queue.queued += 1;
        if !queue.draining {
            queue.draining = true;
            let me = Arc::clone(self);
            self.follow_ups.spawn(async move { me.drain().await });
        }
        queue.waiting.len() >= MAX_QUEUED
    }

    /// Wait (at most `max`) until every event queued before this call is
    /// dealt with.
    pub(crate) async fn flush(&self, max: Duration) {
        let upto = self.queue.lock().expect("outbox queue").queued;
        let mut done = self.done.subscribe();
        let _ = tokio::time::timeout(max, done.wait_for(|n| *n >= upto)).await;
    }

    async fn drain(&self) {
        loop {
            let batch: Vec<Queued> = {
                let mut queue = self.queue.lock().expect("outbox queue");
                if queue.waiting.is_empty() {
                    queue.draining = false;
                    return;
                }
                let n = queue.waiting.len().min(BATCH);
                queue.waiting.drain(..n).collect()
            };
            if let Err(err) = self.append(&batch).await {
                tracing::warn!(
                    events = batch.len(), error = %err,
                    "could not move written documents' events to the log; their next writers or the recovery sweep will"
                );
            }
            self.done.send_modify(|n| *n += batch.len() as u64);
        }
    }

    /// Append the events of `batch` in its order, then clear its outboxes
    /// (unless a document moved on meanwhile).
    async fn append(&self, batch: &[Queued]) -> StoreResult<()> {
        let at = self.clock.now();
        let mut records = Vec::with_capacity(batch.len());
        let mut clears = Vec::with_capacity(batch.len());
        for q in batch {
            let (record, filter) = entry(&q.coll, &q.id, q.v, &q.event, at)?;
            records.push(record);
            clears.push((q.coll.as_str(), q.id.as_str(), filter));
        }
        self.store.append_all(EVENTS, records).await?;
        let unsynced = self.store.unsynced();
        let cleared =
            clears.into_iter().map(|(coll, id, filter)| unsynced.update(coll, id, filter, StoredDoc::clear_outbox()));
        for result in futures::future::join_all(cleared).await {
            result?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::EventType;
    use crate::events::model::document_event;
    use crate::store::memory::MemoryStore;
    use crate::store::{doc, scans::EVENTS_BY_SEQ};

    #[tokio::test]
    async fn queued_events_reach_the_log_in_queue_order_and_their_outboxes_clear() {
        let store: DynStore = Arc::new(MemoryStore::default());
        crate::migrate::run(store.as_ref()).await.unwrap();
        let follow_ups = FollowUps::default();
        let rules = crate::rules::Rules::new(Arc::clone(&store), Clock::System);
        let publisher = Publisher::new(Arc::clone(&store), Clock::System, follow_ups.clone(), rules);
        let at = DateTime::now();
        let ids = ["b", "a", "c"];
        for id in ids {
            let mut doc = StoredDoc::new_live(id.into(), doc! {"n": 1_i64}, 1, 1, at);
            doc.meta.outbox = Some(document_event(EventType::Created, "c", &doc, None, None, None, at));
            assert!(store.insert("c", doc.to_record()).await.unwrap());
            assert!(!publisher.publish("c", doc), "no backlog");
        }
        assert!(follow_ups.settle(Duration::from_secs(5)).await);
        let logged = store.scan(EVENTS, EVENTS_BY_SEQ.scan(Vec::new())).await.unwrap();
        let logged: Vec<&str> = logged.iter().filter_map(|r| r.get_str("_id").ok()).collect();
        assert_eq!(logged, vec!["c/b/1", "c/a/1", "c/c/1"], "in the order queued");
        for id in ids {
            let doc = StoredDoc::from_record(store.get("c", id).await.unwrap().unwrap()).unwrap();
            assert!(doc.meta.outbox.is_none(), "{id}: the outbox is cleared");
        }
        // Queued again (a retry after a crash): logged once.
        let mut doc = StoredDoc::from_record(store.get("c", "a").await.unwrap().unwrap()).unwrap();
        doc.meta.outbox = Some(document_event(EventType::Created, "c", &doc, None, None, None, at));
        publisher.publish("c", doc);
        publisher.flush(Duration::from_secs(5)).await;
        assert_eq!(store.scan(EVENTS, EVENTS_BY_SEQ.scan(Vec::new())).await.unwrap().len(), 3);
    }
}

//! The log's purge: positions past their retention go, oldest first,
//! behind a floor that moves first; tombstones past theirs go too; and the
//! worker that runs both.

use std::sync::Arc;
use std::time::Duration;

use super::model::document_event_id;
use super::{EVENTS, FLOOR, Log, Logged, STATE, counter};
use crate::document::StoredDoc;
use crate::store::{Bound, Bson, DateTime, StoreResult};

impl Log {
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
            let deletes =
                ids.iter().map(|id| async move { unsynced.delete(EVENTS, id, crate::store::shape::any()).await });
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
pub(crate) struct Purge {
    pub log: Arc<Log>,
    pub interval: Duration,
}

#[async_trait::async_trait]
impl crate::worker::Worker for Purge {
    fn name(&self) -> &'static str {
        "event_purge"
    }

    /// The log's purge, then the tombstones' (each tried, as in `run`).
    async fn run_once(&self) -> crate::store::StoreResult<()> {
        let events = self.log.purge().await;
        let tombstones = self.log.purge_tombstones().await;
        events?;
        tombstones.map(|_| ())
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
                // A tombstone whose deletion event the log still holds
                // stays (that event is its document's newest; the log is
                // purged oldest first): the retention alone cannot promise
                // it, as an event is logged a little after its write.
                let last_events: Vec<(&str, String)> = batch
                    .iter()
                    .filter_map(|record| {
                        let id = crate::store::record_id(record)?;
                        let version = StoredDoc::from_record(record.clone()).ok()?.meta.v;
                        Some((id, document_event_id(&coll, id, version)))
                    })
                    .collect();
                let ids: Vec<String> = last_events.iter().map(|(_, event)| event.clone()).collect();
                let held: std::collections::HashSet<String> = self
                    .store
                    .get_many(EVENTS, &ids)
                    .await?
                    .iter()
                    .filter_map(crate::store::record_id)
                    .map(str::to_owned)
                    .collect();
                let unsynced = self.store.unsynced();
                let unsynced = &unsynced;
                let deletes = last_events.iter().filter(|(_, event)| !held.contains(event)).map(|(id, _)| {
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

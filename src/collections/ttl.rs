//! The TTL sweeper (docs/design.md §5): in every instance, every
//! `TXGATE_TTL_INTERVAL_MS`, each collection with a policy loses the live
//! documents the policy no longer admits, through the same compare-and-set
//! as any single-document delete: a document a transaction holds is
//! skipped until it is free, and each expired document leaves a tombstone
//! and a `document.expired` event.
//!
//! - **Maximum age**: the live documents created before `now − max_age`,
//!   oldest first, along the index of live documents by creation time.
//! - **Maximum count**: the live documents created strictly before the
//!   `max_count`-th newest, found by one read of that index that passes
//!   over the newest `max_count - 1` entries, then read newest first below
//!   its creation time. A document is expired only when `max_count` live
//!   documents created no earlier than it existed when it was found, so
//!   instances sweeping at once never leave fewer than `max_count`, even
//!   where documents created in one millisecond tie (those at the cut all
//!   stay until a newer document moves it).
//!   The scan is made only when the collection's live count says there
//!   are more than `max_count`: a collection within its limit costs one
//!   read per pass, however many documents it holds.
//!
//! Both go in batches of [`BATCH`], repeated while a batch comes back
//! full and something in it went; each batch's deletes go together (one
//! synced group commit on the embedded store).

use crate::worker::Worker;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::{COLLECTIONS, Collection, Collections, Policy, age_cutoff};
use crate::clock::Clock;
use crate::document::StoredDoc;
use crate::documents::{DocError, Documents};
use crate::metrics::Metrics;
use crate::store::scans::{COLLECTIONS_EXPIRING, DOCS_BY_AGE};
use crate::store::{BATCH, Bound, Bson, DateTime, Scan, StoreResult};

/// Collections with a policy read per page of a pass.
const POLICY_PAGE: usize = 100;

pub struct Sweeper {
    collections: Arc<Collections>,
    documents: Arc<Documents>,
    metrics: Arc<Metrics>,
    clock: Clock,
    interval: Duration,
}

impl Sweeper {
    pub fn new(
        collections: Arc<Collections>,
        documents: Arc<Documents>,
        metrics: Arc<Metrics>,
        clock: Clock,
        interval: Duration,
    ) -> Self {
        Self { collections, documents, metrics, clock, interval }
    }

    /// One pass over every collection with a policy; returns how many
    /// documents expired. A collection whose sweep fails is logged and
    /// passed over; the others go on.
    pub async fn pass(&self) -> StoreResult<usize> {
        self.collections.count_changes().await?;
        let store = self.collections.store();
        let mut expired = 0;
        let mut after: Option<String> = None;
        loop {
            let scan = COLLECTIONS_EXPIRING.scan(vec![Bson::Boolean(true)]);
            let (page, next) =
                crate::store::page(store.as_ref(), COLLECTIONS, scan, after.as_deref(), POLICY_PAGE, |r| {
                    Ok(Collection::from_record(&r))
                })
                .await?;
            for coll in page {
                let Some(policy) = coll.ttl else { continue };
                match self.sweep(&coll, policy).await {
                    Ok(n) => expired += n,
                    Err(err) => {
                        tracing::warn!(collection = %coll.name, error = %err, "TTL sweep of a collection failed")
                    }
                }
            }
            match next {
                Some(next) => after = Some(next),
                None => return Ok(expired),
            }
        }
    }

    /// Expire what `policy` no longer admits in `coll`.
    async fn sweep(&self, coll: &Collection, policy: Policy) -> Result<usize, DocError> {
        let live = || DOCS_BY_AGE.scan(vec![Bson::Boolean(false)]).from(Bound::Included(Bson::DateTime(DateTime::MIN)));
        let mut by_age = 0;
        // By age, what a batch read and left (records that are not
        // documents, ones a transaction holds) is skipped by the pass's next
        // read, so a batch of them cannot keep it from those behind them.
        if let Some(cutoff) = age_cutoff(&policy, self.clock.now()) {
            let mut left = 0;
            loop {
                let scan = live().to(Bound::Excluded(Bson::DateTime(cutoff))).skip(left);
                let (went, read) = self.expire(&coll.name, scan, "age").await?;
                by_age += went;
                left += read - went;
                if read < BATCH {
                    break;
                }
            }
        }
        let mut by_count = 0;
        if let Some(max) = policy.max_count {
            // The count as folded at the start of the pass, less what went
            // by age since: whether anything may lie beyond the limit.
            if coll.count.saturating_sub(by_age as u64) > max {
                let beyond = usize::try_from(max).unwrap_or(usize::MAX);
                // The creation time of the `max`-th newest live document:
                // only what is strictly older goes. Documents created in
                // one millisecond tie, and a store need not hand tied
                // entries out in one order to every scan (DocumentDB does
                // not), so two sweepers cutting at the `max`-th entry could
                // each keep a different one of two tied documents and
                // expire the other; cutting below the time keeps both.
                let nth = live().desc().skip(beyond.saturating_sub(1)).limit(1);
                let boundary = self.collections.store().scan(&coll.name, nth).await?;
                let boundary =
                    boundary.first().and_then(|r| r.get_document("_meta").ok()?.get_datetime("created_at").ok());
                if let Some(boundary) = boundary {
                    // What a batch left (held by a transaction, expired by
                    // another instance) is skipped by the next read.
                    let mut left = 0;
                    loop {
                        let scan = live().desc().to(Bound::Excluded(Bson::DateTime(*boundary))).skip(left);
                        let (went, read) = self.expire(&coll.name, scan, "count").await?;
                        by_count += went;
                        left += read - went;
                        if read < BATCH {
                            break;
                        }
                    }
                }
            }
        }
        if by_age + by_count > 0 {
            tracing::debug!(collection = %coll.name, by_age, by_count, "documents expired");
        }
        Ok(by_age + by_count)
    }

    /// Expire the documents of one batch of `scan`: how many went, and how
    /// many records the batch read (a full batch: [`BATCH`]).
    async fn expire(&self, coll: &str, scan: Scan, why: &str) -> Result<(usize, usize), DocError> {
        let records = self.collections.store().scan(coll, scan.limit(BATCH)).await?;
        let read = records.len();
        // A record that is not a document as the gateway writes them
        // (another tool's) is skipped and reported, not a stop of the pass.
        let docs: Vec<StoredDoc> = records
            .into_iter()
            .filter_map(|rec| {
                let id = crate::store::record_id(&rec).unwrap_or("?").to_owned();
                StoredDoc::from_record(rec)
                    .map_err(|e| {
                        crate::store::report_unreadable(&crate::store::StoreError::Undecodable(format!(
                            "{coll}/{id}: {e}"
                        )))
                    })
                    .ok()
            })
            .collect();
        let mut went = 0;
        for done in futures::future::join_all(docs.iter().map(|d| self.documents.expire(coll, d))).await {
            went += usize::from(done?);
        }
        self.metrics.add(&crate::metrics::TTL_DELETIONS, why, went as u64);
        Ok((went, read))
    }
}

#[async_trait::async_trait]
impl Worker for Sweeper {
    fn name(&self) -> &'static str {
        "ttl"
    }

    async fn run_once(&self) -> StoreResult<()> {
        self.pass().await.map(|_| ())
    }

    /// A pass every `interval` (from the start of one to the start of the
    /// next; a pass that takes longer delays the next) until `stop`; the
    /// pass under way finishes.
    async fn run(self: Arc<Self>, stop: CancellationToken) {
        let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + self.interval, self.interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                _ = ticks.tick() => {}
            }
            match self.pass().await {
                Ok(0) => {}
                Ok(n) => tracing::debug!(expired = n, "TTL pass"),
                Err(err) => tracing::warn!(error = %err, "TTL pass failed; retrying next interval"),
            }
        }
    }
}

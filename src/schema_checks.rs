//! The documents of a collection that do not satisfy its current schemas,
//! found by a background pass (docs/guides/validation.md, "Existing
//! documents"): one per collection after each change of its schemas (or
//! when an admin asks again), run by the instance holding its lease,
//! in batches, its progress and findings (capped) kept in `_schema_checks`.
//! A pass whose instance stopped is taken over once its lease runs out
//! (at once on the embedded store's next opening).

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;
use utoipa::ToSchema;

use crate::clock::Clock;
use crate::documents::{DocError, Documents};
use crate::schemas::{SCHEMAS, Schemas, Violation};
use crate::store::{DateTime, DynStore, StoreError, StoreResult, Update, scans};

/// The collection of violations passes.
pub(crate) const CHECKS: &str = "_schema_checks";
const FORMAT: i32 = 1;
/// The documents a pass keeps, at most; the others are counted.
pub(crate) const MAX_FOUND: usize = 100;
/// The errors it keeps of one document.
const MAX_ERRORS_EACH: usize = 10;
/// Documents read per batch.
const BATCH: usize = 200;
/// How long a pass's lease lasts without renewal.
const LEASE: Duration = Duration::from_secs(30);

/// The state of a collection's pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub(crate) enum PassState {
    /// The schemas changed (or a pass was asked for) and no pass has started.
    Waiting,
    Running,
    Done,
}

/// A document that does not satisfy the schema of its version.
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema)]
pub(crate) struct Found {
    #[schema(example = "order-17")]
    pub id: String,
    pub schema_version: i64,
    /// Its first errors (10 at most).
    pub errors: Vec<Violation>,
}

/// A pass's record.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct Check {
    #[serde(rename = "_id")]
    pub collection: String,
    pub v: i32,
    /// Moves on with every write: the compare-and-set of the next.
    pub n: i64,
    /// The schemas' `schemas_seq` it checks against.
    pub seq: i64,
    pub state: PassState,
    #[serde(default)]
    pub owner: Option<String>,
    #[serde(default)]
    pub lease_until: Option<DateTime>,
    /// The last id checked.
    #[serde(default)]
    pub after: Option<String>,
    pub scanned: i64,
    pub invalid: i64,
    pub found: Vec<Found>,
    pub started_at: DateTime,
    #[serde(default)]
    pub finished_at: Option<DateTime>,
}

/// The worker running passes.
pub(crate) struct Checks {
    pub store: DynStore,
    pub schemas: Arc<Schemas>,
    pub documents: Arc<Documents>,
    pub clock: Clock,
    pub owner: String,
    pub interval: Duration,
    /// Held for a whole pass: this instance runs one at a time, so a pass
    /// asked for while the timed one runs (`run_once`) waits for it and
    /// then finds its work done, instead of racing it on the same record.
    pub busy: tokio::sync::Mutex<()>,
}

/// `coll`'s pass as stored (`None`: none yet). One that cannot be read
/// is reported and treated as none (a new pass replaces it).
pub(crate) async fn read(store: &DynStore, coll: &str) -> StoreResult<Option<Check>> {
    let Some(record) = store.get(CHECKS, coll).await? else { return Ok(None) };
    match mongodb::bson::from_document::<Check>(record) {
        Ok(c) if c.v == FORMAT => Ok(Some(c)),
        other => {
            let why = other.map_or_else(|e| e.to_string(), |c| format!("format {} is not {FORMAT}", c.v));
            crate::store::report_unreadable(&StoreError::Undecodable(format!("{CHECKS}/{coll}: {why}")));
            Ok(None)
        }
    }
}

/// Ask for a new pass over `coll` (its findings forgotten).
pub(crate) async fn again(store: &DynStore, coll: &str) -> StoreResult<()> {
    store.delete(CHECKS, coll, crate::store::shape::any()).await?;
    Ok(())
}

impl Checks {
    /// One pass over every collection whose schemas changed since its
    /// last pass, each run to its end here unless another instance holds it.
    async fn pass(&self, stop: &CancellationToken) -> StoreResult<()> {
        let _one = self.busy.lock().await;
        let mut after: Option<String> = None;
        loop {
            let scan =
                scans::SCHEMAS.scan(Vec::new()).after(after.as_deref()).limit(100).fields(&["_id", "schemas_seq"]);
            let page = self.store.scan(SCHEMAS, scan).await?;
            let full = page.len() == 100;
            for record in page {
                let Ok(coll) = record.get_str("_id").map(str::to_owned) else { continue };
                after = Some(coll.clone());
                let Ok(seq) = record.get_i64("schemas_seq") else { continue };
                if stop.is_cancelled() {
                    return Ok(());
                }
                if let Err(err) = self.check(&coll, seq, stop).await {
                    tracing::warn!(collection = coll, error = %err, "schema violations pass failed; it goes on later");
                }
            }
            if !full {
                return Ok(());
            }
        }
    }

    /// Run `coll`'s pass against schemas `seq` if it is due and free.
    async fn check(&self, coll: &str, seq: i64, stop: &CancellationToken) -> Result<(), DocError> {
        let now = self.clock.now();
        let existing = read(&self.store, coll).await?;
        if let Some(c) = &existing {
            let current = c.seq == seq;
            if current && c.state == PassState::Done {
                return Ok(());
            }
            let held = c.state == PassState::Running
                && c.owner.as_deref() != Some(self.owner.as_str())
                && c.lease_until.is_some_and(|u| u > now)
                && !self.opened_before(c.owner.as_deref());
            if current && held {
                return Ok(());
            }
        }
        let mut check = Check {
            collection: coll.to_owned(),
            v: FORMAT,
            n: existing.as_ref().map_or(0, |c| c.n) + 1,
            seq,
            state: PassState::Running,
            owner: Some(self.owner.clone()),
            lease_until: Some(lease_end(now)),
            after: None,
            scanned: 0,
            invalid: 0,
            found: Vec::new(),
            started_at: now,
            finished_at: None,
        };
        // Resumed where it was, when it is this pass's, against these schemas.
        if let Some(c) = existing.as_ref().filter(|c| c.seq == seq && c.state == PassState::Running) {
            (check.after, check.scanned, check.invalid) = (c.after.clone(), c.scanned, c.invalid);
            (check.found, check.started_at) = (c.found.clone(), c.started_at);
        }
        if !self.save(&check, existing.as_ref().map(|c| c.n)).await? {
            return Ok(());
        }
        tracing::info!(collection = coll, seq, "schema violations pass started");
        loop {
            if stop.is_cancelled() {
                return Ok(());
            }
            let known = self.schemas.of(coll).await?;
            if known.schemas_seq != seq {
                // The schemas changed: the next pass starts over.
                return Ok(());
            }
            let started = Instant::now();
            let at = crate::documents::ReadAt::Now;
            let (items, next) = self.documents.list_at(&at, coll, check.after.as_deref(), BATCH).await?;
            for item in items {
                let live = match item.into_live() {
                    Ok(live) => live,
                    Err(err) => {
                        self.documents.skip_unreadable(err)?;
                        continue;
                    }
                };
                check.scanned += 1;
                check.after = Some(live.id.clone());
                if let Some(refusal) = known.violations(coll, live.schema_version, &live.data) {
                    check.invalid += 1;
                    if check.found.len() < MAX_FOUND {
                        let mut errors = refusal.violations;
                        errors.truncate(MAX_ERRORS_EACH);
                        check.found.push(Found { id: live.id, schema_version: live.schema_version, errors });
                    }
                }
            }
            let previous = check.n;
            check.n += 1;
            let now = self.clock.now();
            check.lease_until = Some(lease_end(now));
            if next.is_none() {
                check.state = PassState::Done;
                check.finished_at = Some(now);
            }
            if !self.save(&check, Some(previous)).await? {
                return Ok(());
            }
            if next.is_none() {
                tracing::info!(
                    collection = coll,
                    seq,
                    scanned = check.scanned,
                    invalid = check.invalid,
                    "schema violations pass done"
                );
                return Ok(());
            }
            // At most half the time: writes go on meanwhile.
            tokio::select! {
                () = stop.cancelled() => return Ok(()),
                () = tokio::time::sleep(started.elapsed()) => {}
            }
        }
    }

    /// Write `check` if the record is still at `n` (`None`: absent).
    async fn save(&self, check: &Check, n: Option<i64>) -> StoreResult<bool> {
        let doc = mongodb::bson::to_document(check).expect("a check serializes");
        match n {
            None => self.store.insert(CHECKS, doc).await,
            Some(n) => {
                let mut set = doc;
                set.remove("_id");
                let filter = mongodb::bson::doc! {"n": n};
                self.store.update(CHECKS, &check.collection, filter, Update { set, unset: Vec::new() }).await
            }
        }
    }

    /// Whether `owner` took its lease under an earlier opening of this
    /// store (it is gone: this process holds the store now).
    fn opened_before(&self, owner: Option<&str>) -> bool {
        let Some(opening) = self.store.opening() else { return false };
        owner.is_some_and(|o| !o.starts_with(&format!("{opening}.")))
    }
}

fn lease_end(now: DateTime) -> DateTime {
    DateTime::from_millis(now.timestamp_millis().saturating_add(LEASE.as_millis() as i64))
}

#[async_trait::async_trait]
impl crate::worker::Worker for Checks {
    fn name(&self) -> &'static str {
        "schema_violations"
    }

    async fn run_once(&self) -> StoreResult<()> {
        self.pass(&CancellationToken::new()).await
    }

    async fn run(self: Arc<Self>, stop: CancellationToken) {
        loop {
            if let Err(err) = self.pass(&stop).await {
                tracing::warn!(error = %err, "schema violations pass failed; retrying");
            }
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(self.interval) => {}
            }
        }
    }
}

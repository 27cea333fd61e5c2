//! Post-commit hooks (docs/design.md §4): the delivery records a committed
//! transaction leaves in `_deliveries`, and the destination guard.
//!
//! Deliveries are recorded during roll-forward, before any lock of the
//! transaction is released, by insert-if-absent under deterministic ids
//! (`<txn>:<index>`), with payload and headers fixed at that moment. So a
//! commit never loses a hook, a hook exists only for a committed
//! transaction, and a second roll-forward changes nothing.

pub(crate) mod guard;
pub(crate) mod net;
pub(crate) mod queue;
pub(crate) mod send;
pub(crate) mod sign;
pub(crate) mod transport;

use std::time::Duration;

use serde::{Deserialize, Serialize};

use std::sync::Arc;

use crate::events::{Event, Ready};
use crate::metrics::Metrics;
use crate::store::{Bound, Bson, DateTime, Document, DynStore, Record, StoreError, StoreResult, Update, doc, scans};
use crate::txn::outputs::Outputs;
use crate::txn::record::{TXNS, TxnRecord};

pub const DELIVERIES: &str = "_deliveries";

/// The `next_at` of a hook that waits for the hook before it (hooks of one
/// transaction go in order): 9999-12-31T23:59:59Z.
pub(crate) const AFTER_PREVIOUS: DateTime = DateTime::from_millis(253_402_300_799_000);

/// How deliveries are sent.
#[derive(Clone, Debug)]
pub struct HookConfig {
    /// Standard Webhooks signing key (`TXGATE_HOOK_SECRET`); unsigned without.
    pub signer: Option<sign::Signer>,
    /// Timeout of one attempt.
    pub timeout: Duration,
    /// A delivery not delivered this long after it was queued is dead.
    pub max_age: Duration,
    /// How long finished deliveries are kept.
    pub retention: Duration,
    /// Most attempts in flight per instance.
    pub concurrency: usize,
    /// Most attempts in flight per instance to one destination (host and
    /// port), so one slow receiver cannot hold every attempt slot.
    pub per_destination: usize,
    /// Period of the scan for work this instance was not told about.
    pub scan_interval: Duration,
    /// How long a claim outlives the attempt timeout (a crashed sender's
    /// delivery is taken over after `timeout + claim_grace`).
    pub claim_grace: Duration,
}

impl Default for HookConfig {
    fn default() -> Self {
        Self {
            signer: None,
            timeout: Duration::from_secs(15),
            max_age: Duration::from_secs(24 * 3600),
            retention: Duration::from_secs(7 * 24 * 3600),
            concurrency: 64,
            per_destination: 8,
            scan_interval: Duration::from_secs(1),
            claim_grace: Duration::from_secs(5),
        }
    }
}

pub(crate) use crate::txn::hook::{Headers, Hook, redact_request, redact_request_urls, redact_url};

/// One delivery attempt.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
pub struct Attempt {
    pub at: DateTime,
    #[serde(default)]
    pub status_code: Option<i32>,
    #[serde(default)]
    pub error: Option<String>,
    pub duration_ms: i64,
}

/// Where a delivery stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DeliveryStatus {
    /// Not tried yet (or waiting for the hook before it).
    Pending,
    /// An attempt failed; another is due at `next_at`.
    Failed,
    /// Given up (410, or `hook_max_age` reached).
    Dead,
    Delivered,
}

impl DeliveryStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            DeliveryStatus::Pending => "pending",
            DeliveryStatus::Failed => "failed",
            DeliveryStatus::Dead => "dead",
            DeliveryStatus::Delivered => "delivered",
        }
    }

    /// The status as stored (a scan's equality value).
    pub fn to_bson(self) -> Bson {
        Bson::String(self.as_str().to_owned())
    }

    /// Delivered or dead: no attempt will follow unless replayed.
    pub fn is_final(self) -> bool {
        matches!(self, DeliveryStatus::Dead | DeliveryStatus::Delivered)
    }
}

/// What asking for a delivery to be sent again did.
#[derive(Debug)]
pub enum Replay {
    /// Queued; the delivery as it is now.
    Queued(Box<Delivery>),
    /// It is queued or in flight already.
    AlreadyPending,
    NotFound,
}

/// A delivery record in `_deliveries`.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
pub struct Delivery {
    /// `<txn>:<index>`.
    #[serde(rename = "_id")]
    pub id: String,
    /// The transaction whose hook (or whose change's event) this is; empty
    /// for the event of a single-document write.
    #[serde(default)]
    pub txn: String,
    pub index: i64,
    /// How many hooks the transaction has.
    #[serde(default)]
    pub count: i64,
    pub status: DeliveryStatus,
    pub method: String,
    pub url: String,
    pub headers: Headers,
    /// The exact bytes to send, as text.
    pub body: String,
    pub created_at: DateTime,
    pub next_at: DateTime,
    #[serde(default)]
    pub attempts: Vec<Attempt>,
    #[serde(default)]
    pub finished_at: Option<DateTime>,
    /// Failed attempts since it was queued (or replayed): the backoff step.
    #[serde(default)]
    pub tries: i64,
    /// When it was last queued: by hand, or released once the delivery it
    /// waited for was final (`hook_max_age` counts from here).
    #[serde(default)]
    pub queued_at: Option<DateTime>,
    /// The instance holding the current claim, its token and expiry.
    #[serde(default)]
    pub owner: Option<String>,
    #[serde(default)]
    pub claim: Option<String>,
    #[serde(default)]
    pub lease_until: Option<DateTime>,
    /// The subscription whose event this delivers (none: a hook).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subscription: Option<String>,
    /// The id of the event it delivers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event: Option<String>,
    /// Deliveries of one key go in `seq` order, each once the one before
    /// it is final: `<subscription>:<collection>/<document>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// The event's position in the log.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seq: Option<i64>,
    /// The delivery of the same key it waits for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prev: Option<String>,
    /// The name of the API key that made the transaction or the change
    /// (none in records of earlier releases).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by_key: Option<String>,
    /// The user who made it, when a user's token did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by_user: Option<crate::actor::UserId>,
}

impl Delivery {
    /// Hook `index` of the `count` of transaction `txn`, recorded at `at`
    /// with the exact `body` to send: the first is due at once, each next
    /// one once the one before it is final.
    pub fn queued(txn: &str, index: usize, count: i64, hook: Hook, body: String, at: DateTime) -> Self {
        Self {
            id: delivery_id(txn, index),
            txn: txn.to_owned(),
            index: index as i64,
            count,
            status: DeliveryStatus::Pending,
            method: hook.method,
            url: hook.url,
            headers: hook.headers,
            body,
            created_at: at,
            next_at: if index == 0 { at } else { AFTER_PREVIOUS },
            attempts: Vec::new(),
            finished_at: None,
            tries: 0,
            queued_at: None,
            owner: None,
            claim: None,
            lease_until: None,
            subscription: None,
            event: None,
            key: None,
            seq: None,
            prev: None,
            by_key: None,
            by_user: None,
        }
    }

    /// The delivery of `event` (its JSON as the body) to subscription
    /// `subscription` at `url`, recorded at `at`; one waiting for `prev`
    /// (the delivery of the document's event before it) goes once that one
    /// is final.
    pub fn of_event(subscription: &str, url: &str, event: &Ready, prev: Option<String>, at: DateTime) -> Self {
        let hook = Hook { method: "POST".into(), url: url.to_owned(), headers: Default::default(), body: None };
        let e = &event.event;
        let txn = e.transaction.clone().unwrap_or_default();
        let mut d = Self::queued(&txn, 0, 1, hook, event.json.clone(), at);
        d.id = format!("{subscription}:{}", e.id);
        d.key = event_key(subscription, e);
        if prev.is_some() {
            d.next_at = AFTER_PREVIOUS;
        }
        d.subscription = Some(subscription.to_owned());
        d.event = Some(e.id.clone());
        d.seq = i64::try_from(e.seq).ok();
        d.prev = prev;
        d.by_key = e.key.clone();
        d.by_user = e.actor.clone();
        d
    }

    pub fn from_record(record: Record) -> Result<Self, StoreError> {
        mongodb::bson::from_document(record).map_err(|e| StoreError::Internal(format!("bad delivery record: {e}")))
    }

    pub fn to_record(&self) -> Record {
        mongodb::bson::to_document(self).expect("delivery serializes")
    }
}

/// A change of a delivery record, each a compare-and-set (the delivery
/// state machine, written only here and in [`Hooks::replay`]).
pub(crate) enum DeliveryChange<'a> {
    /// A due, unclaimed delivery is claimed by `owner` with `token` until
    /// `lease_until` (also its `next_at`: not due again before).
    Claim { at: DateTime, owner: &'a str, token: &'a str, lease_until: DateTime },
    /// The outcome of the attempt made under claim `token`: failed with a
    /// `next` try, or final (delivered or dead) at `finished`.
    Outcome {
        token: &'a str,
        status: DeliveryStatus,
        attempts: &'a [Attempt],
        tries: i64,
        next: Option<DateTime>,
        finished: DateTime,
    },
    /// A delivery waiting for the hook before it may go at `at`.
    Release { at: DateTime },
    /// The claim `token` is given back without an attempt (its destination
    /// has no room in this instance): due again at `next`.
    Unclaim { token: &'a str, next: DateTime },
    /// An unclaimed delivery still due is due at `at` (its destination has
    /// room again).
    Wake { at: DateTime },
    /// A final delivery (`from`, finished at `finished`) queued anew by
    /// hand at `at`: fresh tries and maximum age.
    Requeue { from: DeliveryStatus, finished: Option<DateTime>, at: DateTime },
    /// A failed delivery not in flight made due now (`at`) by hand.
    RetryNow { at: DateTime },
}

/// Statuses of deliveries an attempt may still be made for.
pub(crate) const DUE: [DeliveryStatus; 2] = [DeliveryStatus::Pending, DeliveryStatus::Failed];

/// The fields the changes of a delivery match and set, as stored.
mod shapes {
    use serde::Serialize;

    use super::{Attempt, DeliveryStatus};
    use crate::store::DateTime;
    use crate::store::shape::{Gt, In, Lte};

    /// Due by `next_at`: pending or failed.
    #[derive(Serialize)]
    pub(super) struct Due<'a> {
        pub status: In<&'a [DeliveryStatus]>,
        pub next_at: Lte<DateTime>,
    }

    /// Still due after `next_at`, unclaimed.
    #[derive(Serialize)]
    pub(super) struct DueLater<'a> {
        pub status: In<&'a [DeliveryStatus]>,
        pub claim: Option<&'a str>,
        pub next_at: Gt<DateTime>,
    }

    /// Pending, waiting at `next_at` for the hook before it.
    #[derive(Serialize)]
    pub(super) struct Waiting {
        pub status: DeliveryStatus,
        pub next_at: DateTime,
    }

    /// Held under claim token `claim`.
    #[derive(Serialize)]
    pub(super) struct Claimed<'a> {
        pub claim: &'a str,
    }

    /// A claim: its owner, token and lease (also the next due time).
    #[derive(Serialize)]
    pub(super) struct Claim<'a> {
        pub owner: Option<&'a str>,
        pub claim: Option<&'a str>,
        pub lease_until: Option<DateTime>,
        pub next_at: DateTime,
    }

    /// An attempt's outcome, the claim given back with it.
    #[derive(Serialize)]
    pub(super) struct Outcome<'a> {
        pub status: DeliveryStatus,
        pub attempts: &'a [Attempt],
        pub tries: i64,
        pub owner: Option<&'a str>,
        pub claim: Option<&'a str>,
        pub lease_until: Option<DateTime>,
        #[serde(skip_serializing_if = "Option::is_none")]
        pub next_at: Option<DateTime>,
        #[serde(skip_serializing_if = "Option::is_none")]
        pub finished_at: Option<DateTime>,
    }

    /// Due at `next_at`.
    #[derive(Serialize)]
    pub(super) struct DueAt {
        pub next_at: DateTime,
    }

    /// Released to go at `next_at`, its age counted from `queued_at`.
    #[derive(Serialize)]
    pub(super) struct Released {
        pub next_at: DateTime,
        pub queued_at: DateTime,
    }

    /// In `status`, finished at `finished_at` (or not finished), or, with
    /// no `finished_at` field, in `status` and unclaimed.
    #[derive(Serialize)]
    pub(super) struct Final {
        pub status: DeliveryStatus,
        pub finished_at: Option<DateTime>,
    }

    /// In `status`, unclaimed.
    #[derive(Serialize)]
    pub(super) struct Unclaimed<'a> {
        pub status: DeliveryStatus,
        pub claim: Option<&'a str>,
    }

    /// Queued anew at `at`.
    #[derive(Serialize)]
    pub(super) struct Requeued<'a> {
        pub status: DeliveryStatus,
        pub next_at: DateTime,
        pub finished_at: Option<DateTime>,
        pub tries: i64,
        pub queued_at: DateTime,
        pub owner: Option<&'a str>,
        pub claim: Option<&'a str>,
        pub lease_until: Option<DateTime>,
    }
}

impl DeliveryChange<'_> {
    /// The filter and update of this change.
    pub(crate) fn cas(&self) -> (Document, Update) {
        use crate::store::shape::{Gt, In, Lte, fields};
        match self {
            DeliveryChange::Claim { at, owner, token, lease_until } => {
                let filter = shapes::Due { status: In(&DUE), next_at: Lte(*at) };
                let claim = shapes::Claim {
                    owner: Some(owner),
                    claim: Some(token),
                    lease_until: Some(*lease_until),
                    next_at: *lease_until,
                };
                (fields(&filter), Update::fields(&claim))
            }
            DeliveryChange::Outcome { token, status, attempts, tries, next, finished } => {
                let outcome = shapes::Outcome {
                    status: *status,
                    attempts,
                    tries: *tries,
                    owner: None,
                    claim: None,
                    lease_until: None,
                    next_at: *next,
                    finished_at: next.is_none().then_some(*finished),
                };
                (fields(&shapes::Claimed { claim: token }), Update::fields(&outcome))
            }
            DeliveryChange::Unclaim { token, next } => {
                let unclaimed = shapes::Claim { owner: None, claim: None, lease_until: None, next_at: *next };
                (fields(&shapes::Claimed { claim: token }), Update::fields(&unclaimed))
            }
            DeliveryChange::Wake { at } => {
                let filter = shapes::DueLater { status: In(&DUE), claim: None, next_at: Gt(*at) };
                (fields(&filter), Update::fields(&shapes::DueAt { next_at: *at }))
            }
            DeliveryChange::Release { at } => {
                let filter = shapes::Waiting { status: DeliveryStatus::Pending, next_at: AFTER_PREVIOUS };
                // Its maximum age counts from now: the time it waited for
                // the one before it is not its own.
                (fields(&filter), Update::fields(&shapes::Released { next_at: *at, queued_at: *at }))
            }
            DeliveryChange::Requeue { from, finished, at } => {
                let requeued = shapes::Requeued {
                    status: DeliveryStatus::Pending,
                    next_at: *at,
                    finished_at: None,
                    tries: 0,
                    queued_at: *at,
                    owner: None,
                    claim: None,
                    lease_until: None,
                };
                (fields(&shapes::Final { status: *from, finished_at: *finished }), Update::fields(&requeued))
            }
            DeliveryChange::RetryNow { at } => {
                let filter = shapes::Unclaimed { status: DeliveryStatus::Failed, claim: None };
                (fields(&filter), Update::fields(&shapes::DueAt { next_at: *at }))
            }
        }
    }

    /// Apply this change to delivery `id`: whether this compare-and-set
    /// made it. Unsynced: a lost claim or outcome means one more attempt
    /// (deliveries are at least once), never a lost delivery.
    pub(crate) async fn apply(&self, store: &dyn crate::store::Store, id: &str) -> StoreResult<bool> {
        let (filter, update) = self.cas();
        store.unsynced().update(DELIVERIES, id, filter, update).await
    }
}

/// The key of `event`'s deliveries to `subscription` (those of one
/// document go in order): `<subscription>:<collection>/<document>`; none
/// for a transaction's own event.
pub(crate) fn event_key(subscription: &str, event: &Event) -> Option<String> {
    match (&event.collection, &event.document) {
        (Some(c), Some(doc)) => Some(format!("{subscription}:{c}/{doc}")),
        _ => None,
    }
}

/// The delivery id of hook `index` of transaction `txn`.
pub(crate) fn delivery_id(txn: &str, index: usize) -> String {
    format!("{txn}:{index}")
}

/// The hook deliveries of this instance: recorded as a committed
/// transaction's output, looked up for the API, and scheduled for the
/// delivery worker (which shares this with the handlers).
pub struct Hooks {
    pub store: DynStore,
    pub metrics: Arc<Metrics>,
    /// Where timestamps come from (the engine's clock).
    pub clock: crate::clock::Clock,
    /// Deliveries this process knows are due.
    pub queue: queue::Queue,
}

impl Hooks {
    pub fn new(store: DynStore, metrics: Arc<Metrics>, clock: crate::clock::Clock) -> Arc<Self> {
        Arc::new(Self { store, metrics, clock, queue: queue::Queue::default() })
    }

    /// Record the deliveries of committed `rec` (insert-if-absent, so any
    /// number of roll-forwards record each once).
    pub async fn record(&self, rec: &TxnRecord) -> StoreResult<()> {
        if rec.hook_count == 0 {
            return Ok(());
        }
        let at = rec.committed_at.unwrap_or_else(|| self.clock.now());
        let summary = crate::txn::answer::CommittedOut::of(rec).to_json().to_string();
        let hooks = rec.hooks();
        let count = hooks.len() as i64;
        for (i, hook) in hooks.into_iter().enumerate() {
            let body = match &hook.body {
                Some(body) => body.to_string(),
                None => summary.clone(),
            };
            let mut delivery = Delivery::queued(&rec.id, i, count, hook, body, at);
            delivery.by_key = rec.key.clone();
            delivery.by_user = rec.user.clone();
            // Insert-if-absent: a second roll-forward finds it there.
            // Unsynced: recovery records it again from the committed record.
            self.store.unsynced().insert(DELIVERIES, delivery.to_record()).await?;
        }
        self.queue.push(&delivery_id(&rec.id, 0), at.timestamp_millis());
        Ok(())
    }

    /// Delivery `id`. One of a committed transaction whose roll-forward has
    /// not recorded its deliveries yet is recorded here first, so every id
    /// a commit answer names can be read at once.
    pub async fn delivery(&self, id: &str) -> StoreResult<Option<Delivery>> {
        if let Some(rec) = self.store.get(DELIVERIES, id).await? {
            return Delivery::from_record(rec).map(Some);
        }
        let Some((txn, index)) = id.rsplit_once(':') else { return Ok(None) };
        let Ok(index) = index.parse::<i64>() else { return Ok(None) };
        let Some(rec) = self.store.get(TXNS, txn).await? else { return Ok(None) };
        let rec = TxnRecord::from_record(rec)?;
        if rec.status != crate::txn::Status::Committed || index >= rec.hook_count {
            return Ok(None);
        }
        self.record(&rec).await?;
        match self.store.get(DELIVERIES, id).await? {
            Some(rec) => Delivery::from_record(rec).map(Some),
            None => Ok(None),
        }
    }

    /// A page of deliveries in id order (so a transaction's hooks stand
    /// together), optionally only those with `status`.
    pub async fn list(
        &self,
        status: Option<DeliveryStatus>,
        after: Option<&str>,
        limit: usize,
    ) -> StoreResult<(Vec<Delivery>, Option<String>)> {
        let scan = match status {
            Some(s) => scans::DELIVERIES_BY_STATUS.scan(vec![s.to_bson()]),
            None => scans::DELIVERIES.scan(Vec::new()),
        };
        crate::store::page(self.store.as_ref(), DELIVERIES, scan, after, limit, Delivery::from_record).await
    }

    /// Send delivery `id` again: a `dead` or `delivered` one is queued anew
    /// (fresh backoff and max age); a `failed` one not in flight is made due
    /// now. Other hooks of its transaction are not affected.
    pub async fn replay(&self, id: &str) -> StoreResult<Replay> {
        let Some(d) = self.delivery(id).await? else { return Ok(Replay::NotFound) };
        let at = self.clock.now();
        let change = match d.status {
            s if s.is_final() => DeliveryChange::Requeue { from: s, finished: d.finished_at, at },
            DeliveryStatus::Failed if d.claim.is_none() => DeliveryChange::RetryNow { at },
            _ => return Ok(Replay::AlreadyPending),
        };
        // Synced: the operator is told it is queued.
        let (filter, update) = change.cas();
        if !self.store.update(DELIVERIES, id, filter, update).await? {
            return Ok(Replay::AlreadyPending);
        }
        self.queue.push(id, at.timestamp_millis());
        tracing::info!(delivery.id = %id, was = d.status.as_str(), "delivery queued by hand");
        Ok(match self.store.get(DELIVERIES, id).await? {
            Some(rec) => Replay::Queued(Box::new(Delivery::from_record(rec)?)),
            None => Replay::NotFound,
        })
    }

    /// The delivery before waiting delivery `id` is final: `id` may go now
    /// (a no-op unless it is still waiting). Whether this released it.
    pub async fn release(&self, id: &str) -> StoreResult<bool> {
        let at = self.clock.now();
        let released = (DeliveryChange::Release { at }).apply(self.store.as_ref(), id).await?;
        if released {
            self.queue.push(id, at.timestamp_millis());
        }
        Ok(released)
    }

    /// The delivery of `key` after position `seq`, if any.
    pub async fn next_of_key(&self, key: &str, seq: i64) -> StoreResult<Option<Delivery>> {
        let scan =
            scans::DELIVERIES_BY_KEY.scan(vec![Bson::String(key.to_owned())]).from(Bound::Excluded(Bson::Int64(seq)));
        self.store.scan(DELIVERIES, scan.limit(1)).await?.into_iter().next().map(Delivery::from_record).transpose()
    }

    /// The last delivery of `key` before position `seq`, if any.
    pub async fn last_of_key(&self, key: &str, seq: i64) -> StoreResult<Option<Delivery>> {
        let scan =
            scans::DELIVERIES_BY_KEY.scan(vec![Bson::String(key.to_owned())]).to(Bound::Excluded(Bson::Int64(seq)));
        self.store
            .scan(DELIVERIES, scan.desc().limit(1))
            .await?
            .into_iter()
            .next()
            .map(Delivery::from_record)
            .transpose()
    }

    /// Whether delivery `id` is final (or gone: purged after it was).
    pub async fn is_final(&self, id: &str) -> StoreResult<bool> {
        Ok(match self.store.get(DELIVERIES, id).await? {
            None => true,
            Some(rec) => Delivery::from_record(rec)?.status.is_final(),
        })
    }

    /// The deliveries of transaction `txn`, in hook order.
    pub async fn deliveries_of(&self, txn: &str, count: i64) -> StoreResult<Vec<Option<Delivery>>> {
        let ids: Vec<String> = (0..count.max(0) as usize).map(|i| delivery_id(txn, i)).collect();
        let found = self.store.get_many(DELIVERIES, &ids).await?;
        let mut by_id: std::collections::HashMap<String, Delivery> = found
            .into_iter()
            .map(Delivery::from_record)
            .map(|d| d.map(|d| (d.id.clone(), d)))
            .collect::<Result<_, _>>()?;
        Ok(ids.iter().map(|id| by_id.remove(id)).collect())
    }
}

#[async_trait::async_trait]
impl Outputs for Hooks {
    async fn ensure(&self, rec: &TxnRecord) -> StoreResult<()> {
        self.record(rec).await
    }

    fn has_any(&self, rec: &TxnRecord) -> bool {
        rec.hook_count > 0
    }
}

//! The delivery worker (docs/design.md §4), one in every instance. Instances share
//! the work through claims on the delivery records: a claim is one
//! conditional update that only a due, unclaimed delivery passes, and it
//! sets `owner`, a fresh claim token and `lease_until` (also pushed into
//! `next_at`, so a claimed delivery is not due again until its claim
//! expires). The outcome is written only while the token still matches, so
//! a sender whose claim expired cannot overwrite a newer outcome.
//!
//! The worker sleeps until the earliest delivery it knows of falls due, a
//! new one is recorded in this process, or its periodic scan of the store
//! (work recorded or released by other instances) is due.

use crate::worker::Worker;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use rand::Rng;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::net::Clients;
pub(crate) use super::transport::{Http, Outcome, RESERVED_HEADERS, Transport, refused_header};
use super::{
    AFTER_PREVIOUS, Attempt, DELIVERIES, DUE, Delivery, DeliveryChange, DeliveryStatus, HookConfig, Hooks, delivery_id,
};

use crate::store::scans::{DELIVERIES_BY_DUE, DELIVERIES_WAITING};
use crate::store::{Bound, Bson, DateTime, StoreResult};

/// First retry delay; it doubles per failed attempt up to [`MAX_DELAY`].
pub(crate) const FIRST_DELAY: Duration = Duration::from_millis(100);
pub(crate) const MAX_DELAY: Duration = Duration::from_secs(30);
/// Deliveries taken from one scan of the store.
const SCAN_BATCH: usize = 512;
/// Period of the sweep that releases successors a crash left waiting.
const SWEEP_INTERVAL: Duration = Duration::from_secs(30);

/// The delay before retry number `failures` (1 = after the first failure):
/// 100 ms doubling, capped at 30 s, times a random factor in [0.8, 1.2].
pub(crate) fn backoff(failures: u32, jitter: f64) -> Duration {
    let base = FIRST_DELAY.saturating_mul(1u32.checked_shl(failures.saturating_sub(1)).unwrap_or(u32::MAX));
    base.min(MAX_DELAY).mul_f64(jitter)
}

pub struct Sender {
    hooks: Arc<Hooks>,
    cfg: HookConfig,
    transport: Arc<dyn Transport>,
    /// This instance, as named in the claims it makes.
    owner: String,
    permits: Arc<Semaphore>,
    /// Attempts in flight per destination, and the deliveries parked while
    /// one is full.
    destinations: std::sync::Mutex<std::collections::HashMap<String, Destination>>,
    /// Cancelled when a stop can wait no longer: the attempts in flight
    /// are dropped where they are (see [`Sender::abandon`]).
    abandon: CancellationToken,
}

/// One destination's attempts in flight in this instance, and the
/// deliveries given back while it was full, woken one per freed slot.
#[derive(Default)]
struct Destination {
    in_flight: usize,
    parked: std::collections::VecDeque<String>,
}

/// Deliveries remembered as parked per destination; beyond, a parked one is
/// found by the scan once its park time is over.
const MAX_PARKED: usize = 10_000;

/// Where an attempt goes, as fairness counts it: host and port.
fn destination(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(u) => format!("{}:{}", u.host_str().unwrap_or_default(), u.port_or_known_default().unwrap_or_default()),
        Err(_) => url.to_owned(),
    }
}

fn add(at: DateTime, d: Duration) -> DateTime {
    DateTime::from_millis(at.timestamp_millis().saturating_add(i64::try_from(d.as_millis()).unwrap_or(i64::MAX)))
}

impl Sender {
    /// A sender making its attempts over HTTP with `clients`.
    pub fn new(hooks: Arc<Hooks>, cfg: HookConfig, clients: Clients) -> Arc<Self> {
        let http = Http { clients, signer: cfg.signer.clone(), timeout: cfg.timeout, clock: hooks.clock.clone() };
        Self::with_transport(hooks, cfg, Arc::new(http))
    }

    pub fn with_transport(hooks: Arc<Hooks>, cfg: HookConfig, transport: Arc<dyn Transport>) -> Arc<Self> {
        let host = std::env::var("HOSTNAME").unwrap_or_default();
        let owner = format!("{}{}{}", host, if host.is_empty() { "" } else { "/" }, uuid::Uuid::now_v7());
        let permits = Arc::new(Semaphore::new(cfg.concurrency.max(1)));
        let abandon = CancellationToken::new();
        Arc::new(Self { hooks, cfg, transport, owner, permits, destinations: Default::default(), abandon })
    }

    /// Cancel it to drop the attempts still in flight after a stop has
    /// waited long enough (`TXGATE_SHUTDOWN_TIMEOUT_MS`). An attempt
    /// dropped is as one cut by a crash: its claim runs out and the
    /// delivery is sent again, by this instance's successor or another,
    /// with the same `webhook-id` (receivers may get it twice, as after
    /// any crash).
    pub fn abandon(&self) -> CancellationToken {
        self.abandon.clone()
    }

    /// Queue the deliveries due now or before the next scan; returns how
    /// many were found.
    async fn scan(&self) -> StoreResult<usize> {
        let horizon = Bson::DateTime(add(self.hooks.clock.now(), self.cfg.scan_interval));
        let mut found = 0;
        for status in DUE {
            let scan = DELIVERIES_BY_DUE.scan(vec![status.to_bson()]).to(Bound::Included(horizon.clone()));
            let due = self.hooks.store.scan(DELIVERIES, scan.limit(SCAN_BATCH)).await?;
            found = found.max(due.len());
            for rec in due {
                if let (Ok(id), Ok(at)) = (rec.get_str("_id"), rec.get_datetime("next_at")) {
                    self.hooks.queue.push(id, at.timestamp_millis());
                }
            }
        }
        Ok(found)
    }

    /// Why delivery `d` of a subscription's event is not to be sent: the
    /// subscription was deleted (it is dead without an attempt). `None`:
    /// send it (also when the store cannot tell; the attempt is fenced
    /// like any other).
    async fn unsubscribed(&self, d: &Delivery) -> Option<Outcome> {
        let sub = d.subscription.as_deref()?;
        match self.hooks.store.get(crate::store::scans::SUBSCRIPTIONS.coll, sub).await {
            Ok(None) => Some(Outcome {
                error: Some(format!("subscription {sub} was deleted")),
                gone: true,
                ..Outcome::default()
            }),
            _ => None,
        }
    }

    /// Claim `id` and, if this instance got it, make one attempt.
    async fn claim_and_send(&self, id: &str) {
        let claimed = match self.claim(id).await {
            Ok(Some(claimed)) => claimed,
            Ok(None) => {
                self.reschedule(id).await;
                return;
            }
            Err(err) => {
                tracing::warn!(delivery.id = %id, error = %err, "claim failed; the scan will find it again");
                return;
            }
        };
        let (delivery, token) = claimed;
        let dest = destination(&delivery.url);
        if !self.enter(&dest) {
            self.park(&dest, id, &token).await;
            return;
        }
        let attempt_no = delivery.attempts.len() + 1;
        let span = tracing::info_span!("delivery", delivery.id = %id, delivery.attempt = attempt_no);
        tracing::Instrument::instrument(self.attempt(delivery, token), span).await;
        self.leave(&dest).await;
    }

    /// Take a slot of `dest` for an attempt; `false` when it has none.
    fn enter(&self, dest: &str) -> bool {
        let mut map = self.destinations.lock().expect("destinations");
        let d = map.entry(dest.to_owned()).or_default();
        if d.in_flight >= self.cfg.per_destination.max(1) {
            return false;
        }
        d.in_flight += 1;
        true
    }

    /// Give a slot of `dest` back, and wake the delivery parked longest
    /// for it.
    async fn leave(&self, dest: &str) {
        let next = {
            let mut map = self.destinations.lock().expect("destinations");
            let Some(d) = map.get_mut(dest) else { return };
            d.in_flight = d.in_flight.saturating_sub(1);
            let next = d.parked.pop_front();
            if d.in_flight == 0 && d.parked.is_empty() {
                map.remove(dest);
            }
            next
        };
        if let Some(id) = next {
            self.wake(&id).await;
        }
    }

    /// `dest` is full: give the claim on `id` back without an attempt, due
    /// again after a claim's time (when a crash of this instance would have
    /// freed it too), and park it here to be woken by the next free slot.
    async fn park(&self, dest: &str, id: &str, token: &str) {
        let next = add(self.hooks.clock.now(), self.cfg.timeout + self.cfg.claim_grace);
        match (DeliveryChange::Unclaim { token, next }).apply(self.hooks.store.as_ref(), id).await {
            Ok(true) => {}
            Ok(false) => return,
            Err(err) => {
                tracing::warn!(delivery.id = %id, error = %err, "cannot give a claim back; it expires by itself");
                return;
            }
        }
        self.hooks.metrics.incr(&crate::metrics::DELIVERIES_PARKED, "destination_full");
        tracing::debug!(delivery.id = %id, destination = %dest, "destination full: delivery parked");
        let room = {
            let mut map = self.destinations.lock().expect("destinations");
            let d = map.entry(dest.to_owned()).or_default();
            if d.parked.len() < MAX_PARKED && !d.parked.iter().any(|p| p == id) {
                d.parked.push_back(id.to_owned());
            }
            // A slot freed while this one was being given back woke no one.
            (d.in_flight < self.cfg.per_destination.max(1)).then(|| d.parked.pop_front()).flatten()
        };
        if let Some(id) = room {
            self.wake(&id).await;
        }
    }

    /// Make parked delivery `id` due now and queue it.
    async fn wake(&self, id: &str) {
        let at = self.hooks.clock.now();
        match (DeliveryChange::Wake { at }).apply(self.hooks.store.as_ref(), id).await {
            Ok(_) => self.hooks.queue.push(id, at.timestamp_millis()),
            Err(err) => tracing::warn!(delivery.id = %id, error = %err, "cannot wake a parked delivery; the scan will"),
        }
    }

    /// A claim failed: the schedule here was stale (another instance has
    /// it, or it was rescheduled meanwhile). Queue it for when the record
    /// says it is due, so it is not left to the next scan.
    async fn reschedule(&self, id: &str) {
        let Ok(Some(rec)) = self.hooks.store.get(DELIVERIES, id).await else { return };
        let Ok(d) = Delivery::from_record(rec) else { return };
        if !d.status.is_final() && d.next_at != AFTER_PREVIOUS {
            // Not sooner than a moment from now: a claim that keeps failing
            // on a due record must not spin.
            let soonest = self.hooks.clock.now().timestamp_millis() + 50;
            self.hooks.queue.push(id, d.next_at.timestamp_millis().max(soonest));
        }
    }

    async fn claim(&self, id: &str) -> StoreResult<Option<(Delivery, String)>> {
        let at = self.hooks.clock.now();
        let token = uuid::Uuid::now_v7().to_string();
        let lease_until = add(at, self.cfg.timeout + self.cfg.claim_grace);
        let claim = DeliveryChange::Claim { at, owner: &self.owner, token: &token, lease_until };
        if !claim.apply(self.hooks.store.as_ref(), id).await? {
            return Ok(None);
        }
        let Some(rec) = self.hooks.store.get(DELIVERIES, id).await? else { return Ok(None) };
        let delivery = Delivery::from_record(rec)?;
        Ok((delivery.claim.as_deref() == Some(token.as_str())).then_some((delivery, token)))
    }

    async fn attempt(&self, d: Delivery, token: String) {
        let at = self.hooks.clock.now();
        let started = Instant::now();
        let outcome = match self.unsubscribed(&d).await {
            Some(why) => why,
            None => self.transport.send(&d).await,
        };
        let duration = started.elapsed();
        let finished = self.hooks.clock.now();
        let code = outcome.status_code;
        let delivered = code.is_some_and(|c| (200..300).contains(&c));
        let failures = u32::try_from(d.tries + 1).unwrap_or(u32::MAX);
        let since = d.queued_at.unwrap_or(d.created_at);
        let (status, next_at) = if delivered {
            (DeliveryStatus::Delivered, None)
        } else if code == Some(410) || outcome.gone {
            (DeliveryStatus::Dead, None)
        } else {
            let mut delay = backoff(failures, rand::rng().random_range(0.8..=1.2));
            if let Some(wait) = outcome.retry_after.filter(|_| matches!(code, Some(429 | 503))) {
                delay = delay.max(wait.min(MAX_DELAY));
            }
            let next = add(finished, delay);
            if next > add(since, self.cfg.max_age) {
                (DeliveryStatus::Dead, None)
            } else {
                (DeliveryStatus::Failed, Some(next))
            }
        };
        let mut attempts = d.attempts.clone();
        attempts.push(Attempt {
            at,
            status_code: code.map(i32::from),
            error: outcome.error.clone(),
            duration_ms: i64::try_from(duration.as_millis()).unwrap_or(i64::MAX),
        });
        let change = DeliveryChange::Outcome {
            token: &token,
            status,
            attempts: &attempts,
            tries: i64::from(failures),
            next: next_at,
            finished,
        };
        match change.apply(self.hooks.store.as_ref(), &d.id).await {
            Ok(true) => {}
            Ok(false) => {
                tracing::warn!("the claim expired before the outcome was written; another attempt will follow");
                return;
            }
            Err(err) => {
                tracing::warn!(error = %err, "cannot record the attempt; it will be made again when the claim expires");
                return;
            }
        }
        let metrics = &self.hooks.metrics;
        metrics.incr(&crate::metrics::DELIVERY_ATTEMPTS, if delivered { "success" } else { "failure" });
        let ms = duration.as_millis() as u64;
        match (status, next_at) {
            (DeliveryStatus::Delivered, _) => {
                metrics.incr(&crate::metrics::DELIVERIES, "delivered");
                let lag = finished.timestamp_millis().saturating_sub(since.timestamp_millis()).max(0);
                metrics.observe(&crate::metrics::DELIVERY_LAG, &[], Duration::from_millis(lag as u64));
                tracing::debug!(status_code = code, duration_ms = ms, "delivered");
            }
            (_, Some(next)) => {
                metrics.incr(&crate::metrics::DELIVERIES, "retrying");
                self.hooks.queue.push(&d.id, next.timestamp_millis());
                tracing::info!(
                    status_code = code,
                    error = outcome.error.as_deref(),
                    duration_ms = ms,
                    retry_in_ms = next.timestamp_millis() - finished.timestamp_millis(),
                    "delivery attempt failed; will retry"
                );
            }
            _ => {
                metrics.incr(&crate::metrics::DELIVERIES, "dead");
                tracing::warn!(status_code = code, error = outcome.error.as_deref(), "delivery is dead");
            }
        }
        // A final hook lets the transaction's next one go (a count of 0:
        // recorded before counts were kept, so try).
        if next_at.is_none() {
            if let (Some(key), Some(seq)) = (&d.key, d.seq) {
                self.release_next_of_key(key, seq).await;
            } else if d.count == 0 || d.index + 1 < d.count {
                self.release(&delivery_id(&d.txn, (d.index + 1) as usize)).await;
            }
        }
    }

    /// The hook before hook `index` of `txn` is final: hook `index` may go
    /// now (a no-op unless it is still waiting).
    async fn release(&self, id: &str) {
        if let Err(err) = self.hooks.release(id).await {
            tracing::warn!(delivery.id = %id, error = %err, "cannot release the next delivery; the sweep will");
        }
    }

    /// Delivery `d` of a key is final: the next one of its key may go.
    async fn release_next_of_key(&self, key: &str, seq: i64) {
        match self.hooks.next_of_key(key, seq).await {
            Ok(Some(next)) if next.prev.is_some() => self.release(&next.id).await,
            Ok(_) => {}
            Err(err) => {
                tracing::warn!(key, error = %err, "cannot find the next delivery of a document; the sweep will")
            }
        }
    }

    /// Release successors a crash left waiting behind a finished hook.
    /// Returns where the next sweep goes on from.
    async fn sweep(&self, after: Option<String>) -> Option<String> {
        let waiting = DELIVERIES_WAITING
            .scan(vec![DeliveryStatus::Pending.to_bson(), Bson::DateTime(AFTER_PREVIOUS)])
            .after(after.as_deref())
            .limit(256);
        let waiting = match self.hooks.store.scan(DELIVERIES, waiting).await {
            Ok(waiting) => waiting,
            Err(err) => {
                tracing::warn!(error = %err, "sweep of waiting deliveries failed");
                return after;
            }
        };
        let resume =
            (waiting.len() == 256).then(|| waiting.last().and_then(|r| r.get_str("_id").ok()).map(str::to_owned));
        for rec in waiting {
            let Ok(d) = Delivery::from_record(rec) else { continue };
            let previous = match (&d.prev, d.index) {
                (Some(prev), _) => prev.clone(),
                (None, 0) => continue,
                (None, i) => delivery_id(&d.txn, (i - 1) as usize),
            };
            let done = match self.hooks.store.get(DELIVERIES, &previous).await {
                Ok(None) => true,
                Ok(Some(p)) => Delivery::from_record(p).is_ok_and(|p| p.status.is_final()),
                Err(_) => false,
            };
            if done {
                self.release(&d.id).await;
            }
        }
        resume.flatten()
    }
}

#[async_trait::async_trait]
impl Worker for Sender {
    fn name(&self) -> &'static str {
        "deliveries"
    }

    /// Find the due deliveries, release the successors a crash left
    /// waiting, and send every delivery due now, each to its end; ended
    /// once the attempts [`Worker::run`] has in flight have ended too.
    async fn run_once(&self) -> StoreResult<()> {
        self.scan().await?;
        // A sweep that fails answers where it started: stop there.
        let mut after = self.sweep(None).await;
        while let Some(from) = after.take() {
            after = self.sweep(Some(from.clone())).await.filter(|next| *next != from);
        }
        for id in self.hooks.queue.pop_due(self.hooks.clock.now().timestamp_millis(), usize::MAX) {
            self.claim_and_send(&id).await;
        }
        // Every permit free: no attempt in flight.
        let all = u32::try_from(self.cfg.concurrency.max(1)).unwrap_or(u32::MAX);
        drop(self.permits.acquire_many(all).await);
        Ok(())
    }

    /// Send due deliveries until `shutdown`; then let the attempts in
    /// flight finish (each is bounded by the attempt timeout), unless
    /// [`Sender::abandon`] drops them first.
    async fn run(self: Arc<Self>, shutdown: CancellationToken) {
        let attempts = TaskTracker::new();
        let mut next_scan = Instant::now();
        let mut next_sweep = Instant::now();
        let mut sweep_after: Option<String> = None;
        let mut scan_failures = 0u32;
        tracing::info!(owner = %self.owner, "delivery worker started");
        while !shutdown.is_cancelled() {
            if Instant::now() >= next_scan {
                let mut full = false;
                match self.scan().await {
                    Ok(n) => {
                        scan_failures = 0;
                        full = n == SCAN_BATCH;
                    }
                    Err(err) => {
                        scan_failures += 1;
                        tracing::warn!(error = %err, "scan of due deliveries failed");
                    }
                }
                // Back off after errors (the store may be down); scan again
                // soon after a full batch (a backlog from elsewhere).
                next_scan = if full {
                    Instant::now() + self.cfg.scan_interval.min(Duration::from_millis(50))
                } else {
                    Instant::now() + self.cfg.scan_interval * (1 << scan_failures.min(5))
                };
            }
            if Instant::now() >= next_sweep {
                sweep_after = self.sweep(sweep_after).await;
                next_sweep = Instant::now() + SWEEP_INTERVAL;
            }
            let free = self.permits.available_permits();
            for id in self.hooks.queue.pop_due(self.hooks.clock.now().timestamp_millis(), free) {
                let permit = Arc::clone(&self.permits).try_acquire_owned().expect("counted free permits");
                let sender = Arc::clone(&self);
                attempts.spawn(async move {
                    tokio::select! {
                        () = sender.claim_and_send(&id) => {}
                        () = sender.abandon.cancelled() => {
                            tracing::warn!(delivery.id = %id, "delivery attempt abandoned at shutdown; sent again once its claim runs out");
                        }
                    }
                    drop(permit);
                });
            }
            let wake = self
                .hooks
                .queue
                .next_due()
                .map(|at| {
                    let wait = at.saturating_sub(self.hooks.clock.now().timestamp_millis()).max(0) as u64;
                    Instant::now() + Duration::from_millis(wait)
                })
                .map_or(next_scan, |at| at.min(next_scan));
            let busy = self.permits.available_permits() == 0;
            tokio::select! {
                () = shutdown.cancelled() => {}
                () = tokio::time::sleep_until(wake) => {}
                () = self.hooks.queue.changed.notified() => {}
                // All senders busy: go on as soon as one is free.
                Ok(_) = self.permits.acquire(), if busy => {}
            }
        }
        attempts.close();
        if !attempts.is_empty() {
            tracing::info!(in_flight = attempts.len(), "waiting for delivery attempts in flight");
        }
        attempts.wait().await;
        tracing::info!("delivery worker stopped");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::Clock;
    use crate::hooks::transport::retry_after;
    use crate::metrics::Metrics;
    use crate::store::DynStore;
    use crate::store::memory::MemoryStore;

    /// Answers attempts from a script and notes when each came.
    struct Scripted {
        answers: std::sync::Mutex<std::collections::VecDeque<Outcome>>,
        at: std::sync::Mutex<Vec<Instant>>,
    }

    #[async_trait::async_trait]
    impl Transport for Scripted {
        async fn send(&self, _: &Delivery) -> Outcome {
            self.at.lock().unwrap().push(Instant::now());
            self.answers.lock().unwrap().pop_front().unwrap_or(Outcome { status_code: Some(200), ..Outcome::default() })
        }
    }

    fn answer(code: u16, retry_after: Option<Duration>) -> Outcome {
        Outcome { status_code: Some(code), error: None, retry_after, gone: false }
    }

    /// A delivery due now, recorded as a commit leaves it.
    async fn due(hooks: &Hooks, id: &str) {
        let now = hooks.clock.now();
        let (txn, _) = id.split_once(':').expect("a delivery id");
        let hook = crate::hooks::Hook {
            method: "POST".into(),
            url: "http://receiver.test/".into(),
            headers: Default::default(),
            body: None,
        };
        let d = Delivery::queued(txn, 0, 1, hook, "{}".into(), now);
        assert!(hooks.store.insert(DELIVERIES, d.to_record()).await.unwrap());
        hooks.queue.push(id, now.timestamp_millis());
    }

    async fn status(hooks: &Hooks, id: &str) -> DeliveryStatus {
        Delivery::from_record(hooks.store.get(DELIVERIES, id).await.unwrap().unwrap()).unwrap().status
    }

    /// Under paused time: failed attempts are retried after 100 ms doubling
    /// (times 0.8-1.2), a 503's `Retry-After` is waited out, and a delivery
    /// not delivered within `max_age` is dead.
    #[tokio::test(start_paused = true)]
    async fn retries_back_off_honour_retry_after_and_die_at_max_age() {
        let store: DynStore = Arc::new(MemoryStore::default());
        let hooks = Hooks::new(Arc::clone(&store), Arc::new(Metrics::default()), Clock::following_tokio());
        let script =
            [answer(500, None), answer(500, None), answer(503, Some(Duration::from_secs(7))), answer(500, None)];
        let transport = Arc::new(Scripted { answers: std::sync::Mutex::new(script.into()), at: Default::default() });
        let cfg = HookConfig { max_age: Duration::from_secs(60), ..HookConfig::default() };
        let sender = Sender::with_transport(Arc::clone(&hooks), cfg, Arc::clone(&transport) as Arc<dyn Transport>);
        let stop = CancellationToken::new();
        let worker = tokio::spawn(Arc::clone(&sender).run(stop.clone()));
        due(&hooks, "T:0").await;
        while status(&hooks, "T:0").await != DeliveryStatus::Delivered {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let at = transport.at.lock().unwrap().clone();
        assert_eq!(at.len(), 5, "four failures, then delivered");
        let gaps: Vec<u128> = at.windows(2).map(|w| (w[1] - w[0]).as_millis()).collect();
        let within = |gap: u128, base: u128| gap * 10 >= base * 8 - 10 && gap * 10 <= base * 12 + 30;
        assert!(within(gaps[0], 100) && within(gaps[1], 200), "{gaps:?}");
        assert!((7000..=7003).contains(&gaps[2]), "Retry-After 7 s is waited out: {gaps:?}");
        assert!(within(gaps[3], 800), "{gaps:?}");

        // A receiver that always fails: dead once the next try would pass
        // max_age (1 s here), never retried after.
        let always = Arc::new(Scripted {
            answers: std::sync::Mutex::new((0..100).map(|_| answer(500, None)).collect()),
            at: Default::default(),
        });
        let cfg = HookConfig { max_age: Duration::from_secs(1), ..HookConfig::default() };
        let dying = Sender::with_transport(Arc::clone(&hooks), cfg, Arc::clone(&always) as Arc<dyn Transport>);
        stop.cancel();
        worker.await.unwrap();
        let stop = CancellationToken::new();
        let worker = tokio::spawn(dying.run(stop.clone()));
        let started = Instant::now();
        due(&hooks, "U:0").await;
        while status(&hooks, "U:0").await != DeliveryStatus::Dead {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let attempts = always.at.lock().unwrap().len();
        assert!((3..=5).contains(&attempts), "{attempts} attempts in 1 s of backoff from 100 ms");
        assert!(started.elapsed() <= Duration::from_secs(1), "dead within max_age: {:?}", started.elapsed());
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert_eq!(always.at.lock().unwrap().len(), attempts, "a dead delivery is not tried again");
        stop.cancel();
        worker.await.unwrap();
    }

    #[test]
    fn backoff_doubles_from_100ms_to_a_30s_cap() {
        let ms = |n| backoff(n, 1.0).as_millis();
        assert_eq!([ms(1), ms(2), ms(3), ms(4)], [100, 200, 400, 800]);
        assert_eq!(ms(9), 25_600);
        assert_eq!(ms(10), 30_000);
        assert_eq!(ms(1000), 30_000);
        assert_eq!(backoff(1, 0.8).as_millis(), 80);
        assert_eq!(backoff(10, 1.2).as_millis(), 36_000);
    }

    #[test]
    fn retry_after_in_seconds_or_as_a_date() {
        let now = std::time::UNIX_EPOCH + Duration::from_secs(1_000_000_000);
        assert_eq!(retry_after("7", now), Some(Duration::from_secs(7)));
        let date = httpdate::fmt_http_date(now + Duration::from_secs(12));
        assert_eq!(retry_after(&date, now), Some(Duration::from_secs(12)));
        let past = httpdate::fmt_http_date(now - Duration::from_secs(12));
        assert_eq!(retry_after(&past, now), Some(Duration::ZERO));
        assert_eq!(retry_after("soon", now), None);
    }
}

//! The gateway's metrics, exposed at `/metrics` in the Prometheus text
//! format. Every family is declared once, by `families!` (name, help, label
//! keys); label values are bounded by construction: route templates,
//! operation kinds, outcomes and codes, never ids or raw paths.
//!
//! Each [`Metrics`] has its own registry, so several gateways in one
//! process (tests, benches) keep their figures apart.

use std::time::Duration;

use prometheus::core::{Collector, Desc, MetricVec, MetricVecBuilder};
use prometheus::proto::{Metric, MetricFamily, MetricType};
use prometheus::{HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry};

/// Latency buckets in seconds, from 0.5 ms (a cached store read) to 10 s
/// (a transaction waiting out its lock wait and more).
const LATENCY: &[f64] = &[0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];
/// Delivery lag buckets in seconds: from at once to a day of retries.
const LAG: &[f64] = &[0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0, 21600.0, 86400.0];

enum Kind {
    Counter,
    Gauge,
    Histogram(&'static [f64]),
}

/// A declared metric family.
pub struct Family {
    pub name: &'static str,
    pub help: &'static str,
    pub labels: &'static [&'static str],
    kind: Kind,
}

/// A counter family: a typed handle, its place among the counters a
/// [`Metrics`] registers fixed where it is declared (by `families!`).
pub struct Counter {
    pub family: Family,
    slot: usize,
}
/// A gauge family (as [`Counter`]).
pub struct Gauge {
    pub family: Family,
    slot: usize,
}
/// A histogram family (as [`Counter`]).
pub struct Histogram {
    pub family: Family,
    slot: usize,
}

impl Family {
    /// The family's type as the text format names it.
    pub fn kind(&self) -> &'static str {
        match self.kind {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram(_) => "histogram",
        }
    }
}

const fn counter(name: &'static str, labels: &'static [&'static str], help: &'static str) -> Family {
    Family { name, help, labels, kind: Kind::Counter }
}

const fn gauge(name: &'static str, labels: &'static [&'static str], help: &'static str) -> Family {
    Family { name, help, labels, kind: Kind::Gauge }
}

const fn histogram(
    name: &'static str,
    labels: &'static [&'static str],
    buckets: &'static [f64],
    help: &'static str,
) -> Family {
    Family { name, help, labels, kind: Kind::Histogram(buckets) }
}

/// Declares each family once: its typed handle (a constant), its slot
/// among its kind's (an enum variant, so a handle always names a family a
/// [`Metrics`] registered), and [`FAMILIES`]. A call names its family by
/// its handle, never by a string, and nothing is looked up by name.
macro_rules! families {
    (
        counters { $( $(#[$cdoc:meta])* $c:ident = ($($cargs:tt)*); )* }
        gauges { $( $(#[$gdoc:meta])* $g:ident = ($($gargs:tt)*); )* }
        histograms { $( $(#[$hdoc:meta])* $h:ident = ($($hargs:tt)*); )* }
    ) => {
        #[allow(non_camel_case_types, clippy::upper_case_acronyms)]
        enum CounterSlot { $($c),* }
        #[allow(non_camel_case_types, clippy::upper_case_acronyms)]
        enum GaugeSlot { $($g),* }
        #[allow(non_camel_case_types, clippy::upper_case_acronyms)]
        enum HistogramSlot { $($h),* }
        $(
            $(#[$cdoc])*
            pub(crate) const $c: Counter = Counter { family: counter($($cargs)*), slot: CounterSlot::$c as usize };
        )*
        $(
            $(#[$gdoc])*
            pub(crate) const $g: Gauge = Gauge { family: gauge($($gargs)*), slot: GaugeSlot::$g as usize };
        )*
        $(
            $(#[$hdoc])*
            pub(crate) const $h: Histogram =
                Histogram { family: histogram($($hargs)*), slot: HistogramSlot::$h as usize };
        )*
        /// The counters, each at its slot.
        const COUNTERS: &[&Counter] = &[$(&$c),*];
        /// The gauges, each at its slot.
        const GAUGES: &[&Gauge] = &[$(&$g),*];
        /// The histograms, each at its slot.
        const HISTOGRAMS: &[&Histogram] = &[$(&$h),*];
        /// Every family the gateway records. docs/operating.md, "Metrics",
        /// lists them too (tested). Families read from elsewhere at scrape
        /// time are registered by [`Metrics::sampled`].
        pub const FAMILIES: &[&Family] = &[$(&$c.family,)* $(&$g.family,)* $(&$h.family),*];
    };
}

families! {
    counters {
        /// HTTP requests answered, by method, route template (`unmatched` for unknown paths) and status.
        HTTP_REQUESTS = ("txgate_http_requests_total", &["method", "route", "status"], "HTTP requests answered, by method, route template (`unmatched` for unknown paths) and status");
        /// Transaction attempts by outcome: committed, aborted (a member failed or it was wounded), error (store).
        TRANSACTIONS = ("txgate_transactions_total", &["outcome"], "Transaction attempts by outcome: committed, aborted (a member failed or it was wounded), error (store)");
        /// Transaction attempts retried under a new id, by reason (wounded).
        TRANSACTION_RETRIES = ("txgate_transaction_retries_total", &["reason"], "Transaction attempts retried under a new id, by reason (wounded)");
        /// Transactions aborted by this instance, by reason (wounded, expired, timed_out, operator, a conflict code, ...).
        TRANSACTIONS_ABORTED = ("txgate_transactions_aborted_total", &["reason"], "Transactions aborted by this instance, by reason (wounded, expired, timed_out, operator, a conflict code, ...)");
        /// Transactions whose members were all released, by final state (done, rolled_back).
        TRANSACTIONS_FINISHED = ("txgate_transactions_finished_total", &["state"], "Transactions whose members were all released, by final state (done, rolled_back)");
        /// Requests answered with a conflict, by problem code (version_conflict, locked, not_found, ...).
        CONFLICTS = ("txgate_conflicts_total", &["code"], "Requests answered with a conflict, by problem code (version_conflict, locked, not_found, ...)");
        /// Times a transaction member waited for a document a live transaction held.
        LOCK_WAITS = ("txgate_lock_waits_total", &[], "Times a transaction member waited for a document a live transaction held");
        /// Younger transactions wounded (aborted) by an older one waiting for their lock.
        WOUNDS = ("txgate_wounds_total", &[], "Younger transactions wounded (aborted) by an older one waiting for their lock");
        /// Recovery work done: rolled_forward, rolled_back, expired, lock_released, outbox_published, skipped.
        RECOVERY_ACTIONS = ("txgate_recovery_actions_total", &["action"], "Recovery work done: rolled_forward, rolled_back, expired, lock_released, outbox_published, skipped");
        /// Webhook delivery attempts by result (success: a 2xx; failure: anything else).
        DELIVERY_ATTEMPTS = ("txgate_delivery_attempts_total", &["result"], "Webhook delivery attempts by result (success: a 2xx; failure: anything else)");
        /// Deliveries by outcome: delivered, retrying (an attempt failed, another is scheduled), dead (given up).
        DELIVERIES = ("txgate_deliveries_total", &["outcome"], "Deliveries by outcome: delivered, retrying (an attempt failed, another is scheduled), dead (given up)");
        /// Deliveries set aside because their destination had all its slots in use (destination_full).
        DELIVERIES_PARKED = ("txgate_deliveries_parked_total", &["reason"], "Deliveries set aside because their destination had all its slots in use (destination_full)");
        /// Documents expired by the TTL sweeper, by reason (max_age, max_count).
        TTL_DELETIONS = ("txgate_ttl_deletions_total", &["reason"], "Documents expired by the TTL sweeper, by reason (max_age, max_count)");
        /// Finished records purged after their retention (transactions, idempotency_keys, deliveries).
        PURGED = ("txgate_purged_total", &["what"], "Finished records purged after their retention (transactions, idempotency_keys, deliveries)");
        /// Users' tokens refused, by issuer (its name; `unknown` when `iss` names none) and problem code (token_expired, ...).
        TOKEN_REFUSALS = ("txgate_token_refusals_total", &["issuer", "code"], "Users' tokens refused, by issuer (its name; `unknown` when `iss` names none) and problem code (token_expired, ...)");
        /// Requests refused for their caller's request rate, by kind of caller (user, anonymous).
        RATE_LIMITED = ("txgate_rate_limited_total", &["caller"], "Requests refused for their caller's request rate, by kind of caller (user, anonymous)");
        /// Fetches of an issuer's keys (discovery and JWKS), by issuer and outcome (ok, error).
        ISSUER_KEY_FETCHES = ("txgate_issuer_key_fetches_total", &["issuer", "outcome"], "Fetches of an issuer's keys (discovery and JWKS), by issuer and outcome (ok, error)");
        /// Store operations that failed or missed the store deadline, by kind.
        STORE_ERRORS = ("txgate_store_errors_total", &["operation"], "Store operations that failed or missed the store deadline, by kind");
    }
    gauges {
        /// Requests being served now.
        HTTP_REQUESTS_IN_FLIGHT = ("txgate_http_requests_in_flight", &[], "Requests being served now");
        /// Server-Sent Event streams open on this instance.
        EVENT_STREAMS_OPEN = ("txgate_event_streams_open", &[], "Server-Sent Event streams open on this instance");
    }
    histograms {
        /// Time from a request's arrival to its response head (an event stream: until it starts).
        HTTP_REQUEST_DURATION = ("txgate_http_request_duration_seconds", &["method", "route"], LATENCY, "Time from a request's arrival to its response head (an event stream: until it starts)");
        /// Time from a transaction attempt's start to its answer, by outcome.
        TRANSACTION_DURATION = ("txgate_transaction_duration_seconds", &["outcome"], LATENCY, "Time from a transaction attempt's start to its answer, by outcome");
        /// How long a member waited for a held document before it locked it or gave up.
        LOCK_WAIT = ("txgate_lock_wait_seconds", &[], LATENCY, "How long a member waited for a held document before it locked it or gave up");
        /// Time from a delivery's creation (its commit) to its successful attempt.
        DELIVERY_LAG = ("txgate_delivery_lag_seconds", &[], LAG, "Time from a delivery's creation (its commit) to its successful attempt");
        /// Store operations by kind (get, scan, insert, replace, update, delete, append, write_in_order, ...).
        STORE_OPERATION_DURATION = ("txgate_store_operation_duration_seconds", &["operation"], LATENCY, "Store operations by kind (get, scan, insert, replace, update, delete, append, write_in_order, ...)");
    }
}

/// Series that exist at zero from the start, so that a rate or an alert
/// on them has data before the first event (label-less families too).
const AT_ZERO: &[(&Counter, &[&str])] = &[
    (&TRANSACTIONS, &["committed"]),
    (&TRANSACTIONS, &["aborted"]),
    (&TRANSACTIONS, &["error"]),
    (&DELIVERIES, &["delivered"]),
    (&DELIVERIES, &["retrying"]),
    (&DELIVERIES, &["dead"]),
    (&DELIVERY_ATTEMPTS, &["success"]),
    (&DELIVERY_ATTEMPTS, &["failure"]),
];

/// A counter whose total is kept elsewhere and read at each scrape.
struct Sampled {
    counter: IntCounter,
    read: Box<dyn Fn() -> u64 + Send + Sync>,
}

impl Collector for Sampled {
    fn desc(&self) -> Vec<&Desc> {
        self.counter.desc()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let (now, seen) = ((self.read)(), self.counter.get());
        if now > seen {
            self.counter.inc_by(now - seen);
        }
        self.counter.collect()
    }
}

/// A counter of seconds read from elsewhere (as [`Sampled`]).
struct SampledSeconds {
    counter: prometheus::Counter,
    read: Box<dyn Fn() -> Duration + Send + Sync>,
}

impl Collector for SampledSeconds {
    fn desc(&self) -> Vec<&Desc> {
        self.counter.desc()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let (now, seen) = ((self.read)().as_secs_f64(), self.counter.get());
        if now > seen {
            self.counter.inc_by(now - seen);
        }
        self.counter.collect()
    }
}

/// The metric families of one gateway, in their own registry.
pub struct Metrics {
    registry: Registry,
    /// Each at its family's slot.
    counters: Vec<IntCounterVec>,
    gauges: Vec<IntGaugeVec>,
    histograms: Vec<HistogramVec>,
}

impl Default for Metrics {
    fn default() -> Self {
        let registry = Registry::new();
        let opts = |f: &Family| Opts::new(f.name, f.help);
        let counters: Vec<IntCounterVec> = COUNTERS
            .iter()
            .map(|c| {
                let vec = IntCounterVec::new(opts(&c.family), c.family.labels).expect("a valid counter");
                declare(&registry, vec, c.family.labels)
            })
            .collect();
        let gauges = GAUGES
            .iter()
            .map(|g| {
                let vec = IntGaugeVec::new(opts(&g.family), g.family.labels).expect("a valid gauge");
                declare(&registry, vec, g.family.labels)
            })
            .collect();
        let histograms = HISTOGRAMS
            .iter()
            .map(|h| {
                // Every histogram is declared with its buckets (`histogram()`).
                let buckets = match h.family.kind {
                    Kind::Histogram(buckets) => buckets,
                    Kind::Counter | Kind::Gauge => prometheus::DEFAULT_BUCKETS,
                };
                let opts = HistogramOpts::from(opts(&h.family)).buckets(buckets.to_vec());
                let vec = HistogramVec::new(opts, h.family.labels).expect("a valid histogram");
                declare(&registry, vec, h.family.labels)
            })
            .collect();
        for (family, labels) in AT_ZERO {
            counters[family.slot].with_label_values(labels);
        }
        Self { registry, counters, gauges, histograms }
    }
}

/// Register `vec`; a label-less family gets its one series at once.
fn declare<T: MetricVecBuilder + 'static>(registry: &Registry, vec: MetricVec<T>, labels: &[&str]) -> MetricVec<T> {
    registry.register(Box::new(vec.clone())).expect("declared once");
    if labels.is_empty() {
        vec.with_label_values::<&str>(&[]);
    }
    vec
}

/// Holds one unit of a gauge until dropped (a request in flight, an open
/// stream).
pub struct Held(IntGauge);

impl Drop for Held {
    fn drop(&mut self) {
        self.0.dec();
    }
}

impl Metrics {
    /// Add `n` to `counter` at `labels` (one value per label key).
    pub fn count(&self, counter: &Counter, labels: &[&str], n: u64) {
        self.counters[counter.slot].with_label_values(labels).inc_by(n);
    }

    /// Add one to single-label `counter` at `label`.
    pub fn incr(&self, counter: &Counter, label: &str) {
        self.count(counter, &[label], 1);
    }

    pub fn add(&self, counter: &Counter, label: &str, n: u64) {
        self.count(counter, &[label], n);
    }

    /// Record `duration` in `histogram` at `labels`.
    pub fn observe(&self, histogram: &Histogram, labels: &[&str], duration: Duration) {
        self.histograms[histogram.slot].with_label_values(labels).observe(duration.as_secs_f64());
    }

    /// One more of label-less `gauge` until the guard is dropped.
    pub fn hold(&self, gauge: &Gauge) -> Held {
        let gauge = self.gauges[gauge.slot].with_label_values::<&str>(&[]);
        gauge.inc();
        Held(gauge)
    }

    /// `counter` at `labels` as it stands (tests, logs).
    pub fn get(&self, counter: &Counter, labels: &[&str]) -> u64 {
        self.counters[counter.slot].with_label_values(labels).get()
    }

    pub fn aborted(&self, reason: &str) {
        self.incr(&TRANSACTIONS_ABORTED, reason);
    }

    pub fn recovery_action(&self, kind: &str) {
        self.incr(&RECOVERY_ACTIONS, kind);
    }

    /// Expose a counter whose total `read` tells at each scrape (the store's
    /// syncs, the events this instance appended).
    pub fn sampled(&self, name: &'static str, help: &'static str, read: impl Fn() -> u64 + Send + Sync + 'static) {
        let counter = IntCounter::new(name, help).expect("a valid counter");
        let sampled = Sampled { counter, read: Box::new(read) };
        if let Err(err) = self.registry.register(Box::new(sampled)) {
            tracing::warn!(metric = name, error = %err, "metric not registered");
        }
    }

    /// A counter of seconds whose total `read` gives (as [`Self::sampled`]).
    pub fn sampled_seconds(
        &self,
        name: &'static str,
        help: &'static str,
        read: impl Fn() -> Duration + Send + Sync + 'static,
    ) {
        let counter = prometheus::Counter::new(name, help).expect("a valid counter");
        let sampled = SampledSeconds { counter, read: Box::new(read) };
        if let Err(err) = self.registry.register(Box::new(sampled)) {
            tracing::warn!(metric = name, error = %err, "metric not registered");
        }
    }

    /// Every counter with a value: name, labels (`key="value",...`) and
    /// total (the bench's counters).
    pub fn counters(&self) -> Vec<(String, String, u64)> {
        self.samples(MetricType::COUNTER, |m| m.get_counter().get_value() as u64)
            .into_iter()
            .filter(|(_, _, v)| *v > 0)
            .collect()
    }

    /// Every histogram's sum (seconds) and count, as [`Metrics::counters`].
    pub fn timings(&self) -> Vec<(String, String, f64, u64)> {
        self.samples(MetricType::HISTOGRAM, |m| {
            (m.get_histogram().get_sample_sum(), m.get_histogram().get_sample_count())
        })
        .into_iter()
        .filter(|(_, _, (_, count))| *count > 0)
        .map(|(n, l, (sum, count))| (n, l, sum, count))
        .collect()
    }

    fn samples<T>(&self, kind: MetricType, value: impl Fn(&Metric) -> T) -> Vec<(String, String, T)> {
        let mut out = Vec::new();
        for family in self.registry.gather().iter().filter(|f| f.get_field_type() == kind) {
            for m in family.get_metric() {
                let labels: Vec<String> =
                    m.get_label().iter().map(|l| format!("{}={:?}", l.name(), l.value())).collect();
                out.push((family.name().to_owned(), labels.join(","), value(m)));
            }
        }
        out
    }

    /// Every family in the Prometheus text format (version 0.0.4).
    pub fn render(&self) -> String {
        let families = self.registry.gather();
        prometheus::TextEncoder::new().encode_to_string(&families).unwrap_or_else(|err| {
            tracing::error!(error = %err, "cannot encode the metrics");
            String::new()
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[test]
    fn families_render_with_their_labels() {
        let m = Metrics::default();
        m.incr(&CONFLICTS, "version_conflict");
        m.count(&HTTP_REQUESTS, &["GET", "/v1/events", "200"], 2);
        m.count(&LOCK_WAITS, &[], 1);
        m.observe(&STORE_OPERATION_DURATION, &["get"], Duration::from_millis(3));
        let streams = m.hold(&EVENT_STREAMS_OPEN);
        let total = Arc::new(std::sync::atomic::AtomicU64::new(5));
        let read = Arc::clone(&total);
        m.sampled("txgate_store_syncs_total", "syncs", move || read.load(std::sync::atomic::Ordering::Relaxed));
        let text = m.render();
        assert!(text.contains("txgate_conflicts_total{code=\"version_conflict\"} 1"), "{text}");
        assert!(text.contains("txgate_http_requests_total{method=\"GET\",route=\"/v1/events\",status=\"200\"} 2"));
        assert!(text.contains("txgate_lock_waits_total 1"));
        assert!(text.contains("txgate_store_operation_duration_seconds_bucket{operation=\"get\",le=\"0.005\"} 1"));
        assert!(text.contains("txgate_event_streams_open 1"));
        assert!(text.contains("txgate_store_syncs_total 5"));
        drop(streams);
        total.store(9, std::sync::atomic::Ordering::Relaxed);
        m.sampled_seconds("txgate_store_checkpoint_seconds_total", "waited", || Duration::from_millis(1500));
        let text = m.render();
        assert!(text.contains("txgate_event_streams_open 0") && text.contains("txgate_store_syncs_total 9"), "{text}");
        assert!(text.contains("txgate_store_checkpoint_seconds_total 1.5"), "{text}");
        assert!(FAMILIES.iter().all(|f| f.name.starts_with("txgate_")));
    }
}

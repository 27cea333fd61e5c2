//! Crash and fault injection at every store operation of the commit
//! protocol and of recovery, then recovery by another engine on the same
//! store; afterwards the §3 guarantees must hold: all or nothing, no lock
//! left, exactly one outcome, and the answer given matches it. The same
//! for the delivery worker: whatever step it dies at, another worker
//! delivers every committed hook, in order, at least once.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use reqwest::Method;
use serde_json::json;
use txgate::testing::document::rules::Patch;
use txgate::testing::document::{StoredDoc, View};
use txgate::testing::hooks::DELIVERIES;
use txgate::testing::metrics::Metrics;
use txgate::testing::txn::commit::TxnError;
use txgate::testing::txn::plan::{Action, ActionOp, Plan};
use txgate::testing::txn::record::{Status, TXNS, TxnRecord};
use txgate::testing::txn::{Transactions, TxnConfig};
use txgate::testing::worker::Worker;
use txgate_store::{DateTime, DynStore, doc};

use crate::faulty::{Fault, faulty};
use crate::support::{Backend, TestApp, TestReceiver, TestStore, expect, test_config, txn_record};

const HOOKS: &str = r#"{"hooks":[{"url":"http://127.0.0.1:9/a","body":{"k":1}},{"url":"http://127.0.0.1:9/b"}]}"#;

fn fast_config() -> TxnConfig {
    TxnConfig {
        lease: Duration::from_millis(150),
        lock_wait: Duration::from_millis(100),
        clock_skew: Duration::from_millis(10),
        recovery_interval: Duration::from_millis(20),
        // Each engine's own, moved on past a lease instead of waiting it out.
        clock: txgate::testing::clock::Clock::shifted(),
        ..TxnConfig::default()
    }
}

/// Past `engine`'s lease and clock skew, by its clock.
fn past_lease(engine: &Transactions) {
    let cfg = engine.config();
    assert!(cfg.clock.advance(cfg.lease + cfg.clock_skew + Duration::from_millis(1)));
}

fn hooks(store: DynStore) -> Arc<txgate::testing::hooks::Hooks> {
    txgate::testing::hooks::Hooks::new(store, Arc::new(Metrics::default()), Default::default())
}

fn engine(store: DynStore) -> Arc<Transactions> {
    txgate::transactions(store, fast_config(), Arc::new(Metrics::default())).0
}

/// One scenario's documents: `u` (update), `r` (replace), `x` (delete) and
/// `k` (check) exist at version 1 with `n: 1`; `i` is inserted.
struct Scenario {
    coll: String,
    other: String,
    ids: [String; 5],
}

impl Scenario {
    async fn seed(store: &DynStore, tag: &str) -> Self {
        let ids = ["u", "r", "x", "k", "i"].map(|m| format!("{tag}-{m}"));
        let s = Self { coll: "crash".into(), other: "crash_other".into(), ids };
        let at = DateTime::now();
        for (coll, id) in s.members().into_iter().take(4) {
            let d = StoredDoc::new_live(id.into(), doc! {"n": 1_i64}, 1, 1, at);
            assert!(store.insert(coll, d.to_record()).await.unwrap());
        }
        s
    }

    fn plan(&self) -> Plan {
        let patch = Patch::parse(None, None, Some(json!({"n": 1}).as_object().unwrap()), "").unwrap();
        let m = self.members();
        let action = |i: usize, op, if_version| Action { collection: m[i].0.into(), id: m[i].1.into(), op, if_version };
        Plan {
            actions: vec![
                action(0, ActionOp::Update(patch), Some(1)),
                action(1, ActionOp::Replace(doc! {"n": 2_i64}), None),
                action(2, ActionOp::Delete, Some(1)),
                action(3, ActionOp::Check, Some(1)),
                action(4, ActionOp::Insert(doc! {"n": 2_i64}), None),
            ],
            schema_version: 1,
            request: HOOKS.into(),
            idempotency_key: None,
            hooks: txgate::testing::hooks::hooks_of(HOOKS),
            indexed: Default::default(),
            unique: Default::default(),
            claimed: Default::default(),
            schemas: Default::default(),
            warned: Default::default(),
            key: None,
            user: None,
        }
    }

    /// How many of the transaction's two deliveries exist.
    async fn deliveries(&self, store: &DynStore, txn: &str) -> usize {
        let mut n = 0;
        for i in 0..2 {
            n += usize::from(store.get(DELIVERIES, &format!("{txn}:{i}")).await.unwrap().is_some());
        }
        n
    }

    /// The ids of the change events of `txn` in the log.
    async fn events(&self, store: &DynStore, txn: &str) -> Vec<String> {
        let scan = txgate_store::scans::EVENTS_BY_SEQ.scan(Vec::new());
        let mut ids: Vec<String> = store
            .scan(txgate::testing::events::EVENTS, scan)
            .await
            .unwrap()
            .iter()
            .filter(|r| r.get_str("transaction").ok() == Some(txn))
            .map(|r| r.get_str("_id").unwrap().to_owned())
            .collect();
        ids.sort();
        ids
    }

    /// The events a commit of `txn` leaves (the check member has none).
    fn expected_events(&self, txn: &str) -> Vec<String> {
        let i = &self.ids;
        let mut ids = vec![
            format!("crash/{}/2", i[0]),
            format!("crash/{}/2", i[1]),
            format!("crash/{}/2", i[2]),
            format!("crash/{}/1", i[4]),
            format!("_txns/{txn}"),
        ];
        ids.sort();
        ids
    }

    /// Whether any member already carries its post-image unlocked (its
    /// lock was released by a roll-forward).
    async fn some_member_released(&self, store: &DynStore) -> bool {
        let docs = self.docs(store).await;
        docs.iter()
            .flatten()
            .any(|d| d.meta.txn.is_none() && (d.meta.v == 2 || (d.meta.v == 1 && d.id.ends_with("-i"))))
    }

    fn members(&self) -> [(&str, &str); 5] {
        let i = &self.ids;
        [(&self.coll, &i[0]), (&self.coll, &i[1]), (&self.coll, &i[2]), (&self.other, &i[3]), (&self.coll, &i[4])]
    }

    async fn docs(&self, store: &DynStore) -> Vec<Option<StoredDoc>> {
        let mut out = Vec::new();
        for (coll, id) in self.members() {
            out.push(store.get(coll, id).await.unwrap().map(|r| StoredDoc::from_record(r).unwrap()));
        }
        out
    }

    /// Whether every member is unlocked.
    async fn unlocked(&self, store: &DynStore) -> bool {
        self.docs(store).await.iter().flatten().all(|d| d.meta.txn.is_none())
    }

    /// All applied (`true`) or none (`false`); panics on a mix.
    async fn applied(&self, store: &DynStore) -> bool {
        let docs = self.docs(store).await;
        let n = |d: &Option<StoredDoc>| match d.as_ref().map(StoredDoc::committed_view) {
            Some(View::Live(l)) => Some((l.version, l.data.get_i64("n").unwrap())),
            Some(View::Deleted { version, .. }) => Some((version, -1)),
            _ => None,
        };
        let state: Vec<_> = docs.iter().map(n).collect();
        let after = vec![Some((2, 2)), Some((2, 2)), Some((2, -1)), Some((1, 1)), Some((1, 2))];
        let before = vec![Some((1, 1)), Some((1, 1)), Some((1, 1)), Some((1, 1)), None];
        if state == after {
            true
        } else if state == before {
            assert!(docs[4].is_none(), "the insert's placeholder was removed");
            false
        } else {
            panic!("not all-or-nothing: {state:?}");
        }
    }
}

/// Recover with a healthy engine until `txn` is finished and its members
/// are unlocked; returns the final record (if any was written).
async fn recover(store: &DynStore, s: &Scenario, txn: &str) -> Option<TxnRecord> {
    let healer = engine(Arc::clone(store));
    past_lease(&healer);
    for _ in 0..4 {
        healer.recover_once().await.unwrap();
        let rec = store.get(TXNS, txn).await.unwrap().map(|r| TxnRecord::from_record(r).unwrap());
        let finished = rec.as_ref().is_none_or(|r| matches!(r.status, Status::Done | Status::RolledBack));
        if finished && s.unlocked(store).await {
            return rec;
        }
    }
    let rec = store.get(TXNS, txn).await.unwrap();
    panic!("four passes of recovery past the lease did not finish {txn}: {rec:?}");
}

/// Run the scenario's transaction on a store failing with `fault`, recover
/// with another engine, check the guarantees. Returns whether the fault
/// struck and how many operations the faulty engine issued.
async fn run_case(store: &DynStore, tag: &str, fault: Fault) -> (bool, usize) {
    let s = Scenario::seed(store, tag).await;
    let faulty = faulty(Arc::clone(store), fault);
    let dying = engine(faulty.clone());
    let txn = uuid::Uuid::now_v7().to_string();
    let plan = s.plan();
    let answer = tokio::select! {
        a = tokio::time::timeout(Duration::from_secs(5), dying.execute(&plan, Some(txn.clone()))) => a.map_err(|_| ()),
        () = faulty.layer().died() => Err(()),
    };
    if matches!(fault, Fault::None) {
        // Let the background roll-forward finish, to count its operations.
        dying.tasks().close();
        dying.tasks().wait().await;
    }
    if matches!(fault, Fault::CrashLosingUnsynced(_)) {
        // A crash in the background roll-forward, after the answer, undoes
        // writes: recovery starts once the process is gone (or the
        // roll-forward finished without reaching the crash).
        dying.tasks().close();
        tokio::select! {
            () = faulty.layer().died() => {}
            () = dying.tasks().wait() => {}
        }
    }
    // Deliveries exist before any lock is released.
    if s.some_member_released(store).await {
        assert_eq!(s.deliveries(store, &txn).await, 2, "{fault:?}: a lock was released before the hooks were recorded");
        assert_eq!(
            s.events(store, &txn).await,
            s.expected_events(&txn),
            "{fault:?}: a lock was released before the events were logged"
        );
    }
    let rec = recover(store, &s, &txn).await;
    let applied = s.applied(store).await;
    assert_eq!(s.deliveries(store, &txn).await, if applied { 2 } else { 0 }, "{fault:?}: hooks exist iff committed");
    let expected = if applied { s.expected_events(&txn) } else { Vec::new() };
    assert_eq!(s.events(store, &txn).await, expected, "{fault:?}: events exist, once each, iff committed");
    match (&answer, rec.as_ref().map(|r| r.status)) {
        (_, None) => assert!(!applied, "{fault:?}: no record, so nothing may apply"),
        (_, Some(status)) => assert_eq!(applied, status == Status::Done, "{fault:?}: record {status:?} vs documents"),
    }
    match &answer {
        Ok(Ok(_)) => assert!(applied, "{fault:?}: answered committed, so everything applies"),
        Ok(Err(TxnError::OutcomeUnknown { .. })) | Err(()) => {}
        Ok(Err(e)) => assert!(!applied, "{fault:?}: answered {e}, so nothing may apply"),
    }
    (faulty.layer().triggered(), faulty.layer().ops())
}

async fn sweep_transaction(backend: Backend) {
    let Some(ts) = TestStore::new(backend).await else { return };
    let store = ts.store.clone();
    let (_, total) = run_case(&store, "clean", Fault::None).await;
    assert!(total >= 12, "a clean run issues every step ({total} operations)");
    let mut cases = 0;
    for n in 1..=total + 2 {
        for (name, fault) in [
            ("eb", Fault::ErrorBefore(n)),
            ("ea", Fault::ErrorAfter(n)),
            ("cb", Fault::Crash(n)),
            ("ca", Fault::CrashAfter(n)),
        ] {
            let (struck, _) = run_case(&store, &format!("{name}{n}"), fault).await;
            cases += usize::from(struck);
        }
    }
    assert!(cases >= 4 * total - 8, "faults struck at almost every operation ({cases} of {})", 4 * total);
}

/// The embedded store's crash model: at every operation of a transaction
/// (its answer, its roll-forward) the process dies and every write since
/// the last synced one is lost. Recovery must keep every answer given: a
/// commit answered stays applied with its hooks, a failure answered stays
/// unapplied.
async fn sweep_losing_unsynced(backend: Backend) {
    let Some(ts) = TestStore::new(backend).await else { return };
    let store = ts.store.clone();
    let (_, total) = run_case(&store, "clean", Fault::None).await;
    let mut struck = 0;
    for n in 1..=total + 2 {
        let (hit, _) = run_case(&store, &format!("lu{n}"), Fault::CrashLosingUnsynced(n)).await;
        struck += usize::from(hit);
    }
    assert!(struck >= total - 2, "crashes struck at almost every operation ({struck} of {total})");
}

/// Leave a transaction in the state a crash at operation `k` leaves, then
/// fail recovery at each of its operations, then recover cleanly.
async fn sweep_recovery(backend: Backend) {
    let Some(ts) = TestStore::new(backend).await else { return };
    let store = ts.store.clone();
    for k in [6, 12] {
        for n in 1..=20 {
            for (name, fault) in [("eb", Fault::ErrorBefore(n)), ("ea", Fault::ErrorAfter(n)), ("cb", Fault::Crash(n))]
            {
                let s = Scenario::seed(&store, &format!("r{k}{name}{n}")).await;
                let dying_store = faulty(Arc::clone(&store), Fault::CrashAfter(k));
                let dying = engine(dying_store.clone());
                let txn = uuid::Uuid::now_v7().to_string();
                let plan = s.plan();
                tokio::select! {
                    _ = dying.execute(&plan, Some(txn.clone())) => {}
                    () = dying_store.layer().died() => {}
                }
                let healer_store = faulty(Arc::clone(&store), fault);
                let faulty_healer = engine(healer_store.clone());
                past_lease(&faulty_healer);
                tokio::select! {
                    _ = faulty_healer.recover_once() => {}
                    () = healer_store.layer().died() => {}
                }
                let rec = recover(&store, &s, &txn).await;
                let applied = s.applied(&store).await;
                if let Some(rec) = rec {
                    assert_eq!(applied, rec.status == Status::Done, "k={k} {fault:?}");
                }
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_crash_at_every_step_of_a_transaction() {
    sweep_transaction(Backend::Embedded).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mongodb_crash_at_every_step_of_a_transaction() {
    sweep_transaction(Backend::Mongodb).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_crash_losing_unsynced_writes_at_every_step() {
    sweep_losing_unsynced(Backend::Embedded).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_crash_at_every_step_of_recovery() {
    sweep_recovery(Backend::Embedded).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mongodb_crash_at_every_step_of_recovery() {
    sweep_recovery(Backend::Mongodb).await;
}

/// Instance A dies mid-protocol; instance B (a real gateway with its own
/// recovery worker) finishes or undoes the work within lease + skew + two
/// recovery intervals.
async fn second_instance_takes_over(backend: Backend) {
    let Some(ts) = TestStore::new(backend).await else { return };
    let (_, total) = run_case(&ts.store, "twoclean", Fault::None).await;
    let mut undone = 0;
    let mut completed = 0;
    for k in 1..=total {
        // Each fault point on a fresh store, so that what B's recovery
        // reads does not grow with the sweep.
        let Some(ts) = TestStore::new(backend).await else { return };
        let store = ts.store.clone();
        let mut config = test_config(ts.config.clone());
        config.txn = TxnConfig {
            lease: Duration::from_millis(400),
            clock_skew: Duration::from_millis(50),
            recovery_interval: Duration::from_millis(100),
            ..config.txn
        };
        let b = TestApp::on_store(config.clone(), Arc::clone(&store), Some(ts)).await;
        let bound = config.txn.lease + config.txn.clock_skew + 2 * config.txn.recovery_interval;
        let s = Scenario::seed(&store, &format!("two{k}")).await;
        let a_store = faulty(Arc::clone(&store), Fault::CrashAfter(k));
        let a = txgate::transactions(a_store.clone(), config.txn.clone(), Arc::new(Metrics::default())).0;
        let txn = uuid::Uuid::now_v7().to_string();
        let plan = s.plan();
        tokio::select! {
            _ = a.execute(&plan, Some(txn.clone())) => {}
            () = a_store.layer().died() => {}
        }
        // Past lease + skew (the clock A and B share), within two passes
        // of B's recovery (the bound's two intervals).
        b.advance(config.txn.lease + config.txn.clock_skew + Duration::from_millis(1));
        let mut passes = 0;
        loop {
            let rec = store.get(TXNS, &txn).await.unwrap().map(|r| TxnRecord::from_record(r).unwrap());
            let finished = rec.as_ref().is_none_or(|r| matches!(r.status, Status::Done | Status::RolledBack));
            if finished && s.unlocked(&store).await {
                if s.applied(&store).await {
                    completed += 1
                } else {
                    undone += 1
                }
                break;
            }
            assert!(passes < 2, "k={k}: B did not take over within {bound:?} (two passes past the lease): {rec:?}");
            b.run_once("recovery").await;
            passes += 1;
        }
        // Through B, the documents read as the outcome says.
        let res = b.get(&format!("/v1/collections/{}/documents/{}", s.coll, s.ids[0])).await;
        let body = expect(res, 200).await;
        assert_eq!(body["version"], if s.applied(&store).await { 2 } else { 1 });
        let res = b.request(Method::GET, "/v1/transactions?status=pending").send().await.unwrap();
        assert_eq!(expect(res, 200).await["items"], json!([]));
        b.stop().await;
    }
    assert!(undone > 0 && completed > 0, "both outcomes were exercised ({undone} undone, {completed} completed)");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_second_instance_takes_over_abandoned_work() {
    second_instance_takes_over(Backend::Embedded).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mongodb_second_instance_takes_over_abandoned_work() {
    second_instance_takes_over(Backend::Mongodb).await;
}

/// A committed transaction with two hooks to `rx`, its deliveries recorded.
async fn committed_with_hooks(store: &DynStore, rx: &TestReceiver) -> String {
    let txn = uuid::Uuid::now_v7().to_string();
    let request = json!({"hooks": [{"url": rx.url(&format!("/{txn}/0"))}, {"url": rx.url(&format!("/{txn}/1"))}]});
    let rec =
        TxnRecord { request: request.to_string(), hook_count: 2, ..txn_record(&txn, Status::Committed, 0, "x", &[]) };
    hooks(Arc::clone(store)).record(&rec).await.unwrap();
    txn
}

fn delivery_worker(
    store: DynStore,
    scan_interval: Duration,
    clock: txgate::testing::clock::Clock,
) -> Arc<txgate::testing::hooks::send::Sender> {
    let cfg = txgate::testing::hooks::HookConfig {
        timeout: Duration::from_millis(500),
        claim_grace: Duration::from_millis(50),
        scan_interval,
        ..Default::default()
    };
    let guard = Arc::new(txgate::testing::hooks::guard::HookGuard::new("127.0.0.1:*").unwrap());
    let clients = txgate::testing::hooks::net::Clients::new(guard, cfg.timeout).unwrap();
    let hooks = txgate::testing::hooks::Hooks::new(store, Arc::new(Metrics::default()), clock);
    txgate::testing::hooks::send::Sender::new(hooks, cfg, clients)
}

async fn both_delivered(store: &DynStore, txn: &str) -> bool {
    for i in 0..2 {
        let rec = store.get(DELIVERIES, &format!("{txn}:{i}")).await.unwrap().unwrap();
        if rec.get_str("status").unwrap() != "delivered" {
            return false;
        }
    }
    true
}

/// Worker A runs passes on a store failing with `fault` until it dies, is
/// done or has made three; then worker B takes over, past A's claims by
/// the clock they share. Returns whether the fault struck and
/// how many operations A issued.
async fn delivery_case(store: &DynStore, rx: &TestReceiver, fault: Fault) -> (bool, usize) {
    let txn = committed_with_hooks(store, rx).await;
    let faulty = faulty(Arc::clone(store), fault);
    let clock = txgate::testing::clock::Clock::shifted();
    let a = delivery_worker(faulty.clone(), Duration::from_secs(60), clock.clone());
    for _ in 0..3 {
        // A dead process sends nothing more: its pass is dropped.
        tokio::select! {
            _ = a.run_once() => {}
            () = faulty.layer().died() => {}
        }
        if faulty.layer().crashed.load(Ordering::SeqCst) || both_delivered(store, &txn).await {
            break;
        }
    }
    let ops = faulty.layer().ops();
    let b = delivery_worker(Arc::clone(store), Duration::from_millis(50), clock.clone());
    let mut passes = 0;
    while !both_delivered(store, &txn).await {
        assert!(passes < 6, "{fault:?}: the hooks of {txn} were not delivered in {passes} passes");
        // Past A's claims and any retry's backoff.
        assert!(clock.advance(Duration::from_secs(60)));
        b.run_once().await.unwrap();
        passes += 1;
    }
    // What reached the receiver for this transaction: each hook at least
    // once, and hook 1 only after hook 0 was delivered.
    let got: Vec<_> = rx
        .collect_for(Duration::from_millis(50))
        .await
        .into_iter()
        .filter(|r| r.path.starts_with(&format!("/{txn}/")))
        .collect();
    let first = |i: usize| got.iter().position(|r| r.header("webhook-id") == format!("{txn}:{i}"));
    let (h0, h1) = (first(0), first(1));
    assert!(h0.is_some() && h1.is_some(), "{fault:?}: both hooks arrived: {got:?}");
    assert!(h0 < h1, "{fault:?}: hook 1 went before hook 0");
    (faulty.layer().triggered(), ops)
}

async fn sweep_delivery(backend: Backend) {
    let Some(ts) = TestStore::new(backend).await else { return };
    let store = ts.store.clone();
    txgate::testing::migrate::run(store.as_ref()).await.unwrap();
    let rx = TestReceiver::start().await;
    let (_, total) = delivery_case(&store, &rx, Fault::None).await;
    eprintln!("a clean delivery run issues {total} store operations");
    assert!(total >= 8, "a clean run claims, reads and finishes both hooks ({total} operations)");
    let mut struck = 0;
    for n in 1..=total {
        for fault in [Fault::ErrorBefore(n), Fault::ErrorAfter(n), Fault::Crash(n), Fault::CrashAfter(n)] {
            struck += usize::from(delivery_case(&store, &rx, fault).await.0);
        }
    }
    assert!(struck >= 3 * total, "faults struck at almost every operation ({struck} of {})", 4 * total);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_delivery_worker_dies_at_every_step() {
    sweep_delivery(Backend::Embedded).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mongodb_delivery_worker_dies_at_every_step() {
    sweep_delivery(Backend::Mongodb).await;
}

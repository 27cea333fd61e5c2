//! Background work costs what it finds: scans read their index, the lock
//! sweep reaches every zombie lock however many live locks sort ahead of
//! it and however large the collection, and a pass over a large, idle
//! store decodes almost nothing.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use txgate::testing::document::StoredDoc;
use txgate::testing::metrics::Metrics;
use txgate::testing::txn::record::{Status, TXNS};
use txgate::testing::txn::{Transactions, TxnConfig};
use txgate::testing::worker::Worker;
use txgate_store::scans::{DOCS_LIVE, DOCS_LOCKED, TXNS_BY_LEASE};
use txgate_store::{Bound, Bson, DateTime, DynStore, doc};

use crate::support::{Backend, TestStore, txn_record};

crate::on_both_backends!(zombie_behind_a_thousand_live_locks_is_cleared_within_the_bound);

/// Timings of the engine whose clock the tests move on.
fn config() -> TxnConfig {
    TxnConfig {
        lease: Duration::from_millis(1000),
        clock_skew: Duration::from_millis(200),
        recovery_interval: Duration::from_millis(500),
        // Moved on by the tests, past a lease, instead of waiting it out.
        clock: txgate::testing::clock::Clock::shifted(),
        ..TxnConfig::default()
    }
}

fn engine(store: DynStore) -> Arc<Transactions> {
    txgate::transactions(store, config(), Arc::new(Metrics::default())).0
}

/// Write `n` documents `<prefix><i>` to `coll`, locked by `holder` when
/// given, many at a time.
async fn fill(store: &DynStore, coll: &str, prefix: &str, n: usize, holder: Option<&str>) {
    let now = DateTime::now();
    futures::stream::iter(0..n)
        .map(|i| {
            let mut d = StoredDoc::new_live(format!("{prefix}{i:07}"), doc! {"i": i as i64}, 1, 1, now);
            d.meta.txn = holder.map(str::to_owned);
            let store = Arc::clone(store);
            let coll = coll.to_owned();
            async move { assert!(store.insert(&coll, d.to_record()).await.unwrap()) }
        })
        .buffer_unordered(256)
        .collect::<Vec<()>>()
        .await;
}

async fn holder_of(store: &DynStore, coll: &str, id: &str) -> Option<String> {
    StoredDoc::from_record(store.get(coll, id).await.unwrap().unwrap()).unwrap().meta.txn
}

/// Past lease + skew (the engine's clock moved on), run passes of the
/// recovery worker until every zombie in `zombies` is unlocked; how many
/// it took (the bound is lease + skew + two recovery intervals: two).
async fn clear(engine: &Arc<Transactions>, store: &DynStore, coll: &str, zombies: &[&str]) -> usize {
    let cfg = engine.config();
    assert!(cfg.clock.advance(cfg.lease + cfg.clock_skew + Duration::from_millis(1)));
    let mut passes = 0;
    for id in zombies {
        while holder_of(store, coll, id).await.is_some() {
            assert!(passes < 10, "{id} is still locked after {passes} recovery passes");
            engine.recovery().run_once().await.unwrap();
            passes += 1;
        }
    }
    passes
}

/// A transaction that is running (lease far away) holds 1,000 documents;
/// two zombie locks sort after it in the lock index: one whose holder was
/// rolled back, one whose holder record was purged. Both are cleared within
/// lease + skew + two recovery intervals; the live locks stay.
async fn zombie_behind_a_thousand_live_locks_is_cleared_within_the_bound(backend: Backend) {
    let Some(ts) = TestStore::new(backend).await else { return };
    let store = Arc::clone(&ts.store);
    let live = uuid::Uuid::now_v7().to_string();
    let members: Vec<String> = (0..1000).map(|i| format!("live{i:07}")).collect();
    let refs: Vec<&str> = members.iter().map(String::as_str).collect();
    let rec = txn_record(&live, Status::Pending, 600_000, "big", &refs);
    assert!(store.insert(TXNS, rec.to_record()).await.unwrap());
    fill(&store, "big", "live", 1000, Some(&live)).await;
    // Holders that sort after the live one.
    let (gone, purged) = (uuid::Uuid::now_v7().to_string(), uuid::Uuid::now_v7().to_string());
    let mut given_up = txn_record(&gone, Status::RolledBack, -10_000, "big", &["z1"]);
    given_up.finished_at = Some(DateTime::now());
    assert!(store.insert(TXNS, given_up.to_record()).await.unwrap());
    fill(&store, "big", "z1-", 1, Some(&gone)).await;
    fill(&store, "big", "z2-", 1, Some(&purged)).await;
    assert!(live < gone && gone < purged);

    let engine = engine(Arc::clone(&store));
    let passes = clear(&engine, &store, "big", &["z1-0000000", "z2-0000000"]).await;
    assert!(passes <= 2, "zombies cleared after {passes} recovery passes, bound 2");
    for id in ["live0000000", "live0000500", "live0000999"] {
        assert_eq!(holder_of(&store, "big", id).await.as_deref(), Some(live.as_str()), "{id} keeps its live lock");
    }
}

/// The embedded store, 100,000 documents: a zombie lock among them is
/// cleared within the bound, and a recovery pass over the idle store (one
/// zombie aside) decodes a handful of records, not the collection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_zombie_among_100k_documents_and_passes_that_decode_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let raw = Arc::new(txgate_store::embedded::EmbeddedStore::open(dir.path()).unwrap());
    let store: DynStore = Arc::new(txgate_store::templates::Templates::over(
        Arc::clone(&raw) as DynStore,
        txgate::testing::migrate::templates(),
    ));
    txgate::testing::migrate::run(store.as_ref()).await.unwrap();
    fill(&store, "many", "d", 100_000, None).await;
    // 5,000 finished transactions and one pending one far from its lease.
    futures::stream::iter(0..5000)
        .map(|i| {
            let store = Arc::clone(&store);
            async move {
                let mut rec = txn_record(&format!("old{i:05}"), Status::Done, -60_000, "many", &[]);
                rec.finished_at = Some(DateTime::now());
                store.insert(TXNS, rec.to_record()).await.unwrap();
            }
        })
        .buffer_unordered(256)
        .collect::<Vec<()>>()
        .await;
    let engine = engine(Arc::clone(&store));

    let before = raw.decoded();
    let pass = engine.recover_once().await.unwrap();
    let decoded = raw.decoded() - before;
    assert!(pass.is_idle(), "{pass:?}");
    assert!(decoded <= 2, "an idle pass over 100,000 documents decoded {decoded} records");

    let zombie = uuid::Uuid::now_v7().to_string();
    fill(&store, "many", "zombie", 1, Some(&zombie)).await;
    let passes = clear(&engine, &store, "many", &["zombie0000000"]).await;
    assert!(passes <= 2, "zombie cleared after {passes} recovery passes, bound 2");

    // Scans decode their results plus a small constant.
    let cases = [
        ("many", DOCS_LIVE.scan(vec![Bson::Boolean(false)]).limit(25), 25),
        ("many", DOCS_LOCKED.scan(vec![]).from(Bound::Included(Bson::String(String::new()))), 0),
        ("many", DOCS_LIVE.scan(vec![Bson::Boolean(false)]).after(Some("d0050000")).desc().limit(7), 7),
        (
            TXNS,
            TXNS_BY_LEASE.scan(vec![Status::Pending.to_bson()]).to(Bound::Excluded(Bson::DateTime(DateTime::now()))),
            0,
        ),
    ];
    for (coll, scan, want) in cases {
        let before = raw.decoded();
        let got = store.scan(coll, scan.clone()).await.unwrap();
        let decoded = raw.decoded() - before;
        assert_eq!(got.len(), want, "{scan:?}");
        assert!(decoded <= want as u64 + 2, "{scan:?} decoded {decoded} records for {want} results");
    }
}

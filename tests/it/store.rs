//! The store seam's contract, run against both backends and the memory
//! store the protocol's unit tests use: what each single-record operation
//! does, and what filters and scans mean.

use txgate_store::scans::{
    DELIVERIES_BY_DUE, DOCS_LIVE, DOCS_LOCKED, DOCS_STAGED, TXNS, TXNS_BY_LEASE, TXNS_BY_STATUS,
};
use txgate_store::{Bound, Bson, DateTime, Document, Durability, Found, Update, Write, doc};

use crate::support::{Backend, TestStore};

/// [`crate::on_both_backends`], the memory store, and the embedded store
/// under a layer that takes its chains apart (as the tests' fault
/// injector does), which takes away its atomic chains and its
/// all-or-nothing writes: the contract holds with and without them.
macro_rules! on_every_store {
    ($($name:ident),* $(,)?) => {
        crate::on_both_backends!($($name),*);
        mod memory {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name($crate::support::Backend::Memory).await
                }
            )*
        }
        mod embedded_chains_split {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::SPLIT.scope(true, super::$name($crate::support::Backend::Embedded)).await
                }
            )*
        }
    };
}

tokio::task_local! {
    /// Set for the `embedded_chains_split` runs.
    static SPLIT: bool;
}

/// Whether this run's store is under a layer that takes chains apart.
fn split() -> bool {
    SPLIT.try_with(|split| *split).unwrap_or(false)
}

on_every_store!(
    insert_is_insert_if_absent,
    conditional_replace_update_delete,
    a_failed_update_changes_nothing,
    writes_in_order_stop_at_the_first_not_applied,
    null_filter_matches_missing_fields,
    declared_scans_read_their_index,
    index_entries_match_records_under_random_writes,
    get_many_and_collections,
    int64_values_keep_type_and_precision,
    concurrent_cas_has_one_winner,
    every_migration_is_applied,
    appends_take_increasing_positions_once_per_key,
    writes_all_or_nothing_land_whole_or_not_at_all,
    a_snapshot_reads_one_point_and_writes_nothing,
    a_scan_of_some_fields_reads_those,
    a_query_stops_at_its_byte_budget,
    a_dropped_index_is_gone_and_a_missing_one_drops_quietly,
    a_query_along_an_index_not_there_reads_the_same_records,
    index_queries_read_values_of_every_type_in_one_order,
);

/// Index queries over values of every type an index orders (min and max
/// keys, null and missing, numbers of three kinds, strings, ObjectIds,
/// booleans, dates, timestamps), each read whole, counted, and in pages
/// resumed after a key, both ways along an ascending and a descending
/// index: every store answers what the memory store does, which reads as
/// the embedded store's index holds its entries. On MongoDB this is the
/// query each interval becomes, bracket by bracket.
async fn index_queries_read_values_of_every_type_in_one_order(backend: Backend) {
    use rand::seq::IndexedRandom;
    use rand::{Rng, SeedableRng};
    use txgate_store::{Edge, IndexQuery, Interval, Store};
    let Some(ts) = store(backend).await else { return };
    let s = &ts.store;
    let model = txgate_store::memory::MemoryStore::default();
    let seed = std::env::var("TXGATE_TEST_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(rand::random::<u64>);
    eprintln!("index query types seed: {seed} (TXGATE_TEST_SEED={seed} repeats it)");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let oid = |n: u8| Bson::ObjectId(::mongodb::bson::oid::ObjectId::from_bytes([n; 12]));
    let values = [
        Bson::MinKey,
        Bson::Null,
        Bson::Int32(-3),
        Bson::Int64(2),
        Bson::Double(2.5),
        Bson::Int32(7),
        Bson::Double(-0.5),
        Bson::String(String::new()),
        Bson::String("a".into()),
        Bson::String("ab".into()),
        oid(1),
        oid(9),
        Bson::Boolean(false),
        Bson::Boolean(true),
        Bson::DateTime(DateTime::from_millis(1_000)),
        Bson::DateTime(DateTime::from_millis(-5)),
        Bson::Timestamp(::mongodb::bson::Timestamp { time: 5, increment: 1 }),
        Bson::MaxKey,
    ];
    for i in 0..70 {
        let mut record = doc! {"_id": format!("r{i:02}")};
        // One in ten misses the field: indexed as null.
        if let Some(v) = values.choose(&mut rng).filter(|_| rng.random_bool(0.9)) {
            record.insert("v", v.clone());
        }
        assert!(s.insert("t", record.clone()).await.unwrap());
        assert!(model.insert("t", record).await.unwrap());
    }
    for fields in [["v", "_id"], ["-v", "_id"]] {
        let spec = txgate_store::IndexSpec {
            name: if fields[0] == "v" { "up" } else { "down" }.into(),
            fields: fields.map(str::to_owned).to_vec(),
            unique: false,
            sparse: false,
            counted: false,
        };
        s.ensure_index("t", spec.clone()).await.unwrap();
        model.ensure_index("t", spec).await.unwrap();
    }
    let edge = |rng: &mut rand::rngs::StdRng| match rng.random_range(0..5) {
        0 => Edge::Unbounded,
        1 => Edge::Bracket(values.choose(rng).unwrap().clone()),
        _ => Edge::Value { value: values.choose(rng).unwrap().clone(), inclusive: rng.random_bool(0.5) },
    };
    let ids = |found: Found| found.records.iter().map(|r| r.get_str("_id").unwrap().to_owned()).collect::<Vec<_>>();
    for round in 0..120 {
        let slot = match rng.random_range(0..4) {
            0 => None,
            // Everything but one value, as `$ne` asks.
            1 => {
                let v = values.choose(&mut rng).unwrap().clone();
                let but = Edge::Value { value: v, inclusive: false };
                Some(vec![
                    Interval { lower: Edge::Unbounded, upper: but.clone() },
                    Interval { lower: but, upper: Edge::Unbounded },
                ])
            }
            _ => Some(vec![Interval { lower: edge(&mut rng), upper: edge(&mut rng) }]),
        };
        let index = if rng.random_bool(0.5) { "up" } else { "down" };
        let mut query = IndexQuery {
            index: index.into(),
            keys: vec![("v".into(), index == "down"), ("_id".into(), false)],
            eq: Vec::new(),
            slot,
            reverse: rng.random_bool(0.5),
            after: None,
            limit: 1000,
            budget: usize::MAX,
        };
        let want = ids(model.query("t", &query).await.unwrap());
        assert_eq!(ids(s.query("t", &query).await.unwrap()), want, "round {round}: {query:?} (seed {seed})");
        assert_eq!(s.count("t", &query).await.unwrap(), want.len() as u64, "round {round}: count (seed {seed})");
        // In pages of three, each resumed after the last key read.
        query.limit = 3;
        let mut paged = Vec::new();
        for _ in 0..100 {
            let found = s.query("t", &query).await.unwrap();
            let Some(last) = found.records.last() else { break };
            let key =
                |r: &Document| query.order().iter().map(|(f, _)| r.get(f).cloned().unwrap_or(Bson::Null)).collect();
            query.after = Some(key(last));
            paged.extend(ids(found));
        }
        assert_eq!(paged, want, "round {round}: in pages (seed {seed})");
    }
}

/// `drop_index` removes the index (FerretDB 2.7's reply to it is one the
/// driver refuses; the backend then checks the index is gone), and
/// dropping one that is not there, or on a collection that is not, is not
/// an error.
async fn a_dropped_index_is_gone_and_a_missing_one_drops_quietly(backend: Backend) {
    let Some(ts) = store(backend).await else { return };
    let s = &ts.store;
    assert!(s.insert("c", doc! {"_id": "a", "n": 1}).await.unwrap());
    let fields = ["n", "_id"].map(str::to_owned).to_vec();
    let spec = txgate_store::IndexSpec { name: "by_n".into(), fields, unique: false, sparse: false, counted: false };
    s.declare_index("c", spec).await.unwrap();
    let names = |specs: Vec<txgate_store::IndexSpec>| specs.into_iter().map(|i| i.name).collect::<Vec<_>>();
    assert!(names(s.indexes("c").await.unwrap()).contains(&"by_n".to_owned()));
    s.drop_index("c", "by_n").await.unwrap();
    assert!(!names(s.indexes("c").await.unwrap()).contains(&"by_n".to_owned()));
    s.drop_index("c", "by_n").await.unwrap();
    s.drop_index("nowhere", "by_n").await.unwrap();
}

/// A query planned along an index the collection does not have (yet: a
/// collection another instance is creating has its template indexes made
/// one after another; or any more: dropped since the plan) answers the
/// records it would have, not an error: on MongoDB the hinted read is
/// refused, and the same read without the hint returns them.
async fn a_query_along_an_index_not_there_reads_the_same_records(backend: Backend) {
    use txgate_store::scans::DOCS_STAGED;
    let Some(ts) = store(backend).await else { return };
    let s = &ts.store;
    // A collection that has its first template index and not the others.
    let fields = ["_meta.deleted", "_id"].map(str::to_owned).to_vec();
    let live = txgate_store::IndexSpec { name: "live".into(), fields, unique: false, sparse: false, counted: false };
    s.ensure_index("half", live).await.unwrap();
    let staged = DOCS_STAGED.query(Bson::String("insert".into()), None, 10, 1 << 20);
    let found = s.query("half", &staged).await.expect("a query along an index not there yet");
    assert!(found.records.is_empty());
    assert_eq!(s.count("half", &staged).await.expect("a count along it"), 0);
}

/// Where a store applies writes all or nothing, a chain of them lands
/// whole when every condition holds, and not at all when one fails,
/// wherever it stands; a record written twice in one is refused. Where it
/// does not (MongoDB, the memory store, a layer that takes chains apart),
/// the call is refused and writes nothing.
async fn writes_all_or_nothing_land_whole_or_not_at_all(backend: Backend) {
    let Some(ts) = store(backend).await else { return };
    let s = &ts.store;
    assert_eq!(s.capabilities().all_or_nothing, backend == Backend::Embedded && !split());
    assert_eq!(s.capabilities().atomic_chains, s.capabilities().all_or_nothing);
    make_log(s).await;
    s.insert("c", doc! {"_id": "b", "v": 1}).await.unwrap();
    s.insert("c", doc! {"_id": "x", "v": 1}).await.unwrap();
    let chain = |v: i32, fresh: &'static str| {
        vec![
            ("c", Write::Replace { id: "b", filter: doc! {"v": v}, record: doc! {"v": v + 1} }),
            ("c", Write::Insert(doc! {"_id": fresh})),
            ("log", Write::Append(doc! {"_id": fresh})),
            ("c", Write::Delete { id: "x", filter: doc! {"v": 1} }),
        ]
    };
    let unchanged = move || async move {
        assert_eq!(s.get("c", "b").await.unwrap().unwrap(), doc! {"_id": "b", "v": 1});
        assert!(s.get("c", "x").await.unwrap().is_some());
        assert_eq!(s.get("c", "n1").await.unwrap(), None);
        assert_eq!(s.get("log", "n1").await.unwrap(), None);
    };
    if !s.capabilities().all_or_nothing {
        assert!(s.write_all_or_nothing(chain(1, "n1"), Durability::Synced).await.is_err());
        unchanged().await;
        return;
    }
    // One condition fails, first, in the middle or last: nothing lands.
    assert!(!s.write_all_or_nothing(chain(7, "n1"), Durability::Synced).await.unwrap(), "b is not at 7");
    unchanged().await;
    let mut taken = chain(1, "n1");
    taken[1] = ("c", Write::Insert(doc! {"_id": "x"}));
    assert!(!s.write_all_or_nothing(taken, Durability::Synced).await.unwrap(), "x exists");
    unchanged().await;
    let mut late = chain(1, "n1");
    late[3] = ("c", Write::Delete { id: "x", filter: doc! {"v": 2} });
    assert!(!s.write_all_or_nothing(late, Durability::Unsynced).await.unwrap(), "x is not at 2");
    unchanged().await;
    // A record written twice in one chain is refused.
    let mut twice = chain(1, "n1");
    twice.push(("c", Write::Update { id: "b", filter: doc! {}, update: Update::set(doc! {"w": 1}) }));
    assert!(s.write_all_or_nothing(twice, Durability::Synced).await.is_err());
    unchanged().await;
    // Every condition holds: all of it lands.
    assert!(s.write_all_or_nothing(chain(1, "n1"), Durability::Synced).await.unwrap());
    assert_eq!(s.get("c", "b").await.unwrap().unwrap(), doc! {"_id": "b", "v": 2});
    assert!(s.get("c", "n1").await.unwrap().is_some());
    assert!(s.get("log", "n1").await.unwrap().unwrap().get_i64("seq").is_ok(), "the append took a position");
    assert_eq!(s.get("c", "x").await.unwrap(), None);
}

/// A log collection: appends take increasing positions, a record is
/// logged once however many append it at once, and a position a reader
/// closed is never filled.
async fn appends_take_increasing_positions_once_per_key(backend: Backend) {
    let Some(ts) = store(backend).await else { return };
    let s = &ts.store;
    make_log(s).await;
    let u = s.unsynced();
    assert!(u.append("log", doc! {"_id": "a"}).await.unwrap());
    assert!(u.append("log", doc! {"_id": "b"}).await.unwrap());
    assert!(!u.append("log", doc! {"_id": "a"}).await.unwrap(), "a record is logged once");
    let all = |s: txgate_store::DynStore| async move {
        let scan = txgate_store::scans::EVENTS_BY_SEQ.scan(Vec::new());
        s.scan("log", scan).await.unwrap()
    };
    let keyed = |recs: &[Document]| -> Vec<(i64, String)> {
        recs.iter()
            .filter(|r| !r.get_bool("void").unwrap_or(false))
            .map(|r| (r.get_i64("seq").unwrap(), r.get_str("_id").unwrap().to_owned()))
            .collect()
    };
    let recs = all(s.clone()).await;
    assert_eq!(keyed(&recs), vec![(1, "a".to_owned()), (2, "b".to_owned())]);
    // A reader closes the next position: the next append goes past it.
    let last = recs.last().unwrap().get_i64("seq").unwrap() as u64;
    assert!(s.insert("log", txgate_store::void_entry(last + 1, DateTime::now())).await.unwrap());
    assert!(u.append("log", doc! {"_id": "c"}).await.unwrap());
    let c = keyed(&all(s.clone()).await).into_iter().find(|(_, k)| k == "c").unwrap();
    assert!(c.0 > (last + 1) as i64, "{c:?} filled the closed position {}", last + 1);
    // Many at once: distinct positions, one record per key.
    let appends = (0..40).map(|i| {
        let s = s.clone();
        async move { s.unsynced().append("log", doc! {"_id": format!("k{}", i % 20)}).await.unwrap() }
    });
    let applied = futures::future::join_all(appends).await.into_iter().filter(|a| *a).count();
    assert_eq!(applied, 20);
    let recs = all(s.clone()).await;
    assert_eq!(keyed(&recs).len(), 23, "{:?}", keyed(&recs));
    let seqs: Vec<i64> = recs.iter().map(|r| r.get_i64("seq").unwrap()).collect();
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "positions are unique, in order: {seqs:?}");
}

/// A log collection `log`: a unique index on its positions.
async fn make_log(s: &txgate_store::DynStore) {
    let index = txgate_store::IndexSpec {
        name: "seq".into(),
        fields: vec!["seq".into()],
        unique: true,
        sparse: false,
        counted: false,
    };
    s.ensure_index("log", index).await.unwrap();
}

async fn store(backend: Backend) -> Option<TestStore> {
    let mut ts = TestStore::new(backend).await?;
    if split() {
        ts.store = crate::faulty::faulty(ts.store, crate::faulty::Fault::None);
    }
    Some(ts)
}

async fn insert_is_insert_if_absent(backend: Backend) {
    let Some(ts) = store(backend).await else { return };
    let s = &ts.store;
    assert!(s.insert("c", doc! {"_id": "a", "n": 1}).await.unwrap());
    assert!(!s.insert("c", doc! {"_id": "a", "n": 2}).await.unwrap());
    assert_eq!(s.get("c", "a").await.unwrap().unwrap().get_i32("n").unwrap(), 1);
    assert_eq!(s.get("c", "missing").await.unwrap(), None);
    assert_eq!(s.get("other", "a").await.unwrap(), None);
}

async fn conditional_replace_update_delete(backend: Backend) {
    let Some(ts) = store(backend).await else { return };
    let s = &ts.store;
    s.insert("c", doc! {"_id": "a", "v": 1, "m": {"txn": Bson::Null}}).await.unwrap();
    assert!(!s.replace("c", "a", doc! {"v": 2}, doc! {"v": 3}).await.unwrap());
    assert!(s.replace("c", "a", doc! {"v": 1}, doc! {"v": 2, "m": {"txn": Bson::Null}}).await.unwrap());
    assert_eq!(s.get("c", "a").await.unwrap().unwrap(), doc! {"_id": "a", "v": 2, "m": {"txn": Bson::Null}});
    assert!(!s.replace("c", "nope", doc! {}, doc! {"v": 1}).await.unwrap(), "replace never inserts");

    let set = Update { set: doc! {"m.txn": "T", "m.x": 5}, unset: vec!["v".into()] };
    assert!(!s.update("c", "a", doc! {"m.txn": "U"}, set.clone()).await.unwrap());
    assert!(s.update("c", "a", doc! {"m.txn": Bson::Null}, set).await.unwrap());
    assert_eq!(s.get("c", "a").await.unwrap().unwrap(), doc! {"_id": "a", "m": {"txn": "T", "x": 5}});

    assert!(!s.delete("c", "a", doc! {"m.txn": Bson::Null}).await.unwrap());
    assert!(s.delete("c", "a", doc! {"m.txn": "T"}).await.unwrap());
    assert_eq!(s.get("c", "a").await.unwrap(), None);
    assert!(!s.delete("c", "a", doc! {}).await.unwrap());
}

/// An update that fails halfway (its second field cannot be set) leaves the
/// record as it was, for reads and for the next conditional write alike.
async fn a_failed_update_changes_nothing(backend: Backend) {
    let Some(ts) = store(backend).await else { return };
    let s = &ts.store;
    s.insert("c", doc! {"_id": "a", "n": 0_i64, "a": 1_i64}).await.unwrap();
    let bad = Update { set: doc! {"n": 5_i64, "a.b": 1_i64}, unset: vec![] };
    assert!(s.update("c", "a", doc! {}, bad).await.is_err(), "a.b cannot be set on a number");
    assert_eq!(s.get("c", "a").await.unwrap().unwrap(), doc! {"_id": "a", "n": 0_i64, "a": 1_i64});
    assert!(!s.update("c", "a", doc! {"n": 5_i64}, Update::set(doc! {"m": 1_i64})).await.unwrap());
    assert!(s.update("c", "a", doc! {"n": 0_i64}, Update::set(doc! {"m": 1_i64})).await.unwrap());
    assert_eq!(s.get("c", "a").await.unwrap().unwrap(), doc! {"_id": "a", "n": 0_i64, "a": 1_i64, "m": 1_i64});
}

async fn writes_in_order_stop_at_the_first_not_applied(backend: Backend) {
    use txgate_store::{Durability, Write};
    let Some(ts) = store(backend).await else { return };
    let s = &ts.store;
    s.insert("c", doc! {"_id": "b", "v": 1}).await.unwrap();
    for durability in [Durability::Unsynced, Durability::Synced] {
        // All applied, in order: the update sees the insert before it.
        let chain = vec![
            ("c", Write::Insert(doc! {"_id": "a", "v": 1})),
            ("c", Write::Update { id: "a", filter: doc! {"v": 1}, update: Update::set(doc! {"v": 2}) }),
            ("d", Write::Insert(doc! {"_id": "x"})),
        ];
        assert_eq!(s.write_in_order(chain, durability).await.unwrap(), 3);
        assert_eq!(s.get("c", "a").await.unwrap().unwrap(), doc! {"_id": "a", "v": 2});
        // The second write is not applied: the third is not attempted.
        let chain = vec![
            ("c", Write::Update { id: "b", filter: doc! {"v": 1}, update: Update::set(doc! {"v": 5}) }),
            ("c", Write::Insert(doc! {"_id": "a", "v": 9})),
            ("c", Write::Delete { id: "b", filter: doc! {} }),
        ];
        assert_eq!(s.write_in_order(chain, durability).await.unwrap(), 1);
        assert_eq!(s.get("c", "b").await.unwrap().unwrap(), doc! {"_id": "b", "v": 5});
        assert_eq!(s.get("c", "a").await.unwrap().unwrap(), doc! {"_id": "a", "v": 2});
        // The first is not applied: nothing is.
        let chain = vec![("c", Write::Insert(doc! {"_id": "b"})), ("c", Write::Delete { id: "a", filter: doc! {} })];
        assert_eq!(s.write_in_order(chain, durability).await.unwrap(), 0);
        assert!(s.get("c", "a").await.unwrap().is_some());
        // Inserts alone into one collection (one request on MongoDB): they
        // stop at the first record that exists, the rest not attempted.
        let inserts = |ids: &[&'static str]| ids.iter().map(|id| ("c", Write::Insert(doc! {"_id": *id}))).collect();
        assert_eq!(s.write_in_order(inserts(&["i1", "i2", "b", "i3"]), durability).await.unwrap(), 2);
        assert!(s.get("c", "i2").await.unwrap().is_some());
        assert!(s.get("c", "i3").await.unwrap().is_none());
        assert_eq!(s.get("c", "b").await.unwrap().unwrap(), doc! {"_id": "b", "v": 5});
        assert_eq!(s.write_in_order(inserts(&["i3", "i4"]), durability).await.unwrap(), 2);
        assert_eq!(s.write_in_order(inserts(&["i1", "i5"]), durability).await.unwrap(), 0);
        assert!(s.get("c", "i5").await.unwrap().is_none());
        for id in ["i1", "i2", "i3", "i4"] {
            assert!(s.delete("c", id, doc! {}).await.unwrap());
        }
        // Reset for the next round.
        assert!(s.delete("c", "a", doc! {}).await.unwrap());
        assert!(s.delete("d", "x", doc! {}).await.unwrap());
        assert!(s.replace("c", "b", doc! {}, doc! {"v": 1}).await.unwrap());
        assert_eq!(s.write_in_order(Vec::new(), durability).await.unwrap(), 0);
    }
}

async fn null_filter_matches_missing_fields(backend: Backend) {
    let Some(ts) = store(backend).await else { return };
    let s = &ts.store;
    s.insert("c", doc! {"_id": "a"}).await.unwrap();
    assert!(s.update("c", "a", doc! {"absent": Bson::Null}, Update::set(doc! {"x": 1})).await.unwrap());
    assert!(
        s.update("c", "a", doc! {"x": {"$in": [1, 2]}, "y": {"$exists": false}}, Update::set(doc! {"y": 1}))
            .await
            .unwrap()
    );
    assert!(!s.update("c", "a", doc! {"x": {"$ne": 1}}, Update::set(doc! {"z": 1})).await.unwrap());
}

/// Scans along declared indexes: equality prefix, type-bracketed bounds,
/// order in both directions, limits, `_id` cursors.
async fn declared_scans_read_their_index(backend: Backend) {
    let Some(ts) = store(backend).await else { return };
    let s = &ts.store;
    txgate::testing::migrate::run(s.as_ref()).await.unwrap();
    let at = |ms: i64| Bson::DateTime(DateTime::from_millis(ms));
    for (id, status, ms) in
        [("a", "pending", 5), ("b", "committed", 3), ("c", "pending", 1), ("d", "pending", 9), ("e", "done", 2)]
    {
        s.insert("_txns", doc! {"_id": id, "status": status, "expires_at": at(ms)}).await.unwrap();
    }
    s.insert("_txns", doc! {"_id": "f", "status": "pending", "expires_at": "not a date"}).await.unwrap();
    s.insert("_txns", doc! {"_id": "g", "status": "pending"}).await.unwrap();
    let ids =
        |recs: Vec<txgate_store::Record>| recs.iter().map(|r| r.get_str("_id").unwrap().to_owned()).collect::<Vec<_>>();
    let pending = || TXNS_BY_LEASE.scan(vec![Bson::String("pending".into())]);
    let scan = |scan| async { ids(s.scan("_txns", scan).await.unwrap()) };
    assert_eq!(scan(pending().to(Bound::Excluded(at(9)))).await, ["c", "a"], "dates below 9, never the string or null");
    assert_eq!(scan(pending().to(Bound::Included(at(9)))).await, ["c", "a", "d"]);
    assert_eq!(scan(pending().from(Bound::Excluded(at(1))).to(Bound::Included(at(9)))).await, ["a", "d"]);
    assert_eq!(scan(pending().from(Bound::Included(at(0))).desc().limit(2)).await, ["d", "a"]);
    assert_eq!(scan(TXNS_BY_STATUS.scan(vec![Bson::String("pending".into())])).await, ["a", "c", "d", "f", "g"]);
    let after_c = TXNS_BY_STATUS.scan(vec![Bson::String("pending".into())]).after(Some("c")).limit(2);
    assert_eq!(scan(after_c).await, ["d", "f"]);
    assert_eq!(scan(TXNS.scan(vec![]).after(Some("b")).limit(3)).await, ["c", "d", "e"]);
    assert_eq!(scan(TXNS.scan(vec![]).desc().limit(2)).await, ["g", "f"]);
    assert!(s.scan("empty", TXNS.scan(vec![])).await.unwrap().is_empty());
    // A user collection gets the templates on its first write.
    for (id, txn) in [("x", Bson::Null), ("y", Bson::String("T2".into())), ("z", Bson::String("T1".into()))] {
        s.insert("users", doc! {"_id": id, "_meta": {"txn": txn, "deleted": false}}).await.unwrap();
    }
    s.insert("users", doc! {"_id": "w", "_meta": {"deleted": true}}).await.unwrap();
    let locked = DOCS_LOCKED.scan(vec![]).from(Bound::Included(Bson::String(String::new())));
    assert_eq!(ids(s.scan("users", locked.clone()).await.unwrap()), ["z", "y"]);
    let past_t1 = DOCS_LOCKED.scan(vec![]).from(Bound::Excluded(Bson::String("T1".into())));
    assert_eq!(ids(s.scan("users", past_t1).await.unwrap()), ["y"]);
    assert_eq!(ids(s.scan("users", DOCS_LIVE.scan(vec![Bson::Boolean(false)])).await.unwrap()), ["x", "y", "z"]);
    // The lock index holds only locked documents on the embedded store: a
    // scan that could match an unlocked one is refused there.
    if backend == Backend::Embedded {
        assert!(s.scan("users", DOCS_LOCKED.scan(vec![])).await.is_err());
    }
}

async fn get_many_and_collections(backend: Backend) {
    let Some(ts) = store(backend).await else { return };
    let s = &ts.store;
    s.insert("b", doc! {"_id": "1"}).await.unwrap();
    s.insert("a", doc! {"_id": "1"}).await.unwrap();
    s.insert("a", doc! {"_id": "2"}).await.unwrap();
    let mut got: Vec<_> = s
        .get_many("a", &["2".into(), "1".into(), "9".into()])
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.get_str("_id").unwrap().to_owned())
        .collect();
    got.sort();
    assert_eq!(got, ["1", "2"]);
    let names = s.collections().await.unwrap();
    assert!(names.contains(&"a".to_owned()) && names.contains(&"b".to_owned()), "{names:?}");
}

/// A store that gives snapshots (the embedded one) gives one whose every
/// read, gets, scans of declared indexes and counts alike, sees the store
/// as it was when it was taken, whatever lands after; a write through it
/// is refused and changes nothing. A store that does not says so.
async fn a_snapshot_reads_one_point_and_writes_nothing(backend: Backend) {
    let Some(ts) = store(backend).await else { return };
    let s = &ts.store;
    s.insert("c", doc! {"_id": "a", "n": 1, "_meta": {"deleted": false}}).await.unwrap();
    let Some(snapshot) = s.snapshot().await.unwrap() else {
        assert!(!s.capabilities().snapshots, "{backend:?} says it gives snapshots but gave none");
        return;
    };
    assert!(s.capabilities().snapshots);
    s.insert("c", doc! {"_id": "b", "n": 2, "_meta": {"deleted": false}}).await.unwrap();
    s.update("c", "a", doc! {}, Update { set: doc! {"n": 10}, unset: vec![] }).await.unwrap();
    assert_eq!(snapshot.get("c", "a").await.unwrap().unwrap().get_i32("n").unwrap(), 1);
    assert_eq!(snapshot.get("c", "b").await.unwrap(), None);
    let live = |store: &txgate_store::DynStore| {
        let store = std::sync::Arc::clone(store);
        async move {
            let found = store.scan("c", DOCS_LIVE.scan(vec![Bson::Boolean(false)])).await.unwrap();
            found.iter().map(|r| r.get_str("_id").unwrap().to_owned()).collect::<Vec<_>>()
        }
    };
    assert_eq!(live(&snapshot).await, ["a"]);
    assert_eq!(live(s).await, ["a", "b"]);
    assert_eq!(snapshot.get_many("c", &["a".into(), "b".into()]).await.unwrap().len(), 1);
    assert!(snapshot.insert("c", doc! {"_id": "z"}).await.is_err(), "a snapshot took a write");
    assert_eq!(s.get("c", "z").await.unwrap(), None);
    // A snapshot taken now sees it all.
    let now = s.snapshot().await.unwrap().unwrap();
    assert_eq!(live(&now).await, ["a", "b"]);
    assert_eq!(now.get("c", "a").await.unwrap().unwrap().get_i32("n").unwrap(), 10);
}

/// A scan that names the fields it reads gets them exactly; the stores
/// that can leave the others out (embedded, MongoDB) do.
async fn a_scan_of_some_fields_reads_those(backend: Backend) {
    let Some(ts) = store(backend).await else { return };
    let s = &ts.store;
    let big: Vec<Bson> = (0..1000).map(|i| Bson::Document(doc! {"i": i, "s": "x".repeat(20)})).collect();
    for id in ["a", "b"] {
        s.insert("c", doc! {"_id": id, "n": 7_i64, "big": big.clone(), "_meta": {"deleted": false}}).await.unwrap();
    }
    let scan = DOCS_LIVE.scan(vec![Bson::Boolean(false)]).desc().limit(1).fields(&["n"]);
    let found = s.scan("c", scan).await.unwrap();
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].get("n"), Some(&Bson::Int64(7)));
    if backend != Backend::Memory {
        assert_eq!(found[0].get("big"), None, "{backend:?} decoded a field not asked for");
    }
    let all = s.scan("c", DOCS_LIVE.scan(vec![Bson::Boolean(false)]).limit(1)).await.unwrap();
    assert_eq!(all[0].get_array("big").unwrap().len(), 1000);
}

/// A query (or a scan) with a byte budget returns the records up to the
/// one that reaches it (at least one), says it was cut short, and resumes after
/// its last; the limit, reached first, is not a cut.
async fn a_query_stops_at_its_byte_budget(backend: Backend) {
    let Some(ts) = store(backend).await else { return };
    let s = &ts.store;
    for i in 0..10 {
        let record = doc! {"_id": format!("d{i}"), "s": "x".repeat(1000), "_meta": {"deleted": false}};
        s.insert("c", record).await.unwrap();
    }
    let one = doc! {"_id": "d0", "s": "x".repeat(1000), "_meta": {"deleted": false}};
    let mut bytes = Vec::new();
    one.to_writer(&mut bytes).unwrap();
    let size = |n: usize| n * bytes.len();
    let live = |after: Option<&str>, limit, budget| DOCS_LIVE.query(Bson::Boolean(false), after, limit, budget);
    let all = s.query("c", &live(None, 10, usize::MAX)).await.unwrap();
    assert_eq!((all.records.len(), all.bytes, all.cut), (10, size(10), false));
    // 2,500 bytes: the third record reaches them.
    let mut seen = Vec::new();
    let mut after: Option<String> = None;
    let mut reads = 0;
    loop {
        let found = s.query("c", &live(after.as_deref(), 10, 2500)).await.unwrap();
        reads += 1;
        assert!(!found.records.is_empty() || !found.cut, "{backend:?}: a cut read returned nothing");
        assert_eq!(found.bytes, size(found.records.len()));
        seen.extend(found.records.iter().map(|r| r.get_str("_id").unwrap().to_owned()));
        after = seen.last().cloned();
        if !found.cut {
            break;
        }
        assert_eq!(found.records.len(), 3, "{backend:?}");
    }
    assert_eq!(seen, (0..10).map(|i| format!("d{i}")).collect::<Vec<_>>());
    assert_eq!(reads, 4);
    // The limit reached with the budget: not a cut.
    let three = s.query("c", &live(None, 3, size(3))).await.unwrap();
    assert_eq!((three.records.len(), three.cut), (3, false));
    // A budget smaller than one record: that record.
    let one = s.query("c", &live(Some("d4"), 10, 1)).await.unwrap();
    assert_eq!((one.records.len(), one.cut), (1, true));
    assert_eq!(one.records[0].get_str("_id").unwrap(), "d5");
    // A scan stops the same way.
    let scan = |budget| DOCS_LIVE.scan(vec![Bson::Boolean(false)]).after(Some("d1")).limit(5).within(budget);
    let cut = s.scan_found("c", scan(2500)).await.unwrap();
    assert_eq!((cut.records.len(), cut.bytes, cut.cut), (3, size(3), true), "{backend:?}");
    assert_eq!(cut.records[0].get_str("_id").unwrap(), "d2");
    let whole = s.scan_found("c", scan(usize::MAX)).await.unwrap();
    assert_eq!((whole.records.len(), whole.cut), (5, false));
    // Reads by id too: the record that reaches the budget ends the read,
    // a cut only with ids left; missing ids take nothing.
    let ids: Vec<String> = ["d3", "nope", "d1", "d7", "d0"].iter().map(|s| s.to_string()).collect();
    let got = |found: &Found| {
        let mut ids: Vec<String> = found.records.iter().map(|r| r.get_str("_id").unwrap().to_owned()).collect();
        ids.sort();
        ids
    };
    let all = s.get_many_within("c", &ids, usize::MAX).await.unwrap();
    assert_eq!(
        (got(&all), all.bytes, all.cut),
        (vec!["d0".into(), "d1".into(), "d3".into(), "d7".into()], size(4), false)
    );
    let cut = s.get_many_within("c", &ids, 2 * size(1)).await.unwrap();
    assert_eq!((cut.records.len(), cut.bytes, cut.cut), (2, size(2), true), "{backend:?}");
    let fits = s.get_many_within("c", &["d3".into(), "d1".into()], 2 * size(1)).await.unwrap();
    assert_eq!((fits.records.len(), fits.cut), (2, false), "{backend:?}: the budget reached by the last id");
}

async fn int64_values_keep_type_and_precision(backend: Backend) {
    let Some(ts) = store(backend).await else { return };
    let s = &ts.store;
    let big = 9_007_199_254_740_993_i64;
    s.insert("c", doc! {"_id": "a", "n": big, "m": i64::MIN, "f": 1.5}).await.unwrap();
    let got = s.get("c", "a").await.unwrap().unwrap();
    assert_eq!(got.get("n"), Some(&Bson::Int64(big)));
    assert_eq!(got.get("m"), Some(&Bson::Int64(i64::MIN)));
    assert_eq!(got.get("f"), Some(&Bson::Double(1.5)));
}

async fn concurrent_cas_has_one_winner(backend: Backend) {
    let Some(ts) = store(backend).await else { return };
    ts.store.insert("c", doc! {"_id": "a", "v": 1}).await.unwrap();
    let tasks: Vec<_> = (0..16)
        .map(|i| {
            let s = std::sync::Arc::clone(&ts.store);
            tokio::spawn(async move { s.replace("c", "a", doc! {"v": 1}, doc! {"v": 2, "by": i}).await.unwrap() })
        })
        .collect();
    let mut wins = 0;
    for t in tasks {
        wins += usize::from(t.await.unwrap());
    }
    assert_eq!(wins, 1);
}

/// Random inserts, updates, replaces and deletes on a user collection and
/// on `_deliveries`: after every step each declared scan answers exactly
/// what filtering every record would (the model), on the store as it runs
/// and on the store reopened from disk.
async fn index_entries_match_records_under_random_writes(backend: Backend) {
    use rand::{Rng, SeedableRng};
    let Some(ts) = store(backend).await else { return };
    let s = &ts.store;
    txgate::testing::migrate::run(s.as_ref()).await.unwrap();
    // A counted index beside the declared scans (as a query index is):
    // its counts follow every write, counted and uncounted alike.
    s.ensure_index("users", by_holder(true)).await.unwrap();
    s.ensure_index("users", by_holder(false)).await.unwrap();
    let seed = std::env::var("TXGATE_TEST_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(rand::random::<u64>);
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut model: std::collections::BTreeMap<String, Document> = Default::default();
    let steps = if backend == Backend::Embedded { 400 } else { 120 };
    let holders = [Bson::Null, Bson::String("T1".into()), Bson::String("T2".into()), Bson::String("T10".into())];
    let ops = [Bson::Null, Bson::String("insert".into()), Bson::String("update".into())];
    let meta = |rng: &mut rand::rngs::StdRng| {
        let mut m = doc! {"v": rng.random_range(0..3_i64), "deleted": rng.random_bool(0.3)};
        let holder = holders[rng.random_range(0..holders.len())].clone();
        if holder != Bson::Null || rng.random_bool(0.5) {
            m.insert("txn", holder);
        }
        let op = ops[rng.random_range(0..ops.len())].clone();
        if op != Bson::Null {
            m.insert("pending", doc! {"op": op, "sv": 1_i64});
        }
        m
    };
    for step in 0..steps {
        let id = format!("d{:02}", rng.random_range(0..30));
        let doc = doc! {"_id": &id, "n": step, "_meta": meta(&mut rng)};
        match rng.random_range(0..5) {
            // A chain on few ids: a record written several times in one
            // batch (its index entries change once, at the batch's end).
            4 => {
                let ids: Vec<String> =
                    (0..rng.random_range(2..6)).map(|_| format!("d{:02}", rng.random_range(0..4))).collect();
                let mut sim = model.clone();
                let (mut writes, mut expected, mut stopped) = (Vec::new(), 0, false);
                for (k, id) in ids.iter().enumerate() {
                    let rec = doc! {"_id": id, "n": i64::from(step) * 10 + k as i64, "_meta": meta(&mut rng)};
                    let (write, applies) = match rng.random_range(0..3) {
                        0 => (Write::Insert(rec.clone()), !sim.contains_key(id)),
                        1 => (Write::Replace { id, filter: doc! {}, record: rec.clone() }, sim.contains_key(id)),
                        _ => (Write::Delete { id, filter: doc! {} }, sim.contains_key(id)),
                    };
                    if !stopped && applies {
                        expected += 1;
                        match &write {
                            Write::Delete { .. } => drop(sim.remove(id)),
                            _ => drop(sim.insert(id.clone(), rec)),
                        }
                    } else {
                        stopped = true;
                    }
                    writes.push(("users", write));
                }
                let applied = s.write_in_order(writes, Durability::Unsynced).await.unwrap();
                assert_eq!(applied, expected, "seed {seed}");
                model = sim;
            }
            0 => {
                let inserted = s.insert("users", doc.clone()).await.unwrap();
                assert_eq!(inserted, !model.contains_key(&id), "seed {seed}");
                model.entry(id).or_insert(doc);
            }
            1 => {
                let done = s.replace("users", &id, doc! {}, doc.clone()).await.unwrap();
                assert_eq!(done, model.contains_key(&id), "seed {seed}");
                if done {
                    model.insert(id, doc);
                }
            }
            2 => {
                let m = meta(&mut rng);
                let mut set = doc! {"_meta.deleted": m.get_bool("deleted").unwrap()};
                let mut unset = Vec::new();
                match m.get("txn") {
                    Some(t) => drop(set.insert("_meta.txn", t.clone())),
                    None => unset.push("_meta.txn".to_owned()),
                }
                let done =
                    s.update("users", &id, doc! {}, Update { set: set.clone(), unset: unset.clone() }).await.unwrap();
                assert_eq!(done, model.contains_key(&id), "seed {seed}");
                if let Some(d) = model.get_mut(&id) {
                    let meta = d.get_document_mut("_meta").unwrap();
                    meta.insert("deleted", set.get("_meta.deleted").unwrap().clone());
                    match set.get("_meta.txn") {
                        Some(t) => drop(meta.insert("txn", t.clone())),
                        None => drop(meta.remove("txn")),
                    }
                }
            }
            _ => {
                let done = s.delete("users", &id, doc! {}).await.unwrap();
                assert_eq!(done, model.remove(&id).is_some(), "seed {seed}");
            }
        }
        if step % 20 == 19 || step == steps - 1 {
            check_user_scans(s.as_ref(), &model, seed).await;
        }
    }
    // Deliveries: dates and statuses through the due-time index.
    let mut due: std::collections::BTreeMap<String, (String, i64)> = Default::default();
    for step in 0..(steps / 2) {
        let id = format!("t:{}", rng.random_range(0..20));
        let status = ["pending", "failed", "delivered"][rng.random_range(0..3)].to_owned();
        let at = rng.random_range(0..50_i64);
        let rec = doc! {"_id": &id, "status": &status, "next_at": DateTime::from_millis(at)};
        if rng.random_bool(0.8) {
            if !s.replace("_deliveries", &id, doc! {}, rec.clone()).await.unwrap() {
                s.insert("_deliveries", rec).await.unwrap();
            }
            due.insert(id, (status, at));
        } else {
            s.delete("_deliveries", &id, doc! {}).await.unwrap();
            due.remove(&id);
        }
        if step % 10 == 9 {
            for status in ["pending", "failed"] {
                let scan = DELIVERIES_BY_DUE
                    .scan(vec![Bson::String(status.into())])
                    .to(Bound::Included(Bson::DateTime(DateTime::from_millis(25))));
                let got: Vec<(String, i64)> = s
                    .scan("_deliveries", scan)
                    .await
                    .unwrap()
                    .iter()
                    .map(|r| {
                        (r.get_str("_id").unwrap().to_owned(), r.get_datetime("next_at").unwrap().timestamp_millis())
                    })
                    .collect();
                let mut want: Vec<(String, i64)> = due
                    .iter()
                    .filter(|(_, (st, at))| st == status && *at <= 25)
                    .map(|(id, (_, at))| (id.clone(), *at))
                    .collect();
                want.sort_by_key(|(id, at)| (*at, id.clone()));
                let mut got_sorted = got.clone();
                got_sorted.sort_by_key(|(id, at)| (*at, id.clone()));
                assert_eq!(got_sorted, want, "seed {seed}");
                assert!(got.windows(2).all(|w| w[0].1 <= w[1].1), "ordered by due time: {got:?} (seed {seed})");
            }
        }
    }
    // The same answers from the store as reopened, and from a copy of its
    // files taken while it runs: a crash, as far as the copy can tell.
    // redb's file then holds only what it held at open; the journal holds
    // the rest, records and index entries alike.
    if let txgate::config::StoreConfig::Embedded { data_dir, .. } = &ts.config {
        ts.store.sync().await.unwrap();
        let crashed = tempfile::tempdir().unwrap();
        for file in ["txgate.redb", "txgate.journal"] {
            std::fs::copy(data_dir.join(file), crashed.path().join(file)).unwrap();
        }
        let config = ts.config.clone();
        let TestStore { store, _dir, .. } = ts;
        drop(store);
        let reopened = reopen(&config).await;
        check_user_scans(reopened.as_ref(), &model, seed).await;
        drop(reopened);
        let mut crash_config = config.clone();
        if let txgate::config::StoreConfig::Embedded { data_dir, .. } = &mut crash_config {
            *data_dir = crashed.path().to_owned();
        }
        let recovered = reopen(&crash_config).await;
        check_user_scans(recovered.as_ref(), &model, seed).await;
        drop(_dir);
    }
}

/// The store of `config` opened again: at once, as a dropped embedded
/// store has let go of its file.
async fn reopen(config: &txgate::config::StoreConfig) -> txgate_store::DynStore {
    crate::support::templated(txgate::open_store(config).await.expect("the store opens again"))
}

/// Every template scan of `users` against the model.
/// An index of users by liveness and lock holder: counted, or not (one
/// without a last `_id`, which the embedded store adds all the same, as
/// MongoDB refuses two indexes of the same keys).
fn by_holder(counted: bool) -> txgate_store::IndexSpec {
    let mut fields: Vec<String> = vec!["_meta.deleted".into(), "_meta.txn".into(), "n".into()];
    if counted {
        fields.push("_id".into());
    }
    txgate_store::IndexSpec {
        name: if counted { "holder_counted" } else { "holder" }.into(),
        fields,
        unique: false,
        sparse: false,
        counted,
    }
}

/// A count along `index`: its first fields pinned to `eq`, the next within
/// `slot`.
fn count_query(
    index: &txgate_store::IndexSpec,
    eq: Vec<Bson>,
    slot: Option<Vec<txgate_store::Interval>>,
) -> txgate_store::IndexQuery {
    txgate_store::IndexQuery {
        index: index.name.clone(),
        keys: txgate_store::IndexQuery::keys_of(index),
        eq,
        slot,
        reverse: false,
        after: None,
        limit: 0,
        budget: usize::MAX,
    }
}

/// Counts of [`by_holder`] pinning its first fields by equality, counted
/// and walked, against the model.
async fn check_counts(s: &dyn txgate_store::Store, model: &std::collections::BTreeMap<String, Document>, seed: u64) {
    use txgate_store::{Edge, Interval};
    let meta = |d: &Document| d.get_document("_meta").unwrap().clone();
    let holders = [Bson::Null, Bson::String("T1".into()), Bson::String("T2".into()), Bson::String("T10".into())];
    for deleted in [false, true] {
        let mut pins = vec![vec![Bson::Boolean(deleted)]];
        pins.extend(holders.iter().map(|h| vec![Bson::Boolean(deleted), h.clone()]));
        // The first document's `n`, with its holder: all three fields pinned.
        if let Some(d) = model.values().find(|d| meta(d).get_bool("deleted") == Ok(deleted)) {
            let holder = meta(d).get("txn").cloned().unwrap_or(Bson::Null);
            pins.push(vec![Bson::Boolean(deleted), holder, d.get("n").unwrap().clone()]);
        }
        // Two holders at once (`$in`): points of the field after `deleted`;
        let point = |v: &str| Interval {
            lower: Edge::Value { value: Bson::String(v.into()), inclusive: true },
            upper: Edge::Value { value: Bson::String(v.into()), inclusive: true },
        };
        // Every holder but those (`$nin`), a missing one included: the
        // ranges between them.
        let but = |v: &str| Edge::Value { value: Bson::String(v.into()), inclusive: false };
        let others = vec![
            Interval { lower: Edge::Unbounded, upper: but("T1") },
            Interval { lower: but("T1"), upper: but("T2") },
            Interval { lower: but("T2"), upper: Edge::Unbounded },
        ];
        for (slot, filter, within) in [
            (vec![point("T1"), point("T2")], doc! {"$in": ["T1", "T2"]}, true),
            (others, doc! {"$nin": ["T1", "T2"]}, false),
        ] {
            let want = model
                .values()
                .filter(|d| {
                    meta(d).get_bool("deleted") == Ok(deleted)
                        && matches!(meta(d).get_str("txn"), Ok("T1" | "T2")) == within
                })
                .count() as u64;
            for counted in [true, false] {
                let query = count_query(&by_holder(counted), vec![Bson::Boolean(deleted)], Some(slot.clone()));
                let got = s.count("users", &query).await.unwrap();
                assert_eq!(got, want, "count of {filter} along {} (seed {seed})", query.index);
            }
        }
        // Ranges (as MongoDB brackets them by type): of the holder after
        // `deleted`, and of `n` after both; the counted index walks the
        // smaller of the range and the rest of its prefix, the other walks
        // the range.
        let value = |v: &str, inclusive: bool| Edge::Value { value: Bson::String(v.into()), inclusive };
        let strings = || Edge::Bracket(Bson::String(String::new()));
        type Within = fn(&str) -> bool;
        let txn_ranges: [(Interval, Document, Within); 3] = [
            (Interval { lower: value("T1", false), upper: strings() }, doc! {"$gt": "T1"}, |t| t > "T1"),
            (Interval { lower: strings(), upper: value("T10", true) }, doc! {"$lte": "T10"}, |t| t <= "T10"),
            (
                Interval { lower: value("T10", true), upper: value("T2", false) },
                doc! {"$gte": "T10", "$lt": "T2"},
                |t| ("T10".."T2").contains(&t),
            ),
        ];
        for (interval, filter, within) in txn_ranges {
            let want = model
                .values()
                .filter(|d| meta(d).get_bool("deleted") == Ok(deleted) && meta(d).get_str("txn").is_ok_and(within))
                .count() as u64;
            for counted in [true, false] {
                let query =
                    count_query(&by_holder(counted), vec![Bson::Boolean(deleted)], Some(vec![interval.clone()]));
                let got = s.count("users", &query).await.unwrap();
                assert_eq!(got, want, "count of txn {filter} along {} (seed {seed})", query.index);
            }
        }
        let numbers = || Edge::Bracket(Bson::Int64(0));
        for holder in &holders {
            for (lower, upper) in [(Some(30), None), (None, Some(120)), (Some(0), Some(1000)), (Some(55), Some(56))] {
                let interval = Interval {
                    lower: lower.map_or_else(numbers, |n: i64| Edge::Value { value: Bson::Int64(n), inclusive: true }),
                    upper: upper.map_or_else(numbers, |n: i64| Edge::Value { value: Bson::Int64(n), inclusive: false }),
                };
                let mut filter = Document::new();
                if let Some(l) = lower {
                    filter.insert("$gte", l);
                }
                if let Some(u) = upper {
                    filter.insert("$lt", u);
                }
                let want = model
                    .values()
                    .filter(|d| {
                        let m = meta(d);
                        let n = match d.get("n") {
                            Some(Bson::Int32(n)) => i64::from(*n),
                            Some(Bson::Int64(n)) => *n,
                            other => panic!("n is {other:?}"),
                        };
                        m.get_bool("deleted") == Ok(deleted)
                            && m.get("txn").cloned().unwrap_or(Bson::Null) == *holder
                            && lower.is_none_or(|l| n >= l)
                            && upper.is_none_or(|u| n < u)
                    })
                    .count() as u64;
                for counted in [true, false] {
                    let query = count_query(
                        &by_holder(counted),
                        vec![Bson::Boolean(deleted), holder.clone()],
                        Some(vec![interval.clone()]),
                    );
                    let got = s.count("users", &query).await.unwrap();
                    assert_eq!(got, want, "count of n {filter} along {} (seed {seed})", query.index);
                }
            }
        }
        for eq in pins {
            let want = model
                .values()
                .filter(|d| {
                    let m = meta(d);
                    // `n` is an Int32 from single writes and an Int64 from
                    // chains: equal numbers are one value to an index.
                    let number = |b: &Bson| match b {
                        Bson::Int32(n) => Bson::Int64(i64::from(*n)),
                        other => other.clone(),
                    };
                    let values = [
                        Bson::Boolean(m.get_bool("deleted").unwrap()),
                        m.get("txn").cloned().unwrap_or(Bson::Null),
                        number(d.get("n").unwrap()),
                    ];
                    values.iter().zip(&eq).all(|(v, e)| *v == number(e))
                })
                .count() as u64;
            // The uncounted index has no field after the three (its `_id`
            // is the store's own), so it is asked fewer.
            for counted in [true, false].into_iter().filter(|c| *c || eq.len() < 3) {
                let query = count_query(&by_holder(counted), eq.clone(), None);
                let got = s.count("users", &query).await.unwrap();
                assert_eq!(got, want, "count {eq:?} along {} (seed {seed})", query.index);
            }
        }
    }
}

async fn check_user_scans(
    s: &dyn txgate_store::Store,
    model: &std::collections::BTreeMap<String, Document>,
    seed: u64,
) {
    check_counts(s, model, seed).await;
    let ids =
        |recs: Vec<txgate_store::Record>| recs.iter().map(|r| r.get_str("_id").unwrap().to_owned()).collect::<Vec<_>>();
    let meta = |d: &Document| d.get_document("_meta").unwrap().clone();
    for deleted in [false, true] {
        let got = ids(s.scan("users", DOCS_LIVE.scan(vec![Bson::Boolean(deleted)])).await.unwrap());
        let want: Vec<String> = model
            .iter()
            .filter(|(_, d)| meta(d).get_bool("deleted").unwrap() == deleted)
            .map(|(id, _)| id.clone())
            .collect();
        assert_eq!(got, want, "live={deleted} (seed {seed})");
    }
    let got = ids(s.scan("users", DOCS_STAGED.scan(vec![Bson::String("insert".into())])).await.unwrap());
    let want: Vec<String> = model
        .iter()
        .filter(|(_, d)| meta(d).get_document("pending").is_ok_and(|p| p.get_str("op") == Ok("insert")))
        .map(|(id, _)| id.clone())
        .collect();
    assert_eq!(got, want, "staged inserts (seed {seed})");
    let locked = DOCS_LOCKED.scan(vec![]).from(Bound::Included(Bson::String(String::new())));
    let got: Vec<(String, String)> = s
        .scan("users", locked)
        .await
        .unwrap()
        .iter()
        .map(|r| {
            (r.get_document("_meta").unwrap().get_str("txn").unwrap().to_owned(), r.get_str("_id").unwrap().to_owned())
        })
        .collect();
    let mut want: Vec<(String, String)> =
        model.iter().filter_map(|(id, d)| meta(d).get_str("txn").ok().map(|t| (t.to_owned(), id.clone()))).collect();
    want.sort();
    let mut got_sorted = got.clone();
    got_sorted.sort();
    assert_eq!(got_sorted, want, "locked (seed {seed})");
    assert!(got.windows(2).all(|w| w[0].0 <= w[1].0), "ordered by holder: {got:?} (seed {seed})");
}

/// Every file in `migrations/` is applied at start and recorded; on the
/// mongodb backend each index it names exists on the server.
async fn every_migration_is_applied(backend: Backend) {
    let Some(app) = crate::support::TestApp::spawn(backend).await else { return };
    // The gateway serves once its migrations are applied.
    assert_eq!(app.get("/readyz").await.status(), 200);
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("migrations");
    let mut files: Vec<_> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).collect();
    files.sort();
    assert!(files.len() >= 2, "{files:?}");
    for path in &files {
        let name = path.file_stem().unwrap().to_str().unwrap();
        let recorded = app.store.get(txgate::testing::migrate::MIGRATIONS_COLLECTION, name).await.unwrap();
        assert!(recorded.is_some(), "migration {name} was not applied");
    }
    // Every index they leave exists on the server (listed by the backend
    // itself: the catalog of the embedded store, listIndexes on MongoDB);
    // user collections get the templates on their first write.
    let created = app.post("/v1/collections/things/documents", &serde_json::json!({"a": 1})).await;
    assert_eq!(created.status(), 201);
    let declared = txgate::testing::migrate::declared_indexes();
    assert!(declared.iter().any(|(c, _)| c == "*") && declared.len() >= 8, "{declared:?}");
    for (coll, index) in &declared {
        let coll = if coll == "*" { "things" } else { coll.as_str() };
        let have = app.store.indexes(coll).await.unwrap();
        let found = have.iter().find(|h| h.name == index.name);
        assert_eq!(found.map(|h| &h.fields), Some(&index.fields), "{coll} lacks index {}: {have:?}", index.name);
    }
    let deliveries = app.store.indexes("_deliveries").await.unwrap();
    assert!(!deliveries.iter().any(|i| i.name == "status_next"), "a dropped index stays dropped: {deliveries:?}");
    app.stop().await;
}

/// Online builds on the embedded store read runs of records and add
/// their entries later, in key order: whatever is written between the
/// read and the steps (values moved, records deleted, inserted before and
/// after the build's place), each index ends holding exactly the entries
/// and counts of the records, with two builds going on at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_online_builds_hold_exactly_the_records_whatever_is_written_meanwhile() {
    use std::sync::Arc;
    use txgate_store::Store;
    use txgate_store::embedded::{EmbeddedStore, Options};
    use txgate_store::simdisk::SimDisk;
    let options = Options { run_records: 9, ..Options::default() };
    let store = EmbeddedStore::open_on(Arc::new(SimDisk::new()), &options).unwrap();
    let spec = |name: &str, fields: [&str; 2]| txgate_store::IndexSpec {
        name: name.into(),
        fields: vec![fields[0].into(), fields[1].into(), "_id".into()],
        unique: false,
        sparse: false,
        counted: true,
    };
    for i in 0..100_i64 {
        store.insert("c", doc! {"_id": format!("r{i:03}"), "s": i % 4, "n": i}).await.unwrap();
    }
    let (a, b) = (spec("a", ["s", "n"]), spec("b", ["n", "s"]));
    store.declare_index("c", a.clone()).await.unwrap();
    store.declare_index("c", b.clone()).await.unwrap();
    let (mut after_a, mut after_b) = (None::<String>, None::<String>);
    let (mut done_a, mut done_b) = (false, false);
    let mut seed = 7_u64;
    let mut next = |n: u64| {
        seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (seed >> 33) % n
    };
    let mut steps = 0;
    while !(done_a && done_b) {
        steps += 1;
        assert!(steps < 1000, "the builds go on without end");
        if !done_a {
            after_a = store.build_index_step("c", "a", after_a.as_deref(), 4).await.unwrap();
            done_a = after_a.is_none();
        }
        if !done_b {
            after_b = store.build_index_step("c", "b", after_b.as_deref(), 5).await.unwrap();
            done_b = after_b.is_none();
        }
        // A value moved, a record deleted, one inserted among those read
        // (`q…` sorts first) and one past them.
        let moved = format!("r{:03}", next(100));
        let set = Update::set(doc! {"s": next(7) as i64, "n": next(500) as i64});
        store.update("c", &moved, doc! {}, set).await.unwrap();
        store.delete("c", &format!("r{:03}", next(100)), doc! {}).await.unwrap();
        store.insert("c", doc! {"_id": format!("q{steps:03}"), "s": 1_i64, "n": next(500) as i64}).await.unwrap();
        store.insert("c", doc! {"_id": format!("z{steps:03}"), "s": 2_i64, "n": 7_i64}).await.unwrap();
    }
    store.build_index_step("c", "a", None, 0).await.unwrap();
    store.build_index_step("c", "b", None, 0).await.unwrap();
    store.verify_indexes().unwrap();
    assert!(steps > 20, "the records took several runs: {steps} steps");
    store.close().await.unwrap();
}

/// An index the store holds without counts (made by the release before
/// them), declared again counted, is made again with its counts: at once,
/// or online, by build steps while writes go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_an_index_made_without_counts_is_made_again_counted() {
    use txgate_store::Store;
    use txgate_store::embedded::EmbeddedStore;
    let dir = tempfile::tempdir().unwrap();
    let store = EmbeddedStore::open(dir.path()).unwrap();
    let spec = |name: &str, counted: bool| txgate_store::IndexSpec {
        name: name.into(),
        fields: vec!["s".into(), "n".into(), "_id".into()],
        unique: false,
        sparse: false,
        counted,
    };
    let count = async |index: &str, s: i64| {
        let query = count_query(&spec(index, true), vec![Bson::Int64(s)], None);
        store.count("c", &query).await.unwrap()
    };
    for i in 0..60_i64 {
        store.insert("c", doc! {"_id": format!("r{i:02}"), "s": i % 3, "n": i}).await.unwrap();
    }
    store.ensure_index("c", spec("whole", false)).await.unwrap();
    store.ensure_index("c", spec("online", false)).await.unwrap();
    assert_eq!(count("whole", 1).await, 20);
    store.ensure_index("c", spec("whole", true)).await.unwrap();
    store.verify_indexes().unwrap();
    store.declare_index("c", spec("online", true)).await.unwrap();
    let mut after: Option<String> = None;
    let mut i = 60_i64;
    while let Some(last) = store.build_index_step("c", "online", after.as_deref(), 7).await.unwrap() {
        after = Some(last);
        // Writes between steps: before and after the build's place.
        store.insert("c", doc! {"_id": format!("r{i:02}"), "s": 1_i64, "n": i}).await.unwrap();
        store.delete("c", &format!("r{:02}", i - 59), doc! {}).await.unwrap();
        i += 1;
    }
    store.build_index_step("c", "online", None, 0).await.unwrap();
    store.verify_indexes().unwrap();
    for s in 0..3 {
        let want = count("whole", s).await;
        assert_eq!(count("online", s).await, want, "s = {s}");
    }
    assert!(count("whole", 1).await > 20);
    store.close().await.unwrap();
}

/// The database file's reads are the misses of redb's page cache (what
/// `bench queries` reports a page's cache hits from): a record read after
/// the store opened again reaches the file, the same record read again
/// does not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_reads_that_miss_the_page_cache_are_counted() {
    use txgate_store::Store;
    use txgate_store::embedded::EmbeddedStore;
    let dir = tempfile::tempdir().unwrap();
    let store = EmbeddedStore::open(dir.path()).unwrap();
    let filler = "x".repeat(1000);
    let dyn_store: &dyn Store = &store;
    let unsynced = dyn_store.unsynced();
    for i in 0..8000 {
        unsynced.insert("c", doc! {"_id": format!("r{i:04}"), "f": &filler}).await.unwrap();
    }
    store.close().await.unwrap();
    drop(store);
    // A cache smaller than the records (opening reads through them).
    let options = txgate_store::embedded::Options { cache_bytes: 2 << 20, ..Default::default() };
    let store = EmbeddedStore::open_dir(dir.path(), &options).unwrap();
    let before = store.file_reads();
    assert!(store.get("c", "r1234").await.unwrap().is_some());
    let cold = store.file_reads();
    assert!(cold > before, "a record not read since the store opened comes from the file ({before} -> {cold})");
    assert!(store.get("c", "r1234").await.unwrap().is_some());
    assert_eq!(store.file_reads(), cold, "the same record read again comes from the cache");
    store.close().await.unwrap();
}

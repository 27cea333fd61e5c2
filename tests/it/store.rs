//! The store seam's contract, run against both backends: what each
//! single-record operation does, and what filters and scans mean.

use txgate::store::{Bson, Order, Scan, Update, doc};

use crate::support::{Backend, TestStore};

crate::on_both_backends!(
    insert_is_insert_if_absent,
    conditional_replace_update_delete,
    null_filter_matches_missing_fields,
    scans_filter_sort_and_limit,
    get_many_and_collections,
    int64_values_keep_type_and_precision,
    concurrent_cas_has_one_winner,
    every_migration_is_applied,
);

async fn store(backend: Backend) -> Option<TestStore> {
    TestStore::new(backend).await
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

async fn scans_filter_sort_and_limit(backend: Backend) {
    let Some(ts) = store(backend).await else { return };
    let s = &ts.store;
    for (id, status, at) in [("a", "p", 5), ("b", "c", 3), ("c", "p", 1), ("d", "p", 9), ("e", "d", 2)] {
        s.insert("t", doc! {"_id": id, "status": status, "at": at}).await.unwrap();
    }
    let ids = |recs: Vec<txgate::store::Record>| {
        recs.iter().map(|r| r.get_str("_id").unwrap().to_owned()).collect::<Vec<_>>()
    };
    assert_eq!(ids(s.scan("t", Scan::by_id(doc! {}, 10)).await.unwrap()), ["a", "b", "c", "d", "e"]);
    assert_eq!(ids(s.scan("t", Scan::by_id(doc! {"_id": {"$gt": "b"}}, 2)).await.unwrap()), ["c", "d"]);
    assert_eq!(ids(s.scan("t", Scan::by_id(doc! {"status": "p"}, 2)).await.unwrap()), ["a", "c"]);
    let sorted = Scan::sorted(doc! {"status": {"$in": ["p", "c"]}, "at": {"$lt": 9}}, "at", Order::Asc, 10);
    assert_eq!(ids(s.scan("t", sorted).await.unwrap()), ["c", "b", "a"]);
    let desc = Scan::sorted(doc! {}, "at", Order::Desc, 2);
    assert_eq!(ids(s.scan("t", desc).await.unwrap()), ["d", "a"]);
    let or = Scan::by_id(doc! {"$or": [{"status": "d"}, {"at": 9}]}, 10);
    assert_eq!(ids(s.scan("t", or).await.unwrap()), ["d", "e"]);
    assert!(s.scan("empty", Scan::by_id(doc! {}, 10)).await.unwrap().is_empty());
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
    let mut expected: Vec<(String, String)> = Vec::new();
    for path in &files {
        let name = path.file_stem().unwrap().to_str().unwrap();
        let recorded = app.store.get(txgate::migrate::MIGRATIONS_COLLECTION, name).await.unwrap();
        assert!(recorded.is_some(), "migration {name} was not applied");
        let spec: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        for index in spec["indexes"].as_array().unwrap() {
            expected.push((index["collection"].as_str().unwrap().into(), index["name"].as_str().unwrap().into()));
        }
    }
    if let txgate::config::StoreConfig::Mongodb { uri, database } = &app.config.store {
        let client = ::mongodb::Client::with_uri_str(uri).await.unwrap();
        let db = client.database(database);
        for (coll, name) in expected {
            let names = db.collection::<txgate::store::Document>(&coll).list_index_names().await.unwrap();
            assert!(names.contains(&name), "{coll} has no index {name}: {names:?}");
        }
    }
    app.stop().await;
}

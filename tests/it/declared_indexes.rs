//! Declared indexes, on both stores: the rule of indexed paths holds on
//! every write path and in builds; an index built while writes go on holds
//! every document; unique indexes refuse duplicates in single writes, in
//! transactions staging one value at once, and in builds.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use rand::SeedableRng;
use rand::rngs::StdRng;
use reqwest::Method;
use serde_json::{Value, json};
use txgate_store::layer::{Layer, Layered, Op as StoreOp};
use txgate_store::{Bson, DateTime, DynStore, Store, StoreError, StoreResult, Update, doc};

use crate::queries::{WAIT, all_pages, create, docs_path, put_index, query, ready_index, settled_index};
use crate::support::{Backend, TestApp, TestStore, expect, expect_problem, test_config};

crate::on_both_backends!(
    indexed_paths_never_hold_arrays_or_objects,
    a_build_over_documents_that_break_the_rule_fails_naming_them,
    an_index_built_while_writes_go_on_holds_every_document,
    unique_indexes_refuse_duplicates_in_single_writes,
    two_transactions_staging_one_unique_value_at_once_commit_one,
    transactions_changing_unique_values_at_once_never_share_one,
    a_transaction_hands_unique_values_between_its_members,
    a_unique_build_over_duplicates_fails_naming_them,
    an_expired_document_gives_its_unique_values_up,
    a_build_whose_instance_died_is_taken_over_and_ends_exact,
    one_index_per_list_of_fields,
    a_build_the_store_keeps_failing_holds_up_no_other,
    reservations_the_store_fails_leave_every_value_held_once,
    a_create_that_waited_for_a_lock_keeps_an_index_declared_meanwhile,
    unique_values_belong_to_one_collections_index,
    an_index_name_shared_by_an_earlier_release_is_separated_and_rebuilt,
    one_collections_builds_do_not_starve_anothers,
);

async fn indexed_paths_never_hold_arrays_or_objects(backend: Backend) {
    let Some(app) = TestApp::spawn(backend).await else { return };
    create(&app, "t", "one", &json!({"a": {"b": 1}, "c": 1})).await;
    create(&app, "t", "zero", &json!({"c": 1})).await;
    ready_index(&app, "t", "ab", &["a.b"]).await;
    // Single writes.
    for body in [json!({"a": {"b": [1]}}), json!({"a": [{"b": 1}]}), json!({"a": {"b": {"x": 1}}})] {
        expect_problem(app.post(&docs_path("t"), &body).await, 422, "invalid_change").await;
        expect_problem(
            app.send_json(Method::PUT, &format!("{}/one", docs_path("t")), &body).await,
            422,
            "invalid_change",
        )
        .await;
    }
    let patch = json!({"set": {"a.b": [1]}});
    expect_problem(
        app.send_json(Method::PATCH, &format!("{}/one", docs_path("t")), &patch).await,
        422,
        "invalid_change",
    )
    .await;
    // Transaction members, an update's post-image included.
    for action in [
        json!({"op": "insert", "collection": "t", "id": "two", "data": {"a": [1]}}),
        json!({"op": "replace", "collection": "t", "id": "one", "data": {"a": {"b": {"c": 1}}}}),
        json!({"op": "update", "collection": "t", "id": "one", "set": {"a": [{"b": 2}]}}),
    ] {
        let body = json!({"actions": [{"op": "update", "collection": "t", "id": "zero", "set": {"c": 2}}, action]});
        let problem = expect_problem(app.post("/v1/transactions", &body).await, 422, "invalid_change").await;
        assert_eq!(problem["action"], 1, "{problem}");
    }
    // Nothing was written.
    let one = expect(app.get(&format!("{}/one", docs_path("t"))).await, 200).await;
    assert_eq!(one["version"], 1);
    assert_eq!(one["data"], json!({"a": {"b": 1}, "c": 1}));
    // Arrays elsewhere, and a scalar where the path stops, are fine.
    expect(app.post(&docs_path("t"), &json!({"a": 5, "list": [1, 2]})).await, 201).await;
}

async fn a_build_over_documents_that_break_the_rule_fails_naming_them(backend: Backend) {
    let Some(app) = TestApp::spawn(backend).await else { return };
    create(&app, "f", "ok", &json!({"tags": "x"})).await;
    create(&app, "f", "bad1", &json!({"tags": ["x", "y"]})).await;
    create(&app, "f", "bad2", &json!({"tags": {"x": 1}})).await;
    create(&app, "f", "bad3", &json!({"tags": "é".repeat(513)})).await;
    put_index(&app, "f", "tags", &["tags"]).await;
    let index = settled_index(&app, "f", "tags").await;
    assert_eq!(index["state"], "failed", "{index}");
    assert_eq!(index["documents"], json!(["bad1", "bad2", "bad3"]));
    assert_eq!(index["progress"], Value::Null, "{index}");
    // The reason says what each named document breaks.
    let reason = index["reason"].as_str().unwrap();
    for said in [
        "bad1: tags is indexed (index tags): it cannot hold or pass through an array",
        "bad2: tags is indexed (index tags): it cannot hold an object",
        "bad3: the strings at the paths of index tags take more than 1024 bytes together",
    ] {
        assert!(reason.contains(said), "{said:?} in {index}");
    }
    // A failed index serves nothing; deleted, it can be declared again.
    let problem =
        expect_problem(query(&app, "f", &json!({"filter": {"tags": "x"}})).await, 400, "index_required").await;
    assert_eq!(problem["index"]["fields"], json!(["tags"]));
    expect(app.request(Method::DELETE, "/v1/collections/f/indexes/tags").send().await.unwrap(), 204).await;
    expect_problem(app.get("/v1/collections/f/indexes/tags").await, 404, "not_found").await;
    // Another definition under a taken name is refused.
    put_index(&app, "f", "other", &["x"]).await;
    let resp = app.send_json(Method::PUT, "/v1/collections/f/indexes/other", &json!({"fields": ["y"]})).await;
    expect_problem(resp, 409, "index_exists").await;
    // The same again is answered as it is.
    let resp = app.send_json(Method::PUT, "/v1/collections/f/indexes/other", &json!({"fields": ["x"]})).await;
    assert_eq!(resp.status(), 200);
    // Bad declarations.
    for (body, pointer) in [
        (json!({"fields": []}), "/fields"),
        (json!({"fields": ["_meta.v"]}), "/fields/0"),
        (json!({"fields": ["a", "-a"]}), "/fields/1"),
        (json!({"fields": ["a"], "x": 1}), "/x"),
    ] {
        let problem = expect_problem(
            app.send_json(Method::PUT, "/v1/collections/f/indexes/bad", &body).await,
            422,
            "validation_failed",
        )
        .await;
        assert_eq!(problem["errors"][0]["pointer"], pointer, "{body}: {problem}");
    }
    let list = expect(app.get("/v1/collections/f/indexes").await, 200).await;
    let names: Vec<&str> = list["items"].as_array().unwrap().iter().map(|i| i["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["other"]);
}

/// Holds back at its gate, once armed, the first step of an index build
/// on collection `w` (its index declared to the store, its documents not
/// yet all in it), so writes surely go on during the build however fast
/// the build is. Everything else goes down as it came, chains whole.
struct HoldFirstScan(AtomicBool, Arc<crate::faulty::Gate>);

impl Layer for HoldFirstScan {
    async fn around<T: Send>(
        &self,
        _below: &dyn Store,
        op: &StoreOp<'_>,
        run: impl Future<Output = StoreResult<T>> + Send,
    ) -> StoreResult<T> {
        if op.name == "build_index_step" && op.coll == "w" && self.0.swap(false, Ordering::SeqCst) {
            self.1.pass().await;
        }
        run.await
    }
}

async fn an_index_built_while_writes_go_on_holds_every_document(backend: Backend) {
    let Some(ts) = TestStore::new(backend).await else { return };
    let gate = crate::faulty::Gate::new();
    let hold = Arc::new(Layered::new(Arc::clone(&ts.store), HoldFirstScan(AtomicBool::new(false), Arc::clone(&gate))));
    let store: DynStore = hold.clone();
    let app = Arc::new(TestApp::on_store(test_config(ts.config.clone()), store, Some(ts)).await);
    // Enough documents for several build steps (the embedded store's);
    // fewer on a MongoDB-wire server, which builds in one command.
    let n = if backend == Backend::Embedded { 3000 } else { 300 };
    for chunk in 0..n / 20 {
        let actions: Vec<Value> = (0..20)
            .map(|i| {
                let k = chunk * 20 + i;
                json!({"op": "insert", "collection": "w", "id": format!("w{k:05}"), "data": {"g": k % 7, "v": k}})
            })
            .collect();
        expect(app.post("/v1/transactions", &json!({ "actions": actions })).await, 200).await;
    }
    hold.layer().0.store(true, Ordering::SeqCst);
    put_index(&app, "w", "g_v", &["g", "-v"]).await;
    // Past the grace, a pass of the builder (ended with its build), held at
    // the build's first read until some writes have gone on.
    app.advance(txgate::testing::indexes::GRACE);
    let pass = {
        let app = Arc::clone(&app);
        tokio::spawn(async move { app.run_once("index_builds").await })
    };
    tokio::time::timeout(WAIT, gate.reached()).await.expect("the build reaches its first step");
    // Writes go on while the index builds: updates, deletes, inserts.
    let mut model: BTreeMap<String, (i64, i64)> =
        (0..n).map(|k| (format!("w{k:05}"), ((k % 7) as i64, k as i64))).collect();
    let mut written = 0;
    let started = Instant::now();
    loop {
        if written == 20 {
            gate.open();
        }
        let k = (written * 37) % n;
        let id = format!("w{k:05}");
        match written % 3 {
            0 => {
                expect(
                    app.send_json(Method::PATCH, &format!("{}/{id}", docs_path("w")), &json!({"set": {"g": 3}})).await,
                    200,
                )
                .await;
                model.get_mut(&id).unwrap().0 = 3;
            }
            1 if model.contains_key(&id) => {
                expect(app.request(Method::DELETE, &format!("{}/{id}", docs_path("w"))).send().await.unwrap(), 204)
                    .await;
                model.remove(&id);
            }
            _ => {
                let id = format!("x{written:05}");
                create(&app, "w", &id, &json!({"g": 3, "v": written})).await;
                model.insert(id, (3, written as i64));
            }
        }
        written += 1;
        let index = expect(app.get("/v1/collections/w/indexes/g_v").await, 200).await;
        if index["state"] != "building" {
            assert_eq!(index["state"], "ready", "{index}");
            break;
        }
        assert!(written <= 20 || !pass.is_finished(), "the pass ended with the index still building: {index}");
        assert!(started.elapsed() < WAIT, "the build never ended");
    }
    assert!(written > 20, "writes went on during the build");
    pass.await.unwrap();
    // Every group answers exactly the model.
    let mut rng = StdRng::seed_from_u64(7);
    for g in 0..7 {
        let got: Vec<String> = all_pages(&app, "w", &json!({"g": g}), &[("v".into(), true)], &mut rng, async |_| {})
            .await
            .into_iter()
            .map(|(id, _)| id)
            .collect();
        let mut want: Vec<(&String, &(i64, i64))> = model.iter().filter(|(_, (mg, _))| *mg == g).collect();
        want.sort_by(|a, b| b.1.1.cmp(&a.1.1).then(a.0.cmp(b.0)));
        let want: Vec<String> = want.into_iter().map(|(id, _)| id.clone()).collect();
        let missing: Vec<&String> = want.iter().filter(|w| !got.contains(w)).collect();
        let extra: Vec<&String> = got.iter().filter(|w| !want.contains(w)).collect();
        assert!(
            missing.is_empty() && extra.is_empty(),
            "group {g}: missing {missing:?} extra {extra:?} (written {written})"
        );
        assert_eq!(got, want, "group {g}");
    }
    let all = expect(app.get("/v1/collections/w/count").await, 200).await;
    assert_eq!(all["count"].as_u64().unwrap() as usize, model.len());
}

async fn unique_email(app: &TestApp, coll: &str) {
    let resp = app
        .send_json(
            Method::PUT,
            &format!("/v1/collections/{coll}/indexes/email"),
            &json!({"fields": ["email"], "unique": true}),
        )
        .await;
    assert_eq!(resp.status(), 201);
    let index = settled_index(app, coll, "email").await;
    assert_eq!((&index["state"], &index["unique"]), (&json!("ready"), &json!(true)), "{index}");
}

async fn unique_indexes_refuse_duplicates_in_single_writes(backend: Backend) {
    let Some(app) = TestApp::spawn(backend).await else { return };
    create(&app, "u", "a", &json!({"email": "x@example.com"})).await;
    unique_email(&app, "u").await;
    let dup = expect_problem(
        app.post(&docs_path("u"), &json!({"_id": "b", "email": "x@example.com"})).await,
        409,
        "duplicate",
    )
    .await;
    assert_eq!((&dup["index"], &dup["existing"]), (&json!("email"), &json!("a")), "{dup}");
    create(&app, "u", "b", &json!({"email": "y@example.com"})).await;
    // Documents without the field never collide.
    create(&app, "u", "c", &json!({"name": "c"})).await;
    create(&app, "u", "d", &json!({"name": "d", "email": null})).await;
    // Changes to a held value are refused; to a free one, allowed.
    let b = format!("{}/b", docs_path("u"));
    expect_problem(
        app.send_json(Method::PATCH, &b, &json!({"set": {"email": "x@example.com"}})).await,
        409,
        "duplicate",
    )
    .await;
    expect_problem(app.send_json(Method::PUT, &b, &json!({"email": "x@example.com"})).await, 409, "duplicate").await;
    expect(app.send_json(Method::PATCH, &b, &json!({"set": {"email": "z@example.com"}})).await, 200).await;
    // The value b gave up is free at once.
    create(&app, "u", "e", &json!({"email": "y@example.com"})).await;
    // A deleted document's value is free; a second delete works too.
    for id in ["a", "e"] {
        expect(app.request(Method::DELETE, &format!("{}/{id}", docs_path("u"))).send().await.unwrap(), 204).await;
    }
    create(&app, "u", "f", &json!({"email": "x@example.com"})).await;
    // A value is one value whatever the number type: 1 and 1.0.
    create(&app, "u", "g", &json!({"email": 1})).await;
    expect_problem(app.post(&docs_path("u"), &json!({"email": 1.0})).await, 409, "duplicate").await;
    // A transaction member meets the same rule, before anything is written.
    let body = json!({"actions": [
        {"op": "update", "collection": "u", "id": "b", "set": {"n": 1}},
        {"op": "insert", "collection": "u", "id": "h", "data": {"email": "f@example.com"}},
        {"op": "update", "collection": "u", "id": "c", "set": {"email": "x@example.com"}},
    ]});
    let problem = expect_problem(app.post("/v1/transactions", &body).await, 409, "duplicate").await;
    assert_eq!((&problem["action"], &problem["existing"]), (&json!(2), &json!("f")), "{problem}");
    expect_problem(app.get(&format!("{}/h", docs_path("u"))).await, 404, "not_found").await;
    assert_eq!(expect(app.get(&b).await, 200).await["version"], 2);
    // The claims of that failed transaction were given back.
    create(&app, "u", "h", &json!({"email": "f@example.com"})).await;
    // A transaction that moves one value and deletes another frees both
    // once it answers.
    let body = json!({"actions": [
        {"op": "update", "collection": "u", "id": "b", "set": {"email": "w@example.com"}},
        {"op": "delete", "collection": "u", "id": "f"},
    ]});
    expect(app.post("/v1/transactions", &body).await, 200).await;
    create(&app, "u", "i", &json!({"email": "x@example.com"})).await;
    create(&app, "u", "j", &json!({"email": "z@example.com"})).await;
    // Queries over a unique index.
    let page = expect(query(&app, "u", &json!({"filter": {"email": "x@example.com"}})).await, 200).await;
    let ids: Vec<&str> = page["items"].as_array().unwrap().iter().map(|i| i["id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["i"]);
}

/// Holds back, once armed, every write of document `slow` of collection
/// `race` until released: a transaction with that member stays in flight.
struct HoldSlow {
    armed: AtomicBool,
    released: tokio::sync::Notify,
}

impl Layer for HoldSlow {
    fn inspects(&self) -> bool {
        true
    }

    async fn around<T: Send>(
        &self,
        _below: &dyn Store,
        op: &StoreOp<'_>,
        run: impl Future<Output = StoreResult<T>> + Send,
    ) -> StoreResult<T> {
        let slow = op.coll == "race" && op.detail.and_then(|d| d.id.as_deref()) == Some("slow");
        if slow && op.writes > 0 && self.armed.load(Ordering::SeqCst) {
            let released = self.released.notified();
            if self.armed.load(Ordering::SeqCst) {
                released.await;
            }
        }
        run.await
    }
}

/// On MongoDB (where a transaction's members are single writes, which
/// [`HoldSlow`] holds by id; the embedded store stages and rolls forward in
/// chains, and the wait is the same code on both).
mod mongodb_in_flight {
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_build_waits_for_transactions_in_flight_at_its_declaration() {
        super::a_build_waits_for_transactions_in_flight_at_its_declaration(crate::support::Backend::Mongodb).await
    }
}

/// A transaction staged before an index was declared claimed none of its
/// values: the build reads the collection only once it has ended, so a
/// unique index never ends `ready` over the duplicate it commits.
async fn a_build_waits_for_transactions_in_flight_at_its_declaration(backend: Backend) {
    let Some(ts) = TestStore::new(backend).await else { return };
    let layer = HoldSlow { armed: AtomicBool::new(false), released: tokio::sync::Notify::new() };
    let hold = Arc::new(Layered::new(Arc::clone(&ts.store), layer));
    let store: DynStore = hold.clone();
    let app = Arc::new(TestApp::on_store(test_config(ts.config.clone()), store, Some(ts)).await);
    create(&app, "race", "x", &json!({"u": 1})).await;
    hold.layer().armed.store(true, Ordering::SeqCst);
    let txn = {
        let app = Arc::clone(&app);
        tokio::spawn(async move {
            let body = json!({"actions": [
                {"op": "insert", "collection": "race", "id": "a", "data": {"u": 1}},
                {"op": "insert", "collection": "race", "id": "slow", "data": {"v": 1}},
            ]});
            app.post("/v1/transactions", &body).await.status().as_u16()
        })
    };
    // The transaction is in flight (its member `a` staged, `slow` held).
    app.until("the transaction staged its member a", async || {
        let listed = expect(app.get("/v1/transactions?status=pending").await, 200).await;
        !listed["items"].as_array().unwrap().is_empty() && app.store.get("race", "a").await.unwrap().is_some()
    })
    .await;
    let resp =
        app.send_json(Method::PUT, "/v1/collections/race/indexes/u", &json!({"fields": ["u"], "unique": true})).await;
    assert_eq!(resp.status(), 201);
    // Past the wait before a build starts: the build waits for it, and
    // says so.
    app.advance(txgate::testing::indexes::GRACE);
    let pass = {
        let app = Arc::clone(&app);
        tokio::spawn(async move { app.run_once("index_builds").await })
    };
    app.until("the build waits for the transaction", async || {
        let index = expect(app.get("/v1/collections/race/indexes/u").await, 200).await;
        assert_eq!(index["state"], "building", "the build went on over a transaction in flight: {index}");
        index["progress"]["phase"] == "waiting"
    })
    .await;
    assert!(!pass.is_finished(), "the pass ended while its build waits");
    hold.layer().armed.store(false, Ordering::SeqCst);
    hold.layer().released.notify_waiters();
    let status = txn.await.unwrap();
    pass.await.unwrap();
    let index = settled_index(&app, "race", "u").await;
    if status == 200 {
        // Committed: `a` and `x` share the value, and the build says so.
        assert_eq!(index["state"], "failed", "{index}");
        let mut named: Vec<&str> = index["documents"].as_array().unwrap().iter().map(|d| d.as_str().unwrap()).collect();
        named.sort_unstable();
        assert_eq!(named, ["a", "x"], "{index}");
    } else {
        // Failed meanwhile (its held write outlasted a deadline): nothing
        // of it shows, and the index holds the one value.
        assert_eq!(index["state"], "ready", "{status}: {index}");
        expect_problem(app.get(&format!("{}/a", docs_path("race"))).await, 404, "not_found").await;
    }
}

/// TTL expiry leaves a tombstone, as a delete does, and frees the values
/// the document held at once (not after a claim's grace).
async fn an_expired_document_gives_its_unique_values_up(backend: Backend) {
    // Expiry runs when the test says (a pass of the TTL worker).
    let tweak = |c: &mut txgate::config::Config| c.ttl_interval = Duration::from_secs(3600);
    let Some(app) = TestApp::spawn_with(backend, tweak).await else { return };
    create(&app, "tu", "a", &json!({"email": "v@example.com"})).await;
    unique_email(&app, "tu").await;
    let ttl = app.send_json(Method::PUT, "/v1/collections/tu", &json!({"ttl": {"max_count": 1}})).await;
    expect(ttl, 200).await;
    create(&app, "tu", "b", &json!({"email": "w@example.com"})).await;
    // Once b's event is in the log (counts are folded from it), a sweep.
    app.settled().await;
    app.run_once("ttl").await;
    let a = format!("{}/a", docs_path("tu"));
    assert_eq!(app.get(&a).await.status(), 410, "a expired");
    // The value is released with the tombstone, not after the grace a
    // fresh claim has (30 s): the clock has not moved.
    app.settled().await;
    expect(app.post(&docs_path("tu"), &json!({"_id": "c", "email": "v@example.com"})).await, 201).await;
    let page = expect(query(&app, "tu", &json!({"filter": {"email": "v@example.com"}})).await, 200).await;
    assert_eq!(page["items"][0]["id"], "c", "{page}");
}

async fn two_transactions_staging_one_unique_value_at_once_commit_one(backend: Backend) {
    let Some(app) = TestApp::spawn(backend).await else { return };
    create(&app, "v", "seed", &json!({"email": "seed"})).await;
    unique_email(&app, "v").await;
    for round in 0..8 {
        let value = format!("v{round}@example.com");
        let send = async |id: String| {
            let body = json!({"actions": [
                {"op": "insert", "collection": "v", "id": format!("{id}-other"), "data": {"n": 1}},
                {"op": "insert", "collection": "v", "id": id, "data": {"email": value}},
            ]});
            app.post("/v1/transactions", &body).await
        };
        let (a, b) = tokio::join!(send(format!("a{round}")), send(format!("b{round}")));
        let statuses = [a.status().as_u16(), b.status().as_u16()];
        assert!(statuses.contains(&200), "round {round}: one commits: {statuses:?}");
        assert!(statuses.contains(&409), "round {round}: the other is refused: {statuses:?}");
        let loser = if statuses[0] == 409 { a } else { b };
        let problem: Value = loser.json().await.unwrap();
        assert_eq!(problem["code"], "duplicate", "{problem}");
        // Nothing of the refused one was written.
        let tag = if statuses[0] == 409 { "a" } else { "b" };
        expect_problem(app.get(&format!("{}/{tag}{round}-other", docs_path("v"))).await, 404, "not_found").await;
        let count = app
            .request(Method::GET, "/v1/collections/v/count")
            .query(&[("filter", json!({"email": value}).to_string())])
            .send()
            .await
            .unwrap();
        assert_eq!(expect(count, 200).await["count"], 1, "round {round}");
    }
}

/// Transactions of two members each, giving random values to random
/// documents of a few, at once: a value one keeps on a document another
/// changes meanwhile must not lose its reservation (the document no longer
/// holding it when the first is staged fails it with 422), so every value
/// a document holds stays reserved for it and is never held by two.
async fn transactions_changing_unique_values_at_once_never_share_one(backend: Backend) {
    use rand::Rng;
    const DOCS: usize = 6;
    const VALUES: usize = 8;
    let Some(app) = TestApp::spawn(backend).await else { return };
    for i in 0..DOCS {
        create(&app, "uw", &format!("d{i}"), &json!({"email": format!("e{i}")})).await;
    }
    unique_email(&app, "uw").await;
    let committed = AtomicUsize::new(0);
    let writer = async |seed: u64| {
        let mut rng = StdRng::seed_from_u64(seed);
        for _ in 0..100 {
            let (a, b) = (rng.random_range(0..DOCS), rng.random_range(0..DOCS - 1));
            let b = if b >= a { b + 1 } else { b };
            let (va, vb) = (rng.random_range(0..VALUES), rng.random_range(0..VALUES));
            let body = json!({"actions": [
                {"op": "update", "collection": "uw", "id": format!("d{a}"), "set": {"email": format!("e{va}")}},
                {"op": "update", "collection": "uw", "id": format!("d{b}"), "set": {"email": format!("e{vb}")}},
            ]});
            let resp = app.post("/v1/transactions", &body).await;
            match resp.status().as_u16() {
                200 => {
                    committed.fetch_add(1, Ordering::Relaxed);
                }
                409 | 422 | 503 => {}
                status => panic!("{status}: {}", resp.text().await.unwrap()),
            }
        }
    };
    tokio::join!(writer(1), writer(2), writer(3), writer(4));
    assert!(committed.load(Ordering::Relaxed) > 0, "some commit");
    let mut holders: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for i in 0..DOCS {
        let doc = expect(app.get(&format!("{}/d{i}", docs_path("uw"))).await, 200).await;
        holders.entry(doc["data"]["email"].as_str().unwrap().to_owned()).or_default().push(format!("d{i}"));
    }
    for (value, ids) in &holders {
        assert_eq!(ids.len(), 1, "{value} is held by {ids:?}");
        let page = expect(query(&app, "uw", &json!({"filter": {"email": value}})).await, 200).await;
        assert_eq!(page["items"].as_array().unwrap().len(), 1, "{value}: {page}");
        // Its reservation is in place: no other document may take it.
        let dup = expect_problem(app.post(&docs_path("uw"), &json!({"email": value})).await, 409, "duplicate").await;
        assert_eq!(dup["existing"], json!(ids[0]), "{value}: {dup}");
    }
}

async fn a_transaction_hands_unique_values_between_its_members(backend: Backend) {
    let Some(app) = TestApp::spawn(backend).await else { return };
    create(&app, "h", "a", &json!({"email": "x"})).await;
    create(&app, "h", "b", &json!({"email": "y"})).await;
    unique_email(&app, "h").await;
    let email =
        async |id: &str| expect(app.get(&format!("{}/{id}", docs_path("h"))).await, 200).await["data"]["email"].clone();
    let taken = async |value: &str, existing: &str| {
        let dup = expect_problem(app.post(&docs_path("h"), &json!({"email": value})).await, 409, "duplicate").await;
        assert_eq!((&dup["index"], &dup["existing"]), (&json!("email"), &json!(existing)), "{value}: {dup}");
    };
    // Two documents swap their values.
    let swap = json!({"actions": [
        {"op": "update", "collection": "h", "id": "a", "set": {"email": "y"}},
        {"op": "update", "collection": "h", "id": "b", "set": {"email": "x"}},
    ]});
    expect(app.post("/v1/transactions", &swap).await, 200).await;
    assert_eq!((email("a").await, email("b").await), (json!("y"), json!("x")));
    taken("x", "b").await;
    taken("y", "a").await;
    // A deleted document's value goes to a new one, the taker first.
    let moved = json!({"actions": [
        {"op": "insert", "collection": "h", "id": "c", "data": {"email": "y"}},
        {"op": "delete", "collection": "h", "id": "a"},
    ]});
    expect(app.post("/v1/transactions", &moved).await, 200).await;
    taken("y", "c").await;
    // A transaction that does not commit leaves the value where it was:
    // "b" keeps "x", and no one else may take it.
    let failed = json!({"actions": [
        {"op": "update", "collection": "h", "id": "b", "unset": ["email"]},
        {"op": "insert", "collection": "h", "id": "d", "data": {"email": "x"}},
        {"op": "check", "collection": "h", "id": "c", "if_version": 9},
    ]});
    expect_problem(app.post("/v1/transactions", &failed).await, 409, "version_conflict").await;
    expect_problem(app.get(&format!("{}/d", docs_path("h"))).await, 404, "not_found").await;
    assert_eq!(email("b").await, json!("x"));
    taken("x", "b").await;
    let update = json!({"set": {"email": "x"}});
    let c = format!("{}/c", docs_path("h"));
    expect_problem(app.send_json(Method::PATCH, &c, &update).await, 409, "duplicate").await;
    // A value no member gives up is still refused.
    let body = json!({"actions": [
        {"op": "update", "collection": "h", "id": "b", "set": {"n": 1}},
        {"op": "insert", "collection": "h", "id": "e", "data": {"email": "x"}},
    ]});
    let dup = expect_problem(app.post("/v1/transactions", &body).await, 409, "duplicate").await;
    assert_eq!((&dup["action"], &dup["existing"]), (&json!(1), &json!("b")), "{dup}");
    // Each value held once, by the documents the committed transactions
    // gave them to.
    for (value, holder) in [("x", "b"), ("y", "c")] {
        let page = expect(query(&app, "h", &json!({"filter": {"email": value}})).await, 200).await;
        let ids: Vec<&str> = page["items"].as_array().unwrap().iter().map(|i| i["id"].as_str().unwrap()).collect();
        assert_eq!(ids, [holder], "{value}");
    }
}

async fn a_unique_build_over_duplicates_fails_naming_them(backend: Backend) {
    let Some(app) = TestApp::spawn(backend).await else { return };
    create(&app, "y", "a", &json!({"email": "same"})).await;
    create(&app, "y", "b", &json!({"email": "other"})).await;
    create(&app, "y", "c", &json!({"email": "same"})).await;
    create(&app, "y", "d", &json!({})).await;
    create(&app, "y", "e", &json!({})).await;
    create(&app, "y", "f", &json!({"email": "same"})).await;
    let resp = app
        .send_json(Method::PUT, "/v1/collections/y/indexes/email", &json!({"fields": ["email"], "unique": true}))
        .await;
    assert_eq!(resp.status(), 201);
    let index = settled_index(&app, "y", "email").await;
    assert_eq!(index["state"], "failed", "{index}");
    assert_eq!(index["documents"], json!(["a", "c", "f"]), "each once: {index}");
    // Fixed and declared again, it builds.
    expect(app.request(Method::DELETE, "/v1/collections/y/indexes/email").send().await.unwrap(), 204).await;
    expect(
        app.send_json(Method::PATCH, &format!("{}/c", docs_path("y")), &json!({"set": {"email": "third"}})).await,
        200,
    )
    .await;
    expect(app.request(Method::DELETE, &format!("{}/f", docs_path("y"))).send().await.unwrap(), 204).await;
    unique_email(&app, "y").await;
    expect_problem(app.post(&docs_path("y"), &json!({"email": "same"})).await, 409, "duplicate").await;
}

/// Once armed, lets an index build take its lease (and renew it while it
/// waits for transactions in flight) and, once the build has claimed a
/// value, fails every later write of a declaration (the lease's renewal
/// after the build's first batch, or its end, and every take after): the
/// builder's instance is dead mid-build, its claims for that batch made,
/// its lease held.
struct DieMidBuild {
    armed: AtomicBool,
    claimed: AtomicBool,
    failed: AtomicUsize,
}

impl Layer for DieMidBuild {
    async fn around<T: Send>(
        &self,
        _below: &dyn Store,
        op: &StoreOp<'_>,
        run: impl Future<Output = StoreResult<T>> + Send,
    ) -> StoreResult<T> {
        if !self.armed.load(Ordering::SeqCst) {
            return run.await;
        }
        let lease = op.coll == "_indexes" && op.name == "update";
        if lease && self.claimed.load(Ordering::SeqCst) {
            self.failed.fetch_add(1, Ordering::SeqCst);
            return Err(StoreError::Unavailable("the builder's instance is gone".into()));
        }
        let result = run.await;
        if op.coll == "_unique" && op.writes > 0 && result.is_ok() {
            self.claimed.store(true, Ordering::SeqCst);
        }
        result
    }
}

/// Counts, once armed, the writes to reservations that reach the store.
#[derive(Default)]
struct CountReservations {
    armed: AtomicBool,
    writes: AtomicUsize,
}

impl Layer for CountReservations {
    async fn around<T: Send>(
        &self,
        _below: &dyn Store,
        op: &StoreOp<'_>,
        run: impl Future<Output = StoreResult<T>> + Send,
    ) -> StoreResult<T> {
        if op.coll == "_unique" && self.armed.load(Ordering::SeqCst) {
            self.writes.fetch_add(op.writes, Ordering::SeqCst);
        }
        run.await
    }
}

/// A unique index's build dies after its first batch (its claims for
/// those documents made, its lease held); writes go on through another
/// instance, moving, freeing and taking values; once the lease runs out,
/// that instance takes the build over from the start and the index ends
/// ready and exact: every value found by query, every duplicate refused,
/// every freed value free. The values the dead build claimed are not
/// claimed again: the takeover writes only the reservations it lacks.
async fn a_build_whose_instance_died_is_taken_over_and_ends_exact(backend: Backend) {
    let Some(ts) = TestStore::new(backend).await else { return };
    let layer =
        DieMidBuild { armed: AtomicBool::new(false), claimed: AtomicBool::new(false), failed: AtomicUsize::new(0) };
    let dying = Arc::new(Layered::new(Arc::clone(&ts.store), layer));
    let a = TestApp::on_store(test_config(ts.config.clone()), dying.clone(), None).await;
    // Several batches on the embedded store; fewer documents on a
    // MongoDB-wire server (each command a round trip), where the
    // build dies after checking them all, before its index is made.
    let n = if backend == Backend::Embedded { 2500 } else { 300 };
    for chunk in 0..n / 50 {
        let actions: Vec<Value> = (0..50)
            .map(|i| {
                let k = chunk * 50 + i;
                json!({"op": "insert", "collection": "t", "id": format!("t{k:05}"), "data": {"u": format!("u{k}")}})
            })
            .collect();
        expect(a.post("/v1/transactions", &json!({ "actions": actions })).await, 200).await;
    }
    dying.layer().armed.store(true, Ordering::SeqCst);
    let resp = a.send_json(Method::PUT, "/v1/collections/t/indexes/u", &json!({"fields": ["u"], "unique": true})).await;
    assert!(resp.status().is_success(), "{}", resp.status());
    // The build took its lease, claimed its first batch and met the
    // failure after it.
    a.advance(txgate::testing::indexes::GRACE);
    a.run_once("index_builds").await;
    assert!(dying.layer().failed.load(Ordering::SeqCst) >= 1, "the build met its failure");
    a.stop().await;
    let counting = Arc::new(Layered::new(Arc::clone(&ts.store), CountReservations::default()));
    let b = TestApp::on_store(test_config(ts.config.clone()), counting.clone(), Some(ts)).await;
    let index = expect(b.get("/v1/collections/t/indexes/u").await, 200).await;
    assert_eq!(index["state"], "building", "{index}");
    // Writes go on meanwhile: t00000 (claimed by the dead build) moves to a
    // new value and t00001 takes its old one; t00002 is deleted and its
    // value taken by a new document; a duplicate of a value the build
    // claimed is refused. (A duplicate of one it has not reached yet would
    // be accepted and end the build failed, naming both, as MongoDB's
    // builds do.)
    let path = |id: &str| format!("{}/{id}", docs_path("t"));
    expect(b.send_json(Method::PATCH, &path("t00000"), &json!({"set": {"u": "moved"}})).await, 200).await;
    expect(b.send_json(Method::PATCH, &path("t00001"), &json!({"set": {"u": "u0"}})).await, 200).await;
    expect(b.request(Method::DELETE, &path("t00002")).send().await.unwrap(), 204).await;
    create(&b, "t", "fresh", &json!({"u": "u2"})).await;
    create(&b, "t", "late", &json!({"u": "u1"})).await;
    let dup = expect_problem(b.post(&docs_path("t"), &json!({"u": "u150"})).await, 409, "duplicate").await;
    assert_eq!(dup["existing"], "t00150", "{dup}");
    // The dead instance's lease runs out (set in the past here, rather
    // than waiting its 30 s).
    let past = DateTime::from_millis(DateTime::now().timestamp_millis() - 1000);
    let expired = b
        .store
        .update("_indexes", "t/u", doc! {"state": "building"}, Update::set(doc! {"lease_until": Bson::DateTime(past)}))
        .await
        .expect("the lease is set");
    assert!(expired, "the declaration was building");
    counting.layer().armed.store(true, Ordering::SeqCst);
    let index = settled_index(&b, "t", "u").await;
    counting.layer().armed.store(false, Ordering::SeqCst);
    assert_eq!(index["state"], "ready", "{index}");
    // The dead build claimed its first batch (all of them, here, when
    // they fit in one); the writes above made their own claims.
    let claimed = n.min(1000);
    let written = counting.layer().writes.load(Ordering::SeqCst);
    assert!(written <= n - claimed, "{written} reservations written for {} values not claimed yet", n - claimed);
    // Exact: the values written meanwhile and a spread of the others each
    // found once, at its document; the count of them all.
    let mut model: BTreeMap<String, String> = (3..n).map(|k| (format!("u{k}"), format!("t{k:05}"))).collect();
    let moved = [("moved", "t00000"), ("u0", "t00001"), ("u2", "fresh"), ("u1", "late")];
    for (u, id) in moved {
        model.insert(u.into(), id.into());
    }
    let spread = (3..n).step_by(97).map(|k| format!("u{k}"));
    for u in moved.iter().map(|(u, _)| (*u).to_owned()).chain(spread) {
        let id = &model[&u];
        let page = expect(query(&b, "t", &json!({"filter": {"u": &u}})).await, 200).await;
        let ids: Vec<&str> = page["items"].as_array().unwrap().iter().map(|i| i["id"].as_str().unwrap()).collect();
        assert_eq!(ids, [id.as_str()], "{u}");
    }
    let count = expect(b.get("/v1/collections/t/count").await, 200).await;
    assert_eq!(count["count"].as_u64().unwrap() as usize, model.len());
    // Every held value refused, every freed value free.
    for u in ["u0", "u1", "u2", "moved", &format!("u{}", n - 1)] {
        expect_problem(b.post(&docs_path("t"), &json!({"u": u})).await, 409, "duplicate").await;
    }
    create(&b, "t", "again", &json!({"u": "nobody"})).await;
    b.stop().await;
}

/// A second index on the fields of a building or ready one, under another
/// name, unique or not, is refused (409 `index_exists` naming the first);
/// other fields (another direction) are not, and other collections' builds
/// go on. Once the first is deleted the fields may be declared again.
async fn one_index_per_list_of_fields(backend: Backend) {
    let Some(app) = TestApp::spawn(backend).await else { return };
    create(&app, "same", "a", &json!({"f": 1, "g": 1})).await;
    create(&app, "other", "a", &json!({"f": 1})).await;
    let first = put_index(&app, "same", "one", &["f", "g"]).await;
    assert_eq!(first["state"], "building", "{first}");
    for unique in [false, true] {
        let body = json!({"fields": ["f", "g"], "unique": unique});
        let resp = app.send_json(Method::PUT, "/v1/collections/same/indexes/two", &body).await;
        let problem = expect_problem(resp, 409, "index_exists").await;
        assert!(problem["detail"].as_str().unwrap().contains("index one"), "{problem}");
    }
    expect_problem(app.get("/v1/collections/same/indexes/two").await, 404, "not_found").await;
    ready_index(&app, "same", "desc", &["f", "-g"]).await;
    ready_index(&app, "other", "one", &["f", "g"]).await;
    assert_eq!(settled_index(&app, "same", "one").await["state"], "ready");
    // Deleted, its fields are free (on MongoDB the new store index is made
    // once the old one is dropped).
    expect(app.request(Method::DELETE, "/v1/collections/same/indexes/one").send().await.unwrap(), 204).await;
    put_index(&app, "same", "two", &["f", "g"]).await;
    assert_eq!(settled_index(&app, "same", "two").await["state"], "ready");
    let page = expect(query(&app, "same", &json!({"filter": {"f": 1}, "sort": ["g"]})).await, 200).await;
    assert_eq!(page["items"][0]["id"], "a", "{page}");
}

/// Fails every count of collection `a_stuck` while armed: a build of an
/// index there meets the error at its start, every pass.
struct FailStuckCounts(AtomicBool);

impl Layer for FailStuckCounts {
    async fn around<T: Send>(
        &self,
        _below: &dyn Store,
        op: &StoreOp<'_>,
        run: impl Future<Output = StoreResult<T>> + Send,
    ) -> StoreResult<T> {
        if op.coll == "a_stuck" && op.name == "count" && self.0.load(Ordering::SeqCst) {
            return Err(StoreError::Unavailable("the store refuses this collection's counts".into()));
        }
        run.await
    }
}

/// A build the store keeps failing stays `building` and is tried again,
/// while builds of other collections, declared after it, go on and end
/// ready; once the store answers again it ends ready too.
async fn a_build_the_store_keeps_failing_holds_up_no_other(backend: Backend) {
    let Some(ts) = TestStore::new(backend).await else { return };
    let failing = Arc::new(Layered::new(Arc::clone(&ts.store), FailStuckCounts(AtomicBool::new(true))));
    let app = TestApp::on_store(test_config(ts.config.clone()), failing.clone(), Some(ts)).await;
    create(&app, "a_stuck", "one", &json!({"f": 1})).await;
    create(&app, "b_other", "one", &json!({"f": 1})).await;
    put_index(&app, "a_stuck", "f", &["f"]).await;
    ready_index(&app, "b_other", "f", &["f"]).await;
    let stuck = expect(app.get("/v1/collections/a_stuck/indexes/f").await, 200).await;
    assert_eq!(stuck["state"], "building", "{stuck}");
    failing.layer().0.store(false, Ordering::SeqCst);
    assert_eq!(settled_index(&app, "a_stuck", "f").await["state"], "ready");
    let page = expect(query(&app, "a_stuck", &json!({"filter": {"f": 1}})).await, 200).await;
    assert_eq!(page["items"][0]["id"], "one", "{page}");
}

/// The store fails writes of reservations now and then, before they land
/// and after: a unique build retries and ends ready, holding every value
/// once; a single write whose claim failed answers 503 and, tried again,
/// lands with its value held; a delete and a change whose release failed
/// still answer, and the values they gave up are held no longer than a
/// claim's grace (30 s), then free.
async fn reservations_the_store_fails_leave_every_value_held_once(backend: Backend) {
    const VALUES: usize = 40;
    // Writes of reservations numbered here fail (counted once armed).
    const FAIL_BEFORE: [usize; 3] = [3, 17, 40];
    const FAIL_AFTER: [usize; 3] = [8, 29, 48];
    const NEW: usize = 15;
    let armed = Arc::new(AtomicBool::new(false));
    let fail_release = Arc::new(AtomicUsize::new(0));
    let writes = Arc::new(AtomicUsize::new(0));
    let rule = {
        let (armed, fail_release, writes) = (Arc::clone(&armed), Arc::clone(&fail_release), Arc::clone(&writes));
        move |op: &crate::faulty::Op| {
            if op.coll != "_unique" || !matches!(op.kind, "insert" | "update" | "replace" | "delete") {
                return crate::faulty::Act::Pass;
            }
            // A release is a delete of a reservation: failed while asked for.
            if op.kind == "delete"
                && fail_release.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).is_ok()
            {
                return crate::faulty::Act::FailBefore;
            }
            if !armed.load(Ordering::SeqCst) {
                return crate::faulty::Act::Pass;
            }
            let n = writes.fetch_add(1, Ordering::SeqCst) + 1;
            if FAIL_BEFORE.contains(&n) {
                crate::faulty::Act::FailBefore
            } else if FAIL_AFTER.contains(&n) {
                crate::faulty::Act::FailAfter
            } else {
                crate::faulty::Act::Pass
            }
        }
    };
    let Some(app) = crate::faulty::rigged_app(backend, |_| {}, rule).await else { return };
    for i in 0..VALUES {
        create(&app, "r", &format!("p{i}"), &json!({"email": format!("e{i}")})).await;
    }
    create(&app, "r", "none", &json!({"name": "no email"})).await;

    armed.store(true, Ordering::SeqCst);
    unique_email(&app, "r").await;
    // New documents while reservations still fail now and then: a 503 is
    // tried again, with the same id, until the write lands.
    for i in 0..NEW {
        let body = json!({"_id": format!("n{i}"), "email": format!("new{i}")});
        let deadline = Instant::now() + WAIT;
        loop {
            let resp = app.post(&docs_path("r"), &body).await;
            match resp.status().as_u16() {
                201 => break,
                503 => assert!(Instant::now() < deadline, "n{i} never landed"),
                other => panic!("n{i}: {other} {}", resp.text().await.unwrap()),
            }
        }
    }
    armed.store(false, Ordering::SeqCst);
    assert!(writes.load(Ordering::SeqCst) > *FAIL_AFTER.iter().max().unwrap(), "every fault struck");

    // Every value is held by its document, and found through the index.
    let holders: Vec<(String, String)> = (0..VALUES)
        .map(|i| (format!("e{i}"), format!("p{i}")))
        .chain((0..NEW).map(|i| (format!("new{i}"), format!("n{i}"))))
        .collect();
    for (value, holder) in &holders {
        let dup = expect_problem(app.post(&docs_path("r"), &json!({"email": value})).await, 409, "duplicate").await;
        assert_eq!(dup["existing"], json!(holder), "{dup}");
        let page = expect(query(&app, "r", &json!({"filter": {"email": value}})).await, 200).await;
        let ids: Vec<&str> = page["items"].as_array().unwrap().iter().map(|i| i["id"].as_str().unwrap()).collect();
        assert_eq!(ids, [holder.as_str()], "{value}");
    }

    // A delete and a change whose releases fail still answer.
    fail_release.store(1, Ordering::SeqCst);
    expect(app.request(Method::DELETE, &format!("{}/p0", docs_path("r"))).send().await.unwrap(), 204).await;
    fail_release.store(1, Ordering::SeqCst);
    let p1 = format!("{}/p1", docs_path("r"));
    expect(app.send_json(Method::PATCH, &p1, &json!({"set": {"email": "moved"}})).await, 200).await;
    assert_eq!(fail_release.load(Ordering::SeqCst), 0, "both releases were tried and failed");
    // What they gave up is held for at most a claim's grace (30 s), then free.
    for (i, value) in ["e0", "e1"].into_iter().enumerate() {
        let body = json!({"_id": format!("taker{i}"), "email": value});
        let held = expect_problem(app.post(&docs_path("r"), &body).await, 409, "duplicate").await;
        assert_eq!(held["existing"], json!(format!("p{i}")), "{held}");
    }
    app.advance(Duration::from_secs(31));
    for (i, value) in ["e0", "e1"].into_iter().enumerate() {
        let body = json!({"_id": format!("taker{i}"), "email": value});
        let resp = app.post(&docs_path("r"), &body).await;
        assert_eq!(resp.status(), 201, "{value} is still held past the grace: {}", resp.text().await.unwrap());
    }
    // p1 holds what it moved to.
    expect_problem(app.post(&docs_path("r"), &json!({"email": "moved"})).await, 409, "duplicate").await;
    app.stop().await;
}

/// A create that waits for a transaction's lock on its document checks its
/// data, and claims its unique values, again after each wait: an index
/// declared during the wait (whose build checks the documents a few
/// seconds after its declaration) refuses an array in its path rather than
/// meet it in the collection, and a unique one a value taken meanwhile.
async fn a_create_that_waited_for_a_lock_keeps_an_index_declared_meanwhile(backend: Backend) {
    let tweak = |c: &mut txgate::config::Config| c.txn.lock_wait = Duration::from_secs(20);
    let Some(app) = TestApp::spawn_with(backend, tweak).await else { return };
    let app = Arc::new(app);
    // The rule of indexed paths.
    let waiting = held_create(&app, "held", json!({"_id": "x", "t": [1, 2]})).await;
    let resp = app.send_json(Method::PUT, "/v1/collections/held/indexes/t", &json!({"fields": ["t"]})).await;
    assert_eq!(resp.status(), 201);
    // Past the build's grace (it waits for the holder), the holder dies.
    app.advance(txgate::testing::indexes::GRACE);
    let pass = {
        let app = Arc::clone(&app);
        tokio::spawn(async move { app.run_once("index_builds").await })
    };
    app.until("the build waits for the holder", async || {
        let index = expect(app.get("/v1/collections/held/indexes/t").await, 200).await;
        assert_eq!(index["state"], "building", "{index}");
        index["progress"]["phase"] == "waiting"
    })
    .await;
    release_holder(&app, "held").await;
    let (status, body) = waiting.await.unwrap();
    assert_eq!(status, 422, "the create wrote an array into a path indexed meanwhile: {body}");
    assert_eq!(body["code"], "invalid_change", "{body}");
    pass.await.unwrap();
    let index = settled_index(&app, "held", "t").await;
    assert_eq!(index["state"], "ready", "{index}");
    let x = format!("{}/x", docs_path("held"));
    expect_problem(app.get(&x).await, 410, "deleted").await;
    // The data as the rule takes it is created.
    expect(app.post(&docs_path("held"), &json!({"_id": "x", "t": 3})).await, 201).await;
    // A unique index, whose value another document takes during the wait.
    let waiting = held_create(&app, "held_u", json!({"_id": "x", "u": 5})).await;
    let body = json!({"fields": ["u"], "unique": true});
    assert_eq!(app.send_json(Method::PUT, "/v1/collections/held_u/indexes/u", &body).await.status(), 201);
    create(&app, "held_u", "y", &json!({"u": 5})).await;
    release_holder(&app, "held_u").await;
    let (status, body) = waiting.await.unwrap();
    assert_eq!(status, 409, "the create took a unique value another document holds: {body}");
    assert_eq!((body["code"].as_str(), body["existing"].as_str()), (Some("duplicate"), Some("y")), "{body}");
    let index = settled_index(&app, "held_u", "u").await;
    assert_eq!(index["state"], "ready", "{index}");
}

/// Make `x` in `coll` a tombstone that a live transaction (`T-<coll>`)
/// holds with a staged insert, then start a create of `body` (with `_id`
/// `x`): it waits for the lock. Its status and answer, once it ends.
async fn held_create(app: &Arc<TestApp>, coll: &str, body: Value) -> tokio::task::JoinHandle<(u16, Value)> {
    use txgate::testing::document::{Staged, StagedOp, StoredDoc};
    use txgate::testing::txn::record::{Status, TXNS};
    create(app, coll, "x", &json!({"seed": 1})).await;
    let x = format!("{}/x", docs_path(coll));
    assert_eq!(app.request(Method::DELETE, &x).send().await.unwrap().status(), 204);
    let txn = format!("T-{coll}");
    let holder = crate::support::txn_record(&txn, Status::Pending, 60_000, coll, &["x"]);
    app.store.insert(TXNS, holder.to_record()).await.unwrap();
    let mut d = StoredDoc::from_record(app.store.get(coll, "x").await.unwrap().unwrap()).unwrap();
    d.meta.txn = Some(txn);
    d.meta.pending = Some(Staged { op: StagedOp::Insert, data: Some(doc! {"seed": 2}), sv: 1 });
    let v = d.meta.v;
    assert!(app.store.replace(coll, "x", doc! {"_meta.v": v}, d.to_record()).await.unwrap());
    let waiting = {
        let (app, coll) = (Arc::clone(app), coll.to_owned());
        tokio::spawn(async move {
            let res = app.post(&docs_path(&coll), &body).await;
            let status = res.status().as_u16();
            (status, res.json::<Value>().await.unwrap_or(Value::Null))
        })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!waiting.is_finished(), "the create did not wait for the lock");
    waiting
}

/// The transaction [`held_create`] made in `coll` dies (its lease runs
/// out), so its lock is cleaned up.
async fn release_holder(app: &TestApp, coll: &str) {
    use txgate::testing::txn::record::{Status, TXNS};
    let txn = format!("T-{coll}");
    let dead = crate::support::txn_record(&txn, Status::Pending, -60_000, coll, &["x"]);
    assert!(app.store.replace(TXNS, &txn, doc! {}, dead.to_record()).await.unwrap());
}

/// Unique indexes of one name declared at the same moment on several
/// collections, and one declared again right after its delete, share no
/// value: each collection's values are its own, a duplicate names only a
/// document of its own collection, and deleting one collection's index
/// frees no value of another's.
async fn unique_values_belong_to_one_collections_index(backend: Backend) {
    let Some(app) = TestApp::spawn(backend).await else { return };
    let app = Arc::new(app);
    let pairs = 6;
    let body = json!({"fields": ["email"], "unique": true});
    let mut declared = Vec::new();
    for i in 0..pairs {
        for side in ["a", "b"] {
            let (app, body) = (Arc::clone(&app), body.clone());
            declared.push(tokio::spawn(async move {
                app.send_json(Method::PUT, &format!("/v1/collections/u{side}{i}/indexes/email"), &body).await.status()
            }));
        }
    }
    for d in declared {
        assert_eq!(d.await.unwrap(), 201);
    }
    for i in 0..pairs {
        for side in ["a", "b"] {
            assert_eq!(settled_index(&app, &format!("u{side}{i}"), "email").await["state"], "ready");
        }
    }
    for i in 0..pairs {
        let (a, b) = (format!("ua{i}"), format!("ub{i}"));
        create(&app, &a, "a1", &json!({"email": "x@example.com"})).await;
        // The same value in the other collection is its own.
        create(&app, &b, "b1", &json!({"email": "x@example.com"})).await;
        let dup =
            expect_problem(app.post(&docs_path(&b), &json!({"email": "x@example.com"})).await, 409, "duplicate").await;
        assert_eq!(dup["existing"], "b1", "{dup}");
        // Deleting b's index frees none of a's values.
        let resp = app.request(Method::DELETE, &format!("/v1/collections/{b}/indexes/email")).send().await.unwrap();
        assert_eq!(resp.status(), 204);
    }
    // Past the delete's grace, when a shared name's values would be dropped.
    app.advance(Duration::from_secs(4));
    app.run_once("index_builds").await;
    for i in 0..pairs {
        let gone = app.store.get("_indexes", &format!("ub{i}/email")).await.unwrap();
        assert!(gone.is_none(), "ub{i}'s index is dropped: {gone:?}");
    }
    for i in 0..pairs {
        let a = format!("ua{i}");
        let dup =
            expect_problem(app.post(&docs_path(&a), &json!({"email": "x@example.com"})).await, 409, "duplicate").await;
        assert_eq!(dup["existing"], "a1", "{a}: {dup}");
    }
    // Deleted and declared again at once, on other fields: none of the
    // old index's values are held by the new one.
    let a = "ua0";
    let resp = app.request(Method::DELETE, &format!("/v1/collections/{a}/indexes/email")).send().await.unwrap();
    assert_eq!(resp.status(), 204);
    let again = json!({"fields": ["alt"], "unique": true});
    assert_eq!(app.send_json(Method::PUT, &format!("/v1/collections/{a}/indexes/email"), &again).await.status(), 201);
    assert_eq!(settled_index(&app, a, "email").await["state"], "ready");
    create(&app, a, "a2", &json!({"email": "x@example.com", "alt": "x@example.com"})).await;
    expect_problem(app.post(&docs_path(a), &json!({"alt": "x@example.com"})).await, 409, "duplicate").await;
    app.advance(Duration::from_secs(4));
    app.run_once("index_builds").await;
    expect_problem(app.post(&docs_path(a), &json!({"alt": "x@example.com"})).await, 409, "duplicate").await;
}

/// A store an earlier release left with two collections' unique indexes
/// under one store name (two declarations of one name in one millisecond),
/// their values reserved under it together: at start each declaration gets
/// a name of its own and is built again, after which each collection's
/// values are its own and a delete of one frees none of the other's.
async fn an_index_name_shared_by_an_earlier_release_is_separated_and_rebuilt(backend: Backend) {
    let Some(ts) = TestStore::new(backend).await else { return };
    let first = TestApp::on_store(test_config(ts.config.clone()), Arc::clone(&ts.store), None).await;
    for coll in ["sa", "sb"] {
        unique_email(&first, coll).await;
    }
    create(&first, "sa", "a1", &json!({"email": "x@example.com"})).await;
    create(&first, "sb", "b1", &json!({"email": "y@example.com"})).await;
    first.stop().await;
    // What the earlier release left: sb's declaration under sa's store
    // name, and its reservations under that name beside sa's.
    let store = Arc::clone(&ts.store);
    let physical = |d: Option<txgate_store::Record>| d.unwrap().get_str("physical").unwrap().to_owned();
    let shared = physical(store.get("_indexes", "sa/email").await.unwrap());
    let own = physical(store.get("_indexes", "sb/email").await.unwrap());
    let mut sb = store.get("_indexes", "sb/email").await.unwrap().unwrap();
    sb.insert("physical", shared.clone());
    assert!(store.replace("_indexes", "sb/email", doc! {}, sb).await.unwrap());
    store.drop_index("sb", &own).await.unwrap();
    let fields = ["_meta.deleted", "email", "_id"].map(str::to_owned).to_vec();
    let spec = txgate_store::IndexSpec { name: shared.clone(), fields, unique: false, sparse: false, counted: true };
    store.declare_index("sb", spec).await.unwrap();
    let mut after: Option<String> = None;
    while let Some(next) = store.build_index_step("sb", &shared, after.as_deref(), 1000).await.unwrap() {
        after = Some(next);
    }
    store.build_index_step("sb", &shared, None, 0).await.unwrap();
    let mut moved = 0;
    for mut r in
        store.scan("_unique", txgate_store::scans::UNIQUE_BY_INDEX.scan(vec![Bson::String(own.clone())])).await.unwrap()
    {
        let id = r.get_str("_id").unwrap().to_owned();
        let value = id.strip_prefix(&format!("{own}/")).unwrap().to_owned();
        r.insert("_id", format!("{shared}/{value}"));
        r.insert("index", shared.clone());
        assert!(store.insert("_unique", r).await.unwrap());
        assert!(store.delete("_unique", &id, doc! {}).await.unwrap());
        moved += 1;
    }
    assert_eq!(moved, 1, "sb's one value");
    let app = TestApp::on_store(test_config(ts.config.clone()), Arc::clone(&ts.store), Some(ts)).await;
    // Its builder's first pass looks for names shared between declarations.
    app.run_once("index_builds").await;
    let now = physical(app.store.get("_indexes", "sb/email").await.unwrap());
    assert_ne!(now, shared, "sb's index was given a name of its own");
    for coll in ["sa", "sb"] {
        assert_eq!(settled_index(&app, coll, "email").await["state"], "ready", "{coll}");
    }
    let (a, b) = (
        physical(app.store.get("_indexes", "sa/email").await.unwrap()),
        physical(app.store.get("_indexes", "sb/email").await.unwrap()),
    );
    assert!(a != shared && b != shared && a != b, "{a} {b} {shared}");
    // Each collection's values its own: x is a's only, y b's only.
    create(&app, "sb", "b2", &json!({"email": "x@example.com"})).await;
    create(&app, "sa", "a2", &json!({"email": "y@example.com"})).await;
    let dup =
        expect_problem(app.post(&docs_path("sa"), &json!({"email": "x@example.com"})).await, 409, "duplicate").await;
    assert_eq!(dup["existing"], "a1", "{dup}");
    let dup =
        expect_problem(app.post(&docs_path("sb"), &json!({"email": "y@example.com"})).await, 409, "duplicate").await;
    assert_eq!(dup["existing"], "b1", "{dup}");
    // The shared name's reservations are dropped after the grace.
    app.advance(Duration::from_secs(4));
    app.run_once("index_builds").await;
    let left = app
        .store
        .scan("_unique", txgate_store::scans::UNIQUE_BY_INDEX.scan(vec![Bson::String(shared.clone())]))
        .await
        .unwrap();
    assert!(left.is_empty(), "{} values still reserved under the shared name", left.len());
    // Deleting b's index frees none of a's values.
    let resp = app.request(Method::DELETE, "/v1/collections/sb/indexes/email").send().await.unwrap();
    assert_eq!(resp.status(), 204);
    app.advance(Duration::from_secs(4));
    app.run_once("index_builds").await;
    assert!(app.store.get("_indexes", "sb/email").await.unwrap().is_none(), "sb's index is dropped");
    let dup =
        expect_problem(app.post(&docs_path("sa"), &json!({"email": "y@example.com"})).await, 409, "duplicate").await;
    assert_eq!(dup["existing"], "a2", "{dup}");
    app.stop().await;
}

/// Builds are fair across collections: with eight indexes declared on a
/// large collection whose every read is slow, an index declared at the same
/// moment on a one-document collection (named to sort after it) is ready
/// after a step or two of the others, not after all of them.
async fn one_collections_builds_do_not_starve_anothers(backend: Backend) {
    use crate::faulty::{Act, Op};
    const INDEXES: usize = 8;
    // Each read of the large collection's documents takes a while, so its
    // builds take seconds each.
    let rule = |op: &Op| {
        if op.coll == "big" && op.kind == "scan" { Act::Delay(Duration::from_millis(250)) } else { Act::Pass }
    };
    let Some(app) = crate::faulty::rigged_app(backend, |_| {}, rule).await else { return };
    for chunk in 0..(2_500 / 50) {
        let actions: Vec<Value> = (0..50)
            .map(|i| {
                let k = chunk * 50 + i;
                let data = json!({"f0": k, "f1": k, "f2": k, "f3": k, "f4": k, "f5": k, "f6": k, "f7": k});
                json!({"op": "insert", "collection": "big", "id": format!("b{k:05}"), "data": data})
            })
            .collect();
        expect(app.post("/v1/transactions", &json!({ "actions": actions })).await, 200).await;
    }
    create(&app, "small", "one", &json!({"g": 1})).await;
    for i in 0..INDEXES {
        put_index(&app, "big", &format!("f{i}"), &[&format!("f{i}")]).await;
    }
    put_index(&app, "small", "g", &["g"]).await;
    // Past the grace, one pass starts every build and ends when all have.
    app.advance(txgate::testing::indexes::GRACE);
    app.run_once("index_builds").await;
    let ready_at = |index: &Value| {
        assert_eq!(index["state"], "ready", "{index}");
        index["updated_at"].as_str().expect("updated_at").to_owned()
    };
    let small = ready_at(&expect(app.get("/v1/collections/small/indexes/g").await, 200).await);
    let mut before = 0;
    for i in 0..INDEXES {
        let index = expect(app.get(&format!("/v1/collections/big/indexes/f{i}")).await, 200).await;
        before += usize::from(ready_at(&index) <= small);
    }
    assert!(before <= 2, "the small collection's index waited for {before} of the large one's {INDEXES} builds");
    let page = expect(query(&app, "big", &json!({"filter": {"f7": 42}})).await, 200).await;
    assert_eq!(page["items"][0]["id"], "b00042", "{page}");
    app.stop().await;
}

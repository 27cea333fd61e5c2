//! Queries over declared indexes, on both stores: a model of MongoDB's
//! query semantics written here, over every document, decides what each
//! random query must answer (random documents with mixed types, nulls,
//! missing fields, nested paths and arrays beside the indexed paths;
//! random filters and sorts over the declared indexes; pages of random
//! sizes, with writes between pages; `fields` trimming as MongoDB's
//! projection does, arrays of objects included); every kind of query no index serves
//! is `index_required` with the index that would; what is outside the
//! language is refused; counts match the model; a transaction's writes are
//! queried once it answers, and documents it holds before then are shown
//! as committed; a cursor goes on only with its own query. Declared indexes themselves (the rule of
//! indexed paths, builds, unique indexes) are `declared_indexes`.

use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::seq::IndexedRandom;
use rand::{Rng, SeedableRng};
use reqwest::Method;
use serde_json::{Map, Value, json};

use txgate_store::Bson;

use crate::support::{Backend, TestApp, expect, expect_problem};

crate::on_both_backends!(
    random_queries_answer_what_the_model_says,
    pages_return_every_unchanged_document_once_while_writes_go_on,
    queries_no_index_serves_name_the_index_that_would,
    what_is_outside_the_language_is_refused,
    counts_come_from_index_entries,
    a_transactions_writes_are_queried_once_it_answers,
    another_instances_transaction_is_queried_once_it_answers,
    pages_of_large_documents_stop_at_their_bytes,
    a_cursor_goes_on_only_with_its_own_query,
    an_index_declared_but_not_ready_is_named_in_index_required,
    a_document_a_transaction_holds_is_queried_as_committed,
    numbers_are_kept_and_matched_exactly,
);

pub(crate) const WAIT: Duration = Duration::from_secs(30);

pub(crate) fn docs_path(coll: &str) -> String {
    format!("/v1/collections/{coll}/documents")
}

pub(crate) async fn put_index(app: &TestApp, coll: &str, name: &str, fields: &[&str]) -> Value {
    let resp =
        app.send_json(Method::PUT, &format!("/v1/collections/{coll}/indexes/{name}"), &json!({"fields": fields})).await;
    let status = resp.status().as_u16();
    assert!(status == 201 || status == 200, "PUT index answered {status}: {}", resp.text().await.unwrap());
    resp.json().await.unwrap()
}

/// Wait until index `name` of `coll` leaves `building`; its final state.
pub(crate) async fn settled_index(app: &TestApp, coll: &str, name: &str) -> Value {
    let deadline = Instant::now() + WAIT;
    loop {
        let index = expect(app.get(&format!("/v1/collections/{coll}/indexes/{name}")).await, 200).await;
        if index["state"] != "building" {
            return index;
        }
        assert!(Instant::now() < deadline, "index {name} still building: {index}");
        // Past the grace a new declaration waits out, then a whole pass of
        // the builder, its builds included.
        app.advance(txgate::testing::indexes::GRACE);
        app.run_once("index_builds").await;
    }
}

pub(crate) async fn ready_index(app: &TestApp, coll: &str, name: &str, fields: &[&str]) {
    put_index(app, coll, name, fields).await;
    let index = settled_index(app, coll, name).await;
    assert_eq!(index["state"], "ready", "{index}");
}

/// POST …/query; the response.
pub(crate) async fn query(app: &TestApp, coll: &str, body: &Value) -> reqwest::Response {
    app.post(&format!("/v1/collections/{coll}/query"), body).await
}

/// GET …/count with `filter` (none: every live document); the response.
async fn count_request(app: &TestApp, coll: &str, filter: Option<&str>) -> reqwest::Response {
    let mut req = app.request(Method::GET, &format!("/v1/collections/{coll}/count"));
    if let Some(filter) = filter {
        req = req.query(&[("filter", filter)]);
    }
    req.send().await.unwrap()
}

// ---- the model: MongoDB's semantics over JSON scalars ------------------

/// MongoDB's type brackets of the values the tests use.
fn bracket(v: Option<&Value>) -> u8 {
    match v {
        None | Some(Value::Null) => 0,
        Some(Value::Number(_)) => 1,
        Some(Value::String(_)) => 2,
        Some(Value::Object(_)) => 3,
        Some(Value::Array(_)) => 4,
        Some(Value::Bool(_)) => 5,
    }
}

fn order(a: Option<&Value>, b: Option<&Value>) -> Ordering {
    let (ba, bb) = (bracket(a), bracket(b));
    if ba != bb {
        return ba.cmp(&bb);
    }
    match (a, b) {
        (Some(Value::Number(x)), Some(Value::Number(y))) => numbers(x, y),
        (Some(Value::String(x)), Some(Value::String(y))) => x.as_bytes().cmp(y.as_bytes()),
        (Some(Value::Bool(x)), Some(Value::Bool(y))) => x.cmp(y),
        _ => Ordering::Equal,
    }
}

/// Two JSON numbers as the gateway stores them (an integer that fits 64
/// bits as one, any other as a double), compared exactly as MongoDB
/// compares an integer and a double.
fn numbers(x: &serde_json::Number, y: &serde_json::Number) -> Ordering {
    fn int_double(i: i64, d: f64) -> Ordering {
        if d >= 9_223_372_036_854_775_808.0 {
            return Ordering::Less;
        }
        if d < -9_223_372_036_854_775_808.0 {
            return Ordering::Greater;
        }
        let whole = d.trunc();
        i.cmp(&(whole as i64)).then_with(|| 0.0_f64.partial_cmp(&(d - whole)).unwrap())
    }
    match (x.as_i64(), y.as_i64()) {
        (Some(a), Some(b)) => a.cmp(&b),
        (Some(a), None) => int_double(a, y.as_f64().unwrap()),
        (None, Some(b)) => int_double(b, x.as_f64().unwrap()).reverse(),
        (None, None) => x.as_f64().unwrap().partial_cmp(&y.as_f64().unwrap()).unwrap(),
    }
}

fn at<'a>(data: &'a Value, path: &str) -> Option<&'a Value> {
    let mut cur = data;
    for seg in path.split('.') {
        cur = cur.as_object()?.get(seg)?;
    }
    Some(cur)
}

fn equal(v: Option<&Value>, arg: &Value) -> bool {
    if arg.is_null() {
        return matches!(v, None | Some(Value::Null));
    }
    v.is_some() && bracket(v) == bracket(Some(arg)) && order(v, Some(arg)) == Ordering::Equal
}

fn compare(v: Option<&Value>, arg: &Value, ok: fn(Ordering) -> bool) -> bool {
    if arg.is_null() {
        // Against null the bracket is null (and missing) alone.
        return ok(Ordering::Equal) && matches!(v, None | Some(Value::Null));
    }
    v.is_some() && bracket(v) == bracket(Some(arg)) && ok(order(v, Some(arg)))
}

fn cond_holds(v: Option<&Value>, cond: &Value) -> bool {
    let Value::Object(ops) = cond else { return equal(v, cond) };
    ops.iter().all(|(op, arg)| match op.as_str() {
        "$eq" => equal(v, arg),
        "$ne" => !equal(v, arg),
        "$gt" => compare(v, arg, |o| o == Ordering::Greater),
        "$gte" => compare(v, arg, |o| o != Ordering::Less),
        "$lt" => compare(v, arg, |o| o == Ordering::Less),
        "$lte" => compare(v, arg, |o| o != Ordering::Greater),
        "$in" => arg.as_array().unwrap().iter().any(|a| equal(v, a)),
        "$nin" => !arg.as_array().unwrap().iter().any(|a| equal(v, a)),
        other => panic!("the model has no {other}"),
    })
}

fn model_matches(data: &Value, filter: &Value) -> bool {
    filter.as_object().unwrap().iter().all(|(k, cond)| {
        if k == "$and" {
            cond.as_array().unwrap().iter().all(|f| model_matches(data, f))
        } else {
            cond_holds(at(data, k), cond)
        }
    })
}

/// `(id, data)` of every live document, in order: the sort keys, then
/// the id (descending when `reverse_ids`).
fn model_answer(
    docs: &BTreeMap<String, Value>,
    filter: &Value,
    sort: &[(String, bool)],
    reverse_ids: bool,
) -> Vec<String> {
    let mut hits: Vec<(&String, &Value)> = docs.iter().filter(|(_, d)| model_matches(d, filter)).collect();
    hits.sort_by(|(ia, a), (ib, b)| {
        for (path, desc) in sort {
            let o = order(at(a, path), at(b, path));
            let o = if *desc { o.reverse() } else { o };
            if o != Ordering::Equal {
                return o;
            }
        }
        if reverse_ids { ib.cmp(ia) } else { ia.cmp(ib) }
    });
    hits.into_iter().map(|(id, _)| id.clone()).collect()
}

/// Paths `fields` may name in the model test: scalars, objects, arrays
/// of objects and of other values, paths into scalars, missing ones.
const FIELDS: &[&str] =
    &["a", "b", "n", "n.x", "n.x.y", "tags", "tags.k", "other", "other.deep", "other.deep.k", "a.x", "missing"];

/// `data` trimmed to `fields` as MongoDB's inclusion projection trims it:
/// each field of the document (in its order) named by a path is kept
/// whole; one that paths reach into is kept trimmed to the rest of those
/// paths when it is an object, as the trimmed objects it holds (its other
/// elements dropped) when it is an array, and dropped otherwise.
fn model_projection(data: &Value, fields: &[&str]) -> Value {
    fn inner(value: &Value, rests: &[&str]) -> Option<Value> {
        match value {
            Value::Object(_) => Some(model_projection(value, rests)),
            Value::Array(items) => Some(Value::Array(items.iter().filter_map(|v| inner(v, rests)).collect())),
            _ => None,
        }
    }
    let mut out = Map::new();
    for (name, value) in data.as_object().unwrap() {
        if fields.contains(&name.as_str()) {
            out.insert(name.clone(), value.clone());
            continue;
        }
        let rests: Vec<&str> = fields.iter().filter_map(|f| f.strip_prefix(name.as_str())?.strip_prefix('.')).collect();
        if !rests.is_empty() {
            if let Some(kept) = inner(value, &rests) {
                out.insert(name.clone(), kept);
            }
        }
    }
    Value::Object(out)
}

// ---- random documents and queries ---------------------------------------

/// A value of the pool the documents and filters draw from; a few are the
/// numbers a double does not tell apart (integers past 2^53, 2^63 − 1
/// beside the double 2^63, which JSON's 9223372036854775808 becomes).
fn pool(rng: &mut StdRng) -> Option<Value> {
    if rng.random_bool(0.15) {
        let big = [
            json!(i64::MAX),
            json!(i64::MAX - 1),
            json!(i64::MAX - 600),
            json!(9_223_372_036_854_775_808_u64),
            json!(9.3e18),
            json!(9_007_199_254_740_993_i64),
            json!(9_007_199_254_740_992.0),
            json!(i64::MIN),
        ];
        return Some(big.choose(rng).unwrap().clone());
    }
    let choices = [
        json!(0),
        json!(1),
        json!(2),
        json!(2.5),
        json!(-1),
        json!(-1.5),
        json!(1_000_000_000_000_i64),
        json!("a"),
        json!("b"),
        json!(""),
        json!("ab"),
        json!(true),
        json!(false),
        Value::Null,
    ];
    if rng.random_bool(0.12) { None } else { Some(choices.choose(rng).unwrap().clone()) }
}

fn random_doc(rng: &mut StdRng) -> Value {
    let mut d = Map::new();
    for f in ["a", "b", "c"] {
        if let Some(v) = pool(rng) {
            d.insert(f.into(), v);
        }
    }
    if rng.random_bool(0.8) {
        let mut n = Map::new();
        if let Some(v) = pool(rng) {
            n.insert("x".into(), v);
        }
        d.insert("n".into(), Value::Object(n));
    }
    // Arrays and objects beside the indexed paths are fine.
    d.insert("tags".into(), json!(["t", 1, {"k": 2}]));
    d.insert("other".into(), json!({"deep": [1, {"k": null}]}));
    Value::Object(d)
}

/// The indexes the random queries are served by.
const INDEXES: &[(&str, &[&str])] =
    &[("a_b", &["a", "-b"]), ("b", &["b"]), ("c_a_nx", &["c", "a", "-n.x"]), ("nx", &["n.x"])];

fn scalar(rng: &mut StdRng) -> Value {
    pool(rng).unwrap_or(Value::Null)
}

/// A random query served by one of [`INDEXES`]: its filter, its sort,
/// whether ids run backwards.
fn random_query(rng: &mut StdRng) -> (Value, Vec<(String, bool)>, bool) {
    let (_, fields) = INDEXES.choose(rng).unwrap();
    let keys: Vec<(String, bool)> = fields
        .iter()
        .map(|f| match f.strip_prefix('-') {
            Some(p) => (p.to_owned(), true),
            None => ((*f).to_owned(), false),
        })
        .collect();
    let k = rng.random_range(0..=keys.len());
    let mut filter = Map::new();
    for (path, _) in &keys[..k] {
        filter.insert(path.clone(), scalar(rng));
    }
    let rest = &keys[k..];
    // Ids run backwards when the index does, which needs an order field.
    let reverse = !rest.is_empty() && rng.random_bool(0.5);
    if let Some((path, _)) = rest.first() {
        if rng.random_bool(0.7) {
            let cond = match rng.random_range(0..8) {
                0 => json!({"$gt": scalar(rng)}),
                1 => json!({"$gte": scalar(rng), "$lt": scalar(rng)}),
                2 => json!({"$lte": scalar(rng)}),
                3 => json!({"$in": [scalar(rng), scalar(rng), scalar(rng)]}),
                4 => json!({"$ne": scalar(rng)}),
                5 => json!({"$nin": [scalar(rng), scalar(rng)]}),
                6 => json!({"$lt": scalar(rng), "$ne": scalar(rng)}),
                _ => json!({"$gt": scalar(rng), "$nin": [scalar(rng)]}),
            };
            if rng.random_bool(0.3) {
                // The same conditions through $and.
                filter.insert("$and".into(), json!([{ path.clone(): cond }]));
            } else {
                filter.insert(path.clone(), cond);
            }
        }
    }
    let sort: Vec<(String, bool)> = rest.iter().map(|(p, d)| (p.clone(), *d != reverse)).collect();
    (Value::Object(filter), sort, reverse)
}

pub(crate) fn sort_param(sort: &[(String, bool)]) -> Vec<String> {
    sort.iter().map(|(p, d)| if *d { format!("-{p}") } else { p.clone() }).collect()
}

/// Every page of a query (random sizes), through GET and POST alike;
/// `between` runs between pages. The ids, in the order answered.
pub(crate) async fn all_pages(
    app: &TestApp,
    coll: &str,
    filter: &Value,
    sort: &[(String, bool)],
    rng: &mut StdRng,
    mut between: impl AsyncFnMut(&mut StdRng),
) -> Vec<(String, Value)> {
    let mut out = Vec::new();
    let mut after: Option<String> = None;
    for _ in 0..10_000 {
        let limit = rng.random_range(1..=7);
        let page = if rng.random_bool(0.5) {
            let mut body = json!({"filter": filter, "sort": sort_param(sort), "limit": limit});
            if let Some(a) = &after {
                body["after"] = json!(a);
            }
            expect(query(app, coll, &body).await, 200).await
        } else {
            let mut params = vec![
                ("filter".to_owned(), filter.to_string()),
                ("sort".to_owned(), sort_param(sort).join(",")),
                ("limit".to_owned(), limit.to_string()),
            ];
            if let Some(a) = &after {
                params.push(("after".to_owned(), a.clone()));
            }
            expect(app.request(Method::GET, &docs_path(coll)).query(&params).send().await.unwrap(), 200).await
        };
        let items = page["items"].as_array().unwrap();
        assert!(items.len() <= limit, "a page holds at most its limit");
        for item in items {
            out.push((item["id"].as_str().unwrap().to_owned(), item["data"].clone()));
        }
        match page["next"].as_str() {
            Some(next) => after = Some(next.to_owned()),
            None => return out,
        }
        between(rng).await;
    }
    panic!("the pages never end");
}

pub(crate) async fn create(app: &TestApp, coll: &str, id: &str, data: &Value) {
    let mut body = data.clone();
    body["_id"] = json!(id);
    expect(app.post(&docs_path(coll), &body).await, 201).await;
}

async fn seeded(backend: Backend, n: usize) -> Option<(TestApp, StdRng, BTreeMap<String, Value>)> {
    let app = TestApp::spawn(backend).await?;
    let seed: u64 = std::env::var("TXGATE_TEST_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(rand::random);
    eprintln!("query model seed: {seed} (TXGATE_TEST_SEED={seed} repeats it)");
    let mut rng = StdRng::seed_from_u64(seed);
    let mut docs = BTreeMap::new();
    for i in 0..n {
        let id = format!("d{i:03}");
        let data = random_doc(&mut rng);
        create(&app, "m", &id, &data).await;
        docs.insert(id, data);
    }
    for (name, fields) in INDEXES {
        put_index(&app, "m", name, fields).await;
    }
    for (name, _) in INDEXES {
        let index = settled_index(&app, "m", name).await;
        assert_eq!(index["state"], "ready", "{index}");
    }
    Some((app, rng, docs))
}

async fn random_queries_answer_what_the_model_says(backend: Backend) {
    let Some((app, mut rng, mut docs)) = seeded(backend, 120).await else { return };
    // Some deleted and changed: tombstones and changed entries too.
    for id in ["d000", "d001", "d002"] {
        expect(app.request(Method::DELETE, &format!("{}/{id}", docs_path("m"))).send().await.unwrap(), 204).await;
        docs.remove(id);
    }
    for id in ["d003", "d004"] {
        let data = random_doc(&mut rng);
        expect(app.send_json(Method::PUT, &format!("{}/{id}", docs_path("m")), &data).await, 200).await;
        docs.insert(id.to_owned(), data);
    }
    for round in 0..60 {
        let (filter, sort, reverse) = random_query(&mut rng);
        let want = model_answer(&docs, &filter, &sort, reverse);
        let got: Vec<String> =
            all_pages(&app, "m", &filter, &sort, &mut rng, async |_| {}).await.into_iter().map(|(id, _)| id).collect();
        assert_eq!(got, want, "round {round}: filter {filter} sort {sort:?}");
        // The first page again, whole and trimmed to random paths (the
        // numbers as the gateway writes them).
        let n = rng.random_range(1..=4);
        let fields: Vec<&str> = FIELDS.choose_multiple(&mut rng, n).copied().collect();
        let mut body = json!({"filter": filter, "sort": sort_param(&sort), "limit": 100});
        let whole = expect(query(&app, "m", &body).await, 200).await;
        body["fields"] = json!(fields);
        let trimmed = expect(query(&app, "m", &body).await, 200).await;
        let (whole, trimmed) = (whole["items"].as_array().unwrap(), trimmed["items"].as_array().unwrap());
        assert_eq!(whole.len(), trimmed.len(), "round {round}: trimmed to {fields:?}");
        for (item, trimmed) in whole.iter().zip(trimmed) {
            assert_eq!(item["id"], trimmed["id"]);
            assert_eq!(item["version"], trimmed["version"], "the envelope stays");
            let want = model_projection(&item["data"], &fields);
            assert_eq!(trimmed["data"], want, "round {round}: {} trimmed to {fields:?}", item["id"]);
        }
        // The count of the same filter, where an index counts it.
        let resp = count_request(&app, "m", Some(&filter.to_string())).await;
        if resp.status() == 200 {
            let body: Value = resp.json().await.unwrap();
            assert_eq!(body["count"].as_u64().unwrap() as usize, want.len(), "count of {filter}");
        } else {
            let body = expect_problem(resp, 400, "index_required").await;
            assert!(body["index"]["fields"].is_array(), "{body}");
        }
    }
    let _ = &mut docs;
}

async fn pages_return_every_unchanged_document_once_while_writes_go_on(backend: Backend) {
    let Some((app, mut rng, docs)) = seeded(backend, 80).await else { return };
    // d000..d039 are never touched; the others are changed, deleted and
    // joined by new documents between pages.
    let stable: BTreeMap<String, Value> =
        docs.iter().filter(|(id, _)| id.as_str() < "d040").map(|(k, v)| (k.clone(), v.clone())).collect();
    let mut fresh = 0;
    for round in 0..12 {
        let (filter, sort, reverse) = random_query(&mut rng);
        let coll = "m";
        let app_ref = &app;
        let answered = all_pages(&app, coll, &filter, &sort, &mut rng, async |rng: &mut StdRng| {
            let victim = format!("d{:03}", rng.random_range(40..80));
            let path = format!("{}/{victim}", docs_path(coll));
            match rng.random_range(0..3) {
                0 => {
                    let _ = app_ref.send_json(Method::PUT, &path, &random_doc(rng)).await;
                }
                1 => {
                    let _ = app_ref.request(Method::DELETE, &path).send().await;
                }
                _ => {
                    fresh += 1;
                    let id = format!("new-{round}-{fresh}");
                    create(app_ref, coll, &id, &random_doc(rng)).await;
                }
            }
        })
        .await;
        let mut seen = BTreeMap::new();
        for (id, data) in &answered {
            assert!(
                model_matches(data, &filter),
                "round {round}: {id} answered with data {data} that does not match {filter}"
            );
            *seen.entry(id.clone()).or_insert(0) += 1;
        }
        for id in model_answer(&stable, &filter, &sort, reverse) {
            assert_eq!(
                seen.get(&id),
                Some(&1),
                "round {round}: unchanged {id} not answered exactly once ({filter} {sort:?})"
            );
        }
        // And the unchanged ones come in their order.
        let stable_order: Vec<&String> =
            answered.iter().map(|(id, _)| id).filter(|id| stable.contains_key(*id)).collect();
        let want = model_answer(&stable, &filter, &sort, reverse);
        assert_eq!(stable_order, want.iter().collect::<Vec<_>>(), "round {round}: order of the unchanged documents");
    }
}

async fn queries_no_index_serves_name_the_index_that_would(backend: Backend) {
    let Some(app) = TestApp::spawn(backend).await else { return };
    create(&app, "q", "one", &json!({"status": "open", "amount": 5, "customer": "c"})).await;
    create(&app, "q", "two", &json!({"status": "open", "amount": 1, "-x": 3})).await;
    ready_index(&app, "q", "by_status", &["status", "-amount"]).await;
    let cases = [
        // An equality on a path no index starts with.
        (json!({"filter": {"customer": "c"}}), json!(["customer"])),
        // A sort no index has.
        (json!({"filter": {"status": "open"}, "sort": ["customer"]}), json!(["status", "customer"])),
        // An index read in mixed directions.
        (
            json!({"filter": {"status": "open"}, "sort": ["-amount", "customer"]}),
            json!(["status", "-amount", "customer"]),
        ),
        // Equality alone: an index holding more fields would order by them.
        (json!({"filter": {"status": "open"}}), json!(["status"])),
        // A range on the first field without its equality.
        (json!({"filter": {"amount": {"$gt": 1}}}), json!(["amount"])),
        // $in, $ne and $nin are ranges: on the next field of an index.
        (json!({"filter": {"customer": {"$in": ["c"]}}}), json!(["customer"])),
        (json!({"filter": {"customer": {"$ne": "c"}}}), json!(["customer"])),
        (json!({"filter": {"status": "open", "customer": {"$nin": ["c"]}}}), json!(["status", "customer"])),
        // A sort alone.
        (json!({"sort": ["-amount"]}), json!(["-amount"])),
        // A field whose name starts with `-`: `--x` (`-x` descending) where
        // the direction is free, as `-x` would be `x` descending.
        (json!({"filter": {"-x": 3}}), json!(["--x"])),
        (json!({"filter": {"status": "open", "-x": {"$gt": 1}}}), json!(["status", "--x"])),
    ];
    for (body, fields) in cases {
        let problem = expect_problem(query(&app, "q", &body).await, 400, "index_required").await;
        assert_eq!(problem["index"]["fields"], fields, "{body}: {problem}");
        // The index it names serves the query once it is ready.
        let name = problem["index"]["name"].as_str().unwrap().to_owned();
        let fields: Vec<&str> =
            problem["index"]["fields"].as_array().unwrap().iter().map(|f| f.as_str().unwrap()).collect();
        ready_index(&app, "q", &name, &fields).await;
        let page = expect(query(&app, "q", &body).await, 200).await;
        if body["filter"].get("-x").is_some() {
            assert_eq!(page["items"].as_array().unwrap().len(), 1, "{body}: {page}");
            assert_eq!(page["items"][0]["id"], "two", "{body}: {page}");
        }
        expect(app.request(Method::DELETE, &format!("/v1/collections/q/indexes/{name}")).send().await.unwrap(), 204)
            .await;
        expect_problem(query(&app, "q", &body).await, 400, "index_required").await;
    }
    // A name another index has (on other fields) is not suggested: the
    // next free one is, and it can be PUT as it is.
    ready_index(&app, "q", "day", &["amount", "day"]).await;
    let body = json!({"filter": {"day": 1}});
    let problem = expect_problem(query(&app, "q", &body).await, 400, "index_required").await;
    assert_eq!(problem["index"]["name"], "day_2", "{problem}");
    assert!(problem["detail"].as_str().unwrap().ends_with("/indexes/day_2"), "{problem}");
    ready_index(&app, "q", "day_2", &["day"]).await;
    expect(query(&app, "q", &body).await, 200).await;
    // What no index can serve says why, and names none.
    for body in [
        json!({"filter": {"status": {"$exists": true}}}),
        json!({"filter": {"status": {"$gt": "a"}, "amount": {"$gt": 1}}}),
        json!({"filter": {"amount": {"$gt": 1}}, "sort": ["status"]}),
        // More paths than an index may have fields.
        json!({"filter": (0..9).map(|i| (format!("f{i}"), json!(1))).collect::<serde_json::Map<_, _>>()}),
    ] {
        let problem = expect_problem(query(&app, "q", &body).await, 400, "index_required").await;
        assert!(problem.get("index").is_none(), "{problem}");
    }
    // A served query answers.
    let page = expect(query(&app, "q", &json!({"filter": {"status": "open"}, "sort": ["-amount"]})).await, 200).await;
    assert_eq!(page["items"][0]["id"], "one");
    // The body takes `sort` and `fields` as the parameters write them too
    // (one comma-separated string), with the same answer.
    let listed = json!({"filter": {"status": "open"}, "sort": ["-amount"], "fields": ["status", "amount"]});
    let joined = json!({"filter": {"status": "open"}, "sort": "-amount", "fields": "status, amount"});
    let (listed, joined) =
        (expect(query(&app, "q", &listed).await, 200).await, expect(query(&app, "q", &joined).await, 200).await);
    assert_eq!(listed["items"], joined["items"], "{joined}");
    let problem = expect_problem(
        query(&app, "q", &json!({"filter": {"status": "open"}, "sort": "-amount,-amount"})).await,
        400,
        "invalid_filter",
    )
    .await;
    assert_eq!(problem["errors"][0]["pointer"], "/sort/1", "{problem}");
    let problem = expect_problem(query(&app, "q", &json!({"sort": 5})).await, 422, "validation_failed").await;
    assert_eq!(problem["errors"][0]["pointer"], "/sort", "{problem}");
}

async fn what_is_outside_the_language_is_refused(backend: Backend) {
    let Some(app) = TestApp::spawn(backend).await else { return };
    create(&app, "r", "one", &json!({"a": 1})).await;
    for filter in [
        json!({"$where": "sleep(1000)"}),
        json!({"$or": [{"a": 1}]}),
        json!({"a": {"$regex": "^x"}}),
        json!({"a": {"$elemMatch": {"b": 1}}}),
        json!({"_meta.v": 1}),
        json!({"_id": "one"}),
        json!({"$expr": {"$eq": [1, 1]}}),
        json!({"a.$": 1}),
        json!({"a": {"b": 1}}),
        json!({"a": [1]}),
        json!({"a": {"$in": "x"}}),
        json!({"a": {"$gt": {"$gt": 1}}}),
        json!([{"a": 1}]),
    ] {
        let problem = expect_problem(query(&app, "r", &json!({ "filter": filter })).await, 400, "invalid_filter").await;
        assert!(problem["errors"][0]["pointer"].as_str().unwrap().starts_with("/filter"), "{problem}");
        let resp =
            app.request(Method::GET, &docs_path("r")).query(&[("filter", filter.to_string())]).send().await.unwrap();
        expect_problem(resp, 400, "invalid_filter").await;
    }
    for sort in ["_meta.v", "$natural", "a..b", ""] {
        // The item refused is pointed at by its place.
        let problem =
            expect_problem(query(&app, "r", &json!({"sort": ["a", sort]})).await, 400, "invalid_filter").await;
        assert_eq!(problem["errors"][0]["pointer"], "/sort/1", "{sort}: {problem}");
        let problem =
            expect_problem(query(&app, "r", &json!({"fields": ["a", sort]})).await, 400, "invalid_filter").await;
        assert_eq!(problem["errors"][0]["pointer"], "/fields/1", "{sort}: {problem}");
    }
    // An empty item in a parameter's list is refused as the body's "" is;
    // an empty parameter is an empty list.
    for (name, list) in [("sort", "a,"), ("sort", ",a"), ("fields", "a,,b")] {
        let resp = app.request(Method::GET, &docs_path("r")).query(&[(name, list)]).send().await.unwrap();
        let problem = expect_problem(resp, 400, "invalid_filter").await;
        assert_eq!(problem["errors"][0]["pointer"], format!("/query/{name}"), "{name}={list}: {problem}");
    }
    let resp = app.request(Method::GET, &docs_path("r")).query(&[("sort", "")]).send().await.unwrap();
    assert_eq!(expect(resp, 200).await["items"][0]["id"], "one");
    // A path sorted by twice, in either direction.
    for sort in [["a", "-a"], ["a", "a"]] {
        let problem = expect_problem(query(&app, "r", &json!({"sort": sort})).await, 400, "invalid_filter").await;
        assert_eq!(problem["errors"][0]["pointer"], "/sort/1", "{problem}");
        let resp = app.request(Method::GET, &docs_path("r")).query(&[("sort", sort.join(","))]).send().await.unwrap();
        expect_problem(resp, 400, "invalid_filter").await;
    }
    let resp = app.request(Method::GET, &docs_path("r")).query(&[("filter", "{not json")]).send().await.unwrap();
    expect_problem(resp, 400, "invalid_filter").await;
    // A member named twice is refused in a parameter, as in a body.
    let twice = r#"{"b": 0, "a": {"$gt": 1, "$gt": 2}}"#;
    let resp = app.request(Method::GET, &docs_path("r")).query(&[("filter", twice)]).send().await.unwrap();
    let problem = expect_problem(resp, 400, "invalid_filter").await;
    assert_eq!(problem["errors"][0]["pointer"], "/query/filter/a/$gt", "{problem}");
    let resp = app.request(Method::GET, "/v1/collections/r/count").query(&[("filter", twice)]).send().await.unwrap();
    expect_problem(resp, 400, "invalid_filter").await;
    let raw = async |body: String| {
        app.request(Method::POST, "/v1/collections/r/query")
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .unwrap()
    };
    let body = expect_problem(raw(format!(r#"{{"filter": {twice}}}"#)).await, 400, "invalid_filter").await;
    assert_eq!(body["errors"][0]["pointer"], "/filter/a/$gt", "{body}");
    assert_eq!(body["errors"][0]["detail"], problem["errors"][0]["detail"], "{body}");
    // So is a filter nested past the JSON parser's depth, in either form;
    // the body's other members refused that way stay 422.
    let deep = format!("{}1{}", r#"{"a":"#.repeat(200), "}".repeat(200));
    let body = expect_problem(raw(format!(r#"{{"filter": {deep}}}"#)).await, 400, "invalid_filter").await;
    let pointer = body["errors"][0]["pointer"].as_str().unwrap();
    assert!(pointer.starts_with("/filter/a/a/"), "{body}");
    let resp = app.request(Method::GET, &docs_path("r")).query(&[("filter", &deep)]).send().await.unwrap();
    let problem = expect_problem(resp, 400, "invalid_filter").await;
    // The parameter's JSON is one level shallower than the body's.
    assert_eq!(problem["errors"][0]["pointer"], format!("/query{pointer}/a"), "{problem}");
    assert_eq!(problem["errors"][0]["detail"], body["errors"][0]["detail"], "{problem}");
    let problem = expect_problem(raw(r#"{"limit": 1, "limit": 2}"#.into()).await, 422, "validation_failed").await;
    assert_eq!(problem["errors"][0]["pointer"], "/limit", "{problem}");
    let problem = expect_problem(raw(format!(r#"{{"sort": {}}}"#, deep)).await, 422, "validation_failed").await;
    assert!(problem["errors"][0]["pointer"].as_str().unwrap().starts_with("/sort/a/"), "{problem}");
    // A cursor that is not one, or holds what no page ends at (NaN).
    ready_index(&app, "r", "a", &["a"]).await;
    let body = json!({"filter": {"a": {"$gt": 0}}, "after": "bm90IGEgY3Vyc29y"});
    expect_problem(query(&app, "r", &body).await, 422, "validation_failed").await;
    create(&app, "r", "two", &json!({"a": 2.5})).await;
    let body = json!({"filter": {"a": {"$gt": 0}}, "limit": 1});
    let next = expect(query(&app, "r", &body).await, 200).await["next"].as_str().expect("a next page").to_owned();
    let nan = {
        use base64::Engine as _;
        let engine = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        let mut cursor = txgate_store::Document::from_reader(engine.decode(&next).unwrap().as_slice()).unwrap();
        let mut key = cursor.get_array("k").unwrap().clone();
        key[0] = Bson::Double(f64::NAN);
        cursor.insert("k", key);
        let mut bytes = Vec::new();
        cursor.to_writer(&mut bytes).unwrap();
        engine.encode(bytes)
    };
    let body = json!({"filter": {"a": {"$gt": 0}}, "limit": 1, "after": nan});
    let problem = expect_problem(query(&app, "r", &body).await, 422, "validation_failed").await;
    assert_eq!(problem["errors"][0]["pointer"], "/after", "{problem}");
    // Unknown members of the body are refused.
    expect_problem(query(&app, "r", &json!({"filter": {}, "hint": "x"})).await, 422, "validation_failed").await;
}

async fn counts_come_from_index_entries(backend: Backend) {
    let Some(app) = TestApp::spawn(backend).await else { return };
    let mut statuses = BTreeMap::new();
    for i in 0..40 {
        let status = ["open", "paid", "void"][i % 3];
        create(&app, "c", &format!("c{i:02}"), &json!({"status": status, "amount": i})).await;
        *statuses.entry(status).or_insert(0) += 1;
    }
    ready_index(&app, "c", "s_a", &["status", "amount"]).await;
    let count = async |filter: Value| expect(count_request(&app, "c", Some(&filter.to_string())).await, 200).await;
    for (status, n) in &statuses {
        let body = count(json!({ "status": status })).await;
        assert_eq!(body["count"], *n, "{status}");
        assert!(body["position"].as_u64().unwrap() >= 40, "{body}");
    }
    assert_eq!(count(json!({"status": "open", "amount": {"$gte": 30}})).await["count"], 4);
    assert_eq!(count(json!({"status": {"$in": ["open", "paid"]}})).await["count"], 27);
    assert_eq!(count(json!({"status": {"$ne": "void"}})).await["count"], 27);
    expect(app.request(Method::DELETE, &format!("{}/c00", docs_path("c"))).send().await.unwrap(), 204).await;
    assert_eq!(count(json!({"status": "open"})).await["count"], 13);
    assert_eq!(expect(app.get("/v1/collections/c/count").await, 200).await["count"], 39);
    // A filter no index counts.
    let resp = app
        .request(Method::GET, "/v1/collections/c/count")
        .query(&[("filter", json!({"amount": 1}).to_string())])
        .send()
        .await
        .unwrap();
    let problem = expect_problem(resp, 400, "index_required").await;
    assert_eq!(problem["index"]["fields"], json!(["amount"]));
    // An empty collection counts none.
    assert_eq!(expect(app.get("/v1/collections/nothing/count").await, 200).await["count"], 0);
}

async fn a_transactions_writes_are_queried_once_it_answers(backend: Backend) {
    let Some(app) = TestApp::spawn(backend).await else { return };
    create(&app, "x", "a", &json!({"s": "old"})).await;
    create(&app, "x", "b", &json!({"s": "old"})).await;
    ready_index(&app, "x", "s", &["s"]).await;
    for round in 0..5 {
        let (from, to) = if round % 2 == 0 { ("old", "new") } else { ("new", "old") };
        let body = json!({"actions": [
            {"op": "update", "collection": "x", "id": "a", "set": {"s": to}},
            {"op": "update", "collection": "x", "id": "b", "set": {"s": to}},
            {"op": "insert", "collection": "x", "id": format!("n{round}"), "data": {"s": to}},
        ]});
        expect(app.post("/v1/transactions", &body).await, 200).await;
        // At once, without waiting for anything.
        let page = expect(query(&app, "x", &json!({"filter": {"s": to}})).await, 200).await;
        let ids: BTreeSet<&str> = page["items"].as_array().unwrap().iter().map(|i| i["id"].as_str().unwrap()).collect();
        assert!(
            ids.contains("a") && ids.contains("b") && ids.contains(format!("n{round}").as_str()),
            "round {round}: {ids:?}"
        );
        let page = expect(query(&app, "x", &json!({"filter": {"s": from}})).await, 200).await;
        let ids: BTreeSet<&str> = page["items"].as_array().unwrap().iter().map(|i| i["id"].as_str().unwrap()).collect();
        assert!(!ids.contains("a") && !ids.contains("b"), "round {round}: {ids:?}");
    }
}

/// One instance answers a transaction whose roll-forward is slow (each of
/// its document writes takes 400 ms); another instance, which never waits
/// for the first one's work, queries at once and sees the transaction's
/// writes, and its count agrees.
async fn another_instances_transaction_is_queried_once_it_answers(backend: Backend) {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering as AtomicOrdering};

    use crate::faulty::{Act, Op, rigged};
    use crate::support::{TestStore, test_config};

    let slow = Arc::new(AtomicBool::new(false));
    let rule = {
        let slow = Arc::clone(&slow);
        move |op: &Op| {
            let write = matches!(op.kind, "replace" | "update");
            if write && op.coll == "y" && slow.load(AtomicOrdering::SeqCst) {
                Act::Delay(Duration::from_millis(400))
            } else {
                Act::Pass
            }
        }
    };
    let Some(ts) = TestStore::new(backend).await else { return };
    let (config, raw) = (test_config(ts.config.clone()), Arc::clone(&ts.store));
    let writer = TestApp::on_store(config.clone(), rigged(Arc::clone(&raw), rule), Some(ts)).await;
    let reader = TestApp::on_store(config, raw, None).await;
    for id in ["a", "b"] {
        create(&writer, "y", id, &json!({"s": "old"})).await;
    }
    ready_index(&reader, "y", "s", &["s"]).await;
    writer.settled().await;
    slow.store(true, AtomicOrdering::SeqCst);
    for round in 0..3 {
        let (from, to) = if round % 2 == 0 { ("old", "new") } else { ("new", "old") };
        let body = json!({"actions": [
            {"op": "update", "collection": "y", "id": "a", "set": {"s": to}},
            {"op": "insert", "collection": "y", "id": format!("n{round}"), "data": {"s": to}},
        ]});
        expect(writer.post("/v1/transactions", &body).await, 200).await;
        let page = expect(query(&reader, "y", &json!({"filter": {"s": to}})).await, 200).await;
        let ids: BTreeSet<&str> = page["items"].as_array().unwrap().iter().map(|i| i["id"].as_str().unwrap()).collect();
        assert!(ids.contains("a") && ids.contains(format!("n{round}").as_str()), "round {round}: {ids:?}");
        let page = expect(query(&reader, "y", &json!({"filter": {"s": from}})).await, 200).await;
        let ids: BTreeSet<&str> = page["items"].as_array().unwrap().iter().map(|i| i["id"].as_str().unwrap()).collect();
        assert!(!ids.contains("a"), "round {round}: {ids:?}");
        // a and the inserts of rounds of the same parity; b is "old".
        let want = [2, 3, 3][round];
        let filter = json!({"s": to}).to_string();
        let count = reader.request(Method::GET, "/v1/collections/y/count").query(&[("filter", &filter)]);
        let count = expect(count.send().await.unwrap(), 200).await;
        assert_eq!(count["count"].as_u64().unwrap() as usize, want, "round {round}");
        writer.settled().await;
    }
    slow.store(false, AtomicOrdering::SeqCst);
}

/// A page stops once its documents hold 4 MiB as stored (the one that
/// reaches it is its last), with a cursor to the rest, whatever its
/// `limit`: in id order and along an index, each document exactly once.
async fn pages_of_large_documents_stop_at_their_bytes(backend: Backend) {
    let Some(app) = TestApp::spawn(backend).await else { return };
    // 12 documents of 900 KB: 4 MiB is reached by a page's fifth.
    let pad = "x".repeat(900_000);
    for i in 0..12 {
        create(&app, "big", &format!("b{i:02}"), &json!({"status": "open", "n": i, "pad": pad})).await;
    }
    ready_index(&app, "big", "s_n", &["status", "n"]).await;
    let want: Vec<String> = (0..12).map(|i| format!("b{i:02}")).collect();
    // In id order (GET) and along the index (POST /query), limit 100.
    for along_index in [false, true] {
        let (mut seen, mut sizes, mut after) = (Vec::new(), Vec::new(), None::<String>);
        loop {
            let page = if along_index {
                let mut body = json!({"filter": {"status": "open"}, "sort": ["n"], "limit": 100, "fields": ["n"]});
                if let Some(a) = &after {
                    body["after"] = json!(a);
                }
                expect(query(&app, "big", &body).await, 200).await
            } else {
                let mut params = vec![("limit", "100".to_owned()), ("fields", "n".to_owned())];
                if let Some(a) = &after {
                    params.push(("after", a.clone()));
                }
                let resp = app.request(Method::GET, &docs_path("big")).query(&params).send().await.unwrap();
                expect(resp, 200).await
            };
            let items = page["items"].as_array().unwrap();
            sizes.push(items.len());
            seen.extend(items.iter().map(|d| d["id"].as_str().unwrap().to_owned()));
            match page["next"].as_str() {
                Some(next) => after = Some(next.to_owned()),
                None => break,
            }
            assert!(sizes.len() < 10, "pages never end: {sizes:?}");
        }
        assert_eq!(seen, want, "along the index: {along_index}");
        assert_eq!(&sizes[..2], &[5, 5], "along the index: {along_index}: pages {sizes:?}");
    }
}

/// A cursor holds its query: passed again with the same filter (its
/// members written in another order, its numbers as decimals) and sort it
/// goes on; with another
/// filter, another sort, once another index serves the query, or on
/// another collection, it is refused (422 at `/after`) rather than read as
/// a position in another order.
async fn a_cursor_goes_on_only_with_its_own_query(backend: Backend) {
    let Some(app) = TestApp::spawn(backend).await else { return };
    for i in 0..12 {
        let status = ["open", "paid"][i % 2];
        create(&app, "k", &format!("k{i:02}"), &json!({"status": status, "amount": i, "day": i % 5})).await;
    }
    ready_index(&app, "k", "by_amount", &["status", "-amount"]).await;
    ready_index(&app, "k", "by_day", &["status", "day"]).await;
    let filter = json!({"status": "open", "amount": {"$gte": 1, "$lt": 11}});
    let first = expect(query(&app, "k", &json!({"filter": filter, "sort": ["-amount"], "limit": 2})).await, 200).await;
    let next = first["next"].as_str().expect("a next page").to_owned();
    let ids = |page: &Value| page["items"].as_array().unwrap().iter().map(|d| d["id"].clone()).collect::<Vec<_>>();
    assert_eq!(ids(&first), [json!("k10"), json!("k08")]);
    // The same query, its members in another order, by GET: it goes on.
    let same = json!({"amount": {"$lt": 11, "$gte": 1}, "status": {"$eq": "open"}});
    let params =
        [("filter", same.to_string()), ("sort", "-amount".into()), ("limit", "2".into()), ("after", next.clone())];
    let second = expect(app.request(Method::GET, &docs_path("k")).query(&params).send().await.unwrap(), 200).await;
    assert_eq!(ids(&second), [json!("k06"), json!("k04")]);
    // Its numbers written as decimals (what a client whose numbers are
    // all doubles sends): the same query, it goes on.
    let decimals = json!({"status": "open", "amount": {"$gte": 1.0, "$lt": 11e0}});
    let body = json!({"filter": decimals, "sort": ["-amount"], "limit": 2, "after": next});
    assert_eq!(ids(&expect(query(&app, "k", &body).await, 200).await), [json!("k06"), json!("k04")]);
    // Another bound, another status, another direction: refused.
    for (filter, sort) in [
        (json!({"status": "open", "amount": {"$gte": 1, "$lt": 9}}), "-amount"),
        (json!({"status": "paid", "amount": {"$gte": 1, "$lt": 11}}), "-amount"),
        (json!({"status": "open", "amount": {"$gte": 1, "$lt": 11}}), "amount"),
    ] {
        let body = json!({"filter": filter, "sort": [sort], "limit": 2, "after": next});
        let problem = expect_problem(query(&app, "k", &body).await, 422, "validation_failed").await;
        assert_eq!(problem["errors"][0]["pointer"], "/after", "{problem}");
        assert!(problem["detail"].as_str().unwrap().contains("another query"), "{problem}");
    }
    // Same length of key, another index's order: refused too.
    let body = json!({"filter": {"status": "open"}, "sort": ["day"], "limit": 2, "after": next});
    expect_problem(query(&app, "k", &body).await, 422, "validation_failed").await;
    // An id-order cursor along an index, and the other way: refused.
    let listed = expect(app.get(&format!("{}?limit=2", docs_path("k"))).await, 200).await;
    let by_id = listed["next"].as_str().expect("a next page");
    let body = json!({"filter": filter, "sort": ["-amount"], "limit": 2, "after": by_id});
    expect_problem(query(&app, "k", &body).await, 422, "validation_failed").await;
    let resp = app.request(Method::GET, &docs_path("k")).query(&[("after", next.as_str())]).send().await.unwrap();
    expect_problem(resp, 422, "validation_failed").await;
    // The same query on another collection with the same index, and an
    // id-order cursor there: refused too, not read as a position there.
    for i in 0..4 {
        create(&app, "k2", &format!("k{i:02}"), &json!({"status": "open", "amount": i, "day": i})).await;
    }
    ready_index(&app, "k2", "by_amount", &["status", "-amount"]).await;
    let body = json!({"filter": filter, "sort": ["-amount"], "limit": 2, "after": next});
    let problem = expect_problem(query(&app, "k2", &body).await, 422, "validation_failed").await;
    assert!(problem["detail"].as_str().unwrap().contains("another query"), "{problem}");
    let resp = app.request(Method::GET, &docs_path("k2")).query(&[("after", by_id)]).send().await.unwrap();
    let problem = expect_problem(resp, 422, "validation_failed").await;
    assert!(problem["detail"].as_str().unwrap().contains("another query"), "{problem}");
    // Each still goes on in its own collection.
    let body = json!({"filter": filter, "sort": ["-amount"], "limit": 2, "after": next});
    assert_eq!(ids(&expect(query(&app, "k", &body).await, 200).await), [json!("k06"), json!("k04")]);
    let resp = app.request(Method::GET, &docs_path("k")).query(&[("after", by_id), ("limit", "2")]).send().await;
    assert_eq!(ids(&expect(resp.unwrap(), 200).await), [json!("k02"), json!("k03")]);
    // Earlier releases' cursors, bound to no query (format 1) or to none
    // of one collection (format 2): refused, whatever they name.
    let old = |d: txgate_store::Document| {
        use base64::Engine as _;
        let mut bytes = Vec::new();
        d.to_writer(&mut bytes).unwrap();
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
    };
    use txgate_store::doc;
    for cursor in [old(doc! {"f": 1, "k": ["k03"]}), old(doc! {"f": 2, "k": ["open", 6_i64, "k06"], "q": 8_i64})] {
        let resp = app.request(Method::GET, &docs_path("k")).query(&[("after", cursor.as_str())]).send().await.unwrap();
        let problem = expect_problem(resp, 422, "validation_failed").await;
        assert!(problem["detail"].as_str().unwrap().contains("earlier release"), "{problem}");
        let body = json!({"filter": filter, "sort": ["-amount"], "limit": 2, "after": cursor});
        let problem = expect_problem(query(&app, "k", &body).await, 422, "validation_failed").await;
        assert_eq!(problem["errors"][0]["pointer"], "/after", "{problem}");
    }
}

/// A query (or count) whose index is declared but not ready is still
/// `index_required`, and says which index it waits for: `declared` holds
/// its name and state, `building` with its progress, or `failed` with the
/// reason; `index` is that index. Once ready, the query is served.
async fn an_index_declared_but_not_ready_is_named_in_index_required(backend: Backend) {
    let Some(app) = TestApp::spawn(backend).await else { return };
    create(&app, "w", "one", &json!({"status": "open", "tags": "x"})).await;
    create(&app, "w", "two", &json!({"status": "paid", "tags": ["a", "b"]})).await;
    // Declared: a build starts only seconds later, so it is building now.
    let declared = put_index(&app, "w", "by_status", &["status"]).await;
    assert_eq!(declared["state"], "building", "{declared}");
    let body = json!({"filter": {"status": "open"}});
    let problem = expect_problem(query(&app, "w", &body).await, 400, "index_required").await;
    assert_eq!(problem["declared"]["name"], "by_status", "{problem}");
    assert_eq!(problem["declared"]["state"], "building", "{problem}");
    assert_eq!(problem["index"], json!({"name": "by_status", "fields": ["status"], "unique": false}), "{problem}");
    assert!(problem["detail"].as_str().unwrap().contains("by_status"), "{problem}");
    let count = app.request(Method::GET, "/v1/collections/w/count").query(&[("filter", body["filter"].to_string())]);
    let problem = expect_problem(count.send().await.unwrap(), 400, "index_required").await;
    assert_eq!(problem["declared"]["state"], "building", "{problem}");
    // So does a filtered event stream.
    let events = app
        .request(Method::GET, "/v1/events")
        .query(&[("collections", "w".to_owned()), ("filter", body["filter"].to_string())]);
    let problem = expect_problem(events.send().await.unwrap(), 400, "index_required").await;
    assert_eq!(problem["declared"]["name"], "by_status", "{problem}");
    assert_eq!(problem["declared"]["state"], "building", "{problem}");
    assert_eq!(problem["index"]["name"], "by_status", "{problem}");
    // Another query names no declared index.
    let other = json!({"filter": {"status": "open"}, "sort": ["tags"]});
    let problem = expect_problem(query(&app, "w", &other).await, 400, "index_required").await;
    assert!(problem.get("declared").is_none(), "{problem}");
    // A build that failed: its reason.
    put_index(&app, "w", "by_tags", &["tags"]).await;
    assert_eq!(settled_index(&app, "w", "by_tags").await["state"], "failed");
    let problem =
        expect_problem(query(&app, "w", &json!({"filter": {"tags": "x"}})).await, 400, "index_required").await;
    assert_eq!(problem["declared"]["name"], "by_tags", "{problem}");
    assert_eq!(problem["declared"]["state"], "failed", "{problem}");
    assert!(problem["declared"]["reason"].as_str().unwrap().contains("array"), "{problem}");
    // Ready: served.
    assert_eq!(settled_index(&app, "w", "by_status").await["state"], "ready");
    let page = expect(query(&app, "w", &body).await, 200).await;
    assert_eq!(page["items"][0]["id"], "one");
}

/// While a transaction holds documents (staged, its commit point held
/// back), pages show them as committed: the held document with its data
/// from before, matched by that data, and the staged insert not at all;
/// once it answers, its writes.
async fn a_document_a_transaction_holds_is_queried_as_committed(backend: Backend) {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering as AtomicOrdering};

    use crate::faulty::{Act, Gate, Op, rigged_app};

    let (armed, gate) = (Arc::new(AtomicBool::new(false)), Gate::new());
    let rule = {
        let (armed, gate) = (Arc::clone(&armed), Arc::clone(&gate));
        move |op: &Op| {
            let commit = op.coll == "_txns"
                && op.kind == "update"
                && op.set.is_some_and(|set| set.get_str("status") == Ok("committed"));
            if commit && armed.swap(false, AtomicOrdering::SeqCst) {
                return Act::Hold(Arc::clone(&gate));
            }
            Act::Pass
        }
    };
    let Some(app) = rigged_app(backend, |_| {}, rule).await else { return };
    let app = Arc::new(app);
    create(&app, "h", "a", &json!({"s": "old", "n": 1})).await;
    create(&app, "h", "b", &json!({"s": "old", "n": 2})).await;
    ready_index(&app, "h", "s", &["s"]).await;
    armed.store(true, AtomicOrdering::SeqCst);
    let txn = {
        let app = Arc::clone(&app);
        tokio::spawn(async move {
            let body = json!({"actions": [
                {"op": "update", "collection": "h", "id": "a", "set": {"s": "new", "n": 10}},
                {"op": "insert", "collection": "h", "id": "c", "data": {"s": "new"}},
            ]});
            expect(app.post("/v1/transactions", &body).await, 200).await
        })
    };
    tokio::time::timeout(WAIT, gate.reached()).await.expect("the transaction reaches its commit point");
    // Held, not committed: as before.
    let page = expect(query(&app, "h", &json!({"filter": {"s": "old"}})).await, 200).await;
    let items = page["items"].as_array().unwrap();
    let ids: Vec<&str> = items.iter().map(|i| i["id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["a", "b"], "{page}");
    assert_eq!(items[0]["data"], json!({"s": "old", "n": 1}), "{page}");
    assert_eq!(items[0]["version"], 1, "{page}");
    let page = expect(query(&app, "h", &json!({"filter": {"s": "new"}})).await, 200).await;
    assert_eq!(page["items"], json!([]), "{page}");
    // Counts too: the staged insert's entry (of empty data) is not counted
    // by a count its empty data would match.
    let count = async |filter: Option<Value>| {
        let filter = filter.map(|f| f.to_string());
        expect(count_request(&app, "h", filter.as_deref()).await, 200).await["count"].clone()
    };
    assert_eq!(count(None).await, 2);
    assert_eq!(count(Some(json!({"s": {"$ne": "other"}}))).await, 2);
    assert_eq!(count(Some(json!({"s": "old"}))).await, 2);
    assert!(!txn.is_finished(), "the transaction answered before the pages were read");
    gate.open();
    txn.await.unwrap();
    let page = expect(query(&app, "h", &json!({"filter": {"s": "new"}})).await, 200).await;
    let items = page["items"].as_array().unwrap();
    let ids: Vec<&str> = items.iter().map(|i| i["id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["a", "c"], "{page}");
    assert_eq!(items[0]["data"], json!({"s": "new", "n": 10}), "{page}");
    assert_eq!(items[0]["version"], 2, "{page}");
    assert_eq!(count(None).await, 3);
    assert_eq!(count(Some(json!({"s": {"$ne": "other"}}))).await, 3);
}

/// A number is kept as sent, to the last bit of its double: read back, it
/// is written the same, and an equality matches it and not the double
/// next to it (each pair below is two adjacent doubles).
async fn numbers_are_kept_and_matched_exactly(backend: Backend) {
    let Some(app) = TestApp::spawn(backend).await else { return };
    let pairs = [
        ("207840.07719238894", "207840.07719238897"),
        ("46923.233761902164", "46923.23376190216"),
        ("0.30000000000000004", "0.3"),
    ];
    for (i, (a, b)) in pairs.iter().enumerate() {
        for (id, text) in [(format!("a{i}"), a), (format!("b{i}"), b)] {
            let body = format!(r#"{{"_id": "{id}", "v": {text}}}"#);
            let resp = app
                .request(Method::POST, &docs_path("n"))
                .header("content-type", "application/json")
                .body(body)
                .send()
                .await
                .unwrap();
            expect(resp, 201).await;
            let read = app.get(&format!("{}/{id}", docs_path("n"))).await;
            let text_read = read.text().await.unwrap();
            assert!(text_read.contains(&format!(r#""v":{text}"#)), "{text} read back as {text_read}");
        }
    }
    ready_index(&app, "n", "v", &["v"]).await;
    for (i, (a, b)) in pairs.iter().enumerate() {
        for (id, text) in [(format!("a{i}"), a), (format!("b{i}"), b)] {
            let filter = format!(r#"{{"v": {text}}}"#);
            let resp =
                app.request(Method::GET, &docs_path("n")).query(&[("filter", filter.as_str())]).send().await.unwrap();
            let page = expect(resp, 200).await;
            let ids: Vec<&str> = page["items"].as_array().unwrap().iter().map(|i| i["id"].as_str().unwrap()).collect();
            assert_eq!(ids, [id.as_str()], "{filter}");
            assert_eq!(expect(count_request(&app, "n", Some(&filter)).await, 200).await["count"], 1, "{filter}");
        }
    }
}

//! Batch reads (`POST /v1/reads`), on both stores: each member answered as
//! a single read would, in the order asked; and, while transactions commit
//! two members at once (and create and delete a third) and single writes
//! change a fourth, every answer holds all of them as of one point: never
//! one from before a transaction and one from after it, and its `position`
//! exact (every change at or before it shown, none after it), checked
//! against the whole change-event log once the writers stop. The same runs
//! again with every document write delayed and one collection's reads
//! slower than the others', which widens the windows between a
//! transaction's staging, its commit, its events and its roll-forward, and
//! between the reads of one batch.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::Duration;

use reqwest::Method;
use serde_json::{Value, json};

use crate::faulty::{Act, rigged_app};
use crate::support::{Backend, TestApp, all_events, expect, expect_problem};

crate::on_both_backends!(
    a_batch_read_answers_each_member_as_a_single_read_would,
    batch_reads_racing_transactions_hold_one_point,
    batch_reads_hold_one_point_while_every_write_is_slow,
    a_batch_read_is_bounded_by_its_bytes,
);

const READS: &str = "/v1/reads";

fn members(list: &[(&str, &str)]) -> Value {
    json!({"documents": list.iter().map(|(c, i)| json!({"collection": c, "id": i})).collect::<Vec<_>>()})
}

async fn a_batch_read_answers_each_member_as_a_single_read_would(backend: Backend) {
    let Some(app) = TestApp::spawn(backend).await else { return };
    expect(app.post("/v1/collections/orders/documents", &json!({"_id": "o1", "total": 5})).await, 201).await;
    expect(app.post("/v1/collections/people/documents", &json!({"_id": "p1", "name": "Ann"})).await, 201).await;
    expect(app.request(Method::DELETE, "/v1/collections/people/documents/p1").send().await.unwrap(), 204).await;
    let out = expect(
        app.post(READS, &members(&[("orders", "o1"), ("people", "p1"), ("people", "nobody"), ("orders", "o1")])).await,
        200,
    )
    .await;
    let docs = out["documents"].as_array().unwrap();
    assert_eq!(docs.len(), 4);
    let single = expect(app.get("/v1/collections/orders/documents/o1").await, 200).await;
    assert_eq!((docs[0]["status"].as_u64(), &docs[0]["document"]), (Some(200), &single));
    assert_eq!(docs[3]["document"], single, "a member named twice is answered twice");
    assert_eq!((docs[1]["status"].as_u64(), docs[1]["problem"]["code"].as_str()), (Some(410), Some("deleted")));
    assert_eq!(docs[1]["problem"]["version"], 2);
    assert_eq!((docs[2]["status"].as_u64(), docs[2]["problem"]["code"].as_str()), (Some(404), Some("not_found")));
    assert_eq!((docs[2]["collection"].as_str(), docs[2]["id"].as_str()), (Some("people"), Some("nobody")));
    // Three changes are in the log: the position is the last of them.
    let (events, _) = all_events(&app, 0, "").await;
    assert_eq!(out["position"], events.last().unwrap()["seq"], "{events:?}");
    // Refused before anything is read.
    expect_problem(app.post(READS, &json!({"documents": []})).await, 422, "validation_failed").await;
    let many: Vec<(&str, &str)> = vec![("orders", "o1"); 101];
    expect_problem(app.post(READS, &members(&many)).await, 422, "validation_failed").await;
    let bad =
        expect_problem(app.post(READS, &members(&[("orders", "o1"), ("_txns", "x")])).await, 422, "validation_failed")
            .await;
    assert_eq!(bad["errors"][0]["pointer"], "/documents/1/collection", "{bad}");
    expect_problem(
        app.post(READS, &json!({"documents": [{"collection": "orders", "id": "o1", "x": 1}]})).await,
        422,
        "validation_failed",
    )
    .await;
    expect_problem(app.post(READS, &json!({"documents": [{"collection": "orders"}]})).await, 422, "validation_failed")
        .await;
}

/// A batch read whose members hold more than 16 MiB as stored is refused
/// whole (its read stops once past them), so nothing half-read is
/// answered; one within them is answered, however its members spread
/// over collections.
async fn a_batch_read_is_bounded_by_its_bytes(backend: Backend) {
    let Some(app) = TestApp::spawn(backend).await else { return };
    // 20 documents of 900 KB, the last in a collection of its own: 18 hold
    // 16.2 MB, 19 pass 16 MiB (16.8 MB).
    let pad = "x".repeat(900_000);
    let mut all = Vec::new();
    for i in 0..20 {
        let coll = if i < 19 { "big" } else { "other" };
        let id = format!("b{i:02}");
        let body = json!({"_id": id, "pad": pad});
        expect(app.post(&format!("/v1/collections/{coll}/documents"), &body).await, 201).await;
        all.push((coll, id));
    }
    // A document whose change event is still on its way holds it too (on
    // MongoDB, its outbox): the sizes below are those of settled ones.
    app.settled().await;
    let named = |n: usize| members(&all[..n].iter().map(|(c, i)| (*c, i.as_str())).collect::<Vec<_>>());
    let out = expect(app.post(READS, &named(18)).await, 200).await;
    let docs = out["documents"].as_array().unwrap();
    assert_eq!(docs.len(), 18);
    assert!(docs.iter().all(|d| d["status"] == 200 && d["document"]["data"]["pad"].as_str().unwrap().len() == 900_000));
    for n in [19, 20] {
        let refused = expect_problem(app.post(READS, &named(n)).await, 422, "validation_failed").await;
        assert_eq!(refused["errors"][0]["pointer"], "/documents", "{refused}");
        assert!(refused["errors"][0]["detail"].as_str().unwrap().contains("16 MiB"), "{refused}");
    }
    // Over collections alike: 18 of them with a small one, in three
    // collections, are answered; one more is not.
    expect(app.post("/v1/collections/small/documents", &json!({"_id": "s", "n": 1})).await, 201).await;
    app.settled().await;
    let mut mixed = all[..17].iter().map(|(c, i)| (*c, i.as_str())).collect::<Vec<_>>();
    mixed.extend([("other", "b19"), ("small", "s")]);
    let out = expect(app.post(READS, &members(&mixed)).await, 200).await;
    assert!(out["documents"].as_array().unwrap().iter().all(|d| d["status"] == 200), "{}", out["position"]);
    mixed.insert(0, ("big", "b17"));
    expect_problem(app.post(READS, &members(&mixed)).await, 422, "validation_failed").await;
    // A document named several times counts once for each time, as the
    // answer holds it: 18 times is answered, 19 times is not, 100 times
    // neither.
    let out = expect(app.post(READS, &members(&[("big", "b00"); 18])).await, 200).await;
    assert_eq!(out["documents"].as_array().unwrap().len(), 18);
    for n in [19, 100] {
        let refused =
            expect_problem(app.post(READS, &members(&vec![("big", "b00"); n])).await, 422, "validation_failed").await;
        assert_eq!(refused["errors"][0]["pointer"], "/documents", "{n}: {refused}");
    }
    let mut twice = all[..10].iter().map(|(c, i)| (*c, i.as_str())).collect::<Vec<_>>();
    twice.extend(all[..9].iter().map(|(c, i)| (*c, i.as_str())));
    expect_problem(app.post(READS, &members(&twice)).await, 422, "validation_failed").await;
    twice.pop();
    expect(app.post(READS, &members(&twice)).await, 200).await;
}

/// One member of an answer: its version (0: never existed) and `n`.
fn seen(entry: &Value) -> (i64, Option<i64>) {
    match entry["status"].as_u64() {
        Some(200) => (entry["document"]["version"].as_i64().unwrap(), entry["document"]["data"]["n"].as_i64()),
        Some(410) => (entry["problem"]["version"].as_i64().unwrap(), None),
        Some(404) => (0, None),
        other => panic!("unexpected member status {other:?}: {entry}"),
    }
}

const MEMBERS: [(&str, &str); 4] = [("w", "a"), ("v", "b"), ("w", "d"), ("s", "e")];

/// Transactions set `n` of `a` and `b` (in two collections, which a batch
/// read reads side by side) to the round and create `d` in odd
/// rounds, delete it in even ones; single writes bump `e`. Readers read
/// all four at once meanwhile. Every answer holds `a.n == b.n`, `d` live
/// exactly when that is odd, and its position exact.
///
/// Where `one_read` (the embedded store, whose batch reads read one
/// snapshot), no read is ever refused as `locked`.
async fn race(app: &TestApp, rounds: i64, one_read: bool) {
    expect(app.post("/v1/collections/w/documents", &json!({"_id": "a", "n": 0})).await, 201).await;
    expect(app.post("/v1/collections/v/documents", &json!({"_id": "b", "n": 0})).await, 201).await;
    expect(app.post("/v1/collections/s/documents", &json!({"_id": "e", "n": 0})).await, 201).await;
    let stop = AtomicBool::new(false);
    let answers = std::sync::Mutex::new(Vec::<Value>::new());
    let reader = async || {
        while !stop.load(Ordering::SeqCst) {
            let resp = app.post(READS, &members(&MEMBERS)).await;
            if resp.status() == 409 {
                assert!(!one_read, "a batch read of one snapshot was refused: {}", resp.text().await.unwrap());
                // Kept changing for longer than the lock wait.
                let p = expect_problem(resp, 409, "locked").await;
                assert!(p["collection"].is_string(), "{p}");
                continue;
            }
            let answer = expect(resp, 200).await;
            answers.lock().unwrap().push(answer);
        }
    };
    let singles = async {
        while !stop.load(Ordering::SeqCst) {
            let resp = app.send_json(Method::PATCH, "/v1/collections/s/documents/e", &json!({"inc": {"n": 1}})).await;
            assert!(resp.status() == 200 || resp.status() == 409, "PATCH e: {}", resp.status());
        }
    };
    // At least `rounds` transactions, and on until the readers have had ten
    // answers (however fast the writes are on this machine), within a bound.
    let written = AtomicI64::new(0);
    let writer = async {
        for k in 1..=rounds * 20 {
            if k > rounds && answers.lock().unwrap().len() >= 10 {
                break;
            }
            let third = if k % 2 == 1 {
                json!({"op": "insert", "collection": "w", "id": "d", "data": {"n": k}})
            } else {
                json!({"op": "delete", "collection": "w", "id": "d"})
            };
            let body = json!({"actions": [
                {"op": "update", "collection": "w", "id": "a", "set": {"n": k}},
                {"op": "update", "collection": "v", "id": "b", "set": {"n": k}},
                third,
            ]});
            let out = expect(app.post("/v1/transactions", &body).await, 200).await;
            assert_eq!(out["status"], "committed");
            written.store(k, Ordering::SeqCst);
        }
        stop.store(true, Ordering::SeqCst);
    };
    tokio::join!(reader(), reader(), singles, writer);
    let rounds = written.load(Ordering::SeqCst);
    let answers = std::mem::take(&mut *answers.lock().unwrap());
    assert!(answers.len() >= 10, "only {} batch reads answered", answers.len());

    // Each document's versions by position, from the whole log.
    let (events, _) = all_events(app, 0, "").await;
    let mut history: HashMap<(String, String), Vec<(u64, i64)>> = HashMap::new();
    for e in &events {
        if let (Some(c), Some(d), Some(v)) = (e["collection"].as_str(), e["document"].as_str(), e["version"].as_i64()) {
            history.entry((c.to_owned(), d.to_owned())).or_default().push((e["seq"].as_u64().unwrap(), v));
        }
    }
    let mut moved = 0;
    for answer in &answers {
        let position = answer["position"].as_u64().unwrap();
        let docs = answer["documents"].as_array().unwrap();
        let got: Vec<(i64, Option<i64>)> = docs.iter().map(seen).collect();
        let (a, b, d) = (got[0].1.unwrap(), got[1].1.unwrap(), got[2]);
        assert_eq!(a, b, "a and b from different transactions: {answer}");
        assert_eq!(d.1.is_some(), a % 2 == 1, "d from another transaction than a: {answer}");
        if let Some(n) = d.1 {
            assert_eq!(n, a, "{answer}");
        }
        for ((c, id), (version, _)) in MEMBERS.iter().zip(&got) {
            let logged = history
                .get(&(c.to_string(), id.to_string()))
                .and_then(|h| h.iter().filter(|(seq, _)| *seq <= position).map(|(_, v)| *v).max())
                .unwrap_or(0);
            assert_eq!(
                logged, *version,
                "{c}/{id}: the log at position {position} says version {logged}, the answer shows {version}: {answer}"
            );
        }
        if a > 0 && a < rounds {
            moved += 1;
        }
    }
    assert!(moved > 0, "no read fell between the first and last transaction");
}

async fn batch_reads_racing_transactions_hold_one_point(backend: Backend) {
    let Some(app) = TestApp::spawn(backend).await else { return };
    race(&app, 40, matches!(backend, Backend::Embedded)).await;
}

async fn batch_reads_hold_one_point_while_every_write_is_slow(backend: Backend) {
    // Writes slow, and reads of one collection slower than the other's.
    let rule = |op: &crate::faulty::Op| {
        let write = matches!(op.kind, "insert" | "replace" | "update" | "delete");
        let user = matches!(op.coll, "w" | "v" | "s");
        match op.kind {
            _ if write && user => Act::Delay(Duration::from_millis(15)),
            "get" | "get_many" if op.coll == "v" => Act::Delay(Duration::from_millis(60)),
            _ => Act::Pass,
        }
    };
    let Some(app) = rigged_app(backend, |_| {}, rule).await else { return };
    race(&app, 25, false).await;
}

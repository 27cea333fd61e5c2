//! The live view, on both stores: a client lists a filtered, sorted query
//! page by page while writers run (transactions and single writes, some
//! moving documents into and out of the filter, deletes and re-creations),
//! then follows the filtered change events from the first page's
//! position; once the writers stop, its view equals a fresh query, in
//! several random runs. The same again with every document write slowed
//! and the view read through a second instance, whose pages then meet
//! transactions in the window between their events' append and their
//! roll-forward.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use reqwest::Method;
use serde_json::{Value, json};

use crate::faulty::{Act, rigged_app};
use crate::queries::ready_index;
use crate::support::{Backend, SseStream, TestApp, all_events, events_page, expect};

crate::on_both_backends!(
    a_live_view_equals_a_fresh_query,
    a_live_view_holds_while_writes_are_slow,
    a_page_read_while_a_transaction_rolls_forward_hands_over_exactly,
    a_client_that_hangs_up_mid_filtered_stream_frees_its_slot_and_resumes_exactly,
    a_page_reflects_exactly_the_changes_up_to_its_position,
);

/// Documents per run.
const DOCS: usize = 30;
/// The filter the view follows, and its order.
fn filter() -> Value {
    json!({"g": 1})
}

fn seed() -> u64 {
    std::env::var("TXGATE_TEST_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(rand::random)
}

/// A document's data: group `g` (the filter holds group 1) and `v`.
fn data(rng: &mut StdRng) -> Value {
    json!({"g": rng.random_range(0..3), "v": rng.random_range(0..50)})
}

/// Every page of the view's query: the documents by id (version, data),
/// in order, and the first page's position.
async fn list(
    app: &TestApp,
    coll: &str,
    limit: usize,
    mut between: impl AsyncFnMut(),
) -> (Vec<(String, i64, Value)>, u64) {
    let mut out = Vec::new();
    let mut after: Option<String> = None;
    let mut first = None;
    loop {
        let mut body = json!({"filter": filter(), "sort": ["-v"], "limit": limit});
        if let Some(a) = &after {
            body["after"] = json!(a);
        }
        let page = expect(app.post(&format!("/v1/collections/{coll}/query"), &body).await, 200).await;
        first.get_or_insert(page["position"].as_u64().unwrap());
        for item in page["items"].as_array().unwrap() {
            out.push((
                item["id"].as_str().unwrap().to_owned(),
                item["version"].as_i64().unwrap(),
                item["data"].clone(),
            ));
        }
        match page["next"].as_str() {
            Some(next) => after = Some(next.to_owned()),
            None => return (out, first.unwrap()),
        }
        between().await;
    }
}

/// Random writes to `coll` until `stop`: single patches, transactions of
/// two or three documents, deletes and re-creations.
async fn write(app: &TestApp, coll: &str, rng: &mut StdRng, stop: &AtomicBool) -> usize {
    paced_write(app, coll, rng, stop, Duration::ZERO).await
}

/// [`write`], pausing `pause` after each write.
async fn paced_write(app: &TestApp, coll: &str, rng: &mut StdRng, stop: &AtomicBool, pause: Duration) -> usize {
    let docs = format!("/v1/collections/{coll}/documents");
    let mut n = 0;
    while !stop.load(Ordering::SeqCst) {
        let id = format!("d{:02}", rng.random_range(0..DOCS));
        let resp = match rng.random_range(0..10) {
            0..4 => app.send_json(Method::PATCH, &format!("{docs}/{id}"), &json!({"set": data(rng)})).await,
            4..7 => {
                let mut ids = BTreeSet::new();
                while ids.len() < rng.random_range(2..=3) {
                    ids.insert(format!("d{:02}", rng.random_range(0..DOCS)));
                }
                let actions: Vec<Value> = ids
                    .iter()
                    .map(|id| json!({"op": "update", "collection": coll, "id": id, "set": data(rng)}))
                    .collect();
                app.post("/v1/transactions", &json!({"actions": actions})).await
            }
            7 => app.request(Method::DELETE, &format!("{docs}/{id}")).send().await.unwrap(),
            _ => {
                let mut body = data(rng);
                body["_id"] = json!(id);
                app.post(&docs, &body).await
            }
        };
        // Conflicts, missing and deleted documents are part of the game.
        let status = resp.status().as_u16();
        assert!(
            matches!(status, 200 | 201 | 204 | 404 | 409 | 410),
            "a write answered {status}: {}",
            resp.text().await.unwrap()
        );
        n += 1;
        tokio::time::sleep(pause).await;
    }
    n
}

/// One run on collection `coll`: list (through `app`) while writing
/// (through `writer`), follow the filtered events from the first page's
/// position, compare with a fresh query.
async fn run(app: &TestApp, writer: &TestApp, coll: &str, seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    for i in 0..DOCS {
        let mut body = data(&mut rng);
        body["_id"] = json!(format!("d{i:02}"));
        expect(app.post(&format!("/v1/collections/{coll}/documents"), &body).await, 201).await;
    }
    ready_index(app, coll, "g_v", &["g", "-v"]).await;
    let stop = AtomicBool::new(false);
    let mut writer_rng = StdRng::seed_from_u64(seed ^ 0x5eed);
    let lister = async {
        let pause = async || tokio::time::sleep(Duration::from_millis(15)).await;
        let listed = list(app, coll, 2, pause).await;
        stop.store(true, Ordering::SeqCst);
        listed
    };
    let ((listed, position), writes) = tokio::join!(lister, write(writer, coll, &mut writer_rng, &stop));
    assert!(writes > 0, "no write ran while the view was listed");

    // The view: what the pages showed, then every filtered event after the
    // first page's position, each applied when it is newer than what the
    // view holds.
    let mut view: BTreeMap<String, (i64, Value)> = BTreeMap::new();
    for (id, version, data) in listed {
        view.insert(id, (version, data));
    }
    writer.settled().await;
    app.settled().await;
    let mut after = position;
    let mut seen_ids = BTreeSet::new();
    let mut received = Vec::new();
    loop {
        let page = events_page(app, &format!("after={after}&collections={coll}&filter={}&limit=50", filter())).await;
        let items = page["items"].as_array().unwrap();
        for e in items {
            assert!(seen_ids.insert(e["id"].as_str().unwrap().to_owned()), "an event came twice: {e}");
            assert!(e["seq"].as_u64().unwrap() > after, "events in order");
            assert_eq!(e["collection"], coll, "{e}");
            let (id, version) = (e["document"].as_str().unwrap().to_owned(), e["version"].as_i64().unwrap());
            let left = e["left"] == true;
            let matches = e["data"]["g"] == 1;
            assert_eq!(left, !matches, "an event leaves the set exactly when its document no longer matches: {e}");
            received.push((e["id"].as_str().unwrap().to_owned(), left));
            let held = view.get(&id).map_or(0, |(v, _)| *v);
            if version > held {
                if left {
                    view.remove(&id);
                } else {
                    view.insert(id, (version, e["data"].clone()));
                }
            }
        }
        let next = page["next"].as_u64().unwrap();
        if items.is_empty() && next == after {
            break;
        }
        after = next;
    }
    // Exactly the changes that add to, change in or take from the set:
    // a model over the whole log says which.
    let (log, _) = all_events(app, 0, &format!("&collections={coll}")).await;
    let mut in_set: BTreeMap<String, bool> = BTreeMap::new();
    let mut expected = Vec::new();
    for e in &log {
        let Some(id) = e["document"].as_str() else { continue };
        let before = in_set.get(id).copied().unwrap_or(false);
        let now = e["data"]["g"] == 1;
        in_set.insert(id.to_owned(), now);
        if e["seq"].as_u64().unwrap() > position && (before || now) {
            expected.push((e["id"].as_str().unwrap().to_owned(), !now));
        }
    }
    assert_eq!(received, expected, "the filtered events (seed {seed}) are not the changes of the set");
    // The stream says the same, and nothing more.
    let query = format!("after={position}&collections={coll}&filter={}", filter());
    let mut stream = SseStream::open(app, &format!("/v1/events?{}", query.replace('"', "%22")), None).await;
    let streamed: Vec<(String, bool)> = stream
        .take(expected.len(), Duration::from_secs(10))
        .await
        .into_iter()
        .map(|e| (e.data["id"].as_str().unwrap().to_owned(), e.data["left"] == true))
        .collect();
    assert_eq!(streamed, expected, "the filtered stream (seed {seed}) is not the changes of the set");
    assert!(stream.next(Duration::from_millis(300)).await.is_none(), "the stream has more than the set's changes");
    let (fresh, _) = list(app, coll, 50, async || {}).await;
    let fresh: BTreeMap<String, (i64, Value)> = fresh.into_iter().map(|(id, v, d)| (id, (v, d))).collect();
    assert_eq!(view, fresh, "the live view (seed {seed}) differs from a fresh query");
}

async fn runs(app: &TestApp, writer: &TestApp, n: usize) {
    let seed = seed();
    eprintln!("live view seed: {seed} (TXGATE_TEST_SEED={seed} repeats it)");
    for i in 0..n {
        run(app, writer, &format!("live{i}"), seed.wrapping_add(i as u64)).await;
    }
}

async fn a_live_view_equals_a_fresh_query(backend: Backend) {
    let Some(app) = TestApp::spawn(backend).await else { return };
    runs(&app, &app, 4).await;
}

async fn a_live_view_holds_while_writes_are_slow(backend: Backend) {
    let rule = |op: &crate::faulty::Op| {
        let write = matches!(op.kind, "insert" | "replace" | "update" | "delete");
        if write && op.coll.starts_with("live") { Act::Delay(Duration::from_millis(10)) } else { Act::Pass }
    };
    let Some(writer) = rigged_app(backend, |_| {}, rule).await else { return };
    // The view is read through another instance on the same store, which
    // does not wait for the writer's roll-forwards: its pages meet
    // transactions whose events are logged and whose documents are not
    // rolled forward yet.
    let app = TestApp::on_store(writer.config.clone(), Arc::clone(&writer.store), None).await;
    runs(&app, &writer, 3).await;
}

/// A transaction moves a document into the set; another instance reads
/// the view's first page after the transaction's events are in the log
/// and before its roll-forward has moved the document's index entries.
/// The page's position lies before those events, so following the
/// filtered events from it brings the document in.
async fn a_page_read_while_a_transaction_rolls_forward_hands_over_exactly(backend: Backend) {
    let slow = Arc::new(AtomicBool::new(false));
    let rule = {
        let slow = Arc::clone(&slow);
        move |op: &crate::faulty::Op| {
            let write = matches!(op.kind, "replace" | "update");
            if write && op.coll == "win" && slow.load(Ordering::SeqCst) {
                Act::Delay(Duration::from_millis(400))
            } else {
                Act::Pass
            }
        }
    };
    let Some(writer) = rigged_app(backend, |_| {}, rule).await else { return };
    let app = TestApp::on_store(writer.config.clone(), Arc::clone(&writer.store), None).await;
    let docs = "/v1/collections/win/documents";
    for (id, g) in [("in", 1), ("x", 0), ("y", 0)] {
        expect(writer.post(docs, &json!({"_id": id, "g": g, "v": 1})).await, 201).await;
    }
    ready_index(&app, "win", "g_v", &["g", "-v"]).await;
    writer.settled().await;
    let before = events_page(&app, "after=0&limit=1000").await["next"].as_u64().unwrap();
    slow.store(true, Ordering::SeqCst);
    let txn = json!({"actions": [
        {"op": "update", "collection": "win", "id": "x", "set": {"g": 1, "v": 9}},
        {"op": "update", "collection": "win", "id": "y", "set": {"v": 5}},
    ]});
    let commit = writer.post("/v1/transactions", &txn);
    let read = async {
        // Once the transaction's events are in the log (appended through
        // the writer's store), its roll-forward is on its way (each of its
        // writes takes 400 ms): read the page.
        writer
            .until("the transaction's events are in the log", async || {
                let page = events_page(&app, &format!("after={before}&limit=1000")).await;
                page["items"].as_array().unwrap().iter().any(|e| e["type"] == "transaction.committed")
            })
            .await;
        let body = json!({"filter": filter(), "sort": ["-v"], "limit": 10});
        expect(app.post("/v1/collections/win/query", &body).await, 200).await
    };
    let (committed, page) = tokio::join!(commit, read);
    expect(committed, 200).await;
    slow.store(false, Ordering::SeqCst);
    writer.settled().await;
    let mut view: BTreeSet<String> =
        page["items"].as_array().unwrap().iter().map(|d| d["id"].as_str().unwrap().to_owned()).collect();
    let position = page["position"].as_u64().unwrap();
    let (events, _) = all_events(&app, position, &format!("&collections=win&filter={}", filter())).await;
    for e in events {
        let id = e["document"].as_str().unwrap().to_owned();
        if e["left"] == true {
            view.remove(&id);
        } else {
            view.insert(id);
        }
    }
    assert_eq!(view, BTreeSet::from(["in".to_owned(), "x".to_owned()]), "page {page}");
}

/// A client reads part of a filtered stream and hangs up while changes go
/// on (the gateway allows one stream at a time); its slot comes back, and a
/// stream resumed from the last id it saw brings exactly the filtered
/// changes after it, as a JSON page of the same filter says.
async fn a_client_that_hangs_up_mid_filtered_stream_frees_its_slot_and_resumes_exactly(backend: Backend) {
    let Some(app) = TestApp::spawn_with(backend, |c| c.max_streams = 1).await else { return };
    let docs = "/v1/collections/hang/documents";
    expect(app.post(docs, &json!({"_id": "seed", "g": 0})).await, 201).await;
    ready_index(&app, "hang", "g", &["g"]).await;
    let position = events_page(&app, "after=0&limit=1000").await["next"].as_u64().unwrap();
    let path = |q: &str| format!("/v1/events?collections=hang&filter=%7B%22g%22%3A1%7D{q}");
    let write = async |i: u32| {
        // Into the set, changed in it, out of it, and a change outside it.
        let id = format!("d{i}");
        expect(app.post(docs, &json!({"_id": id, "g": 1, "n": 0})).await, 201).await;
        expect(app.send_json(Method::PATCH, &format!("{docs}/{id}"), &json!({"set": {"n": 1}})).await, 200).await;
        expect(app.send_json(Method::PATCH, &format!("{docs}/{id}"), &json!({"set": {"g": 2}})).await, 200).await;
        expect(app.send_json(Method::PATCH, &format!("{docs}/{id}"), &json!({"set": {"n": 2}})).await, 200).await;
    };
    let mut stream = SseStream::open(&app, &path(&format!("&after={position}")), None).await;
    write(0).await;
    let seen = stream.take(2, Duration::from_secs(10)).await;
    assert_eq!(seen.len(), 2, "the first two changes of the set come");
    let last = seen[1].id.clone().expect("an event id");
    // Hang up in the middle (one more change of the set is on its way).
    drop(stream);
    for i in 1..4 {
        write(i).await;
    }
    let (want, _) = all_events(&app, last.parse().unwrap(), "&collections=hang&filter=%7B%22g%22%3A1%7D").await;
    let want: Vec<(String, bool)> =
        want.iter().map(|e| (e["id"].as_str().unwrap().to_owned(), e["left"] == true)).collect();
    assert_eq!(want.len(), 1 + 3 * 3, "the rest of d0 (it left), and d1..d3 each entering, changing and leaving");
    // The one slot comes back (429 until then), and the stream resumes
    // after the last id seen.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let mut resumed = loop {
        let url = format!("{}{}", app.base, path(""));
        match SseStream::try_open_url(&url, Some(&last)).await {
            Ok(stream) => break stream,
            Err(status) => assert_eq!(status, 429, "a stream refused for want of a slot"),
        }
        assert!(std::time::Instant::now() < deadline, "the slot of a stream whose client hung up never came back");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let got: Vec<(String, bool)> = resumed
        .take(want.len(), Duration::from_secs(10))
        .await
        .into_iter()
        .map(|e| (e.data["id"].as_str().unwrap().to_owned(), e.data["left"] == true))
        .collect();
    assert_eq!(got, want, "the resumed stream is not exactly the set's changes after the last id seen");
    assert!(resumed.next(Duration::from_millis(300)).await.is_none(), "the resumed stream has more");
}

/// The live documents of a collection as of position `position`, from
/// its log (in order): id -> (version, data).
fn state_at(log: &[Value], position: u64) -> BTreeMap<String, (i64, Value)> {
    let mut state = BTreeMap::new();
    for e in log.iter().take_while(|e| e["seq"].as_u64().unwrap() <= position) {
        let Some(id) = e["document"].as_str() else { continue };
        match e["type"].as_str().unwrap() {
            "document.deleted" | "document.expired" => state.remove(id),
            _ => state.insert(id.to_owned(), (e["version"].as_i64().unwrap(), e["data"].clone())),
        };
    }
    state
}

/// Pages (filtered and sorted, and in id order) and counts read while
/// single writes and transactions land: each is exactly the query over
/// the log up to its `position`, no change after it shown and none before
/// it missing.
async fn a_page_reflects_exactly_the_changes_up_to_its_position(backend: Backend) {
    let Some(app) = TestApp::spawn(backend).await else { return };
    // Writes a few reads apart (a MongoDB-wire read is slower): some land during
    // a read, and a page then reads again for an exact position.
    let pause = Duration::from_millis(if matches!(backend, Backend::Mongodb) { 250 } else { 10 });
    exact_reads(&app, pause, 1, 60).await;
}

/// The same under writes that never pause, from eight writers at once: on
/// the embedded store a page and a count read one snapshot, so they are
/// exact whatever lands meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_pages_are_exact_under_sustained_writes() {
    let app = TestApp::spawn(Backend::Embedded).await.unwrap();
    exact_reads(&app, Duration::ZERO, 8, 60).await;
}

/// The same on MongoDB, whose reads have no snapshot, under writes that
/// never pause from two writers through the same gateway: a read whose
/// first reads saw writes land reads last with this instance's writes
/// held back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mongodb_pages_are_exact_under_sustained_writes() {
    let Some(app) = TestApp::spawn(Backend::Mongodb).await else { return };
    exact_reads(&app, Duration::ZERO, 2, 12).await;
}

/// What a read shows, to compare: documents by id (version, data), or a
/// count.
#[derive(Debug, PartialEq)]
enum Shown {
    Page(Vec<(String, i64, Value)>),
    Count(u64),
}

/// `reads` reads (a filtered page, a page in id order, a filtered count, in
/// turn) while `writers` write, each pausing `pause` between writes; every
/// read compared with the query over the log up to its position.
async fn exact_reads(app: &TestApp, pause: Duration, writers: u64, reads: usize) {
    let seed = seed();
    eprintln!("exact page seed: {seed} (TXGATE_TEST_SEED={seed} repeats it)");
    let mut rng = StdRng::seed_from_u64(seed);
    let coll = "exact";
    for i in 0..DOCS {
        let mut body = data(&mut rng);
        body["_id"] = json!(format!("d{i:02}"));
        expect(app.post(&format!("/v1/collections/{coll}/documents"), &body).await, 201).await;
    }
    ready_index(app, coll, "g_v", &["g", "-v"]).await;
    let stop = AtomicBool::new(false);
    let reader = async {
        let mut answers = Vec::new();
        for i in 0..reads {
            let (kind, answer) = match i % 3 {
                0 => {
                    let body = json!({"filter": filter(), "sort": ["-v"], "limit": 100});
                    ("filtered", app.post(&format!("/v1/collections/{coll}/query"), &body).await)
                }
                1 => ("all", app.post(&format!("/v1/collections/{coll}/query"), &json!({"limit": 100})).await),
                _ => {
                    let url = format!("/v1/collections/{coll}/count");
                    let query = [("filter", filter().to_string())];
                    ("count", app.request(Method::GET, &url).query(&query).send().await.unwrap())
                }
            };
            answers.push((kind, expect(answer, 200).await));
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        stop.store(true, Ordering::SeqCst);
        answers
    };
    let writing = futures::future::join_all((0..writers).map(|w| {
        let stop = &stop;
        async move {
            let mut writer_rng = StdRng::seed_from_u64(seed ^ 0x5eed ^ w);
            paced_write(app, coll, &mut writer_rng, stop, pause).await
        }
    }));
    let (reads, writes) = tokio::join!(reader, writing);
    assert!(writes.iter().all(|n| *n > 0), "a writer ran no write while the pages were read: {writes:?}");
    let (log, _) = all_events(app, 0, &format!("&collections={coll}")).await;
    for (kind, answer) in reads {
        let position = answer["position"].as_u64().unwrap();
        let mut expected: Vec<(String, i64, Value)> = state_at(&log, position)
            .into_iter()
            .filter(|(_, (_, data))| kind == "all" || data["g"] == 1)
            .map(|(id, (version, data))| (id, version, data))
            .collect();
        if kind == "filtered" {
            // By -v, ties by id (the index's order).
            expected.sort_by(|a, b| b.2["v"].as_i64().cmp(&a.2["v"].as_i64()).then_with(|| a.0.cmp(&b.0)));
        }
        let (shown, expected) = if kind == "count" {
            (Shown::Count(answer["count"].as_u64().unwrap()), Shown::Count(expected.len() as u64))
        } else {
            let items = answer["items"].as_array().unwrap().iter().map(|item| {
                (item["id"].as_str().unwrap().to_owned(), item["version"].as_i64().unwrap(), item["data"].clone())
            });
            (Shown::Page(items.collect()), Shown::Page(expected))
        };
        if shown != expected {
            let near: Vec<String> = log
                .iter()
                .filter(|e| e["seq"].as_u64().unwrap() + 8 >= position && e["seq"].as_u64().unwrap() <= position + 8)
                .map(|e| format!("{} {} {} {}", e["seq"], e["id"], e["transaction"], e["data"]))
                .collect();
            eprintln!("the log near {position}:\n{}", near.join("\n"));
        }
        assert_eq!(shown, expected, "a read (seed {seed}, {kind}) is not the query at its position {position}");
    }
}

//! Change events (docs/design.md §5): the log, JSON pages, the SSE stream, gaps,
//! retention and shutdown, over HTTP against both backends.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use txgate::testing::document::StoredDoc;
use txgate::testing::events::EVENTS;
use txgate_store::{DateTime, doc};

use crate::support::{Backend, SseStream, TestApp, all_events, events_page, expect, expect_problem};

crate::on_both_backends!(
    events_come_only_from_committed_changes,
    pages_resume_with_next_and_filter,
    a_stream_filters_and_resumes_without_loss,
    two_instances_one_stream_sees_every_event_once,
    a_gap_that_never_fills_is_voided,
    an_expired_cursor_gets_410,
    an_outbox_left_by_a_crash_reaches_the_log_in_version_order,
    shutdown_with_open_streams_is_prompt,
    tombstones_go_after_their_retention,
    a_tombstone_stays_while_the_log_holds_its_deletion,
    a_stream_names_where_it_starts_so_a_client_resumes_before_any_event,
    pages_and_streams_of_large_events_are_read_in_bounded_batches,
);

async fn create(app: &TestApp, coll: &str, id: &str, body: Value) -> Value {
    let mut body = body;
    body["_id"] = json!(id);
    expect(app.post(&format!("/v1/collections/{coll}/documents"), &body).await, 201).await
}

async fn patch(app: &TestApp, coll: &str, id: &str, set: Value) -> reqwest::Response {
    app.send_json(reqwest::Method::PATCH, &format!("/v1/collections/{coll}/documents/{id}"), &json!({"set": set})).await
}

fn ids(events: &[Value]) -> Vec<&str> {
    events.iter().map(|e| e["id"].as_str().unwrap()).collect()
}

/// Positions increase; per document, versions follow one another.
fn check_order(events: &[Value]) {
    let mut last_seq = 0;
    let mut versions: HashMap<(String, String), i64> = HashMap::new();
    for e in events {
        let seq = e["seq"].as_u64().unwrap();
        assert!(seq > last_seq, "seq goes up: {seq} after {last_seq}");
        last_seq = seq;
        if let (Some(c), Some(d)) = (e["collection"].as_str(), e["document"].as_str()) {
            let v = e["version"].as_i64().unwrap();
            if let Some(prev) = versions.insert((c.into(), d.into()), v) {
                assert_eq!(v, prev + 1, "{c}/{d}: version {v} after {prev}");
            }
        }
    }
}

async fn events_come_only_from_committed_changes(backend: Backend) {
    let Some(app) = TestApp::spawn(backend).await else { return };
    create(&app, "acc", "a", json!({"bal": 10})).await;
    create(&app, "acc", "b", json!({"bal": 0})).await;
    let transfer = json!({"actions": [
        {"op": "update", "collection": "acc", "id": "a", "inc": {"bal": -3}, "if_version": 1},
        {"op": "update", "collection": "acc", "id": "b", "inc": {"bal": 3}},
        {"op": "check", "collection": "acc", "id": "b"},
    ]});
    // A document named twice is refused, and leaves nothing.
    assert_eq!(app.post("/v1/transactions", &transfer).await.status(), 422);
    let transfer = json!({"actions": [
        {"op": "update", "collection": "acc", "id": "a", "inc": {"bal": -3}, "if_version": 1},
        {"op": "update", "collection": "acc", "id": "b", "inc": {"bal": 3}},
        {"op": "insert", "collection": "log", "id": "t1", "data": {"n": 1}},
    ]});
    let committed = expect(app.post("/v1/transactions", &transfer).await, 200).await;
    let txn = committed["id"].as_str().unwrap().to_owned();
    // Failures write no event: a stale version, an aborted transaction.
    let stale = app
        .request(reqwest::Method::PATCH, "/v1/collections/acc/documents/a")
        .header("if-match", "\"1\"")
        .json(&json!({"set": {"x": 1}}))
        .send()
        .await
        .unwrap();
    assert_eq!(stale.status(), 409);
    let aborted = app
        .post(
            "/v1/transactions",
            &json!({"actions": [
                {"op": "update", "collection": "acc", "id": "a", "set": {"y": 1}},
                {"op": "update", "collection": "acc", "id": "b", "set": {"y": 1}, "if_version": 1},
            ]}),
        )
        .await;
    assert_eq!(aborted.status(), 409);
    assert_eq!(
        app.request(reqwest::Method::DELETE, "/v1/collections/acc/documents/b").send().await.unwrap().status(),
        204
    );

    let (events, next) = all_events(&app, 0, "").await;
    check_order(&events);
    let all = ids(&events);
    assert_eq!(all.len(), 7, "{all:?}");
    assert_eq!((all[0], all[1], all[5], all[6]), ("acc/a/1", "acc/b/1", format!("_txns/{txn}").as_str(), "acc/b/3"));
    let mut members: Vec<&str> = all[2..5].to_vec();
    members.sort();
    assert_eq!(members, vec!["acc/a/2", "acc/b/2", "log/t1/1"]);
    assert_eq!(next, events.last().unwrap()["seq"].as_u64().unwrap());
    let by_id: HashMap<&str, &Value> = events.iter().map(|e| (e["id"].as_str().unwrap(), e)).collect();
    assert_eq!(by_id["acc/a/1"]["type"], "document.created");
    assert_eq!(by_id["acc/a/1"]["transaction"], Value::Null);
    assert_eq!(by_id["acc/a/1"]["data"], json!({"bal": 10}));
    assert_eq!(by_id["acc/a/2"]["type"], "document.updated");
    assert_eq!(by_id["acc/a/2"]["transaction"], json!(txn));
    assert_eq!(by_id["acc/a/2"]["data"], json!({"bal": 7}));
    assert_eq!(by_id["log/t1/1"]["type"], "document.created");
    assert_eq!(by_id["acc/b/3"]["type"], "document.deleted");
    assert!(by_id["acc/b/3"].get("data").is_none(), "a delete carries no data");
    let tx = by_id[format!("_txns/{txn}").as_str()];
    assert_eq!(tx["type"], "transaction.committed");
    assert_eq!(
        tx["members"],
        json!([
            {"collection": "acc", "id": "a", "op": "update", "version": 2},
            {"collection": "acc", "id": "b", "op": "update", "version": 2},
            {"collection": "log", "id": "t1", "op": "insert", "version": 1},
        ])
    );
    // No outbox is left behind.
    for id in ["a", "b"] {
        let d = StoredDoc::from_record(app.store.get("acc", id).await.unwrap().unwrap()).unwrap();
        assert!(d.meta.outbox.is_none(), "{id}: {:?}", d.meta.outbox);
    }
    app.stop().await;
}

async fn pages_resume_with_next_and_filter(backend: Backend) {
    let Some(app) = TestApp::spawn(backend).await else { return };
    // Without `after`, an empty log's page is empty at position 0.
    let empty = events_page(&app, "").await;
    assert_eq!(empty, json!({"items": [], "next": 0}));
    for i in 0..12 {
        create(&app, if i % 3 == 0 { "b" } else { "a" }, &format!("d{i}"), json!({"i": i})).await;
    }
    for i in 0..4 {
        expect(patch(&app, "a", &format!("d{}", i * 3 + 1), json!({"p": 1})).await, 200).await;
    }
    let (all, next) = all_events(&app, 0, "").await;
    assert_eq!(all.len(), 16);
    check_order(&all);
    // Pages of 5 cover the same, in order, and `next` continues.
    let first = events_page(&app, "limit=5").await;
    assert_eq!(first["items"].as_array().unwrap().len(), 5);
    assert_eq!(first["next"], all[4]["seq"]);
    let second = events_page(&app, &format!("after={}&limit=5", first["next"])).await;
    assert_eq!(second["items"][0], all[5]);
    // Nothing new: the same cursor back.
    let none = events_page(&app, &format!("after={next}")).await;
    assert_eq!(none, json!({"items": [], "next": next}));
    // Filters.
    let (only_b, _) = all_events(&app, 0, "&collections=b").await;
    assert_eq!(only_b.len(), 4);
    assert!(only_b.iter().all(|e| e["collection"] == "b"));
    let (updates, _) = all_events(&app, 0, "&types=document.updated&collections=a,zz").await;
    assert_eq!(ids(&updates), vec!["a/d1/2", "a/d4/2", "a/d7/2", "a/d10/2"]);
    let (both, _) = all_events(&app, 0, "&types=document.created,document.updated").await;
    assert_eq!(both.len(), 16);
    // Bad input.
    for q in
        ["after=-1", "after=x", "limit=0", "limit=1001", "types=document.nope", "collections=a,b!", "collections=_txns"]
    {
        let res = app
            .request(reqwest::Method::GET, &format!("/v1/events?{q}"))
            .header("accept", "application/json")
            .send()
            .await
            .unwrap();
        expect_problem(res, 422, "validation_failed").await;
    }
    // The same values are refused for a stream, before it starts.
    for q in ["limit=0", "collections=b!"] {
        let res = app.request(reqwest::Method::GET, &format!("/v1/events?{q}")).send().await.unwrap();
        expect_problem(res, 422, "validation_failed").await;
    }
    let res = app.request(reqwest::Method::GET, "/v1/events").header("last-event-id", "soon").send().await.unwrap();
    expect_problem(res, 400, "invalid_header").await;
    app.stop().await;
}

async fn a_stream_filters_and_resumes_without_loss(backend: Backend) {
    let Some(app) = TestApp::spawn(backend).await else { return };
    create(&app, "s", "before", json!({})).await;
    // Without a cursor the stream starts at now.
    let mut stream = SseStream::open(&app, "/v1/events", None).await;
    let mut updates = SseStream::open(&app, "/v1/events?collections=s&types=document.updated", None).await;
    create(&app, "s", "x", json!({"n": 0})).await;
    create(&app, "other", "y", json!({})).await;
    expect(patch(&app, "s", "x", json!({"n": 1})).await, 200).await;
    let got = stream.take(3, Duration::from_secs(5)).await;
    assert_eq!(
        got.iter().map(|e| e.data["id"].as_str().unwrap()).collect::<Vec<_>>(),
        vec!["s/x/1", "other/y/1", "s/x/2"]
    );
    for e in &got {
        assert_eq!(e.id.as_deref(), Some(e.data["seq"].to_string().as_str()), "id: is the seq");
    }
    let up = updates.take(1, Duration::from_secs(5)).await;
    assert_eq!(up[0].data["id"], "s/x/2");
    assert!(updates.next(Duration::from_millis(300)).await.is_none(), "nothing else matches");
    // Disconnect; changes go on; resume from the last id seen.
    let last = got.last().unwrap().id.clone().unwrap();
    drop(stream);
    for i in 2..7 {
        expect(patch(&app, "s", "x", json!({"n": i})).await, 200).await;
    }
    let mut resumed = SseStream::open(&app, "/v1/events", Some(&last)).await;
    let rest = resumed.take(5, Duration::from_secs(5)).await;
    let versions: Vec<i64> = rest.iter().map(|e| e.data["version"].as_i64().unwrap()).collect();
    assert_eq!(versions, vec![3, 4, 5, 6, 7]);
    // `after=` does the same.
    let mut again = SseStream::open(&app, &format!("/v1/events?after={last}"), None).await;
    assert_eq!(again.take(5, Duration::from_secs(5)).await.len(), 5);
    app.stop().await;
}

/// A stream opens with `: position <seq>` (a comment, skipped by every
/// parser): where it starts. A client that lost the connection before any
/// event came resumes from there and misses nothing written meanwhile.
async fn a_stream_names_where_it_starts_so_a_client_resumes_before_any_event(backend: Backend) {
    let Some(app) = TestApp::spawn(backend).await else { return };
    create(&app, "p", "a", json!({})).await;
    create(&app, "p", "b", json!({})).await;
    let first_piece = |url: String, last: Option<&'static str>| async move {
        let mut req = reqwest::Client::new().get(url).header("accept", "text/event-stream");
        if let Some(id) = last {
            req = req.header("last-event-id", id);
        }
        let mut res = req.send().await.unwrap();
        assert_eq!(res.status(), 200);
        let chunk = tokio::time::timeout(Duration::from_secs(5), res.chunk()).await.expect("a first piece in time");
        String::from_utf8(chunk.unwrap().unwrap().to_vec()).unwrap()
    };
    assert_eq!(first_piece(format!("{}/v1/events", app.base), None).await, ": position 2\n\n");
    assert_eq!(first_piece(format!("{}/v1/events", app.base), Some("1")).await, ": position 1\n\n");
    let filtered = format!("{}/v1/events?collections=p&types=document.updated", app.base);
    assert_eq!(first_piece(filtered, None).await, ": position 2\n\n");
    // The connection drops before any event; a change is made; the client
    // resumes from the position it was told.
    create(&app, "p", "c", json!({})).await;
    let mut resumed = SseStream::open(&app, "/v1/events", Some("2")).await;
    let got = resumed.take(1, Duration::from_secs(5)).await;
    assert_eq!(got[0].data["id"], "p/c/1");
    app.stop().await;
}

/// Two gateways on one store, writing at once: one stream sees every
/// event exactly once, in `seq` order, and so do the pages.
async fn two_instances_one_stream_sees_every_event_once(backend: Backend) {
    let Some(a) = TestApp::spawn(backend).await else { return };
    let b = TestApp::on_store(a.config.clone(), Arc::clone(&a.store), None).await;
    let mut stream = SseStream::open(&a, "/v1/events", None).await;
    let writers = [&a, &b].into_iter().enumerate().map(|(w, app)| async move {
        for i in 0..15 {
            create(app, "two", &format!("w{w}-{i}"), json!({"i": i})).await;
            let t = json!({"actions": [
                {"op": "update", "collection": "two", "id": format!("w{w}-{i}"), "set": {"t": 1}},
                {"op": "insert", "collection": "two", "id": format!("w{w}-{i}-t"), "data": {}},
            ]});
            expect(app.post("/v1/transactions", &t).await, 200).await;
        }
    });
    futures::future::join_all(writers).await;
    // 2 writers x 15 x (create + 2 members + transaction event).
    let got = stream.take(120, Duration::from_secs(20)).await;
    assert_eq!(got.len(), 120);
    let data: Vec<Value> = got.iter().map(|e| e.data.clone()).collect();
    check_order(&data);
    let mut seen: Vec<&str> = ids(&data);
    seen.sort();
    seen.dedup();
    assert_eq!(seen.len(), 120, "each event once");
    assert!(stream.next(Duration::from_millis(500)).await.is_none());
    let (paged, _) = all_events(&b, 0, "").await;
    assert_eq!(paged, data, "pages read what the stream read");
    b.stop().await;
    a.stop().await;
}

/// A position taken and never filled (its writer died) holds readers back
/// until the gap timeout; then it is voided and they go on, none lost.
async fn a_gap_that_never_fills_is_voided(backend: Backend) {
    let Some(app) = TestApp::spawn_with(backend, |c| {
        c.events.gap_timeout = Duration::from_millis(700);
        c.events.clock_skew = Duration::ZERO;
    })
    .await
    else {
        return;
    };
    create(&app, "g", "a", json!({})).await;
    let (before, head) = all_events(&app, 0, "").await;
    assert_eq!(before.len(), 1);
    // A writer that took position head+1 died; the next one landed at +2.
    let at = DateTime::now();
    let orphan = doc! {"_id": "g/b/1", "seq": (head + 2) as i64, "type": "document.created",
    "collection": "g", "document": "b", "version": 1_i64, "transaction": null, "at": at, "data": {}, "logged_at": at};
    assert!(app.store.insert(EVENTS, orphan).await.unwrap());
    let mut stream = SseStream::open(&app, "/v1/events", Some(&head.to_string())).await;
    let page = events_page(&app, &format!("after={head}")).await;
    assert_eq!(page, json!({"items": [], "next": head}), "a page stops before a gap that may still fill");
    let started = Instant::now();
    let got = stream.take(1, Duration::from_secs(5)).await;
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].data["id"], "g/b/1");
    assert!(started.elapsed() >= Duration::from_millis(400), "the stream waited for the gap");
    let void = app.store.get(EVENTS, &format!("void/{}", head + 1)).await.unwrap().expect("the gap was voided");
    assert_eq!(void.get_bool("void"), Ok(true));
    // The position stays void: later events go after it.
    create(&app, "g", "c", json!({})).await;
    let (after, _) = all_events(&app, head, "").await;
    assert_eq!(ids(&after), vec!["g/b/1", "g/c/1"]);
    app.stop().await;
}

async fn an_expired_cursor_gets_410(backend: Backend) {
    let Some(app) = TestApp::spawn_with(backend, |c| c.events.retention = Duration::from_secs(1)).await else {
        return;
    };
    for i in 0..3 {
        create(&app, "r", &format!("old{i}"), json!({})).await;
    }
    // Logged, then past the retention.
    app.settled().await;
    app.advance(Duration::from_millis(1300));
    create(&app, "r", "new", json!({})).await;
    app.run_once("ttl").await; // counts the log's changes, which the purge waits for
    app.run_once("event_purge").await;
    let res = app
        .request(reqwest::Method::GET, "/v1/events?after=0")
        .header("accept", "application/json")
        .send()
        .await
        .unwrap();
    expect_problem(res, 410, "cursor_expired").await;
    let res = app.request(reqwest::Method::GET, "/v1/events").header("last-event-id", "1").send().await.unwrap();
    expect_problem(res, 410, "cursor_expired").await;
    // Without a cursor, pages start at the oldest retained event.
    let page = events_page(&app, "").await;
    assert_eq!(ids(page["items"].as_array().unwrap()), vec!["r/new/1"]);
    app.stop().await;
}

/// A single-document write whose process died after its compare-and-set
/// left its event in the document's outbox: the next writer logs it
/// before its own, and recovery logs one nobody writes over.
async fn an_outbox_left_by_a_crash_reaches_the_log_in_version_order(backend: Backend) {
    let Some(app) = TestApp::spawn(backend).await else {
        return;
    };
    for id in ["w", "r", "t"] {
        create(&app, "o", id, json!({"n": 0})).await;
    }
    // What the crash leaves: version 2 with its event in the outbox only.
    for id in ["w", "r", "t"] {
        let mut d = StoredDoc::from_record(app.store.get("o", id).await.unwrap().unwrap()).unwrap();
        d.meta.v = 2;
        d.data = doc! {"n": 1_i64};
        let at = DateTime::now();
        d.meta.outbox = Some(txgate::testing::events::model::document_event(
            txgate::testing::events::EventType::Updated,
            "o",
            &d,
            None,
            None,
            None,
            at,
        ));
        assert!(app.store.replace("o", id, doc! {"_meta.v": 1_i64}, d.to_record()).await.unwrap());
    }
    // A reader leaves it alone.
    let read = expect(app.get("/v1/collections/o/documents/r").await, 200).await;
    assert_eq!(read["version"], 2);
    // A writer logs it first.
    expect(patch(&app, "o", "w", json!({"n": 2})).await, 200).await;
    // A transaction does too.
    let t = json!({"actions": [{"op": "update", "collection": "o", "id": "t", "set": {"n": 2}}]});
    expect(app.post("/v1/transactions", &t).await, 200).await;
    app.settled().await;
    // Recovery moves an outbox once its change is 5 s old (younger, it is
    // on its way through its writer's queue).
    app.advance(Duration::from_secs(6));
    app.run_once("recovery").await;
    let (events, _) = all_events(&app, 0, "").await;
    check_order(&events);
    let mut got: Vec<&str> = ids(&events).into_iter().filter(|i| i.ends_with("/2") || i.ends_with("/3")).collect();
    got.sort();
    assert_eq!(got, vec!["o/r/2", "o/t/2", "o/t/3", "o/w/2", "o/w/3"], "recovery logs the outbox left alone");
    let left = StoredDoc::from_record(app.store.get("o", "r").await.unwrap().unwrap()).unwrap();
    assert!(left.meta.outbox.is_none(), "recovery clears what it logged");
    app.stop().await;
}

async fn shutdown_with_open_streams_is_prompt(backend: Backend) {
    let Some(app) = TestApp::spawn(backend).await else { return };
    let mut streams = Vec::new();
    for _ in 0..5 {
        streams.push(SseStream::open(&app, "/v1/events", None).await);
    }
    let started = Instant::now();
    app.stop().await;
    assert!(started.elapsed() < Duration::from_secs(3), "shutdown waited for the streams: {:?}", started.elapsed());
    for mut s in streams {
        assert!(s.ended(Duration::from_secs(2)).await, "a stream stayed open");
    }
}

/// A tombstone past its retention is purged: the id then reads 404, and a
/// document created under it starts at version 1 again.
async fn tombstones_go_after_their_retention(backend: Backend) {
    let Some(app) = TestApp::spawn_with(backend, |c| {
        c.events.retention = Duration::from_millis(500);
        c.events.tombstone_retention = Duration::from_millis(800);
    })
    .await
    else {
        return;
    };
    create(&app, "t", "gone", json!({"n": 1})).await;
    create(&app, "t", "kept", json!({"n": 1})).await;
    let del = app.request(reqwest::Method::DELETE, "/v1/collections/t/documents/gone").send().await.unwrap();
    assert_eq!(del.status(), 204);
    assert_eq!(app.get("/v1/collections/t/documents/gone").await.status(), 410);
    app.settled().await;
    // Within both retentions, the tombstone stays.
    app.run_once("ttl").await; // counts the log's changes, which the purge waits for
    app.run_once("event_purge").await;
    assert_eq!(app.get("/v1/collections/t/documents/gone").await.status(), 410);
    // Past them: the deletion's event goes from the log, then the tombstone.
    app.advance(Duration::from_secs(1));
    app.run_once("ttl").await; // counts the log's changes, which the purge waits for
    app.run_once("event_purge").await;
    assert_eq!(app.get("/v1/collections/t/documents/gone").await.status(), 404, "the tombstone was not purged");
    expect(app.get("/v1/collections/t/documents/kept").await, 200).await;
    let again = create(&app, "t", "gone", json!({"n": 2})).await;
    assert_eq!(again["version"], 1);
    app.stop().await;
}

/// A tombstone past its retention stays while the log still holds its
/// deletion's event (here the log's purge fails): a document created
/// under it would start at version 1 again and its events would take the
/// ids of the old life's, which the log holds. Once the log lets them go,
/// the tombstone goes, and the new life's events are published.
async fn a_tombstone_stays_while_the_log_holds_its_deletion(backend: Backend) {
    use std::sync::atomic::{AtomicBool, Ordering};
    let hold = Arc::new(AtomicBool::new(true));
    let holding = Arc::clone(&hold);
    let rule = move |op: &crate::faulty::Op| match (op.kind, op.coll) {
        ("delete", EVENTS) if holding.load(Ordering::SeqCst) => crate::faulty::Act::FailBefore,
        _ => crate::faulty::Act::Pass,
    };
    let tweak = |c: &mut txgate::config::Config| {
        c.events.retention = Duration::from_millis(500);
        c.events.tombstone_retention = Duration::from_millis(500);
    };
    let Some(app) = crate::faulty::rigged_app(backend, tweak, rule).await else { return };
    create(&app, "t", "gone", json!({"n": 1})).await;
    let del = app.request(reqwest::Method::DELETE, "/v1/collections/t/documents/gone").send().await.unwrap();
    assert_eq!(del.status(), 204);
    // Purge passes past both retentions whose log purge fails: the
    // tombstone stays.
    app.settled().await;
    app.advance(Duration::from_secs(1));
    app.run_once("ttl").await; // counts the log's changes, which the purge waits for
    for _ in 0..3 {
        assert!(app.try_run_once("event_purge").await.is_err(), "the log's purge fails here");
    }
    assert_eq!(app.get("/v1/collections/t/documents/gone").await.status(), 410, "the tombstone went first");
    hold.store(false, Ordering::SeqCst);
    app.run_once("ttl").await; // counts the log's changes, which the purge waits for
    app.run_once("event_purge").await;
    assert_eq!(app.get("/v1/collections/t/documents/gone").await.status(), 404, "the tombstone was not purged");
    let again = create(&app, "t", "gone", json!({"n": 2})).await;
    assert_eq!(again["version"], 1);
    // The new life's first event is in the log, with its own data.
    app.settled().await;
    let mut after = 0u64;
    loop {
        let res = app
            .request(reqwest::Method::GET, &format!("/v1/events?after={after}&limit=1000"))
            .header("accept", "application/json")
            .send()
            .await
            .unwrap();
        if res.status() == 410 {
            // The old life's events are purged: read from the oldest kept.
            let p: Value = res.json().await.unwrap();
            let detail = p["detail"].as_str().unwrap();
            after = detail.rsplit("follows ").next().unwrap().trim_end_matches(')').parse().unwrap();
            continue;
        }
        let page = expect(res, 200).await;
        let found = page["items"].as_array().unwrap().iter().find(|e| e["id"] == "t/gone/1").cloned();
        let event = found.unwrap_or_else(|| panic!("the new life's event was never published: {page}"));
        assert_eq!(event["data"]["n"], 2, "the old life's event: {event}");
        break;
    }
    app.stop().await;
}

/// A single write on a store whose chains land whole (docs/design.md §1).
mod single_write {
    use super::*;
    use crate::faulty::{Act, Op, rigged_app};

    crate::on_both_backends!(an_event_after_the_answer_is_read_in_the_order_answered);

    /// Where a write and its event's append are not one chain (MongoDB;
    /// any store under a layer that splits chains), the event goes from
    /// the outbox to the log after the answer: a slow log does not slow
    /// the answer, yet this instance's readers of events and counts see
    /// every write it answered before, in the order it answered them.
    async fn an_event_after_the_answer_is_read_in_the_order_answered(backend: Backend) {
        let slow = Duration::from_millis(1500);
        let rule = move |op: &Op| match (op.kind, op.coll, op.id) {
            ("append", EVENTS, Some("s/a/1")) => Act::Delay(slow),
            _ => Act::Pass,
        };
        let Some(app) = rigged_app(backend, |_| {}, rule).await else { return };
        let started = Instant::now();
        create(&app, "s", "a", json!({"n": 1})).await;
        let answered = started.elapsed();
        assert!(answered < slow, "the answer waited for the event's append ({answered:?})");
        create(&app, "s", "b", json!({"n": 2})).await;
        // Read at once: the count and the log include both, a before b.
        let res = app.get("/v1/collections/s").await;
        assert_eq!(expect(res, 200).await["count"], 2);
        assert!(started.elapsed() >= slow, "the count was read before a's event was logged");
        let page = events_page(&app, "").await;
        assert_eq!(ids(page["items"].as_array().unwrap()), vec!["s/a/1", "s/b/1"]);
        check_order(page["items"].as_array().unwrap());
        // Nothing is left in an outbox.
        for id in ["a", "b"] {
            let d = StoredDoc::from_record(app.store.get("s", id).await.unwrap().unwrap()).unwrap();
            assert!(d.meta.outbox.is_none(), "{id}: {:?}", d.meta.outbox);
        }
        app.stop().await;
    }

    /// The embedded store lands a chain whole or not at all: the write and
    /// its event's append are one chain, so the event is in the log when
    /// the answer comes and no outbox is ever stored.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn embedded_a_write_and_its_event_land_together() {
        let app = TestApp::spawn(Backend::Embedded).await.expect("the embedded store");
        create(&app, "s", "a", json!({"n": 0})).await;
        for n in 1..=3 {
            expect(patch(&app, "s", "a", json!({"n": n})).await, 200).await;
            let d = StoredDoc::from_record(app.store.get("s", "a").await.unwrap().unwrap()).unwrap();
            assert!(d.meta.outbox.is_none(), "version {}: {:?}", d.meta.v, d.meta.outbox);
            // Read at once, with nothing waited for.
            let page = events_page(&app, "").await;
            let logged: Vec<&str> = page["items"].as_array().unwrap().iter().filter_map(|e| e["id"].as_str()).collect();
            assert!(logged.contains(&format!("s/a/{}", n + 1).as_str()), "{logged:?}");
        }
        app.stop().await;
    }
}

/// Events of large documents: a page stops once it holds 4 MiB of events
/// as stored (the one that reaches it is its last), with `next` going on;
/// a stream reads the same in batches so bounded, and misses none.
async fn pages_and_streams_of_large_events_are_read_in_bounded_batches(backend: Backend) {
    let Some(app) = TestApp::spawn(backend).await else { return };
    // 12 events of 900 KB of data each: 4 MiB is reached by a page's fifth.
    let pad = "x".repeat(900_000);
    for i in 0..12 {
        create(&app, "big", &format!("b{i:02}"), json!({"n": i, "pad": pad})).await;
    }
    app.settled().await;
    let want: Vec<String> = (0..12).map(|i| format!("b{i:02}")).collect();
    let (mut seen, mut sizes, mut after) = (Vec::new(), Vec::new(), 0);
    loop {
        let page = events_page(&app, &format!("after={after}&limit=100&collections=big")).await;
        let items = page["items"].as_array().unwrap();
        if items.is_empty() {
            break;
        }
        sizes.push(items.len());
        seen.extend(items.iter().map(|e| e["document"].as_str().unwrap().to_owned()));
        after = page["next"].as_u64().unwrap();
        assert!(sizes.len() < 10, "pages never end: {sizes:?}");
    }
    assert_eq!(seen, want);
    assert_eq!(&sizes[..2], &[5, 5], "pages {sizes:?}");
    let mut stream = SseStream::open(&app, "/v1/events?after=0&collections=big", None).await;
    let streamed = stream.take(12, Duration::from_secs(30)).await;
    let ids: Vec<&str> = streamed.iter().map(|e| e.data["document"].as_str().unwrap()).collect();
    assert_eq!(ids, want.iter().map(String::as_str).collect::<Vec<_>>());
}

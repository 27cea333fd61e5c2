//! Stored data outlives releases: data directories written by earlier
//! releases (`tests/fixtures/`: journals of formats 1 and 2 with entries
//! still to replay, store layouts 1 and 2, shared unique index names)
//! open under this one, with everything in it.

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::restart::start_with;
use crate::support::expect;

/// Retention windows that keep everything a fixture holds: its records
/// were written on the day it was made, and the default windows (a day for
/// transactions, a week for events and deliveries, 30 days for tombstones)
/// count from today, so a fixture a week old would otherwise lose its
/// events to the purge before the test reads them.
const KEEP_FIXTURE: &[(&str, &str)] = &[
    ("TXGATE_TXN_RETENTION_SECS", "631152000"),
    ("TXGATE_IDEMPOTENCY_RETENTION_SECS", "631152000"),
    ("TXGATE_EVENT_RETENTION_SECS", "631152000"),
    ("TXGATE_TOMBSTONE_RETENTION_SECS", "631152000"),
    ("TXGATE_DELIVERY_RETENTION_SECS", "631152000"),
];

/// The data directory `tests/fixtures/<name>`, copied into `to`.
fn copy_fixture(name: &str, to: &Path) {
    let from = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name);
    for name in ["txgate.redb", "txgate.journal"] {
        std::fs::copy(from.join(name), to.join(name)).unwrap();
    }
}

async fn get(client: &reqwest::Client, url: String) -> (u16, Value) {
    let res = client.get(url).header("accept", "application/json").send().await.unwrap();
    let status = res.status().as_u16();
    (status, res.json().await.unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_data_directory_of_the_previous_release_opens() {
    let dir = tempfile::tempdir().unwrap();
    copy_fixture("embedded-v1", dir.path());
    let journal = dir.path().join("txgate.journal");
    assert_ne!(&std::fs::read(&journal).unwrap()[..8], b"txgjrnl\0", "the fixture's journal is format 1");
    let client = reqwest::Client::builder().timeout(Duration::from_secs(20)).build().unwrap();
    let (mut child, base) = start_with(dir.path(), KEEP_FIXTURE);
    let docs = format!("{base}/v1/collections/notes/documents");
    let n1 = expect(client.get(format!("{docs}/n1")).send().await.unwrap(), 200).await;
    assert_eq!((n1["version"].as_i64(), n1["data"]["title"].as_str()), (Some(2), Some("first, edited")), "{n1}");
    let n2 = expect(client.get(format!("{docs}/n2")).send().await.unwrap(), 200).await;
    assert_eq!((n2["version"].as_i64(), n2["data"]["title"].as_str()), (Some(2), Some("second")), "{n2}");
    assert_eq!(client.get(format!("{docs}/n3")).send().await.unwrap().status(), 410);
    let n4 = expect(client.get(format!("{docs}/n4")).send().await.unwrap(), 200).await;
    assert_eq!(n4["data"]["ordered"], true, "{n4}");
    let o1 = expect(client.get(format!("{base}/v1/collections/orders/documents/o-1")).send().await.unwrap(), 200).await;
    assert_eq!(o1["data"]["total"], 5);
    // The event n1's outbox held reaches the log (recovery publishes it).
    let until = Instant::now() + Duration::from_secs(20);
    loop {
        let (status, page) = get(&client, format!("{base}/v1/events?after=0&limit=1000")).await;
        assert_eq!(status, 200, "{page}");
        let ids: Vec<&str> = page["items"].as_array().unwrap().iter().filter_map(|e| e["id"].as_str()).collect();
        if ids.contains(&"notes/n1/2") {
            assert!(ids.contains(&"notes/n3/2") && ids.contains(&"notes/n1/1"), "{ids:?}");
            break;
        }
        assert!(Instant::now() < until, "n1's outbox event never reached the log: {ids:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The transaction's delivery is still recorded.
    let (status, deliveries) = get(&client, format!("{base}/v1/deliveries")).await;
    assert_eq!(status, 200);
    assert_eq!(deliveries["items"].as_array().map(Vec::len), Some(1), "{deliveries}");
    // The journal is format 2 from the first generation this release began.
    assert_eq!(&std::fs::read(&journal).unwrap()[..8], b"txgjrnl\0");
    // A write, a clean stop, a restart: everything is still there.
    let res = client.post(&docs).json(&serde_json::json!({"_id": "n5", "after": "upgrade"})).send().await.unwrap();
    assert_eq!(res.status(), 201);
    stop(&mut child);
    let (mut child, base) = start_with(dir.path(), KEEP_FIXTURE);
    let docs = format!("{base}/v1/collections/notes/documents");
    for id in ["n1", "n2", "n4", "n5"] {
        assert_eq!(client.get(format!("{docs}/{id}")).send().await.unwrap().status(), 200, "{id}");
    }
    stop(&mut child);
}

/// A data directory of the release that wrote journal format 2, as a
/// power cut left it before a checkpoint
/// (`tests/fixtures/embedded-journal2-unreplayed`): every acknowledged
/// write is replayed from the old journal, and the next generation is
/// written in this release's format.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_journal_of_format_2_with_entries_to_replay_opens() {
    let dir = tempfile::tempdir().unwrap();
    copy_fixture("embedded-journal2-unreplayed", dir.path());
    let journal = dir.path().join("txgate.journal");
    let version = |bytes: &[u8]| u32::from_le_bytes(bytes[8..12].try_into().unwrap());
    assert_eq!(version(&std::fs::read(&journal).unwrap()), 2, "the fixture's journal is format 2");
    let client = reqwest::Client::builder().timeout(Duration::from_secs(20)).build().unwrap();
    let (mut child, base) = start_with(dir.path(), KEEP_FIXTURE);
    let docs = format!("{base}/v1/collections/orders/documents");
    let expected = [
        ("o0", 2, json!({"n": 0, "status": "old"})),
        ("o1", 1, json!({"n": 1, "status": "new"})),
        ("o2", 2, json!({"n": 2, "status": "paid"})),
        ("o4", 2, json!({"n": 4, "status": "shipped"})),
        ("o5", 1, json!({"n": 5, "status": "new"})),
        ("o6", 1, json!({"n": 6})),
    ];
    for (id, version, data) in &expected {
        let doc = expect(client.get(format!("{docs}/{id}")).send().await.unwrap(), 200).await;
        assert_eq!((&doc["version"], &doc["data"]), (&json!(version), data), "{id}: {doc}");
    }
    assert_eq!(client.get(format!("{docs}/o3")).send().await.unwrap().status(), 410, "o3 was deleted");
    assert_eq!(version(&std::fs::read(&journal).unwrap()), 3, "the next generation is format 3");
    let res = client.post(&docs).json(&json!({"_id": "o7"})).send().await.unwrap();
    assert_eq!(res.status(), 201);
    stop(&mut child);
    let (mut child, base) = start_with(dir.path(), KEEP_FIXTURE);
    let docs = format!("{base}/v1/collections/orders/documents");
    for id in ["o0", "o2", "o6", "o7"] {
        assert_eq!(client.get(format!("{docs}/{id}")).send().await.unwrap().status(), 200, "{id}");
    }
    stop(&mut child);
}

/// SIGTERM, and wait for the process to end cleanly.
pub fn stop(child: &mut std::process::Child) {
    let pid = child.id().to_string();
    assert!(std::process::Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
    let status = child.wait().unwrap();
    assert!(status.success(), "txgate ended with {status}");
}

/// A data directory of the release before index counts (layout 1,
/// `tests/fixtures/embedded-layout1`): its ready index still serves
/// queries and counts (walking its entries, as it has no counts), follows
/// writes, and an index declared now counts the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_store_of_layout_1_opens_with_its_indexes() {
    let dir = tempfile::tempdir().unwrap();
    copy_fixture("embedded-layout1", dir.path());
    let client = reqwest::Client::builder().timeout(Duration::from_secs(20)).build().unwrap();
    let (mut child, base) = start_with(dir.path(), KEEP_FIXTURE);
    let orders = format!("{base}/v1/collections/orders");
    let count = async |index_filter: &str| {
        let url = format!("{orders}/count?filter={}", percent(index_filter));
        let (status, body) = get(&client, url).await;
        assert_eq!(status, 200, "{body}");
        body["count"].as_u64().unwrap()
    };
    let (status, index) = get(&client, format!("{orders}/indexes/by_status")).await;
    assert_eq!((status, index["state"].as_str()), (200, Some("ready")), "{index}");
    assert_eq!(count(r#"{"status":"open"}"#).await, 10);
    assert_eq!(count(r#"{"status":"paid"}"#).await, 9);
    assert_eq!(count(r#"{"status":"void"}"#).await, 10);
    assert_eq!(count(r#"{"status":"open","amount":{"$gte":30}}"#).await, 4);
    let page = format!("{orders}/documents?filter={}&sort=-amount&limit=3", percent(r#"{"status":"open"}"#));
    let (status, body) = get(&client, page).await;
    assert_eq!(status, 200, "{body}");
    let ids: Vec<&str> = body["items"].as_array().unwrap().iter().map(|d| d["id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["o21", "o6", "o27"], "{body}");
    // Writes keep the old index; a new index, counted, agrees with it.
    let res = client.post(format!("{orders}/documents")).json(&json!({"_id": "o31", "status": "open", "amount": 1}));
    assert_eq!(res.send().await.unwrap().status(), 201);
    let res = client.delete(format!("{orders}/documents/o1")).send().await.unwrap();
    assert_eq!(res.status(), 204);
    assert_eq!(count(r#"{"status":"open"}"#).await, 11);
    assert_eq!(count(r#"{"status":"paid"}"#).await, 8);
    let res = client.put(format!("{orders}/indexes/by_status_again")).json(&json!({"fields": ["status", "amount"]}));
    assert_eq!(res.send().await.unwrap().status(), 201);
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        let (_, index) = get(&client, format!("{orders}/indexes/by_status_again")).await;
        if index["state"] == "ready" {
            break;
        }
        assert!(Instant::now() < until, "the new index never became ready: {index}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let res = client.delete(format!("{orders}/indexes/by_status")).send().await.unwrap();
    assert_eq!(res.status(), 204);
    for (filter, n) in [(r#"{"status":"open"}"#, 11), (r#"{"status":"paid"}"#, 8), (r#"{"status":"void"}"#, 10)] {
        assert_eq!(count(filter).await, n, "{filter} along the new index");
    }
    stop(&mut child);
    let (mut child, base) = start_with(dir.path(), KEEP_FIXTURE);
    let (status, body) =
        get(&client, format!("{base}/v1/collections/orders/count?filter={}", percent(r#"{"status":"open"}"#))).await;
    assert_eq!((status, body["count"].as_u64()), (200, Some(11)), "{body}");
    stop(&mut child);
}

/// A data directory of the release before exact numbers in index keys
/// (layout 2, `tests/fixtures/embedded-layout2`), whose entries took the
/// integer 2^63 − 1 and the double 2^63 for one value: once opened, its
/// indexes tell them apart (as MongoDB does), their entries follow writes
/// to the renumbered documents, and a restart changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_store_of_layout_2_opens_with_numbers_told_apart() {
    let dir = tempfile::tempdir().unwrap();
    copy_fixture("embedded-layout2", dir.path());
    let client = reqwest::Client::builder().timeout(Duration::from_secs(20)).build().unwrap();
    let (mut child, base) = start_with(dir.path(), KEEP_FIXTURE);
    let nums = format!("{base}/v1/collections/nums");
    for index in ["by_n", "by_g_n", "u_m"] {
        let (status, body) = get(&client, format!("{nums}/indexes/{index}")).await;
        assert_eq!((status, body["state"].as_str()), (200, Some("ready")), "{body}");
    }
    let count = async |base: &str, filter: &str| {
        let url = format!("{base}/v1/collections/nums/count?filter={}", percent(filter));
        let (status, body) = get(&client, url).await;
        assert_eq!(status, 200, "{filter}: {body}");
        body["count"].as_u64().unwrap()
    };
    let ids = async |base: &str, query: &str| {
        let (status, body) = get(&client, format!("{base}/v1/collections/nums/documents?{query}&limit=100")).await;
        assert_eq!(status, 200, "{query}: {body}");
        body["items"].as_array().unwrap().iter().map(|d| d["id"].as_str().unwrap().to_owned()).collect::<Vec<_>>()
    };
    const MAX: &str = "9223372036854775807";
    const TWO_63: &str = "9223372036854775808";
    let expected_counts = [
        (format!(r#"{{"n":{MAX}}}"#), 2),
        (format!(r#"{{"n":{TWO_63}}}"#), 2),
        (format!(r#"{{"n":{{"$gt":{MAX}}}}}"#), 3),
        (format!(r#"{{"n":{{"$gte":9223372036854775708,"$lt":{MAX}}}}}"#), 1),
        (format!(r#"{{"n":{{"$lte":{MAX}}}}}"#), 4),
        (r#"{"g":"x"}"#.to_owned(), 6),
        (format!(r#"{{"g":"x","n":{{"$gte":{TWO_63}}}}}"#), 3),
        (format!(r#"{{"m":{MAX}}}"#), 1),
    ];
    for (filter, n) in &expected_counts {
        assert_eq!(count(&base, filter).await, *n, "{filter}");
    }
    assert_eq!(ids(&base, "sort=n").await, ["f", "c", "a", "d", "b", "h", "e"]);
    let by_g = format!("filter={}&sort=-n", percent(r#"{"g":"x"}"#));
    assert_eq!(ids(&base, &by_g).await, ["e", "b", "h", "a", "d", "c"]);
    // The renumbered entries follow writes.
    let patch = |id: &str, body: &'static str| {
        client
            .patch(format!("{nums}/documents/{id}"))
            .header("content-type", "application/merge-patch+json")
            .body(body)
            .send()
    };
    assert_eq!(patch("a", r#"{"n":1}"#).await.unwrap().status(), 200);
    assert_eq!(client.delete(format!("{nums}/documents/b")).send().await.unwrap().status(), 204);
    assert_eq!(count(&base, &format!(r#"{{"n":{MAX}}}"#)).await, 1);
    assert_eq!(count(&base, &format!(r#"{{"n":{TWO_63}}}"#)).await, 1);
    assert_eq!(ids(&base, "sort=n").await, ["f", "a", "c", "d", "h", "e"]);
    // The unique index: the renumbered values are still held, and their
    // neighbours are free.
    let res =
        client.post(format!("{nums}/documents")).json(&json!({"_id": "dup", "m": i64::MAX})).send().await.unwrap();
    let body = expect(res, 409).await;
    assert_eq!((body["code"].as_str(), body["existing"].as_str()), (Some("duplicate"), Some("a")), "{body}");
    let res = client.post(format!("{nums}/documents")).json(&json!({"_id": "i", "m": i64::MAX - 1})).send().await;
    assert_eq!(res.unwrap().status(), 201);
    assert_eq!(count(&base, r#"{"m":{"$gte":9223372036854775600}}"#).await, 4);
    stop(&mut child);
    // Opened again: layout 3 already, nothing moves.
    let (mut child, base) = start_with(dir.path(), KEEP_FIXTURE);
    assert_eq!(count(&base, &format!(r#"{{"n":{MAX}}}"#)).await, 1);
    assert_eq!(count(&base, &format!(r#"{{"n":{TWO_63}}}"#)).await, 1);
    assert_eq!(count(&base, r#"{"m":{"$gte":9223372036854775600}}"#).await, 4);
    // `i` has no `n`: indexed as null, first.
    assert_eq!(ids(&base, "sort=n").await, ["i", "f", "a", "c", "d", "h", "e"]);
    stop(&mut child);
}

/// When the fixture's `a` and `b` declared their indexes.
const FIXTURE_DECLARED: &str = "2026-12-06T06:17:09.187Z";

/// A data directory of the release before unique indexes had store names
/// of their own (`tests/fixtures/embedded-shared-unique`), where indexes
/// `email` of collections `a` and `b`, declared in one millisecond, shared
/// one name and so their values: once opened, each collection's values are
/// its own (the shared index is separated and built again), every value a
/// document holds is still held for it, and a restart changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_store_with_a_shared_unique_index_name_is_separated() {
    let dir = tempfile::tempdir().unwrap();
    copy_fixture("embedded-shared-unique", dir.path());
    let client = reqwest::Client::builder().timeout(Duration::from_secs(20)).build().unwrap();
    let (mut child, base) = start_with(dir.path(), KEEP_FIXTURE);
    // Separated at start: declared again under names of their own (as
    // if declared then), and built again from the documents.
    let ready = async |base: &str, coll: &str| {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let (status, body) = get(&client, format!("{base}/v1/collections/{coll}/indexes/email")).await;
            assert_eq!(status, 200, "{body}");
            let separated = body["created_at"].as_str().is_some_and(|at| at > FIXTURE_DECLARED);
            if separated && body["state"] == "ready" {
                break;
            }
            assert!(body["state"] == "building" || body["state"] == "ready", "{coll}: {body}");
            assert!(Instant::now() < deadline, "{coll}'s index never became ready again: {body}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    };
    let create = async |base: &str, coll: &str, id: &str, email: &str| {
        let res = client
            .post(format!("{base}/v1/collections/{coll}/documents"))
            .json(&json!({"_id": id, "email": email}))
            .send()
            .await
            .unwrap();
        let status = res.status().as_u16();
        (status, res.json::<Value>().await.unwrap_or(Value::Null))
    };
    ready(&base, "a").await;
    ready(&base, "b").await;
    // solo's name was its own: left as it was.
    let (_, solo) = get(&client, format!("{base}/v1/collections/solo/indexes/email")).await;
    assert_eq!(
        (solo["state"].as_str(), solo["created_at"].as_str()),
        (Some("ready"), Some("2026-12-06T06:17:09.167Z"))
    );
    // b's value was refused as a's; now it is b's own.
    let (status, body) = create(&base, "b", "b1", "same@example.com").await;
    assert_eq!(status, 201, "{body}");
    // Each collection's documents still hold their values, in their own
    // collection only.
    for (coll, id, email, holder) in [
        ("a", "a2", "same@example.com", "a1"),
        ("b", "b3", "other@example.com", "b2"),
        ("b", "b4", "same@example.com", "b1"),
        ("solo", "s3", "one@example.com", "s1"),
        ("solo", "s4", "two@example.com", "s2"),
    ] {
        let (status, body) = create(&base, coll, id, email).await;
        assert_eq!((status, body["existing"].as_str()), (409, Some(holder)), "{coll}/{id}: {body}");
    }
    assert_eq!(create(&base, "a", "a3", "other@example.com").await.0, 201, "b's value is b's alone");
    assert_eq!(create(&base, "solo", "s5", "same@example.com").await.0, 201);
    stop(&mut child);
    // Opened again: nothing moves.
    let (mut child, base) = start_with(dir.path(), KEEP_FIXTURE);
    ready(&base, "b").await;
    for (coll, id, email, holder) in [
        ("a", "a4", "other@example.com", "a3"),
        ("b", "b5", "same@example.com", "b1"),
        ("solo", "s6", "one@example.com", "s1"),
    ] {
        let (status, body) = create(&base, coll, id, email).await;
        assert_eq!((status, body["existing"].as_str()), (409, Some(holder)), "{coll}/{id}: {body}");
    }
    stop(&mut child);
}

fn percent(s: &str) -> String {
    percent_encoding::utf8_percent_encode(s, percent_encoding::NON_ALPHANUMERIC).to_string()
}

//! `kill -9` of a real gateway process: the embedded store keeps every
//! acknowledged write, and a committed hook is still delivered.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};

use crate::support::{Backend, TestApp, TestReceiver, TestStore, expect, test_config};

/// The real `txgate` binary on the embedded store in `dir`, on a free port.
fn start(dir: &std::path::Path) -> (Child, String) {
    start_with(dir, &[])
}

/// [`start`], with more settings in the environment.
pub fn start_with(dir: &std::path::Path, env: &[(&str, &str)]) -> (Child, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_txgate"))
        .env_clear()
        .env("TXGATE_DATA_DIR", dir)
        .env("TXGATE_LISTEN", "127.0.0.1:0")
        .env("TXGATE_LOG_FORMAT", "json")
        .env("TXGATE_HOOK_ALLOW", "127.0.0.1:*")
        .envs(env.iter().copied())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("txgate starts");
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let parsed: Value = serde_json::from_str(&line).unwrap_or_else(|_| panic!("log line is not JSON: {line}"));
            if parsed["message"] == "txgate listening" {
                let _ = tx.send(parsed["addr"].as_str().unwrap().to_owned());
            }
        }
    });
    let addr = rx.recv_timeout(Duration::from_secs(20)).expect("txgate reports its address");
    (child, format!("http://{addr}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_acknowledged_writes_survive_kill_9() {
    let dir = tempfile::tempdir().unwrap();
    let client = reqwest::Client::new();
    let (mut child, base) = start(dir.path());
    let url = format!("{base}/v1/collections/things/documents");
    // Concurrent writers, so several writes share a group commit.
    let writes: Vec<_> = (0..40)
        .map(|i| {
            let (client, url) = (client.clone(), url.clone());
            tokio::spawn(async move {
                client.post(&url).json(&json!({"_id": format!("t{i:02}"), "i": i})).send().await.unwrap()
            })
        })
        .collect();
    for w in writes {
        assert_eq!(w.await.unwrap().status(), 201);
    }
    let res = client.patch(format!("{url}/t07")).json(&json!({"inc": {"i": 100}})).send().await.unwrap();
    expect(res, 200).await;
    assert_eq!(client.delete(format!("{url}/t08")).send().await.unwrap().status(), 204);
    child.kill().expect("SIGKILL"); // no graceful shutdown
    child.wait().unwrap();

    let (mut child, base) = start(dir.path());
    let url = format!("{base}/v1/collections/things/documents");
    let page = expect(client.get(format!("{url}?limit=100")).send().await.unwrap(), 200).await;
    let items = page["items"].as_array().unwrap();
    assert_eq!(items.len(), 39);
    let t07 = expect(client.get(format!("{url}/t07")).send().await.unwrap(), 200).await;
    assert_eq!((t07["version"].as_i64(), t07["data"]["i"].as_i64()), (Some(2), Some(107)));
    assert_eq!(client.get(format!("{url}/t08")).send().await.unwrap().status(), 410);
    child.kill().unwrap();
    child.wait().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_committed_hook_is_delivered_after_kill_9() {
    let dir = tempfile::tempdir().unwrap();
    let client = reqwest::Client::new();
    // The receiver is down: its port is known, nothing listens there.
    let rx = TestReceiver::start().await;
    let addr = rx.addr;
    rx.stop();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let (mut child, base) = start(dir.path());
    let body = json!({
        "actions": [{"op": "insert", "collection": "orders", "id": "o-1", "data": {"total": 5}}],
        "hooks": [{"url": format!("http://{addr}/paid")}],
    });
    let out = expect(client.post(format!("{base}/v1/transactions")).json(&body).send().await.unwrap(), 200).await;
    let id = format!("{}:0", out["id"].as_str().unwrap());
    // Committed, tried, not delivered.
    let until = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let d = expect(client.get(format!("{base}/v1/deliveries/{id}")).send().await.unwrap(), 200).await;
        if d["status"] == "failed" {
            assert!(d["attempts"][0]["error"].is_string(), "{d}");
            break;
        }
        assert!(std::time::Instant::now() < until, "no failed attempt: {d}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    child.kill().expect("SIGKILL");
    child.wait().unwrap();

    let rx = TestReceiver::start_on(&addr.to_string()).await;
    let (mut child, _base) = start(dir.path());
    let got = rx.next(Duration::from_secs(30)).await;
    assert_eq!((got.path.as_str(), got.header("webhook-id")), ("/paid", id.as_str()));
    assert_eq!(got.json()["id"], out["id"]);
    child.kill().unwrap();
    child.wait().unwrap();
}

/// A unique index's build cut short by `kill -9` is taken over by the
/// restarted gateway at once: the embedded store serves one process, so
/// the dead build's lease (30 s) is not waited out. The index then holds
/// every value exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_a_build_cut_short_by_kill_9_is_taken_over_at_restart() {
    const N: usize = 20_000;
    let dir = tempfile::tempdir().unwrap();
    let client = reqwest::Client::new();
    let (mut child, base) = start(dir.path());
    for chunk in 0..N / 500 {
        let actions: Vec<Value> = (chunk * 500..(chunk + 1) * 500)
            .map(|k| json!({"op": "insert", "collection": "people", "id": format!("p{k:05}"), "data": {"email": format!("u{k}")}}))
            .collect();
        let body = json!({ "actions": actions });
        expect(client.post(format!("{base}/v1/transactions")).json(&body).send().await.unwrap(), 200).await;
    }
    let index = format!("{base}/v1/collections/people/indexes/email");
    let declared = client.put(&index).json(&json!({"fields": ["email"], "unique": true})).send().await.unwrap();
    expect(declared, 201).await;
    // Killed once the build has checked a first part of the documents.
    let until = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let d = expect(client.get(&index).send().await.unwrap(), 200).await;
        assert_eq!(d["state"], "building", "the build ended before it could be cut short: {d}");
        if d["progress"]["done"].as_u64().is_some_and(|done| done > 0) {
            break;
        }
        assert!(std::time::Instant::now() < until, "the build never started: {d}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    child.kill().expect("SIGKILL");
    child.wait().unwrap();

    let (mut child, base) = start(dir.path());
    let restarted = std::time::Instant::now();
    let index = format!("{base}/v1/collections/people/indexes/email");
    let d = loop {
        let d = expect(client.get(&index).send().await.unwrap(), 200).await;
        if d["state"] != "building" {
            break d;
        }
        // The dead build's lease ran for 30 s after its last renewal.
        assert!(restarted.elapsed() < Duration::from_secs(25), "the build waited for the dead one's lease: {d}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(d["state"], "ready", "{d}");
    let docs = format!("{base}/v1/collections/people/documents");
    for k in [0, N / 2, N - 1] {
        let dup = client.post(&docs).json(&json!({"email": format!("u{k}")})).send().await.unwrap();
        let dup = expect(dup, 409).await;
        assert_eq!(
            (dup["code"].as_str(), dup["existing"].as_str()),
            (Some("duplicate"), Some(format!("p{k:05}").as_str()))
        );
    }
    let count = expect(client.get(format!("{base}/v1/collections/people/count")).send().await.unwrap(), 200).await;
    assert_eq!(count["count"].as_u64(), Some(N as u64));
    let filter = json!({"email": "u123"}).to_string();
    let page = client.get(&docs).query(&[("filter", filter.as_str())]).send().await.unwrap();
    let page = expect(page, 200).await;
    assert_eq!(page["items"][0]["id"], "p00123", "{page}");
    assert_eq!(page["items"].as_array().unwrap().len(), 1, "{page}");
    child.kill().unwrap();
    child.wait().unwrap();
}

/// Events a stream handed out before a `kill -9` keep their positions
/// after the restart (only durable positions are served), and a stream
/// resumed with `Last-Event-ID` gets everything after, none lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_events_seen_before_kill_9_keep_their_positions() {
    use crate::support::SseStream;
    let dir = tempfile::tempdir().unwrap();
    let client = reqwest::Client::new();
    let (mut child, base) = start(dir.path());
    let mut stream = SseStream::open_url(&format!("{base}/v1/events"), None).await;
    let url = format!("{base}/v1/collections/ev/documents");
    let writes: Vec<_> = (0..20)
        .map(|i| {
            let (client, url, base) = (client.clone(), url.clone(), base.clone());
            tokio::spawn(async move {
                let res = client.post(&url).json(&json!({"_id": format!("e{i:02}"), "i": i})).send().await.unwrap();
                assert_eq!(res.status(), 201);
                let t = json!({"actions": [
                    {"op": "update", "collection": "ev", "id": format!("e{i:02}"), "set": {"t": 1}},
                    {"op": "insert", "collection": "ev", "id": format!("t{i:02}"), "data": {}},
                ]});
                let res = client.post(format!("{base}/v1/transactions")).json(&t).send().await.unwrap();
                assert_eq!(res.status(), 200);
            })
        })
        .collect();
    // What the stream hands out while the writes go on, then the kill.
    let seen = stream.take(30, Duration::from_secs(10)).await;
    assert_eq!(seen.len(), 30);
    child.kill().unwrap();
    child.wait().unwrap();
    for w in writes {
        let _ = w.await;
    }
    let (mut child, base) = start(dir.path());
    // Every event seen is still at its position.
    let page = client
        .get(format!("{base}/v1/events?after=0&limit=1000"))
        .header("accept", "application/json")
        .send()
        .await
        .unwrap();
    let page = expect(page, 200).await;
    let logged: std::collections::HashMap<u64, Value> =
        page["items"].as_array().unwrap().iter().map(|e| (e["seq"].as_u64().unwrap(), e.clone())).collect();
    for e in &seen {
        let seq = e.data["seq"].as_u64().unwrap();
        assert_eq!(logged.get(&seq), Some(&e.data), "event at {seq} changed across the crash");
    }
    // Resumed from the last one seen: the rest, in order, none lost.
    let last = seen.last().unwrap().id.clone().unwrap();
    let mut resumed = SseStream::open_url(&format!("{base}/v1/events"), Some(&last)).await;
    let expected: Vec<u64> = {
        let mut after: Vec<u64> = logged.keys().copied().filter(|s| *s > last.parse::<u64>().unwrap()).collect();
        after.sort_unstable();
        after
    };
    let rest = resumed.take(expected.len(), Duration::from_secs(10)).await;
    let got: Vec<u64> = rest.iter().map(|e| e.data["seq"].as_u64().unwrap()).collect();
    assert_eq!(got, expected);
    child.kill().unwrap();
    child.wait().unwrap();
}

/// A stop waits for requests and webhook attempts in flight no longer
/// than `TXGATE_SHUTDOWN_TIMEOUT_MS`: a receiver that hangs and a client
/// that never finishes its body do not hold it past an orchestrator's
/// grace period. The store is still closed cleanly, and the abandoned
/// delivery is sent again by the next start once its claim runs out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_a_stop_waits_no_longer_than_its_timeout() {
    use tokio::io::AsyncWriteExt;
    let dir = tempfile::tempdir().unwrap();
    let client = reqwest::Client::new();
    let receiver = TestReceiver::start().await;
    receiver.delay(Duration::from_secs(60));
    let env = [("TXGATE_SHUTDOWN_TIMEOUT_MS", "1500"), ("TXGATE_HOOK_TIMEOUT_MS", "6000")];
    let (mut child, base) = start_with(dir.path(), &env);
    let txn = json!({
        "actions": [{"op": "insert", "collection": "orders", "id": "o1", "data": {}}],
        "hooks": [{"url": receiver.url("/hook")}],
    });
    let res = client.post(format!("{base}/v1/transactions")).json(&txn).send().await.unwrap();
    assert_eq!(res.status(), 200);
    // A request whose body never comes (the body timeout is 10 s).
    let mut slow = tokio::net::TcpStream::connect(base.trim_start_matches("http://")).await.unwrap();
    let head = "POST /v1/collections/orders/documents HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{\"_id\":";
    slow.write_all(head.as_bytes()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let started = std::time::Instant::now();
    crate::upgrade::stop(&mut child);
    let took = started.elapsed();
    assert!(took < Duration::from_millis(1500 + 1500), "the stop took {took:?}");
    assert!(took >= Duration::from_millis(1000), "the stop waited for what was in flight: {took:?}");
    // Closed cleanly: nothing to replay.
    let journal = dir.path().join("txgate.journal");
    assert_eq!(crate::power::entry_offsets(&std::fs::read(&journal).unwrap()), Vec::<usize>::new());
    // The delivery is sent again once its claim (6 s + 5 s) runs out.
    receiver.delay(Duration::ZERO);
    let (mut child, _) = start_with(dir.path(), &env);
    let got = receiver.next(Duration::from_secs(30)).await;
    assert_eq!(got.path, "/hook");
    assert!(got.json().to_string().contains("\"o1\""), "{}", got.json());
    crate::upgrade::stop(&mut child);
}

crate::on_both_backends!(a_background_pass_does_not_hold_a_stop_past_its_timeout,);

/// Holds, once armed, every read of `_subscriptions` until the gateway
/// ends: a subscriptions pass that never finishes.
struct HoldPasses {
    armed: std::sync::atomic::AtomicBool,
    holding: tokio::sync::Notify,
}

impl txgate_store::layer::Layer for HoldPasses {
    fn inspects(&self) -> bool {
        true
    }

    async fn around<T: Send>(
        &self,
        _below: &dyn txgate_store::Store,
        op: &txgate_store::layer::Op<'_>,
        run: impl Future<Output = txgate_store::StoreResult<T>> + Send,
    ) -> txgate_store::StoreResult<T> {
        if op.coll == "_subscriptions" && self.armed.load(std::sync::atomic::Ordering::SeqCst) {
            self.holding.notify_one();
            std::future::pending::<()>().await;
        }
        run.await
    }
}

/// A background pass still under way at the stop's timeout is stopped
/// where it is, shortly after: a pass over a large backlog (or a store
/// that hangs in the middle of one) does not hold the stop past an
/// orchestrator's grace period.
async fn a_background_pass_does_not_hold_a_stop_past_its_timeout(backend: Backend) {
    use std::sync::Arc;
    let Some(ts) = TestStore::new(backend).await else { return };
    let layer = HoldPasses { armed: Default::default(), holding: tokio::sync::Notify::new() };
    let held = Arc::new(txgate_store::layer::Layered::new(Arc::clone(&ts.store), layer));
    let store: txgate_store::DynStore = held.clone();
    let mut config = test_config(ts.config.clone());
    config.shutdown_timeout = Duration::from_millis(300);
    // Reads time out long after the stop should have ended.
    config.txn.store_timeout = Duration::from_secs(60);
    let app = TestApp::on_store(config, store, Some(ts)).await;
    let holding = held.layer().holding.notified();
    held.layer().armed.store(true, std::sync::atomic::Ordering::SeqCst);
    // An append wakes the subscriptions pass, which then reads on forever.
    expect(app.post("/v1/collections/orders/documents", &json!({"_id": "o1"})).await, 201).await;
    tokio::time::timeout(Duration::from_secs(10), holding).await.expect("the pass reads its subscriptions");
    let started = std::time::Instant::now();
    app.stop().await;
    let took = started.elapsed();
    assert!(took < Duration::from_millis(300 + 500 + 1500), "the stop took {took:?}");
}

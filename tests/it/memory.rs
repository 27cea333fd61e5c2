//! A memory ceiling you can state: a real gateway process, at default
//! settings, under hostile streams (50 clients that open a stream from
//! position 0 and never read it, 20 filtered streams from position 0 over
//! 100,000 events) while another key writes, stays under 1 GiB of resident
//! memory, its 256 MiB cache included (docs/operating.md, "Memory").
//!
//! The events are seeded through the store, as the gateway's writers append
//! them, before the gateway starts. A thread samples the process's VmRSS
//! every 100 ms and kills it past the bound; the kernel's own high-water
//! mark (VmHWM) is what is asserted.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde_json::json;
use tokio::io::AsyncWriteExt;
use txgate::config::StoreConfig;
use txgate::testing::document::StoredDoc;
use txgate::testing::events::model::document_event;
use txgate::testing::events::{EVENTS, EventType, log_entry};
use txgate_store::{DateTime, DynStore, doc};

use crate::restart::start_with;
use crate::support::{Backend, TestStore};

crate::on_both_backends!(hostile_streams_stay_under_the_memory_ceiling);

const SEEDED: usize = 100_000;
const CEILING: u64 = 1 << 30;
const STALLED: usize = 50;
const FILTERED: usize = 20;
/// How long the hostile load runs.
const LOAD: Duration = Duration::from_secs(25);
const READER: &str = "memory-reader-key-0123456789";
const WRITER: &str = "memory-writer-key-0123456789";
const ADMIN: &str = "memory-admin-key-0123456789";

/// `n` creations of documents of `big` (group `g` = i mod 10, 300 bytes
/// of padding each) as their writers log them.
async fn seed(store: &DynStore, n: usize) {
    let at = DateTime::now();
    for chunk in 0..n.div_ceil(1000) {
        let mut records = Vec::with_capacity(1000);
        for i in chunk * 1000..((chunk + 1) * 1000).min(n) {
            let id = format!("d{i:06}");
            let data = doc! {"g": (i % 10) as i64, "pad": "x".repeat(300)};
            let d = StoredDoc::new_live(id.clone(), data, 1, 1, at);
            let event = document_event(EventType::Created, "big", &d, None, None, None, at);
            records.push(log_entry("big", &id, 1, &event, at).expect("an event record").0);
        }
        let appended = store.append_all(EVENTS, records).await.expect("seeded");
        assert!(appended.iter().all(|a| *a), "each event appended once");
    }
    store.sync().await.expect("synced");
}

/// A kilobyte figure of `/proc/<pid>/status` (`VmRSS`, `VmHWM`), in bytes.
fn status_bytes(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with(field))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

async fn hostile_streams_stay_under_the_memory_ceiling(backend: Backend) {
    let Some(ts) = TestStore::new(backend).await else { return };
    let started = Instant::now();
    seed(&ts.store, SEEDED).await;
    eprintln!("seeded {SEEDED} events in {:?}", started.elapsed());
    let TestStore { store, config, _dir } = ts;
    drop(store);
    let keys = format!("{READER}:read,{WRITER}:write@other,{ADMIN}:admin");
    let spare = tempfile::tempdir().unwrap();
    let (dir, mut env) = match &config {
        StoreConfig::Embedded { data_dir, .. } => {
            // The seeding store let go of the database file when dropped.
            let file = std::fs::File::open(data_dir.join(txgate_store::embedded::DATABASE_FILE)).unwrap();
            let lock = rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive);
            assert!(lock.is_ok(), "a dropped store still holds its file: {lock:?}");
            drop(file);
            (data_dir.clone(), Vec::new())
        }
        StoreConfig::Mongodb { uri, database } => (
            spare.path().to_owned(),
            vec![("TXGATE_MONGODB_URI", uri.clone()), ("TXGATE_MONGODB_DATABASE", database.clone())],
        ),
    };
    env.push(("TXGATE_API_KEYS", keys));
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let (mut child, base) = start_with(&dir, &env);
    let pid = child.id();

    // The sampler: VmRSS every 100 ms; past the ceiling the process is
    // killed (the assertion below then fails on its high-water mark).
    let done = Arc::new(AtomicBool::new(false));
    let peak = Arc::new(AtomicU64::new(0));
    let sampler = {
        let (done, peak) = (Arc::clone(&done), Arc::clone(&peak));
        std::thread::spawn(move || {
            while !done.load(Ordering::SeqCst) {
                let Some(rss) = status_bytes(pid, "VmRSS:") else { return };
                peak.fetch_max(rss, Ordering::SeqCst);
                if rss > CEILING {
                    let _ = std::process::Command::new("kill").args(["-9", &pid.to_string()]).status();
                    return;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        })
    };

    // A filtered stream's filter is served by an index, as a query's is.
    let client = reqwest::Client::new();
    let index = format!("{base}/v1/collections/big/indexes/by_g");
    let res = client.put(&index).bearer_auth(ADMIN).json(&json!({"fields": ["g"]})).send().await.unwrap();
    assert!(res.status().is_success(), "{}", res.status());
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let index: serde_json::Value =
            client.get(&index).bearer_auth(ADMIN).send().await.unwrap().json().await.unwrap();
        if index["state"] == "ready" {
            break;
        }
        assert!(Instant::now() < deadline, "by_g never became ready: {index}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // Clients that open a stream from the start of the log and never read.
    let addr = base.strip_prefix("http://").unwrap().to_owned();
    let mut stalled = Vec::new();
    for _ in 0..STALLED {
        let mut conn = tokio::net::TcpStream::connect(&addr).await.unwrap();
        let request = format!(
            "GET /v1/events?after=0 HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {READER}\r\nAccept: text/event-stream\r\n\r\n"
        );
        conn.write_all(request.as_bytes()).await.unwrap();
        stalled.push(conn);
    }
    // Filtered streams from the start of the log, read as fast as they come.
    let received = Arc::new(AtomicUsize::new(0));
    let filter = percent_encoding::utf8_percent_encode(r#"{"g":1}"#, percent_encoding::NON_ALPHANUMERIC).to_string();
    let mut readers = Vec::new();
    for _ in 0..FILTERED {
        let url = format!("{base}/v1/events?after=0&collections=big&filter={filter}");
        let (client, received) = (client.clone(), Arc::clone(&received));
        readers.push(tokio::spawn(async move {
            let res = client.get(url).bearer_auth(READER).send().await.unwrap();
            assert_eq!(res.status(), 200, "{}", res.text().await.unwrap_or_default());
            let mut res = res;
            while let Ok(Some(chunk)) = res.chunk().await {
                let events = chunk.windows(4).filter(|w| w == b"id: ").count();
                received.fetch_add(events, Ordering::Relaxed);
            }
        }));
    }
    // Meanwhile another key's writes are served.
    let until = Instant::now() + LOAD;
    let mut writes = 0;
    let mut slowest = Duration::ZERO;
    while Instant::now() < until {
        let sent = Instant::now();
        let res = client
            .post(format!("{base}/v1/collections/other/documents"))
            .bearer_auth(WRITER)
            .json(&json!({"n": writes}))
            .timeout(Duration::from_secs(10))
            .send()
            .await
            .unwrap_or_else(|e| panic!("write {writes} under the load: {e}"));
        assert_eq!(res.status(), 201, "write {writes}: {}", res.text().await.unwrap_or_default());
        slowest = slowest.max(sent.elapsed());
        writes += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let hwm = status_bytes(pid, "VmHWM:");
    done.store(true, Ordering::SeqCst);
    sampler.join().unwrap();
    let alive = child.try_wait().unwrap().is_none();
    let _ = child.kill();
    let _ = child.wait();
    for reader in readers {
        reader.abort();
    }
    drop(stalled);
    let received = received.load(Ordering::Relaxed);
    eprintln!(
        "{backend:?}: peak VmRSS {} MiB, VmHWM {:?} MiB, {writes} writes (slowest {slowest:?}), {received} filtered events read",
        peak.load(Ordering::SeqCst) >> 20,
        hwm.map(|b| b >> 20)
    );
    assert!(alive, "the gateway died (killed past {} MiB?)", CEILING >> 20);
    let hwm = hwm.expect("the gateway's VmHWM");
    assert!(hwm <= CEILING, "VmHWM {} MiB over the {} MiB ceiling", hwm >> 20, CEILING >> 20);
    assert!(received > 0, "the filtered streams read events");
}

/// Counts the reads of the log's events at once, each made slow.
struct SlowLog {
    /// Counting from when every stream has opened (opening reads the head).
    armed: AtomicBool,
    now: AtomicUsize,
    most: AtomicUsize,
}

impl txgate_store::layer::Layer for SlowLog {
    async fn around<T: Send>(
        &self,
        _below: &dyn txgate_store::Store,
        op: &txgate_store::layer::Op<'_>,
        run: impl Future<Output = txgate_store::StoreResult<T>> + Send,
    ) -> txgate_store::StoreResult<T> {
        if op.coll != EVENTS || op.name != "scan" || !self.armed.load(Ordering::SeqCst) {
            return run.await;
        }
        let now = self.now.fetch_add(1, Ordering::SeqCst) + 1;
        self.most.fetch_max(now, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(50)).await;
        let out = run.await;
        self.now.fetch_sub(1, Ordering::SeqCst);
        out
    }
}

/// Streams far behind the head read the store a few at a time
/// (`CATCH_UP_READS`, 4 per instance), however many there are, and each
/// still gets every event: twenty streams opened at position 0 over a log
/// whose every read is slow never have more than nine reads of it in
/// flight (four catching up, one filling the recent reads, the instance's
/// own workers), where each read its own before (21 at once).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_catching_up_read_a_few_at_a_time() {
    const EVENTS_SEEDED: usize = 6_000;
    const STREAMS: usize = 20;
    let ts = TestStore::new(Backend::Embedded).await.unwrap();
    seed(&ts.store, EVENTS_SEEDED).await;
    let slow = Arc::new(txgate_store::layer::Layered::new(
        Arc::clone(&ts.store),
        SlowLog { armed: AtomicBool::new(false), now: AtomicUsize::new(0), most: AtomicUsize::new(0) },
    ));
    let config = crate::support::test_config(ts.config.clone());
    let app = crate::support::TestApp::on_store(config, slow.clone(), Some(ts)).await;
    // A stream at the head, and a write it sees: the recent reads every
    // stream shares then hold the head, and the streams below read the
    // store themselves.
    let mut head = app.client.get(format!("{}/v1/events", app.base)).send().await.unwrap();
    assert_eq!(head.status(), 200);
    let _ = head.chunk().await.unwrap().expect("the stream's position");
    crate::support::expect(app.post("/v1/collections/big/documents", &json!({"_id": "new"})).await, 201).await;
    let seen = tokio::time::timeout(Duration::from_secs(10), head.chunk()).await.unwrap().unwrap().unwrap();
    assert!(seen.windows(4).any(|w| w == b"id: "), "the head stream sees the write");
    let opened = Arc::new(tokio::sync::Barrier::new(STREAMS + 1));
    let readers: Vec<_> = (0..STREAMS)
        .map(|_| {
            let (client, url) = (app.client.clone(), format!("{}/v1/events?after=0&collections=big", app.base));
            let opened = Arc::clone(&opened);
            tokio::spawn(async move {
                let mut res = client.get(url).send().await.unwrap();
                assert_eq!(res.status(), 200);
                opened.wait().await;
                let (mut seen, mut tail) = (0, Vec::new());
                // The seeded events, then the write's.
                while seen < EVENTS_SEEDED + 1 {
                    let chunk = tokio::time::timeout(Duration::from_secs(60), res.chunk())
                        .await
                        .expect("events keep coming")
                        .unwrap()
                        .expect("the stream goes on");
                    tail.extend_from_slice(&chunk);
                    seen += tail.windows(4).filter(|w| w == b"id: ").count();
                    // A marker cut between two reads is counted with the next.
                    tail.drain(..tail.len().saturating_sub(3));
                }
                seen
            })
        })
        .collect();
    opened.wait().await;
    slow.layer().armed.store(true, Ordering::SeqCst);
    for reader in readers {
        assert_eq!(reader.await.unwrap(), EVENTS_SEEDED + 1, "every event, once");
    }
    let most = slow.layer().most.load(Ordering::SeqCst);
    // Four catching up, one filling the recent reads, and the instance's
    // own readers of the log (the count fold, the head's reads, the purge).
    assert!(most <= 9, "{most} reads of the log at once");
    drop(head);
    app.stop().await;
}

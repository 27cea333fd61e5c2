//! `bench live`: filtered live views under load, against a gateway running
//! as its own process (the `txgate` binary beside this one).
//!
//! `views` clients each keep a live view of the documents whose `g` is 1
//! (a quarter of `POOL`, served by an index on `g`): each reads its first
//! page's position from a count and follows the filtered events from
//! there over Server-Sent Events. Writers then `PATCH` random documents at
//! `rate` per second for `seconds`, each setting a random `g` (so a change
//! moves a document into the set, within it, out of it, or stays outside)
//! and the time of the write. Printed: commit -> view update lag (the
//! event's commit time to its arrival at a view; every arrival), how many
//! changes each view received against how many concerned the set, and the
//! gateway's CPU per change per view.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use rand::Rng;
use serde_json::json;

use super::events::{Child, Lags, event_at, now_ms, stream};
use super::progress;

/// Documents the writes go over.
const POOL: usize = 2000;
const COLL: &str = "livebench";

pub struct LiveArgs {
    pub mongodb_uri: Option<String>,
    pub views: usize,
    pub rate: f64,
    pub seconds: f64,
}

pub async fn run(args: LiveArgs) {
    let gw = Child::start(args.mongodb_uri.as_deref()).await;
    let base = gw.base.clone();
    let client = reqwest::Client::new();
    progress(&format!("live: {POOL} documents, an index on g"));
    for i in 0..POOL {
        let res = client
            .post(format!("{base}/v1/collections/{COLL}/documents"))
            .json(&json!({"_id": format!("d{i}"), "g": i % 4, "at": 0}))
            .send()
            .await;
        assert_eq!(res.expect("create").status(), 201);
    }
    let res = client
        .put(format!("{base}/v1/collections/{COLL}/indexes/by_g"))
        .json(&json!({"fields": ["g"]}))
        .send()
        .await
        .expect("index");
    assert_eq!(res.status(), 201);
    loop {
        let index: serde_json::Value = client
            .get(format!("{base}/v1/collections/{COLL}/indexes/by_g"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        if index["state"] == "ready" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let filter = json!({"g": 1}).to_string();
    let counted: serde_json::Value = client
        .get(format!("{base}/v1/collections/{COLL}/count"))
        .query(&[("filter", &filter)])
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let position = counted["position"].as_u64().expect("a position");
    println!(
        "live views: {} store, {} views of {} of {POOL} documents (g = 1), PATCHes at {:.0}/s for {:.0} s, gateway in its own process",
        if args.mongodb_uri.is_some() { "mongodb" } else { "embedded" },
        args.views,
        counted["count"],
        args.rate,
        args.seconds
    );

    let lags = Arc::new(Lags::new());
    let received = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let url = format!("{base}/v1/events?collections={COLL}&filter={}", url_escape(&filter));
    let views: Vec<_> = (0..args.views)
        .map(|_| {
            let (lags, received, stop) = (Arc::clone(&lags), Arc::clone(&received), Arc::clone(&stop));
            tokio::spawn(stream(url.clone(), Some(position), Arc::new(AtomicBool::new(false)), stop, move |data| {
                received.fetch_add(1, Ordering::Relaxed);
                if let Some(at) = event_at(data) {
                    lags.add((now_ms() - at).max(0) as u64);
                }
            }))
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(500)).await;

    // The set as the writers move it: which documents are in it, and how
    // many changes concerned it (entered, changed within, left).
    let in_set: Arc<Vec<AtomicBool>> = Arc::new((0..POOL).map(|i| AtomicBool::new(i % 4 == 1)).collect());
    let concerned = Arc::new(AtomicUsize::new(0));
    let written = Arc::new(AtomicUsize::new(0));
    let gw_pid = gw.process.id().to_string();
    let cpu_before = super::scale::cpu_time(&gw_pid);
    let started = Instant::now();
    let until = started + Duration::from_secs_f64(args.seconds);
    // One writer per document slice, so that a document's writes are
    // answered in order and the set is known exactly.
    const WRITERS: usize = 32;
    let next = Arc::new(AtomicUsize::new(0));
    let writers: Vec<_> = (0..WRITERS)
        .map(|w| {
            let (client, base, next) = (client.clone(), base.clone(), Arc::clone(&next));
            let (in_set, concerned, written) = (Arc::clone(&in_set), Arc::clone(&concerned), Arc::clone(&written));
            let rate = args.rate;
            tokio::spawn(async move {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let due = started + Duration::from_secs_f64(i as f64 / rate);
                    if due >= until {
                        return;
                    }
                    tokio::time::sleep_until(due.into()).await;
                    let (doc, g) = {
                        let mut rng = rand::rng();
                        (rng.random_range(0..POOL / WRITERS) * WRITERS + w, rng.random_range(0..4))
                    };
                    let res = client
                        .patch(format!("{base}/v1/collections/{COLL}/documents/d{doc}"))
                        .json(&json!({"set": {"g": g, "at": now_ms()}}))
                        .send()
                        .await;
                    if res.is_ok_and(|r| r.status() == 200) {
                        written.fetch_add(1, Ordering::Relaxed);
                        let was = in_set[doc].swap(g == 1, Ordering::Relaxed);
                        if was || g == 1 {
                            concerned.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
            })
        })
        .collect();
    for w in writers {
        w.await.expect("writer");
    }
    // Let the views take the last changes.
    let expected = concerned.load(Ordering::Relaxed) as u64 * args.views as u64;
    let deadline = Instant::now() + Duration::from_secs(10);
    while received.load(Ordering::Relaxed) < expected && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let cpu = super::scale::cpu_time(&gw_pid) - cpu_before;
    stop.store(true, Ordering::SeqCst);
    for v in views {
        let _ = v.await;
    }
    let got = received.load(Ordering::Relaxed);
    let n = written.load(Ordering::Relaxed);
    println!(
        "  {n} writes answered ({:.0}/s), {} of them concerned the set; the views received {got} changes, {} expected ({:.1} per view per second)",
        n as f64 / args.seconds,
        concerned.load(Ordering::Relaxed),
        expected,
        got as f64 / args.views as f64 / args.seconds
    );
    println!(
        "  commit -> view update: p50 {} ms, p99 {} ms, max {} ms (target p99 < 100 ms; every arrival, {} of them)",
        lags.percentile(0.5),
        lags.percentile(0.99),
        lags.percentile(1.0),
        lags.count()
    );
    println!(
        "  gateway CPU: {:.1} s over the run ({:.0}% of one core; the machine has {}), {:.1} us per change per view",
        cpu.as_secs_f64(),
        cpu.as_secs_f64() / args.seconds * 100.0,
        std::thread::available_parallelism().map_or(1, |n| n.get()),
        cpu.as_secs_f64() * 1e6 / (got.max(1) as f64)
    );
    println!("live txgate p99_ms {}", lags.percentile(0.99));
    println!("live txgate cpu_us_per_change_per_view {:.2}", cpu.as_secs_f64() * 1e6 / (got.max(1) as f64));
}

/// `text` for a URL's query.
fn url_escape(text: &str) -> String {
    text.bytes()
        .map(|b| if b.is_ascii_alphanumeric() { (b as char).to_string() } else { format!("%{b:02X}") })
        .collect()
}

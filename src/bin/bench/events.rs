//! `bench events`: change events under load, against a gateway running
//! as its own process (the `txgate` binary beside this one), so that its
//! memory is measured alone.
//!
//! 1. Commit throughput (single-document `PATCH`es from `clients` clients
//!    as fast as they are answered) with no event stream attached, then
//!    with `streams` Server-Sent Events streams attached.
//! 2. Commit -> SSE arrival lag (the event's `at` to its arrival on each
//!    stream) at `rate` commits per second with the streams attached.
//! 3. One more stream that reads nothing for `pause` seconds under that
//!    load: the gateway's resident memory each second, then everything the
//!    stream missed, read to the end.
//! 4. Subscription deliveries per second to a local receiver.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::json;

use super::progress;

/// Documents the writes rotate over.
const POOL: usize = 2000;

pub struct EventArgs {
    pub mongodb_uri: Option<String>,
    pub streams: usize,
    pub rate: f64,
    pub seconds: f64,
    pub pause: f64,
    pub clients: usize,
    pub deliveries: usize,
}

/// The gateway process.
pub(super) struct Child {
    pub process: std::process::Child,
    pub base: String,
    dir: std::path::PathBuf,
}

impl Child {
    pub async fn start(mongodb_uri: Option<&str>) -> Self {
        let database = format!("bench_{}", uuid::Uuid::now_v7().simple());
        Self::start_on(mongodb_uri.map(|uri| (uri, database.as_str()))).await
    }

    /// [`Child::start`], on `database` of the MongoDB at the URI (several
    /// gateways on one database share its work).
    pub async fn start_on(mongodb: Option<(&str, &str)>) -> Self {
        Self::start_with(mongodb, &[]).await
    }

    /// [`Child::start_on`], with the variables `env` set too.
    pub async fn start_with(mongodb: Option<(&str, &str)>, env: &[(&str, String)]) -> Self {
        let exe = std::env::current_exe().expect("own path");
        let bin = exe.with_file_name("txgate");
        assert!(bin.exists(), "{} not found: build it (cargo build --release --bins)", bin.display());
        let dir = super::tempfile_dir();
        let port = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port").local_addr().unwrap().port();
        let mut cmd = std::process::Command::new(bin);
        cmd.env("TXGATE_LISTEN", format!("127.0.0.1:{port}"))
            .env("TXGATE_DATA_DIR", &dir)
            .env("TXGATE_HOOK_ALLOW", "127.0.0.1:*")
            .env("RUST_LOG", "warn")
            .stdout(std::process::Stdio::null());
        cmd.envs(env.iter().map(|(k, v)| (*k, v.as_str())));
        match mongodb {
            Some((uri, database)) => {
                cmd.env("TXGATE_MONGODB_URI", uri).env("TXGATE_MONGODB_DATABASE", database);
            }
            None => {
                cmd.env_remove("TXGATE_MONGODB_URI");
            }
        }
        let process = cmd.spawn().expect("the gateway starts");
        let base = format!("http://127.0.0.1:{port}");
        let client = reqwest::Client::new();
        while client.get(format!("{base}/readyz")).send().await.map(|r| r.status().as_u16()).unwrap_or(0) != 200 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Self { process, base, dir }
    }

    /// Resident memory, in MiB.
    pub(super) fn rss_mib(&self) -> f64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.process.id())).unwrap_or_default();
        let kb: f64 = status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0);
        kb / 1024.0
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.process.kill();
        let _ = self.process.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Lags of every event on every stream, in whole milliseconds (a bounded
/// histogram: 100 streams at 1,000 events/s for minutes would otherwise
/// make this process the memory figure's noise).
pub(super) struct Lags {
    buckets: Vec<AtomicU64>,
}

impl Lags {
    pub fn new() -> Self {
        Self { buckets: (0..10_001).map(|_| AtomicU64::new(0)).collect() }
    }
    pub fn add(&self, lag_ms: u64) {
        self.buckets[(lag_ms as usize).min(10_000)].fetch_add(1, Ordering::Relaxed);
    }
    pub fn reset(&self) {
        for b in &self.buckets {
            b.store(0, Ordering::Relaxed);
        }
    }
    pub fn count(&self) -> u64 {
        self.buckets.iter().map(|b| b.load(Ordering::Relaxed)).sum()
    }
    /// The lag below which `p` of them lie, in ms (at most 1 ms coarse).
    pub fn percentile(&self, p: f64) -> u64 {
        let total = self.count();
        let want = ((total as f64) * p).ceil() as u64;
        let mut seen = 0;
        for (ms, b) in self.buckets.iter().enumerate() {
            seen += b.load(Ordering::Relaxed);
            if seen >= want.max(1) {
                return ms as u64;
            }
        }
        10_000
    }
}

pub(super) fn now_ms() -> i64 {
    (time::OffsetDateTime::now_utc().unix_timestamp_nanos() / 1_000_000) as i64
}

/// The `at` of one event's JSON, in Unix ms, without parsing the rest.
pub(super) fn event_at(data: &[u8]) -> Option<i64> {
    let data = std::str::from_utf8(data).ok()?;
    let start = data.find("\"at\":\"")? + 6;
    let end = start + data[start..].find('"')?;
    let at = time::OffsetDateTime::parse(&data[start..end], &time::format_description::well_known::Rfc3339).ok()?;
    Some((at.unix_timestamp_nanos() / 1_000_000) as i64)
}

/// The `seq` of one event's JSON.
fn event_seq(data: &[u8]) -> Option<u64> {
    let data = std::str::from_utf8(data).ok()?;
    let start = data.find("\"seq\":")? + 6;
    let digits: String = data[start..].chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

/// Of the events each stream receives, the one in this many whose lag is
/// taken: the readers share the gateway's two cores, so they do as little
/// as a client can (find each `data:` line) for the others.
const LAG_SAMPLE: u64 = 10;

/// One SSE stream: every `data:` line's event handed to `each`, until
/// `stop`; `paused` holds reading back (the socket fills, the gateway's
/// stream waits).
pub(super) async fn stream(
    url: String,
    after: Option<u64>,
    paused: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
    each: impl FnMut(&[u8]) + Send,
) {
    let client = reqwest::Client::new();
    let mut req = client.get(&url);
    if let Some(after) = after {
        req = req.header("last-event-id", after.to_string());
    }
    let res = req.send().await.expect("stream opens");
    assert_eq!(res.status(), 200, "stream status");
    data_lines(res, &paused, &stop, each).await;
}

/// Each `data:` line of the Server-Sent Events body of `res` handed to
/// `each`, until `stop` or the body ends; `paused` holds reading back.
pub(super) async fn data_lines(
    mut res: reqwest::Response,
    paused: &AtomicBool,
    stop: &AtomicBool,
    mut each: impl FnMut(&[u8]) + Send,
) {
    let mut buf: Vec<u8> = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        if paused.load(Ordering::Relaxed) {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        }
        let chunk = match tokio::time::timeout(Duration::from_millis(200), res.chunk()).await {
            Ok(Ok(Some(chunk))) => chunk,
            Ok(_) => return,
            Err(_) => continue,
        };
        buf.extend_from_slice(&chunk);
        let mut start = 0;
        while let Some(nl) = buf[start..].iter().position(|b| *b == b'\n') {
            if let Some(data) = buf[start..start + nl].strip_prefix(b"data:") {
                each(data);
            }
            start += nl + 1;
        }
        buf.drain(..start);
    }
}

/// Writes: single-document `PATCH`es over the pool, by `clients` clients,
/// at `rate` per second in all (`None`: as fast as they are answered),
/// for `seconds`. Returns how many were answered 200.
async fn write(base: &str, clients: usize, rate: Option<f64>, seconds: f64) -> usize {
    let client = reqwest::Client::new();
    let done = Arc::new(AtomicUsize::new(0));
    let next = Arc::new(AtomicUsize::new(0));
    let until = Instant::now() + Duration::from_secs_f64(seconds);
    let started = Instant::now();
    let tasks: Vec<_> = (0..clients)
        .map(|_| {
            let (client, done, next, base) = (client.clone(), Arc::clone(&done), Arc::clone(&next), base.to_owned());
            tokio::spawn(async move {
                while Instant::now() < until {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if let Some(rate) = rate {
                        // Open loop: write i is due at i / rate.
                        let due = started + Duration::from_secs_f64(i as f64 / rate);
                        if due >= until {
                            return;
                        }
                        tokio::time::sleep_until(due.into()).await;
                    }
                    let url = format!("{base}/v1/collections/evbench/documents/d{}", i % POOL);
                    let res = client.patch(&url).json(&json!({"inc": {"n": 1}})).send().await;
                    if res.is_ok_and(|r| r.status() == 200) {
                        done.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.expect("writer");
    }
    done.load(Ordering::Relaxed)
}

/// The `next` of the JSON page of up to 1,000 events after `after`.
async fn last_position(client: &reqwest::Client, base: &str, after: u64) -> u64 {
    let page: serde_json::Value = client
        .get(format!("{base}/v1/events?limit=1000&after={after}"))
        .header("accept", "application/json")
        .send()
        .await
        .expect("page")
        .json()
        .await
        .expect("page JSON");
    page["next"].as_u64().unwrap_or(after)
}

pub async fn run(args: EventArgs) {
    let gw = Child::start(args.mongodb_uri.as_deref()).await;
    let base = gw.base.clone();
    let client = reqwest::Client::new();
    progress(&format!("events: {POOL} documents"));
    for i in 0..POOL {
        let res = client
            .post(format!("{base}/v1/collections/evbench/documents"))
            .json(&json!({"_id": format!("d{i}"), "n": 0}))
            .send()
            .await;
        assert_eq!(res.expect("create").status(), 201);
    }
    println!(
        "change events: {} store, single-document PATCHes over {POOL} documents, gateway in its own process",
        if args.mongodb_uri.is_some() { "mongodb" } else { "embedded" }
    );

    // 1. Throughput without and with streams.
    progress("events: throughput, no stream attached");
    let gw_pid = gw.process.id().to_string();
    let cpu = || (super::scale::cpu_time(&gw_pid), super::scale::cpu_time("self"));
    let share = |before: (Duration, Duration), after: (Duration, Duration)| {
        let per = |a: Duration, b: Duration| (b - a).as_secs_f64() / args.seconds * 100.0;
        (per(before.0, after.0), per(before.1, after.1))
    };
    let at = cpu();
    let bare = write(&base, args.clients, None, args.seconds).await as f64 / args.seconds;
    let (bare_gw, bare_bench) = share(at, cpu());
    let lags = Arc::new(Lags::new());
    let stop = Arc::new(AtomicBool::new(false));
    let mut streams = Vec::new();
    for _ in 0..args.streams {
        let (lags, stop) = (Arc::clone(&lags), Arc::clone(&stop));
        let url = format!("{base}/v1/events");
        let mut n = 0u64;
        streams.push(tokio::spawn(stream(url, None, Arc::new(AtomicBool::new(false)), stop, move |data| {
            n += 1;
            if n % LAG_SAMPLE == 0 {
                if let Some(at) = event_at(data) {
                    lags.add((now_ms() - at).max(0) as u64);
                }
            }
        })));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    progress(&format!("events: throughput, {} streams attached", args.streams));
    let at = cpu();
    let attached = write(&base, args.clients, None, args.seconds).await as f64 / args.seconds;
    let (attached_gw, attached_bench) = share(at, cpu());
    println!(
        "  commit throughput, {} clients: {bare:.0}/s with no stream, {attached:.0}/s with {} streams attached: {:.0}% (target >= 90%)",
        args.clients,
        args.streams,
        attached / bare * 100.0
    );
    println!(
        "    CPU (% of one core; the machine has {}): gateway {bare_gw:.0}% / {attached_gw:.0}%, this process (writers and stream readers) {bare_bench:.0}% / {attached_bench:.0}%; {:.0} events/s sent on the streams",
        std::thread::available_parallelism().map_or(1, |n| n.get()),
        attached * args.streams as f64,
    );

    // 2. Lag at a steady rate.
    tokio::time::sleep(Duration::from_secs(2)).await;
    lags.reset();
    progress(&format!("events: lag at {} commits/s", args.rate));
    let n = write(&base, args.clients, Some(args.rate), args.seconds).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    println!(
        "  commit -> SSE arrival lag at {:.0} commits/s offered ({:.0} answered), {} streams: p50 {} ms, p99 {} ms (target p99 < 100 ms); {} arrivals sampled (1 in {LAG_SAMPLE} per stream)",
        args.rate,
        n as f64 / args.seconds,
        args.streams,
        lags.percentile(0.5),
        lags.percentile(0.99),
        lags.count()
    );

    // 3. A paused stream under that load.
    progress(&format!("events: one stream paused for {} s", args.pause));
    let last = Arc::new(AtomicU64::new(0));
    let seen = Arc::new(Mutex::new(Vec::<u64>::new()));
    let paused = Arc::new(AtomicBool::new(true));
    // Its cursor: the end of the log now (the load is stopped).
    let mut head = 0;
    loop {
        let next = last_position(&client, &base, head).await;
        if next == head {
            break;
        }
        head = next;
    }
    let paused_stream = {
        let (seen, last, paused, stop) = (Arc::clone(&seen), Arc::clone(&last), Arc::clone(&paused), Arc::clone(&stop));
        tokio::spawn(stream(format!("{base}/v1/events"), Some(head), paused, stop, move |data| {
            if let Some(seq) = event_seq(data) {
                seen.lock().unwrap().push(seq);
                last.store(seq, Ordering::Relaxed);
            }
        }))
    };
    let rss_before = gw.rss_mib();
    let load = {
        let base = base.clone();
        let (clients, rate, pause) = (args.clients, args.rate, args.pause);
        tokio::spawn(async move { write(&base, clients, Some(rate), pause).await })
    };
    let mut rss = Vec::new();
    while !load.is_finished() {
        tokio::time::sleep(Duration::from_secs(1)).await;
        rss.push(gw.rss_mib());
    }
    let written = load.await.expect("load");
    paused.store(false, Ordering::Relaxed);
    let resumed = Instant::now();
    while seen.lock().unwrap().len() < written && resumed.elapsed() < Duration::from_secs(120) {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let caught_up = resumed.elapsed();
    let got = seen.lock().unwrap().clone();
    let in_order = got.windows(2).all(|w| w[0] < w[1]);
    let (lo, hi) = rss.iter().fold((f64::MAX, 0.0_f64), |(lo, hi), r| (lo.min(*r), hi.max(*r)));
    println!(
        "  a stream paused {:.0} s under {:.0} commits/s: gateway RSS {rss_before:.0} MiB before, {lo:.0}-{hi:.0} MiB during (last {:.0}); resumed, it received {} of {written} events in {:.1} s, in order: {in_order}",
        args.pause,
        args.rate,
        rss.last().copied().unwrap_or(0.0),
        got.len(),
        caught_up.as_secs_f64(),
    );
    stop.store(true, Ordering::Relaxed);
    paused_stream.abort();
    for s in streams {
        s.abort();
    }

    // 4. Subscription deliveries.
    if args.deliveries > 0 {
        let receiver = super::hooks::counting_receiver().await;
        let res = client
            .post(format!("{base}/v1/subscriptions"))
            .json(&json!({"url": receiver.url, "collections": ["evbench"]}))
            .send()
            .await
            .expect("subscribe");
        assert_eq!(res.status(), 201, "subscription created");
        progress(&format!("events: {} events to a subscription", args.deliveries));
        let started = Instant::now();
        let per_client = args.deliveries.div_ceil(args.clients);
        let tasks: Vec<_> = (0..args.clients)
            .map(|c| {
                let (client, base) = (client.clone(), base.clone());
                tokio::spawn(async move {
                    for j in 0..per_client {
                        let url = format!("{base}/v1/collections/evbench/documents/d{}", (c * per_client + j) % POOL);
                        let _ = client.patch(&url).json(&json!({"inc": {"n": 1}})).send().await;
                    }
                })
            })
            .collect();
        for t in tasks {
            t.await.expect("writer");
        }
        let total = per_client * args.clients;
        let written_in = started.elapsed();
        while receiver.count() < total && started.elapsed() < Duration::from_secs(600) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let all = started.elapsed();
        println!(
            "  subscription: {total} events written in {:.1} s ({:.0}/s); {} delivered in {:.1} s: {:.0} deliveries/s",
            written_in.as_secs_f64(),
            total as f64 / written_in.as_secs_f64(),
            receiver.count(),
            all.as_secs_f64(),
            receiver.count() as f64 / all.as_secs_f64()
        );
    }
}

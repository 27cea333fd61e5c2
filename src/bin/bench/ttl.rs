//! `bench ttl`: TTL under load, on a gateway serving in this process over
//! real HTTP, its sweeper at the default period (500 ms).
//!
//! 1. Expiry lag: a collection with `max_age_seconds` receiving `rate`
//!    inserts per second for `seconds`; each `document.expired` event is
//!    taken from an SSE stream, and its lag past due is its `at` minus the
//!    document's `created_at` plus the maximum age.
//! 2. `max_count` under the same load: the live count (`GET
//!    /v1/collections/{c}`) sampled every 20 ms: how far above the limit it
//!    goes, and whether it ever falls below it once reached.
//! 3. The sweeper's cost at rest: `docs` live documents in a collection
//!    whose policy has nothing due, the gateway's CPU over `idle` seconds,
//!    then the same with the policy removed (an idle gateway).

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use serde_json::{Value, json};
use txgate::config::{Config, StoreConfig};

use super::scale::{Gateway, backend, cpu_time};
use super::{ms, percentile, progress};

pub struct TtlArgs {
    pub store: StoreConfig,
    pub rate: f64,
    pub seconds: f64,
    pub max_age: u64,
    pub max_count: u64,
    pub docs: usize,
    pub idle: f64,
}

fn rfc3339_ms(s: &str) -> Option<i64> {
    let at = time::OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339).ok()?;
    Some((at.unix_timestamp_nanos() / 1_000_000) as i64)
}

/// Open-loop inserts into `coll` at `rate` per second for `seconds`, each
/// document's `created_at` (Unix ms) handed to `created`. Returns how many
/// were answered 201.
async fn insert_at_rate(
    base: &str,
    coll: &str,
    rate: f64,
    seconds: f64,
    created: impl Fn(usize, i64) + Send + Sync + 'static,
) -> usize {
    let client = reqwest::Client::new();
    let created = Arc::new(created);
    let started = Instant::now();
    let total = (rate * seconds) as usize;
    let done = Arc::new(AtomicUsize::new(0));
    let late = Arc::new(AtomicU64::new(0));
    futures::stream::iter(0..total)
        .map(|i| {
            let (client, created, done, late) =
                (client.clone(), Arc::clone(&created), Arc::clone(&done), Arc::clone(&late));
            let url = format!("{base}/v1/collections/{coll}/documents");
            async move {
                let due = started + Duration::from_secs_f64(i as f64 / rate);
                tokio::time::sleep_until(due.into()).await;
                late.fetch_max(due.elapsed().as_millis() as u64, Ordering::Relaxed);
                let res = client.post(&url).json(&json!({"_id": format!("d{i:08}"), "i": i})).send().await;
                if let Some(res) = res.ok().filter(|r| r.status() == 201) {
                    let body: Value = res.json().await.expect("an envelope");
                    if let Some(at) = body["created_at"].as_str().and_then(rfc3339_ms) {
                        created(i, at);
                    }
                    done.fetch_add(1, Ordering::Relaxed);
                }
            }
        })
        .buffer_unordered(256)
        .collect::<Vec<()>>()
        .await;
    let late = late.load(Ordering::Relaxed);
    if late > 100 {
        progress(&format!("an insert started up to {late} ms after it was due"));
    }
    done.load(Ordering::Relaxed)
}

async fn put_ttl(client: &reqwest::Client, base: &str, coll: &str, ttl: Value) {
    let res = client.put(format!("{base}/v1/collections/{coll}")).json(&json!({ "ttl": ttl })).send().await;
    assert_eq!(res.expect("PUT").status(), 200, "policy set");
}

async fn count(client: &reqwest::Client, base: &str, coll: &str) -> u64 {
    let res = client.get(format!("{base}/v1/collections/{coll}")).send().await.expect("GET");
    let body: Value = res.json().await.expect("a collection");
    body["count"].as_u64().expect("count")
}

pub async fn run(args: TtlArgs) {
    let config = Config { store: args.store.clone(), ..Config::default() };
    let interval = config.ttl_interval;
    let gw = Gateway::start(config).await;
    let base = gw.base.clone();
    let client = reqwest::Client::new();
    println!(
        "txgate bench ttl: {} store, sweeper every {} ms, {} inserts/s for {} s",
        backend(&args.store),
        interval.as_millis(),
        args.rate,
        args.seconds
    );

    // 1. Expiry lag by age.
    progress(&format!("max_age_seconds {}: {} inserts/s for {} s", args.max_age, args.rate, args.seconds));
    put_ttl(&client, &base, "ttl_age", json!({"max_age_seconds": args.max_age})).await;
    let total = (args.rate * args.seconds) as usize;
    let created: Arc<Vec<AtomicU64>> = Arc::new((0..total).map(|_| AtomicU64::new(0)).collect());
    let expired: Arc<Mutex<Vec<(usize, i64)>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let reader = {
        let (expired, stop) = (Arc::clone(&expired), Arc::clone(&stop));
        let url = format!("{base}/v1/events?collections=ttl_age&types=document.expired");
        tokio::spawn(super::events::stream(url, None, Arc::new(AtomicBool::new(false)), stop, move |data| {
            let Ok(event) = serde_json::from_slice::<Value>(data) else { return };
            let i = event["document"].as_str().and_then(|d| d.strip_prefix('d')).and_then(|d| d.parse().ok());
            if let (Some(i), Some(at)) = (i, event["at"].as_str().and_then(rfc3339_ms)) {
                expired.lock().unwrap().push((i, at));
            }
        }))
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let stamps = Arc::clone(&created);
    let inserted = insert_at_rate(&base, "ttl_age", args.rate, args.seconds, move |i, at| {
        stamps[i].store(at as u64, Ordering::Relaxed)
    })
    .await;
    let deadline = Instant::now() + Duration::from_secs(args.max_age + 60);
    while expired.lock().unwrap().len() < inserted && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stop.store(true, Ordering::Relaxed);
    let _ = reader.await;
    let expired = expired.lock().unwrap().clone();
    let due_ms = args.max_age as i64 * 1000;
    let mut lags: Vec<Duration> = expired
        .iter()
        .filter_map(|(i, at)| {
            let born = created.get(*i)?.load(Ordering::Relaxed) as i64;
            (born > 0).then(|| Duration::from_millis((at - born - due_ms).max(0) as u64))
        })
        .collect();
    let early = expired
        .iter()
        .filter(|(i, at)| created.get(*i).is_some_and(|b| at - (b.load(Ordering::Relaxed) as i64) < due_ms))
        .count();
    lags.sort();
    let left = count(&client, &base, "ttl_age").await;
    println!(
        "expiry lag past due (max_age_seconds {}): p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms (target p99 < 2000 ms); \
         {} inserted, {} expired events, {} before due, {} left",
        args.max_age,
        ms(percentile(&lags, 0.5)),
        ms(percentile(&lags, 0.99)),
        ms(lags.last().copied().unwrap_or_default()),
        inserted,
        expired.len(),
        early,
        left
    );

    // 2. max_count under the same load.
    progress(&format!("max_count {}: {} inserts/s for {} s", args.max_count, args.rate, args.seconds));
    put_ttl(&client, &base, "ttl_count", json!({"max_count": args.max_count})).await;
    // When expiries arrive: they come in one burst per pass.
    let arrivals: Arc<Mutex<Vec<Instant>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let watcher = {
        let (arrivals, stop) = (Arc::clone(&arrivals), Arc::clone(&stop));
        let url = format!("{base}/v1/events?collections=ttl_count&types=document.expired");
        tokio::spawn(super::events::stream(url, None, Arc::new(AtomicBool::new(false)), stop, move |_| {
            arrivals.lock().unwrap().push(Instant::now());
        }))
    };
    let sampling = Arc::new(AtomicBool::new(true));
    let sampler = {
        let (client, base, sampling, limit) = (client.clone(), base.clone(), Arc::clone(&sampling), args.max_count);
        tokio::spawn(async move {
            let (mut max, mut min_after, mut samples) = (0_u64, u64::MAX, 0_usize);
            let mut reached = false;
            while sampling.load(Ordering::Relaxed) {
                let n = count(&client, &base, "ttl_count").await;
                samples += 1;
                max = max.max(n);
                reached |= n >= limit;
                if reached {
                    min_after = min_after.min(n);
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            (max, min_after, samples)
        })
    };
    let inserted = insert_at_rate(&base, "ttl_count", args.rate, args.seconds, |_, _| {}).await;
    tokio::time::sleep(interval * 3).await;
    sampling.store(false, Ordering::Relaxed);
    let (max, min_after, samples) = sampler.await.expect("sampler");
    stop.store(true, Ordering::Relaxed);
    let _ = watcher.await;
    let settled = count(&client, &base, "ttl_count").await;
    let (period, burst) = bursts(&arrivals.lock().unwrap());
    let per_sweep = (args.rate * (period + burst).as_secs_f64()).round() as u64;
    println!(
        "max_count {}: {} inserted; live count over {} samples: highest {} (+{}), lowest once reached {} ({}), {} at \
         the end; expiries came every {:.0} ms on average, each pass's lasting {:.0} ms: one sweep's inserts \
         (period + pass) {}",
        args.max_count,
        inserted,
        samples,
        max,
        max.saturating_sub(args.max_count),
        if min_after == u64::MAX { "never reached".to_owned() } else { min_after.to_string() },
        if min_after >= args.max_count { "never below the limit" } else { "BELOW the limit" },
        settled,
        ms(period),
        ms(burst),
        per_sweep
    );

    // 3. The sweeper at rest over many documents.
    progress(&format!("loading {} documents", args.docs));
    let started = Instant::now();
    let loaded = AtomicUsize::new(0);
    futures::stream::iter(0..args.docs)
        .map(|i| {
            let (client, url, loaded) = (&client, format!("{base}/v1/collections/ttl_idle/documents"), &loaded);
            async move {
                let res =
                    client.post(url).json(&json!({"_id": format!("d{i:08}"), "owner": format!("user {i}")})).send();
                assert_eq!(res.await.expect("POST").status(), 201);
                let n = loaded.fetch_add(1, Ordering::Relaxed) + 1;
                if n % 100_000 == 0 {
                    progress(&format!("{n} loaded ({:.0}/s)", n as f64 / started.elapsed().as_secs_f64()));
                }
            }
        })
        .buffer_unordered(64)
        .collect::<Vec<()>>()
        .await;
    let year = 365 * 24 * 3600;
    put_ttl(&client, &base, "ttl_idle", json!({"max_age_seconds": year, "max_count": args.docs * 2})).await;
    let live = count(&client, &base, "ttl_idle").await;
    let with_policy = idle_cpu(args.idle).await;
    put_ttl(&client, &base, "ttl_idle", Value::Null).await;
    let without = idle_cpu(args.idle).await;
    println!(
        "sweeper at rest: {live} live documents, a policy with nothing due: gateway CPU {with_policy:.2}% of one core \
         over {} s; the same gateway without the policy: {without:.2}%",
        args.idle
    );
    gw.stop().await;
}

/// The average time from one pass's expiries to the next's, and the
/// average time one pass's expiries take to arrive: arrivals more than
/// 100 ms apart belong to different passes.
fn bursts(arrivals: &[Instant]) -> (Duration, Duration) {
    let mut starts = Vec::new();
    let mut lengths = Vec::new();
    let mut first: Option<(Instant, Instant)> = None;
    for &at in arrivals {
        match first {
            Some((start, last)) if at.duration_since(last) <= Duration::from_millis(100) => first = Some((start, at)),
            Some((start, last)) => {
                lengths.push(last - start);
                starts.push(start);
                first = Some((at, at));
            }
            None => first = Some((at, at)),
        }
    }
    if let Some((start, last)) = first {
        lengths.push(last - start);
        starts.push(start);
    }
    let period = match (starts.first(), starts.last()) {
        (Some(a), Some(b)) if starts.len() > 1 => (*b - *a) / (starts.len() as u32 - 1),
        _ => Duration::ZERO,
    };
    let burst = lengths.iter().sum::<Duration>() / (lengths.len().max(1) as u32);
    (period, burst)
}

/// This process's (the gateway's) share of one core over `secs`, after
/// letting the work before settle.
async fn idle_cpu(secs: f64) -> f64 {
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (before, at) = (cpu_time("self"), Instant::now());
    tokio::time::sleep(Duration::from_secs_f64(secs)).await;
    (cpu_time("self").saturating_sub(before)).as_secs_f64() / at.elapsed().as_secs_f64() * 100.0
}

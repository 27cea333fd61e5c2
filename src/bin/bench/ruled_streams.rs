//! `bench ruled-streams`: event streams of many different users under a
//! per-document rule, against a gateway running as its own process (the
//! `txgate` binary beside this one).
//!
//! `users` users (tokens of the bench's HS256 issuer, each its own `sub`)
//! each open one stream of the collection's events; a rule lets each read
//! and stream only the documents they own (`owner` = their `sub`). Writers
//! with the admin key then `PATCH` documents at `rate` per second for
//! `seconds`: nine in ten change a counter (one owner's stream is sent the
//! event), one in ten gives the document to another user (the old owner's
//! stream is sent `left`, the new owner's the event). Every stream judges
//! every event. Printed: commit -> arrival lag (the event's commit time to
//! its arrival, every arrival), arrivals against those the owners
//! expected, any event a stream was sent that its user may not read, and
//! the gateway's CPU and memory.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::Rng;
use serde_json::{Value, json};

use futures::StreamExt;

use super::events::{Child, Lags, data_lines, event_at, now_ms};
use super::progress;
use super::rules::{ISSUER, SECRET, signed};

const COLL: &str = "ownbench";
const KEY: &str = "bench-admin-key-0123456789abcdef";
/// Documents per user.
const PER_USER: usize = 2;
/// Writers.
const CLIENTS: usize = 16;

pub struct RuledStreamsArgs {
    pub mongodb_uri: Option<String>,
    pub users: usize,
    pub rate: f64,
    pub seconds: f64,
}

fn user(i: usize) -> String {
    format!("user-{i}")
}

/// What the streams were sent.
#[derive(Default)]
struct Seen {
    arrivals: AtomicUsize,
    /// Events sent to a stream whose user does not own the document they
    /// carry (never expected).
    foreign: AtomicUsize,
    open: AtomicUsize,
    /// Opens answered 429, tried again.
    retried: AtomicUsize,
}

/// One user's stream: each event's lag into `lags`, until `stop`.
async fn follow(
    client: reqwest::Client,
    base: String,
    who: String,
    lags: Arc<Lags>,
    seen: Arc<Seen>,
    stop: Arc<AtomicBool>,
) {
    let token = signed(&who, json!({}));
    // Opened as a client would: again after a 429 (a thousand opening at
    // once meet the issuer's share of requests in flight).
    let res = loop {
        let res = client
            .get(format!("{base}/v1/events?collections={COLL}"))
            .bearer_auth(&token)
            .send()
            .await
            .expect("stream opens");
        if res.status() != 429 {
            break res;
        }
        seen.retried.fetch_add(1, Ordering::Relaxed);
        let pause = rand::rng().random_range(50..250);
        tokio::time::sleep(Duration::from_millis(pause)).await;
    };
    assert_eq!(res.status(), 200, "{who}'s stream: {}", res.status());
    seen.open.fetch_add(1, Ordering::Relaxed);
    let paused = AtomicBool::new(false);
    data_lines(res, &paused, &stop, |data| {
        let Ok(event) = serde_json::from_slice::<Value>(data) else { return };
        if !event["type"].as_str().is_some_and(|t| t.starts_with("document.")) {
            return;
        }
        if let Some(at) = event_at(data) {
            lags.add((now_ms() - at).max(0) as u64);
        }
        seen.arrivals.fetch_add(1, Ordering::Relaxed);
        let left = event["left"].as_bool().unwrap_or(false);
        if !left && event["data"]["owner"].as_str() != Some(who.as_str()) {
            seen.foreign.fetch_add(1, Ordering::Relaxed);
        }
    })
    .await;
}

/// Writer `k` of [`CLIENTS`]: its share of the writes (the `i`-th of all
/// due at `i / rate`) on its own documents, whose owners it tracks.
/// Returns (writes answered, arrivals the owners should see).
async fn write(
    base: String,
    k: usize,
    users: usize,
    rate: f64,
    seconds: f64,
    owners: Arc<Mutex<HashMap<usize, usize>>>,
) -> (usize, usize) {
    let client = reqwest::Client::new();
    let mine: Vec<usize> = (0..users * PER_USER).filter(|d| d % CLIENTS == k).collect();
    let started = Instant::now();
    let until = started + Duration::from_secs_f64(seconds);
    let (mut done, mut expected) = (0, 0);
    let mut i = k;
    loop {
        let due = started + Duration::from_secs_f64(i as f64 / rate);
        if due >= until {
            return (done, expected);
        }
        tokio::time::sleep_until(due.into()).await;
        i += CLIENTS;
        let (d, give_to) = {
            let mut rng = rand::rng();
            let d = mine[rng.random_range(0..mine.len())];
            (d, rng.random_bool(0.1).then(|| rng.random_range(0..users)))
        };
        let body = match give_to {
            Some(to) => json!({"set": {"owner": user(to)}}),
            None => json!({"inc": {"n": 1}}),
        };
        let res = client
            .patch(format!("{base}/v1/collections/{COLL}/documents/d{d}"))
            .bearer_auth(KEY)
            .json(&body)
            .send()
            .await;
        if !res.is_ok_and(|r| r.status() == 200) {
            continue;
        }
        done += 1;
        let mut owners = owners.lock().expect("owners");
        let owner = owners.get(&d).copied().unwrap_or(d % users);
        expected += match give_to {
            Some(to) if to != owner => {
                owners.insert(d, to);
                2
            }
            _ => 1,
        };
    }
}

pub async fn run(args: RuledStreamsArgs) {
    let users = args.users.max(1);
    let env = [
        ("TXGATE_API_KEYS", format!("{KEY}:admin")),
        ("TXGATE_ISSUER", ISSUER.to_owned()),
        ("TXGATE_ISSUER_AUDIENCES", "bench".to_owned()),
        ("TXGATE_ISSUER_ALGORITHMS", "HS256".to_owned()),
        ("TXGATE_ISSUER_HS256_SECRET", SECRET.to_owned()),
        ("TXGATE_ISSUER_ROLES", format!("reader=read@{COLL}")),
        ("TXGATE_ISSUER_RATE", "100000/s".to_owned()),
        // Room for every user's stream in the issuer's half.
        ("TXGATE_MAX_STREAMS", (2 * users + 100).to_string()),
    ];
    let database = format!("bench_{}", uuid::Uuid::now_v7().simple());
    let gw = Child::start_with(args.mongodb_uri.as_deref().map(|uri| (uri, database.as_str())), &env).await;
    let base = gw.base.clone();
    let client = reqwest::Client::new();
    progress(&format!("ruled streams: {} documents, {users} owners", users * PER_USER));
    let creates = (0..users * PER_USER).map(|d| {
        let (client, base) = (client.clone(), base.clone());
        async move {
            let doc = json!({"_id": format!("d{d}"), "owner": user(d % users), "n": 0});
            let res =
                client.post(format!("{base}/v1/collections/{COLL}/documents")).bearer_auth(KEY).json(&doc).send().await;
            assert_eq!(res.expect("create").status(), 201);
        }
    });
    futures::stream::iter(creates).buffer_unordered(16).collect::<Vec<()>>().await;
    let rules = json!({"grants": [{"name": "own", "roles": ["reader"],
        "match": {"owner": {"$auth": "sub"}}, "actions": ["read", "stream"]}]});
    let put = client.put(format!("{base}/v1/collections/{COLL}/rules")).bearer_auth(KEY).json(&rules).send().await;
    assert_eq!(put.expect("rules").status(), 200);

    progress(&format!("ruled streams: {users} users' streams opening"));
    let (lags, seen, stop) = (Arc::new(Lags::new()), Arc::new(Seen::default()), Arc::new(AtomicBool::new(false)));
    let streams: Vec<_> = (0..users)
        .map(|u| {
            let (client, base, lags, seen, stop) =
                (client.clone(), base.clone(), Arc::clone(&lags), Arc::clone(&seen), Arc::clone(&stop));
            tokio::spawn(follow(client, base, user(u), lags, seen, stop))
        })
        .collect();
    let opening = Instant::now();
    while seen.open.load(Ordering::Relaxed) < users {
        assert!(
            opening.elapsed() < Duration::from_secs(120),
            "{} of {users} streams open",
            seen.open.load(Ordering::Relaxed)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;

    progress(&format!("ruled streams: {} commits/s for {} s", args.rate, args.seconds));
    let gw_pid = gw.process.id().to_string();
    let cpu_before = super::scale::cpu_time(&gw_pid);
    let owners = Arc::new(Mutex::new(HashMap::new()));
    let writers: Vec<_> = (0..CLIENTS)
        .map(|k| tokio::spawn(write(base.clone(), k, users, args.rate, args.seconds, Arc::clone(&owners))))
        .collect();
    let (mut done, mut expected) = (0, 0);
    for w in writers {
        let (d, e) = w.await.expect("writer");
        done += d;
        expected += e;
    }
    let cpu = (super::scale::cpu_time(&gw_pid) - cpu_before).as_secs_f64() / args.seconds * 100.0;
    // The last events on their way.
    let settle = Instant::now();
    while seen.arrivals.load(Ordering::Relaxed) < expected && settle.elapsed() < Duration::from_secs(5) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let rss = gw.rss_mib();
    stop.store(true, Ordering::Relaxed);
    for s in streams {
        let _ = s.await;
    }
    println!(
        "ruled streams: {} store, {users} streams of {users} different users under a rule (owner = the user), gateway in its own process",
        if args.mongodb_uri.is_some() { "mongodb" } else { "embedded" }
    );
    println!(
        "  commit -> arrival lag at {:.0} commits/s offered ({:.0} answered): p50 {} ms, p99 {} ms (target p99 < 100 ms); {} arrivals of {expected} the owners should see; {} sent to a user who may not read them",
        args.rate,
        done as f64 / args.seconds,
        lags.percentile(0.5),
        lags.percentile(0.99),
        seen.arrivals.load(Ordering::Relaxed),
        seen.foreign.load(Ordering::Relaxed),
    );
    println!(
        "    gateway CPU {cpu:.0}% of one core, resident memory {rss:.0} MiB with the streams open; {} opens answered 429 and tried again",
        seen.retried.load(Ordering::Relaxed)
    );
    println!("ruled-streams txgate lag_p99_ms {}", lags.percentile(0.99));
    if args.mongodb_uri.is_some() {
        super::cleanup(
            &txgate::config::StoreConfig::Mongodb { uri: args.mongodb_uri.clone().unwrap_or_default(), database },
            std::path::Path::new(""),
        )
        .await;
    }
}

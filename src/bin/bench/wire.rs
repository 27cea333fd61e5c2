//! `bench wire`: what a request waits for on a remote MongoDB, measured
//! on the wire.
//!
//! A TCP proxy between the gateway and the MongoDB-wire server holds every
//! chunk of bytes for a fixed delay in each direction, so each command
//! costs one round trip R more than it does locally; R is measured through
//! the proxy (a `ping`). The driver's command monitoring records every
//! command: for each request, the commands that started and finished
//! between sending it and reading its answer are the ones the answer
//! waited for, and their dependent depth is the longest chain of them in
//! which each started only after the one before it had finished. Work
//! left for after the answer (roll-forward, event publication) does not
//! finish inside that window, so it is not counted; a delay at the `Store`
//! trait could not see how many commands a store call really makes.
//!
//! Workloads, each over HTTP from one client, one request at a time, each
//! once the driver has been quiet for 20 ms (the work the request before
//! left for after its answer is done):
//! a single-document update (`PATCH` with `inc`), and transactions of k
//! update members, without and with an `Idempotency-Key`. Beside them, in
//! the same run and through the same proxy, one raw compare-and-set: an
//! `updateOne` filtered on `_id` and a version, sent by the official
//! driver from this process, the client a gateway instance is. Ratio
//! targets (medians): a single update at most 2.5 raw compare-and-sets
//! (it reads the document first), a transaction of k = 2 at most 2.0 times
//! k of them, of k = 10 at most 1.0 times (its stages run side by side).

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use mongodb::event::EventHandler;
use mongodb::event::command::CommandEvent;
use serde_json::{Value, json};
use txgate::config::{Config, StoreConfig};
use txgate_store::DynStore;
use txgate_store::mongo::MongoStore;

use super::{ms, percentile, progress};

/// What `bench wire` measures.
#[derive(clap::Args)]
pub struct WireArgs {
    /// The delay the proxy adds in each direction, in milliseconds.
    #[arg(long, default_value_t = 0.5)]
    pub delay_ms: f64,
    /// Requests per figure.
    #[arg(long, default_value_t = 200)]
    pub samples: usize,
    /// Member counts of the transactions.
    #[arg(long, value_delimiter = ',', default_value = "1,2,5,10")]
    pub k: Vec<usize>,
    /// Print the commands of each workload's last request: what it waited
    /// for, in order (a profile of the critical path).
    #[arg(long)]
    pub trace: bool,
}

/// A command the driver sent: when it started and when its answer came.
#[derive(Clone)]
struct Command {
    started: Instant,
    finished: Instant,
    /// The command's name and the collection it names.
    what: String,
}

/// Every command the driver sends, with its timing.
#[derive(Default)]
struct Monitor {
    open: Mutex<HashMap<i32, (Instant, String)>>,
    done: Mutex<Vec<Command>>,
    /// When the last command started.
    last: Mutex<Option<Instant>>,
}

impl Monitor {
    fn handler(self: &Arc<Self>) -> EventHandler<CommandEvent> {
        let monitor = Arc::clone(self);
        EventHandler::callback(move |event: CommandEvent| {
            let now = Instant::now();
            match event {
                CommandEvent::Started(e) => {
                    let target = e.command.get(&e.command_name).map(|v| v.to_string()).unwrap_or_default();
                    let what = format!("{} {}", e.command_name, target.trim_matches('"'));
                    monitor.open.lock().expect("monitor").insert(e.request_id, (now, what));
                    *monitor.last.lock().expect("monitor") = Some(now);
                }
                CommandEvent::Succeeded(e) => monitor.finish(e.request_id, now),
                CommandEvent::Failed(e) => monitor.finish(e.request_id, now),
                _ => {}
            }
        })
    }

    fn finish(&self, request: i32, now: Instant) {
        if let Some((started, what)) = self.open.lock().expect("monitor").remove(&request) {
            self.done.lock().expect("monitor").push(Command { started, finished: now, what });
        }
    }

    /// The commands that started and finished within `[from, to]`: how
    /// many, their dependent depth, how long each took, and a line on each
    /// (its depth, start and length in ms from `from`, what it was).
    fn within(&self, from: Instant, to: Instant) -> (usize, usize, Vec<Duration>, Vec<String>) {
        let mut inside: Vec<Command> = self
            .done
            .lock()
            .expect("monitor")
            .iter()
            .filter(|c| c.started >= from && c.finished <= to)
            .cloned()
            .collect();
        inside.sort_by_key(|c| c.started);
        let mut depth = vec![0_usize; inside.len()];
        for i in 0..inside.len() {
            let before = (0..i).filter(|j| inside[*j].finished <= inside[i].started).map(|j| depth[j]).max();
            depth[i] = before.unwrap_or(0) + 1;
        }
        let took = inside.iter().map(|c| c.finished - c.started).collect();
        let lines = inside
            .iter()
            .zip(&depth)
            .map(|(c, d)| {
                let (at, len) = (ms(c.started - from), ms(c.finished - c.started));
                format!("    {d:>2}  +{at:>7.2} ms  {len:>6.2} ms  {}", c.what)
            })
            .collect();
        (inside.len(), depth.into_iter().max().unwrap_or(0), took, lines)
    }

    fn forget(&self) {
        self.done.lock().expect("monitor").clear();
    }

    /// Wait until no command is in flight and none has started for
    /// `quiet` (at most 5 s): the work a request left for after its answer
    /// is done.
    async fn settle(&self, quiet: Duration) {
        let give_up = Instant::now() + Duration::from_secs(5);
        loop {
            let idle = self.open.lock().expect("monitor").is_empty();
            let last = *self.last.lock().expect("monitor");
            if (idle && last.is_none_or(|t| t.elapsed() >= quiet)) || Instant::now() >= give_up {
                return;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
}

/// A TCP proxy to `upstream` that delays every chunk by `delay` in each
/// direction, keeping order. Blocking threads: a timer wheel's
/// millisecond ticks would round a sub-millisecond delay up.
fn proxy(upstream: SocketAddr, delay: Duration) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").expect("the proxy binds");
    let addr = listener.local_addr().expect("the proxy's address");
    std::thread::spawn(move || {
        for client in listener.incoming().flatten() {
            let Ok(server) = TcpStream::connect(upstream) else { continue };
            let _ = (client.set_nodelay(true), server.set_nodelay(true));
            let (c2, s2) = (client.try_clone().expect("clone"), server.try_clone().expect("clone"));
            pipe(client, server, delay);
            pipe(s2, c2, delay);
        }
    });
    addr
}

/// Copy `from` to `to`, each chunk `delay` after it was read.
fn pipe(mut from: TcpStream, mut to: TcpStream, delay: Duration) {
    let (tx, rx) = std::sync::mpsc::channel::<(Instant, Vec<u8>)>();
    std::thread::spawn(move || {
        let mut buf = vec![0_u8; 1 << 16];
        loop {
            match from.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if tx.send((Instant::now() + delay, buf[..n].to_vec())).is_err() {
                        break;
                    }
                }
            }
        }
    });
    std::thread::spawn(move || {
        while let Ok((due, chunk)) = rx.recv() {
            if let Some(wait) = due.checked_duration_since(Instant::now()) {
                std::thread::sleep(wait);
            }
            if to.write_all(&chunk).is_err() {
                break;
            }
        }
        let _ = to.shutdown(std::net::Shutdown::Both);
    });
}

/// The host and port of a single-host `mongodb://` URI.
fn upstream_of(uri: &str) -> SocketAddr {
    let rest = uri.strip_prefix("mongodb://").expect("bench wire takes a mongodb:// URI");
    let rest = rest.rsplit_once('@').map_or(rest, |(_, host)| host);
    let host = rest.split(['/', '?']).next().expect("a host");
    assert!(!host.contains(','), "bench wire takes a single-host URI");
    let host = if host.contains(':') { host.to_owned() } else { format!("{host}:27017") };
    std::net::ToSocketAddrs::to_socket_addrs(&host).expect("the host resolves").next().expect("an address")
}

/// One row of the table.
struct Row {
    name: String,
    lat: Vec<Duration>,
    commands: Vec<usize>,
    depth: Vec<usize>,
    /// How long each command took, from the driver's sending it to its
    /// answer: R plus the server's own time.
    took: Vec<Duration>,
    /// The round trips the target allows.
    target: usize,
    /// The commands of the last request.
    last: Vec<String>,
}

/// Run the workloads against the server at `uri` through the proxy.
pub async fn run(uri: &str, args: &WireArgs) {
    let delay = Duration::from_secs_f64(args.delay_ms / 1000.0);
    let proxied = format!("mongodb://{}/?directConnection=true", proxy(upstream_of(uri), delay));
    let database = format!("bench_wire_{}", uuid::Uuid::now_v7().simple());
    let monitor = Arc::new(Monitor::default());
    let store = MongoStore::connect_monitored(&proxied, &database, Some(monitor.handler()))
        .await
        .expect("the store connects through the proxy");
    let store: DynStore = Arc::new(store);
    let config = Config {
        store: StoreConfig::Mongodb { uri: proxied.clone(), database: database.clone() },
        ..Config::default()
    };
    let gateway = super::scale::Gateway::start_with(config, Arc::clone(&store)).await;
    let base = gateway.base.clone();
    let client = reqwest::Client::new();

    // R: a ping through the proxy.
    let mut pings = Vec::new();
    for _ in 0..args.samples.max(50) {
        let t = Instant::now();
        store.ping().await.expect("ping");
        pings.push(t.elapsed());
    }
    pings.sort();
    let r = percentile(&pings, 0.5);

    let pool = 50 * args.k.iter().copied().max().unwrap_or(1).max(1);
    progress(&format!("wire: seeding {pool} documents"));
    for i in 0..pool {
        let res = client
            .post(format!("{base}/v1/collections/wire/documents"))
            .json(&json!({"_id": format!("d{i}"), "n": 0}))
            .send()
            .await
            .expect("the gateway answers");
        assert_eq!(res.status(), 201, "seeding");
    }

    progress("wire: raw compare-and-set updates");
    let cas = raw_cas(&proxied, &database, args.samples).await;

    let mut rows = Vec::new();
    progress("wire: single-document updates");
    let single = measure(&monitor, args.samples, |i| {
        client
            .patch(format!("{base}/v1/collections/wire/documents/d{}", i % pool))
            .header("content-type", "application/json")
            .body(json!({"inc": {"n": 1}}).to_string())
    })
    .await;
    rows.push(Row { name: "single update".into(), target: 2, ..single });
    for &k in &args.k {
        for keyed in [false, true] {
            progress(&format!("wire: k={k} transactions{}", if keyed { " with a key" } else { "" }));
            let row = measure(&monitor, args.samples, |i| {
                let actions: Vec<Value> = (0..k)
                    .map(|m| json!({"op": "update", "collection": "wire", "id": format!("d{}", (i * k + m) % pool), "inc": {"n": 1}}))
                    .collect();
                let request = client.post(format!("{base}/v1/transactions")).json(&json!({"actions": actions}));
                if keyed { request.header("Idempotency-Key", uuid::Uuid::now_v7().to_string()) } else { request }
            })
            .await;
            let name = format!("k={k} transaction{}", if keyed { " + key" } else { "" });
            rows.push(Row { name, target: if keyed { 4 } else { 3 }, ..row });
        }
    }

    println!(
        "txgate bench wire: mongodb backend through a proxy adding {:.2} ms each way; R = {:.2} ms (ping p50 through it)",
        args.delay_ms,
        ms(r)
    );
    println!();
    println!(
        "{:<24} {:>8} {:>8} {:>12} {:>9} {:>7} {:>7} {:>9} {:>11}",
        "request", "p50", "p99", "target p50", "commands", "depth", "target", "cmd p50", "depth x cmd"
    );
    let mut verdicts = Vec::new();
    let mut traced = Vec::new();
    let mut ratios = Vec::new();
    for mut row in rows {
        traced.push((row.name.clone(), std::mem::take(&mut row.last)));
        row.lat.sort();
        row.commands.sort();
        row.depth.sort();
        row.took.sort();
        let (p50, p99) = (percentile(&row.lat, 0.5), percentile(&row.lat, 0.99));
        let cmd = percentile(&row.took, 0.5);
        let bound = r * row.target as u32 + Duration::from_millis(1);
        let (commands, depth) = (row.commands[row.commands.len() / 2], row.depth[row.depth.len() / 2]);
        if let Some((k, target)) = ratio_target(&row.name) {
            ratios.push((row.name.clone(), ms(p50) / (k as f64 * ms(cas)).max(1e-9), k, target));
        }
        println!(
            "{:<24} {:>6.2}ms {:>6.2}ms {:>8.2}ms {:>9} {:>7} {:>7} {:>7.2}ms {:>9.2}ms",
            row.name,
            ms(p50),
            ms(p99),
            ms(bound),
            commands,
            depth,
            row.target,
            ms(cmd),
            ms(cmd) * depth as f64
        );
        if p50 > bound || depth > row.target {
            verdicts.push(format!(
                "{}: p50 {:.2} ms, depth {depth} (target {:.2} ms, {})",
                row.name,
                ms(p50),
                ms(bound),
                row.target
            ));
        }
    }
    println!();
    println!("p50, p99: latency at the client; target p50 = target round trips x R + 1 ms; commands, depth: the");
    println!("median number of driver commands that started and finished while the request waited, and their");
    println!("dependent depth (round trips one after the other); cmd p50: the median time of one of those");
    println!("commands, R plus the server's own time; depth x cmd: what the chain of them costs.");
    println!();
    println!("raw compare-and-set (driver, updateOne on _id and version, through the proxy): p50 {:.2} ms", ms(cas));
    for (name, ratio, k, target) in &ratios {
        let ok = *ratio <= *target;
        println!(
            "  {name}: p50 / ({k} x raw) = {ratio:.2}x (target <= {target:.1}x){}",
            if ok { "" } else { ": not met" }
        );
        if !ok {
            verdicts.push(format!("{name}: {ratio:.2}x {k} raw compare-and-sets (target {target:.1}x)"));
        }
    }
    if args.trace {
        println!();
        println!("the last request of each workload: depth, start, length, command and collection");
        for row in &traced {
            println!("  {}", row.0);
            for line in &row.1 {
                println!("{line}");
            }
        }
    }
    if verdicts.is_empty() {
        println!("every request within its target");
    } else {
        println!("over target:");
        for v in verdicts {
            println!("  {v}");
        }
    }
    gateway.stop().await;
    if let Ok(store) = MongoStore::connect(uri, &database).await {
        let _ = store.drop_database().await;
    }
}

/// The raw compare-and-sets a request of workload `name` is weighed
/// against, and its ratio target (issue targets in the module's doc).
fn ratio_target(name: &str) -> Option<(usize, f64)> {
    match name {
        "single update" => Some((1, 2.5)),
        "k=2 transaction" => Some((2, 2.0)),
        "k=10 transaction" => Some((10, 1.0)),
        _ => None,
    }
}

/// The p50 of `samples` raw compare-and-sets through `uri`, one at a time:
/// `updateOne({_id, v: n}, {$set: {v: n + 1}})` on documents of their own
/// collection, each expected to match.
async fn raw_cas(uri: &str, database: &str, samples: usize) -> Duration {
    use mongodb::bson::{Document, doc};
    let client = mongodb::Client::with_uri_str(uri).await.expect("the driver connects through the proxy");
    let coll = client.database(database).collection::<Document>("raw_cas");
    let docs = 50;
    for i in 0..docs {
        coll.insert_one(doc! {"_id": format!("r{i}"), "v": 0_i64, "n": 0_i64}).await.expect("seed");
    }
    let mut versions = vec![0_i64; docs];
    let mut lat = Vec::with_capacity(samples);
    for i in 0..samples.max(50) {
        let d = i % docs;
        let t = Instant::now();
        let res = coll
            .update_one(
                doc! {"_id": format!("r{d}"), "v": versions[d]},
                doc! {"$set": {"v": versions[d] + 1}, "$inc": {"n": 1}},
            )
            .await
            .expect("raw compare-and-set");
        lat.push(t.elapsed());
        assert_eq!(res.modified_count, 1, "a raw compare-and-set matched");
        versions[d] += 1;
    }
    lat.sort();
    percentile(&lat, 0.5)
}

/// `samples` requests one at a time, each followed by a pause for its
/// background work: latency, commands and depth of each.
async fn measure(monitor: &Monitor, samples: usize, mut request: impl FnMut(usize) -> reqwest::RequestBuilder) -> Row {
    let mut row = Row {
        name: String::new(),
        lat: Vec::new(),
        commands: Vec::new(),
        depth: Vec::new(),
        took: Vec::new(),
        target: 0,
        last: Vec::new(),
    };
    for i in 0..samples {
        let built = request(i);
        // The work the request before left for after its answer is done.
        monitor.settle(Duration::from_millis(20)).await;
        monitor.forget();
        let from = Instant::now();
        let res = built.send().await.expect("the gateway answers");
        let status = res.status();
        let _ = res.bytes().await;
        let to = Instant::now();
        assert!(status.is_success(), "request {i}: {status}");
        let (commands, depth, took, lines) = monitor.within(from, to);
        row.took.extend(took);
        row.last = lines;
        row.lat.push(to - from);
        row.commands.push(commands);
        row.depth.push(depth);
    }
    row
}

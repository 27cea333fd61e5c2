//! The peer workloads against PostgreSQL with a client of the same kind as
//! txgate's in [`super::peer`]: this binary, on the same tokio runtime,
//! one connection per client over loopback (tokio-postgres; BEGIN and
//! COMMIT as simple queries, the updates as prepared statements), on the
//! tables `scripts/peer/setup.sql` makes. `scripts/bench --peer postgres`
//! prints these beside txgate's and pgbench's.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use rand::Rng;
use tokio_postgres::{Client, NoTls};

use super::{ms, percentile};

const BANK_ACCOUNTS: i32 = 100;
const BANK_CLIENTS: usize = 16;
const POOL: i32 = 2000;

async fn connect(url: &str) -> Client {
    let (client, connection) = tokio_postgres::connect(url, NoTls).await.expect("connect to PostgreSQL");
    tokio::spawn(async move {
        if let Err(err) = connection.await {
            eprintln!("PostgreSQL connection: {err}");
        }
    });
    client
}

/// Update transactions of `k` consecutive rows of `pool` from a random
/// start, one after the other for `seconds`: sorted latencies.
async fn transactions(client: &Client, k: i32, seconds: f64) -> Vec<Duration> {
    let update = client.prepare("UPDATE pool SET balance = balance + 1 WHERE id = $1").await.expect("prepare");
    let until = Instant::now() + Duration::from_secs_f64(seconds);
    let mut lat = Vec::new();
    while Instant::now() < until {
        let a = rand::rng().random_range(1..=POOL - k);
        let t = Instant::now();
        client.batch_execute("BEGIN").await.expect("begin");
        for id in a..a + k {
            client.execute(&update, &[&id]).await.expect("update");
        }
        client.batch_execute("COMMIT").await.expect("commit");
        lat.push(t.elapsed());
    }
    lat.sort();
    lat
}

fn report(name: &str, lat: &[Duration]) {
    println!("peer postgres {name} {:.3} ({} samples)", ms(percentile(lat, 0.5)), lat.len());
}

pub async fn run(url: &str, seconds: f64) {
    println!(
        "peer workloads: PostgreSQL from this binary (tokio-postgres, one connection per client), {seconds} s each"
    );
    let client = connect(url).await;
    let single = client.prepare("UPDATE single SET n = n + 1 WHERE id = $1").await.expect("prepare");
    let until = Instant::now() + Duration::from_secs_f64(seconds);
    let mut lat = Vec::new();
    while Instant::now() < until {
        let id = rand::rng().random_range(1..=100);
        let t = Instant::now();
        client.execute(&single, &[&id]).await.expect("update");
        lat.push(t.elapsed());
    }
    lat.sort();
    report("single_update_p50_ms", &lat);
    report("k2_txn_p50_ms", &transactions(&client, 2, seconds).await);
    report("k10_txn_p50_ms", &transactions(&client, 10, seconds).await);

    // The contended bank: rows updated in id order, so that no transfer
    // waits for a deadlock to be detected.
    let committed = Arc::new(AtomicU64::new(0));
    let mut clients = tokio::task::JoinSet::new();
    let mut connections = Vec::new();
    for _ in 0..BANK_CLIENTS {
        connections.push(connect(url).await);
    }
    let start = Instant::now();
    let until = start + Duration::from_secs_f64(seconds);
    for client in connections {
        let committed = Arc::clone(&committed);
        clients.spawn(async move {
            let take = client.prepare("UPDATE bank SET balance = balance - 1 WHERE id = $1").await.expect("prepare");
            let give = client.prepare("UPDATE bank SET balance = balance + 1 WHERE id = $1").await.expect("prepare");
            while Instant::now() < until {
                let (a, b) = {
                    let mut rng = rand::rng();
                    let a = rng.random_range(0..BANK_ACCOUNTS);
                    (a, (a + rng.random_range(1..BANK_ACCOUNTS)) % BANK_ACCOUNTS)
                };
                let (lo, hi) = (a.min(b) + 1, a.max(b) + 1);
                client.batch_execute("BEGIN").await.expect("begin");
                client.execute(&take, &[&lo]).await.expect("update");
                client.execute(&give, &[&hi]).await.expect("update");
                client.batch_execute("COMMIT").await.expect("commit");
                committed.fetch_add(1, Ordering::Relaxed);
            }
        });
    }
    while clients.join_next().await.is_some() {}
    let per_sec = committed.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64();
    println!("peer postgres bank_commits_per_sec {per_sec:.0} ({} committed)", committed.load(Ordering::Relaxed));
}

/// The data and queries of `bench queries` in PostgreSQL: a table of the
/// same rows, a B-tree index on (status, amount DESC, id) (the order
/// txgate's index gives the same query), the page of 50 and the count.
pub async fn queries(url: &str, docs: usize, samples: usize) {
    use super::queries::{Order, STATUSES};
    let client = connect(url).await;
    let statuses = STATUSES.iter().map(|s| format!("'{s}'")).collect::<Vec<_>>().join(",");
    let t = Instant::now();
    client
        .batch_execute(&format!(
            "DROP TABLE IF EXISTS docs;
             CREATE TABLE docs (id text PRIMARY KEY, status text, amount bigint, customer text);
             INSERT INTO docs SELECT 'd' || lpad(g::text, 7, '0'), (ARRAY[{statuses}])[g % 10 + 1],
                 (g::bigint * 7919) % 1000003, 'c' || (g % 1000) FROM generate_series(0, {}) g;",
            docs - 1
        ))
        .await
        .expect("load");
    println!("queries postgres load: {docs} rows in {:.1} s", t.elapsed().as_secs_f64());
    let t = Instant::now();
    client.batch_execute("CREATE INDEX docs_status_amount ON docs (status, amount DESC, id)").await.expect("index");
    println!("queries postgres build_seconds {:.1} (no writes going on)", t.elapsed().as_secs_f64());
    client.batch_execute("VACUUM ANALYZE docs").await.expect("vacuum");
    let page = client
        .prepare(
            "SELECT id, status, amount, customer FROM docs WHERE status = $1 AND amount < $2 \
             ORDER BY amount DESC, id LIMIT 50",
        )
        .await
        .expect("prepare");
    let mut lat = Vec::with_capacity(samples);
    for _ in 0..samples {
        let (status, below) = {
            let mut rng = rand::rng();
            (STATUSES[rng.random_range(0..10)], rng.random_range(10_000..1_000_003_i64))
        };
        let t = Instant::now();
        let rows = client.query(&page, &[&status, &below]).await.expect("page");
        // Each row decoded into the typed row txgate's client decodes.
        let orders: Vec<Order> = rows
            .iter()
            .map(|r| Order { id: r.get(0), status: r.get(1), amount: r.get(2), customer: r.get(3) })
            .collect();
        lat.push(t.elapsed());
        assert!(
            orders.len() <= 50 && orders.iter().all(|o| o.status == status && o.amount < below && !o.id.is_empty())
        );
    }
    lat.sort();
    println!("queries postgres page_p50_ms {:.3}", ms(percentile(&lat, 0.5)));
    println!("queries postgres page_p99_ms {:.3}", ms(percentile(&lat, 0.99)));
    let count = client.prepare("SELECT count(*) FROM docs WHERE status = $1").await.expect("prepare");
    let plan = client
        .query("EXPLAIN SELECT count(*) FROM docs WHERE status = 'open'", &[])
        .await
        .expect("explain")
        .iter()
        .map(|r| r.get::<_, String>(0))
        .collect::<Vec<_>>()
        .join(" / ");
    println!("  PostgreSQL's count: {plan}");
    let mut lat = Vec::new();
    for i in 0..(samples / 10).max(20) {
        let t = Instant::now();
        let n: i64 = client.query_one(&count, &[&STATUSES[i % 10]]).await.expect("count").get(0);
        lat.push(t.elapsed());
        assert!(n > 0);
    }
    lat.sort();
    println!("queries postgres count_p50_ms {:.3}", ms(percentile(&lat, 0.5)));
    println!("queries postgres count_p99_ms {:.3}", ms(percentile(&lat, 0.99)));
    // The same documents counted through a range on the next field, then
    // about half of them.
    let count = client.prepare("SELECT count(*) FROM docs WHERE status = $1 AND amount >= $2").await.expect("prepare");
    for (name, from) in [("count_range", 0_i64), ("count_half", 500_000)] {
        let mut lat = Vec::new();
        for i in 0..(samples / 10).max(20) {
            let t = Instant::now();
            let n: i64 = client.query_one(&count, &[&STATUSES[i % 10], &from]).await.expect("count").get(0);
            lat.push(t.elapsed());
            assert!(n > 0);
        }
        lat.sort();
        println!("queries postgres {name}_p50_ms {:.3}", ms(percentile(&lat, 0.5)));
    }
}

//! The cost of a per-document rule (part of `bench queries`): on the same
//! store and data, a gateway with an API key and an issuer of users'
//! tokens; a rule that lets a user read and update the orders of the
//! status their token names. Taking turns, the same page of 50 (status =
//! s, amount < x, by -amount) and the same single write (a patch of one
//! order), once with the admin key (no rule applies) and once with a
//! user's token (the rule applies: the caller's filter AND the grant's
//! match, along the same index; the write judged before and after).

use std::time::Instant;

use rand::Rng;
use serde_json::json;
use txgate::config::{Config, IssuerEntry, StoreConfig};
use txgate_store::DynStore;

use super::queries::{COLL, Page, STATUSES, p50_p99, row};

const KEY: &str = "bench-admin-key-0123456789abcdef";
pub(super) const SECRET: &str = "bench-hs256-secret-0123456789abcdef-0123456789";
pub(super) const ISSUER: &str = "http://127.0.0.1:9/bench";

fn token(status: &str) -> String {
    signed(&format!("user-{status}"), json!({"status": status}))
}

/// A token of the bench's issuer for `sub`, a reader for an hour, with
/// the claims `extra` besides.
pub(super) fn signed(sub: &str, extra: serde_json::Value) -> String {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock").as_secs();
    let mut claims = json!({"iss": ISSUER, "sub": sub, "aud": "bench", "iat": now,
        "exp": now + 3600, "roles": ["reader"]});
    if let (Some(claims), Some(extra)) = (claims.as_object_mut(), extra.as_object()) {
        claims.extend(extra.clone());
    }
    jsonwebtoken::encode(
        &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256),
        &claims,
        &jsonwebtoken::EncodingKey::from_secret(SECRET.as_bytes()).expect("a key"),
    )
    .expect("a token")
}

/// Pages and writes with the key and with a user's token under a rule,
/// `samples` of each, over `docs` documents already loaded (with the
/// index on `status`, `-amount` ready).
pub(super) async fn run(store: StoreConfig, raw: DynStore, docs: usize, samples: usize) {
    let entry = IssuerEntry {
        url: ISSUER.into(),
        name: Some("bench".into()),
        audiences: vec!["bench".into()],
        algorithms: Some(vec!["HS256".into()]),
        roles: [("reader".to_owned(), "write@orders".to_owned())].into(),
        rate: Some("1000000/s".into()),
        hs256_secret: Some(SECRET.parse().expect("a secret")),
        ..Default::default()
    };
    let config = Config {
        store,
        api_keys: txgate::testing::keys::parse_keys(&format!("{KEY}:admin")).expect("a key"),
        issuers: vec![entry.resolve(1).expect("an issuer")],
        ..Config::default()
    };
    let gateway = super::scale::Gateway::start_with(config, raw).await;
    let (client, base) = (reqwest::Client::new(), gateway.base.clone());
    let rules = json!({"grants": [{"name": "by_status", "roles": ["reader"],
        "match": {"status": {"$auth": "claims.status"}}, "actions": ["read", "update"]}]});
    let put = client.put(format!("{base}/v1/collections/{COLL}/rules")).bearer_auth(KEY).json(&rules).send().await;
    assert_eq!(put.expect("rules").status(), 200);
    let tokens: Vec<String> = STATUSES.iter().map(|s| token(s)).collect();
    let (mut key_pages, mut user_pages) = (Vec::with_capacity(samples), Vec::with_capacity(samples));
    let (mut key_writes, mut user_writes) = (Vec::with_capacity(samples), Vec::with_capacity(samples));
    // In turns of 50 of each, so that the machine's drift meets both alike.
    for i in 0..2 * samples.div_ceil(50) * 50 {
        let as_user = (i / 50) % 2 == 1;
        let (s, below, n) = {
            let mut rng = rand::rng();
            (rng.random_range(0..10), rng.random_range(10_000..1_000_003_i64), rng.random_range(0..docs / 10))
        };
        let who = if as_user { tokens[s].as_str() } else { KEY };
        let body =
            json!({"filter": {"status": STATUSES[s], "amount": {"$lt": below}}, "sort": ["-amount"], "limit": 50});
        let t = Instant::now();
        let resp = client.post(format!("{base}/v1/collections/{COLL}/query")).bearer_auth(who).json(&body).send().await;
        let page = resp.expect("query").json::<Page>().await.expect("page").orders();
        (if as_user { &mut user_pages } else { &mut key_pages }).push(t.elapsed());
        assert!(page.iter().all(|o| o.status == STATUSES[s] && o.amount < below));
        // One order of that status (document i has status i % 10).
        let id = row(n * 10 + s).0;
        let t = Instant::now();
        let resp = client
            .patch(format!("{base}/v1/collections/{COLL}/documents/{id}"))
            .bearer_auth(who)
            .json(&json!({"set": {"note": i}}))
            .send()
            .await
            .expect("patch");
        assert_eq!(resp.status(), 200, "{}", resp.text().await.unwrap_or_default());
        (if as_user { &mut user_writes } else { &mut key_writes }).push(t.elapsed());
    }
    let (kp50, kp99) = p50_p99(&mut key_pages);
    let (up50, up99) = p50_p99(&mut user_pages);
    let (kw50, kw99) = p50_p99(&mut key_writes);
    let (uw50, uw99) = p50_p99(&mut user_writes);
    println!("a rule's cost (target: at most 10% over the key's p50):");
    println!(
        "  page of 50 with the admin key: p50 {kp50:.3} ms, p99 {kp99:.3} ms; with a user's token under a rule: p50 {up50:.3} ms, p99 {up99:.3} ms ({:+.1}%)",
        (up50 / kp50 - 1.0) * 100.0
    );
    println!(
        "  single write with the admin key: p50 {kw50:.3} ms, p99 {kw99:.3} ms; with a user's token under a rule: p50 {uw50:.3} ms, p99 {uw99:.3} ms ({:+.1}%)",
        (uw50 / kw50 - 1.0) * 100.0
    );
    println!("queries txgate rule_page_p50_ms {up50:.3}");
    println!("queries txgate key_page_p50_ms {kp50:.3}");
    println!("queries txgate rule_write_p50_ms {uw50:.3}");
    println!("queries txgate key_write_p50_ms {kw50:.3}");
    gateway.stop().await;
}

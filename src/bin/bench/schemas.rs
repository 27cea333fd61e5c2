//! The cost of validation (docs/guides/validation.md): a check in
//! process, the worst accepted case, and a single write over HTTP with and
//! without a schema of 20 properties, in turns on the same gateway.
//!
//! - **check**: one 20-field document against the 20-property schema, in
//!   process (compiled once, as the gateway keeps it).
//! - **worst accepted**: the costliest check the bounds let through: a
//!   schema whose `$ref`s double at each of 14 levels (accepted: under the
//!   100,000 subschemas a schema may apply), and an array of as many items
//!   as keep the document's cost under the per-document limit; a pattern
//!   that backtracks catastrophically elsewhere, on a 100,000-character
//!   string.
//! - **single write**: a PATCH of one field and a create, each on a
//!   collection without a schema and on one with the 20-property schema,
//!   in turns of 50 so that the machine's drift meets both alike.

use std::time::{Duration, Instant};

use rand::Rng;
use serde_json::{Map, Value, json};
use txgate::config::{Config, StoreConfig};
use txgate::testing::schemas::{MAX_CHECK_COST, compile};

use super::queries::p50_p99;
use super::{ms, percentile, progress};

/// A schema of 20 properties: strings with lengths, patterns and formats,
/// numbers with bounds, an enum, a nested object and an array.
fn schema20() -> Value {
    let mut properties = Map::new();
    for i in 0..20 {
        let p = match i % 5 {
            0 => json!({"type": "string", "minLength": 1, "maxLength": 200}),
            1 => json!({"type": "integer", "minimum": 0, "maximum": 1_000_000_000}),
            2 => json!({"type": "string", "pattern": "^[A-Z]{3}-[0-9]{1,8}$"}),
            3 => json!({"enum": ["open", "paid", "shipped", "cancelled"]}),
            _ => json!({"type": "number", "multipleOf": 0.01}),
        };
        properties.insert(format!("f{i:02}"), p);
    }
    properties.insert("f05".into(), json!({"type": "string", "format": "email"}));
    properties.insert("f10".into(), json!({"type": "object", "required": ["city"], "properties": {"city": {"type": "string"}, "zip": {"type": "string", "pattern": "^[0-9]{5}$"}}}));
    properties
        .insert("f15".into(), json!({"type": "array", "maxItems": 20, "items": {"type": "integer", "minimum": 0}}));
    let required: Vec<String> = properties.keys().cloned().collect();
    json!({"type": "object", "required": required, "properties": properties, "additionalProperties": false})
}

fn doc20(n: u64) -> Value {
    let mut doc = Map::new();
    for i in 0..20 {
        let v = match i % 5 {
            0 => json!(format!("name {n}")),
            1 => json!(n),
            2 => json!(format!("ABC-{}", n % 100_000)),
            3 => json!("paid"),
            _ => json!((n % 1000) as f64 / 100.0),
        };
        doc.insert(format!("f{i:02}"), v);
    }
    doc.insert("f05".into(), json!(format!("user{n}@example.com")));
    doc.insert("f10".into(), json!({"city": "Lyon", "zip": "69001"}));
    doc.insert("f15".into(), json!([1, 2, 3]));
    Value::Object(doc)
}

/// The mean time of `f` over `n` runs, in microseconds.
fn micros(n: usize, mut f: impl FnMut()) -> f64 {
    let started = Instant::now();
    for _ in 0..n {
        f();
    }
    started.elapsed().as_secs_f64() * 1e6 / n as f64
}

/// The in-process figures: a check, and the worst accepted cases.
fn in_process() {
    let compiled = compile(&schema20()).expect("the 20-property schema");
    let doc = doc20(7);
    assert!(compiled.violations(&doc).0.is_empty(), "the bench's document is valid");
    let us = micros(20_000, || {
        std::hint::black_box(compiled.violations(&doc));
    });
    println!("check of a 20-field document against a 20-property schema, in process: {us:.1} µs");
    // Doubling references: about 2^16 subschemas per item.
    let mut defs = Map::new();
    for i in 0..14 {
        let next = format!("#/$defs/d{}", i + 1);
        defs.insert(format!("d{i}"), json!({"allOf": [{"$ref": next}, {"$ref": next}]}));
    }
    defs.insert("d14".into(), json!({"type": "integer"}));
    let doubling =
        compile(&json!({"$defs": defs, "type": "array", "items": {"$ref": "#/$defs/d0"}})).expect("accepted");
    let per_item = doubling.levels.get(1).copied().unwrap_or(1).max(1);
    let items = ((MAX_CHECK_COST - doubling.levels[0]) / per_item) as usize;
    let worst = Value::Array((0..items).map(|i| json!(i)).collect());
    assert!(doubling.cost(&worst) <= MAX_CHECK_COST);
    let started = Instant::now();
    let (found, _) = doubling.violations(&worst);
    let took = started.elapsed();
    assert!(found.is_empty(), "checked, not refused: {found:?}");
    println!(
        "worst accepted case: refs doubling 14 levels ({per_item} subschemas per item), {items} items (cost {} of {MAX_CHECK_COST}): {:.1} ms",
        doubling.cost(&worst),
        ms(took)
    );
    let over = Value::Array((0..items * 2).map(|i| json!(i)).collect());
    let started = Instant::now();
    let refused = doubling.violations(&over).0;
    println!("  twice as many items: refused unchecked ({}) in {:.3} ms", refused[0].keyword, ms(started.elapsed()));
    let unique = compile(&json!({"type": "array", "uniqueItems": true, "maxItems": 10_000})).expect("accepted");
    let objects = Value::Array((0..10_000).map(|i| json!({"a": i, "b": [i, i + 1], "c": "x"})).collect());
    let started = Instant::now();
    assert!(unique.violations(&objects).0.is_empty());
    println!("uniqueItems under its largest maxItems (10,000 distinct objects): {:.1} ms", ms(started.elapsed()));
    let pattern = compile(&json!({"properties": {"s": {"type": "string", "pattern": "^(a+)+$"}}})).expect("accepted");
    let hostile = json!({"s": format!("{}!", "a".repeat(100_000))});
    let started = Instant::now();
    let found = pattern.violations(&hostile).0;
    println!(
        "a pattern that backtracks catastrophically elsewhere (^(a+)+$) on 100,000 characters: {} in {:.2} ms (linear-time engine)",
        found[0].keyword,
        ms(started.elapsed())
    );
}

pub async fn run(store: StoreConfig, samples: usize) {
    println!("txgate bench schemas");
    in_process();
    let gateway = super::scale::Gateway::start(Config { store, ..Config::default() }).await;
    let (client, base) = (reqwest::Client::new(), gateway.base.clone());
    let put = client.put(format!("{base}/v1/collections/checked/schemas/1")).json(&schema20()).send().await;
    assert_eq!(put.expect("a declaration").status(), 202);
    loop {
        let state: Value = client
            .get(format!("{base}/v1/collections/checked/schemas/1"))
            .send()
            .await
            .expect("GET")
            .json()
            .await
            .expect("JSON");
        if state["state"] == "active" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    progress("loading 200 documents in each collection");
    let docs = 200u64;
    for coll in ["plain", "checked"] {
        for i in 0..docs {
            let mut d = doc20(i);
            d["_id"] = json!(format!("d{i:04}"));
            let r = client.post(format!("{base}/v1/collections/{coll}/documents")).json(&d).send().await.expect("POST");
            assert_eq!(r.status(), 201, "{}", r.text().await.unwrap_or_default());
        }
    }
    progress(&format!("{samples} PATCHes and {samples} creates on each, in turns of 50"));
    let mut lat: [[Vec<Duration>; 2]; 2] = Default::default();
    let mut created = 0u64;
    for i in 0..2 * samples.div_ceil(50) * 50 {
        let which = (i / 50) % 2;
        let coll = ["plain", "checked"][which];
        let n = rand::rng().random_range(0..docs);
        let started = Instant::now();
        let r = client
            .patch(format!("{base}/v1/collections/{coll}/documents/d{n:04}"))
            .json(&json!({"set": {"f01": i, "f03": "shipped"}}))
            .send()
            .await
            .expect("PATCH");
        lat[0][which].push(started.elapsed());
        assert_eq!(r.status(), 200, "{}", r.text().await.unwrap_or_default());
        created += 1;
        let started = Instant::now();
        let r = client
            .post(format!("{base}/v1/collections/{coll}/documents"))
            .json(&doc20(created))
            .send()
            .await
            .expect("POST");
        lat[1][which].push(started.elapsed());
        assert_eq!(r.status(), 201, "{}", r.text().await.unwrap_or_default());
    }
    for (name, [plain, checked]) in ["PATCH of one field", "create"].iter().zip(lat.iter_mut()) {
        let mean = |l: &[Duration]| ms(l.iter().sum::<Duration>()) / l.len().max(1) as f64;
        let (plain_mean, checked_mean) = (mean(plain), mean(checked));
        let (p50, p99) = p50_p99(plain);
        let (c50, c99) = p50_p99(checked);
        println!(
            "single write, {name}: no schema p50 {p50:.3} ms p99 {p99:.3} ms mean {plain_mean:.3} ms; \
             20-property schema p50 {c50:.3} ms p99 {c99:.3} ms mean {checked_mean:.3} ms; \
             ratio p50 {:.3}, mean {:.3} (target <= 1.10)",
            c50 / p50,
            checked_mean / plain_mean
        );
        let _ = percentile(plain, 0.5);
    }
    gateway.stop().await;
}

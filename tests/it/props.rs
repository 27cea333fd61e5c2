//! Property: whatever JSON a client throws at the write endpoints (bodies,
//! patches, merge patches, transactions; deep, oddly named, huge numbers),
//! the gateway answers below 500, stays up, and a refused request writes
//! nothing. Seeded: `TXGATE_PROPTEST_SEED` replays a run (the seed is
//! printed), `TXGATE_PROPTEST_CASES` sets how many requests are tried.

use std::time::{Duration, Instant};

use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestCaseError, TestRng, TestRunner};
use reqwest::Method;
use serde_json::{Map, Value, json};

use crate::support::{Backend, TestApp, expect};

crate::on_both_backends!(random_writes_never_fail_the_gateway_and_refusals_write_nothing,);

const C: &str = "props";
const D: &str = "/v1/collections/props/documents";

fn nested(levels: usize) -> Value {
    (0..levels).fold(json!(1), |v, _| json!({ "a": v }))
}

fn key() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => "[a-c]{1,2}",
        1 => Just("_id".to_owned()),
        1 => Just("_meta".to_owned()),
        1 => Just("$set".to_owned()),
        1 => Just("a.b".to_owned()),
        1 => Just(String::new()),
        1 => Just("x\u{0}y".to_owned()),
        1 => (1usize..160).prop_map(|n| vec!["a"; n].join(".")),
    ]
}

fn scalar() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        prop::num::f64::NORMAL.prop_map(|f| json!(f)),
        Just(json!(f64::MAX)),
        Just(json!(u64::MAX)),
        "[a-z]{0,6}".prop_map(Value::String),
    ]
}

fn value() -> impl Strategy<Value = Value> {
    let tree = scalar().prop_recursive(4, 48, 5, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
            prop::collection::vec((key(), inner), 0..5).prop_map(|kv| Value::Object(kv.into_iter().collect())),
        ]
    });
    prop_oneof![8 => tree, 1 => (90usize..127).prop_map(nested)]
}

fn object() -> impl Strategy<Value = Map<String, Value>> {
    prop::collection::vec((key(), value()), 0..5).prop_map(|kv| kv.into_iter().collect())
}

fn patch() -> impl Strategy<Value = Value> {
    (
        prop::option::of(object()),
        prop::option::of(prop::collection::vec(key(), 0..3)),
        prop::option::of(prop::collection::vec((key(), prop_oneof![scalar(), Just(json!(1e308))]), 0..3)),
    )
        .prop_map(|(set, unset, inc)| {
            let mut p = Map::new();
            if let Some(set) = set {
                p.insert("set".into(), Value::Object(set));
            }
            if let Some(unset) = unset {
                p.insert("unset".into(), json!(unset));
            }
            if let Some(inc) = inc {
                p.insert("inc".into(), Value::Object(inc.into_iter().collect()));
            }
            Value::Object(p)
        })
}

fn action() -> impl Strategy<Value = Value> {
    (
        prop_oneof![Just("insert"), Just("update"), Just("replace"), Just("delete"), Just("check"), Just("bogus")],
        prop_oneof![4 => Just(C), 1 => Just("other"), 1 => Just("_txns"), 1 => Just("bad name")],
        prop_oneof![Just("p"), Just("q"), Just("r"), Just("")],
        prop::option::of(-2i64..4),
        object(),
        patch(),
    )
        .prop_map(|(op, coll, id, if_version, data, patch)| {
            let mut a = json!({"op": op, "collection": coll, "id": id});
            if let Some(v) = if_version {
                a["if_version"] = json!(v);
            }
            match op {
                "insert" | "replace" => a["data"] = Value::Object(data),
                "update" => {
                    for (k, v) in patch.as_object().unwrap() {
                        a[k] = v.clone();
                    }
                }
                _ => {}
            }
            a
        })
}

fn transaction() -> impl Strategy<Value = Value> {
    (
        prop::collection::vec(action(), 0..4),
        prop::option::of((
            prop_oneof![
                Just("https://example.com/h"),
                Just("http://127.0.0.1:9/h"),
                Just("http://[::127.0.0.1]/"),
                Just("ftp://x/")
            ],
            prop::collection::vec(
                (prop_oneof![Just("X-A"), Just("Connection"), Just("bad header")], "[a-z]{0,4}"),
                0..2,
            ),
            prop::option::of(value()),
        )),
    )
        .prop_map(|(actions, hook)| {
            let mut t = json!({"actions": actions});
            if let Some((url, headers, body)) = hook {
                let headers: Map<String, Value> = headers.into_iter().map(|(k, v)| (k.to_owned(), json!(v))).collect();
                let mut h = json!({"url": url, "headers": headers});
                if let Some(body) = body {
                    h["body"] = body;
                }
                t["hooks"] = json!([h]);
            }
            t
        })
}

/// One request a client could make.
#[derive(Clone, Debug)]
enum Case {
    Create(Value),
    Replace(Value),
    Patch(Value),
    MergePatch(Value),
    Transaction(Value),
}

fn case() -> impl Strategy<Value = Case> {
    prop_oneof![
        object().prop_map(|o| Case::Create(Value::Object(o))),
        value().prop_map(Case::Create),
        object().prop_map(|o| Case::Replace(Value::Object(o))),
        patch().prop_map(Case::Patch),
        value().prop_map(Case::Patch),
        object().prop_map(|o| Case::MergePatch(Value::Object(o))),
        transaction().prop_map(Case::Transaction),
    ]
}

/// What a refused request must leave as it was: every document's id and
/// version in the collections requests touch, and the event log's head.
async fn snapshot(app: &TestApp, log: &txgate::testing::events::Log) -> (Vec<(String, i64)>, u64) {
    let mut docs = Vec::new();
    for coll in [C, "other"] {
        let list = expect(app.get(&format!("/v1/collections/{coll}/documents?limit=1000")).await, 200).await;
        for d in list["items"].as_array().unwrap() {
            docs.push((format!("{coll}/{}", d["id"].as_str().unwrap()), d["version"].as_i64().unwrap()));
        }
    }
    (docs, log.head().await.unwrap())
}

async fn check(app: &TestApp, log: &txgate::testing::events::Log, case: &Case) -> Result<(), String> {
    let before = snapshot(app, log).await;
    let req = match case {
        Case::Create(body) => app.request(Method::POST, D).json(body),
        Case::Replace(body) => app.request(Method::PUT, &format!("{D}/p")).json(body),
        Case::Patch(body) => app.request(Method::PATCH, &format!("{D}/p")).json(body),
        Case::MergePatch(body) => app
            .request(Method::PATCH, &format!("{D}/p"))
            .header("content-type", "application/merge-patch+json")
            .body(body.to_string()),
        Case::Transaction(body) => app.request(Method::POST, "/v1/transactions").json(body),
    };
    let res = req.send().await.map_err(|e| format!("no answer: {e}"))?;
    let status = res.status().as_u16();
    let text = res.text().await.unwrap_or_default();
    if status >= 500 {
        return Err(format!("answered {status}: {text}"));
    }
    let alive = app.get("/healthz").await.status();
    if alive != 200 {
        return Err(format!("healthz answered {alive}"));
    }
    if status < 400 {
        // What a success set going after its answer (a transaction's
        // roll-forward, a write's event) is done.
        app.settled().await;
    } else {
        // A refusal added nothing.
        let after = snapshot(app, log).await;
        if after != before {
            return Err(format!("refused with {status} but wrote: {before:?} -> {after:?}; answer {text}"));
        }
    }
    Ok(())
}

async fn random_writes_never_fail_the_gateway_and_refusals_write_nothing(backend: Backend) {
    let Some(app) = TestApp::spawn(backend).await else { return };
    expect(app.post(D, &json!({"_id": "p", "n": 1, "o": {"x": 1}})).await, 201).await;
    let seed: u64 = std::env::var("TXGATE_PROPTEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| rand::random::<u64>() >> 1);
    let cases: u32 =
        std::env::var("TXGATE_PROPTEST_CASES").ok().and_then(|s| s.parse().ok()).unwrap_or(match backend {
            Backend::Embedded => 300,
            Backend::Mongodb => 100,
            Backend::Memory => unreachable!("the memory store runs the store suite only"),
        });
    eprintln!("random writes ({backend:?}): seed {seed} (TXGATE_PROPTEST_SEED={seed} replays it), {cases} cases");
    let mut bytes = [0u8; 32];
    bytes[..8].copy_from_slice(&seed.to_le_bytes());
    let config = Config { cases, failure_persistence: None, max_shrink_iters: 200, ..Config::default() };
    let mut runner = TestRunner::new_with_rng(config, TestRng::from_seed(RngAlgorithm::ChaCha, &bytes));
    let handle = tokio::runtime::Handle::current();
    let app = std::sync::Arc::new(app);
    let shared = std::sync::Arc::clone(&app);
    let budget = Instant::now() + Duration::from_secs(240);
    let result = tokio::task::spawn_blocking(move || {
        let log = txgate::testing::events::Log::new(
            std::sync::Arc::clone(&shared.store),
            txgate::testing::events::Tap::default(),
            shared.config.events.clone(),
        );
        runner
            .run(&case(), |case| {
                if Instant::now() > budget {
                    return Ok(()); // time's up: the remaining cases pass untried
                }
                handle.block_on(check(&shared, &log, &case)).map_err(TestCaseError::fail)
            })
            .map_err(|e| e.to_string())
    })
    .await
    .unwrap();
    if let Err(failure) = result {
        panic!("seed {seed} (rerun with TXGATE_PROPTEST_SEED={seed}): {failure}");
    }
    std::sync::Arc::into_inner(app).unwrap().stop().await;
}

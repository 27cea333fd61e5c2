//! Per-document rules over HTTP, with users' tokens from the test's issuer:
//! owners and teams, on both stores. What a user reads, counts, pages
//! and streams is what the rules let them, each document once; what they
//! may not read is 404 on every path, writes included; what they may not
//! write is 403 naming the field; and no rule scans.

use std::collections::BTreeSet;

use reqwest::Method;
use serde_json::{Value, json};
use txgate::testing::keys::parse_keys;

use crate::support::{Backend, SseStream, TestApp, TestReceiver, expect, expect_problem};
use crate::users::{Issuer, RSA_A};

pub(crate) const ADMIN: &str = "admin-key-0123456789";
pub(crate) const WRITER: &str = "writer-key-0123456789";

/// A gateway on `backend` with the issuer (customers and agents may read
/// and write orders and notes) and two keys: an admin, and a writer.
pub(crate) async fn gateway(backend: Backend, issuer: &Issuer) -> Option<TestApp> {
    gateway_with(backend, issuer, |_| {}).await
}

/// [`gateway`], its configuration changed by `tweak`.
pub(crate) async fn gateway_with(
    backend: Backend,
    issuer: &Issuer,
    tweak: impl FnOnce(&mut txgate::config::Config) + Send + 'static,
) -> Option<TestApp> {
    let mut entry = issuer.entry();
    entry.roles = [
        ("customer".to_owned(), "write@orders+write@notes".to_owned()),
        ("agent".to_owned(), "write@orders".to_owned()),
    ]
    .into();
    // The users' rate is not what these tests are about.
    entry.rate = Some("100000/s".into());
    let resolved = entry.resolve(1).unwrap();
    TestApp::spawn_with(backend, move |c| {
        c.issuers = vec![resolved];
        c.api_keys = parse_keys(&format!("{ADMIN}:admin,{WRITER}:write")).unwrap();
        tweak(c);
    })
    .await
}

/// A token for `sub` with `roles`, in team `team` (a claim).
pub(crate) fn token(issuer: &Issuer, sub: &str, roles: &[&str], team: Option<&str>) -> String {
    let mut claims = issuer.claims(sub, roles);
    if let Some(team) = team {
        claims["team"] = json!(team);
    }
    RSA_A.sign(&claims)
}

pub(crate) async fn send(
    app: &TestApp,
    who: &str,
    method: Method,
    path: &str,
    body: Option<&Value>,
) -> reqwest::Response {
    let mut req = app.request(method, path).bearer_auth(who);
    if let Some(body) = body {
        req = req.json(body);
    }
    req.send().await.unwrap()
}

pub(crate) async fn ready_index(app: &TestApp, coll: &str, name: &str, fields: &[&str]) {
    let path = format!("/v1/collections/{coll}/indexes/{name}");
    let put = send(app, ADMIN, Method::PUT, &path, Some(&json!({"fields": fields}))).await;
    assert!(put.status().is_success(), "{}", put.text().await.unwrap());
    app.until("the index is ready", async || {
        app.advance(txgate::testing::indexes::GRACE);
        app.run_once("index_builds").await;
        let index = expect(send(app, ADMIN, Method::GET, &path, None).await, 200).await;
        index["state"] == "ready"
    })
    .await;
}

pub(crate) fn rules() -> Value {
    json!({"grants": [
        {"name": "own", "roles": ["customer"], "match": {"owner": {"$auth": "sub"}},
         "actions": ["read", "count", "stream", "create", "update", "delete"],
         "fields": {"write": ["item", "qty", "note"]}, "set": {"owner": "sub"}},
        {"name": "team", "roles": ["agent"], "match": {"team": {"$auth": "claims.team"}},
         "actions": ["read", "count", "stream", "update"],
         "fields": {"read": ["item", "qty", "team", "owner"], "write": ["note"]}},
    ]})
}

fn ids(page: &Value) -> Vec<String> {
    page["items"].as_array().unwrap().iter().map(|d| d["id"].as_str().unwrap().to_owned()).collect()
}

/// Every page of `coll` a user lists, `limit` at a time: the ids in order.
async fn list_all(app: &TestApp, who: &str, coll: &str, limit: usize) -> Vec<String> {
    let mut out = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let mut body = json!({"limit": limit});
        if let Some(a) = &after {
            body["after"] = json!(a);
        }
        let page =
            expect(send(app, who, Method::POST, &format!("/v1/collections/{coll}/query"), Some(&body)).await, 200)
                .await;
        out.extend(ids(&page));
        match page["next"].as_str() {
            Some(next) => after = Some(next.to_owned()),
            None => return out,
        }
    }
}

async fn count(app: &TestApp, who: &str, coll: &str) -> u64 {
    let body = expect(send(app, who, Method::GET, &format!("/v1/collections/{coll}/count"), None).await, 200).await;
    body["count"].as_u64().unwrap()
}

async fn owners_and_teams(backend: Backend) {
    let issuer = Issuer::start(&[&RSA_A]).await;
    let Some(app) = gateway(backend, &issuer).await else { return };
    for (name, fields) in [("owner", &["owner"][..]), ("team", &["team"]), ("owner_team", &["owner", "team"])] {
        ready_index(&app, "orders", name, fields).await;
    }
    let docs = "/v1/collections/orders/documents";
    for (id, owner, team) in
        [("o1", "ada", "red"), ("o2", "bob", "red"), ("o3", "ada", "blue"), ("o4", "cy", "blue"), ("o5", "cy", "red")]
    {
        let doc = json!({"_id": id, "owner": owner, "team": team, "item": "tea", "qty": 1, "secret": "s"});
        expect(send(&app, WRITER, Method::POST, docs, Some(&doc)).await, 201).await;
    }
    // Rules, set by an admin only, checked where they are written.
    let rules_path = "/v1/collections/orders/rules";
    let ada = token(&issuer, "ada", &["customer"], None);
    expect_problem(send(&app, &ada, Method::PUT, rules_path, Some(&rules())).await, 403, "forbidden").await;
    let bad = json!({"grants": [{"name": "x", "roles": ["customer"], "actions": ["read"], "match": {"o": {"$auth": "pwd"}}}]});
    let problem =
        expect_problem(send(&app, ADMIN, Method::PUT, rules_path, Some(&bad)).await, 422, "validation_failed").await;
    assert_eq!(problem["errors"][0]["pointer"], "/grants/0/match/o/$auth", "{problem}");
    let set = expect(send(&app, ADMIN, Method::PUT, rules_path, Some(&rules())).await, 200).await;
    assert_eq!((set["version"].as_i64(), set["state"].as_str()), (Some(1), Some("active")), "{set}");
    let read = expect(send(&app, ADMIN, Method::GET, rules_path, None).await, 200).await;
    assert_eq!(read["grants"], rules()["grants"]);
    // An admin's collection record (what the console lists) carries them in brief.
    let record = expect(send(&app, ADMIN, Method::GET, "/v1/collections/orders", None).await, 200).await;
    assert_eq!(record["rules"], json!({"version": 1, "grants": ["own", "team"]}), "{record}");
    let record = expect(send(&app, WRITER, Method::GET, "/v1/collections/orders", None).await, 200).await;
    assert!(record.get("rules").is_none(), "{record}");

    // An owner: their own documents, on every read path, each named by its grant.
    let got = send(&app, &ada, Method::GET, &format!("{docs}/o1"), None).await;
    assert_eq!(got.headers()["txgate-grant"], "orders/own@1");
    let o1 = expect(got, 200).await;
    assert_eq!(o1["data"]["secret"], "s", "own reads every field: {o1}");
    for hidden in ["o2", "o4", "nothing-here"] {
        expect_problem(send(&app, &ada, Method::GET, &format!("{docs}/{hidden}"), None).await, 404, "not_found").await;
    }
    assert_eq!(list_all(&app, &ada, "orders", 1).await, ["o1", "o3"]);
    assert_eq!(count(&app, &ada, "orders").await, 2);
    let reads = json!({"documents": [{"collection": "orders", "id": "o1"}, {"collection": "orders", "id": "o2"}]});
    let batch = expect(send(&app, &ada, Method::POST, "/v1/reads", Some(&reads)).await, 200).await;
    assert_eq!(
        (batch["documents"][0]["status"].as_u64(), batch["documents"][1]["status"].as_u64()),
        (Some(200), Some(404))
    );

    // Writes: another's document is not there; a field the grant does not
    // let them write, or one the gateway sets, is named.
    for method in [Method::PATCH, Method::DELETE] {
        let body = (method == Method::PATCH).then(|| json!({"set": {"note": "mine"}}));
        let resp = send(&app, &ada, method, &format!("{docs}/o2"), body.as_ref()).await;
        expect_problem(resp, 404, "not_found").await;
    }
    let give_away = json!({"set": {"owner": "bob"}});
    let problem = expect_problem(
        send(&app, &ada, Method::PATCH, &format!("{docs}/o1"), Some(&give_away)).await,
        403,
        "rule_denied",
    )
    .await;
    assert_eq!(problem["errors"][0]["pointer"], "/owner", "{problem}");
    let patched = send(&app, &ada, Method::PATCH, &format!("{docs}/o1"), Some(&json!({"set": {"note": "hi"}}))).await;
    assert_eq!(patched.headers()["txgate-grant"], "orders/own@1");
    expect(patched, 200).await;
    let created = expect(send(&app, &ada, Method::POST, docs, Some(&json!({"item": "cake"}))).await, 201).await;
    assert_eq!(created["data"]["owner"], "ada", "the gateway sets the owner: {created}");
    let new_id = created["id"].as_str().unwrap().to_owned();
    for (body, pointer) in
        [(json!({"_id": "mine", "item": "x"}), "/_id"), (json!({"item": "x", "owner": "bob"}), "/owner")]
    {
        let problem = expect_problem(send(&app, &ada, Method::POST, docs, Some(&body)).await, 403, "rule_denied").await;
        assert_eq!(problem["errors"][0]["pointer"], pointer, "{problem}");
    }
    // A replace keeps what the gateway set.
    let replaced = send(&app, &ada, Method::PUT, &format!("{docs}/{new_id}"), Some(&json!({"item": "pie"}))).await;
    assert_eq!(expect(replaced, 200).await["data"]["owner"], "ada");
    expect(send(&app, &ada, Method::DELETE, &format!("{docs}/{new_id}"), None).await, 204).await;
    // Its tombstone is not revealed to them either.
    expect_problem(send(&app, &ada, Method::GET, &format!("{docs}/{new_id}"), None).await, 404, "not_found").await;

    // An agent: the team's documents, with only the fields the grant reads.
    let zed = token(&issuer, "zed", &["agent"], Some("red"));
    let page =
        expect(send(&app, &zed, Method::POST, "/v1/collections/orders/query", Some(&json!({}))).await, 200).await;
    assert_eq!(ids(&page), ["o1", "o2", "o5"]);
    for doc in page["items"].as_array().unwrap() {
        let fields: BTreeSet<&str> = doc["data"].as_object().unwrap().keys().map(String::as_str).collect();
        assert!(fields.is_subset(&BTreeSet::from(["item", "qty", "team", "owner"])), "{doc}");
    }
    let problem =
        expect_problem(send(&app, &zed, Method::DELETE, &format!("{docs}/o1"), None).await, 403, "rule_denied").await;
    assert!(problem["detail"].as_str().unwrap().contains("delete"), "{problem}");
    // Taking a document over is refused: the team grant may write `note` only.
    let take = json!({"set": {"team": "blue"}});
    expect_problem(send(&app, &zed, Method::PATCH, &format!("{docs}/o2"), Some(&take)).await, 403, "rule_denied").await;

    // What a grant does not let them read, they may not filter by, nor
    // learn by how a patch of it would apply; a replace keeps it.
    let by_secret = json!({"filter": {"secret": "s"}});
    let problem = expect_problem(
        send(&app, &zed, Method::POST, "/v1/collections/orders/query", Some(&by_secret)).await,
        403,
        "rule_denied",
    )
    .await;
    assert_eq!(problem["errors"][0]["pointer"], "/filter", "{problem}");
    let probe = json!({"inc": {"secret": 1}});
    let problem =
        expect_problem(send(&app, &zed, Method::PATCH, &format!("{docs}/o2"), Some(&probe)).await, 403, "rule_denied")
            .await;
    assert_eq!(problem["errors"][0]["pointer"], "/secret", "{problem}");
    let seen = page["items"][1]["data"].clone();
    let mut note = seen.clone();
    note["note"] = json!("called");
    expect(send(&app, &zed, Method::PUT, &format!("{docs}/o2"), Some(&note)).await, 200).await;
    let o2 = expect(send(&app, WRITER, Method::GET, &format!("{docs}/o2"), None).await, 200).await;
    assert_eq!((o2["data"]["secret"].as_str(), o2["data"]["note"].as_str()), (Some("s"), Some("called")), "{o2}");
    // A conflict shows only what the caller may read.
    let stale = app
        .request(Method::PATCH, &format!("{docs}/o2"))
        .bearer_auth(&zed)
        .header("if-match", "\"1\"")
        .json(&json!({"set": {"note": "late"}}))
        .send()
        .await
        .unwrap();
    let problem = expect_problem(stale, 409, "version_conflict").await;
    assert_eq!(problem["current"]["data"]["note"], json!(null), "note is not readable: {problem}");
    assert!(problem["current"]["data"].get("secret").is_none(), "{problem}");
    assert_eq!(problem["current"]["data"]["owner"], "bob", "{problem}");
    for change in problem["changes"].as_array().unwrap() {
        let changed: Vec<&str> = change["changed"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
        assert!(changed.iter().all(|f| ["item", "qty", "team", "owner"].contains(f)), "{problem}");
    }

    // Both roles: the union of their grants, each document once, in pages
    // of any size, and counted once; sorted by a path one grant pins too.
    let cy = token(&issuer, "cy", &["customer", "agent"], Some("red"));
    for limit in [1, 2, 50] {
        assert_eq!(list_all(&app, &cy, "orders", limit).await, ["o1", "o2", "o4", "o5"], "limit {limit}");
        let mut sorted = Vec::new();
        let mut body = json!({"limit": limit, "sort": ["team"]});
        loop {
            let page = send(&app, &cy, Method::POST, "/v1/collections/orders/query", Some(&body)).await;
            let page = expect(page, 200).await;
            sorted.extend(ids(&page));
            match page["next"].as_str() {
                Some(next) => body["after"] = json!(next),
                None => break,
            }
        }
        assert_eq!(sorted, ["o4", "o1", "o2", "o5"], "by team, limit {limit}");
    }
    assert_eq!(count(&app, &cy, "orders").await, 4);

    // Collection records (live counts), TTL policies and indexes are not
    // for callers the rules judge; nor transactions on the collection.
    for (method, path, body) in [
        (Method::GET, "/v1/collections/orders".to_owned(), None),
        (Method::PUT, "/v1/collections/orders".to_owned(), Some(json!({"ttl": {"max_age_seconds": 1}}))),
        (Method::GET, "/v1/collections/orders/indexes".to_owned(), None),
        (Method::DELETE, "/v1/collections/orders/indexes/owner".to_owned(), None),
    ] {
        let resp = send(&app, &ada, method.clone(), &path, body.as_ref()).await;
        expect_problem(resp, 403, "rule_denied").await;
    }
    let txn = json!({"actions": [{"op": "update", "collection": "orders", "id": "o2", "set": {"note": "k"}}]});
    let done = expect(send(&app, WRITER, Method::POST, "/v1/transactions", Some(&txn)).await, 200).await;
    let txn_path = format!("/v1/transactions/{}", done["id"].as_str().unwrap());
    expect(send(&app, WRITER, Method::GET, &txn_path, None).await, 200).await;
    expect_problem(send(&app, &ada, Method::GET, &txn_path, None).await, 404, "not_found").await;

    // Events: the owner sees their documents enter and change; one given
    // away leaves, with no data; others' changes are never sent.
    let before = events(&app, &ada, 0).await;
    let seen: Vec<&str> = before.iter().map(|e| e["document"].as_str().unwrap()).collect();
    assert!(seen.iter().all(|d| ["o1", "o3", new_id.as_str()].contains(d)), "{seen:?}");
    let head = before.last().unwrap()["seq"].as_u64().unwrap();
    expect(send(&app, WRITER, Method::PATCH, &format!("{docs}/o2"), Some(&json!({"set": {"qty": 2}}))).await, 200)
        .await;
    expect(send(&app, WRITER, Method::PATCH, &format!("{docs}/o3"), Some(&json!({"set": {"qty": 3}}))).await, 200)
        .await;
    expect(
        send(&app, WRITER, Method::PATCH, &format!("{docs}/o3"), Some(&json!({"set": {"owner": "bob"}}))).await,
        200,
    )
    .await;
    let after = events(&app, &ada, head).await;
    assert_eq!(after.len(), 2, "{after:?}");
    assert_eq!((after[0]["document"].as_str(), after[0]["data"]["qty"].as_i64()), (Some("o3"), Some(3)));
    assert_eq!((after[1]["document"].as_str(), after[1]["left"].as_bool()), (Some("o3"), Some(true)));
    assert!(after[1].get("data").is_none(), "{}", after[1]);
    // Now o3 is not theirs.
    expect_problem(send(&app, &ada, Method::GET, &format!("{docs}/o3"), None).await, 404, "not_found").await;

    // Paths that do not judge by rules refuse rather than show.
    let merge = json!({"base_version": 1, "mine": {"note": "m"}});
    let resp = send(&app, &ada, Method::POST, &format!("{docs}/o1/merge"), Some(&merge)).await;
    expect_problem(resp, 403, "rule_denied").await;

    // Access checks explain; only an admin asks about someone else.
    let check = json!({"principal": {"sub": "ada", "roles": ["customer"]}, "collection": "orders", "action": "read", "id": "o2"});
    expect_problem(send(&app, &ada, Method::POST, "/v1/access/check", Some(&check)).await, 403, "forbidden").await;
    let answer = expect(send(&app, ADMIN, Method::POST, "/v1/access/check", Some(&check)).await, 200).await;
    assert_eq!((answer["allowed"].as_bool(), answer["ruled"].as_bool()), (Some(false), Some(true)), "{answer}");
    // Asking about itself, a caller learns nothing of a hidden document.
    let hidden = json!({"collection": "orders", "action": "read", "id": "o2"});
    let missing = json!({"collection": "orders", "action": "read", "id": "no-such-order"});
    let a = expect(send(&app, &ada, Method::POST, "/v1/access/check", Some(&hidden)).await, 200).await;
    let b = expect(send(&app, &ada, Method::POST, "/v1/access/check", Some(&missing)).await, 200).await;
    assert_eq!(a, b);
    let mine = json!({"collection": "orders", "action": "update", "id": "o1"});
    let answer = expect(send(&app, &ada, Method::POST, "/v1/access/check", Some(&mine)).await, 200).await;
    assert_eq!(answer["grant"], "orders/own@1", "{answer}");

    // Keys the rules do not name keep their scopes.
    expect(send(&app, WRITER, Method::GET, &format!("{docs}/o2"), None).await, 200).await;

    // Removed: users are judged by their scopes again.
    expect(send(&app, ADMIN, Method::DELETE, rules_path, None).await, 204).await;
    expect(send(&app, &ada, Method::GET, &format!("{docs}/o2"), None).await, 200).await;
    expect_problem(send(&app, ADMIN, Method::GET, rules_path, None).await, 404, "not_found").await;
}

/// The events of orders a user reads after `after`.
pub(crate) async fn events(app: &TestApp, who: &str, after: u64) -> Vec<Value> {
    let path = format!("/v1/events?collections=orders&after={after}&limit=100");
    let resp =
        app.request(Method::GET, &path).bearer_auth(who).header("accept", "application/json").send().await.unwrap();
    expect(resp, 200).await["items"].as_array().unwrap().clone()
}

#[tokio::test]
async fn owners_and_teams_on_the_embedded_store() {
    owners_and_teams(Backend::Embedded).await;
}

#[tokio::test]
async fn owners_and_teams_on_mongodb() {
    owners_and_teams(Backend::Mongodb).await;
}

#[tokio::test]
async fn a_rule_no_index_serves_is_refused_naming_the_grant_never_scanned() {
    let issuer = Issuer::start(&[&RSA_A]).await;
    let app = gateway(Backend::Embedded, &issuer).await.unwrap();
    let rules = json!({"grants": [{"name": "mine", "roles": ["customer"], "match": {"author": {"$auth": "sub"}},
        "actions": ["read", "count", "create"], "set": {"author": "sub"}}]});
    expect(send(&app, ADMIN, Method::PUT, "/v1/collections/notes/rules", Some(&rules)).await, 200).await;
    let ada = token(&issuer, "ada", &["customer"], None);
    expect(send(&app, &ada, Method::POST, "/v1/collections/notes/documents", Some(&json!({"text": "hi"}))).await, 201)
        .await;
    let problem = expect_problem(
        send(&app, &ada, Method::POST, "/v1/collections/notes/query", Some(&json!({}))).await,
        400,
        "index_required",
    )
    .await;
    assert!(problem["detail"].as_str().unwrap().starts_with("grant mine"), "{problem}");
    assert_eq!(problem["index"]["fields"], json!(["author"]), "{problem}");
    let problem =
        expect_problem(send(&app, &ada, Method::GET, "/v1/collections/notes/count", None).await, 400, "index_required")
            .await;
    assert_eq!(problem["index"]["fields"], json!(["author"]), "{problem}");
    // A user no grant names may do nothing there, and is told so.
    let other = token(&issuer, "eve", &["agent"], None);
    let resp = send(&app, &other, Method::POST, "/v1/collections/notes/documents", Some(&json!({"text": "x"}))).await;
    expect_problem(resp, 403, "forbidden").await;
}

/// `txgate rules test`, as a user runs it: the project's own suite
/// passes; a suite with one wrong expectation fails naming the case; one
/// that is not valid is told apart.
#[test]
fn the_rules_suite_runs_without_a_server() {
    let run = |path: &std::path::Path| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_txgate"))
            .args(["rules", "test"])
            .arg(path)
            .env_clear()
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let shipped = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/examples/rules-orders.json");
    let (code, out, err) = run(&shipped);
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(out.ends_with(" cases, 0 failed\n") && !out.contains("FAIL"), "{out}");

    let dir = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(&shipped).unwrap();
    let wrong = text.replacen(r#""ids": ["o1", "o3"]"#, r#""ids": ["o1", "o2", "o3"]"#, 1);
    assert_ne!(wrong, text);
    let path = dir.path().join("wrong.json");
    std::fs::write(&path, wrong).unwrap();
    let (code, out, _) = run(&path);
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("FAIL an owner lists their orders: expected the ids"), "{out}");

    let path = dir.path().join("invalid.json");
    std::fs::write(&path, r#"{"collection": "orders", "rules": {"grants": [{"name": "x", "actions": ["read"]}]}, "principals": {}, "cases": []}"#)
        .unwrap();
    let (code, _, err) = run(&path);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("rules/grants/0"), "{err}");
}

/// A transaction under rules: every action judged on the state it would
/// produce; the third of five refused answers for all, naming it, and
/// nothing is written.
async fn transactions_under_rules(backend: Backend) {
    let issuer = Issuer::start(&[&RSA_A]).await;
    let Some(app) = gateway(backend, &issuer).await else { return };
    ready_index(&app, "orders", "owner", &["owner"]).await;
    let docs = "/v1/collections/orders/documents";
    for (id, owner) in [("o1", "ada"), ("o2", "bob"), ("o3", "ada"), ("o4", "ada"), ("o5", "ada")] {
        let doc = json!({"_id": id, "owner": owner, "team": "red", "item": "tea", "qty": 1});
        expect(send(&app, WRITER, Method::POST, docs, Some(&doc)).await, 201).await;
    }
    expect(send(&app, ADMIN, Method::PUT, "/v1/collections/orders/rules", Some(&rules())).await, 200).await;
    let ada = token(&issuer, "ada", &["customer"], None);
    let txn = |actions: Value| json!({"actions": actions});
    let five = txn(json!([
        {"op": "insert", "collection": "orders", "data": {"item": "jam"}},
        {"op": "update", "collection": "orders", "id": "o1", "inc": {"qty": 4}},
        {"op": "update", "collection": "orders", "id": "o3", "set": {"owner": "bob"}},
        {"op": "delete", "collection": "orders", "id": "o4"},
        {"op": "check", "collection": "orders", "id": "o5"},
    ]));
    let problem =
        expect_problem(send(&app, &ada, Method::POST, "/v1/transactions", Some(&five)).await, 403, "rule_denied").await;
    assert_eq!((problem["action"].as_i64(), problem["errors"][0]["pointer"].as_str()), (Some(2), Some("/owner")));
    assert_eq!(count(&app, &ada, "orders").await, 4, "nothing was written");
    let o1 = expect(send(&app, &ada, Method::GET, &format!("{docs}/o1"), None).await, 200).await;
    assert_eq!((o1["version"].as_i64(), o1["data"]["qty"].as_i64()), (Some(1), Some(1)), "{o1}");

    // Another's document is not there, in a transaction too.
    let hidden = txn(json!([{"op": "check", "collection": "orders", "id": "o2"}]));
    let problem =
        expect_problem(send(&app, &ada, Method::POST, "/v1/transactions", Some(&hidden)).await, 404, "not_found").await;
    assert_eq!(problem["action"], 0, "{problem}");
    // A user's hooks go only where their roles allow (customers: nowhere here).
    let hooked = json!({"actions": [{"op": "check", "collection": "orders", "id": "o1"}],
        "hooks": [{"url": "http://127.0.0.1:9/hook"}]});
    expect_problem(send(&app, &ada, Method::POST, "/v1/transactions", Some(&hooked)).await, 403, "forbidden").await;

    // What the rules allow commits, with the gateway's `set` fields.
    let allowed = txn(json!([
        {"op": "insert", "collection": "orders", "data": {"item": "jam"}},
        {"op": "update", "collection": "orders", "id": "o1", "inc": {"qty": 4}},
        {"op": "delete", "collection": "orders", "id": "o3"},
    ]));
    let done = expect(send(&app, &ada, Method::POST, "/v1/transactions", Some(&allowed)).await, 200).await;
    let new_id = done["results"][0]["id"].as_str().unwrap();
    let created = expect(send(&app, &ada, Method::GET, &format!("{docs}/{new_id}"), None).await, 200).await;
    assert_eq!(created["data"]["owner"], "ada", "{created}");
    let o1 = expect(send(&app, &ada, Method::GET, &format!("{docs}/o1"), None).await, 200).await;
    assert_eq!(o1["data"]["qty"], 5);
    expect_problem(send(&app, &ada, Method::GET, &format!("{docs}/o3"), None).await, 404, "not_found").await;
    assert_eq!(list_all(&app, &ada, "orders", 10).await.len(), 4);
}

#[tokio::test]
async fn transactions_under_rules_on_the_embedded_store() {
    transactions_under_rules(Backend::Embedded).await;
}

#[tokio::test]
async fn transactions_under_rules_on_mongodb() {
    transactions_under_rules(Backend::Mongodb).await;
}

/// A rule change under open streams: a stream whose caller keeps a grant
/// goes on, judged by the new rules from their position; one whose caller
/// lost every grant ends with `reauth`, having been sent nothing the new
/// rules hide.
#[tokio::test]
async fn a_rule_change_under_open_streams() {
    let issuer = Issuer::start(&[&RSA_A]).await;
    let app = gateway(Backend::Embedded, &issuer).await.unwrap();
    ready_index(&app, "orders", "owner", &["owner"]).await;
    ready_index(&app, "orders", "team", &["team"]).await;
    let docs = "/v1/collections/orders/documents";
    for (id, owner) in [("o1", "ada"), ("o2", "bob")] {
        let doc = json!({"_id": id, "owner": owner, "team": "red", "qty": 1});
        expect(send(&app, WRITER, Method::POST, docs, Some(&doc)).await, 201).await;
    }
    expect(send(&app, ADMIN, Method::PUT, "/v1/collections/orders/rules", Some(&rules())).await, 200).await;
    let ada = token(&issuer, "ada", &["customer"], None);
    let zed = token(&issuer, "zed", &["agent"], Some("red"));
    let open = |who: String| {
        let req = app.request(Method::GET, "/v1/events?collections=orders").bearer_auth(who);
        async move { SseStream::try_open(req).await.unwrap() }
    };
    let (mut ada_stream, mut zed_stream) = (open(ada.clone()).await, open(zed.clone()).await);
    let bump = |id: &'static str, qty: i64| {
        let body = json!({"set": {"qty": qty}});
        let req = app.request(Method::PATCH, &format!("{docs}/{id}")).bearer_auth(WRITER).json(&body);
        async move { expect(req.send().await.unwrap(), 200).await }
    };
    bump("o2", 2).await;
    let seen = zed_stream.next(std::time::Duration::from_secs(10)).await.unwrap();
    assert_eq!((seen.data["document"].as_str(), seen.data["data"]["qty"].as_i64()), (Some("o2"), Some(2)));
    // The team grant goes: agents have none left.
    let own_only = json!({"grants": [rules()["grants"][0].clone()]});
    let set = expect(send(&app, ADMIN, Method::PUT, "/v1/collections/orders/rules", Some(&own_only)).await, 200).await;
    assert_eq!(set["version"], 2);
    bump("o2", 3).await;
    bump("o1", 3).await;
    let reauth = zed_stream.next(std::time::Duration::from_secs(10)).await.unwrap();
    assert_eq!(reauth.event.as_deref(), Some("reauth"), "{:?}", reauth.data);
    assert_eq!(reauth.data["reason"], "grants_changed");
    assert_eq!(reauth.data["last_event_id"], seen.id.as_deref().unwrap_or_default());
    assert!(zed_stream.ended(std::time::Duration::from_secs(5)).await);
    // The owner's stream goes on, judged by the new version.
    let mine = ada_stream.next(std::time::Duration::from_secs(10)).await.unwrap();
    assert_eq!((mine.data["document"].as_str(), mine.data["data"]["qty"].as_i64()), (Some("o1"), Some(3)));
    // Events after the change are judged by it: the agent reads none.
    let after = set["position"].as_u64().unwrap();
    let page = app
        .request(Method::GET, &format!("/v1/events?collections=orders&after={after}"))
        .bearer_auth(&zed)
        .header("accept", "application/json")
        .send()
        .await
        .unwrap();
    let page = expect(page, 200).await;
    assert_eq!(page["items"].as_array().unwrap().len(), 0, "{page}");
}

/// A user's subscription is judged as their stream would be, by the
/// claims of the token that created it, until that token expires: then it
/// pauses, losing nothing, until renewed.
async fn subscriptions_under_rules(backend: Backend) {
    use std::time::Duration;
    let issuer = Issuer::start(&[&RSA_A]).await;
    let rx = TestReceiver::start().await;
    // Customers' subscriptions may deliver to the receiver.
    let allowed = rx.url("/");
    let hooks = move |c: &mut txgate::config::Config| {
        c.issuers[0].hooks.insert("customer".into(), vec![allowed]);
    };
    let Some(app) = gateway_with(backend, &issuer, hooks).await else { return };
    ready_index(&app, "orders", "owner", &["owner"]).await;
    let docs = "/v1/collections/orders/documents";
    for (id, owner) in [("o1", "ada"), ("o2", "bob")] {
        let doc = json!({"_id": id, "owner": owner, "team": "red", "qty": 1, "secret": "s"});
        expect(send(&app, WRITER, Method::POST, docs, Some(&doc)).await, 201).await;
    }
    expect(send(&app, ADMIN, Method::PUT, "/v1/collections/orders/rules", Some(&rules())).await, 200).await;
    let ada = token(&issuer, "ada", &["customer"], None);
    let body = json!({"url": rx.url("/"), "collections": ["orders"]});
    let sub = expect(send(&app, &ada, Method::POST, "/v1/subscriptions", Some(&body)).await, 201).await;
    let id = sub["id"].as_str().unwrap().to_owned();
    assert!(sub["expires_at"].is_string(), "{sub}");
    let set = |doc: &'static str, field: &'static str, value: Value| {
        let req = app
            .request(Method::PATCH, &format!("{docs}/{doc}"))
            .bearer_auth(WRITER)
            .json(&json!({"set": {field: value}}));
        async move { expect(req.send().await.unwrap(), 200).await }
    };
    set("o1", "qty", json!(2)).await;
    set("o2", "qty", json!(2)).await;
    set("o1", "owner", json!("bob")).await;
    let first = rx.next(Duration::from_secs(15)).await.json();
    let second = rx.next(Duration::from_secs(15)).await.json();
    assert!(rx.collect_for(Duration::from_millis(800)).await.is_empty(), "nothing else is delivered");
    assert_eq!((first["document"].as_str(), first["data"]["qty"].as_i64()), (Some("o1"), Some(2)), "{first}");
    assert_eq!((second["document"].as_str(), second["left"].as_bool()), (Some("o1"), Some(true)), "{second}");
    assert!(second.get("data").is_none(), "{second}");

    // Past the token's expiry the subscription pauses...
    app.advance(Duration::from_secs(400));
    set("o1", "owner", json!("ada")).await;
    assert!(rx.collect_for(Duration::from_millis(1500)).await.is_empty(), "paused");
    // ...and its creator renews it with a fresher token: it goes on from there.
    let mut claims = issuer.claims("ada", &["customer"]);
    claims["exp"] = json!(claims["exp"].as_u64().unwrap() + 3600);
    let fresh = RSA_A.sign(&claims);
    let other = token(&issuer, "bob", &["customer"], None);
    let renew = format!("/v1/subscriptions/{id}/renew");
    expect_problem(send(&app, &other, Method::POST, &renew, None).await, 404, "not_found").await;
    let renewed = expect(send(&app, &fresh, Method::POST, &renew, None).await, 200).await;
    assert_ne!(renewed["expires_at"], sub["expires_at"]);
    let back = rx.next(Duration::from_secs(15)).await.json();
    assert_eq!((back["document"].as_str(), back["version"].as_i64()), (Some("o1"), Some(4)), "{back}");
    assert_eq!(back["data"]["owner"], "ada", "{back}");
}

#[tokio::test]
async fn subscriptions_under_rules_on_the_embedded_store() {
    subscriptions_under_rules(Backend::Embedded).await;
}

#[tokio::test]
async fn subscriptions_under_rules_on_mongodb() {
    subscriptions_under_rules(Backend::Mongodb).await;
}

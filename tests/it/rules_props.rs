//! Rules, property-based: rules chosen by the seed (among eight shapes of
//! owners and teams), random writes by a key and by users (owners, an
//! agent, a user with both roles), then what each user's list (in
//! pages of random size), count, batch read and event page show, checked
//! against an oracle that evaluates the owners-and-teams rules on each
//! document by hand: nothing more, nothing less, fields trimmed, `left`
//! without data; and every refused write wrote nothing. Seeded:
//! `TXGATE_PROPTEST_SEED` replays a run (the seed is printed),
//! `TXGATE_PROPTEST_CASES` sets how many sequences are tried.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestCaseError, TestRng, TestRunner};
use reqwest::Method;
use serde_json::{Map, Value, json};
use txgate::testing::keys::parse_keys;

use crate::support::{Backend, TestApp, expect};
use crate::users::{Issuer, RSA_A};

const ADMIN: &str = "admin-key-0123456789";
const WRITER: &str = "writer-key-0123456789";
const DOCS: &str = "/v1/collections/orders/documents";

/// A user of the test: their subject, roles and team, and the rules.
struct User {
    sub: &'static str,
    customer: bool,
    team: Option<&'static str>,
    token: String,
    rules: Shape,
}

/// The rules of a run, chosen by its seed: the owners-and-teams rules,
/// with the team grant reading every field or some, the owner's writing
/// `team` or not, and the team's deleting or not.
#[derive(Clone, Copy, Debug)]
struct Shape {
    team_reads_all: bool,
    own_writes_team: bool,
    team_deletes: bool,
}

impl Shape {
    fn of(seed: u64) -> Self {
        Shape { team_reads_all: seed & 1 == 1, own_writes_team: seed & 2 == 2, team_deletes: seed & 4 == 4 }
    }

    fn own_writes(self) -> &'static [&'static str] {
        if self.own_writes_team { &["qty", "note", "team"] } else { &["qty", "note"] }
    }

    fn rules(self) -> Value {
        let mut team_actions = vec!["read", "count", "stream", "update"];
        if self.team_deletes {
            team_actions.push("delete");
        }
        let mut team = json!({"name": "team", "roles": ["agent"], "match": {"team": {"$auth": "claims.team"}},
            "actions": team_actions, "fields": {"write": ["note"]}});
        if !self.team_reads_all {
            team["fields"]["read"] = json!(["team", "qty", "owner"]);
        }
        json!({"grants": [
            {"name": "own", "roles": ["customer"], "match": {"owner": {"$auth": "sub"}},
             "actions": ["read", "count", "stream", "create", "update", "delete"],
             "fields": {"write": self.own_writes()}, "set": {"owner": "sub"}},
            team,
        ]})
    }
}

const USERS: [(&str, bool, Option<&str>); 3] =
    [("a", true, None), ("z", false, Some("red")), ("b", true, Some("blue"))];

/// What the oracle says a user sees of a document: `None`, nothing;
/// otherwise the fields (`None`: all of them).
fn sees(user: &User, doc: &Map<String, Value>) -> Option<Option<BTreeSet<&'static str>>> {
    let own = user.customer && doc.get("owner") == Some(&json!(user.sub));
    let team = user.team.is_some_and(|t| doc.get("team") == Some(&json!(t)));
    match (own, team) {
        (true, _) => Some(None),
        (false, true) if user.rules.team_reads_all => Some(None),
        (false, true) => Some(Some(BTreeSet::from(["team", "qty", "owner"]))),
        (false, false) => None,
    }
}

fn shown(doc: &Map<String, Value>, fields: &Option<BTreeSet<&'static str>>) -> Map<String, Value> {
    doc.iter()
        .filter(|(k, _)| fields.as_ref().is_none_or(|f| f.contains(k.as_str())))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// The status the oracle expects of `user` setting `field` to `value`
/// on `before` (`None`: no such live document).
fn patch_status(user: &User, before: Option<&Map<String, Value>>, field: &str, value: &Value) -> u16 {
    let Some(before) = before else { return 404 };
    if sees(user, before).is_none() {
        return 404;
    }
    // A field none of their grants writes is refused whatever its value.
    let own_writes = user.rules.own_writes();
    let writable: &[&str] = if user.customer { own_writes } else { &["note"] };
    if !writable.contains(&field) {
        return 403;
    }
    let mut after = before.clone();
    after.insert(field.to_owned(), value.clone());
    let changed = before.get(field) != Some(value);
    let own = |d: &Map<String, Value>| user.customer && d.get("owner") == Some(&json!(user.sub));
    let team = |d: &Map<String, Value>| user.team.is_some_and(|t| d.get("team") == Some(&json!(t)));
    let by_own = own(before) && own(&after) && (!changed || own_writes.contains(&field));
    let by_team = team(before) && team(&after) && (!changed || field == "note");
    if by_own || by_team { 200 } else { 403 }
}

#[derive(Clone, Debug)]
enum Op {
    /// The writer key creates a document.
    Create {
        owner: usize,
        team: usize,
        qty: i64,
    },
    /// The writer key sets a field of the `n`th document.
    Update {
        n: usize,
        field: usize,
        value: usize,
    },
    Delete {
        n: usize,
    },
    /// A user creates an order (the gateway sets its owner).
    UserCreate {
        user: usize,
        qty: i64,
    },
    UserPatch {
        user: usize,
        n: usize,
        field: usize,
        value: usize,
    },
    UserDelete {
        user: usize,
        n: usize,
    },
}

const OWNERS: [&str; 3] = ["a", "b", "c"];
const TEAMS: [&str; 2] = ["red", "blue"];
const FIELDS: [&str; 4] = ["owner", "team", "qty", "note"];

fn value_of(field: &str, v: usize) -> Value {
    match field {
        "owner" => json!(OWNERS[v % 3]),
        "team" => json!(TEAMS[v % 2]),
        "qty" => json!((v % 4) as i64),
        _ => json!(format!("n{}", v % 3)),
    }
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0..3usize, 0..2usize, 0..4i64).prop_map(|(owner, team, qty)| Op::Create { owner, team, qty }),
        (0..64usize, 0..4usize, 0..6usize).prop_map(|(n, field, value)| Op::Update { n, field, value }),
        (0..64usize).prop_map(|n| Op::Delete { n }),
        (0..3usize, 0..4i64).prop_map(|(user, qty)| Op::UserCreate { user, qty }),
        (0..3usize, 0..64usize, 0..4usize, 0..6usize).prop_map(|(user, n, field, value)| Op::UserPatch {
            user,
            n,
            field,
            value
        }),
        (0..3usize, 0..64usize).prop_map(|(user, n)| Op::UserDelete { user, n }),
    ]
}

/// An event as a user sees it: its document, whether it left, its data.
type Seen = (String, bool, Option<Map<String, Value>>);

/// The documents as the oracle knows them, in creation order (`None`:
/// deleted), and each user's cursor in the event log.
struct Model {
    docs: Vec<(String, Option<Map<String, Value>>)>,
    cursors: Vec<u64>,
}

async fn send(app: &TestApp, who: &str, method: Method, path: &str, body: Option<&Value>) -> reqwest::Response {
    let mut req = app.request(method, path).bearer_auth(who);
    if let Some(body) = body {
        req = req.json(body);
    }
    req.send().await.unwrap()
}

fn data_of(body: &Value) -> Map<String, Value> {
    body["data"].as_object().cloned().unwrap_or_default()
}

/// One sequence: its writes, each checked as it is answered, then every
/// user's reads and events checked against the oracle.
async fn run(app: &TestApp, users: &[User], model: &mut Model, ops: &[Op]) -> Result<(), String> {
    // What each user should see in the log: (document, left, data).
    let mut expected: Vec<Vec<Seen>> = vec![Vec::new(); users.len()];
    let mut changed = |id: &str, before: Option<&Map<String, Value>>, after: Option<&Map<String, Value>>| {
        for (u, user) in users.iter().enumerate() {
            let was = before.is_some_and(|b| sees(user, b).is_some());
            match after.and_then(|a| sees(user, a).map(|f| (a, f))) {
                Some((a, f)) => expected[u].push((id.to_owned(), false, Some(shown(a, &f)))),
                None if was => expected[u].push((id.to_owned(), true, None)),
                None => {}
            }
        }
    };
    for op in ops {
        let pick = |n: usize| (!model.docs.is_empty()).then(|| n % model.docs.len());
        match op.clone() {
            Op::Create { owner, team, qty } => {
                let id = format!("k{:05}", model.docs.len());
                let data = json!({"owner": OWNERS[owner], "team": TEAMS[team], "qty": qty});
                let mut body = data.clone();
                body["_id"] = json!(id);
                expect(send(app, WRITER, Method::POST, DOCS, Some(&body)).await, 201).await;
                let data = data.as_object().unwrap().clone();
                changed(&id, None, Some(&data));
                model.docs.push((id, Some(data)));
            }
            Op::Update { n, field, value } => {
                let Some(i) = pick(n) else { continue };
                let (id, doc) = model.docs[i].clone();
                let Some(before) = doc else { continue };
                let field = FIELDS[field];
                let mut after = before.clone();
                after.insert(field.to_owned(), value_of(field, value));
                let patch = json!({"set": {field: value_of(field, value)}});
                expect(send(app, WRITER, Method::PATCH, &format!("{DOCS}/{id}"), Some(&patch)).await, 200).await;
                changed(&id, Some(&before), Some(&after));
                model.docs[i].1 = Some(after);
            }
            Op::Delete { n } => {
                let Some(i) = pick(n) else { continue };
                let (id, doc) = model.docs[i].clone();
                let Some(before) = doc else { continue };
                expect(send(app, WRITER, Method::DELETE, &format!("{DOCS}/{id}"), None).await, 204).await;
                changed(&id, Some(&before), None);
                model.docs[i].1 = None;
            }
            Op::UserCreate { user, qty } => {
                let u = &users[user];
                let resp = send(app, &u.token, Method::POST, DOCS, Some(&json!({"qty": qty}))).await;
                let status = resp.status().as_u16();
                if !u.customer {
                    if status != 403 {
                        return Err(format!("an agent created an order: {status}"));
                    }
                    continue;
                }
                let body = expect(resp, 201).await;
                let id = body["id"].as_str().unwrap().to_owned();
                let data = data_of(&body);
                if data != *json!({"qty": qty, "owner": u.sub}).as_object().unwrap() {
                    return Err(format!("created {data:?}"));
                }
                changed(&id, None, Some(&data));
                model.docs.push((id, Some(data)));
            }
            Op::UserPatch { user, n, field, value } => {
                let Some(i) = pick(n) else { continue };
                let (id, doc) = model.docs[i].clone();
                let (u, field) = (&users[user], FIELDS[field]);
                let value = value_of(field, value);
                let want = patch_status(u, doc.as_ref(), field, &value);
                let patch = json!({"set": {field: value.clone()}});
                let resp = send(app, &u.token, Method::PATCH, &format!("{DOCS}/{id}"), Some(&patch)).await;
                let got = resp.status().as_u16();
                if got != want {
                    return Err(format!("{} set {field}={value} on {id} ({doc:?}): {got}, not {want}", u.sub));
                }
                if got == 200 {
                    let before = doc.unwrap();
                    let mut after = before.clone();
                    after.insert(field.to_owned(), value);
                    changed(&id, Some(&before), Some(&after));
                    model.docs[i].1 = Some(after);
                }
            }
            Op::UserDelete { user, n } => {
                let Some(i) = pick(n) else { continue };
                let (id, doc) = model.docs[i].clone();
                let u = &users[user];
                let want = match &doc {
                    None => 404,
                    Some(d) if sees(u, d).is_none() => 404,
                    Some(d) if u.customer && d.get("owner") == Some(&json!(u.sub)) => 204,
                    Some(d) if u.rules.team_deletes && u.team.is_some_and(|t| d.get("team") == Some(&json!(t))) => 204,
                    Some(_) => 403,
                };
                let got = send(app, &u.token, Method::DELETE, &format!("{DOCS}/{id}"), None).await.status().as_u16();
                if got != want {
                    return Err(format!("{} deleted {id} ({doc:?}): {got}, not {want}", u.sub));
                }
                if got == 204 {
                    changed(&id, doc.as_ref(), None);
                    model.docs[i].1 = None;
                }
            }
        }
    }
    for (u, user) in users.iter().enumerate() {
        check_reads(app, user, model).await?;
        let (events, next) = user_events(app, &user.token, model.cursors[u]).await;
        model.cursors[u] = next;
        let got: Vec<Seen> = events
            .iter()
            .map(|e| {
                let data = e.get("data").and_then(Value::as_object).cloned();
                (e["document"].as_str().unwrap_or("").to_owned(), e["left"].as_bool().unwrap_or(false), data)
            })
            .collect();
        if got != expected[u] {
            return Err(format!("{}'s events: {got:?}, not {:?}", user.sub, expected[u]));
        }
    }
    Ok(())
}

/// A user's list (pages of each size), count and batch read agree with the oracle.
async fn check_reads(app: &TestApp, user: &User, model: &Model) -> Result<(), String> {
    let mut want: BTreeMap<String, Map<String, Value>> = BTreeMap::new();
    for (id, doc) in &model.docs {
        if let Some(doc) = doc
            && let Some(fields) = sees(user, doc)
        {
            want.insert(id.clone(), shown(doc, &fields));
        }
    }
    for limit in [1, 3, 50] {
        let mut got = BTreeMap::new();
        let mut order = Vec::new();
        let mut after: Option<String> = None;
        loop {
            let mut body = json!({"limit": limit});
            if let Some(a) = &after {
                body["after"] = json!(a);
            }
            let page = send(app, &user.token, Method::POST, "/v1/collections/orders/query", Some(&body)).await;
            let page = expect(page, 200).await;
            for doc in page["items"].as_array().unwrap() {
                let id = doc["id"].as_str().unwrap().to_owned();
                order.push(id.clone());
                if got.insert(id.clone(), data_of(doc)).is_some() {
                    return Err(format!("{} saw {id} twice (limit {limit})", user.sub));
                }
            }
            match page["next"].as_str() {
                Some(n) => after = Some(n.to_owned()),
                None => break,
            }
        }
        if got != want {
            return Err(format!("{}'s list (limit {limit}): {got:?}, not {want:?}", user.sub));
        }
        if !order.is_sorted() {
            return Err(format!("{}'s list is not in id order: {order:?}", user.sub));
        }
    }
    let count = expect(send(app, &user.token, Method::GET, "/v1/collections/orders/count", None).await, 200).await;
    if count["count"].as_u64() != Some(want.len() as u64) {
        return Err(format!("{}'s count: {count}, not {}", user.sub, want.len()));
    }
    let members: Vec<Value> =
        model.docs.iter().take(100).map(|(id, _)| json!({"collection": "orders", "id": id})).collect();
    if !members.is_empty() {
        let batch = send(app, &user.token, Method::POST, "/v1/reads", Some(&json!({"documents": members}))).await;
        let batch = expect(batch, 200).await;
        for (member, (id, _)) in batch["documents"].as_array().unwrap().iter().zip(&model.docs) {
            let status = member["status"].as_u64().unwrap();
            match want.get(id) {
                Some(data) if status == 200 && data_of(&member["document"]) == *data => {}
                None if status == 404 => {}
                _ => return Err(format!("{}'s batch read of {id}: {member}", user.sub)),
            }
        }
    }
    Ok(())
}

/// Every event of orders a user reads after `after`, and where they end.
async fn user_events(app: &TestApp, token: &str, after: u64) -> (Vec<Value>, u64) {
    app.settled().await;
    let log = txgate::testing::events::Log::new(
        Arc::clone(&app.store),
        txgate::testing::events::Tap::default(),
        app.config.events.clone(),
    );
    let head = log.head().await.unwrap();
    let mut next = after;
    let mut out = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let path = format!("/v1/events?collections=orders&after={next}&limit=50");
        let resp = app.request(Method::GET, &path).bearer_auth(token).header("accept", "application/json");
        let page = expect(resp.send().await.unwrap(), 200).await;
        let items = page["items"].as_array().unwrap().clone();
        next = page["next"].as_u64().unwrap();
        if items.is_empty() && next >= head {
            return (out, next);
        }
        assert!(Instant::now() < deadline, "the log never reached {head}: at {next}");
        out.extend(items);
    }
}

async fn agree(backend: Backend) {
    let issuer = Issuer::start(&[&RSA_A]).await;
    let mut entry = issuer.entry();
    entry.roles =
        [("customer".to_owned(), "write@orders".to_owned()), ("agent".to_owned(), "write@orders".to_owned())].into();
    // The users' rate is not what this test is about.
    entry.rate = Some("100000/s".into());
    let resolved = entry.resolve(1).unwrap();
    let Some(app) = TestApp::spawn_with(backend, move |c| {
        c.issuers = vec![resolved];
        c.api_keys = parse_keys(&format!("{ADMIN}:admin,{WRITER}:write")).unwrap();
    })
    .await
    else {
        return;
    };
    for (name, fields) in [("owner", json!(["owner"])), ("team", json!(["team"])), ("both", json!(["owner", "team"]))] {
        let path = format!("/v1/collections/orders/indexes/{name}");
        assert!(send(&app, ADMIN, Method::PUT, &path, Some(&json!({"fields": fields}))).await.status().is_success());
        app.until("the index is ready", async || {
            app.advance(txgate::testing::indexes::GRACE);
            app.run_once("index_builds").await;
            expect(send(&app, ADMIN, Method::GET, &path, None).await, 200).await["state"] == "ready"
        })
        .await;
    }
    let seed: u64 = std::env::var("TXGATE_PROPTEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| rand::random::<u64>() >> 1);
    let shape = Shape::of(seed);
    expect(send(&app, ADMIN, Method::PUT, "/v1/collections/orders/rules", Some(&shape.rules())).await, 200).await;
    let users: Vec<User> = USERS
        .iter()
        .map(|&(sub, customer, team)| {
            let mut roles = Vec::new();
            if customer {
                roles.push("customer");
            }
            if team.is_some() {
                roles.push("agent");
            }
            let mut claims = issuer.claims(sub, &roles);
            claims["exp"] = json!(claims["exp"].as_u64().unwrap() + 3600);
            if let Some(team) = team {
                claims["team"] = json!(team);
            }
            User { sub, customer, team, token: RSA_A.sign(&claims), rules: shape }
        })
        .collect();
    let cases: u32 =
        std::env::var("TXGATE_PROPTEST_CASES").ok().and_then(|s| s.parse().ok()).unwrap_or(match backend {
            Backend::Embedded => 40,
            _ => 20,
        });
    eprintln!("rules ({backend:?}): seed {seed} (TXGATE_PROPTEST_SEED={seed} replays it), {cases} cases, {shape:?}");
    let mut bytes = [0u8; 32];
    bytes[..8].copy_from_slice(&seed.to_le_bytes());
    // No shrinking: every sequence builds on the documents before it.
    let config = Config { cases, failure_persistence: None, max_shrink_iters: 0, ..Config::default() };
    let mut runner = TestRunner::new_with_rng(config, TestRng::from_seed(RngAlgorithm::ChaCha, &bytes));
    let handle = tokio::runtime::Handle::current();
    let app = Arc::new(app);
    let shared = Arc::clone(&app);
    let budget = Instant::now() + Duration::from_secs(150);
    let result = tokio::task::spawn_blocking(move || {
        let model = std::cell::RefCell::new(Model { docs: Vec::new(), cursors: vec![0; USERS.len()] });
        runner
            .run(&proptest::collection::vec(op(), 1..16), |ops| {
                if Instant::now() > budget {
                    return Ok(()); // time's up: the remaining cases pass untried
                }
                handle.block_on(run(&shared, &users, &mut model.borrow_mut(), &ops)).map_err(TestCaseError::fail)
            })
            .map_err(|e| e.to_string())
    })
    .await
    .unwrap();
    if let Err(failure) = result {
        panic!("seed {seed} (rerun with TXGATE_PROPTEST_SEED={seed}): {failure}");
    }
    Arc::into_inner(app).unwrap().stop().await;
}

#[tokio::test]
async fn what_users_list_count_read_and_stream_is_what_the_rules_allow_on_the_embedded_store() {
    agree(Backend::Embedded).await;
}

#[tokio::test]
async fn what_users_list_count_read_and_stream_is_what_the_rules_allow_on_mongodb() {
    agree(Backend::Mongodb).await;
}

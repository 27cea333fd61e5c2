//! What a change event keeps of the document before its change, for
//! readers judged by rules (docs/guides/rules.md, "Streams"): the fields
//! the rules' `match` names, in the event itself (format 2), so a reader
//! is told a document left even once the log no longer holds the
//! document's previous version; and events of format 1 (no `v`, nothing
//! kept), as the previous release wrote them, still judged by their
//! previous version's event. On both stores, through single writes,
//! transactions (in one chain and step by step) and deletes.

use std::sync::Arc;

use reqwest::Method;
use serde_json::{Value, json};
use txgate_store::{Update, doc, shape};

use crate::rules::{ADMIN, WRITER, events, gateway, gateway_with, ready_index, rules, send, token};
use crate::support::{Backend, TestApp, expect};
use crate::users::{Issuer, RSA_A};

const EVENTS: &str = "_events";

/// The (document, version, left, owner in data) of each event `page`
/// holds, by document (the log orders each document's events by version;
/// single writes answered one after another may be logged in another
/// order).
fn told(page: &[Value]) -> Vec<(String, i64, bool, Option<String>)> {
    let mut told: Vec<_> = page
        .iter()
        .map(|e| {
            (
                e["document"].as_str().unwrap_or_default().to_owned(),
                e["version"].as_i64().unwrap_or_default(),
                e["left"].as_bool().unwrap_or(false),
                e["data"]["owner"].as_str().map(str::to_owned),
            )
        })
        .collect();
    told.sort_by(|a, b| (&a.0, a.1).cmp(&(&b.0, b.1)));
    told
}

async fn kept_not(app: &TestApp, id: &str) -> bool {
    app.store.get(EVENTS, id).await.unwrap().is_none()
}

fn row(id: &str, version: i64, left: bool, owner: Option<&str>) -> (String, i64, bool, Option<String>) {
    (id.to_owned(), version, left, owner.map(str::to_owned))
}

/// The events of orders a user reads from the oldest the log retains.
async fn retained(app: &TestApp, who: &str) -> Vec<Value> {
    let resp = app
        .request(Method::GET, "/v1/events?collections=orders&limit=100")
        .bearer_auth(who)
        .header("accept", "application/json")
        .send()
        .await
        .unwrap();
    expect(resp, 200).await["items"].as_array().unwrap().clone()
}

async fn events_keep_what_the_rules_look_at(backend: Backend) {
    use std::time::Duration;
    let issuer = Issuer::start(&[&RSA_A]).await;
    let retention = |c: &mut txgate::config::Config| c.events.retention = Duration::from_secs(60);
    let Some(app) = gateway_with(backend, &issuer, retention).await else { return };
    ready_index(&app, "orders", "owner", &["owner"]).await;
    expect(send(&app, ADMIN, Method::PUT, "/v1/collections/orders/rules", Some(&rules())).await, 200).await;
    let docs = "/v1/collections/orders/documents";
    for (id, owner) in [("o1", "ada"), ("o2", "ada"), ("o3", "ada"), ("o4", "bob"), ("o5", "ada")] {
        let doc = json!({"_id": id, "owner": owner, "team": "red", "qty": 1, "secret": "s"});
        expect(send(&app, WRITER, Method::POST, docs, Some(&doc)).await, 201).await;
    }
    let patch = |id: &'static str, set: Value| {
        let req = app.request(Method::PATCH, &format!("{docs}/{id}")).bearer_auth(WRITER).json(&json!({"set": set}));
        async move { expect(req.send().await.unwrap(), 200).await }
    };
    // Past the log's retention: the purge will take the creations' events.
    app.settled().await;
    app.advance(Duration::from_secs(61));
    // o1 given away by a single write, o2 deleted, o3 given away in a
    // transaction, o4 given to ada, o5 changed and kept.
    patch("o1", json!({"owner": "bob"})).await;
    let deleted = app.request(Method::DELETE, &format!("{docs}/o2")).bearer_auth(WRITER).send().await.unwrap();
    expect(deleted, 204).await;
    let txn = json!({"actions": [
        {"op": "update", "collection": "orders", "id": "o3", "set": {"owner": "bob"}},
        {"op": "update", "collection": "orders", "id": "o5", "inc": {"qty": 1}},
    ]});
    expect(send(&app, WRITER, Method::POST, "/v1/transactions", Some(&txn)).await, 200).await;
    patch("o4", json!({"owner": "ada"})).await;
    app.settled().await;

    // Each change's event kept the owner as it was before (and only what
    // the rules' `match` names); a create keeps nothing.
    let kept = |id: &str, v: i64| {
        let (store, id) = (Arc::clone(&app.store), format!("orders/{id}/{v}"));
        async move { store.get(EVENTS, &id).await.unwrap().unwrap_or_else(|| panic!("{id} is logged")) }
    };
    for (id, v, owner) in [("o1", 2, "ada"), ("o2", 2, "ada"), ("o3", 2, "ada"), ("o4", 2, "bob"), ("o5", 2, "ada")] {
        let rec = kept(id, v).await;
        assert_eq!(rec.get_i32("v").ok(), Some(2), "{rec}");
        let before = rec.get_document("before").unwrap_or_else(|_| panic!("{id} v{v} keeps before: {rec}"));
        assert_eq!(before, &doc! {"fields": ["owner", "team"], "data": {"owner": owner, "team": "red"}}, "{id}");
    }
    assert!(kept("o1", 1).await.get("before").is_none(), "a create keeps nothing");

    // The log lets the creations' events go.
    app.run_once("ttl").await; // counts the log's changes, which the purge waits for
    app.run_once("event_purge").await;
    assert!(kept_not(&app, "orders/o1/1").await, "purged");
    // Read here, and by an instance that learns the log from the store.
    let fresh = TestApp::on_store(app.config.clone(), Arc::clone(&app.store), None).await;
    let ada = token(&issuer, "ada", &["customer"], None);
    let seen = told(&retained(&fresh, &ada).await);
    assert_eq!(told(&retained(&app, &ada).await), seen);
    assert_eq!(
        seen,
        vec![
            row("o1", 2, true, None),
            row("o2", 2, true, None),
            row("o3", 2, true, None),
            row("o4", 2, false, Some("ada")),
            row("o5", 2, false, Some("ada")),
        ],
        "what left is told as left, what came in or stayed is sent"
    );
    // bob reads o4's change as leaving, and o1's and o3's as coming in.
    let bob = token(&issuer, "bob", &["customer"], None);
    let seen = told(&retained(&fresh, &bob).await);
    let mut expected = vec![row("o1", 2, false, Some("bob")), row("o3", 2, false, Some("bob"))];
    expected.push(row("o4", 2, true, None));
    assert_eq!(seen, expected);
    fresh.stop().await;
    app.stop().await;
}

#[tokio::test]
async fn events_keep_what_the_rules_look_at_on_the_embedded_store() {
    events_keep_what_the_rules_look_at(Backend::Embedded).await;
}

#[tokio::test]
async fn events_keep_what_the_rules_look_at_on_mongodb() {
    events_keep_what_the_rules_look_at(Backend::Mongodb).await;
}

/// Events of format 1, as the previous release wrote them, are read and
/// judged by their previous version's event when the log holds it.
async fn events_of_the_previous_format_are_judged_by_the_version_before(backend: Backend) {
    let issuer = Issuer::start(&[&RSA_A]).await;
    let Some(app) = gateway(backend, &issuer).await else { return };
    ready_index(&app, "orders", "owner", &["owner"]).await;
    expect(send(&app, ADMIN, Method::PUT, "/v1/collections/orders/rules", Some(&rules())).await, 200).await;
    let docs = "/v1/collections/orders/documents";
    let doc = json!({"_id": "o1", "owner": "ada", "team": "red", "qty": 1});
    expect(send(&app, WRITER, Method::POST, docs, Some(&doc)).await, 201).await;
    let give =
        app.request(Method::PATCH, &format!("{docs}/o1")).bearer_auth(WRITER).json(&json!({"set": {"owner": "bob"}}));
    expect(give.send().await.unwrap(), 200).await;
    app.settled().await;
    for v in [1, 2] {
        let old = Update { set: doc! {}, unset: vec!["v".into(), "before".into()] };
        assert!(app.store.update(EVENTS, &format!("orders/o1/{v}"), shape::any(), old).await.unwrap());
    }
    let fresh = TestApp::on_store(app.config.clone(), Arc::clone(&app.store), None).await;
    let ada = token(&issuer, "ada", &["customer"], None);
    let seen = told(&events(&fresh, &ada, 0).await);
    assert_eq!(seen, vec![row("o1", 1, false, Some("ada")), row("o1", 2, true, None)]);
    fresh.stop().await;
    app.stop().await;
}

#[tokio::test]
async fn events_of_the_previous_format_are_judged_by_the_version_before_on_the_embedded_store() {
    events_of_the_previous_format_are_judged_by_the_version_before(Backend::Embedded).await;
}

#[tokio::test]
async fn events_of_the_previous_format_are_judged_by_the_version_before_on_mongodb() {
    events_of_the_previous_format_are_judged_by_the_version_before(Backend::Mongodb).await;
}

/// An admin reads a collection as a user sees it (`POST /v1/access/view`):
/// the documents and fields the user's grants let them read, the grant
/// named; each view is an `access.viewed_as` event only admins are sent.
#[tokio::test]
async fn an_admin_views_a_collection_as_a_user_and_the_view_is_recorded() {
    let issuer = Issuer::start(&[&RSA_A]).await;
    let app = gateway(Backend::Embedded, &issuer).await.unwrap();
    ready_index(&app, "orders", "owner", &["owner"]).await;
    ready_index(&app, "orders", "team", &["team"]).await;
    let docs = "/v1/collections/orders/documents";
    for (id, owner, team) in [("o1", "ada", "red"), ("o2", "bob", "red"), ("o3", "bob", "blue")] {
        let doc = json!({"_id": id, "owner": owner, "team": team, "qty": 1, "secret": "s"});
        expect(send(&app, WRITER, Method::POST, docs, Some(&doc)).await, 201).await;
    }
    expect(send(&app, ADMIN, Method::PUT, "/v1/collections/orders/rules", Some(&rules())).await, 200).await;
    let view = |who: &'static str, body: Value| {
        let req = app.request(Method::POST, "/v1/access/view").bearer_auth(who).json(&body);
        async move { req.send().await.unwrap() }
    };
    let ada = json!({"principal": {"sub": "ada", "roles": ["customer"]}, "collection": "orders"});
    let res = view(ADMIN, ada.clone()).await;
    assert_eq!(res.headers()["txgate-grant"], "orders/own@1");
    let page = expect(res, 200).await;
    let ids: Vec<&str> = page["items"].as_array().unwrap().iter().map(|d| d["id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["o1"]);
    assert_eq!(page["items"][0]["data"]["secret"], "s", "the owner's grant reads every field");
    // An agent of team red: both red orders, without the fields the team
    // grant does not read; a query too.
    let zed = json!({"principal": {"sub": "zed", "roles": ["agent"], "claims": {"team": "red"}}, "collection": "orders",
        "query": {"filter": {"team": "red"}, "limit": 10}});
    let page = expect(view(ADMIN, zed).await, 200).await;
    let items = page["items"].as_array().unwrap();
    assert_eq!(items.iter().map(|d| d["id"].as_str().unwrap()).collect::<Vec<_>>(), ["o1", "o2"]);
    assert!(items.iter().all(|d| d["data"].get("secret").is_none()), "{page}");
    // Refused: a caller without admin, a principal the rules do not judge,
    // a query the principal may not make.
    crate::support::expect_problem(view(WRITER, ada.clone()).await, 403, "forbidden").await;
    let key = json!({"principal": {"key": "key-2"}, "collection": "orders"});
    let problem = crate::support::expect_problem(view(ADMIN, key).await, 422, "validation_failed").await;
    assert_eq!(problem["errors"][0]["pointer"], "/principal", "{problem}");
    let hidden = json!({"principal": {"sub": "zed", "roles": ["agent"], "claims": {"team": "red"}},
        "collection": "orders", "query": {"filter": {"secret": "s"}}});
    crate::support::expect_problem(view(ADMIN, hidden).await, 403, "rule_denied").await;

    // Each view given is in the log, for admins only.
    app.settled().await;
    let page = |who: &'static str| {
        let req = app
            .request(Method::GET, "/v1/events?types=access.viewed_as&after=0")
            .bearer_auth(who)
            .header("accept", "application/json");
        async move { expect(req.send().await.unwrap(), 200).await["items"].as_array().unwrap().clone() }
    };
    let viewed = page(ADMIN).await;
    assert_eq!(viewed.len(), 2, "{viewed:?}");
    assert_eq!(viewed[0]["type"], "access.viewed_as");
    assert_eq!(viewed[0]["collection"], "orders");
    assert_eq!(viewed[0]["key"], "key-1");
    assert_eq!(viewed[0]["data"]["principal"], ada["principal"]);
    assert_eq!(viewed[1]["data"]["principal"]["sub"], "zed");
    assert!(page(WRITER).await.is_empty(), "a key without admin is not sent them");
    let user = token(&issuer, "ada", &["customer"], None);
    let theirs = events(&app, &user, 0).await;
    assert!(theirs.iter().all(|e| e["type"] != "access.viewed_as"), "{theirs:?}");
    app.stop().await;
}

/// A user's transaction under rules, sent again with its `Idempotency-Key`,
/// answers its first outcome and writes nothing more; the same key from
/// another user is theirs alone (judged afresh: refused here).
#[tokio::test]
async fn a_ruled_transaction_replayed_by_its_key_answers_its_first_outcome() {
    let issuer = Issuer::start(&[&RSA_A]).await;
    let app = gateway(Backend::Embedded, &issuer).await.unwrap();
    ready_index(&app, "orders", "owner", &["owner"]).await;
    let docs = "/v1/collections/orders/documents";
    let doc = json!({"_id": "o1", "owner": "ada", "team": "red", "qty": 1});
    expect(send(&app, WRITER, Method::POST, docs, Some(&doc)).await, 201).await;
    expect(send(&app, ADMIN, Method::PUT, "/v1/collections/orders/rules", Some(&rules())).await, 200).await;
    let (ada, bob) = (token(&issuer, "ada", &["customer"], None), token(&issuer, "bob", &["customer"], None));
    let body = json!({"actions": [{"op": "update", "collection": "orders", "id": "o1", "inc": {"qty": 1}}]});
    let post = |who: &str| {
        app.request(Method::POST, "/v1/transactions")
            .bearer_auth(who)
            .header("idempotency-key", "k-1")
            .json(&body)
            .send()
    };
    let first = post(&ada).await.unwrap();
    assert!(first.headers().get("idempotent-replayed").is_none());
    let first = expect(first, 200).await;
    let again = post(&ada).await.unwrap();
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    assert_eq!(expect(again, 200).await, first);
    let o1 = expect(send(&app, &ada, Method::GET, &format!("{docs}/o1"), None).await, 200).await;
    assert_eq!((o1["version"].as_i64(), o1["data"]["qty"].as_i64()), (Some(2), Some(2)), "applied once: {o1}");
    // bob's request with the same key is his own: judged, and o1 is not his.
    let res = post(&bob).await.unwrap();
    assert!(res.headers().get("idempotent-replayed").is_none());
    crate::support::expect_problem(res, 404, "not_found").await;
    app.stop().await;
}

/// Two instances on one store: once a rules `PUT` on one has answered,
/// the other judges by the new version (its view is at most a second old,
/// and the `PUT` waits longer): a read it no longer allows is 404 there,
/// and a stream there whose caller lost every grant gets `reauth`.
#[tokio::test]
async fn a_rule_change_on_one_instance_is_in_force_on_another_once_answered() {
    let issuer = Issuer::start(&[&RSA_A]).await;
    let a = gateway(Backend::Embedded, &issuer).await.unwrap();
    let b = TestApp::on_store(a.config.clone(), Arc::clone(&a.store), None).await;
    ready_index(&a, "orders", "owner", &["owner"]).await;
    ready_index(&a, "orders", "team", &["team"]).await;
    let docs = "/v1/collections/orders/documents";
    let doc = json!({"_id": "o1", "owner": "ada", "team": "red", "qty": 1});
    expect(send(&a, WRITER, Method::POST, docs, Some(&doc)).await, 201).await;
    expect(send(&a, ADMIN, Method::PUT, "/v1/collections/orders/rules", Some(&rules())).await, 200).await;
    let zed = token(&issuer, "zed", &["agent"], Some("red"));
    expect(send(&b, &zed, Method::GET, &format!("{docs}/o1"), None).await, 200).await;
    let req = b.request(Method::GET, "/v1/events?collections=orders").bearer_auth(&zed);
    let mut stream = crate::support::SseStream::try_open(req).await.unwrap();
    // The team grant goes, through the other instance.
    let own_only = json!({"grants": [rules()["grants"][0].clone()]});
    expect(send(&a, ADMIN, Method::PUT, "/v1/collections/orders/rules", Some(&own_only)).await, 200).await;
    crate::support::expect_problem(send(&b, &zed, Method::GET, &format!("{docs}/o1"), None).await, 404, "not_found")
        .await;
    let bump = json!({"set": {"qty": 2}});
    expect(send(&a, WRITER, Method::PATCH, &format!("{docs}/o1"), Some(&bump)).await, 200).await;
    let told = stream.next(std::time::Duration::from_secs(10)).await.unwrap();
    assert_eq!(told.event.as_deref(), Some("reauth"), "{:?}", told.data);
    b.stop().await;
    a.stop().await;
}

/// A grant whose `when` holds until a time: a stream judged by it is sent
/// what it allows until then, and ends with `reauth` once the time is past
/// and it allows nothing (judged again each second, not once per version).
#[tokio::test]
async fn a_stream_whose_grant_runs_out_in_time_ends_with_reauth() {
    let issuer = Issuer::start(&[&RSA_A]).await;
    let app = gateway(Backend::Embedded, &issuer).await.unwrap();
    ready_index(&app, "orders", "owner", &["owner"]).await;
    let now = app.config.txn.clock.now().timestamp_millis();
    let until = time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(now + 60_000) * 1_000_000).unwrap();
    let until = until.format(&time::format_description::well_known::Rfc3339).unwrap();
    let timed = json!({"grants": [{"name": "own_for_now", "roles": ["customer"], "match": {"owner": {"$auth": "sub"}},
        "when": {"now": {"$lt": until}}, "actions": ["read", "stream"]}]});
    expect(send(&app, ADMIN, Method::PUT, "/v1/collections/orders/rules", Some(&timed)).await, 200).await;
    let docs = "/v1/collections/orders/documents";
    let doc = json!({"_id": "o1", "owner": "ada", "qty": 1});
    expect(send(&app, WRITER, Method::POST, docs, Some(&doc)).await, 201).await;
    let ada = token(&issuer, "ada", &["customer"], None);
    let req = app.request(Method::GET, "/v1/events?collections=orders").bearer_auth(&ada);
    let mut stream = crate::support::SseStream::try_open(req).await.unwrap();
    let bump = |qty: i64| {
        let req =
            app.request(Method::PATCH, &format!("{docs}/o1")).bearer_auth(WRITER).json(&json!({"set": {"qty": qty}}));
        async move { expect(req.send().await.unwrap(), 200).await }
    };
    bump(2).await;
    let seen = stream.next(std::time::Duration::from_secs(10)).await.unwrap();
    assert_eq!(seen.data["data"]["qty"], 2, "{:?}", seen.data);
    // Past the time (and past a second, when the grant is judged again).
    app.advance(std::time::Duration::from_secs(120));
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    bump(3).await;
    let told = stream.next(std::time::Duration::from_secs(10)).await.unwrap();
    assert_eq!(told.event.as_deref(), Some("reauth"), "{:?}", told.data);
    crate::support::expect_problem(send(&app, &ada, Method::GET, &format!("{docs}/o1"), None).await, 404, "not_found")
        .await;
    app.stop().await;
}

/// An expiry takes a document out of its owner's view: their stream is
/// sent it as `left`, with no data; another user's stream nothing; the
/// event keeps the owner as it was.
async fn an_expiry_is_told_as_left(backend: Backend) {
    use std::time::Duration;
    let issuer = Issuer::start(&[&RSA_A]).await;
    let sweeps = |c: &mut txgate::config::Config| c.ttl_interval = Duration::from_secs(3600);
    let Some(app) = gateway_with(backend, &issuer, sweeps).await else { return };
    ready_index(&app, "orders", "owner", &["owner"]).await;
    expect(send(&app, ADMIN, Method::PUT, "/v1/collections/orders/rules", Some(&rules())).await, 200).await;
    let docs = "/v1/collections/orders/documents";
    for (id, owner) in [("o1", "ada"), ("o2", "bob")] {
        let doc = json!({"_id": id, "owner": owner, "qty": 1});
        expect(send(&app, WRITER, Method::POST, docs, Some(&doc)).await, 201).await;
    }
    let open = |who: String| {
        let req = app.request(Method::GET, "/v1/events?collections=orders").bearer_auth(who);
        async move { crate::support::SseStream::try_open(req).await.unwrap() }
    };
    let mut ada = open(token(&issuer, "ada", &["customer"], None)).await;
    let ttl = json!({"ttl": {"max_age_seconds": 10}});
    expect(send(&app, ADMIN, Method::PUT, "/v1/collections/orders", Some(&ttl)).await, 200).await;
    app.settled().await;
    app.advance(Duration::from_secs(20));
    app.run_once("ttl").await;
    let left = ada.next(Duration::from_secs(10)).await.unwrap();
    assert_eq!(left.data["type"], "document.expired", "{:?}", left.data);
    assert_eq!((left.data["document"].as_str(), left.data["left"].as_bool()), (Some("o1"), Some(true)));
    assert!(left.data.get("data").is_none(), "{:?}", left.data);
    // Nothing about bob's order.
    assert!(ada.next(Duration::from_millis(800)).await.is_none());
    app.settled().await;
    let kept = app.store.get(EVENTS, "orders/o1/2").await.unwrap().expect("the expiry is logged");
    assert_eq!(kept.get_document("before").unwrap().get_document("data").unwrap(), &doc! {"owner": "ada"});
    app.stop().await;
}

#[tokio::test]
async fn an_expiry_is_told_as_left_on_the_embedded_store() {
    an_expiry_is_told_as_left(Backend::Embedded).await;
}

#[tokio::test]
async fn an_expiry_is_told_as_left_on_mongodb() {
    an_expiry_is_told_as_left(Backend::Mongodb).await;
}

//! Unique indexes: each value a document holds in a unique index is
//! claimed by a reservation record in `_unique` before any write that
//! gives it the value, and a write whose claim is refused is 409
//! `duplicate`, decided before it writes (and, in a transaction, before
//! its commit point: a roll-forward never meets a duplicate).
//!
//! A reservation (`<index in the store>/<value's key>`) names its owner
//! document and when it was claimed. A claim is a conditional insert, or
//! a compare-and-set on the reservation as read: it takes a reservation
//! that is its own document's (and renews it), or a stale one, which is
//! one older than [`GRACE`] whose owner no longer holds the value (neither
//! in its committed data nor in a change staged on it). A younger one is
//! held whatever its owner shows: its owner's write may be on its way.
//! Every claim renews the reservation's time, so two claims of one
//! reservation as read never both succeed.
//!
//! A document holds no value in an index whose paths it all lacks (or
//! holds null at): as a sparse unique index, such documents never
//! collide. Tombstones hold nothing. A write that gives a value up reads
//! its reservation before it writes and releases it, as read, once the
//! write has landed (a claim of it since, by another write of the same
//! document, renewed it and keeps it); a release that did not happen
//! leaves a stale reservation the next claim takes over.

use std::time::Duration;

use base64::Engine as _;

use super::Declaration;
use crate::document::StoredDoc;
use crate::store::scans::UNIQUE_BY_INDEX;
use crate::store::shape::{any, fields};
use crate::store::{Bson, DateTime, Document, DynStore, StoreResult};

/// The collection of reservations.
pub(crate) const UNIQUE: &str = "_unique";

/// The version of a reservation record's format.
const FORMAT: i32 = 1;

/// How long a claim holds its value whatever its owner shows: longer than
/// any write takes from its claim to its landing.
pub(crate) const GRACE: Duration = Duration::from_secs(30);

/// Claims one write tries before it gives up on a reservation others keep
/// changing.
const MAX_TRIES: usize = 8;

/// A unique index as a claim needs it: its name in the store, its name
/// for clients, its paths.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Unique {
    pub physical: String,
    pub name: String,
    pub paths: Vec<String>,
}

impl Unique {
    pub(crate) fn of(d: &Declaration) -> Self {
        Self { physical: d.physical.clone(), name: d.name.clone(), paths: d.paths().map(str::to_owned).collect() }
    }

    /// The key of the value `data` holds in this index, if it holds one.
    pub(crate) fn value(&self, data: &Document) -> Option<Vec<u8>> {
        crate::query::rule::unique_key(&self.paths, data)
    }

    fn id(&self, key: &[u8]) -> String {
        format!("{}/{}", self.physical, base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(key))
    }
}

/// A claim made: which reservation, and the time it was claimed at.
#[derive(Clone, Debug)]
pub(crate) struct Claim {
    pub reservation: String,
    pub at: DateTime,
    /// The document's own reservation, renewed: never released (the
    /// document may hold the value already).
    pub renewed: bool,
}

/// A value another document holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Duplicate {
    /// The index, as clients name it.
    pub index: String,
    /// The document holding the value.
    pub existing: String,
}

/// Whether `doc` holds `key` in `index`: in its committed data, or in a
/// change a transaction staged on it.
fn holds(index: &Unique, doc: &StoredDoc, key: &[u8]) -> bool {
    let committed = !doc.meta.deleted && doc.meta.v > 0 && index.value(&doc.data).as_deref() == Some(key);
    let staged = doc.meta.txn.is_some()
        && doc.meta.pending.as_ref().and_then(|p| p.data.as_ref()).and_then(|d| index.value(d)).as_deref() == Some(key);
    committed || staged
}

/// Claim `key` of `index` for document `owner` of `coll`, at `now`.
pub(crate) async fn claim(
    store: &DynStore,
    coll: &str,
    index: &Unique,
    key: &[u8],
    owner: &str,
    now: DateTime,
) -> StoreResult<Result<Claim, Duplicate>> {
    let id = index.id(key);
    let mine = fields(&shapes::Reservation { id: &id, v: FORMAT, index: &index.physical, owner, at: now });
    let taken = Claim { reservation: id.clone(), at: now, renewed: false };
    for _ in 0..MAX_TRIES {
        if store.insert(UNIQUE, mine.clone()).await? {
            return Ok(Ok(taken));
        }
        let Some(found) = store.get(UNIQUE, &id).await? else { continue };
        let (Ok(holder), Ok(at)) = (found.get_str("owner"), found.get_datetime("at")) else {
            // Not one this gateway wrote: take it over.
            if store.replace(UNIQUE, &id, any(), mine.clone()).await? {
                return Ok(Ok(taken));
            }
            continue;
        };
        let read = fields(&shapes::Held { owner: holder, at: *at });
        if holder == owner {
            // Its own: renewed, so a claim of it as read before fails.
            if store.replace(UNIQUE, &id, read, mine.clone()).await? {
                return Ok(Ok(Claim { renewed: true, ..taken }));
            }
            continue;
        }
        let young = now.timestamp_millis() - at.timestamp_millis() < GRACE.as_millis() as i64;
        let duplicate = Duplicate { index: index.name.clone(), existing: holder.to_owned() };
        if young {
            return Ok(Err(duplicate));
        }
        if let Some(record) = store.get(coll, holder).await? {
            if let Ok(doc) = StoredDoc::from_record(record) {
                if holds(index, &doc, key) {
                    return Ok(Err(duplicate));
                }
            }
        }
        // Stale: its owner gave the value up.
        if store.replace(UNIQUE, &id, read, mine.clone()).await? {
            return Ok(Ok(taken));
        }
    }
    Err(crate::store::StoreError::Unavailable(format!(
        "the reservation of a value of index {} kept changing; retry",
        index.name
    )))
}

/// Give up `claims` a write made and did not use: each only as claimed
/// (a claim of the same document since keeps it).
pub(crate) async fn release(store: &DynStore, claims: &[Claim]) {
    for c in claims.iter().filter(|c| !c.renewed) {
        let filter = fields(&shapes::At { at: c.at });
        if let Err(err) = store.unsynced().delete(UNIQUE, &c.reservation, filter).await {
            tracing::debug!(error = %err, reservation = %c.reservation, "a reservation stays until it is stale");
        }
    }
}

/// The reservation of `key` in `index`, if document `owner` holds it.
pub(crate) async fn held(store: &DynStore, index: &Unique, key: &[u8], owner: &str) -> StoreResult<Option<Claim>> {
    let id = index.id(key);
    let Some(found) = store.get(UNIQUE, &id).await? else { return Ok(None) };
    match (found.get_str("owner"), found.get_datetime("at")) {
        (Ok(holder), Ok(at)) if holder == owner => Ok(Some(Claim { reservation: id, at: *at, renewed: false })),
        _ => Ok(None),
    }
}

/// Remove every reservation of a dropped index, a batch at a time.
pub(crate) async fn drop_all(store: &DynStore, physical: &str) -> StoreResult<usize> {
    crate::store::purge(store.as_ref(), UNIQUE, UNIQUE_BY_INDEX.scan(vec![Bson::String(physical.to_owned())])).await
}

/// The fields of a reservation its claims filter on and write.
mod shapes {
    use serde::Serialize;

    use crate::store::DateTime;

    #[derive(Serialize)]
    pub(super) struct Reservation<'a> {
        #[serde(rename = "_id")]
        pub id: &'a str,
        pub v: i32,
        pub index: &'a str,
        pub owner: &'a str,
        pub at: DateTime,
    }

    /// Held by `owner` since `at`: the reservation as read.
    #[derive(Serialize)]
    pub(super) struct Held<'a> {
        pub owner: &'a str,
        pub at: DateTime,
    }

    /// Claimed at `at`.
    #[derive(Serialize)]
    pub(super) struct At {
        pub at: DateTime,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn data(value: serde_json::Value) -> Document {
        crate::store::convert::object_to_document(value.as_object().expect("an object"))
    }

    #[test]
    fn a_document_without_the_paths_holds_no_value() {
        let u = Unique { physical: "u.e.1".into(), name: "e".into(), paths: vec!["email".into(), "org".into()] };
        assert!(u.value(&data(json!({"x": 1}))).is_none());
        assert!(u.value(&data(json!({"email": null}))).is_none());
        assert!(u.value(&data(json!({"email": "a"}))).is_some());
        // Numbers of every kind are one value.
        assert_eq!(u.value(&data(json!({"email": 1}))), u.value(&data(json!({"email": 1.0}))));
        assert_ne!(u.value(&data(json!({"email": "a"}))), u.value(&data(json!({"email": "a", "org": "o"}))));
    }
}

//! Unique indexes: each value a document holds in a unique index is
//! claimed by a reservation record in `_unique` before any write that
//! gives it the value, and a write whose claim is refused is 409
//! `duplicate`, decided before it writes (and, in a transaction, before
//! its commit point: a roll-forward never meets a duplicate).
//!
//! A reservation (`<index in the store>/<value's key>`) names its owner
//! document, when it was claimed, and the claim that wrote it (a token of
//! its own). A claim is a conditional insert, or a compare-and-set on the
//! reservation as read: it takes a reservation that is its own document's
//! (and renews it), or a stale one, which is one older than [`GRACE`] whose
//! owner no longer holds the value (neither in its committed data nor in a
//! change staged on it). A younger one is held whatever its owner shows:
//! its owner's write may be on its way. Every claim writes its own token,
//! so two claims of one reservation as read never both succeed, and a
//! release (conditional on the token) removes only what its claim wrote,
//! even when another claim wrote the reservation in the same millisecond.
//!
//! A document holds no value in an index whose paths it all lacks (or
//! holds null at): as a sparse unique index, such documents never
//! collide. Tombstones hold nothing. A write that gives a value up reads
//! its reservation before it writes and releases it, as read, once the
//! write has landed (a claim of it since, by another write of the same
//! document, renewed it and keeps it); a release that did not happen
//! leaves a stale reservation the next claim takes over.
//!
//! A transaction may hand a value from one of its members' documents to
//! another (delete or change it in one, give it to another; or swap two
//! documents' values). The taker's claim takes the giver's reservation
//! over, naming the giver as `from`: until the transaction commits, the
//! giver still holds the value, so a reservation is stale only when
//! neither its owner nor its `from` holds it, and its owner's own claim
//! of it is refused while its `from` holds it outside such a transaction.
//! A transaction that does not commit gives the reservation back to the
//! giver; where that did not happen (a crash), `from` keeps the value the
//! giver's.

use std::time::Duration;

use base64::Engine as _;

use super::Declaration;
use crate::document::StoredDoc;
use crate::store::scans::UNIQUE_BY_INDEX;
use crate::store::shape::{any, fields};
use crate::store::{Bson, DateTime, Document, Durability, DynStore, StoreResult, Write};

/// The collection of reservations.
pub(crate) const UNIQUE: &str = "_unique";

/// The version of a reservation record's format: 2 added `from` (a
/// reservation of format 1 has none), 3 added `claim` (one of an earlier
/// format is named by its owner and time alone).
const FORMAT: i32 = 3;

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

    /// The id of the reservation of value `key`.
    pub(crate) fn id(&self, key: &[u8]) -> String {
        format!("{}/{}", self.physical, base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(key))
    }
}

/// A claim made: which reservation, and the reservation as the claim
/// wrote it (or read it).
#[derive(Clone, Debug)]
pub(crate) struct Claim {
    pub reservation: String,
    pub mark: Mark,
    /// The document's own reservation, renewed: never released (the
    /// document may hold the value already).
    pub renewed: bool,
    /// Taken over from another document of the same transaction that
    /// gives the value up: the reservation as it was, given back to it if
    /// the transaction does not commit.
    pub handed: Option<Mark>,
}

/// What names one write of a reservation: its owner, its time and its
/// claim's token (`None` in a reservation of an earlier format).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Mark {
    pub owner: String,
    pub at: DateTime,
    pub claim: Option<String>,
}

impl Mark {
    fn of(found: &Document) -> Option<Self> {
        let (Ok(owner), Ok(at)) = (found.get_str("owner"), found.get_datetime("at")) else { return None };
        Some(Self { owner: owner.to_owned(), at: *at, claim: found.get_str("claim").ok().map(str::to_owned) })
    }

    /// The filter a write of the reservation exactly as marked passes.
    fn filter(&self) -> Document {
        fields(&shapes::Held { owner: &self.owner, at: self.at, claim: self.claim.as_deref() })
    }
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

/// Whether document `id` of `coll` holds `key` in `index` (see [`holds`]);
/// a record that cannot be read holds nothing (it is never shown).
async fn holder_holds(store: &DynStore, coll: &str, index: &Unique, id: &str, key: &[u8]) -> StoreResult<bool> {
    Ok(match store.get(coll, id).await? {
        Some(record) => StoredDoc::from_record(record).is_ok_and(|doc| holds(index, &doc, key)),
        None => false,
    })
}

/// Claim `key` of `index` for document `owner` of `coll`, at `now`.
/// `giving` names the other documents of `coll` whose change in the same
/// transaction gives `key` up: a reservation one of them owns is taken
/// over (module docs). The reservation is written `how`: a write's claim
/// synced (a duplicate it causes may name its owner), a build's claim of
/// a value its document holds already unsynced (the build's end, synced,
/// makes every claim before it durable).
pub(crate) async fn claim(
    store: &DynStore,
    coll: &str,
    index: &Unique,
    key: &[u8],
    (owner, giving): (&str, &[&str]),
    now: DateTime,
    how: Durability,
) -> StoreResult<Result<Claim, Duplicate>> {
    let id = index.id(key);
    let token = uuid::Uuid::now_v7().to_string();
    let insert = |record: Document| store.write(UNIQUE, Write::Insert(record), how);
    let replace =
        |filter: Document, record: Document| store.write(UNIQUE, Write::Replace { id: &id, filter, record }, how);
    let record = |from: Option<&str>| reservation(index, &id, (owner, from), now, &token);
    let mine = record(None);
    let written = Mark { owner: owner.to_owned(), at: now, claim: Some(token.clone()) };
    let taken = Claim { reservation: id.clone(), mark: written, renewed: false, handed: None };
    let duplicate = |existing: &str| Duplicate { index: index.name.clone(), existing: existing.to_owned() };
    for _ in 0..MAX_TRIES {
        if insert(mine.clone()).await? {
            return Ok(Ok(taken));
        }
        let Some(found) = store.get(UNIQUE, &id).await? else { continue };
        let Some(as_read) = Mark::of(&found) else {
            // Not one this gateway wrote: take it over.
            if replace(any(), mine.clone()).await? {
                return Ok(Ok(taken));
            }
            continue;
        };
        let holder = as_read.owner.as_str();
        let from = found.get_str("from").ok().filter(|f| *f != holder);
        let read = as_read.filter();
        if holder == owner {
            // Its own, unless handed to it by a transaction that did not
            // commit, from a document still holding the value.
            let handing = from.filter(|f| giving.contains(f));
            if let Some(from) = from.filter(|f| !giving.contains(f)) {
                if holder_holds(store, coll, index, from, key).await? {
                    return Ok(Err(duplicate(from)));
                }
            }
            // Renewed, so a claim of it as read before fails.
            if replace(read, record(handing)).await? {
                return Ok(Ok(Claim { renewed: true, ..taken }));
            }
            continue;
        }
        if giving.contains(&holder) {
            // Handed over within the transaction: the giver keeps it until
            // the transaction commits.
            if replace(read, record(Some(holder))).await? {
                return Ok(Ok(Claim { handed: Some(as_read.clone()), ..taken }));
            }
            continue;
        }
        // The duplicate names the document that holds the value where one
        // does: the owner, or the one a transaction that did not commit
        // (and whose release is not in yet) was handed it from.
        if holder_holds(store, coll, index, holder, key).await? {
            return Ok(Err(duplicate(holder)));
        }
        if let Some(from) = from {
            if holder_holds(store, coll, index, from, key).await? {
                return Ok(Err(duplicate(from)));
            }
        }
        let young = now.timestamp_millis() - as_read.at.timestamp_millis() < GRACE.as_millis() as i64;
        if young {
            return Ok(Err(duplicate(holder)));
        }
        // Stale: its owner gave the value up.
        if replace(read, mine.clone()).await? {
            return Ok(Ok(taken));
        }
    }
    Err(crate::store::StoreError::Unavailable(format!(
        "the reservation of a value of index {} kept changing; retry",
        index.name
    )))
}

/// The reservation record of value `id` of `index` a claim for `owner`
/// (taken over `from`) at `now` writes, with its token.
fn reservation(index: &Unique, id: &str, (owner, from): (&str, Option<&str>), now: DateTime, claim: &str) -> Document {
    fields(&shapes::Reservation { id, v: FORMAT, index: &index.physical, owner, at: now, claim, from })
}

/// The reservation a first claim of `key` for `owner` at `now` inserts:
/// what a build writes, many at once, for documents that hold their
/// values already; where one is refused, [`claim`] makes the claim.
pub(crate) fn first_claim(index: &Unique, key: &[u8], owner: &str, now: DateTime) -> Document {
    reservation(index, &index.id(key), (owner, None), now, &uuid::Uuid::now_v7().to_string())
}

/// Whether `reservation` is document `owner`'s own, and no other
/// document's change in a transaction handed it over (a claim of it by
/// `owner` would renew it and nothing else).
pub(crate) fn owned_by(reservation: &Document, owner: &str) -> bool {
    let from = reservation.get_str("from").ok();
    Mark::of(reservation).is_some_and(|mark| mark.owner == owner) && from.is_none_or(|from| from == owner)
}

/// Give up `claims` a write made and did not use: each only as claimed
/// (a claim of the same document since keeps it); one handed over within
/// a transaction goes back to the document it was taken from.
pub(crate) async fn release(store: &DynStore, claims: &[Claim]) {
    for c in claims.iter().filter(|c| !c.renewed) {
        let filter = c.mark.filter();
        let unsynced = store.unsynced();
        let released = match &c.handed {
            None => unsynced.delete(UNIQUE, &c.reservation, filter).await,
            Some(giver) => {
                let index = c.reservation.rsplit_once('/').map_or("", |(index, _)| index);
                // A reservation of an earlier format gets a token of its own.
                let claim = giver.claim.clone().unwrap_or_else(|| uuid::Uuid::now_v7().to_string());
                let back = shapes::Reservation {
                    id: &c.reservation,
                    v: FORMAT,
                    index,
                    owner: &giver.owner,
                    at: giver.at,
                    claim: &claim,
                    from: None,
                };
                unsynced.replace(UNIQUE, &c.reservation, filter, fields(&back)).await
            }
        };
        if let Err(err) = released {
            tracing::debug!(error = %err, reservation = %c.reservation, "a reservation stays until it is stale");
        }
    }
}

/// The reservation of `key` in `index`, if document `owner` holds it.
pub(crate) async fn held(store: &DynStore, index: &Unique, key: &[u8], owner: &str) -> StoreResult<Option<Claim>> {
    let id = index.id(key);
    let Some(found) = store.get(UNIQUE, &id).await? else { return Ok(None) };
    Ok(Mark::of(&found).filter(|mark| mark.owner == owner).map(|mark| Claim {
        reservation: id,
        mark,
        renewed: false,
        handed: None,
    }))
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
        /// The token of the claim that wrote it.
        pub claim: &'a str,
        /// The document of a transaction it was handed over from.
        #[serde(skip_serializing_if = "Option::is_none")]
        pub from: Option<&'a str>,
    }

    /// Held by `owner` since `at` by claim `claim` (none in a
    /// reservation of an earlier format): the reservation as read.
    #[derive(Serialize)]
    pub(super) struct Held<'a> {
        pub owner: &'a str,
        pub at: DateTime,
        #[serde(skip_serializing_if = "Option::is_none")]
        pub claim: Option<&'a str>,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn data(value: serde_json::Value) -> Document {
        crate::store::convert::object_to_document(value.as_object().expect("an object"))
    }

    /// A value handed from one document to another within a transaction
    /// stays the giver's until the transaction commits: for others' claims,
    /// for the taker's own later claims, and once given back.
    #[tokio::test]
    async fn a_value_handed_over_stays_the_givers_until_it_commits() {
        let store: DynStore = std::sync::Arc::new(crate::store::memory::MemoryStore::default());
        let u = Unique { physical: "u.e.1".into(), name: "e".into(), paths: vec!["email".into()] };
        let key = u.value(&data(json!({"email": "x"}))).unwrap();
        let t0 = DateTime::from_millis(1_000_000);
        let later = |t: DateTime, secs: u64| DateTime::from_millis(t.timestamp_millis() + 1000 * secs as i64);
        let put = async |id: &str, value: serde_json::Value| {
            let doc = StoredDoc::new_live(id.into(), data(value), 1, 1, t0);
            if !store.insert("c", doc.to_record()).await.unwrap() {
                assert!(store.replace("c", id, any(), doc.to_record()).await.unwrap());
            }
        };
        put("a", json!({"email": "x"})).await;
        claim(&store, "c", &u, &key, ("a", &[]), t0, Durability::Synced).await.unwrap().unwrap();
        let existing = async |owner: &str, giving: &[&str], at: DateTime| {
            claim(&store, "c", &u, &key, (owner, giving), at, Durability::Synced)
                .await
                .unwrap()
                .err()
                .map(|d| d.existing)
        };
        let reservation = async || {
            let found = store.get(UNIQUE, &u.id(&key)).await.unwrap().unwrap();
            (found.get_str("owner").unwrap().to_owned(), found.get_str("from").ok().map(str::to_owned))
        };
        // Another document of the transaction takes it over from "a"; the
        // transaction does not commit and gives it back.
        let t1 = later(t0, 1);
        let handed = claim(&store, "c", &u, &key, ("b", &["a"]), t1, Durability::Synced).await.unwrap().unwrap();
        let given = handed.handed.clone().expect("handed over");
        assert_eq!((given.owner.as_str(), given.at), ("a", t0));
        assert_eq!(reservation().await, ("b".to_owned(), Some("a".to_owned())));
        release(&store, &[handed]).await;
        assert_eq!(reservation().await, ("a".to_owned(), None));
        assert_eq!(existing("z", &[], later(t1, GRACE.as_secs() + 1)).await.as_deref(), Some("a"));
        // Taken over again, and never given back (a crash): the value stays
        // "a"'s, for others and for "b" itself, long after the grace.
        let t2 = later(t1, 1);
        claim(&store, "c", &u, &key, ("b", &["a"]), t2, Durability::Synced).await.unwrap().unwrap();
        let stale = later(t2, GRACE.as_secs() + 1);
        // Within the grace too, the duplicate names "a": "b" holds nothing
        // (no change of it is staged), "a" holds the value.
        assert_eq!(existing("z", &[], t2).await.as_deref(), Some("a"));
        assert_eq!(existing("z", &[], stale).await.as_deref(), Some("a"));
        assert_eq!(existing("b", &[], stale).await.as_deref(), Some("a"));
        // The transaction sent again: "b"'s own, renewed, "a" still named.
        let again = claim(&store, "c", &u, &key, ("b", &["a"]), stale, Durability::Synced).await.unwrap().unwrap();
        assert!(again.renewed);
        assert_eq!(reservation().await, ("b".to_owned(), Some("a".to_owned())));
        // Committed: "a" gave the value up and "b" holds it.
        put("a", json!({"email": "y"})).await;
        put("b", json!({"email": "x"})).await;
        let t3 = later(stale, GRACE.as_secs() + 10);
        assert_eq!(existing("z", &[], t3).await.as_deref(), Some("b"));
        // "b"'s own claim renews it, and the giver is forgotten.
        assert!(claim(&store, "c", &u, &key, ("b", &[]), t3, Durability::Synced).await.unwrap().unwrap().renewed);
        assert_eq!(reservation().await, ("b".to_owned(), None));
    }

    /// A release removes only what its own claim wrote, even when another
    /// claim of the same document wrote the reservation in the same
    /// millisecond (which a release by time alone could not tell apart).
    #[tokio::test]
    async fn a_release_takes_back_only_its_own_claim_within_one_millisecond() {
        let store: DynStore = std::sync::Arc::new(crate::store::memory::MemoryStore::default());
        let u = Unique { physical: "u.e.1".into(), name: "e".into(), paths: vec!["email".into()] };
        let key = u.value(&data(json!({"email": "x"}))).unwrap();
        let t = DateTime::from_millis(5_000_000);
        // A first write claims the value, a second write of the same
        // document renews it in the same millisecond, and the first, which
        // did not land, gives its claim back.
        let first = claim(&store, "c", &u, &key, ("a", &[]), t, Durability::Synced).await.unwrap().unwrap();
        let second = claim(&store, "c", &u, &key, ("a", &[]), t, Durability::Synced).await.unwrap().unwrap();
        assert!(second.renewed && !first.renewed);
        release(&store, &[first]).await;
        // The second's claim stands: another document may not take it.
        let other = claim(&store, "c", &u, &key, ("b", &[]), t, Durability::Synced).await.unwrap();
        assert_eq!(other.err().map(|d| d.existing).as_deref(), Some("a"));
        // A claim's release does take back what it wrote.
        let u2 = Unique { physical: "u.e.2".into(), ..u.clone() };
        let mine = claim(&store, "c", &u2, &key, ("a", &[]), t, Durability::Synced).await.unwrap().unwrap();
        release(&store, &[mine]).await;
        assert!(store.get(UNIQUE, &u2.id(&key)).await.unwrap().is_none());
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

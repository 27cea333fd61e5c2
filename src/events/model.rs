//! Change events as stored in the log and as clients see them (docs/design.md §5).

use std::collections::BTreeSet;
use std::sync::Arc;

use crate::actor::UserId;
use serde::Serialize;

use crate::document::{StagedOp, StoredDoc};
use crate::store::{Bson, DateTime, Document, LOG_SEQ, LOG_VOID, Record, StoreError, doc};

/// What happened.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, serde::Deserialize, utoipa::ToSchema)]
pub enum EventType {
    #[serde(rename = "document.created")]
    Created,
    #[serde(rename = "document.updated")]
    Updated,
    #[serde(rename = "document.deleted")]
    Deleted,
    #[serde(rename = "document.expired")]
    Expired,
    #[serde(rename = "transaction.committed")]
    TransactionCommitted,
    /// An admin read a collection as another principal sees it
    /// (`POST /v1/access/view`); sent only to callers with `admin` on the
    /// collection.
    #[serde(rename = "access.viewed_as")]
    ViewedAs,
}

impl EventType {
    pub const ALL: [EventType; 6] = [
        EventType::Created,
        EventType::Updated,
        EventType::Deleted,
        EventType::Expired,
        EventType::TransactionCommitted,
        EventType::ViewedAs,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Created => "document.created",
            EventType::Updated => "document.updated",
            EventType::Deleted => "document.deleted",
            EventType::Expired => "document.expired",
            EventType::TransactionCommitted => "transaction.committed",
            EventType::ViewedAs => "access.viewed_as",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.as_str() == s)
    }

    /// The event a committed staged operation causes (none for a check).
    pub fn of_staged(op: StagedOp) -> Option<Self> {
        match op {
            StagedOp::Insert => Some(EventType::Created),
            StagedOp::Update | StagedOp::Replace => Some(EventType::Updated),
            StagedOp::Delete => Some(EventType::Deleted),
            StagedOp::Check => None,
        }
    }
}

/// A member of a committed transaction, as its `transaction.committed`
/// event lists it.
#[derive(Clone, Debug, PartialEq, Serialize, utoipa::ToSchema)]
pub struct EventMember {
    pub collection: String,
    pub id: String,
    /// `insert`, `update`, `replace`, `delete` or `check`.
    pub op: String,
    /// The member's version after the commit (unchanged for a check).
    pub version: i64,
}

// docs/design.md §5.
/// One change event.
#[derive(Clone, Debug, PartialEq, Serialize, utoipa::ToSchema)]
pub struct Event {
    /// `<collection>/<document>/<version>`; `_txns/<transaction>` for a
    /// `transaction.committed` event; `_access/<uuid>` for an
    /// `access.viewed_as` event.
    pub id: String,
    /// The event's position in the log: unique and increasing.
    pub seq: u64,
    #[serde(rename = "type")]
    pub kind: EventType,
    pub collection: Option<String>,
    pub document: Option<String>,
    pub version: Option<i64>,
    /// The transaction that made the change; null for a single-document
    /// write.
    pub transaction: Option<String>,
    /// The name of the API key that made the change (absent without API
    /// keys, for an expiry, and in events logged before keys had names).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// The user who made the change, when a user's token made it:
    /// `{kind: "user", issuer, subject}` (absent for API keys, whose name
    /// is `key`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub actor: Option<UserId>,
    /// When the change was committed (RFC 3339).
    #[schema(value_type = String)]
    pub at: String,
    /// The document after the change (`document.created` and
    /// `document.updated` only); for `access.viewed_as`, `{"principal":
    /// …}`, the principal the collection was read as.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub data: Option<serde_json::Map<String, serde_json::Value>>,
    /// The transaction's members (`transaction.committed` only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub members: Option<Vec<EventMember>>,
    /// In a stream or page read with `filter`: `true` when the change took
    /// the document out of the filtered set (deleted, expired, or no
    /// longer matching; `data` is then what it became, if anything).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub left: Option<bool>,
    /// What the log kept of the document before the change, for readers
    /// judged by rules (never sent).
    #[serde(skip)]
    pub(crate) before: Option<Arc<Before>>,
}

/// The version of an event record's format: 1 had no `v` and kept
/// nothing of the document before a change; 2 keeps `before`.
pub(crate) const FORMAT: i32 = 2;

/// What an event of format 2 keeps of the document before its change
/// (an update, a delete or an expiry of a collection with rules): the
/// top-level fields the rules' `match` named when it was written, and
/// their values then (a field named and absent from `data` was absent).
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Before {
    pub fields: BTreeSet<String>,
    pub data: Document,
}

impl Before {
    /// The document before the change, if what was kept covers `needed`
    /// (`None`: it does not; the reader learns it another way).
    pub(crate) fn covering<'a>(&self, mut needed: impl Iterator<Item = &'a str>) -> Option<&Document> {
        needed.all(|f| self.fields.contains(f)).then_some(&self.data)
    }
}

/// Keep in event record `rec` the fields `named` of `prior`, the document
/// before the change, when it was live (a create keeps nothing: nothing
/// was there).
pub(crate) fn keep_before(rec: &mut Record, named: &BTreeSet<String>, prior: &StoredDoc) {
    if prior.meta.v == 0 || prior.meta.deleted {
        return;
    }
    let data: Document =
        prior.data.iter().filter(|(k, _)| named.contains(k.as_str())).map(|(k, v)| (k.clone(), v.clone())).collect();
    let fields: Vec<Bson> = named.iter().map(|f| Bson::String(f.clone())).collect();
    rec.insert("before", doc! {"fields": fields, "data": data});
}

impl Event {
    /// Whether the event concerns one of `collections` (a transaction's
    /// event: one of its members does).
    pub fn touches(&self, collections: &[String]) -> bool {
        match (&self.collection, &self.members) {
            (Some(c), _) => collections.contains(c),
            (None, Some(members)) => members.iter().any(|m| collections.contains(&m.collection)),
            (None, None) => false,
        }
    }

    /// Whether everything the event tells of lies in `collections` (a
    /// transaction's event: every member does).
    pub fn within(&self, collections: &[String]) -> bool {
        match (&self.collection, &self.members) {
            (Some(c), _) => collections.contains(c),
            (None, Some(members)) => members.iter().all(|m| collections.contains(&m.collection)),
            (None, None) => false,
        }
    }
}

/// The event id of document `id` of `coll` at `version`.
pub(crate) fn document_event_id(coll: &str, id: &str, version: i64) -> String {
    format!("{coll}/{id}/{version}")
}

/// The event id of transaction `txn`'s `transaction.committed`.
pub(crate) fn transaction_event_id(txn: &str) -> String {
    format!("_txns/{txn}")
}

/// The log record (without its position; its `_id` is the event id) of
/// the change that left `doc` as
/// it is, made at `at` by `txn` (none: a single-document write).
pub fn document_event(
    kind: EventType,
    coll: &str,
    doc: &StoredDoc,
    txn: Option<&str>,
    key: Option<&str>,
    actor: Option<&UserId>,
    at: DateTime,
) -> Record {
    let data = matches!(kind, EventType::Created | EventType::Updated).then_some(&doc.data);
    let event = shapes::Event {
        id: document_event_id(coll, &doc.id, doc.meta.v),
        v: FORMAT,
        kind: kind.as_str(),
        collection: Some(coll),
        document: Some(&doc.id),
        version: Some(doc.meta.v),
        transaction: txn,
        key,
        actor,
        at,
        data,
        members: None,
    };
    event.record()
}

/// The log record (without its position) of transaction `txn`'s
/// `transaction.committed` event: committed at `at`, with its members.
pub(crate) fn transaction_event(
    txn: &str,
    key: Option<&str>,
    actor: Option<&UserId>,
    at: DateTime,
    members: Vec<CommittedMember<'_>>,
) -> Record {
    let event = shapes::Event {
        id: transaction_event_id(txn),
        v: FORMAT,
        kind: EventType::TransactionCommitted.as_str(),
        collection: None,
        document: None,
        version: None,
        transaction: Some(txn),
        key,
        actor,
        at,
        data: None,
        members: Some(members),
    };
    event.record()
}

/// The log record (without its position) of an admin's read of `coll`
/// as `principal` sees it (`POST /v1/access/view`), at `at`.
pub(crate) fn viewed_as_event(
    coll: &str,
    key: Option<&str>,
    actor: Option<&UserId>,
    at: DateTime,
    principal: Document,
) -> Record {
    let data = doc! {"principal": principal};
    let event = shapes::Event {
        id: format!("_access/{}", uuid::Uuid::now_v7()),
        v: FORMAT,
        kind: EventType::ViewedAs.as_str(),
        collection: Some(coll),
        document: None,
        version: None,
        transaction: None,
        key,
        actor,
        at,
        data: Some(&data),
        members: None,
    };
    event.record()
}

/// A member of a committed transaction, as its event lists it: the
/// version it was left at.
#[derive(Serialize)]
pub(crate) struct CommittedMember<'a> {
    pub collection: &'a str,
    pub id: &'a str,
    pub op: StagedOp,
    pub version: i64,
}

/// The fields of a log record, as stored.
mod shapes {
    use serde::Serialize;

    use crate::store::{Bson, DateTime, Document};

    /// An event (its position is the store's to give). Built directly
    /// ([`Event::record`]); serde's writing of it is the reference its
    /// tests hold the record to.
    #[derive(Serialize)]
    pub(super) struct Event<'a> {
        #[serde(rename = "_id")]
        pub id: String,
        pub v: i32,
        #[serde(rename = "type")]
        pub kind: &'a str,
        pub collection: Option<&'a str>,
        pub document: Option<&'a str>,
        pub version: Option<i64>,
        pub transaction: Option<&'a str>,
        #[serde(skip_serializing_if = "Option::is_none")]
        pub key: Option<&'a str>,
        #[serde(skip_serializing_if = "Option::is_none")]
        pub actor: Option<&'a crate::actor::UserId>,
        pub at: DateTime,
        #[serde(skip_serializing_if = "Option::is_none")]
        pub data: Option<&'a Document>,
        #[serde(skip_serializing_if = "Option::is_none")]
        pub members: Option<Vec<super::CommittedMember<'a>>>,
    }

    impl Event<'_> {
        /// The record: the fields serde writes, in its order (`None` as
        /// null, the optional ones left out), built without serde, for
        /// every write logs one.
        pub(super) fn record(&self) -> Document {
            let text = |s: Option<&str>| s.map_or(Bson::Null, |s| Bson::String(s.to_owned()));
            let mut rec = Document::new();
            rec.insert("_id", self.id.as_str());
            rec.insert("v", self.v);
            rec.insert("type", self.kind);
            rec.insert("collection", text(self.collection));
            rec.insert("document", text(self.document));
            rec.insert("version", self.version.map_or(Bson::Null, Bson::Int64));
            rec.insert("transaction", text(self.transaction));
            if let Some(key) = self.key {
                rec.insert("key", key);
            }
            if let Some(actor) = self.actor {
                let crate::actor::UserId { kind, issuer, subject } = actor;
                rec.insert("actor", crate::store::doc! {"kind": kind, "issuer": issuer, "subject": subject});
            }
            rec.insert("at", self.at);
            if let Some(data) = self.data {
                rec.insert("data", data.clone());
            }
            if let Some(members) = &self.members {
                let members: Vec<Bson> = members
                    .iter()
                    .map(|m| {
                        Bson::Document(crate::store::doc! {
                            "collection": m.collection,
                            "id": m.id,
                            "op": m.op.as_str(),
                            "version": m.version,
                        })
                    })
                    .collect();
                rec.insert("members", members);
            }
            rec
        }
    }
}

/// What a position of the log holds.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Entry {
    Event(Box<Event>),
    /// Closed for good with no event.
    Void,
}

/// A log record read back: its position, when it was logged, and what it
/// holds.
#[derive(Debug, Clone)]
pub(crate) struct Logged {
    pub seq: u64,
    pub logged_at: Option<DateTime>,
    pub entry: Entry,
}

/// An event record's format (none written: 1).
fn format(rec: &Record) -> i64 {
    match rec.get("v") {
        Some(Bson::Int32(v)) => i64::from(*v),
        Some(Bson::Int64(v)) => *v,
        _ => 1,
    }
}

/// A format 2 record's `before`; `None` where it cannot be read (the
/// reader then learns it another way).
fn before(kept: &Document) -> Option<Before> {
    let fields = kept.get_array("fields").ok()?.iter().map(|f| f.as_str().map(str::to_owned)).collect::<Option<_>>()?;
    Some(Before { fields, data: kept.get_document("data").ok()?.clone() })
}

fn bad(what: &str) -> StoreError {
    StoreError::Internal(format!("malformed event record: {what}"))
}

impl Logged {
    pub(crate) fn from_record(rec: Record) -> Result<Self, StoreError> {
        let seq = rec.get_i64(LOG_SEQ).ok().and_then(|s| u64::try_from(s).ok()).ok_or_else(|| bad("seq"))?;
        let logged_at = rec.get_datetime("logged_at").ok().copied();
        if rec.get_bool(LOG_VOID).unwrap_or(false) {
            return Ok(Self { seq, logged_at, entry: Entry::Void });
        }
        let text = |k: &str| rec.get_str(k).ok().map(str::to_owned);
        let kind = rec.get_str("type").ok().and_then(EventType::parse).ok_or_else(|| bad("type"))?;
        let members = match rec.get_array("members") {
            Ok(list) => Some(
                list.iter()
                    .filter_map(Bson::as_document)
                    .map(|m| EventMember {
                        collection: m.get_str("collection").unwrap_or_default().to_owned(),
                        id: m.get_str("id").unwrap_or_default().to_owned(),
                        op: m.get_str("op").unwrap_or_default().to_owned(),
                        version: m.get_i64("version").unwrap_or_default(),
                    })
                    .collect(),
            ),
            Err(_) => None,
        };
        let event = Event {
            id: text("_id").ok_or_else(|| bad("_id"))?,
            seq,
            kind,
            collection: text("collection"),
            document: text("document"),
            version: rec.get_i64("version").ok(),
            transaction: text("transaction"),
            key: text("key"),
            actor: rec.get_document("actor").ok().map(|a| {
                UserId::new(a.get_str("issuer").unwrap_or_default(), a.get_str("subject").unwrap_or_default())
            }),
            at: rec.get_datetime("at").map(|d| crate::clock::rfc3339(*d)).unwrap_or_default(),
            data: rec.get_document("data").ok().map(crate::store::convert::document_to_object),
            members,
            left: None,
            before: (format(&rec) == 2)
                .then(|| rec.get_document("before").ok().and_then(before))
                .flatten()
                .map(Arc::new),
        };
        Ok(Self { seq, logged_at, entry: Entry::Event(Box::new(event)) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_document_event_reads_back() {
        let d = StoredDoc::new_live("a".into(), doc! {"x": 1_i64}, 1, 3, DateTime::from_millis(5));
        let mut rec = document_event(EventType::Updated, "c", &d, Some("T"), None, None, DateTime::from_millis(7));
        rec.insert(LOG_SEQ, 9_i64);
        let logged = Logged::from_record(rec).unwrap();
        let Entry::Event(e) = logged.entry else { panic!("an event") };
        assert_eq!(e.id, "c/a/3");
        assert_eq!(e.seq, 9);
        assert_eq!(e.kind, EventType::Updated);
        assert_eq!(e.transaction.as_deref(), Some("T"));
        assert_eq!(e.data.unwrap()["x"], serde_json::json!(1));
        let json = serde_json::to_value(EventType::TransactionCommitted).unwrap();
        assert_eq!(json, "transaction.committed");
    }

    #[test]
    fn an_event_keeps_the_named_fields_of_a_live_document_before_it_and_reads_them_back() {
        let named: BTreeSet<String> = ["owner".to_owned(), "team".to_owned()].into();
        let before =
            StoredDoc::new_live("a".into(), doc! {"owner": "ada", "qty": 1_i64}, 1, 3, DateTime::from_millis(5));
        let after =
            StoredDoc::new_live("a".into(), doc! {"owner": "bob", "qty": 1_i64}, 1, 4, DateTime::from_millis(6));
        let mut rec = document_event(EventType::Updated, "c", &after, None, None, None, DateTime::from_millis(7));
        keep_before(&mut rec, &named, &before);
        assert_eq!(rec.get_i32("v").unwrap(), FORMAT);
        rec.insert(LOG_SEQ, 9_i64);
        let Entry::Event(e) = Logged::from_record(rec.clone()).unwrap().entry else { panic!("an event") };
        let kept = e.before.expect("kept");
        // `team` was named and absent: absent before.
        assert_eq!(kept.covering(["owner", "team"].into_iter()), Some(&doc! {"owner": "ada"}));
        assert_eq!(kept.covering(["owner", "qty"].into_iter()), None, "qty was not kept");
        // Format 1 (no `v`) keeps nothing, whatever the record holds.
        rec.remove("v");
        let Entry::Event(e) = Logged::from_record(rec).unwrap().entry else { panic!("an event") };
        assert!(e.before.is_none());
        // Nothing before a create (over nothing or a tombstone).
        let mut gone = before.clone();
        gone.meta.deleted = true;
        let mut rec = document_event(EventType::Created, "c", &after, None, None, None, DateTime::from_millis(7));
        keep_before(&mut rec, &named, &gone);
        assert!(rec.get("before").is_none());
    }

    /// An event's record built directly is what serde writes of its shape,
    /// field for field and in its order, with and without every optional
    /// part.
    #[test]
    fn an_event_record_is_written_as_serde_writes_it() {
        let data = doc! {"x": 1_i64, "y": {"z": [1.5, "w", Bson::Null]}, "when": DateTime::from_millis(3)};
        let user = UserId::new("https://issuer.example", "sub-1");
        let members = || {
            vec![
                CommittedMember { collection: "a", id: "1", op: StagedOp::Update, version: 4 },
                CommittedMember { collection: "b", id: "2", op: StagedOp::Delete, version: 9 },
            ]
        };
        let mut cases = 0;
        for mask in 0..128u32 {
            let bit = |i: u32| mask & (1 << i) != 0;
            let event = shapes::Event {
                id: "c/a/3".into(),
                v: FORMAT,
                kind: if bit(0) { "document.updated" } else { "transaction.committed" },
                collection: bit(1).then_some("c"),
                document: bit(2).then_some("a"),
                version: bit(2).then_some(3),
                transaction: bit(3).then_some("T"),
                key: bit(4).then_some("ops"),
                actor: bit(5).then_some(&user),
                at: DateTime::from_millis(1_700_000_000_007),
                data: bit(6).then_some(&data),
                members: bit(0).then(members),
            };
            let by_serde = crate::store::shape::fields(&event);
            let built = event.record();
            crate::store::assert_written_as_serde(&built, &by_serde);
            cases += 1;
        }
        assert_eq!(cases, 128);
    }

    #[test]
    fn a_deleted_event_has_no_data() {
        let d = StoredDoc::new_live("a".into(), doc! {"x": 1_i64}, 1, 3, DateTime::from_millis(5));
        let rec = document_event(EventType::Deleted, "c", &d, None, None, None, DateTime::from_millis(7));
        assert!(rec.get("data").is_none());
    }
}

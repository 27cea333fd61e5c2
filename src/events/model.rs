//! Change events as stored in the log and as clients see them (docs/design.md §5).

use crate::actor::UserId;
use serde::Serialize;

use crate::document::{StagedOp, StoredDoc};
use crate::store::shape::fields;
use crate::store::{Bson, DateTime, LOG_SEQ, LOG_VOID, Record, StoreError, doc};

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
}

impl EventType {
    pub const ALL: [EventType; 5] = [
        EventType::Created,
        EventType::Updated,
        EventType::Deleted,
        EventType::Expired,
        EventType::TransactionCommitted,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Created => "document.created",
            EventType::Updated => "document.updated",
            EventType::Deleted => "document.deleted",
            EventType::Expired => "document.expired",
            EventType::TransactionCommitted => "transaction.committed",
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
    /// `transaction.committed` event.
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
    /// `document.updated` only).
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
    fields(&event)
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
    fields(&event)
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

    use crate::store::{DateTime, Document};

    /// An event (its position is the store's to give).
    #[derive(Serialize)]
    pub(super) struct Event<'a> {
        #[serde(rename = "_id")]
        pub id: String,
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
    fn a_deleted_event_has_no_data() {
        let d = StoredDoc::new_live("a".into(), doc! {"x": 1_i64}, 1, 3, DateTime::from_millis(5));
        let rec = document_event(EventType::Deleted, "c", &d, None, None, None, DateTime::from_millis(7));
        assert!(rec.get("data").is_none());
    }
}

//! The stored shape of a user document — user fields at top level, the
//! gateway's metadata in `_meta` — and what a reader may see of it; the
//! rules for names and changes ([`rules`]). Single-document reads and
//! writes are [`crate::documents`]'.

pub(crate) mod names;
pub(crate) mod rules;

use serde::{Deserialize, Serialize};

use crate::store::shape::{Lt, fields};
use crate::store::{Bson, DateTime, Document, Record, StoreError, Update};

/// What a transaction staged on a document it holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StagedOp {
    Insert,
    Update,
    Replace,
    Delete,
    Check,
}

impl StagedOp {
    /// The operation as stored (a scan's equality value).
    pub fn to_bson(self) -> Bson {
        Bson::String(self.as_str().to_owned())
    }

    /// The operation's name as stored (serde's `snake_case`).
    pub fn as_str(self) -> &'static str {
        match self {
            StagedOp::Insert => "insert",
            StagedOp::Update => "update",
            StagedOp::Replace => "replace",
            StagedOp::Delete => "delete",
            StagedOp::Check => "check",
        }
    }
}

impl Staged {
    /// As stored: what serde writes, built directly.
    fn to_document(&self) -> Document {
        let mut staged = Document::new();
        staged.insert("op", self.op.to_bson());
        staged.insert("data", self.data.clone().map_or(Bson::Null, Bson::Document));
        staged.insert("sv", self.sv);
        staged
    }
}

/// A transaction's staged post-image, never visible until it commits.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Staged {
    pub op: StagedOp,
    /// The user fields after the change (`None` for delete and check).
    #[serde(default)]
    pub data: Option<Document>,
    pub sv: i64,
}

/// `_meta`: version, lock and tombstone state.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Meta {
    pub v: i64,
    #[serde(default = "one")]
    pub sv: i64,
    #[serde(default)]
    pub txn: Option<String>,
    #[serde(default)]
    pub pending: Option<Staged>,
    #[serde(default)]
    pub deleted: bool,
    #[serde(default)]
    pub deleting: bool,
    #[serde(default)]
    pub created_at: Option<DateTime>,
    #[serde(default)]
    pub updated_at: Option<DateTime>,
    #[serde(default)]
    pub deleted_at: Option<DateTime>,
    /// The change event of the single-document write that left the
    /// document as it is, until it is in the event log (docs/design.md §2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outbox: Option<Document>,
}

fn one() -> i64 {
    1
}

impl Meta {
    /// `_meta` as stored. The shapes this release writes are read field by
    /// field (every read of a document passes here); anything else goes
    /// through serde, which reads it the same way or says what is wrong.
    pub fn from_document(meta: Document) -> Result<Self, mongodb::bson::de::Error> {
        match Self::plain(&meta) {
            Some(m) => Ok(m),
            None => mongodb::bson::from_document(meta),
        }
    }

    /// `_meta` as stored: the fields serde writes, in its order (`None` as
    /// null, `outbox` only when there is one), built directly, for every
    /// write of a document builds one.
    pub fn to_document(&self) -> Document {
        let date = |d: Option<DateTime>| d.map_or(Bson::Null, Bson::DateTime);
        let mut meta = Document::new();
        meta.insert("v", self.v);
        meta.insert("sv", self.sv);
        meta.insert("txn", self.txn.clone().map_or(Bson::Null, Bson::String));
        meta.insert("pending", self.pending.as_ref().map_or(Bson::Null, |p| Bson::Document(p.to_document())));
        meta.insert("deleted", self.deleted);
        meta.insert("deleting", self.deleting);
        meta.insert("created_at", date(self.created_at));
        meta.insert("updated_at", date(self.updated_at));
        meta.insert("deleted_at", date(self.deleted_at));
        if let Some(outbox) = &self.outbox {
            meta.insert("outbox", outbox.clone());
        }
        meta
    }

    /// `meta` read directly, or `None` when it holds something only serde
    /// reads (a staged change) or refuses.
    fn plain(meta: &Document) -> Option<Self> {
        let int = |b: &Bson| match b {
            Bson::Int64(i) => Some(*i),
            Bson::Int32(i) => Some(i64::from(*i)),
            _ => None,
        };
        let mut m = Meta {
            v: 0,
            sv: 1,
            txn: None,
            pending: None,
            deleted: false,
            deleting: false,
            created_at: None,
            updated_at: None,
            deleted_at: None,
            outbox: None,
        };
        let mut v = None;
        for (key, value) in meta {
            match (key.as_str(), value) {
                ("v", b) => v = Some(int(b)?),
                ("sv", b) => m.sv = int(b)?,
                ("txn", Bson::String(t)) => m.txn = Some(t.clone()),
                ("deleted", Bson::Boolean(b)) => m.deleted = *b,
                ("deleting", Bson::Boolean(b)) => m.deleting = *b,
                ("created_at", Bson::DateTime(d)) => m.created_at = Some(*d),
                ("updated_at", Bson::DateTime(d)) => m.updated_at = Some(*d),
                ("deleted_at", Bson::DateTime(d)) => m.deleted_at = Some(*d),
                ("outbox", Bson::Document(d)) => m.outbox = Some(d.clone()),
                ("txn" | "pending" | "created_at" | "updated_at" | "deleted_at" | "outbox", Bson::Null) => {}
                // A staged change, or a type serde must judge.
                (
                    "pending" | "txn" | "deleted" | "deleting" | "created_at" | "updated_at" | "deleted_at" | "outbox",
                    _,
                ) => {
                    return None;
                }
                // A field this release does not know: ignored, as serde does.
                _ => {}
            }
        }
        m.v = v?;
        Some(m)
    }
}

/// A user document as stored.
#[derive(Clone, Debug, PartialEq)]
pub struct StoredDoc {
    pub id: String,
    pub data: Document,
    pub meta: Meta,
}

/// What a reader sees of a document: its last committed state.
#[derive(Clone, Debug, PartialEq)]
pub enum View {
    /// Never existed (or only as an uncommitted insert).
    NotFound,
    /// A tombstone.
    Deleted {
        version: i64,
        deleted_at: Option<DateTime>,
    },
    Live(Live),
}

#[derive(Clone, Debug, PartialEq)]
pub struct Live {
    pub id: String,
    pub version: i64,
    pub schema_version: i64,
    pub created_at: DateTime,
    pub updated_at: DateTime,
    pub data: Document,
}

impl Live {
    /// The user fields as JSON.
    pub fn data_json(&self) -> serde_json::Map<String, serde_json::Value> {
        crate::store::convert::document_to_object(&self.data)
    }
}

/// A document read as stored, not built: what a page read along an index
/// shows of a record whose committed state needs no transaction looked
/// at. Its data is the record's fields other than [`Self::NOT_DATA`],
/// written out straight from the bytes.
#[derive(Clone, Debug)]
pub(crate) struct StoredLive {
    pub id: String,
    pub version: i64,
    pub schema_version: i64,
    pub created_at: DateTime,
    pub updated_at: DateTime,
    pub record: mongodb::bson::RawDocumentBuf,
}

/// A document as a page shows it: built, or as stored (written out
/// without being built).
#[derive(Debug)]
pub(crate) enum PageItem {
    Built(Live),
    Stored(StoredLive),
}

impl PageItem {
    /// The document built.
    pub(crate) fn into_live(self) -> Result<Live, StoreError> {
        match self {
            PageItem::Built(live) => Ok(live),
            PageItem::Stored(stored) => stored.into_live(),
        }
    }

    pub(crate) fn id(&self) -> &str {
        match self {
            PageItem::Built(live) => &live.id,
            PageItem::Stored(stored) => &stored.id,
        }
    }
}

/// What [`StoredLive::view`] makes of a record as stored.
#[derive(Debug)]
pub(crate) enum StoredView {
    /// Live, and held by no transaction.
    Live(StoredLive),
    /// Not shown: a tombstone, or an insert never committed.
    Hidden,
    /// Held by a transaction, or not in the usual shape: the record, to
    /// be read built ([`StoredDoc::from_record`]), whose view decides.
    Built(mongodb::bson::RawDocumentBuf),
}

impl StoredLive {
    /// The record's top-level fields that are not the user's data.
    pub(crate) const NOT_DATA: [&'static str; 2] = ["_id", "_meta"];

    /// The committed view of `record` (as [`StoredDoc::into_committed_view`]
    /// shows it) where it needs neither a transaction nor a decode: a
    /// record no transaction holds, `_meta` in the shape this gateway
    /// writes. Anything else is [`StoredView::Built`].
    pub(crate) fn view(record: mongodb::bson::RawDocumentBuf) -> StoredView {
        let Some((id, envelope)) = Self::envelope(&record) else { return StoredView::Built(record) };
        match envelope {
            None => StoredView::Hidden,
            Some((version, schema_version, created_at, updated_at)) => {
                StoredView::Live(StoredLive { id, version, schema_version, created_at, updated_at, record })
            }
        }
    }

    /// The id of `record` and, unless it is hidden (`None`), its version,
    /// schema version and timestamps; `None` for a record to read built.
    #[allow(clippy::type_complexity)]
    fn envelope(record: &mongodb::bson::RawDocument) -> Option<(String, Option<(i64, i64, DateTime, DateTime)>)> {
        use mongodb::bson::RawBsonRef as R;
        let (id, meta) = match (record.get("_id"), record.get("_meta")) {
            (Ok(Some(R::String(id))), Ok(Some(R::Document(meta)))) => (id.to_owned(), meta),
            _ => return None,
        };
        let (mut v, mut sv, mut deleted) = (None, 1, false);
        let (mut created_at, mut updated_at) = (None, None);
        for element in meta {
            let (key, value) = element.ok()?;
            match (key, value) {
                ("v", R::Int64(n)) => v = Some(n),
                ("v", R::Int32(n)) => v = Some(i64::from(n)),
                ("sv", R::Int64(n)) => sv = n,
                ("sv", R::Int32(n)) => sv = i64::from(n),
                ("deleted", R::Boolean(b)) => deleted = b,
                ("created_at", R::DateTime(at)) => created_at = Some(at),
                ("updated_at", R::DateTime(at)) => updated_at = Some(at),
                ("txn" | "pending" | "created_at" | "updated_at" | "deleted_at" | "outbox", R::Null) => {}
                // A holder (its transaction decides what is shown).
                ("txn" | "pending", _) => return None,
                // What a view of the record does not read.
                ("deleting" | "deleted_at" | "outbox", _) => {}
                _ => return None,
            }
        }
        let version = v?;
        if version == 0 || deleted {
            return Some((id, None));
        }
        let updated_at = updated_at.unwrap_or_else(|| DateTime::from_millis(0));
        Some((id, Some((version, sv, created_at.unwrap_or(updated_at), updated_at))))
    }

    /// The document built (its data decoded).
    pub(crate) fn into_live(self) -> Result<Live, StoreError> {
        let mut data = crate::store::convert::decode(self.record.as_bytes())
            .map_err(|e| StoreError::Undecodable(format!("{}: {e}", self.id)))?;
        for field in Self::NOT_DATA {
            data.remove(field);
        }
        Ok(Live {
            id: self.id,
            version: self.version,
            schema_version: self.schema_version,
            created_at: self.created_at,
            updated_at: self.updated_at,
            data,
        })
    }
}

/// The fields the filters of a stored document match, as stored.
mod shapes {
    use serde::Serialize;

    use crate::store::DateTime;
    use crate::store::shape::Lt;

    /// Held by `txn` (none: free) at version `v` (built directly by
    /// `unchanged_filter`; this is what its test holds it to).
    #[cfg(test)]
    #[derive(Serialize)]
    pub(super) struct Unchanged<'a> {
        #[serde(rename = "_meta.txn")]
        pub txn: Option<&'a str>,
        #[serde(rename = "_meta.v")]
        pub v: i64,
    }

    /// At version `v`, with the outbox of event `event`.
    #[derive(Serialize)]
    pub(super) struct WithOutbox<'a> {
        #[serde(rename = "_meta.v")]
        pub v: i64,
        #[serde(rename = "_meta.outbox._id")]
        pub event: &'a str,
    }

    /// A tombstone deleted before a cutoff, free, without an outbox.
    #[derive(Serialize)]
    pub(super) struct Purgeable {
        #[serde(rename = "_meta.deleted")]
        pub deleted: bool,
        #[serde(rename = "_meta.deleted_at")]
        pub deleted_at: Lt<DateTime>,
        #[serde(rename = "_meta.txn")]
        pub txn: Option<&'static str>,
        #[serde(rename = "_meta.outbox")]
        pub outbox: Option<&'static str>,
    }
}

impl StoredDoc {
    /// A new, committed, unlocked document at `version`.
    pub fn new_live(id: String, data: Document, sv: i64, version: i64, at: DateTime) -> Self {
        Self {
            id,
            data,
            meta: Meta {
                v: version,
                sv,
                txn: None,
                pending: None,
                deleted: false,
                deleting: false,
                created_at: Some(at),
                updated_at: Some(at),
                deleted_at: None,
                outbox: None,
            },
        }
    }

    /// The compare-and-set filter of a change computed from this document
    /// as read: it still holds no lock (`holder: None`) or still the lock of
    /// `holder`, and is still at the version read. Every write to a user
    /// document goes through it, so no change is made over one it did not
    /// see (the version pin is what keeps mixed writers from losing updates).
    pub fn unchanged_filter(&self, holder: Option<&str>) -> Document {
        // As serde writes `shapes::Unchanged`, built directly: every write
        // of a document builds one.
        let mut filter = Document::new();
        filter.insert("_meta.txn", holder.map_or(Bson::Null, |h| Bson::String(h.to_owned())));
        filter.insert("_meta.v", self.meta.v);
        filter
    }

    /// The filter of a document still at version `v` with the outbox of
    /// event `event`.
    pub fn outbox_filter(v: i64, event: &str) -> Document {
        fields(&shapes::WithOutbox { v, event })
    }

    /// Clear a document's outbox (its event is in the log).
    pub fn clear_outbox() -> Update {
        Update { set: Document::new(), unset: vec!["_meta.outbox".into()] }
    }

    /// The filter of a tombstone deleted before `cutoff`, neither locked
    /// nor holding an outbox: one the purge may remove.
    pub fn purgeable_tombstone(cutoff: DateTime) -> Document {
        fields(&shapes::Purgeable { deleted: true, deleted_at: Lt(cutoff), txn: None, outbox: None })
    }

    /// The document a record read as stored holds (see
    /// [`Self::from_record`]): [`StoreError::Undecodable`] when it is not
    /// BSON the store can decode, or not of a document's shape.
    pub(crate) fn from_raw(record: &mongodb::bson::RawDocument) -> Result<Self, StoreError> {
        crate::store::convert::decode(record.as_bytes())
            .map_err(|e| StoreError::Undecodable(e.0))
            .and_then(Self::from_record)
    }

    /// The document `record` holds; a record of another shape (an `_id`
    /// that is not a string, an `_meta` missing or not as written here,
    /// as another tool could leave) is [`StoreError::Undecodable`]: reads
    /// of many skip and report it, a read of it alone is a problem.
    pub fn from_record(mut record: Record) -> Result<Self, StoreError> {
        let id = match record.remove("_id") {
            Some(Bson::String(id)) => id,
            other => return Err(StoreError::Undecodable(format!("document with non-string _id {other:?}"))),
        };
        let meta = match record.remove("_meta") {
            Some(Bson::Document(meta)) => Meta::from_document(meta)
                .map_err(|e| StoreError::Undecodable(format!("document {id}: bad _meta: {e}")))?,
            _ => return Err(StoreError::Undecodable(format!("document {id} has no _meta"))),
        };
        Ok(Self { id, data: record, meta })
    }

    pub fn to_record(&self) -> Record {
        let mut record = Document::new();
        record.insert("_id", self.id.clone());
        for (k, v) in &self.data {
            record.insert(k.clone(), v.clone());
        }
        record.insert("_meta", self.meta.to_document());
        record
    }

    /// The committed view when it is not live (never created, or a
    /// tombstone), judged without copying the document; `None` when live.
    pub fn absent_view(&self) -> Option<View> {
        if self.meta.v == 0 {
            Some(View::NotFound)
        } else if self.meta.deleted {
            Some(View::Deleted { version: self.meta.v, deleted_at: self.meta.deleted_at })
        } else {
            None
        }
    }

    /// The committed state, ignoring whatever is staged.
    pub fn committed_view(&self) -> View {
        self.clone().into_committed_view()
    }

    /// [`Self::committed_view`] of a document no longer needed (its data
    /// moves into the view instead of being copied).
    pub fn into_committed_view(self) -> View {
        if let Some(absent) = self.absent_view() {
            absent
        } else {
            let at = self.meta.updated_at.unwrap_or_else(|| DateTime::from_millis(0));
            View::Live(Live {
                id: self.id,
                version: self.meta.v,
                schema_version: self.meta.sv,
                created_at: self.meta.created_at.unwrap_or(at),
                updated_at: at,
                data: self.data,
            })
        }
    }

    /// The document once its holder's staged change is applied at `at`:
    /// version `base_v + 1` (unchanged for check), lock cleared, a delete
    /// leaving a tombstone.
    pub fn rolled_forward(&self, at: DateTime) -> StoredDoc {
        let mut next = self.clone();
        next.meta.txn = None;
        next.meta.deleting = false;
        let Some(staged) = next.meta.pending.take() else { return next };
        match staged.op {
            StagedOp::Check => {}
            StagedOp::Delete => {
                next.data = Document::new();
                next.meta.v += 1;
                next.meta.deleted = true;
                next.meta.deleted_at = Some(at);
                next.meta.updated_at = Some(at);
            }
            StagedOp::Insert | StagedOp::Update | StagedOp::Replace => {
                let recreated = next.meta.v == 0 || next.meta.deleted;
                next.data = staged.data.unwrap_or_default();
                next.meta.v += 1;
                next.meta.sv = staged.sv;
                next.meta.deleted = false;
                next.meta.deleted_at = None;
                next.meta.updated_at = Some(at);
                if recreated || next.meta.created_at.is_none() {
                    next.meta.created_at = Some(at);
                }
            }
        }
        next
    }

    /// The document with its holder's lock and staged change dropped; `None`
    /// when it was only a placeholder for an insert (it is removed).
    pub fn rolled_back(&self) -> Option<StoredDoc> {
        if self.meta.v == 0 {
            return None;
        }
        let mut next = self.clone();
        next.meta.txn = None;
        next.meta.pending = None;
        next.meta.deleting = false;
        Some(next)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn meta_is_read_as_serde_reads_it() {
        use mongodb::bson::doc;
        let at = DateTime::from_millis(1_700_000_000_123);
        let outbox = doc! {"seq": 0_i64, "type": "document.created"};
        let cases = [
            doc! {"v": 1_i64},
            doc! {"v": 3_i32, "sv": 2_i32, "deleted": false, "deleting": false, "created_at": at, "updated_at": at},
            doc! {"v": 4_i64, "sv": 1_i64, "txn": "t1", "deleted": true, "deleted_at": at, "outbox": outbox.clone()},
            doc! {"v": 2_i64, "txn": Bson::Null, "pending": Bson::Null, "outbox": Bson::Null, "created_at": Bson::Null},
            doc! {"v": 2_i64, "txn": "t2", "pending": {"op": "update", "data": {"a": 1}, "sv": 1_i64}},
            doc! {"v": 5_i64, "later": "a field a newer release wrote"},
            doc! {"v": 2.0},
            doc! {"sv": 1_i64},
            doc! {"v": 1_i64, "deleted": "yes"},
            doc! {"v": 1_i64, "created_at": "2026-01-01"},
            doc! {"v": 1_i64, "sv": Bson::Null},
        ];
        for meta in cases {
            let by_serde: Result<Meta, _> = mongodb::bson::from_document(meta.clone());
            let read = Meta::from_document(meta.clone());
            match (by_serde, read) {
                (Ok(a), Ok(b)) => assert_eq!(a, b, "{meta}"),
                (Err(_), Err(_)) => {}
                (a, b) => panic!("{meta}: serde {a:?}, read {b:?}"),
            }
        }
        assert!(
            Meta::plain(&doc! {"v": 1_i64, "pending": {"op": "delete", "sv": 1_i64}}).is_none(),
            "serde reads a staged change"
        );
    }

    /// A record read as stored shows what the built record shows, or is
    /// left to the built read (held, or in a shape it does not read).
    #[test]
    fn a_record_as_stored_shows_its_committed_view() {
        use mongodb::bson::{RawDocumentBuf, doc};
        let at = DateTime::from_millis(1_700_000_000_123);
        let metas = [
            doc! {"v": 1_i64},
            doc! {"v": 3_i32, "sv": 2_i32, "deleted": false, "deleting": false, "created_at": at, "updated_at": at},
            doc! {"v": 4_i64, "sv": 1_i64, "deleted": true, "deleted_at": at, "outbox": {"seq": 0_i64}},
            doc! {"v": 2_i64, "txn": Bson::Null, "pending": Bson::Null, "outbox": Bson::Null, "created_at": Bson::Null},
            doc! {"v": 2_i64, "updated_at": at, "outbox": {"seq": 3_i64, "type": "document.updated"}},
            doc! {"v": 0_i64, "txn": Bson::Null},
            doc! {"v": 2_i64, "txn": "t2", "pending": {"op": "update", "data": {"a": 1}, "sv": 1_i64}},
            doc! {"v": 5_i64, "later": "a field a newer release wrote"},
            doc! {"v": 2.0},
            doc! {"sv": 1_i64},
            doc! {"v": 1_i64, "deleted": "yes"},
            doc! {"v": 1_i64, "sv": Bson::Null},
        ];
        let mut seen = [0; 3];
        for meta in metas {
            let record = doc! {"_id": "a", "x": 1_i64, "_meta": meta.clone(), "y": {"z": "w"}};
            let built = StoredDoc::from_record(record.clone()).map(StoredDoc::into_committed_view);
            match StoredLive::view(RawDocumentBuf::from_document(&record).unwrap()) {
                StoredView::Live(live) => {
                    seen[0] += 1;
                    let live = live.into_live().unwrap();
                    assert_eq!(built.unwrap(), View::Live(live), "{meta}");
                }
                StoredView::Hidden => {
                    seen[1] += 1;
                    assert!(matches!(built.unwrap(), View::NotFound | View::Deleted { .. }), "{meta}");
                }
                StoredView::Built(raw) => {
                    seen[2] += 1;
                    assert_eq!(raw.to_document().unwrap(), record, "{meta}");
                    let held = meta.get("txn").is_some_and(|t| t != &Bson::Null);
                    assert!(
                        held || mongodb::bson::from_document::<Meta>(meta.clone()).is_err()
                            || meta.contains_key("later"),
                        "{meta}"
                    );
                }
            }
        }
        assert_eq!(seen, [4, 2, 6]);
    }

    /// The compare-and-set filter built directly is what serde writes of
    /// its shape.
    #[test]
    fn the_unchanged_filter_is_written_as_serde_writes_it() {
        let d = StoredDoc::new_live("a".into(), doc! {"x": 1_i64}, 1, 7, DateTime::from_millis(1));
        for holder in [None, Some("t1")] {
            let by_serde = fields(&shapes::Unchanged { txn: holder, v: 7 });
            let built = d.unchanged_filter(holder);
            crate::store::assert_written_as_serde(&built, &by_serde);
        }
    }

    /// `_meta` built directly is what serde writes, field for field and in
    /// its order, for every combination of the fields that may be absent.
    #[test]
    fn meta_is_written_as_serde_writes_it() {
        let at = DateTime::from_millis(1_700_000_000_123);
        let stages = [
            None,
            Some(Staged { op: StagedOp::Update, data: Some(doc! {"a": 1_i64, "b": {"c": [1, "x"]}}), sv: 2 }),
            Some(Staged { op: StagedOp::Delete, data: None, sv: 1 }),
            Some(Staged { op: StagedOp::Check, data: None, sv: 3 }),
        ];
        let mut cases = 0;
        for mask in 0..64u32 {
            for pending in &stages {
                let bit = |i: u32| mask & (1 << i) != 0;
                let meta = Meta {
                    v: i64::from(mask) + 1,
                    sv: if bit(0) { 7 } else { 1 },
                    txn: bit(1).then(|| "t1".to_owned()),
                    pending: pending.clone(),
                    deleted: bit(2),
                    deleting: bit(3),
                    created_at: bit(4).then_some(at),
                    updated_at: bit(5).then_some(at),
                    deleted_at: bit(2).then_some(at),
                    outbox: bit(3).then(|| doc! {"_id": "c/a/1", "type": "document.updated", "at": at}),
                };
                let by_serde = mongodb::bson::to_document(&meta).unwrap();
                let built = meta.to_document();
                crate::store::assert_written_as_serde(&built, &by_serde);
                assert_eq!(Meta::from_document(built).unwrap(), meta);
                cases += 1;
            }
        }
        assert_eq!(cases, 256);
        for op in [StagedOp::Insert, StagedOp::Update, StagedOp::Replace, StagedOp::Delete, StagedOp::Check] {
            assert_eq!(op.to_bson(), mongodb::bson::to_bson(&op).unwrap());
        }
    }

    use super::*;
    use crate::store::doc;

    fn at(ms: i64) -> DateTime {
        DateTime::from_millis(ms)
    }

    #[test]
    fn record_round_trip_keeps_fields_and_meta() {
        let d = StoredDoc::new_live("a".into(), doc! {"x": 1_i64}, 2, 5, at(10));
        let rec = d.to_record();
        assert_eq!(rec.get_document("_meta").unwrap().get("txn"), Some(&Bson::Null));
        assert_eq!(StoredDoc::from_record(rec).unwrap(), d);
    }

    #[test]
    fn roll_forward_of_insert_placeholder_and_delete() {
        let mut ph = StoredDoc::new_live("a".into(), Document::new(), 1, 0, at(1));
        ph.meta.txn = Some("T".into());
        ph.meta.pending = Some(Staged { op: StagedOp::Insert, data: Some(doc! {"x": 1_i64}), sv: 1 });
        assert_eq!(ph.committed_view(), View::NotFound);
        let done = ph.rolled_forward(at(2));
        assert_eq!(done.meta.v, 1);
        assert_eq!(done.meta.txn, None);
        assert!(matches!(done.committed_view(), View::Live(l) if l.version == 1 && l.data == doc!{"x": 1_i64}));
        assert_eq!(ph.rolled_back(), None);

        let mut locked = done.clone();
        locked.meta.txn = Some("U".into());
        locked.meta.deleting = true;
        locked.meta.pending = Some(Staged { op: StagedOp::Delete, data: None, sv: 1 });
        let tomb = locked.rolled_forward(at(3));
        assert_eq!(tomb.committed_view(), View::Deleted { version: 2, deleted_at: Some(at(3)) });
        assert!(tomb.data.is_empty());
        assert_eq!(locked.rolled_back().unwrap(), done);
    }

    #[test]
    fn recreate_over_tombstone_continues_version() {
        let mut tomb = StoredDoc::new_live("a".into(), Document::new(), 1, 4, at(1));
        tomb.meta.deleted = true;
        tomb.meta.txn = Some("T".into());
        tomb.meta.pending = Some(Staged { op: StagedOp::Insert, data: Some(doc! {"y": true}), sv: 1 });
        let live = tomb.rolled_forward(at(9));
        assert_eq!(live.meta.v, 5);
        assert!(!live.meta.deleted);
        assert_eq!(live.meta.created_at, Some(at(9)));
    }
}

/// Where a read of documents is made, and how it shows a document a
/// transaction holds.
#[derive(Clone)]
pub(crate) enum ReadAt {
    /// The store as it is: a held document shows its holder's outcome as
    /// known now (a committed holder's change, rolled forward or not).
    Now,
    /// A snapshot of the store ([`crate::store::Store::snapshot`]) in
    /// which no holder's change is logged yet, as the caller has checked
    /// (docs/design.md §7): a held document shows its committed data, as
    /// it was before its holder.
    Pinned(crate::store::DynStore),
}

impl ReadAt {
    /// The store to read: the snapshot, or `now`.
    pub(crate) fn store<'a>(&'a self, now: &'a dyn crate::store::Store) -> &'a dyn crate::store::Store {
        match self {
            ReadAt::Now => now,
            ReadAt::Pinned(snapshot) => snapshot.as_ref(),
        }
    }
}

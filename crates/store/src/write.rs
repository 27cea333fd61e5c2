//! One conditional single-record write ([`Write`]), how durable it is
//! ([`Durability`]), and the unsynced writes of any store ([`Unsynced`]).

use mongodb::bson::{DateTime, Document, doc};

use crate::{Record, Store, StoreResult, record_id};

/// A partial update: `$set` of dotted paths and `$unset` of dotted paths.
#[derive(Clone, Debug, Default)]
pub struct Update {
    pub set: Document,
    pub unset: Vec<String>,
}

impl Update {
    pub fn set(set: Document) -> Self {
        Self { set, unset: Vec::new() }
    }
}

/// Whether a write must be on disk before it returns (docs/design.md §1,
/// "Durable where it matters").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Durability {
    /// Durable before the call returns, and visible to readers only once
    /// durable. Everything written before it is durable with it.
    Synced,
    /// Visible at once, in order; durable with the next synced write, or
    /// within the store's sync interval. A crash may lose a suffix of
    /// these writes, never a write before a synced one.
    Unsynced,
}

/// One conditional single-record write.
#[derive(Debug)]
pub enum Write<'a> {
    /// Insert-if-absent. `Ok(false)` when a record with that `_id` exists.
    Insert(Record),
    /// Replace record `id` (its `_id` is kept) if it matches `filter`.
    Replace { id: &'a str, filter: Document, record: Record },
    /// Apply `update` to record `id` if it matches `filter`.
    Update { id: &'a str, filter: Document, update: Update },
    /// Delete record `id` if it matches `filter`.
    Delete { id: &'a str, filter: Document },
    /// Insert-if-absent of `record` (by its `_id`) into log collection
    /// `coll`, at the next free position: the store sets its [`LOG_SEQ`]
    /// field, which the log's unique index on it keeps unique. `Ok(false)`
    /// when a record with that `_id` exists. The embedded store numbers
    /// appends in the order it applies them, so its positions never show a
    /// gap; on MongoDB a position is taken from a counter before the
    /// insert, so a later position may be visible before an earlier one,
    /// and one whose appender died stays empty: readers of the log wait
    /// for such a gap and close it for good with a void entry
    /// ([`void_entry`]) after a timeout, and an append that finds its
    /// position taken takes the next one.
    Append(Record),
}

/// The field of a log record holding its position.
pub const LOG_SEQ: &str = "seq";
/// The field marking a log record as a void entry: a position closed for
/// good with nothing in it.
pub const LOG_VOID: &str = "void";

/// The void entry closing position `seq` of a log, logged at `at`.
pub fn void_entry(seq: u64, at: DateTime) -> Record {
    doc! {"_id": format!("void/{seq}"), LOG_SEQ: i64::try_from(seq).unwrap_or(i64::MAX), LOG_VOID: true, "logged_at": at}
}

impl Write<'_> {
    /// The `_id` the write is about.
    pub fn id(&self) -> Option<&str> {
        match self {
            Write::Insert(record) | Write::Append(record) => record_id(record),
            Write::Replace { id, .. } | Write::Update { id, .. } | Write::Delete { id, .. } => Some(id),
        }
    }

    /// `insert`, `replace`, `update` or `delete`.
    pub fn kind(&self) -> WriteKind {
        match self {
            Write::Insert(_) => WriteKind::Insert,
            Write::Append(_) => WriteKind::Append,
            Write::Replace { .. } => WriteKind::Replace,
            Write::Update { .. } => WriteKind::Update,
            Write::Delete { .. } => WriteKind::Delete,
        }
    }
}

/// Which of the [`Write`]s a write is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WriteKind {
    Insert,
    Append,
    Replace,
    Update,
    Delete,
}

impl WriteKind {
    /// Its name, as operations are named to layers and in metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            WriteKind::Insert => "insert",
            WriteKind::Append => "append",
            WriteKind::Replace => "replace",
            WriteKind::Update => "update",
            WriteKind::Delete => "delete",
        }
    }
}

impl dyn Store {
    /// The same writes, [`Durability::Unsynced`]: for what no client is
    /// told and a synced write or recovery makes good (docs/design.md §1).
    pub fn unsynced(&self) -> Unsynced<'_> {
        Unsynced(self)
    }
}

/// Unsynced writes to a store (see [`Durability::Unsynced`]).
pub struct Unsynced<'a>(&'a dyn Store);

impl Unsynced<'_> {
    pub async fn insert(&self, coll: &str, record: Record) -> StoreResult<bool> {
        self.0.write(coll, Write::Insert(record), Durability::Unsynced).await
    }

    pub async fn replace(&self, coll: &str, id: &str, filter: Document, record: Record) -> StoreResult<bool> {
        self.0.write(coll, Write::Replace { id, filter, record }, Durability::Unsynced).await
    }

    pub async fn update(&self, coll: &str, id: &str, filter: Document, update: Update) -> StoreResult<bool> {
        self.0.write(coll, Write::Update { id, filter, update }, Durability::Unsynced).await
    }

    pub async fn delete(&self, coll: &str, id: &str, filter: Document) -> StoreResult<bool> {
        self.0.write(coll, Write::Delete { id, filter }, Durability::Unsynced).await
    }

    /// See [`Write::Append`].
    pub async fn append(&self, coll: &str, record: Record) -> StoreResult<bool> {
        self.0.write(coll, Write::Append(record), Durability::Unsynced).await
    }

    /// See [`Store::write_in_order`].
    pub async fn in_order(&self, writes: Vec<(&str, Write<'_>)>) -> StoreResult<usize> {
        self.0.write_in_order(writes, Durability::Unsynced).await
    }
}

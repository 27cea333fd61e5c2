//! Every scan the gateway makes, each declared against an index from
//! `migrations/`: the collection (`*`: every user collection, through the
//! index templates), the index, the fields it pins by equality and the
//! field it is ordered by. A scan can only be built from one of these
//! ([`ScanDecl::scan`]), and a test checks each against the indexes the
//! migrations create, so no scan reads a collection without an index: its
//! cost is the records it returns, not the records stored (on a server
//! that walks an index in order; DocumentDB sorts what the filter matches,
//! docs/limitations.md).

use super::{Bson, IndexQuery, Scan};

/// A declared scan: on `coll`, along index `index`, with equality on the
/// index's first fields (`eq`) and order by the field after them (`by`).
#[derive(Debug)]
pub struct ScanDecl {
    pub coll: &'static str,
    pub index: &'static str,
    pub eq: &'static [&'static str],
    pub by: &'static str,
}

/// The primary index every collection has: records by `_id`.
pub const PRIMARY: &str = "_id";
/// The collection name of declarations and templates that apply to every
/// user collection.
pub const USER: &str = "*";

impl ScanDecl {
    /// This scan, with the values of its equality fields (in order).
    pub fn scan(&'static self, eq: Vec<Bson>) -> Scan {
        Scan::new(self, eq)
    }

    /// This scan as an [`IndexQuery`] (for a read bounded by bytes as well
    /// as by count): of a declaration with one equality field, ordered by
    /// id, the records after id `after`.
    pub fn query(&'static self, eq: Bson, after: Option<&str>, limit: usize, budget: usize) -> IndexQuery {
        assert!(self.eq.len() == 1 && self.by == PRIMARY, "scan {} is not one value's records by id", self.index);
        IndexQuery {
            index: self.index.to_owned(),
            keys: vec![(self.eq[0].to_owned(), false), (PRIMARY.to_owned(), false)],
            eq: vec![eq],
            slot: None,
            reverse: false,
            // From the first string without `after` (see [`Scan::after`]).
            after: Some(vec![Bson::String(after.unwrap_or_default().to_owned())]),
            limit,
            budget,
        }
    }
}

macro_rules! scans {
    ($( $(#[$doc:meta])* $name:ident: $coll:literal . $index:literal, eq [$($eq:literal),*], by $by:literal; )*) => {
        $(
            $(#[$doc])*
            pub static $name: ScanDecl = ScanDecl { coll: $coll, index: $index, eq: &[$($eq),*], by: $by };
        )*
        /// Every declared scan (the gateway's tests check each against
        /// the indexes its migrations create).
        pub static ALL: &[&ScanDecl] = &[$(&$name),*];
    };
}

scans! {
    /// Transaction records by id (the API's listing).
    TXNS: "_txns"."_id", eq [], by "_id";
    /// Transaction records with one status, by id (listing; aborted ones
    /// for recovery).
    TXNS_BY_STATUS: "_txns"."status", eq ["status"], by "_id";
    /// Records with one status by lease end (pending ones past their lease).
    TXNS_BY_LEASE: "_txns"."status_expires", eq ["status"], by "expires_at";
    /// Records with one status by commit time (committed, unfinished).
    TXNS_BY_COMMIT: "_txns"."status_committed", eq ["status"], by "committed_at";
    /// Records with one status by finish time (purge).
    TXNS_BY_FINISH: "_txns"."status_finished", eq ["status"], by "finished_at";
    /// Idempotency claims by key (the bench's counts).
    IDEM: "_idem"."_id", eq [], by "_id";
    /// Idempotency claims by creation time (purge).
    IDEM_BY_AGE: "_idem"."created", eq [], by "created_at";
    /// Stream tickets by expiry (purge).
    TICKETS_BY_EXPIRY: "_tickets"."expires", eq [], by "expires_at";
    /// Deliveries by id (the API's listing).
    DELIVERIES: "_deliveries"."_id", eq [], by "_id";
    /// Deliveries with one status, by id (listing).
    DELIVERIES_BY_STATUS: "_deliveries"."status", eq ["status"], by "_id";
    /// Deliveries with one status by due time (the sender's scan).
    DELIVERIES_BY_DUE: "_deliveries"."status_next_id", eq ["status"], by "next_at";
    /// Deliveries with one status and due time, by id (those waiting for
    /// the hook before them).
    DELIVERIES_WAITING: "_deliveries"."status_next_id", eq ["status", "next_at"], by "_id";
    /// The deliveries of one key (a subscription's events of one
    /// document) by position: each goes once the one before it is final.
    DELIVERIES_BY_KEY: "_deliveries"."key_seq", eq ["key"], by "seq";
    /// Subscriptions by id (the API's listing; the dispatcher's pass).
    SUBSCRIPTIONS: "_subscriptions"."_id", eq [], by "_id";
    /// Deliveries with one status by finish time (purge).
    DELIVERIES_BY_FINISH: "_deliveries"."status_finished", eq ["status"], by "finished_at";
    /// User documents that are not tombstones, by id (listing).
    DOCS_LIVE: "*"."live", eq ["_meta.deleted"], by "_id";
    /// User documents with one staged operation, by id (listing: a
    /// tombstone a committed transaction re-creates).
    DOCS_STAGED: "*"."staged", eq ["_meta.pending.op"], by "_id";
    /// User documents by the transaction holding them (the lock sweep).
    DOCS_LOCKED: "*"."locked", eq [], by "_meta.txn";
    /// User documents with an event in their outbox, by its id (recovery
    /// publishes what a crash left there).
    DOCS_OUTBOX: "*"."outbox", eq [], by "_meta.outbox._id";
    /// Tombstones (or live documents) by deletion time (the tombstone
    /// purge).
    DOCS_BY_DELETION: "*"."deleted_at", eq ["_meta.deleted"], by "_meta.deleted_at";
    /// The event log in position order.
    EVENTS_BY_SEQ: "_events"."seq", eq [], by "seq";
    /// Live documents (or tombstones) by creation time: the TTL sweeper's
    /// scans, oldest first for a maximum age, newest first past the
    /// `max_count` newest for a maximum count.
    DOCS_BY_AGE: "*"."live_created", eq ["_meta.deleted"], by "_meta.created_at";
    /// Collections by name (the API's listing).
    COLLECTIONS: "_collections"."_id", eq [], by "_id";
    /// Index declarations of one collection, by key (the API's listing).
    INDEXES_BY_COLL: "_indexes"."coll", eq ["coll"], by "_id";
    /// Index declarations in one state, by key (the builder's pass).
    INDEXES_BY_STATE: "_indexes"."state", eq ["state"], by "_id";
    /// The reservations of one unique index (its drop).
    UNIQUE_BY_INDEX: "_unique"."index", eq ["index"], by "_id";
    /// Collections with schemas, by name (the violations pass).
    SCHEMAS: "_schemas"."_id", eq [], by "_id";
    /// Collections with a TTL policy, by name (the sweeper's pass).
    COLLECTIONS_EXPIRING: "_collections"."expiring", eq ["expiring"], by "_id";
}

/// Why `decl` is not served by an index among `indexes` (collection and
/// spec; `*` for templates), or `Ok` when it is. An index serves a scan
/// when the scan's equality fields are the index's first fields and its
/// order field is the next one; an `_id` order after equality fields must
/// be written in the index (MongoDB orders equal keys by record, not `_id`).
pub fn check(decl: &ScanDecl, indexes: &[(String, super::IndexSpec)]) -> Result<(), String> {
    let name = format!("{}.{}", decl.coll, decl.index);
    if decl.index == PRIMARY {
        return if decl.eq.is_empty() && decl.by == "_id" {
            Ok(())
        } else {
            Err(format!("{name}: the primary index serves only an _id order without equality"))
        };
    }
    let Some((_, spec)) = indexes.iter().find(|(c, s)| c == decl.coll && s.name == decl.index) else {
        return Err(format!("{name}: no such index in migrations/"));
    };
    let fields: Vec<&str> = spec.fields.iter().map(String::as_str).collect();
    let n = decl.eq.len();
    if fields.len() < n || fields[..n] != *decl.eq {
        return Err(format!("{name}: equality on {:?} is not a prefix of the index fields {fields:?}", decl.eq));
    }
    let next = fields.get(n).copied();
    match (next, decl.by) {
        (Some(field), by) if field == by => Ok(()),
        (None, "_id") if n == 0 => Ok(()),
        (None, "_id") => Err(format!("{name}: order by _id after equality needs _id written in the index")),
        (next, by) => Err(format!("{name}: ordered by {by}, but the index continues with {next:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scans_become_mongodb_queries() {
        let scan = DELIVERIES_BY_DUE
            .scan(vec![Bson::String("failed".into())])
            .to(crate::Bound::Included(Bson::Int64(5)))
            .desc();
        let (filter, sort) = scan.to_query();
        assert_eq!(filter, crate::doc! {"status": "failed", "next_at": {"$lte": 5_i64}});
        assert_eq!(sort, crate::doc! {"next_at": -1});
    }
}

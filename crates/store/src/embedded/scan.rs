//! Reads: the records they decode, and scans along the primary key or an
//! index.

use std::ops::Bound;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use super::{internal, keys};
use crate::{
    Bson, Edge, Found, IndexQuery, IndexSpec, Interval, Order, Record, Scan, StoreError, StoreResult, convert,
    report_unreadable,
};

thread_local! {
    /// The flag of the read this blocking thread runs: set when nobody
    /// waits for its answer any more.
    static ABANDONED: std::cell::RefCell<Option<Arc<AtomicBool>>> = const { std::cell::RefCell::new(None) };
}

pub(super) fn abandoned() -> StoreError {
    StoreError::Unavailable("the read was abandoned: nobody waits for it".into())
}

/// Run `f` on this thread as the read whose flag is `flag` (set once
/// nobody waits for its answer): [`check_abandoned`] looks at it.
pub(super) fn watched<T>(flag: Arc<AtomicBool>, f: impl FnOnce() -> T) -> T {
    ABANDONED.with(|a| *a.borrow_mut() = Some(flag));
    let out = f();
    ABANDONED.with(|a| a.borrow_mut().take());
    out
}

/// `Err` when the read this thread runs was abandoned: long reads (scans,
/// index walks) look every few records and stop, so a read the store's
/// deadline gave up on does not go on taking a core and memory.
pub(super) fn check_abandoned() -> StoreResult<()> {
    let gone = ABANDONED.with(|a| a.borrow().as_ref().is_some_and(|flag| flag.load(Ordering::Relaxed)));
    if gone { Err(abandoned()) } else { Ok(()) }
}

/// The records reads decoded, and those they could not decode.
#[derive(Debug, Default)]
pub struct Reads {
    pub(super) decoded: AtomicU64,
    pub(super) unreadable: AtomicU64,
    /// Of `decoded`, those queries ([`crate::Store::query`]) decoded.
    pub(super) queried: AtomicU64,
}

impl Reads {
    /// The record `coll`/`id` read by id: one that cannot be decoded is an
    /// error naming it.
    pub(super) fn get(&self, coll: &str, id: &str, bytes: &[u8]) -> StoreResult<Record> {
        self.decoded.fetch_add(1, Ordering::Relaxed);
        convert::decode(bytes).map_err(|e| {
            self.unreadable.fetch_add(1, Ordering::Relaxed);
            StoreError::Undecodable(format!("{coll}/{id}: {e}"))
        })
    }

    /// A record met by a pass over a collection, decoded; one that cannot
    /// be decoded is skipped and reported (`None`), as
    /// [`Self::scanned_into`] skips it.
    pub(super) fn decoded(&self, (coll, id, bytes): (&str, &str, &[u8])) -> Option<Record> {
        self.decoded.fetch_add(1, Ordering::Relaxed);
        match convert::decode(bytes) {
            Ok(record) => Some(record),
            Err(e) => {
                self.unreadable.fetch_add(1, Ordering::Relaxed);
                report_unreadable(&StoreError::Undecodable(format!("{coll}/{id}: {e}")));
                None
            }
        }
    }

    /// A record met by a read, as stored, once checked as a decode would
    /// check it ([`convert::check`]); one that fails is skipped and
    /// reported (`None`), as [`Self::scanned_into`] skips it.
    pub(super) fn checked(&self, (coll, id, bytes): (&str, &str, &[u8])) -> Option<mongodb::bson::RawDocumentBuf> {
        self.decoded.fetch_add(1, Ordering::Relaxed);
        match convert::check(bytes) {
            Ok(raw) => Some(raw.to_raw_document_buf()),
            Err(e) => {
                self.unreadable.fetch_add(1, Ordering::Relaxed);
                report_unreadable(&StoreError::Undecodable(format!("{coll}/{id}: {e}")));
                None
            }
        }
    }

    /// A record met by a read (of the top-level `fields` only, all when
    /// empty), taken into `found` as the next record of a read of at most `limit`
    /// records and `budget` bytes: whether the read goes on (see
    /// [`Found::take`]). One that cannot be decoded is skipped and
    /// reported, so no pass over a collection stops at it.
    pub(super) fn scanned_into(
        &self,
        (coll, id, bytes): (&str, &str, &[u8]),
        fields: &[&str],
        (limit, budget): (usize, usize),
        found: &mut Found,
    ) -> bool {
        self.decoded.fetch_add(1, Ordering::Relaxed);
        let decoded = if fields.is_empty() { convert::decode(bytes) } else { convert::decode_fields(bytes, fields) };
        match decoded {
            Ok(record) => found.take(record, bytes.len(), limit, budget),
            Err(e) => {
                self.unreadable.fetch_add(1, Ordering::Relaxed);
                report_unreadable(&StoreError::Undecodable(format!("{coll}/{id}: {e}")));
                true
            }
        }
    }
}

/// The smallest collection name ordered after `coll` and all its keys.
pub(super) fn after_collection(coll: &str) -> String {
    format!("{coll}\0")
}

/// The byte range of index entries a scan reads: its equality prefix, then
/// the bounds on the order field, each bracketed by its type.
pub(super) fn entry_range(prefix: &[u8], lower: &Bound<Bson>, upper: &Bound<Bson>) -> (Vec<u8>, Vec<u8>) {
    let with = |v: &Bson, tail: Option<u8>| {
        let mut k = prefix.to_vec();
        keys::push(&mut k, Some(v));
        k.extend(tail);
        k
    };
    let bracket = |b: &Bound<Bson>| match b {
        Bound::Included(v) | Bound::Excluded(v) => Some(keys::tag(Some(v))),
        Bound::Unbounded => None,
    };
    let start = match lower {
        Bound::Included(v) => with(v, None),
        Bound::Excluded(v) => with(v, Some(keys::END)),
        Bound::Unbounded => {
            let mut k = prefix.to_vec();
            k.extend(bracket(upper));
            k
        }
    };
    let end = match upper {
        Bound::Included(v) => with(v, Some(keys::END)),
        Bound::Excluded(v) => with(v, None),
        Bound::Unbounded => {
            let mut k = prefix.to_vec();
            k.push(bracket(lower).map_or(keys::END, |t| t + 1));
            k
        }
    };
    (start, end)
}

fn id_bound(b: &Bound<Bson>, after: bool) -> Bound<String> {
    match b {
        Bound::Included(Bson::String(s)) => Bound::Included(s.clone()),
        Bound::Excluded(Bson::String(s)) if after => Bound::Included(format!("{s}\0")),
        Bound::Excluded(Bson::String(s)) => Bound::Excluded(s.clone()),
        _ => Bound::Unbounded,
    }
}

/// Whether `scan` can only match records whose first index field is set
/// (what a sparse index holds).
pub(super) fn excludes_null(scan: &Scan) -> bool {
    let not_null = |b: &Bound<Bson>| matches!(b, Bound::Included(v) | Bound::Excluded(v) if *v != Bson::Null);
    match scan.eq().first() {
        Some((_, v)) => *v != Bson::Null,
        None => {
            let (lower, upper) = scan.bounds();
            not_null(lower) || not_null(upper)
        }
    }
}

/// Hand the first `scan.max()` entries of `range` after the first
/// `scan.skipped()`, in the scan's order, to `f`: the skip and the limit
/// are applied while reading, so a skipped entry is never handed on.
pub(super) fn in_order<T>(
    range: impl DoubleEndedIterator<Item = Result<T, redb::StorageError>>,
    scan: &Scan,
    mut f: impl FnMut(T) -> StoreResult<bool>,
) -> StoreResult<()> {
    let mut entries: Box<dyn Iterator<Item = _>> =
        if scan.order() == Order::Desc { Box::new(range.rev()) } else { Box::new(range) };
    for n in 0..scan.skipped() {
        if n % 256 == 255 {
            check_abandoned()?;
        }
        match entries.next() {
            Some(entry) => drop(entry.map_err(internal)?),
            None => return Ok(()),
        }
    }
    for (n, entry) in entries.take(scan.max()).enumerate() {
        if n % 256 == 255 {
            check_abandoned()?;
        }
        if !f(entry.map_err(internal)?)? {
            break;
        }
    }
    Ok(())
}

/// The records of a scan along the primary index.
pub(super) fn scan_primary(
    table: &redb::ReadOnlyTable<(&'static str, &'static str), &'static [u8]>,
    coll: &str,
    scan: &Scan,
    reads: &Reads,
) -> StoreResult<Found> {
    let (lower, upper) = scan.bounds();
    let end = after_collection(coll);
    let lo = id_bound(lower, true);
    let hi = id_bound(upper, false);
    let start = match &lo {
        Bound::Included(s) => Bound::Included((coll, s.as_str())),
        Bound::Excluded(s) => Bound::Excluded((coll, s.as_str())),
        Bound::Unbounded => Bound::Included((coll, "")),
    };
    let stop = match &hi {
        Bound::Included(s) => Bound::Included((coll, s.as_str())),
        Bound::Excluded(s) => Bound::Excluded((coll, s.as_str())),
        Bound::Unbounded => Bound::Excluded((end.as_str(), "")),
    };
    let range = table.range::<(&str, &str)>((start, stop)).map_err(internal)?;
    let mut found = Found::default();
    let bounds = (scan.max(), scan.budget());
    in_order(range, scan, |(key, value)| {
        Ok(reads.scanned_into((coll, key.value().1, value.value()), scan.wanted(), bounds, &mut found))
    })?;
    Ok(found)
}

/// The byte ranges (start included, end excluded, in byte order) of the
/// entries of index `spec` that `query` reads: its equality prefix, then
/// each interval of the next field, each cut at the entry it resumes after.
pub(super) fn query_ranges(spec: &IndexSpec, query: &IndexQuery) -> StoreResult<Vec<(Vec<u8>, Vec<u8>)>> {
    let dirs: Vec<bool> = spec.keys().map(|(_, desc)| desc).collect();
    if query.eq.len() >= dirs.len() {
        return Err(StoreError::Internal(format!(
            "index {} has no field after the {} pinned",
            spec.name,
            query.eq.len()
        )));
    }
    let prefix = eq_prefix(spec, &query.eq);
    let desc = dirs[query.eq.len()];
    let mut ranges = match &query.slot {
        None => {
            let mut end = prefix.clone();
            end.push(keys::END);
            vec![(prefix.clone(), end)]
        }
        Some(intervals) => intervals.iter().map(|i| interval_range(&prefix, i, desc)).collect(),
    };
    if let Some(after) = &query.after {
        let rest = &dirs[query.eq.len()..];
        if after.len() != rest.len() {
            return Err(StoreError::Internal(format!("a cursor of index {} names {} fields", spec.name, rest.len())));
        }
        let mut at = prefix.clone();
        for (value, desc) in after.iter().zip(rest) {
            keys::push_dir(&mut at, Some(value), *desc);
        }
        for (start, end) in &mut ranges {
            if query.reverse {
                if at < *end {
                    end.clone_from(&at);
                }
            } else {
                // The first key past `at`: no entry key extends another.
                let mut next = at.clone();
                next.push(0);
                if next > *start {
                    *start = next;
                }
            }
        }
    }
    ranges.retain(|(start, end)| start < end);
    ranges.sort();
    Ok(ranges)
}

/// The key bytes every entry of `spec` whose first fields equal `eq`
/// starts with.
pub(super) fn eq_prefix(spec: &IndexSpec, eq: &[Bson]) -> Vec<u8> {
    let mut prefix = Vec::new();
    for (value, (_, desc)) in eq.iter().zip(spec.keys()) {
        keys::push_dir(&mut prefix, Some(value), desc);
    }
    prefix
}

/// The byte range of the entries whose next field (after `prefix`) lies in
/// `interval`, that field being descending when `desc`.
fn interval_range(prefix: &[u8], interval: &Interval, desc: bool) -> (Vec<u8>, Vec<u8>) {
    let value = |v: &Bson, end: bool| {
        let mut k = prefix.to_vec();
        keys::push_dir(&mut k, Some(v), desc);
        if end {
            k.push(keys::END);
        }
        k
    };
    let tagged = |t: u8| {
        let mut k = prefix.to_vec();
        k.push(t);
        k
    };
    let all_end = || tagged(keys::END);
    // Ascending: the lower edge starts the range; descending: the upper.
    let (first, last) = if desc { (&interval.upper, &interval.lower) } else { (&interval.lower, &interval.upper) };
    let start = match first {
        Edge::Unbounded => prefix.to_vec(),
        Edge::Value { value: v, inclusive } => value(v, !inclusive),
        Edge::Bracket(v) => tagged(keys::tag_dir(Some(v), desc)),
    };
    let end = match last {
        Edge::Unbounded => all_end(),
        Edge::Value { value: v, inclusive } => value(v, *inclusive),
        Edge::Bracket(v) => tagged(keys::tag_dir(Some(v), desc) + 1),
    };
    (start, end)
}

/// Hand the ids of the entries of `ranges` of index table `name` to `f`,
/// in the query's order, until `f` says stop (`false`).
pub(super) fn entries_in(
    entries: &redb::ReadOnlyTable<(&'static str, &'static [u8]), &'static str>,
    name: &str,
    ranges: &[(Vec<u8>, Vec<u8>)],
    reverse: bool,
    mut f: impl FnMut(&str) -> StoreResult<bool>,
) -> StoreResult<()> {
    let mut ordered: Vec<&(Vec<u8>, Vec<u8>)> = ranges.iter().collect();
    if reverse {
        ordered.reverse();
    }
    for (start, end) in ordered {
        let range = entries.range((name, start.as_slice())..(name, end.as_slice())).map_err(internal)?;
        let mut range: Box<dyn Iterator<Item = _>> = if reverse { Box::new(range.rev()) } else { Box::new(range) };
        for (n, entry) in (&mut range).enumerate() {
            if n % 256 == 255 {
                check_abandoned()?;
            }
            let (_, id) = entry.map_err(internal)?;
            if !f(id.value())? {
                return Ok(());
            }
        }
    }
    Ok(())
}

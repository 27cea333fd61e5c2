//! Online index builds on the embedded store, in sorted runs.
//!
//! A build step that took the next records in id order and added their
//! entries would put them all over the index: each step's commit would
//! rewrite about one B-tree page per entry, and every checkpoint during
//! the build would write them all to disk, with writes waiting behind it.
//!
//! So a build reads a run of records at a time ([`RUN_RECORDS`], at most
//! [`RUN_BYTES`] of entries), off the writer, computes their entries and
//! sorts them by key. Its steps then add the run's entries in key order, a
//! batch per commit: a batch's entries lie close together in the index,
//! and a commit rewrites a few pages rather than one per entry.
//!
//! A run is read at one moment and added later, while writes go on. The
//! writer adds an entry only when the record, as it is in the step's own
//! transaction, still gives that entry: a record written since the index
//! was declared has its current entry from its write already (writes keep
//! a declared index), and the entry the run computed from its older state
//! is left out. A record that has not changed since the declaration is in
//! its run unchanged, and gets its entry.
//!
//! The run in progress is kept in memory between steps (one per index
//! being built, at most [`RUN_BYTES`] of entries). Where the next step
//! goes on is a token the builder hands back; a token whose run is not
//! kept (a new store) reads that run again, and adding its entries again
//! changes nothing.

use std::collections::HashMap;
use std::sync::Mutex;

use redb::ReadableTable;

use super::index::entry_key;
use super::scan::{Reads, after_collection};
use super::{RECORDS, internal};
use crate::{IndexSpec, StoreError, StoreResult, convert};

/// The most records a run reads, by default.
pub(super) const RUN_RECORDS: usize = 250_000;

/// The most bytes of entries (keys and ids) a run holds in memory.
pub(super) const RUN_BYTES: usize = 16 << 20;

/// One entry a run computed: its key bytes and the id of the record it
/// was computed from.
pub(super) type RunEntry = (Box<[u8]>, Box<str>);

/// Where a build's next step goes on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Resume {
    /// A run of the records after this id (none: from the first record),
    /// read anew.
    After(Option<String>),
    /// The run that began after this id, whose entries are being added.
    Within(Option<String>),
}

impl Resume {
    /// The token a step hands the builder.
    pub(super) fn token(&self) -> String {
        match self {
            Resume::After(None) => "a".to_owned(),
            Resume::After(Some(id)) => format!("a:{id}"),
            Resume::Within(None) => "w".to_owned(),
            Resume::Within(Some(id)) => format!("w:{id}"),
        }
    }

    /// A token handed back (`None`: the build's first step).
    pub(super) fn of(token: Option<&str>) -> StoreResult<Self> {
        let Some(token) = token else { return Ok(Resume::After(None)) };
        let id = |rest: &str| -> StoreResult<Option<String>> {
            match rest {
                "" => Ok(None),
                _ => rest
                    .strip_prefix(':')
                    .map(|id| Some(id.to_owned()))
                    .ok_or_else(|| StoreError::Internal(format!("not a build step's token: {token:?}"))),
            }
        };
        match token.split_at_checked(1) {
            Some(("a", rest)) => Ok(Resume::After(id(rest)?)),
            Some(("w", rest)) => Ok(Resume::Within(id(rest)?)),
            _ => Err(StoreError::Internal(format!("not a build step's token: {token:?}"))),
        }
    }
}

/// A run of a build: the entries of the records after `start` not added
/// yet.
pub(super) struct Run {
    pub coll: String,
    pub index: String,
    pub start: Option<String>,
    /// The last record read; `None` when the run read none.
    pub end: Option<String>,
    /// Whether records may follow `end` (the run stopped at its bounds).
    pub more: bool,
    /// In descending key order: the next to add come last.
    pub entries: Vec<RunEntry>,
}

impl Run {
    /// Where the build goes on once this run's entries are added: `None`
    /// when no record follows it.
    pub(super) fn after(&self) -> Option<Resume> {
        self.more.then(|| Resume::After(self.end.clone()))
    }

    /// The next (up to) `batch` entries, in key order, taken out of the run.
    pub(super) fn next_batch(&mut self, batch: usize) -> Vec<RunEntry> {
        let mut next = self.entries.split_off(self.entries.len().saturating_sub(batch));
        next.reverse();
        next
    }
}

/// The run in progress of each index being built, kept between its steps
/// (one per index: a run is dropped once its entries are added, or when
/// its index is).
#[derive(Default)]
pub(super) struct Runs(Mutex<HashMap<(String, String), Run>>);

impl Runs {
    /// Take the kept run of `index` of `coll` if it is run `start`.
    pub(super) fn take(&self, coll: &str, index: &str, start: &Option<String>) -> Option<Run> {
        let mut kept = self.0.lock().expect("build runs");
        let key = (coll.to_owned(), index.to_owned());
        if kept.get(&key).is_some_and(|run| &run.start == start) { kept.remove(&key) } else { None }
    }

    pub(super) fn keep(&self, run: Run) {
        self.0.lock().expect("build runs").insert((run.coll.clone(), run.index.clone()), run);
    }

    /// Let go of the kept run of `index` of `coll`, if there is one.
    pub(super) fn forget(&self, coll: &str, index: &str) {
        self.0.lock().expect("build runs").remove(&(coll.to_owned(), index.to_owned()));
    }
}

/// Read the run of `spec`'s entries for the records of `coll` after
/// `start` (at most `most` records and [`RUN_BYTES`] of entries), in `txn`
/// (a read transaction), sorted by key. A record that cannot be decoded is
/// reported and left out (and counted in `reads`).
pub(super) fn read_run(
    txn: &redb::ReadTransaction,
    reads: &Reads,
    coll: &str,
    spec: &IndexSpec,
    start: Option<String>,
    most: usize,
) -> StoreResult<Run> {
    let records = txn.open_table(RECORDS).map_err(internal)?;
    let end_key = after_collection(coll);
    let from = match &start {
        Some(id) => std::ops::Bound::Excluded((coll, id.as_str())),
        None => std::ops::Bound::Included((coll, "")),
    };
    let range =
        records.range::<(&str, &str)>((from, std::ops::Bound::Excluded((end_key.as_str(), "")))).map_err(internal)?;
    let (mut entries, mut bytes, mut read, mut end) = (Vec::new(), 0usize, 0usize, None);
    let mut more = false;
    for item in range {
        if read == most || bytes >= RUN_BYTES {
            more = true;
            break;
        }
        let (key, value) = item.map_err(internal)?;
        let id = key.value().1;
        read += 1;
        end = Some(id.to_owned());
        let Some(record) = reads.decoded((coll, id, value.value())) else { continue };
        if let Some(key) = entry_key(spec, &record, id) {
            bytes += key.bytes.len() + id.len();
            entries.push((key.bytes.into_boxed_slice(), Box::from(id)));
        }
    }
    entries.sort_unstable_by(|a, b| b.0.cmp(&a.0));
    Ok(Run { coll: coll.to_owned(), index: spec.name.clone(), start, end, more, entries })
}

/// Add `entries` (of one run, in key order) to index `spec` of `coll` in
/// `txn`: each only when its record, as it is in `txn`, still gives it.
pub(super) fn add_entries(
    txn: &redb::WriteTransaction,
    coll: &str,
    spec: &IndexSpec,
    entries: &[RunEntry],
) -> StoreResult<()> {
    let records = txn.open_table(RECORDS).map_err(internal)?;
    let mut index = super::index::Entries::open(txn)?;
    let table = super::index::entries_name(coll, &spec.name);
    for (key, id) in entries {
        let Some(value) = records.get((coll, &**id)).map_err(internal)? else { continue };
        // Reported when the run was read.
        let Ok(record) = convert::decode(value.value()) else { continue };
        if let Some(now) = entry_key(spec, &record, id)
            && *now.bytes == **key
        {
            index.put(&table, &now, id)?;
        }
    }
    index.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_name_where_a_build_goes_on() {
        for resume in [
            Resume::After(None),
            Resume::After(Some("r1".into())),
            Resume::Within(None),
            Resume::Within(Some("w:a:".into())),
            Resume::After(Some(String::new())),
        ] {
            assert_eq!(Resume::of(Some(&resume.token())).unwrap(), resume);
        }
        assert_eq!(Resume::of(None).unwrap(), Resume::After(None));
        for stranger in ["", "x", "ab", "wr1", "é"] {
            assert!(Resume::of(Some(stranger)).is_err(), "{stranger:?}");
        }
    }
}

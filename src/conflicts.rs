//! What a version conflict tells a person (docs/design.md §7): the
//! document as it is now and the changes made since the version the client
//! had, read from the change-event log; and the three-way merge of a
//! client's change with everything since its base version, which writes
//! nothing.
//!
//! A document's versions are consecutive and each change's event is
//! `<collection>/<id>/<version>` with the document's data after it, so the
//! data at any version the log still holds is one read by id, and what a
//! change did is the difference between two of them.

use std::collections::HashMap;
use std::sync::Arc;

use serde_json::{Map, Value};

use crate::document::{Live, View};
use crate::documents::{DocError, Documents};
use crate::events::Log;
use crate::events::model::{Event, EventType, document_event_id};

/// At most this many changes are listed, the latest ones.
pub(crate) const MAX_CHANGES: usize = 50;
/// Events an explanation reads at once (each holds the document's data
/// after its change, up to its size limit).
const EVENTS_READ: i64 = 8;
/// Bytes of events (as stored) one explanation reads at most, across all
/// the versions it reads, newest first: past them the older changes are
/// left out (`changes_truncated`), so its work and memory are bounded
/// whatever the document's size and its number of versions (at the size
/// limit, the latest three changes).
pub(crate) const EXPLAIN_BYTES: usize = 16 * 1024 * 1024;

/// One change after the version a client expected.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Change {
    /// The version the change made.
    pub version: i64,
    pub kind: EventType,
    /// When it was committed (RFC 3339).
    pub at: String,
    /// The transaction that made it; none for a single-document write.
    pub transaction: Option<String>,
    /// The name of the API key that made it.
    pub key: Option<String>,
    /// The user who made it.
    pub actor: Option<crate::actor::UserId>,
    /// Field paths (dotted) it added, removed and changed; none when the
    /// log no longer holds the version before it.
    pub paths: Option<Paths>,
}

/// What a change did to a document's fields: the dotted paths it added,
/// removed and changed, each sorted.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Paths {
    pub added: Vec<String>,
    pub removed: Vec<String>,
    pub changed: Vec<String>,
}

/// What explains one version conflict.
#[derive(Debug, Default)]
pub(crate) struct Explained {
    /// The document now (`None`: deleted or missing).
    pub current: Option<Live>,
    pub changes: Vec<Change>,
    /// Some changes after the expected version are not listed: the log no
    /// longer holds them, or there were more than [`MAX_CHANGES`] or more
    /// than `max_bytes` of paths.
    pub truncated: bool,
}

/// A conflict of a three-way merge: a path both sides changed, to
/// different values. A side's value is `None` where the field is absent.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct MergeConflict {
    pub path: String,
    pub base: Option<Value>,
    pub mine: Option<Value>,
    pub theirs: Option<Value>,
}

/// A three-way merge of data.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Merged {
    /// The merge: the client's changes and everyone else's; where both
    /// changed a path differently, the current value.
    pub data: Map<String, Value>,
    /// Paths only the client changed (its values are in `data`).
    pub mine: Vec<String>,
    /// Paths only others changed.
    pub theirs: Vec<String>,
    pub conflicts: Vec<MergeConflict>,
}

/// Why a merge cannot be answered.
#[derive(Debug, thiserror::Error)]
pub(crate) enum MergeError {
    #[error("the change-event log no longer holds version {0} of this document")]
    BaseGone(i64),
    #[error("version {base} is after the document's current version {current}")]
    BaseAhead { base: i64, current: i64 },
    #[error(transparent)]
    Doc(#[from] DocError),
}

/// Conflict explanations and merges over the documents and the log.
pub(crate) struct Conflicts {
    documents: Arc<Documents>,
    log: Arc<Log>,
}

impl Conflicts {
    pub(crate) fn new(documents: Arc<Documents>, log: Arc<Log>) -> Self {
        Self { documents, log }
    }

    /// [`Self::events`] within `left` bytes (as stored), which it lessens:
    /// the events read, and whether the budget stopped the read.
    async fn events_within(
        &self,
        coll: &str,
        id: &str,
        versions: std::ops::RangeInclusive<i64>,
        left: &mut usize,
    ) -> Result<(HashMap<i64, Event>, bool), DocError> {
        let ids: Vec<String> = versions.filter(|v| *v > 0).map(|v| document_event_id(coll, id, v)).collect();
        let (events, read, cut) = self.log.events_by_id_within(&ids, *left).await?;
        *left = left.saturating_sub(read);
        let out = events.into_iter().filter_map(|e| e.version.map(|v| (v, e))).collect();
        Ok((out, cut))
    }

    /// The events of `coll`/`id` at `versions` that the log holds.
    async fn events(
        &self,
        coll: &str,
        id: &str,
        versions: std::ops::RangeInclusive<i64>,
    ) -> Result<HashMap<i64, Event>, DocError> {
        let ids: Vec<String> = versions.filter(|v| *v > 0).map(|v| document_event_id(coll, id, v)).collect();
        let mut out = HashMap::with_capacity(ids.len());
        for event in self.log.events_by_id(&ids).await? {
            if let Some(v) = event.version {
                out.insert(v, event);
            }
        }
        Ok(out)
    }

    /// The document now (`None` when deleted) and its version (the
    /// tombstone's when deleted); `None` when it never existed.
    async fn now(&self, coll: &str, id: &str) -> Result<Option<(Option<Live>, i64)>, DocError> {
        Ok(match self.documents.get(coll, id).await? {
            View::Live(live) => {
                let v = live.version;
                Some((Some(live), v))
            }
            View::Deleted { version, .. } => Some((None, version)),
            View::NotFound => None,
        })
    }

    /// The conflict of a write to `coll`/`id` that expected version
    /// `expected`: the document now and the changes since, their field
    /// paths bounded by `max_bytes`.
    pub(crate) async fn explain(
        &self,
        coll: &str,
        id: &str,
        expected: i64,
        max_bytes: usize,
    ) -> Result<Explained, DocError> {
        // The events of the writes this instance answered are in the log
        // first (a single write's goes there just after its answer).
        self.log.settle().await;
        let Some((current, actual)) = self.now(coll, id).await? else { return Ok(Explained::default()) };
        if actual <= expected {
            return Ok(Explained { current, ..Explained::default() });
        }
        let first = (expected + 1).max(actual - MAX_CHANGES as i64 + 1);
        let mut truncated = first > expected + 1;
        // Newest first, a few events at a time (each may hold a document of
        // megabytes) within [`EXPLAIN_BYTES`] all told; a change is listed
        // once the version before it is read (its paths compare the two).
        let (mut changes, mut bytes, mut left) = (Vec::new(), 0usize, EXPLAIN_BYTES);
        let empty = Map::new();
        // The newest change not listed yet: its version and event.
        let mut newer: Option<(i64, Event)> = None;
        let lowest = (first - 1).max(1);
        let mut upto = actual;
        'read: while upto >= lowest && left > 0 {
            let from = (upto - EVENTS_READ + 1).max(lowest);
            let (mut events, cut) = self.events_within(coll, id, from..=upto, &mut left).await?;
            for v in (from..=upto).rev() {
                let event = events.remove(&v);
                if event.is_none() && cut {
                    // Not read: the budget ended the read first.
                    truncated = true;
                    break 'read;
                }
                if let Some((version, after)) = newer.take() {
                    let paths = event.as_ref().map(|was| diff(data_of(was, &empty), data_of(&after, &empty)));
                    bytes += paths.as_ref().map_or(0, Paths::bytes);
                    if bytes > max_bytes {
                        truncated = true;
                        break 'read;
                    }
                    changes.push(change(version, &after, paths));
                }
                match event {
                    Some(event) if v >= first => newer = Some((v, event)),
                    Some(_) => {}
                    // The log no longer holds it.
                    None => truncated = true,
                }
            }
            if cut {
                truncated = true;
                break;
            }
            upto = from - 1;
        }
        // The first version of all: what it made, from nothing.
        if let Some((1, after)) = &newer {
            let paths = diff(&empty, data_of(after, &empty));
            if bytes + paths.bytes() <= max_bytes {
                changes.push(change(1, after, Some(paths)));
            } else {
                truncated = true;
            }
        } else if newer.is_some() {
            truncated = true;
        }
        changes.reverse();
        Ok(Explained { current, changes, truncated })
    }

    /// The merge of `mine` (the client's data, changed from the document
    /// at `base_version`) with everything since, and the current version.
    pub(crate) async fn merge(
        &self,
        coll: &str,
        id: &str,
        base_version: i64,
        mine: &Map<String, Value>,
    ) -> Result<(Merged, Option<Live>, i64), MergeError> {
        self.log.settle().await;
        let (current, actual) = self.now(coll, id).await?.ok_or(DocError::NotFound)?;
        if base_version > actual {
            return Err(MergeError::BaseAhead { base: base_version, current: actual });
        }
        let empty = Map::new();
        let base = if base_version == 0 {
            Map::new()
        } else {
            let events = self.events(coll, id, base_version..=base_version).await?;
            events.get(&base_version).map(|e| data_of(e, &empty).clone()).ok_or(MergeError::BaseGone(base_version))?
        };
        let theirs = current.as_ref().map(Live::data_json).unwrap_or_default();
        Ok((merge(&base, mine, &theirs), current, actual))
    }
}

/// The change that made `version`, as `event` tells it, with `paths`.
fn change(version: i64, event: &Event, paths: Option<Paths>) -> Change {
    Change {
        version,
        kind: event.kind,
        at: event.at.clone(),
        transaction: event.transaction.clone(),
        key: event.key.clone(),
        actor: event.actor.clone(),
        paths,
    }
}

/// The data an event left (`empty` when it left none: a delete, an
/// expiry), borrowed: diffs of many large versions copy nothing.
fn data_of<'a>(event: &'a Event, empty: &'a Map<String, Value>) -> &'a Map<String, Value> {
    match (event.kind, &event.data) {
        (EventType::Created | EventType::Updated, Some(data)) => data,
        _ => empty,
    }
}

impl Paths {
    /// About what the paths take in an answer.
    fn bytes(&self) -> usize {
        self.added.iter().chain(&self.removed).chain(&self.changed).map(|p| p.len() + 3).sum()
    }
}

/// The field paths `after` added to, removed from and changed in `before`:
/// objects compared per field, recursively; arrays and scalars as whole
/// values. Sorted.
pub(crate) fn diff(before: &Map<String, Value>, after: &Map<String, Value>) -> Paths {
    let mut paths = Paths::default();
    diff_into(before, after, "", &mut paths);
    paths.added.sort();
    paths.removed.sort();
    paths.changed.sort();
    paths
}

fn join(prefix: &str, key: &str) -> String {
    if prefix.is_empty() { key.to_owned() } else { format!("{prefix}.{key}") }
}

fn diff_into(before: &Map<String, Value>, after: &Map<String, Value>, prefix: &str, paths: &mut Paths) {
    for (key, old) in before {
        match after.get(key) {
            None => paths.removed.push(join(prefix, key)),
            Some(new) if new == old => {}
            Some(Value::Object(new)) => match old {
                Value::Object(old) => diff_into(old, new, &join(prefix, key), paths),
                _ => paths.changed.push(join(prefix, key)),
            },
            Some(_) => paths.changed.push(join(prefix, key)),
        }
    }
    for key in after.keys() {
        if !before.contains_key(key) {
            paths.added.push(join(prefix, key));
        }
    }
}

/// The three-way merge of `mine` and `theirs`, both changed from `base`:
/// objects per field, recursively; arrays and scalars as whole values. A
/// path both changed to different values is a conflict and keeps
/// `theirs`' value. `mine`'s numbers are taken as they would be stored
/// (an integer past the signed 64-bit range is a double, as in `base` and
/// `theirs`), so one the client sent back unchanged is not a change.
pub(crate) fn merge(base: &Map<String, Value>, mine: &Map<String, Value>, theirs: &Map<String, Value>) -> Merged {
    let mut stored = Value::Object(mine.clone());
    crate::document::rules::storable_numbers(&mut stored);
    let Value::Object(mine) = &stored else { unreachable!("an object stays an object") };
    let mut out = Merged::default();
    out.data = merge_into(base, mine, theirs, "", &mut out.mine, &mut out.theirs, &mut out.conflicts);
    out.mine.sort();
    out.theirs.sort();
    out.conflicts.sort_by(|a, b| a.path.cmp(&b.path));
    out
}

fn merge_into(
    base: &Map<String, Value>,
    mine: &Map<String, Value>,
    theirs: &Map<String, Value>,
    prefix: &str,
    by_mine: &mut Vec<String>,
    by_theirs: &mut Vec<String>,
    conflicts: &mut Vec<MergeConflict>,
) -> Map<String, Value> {
    let mut keys: Vec<&String> = base.keys().chain(mine.keys()).chain(theirs.keys()).collect();
    keys.sort();
    keys.dedup();
    let mut out = Map::new();
    for key in keys {
        let (b, m, t) = (base.get(key), mine.get(key), theirs.get(key));
        let path = join(prefix, key);
        let value = if m == t {
            m.cloned()
        } else if m == b {
            by_theirs.push(path);
            t.cloned()
        } else if t == b {
            by_mine.push(path);
            m.cloned()
        } else if let (Some(Value::Object(m)), Some(Value::Object(t))) = (m, t) {
            let empty = Map::new();
            let b = match b {
                Some(Value::Object(b)) => b,
                _ => &empty,
            };
            Some(Value::Object(merge_into(b, m, t, &path, by_mine, by_theirs, conflicts)))
        } else {
            conflicts.push(MergeConflict { path, base: b.cloned(), mine: m.cloned(), theirs: t.cloned() });
            t.cloned()
        };
        if let Some(value) = value {
            out.insert(key.clone(), value);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn obj(v: Value) -> Map<String, Value> {
        match v {
            Value::Object(m) => m,
            _ => panic!("an object"),
        }
    }

    #[test]
    fn a_large_integer_sent_back_unchanged_is_not_a_change() {
        // Stored (and so in the base and theirs) as a double.
        let stored = json!(u64::MAX as f64);
        let base = obj(json!({"big": stored, "n": 1}));
        let theirs = obj(json!({"big": stored, "n": 2}));
        let mine = obj(json!({"big": u64::MAX, "n": 1}));
        let merged = merge(&base, &mine, &theirs);
        assert!(merged.conflicts.is_empty(), "{:?}", merged.conflicts);
        assert!(merged.mine.is_empty(), "{:?}", merged.mine);
        assert_eq!(merged.theirs, ["n"]);
        assert_eq!(Value::Object(merged.data), json!({"big": stored, "n": 2}));
    }

    #[test]
    fn a_diff_names_nested_paths_and_takes_arrays_whole() {
        let before = obj(json!({"a": 1, "b": {"c": 1, "d": [1, 2]}, "gone": true, "e": {"f": 1}}));
        let after = obj(json!({"a": 2, "b": {"c": 1, "d": [1, 3], "new": 0}, "e": 5, "x": null}));
        let paths = diff(&before, &after);
        assert_eq!(paths.added, ["b.new", "x"]);
        assert_eq!(paths.removed, ["gone"]);
        assert_eq!(paths.changed, ["a", "b.d", "e"]);
        assert_eq!(diff(&before, &before), Paths::default());
    }

    #[test]
    fn disjoint_changes_merge_without_conflict() {
        let base = obj(json!({"a": 1, "b": 1, "c": 1}));
        let mine = obj(json!({"a": 2, "b": 1, "c": 1, "m": true}));
        let theirs = obj(json!({"a": 1, "b": 3}));
        let merged = merge(&base, &mine, &theirs);
        assert_eq!(merged.data, obj(json!({"a": 2, "b": 3, "m": true})));
        assert_eq!(merged.mine, ["a", "m"]);
        assert_eq!(merged.theirs, ["b", "c"]);
        assert!(merged.conflicts.is_empty());
    }

    #[test]
    fn overlapping_changes_are_conflicts_that_keep_theirs() {
        let base = obj(json!({"a": 1, "same": 0, "gone": 1}));
        let mine = obj(json!({"a": 2, "same": 5, "gone": 2}));
        let theirs = obj(json!({"a": 3, "same": 5}));
        let merged = merge(&base, &mine, &theirs);
        assert_eq!(merged.data, obj(json!({"a": 3, "same": 5})));
        assert_eq!(
            merged.conflicts,
            [
                MergeConflict { path: "a".into(), base: Some(json!(1)), mine: Some(json!(2)), theirs: Some(json!(3)) },
                MergeConflict { path: "gone".into(), base: Some(json!(1)), mine: Some(json!(2)), theirs: None },
            ]
        );
        assert!(merged.mine.is_empty() && merged.theirs.is_empty(), "{merged:?}");
    }

    #[test]
    fn objects_merge_per_field_and_arrays_whole() {
        let base = obj(json!({"addr": {"city": "A", "zip": "1"}, "tags": [1]}));
        let mine = obj(json!({"addr": {"city": "B", "zip": "1"}, "tags": [1, 2]}));
        let theirs = obj(json!({"addr": {"city": "A", "zip": "2", "street": "s"}, "tags": [0]}));
        let merged = merge(&base, &mine, &theirs);
        assert_eq!(merged.data, obj(json!({"addr": {"city": "B", "zip": "2", "street": "s"}, "tags": [0]})));
        assert_eq!(merged.mine, ["addr.city"]);
        assert_eq!(merged.theirs, ["addr.street", "addr.zip"]);
        assert_eq!(merged.conflicts.len(), 1);
        assert_eq!(merged.conflicts[0].path, "tags");
    }

    #[test]
    fn against_a_deleted_document_every_base_field_was_removed_by_others() {
        let base = obj(json!({"a": 1, "b": 1}));
        let mine = obj(json!({"a": 2, "b": 1}));
        let merged = merge(&base, &mine, &Map::new());
        assert_eq!(merged.theirs, ["b"]);
        assert_eq!(merged.conflicts.len(), 1);
        assert_eq!(merged.data, Map::new());
    }
}

//! Collections' rules in the store (`_rules`, one record per collection)
//! and each instance's view of them, at most [`CACHE_TTL`] old.
//!
//! A record holds the current version (its grants as written, a JSON
//! string: `$auth` is not a field name MongoDB stores), the log position
//! it took effect at, and the versions before it (the last
//! [`MAX_HISTORY`]), so a reader of the event log judges each event by
//! the version in force at its position. Every write is a compare-and-set
//! on the version read, so two admins' `PUT`s never lose one another.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::model::{Grant, GrantSpec, check};
use crate::clock::Clock;
use crate::document::rules::Invalid;
use crate::store::{DateTime, DynStore, StoreError, StoreResult, Update};

/// The collection of rules records.
pub(crate) const RULES: &str = "_rules";
/// The version of a rules record's format.
const FORMAT: i32 = 1;
/// How old an instance's knowledge of a collection's rules may be.
pub(crate) const CACHE_TTL: Duration = Duration::from_secs(1);
/// How long a `PUT` waits before it answers: every instance's cache has
/// seen the new version by then.
pub(crate) const SETTLE: Duration = Duration::from_millis(2 * 1000 + 200);
/// Earlier versions a record keeps.
const MAX_HISTORY: usize = 8;

/// One version of a collection's rules, checked.
#[derive(Debug)]
pub(crate) struct RuleSet {
    pub collection: String,
    pub version: i64,
    /// The log position from which it is in force: events after it are
    /// judged by it.
    pub at: u64,
    pub updated_at: DateTime,
    pub specs: Vec<GrantSpec>,
    pub grants: Vec<Arc<Grant>>,
    /// The top-level fields any grant's `match` names.
    pub named: Arc<BTreeSet<String>>,
    /// Whether a grant's `when` looks at the time (`now`): a judgement by
    /// this version holds for the moment it was made only.
    pub timed: bool,
}

/// A collection's rules: the version in force (`None` once removed) and
/// the ones before it, newest first.
#[derive(Debug, Default)]
pub(crate) struct Versions {
    pub current: Option<Arc<RuleSet>>,
    /// Earlier versions, each with the position it took effect at
    /// (`None`: no rules from there).
    pub earlier: Vec<(u64, Option<Arc<RuleSet>>)>,
    /// Where [`Self::current`] (or its removal) took effect.
    pub at: u64,
}

impl Versions {
    /// The version in force at log position `position`. An event older
    /// than every version kept is judged by the oldest, and one logged
    /// while rules were removed by the version that came back after: rules
    /// set on a collection apply to the events logged before them too, so
    /// a user never reads from the log what the rules hide now. Once the
    /// rules are removed (and until they come back), no event is judged.
    pub(crate) fn at(&self, position: u64) -> Option<&Arc<RuleSet>> {
        if position > self.at || self.current.is_none() {
            return self.current.as_ref();
        }
        // Newest first; `newer`: the nearest version after, that had rules.
        let mut newer = self.current.as_ref();
        for (at, set) in &self.earlier {
            if position > *at {
                return set.as_ref().or(newer);
            }
            newer = set.as_ref().or(newer);
        }
        newer
    }
}

#[derive(Serialize, Deserialize, Clone)]
struct Stored {
    version: i64,
    at: i64,
    /// The grants as written (JSON); `None`: removed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    grants: Option<String>,
    updated_at: DateTime,
}

#[derive(Serialize, Deserialize)]
struct RulesRecord {
    #[serde(rename = "_id")]
    collection: String,
    v: i32,
    #[serde(flatten)]
    current: Stored,
    #[serde(default)]
    history: Vec<Stored>,
}

/// Why rules could not be set.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SetError {
    #[error(transparent)]
    Invalid(#[from] Invalid),
    /// `If-Match` named another version.
    #[error("the rules are at version {actual}")]
    Version { expected: i64, actual: i64 },
    #[error(transparent)]
    Store(#[from] StoreError),
}

type Known = (Instant, Arc<Versions>);

/// Every collection's rules, as this instance knows them.
pub(crate) struct Rules {
    store: DynStore,
    clock: Clock,
    cache: Mutex<HashMap<String, Known>>,
    generation: std::sync::atomic::AtomicU64,
}

impl RuleSet {
    /// `specs` as version `version` of `collection`'s rules, checked.
    pub(crate) fn checked(collection: &str, version: i64, specs: Vec<GrantSpec>) -> Result<Self, Invalid> {
        let grants = check(&specs)?;
        let named = Arc::new(grants.iter().flat_map(|g| g.named.iter().cloned()).collect());
        let timed = grants.iter().any(|g| g.when.as_ref().is_some_and(|w| w.paths.keys().any(|p| p == "now")));
        Ok(RuleSet {
            named,
            timed,
            collection: collection.to_owned(),
            version,
            at: 0,
            updated_at: DateTime::from_millis(0),
            specs,
            grants: grants.into_iter().map(Arc::new).collect(),
        })
    }
}

fn decode(collection: &str, stored: &Stored) -> Result<Option<Arc<RuleSet>>, String> {
    let Some(json) = &stored.grants else { return Ok(None) };
    let specs: Vec<GrantSpec> = serde_json::from_str(json).map_err(|e| e.to_string())?;
    let set = RuleSet::checked(collection, stored.version, specs).map_err(|e| e.to_string())?;
    let at = u64::try_from(stored.at).unwrap_or(0);
    Ok(Some(Arc::new(RuleSet { at, updated_at: stored.updated_at, ..set })))
}

impl Rules {
    pub(crate) fn new(store: DynStore, clock: Clock) -> Arc<Self> {
        Arc::new(Self { store, clock, cache: Mutex::default(), generation: Default::default() })
    }

    /// Now, as `when` filters see it.
    pub(crate) fn now_string(&self) -> String {
        super::now_string(self.clock.now())
    }

    /// `coll`'s rules, at most [`CACHE_TTL`] old.
    pub(crate) async fn of(&self, coll: &str) -> StoreResult<Arc<Versions>> {
        if let Some((at, known)) = self.cache.lock().expect("rules cache").get(coll)
            && at.elapsed() < CACHE_TTL
        {
            return Ok(Arc::clone(known));
        }
        use std::sync::atomic::Ordering;
        let generation = self.generation.load(Ordering::SeqCst);
        let read = Instant::now();
        let known = Arc::new(self.load(coll).await?);
        let mut cache = self.cache.lock().expect("rules cache");
        if self.generation.load(Ordering::SeqCst) == generation {
            if cache.len() > 10_000 {
                cache.clear();
            }
            cache.insert(coll.to_owned(), (read, Arc::clone(&known)));
        }
        Ok(known)
    }

    /// The top-level fields the `match` of `coll`'s rules in force name
    /// (`None`: no rules), at most [`CACHE_TTL`] old: what a change event
    /// of `coll` keeps of the document before the change.
    pub(crate) async fn named(&self, coll: &str) -> StoreResult<Option<Arc<BTreeSet<String>>>> {
        Ok(self.of(coll).await?.current.as_ref().map(|set| Arc::clone(&set.named)))
    }

    /// [`Self::named`] as this instance last learned it, however long ago
    /// (`None` also when it never did): for a step that cannot wait for
    /// the store. An event written without them is judged as one written
    /// before rules were set (docs/guides/rules.md, "Streams").
    pub(crate) fn named_known(&self, coll: &str) -> Option<Arc<BTreeSet<String>>> {
        let cache = self.cache.lock().expect("rules cache");
        cache.get(coll).and_then(|(_, known)| known.current.as_ref().map(|set| Arc::clone(&set.named)))
    }

    /// `coll`'s rules as the store holds them now. A record that cannot
    /// be read is reported, and refuses every caller it would judge (an
    /// empty rule set) rather than let them through.
    async fn load(&self, coll: &str) -> StoreResult<Versions> {
        let Some(record) = self.store.get(RULES, coll).await? else { return Ok(Versions::default()) };
        let record = match mongodb::bson::from_document::<RulesRecord>(record) {
            Ok(r) if r.v == FORMAT => r,
            Ok(r) => return Ok(unreadable(coll, &format!("format {} is not {FORMAT}", r.v))),
            Err(e) => return Ok(unreadable(coll, &e.to_string())),
        };
        let current = match decode(coll, &record.current) {
            Ok(c) => c,
            Err(e) => return Ok(unreadable(coll, &e)),
        };
        let earlier = record
            .history
            .iter()
            .rev()
            .map(|s| {
                // An earlier version that cannot be read judges its events
                // as refusing everyone.
                let set = decode(coll, s).unwrap_or_else(|e| unreadable(coll, &e).current);
                (u64::try_from(s.at).unwrap_or(0), set)
            })
            .collect();
        Ok(Versions { current, earlier, at: u64::try_from(record.current.at).unwrap_or(0) })
    }

    fn forget(&self, coll: &str) {
        let mut cache = self.cache.lock().expect("rules cache");
        self.generation.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        cache.remove(coll);
    }

    /// Set `coll`'s rules to `specs` (`None`: remove them), at log
    /// position `at`, if they are at version `expected` (when given).
    /// Answers the new versions; the caller waits [`SETTLE`] before it
    /// says they are in force everywhere.
    pub(crate) async fn set(
        &self,
        coll: &str,
        specs: Option<Vec<GrantSpec>>,
        expected: Option<i64>,
        at: u64,
    ) -> Result<Arc<Versions>, SetError> {
        if let Some(specs) = &specs {
            check(specs)?;
        }
        let grants = specs.as_ref().map(|s| serde_json::to_string(s).expect("grants serialize"));
        let now = self.clock.now();
        let at = i64::try_from(at).unwrap_or(i64::MAX);
        loop {
            let existing = self.store.get(RULES, coll).await?;
            let record = existing.map(mongodb::bson::from_document::<RulesRecord>).transpose();
            let record = match record {
                Ok(r) => r,
                Err(e) => {
                    // Replaced whole: the admin's new rules are what is wanted.
                    tracing::warn!(collection = coll, error = %e, "unreadable rules record replaced");
                    self.store.delete(RULES, coll, crate::store::shape::any()).await?;
                    None
                }
            };
            let version = record.as_ref().map_or(0, |r| r.current.version);
            if let Some(expected) = expected.filter(|e| *e != version) {
                return Err(SetError::Version { expected, actual: version });
            }
            let next = Stored { version: version + 1, at, grants: grants.clone(), updated_at: now };
            let written = match record {
                None => {
                    let rec =
                        RulesRecord { collection: coll.to_owned(), v: FORMAT, current: next, history: Vec::new() };
                    self.store.insert(RULES, mongodb::bson::to_document(&rec).expect("rules serialize")).await?
                }
                Some(rec) => {
                    let mut history = rec.history;
                    history.push(rec.current);
                    let drop = history.len().saturating_sub(MAX_HISTORY);
                    history.drain(..drop);
                    let new = RulesRecord { collection: coll.to_owned(), v: FORMAT, current: next, history };
                    let mut doc = mongodb::bson::to_document(&new).expect("rules serialize");
                    doc.remove("_id");
                    let unset = if grants.is_none() { vec!["grants".to_owned()] } else { Vec::new() };
                    let filter = mongodb::bson::doc! {"version": version};
                    self.store.update(RULES, coll, filter, Update { set: doc, unset }).await?
                }
            };
            if written {
                break;
            }
        }
        self.forget(coll);
        tracing::info!(collection = coll, removed = grants.is_none(), "rules set");
        Ok(self.of(coll).await?)
    }
}

fn unreadable(coll: &str, why: &str) -> Versions {
    tracing::error!(collection = coll, error = why, "a rules record cannot be read: every ruled caller is refused");
    let set = RuleSet {
        collection: coll.to_owned(),
        version: 0,
        at: 0,
        updated_at: DateTime::from_millis(0),
        specs: Vec::new(),
        grants: Vec::new(),
        named: Arc::default(),
        timed: false,
    };
    Versions { current: Some(Arc::new(set)), earlier: Vec::new(), at: 0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(version: i64) -> Option<Arc<RuleSet>> {
        Some(Arc::new(RuleSet::checked("c", version, Vec::new()).expect("rules")))
    }

    fn version(s: Option<&Arc<RuleSet>>) -> Option<i64> {
        s.map(|s| s.version)
    }

    #[test]
    fn an_event_is_judged_by_the_version_in_force_at_its_position_and_gaps_by_the_next() {
        // v1 at 10, removed (v2) at 20, v3 at 30, v4 (current) at 40.
        let versions = Versions { current: set(4), at: 40, earlier: vec![(30, set(3)), (20, None), (10, set(1))] };
        assert_eq!(version(versions.at(41)), Some(4));
        assert_eq!(version(versions.at(35)), Some(3));
        // While the rules were removed: the rules that came back judge.
        assert_eq!(version(versions.at(25)), Some(3));
        assert_eq!(version(versions.at(15)), Some(1));
        // Before the first version: the first.
        assert_eq!(version(versions.at(3)), Some(1));
        // Removed now: nothing is judged.
        let removed = Versions { current: None, at: 50, earlier: vec![(40, set(4))] };
        assert_eq!(version(removed.at(45)), None);
        assert_eq!(version(removed.at(3)), None);
        // Never had any.
        assert_eq!(version(Versions::default().at(7)), None);
    }
}

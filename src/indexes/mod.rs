//! Declared indexes (docs/design.md §7): the resources clients `PUT`, their
//! online build, and the rule every write keeps for them.
//!
//! A declared index is a record in `_indexes` (`<collection>/<name>`): its
//! fields as the client gave them, its state (`building`, `ready`,
//! `failed`, or `dropping` once deleted), the build's progress, and the
//! name of the index it has in the store. That store index holds, for
//! every record of the collection, `_meta.deleted`, then the declared
//! fields in their directions, then `_id`: queries pin `_meta.deleted` to
//! false, so a tombstone is never an entry they read.
//!
//! The rule: an indexed path never holds, nor passes through, an array or
//! an object. A write that would break it is refused (422), in single
//! writes and transaction members alike, so both stores order every
//! indexed value as MongoDB does and answer every query alike. Each
//! instance knows a collection's declared indexes from a cache kept at
//! most [`CACHE_TTL`] old, so a build waits [`GRACE`] after the
//! declaration before it checks the documents: from then on, every
//! instance refuses what the check would have to find.
//!
//! The build (the [`Builds`] worker, on whichever instance holds the
//! build's lease) checks every live document against the rule, then
//! declares the store index, whose entries every write keeps from then on,
//! then adds those of the documents there, a batch at a time, each batch
//! one commit, so writes wait for a batch at most. A build whose lease
//! runs out (its instance stopped) is taken over from the start by the
//! next pass of any instance.

mod admission;
mod build;
mod claims;
pub(crate) mod unique;

pub(crate) use admission::{MemberRefusal, Refusal};
pub(crate) use build::{Builds, lease_owner};
pub(crate) use claims::LiveData;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::clock::Clock;
use crate::query::plan::{Declared, Plan, Planning, Unserved};
pub(crate) use crate::query::rule::breaks_rule;
use crate::store::scans::INDEXES_BY_COLL;
use crate::store::shape::fields;
use crate::store::{Bson, DateTime, DynStore, IndexSpec, Record, StoreError, StoreResult, doc};

/// The collection of index declarations.
pub(crate) const INDEXES: &str = "_indexes";
/// The version of a declaration record's format.
const FORMAT: i64 = 1;
/// How old an instance's knowledge of a collection's indexes may be.
pub(crate) const CACHE_TTL: Duration = Duration::from_secs(1);
/// How long a build waits after its declaration before it checks the
/// documents: every instance's cache has seen the index by then.
pub const GRACE: Duration = Duration::from_secs(3);
/// How long a builder holds a build without renewing its lease.
const LEASE: Duration = Duration::from_secs(30);
/// Records one build step checks or indexes.
pub(crate) const BUILD_BATCH: usize = 1000;
/// Build steps between two that make the build so far durable.
const DURABLE_EVERY: u64 = 2;
/// How often a build renews its lease and records its progress.
const RENEW_EVERY: Duration = Duration::from_secs(1);
/// The longest rest a build takes after a step (see `build::Pace`).
const MAX_REST: Duration = Duration::from_millis(100);
/// Declared indexes one collection may have.
pub(crate) const MAX_INDEXES: usize = 32;
pub(crate) use crate::query::plan::MAX_FIELDS;

/// Documents a failed build names.
const MAX_NAMED: usize = 10;

/// The state of a declared index.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum State {
    Building,
    Ready,
    Failed,
    /// Deleted: queries no longer use it; the store index is dropped once
    /// every instance knows.
    Dropping,
}

impl State {
    fn to_bson(self) -> Bson {
        mongodb::bson::to_bson(&self).expect("a state serializes")
    }
}

/// How far a build is.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Progress {
    /// `waiting` for transactions in flight at the declaration, `checking`
    /// the documents against the rule, then `indexing` them.
    pub phase: String,
    /// Documents done in this phase.
    pub done: u64,
    /// Live documents when the build began.
    pub total: u64,
}

/// A declared index, as stored.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Declaration {
    #[serde(rename = "_id")]
    pub key: String,
    /// The record's format version.
    pub v: i64,
    pub coll: String,
    pub name: String,
    pub fields: Vec<String>,
    #[serde(default)]
    pub unique: bool,
    pub state: State,
    #[serde(default)]
    pub progress: Option<Progress>,
    #[serde(default)]
    pub reason: Option<String>,
    /// The documents a failed build met that break the rule.
    #[serde(default)]
    pub documents: Vec<String>,
    /// The index's name in the store.
    pub physical: String,
    pub created_at: DateTime,
    pub updated_at: DateTime,
    #[serde(default)]
    pub owner: Option<String>,
    #[serde(default)]
    pub lease_until: Option<DateTime>,
}

impl Declaration {
    fn key_of(coll: &str, name: &str) -> String {
        format!("{coll}/{name}")
    }

    fn record(&self) -> Record {
        mongodb::bson::to_document(self).expect("a declaration serializes")
    }

    fn from_record(record: Record) -> StoreResult<Self> {
        let id = record.get_str("_id").unwrap_or("?").to_owned();
        mongodb::bson::from_document(record).map_err(|e| StoreError::Undecodable(format!("{INDEXES}/{id}: {e}")))
    }

    /// The index in the store: `_meta.deleted` (so reads pin it to false
    /// and read live documents only), the declared fields in their
    /// directions, then `_id`.
    pub(crate) fn spec(&self) -> IndexSpec {
        let mut fields = vec!["_meta.deleted".to_owned()];
        fields.extend(self.fields.iter().cloned());
        fields.push("_id".to_owned());
        IndexSpec { name: self.physical.clone(), fields, unique: false, sparse: false, counted: true }
    }

    /// What is left to drop of this declaration's store index, under a
    /// key of its own (its store name in it), as of `now`.
    fn dropping(&self, now: DateTime) -> Self {
        Declaration {
            key: format!("{}#{}", self.key, self.physical),
            state: State::Dropping,
            updated_at: now,
            owner: None,
            lease_until: None,
            ..self.clone()
        }
    }

    /// The declared paths (without their directions).
    pub(crate) fn paths(&self) -> impl Iterator<Item = &str> {
        self.fields.iter().map(|f| f.strip_prefix('-').unwrap_or(f))
    }
}

/// A new store index name for a declaration named `name`: never another
/// declaration's, of any collection, or an earlier one of this name (a
/// new index never meets the entries or the unique values of another; the
/// time keeps names in declaration order). Releases before this one named
/// it `u.{name}.{milliseconds}`, which two declarations in one millisecond
/// shared ([`Indexes::separate_shared`] gives each its own).
pub(crate) fn physical_name(name: &str) -> String {
    format!("u.{name}.{}", uuid::Uuid::now_v7().simple())
}

/// A declaration standing for this store index (a delete's filter).
#[derive(Serialize)]
struct Physical<'a> {
    physical: &'a str,
}

/// Why a declaration is refused.
#[derive(Debug, thiserror::Error)]
pub enum DeclareError {
    /// 422 at the pointer.
    #[error("{1}")]
    Invalid(String, String),
    /// An index of that name exists with another definition, or is being
    /// dropped.
    #[error("{0}")]
    Exists(String),
    /// The collection has as many indexes as it may.
    #[error("{0}")]
    Limit(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// A collection's declarations, as read at an instant.
type Known = (Instant, Arc<Vec<Declaration>>);

/// The declared indexes of each collection, and their builds.
pub struct Indexes {
    store: DynStore,
    clock: Clock,
    /// Collection → (when read, its declarations but dropped ones).
    cache: Mutex<HashMap<String, Known>>,
    /// Bumped by every [`Indexes::forget`]: a read that began before one
    /// is not cached, so a change this instance made is never hidden by
    /// a read of the state before it that ended after it.
    generation: std::sync::atomic::AtomicU64,
    /// Who holds a build's lease.
    instance: String,
    /// Wakes the builder: a declaration or a deletion to act on.
    wake: tokio::sync::Notify,
    /// The builds this instance runs (by declaration key), each a task of
    /// its own.
    running: Mutex<std::collections::HashSet<String>>,
    /// Wakes [`Indexes::builds_idle`] when a build of this instance ends.
    built: tokio::sync::Notify,
    /// One lane per collection: its builds run one after another.
    lanes: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// The turn a build holds for one step and its rest: taken in the
    /// order asked for (tokio's mutex is fair), so every collection
    /// building gets a step in turn and none waits behind more than one
    /// step of each other's.
    turn: tokio::sync::Mutex<()>,
    /// The build tasks, waited for at shutdown.
    tasks: tokio_util::task::TaskTracker,
}

/// Of `declared`, an index that is not ready (building, or failed) and
/// that `plan` would take if it were: what a query no ready index serves
/// is waiting for, or would have had.
pub(crate) fn pending<'d>(declared: &'d [Declaration], planning: Planning<'_>) -> Option<&'d Declaration> {
    declared
        .iter()
        .filter(|d| matches!(d.state, State::Building | State::Failed))
        .find(|d| planning.over(&[Declared { name: d.physical.clone(), fields: d.fields.clone() }]).is_ok())
}

/// A name for an index on `fields` (as `PUT` takes them) that follows the
/// name rules and that `taken` says no index has: the fields joined by
/// `_` (`-amount` as `amount_desc`), then `_2`, `_3`, … until one is free.
pub(crate) fn free_name(fields: &[String], taken: impl Fn(&str) -> bool) -> String {
    let mut base: String = fields
        .iter()
        .map(|f| match f.strip_prefix('-') {
            Some(p) => format!("{p}_desc"),
            None => f.clone(),
        })
        .collect::<Vec<_>>()
        .join("_")
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || c == '_' || c == '-' { c } else { '_' })
        .collect();
    if !base.starts_with(|c: char| c.is_ascii_alphabetic()) {
        base.insert_str(0, "by_");
    }
    (1..)
        .map(|n| {
            let suffix = if n == 1 { String::new() } else { format!("_{n}") };
            // The characters are ASCII: any byte count is a boundary.
            let mut name = base.clone();
            name.truncate(MAX_NAME - suffix.len());
            name + &suffix
        })
        .find(|name| !taken(name))
        .expect("a collection holds fewer indexes than names")
}

/// The longest index name (the rule collection names follow).
const MAX_NAME: usize = 64;

impl Indexes {
    pub fn new(store: DynStore, clock: Clock) -> Arc<Self> {
        let instance = build::lease_owner(store.as_ref());
        Arc::new(Self {
            store,
            clock,
            cache: Mutex::new(HashMap::new()),
            generation: std::sync::atomic::AtomicU64::new(0),
            instance,
            wake: tokio::sync::Notify::new(),
            running: Mutex::default(),
            built: tokio::sync::Notify::new(),
            lanes: Mutex::default(),
            turn: tokio::sync::Mutex::new(()),
            tasks: tokio_util::task::TaskTracker::new(),
        })
    }

    /// The declarations of `coll` (dropped ones aside), at most
    /// [`CACHE_TTL`] old.
    pub async fn declared(&self, coll: &str) -> StoreResult<Arc<Vec<Declaration>>> {
        if let Some((at, known)) = self.cache.lock().expect("index cache").get(coll) {
            if at.elapsed() < CACHE_TTL {
                return Ok(Arc::clone(known));
            }
        }
        self.load(coll).await
    }

    /// The declarations of `coll` as the store holds them now; cached
    /// unless a change was forgotten meanwhile.
    async fn load(&self, coll: &str) -> StoreResult<Arc<Vec<Declaration>>> {
        use std::sync::atomic::Ordering;
        let generation = self.generation.load(Ordering::SeqCst);
        let read = Instant::now();
        let known = Arc::new(self.list(coll).await?);
        let mut cache = self.cache.lock().expect("index cache");
        if self.generation.load(Ordering::SeqCst) == generation {
            if cache.len() > 10_000 {
                cache.clear();
            }
            cache.insert(coll.to_owned(), (read, Arc::clone(&known)));
        }
        Ok(known)
    }

    fn forget(&self, coll: &str) {
        let mut cache = self.cache.lock().expect("index cache");
        self.generation.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        cache.remove(coll);
    }

    /// The ready indexes of `coll`, as the planner takes them.
    fn ready_of(known: &[Declaration]) -> Vec<Declared> {
        known
            .iter()
            .filter(|d| d.state == State::Ready)
            .map(|d| Declared { name: d.physical.clone(), fields: d.fields.clone() })
            .collect()
    }

    /// The plan of `planning` over the ready indexes of `coll`. A plan the
    /// cached declarations refuse is tried again on those the store holds
    /// now, so an index any instance has reported `ready` is never refused
    /// for a cache that has not seen it yet.
    pub(crate) async fn plan(&self, coll: &str, planning: Planning<'_>) -> StoreResult<Result<Plan, Unserved>> {
        let cached = Self::ready_of(&self.declared(coll).await?);
        match planning.over(&cached) {
            Ok(done) => Ok(Ok(done)),
            Err(_) => Ok(planning.over(&Self::ready_of(&self.load(coll).await?))),
        }
    }

    /// The paths of the indexes of each of `colls` that writes must keep
    /// the rule for (those building or ready).
    pub async fn paths(&self, coll: &str) -> StoreResult<Vec<(String, String)>> {
        Ok(self
            .declared(coll)
            .await?
            .iter()
            .filter(|d| matches!(d.state, State::Building | State::Ready))
            .flat_map(|d| d.paths().map(|p| (d.name.clone(), p.to_owned())).collect::<Vec<_>>())
            .collect())
    }

    /// Every declaration of `coll`, dropped ones aside, by name.
    pub async fn list(&self, coll: &str) -> StoreResult<Vec<Declaration>> {
        let records = self.store.scan(INDEXES, INDEXES_BY_COLL.scan(vec![Bson::String(coll.to_owned())])).await?;
        let mut out = Vec::new();
        for record in records {
            match Declaration::from_record(record) {
                Ok(d) if d.state != State::Dropping => out.push(d),
                Ok(_) => {}
                Err(e) => crate::store::report_unreadable(&e),
            }
        }
        Ok(out)
    }

    pub async fn get(&self, coll: &str, name: &str) -> StoreResult<Option<Declaration>> {
        let Some(record) = self.store.get(INDEXES, &Declaration::key_of(coll, name)).await? else { return Ok(None) };
        let d = Declaration::from_record(record)?;
        Ok((d.state != State::Dropping).then_some(d))
    }

    /// Declare index `name` of `coll`; `Ok((declaration, true))` when it is
    /// new, `false` when the same one exists.
    pub async fn declare(
        &self,
        coll: &str,
        name: &str,
        fields: Vec<String>,
        unique: bool,
    ) -> Result<(Declaration, bool), DeclareError> {
        check_fields(&fields)?;
        let key = Declaration::key_of(coll, name);
        if let Some(record) = self.store.get(INDEXES, &key).await? {
            let existing = Declaration::from_record(record)?;
            if existing.state == State::Dropping {
                return Err(DeclareError::Exists(format!(
                    "index {name} of {coll} is being dropped; declare it again in a few seconds"
                )));
            }
            if existing.fields == fields && existing.unique == unique {
                return Ok((existing, false));
            }
            return Err(DeclareError::Exists(format!(
                "index {name} of {coll} exists on {:?}; delete it first to declare it on {fields:?}",
                existing.fields
            )));
        }
        let declared = self.list(coll).await?;
        if declared.len() >= MAX_INDEXES {
            return Err(DeclareError::Limit(format!(
                "collection {coll} has {MAX_INDEXES} indexes, the most it may have; delete one first"
            )));
        }
        // One index per list of fields: a second would serve nothing the
        // first does not, and MongoDB holds one index per key pattern.
        if let Some(other) = same_fields(&declared, name, &fields).next() {
            return Err(DeclareError::Exists(format!(
                "index {} of {coll} is on the same fields {fields:?}; delete it first to declare them{} under \
                 another name",
                other.name,
                if unique && !other.unique { " as unique" } else { "" }
            )));
        }
        let now = self.clock.now();
        let declaration = Declaration {
            key: key.clone(),
            v: FORMAT,
            coll: coll.to_owned(),
            name: name.to_owned(),
            fields,
            unique,
            state: State::Building,
            progress: None,
            reason: None,
            documents: Vec::new(),
            physical: physical_name(name),
            created_at: now,
            updated_at: now,
            owner: None,
            lease_until: None,
        };
        if !self.store.insert(INDEXES, declaration.record()).await? {
            // Declared at the same moment by another request: answer theirs.
            return Box::pin(self.declare(coll, name, declaration.fields, unique)).await;
        }
        self.forget(coll);
        self.wake.notify_one();
        tracing::info!(collection = coll, index = name, fields = ?declaration.fields, "index declared");
        Ok((declaration, true))
    }

    /// Delete index `name` of `coll`: queries stop using it at once (on
    /// other instances within [`CACHE_TTL`]), and the name is free to
    /// declare again; its store index goes after [`GRACE`]. `false`: there
    /// was none.
    pub async fn delete(&self, coll: &str, name: &str) -> StoreResult<bool> {
        let Some(d) = self.get(coll, name).await? else { return Ok(false) };
        let now = self.clock.now();
        // What is left to drop, under a key of its own, before the
        // declaration goes: a crash between the two leaves both, and the
        // dropper then leaves the store index to the declaration.
        self.store.insert(INDEXES, d.dropping(now).record()).await?;
        let done = self.store.delete(INDEXES, &d.key, fields(&Physical { physical: &d.physical })).await?;
        self.forget(coll);
        self.wake.notify_one();
        if done {
            tracing::info!(collection = coll, index = name, "index deleted");
        }
        Ok(done)
    }
}

/// The declarations among `declared` other than `name` that hold an index
/// on exactly `fields` (building or ready; a failed one holds none).
fn same_fields<'d>(
    declared: &'d [Declaration],
    name: &'d str,
    fields: &'d [String],
) -> impl Iterator<Item = &'d Declaration> {
    declared
        .iter()
        .filter(move |d| d.name != name && d.fields == fields && matches!(d.state, State::Building | State::Ready))
}

/// The fields of a declaration: 1 to [`MAX_FIELDS`] data paths, each
/// once, each optionally `-` (descending).
fn check_fields(fields: &[String]) -> Result<(), DeclareError> {
    if fields.is_empty() || fields.len() > MAX_FIELDS {
        return Err(DeclareError::Invalid("/fields".into(), format!("an index has 1 to {MAX_FIELDS} fields")));
    }
    let mut seen = std::collections::HashSet::new();
    for (i, field) in fields.iter().enumerate() {
        let path = field.strip_prefix('-').unwrap_or(field);
        crate::query::filter::check_path(path, "")
            .map_err(|e| DeclareError::Invalid(format!("/fields/{i}"), e.message))?;
        if !seen.insert(path) {
            return Err(DeclareError::Invalid(format!("/fields/{i}"), format!("{path:?} appears twice")));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn suggested_names_follow_the_name_rules_and_avoid_taken_ones() {
        use super::free_name;
        let fields = |f: &[&str]| f.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        assert_eq!(free_name(&fields(&["status", "-amount"]), |_| false), "status_amount_desc");
        assert_eq!(free_name(&fields(&["a.b"]), |_| false), "a_b");
        assert!(crate::document::rules::is_collection_name(&free_name(&fields(&["9x"]), |_| false)));
        // Taken (by an index on other fields, or one being dropped): the
        // next free one.
        assert_eq!(free_name(&fields(&["a.b"]), |n| n == "a_b"), "a_b_2");
        assert_eq!(free_name(&fields(&["a.b"]), |n| ["a_b", "a_b_2"].contains(&n)), "a_b_3");
        // A long name keeps to 64 characters, its suffix included.
        let long = "x".repeat(100);
        let first = free_name(&fields(&[&long]), |_| false);
        assert_eq!(first.len(), 64);
        let next = free_name(&fields(&[&long]), |n| n == first);
        assert_eq!(next.len(), 64);
        assert!(next.ends_with("_2") && crate::document::rules::is_collection_name(&next), "{next}");
    }

    use std::sync::atomic::{AtomicBool, Ordering};

    use tokio::sync::Notify;

    use super::*;
    use crate::store::Store;
    use crate::store::layer::{Layer, Layered, Op};
    use crate::store::memory::MemoryStore;

    /// Holds an armed scan of the declarations after it has read them,
    /// until released: a read that ends after what follows it.
    #[derive(Default)]
    struct Gate {
        armed: AtomicBool,
        read: Notify,
        release: Notify,
    }

    impl Layer for Gate {
        async fn around<T: Send>(
            &self,
            _below: &dyn Store,
            op: &Op<'_>,
            run: impl Future<Output = StoreResult<T>> + Send,
        ) -> StoreResult<T> {
            let out = run.await;
            if op.name == "scan" && op.coll == INDEXES && self.armed.swap(false, Ordering::SeqCst) {
                self.read.notify_one();
                self.release.notified().await;
            }
            out
        }
    }

    fn setup() -> (Arc<Layered<Gate>>, Arc<Indexes>) {
        let store = Arc::new(Layered::new(Arc::new(MemoryStore::default()), Gate::default()));
        let indexes = Indexes::new(Arc::clone(&store) as DynStore, Clock::System);
        (store, indexes)
    }

    /// What another instance's build does when it ends: the declaration
    /// becomes ready in the store, and this instance's cache is not told.
    async fn made_ready_elsewhere(store: &dyn Store, d: &Declaration) {
        let ready = Declaration { state: State::Ready, ..d.clone() };
        assert!(store.replace(INDEXES, &d.key, crate::store::Document::new(), ready.record()).await.unwrap());
    }

    #[tokio::test]
    async fn a_read_that_began_before_a_declaration_is_not_cached() {
        let (store, indexes) = setup();
        store.layer().armed.store(true, Ordering::SeqCst);
        let reader = tokio::spawn({
            let indexes = Arc::clone(&indexes);
            async move { indexes.declared("c").await.unwrap().len() }
        });
        store.layer().read.notified().await;
        indexes.declare("c", "a", vec!["a".into()], false).await.unwrap();
        store.layer().release.notify_one();
        assert_eq!(reader.await.unwrap(), 0, "the read saw the state before");
        // The state before is not what this instance knows now.
        assert_eq!(indexes.declared("c").await.unwrap().len(), 1);
    }

    #[tokio::test]
    async fn a_query_is_planned_on_an_index_ready_anywhere() {
        let (store, indexes) = setup();
        let (d, _) = indexes.declare("c", "a", vec!["a".into()], false).await.unwrap();
        // Cached while building: nothing serves a filter on `a`.
        assert_eq!(indexes.declared("c").await.unwrap()[0].state, State::Building);
        let filter = crate::query::filter::Filter::parse(&serde_json::json!({"a": 1})).unwrap();
        made_ready_elsewhere(store.as_ref(), &d).await;
        let planned = indexes.plan("c", Planning::Count { filter: &filter }).await.unwrap();
        assert!(planned.is_ok(), "an index the store holds ready is not refused");
        // A plan that no index serves is still refused.
        let other = crate::query::filter::Filter::parse(&serde_json::json!({"b": 1})).unwrap();
        let refused = indexes.plan("c", Planning::Count { filter: &other }).await.unwrap();
        assert!(refused.is_err());
    }

    #[tokio::test(start_paused = true)]
    async fn declarations_in_one_millisecond_never_share_a_store_name() {
        let store: DynStore = Arc::new(MemoryStore::default());
        let indexes = Indexes::new(Arc::clone(&store), Clock::following_tokio());
        let (a, _) = indexes.declare("a", "email", vec!["email".into()], true).await.unwrap();
        let (b, _) = indexes.declare("b", "email", vec!["email".into()], true).await.unwrap();
        assert_eq!(a.created_at, b.created_at, "one millisecond");
        assert_ne!(a.physical, b.physical);
        assert!(indexes.delete("a", "email").await.unwrap());
        let (again, _) = indexes.declare("a", "email", vec!["other".into()], true).await.unwrap();
        assert_eq!(again.created_at, a.created_at);
        assert_ne!(again.physical, a.physical, "declared again after its delete");
    }

    #[tokio::test]
    async fn store_names_an_earlier_release_shared_are_separated_once() {
        let store: DynStore = Arc::new(MemoryStore::default());
        let indexes = Indexes::new(Arc::clone(&store), Clock::System);
        let mut declared = Vec::new();
        for coll in ["a", "b", "c"] {
            declared.push(indexes.declare(coll, "email", vec!["email".into()], true).await.unwrap().0);
        }
        // a and b under one name, as two declarations in one millisecond
        // were; c deleted and declared again within one.
        let shared = declared[0].physical.clone();
        let b = Declaration { physical: shared.clone(), state: State::Ready, ..declared[1].clone() };
        assert!(store.replace(INDEXES, &b.key, crate::store::Document::new(), b.record()).await.unwrap());
        let c_old = declared[2].physical.clone();
        assert!(indexes.delete("c", "email").await.unwrap());
        let (c, _) = indexes.declare("c", "email", vec!["email".into()], true).await.unwrap();
        let c = Declaration { physical: c_old.clone(), ..c };
        assert!(store.replace(INDEXES, &c.key, crate::store::Document::new(), c.record()).await.unwrap());

        assert_eq!(indexes.separate_shared().await.unwrap(), 3);
        let now = |coll: &'static str| {
            let indexes = Arc::clone(&indexes);
            async move { indexes.get(coll, "email").await.unwrap().unwrap() }
        };
        let (a2, b2, c2) = (now("a").await, now("b").await, now("c").await);
        for d in [&a2, &b2] {
            assert_ne!(d.physical, shared, "{}", d.coll);
            assert_eq!(d.state, State::Building, "{}", d.coll);
        }
        assert_ne!(a2.physical, b2.physical);
        assert_ne!(c2.physical, c_old);
        // The shared names are left to be dropped, each on its collection.
        for (coll, name) in [("a", &shared), ("b", &shared), ("c", &c_old)] {
            let dropping = store.get(INDEXES, &format!("{coll}/email#{name}")).await.unwrap();
            let dropping = Declaration::from_record(dropping.expect("a record to drop")).unwrap();
            assert_eq!((dropping.state, dropping.coll.as_str()), (State::Dropping, coll));
        }
        assert_eq!(indexes.separate_shared().await.unwrap(), 0, "nothing is shared any more");
    }
}

//! Per-collection JSON Schemas (docs/guides/validation.md): one schema per
//! document `schema_version`, declared by an admin, checked against the
//! document every write would produce, before anything is written.
//!
//! The declarations of a collection are one record in `_schemas`; each
//! instance knows them from a cache at most [`CACHE_TTL`] old, so a
//! declaration is `pending` until [`SETTLE`] after it was written (by
//! then every instance applies it) and `active` from then on. Every write
//! to the record is a compare-and-set on its `seq`, so two admins' `PUT`s
//! never lose one another. A collection with schemas takes writes of its
//! declared versions only.

pub(crate) mod compile;

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

pub(crate) use compile::{Compiled, Violation};

use crate::clock::Clock;
use crate::document::rules::Invalid;
use crate::store::{DateTime, Document, DynStore, StoreError, StoreResult, Update};

/// The collection of schema records.
pub(crate) const SCHEMAS: &str = "_schemas";
/// The version of a schema record's format.
const FORMAT: i32 = 1;
/// How old an instance's knowledge of a collection's schemas may be.
pub(crate) const CACHE_TTL: Duration = Duration::from_secs(1);
/// How long after its declaration a schema is `active`: every instance's
/// cache has it by then, with a margin for a write under way.
pub(crate) const SETTLE: Duration = Duration::from_millis(2 * 1000 + 200);
/// The most schema versions a collection may declare.
pub(crate) const MAX_VERSIONS: usize = 32;

/// How a collection's writes meet its schemas.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Validation {
    /// Every write must produce a valid document (422 `schema_violation`).
    #[default]
    Strict,
    /// Invalid documents are written, counted and logged.
    Warn,
    /// As strict, except that a write to a document that was invalid
    /// already is not checked.
    Moderate,
}

/// A declaration's state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub(crate) enum State {
    /// Written; some instance may not apply it yet.
    Pending,
    /// Every instance applies it.
    Active,
}

#[derive(Serialize, Deserialize, Clone)]
struct StoredVersion {
    version: i64,
    revision: i64,
    /// The schema as declared (JSON: `$ref` is no name MongoDB stores).
    schema: String,
    declared_at: DateTime,
}

#[derive(Serialize, Deserialize)]
struct SchemaRecord {
    #[serde(rename = "_id")]
    collection: String,
    v: i32,
    /// Moves on with every change: the compare-and-set of the next one.
    seq: i64,
    /// The `seq` of the last change of the versions (not of `validation`):
    /// what a violations pass checks against.
    #[serde(default)]
    schemas_seq: i64,
    validation: Validation,
    validation_at: DateTime,
    versions: Vec<StoredVersion>,
}

/// One declared schema version, compiled.
#[derive(Debug)]
pub struct Declared {
    pub version: i64,
    pub revision: i64,
    pub declared_at: DateTime,
    pub schema: Arc<Value>,
    /// `Err`: the schema as stored no longer compiles (why): writes of
    /// this version are refused until it is declared again.
    pub compiled: Result<Arc<Compiled>, String>,
}

/// A collection's schemas as an instance knows them.
#[derive(Debug, Default)]
pub struct Known {
    pub seq: i64,
    /// The `seq` of the last change of the versions.
    pub schemas_seq: i64,
    pub validation: Validation,
    pub validation_at: Option<DateTime>,
    pub versions: BTreeMap<i64, Arc<Declared>>,
    /// The instance's counts of refusals and warnings.
    pub(crate) counts: Arc<Counts>,
}

/// Writes refused for their schema, and writes let through under `warn`,
/// since the instance started (`txgate_schema_refusals_total`,
/// `txgate_schema_warnings_total`): each counted once its outcome is known,
/// however many times it was checked on the way (a retried write, a
/// transaction's tries).
#[derive(Debug, Default)]
pub(crate) struct Counts {
    pub refused: AtomicU64,
    pub warned: AtomicU64,
}

/// A document let through under `warn`: counted and logged once the write
/// that holds it lands ([`Warned::landed`]), not when it was checked.
#[derive(Debug)]
pub(crate) struct Warned {
    id: String,
    refusal: Refusal,
    counts: Arc<Counts>,
}

impl Warned {
    /// The write landed: count it and log it with the document's id.
    pub(crate) fn landed(self) {
        self.counts.warned.fetch_add(1, Ordering::Relaxed);
        let first = self.refusal.violations.first();
        tracing::warn!(
            collection = self.refusal.collection,
            id = self.id,
            schema_version = self.refusal.schema_version,
            errors = self.refusal.violations.len() + self.refusal.more,
            pointer = first.map_or("", |v| v.pointer.as_str()),
            keyword = first.map_or("", |v| v.keyword.as_str()),
            "a document that does not satisfy its schema was written (validation: warn)"
        );
    }
}

/// The warnings of a transaction's members, by (collection, id), as their
/// last check left them: landed once, if the transaction commits.
#[derive(Debug, Default)]
pub struct Warnings(Mutex<HashMap<(String, String), Warned>>);

impl Warnings {
    /// The outcome of a member's latest check (`None`: no warning).
    pub(crate) fn checked(&self, coll: &str, id: &str, warned: Option<Warned>) {
        let mut kept = self.0.lock().expect("warnings");
        match warned {
            Some(w) => {
                kept.insert((coll.to_owned(), id.to_owned()), w);
            }
            None => {
                kept.remove(&(coll.to_owned(), id.to_owned()));
            }
        }
    }

    /// The transaction committed: every warning kept lands.
    pub(crate) fn landed(&self) {
        let kept = std::mem::take(&mut *self.0.lock().expect("warnings"));
        for (_, warned) in kept {
            warned.landed();
        }
    }
}

/// A write refused (or, under `warn`, let through) for its schema.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    pub collection: String,
    pub schema_version: i64,
    pub violations: Vec<Violation>,
    /// Violations beyond those listed.
    pub more: usize,
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let n = self.violations.len() + self.more;
        let s = if n == 1 { "" } else { "s" };
        write!(
            f,
            "the document does not satisfy schema version {} of {} ({n} error{s})",
            self.schema_version, self.collection
        )
    }
}

impl Known {
    /// Whether the collection has schemas at all.
    pub(crate) fn any(&self) -> bool {
        !self.versions.is_empty()
    }

    /// How `data`, of schema version `sv`, fails the schemas (`None`: it
    /// satisfies them, or the collection has none).
    pub(crate) fn violations(&self, coll: &str, sv: i64, data: &Document) -> Option<Refusal> {
        if !self.any() {
            return None;
        }
        let refusal = |violations, more| Refusal { collection: coll.to_owned(), schema_version: sv, violations, more };
        let Some(declared) = self.versions.get(&sv) else {
            let declared: Vec<String> = self.versions.keys().map(i64::to_string).collect();
            let detail = format!(
                "{coll} declares no schema for schema_version {sv} (declared: {}): write with one of those",
                declared.join(", ")
            );
            let v = Violation { pointer: String::new(), keyword: "schema_version".into(), detail };
            return Some(refusal(vec![v], 0));
        };
        let compiled = match &declared.compiled {
            Ok(c) => c,
            Err(why) => {
                let detail = format!("the declared schema no longer compiles ({why}): declare it again");
                let v = Violation { pointer: String::new(), keyword: "$schema".into(), detail };
                return Some(refusal(vec![v], 0));
            }
        };
        let json = Value::Object(crate::store::convert::document_to_object(data));
        let (violations, more) = compiled.violations(&json);
        (!violations.is_empty()).then(|| refusal(violations, more))
    }

    /// The check of a write of `coll` that produces `after` (data, schema
    /// version) from `before` (none for a create): the refusal, under
    /// `strict`, or `moderate` when `before` satisfied its schema.
    /// `Ok(Some)`: invalid but let through (`warn`).
    pub(crate) fn admit(
        &self,
        coll: &str,
        before: Option<(&Document, i64)>,
        (data, sv): (&Document, i64),
    ) -> Result<Option<Refusal>, Refusal> {
        let Some(refusal) = self.violations(coll, sv, data) else { return Ok(None) };
        match self.validation {
            Validation::Strict => Err(refusal),
            Validation::Warn => Ok(Some(refusal)),
            Validation::Moderate => match before {
                Some((data, sv)) if self.violations(coll, sv, data).is_some() => Ok(None),
                _ => Err(refusal),
            },
        }
    }
}

impl Known {
    /// [`Self::admit`], with a write let through under `warn` as a
    /// [`Warned`] to land once the write does. Nothing is counted here: a
    /// check may be made again (see [`Counts`]).
    pub(crate) fn judge(
        &self,
        coll: &str,
        before: Option<(&Document, i64)>,
        after: (&Document, i64),
        id: &str,
    ) -> Result<Option<Warned>, Refusal> {
        Ok(self.admit(coll, before, after)?.map(|refusal| Warned {
            id: id.to_owned(),
            refusal,
            counts: Arc::clone(&self.counts),
        }))
    }

    /// A refusal of this collection is a write's answer: count it.
    pub(crate) fn count_refusal(&self) {
        self.counts.refused.fetch_add(1, Ordering::Relaxed);
    }
}

/// Why schemas could not be declared.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SetError {
    #[error(transparent)]
    Invalid(#[from] Invalid),
    /// `If-Match` named another revision.
    #[error("schema version {version} is at revision {actual}")]
    Revision { version: i64, expected: i64, actual: i64 },
    #[error("the collection declares {MAX_VERSIONS} schema versions already; delete one first")]
    Limit,
    #[error("no schema version {0} is declared")]
    NotFound(i64),
    #[error(transparent)]
    Store(#[from] StoreError),
}

type Cached = (Instant, Arc<Known>);

/// Every collection's schemas, as this instance knows them.
pub(crate) struct Schemas {
    store: DynStore,
    clock: Clock,
    cache: Mutex<HashMap<String, Cached>>,
    generation: AtomicU64,
    counts: Arc<Counts>,
}

impl Schemas {
    pub(crate) fn new(store: DynStore, clock: Clock) -> Arc<Self> {
        Arc::new(Self { store, clock, cache: Mutex::default(), generation: AtomicU64::new(0), counts: Arc::default() })
    }

    /// The instance's counts of refusals and warnings.
    pub(crate) fn counts(&self) -> &Arc<Counts> {
        &self.counts
    }

    /// The state of a declaration made at `at`.
    pub(crate) fn state(&self, at: DateTime) -> State {
        if self.clock.now().timestamp_millis() >= active_at(at).timestamp_millis() {
            State::Active
        } else {
            State::Pending
        }
    }

    /// `coll`'s schemas, at most [`CACHE_TTL`] old.
    pub(crate) async fn of(&self, coll: &str) -> StoreResult<Arc<Known>> {
        let earlier = {
            let cache = self.cache.lock().expect("schemas cache");
            match cache.get(coll) {
                Some((at, known)) if at.elapsed() < CACHE_TTL => return Ok(Arc::clone(known)),
                Some((_, known)) => Some(Arc::clone(known)),
                None => None,
            }
        };
        let generation = self.generation.load(Ordering::SeqCst);
        let read = Instant::now();
        let known = Arc::new(self.load(coll, earlier.as_deref()).await?);
        let mut cache = self.cache.lock().expect("schemas cache");
        if self.generation.load(Ordering::SeqCst) == generation {
            if cache.len() > 10_000 {
                cache.clear();
            }
            cache.insert(coll.to_owned(), (read, Arc::clone(&known)));
        }
        Ok(known)
    }

    /// Check a single write of `coll` (see [`Known::judge`]); a refusal,
    /// the write's answer, is counted.
    pub(crate) async fn admit(
        &self,
        coll: &str,
        before: Option<(&Document, i64)>,
        after: (&Document, i64),
        id: &str,
    ) -> StoreResult<Result<Option<Warned>, Refusal>> {
        let known = self.of(coll).await?;
        let judged = known.judge(coll, before, after, id);
        if judged.is_err() {
            known.count_refusal();
        }
        Ok(judged)
    }

    /// `coll`'s schemas as the store holds them now (reusing what
    /// `earlier` compiled of the same revisions). A record that cannot be
    /// read refuses every write of the collection, and is reported.
    async fn load(&self, coll: &str, earlier: Option<&Known>) -> StoreResult<Known> {
        let counts = Arc::clone(&self.counts);
        let Some(record) = self.read(coll).await? else { return Ok(Known { counts, ..Known::default() }) };
        let mut versions = BTreeMap::new();
        for stored in record.versions {
            let reused = earlier
                .and_then(|k| k.versions.get(&stored.version))
                .filter(|d| d.revision == stored.revision && d.declared_at == stored.declared_at);
            let declared = match reused {
                Some(d) => Arc::clone(d),
                None => Arc::new(decode(coll, stored)),
            };
            versions.insert(declared.version, declared);
        }
        Ok(Known {
            seq: record.seq,
            schemas_seq: record.schemas_seq,
            validation: record.validation,
            validation_at: Some(record.validation_at),
            versions,
            counts,
        })
    }

    async fn read(&self, coll: &str) -> StoreResult<Option<SchemaRecord>> {
        let Some(record) = self.store.get(SCHEMAS, coll).await? else { return Ok(None) };
        match mongodb::bson::from_document::<SchemaRecord>(record) {
            Ok(r) if r.v == FORMAT => Ok(Some(r)),
            Ok(r) => Err(unreadable(coll, &format!("format {} is not {FORMAT}", r.v))),
            Err(e) => Err(unreadable(coll, &e.to_string())),
        }
    }

    fn forget(&self, coll: &str) {
        let mut cache = self.cache.lock().expect("schemas cache");
        self.generation.fetch_add(1, Ordering::SeqCst);
        cache.remove(coll);
    }

    /// Declare `schema` as version `version` of `coll`'s schemas (a new
    /// revision of it when it is declared already), if it is at revision
    /// `expected` (when given; 0: not declared).
    pub(crate) async fn declare(
        &self,
        coll: &str,
        version: i64,
        schema: &Value,
        expected: Option<i64>,
    ) -> Result<Arc<Declared>, SetError> {
        compile::compile(schema)?;
        let text = schema.to_string();
        self.change(coll, |record, now| {
            let at = record.versions.iter().position(|v| v.version == version);
            let actual = at.map_or(0, |i| record.versions[i].revision);
            if let Some(expected) = expected.filter(|e| *e != actual) {
                return Err(SetError::Revision { version, expected, actual });
            }
            let next = StoredVersion { version, revision: actual + 1, schema: text.clone(), declared_at: now };
            match at {
                Some(i) => record.versions[i] = next,
                None if record.versions.len() >= MAX_VERSIONS => return Err(SetError::Limit),
                None => record.versions.push(next),
            }
            record.versions.sort_by_key(|v| v.version);
            record.schemas_seq = record.seq + 1;
            Ok(())
        })
        .await?;
        let known = self.of(coll).await?;
        known.versions.get(&version).cloned().ok_or(SetError::NotFound(version))
    }

    /// Remove version `version` of `coll`'s schemas.
    pub(crate) async fn remove(&self, coll: &str, version: i64) -> Result<(), SetError> {
        self.change(coll, |record, _| {
            let before = record.versions.len();
            record.versions.retain(|v| v.version != version);
            record.schemas_seq = record.seq + 1;
            if record.versions.len() == before { Err(SetError::NotFound(version)) } else { Ok(()) }
        })
        .await?;
        Ok(())
    }

    /// Set how `coll`'s writes meet its schemas.
    pub(crate) async fn set_validation(&self, coll: &str, validation: Validation) -> Result<Arc<Known>, SetError> {
        self.change(coll, |record, now| {
            if record.validation != validation {
                record.validation = validation;
                record.validation_at = now;
            }
            Ok(())
        })
        .await?;
        Ok(self.of(coll).await?)
    }

    /// Apply `edit` to `coll`'s record, a compare-and-set on its `seq`
    /// retried until it lands (or `edit` refuses).
    async fn change(
        &self,
        coll: &str,
        edit: impl Fn(&mut SchemaRecord, DateTime) -> Result<(), SetError>,
    ) -> Result<(), SetError> {
        loop {
            let now = self.clock.now();
            let existing = match self.read(coll).await {
                Ok(r) => r,
                Err(StoreError::Undecodable(why)) => {
                    // Replaced whole: the admin's declaration is what is wanted.
                    tracing::warn!(collection = coll, error = %why, "unreadable schemas record replaced");
                    self.store.delete(SCHEMAS, coll, crate::store::shape::any()).await?;
                    None
                }
                Err(e) => return Err(e.into()),
            };
            let fresh = existing.is_none();
            let mut record = existing.unwrap_or_else(|| SchemaRecord {
                collection: coll.to_owned(),
                v: FORMAT,
                seq: 0,
                schemas_seq: 0,
                validation: Validation::default(),
                validation_at: now,
                versions: Vec::new(),
            });
            let seq = record.seq;
            edit(&mut record, now)?;
            record.seq = seq + 1;
            let doc = mongodb::bson::to_document(&record).expect("a schema record serializes");
            let written = if fresh {
                self.store.insert(SCHEMAS, doc).await?
            } else {
                let mut set = doc;
                set.remove("_id");
                let filter = mongodb::bson::doc! {"seq": seq};
                self.store.update(SCHEMAS, coll, filter, Update { set, unset: Vec::new() }).await?
            };
            if written {
                self.forget(coll);
                tracing::info!(collection = coll, seq = seq + 1, "schemas changed");
                return Ok(());
            }
        }
    }
}

/// When a declaration made at `at` is active.
pub(crate) fn active_at(at: DateTime) -> DateTime {
    let settle = i64::try_from(SETTLE.as_millis()).unwrap_or(i64::MAX);
    DateTime::from_millis(at.timestamp_millis().saturating_add(settle))
}

fn decode(coll: &str, stored: StoredVersion) -> Declared {
    let parsed: Result<Value, String> = serde_json::from_str(&stored.schema).map_err(|e| e.to_string());
    let compiled = parsed
        .as_ref()
        .map_err(Clone::clone)
        .and_then(|schema| compile::compile(schema).map(Arc::new).map_err(|e| format!("{}: {}", e.pointer, e.message)));
    if let Err(why) = &compiled {
        tracing::error!(collection = coll, version = stored.version, error = %why, "a declared schema cannot be used: writes of its version are refused");
    }
    Declared {
        version: stored.version,
        revision: stored.revision,
        declared_at: stored.declared_at,
        schema: Arc::new(parsed.unwrap_or(Value::Null)),
        compiled,
    }
}

fn unreadable(coll: &str, why: &str) -> StoreError {
    let err = StoreError::Undecodable(format!("{SCHEMAS}/{coll}: {why}"));
    crate::store::report_unreadable(&err);
    err
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn known(validation: Validation) -> Known {
        let schema = json!({"type": "object", "properties": {"total": {"type": "number", "minimum": 0}}});
        let declared = Declared {
            version: 1,
            revision: 1,
            declared_at: DateTime::from_millis(0),
            compiled: Ok(Arc::new(compile::compile(&schema).expect("compiles"))),
            schema: Arc::new(schema),
        };
        let versions = BTreeMap::from([(1, Arc::new(declared))]);
        Known { seq: 1, schemas_seq: 1, validation, validation_at: None, versions, counts: Arc::default() }
    }

    fn doc(total: i64) -> Document {
        mongodb::bson::doc! {"total": total}
    }

    #[test]
    fn each_validation_judges_as_documented() {
        let (good, bad) = (doc(1), doc(-1));
        let strict = known(Validation::Strict);
        assert!(strict.admit("c", None, (&good, 1)).is_ok_and(|w| w.is_none()));
        let refused = strict.admit("c", Some((&bad, 1)), (&bad, 1)).expect_err("refused");
        assert_eq!(refused.violations[0].pointer, "/total");
        // Warn: let through, said.
        assert!(known(Validation::Warn).admit("c", None, (&bad, 1)).is_ok_and(|w| w.is_some()));
        // Moderate: a document invalid already is not checked, a valid one is.
        let moderate = known(Validation::Moderate);
        assert!(moderate.admit("c", Some((&bad, 1)), (&bad, 1)).is_ok());
        assert!(moderate.admit("c", Some((&good, 1)), (&bad, 1)).is_err());
        assert!(moderate.admit("c", None, (&bad, 1)).is_err());
        // A version with no schema is refused where there are schemas...
        let undeclared = strict.admit("c", None, (&good, 7)).expect_err("undeclared");
        assert_eq!(undeclared.violations[0].keyword, "schema_version");
        // ...and anything goes where there are none.
        assert!(Known::default().admit("c", None, (&bad, 7)).is_ok());
    }
}

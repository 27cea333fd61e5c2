//! The transaction record kept in `_txns`: the single document whose
//! `status` field is the commit point.

use serde::{Deserialize, Serialize};

use super::hook::Hook;
use crate::document::StagedOp;
use crate::store::{DateTime, Document, Durability, Record, Store, StoreError, StoreResult, Update, Write};

pub const TXNS: &str = "_txns";

/// `pending → committed → done`, or `pending → aborted → rolled_back`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    Pending,
    Committed,
    Done,
    Aborted,
    RolledBack,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Pending => "pending",
            Status::Committed => "committed",
            Status::Done => "done",
            Status::Aborted => "aborted",
            Status::RolledBack => "rolled_back",
        }
    }

    /// The status as stored (a scan's equality value).
    pub fn to_bson(self) -> crate::store::Bson {
        crate::store::Bson::String(self.as_str().to_owned())
    }

    /// Committed or done: the staged changes are the truth.
    pub fn is_committed(self) -> bool {
        matches!(self, Status::Committed | Status::Done)
    }
}

/// One document of the resolved worklist.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Member {
    pub collection: String,
    pub id: String,
    pub op: StagedOp,
    /// The version the change was computed from, once known (the
    /// `if_version` at prepare; the version read once locked).
    #[serde(default)]
    pub base_v: Option<i64>,
}

/// A member's version after the commit.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MemberResult {
    pub collection: String,
    pub id: String,
    pub version: i64,
}

/// Why a transaction could not commit (stored in its record).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FailureCode {
    VersionConflict,
    NotFound,
    Deleted,
    AlreadyExists,
    /// The lock wait ran out.
    Locked,
    /// Wounded, expired, superseded, timed out or aborted by an operator
    /// (`Failure::reason` says which).
    Aborted,
    /// A staged change cannot apply to the document as it is.
    InvalidChange,
    /// The document a member would produce does not satisfy its
    /// collection's schema (`Failure::errors` says how).
    SchemaViolation,
}

impl FailureCode {
    pub fn as_str(self) -> &'static str {
        match self {
            FailureCode::VersionConflict => "version_conflict",
            FailureCode::NotFound => "not_found",
            FailureCode::Deleted => "deleted",
            FailureCode::AlreadyExists => "already_exists",
            FailureCode::Locked => "locked",
            FailureCode::Aborted => "aborted",
            FailureCode::InvalidChange => "invalid_change",
            FailureCode::SchemaViolation => "schema_violation",
        }
    }
}

/// Why a transaction was aborted: what its record's `abort_reason` and its
/// 409's `reason` say, and what the protocol decides by.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AbortReason {
    /// An older transaction needed one of its locks (wound-wait).
    Wounded,
    /// Its lease ran out: its client or its instance stopped.
    Expired,
    /// It ran past its maximum duration.
    Timeout,
    /// An operator aborted it.
    Operator,
    /// The store failed before its commit point.
    StoreError,
    /// A later request with its Idempotency-Key took the key over.
    Superseded,
    /// Its commit could not be confirmed, and the abort settled it.
    CommitUnconfirmed,
    /// A member failed with this code.
    Failed(FailureCode),
}

impl AbortReason {
    const NAMED: [AbortReason; 7] = [
        AbortReason::Wounded,
        AbortReason::Expired,
        AbortReason::Timeout,
        AbortReason::Operator,
        AbortReason::StoreError,
        AbortReason::Superseded,
        AbortReason::CommitUnconfirmed,
    ];
    const FAILURES: [FailureCode; 7] = [
        FailureCode::VersionConflict,
        FailureCode::NotFound,
        FailureCode::Deleted,
        FailureCode::AlreadyExists,
        FailureCode::Locked,
        FailureCode::Aborted,
        FailureCode::InvalidChange,
    ];

    /// The reason as stored and answered.
    pub fn as_str(self) -> &'static str {
        match self {
            AbortReason::Wounded => "wounded",
            AbortReason::Expired => "expired",
            AbortReason::Timeout => "timeout",
            AbortReason::Operator => "operator",
            AbortReason::StoreError => "store_error",
            AbortReason::Superseded => "superseded",
            AbortReason::CommitUnconfirmed => "commit_unconfirmed",
            AbortReason::Failed(code) => code.as_str(),
        }
    }

    /// The reason a stored or answered string names, if it is one.
    pub fn parse(s: &str) -> Option<Self> {
        Self::NAMED.into_iter().chain(Self::FAILURES.into_iter().map(AbortReason::Failed)).find(|r| r.as_str() == s)
    }
}

/// Why a transaction did not commit, as answered to the client.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Failure {
    pub code: FailureCode,
    pub detail: String,
    #[serde(default)]
    pub action: Option<i64>,
    #[serde(default)]
    pub collection: Option<String>,
    #[serde(default)]
    pub id: Option<String>,
    #[serde(default)]
    pub expected: Option<i64>,
    #[serde(default)]
    pub actual: Option<i64>,
    #[serde(default)]
    pub retryable: bool,
    #[serde(default)]
    pub holder: Option<String>,
    /// For `aborted`: why (`wounded`, `expired`, `operator`, ...).
    #[serde(default)]
    pub reason: Option<String>,
    /// For `schema_violation`: the schema version checked, and how the
    /// document fails it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schema_version: Option<i64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<crate::schemas::Violation>,
}

impl Failure {
    /// Why the transaction was aborted, when this says and it is a reason
    /// this release knows.
    pub fn abort_reason(&self) -> Option<AbortReason> {
        self.reason.as_deref().and_then(AbortReason::parse)
    }

    /// A failure with `code`, nothing else known yet.
    pub fn new(code: FailureCode, detail: impl Into<String>, retryable: bool) -> Self {
        Self {
            code,
            detail: detail.into(),
            action: None,
            collection: None,
            id: None,
            expected: None,
            actual: None,
            retryable,
            holder: None,
            reason: None,
            schema_version: None,
            errors: Vec::new(),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TxnRecord {
    #[serde(rename = "_id")]
    pub id: String,
    pub status: Status,
    pub started_at: DateTime,
    pub expires_at: DateTime,
    #[serde(default)]
    pub committed_at: Option<DateTime>,
    #[serde(default)]
    pub finished_at: Option<DateTime>,
    /// The request body exactly as the client sent it.
    pub request: String,
    pub members: Vec<Member>,
    #[serde(default)]
    pub results: Option<Vec<MemberResult>>,
    #[serde(default)]
    pub idempotency_key: Option<String>,
    #[serde(default)]
    pub abort_reason: Option<String>,
    #[serde(default)]
    pub failure: Option<Failure>,
    /// How many hooks the request has.
    #[serde(default)]
    pub hook_count: i64,
    /// The hooks, as validated when the request was accepted (a record
    /// written by an earlier version has none here: see [`TxnRecord::hooks`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hooks: Vec<Hook>,
    /// The name of the API key that sent it (none without API keys, and
    /// in records written before keys had names).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// The user who sent it, when a user's token did (none in records
    /// written before users).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<crate::actor::UserId>,
}

impl TxnRecord {
    /// Why it was aborted, when it was and the reason is one this release
    /// knows.
    pub fn reason(&self) -> Option<AbortReason> {
        self.abort_reason.as_deref().and_then(AbortReason::parse)
    }

    /// The validated hooks; for a record written before they were kept in
    /// it, those of the stored request.
    pub fn hooks(&self) -> Vec<Hook> {
        if self.hooks.len() as i64 >= self.hook_count {
            self.hooks.clone()
        } else {
            super::hook::hooks_of(&self.request)
        }
    }

    pub fn from_record(record: Record) -> Result<Self, StoreError> {
        mongodb::bson::from_document(record).map_err(|e| StoreError::Internal(format!("bad transaction record: {e}")))
    }

    /// The record that fences attempt `id` out before its Idempotency-Key
    /// is taken over: aborted, with no members, so the attempt can neither
    /// insert its own record nor commit.
    pub fn fenced(id: &str, at: DateTime) -> Self {
        Self {
            id: id.to_owned(),
            status: Status::Aborted,
            started_at: at,
            expires_at: at,
            committed_at: None,
            finished_at: Some(at),
            request: String::new(),
            members: Vec::new(),
            results: None,
            idempotency_key: None,
            abort_reason: Some(AbortReason::Superseded.as_str().into()),
            failure: None,
            hook_count: 0,
            hooks: Vec::new(),
            key: None,
            user: None,
        }
    }

    /// The record as stored: the fields serde writes, in its order (`None`
    /// as null, `hooks`, `key` and `user` only when there are some), built
    /// directly where a transaction's path writes them (members, results,
    /// dates); a failure and hooks, rare, go through serde.
    pub fn to_record(&self) -> Record {
        use crate::store::Bson;
        let date = |d: Option<DateTime>| d.map_or(Bson::Null, Bson::DateTime);
        let text = |s: &Option<String>| s.clone().map_or(Bson::Null, Bson::String);
        fn serde<T: Serialize>(value: &T) -> Bson {
            mongodb::bson::to_bson(value).expect("a transaction record's part serializes")
        }
        let mut rec = Record::new();
        rec.insert("_id", self.id.as_str());
        rec.insert("status", self.status.to_bson());
        rec.insert("started_at", self.started_at);
        rec.insert("expires_at", self.expires_at);
        rec.insert("committed_at", date(self.committed_at));
        rec.insert("finished_at", date(self.finished_at));
        rec.insert("request", self.request.as_str());
        let members: Vec<Bson> = self
            .members
            .iter()
            .map(|m| {
                Bson::Document(crate::store::doc! {
                    "collection": m.collection.as_str(),
                    "id": m.id.as_str(),
                    "op": m.op.as_str(),
                    "base_v": m.base_v.map_or(Bson::Null, Bson::Int64),
                })
            })
            .collect();
        rec.insert("members", members);
        let results = self.results.as_ref().map_or(Bson::Null, |results| {
            Bson::Array(
                results
                    .iter()
                    .map(|r| {
                        Bson::Document(crate::store::doc! {
                            "collection": r.collection.as_str(),
                            "id": r.id.as_str(),
                            "version": r.version,
                        })
                    })
                    .collect(),
            )
        });
        rec.insert("results", results);
        rec.insert("idempotency_key", text(&self.idempotency_key));
        rec.insert("abort_reason", text(&self.abort_reason));
        rec.insert("failure", self.failure.as_ref().map_or(Bson::Null, serde));
        rec.insert("hook_count", self.hook_count);
        if !self.hooks.is_empty() {
            rec.insert("hooks", serde(&self.hooks));
        }
        if let Some(key) = &self.key {
            rec.insert("key", key.as_str());
        }
        if let Some(user) = &self.user {
            rec.insert("user", serde(user));
        }
        rec
    }
}

/// A change of a transaction record, each a compare-and-set on its status
/// (the protocol's state machine, written only here).
pub(crate) enum Transition<'a> {
    /// A pending record's lease, extended.
    Heartbeat { expires_at: DateTime },
    /// The commit point: pending to committed, with the members' versions.
    Commit { at: DateTime, results: &'a [MemberResult], members: &'a [Member] },
    /// Pending to aborted. `lease`, when given, pins the lease judged
    /// expired, so a heartbeat that landed first wins.
    Abort { reason: AbortReason, failure: Option<&'a Failure>, lease: Option<DateTime> },
    /// Committed to done, or aborted to rolled back.
    Finish { from: Status, at: DateTime },
}

/// The fields the transitions of a record match and set, as stored.
mod shapes {
    use serde::Serialize;

    use super::{Failure, Member, MemberResult, Status};
    use crate::store::DateTime;

    /// In `status`; with `expires_at`, holding that lease.
    #[derive(Serialize)]
    pub(super) struct InStatus {
        pub status: Status,
        #[serde(skip_serializing_if = "Option::is_none")]
        pub expires_at: Option<DateTime>,
    }

    #[derive(Serialize)]
    pub(super) struct Lease {
        pub expires_at: DateTime,
    }

    #[derive(Serialize)]
    pub(super) struct Committing<'a> {
        pub status: Status,
        pub committed_at: DateTime,
        pub results: &'a [MemberResult],
        pub members: &'a [Member],
    }

    #[derive(Serialize)]
    pub(super) struct Aborting<'a> {
        pub status: Status,
        pub abort_reason: &'a str,
        pub finished_at: Option<DateTime>,
        #[serde(skip_serializing_if = "Option::is_none")]
        pub failure: Option<&'a Failure>,
    }

    #[derive(Serialize)]
    pub(super) struct Finishing {
        pub status: Status,
        pub finished_at: DateTime,
    }
}

impl Transition<'_> {
    /// The filter and update of this change.
    pub(crate) fn cas(&self) -> (Document, Update) {
        use crate::store::shape::fields;
        let pending = shapes::InStatus { status: Status::Pending, expires_at: None };
        match self {
            Transition::Heartbeat { expires_at } => {
                (fields(&pending), Update::fields(&shapes::Lease { expires_at: *expires_at }))
            }
            Transition::Commit { at, results, members } => {
                let set = shapes::Committing { status: Status::Committed, committed_at: *at, results, members };
                (fields(&pending), Update::fields(&set))
            }
            Transition::Abort { reason, failure, lease } => {
                let filter = shapes::InStatus { status: Status::Pending, expires_at: *lease };
                let set = shapes::Aborting {
                    status: Status::Aborted,
                    abort_reason: reason.as_str(),
                    finished_at: None,
                    failure: *failure,
                };
                (fields(&filter), Update::fields(&set))
            }
            Transition::Finish { from, at } => {
                let to = if *from == Status::Committed { Status::Done } else { Status::RolledBack };
                let filter = shapes::InStatus { status: *from, expires_at: None };
                (fields(&filter), Update::fields(&shapes::Finishing { status: to, finished_at: *at }))
            }
        }
    }

    /// Whether this change must be durable before it returns
    /// (docs/design.md §1): the commit point, and an operator's abort (the operator is
    /// told). Everything else is implied by a synced write or redone by
    /// recovery: a lost heartbeat or abort leaves a pending record that
    /// recovery aborts, a lost finish is finished again.
    pub(crate) fn durability(&self) -> Durability {
        match self {
            Transition::Commit { .. } => Durability::Synced,
            Transition::Abort { reason: AbortReason::Operator, .. } => Durability::Synced,
            _ => Durability::Unsynced,
        }
    }

    /// Apply this change to record `id`: whether this compare-and-set made it.
    pub(crate) async fn apply(&self, store: &dyn Store, id: &str) -> StoreResult<bool> {
        let (filter, update) = self.cas();
        store.write(TXNS, Write::Update { id, filter, update }, self.durability()).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A record built directly is what serde writes, field for field and in
    /// its order, with and without every optional part, and reads back.
    #[test]
    fn a_record_is_written_as_serde_writes_it() {
        let at = DateTime::from_millis(1_700_000_000_123);
        let request = r#"{"actions":[],"hooks":[{"url":"https://h.example/x","headers":{"a":"b"},"body":{"k":1}}]}"#;
        let mut cases = 0;
        for status in [Status::Pending, Status::Committed, Status::Aborted, Status::Done, Status::RolledBack] {
            for mask in 0..256u32 {
                let bit = |i: u32| mask & (1 << i) != 0;
                let record = TxnRecord {
                    id: "t-1".into(),
                    status,
                    started_at: at,
                    expires_at: DateTime::from_millis(1_700_000_030_000),
                    committed_at: bit(0).then_some(at),
                    finished_at: bit(1).then_some(at),
                    request: request.into(),
                    members: vec![
                        Member { collection: "a".into(), id: "1".into(), op: StagedOp::Update, base_v: Some(3) },
                        Member { collection: "b".into(), id: "2".into(), op: StagedOp::Insert, base_v: None },
                    ]
                    .into_iter()
                    .take(if bit(2) { 2 } else { 0 })
                    .collect(),
                    results: bit(3).then(|| vec![MemberResult { collection: "a".into(), id: "1".into(), version: 4 }]),
                    idempotency_key: bit(4).then(|| "k".into()),
                    abort_reason: bit(5).then(|| AbortReason::Superseded.as_str().into()),
                    failure: bit(5).then(|| Failure {
                        action: Some(1),
                        collection: Some("a".into()),
                        expected: Some(3),
                        ..Failure::new(FailureCode::VersionConflict, "moved", true)
                    }),
                    hook_count: if bit(6) { 1 } else { 0 },
                    hooks: if bit(6) { super::super::hook::hooks_of(request) } else { Vec::new() },
                    key: bit(7).then(|| "ops".into()),
                    user: bit(7).then(|| crate::actor::UserId::new("https://issuer.example", "s")),
                };
                let by_serde = mongodb::bson::to_document(&record).unwrap();
                let built = record.to_record();
                crate::store::assert_written_as_serde(&built, &by_serde);
                assert_eq!(TxnRecord::from_record(built).unwrap(), record);
                cases += 1;
            }
        }
        assert_eq!(cases, 5 * 256);
    }

    #[test]
    fn every_abort_reason_reads_back_as_itself() {
        let all = AbortReason::NAMED.into_iter().chain(AbortReason::FAILURES.into_iter().map(AbortReason::Failed));
        let mut seen = std::collections::HashSet::new();
        for reason in all {
            assert!(seen.insert(reason.as_str()), "{} is named twice", reason.as_str());
            assert_eq!(AbortReason::parse(reason.as_str()), Some(reason));
        }
        assert_eq!(AbortReason::parse("no such reason"), None);
    }
}

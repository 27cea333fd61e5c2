//! Idempotency keys (docs/design.md §3): `_idem/<scope>:<key>` is inserted if
//! absent before anything else, holding a hash of the body and the
//! transaction id. A commit or a non-retryable failure is stored and
//! answered again for the same key and body; a retryable failure frees the
//! key; a different body is refused.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

use std::sync::Arc;
use std::time::Duration;

use crate::clock::Clock;
use crate::store::shape::fields;
use crate::store::{DateTime, DynStore, StoreResult, Update};

use super::locks::Locks;
use super::record::{AbortReason, Status, TXNS, TxnRecord};

pub(crate) const IDEM: &str = "_idem";

/// What claiming a key found.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Claim {
    /// The key is ours: run the transaction.
    Fresh,
    /// A stored outcome: answer it again.
    Replay { status: u16, body: Value },
    /// The first request with this key is still running.
    InProgress { txn: String },
    /// The key was used with another body.
    Reused,
}

/// Whether the request holding a claim is still running or has answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum ClaimState {
    Running,
    Done,
}

/// The fields the changes of a claim match and set, as stored.
mod shapes {
    use serde::Serialize;

    use super::ClaimState;
    use crate::store::DateTime;

    /// Held by attempt `txn` (in `state`, when given).
    #[derive(Serialize)]
    pub(super) struct Held<'a> {
        pub txn: &'a str,
        #[serde(skip_serializing_if = "Option::is_none")]
        pub state: Option<ClaimState>,
    }

    #[derive(Serialize)]
    pub(super) struct Repointed<'a> {
        pub txn: &'a str,
        pub repointed_at: DateTime,
    }

    #[derive(Serialize)]
    pub(super) struct Done {
        pub state: ClaimState,
        pub status: i32,
        pub body: String,
    }
}

/// An idempotency claim as stored in `_idem`.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct ClaimRecord {
    /// `<scope>:<key>`.
    #[serde(rename = "_id")]
    key: String,
    /// Hash of the request body.
    hash: String,
    /// The attempt holding the claim.
    txn: String,
    state: ClaimState,
    created_at: DateTime,
    /// When the claim last moved to a new attempt (a wounded retry).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    repointed_at: Option<DateTime>,
    /// The stored answer, once `done`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    status: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    body: Option<String>,
}

impl ClaimRecord {
    fn from_record(record: crate::store::Record) -> StoreResult<Self> {
        mongodb::bson::from_document(record)
            .map_err(|e| crate::store::StoreError::Internal(format!("bad idempotency claim: {e}")))
    }

    fn to_record(&self) -> crate::store::Record {
        mongodb::bson::to_document(self).expect("an idempotency claim serializes")
    }

    /// The filter that holds while `txn` still holds the running claim.
    fn running(txn: &str) -> crate::store::Document {
        fields(&shapes::Held { txn, state: Some(ClaimState::Running) })
    }
}

/// The hash of a request body's meaning: independent of its whitespace,
/// of the order of the members of its objects and of how its numbers are
/// spelled (`100`, `1e2` and `100.0` are one number). The order of array
/// items counts: it is the order of a transaction's actions.
pub(crate) fn body_hash(body: &Value) -> String {
    let mut canonical = String::new();
    write_canonical(body, &mut canonical);
    hex(&Sha256::digest(canonical.as_bytes()))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// What identifies a request body for its Idempotency-Key: the hash of its
/// meaning ([`body_hash`]), and the hash releases before it stored (of the
/// body as parsed, members in their order), so that a claim stored by the
/// release before is still recognised when the same request is retried.
#[derive(Clone, Debug)]
pub struct Fingerprint {
    pub hash: String,
    earlier: String,
}

impl Fingerprint {
    pub fn of(body: &Value) -> Self {
        let earlier = hex(&Sha256::digest(serde_json::to_vec(body).expect("JSON serializes")));
        Self { hash: body_hash(body), earlier }
    }

    /// Whether a claim that stored `hash` was made for this body.
    fn matches(&self, hash: &str) -> bool {
        hash == self.hash || hash == self.earlier
    }
}

/// `value` in one canonical spelling: object members sorted by name,
/// integral numbers as integers, others in their shortest form. The
/// recursion is bounded by the parser's nesting limit (128).
fn write_canonical(value: &Value, out: &mut String) {
    match value {
        Value::Object(map) => {
            let mut members: Vec<_> = map.iter().collect();
            members.sort_by(|a, b| a.0.cmp(b.0));
            out.push('{');
            for (i, (name, v)) in members.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(name.clone()).to_string());
                out.push(':');
                write_canonical(v, out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, v) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(v, out);
            }
            out.push(']');
        }
        Value::Number(n) => out.push_str(&canonical_number(n)),
        other => out.push_str(&other.to_string()),
    }
}

fn canonical_number(n: &serde_json::Number) -> String {
    if n.is_i64() || n.is_u64() {
        return n.to_string();
    }
    let f = n.as_f64().unwrap_or(f64::NAN);
    // Integral and exactly representable: spelled as the integer it is.
    if f.fract() == 0.0 && f.abs() < 9_007_199_254_740_992.0 {
        return format!("{}", f as i64);
    }
    serde_json::Number::from_f64(f).map_or_else(|| n.to_string(), |n| n.to_string())
}

/// The idempotency service: claims on keys, moved along a request's
/// attempts, and the outcomes stored for them.
pub(crate) struct Idempotency {
    store: DynStore,
    clock: Clock,
    /// How long an abandoned claim holds its key (a lease).
    lease: Duration,
    locks: Arc<Locks>,
}

impl Idempotency {
    pub(super) fn new(store: DynStore, clock: Clock, lease: Duration, locks: Arc<Locks>) -> Arc<Self> {
        Arc::new(Self { store, clock, lease, locks })
    }

    fn now(&self) -> DateTime {
        self.clock.now()
    }

    /// Claim `key` for `txn` running a body with hash `hash`.
    pub(crate) async fn claim_key(&self, key: &str, fingerprint: &Fingerprint, txn: &str) -> StoreResult<Claim> {
        let hash = fingerprint.hash.as_str();
        loop {
            let fresh = ClaimRecord {
                key: key.to_owned(),
                hash: hash.to_owned(),
                txn: txn.to_owned(),
                state: ClaimState::Running,
                created_at: self.now(),
                repointed_at: None,
                status: None,
                body: None,
            };
            // Unsynced: a claim matters once its transaction commits, and
            // the commit is synced after it.
            if self.store.unsynced().insert(IDEM, fresh.to_record()).await? {
                return Ok(Claim::Fresh);
            }
            let Some(existing) = self.store.get(IDEM, key).await? else { continue };
            let existing = ClaimRecord::from_record(existing)?;
            if !fingerprint.matches(&existing.hash) {
                return Ok(Claim::Reused);
            }
            if existing.state == ClaimState::Done {
                let status = existing.status.and_then(|s| u16::try_from(s).ok()).unwrap_or(200);
                let body = existing.body.as_deref().and_then(|b| serde_json::from_str(b).ok()).unwrap_or(Value::Null);
                return Ok(Claim::Replay { status, body });
            }
            let holder = existing.txn.clone();
            match self.locks.record(&holder).await? {
                Some(rec) if rec.status.is_committed() => return self.replay_committed(key, &rec).await,
                Some(rec) if rec.status == Status::Pending => return Ok(Claim::InProgress { txn: holder }),
                // Aborted without a stored outcome: either its request is
                // retrying (it re-points the key within moments) or it ended
                // without storing one (it died, or could not learn whether
                // it committed); after a lease the key is free again.
                Some(rec) => {
                    let since = rec.finished_at.unwrap_or(rec.expires_at).timestamp_millis();
                    if self.now().timestamp_millis() - since < self.lease.as_millis() as i64 {
                        return Ok(Claim::InProgress { txn: holder });
                    }
                }
                // No record yet: the request is just starting (or its
                // attempt was just re-pointed), unless it has been that way
                // for longer than two leases.
                None => {
                    let since = existing.repointed_at.unwrap_or(existing.created_at).timestamp_millis();
                    if self.now().timestamp_millis() - since <= 2 * self.lease.as_millis() as i64 {
                        return Ok(Claim::InProgress { txn: holder });
                    }
                }
            }
            // Take the key over, but first make sure the attempt holding it
            // can never commit: a stalled request whose writes land late
            // finds its record already aborted.
            if let Some(rec) = self.fence(&holder).await?
                && rec.status.is_committed()
            {
                return self.replay_committed(key, &rec).await;
            }
            if self.store.unsynced().replace(IDEM, key, ClaimRecord::running(&holder), fresh.to_record()).await? {
                return Ok(Claim::Fresh);
            }
        }
    }

    async fn replay_committed(&self, key: &str, rec: &TxnRecord) -> StoreResult<Claim> {
        let body = super::answer::CommittedOut::of(rec).to_json();
        self.complete_key(key, &rec.id, 200, &body).await?;
        Ok(Claim::Replay { status: 200, body })
    }

    /// Finalize attempt `old` before its key moves on: insert its record as
    /// aborted if it has none, else CAS it `pending → aborted`. `None` when
    /// the fencing record was inserted; else the record as it is afterwards
    /// (a committed one keeps its outcome).
    async fn fence(&self, old: &str) -> StoreResult<Option<TxnRecord>> {
        if self.store.unsynced().insert(TXNS, TxnRecord::fenced(old, self.now()).to_record()).await? {
            tracing::info!(txn.id = %old, "idempotency key taken over; attempt fenced");
            return Ok(None);
        }
        self.locks.abort_pending(old, None, AbortReason::Superseded).await
    }

    /// Move the claim on `key` from attempt `from` to attempt `to`, once
    /// `from` can no longer commit.
    pub(crate) async fn repoint_key(&self, key: &str, from: &str, to: &str) -> StoreResult<bool> {
        if self.fence(from).await?.is_some_and(|rec| rec.status.is_committed()) {
            return Ok(false);
        }
        let set = shapes::Repointed { txn: to, repointed_at: self.now() };
        self.store.unsynced().update(IDEM, key, ClaimRecord::running(from), Update::fields(&set)).await
    }

    /// Store the outcome answered for `key` (synced: a retry must get it).
    pub(crate) async fn complete_key(&self, key: &str, txn: &str, status: u16, body: &Value) -> StoreResult<()> {
        let set = shapes::Done { state: ClaimState::Done, status: i32::from(status), body: body.to_string() };
        let filter = fields(&shapes::Held { txn, state: None });
        self.store.update(IDEM, key, filter, Update::fields(&set)).await.map(|_| ())
    }

    /// Free `key` (a retryable failure).
    pub(crate) async fn release_key(&self, key: &str, txn: &str) -> StoreResult<()> {
        self.store.delete(IDEM, key, fields(&shapes::Held { txn, state: None })).await.map(|_| ())
    }
}

#[cfg(test)]
mod canonical_tests {
    use super::body_hash;
    use serde_json::json;

    #[test]
    fn the_hash_ignores_member_order_and_number_spelling_but_not_item_order() {
        let a: serde_json::Value = serde_json::from_str(r#"{"a":1,"b":{"x":100,"y":[1,2]}}"#).unwrap();
        let b: serde_json::Value = serde_json::from_str(r#"{"b":{"y":[1,2.0],"x":1e2},"a":1.0}"#).unwrap();
        assert_eq!(body_hash(&a), body_hash(&b));
        let c: serde_json::Value = serde_json::from_str(r#"{"a":1,"b":{"x":100,"y":[2,1]}}"#).unwrap();
        assert_ne!(body_hash(&a), body_hash(&c), "array order counts");
        assert_ne!(body_hash(&json!({"a": 1})), body_hash(&json!({"a": "1"})));
        assert_ne!(body_hash(&json!({"a": 0.5})), body_hash(&json!({"a": 1})));
    }
}

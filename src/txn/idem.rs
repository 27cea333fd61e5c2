//! Idempotency keys (DESIGN §3): `_idem/<scope>:<key>` is inserted if
//! absent before anything else, holding a hash of the body and the
//! transaction id. A commit or a non-retryable failure is stored and
//! answered again for the same key and body; a retryable failure frees the
//! key; a different body is refused.

use std::time::Duration;

use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::store::{DateTime, Order, Scan, StoreResult, Update, doc};

use super::Engine;
use super::record::{Status, TXNS, TxnRecord};

pub const IDEM: &str = "_idem";

/// How long an outcome is kept for replay (at least).
pub const IDEM_RETENTION: Duration = Duration::from_secs(24 * 3600);

/// What claiming a key found.
#[derive(Debug, Clone, PartialEq)]
pub enum Claim {
    /// The key is ours: run the transaction.
    Fresh,
    /// A stored outcome: answer it again.
    Replay { status: u16, body: Value },
    /// The first request with this key is still running.
    InProgress { txn: String },
    /// The key was used with another body.
    Reused,
}

/// The hash of a request body, independent of its whitespace.
pub fn body_hash(body: &Value) -> String {
    let canonical = serde_json::to_vec(body).expect("JSON serializes");
    Sha256::digest(&canonical).iter().map(|b| format!("{b:02x}")).collect()
}

impl Engine {
    /// Claim `key` for `txn` running a body with hash `hash`.
    pub async fn claim_key(&self, key: &str, hash: &str, txn: &str) -> StoreResult<Claim> {
        loop {
            let fresh = doc! {"_id": key, "hash": hash, "txn": txn, "state": "running", "created_at": self.now()};
            if self.store.insert(IDEM, fresh.clone()).await? {
                return Ok(Claim::Fresh);
            }
            let Some(existing) = self.store.get(IDEM, key).await? else { continue };
            if existing.get_str("hash").unwrap_or_default() != hash {
                return Ok(Claim::Reused);
            }
            if existing.get_str("state").unwrap_or_default() == "done" {
                let status = existing.get_i32("status").unwrap_or(200) as u16;
                let body =
                    existing.get_str("body").ok().and_then(|b| serde_json::from_str(b).ok()).unwrap_or(Value::Null);
                return Ok(Claim::Replay { status, body });
            }
            let holder = existing.get_str("txn").unwrap_or_default().to_owned();
            match self.record(&holder).await? {
                Some(rec) if rec.status.is_committed() => return self.replay_committed(key, &rec).await,
                Some(rec) if rec.status == Status::Pending => return Ok(Claim::InProgress { txn: holder }),
                // Aborted without a stored outcome: either its request is
                // retrying (it re-points the key within moments) or it ended
                // without storing one (it died, or could not learn whether
                // it committed); after a lease the key is free again.
                Some(rec) => {
                    let since = rec.finished_at.unwrap_or(rec.expires_at).timestamp_millis();
                    if self.now().timestamp_millis() - since < self.cfg.lease.as_millis() as i64 {
                        return Ok(Claim::InProgress { txn: holder });
                    }
                }
                // No record yet: the request is just starting (or its
                // attempt was just re-pointed), unless it has been that way
                // for longer than two leases.
                None => {
                    let since = ["repointed_at", "created_at"]
                        .iter()
                        .find_map(|f| existing.get_datetime(f).ok())
                        .map_or(0, |d| d.timestamp_millis());
                    if self.now().timestamp_millis() - since <= 2 * self.cfg.lease.as_millis() as i64 {
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
            if self.store.replace(IDEM, key, doc! {"txn": &holder, "state": "running"}, fresh).await? {
                return Ok(Claim::Fresh);
            }
        }
    }

    async fn replay_committed(&self, key: &str, rec: &TxnRecord) -> StoreResult<Claim> {
        let body = super::summary(rec);
        self.complete_key(key, &rec.id, 200, &body).await?;
        Ok(Claim::Replay { status: 200, body })
    }

    /// Finalize attempt `old` before its key moves on: insert its record as
    /// aborted if it has none, else CAS it `pending → aborted`. `None` when
    /// the fencing record was inserted; else the record as it is afterwards
    /// (a committed one keeps its outcome).
    async fn fence(&self, old: &str) -> StoreResult<Option<TxnRecord>> {
        if self.store.insert(TXNS, TxnRecord::fenced(old, self.now()).to_record()).await? {
            tracing::info!(txn.id = %old, "idempotency key taken over; attempt fenced");
            return Ok(None);
        }
        self.abort_pending(old, None, "superseded").await
    }

    /// Move the claim on `key` from attempt `from` to attempt `to`, once
    /// `from` can no longer commit.
    pub async fn repoint_key(&self, key: &str, from: &str, to: &str) -> StoreResult<bool> {
        if self.fence(from).await?.is_some_and(|rec| rec.status.is_committed()) {
            return Ok(false);
        }
        let set = doc! {"txn": to, "repointed_at": self.now()};
        self.store.update(IDEM, key, doc! {"txn": from, "state": "running"}, Update::set(set)).await
    }

    /// Store the outcome answered for `key`.
    pub async fn complete_key(&self, key: &str, txn: &str, status: u16, body: &Value) -> StoreResult<()> {
        let set = doc! {"state": "done", "status": i32::from(status), "body": body.to_string()};
        self.store.update(IDEM, key, doc! {"txn": txn}, Update::set(set)).await.map(|_| ())
    }

    /// Free `key` (a retryable failure).
    pub async fn release_key(&self, key: &str, txn: &str) -> StoreResult<()> {
        self.store.delete(IDEM, key, doc! {"txn": txn}).await.map(|_| ())
    }

    pub(super) async fn purge_idempotency(&self, at: DateTime) -> StoreResult<usize> {
        let cutoff = DateTime::from_millis(at.timestamp_millis() - IDEM_RETENTION.as_millis() as i64);
        let old = self
            .store
            .scan(IDEM, Scan::sorted(doc! {"created_at": {"$lt": cutoff}}, "created_at", Order::Asc, 200))
            .await?;
        let mut purged = 0;
        for rec in old {
            let Some(id) = crate::store::record_id(&rec).map(str::to_owned) else { continue };
            if self.store.delete(IDEM, &id, doc! {"created_at": {"$lt": cutoff}}).await? {
                purged += 1;
            }
        }
        Ok(purged)
    }
}

//! Post-commit hooks (DESIGN §4): the delivery records a committed
//! transaction leaves in `_deliveries`, and the destination guard.
//!
//! Deliveries are recorded during roll-forward, before any lock of the
//! transaction is released, by insert-if-absent under deterministic ids
//! (`<txn>:<index>`), with payload and headers fixed at that moment. So a
//! commit never loses a hook, a hook exists only for a committed
//! transaction, and a second roll-forward changes nothing.

pub mod guard;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::store::{DateTime, Record, StoreError, StoreResult};
use crate::txn::Engine;
use crate::txn::record::TxnRecord;

pub const DELIVERIES: &str = "_deliveries";

/// A hook as the client gave it in the transaction request.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
pub struct Hook {
    #[serde(default = "default_method")]
    pub method: String,
    pub url: String,
    #[serde(default)]
    pub headers: std::collections::BTreeMap<String, String>,
    #[serde(default)]
    pub body: Option<Value>,
}

fn default_method() -> String {
    "POST".into()
}

/// One delivery attempt.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
pub struct Attempt {
    pub at: DateTime,
    #[serde(default)]
    pub status_code: Option<i32>,
    #[serde(default)]
    pub error: Option<String>,
    pub duration_ms: i64,
}

/// A delivery record in `_deliveries`.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
pub struct Delivery {
    /// `<txn>:<index>`.
    #[serde(rename = "_id")]
    pub id: String,
    pub txn: String,
    pub index: i64,
    /// `pending`, `failed` (an attempt failed, another is due), `dead` or
    /// `delivered`.
    pub status: String,
    pub method: String,
    pub url: String,
    pub headers: std::collections::BTreeMap<String, String>,
    /// The exact bytes to send, as text.
    pub body: String,
    pub created_at: DateTime,
    pub next_at: DateTime,
    #[serde(default)]
    pub attempts: Vec<Attempt>,
    #[serde(default)]
    pub finished_at: Option<DateTime>,
}

impl Delivery {
    pub fn from_record(record: Record) -> Result<Self, StoreError> {
        mongodb::bson::from_document(record).map_err(|e| StoreError::Internal(format!("bad delivery record: {e}")))
    }

    pub fn to_record(&self) -> Record {
        mongodb::bson::to_document(self).expect("delivery serializes")
    }
}

/// The hooks of a transaction request (none when it has no `hooks`).
pub fn hooks_of(request: &str) -> Vec<Hook> {
    #[derive(Deserialize)]
    struct WithHooks {
        #[serde(default)]
        hooks: Vec<Hook>,
    }
    serde_json::from_str::<WithHooks>(request).map(|r| r.hooks).unwrap_or_default()
}

/// The delivery id of hook `index` of transaction `txn`.
pub fn delivery_id(txn: &str, index: usize) -> String {
    format!("{txn}:{index}")
}

impl Engine {
    /// Record the deliveries of committed `rec` (idempotent).
    pub async fn record_deliveries(&self, rec: &TxnRecord) -> StoreResult<()> {
        if rec.hook_count == 0 {
            return Ok(());
        }
        let at = rec.committed_at.unwrap_or_else(crate::store::now);
        let summary = crate::txn::summary(rec).to_string();
        for (i, hook) in hooks_of(&rec.request).into_iter().enumerate() {
            let body = match &hook.body {
                Some(body) => body.to_string(),
                None => summary.clone(),
            };
            let delivery = Delivery {
                id: delivery_id(&rec.id, i),
                txn: rec.id.clone(),
                index: i as i64,
                status: "pending".into(),
                method: hook.method,
                url: hook.url,
                headers: hook.headers,
                body,
                created_at: at,
                next_at: at,
                attempts: Vec::new(),
                finished_at: None,
            };
            // Insert-if-absent: a second roll-forward finds it there.
            self.store.insert(DELIVERIES, delivery.to_record()).await?;
        }
        Ok(())
    }

    /// The deliveries of transaction `txn`, in hook order.
    pub async fn deliveries_of(&self, txn: &str, count: i64) -> StoreResult<Vec<Option<Delivery>>> {
        let ids: Vec<String> = (0..count.max(0) as usize).map(|i| delivery_id(txn, i)).collect();
        let found = self.store.get_many(DELIVERIES, &ids).await?;
        let mut by_id: std::collections::HashMap<String, Delivery> = found
            .into_iter()
            .map(Delivery::from_record)
            .map(|d| d.map(|d| (d.id.clone(), d)))
            .collect::<Result<_, _>>()?;
        Ok(ids.iter().map(|id| by_id.remove(id)).collect())
    }
}

//! The answer of a committed transaction: one type for the 200 answer of
//! `POST /v1/transactions` (its schema is the API's `CommittedOut`), what
//! an Idempotency-Key replays, and the default body of a hook.

use serde::Serialize;
use utoipa::ToSchema;

use super::record::{Status, TxnRecord};
use crate::document::names::{Collection, DocumentId};

/// The answer once the commit point is passed.
#[derive(Serialize, ToSchema)]
pub(crate) struct CommittedOut {
    /// The transaction's id (a UUIDv7).
    pub id: String,
    /// Always `committed`.
    #[schema(value_type = CommittedStatus)]
    pub status: CommittedStatus,
    #[schema(format = DateTime, example = "2026-01-02T03:04:05.678Z")]
    pub committed_at: String,
    /// One per action, in order.
    pub results: Vec<ResultOut>,
    pub hooks: Vec<HookStateOut>,
}

/// The status of a committed transaction's answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
#[schema(rename_all = "snake_case")]
pub(crate) enum CommittedStatus {
    Committed,
}

#[derive(Serialize, ToSchema)]
pub(crate) struct ResultOut {
    #[schema(value_type = Collection)]
    pub collection: String,
    #[schema(value_type = DocumentId)]
    pub id: String,
    /// The new version (the current one for `check`, the tombstone's for `delete`).
    #[schema(minimum = 1)]
    pub version: i64,
}

#[derive(Serialize, ToSchema)]
pub(crate) struct HookStateOut {
    /// `<transaction>:<index>`: the delivery id.
    pub id: String,
    #[schema(value_type = HookState)]
    pub status: HookState,
}

/// A hook's delivery state: `not_sent` when the transaction did not commit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
#[schema(rename_all = "snake_case")]
pub(crate) enum HookState {
    Pending,
    Failed,
    Dead,
    Delivered,
    NotSent,
}

impl CommittedOut {
    /// The answer of committed `rec`: its results, and each hook's
    /// delivery as `pending`.
    pub(crate) fn of(rec: &TxnRecord) -> Self {
        debug_assert!(rec.status.is_committed() || rec.status == Status::Done, "{:?}", rec.status);
        Self {
            id: rec.id.clone(),
            status: CommittedStatus::Committed,
            committed_at: rec.committed_at.map(crate::clock::rfc3339).unwrap_or_default(),
            results: rec
                .results
                .iter()
                .flatten()
                .map(|r| ResultOut { collection: r.collection.clone(), id: r.id.clone(), version: r.version })
                .collect(),
            hooks: (0..rec.hook_count)
                .map(|i| HookStateOut { id: format!("{}:{i}", rec.id), status: HookState::Pending })
                .collect(),
        }
    }

    /// The answer as JSON (as stored for a key, and sent as a hook's body).
    pub(crate) fn to_json(&self) -> serde_json::Value {
        serde_json::to_value(self).expect("an answer serializes")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::txn::record::MemberResult;

    #[test]
    fn the_committed_answer_names_its_results_and_hooks() {
        let at = crate::store::DateTime::from_millis(1_700_000_000_123);
        let rec = TxnRecord {
            status: Status::Committed,
            committed_at: Some(at),
            results: Some(vec![MemberResult { collection: "c".into(), id: "d".into(), version: 3 }]),
            hook_count: 2,
            ..TxnRecord::fenced("t1", at)
        };
        let answer = CommittedOut::of(&rec).to_json();
        assert_eq!(
            answer,
            serde_json::json!({
                "id": "t1", "status": "committed", "committed_at": "2023-11-14T22:13:20.123Z",
                "results": [{"collection": "c", "id": "d", "version": 3}],
                "hooks": [{"id": "t1:0", "status": "pending"}, {"id": "t1:1", "status": "pending"}],
            })
        );
    }
}

//! The workload the transaction benches share: a plan of k increments,
//! accounts seeded for it, and waiting for the engine's background work.

use std::sync::Arc;

use txgate::testing::document::StoredDoc;
use txgate::testing::document::rules::Patch;
use txgate::testing::txn::Transactions;
use txgate::testing::txn::plan::{Action, ActionOp, Plan};
use txgate_store::{DynStore, doc};

/// A transaction that increments field `n` of each of `ids` in `coll`.
pub fn plan(coll: &str, ids: &[String]) -> Plan {
    let inc = serde_json::json!({"n": 1});
    let patch = Patch::parse(None, None, inc.as_object(), "").expect("patch");
    Plan {
        actions: ids
            .iter()
            .map(|id| Action {
                collection: coll.into(),
                id: id.clone(),
                op: ActionOp::Update(patch.clone()),
                if_version: None,
            })
            .collect(),
        schema_version: 1,
        request: "{}".into(),
        idempotency_key: None,
        hooks: Vec::new(),
        indexed: Default::default(),
        unique: Default::default(),
        claimed: Default::default(),
        schemas: Default::default(),
        warned: Default::default(),
        key: None,
        user: None,
    }
}

/// `count` documents of `coll` (`d00000`, `d00001`…), each `{"n": 0}`.
pub async fn seed(store: &DynStore, coll: &str, count: usize) {
    let at = txgate_store::DateTime::now();
    for i in 0..count {
        let d = StoredDoc::new_live(format!("d{i:05}"), doc! {"n": 0_i64}, 1, 1, at);
        store.insert(coll, d.to_record()).await.expect("seed");
    }
}

/// Until the engine runs no background roll-forward.
pub async fn wait_idle(engine: &Arc<Transactions>) {
    engine.idle().await;
}

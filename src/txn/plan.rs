//! A validated transaction request: what to do to which documents.

use crate::document::StagedOp;
use crate::document::rules::Patch;
use crate::store::Document;

#[derive(Clone, Debug)]
pub enum ActionOp {
    Insert(Document),
    Update(Patch),
    Replace(Document),
    Delete,
    Check,
}

impl ActionOp {
    pub fn staged(&self) -> StagedOp {
        match self {
            ActionOp::Insert(_) => StagedOp::Insert,
            ActionOp::Update(_) => StagedOp::Update,
            ActionOp::Replace(_) => StagedOp::Replace,
            ActionOp::Delete => StagedOp::Delete,
            ActionOp::Check => StagedOp::Check,
        }
    }
}

#[derive(Clone, Debug)]
pub struct Action {
    pub collection: String,
    /// Generated for an insert that named none.
    pub id: String,
    pub op: ActionOp,
    pub if_version: Option<i64>,
}

/// A transaction ready to run.
#[derive(Clone, Debug)]
pub struct Plan {
    pub actions: Vec<Action>,
    pub schema_version: i64,
    /// The request body exactly as sent, kept in the record.
    pub request: String,
    pub idempotency_key: Option<String>,
    /// The hooks, validated; kept in the record as they are here.
    pub hooks: Vec<super::hook::Hook>,
    /// The indexed paths (index, path) of each member collection that has
    /// declared indexes: a staged update's data must keep their rule
    /// (`crate::indexes`), or the transaction fails before any commit.
    pub indexed: std::collections::HashMap<String, Vec<(String, String)>>,
    /// The unique indexes of each member collection that has some: (its
    /// name in the store, its paths).
    pub unique: std::collections::HashMap<String, Vec<(String, Vec<String>)>>,
    /// The value each member's data takes in each unique index of its
    /// collection (in the order of `unique`), claimed before the
    /// transaction ran: a member staged with another value fails before
    /// the commit point.
    pub claimed: std::collections::HashMap<(String, String), Vec<Option<Vec<u8>>>>,
    /// The name of the API key that sent it.
    pub key: Option<String>,
}

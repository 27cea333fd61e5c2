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
    /// Each member's values in the unique indexes of its collection,
    /// claimed before the transaction ran (see [`Claimed`]).
    pub claimed: std::collections::HashMap<(String, String), Claimed>,
    /// The schemas of each member collection that has some, as read
    /// before the transaction ran: each member's staged data must satisfy
    /// them (docs/guides/validation.md), or the transaction fails before
    /// any commit.
    pub schemas: std::collections::HashMap<String, std::sync::Arc<crate::schemas::Known>>,
    /// Members let through under `warn` by their latest check: counted
    /// and logged once, when the transaction commits.
    pub warned: std::sync::Arc<crate::schemas::Warnings>,
    /// The name of the API key that sent it.
    pub key: Option<String>,
    /// The user who sent it.
    pub user: Option<crate::actor::UserId>,
}

/// A member's values in the unique indexes of its collection (in the order
/// of [`Plan::unique`]), as claimed before the transaction ran: a member
/// staged with other values fails before the commit point.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Claimed {
    /// The values its data takes.
    pub taken: Vec<Option<Vec<u8>>>,
    /// The values its document held as read then. A value the member keeps
    /// is not claimed again (the document's reservation stands for it), and
    /// a value it gives up is released as read: both hold only if the
    /// document still holds these values when the member is staged.
    pub read: Vec<Option<Vec<u8>>>,
}

//! A write's admission, decided here once for a single document's write and
//! a transaction's members alike, before anything is written:
//!
//! - the rule of declared indexes on the data written (no array or object on
//!   an indexed path; an update's, in a transaction, is checked once staged);
//! - the values it takes in unique indexes, claimed (a duplicate refuses it),
//!   and the reservations of the values it gives up, read.
//!
//! What is admitted is settled with the outcome ([`Admitted::settle`]): when
//! the write lands, its claims stay and the values it gave up are released;
//! when it does not, its claims are given back.

use std::sync::Arc;

use super::{Indexes, LiveData, breaks_rule, unique};
use crate::store::{Document, StoreError};
use crate::txn::plan::{ActionOp, Plan};

/// Why a write is not admitted.
#[derive(Debug)]
pub(crate) enum Refusal {
    /// The data breaks the rule of a declared index: why.
    Rule(String),
    /// A unique value another document holds.
    Duplicate(unique::Duplicate),
    Store(StoreError),
}

impl From<StoreError> for Refusal {
    fn from(err: StoreError) -> Self {
        Refusal::Store(err)
    }
}

/// A transaction's refusal: the member refused (its index in the plan;
/// `None` when the store failed), and why.
#[derive(Debug)]
pub(crate) struct MemberRefusal {
    pub action: Option<usize>,
    pub refusal: Refusal,
}

/// What a write was admitted with, held until its outcome is known.
pub(crate) struct Admitted {
    indexes: Arc<Indexes>,
    /// The values it takes in unique indexes, claimed.
    pub(super) claims: Vec<unique::Claim>,
    /// The reservations of the values it gives up, as read before.
    pub(super) held: Vec<unique::Claim>,
    /// The unique indexes (as stored) the claims were made in.
    uniques: Vec<String>,
}

impl Admitted {
    pub(super) fn new(indexes: &Arc<Indexes>) -> Self {
        Self { indexes: Arc::clone(indexes), claims: Vec::new(), held: Vec::new(), uniques: Vec::new() }
    }

    /// Settle the admission: `written`, release what the write gave up
    /// (its claims are now the document's); otherwise give the claims back.
    pub(crate) async fn settle(self, written: bool) {
        let given_back = if written { &self.held } else { &self.claims };
        unique::release(&self.indexes.store, given_back).await;
    }
}

impl Indexes {
    /// Admit document `id` of `coll` going from `old` (`None`: nothing
    /// lives there) to `new` (`None`: deleted). `again`: this write's
    /// admission before it waited for a lock, whose claims are kept where
    /// the unique indexes are still the same (and given back where they
    /// changed meanwhile); the rule is checked again either way, so an
    /// index declared during the wait is kept.
    pub(crate) async fn admit(
        self: &Arc<Self>,
        coll: &str,
        id: &str,
        (old, new): (Option<&Document>, Option<&Document>),
        again: Option<Admitted>,
    ) -> Result<Admitted, Refusal> {
        let refused = |again: Option<Admitted>, refusal: Refusal| async move {
            if let Some(again) = again {
                again.settle(false).await;
            }
            Err(refusal)
        };
        let Some(new) = new else {
            // A delete takes no value and checks no rule.
            let mut admitted = again.unwrap_or_else(|| Admitted::new(self));
            if let Some(old) = old {
                admitted.held = self.held(coll, id, old, None).await;
            }
            return Ok(admitted);
        };
        match self.paths(coll).await {
            Ok(paths) => {
                if let Some(why) = breaks_rule(&paths, new) {
                    return refused(again, Refusal::Rule(why)).await;
                }
            }
            Err(err) => return refused(again, err.into()).await,
        }
        let uniques = match self.uniques(coll).await {
            Ok(uniques) => uniques,
            Err(err) => return refused(again, err.into()).await,
        };
        let names: Vec<String> = uniques.iter().map(|u| u.physical.clone()).collect();
        let mut admitted = match again {
            Some(again) if again.uniques == names => again,
            again => {
                if let Some(again) = again {
                    again.settle(false).await;
                }
                let mut admitted = Admitted::new(self);
                match self.claim_in(coll, id, &uniques, (old, new), &Default::default()).await? {
                    Ok(claims) => admitted.claims = claims,
                    Err(dup) => return Err(Refusal::Duplicate(dup)),
                }
                admitted.uniques = names;
                admitted
            }
        };
        if let Some(old) = old {
            admitted.held = self.held(coll, id, old, Some(new)).await;
        }
        Ok(admitted)
    }

    /// Admit a transaction's plan: the rule on each insert's and replace's
    /// data (filling in `plan.indexed`, which staging checks an update's
    /// against), then the unique values the members take, claimed
    /// ([`Indexes::claim_members`], reading each member from `live`).
    pub(crate) async fn admit_plan(
        self: &Arc<Self>,
        plan: &mut Plan,
        live: &dyn LiveData,
    ) -> Result<Admitted, MemberRefusal> {
        let at = |action: Option<usize>| move |refusal: Refusal| MemberRefusal { action, refusal };
        for (i, action) in plan.actions.iter().enumerate() {
            if !plan.indexed.contains_key(&action.collection) {
                let paths = self.paths(&action.collection).await.map_err(|e| at(None)(e.into()))?;
                plan.indexed.insert(action.collection.clone(), paths);
            }
            if let ActionOp::Insert(data) | ActionOp::Replace(data) = &action.op {
                if let Some(why) = breaks_rule(&plan.indexed[&action.collection], data) {
                    return Err(at(Some(i))(Refusal::Rule(why)));
                }
            }
        }
        plan.indexed.retain(|_, paths| !paths.is_empty());
        match self.claim_members(plan, live).await {
            Ok(Ok(admitted)) => Ok(admitted),
            Ok(Err((i, dup))) => Err(at(Some(i))(Refusal::Duplicate(dup))),
            Err(err) => Err(at(None)(err.into())),
        }
    }
}

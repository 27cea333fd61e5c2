//! The values of unique indexes a write or a transaction's members claim
//! before anything is written, given back or released once the outcome is
//! known (see `unique` for how a claim is kept).

use std::collections::HashMap;
use std::sync::Arc;

use super::admission::Admitted;
use super::{Indexes, State, unique};
use crate::store::{Document, Durability, StoreResult};

/// Documents as a reader sees them now, for the unique claims of a
/// transaction's members ([`Indexes::claim_members`]).
#[async_trait::async_trait]
pub(crate) trait LiveData: Send + Sync {
    /// The data of `coll/id`, or `None` where no document lives.
    async fn live_data(&self, coll: &str, id: &str) -> StoreResult<Option<Document>>;
}

impl Indexes {
    /// The unique indexes of `coll` writes claim values in (building or
    /// ready).
    pub(crate) async fn uniques(&self, coll: &str) -> StoreResult<Vec<unique::Unique>> {
        Ok(self
            .declared(coll)
            .await?
            .iter()
            .filter(|d| d.unique && matches!(d.state, State::Building | State::Ready))
            .map(unique::Unique::of)
            .collect())
    }

    /// Claim, for document `id` of `coll` becoming `new` (from `old`), the
    /// values it takes in `uniques`, the unique indexes of `coll` as
    /// [`Self::uniques`] gave them, in a transaction whose other members
    /// give up the values `giving` names (none for a single write); on a
    /// duplicate, the claims made are given back.
    pub(super) async fn claim_in(
        &self,
        coll: &str,
        id: &str,
        uniques: &[unique::Unique],
        (old, new): (Option<&Document>, &Document),
        giving: &Giving,
    ) -> StoreResult<Result<Vec<unique::Claim>, unique::Duplicate>> {
        let mut claims = Vec::new();
        for index in uniques {
            let Some(key) = index.value(new) else { continue };
            if old.and_then(|o| index.value(o)).as_deref() == Some(key.as_slice()) {
                continue;
            }
            let givers: Vec<&str> = giving
                .get(&(coll.to_owned(), index.physical.clone(), key.clone()))
                .map(|ids| ids.iter().map(String::as_str).filter(|g| *g != id).collect())
                .unwrap_or_default();
            match unique::claim(&self.store, coll, index, &key, (id, &givers), self.clock.now(), Durability::Synced)
                .await
            {
                Ok(Ok(claim)) => claims.push(claim),
                Ok(Err(duplicate)) => {
                    unique::release(&self.store, &claims).await;
                    return Ok(Err(duplicate));
                }
                Err(err) => {
                    unique::release(&self.store, &claims).await;
                    return Err(err);
                }
            }
        }
        Ok(Ok(claims))
    }

    /// The reservations of the unique values document `id` of `coll`
    /// gives up going from `old` to `new` (`None`: deleted), as read before
    /// its write: once the write lands, releasing them frees
    /// the values at once, unless a write of the same document claimed one
    /// again meanwhile (which renewed it).
    pub(crate) async fn held(
        &self,
        coll: &str,
        id: &str,
        old: &Document,
        new: Option<&Document>,
    ) -> Vec<unique::Claim> {
        let Ok(uniques) = self.uniques(coll).await else { return Vec::new() };
        let mut out = Vec::new();
        for index in &uniques {
            let Some(key) = index.value(old) else { continue };
            if new.and_then(|n| index.value(n)).as_deref() == Some(key.as_slice()) {
                continue;
            }
            if let Ok(Some(claim)) = unique::held(&self.store, index, &key, id).await {
                out.push(claim);
            }
        }
        out
    }

    /// Claim the unique values a transaction's members take, filling in
    /// `plan.unique` and `plan.claimed` (an update's value from the
    /// document as read now). On a duplicate: the member's index and the
    /// claims made so far given back.
    ///
    /// Each member's document is read from `documents` as a reader sees
    /// it now: with a committed transaction's change in place even where
    /// it is not rolled forward yet (its 200 may have been sent).
    pub(super) async fn claim_members(
        self: &Arc<Self>,
        plan: &mut crate::txn::plan::Plan,
        documents: &dyn LiveData,
    ) -> StoreResult<Result<Admitted, (usize, unique::Duplicate)>> {
        use crate::txn::plan::ActionOp;
        let mut made = Admitted::new(self);
        // Each member's document as read now and as it would become.
        let mut members = Vec::new();
        for (i, action) in plan.actions.iter().enumerate() {
            let (coll, id) = (&action.collection, &action.id);
            let uniques = self.uniques(coll).await?;
            if uniques.is_empty() {
                continue;
            }
            plan.unique
                .entry(coll.clone())
                .or_insert_with(|| uniques.iter().map(|u| (u.physical.clone(), u.paths.clone())).collect());
            let old = documents.live_data(coll, id).await?;
            let new = match &action.op {
                ActionOp::Insert(data) | ActionOp::Replace(data) => Some(data.clone()),
                ActionOp::Update(patch) => patch.apply(&old.clone().unwrap_or_default()).ok(),
                ActionOp::Delete | ActionOp::Check => None,
            };
            let values = |data: &Option<Document>| match data {
                Some(data) => uniques.iter().map(|u| u.value(data)).collect(),
                None => vec![None; uniques.len()],
            };
            let claimed = crate::txn::plan::Claimed { taken: values(&new), read: values(&old) };
            plan.claimed.insert((coll.clone(), id.clone()), claimed);
            let check = matches!(action.op, ActionOp::Check);
            members.push((i, coll, id, uniques, old, new, check));
        }
        // The values members give up, which the others may take.
        let mut giving = Giving::new();
        for (_, coll, id, uniques, old, new, check) in &members {
            let Some(old) = old.as_ref().filter(|_| !*check) else { continue };
            for index in uniques {
                let Some(key) = index.value(old) else { continue };
                if new.as_ref().and_then(|n| index.value(n)).as_deref() != Some(key.as_slice()) {
                    giving.entry(((*coll).clone(), index.physical.clone(), key)).or_default().push((*id).clone());
                }
            }
        }
        for (i, coll, id, uniques, old, new, check) in &members {
            if let Some(data) = new {
                match self.claim_in(coll, id, uniques, (old.as_ref(), data), &giving).await? {
                    Ok(claims) => made.claims.extend(claims),
                    Err(dup) => {
                        made.settle(false).await;
                        return Ok(Err((*i, dup)));
                    }
                }
            }
            if !check {
                if let Some(old) = old {
                    made.held.extend(self.held(coll, id, old, new.as_ref()).await);
                }
            }
        }
        Ok(Ok(made))
    }
}

/// The documents of a transaction's members giving up each unique value
/// (collection, index in the store, value's key) another member may take.
type Giving = HashMap<(String, String, Vec<u8>), Vec<String>>;

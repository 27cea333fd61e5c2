//! Transactions under rules (docs/guides/rules.md, "Transactions"): each
//! action on a collection whose rules judge the caller is judged, before
//! anything runs, on the state it would produce from the document as it
//! is now; the version judged is the one the action applies to (its
//! `if_version`, pinned when the client gave none), so a document changed
//! meanwhile fails the transaction (409 `version_conflict`, retryable)
//! rather than be changed unjudged. The first refusal answers for all,
//! naming its action: 404 for a document the caller may not read, 403
//! `rule_denied` for a write no grant allows. Nothing is written.

use std::collections::HashMap;

use super::super::AppState;
use super::super::error::ApiError;
use super::super::ruled;
use crate::document::View;
use crate::document::rules::escape;
use crate::documents::DocError;
use crate::rules::{Action, Denied, Judged, Principal};
use crate::txn::plan::{ActionOp, Plan};

/// How each member collection's rules judge the caller.
pub(super) type Judgements = HashMap<String, Judged>;

/// Judge the actions of `plan` whose collections' rules judge `who`
/// (`chose[i]`: action `i` is an insert that named its id, or no
/// insert), amending them as the rules say (a create's `set` fields, a
/// replace's kept fields, the version judged).
pub(super) async fn judge_plan(
    state: &AppState,
    who: &Principal,
    plan: &mut Plan,
    chose: &[bool],
) -> Result<Judgements, ApiError> {
    let mut judged = Judgements::new();
    for action in &plan.actions {
        if !judged.contains_key(&action.collection) {
            judged.insert(action.collection.clone(), ruled::judged(state, &action.collection, who).await?);
        }
    }
    if !judged.values().any(|j| matches!(j, Judged::Ruled(_))) {
        return Ok(judged);
    }
    for (i, action) in plan.actions.iter_mut().enumerate() {
        let Some(Judged::Ruled(judge)) = judged.get(&action.collection) else { continue };
        let refused = |d: Denied, coll: &str, id: &str| ruled::denied(d).action(i).document(coll, id);
        if let ActionOp::Insert(data) = &mut action.op {
            let (made, _) = judge
                .create(who, data, chose.get(i).copied().unwrap_or(true))
                .map_err(|d| refused(d, &action.collection, &action.id))?;
            *data = made;
            continue;
        }
        let hidden = || ApiError::from(DocError::NotFound).action(i).document(&action.collection, &action.id);
        let live = match state.documents.get(&action.collection, &action.id).await? {
            View::Live(live) if judge.sees(Action::Read, &live.data).is_some() => live,
            _ => return Err(hidden()),
        };
        let before = &live.data;
        let outcome = match &mut action.op {
            ActionOp::Update(patch) => {
                let paths =
                    patch.set.iter().map(|(p, _)| p).chain(&patch.unset).chain(patch.inc.iter().map(|(p, _)| p));
                let update = Action::Update;
                let top = |p: &Vec<String>| p.first().cloned().unwrap_or_default();
                if let Some(field) = paths.map(top).find(|f| !judge.allowing(update).any(|a| a.grant.writes(f))) {
                    Err(Denied::Forbidden {
                        detail: format!("no grant of the caller's lets it write {field:?}"),
                        pointer: Some(format!("/{}", escape(&field))),
                    })
                } else {
                    match patch.apply(before) {
                        Ok(after) => judge.update(before, &after).map(drop),
                        // The engine answers it as it answers any such patch.
                        Err(_) => Ok(()),
                    }
                }
            }
            ActionOp::Replace(data) => {
                judge.keep_hidden(before, data);
                judge.keep_set(before, data);
                judge.update(before, data).map(drop)
            }
            ActionOp::Delete => judge.delete(before).map(drop),
            ActionOp::Check | ActionOp::Insert(_) => Ok(()),
        };
        outcome.map_err(|d| refused(d, &action.collection, &action.id))?;
        // The state judged is the state the action applies to.
        action.if_version.get_or_insert(live.version);
    }
    Ok(judged)
}

//! The change events of committed transactions, made as one of their
//! outputs (docs/design.md §5): one event per changed member, then the
//! `transaction.committed` event.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use async_trait::async_trait;

use super::outputs::{Forwarded, Outputs};
use super::record::TxnRecord;
use crate::clock::Clock;
use crate::document::StoredDoc;
use crate::events::model::{self, CommittedMember};
use crate::events::{EVENTS, EventType};
use crate::rules::Rules;
use crate::store::{DateTime, DynStore, Record, StoreResult};

/// The log records (positions left to the store) of committed `rec`'s
/// events, from its changed members `forwarded`: one per changed member
/// (keeping of the document before the change the fields `named` names
/// for its collection), then the `transaction.committed` event.
pub(crate) fn transaction_records(
    rec: &TxnRecord,
    forwarded: &[Forwarded<'_>],
    at: DateTime,
    named: impl Fn(&str) -> Option<Arc<BTreeSet<String>>>,
) -> Vec<Record> {
    let committed = rec.committed_at.unwrap_or(at);
    let mut out = Vec::with_capacity(forwarded.len() + 1);
    for f in forwarded {
        let m = &rec.members[f.index];
        if let Some(kind) = EventType::of_staged(m.op) {
            let mut r = model::document_event(
                kind,
                &m.collection,
                f.after,
                Some(&rec.id),
                rec.key.as_deref(),
                rec.user.as_ref(),
                committed,
            );
            if let Some(named) = named(&m.collection) {
                model::keep_before(&mut r, &named, f.locked);
            }
            r.insert("logged_at", at);
            out.push(r);
        }
    }
    let results = rec.results.as_deref().unwrap_or_default();
    let members = rec
        .members
        .iter()
        .enumerate()
        .map(|(i, m)| CommittedMember {
            collection: &m.collection,
            id: &m.id,
            op: m.op,
            version: results.get(i).map_or(m.base_v.unwrap_or_default(), |r| r.version),
        })
        .collect();
    let mut r = model::transaction_event(&rec.id, rec.key.as_deref(), rec.user.as_ref(), committed, members);
    r.insert("logged_at", at);
    out.push(r);
    out
}

/// The event output of committed transactions: before any lock is
/// released, the events of every member still held, then the
/// `transaction.committed` event.
pub(crate) struct TxnEvents {
    store: DynStore,
    clock: Clock,
    /// Collections' rules: what each event keeps of the document before.
    rules: Arc<Rules>,
}

impl TxnEvents {
    pub(crate) fn new(store: DynStore, clock: Clock, rules: Arc<Rules>) -> Arc<Self> {
        Arc::new(Self { store, clock, rules })
    }
}

#[async_trait]
impl Outputs for TxnEvents {
    async fn ensure(&self, rec: &TxnRecord) -> StoreResult<()> {
        let at = self.clock.now();
        let committed = rec.committed_at.unwrap_or(at);
        // A member no longer held was released by someone who made every
        // event of the transaction exist first: with none held, there is
        // nothing to do.
        // `Some(None)`: held, but another tool broke the document; its lock
        // cannot be released either, and the rest go on.
        let reads = rec.members.iter().enumerate().map(|(i, m)| async move {
            let Some(found) = self.store.get(&m.collection, &m.id).await? else { return Ok(None) };
            match StoredDoc::from_record(found) {
                Ok(doc) if doc.meta.txn.as_deref() == Some(rec.id.as_str()) => {
                    let after = doc.rolled_forward(committed);
                    Ok(Some(Some((i, doc, after))))
                }
                Ok(_) => Ok(None),
                Err(err) => {
                    tracing::warn!(txn.id = %rec.id, collection = %m.collection, id = %m.id, error = %err, "no event for a member that cannot be read");
                    Ok(Some(None))
                }
            }
        });
        let held: Vec<Option<(usize, StoredDoc, StoredDoc)>> = futures::future::join_all(reads)
            .await
            .into_iter()
            .collect::<StoreResult<Vec<_>>>()?
            .into_iter()
            .flatten()
            .collect();
        if held.is_empty() {
            return Ok(());
        }
        let forwarded: Vec<(usize, StoredDoc, StoredDoc)> = held.into_iter().flatten().collect();
        let refs: Vec<Forwarded<'_>> =
            forwarded.iter().map(|(index, locked, after)| Forwarded { index: *index, locked, after }).collect();
        // What the events keep of the documents before, by their
        // collections' rules (read now if this instance's view is old).
        let mut named = HashMap::new();
        for m in &rec.members {
            if !named.contains_key(m.collection.as_str()) {
                named.insert(m.collection.as_str(), self.rules.named(&m.collection).await?);
            }
        }
        // The members' events first; the transaction's own only once every
        // one of them is in the log, whoever put it there. Another helper
        // may be appending the same events at once and win some of them at
        // later positions: a position taken after all members exist is
        // larger than each of theirs, so the transaction's event comes last.
        let mut records = transaction_records(rec, &refs, at, |c| named.get(c).cloned().flatten());
        let own = records.pop().expect("the transaction's own event is last");
        self.store.append_all(EVENTS, records).await?;
        self.store.unsynced().append(EVENTS, own).await?;
        Ok(())
    }

    fn has_any(&self, _: &TxnRecord) -> bool {
        true
    }

    fn chained(&self, rec: &TxnRecord, forwarded: &[Forwarded<'_>]) -> Option<Vec<(&'static str, Record)>> {
        // A commit in one chain does not wait for the store: the rules as
        // this instance knows them (every ruled request just read them).
        let records = transaction_records(rec, forwarded, self.clock.now(), |c| self.rules.named_known(c));
        Some(records.into_iter().map(|r| (EVENTS, r)).collect())
    }
}

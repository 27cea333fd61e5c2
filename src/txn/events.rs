//! The change events of committed transactions, made as one of their
//! outputs (docs/design.md §5): one event per changed member, then the
//! `transaction.committed` event.

use std::sync::Arc;

use async_trait::async_trait;

use super::outputs::Outputs;
use super::record::TxnRecord;
use crate::clock::Clock;
use crate::document::StoredDoc;
use crate::events::model::{self, CommittedMember};
use crate::events::{EVENTS, EventType};
use crate::store::{DateTime, DynStore, Record, StoreResult};

/// The log records (positions left to the store) of committed `rec`'s
/// events, from its members' post-images `forwarded` (member index and
/// the document as rolled forward): one per changed member, then the
/// `transaction.committed` event.
pub(crate) fn transaction_records(rec: &TxnRecord, forwarded: &[(usize, &StoredDoc)], at: DateTime) -> Vec<Record> {
    let committed = rec.committed_at.unwrap_or(at);
    let mut out = Vec::with_capacity(forwarded.len() + 1);
    for (i, doc) in forwarded {
        let m = &rec.members[*i];
        if let Some(kind) = EventType::of_staged(m.op) {
            let mut r = model::document_event(
                kind,
                &m.collection,
                doc,
                Some(&rec.id),
                rec.key.as_deref(),
                rec.user.as_ref(),
                committed,
            );
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
}

impl TxnEvents {
    pub(crate) fn new(store: DynStore, clock: Clock) -> Arc<Self> {
        Arc::new(Self { store, clock })
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
                    Ok(Some(Some((i, doc.rolled_forward(committed)))))
                }
                Ok(_) => Ok(None),
                Err(err) => {
                    tracing::warn!(txn.id = %rec.id, collection = %m.collection, id = %m.id, error = %err, "no event for a member that cannot be read");
                    Ok(Some(None))
                }
            }
        });
        let held: Vec<Option<(usize, StoredDoc)>> = futures::future::join_all(reads)
            .await
            .into_iter()
            .collect::<StoreResult<Vec<_>>>()?
            .into_iter()
            .flatten()
            .collect();
        if held.is_empty() {
            return Ok(());
        }
        let forwarded: Vec<(usize, StoredDoc)> = held.into_iter().flatten().collect();
        let refs: Vec<(usize, &StoredDoc)> = forwarded.iter().map(|(i, d)| (*i, d)).collect();
        // The members' events first; the transaction's own only once every
        // one of them is in the log, whoever put it there. Another helper
        // may be appending the same events at once and win some of them at
        // later positions: a position taken after all members exist is
        // larger than each of theirs, so the transaction's event comes last.
        let mut records = transaction_records(rec, &refs, at);
        let own = records.pop().expect("the transaction's own event is last");
        self.store.append_all(EVENTS, records).await?;
        self.store.unsynced().append(EVENTS, own).await?;
        Ok(())
    }

    fn has_any(&self, _: &TxnRecord) -> bool {
        true
    }

    fn chained(&self, rec: &TxnRecord, forwarded: &[(usize, &StoredDoc)]) -> Option<Vec<(&'static str, Record)>> {
        Some(transaction_records(rec, forwarded, self.clock.now()).into_iter().map(|r| (EVENTS, r)).collect())
    }
}

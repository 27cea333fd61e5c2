//! A single-document write's event on its way to the log: the document
//! carries it in its outbox until it is appended.

use super::EVENTS;
use crate::document::StoredDoc;
use crate::store::{DateTime, Store, StoreError, StoreResult, Write};

/// Make sure the event `doc` holds in its outbox is in the log, then clear
/// the outbox (unless the document moved on). Readers never call this;
/// writers do before they write a document that has one, and recovery for
/// any a crash left behind.
pub(crate) async fn publish_outbox(store: &dyn Store, coll: &str, doc: &StoredDoc, at: DateTime) -> StoreResult<()> {
    let Some(outbox) = &doc.meta.outbox else { return Ok(()) };
    let Ok(eid) = outbox.get_str("_id") else {
        return Err(StoreError::Internal(format!("{coll}/{}: outbox without an event id", doc.id)));
    };
    let mut record = outbox.clone();
    record.insert("logged_at", at);
    let chain = vec![
        (EVENTS, Write::Append(record)),
        (
            coll,
            Write::Update {
                id: &doc.id,
                filter: StoredDoc::outbox_filter(doc.meta.v, eid),
                update: StoredDoc::clear_outbox(),
            },
        ),
    ];
    if store.unsynced().in_order(chain).await? == 0 {
        // It was in the log already: only the outbox is left to clear.
        let (filter, clear) = (StoredDoc::outbox_filter(doc.meta.v, eid), StoredDoc::clear_outbox());
        store.unsynced().update(coll, &doc.id, filter, clear).await?;
    }
    Ok(())
}

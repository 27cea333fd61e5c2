//! Change events of a filtered set (docs/design.md §7): a reader that names
//! one collection and a filter gets exactly the changes that add a document
//! to the set, change one in it, or take one out of it (deleted, expired,
//! or no longer matching: the event then says `"left": true`), in log
//! order; no other change, and no `transaction.committed` event.
//!
//! Whether the document was in the set before a change is learned from its
//! previous version's event (`<collection>/<id>/<version - 1>`, which is
//! earlier in the log): a `document.created` had nothing before it; a
//! version whose previous event the log no longer holds counts as having
//! been in the set (a reader then drops a document it may not hold,
//! rather than miss one it does).

use std::sync::Arc;

use super::model::EventType;
use super::{EVENTS, Log, Ready};
use crate::query::filter::Matcher;
use crate::store::convert::object_to_document;
use crate::store::{Document, StoreResult};

/// The document before an event's change.
#[derive(Debug)]
pub(crate) enum Prior {
    /// It did not exist, or was a tombstone.
    Absent,
    /// Its data.
    Data(Document),
    /// The log no longer holds its previous version.
    Unknown,
}

/// A filtered set of one collection's documents.
#[derive(Debug)]
pub(crate) struct SetFilter {
    pub collection: String,
    pub filter: Matcher,
}

impl SetFilter {
    /// `ready` as a reader of the set sees it: `None` when the change
    /// neither adds a document to the set, changes one in it, nor takes one
    /// out; the event marked `left` when it takes one out.
    pub(crate) async fn judge(&self, log: &Log, ready: &Arc<Ready>) -> StoreResult<Option<Arc<Ready>>> {
        let event = &ready.event;
        let changed =
            matches!(event.kind, EventType::Created | EventType::Updated | EventType::Deleted | EventType::Expired);
        if !changed || event.collection.as_deref() != Some(self.collection.as_str()) {
            return Ok(None);
        }
        let after = match (event.kind, &event.data) {
            (EventType::Created | EventType::Updated, Some(data)) => self.filter.matches(&object_to_document(data)),
            _ => false,
        };
        let before = match ready.prior.get_or_try_init(|| prior(log, ready)).await? {
            Prior::Absent => false,
            Prior::Data(data) => self.filter.matches(data),
            Prior::Unknown => true,
        };
        Ok(match (before, after) {
            (false, false) => None,
            (true, false) => {
                let mut left = event.clone();
                left.left = Some(true);
                Some(Ready::new(left))
            }
            _ => Some(Arc::clone(ready)),
        })
    }
}

impl Ready {
    /// The document before this event's change, learned once from the log.
    pub(crate) async fn prior(&self, log: &Log) -> StoreResult<&Prior> {
        self.prior.get_or_try_init(|| prior(log, self)).await
    }
}

/// The document before `ready`'s change, from the log.
async fn prior(log: &Log, ready: &Ready) -> StoreResult<Prior> {
    let event = &ready.event;
    let (Some(coll), Some(id), Some(version)) = (&event.collection, &event.document, event.version) else {
        return Ok(Prior::Unknown);
    };
    // A create is over nothing or over a tombstone.
    if event.kind == EventType::Created || version <= 1 {
        return Ok(Prior::Absent);
    }
    let previous = super::model::document_event_id(coll, id, version - 1);
    let Some(rec) = log.store.get(EVENTS, &previous).await? else { return Ok(Prior::Unknown) };
    Ok(match rec.get_str("type").ok().and_then(EventType::parse) {
        Some(EventType::Created | EventType::Updated) => {
            Prior::Data(rec.get_document("data").cloned().unwrap_or_default())
        }
        Some(EventType::Deleted | EventType::Expired) => Prior::Absent,
        _ => Prior::Unknown,
    })
}

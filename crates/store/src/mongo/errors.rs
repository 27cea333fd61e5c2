//! What a MongoDB error means to the store: unavailable, a document the
//! server refuses, a duplicate key, a hint naming no index.

use mongodb::error::{Error as MongoError, ErrorKind, WriteFailure};

use crate::StoreError;

pub(super) const DUPLICATE_KEY: i32 = 11000;

/// Error codes meaning "this document cannot be stored as it is".
pub(super) const REJECTED_CODES: &[i32] = &[2, 14, 52, 55, 56, 57, 10334, 15974, 16755, 17419, 238];

pub(super) fn map_err(err: MongoError) -> StoreError {
    match err.kind.as_ref() {
        ErrorKind::ServerSelection { .. }
        | ErrorKind::Io(_)
        | ErrorKind::ConnectionPoolCleared { .. }
        | ErrorKind::DnsResolve { .. } => StoreError::Unavailable(err.to_string()),
        ErrorKind::Write(WriteFailure::WriteError(e)) if REJECTED_CODES.contains(&e.code) => {
            StoreError::Rejected(e.message.clone())
        }
        ErrorKind::Command(e) if REJECTED_CODES.contains(&e.code) => StoreError::Rejected(e.message.clone()),
        ErrorKind::BsonSerialization(e) => StoreError::Rejected(e.to_string()),
        ErrorKind::Write(WriteFailure::WriteError(e)) if e.code == DUPLICATE_KEY => {
            StoreError::Duplicate(e.message.clone())
        }
        _ => match rejected_in_reply(&err) {
            Some(message) => StoreError::Rejected(message),
            None => StoreError::Internal(err.to_string()),
        },
    }
}

/// Whether `err` is the server's refusal of a hint that names no index of
/// the collection: an index a query was planned on and that was dropped
/// since (a drop waits out every instance's cache first, so only a read
/// that ran that long meets it), or a template index of a collection
/// another instance is creating at this moment (its indexes are made one
/// after another). Either way the same read without the hint returns the
/// same records (no index is sparse or partial), if more slowly.
pub(super) fn missing_hint(err: &MongoError) -> bool {
    matches!(err.kind.as_ref(), ErrorKind::Command(e) if e.code == 2 && e.message.to_ascii_lowercase().contains("hint"))
}

/// A write error refusing the document, found in a server reply the driver
/// could not read as a whole (a server that omits fields of a write reply
/// still says which write it refused and why).
fn rejected_in_reply(err: &MongoError) -> Option<String> {
    let reply = err.server_response()?;
    let first = reply.get_array("writeErrors").ok()?.into_iter().next()?.ok()?;
    let first = first.as_document()?;
    let code = first.get_i32("code").ok()?;
    REJECTED_CODES.contains(&code).then(|| first.get_str("errmsg").unwrap_or("refused").to_owned())
}

/// A duplicate key: `Some(true)` on `_id` (the record exists), `Some(false)`
/// on a secondary unique index.
pub(super) fn duplicate(err: &MongoError) -> Option<bool> {
    match err.kind.as_ref() {
        ErrorKind::Write(WriteFailure::WriteError(e)) if e.code == DUPLICATE_KEY => {
            Some(e.message.contains("_id_") || !e.message.contains("index:"))
        }
        _ => None,
    }
}

/// A duplicate key, whatever the command (an insert racing another).
pub(super) fn is_duplicate(err: &MongoError) -> bool {
    match err.kind.as_ref() {
        ErrorKind::Write(WriteFailure::WriteError(e)) => e.code == DUPLICATE_KEY,
        ErrorKind::Command(e) => e.code == DUPLICATE_KEY,
        _ => err.to_string().contains("E11000"),
    }
}

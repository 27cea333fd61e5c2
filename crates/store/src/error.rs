//! The failures of the data layer, as every layer above it sees them: the
//! store's backends map theirs onto these, the protocol and the document
//! layer carry them, and the HTTP layer maps them to problems
//! (`http/error.rs`) without knowing the store.

/// Errors every backend maps its failures onto.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The store could not be reached or did not answer in time.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// The store refused the document itself (size, field names, nesting).
    #[error("store rejected the document: {0}")]
    Rejected(String),
    /// The write would give a unique index a second record with one value.
    #[error("duplicate key in unique index {0}")]
    Duplicate(String),
    /// A stored record that cannot be decoded (corrupt, or nested beyond
    /// the decoding bound): the message names its collection and id.
    #[error("undecodable record: {0}")]
    Undecodable(String),
    /// Anything else: a bug or a corrupted record.
    #[error("store error: {0}")]
    Internal(String),
}

pub type StoreResult<T> = Result<T, StoreError>;

//! The storage engine (the `txgate-store` crate, re-exported here whole) and
//! the one layer the gateway adds over it: [`deadline`], which bounds every
//! store call and records it in the gateway's metrics.

pub(crate) use txgate_store::*;

pub(crate) mod deadline;

/// A record built directly is what serde writes: the same fields, values
/// and types, in the same order (document equality alone ignores order).
#[cfg(test)]
pub(crate) fn assert_written_as_serde(built: &Document, by_serde: &Document) {
    assert_eq!(built, by_serde);
    assert_eq!(built.keys().collect::<Vec<_>>(), by_serde.keys().collect::<Vec<_>>());
}

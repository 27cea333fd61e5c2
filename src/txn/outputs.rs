//! The outputs port: what a committed transaction leaves behind besides its
//! documents (hook deliveries now; change events next). Roll-forward makes
//! every output exist before it releases any lock (docs/design.md §3 step 5), so an
//! output is never lost for a commit and never made for an abort.

use async_trait::async_trait;

use crate::document::StoredDoc;
use crate::store::{Record, StoreResult};

use super::record::TxnRecord;

/// One kind of output. `ensure` is called for a committed transaction, by
/// any instance, any number of times, concurrently: it must be idempotent
/// (insert-if-absent under ids derived from the transaction).
#[async_trait]
pub(crate) trait Outputs: Send + Sync {
    async fn ensure(&self, rec: &TxnRecord) -> StoreResult<()>;

    /// Whether `rec` leaves any output of this kind.
    fn has_any(&self, rec: &TxnRecord) -> bool;

    /// The records that make this output exist, as appends to log
    /// collections, from committed `rec` and its changed members: for a
    /// transaction that commits in one chain of writes. `None`: this
    /// output cannot be made that way, and `ensure` must run instead.
    fn chained(&self, _rec: &TxnRecord, _forwarded: &[Forwarded<'_>]) -> Option<Vec<(&'static str, Record)>> {
        None
    }
}

/// A member of a committing transaction: its index among the members, its
/// document as locked (the change staged, the data still as before it) and
/// as rolled forward.
#[derive(Clone, Copy)]
pub(crate) struct Forwarded<'a> {
    pub index: usize,
    pub locked: &'a StoredDoc,
    pub after: &'a StoredDoc,
}

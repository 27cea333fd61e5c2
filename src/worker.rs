//! The one shape of a background worker. Every worker a gateway runs
//! implements [`Worker`], and the gateway lists them in one place
//! ([`crate::workers`]): each runs until its stop token is cancelled, and
//! the step it is in then finishes.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use crate::store::StoreResult;

/// A background worker of the gateway.
#[async_trait::async_trait]
pub trait Worker: Send + Sync + 'static {
    /// What the worker is called in logs.
    fn name(&self) -> &'static str;

    /// Work until `stop` is cancelled; the step under way finishes first.
    async fn run(self: Arc<Self>, stop: CancellationToken);

    /// One whole pass now, without waiting for its interval or backing
    /// off: what a test drives instead of sleeping until the next pass.
    /// Safe beside the passes `run` makes, as passes of several instances
    /// are.
    async fn run_once(&self) -> StoreResult<()>;
}

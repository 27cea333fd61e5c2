//! What the integration tests (`tests/it`) and the benchmark binary
//! (`src/bin/bench`) reach into, named here one item at a time (the storage
//! engine they use directly: it is its own crate, `txgate-store`). None of it
//! is an API: the crate's interface is the HTTP API and the binary. Every
//! module above is private to the crate; an item a test needs is added
//! here, deliberately, under the path it has inside the crate.

/// [`crate::run_with_store`], handing `handles` the gateway's [`Handles`]
/// once it is built, so a test can wait for its follow-up work and run
/// its workers' passes.
pub async fn serve(
    config: crate::config::Config,
    store: crate::store::DynStore,
    listener: tokio::net::TcpListener,
    shutdown: tokio_util::sync::CancellationToken,
    handles: Option<tokio::sync::oneshot::Sender<Handles>>,
) -> Result<(), crate::RunError> {
    crate::serve(config, store, listener, shutdown, handles).await
}

/// What a test drives a running gateway by instead of sleeping.
pub struct Handles {
    /// The work requests leave for after their answers.
    pub(crate) follow_ups: crate::follow_ups::FollowUps,
    pub(crate) workers: Vec<std::sync::Arc<dyn crate::worker::Worker>>,
}

impl Handles {
    /// Until no work a request left for after its answer is under way.
    pub async fn idle(&self) {
        self.follow_ups.idle().await;
    }

    /// The names of the gateway's workers, in the order they start.
    pub fn names(&self) -> Vec<&'static str> {
        self.workers.iter().map(|w| w.name()).collect()
    }

    /// One whole pass of the worker called `name` (`recovery`,
    /// `deliveries`, `subscriptions`, `ttl`, `purge`, `event_purge`,
    /// `index_builds`), now.
    pub async fn run_once(&self, name: &str) -> crate::store::StoreResult<()> {
        let worker = self.workers.iter().find(|w| w.name() == name);
        worker.unwrap_or_else(|| panic!("no worker is called {name:?}")).run_once().await
    }
}

/// Waiting on a condition a `Notify` announces changes of.
pub use crate::wake::until as woken_until;

pub mod clock {
    pub use crate::clock::{Clock, rfc3339};
}

pub mod document {
    pub use crate::document::{Staged, StagedOp, StoredDoc, View};
    pub mod rules {
        pub use crate::document::rules::{MAX_DATA_DEPTH, Patch};
    }
}

pub mod events {
    pub use crate::events::model::EventType;
    pub use crate::events::{EVENTS, Log, Tap};
    pub mod model {
        pub use crate::events::model::document_event;
    }
    /// The log record of a document's event, as its writer appends it.
    pub use crate::events::outbox::entry as log_entry;
}

pub mod hooks {
    pub use crate::hooks::{DELIVERIES, HookConfig, Hooks};
    pub use crate::txn::hook::hooks_of;
    pub mod guard {
        pub use crate::hooks::guard::HookGuard;
    }
    pub mod net {
        pub use crate::hooks::net::Clients;
    }
    pub mod send {
        pub use crate::hooks::send::Sender;
    }
    pub mod sign {
        pub use crate::hooks::sign::Signer;
    }
}

pub mod schemas {
    pub use crate::schemas::compile::{Compiled, MAX_CHECK_COST, compile};
}

pub mod http {
    pub use crate::http::openapi_json;
    pub mod error {
        pub use crate::http::error::ProblemCode;
    }
}

pub mod indexes {
    /// How long a new declaration waits before its build starts.
    pub use crate::indexes::GRACE;
}

pub mod keys {
    pub use crate::keys::{Grant, parse_keys};
}

pub mod metrics {
    pub use crate::metrics::{FAMILIES, Metrics};
}

pub mod migrate {
    pub use crate::migrate::{MIGRATIONS, MIGRATIONS_COLLECTION, declared_indexes, run, templates};
}

pub mod txn {
    pub use crate::txn::record::Status;
    pub use crate::txn::{Transactions, TxnConfig};
    pub mod age {
        pub use crate::txn::age::txn_age;
    }
    pub mod commit {
        pub use crate::txn::commit::TxnError;
    }
    pub mod plan {
        pub use crate::txn::plan::{Action, ActionOp, Plan};
    }
    pub mod record {
        pub use crate::txn::record::{Member, Status, TXNS, TxnRecord};
    }
}

pub mod worker {
    pub use crate::worker::Worker;
}

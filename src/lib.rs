//! txgate: an HTTP/JSON gateway in front of MongoDB (or its embedded store)
//! giving clients multi-document transactions, optimistic locking and
//! durable post-commit webhooks on a store whose only atomic primitive is a
//! single-document conditional update.
//!
//! The library is what the `txgate` binary runs: the configuration
//! ([`config`]), [`run`] and the few calls below. Every module is private
//! to the crate; the integration tests and the benchmark reach into it
//! through [`testing`] only, one item at a time. `pub` means reachable from
//! outside the crate; an item only the crate uses is `pub(crate)` (checked
//! by `unreachable_pub`).
#![warn(unreachable_pub)]

mod actor;
mod clock;
mod collections;
pub mod config;
mod conflicts;
mod document;
mod documents;
mod events;
mod follow_ups;
mod hooks;
mod http;
mod identity;
mod indexes;
mod keys;
mod metrics;
mod migrate;
mod positioned;
mod purge;
mod queries;
mod query;
mod rules;
mod schema_checks;
mod schemas;
mod seal;
mod store;
mod subscriptions;
#[doc(hidden)]
pub mod testing;
mod tickets;
mod txn;
mod wake;
mod worker;

pub use http::openapi_json;
pub use migrate::{MIGRATIONS, run as migrate};
/// `txgate rules test FILE`: a suite of rules cases run in memory.
pub use rules::suite::{Outcome as RulesOutcome, run as test_rules};

/// The embedded store's write-ahead journal, for `txgate journal truncate`.
pub mod journal {
    pub use txgate_store::disk::DirDisk;
    pub use txgate_store::embedded::{DATABASE_FILE, JOURNAL_FILE, truncate_journal};
    pub use txgate_store::journal::Truncation;
}

use std::sync::Arc;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use config::{Config, StoreConfig};
use documents::Documents;
use hooks::Hooks;
use metrics::Metrics;
use store::{DynStore, StoreError};
use txn::{Transactions, TxnConfig};

/// Why the gateway could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("server error: {0}")]
    Io(#[from] std::io::Error),
}

/// Open the backend the configuration names, as it is: the gateway puts
/// its layers over it with [`stack`]. On MongoDB it logs which server it
/// is on (`buildInfo`), and warns on a server where several instances lose
/// updates (docs/operating.md, "Servers").
pub async fn open_store(cfg: &StoreConfig) -> Result<DynStore, StoreError> {
    let raw: DynStore = match cfg {
        StoreConfig::Embedded { .. } => {
            let (dir, options) = cfg.embedded().expect("an embedded store's configuration");
            Arc::new(store::embedded::EmbeddedStore::open_dir(dir, &options)?)
        }
        StoreConfig::Mongodb { uri, database } => {
            let mongo = store::mongo::MongoStore::connect(uri, database).await?;
            match mongo.server().await {
                Ok(server) => {
                    if server.supports_several_instances() {
                        tracing::info!(server = %server, "mongodb server (buildInfo)");
                    } else {
                        tracing::warn!(
                            server = %server,
                            "this server runs a filtered write as a read then a separate write: several gateway \
                             instances on it lose updates; run one instance, or use MongoDB 6+ or FerretDB 2.7 \
                             with DocumentDB (docs/operating.md, \"Servers\")"
                        );
                    }
                    Arc::new(mongo.for_server(&server))
                }
                Err(err) => {
                    tracing::warn!(error = %err, "could not read the mongodb server's buildInfo");
                    Arc::new(mongo)
                }
            }
        }
    };
    Ok(raw)
}

/// The store stack, built here and only here, bottom to top over the
/// backend `raw`:
///
/// 1. index templates: a user collection gets the indexes the migrations
///    declare for `*` before its first write lands ([`store::templates`]);
/// 2. a deadline of `timeout` on every bounded operation, each timed into
///    `metrics` ([`store::deadline`]): a store that stops answering gives
///    503s, never a hang, and no lock is held past it;
/// 3. the event log's tap: an append that landed wakes this process's
///    event streams at once ([`events::tap`]).
///
/// Returns the stack and its tap, for the event log.
pub fn stack(raw: DynStore, timeout: std::time::Duration, metrics: &Arc<Metrics>) -> (DynStore, events::Tap) {
    let templated: DynStore = Arc::new(store::templates::Templates::over(raw, migrate::templates()));
    let bounded: DynStore = Arc::new(store::deadline::Deadline::over(templated, timeout, Arc::clone(metrics)));
    let tap = events::Tap::default();
    (Arc::new(tap.over(bounded)), tap)
}

/// Everything a running gateway is made of.
pub struct App {
    /// The store stack everything above runs on.
    pub store: DynStore,
    pub txns: Arc<Transactions>,
    pub hooks: Arc<Hooks>,
    pub documents: Arc<Documents>,
    pub metrics: Arc<Metrics>,
    pub events: Arc<events::Log>,
    pub subscriptions: Arc<subscriptions::Subscriptions>,
    pub collections: Arc<collections::Collections>,
    pub indexes: Arc<indexes::Indexes>,
    pub queries: Arc<queries::Queries>,
    pub positioned: Arc<positioned::Positioned>,
    pub(crate) conflicts: Arc<conflicts::Conflicts>,
    /// Cancelled at shutdown: open event streams end.
    pub stop: CancellationToken,
}

/// The transaction services with their outputs (change events and hook
/// deliveries), as a gateway runs them.
pub fn transactions(store: DynStore, cfg: TxnConfig, metrics: Arc<Metrics>) -> (Arc<Transactions>, Arc<Hooks>) {
    let rules = rules::Rules::new(Arc::clone(&store), cfg.clock.clone());
    transactions_judged_by(store, cfg, metrics, rules)
}

/// [`transactions`], with the collections' rules `rules` (what change
/// events keep of the documents before their changes).
fn transactions_judged_by(
    store: DynStore,
    cfg: TxnConfig,
    metrics: Arc<Metrics>,
    rules: Arc<rules::Rules>,
) -> (Arc<Transactions>, Arc<Hooks>) {
    let hooks = Hooks::new(Arc::clone(&store), Arc::clone(&metrics), cfg.clock.clone());
    let events = txn::TxnEvents::new(Arc::clone(&store), cfg.clock.clone(), rules);
    let outputs: Vec<Arc<dyn txn::outputs::Outputs>> = vec![events as _, Arc::clone(&hooks) as _];
    (Transactions::build(store, cfg, metrics, outputs), hooks)
}

impl App {
    /// The gateway's parts on `store`, the [`stack`] with `tap` in it,
    /// recording into `metrics`.
    pub fn new(config: &Config, store: DynStore, tap: events::Tap, metrics: Arc<Metrics>) -> Self {
        if store.syncs().is_some() {
            let store = Arc::clone(&store);
            metrics.sampled("txgate_store_syncs_total", "Durable syncs (fsyncs) of the embedded store", move || {
                store.syncs().unwrap_or(0)
            });
        }
        if store.checkpoints().is_some() {
            let (count, took) = (Arc::clone(&store), Arc::clone(&store));
            let help = "Checkpoints of the embedded store (its file made durable; writes wait meanwhile)";
            metrics.sampled("txgate_store_checkpoints_total", help, move || count.checkpoints().map_or(0, |c| c.0));
            let help = "Time writes waited for the embedded store's checkpoints, in all";
            metrics.sampled_seconds("txgate_store_checkpoint_seconds_total", help, move || {
                took.checkpoints().map_or(std::time::Duration::ZERO, |c| c.1)
            });
        }
        let mut events_cfg = config.events.clone();
        events_cfg.clock = config.txn.clock.clone();
        // One view of the collections' rules: what events keep, and who
        // reads what.
        let rules = rules::Rules::new(Arc::clone(&store), config.txn.clock.clone());
        let (txns, hooks) =
            transactions_judged_by(Arc::clone(&store), config.txn.clone(), Arc::clone(&metrics), Arc::clone(&rules));
        let events = events::Log::settling(Arc::clone(&store), tap, events_cfg, txns.follow_ups().clone());
        let log = Arc::clone(&events);
        metrics.sampled("txgate_events_written_total", "Change events this instance appended to the log", move || {
            log.appended()
        });
        let publisher = events::Publisher::new(
            Arc::clone(&store),
            config.txn.clock.clone(),
            txns.follow_ups().clone(),
            Arc::clone(&rules),
        );
        let indexes = indexes::Indexes::new(Arc::clone(&store), config.txn.clock.clone());
        let documents = Arc::new(Documents::new(
            Arc::clone(&store),
            Arc::clone(txns.locks()),
            publisher,
            config.txn.clock.clone(),
            Arc::clone(&metrics),
            config.txn.lock_wait,
            (Arc::clone(&indexes), schemas::Schemas::new(Arc::clone(&store), config.txn.clock.clone())),
        ));
        {
            // The counter, not the documents (which hold the metrics).
            let (store, skipped) = (Arc::clone(&store), documents.unreadable());
            metrics.sampled(
                "txgate_store_unreadable_records_total",
                "Stored records reads could not decode (skipped by background passes, lists and queries; see the log for which)",
                move || store.unreadable() + skipped.load(std::sync::atomic::Ordering::Relaxed),
            );
        }
        // The counts, not the schemas (which the documents hold, and they the metrics).
        let counts = Arc::clone(documents.schemas().counts());
        metrics.sampled(
            "txgate_schema_refusals_total",
            "Writes refused because the document they would produce does not satisfy its schema",
            move || counts.refused.load(std::sync::atomic::Ordering::Relaxed),
        );
        let counts = Arc::clone(documents.schemas().counts());
        metrics.sampled(
            "txgate_schema_warnings_total",
            "Writes of documents that do not satisfy their schema, let through under validation warn",
            move || counts.warned.load(std::sync::atomic::Ordering::Relaxed),
        );
        let positioned = Arc::new(positioned::Positioned::new(
            Arc::clone(&documents),
            Arc::clone(&events),
            txns.follow_ups().clone(),
            config.txn.lock_wait,
        ));
        let queries =
            Arc::new(queries::Queries::new(Arc::clone(&documents), Arc::clone(&indexes), Arc::clone(&positioned)));
        let conflicts = Arc::new(conflicts::Conflicts::new(Arc::clone(&documents), Arc::clone(&events)));
        let subscriptions = subscriptions::Subscriptions::new(
            Arc::clone(&store),
            Arc::clone(&events),
            Arc::clone(&hooks),
            rules,
            config.max_subscriptions_per_key,
        );
        let collections =
            collections::Collections::new(Arc::clone(&store), Arc::clone(&events), config.txn.clock.clone());
        let stop = CancellationToken::new();
        Self {
            store,
            txns,
            hooks,
            documents,
            metrics,
            events,
            subscriptions,
            collections,
            indexes,
            queries,
            positioned,
            conflicts,
            stop,
        }
    }

    /// The TTL sweeper of this gateway.
    pub fn sweeper(&self, config: &Config) -> collections::ttl::Sweeper {
        collections::ttl::Sweeper::new(
            Arc::clone(&self.collections),
            Arc::clone(&self.documents),
            Arc::clone(&self.metrics),
            config.txn.clock.clone(),
            config.ttl_interval,
        )
    }

    pub fn router(&self, config: &Config) -> axum::Router {
        let state = http::AppState::new(http::Shared {
            documents: Arc::clone(&self.documents),
            store: Arc::clone(&self.store),
            txns: Arc::clone(&self.txns),
            follow_ups: self.txns.follow_ups().clone(),
            hooks: Arc::clone(&self.hooks),
            hook_guard: Arc::new(config.hook_guard.clone()),
            events: Arc::clone(&self.events),
            subscriptions: Arc::clone(&self.subscriptions),
            collections: Arc::clone(&self.collections),
            indexes: Arc::clone(&self.indexes),
            rules: self.subscriptions.rules(),
            queries: Arc::clone(&self.queries),
            positioned: Arc::clone(&self.positioned),
            conflicts: Arc::clone(&self.conflicts),
            metrics: Arc::clone(&self.metrics),
            stop: self.stop.clone(),
            streams: Arc::new(tokio::sync::Semaphore::new(config.max_streams.max(1))),
            catch_up: Arc::new(tokio::sync::Semaphore::new(http::events::CATCH_UP_READS)),
            backups: http::admin::Backups::new(&config.store, config.backups.clone()),
            seal: seal::Seal::new(Arc::clone(&self.store)),
            tickets: Arc::new(tickets::Tickets::new(Arc::clone(&self.store), config.txn.clock.clone())),
        });
        http::router(state, config)
    }
}

/// Serve on `listener` with the backend `store` (under its [`stack`])
/// until `shutdown` is cancelled, then finish in-flight requests and
/// background steps and return.
pub async fn run_with_store(
    config: Config,
    store: DynStore,
    listener: TcpListener,
    shutdown: CancellationToken,
) -> Result<(), RunError> {
    serve(config, store, listener, shutdown, None).await
}

/// [`run_with_store`], handing `handles` (when given, to a test) the
/// tracker of the work requests leave for after their answer
/// (roll-forwards, events on their way to the log, stored idempotency
/// outcomes) and the workers, once they are built.
pub(crate) async fn serve(
    config: Config,
    store: DynStore,
    listener: TcpListener,
    shutdown: CancellationToken,
    handles: Option<tokio::sync::oneshot::Sender<testing::Handles>>,
) -> Result<(), RunError> {
    let metrics = Arc::new(Metrics::default());
    let (store, tap) = stack(store, config.txn.store_timeout, &metrics);
    let applied = migrate::run(store.as_ref()).await?;
    if !applied.is_empty() {
        tracing::info!(count = applied.len(), "migrations applied");
    }
    let app = App::new(&config, store, tap, metrics);
    let router = app.router(&config);
    let clients = hooks::net::Clients::new(Arc::new(config.hook_guard.clone()), config.hooks.timeout)
        .map_err(std::io::Error::other)?;
    let sender = hooks::send::Sender::new(Arc::clone(&app.hooks), config.hooks.clone(), clients);
    let abandon = sender.abandon();
    let workers = tokio_util::task::TaskTracker::new();
    let stop_workers = CancellationToken::new();
    let mut running = Vec::new();
    let listed = workers_of(&app, &config, sender);
    if let Some(handles) = handles {
        let _ = handles.send(testing::Handles { follow_ups: app.txns.follow_ups().clone(), workers: listed.clone() });
    }
    for worker in listed {
        let span = tracing::info_span!("worker", name = worker.name());
        let name = worker.name();
        running.push((name, workers.spawn(tracing::Instrument::instrument(worker.run(stop_workers.clone()), span))));
    }
    workers.close();
    tracing::info!(addr = %listener.local_addr()?, store = app.store.backend(), "txgate listening");
    let streams = app.stop.clone();
    // The stop's deadline, from the moment it is asked for.
    let deadline = Arc::new(std::sync::OnceLock::new());
    let drain = config.shutdown_timeout;
    let stopping = {
        let deadline = Arc::clone(&deadline);
        async move {
            shutdown.cancelled().await;
            let _ = deadline.set(tokio::time::Instant::now() + drain);
            // Open event streams end at once; the rest drains.
            streams.cancel();
        }
    };
    http::serve::serve(listener, router, config.header_timeout, stopping, drain).await?;
    tracing::info!("HTTP server stopped; finishing background work");
    // Workers finish the step they are in, and delivery attempts in
    // flight finish, until the deadline; attempts still waiting on a
    // receiver then are abandoned (sent again later), and a pass still
    // under way a moment later is stopped where it is: every step of
    // every pass is safe to stop at, as a crash would, and the next start
    // takes its work up again. Then request follow-ups finish.
    stop_workers.cancel();
    let deadline = deadline.get().copied().unwrap_or_else(tokio::time::Instant::now);
    if tokio::time::timeout_at(deadline, workers.wait()).await.is_err() {
        tracing::warn!("background work still running at the shutdown timeout: abandoning delivery attempts in flight");
        abandon.cancel();
        if tokio::time::timeout(ABANDON_GRACE, workers.wait()).await.is_err() {
            for (name, task) in running.iter().filter(|(_, task)| !task.is_finished()) {
                tracing::warn!(worker = name, "a background pass still running: stopping it where it is");
                task.abort();
            }
            workers.wait().await;
        }
    }
    app.txns.tasks().close();
    app.txns.tasks().wait().await;
    // Everything written so far durable before the process ends.
    app.store.sync().await?;
    tracing::info!("shutdown complete");
    Ok(())
}

/// How long a stop waits, past its deadline, for delivery attempts it
/// abandoned to be put back and for background passes to end, before it
/// stops the passes still under way.
const ABANDON_GRACE: std::time::Duration = std::time::Duration::from_millis(500);

/// Every background worker a gateway runs, listed here and only here:
/// transaction recovery, hook and event deliveries, the subscriptions'
/// delivery recorder, the TTL sweeper, the purge of finished records and
/// the purge of the event log and tombstones.
fn workers_of(app: &App, config: &Config, sender: Arc<hooks::send::Sender>) -> Vec<Arc<dyn worker::Worker>> {
    vec![
        Arc::clone(app.txns.recovery()) as _,
        sender as _,
        Arc::clone(&app.subscriptions) as _,
        Arc::new(app.sweeper(config)) as _,
        Arc::new(purger(app, config)) as _,
        Arc::new(events::Purge { log: Arc::clone(&app.events), interval: config.txn.recovery_interval }) as _,
        Arc::new(indexes::Builds { indexes: Arc::clone(&app.indexes), interval: config.txn.recovery_interval }) as _,
        Arc::new(schema_checks::Checks {
            store: Arc::clone(&app.store),
            schemas: Arc::clone(app.documents.schemas()),
            documents: Arc::clone(&app.documents),
            clock: config.txn.clock.clone(),
            owner: indexes::lease_owner(app.store.as_ref()),
            interval: config.txn.recovery_interval,
            busy: tokio::sync::Mutex::new(()),
        }) as _,
    ]
}

/// The purge worker of finished transactions, idempotency claims and
/// finished deliveries.
fn purger(app: &App, config: &Config) -> purge::Purger {
    use store::scans::{DELIVERIES_BY_FINISH, IDEM_BY_AGE, TICKETS_BY_EXPIRY, TXNS_BY_FINISH};
    let statuses = |s: &[store::Bson]| s.iter().map(|s| vec![s.clone()]).collect();
    let rules = vec![
        purge::Rule {
            what: "transactions",
            decl: &TXNS_BY_FINISH,
            eq: statuses(&[txn::Status::Done.to_bson(), txn::Status::RolledBack.to_bson()]),
            retention: config.txn.retention,
        },
        purge::Rule {
            what: "idempotency_keys",
            decl: &IDEM_BY_AGE,
            eq: vec![Vec::new()],
            retention: config.txn.idempotency_retention,
        },
        purge::Rule {
            what: "tickets",
            decl: &TICKETS_BY_EXPIRY,
            eq: vec![Vec::new()],
            retention: std::time::Duration::ZERO,
        },
        purge::Rule {
            what: "deliveries",
            decl: &DELIVERIES_BY_FINISH,
            eq: statuses(&[hooks::DeliveryStatus::Delivered.to_bson(), hooks::DeliveryStatus::Dead.to_bson()]),
            retention: config.hooks.retention,
        },
    ];
    purge::Purger::new(
        Arc::clone(&app.store),
        config.txn.clock.clone(),
        Arc::clone(&app.metrics),
        rules,
        config.txn.recovery_interval,
    )
}

/// Open the configured store and serve (see [`run_with_store`]).
pub async fn run(config: Config, listener: TcpListener, shutdown: CancellationToken) -> Result<(), RunError> {
    let store = open_store(&config.store).await?;
    let served = run_with_store(config, Arc::clone(&store), listener, shutdown).await;
    // The store this gateway opened closes with it: the embedded store
    // checkpoints and joins its writer, so the next start replays nothing.
    store.close().await?;
    tracing::info!("store closed");
    served
}

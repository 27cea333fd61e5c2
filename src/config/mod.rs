//! Configuration: command-line flags, `TXGATE_*` environment variables and
//! an optional TOML file (`--config`), in that order of precedence.

use std::path::PathBuf;
use std::time::Duration;

mod settings;

pub use crate::identity::settings::{IssuerConfig, IssuerEntry, IssuerSecret};
pub use settings::{Cli, Command, JournalCommand, LogFormat, RulesCommand, Secret, Settings, StoreKind, redact_uri};

use crate::hooks::HookConfig;
use crate::hooks::guard::HookGuard;
use crate::keys::ApiKey;
use crate::txn::TxnConfig;

/// The resolved configuration. Its `Debug` shows no credential: API keys,
/// the hook secret and a MongoDB URI's password are redacted.
#[derive(Clone, Debug)]
pub struct Config {
    pub listen: String,
    pub store: StoreConfig,
    pub log_format: LogFormat,
    pub txn: TxnConfig,
    pub ttl_interval: Duration,
    pub max_body_bytes: usize,
    /// Requests served at once (health and readiness checks aside); more
    /// are answered 429 at once, never queued.
    pub max_concurrency: usize,
    /// Requests one API key may have in flight at once.
    pub max_concurrency_per_key: usize,
    /// Event streams open at once.
    pub max_streams: usize,
    /// Event streams one API key may have open at once on this instance.
    pub max_streams_per_key: usize,
    /// Subscriptions one API key may have.
    pub max_subscriptions_per_key: usize,
    /// What backups may take of the data's disk.
    pub backups: Backups,
    /// Time to receive a whole request body.
    pub body_timeout: Duration,
    /// Time to receive a request's headers (and longest idle time of a
    /// kept-alive connection).
    pub header_timeout: Duration,
    /// Longest wait at a stop for requests and webhook attempts in flight.
    pub shutdown_timeout: Duration,
    /// Empty, with no issuers: no authentication, loopback only.
    pub api_keys: Vec<ApiKey>,
    /// OpenID Connect issuers whose users' tokens are accepted.
    pub issuers: Vec<IssuerConfig>,
    /// What a request without credentials may do; `None`: nothing.
    pub anonymous: Option<Vec<crate::keys::Grant>>,
    pub hook_guard: HookGuard,
    pub hooks: HookConfig,
    pub events: crate::events::EventsConfig,
    /// Origins browsers may call from; empty: none (no CORS headers).
    pub cors: Cors,
}

/// What backups of the embedded store may take of the data's disk.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Backups {
    /// Free space a backup must leave, in bytes.
    pub reserve_bytes: u64,
    /// Backups kept; the oldest beyond are removed after a new one.
    pub kept: usize,
}

impl Default for Backups {
    fn default() -> Self {
        Self { reserve_bytes: 1 << 30, kept: 5 }
    }
}

/// Which origins may call from a browser.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Cors {
    #[default]
    None,
    /// Any origin (`*`); credentials are never allowed with it.
    Any,
    /// These origins (`scheme://host[:port]`, as browsers send them).
    Origins(Vec<String>),
}

impl Cors {
    /// Whether `origin` (an `Origin` header's value) is one the list
    /// allows; `*` allows any but `null` (a sandboxed page's).
    pub fn lists(&self, origin: &str) -> bool {
        match self {
            Cors::None => false,
            Cors::Any => origin != "null",
            Cors::Origins(list) => list.iter().any(|o| o == origin),
        }
    }

    /// Parse `TXGATE_CORS_ORIGINS`.
    pub fn parse(spec: &str) -> Result<Self, String> {
        let items: Vec<&str> = spec.split(',').map(str::trim).filter(|s| !s.is_empty()).collect();
        if items.is_empty() {
            return Ok(Cors::None);
        }
        if items.contains(&"*") {
            return if items.len() == 1 {
                Ok(Cors::Any)
            } else {
                Err("cors_origins: `*` stands alone (it allows every origin)".into())
            };
        }
        let mut origins = Vec::new();
        for item in items {
            let url = url::Url::parse(item).map_err(|e| format!("cors_origins: {item:?} is not an origin: {e}"))?;
            let origin = url.origin().ascii_serialization();
            if !matches!(url.scheme(), "http" | "https") || origin != item.trim_end_matches('/') || url.path() != "/" {
                return Err(format!(
                    "cors_origins: {item:?} is not an origin (scheme://host[:port], no path), e.g. {origin:?}"
                ));
            }
            origins.push(origin);
        }
        Ok(Cors::Origins(origins))
    }
}

pub use crate::store::embedded::{DEFAULT_CACHE_MB, DEFAULT_CHECKPOINT_INTERVAL, DEFAULT_SYNC_INTERVAL};

#[derive(Clone)]
pub enum StoreConfig {
    Embedded {
        data_dir: PathBuf,
        cache_mb: u64,
        sync_interval: Duration,
        /// The longest a commit waits for a checkpoint.
        checkpoint_interval: Duration,
    },
    Mongodb {
        uri: String,
        database: String,
    },
}

impl StoreConfig {
    /// The embedded store's directory and the options it is opened with
    /// (its page cache, sync and checkpoint intervals); `None` for MongoDB.
    pub fn embedded(&self) -> Option<(&std::path::Path, crate::store::embedded::Options)> {
        let StoreConfig::Embedded { data_dir, cache_mb, sync_interval, checkpoint_interval } = self else {
            return None;
        };
        let options = crate::store::embedded::Options {
            cache_bytes: cache_mb.saturating_mul(1 << 20),
            sync_interval: *sync_interval,
            checkpoint_interval: Some(*checkpoint_interval),
            ..crate::store::embedded::Options::default()
        };
        Some((data_dir, options))
    }
}

impl std::fmt::Debug for StoreConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StoreConfig::Embedded { data_dir, cache_mb, sync_interval, checkpoint_interval } => f
                .debug_struct("Embedded")
                .field("data_dir", data_dir)
                .field("cache_mb", cache_mb)
                .field("sync_interval", sync_interval)
                .field("checkpoint_interval", checkpoint_interval)
                .finish(),
            StoreConfig::Mongodb { uri, database } => {
                f.debug_struct("Mongodb").field("uri", &redact_uri(uri)).field("database", database).finish()
            }
        }
    }
}

impl Default for Config {
    fn default() -> Self {
        Self {
            listen: "127.0.0.1:8080".into(),
            store: StoreConfig::Embedded {
                data_dir: PathBuf::from("./data"),
                cache_mb: DEFAULT_CACHE_MB,
                sync_interval: DEFAULT_SYNC_INTERVAL,
                checkpoint_interval: DEFAULT_CHECKPOINT_INTERVAL,
            },
            log_format: LogFormat::Text,
            txn: TxnConfig::default(),
            ttl_interval: Duration::from_millis(500),
            max_body_bytes: 1024 * 1024,
            max_concurrency: 1024,
            max_concurrency_per_key: 256,
            max_streams: 1000,
            max_streams_per_key: 250,
            max_subscriptions_per_key: 100,
            backups: Backups::default(),
            body_timeout: Duration::from_secs(10),
            header_timeout: Duration::from_secs(10),
            // Docker's default grace period is 10 s: the store's close
            // needs well under the 2 s left.
            shutdown_timeout: Duration::from_secs(8),
            api_keys: Vec::new(),
            issuers: Vec::new(),
            anonymous: None,
            cors: Cors::None,
            hook_guard: HookGuard::default(),
            hooks: HookConfig::default(),
            events: crate::events::EventsConfig::default(),
        }
    }
}

impl Config {
    /// Whether no credential is configured: every request is served, on
    /// loopback only.
    pub fn keyless(&self) -> bool {
        self.api_keys.is_empty() && self.issuers.is_empty()
    }
}

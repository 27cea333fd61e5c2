//! The settings as given: command-line flags and subcommands, `TXGATE_*`
//! environment variables and the TOML file, merged in that order of
//! precedence and resolved into a [`Config`].

use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};
use serde::Deserialize;

use super::{Config, Cors, DEFAULT_CACHE_MB, DEFAULT_CHECKPOINT_INTERVAL, DEFAULT_SYNC_INTERVAL, StoreConfig};
use crate::hooks::HookConfig;
use crate::hooks::guard::HookGuard;
use crate::hooks::sign::Signer;
use crate::keys::KeysSetting;
use crate::txn::TxnConfig;

#[derive(Parser, Debug)]
#[command(name = "txgate", version, about = "HTTP/JSON gateway for MongoDB with multi-document transactions")]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    #[command(flatten)]
    pub settings: Settings,
}

#[derive(Subcommand, Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// Serve the HTTP API (the default).
    Serve,
    /// Apply the store migrations and exit.
    Migrate,
    /// Print the OpenAPI document (or write it to --output) and exit.
    Openapi {
        /// File to write instead of standard output.
        #[arg(long)]
        output: Option<PathBuf>,
    },
    /// Ask the gateway serving at the configured address whether it is
    /// ready: exit 0 when `GET /readyz` answers 200, 1 otherwise (for a
    /// container's health check, where no curl is installed).
    Healthcheck {
        /// How long to wait for the answer, in milliseconds.
        #[arg(long, default_value_t = 3000)]
        timeout_ms: u64,
    },
    /// Work on the embedded store's journal (with the gateway stopped).
    Journal {
        #[command(subcommand)]
        action: JournalCommand,
    },
    /// Work with per-document rules (docs/guides/rules.md).
    Rules {
        #[command(subcommand)]
        action: RulesCommand,
    },
}

#[derive(Subcommand, Debug, Clone, PartialEq, Eq)]
pub enum RulesCommand {
    /// Run a suite of cases (principals, documents, requests and what they
    /// must answer) against a collection's rules, in memory, with the
    /// gateway's own evaluator: exit 0 when every case passes, 1 when one
    /// fails, 2 when the suite is not valid.
    Test {
        /// The suite (JSON).
        file: PathBuf,
    },
}

#[derive(Subcommand, Debug, Clone, PartialEq, Eq)]
pub enum JournalCommand {
    /// Cut the journal at the offset a refused start named: the entries
    /// before it are kept, it and everything after it are lost. Only for a
    /// journal the gateway refused to open as damaged, when no backup is
    /// to be had. `--at 0` drops the whole journal (every write since the
    /// last checkpoint): the only cut for a journal whose header is
    /// unreadable.
    Truncate {
        /// Where the damaged entry starts, as the error gave it.
        #[arg(long)]
        at: u64,
        /// Print what the cut would keep and drop, and write nothing.
        #[arg(long)]
        dry_run: bool,
    },
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StoreKind {
    Embedded,
    Mongodb,
}

/// Every setting, each optional here so the layers can be merged.
#[derive(clap::Args, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    /// TOML file with any of these settings (flags and environment win).
    #[arg(long, global = true, env = "TXGATE_CONFIG")]
    #[serde(skip)]
    pub config: Option<PathBuf>,
    /// Address to serve on.
    #[arg(long, global = true, env = "TXGATE_LISTEN")]
    pub listen: Option<String>,
    /// Which store to use (default: mongodb when a URI is set, else embedded).
    #[arg(long, global = true, env = "TXGATE_STORE")]
    pub store: Option<StoreKind>,
    /// Embedded store directory.
    #[arg(long, global = true, env = "TXGATE_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// Page cache of the embedded store, in MiB (its memory use is bounded
    /// by this, not by the data).
    #[arg(long, global = true, env = "TXGATE_CACHE_MB")]
    pub cache_mb: Option<u64>,
    /// Longest time an unsynced write of the embedded store waits to be
    /// made durable, in milliseconds (writes a client is told of are
    /// always synced first).
    #[arg(long, global = true, env = "TXGATE_SYNC_INTERVAL_MS")]
    pub sync_interval_ms: Option<u64>,
    /// Longest time a commit of the embedded store waits for a checkpoint,
    /// in milliseconds (besides one every 16 MiB of journal): a checkpoint
    /// writes every page changed since the last while writes wait, so a
    /// shorter interval makes those pauses shorter and more frequent.
    #[arg(long, global = true, env = "TXGATE_CHECKPOINT_INTERVAL_MS")]
    pub checkpoint_interval_ms: Option<u64>,
    /// Use the mongodb backend at this URI.
    #[arg(long, global = true, env = "TXGATE_MONGODB_URI", hide_env_values = true)]
    pub mongodb_uri: Option<Secret>,
    /// MongoDB database name.
    #[arg(long, global = true, env = "TXGATE_MONGODB_DATABASE")]
    pub mongodb_database: Option<String>,
    /// `text` or `json`.
    #[arg(long, global = true, env = "TXGATE_LOG_FORMAT")]
    pub log_format: Option<LogFormat>,
    /// Transaction lease, in milliseconds.
    #[arg(long, global = true, env = "TXGATE_LEASE_MS")]
    pub lease_ms: Option<u64>,
    /// How long a writer waits for a lock, in milliseconds.
    #[arg(long, global = true, env = "TXGATE_LOCK_WAIT_MS")]
    pub lock_wait_ms: Option<u64>,
    /// Hard cap on a transaction's whole life, in milliseconds (it aborts
    /// itself after).
    #[arg(long, global = true, env = "TXGATE_TXN_MAX_MS")]
    pub txn_max_ms: Option<u64>,
    /// Deadline of every store operation, in milliseconds (then 503).
    #[arg(long, global = true, env = "TXGATE_STORE_TIMEOUT_MS")]
    pub store_timeout_ms: Option<u64>,
    /// Recovery worker period, in milliseconds.
    #[arg(long, global = true, env = "TXGATE_RECOVERY_INTERVAL_MS")]
    pub recovery_interval_ms: Option<u64>,
    /// Allowed clock difference between instances, in milliseconds.
    #[arg(long, global = true, env = "TXGATE_CLOCK_SKEW_MS")]
    pub clock_skew_ms: Option<u64>,
    /// How long finished transaction records are kept, in seconds.
    #[arg(long, global = true, env = "TXGATE_TXN_RETENTION_SECS")]
    pub txn_retention_secs: Option<u64>,
    /// How long idempotency keys are remembered, in seconds.
    #[arg(long, global = true, env = "TXGATE_IDEMPOTENCY_RETENTION_SECS")]
    pub idempotency_retention_secs: Option<u64>,
    /// TTL sweeper period, in milliseconds.
    #[arg(long, global = true, env = "TXGATE_TTL_INTERVAL_MS")]
    pub ttl_interval_ms: Option<u64>,
    /// How long change events are kept, in seconds (a cursor older gets 410).
    #[arg(long, global = true, env = "TXGATE_EVENT_RETENTION_SECS")]
    pub event_retention_secs: Option<u64>,
    /// How long tombstones are kept, in seconds; at least the event
    /// retention.
    #[arg(long, global = true, env = "TXGATE_TOMBSTONE_RETENTION_SECS")]
    pub tombstone_retention_secs: Option<u64>,
    /// Request body limit in bytes (413 beyond).
    #[arg(long, global = true, env = "TXGATE_MAX_BODY_BYTES")]
    pub max_body_bytes: Option<usize>,
    /// Requests served at once; beyond, 429 `overloaded`.
    #[arg(long, global = true, env = "TXGATE_MAX_CONCURRENCY")]
    pub max_concurrency: Option<usize>,
    /// Requests one API key may have in flight at once; beyond, 429
    /// `overloaded` for that key only (default: a quarter of
    /// max_concurrency).
    #[arg(long, global = true, env = "TXGATE_MAX_CONCURRENCY_PER_KEY")]
    pub max_concurrency_per_key: Option<usize>,
    /// Event streams (SSE) open at once on this instance; beyond, 429.
    #[arg(long, global = true, env = "TXGATE_MAX_STREAMS")]
    pub max_streams: Option<usize>,
    /// Event streams one API key may have open at once on this instance
    /// (default: a quarter of max_streams); beyond, 429 for that key only.
    #[arg(long, global = true, env = "TXGATE_MAX_STREAMS_PER_KEY")]
    pub max_streams_per_key: Option<usize>,
    /// Subscriptions one API key may have (created with it and not
    /// deleted); beyond, 409 `subscription_limit`.
    #[arg(long, global = true, env = "TXGATE_MAX_SUBSCRIPTIONS_PER_KEY")]
    pub max_subscriptions_per_key: Option<usize>,
    /// Free space, in MiB, a backup must leave on the data's disk: one that
    /// would leave less is refused (507 `insufficient_storage`).
    #[arg(long, global = true, env = "TXGATE_BACKUP_RESERVE_MB")]
    pub backup_reserve_mb: Option<u64>,
    /// Backups kept in `<data dir>/backups`: once a new one is written, the
    /// oldest beyond this many are removed.
    #[arg(long, global = true, env = "TXGATE_BACKUPS_KEPT")]
    pub backups_kept: Option<usize>,
    /// Time a client has to send a whole request body, in milliseconds
    /// (408 beyond, and the connection closes).
    #[arg(long, global = true, env = "TXGATE_BODY_TIMEOUT_MS")]
    pub body_timeout_ms: Option<u64>,
    /// Time a client has to send a request's headers, in milliseconds; a
    /// connection idle between requests for as long is closed too.
    #[arg(long, global = true, env = "TXGATE_HEADER_TIMEOUT_MS")]
    pub header_timeout_ms: Option<u64>,
    /// How long a stop (SIGTERM) waits for requests and webhook attempts
    /// in flight, in milliseconds, before it closes the connections left
    /// and abandons the attempts (retried later); the store is then closed
    /// either way. Keep it under the orchestrator's grace period.
    #[arg(long, global = true, env = "TXGATE_SHUTDOWN_TIMEOUT_MS")]
    pub shutdown_timeout_ms: Option<u64>,
    /// Most actions in one transaction.
    #[arg(long, global = true, env = "TXGATE_MAX_ACTIONS")]
    pub max_actions: Option<usize>,
    /// Most hooks in one transaction.
    #[arg(long, global = true, env = "TXGATE_MAX_HOOKS")]
    pub max_hooks: Option<usize>,
    /// Hook destinations allowed even when private or loopback:
    /// `host`, `host:port`, `*.domain`, `127.0.0.1:*`, comma-separated.
    #[arg(long, global = true, env = "TXGATE_HOOK_ALLOW")]
    pub hook_allow: Option<String>,
    /// Standard Webhooks signing secret, `whsec_<base64>` (unset: unsigned).
    #[arg(long, global = true, env = "TXGATE_HOOK_SECRET", hide_env_values = true)]
    pub hook_secret: Option<Secret>,
    /// Timeout of one delivery attempt, in milliseconds.
    #[arg(long, global = true, env = "TXGATE_HOOK_TIMEOUT_MS")]
    pub hook_timeout_ms: Option<u64>,
    /// Age at which an undelivered hook is given up (dead), in seconds.
    #[arg(long, global = true, env = "TXGATE_HOOK_MAX_AGE_SECS")]
    pub hook_max_age_secs: Option<u64>,
    /// Most delivery attempts in flight per instance.
    #[arg(long, global = true, env = "TXGATE_HOOK_CONCURRENCY")]
    pub hook_concurrency: Option<usize>,
    /// Most delivery attempts in flight per instance to one destination
    /// (host and port).
    #[arg(long, global = true, env = "TXGATE_HOOK_PER_DESTINATION")]
    pub hook_per_destination: Option<usize>,
    /// How long finished deliveries are kept, in seconds.
    #[arg(long, global = true, env = "TXGATE_DELIVERY_RETENTION_SECS")]
    pub delivery_retention_secs: Option<u64>,
    /// API keys, `key:scope[+scope],...` with scopes read, write, admin,
    /// each on every collection or on one (`read@orders`). In the TOML
    /// file also a list of `{ key = "...", scopes = ["read@orders"] }`.
    #[arg(long, global = true, env = "TXGATE_API_KEYS", hide_env_values = true)]
    pub api_keys: Option<KeysSetting>,
    /// Origins browsers may call from (CORS), comma-separated
    /// (`https://app.example.com`), or `*` for any (never with credentials).
    #[arg(long, global = true, env = "TXGATE_CORS_ORIGINS")]
    pub cors_origins: Option<String>,
    /// OpenID Connect issuers whose users' access tokens are accepted: in
    /// the TOML file, `[[issuers]]` tables (docs/guides/users.md); by
    /// variables, one issuer (`TXGATE_ISSUER` and the `TXGATE_ISSUER_*`
    /// settings), which then replaces the file's.
    #[arg(skip)]
    #[serde(default)]
    pub issuers: Option<Vec<super::IssuerEntry>>,
    #[command(flatten)]
    #[serde(skip)]
    pub issuer: IssuerVars,
    /// Grants for requests that carry no credential, in the API keys'
    /// grammar (`read@products`); unset: such requests are refused.
    #[arg(long, global = true, env = "TXGATE_ANONYMOUS")]
    pub anonymous: Option<String>,
}

/// One issuer by variables (`TXGATE_ISSUER` and the settings beside it).
#[derive(clap::Args, Debug, Default, Clone)]
pub struct IssuerVars {
    /// The issuer URL (`iss`), found by OpenID Connect discovery.
    #[arg(long = "issuer", global = true, env = "TXGATE_ISSUER")]
    pub url: Option<String>,
    /// Accepted audiences, comma-separated (required with an issuer).
    #[arg(long = "issuer-audiences", global = true, env = "TXGATE_ISSUER_AUDIENCES")]
    pub audiences: Option<String>,
    /// Roles to grants: `role=grant[+grant];role=...`.
    #[arg(long = "issuer-roles", global = true, env = "TXGATE_ISSUER_ROLES")]
    pub roles: Option<String>,
    /// Where the roles are in a token (a claim name or a dotted path).
    #[arg(long = "issuer-roles-claim", global = true, env = "TXGATE_ISSUER_ROLES_CLAIM")]
    pub roles_claim: Option<String>,
    /// Allowed algorithms, comma-separated.
    #[arg(long = "issuer-algorithms", global = true, env = "TXGATE_ISSUER_ALGORITHMS")]
    pub algorithms: Option<String>,
    /// Clock leeway, in seconds.
    #[arg(long = "issuer-leeway-secs", global = true, env = "TXGATE_ISSUER_LEEWAY_SECS")]
    pub leeway_secs: Option<u64>,
    /// A user's request rate (`50/s`).
    #[arg(long = "issuer-rate", global = true, env = "TXGATE_ISSUER_RATE")]
    pub rate: Option<String>,
    /// Where each role's users may send hooks: `role=prefix[,prefix];...`.
    #[arg(long = "issuer-hooks", global = true, env = "TXGATE_ISSUER_HOOKS")]
    pub hooks: Option<String>,
    /// The HS256 secret of this issuer alone.
    #[arg(long = "issuer-hs256-secret", global = true, env = "TXGATE_ISSUER_HS256_SECRET", hide_env_values = true)]
    pub hs256_secret: Option<super::IssuerSecret>,
    /// The JWKS address, for a provider without discovery.
    #[arg(long = "issuer-jwks-url", global = true, env = "TXGATE_ISSUER_JWKS_URL")]
    pub jwks_url: Option<String>,
    /// The console's client id at the provider.
    #[arg(long = "issuer-console-client-id", global = true, env = "TXGATE_ISSUER_CONSOLE_CLIENT_ID")]
    pub console_client_id: Option<String>,
}

impl IssuerVars {
    /// The issuer these variables give, if `TXGATE_ISSUER` is set.
    fn entry(&self) -> Result<Option<super::IssuerEntry>, String> {
        let Some(url) = self.url.as_ref().filter(|u| !u.trim().is_empty()) else {
            return Ok(None);
        };
        let list = |s: &Option<String>| -> Option<Vec<String>> {
            s.as_ref().map(|s| s.split(',').map(|a| a.trim().to_owned()).filter(|a| !a.is_empty()).collect())
        };
        Ok(Some(super::IssuerEntry {
            url: url.trim().to_owned(),
            audiences: list(&self.audiences).unwrap_or_default(),
            algorithms: list(&self.algorithms),
            leeway_secs: self.leeway_secs,
            roles_claim: self.roles_claim.clone(),
            roles: match &self.roles {
                Some(spec) => crate::identity::settings::parse_roles(spec)?,
                None => Default::default(),
            },
            rate: self.rate.clone(),
            hooks: match &self.hooks {
                Some(spec) => crate::identity::settings::parse_hooks(spec)?,
                None => Default::default(),
            },
            hs256_secret: self.hs256_secret.clone(),
            jwks_url: self.jwks_url.clone(),
            console_client_id: self.console_client_id.clone(),
            ..Default::default()
        }))
    }
}

/// A setting that is a credential (the hook secret) or may hold one (a
/// MongoDB URI with a password): `Debug` never shows it.
#[derive(Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(transparent)]
pub struct Secret(pub String);

impl std::str::FromStr for Secret {
    type Err = std::convert::Infallible;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(Secret(s.to_owned()))
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("[redacted]")
    }
}

/// `uri` with the password of its user information, if any, replaced:
/// what logs and `Debug` show of a MongoDB URI.
pub fn redact_uri(uri: &str) -> String {
    let Some((scheme, rest)) = uri.split_once("://") else { return "[redacted]".to_owned() };
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    match rest[..authority_end].rfind('@') {
        Some(at) => {
            let user = rest[..at].split(':').next().unwrap_or("");
            format!("{scheme}://{user}:[redacted]@{}", &rest[at + 1..])
        }
        None => uri.to_owned(),
    }
}

fn positive(name: &str, value: Option<u64>, default: Duration) -> Result<Duration, String> {
    match value {
        None => Ok(default),
        Some(0) => Err(format!("{name} must be greater than 0")),
        Some(ms) => Ok(Duration::from_millis(ms)),
    }
}

impl Settings {
    /// Fill what flags and environment left unset from `file`.
    fn or(self, file: Settings) -> Settings {
        Settings {
            config: self.config,
            listen: self.listen.or(file.listen),
            store: self.store.or(file.store),
            data_dir: self.data_dir.or(file.data_dir),
            cache_mb: self.cache_mb.or(file.cache_mb),
            sync_interval_ms: self.sync_interval_ms.or(file.sync_interval_ms),
            checkpoint_interval_ms: self.checkpoint_interval_ms.or(file.checkpoint_interval_ms),
            mongodb_uri: self.mongodb_uri.or(file.mongodb_uri),
            mongodb_database: self.mongodb_database.or(file.mongodb_database),
            log_format: self.log_format.or(file.log_format),
            lease_ms: self.lease_ms.or(file.lease_ms),
            lock_wait_ms: self.lock_wait_ms.or(file.lock_wait_ms),
            txn_max_ms: self.txn_max_ms.or(file.txn_max_ms),
            store_timeout_ms: self.store_timeout_ms.or(file.store_timeout_ms),
            recovery_interval_ms: self.recovery_interval_ms.or(file.recovery_interval_ms),
            clock_skew_ms: self.clock_skew_ms.or(file.clock_skew_ms),
            txn_retention_secs: self.txn_retention_secs.or(file.txn_retention_secs),
            idempotency_retention_secs: self.idempotency_retention_secs.or(file.idempotency_retention_secs),
            ttl_interval_ms: self.ttl_interval_ms.or(file.ttl_interval_ms),
            event_retention_secs: self.event_retention_secs.or(file.event_retention_secs),
            tombstone_retention_secs: self.tombstone_retention_secs.or(file.tombstone_retention_secs),
            max_body_bytes: self.max_body_bytes.or(file.max_body_bytes),
            max_concurrency: self.max_concurrency.or(file.max_concurrency),
            max_concurrency_per_key: self.max_concurrency_per_key.or(file.max_concurrency_per_key),
            max_streams: self.max_streams.or(file.max_streams),
            max_streams_per_key: self.max_streams_per_key.or(file.max_streams_per_key),
            max_subscriptions_per_key: self.max_subscriptions_per_key.or(file.max_subscriptions_per_key),
            backup_reserve_mb: self.backup_reserve_mb.or(file.backup_reserve_mb),
            backups_kept: self.backups_kept.or(file.backups_kept),
            body_timeout_ms: self.body_timeout_ms.or(file.body_timeout_ms),
            header_timeout_ms: self.header_timeout_ms.or(file.header_timeout_ms),
            shutdown_timeout_ms: self.shutdown_timeout_ms.or(file.shutdown_timeout_ms),
            max_actions: self.max_actions.or(file.max_actions),
            max_hooks: self.max_hooks.or(file.max_hooks),
            api_keys: self.api_keys.or(file.api_keys),
            cors_origins: self.cors_origins.or(file.cors_origins),
            hook_allow: self.hook_allow.or(file.hook_allow),
            hook_secret: self.hook_secret.or(file.hook_secret),
            hook_timeout_ms: self.hook_timeout_ms.or(file.hook_timeout_ms),
            hook_max_age_secs: self.hook_max_age_secs.or(file.hook_max_age_secs),
            hook_concurrency: self.hook_concurrency.or(file.hook_concurrency),
            hook_per_destination: self.hook_per_destination.or(file.hook_per_destination),
            delivery_retention_secs: self.delivery_retention_secs.or(file.delivery_retention_secs),
            issuers: self.issuers.or(file.issuers),
            issuer: self.issuer,
            anonymous: self.anonymous.or(file.anonymous),
        }
    }

    /// Merge with the `--config` file, apply defaults and check values.
    pub fn resolve(self) -> Result<Config, String> {
        let settings = match &self.config {
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .map_err(|e| format!("cannot read config file {}: {e}", path.display()))?;
                let file: Settings =
                    toml::from_str(&text).map_err(|e| format!("config file {}: {e}", path.display()))?;
                self.or(file)
            }
            None => self,
        };
        let defaults = Config::default();
        let uri = settings.mongodb_uri.map(|u| u.0).filter(|u| !u.is_empty());
        let store = match (settings.store, uri) {
            (Some(StoreKind::Mongodb), None) => {
                return Err("--store mongodb needs TXGATE_MONGODB_URI (or --mongodb-uri)".into());
            }
            (Some(StoreKind::Mongodb) | None, Some(uri)) => {
                StoreConfig::Mongodb { uri, database: settings.mongodb_database.unwrap_or_else(|| "txgate".into()) }
            }
            (Some(StoreKind::Embedded) | None, _) => StoreConfig::Embedded {
                data_dir: settings.data_dir.unwrap_or_else(|| PathBuf::from("./data")),
                cache_mb: settings.cache_mb.unwrap_or(DEFAULT_CACHE_MB).max(1),
                sync_interval: positive("sync_interval_ms", settings.sync_interval_ms, DEFAULT_SYNC_INTERVAL)?,
                checkpoint_interval: positive(
                    "checkpoint_interval_ms",
                    settings.checkpoint_interval_ms,
                    DEFAULT_CHECKPOINT_INTERVAL,
                )?,
            },
        };
        let d = &defaults.txn;
        let txn = TxnConfig {
            lease: positive("lease_ms", settings.lease_ms, d.lease)?,
            lock_wait: settings.lock_wait_ms.map_or(d.lock_wait, Duration::from_millis),
            clock_skew: settings.clock_skew_ms.map_or(d.clock_skew, Duration::from_millis),
            recovery_interval: positive("recovery_interval_ms", settings.recovery_interval_ms, d.recovery_interval)?,
            max_duration: positive("txn_max_ms", settings.txn_max_ms, d.max_duration)?,
            store_timeout: positive("store_timeout_ms", settings.store_timeout_ms, d.store_timeout)?,
            retention: settings.txn_retention_secs.map_or(d.retention, Duration::from_secs),
            idempotency_retention: settings
                .idempotency_retention_secs
                .map_or(d.idempotency_retention, Duration::from_secs),
            max_actions: settings.max_actions.unwrap_or(d.max_actions).max(1),
            max_hooks: settings.max_hooks.unwrap_or(d.max_hooks),
            clock: crate::clock::Clock::System,
        };
        let max_body_bytes = settings.max_body_bytes.unwrap_or(defaults.max_body_bytes);
        if max_body_bytes < 1024 {
            return Err("max_body_bytes must be at least 1024".into());
        }
        let api_keys = match &settings.api_keys {
            None => Vec::new(),
            Some(setting) => setting.keys()?.unwrap_or_default(),
        };
        // A key a client could mistake for a token, or the gateway for one.
        if let Some(k) = api_keys.iter().find(|k| crate::identity::looks_like_jwt(&k.key)) {
            return Err(format!(
                "API key {:?} has the shape of a JWT (three base64url segments separated by dots): \
                 tokens and keys must not be confused; choose another key",
                k.name
            ));
        }
        let entries = match settings.issuer.entry()? {
            Some(entry) => vec![entry],
            None => settings.issuers.clone().unwrap_or_default(),
        };
        let issuers = entries.iter().enumerate().map(|(n, e)| e.resolve(n + 1)).collect::<Result<Vec<_>, _>>()?;
        crate::identity::settings::distinct(&issuers)?;
        let anonymous = match settings.anonymous.as_deref().map(str::trim) {
            None | Some("") => None,
            Some(spec) => Some(
                spec.split('+')
                    .map(|g| crate::keys::Grant::parse(g.trim()))
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| format!("anonymous: {e}"))?,
            ),
        };
        if anonymous.is_some() && api_keys.is_empty() && issuers.is_empty() {
            return Err("anonymous grants need API keys or issuers: without either, every request is served \
                 (on loopback only)"
                .into());
        }
        let hook_guard = HookGuard::new(settings.hook_allow.as_deref().unwrap_or(""))?;
        let h = &defaults.hooks;
        let hooks = HookConfig {
            signer: match settings.hook_secret.as_ref().map(|s| s.0.trim()) {
                None | Some("") => None,
                Some(secret) => Some(Signer::from_secret(secret)?),
            },
            timeout: positive("hook_timeout_ms", settings.hook_timeout_ms, h.timeout)?,
            max_age: match settings.hook_max_age_secs {
                Some(0) => return Err("hook_max_age_secs must be greater than 0".into()),
                v => v.map_or(h.max_age, Duration::from_secs),
            },
            retention: settings.delivery_retention_secs.map_or(h.retention, Duration::from_secs),
            concurrency: match settings.hook_concurrency {
                Some(0) => return Err("hook_concurrency must be greater than 0".into()),
                v => v.unwrap_or(h.concurrency),
            },
            per_destination: match settings.hook_per_destination {
                Some(0) => return Err("hook_per_destination must be greater than 0".into()),
                v => v.unwrap_or(h.per_destination),
            },
            scan_interval: h.scan_interval,
            claim_grace: h.claim_grace,
        };
        let cors = Cors::parse(settings.cors_origins.as_deref().unwrap_or(""))?;
        let e = crate::events::EventsConfig::default();
        let events = crate::events::EventsConfig {
            retention: match settings.event_retention_secs {
                Some(0) => return Err("event_retention_secs must be greater than 0".into()),
                v => v.map_or(e.retention, Duration::from_secs),
            },
            tombstone_retention: settings.tombstone_retention_secs.map_or(e.tombstone_retention, Duration::from_secs),
            clock_skew: txn.clock_skew,
            ..e
        };
        if events.tombstone_retention < events.retention {
            return Err(format!(
                "tombstone_retention_secs ({}) must be at least event_retention_secs ({}): a document re-created after \
                 its tombstone is gone starts at version 1 again, and must not reuse a retained event id",
                events.tombstone_retention.as_secs(),
                events.retention.as_secs()
            ));
        }
        if events.tombstone_retention < hooks.retention {
            return Err(format!(
                "tombstone_retention_secs ({}) must be at least delivery_retention_secs ({}): a document re-created \
                 after its tombstone is gone starts at version 1 again, and its events' deliveries to a \
                 subscription must not reuse the id of one still kept",
                events.tombstone_retention.as_secs(),
                hooks.retention.as_secs()
            ));
        }
        let max_concurrency = match settings.max_concurrency {
            Some(0) => return Err("max_concurrency must be greater than 0".into()),
            v => v.unwrap_or(defaults.max_concurrency),
        };
        let max_streams = match settings.max_streams {
            Some(0) => return Err("max_streams must be greater than 0".into()),
            v => v.unwrap_or(defaults.max_streams),
        };
        Ok(Config {
            events,
            hooks,
            hook_guard,
            api_keys,
            issuers,
            anonymous,
            cors,
            listen: settings.listen.unwrap_or(defaults.listen),
            store,
            log_format: settings.log_format.unwrap_or_default(),
            txn,
            ttl_interval: positive("ttl_interval_ms", settings.ttl_interval_ms, defaults.ttl_interval)?,
            max_body_bytes,
            max_concurrency,
            max_concurrency_per_key: match settings.max_concurrency_per_key {
                Some(0) => return Err("max_concurrency_per_key must be greater than 0".into()),
                v => v.unwrap_or((max_concurrency / 4).max(1)),
            },
            max_streams,
            max_streams_per_key: match settings.max_streams_per_key {
                Some(0) => return Err("max_streams_per_key must be greater than 0".into()),
                v => v.unwrap_or((max_streams / 4).max(1)),
            },
            max_subscriptions_per_key: match settings.max_subscriptions_per_key {
                Some(0) => return Err("max_subscriptions_per_key must be greater than 0".into()),
                v => v.unwrap_or(defaults.max_subscriptions_per_key),
            },
            backups: crate::config::Backups {
                reserve_bytes: settings
                    .backup_reserve_mb
                    .map_or(defaults.backups.reserve_bytes, |mb| mb.saturating_mul(1 << 20)),
                kept: match settings.backups_kept {
                    Some(0) => return Err("backups_kept must be greater than 0".into()),
                    v => v.unwrap_or(defaults.backups.kept),
                },
            },
            body_timeout: positive("body_timeout_ms", settings.body_timeout_ms, defaults.body_timeout)?,
            header_timeout: positive("header_timeout_ms", settings.header_timeout_ms, defaults.header_timeout)?,
            shutdown_timeout: positive("shutdown_timeout_ms", settings.shutdown_timeout_ms, defaults.shutdown_timeout)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_embedded_on_loopback() {
        let cfg = Settings::default().resolve().unwrap();
        assert_eq!(cfg.listen, "127.0.0.1:8080");
        assert!(matches!(cfg.store, StoreConfig::Embedded { .. }));
        assert_eq!(cfg.txn.lease, Duration::from_millis(5000));
        assert_eq!(cfg.max_body_bytes, 1_048_576);
    }

    #[test]
    fn a_uri_selects_mongodb_and_file_fills_gaps() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("txgate.toml");
        std::fs::write(&path, "mongodb_uri = \"mongodb://x\"\nlease_ms = 700\nlisten = \"0.0.0.0:1\"\n").unwrap();
        let settings = Settings { config: Some(path), listen: Some("127.0.0.1:9".into()), ..Default::default() };
        let cfg = settings.resolve().unwrap();
        assert_eq!(cfg.listen, "127.0.0.1:9");
        assert_eq!(cfg.txn.lease, Duration::from_millis(700));
        assert!(matches!(cfg.store, StoreConfig::Mongodb { ref database, .. } if database == "txgate"));
    }

    #[test]
    fn keys_come_as_a_string_or_as_toml_tables() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("txgate.toml");
        let file = r#"
[[api_keys]]
key = "orders-team-0123456789"
scopes = ["read@orders", "write@orders"]

[[api_keys]]
key = "operator-key-0123456789"
scopes = ["admin"]
"#;
        std::fs::write(&path, file).unwrap();
        let cfg = Settings { config: Some(path.clone()), ..Default::default() }.resolve().unwrap();
        assert_eq!(cfg.api_keys.len(), 2);
        assert_eq!(cfg.api_keys[0].grants[1].collection.as_deref(), Some("orders"));
        assert_eq!(cfg.api_keys[1].grants[0].collection, None);
        // The environment's string wins over the file.
        let env = Some(KeysSetting::Spec("from-the-env-0123456:read@carts".into()));
        let cfg = Settings { config: Some(path.clone()), api_keys: env, ..Default::default() }.resolve().unwrap();
        assert_eq!(cfg.api_keys.len(), 1);
        std::fs::write(&path, "api_keys = \"string-form-0123456789:write@carts+read\"\n").unwrap();
        let cfg = Settings { config: Some(path.clone()), ..Default::default() }.resolve().unwrap();
        assert_eq!(cfg.api_keys[0].grants.len(), 2);
        for bad in [
            "[[api_keys]]\nkey = \"orders-team-0123456789\"\nscopes = [\"read@_txns\"]\n",
            "[[api_keys]]\nkey = \"short\"\nscopes = [\"read\"]\n",
            "[[api_keys]]\nkey = \"orders-team-0123456789\"\nscopes = []\n",
            "[[api_keys]]\nkey = \"orders-team-0123456789\"\nscopes = [\"read\"]\nextra = 1\n",
        ] {
            std::fs::write(&path, bad).unwrap();
            assert!(Settings { config: Some(path.clone()), ..Default::default() }.resolve().is_err(), "{bad}");
        }
    }

    #[test]
    fn the_removed_process_cas_mode_is_refused_in_a_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("txgate.toml");
        std::fs::write(&path, "mongodb_uri = \"mongodb://x\"\nmongodb_cas = \"process\"\n").unwrap();
        let err = Settings { config: Some(path), ..Default::default() }.resolve().unwrap_err();
        assert!(err.contains("mongodb_cas"), "{err}");
    }

    #[test]
    fn the_checkpoint_interval_is_a_quarter_second_unless_set_and_then_positive() {
        let interval = |settings: Settings| match settings.resolve().unwrap().store {
            StoreConfig::Embedded { checkpoint_interval, .. } => checkpoint_interval,
            other => panic!("{other:?}"),
        };
        assert_eq!(interval(Settings::default()), Duration::from_millis(250));
        let set = Settings { checkpoint_interval_ms: Some(1000), ..Default::default() };
        assert_eq!(interval(set), Duration::from_secs(1));
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("txgate.toml");
        std::fs::write(&path, "checkpoint_interval_ms = 5000\n").unwrap();
        assert_eq!(interval(Settings { config: Some(path), ..Default::default() }), Duration::from_secs(5));
        let err = Settings { checkpoint_interval_ms: Some(0), ..Default::default() }.resolve().unwrap_err();
        assert!(err.contains("checkpoint_interval_ms"), "{err}");
    }

    #[test]
    fn store_and_transaction_deadlines_are_set_and_checked() {
        let cfg = Settings::default().resolve().unwrap();
        assert_eq!(cfg.txn.store_timeout, Duration::from_millis(5000));
        assert_eq!(cfg.txn.max_duration, Duration::from_millis(30_000));
        let cfg =
            Settings { store_timeout_ms: Some(250), txn_max_ms: Some(900), ..Default::default() }.resolve().unwrap();
        assert_eq!(
            (cfg.txn.store_timeout, cfg.txn.max_duration),
            (Duration::from_millis(250), Duration::from_millis(900))
        );
        assert!(Settings { store_timeout_ms: Some(0), ..Default::default() }.resolve().is_err());
        assert!(Settings { txn_max_ms: Some(0), ..Default::default() }.resolve().is_err());
    }

    #[test]
    fn bad_values_are_refused() {
        assert!(Settings { store: Some(StoreKind::Mongodb), ..Default::default() }.resolve().is_err());
        assert!(Settings { lease_ms: Some(0), ..Default::default() }.resolve().is_err());
        assert!(Settings { max_concurrency: Some(0), ..Default::default() }.resolve().is_err());
        assert!(Settings { hook_per_destination: Some(0), ..Default::default() }.resolve().is_err());
        let limits = Settings { max_concurrency: Some(7), hook_per_destination: Some(3), ..Default::default() };
        let config = limits.resolve().unwrap();
        assert_eq!((config.max_concurrency, config.hooks.per_destination), (7, 3));
        assert!(Settings { max_streams_per_key: Some(0), ..Default::default() }.resolve().is_err());
        let streams = Settings { max_streams: Some(10), ..Default::default() }.resolve().unwrap();
        assert_eq!((streams.max_streams, streams.max_streams_per_key), (10, 2), "a quarter by default");
        let streams = Settings { max_streams: Some(3), ..Default::default() }.resolve().unwrap();
        assert_eq!(streams.max_streams_per_key, 1, "at least one");
        // Tombstones outlive the events and deliveries whose ids they keep
        // from being reused.
        let short = |event, delivery| Settings {
            tombstone_retention_secs: Some(100),
            event_retention_secs: Some(event),
            delivery_retention_secs: Some(delivery),
            ..Default::default()
        };
        assert!(short(100, 100).resolve().is_ok());
        assert!(short(101, 100).resolve().unwrap_err().contains("event_retention_secs"));
        assert!(short(100, 101).resolve().unwrap_err().contains("delivery_retention_secs"));
    }

    #[test]
    fn a_key_shaped_like_a_token_is_refused_by_its_name() {
        let jwt_shaped = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiIxIn0.c2lnbmF0dXJl";
        let settings = Settings {
            api_keys: Some(KeysSetting::Spec(format!("{jwt_shaped}:read+name=billing"))),
            ..Default::default()
        };
        let err = settings.resolve().unwrap_err();
        assert!(err.contains("\"billing\"") && err.contains("JWT"), "{err}");
        assert!(!err.contains(jwt_shaped), "{err}");
    }

    #[test]
    fn one_issuer_comes_from_variables_and_ends_keyless_mode() {
        let issuer = IssuerVars {
            url: Some("https://id.example.com/realms/shop".into()),
            audiences: Some("txgate-api, other".into()),
            roles: Some("shopper=read@products+write@carts; support=read".into()),
            roles_claim: Some("realm_access.roles".into()),
            ..Default::default()
        };
        let config = Settings { issuer, ..Default::default() }.resolve().unwrap();
        assert!(!config.keyless());
        assert_eq!(config.issuers.len(), 1);
        assert_eq!(config.issuers[0].audiences, ["txgate-api", "other"]);
        assert_eq!(config.issuers[0].roles["shopper"].len(), 2);
        let no_audience = IssuerVars { url: Some("https://id.example.com".into()), ..Default::default() };
        assert!(Settings { issuer: no_audience, ..Default::default() }.resolve().unwrap_err().contains("audiences"));
        // Anonymous grants need some credential configured.
        let anonymous = Settings { anonymous: Some("read@products".into()), ..Default::default() };
        assert!(anonymous.resolve().is_err());
        // In the file: `[[issuers]]` tables.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("txgate.toml");
        std::fs::write(
            &path,
            "[[issuers]]\nurl = \"https://a.example\"\naudiences = [\"api\"]\n\
             [issuers.roles]\nshopper = \"read\"\n\
             [[issuers]]\nurl = \"https://b.example\"\naudiences = [\"api\"]\n",
        )
        .unwrap();
        let config = Settings { config: Some(path.clone()), ..Default::default() }.resolve().unwrap();
        assert_eq!(config.issuers.len(), 2);
        std::fs::write(&path, "[[issuers]]\nurl = \"https://a.example\"\naudiences = [\"api\"]\nbogus = 1\n").unwrap();
        assert!(Settings { config: Some(path), ..Default::default() }.resolve().is_err(), "unknown keys refused");
    }

    #[test]
    fn debug_output_shows_no_credential() {
        assert_eq!(
            redact_uri("mongodb://ann:pw%40x@db1:27017,db2/app?tls=true"),
            "mongodb://ann:[redacted]@db1:27017,db2/app?tls=true"
        );
        assert_eq!(redact_uri("mongodb://db1:27017/app"), "mongodb://db1:27017/app");
        assert_eq!(redact_uri("mongodb+srv://u:p@cluster.example/x"), "mongodb+srv://u:[redacted]@cluster.example/x");
        let settings = Settings {
            mongodb_uri: Some(Secret("mongodb://ann:hunter2@db/app".into())),
            hook_secret: Some(Secret("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw".into())),
            api_keys: Some(KeysSetting::Spec("key-abcdefghijklmnop:admin".into())),
            ..Default::default()
        };
        let shown = format!("{settings:?}");
        let config = settings.resolve().unwrap();
        let shown = format!("{shown} {config:?}");
        for secret in ["hunter2", "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "key-abcdefghijklmnop"] {
            assert!(!shown.contains(secret), "{secret} in {shown}");
        }
        assert!(shown.contains("mongodb://ann:[redacted]@db/app"), "{shown}");
    }
}

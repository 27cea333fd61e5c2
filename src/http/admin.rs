//! `/v1/admin`: operator actions on the gateway itself. An online backup
//! of the embedded store, taken while the gateway serves, into a new
//! directory beside its data: a complete data directory, restored by
//! starting a gateway with `TXGATE_DATA_DIR` pointing at (a copy of) it.

use crate::http::problems::{Problems, problems};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use crate::http::guard::{Guard, On, Routes};
use axum::extract::State;
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::sync::{Mutex, OwnedMutexGuard};
use tracing::{Instrument, Span};
use utoipa::ToSchema;
use utoipa_axum::routes;

use super::AppState;
use super::error::{ApiError, ProblemCode};
use super::extract::{OptionalJsonBody, from_body};
use crate::config::StoreConfig;
use crate::store::{BackupInfo, DynStore, StoreResult};

pub(crate) fn router() -> Routes {
    // A backup copies every collection: `admin` on all of them.
    Routes::new().guarded(Guard::Admin(On::Everywhere), routes!(backup))
}

/// The directory backups go in, under the embedded store's data directory.
pub(crate) const BACKUPS_DIR: &str = "backups";

/// Where this gateway's backups go, and the lock that lets one run at a
/// time: two would only compete for the same disk.
#[derive(Clone, Debug)]
pub(crate) struct Backups {
    /// `None`: the store is MongoDB, which has its own backup tools.
    dir: Option<PathBuf>,
    /// The database file a backup copies (its size is what a backup is
    /// expected to take).
    database: Option<PathBuf>,
    limits: crate::config::Backups,
    running: Arc<Mutex<()>>,
}

impl Backups {
    /// Backups of the store `config` names: in `<data_dir>/backups` for
    /// the embedded store, none for MongoDB. The directory is made
    /// absolute once, so that answers name it wherever the operator reads
    /// them from.
    pub(crate) fn new(config: &StoreConfig, limits: crate::config::Backups) -> Self {
        let (dir, database) = match config {
            StoreConfig::Embedded { data_dir, .. } => {
                let dir = data_dir.join(BACKUPS_DIR);
                let database = data_dir.join(crate::store::embedded::DATABASE_FILE);
                (Some(std::path::absolute(&dir).unwrap_or(dir)), Some(database))
            }
            StoreConfig::Mongodb { .. } => (None, None),
        };
        Self { dir, database, limits, running: Arc::new(Mutex::new(())) }
    }

    /// 507 `insufficient_storage` when a backup into `dir` (about the size
    /// of the database file) would leave less free space on its disk than
    /// the reserve (`TXGATE_BACKUP_RESERVE_MB`): a full disk fails the
    /// journal's next write, and the store with it.
    fn check_space(&self, dir: &Path) -> Result<(), ApiError> {
        let expected = self.database.as_deref().and_then(|f| std::fs::metadata(f).ok()).map_or(0, |m| m.len());
        // The backups' directory, or the data directory before the first.
        let on = if dir.exists() { dir } else { dir.parent().unwrap_or(dir) };
        let free = free_space(on)
            .map_err(|e| ApiError::internal(format!("reading the free space of {}: {e}", on.display())))?;
        let reserve = self.limits.reserve_bytes;
        if free.saturating_sub(expected) < reserve {
            tracing::warn!(free, expected, reserve, "backup refused: it would leave less free space than the reserve");
            let mib = |b: u64| b >> 20;
            return Err(ApiError::new(
                ProblemCode::InsufficientStorage,
                format!(
                    "a backup takes about {} MiB and the disk has {} MiB free; at least {} MiB must stay free \
                     (TXGATE_BACKUP_RESERVE_MB): move or remove older backups",
                    mib(expected),
                    mib(free),
                    mib(reserve)
                ),
            ));
        }
        Ok(())
    }

    /// Remove the oldest finished backups in `dir` beyond the number kept
    /// (`TXGATE_BACKUPS_KEPT`), never `newest`; the paths removed.
    fn prune(&self, dir: &Path, newest: &Path) -> Vec<String> {
        let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
        let mut names: Vec<String> = entries
            .filter_map(Result::ok)
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            .filter_map(|e| e.file_name().into_string().ok())
            .filter(|n| is_backup_name(n))
            .collect();
        // Oldest first: the names sort by their time.
        names.sort();
        let excess = names.len().saturating_sub(self.limits.kept);
        let mut removed = Vec::new();
        for name in names.into_iter().take(excess) {
            let path = dir.join(&name);
            if path == newest {
                continue;
            }
            match std::fs::remove_dir_all(&path) {
                Ok(()) => {
                    tracing::info!(path = %path.display(), "old backup removed (TXGATE_BACKUPS_KEPT)");
                    removed.push(path.to_string_lossy().into_owned());
                }
                Err(e) => tracing::warn!(path = %path.display(), error = %e, "an old backup could not be removed"),
            }
        }
        removed
    }

    /// The right to run the one backup of this gateway, or 409
    /// `backup_in_progress`.
    fn claim(&self) -> Result<OwnedMutexGuard<()>, ApiError> {
        Arc::clone(&self.running).try_lock_owned().map_err(|_| {
            ApiError::new(
                ProblemCode::BackupInProgress,
                "a backup is being written already; send this again once it has finished",
            )
        })
    }
}

/// `POST /v1/admin/backup`: no member is needed; unknown ones are refused.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({}))]
pub(crate) struct BackupIn {}

/// A finished backup.
#[derive(Serialize, ToSchema)]
#[schema(example = json!({
    "path": "/var/lib/txgate/backups/20261125T220501Z-3fa9c2",
    "records": 120345,
    "bytes": 73400320,
    "journal_position": 981234,
    "took_ms": 5120,
    "removed": ["/var/lib/txgate/backups/20261120T220500Z-0b61d4"],
}))]
pub(crate) struct BackupOut {
    /// The backup's directory on the gateway's machine: a complete data
    /// directory. To restore, stop the gateway and start it with
    /// `TXGATE_DATA_DIR` pointing at (a copy of) it.
    pub path: String,
    /// Records copied: documents and the gateway's own (transactions,
    /// events, deliveries, ...).
    #[schema(minimum = 0)]
    pub records: u64,
    /// Size of the backup's database file.
    #[schema(minimum = 0)]
    pub bytes: u64,
    /// The last journal entry the backup includes: it holds every write
    /// acknowledged before the request was received, and none after this
    /// entry.
    #[schema(minimum = 0)]
    pub journal_position: u64,
    /// How long the backup took.
    #[schema(minimum = 0)]
    pub took_ms: u64,
    /// Older backups removed once this one was written, to keep
    /// `TXGATE_BACKUPS_KEPT` of them (5 by default); their paths.
    pub removed: Vec<String>,
}

/// Bytes free for an unprivileged writer on the file system holding `path`.
fn free_space(path: &Path) -> std::io::Result<u64> {
    let stat = rustix::fs::statvfs(path)?;
    Ok(stat.f_bavail.saturating_mul(stat.f_frsize))
}

/// Whether `name` is one [`backup_name`] gives (`YYYYMMDDTHHMMSSZ-xxxxxx`):
/// only those are removed as old backups.
fn is_backup_name(name: &str) -> bool {
    let b = name.as_bytes();
    b.len() == 23
        && b[..8].iter().all(u8::is_ascii_digit)
        && b[8] == b'T'
        && b[9..15].iter().all(u8::is_ascii_digit)
        && b[15] == b'Z'
        && b[16] == b'-'
        && b[17..].iter().all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(c))
}

/// The name of a backup taken at `at`: its UTC time to the second, sorted
/// as it reads, and a random suffix so that two in one second differ.
fn backup_name(at: time::OffsetDateTime, suffix: u32) -> String {
    const FORMAT: &[time::format_description::FormatItem<'static>] =
        time::macros::format_description!("[year][month][day]T[hour][minute][second]Z");
    let stamp = at.to_offset(time::UtcOffset::UTC).format(FORMAT).unwrap_or_else(|_| at.unix_timestamp().to_string());
    format!("{stamp}-{:06x}", suffix & 0xff_ffff)
}

/// Write the backup and log its end. Run as a task of its own holding the
/// lock: a client that gives up waiting neither stops a backup half-way
/// nor lets a second one start beside it, and shutdown waits for it.
async fn write_backup(
    store: DynStore,
    dest: PathBuf,
    _running: OwnedMutexGuard<()>,
) -> (StoreResult<Option<BackupInfo>>, u64) {
    let started = Instant::now();
    let outcome = store.backup(&dest).await;
    let took_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
    let path = dest.display();
    match &outcome {
        Ok(Some(info)) => tracing::info!(
            %path,
            records = info.records,
            bytes = info.bytes,
            journal_position = info.journal_position,
            took_ms,
            "backup finished"
        ),
        Ok(None) => tracing::warn!(%path, "backup refused: the store has no online backup"),
        Err(err) => tracing::warn!(%path, error = %err, took_ms, "backup failed"),
    }
    (outcome, took_ms)
}

fn unsupported() -> ApiError {
    ApiError::new(
        ProblemCode::BackupUnsupported,
        "this store has no online backup; use the database's own tools (mongodump, snapshots)",
    )
}

fn backup_out(dest: &Path, info: BackupInfo, took_ms: u64, removed: Vec<String>) -> BackupOut {
    BackupOut {
        path: dest.to_string_lossy().into_owned(),
        records: info.records,
        bytes: info.bytes,
        journal_position: info.journal_position,
        took_ms,
        removed,
    }
}

problems!(
    /// What `v1.admin.backup` can answer besides its success.
    BackupProblems = Problems::of(&[ValidationFailed, BackupUnsupported, BackupInProgress, InsufficientStorage]).with_body()
);

/// Back up the store
///
/// Needs the `admin` scope. Writes a consistent copy of the embedded store
/// into a new directory under `<data dir>/backups`, named by its UTC time
/// (`20261125T220501Z-3fa9c2`), while the gateway goes on serving: the
/// copy holds every write acknowledged before the request was received
/// and nothing after the point it was taken. It is written under a
/// `.partial` name and renamed when complete, so a directory with the
/// final name is always a whole backup. The answer comes once it is
/// written. One backup runs at a time (409 `backup_in_progress`). On
/// MongoDB there is none (409 `backup_unsupported`): use its own tools.
///
/// A backup that would leave less free space on the data's disk than
/// `TXGATE_BACKUP_RESERVE_MB` (1 GiB by default) is refused (507
/// `insufficient_storage`). Once a backup is written, the oldest beyond
/// `TXGATE_BACKUPS_KEPT` (5 by default) are removed (`removed` names
/// them). Backups sit on the data's own disk: copy them elsewhere.
///
/// To restore, stop the gateway and start it with `TXGATE_DATA_DIR`
/// pointing at (a copy of) the backup's directory.
#[utoipa::path(
    post,
    path = "/v1/admin/backup",
    operation_id = "v1.admin.backup",
    tag = "operations",
    request_body(content = Option<BackupIn>, content_type = "application/json",
        description = "Optional: an empty body does as `{}`."),
    responses(BackupProblems,
        (status = 201, description = "The backup is written", body = BackupOut),
    )
)]
pub(crate) async fn backup(
    State(state): State<AppState>,
    OptionalJsonBody(body): OptionalJsonBody<Value>,
) -> Result<(StatusCode, axum::Json<BackupOut>), ApiError> {
    if let Some(value) = body {
        let BackupIn {} = from_body(value, &[""])?;
    }
    let Some(dir) = &state.backups.dir else { return Err(unsupported()) };
    let running = state.backups.claim()?;
    state.backups.check_space(dir)?;
    let at = state.txns.config().clock.now().timestamp_millis();
    let at = time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(at) * 1_000_000).map_err(ApiError::internal)?;
    let dest = dir.join(backup_name(at, rand::random()));
    tracing::info!(path = %dest.display(), "backup started");
    let store = Arc::clone(&state.store);
    // In the request's span: its end is logged as part of the request.
    let task = state.follow_ups.spawn(write_backup(store, dest.clone(), running).instrument(Span::current()));
    let (outcome, took_ms) = task.await.map_err(ApiError::internal)?;
    match outcome? {
        Some(info) => {
            let removed = state.backups.prune(dir, &dest);
            Ok((StatusCode::CREATED, axum::Json(backup_out(&dest, info, took_ms, removed))))
        }
        None => Err(unsupported()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_sort_by_utc_time_and_differ_by_suffix() {
        let at = time::macros::datetime!(2026-11-25 23:05:01 +01:00);
        assert_eq!(backup_name(at, 0x3fa9c2), "20261125T220501Z-3fa9c2");
        assert_eq!(backup_name(at, 0xff00_0001), "20261125T220501Z-000001", "six hex digits");
        let later = time::macros::datetime!(2026-11-25 22:05:02 UTC);
        assert!(backup_name(at, 0xffffff) < backup_name(later, 0));
    }

    #[test]
    fn embedded_backups_go_under_the_data_directory_and_mongodb_has_none() {
        let embedded = Backups::new(
            &StoreConfig::Embedded {
                data_dir: PathBuf::from("/srv/txgate"),
                cache_mb: 16,
                sync_interval: crate::config::DEFAULT_SYNC_INTERVAL,
                checkpoint_interval: crate::config::DEFAULT_CHECKPOINT_INTERVAL,
            },
            Default::default(),
        );
        assert_eq!(embedded.dir.as_deref(), Some(Path::new("/srv/txgate/backups")));
        let relative = Backups::new(
            &StoreConfig::Embedded {
                data_dir: PathBuf::from("data"),
                cache_mb: 16,
                sync_interval: crate::config::DEFAULT_SYNC_INTERVAL,
                checkpoint_interval: crate::config::DEFAULT_CHECKPOINT_INTERVAL,
            },
            Default::default(),
        );
        assert!(relative.dir.as_deref().is_some_and(Path::is_absolute), "{relative:?}");
        let mongodb =
            Backups::new(&StoreConfig::Mongodb { uri: "mongodb://x".into(), database: "d".into() }, Default::default());
        assert_eq!(mongodb.dir, None);
    }

    #[test]
    fn only_backup_names_are_taken_for_backups() {
        let at = time::macros::datetime!(2026-11-25 23:05:01 +01:00);
        assert!(is_backup_name(&backup_name(at, 0x3fa9c2)));
        for other in
            ["20261125T220501Z-3fa9c2.partial", "20261125T220501Z-3FA9C2", "keep-me", "20261125T220501Z-3fa9c", ""]
        {
            assert!(!is_backup_name(other), "{other}");
        }
    }

    #[tokio::test]
    async fn one_backup_at_a_time() {
        let backups =
            Backups::new(&StoreConfig::Mongodb { uri: "mongodb://x".into(), database: "d".into() }, Default::default());
        let first = backups.claim().expect("free");
        let err = backups.clone().claim().expect_err("held by the first");
        assert_eq!((err.status(), err.code), (StatusCode::CONFLICT, ProblemCode::BackupInProgress));
        drop(first);
        backups.claim().expect("free again");
    }
}

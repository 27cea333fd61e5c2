//! Online backup: a snapshot of the store copied into a new one.

use std::path::{Path, PathBuf};
use std::time::Instant;

use redb::{Database, ReadableTable, TableDefinition};

use super::recover::RaiseOnDrop;
use super::{APPLIED, CATALOG, COUNTS, DATABASE_FILE, ENTRIES, JOURNAL_STATE, RECORDS, internal};
use crate::disk::{DirDisk, Disk, Fence};
use crate::{BackupInfo, StoreError, StoreResult};

/// Records copied per write transaction of a backup.
const BACKUP_CHUNK: usize = 20_000;

/// Copy the state `snapshot` reads into a new store in `dest`: written
/// under `dest` with `.partial` appended, synced, then renamed, so a
/// directory named `dest` is always a whole backup.
pub(super) fn write_backup(snapshot: &redb::ReadTransaction, dest: &Path) -> StoreResult<BackupInfo> {
    let started = Instant::now();
    let failed = |what: &str, e: &dyn std::fmt::Display| {
        StoreError::Unavailable(format!("backup to {}: {what}: {e}", dest.display()))
    };
    if dest.exists() {
        return Err(StoreError::Rejected(format!("backup to {}: it exists already", dest.display())));
    }
    let mut partial = dest.as_os_str().to_owned();
    partial.push(".partial");
    let partial = PathBuf::from(partial);
    if partial.exists() {
        std::fs::remove_dir_all(&partial).map_err(|e| failed("removing an unfinished backup", &e))?;
    }
    // The directories above it too, their entries synced (the backups'
    // directory is new at the first backup).
    if let Some(parent) = dest.parent().filter(|p| !p.as_os_str().is_empty()) {
        DirDisk::create(parent).map_err(|e| failed("creating its parent directory", &e))?;
    }
    let disk = DirDisk::create(&partial).map_err(|e| failed("creating the directory", &e))?;
    let written = copy_snapshot(snapshot, &disk, &failed);
    if written.is_err() {
        // Nothing half-written stays behind under a name of its own.
        let _ = std::fs::remove_dir_all(&partial);
    }
    let (records, applied) = written?;
    std::fs::rename(&partial, dest).map_err(|e| failed("renaming the finished backup", &e))?;
    let parent = dest.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    std::fs::File::open(parent).and_then(|d| d.sync_all()).map_err(|e| failed("syncing its parent", &e))?;
    let bytes = std::fs::metadata(dest.join(DATABASE_FILE)).map(|m| m.len()).unwrap_or(0);
    tracing::info!(
        path = %dest.display(),
        records,
        bytes,
        journal_position = applied,
        took_ms = started.elapsed().as_millis() as u64,
        "backup written"
    );
    Ok(BackupInfo { records, bytes, journal_position: applied })
}

/// Copy every table `snapshot` reads into a new database on `disk`, synced;
/// the records copied and the journal position the snapshot includes.
pub(super) fn copy_snapshot(
    snapshot: &redb::ReadTransaction,
    disk: &dyn Disk,
    failed: &dyn Fn(&str, &dyn std::fmt::Display) -> StoreError,
) -> StoreResult<(u64, u64)> {
    // Behind a fence raised before redb drops it, on every path: the
    // backup is left as its last commit left it, never closed by redb
    // (see `disk::Fence`), so the store restored from it opens as from a
    // crash right after that commit.
    let fence = Fence::default();
    let db = disk
        .open_database(&redb::Builder::new(), DATABASE_FILE, &fence)
        .map_err(|e| failed("creating the database", &e))?;
    let _raised = RaiseOnDrop(Some(fence.clone()));
    let mut records = 0u64;
    let applied = {
        let state = snapshot.open_table(JOURNAL_STATE).map_err(internal)?;
        state.get(APPLIED).map_err(internal)?.map_or(0, |v| v.value())
    };
    // Each table in chunks, each chunk a write transaction of its own: a
    // million records never sit in one transaction's memory.
    fn copy<K: redb::Key + 'static, V: redb::Value + 'static>(
        snapshot: &redb::ReadTransaction,
        db: &Database,
        def: TableDefinition<K, V>,
        mut counted: impl FnMut(usize),
    ) -> StoreResult<()>
    where
        for<'a> K::SelfType<'a>: std::borrow::Borrow<K::SelfType<'a>>,
        for<'a> V::SelfType<'a>: std::borrow::Borrow<V::SelfType<'a>>,
    {
        let source = snapshot.open_table(def).map_err(internal)?;
        let mut rows = source.iter().map_err(internal)?.peekable();
        loop {
            let mut txn = db.begin_write().map_err(internal)?;
            txn.set_durability(redb::Durability::None).map_err(internal)?;
            let mut n = 0;
            {
                let mut table = txn.open_table(def).map_err(internal)?;
                for row in rows.by_ref().take(BACKUP_CHUNK) {
                    let (k, v) = row.map_err(internal)?;
                    table.insert(k.value(), v.value()).map_err(internal)?;
                    n += 1;
                }
            }
            txn.commit().map_err(internal)?;
            counted(n);
            if rows.peek().is_none() {
                return Ok(());
            }
        }
    }
    copy(snapshot, &db, RECORDS, |n| {
        records += n as u64;
        if records % 100_000 < n as u64 {
            tracing::info!(records, "backup: copying records");
        }
    })?;
    copy(snapshot, &db, ENTRIES, |_| {})?;
    copy(snapshot, &db, COUNTS, |_| {})?;
    copy(snapshot, &db, CATALOG, |_| {})?;
    copy(snapshot, &db, JOURNAL_STATE, |_| {})?;
    let mut txn = db.begin_write().map_err(internal)?;
    txn.set_quick_repair(true);
    txn.commit().map_err(|e| failed("the final commit", &e))?;
    fence.raise();
    drop(db);
    disk.sync_dir().map_err(|e| failed("syncing the directory", &e))?;
    Ok((records, applied))
}

#[cfg(test)]
mod tests {
    use mongodb::bson::doc;

    use crate::Store;

    /// A backup reports the journal position its snapshot holds, though
    /// batches no longer write it down: every entry written before it,
    /// the same again when nothing was written since, one more after one
    /// more write; and the copy holds that position, so the store made
    /// from it starts after it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_backup_reports_the_journal_position_its_snapshot_holds() {
        let dir = tempfile::tempdir().unwrap();
        let store = super::super::EmbeddedStore::open(&dir.path().join("data")).unwrap();
        // Each a synced write of its own: one journal entry each.
        for i in 0..5 {
            assert!(store.insert("c", doc! {"_id": format!("d{i}"), "n": i}).await.unwrap());
        }
        let position = |name: &str| {
            let store = &store;
            let dest = dir.path().join(name);
            async move { store.backup(&dest).await.unwrap().unwrap().journal_position }
        };
        let first = position("b1").await;
        assert_eq!(first, 5);
        assert_eq!(position("b2").await, first, "nothing written in between");
        assert!(store.insert("c", doc! {"_id": "d5", "n": 5}).await.unwrap());
        assert_eq!(position("b3").await, first + 1);
        store.close().await.unwrap();
        // The store made from the last backup holds its six records, and
        // its journal goes on after the position the backup reported.
        let restored = super::super::EmbeddedStore::open(&dir.path().join("b3")).unwrap();
        assert!(restored.get("c", "d5").await.unwrap().is_some());
        assert!(restored.insert("c", doc! {"_id": "d6", "n": 6}).await.unwrap());
        assert_eq!(restored.backup(&dir.path().join("b4")).await.unwrap().unwrap().journal_position, first + 2);
        restored.close().await.unwrap();
    }
}

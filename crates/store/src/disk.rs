//! Where the embedded store keeps its files: the data directory on the
//! local file system ([`DirDisk`]), or, in tests and the crash bench, a
//! simulated device that loses what was not synced
//! ([`super::simdisk::SimDisk`]). The store reaches its two files (the
//! redb database and the journal) and their directory only through this.

use std::fs::OpenOptions;
use std::io;
use std::ops::Bound;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use redb::{BackendError, Database, DatabaseError, StorageBackend};

use super::journal::JournalFile;

/// The data directory's files, as the embedded store uses them.
pub trait Disk: Send + Sync + 'static {
    /// How to name file `name` in messages.
    fn describe(&self, name: &str) -> String;

    /// Whether file `name` exists.
    fn exists(&self, name: &str) -> io::Result<bool>;

    /// Open (or create) the redb database in file `name`; once `fence` is
    /// raised, nothing more reaches the file.
    fn open_database(&self, builder: &redb::Builder, name: &str, fence: &Fence) -> Result<Database, DatabaseError>;

    /// Open (or create) file `name` for reading and writing.
    fn open_file(&self, name: &str) -> io::Result<Box<dyn StorageBackend>>;

    /// The bytes of file `name`, read without opening it for writing.
    fn read_file(&self, name: &str) -> io::Result<Vec<u8>>;

    /// Rename file `from` to `to`, replacing `to`.
    fn rename(&self, from: &str, to: &str) -> io::Result<()>;

    /// Remove file `name` if it exists.
    fn remove(&self, name: &str) -> io::Result<()>;

    /// Make the directory's entries durable: files created or renamed
    /// since the last call survive power loss from now on.
    fn sync_dir(&self) -> io::Result<()>;
}

/// A data directory on the local file system.
#[derive(Debug, Clone)]
pub struct DirDisk {
    dir: PathBuf,
}

impl DirDisk {
    /// The directory `dir`, created (and its creation made durable) when
    /// missing, with every missing directory above it.
    pub fn create(dir: &Path) -> io::Result<Self> {
        if !dir.exists() {
            let holders = entry_holders(dir);
            std::fs::create_dir_all(dir)?;
            for holder in holders {
                sync_directory(&holder)?;
            }
        }
        Ok(Self { dir: dir.to_owned() })
    }

    pub fn path(&self) -> &Path {
        &self.dir
    }
}

/// The directories whose entries change when the missing `dir` is made
/// with every missing directory above it: the first that exists above it
/// (it gains the topmost new one), then each new one but `dir` (each
/// gains the next), top down. Each is synced once they are made, so the
/// whole path survives power loss, not only its last step.
fn entry_holders(dir: &Path) -> Vec<PathBuf> {
    let mut missing = Vec::new();
    let mut at = dir;
    let existing = loop {
        if at.exists() {
            break at.to_owned();
        }
        missing.push(at.to_owned());
        match at.parent().filter(|p| !p.as_os_str().is_empty()) {
            Some(parent) => at = parent,
            None => break PathBuf::from("."),
        }
    };
    // `missing` runs from `dir` up; its holders are all but `dir` itself.
    let mut holders = vec![existing];
    holders.extend(missing.into_iter().skip(1).rev());
    holders
}

fn sync_directory(dir: &Path) -> io::Result<()> {
    std::fs::File::open(dir)?.sync_all()
}

impl Disk for DirDisk {
    fn describe(&self, name: &str) -> String {
        self.dir.join(name).display().to_string()
    }

    fn exists(&self, name: &str) -> io::Result<bool> {
        self.dir.join(name).try_exists()
    }

    fn open_database(&self, builder: &redb::Builder, name: &str, fence: &Fence) -> Result<Database, DatabaseError> {
        let file = OpenOptions::new().read(true).write(true).create(true).truncate(false).open(self.dir.join(name))?;
        builder.create_with_backend(Fenced::new(redb::backends::FileBackend::new(file)?, fence))
    }

    fn open_file(&self, name: &str) -> io::Result<Box<dyn StorageBackend>> {
        let file = OpenOptions::new().read(true).write(true).create(true).truncate(false).open(self.dir.join(name))?;
        Ok(Box::new(JournalFile(file)))
    }

    fn read_file(&self, name: &str) -> io::Result<Vec<u8>> {
        std::fs::read(self.dir.join(name))
    }

    fn rename(&self, from: &str, to: &str) -> io::Result<()> {
        std::fs::rename(self.dir.join(from), self.dir.join(to))
    }

    fn remove(&self, name: &str) -> io::Result<()> {
        match std::fs::remove_file(self.dir.join(name)) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            other => other,
        }
    }

    fn sync_dir(&self) -> io::Result<()> {
        sync_directory(&self.dir)
    }
}

/// Raised once the store has made its database durable for the last time
/// (its final checkpoint): from then on no write, length change or sync
/// reaches the file, redb's own close included. The file stays as a crash
/// right after that checkpoint would leave it, which redb opens at once:
/// the power-loss harness found that redb 4.5 files closed by redb itself,
/// opened again and then cut off at the first write of a later checkpoint
/// no longer open.
///
/// It also counts the reads that reach the file: the misses of redb's
/// page cache ([`Fence::reads`]).
#[derive(Clone, Debug, Default)]
pub struct Fence(Arc<FenceState>);

#[derive(Debug, Default)]
struct FenceState {
    raised: AtomicBool,
    reads: AtomicU64,
}

impl Fence {
    pub fn raise(&self) {
        self.0.raised.store(true, Ordering::SeqCst);
    }

    fn raised(&self) -> bool {
        self.0.raised.load(Ordering::SeqCst)
    }

    /// Reads of the database file since it was opened: each is a page
    /// (or a run of pages) redb's cache did not hold.
    pub fn reads(&self) -> u64 {
        self.0.reads.load(Ordering::Relaxed)
    }
}

/// A backend behind a [`Fence`]; reads and locks pass through (counted).
#[derive(Debug)]
pub(crate) struct Fenced<B> {
    inner: B,
    fence: Fence,
}

impl<B> Fenced<B> {
    pub fn new(inner: B, fence: &Fence) -> Self {
        Self { inner, fence: fence.clone() }
    }
}

impl<B: StorageBackend> StorageBackend for Fenced<B> {
    fn len(&self) -> io::Result<u64> {
        self.inner.len()
    }
    fn read(&self, offset: u64, out: &mut [u8]) -> io::Result<()> {
        self.fence.0.reads.fetch_add(1, Ordering::Relaxed);
        self.inner.read(offset, out)
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        if self.fence.raised() { Ok(()) } else { self.inner.set_len(len) }
    }
    fn sync_data(&self) -> io::Result<()> {
        if self.fence.raised() { Ok(()) } else { self.inner.sync_data() }
    }
    fn write(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        if self.fence.raised() { Ok(()) } else { self.inner.write(offset, data) }
    }
    fn close(&self) -> io::Result<()> {
        self.inner.close()
    }
    fn try_lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<bool, BackendError> {
        self.inner.try_lock_range(start, end)
    }
    fn try_lock_shared_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<bool, BackendError> {
        self.inner.try_lock_shared_range(start, end)
    }
    fn lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.inner.lock_range(start, end)
    }
    fn lock_shared_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.inner.lock_shared_range(start, end)
    }
    fn unlock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.inner.unlock_range(start, end)
    }
    fn query_lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<bool, BackendError> {
        self.inner.query_lock_range(start, end)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every directory that gains an entry when a path of several missing
    /// directories is made is synced, from the first that exists down.
    #[test]
    fn a_new_path_is_synced_down_from_the_directory_that_existed() {
        let root = tempfile::tempdir().unwrap();
        let deep = root.path().join("a/b/c");
        let holders = entry_holders(&deep);
        assert_eq!(holders, vec![root.path().to_owned(), root.path().join("a"), root.path().join("a/b")]);
        let disk = DirDisk::create(&deep).unwrap();
        assert!(disk.path().is_dir());
        assert_eq!(entry_holders(&root.path().join("a/b/c/d")), vec![deep.clone()], "only the last one is new");
        assert_eq!(entry_holders(Path::new("relative-and-missing")), vec![PathBuf::from(".")]);
    }
}

//! Where the embedded store keeps its files: the data directory on the
//! local file system ([`DirDisk`]), or, in tests and the crash bench, a
//! simulated device that loses what was not synced
//! ([`super::simdisk::SimDisk`]). The store reaches its two files (the
//! redb database and the journal) and their directory only through this.

use std::fs::OpenOptions;
use std::io;
use std::path::{Path, PathBuf};

use redb::{Database, DatabaseError, StorageBackend};

use super::journal::JournalFile;

/// The data directory's files, as the embedded store uses them.
pub trait Disk: Send + Sync + 'static {
    /// How to name file `name` in messages.
    fn describe(&self, name: &str) -> String;

    /// Whether file `name` exists.
    fn exists(&self, name: &str) -> io::Result<bool>;

    /// Open (or create) the redb database in file `name`.
    fn open_database(&self, builder: &redb::Builder, name: &str) -> Result<Database, DatabaseError>;

    /// Open (or create) file `name` for reading and writing.
    fn open_file(&self, name: &str) -> io::Result<Box<dyn StorageBackend>>;

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
    /// missing.
    pub fn create(dir: &Path) -> io::Result<Self> {
        if !dir.exists() {
            std::fs::create_dir_all(dir)?;
            // The new directory's own entry, in its parent.
            let parent = dir.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
            sync_directory(parent)?;
        }
        Ok(Self { dir: dir.to_owned() })
    }

    pub fn path(&self) -> &Path {
        &self.dir
    }
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

    fn open_database(&self, builder: &redb::Builder, name: &str) -> Result<Database, DatabaseError> {
        builder.create(self.dir.join(name))
    }

    fn open_file(&self, name: &str) -> io::Result<Box<dyn StorageBackend>> {
        let file = OpenOptions::new().read(true).write(true).create(true).truncate(false).open(self.dir.join(name))?;
        Ok(Box::new(JournalFile(file)))
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

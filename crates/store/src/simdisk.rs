//! A simulated disk for power-loss tests of the embedded store.
//!
//! Every file keeps what `sync_data` made durable apart from the writes
//! (and length changes) made since, and the directory keeps which files'
//! entries were synced. A crash is armed at the n-th write or sync of the
//! whole device ([`SimDisk::crash_at`]): from that operation on nothing
//! reaches the surviving image, while the store goes on unaware (writes
//! and syncs still succeed, on its live view only). The crash's
//! [`Crash`] then builds the disk the store finds at its next start: the
//! durable image plus any chosen subset of the pending writes, in order
//! (length changes, which file systems journal in order, survive as a
//! prefix),
//! the interrupted write optionally torn at 512-byte sectors (each sector
//! new, old or garbage; nothing outside the write's own range changes, as
//! real disks and redb assume; no garbage in files marked byte-atomic, see
//! [`SimDisk::byte_atomic`]), and the files whose directory entry was
//! never synced kept or lost.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::io;
use std::sync::{Arc, Mutex, MutexGuard};

use rand::Rng;
use redb::{Database, DatabaseError, StorageBackend};

use super::disk::{Disk, Fence, Fenced};

const SECTOR: usize = 512;

#[derive(Clone, Debug)]
enum Pending {
    Write { offset: u64, data: Vec<u8> },
    SetLen(u64),
}

#[derive(Clone, Debug, Default)]
struct SimFile {
    live: Vec<u8>,
    durable: Vec<u8>,
    pending: Vec<Pending>,
}

#[derive(Debug, Default)]
struct Device {
    files: BTreeMap<String, SimFile>,
    /// Files whose directory entry is durable.
    listed: BTreeSet<String>,
    /// Writes and syncs so far (files and directory).
    ops: u64,
    crash_at: Option<u64>,
    crash: Option<Crash>,
    /// The operation that panics (a fault of the thread doing it).
    panic_at: Option<u64>,
    /// Files whose torn writes leave each byte old or new, never garbage.
    byte_atomic: BTreeSet<String>,
    /// How long each sync takes (readers run meanwhile).
    slow_sync: Option<std::time::Duration>,
    /// Answers the store gave, and of those, the ones given before the
    /// crash (see [`SimDisk::answering`]).
    answers: u64,
    answers_before_crash: u64,
}

/// What was on the device when the crash came: each file's durable image
/// and pending changes, and which files were listed durably.
#[derive(Clone, Debug)]
pub struct Crash {
    files: BTreeMap<String, (Vec<u8>, Vec<Pending>)>,
    listed: BTreeSet<String>,
    /// The file and pending index of the write the crash interrupted.
    interrupted: Option<(String, usize)>,
    byte_atomic: BTreeSet<String>,
    /// The operation the crash came at, and what it was.
    pub at: u64,
    pub op: &'static str,
}

/// How a crash's survivors are chosen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Keep {
    /// Only what was synced.
    Durable,
    /// Everything written, in full (as a killed process leaves it).
    All,
    /// A random subset of the pending writes, the interrupted one
    /// possibly torn.
    Random,
    /// Every pending change but each file's first data write: a write
    /// lost while later ones reached the disk (the stale-entry case a
    /// journal's salt must catch), every time.
    AllButFirst,
}

impl Device {
    /// Count one operation; true when it is the one the crash comes at
    /// (and freezes the survivors before it takes effect).
    fn tick(&mut self, op: &'static str) -> bool {
        if self.crash.is_some() {
            return false;
        }
        self.ops += 1;
        if self.panic_at == Some(self.ops) {
            panic!("simulated fault at operation {}", self.ops);
        }
        if self.crash_at == Some(self.ops) {
            self.crash = Some(Crash {
                files: self.files.iter().map(|(n, f)| (n.clone(), (f.durable.clone(), f.pending.clone()))).collect(),
                listed: self.listed.clone(),
                interrupted: None,
                byte_atomic: self.byte_atomic.clone(),
                at: self.ops,
                op,
            });
            return true;
        }
        false
    }

    fn file(&mut self, name: &str) -> io::Result<&mut SimFile> {
        self.files.get_mut(name).ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, name.to_owned()))
    }
}

fn apply(image: &mut Vec<u8>, change: &Pending) {
    match change {
        Pending::Write { offset, data } => {
            let at = *offset as usize;
            if image.len() < at + data.len() {
                image.resize(at + data.len(), 0);
            }
            image[at..at + data.len()].copy_from_slice(data);
        }
        Pending::SetLen(len) => image.resize(*len as usize, 0),
    }
}

/// A simulated device holding one data directory.
#[derive(Clone, Default)]
pub struct SimDisk {
    dev: Arc<Mutex<Device>>,
}

impl fmt::Debug for SimDisk {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SimDisk")
    }
}

impl SimDisk {
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, Device> {
        self.dev.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A device holding, durably, the files of directory `dir` (a data
    /// directory or a backup).
    pub fn load(dir: &std::path::Path) -> io::Result<SimDisk> {
        let disk = SimDisk::new();
        {
            let mut dev = disk.lock();
            for entry in std::fs::read_dir(dir)? {
                let entry = entry?;
                if !entry.file_type()?.is_file() {
                    continue;
                }
                let bytes = std::fs::read(entry.path())?;
                let name = entry.file_name().to_string_lossy().into_owned();
                dev.files.insert(name.clone(), SimFile { live: bytes.clone(), durable: bytes, pending: Vec::new() });
                dev.listed.insert(name);
            }
        }
        Ok(disk)
    }

    /// Crash at the `n`-th write or sync from the device's start (1-based).
    pub fn crash_at(&self, n: u64) {
        self.lock().crash_at = Some(n);
    }

    /// Panic in whichever thread does the `n`-th write or sync.
    pub fn panic_at(&self, n: u64) {
        self.lock().panic_at = Some(n);
    }

    /// Crash now: what is on the device at this moment is what the crash
    /// keeps (durable) or may keep (pending).
    pub fn crash_now(&self) {
        let mut dev = self.lock();
        if dev.crash.is_none() {
            dev.crash_at = Some(dev.ops + 1);
            dev.tick("now");
        }
    }

    /// Torn writes to file `name` leave each byte old or new, never
    /// garbage: what redb states it assumes of the medium (single bytes
    /// written atomically; no change outside a write's range). The
    /// journal gets no such promise.
    pub fn byte_atomic(&self, name: &str) {
        self.lock().byte_atomic.insert(name.to_owned());
    }

    /// Make each sync take `d`: what a reader sees while a write is being
    /// synced is then a real question.
    pub fn slow_syncs(&self, d: std::time::Duration) {
        self.lock().slow_sync = Some(d);
    }

    /// Writes and syncs so far.
    pub fn ops(&self) -> u64 {
        self.lock().ops
    }

    /// The crash, once it came.
    pub fn crash(&self) -> Option<Crash> {
        self.lock().crash.clone()
    }

    /// The store on this disk is about to answer its callers (its
    /// `Options::on_answer`): an answer counts as given before the crash
    /// only when it is recorded here first, whatever a caller sees later.
    pub fn answering(&self) {
        let mut dev = self.lock();
        dev.answers += 1;
        if dev.crash.is_none() {
            dev.answers_before_crash += 1;
        }
    }

    /// Answers so far, and of those, the ones given before the crash.
    pub fn answers(&self) -> (u64, u64) {
        let dev = self.lock();
        (dev.answers, dev.answers_before_crash)
    }

    /// Whether the crash came.
    pub fn crashed(&self) -> bool {
        self.lock().crash.is_some()
    }

    /// The device as a clean stop leaves it: everything durable.
    pub fn settled(&self) -> SimDisk {
        let dev = self.lock();
        let files = dev
            .files
            .iter()
            .map(|(n, f)| (n.clone(), SimFile { live: f.live.clone(), durable: f.live.clone(), pending: Vec::new() }))
            .collect();
        let listed = dev.files.keys().cloned().collect();
        SimDisk { dev: Arc::new(Mutex::new(Device { files, listed, ..Device::default() })) }
    }

    /// A copy of this device as it is (its files, what is durable and
    /// pending, its media rules), with no crash armed and no operation
    /// counted: the same image opened again from the start.
    pub fn copy(&self) -> SimDisk {
        let dev = self.lock();
        SimDisk {
            dev: Arc::new(Mutex::new(Device {
                files: dev.files.clone(),
                listed: dev.listed.clone(),
                byte_atomic: dev.byte_atomic.clone(),
                ..Device::default()
            })),
        }
    }

    /// The files on the device.
    pub fn names(&self) -> Vec<String> {
        self.lock().files.keys().cloned().collect()
    }

    /// Bytes of file `name` as the store sees it now.
    pub fn contents(&self, name: &str) -> Option<Vec<u8>> {
        self.lock().files.get(name).map(|f| f.live.clone())
    }
}

impl Crash {
    /// Pending changes that may or may not survive (writes, length
    /// changes, unsynced directory entries).
    pub fn pending(&self) -> usize {
        let changes: usize = self.files.values().map(|(_, p)| p.len()).sum();
        changes + self.files.keys().filter(|n| !self.listed.contains(*n)).count()
    }

    /// The disk the store finds after this crash, its survivors chosen as
    /// `keep` says (with `rng` for [`Keep::Random`]).
    pub fn survivor(&self, keep: Keep, rng: &mut impl Rng) -> SimDisk {
        let mut files = BTreeMap::new();
        for (name, (durable, pending)) in &self.files {
            let listed = self.listed.contains(name);
            let exists = listed
                || match keep {
                    Keep::Durable => false,
                    Keep::All | Keep::AllButFirst => true,
                    Keep::Random => rng.random_bool(0.5),
                };
            if !exists {
                continue;
            }
            let mut image = durable.clone();
            // Length changes are the file system's metadata, committed in
            // order by its journal: a prefix of them survives. Data writes
            // survive in any subset.
            let lengths = pending.iter().filter(|c| matches!(c, Pending::SetLen(_))).count();
            let mut lengths_kept = match keep {
                Keep::Durable => 0,
                Keep::All | Keep::AllButFirst => lengths,
                Keep::Random => rng.random_range(0..=lengths),
            };
            let first_write = pending.iter().position(|c| matches!(c, Pending::Write { .. }));
            for (i, change) in pending.iter().enumerate() {
                let kept = match (keep, change) {
                    (_, Pending::SetLen(_)) => {
                        let kept = lengths_kept > 0;
                        lengths_kept = lengths_kept.saturating_sub(1);
                        kept
                    }
                    (Keep::Durable, _) => false,
                    (Keep::All, _) => true,
                    (Keep::AllButFirst, _) => first_write != Some(i),
                    (Keep::Random, _) => rng.random_bool(0.5),
                };
                if !kept {
                    continue;
                }
                let interrupted = self.interrupted.as_ref().is_some_and(|(n, at)| n == name && *at == i);
                match change {
                    Pending::Write { offset, data } if interrupted && keep == Keep::Random && rng.random_bool(0.5) => {
                        tear(&mut image, *offset, data, !self.byte_atomic.contains(name), rng);
                    }
                    _ => apply(&mut image, change),
                }
            }
            files.insert(name.clone(), SimFile { live: image.clone(), durable: image, pending: Vec::new() });
        }
        let listed = files.keys().cloned().collect();
        let byte_atomic = self.byte_atomic.clone();
        SimDisk { dev: Arc::new(Mutex::new(Device { files, listed, byte_atomic, ..Device::default() })) }
    }
}

/// Write `data` at `offset` torn: each 512-byte sector it touches is the
/// new bytes, the old ones, or (where allowed) garbage; nothing outside
/// its range changes.
fn tear(image: &mut Vec<u8>, offset: u64, data: &[u8], garbage: bool, rng: &mut impl Rng) {
    let start = offset as usize;
    let end = start + data.len();
    if image.len() < end {
        image.resize(end, 0);
    }
    let mut at = start;
    while at < end {
        let next = ((at / SECTOR) + 1) * SECTOR;
        let stop = next.min(end);
        match rng.random_range(0..if garbage { 3 } else { 2 }) {
            0 => image[at..stop].copy_from_slice(&data[at - start..stop - start]),
            1 => {}
            _ => rng.fill(&mut image[at..stop]),
        }
        at = stop;
    }
}

/// One file of a [`SimDisk`], as redb and the journal use it.
#[derive(Clone)]
struct SimBackend {
    disk: SimDisk,
    name: String,
}

impl fmt::Debug for SimBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SimBackend({})", self.name)
    }
}

impl StorageBackend for SimBackend {
    fn len(&self) -> io::Result<u64> {
        Ok(self.disk.lock().file(&self.name)?.live.len() as u64)
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> io::Result<()> {
        let mut dev = self.disk.lock();
        let file = dev.file(&self.name)?;
        let start = offset as usize;
        let bytes = file
            .live
            .get(start..start + out.len())
            .ok_or_else(|| io::Error::new(io::ErrorKind::UnexpectedEof, "read past the end"))?;
        out.copy_from_slice(bytes);
        Ok(())
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        let mut dev = self.disk.lock();
        let crashed_now = dev.tick("set_len");
        let file = dev.file(&self.name)?;
        let change = Pending::SetLen(len);
        apply(&mut file.live, &change);
        file.pending.push(change.clone());
        if crashed_now {
            let name = self.name.clone();
            if let Some(crash) = dev.crash.as_mut() {
                crash.files.entry(name).or_default().1.push(change);
            }
        }
        Ok(())
    }

    fn sync_data(&self) -> io::Result<()> {
        let slow = self.disk.lock().slow_sync;
        if let Some(slow) = slow {
            // Before the sync counts: a reader meanwhile sees only what
            // was visible before it.
            std::thread::sleep(slow);
        }
        let mut dev = self.disk.lock();
        dev.tick("sync");
        let file = dev.file(&self.name)?;
        file.durable = file.live.clone();
        file.pending.clear();
        Ok(())
    }

    fn write(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        let mut dev = self.disk.lock();
        let crashed_now = dev.tick("write");
        let file = dev.file(&self.name)?;
        let change = Pending::Write { offset, data: data.to_vec() };
        apply(&mut file.live, &change);
        file.pending.push(change.clone());
        if crashed_now {
            let name = self.name.clone();
            if let Some(crash) = dev.crash.as_mut() {
                let pending = &mut crash.files.entry(name.clone()).or_default().1;
                pending.push(change);
                crash.interrupted = Some((name, pending.len() - 1));
            }
        }
        Ok(())
    }
}

impl Disk for SimDisk {
    fn describe(&self, name: &str) -> String {
        format!("sim:{name}")
    }

    fn exists(&self, name: &str) -> io::Result<bool> {
        Ok(self.lock().files.contains_key(name))
    }

    fn open_database(&self, builder: &redb::Builder, name: &str, fence: &Fence) -> Result<Database, DatabaseError> {
        self.lock().files.entry(name.to_owned()).or_default();
        let backend = SimBackend { disk: self.clone(), name: name.to_owned() };
        builder.create_with_backend(Fenced::new(backend, fence))
    }

    fn open_file(&self, name: &str) -> io::Result<Box<dyn StorageBackend>> {
        self.lock().files.entry(name.to_owned()).or_default();
        Ok(Box::new(SimBackend { disk: self.clone(), name: name.to_owned() }))
    }

    fn read_file(&self, name: &str) -> io::Result<Vec<u8>> {
        self.contents(name).ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, name.to_owned()))
    }

    fn rename(&self, from: &str, to: &str) -> io::Result<()> {
        let mut dev = self.lock();
        dev.tick("rename");
        let file = dev.files.remove(from).ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, from.to_owned()))?;
        dev.files.insert(to.to_owned(), file);
        // Durable under its new name only once the directory is synced.
        dev.listed.remove(from);
        dev.listed.remove(to);
        Ok(())
    }

    fn remove(&self, name: &str) -> io::Result<()> {
        let mut dev = self.lock();
        dev.files.remove(name);
        dev.listed.remove(name);
        Ok(())
    }

    fn sync_dir(&self) -> io::Result<()> {
        let mut dev = self.lock();
        dev.tick("sync_dir");
        dev.listed = dev.files.keys().cloned().collect();
        Ok(())
    }
}

impl Crash {
    /// A summary of the pending changes per file (for diagnosing a failed
    /// recovery): `(file, change, offset or length, bytes)`.
    pub fn describe(&self) -> Vec<(String, &'static str, u64, usize)> {
        let mut out = Vec::new();
        for (name, (_, pending)) in &self.files {
            for change in pending {
                out.push(match change {
                    Pending::Write { offset, data } => (name.clone(), "write", *offset, data.len()),
                    Pending::SetLen(len) => (name.clone(), "set_len", *len, 0),
                });
            }
        }
        out
    }

    /// The interrupted write: its file and index among the file's pending changes.
    pub fn interrupted(&self) -> Option<(String, usize)> {
        self.interrupted.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn a_crash_keeps_what_was_synced_and_a_chosen_subset_of_the_rest() {
        let disk = SimDisk::new();
        let f = disk.open_file("f").unwrap();
        disk.sync_dir().unwrap(); // op 1
        f.write(0, &[1; 1024]).unwrap(); // 2
        f.sync_data().unwrap(); // 3
        disk.crash_at(5);
        f.write(0, &[2; 512]).unwrap(); // 4
        f.write(512, &[3; 512]).unwrap(); // 5: interrupted
        f.write(0, &[4; 8]).unwrap(); // after the crash
        assert_eq!(disk.contents("f").unwrap()[0], 4, "the store goes on unaware");
        let crash = disk.crash().unwrap();
        assert_eq!((crash.at, crash.op, crash.pending()), (5, "write", 2));
        let mut rng = rand::rngs::StdRng::seed_from_u64(1);
        let durable = crash.survivor(Keep::Durable, &mut rng);
        assert_eq!(durable.contents("f").unwrap(), vec![1; 1024]);
        let all = crash.survivor(Keep::All, &mut rng);
        let got = all.contents("f").unwrap();
        assert_eq!((got[0], got[511], got[512], got.len()), (2, 2, 3, 1024));
        // Any subset appears over enough draws, and nothing outside the
        // writes' ranges ever changes.
        let mut seen = BTreeSet::new();
        for _ in 0..200 {
            let got = crash.survivor(Keep::Random, &mut rng).contents("f").unwrap();
            assert_eq!(got.len(), 1024);
            seen.insert((got[0] == 2, got[600] == 3));
        }
        assert_eq!(seen.len(), 4);
    }

    #[test]
    fn a_file_whose_directory_entry_was_not_synced_may_vanish() {
        let disk = SimDisk::new();
        let f = disk.open_file("new").unwrap();
        f.write(0, b"x").unwrap(); // 1
        f.sync_data().unwrap(); // 2
        disk.crash_at(3);
        f.write(1, b"y").unwrap(); // 3
        let crash = disk.crash().unwrap();
        let mut rng = rand::rngs::StdRng::seed_from_u64(2);
        assert!(crash.survivor(Keep::Durable, &mut rng).contents("new").is_none());
    }
}

//! The embedded store's journal: a write-ahead log in front of redb.
//!
//! redb makes a commit durable by writing every page the commit touched
//! and syncing the file: tens of kilobytes for one transaction of the
//! protocol. The journal makes the same commit durable with a few hundred
//! bytes. The writer commits to redb without syncing and appends the
//! commit's effects (each record's new value, or its deletion) here
//! before the commit becomes visible; a commit that must be durable is
//! answered once the journal is synced. From time to time, and before the
//! store closes, a checkpoint makes redb itself durable; the journal then
//! starts a new generation (docs/design.md §1, "Durable where it matters";
//! docs/operating.md, "Durability").
//!
//! # Format (version 3)
//!
//! The first 512-byte sector holds the file header: magic, format version,
//! the generation's random salt, the number (LSN) of its first entry, and a
//! checksum. A sector is written whole or not at all, so the header is
//! never torn. It is rewritten and synced each time a generation starts,
//! before any of its entries is written. The next two sectors are the
//! seal slots (below). Entries follow, each aligned to 8 bytes: `length,
//! CRC-32, salt, LSN, synced LSN, payload`, the checksum covering
//! everything but itself. Reading accepts only entries carrying the
//! current salt and following their predecessor's number, so an entry
//! left from an earlier generation (the file is never erased) can never be
//! taken for a new one, whatever a crash kept.
//!
//! What is known to have been synced is written down twice, so that
//! damage to it is told apart from a write that power loss cut short:
//!
//! - each entry records the last LSN synced when it was written;
//! - a seal (`magic, salt, number, synced LSN, end offset, checksum`),
//!   written to the two seal slots in turn once the writer has been idle
//!   for [`SEAL_DELAY`] after a sync, records the LSN that sync covered
//!   (one more small synced write, off every answer's path: a write that
//!   comes sooner carries the proof in its own entries). A seal torn by
//!   power loss leaves the other slot's, which is older and still true.
//!   (Syncing the seal before each answer would close the last window,
//!   docs/limitations.md, but was measured: a second sync per batch made
//!   a single update's p50 36-42% slower.)
//!
//! Where the run of valid entries ends, a seal or a later entry of the
//! same generation that says the missing entry had been synced proves the
//! damage is to acknowledged data, and opening fails with an error naming
//! the file and offset ([`JournalError::Damaged`]); an operator can cut
//! the journal there with `txgate journal truncate` ([`truncate_at`]).
//! Otherwise the missing entry was never synced, or was synced in the
//! last moments before power loss with nothing after it yet (the window
//! docs/limitations.md measures), and dropping it is ordinary power loss.
//!
//! The format is known from what the file holds, never guessed from a
//! damaged header: a header that fails its checksum, a blank header
//! sector in a file holding entries, or a first sector that is neither a
//! header nor a version 1 entry refuses to open.
//!
//! Version 2 files (no seal slots; entries from the second sector) and
//! version 1 files (no header; entries `length, CRC-32, LSN, payload` from
//! offset 0) are still read; the next generation rewrites the file as
//! version 3.

mod payload;
mod read;

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;

use redb::StorageBackend;

pub use payload::{Effect, Effects, effects};
pub use read::{Evidence, JournalError, Read, synced_evidence};
use read::{Layout, entry_at, parse, read_all};

/// The journal format this release writes.
pub(crate) const FORMAT_VERSION: u32 = 3;

/// Version 2: no seal slots, entries right after the header sector.
const V2: u32 = 2;

const MAGIC: [u8; 8] = *b"txgjrnl\0";

const SEAL_MAGIC: [u8; 8] = *b"txgseal\0";

/// The header sector.
const SECTOR: u64 = 512;

/// Where the two seal slots are: the sectors after the header.
const SEAL_SLOTS: [u64; 2] = [SECTOR, 2 * SECTOR];

/// Where a version 3 generation's first entry starts.
const FIRST_ENTRY: u64 = 3 * SECTOR;

/// magic, salt, number, synced LSN, end offset, checksum.
const SEAL: usize = 8 + 8 + 8 + 8 + 8 + 4;

/// How long the writer waits, idle after a sync, before it seals what the
/// sync covered (a synced write of one sector). A client that sends its
/// next write within this time has the proof carried by that write's sync
/// instead, at no cost.
pub(crate) const SEAL_DELAY: std::time::Duration = std::time::Duration::from_millis(2);

/// magic, version, reserved, salt, first LSN, checksum.
const FILE_HEADER: usize = 8 + 4 + 4 + 8 + 8 + 4;

/// Bytes before an entry's payload: length, checksum, salt, LSN, synced LSN.
const ENTRY_HEADER: usize = 4 + 4 + 8 + 8 + 8;

/// Entries start at multiples of this.
const ALIGN: usize = 8;

/// Upper bound on one entry's payload. The writer splits a batch into
/// entries of about [`ENTRY_TARGET`] between its queued items (a single
/// write or a chain, whose effects stay in one entry), and an item's
/// effects are bounded by the record size limit and a transaction's data
/// bound, so no entry comes near this.
pub(crate) const MAX_PAYLOAD: usize = 1 << 30;

/// The writer starts a new entry once the current one holds this much.
pub(crate) const ENTRY_TARGET: usize = 8 << 20;

/// The journal file grows by at least this much at a time, written with
/// zeros and synced, so that syncing an entry later writes only data and
/// not the file's size or block map (which would double its cost).
const GROW: u64 = 1 << 20;

/// Version 1: bytes before an entry's payload (length, checksum, LSN).
const V1_HEADER: usize = 4 + 4 + 8;

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("four bytes"))
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("eight bytes"))
}

/// The checksum of an entry: everything in it but the checksum itself.
fn entry_checksum(salt: u64, lsn: u64, synced: u64, payload: &[u8]) -> u32 {
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(&(payload.len() as u64).to_le_bytes());
    hasher.update(&salt.to_le_bytes());
    hasher.update(&lsn.to_le_bytes());
    hasher.update(&synced.to_le_bytes());
    hasher.update(payload);
    hasher.finalize()
}

fn v1_checksum(lsn: u64, payload: &[u8]) -> u32 {
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(&lsn.to_le_bytes());
    hasher.update(payload);
    hasher.finalize()
}

/// The header sector of a generation.
fn header_sector(salt: u64, first: u64) -> Vec<u8> {
    let mut h = Vec::with_capacity(SECTOR as usize);
    h.extend_from_slice(&MAGIC);
    h.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    h.extend_from_slice(&0u32.to_le_bytes());
    h.extend_from_slice(&salt.to_le_bytes());
    h.extend_from_slice(&first.to_le_bytes());
    let sum = crc32fast::hash(&h);
    h.extend_from_slice(&sum.to_le_bytes());
    h.resize(SECTOR as usize, 0);
    h
}

/// A seal slot's bytes: entries of generation `salt` up to `lsn`, ending
/// at `end`, were synced.
fn seal_sector(salt: u64, number: u64, lsn: u64, end: u64) -> Vec<u8> {
    let mut h = Vec::with_capacity(SECTOR as usize);
    h.extend_from_slice(&SEAL_MAGIC);
    h.extend_from_slice(&salt.to_le_bytes());
    h.extend_from_slice(&number.to_le_bytes());
    h.extend_from_slice(&lsn.to_le_bytes());
    h.extend_from_slice(&end.to_le_bytes());
    let sum = crc32fast::hash(&h);
    h.extend_from_slice(&sum.to_le_bytes());
    h.resize(SECTOR as usize, 0);
    h
}

/// The journal file, written from the writer thread only.
pub struct Journal {
    file: Box<dyn StorageBackend>,
    /// The current generation's salt.
    salt: u64,
    /// Where the next entry goes.
    offset: u64,
    /// The next entry's number.
    next_lsn: u64,
    /// The last entry known to be durable, and where it ends.
    synced_lsn: u64,
    synced_end: u64,
    /// The last entry a seal records as synced, and the last seal's number.
    sealed_lsn: u64,
    seals: u64,
    /// Whether entries were written since the last sync.
    unsynced: bool,
    /// The file's length: written and synced up to here.
    allocated: u64,
    /// Bytes of entries written in this generation.
    written: u64,
}

impl Journal {
    /// Open the journal in `file` and read its entries: the longest run of
    /// whole, consecutive entries of its current generation. Nothing is
    /// written until [`Journal::restart`] starts a new generation.
    /// `applied` is the last entry the database holds: a journal whose
    /// header cannot be read is damaged if it holds a later one.
    pub fn open(file: Box<dyn StorageBackend>, applied: u64) -> Result<(Self, Read), JournalError> {
        let data = read_all(file.as_ref())?;
        let read = parse(&data, applied)?;
        let next_lsn = read.entries.last().map_or(1, |(lsn, _)| lsn + 1);
        let journal = Self {
            allocated: data.len() as u64,
            file,
            salt: 0,
            offset: FIRST_ENTRY,
            next_lsn,
            synced_lsn: next_lsn - 1,
            synced_end: FIRST_ENTRY,
            sealed_lsn: next_lsn - 1,
            seals: 0,
            unsynced: false,
            written: 0,
        };
        Ok((journal, read))
    }

    /// The number the next entry gets.
    pub(crate) fn next_lsn(&self) -> u64 {
        self.next_lsn
    }

    /// Bytes of entries written since the generation started.
    pub fn written(&self) -> u64 {
        self.written
    }

    pub(crate) fn is_unsynced(&self) -> bool {
        self.unsynced
    }

    /// Write `effects` as the next entry (not synced); its number is
    /// [`Journal::next_lsn`] before the call.
    pub fn append(&mut self, effects: &mut Effects) -> io::Result<()> {
        let size = effects.len();
        if size > MAX_PAYLOAD {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "journal entry too large"));
        }
        let lsn = self.next_lsn;
        let sum = entry_checksum(self.salt, lsn, self.synced_lsn, effects.payload());
        let head = &mut effects.buf[..ENTRY_HEADER];
        head[0..4].copy_from_slice(&(size as u32).to_le_bytes());
        head[4..8].copy_from_slice(&sum.to_le_bytes());
        head[8..16].copy_from_slice(&self.salt.to_le_bytes());
        head[16..24].copy_from_slice(&lsn.to_le_bytes());
        head[24..32].copy_from_slice(&self.synced_lsn.to_le_bytes());
        let unpadded = effects.buf.len();
        effects.buf.resize(unpadded.next_multiple_of(ALIGN), 0);
        let padded = effects.buf.len() as u64;
        let end = self.offset + padded;
        if end > self.allocated {
            self.grow(end)?;
        }
        let written = self.file.write(self.offset, &effects.buf);
        effects.buf.truncate(unpadded);
        written?;
        self.offset = end;
        self.written += padded;
        self.next_lsn += 1;
        self.unsynced = true;
        Ok(())
    }

    /// Extend the file with zeros to past `end`, durably.
    fn grow(&mut self, end: u64) -> io::Result<()> {
        let target = end.max(self.allocated + GROW).div_ceil(GROW) * GROW;
        let zeros = vec![0u8; usize::try_from(target - self.allocated).map_err(io::Error::other)?];
        self.file.write(self.allocated, &zeros)?;
        self.file.sync_data()?;
        self.allocated = target;
        Ok(())
    }

    /// Make every entry written so far durable. (The entries it syncs
    /// record what the sync before it covered; what it covers is sealed
    /// once the writer is idle, see [`Journal::seal`].)
    pub fn sync(&mut self) -> io::Result<()> {
        if self.unsynced {
            self.file.sync_data()?;
            self.unsynced = false;
        }
        self.synced_lsn = self.next_lsn - 1;
        self.synced_end = self.offset;
        Ok(())
    }

    /// Whether the last sync covered entries no seal records yet.
    pub(crate) fn needs_seal(&self) -> bool {
        !self.unsynced && self.synced_lsn > self.sealed_lsn
    }

    /// Seal what the last sync covered, durably: afterwards, damage to any
    /// of it refuses to open rather than pass for a torn write.
    pub fn seal(&mut self) -> io::Result<()> {
        if self.needs_seal() {
            self.write_seal()?;
            self.file.sync_data()?;
        }
        Ok(())
    }

    /// Write (without syncing) the seal of everything synced so far, to
    /// the slot the previous seal did not use (a seal torn by power loss
    /// leaves the other, older and still true).
    fn write_seal(&mut self) -> io::Result<()> {
        self.seals += 1;
        let slot = SEAL_SLOTS[(self.seals % 2) as usize];
        self.file.write(slot, &seal_sector(self.salt, self.seals, self.synced_lsn, self.synced_end))?;
        self.sealed_lsn = self.synced_lsn;
        Ok(())
    }

    /// Start a new generation, numbering on from `next_lsn`: every entry so
    /// far is durable in redb (a checkpoint, or the replay at open). The
    /// header with the new salt is synced before any entry of the new
    /// generation is written, so none of the old generation's entries left
    /// in the file can be read as one of the new.
    pub fn restart(&mut self, next_lsn: u64) -> io::Result<()> {
        let salt = loop {
            let salt: u64 = rand::random();
            if salt != 0 && salt != self.salt {
                break salt;
            }
        };
        if self.allocated < FIRST_ENTRY {
            self.grow(FIRST_ENTRY)?;
        }
        self.file.write(0, &header_sector(salt, next_lsn))?;
        self.file.sync_data()?;
        self.salt = salt;
        self.offset = FIRST_ENTRY;
        self.next_lsn = next_lsn;
        self.synced_lsn = next_lsn - 1;
        self.synced_end = FIRST_ENTRY;
        // Seals of earlier generations carry their salt: nothing to prove.
        self.sealed_lsn = next_lsn - 1;
        self.unsynced = false;
        self.written = 0;
        Ok(())
    }
}

/// A journal file on the local file system.
#[derive(Debug)]
pub(crate) struct JournalFile(pub File);

impl StorageBackend for JournalFile {
    fn len(&self) -> io::Result<u64> {
        Ok(self.0.metadata()?.len())
    }
    fn read(&self, offset: u64, out: &mut [u8]) -> io::Result<()> {
        self.0.read_exact_at(out, offset)
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.0.set_len(len)
    }
    fn sync_data(&self) -> io::Result<()> {
        self.0.sync_data()
    }
    fn write(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        self.0.write_all_at(data, offset)
    }
}

/// What cutting a journal at an offset keeps and drops ([`truncate_at`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Truncation {
    /// Whole entries before the offset, kept.
    pub kept: usize,
    /// Whole entries of the generation from the offset on, dropped.
    pub dropped: usize,
    /// The acknowledged (synced) entries dropped, readable or not: the
    /// first and last LSN, as the seal and the later entries record them.
    pub acknowledged: Option<(u64, u64)>,
    /// The header could not be read: everything is dropped.
    pub whole_file: bool,
}

/// Cut the journal at `path` at `offset`: every byte from there on is
/// zeroed (and the seals, which would still vouch for what is cut) and
/// synced, so opening the store keeps the entries before it and loses the
/// rest. With `dry_run`, nothing is written: the answer says what would
/// be. For an operator, with the gateway stopped, after an open refused a
/// damaged journal ([`JournalError::Damaged`] names the offset). `offset`
/// must be where an entry of the current generation starts (the one the
/// error names, or any other), or 0: the whole journal, the only cut a
/// journal whose header is unreadable takes.
pub fn truncate_at(path: &Path, offset: u64, dry_run: bool) -> Result<Truncation, String> {
    let file =
        OpenOptions::new().read(true).write(!dry_run).open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    truncate_on(&JournalFile(file), &path.display().to_string(), offset, dry_run)
}

/// [`truncate_at`] on the journal `file`, named `name` in messages (the
/// power-loss tests cut a journal on their simulated disk). Every byte
/// from `offset` on is zeroed, then the seals, then one sync: a crash
/// anywhere in between leaves the entries before `offset` whole, and at
/// worst a journal whose start is still refused, which the same cut, run
/// again, settles.
pub fn truncate_on(file: &dyn StorageBackend, name: &str, offset: u64, dry_run: bool) -> Result<Truncation, String> {
    let data = read_all(file).map_err(|e| e.to_string())?;
    let offset = usize::try_from(offset).map_err(|e| e.to_string())?;
    // Without the database's applied entry, any whole entry counts.
    let layout = read::layout(&data, 0);
    let sealed = matches!(layout, Ok(Layout::Generation { version: FORMAT_VERSION, .. }));
    let plan = match layout {
        Ok(layout @ Layout::Generation { .. }) => plan(&data, &layout, offset)?,
        Ok(_) | Err(JournalError::Damaged { offset: 0, .. }) if offset == 0 => {
            Truncation { kept: 0, dropped: 0, acknowledged: None, whole_file: true }
        }
        Ok(_) => {
            return Err(format!(
                "{} holds no generation of format 2 or 3 whose entries could be cut at {offset}; only --at 0 (the \
                 whole journal) applies",
                name
            ));
        }
        Err(JournalError::Damaged { offset: 0, detail }) => {
            return Err(format!(
                "{}: {detail}; only --at 0 (the whole journal: every write since the last checkpoint) applies",
                name
            ));
        }
        Err(other) => return Err(format!("{}: {other}", name)),
    };
    if !dry_run && offset < data.len() {
        file.write(offset as u64, &vec![0u8; data.len() - offset]).map_err(|e| e.to_string())?;
        if sealed && offset > 0 {
            // The seals would still vouch for the entries cut.
            for slot in SEAL_SLOTS {
                file.write(slot, &[0u8; SECTOR as usize]).map_err(|e| e.to_string())?;
            }
        }
        file.sync_data().map_err(|e| e.to_string())?;
    }
    Ok(plan)
}

/// What cutting generation `layout` of `data` at `offset` keeps and drops.
fn plan(data: &[u8], layout: &Layout, offset: usize) -> Result<Truncation, String> {
    let Layout::Generation { salt, first, .. } = *layout else { unreachable!("a generation") };
    let start = layout.first_entry();
    let mut boundaries = vec![start];
    let mut at = start;
    while let Some((_, _, _, end)) = entry_at(data, at, salt) {
        boundaries.push(end);
        at = end;
    }
    if offset == 0 {
        return Ok(Truncation {
            kept: 0,
            dropped: count_from(data, start, salt).0,
            acknowledged: None,
            whole_file: true,
        });
    }
    let Some(kept) = boundaries.iter().position(|&b| b == offset) else {
        return Err(format!(
            "offset {offset} is not where an entry of the journal's run starts (valid: {start}..={} at entry \
             boundaries, or 0 for the whole journal; the open error names the offset to use)",
            boundaries.last().copied().unwrap_or(start)
        ));
    };
    let (dropped, synced) = count_from(data, offset, salt);
    let sealed = read::seal_of(data, salt).unwrap_or(0);
    let from = first + kept as u64;
    let to = synced.max(sealed);
    let acknowledged = (to >= from).then_some((from, to));
    Ok(Truncation { kept, dropped, acknowledged, whole_file: false })
}

/// Whole entries of generation `salt` from `at` on, and the highest LSN
/// any of them records as synced.
fn count_from(data: &[u8], mut at: usize, salt: u64) -> (usize, u64) {
    let (mut n, mut synced) = (0, 0);
    while at + ENTRY_HEADER <= data.len() {
        match entry_at(data, at, salt) {
            Some((_, was_synced, _, end)) => {
                n += 1;
                synced = synced.max(was_synced);
                at = end;
            }
            None => at += ALIGN,
        }
    }
    (n, synced)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn effects_of(n: usize, fill: u8) -> Effects {
        let mut e = Effects::default();
        for i in 0..n {
            e.put("c", &format!("d{i}"), &[fill; 3]);
        }
        e.delete("c", "gone");
        e
    }

    fn file(path: &Path) -> Box<dyn StorageBackend> {
        Box::new(JournalFile(
            OpenOptions::new().read(true).write(true).create(true).truncate(false).open(path).unwrap(),
        ))
    }

    fn open(path: &Path) -> Result<(Journal, Read), JournalError> {
        Journal::open(file(path), 0)
    }

    fn lsns(read: &Read) -> Vec<u64> {
        read.entries.iter().map(|(lsn, _)| *lsn).collect()
    }

    /// A journal of `n` entries of one shape (so they have one size),
    /// filled with `fill`, the first synced as asked.
    fn write_run(path: &Path, first: u64, n: usize, fill: u8, sync_each: bool) -> Vec<u64> {
        let (mut j, _) = open(path).unwrap();
        j.restart(first).unwrap();
        let mut offsets = Vec::new();
        for _ in 0..n {
            offsets.push(j.offset);
            j.append(&mut effects_of(2, fill)).unwrap();
            if sync_each {
                j.sync().unwrap();
            }
        }
        offsets
    }

    #[test]
    fn entries_round_trip_and_a_torn_tail_is_cut() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("j");
        let (mut j, old) = open(&path).unwrap();
        assert!(old.entries.is_empty());
        j.restart(1).unwrap();
        for n in 1..=3 {
            j.append(&mut effects_of(n, n as u8)).unwrap();
        }
        j.sync().unwrap();
        let end = j.offset;
        assert!(std::fs::metadata(&path).unwrap().len() >= GROW, "the file grows ahead of its entries");
        let (_, read) = open(&path).unwrap();
        assert_eq!(lsns(&read), vec![1, 2, 3]);
        let got = effects(&read.entries[1].1).unwrap();
        assert_eq!(got.len(), 3);
        assert_eq!(got[1], Effect::Put { coll: "c", id: "d1", bytes: &[2, 2, 2] });
        assert_eq!(got[2], Effect::Delete { coll: "c", id: "gone" });

        // A torn last entry (never synced: nothing after it says it was):
        // the entries before it are kept.
        let f = OpenOptions::new().write(true).open(&path).unwrap();
        f.write_all_at(&[0xAB, 0xCD], end - 3).unwrap();
        let (_, read) = open(&path).unwrap();
        assert_eq!(lsns(&read), vec![1, 2]);
    }

    /// Power loss kept later unsynced entries of a generation but lost its
    /// first; the store opened, started over at the same number and wrote
    /// one entry of the same size. The old entries after it must never be
    /// taken for the new generation's (they would replay stale records
    /// over newer ones).
    #[test]
    fn entries_of_an_earlier_generation_never_follow_a_new_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("j");
        let offsets = write_run(&path, 1, 10, 0x01, false);
        // The first entry's bytes are lost.
        let f = OpenOptions::new().write(true).open(&path).unwrap();
        f.write_all_at(&[0u8; 64], offsets[0]).unwrap();
        let (mut j, read) = open(&path).unwrap();
        assert!(read.entries.is_empty());
        assert_eq!(read.dropped, 9, "nine unsynced entries after the hole are dropped");
        // Opened with nothing to replay: the next generation starts at 1.
        j.restart(1).unwrap();
        j.append(&mut effects_of(2, 0xEE)).unwrap();
        assert_eq!(j.offset, offsets[1], "the new entry ends where an old one begins");
        j.sync().unwrap();
        let (_, read) = open(&path).unwrap();
        assert_eq!(lsns(&read), vec![1]);
        assert_eq!(effects(&read.entries[0].1).unwrap()[0], Effect::Put { coll: "c", id: "d0", bytes: &[0xEE; 3] });
    }

    /// One flipped byte in a synced entry followed by valid ones: an error
    /// naming the offset, never a silent truncation.
    #[test]
    fn a_damaged_synced_entry_before_valid_ones_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("j");
        let offsets = write_run(&path, 5, 10, 0x02, true);
        let f = OpenOptions::new().read(true).write(true).open(&path).unwrap();
        let at = offsets[1] + ENTRY_HEADER as u64 + 3;
        let mut b = [0u8];
        f.read_exact_at(&mut b, at).unwrap();
        f.write_all_at(&[b[0] ^ 0x10], at).unwrap();
        match open(&path) {
            Err(JournalError::Damaged { offset, detail }) => {
                assert_eq!(offset, offsets[1]);
                assert!(detail.contains("entry 6 is unreadable"), "{detail}");
            }
            Err(other) => panic!("expected a damaged journal, got {other}"),
            Ok((_, read)) => panic!("expected a damaged journal, it opened with {:?}", lsns(&read)),
        }
        // The operator's way out: cut it there; the entry before is kept.
        assert!(truncate_at(&path, offsets[1] + 1, false).is_err(), "only an entry boundary");
        let before = std::fs::read(&path).unwrap();
        let plan = truncate_at(&path, offsets[1], true).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), before, "a dry run writes nothing");
        // Entries 6..=14 are lost (entry 6 is unreadable, so 8 whole ones
        // are counted); 6..=13 are known to be acknowledged (14 was
        // synced too, but with no seal after it, nothing records that).
        assert_eq!(plan, Truncation { kept: 1, dropped: 8, acknowledged: Some((6, 13)), whole_file: false });
        assert_eq!(truncate_at(&path, offsets[1], false).unwrap(), plan);
        let (_, read) = open(&path).unwrap();
        assert_eq!(lsns(&read), vec![5]);
    }

    /// A lost unsynced entry followed by surviving (unsynced) ones is
    /// ordinary power loss: the store opens without them.
    #[test]
    fn a_lost_unsynced_entry_drops_the_unsynced_tail() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("j");
        let (mut j, _) = open(&path).unwrap();
        j.restart(1).unwrap();
        let mut offsets = Vec::new();
        for i in 0..6 {
            offsets.push(j.offset);
            j.append(&mut effects_of(2, i)).unwrap();
            if i == 2 {
                j.sync().unwrap(); // 1..=3 synced
            }
        }
        let f = OpenOptions::new().write(true).open(&path).unwrap();
        f.write_all_at(&[0u8; 40], offsets[4]).unwrap(); // entry 5 lost
        let (_, read) = open(&path).unwrap();
        assert_eq!(lsns(&read), vec![1, 2, 3, 4]);
        assert_eq!(read.dropped, 1);
        // Entry 3 (synced) damaged while 4..6 (written after the sync) survive: an error.
        f.write_all_at(&[0u8; 40], offsets[2]).unwrap();
        assert!(matches!(open(&path), Err(JournalError::Damaged { .. })));
    }

    #[test]
    fn a_version_1_journal_is_read() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("j");
        let mut data = Vec::new();
        for lsn in 7..=9u64 {
            let e = effects_of(1, lsn as u8);
            let payload = e.payload();
            data.extend_from_slice(&(payload.len() as u32).to_le_bytes());
            data.extend_from_slice(&v1_checksum(lsn, payload).to_le_bytes());
            data.extend_from_slice(&lsn.to_le_bytes());
            data.extend_from_slice(payload);
        }
        data.resize(4096, 0);
        std::fs::write(&path, &data).unwrap();
        let (mut j, read) = open(&path).unwrap();
        assert_eq!((lsns(&read), read.version), (vec![7, 8, 9], 1));
        // The next generation is written in this release's format.
        j.restart(10).unwrap();
        j.append(&mut effects_of(1, 0)).unwrap();
        j.sync().unwrap();
        let (_, read) = open(&path).unwrap();
        assert_eq!((lsns(&read), read.version), (vec![10], FORMAT_VERSION));
    }

    /// A version 2 file: the header sector, then entries (no seal slots).
    fn version_2(salt: u64, first: u64, n: u64) -> Vec<u8> {
        let mut data = header_sector(salt, first);
        data[8..12].copy_from_slice(&V2.to_le_bytes());
        let sum = crc32fast::hash(&data[..FILE_HEADER - 4]);
        data[FILE_HEADER - 4..FILE_HEADER].copy_from_slice(&sum.to_le_bytes());
        for lsn in first..first + n {
            let e = effects_of(1, lsn as u8);
            let payload = e.payload();
            data.extend_from_slice(&(payload.len() as u32).to_le_bytes());
            data.extend_from_slice(&entry_checksum(salt, lsn, lsn - 1, payload).to_le_bytes());
            data.extend_from_slice(&salt.to_le_bytes());
            data.extend_from_slice(&lsn.to_le_bytes());
            data.extend_from_slice(&(lsn - 1).to_le_bytes());
            data.extend_from_slice(payload);
            data.resize(data.len().next_multiple_of(ALIGN), 0);
        }
        data.resize(GROW as usize, 0);
        data
    }

    #[test]
    fn a_version_2_journal_is_read_and_cut() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("j");
        std::fs::write(&path, version_2(77, 3, 4)).unwrap();
        let (mut j, read) = open(&path).unwrap();
        assert_eq!((lsns(&read), read.version), (vec![3, 4, 5, 6], 2));
        // Cut after its second entry: its first two stay.
        let second = entry_at(&std::fs::read(&path).unwrap(), SECTOR as usize, 77).unwrap().3 as u64;
        let third = entry_at(&std::fs::read(&path).unwrap(), second as usize, 77).unwrap().3 as u64;
        let cut = truncate_at(&path, third, false).unwrap();
        assert_eq!((cut.kept, cut.dropped, cut.acknowledged), (2, 2, Some((5, 5))));
        let (_, read) = open(&path).unwrap();
        assert_eq!(lsns(&read), vec![3, 4]);
        j.restart(5).unwrap();
        j.append(&mut effects_of(1, 0)).unwrap();
        j.sync().unwrap();
        let (_, read) = open(&path).unwrap();
        assert_eq!((lsns(&read), read.version), (vec![5], FORMAT_VERSION));
    }

    /// A damaged header is never read as another format or as empty:
    /// any byte of its magic flipped, the sector zeroed, or the sector
    /// garbled refuses to open, naming offset 0; only cutting the whole
    /// journal gets past it.
    #[test]
    fn a_damaged_header_refuses_to_open() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("j");
        write_run(&path, 1, 20, 0x03, true);
        let good = std::fs::read(&path).unwrap();
        let mut cases: Vec<(String, Vec<u8>)> = Vec::new();
        for at in 0..FILE_HEADER {
            let mut d = good.clone();
            d[at] ^= 0x04;
            cases.push((format!("byte {at} flipped"), d));
        }
        let mut zeroed = good.clone();
        zeroed[..SECTOR as usize].fill(0);
        cases.push(("the sector zeroed".into(), zeroed));
        let mut garbled = good.clone();
        for (i, b) in garbled[..SECTOR as usize].iter_mut().enumerate() {
            *b = (i * 131 % 251) as u8;
        }
        cases.push(("the sector garbled".into(), garbled));
        for (what, data) in cases {
            std::fs::write(&path, &data).unwrap();
            match open(&path) {
                Err(JournalError::Damaged { offset: 0, .. }) => {}
                Err(other) => panic!("{what}: expected damage at offset 0, got {other}"),
                Ok((_, read)) => {
                    panic!("{what}: opened with {} entries as format {}", read.entries.len(), read.version)
                }
            }
            let first = FIRST_ENTRY;
            assert!(truncate_at(&path, first, true).is_err(), "{what}: only the whole journal can be cut");
            assert!(truncate_at(&path, 0, false).unwrap().whole_file, "{what}");
            let (_, read) = open(&path).unwrap();
            assert_eq!((read.entries.len(), read.version), (0, 0), "{what}");
        }
        // A header cut short as a generation started (power loss), over
        // entries the database already holds (all 20): nothing is lost,
        // and the journal opens with nothing to replay. Nor when the
        // entries past the database's were never synced (entry 20 is
        // synced by nothing after it); but entry 20 records that 19 was
        // synced, so a database holding only 18 refuses.
        let mut garbled = good.clone();
        garbled[..SECTOR as usize].fill(0x5A);
        std::fs::write(&path, &garbled).unwrap();
        for applied in [20, 19] {
            let (_, read) = Journal::open(file(&path), applied).unwrap();
            assert!(read.entries.is_empty() && read.header_lost, "applied {applied}");
        }
        assert!(matches!(Journal::open(file(&path), 18), Err(JournalError::Damaged { offset: 0, .. })));
        // A file grown but never given a header (a crash in the first
        // start) holds nothing, and opens empty.
        std::fs::write(&path, vec![0u8; GROW as usize]).unwrap();
        assert_eq!(open(&path).unwrap().1.version, 0);
    }

    /// The last group of entries before a sync has nothing after it to
    /// prove it was synced until the seal: damage inside it, or a zeroed
    /// tail, refuses to open once sealed.
    #[test]
    fn damage_in_the_last_synced_group_refuses_once_sealed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("j");
        let (mut j, _) = open(&path).unwrap();
        j.restart(1).unwrap();
        let mut offsets = Vec::new();
        for _ in 0..5 {
            offsets.push(j.offset);
            j.append(&mut effects_of(2, 0x05)).unwrap();
        }
        let end = j.offset;
        j.sync().unwrap();
        // Before the seal: entry 2 damaged is taken for a torn write (the
        // window the seal closes).
        let synced = std::fs::read(&path).unwrap();
        let mut d = synced.clone();
        d[offsets[1] as usize + ENTRY_HEADER + 1] ^= 0x01;
        std::fs::write(&path, &d).unwrap();
        assert_eq!(lsns(&open(&path).unwrap().1), vec![1]);
        std::fs::write(&path, &synced).unwrap();
        assert!(j.needs_seal());
        j.seal().unwrap();
        assert!(!j.needs_seal());
        let sealed = std::fs::read(&path).unwrap();
        assert_eq!(lsns(&open(&path).unwrap().1), vec![1, 2, 3, 4, 5]);
        let mut d = sealed.clone();
        d[offsets[1] as usize + ENTRY_HEADER + 1] ^= 0x01;
        std::fs::write(&path, &d).unwrap();
        match open(&path) {
            Err(JournalError::Damaged { offset, detail }) => {
                assert_eq!(offset, offsets[1]);
                assert!(detail.contains("seal records that entries up to 5"), "{detail}");
            }
            other => panic!("expected damage, got {:?}", other.map(|(_, r)| lsns(&r))),
        }
        // A zeroed 4 KiB block at the tail.
        let mut d = sealed.clone();
        let tail = (end as usize).next_multiple_of(4096) - 4096;
        d[tail.max(FIRST_ENTRY as usize)..tail + 4096].fill(0);
        std::fs::write(&path, &d).unwrap();
        assert!(matches!(open(&path), Err(JournalError::Damaged { .. })));
        // One seal slot torn: the other still vouches for the entries.
        std::fs::write(&path, &sealed).unwrap();
        j.append(&mut effects_of(2, 0x06)).unwrap();
        j.sync().unwrap(); // nothing new to seal with it: 1..=5 are sealed
        j.seal().unwrap(); // the other slot (up to 6)
        let mut d = std::fs::read(&path).unwrap();
        d[SEAL_SLOTS[0] as usize + 20] ^= 0xFF; // the newest seal torn
        d[offsets[4] as usize + ENTRY_HEADER] ^= 0x01;
        std::fs::write(&path, &d).unwrap();
        match open(&path) {
            Err(JournalError::Damaged { offset, detail }) => {
                assert_eq!(offset, offsets[4]);
                assert!(detail.contains("up to 5"), "the older seal: {detail}");
            }
            other => panic!("expected damage, got {:?}", other.map(|(_, r)| lsns(&r))),
        }
        // A cut there drops the seals too: the store opens with 1..=4.
        let cut = truncate_at(&path, offsets[4], false).unwrap();
        assert_eq!((cut.kept, cut.acknowledged), (4, Some((5, 5))));
        assert_eq!(lsns(&open(&path).unwrap().1), vec![1, 2, 3, 4]);
    }

    #[test]
    fn a_newer_format_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("j");
        let mut h = header_sector(1, 1);
        h[8] = 9;
        let sum = crc32fast::hash(&h[..FILE_HEADER - 4]);
        h[FILE_HEADER - 4..FILE_HEADER].copy_from_slice(&sum.to_le_bytes());
        std::fs::write(&path, &h).unwrap();
        assert!(matches!(open(&path), Err(JournalError::Unsupported(9))));
    }
}

//! The embedded store's journal: a write-ahead log in front of redb.
//!
//! redb makes a commit durable by writing every page the commit touched
//! and syncing the file: tens of kilobytes for one transaction of the
//! protocol. The journal makes the same commit durable with a few hundred
//! bytes. The writer commits to redb without syncing and appends the
//! commit's effects (each record's new value, or its deletion) here
//! before the commit becomes visible; a commit that must be durable is
//! answered once the journal is synced. From time to time, and before the
//! store closes, a checkpoint makes redb itself durable; the journal is
//! then written again from its start.
//!
//! Each redb commit stores the number (LSN) of its journal entry, so the
//! state redb recovers after a crash says exactly which entries it holds.
//! Opening the store replays the entries after it. An entry is
//! `length, CRC-32 of LSN and payload, LSN, payload`. Reading stops at the
//! first entry that is torn, fails its checksum or does not follow its
//! predecessor's number, which also ends the run of entries left from
//! before the last checkpoint: a crash keeps a prefix of the journal, as
//! redb's unsynced commits would (DESIGN.md §1).

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;

/// Bytes before an entry's payload: length, checksum, LSN.
const HEADER: usize = 4 + 4 + 8;

/// Upper bound on one entry's payload (a batch of at most 512 writes of
/// records of at most 16 MiB each is far below it).
const MAX_PAYLOAD: usize = 1 << 30;

/// The journal file grows by at least this much at a time, written with
/// zeros and synced, so that syncing an entry later writes only data and
/// not the file's size or block map (which would double its cost).
const GROW: u64 = 1 << 20;

const PUT: u8 = 1;
const DELETE: u8 = 2;

/// The effects of one commit, encoded as the payload of one entry.
#[derive(Default)]
pub struct Effects {
    buf: Vec<u8>,
}

/// One effect of a replayed entry.
#[derive(Debug, PartialEq, Eq)]
pub enum Effect<'a> {
    /// Record `id` of `coll` is now `bytes` (BSON).
    Put { coll: &'a str, id: &'a str, bytes: &'a [u8] },
    /// Record `id` of `coll` is gone.
    Delete { coll: &'a str, id: &'a str },
}

fn push_bytes(buf: &mut Vec<u8>, bytes: &[u8]) {
    let len = u32::try_from(bytes.len()).expect("a journal field fits in 4 GiB");
    buf.extend_from_slice(&len.to_le_bytes());
    buf.extend_from_slice(bytes);
}

impl Effects {
    pub fn put(&mut self, coll: &str, id: &str, bytes: &[u8]) {
        self.buf.push(PUT);
        push_bytes(&mut self.buf, coll.as_bytes());
        push_bytes(&mut self.buf, id.as_bytes());
        push_bytes(&mut self.buf, bytes);
    }

    pub fn delete(&mut self, coll: &str, id: &str) {
        self.buf.push(DELETE);
        push_bytes(&mut self.buf, coll.as_bytes());
        push_bytes(&mut self.buf, id.as_bytes());
    }

    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }
}

/// Decode a payload into its effects.
pub fn effects(mut payload: &[u8]) -> io::Result<Vec<Effect<'_>>> {
    fn take<'a>(p: &mut &'a [u8], n: usize) -> io::Result<&'a [u8]> {
        if p.len() < n {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "journal entry ends early"));
        }
        let (head, tail) = p.split_at(n);
        *p = tail;
        Ok(head)
    }
    fn field<'a>(p: &mut &'a [u8]) -> io::Result<&'a [u8]> {
        let len = u32::from_le_bytes(take(p, 4)?.try_into().expect("four bytes"));
        take(p, len as usize)
    }
    fn text<'a>(p: &mut &'a [u8]) -> io::Result<&'a str> {
        std::str::from_utf8(field(p)?).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
    }
    let mut out = Vec::new();
    while !payload.is_empty() {
        let kind = take(&mut payload, 1)?[0];
        let coll = text(&mut payload)?;
        let id = text(&mut payload)?;
        out.push(match kind {
            PUT => Effect::Put { coll, id, bytes: field(&mut payload)? },
            DELETE => Effect::Delete { coll, id },
            other => {
                return Err(io::Error::new(io::ErrorKind::InvalidData, format!("unknown journal effect {other}")));
            }
        });
    }
    Ok(out)
}

fn checksum(lsn: u64, payload: &[u8]) -> u32 {
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(&lsn.to_le_bytes());
    hasher.update(payload);
    hasher.finalize()
}

/// An entry as read back: its number and payload.
pub type Entry = (u64, Vec<u8>);

/// The journal file, written from the writer thread only.
pub struct Journal {
    file: File,
    /// Where the next entry goes.
    offset: u64,
    /// The next entry's number.
    next_lsn: u64,
    /// Whether entries were written since the last sync.
    unsynced: bool,
    /// The file's length: written and synced up to here.
    allocated: u64,
    /// Reused for each entry's header and payload.
    scratch: Vec<u8>,
}

impl Journal {
    /// Open (or create) the journal at `path` and read its entries: the
    /// longest run of whole, consecutive entries from its start.
    pub fn open(path: &Path) -> io::Result<(Self, Vec<Entry>)> {
        let file = OpenOptions::new().read(true).write(true).create(true).truncate(false).open(path)?;
        let len = file.metadata()?.len();
        let mut entries: Vec<Entry> = Vec::new();
        let mut offset = 0u64;
        let mut header = [0u8; HEADER];
        while offset + HEADER as u64 <= len {
            file.read_exact_at(&mut header, offset)?;
            let size = u32::from_le_bytes(header[0..4].try_into().expect("four bytes")) as usize;
            let sum = u32::from_le_bytes(header[4..8].try_into().expect("four bytes"));
            let lsn = u64::from_le_bytes(header[8..16].try_into().expect("eight bytes"));
            let end = offset + (HEADER + size) as u64;
            if size == 0 || size > MAX_PAYLOAD || end > len {
                break;
            }
            if entries.last().is_some_and(|(prev, _)| lsn != prev + 1) {
                break;
            }
            let mut payload = vec![0u8; size];
            file.read_exact_at(&mut payload, offset + HEADER as u64)?;
            if checksum(lsn, &payload) != sum {
                break;
            }
            entries.push((lsn, payload));
            offset = end;
        }
        let next_lsn = entries.last().map_or(1, |(lsn, _)| lsn + 1);
        Ok((Self { file, offset: 0, next_lsn, unsynced: false, allocated: len, scratch: Vec::new() }, entries))
    }

    /// The number the next entry gets.
    pub fn next_lsn(&self) -> u64 {
        self.next_lsn
    }

    /// Bytes written since the journal was last restarted.
    pub fn written(&self) -> u64 {
        self.offset
    }

    pub fn is_unsynced(&self) -> bool {
        self.unsynced
    }

    /// Write `effects` as the next entry (not synced); its number is
    /// [`Journal::next_lsn`] before the call.
    pub fn append(&mut self, effects: &Effects) -> io::Result<()> {
        let size = u32::try_from(effects.buf.len())
            .ok()
            .filter(|&n| n as usize <= MAX_PAYLOAD)
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "journal entry too large"))?;
        let lsn = self.next_lsn;
        self.scratch.clear();
        self.scratch.extend_from_slice(&size.to_le_bytes());
        self.scratch.extend_from_slice(&checksum(lsn, &effects.buf).to_le_bytes());
        self.scratch.extend_from_slice(&lsn.to_le_bytes());
        self.scratch.extend_from_slice(&effects.buf);
        let end = self.offset + self.scratch.len() as u64;
        if end > self.allocated {
            self.grow(end)?;
        }
        self.file.write_all_at(&self.scratch, self.offset)?;
        self.offset += self.scratch.len() as u64;
        self.next_lsn += 1;
        self.unsynced = true;
        Ok(())
    }

    /// Extend the file with zeros to past `end`, durably.
    fn grow(&mut self, end: u64) -> io::Result<()> {
        let target = end.max(self.allocated + GROW).div_ceil(GROW) * GROW;
        let zeros = vec![0u8; 64 << 10];
        let mut at = self.allocated;
        while at < target {
            let n = (target - at).min(zeros.len() as u64);
            self.file.write_all_at(&zeros[..n as usize], at)?;
            at += n;
        }
        self.file.sync_data()?;
        self.allocated = target;
        Ok(())
    }

    /// Make every entry written so far durable.
    pub fn sync(&mut self) -> io::Result<()> {
        if self.unsynced {
            self.file.sync_data()?;
            self.unsynced = false;
        }
        Ok(())
    }

    /// Start again from the journal's beginning, numbering on from
    /// `next_lsn`: every entry so far is durable in redb (a checkpoint).
    /// Older entries left behind end the run where the new ones do, as
    /// their numbers do not follow.
    pub fn restart(&mut self, next_lsn: u64) {
        self.offset = 0;
        self.next_lsn = next_lsn;
        self.unsynced = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn effects_of(n: usize) -> Effects {
        let mut e = Effects::default();
        for i in 0..n {
            e.put("c", &format!("d{i}"), &[i as u8; 3]);
        }
        e.delete("c", "gone");
        e
    }

    #[test]
    fn entries_round_trip_and_a_torn_tail_is_cut() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("j");
        let (mut j, old) = Journal::open(&path).unwrap();
        assert!(old.is_empty());
        for n in 1..=3 {
            j.append(&effects_of(n)).unwrap();
        }
        j.sync().unwrap();
        let end = j.written();
        assert!(std::fs::metadata(&path).unwrap().len() >= GROW, "the file grows ahead of its entries");
        let (_, read) = Journal::open(&path).unwrap();
        assert_eq!(read.iter().map(|(lsn, _)| *lsn).collect::<Vec<_>>(), vec![1, 2, 3]);
        let got = effects(&read[1].1).unwrap();
        assert_eq!(got.len(), 3);
        assert_eq!(got[1], Effect::Put { coll: "c", id: "d1", bytes: &[1, 1, 1] });
        assert_eq!(got[2], Effect::Delete { coll: "c", id: "gone" });

        // A torn last entry: the prefix before it is kept.
        let f = OpenOptions::new().write(true).open(&path).unwrap();
        f.write_all_at(&[0, 0], end - 2).unwrap();
        let (_, read) = Journal::open(&path).unwrap();
        assert_eq!(read.len(), 2);

        // A flipped byte fails the checksum.
        f.write_all_at(&[0xff], (HEADER + 2) as u64).unwrap();
        let (_, read) = Journal::open(&path).unwrap();
        assert!(read.is_empty());
    }

    #[test]
    fn a_restarted_journal_ends_where_its_new_entries_do() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("j");
        let (mut j, _) = Journal::open(&path).unwrap();
        for _ in 0..5 {
            j.append(&effects_of(4)).unwrap();
        }
        j.restart(6);
        j.append(&effects_of(1)).unwrap();
        j.sync().unwrap();
        let (j2, read) = Journal::open(&path).unwrap();
        assert_eq!(read.iter().map(|(lsn, _)| *lsn).collect::<Vec<_>>(), vec![6]);
        assert_eq!(j2.next_lsn(), 7);
    }
}

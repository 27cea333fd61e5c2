//! Reading a journal back: the run of valid entries of its current
//! generation, and what lies after it.

use std::fmt;
use std::io;

use redb::StorageBackend;

use super::{
    ALIGN, ENTRY_HEADER, FILE_HEADER, FORMAT_VERSION, MAGIC, MAX_PAYLOAD, SECTOR, V1_HEADER, entry_checksum, u32_at,
    u64_at, v1_checksum,
};

/// An entry as read back: its number and payload.
pub(super) type Entry = (u64, Vec<u8>);

/// Why a journal cannot be opened.
#[derive(Debug)]
pub(crate) enum JournalError {
    Io(io::Error),
    /// Data known to have been synced is unreadable at `offset`.
    Damaged {
        offset: u64,
        detail: String,
    },
    /// A format this release does not know (written by a newer one).
    Unsupported(u32),
}

impl fmt::Display for JournalError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            JournalError::Io(e) => write!(f, "{e}"),
            JournalError::Damaged { offset, detail } => write!(
                f,
                "damaged at offset {offset}: {detail}; opening would drop acknowledged writes, so the store \
                 refuses to open. Restore a backup, or accept the loss of everything from there on with \
                 `txgate journal truncate --at {offset}` (with the gateway stopped)"
            ),
            JournalError::Unsupported(v) => {
                write!(f, "format version {v} is newer than this release reads ({FORMAT_VERSION})")
            }
        }
    }
}

impl From<io::Error> for JournalError {
    fn from(e: io::Error) -> Self {
        JournalError::Io(e)
    }
}

/// What reading a journal found.
#[derive(Debug)]
pub(crate) struct Read {
    /// The longest run of whole, consecutive entries of the current
    /// generation.
    pub entries: Vec<Entry>,
    /// The format the file was in (0: empty).
    pub version: u32,
    /// Valid entries of the generation found after a hole: written, never
    /// synced, dropped (power loss).
    pub dropped: usize,
}

/// Read the whole file behind `file`.
pub(super) fn read_all(file: &dyn StorageBackend) -> io::Result<Vec<u8>> {
    let len = usize::try_from(file.len()?).map_err(io::Error::other)?;
    let mut data = vec![0u8; len];
    if len > 0 {
        file.read(0, &mut data)?;
    }
    Ok(data)
}

/// The entry at `off` of generation `salt`, if whole and valid: (LSN,
/// synced LSN, payload range, end).
pub(super) fn entry_at(data: &[u8], off: usize, salt: u64) -> Option<(u64, u64, std::ops::Range<usize>, usize)> {
    let head = data.get(off..off.checked_add(ENTRY_HEADER)?)?;
    let size = u32_at(head, 0) as usize;
    if size == 0 || size > MAX_PAYLOAD || u64_at(head, 8) != salt {
        return None;
    }
    let (lsn, synced) = (u64_at(head, 16), u64_at(head, 24));
    let start = off + ENTRY_HEADER;
    let payload = data.get(start..start + size)?;
    if entry_checksum(salt, lsn, synced, payload) != u32_at(head, 4) {
        return None;
    }
    Some((lsn, synced, start..start + size, (start + size).next_multiple_of(ALIGN)))
}

/// Parse a journal's bytes.
pub(super) fn parse(data: &[u8]) -> Result<(Read, Option<(u64, u64)>), JournalError> {
    if data.len() < 8 || data[..8] != MAGIC {
        if data.iter().take(SECTOR as usize).all(|&b| b == 0) {
            return Ok((Read { entries: Vec::new(), version: 0, dropped: 0 }, None));
        }
        return Ok((Read { entries: parse_v1(data), version: 1, dropped: 0 }, None));
    }
    let head = data
        .get(..FILE_HEADER)
        .ok_or_else(|| JournalError::Damaged { offset: 0, detail: "the file header is cut short".into() })?;
    if crc32fast::hash(&head[..FILE_HEADER - 4]) != u32_at(head, FILE_HEADER - 4) {
        return Err(JournalError::Damaged { offset: 0, detail: "the file header fails its checksum".into() });
    }
    let version = u32_at(head, 8);
    if version != FORMAT_VERSION {
        return Err(JournalError::Unsupported(version));
    }
    let (salt, first) = (u64_at(head, 16), u64_at(head, 24));
    let mut entries = Vec::new();
    let mut off = SECTOR as usize;
    let mut expected = first;
    while let Some((lsn, _, payload, end)) = entry_at(data, off, salt) {
        if lsn != expected {
            break;
        }
        entries.push((lsn, data[payload].to_vec()));
        expected += 1;
        off = end;
    }
    // Where the run ends: is there evidence that what follows was synced?
    let mut dropped = 0;
    let mut at = off;
    while at + ENTRY_HEADER <= data.len() {
        if u64_at(data, at + 8) == salt {
            if let Some((lsn, synced, _, end)) = entry_at(data, at, salt) {
                if synced >= expected {
                    return Err(JournalError::Damaged {
                        offset: off as u64,
                        detail: format!(
                            "entry {expected} is unreadable, but entry {lsn} after it (offset {at}) records that \
                             entries up to {synced} had been synced"
                        ),
                    });
                }
                if lsn >= expected {
                    dropped += 1;
                }
                at = end;
                continue;
            }
        }
        at += ALIGN;
    }
    Ok((Read { entries, version, dropped }, Some((salt, first))))
}

/// Version 1: the longest run of whole, consecutive entries from offset 0.
fn parse_v1(data: &[u8]) -> Vec<Entry> {
    let mut entries: Vec<Entry> = Vec::new();
    let mut off = 0usize;
    while off + V1_HEADER <= data.len() {
        let size = u32_at(data, off) as usize;
        let sum = u32_at(data, off + 4);
        let lsn = u64_at(data, off + 8);
        let end = off + V1_HEADER + size;
        if size == 0 || size > MAX_PAYLOAD || end > data.len() {
            break;
        }
        if entries.last().is_some_and(|(prev, _)| lsn != prev + 1) {
            break;
        }
        let payload = &data[off + V1_HEADER..end];
        if v1_checksum(lsn, payload) != sum {
            break;
        }
        entries.push((lsn, payload.to_vec()));
        off = end;
    }
    entries
}

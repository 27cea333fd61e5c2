//! Reading a journal back: the run of valid entries of its current
//! generation, and what lies after it.

use std::fmt;
use std::io;

use redb::StorageBackend;

use super::{
    ALIGN, ENTRY_HEADER, FILE_HEADER, FIRST_ENTRY, FORMAT_VERSION, MAGIC, MAX_PAYLOAD, SEAL, SEAL_MAGIC, SEAL_SLOTS,
    SECTOR, V1_HEADER, V2, entry_checksum, u32_at, u64_at, v1_checksum,
};

/// An entry as read back: its number and payload.
pub(super) type Entry = (u64, Vec<u8>);

/// Why a journal cannot be opened.
#[derive(Debug)]
pub enum JournalError {
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
pub struct Read {
    /// The longest run of whole, consecutive entries of the current
    /// generation.
    pub entries: Vec<Entry>,
    /// The format the file was in (0: empty).
    pub version: u32,
    /// Valid entries of the generation found after a hole: written, never
    /// synced, dropped (power loss).
    pub dropped: usize,
    /// The header could not be read, and nothing past the database's
    /// entries was found (see [`layout`]).
    pub header_lost: bool,
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

/// What a journal file holds, known from its bytes.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Layout {
    /// Never started: no header, no entries.
    Empty,
    /// A header that cannot be read, in a file with no entry past the
    /// database's: nothing to replay (see [`layout`]).
    Lost,
    /// Version 1: entries from offset 0, no header.
    V1,
    /// A generation of version 2 or 3.
    Generation { version: u32, salt: u64, first: u64 },
}

impl Layout {
    /// Where the generation's entries start.
    pub(super) fn first_entry(&self) -> usize {
        match self {
            Layout::Generation { version: V2, .. } => SECTOR as usize,
            Layout::Generation { .. } => FIRST_ENTRY as usize,
            Layout::Empty | Layout::Lost | Layout::V1 => 0,
        }
    }
}

/// The format of a journal's bytes, from what they hold: a header that
/// passes its checksum, a version 1 entry at offset 0, or neither. A
/// header that cannot be read (its checksum fails, its sector is blank or
/// garbled) is never read as another format or as empty while the file
/// proves that an entry past `applied`, the last entry the database holds,
/// had been synced (a whole entry of any generation, checked against the
/// salt it carries, or a seal, recording a synced LSN past it): that is an
/// acknowledged write the database lacks, so the journal is damaged.
/// Without such proof nothing acknowledged can be lost: the header was cut
/// short by power loss as a generation started (every earlier entry was
/// already in the database, and later ones were never synced), or was
/// never written.
pub(super) fn layout(data: &[u8], applied: u64) -> Result<Layout, JournalError> {
    let unreadable = |what: &str| match synced_beyond(data, applied) {
        Some((at, synced)) => Err(JournalError::Damaged {
            offset: 0,
            detail: format!(
                "{what}, and the file records (at offset {at}) that entries up to {synced} had been synced, \
                 past the {applied} the database holds: the header of the generation they belong to was lost"
            ),
        }),
        None => Ok(Layout::Lost),
    };
    if data.len() >= MAGIC.len() && data[..MAGIC.len()] == MAGIC {
        let Some(head) = data.get(..FILE_HEADER) else {
            return unreadable("the file header is cut short");
        };
        if crc32fast::hash(&head[..FILE_HEADER - 4]) != u32_at(head, FILE_HEADER - 4) {
            return unreadable("the file header fails its checksum");
        }
        return match u32_at(head, 8) {
            version @ (V2 | FORMAT_VERSION) => {
                Ok(Layout::Generation { version, salt: u64_at(head, 16), first: u64_at(head, 24) })
            }
            version if version > FORMAT_VERSION => Err(JournalError::Unsupported(version)),
            version => unreadable(&format!("the file header names format {version}, which no release wrote")),
        };
    }
    let header = &data[..data.len().min(SECTOR as usize)];
    if header.iter().all(|&b| b == 0) {
        if !any_entry(data) {
            // Never written (a crash in the first start, after the file grew).
            return Ok(Layout::Empty);
        }
        return unreadable("the file header is blank");
    }
    if !parse_v1(data).is_empty() {
        return Ok(Layout::V1);
    }
    unreadable("the file header is unreadable (neither a journal header nor a format 1 entry)")
}

/// Where the file records a synced LSN past `applied`, and that LSN: a
/// whole entry of any generation past the header sector (checked against
/// the salt it carries) or a whole seal of any generation.
fn synced_beyond(data: &[u8], applied: u64) -> Option<(usize, u64)> {
    let seals = seals(data).map(|seal| (seal.slot, seal.lsn));
    let entries = (SECTOR as usize..data.len().saturating_sub(ENTRY_HEADER))
        .step_by(ALIGN)
        .filter_map(|at| entry_at(data, at, u64_at(data, at + 8)).map(|(_, synced, ..)| (at, synced)));
    seals.chain(entries).find(|&(_, synced)| synced > applied)
}

/// A whole seal, as read from its slot.
struct Seal {
    slot: usize,
    salt: u64,
    number: u64,
    lsn: u64,
}

/// The whole seals in the file's slots, of any generation: a slot torn
/// by power loss fails its checksum and is skipped.
fn seals(data: &[u8]) -> impl Iterator<Item = Seal> + '_ {
    SEAL_SLOTS.iter().filter_map(|&slot| {
        let slot = slot as usize;
        let b = data.get(slot..slot + SEAL)?;
        let whole = b[..8] == SEAL_MAGIC && crc32fast::hash(&b[..SEAL - 4]) == u32_at(b, SEAL - 4);
        whole.then(|| Seal { slot, salt: u64_at(b, 8), number: u64_at(b, 16), lsn: u64_at(b, 24) })
    })
}

/// Whether the file past the header sector holds a whole entry of any
/// generation.
fn any_entry(data: &[u8]) -> bool {
    (SECTOR as usize..data.len().saturating_sub(ENTRY_HEADER))
        .step_by(ALIGN)
        .any(|at| entry_at(data, at, u64_at(data, at + 8)).is_some())
}

/// The newest whole seal of generation `salt`: the LSN it records as
/// synced (the other slot's seal is older and still true).
pub(super) fn seal_of(data: &[u8], salt: u64) -> Option<u64> {
    seals(data).filter(|seal| seal.salt == salt).max_by_key(|seal| seal.number).map(|seal| seal.lsn)
}

/// Parse a journal's bytes; `applied` is the last entry the database
/// holds (see [`layout`]).
pub(super) fn parse(data: &[u8], applied: u64) -> Result<Read, JournalError> {
    let layout = layout(data, applied)?;
    let (version, salt, first) = match layout {
        Layout::Empty => return Ok(Read { entries: Vec::new(), version: 0, dropped: 0, header_lost: false }),
        Layout::Lost => return Ok(Read { entries: Vec::new(), version: 0, dropped: 0, header_lost: true }),
        Layout::V1 => return Ok(Read { entries: parse_v1(data), version: 1, dropped: 0, header_lost: false }),
        Layout::Generation { version, salt, first } => (version, salt, first),
    };
    let mut entries = Vec::new();
    let mut off = layout.first_entry();
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
    if let Some(sealed) = seal_of(data, salt).filter(|&sealed| sealed >= expected) {
        return Err(JournalError::Damaged {
            offset: off as u64,
            detail: format!(
                "entry {expected} is unreadable, but the journal's seal records that entries up to {sealed} had \
                 been synced"
            ),
        });
    }
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
    Ok(Read { entries, version, dropped, header_lost: false })
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

/// What a format-3 journal's bytes say was synced, for the power-loss
/// harness, which damages it (see [`synced_evidence`]).
pub struct Evidence {
    /// The run of valid entries of the current generation: offset, LSN,
    /// and the synced LSN each records.
    pub run: Vec<(usize, u64, u64)>,
    /// The LSN the generation's newest seal records.
    pub sealed: Option<u64>,
    /// The seal slots' offsets.
    pub slots: [u64; 2],
}

/// The [`Evidence`] in a format-3 journal's bytes; `None` for any other
/// layout.
pub fn synced_evidence(data: &[u8]) -> Option<Evidence> {
    let layout = layout(data, 0).ok()?;
    let Layout::Generation { version: FORMAT_VERSION, salt, first } = layout else { return None };
    let mut run = Vec::new();
    let (mut off, mut expected) = (layout.first_entry(), first);
    while let Some((lsn, synced, _, end)) = entry_at(data, off, salt) {
        if lsn != expected {
            break;
        }
        run.push((off, lsn, synced));
        expected += 1;
        off = end;
    }
    Some(Evidence { run, sealed: seal_of(data, salt), slots: SEAL_SLOTS })
}

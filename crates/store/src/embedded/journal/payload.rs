//! The payload of a journal entry: the effects of one commit, encoded as
//! they are written and decoded as they are replayed.

use std::io;

use super::ENTRY_HEADER;

const PUT: u8 = 1;
const DELETE: u8 = 2;

/// The effects of one commit (or part of one), encoded as the payload of
/// one entry. The buffer starts with room for the entry's header, filled in
/// when it is appended, so the payload is never copied.
pub struct Effects {
    pub(super) buf: Vec<u8>,
}

impl Default for Effects {
    fn default() -> Self {
        Self { buf: vec![0; ENTRY_HEADER] }
    }
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
        self.buf.len() == ENTRY_HEADER
    }

    /// Payload bytes so far.
    pub fn len(&self) -> usize {
        self.buf.len() - ENTRY_HEADER
    }

    pub(super) fn payload(&self) -> &[u8] {
        &self.buf[ENTRY_HEADER..]
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

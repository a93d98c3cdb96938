//! A JSON body: its last bytes kept, its usage read at the end.

use super::shape::{self, Partial};

/// The last `limit` bytes of a body.
#[derive(Debug)]
pub(super) struct Tail {
    held: Vec<u8>,
    limit: usize,
    /// Whether bytes were dropped from the front (the body outgrew the limit).
    dropped: bool,
}

impl Tail {
    pub fn new(limit: usize) -> Tail {
        Tail {
            held: Vec::new(),
            limit,
            dropped: false,
        }
    }

    pub fn feed(&mut self, chunk: &[u8]) {
        if chunk.len() >= self.limit {
            self.dropped |= !self.held.is_empty() || chunk.len() > self.limit;
            self.held.clear();
            let last = &chunk[chunk.len() - self.limit..];
            push_within(&mut self.held, last, self.limit);
            return;
        }
        let over = (self.held.len() + chunk.len()).saturating_sub(self.limit);
        if over > 0 {
            self.held.drain(..over);
            self.dropped = true;
        }
        push_within(&mut self.held, chunk, self.limit);
    }

    pub fn held(&self) -> usize {
        self.held.capacity()
    }

    /// A whole body that is valid JSON answers with its top-level usage;
    /// otherwise the tail is searched for the last usage object.
    pub fn finish(self) -> Partial {
        let found = match self.dropped {
            false => shape::in_document(&self.held).unwrap_or_else(|_| shape::in_tail(&self.held)),
            true => shape::in_tail(&self.held),
        };
        found.unwrap_or_default()
    }
}

/// Appends `bytes` to `buf` unless that would make it longer than `limit`;
/// the capacity grows (doubling) but never past `limit`. Whether it fit.
pub(super) fn push_within(buf: &mut Vec<u8>, bytes: &[u8], limit: usize) -> bool {
    let want = buf.len() + bytes.len();
    if want > limit {
        return false;
    }
    if want > buf.capacity() {
        let grown = want.max(buf.capacity() * 2).max(256).min(limit);
        buf.reserve_exact(grown - buf.len());
    }
    buf.extend_from_slice(bytes);
    true
}

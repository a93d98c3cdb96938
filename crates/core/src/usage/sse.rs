//! A server-sent event stream: split into events, each event's data read
//! for usage.
//!
//! Lines end with `\n`, `\r\n` or `\r`; a blank line ends an event. The
//! `data` lines of an event are joined with `\n` (one space after the colon
//! dropped); other fields (`event:`, `id:`, `retry:`) and comments (`:`) are
//! ignored. Only the event being read is held, with the line being read at
//! its end; an event whose data and current line outgrow the limit is
//! dropped and its remaining bytes skipped until it ends. An event left open
//! when the body ends is read as if it had ended, so that a server that
//! closes without the last blank line is still counted.

use memchr::memchr2;

use super::body::push_within;
use super::shape::{self, Partial};

#[derive(Debug)]
pub(super) struct Events {
    /// The current event's data lines joined, then the line being read.
    buf: Vec<u8>,
    /// Where the line being read starts in `buf`.
    line: usize,
    /// Whether the line being read has any bytes yet (a blank line has none).
    in_line: bool,
    /// Whether the current event has had a data line.
    has_data: bool,
    /// Whether the current event outgrew the limit: skipped until it ends.
    skip: bool,
    /// Whether the last byte fed was a `\r`, so a `\n` next ends no line.
    after_cr: bool,
    limit: usize,
    found: Partial,
}

impl Events {
    pub fn new(limit: usize) -> Events {
        Events {
            buf: Vec::new(),
            line: 0,
            in_line: false,
            has_data: false,
            skip: false,
            after_cr: false,
            limit,
            found: Partial::default(),
        }
    }

    pub fn feed(&mut self, mut chunk: &[u8]) {
        if chunk.is_empty() {
            return;
        }
        if std::mem::take(&mut self.after_cr)
            && let Some(rest) = chunk.strip_prefix(b"\n")
        {
            chunk = rest;
        }
        while let Some(end) = memchr2(b'\n', b'\r', chunk) {
            self.take(&chunk[..end]);
            self.end_line();
            let mut next = end + 1;
            if chunk[end] == b'\r' {
                match chunk.get(next) {
                    Some(b'\n') => next += 1,
                    Some(_) => {}
                    None => self.after_cr = true,
                }
            }
            chunk = &chunk[next..];
        }
        self.take(chunk);
    }

    pub fn held(&self) -> usize {
        self.buf.capacity()
    }

    pub fn finish(mut self) -> Partial {
        if self.in_line {
            self.end_line();
        }
        self.dispatch();
        self.found
    }

    /// Part of the line being read.
    fn take(&mut self, bytes: &[u8]) {
        if bytes.is_empty() {
            return;
        }
        self.in_line = true;
        if !self.skip && !push_within(&mut self.buf, bytes, self.limit) {
            self.skip = true;
            self.buf.clear();
            self.line = 0;
        }
    }

    /// The line being read has ended: a blank one ends the event, a data
    /// line's value joins the event's data, any other line is dropped.
    fn end_line(&mut self) {
        if !std::mem::take(&mut self.in_line) {
            self.dispatch();
            return;
        }
        if self.skip {
            return;
        }
        let start = self.line;
        match data_value(&self.buf[start..]) {
            Some(offset) => {
                let to = if self.has_data {
                    self.buf[start] = b'\n';
                    start + 1
                } else {
                    start
                };
                let from = start + offset;
                self.buf.copy_within(from.., to);
                self.buf.truncate(self.buf.len() - (from - to));
                self.has_data = true;
            }
            None => self.buf.truncate(start),
        }
        self.line = self.buf.len();
    }

    /// The current event has ended: its data is read if it names a count.
    fn dispatch(&mut self) {
        if !self.skip
            && self.has_data
            && shape::may_count(&self.buf)
            && let Ok(Some(found)) = shape::in_document(&self.buf)
        {
            self.found.update(found);
        }
        self.buf.clear();
        self.line = 0;
        self.has_data = false;
        self.skip = false;
    }
}

/// Where the value of a `data` line starts: after `data:` and one optional
/// space; a bare `data` line has an empty value. `None` for other lines.
fn data_value(line: &[u8]) -> Option<usize> {
    match line.strip_prefix(b"data")? {
        [] => Some(4),
        [b':', b' ', ..] => Some(6),
        [b':', ..] => Some(5),
        _ => None,
    }
}

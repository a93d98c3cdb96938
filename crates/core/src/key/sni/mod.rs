//! The `sni` key: the server name a TLS client asks for in its ClientHello,
//! read without decrypting anything (TLS passthrough in mode tcp).
//!
//! The hello is found in the TLS record layer at the start of a connection:
//! one or more handshake records (type 0x16) whose fragments, joined, start
//! with a ClientHello handshake message. A client may split the hello over
//! several records, and the network over several segments; the scan is given
//! whatever has arrived and says whether it decided, or how many bytes it
//! needs before anything can be decided. Every check is made as soon as the
//! bytes it looks at have arrived, in the order they arrive, so a scan of a
//! prefix that decides decides as the scan of the whole would.
//!
//! The records and the hello are parsed with the crate `tls-parser`. The key
//! is the server name lower-cased, without a trailing dot: DNS names are
//! case-insensitive, and `example.com.` names the same host.

use std::ops::Range;

use tls_parser::{
    MAX_RECORD_LEN, SNIType, TlsExtension, TlsRecordType, parse_tls_extension_sni_content,
    parse_tls_extension_unknown, parse_tls_handshake_client_hello, parse_tls_record_header,
};

use super::{FallbackReason, text_key};

/// A TLS record's header: type, version, length.
const RECORD_HEADER: usize = 5;
/// A handshake message's header: type and a 24-bit length.
const HANDSHAKE_HEADER: usize = 4;
/// The handshake message type of a ClientHello.
const CLIENT_HELLO: u8 = 1;
/// The extension type of `server_name` (RFC 6066).
const SERVER_NAME: u16 = 0;

/// What looking at a connection's first bytes for a ClientHello found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HelloScan {
    /// A complete ClientHello with a server name: its key.
    Found(u64),
    /// Nothing can be decided before this many bytes (more than given) have
    /// arrived.
    NeedMore(usize),
    /// No key can come from these bytes.
    Fallback(FallbackReason),
}

/// The key of a server name: lower-cased, one trailing dot taken off.
/// `magpie lookup` and `/route?key=` give their text through this too.
pub fn server_name_key(name: &[u8]) -> u64 {
    let name = name.trim_ascii();
    let name = name.strip_suffix(b".").unwrap_or(name);
    text_key(&name.to_ascii_lowercase())
}

/// Looks for the server name of the ClientHello at the start of `bytes`,
/// reading no further than `limit` bytes: a hello that cannot be decided
/// within them is [`FallbackReason::TooLarge`]. Pure: no I/O; allocates
/// only to join a hello split over several records.
pub fn scan_client_hello(bytes: &[u8], limit: usize) -> HelloScan {
    HelloScanner::new(limit).scan(bytes)
}

impl HelloScan {
    /// The key in a complete ClientHello body (after its handshake header).
    fn from_hello(body: &[u8]) -> HelloScan {
        match server_name(body) {
            Ok(Some(name)) if !name.trim_ascii().is_empty() && name != b"." => {
                HelloScan::Found(server_name_key(name))
            }
            Ok(_) => HelloScan::Fallback(FallbackReason::NoSni),
            Err(()) => HelloScan::Fallback(FallbackReason::NotTls),
        }
    }
}

/// The handshake bytes joined so far: a range of the input while they come
/// from one record, copied out once a second record adds to them (at most
/// the limit).
#[derive(Debug)]
enum Joined {
    Range(Range<usize>),
    Copied(Vec<u8>),
}

impl Joined {
    fn add(&mut self, bytes: &[u8], more: Range<usize>) {
        match self {
            Joined::Range(r) if r.start == r.end => *r = more,
            Joined::Range(r) if r.end == more.start => r.end = more.end,
            Joined::Range(r) => {
                let mut copied = bytes[r.clone()].to_vec();
                copied.extend_from_slice(&bytes[more]);
                *self = Joined::Copied(copied);
            }
            Joined::Copied(v) => v.extend_from_slice(&bytes[more]),
        }
    }

    fn view<'b>(&'b self, bytes: &'b [u8]) -> &'b [u8] {
        match self {
            Joined::Range(r) => &bytes[r.clone()],
            Joined::Copied(v) => v,
        }
    }
}

/// A scan of the handshake records at the start of a stream that resumes
/// where it stopped: each call is given the bytes of the last one and what
/// arrived since, and looks only at the new ones (what a peer sends in many
/// small records is walked once, not once per segment).
#[derive(Debug)]
pub struct HelloScanner {
    limit: usize,
    /// Where the record being read starts.
    at: usize,
    /// Its payload's length, once its header has arrived.
    record: Option<usize>,
    /// How far its payload has been joined.
    taken: usize,
    joined: Joined,
    /// The handshake message's whole length, header included, once known.
    wanted: Option<usize>,
    /// What was decided, kept for a call after it.
    decided: Option<HelloScan>,
}

impl HelloScanner {
    pub fn new(limit: usize) -> HelloScanner {
        HelloScanner {
            limit,
            at: 0,
            record: None,
            taken: 0,
            joined: Joined::Range(0..0),
            wanted: None,
            decided: None,
        }
    }

    /// Scans `bytes` (only its first `limit`), which start with whatever
    /// the last call was given.
    pub fn scan(&mut self, bytes: &[u8]) -> HelloScan {
        if let Some(decided) = self.decided {
            return decided;
        }
        let bytes = &bytes[..bytes.len().min(self.limit)];
        let scan = match self.walk(bytes) {
            Ok(need) if need > self.limit => HelloScan::Fallback(FallbackReason::TooLarge),
            Ok(need) => return HelloScan::NeedMore(need),
            Err(decided) => decided,
        };
        self.decided = Some(scan);
        scan
    }

    /// Walks on through `bytes`: the bytes needed before the next check,
    /// or what was decided.
    fn walk(&mut self, bytes: &[u8]) -> Result<usize, HelloScan> {
        loop {
            let length = match self.record {
                Some(length) => length,
                None => match record_header(&bytes[self.at..]) {
                    Ok(length) => {
                        self.record = Some(length);
                        self.taken = self.at + RECORD_HEADER;
                        length
                    }
                    Err(Some(n)) => return Ok(self.at + n),
                    Err(None) => return Err(HelloScan::Fallback(FallbackReason::NotTls)),
                },
            };
            let end = self.at + RECORD_HEADER + length;
            let arrived = end.min(bytes.len());
            while self.taken < arrived {
                let joined = self.joined.view(bytes).len();
                // Byte by byte up to the handshake header; then at once.
                let more = match self.wanted {
                    None => 1,
                    Some(wanted) => (wanted - joined).min(arrived - self.taken),
                };
                self.joined.add(bytes, self.taken..self.taken + more);
                self.taken += more;
                if let Some(wanted) = self.check_joined(bytes)? {
                    let body = &self.joined.view(bytes)[HANDSHAKE_HEADER..wanted];
                    return Err(HelloScan::from_hello(body));
                }
            }
            if end > bytes.len() {
                // The record goes on: the next check is at the hello's
                // header or end within it, or at the next record's type.
                let joined = self.joined.view(bytes).len();
                let left = match self.wanted {
                    Some(wanted) => wanted - joined,
                    // The message type is checked on its own, first.
                    None if joined == 0 => 1,
                    None => HANDSHAKE_HEADER - joined,
                };
                let next = bytes.len() + left;
                return Ok(if next <= end { next } else { end + 1 });
            }
            self.at = end;
            self.record = None;
        }
    }

    /// The checks the handshake bytes joined so far allow: the message is
    /// a ClientHello that can fit within the limit. Its whole length once
    /// it has all arrived.
    fn check_joined(&mut self, bytes: &[u8]) -> Result<Option<usize>, HelloScan> {
        let joined = self.joined.view(bytes);
        let wanted = match self.wanted {
            Some(wanted) => wanted,
            None => {
                if joined.first().is_some_and(|&kind| kind != CLIENT_HELLO) {
                    return Err(HelloScan::Fallback(FallbackReason::NotTls));
                }
                let [_, a, b, c, ..] = *joined else {
                    return Ok(None);
                };
                let wanted = HANDSHAKE_HEADER
                    + (usize::from(a) << 16 | usize::from(b) << 8 | usize::from(c));
                // However the rest is split, it cannot take fewer bytes.
                if self.taken + (wanted - HANDSHAKE_HEADER) > self.limit {
                    return Err(HelloScan::Fallback(FallbackReason::TooLarge));
                }
                self.wanted = Some(wanted);
                wanted
            }
        };
        Ok((joined.len() >= wanted).then_some(wanted))
    }
}

/// Checks a record header as far as it has arrived: a handshake record of
/// TLS 1.x, neither empty nor longer than TLS allows. Its payload's length;
/// `Err(Some(n))` until its first `n` bytes have arrived, `Err(None)` for
/// bytes that are not one.
fn record_header(header: &[u8]) -> Result<usize, Option<usize>> {
    match header {
        [] => Err(Some(1)),
        [kind, ..] if *kind != u8::from(TlsRecordType::Handshake) => Err(None),
        [_] => Err(Some(2)),
        [_, major, ..] if *major != 3 => Err(None),
        _ if header.len() < RECORD_HEADER => Err(Some(RECORD_HEADER)),
        _ => match parse_tls_record_header(header) {
            Ok((_, h)) if h.len == 0 || h.len > MAX_RECORD_LEN => Err(None),
            Ok((_, h)) => Ok(usize::from(h.len)),
            Err(_) => Err(None),
        },
    }
}

/// The first host name in a ClientHello body's `server_name` extension;
/// `Ok(None)` for a hello without one, `Err` for a malformed hello.
fn server_name(body: &[u8]) -> Result<Option<&[u8]>, ()> {
    let (rest, hello) = parse_tls_handshake_client_hello(body).map_err(|_| ())?;
    if !rest.is_empty() {
        return Err(());
    }
    let Some(mut extensions) = hello.ext else {
        return Ok(None);
    };
    while !extensions.is_empty() {
        let (rest, extension) = parse_tls_extension_unknown(extensions).map_err(|_| ())?;
        extensions = rest;
        let TlsExtension::Unknown(kind, data) = extension else {
            return Err(());
        };
        if kind.0 != SERVER_NAME {
            continue;
        }
        let (_, names) = parse_tls_extension_sni_content(data).map_err(|_| ())?;
        let TlsExtension::SNI(names) = names else {
            return Err(());
        };
        return Ok(names
            .into_iter()
            .find(|(kind, _)| *kind == SNIType::HostName)
            .map(|(_, name)| name));
    }
    Ok(None)
}

#[cfg(any(test, feature = "testing"))]
pub mod testing;
#[cfg(test)]
mod tests;

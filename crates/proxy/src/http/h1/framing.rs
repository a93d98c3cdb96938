//! Where an HTTP/1.1 body ends (RFC 9112 §6, §7.1), found in its bytes as
//! they pass: a length counted down, or the chunked coding walked chunk by
//! chunk. The bytes themselves are forwarded as they came; the walk only
//! says how many of them belong to the body, and hands the data inside the
//! chunks to whoever reads it (a body key, the usage scanner).
//!
//! The chunked walk is strict, as a proxy's must be (a lenient one is how
//! request smuggling starts): a size is 1 to 16 hex digits, lines end in
//! CRLF and nothing else, chunk data is followed by CRLF, and extensions and
//! trailers together stay under [`MAX_EXTRA`] bytes.

/// The most bytes of chunk extensions and trailer lines one body may carry.
pub(crate) const MAX_EXTRA: usize = 16 << 10;

/// How a message's body is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Framing {
    /// No body at all.
    Empty,
    /// `Content-Length`.
    Length(u64),
    /// `Transfer-Encoding: chunked`.
    Chunked,
    /// Until the connection closes (a response only).
    Close,
}

/// A body that does not follow its framing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum FramingError {
    #[error("a chunk size is not 1 to 16 hex digits")]
    BadSize,
    #[error("a chunk line does not end in CRLF")]
    BadLineEnd,
    #[error("chunk extensions or trailers exceed {MAX_EXTRA} bytes")]
    TooMuchExtra,
}

/// Where the walk is in a chunked body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Chunk {
    /// Reading a size's hex digits (`digits` so far).
    Size {
        size: u64,
        digits: u8,
    },
    /// After the digits: white space, then an extension (`ext`: its `;`
    /// came), until CR.
    SizeRest {
        size: u64,
        ext: bool,
    },
    /// After the size line's CR.
    SizeLf {
        size: u64,
    },
    Data {
        left: u64,
    },
    DataCr,
    DataLf,
    /// At the start of a trailer line, or of the final empty line.
    LineStart,
    /// Inside a trailer line, until CR.
    Trailer,
    /// After a trailer line's CR.
    TrailerLf,
    /// After the final empty line's CR.
    LastLf,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Length(u64),
    Chunked(Chunk),
    Close,
    Done,
}

/// Finds the end of one body in its bytes, in as many pieces as they come.
#[derive(Debug, Clone, Copy)]
pub(crate) struct BodyEnd {
    state: State,
    /// Extension and trailer bytes seen so far.
    extra: usize,
}

impl BodyEnd {
    pub(crate) fn new(framing: Framing) -> BodyEnd {
        let state = match framing {
            Framing::Empty | Framing::Length(0) => State::Done,
            Framing::Length(n) => State::Length(n),
            Framing::Chunked => State::Chunked(Chunk::Size { size: 0, digits: 0 }),
            Framing::Close => State::Close,
        };
        BodyEnd { state, extra: 0 }
    }

    /// The body has ended.
    pub(crate) fn is_done(&self) -> bool {
        self.state == State::Done
    }

    /// The body is chunked: its data is not all of its bytes.
    pub(crate) fn is_chunked(&self) -> bool {
        matches!(self.state, State::Chunked(_))
    }

    /// The body ends only when the connection closes.
    pub(crate) fn until_close(&self) -> bool {
        self.state == State::Close
    }

    /// Walks the next `bytes` of the message: how many of them belong to
    /// the body (all of them unless it ends inside); `data` gets each piece
    /// of the body's data on the way.
    pub(crate) fn walk(
        &mut self,
        bytes: &[u8],
        data: &mut dyn FnMut(&[u8]),
    ) -> Result<usize, FramingError> {
        let mut at = 0;
        while at < bytes.len() {
            match self.state {
                State::Done => break,
                State::Close => {
                    data(&bytes[at..]);
                    at = bytes.len();
                }
                State::Length(left) => {
                    let left = counted(&bytes[at..], left, &mut at, data);
                    self.state = if left == 0 {
                        State::Done
                    } else {
                        State::Length(left)
                    };
                }
                State::Chunked(Chunk::Data { left }) => {
                    let left = counted(&bytes[at..], left, &mut at, data);
                    self.state = State::Chunked(if left == 0 {
                        Chunk::DataCr
                    } else {
                        Chunk::Data { left }
                    });
                }
                State::Chunked(chunk) => {
                    self.state = self.step(chunk, bytes[at])?;
                    at += 1;
                }
            }
        }
        Ok(at)
    }

    /// One byte of a chunked body's framing (everything but chunk data).
    fn step(&mut self, chunk: Chunk, byte: u8) -> Result<State, FramingError> {
        let next = match (chunk, byte) {
            (Chunk::Size { size, digits }, _) if byte.is_ascii_hexdigit() => {
                if digits == 16 {
                    return Err(FramingError::BadSize);
                }
                let digit = (byte as char).to_digit(16).unwrap_or(0) as u64;
                Chunk::Size {
                    size: size << 4 | digit,
                    digits: digits + 1,
                }
            }
            (Chunk::Size { digits: 0, .. }, _) => return Err(FramingError::BadSize),
            (Chunk::Size { size, .. } | Chunk::SizeRest { size, .. }, b'\r') => {
                Chunk::SizeLf { size }
            }
            (Chunk::Size { size, .. } | Chunk::SizeRest { size, ext: false }, b' ' | b'\t') => {
                self.count_extra()?;
                Chunk::SizeRest { size, ext: false }
            }
            (Chunk::Size { size, .. } | Chunk::SizeRest { size, ext: false }, b';') => {
                self.count_extra()?;
                Chunk::SizeRest { size, ext: true }
            }
            (Chunk::SizeRest { size, ext: true }, _) => {
                // An extension: passed on, not read. A control byte other
                // than HTAB has no place in a line.
                if byte.is_ascii_control() && byte != b'\t' {
                    return Err(FramingError::BadLineEnd);
                }
                self.count_extra()?;
                Chunk::SizeRest { size, ext: true }
            }
            (Chunk::Size { .. } | Chunk::SizeRest { .. }, b'\n') => {
                return Err(FramingError::BadLineEnd);
            }
            (Chunk::Size { .. } | Chunk::SizeRest { .. }, _) => return Err(FramingError::BadSize),
            (Chunk::SizeLf { size: 0 }, b'\n') => Chunk::LineStart,
            (Chunk::SizeLf { size }, b'\n') => Chunk::Data { left: size },
            (Chunk::DataCr, b'\r') => Chunk::DataLf,
            (Chunk::DataLf, b'\n') => Chunk::Size { size: 0, digits: 0 },
            (Chunk::LineStart, b'\r') => Chunk::LastLf,
            (Chunk::LastLf, b'\n') => return Ok(State::Done),
            (Chunk::Trailer, b'\r') => Chunk::TrailerLf,
            (Chunk::LineStart | Chunk::Trailer, b'\n') => return Err(FramingError::BadLineEnd),
            (Chunk::LineStart | Chunk::Trailer, _) => {
                self.count_extra()?;
                Chunk::Trailer
            }
            (Chunk::TrailerLf, b'\n') => Chunk::LineStart,
            _ => return Err(FramingError::BadLineEnd),
        };
        Ok(State::Chunked(next))
    }

    fn count_extra(&mut self) -> Result<(), FramingError> {
        self.extra += 1;
        if self.extra > MAX_EXTRA {
            return Err(FramingError::TooMuchExtra);
        }
        Ok(())
    }
}

/// Up to `left` bytes of data at the start of `bytes`: handed to `data`,
/// counted in `at`; what is left of them after.
fn counted(bytes: &[u8], left: u64, at: &mut usize, data: &mut dyn FnMut(&[u8])) -> u64 {
    let n = usize::try_from(left).unwrap_or(usize::MAX).min(bytes.len());
    data(&bytes[..n]);
    *at += n;
    left - n as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Walks `body` in pieces of `step` bytes: the bytes that belong to it,
    /// its data, and whether it ended.
    fn walk(
        framing: Framing,
        body: &[u8],
        step: usize,
    ) -> Result<(usize, Vec<u8>, bool), FramingError> {
        let mut end = BodyEnd::new(framing);
        let mut data = Vec::new();
        let mut used = 0;
        for piece in body.chunks(step) {
            let n = end.walk(piece, &mut |d| data.extend_from_slice(d))?;
            used += n;
            if n < piece.len() {
                break;
            }
        }
        Ok((used, data, end.is_done()))
    }

    #[test]
    fn lengths_end_where_they_say() {
        for step in [1, 3, 100] {
            let (used, data, done) = walk(Framing::Length(5), b"hello, and more", step).unwrap();
            assert_eq!((used, &data[..], done), (5, &b"hello"[..], true));
        }
        assert!(BodyEnd::new(Framing::Length(0)).is_done());
        assert!(BodyEnd::new(Framing::Empty).is_done());
        let (used, _, done) = walk(Framing::Length(10), b"abc", 2).unwrap();
        assert_eq!((used, done), (3, false));
    }

    #[test]
    fn chunked_bodies_in_any_pieces() {
        let body =
            b"5\r\nhello\r\nA;name=value\r\n0123456789\r\n0\r\nx-trailer: 1\r\n\r\nGET / HTTP/1.1";
        let end = body.len() - b"GET / HTTP/1.1".len();
        for step in 1..body.len() {
            let (used, data, done) = walk(Framing::Chunked, body, step).unwrap();
            assert_eq!(used, end, "step {step}");
            assert_eq!(data, b"hello0123456789");
            assert!(done);
        }
        let (used, data, done) = walk(Framing::Chunked, b"0\r\n\r\n", 1).unwrap();
        assert_eq!((used, data.len(), done), (5, 0, true));
        let (_, _, done) = walk(Framing::Chunked, b"3\r\nab", 10).unwrap();
        assert!(!done);
    }

    #[test]
    fn malformed_chunks_are_refused() {
        let bad: [(&[u8], FramingError); 10] = [
            (b"\r\n", FramingError::BadSize),
            (b"zz\r\n", FramingError::BadSize),
            (b"11111111111111111\r\n", FramingError::BadSize),
            (b"5\nhello\r\n", FramingError::BadLineEnd),
            (b"5\r\nhelloXX", FramingError::BadLineEnd),
            (b"5\r\nhello\r\n0\r\n\n", FramingError::BadLineEnd),
            (b"5\r\nhello\r\n0\r\nx: 1\n", FramingError::BadLineEnd),
            (b"5;a\x00\r\n", FramingError::BadLineEnd),
            (b"5x\r\n", FramingError::BadSize),
            (b"5 x\r\n", FramingError::BadSize),
        ];
        for (body, why) in bad {
            assert_eq!(
                walk(Framing::Chunked, body, 1),
                Err(why),
                "{:?}",
                String::from_utf8_lossy(body)
            );
        }
        let mut long = b"1;".to_vec();
        long.extend(std::iter::repeat_n(b'a', MAX_EXTRA));
        assert_eq!(
            walk(Framing::Chunked, &long, 4096),
            Err(FramingError::TooMuchExtra)
        );
        // Sixteen digits are allowed, white space before the line's end too.
        assert!(
            walk(Framing::Chunked, b"0000000000000001 \r\nx\r\n0\r\n\r\n", 1)
                .unwrap()
                .2
        );
    }

    #[test]
    fn a_close_delimited_body_takes_everything() {
        let (used, data, done) = walk(Framing::Close, b"all of it", 4).unwrap();
        assert_eq!((used, &data[..], done), (9, &b"all of it"[..], false));
    }
}

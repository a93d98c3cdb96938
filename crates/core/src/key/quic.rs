//! `key.from: quic`: the destination connection ID of a QUIC packet, so a
//! QUIC connection keeps its backend when the client's address changes
//! (RFC 9000, section 9), where an address key would move it.
//!
//! Only the version-independent invariants are read (RFC 8999): a long
//! header (first bit set) carries the ID's length in its sixth byte and the
//! ID after it; a short header carries the ID right after its first byte,
//! with a length the endpoints agreed on and the packet does not say, so it
//! is configured (`key.quic_cid_length`). Nothing else of the packet is
//! parsed, and nothing is decrypted.

use crate::hash::h64;

/// The longest connection ID the invariants allow (one length byte).
pub const MAX_CID_LENGTH: usize = 255;

/// Why a datagram gave no connection ID.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotQuic {
    /// Shorter than its header says (or empty).
    Truncated,
    /// A zero-length connection ID: nothing to key by.
    EmptyId,
}

/// The destination connection ID of the QUIC packet `datagram` starts
/// with; `short_len` is the length of the IDs in short headers.
pub fn destination_cid(datagram: &[u8], short_len: usize) -> Result<&[u8], NotQuic> {
    let first = *datagram.first().ok_or(NotQuic::Truncated)?;
    let (start, len) = if first & 0x80 != 0 {
        // Long header: 1 byte of flags, 4 of version, 1 of ID length.
        let len = *datagram.get(5).ok_or(NotQuic::Truncated)? as usize;
        (6, len)
    } else {
        (1, short_len)
    };
    if len == 0 {
        return Err(NotQuic::EmptyId);
    }
    datagram.get(start..start + len).ok_or(NotQuic::Truncated)
}

/// The key of a connection ID: its bytes hashed, as [`super::text_key`]
/// hashes a header's (but not trimmed: every byte counts).
pub fn cid_key(cid: &[u8]) -> u64 {
    h64(cid)
}

/// Bytes written as hex digits, two per byte (upper or lower case, spaces
/// between bytes allowed): how a connection ID is written for `magpie
/// lookup`, and a health datagram in the config. `None` for anything else.
pub fn from_hex(text: &str) -> Option<Vec<u8>> {
    let digits: Vec<u8> = text.bytes().filter(|b| *b != b' ').collect();
    if digits.is_empty() || !digits.len().is_multiple_of(2) {
        return None;
    }
    let nibble = |b: u8| (b as char).to_digit(16).map(|d| d as u8);
    digits
        .chunks(2)
        .map(|pair| Some(nibble(pair[0])? << 4 | nibble(pair[1])?))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_text() {
        assert_eq!(from_hex("00ff10"), Some(vec![0, 255, 16]));
        assert_eq!(from_hex("AB cd"), Some(vec![0xab, 0xcd]));
        for bad in ["", "abc", "zz", "0x10"] {
            assert_eq!(from_hex(bad), None, "{bad}");
        }
    }

    /// A long header (an Initial of version 1) with `dcid`.
    fn long(dcid: &[u8]) -> Vec<u8> {
        let mut p = vec![0xc3, 0, 0, 0, 1, dcid.len() as u8];
        p.extend_from_slice(dcid);
        p.extend_from_slice(&[4, 9, 9, 9, 9, 0, 0x40, 0x20]);
        p
    }

    #[test]
    fn long_and_short_headers_give_the_same_id() {
        let id = [1, 2, 3, 4, 5, 6, 7, 8];
        assert_eq!(destination_cid(&long(&id), 8), Ok(&id[..]));
        let mut short = vec![0x41];
        short.extend_from_slice(&id);
        short.extend_from_slice(&[0xaa; 20]);
        assert_eq!(destination_cid(&short, 8), Ok(&id[..]));
        // The short length is the configured one, whatever follows.
        assert_eq!(destination_cid(&short, 4), Ok(&id[..4]));
    }

    #[test]
    fn long_ids_of_any_length_up_to_the_invariants_bound() {
        let id = [7u8; MAX_CID_LENGTH];
        assert_eq!(destination_cid(&long(&id), 8), Ok(&id[..]));
        assert_eq!(destination_cid(&long(&[9]), 8), Ok(&[9u8][..]));
    }

    #[test]
    fn short_or_empty_packets_give_no_id() {
        assert_eq!(destination_cid(&[], 8), Err(NotQuic::Truncated));
        assert_eq!(destination_cid(&[0xc0, 0, 0], 8), Err(NotQuic::Truncated));
        assert_eq!(destination_cid(&long(&[]), 8), Err(NotQuic::EmptyId));
        let mut cut = long(&[1; 16]);
        cut.truncate(10);
        assert_eq!(destination_cid(&cut, 8), Err(NotQuic::Truncated));
        assert_eq!(destination_cid(&[0x40, 1, 2], 8), Err(NotQuic::Truncated));
        assert_eq!(destination_cid(&[0x40, 1, 2], 0), Err(NotQuic::EmptyId));
    }

    #[test]
    fn every_prefix_of_a_packet_is_safe() {
        let p = long(&[3; 20]);
        for n in 0..p.len() {
            let _ = destination_cid(&p[..n], 8);
            let _ = destination_cid(&p[..n], 20);
        }
    }

    #[test]
    fn the_key_is_the_ids_bytes() {
        assert_eq!(cid_key(b"abc"), h64(b"abc"));
        assert_ne!(cid_key(b" abc"), cid_key(b"abc"));
    }
}

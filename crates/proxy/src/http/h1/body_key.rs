//! A request body read for its key in the pass-through: the client's bytes
//! are read into its buffer and walked ([`BodyEnd`]) until the body ends,
//! its field is found ([`look_early`]), its data passes `key.max_bytes`,
//! the bytes held would pass `limits.key_buffer_bytes`, or
//! `key.read_timeout` passes. The bytes read stay in the buffer, to be sent
//! on as they came; a chunked body's data is gathered beside them to be
//! parsed. The same outcomes as on hyper's path
//! ([`crate::http::request_key`]), so a body is keyed alike on both.

use bytes::Bytes;
use tokio::time::Instant;

use super::framing::{BodyEnd, FramingError};
use super::io::{ClientBuf, ClientIo};
use super::send::READ_CHUNK;
use crate::http::request_key::{BodyWants, Read, look_early};
use crate::telemetry::key_budget::Held;

/// Why a body could not be read for its key.
#[derive(Debug, thiserror::Error)]
pub(crate) enum BodyFailed {
    /// It broke its framing.
    #[error("{0}")]
    Framing(FramingError),
    /// The client closed, or its socket failed, before its end.
    #[error("the client closed before the body's end")]
    Gone,
}

/// The body's bytes read, and what they gave.
pub(crate) struct BodyRead {
    pub(crate) outcome: Read,
    /// How many of the buffer's unconsumed bytes belong to the body.
    pub(crate) walked: usize,
    /// This request's share of the key budget, held until those bytes are
    /// sent on.
    pub(crate) held: Held,
}

/// Reads the body whose first bytes are at the start of `buf`'s
/// unconsumed ones, as far as `wants` needs.
pub(crate) async fn read<S: ClientIo>(
    io: &mut S,
    buf: &mut ClientBuf,
    end: &mut BodyEnd,
    wants: &BodyWants<'_>,
    mut held: Held,
) -> Result<BodyRead, BodyFailed> {
    let deadline = Instant::now() + wants.read.read_timeout;
    let max = wants.read.max_bytes;
    let chunked = end.is_chunked();
    let mut data: Vec<u8> = Vec::new();
    let mut walked = 0;
    let mut next_look = 0;
    let mut granted = held.grow(buf.unconsumed().len());
    let outcome = loop {
        let fresh = &buf.unconsumed()[walked..];
        let n = end
            .walk(fresh, &mut |d| {
                if chunked && data.len() < max {
                    data.extend_from_slice(&d[..d.len().min(max - data.len())]);
                }
            })
            .map_err(BodyFailed::Framing)?;
        walked += n;
        let data_len = if chunked { data.len() } else { walked };
        if !granted {
            break Read::OverBudget;
        }
        let bytes = if chunked {
            &data[..]
        } else {
            &buf.unconsumed()[..walked]
        };
        if end.is_done() && data_len <= max {
            break Read::Complete(Bytes::copy_from_slice(bytes));
        }
        if let Some(field) = wants
            .early
            .filter(|_| data_len >= next_look || data_len >= max)
        {
            next_look = data_len.saturating_mul(2);
            if let Some(found) = look_early(field, &bytes[..data_len.min(max)]) {
                break Read::Early(found);
            }
        }
        if data_len >= max {
            break Read::TooLarge;
        }
        let read = tokio::time::timeout_at(deadline, buf.read(io, READ_CHUNK)).await;
        match read {
            Err(_) => break Read::Timeout,
            Ok(Ok(0) | Err(_)) => return Err(BodyFailed::Gone),
            Ok(Ok(n)) => granted = held.grow(n),
        }
    };
    Ok(BodyRead {
        outcome,
        walked,
        held,
    })
}

//! The PROXY protocol (HAProxy's, versions 1 and 2), and the intake both
//! data paths share: who a connection really comes from, and its stream with
//! whatever was read to find out.
//!
//! Sits right after accept. A peer in `proxy_protocol.accept_from` *must*
//! start with a PROXY header (v1 or v2); its source address then stands for
//! the client everywhere (key, logs, the v2 header sent on). Any other peer
//! that starts with a PROXY signature is refused: a header is never guessed
//! or believed from an untrusted address. Reading is bounded in bytes
//! ([`MAX_HEADER_BYTES`]) and in time (`proxy_protocol.header_timeout`); the
//! client bytes that came with the header stay in the [`ReadAhead`].
//!
//! | module | owns |
//! |---|---|
//! | [`header`] | headers as bytes: parse v1/v2, tell a signature, build v2 (pure, fuzzed) |
//! | this file | [`intake`]: the trust rule and the header read; an untrusted peer's first bytes |

pub(crate) mod header;

use std::time::Duration;

use tokio::net::TcpStream;
use tracing::warn;

pub(crate) use header::{
    MAX_HEADER_BYTES, Origin, ProxyProtocolError, Signature, parse, signature, v2_header,
};

use crate::config::ProxyProtocolConfig;
use crate::intake::read_ahead::ReadAhead;
use crate::net::{Client, Local, Peer};
use crate::telemetry::stats::{ClientFailure, Stats};
use crate::telemetry::throttle::Throttle;

/// How long an untrusted peer (with PROXY input on) has to show its first
/// bytes before magpie connects anyway and keeps watching them in the copy.
pub(crate) const SIGNATURE_WAIT: Duration = Duration::from_millis(50);

/// A connection as the data paths take it: the real client, the address it
/// connected to, and its stream with the bytes read so far.
#[derive(Debug)]
pub(crate) struct Intake {
    pub(crate) client: Client,
    pub(crate) local: Local,
    pub(crate) stream: ReadAhead,
    /// PROXY input is on and this peer is not trusted: its first bytes must
    /// not be a PROXY signature (mode tcp checks them; in mode http such
    /// bytes are not a request).
    pub(crate) untrusted: bool,
}

/// The peer of an accepted connection and the address it reached.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Addresses {
    pub(crate) peer: Peer,
    pub(crate) local: Local,
}

/// Takes an accepted connection in: a trusted peer's PROXY header names the
/// client and the address it connected to; anyone else stands for itself.
/// `None` when a trusted peer sent no valid header: the connection is
/// refused, counted, and logged at most once a second.
pub(crate) async fn intake(
    stream: TcpStream,
    addresses: Addresses,
    config: &ProxyProtocolConfig,
    stats: &Stats,
) -> Option<Intake> {
    let Addresses { peer, local } = addresses;
    let mut stream = ReadAhead::new(stream);
    let (client, local, untrusted) = if !config.is_trusted(peer.0.ip()) {
        (Client(peer.0), local, !config.accept_from.is_empty())
    } else {
        match read_header(&mut stream, config.header_timeout).await {
            Ok(Origin::Proxied {
                source,
                destination,
            }) => (Client(source), Local(destination), false),
            Ok(Origin::Local) => (Client(peer.0), local, false),
            Err(e) => {
                refuse(
                    stats,
                    peer,
                    &format_args!("bad PROXY header from a trusted peer: {e}"),
                );
                return None;
            }
        }
    };
    Some(Intake {
        client,
        local,
        stream,
        untrusted,
    })
}

/// Reads a complete header from a trusted peer and consumes it; any client
/// bytes that came with it stay read ahead.
pub(crate) async fn read_header(
    stream: &mut ReadAhead,
    deadline: Duration,
) -> Result<Origin, ProxyProtocolError> {
    let read = async {
        loop {
            if let Some(parsed) = parse(stream.bytes())? {
                stream.consume(parsed.length);
                return Ok(parsed.origin);
            }
            if stream.bytes().len() >= MAX_HEADER_BYTES {
                return Err(ProxyProtocolError::TooLarge);
            }
            match stream.read_more(MAX_HEADER_BYTES).await {
                Ok(0) | Err(_) => return Err(ProxyProtocolError::Closed),
                Ok(_) => {}
            }
        }
    };
    tokio::time::timeout(deadline, read)
        .await
        .unwrap_or(Err(ProxyProtocolError::Timeout(deadline)))
}

/// Reads an untrusted peer's first bytes until they do or do not start with
/// a PROXY signature, for at most [`SIGNATURE_WAIT`]. `Maybe` when the peer
/// said too little in that time (a server-speaks-first protocol): the copy
/// then keeps watching.
pub(crate) async fn first_signature(stream: &mut ReadAhead) -> Signature {
    let read = async {
        loop {
            match signature(stream.bytes()) {
                Signature::Maybe => {}
                decided => return decided,
            }
            // A signature is decided within its first 12 bytes.
            let limit = stream.bytes().len() + 64;
            match stream.read_more(limit).await {
                // The peer is done or gone: nothing to pass on.
                Ok(0) | Err(_) => return Signature::No,
                Ok(_) => {}
            }
        }
    };
    tokio::time::timeout(SIGNATURE_WAIT, read)
        .await
        .unwrap_or(Signature::Maybe)
}

/// Counts, and logs at most once a second, a connection refused for its
/// PROXY header: a bad one from a trusted peer, or any from an untrusted one.
pub(crate) fn refuse(stats: &Stats, peer: Peer, why: &dyn std::fmt::Display) {
    static LOG: Throttle = Throttle::new(Duration::from_secs(1));
    stats.count_client_failure(ClientFailure::ProxyProtocol);
    if let Some(held_back) = LOG.allow() {
        warn!(%peer, held_back, "refusing connection: {why}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::SocketAddr;
    use tokio::io::AsyncWriteExt;

    fn addr(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    async fn pair() -> (TcpStream, ReadAhead) {
        let (client, accepted) = crate::net::loopback_pair().await;
        (client, ReadAhead::new(accepted))
    }

    #[tokio::test]
    async fn read_keeps_bytes_after_the_header() {
        let (mut client, mut server) = pair().await;
        let mut sent = v2_header(addr("192.0.2.9:1234"), addr("192.0.2.10:80"));
        sent.extend_from_slice(b"hello");
        client.write_all(&sent).await.unwrap();
        let origin = read_header(&mut server, Duration::from_secs(5)).await;
        assert_eq!(
            origin,
            Ok(Origin::Proxied {
                source: addr("192.0.2.9:1234"),
                destination: addr("192.0.2.10:80")
            })
        );
        // The rest may come in a later read; it is never lost.
        while server.bytes().len() < 5 {
            server.read_more(64).await.unwrap();
        }
        assert_eq!(server.bytes(), b"hello");
    }

    #[tokio::test(start_paused = true)]
    async fn slow_header_times_out() {
        let (mut client, mut server) = pair().await;
        client.write_all(b"PROXY TCP4 192.0.2.1").await.unwrap();
        let got = read_header(&mut server, Duration::from_secs(3)).await;
        assert_eq!(
            got,
            Err(ProxyProtocolError::Timeout(Duration::from_secs(3)))
        );
        drop(client);
    }

    #[tokio::test]
    async fn a_first_signature_is_told_and_kept_for_the_replay() {
        let (mut client, mut server) = pair().await;
        client.write_all(b"GET / HTTP/1.1\r\n").await.unwrap();
        assert_eq!(first_signature(&mut server).await, Signature::No);
        assert!(b"GET / HTTP/1.1\r\n".starts_with(server.bytes()));
        let (mut client, mut server) = pair().await;
        client.write_all(b"PROXY TCP4 ").await.unwrap();
        assert_eq!(first_signature(&mut server).await, Signature::Yes);
    }
}

//! Datagrams read in batches: one recvmmsg(2) takes up to [`BATCH`] of the
//! datagrams waiting on a socket.
//!
//! Beside saving calls under load, a batch that comes back short says the
//! socket's queue was empty a moment ago, so the socket's readiness can be
//! given up at once ([`Batch::read`] answers `WouldBlock`) instead of
//! costing one more call that finds nothing, once per wake-up. That is
//! safe with tokio's readiness: giving it up only clears the readiness
//! that was seen before the call, and a datagram that arrived since brings
//! its own (edge-triggered) event.
//!
//! A batch's headers hold raw pointers, so it cannot move between threads:
//! each thread has one ([`with_batch`]), 1 MiB, whatever the flows.

use std::cell::RefCell;
use std::io::{self, ErrorKind, IoSliceMut};
use std::net::{SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::{AsFd, AsRawFd};
use std::sync::atomic::{AtomicU32, Ordering};

use nix::sys::socket::{MsgFlags, MultiHeaders, SockaddrStorage, recvmmsg};
use tokio::io::Interest;
use tokio::net::UdpSocket;

/// The largest datagram: a UDP payload's bound over IPv6 (65,535 less the
/// 8-byte UDP header); IPv4's is smaller.
pub(crate) const MAX_DATAGRAM: usize = 65_527;

/// The most datagrams one call reads.
pub(crate) const BATCH: usize = 16;
/// Room for one datagram: the largest, and one byte more to see
/// truncation.
const SLOT: usize = MAX_DATAGRAM + 1;

thread_local! {
    /// One batch per thread, lent to whoever reads there (a receive loop,
    /// a flow's answers): never held across an await.
    static BATCHES: RefCell<Batch> = RefCell::new(Batch::default());
}

/// Runs `f` with this thread's batch.
pub(crate) fn with_batch<R>(f: impl FnOnce(&mut Batch) -> R) -> R {
    BATCHES.with_borrow_mut(f)
}

/// Buffers for [`BATCH`] datagrams (1 MiB) and what the last read put in
/// them.
pub(crate) struct Batch {
    buffers: Vec<u8>,
    headers: MultiHeaders<SockaddrStorage>,
    /// Length and sender of each datagram read, in order.
    read: Vec<(usize, Option<SocketAddr>)>,
}

impl std::fmt::Debug for Batch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Batch").field("read", &self.read).finish()
    }
}

impl Default for Batch {
    fn default() -> Self {
        Batch {
            buffers: vec![0; BATCH * SLOT],
            headers: MultiHeaders::preallocate(BATCH, None),
            read: Vec::with_capacity(BATCH),
        }
    }
}

impl Batch {
    /// Reads the datagrams waiting on `socket`, at most [`BATCH`], once it
    /// is readable: `Ok` with a full batch (more may wait), `WouldBlock`
    /// when none waited or the batch came back short (its datagrams are
    /// still there, in [`Self::datagrams`]: the queue is empty, and the
    /// socket's readiness given up).
    pub(crate) fn read(&mut self, socket: &UdpSocket) -> io::Result<()> {
        self.read.clear();
        let fd = socket.as_raw_fd();
        let full = socket.try_io(Interest::READABLE, || {
            let mut chunks = self.buffers.chunks_mut(SLOT);
            let mut slices: [[IoSliceMut<'_>; 1]; BATCH] =
                std::array::from_fn(|_| [IoSliceMut::new(chunks.next().unwrap_or_default())]);
            let got = recvmmsg(
                fd,
                &mut self.headers,
                slices.iter_mut(),
                MsgFlags::MSG_DONTWAIT,
                None,
            )
            .map_err(io::Error::from)?;
            for msg in got {
                let bytes = if msg.flags.contains(MsgFlags::MSG_TRUNC) {
                    SLOT
                } else {
                    msg.bytes
                };
                self.read
                    .push((bytes, msg.address.as_ref().and_then(socket_addr)));
            }
            if self.read.len() < BATCH {
                return Err(ErrorKind::WouldBlock.into());
            }
            Ok(())
        });
        match full {
            Err(e) if e.kind() == ErrorKind::WouldBlock && !self.read.is_empty() => {
                Err(ErrorKind::WouldBlock.into())
            }
            other => other,
        }
    }

    /// The datagrams the last read took, each with its sender when the
    /// socket reported one. A datagram longer than [`MAX_DATAGRAM`] comes
    /// whole up to that length plus one byte (a sign to drop it).
    pub(crate) fn datagrams(&self) -> impl Iterator<Item = (&[u8], Option<SocketAddr>)> {
        (self.read.iter().enumerate()).map(|(i, &(len, from))| {
            let start = i * SLOT;
            (&self.buffers[start..start + len.min(SLOT)], from)
        })
    }

    #[cfg(test)]
    /// How many datagrams the last read took.
    pub(crate) fn len(&self) -> usize {
        self.read.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.read.is_empty()
    }
}

/// What the kernel dropped on one socket, its receive buffer full, and how
/// much of it is counted. The count is read (one getsockopt) when a read
/// came back full, so the socket may have overflowed, and once more when
/// the socket's reader ends; a receive loop also reads it once a second,
/// for a buffer that filled with a few large datagrams.
#[derive(Debug, Default)]
pub(crate) struct SocketDrops {
    counted: AtomicU32,
}

impl SocketDrops {
    /// The drops on `socket` since the last call (0 where the system does
    /// not tell).
    pub(crate) fn since_last(&self, socket: &UdpSocket) -> u64 {
        let Ok(now) = crate::net::sys::socket_drops(socket.as_fd()) else {
            return 0;
        };
        let before = self.counted.swap(now, Ordering::Relaxed);
        u64::from(now.wrapping_sub(before))
    }
}

fn socket_addr(address: &SockaddrStorage) -> Option<SocketAddr> {
    if let Some(v4) = address.as_sockaddr_in() {
        return Some(SocketAddrV4::from(*v4).into());
    }
    let v6 = address.as_sockaddr_in6()?;
    Some(SocketAddrV6::from(*v6).into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_short_batch_gives_up_readiness_with_its_datagrams() {
        let socket = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let sender = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let to = socket.local_addr().unwrap();
        for text in ["one", "two", "three"] {
            sender.send_to(text.as_bytes(), to).await.unwrap();
        }
        let mut batch = Batch::default();
        let mut got = Vec::new();
        while got.len() < 3 {
            socket.readable().await.unwrap();
            match batch.read(&socket) {
                Ok(()) => panic!("a full batch of 16 from 3 datagrams"),
                Err(e) => assert_eq!(e.kind(), ErrorKind::WouldBlock),
            }
            for (bytes, from) in batch.datagrams() {
                assert_eq!(from, Some(sender.local_addr().unwrap()));
                got.push(String::from_utf8(bytes.to_vec()).unwrap());
            }
        }
        assert_eq!(got, ["one", "two", "three"]);
        // Readiness was given up: a new datagram wakes the socket again.
        sender.send_to(b"four", to).await.unwrap();
        socket.readable().await.unwrap();
        let _ = batch.read(&socket);
        assert_eq!(batch.len(), 1);
    }

    #[tokio::test]
    async fn a_full_batch_says_more_may_wait() {
        let socket = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let sender = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let to = socket.local_addr().unwrap();
        for n in 0..BATCH + 2 {
            sender.send_to(&[n as u8], to).await.unwrap();
        }
        let mut batch = Batch::default();
        socket.readable().await.unwrap();
        assert!(batch.read(&socket).is_ok());
        assert_eq!(batch.len(), BATCH);
        assert!(batch.read(&socket).is_err());
        let rest: Vec<u8> = batch.datagrams().map(|(b, _)| b[0]).collect();
        assert_eq!(rest, [BATCH as u8, BATCH as u8 + 1]);
    }
}

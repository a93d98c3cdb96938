//! Copying one connection's bytes both ways until both sides are done.
//!
//! The copy is one poll loop over two `Direction`s (client → backend and
//! backend → client), one idle timer and two cancellation waits, so an idle
//! connection's task stays near a kilobyte and holds no copy buffer however
//! long it stays open. How each direction moves bytes (pooled buffers, or
//! splice(2) through pooled pipes) is in [`super::direction`].
//!
//! Half-close is honoured: one side's EOF shuts down the other side's write
//! half while the other direction keeps flowing. Activity in either direction
//! resets the idle timer. The copy ends early when the connection idles out,
//! when the shutdown grace is over, or when its backend was removed and its
//! `drain_timeout` passed. A failed read or write is an abort by that side.

use std::io;
use std::task::Poll;
use std::time::Duration;

use tokio::net::TcpStream;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::direction::{Direction, PipeError};
use crate::config::CopyMode;
use crate::intake::read_ahead::ReadAhead;
use crate::routing::backend::{Backend, Side};

/// How a copy ended.
#[derive(Debug)]
pub(crate) enum End {
    Done,
    Idle,
    /// The shutdown grace is over while bytes could still flow.
    Stopped,
    Drained,
    /// An untrusted peer started with a PROXY signature.
    Refused,
    /// One side's socket failed (typically a reset): the other side must see
    /// an abort too, not a clean end.
    Aborted(Side, io::Error),
}

/// How a copy ended, and what it moved.
#[derive(Debug)]
pub(crate) struct Copied {
    pub(crate) end: End,
    /// Bytes from the client to the backend (the bytes read ahead included).
    pub(crate) bytes_in: u64,
    /// Bytes from the backend to the client.
    pub(crate) bytes_out: u64,
    /// When the backend's first byte came, if one did.
    pub(crate) first_byte: Option<Instant>,
}

/// The rules of one copy.
pub(crate) struct Transfer<'a> {
    /// Counts the bytes; its `closing` token ends the copy (drain timeout).
    pub(crate) backend: &'a Backend,
    pub(crate) idle_timeout: Duration,
    /// The shutdown grace is over.
    pub(crate) stop: &'a CancellationToken,
    /// The client must not begin with a PROXY signature (PROXY input is on
    /// and this peer is not trusted).
    pub(crate) check_signature: bool,
    /// Buffered, splice, or splice once a direction is bulk.
    pub(crate) copy: CopyMode,
}

/// Copies `client` ⇄ `upstream` until both directions end, or the transfer's
/// rules end it; the client's bytes read ahead (a header key's request head,
/// what came with a PROXY header) are replayed to the backend first, then
/// freed. The first EOF is passed on with a write shutdown; the last one is
/// not (a saved call per connection): the caller's close of both sockets,
/// right after, sends that FIN.
pub(crate) async fn copy_both_ways(
    client: &mut ReadAhead,
    upstream: &mut TcpStream,
    transfer: Transfer<'_>,
) -> Copied {
    let live = &transfer.backend.live;
    let closing = live.drain.closing();
    let stop = transfer.stop.cancelled();
    let drained = closing.cancelled();
    let idle = transfer.idle_timeout;
    let mut last_activity = Instant::now();
    let idle_timer = tokio::time::sleep_until(last_activity + idle);
    tokio::pin!(stop, drained, idle_timer);
    let head = client.take_bytes();
    let (mut client_in, mut client_out) = client.stream_mut().split();
    let (mut upstream_in, mut upstream_out) = upstream.split();
    let mut up = Direction::new((Side::Client, Side::Backend), transfer.copy, head);
    up.check_signature = transfer.check_signature;
    let mut down = Direction::new((Side::Backend, Side::Client), transfer.copy, Vec::new());
    let mut first_byte = None;
    let end = std::future::poll_fn(|cx| {
        if stop.as_mut().poll(cx).is_ready() {
            return Poll::Ready(End::Stopped);
        }
        if drained.as_mut().poll(cx).is_ready() {
            return Poll::Ready(End::Drained);
        }
        let before = up.moved + down.moved;
        let up_polled = up.poll(cx, &mut client_in, &mut upstream_out, down.done);
        let down_polled = down.poll(cx, &mut upstream_in, &mut client_out, up.done);
        live.traffic.add_bytes_sent(up.take_counted());
        live.traffic.add_bytes_received(down.take_counted());
        for polled in [up_polled, down_polled] {
            if let Poll::Ready(Err(e)) = polled {
                return Poll::Ready(e.into());
            }
        }
        if up.done && down.done {
            return Poll::Ready(End::Done);
        }
        if up.moved + down.moved != before {
            last_activity = Instant::now();
            if down.moved > 0 && first_byte.is_none() {
                first_byte = Some(last_activity);
            }
        }
        // The timer is moved only when it fires: activity just pushes the
        // deadline it will find then.
        while idle_timer.as_mut().poll(cx).is_ready() {
            let deadline = last_activity + idle;
            if Instant::now() >= deadline {
                return Poll::Ready(End::Idle);
            }
            idle_timer.as_mut().reset(deadline);
        }
        Poll::Pending
    })
    .await;
    Copied {
        end,
        bytes_in: up.moved,
        bytes_out: down.moved,
        first_byte,
    }
}

impl From<PipeError> for End {
    fn from(e: PipeError) -> End {
        match e {
            PipeError::Refused => End::Refused,
            PipeError::Io(side, e) => End::Aborted(side, e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    use crate::tcp::direction::{COPY_BUFFER, PoolBuffer};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use crate::config::BackendConfig;
    use crate::routing::backend::Live;

    use crate::net::loopback_pair as pair;

    fn backend() -> Backend {
        let config = BackendConfig::local("a", 1);
        Backend::new(&config, Arc::new(Live::default()))
    }

    /// `peer ⇄ client` and `upstream ⇄ server`: the copy runs between
    /// `client` and `upstream`, the test talks through `peer` and `server`.
    struct Through {
        peer: TcpStream,
        client: ReadAhead,
        upstream: TcpStream,
        server: TcpStream,
    }

    async fn through() -> Through {
        let ((peer, client), (upstream, server)) = tokio::join!(pair(), pair());
        Through {
            peer,
            client: ReadAhead::new(client),
            upstream,
            server,
        }
    }

    fn rules<'a>(backend: &'a Backend, stop: &'a CancellationToken) -> Transfer<'a> {
        Transfer {
            backend,
            idle_timeout: Duration::from_secs(3600),
            stop,
            check_signature: false,
            copy: CopyMode::Buffered,
        }
    }

    #[tokio::test]
    async fn copies_both_ways_with_half_close_and_counts() {
        both_ways_with_half_close(CopyMode::Buffered).await;
    }

    #[tokio::test]
    async fn splices_both_ways_with_half_close_and_counts() {
        both_ways_with_half_close(CopyMode::Splice).await;
    }

    async fn both_ways_with_half_close(copy: CopyMode) {
        let Through {
            mut peer,
            mut client,
            mut upstream,
            mut server,
        } = through().await;
        let (backend, stop) = (backend(), CancellationToken::new());
        let data: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        let reply: Vec<u8> = data.iter().rev().copied().collect();
        let (sent, answer) = (data.clone(), reply.clone());
        // The client's first bytes are read ahead, as a header key reads
        // them, and must reach the backend first.
        peer.write_all(b"head:").await.unwrap();
        while client.bytes().len() < 5 {
            client.read_more(5).await.unwrap();
        }
        let client_side = tokio::spawn(async move {
            peer.write_all(&sent).await.unwrap();
            peer.shutdown().await.unwrap();
            let mut got = Vec::new();
            peer.read_to_end(&mut got).await.unwrap();
            got
        });
        let server_side = tokio::spawn(async move {
            let mut got = Vec::new();
            server.read_to_end(&mut got).await.unwrap();
            // Its write half still works after the client's EOF.
            server.write_all(&answer).await.unwrap();
            server.shutdown().await.unwrap();
            got
        });
        let mut transfer = rules(&backend, &stop);
        transfer.copy = copy;
        let end = copy_both_ways(&mut client, &mut upstream, transfer)
            .await
            .end;
        assert!(matches!(end, End::Done), "{end:?}");
        // The last EOF is passed on by closing, as a connection does.
        drop((client, upstream));
        let mut expected = b"head:".to_vec();
        expected.extend_from_slice(&data);
        assert_eq!(server_side.await.unwrap(), expected);
        assert_eq!(client_side.await.unwrap(), reply);
        let live = &backend.live;
        assert_eq!(live.traffic.bytes_sent(), expected.len() as u64);
        assert_eq!(live.traffic.bytes_received(), reply.len() as u64);
    }

    /// Many rounds of request → 64 KiB answer, the answer written in odd
    /// chunks and read slowly in small ones, so the copy keeps meeting full
    /// socket buffers in both directions. A lost wakeup would stall a round
    /// forever; each round must finish within a generous deadline.
    async fn rounds_of_64k(rounds: usize, copy: CopyMode) {
        let Through {
            mut peer,
            mut client,
            mut upstream,
            mut server,
        } = through().await;
        let (backend, stop) = (backend(), CancellationToken::new());
        let body: Vec<u8> = (0..65_536u32).map(|i| (i * 7 % 253) as u8).collect();
        let answer = body.clone();
        let server_side = tokio::spawn(async move {
            let mut ask = [0u8; 4];
            for round in 0..rounds {
                server.read_exact(&mut ask).await.unwrap();
                let mut at = 0;
                let mut step = 1 + round % 7 * 1_500;
                while at < answer.len() {
                    let to = (at + step).min(answer.len());
                    server.write_all(&answer[at..to]).await.unwrap();
                    at = to;
                    step = step * 3 % 20_011 + 1;
                }
            }
        });
        let copying = tokio::spawn(async move {
            let mut transfer = rules(&backend, &stop);
            transfer.copy = copy;
            copy_both_ways(&mut client, &mut upstream, transfer)
                .await
                .end
        });
        for round in 0..rounds {
            let one = async {
                peer.write_all(b"GET!").await.unwrap();
                let mut got = vec![0u8; body.len()];
                let mut at = 0;
                while at < got.len() {
                    let to = (at + 997 + round % 5 * 4_000).min(got.len());
                    at += peer.read(&mut got[at..to]).await.unwrap();
                    tokio::task::yield_now().await;
                }
                got
            };
            let got = tokio::time::timeout(Duration::from_secs(20), one)
                .await
                .unwrap_or_else(|_| panic!("round {round} stalled"));
            assert!(got == body, "round {round}: bytes differ");
        }
        server_side.await.unwrap();
        drop(peer);
        let end = tokio::time::timeout(Duration::from_secs(20), copying).await;
        assert!(matches!(end, Ok(Ok(End::Done))), "{end:?}");
    }

    #[tokio::test]
    async fn no_round_of_64k_stalls_on_one_thread() {
        rounds_of_64k(300, CopyMode::Buffered).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn no_round_of_64k_stalls_on_two_threads() {
        rounds_of_64k(300, CopyMode::Buffered).await;
    }

    #[tokio::test]
    async fn no_spliced_round_of_64k_stalls_on_one_thread() {
        rounds_of_64k(300, CopyMode::Splice).await;
    }

    /// `auto` turns to splice after SPLICE_AFTER bytes, mid-round.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn no_round_of_64k_stalls_when_auto_turns_to_splice() {
        rounds_of_64k(300, CopyMode::Auto).await;
    }

    #[tokio::test]
    async fn a_proxy_signature_split_across_reads_is_refused() {
        let Through {
            mut peer,
            mut client,
            mut upstream,
            server,
        } = through().await;
        let (backend, stop) = (backend(), CancellationToken::new());
        let writer = tokio::spawn(async move {
            peer.write_all(b"PRO").await.unwrap();
            tokio::task::yield_now().await;
            peer.write_all(b"XY TCP4 1.2.3.4 5.6.7.8 1 2\r\n")
                .await
                .unwrap();
            peer
        });
        let mut transfer = rules(&backend, &stop);
        transfer.check_signature = true;
        let end = copy_both_ways(&mut client, &mut upstream, transfer)
            .await
            .end;
        assert!(matches!(end, End::Refused), "{end:?}");
        assert_eq!(backend.live.traffic.bytes_sent(), 0);
        drop((writer.await.unwrap(), server));
    }

    #[tokio::test(start_paused = true)]
    async fn idles_out_only_after_idle_timeout_without_bytes() {
        let Through {
            mut peer,
            mut client,
            mut upstream,
            server,
        } = through().await;
        let (backend, stop) = (backend(), CancellationToken::new());
        let mut transfer = rules(&backend, &stop);
        transfer.idle_timeout = Duration::from_secs(10);
        let started = Instant::now();
        let talker = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(8)).await;
            peer.write_all(b"still here").await.unwrap();
            peer
        });
        let end = copy_both_ways(&mut client, &mut upstream, transfer)
            .await
            .end;
        assert!(matches!(end, End::Idle), "{end:?}");
        // 8 s of silence, bytes, then 10 s more.
        assert!(
            started.elapsed() >= Duration::from_secs(18),
            "{:?}",
            started.elapsed()
        );
        drop((talker.await.unwrap(), server));
    }

    #[tokio::test]
    async fn stop_and_drain_end_the_copy() {
        let Through {
            peer,
            mut client,
            mut upstream,
            server,
        } = through().await;
        let (backend, stop) = (backend(), CancellationToken::new());
        stop.cancel();
        let end = copy_both_ways(&mut client, &mut upstream, rules(&backend, &stop))
            .await
            .end;
        assert!(matches!(end, End::Stopped), "{end:?}");
        let stop = CancellationToken::new();
        backend.live.drain.closing().cancel();
        let end = copy_both_ways(&mut client, &mut upstream, rules(&backend, &stop))
            .await
            .end;
        assert!(matches!(end, End::Drained), "{end:?}");
        drop((peer, server));
    }

    /// An idle connection's memory is mostly its task, and the copy is most
    /// of the task: keep its state small (624 bytes in a release build when
    /// this was written; the bound leaves room for compiler changes).
    #[tokio::test]
    async fn the_copy_state_stays_small() {
        let Through {
            peer,
            mut client,
            mut upstream,
            server,
        } = through().await;
        let (backend, stop) = (backend(), CancellationToken::new());
        let copy = copy_both_ways(&mut client, &mut upstream, rules(&backend, &stop));
        let size = std::mem::size_of_val(&copy);
        assert!(size <= 1024, "the copy future is {size} bytes");
        drop((copy, peer, server));
    }

    #[test]
    fn buffers_go_back_to_the_pool() {
        drop(PoolBuffer::take());
        // Other tests take and give back buffers too: at least this one is there.
        assert!(PoolBuffer::pooled() > 0);
        assert_eq!(PoolBuffer::take().bytes().len(), COPY_BUFFER);
    }
}

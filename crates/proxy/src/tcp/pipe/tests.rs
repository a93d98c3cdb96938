//! Pipes through real loopback sockets.

use super::*;
use std::io::Write as _;
use std::os::fd::AsRawFd;
use tokio::io::{AsyncReadExt, AsyncWriteExt, Interest};
use tokio::net::TcpStream;

use crate::net::loopback_pair as pair;

/// Bytes no short block repeats (xorshift), so a lost, doubled or
/// reordered stretch shows.
fn pattern(len: usize) -> Vec<u8> {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

/// The loop the module doc describes, `from` → pipe → `to` until EOF;
/// returns the bytes moved.
async fn splice_all(from: &TcpStream, to: &TcpStream, pool: &'static PipePool) -> u64 {
    let mut total = 0;
    loop {
        from.readable().await.unwrap();
        let mut pipe = pool.take().unwrap();
        loop {
            match from.try_io(Interest::READABLE, || pipe.fill_from(from, usize::MAX)) {
                Ok(Fill::Moved(_)) => continue,
                Ok(Fill::Full) => total += drain(&mut pipe, to).await,
                Ok(Fill::Eof) => return total + drain(&mut pipe, to).await,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    assert!(pipe.is_empty(), "WouldBlock with bytes in the pipe");
                    break;
                }
                Err(e) => panic!("fill: {e}"),
            }
        }
    }
}

async fn drain(pipe: &mut Pipe, to: &TcpStream) -> u64 {
    let mut total = 0;
    while !pipe.is_empty() {
        to.writable().await.unwrap();
        match to.try_io(Interest::WRITABLE, || pipe.drain_into(to)) {
            Ok(n) => total += n as u64,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => panic!("drain: {e}"),
        }
    }
    total
}

#[tokio::test]
async fn bytes_go_socket_to_pipe_to_socket_unchanged() {
    static PIPES: PipePool = PipePool::new(4);
    let (mut writer, from) = pair().await;
    let (to, mut reader) = pair().await;
    let data = pattern(8 << 20);
    let sent = data.clone();
    let feeding = tokio::spawn(async move {
        writer.write_all(&sent).await.unwrap();
        writer.shutdown().await.unwrap();
        writer
    });
    let splicing = tokio::spawn(async move {
        let moved = splice_all(&from, &to, &PIPES).await;
        // Closing `to` is the reader's EOF.
        (moved, from)
    });
    let mut out = Vec::with_capacity(data.len());
    reader.read_to_end(&mut out).await.unwrap();
    let (moved, _from) = splicing.await.unwrap();
    assert_eq!(moved, data.len() as u64);
    assert_eq!(out.len(), data.len());
    assert!(out == data, "the bytes changed on the way");
    assert_eq!(PIPES.idle(), 1, "one empty pipe, back in the pool");
    drop(feeding.await.unwrap());
}

#[tokio::test]
async fn small_segments_fill_a_pipe_long_before_its_capacity() {
    // Each 100-byte segment takes a pipe slot (a few may share one), so
    // the 16 slots fill with a few KiB in the pipe and the rest still in
    // the socket. Taking that EAGAIN for a dry source would clear the
    // readiness and stall: no new byte arrives to set it again.
    static PIPES: PipePool = PipePool::new(1);
    let (mut writer, from) = pair().await;
    let (to, mut reader) = pair().await;
    writer.set_nodelay(true).unwrap();
    let data = pattern(20_000);
    for chunk in data.chunks(100) {
        writer.write_all(chunk).await.unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    }
    let splicing = tokio::spawn(async move { splice_all(&from, &to, &PIPES).await });
    let mut out = vec![0; data.len()];
    tokio::time::timeout(
        std::time::Duration::from_secs(10),
        reader.read_exact(&mut out),
    )
    .await
    .expect("the copy stalled")
    .unwrap();
    assert!(out == data, "the bytes changed on the way");
    writer.shutdown().await.unwrap();
    assert_eq!(splicing.await.unwrap(), data.len() as u64);
}

#[tokio::test]
async fn eof_is_reported_after_the_last_byte() {
    let (mut writer, from) = pair().await;
    writer.write_all(b"last words").await.unwrap();
    writer.shutdown().await.unwrap();
    let mut pipe = Pipe::new().unwrap();
    let mut got = 0;
    loop {
        from.readable().await.unwrap();
        match from.try_io(Interest::READABLE, || pipe.fill_from(&from, usize::MAX)) {
            Ok(Fill::Moved(n)) => got += n,
            Ok(Fill::Eof) => break,
            // The FIN is not in yet; the bytes stay in the pipe.
            Ok(Fill::Full) => tokio::task::yield_now().await,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => panic!("fill: {e}"),
        }
    }
    assert_eq!((got, pipe.in_pipe()), (10, 10));
    assert_eq!(pipe.fill_from(&from, usize::MAX).unwrap(), Fill::Eof);
}

#[tokio::test]
async fn a_pipe_holding_bytes_answers_full_never_would_block() {
    let (mut writer, from) = pair().await;
    let feeding = tokio::spawn(async move {
        writer.write_all(&pattern(1 << 20)).await.unwrap();
        writer
    });
    let mut pipe = Pipe::new().unwrap();
    assert!(pipe.capacity() > 0);
    loop {
        from.readable().await.unwrap();
        match from.try_io(Interest::READABLE, || pipe.fill_from(&from, usize::MAX)) {
            Ok(Fill::Moved(_)) => {}
            Ok(Fill::Full) => break,
            Ok(Fill::Eof) => panic!("unexpected EOF"),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => assert!(pipe.is_empty()),
            Err(e) => panic!("fill: {e}"),
        }
    }
    assert!(pipe.in_pipe() > 0 && pipe.in_pipe() <= pipe.capacity());
    assert_eq!(pipe.fill_from(&from, usize::MAX).unwrap(), Fill::Full);
    assert_eq!(pipe.fill_from(&from, 1).unwrap(), Fill::Full);
    // Emptied, it takes bytes again (or says the source is dry).
    let (to, mut reader) = pair().await;
    let held = pipe.in_pipe();
    assert_eq!(drain(&mut pipe, &to).await, held as u64);
    let mut out = vec![0; held];
    reader.read_exact(&mut out).await.unwrap();
    assert_eq!(out, pattern(held));
    match pipe.fill_from(&from, usize::MAX) {
        Ok(Fill::Moved(_)) => {}
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
        other => panic!("an empty pipe answered {other:?}"),
    }
    feeding.abort();
}

#[tokio::test]
async fn draining_into_a_closed_peer_is_an_error_and_keeps_the_bytes() {
    let (to, reader) = pair().await;
    drop(reader);
    let (mut a, b) = std::os::unix::net::UnixStream::pair().unwrap();
    b.set_nonblocking(true).unwrap();
    let mut pipe = Pipe::new().unwrap();
    for _ in 0..100 {
        a.write_all(&[7; 1000]).unwrap();
        assert!(matches!(pipe.fill_from(&b, usize::MAX), Ok(Fill::Moved(_))));
        // The first bytes may go out before the peer's reset comes back.
        match pipe.drain_into(&to) {
            Ok(_) => tokio::time::sleep(std::time::Duration::from_millis(10)).await,
            Err(e) => {
                assert!(
                    matches!(
                        e.kind(),
                        io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset
                    ),
                    "{e}"
                );
                assert!(pipe.in_pipe() >= 1000, "{}", pipe.in_pipe());
                return;
            }
        }
    }
    panic!("draining into a closed peer never failed");
}

#[test]
fn an_empty_pipe_is_reused_and_one_holding_bytes_is_closed() {
    static PIPES: PipePool = PipePool::new(1);
    let first = PIPES.take().unwrap();
    let fds = (first.read.as_raw_fd(), first.write.as_raw_fd());
    drop(first);
    assert_eq!(PIPES.idle(), 1);
    let mut again = PIPES.take().unwrap();
    assert_eq!(PIPES.idle(), 0);
    assert_eq!((again.read.as_raw_fd(), again.write.as_raw_fd()), fds);

    // Beyond the pool's max, an empty pipe is closed.
    let (second, third) = (PIPES.take().unwrap(), PIPES.take().unwrap());
    drop(second);
    drop(third);
    assert_eq!(PIPES.idle(), 1);

    let (mut a, b) = std::os::unix::net::UnixStream::pair().unwrap();
    b.set_nonblocking(true).unwrap();
    a.write_all(b"in flight").unwrap();
    assert_eq!(again.fill_from(&b, usize::MAX).unwrap(), Fill::Moved(9));
    drop(again);
    assert_eq!(PIPES.idle(), 1, "only the empty pipe is kept");
}

#[test]
fn an_empty_pipe_drains_nothing_and_a_dry_source_would_block() {
    let mut pipe = Pipe::new().unwrap();
    let (_a, b) = std::os::unix::net::UnixStream::pair().unwrap();
    assert_eq!(pipe.drain_into(&b).unwrap(), 0);
    b.set_nonblocking(true).unwrap();
    let e = pipe.fill_from(&b, usize::MAX).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
    let e = pipe.fill_from(&b, 0).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
}

//! `magpie datagrams`: the two ends of a UDP benchmark. `echo` answers every
//! datagram with itself, one thread per address; `load` keeps a window of
//! datagrams in flight over many client sockets (each a flow to a proxy in
//! mode udp) for a while, and prints what came back as JSON.
//!
//! Blocking sockets and plain threads: the load measures the proxy in
//! between, not an async runtime.

use std::io::ErrorKind;
use std::net::{SocketAddr, UdpSocket};
use std::thread;
use std::time::{Duration, Instant};

/// `magpie datagrams`.
#[derive(clap::Subcommand, Debug)]
pub enum DatagramsCommand {
    /// Answer every datagram with itself, on each address, until killed.
    Echo {
        #[arg(long, required = true)]
        listen: Vec<SocketAddr>,
    },
    /// Send datagrams to TARGET over FLOWS client sockets for SECONDS, at
    /// most WINDOW in flight per thread (the sockets take turns, WINDOW at a
    /// time); print sent, answered, lost and the rate.
    Load {
        #[arg(long)]
        target: SocketAddr,
        /// Client sockets (flows), spread over the threads.
        #[arg(long, default_value_t = 64)]
        flows: usize,
        #[arg(long, default_value_t = 1)]
        threads: usize,
        /// Datagrams in flight per thread.
        #[arg(long, default_value_t = 64)]
        window: usize,
        /// Payload bytes per datagram.
        #[arg(long, default_value_t = 64)]
        size: usize,
        #[arg(long, default_value_t = 5.0)]
        seconds: f64,
    },
}

/// Runs `command` (the load prints its result; echo never returns).
pub fn main(command: &DatagramsCommand) -> std::io::Result<()> {
    match command {
        DatagramsCommand::Echo { listen } => echo(listen),
        DatagramsCommand::Load {
            target,
            flows,
            threads,
            window,
            size,
            seconds,
        } => {
            let plan = Plan {
                target: *target,
                flows: (*flows).clamp(1, 100_000),
                window: (*window).clamp(1, 10_000),
                size: (*size).clamp(1, 65_000),
                length: Duration::from_secs_f64(seconds.clamp(0.1, 3600.0)),
            };
            let result = load(&plan, (*threads).clamp(1, 64))?;
            println!(
                "{}",
                serde_json::to_string(&result).map_err(std::io::Error::other)?
            );
            Ok(())
        }
    }
}

fn echo(listen: &[SocketAddr]) -> std::io::Result<()> {
    let mut handles = Vec::new();
    for addr in listen {
        let socket = UdpSocket::bind(addr)?;
        handles.push(thread::spawn(move || {
            let mut buf = vec![0u8; 65_536];
            loop {
                if let Ok((n, from)) = socket.recv_from(&mut buf) {
                    let _ = socket.send_to(&buf[..n], from);
                }
            }
        }));
    }
    for h in handles {
        let _ = h.join();
    }
    Ok(())
}

struct Plan {
    target: SocketAddr,
    flows: usize,
    window: usize,
    size: usize,
    length: Duration,
}

/// What a load run saw, in total.
#[derive(Debug, Default, serde::Serialize)]
pub struct Loaded {
    pub sent: u64,
    pub answered: u64,
    pub lost: u64,
    pub seconds: f64,
    pub answered_per_second: f64,
}

fn load(plan: &Plan, threads: usize) -> std::io::Result<Loaded> {
    let started = Instant::now();
    let per = plan.flows.div_ceil(threads);
    let mut handles = Vec::new();
    for t in 0..threads {
        let n = per.min(plan.flows.saturating_sub(t * per));
        let sockets = (0..n)
            .map(|_| {
                let s = UdpSocket::bind("127.0.0.1:0")?;
                s.connect(plan.target)?;
                s.set_read_timeout(Some(LOST_AFTER))?;
                Ok(s)
            })
            .collect::<std::io::Result<Vec<_>>>()?;
        let (size, window, until) = (plan.size, plan.window, started + plan.length);
        handles.push(thread::spawn(move || rounds(&sockets, size, window, until)));
    }
    let mut total = Loaded::default();
    for h in handles {
        let part = h
            .join()
            .map_err(|_| std::io::Error::other("a load thread panicked"))?;
        total.sent += part.sent;
        total.answered += part.answered;
        total.lost += part.lost;
    }
    total.seconds = started.elapsed().as_secs_f64();
    total.answered_per_second = total.answered as f64 / total.seconds;
    Ok(total)
}

/// An answer that has not come this long after its datagram is lost.
const LOST_AFTER: Duration = Duration::from_millis(100);

/// Until `until`, `window` sockets at a time, in turn: one datagram out on
/// each, then one answer in on each (a lost one costs [`LOST_AFTER`]).
fn rounds(sockets: &[UdpSocket], size: usize, window: usize, until: Instant) -> Loaded {
    let payload = vec![b'x'; size];
    let mut buf = vec![0u8; 65_536];
    let mut out = Loaded::default();
    let mut turns = sockets.chunks(window).cycle();
    while Instant::now() < until {
        let Some(batch) = turns.next() else {
            break;
        };
        for s in batch {
            if s.send(&payload).is_ok() {
                out.sent += 1;
            }
        }
        for s in batch {
            match s.recv(&mut buf) {
                Ok(_) => out.answered += 1,
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                    out.lost += 1
                }
                Err(_) => out.lost += 1,
            }
        }
    }
    out
}

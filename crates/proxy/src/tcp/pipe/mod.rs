//! Zero-copy forwarding for `mode: tcp`: bytes go socket → pipe → socket
//! with splice(2) and stay in the kernel, instead of being read into a copy
//! buffer and written out again.
//!
//! pipe2(2), fcntl(2) and splice(2) have no safe wrapper in std, tokio or
//! socket2: their `unsafe` calls are in [`crate::net::sys`], the one module
//! allowed to contain any; this one is safe Rust on top.
//!
//! Linux only. Elsewhere the API is the same but [`Pipe::new`] (and so
//! [`PooledPipe::take`]) fails with `ErrorKind::Unsupported`, as creating a
//! pipe can fail on Linux too (`EMFILE`): in both cases the caller copies
//! through buffers instead, so no config is refused for it.
//!
//! How a direction of the copy uses it:
//!
//! 1. wait until the source is readable, holding no pipe; take one
//!    ([`PooledPipe::take`]);
//! 2. [`Pipe::fill_from`] the source until it answers `WouldBlock`,
//!    [`Fill::Eof`] or [`Fill::Full`];
//! 3. [`Pipe::drain_into`] the destination until the pipe is empty, waiting
//!    for the destination to be writable (holding the pipe) on `WouldBlock`;
//! 4. fill again; once a fill answers `WouldBlock` the pipe is empty: drop it
//!    (it goes back to the pool) and wait for the source again.
//!
//! Byte counters follow the counts `drain_into` returns.
//!
//! **Source dry or pipe full?** splice answers `EAGAIN` both when the socket
//! has nothing and when the pipe has no room, and the room is not
//! `capacity - in_pipe`: a pipe holds a fixed number of slots (one per page
//! of its size) and every piece of a socket's receive queue takes one, so a
//! pipe can be full with far fewer bytes in it than its capacity. An empty
//! pipe has every slot free, so only there does `EAGAIN` prove the source
//! dry. [`Pipe::fill_from`] therefore answers `WouldBlock` only when the pipe
//! was empty, and [`Fill::Full`] when it held bytes: drain first, then fill
//! again, which settles it (HAProxy's rule too). So `WouldBlock` can be fed
//! to tokio's `try_io`, which clears the source's readiness: it never does
//! while the source may still hold bytes.

use crate::net::sys;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Mutex;

/// The size asked for each pipe. It is Linux's default with 4 KiB pages (16
/// slots), so a pipe of this size costs nothing beyond a plain one against
/// the per-user pipe budget (`fs.pipe-user-pages-soft`, 64 MiB by default:
/// about 1,000 such pipes, shared by every pipe in flight); it is four copy
/// buffers, so one splice does the work of four read/write pairs. Larger
/// pipes would save calls but spend that budget faster. A pipe that comes
/// out smaller (the user is over the budget) is grown to this size if the
/// kernel allows and used as it is if not; a larger one (64 KiB pages, where
/// 64 KiB would be a single slot) is kept as it is.
pub(crate) const PIPE_SIZE: usize = 64 * 1024;

/// Empty pipes kept for reuse: 128 descriptors, at most 4 MiB of pipe budget
/// (an empty pipe holds no pages). Beyond this, given-back pipes are closed.
pub(crate) const POOL_MAX: usize = 64;

/// Pipes in use at once (2,048 descriptors, the per-user pipe budget's worth
/// of 64 KiB pipes). A direction that finds them all taken copies through
/// buffers: splice can never use the descriptors accepts need.
pub(crate) const MAX_IN_USE: usize = 1024;

/// Pipes taken from [`POOL`] and not yet given back.
static IN_USE: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// A non-blocking pipe and the count of bytes in it.
#[derive(Debug)]
pub(crate) struct Pipe {
    read: OwnedFd,
    write: OwnedFd,
    /// In bytes, as granted by the kernel.
    capacity: usize,
    /// Bytes spliced in and not yet out: exact, since splice reports every
    /// byte it moves.
    in_pipe: usize,
}

/// What [`Pipe::fill_from`] did (`Err(WouldBlock)`: the source has nothing).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fill {
    /// This many bytes (more than zero) went into the pipe.
    Moved(usize),
    /// The source is at EOF; nothing was moved.
    Eof,
    /// The pipe has, or may have, no room: drain it before filling again.
    /// The source may still hold bytes, so its readiness must stay set.
    Full,
}

impl Pipe {
    /// A new empty pipe (`O_NONBLOCK | O_CLOEXEC`) of about [`PIPE_SIZE`].
    pub(crate) fn new() -> io::Result<Pipe> {
        let (read, write) = sys::pipe()?;
        let mut capacity = sys::pipe_size(write.as_fd())?;
        if capacity < PIPE_SIZE {
            // EPERM when this user is over the pipe budget: keep the small one.
            if let Ok(granted) = sys::set_pipe_size(write.as_fd(), PIPE_SIZE) {
                capacity = granted;
            }
        }
        Ok(Pipe {
            read,
            write,
            capacity,
            in_pipe: 0,
        })
    }

    /// The pipe's size in bytes (it may fill up sooner: see the module doc).
    pub(crate) fn capacity(&self) -> usize {
        self.capacity
    }

    #[cfg(test)]
    /// Bytes in the pipe.
    pub(crate) fn in_pipe(&self) -> usize {
        self.in_pipe
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.in_pipe == 0
    }

    /// Moves up to `max` bytes (more than zero; at most the free capacity)
    /// from `from` into the pipe. `Err(WouldBlock)` only when the pipe was
    /// empty, so it always means that `from` has nothing now.
    pub(crate) fn fill_from(&mut self, from: impl AsFd, max: usize) -> io::Result<Fill> {
        if max == 0 {
            // A zero-length splice answers 0, which would read as EOF.
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "max is 0"));
        }
        let room = self.capacity - self.in_pipe;
        if room == 0 {
            return Ok(Fill::Full);
        }
        match sys::splice(from.as_fd(), self.write.as_fd(), room.min(max)) {
            Ok(0) => Ok(Fill::Eof),
            Ok(n) => {
                self.in_pipe += n;
                Ok(Fill::Moved(n))
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock && self.in_pipe > 0 => Ok(Fill::Full),
            Err(e) => Err(e),
        }
    }

    /// Moves bytes from the pipe into `to`; `Ok(0)` only when the pipe is
    /// empty, `Err(WouldBlock)` when `to` has no room. A peer that is gone
    /// answers `EPIPE` or `ECONNRESET`, the bytes staying in the pipe. (splice
    /// cannot pass `MSG_NOSIGNAL`: `EPIPE` also raises SIGPIPE, which Rust's
    /// runtime ignores in every binary before `main`.)
    pub(crate) fn drain_into(&mut self, to: impl AsFd) -> io::Result<usize> {
        if self.in_pipe == 0 {
            return Ok(0);
        }
        match sys::splice(self.read.as_fd(), to.as_fd(), self.in_pipe)? {
            // Only a pipe without writers reads as 0, and this one has ours.
            0 => Err(io::ErrorKind::WriteZero.into()),
            n => {
                self.in_pipe -= n;
                Ok(n)
            }
        }
    }
}

/// A bounded stack of empty pipes. [`POOL`] is the one the copy uses.
#[derive(Debug)]
pub(crate) struct PipePool {
    idle: Mutex<Vec<Pipe>>,
    max: usize,
}

/// The pipes the copy takes from and gives back to.
pub(crate) static POOL: PipePool = PipePool::new(POOL_MAX);

impl PipePool {
    pub(crate) const fn new(max: usize) -> PipePool {
        PipePool {
            idle: Mutex::new(Vec::new()),
            max,
        }
    }

    /// An empty pipe from the pool, or a new one. A creation error (`EMFILE`,
    /// `ENFILE`, `Unsupported`) means: copy through buffers instead.
    pub(crate) fn take(&'static self) -> io::Result<PooledPipe> {
        use std::sync::atomic::Ordering;
        if IN_USE.fetch_add(1, Ordering::Relaxed) >= MAX_IN_USE {
            IN_USE.fetch_sub(1, Ordering::Relaxed);
            return Err(io::Error::other("every pipe is in use"));
        }
        let reused = self.idle.lock().unwrap_or_else(|e| e.into_inner()).pop();
        let pipe = match reused {
            Some(pipe) => pipe,
            None => Pipe::new().inspect_err(|_| {
                IN_USE.fetch_sub(1, Ordering::Relaxed);
            })?,
        };
        Ok(PooledPipe {
            pipe: Some(pipe),
            pool: self,
        })
    }

    #[cfg(test)]
    /// Pipes waiting for reuse.
    pub(crate) fn idle(&self) -> usize {
        self.idle.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    fn give_back(&self, pipe: Pipe) {
        // Bytes left in a pipe belong to a connection that ended mid-way: a
        // pipe is reused only empty. Others, and any beyond `max`, are closed.
        if pipe.is_empty() {
            let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
            if idle.len() < self.max {
                idle.push(pipe);
            }
        }
    }
}

/// A pipe from a [`PipePool`], given back when dropped if empty.
#[derive(Debug)]
pub(crate) struct PooledPipe {
    /// Always `Some` until dropped.
    pipe: Option<Pipe>,
    pool: &'static PipePool,
}

impl PooledPipe {
    /// A pipe from [`POOL`].
    pub(crate) fn take() -> io::Result<PooledPipe> {
        POOL.take()
    }
}

impl std::ops::Deref for PooledPipe {
    type Target = Pipe;
    fn deref(&self) -> &Pipe {
        self.pipe
            .as_ref()
            .expect("a pooled pipe is present until dropped")
    }
}

impl std::ops::DerefMut for PooledPipe {
    fn deref_mut(&mut self) -> &mut Pipe {
        self.pipe
            .as_mut()
            .expect("a pooled pipe is present until dropped")
    }
}

impl Drop for PooledPipe {
    fn drop(&mut self) {
        if let Some(pipe) = self.pipe.take() {
            IN_USE.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
            self.pool.give_back(pipe);
        }
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests;

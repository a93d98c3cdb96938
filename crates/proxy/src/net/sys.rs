//! The one module of magpie allowed to contain `unsafe` (the crate denies
//! it everywhere else): the system calls that std, tokio, socket2 and nix
//! offer no safe wrapper for. Each `unsafe` block is one libc call on
//! descriptors borrowed for the call, with a `// SAFETY:` comment; the rest
//! of magpie builds on these safe functions.
//!
//! | call | for |
//! |---|---|
//! | `pipe2(2)`, `fcntl(2)` `F_GETPIPE_SZ` / `F_SETPIPE_SZ`, `splice(2)` | mode tcp's zero-copy path ([`crate::tcp::pipe`]) |
//! | `getsockopt(2)` `SO_MEMINFO` | the datagrams a socket's receive buffer dropped (mode udp) |
//!
//! Linux only. Elsewhere each answers `ErrorKind::Unsupported`, and the
//! caller does without (copies through buffers, counts no drops).

#[cfg(target_os = "linux")]
pub(crate) use linux::*;
#[cfg(not(target_os = "linux"))]
pub(crate) use other::*;

#[cfg(target_os = "linux")]
mod linux {
    use std::io;
    use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

    /// `pipe2(O_NONBLOCK | O_CLOEXEC)`: (read end, write end).
    pub(crate) fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
        let mut fds: [libc::c_int; 2] = [-1, -1];
        // SAFETY: `fds` is a writable array of two c_ints, which is all pipe2
        // writes to.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_NONBLOCK | libc::O_CLOEXEC) } == -1 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: pipe2 succeeded, so both are open descriptors that nothing
        // else owns; each gets exactly one owner here.
        Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
    }

    pub(crate) fn pipe_size(fd: BorrowedFd<'_>) -> io::Result<usize> {
        // SAFETY: `fd` is open for the borrow; F_GETPIPE_SZ takes no argument
        // and touches no memory of ours.
        let size = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETPIPE_SZ) };
        size_or_error(size)
    }

    /// Asks for `size` bytes; the kernel rounds up and answers what it granted.
    pub(crate) fn set_pipe_size(fd: BorrowedFd<'_>, size: usize) -> io::Result<usize> {
        let size = libc::c_int::try_from(size).map_err(|_| io::ErrorKind::InvalidInput)?;
        // SAFETY: `fd` is open for the borrow; F_SETPIPE_SZ takes an int by
        // value and touches no memory of ours.
        let granted = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETPIPE_SZ, size) };
        size_or_error(granted)
    }

    fn size_or_error(n: libc::c_int) -> io::Result<usize> {
        usize::try_from(n).map_err(|_| io::Error::last_os_error())
    }

    /// One non-blocking splice of at most `len` bytes from `from` to `to`
    /// (one of them a pipe).
    pub(crate) fn splice(
        from: BorrowedFd<'_>,
        to: BorrowedFd<'_>,
        len: usize,
    ) -> io::Result<usize> {
        loop {
            // SAFETY: both descriptors are open for the borrow; null offsets
            // (required for pipes and sockets) mean no memory of ours is
            // read or written; the kernel moves at most `len` bytes between
            // its own buffers.
            let n = unsafe {
                libc::splice(
                    from.as_raw_fd(),
                    std::ptr::null_mut(),
                    to.as_raw_fd(),
                    std::ptr::null_mut(),
                    len,
                    libc::SPLICE_F_MOVE | libc::SPLICE_F_NONBLOCK,
                )
            };
            match usize::try_from(n) {
                Ok(n) => return Ok(n),
                Err(_) => {
                    let e = io::Error::last_os_error();
                    if e.kind() != io::ErrorKind::Interrupted {
                        return Err(e);
                    }
                }
            }
        }
    }

    /// How many datagrams the kernel has dropped on `fd`'s socket since it
    /// was made, its receive buffer full (SO_MEMINFO's drop count).
    pub(crate) fn socket_drops(fd: BorrowedFd<'_>) -> io::Result<u32> {
        const VARS: usize = libc::SK_MEMINFO_DROPS as usize + 1;
        let mut info = [0u32; VARS];
        let mut len = std::mem::size_of_val(&info) as libc::socklen_t;
        // SAFETY: `fd` is open for the borrow; the kernel writes at most
        // `len` bytes into `info`, which holds `len` bytes, and writes back
        // how many it wrote into `len`, a socklen_t of ours.
        let got = unsafe {
            libc::getsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_MEMINFO,
                info.as_mut_ptr().cast(),
                &mut len,
            )
        };
        if got == -1 {
            return Err(io::Error::last_os_error());
        }
        if (len as usize) < VARS * std::mem::size_of::<u32>() {
            return Err(io::ErrorKind::Unsupported.into());
        }
        Ok(info[libc::SK_MEMINFO_DROPS as usize])
    }
}

#[cfg(not(target_os = "linux"))]
mod other {
    use std::io;
    use std::os::fd::{BorrowedFd, OwnedFd};

    fn unsupported<T>() -> io::Result<T> {
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "splice(2) is Linux only",
        ))
    }

    pub(crate) fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
        unsupported()
    }

    pub(crate) fn pipe_size(_: BorrowedFd<'_>) -> io::Result<usize> {
        unsupported()
    }

    pub(crate) fn set_pipe_size(_: BorrowedFd<'_>, _: usize) -> io::Result<usize> {
        unsupported()
    }

    pub(crate) fn splice(_: BorrowedFd<'_>, _: BorrowedFd<'_>, _: usize) -> io::Result<usize> {
        unsupported()
    }

    pub(crate) fn socket_drops(_: BorrowedFd<'_>) -> io::Result<u32> {
        unsupported()
    }
}

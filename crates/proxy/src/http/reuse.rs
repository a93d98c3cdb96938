//! Which idle upstream connection a request may take (`http.reuse`), and
//! what keeps a connection out of the pool.
//!
//! Every client shares the pool, so a backend that misbehaves (bytes after
//! its answer, an answer that races the next request) could answer whoever
//! takes its connection next. Each idle connection remembers the client
//! connection that used it last ([`ClientConn`]); a request takes its own
//! client's first, and another client's only when its [`Claim`] allows:
//! with `reuse: safe` (the default) never for a client connection's first
//! request, whatever its method (as HAProxy's `http-reuse safe`: a backend
//! that writes an answer nobody asked for after its connection was lent
//! cannot reach a client that just connected), with `never` not at all,
//! with `always` whenever. A connection whose backend closed it or sent
//! bytes nobody asked for is never lent, nor one whose request carried a
//! body and got an error answer (its backend may not have read the body,
//! and could take what is left of it for the next request); each such
//! discard is counted by reason ([`super::pool::discarded`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::config::Reuse;

/// Which idle connections a request may take ([`Reuse`]): those its own
/// client connection used last, and with `others` any.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Claim {
    /// The client connection the request came on.
    pub(crate) client: u64,
    pub(crate) others: bool,
}

impl Claim {
    /// What `reuse` lets a request take: `first` when it is its client
    /// connection's first.
    pub(crate) fn of(reuse: Reuse, client: u64, first: bool) -> Claim {
        let others = match reuse {
            Reuse::Always => true,
            Reuse::Never => false,
            Reuse::Safe => !first,
        };
        Claim { client, others }
    }
}

/// A client connection as the pool tells requests apart: its number, and
/// how many requests it has begun.
#[derive(Debug)]
pub(crate) struct ClientConn {
    pub(crate) id: u64,
    requests: AtomicU64,
}

impl ClientConn {
    /// A client connection just accepted, numbered in this process.
    pub(crate) fn new() -> Arc<ClientConn> {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        Arc::new(ClientConn {
            id: NEXT.fetch_add(1, Ordering::Relaxed),
            requests: AtomicU64::new(0),
        })
    }

    /// A request begins on this connection: the idle connections `reuse`
    /// lets it take.
    pub(crate) fn claim(&self, reuse: Reuse) -> Claim {
        let first = self.requests.fetch_add(1, Ordering::Relaxed) == 0;
        Claim::of(reuse, self.id, first)
    }
}

/// Whether a connection may carry another request once the answer to one
/// that carried a body (`with_body`) ended with `status`: not after an
/// error answer, which a backend may send without reading the body (an
/// early `413`), and then take the body's bytes for the next request.
pub(crate) fn reusable_after(with_body: bool, status: u16) -> bool {
    !(with_body && status >= 400)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_policy_by_first_request() {
        assert!(!Claim::of(Reuse::Safe, 1, true).others);
        assert!(Claim::of(Reuse::Safe, 1, false).others);
        assert!(Claim::of(Reuse::Always, 1, true).others);
        assert!(!Claim::of(Reuse::Never, 1, false).others);
        let conn = ClientConn::new();
        assert!(!conn.claim(Reuse::Safe).others, "the first request");
        assert!(conn.claim(Reuse::Safe).others, "the second");
        assert_ne!(conn.id, ClientConn::new().id);
    }

    #[test]
    fn an_error_answer_to_a_body_ends_its_connection() {
        assert!(!reusable_after(true, 413));
        assert!(!reusable_after(true, 500));
        assert!(reusable_after(true, 200));
        assert!(reusable_after(false, 404));
    }
}

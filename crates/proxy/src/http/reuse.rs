//! Which idle upstream connection a request may take (`http.reuse`), and
//! what keeps a connection out of the pool.
//!
//! Every client shares the pool, so a backend that misbehaves (bytes after
//! its answer, an answer that races the next request) could answer whoever
//! takes its connection next. Each idle connection remembers the client
//! connection that used it last ([`ClientConn`]); a request takes its own
//! client's first, and another client's only when its [`Claim`] allows:
//! with `reuse: safe` (the default) not for a client connection's first
//! request unless its method is idempotent, with `never` not at all, with
//! `always` whenever. A connection whose backend closed it or sent bytes
//! nobody asked for is never lent; each such discard is counted by reason
//! ([`super::pool::discarded`]).

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
    /// connection's first, `idempotent` by its method (RFC 9110 §9.2.2).
    pub(crate) fn of(reuse: Reuse, client: u64, first: bool, idempotent: bool) -> Claim {
        let others = match reuse {
            Reuse::Always => true,
            Reuse::Never => false,
            Reuse::Safe => !first || idempotent,
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

    /// A request begins on this connection, its method idempotent or not:
    /// the idle connections `reuse` lets it take.
    pub(crate) fn claim(&self, reuse: Reuse, idempotent: bool) -> Claim {
        let first = self.requests.fetch_add(1, Ordering::Relaxed) == 0;
        Claim::of(reuse, self.id, first, idempotent)
    }
}

/// Whether `method` is idempotent (RFC 9110 §9.2.2): sent twice, it does
/// what it does once.
pub(crate) fn idempotent(method: &str) -> bool {
    matches!(
        method,
        "GET" | "HEAD" | "OPTIONS" | "TRACE" | "PUT" | "DELETE"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_policy_by_first_request_and_method() {
        assert!(!Claim::of(Reuse::Safe, 1, true, false).others);
        assert!(Claim::of(Reuse::Safe, 1, true, true).others);
        assert!(Claim::of(Reuse::Safe, 1, false, false).others);
        assert!(Claim::of(Reuse::Always, 1, true, false).others);
        assert!(!Claim::of(Reuse::Never, 1, false, true).others);
        assert!(idempotent("GET") && idempotent("DELETE") && !idempotent("POST"));
        let conn = ClientConn::new();
        assert!(!conn.claim(Reuse::Safe, false).others, "the first POST");
        assert!(conn.claim(Reuse::Safe, false).others, "the second");
        assert_ne!(conn.id, ClientConn::new().id);
    }
}

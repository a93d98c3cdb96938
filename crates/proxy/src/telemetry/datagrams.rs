//! What `mode: udp` counts beside each backend's traffic: flows open,
//! created and ended (by why), and datagrams dropped (by why). Every bump
//! is one relaxed atomic add.

use std::sync::atomic::{AtomicU64, Ordering};

use magpie_core::labels;

labels! {
    /// Why a flow ended.
    pub(crate) enum FlowEnd {
        /// Nothing either way for `idle_timeout`.
        Idle => "idle_timeout",
        /// Its backend answered `udp.responses` datagrams.
        Responses => "responses",
        /// Its backend was marked down; the client's next datagram starts
        /// a new flow on a backend that is up.
        BackendDown => "backend_down",
        /// magpie shut down (or handed over to a new binary) and the flow
        /// outlived `shutdown_grace`, or went idle during it.
        Shutdown => "shutdown",
    }
}

labels! {
    /// Why a datagram was not delivered.
    pub(crate) enum DatagramDrop {
        /// A new flow beyond `max_connections` flows.
        TableFull => "table_full",
        /// A new flow that no backend took (all down with `when_all_down:
        /// refuse`, or at their caps, or no upstream socket could be made).
        NoBackend => "no_backend",
        /// The socket towards the backend had no room (its send buffer full).
        BackendBusy => "backend_busy",
        /// The backend's host or port refused it (an ICMP unreachable the
        /// socket reported).
        BackendRefused => "backend_refused",
        /// Too large to send (EMSGSIZE).
        Oversized => "oversized",
        /// The answer could not be sent on to the client (its socket's
        /// send buffer full, or an error).
        ReplyFailed => "reply_failed",
        /// The kernel dropped it in one of magpie's own sockets, its receive
        /// buffer full (a listening socket's, or a flow's): told by the
        /// socket's drop count (SO_MEMINFO), read after a full batch, once a
        /// second for a listening socket and when a flow ends.
        ReceiveBuffer => "receive_buffer",
        /// An answer past `udp.responses`: the flow ended with the last one
        /// it may relay.
        AfterResponses => "after_responses",
    }
}

/// The counters of `mode: udp`.
#[derive(Debug, Default)]
pub(crate) struct DatagramStats {
    open: AtomicU64,
    created: AtomicU64,
    ended: [AtomicU64; FlowEnd::COUNT],
    dropped: [AtomicU64; DatagramDrop::COUNT],
}

impl DatagramStats {
    /// A flow started.
    pub(crate) fn flow_created(&self) {
        self.created.fetch_add(1, Ordering::Relaxed);
        self.open.fetch_add(1, Ordering::Relaxed);
    }

    /// A flow ended, as `why`.
    pub(crate) fn flow_ended(&self, why: FlowEnd) {
        self.ended[why.index()].fetch_add(1, Ordering::Relaxed);
        self.open.fetch_sub(1, Ordering::Relaxed);
    }

    pub(crate) fn count_drop(&self, why: DatagramDrop) {
        self.count_drops(why, 1);
    }

    pub(crate) fn count_drops(&self, why: DatagramDrop, n: u64) {
        self.dropped[why.index()].fetch_add(n, Ordering::Relaxed);
    }

    /// Flows open now.
    pub(crate) fn open(&self) -> u64 {
        self.open.load(Ordering::Relaxed)
    }

    pub(crate) fn created(&self) -> u64 {
        self.created.load(Ordering::Relaxed)
    }

    pub(crate) fn ended(&self, why: FlowEnd) -> u64 {
        self.ended[why.index()].load(Ordering::Relaxed)
    }

    pub(crate) fn dropped(&self, why: DatagramDrop) -> u64 {
        self.dropped[why.index()].load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn open_flows_are_created_less_ended() {
        let stats = DatagramStats::default();
        stats.flow_created();
        stats.flow_created();
        stats.flow_ended(FlowEnd::Idle);
        stats.count_drop(DatagramDrop::TableFull);
        assert_eq!((stats.open(), stats.created()), (1, 2));
        assert_eq!(stats.ended(FlowEnd::Idle), 1);
        assert_eq!(stats.ended(FlowEnd::Responses), 0);
        assert_eq!(stats.dropped(DatagramDrop::TableFull), 1);
    }
}

//! What passed through a backend: connections, bytes, requests by status,
//! spills, resets, and the latency histograms. Every counter only grows;
//! each bump is one relaxed atomic add.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::telemetry::stats::{FAST_BUCKETS, Histogram};
use magpie_core::labels;

labels! {
    /// What became of a request sent to a backend (`mode: http`), by the
    /// class of its status code; `Error` when no response came.
    pub(crate) enum CodeClass {
        Informational => "1xx",
        Success => "2xx",
        Redirection => "3xx",
        ClientError => "4xx",
        ServerError => "5xx",
        Error => "error",
    }
}

impl CodeClass {
    pub(crate) fn of(status: u16) -> CodeClass {
        match status {
            100..=199 => CodeClass::Informational,
            200..=299 => CodeClass::Success,
            300..=399 => CodeClass::Redirection,
            400..=499 => CodeClass::ClientError,
            _ => CodeClass::ServerError,
        }
    }
}

labels! {
    /// Why a candidate was passed over (a spill to the next one).
    pub(crate) enum Spill {
        /// Health marked it down.
        Down => "down",
        /// It had reached its bounded-load cap.
        AtCap => "at_cap",
        /// Its inference engine reported a queue or a KV cache over the
        /// `health.load` limits (a fresh value).
        EngineFull => "engine_full",
        /// It is warming up (`placement.slow_start`) and the key's turn to
        /// move to it has not come.
        SlowStart => "slow_start",
    }
}

labels! {
    /// One end of a proxied connection, for counting which one aborted it.
    pub(crate) enum Side {
        Client => "client",
        Backend => "backend",
    }
}

labels! {
    /// Which deadline a backend missed (`mode: http`).
    pub(crate) enum TimeoutKind {
        /// No response head within `http.response_timeout` of the request's
        /// last byte (the client got `504`).
        Response => "response",
        /// No byte of the response body for `http.stream_idle_timeout` (the
        /// client's stream was cut).
        StreamIdle => "stream_idle",
    }
}

labels! {
    /// Why a connection to a backend was closed instead of kept for another
    /// request (`mode: http`): what the backend did that makes it unfit to
    /// lend.
    pub(crate) enum Discard {
        /// Bytes nobody asked for: past an answer's end, or while the
        /// connection idled in the pool.
        Unsolicited => "unsolicited_bytes",
        /// An answer that ended before its request's body was sent whole.
        EarlyAnswer => "early_answer",
        /// An error answer (4xx, 5xx) to a request that carried a body: the
        /// backend may not have read the body, and could read what is left
        /// of it as the next request.
        ErrorAfterBody => "error_after_body",
        /// The backend closed the connection while it idled, or said it
        /// would after its answer.
        Closed => "closed",
    }
}

/// Prompt, cached prompt and completion tokens, as engines report them.
#[derive(Debug, Default)]
struct Tokens {
    prompt: AtomicU64,
    cached: AtomicU64,
    completion: AtomicU64,
}

#[derive(Debug)]
pub(crate) struct Traffic {
    connections: AtomicU64,
    /// Bytes received from the backend (and sent on to clients).
    bytes_received: AtomicU64,
    /// Bytes sent to the backend (received from clients).
    bytes_sent: AtomicU64,
    /// Mode udp: datagrams sent to the backend, and received from it.
    datagrams_sent: AtomicU64,
    datagrams_received: AtomicU64,
    spills: [AtomicU64; Spill::COUNT],
    /// Requests answered (`mode: http`), by code class.
    requests: [AtomicU64; CodeClass::COUNT],
    /// Requests whose client went away before the response was complete.
    client_aborts: AtomicU64,
    /// Connections aborted (reset) by either side and passed on as a reset to
    /// the other, by the side that aborted.
    resets: [AtomicU64; Side::COUNT],
    /// Connections closed because neither side sent anything for
    /// `idle_timeout` (`mode: tcp`).
    idle_closes: AtomicU64,
    /// Requests whose backend missed a deadline (`mode: http`), by which.
    timeouts: [AtomicU64; TimeoutKind::COUNT],
    /// Connections closed instead of pooled (`mode: http`), by why.
    discards: [AtomicU64; Discard::COUNT],
    /// Token counts the backend's engine reported in its responses' `usage`.
    tokens: Tokens,
    /// Time to open a data-path connection (mode http: a fresh one).
    pub(crate) connect_time: Histogram,
    /// From connected to closed (`mode: tcp`).
    pub(crate) connection_duration: Histogram,
    /// From sending a request to the response head (`mode: http`).
    pub(crate) time_to_first_byte: Histogram,
    /// From sending a request to the response's last byte (`mode: http`).
    pub(crate) request_duration: Histogram,
}

impl Default for Traffic {
    fn default() -> Self {
        Traffic {
            connections: AtomicU64::new(0),
            bytes_received: AtomicU64::new(0),
            bytes_sent: AtomicU64::new(0),
            datagrams_sent: AtomicU64::new(0),
            datagrams_received: AtomicU64::new(0),
            spills: Default::default(),
            requests: Default::default(),
            client_aborts: AtomicU64::new(0),
            resets: Default::default(),
            idle_closes: AtomicU64::new(0),
            timeouts: Default::default(),
            discards: Default::default(),
            tokens: Tokens::default(),
            connect_time: Histogram::with_bounds(&FAST_BUCKETS),
            connection_duration: Histogram::default(),
            time_to_first_byte: Histogram::default(),
            request_duration: Histogram::default(),
        }
    }
}

impl Traffic {
    /// A data-path connection to the backend was opened.
    pub(crate) fn count_connection(&self) {
        self.connections.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn connections(&self) -> u64 {
        self.connections.load(Ordering::Relaxed)
    }

    pub(crate) fn add_bytes_sent(&self, n: u64) {
        self.bytes_sent.fetch_add(n, Ordering::Relaxed);
    }

    pub(crate) fn bytes_sent(&self) -> u64 {
        self.bytes_sent.load(Ordering::Relaxed)
    }

    pub(crate) fn add_bytes_received(&self, n: u64) {
        self.bytes_received.fetch_add(n, Ordering::Relaxed);
    }

    pub(crate) fn bytes_received(&self) -> u64 {
        self.bytes_received.load(Ordering::Relaxed)
    }

    /// Mode udp: a datagram of `bytes` went to the backend.
    pub(crate) fn count_datagram_sent(&self, bytes: usize) {
        self.datagrams_sent.fetch_add(1, Ordering::Relaxed);
        self.add_bytes_sent(bytes as u64);
    }

    /// Mode udp: a datagram of `bytes` came from the backend.
    pub(crate) fn count_datagram_received(&self, bytes: usize) {
        self.datagrams_received.fetch_add(1, Ordering::Relaxed);
        self.add_bytes_received(bytes as u64);
    }

    pub(crate) fn datagrams_sent(&self) -> u64 {
        self.datagrams_sent.load(Ordering::Relaxed)
    }

    pub(crate) fn datagrams_received(&self) -> u64 {
        self.datagrams_received.load(Ordering::Relaxed)
    }

    /// A response's `usage`: its prompt tokens, how many of them the engine
    /// served from its cache, and its completion tokens.
    pub(crate) fn count_tokens(&self, prompt: u64, cached: u64, completion: u64) {
        self.tokens.prompt.fetch_add(prompt, Ordering::Relaxed);
        self.tokens.cached.fetch_add(cached, Ordering::Relaxed);
        self.tokens
            .completion
            .fetch_add(completion, Ordering::Relaxed);
    }

    pub(crate) fn prompt_tokens(&self) -> u64 {
        self.tokens.prompt.load(Ordering::Relaxed)
    }

    pub(crate) fn cached_prompt_tokens(&self) -> u64 {
        self.tokens.cached.load(Ordering::Relaxed)
    }

    pub(crate) fn completion_tokens(&self) -> u64 {
        self.tokens.completion.load(Ordering::Relaxed)
    }

    pub(crate) fn count_spill(&self, why: Spill) {
        self.spills[why.index()].fetch_add(1, Ordering::Relaxed);
    }

    /// Traffic passed over this backend for `why`.
    pub(crate) fn spills(&self, why: Spill) -> u64 {
        self.spills[why.index()].load(Ordering::Relaxed)
    }

    /// Spills for any reason.
    #[cfg(test)]
    pub(crate) fn spills_total(&self) -> u64 {
        Spill::ALL.iter().map(|&why| self.spills(why)).sum()
    }

    pub(crate) fn count_request(&self, class: CodeClass) {
        self.requests[class.index()].fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn requests(&self, class: CodeClass) -> u64 {
        self.requests[class.index()].load(Ordering::Relaxed)
    }

    pub(crate) fn count_client_abort(&self) {
        self.client_aborts.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn client_aborts(&self) -> u64 {
        self.client_aborts.load(Ordering::Relaxed)
    }

    /// A connection through this backend was aborted by `by`.
    pub(crate) fn count_reset(&self, by: Side) {
        self.resets[by.index()].fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn resets(&self, by: Side) -> u64 {
        self.resets[by.index()].load(Ordering::Relaxed)
    }

    /// A connection was closed for idling.
    pub(crate) fn count_idle_close(&self) {
        self.idle_closes.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn idle_closes(&self) -> u64 {
        self.idle_closes.load(Ordering::Relaxed)
    }

    /// A request to this backend missed the deadline `kind`.
    pub(crate) fn count_timeout(&self, kind: TimeoutKind) {
        self.timeouts[kind.index()].fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn timeouts(&self, kind: TimeoutKind) -> u64 {
        self.timeouts[kind.index()].load(Ordering::Relaxed)
    }

    /// A connection to this backend was closed instead of pooled, for `why`.
    pub(crate) fn count_discard(&self, why: Discard) {
        self.discards[why.index()].fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn discards(&self, why: Discard) -> u64 {
        self.discards[why.index()].load(Ordering::Relaxed)
    }
}

//! Every default and every bound a config value has, named once so the reference (docs/configuration.md),
//! the example configs, validation and the code agree.

use std::ops::RangeInclusive;
use std::time::Duration;

// Defaults, named once so the reference, the example config and the code agree.
pub const DEFAULT_POINTS_PER_WEIGHT: u32 = 160;
/// With `bounded_load`, a key spills only when its candidate is this many
/// above its mean share as well as at its cap.
pub const DEFAULT_SPILL_MIN_EXCESS: u64 = 8;
pub const MAX_SPILL_MIN_EXCESS: u64 = 100_000;
/// The longest `placement.slow_start` ramp.
pub const MAX_SLOW_START: Duration = Duration::from_secs(3600);
pub const DEFAULT_READ_TIMEOUT: Duration = Duration::from_millis(200);
pub const DEFAULT_MAX_BYTES: u64 = 8192;
/// `mode: http`: a request head (and a body read for its key) may take this
/// long; a body is large and may cross a slow link.
pub const DEFAULT_HTTP_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// `mode: http`: the most of a request head, and of a body read for its key.
pub const DEFAULT_HTTP_MAX_BYTES: u64 = 1 << 20;
pub const MAX_HTTP_MAX_BYTES: u64 = 64 << 20;
/// `limits.max_head_bytes` (mode http): the most of one request head, over
/// HTTP/1.1 and HTTP/2 alike. Also what hyper may queue towards a client
/// that reads slowly, so it bounds a slow reader's cost too. hyper needs
/// at least 8 KiB.
pub const DEFAULT_MAX_HEAD_BYTES: u64 = 64 << 10;
pub const MIN_MAX_HEAD_BYTES: u64 = 8 << 10;
pub const MAX_MAX_HEAD_BYTES: u64 = 1 << 20;
/// `limits.key_buffer_bytes` (mode http): the most body bytes all requests
/// together may hold while their keys are looked for.
pub const DEFAULT_KEY_BUFFER_BYTES: u64 = 64 << 20;
pub const MIN_KEY_BUFFER_BYTES: u64 = 64 << 10;
pub const MAX_KEY_BUFFER_BYTES: u64 = 16 << 30;
/// `limits.h2_resets_per_second` (mode http): streams an HTTP/2 client may
/// reset after magpie dispatched them, per second, before its connection
/// gets GOAWAY.
pub const DEFAULT_H2_RESETS_PER_SECOND: u64 = 100;
pub const MAX_H2_RESETS_PER_SECOND: u64 = 100_000;
pub const DEFAULT_EXPECT_STATUS: RangeInclusive<u16> = 200..=299;
pub const DEFAULT_SESSION_TTL: Duration = Duration::from_secs(30 * 60);
pub const DEFAULT_SESSION_MAX: u64 = 100_000;
pub const MAX_SESSION_TTL: Duration = Duration::from_secs(7 * DAY);
pub const MAX_SESSION_MAX: u64 = 10_000_000;
pub const DEFAULT_REDIS_ADDR: &str = "127.0.0.1:6379";
pub const DEFAULT_REDIS_PREFIX: &str = "magpie:";
pub const DEFAULT_REDIS_TIMEOUT: Duration = Duration::from_millis(20);
pub const MAX_REDIS_TIMEOUT: Duration = Duration::from_secs(5);
/// Longer prefixes only cost memory in the store.
pub const MAX_REDIS_PREFIX: usize = 64;
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
pub const DEFAULT_ATTEMPTS: u32 = 3;
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(3600);
/// `mode: udp`: a flow that sends and receives nothing for this long ends
/// (`idle_timeout`), as nginx's and Envoy's UDP sessions do.
pub const DEFAULT_UDP_IDLE_TIMEOUT: Duration = Duration::from_secs(30);
/// `udp.responses`: the most datagrams a flow may await back before it ends.
pub const MAX_UDP_RESPONSES: u64 = 1_000_000;
/// `key.quic_cid_length`: the length of connection IDs in short headers.
/// QUIC version 1 allows at most 20 bytes.
pub const DEFAULT_QUIC_CID_LENGTH: u64 = 8;
pub const MAX_QUIC_CID_LENGTH: u64 = 20;
/// `health.datagram`: the largest probe and expected answer.
pub const MAX_HEALTH_DATAGRAM: usize = 1024;
pub const DEFAULT_MAX_CONNECTIONS: u64 = 10_000;
pub const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(30);
pub const DEFAULT_PROXY_HEADER_TIMEOUT: Duration = Duration::from_secs(3);
pub const DEFAULT_HEALTH_INTERVAL: Duration = Duration::from_secs(2);
pub const DEFAULT_HEALTH_TIMEOUT: Duration = Duration::from_secs(1);
pub const DEFAULT_RISE: u32 = 2;
pub const DEFAULT_FALL: u32 = 3;
pub const DEFAULT_PASSIVE_FAILURES: u32 = 3;
/// `health.load`: where an engine's Prometheus text is read, how often, and
/// what makes it full for new keys.
pub const DEFAULT_LOAD_PATH: &str = "/metrics";
pub const DEFAULT_LOAD_INTERVAL: Duration = Duration::from_secs(1);
pub const DEFAULT_LOAD_TIMEOUT: Duration = Duration::from_millis(500);
pub const DEFAULT_MAX_KV_USAGE: f64 = 0.95;
/// `health.load.max_age` defaults to this many intervals: a value survives
/// a few failed scrapes, not a dead engine.
pub const DEFAULT_LOAD_MAX_AGE_INTERVALS: u32 = 5;
/// `copy: auto`: a direction turns from buffers to splice(2) once it has
/// moved more than this. Below it, a pipe (two descriptors, two splice
/// calls per chunk) costs more than the copy it saves; above it the transfer
/// is bulk (a download, a stream) and saving the copy pays. Not a setting:
/// `buffered` and `splice` cover the cases where it is wrong.
pub const SPLICE_AFTER: u64 = 256 * 1024;

// Bounds. Every duration and count an operator writes has an upper bound, so
// a slip (an extra zero, `s` for `ms`, a pasted u64) is an error with a line
// and column instead of a deadline that overflows `Instant` in a running task
// or a semaphore that panics at start. Each is far above any sane setting.
const MINUTE: u64 = 60;
const HOUR: u64 = 60 * MINUTE;
const DAY: u64 = 24 * HOUR;

/// The smallest header buffer: room for a request line and little else.
pub const MIN_MAX_BYTES: u64 = 16;
/// `key.group: {prefix_bytes: N}`: fewer bytes than this are hardly a head
/// (a model name and a few words); more than 1 MiB is beyond any prompt a
/// body read for its key holds.
pub const MIN_GROUP_PREFIX_BYTES: u64 = 16;
pub const MAX_GROUP_PREFIX_BYTES: u64 = 1 << 20;
/// `key.group_choices`: a group without a pin is placed on the least busy
/// of its first N candidates. One keeps the table's order (every instance
/// agrees without a store); more than 8 spreads one head's first placement
/// over most of a pool, which is what the table is there to avoid.
pub const DEFAULT_GROUP_CHOICES: u64 = 1;
pub const MAX_GROUP_CHOICES: u64 = 8;
pub const MAX_MAX_BYTES: u64 = 1 << 20;
/// Above anything one process serves, and far below tokio's semaphore limit
/// (`usize::MAX >> 3` permits), which panics when exceeded.
pub const MAX_MAX_CONNECTIONS: u64 = 1_000_000;
/// A lookup yields at most this many distinct candidates, so more attempts
/// could never be made.
pub const MAX_ATTEMPTS: u32 = magpie_core::placement::MAX_CANDIDATES as u32;
pub const MAX_CONNECT_TIMEOUT: Duration = Duration::from_secs(5 * MINUTE);
pub const MAX_READ_TIMEOUT: Duration = Duration::from_secs(5 * MINUTE);
pub const MAX_PROXY_HEADER_TIMEOUT: Duration = Duration::from_secs(5 * MINUTE);
pub const MAX_IDLE_TIMEOUT: Duration = Duration::from_secs(7 * DAY);
pub const MAX_SHUTDOWN_GRACE: Duration = Duration::from_secs(HOUR);
pub const MAX_DRAIN_TIMEOUT: Duration = Duration::from_secs(7 * DAY);
pub const MAX_HEALTH_INTERVAL: Duration = Duration::from_secs(HOUR);
pub const MAX_HEALTH_TIMEOUT: Duration = Duration::from_secs(5 * MINUTE);
/// For both `health.rise` and `health.fall`.
pub const MAX_RISE_FALL: u32 = 100;
pub const MAX_PASSIVE_FAILURES: u32 = 1000;
/// Polling faster than this costs more than it finds.
pub const MIN_POLL_INTERVAL: Duration = Duration::from_millis(100);
pub const MAX_POLL_INTERVAL: Duration = Duration::from_secs(DAY);
/// Scraping an engine more often costs it more than the signal gains.
pub const MIN_LOAD_INTERVAL: Duration = Duration::from_millis(100);
/// A load signal older than a few minutes says nothing about now.
pub const MAX_LOAD_INTERVAL: Duration = Duration::from_secs(5 * MINUTE);
pub const MAX_LOAD_MAX_AGE: Duration = Duration::from_secs(HOUR);
/// Far above any engine's queue; `4 ×` this still fits a u64 many times.
pub const MAX_MAX_WAITING: u64 = 1_000_000;
/// `http`: mode http's deadlines towards backends and for silent clients,
/// and its upstream pool. A long prompt can take minutes to prefill, so the
/// response head and the gaps in a stream get minutes; a client that sends
/// nothing, or idles between requests, gets what nginx gives it.
pub const DEFAULT_RESPONSE_TIMEOUT: Duration = Duration::from_secs(5 * MINUTE);
pub const DEFAULT_STREAM_IDLE_TIMEOUT: Duration = Duration::from_secs(5 * MINUTE);
pub const DEFAULT_KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(MINUTE);
/// nginx's `client_body_timeout`: a request body that stalls this long
/// holds a backend's slot no longer.
pub const DEFAULT_BODY_TIMEOUT: Duration = Duration::from_secs(MINUTE);
pub const DEFAULT_FIRST_BYTE_TIMEOUT: Duration = Duration::from_secs(10);
/// Below uvicorn's 5 s keep-alive (vLLM, SGLang): a request sent on a
/// connection the server is closing is lost.
pub const DEFAULT_POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(4);
pub const DEFAULT_POOL_MAX_IDLE: u64 = 32;
/// `http.response_timeout`, `.stream_idle_timeout`, `.body_timeout`,
/// `.keepalive_timeout`.
pub const MAX_HTTP_TIMEOUT: Duration = Duration::from_secs(DAY);
pub const MAX_FIRST_BYTE_TIMEOUT: Duration = Duration::from_secs(HOUR);
pub const MAX_POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(HOUR);
/// Each idle connection is a socket on both ends.
pub const MAX_POOL_MAX_IDLE: u64 = 10_000;
pub const DEFAULT_DISCOVERY_INTERVAL: Duration = Duration::from_secs(10);
pub const MIN_DISCOVERY_INTERVAL: Duration = Duration::from_millis(100);
pub const MAX_DISCOVERY_INTERVAL: Duration = Duration::from_secs(HOUR);

// What a table build may cost is placement's to say; validation checks the
// same numbers, so a config that passes always builds.
pub use magpie_core::placement::{MAX_RING_POINTS, MAX_TABLE_SIZE, MAX_WEIGHT};

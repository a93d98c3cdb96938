//! The `access_log` section's validated type: where request (mode http) and
//! connection (mode tcp) lines go, in which format, with which fields.
//!
//! Validation ([`super::validate`]) fills it in; [`crate::telemetry::access_log`] reads
//! it, at start and at every reload (a changed `path` reopens the file).

use std::path::PathBuf;

use serde::Deserialize;
use serde_saphyr::Spanned;

use magpie_core::labels;

/// `access_log.queue`: lines waiting for the writer. At about 300 bytes a
/// line, the default holds some 2.5 MB, a second of 8,000 requests/s.
pub const DEFAULT_ACCESS_LOG_QUEUE: u64 = 8192;
pub const MAX_ACCESS_LOG_QUEUE: u64 = 1 << 20;

labels! {
    /// The fields a line can carry, in their default order.
    pub enum LogField {
        /// When the request or connection ended, RFC 3339 UTC, milliseconds.
        Time => "time",
        /// The client's address (the PROXY header's source when trusted).
        Client => "client",
        /// The address the client connected to.
        Listener => "listener",
        Backend => "backend",
        BackendAddr => "backend_addr",
        /// `h64` of the session key, as 16 hex digits.
        KeyHash => "key_hash",
        /// The raw key: only with `log_keys: true`, and only a header's.
        Key => "key",
        /// Why this backend (`primary`, `pinned`, `spilled_*`, `fallback_key`).
        Routed => "routed",
        /// mode http: the status code; mode tcp: how the connection ended.
        Status => "status",
        BytesIn => "bytes_in",
        BytesOut => "bytes_out",
        /// Milliseconds from the start to the backend's first byte.
        FirstByteMs => "first_byte_ms",
        /// Milliseconds it waited in the queue (`queue`), when it waited.
        QueueMs => "queue_ms",
        /// How it left the queue (`queue`, mode http): `at_once`, `waited`,
        /// `spilled`, `placed`, or refused: `full`, `tenant_full`,
        /// `timeout`, `client_gone`.
        Queue => "queue",
        /// How a disaggregated request was served (`disaggregation`):
        /// `split`, `decode_holds`, `unsplittable`, `prefill_failed`.
        Split => "split",
        /// The backend that took a disaggregated request's prefill half.
        PrefillBackend => "prefill_backend",
        DurationMs => "duration_ms",
        Method => "method",
        Path => "path",
        Protocol => "protocol",
        PromptTokens => "prompt_tokens",
        CachedTokens => "cached_tokens",
    }
}

impl LogField {
    /// The field named `name`, as the config writes it.
    pub fn named(name: &str) -> Option<LogField> {
        LogField::ALL.into_iter().find(|f| f.as_str() == name)
    }
}

/// `access_log.format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LogFormat {
    /// One JSON object per line.
    #[default]
    Json,
    /// Space-separated values, quoted where needed, `-` when absent.
    Text,
}

impl LogFormat {
    /// As the config writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            LogFormat::Json => "json",
            LogFormat::Text => "text",
        }
    }
}

/// `access_log.path`: a file, or `stderr`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LogTarget {
    Stderr,
    File(PathBuf),
}

#[derive(Debug, Clone, PartialEq)]
pub struct AccessLogConfig {
    pub target: LogTarget,
    pub format: LogFormat,
    /// Which fields, in which order (all by default).
    pub fields: Vec<LogField>,
    /// The share of requests (or connections) logged, 0.0 to 1.0.
    pub sample: f64,
    /// Whether a header key is written raw (`key`); keys are often user IDs.
    pub log_keys: bool,
    /// Whether a path keeps its query.
    pub log_query: bool,
    /// Lines waiting for the writer, at most; more are dropped and counted.
    pub queue: usize,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawAccessLog {
    pub(super) path: Spanned<String>,
    #[serde(default)]
    pub(super) format: Option<LogFormat>,
    #[serde(default)]
    pub(super) fields: Option<Spanned<Vec<Spanned<String>>>>,
    #[serde(default)]
    pub(super) sample: Option<Spanned<f64>>,
    #[serde(default)]
    pub(super) log_keys: Option<bool>,
    #[serde(default)]
    pub(super) log_query: Option<bool>,
    #[serde(default)]
    pub(super) queue: Option<Spanned<u64>>,
}

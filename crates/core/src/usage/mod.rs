//! Token counts read from LLM responses as they stream: the prompt tokens,
//! cached prompt tokens and completion tokens an engine reports in a
//! response's `usage`, counted per backend. Pure: the HTTP path hands each
//! body frame to [`UsageScanner::feed`] as it forwards it and asks
//! [`UsageScanner::finish`] at the end of the body; nothing here does I/O,
//! and the response is never buffered: a scanner holds at most
//! [`MAX_BUFFER`] bytes of it, whatever its length.
//!
//! * `application/json` (a whole response): the `usage` object comes at the
//!   end of the body in practice, so only the body's last [`MAX_BUFFER`]
//!   bytes are kept ([`body`]). A body that fits is parsed whole and its
//!   top-level `usage` read; a longer one (or one that is not valid JSON) is
//!   searched from the end for the last `"usage"` key whose value is an
//!   object, and that object alone is parsed.
//! * `text/event-stream` (a streamed response): the body is split into
//!   events on blank lines and each event's `data:` lines are joined
//!   ([`sse`]); at most one event's bytes are held, and an event longer than
//!   the limit is skipped, not buffered. An event whose data lacks the bytes
//!   `_tokens` (which end every count's name) and `"cache_n"` (llama.cpp's)
//!   costs two substring scans, so
//!   the `"usage":null` of every chunk but the last is not parsed; one that
//!   has them is parsed, and the latest counts win (engines that report
//!   usage in every chunk report it cumulatively).
//!
//! The shapes read ([`shape`]), each at the top level of a body or an
//! event, or under `response` (the Responses API's `response.completed`
//! event) or `message` (Anthropic's `message_start` event):
//!
//! | shape | prompt | cached | completion |
//! |---|---|---|---|
//! | OpenAI chat and completions, vLLM, SGLang | `prompt_tokens` | `prompt_tokens_details.cached_tokens` | `completion_tokens` |
//! | OpenAI Responses | `input_tokens` | `input_tokens_details.cached_tokens` | `output_tokens` |
//! | Anthropic messages | `input_tokens` + `cache_read_input_tokens` + `cache_creation_input_tokens` | `cache_read_input_tokens` | `output_tokens` |
//! | SGLang `meta_info` (native `/generate`), when there is no `usage` | `prompt_tokens` | `cached_tokens` | `completion_tokens` |
//! | llama.cpp `timings` (streamed chat, native `/completion`), when there is neither | `prompt_n` + `cache_n` | `cache_n` | `predicted_n` |
//!
//! A missing or `null` cached count is 0, and the cached count never
//! exceeds the prompt count. A count that is not a non-negative integer
//! that fits a `u64` (a float, a negative number, a string) is absent.
//! The prompt side (prompt and cached) and the completion side are kept
//! separately: Anthropic's `message_start` reports the prompt side and each
//! `message_delta` the completion side so far (and, in newer versions, the
//! prompt side again), so a later event replaces only the side it reports.
//!
//! The scanner wants the body as the client receives it, decoded of any
//! transfer coding; a compressed body (`Content-Encoding: gzip`) yields no
//! usage.

mod body;
mod shape;
mod sse;

#[cfg(test)]
mod tests;

use body::Tail;
use shape::Partial;
use sse::Events;

/// The most bytes of a response a [`UsageScanner`] holds at once: the tail
/// of a JSON body, or one server-sent event.
pub const MAX_BUFFER: usize = 64 * 1024;

/// The token counts of one response.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// Every prompt token, cached or not.
    pub prompt_tokens: u64,
    /// The prompt tokens served from the engine's prefix cache.
    pub cached_tokens: u64,
    pub completion_tokens: u64,
}

/// How a response body is framed, from its `Content-Type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyFormat {
    /// `application/json`: one JSON document.
    Json,
    /// `text/event-stream`: server-sent events with JSON data.
    EventStream,
}

impl BodyFormat {
    /// The format of a body with this `Content-Type` (parameters such as
    /// `charset` ignored, case-insensitive); `None` for any other type.
    pub fn from_content_type(content_type: Option<&str>) -> Option<BodyFormat> {
        let essence = content_type?.split(';').next()?.trim();
        if essence.eq_ignore_ascii_case("application/json") {
            Some(BodyFormat::Json)
        } else if essence.eq_ignore_ascii_case("text/event-stream") {
            Some(BodyFormat::EventStream)
        } else {
            None
        }
    }
}

/// Reads the usage of one response body, frame by frame.
#[derive(Debug)]
pub struct UsageScanner {
    mode: Mode,
}

#[derive(Debug)]
enum Mode {
    Json(Tail),
    EventStream(Events),
}

impl UsageScanner {
    /// A scanner for a body with this `Content-Type`, holding at most
    /// [`MAX_BUFFER`] bytes; `None` when the type carries no usage.
    pub fn for_content_type(content_type: Option<&str>) -> Option<UsageScanner> {
        BodyFormat::from_content_type(content_type).map(|f| UsageScanner::new(f, MAX_BUFFER))
    }

    /// A scanner that holds at most `limit` bytes (the tests and the fuzz
    /// target use small limits, so that inputs reach them).
    pub fn new(format: BodyFormat, limit: usize) -> UsageScanner {
        let mode = match format {
            BodyFormat::Json => Mode::Json(Tail::new(limit)),
            BodyFormat::EventStream => Mode::EventStream(Events::new(limit)),
        };
        UsageScanner { mode }
    }

    /// The next bytes of the body; frames may split it anywhere.
    pub fn feed(&mut self, chunk: &[u8]) {
        match &mut self.mode {
            Mode::Json(tail) => tail.feed(chunk),
            Mode::EventStream(events) => events.feed(chunk),
        }
    }

    /// The bytes of memory held for the body now (the buffer's capacity),
    /// never more than the limit.
    pub fn held(&self) -> usize {
        match &self.mode {
            Mode::Json(tail) => tail.held(),
            Mode::EventStream(events) => events.held(),
        }
    }

    /// The usage the body reported, at its end; `None` if it reported none.
    pub fn finish(self) -> Option<Usage> {
        let found = match self.mode {
            Mode::Json(tail) => tail.finish(),
            Mode::EventStream(events) => events.finish(),
        };
        usage_of(found)
    }
}

/// The counts found, a side never reported counting 0.
fn usage_of(found: Partial) -> Option<Usage> {
    if found.prompt.is_none() && found.completion.is_none() {
        return None;
    }
    let (prompt_tokens, cached_tokens) = found.prompt.unwrap_or((0, 0));
    Some(Usage {
        prompt_tokens,
        cached_tokens,
        completion_tokens: found.completion.unwrap_or(0),
    })
}
